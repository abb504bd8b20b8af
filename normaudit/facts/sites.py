"""Site discovery: every normalisation computation in the captured graph, each one :class:`SiteRecord`.

Three detectors, in this order, each skipping nodes already claimed:

1. built-in modules (``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm``,
   ``nn.GroupNorm``, ``nn.InstanceNorm1d/2d/3d``, ``nn.LocalResponseNorm``), as ``call_module`` nodes
   (symbolic tracing) or the aten op / decomposed ops they own (export);
2. functional calls (``F.layer_norm``, ``F.rms_norm``, ``F.batch_norm``, ``F.group_norm``,
   ``F.instance_norm`` and their aten forms) inside any other module's forward;
3. hand-written norms, recognised by what they compute: a statistic over some dims (``var``/``std``, or a
   ``mean`` of squares, centred or not), turned into a scale by ``sqrt``/``rsqrt``/``pow(-0.5)`` (or ``std``
   itself), applied to the same tensor by ``mul``/``div`` (through reshapes: a group std taken on
   ``x.reshape(B, G, ...)``). ``kind`` follows the computation, whatever the class is called: a centred
   numerator (``x - mean``) -> LayerNorm; ``x`` itself -> RMSNorm (Zhang & Sennrich 2019), also when the
   statistic is a variance (timm's SimpleNorm, ``x * rsqrt(var(x) + eps)``: formula variance ``unbiased``,
   ``mean_subtracted`` False); a gated numerator (EvoNorm-S0: ``x * sigmoid(v * x) / group_std``) or a
   ``max``/``+`` of denominators (EvoNorm-B0) -> Other (Liu et al. 2020). ``torch.var_mean`` counts (its
   variance reaches the root through ``getitem``). A sum of squares (nGPT's ``x * rsqrt(sum(x^2) + eps)``),
   ``x / max(||x||_2 [* d ** -0.5], eps)`` and ``F.normalize`` are RMSNorm too (the L2 norm is the RMS up to
   sqrt(d), which the gain absorbs; hint ``statistic="l2_norm"``) inside a module that is only a norm, or
   elsewhere when a learned parameter rescales the result (a gain, or the temperature of cosine q/k scores
   that feed a softmax, Swin-V2); a bare cosine similarity or contrastive logits (CLIP) are no site.
   Global Response Normalization (ConvNeXt-V2: ``||x||_2`` over H, W divided by its channel mean + eps) is
   kind Other (hint ``statistic="grn"``). An inverse RMS multiplying a weight's projection of its tensor
   (``F.linear(x, W) * rsqrt(mean(x^2))``, HY-V4's hyper-connections) is an RMSNorm; an L2-normalised
   direction its module projects other activations on (NeoMME's exclusive self-attention) is no site.
   A cumulative norm (statistics of steps ``0..t`` along time by cumulative sums: ``cumsum(sum((x - m)^2)) /
   count``, Gemma3n audio's cumulative GroupNorm) is kind Other (hint ``statistic="cumulative"``,
   ``extra["cumulative_dim"]``).
4. frozen BatchNorms (torchvision/timm/detectron2 ``FrozenBatchNorm2d``, transformers'
   ``DetrFrozenBatchNorm2d``): ``x * (w * rsqrt(running_var + eps)) + shift`` with the statistic a per-channel
   buffer, kind BatchNorm in eval mode (hint ``statistic="running_var"``). Symbolic tracing evaluates buffer
   arithmetic while tracing (it proxies parameters only) and leaves ``x * constant + constant``; such a
   childless module holding 1-D buffers is retraced alone with ``make_fx`` on meta tensors to read its eps.

Statistics of a parameter are no site whatever they compute: weight standardisation (Qiao et al. 2019;
``F.batch_norm`` over a conv's weight in BiT and timm ``StdConv2d``) normalises no activation. Only nodes that
depend on a model input, or on a tensor the forward makes from no tensor (a decoder's own start tokens,
``torch.full``; a diffusion canvas, ``torch.randint``), are normalised tensors (:func:`activation_nodes`).
A statistic needs only its input's rank: the norm of ``h[mask]`` (a data-dependent row count) is a site.

The module of a site is the innermost module whose forward produced it (CONTRACT.md).
"""
from __future__ import annotations

import copy
import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.vocabulary.graph import (NEUTRAL_OPS, arg, dtype, op_name, owner, rank, reduction, scalar_operand,
                                  shape, sizes, strip_neutral)
from normaudit.report import GroupSplit, Site, SourceLocation
from normaudit.vocabulary.graph import FOLLOW, forward_walk
from normaudit.vocabulary.kinds import OP_KINDS, builtin_kind, norm_modules

@dataclass
class SiteRecord:
    """A site and the graph nodes behind it.

    ``input`` is the tensor the norm normalises, ``output`` the node carrying its result (after gain and
    bias where those are recognised), ``stat`` the reduction node for hand-written norms, ``nodes`` every
    node claimed by this site.
    """

    site: Site
    input: Optional[fx.Node] = None
    output: Optional[fx.Node] = None
    stat: Optional[fx.Node] = None
    nodes: set = field(default_factory=set)
    module_obj: Optional[nn.Module] = None
    hints: dict[str, Any] = field(default_factory=dict)


def _is_aten(node: fx.Node) -> bool:
    return hasattr(node.target, "_overloadpacket")


def _dtype_str(dt: Optional[torch.dtype]) -> Optional[str]:
    return str(dt).replace("torch.", "") if dt is not None else None


def _module_facts(site: Site, mod: nn.Module, in_shape: Optional[tuple[int, ...]]) -> None:
    """Fill eps/affine/normalized_shape/groups from a built-in norm module's attributes."""
    kind = site.kind
    if kind in ("LayerNorm", "RMSNorm"):
        site.normalized_shape = [int(s) for s in mod.normalized_shape]
        eps = getattr(mod, "eps", None)
        site.eps = float(eps) if eps is not None else None
        site.affine_weight = getattr(mod, "weight", None) is not None
        site.affine_bias = getattr(mod, "bias", None) is not None
        if kind == "RMSNorm" and eps is None:
            site.extra["eps_default"] = "torch.finfo(input dtype).eps"
    elif kind in ("BatchNorm", "InstanceNorm"):
        site.eps = float(mod.eps)
        site.num_channels = int(mod.num_features)
        site.affine_weight = site.affine_bias = bool(mod.affine)
        site.track_running_stats = bool(mod.track_running_stats)
        site.training = bool(mod.training)
        site.extra["momentum"] = mod.momentum
    elif kind == "GroupNorm":
        site.eps = float(mod.eps)
        site.num_groups = int(mod.num_groups)
        site.num_channels = int(mod.num_channels)
        site.affine_weight = site.affine_bias = bool(mod.affine)
    elif kind == "LocalResponseNorm":
        site.extra.update(size=mod.size, alpha=mod.alpha, beta=mod.beta, k=mod.k)


def reduced_dims_for(kind: str, rank: int, normalized_len: int = 1) -> list[int]:
    """Dims a fused norm reduces over, for an input of ``rank`` dims (PyTorch docs of each module)."""
    if kind in ("LayerNorm", "RMSNorm"):
        return list(range(rank - normalized_len, rank))
    if kind == "BatchNorm":
        return [d for d in range(rank) if d != 1]
    if kind == "GroupNorm":
        return list(range(1, rank))
    if kind == "InstanceNorm":
        return list(range(2, rank))
    if kind == "LocalResponseNorm":
        return [1] if rank > 1 else []
    return []


def _size_value(node: fx.Node) -> Any:
    """Evaluate ``x.shape``/``x.size()`` and indexing or slicing of it from the recorded shapes
    (symbolic tracing keeps these as nodes): an int, a tuple of ints, or None when unknown."""
    name = op_name(node)
    if name == "getattr" and len(node.args) > 1 and node.args[1] == "shape" and isinstance(node.args[0], fx.Node):
        return shape(node.args[0])
    if name == "size" and node.args and isinstance(node.args[0], fx.Node):
        full = shape(node.args[0])
        dim = arg(node, 1, "dim", None)
        if full is None:
            return None
        return full if dim is None else full[int(dim)]
    if name == "getitem" and isinstance(node.args[0], fx.Node):
        base = _size_value(node.args[0])
        if isinstance(base, tuple):
            try:
                return base[node.args[1]]
            except (TypeError, IndexError):
                return None
    return None


def _normalized_shape(node: fx.Node) -> Optional[list[int]]:
    """``normalized_shape`` of a functional layer_norm/rms_norm call. Entries computed from the input's
    size (``(x.shape[-1],)``: fx nodes under symbolic tracing) are read from the input's shape instead."""
    ns = arg(node, 1, "normalized_shape")
    if ns is None:
        return None
    if isinstance(ns, fx.Node):
        value = _size_value(ns)
        ns = list(value) if isinstance(value, tuple) else [value if value is not None else ns]
    elif isinstance(ns, int):
        ns = [ns]
    ns = [(_size_value(d) if isinstance(d, fx.Node) else d) if not isinstance(d, int) else d for d in ns]
    ns = [d if d is not None else object() for d in ns]
    in_shape = shape(node.args[0]) if node.args else None
    out: list[int] = []
    for k, dim in enumerate(ns):
        if isinstance(dim, int):
            out.append(int(dim))
        elif in_shape is not None and len(in_shape) >= len(ns):
            out.append(in_shape[len(in_shape) - len(ns) + k])
        else:
            return None
    return out


def _functional_facts(site: Site, node: fx.Node, name: str) -> None:
    """Fill facts from a functional norm call's arguments (aten schema or torch.nn.functional signature)."""
    aten = _is_aten(node)
    if name == "layer_norm":
        site.normalized_shape = _normalized_shape(node)
        w, b = arg(node, 2, "weight"), arg(node, 3, "bias")
        eps = arg(node, 4, "eps", 1e-5)
    elif name == "rms_norm":
        site.normalized_shape = _normalized_shape(node)
        w, b = arg(node, 2, "weight"), None
        eps = arg(node, 3, "eps", None)
    elif name == "group_norm":
        site.num_groups = int(arg(node, 1, "num_groups"))
        w, b = arg(node, 2, "weight"), arg(node, 3, "bias")
        eps = arg(node, 4, "eps", 1e-5)
        in_shape = shape(node.args[0])
        site.num_channels = in_shape[1] if in_shape and len(in_shape) > 1 else None
    elif name == "batch_norm":
        if aten:
            w, b = arg(node, 1, "weight"), arg(node, 2, "bias")
            training, eps = arg(node, 5, "training", False), arg(node, 7, "eps", 1e-5)
            rm = arg(node, 3, "running_mean")
        else:
            w, b = arg(node, 3, "weight"), arg(node, 4, "bias")
            training, eps = arg(node, 5, "training", False), arg(node, 7, "eps", 1e-5)
            rm = arg(node, 1, "running_mean")
        site.training = bool(training)
        site.track_running_stats = rm is not None
    elif name == "instance_norm":
        if aten:
            w, b = arg(node, 1, "weight"), arg(node, 2, "bias")
            rm = arg(node, 3, "running_mean")
        else:
            w, b = arg(node, 3, "weight"), arg(node, 4, "bias")
            rm = arg(node, 1, "running_mean")
        eps = arg(node, 7, "eps", 1e-5)
        site.track_running_stats = rm is not None
    else:
        w = b = None
        eps = None
    site.eps = float(eps) if isinstance(eps, (int, float)) else None
    site.affine_weight = w is not None
    site.affine_bias = b is not None


def _find_stat(scale_in: fx.Node) -> Optional[tuple[fx.Node, Optional[float], str]]:
    """From the argument of sqrt/rsqrt, walk back through ``+ eps``/clamp/casts to the statistic.

    Returns (statistic node, eps, how eps enters) or None.
    """
    node, eps, how = scale_in, None, "none"
    for _ in range(6):
        node = strip_neutral(node)
        if not isinstance(node, fx.Node):
            return None
        name = op_name(node)
        if name == "add":
            c = scalar_operand(node)
            if c is None:
                return None
            eps, how = c, "inside_sqrt"
            node = node.args[0] if isinstance(node.args[0], fx.Node) else node.args[1]
            continue
        if name in ("clamp", "maximum"):
            c = arg(node, 1, "min", None)
            if isinstance(c, (int, float)):
                eps, how = float(c), "clamp"
            node = node.args[0]
            continue
        if name == "getitem" and len(node.args) > 1 and node.args[1] == 0 and isinstance(node.args[0], fx.Node):
            # var, mean = torch.var_mean(...): the variance is element 0 of the tuple
            red = reduction(node.args[0])
            if red is not None and red.op == "var_mean":
                return node.args[0], eps, how
            return None
        if reduction(node) is not None or _cumulative_mean(node) is not None:
            return node, eps, how
        return None
    return None


def _cumulative_mean(node: Any) -> Optional[tuple[fx.Node, int]]:
    """``cumsum(sum(v, dims, keepdim=True), t) / count``: the running mean over dim ``t`` (time) of per-step
    sums over ``dims``, as a causal (streaming) norm computes its statistics: at step ``t`` the mean over
    steps ``0..t`` (transformers' Gemma3n audio ``Gemma3nAudioCumulativeGroupNorm``, after JAX's
    ``GroupNormalization(cumulative=True)``). Returns (the per-step ``sum`` node, ``t``) or None."""
    node = strip_neutral(node)
    if not isinstance(node, fx.Node) or op_name(node) != "div" or len(node.args) < 2:
        return None
    num = strip_neutral(node.args[0])
    if not isinstance(num, fx.Node) or op_name(num) != "cumsum" or not num.args:
        return None
    step, t = strip_neutral(num.args[0]), arg(num, 1, "dim", None)
    red = reduction(step) if isinstance(step, fx.Node) else None
    n_dims = rank(step)
    if red is None or red.op != "sum" or not red.keepdim or not isinstance(t, int) or not n_dims:
        return None
    t %= n_dims
    return (step, t) if t not in red.dims else None


def _cumulative_source(node: Any) -> Optional[fx.Node]:
    """If ``node`` is ``x - cumulative_mean(x)`` (:func:`_cumulative_mean`, through casts) return x."""
    node = strip_neutral(node)
    if isinstance(node, fx.Node) and op_name(node) == "sub" and len(node.args) > 1:
        a, cum = node.args[0], _cumulative_mean(node.args[1])
        if cum is not None and strip_neutral(reduction(cum[0]).source) is strip_neutral(a):
            return a
    return None


def _l2_stat(node: fx.Node) -> Optional[tuple[fx.Node, tuple[int, ...]]]:
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


def _square_source(node: fx.Node) -> Optional[fx.Node]:
    """If ``node`` is x**2 / x*x / square(x) return x, else None."""
    name = op_name(node)
    if name == "pow" and len(node.args) > 1 and node.args[1] == 2 and isinstance(node.args[0], fx.Node):
        return node.args[0]
    if name == "square" and isinstance(node.args[0], fx.Node):
        return node.args[0]
    if name == "mul" and len(node.args) > 1 and node.args[0] is node.args[1] and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def _centered_source(node: fx.Node) -> Optional[fx.Node]:
    """If ``node`` is ``x - mean(x)`` (through casts) return x, else None."""
    node = strip_neutral(node)
    if isinstance(node, fx.Node) and op_name(node) == "sub" and len(node.args) > 1:
        a, m = node.args[0], strip_neutral(node.args[1])
        if isinstance(m, fx.Node) and op_name(m) == "mean":
            red = reduction(m)
            if red is not None and strip_neutral(red.source) is strip_neutral(a):
                return a
    return None


def _analyse_stat(stat: fx.Node) -> Optional[dict[str, Any]]:
    """What a statistic node measures: source tensor, reduced dims, centred or not, estimator; a cumulative
    statistic (:func:`_cumulative_mean` of squares) also its time dim (``cumulative_dim``)."""
    red = reduction(stat)
    if red is None:
        return _analyse_cumulative(stat)
    if red.op in ("var", "std", "var_mean", "std_mean"):
        return {"source": red.source, "dims": red.dims, "centered": True,
                "variance": "unbiased" if (red.correction or 0) >= 1 else "population", "std": red.op == "std"}
    if red.op == "sum":
        # sum of squares (nGPT's x * rsqrt(sum(x^2) + eps)): the L2 norm, the RMS up to sqrt(d)
        sq = _square_source(strip_neutral(red.source))
        if sq is None or _centered_source(sq) is not None:
            return None
        return {"source": sq, "dims": red.dims, "centered": False, "variance": "mean_square", "std": False,
                "statistic": "l2_norm"}
    if red.op == "mean":
        sq = _square_source(strip_neutral(red.source))
        if sq is None:
            return None
        centred = _centered_source(sq)
        if centred is not None:
            return {"source": centred, "dims": red.dims, "centered": True, "variance": "population", "std": False}
        return {"source": sq, "dims": red.dims, "centered": False, "variance": "mean_square", "std": False}
    return None


def _analyse_cumulative(stat: fx.Node) -> Optional[dict[str, Any]]:
    """:func:`_analyse_stat` of a running mean of squares over time: ``cumsum(sum((x - m)^2)) / count`` with
    ``m`` the running mean of ``x`` is the cumulative variance of ``x`` (centred); of ``x^2``, its cumulative
    mean square. The statistic at step ``t`` covers ``dims`` of steps ``0..t``."""
    cum = _cumulative_mean(stat)
    if cum is None:
        return None
    step, t = cum
    red = reduction(step)
    sq = _square_source(strip_neutral(red.source))
    if sq is None:
        return None
    info = {"dims": red.dims, "std": False, "statistic": "cumulative", "cumulative_dim": t}
    centred = _cumulative_source(sq)
    if centred is not None:
        return {**info, "source": centred, "centered": True, "variance": "population"}
    return {**info, "source": sq, "centered": False, "variance": "mean_square"}


_VIEW_OPS = ("view", "reshape", "permute", "transpose", "contiguous", "flatten", "unflatten", "_unsafe_view",
             "clone")


def _base(node: Any) -> Any:
    """``node`` through casts and layout-only ops (reshape into groups, permute): the tensor it views."""
    for _ in range(16):
        node = strip_neutral(node)
        if isinstance(node, fx.Node) and op_name(node) in _VIEW_OPS and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            continue
        return node
    return node


def _related(node: Any, source: fx.Node, depth: int = 5) -> bool:
    """True when ``node`` is ``source`` or derives from it (or its centred form, or a view of either: a
    group-wise statistic is taken on ``x.reshape(B, G, -1)`` and applied to ``x``) within a few hops."""
    target = _base(source)
    frontier = [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if not isinstance(n, fx.Node):
                continue
            s = strip_neutral(n)
            if s is target or n is source or _base(s) is target:
                return True
            if isinstance(s, fx.Node) and op_name(s) in ("sub", "mul", "div", "to", "add", "alias"):
                nxt.extend(a for a in s.args if isinstance(a, fx.Node))
        frontier = nxt
    return False


_SCALE_PATH = ("expand", "expand_as", "unsqueeze", "view", "reshape", "_unsafe_view")


_PROJECTIONS = ("linear", "mm", "matmul")


def _projected(other: Any, source: fx.Node, dims: Any, act: Optional[set]) -> bool:
    """``other`` is a linear map of ``source`` over its last dim by a weight (``F.linear(x, W)``, ``x @ W``)
    and the statistic is taken over that dim (and maybe others): a scale constant along the contracted dim
    commutes with the map, ``linear(x, W) * rsqrt(mean(x^2) + eps) == linear(x * rsqrt(mean(x^2) + eps), W)``,
    so the product is the RMSNorm of ``x`` projected (DeepSeek-V4-style hyper-connections, transformers HY-V4:
    ``F.linear(flat, self.fn) * self.input_norm(flat)``, the norm module returning only the inverse RMS)."""
    node = strip_neutral(other)
    n_dims = len(shape(source) or ())
    if act is None or not n_dims or dims is None or n_dims - 1 not in {d % n_dims for d in dims}:
        return False
    if not isinstance(node, fx.Node) or op_name(node) not in _PROJECTIONS or len(node.args) < 2:
        return False
    x, w = node.args[0], _base(node.args[1])
    return isinstance(w, fx.Node) and w not in act and _related(x, source)


def _apply_node(scale: fx.Node, source: fx.Node, by: str, dims: Any = None,
                act: Optional[set] = None) -> Optional[fx.Node]:
    """The mul/div that applies ``scale`` to the source tensor, following casts, broadcasting and reshapes
    forward (a group std computed on ``x.reshape(B, G, ...)`` is reshaped back to ``x``'s shape) and
    ``max``/``+`` combinations of the denominator (EvoNorm-B0: ``x / max(sqrt(var + eps), v * x + std)``).
    With the statistic's ``dims`` and the activations ``act``: also the mul that applies it to a weight's
    projection of the source (:func:`_projected`)."""
    frontier = [scale]
    for _ in range(6):
        nxt = []
        for n in frontier:
            for user in n.users:
                name = op_name(user)
                if name in ("mul", "div") and len(user.args) > 1:
                    other = user.args[0] if user.args[1] is n else user.args[1]
                    if user.args[0] is n and name == "div":
                        continue
                    if _related(other, source) or (by == "mul" and _projected(other, source, dims, act)):
                        return user
                if name in NEUTRAL_OPS or name in _SCALE_PATH:
                    nxt.append(user)
                elif name in ("maximum", "max", "add") and len(user.args) > 1 and all(
                        isinstance(a, fx.Node) for a in user.args[:2]):
                    nxt.append(user)
        frontier = nxt
    return None


def _extend_affine(out: fx.Node, owner_path: str, modules) -> tuple[fx.Node, list[fx.Node]]:
    """Follow the gain multiply / bias add (and casts) that stay inside the same module."""
    chain = []
    node = out
    for _ in range(6):
        # export adds _assert_tensor_metadata checks beside casts: they consume nothing
        users = [u for u in node.users if not op_name(u).startswith("_assert")]
        if len(users) != 1:
            break
        u = users[0]
        if owner(u, modules) != owner_path:
            break
        if op_name(u) in ("mul", "add", "to", "alias", "type_as"):
            chain.append(u)
            node = u
            continue
        break
    return node, chain


def _location(node: Optional[fx.Node], skip_inner: int = 0) -> Optional[SourceLocation]:
    """A frame of the node's recorded stack trace outside torch: the innermost one, or ``skip_inner``
    frames further out (1 gives the caller of a hand-written norm's ``forward``)."""
    if node is None:
        return None
    st = node.meta.get("stack_trace")
    if not st:
        return None
    from normaudit.loaders.pyfile import is_tool_file

    frames: list[SourceLocation] = []
    for line in st.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            fname = line[6:line.index('"', 6)]
            if is_tool_file(fname):  # torch/normaudit by their real roots, not a substring of the path
                continue
            try:
                lineno = int(line.split(", line ")[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            frames.append(SourceLocation(file=fname, line=lineno))
    if not frames:
        return None
    return frames[max(0, len(frames) - 1 - skip_inner)]


def _norm_like(mod: Optional[nn.Module]) -> bool:
    """A module that is only a norm: no submodules, parameters with at most one dim of size > 1 (a per-feature
    gain, also shaped (1, C, 1, 1) for channels-first input), so its forward is the norm."""
    return (mod is not None and not any(True for _ in mod.children())
            and all(sum(int(d) > 1 for d in p.shape) <= 1 for p in mod.parameters(recurse=False)))


def created_tensor(node: fx.Node) -> bool:
    """``node`` makes a tensor from no tensor: a factory call whose arguments are all literals
    (``torch.full((B, 1), bos_id)``, ``torch.randint(0, V, (B, S))``, ``torch.zeros(...)``). A forward that
    builds its own input this way (Dia's decoder start tokens, a diffusion decoder's random canvas) feeds
    data, not weights, to the layers after it."""
    if node.op != "call_function" or node.all_input_nodes:
        return False
    v = node.meta.get("val", node.meta.get("tensor_meta"))
    return v is None or isinstance(v, torch.Tensor) or hasattr(v, "shape")


def activation_nodes(gm: fx.GraphModule, user_inputs: list[str], created: bool = False) -> Optional[set]:
    """The nodes whose value depends on a model input (activations), in one pass over the graph; None when
    the capture names no inputs (then every node counts as one). A node outside this set is a function of
    parameters, buffers and constants only: statistics over it (weight standardisation, Qiao et al. 2019:
    ``F.batch_norm`` over a conv's weight in BiT/timm ``StdConv2d``) normalise no activation.

    With ``created``, tensors the forward creates from no tensor (:func:`created_tensor`) and what is computed
    from them count too: then a node outside the set is a function of parameters and buffers alone, and a
    norm over a decoder input the model made itself (``embed(torch.full(...))``) is still a norm of data."""
    names = set(user_inputs)
    if not names:
        return None
    act: set = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.name in names:
                act.add(node)
        elif any(a in act for a in node.all_input_nodes) or (created and created_tensor(node)):
            act.add(node)
    return act


def _is_act(node: Any, act: Optional[set]) -> bool:
    return isinstance(node, fx.Node) and (act is None or node in act)


def _numerator_form(other: Any, source: fx.Node, act: Optional[set]) -> str:
    """What the scale is applied to: ``centred`` (``x - mean(x)``, through gains by parameters and casts),
    ``plain`` (``x`` itself or a view of it) or ``gated`` (``x`` times another function of ``x``, as in
    EvoNorm-S0's ``x * sigmoid(v * x) / std``); ``unknown`` when the walk finds none of these."""
    node, target = other, _base(source)
    for _ in range(8):
        node = strip_neutral(node)
        if not isinstance(node, fx.Node):
            return "unknown"
        if node is target or _base(node) is target:
            return "plain"
        name = op_name(node)
        if name == "sub" and len(node.args) > 1:
            m = strip_neutral(node.args[1])
            if isinstance(m, fx.Node) and (
                    (op_name(m) == "mean" and reduction(m) is not None and _base(reduction(m).source) is _base(node.args[0]))
                    or (op_name(m) == "getitem" and isinstance(m.args[0], fx.Node)
                        and op_name(m.args[0]) in ("var_mean", "std_mean"))):
                return "centred"
            return "unknown"
        if name in ("mul", "div") and len(node.args) > 1:
            acts = [a for a in node.args[:2] if _is_act(a, act)]
            if len(acts) == 2 and act is not None:
                return "gated"
            if len(acts) == 1:
                node = acts[0]
                continue
            return "unknown"
        if name in _VIEW_OPS and node.args:
            node = node.args[0]
            continue
        return "unknown"
    return "unknown"


def _buffer_stat(scale_in: fx.Node, act: Optional[set]) -> Optional[tuple[fx.Node, Optional[float]]]:
    """``running_var + eps`` under a sqrt/rsqrt: (the per-channel tensor that is no activation, eps), else
    None. The frozen BatchNorm of torchvision/timm/detectron2/DETR: ``x * (w * (rv + eps).rsqrt()) + shift``."""
    if act is None:
        return None
    node, eps = strip_neutral(scale_in), None
    if isinstance(node, fx.Node) and op_name(node) == "add" and scalar_operand(node) is not None:
        eps = scalar_operand(node)
        node = next((a for a in node.args[:2] if isinstance(a, fx.Node)), None)
    node = _base(node)
    if not isinstance(node, fx.Node) or node in act or node.op not in ("get_attr", "placeholder"):
        return None
    sh = shape(node)
    if sh is None or len(sh) != 1 or sh[0] < 2:
        return None
    return node, eps


#: :func:`forward_walk` step result: go on through this user.
def _apply_to_activation(scale: fx.Node, act: set) -> Optional[tuple[fx.Node, fx.Node, bool]]:
    """Follow ``scale`` (a function of buffers) forward through products with other non-activations and
    reshapes to the mul/div that applies it to an activation: (that node, the activation, a gain was
    multiplied in on the way), or None."""
    gain = False

    def step(user: fx.Node, n: fx.Node) -> Any:
        nonlocal gain
        name = op_name(user)
        others = [a for a in user.args[:2] if a is not n]
        if name in ("mul", "div") and others and _is_act(others[0], act):
            return None if name == "div" and user.args[0] is n else (user, others[0], gain)
        if name == "mul" and others and isinstance(others[0], fx.Node) and others[0] not in act:
            gain = True
            return FOLLOW
        return FOLLOW if name in NEUTRAL_OPS or name in _SCALE_PATH else None

    return forward_walk(scale, step)


def _grn_stat(norm: fx.Node) -> Optional[tuple[fx.Node, tuple[int, ...], fx.Node, Optional[float]]]:
    """Global Response Normalization (ConvNeXt-V2, Woo et al. 2023, eq. 1-2): ``gx = ||x||_2`` over the
    spatial dims, ``nx = gx / (mean_C(gx) + eps)``. For the 2-norm node: (source, all reduced dims, the
    ``nx`` division, eps) or None."""
    l2 = _l2_stat(norm)
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


def _learned_rescale(normed: fx.Node, act: Optional[set]) -> bool:
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
            if any(a is not n and _is_act(a, act) for a in factors):
                return not _feeds_softmax(u)
            return None
        return FOLLOW if name in NEUTRAL_OPS or name in _VIEW_OPS + _SCALE_PATH else None

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
        return FOLLOW if name in NEUTRAL_OPS or name in _VIEW_OPS + _SCALE_PATH else None

    return bool(forward_walk(normed, step))


def _feeds_softmax(node: fx.Node) -> bool:
    """``node`` reaches a softmax within a few elementwise steps (a position bias, a mask, a view)."""
    def step(u: fx.Node, n: fx.Node) -> Any:
        name = op_name(u)
        if name in ("softmax", "_softmax", "_safe_softmax", "log_softmax"):
            return True
        return FOLLOW if name in ("add", "sub", "mul", "div", "masked_fill", "where") \
            or name in NEUTRAL_OPS + _VIEW_OPS else None

    return bool(forward_walk(node, step))


def _is_root(node: fx.Node) -> bool:
    """sqrt/rsqrt/pow(±0.5) of a tensor: where a statistic becomes a scale."""
    name = op_name(node)
    if not node.args or not isinstance(node.args[0], fx.Node):
        return False
    return name in ("rsqrt", "sqrt") or (name == "pow" and len(node.args) > 1 and node.args[1] in (0.5, -0.5))


def _feeds_from(node: Any, scale: fx.Node, depth: int = 8) -> bool:
    """True when ``node`` is ``scale`` or computed from it within a few hops (the denominator side)."""
    frontier = [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if n is scale:
                return True
            if isinstance(n, fx.Node) and n.op in ("call_function", "call_method"):
                nxt.extend(a for a in n.args if isinstance(a, fx.Node))
        frontier = nxt
    return False


def _combined(scale: fx.Node, applied: fx.Node) -> bool:
    """The scale reaches the applying node through a ``max``/``+`` with another tensor (EvoNorm-B0's
    ``max(sqrt(running_var + eps), v * x + instance_std(x))``): not a plain LayerNorm/RMSNorm."""
    frontier = [applied]
    for _ in range(8):
        nxt = []
        for n in frontier:
            for a in n.args[:2] if isinstance(n, fx.Node) else ():
                if not isinstance(a, fx.Node) or not _feeds_from(a, scale):
                    continue
                if a is scale:
                    continue
                if op_name(a) in ("maximum", "max") or (op_name(a) == "add" and all(
                        isinstance(b, fx.Node) for b in a.args[:2])):
                    return True
                nxt.append(a)
        frontier = nxt
    return False


def _add_frozen_batchnorm(root: fx.Node, frozen: tuple[fx.Node, Optional[float]], act: Optional[set],
                          add_pattern, modules) -> None:
    """A BatchNorm with frozen statistics written out (torchvision ``FrozenBatchNorm2d``: ``x * scale + shift``
    with ``scale = w * (running_var + eps).rsqrt()``): kind BatchNorm over every dim but the channel dim,
    in eval mode, running statistics tracked. Only where the per-channel size matches the activation's
    channel dim (dim 1)."""
    buf, eps = frozen
    found = _apply_to_activation(root, act) if act is not None else None
    if found is None:
        return
    applied, x, gain = found
    x_shape, n = shape(x), shape(buf)[0]
    if x_shape is None or len(x_shape) < 2 or x_shape[1] != n:
        return
    if op_name(root) == "sqrt" and op_name(applied) != "div":
        return
    dims = [d for d in range(len(x_shape)) if d != 1]
    rec = add_pattern(owner(root, modules), root, buf, applied, x, dims, True, "population", eps,
                      "inside_sqrt" if eps is not None else "none", kind="BatchNorm")
    rec.site.normalized_shape = None
    rec.site.num_channels = n
    rec.site.training, rec.site.track_running_stats = False, True
    rec.site.affine_weight = gain or None  # w folded into the scale before it is applied
    rec.hints["statistic"] = "running_var"


def _add_l2(node: fx.Node, act: Optional[set], add_pattern, modules, data: Optional[set] = None) -> None:
    """Sites from a 2-norm: Global Response Normalization; ``x / max(||x||_2 [* d ** -0.5], eps)`` and
    ``F.normalize`` as RMSNorm (up to a constant the gain absorbs) inside a module that is only a norm, or
    elsewhere when a learned parameter rescales the result (a gain, or the temperature of cosine q/k
    scores). An L2-normalised embedding with no learned scale (cosine similarity) is not a normalisation
    layer."""
    path = owner(node, modules)
    src, dims = _l2_stat(node)
    if not _is_act(src, act if data is None else data):
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
        applied = _apply_node(chain.node, src, by)
        if applied is None or op_name(applied) != by:
            return
        factors = {"l2_pre": chain.pre, "l2_post": chain.post}
    if _learned_rescale(applied, act) or (_norm_like(modules.get(path))
                                          and not _mixed_with_activation(applied, act, path, modules)):
        rec = add_pattern(path, node, node, applied, src, dims, False, "mean_square", eps, how)
        rec.hints["statistic"] = "l2_norm"
        rec.hints.update(factors)


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
                    _is_act(a, act) and a not in derived and math.prod(shape(a) or (1,)) > 1
                    and not _feeds_from(a, normed) for a in u.args[:2]):
                return True
    return False


def _retraced_frozen_batchnorm(mod: nn.Module, x: fx.Node) -> Optional[tuple[Optional[float], int, bool]]:
    """(eps, channels, a gain is multiplied in) of a frozen BatchNorm module whose buffer arithmetic symbolic tracing evaluated while
    tracing (it proxies parameters, not buffers, so ``w * (running_var + eps).rsqrt()`` is left as one
    constant): the module alone, on a meta copy, traced at the dispatcher (``make_fx`` records every op,
    buffers included), then read like an exported graph. None when it is not one (or cannot be traced)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x_shape, x_dtype = shape(x), dtype(x)
    if x_shape is None or x_dtype is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy_ = copy.deepcopy(mod).to_empty(device="meta")
            small = make_fx(copy_)(torch.empty(x_shape, dtype=x_dtype, device="meta"))
    except Exception:  # foreign code: no site rather than a crash
        return None
    act = activation_nodes(small, [n.name for n in small.graph.nodes if n.op == "placeholder"])
    for node in small.graph.nodes:
        if not _is_root(node):
            continue
        frozen = _buffer_stat(node.args[0], act)
        found = _apply_to_activation(node, act) if frozen is not None and act is not None else None
        if found is not None and shape(found[1]) == x_shape:
            return frozen[1], shape(frozen[0])[0], found[2]
    return None


def _folded_candidates(nodes: list[fx.Node], mod: Optional[nn.Module], act: Optional[set]):
    """In a module holding per-channel statistics as buffers (at least two floating 1-D buffers of one length
    C, as running_mean/running_var; children, if any, without parameters or buffers: timm's
    ``FrozenBatchNormAct2d`` holds its activation), the ``x * constant`` multiplies (symbolic tracing's folded
    buffer arithmetic) with an activation of C channels: [(mul, x)]."""
    if act is None or mod is None:
        return []
    if any(True for c in mod.children() for _ in list(c.parameters()) + list(c.buffers())):
        return []
    sizes = [b.shape[0] for b in mod.buffers(recurse=False) if b.is_floating_point() and b.dim() == 1]
    if len(sizes) < 2 or len(set(sizes)) != 1:
        return []
    out = []
    for n in nodes:
        if op_name(n) == "mul" and len(n.args) > 1:
            a, b = n.args[0], n.args[1]
            for x, c in ((a, b), (b, a)):
                if (_is_act(x, act) and isinstance(c, fx.Node) and c.op == "get_attr" and c not in act
                        and (shape(x) or (0, 0))[1:2] == (sizes[0],)):
                    out.append((n, x))
    return out


def _hand_written_sites(gm: fx.GraphModule, modules: dict, claimed: set, act: Optional[set], add_pattern,
                        data: Optional[set] = None) -> None:
    """Detector 3 of the module docstring: statistics turned into a scale by a root and applied to the tensor
    they were taken on (and the 2-norm forms, and frozen BatchNorms read off an exported graph). New sites go
    through ``add_pattern`` (the closure of :func:`discover_sites`), which also extends ``claimed``. ``data``
    (default ``act``): the nodes a statistic may be taken on (:func:`activation_nodes` with ``created``)."""
    data = act if data is None else data
    for node in gm.graph.nodes:
        if node in claimed or builtin_kind(modules.get(owner(node, modules))) is not None:
            continue
        name = op_name(node)
        stat = eps = how = None
        if _is_root(node):
            found = _find_stat(node.args[0])
            if found is None:
                frozen = _buffer_stat(node.args[0], act)
                if frozen is not None:
                    _add_frozen_batchnorm(node, frozen, act, add_pattern, modules)
                continue
            stat, eps, how = found
        elif name == "std":
            stat, eps, how = node, None, "none"
        elif _l2_stat(node) is not None:
            _add_l2(node, act, add_pattern, modules, data)
            continue
        else:
            continue
        info = _analyse_stat(stat)
        if info is None or not _is_act(info["source"], data):
            continue  # statistics of a parameter (weight standardisation) normalise no activation
        scale = node
        if name in ("std", "sqrt") or (name == "pow" and node.args[1] == 0.5):
            # eps added to the std/RMS after the root: x / (sqrt(var) + eps), x / (x.std() + eps)
            adds = [u for u in node.users if op_name(u) == "add" and scalar_operand(u) is not None]
            if adds:
                scale, eps, how = adds[0], scalar_operand(adds[0]), "outside_sqrt"
        by = "div" if name in ("sqrt", "std") or (name == "pow" and node.args[1] == 0.5) else "mul"
        applied = _apply_node(scale, info["source"], by, info["dims"], act)
        if applied is None:
            continue
        if info.get("statistic") == "l2_norm" and not _norm_like(modules.get(owner(node, modules))) \
                and not _learned_rescale(applied, act):
            continue  # x / sqrt(sum(x^2)) outside a norm module and with no gain: a cosine similarity
        other = next((a for a in applied.args[:2] if not _feeds_from(a, scale)), None)
        form = _numerator_form(other, info["source"], act)
        centered = info["centered"] if form in ("unknown", "gated") else form == "centred"
        combined = _combined(scale, applied)
        cumulative = info.get("statistic") == "cumulative"  # statistics over steps 0..t: no per-step norm
        kind = "Other" if form == "gated" or combined or cumulative else None
        group = _group_view(info["source"], info["dims"]) if kind is None and centered else None
        if group is not None and not _restored(applied, shape(group[0])):
            group = None  # the result stays in the view: a norm over the view's dims (a framed waveform)
        if group is not None:  # a hand-written GroupNorm: the site normalises the tensor before the reshape
            base, split = group
            rec = add_pattern(owner(node, modules), node, stat, applied, base, list(range(1, len(shape(base)))),
                              True, info["variance"], eps, how, kind="GroupNorm")
            _finish_group_norm(rec, split, modules)
            continue
        rec = add_pattern(owner(node, modules), node, stat, applied, info["source"], info["dims"], centered,
                          info["variance"], eps, how, kind=kind)
        if cumulative:
            rec.hints.update(statistic="cumulative", form="cumulative")
            rec.site.extra["cumulative_dim"] = info["cumulative_dim"]
        else:
            if kind == "Other":
                rec.hints["form"] = "gated" if form == "gated" else "combined"
            if "statistic" in info:
                rec.hints["statistic"] = info["statistic"]
                rec.hints["sum_of_squares"] = True


_GROUP_VIEWS = ("view", "reshape", "_unsafe_view")


def _group_view(src: Any, dims) -> Optional[tuple[fx.Node, GroupSplit]]:
    """A GroupNorm written out (Wu & He 2018, eq. 1 with S_i the group's C/G channels and all positions):
    statistics of a view of ``x`` taken over every dim but the batch dim and one group dim:
    ``x.reshape(N, G, -1)``, ``x.view(N, G, C // G, H, W)``, or channels-last ``x.view(N, H * W, G, C // G)``
    over dims (1, 3). Returns (x, how the groups divide x), or None for any other reduction.

    ``GroupSplit.dim`` is the dim of ``x`` the group dim splits (row-major: the view dims before the group
    dim cover exactly x's dims before it): the channel dim for the three forms above; an image-row axis for a
    channels-last (N, H, W, C) tensor reshaped to (N, G, -1) without moving C first. When no dim of ``x`` is
    split evenly, the groups follow the first dim whose leading product the group count divides."""
    view = strip_neutral(src)
    if not isinstance(view, fx.Node) or op_name(view) not in _GROUP_VIEWS or not view.args:
        return None
    base = strip_neutral(view.args[0])
    xs, vs = shape(base) if isinstance(base, fx.Node) else None, shape(view)
    if not xs or not vs or len(xs) < 2 or len(vs) < 3 or xs[0] != vs[0] or math.prod(vs[1:]) != math.prod(xs[1:]):
        return None
    kept = sorted(set(range(1, len(vs))) - {d % len(vs) for d in dims})
    if len(kept) != 1 or 0 in {d % len(vs) for d in dims}:
        return None
    k = kept[0]
    groups, pre, spans = vs[k], math.prod(vs[1:k]), list(range(1, len(xs)))
    if not 1 < groups < math.prod(xs[1:]):
        return None
    for j in range(1, len(xs)):
        if math.prod(xs[1:j]) == pre and xs[j] % groups == 0:
            return base, GroupSplit(groups=groups, dim=j, per_group=xs[j] // groups, spans=spans)
    if k != 1:
        return None
    before = 1
    for j in range(1, len(xs)):
        if (before * xs[j]) % groups == 0:
            return base, GroupSplit(groups=groups, dim=j, per_group=before * xs[j] // groups, spans=spans)
        before *= xs[j]
    return None


def _restored(applied: fx.Node, xs: Optional[tuple[int, ...]], hops: int = 6) -> bool:
    """True when the normalised grouped view ``applied`` is given back the layout ``xs`` of the tensor it
    views, as a GroupNorm's output is (Wu & He 2018: the groups are a temporary view of the channels): it has
    that shape already (the statistic applied to ``x`` itself), or a reshape to ``xs`` follows within a few
    casts, element-wise ops and per-group affine ops. A result that stays in the view (a waveform cut into
    frames of a fixed length, each frame standardised and read by ``nn.Linear(frame_len, hidden)``:
    MoonshineStreaming's FrameCMVN) is a norm over the view's own dims, not a grouping of ``x``'s channels."""
    if not xs:
        return False
    frontier, seen = [applied], {applied}
    for _ in range(hops):
        nxt = []
        for n in frontier:
            if tuple(shape(n) or ()) == tuple(xs):
                return True
            for user in n.users:
                name = op_name(user)
                if user not in seen and (name in NEUTRAL_OPS or name in _GROUP_VIEWS
                                         or name in ("mul", "add", "sub", "div", "contiguous")):
                    seen.add(user)
                    nxt.append(user)
        frontier = nxt
    return False


def _finish_group_norm(rec: SiteRecord, split: GroupSplit, modules: dict) -> None:
    """Group facts of a hand-written GroupNorm, and its output taken past the reshape back to the input's shape
    and the per-channel affine (``x * w.view(1, C, 1, 1) + b.view(1, C, 1, 1)``)."""
    s, xs = rec.site, shape(rec.input)
    s.num_groups, s.group_split, s.normalized_shape = split.groups, split, None
    users = [u for u in rec.output.users if not op_name(u).startswith("_assert")]
    if len(users) == 1 and op_name(users[0]) in _GROUP_VIEWS and shape(users[0]) == xs:
        out, chain = _extend_affine(users[0], s.module, modules)
        rec.output = out
        rec.nodes |= {users[0], *chain}
        s.affine_weight = any(op_name(c) == "mul" for c in chain) or s.affine_weight
        s.affine_bias = any(op_name(c) == "add" for c in chain) or s.affine_bias
        rec.hints["affine_chain"] = rec.hints.get("affine_chain", []) + [op_name(c) for c in chain]
        split.channel_dim = _affine_dim(chain, xs)
    gains = [p for p in (rec.module_obj.parameters(recurse=False) if rec.module_obj is not None else [])
             if sum(int(d) > 1 for d in p.shape) == 1]
    s.num_channels = int(gains[0].numel()) if gains else int(xs[split.dim])


def _affine_dim(chain: list[fx.Node], xs: tuple[int, ...]) -> Optional[int]:
    """The dim of an input of shape ``xs`` that the gain multiply of ``chain`` scales per position: its
    operand's shape right-aligned with ``xs`` (``w`` of shape (C,) scales the last dim, ``w.view(1, C, 1, 1)``
    dim 1). None when there is no gain multiply or it broadcasts over more than one dim."""
    for node in chain:
        if op_name(node) != "mul":
            continue
        for a in node.args[:2]:
            ws = shape(a) if isinstance(a, fx.Node) else None
            if ws is None or len(ws) > len(xs) or ws == xs:
                continue
            offset = len(xs) - len(ws)
            big = [offset + i for i, d in enumerate(ws) if d > 1]
            if len(big) == 1 and ws[big[0] - offset] == xs[big[0]]:
                return big[0]
    return None


def _folded_frozen_batchnorm_sites(owned: dict, records: list, modules: dict, act: Optional[set],
                                   add_pattern) -> None:
    """Frozen BatchNorms whose buffer arithmetic symbolic tracing folded into constants
    (:func:`_folded_candidates`, :func:`_retraced_frozen_batchnorm`), in modules with no site yet."""
    found_paths = {r.site.module for r in records}
    for path, nodes in owned.items():
        if path in found_paths:
            continue
        for mul, x in _folded_candidates(nodes, modules.get(path), act):
            got = _retraced_frozen_batchnorm(modules[path], x)
            if got is None or (shape(x) or (0, 0))[1:2] != (got[1],):
                continue
            eps, channels, gain = got
            rec = add_pattern(path, mul, mul.args[1] if mul.args[0] is x else mul.args[0], mul, x,
                              [d for d in range(len(shape(x))) if d != 1], True, "population", eps,
                              "inside_sqrt" if eps is not None else "none", kind="BatchNorm")
            rec.site.num_channels, rec.site.affine_weight = channels, gain or None
            rec.site.training, rec.site.track_running_stats = False, True
            rec.hints["statistic"] = "running_var"
            break


class _Discovery:
    """One :func:`discover_sites` pass over ``cap.gm``: the site records found so far (``records``) and the
    graph nodes they claim (``claimed``, shared with the hand-written pass so that no node is two sites)."""

    def __init__(self, cap: Capture, origins: dict[int, SourceLocation]):
        self.gm, self.modules, self.origins = cap.gm, cap.modules, origins
        self.records: list[SiteRecord] = []
        self.claimed: set[fx.Node] = set()

    def new(self, path: str, kind: str, by: str, node: fx.Node, opname: Optional[str]) -> SiteRecord:
        """A record for the norm computed in module ``path`` (``by``: module, functional or pattern) with its
        source locations; not yet in :attr:`records`."""
        mod = self.modules.get(path)
        site = Site(module=path, kind=kind, class_name=type(mod).__name__ if mod is not None else "?",
                    detected_by=by, op=opname)
        rec = SiteRecord(site=site, module_obj=mod)
        # The call: for a hand-written norm module, where its forward is called, not a line inside it.
        site.call = _location(node, skip_inner=1 if by == "pattern" and _norm_like(mod) else 0)
        site.definition = self.origins.get(id(mod)) if mod is not None else None
        # Where a fix goes: the constructor line of a norm module, the call line of a functional norm.
        site.source = (site.call or site.definition) if by == "functional" else (site.definition or site.call)
        # What computes it: the call of a functional norm; for a hand-written one the statistic's line
        # (add_pattern); nothing for a torch.nn module (torch computes it).
        site.computation = None if by == "module" else _location(node)
        site.class_module = type(mod).__module__ if mod is not None else None
        return rec

    def _keep(self, rec: SiteRecord, nodes: set[fx.Node]) -> None:
        rec.nodes |= nodes
        self.claimed |= nodes
        self.records.append(rec)

    def builtin_and_functional(self, data: set) -> set[str]:
        """Steps 1 and 2: ``torch.nn`` norm modules called as modules, and functional norm ops (``F.layer_norm``,
        ``aten.native_layer_norm``...) whose input is ``data`` (not a conv's weight: weight standardisation).
        Returns the module paths found."""
        seen: set[str] = set()
        for node in self.gm.graph.nodes:
            name = op_name(node)
            if name == "module":
                mod = self.modules.get(str(node.target))
                kind = builtin_kind(mod)
                if kind is None:
                    continue
                rec = self.new(str(node.target), kind, "module", node, type(mod).__name__)
                rec.input, rec.output = node.args[0] if node.args else None, node
                _module_facts(rec.site, mod, shape(rec.input))
            elif name in OP_KINDS and node.op == "call_function":
                if not _is_act(node.args[0] if node.args else None, data):
                    continue  # F.batch_norm over a conv's weight: weight standardisation, no activation normalised
                rec = self._functional(node, name)
            else:
                continue
            self._keep(rec, {node})
            seen.add(rec.site.module)
        return seen

    def _functional(self, node: fx.Node, name: str) -> SiteRecord:
        path = owner(node, self.modules)
        mod = self.modules.get(path)
        if builtin_kind(mod) is not None:
            rec = self.new(path, builtin_kind(mod), "module", node, name)
            _module_facts(rec.site, mod, shape(node.args[0]))
        else:
            rec = self.new(path, OP_KINDS[name], "functional", node, name)
            _functional_facts(rec.site, node, name)
        rec.input, rec.output = node.args[0], node
        return rec

    def decomposed_builtins(self, owned: dict[str, list[fx.Node]], seen: set[str]) -> None:
        """Built-in norm modules ``seen`` lacks, captured as decomposed ops (export of LocalResponseNorm): one
        site per module over the nodes it owns."""
        for path, nodes in owned.items():
            mod = self.modules.get(path)
            kind = builtin_kind(mod)
            if kind is None or path in seen or not nodes:
                continue
            node_set = set(nodes)
            first = next((a for n in nodes for a in n.args if isinstance(a, fx.Node) and a not in node_set), None)
            rec = self.new(path, kind, "module", nodes[0], type(mod).__name__)
            rec.input, rec.output = first, nodes[-1]
            _module_facts(rec.site, mod, shape(first))
            self._keep(rec, node_set)

    def add_pattern(self, path: str, node: fx.Node, stat: fx.Node, applied: fx.Node, src: fx.Node, dims,
                    centered: bool, variance: str, eps: Optional[float], how: str,
                    kind: Optional[str] = None) -> SiteRecord:
        """Record a hand-written norm: statistic ``stat`` of ``src`` over ``dims`` applied at ``applied``, with
        its affine chain after (step 3); returns the record (already kept) for the caller's hints."""
        rec = self.new(path, kind or ("LayerNorm" if centered else "RMSNorm"), "pattern", node, None)
        rec.input = strip_neutral(src)
        rec.stat = stat
        rec.site.computation = _location(stat) or rec.site.computation
        rec.site.extra["inline"] = not _norm_like(rec.module_obj)
        out, chain = _extend_affine(applied, path, self.modules)
        rec.output = out
        in_sizes = sizes(rec.input)  # a data-dependent row count (h[mask]) leaves the feature sizes known
        rec.site.reduced_dims = list(dims)
        if in_sizes is not None:
            n_dims = len(in_sizes)
            if dims and list(dims) == list(range(n_dims - len(dims), n_dims)) \
                    and all(in_sizes[d] is not None for d in dims):
                rec.site.normalized_shape = [in_sizes[d] for d in dims]
        rec.site.eps = eps
        rec.site.compute_dtype = _dtype_str(dtype(stat))
        rec.hints.update(how_eps=how, variance=variance, centered=centered,
                         applied_by=op_name(applied), affine_chain=[op_name(c) for c in chain])
        params = [p for p in (rec.module_obj.parameters(recurse=False) if rec.module_obj is not None else [])
                  if p.dim() == 1]
        rec.site.affine_weight = any(op_name(c) == "mul" for c in chain) or None
        rec.site.affine_bias = any(op_name(c) == "add" for c in chain) or (False if params else None)
        self._keep(rec, {node, stat, applied, *chain})
        return rec


def discover_sites(cap: Capture, origins: Optional[dict[int, SourceLocation]] = None) -> list[SiteRecord]:
    """Find every normalisation computation in ``cap.gm`` (see the module docstring): built-in modules and
    functional calls, built-in modules as decomposed ops, hand-written norms, frozen BatchNorms folded by
    symbolic tracing. Returns the records in graph order."""
    gm = cap.gm
    assert gm is not None
    found = _Discovery(cap, origins or {})
    owned: dict[str, list[fx.Node]] = defaultdict(list)
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            owned[owner(node, cap.modules)].append(node)
    act = activation_nodes(gm, list(cap.user_inputs))
    # what a statistic must be taken on to be a norm: data, the inputs' or data the forward made itself
    data = activation_nodes(gm, list(cap.user_inputs), created=True)
    seen = found.builtin_and_functional(data)  # 1 + 2
    found.decomposed_builtins(owned, seen)
    # 3: hand-written norms; 4: frozen BatchNorms folded by symbolic tracing
    _hand_written_sites(gm, cap.modules, found.claimed, act, found.add_pattern, data)
    _folded_frozen_batchnorm_sites(owned, found.records, cap.modules, act, found.add_pattern)
    records = found.records
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    records.sort(key=lambda r: min((order[n] for n in r.nodes), default=len(order)))
    _finish(records)
    return records


def _finish(records: list[SiteRecord]) -> None:
    """Number repeated calls per module and fill shape facts (records are in graph order)."""
    counts: dict[str, int] = defaultdict(int)
    for rec in records:
        s = rec.site
        s.call_index = counts[s.module]
        counts[s.module] += 1
        # sizes, not shape: a data-dependent size (h[mask]) leaves rank, dtype and the other sizes known
        in_sizes = sizes(rec.input) if rec.input is not None else None
        if in_sizes is not None:
            if None not in in_sizes:
                s.input_shape = list(in_sizes)
            s.input_dtype = _dtype_str(dtype(rec.input))
            if s.reduced_dims is None:
                n = len(s.normalized_shape or [1])
                s.reduced_dims = reduced_dims_for(s.kind, len(in_sizes), n)
            if s.kind == "GroupNorm" and s.num_channels is None and len(in_sizes) > 1:
                s.num_channels = in_sizes[1]
        _resolve_default_eps(s)
        if s.compute_dtype is None and s.input_dtype is not None:
            fused = s.detected_by in ("module", "functional")
            if fused and s.input_dtype in ("float16", "bfloat16"):
                s.compute_dtype = "float32"
            else:
                s.compute_dtype = s.input_dtype


_FLOAT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}


def _resolve_default_eps(site: Site) -> None:
    """``nn.RMSNorm(d)`` / ``F.rms_norm(x, shape)`` with ``eps=None``: PyTorch substitutes
    ``torch.finfo(x.dtype).eps`` (torch.nn.RMSNorm docs), so the eps used depends on the input dtype
    (1.19e-07 in float32, 9.77e-04 in float16, 7.81e-03 in bfloat16). Store that effective value in
    ``site.eps`` (CONTRACT.md) and keep ``extra["eps_default"]`` saying where it came from."""
    if site.kind != "RMSNorm" or site.eps is not None or site.detected_by not in ("module", "functional"):
        return
    if site.detected_by == "functional" and site.op != "rms_norm":
        return
    dt = _FLOAT_DTYPES.get(site.input_dtype or "")
    if dt is None:
        return
    site.eps = float(torch.finfo(dt).eps)
    site.extra["eps_default"] = "torch.finfo(input dtype).eps"
    site.extra["eps_default_dtype"] = site.input_dtype


def walk_modules(modules: dict[str, nn.Module], origins: Optional[dict[int, SourceLocation]] = None) -> list[SiteRecord]:
    """Fallback when no capture worked: norms found by walking ``named_modules()``
    (:func:`normaudit.vocabulary.kinds.norm_modules`: built-ins by class, hand-written ones by a class name
    containing 'norm' and 1-D parameters), each a site with the eps its module holds."""
    origins = origins or {}
    out = []
    for path, mod, kind in norm_modules(modules):
        site = Site(module=path, kind=kind, class_name=type(mod).__name__, detected_by="module_walk",
                    source=origins.get(id(mod)), definition=origins.get(id(mod)))
        if builtin_kind(mod) is not None:
            _module_facts(site, mod, None)
        else:
            for attr in ("eps", "variance_epsilon", "epsilon"):
                v = getattr(mod, attr, None)
                if isinstance(v, float):
                    site.eps = v
                    break
        out.append(SiteRecord(site=site, module_obj=mod))
    return out
