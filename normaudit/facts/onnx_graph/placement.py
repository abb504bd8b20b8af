"""Placement of the norms of an ONNX graph on its residual stream, read from the residual ``Add`` nodes as
:mod:`normaudit.facts.placement` reads them in a PyTorch graph (Xiong et al. 2020, arXiv 2002.04745, for pre-
and post-LN), kept to what the graph shows exactly:

- a residual add is an ``Add`` of two computed values one of which (the skip) is an ancestor of the other
  (the branch): ``x + f(x)``;
- a norm inside a branch (its output reaches the branch, not the skip, and it reads what the skip carries or
  something computed from it) is ``pre`` (``branch_position`` ``input`` when it reads the stream the skip
  carries, ``inner`` deeper), or ``sandwich`` when its output is the branch itself (``x + norm(f(x))``); the
  first such add in graph order decides;
- a norm whose output is the skip of a residual add is ``post`` when it reads a residual add
  (``x = norm(x + f(x))``) and ``embedding`` otherwise (it starts the stream);
- a norm reading the last residual add, with no residual add after it, is ``final`` when that add's branch
  holds a norm (a pre-LN stack) and ``post`` when it does not (the last layer of a post-LN stack);
- ``none`` when the graph has no residual add or the norm is connected to none; ``unknown`` otherwise.

The model's scheme is ``pre``, ``post``, ``sandwich`` (pre and sandwich norms), ``mixed``, ``none`` or
``unknown``; a pre-LN stack whose last residual add reaches the output with no norm after it is its
``stream_end`` (rule NP101). ``stream.reads_norm``/``feeds_norm``: a norm whose input is another norm's output
with nothing but casts and views between (rule NP103).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from normaudit.facts.onnx_graph.names import block_of, module_path
from normaudit.facts.onnx_graph.record import OnnxSiteRecord, strip_casts
from normaudit.loaders.onnx_file import OnnxGraph
from normaudit.report import ModelFacts, StreamEnd

_VIEWS = ("Cast", "CastLike", "Identity", "Dropout", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")


class Reach:
    """Ancestry of the values of a graph, one bit per node and graph input (Python ints as bit sets)."""

    def __init__(self, g: OnnxGraph):
        self.g = g
        n = len(g.nodes)
        self.bit = {name: 1 << (n + k) for k, name in enumerate(g.inputs)}
        self.mask: list[int] = []
        for i, node in enumerate(g.nodes):
            m = 1 << i
            for v in node.input:
                m |= self.of(v)
            self.mask.append(m)

    def of(self, value: str) -> int:
        """The bits of the nodes and inputs ``value`` is computed from (its own included)."""
        i = self.g.producer.get(value)
        if i is not None and i < len(self.mask):
            return self.mask[i]
        return self.bit.get(value, 0)

    def own(self, value: str) -> int:
        i = self.g.producer.get(value)
        return (1 << i) if i is not None else self.bit.get(value, 0)

    def anc_or_eq(self, u: str, v: str) -> bool:
        """``u`` is ``v`` or one of the values ``v`` is computed from."""
        own = self.own(u)
        return u == v or bool(own and own & self.of(v))


@dataclass
class ResidualAdd:
    """One residual add: its node index, the skip and branch operands and its output."""

    node: int
    skip: str
    branch: str
    out: str


def residual_adds(g: OnnxGraph, reach: Reach) -> list[ResidualAdd]:
    """The residual adds of the graph (see the module docstring), in graph order."""
    out = []
    for i, node in enumerate(g.nodes):
        if node.op_type != "Add" or not g.standard(i) or len(node.input) != 2 or not node.output:
            continue
        a, b = node.input
        if not a or not b or a == b or g.tensor_source(a) or g.tensor_source(b):
            continue
        sa, sb = g.shape(a), g.shape(b)
        if sa is not None and sb is not None and sa != sb:
            continue
        if reach.anc_or_eq(a, b):
            out.append(ResidualAdd(i, a, b, node.output[0]))
        elif reach.anc_or_eq(b, a):
            out.append(ResidualAdd(i, b, a, node.output[0]))
    return out


def _in_branch(reach: Reach, rec: OnnxSiteRecord, add: ResidualAdd) -> bool:
    return (reach.anc_or_eq(rec.out, add.branch) and not reach.anc_or_eq(rec.out, add.skip)
            and reach.anc_or_eq(add.skip, rec.inp))


def _role(g: OnnxGraph, reach: Reach, rec: OnnxSiteRecord, adds: list[ResidualAdd],
          recs: list[OnnxSiteRecord]) -> str:
    """The placement of one site (see the module docstring); sets its ``stream.branch_position``."""
    stream = rec.site.stream
    inp, out = strip_casts(g, rec.inp), rec.out
    for a in adds:
        if _in_branch(reach, rec, a):
            if strip_casts(g, a.branch) == out:
                stream.branch_position = "output"
                return "sandwich"
            stream.branch_position = "input" if inp == strip_casts(g, a.skip) else "inner"
            return "pre"
    reads = next((a for a in adds if inp == a.out), None)
    if any(strip_casts(g, a.skip) == out for a in adds):
        return "post" if reads is not None else "embedding"
    if reads is not None and not any(reach.anc_or_eq(out, a.out) for a in adds):
        normed = any(r is not rec and _in_branch(reach, r, reads) for r in recs)
        return "final" if normed else "post"
    related = any(reach.anc_or_eq(a.out, rec.inp) or reach.anc_or_eq(rec.out, a.out) for a in adds)
    return "unknown" if related else "none"


def _scheme(placements: list[str], adds: list[ResidualAdd]) -> str:
    roles = {p for p in placements if p in ("pre", "post", "sandwich")}
    if not roles:
        return "none" if not adds else "unknown"
    if roles <= {"pre", "sandwich"}:
        return "pre" if roles == {"pre"} else "sandwich" if "pre" in roles else "unknown"
    return "post" if roles == {"post"} else "mixed"


def _stream_end(g: OnnxGraph, reach: Reach, recs: list[OnnxSiteRecord], adds: list[ResidualAdd]) -> Optional[StreamEnd]:
    """The end of a pre-LN stream that no norm closes: the last residual add, when no norm reads anything
    computed from it; named after the ``pre`` norm of its branch and the first layer reading it."""
    last = adds[-1]
    if any(reach.anc_or_eq(last.out, r.inp) for r in recs):
        return None
    pre = [r for r in recs if r.site.placement == "pre" and _in_branch(reach, r, last)]
    if not pre:
        return None
    value, consumer = last.out, None
    for _ in range(8):
        users = g.users(value)
        if len(users) != 1:
            break
        node = g.nodes[users[0]]
        if node.op_type in _VIEWS and node.output:
            value = node.output[0]
            continue
        consumer = module_path(node, g.labels[users[0]]).path
        break
    if value not in g.outputs and consumer is None and g.users(value):
        consumer = module_path(g.nodes[g.users(value)[0]], g.labels[g.users(value)[0]]).path
    site = pre[-1].site
    return StreamEnd(module=site.module, block=site.block, consumer=consumer)


def _only_feeds(g: OnnxGraph, value: str, rec: OnnxSiteRecord) -> bool:
    """Every reader of ``value``, through views and casts, is a node of ``rec``."""
    own = set(rec.nodes)
    frontier, seen = [value], 0
    while frontier and seen < 64:
        for u in g.users(frontier.pop()):
            seen += 1
            if u in own:
                continue
            if g.nodes[u].op_type not in _VIEWS or not g.nodes[u].output:
                return False
            frontier.append(g.nodes[u].output[0])
    return not frontier


def _double_norms(g: OnnxGraph, recs: list[OnnxSiteRecord]) -> None:
    """``stream.reads_norm``/``feeds_norm``: a norm reading another's output through views and casts only,
    that output read by nothing else."""
    by_out = {r.out: r for r in recs}
    for r in recs:
        value = r.inp
        for _ in range(8):
            first = by_out.get(value)
            if first is not None and first is not r:
                if _only_feeds(g, first.out, r):
                    r.site.stream.reads_norm = first.site.module
                    first.site.stream.feeds_norm = r.site.module
                break
            node = g.node_of(value)
            if node is None or g.op(value) not in _VIEWS or not node.input:
                break
            value = node.input[0]


def place(g: OnnxGraph, recs: list[OnnxSiteRecord], model: ModelFacts) -> None:
    """Set every site's ``placement``, ``block`` and stream facts, and the model's scheme, residual-add count,
    final norm and stream end."""
    reach = Reach(g)
    adds = residual_adds(g, reach)
    for r in recs:
        r.site.placement = _role(g, reach, r, adds, recs) if adds else "none"
        r.site.block = block_of(r.site.module)
    _double_norms(g, recs)
    model.num_residual_adds = len(adds)
    model.placement = _scheme([r.site.placement for r in recs], adds)
    if model.placement in ("pre", "sandwich"):
        model.has_final_norm = any(r.site.placement == "final" for r in recs)
        if not model.has_final_norm:
            model.stream_end = _stream_end(g, reach, recs, adds)
