"""Rule documentation generated from the rule files: one Markdown page per rule and an index.

Each rule's YAML carries its documentation (:class:`normaudit.engine.schema.RuleDoc`: what, why, example,
use instead, references); this module writes it out as ``docs/rules/<ID>.md`` and ``docs/rules/README.md``
(the index, by family). The pages are a pure function of the rule files (no dates, no absolute paths), so
a test can regenerate them and compare with the committed ones. Regenerate after adding or editing a rule::

    python -m normaudit.docs                 # writes docs/rules/ of the source checkout
    normaudit docs --output docs/rules       # the same, anywhere
    python -m normaudit.docs --check         # exit 1 naming the stale pages, write nothing

An installed (non-editable) normaudit run in the source checkout documents the checkout's ``rules/`` into its
``docs/rules/`` (:func:`default_locations`).

SARIF ``helpUri`` and ``normaudit rules --format json`` point at :func:`doc_path`.
"""
from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:  # annotations only: `normaudit rules --format json` imports no pydantic
    from normaudit.engine.schema import Rule

#: Where the pages live, relative to the repository root (also the SARIF helpUri of each rule).
DOCS_DIR = "docs/rules"
INDEX = "README.md"

#: Rule families by the second letter of the id (README.md, "How it works").
FAMILIES = {"L": "Layout", "P": "Placement", "E": "Eps", "T": "Norm type", "B": "BatchNorm and GroupNorm",
            "N": "Numerics", "C": "Checkpoint", "K": "Capture"}

_ARXIV = re.compile(r"\barXiv[: ]+(\d{4}\.\d{4,5})(v\d+)?")
_URL = re.compile(r"^https?://\S+$")


def doc_path(rule_id: str) -> str:
    """The page of rule ``rule_id`` relative to the repository root: ``docs/rules/NE101.md``."""
    return f"{DOCS_DIR}/{rule_id}.md"


@dataclass
class RuleFile:
    """A rule and the file it was read from, relative to the rules directory (``eps/NE101-....yaml``)."""

    rule: Rule
    relpath: str


def shipped_rules(root: Optional[Path] = None) -> list[RuleFile]:
    """The rules under ``root`` (default: the rules shipped with normaudit) with their files, by id. Raises
    UsageError for a bad rule file."""
    from normaudit.engine.loader import builtin_rules_dir, load_rule_file

    root = builtin_rules_dir() if root is None else root
    found = [RuleFile(load_rule_file(p), p.relative_to(root).as_posix()) for p in sorted(root.rglob("*.yaml"))]
    return sorted(found, key=lambda rf: rf.rule.id)


def _fence(code: str) -> str:
    """``code`` as a fenced block, ``python`` when it parses as Python, else ``text`` (a shell line)."""
    code = code.strip("\n")
    ticks = "```"
    while ticks in code:
        ticks += "`"
    try:
        ast.parse(code)
        lang = "python"
    except SyntaxError:
        lang = "sh" if code.lstrip().startswith("normaudit ") else "text"
    return f"{ticks}{lang}\n{code}\n{ticks}"


def _reference(ref: str) -> str:
    """One reference as a list item: a bare URL as a link, an arXiv id linked to its abstract page."""
    if _URL.match(ref):
        return f"- <{ref}>"
    return "- " + _ARXIV.sub(lambda m: f"[arXiv {m.group(1)}](https://arxiv.org/abs/{m.group(1)})", ref)


def _prose(text: str) -> str:
    """A folded YAML paragraph as Markdown text (blank lines kept as paragraph breaks)."""
    return "\n\n".join(" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip()))


def rule_page(rf: RuleFile) -> str:
    """The Markdown page of one rule: metadata, What it does, Why it matters, Example, Use instead,
    How to suppress, References."""
    rule, doc = rf.rule, rf.rule.doc
    applies = ", ".join(rule.applies_to) if rule.applies_to else ("the whole model" if rule.scope == "model"
                                                                   else "every site")
    meta = [("Category", f"`{rule.category}`"), ("Default severity", f"`{rule.severity}`"),
            ("Confidence", rule.confidence), ("Scope", f"{rule.scope} ({applies})"),
            ("Rule file", f"[`rules/{rf.relpath}`](../../rules/{rf.relpath})")]
    parts = [
        f"# {rule.id} `{rule.name}`",
        "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in meta),
        "## What it does\n\n" + _prose(doc.what),
        "## Why it matters\n\n" + _prose(doc.why),
        "## Example\n\n" + _fence(doc.example),
        "## Use instead\n\n" + _fence(doc.use_instead),
        "## How to suppress\n\n"
        f"On the line that constructs or calls the norm: `# normaudit: ignore[{rule.id}]` (or the rule's name, "
        f"`# normaudit: ignore[{rule.name}]`); for a module path, `per-module-ignores` in `[tool.normaudit]`; "
        f"for a whole run, `--ignore {rule.id}`.",
        "## References\n\n" + "\n".join(_reference(r) for r in doc.references),
        f"---\n\n*Generated from `rules/{rf.relpath}` by `python -m normaudit.docs`; edit the rule file, not "
        "this page.*",
    ]
    return "\n\n".join(parts) + "\n"


def _summary(rule: Rule) -> str:
    from normaudit.render.sarif import first_sentence

    return first_sentence(rule.doc.what).replace("|", "\\|")


def index_page(rules: Sequence[RuleFile]) -> str:
    """The index: one table per family (id, name, severity, first sentence of what it does)."""
    parts = ["# normaudit rules",
             f"{len(rules)} rules, generated from `rules/**/*.yaml` by `python -m normaudit.docs`. "
             "`normaudit explain ID` prints the same text in a terminal; `normaudit rules --format json` lists "
             "them for tools."]
    by_family: dict[str, list[RuleFile]] = {}
    for rf in rules:
        by_family.setdefault(rf.rule.id[1], []).append(rf)
    order = [f for f in FAMILIES if f in by_family] + sorted(f for f in by_family if f not in FAMILIES)
    for fam in order:
        rows = [f"| [{rf.rule.id}]({rf.rule.id}.md) | `{rf.rule.name}` | {rf.rule.severity} | {_summary(rf.rule)} |"
                for rf in by_family[fam]]
        parts.append(f"## {FAMILIES.get(fam, 'N' + fam)} (`N{fam}`)\n\n| Rule | Name | Severity | What it checks |\n"
                     "|---|---|---|---|\n" + "\n".join(rows))
    return "\n\n".join(parts) + "\n"


def generate(rules: Optional[Sequence[RuleFile]] = None) -> dict[str, str]:
    """``file name -> Markdown text`` of every page (``NE101.md``, ..., ``README.md``)."""
    rules = shipped_rules() if rules is None else list(rules)
    pages = {f"{rf.rule.id}.md": rule_page(rf) for rf in rules}
    pages[INDEX] = index_page(rules)
    return pages


def stale_pages(output: Path, pages: dict[str, str]) -> list[str]:
    """Names of the pages in ``output`` that differ from ``pages`` or are missing, and of extra ``N*.md``
    pages there that no rule generates (a removed or renamed rule), sorted."""
    stale = [name for name, text in pages.items()
             if not (output / name).is_file() or (output / name).read_text(encoding="utf-8") != text]
    extra = [p.name for p in output.glob("N*.md") if p.name not in pages] if output.is_dir() else []
    return sorted(stale + extra)


def write_pages(output: Path, pages: dict[str, str]) -> list[str]:
    """Write the pages that changed into ``output`` (created when missing) and remove the ``N*.md`` pages no
    rule generates; returns the names written or removed. Raises UsageError when it cannot write."""
    from normaudit.errors import UsageError

    changed = stale_pages(output, pages)
    try:
        output.mkdir(parents=True, exist_ok=True)
        for name in changed:
            if name in pages:
                (output / name).write_text(pages[name], encoding="utf-8", newline="\n")
            else:
                (output / name).unlink()
    except OSError as err:
        raise UsageError(f"cannot write the rule docs: {err.strerror or err}", file=str(output)) from err
    return changed


def default_locations() -> tuple[Optional[Path], Path]:
    """(the rules directory to document, None for the shipped rules; where the pages go) when neither is
    given: ``docs/rules`` of the source checkout this normaudit runs from (beside ``rules/``); for an
    installed normaudit (its rules are ``normaudit/_rules``, and nothing is written into site-packages), the
    checkout in the current directory, when it holds ``rules/`` and ``docs/rules/`` (a non-editable install
    run in the source tree), its own rules documented. Raises UsageError otherwise."""
    from normaudit.engine.loader import builtin_rules_dir
    from normaudit.errors import UsageError

    rules = builtin_rules_dir()
    if rules.name == "rules":
        return None, rules.parent / DOCS_DIR
    here = Path.cwd()
    if (here / "rules").is_dir() and (here / DOCS_DIR).is_dir():
        return here / "rules", here / DOCS_DIR
    raise UsageError("normaudit is installed, not run from a source checkout, and the current directory holds no "
                     f"rules/ and {DOCS_DIR}/: give --output DIR (and --from RULES_DIR)")


def main(argv: Optional[Sequence[str]] = None, prog: str = "python -m normaudit.docs") -> int:
    """Generate the rule docs (``--check``: exit 1 when they are stale, writing nothing). Returns the exit
    status; bad usage raises UsageError (exit 2 through the CLI)."""
    from normaudit.arguments import CommandParser
    from normaudit.errors import UsageError

    p = CommandParser(prog=prog, description="Generate docs/rules/<ID>.md and the index from the rule files.")
    p.add_argument("--output", "-o", metavar="DIR", help=f"where to write (default: {DOCS_DIR} of the checkout)")
    p.add_argument("--check", action="store_true", help="only say which pages are stale (exit 1 if any)")
    p.add_argument("--from", dest="source", metavar="DIR",
                   help="the rules directory to document (default: the rules shipped with normaudit)")
    args = p.parse_args(argv)
    if args.source and not Path(args.source).is_dir():
        raise UsageError("rules directory not found", file=args.source)
    source = Path(args.source) if args.source else None
    if args.output:
        output = Path(args.output)
    else:
        found, output = default_locations()
        source = source or found
    pages = generate(shipped_rules(source) if source else None)
    if args.check:
        stale = stale_pages(output, pages)
        for name in stale:
            print(f"{output / name}: stale (run {prog})", file=sys.stderr)
        return 1 if stale else 0
    new = {name for name in pages if not (output / name).is_file()}
    changed = write_pages(output, pages)
    counts = [(sum(n in new for n in changed), "written"),
              (sum(n in pages and n not in new for n in changed), "updated"),
              (sum(n not in pages for n in changed), "removed")]
    said = ", ".join(f"{k} {what}" for k, what in counts if k) or "all up to date"
    print(f"normaudit: {len(pages)} rule doc page(s) in {output}: {said}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from normaudit.errors import UsageError

    try:
        raise SystemExit(main())
    except UsageError as err:
        print(f"normaudit: error: {err}", file=sys.stderr)
        raise SystemExit(2)
