"""The subcommands besides the audit: ``normaudit rules`` (list the rules), ``explain ID`` (one rule's
documentation), ``schema`` (the JSON schema of the report) and ``docs`` (generate docs/rules/). They read
rule files and settings, never a model: none imports torch, and with a validation memo none imports pydantic."""
from __future__ import annotations

import json
import re
from typing import Any, Optional, Sequence

from normaudit.arguments import CommandParser
from normaudit.cli.exits import EXIT_OK
from normaudit.errors import UsageError


def _listed_rules(argv_rules: Optional[list[str]]) -> tuple[list[str], dict[str, Any], Any]:
    """The ``--rules`` directories (else those of the settings file), the rules for ``rules``/``explain``, and
    the validation memo they came through: read from the memo of the cache directory when these files were
    validated before by this code (:func:`normaudit.engine.loader.load_rules_listed`,
    :func:`normaudit.settings.validated_table`: no pydantic, under 0.5 s), else loaded and validated."""
    from normaudit.cache import validation_memo
    from normaudit.engine.loader import load_rules_listed
    from normaudit.settings import table_rules, validated_table

    source, table = validated_table() if not argv_rules else (None, {})
    dirs = argv_rules or table_rules(source, table)
    memo = validation_memo(source, table.get("cache"))
    return dirs, load_rules_listed(dirs, memo), memo


def _first_sentence(text: str) -> str:
    """The first sentence of a rule's ``doc.what``, on one line."""
    flat = " ".join(text.split())
    cut = re.search(r"\.(\s+[A-Z]|$)", flat)
    return flat[: cut.start() + 1] if cut else flat


def cmd_rules(argv: Sequence[str]) -> int:
    """``normaudit rules [--format text|json]``: one line per rule, or a JSON list of objects with ``id``,
    ``name``, ``category``, ``severity``, ``confidence``, ``summary`` (first sentence of ``doc.what``) and
    ``docs`` (the generated page, ``docs/rules/ID.md``; null for a rule from ``--rules DIR``)."""
    p = CommandParser(prog="normaudit rules", description="List the rules.")
    p.add_argument("--rules", action="append", metavar="DIR")
    p.add_argument("--format", choices=["text", "json"], default="text")
    args = p.parse_args(argv)
    dirs, rules, memo = _listed_rules(args.rules)
    ordered = sorted(rules.values(), key=lambda r: r.id)
    if args.format == "json":
        from normaudit.docs import doc_path
        from normaudit.engine.loader import load_rules_listed

        shipped = set(load_rules_listed([], memo)) if dirs else set(rules)
        print(json.dumps([{"id": r.id, "name": r.name, "category": r.category, "severity": r.severity,
                           "confidence": r.confidence, "summary": _first_sentence(r.doc.what),
                           "docs": doc_path(r.id) if r.id in shipped else None} for r in ordered], indent=2))
        return EXIT_OK
    width = max((len(r.name) for r in rules.values()), default=0)
    for rule in ordered:
        print(f"{rule.id}  {rule.name.ljust(width)}  {rule.category:<10} {rule.severity:<8} {_first_sentence(rule.doc.what)}")
    return EXIT_OK


def cmd_docs(argv: Sequence[str]) -> int:
    """``normaudit docs [--output DIR] [--check]``: generate the rule pages (:mod:`normaudit.docs`)."""
    from normaudit.docs import main as docs_main

    return docs_main(argv, prog="normaudit docs")


def cmd_explain(argv: Sequence[str]) -> int:
    """``normaudit explain ID [--rules DIR]``: the documentation of the rule with that id (any case) or name:
    what it does, why it matters, an example, what to use instead, references. An unknown rule is a
    UsageError."""
    p = CommandParser(prog="normaudit explain", description="Print one rule's documentation.")
    p.add_argument("rule_id")
    p.add_argument("--rules", action="append", metavar="DIR")
    args = p.parse_args(argv)
    rules = _listed_rules(args.rules)[1]
    key = args.rule_id.strip()
    rule = rules.get(key.upper()) or next((r for r in rules.values() if r.name == key), None)
    if rule is None:
        raise UsageError(f"no rule {key!r}; 'normaudit rules' lists them")
    d = rule.doc
    print(f"{rule.id} {rule.name}  ({rule.category}, {rule.severity})\n")
    for title, body in (("What it does", d.what), ("Why it matters", d.why), ("Example", d.example),
                        ("Use instead", d.use_instead)):
        print(f"## {title}\n{body.rstrip()}\n")
    print("## References")
    for ref in d.references:
        print(f"- {ref}")
    return EXIT_OK


def cmd_schema(argv: Sequence[str]) -> int:
    """``normaudit schema``: the JSON schema of the report, kept in the validation memo of the cache directory
    (keyed by normaudit's source and pydantic's files, :func:`normaudit.cache.validation_key`) so that a second
    call builds no pydantic model. The settings file's ``cache`` key is honoured as by the audit (``cache =
    false``: no memo is read or written; a directory: the memo is kept there)."""
    from normaudit.cache import validation_key, validation_memo
    from normaudit.settings import validated_table

    p = CommandParser(prog="normaudit schema", description="Print the JSON schema of the report (--format json).")
    p.parse_args(argv)
    source, table = validated_table()
    memo = validation_memo(source, table.get("cache"))
    key = validation_key("report-schema", None) if memo is not None else ""
    text = memo.get(key) if memo is not None else None
    if not isinstance(text, str):
        from normaudit.report import Report

        text = json.dumps(Report.model_json_schema(), indent=2)
        if memo is not None:
            memo.put(key, text)
    print(text)
    return EXIT_OK


COMMANDS = {"rules": cmd_rules, "explain": cmd_explain, "schema": cmd_schema, "docs": cmd_docs}
