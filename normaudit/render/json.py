"""``--format json``: exactly one JSON document, the report as pydantic dumps it (CONTRACT.md)."""
from __future__ import annotations

from normaudit.report import Report


def render(report: Report, rules=None, options=None) -> str:
    """The report as indented JSON (``Report.model_dump_json``)."""
    return report.model_dump_json(indent=2)
