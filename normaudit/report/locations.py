"""Where a finding is shown: paths relative to the project root, and a location for every finding.

Most findings carry a ``source`` (the line constructing or calling the norm). The others still need a
place for CI and editors to show them (GitHub code scanning hides a SARIF result without a physical
location, a ``path:line:col:`` line needs a path), so :func:`finding_anchor` gives each one, in order:

1. the finding's own ``source`` (line 1 when it has no line);
2. for a checkpoint finding (category ``checkpoint``) without a source: the checkpoint file, line 1;
3. otherwise the model itself (:func:`model_anchor`): the ``class <Model>`` line of the target file when
   the model class is defined there, else its ``def <factory>`` line, else line 1; the ``config.json`` of a
   Hugging Face target; the checkpoint file of a checkpoint-only audit.

The project root (:func:`project_root`) is ``--project-root``, else the top level of the git work tree
holding the current directory (the nearest parent with a ``.git`` entry, as ``git rev-parse
--show-toplevel`` finds it, without running git), else the current directory. Relative paths in a report
are relative to the directory the audit ran in (the current directory).
"""
from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Optional

from normaudit.report import Finding, Report, SourceLocation

#: Weight files a checkpoint directory is shown by, in order of preference (the index of a sharded
#: checkpoint names every shard).
_CHECKPOINT_GLOBS = ("*.index.json", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt")
#: Bytes of a model file read to find its class or factory line (a larger file gets line 1).
_MAX_SCAN_BYTES = 4 << 20


def project_root(explicit: Optional[str] = None, cwd: Optional[str] = None) -> Path:
    """The directory report paths are made relative to (absolute, resolved).

    ``explicit`` (``--project-root``) wins; otherwise the nearest directory from ``cwd`` (default: the
    current directory) upward that holds a ``.git`` directory or file (a worktree or submodule), else
    ``cwd`` itself.
    """
    base = Path(cwd if cwd is not None else os.getcwd()).resolve()
    if explicit is not None:
        return (base / explicit).resolve()
    for candidate in (base, *base.parents):
        if (candidate / ".git").exists():
            return candidate
    return base


def absolute(file: str, cwd: Optional[str] = None) -> Path:
    """``file`` as an absolute path, a relative one taken from ``cwd`` (default: the current directory).
    Symbolic links are not resolved here (:func:`relative_to_root` tries both)."""
    path = Path(file)
    return path if path.is_absolute() else Path(cwd if cwd is not None else os.getcwd()) / path


def relative_to_root(file: str, root: Path, cwd: Optional[str] = None) -> Optional[str]:
    """``file`` relative to ``root`` in posix form (``models/gpt.py``), or None when it lies outside.

    The path is compared as given and with symbolic links resolved; ``.`` and ``..`` parts are
    normalised first, so ``a/../b.py`` under the root is ``b.py``.
    """
    path = Path(os.path.normpath(absolute(file, cwd)))
    for candidate, base in ((path, root), (path.resolve(), root.resolve())):
        try:
            rel = PurePosixPath(candidate.relative_to(base).as_posix())
        except ValueError:
            continue
        return str(rel) if str(rel) != "." else None
    return None


def target_file(report: Report) -> Optional[str]:
    """The file of the audited target as given on the command line, without a ``:factory`` suffix
    (``models/gpt.py:build`` -> ``models/gpt.py``). None for a ``package.module:factory`` target."""
    path = report.target.path
    factory = report.target.factory
    if factory and path.endswith(f":{factory}"):
        path = path[: -len(factory) - 1]
    if report.target.kind == "python" and not path.endswith(".py") and not Path(path).is_file():
        return None
    return path


def checkpoint_file(report: Report) -> Optional[str]:
    """The checkpoint file findings about the weights point at: ``target.checkpoint`` (or the target of
    a checkpoint-only audit); for a directory, its sharded index or first weights file by name."""
    path = report.target.checkpoint or (report.target.path if report.target.kind == "checkpoint" else None)
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        for pattern in _CHECKPOINT_GLOBS:
            found = sorted(p.glob(pattern))
            if found:
                return str(found[0])
        return None
    return path


def definition_line(file: str, class_name: Optional[str], factory: Optional[str]) -> Optional[int]:
    """The 1-based line of ``class <class_name>`` in ``file``, else of ``def <factory>``, else None.

    The file is read as text (never imported); a file that cannot be read, or is over 4 MiB, gives None.
    """
    try:
        with open(file, "rb") as fh:
            data = fh.read(_MAX_SCAN_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MAX_SCAN_BYTES:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    for keyword, name in (("class", class_name), ("def", factory)):
        if not name or not name.isidentifier():
            continue
        pattern = re.compile(rf"^\s*(?:async\s+)?{keyword}\s+{re.escape(name)}\b")
        for number, text in enumerate(lines, 1):
            if pattern.match(text):
                return number
    return None


def model_anchor(report: Report) -> Optional[SourceLocation]:
    """Where a finding about the model as a whole is shown (see the module docstring); None when the
    target is not a file (``package.module:factory``) and no checkpoint was read."""
    kind = report.target.kind
    if kind == "checkpoint":
        ckpt = checkpoint_file(report)
        return SourceLocation(file=ckpt, line=1) if ckpt else None
    if kind == "onnx":
        return SourceLocation(file=report.target.path, line=1)
    if kind in ("hf_dir", "hf_config"):
        path = Path(report.target.path)
        config = path / "config.json" if kind == "hf_dir" else path
        return SourceLocation(file=str(config), line=1)
    file = target_file(report)
    if file is None:
        ckpt = checkpoint_file(report)
        return SourceLocation(file=ckpt, line=1) if ckpt else None
    line = definition_line(str(absolute(file)), report.model.class_name, report.target.factory)
    return SourceLocation(file=file, line=line or 1)


def finding_anchor(finding: Finding, report: Report) -> Optional[SourceLocation]:
    """The location a finding is shown at, always with a line >= 1 (see the module docstring): its own
    source, else the checkpoint file for a checkpoint finding, else :func:`model_anchor`."""
    if finding.source is not None and finding.source.file:
        line = finding.source.line if finding.source.line is not None and finding.source.line >= 1 else 1
        return SourceLocation(file=finding.source.file, line=line)
    if finding.category == "checkpoint":
        ckpt = checkpoint_file(report)
        if ckpt:
            return SourceLocation(file=ckpt, line=1)
    return model_anchor(report)


def anchor_in_root(finding: Finding, report: Report,
                   root: Path) -> tuple[Optional[SourceLocation], Optional[SourceLocation]]:
    """``(shown, outside)`` for a viewer that can only show files under ``root`` (GitHub code scanning and
    annotations): ``shown`` is :func:`finding_anchor` when it lies under ``root``; when it lies outside (a
    library's modeling file in site-packages), ``shown`` is the model's anchor under ``root`` and
    ``outside`` the original place. ``shown`` is the outside place itself when no anchor under ``root``
    exists, and None only when the finding has no place at all."""
    where = finding_anchor(finding, report)
    if where is None or relative_to_root(where.file, root) is not None:
        return where, None
    inside = model_anchor(report)
    if inside is not None and relative_to_root(inside.file, root) is not None:
        return inside, where
    return where, None


def library_path(file: str) -> str:
    """A library file as people name it: the part after the last ``site-packages``/``dist-packages``
    directory (``transformers/models/llama/modeling_llama.py``), else ``file`` in posix form."""
    parts = PurePosixPath(file.replace(os.sep, "/")).parts
    cut = max((i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), default=None)
    return "/".join(parts[cut + 1:]) if cut is not None and cut + 1 < len(parts) else PurePosixPath(*parts).as_posix()


def outside_note(outside: Optional[SourceLocation]) -> str:
    """`` (library: transformers/models/llama/modeling_llama.py:297)`` for the place outside the project
    :func:`anchor_in_root` moved a finding from; ``""`` when it moved nothing."""
    if outside is None:
        return ""
    return f" (library: {library_path(outside.file)}" + (f":{outside.line})" if outside.line else ")")

