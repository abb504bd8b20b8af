"""Evaluate declarative rules over facts with simpleeval (expressions compiled once per rule).

Names a rule expression can read:

- ``site``: the :class:`normaudit.report.Site` (scope ``site``), e.g. ``site.eps``, ``site.normalized_axes``;
- ``model``: :class:`normaudit.report.ModelFacts`; ``sites``: every site (scope ``model``);
- ``config``: the merged configuration mapping (``--config``, checkpoint config, the model's own config);
  ``config_source``: where it came from;
- ``options``: the run (:class:`normaudit.engine.options.RuleOptions`: ``dtype``, ``batch_size`` the
  micro-batch, ``checkpoint``, ``library_model``, ``capture_method``, ``numerics``, ...);
- ``params``: the rule's own ``params``; names defined in the rule's ``let`` (evaluated in order);
- ``each``: for a model-scope rule with ``for_each``, the element of that list the rule is evaluated for;
- functions: ``isclose``, ``first_key``, ``lookup``, ``join``, ``fp_rounds_to_zero``, ``finfo_eps``, ``any``, ``all``,
  ``len``, ``min``, ``max``, ``abs``, ``sorted``, ``set``, ``str``, ``float``, ``int``.

A site-scope rule is evaluated once per class of sites that agree on every site fact its expressions read
(:func:`site_reads`; the identical blocks of a deep stack differ only in paths most rules never read), and its
message and fix are filled for each site of the class (:func:`evaluate`).
"""
from __future__ import annotations

import _string  # the field-name parser str.format and string.Formatter use
import ast
import math
import string
import types
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from pydantic import BaseModel
from simpleeval import EvalWithCompoundTypes

from normaudit.engine.options import RuleOptions
from normaudit.engine.schema import Rule
from normaudit.errors import UsageError
from normaudit.report import Finding, ModelFacts, Site, SEVERITY_RANK
from normaudit.vocabulary.dtypes import AUDIT_DTYPES, DTYPES

def first_key(mapping: Any, keys: Iterable[str]) -> Optional[tuple[str, Any]]:
    """The first of ``keys`` present in ``mapping`` (searching nested dicts too) as ``(key, value)``."""
    if not isinstance(mapping, dict):
        return None
    for key in keys:
        if key in mapping and mapping[key] is not None:
            return key, mapping[key]
    for sub in mapping.values():
        if isinstance(sub, dict):
            found = first_key(sub, keys)
            if found is not None:
                return found
    return None


def lookup(mapping: Any, key: str, default: Any = None) -> Any:
    """``mapping[key]`` for a dict, the field ``key`` of a typed record (``options``, a fact), else
    ``default``."""
    if isinstance(mapping, dict):
        return mapping.get(key, default)
    if isinstance(mapping, BaseModel):
        return getattr(mapping, key, default)
    return default


def fp_rounds_to_zero(value: Optional[float], dtype: str) -> bool:
    """True when ``value`` (> 0) rounds to 0 when stored in ``dtype`` (IEEE 754 round-to-nearest:
    below half the smallest subnormal, 2**-25 for float16, 2**-134 for bfloat16)."""
    if value is None or value <= 0 or dtype not in AUDIT_DTYPES:
        return False
    return value < DTYPES[dtype].smallest_subnormal / 2


def finfo_eps(dtype: str) -> float:
    """Machine epsilon of a floating dtype name (``torch.finfo(dtype).eps``)."""
    return DTYPES[dtype if dtype in AUDIT_DTYPES else "float32"].eps


FUNCTIONS = {
    "isclose": lambda a, b, rel_tol=1e-6: a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=rel_tol),
    "first_key": first_key, "lookup": lookup, "fp_rounds_to_zero": fp_rounds_to_zero, "finfo_eps": finfo_eps,
    "any": any, "all": all, "len": len, "min": min, "max": max, "abs": abs, "sorted": sorted, "set": set,
    "str": str, "float": float, "int": int, "bool": bool, "list": list,
    "join": lambda items, sep=", ": sep.join(str(i) for i in (items or [])),
}


@dataclass
class CompiledRule:
    """A rule with its expressions parsed once (``parsed``: field -> AST) and ``reads``, the site facts they
    read (:func:`site_reads`)."""

    rule: Rule
    parsed: dict[str, Any]
    reads: tuple = ()


_COMPILED: dict[int, CompiledRule] = {}


def _evaluator(names: dict[str, Any]) -> EvalWithCompoundTypes:
    ev = EvalWithCompoundTypes(names=names, functions=FUNCTIONS)
    return ev


#: names every rule's message and fix templates may use besides the rule's own ``let`` names
TEMPLATE_NAMES = ("site", "model", "sites", "config", "config_source", "options", "params")
_NO_ATTRIBUTES = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                  types.CodeType, types.FrameType, types.TracebackType, types.GeneratorType)


class TemplateError(ValueError):
    """A message/fix template field that reaches outside the rule's own namespace."""


def _template_step(obj: Any, is_attr: bool, key: Any, field: str) -> Any:
    """One ``.attr`` or ``[key]`` of a template field, refusing what could walk out of the facts: a name
    starting with ``_`` (``__class__``, ``__globals__``), or any attribute of a module, class, function or
    other callable (``{config.get}`` is still shown, ``{config.get.x}`` is not)."""
    if isinstance(key, str) and key.startswith("_"):
        raise TemplateError(f"{{{field}}}: names starting with '_' are not available in templates")
    if not is_attr:
        return obj[key]
    if isinstance(obj, _NO_ATTRIBUTES) or callable(obj):
        raise TemplateError(f"{{{field}}}: no attributes of {type(obj).__name__} objects in templates")
    return getattr(obj, key)


class TemplateFormatter(string.Formatter):
    """``str.format`` for rule templates, reaching only the rule's own namespace.

    A field is a name of the namespace given as keyword arguments, then ``.attr``/``[key]`` steps checked by
    :func:`_template_step`: so a user's rule file cannot print ``os.environ`` through
    ``{site.__class__.__init__.__globals__}``. Positional fields (``{0}``, ``{}``) are refused. Raises
    TemplateError (a ValueError) for a refused field, KeyError for an unknown name.
    """

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:  # noqa: D102
        first, rest = _string.formatter_field_name_split(field_name)
        if not isinstance(first, str) or not first:
            raise TemplateError(f"{{{field_name}}}: positional fields are not available in templates; name a value")
        if first.startswith("_"):
            raise TemplateError(f"{{{field_name}}}: names starting with '_' are not available in templates")
        obj = kwargs[first]
        for is_attr, key in rest:
            obj = _template_step(obj, is_attr, key, field_name)
        return obj, first


_FORMATTER = TemplateFormatter()


def template_fields(template: str) -> list[str]:
    """Every field name of a format template, nested ones in format specs included (``{a:{b}}``: a, b).
    Raises ValueError for a malformed template (an unmatched brace)."""
    out: list[str] = []
    for _, field, spec, _ in _FORMATTER.parse(template):
        if field is not None:
            out.append(field)
        if spec:
            out.extend(template_fields(spec))
    return out


def check_template(template: str, names: Iterable[str]) -> Optional[str]:
    """Why ``template`` is refused (None when it is fine): a malformed template, a positional field, a
    field whose first name is not in ``names`` (the rule's namespace), or a step through a name starting
    with ``_``."""
    allowed = set(names)
    try:
        fields = template_fields(template)
        for field in fields:
            first, rest = _string.formatter_field_name_split(field)
            if not isinstance(first, str) or not first:
                return f"{{{field}}}: positional fields are not available in templates; name a value"
            if first not in allowed:
                return f"{{{field}}}: unknown name {first!r} (templates read {', '.join(sorted(allowed))})"
            for _, key in [(False, first), *rest]:
                if isinstance(key, str) and key.startswith("_"):
                    return f"{{{field}}}: names starting with '_' are not available in templates"
    except ValueError as err:
        return f"malformed template: {err}"
    return None


def compile_rule(rule: Rule, file: str = "") -> CompiledRule:
    """Parse every expression of ``rule`` once and check its ``message``/``fix`` templates
    (:func:`check_template`). Raises UsageError naming the file and the bad expression or field."""
    ev = _evaluator({})
    parsed: dict[str, Any] = {}
    exprs = {f"let.{k}": v for k, v in rule.let.items()}
    exprs["when"] = rule.when
    exprs.update({f"severity_when.{k}": v for k, v in rule.severity_when.items()})
    if rule.module_expr:
        exprs["module_expr"] = rule.module_expr
    if rule.for_each:
        exprs["for_each"] = rule.for_each
    for key, expr in exprs.items():
        try:
            parsed[key] = ev.parse(expr)
        except SyntaxError as err:
            raise UsageError(f"rule {rule.id} field '{key}': invalid expression: {err.msg}", file=file or None) from err
    for key in ("message", "fix"):
        names = (*TEMPLATE_NAMES, *rule.let, *(["each"] if rule.for_each else []))
        refused = check_template(getattr(rule, key), names)
        if refused:
            raise UsageError(f"rule {rule.id} field '{key}': template refused: {refused}", file=file or None)
    compiled = CompiledRule(rule=rule, parsed=parsed, reads=site_reads(
        v for k, v in parsed.items() if k not in ("module_expr", "for_each")))  # evaluated per site / per model
    _COMPILED[id(rule)] = compiled
    return compiled


class _Namespace(dict):
    """A dict whose keys also read as attributes (``params.threshold``, ``options.dtype``)."""

    def __getattr__(self, item: str) -> Any:
        try:
            return self[item]
        except KeyError as err:
            raise AttributeError(item) from err


def _ns(value: Any) -> Any:
    if isinstance(value, dict) and not isinstance(value, _Namespace):
        return _Namespace({k: _ns(v) for k, v in value.items()})
    return value


class RuleError(Exception):
    """A rule expression failed on some facts (a bug in the rule, reported with rule id and module)."""


def _run(compiled: CompiledRule, names: dict[str, Any]) -> Optional[tuple[str, dict[str, Any]]]:
    rule = compiled.rule
    ev = _evaluator(names)
    for key in rule.let:
        names[key] = ev.eval(rule.let[key], previously_parsed=compiled.parsed[f"let.{key}"])
    if not ev.eval(rule.when, previously_parsed=compiled.parsed["when"]):
        return None
    severity = rule.severity
    for sev in sorted(rule.severity_when, key=lambda s: -SEVERITY_RANK[s]):
        if ev.eval(rule.severity_when[sev], previously_parsed=compiled.parsed[f"severity_when.{sev}"]):
            severity = sev
            break
    return severity, names


def _format(template: str, names: dict[str, Any]) -> str:
    """Fill a rule's message or fix template from its namespace (:class:`TemplateFormatter`)."""
    return _FORMATTER.vformat(template, (), names).strip()


#: methods a site fact is read through that return a value computed from their object and constant arguments
#: alone, without changing it: ``site.extra.get("k")`` (a dict), ``site.describe()`` (:class:`Site`)
_PURE_CALLS = {"get": dict, "describe": Site}


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        value = ast.literal_eval(node)
        hash(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None
    return True, value


def _chain(node: ast.AST) -> Optional[tuple]:
    """The steps from the name ``site`` to ``node`` when ``node`` is ``site`` followed by attribute reads,
    subscripts by a literal and :data:`_PURE_CALLS` with literal arguments (``site.formula.gain``,
    ``site.extra["k"]``, ``site.extra.get("k", 0)``), else None."""
    if isinstance(node, ast.Name):
        return () if node.id == "site" and isinstance(node.ctx, ast.Load) else None
    if isinstance(node, ast.Attribute):
        head = _chain(node.value)
        return None if head is None or node.attr.startswith("_") else head + (("attr", node.attr),)
    if isinstance(node, ast.Subscript):
        head = _chain(node.value)
        ok, key = _literal(node.slice)
        return head + (("item", key),) if head is not None and ok else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _PURE_CALLS
            and not node.keywords):
        head = _chain(node.func.value)
        args = [_literal(a) for a in node.args]
        if head is not None and all(ok for ok, _ in args):
            return head + (("call", node.func.attr, tuple(v for _, v in args)),)
    return None


def site_reads(nodes: Iterable[ast.AST]) -> tuple:
    """Every fact of ``site`` the expression trees ``nodes`` read, as step tuples (:func:`_chain`), sorted.

    The longest chain from ``site`` is recorded: ``site.formula.gain == "weight"`` reads ``formula.gain``;
    ``site.module.rpartition(".")`` reads ``module`` (a method of the value read, called on it); any other use
    of ``site`` (passed to a function, compared by identity, rebound) reads the whole site: ``()``. Two sites
    whose values agree on every chain give every expression the same value, all else in the rule's namespace
    being the same; :func:`evaluate` evaluates a rule once per such class of sites."""
    chains: set[tuple] = set()

    def visit(node: ast.AST) -> None:
        found = _chain(node)
        if found is not None:
            chains.add(found)
            return
        if isinstance(node, ast.Name) and node.id == "site":
            chains.add(())  # ``site`` bound by a comprehension or an assignment: whole
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and not any(
                isinstance(x, ast.Constant) for x in [node.left, *node.comparators]):
            chains.add(())  # identity of values that may be equal in value only
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            visit(node.func.value)  # a method of a read value: the value is what is read
            for child in [*node.args, *node.keywords]:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for node in nodes:
        visit(node)
    # a chain below one read whole adds nothing (``formula`` covers ``formula.gain``)
    kept = [c for c in chains if not any(c[:i] in chains for i in range(len(c)))]
    return tuple(sorted(kept, key=repr))


def _canon(v: Any) -> Any:
    """A hashable value equal for two values exactly when they are equal in type and value, recursively
    (pydantic models field by field, dicts in their order, floats by ``repr``: ``nan``, ``-0.0``); any other
    object by identity."""
    from pydantic import BaseModel

    if v is None or isinstance(v, (bool, int, str)):
        return (type(v), v)
    if isinstance(v, float):
        return (float, repr(v))
    if isinstance(v, BaseModel):
        return (type(v), tuple((n, _canon(getattr(v, n))) for n in type(v).model_fields))
    if isinstance(v, dict):
        return (type(v), tuple((_canon(k), _canon(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_canon(x) for x in v))
    return (type(v), id(v))


def _read(site: Site, chain: tuple) -> Any:
    """The canonical value (:func:`_canon`) of ``chain`` on ``site``; an error marker where a step fails."""
    value: Any = site
    try:
        for step in chain:
            if step[0] == "attr":
                value = getattr(value, step[1])
            elif step[0] == "item":
                value = value[step[1]]
            elif isinstance(value, _PURE_CALLS[step[1]]):
                value = getattr(value, step[1])(*step[2])
            else:
                return ("not pure", type(value), id(value))  # e.g. a ``get`` of a non-dict: this site alone
    except Exception as exc:  # noqa: BLE001 - the rule meets the same error when it reads the fact
        return ("error", type(exc), str(exc))
    return _canon(value)


def _site_key(site: Site, reads: tuple, memo: dict) -> tuple:
    """What the rule reads of ``site`` (:func:`site_reads`), canonical; ``memo`` caches per site and chain."""
    out = []
    for chain in reads:
        k = (id(site), chain)
        if k not in memo:
            memo[k] = _read(site, chain)
        out.append(memo[k])
    return tuple(out)


def evaluate(rules: Iterable[Rule], sites: list[Site], model: ModelFacts, config: dict[str, Any],
             config_source: Optional[str], options: Any) -> list[Finding]:
    """Run every rule over the facts; returns findings (unsorted). Raises RuleError on a failing rule.

    A site-scope rule is evaluated once per class of sites equal in every fact its expressions read
    (:func:`site_reads`: identical blocks of a deep stack differ in their module path only, which most rules
    never read); the outcome (when, severity, ``let`` values) is then the outcome on each site of the class,
    whose message, fix and ``module_expr`` are filled from that site. Sites are visited in order, so a failing
    rule fails on the first site it fails on, as when evaluated site by site. A module called at two places
    is two sites; a rule that says the same of both (same module, severity, message and source line) gives one
    finding, at the first call: one entry per rule hit per module and line."""
    findings: list[Finding] = []
    said: set[tuple] = set()
    base = {"model": model, "sites": sites, "config": _ns(config or {}), "config_source": config_source or "the config",
            "options": RuleOptions.of(options)}
    memo: dict = {}  # (id(site), chain) -> canonical value, shared by the rules (``sites`` lives through the call)
    for rule in rules:
        compiled = _COMPILED.get(id(rule)) or compile_rule(rule)
        params = _ns(dict(rule.params))
        targets = [s for s in sites if not rule.applies_to or s.kind in rule.applies_to] if rule.scope == "site" else [None]
        each: list = [None]
        if rule.for_each:
            try:
                each = list(_evaluator(dict(base, params=params, site=None)).eval(
                    rule.for_each, previously_parsed=compiled.parsed["for_each"]) or [])
            except Exception as exc:  # noqa: BLE001 - surfaced as an internal error naming the rule
                raise RuleError(f"rule {rule.id} failed on model: {type(exc).__name__}: {exc}") from exc
        outcomes: dict[tuple, Any] = {}
        for site, item in [(s, e) for s in targets for e in each]:
            key = _site_key(site, compiled.reads, memo) if site is not None else None
            try:
                if key is None or key not in outcomes:
                    names = dict(base, params=params, site=site, **({"each": item} if rule.for_each else {}))
                    hit = _run(compiled, names)
                    if key is not None:
                        outcomes[key] = hit
                else:
                    hit = outcomes[key]
                if hit is None:
                    continue
                severity, names = hit[0], dict(hit[1], site=site)
                finding = _finding(compiled, names, severity, site, sites)
            except Exception as exc:  # noqa: BLE001 - surfaced as an internal error naming the rule
                where = site.module if site is not None else "model"
                raise RuleError(f"rule {rule.id} failed on {where or '<root>'}: {type(exc).__name__}: {exc}") from exc
            where = (finding.source.file, finding.source.line) if finding.source is not None else None
            if (said_key := (rule.id, finding.module, finding.severity, finding.message, where)) not in said:
                said.add(said_key)
                findings.append(finding)
    return findings


def _finding(compiled: CompiledRule, names: dict[str, Any], severity: str, site: Optional[Site],
             sites: list[Site]) -> Finding:
    """The finding of a rule that fired on ``site`` (None: a model-scope rule) with namespace ``names``."""
    rule = compiled.rule
    module = site.module if site is not None else ""
    if rule.module_expr:
        ev = _evaluator(names)
        module = str(ev.eval(rule.module_expr, previously_parsed=compiled.parsed["module_expr"]))
    message = _format(rule.message, names)
    fix = _format(rule.fix, names)
    source = site.source if site is not None else None
    if site is not None and rule.locate == "computation":
        source = site.computation or site.source
    if site is None and module:
        # a site of that module, else a norm module that is no site (registered, never applied: NP107)
        match = next((s for s in sites if s.module == module), None) \
            or next((u for u in getattr(names.get("model"), "unused_norms", None) or [] if u.module == module), None)
        source = match.source if match else None
    return Finding(rule_id=rule.id, rule_name=rule.name, category=rule.category, severity=severity,
                   confidence=rule.confidence, module=module, message=message, fix=fix, source=source)
