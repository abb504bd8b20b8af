"""Axes of a part captured on the inputs the model's forward gave it: rank-4 hidden
states read by a LayerNorm are no image. Llama 4's vision encoder, captured by parts, normalises
``(B, tiles, tokens, D)`` with ``layernorm_pre`` (modeling_llama4.py:1102); labelled (batch, channel, height,
width) by their rank alone, NL102 said the LayerNorm normalised the image width."""
from __future__ import annotations

import torch
from torch import nn

from conftest import audit_model


class TileNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)

    def forward(self, h):
        return self.norm(h)


class BranchingEncoder(nn.Module):
    """Patches (B, 4, 12) -> hidden (B, 1, 4, 16) -> LayerNorm, then a branch on values that no capture on
    fake tensors can take: the model is captured by parts."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 16)
        self.pre = TileNorm()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.pre(self.proj(x).reshape(x.shape[0], 1, 4, 16))
        if h.sum() > 0:  # data-dependent: symbolic_trace and export both fail here
            h = h * 2
        return self.head(h)


class ImageLayerNorm(nn.Module):
    """nn.LayerNorm(W) straight on an image input: the width normalised (NL102's true positive)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x):
        return self.conv(self.norm(x))


def test_recorded_rank4_hidden_states_of_a_part_are_features(rules):
    report = audit_model(BranchingEncoder().eval(), (torch.randn(2, 4, 12),), rules=rules)
    assert [(p.module, p.inputs) for p in report.capture.parts] == [("pre", ["arg0: float32[2, 1, 4, 16]"])]
    site = next(s for s in report.sites if s.module == "pre.norm")
    assert site.normalized_axes == ["feature"]
    assert not [f for f in report.findings if f.rule_id == "NL102"]


def test_an_image_model_input_normalised_over_width_still_flagged(rules):
    report = audit_model(ImageLayerNorm().eval(), (torch.randn(2, 3, 8, 16),), rules=rules)
    assert [(f.rule_id, f.module) for f in report.findings if f.rule_id == "NL102"] == [("NL102", "norm")]
