"""Formula facts (normaudit.facts.formula) and the norm-type / numerics rules (NT1xx, NN1xx).

- every formula fact against its true value on hand-written variants of each kind, from the graph alone and
  with the numeric probe, in float32 and float16;
- real code no one here wrote: the RMSNorms of transformers' Llama, Mistral, Gemma and T5, torch.nn.RMSNorm
  and torch.nn.LayerNorm, with nothing flagged in float32 or bfloat16;
- every rule file documented, and every rule surviving missing facts (the rules' fixtures in
  tests/fixtures/norm_type are run by test_rule_fixtures.py).
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import CASES, audit_file, audit_model, loud, requires_cases, site
from normaudit.engine.evaluator import evaluate
from normaudit.engine.loader import load_rule_file
from normaudit.probes import formula_confirm
from normaudit.render.text import render
from normaudit.report import Formula, ModelFacts, Site

FIXTURES = Path(__file__).parent / "fixtures" / "norm_type"
sys.path.insert(0, str(FIXTURES))
import norm_variants as nv  # noqa: E402

D = 16
NO_RULES: dict = {}


class Wrap(nn.Module):
    """A projection, then the norm under test as ``norm``."""

    def __init__(self, norm: nn.Module, d: int = D):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.norm = norm

    def forward(self, x):
        return self.norm(self.proj(x))


def _formula(norm: nn.Module, dtype: str = "float32", module: str = "norm"):
    report = audit_model(Wrap(norm), (torch.randn(2, 5, D),), rules=NO_RULES, dtype=dtype)
    return site(report, module)


LN = dict(mean_subtracted=True, variance="population", eps_position="inside_sqrt", inverted_scale=False)
RMS = dict(mean_subtracted=False, variance="mean_square", eps_position="inside_sqrt", inverted_scale=False)

# class: (kind, facts true in any dtype, (stats_dtype, eps_dtype) in a float16 audit)
VARIANTS = {
    "ln_population": (nv.PopLayerNorm, "LayerNorm",
                      dict(LN, gain="weight", bias=True, upcast=False), ("float16", "float16")),
    "ln_unbiased": (nv.UnbiasedLayerNorm, "LayerNorm",
                    dict(LN, variance="unbiased", gain="weight", bias=True, upcast=False), ("float16", "float16")),
    # std kernels accumulate in float32; eps is then added to a float16 std
    "ln_eps_outside": (nv.EpsOutsideLayerNorm, "LayerNorm",
                       dict(LN, eps_position="outside_sqrt", gain="weight", bias=True, upcast=True),
                       ("float32", "float16")),
    "rms_upcast": (nv.UpcastRMSNorm, "RMSNorm", dict(RMS, gain="weight", bias=False, upcast=True),
                   ("float32", "float32")),
    "rms_one_plus_w": (nv.OnePlusRMSNorm, "RMSNorm", dict(RMS, gain="one_plus_weight", bias=False, upcast=True),
                       ("float32", "float32")),
    "rms_no_upcast": (nv.PlainRMSNorm, "RMSNorm", dict(RMS, gain="weight", bias=False, upcast=False),
                      ("float16", "float16")),
    "rms_sqrt_div": (nv.SqrtDivRMSNorm, "RMSNorm", dict(RMS, gain="weight", bias=False, upcast=False),
                     ("float16", "float16")),
    "rms_inverted": (nv.InvertedRMSNorm, "RMSNorm",
                     dict(RMS, inverted_scale=True, gain="weight", bias=False, upcast=False), ("float16", "float16")),
}


class AllVariants(nn.Module):
    """Every variant in one model (one audit per mode instead of one per variant), each under its own name."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)
        for name, (cls, *_) in VARIANTS.items():
            setattr(self, name, cls(D))

    def forward(self, x):
        x = self.proj(x)
        for name in VARIANTS:
            x = getattr(self, name)(x)
        return x


@functools.lru_cache(maxsize=None)
def _variants_report(mode: str):
    """The audit of :class:`AllVariants` in ``mode``: a dtype, or ``graph`` (float32, probe disabled)."""
    with pytest.MonkeyPatch.context() as mp:
        if mode == "graph":
            mp.setattr(formula_confirm, "MAX_PROBE_PARAMS", 0)
        return audit_model(AllVariants(), (torch.randn(2, 5, D),), rules=NO_RULES,
                           dtype="float32" if mode == "graph" else mode)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_hand_written_formula_facts(name):
    cls, kind, facts, (stats16, eps16) = VARIANTS[name]
    s = site(_variants_report("float32"), name)
    f = s.formula
    assert s.kind == kind
    assert {k: getattr(f, k) for k in facts} == facts
    assert (f.fused, f.stats_dtype, f.eps_dtype, f.size) == (False, "float32", "float32", D)
    assert (f.confirmed, f.eps_matches, f.notes) == (True, True, [])  # graph and probe agree
    assert f.eps_measured == pytest.approx(s.eps, rel=1e-3)
    # the same facts from the graph alone
    g = site(_variants_report("graph"), name).formula
    assert g.confirmed is None and g.notes == ["not probed: module too large"]
    assert {k: getattr(g, k) for k in facts} == facts
    # float16: where the statistics and eps live, measured on the module too
    h = site(_variants_report("float16"), name).formula
    assert (h.stats_dtype, h.eps_dtype, h.upcast, h.confirmed, h.constant_row_finite, h.notes) == (
        stats16, eps16, facts["upcast"], True, True, [])
    # bfloat16 cannot overflow, so it cannot show an upcast: upcast stays what float16 measures
    b = site(_variants_report("bfloat16"), name).formula
    bf = lambda dt: dt.replace("float16", "bfloat16")  # noqa: E731
    assert (b.stats_dtype, b.eps_dtype, b.upcast, b.notes) == (bf(stats16), bf(eps16), facts["upcast"], [])


def test_fused_torch_norms():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(D, eps=1e-12)
            self.rms = nn.RMSNorm(D, eps=1e-6)
            self.ln_plain = nn.LayerNorm(D, elementwise_affine=False)

        def forward(self, x):
            return self.ln_plain(self.rms(self.ln(x)))

    for dtype in ("float32", "float16", "bfloat16"):
        report = audit_model(Net(), (torch.randn(2, 5, D),), rules=NO_RULES, dtype=dtype)
        ln, rms, plain = (site(report, m).formula for m in ("ln", "rms", "ln_plain"))
        assert (ln.mean_subtracted, ln.variance, ln.gain, ln.bias) == (True, "population", "weight", True)
        assert (rms.mean_subtracted, rms.variance, rms.gain, rms.bias) == (False, "mean_square", "weight", False)
        assert (plain.gain, plain.bias) == ("none", False)
        for f in (ln, rms, plain):
            assert (f.fused, f.upcast, f.stats_dtype, f.eps_dtype, f.confirmed, f.constant_row_finite) == (
                True, True, "float32", "float32", True, True)
    assert ln.text == "LayerNorm: (x - mean) / sqrt(var_pop + eps) * w + b over [feature]"
    assert rms.text == "RMSNorm: x / sqrt(mean(x^2) + eps) * w over [feature]"


# ------------------------------------------------------------------ real code no one here wrote

HF = {
    "llama": ("LlamaConfig", "LlamaModel", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                num_attention_heads=4, num_key_value_heads=4, vocab_size=100),
              "LlamaRMSNorm", "weight"),
    "mistral": ("MistralConfig", "MistralModel", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                                      vocab_size=100), "MistralRMSNorm", "weight"),
    "gemma": ("GemmaConfig", "GemmaModel", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                                vocab_size=100), "GemmaRMSNorm", "one_plus_weight"),
    "t5": ("T5Config", "T5EncoderModel", dict(d_model=32, d_ff=64, num_layers=1, num_heads=4, d_kv=8,
                                              vocab_size=100), "T5LayerNorm", "weight"),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(HF))
def test_transformers_rmsnorms(name, dtype, rules):
    transformers = pytest.importorskip("transformers")
    cfg_name, model_name, kw, cls, gain = HF[name]
    with torch.device("meta"):
        model = getattr(transformers, model_name)(getattr(transformers, cfg_name)(**kw))
    expected = [p for p, m in model.named_modules() if type(m).__name__ == cls]
    report = audit_model(model, rules=rules, on_meta=True, dtype=dtype)
    assert [s.module for s in report.sites] == expected
    for s in report.sites:
        f = s.formula
        assert (s.kind, f.mean_subtracted, f.variance, f.eps_position, f.gain, f.bias, f.inverted_scale) == (
            "RMSNorm", False, "mean_square", "inside_sqrt", gain, False, False), s.module
        assert (f.upcast, f.fused, f.stats_dtype, f.confirmed, f.eps_matches, f.notes) == (
            True, False, "float32", True, True, []), s.module
    assert loud(report) == []
    if name == "t5":  # named LayerNorm, computes RMSNorm: said once per module, as info
        assert {(f.rule_id, f.severity) for f in report.findings if f.category == "norm-type"} == {("NT101", "info")}


# ------------------------------------------------------------------ probing: where, how often, who wins
def test_identical_modules_probed_once(monkeypatch):
    calls = []
    real = formula_confirm.probe_formula
    monkeypatch.setattr(formula_confirm, "probe_formula", lambda *a, **k: calls.append(a[1:3]) or real(*a, **k))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.same = nn.ModuleList(nv.PlainRMSNorm(D) for _ in range(6))
            self.other_eps = nv.PlainRMSNorm(D, eps=1e-5)
            self.other_class = nv.UpcastRMSNorm(D)

        def forward(self, x):
            for m in self.same:
                x = m(x)
            return self.other_class(self.other_eps(x))

    report = audit_model(Net(), (torch.randn(2, 5, D),), rules=NO_RULES)
    assert len(calls) == 3
    assert all(s.formula.confirmed for s in report.sites)


def test_norm_inside_a_block_keeps_graph_facts():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Parameter(torch.ones(D))
            self.ff = nn.Linear(D, D)

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return x + self.ff(h.type_as(x) * self.g)

    s = _formula(Block(), module="norm")
    f = s.formula
    assert (s.kind, f.gain, f.bias, f.upcast, f.variance, f.inverted_scale) == (
        "RMSNorm", "weight", False, True, "mean_square", False)
    assert f.confirmed is None and any("part of a larger module" in n for n in f.notes)


class OnesLikePlusW(nn.Module):
    """Gain (1 + w) written as ones_like(w) + w: the graph does not see the offset, the probe does."""

    def __init__(self, d):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(d)), 1e-6

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * (torch.ones_like(self.weight) + self.weight)


def test_probe_wins_over_graph_and_says_so():
    f = _formula(OnesLikePlusW(D)).formula
    assert (f.gain, f.confirmed) == ("one_plus_weight", True)
    assert f.notes == ["gain: the graph says none, the probe measured one_plus_weight; using the probe"]


def test_text_report_shows_formulas():
    report = audit_model(Wrap(nv.OnePlusRMSNorm(D)), (torch.randn(2, 5, D),), rules=NO_RULES)
    assert "RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w) over [feature]   [norm]" in render(report)


@requires_cases
def test_n17_fused_vs_hand_written_half_precision():
    """What the eps rule of N17 reads: the hand-written norm holds its statistics and eps in float16 (and a
    constant row gives NaN there); nn.LayerNorm accumulates in float32."""
    report = audit_file(CASES / "N17_eps_fp16" / "model.py", rules=NO_RULES, dtype="float16")
    norm, pre = site(report, "norm").formula, site(report, "pre_norm").formula
    assert (norm.fused, norm.upcast, norm.stats_dtype, norm.eps_dtype, norm.constant_row_finite) == (
        False, False, "float16", "float16", False)
    assert (pre.fused, pre.upcast, pre.stats_dtype, pre.eps_dtype, pre.constant_row_finite) == (
        True, True, "float32", "float32", True)


def test_eps_after_explicit_sqrt_is_a_site():
    f = _formula(nv.EpsOutsideRMSNorm(D)).formula
    assert (f.eps_position, f.variance) == ("outside_sqrt", "mean_square")


MY_RULES = sorted((Path(__file__).resolve().parents[1] / "rules").glob("norm-type/*.yaml")) + sorted(
    (Path(__file__).resolve().parents[1] / "rules").glob("numerics/NN101*.yaml"))  # NN102+: test_numerics.py


@pytest.mark.parametrize("path", MY_RULES, ids=lambda p: p.stem)
def test_rule_files_documented(path):
    rule = load_rule_file(path)
    assert path.stem == f"{rule.id}-{rule.name}"
    for section in ("what", "why", "example", "use_instead"):
        assert len(getattr(rule.doc, section).strip()) > 20, section
    assert rule.doc.references


@pytest.mark.parametrize("formula", [None, Formula(), Formula(variance="unbiased", eps_position="outside_sqrt",
                                                                 inverted_scale=True, upcast=False,
                                                                 stats_dtype="float16")])
def test_rules_survive_missing_facts(formula):
    """A site without formula facts (capture failed: module walk) or with every fact unknown never crashes a
    rule; one with every fault fires them all."""
    rules = [load_rule_file(p) for p in MY_RULES]
    s = Site(module="m", kind="LayerNorm", class_name="RMSNormish", detected_by="module_walk", formula=formula)
    for config in ({}, {"rms_norm_eps": 1e-6}):
        found = evaluate(rules, [s], ModelFacts(class_name="M"), config, None, {"dtype": "float16"})
        if formula is None or formula.variance is None:
            assert {f.rule_id for f in found} <= {"NT101", "NT102"}
    assert {f.rule_id for f in found} >= ({"NT103", "NT104", "NT105", "NN101"} if formula and formula.variance else set())
