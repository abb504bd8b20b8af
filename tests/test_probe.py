"""The numeric probe against hand-written norms whose formula we know, and against transformers' own norms."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from normaudit.probes import reference as ref
from normaudit.probes.formula import probe_formula, probe_half_precision
from normaudit.report import Formula

D = 8
SHAPE = (2, 3, D)
FIELDS = ("kind", "mean_subtracted", "variance", "eps_position", "gain", "bias", "inverted_scale", "confirmed")


# ------------------------------------------------------------------ hand-written variants of each kind
class LNPop(nn.Module):
    """Ba et al. 2016 written out, with gamma/beta."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.gamma, self.beta, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.gamma + self.beta


class LNUnbiasedInside(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + self.eps) * self.weight + self.bias


class AnnotatedLN(nn.Module):
    """The Annotated Transformer: unbiased std, eps added to the std."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2, self.b_2, self.eps = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features)), eps

    def forward(self, x):
        mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class LNPopEpsOutside(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.scale, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        c = x - x.mean(-1, keepdim=True)
        return self.scale * c / (c.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)


class ChannelsFirstLN(nn.Module):
    """ConvNeXt's LayerNorm over the channel dim of (B, C, H, W), weight of shape (C,)."""

    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c)), eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        return self.weight[:, None, None] * ((x - u) / torch.sqrt(s + self.eps)) + self.bias[:, None, None]


class LlamaStyleRMS(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(d)), eps

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dt)


class GemmaStyleRMS(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class RMSNoUpcast(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.g, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.g


class RMSEpsOutside(nn.Module):
    def __init__(self, d, eps=1e-4):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps)


class InvertedRMS(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * (x / torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class T5StyleLN(nn.Module):
    """T5LayerNorm as written in the T5 code base: an RMSNorm, fp32 variance."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight, self.variance_epsilon = nn.Parameter(torch.ones(d)), eps

    def forward(self, h):
        variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            h = h.to(self.weight.dtype)
        return self.weight * h


class HardCodedEpsRMS(nn.Module):
    """Ignores the eps it is given (N12): always adds 1e-6."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class FP16TinyEpsLN(nn.Module):
    """N17: computes in the input dtype with eps = 1e-12, which is 0 in float16."""

    def __init__(self, d, eps=1e-12):
        super().__init__()
        self.gamma, self.beta, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return self.gamma * (x - mean) * torch.rsqrt(var + self.eps) + self.beta


class Broken(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        raise RuntimeError("boom")


LN_POP = ("LayerNorm", True, "population", "inside_sqrt")
RMS = ("RMSNorm", False, "mean_square", "inside_sqrt")

CASES = {
    # id: (module factory, dims, input shape, eps, expected FIELDS, expected gain/bias param names)
    "ln_pop_gamma_beta": (lambda: LNPop(D), (-1,), SHAPE, 1e-5,
                          (*LN_POP, "weight", True, False, True), (("gamma",), ("beta",))),
    "nn_layernorm": (lambda: nn.LayerNorm(D), (-1,), SHAPE, 1e-5,
                     (*LN_POP, "weight", True, False, True), (("weight",), ("bias",))),
    "nn_layernorm_bert_eps": (lambda: nn.LayerNorm(D, eps=1e-12), (-1,), SHAPE, 1e-12,
                              (*LN_POP, "weight", True, False, True), (("weight",), ("bias",))),
    "nn_layernorm_no_bias": (lambda: nn.LayerNorm(D, bias=False), (-1,), SHAPE, 1e-5,
                             (*LN_POP, "weight", False, False, True), (("weight",), ())),
    "nn_layernorm_no_affine": (lambda: nn.LayerNorm(D, elementwise_affine=False), (-1,), SHAPE, 1e-5,
                               (*LN_POP, "none", False, False, True), ((), ())),
    "nn_layernorm_2d": (lambda: nn.LayerNorm((4, 5)), (-2, -1), (3, 4, 5), 1e-5,
                        (*LN_POP, "weight", True, False, True), (("weight",), ("bias",))),
    "ln_channels_first": (lambda: ChannelsFirstLN(6), (1,), (2, 6, 3, 3), 1e-6,
                          (*LN_POP, "weight", True, False, True), (("weight",), ("bias",))),
    "ln_unbiased_inside": (lambda: LNUnbiasedInside(4), (-1,), (3, 4), 1e-5,
                           ("LayerNorm", True, "unbiased", "inside_sqrt", "weight", True, False, True),
                           (("weight",), ("bias",))),
    "annotated_transformer_ln": (lambda: AnnotatedLN(4), (-1,), (3, 4), 1e-6,
                                 ("LayerNorm", True, "unbiased", "outside_sqrt", "weight", True, False, True),
                                 (("a_2",), ("b_2",))),
    "ln_pop_eps_outside": (lambda: LNPopEpsOutside(D), (-1,), SHAPE, 1e-5,
                           ("LayerNorm", True, "population", "outside_sqrt", "weight", False, False, True),
                           (("scale",), ())),
    "llama_style_rms": (lambda: LlamaStyleRMS(D), (-1,), SHAPE, 1e-6,
                        (*RMS, "weight", False, False, True), (("weight",), ())),
    "gemma_style_rms": (lambda: GemmaStyleRMS(D), (-1,), SHAPE, 1e-6,
                        (*RMS, "one_plus_weight", False, False, True), (("weight",), ())),
    "rms_no_upcast": (lambda: RMSNoUpcast(D), (-1,), SHAPE, 1e-6,
                      (*RMS, "weight", False, False, True), (("g",), ())),
    "rms_eps_outside": (lambda: RMSEpsOutside(D), (-1,), SHAPE, 1e-4,
                        ("RMSNorm", False, "mean_square", "outside_sqrt", "weight", False, False, True),
                        (("weight",), ())),
    "rms_inverted": (lambda: InvertedRMS(D), (-1,), SHAPE, 1e-6,
                     (*RMS, "weight", False, True, True), (("weight",), ())),
    "t5_style": (lambda: T5StyleLN(D), (-1,), SHAPE, 1e-6,
                 (*RMS, "weight", False, False, True), (("weight",), ())),
    "nn_rmsnorm": (lambda: nn.RMSNorm(D, eps=1e-6), (-1,), SHAPE, 1e-6,
                   (*RMS, "weight", False, False, True), (("weight",), ())),
}


@pytest.mark.parametrize("case", list(CASES))
def test_formula_facts(case):
    factory, dims, shape, eps, expected, (gains, biases) = CASES[case]
    module = factory()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    r = probe_formula(module, dims, shape, eps)
    assert r.error is None
    assert tuple(getattr(r, f) for f in FIELDS) == expected
    assert (r.gain_params, r.bias_params) == (gains, biases)
    assert r.max_error < r.tolerance
    assert r.eps_measured == pytest.approx(eps, rel=1e-3) and r.eps_matches is True
    assert all(torch.equal(v, module.state_dict()[k]) for k, v in before.items())  # probed a copy


HALF = {"nn_layernorm": True, "llama_style_rms": True, "gemma_style_rms": True, "t5_style": True,
        "nn_rmsnorm": True, "rms_no_upcast": False, "ln_pop_gamma_beta": False,
        # x.std() of a half tensor accumulates in float32 and the std (~300) fits in float16: no overflow
        "annotated_transformer_ln": True}


@pytest.mark.parametrize("case", list(HALF))
def test_half_precision_upcast(case):
    factory, dims, shape, *_ = CASES[case]
    h = probe_half_precision(factory(), dims, shape)
    assert (h.error, h.upcast, h.stats_dtype) == (None, HALF[case], "float32" if HALF[case] else "float16")


def test_fp16_tiny_eps_constant_row_nan():
    h = probe_half_precision(FP16TinyEpsLN(D), (-1,), SHAPE)
    assert (h.upcast, h.constant_row_finite) == (False, False)
    h = probe_half_precision(nn.LayerNorm(D, eps=1e-12), (-1,), SHAPE)
    assert (h.upcast, h.constant_row_finite) == (True, True)


def test_hard_coded_eps_is_measured():
    r = probe_formula(HardCodedEpsRMS(D), (-1,), SHAPE, eps=1e-5)
    assert (r.kind, r.confirmed, r.eps_matches) == ("RMSNorm", True, False)
    assert r.eps_measured == pytest.approx(1e-6, rel=1e-3)


def test_nn_rmsnorm_default_eps_is_finfo_eps():
    r = probe_formula(nn.RMSNorm(D), (-1,), SHAPE, eps=None)
    assert (r.confirmed, r.eps_matches) == (True, None)
    assert r.eps_measured == pytest.approx(torch.finfo(torch.float32).eps, rel=1e-3)


def test_broken_module_never_raises():
    r = probe_formula(Broken(D), (-1,), SHAPE, 1e-5)
    assert (r.confirmed, r.error) == (False, "RuntimeError: boom")
    h = probe_half_precision(Broken(D), (-1,), SHAPE)
    assert (h.upcast, h.error) == (None, "RuntimeError: boom")
    r = probe_formula(nn.LayerNorm(D), (5,), SHAPE, 1e-5)
    assert r.confirmed is False and r.error.startswith("ValueError")


# ------------------------------------------------------------------ real code no one here wrote
def _hf(model: str, cls: str):
    mod = pytest.importorskip(f"transformers.models.{model}.modeling_{model}")
    return getattr(mod, cls)


@pytest.mark.parametrize("model,cls,gain", [("llama", "LlamaRMSNorm", "weight"), ("mistral", "MistralRMSNorm", "weight"),
                                            ("gemma", "GemmaRMSNorm", "one_plus_weight"), ("t5", "T5LayerNorm", "weight")])
def test_transformers_rmsnorms(model, cls, gain):
    module = _hf(model, cls)(16, eps=1e-6)
    r = probe_formula(module, (-1,), (2, 5, 16), 1e-6)
    assert tuple(getattr(r, f) for f in FIELDS) == (*RMS, gain, False, False, True)
    assert (r.gain_params, r.eps_matches) == (("weight",), True)
    h = probe_half_precision(module, (-1,), (2, 5, 16))
    assert (h.upcast, h.stats_dtype, h.finite, h.constant_row_finite) == (True, "float32", True, True)


# ------------------------------------------------------------------ reference formulas and text
def test_references_match_torch():
    x = torch.randn(3, 5, 8, dtype=torch.float64) + 0.5
    w, b = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    torch.testing.assert_close(ref.apply_gain(ref.layer_norm(x, (-1,), 1e-5), "weight", w, b),
                               nn.functional.layer_norm(x, (8,), w, b, 1e-5))
    torch.testing.assert_close(ref.rms_norm(x, (-1,), 1e-6), nn.functional.rms_norm(x, (8,), eps=1e-6))
    m, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
    torch.testing.assert_close(ref.layer_norm_eps_outside(x, (-1,), 1e-6, unbiased=True), (x - m) / (std + 1e-6))
    torch.testing.assert_close(ref.layer_norm_unbiased(x, (-1,), 0.0) / ref.layer_norm(x, (-1,), 0.0),
                               torch.full_like(x, math.sqrt(7 / 8)))
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(ref.rms_norm_eps_outside(x, (-1,), 1e-3), x / (rms + 1e-3))
    torch.testing.assert_close(ref.rms_norm_inverted(x, (-1,), 0.0), x * rms)
    torch.testing.assert_close(ref.apply_gain(x, "one_plus_weight", w), x * (1 + w))
    assert {v.name for v in ref.VARIANTS} >= {"layer_norm", "layer_norm_unbiased_eps_outside", "rms_norm",
                                               "rms_norm_eps_outside", "rms_norm_inverted"}


def test_formula_text():
    from normaudit.facts.formula_text import formula_text as ft

    assert ft("LayerNorm", Formula(mean_subtracted=True, variance="population", eps_position="inside_sqrt",
                                   gain="weight", bias=True), ["feature"]) == \
        "LayerNorm: (x - mean) / sqrt(var_pop + eps) * w + b over [feature]"
    assert ft("RMSNorm", Formula(mean_subtracted=False, variance="mean_square", eps_position="inside_sqrt",
                                 gain="one_plus_weight", bias=False), ["feature"]) == \
        "RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w) over [feature]"
    assert ft("LayerNorm", Formula(mean_subtracted=True, variance="unbiased", eps_position="outside_sqrt",
                                   gain="weight", bias=True), ["feature"]) == \
        "LayerNorm: (x - mean) / (sqrt(var_unbiased) + eps) * w + b over [feature]"
    assert ft("RMSNorm", Formula(variance="mean_square", inverted_scale=True, gain="weight", bias=False),
              ["feature"]) == "RMSNorm: x * sqrt(mean(x^2) + eps) * w over [feature]"
    assert ft("BatchNorm", Formula(), ["batch", "height", "width"]) == \
        "BatchNorm: (x - mean) / sqrt(var_pop + eps) * w + b over [batch, height, width]"


def test_to_formula_round_trip():
    r = probe_formula(GemmaStyleRMS(D), (-1,), SHAPE, 1e-6)
    f = r.to_formula(["feature"], half=probe_half_precision(GemmaStyleRMS(D), (-1,), SHAPE))
    assert (f.gain, f.upcast, f.stats_dtype, f.confirmed, f.text) == (
        "one_plus_weight", True, "float32", True, "RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w) over [feature]")


class ExpGainRMS(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6) * self.log_scale.exp()


def test_edge_cases():
    r = probe_formula(nn.Identity(), (-1,), SHAPE, 1e-5)  # not a norm
    assert (r.kind, r.confirmed, r.variance, r.inverted_scale, r.error) == ("Other", False, "unknown", True, None)
    r = probe_formula(ExpGainRMS(D), (-1,), SHAPE, 1e-6)  # exp(w): neither w nor 1 + w
    assert (r.kind, r.gain, r.gain_params, r.confirmed) == ("RMSNorm", "unknown", ("log_scale",), True)
    r = probe_formula(nn.LayerNorm(D, eps=0.0), (-1,), SHAPE, 0.0)  # eps 0: its position is unobservable
    assert (r.kind, r.eps_position, r.eps_measured, r.eps_matches, r.confirmed) == (
        "LayerNorm", "unknown", 0.0, True, True)
    r = probe_formula(nn.InstanceNorm2d(4), (2, 3), (2, 4, 3, 3), 1e-5)  # per-channel LN over H, W
    assert (r.kind, r.variance, r.gain, r.bias, r.confirmed) == ("LayerNorm", "population", "none", False, True)
