"""The formula of a norm site in words, as its report and messages show it: :func:`formula_text` for the
LayerNorm/RMSNorm family (``LayerNorm: (x - mean) / sqrt(var_pop + eps) * w + b over [feature]``), and the forms
that template does not describe (:func:`special_text`: GRN, sums of squares, L2 norms, EvoNorm, cumulative
norms). Reads a :class:`normaudit.report.Formula` and the site's hints only."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from normaudit.report import Formula
from normaudit.vocabulary.kinds import MEAN_SUBTRACTING_KINDS


def formula_text(kind: str, formula, axes: Sequence[str] = ()) -> str:
    """One short human form of what a site computes, e.g.
    ``LayerNorm: (x - mean) / sqrt(var_pop + eps) * w + b over [feature]`` or
    ``RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w) over [feature]``.

    ``formula`` is a ``normaudit.report.Formula`` (or anything with its attributes); facts left None are
    filled with the textbook value for ``kind`` (mean-subtracting kinds: population variance), and facts
    that are ``unknown`` print as ``?``."""
    get = lambda name: getattr(formula, name, None)  # noqa: E731
    mean = get("mean_subtracted")
    if mean is None:
        mean = kind in MEAN_SUBTRACTING_KINDS
    variance = get("variance") or ("population" if mean else "mean_square")
    pos = get("eps_position") or "inside_sqrt"
    c = "(x - mean)" if mean else "x"
    stat = {"population": "var_pop", "unbiased": "var_unbiased", "mean_square": "mean(x^2)",
            "none": None}.get(variance, "var?")
    if stat is None:
        body = c
    elif get("inverted_scale"):
        body = f"{c} * sqrt({stat} + eps)"
    elif pos == "outside_sqrt":
        body = f"{c} / (sqrt({stat}) + eps)"
    elif pos == "clamp":
        body = f"{c} / max(sqrt({stat}), eps)"
    elif pos == "none":
        body = f"{c} / sqrt({stat})"
    elif pos == "unknown":
        body = f"{c} / sqrt({stat}) [eps ?]"
    else:
        body = f"{c} / sqrt({stat} + eps)"
    body += {"weight": " * w", "one_plus_weight": " * (1 + w)", "none": "", "unknown": " * g(w)?"}.get(
        get("gain") or "weight", "")
    if get("bias") or (get("bias") is None and mean and kind != "RMSNorm"):
        body += " + b"
    return f"{kind}: {body} over [{', '.join(axes) or '?'}]"


def special_text(rec: Any, f: Formula) -> Optional[str]:
    """The formula text of sites the LayerNorm/RMSNorm template does not describe: Global Response
    Normalization (Woo et al. 2023, eq. 1-3), sums of squares (nGPT's ``x * rsqrt(sum(x^2) + eps)``, a unit
    L2 norm) and the EvoNorm forms (Liu et al. 2020: a gated numerator,
    ``x * sigmoid(v * x)``, or a ``max`` of two denominators), and cumulative norms (statistics of steps
    ``0..t`` along a time dim, Gemma3n audio's cumulative GroupNorm)."""
    s, h = rec.site, rec.hints
    axes = ", ".join(s.normalized_axes or []) or "?"
    if h.get("statistic") == "grn":
        return f"Other (GRN): x * (1 + w * nx) + b, nx = ||x||_2 / (mean(||x||_2) + eps) over [{axes}]"
    if h.get("sum_of_squares"):
        return formula_text(s.kind, f, s.normalized_axes or []).replace("mean(x^2)", "sum(x^2)")
    if h.get("statistic") == "l2_norm" and "l2_pre" in h:
        return l2_text(rec, f)
    form = h.get("form")
    if form == "cumulative":  # statistics of steps 0..t (a streaming norm): mean and variance are running ones
        t = s.cumulative_dim
        centred = ("(x - mean_0..t) / sqrt(var_pop_0..t + eps)" if f.mean_subtracted
                   else "x / sqrt(mean_0..t(x^2) + eps)")
        gain = " * w" if f.gain == "weight" else ""
        bias = " + b" if f.bias else ""
        return f"Other (cumulative): {centred}{gain}{bias} over [{axes}] of steps 0..t along dim {t}"
    if form == "gated":
        return f"Other (EvoNorm-S): x * sigmoid(v * x) / sqrt(var_pop + eps) * w + b over [{axes}]"
    if form == "combined":
        return f"Other (EvoNorm-B): x / max(sqrt(running_var + eps), v * x + sqrt(var_pop + eps)) * w + b over [{axes}]"
    return None


def l2_text(rec: Any, f: Formula) -> str:
    """The formula text of a norm by the 2-norm (``x / max(||x||_2, eps)``, ``F.normalize``, ZAYA's
    ``x * sqrt(d) / max(||x||_2, eps)``), written as computed: the denominator is ``||x||_2``, or
    ``sqrt(mean(x^2))`` where a constant ``d ** -0.5`` turns it into the RMS before eps enters
    (``||x||_2 = sqrt(sum(x^2)) = sqrt(d) * sqrt(mean(x^2))`` over the ``d`` reduced elements), and a
    constant factor after eps multiplies the numerator (``sqrt(d)`` when it is that). Gain and bias as
    :func:`formula_text` writes them."""
    s, h = rec.site, rec.hints
    shp = s.input_shape or []
    d = math.prod(shp[i] for i in s.reduced_dims or [] if i < len(shp)) if shp else None

    def named(c: float, word: str = "sqrt(d)") -> str:
        return word if d and math.isclose(c, math.sqrt(d), rel_tol=1e-6) else f"{c:g}"

    pre, post = float(h["l2_pre"]), float(h["l2_post"])
    if d and math.isclose(pre, d ** -0.5, rel_tol=1e-6):
        den = "sqrt(mean(x^2))"
    else:
        den = "||x||_2" if math.isclose(pre, 1.0) else f"{named(1 / pre)} ** -1 * ||x||_2"
    num = "x" if math.isclose(post, 1.0) else f"x * {named(1 / post)}"
    body = {"clamp": f"{num} / max({den}, eps)", "outside_sqrt": f"{num} / ({den} + eps)"}.get(
        f.eps_position or "", f"{num} / {den}")
    gain = {"weight": " * w", "one_plus_weight": " * (1 + w)", "none": "", "unknown": " * g(w)?"}.get(
        f.gain or "weight", "")  # as formula_text writes them
    return f"{s.kind}: {body}{gain}{' + b' if f.bias else ''} over [{', '.join(s.normalized_axes or []) or '?'}]"
