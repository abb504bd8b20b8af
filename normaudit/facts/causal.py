"""Whether a model says it is causal along its time axis (``model.causal_time``), for the norms whose statistics
span that axis: a convolutional video or audio model built causal must not let a frame's output depend on later
frames, and a GroupNorm over (N, C, T, H, W) or (N, C, T) takes each group's mean and variance over all T
(Wu & He 2018; PyTorch nn.GroupNorm docs), future frames included.

A model says it is causal (:func:`causal_evidence`, the first found, in this order):

- a configuration flag: ``causal``, ``is_causal``, ``use_causal_conv``, ``causal_conv``, ``causal_padding``
  (or a nested sub-configuration's) set to True;
- a convolution module, or a module holding one as a direct child, whose class name says ``Causal``
  (``CausalConv3d``, ``CausalConv1d``) or whose ``causal``/``is_causal`` attribute is True;
- causal padding in the graph: ``F.pad`` feeding a convolution that pads one dim by ``k - 1`` before and 0
  after, where ``k`` is the kernel size along that dim, and the other dims symmetrically (the causal
  convolution of WaveNet, van den Oord et al. 2016, and of causal video VAEs).

Attention modules' ``is_causal`` flags do not count: a decoder's causal attention says nothing about the
convolutions' time axis.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.context import FactContext, Facts
from normaudit.vocabulary.graph import op_name, shape

#: configuration keys that declare a causal model (EnCodec's ``use_causal_conv``, magvit2's ``causal``)
CAUSAL_KEYS = ("causal", "is_causal", "use_causal_conv", "causal_conv", "causal_padding")
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


def _causal_module(modules: dict[str, nn.Module]) -> Optional[str]:
    """The first convolution (or module with a convolution child) whose class name says Causal or whose
    ``causal``/``is_causal`` attribute is True, as ``module <path> (<class>)``; None otherwise."""
    for path, mod in modules.items():
        convish = _is_conv(mod) or any(_is_conv(c) for c in mod.children())
        if not convish:
            continue
        flagged = any(getattr(mod, a, None) is True for a in ("causal", "is_causal"))
        if "causal" in type(mod).__name__.lower() or flagged:
            return f"module {path or '(root)'} ({type(mod).__name__})"
    return None


def _pad_list(node: fx.Node) -> Optional[list[int]]:
    name = op_name(node)
    if name not in ("pad", "constant_pad_nd") or len(node.args) < 2:
        return None
    pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad")
    if not isinstance(pad, (list, tuple)) or len(pad) % 2 or not all(isinstance(p, int) for p in pad):
        return None
    return list(pad)


def _conv_kernel(user: fx.Node, modules: dict[str, nn.Module]) -> Optional[tuple[str, tuple[int, ...]]]:
    """(name, kernel sizes) of a convolution node: a conv module or an aten/functional conv; else None."""
    if user.op == "call_module":
        mod = modules.get(str(user.target))
        if _is_conv(mod):
            return str(user.target), tuple(int(k) for k in mod.kernel_size)
        return None
    if op_name(user) != "conv" and "conv" not in op_name(user):
        return None
    w = user.args[1] if len(user.args) > 1 else user.kwargs.get("weight")
    ws = shape(w) if isinstance(w, fx.Node) else None
    return (op_name(user), tuple(int(k) for k in ws[2:])) if ws and len(ws) > 2 else None


def causal_padding(graph: Optional[fx.Graph], modules: dict[str, nn.Module]) -> Optional[str]:
    """The first ``F.pad`` of ``graph`` that pads a convolution's input causally: along one dim ``k - 1`` before
    and 0 after (``k`` the kernel size there, at least 2), the other padded dims symmetrically. Returned as
    ``causal padding (k - 1, 0) of dim d before <conv>``; None when there is none."""
    if graph is None:
        return None
    for node in graph.nodes:
        pad = _pad_list(node)
        if pad is None:
            continue
        rank = len(shape(node.args[0]) or ()) if isinstance(node.args[0], fx.Node) else 0
        for user in node.users:
            conv = _conv_kernel(user, modules)
            if conv is None or rank < 3:
                continue
            name, kernel = conv
            pairs = [(pad[i], pad[i + 1], rank - 1 - i // 2) for i in range(0, len(pad), 2)]
            causal = [(a, d) for a, b, d in pairs if a > 0 and b == 0 and d >= 2 and d - 2 < len(kernel)
                      and kernel[d - 2] == a + 1]
            others_symmetric = all(a == b for a, b, d in pairs if (a, d) not in causal)
            if len(causal) == 1 and others_symmetric:
                a, d = causal[0]
                return f"causal padding ({a}, 0) of dim {d} before {name}"
    return None


def causal_evidence(config: Any, modules: dict[str, nn.Module], graph: Optional[fx.Graph]) -> Optional[str]:
    """What says the model is causal along time (module docstring), in words; None when nothing does."""
    return _config_flag(config) or _causal_module(modules) or causal_padding(graph, modules)


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``causal-time``: ``model.causal_time`` for a model with a GroupNorm or InstanceNorm whose statistics
    span a sequence or depth axis (the only norms a rule reads it for); left None otherwise."""
    if not any(r.site.kind in TIME_REDUCING and {"sequence", "depth"} & set(r.site.normalized_axes or [])
               for r in facts.records):
        return
    cap = ctx.cap
    gm = cap.gm if cap is not None else None
    modules = cap.modules if cap is not None else {}
    facts.model.causal_time = causal_evidence(ctx.config or {}, modules, gm.graph if gm is not None else None)
