"""Inputs that are already features of a width the model declares, and offline-RL trajectories: built as
transformers' own model tests build them, tiny real configs on the meta device, and the capture they give
(one export graph with a site for every norm module)."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import audit_model  # noqa: E402
from normaudit.loaders.inputs import forward_params, infer_hf_inputs  # noqa: E402
from normaudit.loaders.inputs.signature import runs_on_meta  # noqa: E402

F, I = torch.float32, torch.int64


def _meta(config_cls: str, **kw: Any) -> nn.Module:
    cfg = getattr(transformers, config_cls)(**kw)
    with torch.device("meta"):
        return transformers.AutoModel.from_config(cfg).eval()


def _shapes(kwargs: dict[str, Any]) -> dict[str, tuple]:
    return {k: (tuple(v.shape), v.dtype) for k, v in kwargs.items()}


def _norms(model: nn.Module) -> list[str]:
    kinds = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.RMSNorm)
    return sorted(n for n, m in model.named_modules()
                  if isinstance(m, kinds) or type(m).__name__.endswith(("LayerNorm", "RMSNorm")))


def _captured_whole(model: nn.Module, rules: Any) -> set[str]:
    """The modules of the graph's sites; asserts the forward was exported whole."""
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export", report.capture.attempts
    return {s.module for s in report.sites if s.detected_by != "module_walk"}


GRANITE5 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                intermediate_size=64, num_mel_bins=16, subsample_layers=[1], vocab_size=48, context_size=16)


def test_stacked_mel_frames_take_the_width_of_the_input_projection(rules):
    # Granite Speech 5 projects delta-expanded mel frames stacked in pairs: Linear(num_mel_bins * 4), a width
    # no config key holds; the config's 16 mel bins (64, 16) fail, the first layer's (64, 64) runs
    model = _meta("GraniteSpeech5EncoderConfig", **GRANITE5)
    assert model.input_linear.in_features == 64
    _, said = infer_hf_inputs(model)
    assert said == "input_features float (2, 64, 64)"
    assert _captured_whole(model, rules) == set(_norms(model)) and len(_norms(model)) > 0


def test_codec_decoder_takes_latent_frames_of_its_first_convolution(rules):
    # VibeVoice's acoustic decoder declares main_input_name input_values but its forward takes latents
    # hidden_states (B, hidden_size, frames): the stem Conv1d's 32 input channels, not a (B, 1, T) waveform
    model = _meta("VibeVoiceAcousticTokenizerDecoderConfig", hidden_size=32, num_filters=8, depths=[1, 1, 1],
                  downsampling_ratios=[2, 2], channels=1)
    _, said = infer_hf_inputs(model)
    assert said == "hidden_states float (2, 32, 16)"
    assert _captured_whole(model, rules) == set(_norms(model)) == {
        f"{stage}.stage.0.{norm}" for stage in ("stem", "conv_layers.0", "conv_layers.1")
        for norm in ("norm", "ffn_norm")}  # one block of each of 3 stages: a mixer and an FFN norm


SPEECHT5 = dict(hidden_size=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=99)


def test_encoder_decoder_without_prenets_takes_hidden_states_on_both_sides(rules):
    # SpeechT5Model without pre-nets: input_values and decoder_input_values are (B, S, hidden_size), as its
    # model test builds them; the decoder cannot run without its own, so both are given, of one candidate
    model = _meta("SpeechT5Config", **SPEECHT5)
    kwargs, _ = infer_hf_inputs(model)
    assert _shapes(kwargs) == {"input_values": ((2, 64, 32), F), "decoder_input_values": ((2, 64, 32), F)}
    graphed = _captured_whole(model, rules)
    assert graphed == set(_norms(model))
    assert {"encoder.wrapped_encoder.layer_norm", "decoder.wrapped_decoder.layers.0.final_layer_norm"} <= graphed


def test_inputs_without_a_preprocessor_are_hidden_states_of_d_model():
    # Perceiver's AutoModel has no input preprocessor: ``inputs`` (B, S, d_model); no builder knows the name
    model = _meta("PerceiverConfig", num_latents=8, d_latents=32, d_model=24, num_blocks=1,
                  num_self_attends_per_block=1, num_self_attention_heads=4, num_cross_attention_heads=4,
                  qk_channels=None, v_channels=None)
    _, said = infer_hf_inputs(model)
    assert said == "inputs float (2, 16, 24)"


def test_token_models_get_no_width_candidates():
    # a text model's input_ids keep their own builder: no float hidden states are tried for it
    model = _meta("BertConfig", hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                  vocab_size=99)
    assert infer_hf_inputs(model)[1] == "input_ids int64 (2, 16)"


def test_trajectory_streams_are_sized_by_state_and_action_dims(rules):
    # Decision Transformer: states (B, T, state_dim), actions (B, T, act_dim), rewards and returns-to-go
    # (B, T, 1), timesteps (B, T) int64 below max_ep_len; all optional in forward, none runs without the rest
    model = _meta("DecisionTransformerConfig", state_dim=5, act_dim=3, hidden_size=32, n_layer=1, n_head=4,
                  max_ep_len=10)
    kwargs, _ = infer_hf_inputs(model)
    assert _shapes(kwargs) == {"states": ((2, 16, 5), F), "actions": ((2, 16, 3), F), "rewards": ((2, 16, 1), F),
                               "returns_to_go": ((2, 16, 1), F), "timesteps": ((2, 16), I)}
    assert int(kwargs["timesteps"].max()) == 9 and int(kwargs["timesteps"].min()) == 0
    graphed = _captured_whole(model, rules)
    assert graphed == set(_norms(model)) and "embed_ln" in graphed


def test_no_trajectory_without_a_state_dim():
    # a forward parameter named ``actions`` on a model whose config has no state_dim gets nothing built
    from normaudit.loaders.inputs.series import TRAJECTORY_BUILDERS

    cfg = transformers.BertConfig()
    assert [list(b(cfg)) for b in TRAJECTORY_BUILDERS.values()] == [[]] * 5


XCODEC2_SEMANTIC = dict(model_type="wav2vec2-bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, feature_projection_input_dim=160, output_hidden_size=32)


def test_codec_spectrogram_has_one_frame_per_hop_of_its_waveform():
    # XCodec2 concatenates its acoustic encoder's frames (mono waveform (B, 1, T), hop 2 * 2 * 4 = 16) with
    # its semantic encoder's (features (B, T / 16, 160)) frame by frame: 3200 samples give 200 frames
    model = _meta("Xcodec2Config", encoder_hidden_size=8, downsampling_ratios=[2, 2, 4], hidden_size=32,
                  semantic_model_config=XCODEC2_SEMANTIC, num_attention_heads=2, num_key_value_heads=2,
                  num_hidden_layers=1, head_dim=8, quantization_dim=64, quantization_levels=[4, 4, 4, 4])
    kwargs, said = infer_hf_inputs(model)
    assert said == "input_values float (2, 1, 3200), input_features float (2, 200, 160), input_features_mask bool (2, 200)"
    # without the mask (whose padding check reads a value, .item(), on meta) the meta forward runs whole on
    # them (its capture takes a minute); the features' former first candidate, 64 frames, breaks the
    # frame-by-frame concatenation
    params, unmasked = forward_params(model), {k: v for k, v in kwargs.items() if k != "input_features_mask"}
    assert runs_on_meta(model, params, unmasked)
    assert not runs_on_meta(model, params, {**unmasked, "input_features": torch.randn(2, 64, 160)})


DEPTH_PRO_TOWER = dict(model_type="dinov2", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, image_size=32, patch_size=8)


def test_image_side_holds_a_patch_at_the_smallest_scale():
    # DepthPro rescales the image by 0.25, 0.5 and 1 and cuts each copy into 32-pixel patches: the side is
    # 32 / 0.25 = 128 (its forward raises below that; the former 64 x 64 image is refused on meta)
    model = _meta("DepthProConfig", patch_size=32, scaled_images_ratios=[0.25, 0.5, 1.0],
                  scaled_images_overlap_ratios=[0.0, 0.5, 0.25], scaled_images_feature_dims=[32, 32, 32],
                  intermediate_hook_ids=[1, 0], intermediate_feature_dims=[16, 16], fusion_hidden_size=16,
                  image_model_config=DEPTH_PRO_TOWER, patch_model_config=DEPTH_PRO_TOWER,
                  fov_model_config=DEPTH_PRO_TOWER, use_fov_model=False)
    kwargs, said = infer_hf_inputs(model)
    assert said == "pixel_values float (2, 3, 128, 128)"
    params = forward_params(model)
    assert runs_on_meta(model, params, kwargs)
    assert not runs_on_meta(model, params, {"pixel_values": torch.randn(2, 3, 64, 64)})
