"""Where a hand-written norm's scale is applied and to what: the ``mul``/``div`` that applies a scale to the
tensor its statistic was taken on (through casts, broadcasting and reshapes: a group std taken on
``x.reshape(B, G, ...)``; or to a weight's projection of that tensor), the gain/bias chain after it, what the
numerator is (centred, plain or gated) and whether the denominator combines the scale with another tensor."""
from __future__ import annotations

from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.sites.activations import is_act
from normaudit.vocabulary.graph import FOLLOW, NEUTRAL_OPS, forward_walk, op_name, owner, reduction, shape, \
    strip_neutral


VIEW_OPS = ("view", "reshape", "permute", "transpose", "contiguous", "flatten", "unflatten", "_unsafe_view",
             "clone")


def view_base(node: Any) -> Any:
    """``node`` through casts and layout-only ops (reshape into groups, permute): the tensor it views."""
    for _ in range(16):
        node = strip_neutral(node)
        if isinstance(node, fx.Node) and op_name(node) in VIEW_OPS and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
            continue
        return node
    return node


def _related(node: Any, source: fx.Node, depth: int = 5) -> bool:
    """True when ``node`` is ``source`` or derives from it (or its centred form, or a view of either: a
    group-wise statistic is taken on ``x.reshape(B, G, -1)`` and applied to ``x``) within a few hops."""
    target = view_base(source)
    frontier = [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if not isinstance(n, fx.Node):
                continue
            s = strip_neutral(n)
            if s is target or n is source or view_base(s) is target:
                return True
            if isinstance(s, fx.Node) and op_name(s) in ("sub", "mul", "div", "to", "add", "alias"):
                nxt.extend(a for a in s.args if isinstance(a, fx.Node))
        frontier = nxt
    return False


SCALE_PATH = ("expand", "expand_as", "unsqueeze", "view", "reshape", "_unsafe_view")
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
    x, w = node.args[0], view_base(node.args[1])
    return isinstance(w, fx.Node) and w not in act and _related(x, source)


def apply_node(scale: fx.Node, source: fx.Node, by: str, dims: Any = None,
                act: Optional[set] = None) -> Optional[fx.Node]:
    """The mul/div that applies ``scale`` to the source tensor, following casts, broadcasting and reshapes
    forward (a group std computed on ``x.reshape(B, G, ...)`` is reshaped back to ``x``'s shape) and
    ``max``/``+`` combinations of the denominator (EvoNorm-B0: ``x / max(sqrt(var + eps), v * x + std)``).
    With the statistic's ``dims`` and the activations ``act``: also the mul that applies it to a weight's
    projection of the source (:func:`_projected`)."""
    def step(user: fx.Node, n: fx.Node) -> Any:
        name = op_name(user)
        if name in ("mul", "div") and len(user.args) > 1:
            other = user.args[0] if user.args[1] is n else user.args[1]
            if user.args[0] is n and name == "div":
                return None
            if _related(other, source) or (by == "mul" and _projected(other, source, dims, act)):
                return user
        if name in NEUTRAL_OPS or name in SCALE_PATH:
            return FOLLOW
        if name in ("maximum", "max", "add") and len(user.args) > 1 and all(
                isinstance(a, fx.Node) for a in user.args[:2]):
            return FOLLOW
        return None

    return forward_walk(scale, step)


def extend_affine(out: fx.Node, owner_path: str, modules) -> tuple[fx.Node, list[fx.Node]]:
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


def norm_like(mod: Optional[nn.Module]) -> bool:
    """A module that is only a norm: no submodules, parameters with at most one dim of size > 1 (a per-feature
    gain, also shaped (1, C, 1, 1) for channels-first input), so its forward is the norm."""
    return (mod is not None and not any(True for _ in mod.children())
            and all(sum(int(d) > 1 for d in p.shape) <= 1 for p in mod.parameters(recurse=False)))


def numerator_form(other: Any, source: fx.Node, act: Optional[set]) -> str:
    """What the scale is applied to: ``centred`` (``x - mean(x)``, through gains by parameters and casts),
    ``plain`` (``x`` itself or a view of it) or ``gated`` (``x`` times another function of ``x``, as in
    EvoNorm-S0's ``x * sigmoid(v * x) / std``); ``unknown`` when the walk finds none of these."""
    node, target = other, view_base(source)
    for _ in range(8):
        node = strip_neutral(node)
        if not isinstance(node, fx.Node):
            return "unknown"
        if node is target or view_base(node) is target:
            return "plain"
        name = op_name(node)
        if name == "sub" and len(node.args) > 1:
            m = strip_neutral(node.args[1])
            if isinstance(m, fx.Node) and (
                    (op_name(m) == "mean" and reduction(m) is not None
                     and view_base(reduction(m).source) is view_base(node.args[0]))
                    or (op_name(m) == "getitem" and isinstance(m.args[0], fx.Node)
                        and op_name(m.args[0]) in ("var_mean", "std_mean"))):
                return "centred"
            return "unknown"
        if name in ("mul", "div") and len(node.args) > 1:
            acts = [a for a in node.args[:2] if is_act(a, act)]
            if len(acts) == 2 and act is not None:
                return "gated"
            if len(acts) == 1:
                node = acts[0]
                continue
            return "unknown"
        if name in VIEW_OPS and node.args:
            node = node.args[0]
            continue
        return "unknown"
    return "unknown"


def feeds_from(node: Any, scale: fx.Node, depth: int = 8) -> bool:
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


def combined_denominator(scale: fx.Node, applied: fx.Node) -> bool:
    """The scale reaches the applying node through a ``max``/``+`` with another tensor (EvoNorm-B0's
    ``max(sqrt(running_var + eps), v * x + instance_std(x))``): not a plain LayerNorm/RMSNorm."""
    frontier = [applied]
    for _ in range(8):
        nxt = []
        for n in frontier:
            for a in n.args[:2] if isinstance(n, fx.Node) else ():
                if not isinstance(a, fx.Node) or not feeds_from(a, scale):
                    continue
                if a is scale:
                    continue
                if op_name(a) in ("maximum", "max") or (op_name(a) == "add" and all(
                        isinstance(b, fx.Node) for b in a.args[:2])):
                    return True
                nxt.append(a)
        frontier = nxt
    return False
