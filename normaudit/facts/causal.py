"""Whether a norm whose statistics span time sits in a causal stream: a convolutional video or audio model built
causal must not let a frame's output depend on later frames, and a GroupNorm over (N, C, T, H, W) or (N, C, T)
takes each group's mean and variance over all T (Wu & He 2018; PyTorch nn.GroupNorm docs), future frames
included.

Two facts, for GroupNorm and InstanceNorm sites whose statistics span a sequence or depth axis:

- ``site.batchnorm.causal_conv`` (:func:`causal_neighbour`): a causal convolution next to the norm, the one
  producing its input or the one reading its output (through activations, dropout, padding and residual
  adds): a convolution fed by causal padding (``F.pad`` of ``k - 1`` frames before and none after along one
  dim, ``k`` its kernel size there, the other dims symmetric: WaveNet's causal convolution, van den Oord et
  al. 2016), or a convolution module (or the module holding it) whose class name says ``Causal``
  (``CausalConv3d``) or whose ``causal``/``is_causal`` attribute is True. Only the norm's neighbours count: a
  causal sub-model elsewhere (a conformer's causal depthwise convolution in a codec's semantic encoder) says
  nothing about this norm's stream;
- ``model.causal_time`` (:func:`_config_flag`): the configuration declares causal convolutions
  (``use_causal_conv``, ``causal_conv``, ``causal`` set to True, also in a nested sub-configuration).
"""
from __future__ import annotations

from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.context import FactContext, Facts
from normaudit.vocabulary.graph import op_name, shape

#: configuration keys that declare a causal model (EnCodec's ``use_causal_conv``, magvit2's ``causal``)
CAUSAL_KEYS = ("use_causal_conv", "causal_conv", "causal")
#: the kinds whose statistics can span the time axis this fact is computed for
TIME_REDUCING = ("GroupNorm", "InstanceNorm")


def _config_flag(config: Any, depth: int = 0) -> Optional[str]:
    """The first of :data:`CAUSAL_KEYS` set to True in ``config`` (a mapping) or a nested mapping, as
    ``key=True``; None otherwise."""
    if not isinstance(config, dict) or depth > 3:
        return None
    for key in CAUSAL_KEYS:
        if config.get(key) is True:
            return f"config {key}=True"
    for sub in config.values():
        found = _config_flag(sub, depth + 1)
        if found is not None:
            return found
    return None


def _is_conv(mod: Any) -> bool:
    return isinstance(mod, nn.modules.conv._ConvNd)


def _causal_module(path: str, modules: dict[str, nn.Module]) -> Optional[str]:
    """The module at ``path`` or the one holding it, when its class name says Causal or its
    ``causal``/``is_causal`` attribute is True, as ``module <path> (<class>)``; None otherwise."""
    for p in (path, path.rsplit(".", 1)[0] if "." in path else ""):
        mod = modules.get(p)
        if mod is None:
            continue
        flagged = any(getattr(mod, a, None) is True for a in ("causal", "is_causal"))
        if "causal" in type(mod).__name__.lower() or flagged:
            return f"module {p or '(root)'} ({type(mod).__name__})"
    return None


def _pad_list(node: Any) -> Optional[list[int]]:
    if not isinstance(node, fx.Node) or op_name(node) not in ("pad", "constant_pad_nd") or len(node.args) < 2:
        return None
    pad = node.args[1]
    if not isinstance(pad, (list, tuple)) or len(pad) % 2 or not all(isinstance(p, int) for p in pad):
        return None
    return list(pad)


def _conv_kernel(node: fx.Node, modules: dict[str, nn.Module]) -> Optional[tuple[str, tuple[int, ...]]]:
    """(name, kernel sizes) of a convolution node: a conv module or an aten/functional conv; else None."""
    if node.op == "call_module":
        mod = modules.get(str(node.target))
        return (str(node.target), tuple(int(k) for k in mod.kernel_size)) if _is_conv(mod) else None
    if node.op != "call_function" or "conv" not in op_name(node):
        return None
    w = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    ws = shape(w) if isinstance(w, fx.Node) else None
    return (op_name(node), tuple(int(k) for k in ws[2:])) if ws and len(ws) > 2 else None


def causal_pad(pad_node: Any, kernel: tuple[int, ...]) -> Optional[str]:
    """``pad_node`` pads a convolution's input (kernel sizes ``kernel``) causally: along one dim ``k - 1``
    before and 0 after (``k`` the kernel size there, at least 2), the other padded dims symmetrically. Returned
    as ``causal padding (k - 1, 0) of dim d``; None otherwise."""
    pad = _pad_list(pad_node)
    if pad is None:
        return None
    rank = len(shape(pad_node.args[0]) or ()) if isinstance(pad_node.args[0], fx.Node) else 0
    if rank < 3:
        return None
    pairs = [(pad[i], pad[i + 1], rank - 1 - i // 2) for i in range(0, len(pad), 2)]
    causal = [(a, d) for a, b, d in pairs if a > 0 and b == 0 and 2 <= d < 2 + len(kernel) and kernel[d - 2] == a + 1]
    if len(causal) == 1 and all(a == b for a, b, d in pairs if (a, d) != causal[0]):
        return f"causal padding ({causal[0][0]}, 0) of dim {causal[0][1]}"
    return None


def _conv_is_causal(conv: fx.Node, modules: dict[str, nn.Module]) -> Optional[str]:
    """Why the convolution node ``conv`` is causal (its input causally padded, or its module says so), else
    None."""
    found = _conv_kernel(conv, modules)
    if found is None:
        return None
    name, kernel = found
    why = causal_pad(conv.args[0] if conv.args else None, kernel)
    if why is not None:
        return f"{why} before {name}"
    return _causal_module(str(conv.target), modules) if conv.op == "call_module" else None


#: ops between a norm and the convolution next to it that leave the stream's time axis as it is
_BETWEEN = ("silu", "gelu", "relu", "elu", "leaky_relu", "mish", "sigmoid", "tanh", "dropout", "to", "alias",
            "contiguous", "clone", "add", "mul", "pad", "constant_pad_nd", "snake")


def causal_neighbour(rec: Any, modules: dict[str, nn.Module], depth: int = 6) -> Optional[str]:
    """A causal convolution next to the site of ``rec`` (module docstring): a convolution found backwards from
    its input or forwards from its output through :data:`_BETWEEN` ops (an add followed along every operand),
    within ``depth`` steps, that is causal (:func:`_conv_is_causal`); the walk stops at every convolution it
    meets, so only the norm's own neighbours count. None when none is causal."""
    def walk(start: Any, forward: bool) -> Optional[str]:
        frontier, seen = [start], set()
        for _ in range(depth):
            nxt = []
            for n in frontier:
                if not isinstance(n, fx.Node) or n in seen:
                    continue
                seen.add(n)
                nodes = list(n.users) if forward else [a for a in n.args if isinstance(a, fx.Node)]
                for m in nodes:
                    if _conv_kernel(m, modules) is not None:
                        why = _conv_is_causal(m, modules)
                        if why is not None:
                            return why
                    elif m.op in ("call_function", "call_method", "call_module") and \
                            any(k in op_name(m) for k in _BETWEEN):
                        nxt.append(m)
            frontier = nxt
        return None

    start = rec.input
    if isinstance(start, fx.Node) and _conv_kernel(start, modules) is not None:
        backward = _conv_is_causal(start, modules)  # the norm reads a convolution's output: that one decides
    else:
        backward = walk(start, False)
    return walk(rec.output, True) or backward


def _over_time(site: Any) -> bool:
    return site.kind in TIME_REDUCING and bool({"sequence", "depth"} & set(site.normalized_axes or []))


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``causal-time``: for each GroupNorm or InstanceNorm whose statistics span a sequence or depth axis,
    ``site.batchnorm.causal_conv`` (:func:`causal_neighbour`); ``model.causal_time`` from the configuration
    when there is such a norm."""
    over = [r for r in facts.records if _over_time(r.site)]
    if not over:
        return
    modules = ctx.cap.modules if ctx.cap is not None else {}
    for rec in over:
        if rec.input is not None or rec.output is not None:
            rec.site.batchnorm.causal_conv = causal_neighbour(rec, modules)
    facts.model.causal_time = _config_flag(ctx.config or {})
