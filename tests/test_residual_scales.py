"""``model.residual_scales``: the constants residual adds scale an operand by, on both capture methods (the
models of the NP107_4 fixture: DeepNorm wired as ``x + alpha * f(x)``, a Granite-style scaled pre-LN stack)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import load_fixture_module
from normaudit.capture import capture_model
from normaudit.facts.placement import analyse
from normaudit.facts.sites import discover_sites
from normaudit.report import ModelFacts, ResidualScale

FIXTURE = Path(__file__).parent / "fixtures" / "placement" / "NP107_4.py"


def _scales(model: nn.Module, inputs: tuple, method: str) -> list[ResidualScale]:
    cap = capture_model(model.eval(), inputs, on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    facts = ModelFacts(class_name=type(model).__name__)
    analyse(cap, discover_sites(cap), facts)
    return facts.residual_scales


class LayerScaled(nn.Module):
    """x + gamma * f(x) with a learned gamma (LayerScale, CaiT), and x + f(x) / 2 (a division)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.f, self.g, self.gamma = nn.Linear(d, d), nn.Linear(d, d), nn.Parameter(torch.full((d,), 0.1))

    def forward(self, x):
        x = x + self.gamma * self.f(x)
        return x + self.g(x) / 2


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_branch_scales_are_read(method):
    mod = load_fixture_module(FIXTURE)
    ids = (torch.randint(0, 64, (2, 8)),)
    assert _scales(mod.build_model(), ids, method) == [ResidualScale(operand="branch", value=8 ** 0.25)]
    assert _scales(mod.build_scaled(), ids, method) == [ResidualScale(operand="branch", value=0.22)]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_a_learned_scale_is_no_constant(method):
    assert _scales(LayerScaled(), (torch.randn(2, 3, 8),), method) == [ResidualScale(operand="branch", value=0.5)]
