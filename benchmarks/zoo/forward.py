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

from summary import says_norm

BATCH = 2
SEQ = 16
_TORCH_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm,
                nn.modules.instancenorm._InstanceNorm, nn.LocalResponseNorm, nn.CrossMapLRN2d)
_GRN_NAME = re.compile(r"GRN$")  # transformers' ConvNextV2GRN: global response normalisation (Woo et al. 2023)


def model_prefixes(cls: type) -> list[str]:
    """The model names a library class carries at the front of its name: the ``<Name>PreTrainedModel``
    classes of the Python module that defines it (transformers: ``RobertaPreLayerNorm`` for
    ``RobertaPreLayerNormPooler``, ``ConvNextV2`` for ``ConvNextV2LayerNorm``); none elsewhere."""
    import sys

    namespace = vars(sys.modules.get(cls.__module__) or object)
    return [k[:-len("PreTrainedModel")] for k in list(namespace) if k.endswith("PreTrainedModel")
            and k != "PreTrainedModel"]


def _is_norm_class(module: nn.Module) -> bool:
    cls = type(module)
    if isinstance(module, _TORCH_NORMS) or _GRN_NAME.search(cls.__name__):
        return True
    return says_norm(cls.__name__, model_prefixes(cls))


def is_norm_module(module: nn.Module) -> bool:
    """True for a torch.nn norm, or a module whose class name names a norm (:func:`summary.says_norm`, the
    model's name prefix removed: :func:`model_prefixes`) and holds no norm inside it.

    The last condition leaves out wrappers such as ``PreNorm(fn)`` or wav2vec2's ``EncoderStableLayerNorm``
    whose own children are the norms; names that say Norm about something else (``NormFreeBlock``,
    ``ConvNormAct`` without a norm, ``RobertaPreLayerNormPooler``) are no norm either.
    """
    if not _is_norm_class(module):
        return False
    if isinstance(module, _TORCH_NORMS):
        return True
    return not any(_is_norm_class(m) for m in module.modules() if m is not module)


def norm_modules(model: nn.Module) -> dict[str, str]:
    """``{dotted path: class name}`` of every norm module of ``model`` (shared modules: first path)."""
    return {name: type(m).__name__ for name, m in model.named_modules() if name and is_norm_module(m)}


#: aten ops that compute a statistic of their input (a reduction, an inverse root, a fused norm kernel): a
#: module named as a norm that runs none of them normalises nothing (Voxtral-Realtime's
#: ``TextAdaRmsNorm``: linear -> gelu -> linear, a conditioning MLP; mobilebert's ``NoNorm``: an affine map)
STATISTIC_OPS = frozenset({
    "mean", "sum", "nansum", "var", "std", "var_mean", "std_mean", "rsqrt", "sqrt", "norm", "linalg_vector_norm",
    "frobenius_norm", "amax", "logsumexp", "native_layer_norm", "layer_norm", "native_group_norm", "group_norm",
    "native_batch_norm", "batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "instance_norm", "rms_norm", "_fused_rms_norm"})


def _statistics_mode(inside: list[str], computed: set[str]):
    """A TorchDispatchMode adding the paths in ``inside`` (the norm modules running now) to ``computed``
    whenever an op of :data:`STATISTIC_OPS` runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Statistics(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if inside and func.__name__.split(".")[0] in STATISTIC_OPS:
                computed.update(inside)
            return func(*args, **(kwargs or {}))

    return Statistics()


def called_norms(model: nn.Module, run: Callable[[], Any]) -> set[str]:
    """Paths of the norm modules whose forward ran during ``run()`` and normalised: a torch.nn norm, or a
    module named as one (:func:`is_norm_module`) that ran an op of :data:`STATISTIC_OPS` (watched with a
    TorchDispatchMode; hooks removed after). When ``run()`` fails under that mode it is run again without,
    and every named norm that ran counts."""
    called: set[str] = set()
    inside: list[str] = []
    computed: set[str] = set()
    handles = []

    def enter(name: str) -> Callable[..., None]:
        return lambda _m, _i: inside.append(name)

    def leave(name: str) -> Callable[..., None]:
        def hook(_m, _i, _o) -> None:  # returns None: the module's output is kept
            called.add(name)
            if name in inside:
                inside.remove(name)
        return hook

    for name in norm_modules(model):
        module = model.get_submodule(name)
        if isinstance(module, _TORCH_NORMS):
            computed.add(name)
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave(name)))
    try:
        try:
            with _statistics_mode(inside, computed):
                run()
        except Exception:  # noqa: BLE001 - a forward that the mode breaks: hooks alone
            called.clear()
            inside.clear()
            run()
            computed.update(called)
    finally:
        for h in handles:
            h.remove()
    return called & computed


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


def meta_twin(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (ties kept: one meta tensor
    per original tensor), as normaudit builds a target; the original's real weights are not copied."""
    import copy

    memo: dict[int, Any] = {}
    for t in (*module.parameters(), *module.buffers()):
        if id(t) not in memo:
            meta = torch.empty_like(t, device="meta")
            memo[id(t)] = nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def _normaudit_inputs(model: nn.Module) -> dict[str, Any]:
    """The inputs normaudit itself builds for ``model`` (``infer_hf_inputs``), built as the command builds
    them: on a meta-device twin (:func:`meta_twin`). normaudit counts image/audio placeholder tokens with
    ``get_image_features``/``get_audio_features`` on the meta device only; given the real model it adds no
    placeholders and the multimodal forward refuses them ("image features and image tokens do not
    match"). The tensors returned are real (CPU). Raises ValueError when normaudit builds no inputs."""
    from normaudit.loaders.inputs import infer_hf_inputs

    built = infer_hf_inputs(meta_twin(model) if not _on_meta(model) else model)
    if built is None:
        raise ValueError("normaudit builds no inputs for it")
    inputs = dict(built[0])
    if any(isinstance(v, torch.Tensor) and v.is_meta for v in inputs.values()):
        raise ValueError("normaudit's inputs are meta tensors")
    return inputs


def _on_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def hf_towers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Outermost submodules that are Hugging Face models of their own (a ``config`` and a
    ``main_input_name``: vision, audio, speech towers) and hold a norm module, as ``(path, module)``."""
    found: list[tuple[str, nn.Module]] = []
    for path, mod in model.named_modules():
        if (not path or any(path.startswith(p + ".") for p, _ in found)
                or getattr(mod, "main_input_name", None) is None or getattr(mod, "config", None) is None):
            continue
        if any(is_norm_module(m) for m in mod.modules()):
            found.append((path, mod))
    return found


def _run(model: nn.Module, inputs: dict[str, Any]) -> set[str]:
    with torch.no_grad():
        return called_norms(model, lambda: model(**inputs))


def forward_norms(model: nn.Module, config) -> tuple[set[str] | None, str]:
    """Norm modules called by any input set that runs: the union over the whole-model sets of
    :func:`input_variants` (a multimodal model's text-only set and its image set call different towers),
    normaudit's own inputs always among them, then each tower (:func:`hf_towers`) no whole-model set
    reached, run alone on the inputs normaudit builds for it (normaudit captures such towers alone: the
    real forward of the tower is their ground truth). ``(None, errors)`` when no whole-model set runs."""
    model.eval()
    errors, called, ran = [], set(), []
    for label, make in input_variants(model, config):
        try:
            called |= _run(model, make())
            ran.append(label)
        except Exception as err:  # noqa: BLE001 - any failure means: try the next input set
            errors.append(f"{label}: {type(err).__name__}: {' '.join(str(err).split())[:160]}")
    if not ran:
        return None, " | ".join(errors)[:400] or "no input set fits the forward signature"
    for path, tower in hf_towers(model):
        if any(c.startswith(path + ".") for c in called):
            continue
        try:
            called |= {f"{path}.{n}" for n in _run(tower, _normaudit_inputs(tower))}
            ran.append(f"{path} alone")
        except Exception as err:  # noqa: BLE001 - the tower stays uncounted
            ran.append(f"{path} alone failed: {type(err).__name__}: {' '.join(str(err).split())[:80]}")
    return called, " | ".join(ran)


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

