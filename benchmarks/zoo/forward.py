"""Ground truth for the sweep's recall: which norm modules a real forward of the model calls.

The model is built for real on CPU (tiny sizes, random init), forward hooks go on every norm module
(:func:`is_norm_module`), one forward runs under ``torch.no_grad()``, and the modules whose hook fired
are the "norm modules used in a forward" that normaudit's sites are compared with.

Inputs follow the model's ``forward`` signature, ``main_input_name``, the config and the modality, the
way transformers' model testers build them: token ids, ``pixel_values`` sized from ``image_size`` and
``num_channels`` (``(B, T, C, H, W)`` where the config has ``num_frames``), ``input_features`` from
``num_mel_bins``/``feature_size``, ``input_values`` as raw audio, decoder ids for encoder-decoders.
Several input sets are tried, the richest first; the first that runs counts.
"""
from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import torch
from torch import nn

from summary import NOT_A_NORM

BATCH = 2
SEQ = 16
_TORCH_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm,
                nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm, nn.CrossMapLRN2d)
_NORM_NAME = re.compile(r"Norm")
_GRN_NAME = re.compile(r"GRN$")  # transformers' ConvNextV2GRN: global response normalisation (Woo et al. 2023)


def _is_norm_class(module: nn.Module) -> bool:
    name = type(module).__name__
    if _GRN_NAME.search(name):
        return True
    return isinstance(module, _TORCH_NORMS) or bool(_NORM_NAME.search(name) and not NOT_A_NORM.search(name))


def is_norm_module(module: nn.Module) -> bool:
    """True for a torch.nn norm, or a module whose class name says ``Norm`` and holds no norm inside it.

    The second condition leaves out wrappers such as ``PreNorm(fn)`` whose own child is the norm; names
    that say Norm about something else (``NormFreeBlock``, ``ConvNormAct`` without a norm, heads, MLPs:
    :data:`summary.NOT_A_NORM`) are no norm either.
    """
    if not _is_norm_class(module):
        return False
    if isinstance(module, _TORCH_NORMS):
        return True
    return not any(_is_norm_class(m) for m in module.modules() if m is not module)


def norm_modules(model: nn.Module) -> dict[str, str]:
    """``{dotted path: class name}`` of every norm module of ``model`` (shared modules: first path)."""
    return {name: type(m).__name__ for name, m in model.named_modules() if name and is_norm_module(m)}


def called_norms(model: nn.Module, run: Callable[[], Any]) -> set[str]:
    """Paths of the norm modules whose forward ran during ``run()`` (forward hooks, removed after)."""
    called: set[str] = set()
    handles = []
    for name in norm_modules(model):
        module = model.get_submodule(name)
        handles.append(module.register_forward_hook(lambda _m, _i, _o, n=name: called.add(n)))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return called


def _get(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _pair(v) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return int(v[0]), int(v[-1])
    return int(v), int(v)


def _special_ids(config) -> set[int]:
    ids: set[int] = set()
    for key, value in config.to_dict().items():
        if key.endswith(("_token_id", "_token_index", "_id")) and isinstance(value, int):
            ids.add(value)
    return ids


def _token_ids(config, length: int = SEQ) -> torch.Tensor:
    text = _get(config, "text_config", default=config)
    vocab = int(_get(text, "vocab_size", default=_get(config, "vocab_size", default=100)) or 100)
    ids = torch.randint(3, max(4, min(vocab, 1000)), (BATCH, length))
    for special in _special_ids(config) | _special_ids(text):
        ids[ids == special] = 3
    return ids


def _pixels(config, video: bool = False) -> torch.Tensor:
    vision = _get(config, "vision_config", "backbone_config", default=config)
    if isinstance(vision, dict):
        vision = config
    h, w = _pair(_get(vision, "image_size", "img_size", "input_size", default=_get(config, "image_size",
                                                                                      default=224)))
    channels = int(_get(vision, "num_channels", "in_channels", "in_chans", default=3))
    if video:
        frames = int(_get(vision, "num_frames", default=_get(config, "num_frames", default=8)))
        return torch.randn(BATCH, frames, channels, h, w)
    return torch.randn(BATCH, channels, h, w)


def _features(config, time_first: bool = False) -> torch.Tensor:
    audio = _get(config, "audio_config", "encoder_config", default=config)
    mels = int(_get(audio, "num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", default=80))
    frames = 2 * int(_get(audio, "max_source_positions", default=SEQ * 4))
    if time_first:
        channels = int(_get(audio, "input_channels", default=1))
        return torch.randn(BATCH, min(frames, 64), mels * channels)
    return torch.randn(BATCH, mels, frames)


def input_variants(model: nn.Module, config) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """Candidate keyword-input sets for ``model(**inputs)``, richest first, each as ``(label, builder)``."""
    params = set(inspect.signature(model.forward).parameters)
    main = getattr(model, "main_input_name", "input_ids")
    enc_dec = bool(getattr(config, "is_encoder_decoder", False)) and "decoder_input_ids" in params

    def with_decoder(d: dict[str, Any]) -> dict[str, Any]:
        if enc_dec:
            d["decoder_input_ids"] = _token_ids(config, 8)
        return d

    makers: dict[str, Callable[[], torch.Tensor]] = {
        "input_ids": lambda: _token_ids(config),
        "pixel_values": lambda: _pixels(config),
        "pixel_values_videos": lambda: _pixels(config, video=True),
        "input_features": lambda: _features(config),
        "input_values": lambda: torch.randn(BATCH, 8000),
    }
    variants: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    modal = [k for k in ("input_ids", "pixel_values", "input_features", "input_values") if k in params]
    if len(modal) > 1:
        variants.append(("+".join(modal), lambda: with_decoder({k: makers[k]() for k in modal})))
    if main in makers:
        variants.append((main, lambda: with_decoder({main: makers[main]()})))
    if main == "pixel_values":
        variants.append(("pixel_values video", lambda: with_decoder({main: _pixels(config, video=True)})))
    if main == "input_features":
        variants.append(("input_features (B,T,F)", lambda: with_decoder({main: _features(config, True)})))
    for key in modal:
        if key != main:
            variants.append((key, lambda k=key: with_decoder({k: makers[k]()})))
    variants.append(("normaudit's inputs", lambda: _normaudit_inputs(model)))
    return variants


def _normaudit_inputs(model: nn.Module) -> dict[str, Any]:
    """The inputs normaudit builds for the model (``infer_hf_inputs``: required parameters such as
    ``grid_thw`` or feature masks that the sets above do not know), tried last."""
    from normaudit.target.inputs import infer_hf_inputs

    built = infer_hf_inputs(model)
    if built is None:
        raise ValueError("normaudit builds no inputs for it")
    return dict(built[0])


def forward_norms(model: nn.Module, config) -> tuple[set[str] | None, str]:
    """Norm modules called by any input set that runs (the union: a multimodal model's text-only set and
    its image set call different towers, and normaudit captures both); ``(None, error)`` when none runs."""
    model.eval()
    errors, called, ran = [], set(), []
    for label, make in input_variants(model, config):
        try:
            inputs = make()
            with torch.no_grad():
                called |= called_norms(model, lambda: model(**inputs))
            ran.append(label)
        except Exception as err:  # noqa: BLE001 - any failure means: try the next input set
            errors.append(f"{label}: {type(err).__name__}: {' '.join(str(err).split())[:160]}")
    if ran:
        return called, " | ".join(ran)
    return None, " | ".join(errors)[:400] or "no input set fits the forward signature"


#: errors of a forward on the meta device that say only that real numbers were needed (``.item()``,
#: ``nonzero``, data-dependent control flow) or that a meta kernel is stricter than CPU: the shapes were
#: accepted up to there
_META_STOP = ("meta tensor", "meta device", "register_meta", "data-dependent", "cannot be called on meta",
              "not implemented for 'Meta'", "NotImplementedError",
              "Expected inputs of BF16 type")  # the meta grouped_mm of MoE experts; CPU runs float32


def runs_on_meta(model: nn.Module, config) -> tuple[bool, str]:
    """Whether some input set of :func:`input_variants` runs ``model`` (built on the meta device) on meta
    tensors, as far as shapes go: ``(True, label)``, or ``(False, errors)``. A forward that stops only
    because it needs real numbers counts as running. Checks a shrunk config's sizes fit each other without
    allocating weights."""
    import contextlib
    import io
    import warnings

    errors = []
    for label, make in input_variants(model, config):
        try:
            inputs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in make().items()}
            with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                model(**inputs)
            return True, label
        except Exception as err:  # noqa: BLE001 - any failure means: try the next input set
            text = f"{type(err).__name__}: {' '.join(str(err).split())}"
            if any(s in text for s in _META_STOP):
                return True, label
            errors.append(f"{label}: {text[:160]}")
    return False, " | ".join(errors)[:400]

