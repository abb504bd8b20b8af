"""Configuration files the model is meant to follow (``--config``): JSON or YAML, HF ``config.json`` or a
training config. Parse errors are :class:`UsageError` with the file and line."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import yaml

from normaudit.errors import UsageError


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML mapping. Raises UsageError for a missing file, bad syntax or a non-mapping."""
    p = Path(path)
    if not p.is_file():
        raise UsageError("config file not found", file=str(p))
    text = p.read_text(encoding="utf-8", errors="replace")
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise UsageError(f"invalid JSON: {err.msg}", file=str(p), line=err.lineno) from err
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise UsageError(f"invalid YAML: {problem}", file=str(p), line=line) from err
    if not isinstance(data, dict):
        raise UsageError(f"config must be a mapping, got {type(data).__name__}", file=str(p))
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
