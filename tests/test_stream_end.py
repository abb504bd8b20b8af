"""The stream-end fact (``model.stream_end``, normaudit.facts.placement.stream_end): where a pre-LN residual stream leaves
its stack un-normalised, which NP101 reads. Exact sites, blocks, consumers and the registered-but-unused final
norm; None where the stream is closed by a norm or the stack has one block."""
from __future__ import annotations

import torch
from torch import nn

from conftest import ROOT, audit_file, audit_model, load_fixture_module
from normaudit.report import StreamEnd

PLACEMENT = ROOT / "tests" / "fixtures" / "placement"
blocks = load_fixture_module(PLACEMENT / "placement_blocks.py")


def test_a_stack_feeding_its_head_ends_at_the_head():
    report = audit_file(PLACEMENT / "NP101_1.py")
    assert report.model.stream_end == StreamEnd(module="layers.1.ln2", block="layers.1", consumer="lm_head")


def test_a_stack_returning_its_stream_ends_at_the_model_output():
    report = audit_file(PLACEMENT / "NP101_3.py")
    assert report.model.stream_end == StreamEnd(module="blocks.2.ln", block="blocks.2", consumer=None)


def test_a_final_norm_closes_the_stream():
    report = audit_file(PLACEMENT / "NP101_2.py")
    assert report.model.has_final_norm is True
    assert report.model.stream_end is None


class _Forgot(nn.Module):
    """Two pre-LN blocks and a final norm built but never applied (nanoGPT without ``ln_f`` in forward)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.layers = nn.ModuleList(blocks.PreLN() for _ in range(2))
        self.ln_f = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_the_registered_unused_final_norm_is_named():
    report = audit_model(_Forgot(), (torch.randint(0, 50, (2, 6)),))
    assert [u.module for u in report.model.unused_norms] == ["ln_f"]
    assert report.model.stream_end == StreamEnd(module="layers.1.ln2", block="layers.1", consumer="head",
                                                unused_norm="ln_f")


class _One(nn.Module):
    """A single pre-LN block closed by a projection (a transformer block nested in a U-Net)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([blocks.PreLN()])
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.proj(x)


def test_a_stack_of_one_block_has_no_stream_end():
    report = audit_model(_One(), (torch.randn(2, 6, 16),))
    assert report.model.stream_end is None
