"""Static numerics facts: a bound on each norm's output from its gains, against the dtype's maximum.

For LayerNorm and RMSNorm the normalised row ``n = (x - mean) / sqrt(var + eps)`` (or ``x / sqrt(mean(x^2) +
eps)``) has a sum of squares of at most D (the elements per row; Ba, Kiros, Hinton 2016, arXiv 1607.06450 eq.
4; Zhang & Sennrich 2019, arXiv 1910.07467 eq. 4), so no element exceeds sqrt(D) in magnitude and

    |y| <= max|gain| * sqrt(D) + max|bias|

with the *effective* gain (``1 + w`` for a ``(1 + weight)`` norm, Gemma). Above the dtype's largest finite
value (65504 for float16) the norm itself can overflow, whatever its input: Gemma-3-style post-feedforward norms
with large trained gains do in float16. Nothing runs here: the gains come from the checkpoint
(``site.weights``, read by :mod:`normaudit.facts.weights`), or, with ``--probe numerics``, from the real model
(:func:`normaudit.probes.numerics.numerics_probe` then calls :func:`bound_from_values`).

Example::

    >>> round(output_bound(gain_absmax=2.0, bias_absmax=0.5, features=100), 6)
    20.5
"""
from __future__ import annotations

import math
from typing import Any, Optional

from normaudit.facts.context import FactContext, Facts
from normaudit.report import Site, SiteNumerics
from normaudit.vocabulary.dtypes import AUDIT_DTYPES, DTYPES


#: largest finite value per dtype name (``torch.finfo(dtype).max``; IEEE 754 binary16 65504)
#: the largest finite value of each audited dtype
DTYPE_MAX = {name: DTYPES[name].max for name in AUDIT_DTYPES}
BOUNDED_KINDS = ("LayerNorm", "RMSNorm")
BIAS_LEAVES = ("bias", "beta", "b", "b_2", "shift")


def output_bound(gain_absmax: float, bias_absmax: float, features: int) -> float:
    """``gain_absmax * sqrt(features) + bias_absmax``: the largest |y| a LayerNorm/RMSNorm with these
    parameters can produce (module docstring). Raises ValueError for ``features`` < 1."""
    if features < 1:
        raise ValueError(f"features must be >= 1, got {features}")
    return gain_absmax * math.sqrt(features) + bias_absmax


def site_features(site: Site) -> Optional[int]:
    """D, the elements of one normalised row: the product of ``normalized_shape``, else of the input's
    ``reduced_dims``; None when unknown."""
    if site.normalized_shape:
        return math.prod(site.normalized_shape)
    shape, dims = site.input_shape, site.reduced_dims
    if shape and dims and all(-len(shape) <= d < len(shape) for d in dims):
        return math.prod(shape[d] for d in dims)
    return None


def gain_form(site: Site) -> str:
    """``weight``, ``one_plus_weight``, ``none`` or ``unknown``: how the site applies its gain
    (``site.gain_form``, set by the weights pass)."""
    return str(site.gain_form or "unknown")


def effective_gain_absmax(gain_min: float, gain_max: float, form: str) -> float:
    """max |g| over the gain vector given its raw extremes: ``1 + w`` for ``one_plus_weight``, else ``w``."""
    lo, hi = (1.0 + gain_min, 1.0 + gain_max) if form == "one_plus_weight" else (gain_min, gain_max)
    return max(abs(lo), abs(hi))


def bound_from_values(site: Site, gain_min: Optional[float], gain_max: Optional[float],
                      bias_absmax: Optional[float], source: str, dtype: str) -> Optional[SiteNumerics]:
    """Fill ``site.numerics`` with the output bound (creating it when absent); returns it, or None when the site
    is not a LayerNorm/RMSNorm, has no known D or gain, or applies its gain in an unknown way."""
    if site.kind not in BOUNDED_KINDS or gain_min is None or gain_max is None:
        return None
    d = site_features(site)
    form = gain_form(site)
    if d is None or form == "unknown" or not (math.isfinite(gain_min) and math.isfinite(gain_max)):
        return None
    g = effective_gain_absmax(gain_min, gain_max, form) if form != "none" else 1.0
    b = bias_absmax if bias_absmax is not None and math.isfinite(bias_absmax) else 0.0
    num = site.numerics or SiteNumerics()
    num.features, num.gain_absmax, num.bias_absmax = d, g, b
    num.output_bound, num.bound_source = output_bound(g, b, d), source  # type: ignore[assignment]
    num.dtype_max = DTYPE_MAX.get(dtype, DTYPE_MAX["float32"])
    site.numerics = num
    return num


def _bias_absmax(ckpt: Any, keys: list[str]) -> Optional[float]:
    """max |bias| from the first checkpoint key whose leaf names a bias; 0.0 when there is none."""
    key = next((k for k in keys if k.rsplit(".", 1)[-1] in BIAS_LEAVES), None)
    if key is None:
        return 0.0
    t = ckpt.get(key).float()
    finite = t[t.isfinite()]
    return float(finite.abs().max()) if finite.numel() else None


def analyse(ctx: Any, records: list) -> None:
    """Set ``site.numerics`` (the bound fields) for every LayerNorm/RMSNorm site whose gains the checkpoint
    holds (``ctx.checkpoint`` and ``site.weights``); a no-op without a checkpoint."""
    ckpt = getattr(ctx, "checkpoint", None)
    if ckpt is None:
        return
    dtype = str(ctx.dtype or "float32")
    for rec in records:
        site, w = rec.site, rec.site.weights
        if w is None or w.source != "checkpoint" or w.gain_min is None or site.kind not in BOUNDED_KINDS:
            continue
        bound_from_values(site, w.gain_min, w.gain_max, _bias_absmax(ckpt, w.keys), "checkpoint", dtype)


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``numerics-bound``: :func:`analyse` over every site."""
    analyse(ctx, facts.records)
