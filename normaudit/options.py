"""What one target's audit is asked to do, importable without torch: the command line builds these before it
knows whether any target needs auditing (a run answered wholly from the cache never imports torch)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

#: Seconds a target may take for import, build, capture and probes (``--timeout``, ``timeout`` in settings;
#: enforced by :mod:`normaudit.worker`).
DEFAULT_TIMEOUT = 300.0
#: ``--max-params`` default: the most parameters ``--probe numerics`` builds for real, and the most elements a
#: model factory that cannot run on the meta device may allocate when built with real weights (10**9 float32
#: values: 4 GB, what a shared CI runner can spare)
DEFAULT_MAX_PARAMS = 1_000_000_000


#: ``--input-axes`` letters and the axis labels they stand for, and every label (CONTRACT.md ``normalized_axes``);
#: the capture's axis facts (:mod:`normaudit.facts.axes`) use the same vocabulary
def split_target(spec: str) -> tuple[Path, Optional[str]]:
    """Split ``path.py:factory`` into the path and the factory name (None when absent)."""
    if ":" in spec:
        head, _, tail = spec.rpartition(":")
        if head.endswith(".py") and tail.isidentifier():
            return Path(head), tail
    return Path(spec), None


@dataclass
class AuditOptions:
    """What one audit run is asked to do (the CLI flags, after config-file merging)."""

    target: str
    config: Optional[str] = None
    checkpoint: Optional[str] = None
    dtype: str = "float32"
    batch_size: Optional[int] = None
    rules_dirs: list[str] = field(default_factory=list)
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    input_axes: Optional[str] = None
    probes: list[str] = field(default_factory=list)
    #: ``{module glob: [rule ids, prefixes, names or categories]}`` dropped after evaluation (normaudit.suppress).
    per_module_ignores: dict[str, list[str]] = field(default_factory=dict)
    #: A configuration mapping given in memory (``normaudit.testing``); wins over ``config``.
    config_data: Optional[dict[str, Any]] = None
    #: ``--max-params``: the most parameters ``--probe numerics`` builds for real, and the most elements a
    #: factory that cannot run on the meta device may allocate when it is built with real weights (default
    #: :data:`DEFAULT_MAX_PARAMS`); above it the audit is refused (exit 2)
    max_params: Optional[int] = None
    #: depth-independent capture (``normaudit.capture.repeats``): stacks of identical blocks captured as four
    #: blocks, their facts carried over; False captures every block (the report is the same)
    repeats: bool = True


def exit_status(report: Any, fail_on: str) -> int:
    """0 when no finding of ``report`` (a :class:`~normaudit.report.Report`) is at or above ``fail_on``
    (error|warning|info|never), else 1 (CONTRACT.md)."""
    from normaudit.report import SEVERITY_RANK

    if fail_on == "never":
        return 0
    floor = SEVERITY_RANK[fail_on]
    return 1 if any(SEVERITY_RANK[f.severity] >= floor for f in report.findings) else 0
