"""GitHub Actions workflow commands (``--format github``): one annotation per finding.

Each finding becomes one line such as::

    ::error file=models/gpt.py,line=42,title=NE101 eps-differs-from-config::h.0.ln_1: eps is 1e-05 ...

``error`` and ``warning`` keep their names; ``info`` becomes ``notice``. The message is escaped as the
runner expects (``%`` -> ``%25``, CR -> ``%0D``, LF -> ``%0A``), and property values additionally get
``:`` -> ``%3A`` and ``,`` -> ``%2C``. A finding without a source file gets no ``file``/``line``
properties (GitHub then shows it on the run summary rather than on a line). The message starts with
the module path (``layers.3.ln_1: ...``), since one source line often builds the norm of every layer.
File paths are made relative to the current directory, which in a workflow is the checkout the
annotations refer to.
"""
from __future__ import annotations

from typing import Optional

from normaudit.engine.schema import Rule
from normaudit.render.sarif import source_path
from normaudit.render.text import escape_char
from normaudit.report import Finding, Report

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


def command(finding: Finding, cwd: Optional[str] = None) -> str:
    """Return the workflow command line (no trailing newline) that annotates ``finding``.

    The message is ``"<module>: <message>"`` (just the message for the root module, whose path is
    empty); the title is ``"<rule id> <rule name>"``.
    """
    props: list[str] = []
    if finding.source is not None and finding.source.file:
        path, _ = source_path(finding.source.file, cwd)
        props.append(f"file={escape_property(path)}")
        if finding.source.line is not None and finding.source.line >= 1:
            props.append(f"line={finding.source.line}")
    props.append(f"title={escape_property(f'{finding.rule_id} {finding.rule_name}')}")
    message = f"{finding.module}: {finding.message}" if finding.module else finding.message
    return f"::{COMMANDS[finding.severity]} {','.join(props)}::{escape_data(message)}"


def render(report: Report, rules: dict[str, Rule]) -> str:
    """Render ``report`` as GitHub Actions workflow commands, one line per finding, in report order.

    ``rules`` is accepted for a uniform renderer signature; the title uses the finding's own rule id
    and name. Returns an empty string when there is no finding.
    """
    return "".join(command(finding) + "\n" for finding in report.findings)
