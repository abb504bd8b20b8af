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
4. The fact pipeline (:mod:`normaudit.pipeline.carry`) proves the facts of the reduced capture
   translation-invariant and carries them to the elided blocks, or the caller captures the full model (never
   a guess). :func:`full_graph_nodes` and :func:`full_view` give it the full model's node count and modules.
"""
from __future__ import annotations

import contextlib
import copy
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from normaudit.capture.fake import fake_inputs
from normaudit.loaders.inputs import forward_kwargs, forward_params
from normaudit.quiet import quiet
from normaudit.vocabulary.graph import owner

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
        args = fake_inputs(inputs, mode, dtype)
        kwargs = dict(args) if isinstance(args, dict) else {}
        args = () if isinstance(args, dict) else tuple(args)
        for key, value in forward_kwargs(forward_params(root)).items():
            kwargs.setdefault(key, value)
        if getattr(getattr(root, "config", None), "use_cache", None) is not None:
            kwargs.setdefault("use_cache", False)

        with quiet(stderr=True), mode, torch.no_grad(), _index_reads(plan, modules) as index_reads:
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


def _under(path: Optional[str], prefix: str) -> bool:
    return path is not None and (path == prefix or path.startswith(prefix + "."))


def _block_nodes(gm: Any, modules: dict, prefix: str) -> int:
    """Nodes of ``gm`` that belong to the block at ``prefix``: operations computed in it and the placeholders
    (export) or attribute reads (symbolic trace) of its parameters and buffers."""

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


def full_view(plan: RepeatPlan, cap: Any) -> dict[str, nn.Module]:
    """Every ``named_modules()`` path of the full model: the captured module where the reduced capture has
    it (fake tensors), else the full model's own (an elided block's, as the user built it)."""
    full = dict(plan.full.named_modules())
    full.update({n: m for n, m in cap.modules.items() if n in full})
    return full
