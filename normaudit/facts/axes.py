"""Axis provenance: a label for every dimension of every tensor in the graph.

Model inputs are labelled by what they are (token ids -> ``(batch, sequence)``; images ->
``(batch, channel, height, width)``; 1-D conv input -> ``(batch, channel, sequence)``; or as the user
declares with ``--input-axes``), and the labels are carried through permute/transpose/movedim,
view/reshape/flatten (merged and split axes), conv (channel axis), linear/matmul (feature axis), embedding,
attention head split/merge, pooling and reductions. A site's ``normalized_axes`` comes from the labels
of the dims its statistics reduce, never from comparing sizes.

Each dimension's label is a tuple of base labels: a merged dimension (``flatten(2)`` of H and W) carries
``("height", "width")``. Results go to ``node.meta["normaudit"]["axes"]``.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.capture.ir import arg, op_name, reduction, shape, tensor_inputs, val

Label = tuple[str, ...]
UNK: Label = ("unknown",)
LETTERS = {"B": "batch", "N": "batch", "S": "sequence", "T": "sequence", "L": "sequence", "H": "height",
           "W": "width", "D": "depth", "C": "channel", "F": "feature", "E": "feature", "K": "head"}
BASE = ("batch", "sequence", "height", "width", "depth", "channel", "feature", "head", "unknown")


def parse_input_axes(spec: str) -> list[Label]:
    """Parse ``"B,C,H,W"`` or ``"batch,channel,height,width"`` into labels. Raises ValueError."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        name = LETTERS.get(part.upper(), part.lower()) if len(part) == 1 else part.lower()
        if name not in BASE:
            raise ValueError(f"unknown axis {part!r}; use one of B,S,C,H,W,D,F or {', '.join(BASE)}")
        out.append((name,))
    return out


def _first_consumer_module(node: fx.Node, cap: Capture) -> Optional[nn.Module]:
    for user in node.users:
        name = op_name(user)
        if name == "module":
            return cap.modules.get(str(user.target))
        if name == "conv":
            return nn.Conv1d(1, 1, 1) if len(shape(node) or ()) == 3 else None
    return None


def input_labels(node: fx.Node, cap: Capture, declared: Optional[list[Label]] = None) -> list[Label]:
    """Labels for a model input from its dtype and rank (and the first layer reading it)."""
    shp = shape(node)
    v = val(node)
    if shp is None:
        return []
    rank = len(shp)
    if declared is not None and len(declared) == rank:
        return list(declared)
    floating = isinstance(v, torch.Tensor) and v.is_floating_point()
    if not floating:
        base = [("batch",), ("sequence",)]
        return (base + [UNK] * rank)[:rank] if rank >= 2 else [("sequence",)] * rank
    if rank == 4:
        return [("batch",), ("channel",), ("height",), ("width",)]
    if rank == 5:
        return [("batch",), ("channel",), ("depth",), ("height",), ("width",)]
    if rank == 3:
        first = _first_consumer_module(node, cap)
        if isinstance(first, (nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d, nn.InstanceNorm1d, nn.GroupNorm)):
            return [("batch",), ("channel",), ("sequence",)]
        return [("batch",), ("sequence",), ("feature",)]
    if rank == 2:
        return [("batch",), ("feature",)]
    if rank == 1:
        return [("feature",)]
    return [UNK] * rank


def _merge(labels: Sequence[Label]) -> Label:
    seen: list[str] = []
    for lab in labels:
        for x in lab:
            if x != "unknown" and x not in seen:
                seen.append(x)
    if not seen:
        return UNK
    if set(seen) <= {"head", "feature"}:
        return ("feature",)
    return tuple(seen)


def _reshape(in_shape: Sequence[int], in_labels: list[Label], out_shape: Sequence[int]) -> list[Label]:
    """Labels after a view/reshape, grouping input and output dims whose sizes multiply to the same value."""
    out: list[Label] = []
    i = j = 0
    n, m = len(in_shape), len(out_shape)
    while i < n or j < m:
        if j < m and out_shape[j] == 1 and (i >= n or in_shape[i] != 1):
            out.append(UNK)
            j += 1
            continue
        if i < n and in_shape[i] == 1 and (j >= m or out_shape[j] != 1):
            i += 1
            continue
        if i >= n or j >= m:
            out.extend([UNK] * (m - j))
            break
        gi, gj = [i], [j]
        pi, pj = in_shape[i], out_shape[j]
        while pi != pj:
            if pi < pj and gi[-1] + 1 < n:
                gi.append(gi[-1] + 1)
                pi *= in_shape[gi[-1]]
            elif pj < pi and gj[-1] + 1 < m:
                gj.append(gj[-1] + 1)
                pj *= out_shape[gj[-1]]
            else:
                break
        src = [in_labels[k] if k < len(in_labels) else UNK for k in gi]
        if len(gi) == 1 and len(gj) == 1:
            out.append(src[0])
        elif len(gi) == 1:
            lab = src[0]
            parts = [lab] * len(gj)
            if lab == ("feature",) and len(gj) == 2:
                parts = [("head",), ("feature",)]
            for k, dj in enumerate(gj):
                out.append(parts[k] if out_shape[dj] != 1 else UNK)
        else:
            merged = _merge(src)
            out.extend([merged] * len(gj))
        i, j = gi[-1] + 1, gj[-1] + 1
    return out[:m]


def _broadcast(node: fx.Node, env: dict[fx.Node, Any]) -> Optional[list[Label]]:
    out_shape = shape(node)
    if out_shape is None:
        return None
    rank = len(out_shape)
    result: list[Label] = [UNK] * rank
    for inp in tensor_inputs(node):
        labs = env.get(inp)
        ishp = shape(inp)
        if not isinstance(labs, list) or ishp is None or len(labs) != len(ishp) or len(ishp) > rank:
            continue
        off = rank - len(ishp)
        for k, lab in enumerate(labs):
            if ishp[k] == out_shape[off + k] and result[off + k] == UNK and lab != UNK:
                result[off + k] = lab
    return result


def _permute(labels: list[Label], perm: Sequence[int]) -> list[Label]:
    rank = len(labels)
    return [labels[int(p) % rank] for p in perm]


def _module_labels(node: fx.Node, mod: nn.Module, x: Optional[list[Label]], env) -> Any:
    out_shape = shape(node)
    if isinstance(mod, nn.Linear) and x:
        return x[:-1] + [("feature",)]
    if isinstance(mod, nn.Embedding) and x is not None:
        return x + [("feature",)]
    if isinstance(mod, (nn.modules.conv._ConvNd,)) and x:
        labs = list(x)
        if len(labs) >= 2:
            labs[1] = ("channel",)
        return labs
    if isinstance(mod, nn.MultiheadAttention) and x is not None:
        return (x, None)
    if isinstance(mod, nn.Flatten) and x is not None and out_shape is not None:
        return _reshape(shape(node.args[0]) or (), x, out_shape)
    return _broadcast(node, env)


def label_graph(cap: Capture, declared_inputs: Optional[list[Label]] = None) -> dict[fx.Node, Any]:
    """Run the axis pass over ``cap.gm``; returns node -> labels (a list per tensor, tuple for tuples)."""
    env: dict[fx.Node, Any] = {}
    gm = cap.gm
    if gm is None:
        return env
    user_inputs = set(cap.user_inputs)
    first = True
    for node in gm.graph.nodes:
        labs = _labels_for(node, cap, env, user_inputs, declared_inputs if first else None)
        if node.op == "placeholder" and node.name in user_inputs:
            first = False
        env[node] = labs
        node.meta.setdefault("normaudit", {})["axes"] = labs
    return env


def _labels_for(node, cap, env, user_inputs, declared) -> Any:
    name = op_name(node)
    out_shape = shape(node)
    if name == "placeholder":
        if node.name in user_inputs:
            return input_labels(node, cap, declared)
        return [UNK] * len(out_shape) if out_shape is not None else None
    if name in ("get_attr", "output"):
        return [UNK] * len(out_shape) if out_shape is not None else None
    ins = tensor_inputs(node)
    x = env.get(ins[0]) if ins else None
    x = x if isinstance(x, list) else None
    if name == "module":
        return _module_labels(node, cap.modules.get(str(node.target)), x, env)
    if name == "getitem":
        src = node.args[0]
        idx = node.args[1]
        base = env.get(src)
        if isinstance(base, tuple) and isinstance(idx, int):
            return base[idx] if idx < len(base) else None
        if isinstance(base, list) and out_shape is not None and shape(src) is not None:
            return _index_labels(base, shape(src), idx, out_shape)
        return [UNK] * len(out_shape) if out_shape is not None else None
    if out_shape is None:
        v = val(node)
        if isinstance(v, (tuple, list)) and x is not None:
            return tuple(_same_or_unknown(t, x, shape(ins[0])) for t in v)
        return None
    in_shape = shape(ins[0]) if ins else None
    if name == "linear" and x:
        return x[:-1] + [("feature",)]
    if name == "matmul" and x and len(ins) > 1:
        y = env.get(ins[1])
        last = y[-1] if isinstance(y, list) and y else ("feature",)
        if last == UNK:
            last = ("feature",)
        return (x[:-1] + [last])[-len(out_shape):] if len(x) >= len(out_shape) - 1 else [UNK] * len(out_shape)
    if name == "embedding":
        idx = env.get(node.args[1]) if len(node.args) > 1 and isinstance(node.args[1], fx.Node) else None
        if isinstance(idx, list):
            return idx + [("feature",)]
    if name == "conv" and x:
        labs = list(x)
        if len(labs) >= 2:
            labs[1] = ("channel",)
        return labs[: len(out_shape)] if len(labs) >= len(out_shape) else labs + [UNK] * (len(out_shape) - len(labs))
    if name == "permute" and x:
        dims = arg(node, 1, "dims", None)
        if dims is not None and not isinstance(dims, (list, tuple)):
            dims = node.args[1:]
        if dims is not None and len(dims) == len(x):
            return _permute(x, dims)
    if name == "transpose" and x:
        d0, d1 = arg(node, 1, "dim0", 0), arg(node, 2, "dim1", 1)
        if len(x) == 2 and len(node.args) == 1:
            d0, d1 = 0, 1
        labs = list(x)
        if isinstance(d0, int) and isinstance(d1, int):
            labs[d0 % len(x)], labs[d1 % len(x)] = labs[d1 % len(x)], labs[d0 % len(x)]
            return labs
    if name == "movedim" and x:
        src, dst = arg(node, 1, "source", None), arg(node, 2, "destination", None)
        if isinstance(src, int) and isinstance(dst, int):
            labs = list(x)
            item = labs.pop(src % len(x))
            labs.insert(dst % len(x), item)
            return labs
    if name in ("view", "flatten", "unflatten", "expand_as", "view_as") and x is not None and in_shape is not None:
        if name == "expand_as":
            return _broadcast(node, env)
        return _reshape(in_shape, x, out_shape)
    if name == "unsqueeze" and x is not None:
        d = arg(node, 1, "dim", 0)
        labs = list(x)
        labs.insert(int(d) % (len(x) + 1), UNK)
        return labs
    if name == "squeeze" and x is not None and in_shape is not None:
        return _reshape(in_shape, x, out_shape)
    if name in ("expand", "repeat", "tile") and x is not None:
        return ([UNK] * (len(out_shape) - len(x)) + list(x))[-len(out_shape):]
    red = reduction(node) if name in ("mean", "sum", "var", "std", "amax", "norm", "linalg_vector_norm") else None
    if red is not None and x is not None:
        if red.keepdim:
            return [UNK if k in red.dims else lab for k, lab in enumerate(x)]
        return [lab for k, lab in enumerate(x) if k not in red.dims]
    if name in ("select",) and x is not None:
        d = int(arg(node, 1, "dim", 0))
        return [lab for k, lab in enumerate(x) if k != d % len(x)]
    if name in ("slice", "narrow", "index", "index_select", "gather") and x is not None and len(x) == len(out_shape):
        return list(x)
    if name in ("cat", "stack") and node.args and isinstance(node.args[0], (list, tuple)):
        parts = [env.get(a) for a in node.args[0] if isinstance(a, fx.Node)]
        parts = [p for p in parts if isinstance(p, list)]
        if parts and name == "cat" and len(parts[0]) == len(out_shape):
            return _broadcast_list(parts, out_shape)
        if parts and name == "stack":
            d = int(arg(node, 1, "dim", 0)) % len(out_shape)
            labs = list(parts[0])
            labs.insert(d, UNK)
            return labs
    if name == "sdpa" and x is not None:
        return list(x)
    if name in ("adaptive_avg_pool2d", "avg_pool2d", "max_pool2d", "adaptive_avg_pool1d", "avg_pool1d",
                "max_pool1d", "upsample_nearest2d", "upsample_bilinear2d", "interpolate", "pad",
                "max_pool2d_with_indices", "avg_pool3d", "adaptive_max_pool2d", "pixel_shuffle") and x is not None:
        if len(x) == len(out_shape):
            return list(x)
    b = _broadcast(node, env)
    return b


def _broadcast_list(parts: list[list[Label]], out_shape) -> list[Label]:
    res = [UNK] * len(out_shape)
    for p in parts:
        for k, lab in enumerate(p[: len(out_shape)]):
            if res[k] == UNK and lab != UNK:
                res[k] = lab
    return res


def _same_or_unknown(t: Any, x: list[Label], in_shape) -> Optional[list[Label]]:
    if isinstance(t, torch.Tensor):
        if in_shape is not None and tuple(t.shape) == tuple(in_shape):
            return list(x)
        return [UNK] * t.dim()
    return None


def _index_labels(base: list[Label], in_shape, idx: Any, out_shape) -> list[Label]:
    """Labels after ``x[idx]`` for int/slice/None/Ellipsis indexing."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    labs: list[Label] = []
    k = 0
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    for i in idx:
        if i is None:
            labs.append(UNK)
        elif i is Ellipsis:
            take = len(base) - n_real
            labs.extend(base[k:k + take])
            k += take
        elif isinstance(i, int):
            k += 1
        else:
            labs.append(base[k] if k < len(base) else UNK)
            k += 1
    labs.extend(base[k:])
    if len(labs) != len(out_shape):
        return [UNK] * len(out_shape)
    return labs


def flat_labels(labels: Sequence[Label]) -> list[str]:
    """Base labels of some dims, in order, without repeats (``unknown`` only when nothing else is known)."""
    out: list[str] = []
    for lab in labels:
        for x in lab:
            if x not in out and x != "unknown":
                out.append(x)
    if not out and labels:
        out = ["unknown"]
    return out


def axes_text(labels: Optional[Sequence[Label]]) -> Optional[list[str]]:
    """Readable per-dim labels: ``['batch', 'height*width', 'channel']``."""
    if labels is None:
        return None
    return ["*".join(lab) for lab in labels]


def product(xs) -> int:
    return math.prod(int(x) for x in xs)
