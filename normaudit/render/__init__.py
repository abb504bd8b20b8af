"""Renderers: one module per format, each ``render(report, rules, options=None) -> str``.

``text`` (the default, for a person at a terminal), ``concise`` (``path:line:col: CODE [severity] message``,
one line per finding group, for pre-commit and editors), ``json`` (the report, CONTRACT.md), ``sarif``
(GitHub code scanning), ``github`` (workflow annotations), ``markdown`` (a pull-request comment).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

FORMATS = ("text", "concise", "json", "sarif", "github", "markdown")
#: Formats for a person: they group one fault repeated over many layers, honour --quiet and --statistics.
HUMAN_FORMATS = ("text", "concise")


@dataclass(frozen=True)
class RenderOptions:
    """How to render, beyond the report itself.

    ``project_root``: the directory SARIF URIs are relative to (None: :func:`normaudit.report.locations.
    project_root`); ``color``: ANSI colours (text and concise; the CLI sets it when stdout is a terminal
    and ``NO_COLOR`` is unset); ``quiet``: findings only, no site table, header or summary line;
    ``numerics_chart``: Markdown only, the file name (beside the Markdown) of the ``--probe numerics`` chart the
    CLI writes (:func:`normaudit.render.numerics_chart.write_chart`), linked instead of embedded; ``docs_url``:
    SARIF only, the ``docs-url`` setting, the base of the rules' ``helpUri`` (:func:`normaudit.render.sarif.
    docs_base`).
    """

    project_root: Optional[Path] = None
    color: bool = False
    quiet: bool = False
    numerics_chart: Optional[str] = None
    docs_url: Optional[str] = None


def get_renderer(fmt: str):
    """The ``render`` function of a format. Raises ValueError for an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    return importlib.import_module(f"normaudit.render.{fmt}").render
