"""Hugging Face targets: a model directory with a ``config.json``, or a bare ``config.json``.

The model is built from the configuration alone with ``transformers`` under ``torch.device("meta")``
(no weight memory, nothing downloaded: ``HF_HUB_OFFLINE=1`` is set for the process, and a directory is
read with ``local_files_only=True``). The class is the first entry of ``architectures`` when
``transformers`` has it (``LlamaForCausalLM``: heads included), else ``AutoModel``. Custom code
(``auto_map``) is never run. Weights found in the directory are recorded on the result but not read here:
reading them is the checkpoint reader's job (``normaudit.target.checkpoint``).
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from normaudit.errors import UsageError

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
        found.update(p.name for p in directory.glob(pattern) if p.is_file())
    return sorted(found)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read: {err}", file=str(path)) from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"invalid JSON: {err.msg}", file=str(path), line=err.lineno) from err
    if not isinstance(data, dict):
        raise UsageError(f"a model config must be a JSON object, got {type(data).__name__}", file=str(path))
    return data


def _transformers():
    set_offline()
    try:
        with _quiet():
            import transformers
    except ImportError as err:
        raise UsageError("Hugging Face targets need the 'transformers' package: pip install 'normaudit[hf]'") from err
    return transformers


@contextlib.contextmanager
def _quiet():
    """Silence transformers' advisory warnings and logs (they would clutter stderr)."""
    logger = logging.getLogger("transformers")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(old)


def _config(transformers, path: Path, data: dict[str, Any], is_dir: bool):
    config_file = path / "config.json" if is_dir else path
    if "auto_map" in data:
        raise UsageError("the config uses custom model code (auto_map); normaudit never runs code from a model "
                         "directory: write a model.py with build_model() that imports it instead", file=str(config_file))
    model_type = data.get("model_type")
    if not model_type:
        raise UsageError("config.json has no 'model_type', so transformers cannot tell which model it describes",
                         file=str(config_file))
    mapping = transformers.models.auto.configuration_auto.CONFIG_MAPPING
    if model_type not in mapping:
        raise UsageError(f"unknown model_type {model_type!r} for transformers {transformers.__version__}",
                         file=str(config_file))
    try:
        with _quiet():
            if is_dir:
                return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
            rest = {k: v for k, v in data.items() if k != "model_type"}
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

    Returns a :class:`normaudit.target.ModelUnderAudit` with ``kind`` ``hf_dir`` or ``hf_config`` and
    ``weights`` naming the weight files found beside the config. Raises UsageError for a missing or
    invalid config, an unknown ``model_type``, custom code, or a model transformers fails to build.
    """
    import torch

    from normaudit.target import ModelUnderAudit

    is_dir = path.is_dir()
    config_file = path / "config.json" if is_dir else path
    if not config_file.is_file():
        raise UsageError("no config.json in this directory", file=str(path))
    data = _read_json(config_file)
    transformers = _transformers()
    config = _config(transformers, path, data, is_dir)
    cls, name = _model_class(transformers, config)
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        with _quiet(), contextlib.redirect_stdout(io.StringIO()), torch.device("meta"):
            if cls is transformers.AutoModel:
                model = cls.from_config(config)
            else:
                model = cls._from_config(config)
    except Exception as err:  # noqa: BLE001
        text = " ".join(str(err).split())[:300]
        raise UsageError(f"transformers could not build {name} from this config: {type(err).__name__}: {text}",
                         file=str(config_file)) from err
    finally:
        sys.dont_write_bytecode = old
    weights = weight_files(path) if is_dir else []
    # Weights beside the config are audited as the model's checkpoint (normaudit.audit.checkpoint_path).
    return ModelUnderAudit(model=model, inputs=None, on_meta=True, kind="hf_dir" if is_dir else "hf_config",
                           factory=f"{name}.from_config", file=str(config_file), weights=weights)
