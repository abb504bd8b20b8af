"""The declared list of fact passes (:data:`PASSES`) and how a stage of them runs; the stages are those of
:mod:`normaudit.pipeline`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

from normaudit.facts import (aliasing, axes, batchnorm, causal, coverage, eps, eps_param, formula, frozen, gain_use,
                             numerics, placement, sites, usage, weights)
from normaudit.facts.context import FactContext, Facts
from normaudit.probes import batch as batch_probe
from normaudit.probes import formula_confirm as formula_probe
from normaudit.probes import numerics as numerics_probe
from normaudit.probes import size as size_probe
from normaudit.report import ModelFacts

Stage = Literal["graph", "probe", "model", "whole_model"]
#: the stages in the order they run (:func:`normaudit.pipeline.collect_facts`)
STAGES: tuple[Stage, ...] = ("graph", "probe", "model", "whole_model")
#: what a pass may read without an earlier pass writing it: the graph and the fields of the context
#: (:class:`normaudit.facts.context.FactContext`)
CONTEXT = ("graph", "origins", "input_axes", "inputs", "probe_model", "checkpoint", "config", "config_sources")


@dataclass(frozen=True)
class Pass:
    """One step of the pipeline: ``run(ctx, facts)`` at ``stage``; ``reads`` and ``writes`` name the facts
    (``site.<field>``, ``model.<field>``, ``records``, ``node_axes``, ``notes``, ``numerics``, ``graph``: the graph
    itself; what a pass reads is written by a pass before it or is a field of the context: :data:`CONTEXT`);
    ``carry(carry, facts)``, when given, carries this pass's model-level facts from the kept blocks to the
    whole stack after the sites were (depth-independent capture, :class:`normaudit.pipeline.carry.Carry`),
    raising :class:`normaudit.facts.carry.NotCarried` when it cannot do so exactly; ``recomputed`` names
    the site facts (dotted fields below a site) that hook computes anew over the whole stack: they are reset on
    the kept blocks' sites before the carry-over compares them."""

    name: str
    stage: Stage
    run: Callable[[FactContext, Facts], None]
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    carry: Optional[Callable[[Any, Facts], None]] = None
    recomputed: tuple[str, ...] = ()


PASSES: tuple[Pass, ...] = (
    Pass("inplace-dataflow", "graph", aliasing.run_dataflow, ("graph",), ("graph",)),
    Pass("sites", "graph", sites.run, ("graph", "origins"), ("records",)),
    Pass("axes", "graph", axes.run, ("graph", "records", "input_axes"),
         ("node_axes", "site.input_axes", "site.normalized_axes")),
    Pass("placement", "graph", placement.run, ("graph", "records"),
         ("site.placement", "site.block", "site.stream", "model.placement", "model.parallel_residual",
          "model.has_final_norm", "model.num_residual_adds", "model.blocks", "model.residual_scales"),
         carry=placement.carry,
         recomputed=("stream.majority_placement", "stream.majority_blocks")),
    Pass("aliasing", "graph", aliasing.run, ("graph", "records"), ("site.stream.inplace_alias",)),
    Pass("formula", "graph", formula.run, ("graph", "records", "site.normalized_axes"),
         ("site.formula", "site.eps")),
    Pass("formula-probe", "graph", formula_probe.run, ("records", "site.formula", "probe_model"),
         ("site.formula", "site.kind")),
    Pass("formula-text", "graph", formula.run_text, ("graph", "records", "site.formula", "site.kind"),
         ("site.formula",)),
    Pass("gain-use", "graph", gain_use.run, ("graph", "records", "site.formula", "site.kind"), ("site.unread_gain",)),
    Pass("batchnorm", "graph", batchnorm.run, ("graph", "records", "node_axes", "inputs"),
         ("site.channel_axes", "site.batchnorm", "model.causal_attention")),
    Pass("frozen", "graph", frozen.run, ("records", "probe_model"), ("site.freeze",)),
    Pass("size-probe", "probe", size_probe.run, ("graph", "records", "inputs"), ("site.size_probe", "notes")),
    Pass("batch-probe", "probe", batch_probe.run, ("graph", "records", "node_axes", "probe_model", "inputs"),
         ("site.batch_probe", "notes")),
    Pass("weights", "model", weights.run, ("records", "site.formula", "checkpoint"),
         ("site.weights", "site.gain_form", "notes")),
    Pass("numerics-bound", "model", numerics.run, ("records", "site.weights", "checkpoint"), ("site.numerics",)),
    Pass("usage", "model", usage.run, ("graph", "records", "checkpoint"), ("model.unused_norms", "notes")),
    Pass("identity-norms", "whole_model", usage.run_identity, ("graph", "records", "model.unused_norms"),
         ("model.identity_norms", "model.unused_norms", "notes")),
    Pass("causal-time", "whole_model", causal.run, ("graph", "records", "site.normalized_axes", "config"),
         ("site.batchnorm.causal_conv", "model.causal_time")),
    Pass("groupnorm-config", "whole_model", batchnorm.run_groupnorm_config, ("records", "config"),
         ("model.groupnorm_config",)),
    Pass("stream-end", "whole_model", placement.run_stream_end,
         ("records", "site.stream", "model.blocks", "model.unused_norms"), ("model.stream_end",)),
    Pass("eps", "whole_model", eps.run, ("records", "config_sources", "site.formula"), ("site.eps_facts",)),
    Pass("eps-parameter", "whole_model", eps_param.run, ("records", "site.eps_facts"), ("site.eps_facts",)),
    Pass("coverage", "whole_model", coverage.run, ("records", "site.placement"), ("model.partial_capture",)),
    Pass("numerics-probe", "whole_model", numerics_probe.run, ("records", "probe_model", "checkpoint"),
         ("site.numerics", "numerics")),
)


def run_stage(stage: Stage, ctx: FactContext, facts: Facts) -> None:
    """Run the passes of ``stage`` over ``facts``, in :data:`PASSES` order."""
    for p in PASSES:
        if p.stage == stage:
            p.run(ctx, facts)


def graph_facts(ctx: FactContext, class_name: str) -> Facts:
    """The ``graph`` stage over ``ctx.cap.gm``: a part's facts, or the first step of the whole model's."""
    facts = Facts(model=ModelFacts(class_name=class_name))
    run_stage("graph", ctx, facts)
    return facts
