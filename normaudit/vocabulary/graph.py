"""A canonical view of fx nodes, the same for symbolically traced graphs and exported aten graphs.

Fact passes ask :func:`op_name` (``"mean"``, ``"rsqrt"``, ``"layer_norm"``, ``"module"``, ...),
:func:`owner` (the ``named_modules()`` path of the module whose forward produced the node) and
:func:`reduction` (the reduced dims of mean/var/std/sum) instead of switching on the capture method.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import fx, nn

_PY_OPS = {
    operator.add: "add", operator.iadd: "add", operator.sub: "sub", operator.isub: "sub",
    operator.mul: "mul", operator.imul: "mul", operator.truediv: "div", operator.itruediv: "div",
    operator.floordiv: "floordiv", operator.pow: "pow", operator.neg: "neg", operator.getitem: "getitem",
    operator.matmul: "matmul",
}
_ALIASES = {
    "true_divide": "div", "divide": "div", "multiply": "mul", "subtract": "sub", "rsub": "rsub",
    "float": "to", "half": "to", "bfloat16": "to", "double": "to", "type_as": "to", "type": "to",
    "_to_copy": "to", "to_copy": "to", "contiguous": "alias", "clone": "alias", "detach": "alias",
    "alias": "alias", "lift_fresh_copy": "alias", "dropout": "dropout", "native_dropout": "dropout",
    "feature_dropout": "dropout", "alpha_dropout": "dropout", "dropout1d": "dropout", "dropout2d": "dropout",
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "convolution": "conv", "_convolution": "conv",
    "conv_transpose1d": "conv", "conv_transpose2d": "conv", "conv_transpose3d": "conv",
    "native_layer_norm": "layer_norm", "_fused_rms_norm": "rms_norm", "native_group_norm": "group_norm",
    "_native_batch_norm_legit": "batch_norm", "_native_batch_norm_legit_no_training": "batch_norm",
    "_native_batch_norm_legit_functional": "batch_norm", "native_batch_norm": "batch_norm",
    "cudnn_batch_norm": "batch_norm", "_unsafe_view": "view", "reshape": "view", "view": "view",
    "mm": "matmul", "bmm": "matmul", "addmm": "linear", "swapaxes": "transpose", "swapdims": "transpose",
    "moveaxis": "movedim", "t": "transpose", "numpy_T": "transpose", "square": "square", "rsqrt": "rsqrt",
    "sqrt": "sqrt", "reciprocal": "reciprocal", "clamp_min": "clamp", "clip": "clamp", "maximum": "maximum",
    "where": "where", "softmax": "softmax", "_softmax": "softmax", "_safe_softmax": "softmax",
    "scaled_dot_product_attention": "sdpa", "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
    "_scaled_dot_product_efficient_attention": "sdpa", "_scaled_dot_product_flash_attention": "sdpa",
    "var_mean": "var_mean", "std_mean": "std_mean", "add_": "add", "mul_": "mul",
}
NORM_OPS = ("layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm", "local_response_norm")
CAST_OPS = ("to",)
NEUTRAL_OPS = ("alias", "dropout", "to")


def op_name(node: fx.Node) -> str:
    """Canonical name of what ``node`` computes; ``"module"`` for a ``call_module`` node.

    ``placeholder``, ``get_attr`` and ``output`` keep their fx op names.
    """
    if node.op in ("placeholder", "get_attr", "output"):
        return node.op
    if node.op == "call_module":
        return "module"
    if node.op == "call_method":
        name = str(node.target)
    else:
        target = node.target
        if target in _PY_OPS:
            return _PY_OPS[target]
        packet = getattr(target, "_overloadpacket", None)
        if packet is not None:
            name = packet.__name__
        else:
            name = getattr(target, "__name__", str(target))
    name = _ALIASES.get(name, name)
    if name.endswith("_") and not name.startswith("_") and name[:-1] in ("add", "mul", "sub", "div", "clamp"):
        name = name[:-1]
    return _ALIASES.get(name, name)


_PATH_JUNK = re.compile(r"\.slice\([^)]*\)|\[|\]|L__self__|\._modules")


def clean_path(raw: str, modules: dict[str, nn.Module], wrapper_prefix: str = "m") -> str:
    """Map a module path from ``nn_module_stack`` to the ``named_modules()`` name (strips export's wrapper)."""
    path = _PATH_JUNK.sub(lambda m: "." if m.group(0) == "[" else "", raw)
    path = path.replace("'", "").replace('"', "").strip(".")
    path = re.sub(r"\.+", ".", path)
    if path == wrapper_prefix:
        path = ""
    elif path.startswith(wrapper_prefix + ".") and path not in modules:
        path = path[len(wrapper_prefix) + 1:]
    while path and path not in modules:
        path = path.rpartition(".")[0]
    return path


def owner(node: fx.Node, modules: dict[str, nn.Module]) -> str:
    """The path of the innermost module whose forward produced ``node`` ('' for the root)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    raw = list(stack.values())[-1]
    raw_path = raw[0] if isinstance(raw, tuple) else str(raw)
    return clean_path(raw_path, modules)


def module_stack(node: fx.Node, modules: dict[str, nn.Module]) -> list[str]:
    """All enclosing module paths, outermost first (cleaned, duplicates dropped)."""
    if node.op == "call_module" and not node.meta.get("nn_module_stack"):
        return [str(node.target)]
    out: list[str] = []
    for raw in (node.meta.get("nn_module_stack") or {}).values():
        path = clean_path(raw[0] if isinstance(raw, tuple) else str(raw), modules)
        if path and (not out or out[-1] != path):
            out.append(path)
    return out


def val(node: Any) -> Any:
    """The fake value recorded for a node (a tensor, a tuple of tensors, or None)."""
    if isinstance(node, fx.Node):
        return node.meta.get("val")
    return None


def shape(node: Any) -> Optional[tuple[int, ...]]:
    """The concrete shape of a node's tensor value, or None when it has none or a dim is data-dependent.

    Export on fake tensors gives data-dependent sizes (``x[mask]``, ``nonzero``, MoE routing) unbacked
    symbols; reading one as an int raises ``GuardOnDataDependentSymNode`` (a RuntimeError), so such a shape
    is unknown rather than a crash.
    """
    v = val(node)
    if isinstance(v, torch.Tensor):
        try:
            return tuple(int(s) for s in v.shape)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def sizes(node: Any) -> Optional[tuple[Optional[int], ...]]:
    """The shape of a node's tensor value dim by dim: an int per concrete dim, None per data-dependent one
    (an unbacked symbol of ``x[mask]``, ``nonzero``, MoE routing); None when the node has no tensor value.
    ``h[mask]`` of an ``(N, S, D)`` tensor is ``(None, D)``: its rank and feature size stay known where
    :func:`shape` gives up."""
    v = val(node)
    if not isinstance(v, torch.Tensor):
        return None
    out: list[Optional[int]] = []
    for s in v.shape:
        try:
            out.append(int(s))
        except (TypeError, ValueError, RuntimeError):
            out.append(None)
    return tuple(out)


def rank(node: Any) -> Optional[int]:
    """The number of dims of a node's tensor value (known even when a size is data-dependent), else None."""
    v = val(node)
    return v.dim() if isinstance(v, torch.Tensor) else None


def dtype(node: Any) -> Optional[torch.dtype]:
    v = val(node)
    return v.dtype if isinstance(v, torch.Tensor) else None


def tensor_inputs(node: fx.Node) -> list[fx.Node]:
    """Argument nodes of ``node`` in order, flattened through lists/tuples/dicts (no duplicates)."""
    out: list[fx.Node] = []

    def walk(a):
        if isinstance(a, fx.Node):
            if a not in out:
                out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)

    walk(node.args)
    walk(node.kwargs)
    return out


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name`` of ``node``, taken from kwargs or else from position ``index``."""
    if name in node.kwargs:
        return node.kwargs[name]
    if index < len(node.args):
        return node.args[index]
    return default


@dataclass
class Reduction:
    """A reduction (``mean``, ``sum``, ``var``, ``std``, ...) over ``dims`` of ``source``.

    ``dims`` are non-negative, sorted; ``correction`` is the variance's Bessel correction (0 population,
    1 unbiased) for var/std, else None.
    """

    op: str
    source: fx.Node
    dims: tuple[int, ...]
    keepdim: bool
    correction: Optional[float]


REDUCTIONS = ("mean", "sum", "var", "std", "var_mean", "std_mean", "amax", "norm", "linalg_vector_norm")


def reduction(node: fx.Node) -> Optional[Reduction]:
    """Describe ``node`` as a reduction, or None when it is not one (or its input rank is unknown). Only the
    input's rank is needed: a reduction over a tensor with a data-dependent size (the RMSNorm of ``h[mask]``)
    is one too."""
    name = op_name(node)
    if name not in REDUCTIONS or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    src = node.args[0]
    n_dims = rank(src)
    if n_dims is None:
        return None
    dims: Any = arg(node, 1, "dim", None)
    correction: Optional[float] = None
    keepdim = bool(arg(node, 2, "keepdim", False)) if name in ("mean", "sum", "amax") else False
    if name in ("var", "std", "var_mean", "std_mean"):
        a1 = arg(node, 1, "dim", None)
        dims = a1
        if isinstance(a1, bool):  # x.var(unbiased)
            dims, correction = None, float(a1)
        unbiased = node.kwargs.get("unbiased")
        pos2 = node.args[2] if len(node.args) > 2 else None
        if isinstance(pos2, bool) and "correction" not in node.kwargs:
            unbiased = pos2
        if "correction" in node.kwargs and node.kwargs["correction"] is not None:
            correction = float(node.kwargs["correction"])
        elif unbiased is not None:
            correction = 1.0 if unbiased else 0.0
        elif correction is None:
            correction = 1.0
        keepdim = bool(node.kwargs.get("keepdim", node.args[3] if len(node.args) > 3 and isinstance(node.args[3], bool) else False))
    if name in ("norm", "linalg_vector_norm"):
        dims = arg(node, 2, "dim", None)
        keepdim = bool(arg(node, 3, "keepdim", False))
    if dims is None or dims == []:
        dims = tuple(range(n_dims))
    elif isinstance(dims, int):
        dims = (dims,)
    try:
        norm_dims = tuple(sorted({int(d) % n_dims for d in dims})) if n_dims else ()
    except (TypeError, ValueError):
        return None
    return Reduction(op=name, source=src, dims=norm_dims, keepdim=keepdim, correction=correction)


def scalar_operand(node: fx.Node) -> Optional[float]:
    """The Python number among a binary op's arguments (e.g. the eps of ``var + eps``), else None."""
    for a in list(node.args[:2]) + [node.kwargs.get("other"), node.kwargs.get("alpha")]:
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return float(a)
    return None


def strip_through(node: Any, ops: tuple[str, ...], limit: int) -> Any:
    """Follow ``node`` back along its first argument while it is one of ``ops`` (canonical names, see
    :func:`op_name`), at most ``limit`` steps; stops at a node whose first argument is no node. Returns where
    it stopped (``node`` itself when it is no fx node)."""
    seen = 0
    while isinstance(node, fx.Node) and op_name(node) in ops and node.args and seen < limit:
        first = node.args[0]
        if not isinstance(first, fx.Node):
            break
        node = first
        seen += 1
    return node


def strip_neutral(node: Any, backward: bool = True) -> Any:
    """Follow casts, clones, dropout and other value-preserving ops back to their source (at most 16)."""
    return strip_through(node, NEUTRAL_OPS, 16)


FOLLOW = object()


def forward_walk(start: fx.Node, step, depth: int = 6) -> Any:
    """Breadth-first over the users of ``start``, level by level, at most ``depth`` levels: the bounded forward
    walk of site discovery and of weight roles. ``step(user, node)`` (``user`` a user of ``node``) returns
    :data:`FOLLOW` to walk on through ``user``, None to go no further that way, or any other value to end the
    walk with it. Returns that value, or None when no step ended it."""
    frontier = [start]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for user in n.users:
                got = step(user, n)
                if got is FOLLOW:
                    nxt.append(user)
                elif got is not None:
                    return got
        if not nxt:
            return None
        frontier = nxt
    return None


def reach(start: fx.Node, follow: Callable[[fx.Node, fx.Node], bool], depth: Optional[int] = None) -> list[fx.Node]:
    """The nodes reached forward from ``start``: breadth-first over users, level by level, each node reached at
    most once, at most ``depth`` levels (None: until nothing is left to follow, which ends since an fx graph
    has no cycle). ``follow(user, node)`` is asked for each user of a reached node (or of ``start``) not
    reached yet and says whether ``user`` is reached and walked on through; a user it refuses from one node
    may still be reached from another. Returns the reached nodes in the order reached, ``start`` not among
    them. Unlike :func:`forward_walk` no node is visited twice and the walk does not end early.

    >>> import torch
    >>> def f(x):
    ...     y = torch.relu(x)
    ...     return (y + x).neg()
    >>> x = next(iter(torch.fx.symbolic_trace(f).graph.nodes))
    >>> [n.name for n in reach(x, lambda user, node: True)]
    ['relu', 'add', 'neg', 'output']
    >>> [n.name for n in reach(x, lambda user, node: True, depth=1)]
    ['relu', 'add']
    >>> [n.name for n in reach(x, lambda user, node: node.name != "x" or user.name == "relu")]
    ['relu', 'add', 'neg', 'output']
    """
    seen, out, frontier, level = {start}, [], [start], 0
    while frontier and (depth is None or level < depth):
        nxt = []
        for n in frontier:
            for user in n.users:
                if user not in seen and follow(user, n):
                    seen.add(user)
                    out.append(user)
                    nxt.append(user)
        frontier, level = nxt, level + 1
    return out
