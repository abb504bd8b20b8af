"""Causal streams for norms over time (normaudit.facts.causal): ``site.batchnorm.causal_conv`` (a causal
convolution next to the norm), ``model.causal_time`` (the configuration's declaration), and the time axis of
video and padded-audio inputs read by convolutions (normaudit.facts.axes.inputs)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import audit_file, audit_model, family_rules, site
from normaudit.facts.causal import _causal_module, _config_flag

BATCHNORM = Path(__file__).parent / "fixtures" / "batchnorm"


def test_config_flags_and_causal_modules():
    assert _config_flag({"use_causal_conv": True}) == "config use_causal_conv=True"
    assert _config_flag({"encoder": {"causal": True}}) == "config causal=True"
    # a decoder's causal attention says nothing about the convolutions' time axis
    assert _config_flag({"use_causal_conv": False, "is_causal": True, "is_decoder": True}) is None

    class FlaggedConv(nn.Conv1d):
        causal = True

    class CausalConv1d(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 2, 3)

    modules = {"a": nn.Conv1d(2, 2, 3), "b": FlaggedConv(2, 2, 3), "c": CausalConv1d()}
    modules["c.conv"] = modules["c"].conv
    assert [_causal_module(p, modules) for p in ("a", "b", "c.conv")] == [
        None, "module b (FlaggedConv)", "module c (CausalConv1d)"]


class PaddedNet(nn.Module):
    """conv -> GroupNorm over (N, C, T, H, W) -> silu -> conv(F.pad(x, pad))."""

    def __init__(self, pad):
        super().__init__()
        self.pad = pad
        self.conv_in = nn.Conv3d(2, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4)
        self.conv = nn.Conv3d(4, 4, (3, 3, 3))

    def forward(self, video):
        return self.conv(F.pad(F.silu(self.norm(self.conv_in(video))), self.pad))


@pytest.mark.parametrize("pad, expected", [
    ((1, 1, 1, 1, 2, 0), "causal padding (2, 0) of dim 2 before conv"),
    ((1, 1, 1, 1, 1, 1), None),          # symmetric: not causal
    ((1, 1, 1, 1, 1, 0), None),          # 1 frame before a kernel of 3: not k - 1
    ((2, 0, 1, 1, 1, 1), "causal padding (2, 0) of dim 4 before conv")])
def test_causal_padding_needs_k_minus_one_frames_before_and_none_after(pad, expected):
    r = audit_model(PaddedNet(pad), (torch.randn(1, 2, 4, 6, 6),), rules=family_rules("batchnorm"))
    assert site(r, "norm").batchnorm.causal_conv == expected


def test_a_causal_sub_model_elsewhere_does_not_make_the_norm_causal():
    """A codec whose semantic branch has a causal depthwise convolution (a conformer's, (k - 1, 0) padding)
    and whose acoustic decoder normalises over time between symmetric convolutions: the decoder's norm is
    not in a causal stream."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.semantic = nn.Conv1d(4, 4, 5, groups=4)
            self.decoder_in = nn.Conv1d(4, 4, 3, padding=1)
            self.norm = nn.GroupNorm(2, 4)
            self.decoder_out = nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            sem = self.semantic(F.pad(x, (4, 0)))
            return self.decoder_out(F.silu(self.norm(self.decoder_in(x + sem))))

    r = audit_model(Net(), (torch.randn(2, 4, 16),), rules=family_rules("batchnorm"))
    norm = site(r, "norm")
    assert (norm.normalized_axes, norm.batchnorm.causal_conv) == (["channel", "sequence"], None)
    assert [f.module for f in r.findings if f.rule_id == "NB113"] == []


def test_causal_fixtures_time_axes():
    rules = family_rules("batchnorm")
    r = audit_file(BATCHNORM / "NB113_1.py", rules)
    norm = site(r, "block.norm")
    assert (norm.input_axes, norm.normalized_axes) == (["batch", "channel", "sequence", "height", "width"],
                                                        ["channel", "sequence", "height", "width"])
    # the size probe grows the time axis of the (N, C, T, H, W) video, not its channels
    assert norm.size_probe is not None and norm.size_probe.resize.startswith("sequence 5->")
    r = audit_file(f"{BATCHNORM / 'NB113_2.py'}:build_symmetric", rules)
    assert (r.model.causal_time, site(r, "norm").batchnorm.causal_conv) == (None, None)
    assert site(r, "norm").input_axes == ["batch", "channel", "sequence"]
    r = audit_file(BATCHNORM / "NB113_3.py", rules)  # a non-causal video model: Conv3d with symmetric padding
    assert (r.model.causal_time, site(r, "norm").batchnorm.causal_conv) == (None, None)
    assert site(r, "norm").normalized_axes == ["channel", "sequence", "height", "width"]
