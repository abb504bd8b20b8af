"""Depth-independent capture: capture each distinct repeated block once and carry its facts to its copies.

Transformer and CNN stacks repeat identical blocks (``model.layers.0 .. model.layers.79``). Capturing and
analysing all of them costs time and memory linear in depth, though every middle block yields the same sites
and facts up to its module path. Here:

1. :func:`plan_repeats` finds the stacks: an ``nn.ModuleList`` or ``nn.Sequential`` whose children ``1 ..
   N-1`` (``N >= MIN_BLOCKS``) are *structurally identical* (:func:`block_signature`: per submodule its class,
   the code object of its ``forward``, parameter and buffer names/shapes/dtypes, hyper-parameters such as eps,
   normalized_shape or num_groups, hooks, and the line that constructed it), no module or parameter shared
   between blocks. It builds a *reduced* model: a shallow copy of the modules on the path to each stack,
   the stack keeping the blocks ``0, 1, 2, N-1`` under their original names (``layers.79`` stays
   ``layers.79``), so every module path of the reduced graph is a path of the full model.
2. The reduced model is captured and its facts collected as usual (``normaudit.audit``).
3. :func:`check_reduced` proves on that run that the stack is iterated in order with shape-preserving blocks:
   an eager forward on fake tensors calls the kept blocks once each, in order, and blocks ``1``, ``2`` and
   ``N-1`` receive inputs of identical shapes and dtypes (keyword inputs too) and return their first input's
   shape; and no kept block reads its block number (:data:`INDEX_ATTRS`, left out of the signature) meanwhile.
4. :func:`expand_facts` checks translation invariance (the sites of block 1, renamed to block 2, equal those of
   block 2, extras and placement included; both are middle blocks) and then clones the sites of block 2 for each
   elided block ``3 .. N-2``, renamed, inserting them in graph order; ``model.blocks``,
   ``num_residual_adds``, ``num_parameters``, ``stack_blocks``, ``majority_*`` and the GroupNorm config facts
   are recomputed over the expanded model. A site of another block that names a stack block (a norm of block
   N-1 reading one of block 2) or anything it cannot carry over makes it return None: the caller then captures
   the full model (never a guess).

The result is the report of the full capture (tests/test_depth_independent.py compares the JSON of both paths
on every test model) at the capture cost of four blocks per stack.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

#: a stack needs at least this many blocks for elision to pay (blocks 0, 1, 2 and N-1 are kept)
MIN_BLOCKS = 6
#: integer attributes that number a block within its stack (the KV-cache slot of Hugging Face attention);
#: they may differ between otherwise identical blocks: with ``use_cache=False`` they index nothing, which
#: :func:`check_reduced` checks (a block reading one in its forward is no proven copy of another)
INDEX_ATTRS = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number", "block_idx", "block_index"})
#: kept blocks of a stack of N: the first, two middle ones (the second is the representative) and the last
KEEP = (0, 1, 2, -1)
_PRIMITIVE = (bool, int, float, str, type(None), torch.dtype, torch.device)


@dataclass
class Stack:
    """One stack of repeated blocks: ``path`` of the container, ``names`` of its children in order (``"0"``
    .. ``"79"``), ``kept`` the kept children's names; ``rep`` the representative middle block's name and
    ``elided`` the names carried over from it."""

    path: str
    names: list[str]
    kept: list[str]
    rep: str
    check: str
    elided: list[str]

    def child(self, name: str) -> str:
        """The ``named_modules()`` path of child ``name``."""
        return f"{self.path}.{name}" if self.path else name


@dataclass
class RepeatPlan:
    """The reduced model (``reduced``: shares every kept module with ``full``) and its stacks."""

    full: nn.Module
    reduced: nn.Module
    stacks: list[Stack] = field(default_factory=list)


def _value_key(v: Any) -> Any:
    if isinstance(v, _PRIMITIVE):
        return v
    if isinstance(v, (tuple, list)) and all(isinstance(x, _PRIMITIVE) for x in v):
        return (type(v).__name__, tuple(v))
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype)
    if isinstance(v, torch.Size):
        return tuple(v)
    return ("object", id(v))  # a shared config, a function: identical only when the very same object


def _forward_code(m: nn.Module) -> Any:
    if "forward" in m.__dict__:  # a forward patched on the instance
        return ("instance", id(m.__dict__["forward"]))
    return getattr(type(m).forward, "__code__", type(m).forward)


def block_signature(block: nn.Module, origins: dict) -> Optional[tuple]:
    """A hashable description of ``block`` equal for two blocks exactly when they are the same computation
    up to their parameters' values: per submodule (in ``named_modules`` order) its relative path, class,
    ``forward`` code object, parameters ``(name, shape, dtype, requires_grad)``, buffers ``(name, shape, dtype,
    persistent)``, training flag, hyper-parameters (every plain attribute: eps, normalized_shape, num_groups,
    momentum...; other objects by identity; the block numbers of :data:`INDEX_ATTRS` left out) and the
    construction line from ``origins`` (``{id(module): SourceLocation}``). None when a module has hooks (their
    effect is unknown)."""
    out = []
    for rel, m in block.named_modules(remove_duplicate=False):
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or getattr(m, "_state_dict_hooks", None):
            return None
        params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m._parameters.items()
                       if p is not None)
        buffers = tuple((n, tuple(b.shape), b.dtype, n not in m._non_persistent_buffers_set)
                        for n, b in m._buffers.items() if b is not None)
        attrs = tuple(sorted((k, _value_key(v)) for k, v in m.__dict__.items()
                             if not k.startswith("_") and k != "forward"
                             and not (k in INDEX_ATTRS and isinstance(v, int))))
        loc = origins.get(id(m))
        out.append((rel, type(m), _forward_code(m), params, buffers, m.training, attrs,
                    (loc.file, loc.line) if loc is not None else None))
    return tuple(out)


def _disjoint(blocks: list[nn.Module]) -> bool:
    """No module, parameter or buffer is shared between two of ``blocks`` (tied weights break identity)."""
    seen: set[int] = set()
    for b in blocks:
        ids = {id(m) for m in b.modules()} | {id(t) for t in b.parameters()} | {id(t) for t in b.buffers()}
        if ids & seen:
            return False
        seen |= ids
    return True


def find_stacks(model: nn.Module, origins: dict) -> list[Stack]:
    """The outermost stacks of ``model`` (module docstring, step 1), in ``named_modules`` order."""
    stacks: list[Stack] = []
    for path, mod in model.named_modules():
        if type(mod) not in (nn.ModuleList, nn.Sequential) or len(mod) < MIN_BLOCKS:
            continue
        if any(path == s.path or path.startswith(s.child("")) for s in stacks):
            continue
        if mod._forward_hooks or mod._forward_pre_hooks:
            continue
        names = list(mod._modules)
        blocks = [mod._modules[n] for n in names]
        if any(b is None for b in blocks) or not _disjoint(blocks):
            continue
        sigs = [block_signature(b, origins) for b in blocks[1:]]
        if sigs[0] is None or any(s != sigs[0] for s in sigs[1:]):
            continue
        kept = [names[i] for i in KEEP]
        stacks.append(Stack(path=path, names=names, kept=kept, rep=names[2], check=names[1],
                            elided=names[3:-1]))
    return stacks


class ElidedBlockAccess(LookupError):
    """The model's code indexed a block the reduced stack left out (``layers[i]`` for an elided ``i``)."""


#: what :class:`ElidedBlockAccess` says, so a capture attempt that failed on it can be told apart
ELIDED_MESSAGE = "normaudit: elided block of a reduced stack"


def _reduced_container(container: nn.Module, names: list[str], kept: list[str]) -> nn.Module:
    """A copy of the stack ``container`` holding only the ``kept`` children, under their names. Indexing keeps
    the full stack's numbering: ``stack[i]`` is child ``names[i]`` or raises :class:`ElidedBlockAccess`; a
    slice holds the kept children within it (``layers[:num_hidden_layers]``). Its class is a subclass of the
    container's, named the same."""
    base = type(container)

    def getitem(self, idx):
        if isinstance(idx, slice):
            items = [(n, self._modules[n]) for n in names[idx] if n in self._modules]
            return base(dict(items)) if base is nn.Sequential else base([m for _, m in items])
        i = int(idx) + len(names) if int(idx) < 0 else int(idx)
        if not 0 <= i < len(names) or names[i] not in self._modules:
            raise ElidedBlockAccess(f"{ELIDED_MESSAGE} ({idx})")
        return self._modules[names[i]]

    cls = type(base.__name__, (base,), {"__getitem__": getitem, "__module__": base.__module__,
                                         "__qualname__": base.__qualname__})
    short = _shallow(container)
    short.__class__ = cls
    short._modules = {n: container._modules[n] for n in kept}
    return short


def _shallow(mod: nn.Module) -> nn.Module:
    clone = copy.copy(mod)
    clone._modules = dict(mod._modules)
    return clone


def plan_repeats(model: nn.Module, origins: Optional[dict] = None) -> Optional[RepeatPlan]:
    """The reduced model for ``model`` (module docstring, step 1), or None when no stack is found. ``model``
    is left as it is; the reduced one shares its kept modules (and their tensors) with it."""
    stacks = find_stacks(model, origins or {})
    if not stacks:
        return None
    reduced = _shallow(model)
    for s in stacks:
        parts = s.path.split(".") if s.path else []
        holder = reduced
        for name in parts[:-1]:
            holder._modules[name] = _shallow(holder._modules[name])
            holder = holder._modules[name]
        container = holder._modules[parts[-1]] if parts else holder
        short = _reduced_container(container, s.names, s.kept)
        if parts:
            holder._modules[parts[-1]] = short
        else:
            return None  # the root itself is the stack: nothing above it to keep the order
    return RepeatPlan(full=model, reduced=reduced, stacks=stacks)


def _shapes(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return (tuple(int(s) for s in v.shape), v.dtype)
    if isinstance(v, (tuple, list)):
        return tuple(_shapes(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _shapes(x)) for k, x in v.items()))
    return _value_key(v)


def check_reduced(plan: RepeatPlan, cap: Any, inputs: Any, dtype: torch.dtype) -> bool:
    """Module docstring, step 3, on the captured (fake-tensor) reduced model ``cap.root``. Never raises."""
    from normaudit.capture import fake_inputs

    root = cap.root
    tensor = next(iter(list(root.parameters()) + list(root.buffers())), None)
    mode = getattr(tensor, "fake_mode", None)
    if mode is None or cap.gm is None:
        return False
    calls: list[tuple[str, Any, Any]] = []
    handles = []
    modules = dict(root.named_modules())
    for s in plan.stacks:
        for name in s.kept:
            path = s.child(name)

            def hook(_m, args, kwargs, out, path=path):
                calls.append((path, _shapes((args, kwargs)), _shapes(out)))
            handles.append(modules[path].register_forward_hook(hook, with_kwargs=True))
    try:
        from normaudit.loaders.inputs import _forward_params, forward_kwargs

        args = fake_inputs(inputs, mode, dtype)
        kwargs = dict(args) if isinstance(args, dict) else {}
        args = () if isinstance(args, dict) else tuple(args)
        for key, value in forward_kwargs(_forward_params(root)).items():
            kwargs.setdefault(key, value)
        if getattr(getattr(root, "config", None), "use_cache", None) is not None:
            kwargs.setdefault("use_cache", False)
        from normaudit.capture import _quiet

        with _quiet(), mode, torch.no_grad(), _index_reads(plan, modules) as index_reads:
            root(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any doubt: the full capture
        return False
    finally:
        for h in handles:
            h.remove()
    if index_reads:
        return False  # a block read its number (INDEX_ATTRS): its computation may depend on it
    for s in plan.stacks:
        seen = [c for c in calls if c[0].rpartition(".")[0] == s.path]
        if [c[0] for c in seen] != [s.child(n) for n in s.kept]:
            return False
        middle = [c for c in seen if c[0] != s.child(s.kept[0])]
        if any(c[1] != middle[0][1] for c in middle):
            return False
        for _, ins, out in middle:
            first_in = ins[0][0] if ins[0] else next(iter(ins[1]), (None, None))[1]
            first_out = out[0] if isinstance(out, tuple) and out and isinstance(out[0], tuple) and (
                len(out[0]) == 2 and isinstance(out[0][1], torch.dtype)) else out
            if first_in is None or _shape_only(first_out) != _shape_only(first_in):
                return False
    return True


@contextlib.contextmanager
def _index_reads(plan: RepeatPlan, modules: dict[str, nn.Module]):
    """Record the reads of the block numbers (:data:`INDEX_ATTRS`, left out of :func:`block_signature`) of the
    kept blocks' modules meanwhile: yields the list of ``(path, attribute)`` read. Each such module is given,
    for the time being, a subclass of its class (same name) whose property of that name records the read and
    returns the value; an assignment to it raises."""
    reads: list[tuple[str, str]] = []
    swapped: list[tuple[nn.Module, type]] = []
    classes: dict[tuple[type, tuple[str, ...]], type] = {}
    try:
        for s in plan.stacks:
            for name in s.kept:
                for rel, m in modules[s.child(name)].named_modules(prefix=s.child(name)):
                    attrs = tuple(sorted(k for k, v in m.__dict__.items() if k in INDEX_ATTRS and isinstance(v, int)))
                    if not attrs:
                        continue
                    key = (type(m), attrs)
                    if key not in classes:
                        props = {a: property(lambda self, a=a: _record(self, a, reads)) for a in attrs}
                        classes[key] = type(type(m).__name__, (type(m),), {
                            **props, "__module__": type(m).__module__, "__qualname__": type(m).__qualname__})
                    swapped.append((m, type(m)))
                    m.__dict__["_normaudit_path"] = rel
                    m.__class__ = classes[key]
        yield reads
    finally:
        for m, cls in swapped:
            m.__class__ = cls
            m.__dict__.pop("_normaudit_path", None)


def _record(module: nn.Module, attr: str, reads: list) -> Any:
    reads.append((module.__dict__.get("_normaudit_path"), attr))
    return module.__dict__[attr]


def _shape_only(v: Any) -> Any:
    return v[0] if isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], torch.dtype) else v


class _Elide(Exception):
    """The facts of the reduced capture cannot be carried over: capture the full model."""


def _renamer(old: str, new: str):
    """A function returning a copy of a value (a string, a pydantic model, containers of them) with the module
    path ``old`` renamed ``new`` wherever it is a whole path or a path's prefix (``layers.2.mlp``, not
    ``layers.20``). The copy is as deep as ``copy.deepcopy``: models and containers are rebuilt, other
    mutable leaves deep-copied."""
    pat = re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w])")
    from pydantic import BaseModel

    def rename(v: Any) -> Any:
        if isinstance(v, str):
            return pat.sub(new, v) if old in v else v
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, BaseModel):
            return v.model_copy(update={name: rename(getattr(v, name)) for name in type(v).model_fields})
        if isinstance(v, dict):
            return {rename(k): rename(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(rename(x) for x in v)
        return copy.deepcopy(v)
    return rename


def _under(path: Optional[str], prefix: str) -> bool:
    return path is not None and (path == prefix or path.startswith(prefix + "."))


def _dump(v: Any) -> str:
    return json.dumps(v.model_dump(mode="json"), sort_keys=True)


def _references(text: str, stack: Stack) -> set[str]:
    """The stack's block paths named in ``text`` (a JSON dump)."""
    names = "|".join(re.escape(n) for n in stack.kept)
    prefix = re.escape(stack.child(""))
    return {m.group(0) for m in re.finditer(rf"(?<![\w.]){prefix}(?:{names})(?![\w])", text)}


def _block_path(module: str, stack: Stack) -> Optional[str]:
    return next((stack.child(n) for n in stack.kept if _under(module, stack.child(n))), None)


def _residual_adds_in(cap: Any, prefix: str) -> int:
    from normaudit.vocabulary.graph import owner

    return sum(1 for n in cap.gm.graph.nodes if "residual" in (n.meta.get("normaudit") or {})
               and _under(owner(n, cap.modules), prefix))


def expand_facts(plan: RepeatPlan, cap: Any, facts: Any, config: Optional[dict]) -> Optional[Any]:
    """Carry the facts of the reduced capture ``cap`` (its :class:`normaudit.facts.Facts` ``facts``, changed in
    place) over to the full model (module docstring, step 4). Returns ``facts`` or None when they cannot be
    carried over exactly."""
    try:
        _expand(plan, cap, facts, config)
    except _Elide:
        return None
    return facts


def _expand(plan: RepeatPlan, cap: Any, facts: Any, config: Optional[dict]) -> None:
    from types import SimpleNamespace

    from normaudit.facts import batchnorm as batchnorm_pass
    from normaudit.facts import placement
    from normaudit.facts.sites import SiteRecord

    model = facts.model
    full_modules = full_view(plan, cap)
    majority = False
    for rec in facts.records:
        majority |= rec.site.extra.pop("majority_placement", None) is not None
        rec.site.extra.pop("majority_blocks", None)
    texts = [_dump(r.site) for r in facts.records]
    unused = [_dump(u) for u in model.unused_norms] + list(facts.notes)
    for s in plan.stacks:
        rep, chk = s.child(s.rep), s.child(s.check)
        for rec, text in zip(facts.records, texts):  # a site names only its own block of the stack
            own = _block_path(rec.site.module, s)
            if _references(text, s) - {own}:
                if own is None and _references(text, s) <= {s.child(s.kept[0]), s.child(s.kept[-1])}:
                    continue  # outside the stack naming its first or last block: the same in the full model
                raise _Elide
        if any(_references(u, s) for u in unused):
            raise _Elide
        in_rep = [i for i, r in enumerate(facts.records) if _under(r.site.module, rep)]
        in_chk = [i for i, r in enumerate(facts.records) if _under(r.site.module, chk)]
        to_rep = _renamer(chk, rep)
        if len(in_rep) != len(in_chk) or any(to_rep(texts[a]) != texts[b] for a, b in zip(in_chk, in_rep)):
            raise _Elide  # the two middle blocks differ: not translation invariant
        blocks = {b.path: i for i, b in enumerate(model.blocks)}
        if (rep in blocks) != (chk in blocks) or (
                rep in blocks and to_rep(_dump(model.blocks[blocks[chk]])) != _dump(model.blocks[blocks[rep]])):
            raise _Elide
        adds = _residual_adds_in(cap, rep)
        if adds != _residual_adds_in(cap, chk):
            raise _Elide
        clones, block_clones = [], []
        for name in s.elided:
            new = s.child(name)
            rename = _renamer(rep, new)
            for i in in_rep:
                site = rename(facts.records[i].site)
                clones.append(SiteRecord(site=site, module_obj=full_modules.get(site.module),
                                         hints=dict(facts.records[i].hints)))
            if rep in blocks:
                block_clones.append(rename(model.blocks[blocks[rep]]))
        if in_rep:
            at = in_rep[-1] + 1
            facts.records[at:at] = clones
            texts[at:at] = [""] * len(clones)
        if rep in blocks:
            model.blocks[blocks[rep] + 1:blocks[rep] + 1] = block_clones
        model.num_residual_adds += adds * len(s.elided)
    for rec in facts.records:
        if "stack_blocks" in rec.site.extra:
            rec.site.extra["stack_blocks"] = placement._stack_size(model.blocks, rec.site.block)
    placement._mark_mixed(model.blocks, [SimpleNamespace(rec=r) for r in facts.records])
    if majority != any("majority_placement" in r.site.extra for r in facts.records):
        raise _Elide  # the model's placement (mixed or not) would change
    # as the full capture counts them: the captured (materialised) model's parameters plus the elided blocks'
    model.num_parameters = sum(p.numel() for p in cap.root.parameters()) + sum(
        p.numel() for s in plan.stacks for name in s.elided
        for p in plan.full.get_submodule(s.child(name)).parameters())
    if "groupnorm_config" in model.extra:
        model.extra["groupnorm_config"] = batchnorm_pass.groupnorm_config_facts(
            config or {}, [r.site for r in facts.records])


def _block_nodes(gm: Any, modules: dict, prefix: str) -> int:
    """Nodes of ``gm`` that belong to the block at ``prefix``: operations computed in it and the placeholders
    (export) or attribute reads (symbolic trace) of its parameters and buffers."""
    from normaudit.vocabulary.graph import owner

    # export names a lifted parameter ``p_<path>`` (``p_m_<path>`` under the capture's wrapper), a buffer ``b_``
    lifted = re.compile(rf"^[pbc]_(?:m_)?{re.escape(prefix.replace('.', '_'))}_")
    count = 0
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            count += bool(lifted.match(n.name))
        elif n.op == "get_attr":
            count += _under(str(n.target), prefix)
        elif n.op != "output" and n.meta.get("nn_module_stack") or n.op == "call_module":
            count += _under(owner(n, modules), prefix)
    return count


def full_graph_nodes(plan: RepeatPlan, cap: Any) -> Optional[int]:
    """The node count of the full model's graph: the reduced graph's plus, per stack, the representative
    block's nodes for each elided block; None when the two middle blocks own different counts."""
    total = len(cap.gm.graph.nodes)
    for s in plan.stacks:
        rep = _block_nodes(cap.gm, cap.modules, s.child(s.rep))
        if rep != _block_nodes(cap.gm, cap.modules, s.child(s.check)) or rep == 0:
            return None
        total += rep * len(s.elided)
    return total


def collect_facts_repeated(ctx: Any, plan: RepeatPlan) -> Optional[Any]:
    """:func:`normaudit.facts.collect_facts` for the reduced capture ``ctx.cap`` of ``plan``: the graph passes,
    weights, numerics and usage on the reduced graph, then :func:`expand_facts`, then the eps pass (it compares
    each norm's eps with its peers) over the full model's sites. The size probe runs by default only on graphs
    of at most ``SIZE_PROBE_MAX_NODES`` nodes: the full graph's count decides (:func:`full_graph_nodes`), and a
    model whose full graph is small enough for it is left to the full capture (None). None whenever the
    facts cannot be carried over exactly."""
    from normaudit.facts import Facts, graph_facts
    from normaudit.facts import eps as eps_pass
    from normaudit.facts import numerics as numerics_pass
    from normaudit.facts import usage as usage_pass
    from normaudit.facts import weights as weights_pass
    from normaudit.probes import size
    from normaudit.report import ModelFacts

    cap = ctx.cap
    probes = list((ctx.options or {}).get("probes") or [])
    if cap.gm is None or cap.parts or probes:
        return None
    n_nodes = full_graph_nodes(plan, cap)
    if n_nodes is None or n_nodes <= size.SIZE_PROBE_MAX_NODES:
        return None
    model = ModelFacts(class_name=type(cap.root).__name__)
    records = graph_facts(ctx, model)
    notes = [f"size probe skipped: the graph has {n_nodes} nodes (default limit {size.SIZE_PROBE_MAX_NODES}); "
             f"'--probe size' runs it"] if records else []
    notes += weights_pass.analyse(ctx, records)
    numerics_pass.analyse(ctx, records)
    model.unused_norms = usage_pass.unused_norms(ctx, records)
    notes += [n for n in [usage_pass.unused_note(model.unused_norms)] if n]
    facts = Facts(records=records, model=model, notes=notes)
    if expand_facts(plan, cap, facts, ctx.config) is None:
        return None
    eps_pass.analyse(dataclasses.replace(ctx, cap=dataclasses.replace(cap, modules=full_view(plan, cap))),
                     facts.records)
    return facts


def full_view(plan: RepeatPlan, cap: Any) -> dict[str, nn.Module]:
    """Every ``named_modules()`` path of the full model: the captured module where the reduced capture has
    it (fake tensors), else the full model's own (an elided block's, as the user built it)."""
    full = dict(plan.full.named_modules())
    full.update({n: m for n, m in cap.modules.items() if n in full})
    return full
