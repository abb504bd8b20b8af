"""A norm whose eps is written as a literal where its constructor's eps parameter reaches the others:
``site.eps_facts.param_eps``.

Llama ports write ``Transformer.__init__(self, d, n_layers, norm_eps)`` with
``self.layers = ModuleList(Block(d, norm_eps) for ...)`` and ``self.norm = nn.RMSNorm(d, eps=1e-5)``: the
parameter meant for every norm of the model reaches the block norms and not the final one, which keeps the
literal. The peer comparison (NE102) cannot see it, since the final norm is a role of its own; the
constructor's source can. For a site whose module is ``parent.attr``:

- the call building it (in ``type(parent).__init__`` or a method it calls, as
  :func:`normaudit.facts.constructor.constructor_literal_eps` finds it) writes eps as a number;
- that ``__init__`` has a parameter named like eps (``eps``, ``norm_eps``, ``layer_norm_eps``...) that it passes,
  as a plain name, to another call assigned to ``self.<other>``;
- the norms of the same kind under those ``self.<other>`` modules agree on one eps (``value``), which differs
  from the literal.

Where the literal equals what the parameter gives the others, nothing is recorded (the eps is right, however
written); a library whose final norm takes its eps from a config is no literal. Everything degrades to None
(source not found, unparsable, a parameter passed inside an expression).
"""
from __future__ import annotations

import ast
import functools
import inspect
from collections import Counter
from typing import Any, Mapping, Optional

from normaudit.facts.constructor import _EPS_NAME, _init_and_helpers, constructor_literal_eps
from normaudit.facts.context import FactContext, Facts
from normaudit.report import ParamEps

__all__ = ["eps_parameter_targets", "param_eps", "run"]


def _passes(call: ast.Call, name: str) -> bool:
    return any(isinstance(a, ast.Name) and a.id == name for a in call.args) or \
        any(isinstance(k.value, ast.Name) and k.value.id == name for k in call.keywords)


def _self_targets(stmt: ast.stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return [t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"]


@functools.lru_cache(maxsize=256)
def eps_parameter_targets(cls: type) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """For ``cls.__init__`` (the first in the MRO outside torch): each eps-like parameter and the ``self``
    attributes assigned a value holding a call that passes it by name (``self.layers = ModuleList([Block(d,
    norm_eps) ...])``: ``("norm_eps", ("layers",))``). Empty when the source cannot be read."""
    for klass in inspect.getmro(cls):
        init = klass.__dict__.get("__init__")
        if init is None or klass.__module__.split(".")[0] == "torch":
            continue
        sources = _init_and_helpers(klass, init)
        if not sources:
            return ()
        fn = next((n for n in ast.walk(sources[0][1]) if isinstance(n, ast.FunctionDef)), None)
        if fn is None:
            return ()
        params = [a.arg for a in fn.args.args + fn.args.kwonlyargs if _EPS_NAME.search(a.arg)]
        out = []
        for p in params:
            attrs = [attr for _, tree in sources for stmt in ast.walk(tree)
                     if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None
                     and any(isinstance(c, ast.Call) and _passes(c, p) for c in ast.walk(stmt.value))
                     for attr in _self_targets(stmt)]
            if attrs:
                out.append((p, tuple(dict.fromkeys(attrs))))
        return tuple(out)
    return ()


def param_eps(site: Any, modules: Mapping[str, Any], sites: list) -> Optional[ParamEps]:
    """The ``site``'s :class:`ParamEps` (module docstring), or None; ``modules`` every module by path, ``sites``
    every site of the model (their ``eps_facts.effective`` give the value the parameter passes on)."""
    if not site.module or site.detected_by not in ("module", "pattern") or site.eps_facts is None:
        return None
    head, _, attr = site.module.rpartition(".")
    parent, module = modules.get(head), modules.get(site.module)
    if parent is None or module is None or attr.isdigit():
        return None
    literal = constructor_literal_eps(site.definition, module, parent, attr)
    if literal is None:
        return None
    for param, attrs in eps_parameter_targets(type(parent)):
        targets = [f"{head}.{a}" if head else a for a in attrs if a != attr]
        values = Counter(s.eps_facts.effective for s in sites if s.kind == site.kind and s.eps_facts is not None
                         and s.eps_facts.effective is not None
                         and any(s.module.startswith(t + ".") or s.module == t for t in targets))
        if len(values) != 1:
            continue  # no norm reached, or they disagree: nothing one value says
        value = next(iter(values))
        if abs(value - literal) > 1e-6 * max(abs(value), abs(literal)):
            return ParamEps(param=param, owner=type(parent).__name__, passed_to=targets, value=value,
                            literal=literal, norms=sum(values.values()))
    return None


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``eps-parameter``: ``site.eps_facts.param_eps`` of every site (:func:`param_eps`)."""
    sites = [r.site for r in facts.records]
    for s in sites:
        if s.eps_facts is not None:
            s.eps_facts.param_eps = param_eps(s, ctx.cap.modules, sites)
