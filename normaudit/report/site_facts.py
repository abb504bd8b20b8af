"""The fact families of a norm site, one typed record each: formula, checkpoint weights, the size and batch probes,
eps, a hand-written GroupNorm's groups, frozen BatchNorms, LocalResponseNorm arguments, the residual stream and
in-place aliasing, BatchNorm's batch, the ONNX nodes of a site read from an ONNX graph."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from normaudit.report.base import Placement, SourceLocation, _Model


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
    #: BatchNorm running variance: its checkpoint key, its smallest finite value, the eps it was checked with
    #: (the site's, else PyTorch's BatchNorm default 1e-5), and the channels (0-based) where
    #: ``running_var + eps <= 0``, for which eval mode's ``sqrt(running_var + eps)`` is NaN or 0
    running_var_key: Optional[str] = None
    running_var_min: Optional[float] = None
    running_var_eps: Optional[float] = None
    running_var_invalid: list[int] = Field(default_factory=list)

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


class ParamEps(_Model):
    """A norm built with a literal eps in an ``__init__`` whose eps parameter reaches the model's other norms
    (``normaudit.facts.eps_param``): ``param`` that parameter of ``owner.__init__``, ``passed_to`` the modules
    built with it, whose ``norms`` norms of this kind all use ``value``; ``literal`` the number written here."""

    param: str
    owner: str
    passed_to: list[str] = Field(default_factory=list)
    value: float
    literal: float
    norms: int = 0


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
    #: built with a literal eps beside an eps parameter that reaches the other norms (``normaudit.facts.eps_param``)
    param_eps: Optional[ParamEps] = None


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
    #: ``group``: its gain scales the grouped view with one value per group (a (1, G, 1) weight on
    #: ``x.view(N, G, -1)``, or F.instance_norm's (G,) weight there) instead of one per channel; ``channel``: one
    #: per channel; None without a gain -- ``normaudit.facts.sites.group_norm``
    affine: Optional[Literal["channel", "group"]] = None
    #: with ``affine == "group"``: the shape of that gain parameter as the module holds it
    affine_shape: Optional[list[int]] = None


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


class UnreadGain(_Model):
    """A gain the norm's module registers but its forward never reads (``normaudit.facts.gain_use``):
    ``param`` its name in the module (``weight``), ``shape`` its shape; a checkpoint fills it and
    ``load_state_dict`` reports nothing, yet the output is the normalised tensor alone."""

    param: str
    shape: list[int] = Field(default_factory=list)


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
    ``inplace_alias``: the tensor it overwrites in place (``normaudit.facts.aliasing``); ``reapplied_of``: this is a
    later call of a norm module already applied in the same block, in the same role, to an earlier point of the
    stream (one module where the block needs two): the key of that earlier call in ``Block.norms``
    (``normaudit.facts.placement.reuse``)."""

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
    reapplied_of: Optional[str] = None


class BatchNormFacts(_Model):
    """What a BatchNorm site does with its batch (``normaudit.facts.batchnorm``; Ioffe & Szegedy 2015, arXiv
    1502.03167; PyTorch ``nn.BatchNorm*d`` docs).

    ``momentum``: the running averages' momentum of a torch.nn BatchNorm (None: a cumulative average, or not
    a torch.nn module); ``calls_per_forward``: how often its module runs in one forward (a recurrent loop or a
    shared module: above 1); ``values_per_channel``: the values each channel's statistics are taken over in
    training at the audited micro-batch; ``train_error``: what PyTorch raises in training with one value per
    channel; over a sequence: ``padding_input`` the model input that looks like a padding mask or lengths,
    ``conv_input`` / ``conv_sibling`` the convolution whose output it normalises or which reads the same tensor,
    ``model_input`` the model input it normalises directly (None where there is none); ``eval_statistics``:
    the statistics it normalises with in eval mode (``batch``: it keeps no running averages, so eval uses the
    batch's own), with ``eval_values_at_batch_one`` the values each channel's statistics then see for a batch
    of one."""

    momentum: Optional[float] = None
    calls_per_forward: Optional[int] = None
    values_per_channel: Optional[int] = None
    train_error: Optional[str] = None
    padding_input: Optional[str] = None
    conv_input: Optional[str] = None
    conv_sibling: Optional[str] = None
    model_input: Optional[str] = None
    #: ``running`` or ``batch``: what eval mode normalises with (nn.BatchNorm*: ``track_running_stats=False``
    #: or no running buffers means batch statistics in eval too, PyTorch BatchNorm docs) -- facts.batchnorm
    eval_statistics: Optional[Literal["running", "batch"]] = None
    #: with batch statistics in eval: the values per channel at batch size 1 (the product of the non-batch
    #: reduced dims); 1 means eval at batch 1 raises "Expected more than 1 value per channel when training"
    eval_values_at_batch_one: Optional[int] = None
    #: GroupNorm/InstanceNorm whose statistics span time: the causal convolution next to it (causal padding
    #: before it, or a Causal/causal=True module) -- ``normaudit.facts.causal``
    causal_conv: Optional[str] = None


class OnnxNode(_Model):
    """Where a site of an ONNX graph was read (``normaudit.facts.onnx_graph``): ``node`` the name of the ONNX
    node it is named after (the normalisation operator, or the statistic of a decomposed norm), ``op_type``
    that node's operator, ``nodes`` every node the site spans; ``stash_type`` the dtype the operator's
    ``stash_type`` keeps its statistics in (None for an operator without one and for decomposed norms);
    ``module_from`` where ``Site.module`` comes from: ``name_scopes`` (the PyTorch module path the exporter
    recorded in the node's metadata), ``node_name`` (the scope in a ``/layers.0/norm/Op`` node name) or ``node``
    (the node's own name: no module path recorded)."""

    node: str
    op_type: str
    nodes: list[str] = Field(default_factory=list)
    stash_type: Optional[str] = None
    module_from: Literal["name_scopes", "node_name", "node"] = "node"
