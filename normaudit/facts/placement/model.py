"""The model facts of the placement pass. ``placement`` from the roles of the block norms: ``pre``;
``post``; ``sandwich`` when branch-output norms appear without post norms and some norm reads a branch's
input (Ding et al. 2021, arXiv 2105.13290), ``post`` when branch-output norms close branches whose input no
norm reads (res-post-norm, Liu et al. 2022, arXiv 2111.09883, and ``x + BN(conv(...))`` of a
post-activation ResNet, He et al. 2016); ``mixed`` for pre with post, or when blocks of one class disagree
(:mod:`.majority`); ``none`` without residual adds; ``unknown``. Also ``parallel_residual``,
``has_final_norm`` (every stack's last residual add reaches a norm, and one of them is ``final``:
:mod:`.stream_end`), ``num_residual_adds``, ``residual_scales`` (:mod:`.scaling`) and ``blocks``, each with its
norms' roles (:mod:`.blocks`)."""
from __future__ import annotations

from collections import defaultdict

from torch import fx

from normaudit.facts.placement.blocks import numel
from normaudit.facts.placement.graph import StreamGraph
from normaudit.facts.placement.majority import mark_mixed
from normaudit.facts.placement.records import ResidualAdd, SiteInfo, site_key
from normaudit.facts.placement.scaling import residual_scales
from normaudit.facts.placement.stream_end import stream_ends_normed
from normaudit.report import Block, ModelFacts


BLOCK_ROLES = ("pre", "post", "sandwich")


def model_facts(g: StreamGraph, adds: list[ResidualAdd], residual: dict[fx.Node, ResidualAdd],
                 infos: list[SiteInfo], model: ModelFacts) -> None:
    """``model.num_residual_adds``, ``parallel_residual``, ``blocks``, ``placement`` and ``has_final_norm``
    (module docstring), with the majority facts (:func:`mark_mixed`) and stream-end facts
    (:func:`stream_ends_normed`) of the norms."""
    model.num_residual_adds = len(adds)
    model.parallel_residual = any(a.parallel for a in adds)
    model.residual_scales = residual_scales(g, adds)
    model.blocks = _blocks(g, adds, infos)
    mark_mixed(model.blocks, infos, _add_sizes(adds), {a.node: a.block for a in adds})
    roles = _block_roles(model.blocks, infos)
    if not adds:
        model.placement = "none"
        model.has_final_norm = None
        return
    model.placement = _scheme(roles, infos)
    ends_normed = stream_ends_normed(g, adds, residual, infos, model.blocks)
    model.has_final_norm = ends_normed and any(i.placement == "final" for i in infos)


def _blocks(g: StreamGraph, adds: list[ResidualAdd], infos: list[SiteInfo]) -> list[Block]:
    """The blocks, in graph order of their first norm or add, each with the role of its norms in graph order."""
    order: dict[str, int] = {}
    for info in infos:
        if info.block is not None and info.out is not None:
            order.setdefault(info.block, g.idx[info.out])
    for a in adds:
        if a.block is not None:
            order[a.block] = min(order.get(a.block, g.idx[a.node]), g.idx[a.node])
    blocks: dict[str, Block] = {}
    for path in sorted(order, key=lambda p: order[p]):
        mod = g.modules.get(path)
        blocks[path] = Block(path=path, class_name=type(mod).__name__ if mod is not None else "?")
    for info in sorted((i for i in infos if i.out is not None), key=lambda i: g.idx[i.out]):
        if info.block in blocks:
            blocks[info.block].norms[site_key(info)] = info.placement  # type: ignore[assignment]
    return list(blocks.values())


def _add_sizes(adds: list[ResidualAdd]) -> dict[str, set[int]]:
    """Block path -> the element counts of its residual adds (those whose size is known)."""
    add_sizes: dict[str, set[int]] = defaultdict(set)
    for a in adds:
        size = numel(a.node)
        if a.block is not None and size is not None:
            add_sizes[a.block].add(size)
    return add_sizes


def _block_roles(blocks: list[Block], infos: list[SiteInfo]) -> set[str]:
    """The roles of :data:`BLOCK_ROLES` the block norms take (every norm's, without blocks). With both ``pre``
    and ``post``, only the norms whose role speaks for the scheme count, when any does."""
    roles: set[str] = set()
    for b in blocks:
        roles |= {p for p in b.norms.values() if p in BLOCK_ROLES}
    if not blocks:
        roles = {i.placement for i in infos if i.placement in BLOCK_ROLES}
    if "pre" in roles and "post" in roles:
        # pre norms that say nothing about the scheme: one feeding a projection shortcut is ``pre`` whichever
        # scheme its class follows (mark_mixed), one deep inside a branch (conv -> BN) leaves the stream be
        paths = {b.path for b in blocks}
        settled = {i.placement for i in infos if i.placement in BLOCK_ROLES and not i.feeds_shortcut
                   and i.rec.site.stream.branch_position != "inner" and (i.block in paths or not blocks)}
        roles = settled or roles
    return roles


def _scheme(roles: set[str], infos: list[SiteInfo]) -> str:
    """``model.placement`` of a model with residual adds, from its block roles (module docstring)."""
    mixed_blocks = any(i.rec.site.stream.majority_placement is not None for i in infos)
    if not roles:
        return "none" if all(i.placement == "none" for i in infos) else "unknown"
    if mixed_blocks or ("pre" in roles and "post" in roles) or ("post" in roles and "sandwich" in roles):
        return "mixed"
    if "sandwich" in roles:
        # a sandwich normalises the branch's input and its output (CogView, Gemma 2); norms that close the
        # branch while its input stays raw are res-post-norm (Swin V2), and a CNN's conv -> BN -> ReLU ->
        # conv -> BN branch (ResNet v1, x + BN(conv(...))) is that too: ``post``
        return "sandwich" if _branch_input_normed(infos) else "post"
    return "pre" if roles == {"pre"} else "post"


def _branch_input_normed(infos: list[SiteInfo]) -> bool:
    """Some norm normalises the stream value a residual branch reads (``pre`` at ``branch_position``
    ``input``), as the first norm of a sandwich does; one that also feeds a projection shortcut (a ResNet
    stem's conv -> BN before the first block's 1x1 projection) is no evidence (``SiteInfo.feeds_shortcut``)."""
    return any(i.placement == "pre" and i.rec.site.stream.branch_position == "input" and not i.feeds_shortcut
               for i in infos)
