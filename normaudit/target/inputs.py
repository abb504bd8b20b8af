"""Infer example inputs for a model that does not provide ``example_inputs()``.

From the first layer in ``named_modules()`` order: ``Embedding`` -> int64 ``(2, 16)``;
``Conv1d`` -> ``(2, C_in, 64)``; ``Conv2d`` -> ``(2, C_in, 64, 64)``; ``Conv3d`` -> ``(2, C_in, 16, 32, 32)``;
``Linear`` -> ``(2, in_features)``; a norm first -> ``(2, 16, *normalized_shape)`` or ``(2, C, 64, 64)``.

Hugging Face models (a ``config`` attribute and ``main_input_name``) get the inputs their ``forward``
takes, sized from the config and its nested ``text_config``/``vision_config``/``audio_config`` sub-configs,
as transformers' own model tests build them (:func:`infer_hf_inputs`): ``input_ids``, ``pixel_values``
``(B, num_channels, H, W)`` (``(B, num_frames, C, H, W)`` for video models), ``input_features``
``(B, num_mel_bins, frames)`` or ``(B, frames, features)``, ``input_values`` ``(B, samples)``,
``decoder_input_ids`` for encoder-decoders, image placeholder tokens for vision-language models.
Where a layout is ambiguous the candidates are tried on the meta device (no weight memory) and the first
that runs is kept.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

BATCH, SEQ, SIDE = 2, 16, 64
#: audio samples of a raw-waveform input (0.2 s at 16 kHz; wav2vec2's feature encoder strides by 320)
SAMPLES = 3200
#: spectrogram frames of a (B, frames, features) input (speech_to_text subsamples by 4)
FRAMES = 64

_TEXT = ("text_config",)
_VISION = ("vision_config", "image_config")
_AUDIO = ("audio_config", "speech_config")


def _ids(vocab: int, shape=(BATCH, SEQ)) -> torch.Tensor:
    return torch.randint(0, max(int(vocab), 1), shape, dtype=torch.int64)


def _configs(config: Any, subs: tuple[str, ...]) -> list[Any]:
    """The sub-configs named in ``subs`` that ``config`` has, then ``config`` itself."""
    found = [getattr(config, s, None) for s in subs]
    return [c for c in found if c is not None and not isinstance(c, (dict, str))] + [config]


def cfg_value(config: Any, names: tuple[str, ...], subs: tuple[str, ...] = (), default: Any = None) -> Any:
    """The first of ``names`` set (not None) on the sub-configs ``subs`` of ``config``, then on ``config``."""
    for c in _configs(config, subs):
        for n in names:
            v = getattr(c, n, None)
            if v is not None:
                return v
    return default


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _pair(size: Any) -> tuple[int, int]:
    if isinstance(size, dict):
        size = size.get("height", size.get("shortest_edge", SIDE)), size.get("width", size.get("shortest_edge", SIDE))
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def _text_ids(config: Any) -> torch.Tensor:
    vocab = cfg_value(config, ("vocab_size",), _TEXT, 100)
    return _ids(min(int(vocab), 100))


def _image(config: Any) -> torch.Tensor:
    """``(B, C, H, W)``, or ``(B, T, C, H, W)`` for a video model (``num_frames`` in the config)."""
    channels = int(cfg_value(config, ("num_channels", "in_channels", "input_channels"), _VISION, 3))
    h, w = _pair(cfg_value(config, ("image_size", "input_size", "img_size"), _VISION, SIDE))
    frames = cfg_value(config, ("num_frames",), _VISION)
    if isinstance(frames, int) and frames > 0:
        return torch.randn(BATCH, frames, channels, h, w)
    return torch.randn(BATCH, channels, h, w)


def _features(config: Any) -> Iterator[torch.Tensor]:
    """Spectrogram candidates: Whisper-style ``(B, mel, 2 * max_source_positions)``, Qwen3-ASR-style
    ``(B, mel, 2 * n_window)``, then ``(B, frames, F)``."""
    mel = cfg_value(config, ("num_mel_bins",), _AUDIO)
    positions = cfg_value(config, ("max_source_positions",), _AUDIO)
    if mel and positions:
        yield torch.randn(BATCH, int(mel), 2 * int(positions))
    window = cfg_value(config, ("n_window",), _AUDIO)
    if mel and _is_int(window):  # Qwen3-ASR: frames a multiple of two attention windows
        yield torch.randn(BATCH, int(mel), 2 * int(window))
    per = cfg_value(config, ("input_feat_per_channel",), _AUDIO)
    if per:
        yield torch.randn(BATCH, FRAMES, int(per) * int(cfg_value(config, ("input_channels",), _AUDIO, 1)))
    size = cfg_value(config, ("feature_size", "feature_projection_input_dim", "input_dim", "num_mel_bins"), _AUDIO)
    if size:
        yield torch.randn(BATCH, FRAMES, int(size))
        yield torch.randn(BATCH, 1, FRAMES * 4, int(size))
        yield torch.randn(BATCH, int(size), FRAMES * 4)


def _values(config: Any) -> Iterator[torch.Tensor]:
    """Waveform candidates ``(B, samples)``, ``(B, channels, samples)``; AST-style ``(B, max_length, mel)``."""
    mel, length = cfg_value(config, ("num_mel_bins",), _AUDIO), cfg_value(config, ("max_length",), _AUDIO)
    if mel and isinstance(length, int):
        yield torch.randn(BATCH, length, int(mel))
    channels = cfg_value(config, ("audio_channels", "channels"), _AUDIO)
    if isinstance(channels, int):
        yield torch.randn(BATCH, channels, SAMPLES)
    yield torch.randn(BATCH, SAMPLES)
    yield torch.randn(BATCH, 1, SAMPLES)


def _patches(config: Any) -> Iterator[torch.Tensor]:
    """Qwen2-VL-style flattened patches ``(B * g * g, C * temporal_patch * patch * patch)`` for a ``g x g``
    patch grid per image (``g`` = 2 merge windows), with :func:`_grid` giving ``image_grid_thw``; then the
    same patches unflattened, ``(B * g * g, C, patch, patch)`` (Kimi-K2.5's tower convolves each patch)."""
    g = _grid_side(config)
    channels = int(cfg_value(config, ("in_channels", "num_channels"), _VISION, 3))
    temporal = int(cfg_value(config, ("temporal_patch_size",), _VISION, 1))
    patch = int(cfg_value(config, ("patch_size",), _VISION, 14))
    yield torch.randn(BATCH * g * g, channels * temporal * patch * patch)
    if temporal == 1:
        yield torch.randn(BATCH * g * g, channels, patch, patch)


def _grid_side(config: Any) -> int:
    return 2 * int(cfg_value(config, ("spatial_merge_size", "merge_size"), _VISION, 1))


def _grid(config: Any) -> torch.Tensor:
    g = _grid_side(config)
    return torch.tensor([[1, g, g]] * BATCH, dtype=torch.int64)


def _merge_sizes(config: Any) -> torch.Tensor:
    """VideoLLaMA3-style ``merge_sizes``: one spatial merge size per image of :func:`_grid`."""
    merge = int(cfg_value(config, ("spatial_merge_size", "merge_size"), _VISION, 1))
    return torch.tensor([merge] * BATCH, dtype=torch.int64)


def _mel_frames(config: Any) -> Iterator[torch.Tensor]:
    """Gemma3n-style ``audio_mel`` ``(B, frames, mel)`` (``input_feat_size`` or ``num_mel_bins`` wide)."""
    mel = cfg_value(config, ("input_feat_size", "num_mel_bins", "feature_size"), _AUDIO)
    if mel:
        yield torch.randn(BATCH, FRAMES, int(mel))


def _one(fn: Callable[[Any], torch.Tensor]) -> Callable[[Any], Iterator[torch.Tensor]]:
    return lambda config: iter([fn(config)])


#: forward parameter -> candidate tensors built from the config, first choice first
BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "input_ids": _one(_text_ids), "decoder_input_ids": _one(_text_ids), "pixel_values": _one(_image),
    "pixel_values_videos": _one(_image), "input_features": _features, "input_values": _values,
    "audio_mel": _mel_frames,
}
#: inputs given besides ``main_input_name`` when ``forward`` takes them: the other towers of a multimodal model
COMPANIONS = ("input_ids", "pixel_values", "input_features")
#: when ``forward`` takes the key, the inputs are built by the value's builders instead (patch-list VLMs)
VARIANTS: dict[str, dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = {
    "image_grid_thw": {"pixel_values": _patches, "image_grid_thw": _one(_grid)},
    # vision towers of patch-list VLMs called alone: ``forward(pixel_values | hidden_states, grid_thw)``
    "grid_thw": {"pixel_values": _patches, "hidden_states": _patches, "grid_thw": _one(_grid),
                 "merge_sizes": _one(_merge_sizes)},
}
#: required forward parameters ending so are masks over the time axis of the input they name the prefix
#: of (``input_features_mask``, ``audio_mel_mask``): all positions valid
_MASK_SUFFIX = "_mask"


def _forward_params(model: Any) -> dict[str, inspect.Parameter]:
    """Parameters of ``model.forward`` (or of a callable), empty when there is no signature."""
    try:
        return dict(inspect.signature(model.forward if isinstance(model, nn.Module) else model).parameters)
    except (TypeError, ValueError):
        return {}


def _named(params: dict[str, inspect.Parameter]) -> list[str]:
    """Named parameters of ``forward`` (not ``*args``/``**kwargs``), in order."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in params.items() if p.kind in kinds and n != "self"]


def _required(params: dict[str, inspect.Parameter]) -> list[str]:
    """Named parameters of ``forward`` without a default: inputs the model cannot run without."""
    return [n for n in _named(params) if params[n].default is inspect.Parameter.empty]


def _wanted(model: nn.Module, config: Any, params: dict[str, inspect.Parameter],
            builders: Optional[dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = None) -> list[str]:
    """The forward inputs to build: the main input, the other modalities' inputs, decoder inputs.

    The main input is ``main_input_name`` when ``forward`` names it; else (a tower that inherits
    ``input_ids`` as its main input name but takes ``pixel_values``/``hidden_states``) the first required
    parameter a builder knows. A required parameter ``forward`` cannot run without, that a builder knows,
    is added too (``grid_thw``, ``merge_sizes``)."""
    builders = BUILDERS if builders is None else builders
    named, required = _named(params), _required(params)
    main = getattr(model, "main_input_name", None)
    if named and main not in named:
        main = next((n for n in required if n in builders), None)
    names = [main] if main in builders else []
    for extra in COMPANIONS:
        if extra in params and extra not in names and _has_modality(config, extra):
            names.append(extra)
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        names.append("decoder_input_ids")
    names += [n for n in required if n in builders and n not in names and names]
    return names


def _has_modality(config: Any, name: str) -> bool:
    """Whether the config describes the tower that takes ``name`` (a vision sub-config, a text vocabulary)."""
    if name == "pixel_values":
        return any(getattr(config, s, None) is not None for s in _VISION)
    if name == "input_features":
        return any(getattr(config, s, None) is not None for s in _AUDIO)
    return cfg_value(config, ("vocab_size",), _TEXT) is not None


def _describe(kwargs: dict[str, Any]) -> str:
    def one(k: str, v: torch.Tensor) -> str:
        kind = "int64" if v.dtype == torch.int64 else "bool" if v.dtype == torch.bool else "float"
        return f"{k} {kind} {tuple(v.shape)}"

    return ", ".join(one(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor))


def infer_hf_inputs(model: nn.Module) -> Optional[tuple[Any, str]]:
    """Inputs for a ``transformers.PreTrainedModel``, or None when the model is not one we know.

    Returns ``(kwargs, description)``. Each input named by :func:`_wanted` gets the candidates of
    :data:`BUILDERS`; on a meta model the combinations are tried with a forward on meta tensors and the
    first that runs is kept (else the first candidates). Vision-language models get image placeholder
    tokens in ``input_ids`` (:func:`_with_image_tokens`). Never raises.
    """
    config = getattr(model, "config", None)
    name = getattr(model, "main_input_name", None)
    if config is None or name is None:
        return None
    params = _forward_params(model)
    builders = dict(BUILDERS)
    for key, variant in VARIANTS.items():
        if key in params:
            builders.update(variant)
    names = _wanted(model, config, params, builders)
    if not names:
        return None
    if any(n in names for n in ("pixel_values", "hidden_states")):  # the grid of a patch list goes with it
        names += [n for key, variant in VARIANTS.items() if key in params
                  for n in variant if n in params and n not in names]
    choices = {n: list(builders[n](config)) for n in names}
    if any(not c for c in choices.values()):
        return None
    first = _with_masks(params, {n: c[0] for n, c in choices.items()})[0]
    kwargs = _pick(model, params, choices) or first
    kwargs = _with_image_tokens(model, config, kwargs, params)
    return kwargs, _describe(kwargs)


def _with_masks(params: dict[str, inspect.Parameter], combo: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """``combo`` completed with the required ``<input>_mask`` parameters of ``forward`` (all ones, bool,
    over the time axis of ``<input>``): one candidate with the time axis at dim 1 (``(B, T, F)``), one at
    the last dim (``(B, mel, T)``). ``[combo]`` when ``forward`` requires no such mask."""
    masks = [(n, n[: -len(_MASK_SUFFIX)]) for n in _required(params)
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
                 "video_grid_thw", "grid_thw", "merge_sizes", "audio_mel")


def main_tower_inputs(model: nn.Module, kwargs: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The keyword inputs of ``model``'s main tower only (a vision-language model's text, without its image
    inputs and their placeholder tokens), for a retry when the multimodal forward cannot be captured: the
    towers left out are then captured alone as parts the forward never called. None when ``kwargs`` hold
    no other tower's inputs, or the main input is one of them."""
    params = _forward_params(model)
    main = getattr(model, "main_input_name", None)
    if main not in _named(params) or main in _TOWER_INPUTS:
        return None
    drop = {k for k in kwargs if k in _TOWER_INPUTS}
    drop |= {k for k in kwargs if k.endswith(_MASK_SUFFIX) and k[: -len(_MASK_SUFFIX)] in drop}
    if not drop:
        return None
    out = {k: v for k, v in kwargs.items() if k not in drop}
    token = _image_token(getattr(model, "config", None))
    ids = out.get("input_ids")
    if token is not None and isinstance(ids, torch.Tensor) and bool((ids == token).any()):
        vocab = cfg_value(model.config, ("vocab_size",), _TEXT, 100)
        out["input_ids"] = _ids(min(int(vocab), 100, token) or 1, (BATCH, SEQ))  # no image placeholders
    return out


def _combinations(choices: dict[str, list[torch.Tensor]], limit: int = 12) -> Iterator[dict[str, torch.Tensor]]:
    """Candidate input sets: every main-input candidate with the first of the others, then fewer inputs."""
    names = list(choices)
    count = 0
    for i, main in enumerate(choices[names[0]]):
        yield {names[0]: main, **{n: choices[n][0] for n in names[1:]}}
        count += 1
        if count >= limit:
            return
    for n in names[1:]:  # a companion that breaks the forward is left out
        if count >= limit:
            return
        yield {k: choices[k][0] for k in names if k != n}
        count += 1


def _pick(model: nn.Module, params: dict, choices: dict[str, list[torch.Tensor]]) -> Optional[dict[str, Any]]:
    """The first combination a meta forward accepts (only for a model on the meta device), else None."""
    if not _on_meta(model):
        return None
    for combo in _combinations(choices):
        for candidate in _with_masks(params, combo):
            if _runs_on_meta(model, params, _with_image_tokens(model, model.config, candidate, params)):
                return candidate
    return None


def _on_meta(model: nn.Module) -> bool:
    p = next(iter(model.parameters()), None)
    return p is not None and p.device.type == "meta"


def forward_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """Extra keyword inputs every capture passes where ``forward`` takes them: ``use_cache=False`` (no
    cache objects whose ``get_seq_length`` would need real numbers)."""
    return {"use_cache": False} if "use_cache" in params else {}


def _runs_on_meta(model: nn.Module, params: dict, kwargs: dict[str, Any]) -> bool:
    import contextlib
    import io
    import warnings

    meta = {k: v.to("meta") for k, v in kwargs.items()}
    meta.update(forward_kwargs(params))
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model(**meta)
    except Exception as exc:  # noqa: BLE001 - any other failure rejects this candidate
        # .item()/.tolist() need real numbers: the shapes were accepted up to there
        return "meta tensor" in str(exc)
    return True


def _image_token(config: Any) -> Optional[int]:
    for key in ("image_token_id", "image_token_index"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v >= 0:
            return v
    return None


def _with_image_tokens(model: nn.Module, config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """For a vision-language model (an ``image_token_id``): ``input_ids`` with as many image placeholder
    tokens per example as ``get_image_features`` returns features per image (counted on the meta device)."""
    token = _image_token(config)
    ids, pixels = kwargs.get("input_ids"), kwargs.get("pixel_values")
    if token is None or ids is None or pixels is None or not hasattr(model, "get_image_features"):
        return kwargs
    extra = {k: v for k, v in kwargs.items() if k not in ("input_ids", "pixel_values")}
    per_image = _image_feature_count(model, pixels, extra)
    grid = extra.get("image_grid_thw")
    if per_image is None and isinstance(grid, torch.Tensor):  # one token per merge window of the grid
        merge = int(cfg_value(config, ("spatial_merge_size", "merge_size"), _VISION, 1))
        per_image = int(grid[0].prod()) // (merge * merge)
    if per_image is None:
        return kwargs
    vocab = cfg_value(config, ("vocab_size",), _TEXT, 100)
    text = _ids(min(int(vocab), 100, token) or 1, (BATCH, SEQ))
    image = torch.full((BATCH, per_image), token, dtype=torch.int64)
    return {**kwargs, "input_ids": torch.cat([image, text], dim=1)}


def _image_feature_count(model: nn.Module, pixels: torch.Tensor, extra: dict[str, Any]) -> Optional[int]:
    """Features one example's images give (``get_image_features`` on meta tensors), or None when it does
    not run. ``extra`` holds other image inputs (``image_grid_thw``) passed where the method takes them."""
    if not _on_meta(model):
        return None
    takes = _forward_params(model.get_image_features) if hasattr(model, "get_image_features") else {}
    more = {k: v.to("meta") if v.is_floating_point() else v for k, v in extra.items() if k in takes}
    try:
        with torch.no_grad():
            out = model.get_image_features(pixel_values=pixels.to("meta"), **more)
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


def declared_input_size(model: nn.Module) -> Optional[tuple[tuple[int, ...], str]]:
    """The input size a model declares for itself: timm's ``pretrained_cfg`` / ``default_cfg``
    ``input_size`` ``(C, H, W)`` (many timm models, ViTs with fixed position embeddings, Swin windows, need
    exactly it). Returns ``((C, H, W), attribute name)`` or None when the model declares none."""
    for attr in ("pretrained_cfg", "default_cfg"):
        cfg = getattr(model, attr, None)
        size = cfg.get("input_size") if isinstance(cfg, dict) else None
        if (isinstance(size, (tuple, list)) and len(size) in (2, 3, 4)
                and all(isinstance(v, int) and 0 < v <= 4096 for v in size)):
            return tuple(size), attr
    return None


def infer_inputs(model: nn.Module) -> tuple[Any, str]:
    """Guess example inputs from the model's first layer.

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
