"""Tests of the machine and review formats: GitHub workflow commands, Markdown (SARIF: test_sarif.py,
concise and statistics: test_concise.py). ``make_report``/``make_rules`` are shared with those files.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from normaudit.engine.schema import Rule, RuleDoc
from normaudit.render import github, markdown
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


# -------------------------------------------------------------------------------------------- GitHub


def test_github_exact_lines(report, rules):
    out = github.render(report, rules)
    lines = out.splitlines()
    assert out.endswith("\n")
    assert lines == [
        "::error file=models/gpt.py,line=42,title=NE101 eps-differs-from-config::"
        "layers.0.ln1: eps is 1e-05, the config says 1e-06",
        # no source: placed at the model (its file is not on disk here, so line 1)
        "::notice file=models/gpt.py,line=1,title=NB201 batchnorm-tiny-batch::bn: batch of 2 | too small",
        "::warning file=other/x.py,line=1,title=NX999 unlisted-rule::enc.0.norm_b: no eps at all",
    ]


def test_github_groups_one_fault_over_layers_and_skips_files_outside_the_project(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)  # paths are relative to the git top level, not to the current directory
    report = make_report(tmp_path)
    lib = "/opt/site-packages/transformers/models/llama/modeling_llama.py"
    report.findings = [
        Finding(rule_id="NE101", rule_name="eps-differs-from-config", category="eps", severity="error",
                module=f"layers.{i}.ln1", message=f"layers.{i}.ln1: eps is 1e-05",
                source=SourceLocation(file=str(tmp_path / "models" / "gpt.py"), line=42)) for i in range(18)
    ] + [Finding(rule_id="NE101", rule_name="eps-differs-from-config", category="eps", severity="error",
                 module="norm", message="eps is 1e-05", source=SourceLocation(file=lib, line=404))]
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gpt.py").write_text("import torch\n\n\nclass ToyModel:\n    pass\n")
    assert github.render(report, {}).splitlines() == [
        "::error file=models/gpt.py,line=42,title=NE101 eps-differs-from-config::"
        "layers.0-17.ln1 (18 modules): eps is 1e-05",
        # a library line cannot be annotated: the model's class line is
        "::error file=models/gpt.py,line=4,title=NE101 eps-differs-from-config::norm: eps is 1e-05",
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
    # pipes in messages are escaped; a finding without a source is at the model (not on disk here: line 1)
    assert "| \U0001F535 info | `NB201` batchnorm-tiny-batch | `bn` | batch of 2 \\| too small | `models/gpt.py:1` |" in text
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


# ------------------------------------- where findings and failures are shown: alike in every format
def test_library_line_of_a_hugging_face_target_is_placed_alike_in_every_format(tmp_path, monkeypatch, rules):
    """A finding at a line of transformers' modeling file (outside the project) is shown at the target's
    config.json in every format; the library line is kept as a note (text, concise, markdown) or a related
    location (SARIF)."""
    from normaudit.render import RenderOptions, concise, sarif, text

    project = tmp_path / "proj"
    (project / "llama").mkdir(parents=True)
    (project / "llama" / "config.json").write_text("{}\n")
    library = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "transformers" / "models" / "llama"
    monkeypatch.chdir(project)
    finding = Finding(rule_id="NE103", rule_name="eps-zero", category="eps", severity="error",
                      module="model.norm", message="LlamaRMSNorm uses eps=0.0",
                      source=SourceLocation(file=str(library / "modeling_llama.py"), line=297))
    report = Report(version="0.1.0", target=TargetInfo(path="llama", kind="hf_dir"),
                    capture=CaptureInfo(method="export", complete=True), model=ModelFacts(class_name="LlamaForCausalLM"),
                    sites=[], findings=[finding], summary=Summary(sites=0, errors=1, warnings=0, infos=0))
    options = RenderOptions(project_root=project)
    note = "(library: transformers/models/llama/modeling_llama.py:297)"
    assert concise.render(report, options=options).splitlines()[0] == \
        f"llama/config.json:1:1: NE103 [error] model.norm: LlamaRMSNorm uses eps=0.0 {note}"
    assert f"      at llama/config.json:1 {note}" in text.render(report, options=options).splitlines()
    assert f"| `llama/config.json:1` {note} |" in markdown.render(report, rules, options)
    assert github.render(report, rules, project).startswith("::error file=llama/config.json,line=1,")
    (result,) = sarif.build_log([report], rules, project)["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "llama/config.json"
    assert result["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] == 297


def test_github_a_lone_failing_target_prints_its_error_on_stdout(capsys, tmp_path, monkeypatch):
    """A CI step reads workflow commands from stdout: a lone target that fails must still annotate the run
    (text formats leave stdout empty and say it once on stderr)."""
    from normaudit.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "crash.py").write_text("import os\n\n\ndef build_model():\n    os._exit(7)\n")
    rc = main(["crash.py", "--format", "github", "--isolated", "--no-cache"])
    out, err = capsys.readouterr()
    cause = "crash.py: the model's code ended the process (exit status 7, as os._exit() does) while building the model"
    assert rc == 2
    assert out == f"::error title=normaudit crash.py::{cause}\n"
    assert err == f"normaudit: error: {cause}\n"


def test_text_and_markdown_place_a_whole_model_finding_at_the_class_line(tmp_path, monkeypatch):
    """A finding without a source (NB201 here, NP101 in real runs) is shown at the ``class ToyModel`` line by
    text and markdown, as concise, github and SARIF show it (normaudit.report.locations.finding_anchor)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gpt.py").write_text("import torch\n\nclass ToyModel:\n    pass\n")
    report = make_report(tmp_path)
    from normaudit.render import RenderOptions, text

    options = RenderOptions(project_root=tmp_path)
    lines = text.render(report, options=options).splitlines()
    i = lines.index("  NB201 [batchnorm] bn: batch of 2 | too small")
    assert lines[i + 1] == "      at models/gpt.py:3"
    row = [ln for ln in markdown.render(report, {}, options=options).splitlines() if "`NB201`" in ln]
    assert len(row) == 1 and row[0].endswith("| batch of 2 \\| too small | `models/gpt.py:3` |")


def test_capture_header_says_each_distinct_failure_once_cut_to_its_first_line(tmp_path, monkeypatch):
    """Qwen2-VL's four export attempts fail alike (symbols u8/u2 aside), with long tracebacks: the text and
    markdown headers name the attempt that captured and say the failure once, its first line cut to 200
    characters; the JSON report keeps every attempt's full text."""
    from normaudit.render import RenderOptions, text

    monkeypatch.chdir(tmp_path)
    report = make_report(tmp_path)
    guard = "GuardOnDataDependentSymNode: Could not guard on data-dependent expression Eq(u{}, 0)"
    long = guard + " " + "x" * 300 + "\nCaused by: unbind\n" + "more traceback\n" * 80
    report.capture = CaptureInfo(method="export", complete=True, attempts=[
        CaptureAttempt(method="export", ok=False, error=long.format(8)),
        CaptureAttempt(method="export (eval)", ok=False, error=long.format(2)),
        CaptureAttempt(method="symbolic_trace", ok=False, error="data-dependent control flow"),
        CaptureAttempt(method="export (main tower's inputs only)", ok=True)])
    reason = (guard.format(8) + " " + "x" * 300)[:200] + "…"
    lines = text.render(report, options=RenderOptions(project_root=tmp_path)).splitlines()
    assert lines[1] == (f"captured with export (main tower's inputs only) (after export, export (eval) failed: {reason}; "
                        "symbolic_trace failed: data-dependent control flow)")
    head = markdown.render(report, {}).splitlines()
    assert (f"- **Capture:** `export` (complete; after `export`, `export (eval)` failed: {reason}, "
            "`symbolic_trace` failed: data-dependent control flow)") in head
    assert json.loads(report.model_dump_json())["capture"]["attempts"][0]["error"] == long.format(8)
