"""Reference normalisation formulas, in one place, in float64.

Every function takes ``x`` (any shape; computed in float64), ``dims`` (the normalised dims, negative allowed)
and ``eps`` (a non-negative float) and returns a tensor of ``x``'s shape with no gain or bias applied:
the gain form is applied separately by :func:`apply_gain`, so the probe (``normaudit.probes.formula``) can
identify it on its own. :data:`VARIANTS` enumerates every variant the probe tells apart, each built from
:func:`normalize`.

Sources:

- LayerNorm: Ba, Kiros, Hinton 2016, "Layer Normalization", arXiv 1607.06450, eq. 3-4: mean and
  *population* variance over the normalised features; ``torch.nn.LayerNorm`` docs: ``eps`` inside the sqrt,
  ``y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta`` with the biased estimator.
- RMSNorm: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", arXiv 1910.07467, eq. 4: no mean
  subtraction, divide by ``RMS(x) = sqrt(mean(x^2))``; ``torch.nn.RMSNorm`` docs:
  ``y = x / sqrt(mean(x^2) + eps) * gamma``.
- Deviations seen in real code: unbiased variance (``x.std(-1)``, ``torch.var`` default, as in The Annotated
  Transformer's ``a_2 * (x - mean) / (std + eps) + b_2``), eps added to the std instead of the variance, and
  the "inverted" RMSNorm ``x / rsqrt(mean(x^2) + eps)`` = ``x * rms``, whose output grows with its input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import torch

Variance = Literal["population", "unbiased", "mean_square"]
EpsPosition = Literal["inside_sqrt", "outside_sqrt"]
Gain = Literal["weight", "one_plus_weight", "none"]

def _stat(x: torch.Tensor, dims: Sequence[int], variance: Variance) -> tuple[torch.Tensor, torch.Tensor]:
    """(centred x, statistic) in float64; the statistic keeps reduced dims (size 1) for broadcasting."""
    x = x.double()
    dims = tuple(dims)
    if variance == "mean_square":
        return x, x.pow(2).mean(dims, keepdim=True)
    c = x - x.mean(dims, keepdim=True)
    return c, c.pow(2).sum(dims, keepdim=True) / (_count(x, dims) - (variance == "unbiased"))


def _count(x: torch.Tensor, dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


def normalize(x: torch.Tensor, dims: Sequence[int], eps: float, *, variance: Variance,
              eps_position: EpsPosition = "inside_sqrt", inverted: bool = False) -> torch.Tensor:
    """The general form: ``c / sqrt(v + eps)`` (inside) or ``c / (sqrt(v) + eps)`` (outside), where ``c`` is
    ``x - mean`` (``variance`` ``population``/``unbiased``) or ``x`` (``mean_square``) and ``v`` the
    statistic named by ``variance``; ``inverted`` multiplies instead (``c * sqrt(v + eps)``, the
    ``x / rsqrt(...)`` bug; inside only). Float64 result, ``x``'s shape. Raises ValueError for
    ``inverted`` with ``outside_sqrt``."""
    c, v = _stat(x, dims, variance)
    if inverted:
        if eps_position != "inside_sqrt":
            raise ValueError("the inverted form is defined with eps inside the sqrt only")
        return c * torch.sqrt(v + eps)
    if eps_position == "inside_sqrt":
        return c / torch.sqrt(v + eps)
    return c / (torch.sqrt(v) + eps)


def layer_norm(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    """``(x - mean) / sqrt(var_pop + eps)``: Ba et al. 2016 eq. 3-4; ``torch.nn.LayerNorm``."""
    return normalize(x, dims, eps, variance="population")


def layer_norm_unbiased(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    """``(x - mean) / sqrt(var_unbiased + eps)``: Bessel-corrected variance (``torch.var`` default),
    larger than Ba et al.'s by ``N / (N - 1)``."""
    return normalize(x, dims, eps, variance="unbiased")


def layer_norm_eps_outside(x: torch.Tensor, dims: Sequence[int], eps: float, unbiased: bool = False) -> torch.Tensor:
    """``(x - mean) / (std + eps)``; with ``unbiased=True`` it is The Annotated Transformer's LayerNorm
    (``x.std(-1)`` is Bessel-corrected)."""
    return normalize(x, dims, eps, variance="unbiased" if unbiased else "population", eps_position="outside_sqrt")


def rms_norm(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)``: Zhang & Sennrich 2019 eq. 4; ``torch.nn.RMSNorm``; T5/Llama."""
    return normalize(x, dims, eps, variance="mean_square")


def rms_norm_eps_outside(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    """``x / (sqrt(mean(x^2)) + eps)``: eps added to the RMS."""
    return normalize(x, dims, eps, variance="mean_square", eps_position="outside_sqrt")


def rms_norm_inverted(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    """``x / rsqrt(mean(x^2) + eps)`` = ``x * sqrt(mean(x^2) + eps)``: scales with the input instead of
    normalising it (a bug: rsqrt used where sqrt was meant)."""
    return normalize(x, dims, eps, variance="mean_square", inverted=True)


def apply_gain(y: torch.Tensor, gain: Gain, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``y * w`` (``weight``), ``y * (1 + w)`` (``one_plus_weight``, Gemma) or ``y`` (``none``), plus
    ``bias`` when given. ``weight``/``bias`` must broadcast against ``y``."""
    if gain == "weight":
        y = y * weight
    elif gain == "one_plus_weight":
        y = y * (1 + weight)
    return y if bias is None else y + bias


@dataclass(frozen=True)
class Variant:
    """One reference variant: the facts it stands for (the field names of ``report.Formula``)."""

    name: str
    mean_subtracted: bool
    variance: Variance
    eps_position: EpsPosition
    inverted_scale: bool = False

    def __call__(self, x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
        return normalize(x, dims, eps, variance=self.variance, eps_position=self.eps_position,
                         inverted=self.inverted_scale)


VARIANTS: tuple[Variant, ...] = tuple(
    Variant(f"{base}{'_inverted' if inv else ''}{'_eps_outside' if pos == 'outside_sqrt' else ''}",
            var != "mean_square", var, pos, inv)
    for base, var in (("layer_norm", "population"), ("layer_norm_unbiased", "unbiased"), ("rms_norm", "mean_square"))
    for inv in (False, True)
    for pos in (("inside_sqrt",) if inv else ("inside_sqrt", "outside_sqrt"))
)
