"""Terminal colours for the human formats (``text``, ``concise``), through ``rich``'s styles.

Colour is only ever applied to strings already made safe by :func:`normaudit.render.text.escape_control`
(so a module name cannot carry its own escape sequences), and only when the caller asks for it: the CLI
does when stdout is a terminal and the ``NO_COLOR`` environment variable is unset or empty
(https://no-color.org). ``rich`` is imported only when colour is on.
"""
from __future__ import annotations

import os
from functools import lru_cache
from typing import Optional, TextIO

#: normaudit severity -> rich style.
SEVERITY_STYLES = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}


def color_wanted(stream: Optional[TextIO], environ: Optional[dict] = None) -> bool:
    """True when ``stream`` is a terminal and ``NO_COLOR`` is unset or empty (https://no-color.org)."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR"):
        return False
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


@lru_cache(maxsize=64)
def _style(spec: str):
    from rich.style import Style

    return Style.parse(spec)


def paint(text: str, spec: str, enabled: bool) -> str:
    """``text`` wrapped in the ANSI codes of the rich style ``spec`` (``"bold red"``) when ``enabled``,
    else unchanged. 16 standard colours, which every terminal shows."""
    if not enabled or not text:
        return text
    from rich.color import ColorSystem

    return _style(spec).render(text, color_system=ColorSystem.STANDARD)
