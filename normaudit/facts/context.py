"""What every fact pass reads besides the graph (:class:`FactContext`) and what the passes build together
(:class:`Facts`): the two records of the one pass signature ``run(ctx, facts) -> None``
(:mod:`normaudit.pipeline` sequences the passes)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from normaudit.report import ModelFacts, NumericsReport


@dataclass
class FactContext:
    """What the fact passes may read besides the graph; no pass writes to it.

    ``cap`` is the :class:`normaudit.capture.Capture` (its ``modules`` every ``named_modules()`` path of the
    model audited); ``origins`` maps ``id(module)`` to the line constructing it; ``input_axes`` the axis labels
    the user declared for each input (``--input-axes``), None to infer them; ``probe_model`` an untouched copy
    of the model (on the meta device for large models, real for small ones built for real) for passes that run
    real numbers on small materialised modules; ``inputs`` the real example inputs; ``config`` the
    configuration mapping in force and ``config_source`` where it came from; ``config_sources`` every
    configuration to compare eps with (:class:`normaudit.facts.eps.ConfigSource`: ``--config``, the
    checkpoint's, the model's own); ``checkpoint`` an opened :class:`normaudit.loaders.checkpoint.Checkpoint`
    given with the model (None without one).

    The run: ``dtype`` the precision audited (``float32``, ``float16``, ``bfloat16``); ``batch_size`` the
    training micro-batch (``--batch-size``, else the example inputs' batch); ``probes`` the opt-in dynamic
    probes named on the command line (``size``, ``batch``, ``numerics``, ...); ``train_error`` what the model
    raised when captured in train mode (an eval-mode fallback); ``config_origin`` where ``config`` came from
    (``cli``, ``checkpoint``, ``library``, ``model`` or None); ``graph_nodes`` the node count of the model's
    full graph when the captured graph is a reduced one (depth-independent capture; None: the graph's own);
    ``build_fn`` the model's factory and ``file`` the target's file, for the numerics probe's rebuild.
    """

    cap: Any
    origins: dict = field(default_factory=dict)
    input_axes: Optional[list[tuple[str, ...]]] = None
    probe_model: Any = None
    inputs: Any = None
    config: dict[str, Any] = field(default_factory=dict)
    config_source: Optional[str] = None
    config_sources: list = field(default_factory=list)
    checkpoint: Any = None
    dtype: str = "float32"
    batch_size: Optional[int] = None
    probes: list[str] = field(default_factory=list)
    train_error: Optional[str] = None
    config_origin: Optional[str] = None
    graph_nodes: Optional[int] = None
    build_fn: Any = None
    file: Optional[str] = None


@dataclass
class Facts:
    """Everything the rules see, as the passes build it: the site records (each with its pydantic
    :class:`normaudit.report.Site`), the model-level facts and the report's notes.

    ``node_axes`` is the axis pass's label of every node of the graph being analysed (graph-level scratch
    data for the passes after it: BatchNorm facts, the batch probe; never reported); ``numerics`` the section
    of ``--probe numerics`` (None when it did not run)."""

    records: list = field(default_factory=list)
    model: ModelFacts = field(default_factory=lambda: ModelFacts(class_name=""))
    notes: list[str] = field(default_factory=list)
    node_axes: dict = field(default_factory=dict)
    numerics: Optional[NumericsReport] = None
