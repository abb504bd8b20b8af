"""Placeholder tokens in ``input_ids`` for the fusion of a multimodal model's towers.

A vision-language model gets as many image tokens per example as ``get_image_features`` returns features
(or one per merge window of its patch grid), Kosmos-2 style grounding its image positions and their mask,
an audio-language model as many audio tokens as ``get_audio_features`` returns; the counts are taken with
a forward on the meta device (:func:`with_placeholders`).
"""
from __future__ import annotations

import contextlib
import io
from typing import Any, Optional

import torch
from torch import nn

from normaudit.loaders.inputs.base import (BATCH, SEQ, TEXT_CONFIGS, VISION_CONFIGS, cfg_value, is_positive_int,
                                           random_ids)
from normaudit.loaders.inputs.signature import forward_params, on_meta


def image_token(config: Any) -> Optional[int]:
    """The id of a vision-language model's image placeholder token (``image_token_id`` or
    ``image_token_index`` of ``config``), or None when the config names none."""
    for key in ("image_token_id", "image_token_index"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v >= 0:
            return v
    return None


def _with_image_tokens(model: nn.Module, config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """For a vision-language model (an ``image_token_id``): ``input_ids`` with as many image placeholder
    tokens per example as ``get_image_features`` returns features per image (counted on the meta device)."""
    token = image_token(config)
    ids, pixels = kwargs.get("input_ids"), kwargs.get("pixel_values")
    if token is None or ids is None or pixels is None or not hasattr(model, "get_image_features"):
        return kwargs
    extra = {k: v for k, v in kwargs.items() if k not in ("input_ids", "pixel_values")}
    per_image = _image_feature_count(model, pixels, extra)
    grid = extra.get("image_grid_thw")
    if per_image is None and isinstance(grid, torch.Tensor):  # one token per merge window of the grid
        merge = int(cfg_value(config, ("spatial_merge_size", "merge_size"), VISION_CONFIGS, 1))
        per_image = int(grid[0].prod()) // (merge * merge)
    if per_image is None:
        return kwargs
    vocab = cfg_value(config, ("vocab_size",), TEXT_CONFIGS, 100)
    text = random_ids(min(int(vocab), 100, token) or 1, (BATCH, SEQ))
    image = torch.full((BATCH, per_image), token, dtype=torch.int64)
    return {**kwargs, "input_ids": torch.cat([image, text], dim=1)}


def with_placeholders(model: nn.Module, config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """``kwargs`` with the placeholder tokens the model's fusion of towers needs in ``input_ids``: image
    tokens (:func:`_with_image_tokens`), then audio tokens (:func:`_with_audio_tokens`)."""
    kwargs = _with_image_positions(config, kwargs, params)
    kwargs = _with_audio_tokens(model, config, _with_image_tokens(model, config, kwargs, params))
    return _with_token_types(config, kwargs, params)


def _video_token(config: Any) -> Optional[int]:
    for key in ("video_token_id", "video_token_index"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v >= 0:
            return v
    return None


def _with_token_types(config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """Where ``forward`` takes ``mm_token_type_ids`` and ``input_ids`` hold image or video placeholders:
    the modality of each token, 0 text, 1 image, 2 video, as the processors of the M-RoPE models return it
    beside ``input_ids`` (Qwen2-VL, GLM-4V: ``get_rope_index`` groups the placeholders of each image by it
    and refuses image inputs without it). ``kwargs`` unchanged otherwise or when already given."""
    ids = kwargs.get("input_ids")
    if "mm_token_type_ids" not in params or "mm_token_type_ids" in kwargs or not isinstance(ids, torch.Tensor):
        return kwargs
    types = torch.zeros_like(ids, dtype=torch.int64)
    for value, token in ((1, image_token(config)), (2, _video_token(config))):
        if token is not None:
            types[ids == token] = value
    if not bool(types.any()):
        return kwargs
    return {**kwargs, "mm_token_type_ids": types}


def _with_image_positions(config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """Kosmos-2 style grounding (``forward`` takes ``image_embeds_position_mask``): ``input_ids`` with
    ``latent_query_num`` image positions after the first token and the mask marking them (1 there, 0
    elsewhere), as Kosmos-2's model test builds them; the image features are written into those positions."""
    ids, latent = kwargs.get("input_ids"), getattr(config, "latent_query_num", None)
    if ("image_embeds_position_mask" not in params or "pixel_values" not in kwargs or not is_positive_int(latent)
            or not isinstance(ids, torch.Tensor) or ids.dim() != 2):
        return kwargs
    ids = torch.cat([ids[:, :1], random_ids(min(int(cfg_value(config, ("vocab_size",), TEXT_CONFIGS, 100)), 100),
                                      (BATCH, int(latent))), ids[:, 1:]], dim=1)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 1:1 + int(latent)] = True
    return {**kwargs, "input_ids": ids, "image_embeds_position_mask": mask}


def _audio_token(config: Any) -> Optional[int]:
    for key in ("audio_token_id", "audio_token_index"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v >= 0:
            return v
    return None


def _with_audio_tokens(model: nn.Module, config: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """For an audio-language model (``get_audio_features``) given ``input_features`` and ``input_ids``:
    with an ``audio_token_id``, ``input_ids`` holding one placeholder per audio feature of each example
    before the text (NeMo SpeechLM, Qwen2-Audio style: features scattered into the placeholders); with no
    audio token key at all, text as long as the audio features (Voxtral-Realtime adds them position by
    position). Counted on the meta device; ``kwargs`` unchanged when the count cannot be had."""
    ids, feats = kwargs.get("input_ids"), kwargs.get("input_features")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not isinstance(feats, torch.Tensor):
        return kwargs
    extra = {k: v for k, v in kwargs.items() if k not in ("input_ids", "input_features")}
    per_example = _feature_count(model, "get_audio_features", "input_features", feats, extra)
    if not per_example:
        return kwargs
    token = _audio_token(config)
    vocab = min(int(cfg_value(config, ("vocab_size",), TEXT_CONFIGS, 100)), 100)
    if token is not None:
        text = random_ids(min(vocab, token) or 1, (BATCH, SEQ))
        audio = torch.full((BATCH, per_example), token, dtype=torch.int64)
        return {**kwargs, "input_ids": torch.cat([audio, text], dim=1)}
    if any("audio" in k and "token" in k for k in vars(config)):  # a placeholder scheme not known here
        return kwargs
    return {**kwargs, "input_ids": random_ids(vocab, (BATCH, per_example))}


def _image_feature_count(model: nn.Module, pixels: torch.Tensor, extra: dict[str, Any]) -> Optional[int]:
    """Features one example's images give (``get_image_features`` on meta tensors), or None when it does
    not run. ``extra`` holds other image inputs (``image_grid_thw``) passed where the method takes them."""
    return _feature_count(model, "get_image_features", "pixel_values", pixels, extra)


def _feature_count(model: nn.Module, method: str, key: str, values: torch.Tensor,
                   extra: dict[str, Any]) -> Optional[int]:
    """Features per example that ``model.<method>(<key>=values, **extra)`` returns, run on meta tensors
    (``get_image_features`` / ``get_audio_features``), or None when it does not run or the model is not on
    the meta device. Only the ``extra`` inputs the method takes are passed."""
    if not on_meta(model) or not hasattr(model, method):
        return None
    takes = forward_params(getattr(model, method))
    more = {k: v.to("meta") if v.is_floating_point() else v for k, v in extra.items() if k in takes}
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            out = getattr(model, method)(**{key: values.to("meta")}, **more)
    except Exception:  # noqa: BLE001
        return None
    for attr in ("pooler_output", "last_hidden_state"):
        if not isinstance(out, torch.Tensor) and getattr(out, attr, None) is not None:
            out = getattr(out, attr)
            break
    if isinstance(out, (list, tuple)) and out and all(isinstance(t, torch.Tensor) for t in out):
        total = sum(int(t.reshape(-1, t.shape[-1]).shape[0]) for t in out)
    elif isinstance(out, torch.Tensor) and out.dim() >= 2:
        total = int(out.reshape(-1, out.shape[-1]).shape[0])
    else:
        return None
    return total // BATCH if total % BATCH == 0 else None
