"""Errors that become exit statuses (CONTRACT.md): ``UsageError`` -> exit 2, anything else -> exit 3."""
from __future__ import annotations

import os
from typing import Optional


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
    known, else ``FILE: cause`` or just the cause.
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
        return where + " ".join(self.message.split())
