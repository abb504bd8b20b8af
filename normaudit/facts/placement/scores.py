"""Norms inside attention (placement ``qk``). A norm is ``qk`` when its output reaches attention scores
(``scaled_dot_product_attention``, or an activation-activation ``matmul`` that feeds a softmax or weights
values by an attention map) as tensor data, with no weighted op, norm or residual add in between (query/key
norms: Dehghani et al. 2023, arXiv 2302.05442). Its ``.shape`` sizing the q/k views of a projection does not
count: that is the block input, ``pre``. Contrastive logits, whose softmax lives in the loss, are no
attention scores. ``contracted_by_scores``: a q/k norm reducing the dims its scores contract (head_dim, or
the tokens of cross-covariance attention).

Known forms: XCiT's cross-covariance attention (timm xcit.py ``XCA``, edgenext.py ``CrossCovarianceAttn``)."""
from __future__ import annotations

from collections import deque
from typing import Optional

from torch import fx, nn

from normaudit.facts.placement.graph import GUARD_OPS, VIEW_OPS, StreamGraph
from normaudit.facts.placement.records import ResidualAdd, SiteInfo
from normaudit.vocabulary.graph import NEUTRAL_OPS, op_name, shape


#: ops that compute attention scores from two activations
SCORE_OPS = ("sdpa", "matmul", "einsum", "baddbmm")
#: ops that project their input by a weight operand (a linear or conv layer, a matmul with a weight)
PROJECTION_OPS = ("linear", "addmm", "mm", "bmm", "matmul", "conv", "conv1d", "conv2d", "conv3d", "einsum")
#: ops that read only the size, dtype and device of their tensor input, not its values
SHAPE_ONLY_OPS = ("new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "zeros_like", "ones_like",
                  "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "size", "dim", "numel",
                  "sym_size", "sym_numel", "sym_stride")


def reaches_scores(g: StreamGraph, start: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> bool:
    """The norm output reaches attention scores with no weighted op, norm or residual add in between."""
    todo, seen = deque([start]), {start}
    while todo:
        n = todo.popleft()
        for u in n.users:
            if u in seen or n not in g.inputs[u]:
                continue  # only tensor data flow: x.shape/x.size() feeding a view of q/k is not q/k itself
            seen.add(u)
            name = op_name(u)
            if u in residual or u.op == "output" or name in SHAPE_ONLY_OPS:
                continue  # x.new_zeros(...) / zeros_like(x): only x's size, dtype and device flow on
            if name in SCORE_OPS:
                acts = [a for a in g.inputs[u] if a not in g.pderived and a not in g.const]
                if name == "sdpa":
                    q_k = [a for a in u.args[:2] if isinstance(a, fx.Node)]
                    if n in q_k:
                        return True
                    continue
                if len(acts) >= 2 and not g.is_weighted(u) and (feeds_softmax(g, u) or _weights_values(g, u)):
                    return True
                continue
            if g.is_weighted(u) or (u in g.norm_nodes and u not in (start,)) or name == "module" \
                    or (name in PROJECTION_OPS and any(a in g.param for a in g.inputs[u])):
                # a projection by a weight; also of a tensor computed from parameters only (a Perceiver
                # resampler's learned latents in its first layer), which is_weighted leaves unmarked: export's
                # aten.linear then stops here as symbolic_trace's call_module does
                continue
            todo.append(u)
            if len(seen) > 400:
                return False
    return False


def _is_softmax(g: StreamGraph, node: fx.Node) -> bool:
    """``node`` is a softmax or log-softmax, functional or an ``nn.Softmax``/``nn.LogSoftmax`` module."""
    return "softmax" in op_name(node) or (node.op == "call_module" and isinstance(
        g.modules.get(str(node.target)), (nn.Softmax, nn.LogSoftmax)))


def _weights_values(g: StreamGraph, node: fx.Node) -> bool:
    """``node`` (an activation-activation product) weights values by an attention map: one operand comes from a
    softmax through a few views, dropout or casts (``attn.softmax(-1) @ v``), so a norm on ``v`` is inside the
    attention as q/k norms are."""
    todo, seen = list(g.inputs[node]), 0
    while todo and seen < 16:
        n = todo.pop()
        seen += 1
        name = op_name(n)
        if _is_softmax(g, n):
            return True
        if name in NEUTRAL_OPS or name in VIEW_OPS or name in ("reshape", "contiguous", "clone", "type_as") or (
                n.op == "call_module" and isinstance(g.modules.get(str(n.target)), nn.Dropout)):
            todo.extend(g.inputs[n])
    return False


#: what scores may pass through on their way to the softmax: scaling, a bias or mask, and a relative position
#: bias written into a slice of them (timm MViTv2 ``attn[:, :, 1:, 1:] = (attn[...].view(...) + rel_h +
#: rel_w).view(...)``: slicing, reshapes, the scatter or ``copy_`` back)
_SCORE_STEPS = ("add", "sub", "mul", "div", "masked_fill", "where", "exp", "tanh", "reshape", "contiguous",
                "clone", "getitem", "slice", "select", "narrow", "slice_scatter", "select_scatter", "copy_",
                "index_put", "index_put_", "setitem", "add_", "mul_", "div_", "masked_fill_")


def feeds_softmax(g: StreamGraph, node: fx.Node) -> bool:
    """Scores ``node`` reach a softmax within a few elementwise steps (scaling, a bias or mask, views): an
    attention map. Contrastive logits (CLIP's ``text @ image.T * logit_scale.exp()``, whose softmax lives in
    the loss outside the forward) and other activation products are not."""
    frontier = [node]
    for _ in range(8):
        nxt = []
        for n in frontier:
            for u in n.users:
                name = op_name(u)
                if _is_softmax(g, u):
                    return True
                if name in _SCORE_STEPS or name in NEUTRAL_OPS or name in VIEW_OPS or name in GUARD_OPS:
                    nxt.append(u)
        frontier = nxt[:32]
    return False


def contracted_by_scores(g: StreamGraph, info: "SiteInfo") -> bool:
    """The dims a q/k norm reduces over are the dims its attention scores contract, followed from the
    norm's output through transposes/permutes to a ``matmul`` (left operand: its last dim; right operand: its
    second-to-last) or ``sdpa`` (q and k: their last dim). True for the usual q/k norm over head_dim
    (Dehghani et al. 2023) and for cross-covariance attention, which L2-normalises q and k over the tokens
    because its scores are a channel x channel map (XCiT, El-Nouby et al. 2021, arXiv 2106.09681, eq. 3;
    timm edgenext CrossCovarianceAttn)."""
    dims, rank = info.rec.site.reduced_dims, len(shape(info.out) or ())
    if not dims or not rank:
        return False
    todo, seen = [(info.out, {d % rank for d in dims})], 0
    while todo and seen < 64:
        n, red = todo.pop()
        seen += 1
        for u in n.users:
            name, nd = op_name(u), len(shape(u) or ())
            if g.is_alias(u) and name not in ("transpose", "permute") and shape(u) == shape(n) and u.args[0] is n:
                todo.append((u, red))
            elif name in ("transpose", "permute") and u.args[0] is n and nd == rank:
                perm = _permutation(u, rank)
                if perm is not None:
                    todo.append((u, {perm.index(d) for d in red}))
            elif name in ("matmul", "sdpa") and nd:
                pos = [i for i, a in enumerate(u.args[:2]) if a is n]
                if pos:
                    want = rank - 1 if (pos[0] == 0 or name == "sdpa") else rank - 2
                    return red == {want}
    return False


def _permutation(node: fx.Node, rank: int) -> Optional[list[int]]:
    """The dim order of a ``transpose``/``permute`` node's output (``out[i] = in[perm[i]]``)."""
    args = [a for a in node.args[1:]] or list(node.kwargs.values())
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = list(args[0])
    if not all(isinstance(a, int) for a in args):
        return None
    if op_name(node) == "transpose" and len(args) == 2:
        perm = list(range(rank))
        a, b = args[0] % rank, args[1] % rank
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    perm = [a % rank for a in args]
    return perm if sorted(perm) == list(range(rank)) else None
