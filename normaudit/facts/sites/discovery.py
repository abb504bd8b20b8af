"""The site discovery pass: the detectors of :mod:`normaudit.facts.sites` run over one captured graph in
order, each skipping the nodes already claimed, then the records numbered per module and their shape and
dtype facts filled."""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from torch import fx

from normaudit.capture import Capture
from normaudit.facts.context import FactContext, Facts
from normaudit.facts.sites.activations import activation_nodes, is_act
from normaudit.facts.sites.application import extend_affine, norm_like
from normaudit.facts.sites.builtin import functional_facts, module_facts, reduced_dims_for, resolve_default_eps
from normaudit.facts.sites.frozen_batchnorm import folded_frozen_batchnorm_sites
from normaudit.facts.sites.group_norm import functional_group_norm
from normaudit.facts.sites.hand_written import hand_written_sites
from normaudit.facts.sites.record import SiteRecord, dtype_str, location
from normaudit.report import Site, SourceLocation
from normaudit.vocabulary.graph import dtype, op_name, owner, shape, sizes, strip_neutral
from normaudit.vocabulary.kinds import OP_KINDS, builtin_kind


class _Discovery:
    """One :func:`discover_sites` pass over ``cap.gm``: the site records found so far (``records``) and the
    graph nodes they claim (``claimed``, shared with the hand-written pass so that no node is two sites)."""

    def __init__(self, cap: Capture, origins: dict[int, SourceLocation]):
        self.gm, self.modules, self.origins = cap.gm, cap.modules, origins
        self.records: list[SiteRecord] = []
        self.claimed: set[fx.Node] = set()

    def new(self, path: str, kind: str, by: str, node: fx.Node, opname: Optional[str]) -> SiteRecord:
        """A record for the norm computed in module ``path`` (``by``: module, functional or pattern) with its
        source locations; not yet in :attr:`records`."""
        mod = self.modules.get(path)
        site = Site(module=path, kind=kind, class_name=type(mod).__name__ if mod is not None else "?",
                    detected_by=by, op=opname)
        rec = SiteRecord(site=site, module_obj=mod)
        # The call: for a hand-written norm module, where its forward is called, not a line inside it.
        site.call = location(node, skip_inner=1 if by == "pattern" and norm_like(mod) else 0)
        site.definition = self.origins.get(id(mod)) if mod is not None else None
        # Where a fix goes: the constructor line of a norm module, the call line of a functional norm.
        site.source = (site.call or site.definition) if by == "functional" else (site.definition or site.call)
        # What computes it: the call of a functional norm; for a hand-written one the statistic's line
        # (add_pattern); nothing for a torch.nn module (torch computes it).
        site.computation = None if by == "module" else location(node)
        site.class_module = type(mod).__module__ if mod is not None else None
        return rec

    def _keep(self, rec: SiteRecord, nodes: set[fx.Node]) -> None:
        rec.nodes |= nodes
        self.claimed |= nodes
        self.records.append(rec)

    def builtin_and_functional(self, data: set) -> set[str]:
        """Steps 1 and 2: ``torch.nn`` norm modules called as modules, and functional norm ops (``F.layer_norm``,
        ``aten.native_layer_norm``...) whose input is ``data`` (not a conv's weight: weight standardisation).
        Returns the module paths found."""
        seen: set[str] = set()
        for node in self.gm.graph.nodes:
            name = op_name(node)
            if name == "module":
                mod = self.modules.get(str(node.target))
                kind = builtin_kind(mod)
                if kind is None:
                    continue
                rec = self.new(str(node.target), kind, "module", node, type(mod).__name__)
                rec.input, rec.output = node.args[0] if node.args else None, node
                module_facts(rec.site, mod, shape(rec.input))
            elif name in OP_KINDS and node.op == "call_function":
                if not is_act(node.args[0] if node.args else None, data):
                    continue  # F.batch_norm over a conv's weight: weight standardisation, no activation normalised
                rec = self._functional(node, name)
            else:
                continue
            self._keep(rec, {node, *rec.nodes})
            seen.add(rec.site.module)
        return seen

    def _functional(self, node: fx.Node, name: str) -> SiteRecord:
        path = owner(node, self.modules)
        mod = self.modules.get(path)
        if builtin_kind(mod) is not None:
            rec = self.new(path, builtin_kind(mod), "module", node, name)
            module_facts(rec.site, mod, shape(node.args[0]))
        else:
            rec = self.new(path, OP_KINDS[name], "functional", node, name)
            functional_facts(rec.site, node, name)
        rec.input, rec.output = node.args[0], node
        if rec.site.detected_by == "functional":
            functional_group_norm(rec, name, self.modules)  # F.layer_norm(x.view(N, G, -1), ...): a GroupNorm
        return rec

    def decomposed_builtins(self, owned: dict[str, list[fx.Node]], seen: set[str]) -> None:
        """Built-in norm modules ``seen`` lacks, captured as decomposed ops (export of LocalResponseNorm): one
        site per module over the nodes it owns."""
        for path, nodes in owned.items():
            mod = self.modules.get(path)
            kind = builtin_kind(mod)
            if kind is None or path in seen or not nodes:
                continue
            node_set = set(nodes)
            first = next((a for n in nodes for a in n.args if isinstance(a, fx.Node) and a not in node_set), None)
            rec = self.new(path, kind, "module", nodes[0], type(mod).__name__)
            rec.input, rec.output = first, nodes[-1]
            module_facts(rec.site, mod, shape(first))
            self._keep(rec, node_set)

    def add_pattern(self, path: str, node: fx.Node, stat: fx.Node, applied: fx.Node, src: fx.Node, dims,
                    centered: bool, variance: str, eps: Optional[float], how: str,
                    kind: Optional[str] = None) -> SiteRecord:
        """Record a hand-written norm: statistic ``stat`` of ``src`` over ``dims`` applied at ``applied``, with
        its affine chain after (step 3); returns the record (already kept) for the caller's hints."""
        rec = self.new(path, kind or ("LayerNorm" if centered else "RMSNorm"), "pattern", node, None)
        rec.input = strip_neutral(src)
        rec.stat = stat
        rec.site.computation = location(stat) or rec.site.computation
        rec.site.inline = not norm_like(rec.module_obj)
        out, chain = extend_affine(applied, path, self.modules)
        rec.output = out
        in_sizes = sizes(rec.input)  # a data-dependent row count (h[mask]) leaves the feature sizes known
        rec.site.reduced_dims = list(dims)
        if in_sizes is not None:
            n_dims = len(in_sizes)
            if dims and list(dims) == list(range(n_dims - len(dims), n_dims)) \
                    and all(in_sizes[d] is not None for d in dims):
                rec.site.normalized_shape = [in_sizes[d] for d in dims]
        rec.site.eps = eps
        rec.site.compute_dtype = dtype_str(dtype(stat))
        rec.hints.update(how_eps=how, variance=variance, centered=centered,
                         applied_by=op_name(applied), affine_chain=[op_name(c) for c in chain])
        params = [p for p in (rec.module_obj.parameters(recurse=False) if rec.module_obj is not None else [])
                  if p.dim() == 1]
        rec.site.affine_weight = any(op_name(c) == "mul" for c in chain) or None
        rec.site.affine_bias = any(op_name(c) == "add" for c in chain) or (False if params else None)
        self._keep(rec, {node, stat, applied, *chain})
        return rec


def discover_sites(cap: Capture, origins: Optional[dict[int, SourceLocation]] = None) -> list[SiteRecord]:
    """Find every normalisation computation in ``cap.gm`` (:mod:`normaudit.facts.sites`): built-in modules and
    functional calls, built-in modules as decomposed ops, hand-written norms, frozen BatchNorms folded by
    symbolic tracing. Returns the records in graph order."""
    gm = cap.gm
    assert gm is not None
    found = _Discovery(cap, origins or {})
    owned: dict[str, list[fx.Node]] = defaultdict(list)
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            owned[owner(node, cap.modules)].append(node)
    act = activation_nodes(gm, list(cap.user_inputs))
    # what a statistic must be taken on to be a norm: data, the inputs' or data the forward made itself
    data = activation_nodes(gm, list(cap.user_inputs), created=True)
    seen = found.builtin_and_functional(data)  # 1 + 2
    found.decomposed_builtins(owned, seen)
    # 3: hand-written norms; 4: frozen BatchNorms folded by symbolic tracing
    hand_written_sites(gm, cap.modules, found.claimed, act, found.add_pattern, data)
    folded_frozen_batchnorm_sites(owned, found.records, cap.modules, act, found.add_pattern)
    records = found.records
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    records.sort(key=lambda r: min((order[n] for n in r.nodes), default=len(order)))
    _finish(records)
    return records


def _finish(records: list[SiteRecord]) -> None:
    """Number repeated calls per module and fill shape facts (records are in graph order)."""
    counts: dict[str, int] = defaultdict(int)
    for rec in records:
        s = rec.site
        s.call_index = counts[s.module]
        counts[s.module] += 1
        # sizes, not shape: a data-dependent size (h[mask]) leaves rank, dtype and the other sizes known
        in_sizes = sizes(rec.input) if rec.input is not None else None
        if in_sizes is not None:
            if None not in in_sizes:
                s.input_shape = list(in_sizes)
            s.input_dtype = dtype_str(dtype(rec.input))
            if s.reduced_dims is None:
                n = len(s.normalized_shape or [1])
                s.reduced_dims = reduced_dims_for(s.kind, len(in_sizes), n)
            if s.kind == "GroupNorm" and s.num_channels is None and len(in_sizes) > 1:
                s.num_channels = in_sizes[1]
        resolve_default_eps(s)
        if s.compute_dtype is None and s.input_dtype is not None:
            fused = s.detected_by in ("module", "functional")
            if fused and s.input_dtype in ("float16", "bfloat16"):
                s.compute_dtype = "float32"
            else:
                s.compute_dtype = s.input_dtype


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``sites``: every norm computation of the graph, one record each (:func:`discover_sites`)."""
    facts.records = discover_sites(ctx.cap, ctx.origins)
