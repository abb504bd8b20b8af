"""Builders for the required ``forward`` inputs of Hugging Face models that are neither text, images nor
audio: another model's outputs a model is run on (a cross-attention's ``encoder_hidden_states``, LXMERT's
``visual_feats``/``visual_pos``), task and class prompts (OneFormer's ``task_inputs``), and the like.

Each builder maps the model's config to candidate tensors, first choice first, as
:data:`normaudit.target.inputs.BUILDERS` does; :func:`normaudit.target.inputs.infer_hf_inputs` tries them
for a required parameter of that name.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

#: forward parameter -> candidate tensors built from the config, first choice first
COMPANION_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {}
