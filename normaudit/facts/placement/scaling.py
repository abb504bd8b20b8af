"""Constant scalings of the residual adds: ``model.residual_scales``.

A residual add may scale one operand by a constant: the branch in ``x + alpha * f(x)`` (Granite's
``residual_multiplier``, MiniCPM's ``scale_depth / sqrt(num_layers)``), the skip in DeepNorm's
``LN(alpha * x + f(x))`` (Wang et al. 2022, DeepNet, arXiv 2203.00555, eq. 4, with alpha = (2N)^(1/4) for an
N-layer encoder). Which operand is scaled tells the schemes apart: a DeepNorm port that scales the branch and
leaves its LayerNorm unapplied (``x + alpha * f(x)``; labmlai/annotated_deep_learning_paper_implementations
#145) computes neither.

A scaling is a ``mul`` (or ``div``, read as its reciprocal) of the operand, seen through casts, dropout and
views, by a number written in the code (a Python int or float, as both capture methods record it); a learned
scale (a parameter: LayerScale, ReZero) or a buffer is no constant scaling.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from torch import fx

from normaudit.facts.placement.graph import StreamGraph
from normaudit.facts.placement.records import ResidualAdd
from normaudit.report import ResidualScale
from normaudit.vocabulary.graph import op_name, shape


def _number(arg: Any) -> Optional[float]:
    """``arg`` as a finite constant number (a Python int or float, not a bool), else None."""
    if isinstance(arg, bool) or not isinstance(arg, (int, float)):
        return None
    value = float(arg)
    return value if math.isfinite(value) else None


def scale_of(g: StreamGraph, node: fx.Node) -> Optional[float]:
    """The constant ``node`` multiplies its one tensor operand by (``x * 2.0``, ``2.0 * x``, ``x / 4`` -> 0.25),
    seen through aliases; None when ``node`` is no such scaling or the factor is 1."""
    n = g.strip(node)
    if not isinstance(n, fx.Node) or op_name(n) not in ("mul", "div") or len(n.args) < 2:
        return None
    a, b = n.args[0], n.args[1]
    factor = _number(b)
    if factor is None and op_name(n) == "mul":
        factor = _number(a)
        a = b
    if factor is None or not isinstance(a, fx.Node) or a in g.pderived or a in g.const:
        return None
    if op_name(n) == "div":
        factor = 1.0 / factor if factor else None
    if factor is None or factor == 1.0 or (shape(a) is not None and shape(a) != shape(n)):
        return None
    return factor


def residual_scales(g: StreamGraph, adds: list[ResidualAdd]) -> list[ResidualScale]:
    """The distinct constant scalings of the residual adds' operands (``skip`` or ``branch``), in graph order of
    their first add (distinct, not counted, so the fact of a stack's four captured blocks is the whole stack's
    under depth-independent capture)."""
    out: dict[tuple[str, float], ResidualScale] = {}
    for add in adds:
        for operand, node in (("skip", add.skip), ("branch", add.branch)):
            if operand == "skip" and add.shortcut is not None:
                continue
            factor = scale_of(g, node)
            if factor is None:
                continue
            key = (operand, round(factor, 12))
            out.setdefault(key, ResidualScale(operand=operand, value=factor))  # type: ignore[arg-type]
    return list(out.values())
