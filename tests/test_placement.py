"""Placement analysis (normaudit.facts.placement) and the placement rules (rules/placement/NP1xx).

- the rules' fixtures (tests/fixtures/placement/<ID>_<n>.py, with the placements and model facts the analysis
  must derive) are run by test_rule_fixtures.py;
- both capture methods (fx symbolic tracing and torch.export) give the same placements wherever both work;
- real code no one here wrote: torch.nn.TransformerEncoderLayer (norm_first False/True), nn.Transformer,
  and Hugging Face BertModel, GPT2Model, LlamaModel, T5Model, ViTModel (tiny configs on the meta device).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import audit_model, family_rules, load_fixture_module, site
from normaudit.capture import capture_model
from normaudit.vocabulary.graph import op_name
from normaudit.engine.evaluator import evaluate
from normaudit.facts.placement import analyse, find_stream_end
from normaudit.facts.sites import discover_sites
from normaudit.report import ModelFacts
from normaudit.loaders.config import model_config
from normaudit.loaders.inputs import infer_inputs

FIXTURES = Path(__file__).parent / "fixtures" / "placement"
RANK = {"info": 0, "warning": 1, "error": 2}


@pytest.fixture(scope="module")
def placement_rules():
    """Only the placement rules: these tests must not depend on other families' rules."""
    return family_rules("placement")


_load = load_fixture_module


def _findings(report, rule_id):
    return {f.module: f for f in report.findings if f.rule_id == rule_id}


# -- both capture methods --------------------------------------------------------------------------------
def _placements(model, inputs, method):
    cap = capture_model(model, inputs, on_meta=False, methods=(method,))
    if cap.gm is None:
        return None
    records = discover_sites(cap)
    facts = ModelFacts(class_name=type(model).__name__)
    analyse(cap, records, facts)
    keys = ("skip_from_norm", "reads_norm", "feeds_norm", "majority_placement", "branch_position")
    roles = [(r.site.module, r.site.call_index, r.site.placement, r.site.block,
              sorted((k, str(v)) for k, v in r.site.stream.model_dump(exclude_defaults=True).items() if k in keys))
             for r in records]
    return roles, facts.model_dump(exclude={"class_name", "num_parameters"})


def _light_audit(model, inputs=None, rules=None, on_meta=False):
    """capture -> sites -> placement (and the stream end it implies) -> placement rules, without the other fact passes (their probes re-run
    models; the fixtures above and shared/cases cover the full pipeline). Returns a Report-like namespace."""
    from types import SimpleNamespace

    if inputs is None:
        inputs, _ = infer_inputs(model)
    config = model_config(model) or {}
    cap = capture_model(model, inputs, on_meta=on_meta)
    assert cap.gm is not None, cap.attempts
    records = discover_sites(cap)
    facts = ModelFacts(class_name=type(model).__name__)
    analyse(cap, records, facts)
    sites = [r.site for r in records]
    facts.stream_end = find_stream_end(sites, facts)
    findings = evaluate(list(rules.values()), sites, facts, config, "the model's own config", {})
    return SimpleNamespace(sites=sites, model=facts, findings=findings,
                           capture=SimpleNamespace(method=cap.method, complete=True))


@pytest.mark.parametrize("name", ["NP101_2", "NP101_3", "NP102_1", "NP103_1", "NP104_1", "NP104_5", "NP104_6", "NP102_7",
                                  "NP101_7", "NP101_11"])
def test_symbolic_trace_and_export_agree(name):
    """Pre-LN with dropout modules on the stream, parallel residuals, skip-from-norm with a hand-written RMS
    norm, post-LN with a double norm, mixed blocks, pooled projection shortcuts (Hiera, MaxViT), RepVGG branch
    sums, a downsampler's local residual, contrastive logits and a token gather before the final norm
    (``x[order]``: ``getitem`` traced, ``aten.index`` exported): the same placements, blocks and model facts
    from both capture methods."""
    module = _load(FIXTURES / f"{name}.py")
    torch.manual_seed(0)
    traced = _placements(module.build_model(), module.example_inputs(), "symbolic_trace")
    exported = _placements(module.build_model(), module.example_inputs(), "export")
    assert traced is not None and exported is not None, "both methods capture these fixtures"
    assert traced == exported


# -- torch.nn ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm_first,placement", [(False, "post"), (True, "pre")])
def test_torch_transformer_encoder_layer(norm_first, placement, placement_rules):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=norm_first)
    inputs = (torch.randn(2, 5, 16),)
    report = _light_audit(layer, inputs, rules=placement_rules)
    # torch.nn.TransformerEncoderLayer's forward calls F._canonical_mask, which symbolic tracing cannot
    # run on proxies: export captures it. Where symbolic tracing works the answers must agree.
    assert report.capture.method == "export"
    assert [(s.module, s.placement) for s in report.sites] == [("norm1", placement), ("norm2", placement)]
    assert report.model.placement == placement and report.model.num_residual_adds == 2
    traced = _placements(layer, inputs, "symbolic_trace")
    if traced is not None:
        assert traced == _placements(layer, inputs, "export")

    stack = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    report = _light_audit(stack, inputs, rules=placement_rules)
    assert [(b.path, b.norms) for b in report.model.blocks] == [
        (f"layers.{i}", {f"layers.{i}.norm1": placement, f"layers.{i}.norm2": placement}) for i in range(2)]
    # pre-LN layers without TransformerEncoder(norm=...): the stream reaches the output un-normalised
    assert {f.module for f in report.findings if f.rule_id == "NP101"} == ({"layers.1"} if norm_first else set())


def test_torch_transformer_defaults_are_post_ln_with_double_final_norms(placement_rules):
    torch.manual_seed(0)
    model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=32,
                           batch_first=True)
    report = _light_audit(model, (torch.randn(2, 5, 16), torch.randn(2, 4, 16)), rules=placement_rules)
    expected = {f"encoder.layers.{i}.norm{j}": "post" for i in range(2) for j in (1, 2)}
    expected.update({f"decoder.layers.{i}.norm{j}": "post" for i in range(2) for j in (1, 2, 3)})
    expected.update({"encoder.norm": "final", "decoder.norm": "final"})
    assert {s.module: s.placement for s in report.sites} == expected
    assert report.model.placement == "post" and report.model.has_final_norm is True
    assert site(report, "encoder.norm").stream.reads_norm == "encoder.layers.1.norm2"
    assert site(report, "decoder.norm").stream.reads_norm == "decoder.layers.1.norm3"
    np103 = _findings(report, "NP103")
    assert sorted(np103) == ["decoder.norm", "encoder.norm"]
    assert all(f.severity == "info" for f in np103.values())
    assert not [f for f in report.findings if RANK[f.severity] >= RANK["warning"]]


# -- Hugging Face transformers -------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100)


def _hf(config_name, model_name, **kw):
    cfg = getattr(transformers, config_name)(**kw)
    with torch.device("meta"):
        return getattr(transformers, model_name)(cfg)


def _hf_report(model, rules, full=False):
    report = (audit_model if full else _light_audit)(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export"
    return report


def test_bert_is_post_ln(placement_rules):
    report = _hf_report(_hf("BertConfig", "BertModel", **TINY), placement_rules)
    expected = {"embeddings.LayerNorm": "embedding"}
    for i in range(2):
        expected[f"encoder.layer.{i}.attention.output.LayerNorm"] = "post"
        expected[f"encoder.layer.{i}.output.LayerNorm"] = "post"
    assert {s.module: s.placement for s in report.sites} == expected
    assert report.model.placement == "post" and not report.model.parallel_residual
    assert report.model.num_residual_adds == 4 and report.model.has_final_norm is False
    assert [b.path for b in report.model.blocks] == ["encoder.layer.0", "encoder.layer.1"]
    assert {s.module: s.block for s in report.sites}["encoder.layer.1.output.LayerNorm"] == "encoder.layer.1"
    assert report.findings == []


def test_gpt2_is_pre_ln_with_final_norm(placement_rules):
    model = _hf("GPT2Config", "GPT2Model", n_embd=32, n_layer=2, n_head=4, vocab_size=100, bos_token_id=0,
                eos_token_id=0)
    report = _hf_report(model, placement_rules, full=True)  # once through the whole pipeline
    assert {s.module: s.placement for s in report.sites} == {
        "h.0.ln_1": "pre", "h.0.ln_2": "pre", "h.1.ln_1": "pre", "h.1.ln_2": "pre", "ln_f": "final"}
    assert report.model.placement == "pre" and report.model.has_final_norm is True
    assert [(b.path, b.class_name) for b in report.model.blocks] == [("h.0", "GPT2Block"), ("h.1", "GPT2Block")]
    assert report.findings == []


def test_llama_is_pre_ln_with_final_norm(placement_rules):
    model = _hf("LlamaConfig", "LlamaModel", num_key_value_heads=2, **TINY)
    report = _hf_report(model, placement_rules)
    expected = {f"layers.{i}.{n}": "pre" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")}
    expected["norm"] = "final"
    assert {s.module: s.placement for s in report.sites} == expected
    assert report.model.placement == "pre" and report.model.has_final_norm is True
    assert report.model.blocks[1].norms == {"layers.1.input_layernorm": "pre",
                                            "layers.1.post_attention_layernorm": "pre"}
    assert report.findings == []


def test_t5_is_pre_ln_with_final_norms_in_encoder_and_decoder(placement_rules):
    model = _hf("T5Config", "T5Model", d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, vocab_size=100)
    report = _hf_report(model, placement_rules)
    expected = {}
    for stack, sublayers in (("encoder", 2), ("decoder", 3)):
        for i in range(2):
            for j in range(sublayers):
                expected[f"{stack}.block.{i}.layer.{j}.layer_norm"] = "pre"
        expected[f"{stack}.final_layer_norm"] = "final"
    assert {s.module: s.placement for s in report.sites} == expected
    assert report.model.placement == "pre" and report.model.has_final_norm is True
    assert [b.path for b in report.model.blocks] == ["encoder.block.0", "encoder.block.1",
                                                     "decoder.block.0", "decoder.block.1"]
    assert report.findings == []


def test_vit_is_pre_ln_with_final_norm(placement_rules):
    model = _hf("ViTConfig", "ViTModel", image_size=32, patch_size=8, **TINY)
    report = _hf_report(model, placement_rules)
    layers = [b.path for b in report.model.blocks]
    assert len(layers) == 2
    expected = {f"{p}.{n}": "pre" for p in layers for n in ("layernorm_before", "layernorm_after")}
    expected["layernorm"] = "final"
    assert {s.module: s.placement for s in report.sites} == expected
    assert report.model.placement == "pre" and report.model.has_final_norm is True
    assert report.findings == []


def test_module_docstring_example_runs():
    import doctest

    import normaudit.facts.placement as placement

    result = doctest.testmod(placement, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# -- regressions ---------------------------------------------------------------------------------------------
class _FusedQKV(nn.Module):
    """nanoGPT attention: fused qkv Linear, .split, shapes read from the block input, sdpa."""

    def __init__(self, d=32, h=4):
        super().__init__()
        self.h, self.qkv, self.o = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).contiguous().view(B, T, C))


class _SeparateQKV(nn.Module):
    """Separate q/k/v Linears; with ``qk_norm`` a norm on q and k after their projection (Qwen3, OLMo2);
    ``manual`` computes the scores with matmul instead of sdpa."""

    def __init__(self, d=32, h=4, qk_norm=False, manual=False):
        super().__init__()
        self.h, self.manual = h, manual
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.q_norm = nn.RMSNorm(d // h) if qk_norm else None
        self.k_norm = nn.RMSNorm(d // h) if qk_norm else None

    def forward(self, x):
        B, T, C = x.shape
        q, k = self.q(x).view(B, T, self.h, -1), self.k(x).view(B, T, self.h, -1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v(x).view(B, T, self.h, -1).transpose(1, 2)
        if self.manual:
            y = torch.softmax(q @ k.transpose(-2, -1) / (C // self.h) ** 0.5, dim=-1) @ v
        else:
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class _GPTBlock(nn.Module):
    def __init__(self, attn, d=32):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), attn, nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _GPT(nn.Module):
    def __init__(self, make_attn, d=32, layers=2):
        super().__init__()
        self.wte = nn.Embedding(100, d)
        self.h = nn.ModuleList(_GPTBlock(make_attn()) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, 100, bias=False)

    def forward(self, idx):
        x = self.wte(idx)
        for b in self.h:
            x = b(x)
        return self.head(self.ln_f(x))


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
@pytest.mark.parametrize("attn,qk", [
    (_FusedQKV, False),
    (_SeparateQKV, False),
    (lambda: _SeparateQKV(manual=True), False),
    (lambda: _SeparateQKV(qk_norm=True), True),
    (lambda: _SeparateQKV(qk_norm=True, manual=True), True),
], ids=["fused_qkv", "separate_qkv", "separate_qkv_matmul", "qk_norm", "qk_norm_matmul"])
def test_qk_only_after_the_projection(attn, qk, method):
    """The block input feeding the q/k/v projections is ``pre`` even though its .shape sizes the q/k views;
    ``qk`` only for norms on queries/keys after their projection."""
    torch.manual_seed(0)
    got = _placements(_GPT(attn), (torch.randint(0, 100, (2, 16)),), method)
    assert got is not None
    placements = {(m, c): p for m, c, p, _, _ in got[0]}
    expected = {}
    for i in range(2):
        expected[(f"h.{i}.ln_1", 0)] = expected[(f"h.{i}.ln_2", 0)] = "pre"
        if qk:
            expected[(f"h.{i}.attn.q_norm", 0)] = expected[(f"h.{i}.attn.k_norm", 0)] = "qk"
    expected[("ln_f", 0)] = "final"
    assert placements == expected
    assert got[1]["placement"] == "pre" and got[1]["has_final_norm"] is True


def test_t5_float16_clamp_is_looked_through(placement_rules):
    """T5 in float16 clamps the stream (torch.where(isinf(x).any(), ...), torch.clamp) after every sublayer,
    also between the last block and final_layer_norm: the final norms stay final, NP101 stays silent."""
    model = _hf("T5Config", "T5Model", d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, vocab_size=100)
    inputs, _ = infer_inputs(model)
    cap = capture_model(model, inputs, on_meta=True, dtype=torch.float16)
    assert cap.gm is not None and cap.method == "export"
    assert any(op_name(n) == "clamp" for n in cap.gm.graph.nodes), "the float16 guard is in the graph"
    records = discover_sites(cap)
    facts = ModelFacts(class_name="T5Model")
    analyse(cap, records, facts)
    expected = {}
    for stack, sublayers in (("encoder", 2), ("decoder", 3)):
        for i in range(2):
            for j in range(sublayers):
                expected[f"{stack}.block.{i}.layer.{j}.layer_norm"] = "pre"
        expected[f"{stack}.final_layer_norm"] = "final"
    assert {r.site.module: r.site.placement for r in records} == expected
    assert facts.placement == "pre" and facts.has_final_norm is True
    assert all(r.site.stream.unnormed_stream_end is None for r in records)
    sites = [r.site for r in records]
    assert evaluate(list(placement_rules.values()), sites, facts, model_config(model) or {}, "config", {}) == []


def test_library_base_model_without_final_norm_is_info(placement_rules):
    """NP101 on a library's base model whose un-normalised stream is its output (the closing norm of the
    architecture may live in the pooler, head or neck the library leaves out of AutoModel) is info, with a
    note; the same stack feeding its own head, or a user's model, stays a warning."""
    blocks = _load(FIXTURES / "placement_blocks.py")
    PreLN, Stack = blocks.PreLN, blocks.Stack

    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.layers = nn.Embedding(50, 16), nn.ModuleList(PreLN() for _ in range(2))

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return x

    ids = (torch.randint(0, 50, (2, 6)),)
    for model, library, severity in ((Base(), True, "info"), (Base(), False, "warning"),
                                     (Stack([PreLN(), PreLN()], final_norm=False), True, "warning")):
        cap = capture_model(model, ids, on_meta=False)
        records = discover_sites(cap)
        facts = ModelFacts(class_name=type(model).__name__)
        analyse(cap, records, facts)
        facts.stream_end = find_stream_end([r.site for r in records], facts)
        found = evaluate([placement_rules["NP101"]], [r.site for r in records], facts, {}, "config",
                         {"library_model": library})
        assert [(f.module, f.severity) for f in found] == [("layers.1", severity)], (library, found)
        assert ("the library leaves out of its base model" in found[0].message) == (severity == "info")


def test_fnet_fourier_sublayer_is_a_residual_closed_by_its_post_norm(placement_rules):
    """transformers FNetModel: ``LayerNorm(x + fft(x).real)`` has no weights in its branch, yet it is the
    residual of the mixing sublayer; every norm of the encoder is post (no NP102 on the Fourier output norm,
    no NP104 between the first and the other layers)."""
    model = _hf("FNetConfig", "FNetModel", hidden_size=32, num_hidden_layers=2, intermediate_size=64, vocab_size=100)
    report = _hf_report(model, placement_rules)
    expected = {"embeddings.LayerNorm": "embedding"}
    for i in range(2):
        expected[f"encoder.layer.{i}.fourier.output.LayerNorm"] = "post"
        expected[f"encoder.layer.{i}.output.LayerNorm"] = "post"
    assert {s.module: s.placement for s in report.sites} == expected
    assert report.model.placement == "post" and report.model.num_residual_adds == 4
    assert not [f for f in report.findings if RANK[f.severity] >= RANK["warning"]]


def test_gemma2_is_sandwich_and_resnet_is_post(placement_rules):
    """Model placement ``sandwich`` needs a norm on the branch's input as well as on its output (Gemma 2's
    input_layernorm + post_attention_layernorm); a branch closed by a norm whose input stays raw is
    res-post-norm, ``post``: ResNet v1's x + BN(conv(ReLU(BN(conv(x))))) (was read as sandwich)."""
    model = _hf("Gemma2Config", "Gemma2Model", num_key_value_heads=2, head_dim=8, **TINY)
    report = _hf_report(model, placement_rules)
    assert report.model.blocks[1].norms == {
        "layers.1.input_layernorm": "pre", "layers.1.post_attention_layernorm": "sandwich",
        "layers.1.pre_feedforward_layernorm": "pre", "layers.1.post_feedforward_layernorm": "sandwich"}
    assert report.model.placement == "sandwich" and report.model.has_final_norm is True

    model = _hf("ResNetConfig", "ResNetModel", embedding_size=8, hidden_sizes=[8, 16], depths=[2, 2],
                layer_type="basic")
    report = _light_audit(model, (torch.randn(1, 3, 32, 32),), rules=placement_rules, on_meta=True)
    assert report.model.blocks[1].norms == {"encoder.stages.0.layers.1.layer.0.normalization": "pre",
                                            "encoder.stages.0.layers.1.layer.1.normalization": "sandwich"}
    assert site(report, "encoder.stages.0.layers.1.layer.0.normalization").stream.branch_position == "inner"
    assert report.model.placement == "post"
    assert [f for f in report.findings if f.severity != "info"] == []
    # bottlenecks whose first block projects the stem's output (conv -> BN -> ReLU -> max-pool feeds both the
    # 1x1 shortcut and the branch): the stem's BN is no branch-input norm of a sandwich
    model = _hf("ResNetConfig", "ResNetModel", embedding_size=16, hidden_sizes=[8, 16], depths=[2, 2],
                layer_type="bottleneck")
    report = _light_audit(model, (torch.randn(1, 3, 32, 32),), rules=placement_rules, on_meta=True)
    assert site(report, "embedder.embedder.normalization").stream.branch_position == "input"
    assert report.model.blocks[0].norms["encoder.stages.0.layers.0.shortcut.normalization"] == "sandwich"
    assert report.model.placement == "post"


def _conv_decoder():
    """A signal decoder: a conv stem, pre-norm residual conv blocks, an output conv making the signal."""

    class Block(nn.Module):
        def __init__(self, c=8):
            super().__init__()
            self.norm, self.mixer = nn.GroupNorm(1, c), nn.Conv1d(c, c, 3, padding=1, groups=c)
            self.ffn = nn.Sequential(nn.Conv1d(c, 2 * c, 1), nn.GELU(), nn.Conv1d(2 * c, c, 1))

        def forward(self, x):
            return x + self.ffn(self.mixer(self.norm(x)))

    class Decoder(nn.Module):
        def __init__(self, c=8):
            super().__init__()
            self.stem, self.stage = nn.Conv1d(4, c, 3, padding=1), nn.ModuleList(Block(c) for _ in range(2))
            self.head = nn.Conv1d(c, 1, 7, padding=3)

        def forward(self, z):
            x = self.stem(z)
            for block in self.stage:
                x = block(x)
            return self.head(x)

    return Decoder()


def test_library_signal_decoder_without_final_norm_is_info(placement_rules):
    """NP101 on a library's signal decoder whose stream an output convolution turns into the signal is info
    (VibeVoice's acoustic decoder: the reference code drops its last norm with disable_last_norm, which the
    released configs set); a user's decoder stays a warning, with the fact ``stream_end_conv``."""
    model, z = _conv_decoder(), (torch.randn(2, 4, 16),)
    cap = capture_model(model, z, on_meta=False)
    records = discover_sites(cap)
    facts = ModelFacts(class_name="Decoder")
    analyse(cap, records, facts)
    sites = [r.site for r in records]
    facts.stream_end = find_stream_end(sites, facts)
    assert {s.module: s.stream.stream_end_conv for s in sites} == {"stage.0.norm": False,
                                                                           "stage.1.norm": True}
    for library, severity in ((True, "info"), (False, "warning")):
        found = evaluate([placement_rules["NP101"]], sites, facts, {}, "config", {"library_model": library})
        assert [(f.module, f.severity) for f in found] == [("stage.1", severity)], (library, found)
        assert ("disable_last_norm" in found[0].message) == library


def test_vibevoice_acoustic_decoder_np101_is_info(placement_rules):
    """Real library code: transformers' VibeVoiceAcousticTokenizerDecoderModel (ConvNeXt-1d pre-norm stages,
    output conv ``head``) gets NP101 as info, not a warning."""
    if not hasattr(transformers, "VibeVoiceAcousticTokenizerDecoderModel"):
        pytest.skip("transformers without VibeVoice")
    cfg = transformers.VibeVoiceAcousticTokenizerDecoderConfig(
        hidden_size=8, num_filters=4, depths=[2, 2], downsampling_ratios=[2], kernel_size=3)
    model = transformers.VibeVoiceAcousticTokenizerDecoderModel(cfg).eval()
    report = audit_model(model, (torch.randn(1, 8, 4),), rules=placement_rules)
    np101 = [(f.module, f.severity) for f in report.findings if f.rule_id == "NP101"]
    assert np101 == [("conv_layers.0.stage.1", "info")], report.findings
    assert "disable_last_norm" in next(f.message for f in report.findings if f.rule_id == "NP101")


def test_grounding_dino_fusion_layer_loses_no_identity_path():
    """transformers' GroundingDinoFusionLayer (BiAttentionBlock, modeling_grounding_dino.py) captured alone, as
    the parts capture of GroundingDinoModel sees it: ``v = layer_norm_vision(v); v = v + gamma * delta_v``.
    The norms' outputs are the skips of their adds (skip_from_norm), but no pre norm reads the stream they
    overwrite (the encoder layer around it is post-LN): no_identity_lost, and NP102 is silent."""
    from transformers.models.grounding_dino.modeling_grounding_dino import GroundingDinoFusionLayer

    cfg = transformers.GroundingDinoConfig(d_model=32, encoder_attention_heads=4, encoder_ffn_dim=64)
    layer = GroundingDinoFusionLayer(cfg).eval()
    cap = capture_model(layer, (torch.randn(2, 12, 32), torch.randn(2, 5, 32)), on_meta=False)
    records = discover_sites(cap)
    analyse(cap, records, ModelFacts(class_name="GroundingDinoFusionLayer"))
    extra = {r.site.module: r.site.stream.model_dump() for r in records}
    for side in ("vision", "text"):
        e = extra[f"layer_norm_{side}"]
        assert e.get("skip_from_norm") is True and e.get("no_identity_lost") is True, (side, e)
