"""Fact passes over the captured graph. Each pass reads node meta and the site records and writes typed
facts onto :class:`normaudit.report.Site` / :class:`normaudit.report.ModelFacts` (graph-level scratch
data goes under ``node.meta["normaudit"]``). The graph itself is never modified.

Order: ``sites`` (discovery) -> ``axes`` (labels per dim) -> ``placement`` (residual stream) ->
``formula`` (what each site computes) -> ``eps``/``weights`` (config and checkpoint comparisons) ->
``numerics`` (the output bound from checkpoint gains).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from normaudit.capture import Capture
from normaudit.facts import axes as axes_pass
from normaudit.facts import aliasing as aliasing_pass
from normaudit.facts import batchnorm as batchnorm_pass
from normaudit.facts import placement
from normaudit.facts import formula as formula_pass
from normaudit.facts import frozen as frozen_pass
from normaudit.facts import eps as eps_pass
from normaudit.facts import weights as weights_pass
from normaudit.facts import numerics as numerics_pass
from normaudit.facts import usage as usage_pass
from normaudit.facts.sites import SiteRecord, discover_sites, walk_modules
from normaudit.report import ModelFacts, SourceLocation
from normaudit import probes as probes_pass


@dataclass
class FactContext:
    """What the fact passes may read besides the graph.

    ``probe_model`` is an untouched copy of the model (on the meta device for large models, real for
    small ones built for real) for passes that run real numbers on small materialised modules;
    ``inputs`` are the real example inputs; ``options`` holds ``dtype``, ``batch_size``, ``probes``
    (opt-in dynamic probes named on the command line); ``config`` the configuration mapping.
    """

    cap: Capture
    origins: dict = field(default_factory=dict)
    input_axes: Optional[list[tuple[str, ...]]] = None
    options: dict[str, Any] = field(default_factory=dict)
    probe_model: Any = None
    inputs: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    config_source: Optional[str] = None
    #: every configuration to compare eps with (``normaudit.facts.eps.ConfigSource``: --config, the checkpoint's
    #: config, the model's own); an opened ``normaudit.loaders.checkpoint.Checkpoint`` given with the model
    config_sources: list = field(default_factory=list)
    checkpoint: Any = None
    #: axis labels per node, left by :func:`graph_facts`
    env: Optional[dict] = None


@dataclass
class Facts:
    """Everything the rules see: site records (with their pydantic ``Site``) and model-level facts."""

    records: list[SiteRecord]
    model: ModelFacts
    notes: list[str] = field(default_factory=list)


def collect_facts(ctx: FactContext) -> Facts:
    """Run the fact passes in order over a capture (or walk modules when the capture failed)."""
    cap, origins, input_axes = ctx.cap, ctx.origins, ctx.input_axes
    model = ModelFacts(class_name=type(cap.root).__name__,
                       num_parameters=sum(p.numel() for p in cap.root.parameters()))
    if cap.gm is None:
        records = walk_modules(cap.modules, origins)
        model.extra["groupnorm_config"] = batchnorm_pass.groupnorm_config_facts(ctx.config or {},
                                                                                 [r.site for r in records])
        if cap.parts:  # the parts captured alone: graph facts for the norms they hold
            from normaudit.capture.parts import facts_of_parts

            records, part_model = facts_of_parts(ctx, cap.parts, records)
            if part_model is not None:
                model.placement, model.blocks = part_model.placement, part_model.blocks
                model.has_final_norm, model.parallel_residual = None, part_model.parallel_residual
        notes = weights_pass.analyse(ctx, records)
        numerics_pass.analyse(ctx, records)
        eps_pass.analyse(ctx, records)
        return Facts(records=records, model=model, notes=notes)
    records = graph_facts(ctx, model)
    notes = probes_pass.run(ctx, records, ctx.env) if ctx.env is not None else []
    if cap.parts:  # towers the forward never called, captured alone
        from normaudit.capture.parts import facts_of_parts

        records += facts_of_parts(ctx, cap.parts, [])[0]
    notes += weights_pass.analyse(ctx, records)
    numerics_pass.analyse(ctx, records)
    eps_pass.analyse(ctx, records)
    model.unused_norms = usage_pass.unused_norms(ctx, records)
    notes += [n for n in [usage_pass.unused_note(model.unused_norms)] if n]
    return Facts(records=records, model=model, notes=notes)


def graph_facts(ctx: FactContext, model: ModelFacts) -> list[SiteRecord]:
    """The graph passes over ``ctx.cap.gm``: sites, axes, placement, formula, BatchNorm facts (model-level
    facts onto ``model``). Leaves the axis labels in ``ctx.env`` for the probes."""
    cap, origins, input_axes = ctx.cap, ctx.origins, ctx.input_axes
    aliasing_pass.thread_inplace(cap.gm, cap.modules)  # in-place ops read as dataflow inside their module
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
    aliasing_pass.analyse(cap, records)
    formula_pass.analyse(ctx, records)
    batchnorm_pass.analyse(ctx, records, model, env)
    frozen_pass.analyse(ctx, records)
    ctx.env = env
    return records
