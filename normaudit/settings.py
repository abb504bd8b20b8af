"""Project settings: ``[tool.normaudit]`` in ``pyproject.toml``, or a ``normaudit.toml``.

The settings file is found from the current directory upward: in each directory ``normaudit.toml``
(keys at the top level) wins over ``pyproject.toml`` (keys under ``[tool.normaudit]``; a
``pyproject.toml`` without that table is skipped and the search goes on upward). ``--settings FILE``
names the file explicitly and ``--isolated`` ignores every settings file. Command-line flags override
the file. Example::

    [tool.normaudit]
    targets = ["models/gpt.py", {path = "models/unet.py", input-axes = "B,C,H,W"}]
    select = ["NE", "NL"]
    ignore = ["NL103"]
    per-module-ignores = {"encoder.layers.*" = ["NE101"]}
    fail-on = "warning"
    dtype = "bfloat16"
    batch-size = 4
    rules = ["tools/normaudit-rules"]
    config = "configs/model.yaml"
    baseline = "normaudit-baseline.json"
    timeout = 300             # seconds per target for import, build, capture and probes
    jobs = 4                  # targets audited at once (-j; default: the CPU cores)
    cache = ".cache/normaudit"  # the result cache's directory, or false (--no-cache)
    full-capture = false      # true: capture every block of a stack (--full-capture), same report, slower
    docs-url = "https://example.org/normaudit/rules"  # SARIF helpUri: <docs-url>/<ID>.md

Relative paths (``targets``, ``rules``, ``config``, ``baseline``, ``cache``, a target's ``config``/
``checkpoint``) are relative to the directory of the settings file. An unknown key, a wrong type or a TOML syntax error
is a :class:`~normaudit.errors.UsageError` naming the file, the line and the key.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Optional

from normaudit.errors import UsageError
from normaudit.loaders.safe_read import read_regular, require_regular_file

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SETTINGS_FILES = ("normaudit.toml", ".normaudit.toml")


def __getattr__(name: str) -> Any:
    """``Settings``, ``TargetSettings``, ``Dtype``, ``FailOn`` from :mod:`normaudit.settings_schema`, imported on
    first use (PEP 562): reading a settings file validated before needs no pydantic (:func:`validated_table`)."""
    if name in ("Settings", "TargetSettings", "Dtype", "FailOn"):
        from normaudit import settings_schema

        return getattr(settings_schema, name)
    raise AttributeError(f"module 'normaudit.settings' has no attribute {name!r}")


def _keys(model: Any) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def find_settings_file(start: Optional[Path] = None) -> Optional[Path]:
    """The settings file that applies to ``start`` (default: the current directory), or None.

    Raises UsageError when a ``pyproject.toml`` on the way up is not valid TOML.
    """
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        for name in SETTINGS_FILES:
            candidate = directory / name
            _refuse_special(candidate)
            if candidate.is_file():
                return candidate
        pyproject = directory / "pyproject.toml"
        _refuse_special(pyproject)
        if pyproject.is_file():
            data = _parse_toml(pyproject)
            if isinstance(data.get("tool"), dict) and "normaudit" in data["tool"]:
                return pyproject
    return None


def _refuse_special(path: Path) -> None:
    """Raise UsageError when a settings file's name leads to a FIFO, a device or a socket (never opened: a
    read would block or not end); a missing name, a directory or a regular file pass."""
    if path.exists() and not path.is_file() and not path.is_dir():
        require_regular_file(path, "settings file")


def _read_text(path: Path) -> str:
    """The text of a settings file: a regular file only, size bounded
    (:func:`normaudit.loaders.safe_read.read_regular`), UTF-8."""
    raw = read_regular(path, "settings file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"cannot read settings: {err}", file=str(path)) from err


def _parse_toml(path: Path) -> dict[str, Any]:
    text = _read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        msg = str(err)
        m = re.search(r"\(at line (\d+), column \d+\)", msg)
        line = int(m.group(1)) if m else (len(text.splitlines()) or None if "end of document" in msg else None)
        cause = re.sub(r" \(at (line|end of document).*", "", msg)
        raise UsageError(f"invalid TOML: {cause}", file=str(path), line=line) from err


def _explain(err: Any, text: str, path: Path, is_pyproject: bool) -> UsageError:
    from normaudit.settings_schema import Settings, TargetSettings, line_of_key

    # A table in ``targets`` fails both union members: report the TargetSettings error, not "not a string".
    errors = [e for e in err.errors() if not (e["type"] == "string_type" and isinstance(e.get("input"), dict))]
    first = (errors or err.errors())[0]
    loc = [str(p) for p in first["loc"]]
    # For union members pydantic inserts the member name ("str", "TargetSettings"); drop it.
    loc = [p for p in loc if p not in ("str", "TargetSettings")]
    key = next((p for p in reversed(loc) if not p.isdigit()), loc[0] if loc else "")
    line = line_of_key(text, key, is_pyproject) if key else None
    where = ".".join(loc)
    if first["type"] == "extra_forbidden":
        inner = "targets" in loc[:1]
        known = _keys(TargetSettings if inner else Settings)
        hint = difflib.get_close_matches(key, known, n=1)
        msg = f"unknown key '{key}'" + (" in a targets entry" if inner else "")
        if hint:
            msg += f" (did you mean '{hint[0]}'?)"
        elif key == "tool" and not is_pyproject:
            msg += " (in normaudit.toml write the keys at the top level, without [tool.normaudit])"
        else:
            msg += f"; known keys: {', '.join(known)}"
        return UsageError(msg, file=str(path), line=line)
    return UsageError(f"'{where}': {first['msg']}", file=str(path), line=line)


def load_settings(path: Path) -> Settings:
    """Read and validate the settings in ``path`` (a ``normaudit.toml`` or a ``pyproject.toml``).

    Relative paths in the file are made relative to the current directory. Raises UsageError.
    """
    from pydantic import ValidationError

    from normaudit.settings_schema import Settings

    path = Path(path)
    if not os.path.lexists(path) or path.is_dir():
        raise UsageError("settings file not found", file=str(path))
    data = _parse_toml(path)
    is_pyproject = path.name == "pyproject.toml"
    if is_pyproject:
        section = data.get("tool", {}).get("normaudit") if isinstance(data.get("tool"), dict) else None
        if section is None:
            return Settings()
        if not isinstance(section, dict):
            raise UsageError("[tool.normaudit] must be a table", file=str(path))
        data = section
    text = _read_text(path)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as err:
        raise _explain(err, text, path, is_pyproject) from None
    settings._source = path
    return _resolve_paths(settings, path.parent)


def _rel(base: Path, value: str) -> str:
    """``value`` joined to ``base`` and shown relative to the current directory when inside it."""
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = base / p
    try:
        return os.path.relpath(p)
    except ValueError:  # another drive on Windows
        return str(p)


def _looks_like_path(spec: str, base: Path) -> bool:
    head = spec.rpartition(":")[0] if re.search(r"\.py:[A-Za-z_]\w*$", spec) else spec
    return (base / head).exists() or head.endswith((".py", ".json", ".safetensors", ".pt", ".pth", ".bin")) or "/" in head


def _resolve_target(spec: str, base: Path) -> str:
    if not _looks_like_path(spec, base):
        return spec  # ``package.module:factory``
    m = re.search(r"^(.*\.py):([A-Za-z_]\w*)$", spec)
    if m:
        return f"{_rel(base, m.group(1))}:{m.group(2)}"
    return _rel(base, spec)


def _resolve_paths(settings: Settings, base: Path) -> Settings:
    settings.rules = [_rel(base, r) for r in settings.rules]
    if settings.config:
        settings.config = _rel(base, settings.config)
    if settings.baseline:
        settings.baseline = _rel(base, settings.baseline)
    targets: list[Any] = []
    for t in settings.targets:
        if isinstance(t, str):
            targets.append(_resolve_target(t, base))
        else:
            t.path = _resolve_target(t.path, base)
            if t.config:
                t.config = _rel(base, t.config)
            if t.checkpoint:
                t.checkpoint = _rel(base, t.checkpoint)
            targets.append(t)
    settings.targets = targets
    return settings


def discover_settings(explicit: Optional[str] = None, isolated: bool = False,
                      start: Optional[Path] = None) -> Settings:
    """The settings for this run: ``explicit`` if given, else the file found from ``start`` upward,
    else defaults (also with ``isolated``)."""
    from normaudit.settings_schema import Settings

    if isolated and explicit:
        raise UsageError("--settings and --isolated cannot be used together")
    if isolated:
        return Settings()
    path = Path(explicit) if explicit else find_settings_file(start)
    if path is None:
        return Settings()
    return load_settings(Path(_rel(Path.cwd(), str(path))))


def validated_table(explicit: Optional[str] = None, isolated: bool = False,
                    start: Optional[Path] = None) -> tuple[Optional[Path], dict[str, Any]]:
    """The settings file of this run (as :func:`discover_settings` finds it) and its keys as TOML gives them
    (paths as written, relative to the file): ``(None, {})`` without a file. The file is validated as
    :func:`load_settings` does (UsageError naming file and line), unless this very content was validated
    before by this very code: then the :class:`~normaudit.cache.ValidationMemo` in the cache directory says
    so and pydantic is not imported (importing it is most of the time
    of ``normaudit rules`` in a project, which stays under 0.5 s without it)."""
    if isolated and explicit:
        raise UsageError("--settings and --isolated cannot be used together")
    found = None if isolated else (Path(explicit) if explicit else find_settings_file(start))
    if found is None:
        return None, {}
    path = Path(_rel(Path.cwd(), str(found)))
    if not path.is_file():
        raise UsageError("settings file not found", file=str(path))
    data = _parse_toml(path)
    if path.name == "pyproject.toml":
        tool = data.get("tool")
        data = tool.get("normaudit") if isinstance(tool, dict) else None
        if data is None:
            return None, {}
    from normaudit.cache import file_fingerprint, validation_key, validation_memo

    memo = validation_memo(path, data.get("cache") if isinstance(data, dict) else None)
    key = validation_key("settings", [path.name, file_fingerprint(path)]) if memo is not None else ""
    if memo is None or memo.get(key) is not True:
        load_settings(path)  # raises UsageError for an invalid file
        if memo is not None:
            memo.put(key, True)
    return path, data


def table_rules(source: Optional[Path], table: dict[str, Any]) -> list[str]:
    """The ``rules`` directories of a table from :func:`validated_table`, relative to the current directory."""
    return [_rel(source.parent, r) for r in table.get("rules", [])] if source is not None else []


def _toml_value(value: Any) -> str:
    """``value`` written as a TOML value (strings as basic strings, tables of targets inline)."""
    import json

    if hasattr(value, "model_dump"):  # a TargetSettings table
        value = value.model_dump(by_alias=True, exclude_none=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def show_settings(settings: Settings, flags: dict[str, Any], defaults: dict[str, Any],
                  where: Optional[dict[str, str]] = None) -> str:
    """The settings in force as TOML text, each key with where its value comes from: a command-line flag,
    the settings file and line, or the default; a key set nowhere is a comment.

    ``flags`` are the keys (file spelling, ``fail-on``) given on the command line (flags that are no settings
    key, ``checkpoint``, ``probe``, ``max-params``, are listed after the keys), ``defaults`` the values
    used when neither flag nor file sets a key, ``where`` the source to show for a flag other than ``--KEY``
    (``cache``: ``--no-cache`` or an environment variable). Paths from the file are shown relative to the current
    directory, as the run uses them."""
    from normaudit.settings_schema import Settings

    src = settings.source
    head = (f"# settings file: {src}" + (" ([tool.normaudit])" if src.name == "pyproject.toml" else "")
            if src is not None else "# settings file: none (defaults; flags override)")
    rows: list[tuple[str, str]] = []
    for name, info in Settings.model_fields.items():
        key = info.alias or name
        value = getattr(settings, name)
        if key in flags and flags[key] is not None:
            rows.append((f"{key} = {_toml_value(flags[key])}", (where or {}).get(key, f"--{key}")))
        elif value not in (None, [], {}):
            line = settings.line_of(key)
            rows.append((f"{key} = {_toml_value(value)}", f"{src}:{line}" if line else str(src)))
        elif key in defaults:
            rows.append((f"{key} = {_toml_value(defaults[key])}", "default"))
        else:
            rows.append((f"# {key} = (not set)", ""))
    keys = {info.alias or name for name, info in Settings.model_fields.items()}
    rows += [(f"{key} = {_toml_value(value)}", f"--{key} (command line only)") for key, value in flags.items()
             if key not in keys and value not in (None, [], {})]
    width = max(len(r[0]) for r in rows)
    return "\n".join([head] + [f"{text.ljust(width)}  # {where}" if where else text for text, where in rows]) + "\n"
