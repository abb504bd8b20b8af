"""Example inputs for a Hugging Face model, sized from its config as transformers' own model tests build them.

:func:`infer_hf_inputs` gives each input :func:`~normaudit.loaders.inputs.builders.wanted_inputs` names the
candidates of its builder; on a meta model the combinations are tried with a forward on meta tensors (no
weight memory) and the first that runs is kept; then ``input_ids`` get the placeholder tokens the fusion
of the towers needs. :func:`main_tower_inputs` gives the main tower's inputs alone, for a retry when the
multimodal forward cannot be captured.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterator, Optional

import torch
from torch import nn

from normaudit.loaders.inputs.audio import with_aligned_frames
from normaudit.loaders.inputs.base import BATCH, SEQ, TEXT_CONFIGS, cfg_value, random_ids
from normaudit.loaders.inputs.builders import EXTRAS, VARIANTS, forward_builders, wanted_inputs
from normaudit.loaders.inputs.placeholders import image_token, with_placeholders
from normaudit.loaders.inputs.signature import forward_params, main_input_name, named_params, on_meta, runs_on_meta
from normaudit.loaders.inputs.vision import with_declared_image_size


def _describe(kwargs: dict[str, Any]) -> str:
    def one(k: str, v: Any) -> str:
        if not isinstance(v, torch.Tensor):
            return f"{k} = {v!r}"
        kind = "int64" if v.dtype == torch.int64 else "bool" if v.dtype == torch.bool else "float"
        return f"{k} {kind} {tuple(v.shape)}"

    return ", ".join(one(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor) or _is_plain_int(v))


def _is_plain_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def infer_hf_inputs(model: nn.Module) -> Optional[tuple[Any, str]]:
    """Inputs for a ``transformers.PreTrainedModel``, or None when the model is not one we know.

    Returns ``(kwargs, description)``. Each input named by :func:`wanted_inputs` gets the candidates of its
    builder (:func:`~normaudit.loaders.inputs.builders.forward_builders`); on a meta model the combinations
    are tried with a forward on meta tensors and the first that runs is kept (else the first candidates). Vision-language models get image placeholder
    tokens in ``input_ids``, audio-language models audio ones (:func:`with_placeholders`). Never raises.
    """
    config = getattr(model, "config", None)
    name = main_input_name(model)
    if config is None or name is None:
        return None
    params = forward_params(model)
    builders = forward_builders(model, params)
    names = wanted_inputs(model, config, params, builders, EXTRAS)
    if not names:
        return None
    if any(n in names for n in ("pixel_values", "hidden_states")):  # the grid of a patch list goes with it
        names += [n for key, variant in VARIANTS.items() if key in params
                  for n in variant if n in params and n not in names]
    sized = with_declared_image_size(model, config)
    choices = {n: list(builders[n](sized)) for n in names}
    choices = {n: c for n, c in choices.items() if c or n not in EXTRAS}
    with_aligned_frames(sized, choices)
    if any(not c for c in choices.values()):
        return None
    first = _with_masks(params, {n: c[0] for n, c in choices.items()})[0]
    kwargs = _pick(model, params, choices, {n: builders[n] for n in choices}) or first
    kwargs = with_placeholders(model, config, kwargs, params)
    return kwargs, _describe(kwargs)


#: required forward parameters ending so are masks over the time axis of the input they name the prefix
#: of (``input_features_mask``, ``audio_mel_mask``): all positions valid
_MASK_SUFFIX = "_mask"


def _with_masks(params: dict[str, inspect.Parameter], combo: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """``combo`` completed with the ``<input>_mask`` parameters of ``forward`` (all ones, bool,
    over the time axis of ``<input>``): one candidate with the time axis at dim 1 (``(B, T, F)``), one at
    the last dim (``(B, mel, T)``). ``[combo]`` when ``forward`` takes no such mask. Optional masks are
    given too: NeMo SpeechLM counts audio frames from ``input_features_mask`` although it defaults to None."""
    masks = [(n, n[: -len(_MASK_SUFFIX)]) for n in named_params(params)
             if n.endswith(_MASK_SUFFIX) and n[: -len(_MASK_SUFFIX)] in combo and n not in combo]
    if not masks:
        return [combo]
    out = []
    for dim in (1, -1):
        extra = {m: torch.ones(BATCH, combo[src].shape[dim], dtype=torch.bool)
                 for m, src in masks if combo[src].dim() >= 3}
        if len(extra) == len(masks):
            out.append({**combo, **extra})
    return out or [combo]


#: inputs of the other towers of a multimodal model, left out by :func:`main_tower_inputs`
_TOWER_INPUTS = ("pixel_values", "pixel_values_videos", "input_features", "input_values", "image_grid_thw",
                 "video_grid_thw", "grid_thw", "merge_sizes", "audio_mel", "target_sizes",
                 "spatial_shapes", "pixel_attention_mask")


def main_tower_inputs(model: nn.Module, kwargs: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The keyword inputs of ``model``'s main tower only (a vision-language model's text, without its image
    inputs and their placeholder tokens), for a retry when the multimodal forward cannot be captured: the
    towers left out are then captured alone as parts the forward never called. None when ``kwargs`` hold
    no other tower's inputs, or the main input is one of them."""
    params = forward_params(model)
    main = main_input_name(model)
    if main not in named_params(params) or main in _TOWER_INPUTS:
        return None
    drop = {k for k in kwargs if k in _TOWER_INPUTS}
    drop |= {k for k in kwargs if k.endswith(_MASK_SUFFIX) and k[: -len(_MASK_SUFFIX)] in drop}
    if not drop:
        return None
    out = {k: v for k, v in kwargs.items() if k not in drop}
    token = image_token(getattr(model, "config", None))
    ids = out.get("input_ids")
    if token is not None and isinstance(ids, torch.Tensor) and bool((ids == token).any()):
        vocab = cfg_value(model.config, ("vocab_size",), TEXT_CONFIGS, 100)
        out["input_ids"] = random_ids(min(int(vocab), 100, token) or 1, (BATCH, SEQ))  # no image placeholders
    return out


def _combinations(choices: dict[str, list[torch.Tensor]], limit: int = 16,
                  ties: Optional[dict[str, Any]] = None) -> Iterator[dict[str, torch.Tensor]]:
    """Candidate input sets: every main-input candidate with the first of the others, then each other
    input's further candidates with the first of the rest (a companion's layout: CLVP's ``(B, mel, T)``
    features beside its text), then fewer inputs. At most ``limit`` sets. Inputs with the same ``ties``
    value (built by one builder: SegGPT's input and prompt images) take the same candidate together."""
    names = list(choices)
    ties = ties or {}
    count, done = 0, set()
    for name in names:
        group = [n for n in names if n == name or (n in ties and ties[n] == ties.get(name))]
        if done & set(group):
            continue
        done |= set(group)
        for i in range(1 if name != names[0] else 0, len(choices[name])):
            yield {n: choices[n][i] if n in group and i < len(choices[n]) else choices[n][0] for n in names}
            count += 1
            if count >= limit:
                return
    for n in names[1:]:  # a companion that breaks the forward is left out
        if count >= limit:
            return
        yield {k: choices[k][0] for k in names if k != n}
        count += 1


def _pick(model: nn.Module, params: dict, choices: dict[str, list[torch.Tensor]],
          ties: Optional[dict[str, Any]] = None) -> Optional[dict[str, Any]]:
    """The first combination a meta forward accepts (only for a model on the meta device), else None."""
    if not on_meta(model):
        return None
    for combo in _combinations(choices, ties=ties):
        for candidate in _with_masks(params, combo):
            if runs_on_meta(model, params, with_placeholders(model, model.config, candidate, params)):
                return candidate
    return None
