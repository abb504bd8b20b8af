"""One target's job: its audit (:func:`normaudit.audit.run_audit`: import, build, capture, facts, probes,
rules), a failing rule expression named by the user's rule file it came from, then the baseline.

This is the unit of work the command line hands to every executor (:mod:`normaudit.runner`: a forked worker
process, the process itself where fork does not exist, a Ray task); it is below the command line, so the
workers import no argument parsing or output code. Imports torch only when called.
"""
from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Optional

from normaudit.errors import UsageError


def user_rule_file(rule_id: str, dirs: list[str]) -> Optional[str]:
    """The path of the rule file with id ``rule_id`` among the ``*.yaml`` files under ``dirs`` (the
    ``--rules`` directories, searched in order, files sorted), or None when no such file defines it (a
    shipped rule). Files that do not load are skipped."""
    from normaudit.engine.loader import load_rule_file

    for d in dirs:
        for path in sorted(Path(d).rglob("*.yaml")):
            with contextlib.suppress(UsageError):
                if load_rule_file(path).id == rule_id:
                    return str(path)
    return None


def audit_one(opts: Any, rules: dict, baseline: Any, baseline_base: Path) -> Any:
    """The :class:`~normaudit.report.Report` of one target (``opts``: :class:`normaudit.options.AuditOptions`)
    under ``rules``, without the findings ``baseline`` accepts (:func:`normaudit.baseline.apply_baseline`,
    target paths relative to ``baseline_base``; None: no baseline).

    A rule expression that fails (:class:`normaudit.engine.evaluator.RuleError`) in a rule of the user's own
    ``--rules`` directories is bad input: a UsageError naming that file (exit 2). In a shipped rule it is
    normaudit's bug and is raised as it is (exit 3)."""
    from normaudit.audit import run_audit
    from normaudit.baseline import apply_baseline
    from normaudit.engine.evaluator import RuleError

    try:
        report = run_audit(opts, rules)
    except RuleError as err:
        m = re.match(r"rule (N[A-Z]\d{3}) ", str(err))
        path = user_rule_file(m.group(1), opts.rules_dirs) if m else None
        if path is None:
            raise
        raise UsageError(f"{err}", file=path) from err
    if baseline is not None:
        report = apply_baseline(report, baseline, baseline_base)
    return report
