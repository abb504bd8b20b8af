"""SARIF 2.1.0 output (``--format sarif``) for code-scanning uploads and SARIF viewers.

One run, driven by the ``normaudit`` tool component. Every rule passed in ``rules`` becomes a
``reportingDescriptor`` whose help is built from the rule's ``doc`` sections; every finding becomes a
``result`` pointing at its rule by ``ruleId`` and ``ruleIndex``. A finding with a known ``source`` gets
a physical location (a URI relative to the current directory when the file lies under it, resolved
against the ``%SRCROOT%`` base); every finding also carries a logical location naming its module, so
findings without a source still produce a valid, useful log. ``partialFingerprints`` depend only on
the rule id and the module path, so a result keeps its identity when the code around it moves.

The shape follows the OASIS SARIF 2.1.0 standard (errata 01); ``tests/data/sarif-2.1.0.schema.json``
is the official schema the tests validate against.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Optional
from urllib.parse import quote

from normaudit.engine.schema import Rule
from normaudit.report import Finding, Report, SourceLocation

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
#: Where ``tool.driver.informationUri`` points; change here when the project gets a home page.
INFORMATION_URI = "https://pypi.org/project/normaudit/"
SRCROOT = "%SRCROOT%"
FINGERPRINT_KEY = "normauditRuleModule/v1"

#: normaudit severity -> SARIF ``level``.
LEVELS = {"error": "error", "warning": "warning", "info": "note"}
#: normaudit severity -> the ``problem.severity`` property GitHub code scanning reads.
PROBLEM_SEVERITY = {"error": "error", "warning": "warning", "info": "recommendation"}

_ABBREVIATIONS = {"e.g", "i.e", "etc", "vs", "cf", "approx", "eq", "fig", "resp", "al"}


def first_sentence(text: str) -> str:
    """Return the first sentence of ``text`` with whitespace collapsed.

    A sentence ends at ``.``, ``!`` or ``?`` followed by whitespace or the end of the text; the dots of
    common abbreviations (``e.g.``, ``i.e.``, ``etc.``, ``vs.``) and of numbers (``1e-5.``) inside a
    sentence do not end it.
    """
    flat = " ".join(text.split())
    for match in re.finditer(r"[.!?](?=\s|$)", flat):
        end = match.end()
        word = flat[:match.start()].rsplit(" ", 1)[-1].lower()
        if match.group() == "." and word.rstrip(".") in _ABBREVIATIONS:
            continue
        return flat[:end]
    return flat


def source_path(file: str, cwd: Optional[str] = None) -> tuple[str, bool]:
    """Return ``(path, relative)`` for a source file as reports should show it.

    A path under ``cwd`` (default: the current directory) becomes relative to it; a relative path is
    kept relative. Separators are forward slashes either way. ``relative`` is False for an absolute
    path outside ``cwd``, which is returned absolute (posix form).
    """
    base = Path(cwd if cwd is not None else os.getcwd())
    path = Path(file)
    if not path.is_absolute():
        parts = [p for p in PurePosixPath(file.replace(os.sep, "/")).parts if p != "."]
        return "/".join(parts) if parts else ".", True
    for candidate, root in ((path, base), (path.resolve(), base.resolve())):
        try:
            rel = candidate.relative_to(root)
        except ValueError:
            continue
        return rel.as_posix(), True
    return Path(file).as_posix(), False


def artifact_location(source: SourceLocation, cwd: Optional[str] = None) -> dict[str, Any]:
    """Build a SARIF ``artifactLocation`` for ``source.file``.

    Files under ``cwd`` get a percent-encoded relative ``uri`` with ``uriBaseId`` ``%SRCROOT%``; other
    absolute files get an absolute ``file:`` URI and no base.
    """
    path, relative = source_path(source.file, cwd)
    if relative:
        return {"uri": quote(path, safe="/"), "uriBaseId": SRCROOT}
    posix = path if path.startswith("/") else "/" + path
    return {"uri": "file://" + quote(posix, safe="/:")}


def fingerprint(rule_id: str, module: str) -> str:
    """Stable identity of a finding: a hash of the rule id and the module path (not the line)."""
    return hashlib.sha256(f"{rule_id}\x00{module}".encode()).hexdigest()[:32]


def _help_text(rule: Rule) -> str:
    doc = rule.doc
    parts = [
        doc.what.strip(),
        "Why is this bad?\n" + doc.why.strip(),
        "Example:\n" + doc.example.rstrip(),
        "Use instead:\n" + doc.use_instead.rstrip(),
        "References:\n" + "\n".join(f"- {ref}" for ref in doc.references),
    ]
    return "\n\n".join(parts)


def _fence(code: str) -> str:
    code = code.strip("\n")
    ticks = "```"
    while ticks in code:
        ticks += "`"
    return f"{ticks}python\n{code}\n{ticks}"


def _help_markdown(rule: Rule) -> str:
    doc = rule.doc
    refs = "\n".join(f"- <{ref}>" if re.match(r"https?://\S+$", ref) else f"- {ref}" for ref in doc.references)
    parts = [
        f"## {rule.id} {rule.name}",
        "### What it does\n" + doc.what.strip(),
        "### Why is this bad?\n" + doc.why.strip(),
        "### Example\n" + _fence(doc.example),
        "### Use instead\n" + _fence(doc.use_instead),
        "### References\n" + refs,
    ]
    return "\n\n".join(parts)


def _descriptor(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": first_sentence(rule.doc.what)},
        "fullDescription": {"text": " ".join(rule.doc.what.split())},
        "help": {"text": _help_text(rule), "markdown": _help_markdown(rule)},
        "defaultConfiguration": {"level": LEVELS[rule.severity]},
        "properties": {
            "category": rule.category,
            "tags": ["normaudit", rule.category],
            "precision": rule.confidence,
            "problem.severity": PROBLEM_SEVERITY[rule.severity],
        },
    }


def _fallback_descriptor(finding: Finding) -> dict[str, Any]:
    """A descriptor for a finding whose rule was not passed in (keeps ``ruleIndex`` valid)."""
    return {
        "id": finding.rule_id,
        "name": finding.rule_name,
        "shortDescription": {"text": finding.rule_name},
        "defaultConfiguration": {"level": LEVELS[finding.severity]},
        "properties": {"category": finding.category, "tags": ["normaudit", finding.category]},
    }


def _location(finding: Finding, cwd: Optional[str]) -> dict[str, Any]:
    location: dict[str, Any] = {}
    if finding.source is not None and finding.source.file:
        physical: dict[str, Any] = {"artifactLocation": artifact_location(finding.source, cwd)}
        if finding.source.line is not None and finding.source.line >= 1:
            physical["region"] = {"startLine": finding.source.line}
        location["physicalLocation"] = physical
    location["logicalLocations"] = [
        {"name": finding.module.rsplit(".", 1)[-1] or "(root)",
         "fullyQualifiedName": finding.module or "(root)",
         "kind": "module"}
    ]
    return location


def _target(path: str, factory: Optional[str], cwd: str) -> str:
    shown, _ = source_path(path, cwd)
    return f"{shown}:{factory}" if factory else shown


def build(report: Report, rules: dict[str, Rule], cwd: Optional[str] = None) -> dict[str, Any]:
    """Build the SARIF log for ``report`` as a JSON-ready dict.

    ``rules`` maps rule id to :class:`Rule`; each becomes a ``reportingDescriptor`` (sorted by id).
    A finding whose rule is missing from ``rules`` gets a minimal descriptor built from the finding,
    so every ``ruleIndex`` is valid. ``cwd`` (default: the current directory) is the base that source
    paths are made relative to and that ``%SRCROOT%`` stands for.
    """
    base = cwd if cwd is not None else os.getcwd()
    descriptors: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    for rule_id in sorted(rules):
        index[rule_id] = len(descriptors)
        descriptors.append(_descriptor(rules[rule_id]))
    for finding in report.findings:
        if finding.rule_id not in index:
            index[finding.rule_id] = len(descriptors)
            descriptors.append(_fallback_descriptor(finding))

    results = []
    for finding in report.findings:
        result: dict[str, Any] = {
            "ruleId": finding.rule_id,
            "ruleIndex": index[finding.rule_id],
            "level": LEVELS[finding.severity],
            "message": {"text": finding.message},
            "locations": [_location(finding, base)],
            "partialFingerprints": {FINGERPRINT_KEY: fingerprint(finding.rule_id, finding.module)},
            "properties": {
                "category": finding.category,
                "confidence": finding.confidence,
                "module": finding.module,
            },
        }
        if finding.fix:
            result["properties"]["fix"] = finding.fix
        results.append(result)

    root_uri = Path(base).resolve().as_uri().rstrip("/") + "/"
    target = report.target
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "normaudit",
                "version": report.version,
                "semanticVersion": report.version,
                "informationUri": INFORMATION_URI,
                "rules": descriptors,
            }
        },
        "originalUriBaseIds": {SRCROOT: {"uri": root_uri}},
        "results": results,
        "columnKind": "unicodeCodePoints",
        "properties": {
            "target": _target(target.path, target.factory, base),
            "targetKind": target.kind,
            "captureMethod": report.capture.method,
            "captureComplete": report.capture.complete,
            "modelPlacement": report.model.placement,
            "sites": report.summary.sites,
        },
    }
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def render(report: Report, rules: dict[str, Rule]) -> str:
    """Render ``report`` as a SARIF 2.1.0 JSON document (one run), ending in a newline.

    ``rules`` maps rule id -> :class:`Rule` and supplies the ``tool.driver.rules`` descriptors.
    Source paths are made relative to the current directory.
    """
    return json.dumps(build(report, rules), indent=2, ensure_ascii=False) + "\n"
