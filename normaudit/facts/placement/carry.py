"""Placement's model-level facts carried from the kept blocks of a reduced capture to the whole stack
(depth-independent capture, :mod:`normaudit.pipeline.carry`): the blocks and residual adds of each stack, the
stack size of each site's block, and the majority placement of mixed blocks re-marked over every block."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from normaudit.facts.carry import NotCarried, dump, renamer, under
from normaudit.facts.placement.blocks import stack_size
from normaudit.facts.placement.majority import mark_mixed
from normaudit.vocabulary.graph import owner


def _residual_adds_in(cap: Any, prefix: str) -> int:
    """The residual adds (marked by the placement pass in ``node.meta``) computed inside module ``prefix``."""
    return sum(1 for n in cap.gm.graph.nodes if "residual" in (n.meta.get("normaudit") or {})
               and under(owner(n, cap.modules), prefix))


def _carry_blocks(carry: Any, facts: Any) -> None:
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


def carry(carry: Any, facts: Any) -> None:
    """Placement's model-level facts over the whole stack, after the sites were carried
    (:class:`normaudit.pipeline.carry.Carry`): the blocks and residual adds of each stack
    (:func:`_carry_blocks`), the stack size of each site's block, and the norms whose role differs from their
    peers' in most blocks, re-marked over every block (without graph nodes for the carried blocks, so no norm is
    left out for its size). Raises NotCarried when the model's mixed placement would change."""
    _carry_blocks(carry, facts)
    for rec in facts.records:
        if rec.site.stream.stack_blocks is not None:
            rec.site.stream.stack_blocks = stack_size(facts.model.blocks, rec.site.block)
    mark_mixed(facts.model.blocks, [SimpleNamespace(rec=r) for r in facts.records])
    if carry.had("majority_placement") != any(r.site.stream.majority_placement is not None for r in facts.records):
        raise NotCarried("the model's mixed placement would change")
