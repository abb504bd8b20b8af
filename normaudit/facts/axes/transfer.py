"""The labels of one graph node from the labels of its inputs (:func:`transfer_dims`): it dispatches to the
layer, layout and write rules (:mod:`.layers`, :mod:`.views`) and handles getitem, ops with several outputs
(split/chunk/unbind, the fused norms' (output, mean, rstd), values and indices), reductions, cat/stack and
ops that keep the layout at other sizes (slicing, padding, pooling)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import fx

from normaudit.capture import Capture
from normaudit.facts.axes.dims import Dim, is_unknown, resized, same_dims, tensor_unknowns, unknown_dim, unknown_dims
from normaudit.facts.axes.layers import WRITE_INTO, broadcast_dims, dense_dims, fallback_dims, module_dims, \
    write_into
from normaudit.facts.axes.ops import LAYOUT_KEEPING, raw_name
from normaudit.facts.axes.views import layout_dims
from normaudit.vocabulary.graph import arg, op_name, reduction, shape, tensor_inputs, val


_NORM_TUPLE_OPS = ("layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm")
_SPLIT_OPS = ("split", "split_with_sizes", "chunk", "tensor_split", "unsafe_split", "unsafe_chunk",
              "unsafe_split_with_sizes")


def transfer_dims(node: fx.Node, cap: Capture, env: dict, params: Optional[set] = None) -> Any:
    """Labels of one non-placeholder node from the labels of its inputs (``params``: the nodes holding
    parameters and buffers): getitem, several outputs, dense layers, writes into a buffer, layout ops,
    reductions and joins, else element-wise broadcasting (:func:`fallback_dims`)."""
    name = op_name(node)
    out_shape = shape(node)
    if name in ("get_attr", "output"):
        return unknown_dims(out_shape)
    ins = tensor_inputs(node)
    x0 = env.get(ins[0]) if ins else None
    x = x0 if isinstance(x0, list) else None
    in_shape = shape(ins[0]) if ins else None
    if x is not None and in_shape is not None and len(x) != len(in_shape):
        x = None
    raw = raw_name(node)

    if name == "module":
        return module_dims(node, cap.modules.get(str(node.target)), x, env)
    if name == "getitem":
        return _getitem_dims(node, env, out_shape)
    if out_shape is None:  # several outputs
        return _multi_output_dims(node, name, raw, x, in_shape)
    dims = dense_dims(node, name, raw, ins, x, in_shape, out_shape, env)
    if dims is not None:
        return dims
    if raw.rstrip("_") in WRITE_INTO and ins and tuple(in_shape or ()) == tuple(out_shape):
        return write_into(node, ins, env, out_shape)
    if x is None:
        return fallback_dims(node, env, params)
    dims = layout_dims(node, name, raw, x, out_shape, cap, params)
    if dims is None:
        dims = _reduced_or_joined_dims(node, name, raw, x, in_shape, out_shape, env)
    return dims if dims is not None else fallback_dims(node, env, params)


def _getitem_dims(node: fx.Node, env: dict, out_shape: Optional[Sequence[int]]) -> Any:
    """Labels of ``x[idx]``: an element of a tuple output, or an indexed tensor (:func:`_index`)."""
    src, idx = node.args[0], node.args[1]
    base = env.get(src)
    if isinstance(base, tuple) and isinstance(idx, int):
        return base[idx] if -len(base) <= idx < len(base) else None
    if isinstance(base, list) and out_shape is not None and shape(src) is not None:
        return _index(base, idx, out_shape)
    return unknown_dims(out_shape) if out_shape is not None else tensor_unknowns(val(node))


def _index(x: list[Dim], idx: Any, out_shape: Sequence[int]) -> list[Dim]:
    """Dims after ``x[idx]`` for int/slice/None/Ellipsis indexing (advanced indexing: unknown)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    out: list[Dim] = []
    k = 0
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    for i in idx:
        if i is None:
            out.append(unknown_dim(1))
        elif i is Ellipsis:
            take = len(x) - n_real
            out.extend(x[k:k + take])
            k += take
        elif isinstance(i, int):
            k += 1
        elif isinstance(i, slice):
            out.append(x[k] if k < len(x) else unknown_dim(1))
            k += 1
        else:
            return [unknown_dim(s) for s in out_shape]
    out.extend(x[k:])
    if len(out) != len(out_shape):
        return [unknown_dim(s) for s in out_shape]
    return same_dims(out, out_shape)


def _multi_output_dims(node: fx.Node, name: str, raw: str, x: Optional[list[Dim]],
                       in_shape: Optional[Sequence[int]]) -> Any:
    """Labels of an op with several outputs (a tuple of dims lists): split/chunk, unbind, the fused norms'
    (output, mean, rstd), reductions returning values and indices, else outputs shaped like the input."""
    v = val(node)
    if not isinstance(v, (tuple, list)):
        return None
    if x is not None and (name in _SPLIT_OPS or raw in _SPLIT_OPS):
        return tuple(same_dims(x, tuple(t.shape)) if isinstance(t, torch.Tensor) and t.dim() == len(x)
                     else tensor_unknowns(t) for t in v)
    if x is not None and raw in ("unbind", "unstack"):
        d = int(arg(node, 1, "dim", 0)) % len(x)
        rest = x[:d] + x[d + 1:]
        return tuple(same_dims(rest, tuple(t.shape)) if isinstance(t, torch.Tensor) and t.dim() == len(rest)
                     else tensor_unknowns(t) for t in v)
    if x is not None and name in _NORM_TUPLE_OPS:
        first = list(x) if isinstance(v[0], torch.Tensor) and tuple(v[0].shape) == tuple(in_shape or ()) \
            else tensor_unknowns(v[0])
        return (first,) + tuple(tensor_unknowns(t) for t in v[1:])
    if x is not None and raw in ("max", "min", "sort", "topk", "kthvalue", "mode", "median", "var_mean",
                                 "std_mean", "aminmax", "cummax", "cummin"):
        return _reduced_outputs(node, x, v)
    return tuple(same_dims(x, tuple(t.shape)) if x is not None and isinstance(t, torch.Tensor)
                 and tuple(t.shape) == tuple(in_shape or ()) else tensor_unknowns(t) for t in v)


def _reduced_outputs(node: fx.Node, x: list[Dim], v: Sequence[Any]) -> tuple:
    """Labels of the outputs of ``max``/``min``/``sort``/``topk``/``var_mean``... along some dims of ``x``."""
    red = reduction(node)
    outs = []
    for t in v:
        if not isinstance(t, torch.Tensor):
            outs.append(None)
        elif t.dim() == len(x):
            outs.append(same_dims(x, tuple(t.shape)) if red is None or red.keepdim
                        else [unknown_dim(s) for s in t.shape])
        elif red is not None and t.dim() == len(x) - len(red.dims):
            outs.append(same_dims([d for k, d in enumerate(x) if k not in red.dims], tuple(t.shape)))
        elif t.dim() == len(x) - 1 and isinstance(arg(node, 1, "dim", None), int):
            d = int(arg(node, 1, "dim")) % len(x)
            outs.append(same_dims(x[:d] + x[d + 1:], tuple(t.shape)))
        else:
            outs.append(tensor_unknowns(t))
    return tuple(outs)


def _reduced_or_joined_dims(node: fx.Node, name: str, raw: str, x: list[Dim], in_shape: Optional[Sequence[int]],
                            out_shape: Sequence[int], env: dict) -> Optional[list[Dim]]:
    """Labels after a reduction, an arg-reduction, cat/stack, or an op that keeps the layout at other sizes
    (slicing, padding, pooling); None for any other op."""
    rank = len(x)
    red = reduction(node)
    if red is not None:
        if red.keepdim or len(out_shape) == rank:
            return [unknown_dim(1) if k in red.dims else d for k, d in enumerate(x)]
        kept = [d for k, d in enumerate(x) if k not in red.dims]
        return kept if len(kept) == len(out_shape) else unknown_dims(out_shape)
    if raw in ("argmax", "argmin", "logsumexp", "prod", "all", "any", "count_nonzero", "nansum", "nanmean") \
            and len(out_shape) < rank:
        d = arg(node, 1, "dim", None)
        if isinstance(d, int):
            d = d % rank
            return same_dims(x[:d] + x[d + 1:], out_shape)
    if name in ("cat", "concat", "concatenate") and node.args and isinstance(node.args[0], (list, tuple)):
        parts = [(env.get(a), shape(a)) for a in node.args[0] if isinstance(a, fx.Node)]
        parts = [(p, s) for p, s in parts if isinstance(p, list) and s is not None and len(p) == len(out_shape)]
        if parts:
            d = int(arg(node, 1, "dim", 0)) % len(out_shape)
            res = []
            for k, s in enumerate(out_shape):
                cands = [p[k] for p, _ in parts]
                known = [c for c in cands if not is_unknown(c)]
                res.append(resized((known or cands)[0], s) if k == d else
                           broadcast_dims([s], [[c] for c in cands], [[ps[k]] for _, ps in parts])[0])
            return res
    if name == "stack" and node.args and isinstance(node.args[0], (list, tuple)):
        first = next((env.get(a) for a in node.args[0] if isinstance(a, fx.Node)
                      and isinstance(env.get(a), list)), None)
        if first is not None and len(first) + 1 == len(out_shape):
            d = int(arg(node, 1, "dim", 0)) % len(out_shape)
            labs = list(first)
            labs.insert(d, unknown_dim(out_shape[d]))
            return same_dims(labs, out_shape)
    if len(out_shape) == rank and tuple(in_shape or ()) != tuple(out_shape) and (
            name in ("slice", "narrow", "index", "index_select", "gather", "pad", "constant_pad_nd", "repeat",
                     "tile", "roll") or LAYOUT_KEEPING.search(raw)):
        return same_dims(x, out_shape)
    return None
