"""The numerics records: what ``--probe numerics`` measured (per module call, per norm site, the run) and the static
output bound of a norm from its gains."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from normaudit.report.base import _Model


class TensorStats(_Model):
    """Values of the tensors of one call (a module's inputs, or its output), as the numerics probe saw them:
    ``absmax`` the largest absolute value among the *finite* elements (None when there is none), ``nan`` and
    ``inf`` the counts of NaN and +-inf elements, ``numel`` the elements looked at (all floating tensors)."""

    absmax: Optional[float] = None
    nan: int = 0
    inf: int = 0
    numel: int = 0

    @property
    def nonfinite(self) -> int:
        """NaN plus inf elements."""
        return self.nan + self.inf


#: why the first non-finite value appeared (``normaudit.probes.numerics.producer_cause``): ``eps_zero`` 0/0 in a
#: norm with eps 0 on a constant row; ``gain_overflow`` the gains lift the normalised output past the dtype's
#: maximum; ``stat_overflow`` the statistic's squares overflow without an upcast; ``overflow`` values past the
#: dtype's maximum otherwise; ``nan`` a NaN from finite inputs (0/0, inf - inf, 0 * inf)
CauseKind = Literal["eps_zero", "gain_overflow", "stat_overflow", "overflow", "nan"]


class ModuleNumerics(_Model):
    """One module's call in the numerics probe's forward (``normaudit.probes.numerics``): ``module`` its
    ``named_modules()`` path (``""`` the root), ``order`` its place among the module calls in the order they
    returned (children before their parent), its floating ``inputs`` and ``output``, ``weights_absmax`` the
    largest absolute value of its own parameters (not its children's; None without any; measured for the
    producer and the calls before it only), and ``cause``: for the
    producer of the first non-finite value, why it appeared (an overflow past the dtype's maximum, 0/0 in a norm
    with eps 0, ...)."""

    module: str
    class_name: str
    order: int
    inputs: TensorStats
    output: TensorStats
    weights_absmax: Optional[float] = None
    cause: Optional[str] = None
    #: the kind of ``cause`` (:data:`CauseKind`)
    cause_kind: Optional[CauseKind] = None


class SiteNumerics(_Model):
    """Numerics of one norm site (``normaudit.probes.numerics``; the static bound by ``normaudit.facts.numerics``).

    Measured by ``--probe numerics`` (``measured`` True), over every call of the site in one forward:
    ``statistic`` is what eps is added to (``variance`` for mean-subtracting norms, ``mean_square`` for
    RMSNorm), computed in float32 from the input per normalised row (``rows`` of them); ``stat_min`` /
    ``stat_median`` / ``stat_max`` over the rows (unit: the input's unit squared); ``eps_dominated_fraction``
    the share of rows whose statistic is below ``eps_dominated_below`` = 10 * eps (eps then decides the output
    instead of the input); ``output_absmax`` against ``dtype_max`` (the largest finite value of the dtype run
    in), ``headroom`` = dtype_max / output_absmax; ``input``/``output`` the NaN/inf counts; ``role`` ``producer``
    (its inputs finite, its output not), ``first_nan`` (the first module whose output holds a NaN, its input
    holding inf but none), ``propagator`` (non-finite in, non-finite out), or None.

    Static (no run): ``features`` D, the elements per normalised row; ``gain_absmax``/``bias_absmax`` the
    largest absolute effective gain (``1 + w`` for a ``(1 + weight)`` norm) and bias, from ``bound_source``
    (``checkpoint``, or ``model`` for the probe's real weights); ``output_bound`` = gain_absmax * sqrt(D) +
    bias_absmax, an upper bound of |y| for LayerNorm/RMSNorm (a normalised row has sum of squares D, so no
    element exceeds sqrt(D) in magnitude; Ba et al. 2016 eq. 4, Zhang & Sennrich 2019 eq. 4).
    """

    measured: bool = False
    calls: int = 0
    statistic: Optional[Literal["variance", "mean_square"]] = None
    rows: Optional[int] = None
    stat_min: Optional[float] = None
    stat_median: Optional[float] = None
    stat_max: Optional[float] = None
    eps_dominated_below: Optional[float] = None
    eps_dominated_fraction: Optional[float] = None
    output_absmax: Optional[float] = None
    dtype_max: Optional[float] = None
    headroom: Optional[float] = None
    input: Optional[TensorStats] = None
    output: Optional[TensorStats] = None
    role: Optional[Literal["producer", "first_nan", "propagator"]] = None
    features: Optional[int] = None
    gain_absmax: Optional[float] = None
    bias_absmax: Optional[float] = None
    output_bound: Optional[float] = None
    bound_source: Optional[Literal["checkpoint", "model"]] = None


class NumericsReport(_Model):
    """The report's ``numerics`` section (``--probe numerics``, ``normaudit.probes.numerics``): the run
    (``dtype``, ``device``, ``weights`` ``checkpoint`` or ``random``, ``backward``, ``seconds``, ``modules``
    called, ``sites_measured``, the model ``output``, the ``loss`` of a backward run), ``error`` when it could not
    run, the ``producer`` of the first non-finite value and the calls ``before`` it, ``first_nan``, the
    ``propagators`` (first few, ``propagator_count`` in all), and with a backward the first module with a
    non-finite gradient and the parameters holding one."""

    dtype: str
    device: str
    weights: Literal["checkpoint", "random"] = "random"
    backward: bool = False
    #: float32 weights run under ``torch.autocast(device, dtype)`` (``--probe numerics-autocast``) instead of cast
    autocast: bool = False
    error: Optional[str] = None
    seconds: float = 0.0
    modules: int = 0
    sites_measured: int = 0
    output: Optional[TensorStats] = None
    loss: Optional[float] = None
    producer: Optional[ModuleNumerics] = None
    before: list[ModuleNumerics] = Field(default_factory=list)
    first_nan: Optional[str] = None
    propagators: list[str] = Field(default_factory=list)
    propagator_count: int = 0
    grad_first_nonfinite: Optional[str] = None
    grad_nonfinite_params: list[str] = Field(default_factory=list)
    grad_nonfinite_param_count: int = 0
    notes: list[str] = Field(default_factory=list)
    #: ``torch.manual_seed`` the run was made under (random weights, ``example_inputs()``, dropout)
    seed: Optional[int] = None
    #: ``example_inputs()`` was called again under ``seed`` (False: the audit's inputs; inferred inputs are
    #: always made under ``normaudit.audit.INPUT_SEED``)
    inputs_seeded: bool = False
