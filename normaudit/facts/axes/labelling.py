"""The axis pass over a captured graph: model inputs labelled (:mod:`.inputs`), every other node from its
inputs (:mod:`.transfer`), in-place ops under symbolic tracing carried to the tensor they mutate; the labels
stored under ``node.meta["normaudit"]``."""
from __future__ import annotations

from typing import Any, Optional

from torch import fx

from normaudit.capture import Capture
from normaudit.facts.axes.dims import (Label, axes_text, flat_labels, is_unknown, tensor_unknowns, to_labels,
                                       unknown_dims)
from normaudit.facts.axes.inputs import input_dims
from normaudit.facts.axes.ops import raw_name
from normaudit.facts.axes.transfer import transfer_dims
from normaudit.facts.context import FactContext, Facts
from normaudit.vocabulary.graph import shape, tensor_inputs, val


def label_dims(cap: Capture, declared_inputs: Optional[list[Label]] = None) -> dict[fx.Node, Any]:
    """Run the axis pass over ``cap.gm``; returns node -> dims (a list of :data:`Dim` per tensor, a tuple of
    such lists for tuple outputs, None for non-tensors).

    ``declared_inputs`` (from ``--input-axes``) labels the first user input. A node whose transfer raises is
    labelled ``unknown`` (the pass never fails a run); the error is kept in ``node.meta["normaudit"]``.
    """
    env: dict[fx.Node, Any] = {}
    gm = cap.gm
    if gm is None:
        return env
    user_inputs = list(cap.user_inputs)
    first_input = user_inputs[0] if user_inputs else None
    params = {n for n in gm.graph.nodes if n.op == "get_attr" or (n.op == "placeholder" and n.name not in user_inputs)}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.name in user_inputs:
                dims: Any = input_dims(node, cap, declared_inputs if node.name == first_input else None)
            else:
                dims = unknown_dims(shape(node))
        else:
            try:
                dims = transfer_dims(node, cap, env, params)
            except Exception as exc:  # noqa: BLE001 - an op we do not understand: unknown, never a crash
                node.meta.setdefault("normaudit", {})["axes_error"] = f"{type(exc).__name__}: {exc}"
                dims = _fallback_safe(node)
        out_shape = shape(node)
        if isinstance(dims, list) and out_shape is not None and len(dims) != len(out_shape):
            dims = unknown_dims(out_shape)
        env[node] = dims
        _mutated(node, dims, env)
    return env


def _mutated(node: fx.Node, dims: Any, env: dict) -> None:
    """An in-place op (``final.index_add_(...)``, ``x.mul_(...)``) under symbolic tracing: later users read
    the mutated tensor through its first argument's node, so that node takes the op's labels (export
    graphs are functional: their users read the op's output)."""
    raw = raw_name(node)
    if node.op == "placeholder" or not raw.endswith("_") or raw.startswith("_") or not isinstance(dims, list):
        return
    ins = tensor_inputs(node)
    if ins and isinstance(env.get(ins[0]), list) and shape(ins[0]) == shape(node):
        env[ins[0]] = [d if not is_unknown(d) else old for d, old in zip(dims, env[ins[0]])]


def _fallback_safe(node: fx.Node) -> Any:
    out_shape = shape(node)
    if out_shape is not None:
        return unknown_dims(out_shape)
    try:
        return tensor_unknowns(val(node))
    except RuntimeError:  # a data-dependent (unbacked) size: GuardOnDataDependentSymNode
        return None


def label_graph(cap: Capture, declared_inputs: Optional[list[Label]] = None) -> dict[fx.Node, Any]:
    """Run the axis pass over ``cap.gm``; returns node -> labels (a list of :data:`Label` per tensor, a
    tuple for tuple outputs) and stores them under ``node.meta["normaudit"]["axes"]`` (and the dims with
    their parts, :func:`label_dims`, under ``["axis_dims"]``)."""
    dims = label_dims(cap, declared_inputs)
    env: dict[fx.Node, Any] = {}
    for node, d in dims.items():
        labs = to_labels(d)
        env[node] = labs
        meta = node.meta.setdefault("normaudit", {})
        meta["axes"] = labs
        meta["axis_dims"] = d
    return env


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``axes``: axis labels of every graph node (``facts.node_axes``, :func:`label_graph`) and, per
    site, the labels of its input (``input_axes``) and of the dims its statistics reduce (``normalized_axes``:
    ``unknown`` when its input has no labels)."""
    env = label_graph(ctx.cap, ctx.input_axes)
    for rec in facts.records:
        labels = env.get(rec.input) if rec.input is not None else None
        if isinstance(labels, list):
            rec.site.input_axes = axes_text(labels)
            dims = rec.site.reduced_dims or []
            picked = [labels[d] for d in dims if d < len(labels)]
            rec.site.normalized_axes = flat_labels(picked)  # type: ignore[assignment]
        elif rec.site.reduced_dims:
            rec.site.normalized_axes = ["unknown"]
    facts.node_axes = env
