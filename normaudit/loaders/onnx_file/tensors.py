"""The tensors of an ONNX model, read one by one and only when asked: initializers stored in the model file or
in external data files (ONNX's external-data layout: a ``location`` relative to the model's folder, an
``offset`` and a ``length`` in bytes), and the values of ``Constant`` nodes.

:class:`TensorStore` never reads a tensor it is not asked for and counts the bytes it reads
(:attr:`TensorStore.bytes_read`); an external file is opened through :mod:`normaudit.loaders.safe_read`
(regular files only, never blocking) and must lie inside the model's folder, as ONNX's own loader requires.
Conversion from the stored bytes to numbers is ``onnx.numpy_helper.to_array`` (every ONNX dtype, bfloat16
included)."""
from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any, Optional

from normaudit.errors import UsageError
from normaudit.loaders.safe_read import file_kind, require_regular_file, require_within

#: the most elements of one tensor read for statistics (a norm's gain has thousands; 64 Mi is far above any)
MAX_READ_ELEMENTS = 2 ** 26

#: ONNX ``TensorProto.DataType`` -> the dtype names normaudit uses (``normaudit.vocabulary.dtypes``)
DTYPE_NAMES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
               9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 14: "complex64",
               15: "complex128", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
               20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1"}
#: bytes per element of the fixed-width dtypes (sub-byte types count as one byte: an upper bound)
_ITEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
               17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1}


def dtype_name(data_type: int) -> Optional[str]:
    """``float16`` for ``TensorProto.FLOAT16`` (10); None for an unknown or undefined type."""
    return DTYPE_NAMES.get(int(data_type))


def numel(dims: Any) -> int:
    """Number of elements of a tensor of shape ``dims`` (1 for a scalar); negative dims count as 0."""
    return math.prod(max(int(d), 0) for d in dims)


def stored_bytes(tensor: Any) -> int:
    """The bytes a tensor's data takes (``length`` of external data when given, else from shape and dtype)."""
    if tensor.data_location == 1:
        info = {e.key: e.value for e in tensor.external_data}
        if info.get("length", "").isdigit():
            return int(info["length"])
    return numel(tensor.dims) * _ITEM_BYTES.get(int(tensor.data_type), 1)


class TensorStore:
    """The initializers and constants of one model, read lazily (see the module docstring).

    ``model_path``: the ``.onnx`` file (external locations are relative to its folder). ``tensors``: name ->
    ``TensorProto`` (initializers, then the ``value`` of each ``Constant`` node). ``bytes_read`` counts the
    external bytes read so far; the model file itself is counted by the reader that parsed it.
    """

    def __init__(self, model_path: Path, tensors: dict[str, Any]):
        self.model_path = model_path
        self.base = model_path.parent
        self.tensors = tensors
        self.bytes_read = 0
        self._cache: dict[str, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def dims(self, name: str) -> Optional[list[int]]:
        """The tensor's shape, without reading its data; None when ``name`` is no tensor."""
        t = self.tensors.get(name)
        return [int(d) for d in t.dims] if t is not None else None

    def dtype(self, name: str) -> Optional[str]:
        """The tensor's dtype name (``float16``), without reading its data."""
        t = self.tensors.get(name)
        return dtype_name(t.data_type) if t is not None else None

    def array(self, name: str, max_elements: int = MAX_READ_ELEMENTS) -> Any:
        """The tensor as a numpy array (its stored dtype), reading only its bytes; None when it is no tensor
        or holds more than ``max_elements``. Raises UsageError naming the model for data that does not match
        the tensor's shape and dtype, an external file that is missing, outside the model's folder, not a
        regular file or too short."""
        if name in self._cache:
            return self._cache[name]
        t = self.tensors.get(name)
        if t is None or numel(t.dims) > max_elements:
            return None
        from onnx import TensorProto, numpy_helper

        if t.data_location == TensorProto.EXTERNAL:
            inline = TensorProto()
            inline.CopyFrom(t)
            del inline.external_data[:]
            inline.data_location = TensorProto.DEFAULT
            inline.raw_data = self._external_bytes(t)
            t = inline
        try:
            arr = numpy_helper.to_array(t)
        except Exception as err:  # noqa: BLE001 - onnx raises ValueError, TypeError or its own errors on bad data
            raise UsageError(f"tensor {name!r} of the ONNX model is corrupt: its data does not match its shape "
                             f"{list(t.dims)} and dtype {dtype_name(t.data_type) or t.data_type} "
                             f"({type(err).__name__}: {str(err)[:120]})", file=str(self.model_path)) from None
        self._cache[name] = arr
        return arr

    def _external_bytes(self, t: Any) -> bytes:
        """The bytes of an externally stored tensor (``location``/``offset``/``length``), bounded and counted."""
        info = {e.key: e.value for e in t.external_data}
        where = info.get("location", "")
        path = self._external_path(t.name, where)
        offset = int(info["offset"]) if info.get("offset", "").isdigit() else 0
        want = stored_bytes(t)
        require_regular_file(path, "ONNX external data")
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as err:
            raise UsageError(f"cannot open the external data of tensor {t.name!r}: {err.strerror or err}",
                             file=str(path)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"cannot read ONNX external data: expected a regular file, found "
                                 f"{file_kind(st.st_mode)}", file=str(path))
            if offset + want > st.st_size:
                raise UsageError(f"external data of tensor {t.name!r} is truncated: {want} bytes at offset {offset} "
                                 f"expected, the file has {st.st_size} bytes", file=str(path))
            data = os.pread(fd, want, offset)
        except OSError as err:
            raise UsageError(f"cannot read the external data of tensor {t.name!r}: {err.strerror or err}",
                             file=str(path)) from None
        finally:
            os.close(fd)
        self.bytes_read += len(data)
        return data

    def _external_path(self, tensor: str, where: str) -> Path:
        """The file an external ``location`` names, refused unless it is a relative path inside the model's
        folder (ONNX's loader refuses the same: a model must not read ``/etc/passwd`` or ``../secret``); a
        symbolic link may lead only where :func:`normaudit.loaders.safe_read.require_within` allows (the
        folder, or the blobs of a Hugging Face cache snapshot). The UsageError names both paths."""
        if not where or "\x00" in where:
            raise UsageError(f"tensor {tensor!r} is stored externally but names no file", file=str(self.model_path))
        rel = Path(where)
        if not rel.parts or rel.is_absolute() or ".." in rel.parts or where.startswith(("/", "\\")) or ":" in rel.parts[0]:
            named = os.path.normpath(os.path.join(os.path.abspath(self.base), where))
            raise UsageError(f"tensor {tensor!r} names its external data {where!r}, that is {named!r}, outside the "
                             f"model's folder {os.path.abspath(self.base)!r}: only a file inside the model's folder "
                             "is read", file=str(self.model_path))
        path = self.base / rel
        require_within(path, self.base, f"the external data of tensor {tensor!r} of {self.model_path.name!r}")
        return path

    def check_external(self) -> None:
        """Check every externally stored tensor without reading it: its file inside the model's folder
        (:meth:`_external_path`), a regular file, and long enough for its ``offset`` and ``length`` (a
        truncated data file is found before any tensor is read). Each file is stat'ed once. Raises UsageError."""
        sizes: dict[str, int] = {}
        for t in self.tensors.values():
            if t.data_location != 1:
                continue
            info = {e.key: e.value for e in t.external_data}
            where = info.get("location", "")
            if where not in sizes:
                path = self._external_path(t.name, where)
                sizes[where] = require_regular_file(path, f"the external data of tensor {t.name!r}").st_size
            offset = int(info["offset"]) if info.get("offset", "").isdigit() else 0
            if offset + stored_bytes(t) > sizes[where]:
                raise UsageError(f"external data of tensor {t.name!r} is truncated: {stored_bytes(t)} bytes at offset "
                                 f"{offset} expected, the file has {sizes[where]} bytes",
                                 file=str(self.base / where))
