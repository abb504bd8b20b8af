"""Recall of site discovery on norms a forward calls that the graph had no site for, one test per
mechanism:

- data the forward makes itself: a decoder whose start tokens the model builds (``torch.full``, Dia) or a
  diffusion decoder drawing its canvas (``torch.randint``, DiffusionGemma) depends on no model input in an
  exported graph (static shapes), yet its norms normalise data, not weights (weight standardisation stays out);
- a data-dependent row count: the norms of ``h[mask]`` (Higgs-Audio-V2's audio/text tokens) have an unbacked
  size; a reduction needs only the rank;
- a cumulative norm: statistics of steps ``0..t`` by cumulative sums (Gemma3n audio's cumulative GroupNorm),
  recognised by what it computes.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts

METHODS = ["symbolic_trace", "export"]


def _records(model, inputs, method):
    cap = capture_model(copy.deepcopy(model), inputs, on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    return collect_facts(FactContext(cap=cap, probe_model=copy.deepcopy(model))).records


class HandRMS(nn.Module):
    """A hand-written RMSNorm (the transformers form)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(v + self.eps))


class SelfStartedDecoder(nn.Module):
    """An encoder on the input ids and a decoder on tokens the forward makes itself: a start token
    (``torch.full``, Dia's ``decoder_input_ids`` default) and a random canvas (``torch.randint``)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Embedding(32, 16)
        self.dec = nn.Embedding(32, 16)
        self.enc_norm = HandRMS(16, 1e-5)
        self.pre_sa_norm = HandRMS(16, 1e-6)
        self.pre_ca_norm = nn.LayerNorm(16, eps=1e-4)
        self.canvas_norm = HandRMS(16, 1e-3)

    def forward(self, ids):
        e = self.enc_norm(self.enc(ids))
        h = self.dec(torch.full((ids.shape[0], 1), 1, dtype=torch.long))
        h = h + self.pre_sa_norm(h)
        c = self.pre_ca_norm(h) + e.mean(1, keepdim=True)
        canvas = self.dec(torch.randint(0, 32, (ids.shape[0], 4)))
        return c, self.canvas_norm(torch.zeros_like(canvas))


@pytest.mark.parametrize("method", METHODS)
def test_norms_of_data_the_forward_makes_itself_are_sites(method):
    got = [(r.site.module, r.site.kind, r.site.eps, r.site.normalized_shape, r.site.input_shape)
           for r in _records(SelfStartedDecoder(), (torch.randint(0, 32, (2, 7)),), method)]
    assert got == [("enc_norm", "RMSNorm", 1e-5, [16], [2, 7, 16]),
                   ("pre_sa_norm", "RMSNorm", 1e-6, [16], [2, 1, 16]),
                   ("pre_ca_norm", "LayerNorm", 1e-4, [16], [2, 1, 16]),
                   ("canvas_norm", "RMSNorm", 1e-3, [16], [2, 4, 16])]


class StdConvDecoder(nn.Module):
    """Weight standardisation (``F.batch_norm`` over a conv's weight, timm ``StdConv2d``) in a model whose
    forward also makes tensors of its own (a ``torch.ones`` mask): still no site."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 3, 3, 3))
        self.norm = nn.GroupNorm(2, 8, eps=1e-5)

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, 8, -1), None, None, training=True, momentum=0.0, eps=1e-6)
        y = F.conv2d(x, w.reshape_as(self.weight), padding=1)
        return self.norm(y * torch.ones(1, 8, 1, 1))


@pytest.mark.parametrize("method", METHODS)
def test_weight_standardisation_stays_out_beside_created_tensors(method):
    got = [(r.site.module, r.site.kind, r.site.eps) for r in _records(StdConvDecoder(), (torch.randn(2, 3, 8, 8),),
                                                                       method)]
    assert got == [("norm", "GroupNorm", 1e-5)]


class MaskedTokens(nn.Module):
    """Norms of the rows a mask selects (``h[mask]``: a data-dependent row count), scattered back, then a
    norm of the whole sequence (Higgs-Audio-V2's audio and text branches)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.audio_norm = HandRMS(16, 1e-5)
        self.norm = HandRMS(16, 1e-6)

    def forward(self, ids):
        h = self.emb(ids)
        mask = ids > 3
        h = h.masked_scatter(mask.unsqueeze(-1), self.audio_norm(h[mask]))
        return self.norm(h)


def test_norm_of_rows_selected_by_a_mask_is_a_site():
    recs = _records(MaskedTokens(), (torch.randint(0, 32, (2, 7)),), "export")
    got = [(r.site.module, r.site.kind, r.site.eps, r.site.normalized_shape, r.site.reduced_dims,
            r.site.input_shape, r.site.input_dtype) for r in recs]
    # the selected rows have an unbacked count: rank, feature size and dtype are known, the shape is not
    assert got == [("audio_norm", "RMSNorm", 1e-5, [16], [1], None, "float32"),
                   ("norm", "RMSNorm", 1e-6, [16], [2], [2, 7, 16], "float32")]


def test_sizes_and_rank_of_a_data_dependent_shape():
    from normaudit.vocabulary.graph import rank, reduction, shape, sizes

    cap = capture_model(MaskedTokens(), (torch.randint(0, 32, (2, 7)),), on_meta=False, methods=("export",))
    means = [n for n in cap.gm.graph.nodes if n.op == "call_function" and "mean" in str(n.target)]
    src = means[0].args[0]
    assert shape(src) is None and sizes(src) == (None, 16) and rank(src) == 2
    assert reduction(means[0]).dims == (1,)
    assert sizes(means[1].args[0]) == (2, 7, 16) and reduction(means[1]).dims == (2,)


class CumulativeGroupNorm(nn.Module):
    """A copy of transformers' ``Gemma3nAudioCumulativeGroupNorm`` (modeling_gemma3n.py): mean and variance
    of steps ``0..t`` over the feature dims of ``(B, T, F, C)``, by cumulative sums."""

    def __init__(self, channels: int, feature_dims: tuple, eps: float = 1e-3):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.eps = eps
        self.axes = tuple(range(2, 2 + len(feature_dims) + 1))

    def forward(self, h):
        x = h.to(torch.float32)
        mask = torch.ones_like(x)
        count = torch.clamp(torch.cumsum(torch.sum(mask, dim=self.axes, keepdim=True), dim=1), min=1.0)
        mean = torch.cumsum(torch.sum(x, dim=self.axes, keepdim=True), dim=1) / count
        var = torch.cumsum(torch.sum((x - mean).pow(2), dim=self.axes, keepdim=True), dim=1) / count
        y = (x - mean) * torch.rsqrt(var + self.eps)
        return (y * self.weight).to(h.dtype)


class ConvCumulative(nn.Module):
    """conv -> (B, T, F, C) -> cumulative GroupNorm; and a running-mean subtraction with no scale (no norm)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.norm = CumulativeGroupNorm(8, (6,))

    def forward(self, x):
        y = self.conv(x).permute(0, 2, 3, 1)
        run = torch.cumsum(y.sum(dim=(2, 3), keepdim=True), dim=1) / 48.0
        return self.norm(y), y - run


@pytest.mark.parametrize("method", METHODS)
def test_cumulative_group_norm_is_a_site(method):
    recs = _records(ConvCumulative(), (torch.randn(2, 1, 5, 6),), method)
    assert [(r.site.module, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.normalized_shape,
             r.site.input_shape, r.site.cumulative_dim) for r in recs] == [
        ("norm", "Other", 1e-3, [2, 3], [6, 8], [2, 5, 6, 8], 1)]
    f = recs[0].site.formula
    assert (f.mean_subtracted, f.variance, f.eps_position, f.gain) == (True, "population", "inside_sqrt", "weight")
    assert f.text.startswith("Other (cumulative): (x - mean_0..t) / sqrt(var_pop_0..t + eps) * w over [")
    assert f.text.endswith("] of steps 0..t along dim 1")


class CumulativeMeanSquare(nn.Module):
    """The uncentred form: ``x * rsqrt(cumulative mean of x^2 + eps)``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        ms = torch.cumsum(y.pow(2).sum(-1, keepdim=True), dim=1) / (16.0 * torch.arange(1, 6).view(1, 5, 1))
        return y * torch.rsqrt(ms + 1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_cumulative_mean_square_is_an_uncentred_site(method):
    recs = _records(CumulativeMeanSquare(), (torch.randn(2, 5, 16),), method)
    assert [(r.site.module, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.cumulative_dim,
             r.site.formula.mean_subtracted) for r in recs] == [("", "Other", 1e-5, [2], 1, False)]
    assert recs[0].site.formula.text.startswith("Other (cumulative): x / sqrt(mean_0..t(x^2) + eps) over [")


def test_gemma3n_audio_cumulative_group_norm():
    transformers = pytest.importorskip("transformers")
    gemma3n = pytest.importorskip("transformers.models.gemma3n.modeling_gemma3n")

    class Sub(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.norm = gemma3n.Gemma3nAudioCumulativeGroupNorm(num_channels=8, feature_dims=(6,), eps=1e-3)

        def forward(self, x):
            return self.norm(self.conv(x).permute(0, 2, 3, 1))

    assert transformers is not None
    recs = _records(Sub(), (torch.randn(2, 1, 5, 6),), "export")
    assert [(r.site.module, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.cumulative_dim)
            for r in recs] == [("norm", "Other", 1e-3, [2, 3], 1)]



def test_dia_decoder_on_its_own_start_tokens():
    """transformers' Dia (tiny config): without ``decoder_input_ids`` the model starts its decoder on BOS tokens
    it makes itself (``torch.full``); in the export graph the first decoder layer's norms depend on no input."""
    transformers = pytest.importorskip("transformers")
    from normaudit.loaders.inputs import infer_inputs

    enc = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=2, head_dim=16, vocab_size=64, norm_eps=1e-5)
    dec = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, cross_hidden_size=32, cross_num_attention_heads=2,
               cross_num_key_value_heads=2, cross_head_dim=16, num_channels=3, vocab_size=67, norm_eps=1e-6,
               bos_token_id=65, eos_token_id=64, pad_token_id=66)
    cfg = transformers.DiaConfig(encoder_config=enc, decoder_config=dec, delay_pattern=[0, 1, 2])
    with torch.device("meta"):
        model = transformers.DiaModel(cfg)
    inputs, _ = infer_inputs(model)
    assert set(inputs) == {"input_ids"}  # no decoder_input_ids: the model makes its own
    cap = capture_model(model, inputs, on_meta=True, methods=("export",))
    assert cap.method == "export", cap.attempts
    recs = collect_facts(FactContext(cap=cap)).records
    assert [(r.site.module, r.site.kind, r.site.eps) for r in recs if r.site.module.startswith("decoder.")] == [
        ("decoder.layers.0.pre_sa_norm", "RMSNorm", 1e-6), ("decoder.layers.0.pre_ca_norm", "RMSNorm", 1e-6),
        ("decoder.layers.0.pre_mlp_norm", "RMSNorm", 1e-6), ("decoder.norm", "RMSNorm", 1e-6)]
