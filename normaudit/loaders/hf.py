"""Hugging Face targets: a model directory with a ``config.json``, or a bare ``config.json``.

The model is built from the configuration alone with ``transformers`` under ``torch.device("meta")``
(no weight memory, nothing downloaded: ``HF_HUB_OFFLINE=1`` is set for the process, and a directory is
read with ``local_files_only=True``). The class is the first entry of ``architectures`` when
``transformers`` has it (``LlamaForCausalLM``: heads included), else ``AutoModel``. Weights found in the
directory are recorded on the result but not read here: reading them is the checkpoint reader's job
(``normaudit.loaders.checkpoint``).

The config is untrusted input (:mod:`normaudit.loaders.safe_read`): a regular file, nesting bounded, and
refused before building when its sizes are absurd (:func:`check_config_limits`). Custom code (``auto_map``)
is never run: a config whose ``model_type`` transformers knows is audited with transformers' own classes
(said in a note), any other is refused. An attention kernel that cannot run here (``attn_implementation:
flash_attention_2``/``_3``, hub kernels) is replaced by ``sdpa`` (``eager`` where the model lacks it), said
in a note: the norms do not depend on the attention kernel.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Any

from normaudit.errors import UsageError
from normaudit.loaders.safe_read import loads_json, read_regular, require_regular_file, require_within
from normaudit.quiet import quiet

#: Weight files of a Hugging Face style directory (recorded, not read).
WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json",
                   "*.pt", "*.pth", "*.ckpt")


def set_offline() -> None:
    """Make ``transformers``/``huggingface_hub`` work offline for this process (never touch the network)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


def weight_files(directory: Path) -> list[str]:
    """Names of the weight files in ``directory`` (sorted; empty when there are none)."""
    found: set[str] = set()
    for pattern in WEIGHT_PATTERNS:
        # Anything but a directory: a FIFO or device named like weights is refused by the checkpoint reader.
        found.update(p.name for p in directory.glob(pattern) if not p.is_dir())
    return sorted(found)


def _read_json(path: Path) -> dict[str, Any]:
    data = loads_json(read_regular(path, "model config"), "model config", str(path))
    if not isinstance(data, dict):
        raise UsageError(f"a model config must be a JSON object, found a JSON {type(data).__name__}", file=str(path))
    return data


#: keys giving a number of layers (blocks) in a Hugging Face config or one of its sub-configs
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_encoder_layers",
              "num_decoder_layers", "encoder_layers", "decoder_layers", "depth")
#: keys giving a number of experts (each may be a module of its own)
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
#: keys giving a width or a count of a weight's rows
SIZE_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "intermediate_size", "ffn_dim", "d_ff", "n_inner",
             "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size", "vocab_size", "num_attention_heads",
             "n_head", "num_key_value_heads", "head_dim")
#: limits (real models: at most ~130 layers, 1000 for DeepNet; widths under 10**5, vocabularies under
#: 10**6; 384 experts; 2 * 10**12 parameters)
MAX_LAYERS = 1024
MAX_EXPERTS = 4096
MAX_SIZE = 2 ** 24
MAX_PARAMETERS = 10 ** 13


def check_config_limits(data: dict[str, Any], file: str) -> None:
    """Refuse a config that no real model has, before transformers spends minutes (or hours) building it.

    In the config and every nested sub-config (``text_config``, ``vision_config``, ...): a negative size,
    more than :data:`MAX_LAYERS` layers, :data:`MAX_EXPERTS` experts, a width or vocabulary above
    :data:`MAX_SIZE`, or an estimated parameter count above :data:`MAX_PARAMETERS` (``L * (4 h^2 +
    3 h f E) + V h`` per (sub-)config: layers, hidden size, feed-forward size (default 4h), experts,
    vocabulary). Raises UsageError naming the key, the value found and the limit.
    """
    total = 0.0
    for where, cfg in _sub_configs(data, "", 0):
        ints = {k: v for k, v in cfg.items() if isinstance(v, int) and not isinstance(v, bool)}
        for keys, limit, what in ((LAYER_KEYS, MAX_LAYERS, "layers"), (EXPERT_KEYS, MAX_EXPERTS, "experts"),
                                  (SIZE_KEYS, MAX_SIZE, "in any size")):
            for key in keys:
                value = ints.get(key)
                if value is not None and value < 0:
                    raise UsageError(f"{where}{key} is {value}: expected a count of 0 or more", file=file)
                if value is not None and value > limit:
                    raise UsageError(f"{where}{key} is {value}: normaudit refuses configs with more than {limit} "
                                     f"{what} (no real model has as many; building it would not finish)", file=file)
        total += _parameter_estimate(ints)
    if total > MAX_PARAMETERS:
        raise UsageError(f"the config describes about {total:.1e} parameters: normaudit refuses configs above "
                         f"{MAX_PARAMETERS:.0e} (no real model is as large)", file=file)


def _sub_configs(cfg: dict[str, Any], where: str, depth: int):
    yield where, cfg
    if depth < 8:
        for key, value in cfg.items():
            if isinstance(value, dict):
                yield from _sub_configs(value, f"{where}{key}.", depth + 1)


def _parameter_estimate(ints: dict[str, int]) -> float:
    first = lambda keys, default: next((ints[k] for k in keys if ints.get(k)), default)  # noqa: E731
    h = first(("hidden_size", "d_model", "n_embd", "dim"), 0)
    layers = sum(ints.get(k, 0) for k in LAYER_KEYS)
    ffn = first(("moe_intermediate_size", "intermediate_size", "ffn_dim", "d_ff", "n_inner"), 4 * h)
    experts = max(1, first(EXPERT_KEYS, 1))
    return float(layers) * (4.0 * h * h + 3.0 * h * ffn * experts) + float(ints.get("vocab_size", 0)) * h


#: attention implementations that can run in the capture (CPU, meta and fake tensors)
_CAPTURABLE_ATTENTION = ("eager", "sdpa")
_ATTENTION_KEYS = ("attn_implementation", "_attn_implementation", "_attn_implementation_internal")


def requested_attention(data: dict[str, Any]) -> Any:
    """The attention implementation a config asks for (``attn_implementation`` or ``_attn_implementation``,
    at the top or in a sub-config), or None when it asks for none or for one that runs here (eager, sdpa)."""
    for _, cfg in _sub_configs(data, "", 0):
        for key in _ATTENTION_KEYS:
            value = cfg.get(key)
            if value is not None and value not in _CAPTURABLE_ATTENTION:
                return value
    return None


def _strip_attention(data: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in data.items() if k not in _ATTENTION_KEYS}
    return {k: _strip_attention(v) if isinstance(v, dict) else v for k, v in out.items()}


def _transformers():
    """The ``transformers`` module, imported offline and quietly (:func:`share_models_scan` applied); raises
    UsageError when it is not installed."""
    set_offline()
    try:
        with quiet("transformers"):
            import transformers
    except ImportError as err:
        raise UsageError("Hugging Face targets need the 'transformers' package: pip install 'normaudit[hf]'") from err
    share_models_scan(transformers)
    return transformers


def share_models_scan(transformers) -> bool:
    """Let ``transformers.models`` reuse the scan of its folder that ``import transformers`` already made.

    transformers (5.x) reads every file of ``models/`` (~400 folders, to find each module's backends) twice:
    ``transformers/__init__.py`` calls ``define_import_structure(Path(.../models))`` and ``models/__init__.py``
    then ``define_import_structure(".../models/__init__.py")``. Both reach the ``lru_cache`` of
    ``create_import_structure_from_path``, which takes the file's folder, but under different keys (a Path, a
    str): the second call scans again (~0.25 s of start-up). Before ``transformers.models`` is imported, this
    wraps ``define_import_structure`` so that a package's ``__init__.py`` is looked up under the key of the
    scan already made: the folder as a Path for ``models/``, as the str the recursive scan used for its
    sub-folders (``models/llama``) otherwise. The result is the same mapping. Returns True when the wrapper
    is (or was already) in place; False where this transformers has no such functions or ``models`` is
    already imported (nothing changed)."""
    import_utils = sys.modules.get("transformers.utils.import_utils")
    define = getattr(import_utils, "define_import_structure", None)
    create = getattr(import_utils, "create_import_structure_from_path", None)
    if getattr(define, "_shares_scan", False):
        return True
    if define is None or not hasattr(create, "cache_info") or "transformers.models" in sys.modules:
        return False
    models = Path(transformers.__file__).parent / "models"

    def define_import_structure(module_path, *args, **kwargs):
        if isinstance(module_path, str) and os.path.basename(module_path) == "__init__.py":
            folder = os.path.dirname(module_path)
            module_path = models if Path(folder) == models else folder
        return define(module_path, *args, **kwargs)

    define_import_structure._shares_scan = True  # type: ignore[attr-defined]
    define_import_structure.__wrapped__ = define  # type: ignore[attr-defined]
    import_utils.define_import_structure = define_import_structure
    return True


def _config(transformers, path: Path, config_file: Path, data: dict[str, Any], notes: list[str]):
    """The transformers config object for ``data`` (read from ``config_file``; a directory ``path`` is read
    by transformers itself unless ``data`` was changed); custom code is never imported."""
    is_dir = path.is_dir()
    model_type = data.get("model_type")
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    custom = "auto_map" in data or data.get("trust_remote_code") is True
    if custom and not (isinstance(model_type, str) and model_type in mapping):
        raise UsageError(f"the config uses custom model code (auto_map) for model_type {model_type!r}, which "
                         f"transformers {transformers.__version__} does not have built in; normaudit never runs "
                         "code from a model directory: write a model.py with build_model() that imports it "
                         "instead", file=str(config_file))
    if not model_type:
        raise UsageError("config.json has no 'model_type', so transformers cannot tell which model it describes",
                         file=str(config_file))
    if not isinstance(model_type, str) or model_type not in mapping:
        raise UsageError(f"unknown model_type {model_type!r} for transformers {transformers.__version__}",
                         file=str(config_file))
    if custom:
        notes.append(f"the config names custom model code (auto_map), which normaudit never runs: audited with "
                     f"transformers' built-in {model_type!r} classes, which may differ from the custom code")
    try:
        with quiet("transformers"):
            if is_dir and not custom:
                return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
            rest = {k: v for k, v in data.items() if k not in ("model_type", "auto_map", "trust_remote_code")}
            return transformers.AutoConfig.for_model(model_type, **rest)
    except Exception as err:  # noqa: BLE001 - transformers raises many types for bad configs
        text = " ".join(str(err).split())[:300]
        raise UsageError(f"transformers cannot read this config: {type(err).__name__}: {text}",
                         file=str(config_file)) from err


def _model_class(transformers, config) -> tuple[Any, str]:
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, str(arch), None)
        if isinstance(cls, type) and hasattr(cls, "_from_config"):
            return cls, str(arch)
    return transformers.AutoModel, "AutoModel"


def load_hf_target(path: Path):
    """Build the model described by a Hugging Face directory or a bare ``config.json`` on the meta device.

    Returns a :class:`normaudit.loaders.ModelUnderAudit` with ``kind`` ``hf_dir`` or ``hf_config``,
    ``weights`` naming the weight files found beside the config, and ``notes`` saying what was changed to
    capture it (attention kernel, custom code not run). Raises UsageError for a missing, unreadable or
    invalid config, absurd sizes (:func:`check_config_limits`), an unknown ``model_type``, custom code of
    an unknown type, or a model transformers fails to build.
    """
    from normaudit.loaders.model import ModelUnderAudit

    is_dir = path.is_dir()
    config_file = path / "config.json" if is_dir else path
    if is_dir and not os.path.lexists(config_file):
        raise UsageError("no config.json in this directory", file=str(path))
    require_regular_file(config_file, "model config")
    require_within(config_file, config_file.parent, "model config")
    data = _read_json(config_file)
    check_config_limits(data, str(config_file))
    notes: list[str] = []
    attention = requested_attention(data)
    transformers = _transformers()
    config = _config(transformers, path if not attention else config_file, config_file,
                     _strip_attention(data) if attention else data, notes)
    model, name = _build(transformers, config, attention, str(config_file), notes)
    weights = weight_files(path) if is_dir else []
    # Weights beside the config are audited as the model's checkpoint (normaudit.audit.checkpoint_path).
    return ModelUnderAudit(model=model, inputs=None, on_meta=True, kind="hf_dir" if is_dir else "hf_config",
                           factory=f"{name}.from_config", file=str(config_file), weights=weights, notes=notes)


def _build(transformers, config, attention: Any, config_file: str, notes: list[str]) -> tuple[Any, str]:
    """Build the model class of ``config`` on the meta device; with ``attention`` (a kernel that cannot run
    here, asked for by the config) build with ``sdpa``, else ``eager``, and say so in ``notes``. The torch
    initialisers skip the meta tensors (:func:`normaudit.loaders.meta_init.meta_init_skipped`: the build's cost
    no longer grows with the depth through them); ``init_weights()`` still runs, so tied weights stay tied."""
    import torch

    from normaudit.loaders.meta_init import meta_init_skipped

    cls, name = _model_class(transformers, config)
    tries = ("sdpa", "eager") if attention else (None,)
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        for i, kernel in enumerate(tries):
            kwargs = {"attn_implementation": kernel} if kernel else {}
            try:
                with quiet("transformers"), contextlib.redirect_stdout(io.StringIO()), torch.device("meta"), meta_init_skipped():
                    if cls is transformers.AutoModel:
                        model = cls.from_config(config, **kwargs)
                    else:
                        model = cls._from_config(config, **kwargs)
            except Exception as err:  # noqa: BLE001
                if i + 1 < len(tries):
                    continue
                text = " ".join(str(err).split())[:300]
                raise UsageError(f"transformers could not build {name} from this config: {type(err).__name__}: "
                                 f"{text}", file=config_file) from err
            if kernel:
                notes.append(f"the config asks for attn_implementation {attention!r}, which cannot run in the "
                             f"capture (CPU, no weights): audited with {kernel!r} attention instead; the norms "
                             "do not depend on the attention kernel")
            return model, name
    finally:
        sys.dont_write_bytecode = old
