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

#: how every format names the root module (module path ``""``): text, concise, github annotations, markdown,
#: SARIF logical locations, the numerics text and monitor events
ROOT_LABEL = "(root)"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use: a command that never builds a report skips it


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
    #: hand-written norms: where the cast back after the normalisation sits (``normaudit.facts.formula``):
    #: ``before_gain`` (``w * x.to(input_dtype)``), ``after_gain`` (``(x * w).to(input_dtype)``), ``none``, ``no_gain``
    cast: Optional[Literal["before_gain", "after_gain", "none", "no_gain"]] = None
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
    #: where the gains centre (:meth:`classify_centre`): ``zero`` (a (1 + weight) norm's saved gains), ``one``
    #: (a weight-scaling norm's), None for neither (trained gains elsewhere, no gain)
    gain_centre: Optional[Literal["zero", "one"]] = None
    #: model + checkpoint: parameters whose checkpoint tensor has another shape than the model's (a k_norm
    #: saved with q_norm's size under grouped-query attention)
    shape_mismatch: list["ShapeMismatch"] = Field(default_factory=list)

    def classify_centre(self) -> None:
        """Set ``gain_centre`` from the gain statistics: ``zero`` when |mean| <= 0.25 with at least 20%
        of the gains negative (NC101's thresholds), ``one`` when |mean - 1| <= 0.2 with at most 2% negative
        (NC102's); otherwise None."""
        m, neg = self.gain_mean, self.gain_negative_fraction
        if m is None or neg is None:
            self.gain_centre = None
        elif abs(m) <= 0.25 and neg >= 0.2:
            self.gain_centre = "zero"
        elif abs(m - 1) <= 0.2 and neg <= 0.02:
            self.gain_centre = "one"
        else:
            self.gain_centre = None


class ShapeMismatch(_Model):
    """A norm parameter whose checkpoint tensor has another shape than the model's: ``key`` the model's
    ``state_dict`` key, ``checkpoint_key`` the checkpoint's, and both shapes."""

    key: str
    checkpoint_key: str
    model_shape: list[int]
    checkpoint_shape: list[int]


class SizeProbe(_Model):
    """A site in the second capture, made with the spatial/sequence sizes of the inputs changed
    (``normaudit.probes.size.size_probe``).

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
    """Batch-independence probe (``--probe batch``, ``normaudit.probes.batch.batch_probe``): the model runs in
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
    #: the site's constructor call passes this very key as eps (``eps=config.rms_norm_eps``, read from its source)
    passed: bool = False


class EpsFacts(_Model):
    """The eps of one site, compared (``normaudit.facts.eps``).

    ``effective``: the eps the site adds (``site.eps``; for ``nn.RMSNorm(eps=None)`` ``torch.finfo`` of its
    input dtype, as PyTorch substitutes); ``missing``: a hand-written norm that adds no eps at all. ``declared``: what each
    configuration says. ``peers``: sites of the same role (class, kind and constructor line, or attribute name
    in modules of one class) with a known eps (this one included);
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
    #: the eps argument of the site's constructor call when it reads a config key (``config.rms_norm_eps``)
    constructor_eps: Optional[str] = None
    #: constructed with that config key, yet the eps held differs from every value the model's own configs give
    #: it: the eps was changed after construction
    changed: bool = False
    #: what makes sites peers (``constructed at FILE:LINE``, ``attribute input_layernorm of DecoderLayer``)
    role: Optional[str] = None
    #: what eps is added to, and so which rows it guards: ``variance`` (0 on a constant row), ``mean_square``
    #: (RMS, 0 on an all-zero row) or ``l2_norm`` (a unit vector ``x / ||x||_2``, 0 on an all-zero row)
    statistic: Optional[Literal["variance", "mean_square", "l2_norm"]] = None
    #: the normalised tensor leaves the model as one of its outputs, through views and casts only (an
    #: L2-normalised embedding returned for retrieval)
    model_output: bool = False


class GroupSplit(_Model):
    """How a hand-written GroupNorm's reshape divides its input into groups (``normaudit.facts.sites``):
    ``groups`` G; ``dim`` the input dim the group dim splits (the channels: 1 in an (N, C, ...) tensor);
    ``per_group`` how many positions of that dim one group holds (C / G); ``spans`` the input dims one group's
    statistics cover (``dim`` partly, the others wholly)."""

    groups: int
    dim: int
    per_group: int
    spans: list[int] = Field(default_factory=list)
    #: the input dim its per-channel affine scales (the channels; None without a gain multiply)
    channel_dim: Optional[int] = None


class FreezeFacts(_Model):
    """Whether a torch.nn BatchNorm stays frozen when the model trains (``normaudit.facts.frozen``):
    ``params_frozen`` every parameter has ``requires_grad=False`` (None without parameters); ``eval_as_built``
    the module is in eval mode as the model was built; ``model_trainable`` some parameter of the model requires
    grad; ``after_train`` its ``training`` flag after ``model.train()`` (run on a copy; None when it raised);
    ``train_override`` the ``Class.train`` methods the model's classes define."""

    params_frozen: Optional[bool] = None
    eval_as_built: bool = False
    model_trainable: bool = False
    after_train: Optional[bool] = None
    train_override: list[str] = Field(default_factory=list)


class LrnArgs(_Model):
    """The constructor arguments of a torch.nn ``LocalResponseNorm`` (PyTorch docs:
    ``b_c = a_c * (k + alpha / n * sum(a_c'^2)) ** -beta`` over ``size`` neighbouring channels)."""

    size: int
    alpha: float
    beta: float
    k: float


class AliasReader(_Model):
    """A later reader of a tensor a norm overwrote in place: its ``module`` (``""`` the root), ``op`` (``the
    model's output`` for the output) and ``source`` line."""

    module: str
    op: str
    source: Optional[SourceLocation] = None


class InplaceAlias(_Model):
    """A norm that overwrites, in place, a tensor read elsewhere afterwards (``normaudit.facts.aliasing``):
    ``op`` the in-place op (``add_``, ``mul(out=)``), ``source`` its line, ``mutated`` the graph name of the
    tensor overwritten, ``consumers`` its later readers, ``caller_input`` the model input overwritten for the
    caller (None: a tensor of the model's own), ``casts`` the casts between the input and the op that copy
    nothing and ``alias_dtypes`` the input dtypes for which they copy nothing."""

    op: str
    source: Optional[SourceLocation] = None
    mutated: str
    consumers: list[AliasReader] = Field(default_factory=list)
    caller_input: Optional[str] = None
    casts: list[str] = Field(default_factory=list)
    alias_dtypes: list[str] = Field(default_factory=list)


class StreamFacts(_Model):
    """A site's place on the residual stream, beyond its ``placement`` (``normaudit.facts.placement``;
    Xiong et al. 2020, arXiv 2002.04745 for pre-LN and post-LN).

    ``branch_position``: where in a residual branch the norm sits (``input``: it reads the stream, ``output``:
    it closes the branch before the add, ``inner``: deeper inside); ``skip_from_norm``: the skip path of a
    residual add starts at this norm's output, so the un-normalised stream is lost, and ``no_identity_lost``:
    that skip is no identity anyway (a projection); ``contracted_by_scores``: a q/k norm whose output is
    contracted by attention scores over the axes it normalises; ``feeds_norm``/``reads_norm``: the norm that is
    the only consumer of / only input to this one (nothing but casts and views between); ``majority_placement``
    and ``majority_blocks``: the role of the same norm in a strict majority of the blocks of the same class
    (when this one differs: ``post``, ``final`` and ``embedding`` are one role, the stream norm);
    ``unnormed_stream_end``: in the branch of a stack's last residual add whose stream reaches the output without
    a norm, the module it reaches (``output``: the model output), with ``stream_end_conv`` when that module is a
    convolution computing the output from the stream and ``stack_blocks`` the blocks of its stack;
    ``inplace_alias``: the tensor it overwrites in place (``normaudit.facts.aliasing``)."""

    branch_position: Optional[Literal["input", "output", "inner"]] = None
    skip_from_norm: bool = False
    no_identity_lost: bool = False
    contracted_by_scores: bool = False
    feeds_norm: Optional[str] = None
    reads_norm: Optional[str] = None
    majority_placement: Optional[Placement] = None
    majority_blocks: list[str] = Field(default_factory=list)
    unnormed_stream_end: Optional[str] = None
    stream_end_conv: bool = False
    stack_blocks: Optional[int] = None
    inplace_alias: Optional[InplaceAlias] = None


class BatchNormFacts(_Model):
    """What a BatchNorm site does with its batch (``normaudit.facts.batchnorm``; Ioffe & Szegedy 2015, arXiv
    1502.03167; PyTorch ``nn.BatchNorm*d`` docs).

    ``momentum``: the running averages' momentum of a torch.nn BatchNorm (None: a cumulative average, or not
    a torch.nn module); ``calls_per_forward``: how often its module runs in one forward (a recurrent loop or a
    shared module: above 1); ``values_per_channel``: the values each channel's statistics are taken over in
    training at the audited micro-batch; ``train_error``: what PyTorch raises in training with one value per
    channel; over a sequence: ``padding_input`` the model input that looks like a padding mask or lengths,
    ``conv_input`` / ``conv_sibling`` the convolution whose output it normalises or which reads the same tensor,
    ``model_input`` the model input it normalises directly (None where there is none)."""

    momentum: Optional[float] = None
    calls_per_forward: Optional[int] = None
    values_per_channel: Optional[int] = None
    train_error: Optional[str] = None
    padding_input: Optional[str] = None
    conv_input: Optional[str] = None
    conv_sibling: Optional[str] = None
    model_input: Optional[str] = None


class GroupNormProblem(_Model):
    """A GroupNorm group count of the configuration that does not divide channel counts it declares
    (``normaudit.facts.batchnorm.groupnorm_config_problems``): ``groups_key`` = ``groups``, the channel key (a
    product of two keys is written ``a*b``) and its ``channels``, of which ``bad`` are not multiples."""

    groups_key: str
    groups: int
    channels_key: str
    channels: list[int] = Field(default_factory=list)
    bad: list[int] = Field(default_factory=list)


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
    #: the dtype of the site's output (after its gain and bias): differs from ``input_dtype`` when the norm
    #: promotes (a float32 gain or a missing cast back) -- ``normaudit.facts.formula``
    output_dtype: Optional[str] = None
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
    #: the line that computes it: for a hand-written norm the line of its statistic (the var/std/mean-of-squares
    #: node's stack trace, in ``forward`` or a helper it calls), for a functional norm its call; None for a
    #: torch.nn module. Findings about the formula point here (rules with ``locate: computation``)
    computation: Optional[SourceLocation] = None
    #: the Python module defining the owning module's class (``torch.nn.modules.normalization``)
    class_module: Optional[str] = None
    #: labels of the axis a BatchNorm/GroupNorm/InstanceNorm keeps one statistic per (its dim 1, the "channels")
    channel_axes: list[AxisLabel] = Field(default_factory=list)
    #: hand-written GroupNorm: how its reshape groups the input (``reshape(N, G, -1)``)
    group_split: Optional[GroupSplit] = None
    #: torch.nn BatchNorm: does it stay frozen through model.train() (``normaudit.facts.frozen``)
    freeze: Optional[FreezeFacts] = None
    size_probe: Optional[SizeProbe] = None
    batch_probe: Optional[BatchProbe] = None
    #: ``--probe numerics`` measurements and the static output bound (:class:`SiteNumerics`)
    numerics: Optional[SiteNumerics] = None
    #: torch.nn RMSNorm built with ``eps=None``: where its eps comes from (``torch.finfo(input dtype).eps``) and
    #: the dtype it was resolved in (``site.eps`` holds the value)
    eps_default: Optional[str] = None
    eps_default_dtype: Optional[str] = None
    #: torch.nn LocalResponseNorm: its constructor arguments
    lrn: Optional[LrnArgs] = None
    #: a hand-written norm computed inline in a larger module's forward (not a module that is only a norm)
    inline: bool = False
    #: a cumulative norm (statistics of steps 0..t): the dim it accumulates along
    cumulative_dim: Optional[int] = None
    #: the part captured alone that this site comes from (``normaudit.pipeline.parts``)
    captured_part: Optional[str] = None
    #: the gain form the site applies (``normaudit.facts.weights``): the formula's gain where the formula pass
    #: knows it, else read from how the graph uses the site's parameters; ``unknown`` for a checkpoint alone
    gain_form: Optional[Literal["weight", "one_plus_weight", "none", "unknown"]] = None
    #: a checkpoint alone: the kind is a guess from the keys (``kind_basis`` says which keys)
    kind_guessed: bool = False
    kind_basis: Optional[str] = None
    stream: StreamFacts = Field(default_factory=StreamFacts)
    batchnorm: BatchNormFacts = Field(default_factory=BatchNormFacts)
    #: free-form facts of passes outside normaudit (a user's own pass); normaudit's own facts are typed fields
    extra: dict[str, Any] = Field(default_factory=dict)

    def describe(self) -> str:
        """The norm in words a user can check against their code (rule messages read it as ``site.describe()``).

        A torch.nn module is quoted with its real constructor arguments (``nn.LayerNorm(normalized_shape=[512],
        eps=1e-05)``); anything else is described by what it computes, never by arguments its class may not
        take: ``hand-written RMSNorm `MyNorm` (mean of squares over the last 512 features, eps 1e-06)``,
        ``F.layer_norm in `Block` (...)``, ``hand-written LayerNorm in `Block` (...)`` for a norm computed
        inline in a larger module's forward.
        """
        torch_nn = (self.class_module or "").startswith("torch.nn.")
        if self.detected_by == "module" and torch_nn:
            return f"nn.{self.class_name}({_constructor_args(self)})"
        what = _computes(self)
        if self.detected_by == "functional":
            return f"F.{self.op or self.kind.lower()} in `{self.class_name}` ({what})"
        if self.detected_by == "pattern":
            where = "in " if self.inline else ""
            return f"hand-written {self.kind} {where}`{self.class_name}` ({what})"
        if self.detected_by == "module":
            return f"`{self.class_name}` (a torch.nn {self.kind} subclass: {what})"
        found = "by its class name" if self.detected_by == "module_walk" else "by its checkpoint keys"
        eps = f", eps {self.eps:g}" if self.eps is not None else ""
        return f"`{self.class_name}` ({self.kind} {found}{eps})"


def _constructor_args(site: Site) -> str:
    """The arguments a torch.nn norm module was built with, as far as the site records them."""
    args: list[str] = []
    kind = site.kind
    if kind in ("LayerNorm", "RMSNorm"):
        if site.normalized_shape is not None:
            args.append(f"normalized_shape={site.normalized_shape}")
        if site.eps is not None and site.eps_default is None:
            args.append(f"eps={site.eps:g}")
        if site.affine_weight is False:
            args.append("elementwise_affine=False")
        elif site.affine_bias is False and kind == "LayerNorm":
            args.append("bias=False")
    elif kind == "GroupNorm":
        args += [f"num_groups={site.num_groups}", f"num_channels={site.num_channels}", f"eps={site.eps:g}"]
    elif kind in ("BatchNorm", "InstanceNorm"):
        if site.num_channels is not None:
            args.append(f"num_features={site.num_channels}")
        if site.eps is not None:
            args.append(f"eps={site.eps:g}")
    elif kind == "LocalResponseNorm" and site.lrn is not None:
        args.append(f"size={site.lrn.size}")
    return ", ".join(args)


_STATISTIC = {"population": "mean and variance", "unbiased": "mean and unbiased variance",
              "mean_square": "mean of squares", "none": "no statistic"}


def _over(site: Site) -> str:
    """``over the last 512 features``, ``over the last 2 dims (16x32: head, feature)``, ``over dims 2, 3
    (8x8: height, width)``: the dims the statistics reduce, with their sizes and axis labels."""
    dims, shape = site.reduced_dims, site.input_shape
    if not dims or not shape or any(not -len(shape) <= d < len(shape) for d in dims):
        return f" over the last {'x'.join(map(str, site.normalized_shape))} values" if site.normalized_shape else ""
    rank = len(shape)
    dims = [d % rank for d in dims]
    sizes = "x".join(str(shape[d]) for d in dims)
    labels = [site.input_axes[d] for d in dims] if site.input_axes and len(site.input_axes) == rank else []
    trailing = dims == list(range(rank - len(dims), rank))
    if len(dims) == 1 and labels and labels[0] in ("feature", "channel"):
        return f" over the last {sizes} {labels[0]}s" if trailing else f" over the {sizes} {labels[0]}s of dim {dims[0]}"
    where = (("the last dim" if len(dims) == 1 else f"the last {len(dims)} dims") if trailing
             else ("dim " if len(dims) == 1 else "dims ") + ", ".join(map(str, dims)))
    return f" over {where} ({sizes}" + (f": {', '.join(labels)})" if labels else ")")


def _computes(site: Site) -> str:
    """``mean of squares over the last 512 features, eps 1e-06``: the statistic, its dims and eps."""
    f = site.formula
    stat = _STATISTIC.get(f.variance) if f is not None and f.variance else None
    if stat is None:
        stat = "mean of squares" if site.kind == "RMSNorm" else "mean and variance"
    if site.kind in ("BatchNorm", "InstanceNorm", "GroupNorm"):
        stat += " per channel" if site.kind != "GroupNorm" else " per group"
    text = stat + _over(site)
    if site.eps is not None:
        text += f", eps {site.eps:g}" + (" added to the root" if f is not None and f.eps_position == "outside_sqrt" else "")
    elif site.detected_by == "pattern":
        text += ", no eps"
    return text


class Block(_Model):
    """A repeated block (e.g. ``layers.0``) and the role of each of its norms."""

    path: str
    class_name: str
    norms: dict[str, Placement] = Field(default_factory=dict)


class UnusedNorm(_Model):
    """A norm module registered but never applied by the forward (``normaudit.facts.usage``): ``module`` its
    ``named_modules()`` path, ``kind`` what its class says it is, ``keys`` its ``state_dict`` keys,
    ``checkpoint_keys`` the checkpoint's keys for them (with ``--checkpoint``: trained weights the forward
    skips), ``source`` the line constructing it."""

    module: str
    class_name: str
    kind: Kind
    keys: list[str] = Field(default_factory=list)
    checkpoint_keys: list[str] = Field(default_factory=list)
    source: Optional[SourceLocation] = None


class StreamEnd(_Model):
    """Where the residual stream of a pre-LN stack leaves it un-normalised (``normaudit.facts.placement.stream_end``):
    the last site that reads the stream at a block's input (``placement`` ``pre``, ``branch_position``
    ``input``) in the branch of a stack's last residual add whose stream reaches the output or a head without a
    norm, in a stack of more than one block. ``module``/``block`` that site and its block; ``consumer`` the
    module the stream reaches (None: the model's output itself); ``output_conv`` that module is a convolution
    computing the model output from the stream (a signal decoder's output conv: audio or image synthesis, not
    logits); ``unused_norm`` the last norm module the model registers outside its blocks but never applies
    (the final norm a forward forgot)."""

    module: str
    block: Optional[str] = None
    consumer: Optional[str] = None
    output_conv: bool = False
    unused_norm: Optional[str] = None


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
    #: norm modules registered (with parameters) that the forward never applies (``normaudit.facts.usage``)
    unused_norms: list[UnusedNorm] = Field(default_factory=list)
    #: a pre-LN stream that leaves the stack un-normalised (``normaudit.facts.placement.stream_end``), None where none does
    stream_end: Optional[StreamEnd] = None
    #: GroupNorm group counts of the configuration that do not divide the channels it declares
    #: (``normaudit.facts.batchnorm``)
    groupnorm_config: list[GroupNormProblem] = Field(default_factory=list)
    #: the causal attention op of the graph (a causal mask or ``is_causal``), found when a BatchNorm normalises
    #: over a sequence (``normaudit.facts.batchnorm``); None where none was looked for or found
    causal_attention: Optional[str] = None
    #: free-form model-level facts of passes outside normaudit; normaudit's own facts are typed fields
    extra: dict[str, Any] = Field(default_factory=dict)


class CaptureAttempt(_Model):
    method: str
    ok: bool
    error: Optional[str] = None
    seconds: float = 0.0


class CapturedPart(_Model):
    """A submodule captured alone because the whole model could not be (``normaudit.capture.parts``):
    ``module`` its ``named_modules()`` path, ``method`` the capture method that worked, ``inputs`` the inputs
    recorded at its first call (``"arg0: float32[2, 16, 32]"``), ``sites`` the norm sites found in it."""

    module: str
    class_name: str
    method: str
    inputs: list[str] = Field(default_factory=list)
    sites: int = 0


class UnauditedModule(_Model):
    """A norm module the capture did not reach, so none of its graph facts exist: ``module`` its
    ``named_modules()`` path, ``kind`` its class name, ``reason`` why (never called by the forward on the
    inputs used, or found only by walking modules after the capture failed)."""

    module: str
    kind: str
    reason: str


class CaptureInfo(_Model):
    """How the model was captured: the method that ran, what failed before it, and coverage.

    ``parts``: when the whole model could not be captured, the submodules captured alone (their sites carry
    ``captured_part``); ``unaudited``: the norm modules no capture reached.
    """

    #: ``parts``: the whole model could not be captured, but every norm module lies in a part captured alone
    method: Literal["symbolic_trace", "export", "module_walk", "parts", "none"]
    complete: bool
    attempts: list[CaptureAttempt] = Field(default_factory=list)
    num_nodes: int = 0
    inputs: list[str] = Field(default_factory=list)
    inputs_assumed: Optional[str] = None
    fake_tensors: bool = True
    parts: list[CapturedPart] = Field(default_factory=list)
    unaudited: list[UnauditedModule] = Field(default_factory=list)


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
    #: ``--probe numerics``: what the real run showed (None when the probe did not run)
    numerics: Optional[NumericsReport] = None
