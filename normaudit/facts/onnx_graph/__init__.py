"""Facts of an ONNX graph, as the PyTorch passes give them for a captured graph where they carry over: the
norm sites (the normalisation operators, :mod:`.fused`, and the decomposed forms exporters emit,
:mod:`.chains`), each named by the PyTorch module path the exporter recorded (:mod:`.names`), the axes each
reduces (:mod:`.axes`), its place on the residual stream (:mod:`.placement`), its eps (:mod:`.eps`) and the
statistics of its gain, bias and running statistics (:mod:`.weights`). :func:`analyse` runs them in order."""
from __future__ import annotations

from dataclasses import dataclass, field

from normaudit.facts.eps import ConfigSource
from normaudit.facts.onnx_graph.axes import UNK, flat_axes, label_values
from normaudit.facts.onnx_graph.chains import chain_site
from normaudit.facts.onnx_graph.eps import eps_facts
from normaudit.facts.onnx_graph.fused import fused_site
from normaudit.facts.onnx_graph.names import module_path
from normaudit.facts.onnx_graph.placement import place
from normaudit.facts.onnx_graph.record import OnnxSiteRecord
from normaudit.facts.onnx_graph.weights import site_weights
from normaudit.loaders.onnx_file import OnnxGraph
from normaudit.loaders.onnx_file.tensors import numel
from normaudit.report import ModelFacts, OnnxNode
from normaudit.vocabulary.dtypes import AUDIT_DTYPES

__all__ = ["GraphFacts", "analyse", "find_sites", "graph_dtype"]

#: graphs with more nodes than this get no placement (its ancestry sets grow with the square of the nodes)
MAX_PLACEMENT_NODES = 60_000


@dataclass
class GraphFacts:
    """What :func:`analyse` found: the site records (in graph order), the model facts and notes."""

    records: list[OnnxSiteRecord]
    model: ModelFacts
    notes: list[str] = field(default_factory=list)


def find_sites(g: OnnxGraph) -> list[OnnxSiteRecord]:
    """Every norm site of the graph, in graph order, each named (:func:`_name`); a node belongs to one site."""
    taken: set[int] = set()
    records = []
    for i in range(len(g.nodes)):
        if i in taken:
            continue
        rec = fused_site(g, i) or chain_site(g, i)
        if rec is None or taken & set(rec.nodes):
            continue
        taken.update(rec.nodes)
        records.append(rec)
    records.sort(key=lambda r: r.anchor)
    seen: dict[str, int] = {}
    for rec in records:
        _name(g, rec)
        rec.site.call_index = seen.get(rec.site.module, 0)
        seen[rec.site.module] = rec.site.call_index + 1
    return records


def _name(g: OnnxGraph, rec: OnnxSiteRecord) -> None:
    """Name the site after the PyTorch module the exporter recorded for its anchor node (:func:`module_path`)."""
    node = g.nodes[rec.anchor]
    where = module_path(node, g.labels[rec.anchor])
    site = rec.site
    site.module = where.path
    if where.class_name:
        site.class_name, site.class_module = where.class_name, where.class_module
    stash = rec.eps_dtype if rec.eps_basis == "stash_type of the operator" else None
    site.onnx = OnnxNode(node=g.labels[rec.anchor], op_type=node.op_type, nodes=[g.labels[i] for i in rec.nodes],
                         stash_type=stash, module_from=where.source)


def _axes(g: OnnxGraph, records: list[OnnxSiteRecord]) -> None:
    """``input_axes``, ``normalized_axes`` and ``channel_axes`` of every site from the graph's labels."""
    env = label_values(g)
    for rec in records:
        site = rec.site
        labels = env.get(rec.inp)
        if labels is None or all(lab == UNK for lab in labels):
            continue
        site.input_axes = labels
        site.normalized_axes = flat_axes(labels, site.reduced_dims)
        if site.kind in ("BatchNorm", "GroupNorm", "InstanceNorm") and len(labels) > 1:
            site.channel_axes = flat_axes(labels, [1])


def graph_dtype(g: OnnxGraph) -> str:
    """The graph's float type: the floating dtype of most of its float inputs, else of most of its float
    parameters by element count; float32 when it has neither."""
    counts: dict[str, int] = {}
    for name in g.inputs:
        dt = g.dtype(name)
        if dt in AUDIT_DTYPES:
            counts[dt] = counts.get(dt, 0) + 1
    if not counts:
        for name, t in g.store.tensors.items():
            dt = g.store.dtype(name)
            if dt in AUDIT_DTYPES:
                counts[dt] = counts.get(dt, 0) + numel(t.dims)
    return max(counts, key=lambda d: (counts[d], d)) if counts else "float32"


def analyse(g: OnnxGraph, sources: list[ConfigSource]) -> GraphFacts:
    """The sites of ``g`` with every fact above, and the model facts; ``sources`` are the configs the eps are
    compared with. Raises UsageError for a parameter tensor whose stored data is corrupt."""
    records = find_sites(g)
    _axes(g, records)
    params = sum(numel(t.dims) for t in g.store.tensors.values())
    producer = " ".join(p for p in (g.model.producer_name, g.model.producer_version) if p)
    model = ModelFacts(class_name=f"ONNX graph {g.model.graph.name or ''}".strip() + (f" ({producer})" if producer else ""),
                       num_parameters=params)
    notes: list[str] = []
    if len(g.nodes) <= MAX_PLACEMENT_NODES:
        place(g, records, model)
    else:
        for rec in records:
            rec.site.placement = "unknown"
        notes.append(f"placement not read: the graph has {len(g.nodes)} nodes (at most {MAX_PLACEMENT_NODES})")
    for rec in records:
        rec.site.weights = site_weights(g, rec)
        rec.site.gain_form = rec.gain_form
    eps_facts(records, sources)
    return GraphFacts(records=records, model=model, notes=notes)
