"""SARIF 2.1.0 output (``--format sarif``) for GitHub code scanning and other SARIF viewers.

One log with **one run per invocation** of normaudit, whatever the number of targets (GitHub refuses a
file with several runs of one tool and category since June 2025), tagged with ``automationDetails.id``
``normaudit/`` (category ``normaudit``). The run lists every rule once in ``tool.driver.rules`` (help
built from the rule's ``doc`` sections, in ``help.text`` and ``help.markdown``; ``helpUri`` a shipped rule's
page ``<base>/<ID>.md`` only where the base of the rule pages is known, :func:`docs_base`, and left out
otherwise: never a link to a page that may not exist); every finding of every target is one ``result``:

- ``locations[0].physicalLocation``: always present, with ``region.startLine`` >= 1. The URI is relative
  to the project root (``--project-root``; default the git top level, else the current directory) and
  resolved against the ``%SRCROOT%`` base of ``originalUriBaseIds``. The place is the finding's source;
  a finding without one is shown at the checkpoint file (checkpoint findings) or at the model's class or
  factory line (:func:`normaudit.report.locations.finding_anchor`). A source outside the project root (a
  library's modeling file in site-packages) cannot be shown by code scanning: the result is shown at
  the model's anchor inside the project and the library line becomes a ``relatedLocation`` with an
  absolute ``file:`` URI.
- ``locations[0].logicalLocations``: the module path (``fullyQualifiedName`` ``layers.3.ln_1``).
- ``partialFingerprints``: a hash of rule id, target (relative to the project root) and module path, so
  a result keeps its identity when lines move.
- targets that failed (exit 2 or 3 with several targets) are ``toolExecutionNotifications`` of the run's
  invocation, whose ``executionSuccessful`` is then false.

The shape follows the OASIS SARIF 2.1.0 standard (errata 01) and GitHub's "SARIF support for code
scanning" (docs.github.com/en/code-security/code-scanning/integrating-with-code-scanning/
sarif-support-for-code-scanning); ``tests/data/sarif-2.1.0.schema.json`` is the official schema the
tests validate against, and ``tests/test_sarif.py`` checks GitHub's upload requirements.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Optional, Sequence
from urllib.parse import quote, urlsplit

from normaudit.engine.schema import Rule
from normaudit.report.locations import (anchor_in_root, checkpoint_file, project_root, relative_to_root,
                                        target_file)
from normaudit.report import Finding, Report, SourceLocation

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
#: The ``Project-URL`` labels (normalised as :data:`REPOSITORY_LABELS`) whose URL, when the metadata has one,
#: becomes ``tool.driver.informationUri``: the home page first, then the repository.
INFORMATION_LABELS = ("homepage", *("source", "repository", "sourcecode", "github"))
#: The ``Project-URL`` labels (normalised as PEP 753 does: lower case, no punctuation or white space) of the
#: package metadata taken as the source repository (PEP 753's ``source`` and its aliases), whose ``docs/rules/<ID>.md`` pages
#: (:func:`normaudit.docs.doc_path`) ``helpUri`` links to.
REPOSITORY_LABELS = ("source", "repository", "sourcecode", "github")
#: Hosts whose web view of a file at the default branch is known: the repository's path (its pattern here)
#: + the blob path + ``docs/rules``. ``HEAD`` names the default branch on both (the metadata does not say it).
_REPOSITORY_PATHS = {"github.com": (r"/[\w.-]+/[\w.-]+", "/blob/HEAD/"),
                     "gitlab.com": (r"/[\w.-]+(?:/[\w.-]+)+", "/-/blob/HEAD/")}
SRCROOT = "%SRCROOT%"
#: ``runs[].automationDetails.id``: GitHub takes the part before the last ``/`` as the analysis category.
AUTOMATION_ID = "normaudit/"
FINGERPRINT_KEY = "normauditRuleTargetModule/v1"

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


def file_uri(path: Path) -> str:
    """An absolute ``file:`` URI for ``path``, percent-encoded (``file:///opt/my%20lib/x.py``)."""
    return "file://" + quote(path.as_posix() if path.as_posix().startswith("/") else "/" + path.as_posix(),
                             safe="/:")


def artifact_location(source: SourceLocation, root: Optional[Path] = None,
                      cwd: Optional[str] = None) -> dict[str, Any]:
    """A SARIF ``artifactLocation`` for ``source.file``: a percent-encoded URI relative to ``root``
    (default: :func:`normaudit.report.locations.project_root`) with ``uriBaseId`` ``%SRCROOT%`` when the
    file lies under it, else an absolute ``file:`` URI without a base. A relative ``source.file`` is taken
    from ``cwd`` (default: the current directory)."""
    root = root if root is not None else project_root(cwd=cwd)
    rel = relative_to_root(source.file, root, cwd)
    if rel is not None:
        return {"uri": quote(rel, safe="/"), "uriBaseId": SRCROOT}
    path = Path(source.file)
    if not path.is_absolute():
        path = Path(cwd) / path if cwd else path.absolute()
    return {"uri": file_uri(path)}


def fingerprint(rule_id: str, target: str, module: str) -> str:
    """Stable identity of a finding: a hash of the rule id, the target (as :func:`target_label` writes it)
    and the module path; not of the line, so moving code keeps the alert."""
    return hashlib.sha256(f"{rule_id}\x00{target}\x00{module}".encode()).hexdigest()[:32]


def target_label(report: Report, root: Path) -> str:
    """The target as the run names it: its path relative to ``root`` (as given when outside), with
    ``:factory`` for a Python file (``models/gpt.py:build_model``)."""
    target = report.target
    file = target_file(report)
    shown = target.path if file is None else (relative_to_root(file, root) or Path(file).as_posix())
    if file is not None and target.kind == "python" and target.factory:
        shown = f"{shown}:{target.factory}"
    return shown

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


def _descriptor(rule: Rule, base: Optional[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
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
    if base is not None:
        out["helpUri"] = help_uri(rule.id, base)
    return out


def help_uri(rule_id: str, base: str) -> str:
    """The absolute URI of a shipped rule's page under ``base`` (:func:`docs_base`): ``<base>/<ID>.md``, the
    layout :mod:`normaudit.docs` writes (``docs/rules/NE101.md``)."""
    return f"{base.rstrip('/')}/{rule_id}.md"


def docs_base(setting: Optional[str] = None) -> Optional[str]:
    """The absolute URL under which the rule pages ``<ID>.md`` lie, or None when it is not known.

    ``setting``: ``docs-url`` of ``[tool.normaudit]`` (:class:`normaudit.settings.Settings`), used as given.
    Else the installed package's metadata (``[project.urls]`` of its ``pyproject.toml``): a repository entry
    (:data:`REPOSITORY_LABELS`) on github.com or gitlab.com gives ``<repo>/blob/HEAD/docs/rules``. A
    ``Documentation`` entry is not used: where a documentation site puts a rule's page (``.md``, ``.html``,
    a folder) is not known from its address. None otherwise, and the descriptors carry no ``helpUri``.
    """
    if setting:
        return setting.rstrip("/")
    return _repository_docs(_project_urls())


def information_uri() -> Optional[str]:
    """``tool.driver.informationUri``: the https home page or repository of the installed package's metadata
    (:data:`INFORMATION_LABELS`), or None, and the driver carries none: SARIF makes it optional, and a URL
    the project does not own would send readers nowhere."""
    urls = _project_urls()
    for label in INFORMATION_LABELS:
        if urlsplit(urls.get(label, "")).scheme == "https":
            return urls[label]
    return None


def _project_urls() -> dict[str, str]:
    """The installed normaudit's ``Project-URL`` entries, ``{normalised label: url}`` (empty when the
    distribution's metadata cannot be read)."""
    try:
        entries = metadata.metadata("normaudit").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return {}
    urls: dict[str, str] = {}
    for entry in entries:
        label, sep, url = str(entry).partition(",")
        if sep:
            urls.setdefault(re.sub(r"[^a-z0-9]", "", label.lower()), url.strip())
    return urls


def _repository_docs(urls: dict[str, str]) -> Optional[str]:
    """``<repo>/blob/HEAD/docs/rules`` (GitLab: ``/-/blob/HEAD/``) of the first repository URL in ``urls``
    (:func:`_project_urls`) that is an https URL of a repository on github.com (``/OWNER/NAME``) or
    gitlab.com (``/GROUP/.../NAME``), else None."""
    for label in REPOSITORY_LABELS:
        parts = urlsplit(urls.get(label, ""))
        host = parts.netloc.lower().removeprefix("www.")
        path = re.sub(r"\.git$", "", parts.path.rstrip("/"))
        if parts.scheme == "https" and host in _REPOSITORY_PATHS and not parts.query and not parts.fragment:
            pattern, blob = _REPOSITORY_PATHS[host]
            if re.fullmatch(pattern, path):
                return f"https://{host}{path}{blob}docs/rules"
    return None


def shipped_rule_ids() -> set[str]:
    """Ids of the rules shipped with normaudit (their files are named ``<ID>-<name>.yaml``), the ones with
    a page under ``docs/rules``."""
    from normaudit.engine.loader import builtin_rules_dir

    return {p.name.split("-", 1)[0] for p in builtin_rules_dir().rglob("*.yaml")}


def _fallback_descriptor(finding: Finding) -> dict[str, Any]:
    """A descriptor for a finding whose rule was not passed in (keeps ``ruleIndex`` valid)."""
    return {
        "id": finding.rule_id,
        "name": finding.rule_name,
        "shortDescription": {"text": finding.rule_name},
        "defaultConfiguration": {"level": LEVELS[finding.severity]},
        "properties": {"category": finding.category, "tags": ["normaudit", finding.category]},
    }


def _physical(source: SourceLocation, root: Path) -> dict[str, Any]:
    line = source.line if source.line is not None and source.line >= 1 else 1
    return {"artifactLocation": artifact_location(source, root), "region": {"startLine": line}}


def _locations(finding: Finding, report: Report, root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The result's location (physical and logical) and its related locations."""
    related: list[dict[str, Any]] = []
    where, outside = anchor_in_root(finding, report, root)
    if outside is not None:  # code scanning cannot show a file outside the project: keep it as related
        related.append({"id": len(related), "physicalLocation": _physical(outside, root),
                        "message": {"text": "where the norm is built (outside the project root)"}})
    if finding.category == "checkpoint" and finding.source is not None:
        ckpt = checkpoint_file(report)
        if ckpt:
            related.append({"id": len(related), "physicalLocation": _physical(SourceLocation(file=ckpt), root),
                            "message": {"text": "the checkpoint read"}})
    location: dict[str, Any] = {}
    if where is not None:
        location["physicalLocation"] = _physical(where, root)
    location["logicalLocations"] = [
        {"name": finding.module.rsplit(".", 1)[-1] or "(root)",
         "fullyQualifiedName": finding.module or "(root)",
         "kind": "module"}
    ]
    return location, related


def _result(finding: Finding, report: Report, index: dict[str, int], root: Path, target: str) -> dict[str, Any]:
    location, related = _locations(finding, report, root)
    text = f"{finding.module}: {finding.message}" if finding.module else finding.message
    result: dict[str, Any] = {
        "ruleId": finding.rule_id,
        "ruleIndex": index[finding.rule_id],
        "level": LEVELS[finding.severity],
        "message": {"text": text},
        "locations": [location],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint(finding.rule_id, target, finding.module)},
        "properties": {
            "category": finding.category,
            "confidence": finding.confidence,
            "module": finding.module,
            "target": target,
        },
    }
    if related:
        result["relatedLocations"] = related
    if finding.fix:
        result["properties"]["fix"] = finding.fix
    return result


def _target_properties(report: Report, target: str) -> dict[str, Any]:
    return {"target": target, "targetKind": report.target.kind, "captureMethod": report.capture.method,
            "captureComplete": report.capture.complete, "modelPlacement": report.model.placement,
            "sites": report.summary.sites}


def _descriptors(rules: dict[str, Rule], reports: Sequence[Report],
                 base: Optional[str]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    shipped = shipped_rule_ids() if rules and base is not None else set()
    descriptors: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    for rule_id in sorted(rules):
        index[rule_id] = len(descriptors)
        descriptors.append(_descriptor(rules[rule_id], base if rule_id in shipped else None))
    for report in reports:
        for finding in report.findings:
            if finding.rule_id not in index:
                index[finding.rule_id] = len(descriptors)
                descriptors.append(_fallback_descriptor(finding))
    return descriptors, index


def _error_text(error: dict[str, Any]) -> str:
    """The notification text of a failed target: its message, prefixed with the target unless the message
    already starts with the target's file (``crash.py: the model's code ended ...`` names it once)."""
    target, message = error["target"], error.get("message") or "failed"
    file = re.split(r":(?![\\/])", target, maxsplit=1)[0]
    return message if file and message.startswith(file) else f"{target}: {message}"


def build_log(reports: Sequence[Report], rules: dict[str, Rule], root: Optional[Path] = None,
              errors: Iterable[dict[str, Any]] = (), version: Optional[str] = None,
              docs_url: Optional[str] = None) -> dict[str, Any]:
    """The SARIF log of one invocation as a JSON-ready dict: one run holding every report's results.

    ``rules`` maps rule id to :class:`Rule`; each becomes a ``reportingDescriptor`` (sorted by id), and a
    finding whose rule is missing gets a minimal descriptor built from the finding, so every ``ruleIndex``
    is valid. ``root`` (default :func:`normaudit.report.locations.project_root`) is what ``%SRCROOT%``
    stands for. ``errors``: failed targets, ``{"target", "status", "message"}`` each, written as error
    notifications of the invocation. ``version``: the tool version when there is no report. ``docs_url``: the
    ``docs-url`` setting, the base of the shipped rules' ``helpUri`` (:func:`docs_base`).
    """
    from normaudit import __version__

    root = (root if root is not None else project_root()).resolve()
    descriptors, index = _descriptors(rules, reports, docs_base(docs_url))
    results, targets = [], []
    for report in reports:
        target = target_label(report, root)
        targets.append(_target_properties(report, target))
        results += [_result(f, report, index, root, target) for f in report.findings]
    errors = list(errors)
    notifications = [{"level": "error", "message": {"text": _error_text(e)},
                      "properties": {"target": e["target"], "exitStatus": e.get("status")}} for e in errors]
    invocation: dict[str, Any] = {"executionSuccessful": not errors}
    if notifications:
        invocation["toolExecutionNotifications"] = notifications
    tool_version = reports[0].version if reports else (version or __version__)
    driver: dict[str, Any] = {"name": "normaudit", "version": tool_version, "semanticVersion": tool_version}
    if (info := information_uri()) is not None:
        driver["informationUri"] = info
    run: dict[str, Any] = {
        "tool": {"driver": {**driver, "rules": descriptors}},
        "automationDetails": {"id": AUTOMATION_ID},
        "originalUriBaseIds": {SRCROOT: {"uri": root.as_uri().rstrip("/") + "/"}},
        "invocations": [invocation],
        "results": results,
        "columnKind": "unicodeCodePoints",
        "properties": {"targets": targets, **(targets[0] if len(targets) == 1 else {})},
    }
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def build(report: Report, rules: dict[str, Rule], root: Optional[Path] = None) -> dict[str, Any]:
    """The SARIF log of one report (:func:`build_log` of ``[report]``)."""
    return build_log([report], rules, root)


def render(report: Report, rules: dict[str, Rule], options: Any = None) -> str:
    """Render ``report`` as a SARIF 2.1.0 JSON document (one run), ending in a newline.

    ``rules`` maps rule id -> :class:`Rule` and supplies the ``tool.driver.rules`` descriptors;
    ``options.project_root`` (:class:`normaudit.render.RenderOptions`) the base of the URIs, ``options.docs_url``
    that of the rule pages (:func:`docs_base`).
    """
    root = getattr(options, "project_root", None)
    return dumps(build_log([report], rules, Path(root) if root is not None else None,
                           docs_url=getattr(options, "docs_url", None)))


def dumps(log: dict[str, Any]) -> str:
    """A SARIF log as indented JSON ending in a newline."""
    return json.dumps(log, indent=2, ensure_ascii=False) + "\n"
