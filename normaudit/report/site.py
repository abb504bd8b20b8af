"""One normalisation computation found in the model, :class:`Site`, and its description in words
(``site.describe()``, which rule messages read)."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_serializer

from normaudit.report.base import AxisLabel, Kind, Placement, SourceLocation, _Model
from normaudit.report.gguf import GgufFacts
from normaudit.report.numerics import SiteNumerics
from normaudit.report.site_facts import (BatchNormFacts, BatchProbe, EpsFacts, Formula, FreezeFacts, GroupSplit,
                                         LrnArgs, OnnxNode, SizeProbe, StreamFacts, UnreadGain, WeightStats)


class Site(_Model):
    """One normalisation computation found in the model.

    ``module`` is the dotted path of the owning module as ``model.named_modules()`` names it; a functional
    call inside a module's forward carries that module's path (with ``call_index`` > 0 for the second and
    later calls in the same module).
    """

    module: str
    kind: Kind
    class_name: str
    detected_by: Literal["module", "functional", "pattern", "module_walk", "checkpoint", "onnx"]
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
    #: a hand-written norm's 1-D gain parameter that no graph node reads (``normaudit.facts.gain_use``); None
    #: where every gain it registers is read, or it registers none
    unread_gain: Optional[UnreadGain] = None
    #: a checkpoint alone: the kind is a guess from the keys (``kind_basis`` says which keys)
    kind_guessed: bool = False
    kind_basis: Optional[str] = None
    #: a norm tensor of a GGUF file: what the file and the config it was converted from say of it (None elsewhere)
    gguf: Optional[GgufFacts] = None
    stream: StreamFacts = Field(default_factory=StreamFacts)
    batchnorm: BatchNormFacts = Field(default_factory=BatchNormFacts)
    #: a site read from an ONNX graph: its nodes (``normaudit.facts.onnx_graph``); None, and left out of the
    #: dumped report (:meth:`_omit_onnx`), for any other target
    onnx: Optional[OnnxNode] = None
    #: free-form facts of passes outside normaudit (a user's own pass); normaudit's own facts are typed fields
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _omit_onnx(self, handler: Any) -> Any:
        """The dumped site without ``onnx`` where it is None: the reports of the other targets keep the fields
        they had before ONNX graphs became targets."""
        data = handler(self)
        if self.onnx is None and isinstance(data, dict):
            data.pop("onnx", None)
        return data

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
        if self.detected_by == "functional" or (self.detected_by == "pattern" and self.op == "normalize"):
            return f"F.{self.op or self.kind.lower()} in `{self.class_name}` ({what})"
        if self.detected_by == "pattern":
            where = "in " if self.inline else ""
            return f"hand-written {self.kind} {where}`{self.class_name}` ({what})"
        if self.detected_by == "module":
            return f"`{self.class_name}` (a torch.nn {self.kind} subclass: {what})"
        if self.detected_by == "onnx":
            node = self.onnx.node if self.onnx is not None else self.module
            op = f"decomposed {self.kind}" if self.op == "decomposed" else f"ONNX {self.op or self.kind}"
            return f"{op} at node `{node}` ({what})"
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
    if site.kind == "L2Norm":
        stat = "L2 norm"
    elif stat is None:
        stat = "mean of squares" if site.kind == "RMSNorm" else "mean and variance"
    if site.kind in ("BatchNorm", "InstanceNorm", "GroupNorm"):
        stat += " per channel" if site.kind != "GroupNorm" else " per group"
    text = stat + _over(site)
    if site.eps is not None:
        text += f", eps {site.eps:g}" + (" added to the root" if f is not None and f.eps_position == "outside_sqrt" else "")
    elif site.detected_by == "pattern":
        text += ", no eps"
    return text
