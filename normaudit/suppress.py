"""Inline suppressions and per-module ignores, applied to findings after the rules ran.

Inline: a comment on the statement that constructs or calls the norm::

    self.norm = nn.LayerNorm(d)            # normaudit: ignore[NE101]
    self.norm = nn.LayerNorm(d)            # normaudit: ignore[NE101, NL101]
    self.norm = nn.LayerNorm(d)            # normaudit: ignore

A finding is suppressed when such a comment sits on the finding's ``source`` line, or on the ``source``
or ``definition`` line of a site of the same module (the line that calls the norm and the line that
constructs it). For a call spread over several lines, the comment may also follow its closing
parenthesis::

    self.norm = nn.LayerNorm(
        d,
    )                                      # normaudit: ignore[NE101]
 Codes are rule ids (``NE101``) or rule names
(``eps-differs-from-config``); a bare ``ignore`` suppresses every rule on that statement.

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
    suppressions: list[Suppression]

    def covering(self, line: int) -> list[Suppression]:
        """The suppressions that apply to a finding or site at ``line``."""
        return [s for s in self.suppressions if line in s.lines]


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


def _call_starts(text: str) -> dict[int, set[int]]:
    """``closing line -> first lines`` of the calls that span several lines (``f(\n  x,\n)``)."""
    starts: dict[int, set[int]] = {}
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return starts
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            end = getattr(node, "end_lineno", None)
            if end is not None and end != node.lineno:
                starts.setdefault(end, set()).add(node.lineno)
    return starts


def scan_source(text: str, file: str = "<string>") -> _FileIndex:
    """Find the suppression comments of one source text (real comments only, not text inside strings)."""
    starts = _call_starts(text)
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
    return _FileIndex(suppressions=found)


class SuppressionIndex:
    """Suppression comments of the source files a report points at, read lazily and once per file."""

    def __init__(self) -> None:
        self._files: dict[str, Optional[_FileIndex]] = {}

    @staticmethod
    def key(file: str) -> str:
        try:
            return str(Path(file).resolve())
        except OSError:
            return file

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


def _locations(finding: Finding, sites_by_module: dict[str, list[Site]]) -> list[SourceLocation]:
    locs = [finding.source] if finding.source is not None else []
    for site in sites_by_module.get(finding.module, []):
        locs += [loc for loc in (site.source, site.definition, site.call) if loc is not None]
    return locs


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
                    options: Optional[dict[str, Any]] = None, target_file: Optional[str] = None) -> FilterResult:
    """Drop findings suppressed by comments or per-module ignores; add ``NK901`` findings for unused
    suppression comments (when that rule is active). Returns the kept findings and the counts."""
    from normaudit.engine.evaluator import evaluate

    active = list(active)
    active_ids = {r.id for r in active}
    index = SuppressionIndex()
    sites_by_module: dict[str, list[Site]] = {}
    site_lines: dict[tuple[str, int], str] = {}
    for site in sites:
        sites_by_module.setdefault(site.module, []).append(site)
        for loc in (site.source, site.definition, site.call):
            if loc is not None and loc.file and loc.line and index.file(loc.file) is not None:
                site_lines.setdefault((index.key(loc.file), loc.line), site.module)
    result = FilterResult(findings=[])
    kept: list[Finding] = []
    for f in findings:
        hit = False
        for loc in _locations(f, sites_by_module):
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
            kept.append(f)
    result.unused = _unused_facts(index, rules, active_ids, site_lines, target_file)
    unused_rule = rules.get(UNUSED_RULE)
    if unused_rule is not None and UNUSED_RULE in active_ids:
        for fact in result.unused:
            extra = evaluate([unused_rule], [], model, config or {}, config_source, dict(options or {}, suppression=fact))
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
