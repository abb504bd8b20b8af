"""Fact passes over the captured graph. Each pass reads node meta and the site records and writes typed
facts onto :class:`normaudit.report.Site` / :class:`normaudit.report.ModelFacts` (graph-level scratch
data goes under ``node.meta["normaudit"]``). The graph itself is never modified.

Order: ``sites`` (discovery) -> ``axes`` (labels per dim) -> ``placement`` (residual stream) ->
``formula`` (what each site computes) -> ``eps``/``weights`` (config and checkpoint comparisons).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from normaudit.capture import Capture
from normaudit.facts import axes as axes_pass
from normaudit.facts import placement
from normaudit.facts.sites import SiteRecord, discover_sites, walk_modules
from normaudit.report import ModelFacts, SourceLocation


@dataclass
class Facts:
    """Everything the rules see: site records (with their pydantic ``Site``) and model-level facts."""

    records: list[SiteRecord]
    model: ModelFacts
    notes: list[str] = field(default_factory=list)


def collect_facts(cap: Capture, origins: Optional[dict[int, SourceLocation]] = None,
                  input_axes: Optional[list[tuple[str, ...]]] = None) -> Facts:
    """Run the fact passes in order over a capture (or walk modules when the capture failed)."""
    model = ModelFacts(class_name=type(cap.root).__name__,
                       num_parameters=sum(p.numel() for p in cap.root.parameters()))
    if cap.gm is None:
        return Facts(records=walk_modules(cap.modules, origins), model=model)
    records = discover_sites(cap, origins)
    env = axes_pass.label_graph(cap, input_axes)
    for rec in records:
        labels = env.get(rec.input) if rec.input is not None else None
        if isinstance(labels, list):
            rec.site.input_axes = axes_pass.axes_text(labels)
            dims = rec.site.reduced_dims or []
            picked = [labels[d] for d in dims if d < len(labels)]
            rec.site.normalized_axes = axes_pass.flat_labels(picked)  # type: ignore[assignment]
        elif rec.site.reduced_dims:
            rec.site.normalized_axes = ["unknown"]
    placement.analyse(cap, records, model)
    return Facts(records=records, model=model)
