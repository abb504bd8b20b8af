"""The placement pass (:func:`analyse`): residual adds and blocks, then the role of each norm in two passes
(q/k norms and norms inside a branch first, then norms on the stream), skip-from-norm, norm-feeds-norm, and
the model facts. An L2Norm computed inline (a unit vector) takes part as a q/k norm only: elsewhere it is
``unknown`` and left out of the stream roles and the model facts; one that is a norm module of its own is placed
as any norm."""
from __future__ import annotations

from torch import fx

from normaudit.capture import Capture
from normaudit.facts.context import FactContext, Facts
from normaudit.facts.placement.blocks import assign_blocks, block_of
from normaudit.facts.placement.graph import StreamGraph
from normaudit.facts.placement.model import model_facts
from normaudit.facts.placement.records import ResidualAdd, SiteInfo, norms_by_branch
from normaudit.facts.placement.residual import find_residual_adds
from normaudit.facts.placement.reuse import mark_reapplied
from normaudit.facts.placement.roles import branch_placement, cuts_identity, double_norms, stream_placement
from normaudit.facts.placement.scores import contracted_by_scores, reaches_scores
from normaudit.facts.sites import SiteRecord
from normaudit.report import ModelFacts
from normaudit.vocabulary.kinds import L2_KIND


def analyse(cap: Capture, records: list[SiteRecord], model: ModelFacts) -> None:
    """Set ``site.placement``, ``site.block`` and the placement facts in ``site.stream`` for every record, and
    ``model.placement``/``parallel_residual``/``has_final_norm``/``num_residual_adds``/``blocks``.

    See :mod:`normaudit.facts.placement` for the definitions (Vaswani et al. 2017; Xiong et al. 2020, arXiv
    2002.04745; Liu et al. 2020, arXiv 2004.08249). Reads the graph; writes only ``node.meta["normaudit"]``.
    """
    if cap.gm is None:
        return
    g = StreamGraph(cap, records)
    adds = find_residual_adds(g)
    residual = {a.node: a for a in adds}
    for a in adds:
        a.node.meta.setdefault("normaudit", {})["residual"] = {
            "skip": a.skip.name, "branch": a.branch.name, "reads": a.reads.name, "parallel": a.parallel,
            "shortcut": a.shortcut.name if a.shortcut is not None else None}
    candidates = assign_blocks(g, adds)
    add_mask = 0
    for a in adds:
        add_mask |= 1 << g.idx[a.node]
    infos = _site_infos(g, records, candidates)
    _place_in_branches(g, infos, adds, residual)
    # an L2 normalisation computed inline (a unit vector for a cosine similarity: a contrastive head, nGPT's
    # hidden state kept on the sphere by F.normalize) has no pre/post role on the stream; a q/k one is a qk
    # norm as any other, and a norm module of its own (transformers Dory's DoryL2Norm) a norm of the stream
    placed = [i for i in infos if not _inline_l2(i) or i.placement == "qk"]
    _place_on_stream(g, placed, residual, add_mask)
    for info in infos:
        info.rec.site.placement = info.placement  # type: ignore[assignment]
    double_norms(g, placed)
    mark_reapplied(g, placed)
    model_facts(g, adds, residual, placed, model)


def _site_infos(g: StreamGraph, records: list[SiteRecord], candidates: set[str]) -> list[SiteInfo]:
    """One :class:`SiteInfo` per record: its input seen through aliases, the end of its output chain, its block
    among ``candidates`` (also written to ``site.block``)."""
    infos: list[SiteInfo] = []
    for rec in records:
        inp = g.strip(rec.input) if isinstance(rec.input, fx.Node) else None
        out = g.site_out.get(id(rec))
        info = SiteInfo(rec=rec, inp=inp, out=out, block=block_of(rec.site.module, candidates),
                         reads_constant=inp is not None and inp in g.const)
        rec.site.block = info.block
        infos.append(info)
    return infos


def _place_in_branches(g: StreamGraph, infos: list[SiteInfo], adds: list[ResidualAdd],
                       residual: dict[fx.Node, ResidualAdd]) -> None:
    """Pass 1: ``none`` for every norm of a model without residual adds, ``qk`` norms (with
    ``contracted_by_scores``), and norms inside a residual branch (:func:`branch_placement`); an inline
    L2Norm that is no qk norm stays ``unknown``."""
    for info in infos:
        if info.inp is None or info.out is None:
            continue
        if not adds:
            info.placement = "none"
            continue
        if reaches_scores(g, info.out, residual):
            info.placement = "qk"
            if contracted_by_scores(g, info):
                info.rec.site.stream.contracted_by_scores = True
            continue
        if not _inline_l2(info):
            branch_placement(g, info, adds)


def _inline_l2(info: SiteInfo) -> bool:
    """An L2Norm computed inside a larger module's forward, not by a norm module of its own."""
    return info.rec.site.kind == L2_KIND and info.rec.site.inline


def _place_on_stream(g: StreamGraph, infos: list[SiteInfo], residual: dict[fx.Node, ResidualAdd],
                     add_mask: int) -> None:
    """Pass 2: norms on the stream (:func:`stream_placement`), then ``skip_from_norm`` and
    ``no_identity_lost`` on those whose output is the skip of their own block's residual add."""
    branch_norms = norms_by_branch(infos)
    skip_from_norm: list[tuple[SiteInfo, ResidualAdd]] = []
    for info in infos:
        if info.placement != "unknown" or info.inp is None or info.out is None:
            continue
        skipped = stream_placement(g, info, residual, add_mask, branch_norms)
        if skipped is not None:
            skip_from_norm.append((info, skipped))

    # a norm output as the skip is the fault only when the add it feeds is not itself closed by a post norm:
    # in a post-LN stack (x = ln(x + f(x))) the stream is the output of a norm everywhere, the embedding norm
    # included, whether or not the layers are submodules
    post_inputs = {i.inp for i in infos if i.placement == "post" and i.inp is not None}
    for info, add in skip_from_norm:
        if add.node not in post_inputs:
            info.rec.site.stream.skip_from_norm = True
            if not cuts_identity(g, info, add, infos, residual):
                info.rec.site.stream.no_identity_lost = True


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``placement``: :func:`analyse` over the graph's sites and the model facts."""
    analyse(ctx.cap, facts.records, facts.model)
