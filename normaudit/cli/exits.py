"""The exit statuses of the command (CONTRACT.md) and the one line that names an internal error."""
from __future__ import annotations


#: no finding at or above ``--fail-on``; such findings; bad input or usage; internal error (CONTRACT.md)
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


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
