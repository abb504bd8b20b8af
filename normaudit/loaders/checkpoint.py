"""Checkpoint readers and checkpoint-only inspection of normalisation parameters.

``open_checkpoint`` opens ``.safetensors`` files (lazily, through ``safetensors.safe_open``), sharded
checkpoints (``*.index.json`` with a ``weight_map``), model directories (``config.json`` + weights) and
``.pt/.pth/.bin/.ckpt`` files (``torch.load(..., weights_only=True)`` only: normaudit never unpickles
arbitrary objects). ``inspect_norm_params`` finds the norm parameters of a checkpoint by name and shape
and summarises them as ``normaudit.report.WeightStats``, reading only the small 1-D tensors.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import re
import stat
import struct
import warnings
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import torch
from pydantic import BaseModel, ConfigDict
from safetensors import SafetensorError, safe_open

from normaudit.errors import UsageError
from normaudit.report import Kind, Site, WeightStats
from normaudit.loaders.safe_read import MAX_NESTING, file_kind, json_nesting, loads_json, read_regular, require_regular_file

__all__ = [
    "Checkpoint",
    "CheckpointNormGroup",
    "open_checkpoint",
    "inspect_norm_params",
    "group_weight_stats",
    "checkpoint_target",
]

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
# Directory layouts, in order of preference (Hugging Face names first).
_DIR_WEIGHTS = ("model.safetensors.index.json", "model.safetensors",
                "pytorch_model.bin.index.json", "pytorch_model.bin")
# torch containers holding the state_dict (outermost first), and entries holding an embedded config.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module")
_CONFIG_KEYS = ("config", "model_args", "args", "hparams", "hyper_parameters")
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
              "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
              "F8_E8M0": "float8_e8m0fnu", "C64": "complex64", "F4": "float4_e2m1fn_x2"}


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------- readers
class _SafetensorsReader:
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
            why = _one_line(e).replace("Error while deserializing header: invalid JSON in header: ", "")
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
                             f"data_offsets), found a JSON {_json_type(header)}", file=str(path))
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise UsageError("corrupted safetensors header: expected __metadata__ to map names to strings, found "
                             f"{_json_type(meta) if not isinstance(meta, dict) else 'non-string values'}",
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
                                 f"{_one_line(json.dumps(entry), 120)}", file=str(path)) from None
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
            raise UsageError(f"cannot read tensor {key!r}: {_one_line(e)}", file=str(self.path)) from None
        start, end = self._offsets[key]
        self.bytes_read += end - start
        return t

    def embedded_config(self) -> tuple[Optional[dict], Optional[str]]:
        meta = {k: v for k, v in (self._f.metadata() or {}).items() if k != "format"}
        parsed = {k: _parse_json(v, self.path, f"safetensors __metadata__ entry {k!r}") for k, v in meta.items()}
        for k in (*_CONFIG_KEYS, *meta):
            if isinstance(parsed.get(k), dict):
                return parsed[k], f"{self.path}:__metadata__.{k}"
        return (parsed, f"{self.path}:__metadata__") if parsed else (None, None)

    def close(self) -> None:
        self._f = None
        self._fh.close()


def _read_json(path: Path, what: str) -> Any:
    """A JSON file beside or in a checkpoint (regular files only, nesting bounded); UsageError otherwise."""
    return loads_json(read_regular(path, what), what, str(path))


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _parse_json(value: Any, path: Optional[Path] = None, what: str = "embedded config") -> Any:
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


def _torch_reason(err: Exception) -> str:
    """The cause in torch's (long, multi-line) load error, on one line."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    reason = next((ln.split("WeightsUnpickler error:", 1)[1].strip() for ln in lines
                   if "WeightsUnpickler error:" in ln), "")
    if not reason:
        reason = next((ln for ln in lines if ln.startswith(("Trying to load", "Unsupported"))), "")
    reason = (reason or (lines[0] if lines else "")).split(". Please ")[0].rstrip(".")
    return _one_line(f"{type(err).__name__}: {reason}" if reason else type(err).__name__, 200)


#: bytes of a pickle scanned (never executed) to tell a corrupt pickle from one that needs code
_PICKLE_SCAN_BYTES = 64 * 2 ** 20
# torch.save's legacy format starts with this number pickled (torch.serialization.MAGIC_NUMBER)
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}


def _allowed_globals() -> set[str]:
    """The callables ``torch.load(weights_only=True)`` rebuilds objects with (torch's allowlist, plus
    ``argparse.Namespace`` that normaudit adds); empty when this torch does not expose it."""
    try:
        from torch import _weights_only_unpickler as wou

        return set(wou._get_allowed_globals()) | {"argparse.Namespace"}
    except Exception:  # noqa: BLE001 - a private torch API: degrade to torch's own message
        return set()


def scan_pickle(data: bytes, max_pickles: int = 5) -> tuple[list[str], Optional[str], int]:
    """Read the opcodes of up to ``max_pickles`` consecutive pickles in ``data`` with ``pickletools.genops``
    (a parser: nothing is imported, built or run).

    Returns (``module.name`` of every GLOBAL/STACK_GLOBAL, in order; why the data is not a well-formed
    pickle (the parser's error), or None; how many complete pickles were read before it). ``torch.save``'s legacy format is five pickles
    back to back followed by raw storage bytes; its zip format holds one (``data.pkl``).
    """
    import io
    import pickletools

    stream = io.BytesIO(data)
    found: list[str] = []
    count = 0
    while count < max_pickles and stream.tell() < len(data):
        strings: list[str] = []
        memo: dict[Any, str] = {}
        try:
            for op, arg, _pos in pickletools.genops(stream):
                if op.name in _STRING_OPS and isinstance(arg, (str, bytes)):
                    strings.append(arg if isinstance(arg, str) else arg.decode("latin-1"))
                elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
                    memo[arg] = strings[-1]
                elif op.name == "MEMOIZE" and strings:
                    memo[len(memo)] = strings[-1]
                elif op.name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
                    strings.append(memo[arg])
                elif op.name == "GLOBAL" and isinstance(arg, str):
                    found.append(".".join(arg.split(" ", 1)))
                elif op.name == "STACK_GLOBAL":
                    found.append(".".join(strings[-2:]) if len(strings) >= 2 else "(unknown)")
        except Exception as err:  # noqa: BLE001 - genops raises ValueError and others on garbage
            return found, _one_line(err, 120), count
        count += 1
    return found, None, count


def _describe_start(head: bytes) -> str:
    if not head:
        return "an empty file (0 bytes)"
    text = head.decode("utf-8", "replace")
    if all(ch.isprintable() or ch in "\n\r\t" for ch in text[:32]):
        return f"text starting {text[:32]!r}"
    return f"bytes starting {head[:12].hex(' ')}"


def _pickle_of(path: Path) -> tuple[Optional[bytes], str, Optional[str]]:
    """(the pickle bytes to scan, where they are, why the file is not a torch checkpoint at all, or None)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(_PICKLE_SCAN_BYTES)
    expected = "expected a torch.save checkpoint (a zip archive holding */data.pkl, or a pickle)"
    if size == 0:
        return None, "", "the file is empty"
    if head[:2] == b"PK":
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
                pkl = next((n for n in names if n.endswith("data.pkl") and n.count("/") == 1), None)
                if pkl is None:
                    return None, "", f"{expected}, found a zip archive without */data.pkl (members: " \
                                     f"{_one_line(', '.join(map(repr, names[:6])), 160)})"
                with z.open(pkl) as member:
                    return member.read(_PICKLE_SCAN_BYTES), f"{pkl} in the zip archive", None
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, ValueError) as err:
            return None, "", f"{expected}, found a corrupt or truncated zip archive of {size} bytes " \
                             f"({_one_line(err, 100)})"
    if head[:1] != b"\x80" and not head[:1] in (b"(", b"}", b"]", b"c"):
        return None, "", f"{expected}, found {_describe_start(head)}"
    return head, "the pickle", None


def _torch_error(path: Path, err: Exception) -> UsageError:
    """One line saying why torch could not load ``path``: not a checkpoint at all, a corrupt zip or pickle,
    a pickle that needs code (naming the callable), or else torch's own cause. Reads the file again, as
    data only."""
    try:
        data, where, not_torch = _pickle_of(path)
    except OSError as e:
        return UsageError(f"cannot read torch checkpoint: {e.strerror or e}", file=str(path))
    if not_torch:
        return UsageError(f"cannot read torch checkpoint: {not_torch}", file=str(path))
    globals_, corrupt, count = scan_pickle(data or b"")
    allowed = _allowed_globals()
    code = [g for g in dict.fromkeys(globals_) if allowed and g not in allowed]
    if not allowed and isinstance(err, pickle.UnpicklingError) and "GLOBAL" in str(err):
        code = [_torch_reason(err)]  # this torch hides its allowlist: quote its refusal
    if code:
        plain = "a plain pickle, not torch.save output: " if count and where == "the pickle" and \
            not _legacy_magic(data or b"") else ""
        return UsageError(f"refusing to unpickle: {plain}expected tensors and plain containers only, found a pickle "
                          f"that needs code to load: it calls {', '.join(code[:3])}{_pickled_module_hint(code)}; "
                          "normaudit never runs code from a checkpoint (it only loads with torch.load(weights_only=True))",
                          file=str(path))
    if corrupt:
        if where == "the pickle" and count:
            where = f"pickle {count + 1} of the file"
        return UsageError(f"cannot read torch checkpoint: expected a well-formed pickle ({where}), found it garbled "
                          f"or truncated: {corrupt}", file=str(path))
    if where == "the pickle" and not _legacy_magic(data or b""):
        return UsageError("cannot read torch checkpoint: expected torch.save output, found a plain Python pickle "
                          f"({_torch_reason(err)})", file=str(path))
    return UsageError(f"cannot read torch checkpoint: torch.load(weights_only=True) fails on {where}: "
                      f"{_torch_reason(err)}", file=str(path))


def _pickled_module_hint(code: Sequence[str]) -> str:
    """`` (a whole nn.Module saved with torch.save(model): save model.state_dict() instead)`` when one of the
    callables a refused pickle needs is a ``torch.nn`` module class (a pickled module names its class as
    ``torch.nn.modules.<file>.<Class>``, or a user's ``nn.Module`` subclass beside it); else ``""``."""
    if any(name.startswith("torch.nn.modules.") for name in code):
        return " (a whole nn.Module saved with torch.save(model): save model.state_dict() instead)"
    return ""


def _legacy_magic(data: bytes) -> bool:
    """True when ``data`` starts with torch.save's legacy magic number (a pickled long)."""
    import pickletools

    try:
        for op, arg, _ in pickletools.genops(data[:64]):
            if op.name not in ("PROTO", "FRAME"):
                return op.name in ("LONG1", "LONG", "LONG4") and arg == _LEGACY_MAGIC
    except Exception:  # noqa: BLE001
        return False
    return False


def _torch_load(path: Path) -> tuple[Any, bool]:
    """``torch.load`` with ``weights_only=True`` (mmap first, then without for old formats); (obj, mmapped).

    Only regular files are loaded (a FIFO or device is refused before opening). ``argparse.Namespace`` is
    allowlisted (plain attribute bag, common for embedded training args). Raises UsageError saying what the
    file is, what was expected and what was found (:func:`_torch_error`).
    """
    require_regular_file(path, "torch checkpoint")
    with warnings.catch_warnings(), torch.serialization.safe_globals([argparse.Namespace]):
        warnings.simplefilter("ignore")
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True), True
        except pickle.UnpicklingError as e:
            raise _torch_error(path, e) from None
        except Exception:  # noqa: BLE001 - mmap needs the zip format; retry without it, still weights_only
            pass
        try:
            return torch.load(path, map_location="cpu", weights_only=True), False
        except Exception as e:  # noqa: BLE001 - torch raises KeyError, RuntimeError, ... on bad files
            raise _torch_error(path, e) from None


def _as_dict(value: Any) -> Optional[dict]:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, argparse.Namespace):
        return vars(value).copy()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, str):
        parsed = _parse_json(value)
        return parsed if isinstance(parsed, dict) else None
    return None


class _TorchReader:
    """A ``torch.save``d state_dict, possibly inside containers; tensors memory-mapped where possible."""

    format = "torch"

    def __init__(self, path: Path):
        self.path = path
        obj, self.mmapped = _torch_load(path)
        self._config: Optional[dict] = None
        self._config_source: Optional[str] = None
        trail: list[str] = []
        for _ in range(16):
            if not isinstance(obj, Mapping):
                raise UsageError(f"no state_dict found: the checkpoint holds a {type(obj).__name__}"
                                 + (f" at {'/'.join(trail)}" if trail else ""), file=str(path))
            if self._config is None:
                for k in _CONFIG_KEYS:
                    if k in obj and (cfg := _as_dict(obj[k])) is not None:
                        self._config, self._config_source = cfg, f"{path}:{'/'.join([*trail, k])}"
                        break
            sub = next((k for k in _CONTAINER_KEYS if isinstance(obj.get(k), Mapping)), None)
            if sub is None:
                break
            trail.append(sub)
            obj = obj[sub]
        self._sd = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
        if not self._sd:
            where = "/".join(trail) or "top level"
            raise UsageError(f"no tensors found in the checkpoint ({where} keys: "
                             f"{_one_line(', '.join(map(str, list(obj)[:8])), 120)})", file=str(path))
        if self.mmapped:
            try:
                with zipfile.ZipFile(path) as z:
                    self.bytes_read = sum(i.file_size for i in z.infolist() if i.filename.endswith(".pkl"))
            except (OSError, zipfile.BadZipFile):
                self.bytes_read = 0
        else:
            self.bytes_read = path.stat().st_size

    def keys(self) -> list[str]:
        return list(self._sd)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._sd[key].shape)

    def dtype(self, key: str) -> torch.dtype:
        return self._sd[key].dtype

    def get(self, key: str) -> torch.Tensor:
        t = self._sd[key]
        if self.mmapped:
            self.bytes_read += t.nbytes
        return t

    def embedded_config(self) -> tuple[Optional[dict], Optional[str]]:
        return self._config, self._config_source

    def prefetch(self, keys: Iterable[str]) -> None:
        pass

    def close(self) -> None:
        self._sd = {}


def _open_file(path: Path):
    if path.name.endswith(".safetensors"):
        return _SafetensorsReader(path)
    return _TorchReader(path)


def _check_shard(index: Path, shard: str, tensors: int) -> None:
    """Refuse a shard the index names outside its own folder (``../x``, an absolute path), of an unknown
    format, missing, or not a regular file. The check is on the name as written (lexical), so shards that
    are symlinks into a cache (the Hugging Face hub's ``snapshots/*/x -> ../../blobs/sha``) stay readable;
    the file they lead to must still be a regular file."""
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
    except UsageError as err:
        raise UsageError(f"checkpoint index names shard {shard!r} ({holding}): {err.message}", file=str(index)) from None


class _ShardedReader:
    """A ``*.index.json`` (``weight_map``: key -> shard file); shards opened only when first needed."""

    format = "sharded"

    def __init__(self, index: Path):
        self.path = index
        data = _read_json(index, "checkpoint index")
        wmap = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wmap, dict) or not wmap:
            if not isinstance(data, dict):
                found = f"a JSON {_json_type(data)}"
            elif "weight_map" not in data:
                found = "no 'weight_map' key"
            else:
                found = f"'weight_map' as a JSON {_json_type(wmap)}" if not isinstance(wmap, dict) else "it empty"
            raise UsageError(f"checkpoint index has no 'weight_map' object: expected one mapping tensor names to "
                             f"shard files, found {found}", file=str(index))
        for key, shard in wmap.items():
            if not isinstance(shard, str) or not shard:
                raise UsageError(f"checkpoint index: expected the shard of {key!r} to be a file name, found "
                                 f"{_one_line(json.dumps(shard), 60)}", file=str(index))
        self._map = dict(wmap)
        for shard in sorted(set(self._map.values())):
            _check_shard(index, shard, sum(1 for v in self._map.values() if v == shard))
        self._open: dict[str, Any] = {}

    def _shard(self, key: str):
        name = self._map[key]
        if name not in self._open:
            self._open[name] = _open_file(self.path.parent / name)
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


# ------------------------------------------------------------------------------------------- Checkpoint
_ORIG_MOD = re.compile(r"(^|\.)_orig_mod\.")


def _canonical(key: str) -> str:
    key = _ORIG_MOD.sub(r"\1", key)
    while key.startswith(("module.", "model.")):
        key = key.split(".", 1)[1]
    return key


class Checkpoint:
    """An opened checkpoint: key listing, shapes and dtypes without reading data; tensors read one by one.

    Keys (``keys()``) are the checkpoint's keys with wrapper prefixes removed: ``_orig_mod.`` components
    (``torch.compile``) anywhere, a leading ``module.`` (DDP/DeepSpeed), and with ``strip_model_prefix`` a
    leading ``model.``; a key is left raw when stripping would make it collide with another. ``raw_keys()``
    gives the keys as stored; every method taking a key accepts either form.

    Attributes: ``path`` (what was opened), ``weights_path`` (the weights file or index actually read),
    ``format`` (``safetensors``, ``torch``, ``sharded``), ``config`` (a dict, or None) and ``config_source``
    (``DIR/config.json``, ``FILE:__metadata__[.KEY]`` or ``FILE:ENTRY[/ENTRY]``): a sibling ``config.json``
    wins over a config embedded in the weights file. Use as a context manager or call ``close()``.
    """

    def __init__(self, path: Path, weights_path: Path, reader, strip_model_prefix: bool = False):
        self.path = path
        self.weights_path = weights_path
        self._r = reader
        self.format: str = reader.format
        raw = reader.keys()
        strips = ["module."] + (["model."] if strip_model_prefix else [])
        norm = [_ORIG_MOD.sub(r"\1", k) for k in raw]
        for p in strips:
            norm = [k[len(p):] if k.startswith(p) else k for k in norm]
        if len(set(norm)) != len(norm):  # collisions: keep the colliding keys raw
            seen: dict[str, int] = {}
            for k in norm:
                seen[k] = seen.get(k, 0) + 1
            norm = [k if seen[k] == 1 else r for k, r in zip(norm, raw)]
            if len(set(norm)) != len(norm):
                norm = list(raw)
        self._to_raw = dict(zip(norm, raw))
        self._from_raw = dict(zip(raw, norm))
        self.config, self.config_source = self._find_config()

    def _find_config(self) -> tuple[Optional[dict], Optional[str]]:
        sibling = (self.path if self.path.is_dir() else self.path.parent) / "config.json"
        if sibling.is_file():
            cfg = _read_json(sibling, "config")
            if isinstance(cfg, dict):
                return cfg, str(sibling)
        return self._r.embedded_config()

    # -- listing
    def keys(self) -> list[str]:
        """All tensor keys (normalised, see the class doc), in the checkpoint's order."""
        return list(self._to_raw)

    def raw_keys(self) -> list[str]:
        """All tensor keys exactly as stored."""
        return list(self._from_raw)

    def __len__(self) -> int:
        return len(self._to_raw)

    def __contains__(self, key: object) -> bool:
        return key in self._to_raw or key in self._from_raw

    def raw_key(self, key: str) -> str:
        """The stored key for ``key`` (normalised or raw); KeyError if absent."""
        if key in self._to_raw:
            return self._to_raw[key]
        if key in self._from_raw:
            return key
        raise KeyError(key)

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's shape, without reading its data."""
        return self._r.shape(self.raw_key(key))

    def dtype(self, key: str) -> torch.dtype:
        """The tensor's stored dtype, without reading its data."""
        return self._r.dtype(self.raw_key(key))

    def get(self, key: str) -> torch.Tensor:
        """Read one tensor (CPU, stored dtype); only its bytes are read. UsageError if unreadable."""
        return self._r.get(self.raw_key(key))

    def prefetch(self, keys: Iterable[str]) -> None:
        """Hint that these tensors will be read soon (safetensors: ``posix_fadvise(WILLNEED)`` on exactly
        their byte ranges, so the reads run in parallel and mmap read-ahead does not pull in their
        neighbours). No data is counted in ``bytes_read`` until ``get``; a no-op for torch files."""
        self._r.prefetch([self.raw_key(k) for k in keys])

    @property
    def bytes_read(self) -> int:
        """Bytes read from disk so far. Exact for safetensors (8-byte length + JSON header once, plus the
        data bytes of each ``get``); for mmapped torch zips the pickle records plus the bytes of each
        tensor fetched (page granularity ignored); the whole file size for torch files loaded without mmap."""
        return self._r.bytes_read

    def match_keys(self, model_keys: Iterable[str]) -> dict[str, str]:
        """Map a model's ``state_dict`` keys onto this checkpoint's keys (the ``keys()`` form).

        Exact matches (normalised or raw) first; then keys equal after removing ``module.``, ``model.``
        and ``_orig_mod.`` prefixes on both sides, when that match is unique. Unmatched model keys are
        absent from the result.
        """
        model_keys = list(model_keys)
        out: dict[str, str] = {}
        used: set[str] = set()
        for mk in model_keys:
            if mk in self:
                out[mk] = mk if mk in self._to_raw else self._from_raw[mk]
                used.add(out[mk])
        by_canon: dict[str, list[str]] = {}
        for ck in self._to_raw:
            if ck not in used:
                by_canon.setdefault(_canonical(ck), []).append(ck)
        wanted: dict[str, list[str]] = {}
        for mk in model_keys:
            if mk not in out:
                wanted.setdefault(_canonical(mk), []).append(mk)
        for canon, mks in wanted.items():
            cks = by_canon.get(canon, [])
            if len(mks) == 1 and len(cks) == 1:
                out[mks[0]] = cks[0]
        return out

    def align_keys(self, model_keys: Iterable[str], optional: Iterable[str] = ()) -> tuple[dict[str, str], Optional[str]]:
        """``match_keys``, plus one leading prefix when the keys of the two sides differ by it.

        When fewer than half of ``model_keys`` match, a prefix of one to three components that the checkpoint
        adds to every key (``bert.`` of a ``BertForMaskedLM`` checkpoint loaded into a ``BertModel``) or lacks
        (the model's ``backbone.``) is tried, and kept when it matches more keys than ``match_keys`` did.
        ``optional`` keys (names the model does not have, asked about by the caller) are matched the same way
        but do not count towards choosing the prefix. Returns (model key -> checkpoint key, a sentence
        describing the prefix used or None).

        Example (a checkpoint holding ``bert.embeddings.LayerNorm.weight``)::

            ckpt.align_keys(["embeddings.LayerNorm.weight"])
            # ({'embeddings.LayerNorm.weight': 'bert.embeddings.LayerNorm.weight'},
            #  "the checkpoint's keys carry the prefix 'bert.'")
        """
        model_keys, optional = list(model_keys), [k for k in optional if k not in set(model_keys)]
        out = self.match_keys(model_keys + optional)
        hits = sum(k in out for k in model_keys)
        if not model_keys or hits * 2 >= len(model_keys):
            return out, None
        ck = self._to_raw
        by_suffix: dict[str, set[str]] = {}
        for c in ck:
            parts = c.split(".")
            for i in range(1, min(len(parts), 4)):
                by_suffix.setdefault(".".join(parts[i:]), set()).add(".".join(parts[:i]) + ".")
        add: dict[str, int] = {}
        drop: dict[str, int] = {}
        for k in model_keys:
            if k in out:
                continue
            for pre in by_suffix.get(k, ()):
                add[pre] = add.get(pre, 0) + 1
            parts = k.split(".")
            for i in range(1, min(len(parts), 4)):
                if ".".join(parts[i:]) in ck:
                    pre = ".".join(parts[:i]) + "."
                    drop[pre] = drop.get(pre, 0) + 1
        best = max([(n, "add", pre) for pre, n in add.items()] + [(n, "drop", pre) for pre, n in drop.items()],
                   default=None)
        if best is None or best[0] <= hits:
            return out, None
        _, how, pre = best
        used = set(out.values())
        for k in model_keys + optional:
            if k in out:
                continue
            cand = pre + k if how == "add" else (k[len(pre):] if k.startswith(pre) else None)
            if cand is not None and cand in ck and cand not in used:
                out[k] = cand
                used.add(cand)
        what = (f"the checkpoint's keys carry the prefix {pre!r}" if how == "add"
                else f"the model's keys carry the prefix {pre!r}, the checkpoint's do not")
        return out, what

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.weights_path)!r}, format={self.format!r}, tensors={len(self)})"


def _resolve_dir(d: Path) -> Path:
    # Anything but a directory counts as a candidate (a FIFO named model.safetensors is refused by its
    # reader, saying what it is, rather than skipped).
    for name in _DIR_WEIGHTS:
        if os.path.lexists(d / name) and not (d / name).is_dir():
            return d / name
    files = sorted(p for p in d.iterdir() if not p.is_dir())
    indexes = [p for p in files if p.name.endswith(".index.json")]
    weights = [p for p in files if p.name.endswith((".safetensors", *TORCH_SUFFIXES))]
    cands = indexes or weights
    if len(cands) == 1:
        return cands[0]
    if not cands:
        raise UsageError("no weights found in directory (looked for " + ", ".join(_DIR_WEIGHTS)
                         + ", *.safetensors, *.pt, *.pth, *.bin, *.ckpt)", file=str(d))
    raise UsageError("several weight files, name one: " + ", ".join(p.name for p in cands), file=str(d))


def open_checkpoint(path: str | Path, *, strip_model_prefix: bool = False) -> Checkpoint:
    """Open a checkpoint file or directory without reading tensor data.

    ``path``: a ``.safetensors`` file, a ``*.index.json`` (sharded; shards are resolved next to it), a
    ``.pt/.pth/.bin/.ckpt`` torch file, or a directory holding one of these (Hugging Face names preferred:
    ``model.safetensors.index.json``, ``model.safetensors``, ``pytorch_model.bin.index.json``,
    ``pytorch_model.bin``; else its only index or weights file) and optionally ``config.json``.
    ``strip_model_prefix`` also strips a leading ``model.`` from the keys (see ``Checkpoint``).

    Raises ``UsageError`` (with the file) for a missing path, an unknown extension, a directory without
    (or with several candidate) weights, a truncated or corrupted safetensors file, an index naming a
    missing shard, a torch file that ``weights_only=True`` refuses to unpickle, or an unreadable one.
    """
    path = Path(path)
    if not path.is_dir():
        require_regular_file(path, "checkpoint")
    weights = _resolve_dir(path) if path.is_dir() else path
    name = weights.name
    if name.endswith(".index.json"):
        reader = _ShardedReader(weights)
    elif name.endswith(".safetensors") or name.endswith(TORCH_SUFFIXES):
        reader = _open_file(weights)
    else:
        raise UsageError(f"unknown checkpoint extension {weights.suffix or '(none)'!r} (expected .safetensors, "
                         ".pt, .pth, .bin, .ckpt, *.index.json or a directory)", file=str(weights))
    return Checkpoint(path, weights, reader, strip_model_prefix=strip_model_prefix)


# ------------------------------------------------------------------------------------ norm inspection
_WEIGHT_LEAVES = ("weight", "gamma", "scale")
_BIAS_LEAVES = ("bias", "beta")
_STAT_LEAVES = ("running_mean", "running_var", "num_batches_tracked")


class CheckpointNormGroup(BaseModel):
    """One norm found in a checkpoint alone: the keys under one module prefix.

    ``module``: the key prefix (``encoder.layer.0.attention.output.LayerNorm``), in ``Checkpoint.keys()``
    form. ``kind`` is always a guess (``kind_guessed`` is True): ``BatchNorm`` when running statistics
    exist, else what the name says (rms / bn, batchnorm / gn, groupnorm / instance), else ``LayerNorm``
    with a bias, ``RMSNorm`` with a weight only; ``kind_basis`` says which. ``num_features``: length of the
    1-D parameters. ``weights``: statistics of the group's tensors (``WeightStats``).
    """

    model_config = ConfigDict(extra="forbid")

    module: str
    kind: Kind
    kind_guessed: bool = True
    kind_basis: str
    num_features: int
    weights: WeightStats

    def to_site(self) -> Site:
        """A report ``Site`` (``detected_by="checkpoint"``) for checkpoint-only targets."""
        bn = self.kind == "BatchNorm"
        return Site(module=self.module, kind=self.kind, class_name="(checkpoint)", detected_by="checkpoint",
                    normalized_shape=None if bn else [self.num_features],
                    num_channels=self.num_features if bn else None,
                    affine_weight=any(k.rsplit(".", 1)[-1] in _WEIGHT_LEAVES for k in self.weights.keys),
                    affine_bias=self.weights.bias_present,
                    track_running_stats=self.weights.running_state is not None,
                    weights=self.weights,
                    extra={"kind_guessed": self.kind_guessed, "kind_basis": self.kind_basis})


def _tokens(name: str) -> set[str]:
    return set(filter(None, re.split(r"[^a-z]+", name.lower())))


def _name_says_norm(name: str) -> bool:
    return "norm" in name.lower() or bool(_tokens(name) & {"ln", "bn", "gn", "rms"})


def group_weight_stats(ckpt: Checkpoint, keys: Iterable[str], *, gain: Optional[str] = None,
                       bias: Optional[str] = None) -> WeightStats:
    """``WeightStats`` over the tensors of one norm, given its checkpoint keys (leaf names ``weight``/
    ``gamma``/``scale``, ``bias``/``beta``, ``running_mean``, ``running_var``, ``num_batches_tracked``).

    ``gain``/``bias``: the keys holding the gain and the bias when their leaf names say nothing (a hand-written
    norm's ``a_2``/``b_2``); by default the first ``weight``/``gamma``/``scale`` and ``bias``/``beta`` key.
    Reads only those tensors; raises ``ValueError`` if one has more than 1 dimension. ``gain_*``: mean,
    population std, min, max of the finite entries of the gain in float32 (None without a gain or with
    no finite entry), ``gain_negative_fraction`` the share of them below 0; ``nonfinite``: NaN/inf count over
    all the tensors; ``running_state``: ``initial`` when running_mean is all 0, running_var all 1 and
    num_batches_tracked 0 or absent, else ``trained`` (None without running statistics). ``shape``/``dtype``:
    those of the gain (else bias, else stats).
    """
    keys = list(keys)
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
    ckpt.prefetch(keys)
    for k in keys:
        if len(ckpt.shape(k)) > 1:
            raise ValueError(f"{k!r} has shape {list(ckpt.shape(k))}: not a 1-D norm parameter")
    tensors = {k: ckpt.get(k) for k in keys}
    gain_key = gain if gain in tensors else next((by_leaf[lf] for lf in _WEIGHT_LEAVES if lf in by_leaf), None)
    bias_key = bias if bias in tensors else next((by_leaf[lf] for lf in _BIAS_LEAVES if lf in by_leaf), None)
    stat_keys = {lf: by_leaf[lf] for lf in _STAT_LEAVES if lf in by_leaf}
    ref = gain_key or bias_key or next(iter(stat_keys.values()), None)
    stats = WeightStats(source="checkpoint", keys=keys, bias_present=bias_key is not None,
                        shape=list(tensors[ref].shape) if ref else None,
                        dtype=str(tensors[ref].dtype).removeprefix("torch.") if ref else None)
    stats.nonfinite = sum(t.numel() - int(torch.isfinite(t).sum()) for t in tensors.values()
                          if t.is_floating_point() or t.is_complex())
    if gain_key:
        g = tensors[gain_key].float().reshape(-1)
        if stats.nonfinite:  # boolean indexing only when needed: it is slow under CPU contention
            g = g[torch.isfinite(g)]
        if g.numel():
            stats.gain_mean, stats.gain_std = float(g.mean()), float(g.std(correction=0))
            stats.gain_min, stats.gain_max = float(g.min()), float(g.max())
            stats.gain_negative_fraction = float((g < 0).sum()) / g.numel()
    rm, rv, nbt = (tensors[stat_keys[lf]] if lf in stat_keys else None for lf in _STAT_LEAVES)
    if nbt is not None:
        stats.num_batches_tracked = int(nbt.reshape(-1)[0]) if nbt.numel() else None
    if rm is not None or rv is not None:
        initial = ((rm is None or bool((rm == 0).all())) and (rv is None or bool((rv == 1).all()))
                   and not stats.num_batches_tracked)
        stats.running_state = "initial" if initial else "trained"
    stats.classify_centre()
    return stats


def _guess_kind(name: str, leaves: set[str]) -> tuple[str, str]:
    low, toks = name.lower(), _tokens(name)
    if leaves & {"running_mean", "running_var"}:
        return "BatchNorm", "running statistics present"
    if "rms" in low:
        return "RMSNorm", "name says rms"
    if "batch" in low or "bn" in toks:
        return "BatchNorm", "name says batch norm (no running statistics)"
    if "group" in low or "gn" in toks:
        return "GroupNorm", "name says group norm"
    if "instance" in low:
        return "InstanceNorm", "name says instance norm"
    if leaves & set(_BIAS_LEAVES):
        return "LayerNorm", "bias present, no running statistics"
    return "RMSNorm", "weight only, no bias"


def _natural(key: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("."))


def inspect_norm_params(ckpt: Checkpoint) -> list[CheckpointNormGroup]:
    """Find the norm parameters of a checkpoint by name and shape, one group per module prefix.

    A prefix is a norm when it holds ``running_mean``/``running_var`` (BatchNorm, whatever its name), or
    when its 1-D ``weight``/``bias`` are under a name saying norm (``*norm*``, ``ln``, ``ln_f``, ``bn``,
    ``gn``, ``rms`` tokens) or it has 1-D ``gamma``/``beta``/``scale``; a prefix holding any tensor of 2+
    dimensions is never one. Reads only the groups' 1-D (and 0-D ``num_batches_tracked``) tensors.
    Returns groups sorted by module path (numeric components in numeric order).
    """
    prefixes: dict[str, dict[str, str]] = {}
    too_big: set[str] = set()
    for key in ckpt.keys():
        prefix, _, leaf = key.rpartition(".")
        prefixes.setdefault(prefix, {})[leaf] = key
        if len(ckpt.shape(key)) > 1:
            too_big.add(prefix)
    found = []
    for prefix in sorted(prefixes, key=_natural):
        leaves = prefixes[prefix]
        if prefix in too_big:
            continue
        params = [lf for lf in (*_WEIGHT_LEAVES, *_BIAS_LEAVES) if lf in leaves]
        stats = [lf for lf in _STAT_LEAVES if lf in leaves]
        if any(len(ckpt.shape(leaves[lf])) != 1 for lf in params + stats if lf != "num_batches_tracked"):
            continue
        last = prefix.rpartition(".")[2]
        if not ({"running_mean", "running_var"} & set(stats)
                or (params and _name_says_norm(last))
                or {"gamma", "beta", "scale"} & set(params)):
            continue
        found.append((prefix, last, leaves, [leaves[lf] for lf in params + stats]))
    ckpt.prefetch([k for *_, keys in found for k in keys])
    groups = []
    for prefix, last, leaves, keys in found:
        kind, basis = _guess_kind(last, set(leaves))
        ws = group_weight_stats(ckpt, keys)
        groups.append(CheckpointNormGroup(module=prefix, kind=kind, kind_basis=basis,
                                          num_features=ws.shape[0] if ws.shape else 0, weights=ws))
    return groups


def checkpoint_target(path: str | Path):
    """A checkpoint given as the audit's TARGET: a :class:`normaudit.loaders.ModelUnderAudit` of kind
    ``checkpoint`` with no model (an empty ``nn.Module``); the audit opens the file itself
    (``normaudit.audit.checkpoint_only_report``), so an unreadable or refused file is a UsageError there."""
    from torch import nn

    from normaudit.loaders.model import ModelUnderAudit

    path = Path(path)
    return ModelUnderAudit(model=nn.Module(), inputs=(), on_meta=False, kind="checkpoint", file=str(path),
                           weights=[path.name])
