"""``site.unread_gain`` and a gain multiplied in after a flatten, on both capture methods (the models of the
NP110 fixtures)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from conftest import load_fixture_module
from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts
from normaudit.report import UnreadGain

FIXTURES = Path(__file__).parent / "fixtures" / "placement"


def _gains(name: str, method: str) -> list[tuple]:
    model = load_fixture_module(FIXTURES / name).build_model().eval()
    cap = capture_model(model, (torch.randint(0, 64, (2, 8)),), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    recs = collect_facts(FactContext(cap=cap, probe_model=copy.deepcopy(model))).records
    return [(r.site.module, r.site.formula.gain if r.site.formula else None, r.site.unread_gain) for r in recs]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_gain_never_read(method):
    unread = UnreadGain(param="weight", shape=[16])
    assert _gains("NP110_1.py", method) == [("layers.0.norm", "none", unread), ("layers.1.norm", "none", unread),
                                             ("norm_f", "weight", None)]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_gain_after_flatten_and_tied_gains_are_read(method):
    per_block = [("norm", "one_plus_weight"), ("gnorm", "weight"), ("plain", "none"), ("tied", "one_plus_weight")]
    assert _gains("NP110_2.py", method) == [
        *[(f"layers.{i}.{m}", g, None) for i in range(2) for m, g in per_block], ("norm_f", "weight", None)]
