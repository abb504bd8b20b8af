"""Capture failures in one line: the root cause behind the wrappers torch re-raises with, and whether a failure
comes from a data-dependent value."""
from __future__ import annotations


def root_cause(exc: BaseException) -> BaseException:
    """The original exception behind wrappers (ShapeProp and export re-raise with ``from``)."""
    seen = 0
    while exc.__cause__ is not None and seen < 10:
        exc, seen = exc.__cause__, seen + 1
    return exc


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, at most about 300 characters: a longer message keeps its start and its
    end (a message that begins with a module's repr says what went wrong at the end)."""
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:150] + " ... " + text[-145:]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def data_dependent(error: str) -> bool:
    """Whether a capture failed on a data-dependent size or value (an unbacked symbol of export)."""
    return any(s in error for s in ("GuardOnDataDependentSymNode", "data-dependent", "unbacked"))
