"""One ``.safetensors`` file, read through ``safetensors.safe_open`` after its header is checked here.

The 8-byte header length, the JSON header (an object; ``__metadata__`` mapping names to strings; every entry
a dtype name, a shape of non-negative sizes and ``data_offsets`` inside the file) are validated before the
library sees the file, so a truncated or corrupted file is a :class:`~normaudit.errors.UsageError` saying what
was expected and found. Tensors are read one at a time; ``posix_fadvise`` hints keep the reads to the
header and the byte ranges of the tensors asked for (:attr:`SafetensorsReader.bytes_read` counts them).
"""
from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

import torch
from safetensors import SafetensorError, safe_open

from normaudit.errors import UsageError
from normaudit.loaders.checkpoint.common import CONFIG_KEYS, json_type, one_line, parse_json
from normaudit.loaders.safe_read import looks_like_text, describe_content, file_kind, loads_json, require_regular_file

_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
              "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
              "F8_E8M0": "float8_e8m0fnu", "C64": "complex64", "F4": "float4_e2m1fn_x2"}


class SafetensorsReader:
    """One ``.safetensors`` file: header validated on open, tensors read one at a time on ``get``."""

    format = "safetensors"

    def __init__(self, path: Path):
        self.path = path
        require_regular_file(path, "safetensors checkpoint")
        # Unbuffered, read-ahead disabled: the header read below fetches exactly 8 + N bytes. The handle
        # stays open for posix_fadvise hints (see prefetch).
        try:
            self._fh = open(path, "rb", buffering=0)
        except OSError as e:
            raise UsageError(f"cannot open: {e.strerror or e}", file=str(path)) from None
        try:
            self._advise(0, 0, "POSIX_FADV_RANDOM")
            self._check_header(path)
            self._advise(0, self._data_start, "POSIX_FADV_WILLNEED")
            self._f = safe_open(str(path), framework="pt")
        except (SafetensorError, OSError) as e:
            self._fh.close()
            # The header was parsed and checked above, so the library's "invalid JSON in header" means an
            # entry it does not accept (an unknown dtype), not JSON that does not parse.
            why = one_line(e).replace("Error while deserializing header: invalid JSON in header: ", "")
            raise UsageError(f"unreadable safetensors file: its header is valid JSON, but the safetensors library "
                             f"refuses an entry: {why}", file=str(path)) from None
        except BaseException:
            self._fh.close()
            raise
        self.bytes_read = self._data_start

    def _advise(self, offset: int, length: int, advice: str) -> None:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fh.fileno(), offset, length, getattr(os, advice))

    def _check_header(self, path: Path) -> None:
        st = os.fstat(self._fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"cannot read safetensors checkpoint: expected a regular file, found "
                             f"{file_kind(st.st_mode)}", file=str(path))
        size = st.st_size
        head = self._fh.read(8)
        if len(head) < 8:
            raise UsageError(f"truncated safetensors file: {size} bytes, shorter than the 8-byte header length "
                             "field (expected 8 bytes of header length, then a JSON header)", file=str(path))
        (n,) = struct.unpack("<Q", head)
        first = self._fh.read(1)
        self._fh.seek(8)
        if looks_like_text(head) or (first not in (b"{", b"[") and n > size - 8):
            # Not laid out as safetensors (a length that fits the file, or JSON right after the length field;
            # a real length's high bytes are 0, never text): said by type, since the length field as a
            # number would spell the file's first 8 bytes (of a secret a link may lead to).
            self._fh.seek(0)
            found = describe_content(self._fh.read(64))
            self._fh.seek(8)
            raise UsageError("not a safetensors file: expected an 8-byte header length, then a JSON header, "
                             f"found {found}", file=str(path))
        if n == 0 or n > size - 8:
            raise UsageError(f"corrupted or truncated safetensors file: the header length field says {n} bytes "
                             f"of JSON header, but the file holds {size - 8} bytes after it", file=str(path))
        try:
            header = loads_json(self._fh.read(n), "safetensors header", str(path))
        except UsageError as err:
            raise UsageError(f"corrupted safetensors header: not valid JSON: {err.message}", file=str(path),
                             line=err.line) from None
        if not isinstance(header, dict):
            raise UsageError("corrupted safetensors header: expected a JSON object (tensor name -> dtype, shape, "
                             f"data_offsets), found a JSON {json_type(header)}", file=str(path))
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise UsageError("corrupted safetensors header: expected __metadata__ to map names to strings, found "
                             f"{json_type(meta) if not isinstance(meta, dict) else 'non-string values'}",
                             file=str(path))
        self._offsets: dict[str, tuple[int, int]] = {}
        for key, entry in header.items():
            try:
                start, end = entry["data_offsets"]
                shape = entry["shape"]
                assert isinstance(entry["dtype"], str)
                assert isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                assert isinstance(start, int) and isinstance(end, int) and 0 <= start <= end
            except (TypeError, KeyError, ValueError, AssertionError):
                raise UsageError(f"corrupted safetensors header: entry {key!r} lacks a valid dtype, shape or "
                                 f"data_offsets: expected a dtype name, a shape of non-negative sizes and "
                                 f"data_offsets [start, end] with 0 <= start <= end, found "
                                 f"{one_line(json.dumps(entry), 120)}", file=str(path)) from None
            self._offsets[key] = (start, end)
        data_len = max((end for _, end in self._offsets.values()), default=0)
        if 8 + n + data_len > size:
            raise UsageError(f"truncated safetensors file: the header describes {data_len} bytes of tensor "
                             f"data but only {size - 8 - n} follow it", file=str(path))
        self._data_start = 8 + n

    def keys(self) -> list[str]:
        return list(self._f.keys())

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._f.get_slice(key).get_shape())

    def dtype(self, key: str) -> torch.dtype:
        name = self._f.get_slice(key).get_dtype()
        return getattr(torch, _ST_DTYPES.get(name, name.lower()))

    def prefetch(self, keys: Iterable[str]) -> None:
        # safetensors reads through mmap, where each page fault reads ahead read_ahead_kb (often MBs)
        # around it; asking the kernel for exactly the tensors' ranges first keeps reads to those bytes
        # and lets them proceed in parallel.
        for key in keys:
            start, end = self._offsets.get(key, (0, 0))
            self._advise(self._data_start + start, end - start, "POSIX_FADV_WILLNEED")

    def get(self, key: str) -> torch.Tensor:
        self.prefetch([key])
        try:
            t = self._f.get_tensor(key)
        except SafetensorError as e:
            raise UsageError(f"cannot read tensor {key!r}: {one_line(e)}", file=str(self.path)) from None
        start, end = self._offsets[key]
        self.bytes_read += end - start
        return t

    def embedded_config(self) -> tuple[Optional[dict], Optional[str]]:
        meta = {k: v for k, v in (self._f.metadata() or {}).items() if k != "format"}
        parsed = {k: parse_json(v, self.path, f"safetensors __metadata__ entry {k!r}") for k, v in meta.items()}
        for k in (*CONFIG_KEYS, *meta):
            if isinstance(parsed.get(k), dict):
                return parsed[k], f"{self.path}:__metadata__.{k}"
        return (parsed, f"{self.path}:__metadata__") if parsed else (None, None)

    def close(self) -> None:
        self._f = None
        self._fh.close()
