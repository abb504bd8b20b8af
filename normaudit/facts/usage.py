"""Norm modules registered but never applied: ``model.unused_norms``.

A port that drops a norm from ``forward`` keeps the module, and its trained weights load without a complaint:
CLIP's ``post_layernorm`` skipped in a re-implementation, nanoGPT's ``ln_f`` left out of ``GPT.forward``. The
model runs; the head reads an un-normalised stream. The captured graph shows which modules' forwards ran:
every node carries the stack of modules it was computed in (``nn_module_stack``; ``call_module`` targets under
symbolic tracing), and a parameter read outside its module's forward is a ``get_attr`` of its path.

A norm module (as :func:`normaudit.facts.sites.walk_modules` finds them: torch.nn norms by class, hand-written
ones by a class name with "norm" and 1-D parameters) is *unused* when

- no graph node was computed in it, no site lies in it and none of its parameters is read, and
- its parent's forward did run: some other module under the same parent was called (a sibling, or the
  parent's own ops). A whole tower the forward never reached (the vision tower of a multimodal model given
  text) is no unused norm: :mod:`normaudit.capture.parts` captures such towers alone and
  ``capture.unaudited`` lists what stays unreached.

Each :class:`normaudit.report.UnusedNorm` names the module path, its class, its ``state_dict`` keys, and with
``--checkpoint`` the checkpoint keys holding its weights (trained weights of a norm the forward skips).

A norm module whose forward returns its input unchanged (an identity class monkeypatched over
``nn.LayerNorm``) also leaves no node, though the forward calls it: :func:`identity_norms` tells it apart by
tracing the module, and its parent with it kept as one call; such modules are reported as computing no norm
(``model.identity_norms``), not as never applied.
"""
from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any, Optional

from normaudit.capture.parts import coverage
from normaudit.facts.context import FactContext, Facts
from normaudit.report import UnusedNorm
from normaudit.vocabulary.graph import module_stack


__all__ = ["called_modules", "unused_norms", "identity_norms", "identity_notes"]


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _ancestors(path: str) -> list[str]:
    """``a.b.c`` -> ``["", "a", "a.b", "a.b.c"]``."""
    parts = path.split(".") if path else []
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def called_modules(gm: Any, modules: dict) -> set[str]:
    """Paths of every module whose forward produced a node of ``gm`` (and their ancestors), plus the modules
    whose parameters or buffers the graph reads directly (``get_attr``)."""
    called: set[str] = {""}
    for node in gm.graph.nodes:
        paths = module_stack(node, modules)
        if node.op == "get_attr":
            paths = paths + [str(node.target).rpartition(".")[0]]
        for p in paths:
            called.update(_ancestors(p))
    return called


def _checkpoint_keys(ckpt: Any, root: Any, keys: list[str]) -> list[str]:
    """The checkpoint keys the model keys ``keys`` map to (prefixes aligned as the weight pass does)."""
    if ckpt is None or not keys:
        return []
    mapping, _ = ckpt.align_keys(list(root.state_dict().keys()))
    return [mapping[k] for k in keys if k in mapping]


def unused_norms(ctx: Any, records: list) -> list[UnusedNorm]:
    """The norm modules of ``ctx.cap`` registered but never applied by the captured forward (module doc).
    Empty without a whole-model graph. ``records``: the sites found (their modules count as used)."""
    from normaudit.facts.sites import walk_modules

    cap = ctx.cap
    if cap.gm is None:
        return []
    modules = cap.modules
    called = called_modules(cap.gm, modules)
    called |= {a for r in records for a in _ancestors(r.site.module)}
    parts = [p.path for p in getattr(cap, "parts", None) or []]
    out: list[UnusedNorm] = []
    for rec in walk_modules(modules, ctx.origins):
        path = rec.site.module
        # ``called`` holds the ancestors of every called path: a module absent from it ran nothing, and
        # its parent present in it ran something else
        if not path or path in called or any(_under(path, p) for p in parts):
            continue
        if path.rpartition(".")[0] not in called:
            continue  # the parent never ran: an unreached tower, not a skipped norm
        mod = rec.module_obj
        keys = [f"{path}.{k}" for k in (mod.state_dict().keys() if mod is not None else [])]
        out.append(UnusedNorm(module=path, class_name=rec.site.class_name, kind=rec.site.kind, keys=keys,
                              checkpoint_keys=_checkpoint_keys(getattr(ctx, "checkpoint", None), cap.root, keys),
                              source=rec.site.definition))
    return out


def returns_input(mod: Any) -> bool:
    """True when ``mod``'s forward, traced symbolically on its own (``torch.fx``: proxies, no numbers), returns
    its first input unchanged: a norm class replaced by an identity (``nn.LayerNorm = Identity`` in a test
    helper or a "no norm" switch) leaves no node in any graph, so it looks never called. False where the
    trace fails (the forward is not symbolically traceable)."""
    from torch import fx

    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = fx.Tracer().trace(mod)
    except Exception:  # noqa: BLE001 - user code under tracing may raise anything
        return False
    out = next((n for n in graph.nodes if n.op == "output"), None)
    result = out.args[0] if out is not None and out.args else None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    return bool(placeholders) and result is placeholders[0]


def called_by(parent: Any, child: Any) -> Optional[bool]:
    """Whether ``parent``'s forward calls its submodule ``child``: ``parent`` traced symbolically with ``child``
    kept as one call (a leaf); None where the trace fails."""
    from torch import fx

    class _ChildLeaf(fx.Tracer):
        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return m is child or super().is_leaf_module(m, qualname)

    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = _ChildLeaf().trace(parent)
    except Exception:  # noqa: BLE001 - user code under tracing may raise anything
        return None
    return any(n.op == "call_module" and parent.get_submodule(str(n.target)) is child for n in graph.nodes)


def identity_norms(modules: dict, paths: list[str]) -> tuple[list[str], list[str]]:
    """Of the norm modules at ``paths`` (in ``modules``, ``named_modules()`` of the model) that no graph shows
    computing anything, those whose forward returns its input unchanged (:func:`returns_input`): (the ones
    their parent's forward calls, the ones where the parent cannot be traced to tell). Those the parent
    never calls stay unused norms."""
    called, unknown = [], []
    for path in dict.fromkeys(paths):
        mod, parent = modules.get(path), modules.get(path.rpartition(".")[0])
        if mod is None or parent is None or not returns_input(mod):
            continue
        calls = called_by(parent, mod)
        if calls is None:
            unknown.append(path)
        elif calls:
            called.append(path)
    return called, unknown


def identity_notes(called: list[str], unknown: list[str], modules: dict) -> list[str]:
    """Report notes naming the norm modules that compute no norm (:func:`identity_norms`)."""
    notes = []
    for paths, what in ((called, "called by the forward but compute no norm"), (unknown, "compute no norm")):
        if not paths:
            continue
        classes = ", ".join(dict.fromkeys(type(modules[p]).__name__ for p in paths))
        names = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
        notes.append(f"{len(paths)} norm module(s) {what}: the forward of their class ({classes}) returns its "
                     f"input unchanged, so nothing is normalised (a norm class replaced by an identity, as when "
                     f"one is monkeypatched over nn.LayerNorm): {names}")
    return notes


def unused_note(unused: list[UnusedNorm]) -> Optional[str]:
    """One report note naming the unused norm modules, or None."""
    if not unused:
        return None
    names = ", ".join(u.module for u in unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
    return f"{len(unused)} norm module(s) registered but never applied by the forward: {names}"


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``usage``: the model's unused norms (:func:`unused_norms`) and the note naming them."""
    facts.model.unused_norms = unused_norms(ctx, facts.records)
    facts.notes += [n for n in [unused_note(facts.model.unused_norms)] if n]


def run_identity(ctx: FactContext, facts: Facts) -> None:
    """Pass ``identity-norms``: the norm modules no graph shows computing anything (unused, or unaudited by
    :func:`normaudit.capture.parts.coverage`) whose forward returns its input unchanged (:func:`identity_norms`)
    go to ``model.identity_norms`` instead of ``model.unused_norms``, and the notes say they compute no norm
    (the parent's forward calls them)."""
    unaudited = [u.module for u in coverage(ctx.cap, [r.site for r in facts.records])[1]]
    unused = [u.module for u in facts.model.unused_norms]
    if not unused and not unaudited:
        return
    modules = ctx.cap.modules
    called, unknown = identity_norms(modules, unused + unaudited)
    if not called and not unknown:
        return
    found = set(called) | set(unknown)
    before = unused_note(facts.model.unused_norms)
    facts.model.identity_norms = [p for p in modules if p in found]
    facts.model.unused_norms = [u for u in facts.model.unused_norms if u.module not in found]
    after = unused_note(facts.model.unused_norms)
    facts.notes = [n for n in facts.notes if n != before] + ([after] if after else [])
    facts.notes += identity_notes(called, unknown, modules)
