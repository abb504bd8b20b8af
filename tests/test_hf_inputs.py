"""Inputs built for transformers models from their forward signature and config (tiny configs, meta device),
and the captures they give."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import audit_model  # noqa: E402
from normaudit.loaders.inputs import infer_hf_inputs  # noqa: E402

TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
VISION = dict(TEXT, image_size=32, patch_size=8)


def _meta(config_cls: str, model_cls: str, **kw) -> nn.Module:
    cfg = getattr(transformers, config_cls)(**kw)
    with torch.device("meta"):
        return getattr(transformers, model_cls)(cfg)


def _shapes(model: nn.Module) -> dict[str, tuple]:
    kwargs, _ = infer_hf_inputs(model)
    return {k: (tuple(v.shape), v.dtype) for k, v in kwargs.items()}


F, I = torch.float32, torch.int64


def _norm_modules(model: nn.Module) -> list[str]:
    """Activation norms by class (weight-norm parametrizations are not normalisation layers)."""
    kinds = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.RMSNorm)
    return [n for n, m in model.named_modules()
            if isinstance(m, kinds) or type(m).__name__.endswith(("LayerNorm", "RMSNorm"))]
WHISPER = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
               max_source_positions=16, max_target_positions=32)
BART = dict(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=99)
CASES = {
    "vit": (("ViTConfig", "ViTModel", VISION), {"pixel_values": ((2, 3, 32, 32), F)}),
    "videomae": (("VideoMAEConfig", "VideoMAEModel", dict(VISION, num_frames=4, tubelet_size=2)),
                 {"pixel_values": ((2, 4, 3, 32, 32), F)}),
    "whisper": (("WhisperConfig", "WhisperModel", WHISPER),
                {"input_features": ((2, 16, 32), F), "decoder_input_ids": ((2, 16), I)}),
    "wav2vec2": (("Wav2Vec2Config", "Wav2Vec2Model", TEXT), {"input_values": ((2, 3200), F)}),
    "speech_to_text": (("Speech2TextConfig", "Speech2TextModel", dict(WHISPER, input_feat_per_channel=20,
                                                                      input_channels=1, num_mel_bins=None)),
                       {"input_features": ((2, 64, 20), F), "decoder_input_ids": ((2, 16), I)}),
    "clip": (("CLIPConfig", "CLIPModel", dict(text_config=dict(TEXT, vocab_size=99), vision_config=VISION,
                                               projection_dim=16)),
             {"input_ids": ((2, 16), I), "pixel_values": ((2, 3, 32, 32), F)}),
    "t5": (("T5Config", "T5Model", dict(d_model=32, d_ff=64, num_layers=1, num_heads=4, d_kv=8, vocab_size=99)),
           {"input_ids": ((2, 16), I), "decoder_input_ids": ((2, 16), I)}),
    "bart": (("BartConfig", "BartModel", BART), {"input_ids": ((2, 16), I), "decoder_input_ids": ((2, 16), I)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inputs_fit_the_config(name):
    (cfg, cls, kw), expected = CASES[name]
    model = _meta(cfg, cls, **{k: v for k, v in kw.items() if v is not None})
    assert _shapes(model) == expected


def test_vision_language_model_gets_one_image_token_per_image_feature():
    # 32x32 image, patch 8: 16 patches, the CLS feature dropped ("default" strategy): 16 tokens per image
    model = _meta("LlavaConfig", "LlavaModel", vision_config=dict(VISION, model_type="clip_vision_model",
                                                                   projection_dim=16),
                  text_config=dict(TEXT, model_type="llama", vocab_size=120, num_key_value_heads=4),
                  image_token_index=110)
    kwargs, text = infer_hf_inputs(model)
    ids = kwargs["input_ids"]
    assert tuple(ids.shape) == (2, 16 + 16) and tuple(kwargs["pixel_values"].shape) == (2, 3, 32, 32)
    assert (ids == 110).sum(dim=1).tolist() == [16, 16]
    assert text == "input_ids int64 (2, 32), pixel_values float (2, 3, 32, 32)"


@pytest.mark.parametrize("name, sites", [("whisper", 12), ("wav2vec2", 7), ("clip", 11), ("vit", 5)])
def test_captured_with_every_norm(name, sites, rules):
    (cfg, cls, kw), _ = CASES[name]
    model = _meta(cfg, cls, **kw)
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export"
    norms = _norm_modules(model)
    by_module = [s.module for s in report.sites if s.detected_by == "module"]
    assert len(norms) == sites and sorted(by_module) == sorted(norms)  # every norm module was called, once
    assert report.capture.unaudited == []


class _FixedSizeViT(nn.Module):
    """timm-style: a fixed-size patch embedding that asserts its input size, declared in pretrained_cfg."""

    def __init__(self):
        super().__init__()
        self.pretrained_cfg = {"input_size": (3, 48, 48)}
        self.patch = nn.Conv2d(3, 16, 16, stride=16)
        self.pos = nn.Parameter(torch.zeros(1, 9, 16))
        self.norm = nn.LayerNorm(16, eps=1e-6)

    def forward(self, x):
        assert x.shape[-2:] == (48, 48), f"Input height ({x.shape[-2]}) doesn't match model (48)"
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.norm(x)


def test_declared_input_size_of_a_timm_style_model(rules):
    from normaudit.loaders.inputs import declared_input_size, infer_inputs

    model = _FixedSizeViT()
    assert declared_input_size(model) == ((3, 48, 48), "pretrained_cfg")
    inputs, said = infer_inputs(model)
    assert tuple(inputs[0].shape) == (2, 3, 48, 48)
    assert said == "float (2, 3, 48, 48) from the model's pretrained_cfg['input_size']"
    with torch.device("meta"):
        meta_model = _FixedSizeViT()
    r = audit_model(meta_model, rules=rules, on_meta=True)
    assert r.capture.method != "module_walk" and [s.module for s in r.sites] == ["norm"]
    assert [f.rule_id for f in r.findings if f.rule_id == "NK101"] == []


def test_no_declared_input_size_without_a_valid_cfg():
    from normaudit.loaders.inputs import declared_input_size

    m = nn.Conv2d(3, 4, 3)
    assert declared_input_size(m) is None
    m.default_cfg = {"input_size": ("3", 224)}
    assert declared_input_size(m) is None


# Towers and encoders whose forward takes other inputs than their main_input_name says: the inputs follow the
# forward's required parameters.
QWEN3_VL_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                       patch_size=4, num_position_embeddings=16, deepstack_visual_indexes=[])


def _auto_meta(config_cls: str, **kw) -> nn.Module:
    cfg = getattr(transformers, config_cls)(**kw)
    with torch.device("meta"):
        return transformers.AutoModel.from_config(cfg)


def test_vision_tower_alone_gets_patches_and_grid():
    # Qwen3VLVisionModel.forward(hidden_states, grid_thw); its main_input_name is the inherited "input_ids".
    # A 4x4 patch grid per image (2 merge windows of spatial_merge_size 2 a side), 3 * 2 * 4 * 4 values each.
    model = _auto_meta("Qwen3VLVisionConfig", **QWEN3_VL_VISION)
    assert model.main_input_name == "input_ids"
    kwargs, said = infer_hf_inputs(model)
    assert said == "hidden_states float (32, 96), grid_thw int64 (2, 3)"
    assert kwargs["grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]


def test_vision_tower_alone_is_captured_with_every_norm(rules):
    # export fails on the data-dependent split of the attention by cu_seqlens (lengths.tolist(), computed from
    # grid_thw); with grid_thw a constant, lifted and propagated, the sizes specialise and the whole tower
    # is captured (capture._constant_propagation)
    model = _auto_meta("Qwen3VLVisionConfig", **QWEN3_VL_VISION).eval()
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.method == "export" and report.capture.complete, report.capture.attempts
    assert [(a.method, a.ok) for a in report.capture.attempts] == [
        ("export", False), ("export (integer inputs as constants)", True)]
    norms = _norm_modules(model)
    assert len(norms) == 2 * 2 + 1  # norm1/norm2 per block, the merger's norm
    assert sorted({s.module for s in report.sites if s.detected_by == "module"}) == sorted(norms)
    assert report.capture.unaudited == []


@pytest.mark.parametrize("config_cls, kw, expected", [
    ("Qwen3ASREncoderConfig", dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
                                   d_model=32, output_dim=32, downsample_hidden_size=8),
     "input_features float (2, 16, 100), input_features_mask bool (2, 100)"),  # 2 windows of n_window 50
    ("Gemma3nAudioConfig", dict(input_feat_size=16, hidden_size=32, conf_num_attention_heads=4,
                                conf_num_hidden_layers=2, sscp_conv_channel_size=[8, 8]),
     "audio_mel float (2, 64, 16), audio_mel_mask bool (2, 64)"),
])
def test_required_mask_of_the_features_is_built(config_cls, kw, expected):
    # forward(input_features, input_features_mask) / forward(audio_mel, audio_mel_mask): no default for the
    # mask, so it is built over the features' time axis, every frame valid
    model = _auto_meta(config_cls, **kw)
    kwargs, said = infer_hf_inputs(model)
    assert said == expected
    mask = next(v for k, v in kwargs.items() if k.endswith("_mask"))
    assert bool(mask.all())


class _Tower(nn.Module):
    """A Hugging Face-style tower (config, main_input_name) whose forward requires a patch list, its grid and
    per-image merge sizes, none of them its main input name."""

    main_input_name = "input_ids"

    def __init__(self):
        super().__init__()
        self.config = transformers.PretrainedConfig(patch_size=2, in_channels=3, temporal_patch_size=1,
                                                    spatial_merge_size=1)
        self.proj = nn.Linear(12, 8)
        self.norm = nn.LayerNorm(8, eps=1e-6)

    def forward(self, pixel_values, grid_thw, merge_sizes, **kwargs):
        assert "input_ids" not in kwargs and grid_thw.shape == (2, 3) and merge_sizes.shape == (2,)
        return self.norm(self.proj(pixel_values))


def test_required_parameters_decide_the_inputs(rules):
    model = _Tower()
    kwargs, said = infer_hf_inputs(model)
    assert said == "pixel_values float (8, 12), grid_thw int64 (2, 3), merge_sizes int64 (2,)"
    report = audit_model(model, rules=rules)
    assert report.capture.complete and [s.module for s in report.sites] == ["norm"]


def _qwen3_vl_on_meta():
    text = dict(TEXT, model_type="qwen3_vl_text", vocab_size=120, num_key_value_heads=2, head_dim=8, num_hidden_layers=1,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 1, 1]))
    return _auto_meta("Qwen3VLConfig", text_config=text, vision_config=dict(QWEN3_VL_VISION, depth=1),
                      image_token_id=110, video_token_id=111, vision_start_token_id=112).eval()


def test_multimodal_mrope_forward_with_token_types_is_captured_whole(rules):
    # Qwen3-VL on text + image: the plain export fails on the data-dependent split of the vision attention by
    # cu_seqlens; with the integer inputs as constants the whole multimodal forward is captured, M-RoPE
    # reading mm_token_type_ids (1 at the 4 image tokens of each row: one per merge window of a 4 x 4 grid)
    model = _qwen3_vl_on_meta()
    kwargs, said = infer_hf_inputs(model)
    assert said == ("input_ids int64 (2, 20), pixel_values float (32, 96), image_grid_thw int64 (2, 3), "
                    "mm_token_type_ids int64 (2, 20)")
    assert kwargs["mm_token_type_ids"].tolist() == [[1] * 4 + [0] * 16] * 2
    assert ((kwargs["input_ids"] == 110) == (kwargs["mm_token_type_ids"] == 1)).all()
    report = audit_model(model, rules=rules, on_meta=True)  # eval: no second, eval-mode round of attempts
    assert [(a.method, a.ok) for a in report.capture.attempts] == [
        ("export", False), ("export (integer inputs as constants)", True)]
    assert report.capture.parts == [] and report.capture.unaudited == []
    assert sorted({s.module for s in report.sites if s.detected_by != "module_walk"}) == sorted(_norm_modules(model))


def test_multimodal_forward_that_fails_is_captured_by_its_main_tower_and_parts(rules, monkeypatch):
    # Qwen3-VL on text + image without mm_token_type_ids, which its M-RoPE refuses image inputs without, so
    # the whole forward cannot be exported. The retry on the text alone gives a whole-model graph of the
    # language model; the vision tower, never called by it, is captured alone on its own inputs (by parts).
    from normaudit.loaders.inputs import placeholders

    monkeypatch.setattr(placeholders, "_with_token_types", lambda config, kwargs, params: kwargs)
    model = _qwen3_vl_on_meta()
    report = audit_model(model, rules=rules, on_meta=True)  # eval: no second, eval-mode round of attempts
    attempts = [(a.method, a.ok) for a in report.capture.attempts]
    assert attempts[0] == ("export", False) and attempts[-1] == ("export (main tower's inputs only)", True)
    assert report.capture.complete and report.capture.method == "export"
    # the tower, never called by the text-only graph, is captured whole on its own inputs (its cu_seqlens
    # split sizes specialise with grid_thw a constant: capture._constant_propagation)
    assert [(p.module, p.method) for p in report.capture.parts] == [("visual", "export")]
    vision = [n for n in _norm_modules(model) if n.startswith("visual.")]
    graphed = {s.module for s in report.sites if s.detected_by != "module_walk"}
    assert set(vision) <= graphed and len(vision) == 3  # norm1, norm2 of one block, the merger's norm
    assert "language_model.norm" in graphed and report.capture.unaudited == []


# Inputs the forward takes besides a main input (norms those inputs reach go unaudited without them): each
# mechanism with a tiny real config,
# the exact inputs built, and a capture as one graph holding every norm module of the model (sites: each call).
SERIES = dict(prediction_length=4, context_length=6, lags_sequence=[1, 2, 3], num_time_features=2, d_model=16,
              encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
              encoder_ffn_dim=16, decoder_ffn_dim=16)
PARAKEET_ENCODER = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                        num_mel_bins=16, subsampling_conv_channels=8)
MECHANISMS = {
    # a forecaster: past window = context 6 + largest lag 3; the future window runs the decoder
    "series": (("TimeSeriesTransformerConfig", SERIES),
               "past_values float (2, 9), past_time_features float (2, 9, 2), past_observed_mask bool (2, 9), "
               "future_values float (2, 4), future_time_features float (2, 4, 2)", 7),
    # the mel width is in the encoder_config sub-config
    "encoder_config": (("ParakeetCTCConfig", dict(encoder_config=PARAKEET_ENCODER, vocab_size=33, pad_token_id=32)),
                       "input_features float (2, 64, 16)", 6),
    # no width in the config at all: the feature extractor's 128 mel bins, chosen on the meta device
    "mel_width": (("Gemma4AudioConfig", dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                             subsampling_conv_channels=[128, 32], output_proj_dims=32)),
                  "input_features float (2, 64, 128)", 11),
    # required prompt inputs named after known kinds; image_size (64, 32) holds prompt and input stacked
    "prompt": (("SegGptConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=[64, 32],
                                     patch_size=8, mlp_dim=64, decoder_hidden_size=16,
                                     intermediate_hidden_state_indices=[0, 1], merge_index=0)),
               "pixel_values float (2, 3, 32, 32), prompt_pixel_values float (2, 3, 32, 32), "
               "prompt_masks float (2, 3, 32, 32)", 6),  # the encoder's final norm runs twice
    # X-MOD's per-language adapters need lang_ids (forward raises without them and no default language)
    "lang_ids": (("XmodConfig", dict(TEXT, vocab_size=99, languages=["en_XX", "de_DE"], default_language=None)),
                 "input_ids int64 (2, 16), lang_ids int64 (2,)", 7),  # the output LayerNorms run twice (adapter_reuse_layer_norm)
    # Gemma 4's vision tower: a 4x4 grid (2 pooling windows of 2) of 4x4x3 patch rows and their (x, y)
    "patch_positions": (("Gemma4VisionConfig", dict(TEXT, head_dim=8, num_key_value_heads=4, patch_size=4,
                                                    pooling_kernel_size=2, position_embedding_size=64)),
                        "pixel_values float (2, 16, 48), pixel_position_ids int64 (2, 16, 2)", 14),
    # a codec whose waveform must be whole frames: hop 16 * 6 * 5 * 4 = 1920, 3200 samples rounded up to 3840
    "hop": (("MuseSparkAudioConfig", dict(hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], out_hidden_size=32)),
            "input_values float (2, 3840)", 10),
}


def _built_and_captured(config_cls: str, kw: dict, expected: str, rules) -> tuple[nn.Module, Any, list[str]]:
    """Build ``config_cls(**kw)``'s model on meta, check the inputs built for it (``expected``, as the report
    describes them) and that it is captured whole by export; returns the model, the report and the modules of
    the sites found in the graph (one per call)."""
    model = _auto_meta(config_cls, **kw).eval()
    assert infer_hf_inputs(model)[1] == expected
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export", report.capture.attempts
    return model, report, [s.module for s in report.sites if s.detected_by != "module_walk"]


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_inputs_of_the_forward_are_built_and_captured(mechanism, rules):
    (config_cls, kw), expected, sites = MECHANISMS[mechanism]
    model, report, graphed = _built_and_captured(config_cls, kw, expected, rules)
    norms = _norm_modules(model)
    assert len(graphed) == sites and sorted(set(graphed)) == sorted(norms)  # every norm module, each call
    assert report.capture.unaudited == []


def test_grounded_image_positions_are_marked_in_the_text():
    # Kosmos-2 writes its latent_query_num image features into the positions image_embeds_position_mask marks
    # (the forward raises without it): 4 positions after the first token, the text's 16 tokens around them
    model = _auto_meta("Kosmos2Config", latent_query_num=4,
                       text_config=dict(embed_dim=32, layers=1, attention_heads=4, ffn_dim=64, vocab_size=99),
                       vision_config=dict(TEXT, image_size=32, patch_size=8))
    kwargs, said = infer_hf_inputs(model)
    assert said == "pixel_values float (2, 3, 32, 32), input_ids int64 (2, 20), image_embeds_position_mask bool (2, 20)"
    assert kwargs["image_embeds_position_mask"].nonzero()[:, 1].tolist() == [1, 2, 3, 4] * 2


class _WrappedBackbone(nn.Module):
    """A Hugging Face-style model (config without image sizes) around a timm-style backbone that declares
    and asserts its input size (transformers' TimmWrapper: Perception Encoder towers)."""

    main_input_name = "pixel_values"

    def __init__(self):
        super().__init__()
        self.config = transformers.PretrainedConfig(num_channels=3)
        self.backbone = _FixedSizeViT()

    def forward(self, pixel_values):
        return self.backbone(pixel_values)


def test_image_size_declared_by_a_wrapped_backbone(rules):
    model = _WrappedBackbone()
    assert infer_hf_inputs(model)[1] == "pixel_values float (2, 3, 48, 48)"
    report = audit_model(model, rules=rules)
    assert report.capture.complete and [s.module for s in report.sites] == ["backbone.norm"]


SPEECH_TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, head_dim=8)


def test_text_as_long_as_the_audio_for_additive_fusion():
    # Voxtral-Realtime adds its audio embeddings to the text embeddings position by position (no audio token):
    # 256 frames of (B, mel 16, T) features, the layout a meta forward accepts, give 32 audio positions
    model = _auto_meta("VoxtralRealtimeConfig", hidden_size=32,
                       audio_config=dict(SPEECH_TEXT, num_mel_bins=16, vocab_size=99),
                       text_config=dict(SPEECH_TEXT, vocab_size=99, num_key_value_heads=2))
    assert infer_hf_inputs(model)[1] == "input_ids int64 (2, 32), input_features float (2, 16, 256)"


def test_token_ids_over_several_codebooks():
    # Kyutai STT embeds a text stream and num_codebooks audio streams per position: ids (B, S, K + 1)
    codec = dict(hidden_size=32, num_filters=8, num_hidden_layers=1, intermediate_size=32, num_attention_heads=4,
                 num_key_value_heads=4, head_dim=8, codebook_size=16, codebook_dim=16, num_quantizers=4,
                 num_semantic_quantizers=1, vector_quantization_hidden_dimension=16, upsample_groups=8)
    model = _auto_meta("KyutaiSpeechToTextConfig", **SPEECH_TEXT, num_key_value_heads=4, ffn_dim=64, vocab_size=99,
                       codebook_vocab_size=17, num_codebooks=4, pad_token_id=3, audio_pad_token_id=98,
                       audio_bos_token_id=16, bos_token_id=1, codec_config=codec)
    assert infer_hf_inputs(model)[1] == "input_ids int64 (2, 16, 5)"


# Inputs sized or shaped by the config keys the forward depends on: each mechanism with a tiny real config,
# the exact inputs built, and a capture holding every norm module.
RT_DETR = dict(backbone_config=dict(model_type="resnet", embedding_size=8, hidden_sizes=[8, 16, 32, 64],
                                    depths=[1, 1, 1, 1], layer_type="basic", out_features=["stage2", "stage3", "stage4"]),
               encoder_in_channels=[16, 32, 64], decoder_in_channels=[32, 32, 32], encoder_hidden_dim=32, d_model=32,
               encoder_ffn_dim=32,
               decoder_ffn_dim=32, encoder_layers=1, decoder_layers=1, num_queries=100, num_denoising=0)
SHAPED = {
    # topk(num_queries) over the flattened maps of strides 8, 16, 32: 100 queries need a 96 x 96 image
    # (144 + 36 + 9 tokens; 64 x 64 gives 84)
    "detr_queries": (("RTDetrConfig", RT_DETR), "pixel_values float (2, 3, 96, 96)", 60),
    # the waveform arrives as `hidden_states` (B, 1, T): main_input_name input_values is not a forward parameter
    "renamed_main": (("VibeVoiceAcousticTokenizerEncoderConfig",
                      dict(hidden_size=16, num_filters=4, depths=[1, 1, 1], downsampling_ratios=[2, 4])),
                     "hidden_states float (2, 1, 3200)", 6),
    # MiniCPM-V packs its images' patches in one row, split by target_sizes (2 merge windows of 2 a side)
    "packed_patches": (("MiniCPMV4_7VisionConfig", dict(TEXT, image_size=32, patch_size=4, insert_layer_id=0)),
                       "pixel_values float (1, 3, 4, 128), target_sizes int64 (2, 2)", 7),
    # Siglip2 NaFlex: patch rows, their validity mask and each image's (h, w) in patches
    "naflex": (("Siglip2VisionConfig", dict(TEXT, patch_size=4, num_patches=16)),
               "pixel_values float (2, 16, 48), pixel_attention_mask int64 (2, 16), spatial_shapes int64 (2, 2)", 6),
}


@pytest.mark.parametrize("mechanism", sorted(SHAPED))
def test_inputs_shaped_by_the_config_are_built_and_captured(mechanism, rules):
    (config_cls, kw), expected, count = SHAPED[mechanism]
    model, report, graphed = _built_and_captured(config_cls, kw, expected, rules)
    # RT-DETR's frozen BatchNorms (buffers, no nn.BatchNorm2d) are norms too
    norms = set(_norm_modules(model)) | {n for n, m in model.named_modules() if type(m).__name__.endswith("BatchNorm2d")}
    graphed = sorted(set(graphed))
    assert graphed == sorted(norms) and len(norms) == count and report.capture.unaudited == []


def test_two_stage_detr_without_strides_gets_enough_tokens_for_its_queries():
    # Grounding DINO: 900 queries picked by topk over 4 levels of the backbone's strides 8, 16, 32 (and 64):
    # 256 x 256 gives 1024 + 256 + 64 + 16 tokens, 192 x 192 only 765
    from types import SimpleNamespace

    from normaudit.loaders.inputs.vision import _query_side

    assert _query_side(SimpleNamespace(two_stage=True, num_queries=900, num_feature_levels=4)) == 256
    assert _query_side(SimpleNamespace(two_stage=False, num_queries=900, num_feature_levels=4)) == 0
    assert _query_side(SimpleNamespace(feat_strides=[8, 16, 32], num_queries=300, num_feature_levels=3)) == 128


def test_temporal_patch_named_patch_temporal():
    # MuseSpark's vision tower: patches of patch_temporal 2 frames, (B * 4 * 4, 3 * 2 * 14 * 14)
    model = _auto_meta("MuseSparkVisionConfig", hidden_size=32, intermediate_size=64, num_attention_heads=4,
                       num_hidden_layers=1, patch_size=14, patch_temporal=2, merge_size=2)
    assert infer_hf_inputs(model)[1] == "pixel_values float (32, 1176), grid_thw int64 (2, 3)"


def test_image_size_of_the_backbone_inside_the_vision_config():
    # SAM2: no image size on the model or vision config; its Hiera backbone's 1024 x 1024 is what the FPN's
    # backbone_feature_sizes (256, 128, 64 a side) are built for
    from normaudit.loaders.inputs.vision import _image

    config = transformers.Sam2Config()
    assert config.vision_config.backbone_config.image_size == [1024, 1024]
    assert tuple(_image(config).shape) == (2, 3, 1024, 1024)
    assert tuple(_image(transformers.ViTConfig(image_size=32)).shape) == (2, 3, 32, 32)  # its own size first


def test_forecaster_padding_and_frequency_are_built_and_captured(rules):
    # TimesFM: forward(past_values, past_values_padding, freq), all required; 64 steps = 4 patches of 16
    model = _auto_meta("TimesFmConfig", context_length=64, patch_length=16, horizon_length=16, hidden_size=32,
                       intermediate_size=32, head_dim=8, num_attention_heads=4, num_hidden_layers=1).eval()
    assert infer_hf_inputs(model)[1] == ("past_values float (2, 64, 1), past_values_padding float (2, 64), "
                                         "freq int64 (2, 1)")
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export", report.capture.attempts
    norms = _norm_modules(model)
    graphed = sorted({s.module for s in report.sites if s.detected_by != "module_walk"})
    assert graphed == ["layers.0.input_layernorm", "layers.0.mlp.layer_norm"] == sorted(norms)
    assert report.capture.unaudited == []


class _TwoMainInputs(nn.Module):
    """A model with several main inputs, as transformers allows (OneFormer: ``main_input_name =
    ["pixel_values", "task_inputs"]``, modeling_oneformer.py:2855): the first one is the main input."""

    main_input_name = ["pixel_values", "task_inputs"]

    def __init__(self):
        super().__init__()
        from transformers import PretrainedConfig

        self.config = PretrainedConfig(num_channels=3, image_size=32)
        self.norm = nn.LayerNorm(32)

    def forward(self, pixel_values, task_inputs=None):
        return self.norm(pixel_values)


def test_a_list_of_main_input_names_is_no_crash():
    """OneFormer's list-valued main_input_name crashed the input builder (TypeError: unhashable type: 'list',
    exit 3 in the zoo sweep); the first name is the main input."""
    from normaudit.loaders.inputs.signature import main_input_name

    model = _TwoMainInputs()
    assert main_input_name(model) == "pixel_values"
    inputs, described = infer_hf_inputs(model)
    assert list(inputs) == ["pixel_values"] and described == "pixel_values float (2, 3, 32, 32)"
    assert tuple(inputs["pixel_values"].shape) == (2, 3, 32, 32)
