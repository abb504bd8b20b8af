"""The role of each norm on the residual stream (``Site.placement``) outside attention:

- inside a residual branch (pass 1, :func:`branch_placement`): ``sandwich`` when its output *is* the branch
  (up to casts, dropout, views, drop-path, layer-scale), ``pre`` otherwise, with ``branch_position``
  ``input`` when it reads the stream value the branch reads and ``inner`` when deeper (a conv -> BN inside
  the branch); a norm feeding a projection shortcut as well as the branch is ``pre`` (``feeds_shortcut``);
- on the stream (pass 2, :func:`stream_placement`), its output the skip of the next residual add: ``post``
  inside a repeated block or after a residual add, ``embedding`` before the first residual add outside any
  block, or when it starts a stream (it ends a non-residual block, a projection re-embeds the stream it
  starts, or it normalises the embeddings inside the first block); ``embedding`` when its output reaches
  later residual adds only through a projection (a patch embedding or patch merging); after the last
  residual add, ``post`` when it reads that add directly and no norm sits in that add's branch
  (``LayerNorm(x + f(x))``), ``final`` otherwise; ``none`` when no residual add is around it.

Per-site facts in ``Site.stream``: ``skip_from_norm`` (the norm reads the residual stream -- a residual add, a
model input, an embedding lookup -- and its output is the skip of a residual add of its own block although
the norm does not close a sublayer of that block: ``x = norm(x); x = x + f(x)``, unless that add is itself
closed by a ``post`` norm, ``x = ln(x + f(x))``, as in any post-LN stack; a norm that starts a stream is none);
``no_identity_lost`` (with ``skip_from_norm``: the stream it overwrites has no identity path to lose, being
already a norm's output or read by no ``pre`` norm of a branch input: :func:`cuts_identity`); ``feeds_norm`` /
``reads_norm`` (the module of a norm that is the only consumer of / the only input to this one, with nothing
but casts and views between: :func:`double_norms`)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.placement.graph import GUARD_OPS, VIEW_OPS, StreamGraph
from normaudit.facts.placement.records import ResidualAdd, SiteInfo
from normaudit.facts.placement.residual import stream_reach
from normaudit.vocabulary.graph import op_name, owner


def branch_placement(g: StreamGraph, info: "SiteInfo", adds: list[ResidualAdd]) -> None:
    """Pass 1 for one norm: the residual adds whose branch (or projection shortcut) it lies in, and its role
    there (``sandwich`` when its output is the branch, else ``pre`` with ``branch_position``); the innermost
    (first) add decides."""
    for a in adds:
        sides = [a.branch] + ([a.skip] if a.shortcut is not None else [])
        side = next((s for s in sides if g.anc_or_eq(info.out, s)), None)
        if side is not None and a.shortcut is not None and g.anc_or_eq(info.out, a.reads) \
                and not g.weighted_between(info.out, a.reads):
            # pre-activation block with a projection shortcut (ResNetV2, PreAct ResNet): the norm of the
            # block input feeds both the branch and the shortcut projection, x_pre = norm(x);
            # y = conv_s(x_pre) + F(x_pre): a pre norm, as in the blocks with an identity shortcut
            info.adds.append(a)
            if info.add is None:
                info.add, info.placement, info.feeds_shortcut = a, "pre", True
                info.rec.site.stream.branch_position = "input"
            continue
        if side is None or g.anc_or_eq(info.out, a.reads):
            continue  # not in a branch, or the norm's output is (upstream of) the stream the branch reads
        if not g.anc_or_eq(a.reads, info.inp):
            continue
        info.adds.append(a)
        if info.add is not None:
            continue  # the innermost (first) add decides; later ones are outer or parallel adds
        info.add = a
        ends = {n for t in ([side] if side is not a.branch else a.terms + [a.branch]) for n in _unwrap_branch(g, t)}
        if ends & _own_nodes(g, info):
            info.placement = "sandwich"
            info.rec.site.stream.branch_position = "output"
        else:
            info.placement = "pre"
            info.rec.site.stream.branch_position = "input" if info.inp is a.reads else "inner"


# -- placement of sites ------------------------------------------------------------------------------------
def _unwrap_branch(g: StreamGraph, node: fx.Node) -> list[fx.Node]:
    """The nodes a branch operand passes back through: casts, dropout, views, drop-path and layer-scale
    multiplies (the last one is what the branch really computes)."""
    seen: list[fx.Node] = []
    for _ in range(16):
        while isinstance(node, fx.Node):  # one alias at a time, recording each
            seen.append(node)
            if g.strip(node) is node:
                break
            node = node.args[0]
        if not isinstance(node, fx.Node):
            return seen
        if op_name(node) in ("mul", "div") and node.args:
            acts = [a for a in g.inputs[node] if a not in g.pderived and a not in g.const]
            # a scalar, a parameter (layer scale) or a random keep-mask (drop path) on the other side
            if len(acts) == 1:
                node = acts[0]
                continue
            rand = [a for a in acts if _is_random(g, a)]
            if len(acts) == 2 and op_name(node) == "mul" and len(rand) == 1:
                node = acts[0] if acts[1] is rand[0] else acts[1]
                continue
        return seen
    return seen


def _is_random(g: StreamGraph, node: fx.Node) -> bool:
    """A drop-path keep mask: computed from random ops and shapes only, not from the stream."""
    todo, seen = [node], 0
    while todo and seen < 16:
        n = todo.pop()
        seen += 1
        name = op_name(n)
        if name in ("rand", "bernoulli", "rand_like", "empty", "new_empty", "bernoulli_", "uniform_"):
            return True
        if name in ("floor", "floor_", "add", "div", "to", "alias") or name in VIEW_OPS:
            todo.extend(g.inputs[n])
    return False


def stream_placement(g: StreamGraph, info: "SiteInfo", residual: dict[fx.Node, ResidualAdd], add_mask: int,
                      branch_norms: dict[fx.Node, list["SiteInfo"]]) -> Optional[ResidualAdd]:
    """Pass 2 for one norm outside any residual branch: ``post``/``embedding``/``final``/``none`` (module
    docstring, step 2). Returns the residual add of its own block whose skip the norm's output is when that
    may be a skip-from-norm fault, else None."""
    after_add = info.inp in residual or bool(g.anc[g.idx[info.inp]] & add_mask)
    ahead = stream_reach(g, info.out, residual)
    mine = _own_nodes(g, info)
    direct = [a for a in ahead if g.strip(a.skip) in mine]
    if direct:
        # its output is the skip of the next residual add: a norm on the stream
        # a norm that ends a non-residual block (conv -> BN of a downsampler, a patch embedding) or whose
        # stream a projection re-embeds (a downsampler's local residual) starts a stream: ``embedding``
        reads = _reads_stream(g, info.inp, residual)
        local = reads and _reembedded(g, direct[0], ahead, add_mask)
        # an embedding norm inside the first block: it reads the embeddings before any residual add and the
        # branch has its own pre norm on its output (RWKV's blocks.0.pre_ln, ln0 of the reference:
        # x = pre_ln(x); x = x + attn(ln1(x)))
        in_block = not after_add and any(o.placement == "pre" and o.inp in mine
                                         for o in branch_norms.get(direct[0].node, []))
        starts = not reads or local or in_block or (info.block is None and not after_add)
        info.placement = "embedding" if starts else "post"
        closes = info.inp in residual and residual[info.inp].block == info.block
        if direct[0].block == info.block and not closes and reads and not local and not in_block:
            return direct[0]
    elif ahead:
        info.placement = "embedding"  # feeds a projection that (re-)embeds the stream (patch merging)
    elif not after_add:
        info.placement = "none"
    elif info.inp in residual and not branch_norms.get(info.inp):
        info.placement = "post"  # LayerNorm(x + f(x)) closing the last sublayer
    else:
        info.placement = "final"
    return None


def _reads_stream(g: StreamGraph, node: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> bool:
    """``node`` (a norm's input, seen through aliases) is the residual stream: a residual add's output, a
    model input, a token embedding lookup, or a sum/scaling of those (token + position embeddings,
    ``emb * sqrt(d)``). A norm that ends a non-residual block (conv -> BN of a stride-2 or channel-changing
    block, a patch-embedding or projection conv -> norm, a downsampler) reads its own block's computation,
    not the stream, so its output being the next block's identity is the start of a new stream."""
    todo, seen = [g.strip(node)], 0
    while todo and seen < 16:
        n = todo.pop()
        seen += 1
        if not isinstance(n, fx.Node):
            continue
        if n in residual or (n.op == "placeholder" and n.name in g.cap.user_inputs):
            return True
        name = op_name(n)
        mod = g.modules.get(str(n.target)) if n.op == "call_module" else None
        if name == "embedding" or isinstance(mod, nn.Embedding):
            return True
        if name in ("add", "sub"):
            todo.extend(g.strip(a) for a in g.inputs[n] if a not in g.const)
        elif (name in ("mul", "div") or name in GUARD_OPS) and isinstance(n.args[0], fx.Node):
            todo.append(g.strip(n.args[0]))  # emb * sqrt(d); not x * mask (a mask is no stream)
    return False


def _reembedded(g: StreamGraph, first: ResidualAdd, ahead: list[ResidualAdd], add_mask: int) -> bool:
    """The stream a norm's output starts (``first``, the add it is the skip of, then the adds of ``ahead``
    that take the previous one as their skip) ends in
    weighted ops that re-embed it for later residual adds, not in a norm: a downsampler's local residual
    block followed by its reduction conv (timm gcvit Downsample2d: ``norm1 -> x + f(x) -> conv``). The
    identity path across the stages is cut by that projection on purpose, so the norm before the local block
    loses nothing. In ``x = norm(x); x = x + f(x)`` repeated over a stack the stream goes on into the next
    block's norm (or to the head, with no residual add after it)."""
    last = first.node
    for _ in range(len(ahead)):
        nxt = next((a for a in ahead if g.strip(a.skip) is last), None)
        if nxt is None:
            break
        last = nxt.node
    todo, ends = [last], []
    for _ in range(64):
        if not todo:
            break
        n = todo.pop()
        for u in g._real_users(n):
            if g.is_alias(u) and u.args[0] is n:
                todo.append(u)
            else:
                ends.append(u)
    return bool(ends) and all(g.is_weighted(u) and u not in g.norm_nodes and g.desc[g.idx[u]] & add_mask
                              for u in ends)


def _own_nodes(g: StreamGraph, info: "SiteInfo") -> set[fx.Node]:
    """The nodes of a norm that may carry its result: output, gain/cast chain, claimed nodes."""
    return {info.out, info.rec.output} | set(info.rec.nodes) | g.site_chain.get(id(info.rec), set())


def cuts_identity(g: StreamGraph, info: "SiteInfo", add: ResidualAdd, infos: list["SiteInfo"],
                   residual: dict[fx.Node, ResidualAdd]) -> bool:
    """A norm whose output is the skip of its block's residual add (``x = norm(x); x = x + f(x)``) cuts an
    identity path the stack keeps elsewhere: a pre-LN fault (Xiong et al. 2020 keep ``x`` on the skip). Not
    when the stream it reads is already a norm's output (``LN(LN(x))``: nothing un-normalised is lost; a
    post-LN layer's output re-normalised by the next block, GroundingDINO's fusion layer after the
    deformable layer's ``final_layer_norm``); not when no norm of its stream is a ``pre`` norm reading a
    branch's input (the stream is normalised at every block, as in post-LN: no identity path to keep;
    GroundingDINO's BiAttentionBlock captured alone, whose stack is post-LN). The stream: the residual adds
    the norm's input continues (back along their skips) and those its add leads to."""
    norm_outs = {n for o in infos if o is not info for n in (g.site_out.get(id(o.rec)), o.rec.output) if n is not None}
    if info.inp in norm_outs:
        return False
    stream = {add.node} | {a.node for a in stream_reach(g, add.node, residual)}
    node: Any = info.inp
    for _ in range(64):
        node = g.strip(node)
        stream.add(node)
        if node not in residual:
            break
        node = residual[node].skip
    return any(o.placement == "pre" and o.rec.site.stream.branch_position == "input" and not o.feeds_shortcut
               and o.inp in stream for o in infos)


def double_norms(g: StreamGraph, infos: list[SiteInfo]) -> None:
    """Mark a norm whose output goes only into another norm (through casts, dropout and views)."""
    by_input: dict[fx.Node, list[SiteInfo]] = defaultdict(list)
    for info in infos:
        for n in {info.rec.input, info.inp} - {None}:
            by_input[n].append(info)

    def belongs(u: fx.Node, other: SiteInfo) -> bool:
        return u in other.rec.nodes or u is other.rec.output or owner(u, g.modules) == other.rec.site.module

    for info in infos:
        if info.out is None:
            continue
        node, target = info.out, None
        for _ in range(16):
            users = g._real_users(node)
            readers = [o for o in by_input.get(node, []) if o is not info]
            hit = next((o for o in readers if users and all(belongs(u, o) for u in users)), None)
            if hit is not None:
                target = hit
                break
            if len(users) != 1 or not g.is_alias(users[0]) or users[0].args[0] is not node:
                break
            node = users[0]
        if target is not None:
            info.rec.site.stream.feeds_norm = target.rec.site.module
            target.rec.site.stream.reads_norm = info.rec.site.module
