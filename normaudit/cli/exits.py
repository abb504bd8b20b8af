"""The exit statuses of the command (CONTRACT.md) and the one line that names an internal error."""
from __future__ import annotations

import signal

#: no finding at or above ``--fail-on``; such findings; bad input or usage; internal error (CONTRACT.md)
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
#: ended by SIGINT or SIGTERM: 128 + the signal's number, the status shells give a process that signal ended
EXIT_SIGINT, EXIT_SIGTERM = 128 + int(signal.SIGINT), 128 + int(signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when the command receives SIGTERM (a CI job's cancel, ``timeout``, ``kill``):
    a KeyboardInterrupt, so every path that kills the workers on Ctrl-C kills them on SIGTERM too."""


class sigterm_as_interrupt:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread and sets ``received`` (a
    library may turn the exception into a plain KeyboardInterrupt: Ray's ``ray.wait`` does); the handler
    before is restored after. Nothing where signals cannot be handled here (not the main thread)."""

    def __init__(self) -> None:
        self.received = False
        self.before: object = None

    def _handle(self, signum: int, frame: object) -> None:
        self.received = True
        raise Terminated()

    def __enter__(self) -> "sigterm_as_interrupt":
        try:
            self.before = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # signal only works in the main thread
            self.before = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            signal.signal(signal.SIGTERM, self.before)


def internal_text(exc: BaseException) -> str:
    """``Kind: message`` of an internal error on one line (a worker's error keeps its own kind); also where
    torch itself cannot be imported (the error may be that)."""
    try:
        from normaudit.loaders.pyfile import safe_str
    except ImportError:
        def safe_str(err: BaseException, limit: int) -> str:
            try:
                return str(err)[:limit]
            except Exception:  # noqa: BLE001 - a __str__ that raises
                return f"<{type(err).__name__}>"

    kind = getattr(exc, "kind", None) or type(exc).__name__
    return f"{kind}: {' '.join(safe_str(exc, 500).split())}"

