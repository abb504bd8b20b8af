"""Axis labels of the values of an ONNX graph, as :mod:`normaudit.facts.axes` gives them in a PyTorch graph:
each dim is ``batch``, ``sequence``, ``height``, ``width``, ``depth``, ``channel``, ``feature``, ``head`` or
``unknown``, and a merged dim joins its parts with ``*`` (``height*width``).

Graph inputs are labelled from their symbolic dim names where the exporter wrote them (``batch_size``,
``sequence_length``, ``height``...), else by dtype and rank as in a PyTorch graph: integer ``(N, S)`` token
ids -> ``(batch, sequence)``; a float rank-4 (rank-5) input -> ``(batch, channel, height, width)`` (``depth``
first); a float rank-3 input read by a ``Conv`` -> ``(batch, channel, sequence)``, by a ``MatMul``,
``Gemm`` or a norm -> ``(batch, sequence, feature)``; rank 2 -> ``(batch, feature)``. Labels then follow the
nodes in graph order: element-wise ops and norms keep them, ``MatMul``/``Gemm`` make the last dim
``feature``, an embedding ``Gather`` appends ``feature`` to its indices' labels, ``Conv`` gives ``(batch,
channel, spatial...)``, ``Transpose`` permutes, ``Reshape``/``Flatten``/``Squeeze``/``Unsqueeze`` merge,
split, drop and insert dims by their sizes (splitting ``feature`` gives ``head`` dims then ``feature``),
reductions drop or keep their dims. Any other op leaves ``unknown`` labels: a label is never guessed from a
size alone.
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional

from normaudit.loaders.onnx_file import OnnxGraph

UNK = "unknown"
Labels = list[str]

_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Cast", "CastLike", "Identity", "Relu",
                "Gelu", "Erf", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "Dropout", "Neg", "Exp", "Log", "Abs",
                "Clip", "Where", "Max", "Min", "LeakyRelu", "HardSigmoid", "HardSwish", "Mish", "Softplus", "Elu",
                "Selu", "Celu", "PRelu", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign", "Not", "Equal", "Less",
                "Greater", "And", "Or", "Mod", "Swish", "LayerNormalization", "RMSNormalization",
                "GroupNormalization", "InstanceNormalization", "BatchNormalization", "LpNormalization", "LRN",
                "Slice", "Expand", "Tile", "Pad", "MaxPool", "AveragePool", "LpPool", "Resize", "Upsample",
                "GlobalAveragePool", "GlobalMaxPool", "Trilu", "Split", "Concat", "CumSum"}
_REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceSumSquare", "ReduceLogSumExp"}
_NAMES = ((r"^(n|b|bs|batch|batch_?size|batches|num_?images)$", "batch"),
          (r"(seq|sequence|length|len|tokens?|time|frames|steps|past|total)", "sequence"),
          (r"^(h|height)$|height", "height"), (r"^(w|width)$|width", "width"), (r"^(d|depth)$", "depth"),
          (r"^(c|channels?|num_?channels)$", "channel"), (r"(hidden|d_?model|embed|features?|dim)$", "feature"),
          (r"heads?", "head"))


def name_label(dim: Any) -> Optional[str]:
    """The label a symbolic dim name gives (``batch_size`` -> batch, ``sequence_length`` -> sequence), or None."""
    if not isinstance(dim, str):
        return None
    low = dim.lower()
    for pattern, label in _NAMES:
        if re.search(pattern, low):
            return label
    return None


def _first_reader(g: OnnxGraph, value: str) -> Optional[str]:
    """The op type of the first layer reading ``value`` (element-wise arithmetic and casts passed)."""
    seen = 0
    frontier = [value]
    while frontier and seen < 32:
        v = frontier.pop(0)
        for u in g.users(v):
            seen += 1
            op = g.nodes[u].op_type
            if op in ("Conv", "MatMul", "Gemm", "LayerNormalization", "RMSNormalization", "BatchNormalization",
                      "InstanceNormalization", "GroupNormalization", "ReduceMean"):
                return op
            if op in ("Add", "Mul", "Sub", "Div", "Cast", "Identity", "Dropout") and g.nodes[u].output:
                frontier.append(g.nodes[u].output[0])
    return None


def input_labels(g: OnnxGraph, name: str) -> Optional[Labels]:
    """The labels of graph input ``name`` (see the module docstring); None when its rank is unknown."""
    shape = g.shape(name)
    if shape is None:
        return None
    rank, dtype = len(shape), g.dtype(name) or ""
    by_rank: Labels = [UNK] * rank
    if dtype.startswith(("int", "uint")) and rank == 2:
        by_rank = ["batch", "sequence"]
    elif dtype.startswith(("float", "bfloat")):
        if rank in (4, 5):
            by_rank = ["batch", "channel"] + (["depth"] if rank == 5 else []) + ["height", "width"]
        elif rank == 3:
            reader = _first_reader(g, name)
            if reader == "Conv":
                by_rank = ["batch", "channel", "sequence"]
            elif reader is not None:
                by_rank = ["batch", "sequence", "feature"]
        elif rank == 2:
            by_rank = ["batch", "feature"]
    return [name_label(d) or by_rank[k] for k, d in enumerate(shape)]


def _parts(label: str) -> list[str]:
    return label.split("*")


def _join(labels: Labels) -> str:
    parts = [p for lab in labels for p in _parts(lab) if p != UNK] if any(lab != UNK for lab in labels) else [UNK]
    return "*".join(dict.fromkeys(parts)) if parts else UNK


def _split(label: str, k: int) -> Labels:
    """One dim split in ``k``: a merged dim into its parts, ``feature`` into heads then features."""
    parts = _parts(label)
    if len(parts) == k:
        return parts
    if label == "feature":
        return ["head"] * (k - 1) + ["feature"]
    return [label] * k


def reshape_labels(src: Labels, in_shape: list[Any], out_shape: list[Any]) -> Optional[Labels]:
    """Labels of a reshape from ``in_shape`` (labelled ``src``) to ``out_shape``, matching consecutive dims
    whose sizes multiply to the same number (a symbolic dim matches only itself); size-1 dims are
    ``unknown``. None when the sizes cannot be matched."""
    out: Labels = []
    i = j = 0
    while i < len(in_shape) or j < len(out_shape):
        if j < len(out_shape) and out_shape[j] == 1 and not (i < len(in_shape) and in_shape[i] == 1):
            out.append(UNK)
            j += 1
            continue
        if i < len(in_shape) and in_shape[i] == 1 and not (j < len(out_shape) and out_shape[j] == 1):
            i += 1
            continue
        if i >= len(in_shape) or j >= len(out_shape):
            return None
        a, b = in_shape[i], out_shape[j]
        if a is None or b is None:
            return None
        if a == b:
            out.append(src[i])
            i, j = i + 1, j + 1
            continue
        if not (isinstance(a, int) and isinstance(b, int)) or a <= 0 or b <= 0:
            return None
        ii, jj, pa, pb = i + 1, j + 1, a, b
        while pa != pb:
            if pa < pb and ii < len(in_shape) and isinstance(in_shape[ii], int):
                pa, ii = pa * in_shape[ii], ii + 1
            elif pb < pa and jj < len(out_shape) and isinstance(out_shape[jj], int):
                pb, jj = pb * out_shape[jj], jj + 1
            else:
                return None
        if ii - i > 1 and jj - j == 1:
            out.append(_join(src[i:ii]))
        elif ii - i == 1:
            out.extend(_split(src[i], jj - j))
        else:
            out.extend([UNK] * (jj - j))
        i, j = ii, jj
    return out


def _matmul(a: Labels, b: Optional[Labels], b_const: bool, b_rank: Optional[int]) -> Optional[Labels]:
    """``A @ B``: a weight (a tensor) gives a ``feature`` last dim; a computed ``B`` its own last label
    (attention probabilities @ values); a vector ``B`` drops the last dim."""
    if b_rank == 1:
        return a[:-1]
    if b_const:
        return a[:-1] + ["feature"]
    return a[:-1] + [b[-1]] if b is not None and len(b) >= 2 else None


def _axes_arg(g: OnnxGraph, node: Any) -> Optional[list[int]]:
    axes = g.attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        arr = g.const(node.input[1], max_elements=64)
        axes = None if arr is None else [int(a) for a in arr.reshape(-1)]
    return axes if isinstance(axes, list) and all(isinstance(a, int) for a in axes) else None


def _transfer(g: OnnxGraph, node: Any, env: dict[str, Labels]) -> Optional[Labels]:
    """Labels of ``node``'s first output from its inputs' (see the module docstring); None for unknown."""
    op = node.op_type
    ins = [env.get(v) if v else None for v in node.input]
    first = ins[0] if ins else None
    out_rank = g.rank(node.output[0]) if node.output else None
    if op in _ELEMENTWISE:
        known = [lab for lab in ins if lab is not None and (out_rank is None or len(lab) == out_rank)]
        return known[0] if known else None
    if first is None:
        if op == "Gather" and len(node.input) > 1 and node.input[0] in g.store and ins[1] is not None:
            return ins[1] + ["feature"]
        return None
    if op == "MatMul" and len(ins) > 1:
        return _matmul(first, ins[1], g.tensor_source(node.input[1]) is not None, g.rank(node.input[1]))
    if op == "Gemm":
        return [first[1] if g.number(node, "transA", 0) else first[0], "feature"] if len(first) == 2 else None
    if op in ("Conv", "ConvTranspose"):
        return ["batch", "channel"] + first[2:]
    if op == "Transpose":
        perm = g.attr(node, "perm") or list(range(len(first)))[::-1]
        return [first[p] for p in perm] if sorted(perm) == list(range(len(first))) else None
    if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        return _layout(g, node, first)
    if op in _REDUCE:
        axes = _axes_arg(g, node)
        if g.number(node, "keepdims", 1):
            return first
        if axes is None:
            return None
        drop = {a % len(first) for a in axes if -len(first) <= a < len(first)}
        return [lab for k, lab in enumerate(first) if k not in drop]
    if op == "Gather" and ins[1] is not None:
        axis = g.number(node, "axis", 0)
        if isinstance(axis, int) and -len(first) <= axis < len(first):
            axis %= len(first)
            return first[:axis] + ins[1] + first[axis + 1:]
    return None


def _layout(g: OnnxGraph, node: Any, first: Labels) -> Optional[Labels]:
    """Labels through Reshape, Flatten, Squeeze and Unsqueeze."""
    op = node.op_type
    if op == "Flatten":
        axis = g.number(node, "axis", 1)
        if not isinstance(axis, int) or not -len(first) <= axis <= len(first):
            return None
        axis = axis + len(first) if axis < 0 else axis
        return [_join(first[:axis]) if axis else UNK, _join(first[axis:])]
    in_shape, out_shape = g.shape(node.input[0]), g.shape(node.output[0])
    if in_shape is None or out_shape is None or len(in_shape) != len(first):
        return None
    if op == "Unsqueeze" or op == "Squeeze":
        kept = [lab for lab, d in zip(first, in_shape) if d != 1 or op == "Unsqueeze"]
        sizes = [d for d in in_shape if d != 1 or op == "Unsqueeze"]
        return reshape_labels(kept, sizes, out_shape)
    return reshape_labels(first, in_shape, out_shape)


def label_values(g: OnnxGraph) -> dict[str, Labels]:
    """value name -> labels, for the graph inputs and every node output the rules above reach."""
    env: dict[str, Labels] = {}
    for name in g.inputs:
        labels = input_labels(g, name)
        if labels is not None:
            env[name] = labels
    for i, node in enumerate(g.nodes):
        if not node.output or not node.output[0] or not g.standard(i):
            continue
        try:
            labels = _transfer(g, node, env)
        except (TypeError, ValueError, IndexError):  # attributes of the wrong type in a corrupt file
            labels = None
        rank = g.rank(node.output[0])
        if labels is not None and (rank is None or len(labels) == rank):
            env[node.output[0]] = labels
    return env


def flat_axes(labels: Optional[Labels], dims: Optional[list[int]]) -> list[str]:
    """The report's ``normalized_axes``: the base labels of ``dims`` in order, each once."""
    if not labels or dims is None or any(not 0 <= d < len(labels) for d in dims):
        return []
    return list(dict.fromkeys(p for d in dims for p in _parts(labels[d])))


def product(shape: list[Any]) -> Optional[int]:
    """The number of elements of a fully known shape, else None."""
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else None
