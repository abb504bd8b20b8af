"""Depth-independent capture, the facts' side: carry the facts of a reduced capture (each stack of identical
blocks captured as its blocks ``0, 1, 2, N-1``, :mod:`normaudit.capture.repeats`) to the elided blocks
``3 .. N-2``, exactly or not at all.

:func:`carry_over` first checks translation invariance: the sites of block 1, renamed to block 2, equal those
of block 2 (every fact, placement included; both are middle blocks), no site of another block names a block of
the stack other than its first or last (a norm of block N-1 reading one of block 2), no unused norm or note
names one, and each pass's own check (:attr:`normaudit.pipeline.passes.Pass.carry`: placement compares the
blocks and their residual adds). It then clones the sites of block 2 for each elided block, renamed, inserted
in graph order, and lets each such pass carry its model-level facts. Anything it cannot carry makes it return
False: the caller then captures the full model (never a guess). The result is the report of the full capture
(tests/test_depth_independent.py compares the JSON of both on every test model) at the cost of four blocks
per stack.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Optional

from normaudit.capture.repeats import RepeatPlan, Stack, full_graph_nodes, full_view
from normaudit.facts.carry import NotCarried, dump, renamer, under
from normaudit.facts.context import FactContext, Facts
from normaudit.facts.sites import SiteRecord
from normaudit.probes import size as size_probe


def _references(text: str, stack: Stack) -> set[str]:
    """The stack's block paths named in ``text`` (a JSON dump)."""
    names = "|".join(re.escape(n) for n in stack.kept)
    prefix = re.escape(stack.child(""))
    return {m.group(0) for m in re.finditer(rf"(?<![\w.]){prefix}(?:{names})(?![\w])", text)}


def _block_path(module: str, stack: Stack) -> Optional[str]:
    return next((stack.child(n) for n in stack.kept if under(module, stack.child(n))), None)


@dataclass
class Carry:
    """What a pass's carry hook reads: the ``plan``, the reduced capture ``cap``, and which of the dropped
    site facts (:attr:`normaudit.pipeline.passes.Pass.recomputed`) some kept site held."""

    plan: RepeatPlan
    cap: Any
    dropped: dict[str, bool]

    def had(self, key: str) -> bool:
        """Whether some site of the reduced capture held the dropped fact ``key``."""
        return self.dropped.get(key, False)


def reduced_context(ctx: FactContext, plan: RepeatPlan) -> Optional[FactContext]:
    """``ctx`` with ``graph_nodes`` the full model's node count, when the reduced capture ``ctx.cap`` may stand
    for the whole model: a graph with no parts, no probe asked for, and a full graph above the size probe's
    default limit (the size probe runs by default on smaller graphs, which the full capture then keeps:
    :func:`normaudit.capture.repeats.full_graph_nodes`); else None."""
    cap = ctx.cap
    if cap.gm is None or cap.parts or ctx.probes:
        return None
    n_nodes = full_graph_nodes(plan, cap)
    if n_nodes is None or n_nodes <= size_probe.SIZE_PROBE_MAX_NODES:
        return None
    return dataclasses.replace(ctx, graph_nodes=n_nodes)


def full_context(ctx: FactContext, plan: RepeatPlan) -> FactContext:
    """``ctx`` seeing every module of the full model (:func:`normaudit.capture.repeats.full_view`)."""
    return dataclasses.replace(ctx, cap=dataclasses.replace(ctx.cap, modules=full_view(plan, ctx.cap)))


def _drop_recomputed(facts: Facts, fields: tuple[str, ...]) -> dict[str, bool]:
    """Reset the site facts ``fields`` (dotted paths below a site: ``stream.majority_placement``) to their
    defaults on every site; which of them some site held (a value other than the default), by last name."""
    held = {f.rpartition(".")[2]: False for f in fields}
    for rec in facts.records:
        for dotted in fields:
            *path, name = dotted.split(".")
            owner = rec.site
            for step in path:
                owner = getattr(owner, step)
            default = type(owner).model_fields[name].get_default(call_default_factory=True)
            held[name] |= getattr(owner, name) != default
            setattr(owner, name, default)
    return held


def _check_stack(s: Stack, facts: Facts, texts: list[str], unused: list[str]) -> tuple[list[int], list[int]]:
    """Translation invariance of stack ``s`` (module docstring); the record indices of its representative and
    check blocks. Raises NotCarried."""
    rep, chk = s.child(s.rep), s.child(s.check)
    for rec, text in zip(facts.records, texts):  # a site names only its own block of the stack
        own = _block_path(rec.site.module, s)
        if _references(text, s) - {own}:
            if own is None and _references(text, s) <= {s.child(s.kept[0]), s.child(s.kept[-1])}:
                continue  # outside the stack naming its first or last block: the same in the full model
            raise NotCarried(f"a site names a block of {s.path}")
    if any(_references(u, s) for u in unused):
        raise NotCarried(f"a note or unused norm names a block of {s.path}")
    in_rep = [i for i, r in enumerate(facts.records) if under(r.site.module, rep)]
    in_chk = [i for i, r in enumerate(facts.records) if under(r.site.module, chk)]
    to_rep = renamer(chk, rep)
    if len(in_rep) != len(in_chk) or any(to_rep(texts[a]) != texts[b] for a, b in zip(in_chk, in_rep)):
        raise NotCarried(f"the two middle blocks of {s.path} differ")
    return in_rep, in_chk


def _clone_sites(s: Stack, facts: Facts, texts: list[str], in_rep: list[int], full_modules: dict) -> None:
    """Insert, after the representative block's last site, its sites renamed for each elided block."""
    rep = s.child(s.rep)
    clones = []
    for name in s.elided:
        rename = renamer(rep, s.child(name))
        for i in in_rep:
            site = rename(facts.records[i].site)
            clones.append(SiteRecord(site=site, module_obj=full_modules.get(site.module),
                                     hints=dict(facts.records[i].hints)))
    if in_rep:
        at = in_rep[-1] + 1
        facts.records[at:at] = clones
        texts[at:at] = [""] * len(clones)


def carry_over(plan: RepeatPlan, cap: Any, facts: Facts, hooks: list, recomputed: tuple[str, ...]) -> bool:
    """Carry ``facts`` (of the reduced capture ``cap``, changed in place) to the full model (module docstring):
    ``hooks`` the passes' carry hooks, ``recomputed`` the site facts they compute anew. False when the facts
    cannot be carried exactly."""
    try:
        carry = Carry(plan=plan, cap=cap, dropped=_drop_recomputed(facts, recomputed))
        texts = [dump(r.site) for r in facts.records]
        unused = [dump(u) for u in facts.model.unused_norms] + list(facts.notes)
        full_modules = full_view(plan, cap)
        for s in plan.stacks:
            in_rep, _ = _check_stack(s, facts, texts, unused)
            _clone_sites(s, facts, texts, in_rep, full_modules)
        for hook in hooks:
            hook(carry, facts)
    except NotCarried:
        return False
    # as the full capture counts them: the captured (materialised) model's parameters plus the elided blocks'
    facts.model.num_parameters = sum(p.numel() for p in cap.root.parameters()) + sum(
        p.numel() for s in plan.stacks for name in s.elided
        for p in plan.full.get_submodule(s.child(name)).parameters())
    return True
