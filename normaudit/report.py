"""The typed report: pydantic models for everything normaudit emits.

The fields named in ``shared/CONTRACT.md`` (``sites[].module``, ``kind``, ``eps``, ``normalized_axes``,
``placement``; ``model.placement``, ``model.parallel_residual``; ``findings[].rule_id``, ``category``,
``severity``, ``module``, ``message``, ``source``) are an outside contract: rename none of them.
Everything else may grow. Renderers (``normaudit.render``) read only these models.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Kind = Literal["LayerNorm", "RMSNorm", "BatchNorm", "GroupNorm", "InstanceNorm", "LocalResponseNorm", "Other"]
AxisLabel = Literal["batch", "sequence", "height", "width", "depth", "channel", "feature", "head", "unknown"]
Placement = Literal["pre", "post", "sandwich", "final", "embedding", "qk", "none", "unknown"]
ModelPlacement = Literal["pre", "post", "sandwich", "mixed", "none", "unknown"]
Severity = Literal["error", "warning", "info"]
Category = Literal["layout", "placement", "eps", "norm-type", "batchnorm", "numerics", "checkpoint", "capture"]

SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceLocation(_Model):
    """A place in a source file: 1-based ``line``; ``file`` as given (absolute where it was resolved)."""

    file: str
    line: Optional[int] = None


class Formula(_Model):
    """What a site computes, as derived from the graph (and, where run, confirmed numerically).

    Reference formulas: Ba, Kiros, Hinton 2016 (arXiv 1607.06450) eq. 3-4 for LayerNorm
    (mean and population variance over the normalised features, eps inside the sqrt as in
    ``torch.nn.LayerNorm``); Zhang & Sennrich 2019 (arXiv 1910.07467) for RMSNorm (no mean subtraction,
    root mean square of the features). Filled by ``normaudit.facts.formula``, whose docstring defines
    each field; in short: ``upcast`` says whether the statistics are kept in float32 when the input is
    half precision (an explicit cast, or a ``fused`` kernel that accumulates in float32), ``stats_dtype``
    the dtype the squares/variance are held in at the audited ``--dtype``, ``eps_dtype`` the dtype of the
    tensor eps is added to, ``confirmed`` None when not probed numerically.
    """

    mean_subtracted: Optional[bool] = None
    variance: Optional[Literal["population", "unbiased", "mean_square", "none", "unknown"]] = None
    eps_position: Optional[Literal["inside_sqrt", "outside_sqrt", "clamp", "none", "unknown"]] = None
    gain: Optional[Literal["weight", "one_plus_weight", "none", "unknown"]] = None
    bias: Optional[bool] = None
    stats_dtype: Optional[str] = None
    upcast: Optional[bool] = None
    fused: bool = False
    inverted_scale: Optional[bool] = None
    confirmed: Optional[bool] = None
    text: Optional[str] = None
    eps_dtype: Optional[str] = None
    eps_measured: Optional[float] = None
    eps_matches: Optional[bool] = None
    constant_row_finite: Optional[bool] = None
    max_error: Optional[float] = None
    size: Optional[int] = None
    notes: list[str] = Field(default_factory=list)


class WeightStats(_Model):
    """Statistics of a site's parameters as read from a checkpoint (or the model's own initial values).

    ``gain_*`` summarise the 1-D scale parameter (``weight``/``gamma``/``scale``); ``running_state`` is
    ``initial`` when BatchNorm running statistics still equal their construction values (mean 0, var 1,
    ``num_batches_tracked`` 0), ``trained`` otherwise, and None for norms without running statistics.
    """

    source: Literal["checkpoint", "model"] = "checkpoint"
    keys: list[str] = Field(default_factory=list)
    shape: Optional[list[int]] = None
    dtype: Optional[str] = None
    gain_mean: Optional[float] = None
    gain_std: Optional[float] = None
    gain_min: Optional[float] = None
    gain_max: Optional[float] = None
    bias_present: Optional[bool] = None
    nonfinite: int = 0
    running_state: Optional[Literal["initial", "trained"]] = None
    num_batches_tracked: Optional[int] = None
    #: share of the finite gain entries below 0 (a ``(1 + weight)`` checkpoint has about half)
    gain_negative_fraction: Optional[float] = None
    #: model + checkpoint (``normaudit.facts.weights``): the site's model keys absent from the checkpoint; the
    #: checkpoint keys under the site's module that no parameter of it takes (loading drops them); and checkpoint
    #: keys that look like a renamed parameter (``{"norm.scale": "norm.weight"}``, checkpoint key -> model key)
    missing: list[str] = Field(default_factory=list)
    unexpected: list[str] = Field(default_factory=list)
    renamed: dict[str, str] = Field(default_factory=dict)


class SizeProbe(_Model):
    """A site in the second capture, made with the spatial/sequence sizes of the inputs changed
    (``normaudit.facts.probes.size_probe``).

    ``resize`` says what changed (``"height 16->20, width 16->20"``); ``input_shape`` is the site's input
    shape at the new size (None when the run failed before or at the site); ``changed_dims`` the dims of the
    site's input, among those it normalises (LayerNorm/RMSNorm) or keeps one statistic per (the channel dim of
    BatchNorm/GroupNorm/InstanceNorm), whose size followed the input size; ``error`` what PyTorch raised at this
    site at the new size; ``tied``: either of the two, so the norm only works at the captured input size.
    """

    resize: str
    input_shape: Optional[list[int]] = None
    changed_dims: list[int] = Field(default_factory=list)
    error: Optional[str] = None
    tied: bool = False


class BatchProbe(_Model):
    """Batch-independence probe (``--probe batch``, ``normaudit.facts.probes.batch_probe``): the model runs in
    train mode on a small real batch twice, with example 0 the same and the other examples different, and
    example 0's input to this site pinned to the same values.

    ``row0_max_change`` is the largest absolute change of example 0's output of the site (same unit as the
    output); ``row0_scale`` the largest absolute value of that output; ``coupled`` is True when the change
    exceeds ``tolerance`` (so the site mixes statistics across examples, as BatchNorm in train mode does).
    ``note`` says why a site was not measured.
    """

    batch_size: int
    row0_max_change: Optional[float] = None
    row0_scale: Optional[float] = None
    tolerance: Optional[float] = None
    coupled: Optional[bool] = None
    note: Optional[str] = None


class ConfigEps(_Model):
    """An eps a configuration declares for a site (``normaudit.facts.eps``).

    ``origin``: ``cli`` (``--config``), ``checkpoint`` (the config that came with the weights), ``model`` (the
    model's own ``config`` attribute) or ``library`` (a library's own config, a transformers
    ``PretrainedConfig``, whose code may keep another eps on purpose); ``source`` says where (a file name,
    ``the model's own config``); ``matches``: the site's effective eps equals ``value`` (relative 1e-6).
    """

    origin: Literal["cli", "checkpoint", "model", "library"]
    source: str
    key: str
    value: float
    matches: bool


class EpsFacts(_Model):
    """The eps of one site, compared (``normaudit.facts.eps``).

    ``effective``: the eps the site adds (``site.eps``; for ``nn.RMSNorm(eps=None)`` ``torch.finfo`` of its
    input dtype, as PyTorch substitutes); ``missing``: a hand-written norm that adds no eps at all. ``declared``: what each
    configuration says. ``peers``: sites of the same class and kind with a known eps (this one included);
    ``peer_eps``: the eps a strict majority of them use (None without one) and ``peer_count`` how many.
    ``dtype``: the dtype eps is added in (``dtype_basis`` says how that was found); ``in_dtype``: eps as that
    dtype stores it (0.0 when it underflows, IEEE 754 round-to-nearest).
    """

    effective: Optional[float] = None
    missing: bool = False
    declared: list[ConfigEps] = Field(default_factory=list)
    peers: int = 0
    peer_eps: Optional[float] = None
    peer_count: int = 0
    dtype: Optional[str] = None
    dtype_basis: Optional[str] = None
    in_dtype: Optional[float] = None


class Site(_Model):
    """One normalisation computation found in the model.

    ``module`` is the dotted path of the owning module as ``model.named_modules()`` names it; a functional
    call inside a module's forward carries that module's path (with ``call_index`` > 0 for the second and
    later calls in the same module).
    """

    module: str
    kind: Kind
    class_name: str
    detected_by: Literal["module", "functional", "pattern", "module_walk", "checkpoint"]
    op: Optional[str] = None
    call_index: int = 0
    eps: Optional[float] = None
    normalized_shape: Optional[list[int]] = None
    reduced_dims: Optional[list[int]] = None
    normalized_axes: list[AxisLabel] = Field(default_factory=list)
    input_shape: Optional[list[int]] = None
    input_axes: Optional[list[str]] = None
    input_dtype: Optional[str] = None
    compute_dtype: Optional[str] = None
    affine_weight: Optional[bool] = None
    affine_bias: Optional[bool] = None
    num_groups: Optional[int] = None
    num_channels: Optional[int] = None
    training: Optional[bool] = None
    track_running_stats: Optional[bool] = None
    placement: Placement = "unknown"
    block: Optional[str] = None
    formula: Optional[Formula] = None
    weights: Optional[WeightStats] = None
    eps_facts: Optional[EpsFacts] = None
    #: where a fix goes: the line constructing a norm module, or the line calling a functional norm
    source: Optional[SourceLocation] = None
    #: the line that constructed the site's module
    definition: Optional[SourceLocation] = None
    #: the line that calls the norm (from the captured graph's stack trace)
    call: Optional[SourceLocation] = None
    #: labels of the axis a BatchNorm/GroupNorm/InstanceNorm keeps one statistic per (its dim 1, the "channels")
    channel_axes: list[AxisLabel] = Field(default_factory=list)
    size_probe: Optional[SizeProbe] = None
    batch_probe: Optional[BatchProbe] = None
    extra: dict[str, Any] = Field(default_factory=dict)


class Block(_Model):
    """A repeated block (e.g. ``layers.0``) and the role of each of its norms."""

    path: str
    class_name: str
    norms: dict[str, Placement] = Field(default_factory=dict)


class ModelFacts(_Model):
    """Model-level facts."""

    class_name: str
    num_parameters: Optional[int] = None
    placement: ModelPlacement = "unknown"
    parallel_residual: bool = False
    has_final_norm: Optional[bool] = None
    num_residual_adds: int = 0
    blocks: list[Block] = Field(default_factory=list)
    config_source: Optional[str] = None
    #: model-level facts of individual passes (e.g. ``groupnorm_config``: GroupNorm groups that do not divide
    #: the channel counts the configuration declares)
    extra: dict[str, Any] = Field(default_factory=dict)


class CaptureAttempt(_Model):
    method: str
    ok: bool
    error: Optional[str] = None
    seconds: float = 0.0


class CaptureInfo(_Model):
    """How the model was captured: the method that ran, what failed before it, and coverage."""

    method: Literal["symbolic_trace", "export", "module_walk", "none"]
    complete: bool
    attempts: list[CaptureAttempt] = Field(default_factory=list)
    num_nodes: int = 0
    inputs: list[str] = Field(default_factory=list)
    inputs_assumed: Optional[str] = None
    fake_tensors: bool = True


class Finding(_Model):
    """One rule hit on one module."""

    rule_id: str
    rule_name: str
    category: Category
    severity: Severity
    confidence: Literal["high", "medium", "low"] = "high"
    module: str
    message: str
    fix: Optional[str] = None
    source: Optional[SourceLocation] = None


class TargetInfo(_Model):
    path: str
    kind: Literal["python", "hf_dir", "hf_config", "checkpoint"]
    factory: Optional[str] = None
    config: Optional[str] = None
    checkpoint: Optional[str] = None
    dtype: str = "float32"
    batch_size: Optional[int] = None


class Summary(_Model):
    sites: int
    errors: int
    warnings: int
    infos: int
    by_kind: dict[str, int] = Field(default_factory=dict)


class Report(_Model):
    """The whole report, dumped with ``model_dump_json`` for ``--format json``."""

    tool: str = "normaudit"
    version: str
    target: TargetInfo
    capture: CaptureInfo
    model: ModelFacts
    sites: list[Site]
    findings: list[Finding]
    summary: Summary
    notes: list[str] = Field(default_factory=list)
