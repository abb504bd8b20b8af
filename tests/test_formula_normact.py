"""The formula probe reads the norm's own output in a norm-plus-activation module (timm's NormAct layers:
``LayerNormAct2d``, ``RmsNormAct2d``: ``x = self.act(self.drop(norm(x)))``, channels-first): the probe copy's
activation and dropout children are identities, so the formula is confirmed. A child that
runs before the norm is kept."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts


class LayerNormAct2d(nn.LayerNorm):
    """timm.layers.norm_act.LayerNormAct2d: LayerNorm over C of (N, C, H, W), then drop, then act."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__(channels, eps=eps)
        self.drop = nn.Identity()
        self.act = nn.GELU()

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return self.act(self.drop(x.permute(0, 3, 1, 2)))


class RmsNormAct2d(nn.Module):
    """timm.layers.norm_act.RmsNormAct2d (rms_norm2d written out): RMS over C of (N, C, H, W), then act."""

    def __init__(self, channels: int, eps: float = 1e-6, pre: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.eps = eps
        self.pre = nn.ReLU() if pre else None
        self.act = nn.SiLU()

    def forward(self, x):
        if self.pre is not None:
            x = self.pre(x)
        x = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)
        return self.act(x * self.weight.view(1, -1, 1, 1))


class Net(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = norm

    def forward(self, x):
        return self.norm(self.conv(x))


def _formula(norm, method):
    model = Net(norm)
    cap = capture_model(copy.deepcopy(model), (torch.randn(2, 3, 8, 8),), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    (rec,) = collect_facts(FactContext(cap=cap, probe_model=copy.deepcopy(model))).records
    return rec.site


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
@pytest.mark.parametrize("norm, text", [
    (lambda: LayerNormAct2d(8, eps=1e-6), "LayerNorm: (x - mean) / sqrt(var_pop + eps) * w + b over [channel]"),
    (lambda: RmsNormAct2d(8, eps=1e-6), "RMSNorm: x / sqrt(mean(x^2) + eps) * w over [channel]"),
], ids=["LayerNormAct2d", "RmsNormAct2d"])
def test_norm_act_formula_is_confirmed(method, norm, text):
    s = _formula(norm(), method)
    assert (s.module, s.formula.confirmed, s.formula.text) == ("norm", True, text)
    assert s.formula.eps_measured == pytest.approx(1e-6, rel=0.05)


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_a_child_before_the_norm_is_kept_in_the_probe(method):
    # relu before the norm changes what the probe rows measure: no reference formula reproduces it
    s = _formula(RmsNormAct2d(8, eps=1e-6, pre=True), method)
    assert (s.module, s.formula.confirmed) == ("norm", False)
