"""Infer example inputs for a model that does not provide ``example_inputs()``.

From the first layer in ``named_modules()`` order: ``Embedding`` -> int64 ``(2, 16)``;
``Conv1d`` -> ``(2, C_in, 64)``; ``Conv2d`` -> ``(2, C_in, 64, 64)``; ``Conv3d`` -> ``(2, C_in, 16, 32, 32)``;
``Linear`` -> ``(2, in_features)``; a norm first -> ``(2, 16, *normalized_shape)`` or ``(2, C, 64, 64)``.
Hugging Face models (a ``config`` attribute and ``main_input_name``) get ``input_ids`` (plus
``decoder_input_ids`` for encoder-decoders) or ``pixel_values`` of the configured image size.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

BATCH, SEQ, SIDE = 2, 16, 64


def _ids(vocab: int, shape=(BATCH, SEQ)) -> torch.Tensor:
    return torch.randint(0, max(int(vocab), 1), shape, dtype=torch.int64)


def infer_hf_inputs(model: nn.Module) -> Optional[tuple[Any, str]]:
    """Inputs for a ``transformers.PreTrainedModel``, or None when the model is not one we know."""
    config = getattr(model, "config", None)
    name = getattr(model, "main_input_name", None)
    if config is None or name is None:
        return None
    if name == "input_ids":
        vocab = getattr(config, "vocab_size", None) or 100
        kwargs: dict[str, Any] = {"input_ids": _ids(min(vocab, 100))}
        text = f"input_ids int64 ({BATCH}, {SEQ})"
        if getattr(config, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = _ids(min(vocab, 100))
            text += f", decoder_input_ids int64 ({BATCH}, {SEQ})"
        return kwargs, text
    if name == "pixel_values":
        channels = getattr(config, "num_channels", 3)
        size = getattr(config, "image_size", 224)
        if isinstance(size, (list, tuple)):
            h, w = int(size[0]), int(size[1])
        else:
            h = w = int(size)
        return {"pixel_values": torch.randn(BATCH, channels, h, w)}, f"pixel_values float ({BATCH}, {channels}, {h}, {w})"
    return None


def infer_inputs(model: nn.Module) -> tuple[Any, str]:
    """Guess example inputs from the model's first layer.

    Returns ``(inputs, description)`` where inputs is a tuple (positional) or a dict (keyword) and the
    description says what was assumed, for the report. Raises ValueError when no first layer gives a clue.
    """
    hf = infer_hf_inputs(model)
    if hf is not None:
        return hf
    for _, mod in model.named_modules():
        if isinstance(mod, nn.Embedding):
            return (_ids(min(mod.num_embeddings, 100)),), f"int64 token ids ({BATCH}, {SEQ}) from the first layer Embedding({mod.num_embeddings}, {mod.embedding_dim})"
        if isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d)):
            shape = (BATCH, mod.in_channels, SIDE)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}(in_channels={mod.in_channels})"
        if isinstance(mod, (nn.Conv2d, nn.ConvTranspose2d)):
            shape = (BATCH, mod.in_channels, SIDE, SIDE)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}(in_channels={mod.in_channels})"
        if isinstance(mod, (nn.Conv3d, nn.ConvTranspose3d)):
            shape = (BATCH, mod.in_channels, 16, 32, 32)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}(in_channels={mod.in_channels})"
        if isinstance(mod, nn.Linear):
            shape = (BATCH, mod.in_features)
            return (torch.randn(shape),), f"float {shape} from the first layer Linear(in_features={mod.in_features})"
        if isinstance(mod, (nn.LayerNorm, nn.RMSNorm)) and mod.normalized_shape:
            shape = (BATCH, SEQ, *mod.normalized_shape)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}{tuple(mod.normalized_shape)}"
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.num_features:
            shape = (BATCH, mod.num_features, SIDE, SIDE) if isinstance(mod, nn.BatchNorm2d) else (BATCH, mod.num_features)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}({mod.num_features})"
    raise ValueError("cannot infer example inputs from the first layer; define example_inputs() in the model file")
