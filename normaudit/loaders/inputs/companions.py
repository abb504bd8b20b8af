"""Builders for the ``forward`` inputs of Hugging Face models that are neither text, images nor audio: another
model's outputs a model is run on (a Q-Former's ``encoder_hidden_states``, a drafter's ``context_hidden_states``,
LXMERT's detector regions ``visual_feats``/``visual_pos``), embeddings given in place of token ids
(``query_embeds``, ``noise_embeds``), task and class prompts (OneFormer's ``task_inputs``, OmDet-Turbo's
per-image class prompts and their ``classes_structure``), sized as transformers' own model tests build them.

Each builder maps the model's config to candidate tensors, first choice first, as
:data:`normaudit.loaders.inputs.builders.BUILDERS` does; :func:`normaudit.loaders.inputs.hf.infer_hf_inputs`
tries them for a required parameter of that name (:data:`COMPANION_BUILDERS`). :data:`COMPANION_EXTRAS` names the
optional parameters whose builders give something only for a config that describes that input (a
``visual_feat_dim``, an ``encoder_hidden_size``): a forward that raises without them (LXMERT's
``visual_feats cannot be None``, a Q-Former's cross-attention) gets them where ``forward`` takes them.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from normaudit.loaders.inputs.base import BATCH, SEQ, cfg_value, random_ids
from normaudit.loaders.inputs.vision import images

#: the sub-config that holds the text model's width and vocabulary
_TEXT = ("text_config",)
#: regions of a detector's region features (LXMERT's tester: 10; any count runs)
REGIONS = 8


def _hidden(config: Any) -> int:
    """The model's width: ``hidden_size`` (or ``d_model``) of the config or its text sub-config; 64 else."""
    return int(cfg_value(config, ("hidden_size", "d_model"), _TEXT, 64))


def _embeddings(config: Any) -> Iterator[torch.Tensor]:
    """Embeddings given in place of token ids (a Q-Former's learned ``query_embeds``, a diffusion drafter's
    ``noise_embeds``): float ``(B, S, hidden_size)``."""
    yield torch.randn(BATCH, SEQ, _hidden(config))


def _encoder_states(config: Any) -> Iterator[torch.Tensor]:
    """The outputs of another encoder a model cross-attends to, for a model whose config sizes them: float
    ``(B, S, encoder_hidden_size)`` (BLIP-2's Q-Former reads its image encoder's features so), or
    ``(B, S, hidden_size)`` for a decoder built with ``add_cross_attention``. Nothing for any other config
    (a model that does not cross-attend runs without them)."""
    width = cfg_value(config, ("encoder_hidden_size",), _TEXT)
    if width is None and getattr(config, "add_cross_attention", False):
        width = _hidden(config)
    if isinstance(width, int) and width > 0:
        yield torch.randn(BATCH, SEQ, width)


def _context_states(config: Any) -> Iterator[torch.Tensor]:
    """Hidden states of the target model's layers a speculative drafter conditions on, concatenated on the
    last dim: float ``(B, S, hidden_size * len(target_layer_ids))`` (DFlash drafters' docstring), ``(B, S,
    hidden_size)`` when the config names no target layers."""
    layers = getattr(config, "target_layer_ids", None)
    count = len(layers) if isinstance(layers, (list, tuple)) and layers else 1
    yield torch.randn(BATCH, SEQ, _hidden(config) * count)


def _region_features(config: Any) -> Iterator[torch.Tensor]:
    """A detector's region-of-interest features (LXMERT's ``visual_feats``): float ``(B, R,
    visual_feat_dim)``; nothing for a config without ``visual_feat_dim``."""
    dim = getattr(config, "visual_feat_dim", None)
    if isinstance(dim, int) and dim > 0:
        yield torch.randn(BATCH, REGIONS, dim)


def _region_boxes(config: Any) -> Iterator[torch.Tensor]:
    """The boxes of those regions (LXMERT's ``visual_pos``): float ``(B, R, visual_pos_dim)`` in [0, 1]
    (normalised corner coordinates); nothing for a config without ``visual_pos_dim``."""
    dim = getattr(config, "visual_pos_dim", None)
    if isinstance(dim, int) and dim > 0:
        yield torch.rand(BATCH, REGIONS, dim)


def _task_tokens(config: Any) -> Iterator[torch.Tensor]:
    """Token ids of a task prompt (OneFormer's ``task_inputs``, "the task is semantic" tokenised to
    ``task_seq_len``): int64 ``(B, task_seq_len)`` below the text encoder's vocabulary (ids < 100)."""
    length = cfg_value(config, ("task_seq_len",), default=SEQ)
    vocab = cfg_value(config, ("text_encoder_vocab_size", "vocab_size"), _TEXT, 100)
    yield random_ids(min(int(vocab), 100), (BATCH, int(length)))


def _prompt_mask(config: Any) -> Iterator[torch.Tensor]:
    """The attention mask of a prompt's token ids built by the ``input_ids`` builder (OmDet-Turbo's
    ``tasks_attention_mask``, ``classes_attention_mask``): int64 ones ``(B, S)``, every token valid."""
    yield torch.ones(BATCH, SEQ, dtype=torch.int64)


def _prompt_structure(config: Any) -> Iterator[torch.Tensor]:
    """How many of the flattened class prompts belong to each example (OmDet-Turbo's ``classes_structure``;
    its ``classes_input_ids`` are ``(sum(structure), S)``): int64 ones ``(B,)``, one prompt per example,
    as the ``(B, S)`` class ids the ``input_ids`` builder gives hold."""
    yield torch.ones(BATCH, dtype=torch.int64)


def _image_sets(config: Any) -> Iterator[torch.Tensor]:
    """A set of images per example for a model that cross-attends to each example's images (IDEFICS):
    float ``(B, 1, C, H, W)``, one image each, sized as :func:`normaudit.loaders.inputs.vision.images` sizes
    one."""
    for image in images(config):
        if image.dim() == 4:
            yield image.unsqueeze(1)


def _image_set_mask(config: Any) -> Iterator[torch.Tensor]:
    """Which of its images each text token attends to (IDEFICS' ``image_attention_mask``): int64 ones
    ``(B, S, 1)``, every token to the example's one image."""
    yield torch.ones(BATCH, SEQ, 1, dtype=torch.int64)


#: forward parameter -> candidate tensors built from the config, first choice first
COMPANION_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "query_embeds": _embeddings, "noise_embeds": _embeddings,
    "encoder_hidden_states": _encoder_states, "context_hidden_states": _context_states,
    "visual_feats": _region_features, "visual_pos": _region_boxes,
    "task_inputs": _task_tokens,
    "tasks_attention_mask": _prompt_mask, "classes_attention_mask": _prompt_mask,
    "classes_structure": _prompt_structure,
}
#: optional forward parameters built whenever ``forward`` takes them and their builder gives something for
#: the config (it describes that input): the model raises or leaves a tower un-run without them
COMPANION_EXTRAS: tuple[str, ...] = ("visual_feats", "visual_pos", "encoder_hidden_states")
#: when ``forward`` takes the key, the inputs are built by the value's builders instead (as
#: :data:`normaudit.loaders.inputs.vision.VISION_VARIANTS`): a forward that can take precomputed
#: image-encoder embeddings beside per-token image masks cross-attends to a set of images per example
COMPANION_VARIANTS: dict[str, dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = {
    "image_encoder_embeddings": {"pixel_values": _image_sets, "image_attention_mask": _image_set_mask},
}
