"""Norms inside ``torch.no_grad()`` / ``torch.autocast`` regions are sites: ``torch.export``
keeps such a region as a higher-order op (``wrap_with_set_grad_enabled``, ``wrap_with_autocast``) whose body is
a nested graph; :mod:`normaudit.capture.hop` inlines it. Model: the sparse-attention indexer of transformers'
AXK2 / HY-V4 / GLM-5 (``@torch.no_grad()`` forward, ``self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)``)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from normaudit.capture import capture_model
from normaudit.capture.hop import inline_wrapped_regions
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts


class Indexer(nn.Module):
    """DeepSeek-V3.2-style indexer: a no-grad scorer whose only output is top-k indices."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.wk = nn.Linear(dim, dim)
        self.k_norm = nn.LayerNorm(dim, eps=1e-6)

    @torch.no_grad()
    def forward(self, x):
        k = self.k_norm(self.wk(x))
        return (x @ k.transpose(-1, -2)).topk(2, dim=-1).indices


class Block(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.indexer = Indexer(dim)
        self.q_norm = nn.LayerNorm(dim, eps=1e-4)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.norm(x)
        idx = self.indexer(h)
        with torch.autocast("cpu", enabled=False):  # as transformers' rotary embeddings do
            q = self.q_norm(h.float())
            with torch.no_grad():
                q = q * 1.0
        return x + self.proj(q) + idx.float().mean()


def _records(method):
    model = Block()
    cap = capture_model(copy.deepcopy(model), (torch.randn(2, 5, 16),), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    return cap, collect_facts(FactContext(cap=cap, probe_model=copy.deepcopy(model))).records


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_norms_inside_no_grad_and_autocast_regions_are_sites(method):
    cap, records = _records(method)
    got = [(r.site.module, r.site.kind, r.site.eps, r.site.normalized_axes) for r in records]
    assert got == [("norm", "RMSNorm", 1e-5, ["feature"]), ("indexer.k_norm", "LayerNorm", 1e-6, ["feature"]),
                   ("q_norm", "LayerNorm", 1e-4, ["feature"])]
    assert not [n for n in cap.gm.graph.nodes if getattr(n.target, "_name", "").startswith("wrap_with")]


def test_inlining_keeps_the_values_and_the_module_of_each_node():
    model = Block().eval()
    x = torch.randn(2, 5, 16)
    ep = torch.export.export(model, (x,), strict=False)
    gm = ep.module()
    regions = [n for n in ep.graph_module.graph.nodes if getattr(n.target, "_name", "").startswith("wrap_with")]
    # the indexer's no_grad; export splits the autocast region at the no_grad inside it into three
    assert [n.target._name for n in regions] == ["wrap_with_set_grad_enabled"] + ["wrap_with_autocast"] * 3
    assert inline_wrapped_regions(ep.graph_module) == 4
    assert not [n for n in ep.graph_module.graph.nodes if getattr(n.target, "_name", "").startswith("wrap_with")]
    ln = [n for n in ep.graph_module.graph.nodes if "layer_norm" in str(n.target)]
    assert [list(n.meta["nn_module_stack"].values())[-1][0] for n in ln] == ["indexer.k_norm", "q_norm"]
    assert torch.equal(ep.module()(x), gm(x))
