"""``--format concise``: one line per finding, ``path:line:col: CODE [severity] module: message``, as
ruff and mypy print them (editors and pre-commit turn them into links), then one summary line.

- One fault repeated over many layers at one source line is one line
  (:func:`normaudit.render.text.group_findings`): ``layers.0-17.input_layernorm (18 modules): ...``.
- Every line has a place (:func:`normaudit.report.locations.finding_anchor`): the finding's source, else
  the checkpoint file (checkpoint findings), else the model's class or factory line; a place outside the
  project root (a library's file) is shown at the model's place, as in SARIF, with ``(library: ...)``. Paths under the
  current directory are relative to it, others absolute. The column is 1: findings point at lines.
- Lines are sorted by path, line, rule id; the summary (``Found 5 findings: 2 errors, 3 warnings.``,
  ``Found 9 findings (5 lines, grouped by layer): ...`` when groups made fewer lines, or ``No findings.``)
  is left out with ``--quiet``.
- Every string from the report is escaped by :func:`normaudit.render.text.escape_control`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from normaudit.baseline import baselined_count
from normaudit.report.locations import anchor_in_root, outside_note, project_root
from normaudit.render.sarif import source_path
from normaudit.render.style import SEVERITY_STYLES, paint
from normaudit.render.escape import escape_control, guard_lines
from normaudit.render.text import group_findings
from normaudit.report import Report


def finding_lines(report: Report, color: bool = False, cwd: Optional[str] = None,
                  root: Optional[Path] = None) -> list[tuple[tuple, str]]:
    """``(sort key, line)`` for each group of findings of ``report`` (no trailing newline). A place outside
    ``root`` (the project root, default :func:`normaudit.report.locations.project_root`), such as a
    library's modeling file, is shown at the model's place inside it, as SARIF and GitHub annotations show
    it, and the line ends with ``(library: transformers/models/llama/modeling_llama.py:297)``."""
    root = Path(root) if root is not None else project_root(cwd=cwd)
    out = []
    for group in group_findings(report.findings):
        first = group.first
        where, outside = anchor_in_root(first, report, root)
        path, line = (source_path(where.file, cwd)[0], where.line or 1) if where is not None else ("<unknown>", 1)
        shown = escape_control(path)
        code = paint(first.rule_id, SEVERITY_STYLES[first.severity], color)
        severity = paint(f"[{first.severity}]", SEVERITY_STYLES[first.severity], color)
        text = (f"{paint(shown, 'bold', color)}:{line}:1: {code} {severity} "
                f"{escape_control(group.count_label)}: {escape_control(without_label(group.message, group.label))}"
                f"{escape_control(outside_note(outside))}")
        out.append(((path, line, first.rule_id, group.label), guard_lines(text)))
    return out


def without_label(message: str, label: str) -> str:
    """``message`` without a leading ``"<label>: "`` (a message that starts with its module path would
    otherwise name it twice after the line's own label)."""
    prefix = f"{label}: "
    return message[len(prefix):] if label and message.startswith(prefix) else message


def summary_line(errors: int, warnings: int, infos: int, failed: int = 0, lines: Optional[int] = None,
                 baselined: int = 0, targets: Optional[int] = None) -> str:
    """``Found 5 findings: 2 errors, 3 warnings.`` (``No findings.``), with ``1 target failed`` when one did.
    ``lines``: the number of lines printed, said when grouping made it fewer than the findings
    (``Found 9 findings (5 lines, grouped by layer): 8 errors, 1 warning.``); ``baselined``: the findings
    ``--baseline`` took out (``No new findings (9 in the baseline).``, ``Found 1 new finding (9 in the
    baseline): ...``). ``targets``: with more than one, how many the run audited, failed ones included
    (``Found 5 findings in 3 targets (1 failed): 2 errors, 3 warnings.``, ``No findings in 3 targets.``)."""
    total = errors + warnings + infos
    counts = [f"{n} {word}{'' if n == 1 else 's'}" for n, word in ((errors, "error"), (warnings, "warning"))
              if n] + ([f"{infos} info"] if infos else [])
    shown = f" ({lines} line{'' if lines == 1 else 's'}, grouped by layer)" if lines is not None and lines < total else ""
    new, kept = (" new", f" ({baselined} in the baseline)") if baselined else ("", "")
    several = targets is not None and targets > 1
    where = (f" in {targets} targets" + (f" ({failed} failed)" if failed else "")) if several else ""
    text = (f"Found {total}{new} finding{'' if total == 1 else 's'}{where}{shown}{kept}: {', '.join(counts)}."
            if total else f"No{new} findings{where}{kept}.")
    if failed and not several:
        text += f" {failed} target{'' if failed == 1 else 's'} failed."
    return text


def render_many(reports: Sequence[Report], options: Any = None, failed: int = 0,
                targets: Optional[int] = None) -> str:
    """The concise lines of several reports, sorted together, then one summary line (unless quiet) saying, for
    a run of several ``targets`` (``failed`` of them without a report), how many were audited."""
    color = bool(getattr(options, "color", False))
    root = getattr(options, "project_root", None)
    lines = sorted((item for r in reports for item in finding_lines(r, color, root=root)), key=lambda item: item[0])
    text = "".join(line + "\n" for _, line in lines)
    if not getattr(options, "quiet", False):
        totals = [sum(f.severity == sev for r in reports for f in r.findings) for sev in ("error", "warning", "info")]
        baselined = sum(baselined_count(r) for r in reports)
        text += summary_line(*totals, failed=failed, lines=len(lines), baselined=baselined, targets=targets) + "\n"
    return text


def render(report: Report, rules: Any = None, options: Any = None) -> str:
    """Render ``report`` as concise lines (see the module docstring); ``options``:
    :class:`normaudit.render.RenderOptions` (``color``, ``quiet``). ``rules`` is unused."""
    return render_many([report], options)
