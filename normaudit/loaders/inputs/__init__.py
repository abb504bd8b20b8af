"""Example inputs for a model that does not provide ``example_inputs()``.

:func:`infer_inputs` takes, in order: the inputs of a Hugging Face model (a ``config`` attribute and a
``main_input_name``: :func:`infer_hf_inputs`), the input size the model declares (timm's
``pretrained_cfg['input_size']``), else the first layer in ``named_modules()`` order: ``Embedding`` ->
int64 ``(2, 16)``; ``Conv1d`` -> ``(2, C_in, 64)``; ``Conv2d`` -> ``(2, C_in, 64, 64)``; ``Conv3d`` ->
``(2, C_in, 16, 32, 32)``; ``Linear`` -> ``(2, in_features)``; a norm first -> ``(2, 16, *normalized_shape)``
or ``(2, C, 64, 64)``.

A Hugging Face model gets the inputs its ``forward`` takes, sized from the config and its nested
``text_config``/``vision_config``/``audio_config`` sub-configs as transformers' own model tests build them,
one module per kind of input: token ids and word boxes (:mod:`.text`), images, videos and patch lists
(:mod:`.vision`), spectrograms and waveforms (:mod:`.audio`), forecaster windows and trajectories
(:mod:`.series`), other models' outputs and prompts (:mod:`.companions`); :mod:`.builders` chooses which
``forward`` parameters to build and with what, :mod:`.placeholders` puts the image and audio placeholder
tokens into ``input_ids``, :mod:`.hf` tries the candidate layouts on the meta device (no weight memory) and
keeps the first that runs. :mod:`.base` holds the shared sizes and config readers, :mod:`.signature` what a
``forward`` takes.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from normaudit.loaders.inputs.base import BATCH, SEQ, SIDE, random_ids
from normaudit.loaders.inputs.hf import infer_hf_inputs, main_tower_inputs
from normaudit.loaders.inputs.signature import forward_kwargs, forward_params
from normaudit.loaders.inputs.vision import declared_input_size

__all__ = ["declared_input_size", "forward_kwargs", "forward_params", "infer_hf_inputs", "infer_inputs",
           "main_tower_inputs"]


def infer_inputs(model: nn.Module) -> tuple[Any, str]:
    """Guess example inputs: a Hugging Face model's (:func:`infer_hf_inputs`), else the input size the model
    declares (:func:`declared_input_size`), else from its first layer.

    Returns ``(inputs, description)`` where inputs is a tuple (positional) or a dict (keyword) and the
    description says what was assumed, for the report. Raises ValueError when no first layer gives a clue.
    """
    hf = infer_hf_inputs(model)
    if hf is not None:
        return hf
    declared = declared_input_size(model)
    if declared is not None:
        shape = (BATCH, *declared[0])
        return (torch.randn(shape),), f"float {shape} from the model's {declared[1]}['input_size']"
    for _, mod in model.named_modules():
        if isinstance(mod, nn.Embedding):
            return (random_ids(min(mod.num_embeddings, 100)),), f"int64 token ids ({BATCH}, {SEQ}) from the first layer Embedding({mod.num_embeddings}, {mod.embedding_dim})"
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
