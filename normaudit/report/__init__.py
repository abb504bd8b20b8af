"""The typed report: pydantic models for everything normaudit emits.

The fields named in ``shared/CONTRACT.md`` (``sites[].module``, ``kind``, ``eps``, ``normalized_axes``,
``placement``; ``model.placement``, ``model.parallel_residual``; ``findings[].rule_id``, ``category``,
``severity``, ``module``, ``message``, ``source``) are an outside contract: rename none of them.
Everything else may grow. Renderers (``normaudit.render``) read only these models.

One module per part: :mod:`.base` (literal types, the record base, source locations), :mod:`.site_facts` (the
fact families of a site), :mod:`.site` (:class:`Site`), :mod:`.numerics` (``--probe numerics``), :mod:`.model`
(model-level facts), :mod:`.locations` (where a finding is shown: the file and line of every finding, relative
to the project root); this module holds the report itself (:class:`Report`, its findings, capture info, target
and summary) and exports every record.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from normaudit.report.base import (_Model, AxisLabel, Category, Kind, ModelPlacement, Placement, ROOT_LABEL,
                                   SEVERITY_RANK, Severity, SourceLocation)
from normaudit.report.gguf import GgufFacts, GgufModelFacts, MissingNorm
from normaudit.report.model import (Block, GroupNormProblem, ModelFacts, PartialCapture, ResidualScale, StreamEnd,
                                    UncheckedCheck, UnusedNorm)
from normaudit.report.numerics import CauseKind, ModuleNumerics, NumericsReport, SiteNumerics, TensorStats
from normaudit.report.site import Site
from normaudit.report.site_facts import (AliasReader, BatchNormFacts, BatchProbe, ConfigEps, EpsFacts, Formula,
                                         FreezeFacts, GroupSplit, InplaceAlias, LrnArgs, OnnxNode, ParamEps,
                                         ShapeMismatch, SizeProbe, StreamFacts, UnreadGain, WeightStats)


class CaptureAttempt(_Model):
    """One capture method tried: ``method`` its label, ``ok`` whether it gave a graph, ``error`` the failure in
    one line, ``location`` the line of model code the failure was raised from (the innermost frame outside
    torch and normaudit; None where the traceback holds none), ``seconds`` how long it took."""

    method: str
    ok: bool
    error: Optional[str] = None
    location: Optional[SourceLocation] = None
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
    #: ``onnx``: nothing captured, the graph of an ONNX file read as it is (``normaudit.audit_onnx``)
    method: Literal["symbolic_trace", "export", "module_walk", "parts", "none",
                    "onnx"]
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
    kind: Literal["python", "hf_dir", "hf_config", "checkpoint",
                  "onnx", "gguf", "hub"]
    factory: Optional[str] = None
    config: Optional[str] = None
    checkpoint: Optional[str] = None
    dtype: str = "float32"
    batch_size: Optional[int] = None
    #: a hub id (kind ``hub``): the snapshot folder (or its GGUF file) of the local cache that was audited
    resolved: Optional[str] = None


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


__all__ = ["AliasReader", "AxisLabel", "BatchNormFacts", "BatchProbe", "Block", "CaptureAttempt", "CaptureInfo",
           "CapturedPart", "Category", "CauseKind", "ConfigEps", "EpsFacts", "Finding", "Formula", "FreezeFacts",
           "GgufFacts", "GgufModelFacts", "GroupNormProblem", "GroupSplit", "InplaceAlias", "Kind", "LrnArgs",
           "MissingNorm", "ModelFacts", "ModelPlacement", "ModuleNumerics", "NumericsReport", "OnnxNode", "ParamEps",
           "PartialCapture", "Placement", "ROOT_LABEL", "Report", "ResidualScale", "SEVERITY_RANK", "Severity",
           "ShapeMismatch", "Site", "SiteNumerics", "SizeProbe", "SourceLocation", "StreamEnd", "StreamFacts",
           "Summary", "TargetInfo", "TensorStats", "UnauditedModule", "UncheckedCheck", "UnreadGain", "UnusedNorm",
           "WeightStats"]
