"""What a hand-written statistic measures: from a root (``sqrt``/``rsqrt``/``pow(±0.5)``) back through
``+ eps``/clamp/casts to the reduction (:func:`find_stat`), then its source tensor, reduced dims, whether it
is centred and which estimator it is (:func:`analyse_stat`): ``var``/``std`` (``torch.var_mean`` too, whose
variance reaches the root through ``getitem``), a mean of squares (centred or not), a sum of squares (the L2
norm, the RMS up to sqrt(d)), or a cumulative statistic over steps ``0..t`` along time by cumulative sums
(hint ``statistic="cumulative"``, ``cumulative_dim``)."""
from __future__ import annotations

from typing import Any, Optional

from torch import fx

from normaudit.vocabulary.graph import arg, op_name, rank, reduction, scalar_operand, strip_neutral


def is_root(node: fx.Node) -> bool:
    """sqrt/rsqrt/pow(±0.5) of a tensor: where a statistic becomes a scale."""
    name = op_name(node)
    if not node.args or not isinstance(node.args[0], fx.Node):
        return False
    return name in ("rsqrt", "sqrt") or (name == "pow" and len(node.args) > 1 and node.args[1] in (0.5, -0.5))


def find_stat(scale_in: fx.Node) -> Optional[tuple[fx.Node, Optional[float], str]]:
    """From the argument of sqrt/rsqrt, walk back through ``+ eps``/clamp/casts to the statistic.

    Returns (statistic node, eps, how eps enters) or None.
    """
    node, eps, how = scale_in, None, "none"
    for _ in range(6):
        node = strip_neutral(node)
        if not isinstance(node, fx.Node):
            return None
        name = op_name(node)
        if name == "add":
            c = scalar_operand(node)
            if c is None:
                return None
            eps, how = c, "inside_sqrt"
            node = node.args[0] if isinstance(node.args[0], fx.Node) else node.args[1]
            continue
        if name in ("clamp", "maximum"):
            c = arg(node, 1, "min", None)
            if isinstance(c, (int, float)):
                eps, how = float(c), "clamp"
            node = node.args[0]
            continue
        if name == "getitem" and len(node.args) > 1 and node.args[1] == 0 and isinstance(node.args[0], fx.Node):
            # var, mean = torch.var_mean(...): the variance is element 0 of the tuple
            red = reduction(node.args[0])
            if red is not None and red.op == "var_mean":
                return node.args[0], eps, how
            return None
        if reduction(node) is not None or _cumulative_mean(node) is not None:
            return node, eps, how
        return None
    return None


def _cumulative_mean(node: Any) -> Optional[tuple[fx.Node, int]]:
    """``cumsum(sum(v, dims, keepdim=True), t) / count``: the running mean over dim ``t`` (time) of per-step
    sums over ``dims``, as a causal (streaming) norm computes its statistics: at step ``t`` the mean over
    steps ``0..t`` (transformers' Gemma3n audio ``Gemma3nAudioCumulativeGroupNorm``, after JAX's
    ``GroupNormalization(cumulative=True)``). Returns (the per-step ``sum`` node, ``t``) or None."""
    node = strip_neutral(node)
    if not isinstance(node, fx.Node) or op_name(node) != "div" or len(node.args) < 2:
        return None
    num = strip_neutral(node.args[0])
    if not isinstance(num, fx.Node) or op_name(num) != "cumsum" or not num.args:
        return None
    step, t = strip_neutral(num.args[0]), arg(num, 1, "dim", None)
    red = reduction(step) if isinstance(step, fx.Node) else None
    n_dims = rank(step)
    if red is None or red.op != "sum" or not red.keepdim or not isinstance(t, int) or not n_dims:
        return None
    t %= n_dims
    return (step, t) if t not in red.dims else None


def _cumulative_source(node: Any) -> Optional[fx.Node]:
    """If ``node`` is ``x - cumulative_mean(x)`` (:func:`_cumulative_mean`, through casts) return x."""
    node = strip_neutral(node)
    if isinstance(node, fx.Node) and op_name(node) == "sub" and len(node.args) > 1:
        a, cum = node.args[0], _cumulative_mean(node.args[1])
        if cum is not None and strip_neutral(reduction(cum[0]).source) is strip_neutral(a):
            return a
    return None


def _square_source(node: fx.Node) -> Optional[fx.Node]:
    """If ``node`` is x**2 / x*x / square(x) return x, else None."""
    name = op_name(node)
    if name == "pow" and len(node.args) > 1 and node.args[1] == 2 and isinstance(node.args[0], fx.Node):
        return node.args[0]
    if name == "square" and isinstance(node.args[0], fx.Node):
        return node.args[0]
    if name == "mul" and len(node.args) > 1 and node.args[0] is node.args[1] and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def _centered_source(node: fx.Node) -> Optional[fx.Node]:
    """If ``node`` is ``x - mean(x)`` (through casts) return x, else None."""
    node = strip_neutral(node)
    if isinstance(node, fx.Node) and op_name(node) == "sub" and len(node.args) > 1:
        a, m = node.args[0], strip_neutral(node.args[1])
        if isinstance(m, fx.Node) and op_name(m) == "mean":
            red = reduction(m)
            if red is not None and strip_neutral(red.source) is strip_neutral(a):
                return a
    return None


def analyse_stat(stat: fx.Node) -> Optional[dict[str, Any]]:
    """What a statistic node measures: source tensor, reduced dims, centred or not, estimator; a cumulative
    statistic (:func:`_cumulative_mean` of squares) also its time dim (``cumulative_dim``)."""
    red = reduction(stat)
    if red is None:
        return _analyse_cumulative(stat)
    if red.op in ("var", "std", "var_mean", "std_mean"):
        return {"source": red.source, "dims": red.dims, "centered": True,
                "variance": "unbiased" if (red.correction or 0) >= 1 else "population", "std": red.op == "std"}
    if red.op == "sum":
        # sum of squares (nGPT's x * rsqrt(sum(x^2) + eps)): the L2 norm, the RMS up to sqrt(d)
        sq = _square_source(strip_neutral(red.source))
        if sq is None or _centered_source(sq) is not None:
            return None
        return {"source": sq, "dims": red.dims, "centered": False, "variance": "mean_square", "std": False,
                "statistic": "l2_norm"}
    if red.op == "mean":
        sq = _square_source(strip_neutral(red.source))
        if sq is None:
            return None
        centred = _centered_source(sq)
        if centred is not None:
            return {"source": centred, "dims": red.dims, "centered": True, "variance": "population", "std": False}
        return {"source": sq, "dims": red.dims, "centered": False, "variance": "mean_square", "std": False}
    return None


def _analyse_cumulative(stat: fx.Node) -> Optional[dict[str, Any]]:
    """:func:`analyse_stat` of a running mean of squares over time: ``cumsum(sum((x - m)^2)) / count`` with
    ``m`` the running mean of ``x`` is the cumulative variance of ``x`` (centred); of ``x^2``, its cumulative
    mean square. The statistic at step ``t`` covers ``dims`` of steps ``0..t``."""
    cum = _cumulative_mean(stat)
    if cum is None:
        return None
    step, t = cum
    red = reduction(step)
    sq = _square_source(strip_neutral(red.source))
    if sq is None:
        return None
    info = {"dims": red.dims, "std": False, "statistic": "cumulative", "cumulative_dim": t}
    centred = _cumulative_source(sq)
    if centred is not None:
        return {**info, "source": centred, "centered": True, "variance": "population"}
    return {**info, "source": sq, "centered": False, "variance": "mean_square"}
