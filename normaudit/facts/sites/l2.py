"""Norms built on a 2-norm ``||x||_2`` (``torch.norm``, ``linalg_vector_norm``, ``F.normalize``).

``x / max(||x||_2 [* d ** -0.5], eps)``, its inverse form and ``F.normalize`` (PyTorch docs:
``v / max(||v||_p, eps)``, p=2, dim=1, eps=1e-12 by default; export writes it ``linalg_vector_norm``,
``clamp_min``, ``div``) are RMSNorms inside a module that is only a norm and owns a gain (the L2 norm is the
RMS up to sqrt(d), which the gain absorbs), and L2Norms anywhere else: a unit vector over ``dim`` (q/k-norm,
cross-covariance attention over the token axis, a contrastive head, nGPT's hidden state). Both carry the hint
``statistic="l2_norm"`` with the constant factors ``l2_pre``/``l2_post``. Outside a norm module, a 2-norm
divided in with no eps is a site only when a learned parameter rescales the result (a gain, or the
temperature of cosine q/k scores that feed a softmax): a bare ``x / x.norm(dim=-1, keepdim=True)`` is a
cosine similarity written without eps on purpose (CLIP's reference code), no site.
Global Response Normalization (Woo et al. 2023, eq. 1-2: ``||x||_2`` over H, W divided by its channel mean +
eps) is kind Other (hint ``statistic="grn"``)."""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

from torch import fx

from normaudit.facts.sites.activations import is_act
from normaudit.facts.sites.application import SCALE_PATH, VIEW_OPS, apply_node, feeds_from, norm_like
from normaudit.facts.sites.statistics import analyse_stat
from normaudit.vocabulary.graph import FOLLOW, NEUTRAL_OPS, arg, forward_walk, op_name, owner, reduction, \
    scalar_operand, shape, strip_neutral
from normaudit.vocabulary.kinds import L2_KIND


def l2_stat(node: fx.Node) -> Optional[tuple[fx.Node, tuple[int, ...]]]:
    """If ``node`` is a 2-norm of a tensor over some dims (``torch.norm``/``x.norm``/``linalg_vector_norm``
    with p=2, or ``F.normalize``, which divides by it) return (source, dims), else None."""
    name = op_name(node)
    if name == "normalize" and node.args and isinstance(node.args[0], fx.Node):
        if arg(node, 1, "p", 2.0) not in (2, 2.0):
            return None
        in_shape = shape(node.args[0])
        dim = arg(node, 2, "dim", 1)
        if in_shape is None or not isinstance(dim, int) or not in_shape:
            return None
        return node.args[0], (dim % len(in_shape),)
    if name not in ("norm", "linalg_vector_norm"):
        return None
    p = arg(node, 1, "p", "fro") if name == "norm" else arg(node, 1, "ord", 2)
    if p not in (2, 2.0, "fro"):
        return None
    red = reduction(node)
    if red is None:
        return None
    return red.source, red.dims


def root_sum_squares(node: fx.Node) -> Optional[tuple[fx.Node, tuple[int, ...]]]:
    """If ``node`` is the 2-norm written out, ``sqrt(sum(x ** 2, dims))`` (``x.pow(2).sum(d).sqrt()``,
    ``(x * x).sum(d) ** 0.5``), return (x, dims), else None."""
    name = op_name(node)
    if not (name == "sqrt" or (name == "pow" and len(node.args) > 1 and node.args[1] == 0.5)):
        return None
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    info = analyse_stat(node.args[0])
    if info is None or info.get("statistic") != "l2_norm":
        return None
    return info["source"], tuple(info["dims"])


def grn_root(node: fx.Node) -> bool:
    """``node`` is a written-out 2-norm (:func:`root_sum_squares`) that Global Response Normalization divides
    by its channel mean (:func:`_grn_stat`)."""
    return root_sum_squares(node) is not None and _grn_stat(node) is not None


class L2Scale(NamedTuple):
    """What :func:`_l2_scale` read off the chain after a 2-norm ``||x||_2``: its last node, the eps and how it
    enters, whether the chain ends in the inverse of the norm, and the constant factors of the denominator
    ``pre * ||x||_2`` before the eps and ``post`` after it: the scale is ``post * max(pre * ||x||_2, eps)``
    (or its inverse). ``pre = d ** -0.5`` makes the denominator the RMS of ``x``."""

    node: fx.Node
    eps: Optional[float]
    how: str
    inverted: bool
    pre: float
    post: float


def _l2_scale(norm: fx.Node) -> L2Scale:
    """From a 2-norm node, follow a scaling by a constant (``* d ** -0.5``), ``clamp(min=eps)`` / ``+ eps`` and
    an inversion (``c / ||x||``, ``reciprocal``: export writes ``c / t`` as ``reciprocal(t) * c``) forward.
    ZAYA's qk-norm ``q * (sqrt(d) / q.norm(dim=-1).clamp_min(eps))`` is ``q / (max(||q||_2, eps) / sqrt(d))``:
    the RMS of ``q`` up to where eps enters (``pre`` 1, ``post`` d ** -0.5, inverted)."""
    node, eps, how, inverted, pre, post = norm, None, "none", False, 1.0, 1.0

    def rescale(c: float) -> None:
        nonlocal pre, post
        if how == "none" and not inverted:
            pre *= c
        else:
            post *= c

    for _ in range(6):
        users = [u for u in node.users if not op_name(u).startswith("_assert")]
        if len(users) != 1:
            break
        u = users[0]
        name = op_name(u)
        c = scalar_operand(u)
        if name == "reciprocal" and not inverted:
            node, inverted = u, True
            continue
        if name == "div" and len(u.args) > 1 and u.args[1] is node and not inverted and c is not None and c != 0:
            node, inverted = u, True  # c / ||x||: the denominator is ||x|| / c
            rescale(1 / c)
            continue
        if name in ("mul", "div") and u.args and (u.args[0] is node or name == "mul") and c is not None and c != 0:
            # the denominator times c (or / c); after an inversion the factor divides it
            rescale((c if name == "mul" else 1 / c) ** (-1 if inverted else 1))
            node = u
            continue
        if name in NEUTRAL_OPS:
            node = u
            continue
        if inverted:
            break  # eps added to the inverse would be no eps of the norm
        if name in ("clamp", "maximum") and u.args and u.args[0] is node:
            c = arg(u, 1, "min", None)
            if not isinstance(c, (int, float)) or isinstance(c, bool):
                break
            eps, how, node = float(c), "clamp", u
            continue
        if name == "add" and c is not None:
            eps, how, node = c, "outside_sqrt", u
            continue
        break
    return L2Scale(node, eps, how, inverted, pre, post)


def _grn_stat(norm: fx.Node) -> Optional[tuple[fx.Node, tuple[int, ...], fx.Node, Optional[float]]]:
    """Global Response Normalization (ConvNeXt-V2, Woo et al. 2023, eq. 1-2): ``gx = ||x||_2`` over the
    spatial dims, ``nx = gx / (mean_C(gx) + eps)``. For the 2-norm node: (source, all reduced dims, the
    ``nx`` division, eps) or None."""
    l2 = l2_stat(norm) or root_sum_squares(norm)
    if l2 is None or op_name(norm) == "normalize":
        return None
    src, dims = l2
    for u in norm.users:
        if op_name(u) != "div" or u.args[0] is not norm or not isinstance(u.args[1], fx.Node):
            continue
        den = strip_neutral(u.args[1])
        eps = None
        if op_name(den) == "add" and scalar_operand(den) is not None:
            eps = scalar_operand(den)
            den = next((a for a in den.args[:2] if isinstance(a, fx.Node)), None)
        red = reduction(den) if isinstance(den, fx.Node) else None
        if red is not None and red.op == "mean" and strip_neutral(red.source) is norm:
            return src, tuple(sorted(set(dims) | set(red.dims))), u, eps
    return None


def add_l2(node: fx.Node, act: Optional[set], add_pattern, modules, data: Optional[set] = None) -> None:
    """Sites from a 2-norm: Global Response Normalization; ``x / max(||x||_2 [* d ** -0.5], eps)`` and
    ``F.normalize`` as RMSNorm (up to a constant the gain absorbs) inside a module that is only a norm, as
    L2Norm elsewhere (module docstring), where the form without eps needs a learned rescale (a gain, or the
    temperature of cosine q/k scores) to be a site."""
    path = owner(node, modules)
    src, dims = l2_stat(node) or root_sum_squares(node)
    if not is_act(src, act if data is None else data):
        return
    grn = _grn_stat(node)
    if grn is not None:
        src, all_dims, nx, eps = grn
        rec = add_pattern(path, node, node, nx, src, all_dims, False, "mean_square", eps, "outside_sqrt",
                          kind="Other")
        rec.hints["statistic"] = "grn"
        return
    if op_name(node) == "normalize":
        applied = node
        eps_v = arg(node, 3, "eps", 1e-12)
        eps, how = (float(eps_v) if isinstance(eps_v, (int, float)) else None), "clamp"
        factors = {"l2_pre": 1.0, "l2_post": 1.0}
    else:
        chain = _l2_scale(node)
        eps, how = chain.eps, chain.how
        by = "mul" if chain.inverted else "div"  # x * (c / ||x||) or x / ||x||
        applied = apply_node(chain.node, src, by)
        if applied is None or op_name(applied) != by:
            return
        factors = {"l2_pre": chain.pre, "l2_post": chain.post}
    in_norm = norm_like(modules.get(path)) and not _mixed_with_activation(applied, act, path, modules)
    if not in_norm and eps is None and not learned_rescale(applied, act):
        return  # x / ||x|| with no eps and no learned scale: a bare cosine similarity
    rec = add_pattern(path, node, node, applied, src, dims, False, "mean_square", eps, how,
                      kind=None if in_norm and has_gain(modules.get(path)) else L2_KIND)
    rec.hints["statistic"] = "l2_norm"
    rec.hints.update(factors)
    if op_name(node) == "normalize":
        rec.site.op = "normalize"  # F.normalize as symbolic tracing records it (export decomposes it)


def has_gain(mod: Any) -> bool:
    """The norm module owns a parameter (its gain): only then is its L2 norm an RMSNorm, the gain absorbing
    the factor sqrt(d) between ``||x||_2`` and the RMS; a parameterless ``F.normalize`` module is a unit vector."""
    return mod is not None and any(True for _ in mod.parameters(recurse=False))


def learned_rescale(normed: fx.Node, act: Optional[set]) -> bool:
    """An L2-normalised tensor multiplied by a learned parameter, as a norm's gain would be: directly
    (``scale * F.normalize(x)``, through constant factors and views), or, for q and k, through their scores
    when those feed an attention softmax (Swin-V2's ``softmax((q_n @ k_n^T) * logit_scale.exp() + bias)``).
    A bare cosine similarity is not a normalisation layer, nor are contrastive logits scaled by a temperature,
    whether it multiplies the scores (CLIP's ``text_n @ image_n^T * logit_scale.exp()``) or one factor before
    the product (X-CLIP's ``einsum("bd,bkd->bk", video_n, logit_scale.exp() * text_n)``): a product with
    another activation (``matmul``/``bmm``/``einsum``) that feeds no softmax."""
    if act is None:
        return False
    through_scores = False
    products = ("matmul", "bmm", "einsum")

    def logits(u: fx.Node, n: fx.Node) -> Any:
        """The rescaled tensor is a factor of a product with another activation that feeds no softmax."""
        name = op_name(u)
        if name in products:
            flat = [b for a in u.args for b in (a if isinstance(a, (list, tuple)) else (a,))]  # einsum's list
            factors = [a for a in flat if isinstance(a, fx.Node)]
            if any(a is not n and is_act(a, act) for a in factors):
                return not _feeds_softmax(u)
            return None
        return FOLLOW if name in NEUTRAL_OPS or name in VIEW_OPS + SCALE_PATH else None

    def step(u: fx.Node, n: fx.Node) -> Any:
        nonlocal through_scores
        name = op_name(u)
        others = [a for a in u.args[:2] if a is not n]
        if name in ("mul", "div") and others:
            o = others[0]
            if isinstance(o, fx.Node) and o not in act:
                return _feeds_softmax(u) if through_scores else not forward_walk(u, logits)
            return None if isinstance(o, fx.Node) else FOLLOW  # a constant: sqrt(d)
        if name in products:
            through_scores = True
            return FOLLOW
        return FOLLOW if name in NEUTRAL_OPS or name in VIEW_OPS + SCALE_PATH else None

    return bool(forward_walk(normed, step))


def _feeds_softmax(node: fx.Node) -> bool:
    """``node`` reaches a softmax within a few elementwise steps (a position bias, a mask, a view)."""
    def step(u: fx.Node, n: fx.Node) -> Any:
        name = op_name(u)
        if name in ("softmax", "_softmax", "_safe_softmax", "log_softmax"):
            return True
        return FOLLOW if name in ("add", "sub", "mul", "div", "masked_fill", "where") \
            or name in NEUTRAL_OPS + VIEW_OPS else None

    return bool(forward_walk(node, step))


def _mixed_with_activation(normed: fx.Node, act: Optional[set], path: str, modules) -> bool:
    """Inside its module, the L2-normalised tensor is multiplied by another activation tensor
    (``(a * unit).sum(-1)``, ``a @ unit``; not a size read off the input, ``x.shape[-1] ** 0.5``): a unit
    direction for a projection, not a norm's output, which a module that is only a norm scales by parameters
    alone (transformers NeoMME's exclusive self-attention, parameters a per-head ``alpha``:
    ``attn - tanh(alpha) * (attn * v_unit).sum(-1, keepdim=True) * v_unit``)."""
    if act is None:
        return False
    derived, frontier = {normed}, [normed]
    while frontier:
        for u in frontier.pop().users:
            if u in derived or owner(u, modules) != path:
                continue
            derived.add(u)
            frontier.append(u)
            if op_name(u) in ("mul", "matmul", "bmm") and any(
                    is_act(a, act) and a not in derived and math.prod(shape(a) or (1,)) > 1
                    and not feeds_from(a, normed) for a in u.args[:2]):
                return True
    return False
