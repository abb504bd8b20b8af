"""Inline suppressions and per-module ignores, applied to findings after the rules ran.

Inline: a comment on the statement that constructs or calls the norm::

    self.norm = nn.LayerNorm(d)            # normaudit: ignore[NE101]
    self.norm = nn.LayerNorm(d)            # normaudit: ignore[NE101, NL101]
    self.norm = nn.LayerNorm(d)            # normaudit: ignore

A finding is suppressed when such a comment sits on the finding's ``source`` line, or on the ``source``
or ``definition`` line of a site of the same module (the line that calls the norm and the line that
constructs it). A finding about the model as a whole (no line of its own: NP101 "no final norm", NP107 an
unused norm, ...) is shown at the model's ``class <Model>`` line in the target file, else at its factory's
``def`` line (:mod:`normaudit.report.locations`), and a comment there suppresses it::

    class GPT(nn.Module):                  # normaudit: ignore[NP101] For a call spread over several lines, the comment may also follow its closing
parenthesis::

    self.norm = nn.LayerNorm(
        d,
    )                                      # normaudit: ignore[NE101]

A comment applies to the module(s) constructed on its line only. The children of a torch.nn container
written out in one statement (``nn.Sequential(a, b)``, ``nn.ModuleList([a, b])``, ``nn.ModuleDict({"a": a})``,
``nn.Sequential(OrderedDict(...))``) are registered by the container, so the model records the container's
first line for each of them; the child is located again in the statement by its name in the module path
(``features.9`` is the tenth argument of ``self.features = nn.Sequential(...)``), and a comment on the
container's last line covers only the child(ren) built on that line, not the whole statement.

Codes are rule ids (``NE101``) or rule names (``eps-differs-from-config``); a bare ``ignore`` suppresses
every rule on that statement.

Per-module ignores (settings ``per-module-ignores = {"encoder.layers.*" = ["NE101"]}``) drop findings
whose module path matches the glob (``fnmatch``; ``*`` also crosses dots) and whose rule matches an id,
id prefix, rule name or category.

A comment that suppresses nothing is itself reported, by rule ``NK901`` (unused-suppression, info),
like ruff's unused-noqa: a bare comment, or a listed code, that matched no finding, and codes that name
no rule. Codes of rules not run in this audit (``--select``/``--ignore``) are not reported as unused.
Only comments tied to a norm of the audited model (on a site's ``source``/``definition`` line) or in
the target file itself are checked, so a shared module's comments meant for another model are left
alone.
"""
from __future__ import annotations

import ast
import fnmatch
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from normaudit.engine.schema import Rule
from normaudit.report import Finding, ModelFacts, Site, SourceLocation

UNUSED_RULE = "NK901"
_COMMENT = re.compile(r"normaudit\s*:\s*ignore\b(?:\s*\[([^\]]*)\])?", re.IGNORECASE)


@dataclass
class Suppression:
    """One ``# normaudit: ignore[...]`` comment.

    ``codes`` is None for a bare ``ignore``; ``lines`` are the lines it covers: its own, and the first line of each multi-line call closing on it.
    """

    file: str
    line: int
    text: str
    codes: Optional[list[str]]
    lines: frozenset[int]
    used: set[str] = field(default_factory=set)
    used_bare: bool = False


@dataclass
class _FileIndex:
    """The suppression comments of one file, and its torch.nn container statements (first line -> calls)."""

    suppressions: list[Suppression]
    containers: dict[int, list[tuple[ast.Call, Optional[str]]]] = field(default_factory=dict)

    def covering(self, line: int) -> list[Suppression]:
        """The suppressions that apply to a finding or site at ``line``."""
        return [s for s in self.suppressions if line in s.lines]

    def construction_line(self, line: int, module: str) -> int:
        """The line constructing ``module`` when ``line`` is the first line of a container statement that
        registered it (see the module docstring); ``line`` itself otherwise.

        ``module`` is the dotted path ``named_modules()`` gives; the path components after the name the
        container is assigned to (``self.features = ...`` -> ``features``) select the child, else the last
        component does.
        """
        parts = module.split(".") if module else []
        for call, target in self.containers.get(line, []):
            if target is not None and target in parts:
                rest = parts[len(parts) - parts[::-1].index(target):]
            else:
                rest = parts[-1:]
            node: ast.expr = call
            for key in rest:
                children = _children(node) if isinstance(node, ast.Call) else None
                if children is None or key not in children:
                    break
                node = children[key]
            if node is not call:
                return node.lineno
        return line


_CONTAINERS = ("Sequential", "ModuleList", "ModuleDict")


def _callee(call: ast.Call) -> Optional[str]:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _pairs(node: ast.expr) -> Optional[dict[str, ast.expr]]:
    """``{"a": x}`` or ``[("a", x), ...]`` with string-constant keys, as ``key -> expression``."""
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
            return None
        return {k.value: v for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        out = {}
        for elt in node.elts:
            if not (isinstance(elt, ast.Tuple) and len(elt.elts) == 2 and isinstance(elt.elts[0], ast.Constant)
                    and isinstance(elt.elts[0].value, str)):
                return None
            out[elt.elts[0].value] = elt.elts[1]
        return out
    return None


def _children(call: ast.Call) -> Optional[dict[str, ast.expr]]:
    """The children a torch.nn container call writes out literally, by the name ``named_modules()`` gives
    them (``"0"``, ``"1"``... or the dict keys); None for any other call or a non-literal argument
    (``nn.Sequential(*layers)``, ``nn.ModuleList([Block() for _ in range(n)])``)."""
    name = _callee(call)
    if name not in _CONTAINERS or call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    args = call.args
    if name == "Sequential":
        if len(args) == 1 and isinstance(args[0], ast.Call) and _callee(args[0]) == "OrderedDict":
            inner = args[0].args
            return _pairs(inner[0]) if len(inner) == 1 and not args[0].keywords else None
        return {str(i): a for i, a in enumerate(args)} or None
    if len(args) != 1:
        return None
    if name == "ModuleList":
        elts = args[0].elts if isinstance(args[0], (ast.List, ast.Tuple)) else None
        if elts is None or any(isinstance(e, ast.Starred) for e in elts):
            return None
        return {str(i): e for i, e in enumerate(elts)} or None
    return _pairs(args[0]) or None


def _assigned_name(stmt: ast.AST) -> Optional[str]:
    """The attribute or variable a single-target assignment binds (``self.features = ...`` -> ``features``)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    if len(targets) != 1:
        return None
    t = targets[0]
    return t.attr if isinstance(t, ast.Attribute) else t.id if isinstance(t, ast.Name) else None


def parse_comment(comment: str) -> Optional[tuple[str, Optional[list[str]]]]:
    """Parse a comment token; returns ``(directive text, codes or None for bare)`` or None.

    >>> parse_comment("# normaudit: ignore[NE101, NL101]")
    ('normaudit: ignore[NE101, NL101]', ['NE101', 'NL101'])
    >>> parse_comment("# normaudit: ignore")
    ('normaudit: ignore', None)
    >>> parse_comment("# an ordinary comment") is None
    True
    """
    m = _COMMENT.search(comment)
    if m is None:
        return None
    raw = m.group(1)
    codes = [c for c in re.split(r"[\s,]+", raw) if c] if raw is not None else None
    return m.group(0), (codes or None)


def _statements(text: str) -> tuple[dict[int, set[int]], dict[int, list[tuple[ast.Call, Optional[str]]]]]:
    """``closing line -> first lines`` of the calls that span several lines (``f(\n  x,\n)``), and
    ``first line -> [(container call, assigned name)]`` of the torch.nn container calls that write their
    children out (outermost first). A container's closing line does not cover its first line: its children
    are located by :meth:`_FileIndex.construction_line` instead."""
    starts: dict[int, set[int]] = {}
    containers: dict[int, list[tuple[ast.Call, Optional[str]]]] = {}
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return starts, containers
    names: dict[int, Optional[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            names[id(node.value)] = _assigned_name(node)
        if not isinstance(node, ast.Call):
            continue
        if _children(node) is not None:
            containers.setdefault(node.lineno, []).append((node, names.get(id(node))))
            continue
        end = getattr(node, "end_lineno", None)
        if end is not None and end != node.lineno:
            starts.setdefault(end, set()).add(node.lineno)
    return starts, containers


def scan_source(text: str, file: str = "<string>") -> _FileIndex:
    """Find the suppression comments of one source text (real comments only, not text inside strings)."""
    starts, containers = _statements(text)
    found: list[Suppression] = []

    def add(line: int, comment: str) -> None:
        parsed = parse_comment(comment)
        if parsed is not None:
            found.append(Suppression(file=file, line=line, text="# " + parsed[0], codes=parsed[1],
                                     lines=frozenset({line, *starts.get(line, ())})))

    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                add(tok.start[0], tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        found.clear()
        for i, line_text in enumerate(text.splitlines(), 1):
            if "#" in line_text:
                add(i, line_text[line_text.index("#"):])
    return _FileIndex(suppressions=found, containers=containers)


class SuppressionIndex:
    """Suppression comments of the source files a report points at, read lazily and once per file."""

    def __init__(self) -> None:
        self._files: dict[str, Optional[_FileIndex]] = {}
        self._keys: dict[str, str] = {}

    def key(self, file: str) -> str:
        """``file`` resolved (the same file however it is spelled), once per spelling: every site of a deep
        model names the same few files, so resolving each
        spelling once spares a filesystem walk per site."""
        k = self._keys.get(file)
        if k is None:
            try:
                k = str(Path(file).resolve())
            except OSError:
                k = file
            self._keys[file] = k
        return k

    def file(self, file: str) -> Optional[_FileIndex]:
        """The index of ``file``, or None when it cannot be read (not a Python source file on disk)."""
        k = self.key(file)
        if k not in self._files:
            idx = None
            path = Path(k)
            if path.is_file() and path.suffix in (".py", ""):
                try:
                    with tokenize.open(path) as fh:
                        text = fh.read()
                    idx = scan_source(text, k)
                except (OSError, SyntaxError, UnicodeDecodeError):
                    idx = None
            self._files[k] = idx
        return self._files[k]

    def at(self, loc: Optional[SourceLocation]) -> list[Suppression]:
        """The suppressions covering the statement at ``loc``."""
        if loc is None or not loc.file or not loc.line:
            return []
        idx = self.file(loc.file)
        return idx.covering(loc.line) if idx is not None else []

    def construction(self, loc: Optional[SourceLocation], module: str) -> Optional[SourceLocation]:
        """``loc`` moved to the line that constructs ``module`` when ``loc`` is the first line of a torch.nn
        container statement written out over several lines (:meth:`_FileIndex.construction_line`)."""
        if loc is None or not loc.file or not loc.line:
            return loc
        idx = self.file(loc.file)
        line = idx.construction_line(loc.line, module) if idx is not None else loc.line
        return loc if line == loc.line else SourceLocation(file=loc.file, line=line)

    def all(self) -> Iterable[Suppression]:
        for idx in self._files.values():
            if idx is not None:
                yield from idx.suppressions


def rule_matches(rule_id: str, rule: Optional[Rule], patterns: Iterable[str]) -> bool:
    """True when ``rule_id`` matches one of ``patterns``: an id prefix (``NE``, ``NE101``), a rule name or
    a category (the same matching as ``--select``/``--ignore``)."""
    for p in patterns:
        if rule_id.startswith(p) or (rule is not None and (rule.name == p or rule.category == p)):
            return True
    return False


def _code_matches(code: str, finding: Finding) -> bool:
    return code.upper() == finding.rule_id or code == finding.rule_name


def model_line(target_file: Optional[str], class_name: Optional[str],
               factory: Optional[str]) -> Optional[SourceLocation]:
    """The line findings about the model as a whole are shown at and suppressed on: ``class <class_name>`` in
    the target file, else ``def <factory>`` there (:func:`normaudit.report.locations.definition_line`, the
    place SARIF/concise output gives them); None when the target is no file or neither line is found."""
    if not target_file:
        return None
    from normaudit.report.locations import definition_line

    line = definition_line(target_file, class_name, factory)
    return SourceLocation(file=str(target_file), line=line) if line else None


def model_level(finding: Finding) -> bool:
    """A finding shown at the model's line: no source of its own, and not a checkpoint finding (those are
    shown at the checkpoint file)."""
    return finding.source is None and finding.category != "checkpoint"


def _locations(finding: Finding, sites_by_module: dict[str, list[Site]], index: SuppressionIndex,
               model_loc: Optional[SourceLocation] = None) -> list[SourceLocation]:
    """The lines a comment suppressing ``finding`` may sit on: its source and its module's sites' source,
    definition, call and computation lines, each moved to the child's own line within a container statement;
    for a model-level finding (:func:`model_level`) also ``model_loc``, the model's class (or factory) line."""
    locs = [finding.source] if finding.source is not None else []
    for site in sites_by_module.get(finding.module, []):
        locs += [loc for loc in (site.source, site.definition, site.call, getattr(site, "computation", None))
                 if loc is not None]
    out = [index.construction(loc, finding.module) for loc in locs]
    return out + [model_loc] if model_loc is not None and model_level(finding) else out


@dataclass
class FilterResult:
    """What :func:`filter_findings` kept and dropped."""

    findings: list[Finding]
    by_comment: int = 0
    by_module_ignore: int = 0
    unused: list[dict[str, Any]] = field(default_factory=list)

    def notes(self) -> list[str]:
        """Report notes counting the dropped findings."""
        parts = []
        if self.by_comment:
            parts.append(f"{self.by_comment} by '# normaudit: ignore' comments")
        if self.by_module_ignore:
            parts.append(f"{self.by_module_ignore} by per-module-ignores")
        return [f"suppressed {self.by_comment + self.by_module_ignore} finding(s): " + ", ".join(parts)] if parts else []


def _unused_facts(index: SuppressionIndex, rules: dict[str, Rule], active_ids: set[str],
                  site_lines: dict[tuple[str, int], str], target_file: Optional[str]) -> list[dict[str, Any]]:
    names = {r.name: r.id for r in rules.values()}
    target_key = index.key(target_file) if target_file else None
    if target_key:
        index.file(target_key)
    out = []
    for s in index.all():
        module = next((site_lines[(s.file, ln)] for ln in sorted(s.lines) if (s.file, ln) in site_lines), None)
        if module is None and s.file != target_key:
            continue
        module = module or ""
        if s.codes is None:
            if s.used_bare:
                continue
            out.append({"file": s.file, "line": s.line, "text": s.text, "module": module, "codes": [],
                        "unused": [], "unknown": [], "bare": True,
                        "summary": f"'{s.text}' suppresses no finding",
                        "fix": "remove the comment"})
            continue
        unknown = [c for c in s.codes if c.upper() not in rules and c not in names]
        unused = [c for c in s.codes if c not in unknown and c not in s.used
                  and (names.get(c) or c.upper()) in active_ids]
        if not unknown and not unused:
            continue
        parts = []
        if unused:
            parts.append(f"{', '.join(unused)} matched no finding")
        if unknown:
            parts.append(f"{', '.join(unknown)} {'is not a rule' if len(unknown) == 1 else 'are not rules'}")
        remove = unused + unknown
        keep = [c for c in s.codes if c not in remove]
        fix = (f"remove {', '.join(remove)} from the comment" if keep else "remove the comment")
        out.append({"file": s.file, "line": s.line, "text": s.text, "module": module, "codes": list(s.codes),
                    "unused": unused, "unknown": unknown, "bare": False,
                    "summary": f"unused suppression '{s.text}': " + "; ".join(parts), "fix": fix})
    out.sort(key=lambda d: (d["file"], d["line"]))
    return out


def filter_findings(findings: list[Finding], *, sites: list[Site], model: ModelFacts, rules: dict[str, Rule],
                    active: Iterable[Rule], per_module_ignores: Optional[dict[str, list[str]]] = None,
                    config: Optional[dict[str, Any]] = None, config_source: Optional[str] = None,
                    options: Any = None, target_file: Optional[str] = None,
                    factory: Optional[str] = None) -> FilterResult:
    """Drop findings suppressed by comments or per-module ignores; add ``NK901`` findings for unused
    suppression comments (when that rule is active). Returns the kept findings and the counts.

    ``target_file``/``factory``: the audited model file and its factory, whose ``class <Model>`` (else ``def
    <factory>``) line suppresses model-level findings (:func:`model_line`)."""
    from normaudit.engine.evaluator import evaluate
    from normaudit.engine.options import RuleOptions, UnusedSuppression

    active = list(active)
    active_ids = {r.id for r in active}
    index = SuppressionIndex()
    sites_by_module: dict[str, list[Site]] = {}
    site_lines: dict[tuple[str, int], str] = {}
    for site in sites:
        sites_by_module.setdefault(site.module, []).append(site)
        for loc in (site.source, site.definition, site.call, getattr(site, "computation", None)):
            if loc is not None and loc.file and loc.line and index.file(loc.file) is not None:
                loc = index.construction(loc, site.module)
                site_lines.setdefault((index.key(loc.file), loc.line), site.module)
    result = FilterResult(findings=[])
    kept: list[Finding] = []
    model_loc = model_line(target_file, model.class_name, factory)
    for f in findings:
        hit = False
        for loc in _locations(f, sites_by_module, index, model_loc):
            for s in index.at(loc):
                if s.codes is None:
                    s.used_bare = hit = True
                else:
                    for code in s.codes:
                        if _code_matches(code, f):
                            s.used.add(code)
                            hit = True
        if hit:
            result.by_comment += 1
        else:
            source = index.construction(f.source, f.module)
            kept.append(f if source is f.source else f.model_copy(update={"source": source}))
    result.unused = _unused_facts(index, rules, active_ids, site_lines, target_file)
    unused_rule = rules.get(UNUSED_RULE)
    if unused_rule is not None and UNUSED_RULE in active_ids:
        for fact in result.unused:
            run = RuleOptions.of(options).model_copy(update={"suppression": UnusedSuppression(**fact)})
            extra = evaluate([unused_rule], [], model, config or {}, config_source, run)
            kept += [x.model_copy(update={"source": SourceLocation(file=fact["file"], line=fact["line"])}) for x in extra]
    if per_module_ignores:
        final = []
        for f in kept:
            patterns = [codes for glob, codes in per_module_ignores.items() if fnmatch.fnmatchcase(f.module, glob)]
            if any(rule_matches(f.rule_id, rules.get(f.rule_id), codes) for codes in patterns):
                result.by_module_ignore += 1
            else:
                final.append(f)
        kept = final
    result.findings = kept
    return result
