"""Which inputs to build for a Hugging Face model's ``forward``, and the builder of each.

:data:`BUILDERS` maps parameter names to the builders of the modality modules (config -> candidate tensors,
first choice first); :data:`VARIANTS` names builders that replace them when ``forward`` takes a key
parameter (patch-list vision towers). :func:`forward_builders` adds those the signature calls for
(parameters named after a known kind, required ``int`` parameters, a main input under another name, the
feature widths a model declares); :func:`wanted_inputs` chooses the parameters to build.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from normaudit.loaders.inputs.audio import AUDIO_BUILDERS
from normaudit.loaders.inputs.base import (AUDIO_TOWERS, BATCH, FRAMES, SEQ, TEXT_CONFIGS, VISION_CONFIGS,
                                           cfg_value, is_positive_int)
from normaudit.loaders.inputs.companions import COMPANION_BUILDERS, COMPANION_EXTRAS, COMPANION_VARIANTS
from normaudit.loaders.inputs.series import SERIES_BUILDERS, TRAJECTORY_BUILDERS
from normaudit.loaders.inputs.signature import main_input_name, named_params, required_params
from normaudit.loaders.inputs.text import TEXT_BUILDERS
from normaudit.loaders.inputs.vision import IMAGE_SIZE_KEYS, VISION_BUILDERS, VISION_VARIANTS

#: forward parameter -> candidate tensors built from the config, first choice first
BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    **TEXT_BUILDERS, **VISION_BUILDERS, **AUDIO_BUILDERS, **SERIES_BUILDERS, **TRAJECTORY_BUILDERS,
}
#: when ``forward`` takes the key, the inputs are built by the value's builders instead
VARIANTS: dict[str, dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = {**VISION_VARIANTS, **COMPANION_VARIANTS}
#: optional forward inputs built whenever ``forward`` takes them, as they switch on a part of the model the
#: main input alone leaves un-run (a forecaster's decoder runs on ``future_values``); left out when their
#: builder gives nothing for this config (no static features, no ``visual_feat_dim``)
EXTRAS = ("future_values", "future_time_features", "static_categorical_features", "static_real_features",
          "lang_ids", "bbox", *TRAJECTORY_BUILDERS, *COMPANION_EXTRAS)
#: inputs given besides ``main_input_name`` when ``forward`` takes them: the other towers of a multimodal model
COMPANIONS = ("input_ids", "pixel_values", "input_features", "pixel_values_videos", "input_values")


#: name endings of required ``forward`` parameters that are one more input of a known kind: a second text
#: stream (InstructBLIP's ``qformer_input_ids``), a prompt image and its masks (SegGPT's
#: ``prompt_pixel_values``, ``prompt_masks``: image-shaped, as its model test builds them)
SUFFIX_BUILDERS: tuple[tuple[str, str], ...] = (("input_ids", "input_ids"), ("pixel_values", "pixel_values"),
                                                ("_masks", "pixel_values"))


def _with_suffix_builders(params: dict[str, inspect.Parameter],
                          builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> None:
    """Give the required parameters of ``forward`` no builder knows by name the builder of the input kind
    their name ends with (:data:`SUFFIX_BUILDERS`), in place."""
    for name in required_params(params):
        if name in builders:
            continue
        kind = next((k for end, k in SUFFIX_BUILDERS if name.endswith(end) and k in builders), None)
        if kind is not None:
            builders[name] = builders[kind]


#: values tried, first choice first, for a required ``int`` parameter of ``forward`` (an index into the
#: model's own tables: Bark's fine model predicts codebook ``codebook_idx``, refuses 0, the coarse model's,
#: and picks ``lm_heads[codebook_idx - n_codes_given]``); a meta forward keeps the first the model accepts
INT_CANDIDATES = (1, 0)


def _is_int_annotation(param: inspect.Parameter) -> bool:
    return param.annotation is int or param.annotation == "int"


def _with_int_builders(params: dict[str, inspect.Parameter],
                       builders: dict[str, Callable[[Any], Iterator[Any]]]) -> None:
    """Give each required ``int`` parameter of ``forward`` no builder knows the :data:`INT_CANDIDATES`, in
    place: without it such a model gets no inputs at all (Bark's fine model, whose ``main_input_name`` is
    its int ``codebook_idx``). The candidates are plain ints, passed as such (export keeps them constant)."""
    for name in required_params(params):
        if name not in builders and _is_int_annotation(params[name]):
            builders[name] = lambda config: iter(INT_CANDIDATES)


def _with_renamed_main(model: nn.Module, params: dict[str, inspect.Parameter],
                       builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> None:
    """When ``forward`` does not name ``main_input_name`` and no required parameter has a builder, give the
    first required parameter the builder of the main input, in place: VibeVoice's acoustic tokenizer
    encoder declares ``input_values`` but its forward takes the waveform as ``hidden_states`` ``(B, 1, T)``.
    Not for an ``input_ids`` main input (the name towers inherit from ``PreTrainedModel`` whatever they take)."""
    main, required = main_input_name(model), required_params(params)
    if (main in named_params(params) or main == "input_ids" or main not in builders or not required
            or any(n in builders for n in required)):
        return
    builders[required[0]] = builders[main]


#: main inputs that are float features of some width (a waveform, a spectrogram), given the widths the model
#: declares (:func:`_width_candidates`) after their own candidates
_FEATURE_INPUTS = ("input_values", "input_features")


def _first_layer_width(model: nn.Module) -> Optional[torch.Tensor]:
    """The input the model's first ``Linear``/``Conv1d`` (in ``named_modules()`` order) takes: ``(B, FRAMES,
    in_features)`` for a ``Linear`` (Granite Speech 5 projects 4 stacked delta-expanded mel frames, a width
    no config key holds), ``(B, in_channels, SEQ)`` for a ``Conv1d`` (a codec decoder's latents ``(B, latent
    channels, frames)``). None when no such layer comes before an ``Embedding``."""
    for _, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            return None
        if isinstance(module, nn.Linear):
            return torch.randn(BATCH, FRAMES, module.in_features)
        if isinstance(module, nn.Conv1d):
            return torch.randn(BATCH, module.in_channels, SEQ)
    return None


def _width_candidates(model: nn.Module, config: Any) -> Iterator[torch.Tensor]:
    """Main-input candidates for a model whose input is already features of a width it declares, not raw
    data: the first layer's input (:func:`_first_layer_width`), then hidden states ``(B, SEQ, width)`` of the
    config's ``hidden_size``/``d_model`` (SpeechT5 without pre-nets takes ``input_values`` so, Perceiver
    without a preprocessor its ``inputs``, as their model tests build them)."""
    first = _first_layer_width(model)
    if first is not None:
        yield first
    width = cfg_value(config, ("d_model", "hidden_size"))
    if is_positive_int(width) and 0 < int(width) <= 65536:
        yield torch.randn(BATCH, SEQ, int(width))


def _feature_main(model: nn.Module, params: dict[str, inspect.Parameter],
                  builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> Optional[str]:
    """The forward parameter that takes the main input when that is float features: ``main_input_name``
    (one of :data:`_FEATURE_INPUTS`, or a name no builder knows: Perceiver's ``inputs``), or the required
    parameter given its builder by :func:`_with_renamed_main`. None otherwise (token ids, images)."""
    main = main_input_name(model)
    if main is None or (main in builders and main not in _FEATURE_INPUTS):
        return None
    if main in named_params(params):
        return main
    return next((n for n in required_params(params) if main in builders and builders.get(n) is builders[main]), None)


def _with_width_inputs(model: nn.Module, params: dict[str, inspect.Parameter],
                       builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> None:
    """Give the float-features main input (:func:`_feature_main`) the widths the model declares
    (:func:`_width_candidates`) after its own candidates, in place; an encoder-decoder's
    ``decoder_<main>`` (SpeechT5's ``decoder_input_values``, which its decoder cannot run without) gets the
    same builder, so both take the same candidate (:func:`~normaudit.loaders.inputs.hf._combinations` ties
    inputs of one builder)."""
    target = _feature_main(model, params, builders)
    if target is None:
        return
    own = builders.get(target)

    def chained(config: Any) -> Iterator[torch.Tensor]:
        seen: list[tuple[int, ...]] = []
        for t in [*(own(config) if own else ()), *_width_candidates(model, config)]:
            if tuple(t.shape) not in seen:
                seen.append(tuple(t.shape))
                yield t

    builders[target] = chained
    twin = "decoder_" + target
    if twin in named_params(params) and getattr(model.config, "is_encoder_decoder", False):
        builders[twin] = chained


def wanted_inputs(model: nn.Module, config: Any, params: dict[str, inspect.Parameter],
            builders: Optional[dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = None,
            extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """The forward inputs to build: the main input, the other modalities' inputs, decoder inputs.

    The main input is ``main_input_name`` when ``forward`` names it; else (a tower that inherits
    ``input_ids`` as its main input name but takes ``pixel_values``/``hidden_states``) the first required
    parameter a builder knows. A required parameter ``forward`` cannot run without, that a builder knows,
    is added too (``grid_thw``, ``merge_sizes``)."""
    builders = BUILDERS if builders is None else builders
    named, required = named_params(params), required_params(params)
    main = main_input_name(model)
    if named and main not in named:
        main = next((n for n in required if n in builders), None)
    names = [main] if main in builders else []
    for extra in COMPANIONS:
        if extra in params and extra not in names and _has_modality(config, extra):
            names.append(extra)
    if getattr(config, "is_encoder_decoder", False):
        names += [n for n in ("decoder_input_ids", f"decoder_{main}") if n in params and n in builders
                  and n not in names]
    names += [n for n in required if n in builders and n not in names and names]
    names += [n for n in extras if n in params and n in builders and n not in names and names]
    return names


def _has_modality(config: Any, name: str) -> bool:
    """Whether the config describes the tower that takes ``name`` (a vision sub-config, a text vocabulary)."""
    if name == "pixel_values":  # a vision sub-config, or image sizes in the config itself (ViLT; LayoutLMv3's
        # ``input_size``: without its image, the patch embedding's LayerNorm and ``norm`` never ran)
        return (any(getattr(config, s, None) is not None for s in VISION_CONFIGS)
                or (getattr(config, "patch_size", None) is not None
                    and any(getattr(config, k, None) is not None for k in IMAGE_SIZE_KEYS)))
    if name in ("input_features", "input_values"):
        return any(getattr(config, s, None) is not None for s in AUDIO_TOWERS)
    if name == "pixel_values_videos":
        return getattr(config, "video_config", None) is not None
    return cfg_value(config, ("vocab_size",), TEXT_CONFIGS) is not None


def forward_builders(model: nn.Module,
                     params: dict[str, inspect.Parameter]) -> dict[str, Callable[[Any], Iterator[torch.Tensor]]]:
    """The builder of each input ``model.forward`` (parameters ``params``) may be given: the companions'
    (:data:`~normaudit.loaders.inputs.companions.COMPANION_BUILDERS`) and :data:`BUILDERS`, replaced by the
    :data:`VARIANTS` of the key parameters ``forward`` takes, then completed for its required parameters named
    after a known kind (:func:`_with_suffix_builders`) or annotated ``int`` (:func:`_with_int_builders`), a
    main input under another name (:func:`_with_renamed_main`) and the feature widths the model declares
    (:func:`_with_width_inputs`)."""
    builders = {**COMPANION_BUILDERS, **BUILDERS}
    for key, variant in VARIANTS.items():
        if key in params:
            builders.update(variant)
    _with_suffix_builders(params, builders)
    _with_int_builders(params, builders)
    _with_renamed_main(model, params, builders)
    _with_width_inputs(model, params, builders)
    return builders
