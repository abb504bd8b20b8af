"""The pass signature over the three graph fact packages whose own entry points predate it: site discovery
(:mod:`normaudit.facts.sites`), axis labels (:mod:`normaudit.facts.axes`) and placement on the residual stream
(:mod:`normaudit.facts.placement`), with placement's carry-over of its model-level facts to elided blocks."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from normaudit.facts import axes as axes_pass
from normaudit.facts import placement as placement_pass
from normaudit.facts.context import FactContext, Facts
from normaudit.facts.sites import discover_sites
from normaudit.pipeline.carry import NotCarried, dump, renamer, under
from normaudit.vocabulary.graph import owner


def sites(ctx: FactContext, facts: Facts) -> None:
    """Every norm computation of the graph, one record each (:func:`normaudit.facts.sites.discover_sites`)."""
    facts.records = discover_sites(ctx.cap, ctx.origins)


def axes(ctx: FactContext, facts: Facts) -> None:
    """Axis labels of every graph node (``facts.node_axes``, :func:`normaudit.facts.axes.label_graph`) and, per
    site, the labels of its input (``input_axes``) and of the dims its statistics reduce (``normalized_axes``:
    ``unknown`` when its input has no labels)."""
    env = axes_pass.label_graph(ctx.cap, ctx.input_axes)
    for rec in facts.records:
        labels = env.get(rec.input) if rec.input is not None else None
        if isinstance(labels, list):
            rec.site.input_axes = axes_pass.axes_text(labels)
            dims = rec.site.reduced_dims or []
            picked = [labels[d] for d in dims if d < len(labels)]
            rec.site.normalized_axes = axes_pass.flat_labels(picked)  # type: ignore[assignment]
        elif rec.site.reduced_dims:
            rec.site.normalized_axes = ["unknown"]
    facts.node_axes = env


def placement(ctx: FactContext, facts: Facts) -> None:
    """Placement of every site on the residual stream and the model's scheme
    (:func:`normaudit.facts.placement.analyse`)."""
    placement_pass.analyse(ctx.cap, facts.records, facts.model)


def _residual_adds_in(cap: Any, prefix: str) -> int:
    """The residual adds (marked by the placement pass in ``node.meta``) computed inside module ``prefix``."""
    return sum(1 for n in cap.gm.graph.nodes if "residual" in (n.meta.get("normaudit") or {})
               and under(owner(n, cap.modules), prefix))


def _carry_blocks(carry: Any, facts: Facts) -> None:
    """Per stack: the representative block's :class:`normaudit.report.Block` (when it is one) cloned for each
    elided block, and its residual adds counted for each; raises NotCarried when the two middle blocks differ
    in either."""
    model = facts.model
    for s in carry.plan.stacks:
        rep, chk = s.child(s.rep), s.child(s.check)
        blocks = {b.path: i for i, b in enumerate(model.blocks)}
        to_rep = renamer(chk, rep)
        if (rep in blocks) != (chk in blocks) or (
                rep in blocks and to_rep(dump(model.blocks[blocks[chk]])) != dump(model.blocks[blocks[rep]])):
            raise NotCarried(f"the blocks of {s.path} differ")
        adds = _residual_adds_in(carry.cap, rep)
        if adds != _residual_adds_in(carry.cap, chk):
            raise NotCarried(f"the residual adds of {s.path} differ")
        if rep in blocks:
            clones = [renamer(rep, s.child(name))(model.blocks[blocks[rep]]) for name in s.elided]
            model.blocks[blocks[rep] + 1:blocks[rep] + 1] = clones
        model.num_residual_adds += adds * len(s.elided)


def carry_placement(carry: Any, facts: Facts) -> None:
    """Placement's model-level facts over the whole stack, after the sites were carried
    (:class:`normaudit.pipeline.carry.Carry`): the blocks and residual adds of each stack
    (:func:`_carry_blocks`), the stack size of each site's block, and the norms whose role differs from their
    peers' in most blocks, re-marked over every block (without graph nodes for the carried blocks, so no norm is
    left out for its size). Raises NotCarried when the model's mixed placement would change."""
    _carry_blocks(carry, facts)
    for rec in facts.records:
        if rec.site.stream.stack_blocks is not None:
            rec.site.stream.stack_blocks = placement_pass.stack_size(facts.model.blocks, rec.site.block)
    placement_pass.mark_mixed(facts.model.blocks, [SimpleNamespace(rec=r) for r in facts.records])
    if carry.had("majority_placement") != any(r.site.stream.majority_placement is not None for r in facts.records):
        raise NotCarried("the model's mixed placement would change")
