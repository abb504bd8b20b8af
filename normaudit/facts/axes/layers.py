"""Labels through layers and element-wise ops: broadcasting (the default for ops not followed
explicitly, :func:`fallback_dims`), linear/matmul/einsum (feature axis), embedding, convolution (channel axis),
scaled-dot-product attention, torch.nn modules called as ``call_module`` (symbolic tracing keeps leaf modules
as calls), and writes into a buffer at given indices (:func:`write_into`)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import fx, nn

from normaudit.facts.axes.dims import Dim, is_unknown, named_dim, resized, same_dims, tensor_unknowns, unknown_dim, \
    unknown_dims
from normaudit.facts.axes.ops import ELEMENTWISE, LAYOUT_KEEPING, is_aten
from normaudit.facts.axes.views import reshape_dims
from normaudit.vocabulary.graph import arg, op_name, shape, tensor_inputs, val


def broadcast_dims(out_shape: Sequence[int], inputs: Sequence[Optional[list[Dim]]],
               in_shapes: Sequence[Optional[Sequence[int]]]) -> list[Dim]:
    """Elementwise broadcasting: each output dim takes the first known label among inputs of that size."""
    rank = len(out_shape)
    result: list[Optional[Dim]] = [None] * rank
    for labs, ishp in zip(inputs, in_shapes):
        if labs is None or ishp is None or len(labs) != len(ishp) or len(ishp) > rank:
            continue
        off = rank - len(ishp)
        for k, d in enumerate(labs):
            j = off + k
            if ishp[k] == out_shape[j] and (result[j] is None or (is_unknown(result[j]) and not is_unknown(d))):
                if out_shape[j] != 1 or result[j] is None:
                    result[j] = d
    return [r if r is not None else unknown_dim(s) for r, s in zip(result, out_shape)]


def _matmul(x: Optional[list[Dim]], y: Optional[list[Dim]], out_shape: Sequence[int],
            xs: Optional[Sequence[int]], ys: Optional[Sequence[int]]) -> list[Dim]:
    """``x @ y``: batch dims broadcast, rows from ``x``, columns from ``y`` (a weight's columns: feature)."""
    r = len(out_shape)
    x = x if x is not None and xs is not None else ([unknown_dim(s) for s in xs] if xs is not None else None)
    y = y if y is not None and ys is not None else ([unknown_dim(s) for s in ys] if ys is not None else None)
    if x is None or y is None or not x or not y:
        return [unknown_dim(s) for s in out_shape]
    if len(y) == 1:
        return broadcast_dims(out_shape, [x[:-1]], [list(xs)[:-1]])
    last = y[-1] if not is_unknown(y[-1]) else named_dim("feature", out_shape[-1])
    if len(x) == 1:
        return (y[:-2] + [last])[-r:]
    row = x[-2] if not is_unknown(x[-2]) or any(not is_unknown(d) for d in x) else named_dim("feature", xs[-2])
    batch = broadcast_dims(list(out_shape[:-2]), [x[:-2], y[:-2]], [list(xs[:-2]), list(ys[:-2])]) if r > 2 else []
    return batch + [resized(row, out_shape[-2]), resized(last, out_shape[-1])]


def _einsum(eq: str, operands: list[Optional[list[Dim]]], shapes: list, out_shape: Sequence[int]) -> list[Dim]:
    """``torch.einsum``: each output letter takes the dims its letter had in an operand."""
    eq = eq.replace(" ", "")
    if "..." in eq or "->" not in eq:
        return [unknown_dim(s) for s in out_shape]
    lhs, rhs = eq.split("->")
    specs = lhs.split(",")
    letters: dict[str, Dim] = {}
    for spec, labs, shp in zip(specs, operands, shapes):
        if labs is None or len(labs) != len(spec):
            continue
        for ch, d in zip(spec, labs):
            if ch not in letters or (is_unknown(letters[ch]) and not is_unknown(d)):
                letters[ch] = d
    out = []
    for ch, s in zip(rhs, out_shape):
        d = letters.get(ch)
        out.append(resized(d, s) if d is not None else unknown_dim(s))
    if len(out) != len(out_shape):
        return [unknown_dim(s) for s in out_shape]
    # a contraction against a weight (unknown) leaves its new letters as features
    return out


def _conv(x: list[Dim], out_shape: Sequence[int], n_spatial: Optional[int]) -> list[Dim]:
    """Convolution: the channel axis becomes ``channel`` (size C_out); spatial axes keep their labels."""
    r = len(out_shape)
    n_spatial = n_spatial if n_spatial is not None else max(r - 2, 1)
    c = r - n_spatial - 1  # channel dim: 1 when batched, 0 unbatched
    if c < 0 or len(x) != r:
        return [unknown_dim(s) for s in out_shape]
    out = same_dims(x, out_shape)
    out[c] = named_dim("channel", out_shape[c])
    return out


def _seq_module(mod: nn.Module, x: list[Dim], node: fx.Node) -> Any:
    """Labels of an RNN/LSTM/GRU call: (output, hidden state(s))."""
    v = val(node)
    if not isinstance(v, (tuple, list)) or not v or not isinstance(v[0], torch.Tensor):
        return None
    out0 = v[0]
    first = same_dims(x[:-1], tuple(out0.shape)[:-1]) + [named_dim("feature", out0.shape[-1])] \
        if len(x) == out0.dim() else [unknown_dim(s) for s in out0.shape]
    rest = tuple(tensor_unknowns(t) for t in v[1:])
    return (first,) + rest


def module_dims(node: fx.Node, mod: Optional[nn.Module], x: Optional[list[Dim]], env: dict) -> Any:
    """Labels of a ``call_module`` node (symbolic trace keeps torch.nn leaf modules as calls)."""
    out_shape = shape(node)
    ins = tensor_inputs(node)
    in_shape = shape(ins[0]) if ins else None
    if mod is None:
        return fallback_dims(node, env)
    if isinstance(mod, nn.MultiheadAttention) and x is not None:
        v = val(node)
        first = list(x)
        if isinstance(v, (tuple, list)) and v and isinstance(v[0], torch.Tensor) and len(x) == v[0].dim():
            first = same_dims(x, tuple(v[0].shape))
        return (first,) + tuple(tensor_unknowns(t) for t in (v[1:] if isinstance(v, (tuple, list)) else ()))
    if isinstance(mod, nn.RNNBase) and x is not None:
        return _seq_module(mod, x, node)
    if out_shape is None:
        return tensor_unknowns(val(node))
    if x is None:
        return unknown_dims(out_shape)
    if isinstance(mod, (nn.Linear, nn.Bilinear, nn.LazyLinear)) and len(x) == len(out_shape):
        return same_dims(x[:-1], out_shape[:-1]) + [named_dim("feature", out_shape[-1])]
    if isinstance(mod, (nn.Embedding,)):
        return same_dims(x, out_shape[:-1]) + [named_dim("feature", out_shape[-1])] if len(x) + 1 == len(out_shape) \
            else unknown_dims(out_shape)
    if isinstance(mod, nn.EmbeddingBag):
        return [named_dim("batch", out_shape[0]), named_dim("feature", out_shape[-1])] if len(out_shape) == 2 \
            else unknown_dims(out_shape)
    if isinstance(mod, nn.modules.conv._ConvNd):
        return _conv(x, out_shape, mod.weight.dim() - 2 if getattr(mod, "weight", None) is not None else None)
    if isinstance(mod, (nn.Flatten, nn.Unflatten)) and in_shape is not None:
        return reshape_dims(x, out_shape)
    if len(x) == len(out_shape) and LAYOUT_KEEPING.search(type(mod).__name__.lower()):
        return same_dims(x, out_shape)
    return fallback_dims(node, env)


def fallback_dims(node: fx.Node, env: dict, params: Optional[set] = None) -> Optional[list[Dim]]:
    """Elementwise broadcasting over the tensor inputs (the default for ops not followed explicitly).

    A last dim that only a parameter provides, broadcast against a size-1 dim of a labelled input
    (``x.unsqueeze(-1) * W``: numeric features turned into embeddings), is a ``feature`` dim.
    """
    out_shape = shape(node)
    if out_shape is None:
        return tensor_unknowns(val(node))
    ins = [n for n in tensor_inputs(node) if isinstance(env.get(n), list)]
    floats = [n for n in ins if _floating(n)]
    if floats and isinstance(val(node), torch.Tensor) and val(node).is_floating_point():
        ins = floats  # integer/bool operands of a float result are indices or masks, not its layout
    out = broadcast_dims(out_shape, [env.get(n) for n in ins], [shape(n) for n in ins])
    if params and out and out_shape[-1] > 1 and is_unknown(out[-1]) and op_name(node) in ELEMENTWISE:
        from_param = any(n in params and shape(n) and shape(n)[-1] == out_shape[-1] for n in ins)
        expanded = any(n not in params and shape(n) and shape(n)[-1] == 1 and any(not is_unknown(d) for d in env[n])
                       for n in ins)
        if from_param and expanded:
            out[-1] = named_dim("feature", out_shape[-1])
    return out


#: ops that write values into their first input at given indices (the output is that input, updated): the
#: index tensors are positions, not data laid out like the output
WRITE_INTO = ("index_add", "index_copy", "index_fill", "index_put", "index_reduce", "scatter", "scatter_add",
               "scatter_reduce", "masked_fill", "masked_scatter", "put", "slice_scatter", "select_scatter")


def write_into(node: fx.Node, ins: list, env: dict, out_shape: Sequence[int]) -> list[Dim]:
    """Labels of ``self.index_add_(dim, index, source)`` and its kin: ``self``'s labels; where those are
    unknown (a ``zeros`` buffer sized from the input, as in a mixture-of-experts combine), the labels of a
    floating-point source of the same rank at the same dim and size, except the indexed dim (tokens routed
    to an expert are not the buffer's rows in order). Integer/bool inputs (indices, masks) never label it."""
    base = env.get(ins[0])
    out = list(base) if isinstance(base, list) and len(base) == len(out_shape) else [unknown_dim(s) for s in out_shape]
    indexed = arg(node, 1, "dim", None)
    indexed = indexed % len(out_shape) if isinstance(indexed, int) and out_shape else None
    for src in ins[1:]:
        labs, shp, v = env.get(src), shape(src), val(src)
        if not isinstance(labs, list) or shp is None or len(shp) != len(out_shape):
            continue
        if isinstance(v, torch.Tensor) and not v.is_floating_point():
            continue
        for k, (d, size) in enumerate(zip(labs, shp)):
            if k != indexed and is_unknown(out[k]) and not is_unknown(d) and int(size) == int(out_shape[k]):
                out[k] = d
    return [resized(d, s) for d, s in zip(out, out_shape)]


def _floating(node: fx.Node) -> bool:
    v = val(node)
    return not isinstance(v, torch.Tensor) or v.is_floating_point()


def dense_dims(node: fx.Node, name: str, raw: str, ins: list, x: Optional[list[Dim]],
                in_shape: Optional[Sequence[int]], out_shape: Sequence[int], env: dict) -> Optional[list[Dim]]:
    """Labels of casts and copies, linear/matmul/einsum, embedding, convolution and attention; None for any
    other op (or when their operands' labels are missing)."""
    if name in ("to", "alias", "dropout") or raw in ("contiguous", "clone", "detach", "requires_grad_",
                                                       "zeros_like", "ones_like", "empty_like", "full_like",
                                                       "rand_like", "randn_like", "new_empty", "lift_fresh"):
        if x is not None and len(x) == len(out_shape) and tuple(in_shape or ()) == tuple(out_shape):
            return list(x)
    if name == "linear" and out_shape:
        src = node.args[1] if raw == "addmm" and len(node.args) > 1 else (ins[0] if ins else None)
        xs = env.get(src) if isinstance(src, fx.Node) else None
        if isinstance(xs, list) and len(xs) == len(out_shape):
            return same_dims(xs[:-1], out_shape[:-1]) + [named_dim("feature", out_shape[-1])]
        return unknown_dims(out_shape[:-1]) + [named_dim("feature", out_shape[-1])]
    if name in ("matmul", "baddbmm") or raw in ("baddbmm", "addbmm"):
        a, b = (node.args[1], node.args[2]) if raw in ("baddbmm", "addbmm") else (node.args[0], node.args[1])
        if isinstance(a, fx.Node) and isinstance(b, fx.Node):
            la, lb = env.get(a), env.get(b)
            return _matmul(la if isinstance(la, list) else None, lb if isinstance(lb, list) else None,
                           out_shape, shape(a), shape(b))
    if name == "einsum":
        eq = node.args[0] if node.args and isinstance(node.args[0], str) else arg(node, 0, "equation", None)
        ops = node.args[1:]
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = ops[0]
        if isinstance(eq, str):
            labs = [env.get(o) if isinstance(o, fx.Node) and isinstance(env.get(o), list) else None for o in ops]
            return _einsum(eq, labs, [shape(o) for o in ops], out_shape)
    if name == "embedding":
        idx = node.args[1] if is_aten(node) else node.args[0]
        labs = env.get(idx) if isinstance(idx, fx.Node) else None
        if isinstance(labs, list) and len(labs) + 1 == len(out_shape):
            return same_dims(labs, out_shape[:-1]) + [named_dim("feature", out_shape[-1])]
        return unknown_dims(out_shape[:-1]) + [named_dim("feature", out_shape[-1])]
    if name == "conv" and x is not None:
        w = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
        ws = shape(w) if isinstance(w, fx.Node) else None
        return _conv(x, out_shape, len(ws) - 2 if ws is not None else None)
    if name == "sdpa" and x is not None:
        v_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("value")
        vl = env.get(v_node) if isinstance(v_node, fx.Node) else None
        last = vl[-1] if isinstance(vl, list) and vl else named_dim("feature", out_shape[-1])
        if len(x) == len(out_shape):
            return same_dims(x[:-1], out_shape[:-1]) + [resized(last, out_shape[-1])]
    return None
