"""A GGUF file (llama.cpp's format) opened with the ``gguf`` package as a hostile file, served through the
interface of :class:`normaudit.loaders.checkpoint.Checkpoint`.

:func:`open_gguf` checks that the path is a regular file (:mod:`normaudit.loaders.safe_read`) and maps it with
``gguf.GGUFReader`` (``numpy.memmap``): the header (metadata and tensor table) is parsed, tensor data stays on
disk until :meth:`GgufFile.get` copies one tensor. The reader is bounded: every read of the file is checked
against its size before it is made, and the header may be at most :data:`MAX_HEADER_BYTES` long, so a
truncated or corrupt file is one :class:`~normaudit.errors.UsageError` (exit 2) and a forged array length cannot
make the parse loop over more elements than the file has bytes. Messages never quote the file's bytes.

Shapes are given in PyTorch's order (outermost first): GGUF stores ``ne[0]`` (the innermost, contiguous
dimension) first, so ``(4096,)`` for a norm gain and ``(n_head, head_dim)`` for a stacked per-head norm.
"""
from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path
from typing import Any, Optional

from normaudit.errors import UsageError
from normaudit.loaders.safe_read import file_kind, require_regular_file

#: the largest GGUF header (metadata and tensor table) read, in bytes: real files hold their tokenizer there
#: (a 262k-entry vocabulary with scores and token types is about 8 MB); tensor data is never counted
MAX_HEADER_BYTES = 64 * 2 ** 20
#: the first four bytes of every GGUF file
GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "GGUF files need the 'gguf' package: pip install 'normaudit[gguf]'"


def require_gguf(file: Optional[str] = None) -> Any:
    """The ``gguf`` module; UsageError with the install hint (``normaudit[gguf]``) when it is not installed."""
    try:
        import gguf
    except ImportError:
        raise UsageError(INSTALL_HINT, file=file) from None
    return gguf


class _Truncated(Exception):
    """A read past the end of the file (``where`` says what was being read)."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


class _HeaderTooLarge(Exception):
    """The header runs past :data:`MAX_HEADER_BYTES`."""


def _advise_random(data: Any) -> None:
    """Tell the kernel that the memory map ``data`` (a ``numpy.memmap``) is read at random from here on
    (``madvise(MADV_RANDOM)``): a page fault then reads that page, not the device's read-ahead window around it
    (``read_ahead_kb``, often 128 KB but 8 MB on some virtual disks, so that 65 norm gains of 16 KB each would
    pull in half a gigabyte of a 7B model's weights). Best effort: nothing where ``madvise`` is missing."""
    import mmap

    mm = getattr(data, "_mmap", None)
    advice = getattr(mmap, "MADV_RANDOM", None)
    if mm is not None and advice is not None and hasattr(mm, "madvise"):
        try:
            mm.madvise(advice)
        except (OSError, ValueError):
            pass


def _bounded_reader(gguf: Any) -> type:
    """``gguf.GGUFReader`` with every read checked against the file's size before it is made.

    ``GGUFReader._get`` slices its memory map, which silently returns fewer bytes past the end of the file: a
    forged length then parses as empty values and the loop over an array goes on for as many elements as the
    length says. Checking the slice first turns that into :class:`_Truncated` after at most one element per
    byte of the file, and :class:`_HeaderTooLarge` bounds the header."""
    import numpy as np

    class BoundedReader(gguf.GGUFReader):
        _in_header = True

        def _get(self, offset, dtype, count=1, override_order=None):  # noqa: D102 - gguf's reader hook
            end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
            if int(count) < 0 or end > len(self.data):
                raise _Truncated("the header (metadata and tensor table)" if self._in_header else "tensor data")
            if self._in_header and end > MAX_HEADER_BYTES:
                raise _HeaderTooLarge()
            return super()._get(offset, dtype, count, override_order)

        def _build_tensors(self, start_offs, fields):  # noqa: D102 - gguf's reader hook
            self._in_header = False
            _advise_random(self.data)
            return super()._build_tensors(start_offs, fields)

    return BoundedReader


def _refusal(err: BaseException, gguf: Any) -> str:
    """What is wrong with a file the reader refused, in words that quote none of its bytes."""
    if isinstance(err, _Truncated):
        return f"truncated GGUF file: {err.where} runs past the end of the file"
    if isinstance(err, _HeaderTooLarge):
        return (f"GGUF header over {MAX_HEADER_BYTES // 2 ** 20} MiB: refused (real files hold a tokenizer of a "
                "few MB there)")
    text = str(err)
    if isinstance(err, UnicodeDecodeError):
        return "corrupt GGUF header: a key or tensor name is not UTF-8 text"
    if isinstance(err, KeyError) or "Duplicate" in text:
        return "corrupt GGUF header: a metadata key appears twice"
    if "duplicated tensor" in text:
        return "corrupt GGUF header: two tensors have the same name"
    if "version" in text:
        versions = ", ".join(str(v) for v in getattr(gguf.gguf_reader, "READER_SUPPORTED_VERSIONS", []))
        return f"unsupported GGUF version (the installed gguf package reads versions {versions})"
    if isinstance(err, RecursionError):
        return "corrupt GGUF header: arrays nested too deep to read"
    return f"corrupt GGUF file: the gguf package cannot read its header ({type(err).__name__})"


def _open_reader(path: Path, gguf: Any) -> tuple[Any, int]:
    """(the bounded reader over ``path``, the file's size). Opened with ``O_NONBLOCK`` and checked with
    ``fstat`` again after opening (a file swapped for a FIFO in between cannot block); the memory map outlives
    the descriptor, which is closed here. Raises UsageError for a non-regular, empty, non-GGUF or corrupt file."""
    p = str(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise UsageError(f"cannot open GGUF file: {err.strerror or err}", file=p) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"cannot read GGUF file: expected a regular file, found {file_kind(st.st_mode)}", file=p)
        if st.st_size == 0:
            raise UsageError("empty file (0 bytes): expected a GGUF file", file=p)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            if fh.read(4) != GGUF_MAGIC:
                raise UsageError("not a GGUF file: it does not start with the GGUF magic bytes", file=p)
            fh.seek(0)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # numpy overflow warnings on forged dimensions
                    return _bounded_reader(gguf)(fh), st.st_size
            except (_Truncated, _HeaderTooLarge, ValueError, KeyError, IndexError, TypeError, OverflowError,
                    RecursionError, MemoryError, AttributeError) as err:
                raise UsageError(_refusal(err, gguf), file=p) from None
    except OSError as err:
        raise UsageError(f"cannot read GGUF file: {err.strerror or err}", file=p) from None
    finally:
        os.close(fd)


class GgufFile:
    """An opened GGUF file with the interface of :class:`normaudit.loaders.checkpoint.Checkpoint`: tensor names
    (``keys()``, as stored: ``blk.0.attn_norm.weight``), shapes (PyTorch order) and types without reading data,
    one tensor at a time with :meth:`get`, the metadata with :meth:`field`, ``config``/``config_source`` from a
    ``config.json`` beside the file, ``bytes_read``. Use as a context manager or call ``close()``."""

    format = "gguf"

    def __init__(self, path: Path, reader: Any, size: int, gguf: Any):
        self.path = self.weights_path = path
        self.size = size
        self._r = reader
        self._gguf = gguf
        self._tensors = {t.name: t for t in reader.tensors}
        self._read = int(reader.data_offset)  # the header, parsed once
        self.config, self.config_source = self._find_config()

    def _find_config(self) -> tuple[Optional[dict], Optional[str]]:
        from normaudit.loaders.checkpoint.common import read_json

        sibling = self.path.parent / "config.json"
        if sibling.is_file():
            cfg = read_json(sibling, "config")
            if isinstance(cfg, dict):
                return cfg, str(sibling)
        return None, None

    # -- metadata
    def field(self, key: str) -> Any:
        """The value of metadata ``key``: a number, a string, a list for an array (read whole: ask only for small
        ones), or None when the file has no such key or its value cannot be read."""
        f = self._r.fields.get(key)
        if f is None:
            return None
        try:
            return f.contents()
        except (ValueError, IndexError, TypeError, UnicodeDecodeError):
            return None

    def field_type(self, key: str) -> Optional[str]:
        """The GGUF value type of metadata ``key`` (``FLOAT32``, ``UINT32``, ``STRING``, ``ARRAY``...), None when absent."""
        f = self._r.fields.get(key)
        return f.types[0].name if f is not None and f.types else None

    @property
    def architecture(self) -> Optional[str]:
        """``general.architecture`` (``llama``, ``gemma2``), None when absent or not a string."""
        arch = self.field("general.architecture")
        return arch if isinstance(arch, str) else None

    # -- the Checkpoint interface
    def keys(self) -> list[str]:
        """Every tensor name, in the file's order."""
        return list(self._tensors)

    def raw_keys(self) -> list[str]:
        """The tensor names as stored (the same as :meth:`keys`: GGUF names carry no wrapper prefix)."""
        return list(self._tensors)

    def raw_key(self, key: str) -> str:
        """``key`` itself; KeyError when the file has no such tensor."""
        if key not in self._tensors:
            raise KeyError(key)
        return key

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, key: object) -> bool:
        return key in self._tensors

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's shape in PyTorch order (GGUF's ``ne`` reversed), without reading its data."""
        return tuple(int(d) for d in reversed(self._tensors[key].shape.tolist()))

    def ggml_type(self, key: str) -> str:
        """The tensor's GGML storage type (``F32``, ``F16``, ``BF16``, ``Q8_0``...)."""
        return self._tensors[key].tensor_type.name

    def dtype(self, key: str) -> Any:
        """The torch dtype :meth:`get` returns: the stored one for F32/F16/BF16/F64, float32 for a quantized type."""
        import torch

        return {"F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}.get(self.ggml_type(key),
                                                                                     torch.float32)

    def get(self, key: str) -> Any:
        """Read one tensor (CPU, PyTorch order): F32/F16/F64 as stored, BF16 as bfloat16, a quantized type
        dequantized to float32 (``gguf.quants.dequantize``). Only its bytes are read. UsageError if unreadable."""
        import numpy as np
        import torch

        t = self._tensors[key]
        kind = t.tensor_type.name
        shape = self.shape(key)
        try:
            if kind in ("F32", "F16", "F64"):
                out = torch.from_numpy(np.array(t.data)).reshape(shape)
            elif kind == "BF16":
                out = torch.from_numpy(np.array(t.data).view(np.int16)).view(torch.bfloat16).reshape(shape)
            else:
                out = torch.from_numpy(np.asarray(self._gguf.quants.dequantize(np.array(t.data), t.tensor_type),
                                                  dtype=np.float32)).reshape(shape)
        except (ValueError, TypeError, RuntimeError, NotImplementedError) as err:
            raise UsageError(f"cannot read tensor {key!r} ({kind}): {type(err).__name__}", file=str(self.path)) from None
        self._read += int(t.n_bytes)
        return out

    def prefetch(self, keys: Any) -> None:
        """Nothing to do: the memory map pages each tensor in when :meth:`get` copies it."""

    @property
    def bytes_read(self) -> int:
        """Bytes of the file read so far: the header once, plus the data bytes of each :meth:`get`."""
        return self._read

    def close(self) -> None:
        """Drop the reader (its memory map closes with it)."""
        self._tensors = {}
        self._r = None

    def __enter__(self) -> "GgufFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GgufFile({str(self.path)!r}, architecture={self.architecture!r}, tensors={len(self)})"


def open_gguf(path: str | Path) -> GgufFile:
    """Open a GGUF file: its header parsed, no tensor data read (see the module docstring).

    Raises UsageError (naming the file) when the ``gguf`` package is missing (the install hint), the path is
    missing or not a regular file (a FIFO, a device, a directory, a broken link), empty, not GGUF, truncated,
    its header over :data:`MAX_HEADER_BYTES`, or otherwise corrupt."""
    path = Path(path)
    require_regular_file(path, "GGUF file")
    gguf = require_gguf(str(path))
    reader, size = _open_reader(path, gguf)
    return GgufFile(path, reader, size, gguf)
