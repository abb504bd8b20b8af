"""The result cache: a re-run on unchanged inputs returns the stored report instead of auditing again.

As ruff's cache does, an entry is keyed by everything the report depends on (:func:`key_parts`):

- the target (a model file's content; every file of a model or checkpoint directory), and, checked on each
  hit, the content of every local file the audit imported (the model's own modules, recorded by the worker:
  :func:`imported_files`), and the values of the environment variables those files read by name
  (``os.environ["X"]``, ``os.getenv("X")``: :func:`environment_read`);
- for an ONNX file, the files beside it (its external data, a ``config.json``: :func:`beside_fingerprint`);
- the ``--config`` file's content, and the checkpoint's headers (a safetensors header, the first and last
  MiB of other weight files) with their size and modification time, never the whole weights;
- the audit options (dtype, batch size, selectors, input axes, probes, per-module ignores) and the current
  directory (reports name files relative to it);
- the content of the rules (shipped and ``--rules``), as loaded;
- the versions of Python, normaudit (with a digest of its own source, so a development checkout never reads
  a result of older code), torch and transformers (read from the installed metadata: no import).

Entries are JSON files (the pydantic report as :meth:`~pydantic.BaseModel.model_dump_json` writes it, never a
pickle) under ``.normaudit_cache/`` beside the settings file (``pyproject.toml``/``normaudit.toml``), else under
``$XDG_CACHE_HOME/normaudit`` (``~/.cache/normaudit``); the settings key ``cache = "DIR"`` names another
directory (relative to the settings file), ``$NORMAUDIT_CACHE_DIR`` overrides all of these, and ``--no-cache``,
``NORMAUDIT_NO_CACHE=1`` or ``cache = false`` bypass the cache (:func:`cache_root`). A hub id target is never cached (the local
cache's ``refs`` may lead the same id to another snapshot). A directory inside site-packages is never used. Only reports are stored
(a target that fails is audited again), and never those of ``--probe numerics``. A cache that cannot be read or written is skipped: a miss, a note
with ``-v`` at most. Files the model's code opens itself (data files read by ``build_model()``) are not part of
the key: use ``--no-cache`` for such models.

The same directory keeps a :class:`ValidationMemo` (``v1/valid/``): the outcome of validating rule files, a
settings file and the report schema, keyed by their contents and the code that validates them
(:func:`validation_key`), so that ``normaudit rules``, ``explain`` and ``schema`` need no pydantic on a
second call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import site
import stat
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Optional

from normaudit.options import split_target

#: Bump when the layout of an entry changes: older entries are then misses.
CACHE_FORMAT = 1
#: Files up to this size are keyed by their whole content; larger ones (weights) by header, size and mtime.
WHOLE_FILE_BYTES = 4 << 20
_EDGE_BYTES = 1 << 20
#: Directory entries fingerprinted at most (a model directory, a sharded checkpoint).
_MAX_DIR_FILES = 10_000
_CACHEDIR_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by normaudit.\n"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _safetensors_header(fh: Any, size: int) -> Optional[bytes]:
    """The 8-byte length and the JSON header of a safetensors file, or None when it does not look like one."""
    head = fh.read(8)
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "little")
    if n > min(size - 8, 100 << 20):
        return None
    return head + fh.read(n)


def file_fingerprint(path: str | os.PathLike) -> Optional[str]:
    """A digest of one regular file for the cache key, None when it cannot be read or is no regular file (a
    FIFO, a device: never opened for reading; then the key differs from any stored one). Every read is
    bounded by the size the opened file declares. Small files: their content; weight files above :data:`WHOLE_FILE_BYTES`: size and
    modification time (ns) with the safetensors header, or the first and last MiB of any other format."""
    p = Path(path)
    try:
        if not stat.S_ISREG(os.stat(p).st_mode):
            return None  # a FIFO, a device (/dev/zero behind a link) is never read: the audit refuses it
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())  # the file opened, which a rename may have swapped since the stat
            if not stat.S_ISREG(st.st_mode):
                return None
            if st.st_size <= WHOLE_FILE_BYTES:
                return _sha(fh.read(st.st_size))
            header = _safetensors_header(fh, st.st_size) if p.suffix == ".safetensors" else None
            if header is None:
                fh.seek(0)
                header = fh.read(_EDGE_BYTES)
                fh.seek(max(0, st.st_size - _EDGE_BYTES))
                header += fh.read(_EDGE_BYTES)
    except OSError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}:{_sha(header)}"


def path_fingerprint(path: Optional[str]) -> Any:
    """The key part of a target, config or checkpoint path: a file's :func:`file_fingerprint`; for a
    directory, that of each file below it (hidden names and ``__pycache__`` skipped); None for no path;
    ``["absent", path]`` for a name that is no file (a ``package.module:factory`` target)."""
    if not path:
        return None
    p = Path(path)
    if p.is_file():
        return file_fingerprint(p)
    if not p.is_dir():
        return ["absent", str(path)]
    found: dict[str, Optional[str]] = {}
    for root, dirs, files in os.walk(p):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in sorted(files):
            if name.startswith(".") or len(found) >= _MAX_DIR_FILES:
                continue
            full = Path(root) / name
            found[str(full.relative_to(p))] = file_fingerprint(full)
    return found


def _distribution_version(name: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def source_digest() -> str:
    """A digest of normaudit's own ``*.py`` files (their paths and contents)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        with open(f, "rb") as fh:
            h.update(_sha(fh.read()).encode())
    return h.hexdigest()


def versions() -> dict[str, Optional[str]]:
    """Versions the report depends on: Python, normaudit (and :func:`source_digest`), torch, transformers."""
    import normaudit

    return {"python": sys.version, "normaudit": normaudit.__version__, "normaudit_source": source_digest(),
            "torch": _distribution_version("torch"), "transformers": _distribution_version("transformers")}


def rules_digest(rules: dict) -> str:
    """A digest of the rules as loaded (every field of each :class:`~normaudit.engine.schema.Rule`)."""
    h = hashlib.sha256()
    for rule_id in sorted(rules):
        h.update(rules[rule_id].model_dump_json().encode())
    return h.hexdigest()


def key_parts(opts: Any, rules: dict) -> dict[str, Any]:
    """Everything one target's report depends on (see the module docstring), as JSON-able data; ``opts`` is
    a :class:`normaudit.audit.AuditOptions`. The imported local files are checked apart (:meth:`ResultCache.get`)."""
    options = {k: v for k, v in dataclasses.asdict(opts).items() if k != "config_data"}
    target = str(split_target(opts.target)[0])
    parts = {"format": CACHE_FORMAT, "versions": versions(), "cwd": os.getcwd(), "options": options,
             "target": path_fingerprint(target), "config": path_fingerprint(opts.config),
             "checkpoint": path_fingerprint(opts.checkpoint), "rules": rules_digest(rules)}
    if target.lower().endswith(".onnx") and Path(target).is_file():
        parts["beside"] = beside_fingerprint(Path(target))
    return parts


def beside_fingerprint(path: Path) -> dict[str, Optional[str]]:
    """The files beside an ONNX model (its folder, not below it; hidden names skipped), which its audit may
    read: its external data (ONNX writes a bare file name beside the model) and a ``config.json``. A location
    in a subfolder is not seen: ``--no-cache`` for such a model."""
    found: dict[str, Optional[str]] = {}
    try:
        names = sorted(os.listdir(path.parent or "."))
    except OSError:
        return found
    for name in names[:_MAX_DIR_FILES]:
        full = path.parent / name
        if not name.startswith(".") and name != path.name and full.is_file():
            found[name] = file_fingerprint(full)
    return found


def cache_key(opts: Any, rules: dict) -> Optional[str]:
    """The key of one target's entry (a hex digest of :func:`key_parts`); None (never cached) when a part
    cannot be expressed: an in-memory config (``opts.config_data``), or a ``--probe numerics`` run, a
    measurement of a real run on whatever device is there (CUDA when available), not a function of the files,
    or a hub id (its snapshot is looked up anew each run)."""
    if getattr(opts, "config_data", None) is not None:
        return None
    if any(p.startswith("numerics") for p in getattr(opts, "probes", []) or []):
        return None
    target = str(split_target(opts.target)[0])
    if not os.path.lexists(target):
        from normaudit.loaders.hub import is_hub_id  # deferred: the loaders import yaml, not needed otherwise

        if is_hub_id(target):  # a hub id: which snapshot it reads can change under the same name, never cached
            return None
    return _sha(json.dumps(key_parts(opts, rules), sort_keys=True, default=str).encode())


def imported_files(before: set[str]) -> list[str]:
    """Files of the modules imported since ``before`` (names in :data:`sys.modules` then) that are neither
    the standard library nor normaudit, torch or transformers (their versions are in the key): the model's
    own modules and the other libraries it imports."""
    skip = {os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])}
    for name in ("normaudit", "torch", "transformers"):
        mod = sys.modules.get(name)
        if getattr(mod, "__file__", None):
            skip.add(os.path.realpath(os.path.dirname(mod.__file__)))
    files = set()
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None)
        if not isinstance(file, str) or not os.path.isfile(file):
            continue
        real = os.path.realpath(file)
        if not any(real == s or real.startswith(s + os.sep) for s in skip):
            files.add(real)
    return sorted(files)


#: ``os.environ["X"]``, ``os.environ.get("X")``, ``os.getenv("X")``, ``environ.setdefault("X", ...)``: the
#: environment variables a model file reads by name, whose values become part of its entry.
_ENV_READ = re.compile(r"""(?:environ\s*\[|environ\s*\.\s*(?:get|setdefault|pop)\s*\(|getenv\s*\()\s*[rbuRBU]?["']([^"'\\]+)["']""")


def environment_read(files: list[str]) -> dict[str, Optional[str]]:
    """The environment variables the ``files`` (the target and its local imports) name in a read, with their
    current values (None: unset). A model chosen by ``os.environ["MODEL_SIZE"]`` gives another entry when the
    variable changes; variables read through a computed name are not seen (``--no-cache`` for those)."""
    names: set[str] = set()
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                names.update(_ENV_READ.findall(fh.read(1_000_000)))
        except OSError:
            continue
    return {name: os.environ.get(name) for name in sorted(names)}


def _inside_site_packages(path: Path) -> bool:
    roots = list(site.getsitepackages()) + [site.getusersitepackages()]
    roots += [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    real = os.path.realpath(path)
    return any(real == os.path.realpath(r) or real.startswith(os.path.realpath(r) + os.sep) for r in roots)


def default_cache_dir(settings_source: Optional[Path], configured: Optional[str] = None) -> Optional[Path]:
    """Where the cache lives (see the module docstring): ``$NORMAUDIT_CACHE_DIR``, else ``configured`` (the
    settings key ``cache = "DIR"``, relative to the settings file), else ``.normaudit_cache/`` beside the
    settings file, else ``$XDG_CACHE_HOME/normaudit``; None when every candidate is inside site-packages."""
    env = os.environ.get("NORMAUDIT_CACHE_DIR")
    candidates = [Path(env)] if env else []
    base = Path(settings_source).resolve().parent if settings_source is not None else Path.cwd()
    if configured:
        candidates.append(base / Path(configured).expanduser())
    if settings_source is not None:
        candidates.append(base / ".normaudit_cache")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates.append(Path(xdg) / "normaudit")
    return next((c for c in candidates if not _inside_site_packages(c)), None)


class ResultCache:
    """The reports of earlier runs under ``root`` (``v1/<key[:2]>/<key>.json``). ``note`` receives a line
    when the cache cannot be read or written (``-v``); such a cache is otherwise silent."""

    def __init__(self, root: Path, note: Any = None):
        self.root = Path(root)
        self.note = note or (lambda text: None)
        self.hits = self.misses = 0
        self._broken = False

    def _entry(self, key: str) -> Path:
        return self.root / f"v{CACHE_FORMAT}" / key[:2] / f"{key}.json"

    def get(self, key: Optional[str]) -> Any:
        """The stored :class:`~normaudit.report.Report` for ``key``, or None: no entry, an unreadable or
        malformed one, or an imported file that has changed since (or is gone)."""
        from normaudit.report import Report

        if key is None:
            return None
        try:
            with open(self._entry(key), encoding="utf-8") as fh:
                entry = json.load(fh)
            if entry.get("key") != key:
                raise ValueError("key mismatch")
            if any(file_fingerprint(path) != digest for path, digest in entry["imported"].items()) or \
                    environment_read(list(entry["imported"])) != entry.get("environ", {}):
                self.misses += 1
                return None
            report = Report.model_validate_json(entry["report"])
        except (FileNotFoundError, NotADirectoryError):
            self.misses += 1
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            self.note(f"cache entry {self._entry(key)} unreadable ({type(err).__name__}): audited again")
            self.misses += 1
            return None
        self.hits += 1
        return report

    def put(self, key: Optional[str], report: Any, imported: list[str]) -> None:
        """Store ``report`` under ``key`` with the digests of the ``imported`` files (written atomically);
        a cache that cannot be written is skipped (one note)."""
        if key is None or self._broken:
            return
        entry = {"format": CACHE_FORMAT, "key": key, "imported": {p: file_fingerprint(p) for p in imported},
                 "environ": environment_read(imported), "report": report.model_dump_json()}
        path = self._entry(key)
        try:
            self._prepare()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(entry, fh)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as err:
            self._broken = True
            self.note(f"cache {self.root} not writable ({err.strerror or err}): results not stored")

    def _prepare(self) -> None:
        """Create the cache directory with a ``.gitignore`` (``*``) and a ``CACHEDIR.TAG``, as ruff does."""
        if (self.root / "CACHEDIR.TAG").exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / ".gitignore").write_text("# Automatically created by normaudit.\n*\n", encoding="utf-8")
        (self.root / "CACHEDIR.TAG").write_text(_CACHEDIR_TAG, encoding="utf-8")



def cache_disabled(no_cache_flag: bool = False, setting: Any = None) -> bool:
    """True when no cache may be read or written: ``--no-cache``, ``NORMAUDIT_NO_CACHE`` set (not ``0``), or
    the settings key ``cache = false``."""
    return no_cache_flag or os.environ.get("NORMAUDIT_NO_CACHE", "") not in ("", "0") or setting is False


def cache_root(settings_source: Optional[Path], setting: Any = None, no_cache_flag: bool = False) -> Optional[Path]:
    """The cache directory of this run (:func:`default_cache_dir`), None when it is off (:func:`cache_disabled`)
    or none may be used. ``setting``: the settings key ``cache`` (bool or a directory)."""
    if cache_disabled(no_cache_flag, setting):
        return None
    return default_cache_dir(settings_source, setting if isinstance(setting, str) else None)


# ----------------------------------------------------------------------------------------- validation memo
#: Libraries whose behaviour decides whether a rule or settings file is valid (and the schema of the report);
#: fingerprinted by their files' size and modification time (:func:`library_fingerprint`), not imported.
_VALIDATING_LIBRARIES = ("pydantic", "pydantic_core", "yaml", "simpleeval")


def library_fingerprint(names: tuple[str, ...] = _VALIDATING_LIBRARIES) -> dict[str, Any]:
    """``{name: [file, size, mtime_ns]}`` of each library's top module (and ``version.py`` beside it), found by
    :class:`importlib.machinery.PathFinder` on ``sys.path`` (whether imported or not: the same key in every
    process) without importing it: an upgrade or reinstall rewrites these files. (:mod:`importlib.metadata`
    would cost 0.1-0.2 s of start-up.)"""
    from importlib.machinery import PathFinder

    found: dict[str, Any] = {}
    for name in names:
        try:
            spec = PathFinder.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = getattr(spec, "origin", None)
        if not origin or not os.path.isfile(origin):
            found[name] = None
            continue
        entry = []
        for f in (origin, os.path.join(os.path.dirname(origin), "version.py")):
            with contextlib.suppress(OSError):
                st = os.stat(f)
                entry.append([f, st.st_size, st.st_mtime_ns])
        found[name] = entry
    return found


def validation_key(kind: str, parts: Any) -> str:
    """The key of a validation outcome: ``kind`` (``"rules"``, ``"settings"``, ``"report-schema"``), its
    inputs ``parts`` (JSON-able: file names and content digests) and the code that validates them (Python,
    normaudit's :func:`source_digest`, :func:`library_fingerprint`). Any change of any of these is another key."""
    import normaudit

    whole = {"format": CACHE_FORMAT, "kind": kind, "python": sys.version, "normaudit": normaudit.__version__,
             "source": source_digest(), "libraries": library_fingerprint(), "parts": parts}
    return _sha(json.dumps(whole, sort_keys=True, default=str).encode())


class ValidationMemo:
    """What validating a file gave, stored by :func:`validation_key` under ``root`` (``v1/valid/<key>.json``):
    a command that only lists or prints (``normaudit rules``, ``explain``, ``schema``) then needs neither
    pydantic nor the rule compiler when the same files were validated before by the same code (those
    imports are most of such a command's time, which stays under 0.5 s without them).
    Only successful validations are stored; a file that is invalid is validated (and fails) every time. A
    memo that cannot be read or written is a miss, silently."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _entry(self, key: str) -> Path:
        return self.root / f"v{CACHE_FORMAT}" / "valid" / key[:2] / f"{key}.json"

    def get(self, key: str) -> Any:
        """The payload stored for ``key``, or None (no entry, or one that cannot be read)."""
        try:
            with open(self._entry(key), encoding="utf-8") as fh:
                entry = json.load(fh)
        except (OSError, ValueError):
            return None
        return entry.get("payload") if isinstance(entry, dict) and entry.get("key") == key else None

    def put(self, key: str, payload: Any) -> None:
        """Store ``payload`` (JSON-able, not None) under ``key``, atomically; an OS error skips it."""
        path = self._entry(key)
        try:
            ResultCache(self.root)._prepare()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump({"key": key, "payload": payload}, fh)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            return


def validation_memo(settings_source: Optional[Path], setting: Any = None) -> Optional[ValidationMemo]:
    """The :class:`ValidationMemo` in this run's cache directory (:func:`cache_root`), None when the cache is off."""
    root = cache_root(settings_source, setting)
    return ValidationMemo(root) if root is not None else None
