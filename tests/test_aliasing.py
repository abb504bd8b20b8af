"""In-place norms that overwrite the caller's tensor (normaudit.facts.aliasing, rule NP108).

The fixtures tests/fixtures/placement/NP108_*.py are run by tests/test_rule_fixtures.py; here: that the bug is real
(eager float32 differs from the out-of-place norm, bfloat16 does not), the exact fact, the dtype dependence,
that threading in-place reads leaves the graph's result unchanged, and the other in-place spellings.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import fx, nn

from conftest import audit_file, audit_model, family_rules, load_fixture_module, site
from normaudit.facts.aliasing import thread_inplace

FIXTURES = Path(__file__).parent / "fixtures" / "placement"


@pytest.fixture(scope="module")
def placement_rules():
    return family_rules("placement")


def _np108(report):
    return {f.module: f for f in report.findings if f.rule_id == "NP108"}


class OutOfPlaceRMSNorm(nn.Module):
    """nano-vllm's RMSNorm with ``x = x * rsqrt(...)`` instead of ``x.mul_(...)`` (GeeeekExplorer/nano-vllm PR #171)."""

    def forward(self, x):
        orig_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x.to(orig_dtype) * self.weight


def _outputs(dtype):
    fixture = load_fixture_module(FIXTURES / "NP108_1.py")
    torch.manual_seed(0)
    model = fixture.build_model().to(dtype).eval()
    fixed = copy.deepcopy(model)
    for mod in fixed.modules():
        if type(mod).__name__ == "RMSNorm":
            mod.__class__ = type("Fixed", (OutOfPlaceRMSNorm, type(mod)), {})
    idx = fixture.example_inputs()[0]
    with torch.no_grad():
        return model(idx), fixed(idx)


def test_the_aliasing_is_real_in_float32_only():
    got, want = _outputs(torch.float32)
    assert (got - want).abs().max().item() > 1e-2  # the residual carried the normalised tensor
    got, want = _outputs(torch.bfloat16)
    assert torch.equal(got, want)  # .float() copies a bfloat16 input: the in-place ops touch only the copy


def test_fact_names_op_line_readers_and_dtypes(placement_rules):
    report = audit_file(FIXTURES / "NP108_1.py", placement_rules)
    fact = site(report, "layers.0.post_attention_layernorm").stream.inplace_alias.model_dump()
    path = str(FIXTURES / "NP108_1.py")
    assert fact == {"op": "mul_", "source": {"file": path, "line": 19}, "mutated": "add_1",
                    "consumers": [{"module": "layers.0", "op": "add", "source": {"file": path, "line": 40}}],
                    "caller_input": None, "casts": ["float"], "alias_dtypes": ["float32"]}
    assert site(report, "norm").stream.inplace_alias is None  # the last reader: nothing reads it afterwards
    assert _np108(report)["layers.0.input_layernorm"].source.line == 18  # the statistic's line


def test_bfloat16_model_has_no_alias(placement_rules):
    report = audit_file(FIXTURES / "NP108_1.py", placement_rules, dtype="bfloat16")
    assert not _np108(report)
    assert all(s.stream.inplace_alias is None for s in report.sites)
    assert report.model.placement == "pre" and site(report, "layers.1.input_layernorm").placement == "pre"


class _Norm(nn.Module):
    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.how, self.weight = how, nn.Parameter(torch.ones(d))

    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        if self.how == "view":
            x.view(-1, x.shape[-1]).mul_(r.view(-1, 1))
            return x * self.weight
        if self.how == "out":
            return torch.mul(x, r, out=x) * self.weight
        if self.how == "imul":
            x *= r
            return x * self.weight
        if self.how == "clone":
            y = x.clone()
            y.mul_(r)
            return y * self.weight
        return (x * r) * self.weight


class _Residual(nn.Module):
    def __init__(self, how: str, d: int = 8):
        super().__init__()
        self.norm, self.fc = _Norm(how, d), nn.Linear(d, d)

    def forward(self, x):
        h = x * 2.0
        return h + self.fc(self.norm(h))


@pytest.mark.parametrize("how,op", [("view", "mul_"), ("out", "mul(out=)"), ("imul", "x *= r")])
def test_other_inplace_spellings_are_found(how, op, placement_rules):
    report = audit_model(_Residual(how), (torch.randn(2, 3, 8),), placement_rules)
    fact = site(report, "norm").stream.inplace_alias.model_dump()
    assert fact["op"] == op and fact["casts"] == [] and fact["alias_dtypes"] == ["float32", "float16", "bfloat16"]
    assert [c["module"] for c in fact["consumers"]] == [""] and fact["consumers"][0]["op"] == "add"
    assert "aliases in every dtype" in _np108(report)["norm"].message
    # through a view the norm's own later read is of the base, another tensor object than mul_'s result, so it
    # is not threaded and the norm's output stays unconnected (placement none); the other spellings read pre
    assert site(report, "norm").placement == ("none" if how == "view" else "pre")


@pytest.mark.parametrize("how", ["clone", "plain"])
def test_inplace_on_a_copy_or_out_of_place_is_silent(how, placement_rules):
    report = audit_model(_Residual(how), (torch.randn(2, 3, 8),), placement_rules)
    assert not _np108(report) and site(report, "norm").placement == "pre"


def test_model_input_overwritten_for_the_caller(placement_rules):
    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc = _Norm("view"), nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(self.norm(x))

    report = audit_model(First(), (torch.randn(2, 3, 8),), placement_rules)
    fact = site(report, "norm").stream.inplace_alias.model_dump()
    assert fact["caller_input"] == "x" and fact["consumers"] == []
    assert _np108(report)["norm"].message.endswith(
        "it overwrites the caller's tensor, and the model input `x` is overwritten for the caller (aliases in every "
        "dtype)")


def test_threading_keeps_the_graph_result():
    fixture = load_fixture_module(FIXTURES / "NP108_1.py")
    torch.manual_seed(0)
    model = fixture.build_model().eval()
    gm = fx.symbolic_trace(model)
    idx = fixture.example_inputs()[0]
    with torch.no_grad():
        before = gm(idx)
        assert thread_inplace(gm, dict(model.named_modules())) == 5  # 5 norms: x.to(orig_dtype) after x.mul_ in each
        assert torch.equal(gm(idx), before) and torch.equal(model(idx), before)


def test_norm_returning_its_own_tensor_mutated_in_place_is_final(placement_rules):
    """``y = x - mean; y.div_(std); y.mul_(w); return y`` as the model's last module: the model's output reads
    ``y`` after the in-place ops, i.e. the norm's output (threaded to it), so the norm reads as final."""
    fixture = load_fixture_module(FIXTURES / "NP108_2.py")

    class Block(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.ln, self.fc = fixture.CentredLayerNorm(d), fixture.mlp(d)

        def forward(self, x):
            return x + self.fc(self.ln(x))

    class Encoder(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.proj = nn.Linear(8, d)
            self.blocks = nn.ModuleList([Block(d) for _ in range(2)])
            self.norm = fixture.CentredLayerNorm(d)

        def forward(self, x):
            x = self.proj(x)
            for blk in self.blocks:
                x = blk(x)
            return self.norm(x)

    report = audit_model(Encoder(), (torch.randn(2, 5, 8),), placement_rules)
    assert [(s.module, s.placement) for s in report.sites] == [("blocks.0.ln", "pre"), ("blocks.1.ln", "pre"),
                                                               ("norm", "final")]
    assert not _np108(report) and report.model.has_final_norm is True


# -- torch.export -------------------------------------------------------------------------------------------
def _pipeline(model, inputs, method, dtype=torch.float32):
    """capture with ``method`` alone -> thread/untangle in-place reads -> sites -> placement -> aliasing;
    returns ``(records, model facts)``."""
    from normaudit.capture import capture_model
    from normaudit.report import ModelFacts
    from normaudit.facts import aliasing, placement
    from normaudit.facts.sites import discover_sites

    cap = capture_model(model, inputs, on_meta=False, methods=(method,), dtype=dtype)
    assert cap.gm is not None and cap.method == method, cap.attempts
    aliasing.thread_inplace(cap.gm, cap.modules)
    records = discover_sites(cap)
    facts = ModelFacts(class_name=type(model).__name__)
    placement.analyse(cap, records, facts)
    aliasing.analyse(cap, records)
    return records, facts


def _alias_facts(model, inputs, method, dtype=torch.float32):
    """``({module: (placement, consumers as (module, op, line), alias_dtypes)}, model placement)``."""
    records, facts = _pipeline(model, inputs, method, dtype)
    out = {}
    for r in records:
        alias = r.site.stream.inplace_alias
        fact = alias.model_dump() if alias is not None else None
        readers = [(c["module"], c["op"], c["source"]["line"]) for c in fact["consumers"]] if fact else None
        out[r.site.module] = (r.site.placement, readers, fact["alias_dtypes"] if fact else None)
    return out, facts.placement


@pytest.mark.parametrize("name", ["NP108_1", "NP108_2", "NP108_3"])
def test_export_finds_the_same_aliases_and_placements(name):
    """torch.export follows storage (after the norm's ``mul_`` the caller's reads of its tensor read the
    in-place node: the residual add read post-LN); untangling them gives the traced graph's answer."""
    fixture = load_fixture_module(FIXTURES / f"{name}.py")
    torch.manual_seed(0)
    traced = _alias_facts(fixture.build_model(), fixture.example_inputs(), "symbolic_trace")
    exported = _alias_facts(fixture.build_model(), fixture.example_inputs(), "export")
    assert exported == traced


def test_export_np108_1_exact():
    fixture = load_fixture_module(FIXTURES / "NP108_1.py")
    got, placement = _alias_facts(fixture.build_model(), fixture.example_inputs(), "export")
    assert placement == "pre"
    assert got["layers.0.input_layernorm"] == ("pre", [("layers.0", "add", 38)], ["float32"])
    assert got["layers.1.post_attention_layernorm"] == ("pre", [("layers.1", "add", 40)], ["float32"])
    assert got["norm"] == ("final", None, None)
    bf16, placement = _alias_facts(fixture.build_model(), fixture.example_inputs(), "export", torch.bfloat16)
    assert placement == "pre" and all(readers is None for _, readers, _ in bf16.values())


@pytest.mark.parametrize("how,found", [("view", True), ("out", True), ("imul", True), ("clone", False),
                                       ("plain", False)])
def test_export_other_spellings(how, found):
    """The norm's output is a new tensor (``x * self.weight``) here: the caller's read of the overwritten
    ``h`` reads an in-place node inside the norm in the export graph, no parent trace needed."""
    records, _ = _pipeline(_Residual(how), (torch.randn(2, 3, 8),), "export")
    alias = next(r.site for r in records if r.site.module == "norm").stream.inplace_alias
    fact = alias.model_dump() if alias is not None else None
    if not found:
        assert fact is None
        return
    readers = [(c["module"], c["op"], c["source"]["line"]) for c in fact["consumers"]]
    assert readers == [("", "add", 108)] and fact["alias_dtypes"] == ["float32", "float16", "bfloat16"]
    assert fact["op"] == {"view": "mul_", "out": "mul(out=)", "imul": "mul_"}[how]


class _SkipFromInplaceNorm(nn.Module):
    """``x = norm(x); x + fc(x)`` with nano-vllm's in-place RMSNorm: the caller rebinds ``x`` to the result,
    so the overwritten tensor is read by no one (skip-from-norm by design; TN on both capture methods)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.norm = load_fixture_module(FIXTURES / "NP108_1.py").RMSNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        x = self.norm(x * 2.0)
        return x + self.fc(x)


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_rebinding_the_result_of_an_inplace_norm_is_silent(method):
    got, _ = _alias_facts(_SkipFromInplaceNorm(), (torch.randn(2, 3, 8),), method)
    assert got["norm"][1] is None
    traced, _ = _alias_facts(_SkipFromInplaceNorm(), (torch.randn(2, 3, 8),), "symbolic_trace")
    assert got == traced


def test_np108_fires_on_the_export_capture(placement_rules):
    from normaudit.engine.evaluator import evaluate

    fixture = load_fixture_module(FIXTURES / "NP108_1.py")
    records, facts = _pipeline(fixture.build_model(), fixture.example_inputs(), "export")
    findings = evaluate([placement_rules["NP108"]], [r.site for r in records], facts, {}, None, {})
    assert sorted(f.module for f in findings) == [f"layers.{i}.{n}" for i in range(2)
                                                  for n in ("input_layernorm", "post_attention_layernorm")]
    message = next(f.message for f in findings if f.module == "layers.0.input_layernorm")
    assert "`.to()` copies nothing for a float32 input" in message and "NP108_1.py:38" in message
