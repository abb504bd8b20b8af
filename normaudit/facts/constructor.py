"""Read the source of the call that constructed a norm module: which configuration key it passes as eps.

``self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)`` passes the key ``rms_norm_eps``; a
module built so and holding another eps was changed after construction (:mod:`normaudit.facts.eps`). The
call is found from the construction line recorded for the module (``site.definition``, the statement
around it parsed with :mod:`ast`), else from the ``__init__`` of the module's parent class (the assignment
``self.<attribute> = ...``), which also covers library models built without recorded lines. Everything here
degrades to None: a file that is gone, unparsable source, a builtin class, an eps that is a computed value
or a plain name, several candidate calls that disagree.

    >>> import ast
    >>> eps_argument(ast.parse("RMSNorm(d, eps=config.rms_norm_eps)").body[0].value)
    ('rms_norm_eps', 'config.rms_norm_eps')
    >>> eps_argument(ast.parse("nn.LayerNorm(d, cfg['layer_norm_eps'])").body[0].value)
    ('layer_norm_eps', "cfg['layer_norm_eps']")
    >>> eps_argument(ast.parse("RMSNorm(d, eps=self.eps)").body[0].value) is None
    True
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Optional

__all__ = ["eps_argument", "constructor_eps"]

_EPS_NAME = re.compile(r"(?:^|_)(?:eps|epsilon)(?:$|_)", re.IGNORECASE)
_MAX_SOURCE_BYTES = 4_000_000


def _key_of(expr: ast.expr) -> Optional[str]:
    """The configuration key an expression reads: ``cfg.k``, ``cfg["k"]``, ``getattr(cfg, "k", d)``,
    ``cfg.get("k", d)`` with an eps-like ``k``; None for anything else (``self.eps``, a local name, arithmetic)."""
    key = None
    if isinstance(expr, ast.Attribute):
        if not (isinstance(expr.value, ast.Name) and expr.value.id in ("self", "cls")):
            key = expr.attr
    elif isinstance(expr, ast.Subscript):
        sl = expr.slice
        if isinstance(sl, ast.Constant) and isinstance(sl.value, str):
            key = sl.value
    elif isinstance(expr, ast.Call) and expr.args:
        func = expr.func
        if isinstance(func, ast.Name) and func.id == "getattr" and len(expr.args) >= 2:
            arg = expr.args[1]
        elif isinstance(func, ast.Attribute) and func.attr == "get":
            arg = expr.args[0]
        else:
            return None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            key = arg.value
    return key if key is not None and _EPS_NAME.search(key) else None


def eps_argument(call: ast.Call, source: Optional[str] = None) -> Optional[tuple[str, str]]:
    """(config key, source text) of the eps a constructor call passes: the keyword argument named like eps
    (``eps``, ``epsilon``, ``layer_norm_eps``...), else a positional argument reading an eps key. None when
    there is none, or when the argument is not a plain config read. ``source``: the text ``call`` was parsed
    from, to quote the argument as written."""
    exprs = [kw.value for kw in call.keywords if kw.arg and _EPS_NAME.search(kw.arg)]
    if not exprs:
        exprs = [a for a in call.args if _key_of(a) is not None]
    found = set()
    for e in exprs:
        key = _key_of(e)
        if key is None:
            return None
        text = (ast.get_source_segment(source, e) if source else None) or ast.unparse(e)
        found.add((key, " ".join(text.split())))
    return next(iter(found)) if len(found) == 1 else None


def _call_name(call: ast.Call) -> Optional[str]:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


@functools.lru_cache(maxsize=64)
def _parse_file(file: str, mtime: float) -> Optional[tuple[ast.Module, str]]:
    del mtime  # part of the cache key only
    try:
        path = Path(file)
        if not path.is_file() or path.stat().st_size > _MAX_SOURCE_BYTES:
            return None
        text = path.read_text(encoding="utf-8", errors="replace")
        return ast.parse(text), text
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _statement_at(tree: ast.Module, line: int) -> Optional[ast.stmt]:
    """The innermost simple statement spanning ``line``."""
    best: Optional[ast.stmt] = None
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not hasattr(node, "body") and node.lineno <= line <= (node.end_lineno or 0):
            if best is None or (node.end_lineno - node.lineno) < (best.end_lineno - best.lineno):
                best = node
    return best


def _assigned_call(stmt: ast.stmt, attr: Optional[str]) -> Optional[ast.Call]:
    """The call assigned to ``self.<attr>`` (``self.norm = norm_cls(d, **kw)``) by ``stmt``, if any."""
    if attr is None or not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or not isinstance(stmt.value, ast.Call):
        return None
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    for t in targets:
        if isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self":
            return stmt.value
    return None


def _from_statements(stmts: list[ast.stmt], class_name: str, attr: Optional[str], line: Optional[int],
                     source: str) -> tuple[bool, Optional[tuple[str, str]]]:
    """(a constructor call was found, the eps key it passes) among ``stmts``: calls named ``class_name``
    (spanning ``line`` when given), else the call assigned to ``self.<attr>``. Calls that disagree: not found."""
    calls = [n for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call) and _call_name(n) == class_name]
    if line is not None and len(calls) > 1:
        spanning = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)]
        calls = spanning or calls
    if not calls:
        calls = [c for c in (_assigned_call(s, attr) for s in stmts) if c is not None]
    if not calls:
        return False, None
    keys = {eps_argument(c, source) for c in calls}
    return True, (keys.pop() if len(keys) == 1 else None)


@functools.lru_cache(maxsize=1024)
def _at_line(file: str, mtime: float, line: int, class_name: str,
             attr: Optional[str]) -> tuple[bool, Optional[tuple[str, str]]]:
    """:func:`_from_statements` over the statement at ``file:line`` (cached: blocks share their lines)."""
    parsed = _parse_file(file, mtime)
    stmt = _statement_at(parsed[0], line) if parsed is not None else None
    if stmt is None:
        return False, None
    return _from_statements([stmt], class_name, attr, line, parsed[1])


@functools.lru_cache(maxsize=256)
def _init_statements(parent_cls: type, attr: str) -> Optional[tuple[tuple[ast.stmt, ...], str]]:
    """The statements of ``parent_cls.__init__`` (or a base's) that assign ``self.<attr>``, and its source."""
    for cls in inspect.getmro(parent_cls):
        init = cls.__dict__.get("__init__")
        if init is None or cls.__module__.split(".")[0] == "torch":
            continue
        try:
            text = textwrap.dedent(inspect.getsource(init))
            tree = ast.parse(text)
        except (OSError, TypeError, SyntaxError, ValueError, IndentationError, RecursionError):
            continue
        found = tuple(s for s in ast.walk(tree) if _assigned_call(s, attr) is not None
                      or (isinstance(s, (ast.Assign, ast.AnnAssign)) and _assigns_attr(s, attr)))
        if found:
            return found, text
    return None


def _assigns_attr(stmt: ast.stmt, attr: str) -> bool:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return any(isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
               and t.value.id == "self" for t in targets)


def constructor_eps(definition: Any, module: Any, parent: Any, attr: Optional[str]) -> Optional[tuple[str, str]]:
    """(config key, source text) the constructor call of ``module`` passes as eps, or None.

    ``definition``: the recorded construction line (a :class:`normaudit.report.SourceLocation` or None);
    ``parent``/``attr``: the module holding ``module`` and its attribute name there (for the ``__init__``
    fallback). Never raises.
    """
    class_name = type(module).__name__
    try:
        if definition is not None and definition.line:
            file = str(definition.file)
            try:
                mtime = Path(file).stat().st_mtime
            except OSError:
                mtime = 0.0
            found, key = _at_line(file, mtime, int(definition.line), class_name, attr)
            if found:
                return key
        if parent is not None and attr and not attr.isdigit():
            init = _init_statements(type(parent), attr)
            if init:
                return _from_statements(list(init[0]), class_name, attr, None, init[1])[1]
    except (RecursionError, MemoryError, ValueError, TypeError, AttributeError):
        return None
    return None
