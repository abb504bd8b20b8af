"""Renderers: one module per format, each ``render(report, rules) -> str``."""
from __future__ import annotations

import importlib

FORMATS = ("text", "json", "sarif", "github", "markdown")


def get_renderer(fmt: str):
    """The ``render`` function of a format. Raises ValueError for an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    return importlib.import_module(f"normaudit.render.{fmt}").render
