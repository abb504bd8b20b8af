"""GitHub Actions workflow commands (``--format github``): one annotation per group of findings.

Each finding (or group: one fault at one line over many layers) becomes one line such as::

    ::error file=models/gpt.py,line=42,title=NE101 eps-differs-from-config::h.0.ln_1: eps is 1e-05 ...

``error`` and ``warning`` keep their names; ``info`` becomes ``notice``. The message is escaped as the
runner expects (``%`` -> ``%25``, CR -> ``%0D``, LF -> ``%0A``), and property values additionally get
``:`` -> ``%3A`` and ``,`` -> ``%2C``. A finding without a source file gets no ``file``/``line``
properties (GitHub then shows it on the run summary rather than on a line): one about the model as a whole
is placed at the model's class or factory line, a checkpoint finding at the checkpoint file; a place outside
the project root is written as an absolute path (GitHub cannot put it on a line). The message starts with
the module path (``layers.3.ln_1: ...``), since one source line often builds the norm of every layer.
File paths are made relative to the project root (``--project-root``, default the git top level), the
checkout the annotations refer to; one fault repeated over many layers is one annotation.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from normaudit.engine.schema import Rule
from normaudit.render.concise import without_label
from normaudit.report.locations import anchor_in_root, project_root, relative_to_root
from normaudit.render.sarif import source_path
from normaudit.render.escape import escape_char
from normaudit.render.text import group_findings
from normaudit.report import Finding, Report, SourceLocation

#: normaudit severity -> workflow command.
COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def escape_data(value: str) -> str:
    """Escape a workflow command's message (the part after ``::``) as the runner decodes it: ``%`` ->
    ``%25``, CR -> ``%0D``, LF -> ``%0A``, so the message stays on the command's line. Other control
    characters (ESC of ANSI/OSC sequences, BEL, bidi overrides), which the runner would pass to the log
    raw, are written as escapes (``\\x1b``), as in text output
    (:func:`normaudit.render.text.escape_control`).

    >>> escape_data("100% ln\\n::error ::x\\x1b]0;t\\x07")
    '100%25 ln%0A::error ::x\\\\x1b]0;t\\\\x07'
    """
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value if value.isprintable() else "".join(escape_char(ch) for ch in value)


def escape_property(value: str) -> str:
    """Escape a workflow command property value (``file=``, ``title=``...)."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def command(finding: Finding, cwd: Optional[str] = None, where: Optional[SourceLocation] = None,
            label: Optional[str] = None, message: Optional[str] = None) -> str:
    """Return the workflow command line (no trailing newline) that annotates ``finding``.

    ``where`` (default: ``finding.source``) gives ``file``/``line``, the file relative to ``cwd``; the
    message is ``"<label>: <message>"`` (``label`` default: the module path; just the message for the root
    module, whose path is empty); the title is ``"<rule id> <rule name>"``.
    """
    where = where if where is not None else finding.source
    props: list[str] = []
    if where is not None and where.file:
        path, _ = source_path(where.file, cwd)
        props.append(f"file={escape_property(path)}")
        if where.line is not None and where.line >= 1:
            props.append(f"line={where.line}")
    props.append(f"title={escape_property(f'{finding.rule_id} {finding.rule_name}')}")
    label = finding.module if label is None else label
    message = finding.message if message is None else message
    text = f"{label}: {message}" if label else message
    return f"::{COMMANDS[finding.severity]} {','.join(props)}::{escape_data(text)}"


def render(report: Report, rules: dict[str, Rule], options: Any = None) -> str:
    """Render ``report`` as GitHub Actions workflow commands, one line per group of findings
    (:func:`normaudit.render.text.group_findings`: one fault over 18 layers is one annotation naming the
    layer range, so GitHub's limit of 10 annotations of a kind per step is not spent on repeats), in
    report order. Each is placed at the finding's source when it lies under the project root
    (``options.project_root``, default :func:`normaudit.report.locations.project_root`), else at the
    model's class or factory line, a checkpoint finding without a source at the checkpoint file; paths are
    relative to the project root, the workspace the annotations refer to.

    ``rules`` is accepted for a uniform renderer signature; the title uses the finding's own rule id
    and name. Returns an empty string when there is no finding.
    """
    root = getattr(options, "project_root", None)
    root = Path(root) if root is not None else project_root()
    lines = []
    for group in group_findings(report.findings):
        where, _ = anchor_in_root(group.first, report, root)
        rel = relative_to_root(where.file, root) if where is not None else None
        # no place under the project root: the path as given (GitHub shows it on the run summary)
        shown = SourceLocation(file=rel, line=where.line) if rel is not None else where
        label = group.count_label if len(group.findings) > 1 else group.first.module
        lines.append(command(group.first, None, shown, label, without_label(group.message, group.label)) + "\n")
    return "".join(lines)
