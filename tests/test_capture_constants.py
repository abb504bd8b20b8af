"""Capture of forwards that turn integer inputs into Python numbers: split sizes from a lengths
input, a grid of patches per image. Export on fake tensors gives such values unbacked symbols and fails on a
data-dependent guard; the retry passes the real integer inputs as constants."""
from __future__ import annotations

import torch
from torch import nn

from conftest import audit_model, site
from normaudit.capture import capture_model
from normaudit.capture.errors import data_dependent
from normaudit.capture.fake import constant_inputs


class _PerImageNorm(nn.Module):
    """Patches of several images in one list, padded to the longest image and normalised (sizes read from
    ``lengths``: a branch on one is a data-dependent guard)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8, eps=1e-6)

    def forward(self, patches, lengths):
        x = self.proj(patches)
        sizes = lengths.tolist()  # Python ints from an input tensor
        longest = sizes[0]
        for n in sizes[1:]:
            if n > longest:  # a Python branch on a value read from the data
                longest = n
        out = x.new_zeros(len(sizes), longest, x.shape[-1])
        for i, chunk in enumerate(x.split(sizes)):
            out[i, : sizes[i]] = chunk
        return self.norm(out)


INPUTS = (torch.randn(7, 6), torch.tensor([3, 4]))


def test_integer_inputs_become_constants_after_a_data_dependent_failure():
    cap = capture_model(_PerImageNorm(), INPUTS, on_meta=False, methods=("export",), parts_fallback=False)
    assert [(a.method, a.ok) for a in cap.attempts] == [
        ("export", False), ("export (integer inputs as constants)", True)]
    assert data_dependent(cap.attempts[0].error)
    splits = [n.args[1] for n in cap.gm.graph.nodes if "split" in str(n.target)]
    assert splits == [[3, 4]]  # specialised on the example's lengths
    norm = next(n for n in cap.gm.graph.nodes if "layer_norm" in str(n.target))
    assert tuple(norm.meta["val"].shape) == (2, 4, 8)


def test_constant_retry_keeps_every_graph_fact(rules):
    report = audit_model(_PerImageNorm(), inputs=INPUTS, rules=rules)
    assert report.capture.complete and report.capture.method == "export"
    s = site(report, "norm")
    assert s.detected_by == "module" and s.eps == 1e-6 and s.normalized_shape == [8]
    assert [x.module for x in report.sites] == ["norm"]


def test_only_real_integer_inputs_are_constants():
    fake_like = {"x": torch.randn(2, 3), "ids": torch.tensor([1, 2]), "mask": torch.ones(2, dtype=torch.bool)}
    assert sorted(constant_inputs(fake_like, fake_like)) == ["ids", "mask"]
    assert constant_inputs((torch.randn(2), torch.tensor([3])), (torch.randn(2), torch.tensor([3]))).keys() == {1}
    with torch.device("meta"):
        meta = torch.tensor([1, 2])
    assert constant_inputs({"ids": meta}, {"ids": meta}) == {}
