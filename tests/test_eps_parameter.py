"""``site.eps_facts.param_eps``: a norm's literal eps beside an ``__init__`` eps parameter that reaches the
model's other norms (the models of the NE102_6 fixture)."""
from __future__ import annotations

from pathlib import Path

from conftest import audit_file
from normaudit.report import ParamEps

FIXTURE = Path(__file__).parent / "fixtures" / "eps" / "NE102_6.py"


def _param_eps(factory: str) -> dict:
    report = audit_file(f"{FIXTURE}:{factory}")
    return {s.module: s.eps_facts.param_eps for s in report.sites}


def test_final_norm_literal_beside_the_blocks_parameter():
    got = _param_eps("build_model")
    assert got.pop("norm") == ParamEps(param="norm_eps", owner="Transformer", passed_to=["layers"], value=1e-6,
                                       literal=1e-5, norms=4)
    assert set(got) == {"layers.0.attention_norm", "layers.0.ffn_norm", "layers.1.attention_norm",
                        "layers.1.ffn_norm"} and not any(got.values())


def test_parameter_passed_or_literal_equal_is_nothing():
    assert not any(_param_eps("build_fixed").values())
    assert not any(_param_eps("build_same").values())
