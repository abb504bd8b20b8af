"""The argument parser of normaudit's commands (``normaudit``, its subcommands, ``python -m normaudit.docs``):
argparse's, with each usage error turned into a :class:`~normaudit.errors.UsageError` (one line on stderr,
exit status 2) instead of argparse's usage text and exit."""
from __future__ import annotations

import argparse
from typing import NoReturn

from normaudit.errors import UsageError


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2 (via UsageError)."""

    def error(self, message: str) -> NoReturn:
        """Raise UsageError with argparse's ``message`` and a pointer to ``--help``."""
        raise UsageError(f"{message} (see '{self.prog} --help')")
