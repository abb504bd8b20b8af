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
from typing import Any, Callable, Optional

__all__ = ["eps_argument", "literal_eps_argument", "constructor_eps", "constructor_literal_eps", "builds_elsewhere"]

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


def literal_eps_argument(call: ast.Call, source: Optional[str] = None) -> Optional[float]:
    """The number a constructor call writes as its eps keyword (``GroupNorm(32, c, eps=1e-6)``: ``1e-06``), or
    None when the eps keyword is absent or not a number literal. ``source`` is unused (the signature of
    :func:`eps_argument`, so both are extractors of :func:`_from_statements`).

        >>> literal_eps_argument(ast.parse("nn.GroupNorm(32, c, eps=1e-6)").body[0].value)
        1e-06
        >>> literal_eps_argument(ast.parse("nn.LayerNorm(d, eps=config.layer_norm_eps)").body[0].value) is None
        True
    """
    del source
    values = {kw.value.value for kw in call.keywords if kw.arg and _EPS_NAME.search(kw.arg)
              and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, (int, float))
              and not isinstance(kw.value.value, bool)}
    return float(values.pop()) if len(values) == 1 else None


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
                     source: str, extract: Callable[..., Any] = eps_argument) -> tuple[bool, Any]:
    """(a constructor call was found, what ``extract`` reads from it: by default the eps key it passes) among
    ``stmts``: calls named ``class_name`` (spanning ``line`` when given), else the call assigned to
    ``self.<attr>``. Calls that disagree: found, None."""
    calls = [n for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call) and _call_name(n) == class_name]
    if line is not None and len(calls) > 1:
        spanning = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)]
        calls = spanning or calls
    if not calls:
        calls = [c for c in (_assigned_call(s, attr) for s in stmts) if c is not None]
    if not calls:
        return False, None
    keys = {extract(c, source) for c in calls}
    return True, (keys.pop() if len(keys) == 1 else None)


@functools.lru_cache(maxsize=1024)
def _at_line(file: str, mtime: float, line: int, class_name: str, attr: Optional[str],
             extract: Callable[..., Any] = eps_argument) -> tuple[bool, Any]:
    """:func:`_from_statements` over the statement at ``file:line`` (cached: blocks share their lines)."""
    parsed = _parse_file(file, mtime)
    stmt = _statement_at(parsed[0], line) if parsed is not None else None
    if stmt is None:
        return False, None
    return _from_statements([stmt], class_name, attr, line, parsed[1], extract)


@functools.lru_cache(maxsize=256)
def _init_statements(parent_cls: type, attr: str) -> Optional[tuple[tuple[ast.stmt, ...], str]]:
    """The statements of ``parent_cls.__init__`` (or a base's), and of the methods it calls on ``self``
    (diffusers' ``Transformer2DModel.__init__`` builds its norm in ``self._init_continuous_input(...)``), that
    assign ``self.<attr>``, with their source."""
    for cls in inspect.getmro(parent_cls):
        init = cls.__dict__.get("__init__")
        if init is None or cls.__module__.split(".")[0] == "torch":
            continue
        for text, tree in _init_and_helpers(cls, init):
            found = tuple(s for s in ast.walk(tree) if _assigned_call(s, attr) is not None
                          or (isinstance(s, (ast.Assign, ast.AnnAssign)) and _assigns_attr(s, attr)))
            if found:
                return found, text
    return None


def _parsed_source(fn: Any) -> Optional[tuple[str, ast.Module]]:
    try:
        text = textwrap.dedent(inspect.getsource(fn))
        return text, ast.parse(text)
    except (OSError, TypeError, SyntaxError, ValueError, IndentationError, RecursionError):
        return None


def _init_and_helpers(cls: type, init: Any) -> list[tuple[str, ast.Module]]:
    """``(source, tree)`` of ``init``, then of each method of ``cls`` it calls as ``self.<name>(...)``."""
    first = _parsed_source(init)
    if first is None:
        return []
    out = [first]
    called = {n.func.attr for n in ast.walk(first[1]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"}
    for name in sorted(called):
        method = getattr(cls, name, None)
        if inspect.isfunction(method) and name != "__init__":
            parsed = _parsed_source(method)
            if parsed is not None:
                out.append(parsed)
    return out


def _assigns_attr(stmt: ast.stmt, attr: str) -> bool:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return any(isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
               and t.value.id == "self" for t in targets)


def constructor_eps(definition: Any, module: Any, parent: Any, attr: Optional[str],
                    extract: Callable[..., Any] = eps_argument) -> Optional[tuple[str, str]]:
    """(config key, source text) the constructor call of ``module`` passes as eps, or None.

    ``definition``: the recorded construction line (a :class:`normaudit.report.SourceLocation` or None);
    ``parent``/``attr``: the module holding ``module`` and its attribute name there (for the ``__init__``
    fallback); ``extract``: what to read from the call (:func:`eps_argument`). Never raises.
    """
    class_name = type(module).__name__
    try:
        if definition is not None and definition.line:
            file = str(definition.file)
            try:
                mtime = Path(file).stat().st_mtime
            except OSError:
                mtime = 0.0
            found, key = _at_line(file, mtime, int(definition.line), class_name, attr, extract)
            if found:
                return key
        if parent is not None and attr and not attr.isdigit():
            init = _init_statements(type(parent), attr)
            if init:
                return _from_statements(list(init[0]), class_name, attr, None, init[1], extract)[1]
    except (RecursionError, MemoryError, ValueError, TypeError, AttributeError):
        return None
    return None


def constructor_literal_eps(definition: Any, module: Any, parent: Any, attr: Optional[str]) -> Optional[float]:
    """The number the constructor call of ``module`` writes as its eps (``nn.GroupNorm(32, c, eps=1e-6)`` in
    diffusers' ``Transformer2DModel``), found as :func:`constructor_eps` finds the call; None when it passes a
    config key, a computed value or nothing, or the call is not found. Never raises."""
    return constructor_eps(definition, module, parent, attr, extract=literal_eps_argument)


def builds_elsewhere(definition: Any, class_name: str, attr: Optional[str]) -> bool:
    """Whether the recorded construction line of a ``class_name`` module is a line that builds something else:
    it parses, and its statement holds no call named ``class_name`` nor a call assigned to ``self.<attr>``.
    The line recorded for a norm built inside a library is the user's line that built the whole model
    (``return DiTTransformer2DModel(...)`` in a factory), shared by every module of the model, so it says
    nothing about the norm's role. False when the line holds such a call or cannot be read. Never raises."""
    try:
        if definition is None or not definition.line:
            return False
        file = str(definition.file)
        parsed = _parse_file(file, Path(file).stat().st_mtime)
        stmt = _statement_at(parsed[0], int(definition.line)) if parsed is not None else None
        if stmt is None:
            return False
        return not _from_statements([stmt], class_name, attr, int(definition.line), parsed[1])[0]
    except (OSError, RecursionError, MemoryError, ValueError, TypeError, AttributeError):
        return False
