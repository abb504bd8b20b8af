"""``site.stream.reapplied_of``: a norm module called at a second place of one residual block, on both capture
methods (the models of the NP109 fixtures)."""
from __future__ import annotations

import pytest
import torch

from conftest import load_fixture_module
from normaudit.capture import capture_model
from normaudit.facts.placement import analyse
from normaudit.facts.sites import discover_sites
from normaudit.report import ModelFacts
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "placement"


def _reapplied(factory: str, name: str, method: str) -> list[tuple[str, int, str, object]]:
    mod = load_fixture_module(FIXTURES / name)
    model = getattr(mod, factory)().eval()
    cap = capture_model(model, (torch.randint(0, 64, (2, 8)),), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    records = discover_sites(cap)
    analyse(cap, records, ModelFacts(class_name=type(model).__name__))
    return [(r.site.module, r.site.call_index, r.site.placement, r.site.stream.reapplied_of) for r in records
            if r.site.call_index or r.site.stream.reapplied_of]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_second_call_names_the_first(method):
    """Pre-LN and post-LN blocks calling one norm twice: the second call names the first's key."""
    assert _reapplied("build_model", "NP109_1.py", method) == [
        ("blocks.0.norm", 1, "pre", "blocks.0.norm"), ("blocks.1.norm", 1, "pre", "blocks.1.norm")]
    assert _reapplied("build_post", "NP109_1.py", method) == [
        ("layers.0.layer_norm", 1, "post", "layers.0.layer_norm"),
        ("layers.1.layer_norm", 1, "post", "layers.1.layer_norm")]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
@pytest.mark.parametrize("factory, calls", [
    # the same tensor normalised twice: a parallel residual
    ("build_parallel", [("layers.0.ln2", 1, "pre"), ("layers.1.ln2", 1, "pre")]),
    # one layer shared across depth: every call from one line
    ("build_shared", [("layer.norm1", 1, "post"), ("layer.norm2", 1, "post"),
                      ("layer.norm1", 2, "post"), ("layer.norm2", 2, "post")]),
    # two parallel streams of a block: the global tokens' input does not descend from the local call
    ("build_streams", [("layers.0.final_layer_norm", 1, "pre"), ("layers.1.final_layer_norm", 1, "pre")]),
    # one q/k norm for queries and keys
    ("build_qk", [("layers.0.qk_norm", 1, "qk"), ("layers.1.qk_norm", 1, "qk")]),
])
def test_reuse_by_design_is_not_reapplied(factory, calls, method):
    assert _reapplied(factory, "NP109_2.py", method) == [c + (None,) for c in calls]
