"""``--statistics``: the number of findings per rule, as ``ruff check --statistics`` prints them.

One line per rule with at least one finding, most frequent first (ties by rule id)::

    18  NE101  [error]    eps-differs-from-config
     1  NP101  [warning]  pre-norm-without-final-norm

The count is of findings (one per module), so a fault repeated in 18 layers counts 18; the severity is the
highest the rule's findings have. No finding gives no line.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from normaudit.render.style import SEVERITY_STYLES, paint
from normaudit.render.escape import escape_control
from normaudit.report import SEVERITY_RANK, Report


def rule_counts(reports: Sequence[Report]) -> list[tuple[int, str, str, str]]:
    """``(count, rule id, severity, rule name)`` per rule over ``reports``, most frequent first."""
    counts: Counter = Counter()
    severity: dict[str, str] = {}
    names: dict[str, str] = {}
    for report in reports:
        for f in report.findings:
            counts[f.rule_id] += 1
            names.setdefault(f.rule_id, f.rule_name)
            if SEVERITY_RANK[f.severity] > SEVERITY_RANK.get(severity.get(f.rule_id, "info"), 0) \
                    or f.rule_id not in severity:
                severity[f.rule_id] = f.severity
    return sorted(((n, rid, severity[rid], names[rid]) for rid, n in counts.items()), key=lambda t: (-t[0], t[1]))


def render_statistics(reports: Sequence[Report], options: Any = None) -> str:
    """The statistics table (see the module docstring), one line per rule, each ending in a newline."""
    rows = rule_counts(reports)
    if not rows:
        return ""
    color = bool(getattr(options, "color", False))
    width = len(str(rows[0][0]))
    sev_width = max(len(f"[{sev}]") for _, _, sev, _ in rows)
    lines = []
    for count, rule_id, sev, name in rows:
        tag = f"[{sev}]".ljust(sev_width)
        lines.append(f"{count:>{width}}  {paint(rule_id, SEVERITY_STYLES[sev], color)}  "
                     f"{paint(tag, SEVERITY_STYLES[sev], color)}  {escape_control(name)}")
    return "\n".join(lines) + "\n"
