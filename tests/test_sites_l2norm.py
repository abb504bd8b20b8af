"""L2 normalisations are sites of kind L2Norm: ``F.normalize`` (PyTorch docs, torch.nn.functional.normalize:
``v / max(||v||_p, eps)`` over ``dim``, p=2, dim=1, eps=1e-12 by default) and the hand-written
``x * rsqrt(sum(x^2) + eps)`` outside a module that is only a norm, with their dim as the normalised axes,
their eps, and the gain the affine chain finds; their eps judged per dtype; no placement role on the stream."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import audit_model, family_rules, load_fixture_module
from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts

METHODS = ["symbolic_trace", "export"]
LAYOUT = Path(__file__).parent / "fixtures" / "layout"


class ConvFeatures(nn.Module):
    """``F.normalize`` with its defaults on NCHW features: over dim 1, the channels."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return F.normalize(self.conv(x))


class GatedDeltaQK(nn.Module):
    """The ``l2norm`` of gated delta-rule linear attention (transformers Qwen3-Next/Kimi-Linear
    ``x * rsqrt(sum(x * x) + eps)``) on q, outside any norm module."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)

    def forward(self, x):
        q = self.q(x)
        return q * torch.rsqrt((q * q).sum(dim=-1, keepdim=True) + 1e-6)


class Normed(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.fc, self.eps = nn.Linear(16, 16), eps

    def forward(self, x):
        return self.fc(F.normalize(self.fc(x), dim=-1, eps=self.eps))


def _records(model, inputs, method):
    cap = capture_model(model, inputs, on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    return collect_facts(FactContext(cap=cap, probe_model=model)).records


@pytest.mark.parametrize("method", METHODS)
def test_f_normalize_defaults_are_an_l2norm_over_dim_1(method):
    records = _records(ConvFeatures(), (torch.randn(2, 3, 9, 9),), method)
    assert [(r.site.module, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.normalized_axes, r.site.input_shape,
             r.site.affine_weight, r.site.formula.gain, r.site.formula.eps_position, r.site.placement)
            for r in records] == [("", "L2Norm", 1e-12, [1], ["channel"], [2, 8, 7, 7], None, "none", "clamp", "none")]
    assert records[0].site.formula.text == "L2Norm: x / max(||x||_2, eps) over [channel]"
    # symbolic tracing keeps the F.normalize call; export decomposes it (linalg_vector_norm, clamp_min, div)
    described = {"symbolic_trace": "F.normalize in `ConvFeatures`", "export": "hand-written L2Norm in `ConvFeatures`"}
    assert records[0].site.describe() == described[method] + " (L2 norm over the 8 channels of dim 1, eps 1e-12)"


@pytest.mark.parametrize("method", METHODS)
def test_sum_of_squares_outside_a_norm_module_is_an_l2norm(method):
    records = _records(GatedDeltaQK(), (torch.randn(2, 5, 16),), method)
    assert [(r.site.module, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.normalized_axes, r.hints["how_eps"])
            for r in records] == [("", "L2Norm", 1e-6, [2], ["feature"], "inside_sqrt")]
    assert records[0].site.formula.text == "L2Norm: x / sqrt(sum(x^2) + eps) over [feature]"


@pytest.mark.parametrize("dtype, eps, in_dtype, flagged", [
    ("float16", 1e-12, 0.0, True),                      # below 2**-24: 0
    ("float16", 1e-6, 1.0132789611816406e-06, False),   # 17 * 2**-24: a subnormal, kept
    ("bfloat16", 1e-12, 1.0018652574217413e-12, False),  # float32's exponent range
    ("float32", 1e-12, 9.999999960041972e-13, False),
])
def test_f_normalize_eps_is_judged_in_the_dtype_it_is_clamped_in(dtype, eps, in_dtype, flagged):
    report = audit_model(Normed(eps), (torch.randn(2, 5, 16),), rules=family_rules("eps"), dtype=dtype)
    (s,) = report.sites
    e = s.eps_facts
    assert (s.module, s.kind, s.eps, e.dtype, e.in_dtype, e.statistic) == ("", "L2Norm", eps, dtype, in_dtype, "l2_norm")
    assert [(f.rule_id, f.module, f.severity) for f in report.findings] == ([("NE104", "", "error")] if flagged else [])


def test_the_float16_nan_is_real():
    """What NE104 says of eps=1e-12 in float16, checked on torch itself."""
    zero = torch.zeros(1, 4, dtype=torch.float16)
    assert torch.isnan(F.normalize(zero, dim=-1)).all()
    assert not torch.isnan(F.normalize(zero, dim=-1, eps=1e-6)).any()
    assert not torch.isnan(F.normalize(zero.to(torch.bfloat16), dim=-1)).any()


def test_l2_norms_on_the_stream_and_in_heads_take_no_placement_role():
    """nGPT's residual-stream l2norm and a CLIP-style head are ``unknown``, q/k ones ``qk``; the residual
    scheme and the blocks come from the LayerNorms alone, and no placement rule fires."""
    fixture = load_fixture_module(LAYOUT / "NL101_8.py")
    report = audit_model(fixture.build_model(), fixture.example_inputs(), rules=family_rules("placement"))
    got = sorted({(s.module, s.kind, s.placement) for s in report.sites if s.kind == "L2Norm"})
    assert got == [("", "L2Norm", "unknown"), ("blocks.0.attn", "L2Norm", "qk"), ("blocks.1.attn", "L2Norm", "qk"),
                   ("ngpt.0", "L2Norm", "unknown"), ("ngpt.1", "L2Norm", "unknown")]
    assert report.model.placement == "pre"
    assert [(b.path, b.norms) for b in report.model.blocks] == [
        ("blocks.0", {"blocks.0.norm1": "pre", "blocks.0.attn": "qk", "blocks.0.attn#2": "qk", "blocks.0.norm2": "pre"}),
        ("blocks.1", {"blocks.1.norm1": "pre", "blocks.1.attn": "qk", "blocks.1.attn#2": "qk", "blocks.1.norm2": "pre"}),
        ("ngpt.0", {}), ("ngpt.1", {})]  # residual blocks (h + alpha * (m - h)) whose only norms are L2 ones
    assert [(f.rule_id, f.module, f.severity) for f in report.findings] == []


def test_an_l2norm_owns_its_modules_parameters_only_through_a_gain():
    """nGPT's ``alpha`` (d,) is an interpolation weight of the block, not a gain of its L2 normalisations; a
    learned ``scale * F.normalize(x)`` owns ``scale``."""
    from normaudit.facts.weights import site_param_names

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.scale = nn.Linear(16, 16), nn.Parameter(torch.ones(16))

        def forward(self, x):
            return self.scale * F.normalize(self.proj(x), dim=-1)

    fixture = load_fixture_module(LAYOUT / "NL101_8.py")
    model = fixture.build_model()
    report = audit_model(model, fixture.example_inputs(), rules={})
    ngpt = [s for s in report.sites if s.module == "ngpt.0"]
    assert [(s.kind, s.affine_weight) for s in ngpt] == [("L2Norm", None), ("L2Norm", None)]
    assert [site_param_names(s, model.ngpt[0]) for s in ngpt] == [[], []]
    scaled = Scaled()
    (s,) = audit_model(scaled, (torch.randn(2, 5, 16),), rules={}).sites
    assert (s.kind, s.affine_weight, site_param_names(s, scaled)) == ("L2Norm", True, ["scale"])


@pytest.mark.parametrize("method", METHODS)
def test_a_parameterless_normalize_module_is_an_l2norm_and_one_with_a_gain_an_rmsnorm(method):
    """A leaf module that only calls ``F.normalize`` has no gain to absorb sqrt(d): a unit vector (L2Norm);
    with a learned gain ``F.normalize(x) * sqrt(d) * g`` it is an RMSNorm (lucidrains' RMSNorm)."""
    class Normalize(nn.Module):
        def forward(self, x):
            return F.normalize(x, dim=-1)

    class GainNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.g = nn.Parameter(torch.ones(16))

        def forward(self, x):
            return F.normalize(x, dim=-1) * 4.0 * self.g

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.unit, self.rms = nn.Linear(16, 16), Normalize(), GainNorm()

        def forward(self, x):
            return self.rms(self.proj(x)) + self.unit(self.proj(x))

    records = _records(Head(), (torch.randn(2, 5, 16),), method)
    assert sorted((r.site.module, r.site.kind, r.site.eps, r.site.normalized_axes) for r in records) == [
        ("rms", "RMSNorm", 1e-12, ["feature"]), ("unit", "L2Norm", 1e-12, ["feature"])]


def test_an_l2_norm_module_of_its_own_is_placed_as_any_norm():
    """transformers Dory's ``DoryL2Norm`` (``x * rsqrt(sum(x^2) + eps)``, no gain, a module of its own) is an
    L2Norm that normalises the stream where a pre-LN model's norms do: ``pre`` in its blocks, ``final`` after."""
    class UnitNorm(nn.Module):
        def __init__(self, eps: float = 1e-6):
            super().__init__()
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + self.eps)

    class Block(nn.Module):
        def __init__(self, d: int = 16):
            super().__init__()
            self.norm, self.mlp = UnitNorm(), nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    class Net(nn.Module):
        def __init__(self, d: int = 16):
            super().__init__()
            self.embed, self.blocks, self.norm = nn.Linear(8, d), nn.ModuleList([Block(d), Block(d)]), UnitNorm()

        def forward(self, x):
            h = self.embed(x)
            for b in self.blocks:
                h = b(h)
            return self.norm(h)

    report = audit_model(Net(), (torch.randn(2, 5, 8),), rules=family_rules("placement"))
    assert [(s.module, s.kind, s.eps, s.inline, s.placement) for s in report.sites] == [
        ("blocks.0.norm", "L2Norm", 1e-6, False, "pre"), ("blocks.1.norm", "L2Norm", 1e-6, False, "pre"),
        ("norm", "L2Norm", 1e-6, False, "final")]
    assert (report.model.placement, report.model.has_final_norm) == ("pre", True)
    assert [(f.rule_id, f.module, f.severity) for f in report.findings] == []
