"""Norm sites that exporters emit as chains of elementary ops rather than one operator (a hand-written norm,
``nn.RMSNorm`` below opset 23, LayerNorm below opset 17):

- LayerNorm: ``d = x - ReduceMean(x)``; ``v = ReduceMean(Pow(d, 2))`` (or ``Mul(d, d)``);
  ``y = d / Sqrt(v + eps)`` (or ``d * Reciprocal(Sqrt(v + eps))``, ``d * (1 / Sqrt(v + eps))``);
- RMSNorm: the same without the mean: ``v = ReduceMean(Pow(x, 2))``, ``y = x / Sqrt(v + eps)``;

casts between the steps allowed (``x.float()`` before the statistics, ``.to(dtype)`` after), and eps added
after the root (``d / (Sqrt(v) + eps)``: ``eps_position`` ``outside_sqrt``) or not at all (``none``: the
optimiser of ``torch.onnx.export`` drops ``+ eps`` when eps rounds to 0 in a float16 graph). The gain multiply
and bias add that follow are the site's affine map. Anchored on each ``Sqrt`` of a mean of squares.
"""
from __future__ import annotations

from typing import Any, Optional

from normaudit.facts.onnx_graph.fused import clean_eps
from normaudit.facts.onnx_graph.record import HALF, OnnxSiteRecord, affine_after, other_input, strip_casts
from normaudit.loaders.onnx_file import OnnxGraph
from normaudit.report import Formula, Site


def reduce_axes(g: OnnxGraph, node: Any, rank: Optional[int]) -> Optional[list[int]]:
    """The dims a ``ReduceMean`` reduces, modulo ``rank`` and sorted (the ``axes`` attribute before opset 18,
    the second input from 18); every dim when none are given; None when unknown."""
    axes = g.attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        arr = g.const(node.input[1], max_elements=64)
        axes = None if arr is None else [int(a) for a in arr.reshape(-1)]
        if axes is None:
            return None
    if rank is None:
        return None
    if not axes:
        return list(range(rank))
    if not isinstance(axes, list) or not all(isinstance(a, int) and -rank <= a < rank for a in axes):
        return None
    return sorted({a % rank for a in axes})


def _square_of(g: OnnxGraph, value: str) -> Optional[str]:
    """``z`` when ``value`` is ``Pow(z, 2)`` or ``Mul(z, z)``, else None."""
    node = g.node_of(value)
    op = g.op(value)
    if op == "Pow" and len(node.input) == 2 and g.scalar(node.input[1]) == 2.0:
        return node.input[0]
    if op == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return node.input[0]
    return None


def _statistic(g: OnnxGraph, value: str) -> Optional[tuple[int, str, list[int], int]]:
    """(index of the ReduceMean, the value squared, its reduced dims, index of the square) when ``value`` is a
    mean of squares."""
    value = strip_casts(g, value)
    if g.op(value) != "ReduceMean":
        return None
    i = g.producer[value]
    node = g.nodes[i]
    if not node.input or not node.input[0]:
        return None
    square = strip_casts(g, node.input[0])
    z = _square_of(g, square)
    if z is None:
        return None
    dims = reduce_axes(g, node, g.rank(node.input[0]))
    return (i, z, dims, g.producer[square]) if dims is not None else None


def _centred(g: OnnxGraph, z: str, dims: list[int], nodes: list[int]) -> Optional[str]:
    """``x`` when ``z`` is ``x - ReduceMean(x)`` over ``dims`` (casts allowed on either side), else None; the
    Sub and the mean are appended to ``nodes``."""
    node = g.node_of(strip_casts(g, z))
    if node is None or g.op(strip_casts(g, z)) != "Sub" or len(node.input) != 2:
        return None
    x, m = node.input
    mean = g.node_of(strip_casts(g, m))
    if mean is None or g.op(strip_casts(g, m)) != "ReduceMean" or not mean.input:
        return None
    if strip_casts(g, mean.input[0]) != strip_casts(g, x):
        return None
    if reduce_axes(g, mean, g.rank(mean.input[0])) != dims:
        return None
    nodes.extend([g.producer[strip_casts(g, z)], g.producer[strip_casts(g, m)]])
    return x


def _eps_before(g: OnnxGraph, value: str) -> tuple[Optional[str], str, Optional[int]]:
    """(the eps value, the statistic value, the Add's index) for a Sqrt input ``Add(v, eps)``; (None, value,
    None) when nothing is added."""
    stripped = strip_casts(g, value)
    node = g.node_of(stripped)
    if g.op(stripped) == "Add" and len(node.input) == 2:
        for v, e in (node.input, reversed(node.input)):
            if g.scalar(e) is not None and g.scalar(v) is None:
                return e, v, g.producer[stripped]
    return None, value, None


def _divides(g: OnnxGraph, root: str, num: str, nodes: list[int]) -> Optional[str]:
    """The normalised value: ``num / root``, ``num * Reciprocal(root)`` or ``num * (1 / root)``, casts between;
    None when ``root`` divides nothing that is ``num``."""
    target = strip_casts(g, num)
    for u in g.users(root):
        node = g.nodes[u]
        if not g.standard(u):
            continue
        if node.op_type == "Div" and len(node.input) == 2 and node.input[1] == root \
                and strip_casts(g, node.input[0]) == target:
            nodes.append(u)
            return node.output[0]
        inverse = node.op_type == "Reciprocal" or (node.op_type == "Div" and len(node.input) == 2
                                                   and node.input[1] == root and g.scalar(node.input[0]) == 1.0)
        if not inverse:
            continue
        for w in g.users(node.output[0]):
            other = other_input(g.nodes[w], node.output[0]) if g.nodes[w].op_type == "Mul" else None
            if other is not None and strip_casts(g, other) == target:
                nodes.extend([u, w])
                return g.nodes[w].output[0]
    return None


def _eps_after(g: OnnxGraph, root: str) -> Optional[tuple[str, int]]:
    """(eps value, Add index) when the root's only use is ``Sqrt(v) + eps`` (eps outside the root)."""
    users = g.users(root)
    if len(users) == 1 and g.nodes[users[0]].op_type == "Add":
        e = other_input(g.nodes[users[0]], root)
        if e is not None and g.scalar(e) is not None:
            return e, users[0]
    return None


def _eps_of(g: OnnxGraph, e: Optional[str]) -> Optional[float]:
    """The eps an ``Add`` adds, in the dtype the constant is stored in (:func:`clean_eps`)."""
    if e is None:
        return None
    src = g.tensor_source(e)
    return clean_eps(g.scalar(e), g.store.dtype(src) if src else None)


def chain_site(g: OnnxGraph, i: int) -> Optional[OnnxSiteRecord]:
    """The decomposed norm whose square root is node ``i`` (see the module docstring), or None."""
    sqrt = g.nodes[i]
    if sqrt.op_type != "Sqrt" or not g.standard(i) or not sqrt.input or not sqrt.input[0] or not sqrt.output:
        return None
    e, v, add = _eps_before(g, sqrt.input[0])
    stat = _statistic(g, v)
    if stat is None:
        return None
    r, z, dims, square = stat
    nodes = [r, i, square] + ([add] if add is not None else [])
    x = _centred(g, z, dims, nodes)
    root, position = sqrt.output[0], "inside_sqrt" if e is not None else "none"
    after = _eps_after(g, root) if e is None else None
    if after is not None:
        e, position = after[0], "outside_sqrt"
        nodes.append(after[1])
        root = g.nodes[after[1]].output[0]
    y = _divides(g, root, z, nodes)
    if y is None:
        return None
    gain, bias, form, out = affine_after(g, y, nodes, allow_bias=x is not None)
    kind = "LayerNorm" if x is not None else "RMSNorm"
    return _record(g, r, kind, strip_casts(g, x if x is not None else z), dims, e, position, nodes,
                   (gain, bias, form, out), add if position == "inside_sqrt" else (after[1] if after else None))


def _record(g: OnnxGraph, r: int, kind: str, inp: str, dims: list[int], e: Optional[str], position: str,
            nodes: list[int], affine: tuple, add: Optional[int]) -> OnnxSiteRecord:
    """The record of a decomposed norm found by :func:`chain_site`."""
    gain, bias, form, out = affine
    stats = g.dtype(g.nodes[r].output[0])
    eps_dtype = g.dtype(g.nodes[add].output[0]) if add is not None else stats
    shape = g.shape(inp)
    ints = shape if shape is not None and all(isinstance(d, int) for d in shape) else None
    site = Site(module=g.labels[r], kind=kind, class_name=f"decomposed {kind}", detected_by="onnx", op="decomposed",
                eps=_eps_of(g, e), reduced_dims=dims, input_shape=ints, input_dtype=g.dtype(inp),
                output_dtype=g.dtype(out), compute_dtype=stats, affine_weight=form != "none",
                affine_bias=bias is not None)
    if ints is not None:
        site.normalized_shape = [ints[d] for d in dims]
    rms = kind == "RMSNorm"
    upcast = (stats not in HALF) if site.input_dtype in HALF and stats else None
    site.formula = Formula(mean_subtracted=not rms, variance="mean_square" if rms else "population",
                           eps_position=position, gain=form, bias=bias is not None, stats_dtype=stats, upcast=upcast,
                           eps_dtype=eps_dtype, text=_text(rms, position, form, bias is not None))
    return OnnxSiteRecord(site=site, anchor=r, nodes=sorted(set(nodes)), inp=inp, out=out, gain=gain, bias=bias,
                          gain_form=form, eps_missing=position == "none",
                          statistic="mean_square" if rms else "variance", eps_dtype=eps_dtype,
                          eps_basis="dtype of the + eps node" if add is not None else "dtype of the statistic")


def _text(rms: bool, position: str, form: str, bias: bool) -> str:
    """``(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * w + b`` and its variants, in words of the graph."""
    num = "x" if rms else "(x - mean(x))"
    stat = "mean(x^2)" if rms else "mean((x - mean(x))^2)"
    root = {"inside_sqrt": f"sqrt({stat} + eps)", "outside_sqrt": f"(sqrt({stat}) + eps)"}.get(position, f"sqrt({stat})")
    gain = {"weight": " * w", "one_plus_weight": " * (1 + w)"}.get(form, "")
    return f"{num} / {root}{gain}" + (" + b" if bias else "")
