"""Recall of site discovery on norms real libraries write by hand, recognised by what they
compute: frozen BatchNorms, EvoNorms, Global Response Normalization, L2-based RMSNorms, sums of squares, a
module returning only the inverse RMS, cosine q/k norms with a learned temperature; and the not-norms
(weight standardisation, contrastive cosine logits) that must stay out. Also the probe's layout for
channels-first norms and SimpleNorm's kind (NT103 must not quote a LayerNorm formula for it).

Fixtures: tests/fixtures/sites_recall/recall_models.py (each class copies its library's computation)."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from conftest import audit_model, family_rules, load_fixture_module
from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts

R = load_fixture_module(Path(__file__).parent / "fixtures" / "sites_recall" / "recall_models.py")
METHODS = ["symbolic_trace", "export"]
IMG, SEQ = (2, 3, 8, 8), (2, 5, 16)


class Conv(nn.Module):
    """conv -> norm on (N, C, H, W)."""

    def __init__(self, norm: nn.Module, channels: int = 8, channels_last: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1)
        self.norm = norm
        self.channels_last = channels_last

    def forward(self, x):
        y = self.conv(x)
        return self.norm(y.permute(0, 2, 3, 1) if self.channels_last else y)


class Seq(nn.Module):
    """linear -> norm on (B, S, D)."""

    def __init__(self, norm: nn.Module, dim: int = 16):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = norm

    def forward(self, x):
        return self.norm(self.fc(x))


def _records(model, shape, method):
    cap = capture_model(copy.deepcopy(model), (torch.randn(*shape),), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    return collect_facts(FactContext(cap=cap, probe_model=copy.deepcopy(model))).records


def _got(records):
    return [(r.site.module, r.site.kind, r.site.eps, r.site.normalized_axes) for r in records]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cls", ["FrozenBatchNorm2d", "FrozenBatchNormAct2d"])
def test_frozen_batchnorm_is_a_batchnorm_site(method, cls):
    """torchvision/timm/detectron2 ``FrozenBatchNorm2d`` and transformers' ``DetrFrozenBatchNorm2d``:
    ``x * (w * rsqrt(running_var + eps)) + shift``, the statistic a per-channel buffer: a BatchNorm in eval
    mode. Symbolic tracing folds the buffer arithmetic into ``x * constant + constant``, so the module is
    retraced alone with ``make_fx`` to read its eps; timm's ``FrozenBatchNormAct2d`` also holds its
    activation as a child."""
    records = _records(Conv(getattr(R, cls)(8, eps=1e-3)), IMG, method)
    assert _got(records) == [("norm", "BatchNorm", 1e-3, ["batch", "height", "width"])]
    s = records[0].site
    assert (s.detected_by, s.num_channels, s.training, s.track_running_stats) == ("pattern", 8, False, True)
    assert (s.affine_weight, s.affine_bias, s.reduced_dims) == (True, True, [0, 2, 3])
    assert s.formula.text == "BatchNorm: (x - mean) / sqrt(var_pop + eps) * w + b over [batch, height, width]"


def test_frozen_batchnorm_eps_zero_is_caught_by_the_eps_rules():
    model = Conv(R.FrozenBatchNorm2d(8, eps=0.0))
    report = audit_model(model, (torch.randn(*IMG),), rules=family_rules("eps"), dtype="float16")
    assert [(f.rule_id, f.module, f.severity) for f in report.findings] == [("NE103", "norm", "error")]
    clean = audit_model(Conv(R.FrozenBatchNorm2d(8, eps=1e-5)), (torch.randn(*IMG),), rules=family_rules("eps"),
                        dtype="float16")
    assert clean.findings == []


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cls, eps, axes, text", [
    ("EvoNorm2dB0", 1e-3, ["height", "width"],
     "Other (EvoNorm-B): x / max(sqrt(running_var + eps), v * x + sqrt(var_pop + eps)) * w + b over [height, width]"),
    ("EvoNorm2dS0", 1e-5, ["channel", "height", "width"],
     "Other (EvoNorm-S): x * sigmoid(v * x) / sqrt(var_pop + eps) * w + b over [channel, height, width]"),
    ("EvoNorm2dS0a", 1e-3, ["channel", "height", "width"],
     "Other (EvoNorm-S): x * sigmoid(v * x) / sqrt(var_pop + eps) * w + b over [channel, height, width]"),
])
def test_evonorms_are_sites(method, cls, eps, axes, text):
    """timm's EvoNorms (Liu et al. 2020) are kind Other: EvoNorm-S0's gated numerator
    ``x * sigmoid(v * x) / group_std(x)``, EvoNorm-B0's ``max`` of two denominators."""
    records = _records(Conv(getattr(R, cls)(8)), IMG, method)
    assert _got(records) == [("norm", "Other", eps, axes)]
    assert records[0].site.formula.text == text


@pytest.mark.parametrize("method", METHODS)
def test_evonorm_s0_statistics_are_per_group(method):
    records = _records(Conv(R.EvoNorm2dS0(8, groups=4)), IMG, method)
    # group_std reshapes (N, C, H, W) to (N, G, C / G, H, W) and reduces the last three dims
    assert (records[0].site.input_shape, records[0].site.reduced_dims) == ([2, 4, 2, 8, 8], [2, 3, 4])


@pytest.mark.parametrize("method", METHODS)
def test_global_response_norm_is_a_site(method):
    """Global Response Normalization (ConvNeXt-V2, timm ``GlobalResponseNorm``): ``||x||_2`` over H, W divided
    by its channel mean + eps, kind Other."""
    records = _records(Conv(R.GlobalResponseNorm(8), channels_last=True), IMG, method)
    assert _got(records) == [("norm", "Other", 1e-6, ["height", "width", "channel"])]
    assert records[0].site.reduced_dims == [1, 2, 3]
    assert records[0].site.formula.text == (
        "Other (GRN): x * (1 + w * nx) + b, nx = ||x||_2 / (mean(||x||_2) + eps) over [height, width, channel]")


@pytest.mark.parametrize("method", METHODS)
def test_l2_norm_modules_are_rmsnorms_and_inline_ones_l2norms_with_their_gain(method):
    """``F.normalize(x) * g * sqrt(C)`` in a module that is only a norm (lucidrains' RMSNorm of UNets) is an
    RMSNorm: the L2 norm is the RMS up to sqrt(d), which the gain absorbs. A learned ``scale * F.normalize(x)``
    inside a larger module is an L2Norm whose gain is that multiply."""
    records = _records(Conv(R.L2RMSNorm2d(8)), IMG, method)
    assert _got(records) == [("norm", "RMSNorm", 1e-12, ["channel"])]
    # F.normalize * g * sqrt(C) is x / sqrt(mean(x^2)): the probe confirms it on the (1, C, 1, 1) gain
    assert records[0].site.formula.confirmed is True
    records = _records(Seq(R.ScaledFeatures(16)), SEQ, method)
    assert _got(records) == [("norm", "L2Norm", 1e-12, ["feature"])]
    assert (records[0].site.affine_weight, records[0].site.formula.gain) == (True, "weight")


@pytest.mark.parametrize("method", METHODS)
def test_sum_of_squares_is_an_l2_rmsnorm(method):
    """nGPT's ``x * rsqrt(sum(x^2) + eps)``: a sum of squares, the L2 norm, is an RMSNorm up to sqrt(d)."""
    records = _records(Seq(R.NGPTNorm(16)), SEQ, method)
    assert _got(records) == [("norm", "RMSNorm", 1e-6, ["feature"])]
    assert records[0].hints["statistic"] == "l2_norm"
    assert records[0].site.formula.text == "RMSNorm: x / sqrt(sum(x^2) + eps) * w over [feature]"


@pytest.mark.parametrize("method", METHODS)
def test_module_returning_only_the_inverse_rms_is_probed(method):
    records = _records(Seq(R.BlockWithInverseRMS(16)), SEQ, method)
    assert _got(records) == [("norm.norm", "RMSNorm", 1e-6, ["feature"])]
    f = records[0].site.formula
    assert (f.confirmed, f.variance, f.eps_position, f.eps_matches) == (True, "mean_square", "inside_sqrt", True)


@pytest.mark.parametrize("method", METHODS)
def test_cosine_qk_norms_with_a_learned_temperature_are_sites(method):
    """Swin-V2's cosine attention: L2-normalised q and k whose scores a learned temperature scales before the
    softmax are two L2Norm sites."""
    records = _records(Seq(R.CosineAttention(16)), SEQ, method)
    assert [(r.site.module, r.site.call_index, r.site.kind, r.site.eps, r.site.reduced_dims) for r in records] == [
        ("norm", 0, "L2Norm", 1e-12, [3]), ("norm", 1, "L2Norm", 1e-12, [3])]


@pytest.mark.parametrize("method", METHODS)
def test_contrastive_cosine_logits_are_not_sites(method):
    """CLIP's contrastive logits ``text_n @ image_n^T * logit_scale.exp()``: a learned temperature, but no
    softmax in the forward (it lives in the loss): a cosine similarity, no norm layer."""
    model = R.ContrastiveHead(16)
    cap = capture_model(copy.deepcopy(model), (torch.randn(4, 16), torch.randn(3, 16)), on_meta=False,
                        methods=(method,))
    assert cap.method == method
    assert collect_facts(FactContext(cap=cap)).records == []


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cls", ["StdConv2d", "WSConv2d"])
def test_weight_standardisation_is_not_a_site(method, cls):
    """Weight standardisation (Qiao et al. 2019; timm's ``StdConv2d`` of Big Transfer, ``F.batch_norm`` over
    the conv's weight) normalises a parameter, no activation: no site."""
    conv = R.StdConv2d(8, 8, 3) if cls == "StdConv2d" else R.WSConv2d(8, 8, 3, padding=1)
    assert _records(Conv(conv), IMG, method) == []


@pytest.mark.parametrize("method", METHODS)
def test_weight_standardised_conv_beside_a_real_norm(method):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = R.StdConv2d(3, 8, 3)
            self.gn = nn.GroupNorm(2, 8)

        def forward(self, x):
            return self.gn(self.conv(x))

    assert _got(_records(Net(), IMG, method)) == [("gn", "GroupNorm", 1e-5, ["channel", "height", "width"])]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("cls, eps", [("LayerNorm2d", 1e-5), ("ChannelsFirstLayerNorm", 1e-6)])
def test_channels_first_layer_norms_are_confirmed_by_the_probe(method, cls, eps):
    norm = R.LayerNorm2d(8, eps=eps) if cls == "LayerNorm2d" else R.ChannelsFirstLayerNorm(8, eps=eps)
    records = _records(Conv(norm), IMG, method)
    assert _got(records) == [("norm", "LayerNorm", eps, ["channel"])]
    f = records[0].site.formula
    assert (f.confirmed, f.variance, f.eps_matches, f.notes) == (True, "population", True, [])


def test_probe_layout_undoes_the_permute_of_a_channels_first_norm():
    from normaudit.probes.formula_confirm import module_input_layout

    cap = capture_model(Conv(R.LayerNorm2d(8)), (torch.randn(*IMG),), on_meta=False, methods=("export",))
    rec = collect_facts(FactContext(cap=cap)).records[0]
    assert (rec.site.input_shape, rec.site.reduced_dims) == ([2, 8, 8, 8], [3])  # (N, H, W, C) after the permute
    assert module_input_layout(rec, cap.modules) == ((2, 8, 8, 8), (1,))  # the module's (N, C, H, W), dim C


@pytest.mark.parametrize("method", METHODS)
def test_simple_norm_is_classified_by_what_it_computes(method):
    """timm's SimpleNorm, ``x * rsqrt(var(x) + eps) * w``: no mean subtracted, so an RMSNorm whatever it is
    called, with the unbiased variance as its statistic."""
    records = _records(Seq(R.SimpleNorm(16)), SEQ, method)
    assert _got(records) == [("norm", "RMSNorm", 1e-5, ["feature"])]
    f = records[0].site.formula
    assert (f.mean_subtracted, f.variance) == (False, "unbiased")
    assert f.text == "RMSNorm: x / sqrt(var_unbiased + eps) * w over [feature]"


def test_nt103_is_silent_on_simple_norm_and_fires_on_the_annotated_transformer_layer_norm():
    rules = family_rules("norm-type")
    report = audit_model(Seq(R.SimpleNorm(16)), (torch.randn(*SEQ),), rules=rules)
    assert [f.rule_id for f in report.findings] == []

    class AnnotatedLayerNorm(nn.Module):
        def __init__(self, features, eps=1e-6):
            super().__init__()
            self.a_2, self.b_2, self.eps = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features)), eps

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            std = x.std(-1, keepdim=True)
            return self.a_2 * (x - mean) / (std + self.eps) + self.b_2

    report = audit_model(Seq(AnnotatedLayerNorm(16)), (torch.randn(*SEQ),), rules=rules)
    assert ("NT103", "norm") in [(f.rule_id, f.module) for f in report.findings]


# ------------------------------------------------------------------ transformers models (tiny configs, meta)
def _hf(config_name: str, model_name: str, **kw):
    transformers = pytest.importorskip("transformers")
    cfg = getattr(transformers, config_name)(**kw)
    with torch.device("meta"):
        return getattr(transformers, model_name)(cfg)


def _modules_of_class(model: nn.Module, suffix: str) -> list[str]:
    return [n for n, m in model.named_modules() if type(m).__name__.endswith(suffix)]


def test_convnextv2_global_response_norms_are_sites(rules):
    model = _hf("ConvNextV2Config", "ConvNextV2Model", hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                image_size=32)
    report = audit_model(model, rules=rules, on_meta=True)
    grn = [s for s in report.sites if s.class_name == "ConvNextV2GRN"]
    assert [s.module for s in grn] == _modules_of_class(model, "GRN") == [
        "encoder.stages.0.layers.0.grn", "encoder.stages.1.layers.0.grn"]
    assert {(s.kind, s.eps, s.detected_by) for s in grn} == {("Other", 1e-6, "pattern")}
    # the channels-first LayerNorms (permute + F.layer_norm) are confirmed by the probe in their own layout
    ln = [s for s in report.sites if s.class_name == "ConvNextV2LayerNorm"]
    assert len(ln) == 4 and all(s.formula.confirmed for s in ln)
    assert [f for f in report.findings if f.severity != "info"] == []


def test_detr_frozen_batchnorms_are_batchnorm_sites(rules):
    model = _hf("DetrConfig", "DetrModel", use_timm_backbone=False, use_pretrained_backbone=False,
                backbone_config=dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 16, 16, 16],
                                     depths=[1, 1, 1, 1], layer_type="basic", out_features=["stage4"]),
                d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, num_queries=4)
    report = audit_model(model, rules=rules, on_meta=True)
    frozen = [s for s in report.sites if s.class_name == "DetrFrozenBatchNorm2d"]
    assert [s.module for s in frozen] == _modules_of_class(model, "FrozenBatchNorm2d")
    assert len(frozen) == 12 and frozen[0].module == "backbone.model.embedder.embedder.normalization"
    assert {(s.kind, s.eps, tuple(s.normalized_axes), s.training) for s in frozen} == {
        ("BatchNorm", 1e-5, ("batch", "height", "width"), False)}


def test_bit_weight_standardisation_is_not_a_site(rules):
    model = _hf("BitConfig", "BitModel", embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_groups=2)
    report = audit_model(model, rules=rules, on_meta=True)
    ws = set(_modules_of_class(model, "WeightStandardizedConv2d"))
    assert ws and not ws & {s.module for s in report.sites}
    assert [s.module for s in report.sites] == _modules_of_class(model, "GroupNormActivation")
    assert {s.kind for s in report.sites} == {"GroupNorm"}


def test_swinv2_cosine_attention_norms_are_qk_sites_and_clip_logits_are_not(rules):
    model = _hf("Swinv2Config", "Swinv2Model", image_size=32, patch_size=4, embed_dim=8, depths=[1, 1],
                num_heads=[2, 2], window_size=4)
    report = audit_model(model, rules=rules, on_meta=True)
    qk = [(s.module, s.call_index, s.kind, s.eps) for s in report.sites if s.class_name == "Swinv2SelfAttention"]
    assert qk == [(f"encoder.layers.{i}.blocks.0.attention.self", k, "L2Norm", 1e-12) for i in (0, 1) for k in (0, 1)]
    clip = _hf("CLIPConfig", "CLIPModel", projection_dim=8,
               text_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                vocab_size=100, bos_token_id=0, eos_token_id=1, pad_token_id=1),
               vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=32, patch_size=8))
    report = audit_model(clip, rules=rules, on_meta=True)
    assert [s.module for s in report.sites if s.class_name == "CLIPModel"] == []


# ------------------------------------------------------------------ L2 norms written as an inverse (ZAYA)
class InverseL2QKNorm(nn.Module):
    """ZAYA's qk-norm (transformers modeling_zaya.py ZayaQKNorm): ``q * (sqrt(d) / ||q||_2.clamp_min(eps))``,
    the inverse of the 2-norm times sqrt(d): an RMSNorm without a gain on q, with a per-head temperature on k."""

    def __init__(self, head_dim: int, heads: int, eps: float = 1e-6):
        super().__init__()
        self.head_dim_scale, self.eps = head_dim ** 0.5, eps
        self.temp = nn.Parameter(torch.ones(heads))

    def forward(self, q, k):
        q = q * (self.head_dim_scale / q.norm(p=2, dim=-1, keepdim=True).clamp_min(self.eps))
        k = k * (self.head_dim_scale / k.norm(p=2, dim=-1, keepdim=True).clamp_min(self.eps))
        return q, k * self.temp[None, None, :, None]


class InverseL2Attention(nn.Module):
    """q, k of shape (B, S, heads, head_dim) normalised by :class:`InverseL2QKNorm`, then attention scores."""

    def __init__(self, dim: int = 32, heads: int = 2):
        super().__init__()
        self.q, self.k, self.heads = nn.Linear(dim, dim), nn.Linear(dim, dim), heads
        self.qk_norm = InverseL2QKNorm(dim // heads, heads)

    def forward(self, x):
        b, s, _ = x.shape
        q, k = self.qk_norm(self.q(x).view(b, s, self.heads, -1), self.k(x).view(b, s, self.heads, -1))
        return torch.softmax(q.transpose(1, 2) @ k.permute(0, 2, 3, 1), -1)


@pytest.mark.parametrize("method", METHODS)
def test_inverse_of_an_l2_norm_times_sqrt_d_is_an_rmsnorm(method):
    records = _records(InverseL2Attention(), (2, 5, 32), method)
    got = [(r.site.module, r.site.call_index, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.input_shape)
           for r in records]
    assert got == [("qk_norm", 0, "RMSNorm", 1e-6, [3], [2, 5, 2, 16]), ("qk_norm", 1, "RMSNorm", 1e-6, [3], [2, 5, 2, 16])]
    assert [(r.hints["statistic"], r.hints["how_eps"], r.hints["l2_post"]) for r in records] == [
        ("l2_norm", "clamp", 0.25)] * 2
    # the text says what is computed: the 2-norm, not a mean of squares, and the sqrt(d) = 4 factor
    assert records[0].site.formula.text.startswith("RMSNorm: x * sqrt(d) / max(||x||_2, eps)")


@pytest.mark.parametrize("method", METHODS)
def test_inverse_l2_outside_a_norm_module_is_an_l2norm_and_without_eps_no_site(method):
    class Retriever(nn.Module):  # x * (1 / max(||x||, eps)): a unit vector for a cosine similarity
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            q, k = self.q(x), self.k(x)
            q = q * (1.0 / q.norm(dim=-1, keepdim=True).clamp_min(1e-6))
            return q @ k.transpose(-2, -1)

    class Bare(Retriever):  # x * (1 / ||x||), no eps, no learned scale: a bare cosine similarity, no site
        def forward(self, x):
            q, k = self.q(x), self.k(x)
            return (q * (1.0 / q.norm(dim=-1, keepdim=True))) @ k.transpose(-2, -1)

    assert _got(_records(Retriever(), SEQ, method)) == [("", "L2Norm", 1e-6, ["feature"])]
    assert _records(Bare(), SEQ, method) == []


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("norm, text", [
    ("normalize", "RMSNorm: x / max(||x||_2, eps) * w over [feature]"),
    ("rms_clamp", "RMSNorm: x / max(sqrt(mean(x^2)), eps) * w over [feature]"),
    ("l2_plus_eps", "RMSNorm: x / (||x||_2 + eps) * w over [feature]"),
])
def test_l2_formula_text_says_what_is_computed(method, norm, text):
    class L2Norm(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.g = nn.Parameter(torch.ones(d))

        def forward(self, x):
            if norm == "normalize":
                return F.normalize(x, dim=-1) * self.g
            if norm == "rms_clamp":  # ||x|| * d ** -0.5 is the RMS
                return x / (x.norm(dim=-1, keepdim=True) * 16 ** -0.5).clamp(min=1e-8) * self.g
            return x / (x.norm(dim=-1, keepdim=True) + 1e-6) * self.g

    records = _records(Seq(L2Norm()), SEQ, method)
    assert [(r.site.module, r.site.kind, r.site.reduced_dims) for r in records] == [("norm", "RMSNorm", [2])]
    assert records[0].site.formula.text == text
