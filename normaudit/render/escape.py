"""Untrusted text (module names, checkpoint keys, messages quoting them, file names) made safe for the formats
that print it as is: control characters escaped for terminals and CI logs (:func:`escape_control`), table cells
and code spans for Markdown (:func:`escape_cell`, :func:`code`). JSON and SARIF escape by their serialisers."""
from __future__ import annotations

import re
import unicodedata

#: Characters that change what a terminal or a log viewer shows rather than being shown: C0/C1 controls
#: (ESC starts ANSI/OSC sequences, BEL ends OSC, CR/LF start a new line), DEL, line/paragraph separators and
#: the bidirectional overrides and isolates of Unicode TR #9 ("Trojan Source", CVE-2021-42574).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: A line a CI runner reads as a command once leading blanks are stripped: GitHub Actions workflow commands
#: (``::error ...``) and the older ``##[...]`` form.
_COMMAND_LINE = re.compile(r"^\s*(::|##\[)")


def escape_char(ch: str) -> str:
    """One character as printed: a control character (Unicode category Cc, Zl, Zp, or a bidi control) as
    ``\\n``/``\\r``/``\\t`` or ``\\xNN``/``\\uNNNN``, any other character unchanged."""
    if ch in _SHORT:
        return _SHORT[ch]
    if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI:
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return ch


def escape_control(text: str) -> str:
    """``text`` safe to print on a terminal or in a CI log: every control character written as an escape
    (``\\x1b``, ``\\n``, ``\\u202e``: Python's notation), and a backslash put before a leading ``::`` or
    ``##[`` so that the string cannot start a workflow command on its line.

    Untrusted strings (module names and checkpoint keys, messages quoting them, file names) go through this
    before text or markdown output; JSON and SARIF escape by their serialisers, ``--format github`` by
    GitHub's own rules (:mod:`normaudit.render.github`).

    >>> escape_control("ln\\x1b]0;pwn\\x07\\n::error ::x")
    'ln\\\\x1b]0;pwn\\\\x07\\\\n::error ::x'
    >>> escape_control("::warning ::x")
    '\\\\::warning ::x'
    """
    if text.isprintable() and not _COMMAND_LINE.match(text) and not any(ch in _BIDI for ch in text):
        return text
    out = "".join(escape_char(ch) for ch in text)
    return "\\" + out if _COMMAND_LINE.match(out) else out


def escape_cell(text: str) -> str:
    """Make ``text`` safe inside a Markdown table cell: ``|`` -> ``\\|``, line breaks -> ``<br>``."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("|", "\\|").replace("\n", "<br>")


def code(text: str) -> str:
    """Wrap ``text`` in a code span that survives backticks in it and table pipes."""
    text = text.replace("|", "\\|").replace("\n", " ")
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def guard_lines(text: str) -> str:
    """``text`` with a backslash before any line that a CI runner would read as a command (the last guard
    after :func:`normaudit.render.text.escaped_report`, for strings our own layout puts at the start of a line)."""
    return "\n".join("\\" + ln if _COMMAND_LINE.match(ln) else ln for ln in text.split("\n"))
