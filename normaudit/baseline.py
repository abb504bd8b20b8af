"""Baselines: accept the findings a model has today and report only new ones.

``normaudit --write-baseline normaudit-baseline.json`` records every current finding keyed by target, rule
id and module path (not line numbers or messages, which move when unrelated code changes)::

    {"tool": "normaudit", "baseline_version": 1,
     "findings": [{"target": "models/gpt.py", "rule_id": "NE101", "module": "h.0.ln_1", "count": 1}]}

``normaudit --baseline normaudit-baseline.json`` then drops findings that match an entry (up to ``count``
of them per key) and reports the rest. Target paths are stored relative to the baseline file's directory,
so the file can be committed and used from any working directory.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

from normaudit.errors import UsageError
from normaudit.loaders.safe_read import json_nesting, read_regular
from normaudit.report import Finding, Report

#: deepest nesting accepted in a baseline file (its own layout nests 4 levels; Python's json recurses per level)
MAX_BASELINE_NESTING = 100

BASELINE_VERSION = 1
_FACTORY = re.compile(r"^(.*\.py):([A-Za-z_]\w*)$")


class BaselineEntry(BaseModel):
    """Accepted findings of one rule on one module of one target."""

    model_config = ConfigDict(extra="forbid")

    target: str
    rule_id: str
    module: str
    count: NonNegativeInt = 1


class Baseline(BaseModel):
    """The baseline file."""

    model_config = ConfigDict(extra="forbid")

    tool: str = "normaudit"
    baseline_version: int = BASELINE_VERSION
    findings: list[BaselineEntry] = Field(default_factory=list)


def target_key(target: str, base_dir: Path) -> str:
    """How a target is named in a baseline: a path relative to ``base_dir`` (POSIX separators), with
    ``:factory`` kept unless it is the default ``build_model``; a ``package.module:factory`` spec as is."""
    m = _FACTORY.match(target)
    path_text, factory = (m.group(1), m.group(2)) if m else (target, None)
    path = Path(path_text)
    if not path.exists():
        return target
    try:
        rel = Path(os.path.relpath(path.resolve(), base_dir.resolve())).as_posix()
    except ValueError:  # another drive on Windows
        rel = path.resolve().as_posix()
    return rel + (f":{factory}" if factory and factory != "build_model" else "")


def _count(findings: Iterable[Finding], key: str) -> Counter:
    return Counter((key, f.rule_id, f.module) for f in findings)


def build_baseline(reports: Iterable[Report], base_dir: Path) -> Baseline:
    """The baseline accepting every finding of ``reports`` (sorted, for stable diffs)."""
    counts: Counter = Counter()
    for report in reports:
        counts.update(_count(report.findings, target_key(report.target.path, base_dir)))
    entries = [BaselineEntry(target=t, rule_id=r, module=m, count=n) for (t, r, m), n in sorted(counts.items())]
    return Baseline(findings=entries)


def write_baseline(path: str | Path, reports: Iterable[Report]) -> int:
    """Write the baseline of ``reports`` to ``path``; returns the number of findings recorded.
    Raises UsageError when the file cannot be written."""
    path = Path(path)
    baseline = build_baseline(reports, path.parent if str(path.parent) else Path("."))
    text = json.dumps(baseline.model_dump(), indent=2) + "\n"
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write baseline: {err.strerror or err}", file=str(path)) from err
    return sum(e.count for e in baseline.findings)


def load_baseline(path: str | Path) -> Baseline:
    """Read and validate a baseline file. Raises UsageError naming the file (and line for bad JSON), also for
    a baseline that is not a regular file (:func:`normaudit.loaders.safe_read.read_regular`)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise UsageError("baseline file not found (create it with --write-baseline)", file=str(path))
    raw = read_regular(path, "baseline")  # a FIFO or a device is refused, never opened; size bounded
    if json_nesting(raw) > MAX_BASELINE_NESTING:
        raise UsageError(f"not a normaudit baseline: it nests lists/objects deeper than {MAX_BASELINE_NESTING} "
                         "levels", file=str(path))
    try:
        data = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as err:
        raise UsageError(f"invalid JSON in baseline: {err.msg}", file=str(path), line=err.lineno) from err
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read baseline: {err}", file=str(path)) from err
    try:
        baseline = Baseline.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise UsageError(f"not a normaudit baseline: '{where}': {first['msg']}", file=str(path)) from None
    if baseline.baseline_version != BASELINE_VERSION:
        raise UsageError(f"unsupported baseline_version {baseline.baseline_version} (expected {BASELINE_VERSION})",
                         file=str(path))
    return baseline


#: The note :func:`apply_baseline` leaves on a report; :func:`baselined_count` reads the number back.
BASELINED_NOTE = "{n} finding(s) matched the baseline and are not reported"


def baselined_count(report: Report) -> int:
    """How many findings of ``report`` the baseline took out (0 without a baseline), from its note."""
    pattern = re.escape(BASELINED_NOTE).replace(re.escape("{n}"), r"(\d+)")
    return sum(int(m.group(1)) for note in report.notes if (m := re.fullmatch(pattern, note)))


def apply_baseline(report: Report, baseline: Baseline, base_dir: Path) -> Report:
    """A copy of ``report`` without the findings ``baseline`` accepts, its summary recounted and a note
    saying how many were baselined (and how many baselined findings no longer occur)."""
    key = target_key(report.target.path, base_dir)
    budget = Counter({(e.target, e.rule_id, e.module): e.count for e in baseline.findings if e.target == key})
    kept: list[Finding] = []
    matched = 0
    for f in report.findings:
        k = (key, f.rule_id, f.module)
        if budget[k] > 0:
            budget[k] -= 1
            matched += 1
        else:
            kept.append(f)
    stale = sum(n for n in budget.values() if n > 0)
    notes = list(report.notes)
    if matched:
        notes.append(BASELINED_NOTE.format(n=matched))
    if stale:
        notes.append(f"{stale} baselined finding(s) no longer occur: refresh the baseline with --write-baseline")
    summary = report.summary.model_copy(update={
        "errors": sum(f.severity == "error" for f in kept),
        "warnings": sum(f.severity == "warning" for f in kept),
        "infos": sum(f.severity == "info" for f in kept)})
    return report.model_copy(update={"findings": kept, "summary": summary, "notes": notes})


def baseline_dir(path: Optional[str | Path]) -> Path:
    """The directory target paths in the baseline at ``path`` are relative to."""
    p = Path(path) if path else Path(".")
    return p.parent if str(p.parent) else Path(".")
