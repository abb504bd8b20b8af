"""The facts of parts captured alone (:mod:`normaudit.capture.parts`: submodules captured on their own when the
whole model could not be, or towers the whole model's forward never called), joined into the model's: each
part's graph runs the ``graph`` stage on its own, its module paths made whole-model paths."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from normaudit.facts.context import FactContext, Facts
from normaudit.pipeline.passes import graph_facts
from normaudit.report import Block


def _join(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path else prefix


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _block_of(model: Any, part: Any) -> Block:
    """The part's own :class:`~normaudit.report.Block` in ``model.blocks`` (added when absent)."""
    for b in model.blocks:
        if b.path == part.path:
            return b
    model.blocks.append(Block(path=part.path, class_name=type(part.capture.root).__name__))
    return model.blocks[-1]


def _part_context(ctx: FactContext, part: Any) -> FactContext:
    """The context of one part: its own capture, the model's origins and config, the part's submodule of the
    probe model; no inputs, input axes, config sources or checkpoint of its own."""
    probe = None
    if ctx.probe_model is not None:
        with contextlib.suppress(AttributeError):
            probe = ctx.probe_model.get_submodule(part.path)
    return dataclasses.replace(ctx, cap=part.capture, input_axes=None, probe_model=probe, inputs=None,
                               config_sources=[], checkpoint=None, graph_nodes=None, build_fn=None, file=None)


def _part_facts(ctx: FactContext, part: Any) -> Facts:
    """The ``graph`` stage over one part, its paths made whole-model paths; a numbered part (one of a stack of
    blocks) is the block around its residual norms."""
    facts = graph_facts(_part_context(ctx, part), type(part.capture.root).__name__)
    repeated = part.path.rpartition(".")[2].isdigit()
    for rec in facts.records:
        inner = rec.site.module
        rec.site.module = _join(part.path, rec.site.module)
        if rec.site.block is not None:
            rec.site.block = _join(part.path, rec.site.block)
        elif repeated and rec.site.placement in ("pre", "post", "sandwich"):
            rec.site.block = part.path  # the part is the block around this residual norm
            _block_of(facts.model, part).norms[inner] = rec.site.placement
        rec.site.captured_part = part.path
    for b in facts.model.blocks:
        b.path = b.path if b.path == part.path else _join(part.path, b.path)
    return facts


def join(ctx: FactContext, facts: Facts, parts: list) -> None:
    """Add the sites of every part to ``facts``. Without a whole-model graph they replace the walked sites of
    the norm modules inside the parts, and the model's placement, blocks and parallel residual are those of the
    part with the most sites (its blocks the blocks of every part; no part says whether the whole model has a
    final norm)."""
    records: list = []
    best, best_count, blocks = None, -1, []
    for part in parts:
        part_facts = _part_facts(ctx, part)
        blocks += part_facts.model.blocks
        if len(part_facts.records) > best_count:
            best, best_count = part_facts.model, len(part_facts.records)
        records += part_facts.records
    if ctx.cap.gm is not None:  # towers the forward never called
        facts.records += records
        return
    inside = [p.path for p in parts]
    facts.records = records + [r for r in facts.records if not any(_under(r.site.module, p) for p in inside)]
    if best is not None:
        model = facts.model
        model.placement, model.blocks = best.placement, blocks
        model.has_final_norm, model.parallel_residual = None, best.parallel_residual
