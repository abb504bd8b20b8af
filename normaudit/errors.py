"""Errors that become exit statuses (CONTRACT.md): ``UsageError`` -> exit 2, anything else -> exit 3."""
from __future__ import annotations

import os
import re
from typing import Optional

# C0/C1 control characters (ESC starts terminal sequences) and the bidirectional overrides that reorder
# what a terminal shows; whitespace is folded to single spaces before this applies. Lone surrogates are the
# bytes of a file name that is not UTF-8 (Python decodes them with surrogateescape, PEP 383): no encoder
# writes them, so they are shown as the bytes they stand for.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the byte code - 0xDC00 of a non-UTF-8 name
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with control characters written as escapes (``\\x1b``, ``\\u202e``): a message quoting an
    untrusted name (a tensor key, a config string) cannot move the cursor, retitle the terminal or reorder
    the line; the undecodable bytes of a file name (``\\xff``) can be printed. Printable text, including
    non-ASCII letters, is unchanged."""
    return _UNPRINTABLE.sub(lambda m: _escape(m.group()), text)


def _display_path(path: str) -> str:
    """``path`` relative to the current directory when it lies under it, else as given."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


class UsageError(Exception):
    """Bad input or usage: the user's file, config or checkpoint cannot be used (exit status 2).

    ``str(err)`` is the one-line message printed on stderr: ``FILE:LINE: cause`` where file and line are
    known, else ``FILE: cause`` or just the cause; whitespace folded to single spaces and control
    characters escaped (:func:`escape_controls`).
    """

    def __init__(self, message: str, file: Optional[str] = None, line: Optional[int] = None):
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line

    def __str__(self) -> str:
        where = ""
        if self.file:
            shown = _display_path(self.file)
            where = f"{shown}:{self.line}: " if self.line else f"{shown}: "
        return escape_controls(where + " ".join(self.message.split()))
