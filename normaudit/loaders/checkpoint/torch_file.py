"""A ``torch.save`` file, loaded with ``torch.load(weights_only=True)`` only: no code in it is ever run.

:class:`TorchReader` finds the state_dict inside the containers training scripts save (``state_dict``,
``model``, ...) and an embedded config beside it. When torch refuses the file, :func:`scan_pickle` reads the
pickle's opcodes (a parser: nothing is imported or built) to say why in one line: not a checkpoint at all
(said by type: text, another format; never quoting the file's bytes), a corrupt zip or pickle, a plain
pickle, or a pickle that needs code (naming the callables it calls).
"""
from __future__ import annotations

import argparse
import dataclasses
import pickle
import warnings
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from normaudit.errors import UsageError
from normaudit.loaders.checkpoint.common import CONFIG_KEYS, one_line, parse_json
from normaudit.loaders.safe_read import describe_content, require_regular_file


def _torch_reason(err: Exception) -> str:
    """The cause in torch's (long, multi-line) load error, on one line."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    reason = next((ln.split("WeightsUnpickler error:", 1)[1].strip() for ln in lines
                   if "WeightsUnpickler error:" in ln), "")
    if not reason:
        reason = next((ln for ln in lines if ln.startswith(("Trying to load", "Unsupported"))), "")
    reason = (reason or (lines[0] if lines else "")).split(". Please ")[0].rstrip(".")
    return one_line(f"{type(err).__name__}: {reason}" if reason else type(err).__name__, 200)


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
            return found, one_line(err, 120), count
        count += 1
    return found, None, count


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
                if pkl is None:  # the members' names are the file's bytes: counted, never quoted
                    return None, "", f"{expected}, found a zip archive without */data.pkl ({len(names)} " \
                                     f"member{'s' if len(names) != 1 else ''}, none of them */data.pkl)"
                with z.open(pkl) as member:
                    return member.read(_PICKLE_SCAN_BYTES), f"{pkl} in the zip archive", None
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, ValueError) as err:
            return None, "", f"{expected}, found a corrupt or truncated zip archive of {size} bytes " \
                             f"({one_line(err, 100)})"
    # torch.save pickles with protocol 2 or later, which starts with PROTO (0x80); anything else is described by
    # type only (a text file read as protocol 0 would quote its lines as the names of globals)
    if head[:1] != b"\x80":
        return None, "", f"{expected}, found {describe_content(head[:64])}"
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


#: torch containers holding the state_dict (outermost first)
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module")


def _as_dict(value: Any) -> Optional[dict]:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, argparse.Namespace):
        return vars(value).copy()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, str):
        parsed = parse_json(value)
        return parsed if isinstance(parsed, dict) else None
    return None


class TorchReader:
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
                for k in CONFIG_KEYS:
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
                             f"{one_line(', '.join(map(str, list(obj)[:8])), 120)})", file=str(path))
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
