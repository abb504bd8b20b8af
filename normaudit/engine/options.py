"""What the rules read about the run, beside the facts: :class:`RuleOptions`, the ``options`` name of a rule's
expressions (``options.dtype``, ``options.library_model``): how the audit was asked for and how the capture
went. Every field is typed, so a rule that reads an unknown one fails when it is loaded and evaluated, not
silently."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from normaudit.report import NumericsReport


class UnusedSuppression(BaseModel):
    """A ``# normaudit: ignore[...]`` comment that suppressed nothing in this run (``normaudit.suppress``):
    where it is (``file``, ``line``, its ``text``, the ``module`` whose statement it is on), the ``codes`` it
    names, those that matched no finding (``unused``) or name no rule (``unknown``), ``bare`` for a comment
    without codes, and the ``summary`` and ``fix`` NK901 reports."""

    model_config = ConfigDict(extra="forbid")

    file: str
    line: int
    text: str
    module: str
    codes: list[str] = Field(default_factory=list)
    unused: list[str] = Field(default_factory=list)
    unknown: list[str] = Field(default_factory=list)
    bare: bool = False
    summary: str
    fix: str


class RuleOptions(BaseModel):
    """The run as the rules see it.

    ``dtype``: the precision audited (``--dtype``); ``batch_size``: the training micro-batch (``--batch-size``,
    else the example inputs' batch; None when unknown); ``checkpoint``: weights were given with the model;
    ``checkpoint_only``: the target is a checkpoint without model code (only the checkpoint rules run);
    ``probes``: the opt-in probes asked for; ``capture_method``: how the model was captured (``symbolic_trace``,
    ``export``, ``parts``, ``module_walk``, ``none``), ``train_error`` what it raised in train mode before an
    eval-mode capture, ``capture_error`` the first failed attempt's error, ``unset_config_keys`` the keys of the
    model's own config that are None and that a failed attempt's error names (the dotted path in the config,
    :func:`normaudit.capture.errors.unset_config_keys`; only when the whole model was not captured),
    ``config_conflicts`` a sentence for each pair of config values the failed forward shows to disagree,
    naming the keys (:func:`normaudit.capture.errors.rope_section_conflicts`; the same condition),
    ``config_error`` the failed attempt's error they were read from;
    ``config_origin``: where the config
    in force came from (``cli``, ``checkpoint``, ``library``, ``model``, None); ``library_model``: the model
    (or its config) comes from a library (transformers, diffusers, timm); ``numerics``: the ``--probe
    numerics`` section; ``suppression``: for NK901, the unused suppression comment it reports."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    dtype: str = "float32"
    batch_size: Optional[int] = None
    checkpoint: bool = False
    checkpoint_only: bool = False
    probes: list[str] = Field(default_factory=list)
    capture_method: Optional[str] = None
    train_error: Optional[str] = None
    capture_error: Optional[str] = None
    unset_config_keys: list[str] = Field(default_factory=list)
    config_conflicts: list[str] = Field(default_factory=list)
    config_error: Optional[str] = None
    config_origin: Optional[str] = None
    library_model: bool = False
    numerics: Optional[NumericsReport] = None
    suppression: Optional[UnusedSuppression] = None

    @classmethod
    def of(cls, options: Any) -> "RuleOptions":
        """``options`` as a :class:`RuleOptions` (a mapping of its fields, or None for the defaults)."""
        if isinstance(options, cls):
            return options
        return cls.model_validate(dict(options or {}))
