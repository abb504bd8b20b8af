"""``model.causal_time`` (normaudit.facts.causal): what says a model is causal along time, and the time axis of
video and padded-audio inputs read by convolutions (normaudit.facts.axes.inputs)."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from conftest import audit_file, family_rules
from normaudit.facts.causal import _causal_module, _config_flag, causal_padding

BATCHNORM = Path(__file__).parent / "fixtures" / "batchnorm"


def test_config_flags_and_causal_modules():
    assert _config_flag({"use_causal_conv": True}) == "config use_causal_conv=True"
    assert _config_flag({"encoder": {"causal": True}}) == "config causal=True"
    assert _config_flag({"use_causal_conv": False, "is_decoder": True}) is None

    class Attn(nn.Module):  # a decoder's causal attention says nothing about the convolutions' time axis
        def __init__(self):
            super().__init__()
            self.is_causal = True
            self.q = nn.Linear(4, 4)

    class FlaggedConv(nn.Conv1d):
        causal = True

    assert _causal_module({"attn": Attn(), "conv": nn.Conv1d(2, 2, 3)}) is None
    assert _causal_module({"attn": Attn(), "enc.conv": FlaggedConv(2, 2, 3)}) == "module enc.conv (FlaggedConv)"


def test_causal_padding_needs_k_minus_one_frames_before_and_none_after():
    from normaudit.capture import capture_model

    class Net(nn.Module):
        def __init__(self, pad):
            super().__init__()
            self.pad, self.conv = pad, nn.Conv3d(2, 2, (3, 3, 3))

        def forward(self, x):
            return self.conv(F.pad(x, self.pad))

    x = torch.randn(1, 2, 4, 6, 6)
    got = {}
    for pad in [(1, 1, 1, 1, 2, 0), (1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 1, 0), (2, 0, 1, 1, 1, 1)]:
        cap = capture_model(Net(pad), (x,), on_meta=False, methods=("symbolic_trace",))
        got[pad] = causal_padding(cap.gm.graph, cap.modules)
    assert got == {(1, 1, 1, 1, 2, 0): "causal padding (2, 0) of dim 2 before conv",
                   (1, 1, 1, 1, 1, 1): None,           # symmetric: not causal
                   (1, 1, 1, 1, 1, 0): None,           # 1 frame before a kernel of 3: not k - 1
                   (2, 0, 1, 1, 1, 1): "causal padding (2, 0) of dim 4 before conv"}


def test_causal_fixtures_time_axes_and_evidence():
    rules = family_rules("batchnorm")
    r = audit_file(BATCHNORM / "NB113_1.py", rules)
    assert r.model.causal_time == "module conv_in (CausalConv3d)"
    norm = next(s for s in r.sites if s.module == "block.norm")
    assert (norm.input_axes, norm.normalized_axes) == (["batch", "channel", "sequence", "height", "width"],
                                                        ["channel", "sequence", "height", "width"])
    # the size probe grows the time axis of the (N, C, T, H, W) video, not its channels
    assert norm.size_probe is not None and norm.size_probe.resize.startswith("sequence 5->")
    r = audit_file(f"{BATCHNORM / 'NB113_2.py'}:build_symmetric", rules)
    assert r.model.causal_time is None
    assert next(s for s in r.sites if s.module == "norm").input_axes == ["batch", "channel", "sequence"]
    r = audit_file(BATCHNORM / "NB113_3.py", rules)  # a non-causal video model: Conv3d with symmetric padding
    assert r.model.causal_time is None
    assert r.sites[0].normalized_axes == ["channel", "sequence", "height", "width"]
