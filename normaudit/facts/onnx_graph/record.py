"""What the ONNX passes keep about one site beside its report :class:`~normaudit.report.Site`:
:class:`OnnxSiteRecord` (the nodes behind it, the value it normalises and the one it produces, its parameter
tensors, where its eps is added), and the helpers every pass uses to step over casts and to read an affine
map after a normalisation (:func:`affine_after`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from normaudit.loaders.onnx_file import OnnxGraph
from normaudit.report import Site

#: nodes that pass a value on unchanged but for its dtype
CASTS = ("Cast", "CastLike", "Identity")
HALF = ("float16", "bfloat16")


@dataclass
class OnnxSiteRecord:
    """One norm site of an ONNX graph.

    ``anchor``: index of the node the site is named after (the fused op, or the statistic of a decomposed
    chain); ``nodes``: indices of every node it spans; ``inp``: the value normalised (before casts);
    ``out``: the value it produces (after its gain and bias); ``gain``/``bias``/``mean``/``var``: names of the
    tensors holding its gain, bias and BatchNorm running statistics (None where it has none or they are
    computed); ``gain_form`` as ``Site.gain_form``; ``eps_missing``: a decomposed norm whose statistic reaches
    the square root with nothing added; ``statistic`` as ``EpsFacts.statistic``; ``eps_dtype`` and
    ``eps_basis``: the dtype eps is added in and how that was found."""

    site: Site
    anchor: int
    nodes: list[int]
    inp: str
    out: str
    gain: Optional[str] = None
    bias: Optional[str] = None
    mean: Optional[str] = None
    var: Optional[str] = None
    gain_form: str = "none"
    eps_missing: bool = False
    statistic: Optional[str] = None
    eps_dtype: Optional[str] = None
    eps_basis: Optional[str] = None
    extra_nodes: list[int] = field(default_factory=list)


def strip_casts(g: OnnxGraph, value: str) -> str:
    """``value`` before the casts and identities that produce it."""
    for _ in range(16):
        node = g.node_of(value)
        if node is None or g.op(value) not in CASTS or not node.input:
            return value
        value = node.input[0]
    return value


def through_casts(g: OnnxGraph, value: str, nodes: list[int]) -> str:
    """``value`` after the casts that are its only consumer (their indices appended to ``nodes``)."""
    for _ in range(16):
        users = g.users(value)
        if len(users) != 1 or g.nodes[users[0]].op_type not in CASTS or not g.standard(users[0]):
            return value
        nodes.append(users[0])
        value = g.nodes[users[0]].output[0]
    return value


def other_input(node: Any, value: str) -> Optional[str]:
    """The other input of a two-input node, given one of them; None when ``value`` is not one."""
    ins = list(node.input)
    if len(ins) != 2 or value not in ins:
        return None
    return ins[1] if ins[0] == value else ins[0]


def scale_form(g: OnnxGraph, value: str) -> tuple[Optional[str], str]:
    """(the gain tensor, its form) for a value used as a norm's scale: a tensor (``weight``), a tensor plus 1
    (``one_plus_weight``, the gain of Gemma-style norms when an exporter keeps the addition), nothing
    (``none``), or computed otherwise (``unknown``)."""
    if not value:
        return None, "none"
    src = g.tensor_source(value)
    if src is not None:
        return src, "weight"
    node = g.node_of(value)
    if g.op(value) == "Add" and node is not None and len(node.input) == 2:
        for a, b in (node.input, reversed(node.input)):
            if g.tensor_source(a) is not None and g.scalar(a) is None and g.scalar(b) == 1.0:
                return g.tensor_source(a), "one_plus_weight"
    return None, "unknown"


def affine_after(g: OnnxGraph, value: str, nodes: list[int],
                 allow_bias: bool = True) -> tuple[Optional[str], Optional[str], str, str]:
    """The gain multiply and bias add that follow a normalised ``value`` (each its only consumer, casts
    between allowed): (gain tensor, bias tensor, gain form, the value after them). Their node indices are
    appended to ``nodes``."""
    gain, bias, form = None, None, "none"
    value = through_casts(g, value, nodes)
    users = g.users(value)
    if len(users) == 1 and g.nodes[users[0]].op_type == "Mul" and g.standard(users[0]):
        other = other_input(g.nodes[users[0]], value)
        if other is not None and other != value:
            src, f = scale_form(g, other)
            if src is not None and g.scalar(other) is None:
                gain, form = src, f
                nodes.append(users[0])
                value = through_casts(g, g.nodes[users[0]].output[0], nodes)
    users = g.users(value)
    if allow_bias and len(users) == 1 and g.nodes[users[0]].op_type == "Add" and g.standard(users[0]):
        other = other_input(g.nodes[users[0]], value)
        src = g.tensor_source(other) if other is not None else None
        if src is not None and (g.store.dims(src) or []) != [] and g.scalar(other) is None:
            bias = src
            nodes.append(users[0])
            value = g.nodes[users[0]].output[0]
    return gain, bias, form, value
