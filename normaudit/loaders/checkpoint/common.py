"""Text and JSON helpers the checkpoint readers share.

An error's cause on one bounded line (:func:`one_line`), the JSON type of a value as an error message names
it (:func:`json_type`), a JSON file read as a hostile file (:func:`read_json`: regular files only, size and
nesting bounded), and a value that may be JSON inside a string parsed with bounded nesting
(:func:`parse_json`); the file suffixes of torch checkpoints and the entries that hold an embedded config.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from normaudit.errors import UsageError
from normaudit.loaders.safe_read import MAX_NESTING, json_nesting, loads_json, read_regular

#: file suffixes of ``torch.save`` checkpoints
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
#: entries of a torch checkpoint, and of a safetensors ``__metadata__``, that hold an embedded config
CONFIG_KEYS = ("config", "model_args", "args", "hparams", "hyper_parameters")


def one_line(text: str, limit: int = 300) -> str:
    """``text`` (or ``str()`` of an exception) on one line, whitespace runs collapsed, cut to ``limit``
    characters with ``...``."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_json(path: Path, what: str) -> Any:
    """A JSON file beside or in a checkpoint (regular files only, nesting bounded); UsageError otherwise."""
    return loads_json(read_regular(path, what), what, str(path))


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (``object``, ``array``, ``string``, ``boolean``, ``null``,
    ``number``), for an error saying what was found."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def parse_json(value: Any, path: Optional[Path] = None, what: str = "embedded config") -> Any:
    """``value`` parsed as JSON when it is a string holding JSON (``"1e-06"`` -> 1e-06, an object -> a dict),
    else ``value`` itself.

    Nesting is bounded (:data:`normaudit.loaders.safe_read.MAX_NESTING`): a deeper string is a UsageError
    naming ``path`` and ``what`` rather than a RecursionError."""
    if not isinstance(value, str):
        return value
    depth = json_nesting(value)
    if depth > MAX_NESTING:
        raise UsageError(f"{what} nests lists/objects {depth} levels deep; at most {MAX_NESTING} expected",
                         file=str(path) if path else None)
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value
