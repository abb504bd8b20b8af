"""Labels through layout ops: view/reshape/flatten/unflatten/squeeze (the input's parts dealt out to the
output dims, :func:`reshape_dims`), permute/transpose/movedim, unsqueeze, expand, select and diagonal
(:func:`layout_dims`). A reshape that splits an axis marks the inner piece :data:`~.dims.PATCH` (an offset
inside a fixed patch or window); sizes fixed by the model (:func:`fixed_sizes`) tell a fixed number of
neighbouring tokens merged into features from the token count; patch tokens moved before their channels
read as features (:func:`as_tokens`)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.facts.axes.dims import PATCH, SPATIAL, TOKEN, UNK, Dim, Part, dim_names, dim_size, same_dims, \
    unknown_dim, unknown_dims
from normaudit.facts.axes.ops import ELEMENTWISE, dims_arg, raw_name
from normaudit.vocabulary.graph import FOLLOW, arg, forward_walk, op_name, shape


def _tidy(d: Sequence[Part]) -> Dim:
    """Drop size-1 parts of a multi-part dim, fuse neighbours with the same names (and head+feature)."""
    parts = [p for p in d if p[1] != 1] or list(d[:1])
    out: list[Part] = []
    for names, size in parts:
        if out and (out[-1][0] == names or (out[-1][0] == ("head",) and names == ("feature",))):
            out[-1] = (names, out[-1][1] * size)
        else:
            out.append((names, size))
    return tuple(out)


def reshape_dims(x: list[Dim], out_shape: Sequence[int], fixed: Optional[Sequence[bool]] = None) -> list[Dim]:
    """Dims after a view/reshape: the input's parts, in memory order, are dealt out to the output dims.

    A part larger than what an output dim still needs is split (outer piece first; a split ``feature``
    gives ``head`` then ``feature``); size-1 dims take a size-1 part when one is next, else ``unknown``.
    The inner piece of a split spatial axis is marked :data:`PATCH` (an offset inside a fixed patch); so is
    the inner piece of a split batch/sequence axis when the output dim it goes to has a size fixed by the
    model (``fixed[i]``, :func:`fixed_sizes`): a fixed number of neighbouring tokens merged into that dim.
    """
    stream: list[Part] = [p for d in x for p in d]
    out: list[Dim] = []
    k = 0
    for s in out_shape:
        s = int(s)
        if s == 1:
            if k < len(stream) and stream[k][1] == 1:
                out.append((stream[k],))
                k += 1
            else:
                out.append(unknown_dim(1))
            continue
        acc: list[Part] = []
        prod = 1
        while prod < s:
            while k < len(stream) and stream[k][1] == 1:
                k += 1
            if k >= len(stream) or s % prod:
                break
            names, n = stream[k]
            need = s // prod
            if need % n == 0:
                acc.append(stream[k])
                prod *= n
                k += 1
            elif n % need == 0:
                outer = ("head",) if names == ("feature",) else names
                acc.append((outer, need))
                nxt = len(out) + 1
                fixed_next = fixed is not None and nxt < len(fixed) and fixed[nxt]
                patchy = set(names) <= set(SPATIAL) or (fixed_next and set(names) <= set(TOKEN))
                inner = names + (PATCH,) if patchy and PATCH not in names else names
                stream[k] = (inner, n // need)
                prod *= need
            else:
                break
        if prod != s:  # irregular regrouping (e.g. (6, 4) -> (4, 6)): what is left merges
            rest = stream[k:]
            merged = tuple(dim_names(acc + rest)) or UNK
            out.append(((merged, s),))
            for s2 in out_shape[len(out):]:
                out.append(((merged, int(s2)),))
            return out[: len(out_shape)]
        out.append(_tidy(acc))
    return out


def as_tokens(dims: list[Dim]) -> list[Dim]:
    """Patch tokens: a conv feature map whose spatial grid was flattened into one token axis and moved before
    its channels, ``(B, C, H, W) -> flatten(2) -> transpose(1, 2) -> (B, H*W, C)`` (ViT patch embedding,
    Dosovitskiy et al. 2020, arXiv 2010.11929, eq. 1), carries each token's embedding: its last dim is a
    ``feature`` axis, as the same axis is after every block's Linear layers, so identical layers get one
    label. A channels-last map that keeps ``H`` and ``W`` apart (ConvNeXt's ``permute(0, 2, 3, 1)``) keeps
    its ``channel`` axis."""
    if len(dims) < 3 or dim_names(dims[-1]) != ["channel"]:
        return dims
    grid = any(len({n for names, _ in d for n in names if n in SPATIAL}) >= 2
               and not any(PATCH in names for names, _ in d) for d in dims[:-1])
    if not grid:
        return dims
    return dims[:-1] + [tuple((("feature",), size) for _, size in dims[-1])]


def _permute(x: list[Dim], perm: Sequence[int]) -> list[Dim]:
    rank = len(x)
    return [x[int(p) % rank] for p in perm]


def fixed_sizes(node: fx.Node, rank: int, cap: Optional[Capture] = None,
                 params: Optional[set] = None) -> Optional[list[bool]]:
    """For a ``view``/``reshape`` node, which output dims have a size fixed by the model, not by the input.

    A size given as a plain int is fixed when another size of the same call is inferred (``-1``) or traced
    from the input (an fx node: ``x.size(0) // 4`` under symbolic tracing): ``x.view(-1, hidden * 4)``
    fixes the last dim and leaves the token count to the input. Export graphs keep the ``-1`` as written.
    The last size, unless written ``-1``, is also fixed when a parameter downstream has it
    (:func:`_sized_by_parameter`): ``x.reshape(n // 4, 4 * d)`` with ``n, d = x.shape`` (plain ints under
    export, traced under symbolic tracing) feeding ``nn.LayerNorm(4 * d)`` or ``nn.Linear(4 * d, ...)``.
    Returns None when that cannot be told (``flatten``, ``view_as``, plain ints no parameter explains).
    """
    if raw_name(node) not in ("view", "reshape", "_unsafe_view", "_reshape_alias"):
        return None
    sizes = node.args[1:] if len(node.args) > 1 else [node.kwargs.get("shape", node.kwargs.get("size"))]
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = sizes[0]
    if len(sizes) != rank or not rank:
        return None
    free = [not isinstance(z, int) or z == -1 for z in sizes]
    fixed = [not f for f in free] if any(free) else [False] * rank
    out_shape = shape(node)
    if cap is not None and out_shape and sizes[-1] != -1 and _sized_by_parameter(node, int(out_shape[-1]), cap,
                                                                                 params or set()):
        fixed[-1] = True
    return fixed if any(fixed) else None


def _frames_as_features(node: fx.Node, dims: list[Dim], cap: Optional[Capture],
                        params: Optional[set]) -> list[Dim]:
    """``dims`` of a reshape, with a last dim made only of the inner pieces of a cut token axis
    (:data:`PATCH` parts of batch/sequence, no channel/feature part) relabelled ``feature`` when a parameter
    reading it has its size (:func:`_sized_by_parameter`): a waveform ``(batch, samples)`` cut into frames,
    ``x.reshape(B, -1, frame_len)`` read by ``nn.Linear(frame_len, hidden)`` (MoonshineStreaming), is
    ``(batch, sequence, feature)``: the frame is the token and its samples are its features, like a ViT
    patch's pixels. Without such a parameter (a window of tokens split off for attention) the dim stays."""
    last = dims[-1] if dims else ()
    if cap is None or not last or any(PATCH not in names or not set(names) - {PATCH} <= set(TOKEN)
                                      for names, _ in last):
        return dims
    size = dim_size(last)
    if size > 1 and _sized_by_parameter(node, size, cap, params or set()):
        return dims[:-1] + [((("feature",), size),)]
    return dims


#: element-wise unary maps a feature passes through unchanged in layout (compressions, activations)
_UNARY = ("pow", "square", "neg", "abs", "sign", "exp", "log", "log1p", "sqrt", "rsqrt", "asinh", "sinh", "tanh",
          "atan", "sigmoid", "silu", "gelu", "relu", "erf", "clamp", "clip")


def _sized_by_parameter(node: fx.Node, size: int, cap: Capture, params: set) -> bool:
    """True when a layer reading ``node`` (through casts and element-wise ops that keep its shape) holds a
    parameter whose last dim is ``size`` along ``node``'s last dim: a Linear's input features, a LayerNorm's
    or RMSNorm's normalised shape, a matmul by a weight, a gain multiplied in. The model then fixes that
    size, whatever the input."""
    seen = {node}

    def step(user: fx.Node, n: fx.Node) -> Optional[object]:
        if user in seen:
            return None  # every user is looked at once, followed or not
        seen.add(user)
        if _parameter_size(user, n, cap, params) == size:
            return True
        if shape(user) == shape(node) and (op_name(user) in ("to", "alias", "dropout", "contiguous")
                                           or op_name(user) in ELEMENTWISE + _UNARY):
            return FOLLOW
        return None

    return forward_walk(node, step) is True


def _parameter_size(user: fx.Node, src: fx.Node, cap: Capture, params: set) -> Optional[int]:
    """The size a parameter of ``user`` fixes along the last dim of its input ``src`` (see
    :func:`_sized_by_parameter`), else None."""
    name = op_name(user)
    if name == "module":
        mod = cap.modules.get(str(user.target))
        w = getattr(mod, "weight", None) if isinstance(mod, (nn.Linear, nn.LayerNorm, nn.RMSNorm)) else None
        return int(w.shape[-1]) if isinstance(w, torch.Tensor) and w.dim() else None
    if name in ("layer_norm", "rms_norm"):
        ns = arg(user, 1, "normalized_shape", None)
        return int(ns[-1]) if isinstance(ns, (list, tuple)) and ns and isinstance(ns[-1], int) else None
    operands = [a for a in user.args[:3] if isinstance(a, fx.Node) and a is not src and a in params]
    ws = [shape(a) for a in operands if shape(a)]
    if name == "linear" and ws:
        return int(ws[0][-1])
    if name == "matmul" and ws and len(ws[0]) >= 2:
        return int(ws[0][-2])
    if name in ("mul", "add") and ws:
        return int(ws[0][-1])
    return None


def layout_dims(node: fx.Node, name: str, raw: str, x: list[Dim], out_shape: Sequence[int], cap: Capture,
                 params: Optional[set]) -> Optional[list[Dim]]:
    """Labels after permute/transpose/movedim, view/reshape/flatten/squeeze, unsqueeze, expand, select and
    diagonal of a labelled input ``x``; None for any other op."""
    rank = len(x)
    if name == "permute" or raw == "permute":
        dims = dims_arg(node, 1, "dims")
        if dims is not None and len(dims) == rank:
            return as_tokens(_permute(x, dims))
    if name == "transpose":
        if raw in ("t", "numpy_T") or (rank == 2 and len(node.args) == 1 and not node.kwargs):
            return list(reversed(x)) if rank == 2 else list(x)
        d0, d1 = arg(node, 1, "dim0", 0), arg(node, 2, "dim1", 1)
        if isinstance(d0, int) and isinstance(d1, int) and rank:
            labs = list(x)
            a, b = d0 % rank, d1 % rank
            labs[a], labs[b] = labs[b], labs[a]
            return as_tokens(labs)
    if name == "movedim":
        src, dst = arg(node, 1, "source", None), arg(node, 2, "destination", None)
        if isinstance(src, int):
            src, dst = [src], [dst]
        if isinstance(src, (list, tuple)) and isinstance(dst, (list, tuple)) and len(src) == len(dst):
            src = [int(s) % rank for s in src]
            dst = [int(d) % rank for d in dst]
            order = [k for k in range(rank) if k not in src]
            result: list[Optional[Dim]] = [None] * rank
            for s, d in zip(src, dst):
                result[d] = x[s]
            it = iter(order)
            return [r if r is not None else x[next(it)] for r in result]
    if name in ("view", "flatten", "unflatten", "squeeze", "view_as", "reshape_as", "_reshape_alias",
                "reshape") or raw in ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze",
                                      "view_as", "reshape_as", "ravel"):
        return _frames_as_features(node, reshape_dims(x, out_shape, fixed_sizes(node, len(out_shape), cap, params)),
                                   cap, params)
    if name == "unsqueeze":
        d = int(arg(node, 1, "dim", 0)) % (rank + 1)
        labs = list(x)
        labs.insert(d, unknown_dim(1))
        return labs
    if name in ("expand", "expand_as", "broadcast_to"):
        ext = [unknown_dim(s) for s in out_shape[: len(out_shape) - rank]] + list(x)
        return [d if dim_size(d) == s else unknown_dim(s) for d, s in zip(ext, out_shape)]
    if name == "select":
        d = int(arg(node, 1, "dim", 0)) % rank
        return same_dims(x[:d] + x[d + 1:], out_shape)
    if raw == "diagonal" and len(out_shape) == rank - 1:
        d1, d2 = int(arg(node, 2, "dim1", 0)) % rank, int(arg(node, 3, "dim2", 1)) % rank
        kept = [d for k, d in enumerate(x) if k not in (d1, d2)]
        return same_dims(kept, out_shape[:-1]) + [unknown_dim(out_shape[-1])]
    if raw in ("diagonal", "unfold", "as_strided", "stride"):
        return unknown_dims(out_shape)
    return None
