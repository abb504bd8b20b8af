"""The fact pipeline: the one place that sequences the passes (:data:`PASSES`), for every way a model is
captured.

Every pass has one signature, ``run(ctx: FactContext, facts: Facts) -> None``
(:mod:`normaudit.facts.context`), reads the graph and what earlier passes wrote, and writes typed facts onto the
site records and the model facts (and notes onto ``facts.notes``). Each declares what it reads and writes and
its stage:

- ``graph``: runs on each captured graph: the whole model's, and each part captured alone
  (:mod:`normaudit.pipeline.parts` joins a part's facts into the model's);
- ``probe``: re-runs the whole model (the size and batch probes): the whole model's graph only;
- ``model``: once over every site of the model (from graphs, parts, or the module walk when nothing was
  captured); under depth-independent capture over the kept blocks, its site facts then carried to the rest;
- ``whole_model``: once over every site of the whole model, after the carry-over (facts that compare a site
  with every other: eps peers, GroupNorm groups against the config) and the ``--probe numerics`` run.

Depth-independent capture (:mod:`normaudit.capture.repeats`) captures each stack of identical blocks as four
blocks; :mod:`normaudit.pipeline.carry` proves the facts translation-invariant and carries them to the elided
blocks, and a pass whose model-level facts need more than a copy declares it (``carry``).
"""
from __future__ import annotations

from typing import Any, Optional

from normaudit.facts.context import FactContext, Facts
from normaudit.facts.sites import walk_modules
from normaudit.pipeline import carry, parts
from normaudit.pipeline.passes import PASSES, Pass, run_stage  # noqa: F401 - the pipeline's API
from normaudit.report import ModelFacts


def collect_facts(ctx: FactContext, plan: Any = None) -> Optional[Facts]:
    """Every fact of the model captured in ``ctx.cap``: the stages of the module docstring in order.

    With no graph (``ctx.cap.gm`` None) the sites come from walking ``named_modules()``
    (:func:`normaudit.facts.sites.walk_modules`), those of captured parts replacing them. ``plan`` (a
    :class:`normaudit.capture.repeats.RepeatPlan`): ``ctx.cap`` is the reduced capture, and the facts are
    carried to the elided blocks before the ``whole_model`` stage (:mod:`normaudit.pipeline.carry`); returns
    None when they cannot be carried exactly (the caller then captures the whole model)."""
    if plan is not None:
        ctx = carry.reduced_context(ctx, plan)
        if ctx is None:
            return None
    cap = ctx.cap
    facts = Facts(model=ModelFacts(class_name=type(cap.root).__name__,
                                   num_parameters=sum(p.numel() for p in cap.root.parameters())))
    if cap.gm is not None:
        run_stage("graph", ctx, facts)
        run_stage("probe", ctx, facts)
    else:
        facts.records = walk_modules(cap.modules, ctx.origins)
    if cap.parts:
        parts.join(ctx, facts, cap.parts)
    run_stage("model", ctx, facts)
    if plan is not None:
        hooks = [p.carry for p in PASSES if p.carry is not None]
        if not carry.carry_over(plan, cap, facts, hooks, tuple(k for p in PASSES for k in p.recomputed)):
            return None
        ctx = carry.full_context(ctx, plan)
    run_stage("whole_model", ctx, facts)
    return facts
