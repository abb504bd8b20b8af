"""The checkpoint formats behind one reader interface (``keys``, ``shape``, ``dtype``, ``get``, ``prefetch``,
``embedded_config``, ``close``, ``bytes_read``).

:func:`open_file` opens one weights file by its suffix (safetensors or torch); :class:`ShardedReader` reads a
``*.index.json``'s ``weight_map``, refusing a shard named outside the index's folder, of an unknown format or
not a regular file, and opens each shard through :func:`open_file` when it is first needed.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from normaudit.errors import UsageError
from normaudit.loaders.checkpoint.common import TORCH_SUFFIXES, json_type, one_line, read_json
from normaudit.loaders.checkpoint.safetensors_file import SafetensorsReader
from normaudit.loaders.checkpoint.torch_file import TorchReader
from normaudit.loaders.safe_read import require_regular_file, require_within


def open_file(path: Path):
    """The reader of one weights file: :class:`SafetensorsReader` for a ``.safetensors`` name, else
    :class:`TorchReader`. Raises UsageError as they do."""
    if path.name.endswith(".safetensors"):
        return SafetensorsReader(path)
    return TorchReader(path)


def _check_shard(index: Path, shard: str, tensors: int) -> None:
    """Refuse a shard the index names outside its own folder (``../x``, an absolute path), of an unknown
    format, missing, not a regular file, or a symbolic link whose real path leaves the index's folder
    (:func:`normaudit.loaders.safe_read.require_within`: links into the Hugging Face hub cache's own
    ``blobs``, ``snapshots/*/x -> ../../blobs/sha``, stay readable)."""
    holding = f"holding {tensors} tensor{'s' if tensors != 1 else ''}"
    parts = shard.replace("\\", "/").split("/")
    if os.path.isabs(shard) or shard.startswith(("/", "\\")) or ".." in parts or (len(shard) > 1 and shard[1] == ":"):
        raise UsageError(f"checkpoint index: expected shard files inside the index's folder, found {shard!r} "
                         f"({holding}), which leaves it; normaudit reads nothing outside the checkpoint's folder",
                         file=str(index))
    if not shard.endswith((".safetensors", *TORCH_SUFFIXES)):
        raise UsageError(f"checkpoint index: expected shard files ending .safetensors, .pt, .pth, .bin or .ckpt, "
                         f"found {shard!r} ({holding})", file=str(index))
    path = index.parent / shard
    if not os.path.lexists(path):
        raise UsageError(f"checkpoint index names missing shard {shard!r} ({holding}): expected it beside the "
                         "index, found no such file", file=str(index))
    try:
        require_regular_file(path, "checkpoint shard")
        require_within(path, index.parent, "checkpoint shard")
    except UsageError as err:
        raise UsageError(f"checkpoint index names shard {shard!r} ({holding}): {err.message}", file=str(index)) from None


class ShardedReader:
    """A ``*.index.json`` (``weight_map``: key -> shard file); shards opened only when first needed."""

    format = "sharded"

    def __init__(self, index: Path):
        self.path = index
        data = read_json(index, "checkpoint index")
        wmap = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wmap, dict) or not wmap:
            if not isinstance(data, dict):
                found = f"a JSON {json_type(data)}"
            elif "weight_map" not in data:
                found = "no 'weight_map' key"
            else:
                found = f"'weight_map' as a JSON {json_type(wmap)}" if not isinstance(wmap, dict) else "it empty"
            raise UsageError(f"checkpoint index has no 'weight_map' object: expected one mapping tensor names to "
                             f"shard files, found {found}", file=str(index))
        for key, shard in wmap.items():
            if not isinstance(shard, str) or not shard:
                raise UsageError(f"checkpoint index: expected the shard of {key!r} to be a file name, found "
                                 f"{one_line(json.dumps(shard), 60)}", file=str(index))
        self._map = dict(wmap)
        for shard in sorted(set(self._map.values())):
            _check_shard(index, shard, sum(1 for v in self._map.values() if v == shard))
        self._open: dict[str, Any] = {}

    def _shard(self, key: str):
        name = self._map[key]
        if name not in self._open:
            self._open[name] = open_file(self.path.parent / name)
        return self._open[name]

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self._open.values())

    @property
    def shards(self) -> list[str]:
        return sorted(set(self._map.values()))

    def keys(self) -> list[str]:
        return list(self._map)

    def _call(self, key: str, method: str):
        try:
            return getattr(self._shard(key), method)(key)
        except (KeyError, SafetensorError):
            raise UsageError(f"index maps {key!r} to shard {self._map[key]!r}, which lacks it",
                             file=str(self.path)) from None

    def shape(self, key):
        return self._call(key, "shape")

    def dtype(self, key):
        return self._call(key, "dtype")

    def get(self, key):
        return self._call(key, "get")

    def embedded_config(self):
        return None, None

    def prefetch(self, keys: Iterable[str]) -> None:
        by_shard: dict[str, list[str]] = {}
        for key in keys:
            by_shard.setdefault(self._map[key], []).append(key)
        for keys_ in by_shard.values():
            self._shard(keys_[0]).prefetch(keys_)

    def close(self) -> None:
        for r in self._open.values():
            r.close()
        self._open.clear()
