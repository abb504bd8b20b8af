"""Numeric probe: run one norm module alone on crafted inputs and tell which reference formula it computes.

The module is deep-copied (the caller's module is never touched), put in eval mode and cast to the probe
dtype. Its floating parameters with as many elements as the normalised region (``weight``, ``gamma``,
``scale``, ``g``, ``a_2``, ``bias``, ``beta``, ``b_2``, whatever their names) are set to constants so the gain
form and the bias are identifiable:

- all of them 0: ``y0``. Then each set to 1 alone: ``y1``. ``y1 - y0`` constant 1 -> a bias;
  ``y1 - y0`` = the normalised ``x`` and ``y0`` = 0 -> gain ``weight`` (``y = n(x) * w``);
  ``y0`` = ``y1 - y0`` -> gain ``one_plus_weight`` (``y = n(x) * (1 + w)``, Gemma).

With gains made neutral and biases 0 the output is the bare normalised ``x``, compared against every
:data:`normaudit.probes.reference.VARIANTS` on rows crafted so the variants differ: a random row with a
non-zero mean at scales 1e4 ... 1e-12 (the smallest scales put the variance below eps, where eps inside and
outside the sqrt differ by orders of magnitude, and an inverted form scales with the input), a constant row
(0 after mean subtraction, ±1 without), a one-hot row and a row with one large element. With ``N``
normalised elements, unbiased and population variance differ by ``sqrt(N / (N - 1))``.

Eps is *measured*, not assumed: for each variant it is solved from the row with the smallest variance, then
the variant must reproduce every row with that eps. ``eps_measured`` is what the module actually adds,
whatever attribute (or literal) it comes from.

Example::

    >>> r = probe_formula(torch.nn.LayerNorm(8), dims=(-1,), input_shape=(2, 3, 8), eps=1e-5)
    >>> (r.kind, r.variance, r.eps_position, r.gain, r.bias, r.confirmed)
    ('LayerNorm', 'population', 'inside_sqrt', 'weight', True, True)
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import nn

from normaudit.facts.formula_text import formula_text
from normaudit.probes.reference import VARIANTS, Variant
from normaudit.report import Formula


@dataclass
class ProbeResult:
    """What a norm module computes, measured. ``None``/``"unknown"`` where the probe could not tell.

    - ``kind``: ``LayerNorm`` (mean subtracted) or ``RMSNorm`` (not) when confirmed, else ``Other``: from the
      output, not the class name.
    - ``mean_subtracted``, ``variance`` (``population`` | ``unbiased`` | ``mean_square`` | ``unknown``),
      ``eps_position`` (``inside_sqrt`` | ``outside_sqrt`` | ``unknown``: also when eps is too small to
      matter), ``inverted_scale`` (output grows with the input's RMS): as in ``report.Formula``.
    - ``gain``: ``weight`` | ``one_plus_weight`` | ``none`` | ``unknown``; ``bias``: an additive parameter.
    - ``gain_params`` / ``bias_params``: the parameter names found in each role.
    - ``eps_measured``: the eps the module adds (float, same unit as the statistic: a variance inside the sqrt,
      a std outside); ``eps_matches``: whether it equals the ``eps`` given (rel. 1 %), None if none given.
    - ``confirmed``: one reference (up to eps position when eps is negligible) reproduced every probe row to
      ``max_error`` (max relative error per row) below ``tolerance``; ``reference``: the name of the closest
      variant in ``reference.VARIANTS`` (the matching one when confirmed).
    - ``error``: why the probe failed (the module raised, bad dims, ...); then ``confirmed`` is False.
    """

    kind: Optional[str] = None
    mean_subtracted: Optional[bool] = None
    variance: Optional[str] = None
    eps_position: Optional[str] = None
    gain: Optional[str] = None
    bias: Optional[bool] = None
    inverted_scale: Optional[bool] = None
    eps_measured: Optional[float] = None
    eps_matches: Optional[bool] = None
    confirmed: bool = False
    reference: Optional[str] = None
    max_error: Optional[float] = None
    tolerance: Optional[float] = None
    gain_params: tuple[str, ...] = ()
    bias_params: tuple[str, ...] = ()
    error: Optional[str] = None

    def to_formula(self, axes: Sequence[str] = (), half: Optional["HalfPrecisionResult"] = None) -> Formula:
        """A ``report.Formula`` from these facts (and the half-precision probe, if run), with its text."""
        f = Formula(mean_subtracted=self.mean_subtracted, variance=self.variance, eps_position=self.eps_position,
                    gain=self.gain, bias=self.bias, inverted_scale=self.inverted_scale, confirmed=self.confirmed)
        if half is not None and half.error is None:
            f.upcast, f.stats_dtype = half.upcast, half.stats_dtype
        f.text = formula_text(self.kind or "Other", f, axes)
        return f


@dataclass
class HalfPrecisionResult:
    """Whether a module keeps its statistics in float32 when fed half-precision input.

    - ``upcast``: the output for a row whose squares overflow ``dtype`` (±300: 90000 > 65504 in float16) is
      finite and within 1 % of the same module run in float32. None on error.
    - ``stats_dtype``: ``"float32"`` when upcast, else the input dtype's name.
    - ``finite``: no inf/NaN in that output; ``max_error``: its max relative error per row.
    - ``constant_row_finite``: a constant row gives a finite output (False e.g. for ``rsqrt(var + eps)`` with an
      eps that rounds to 0 in ``dtype``: ``0 * inf`` = NaN).
    """

    dtype: str
    upcast: Optional[bool] = None
    stats_dtype: Optional[str] = None
    finite: Optional[bool] = None
    max_error: Optional[float] = None
    constant_row_finite: Optional[bool] = None
    error: Optional[str] = None


# ----------------------------------------------------------------------------------------------- plumbing
@dataclass
class _Setup:
    module: nn.Module
    dims: tuple[int, ...]
    shape: tuple[int, ...]
    n: int
    candidates: list[str] = field(default_factory=list)


def _setup(module: nn.Module, dims: Sequence[int], input_shape: Sequence[int], dtype: torch.dtype) -> _Setup:
    shape = tuple(int(s) for s in input_shape)
    nd = sorted({d % len(shape) for d in dims if -len(shape) <= d < len(shape)})
    if not nd or len(nd) != len(tuple(dims)):
        raise ValueError(f"dims {tuple(dims)} do not fit input shape {shape}")
    m = copy.deepcopy(module).eval().to(dtype)
    n = math.prod(shape[d] for d in nd)
    cands = [k for k, p in m.named_parameters() if p.is_floating_point() and p.numel() == n]
    return _Setup(m, tuple(nd), shape, n, cands)


def _run(s: _Setup, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Run the module on ``rows`` (K, N): pack them into inputs of the caller's shape with each row along the
    normalised dims, return the outputs as (K, N) float64."""
    other = [d for d in range(len(s.shape)) if d not in s.dims]
    perm = other + list(s.dims)
    inv = [perm.index(d) for d in range(len(s.shape))]
    per = math.prod(s.shape[d] for d in other)
    k = rows.shape[0]
    out = []
    with torch.no_grad():
        for start in range(0, k, per):
            chunk = rows[start:start + per]
            idx = torch.arange(per) % chunk.shape[0]
            x = chunk[idx].to(dtype).reshape([s.shape[d] for d in perm]).permute(inv).contiguous()
            y = s.module(x)
            if isinstance(y, (tuple, list)):
                y = next(t for t in y if isinstance(t, torch.Tensor))
            if tuple(y.shape) != s.shape and _is_scale_of(tuple(y.shape), s):
                y = x * y  # a module returning only rsqrt(mean(x^2) + eps), for its caller to multiply
            if tuple(y.shape) != s.shape:
                raise ValueError(f"output shape {tuple(y.shape)} differs from input shape {s.shape}")
            out.append(y.permute(perm).reshape(per, s.n)[: chunk.shape[0]].double())
    return torch.cat(out)


def _is_scale_of(out_shape: tuple[int, ...], s: _Setup) -> bool:
    """The output is one factor per normalised row: the input's shape with size 1 along the normalised dims
    (``keepdim=True``), so the module hands its caller the scale to multiply by."""
    return len(out_shape) == len(s.shape) and all(
        o == 1 if d in s.dims else o == i for d, (o, i) in enumerate(zip(out_shape, s.shape)))


def _set(s: _Setup, values: dict[str, float]) -> None:
    params = dict(s.module.named_parameters())
    with torch.no_grad():
        for name, v in values.items():
            params[name].fill_(v)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Max relative error per row (rows of different scales weigh alike). Elements equal in both (the same
    inf, both NaN: ``0 / 0`` on a constant row with eps 0) count as exact; any other non-finite one as inf."""
    same = (y == ref) | (y.isnan() & ref.isnan())
    y, ref = torch.where(same, 0.0, y), torch.where(same, 0.0, ref)
    den = torch.maximum(ref.abs().amax(1), y.abs().amax(1))
    err = (y - ref).abs().amax(1) / den.clamp_min(torch.finfo(torch.float64).tiny)
    return torch.where(den == 0, 0.0, err).nan_to_num(nan=math.inf)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return bool((_rel_err(a, b) < tol).all())


# ------------------------------------------------------------------------------------------------ probing
def _rows(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, list[float]]:
    """Crafted rows (K, N) float64, exactly representable in ``dtype``, and the scales of the scaled rows
    (which come first, largest scale first)."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(n, generator=g, dtype=torch.float64) + 0.7
    fi = torch.finfo(dtype)
    lo, hi = max(-12, math.ceil(math.log10(fi.tiny ** (1 / 3))) + 1), min(4, math.floor(math.log10(fi.max) / 4))
    scales = [10.0 ** e for e in range(hi, lo - 1, -1)]
    special = [torch.full((n,), 2.0, dtype=torch.float64),
               torch.nn.functional.one_hot(torch.tensor(0), n).double(),
               torch.cat([torch.tensor([50.0]), torch.randn(n - 1, generator=g, dtype=torch.float64)])]
    rows = torch.stack([base * sc for sc in scales] + special)
    return rows.to(dtype).double(), scales


def _identify_params(s: _Setup, dtype: torch.dtype, tol: float) -> tuple[str, list[str], list[str]]:
    """Set every candidate parameter to 0, then each to 1 alone, and classify: (gain form, gains, biases).
    Leaves the module with neutral gains and zero biases (other parameters untouched)."""
    x = torch.randn(4, s.n, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype).double() + 0.3
    _set(s, {c: 0.0 for c in s.candidates})
    y0 = _run(s, x, dtype)
    gains, biases, forms = [], [], set()
    for c in s.candidates:
        _set(s, {c: 1.0})
        d = _run(s, x, dtype) - y0
        _set(s, {c: 0.0})
        if _close(d, torch.ones_like(d), tol):
            biases.append(c)
        elif d.abs().amax() > 0 and d.std(1).amax() > 1e-3 * d.abs().amax():
            gains.append(c)
            forms.add("weight" if _close(y0 + 1, torch.ones_like(y0), tol) else
                      "one_plus_weight" if _close(y0, d, tol) else "unknown")
    gain = "none" if not gains else forms.pop() if len(forms) == 1 else "unknown"
    # neutral gain: 1 for w, 0 for 1 + w; for an unknown g(w), 0 unless g(0) = 0 (then 1): exact for exp(w)
    neutral = 1.0 if gain == "weight" or (gain == "unknown" and _close(y0 + 1, torch.ones_like(y0), tol)) else 0.0
    _set(s, {c: neutral for c in gains})
    return gain, gains, biases


def _solve_eps(v: Variant, x: torch.Tensor, y: torch.Tensor, tol: float) -> tuple[float, float]:
    """The eps that makes variant ``v`` give ``y`` for row ``x`` (1-D), by least squares over the row, and
    its resolution (``tol`` times the statistic it is added to): (nan, 0) when the row does not determine it."""
    c, stat = (x, x.pow(2).mean()) if v.variance == "mean_square" else (x - x.mean(), None)
    if stat is None:
        stat = c.pow(2).sum() / (x.numel() - (v.variance == "unbiased"))
    cy, cc = (c * y).sum(), c.pow(2).sum()
    if not (torch.isfinite(cy) and cy != 0 and cc != 0):
        return math.nan, 0.0
    if v.inverted_scale:
        return float((cy / cc) ** 2 - stat), float(4 * tol * stat)
    d = cc / cy  # y = c / d
    if v.eps_position == "inside_sqrt":
        return float(d ** 2 - stat), float(4 * tol * stat)
    return float(d - stat.sqrt()), float(4 * tol * stat.sqrt())


def probe_formula(module: nn.Module, dims: tuple[int, ...], input_shape: tuple[int, ...], eps: float | None,
                  dtype: torch.dtype = torch.float32) -> ProbeResult:
    """Measure what ``module`` (a norm, run alone on a copy) computes over ``dims`` of an input of
    ``input_shape`` (the module's real input shape; only its size along ``dims`` matters, the other positions
    hold probe rows). ``eps``: the eps the site is believed to use (compared with the measured one; may be
    None). ``dtype``: float32 or float64 (tolerance ``500 * finfo(dtype).eps``).

    Never raises: an exception inside the module (or bad ``dims``) gives ``confirmed=False`` and ``error``.
    """
    tol = 500 * torch.finfo(dtype).eps
    res = ProbeResult(tolerance=tol)
    try:
        s = _setup(module, dims, input_shape, dtype)
        res.gain, gains, biases = _identify_params(s, dtype, tol)
        res.gain_params, res.bias_params, res.bias = tuple(gains), tuple(biases), bool(biases)
        rows, scales = _rows(s.n, dtype)
        y = _run(s, rows, dtype)
        if not torch.isfinite(y[: len(scales)]).all():
            raise ValueError("non-finite output on finite, non-constant probe rows")
        # independent checks: a constant row vanishes after mean subtraction (0 / 0 = NaN with eps 0);
        # a norm's output does not grow with its input
        unit = scales.index(1.0)
        res.mean_subtracted = bool(y[len(scales)].nan_to_num(0.0).abs().max() < 1e-3 * y[unit].abs().max())
        res.inverted_scale = bool(y[0].abs().max() > 10 * y[unit].abs().max())
        smallest = len(scales) - 1
        fits = []
        for v in VARIANTS:
            if v.variance == "unbiased" and s.n < 2:
                continue
            e, res_e = _solve_eps(v, rows[smallest], y[smallest], tol)
            if not math.isfinite(e) or e < -res_e:
                continue
            e = 0.0 if e <= res_e else e
            err = float(_rel_err(y, v(rows, (1,), e)).max())
            fits.append((err, v, e, res_e))
        fits.sort(key=lambda t: t[0])
        if not fits:
            raise ValueError("no reference variant fits")
        res.max_error, best, e_best, res_best = fits[0]
        res.reference = best.name
        # within tolerance and not far worse than the best: N/(N-1) effects shrink with N, noise does not
        ok = [(v, e) for err, v, e, _ in fits if err < tol and err <= 10 * res.max_error + 10 * torch.finfo(dtype).eps]
        if ok:
            same = lambda attr: len({getattr(v, attr) for v, _ in ok}) == 1  # noqa: E731
            res.confirmed = same("mean_subtracted") and same("variance") and same("inverted_scale")
            res.mean_subtracted, res.inverted_scale = best.mean_subtracted, best.inverted_scale
            res.variance = best.variance if same("variance") else "unknown"
            res.eps_position = best.eps_position if same("eps_position") else "unknown"
            res.eps_measured = e_best
        else:
            res.variance, res.eps_position = "unknown", "unknown"
        res.kind = ("LayerNorm" if res.mean_subtracted else "RMSNorm") if res.confirmed else "Other"
        if eps is not None and res.eps_measured is not None:
            res.eps_matches = math.isclose(res.eps_measured, eps, rel_tol=1e-2, abs_tol=res_best)
    except Exception as exc:  # the module is foreign code: report, never raise
        res.confirmed, res.error = False, f"{type(exc).__name__}: {exc}"
    return res


def probe_half_precision(module: nn.Module, dims: tuple[int, ...], input_shape: tuple[int, ...],
                         dtype: torch.dtype = torch.float16) -> HalfPrecisionResult:
    """Does ``module`` (run alone on a copy cast to ``dtype``, gains neutral and biases 0) compute its
    statistics in float32 when fed ``dtype`` input? Feeds a row of ±300 (squares 90000 overflow float16's
    65504; stats kept in float16 give 0, inf or NaN) and compares with the same module in float32 on the same
    values (rel. 1 %). Also feeds a constant row (``constant_row_finite``). Meant for float16: bfloat16 has
    float32's range, so there nothing overflows and ``upcast`` only says the output is within 1 %. Never raises:
    errors go to ``error`` with ``upcast`` None.
    """
    res = HalfPrecisionResult(dtype=str(dtype).removeprefix("torch."))
    try:
        ref = _setup(module, dims, input_shape, torch.float32)
        _identify_params(ref, torch.float32, 500 * torch.finfo(torch.float32).eps)
        half = copy.deepcopy(ref)
        half.module = half.module.to(dtype)
        n = ref.n
        sign = torch.tensor([(-1.0) ** i for i in range(n)], dtype=torch.float64)
        big = 300 * sign * (1 + torch.arange(n, dtype=torch.float64) / (4 * n))
        rows = torch.stack([big, torch.full((n,), 2.0, dtype=torch.float64)]).to(dtype).double()
        y16, y32 = _run(half, rows, dtype), _run(ref, rows, torch.float32)
        res.finite = bool(torch.isfinite(y16[0]).all())
        res.constant_row_finite = bool(torch.isfinite(y16[1]).all())
        res.max_error = float(_rel_err(y16[:1], y32[:1]).max())
        res.upcast = res.finite and res.max_error < 1e-2
        res.stats_dtype = "float32" if res.upcast else res.dtype
    except Exception as exc:  # the module is foreign code: report, never raise
        res.upcast, res.error = None, f"{type(exc).__name__}: {exc}"
    return res
