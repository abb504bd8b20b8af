"""Axis provenance (normaudit.facts.axes), the size probe (normaudit.probes.size) and the layout rules NL1xx.

Exact modules, axes and values are asserted. The rules' fixtures (tests/fixtures/layout/<ID>_<n>.py) are run by
test_rule_fixtures.py; the tests here audit some of them again for the facts behind the findings.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normaudit.capture import capture_model
from normaudit.engine.loader import builtin_rules_dir, load_rule_file
from normaudit.facts import axes as axes_pass
from normaudit.probes import size as probes_pass
from normaudit.facts.sites import discover_sites

from conftest import audit_model, flagged, site

FIXTURES = Path(__file__).parent / "fixtures"
MY_FAMILIES = ("layout", "batchnorm")


@pytest.fixture(scope="session")
def my_rules():
    """The layout and batchnorm rules only, so these tests do not depend on other families' files."""
    d = builtin_rules_dir()
    files = sorted(p for fam in MY_FAMILIES for p in (d / fam).glob("*.yaml"))
    return {r.id: r for r in (load_rule_file(p) for p in files)}


def load_fixture(path: Path):
    spec = importlib.util.spec_from_file_location(f"fixture_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------ labels on both graph flavours
def _site_axes(model, inputs, method, declared=None):
    """(module, input axes, normalised axes) per site, from one capture method."""
    cap = capture_model(model, inputs, on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    records = discover_sites(cap)
    env = axes_pass.label_graph(cap, declared)
    out = []
    for rec in records:
        labels = env[rec.input]
        picked = [labels[d] for d in rec.site.reduced_dims]
        out.append((rec.site.module, axes_pass.axes_text(labels), axes_pass.flat_labels(picked)))
    return out


def _convnext_stage():
    spec = load_fixture(FIXTURES / "layout" / "NL102_1.py")
    return spec.build_model(), spec.example_inputs()


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_convnext_block_with_and_without_permute_at_w_equal_c(method):
    """Width 32 == 32 channels: the shapes agree, only provenance tells the two LayerNorm(32) apart."""
    model, inputs = _convnext_stage()
    assert _site_axes(model, inputs, method) == [
        ("good.norm", ["batch", "height", "width", "channel"], ["channel"]),
        ("bad.norm", ["batch", "channel", "height", "width"], ["width"]),
    ]


def test_bad_convnext_block_is_flagged_with_exact_axes(my_rules):
    model, inputs = _convnext_stage()
    r = audit_model(model, inputs, rules=my_rules)
    assert flagged(r) == ["bad.norm"]
    f = next(f for f in r.findings if f.module == "bad.norm")
    assert (f.rule_id, f.severity) == ("NL102", "error")
    assert f.message.startswith(
        "nn.LayerNorm(normalized_shape=[32], eps=1e-06) normalises the width axis of an input laid out as "
        "(batch, channel, height, width), not the channels: it runs only because that size (32) equals the "
        "channel count 32; "
        "size probe: at height 128->136, width 128->136 it raises: RuntimeError: Given normalized_shape=[32], "
        "expected input with shape [32], but got input of size torch.Size([2, 32, 34, 34])")
    good, bad = site(r, "good.norm"), site(r, "bad.norm")
    assert (good.size_probe.tied, good.size_probe.input_shape) == (False, [2, 34, 34, 32])
    assert (bad.size_probe.tied, bad.size_probe.changed_dims, bad.size_probe.input_shape) == (True, [3], [2, 32, 34, 34])


class Mixer(nn.Module):
    """Reshapes of every kind between norms: merged batch*sequence and back, a GPT-2 style fused qkv through
    torch.addmm and split, head split/merge, einsum attention, flatten/unflatten/movedim on an image."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.d, self.h = d, heads
        self.embed = nn.Embedding(50, d)
        self.w_qkv = nn.Parameter(torch.randn(d, 3 * d) * 0.02)
        self.b_qkv = nn.Parameter(torch.zeros(3 * d))
        self.ln_tok = nn.LayerNorm(d)
        self.qk_norm = nn.LayerNorm(d // heads)
        self.score_norm = nn.LayerNorm(8)
        self.ln_merged = nn.LayerNorm(d)
        self.conv = nn.Conv2d(3, d, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.gn = nn.GroupNorm(4, d)
        self.ln_patch = nn.LayerNorm(d)
        self.ln_back = nn.LayerNorm(d)

    def forward(self, ids, img):
        b, s = ids.shape
        x = self.embed(ids)
        qkv = torch.addmm(self.b_qkv, x.view(-1, self.d), self.w_qkv).view(b, s, 3 * self.d)
        q, k, v = qkv.split(self.d, dim=2)
        x = self.ln_tok(q)
        q = self.qk_norm(q.view(b, s, self.h, -1).transpose(1, 2))           # (b, h, s, dh)
        k = k.view(b, s, self.h, -1).transpose(1, 2)
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
        scores = self.score_norm(scores)                                      # over keys: a sequence axis
        v = v.view(b, s, self.h, -1).transpose(1, 2)
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, self.d)
        o = self.ln_merged(o + x)
        y = self.gn(self.pool(self.conv(img)))                                # (b, d, 4, 4)
        t = self.ln_patch(y.flatten(2).transpose(1, 2))                       # (b, 16, d)
        back = t.transpose(1, 2).unflatten(2, (4, 4)).movedim(1, -1)          # (b, 4, 4, d)
        return o.sum() + self.ln_back(back).sum()


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_labels_through_reshapes_heads_einsum_pooling(method):
    model = Mixer()
    inputs = (torch.randint(0, 50, (2, 8)), torch.randn(2, 3, 8, 8))
    assert _site_axes(model, inputs, method) == [
        ("ln_tok", ["batch", "sequence", "feature"], ["feature"]),
        ("qk_norm", ["batch", "head", "sequence", "feature"], ["feature"]),
        ("score_norm", ["batch", "head", "sequence", "sequence"], ["sequence"]),
        ("ln_merged", ["batch", "sequence", "feature"], ["feature"]),
        ("gn", ["batch", "channel", "height", "width"], ["channel", "height", "width"]),
        ("ln_patch", ["batch", "height*width", "feature"], ["feature"]),  # patch tokens: as_tokens
        ("ln_back", ["batch", "height", "width", "feature"], ["feature"]),  # the same token embedding, as a grid
    ]


def test_merged_axes_split_back_exactly():
    """(b*s, d) -> (b, s, d) recovers batch and sequence; (b, c, h*w) -> (b, c, h, w) recovers height/width."""
    d = lambda name, n: (((name,), n),)  # noqa: E731
    merged = axes_pass.views.reshape_dims([d("batch", 2), d("sequence", 8), d("feature", 16)], (16, 16))
    assert [axes_pass.dim_label(x) for x in merged] == [("batch", "sequence"), ("feature",)]
    back = axes_pass.views.reshape_dims(merged, (2, 8, 16))
    assert [axes_pass.dim_label(x) for x in back] == [("batch",), ("sequence",), ("feature",)]
    heads = axes_pass.views.reshape_dims(back, (2, 8, 4, 4))
    assert [axes_pass.dim_label(x) for x in heads] == [("batch",), ("sequence",), ("head",), ("feature",)]
    assert axes_pass.dim_label(axes_pass.views.reshape_dims(heads, (2, 8, 16))[2]) == ("feature",)
    img = axes_pass.views.reshape_dims([d("batch", 2), d("channel", 3), d("height", 4), d("width", 5)], (2, 3, 20))
    assert axes_pass.axes_text([axes_pass.dim_label(x) for x in img]) == ["batch", "channel", "height*width"]
    assert [axes_pass.dim_label(x) for x in axes_pass.views.reshape_dims(img, (2, 3, 4, 5))][2:] == [("height",), ("width",)]


class PackedMerger(nn.Module):
    """Packed patches (tokens, d) merged 4 at a time into the features (Qwen3-VL's patch merger), a view back
    to one patch per row, and 2 halves of the patches folded into rows (a count set by the input)."""

    def __init__(self, d=8, n=16):
        super().__init__()
        self.d = d
        self.ln_merged, self.ln_back, self.ln_halves = nn.LayerNorm(4 * d), nn.LayerNorm(d), nn.LayerNorm(n // 2 * d)

    def forward(self, hidden_states):                       # (tokens, feature), no batch dim
        merged = self.ln_merged(hidden_states.view(-1, 4 * self.d))
        return self.ln_back(merged.view(-1, self.d)), self.ln_halves(hidden_states.reshape(2, -1))


class FrameStacker(nn.Module):
    """Speech frames stacked 4 at a time into the features, ``reshape(b, -1, 4 * f)``, and the frames split
    in 2 halves folded into the features, ``reshape(b, 2, -1)``."""

    def __init__(self, f=6, t=8):
        super().__init__()
        self.f = f
        self.ln_stacked, self.ln_halves = nn.LayerNorm(4 * f), nn.LayerNorm(t // 2 * f)

    def forward(self, inputs_embeds):                       # (batch, sequence, feature)
        b = inputs_embeds.shape[0]
        return (self.ln_stacked(inputs_embeds.reshape(b, -1, 4 * self.f)),
                self.ln_halves(inputs_embeds.reshape(b, 2, -1)))


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_fixed_count_of_tokens_merged_into_features_is_a_feature_axis(method):
    """A size fixed by the model (``4 * d``) next to an inferred one (``-1``) or one traced from the input
    merges a fixed number of tokens into the features: feature, not batch*feature; a fixed count of rows
    (``reshape(2, -1)``) leaves the token axis in the merged dim."""
    assert _site_axes(PackedMerger(), (torch.randn(16, 8),), method) == [
        ("ln_merged", ["batch", "feature"], ["feature"]),
        ("ln_back", ["batch", "feature"], ["feature"]),
        ("ln_halves", ["batch", "batch*feature"], ["batch", "feature"]),
    ]
    assert _site_axes(FrameStacker(), (torch.randn(2, 8, 6),), method) == [
        ("ln_stacked", ["batch", "sequence", "feature"], ["feature"]),
        ("ln_halves", ["batch", "sequence", "sequence*feature"], ["sequence", "feature"]),
    ]


def test_fixed_sizes_of_a_view():
    """Which sizes of a view are fixed by the model: ints beside a ``-1`` or a traced size; none known when
    every size is a plain int."""
    gm = torch.fx.symbolic_trace(PackedMerger())
    views = [n for n in gm.graph.nodes if n.op == "call_method" and n.target in ("view", "reshape")]
    assert [axes_pass.views.fixed_sizes(n, 2) for n in views] == [[False, True], [False, True], [True, False]]
    g = torch.fx.Graph()
    x = g.placeholder("x")
    assert axes_pass.views.fixed_sizes(g.call_method("view", (x, 4, 32)), 2) is None
    assert axes_pass.views.fixed_sizes(g.call_method("flatten", (x, 1)), 2) is None


class AudioNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)
        self.ln = nn.LayerNorm(8)

    def forward(self, wave):                              # (batch, channel, time)
        return self.ln(self.conv(wave).transpose(1, 2))


def test_audio_input_and_declared_input_axes(my_rules):
    r = audit_model(AudioNet(), (torch.randn(2, 4, 32),), rules=my_rules)
    assert (site(r, "ln").input_axes, site(r, "ln").normalized_axes) == (["batch", "sequence", "channel"], ["channel"])
    # a (batch, seq, feature) input read by a LayerNorm alone, declared channels-first: the norm covers the sequence
    ln = nn.LayerNorm(16)
    r = audit_model(nn.Sequential(ln), (torch.randn(2, 16, 16),), rules=my_rules)
    assert site(r, "0").normalized_axes == ["feature"] and flagged(r) == []
    r = audit_model(nn.Sequential(ln), (torch.randn(2, 16, 16),), rules=my_rules, input_axes="B,C,S")
    assert site(r, "0").input_axes == ["batch", "channel", "sequence"]
    assert site(r, "0").normalized_axes == ["sequence"] and flagged(r, "NL101") == ["0"]


def test_sequence_first_torch_layers(my_rules):
    """torch.nn RNNs and Transformers default to batch_first=False: (seq, batch, feature) inputs."""
    r = audit_model(nn.TransformerEncoderLayer(16, 2, 32), (torch.randn(6, 2, 16),), rules=my_rules)
    assert [(s.module, s.input_axes, s.normalized_axes) for s in r.sites] == [
        ("norm1", ["sequence", "batch", "feature"], ["feature"]), ("norm2", ["sequence", "batch", "feature"], ["feature"])]

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.bn = nn.LSTM(8, 16), nn.BatchNorm1d(16)

        def forward(self, x):
            return self.bn(self.rnn(x)[0][-1])               # the last step: (batch, hidden)

    r = audit_model(Tagger(), (torch.randn(5, 3, 8),), rules=my_rules)
    assert (site(r, "bn").input_axes, site(r, "bn").channel_axes) == (["batch", "feature"], ["feature"])


def test_unknown_op_never_crashes_the_pass():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(4)

        def forward(self, x):
            return self.ln(torch.diagonal(x, dim1=1, dim2=2).unsqueeze(-1).expand(-1, -1, 4))

    cap = capture_model(Odd(), (torch.randn(2, 4, 4),), on_meta=False)
    env = axes_pass.label_graph(cap)
    rec = discover_sites(cap)[0]
    assert env[rec.input] == [("batch",), ("unknown",), ("unknown",)]


# ------------------------------------------------------------------------ transformers models
def _hf(name):
    import transformers as T

    px = {"pixel_values": torch.randn(2, 3, 32, 32)}
    if name == "convnext":
        return T.ConvNextModel(T.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                                image_size=32)), px
    if name == "swin":
        return T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2],
                                        window_size=4)), px
    return T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32)), px


@pytest.mark.parametrize("name,count", [("convnext", 5), ("swin", 7), ("vit", 3)])
def test_transformers_vision_models_normalise_only_channels_or_features(name, count, my_rules):
    pytest.importorskip("transformers")
    model, inputs = _hf(name)
    r = audit_model(model, inputs, rules=my_rules)
    assert len(r.sites) == count
    assert {a for s in r.sites for a in s.normalized_axes} <= {"channel", "feature"}, \
        [(s.module, s.normalized_axes) for s in r.sites]
    assert [(f.rule_id, f.module) for f in r.findings if f.severity in ("warning", "error")] == []
    assert not any(s.size_probe and s.size_probe.tied for s in r.sites)


# ------------------------------------------------------------------------ size probe
def test_size_probe_resolution_tied_layernorm(my_rules):
    spec = load_fixture(FIXTURES / "layout" / "NL103_1.py")
    r = audit_model(spec.build_model(), spec.example_inputs(), rules=my_rules)
    p = site(r, "ln_chw").size_probe
    assert (p.resize, p.tied, p.changed_dims, p.input_shape) == ("height 16->24, width 16->24", True, [2, 3],
                                                                 [2, 8, 24, 24])
    assert p.error == ("RuntimeError: Given normalized_shape=[8, 16, 16], expected input with shape [8, 16, 16], "
                       "but got input of size torch.Size([2, 8, 24, 24])")
    for m in ("ln_c", "gn"):  # channel statistics per pixel, or GroupNorm's spatial statistics: not tied
        assert site(r, m).size_probe.tied is False
    assert any(n.startswith("size probe: re-ran the model with height 16->24, width 16->24 (graph re-interpreted")
               for n in r.notes)


def test_size_probe_on_exported_graph_sees_sequence_statistics(my_rules):
    spec = load_fixture(FIXTURES / "layout" / "NL101_2.py")
    r = audit_model(spec.build_model(), spec.example_inputs(), rules=my_rules)
    assert r.capture.method == "export"
    block, norm = site(r, "block").size_probe, site(r, "norm").size_probe
    assert (block.tied, block.changed_dims, block.input_shape) == (True, [1], [2, 24, 16])
    assert (norm.tied, norm.changed_dims, norm.input_shape) == (False, [], [2, 24, 16])


def test_resize_plan_keeps_strides_and_avoids_channel_counts():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 6, 4, stride=4)      # 16 -> 4: the new size must stay a multiple of 4
            self.mid = nn.Conv2d(6, 24, 1)                 # 24 channels: 16 + 8 = 24 is ruled out
            self.ln = nn.LayerNorm(24)

        def forward(self, x):
            return self.ln(self.mid(self.stem(x)).permute(0, 2, 3, 1))

    cap = capture_model(Net(), (torch.randn(2, 3, 16, 16),), on_meta=False)
    axes_pass.label_graph(cap)
    plan = probes_pass.plan_resize(cap, discover_sites(cap))
    assert plan.sizes == {("height", 16): 32, ("width", 16): 32}
    assert plan.text == "height 16->32, width 16->32"


def test_size_probe_default_limit_and_opt_in(monkeypatch, my_rules):
    spec = load_fixture(FIXTURES / "layout" / "NL103_1.py")
    monkeypatch.setattr(probes_pass, "SIZE_PROBE_MAX_NODES", 3)
    r = audit_model(spec.build_model(), spec.example_inputs(), rules=my_rules)
    assert site(r, "ln_chw").size_probe is None
    assert any(n.startswith("size probe skipped: the graph has") for n in r.notes)
    r = audit_model(spec.build_model(), spec.example_inputs(), rules=my_rules, probes=["size"])
    assert site(r, "ln_chw").size_probe.tied is True


def test_docstring_examples_run():
    import doctest

    from normaudit.facts import batchnorm as batchnorm_pass

    for mod in (axes_pass, batchnorm_pass, probes_pass):
        assert doctest.testmod(mod).failed == 0, mod.__name__


def test_layer_norm_over_shape_from_one_under_symbolic_trace(my_rules):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 16)

        def forward(self, ids):
            x = self.embed(ids)
            return F.layer_norm(x, x.shape[1:])

    r = audit_model(Net(), (torch.randint(0, 50, (2, 8)),), rules=my_rules)
    assert r.capture.method == "symbolic_trace"
    assert site(r, "").normalized_axes == ["sequence", "feature"] and flagged(r, "NL101") == [""]


def test_in_place_write_into_a_buffer_keeps_the_source_layout_under_symbolic_trace():
    """``final.index_add_(0, idx, out)`` then ``final.reshape(B, S, D)``: under symbolic tracing the reshape
    reads the zeros buffer's node, which takes the in-place op's labels; the index tensor (as many entries as
    features) never labels the feature dim."""

    class Combine(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = nn.Linear(16, 16), nn.LayerNorm(16)

        def forward(self, x):
            b, s, d = x.shape
            h = x.reshape(-1, d)
            idx = torch.arange(b * s).repeat_interleave(2) + 0 * h[:, :1].long().reshape(-1).repeat_interleave(2)
            out = self.fc(h[idx])
            final = torch.zeros((b * s, d))
            final.index_add_(0, idx, out)
            return self.norm(final.reshape(b, s, d))

    got = _site_axes(Combine(), (torch.randn(2, 4, 16),), "symbolic_trace")
    assert got == [("norm", ["unknown", "unknown", "feature"], ["feature"])]


class _PatchTokens(nn.Module):
    """ViT-style: patch conv, flatten(2).transpose(1, 2), blocks of LayerNorm + Linear on the residual stream."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, stride=8)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2))
        self.fcs = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        for norm, fc in zip(self.norms, self.fcs):
            x = x + fc(norm(x))
        return x


def test_patch_tokens_are_features_in_every_layer(rules):
    """The first block's norm reads the patch embedding, the second the stream after a Linear: both normalise
    the token embedding, one label (was channel then feature)."""
    r = audit_model(_PatchTokens(), (torch.randn(2, 3, 32, 32),), rules=rules)
    assert [(s.module, s.normalized_axes) for s in r.sites] == [("norms.0", ["feature"]), ("norms.1", ["feature"])]


def test_hf_vit_norms_all_normalise_features(rules, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 image_size=32, patch_size=8)
    with torch.device("meta"):
        model = transformers.ViTModel(cfg, add_pooling_layer=False)
    r = audit_model(model, rules=rules, on_meta=True)
    assert {s.module: s.normalized_axes for s in r.sites} == {
        "layers.0.layernorm_before": ["feature"], "layers.0.layernorm_after": ["feature"],
        "layers.1.layernorm_before": ["feature"], "layers.1.layernorm_after": ["feature"],
        "layernorm": ["feature"]}


class SpectrogramSubsampler(nn.Module):
    """Gemma3n's/Parakeet's audio subsampling: ``(batch, frames, mel)`` unsqueezed into one channel, padded,
    read by a Conv2d, its ``(B, C, T, F)`` output permuted to ``(B, T, F, C)`` for a norm over ``(F, C)``, then
    flattened per frame into a Linear."""

    def __init__(self):
        super().__init__()
        self.conv, self.ln = nn.Conv2d(1, 8, 3, stride=2, bias=False), nn.LayerNorm([4, 8])
        self.proj, self.out = nn.Linear(32, 16), nn.LayerNorm(16)

    def forward(self, input_features):
        x = F.pad(input_features.unsqueeze(1), (1, 1, 0, 2)).to(self.conv.weight.dtype)
        y = self.ln(self.conv(x).permute(0, 2, 3, 1).contiguous())
        b, t, f, c = y.shape
        return self.out(self.proj(y.reshape(b, t, f * c)))


class PatchedSpectrogram(nn.Module):
    """AST's patch embedding: ``input_values.unsqueeze(1).transpose(2, 3)`` into a Conv2d."""

    def __init__(self):
        super().__init__()
        self.conv, self.ln = nn.Conv2d(1, 8, 4, stride=4), nn.LayerNorm(8)

    def forward(self, input_values):
        return self.ln(self.conv(input_values.unsqueeze(1).transpose(2, 3)).flatten(2).transpose(1, 2))


class FramesIntoConv1d(nn.Module):
    """Speech2Text's subsampler: ``(batch, frames, mel)`` transposed into a Conv1d over the mel channels."""

    def __init__(self):
        super().__init__()
        self.conv, self.ln = nn.Conv1d(8, 16, 3, stride=2), nn.LayerNorm(16)

    def forward(self, input_features):
        return self.ln(self.conv(input_features.transpose(1, 2)).transpose(1, 2))


class GrayImage(nn.Module):
    """A ``(batch, height, width)`` image unsqueezed into one channel for a Conv2d."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn(self.conv(x.unsqueeze(1)))


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_rank3_input_read_by_a_convolution_after_a_layout_op(method):
    """A rank-3 input's layout is told by the convolution it reaches through ``unsqueeze(1)`` (a one-channel
    map for a Conv2d: time and mel for audio, height and width otherwise) or ``transpose(1, 2)`` (channels
    last for a Conv1d), not by its name alone: Gemma3n's audio norm input was (batch, channel, sequence,
    channel), its conformer's (batch, channel, feature)."""
    def inputs(name, *size):
        x = torch.randn(*size)
        return {name: x} if method == "export" else (x,)  # export names positional inputs args_0
    assert _site_axes(SpectrogramSubsampler(), inputs("input_features", 2, 12, 8), method) == [
        ("ln", ["batch", "sequence", "feature", "channel"], ["feature", "channel"]),
        ("out", ["batch", "sequence", "feature"], ["feature"]),
    ]
    assert _site_axes(PatchedSpectrogram(), inputs("input_values", 2, 16, 8), method) == [
        ("ln", ["batch", "feature*sequence", "channel"], ["channel"])]
    assert _site_axes(FramesIntoConv1d(), inputs("input_features", 2, 12, 8), method) == [
        ("ln", ["batch", "sequence", "channel"], ["channel"])]
    assert _site_axes(GrayImage(), inputs("x", 2, 12, 8), method) == [
        ("bn", ["batch", "channel", "height", "width"], ["batch", "height", "width"])]



class PlainIntMerger(nn.Module):
    """Packed tokens merged 4 at a time into the features with sizes computed from ``x.shape`` (plain ints
    under export, traced under symbolic tracing) or written as literals, read by a LayerNorm, a Linear and a
    hand-written RMSNorm's gain; and 2 halves of the tokens folded into rows, read by no parameter."""

    def __init__(self, d=8):
        super().__init__()
        self.ln, self.proj = nn.LayerNorm(4 * d), nn.Linear(4 * d, 4)
        self.gain = nn.Parameter(torch.ones(4 * d))

    def forward(self, hidden_states):                       # (tokens, feature)
        n, d = hidden_states.shape
        a = self.ln(hidden_states.reshape(n // 4, 4 * d))
        b = self.proj(hidden_states.reshape(4, 32))
        c = hidden_states.reshape(n // 4, 4 * d).float()
        c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-6) * self.gain
        return a, b, c, hidden_states.reshape(2, 64) + 1


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_tokens_merged_into_features_by_plain_int_sizes_are_features(method):
    """``x.reshape(n // 4, 4 * d)``: no ``-1`` tells which size the model fixes; the parameter reading the
    merged dim does (LayerNorm(4d), Linear(4d, .), a gain of 4d): feature, not batch*feature. With no
    parameter (the halves) the merged dim keeps its tokens."""
    assert _site_axes(PlainIntMerger(), (torch.randn(16, 8),), method)[0] == ("ln", ["batch", "feature"], ["feature"])
    cap = capture_model(PlainIntMerger(), (torch.randn(16, 8),), on_meta=False, methods=(method,))
    env = axes_pass.label_graph(cap)
    views = [n for n in cap.gm.graph.nodes if axes_pass.ops.raw_name(n) in ("view", "reshape", "_unsafe_view")]
    assert [axes_pass.axes_text(env[n]) for n in views] == [["batch", "feature"]] * 3 + [["batch", "batch*feature"]]


class FramedWaveform(nn.Module):
    """A (batch, samples) waveform cut into frames of 80 samples and each frame standardised over its own
    samples (MoonshineStreaming's FrameCMVN): ``framed`` stays framed and is read by Linear(80, 16) through
    asinh(k * x); ``windows`` is read by no parameter; ``restored`` is reshaped back to (batch, samples), a
    hand-written GroupNorm of 8 groups along the samples."""

    def __init__(self, frame_len=80):
        super().__init__()
        self.frame_len = frame_len
        self.log_k = nn.Parameter(torch.zeros(()))
        self.proj = nn.Linear(frame_len, 16)

    @staticmethod
    def cmvn(x):
        centered = x - x.mean(-1, keepdim=True)
        return centered / (centered.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()

    def forward(self, input_values):
        b = input_values.shape[0]
        framed = self.cmvn(input_values.reshape(b, -1, self.frame_len))
        windows = self.cmvn(input_values.reshape(b, -1, self.frame_len) * 2)
        restored = self.cmvn((input_values + 1).reshape(b, 8, -1)).reshape(input_values.shape)
        return self.proj(torch.asinh(torch.exp(self.log_k) * framed)), windows, restored


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_waveform_cut_into_frames_read_by_a_linear_is_tokens_of_features(method):
    """Frames read by Linear(frame_len, .) are tokens whose samples are features: (batch, sequence, feature),
    a LayerNorm over each frame's feature, not a GroupNorm of the waveform; frames read by no parameter keep
    their sequence label; a grouped view reshaped back to the waveform stays a GroupNorm (8 groups, dim 1)."""
    cap = capture_model(FramedWaveform(), (torch.randn(2, 640),), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    records = discover_sites(cap)
    env = axes_pass.label_graph(cap, [("batch",), ("sequence",)])  # export names the input args_0
    got = [(r.site.kind, axes_pass.axes_text(env[r.input]), r.site.reduced_dims, r.site.num_groups)
           for r in records]
    assert got == [("LayerNorm", ["batch", "sequence", "feature"], [2], None),
                   ("LayerNorm", ["batch", "sequence", "sequence"], [2], None),
                   ("GroupNorm", ["batch", "sequence"], [1], 8)]
    assert records[2].site.group_split.dim == 1


def test_one_d_patch_embedding_reads_the_signal_as_channels_then_length(my_rules):
    """A (batch, channel, length) signal cut into patches along its length (1-D ViT): inferred and declared
    (``--input-axes B,C,S``) layouts agree, and the patch norm's statistics are over its patch's values."""
    spec = load_fixture(FIXTURES / "layout" / "NL101_9.py")
    for axes in (None, "B,C,S"):
        r = audit_model(spec.build_model(), spec.example_inputs(), rules=my_rules, input_axes=axes)
        got = {s.module: (s.input_axes, s.normalized_axes) for s in r.sites if s.module.endswith("norm_in")}
        assert got == {"split.norm_in": (["batch", "sequence", "channel"], ["channel"]),
                       "swap.norm_in": (["batch", "sequence", "channel"], ["channel"])}, axes
        assert [f.module for f in r.findings if f.rule_id == "NL101"] == []
