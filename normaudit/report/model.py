"""Model-level facts: the residual-norm scheme and its blocks, unused norms, the un-normalised end of a pre-LN
stream, GroupNorm groups against the configuration."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from normaudit.report.base import Kind, ModelPlacement, Placement, SourceLocation, _Model
from normaudit.report.gguf import GgufModelFacts


class GroupNormProblem(_Model):
    """A GroupNorm group count of the configuration that does not divide channel counts it declares
    (``normaudit.facts.batchnorm.groupnorm_config_problems``): ``groups_key`` = ``groups``, the channel key (a
    product of two keys is written ``a*b``) and its ``channels``, of which ``bad`` are not multiples."""

    groups_key: str
    groups: int
    channels_key: str
    channels: list[int] = Field(default_factory=list)
    bad: list[int] = Field(default_factory=list)


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


class ResidualScale(_Model):
    """A constant a residual add multiplies one operand by (``normaudit.facts.placement.scaling``): ``operand``
    ``branch`` (``x + value * f(x)``) or ``skip`` (``value * x + f(x)``, DeepNorm's)."""

    operand: Literal["skip", "branch"]
    value: float


class UncheckedCheck(_Model):
    """A check an audit without a whole-model graph did not run (``normaudit.facts.coverage``): ``name`` in
    words, the ``rules`` it feeds and ``why`` it needs the whole graph."""

    name: str
    rules: list[str] = Field(default_factory=list)
    why: str


class PartialCapture(_Model):
    """What the audit could not check because the whole model was not captured as one graph
    (``normaudit.facts.coverage``): its norms come from submodules captured alone (``method`` ``parts``) or from
    walking ``named_modules()`` (``module_walk``); ``reason`` the error of the first failed capture attempt
    (its first line, shortened), ``parts`` how many parts were captured, ``checks`` the checks that did not
    run, ``unplaced`` the sites whose residual stream no capture held (walked, or in a part without a residual
    add), whose ``placement`` therefore says nothing, and ``sites`` how many sites there are."""

    method: Literal["parts", "module_walk"]
    reason: Optional[str] = None
    parts: int = 0
    checks: list[UncheckedCheck] = Field(default_factory=list)
    unplaced: list[str] = Field(default_factory=list)
    sites: int = 0


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
    #: norm modules whose forward returns its input unchanged (``normaudit.facts.usage.identity_norms``: an
    #: identity class monkeypatched over ``nn.LayerNorm``): called, they normalise nothing
    identity_norms: list[str] = Field(default_factory=list)
    #: GroupNorm group counts of the configuration that do not divide the channels it declares
    #: (``normaudit.facts.batchnorm``)
    groupnorm_config: list[GroupNormProblem] = Field(default_factory=list)
    #: the causal attention op of the graph (a causal mask or ``is_causal``), found when a BatchNorm normalises
    #: over a sequence (``normaudit.facts.batchnorm``); None where none was looked for or found
    causal_attention: Optional[str] = None
    #: the distinct constant scalings of the residual adds' operands (``normaudit.facts.placement.scaling``)
    residual_scales: list[ResidualScale] = Field(default_factory=list)
    #: the checks that did not run because the whole model was not captured as one graph
    #: (``normaudit.facts.coverage``); None when it was
    partial_capture: Optional[PartialCapture] = None
    #: the configuration's declaration of causal convolutions (``use_causal_conv=True``), looked for when a
    #: GroupNorm/InstanceNorm's statistics span a sequence or depth axis (``normaudit.facts.causal``); None
    #: where none was looked for or found
    causal_time: Optional[str] = None
    #: a GGUF file: its architecture and the norms the config it was converted from implies (None elsewhere)
    gguf: Optional[GgufModelFacts] = None
    #: free-form model-level facts of passes outside normaudit; normaudit's own facts are typed fields
    extra: dict[str, Any] = Field(default_factory=dict)
