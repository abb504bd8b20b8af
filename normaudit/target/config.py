"""Configuration files the model is meant to follow (``--config``): JSON or YAML, HF ``config.json`` or a
training config. Parse errors are :class:`UsageError` with the file and line."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

import yaml

from normaudit.errors import UsageError


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML mapping (``.json``: JSON, anything else: YAML), as untrusted input.

    Only a regular file of at most 64 MiB is read (a FIFO or device is refused before opening); nesting is
    bounded (100 levels), YAML builds plain data only (no ``!!python`` tags) and its aliases may expand to
    at most a million nodes (:mod:`normaudit.target.safe_read`); transformers 5's ``{"__float__":
    "Infinity"}`` reads as the float. Raises UsageError naming the file (and line) for any of these, bad
    syntax, or a document that is not a mapping.
    """
    from normaudit.target.safe_read import loads_json, loads_yaml, read_regular

    p = Path(path)
    if not os.path.lexists(p):
        raise UsageError("config file not found", file=str(p))
    raw = read_regular(p, "config")
    if p.suffix.lower() == ".json":
        data = loads_json(raw, "config", str(p))
    else:
        data = loads_yaml(raw.decode("utf-8", errors="replace"), "config", str(p))
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise UsageError(f"config must be a mapping (key: value), found {found}", file=str(p))
    return _numbers(data)


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _numbers(value: Any) -> Any:
    """YAML 1.1 (PyYAML) reads ``1e-6`` (no dot in the mantissa) as a string: take such strings as the
    floats every other reader (JSON, Python, YAML 1.2) sees."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and _FLOAT.match(value.strip()):
        return float(value)
    return value


def model_config(model: Any) -> Optional[dict[str, Any]]:
    """The model's own configuration (a ``config`` attribute: HF ``PretrainedConfig``, dict or dataclass)."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    if isinstance(cfg, dict):
        return dict(cfg)
    to_dict = getattr(cfg, "to_dict", None)
    if callable(to_dict):
        try:
            out = to_dict()
            return out if isinstance(out, dict) else None
        except Exception:  # noqa: BLE001 - a broken config is not ours to crash on
            return None
    if hasattr(cfg, "__dict__"):
        return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}
    return None
