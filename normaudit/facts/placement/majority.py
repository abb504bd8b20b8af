"""Majority placement of mixed blocks: ``majority_placement`` and ``majority_blocks`` in ``Site.stream`` of a
norm whose role differs from the same norm's in a strict majority of the blocks of its class in its stack.
``post``, ``final`` and ``embedding`` are one role, the stream norm, which the first and last blocks of a
stack see differently. A norm whose role says nothing about its block's scheme is left out: one feeding a
projection shortcut and the branch, one reading a tensor of parameters only, one reading another size than
its block's residual adds, and one with no residual around it (a block built with a flag that drops the
residual of its first sublayer by design, ``downsample=True`` in a transformer stage that changes width there:
its norm reads the stream and its output never returns to it, where its peers' norms open a residual
branch)."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Optional

from normaudit.facts.placement.blocks import numel, stack_pattern
from normaudit.facts.placement.records import SiteInfo, site_key
from normaudit.report import Block


#: roles of a norm on the stream that differ only by where the block sits in the stack: the closing norm of
#: the last block before the head is ``final`` where the others are ``post``; one whose stream goes on
#: through a projection (the first block of a stage, a block before a downsampler) is ``embedding``
STREAM_ROLES = {"final": "post", "embedding": "post"}


def mark_mixed(blocks: list[Block], infos: list[Any], add_sizes: Optional[dict[str, set[int]]] = None,
               add_nodes: Optional[dict] = None) -> None:
    """Flag norms whose role differs from the same norm in most blocks of the same class in the same stack
    (``stack_pattern``: an audio encoder's layers and a projector's layers of one class are two stacks).
    A norm feeding a projection shortcut and the branch (``SiteInfo.feeds_shortcut``) is no evidence
    either way: the blocks with an identity shortcut decide, and it is never flagged; nor is a norm reading a
    tensor computed from parameters only (``SiteInfo.reads_constant``); nor is a norm whose
    input has another size than every residual add of its block (the first layer of FunASR's SenseVoice
    encoder normalises 560-wide stacked features and, its width changing, has no residual around it).
    ``add_sizes`` (block path -> element counts of its residual adds) None: sizes unknown, no norm is left out
    for its size (capture/repeats.py re-marks carried blocks without graph nodes, and falls back to the full
    capture when the model's mixed flags would change). ``add_nodes``: the residual adds' nodes and their blocks, to
    leave out a norm with no residual around it (:func:`_no_residual`); None: none is left out for it."""
    add_sizes = add_sizes or {}
    by_key = {(site_key(i)): i for i in infos}
    groups: dict[tuple, list[Block]] = defaultdict(list)
    for b in blocks:
        rel = tuple(k[len(b.path) + 1:] if k.startswith(b.path + ".") else k for k in b.norms)
        groups[(stack_pattern(b.path), b.class_name, rel)].append(b)
    for (_, _, rel), all_members in groups.items():
        for pos, name in enumerate(rel):
            members = [b for b in all_members if not _no_evidence(by_key.get(list(b.norms)[pos]),
                                                                   add_sizes.get(b.path, set()), add_nodes)]
            if len(members) < 2:
                continue
            roles = [list(b.norms.values())[pos] for b in members]
            counts = Counter(STREAM_ROLES.get(r, r) for r in roles)
            if len(counts) < 2:
                continue
            top = max(counts.values())
            if list(counts.values()).count(top) > 1:
                continue  # a tie has no majority: which blocks differ is not known
            majority = next(r for r in roles if counts[STREAM_ROLES.get(r, r)] == top)
            for b, role in zip(members, roles):
                if STREAM_ROLES.get(role, role) != STREAM_ROLES.get(majority, majority):
                    info = by_key.get(list(b.norms)[pos])
                    if info is not None:
                        info.rec.site.stream.majority_placement = majority
                        info.rec.site.stream.majority_blocks = [
                            m.path for m, r in zip(members, roles)
                            if STREAM_ROLES.get(r, r) == STREAM_ROLES.get(majority, majority)]


def _no_evidence(info: Optional[SiteInfo], sizes: set[int], add_nodes: Optional[dict] = None) -> bool:
    """Whether a norm's role says nothing about its block's residual-norm scheme (:func:`mark_mixed`): it
    feeds a projection shortcut and the branch, reads a tensor that depends on no model input (the learned
    latents of a resampler's first layer), reads another size than its block's residual adds, or has no
    residual around it (:func:`_no_residual`)."""
    return (getattr(info, "feeds_shortcut", False) or getattr(info, "reads_constant", False)
            or _off_stream(info, sizes) or _no_residual(info, add_nodes))


def _no_residual(info: Optional[SiteInfo], add_nodes: Optional[dict]) -> bool:
    """The norm sits on the stream (``embedding`` or ``none``) with no residual add of its block around it: it
    lies in no residual branch and does not read a residual add of its own block (the previous block's output
    is the stream it starts from), so the sublayer it feeds has no residual (the block dropped it on purpose,
    as a downsampling stage does where the width changes); whether its peers' norms are pre-LN or post-LN
    says nothing about it. False without ``add_nodes`` (residual add node -> its block) or a known input."""
    if add_nodes is None or info is None or getattr(info, "inp", None) is None:
        return False
    own = info.inp in add_nodes and add_nodes[info.inp] == info.block
    return info.placement in ("embedding", "none") and not info.adds and not own


def _off_stream(info: Optional[SiteInfo], sizes: set[int]) -> bool:
    """The norm's input holds another number of elements than every residual add of its block: it cannot
    read that block's residual stream (a width-changing first layer), so its role says nothing about the
    block's residual-norm scheme. False when either size is unknown."""
    inp = getattr(info, "inp", None)
    size = numel(inp) if inp is not None else None
    return bool(sizes) and size is not None and size not in sizes
