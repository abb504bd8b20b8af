"""Right message, right line, right scope.

- messages describe hand-written norms by what they compute and quote constructor arguments only for
  torch.nn modules; formula findings point at the line in ``forward`` that computes the statistic;
- one fault repeated in many layers is one group in text and markdown (one entry per module in JSON);
- ``--input-axes`` with the wrong rank, or empty, is exit 2 naming both ranks;
- a suppression on the last line of a multi-line ``nn.Sequential(...)`` covers only the modules built on
  that line;
- untrusted strings (checkpoint tensor names, messages, paths) reach the terminal with control characters
  escaped, and GitHub workflow commands cannot be injected.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from normaudit.cli import main
from normaudit.suppress import scan_source

FIXTURES = Path(__file__).parent / "fixtures" / "messages"
#: The bad-inputs suppression case, one copy shared with tests/test_bad_models.py.
BAD_MODELS = Path(__file__).parent / "data" / "bad_models"


def run(capsys, *argv) -> tuple[int, str, str]:
    """``main(argv)`` in-process; returns (exit status, stdout, stderr)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("normaudit: error: "), err
    return lines[0][len("normaudit: error: "):]


def copy_fixture(name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    shutil.copy((FIXTURES if (FIXTURES / name).exists() else BAD_MODELS) / name, path)
    return path


def line_of(path: Path, text: str) -> int:
    """The 1-based number of the only line of ``path`` containing ``text``."""
    hits = [i for i, ln in enumerate(path.read_text().splitlines(), 1) if text in ln]
    assert len(hits) == 1, (text, hits)
    return hits[0]


# ------------------------------------------------------------------------------------ --input-axes
@pytest.mark.parametrize("axes, expected", [
    ("B,C,H", "--input-axes B,C,H has 3 axes but the model's first input has rank 4 (shape [2, 3, 64, 64])"),
    ("B,C,H,W,D", "--input-axes B,C,H,W,D has 5 axes but the model's first input has rank 4 (shape [2, 3, 64, 64])"),
    ("", "--input-axes '': no axes given; give one axis per dim of the model's first input, e.g. B,C,H,W"),
    ("B,,C,H", "--input-axes 'B,,C,H': empty axis in 'B,,C,H'; give one axis per dim, e.g. B,C,H,W"),
])
def test_input_axes_of_the_wrong_rank_or_empty_is_exit_2(capsys, tmp_path, axes, expected):
    path = copy_fixture("cnn_suppress.py", tmp_path)
    rc, out, err = run(capsys, path, "--batch-size", "1", "--isolated", "--input-axes", axes)
    assert (rc, out) == (2, "")
    assert one_line_error(err) == expected


def test_input_axes_of_the_right_rank_label_the_input(capsys, tmp_path):
    path = copy_fixture("cnn_suppress.py", tmp_path)
    rc, out, err = run(capsys, path, "--batch-size", "1", "--isolated", "--format", "json", "--input-axes", "N,C,W,H")
    assert rc == 0, err
    doc = json.loads(out)
    assert {s["module"]: s["normalized_axes"] for s in doc["sites"]}["features.1"] == ["batch", "width", "height"]


# ------------------------------------------------------------------- suppressions in a container
def test_a_suppression_on_the_last_line_of_a_sequential_covers_only_the_module_built_there(capsys, tmp_path):
    path = copy_fixture("cnn_suppress.py", tmp_path)
    rc, out, err = run(capsys, path, "--batch-size", "1", "--isolated", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    # features.9 (BatchNorm1d, built on the commented line) is suppressed; features.1 and .4 are not, and
    # point at the lines that build them, not at the first line of the statement
    assert sorted((f["rule_id"], f["module"], f["source"]["line"]) for f in doc["findings"]) == [
        ("NB101", "features.1", line_of(path, "nn.BatchNorm2d(16)")),
        ("NB101", "features.4", line_of(path, "nn.BatchNorm2d(32)")),
    ]
    assert "suppressed 1 finding(s): 1 by '# normaudit: ignore' comments" in doc["notes"]


def test_without_the_comment_every_batchnorm_of_the_sequential_is_reported(capsys, tmp_path):
    path = copy_fixture("cnn_suppress.py", tmp_path)
    path.write_text(path.read_text().replace("  # normaudit: ignore[NB101]", ""))
    rc, out, err = run(capsys, path, "--batch-size", "1", "--isolated", "--format", "json")
    doc = json.loads(out)
    assert sorted((f["module"], f["source"]["line"]) for f in doc["findings"] if f["rule_id"] == "NB101") == [
        ("features.1", 10), ("features.4", 11), ("features.9", 12)]


CONTAINERS = '''\
from collections import OrderedDict
import torch.nn as nn
class M(nn.Module):
    def __init__(self):
        self.f = nn.Sequential(
            nn.LayerNorm(4),
            nn.Sequential(nn.Linear(4, 4),
                          nn.LayerNorm(4)),
            nn.LayerNorm(4))  # normaudit: ignore
        self.l = nn.ModuleList([nn.LayerNorm(4),
                                nn.LayerNorm(4)])
        self.d = nn.ModuleDict({"a": nn.LayerNorm(4),
                                "b": nn.LayerNorm(4)})
        self.o = nn.Sequential(OrderedDict([("ln", nn.LayerNorm(4)),
                                            ("fc", nn.Linear(4, 4))]))
        self.c = nn.ModuleList([nn.LayerNorm(4)
                                for _ in range(3)])  # normaudit: ignore
        self.n = nn.LayerNorm(
            4)  # normaudit: ignore
'''


@pytest.mark.parametrize("line, module, expected", [
    (5, "f.0", 6), (5, "f.2", 9), (5, "f", 5), (5, "blocks.3.f.2", 9), (7, "f.1.1", 8), (7, "f.1.0", 7),
    (10, "l.1", 11), (10, "l.0", 10), (12, "d.b", 13), (14, "o.fc", 15), (14, "o.ln", 14),
    (16, "c.2", 16), (18, "n", 18), (5, "f.7", 5),
])
def test_the_child_of_a_container_statement_is_located_on_its_own_line(line, module, expected):
    assert scan_source(CONTAINERS).construction_line(line, module) == expected


def test_a_container_s_closing_line_does_not_cover_its_first_line_but_a_call_s_does():
    idx = scan_source(CONTAINERS)
    assert [s.line for s in idx.covering(9)] == [9] and idx.covering(5) == []  # nn.Sequential: children only
    assert [s.line for s in idx.covering(16)] == [17]  # a comprehension builds every child on one line
    assert [s.line for s in idx.covering(18)] == [19]  # a multi-line call that is not a container


# ------------------------------------------------------------------------ untrusted strings
HOSTILE = {"layers.0.input_layernorm\x1b]0;pwn\x07.weight": 0.0, "layers.0.ln\n::error ::x.weight": 0.0,
           "layers.1.ln\u202e.weight": 1.0, "::error file=a::pwn.norm.weight": 0.0}


@pytest.fixture
def hostile_checkpoint(tmp_path: Path) -> Path:
    """A safetensors file whose tensor names carry an OSC sequence, a newline followed by a workflow
    command, a bidi override and a leading workflow command; three all-zero gains (NC104)."""
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "evil\x1b[31m.safetensors"
    save_file({k: torch.full((8,), v) for k, v in HOSTILE.items()}, str(path), metadata={"format": "pt"})
    return path


def assert_terminal_safe(out: str) -> None:
    import unicodedata

    bad = sorted({repr(ch) for ch in out if ch != "\n" and (unicodedata.category(ch) in ("Cc", "Zl", "Zp")
                                                            or ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")})
    assert bad == []
    assert [ln for ln in out.splitlines() if ln.lstrip().startswith(("::", "##["))] == []


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_control_characters_of_checkpoint_names_are_escaped_in_text_and_markdown(capsys, hostile_checkpoint, fmt):
    rc, out, err = run(capsys, hostile_checkpoint, "--isolated", "--format", fmt)
    assert rc == 0, err
    assert_terminal_safe(out)
    for shown in ("layers.0.input_layernorm\\x1b]0;pwn\\x07", "layers.0.ln\\n::error ::x", "layers.1.ln\\u202e",
                  "\\::error file=a::pwn.norm", "evil\\x1b[31m.safetensors"):
        assert shown in out, shown


def test_text_lists_the_escaped_names_in_the_parameter_table(capsys, hostile_checkpoint):
    rc, out, err = run(capsys, hostile_checkpoint, "--isolated", "--format", "text")
    rows = [ln.split()[0] for ln in out.splitlines() if "RMSNorm  8" in ln]
    assert rows == ["\\::error", "layers.0.input_layernorm\\x1b]0;pwn\\x07", "layers.0.ln\\n::error",
                    "layers.1.ln\\u202e"]
    assert "  NC104 [checkpoint] layers.0.ln\\n::error ::x: every gain in the checkpoint is 0" in out


def test_github_annotations_keep_one_command_per_line(capsys, hostile_checkpoint):
    rc, out, err = run(capsys, hostile_checkpoint, "--isolated", "--format", "github")
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 3 and all(re.match(r"::notice file=[^,]*,line=1,title=NC104 all-zero-gains::", ln)
                                   for ln in lines)  # checkpoint findings: at the checkpoint file
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    data = sorted(ln.split("::", 2)[2].split(":")[0] for ln in lines)
    assert data == ["", "layers.0.input_layernorm\\x1b]0;pwn\\x07", "layers.0.ln%0A"]


def test_json_keeps_the_names_exactly(capsys, hostile_checkpoint):
    rc, out, err = run(capsys, hostile_checkpoint, "--isolated", "--format", "json")
    doc = json.loads(out)
    assert sorted(s["module"] for s in doc["sites"]) == sorted(k[:-len(".weight")] for k in HOSTILE)


@pytest.mark.parametrize("raw, shown", [
    ("ln\x1b]0;pwn\x07", "ln\\x1b]0;pwn\\x07"), ("a\nb\r\tc", "a\\nb\\r\\tc"), ("x\x7f\x85", "x\\x7f\\x85"),
    ("\u2028\u202e\u2066", "\\u2028\\u202e\\u2066"), ("  ::error ::x", "\\  ::error ::x"), ("##[group]x", "\\##[group]x"),
    ("layers.0.ln", "layers.0.ln"), ("C:\\models\\ü.py", "C:\\models\\ü.py"), ("a::b", "a::b"),
])
def test_escape_control(raw, shown):
    from normaudit.render.escape import escape_control

    assert escape_control(raw) == shown


def test_github_escapes_per_the_runner_rules():
    from normaudit.render.github import escape_data, escape_property

    assert escape_data("50% a\r\nb") == "50%25 a%0D%0Ab"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    assert escape_data("t\x1b]0;x\x07") == "t\\x1b]0;x\\x07"


# ------------------------------------------------------------- descriptions, lines, grouping
DEEP = FIXTURES / "deep_handwritten.py"


@pytest.fixture(scope="module")
def deep_report():
    from normaudit.audit import AuditOptions, run_audit
    from normaudit.engine.loader import load_rules

    return run_audit(AuditOptions(target=str(DEEP)), load_rules())


def test_a_hand_written_norm_is_described_by_what_it_computes(deep_report):
    (nl101,) = [f for f in deep_report.findings if f.rule_id == "NL101"]
    assert nl101.module == "norm"
    assert nl101.message.startswith(
        "hand-written RMSNorm `MyNorm` (mean of squares over the last 2 dims (16x32: sequence, feature), eps 1e-06) "
        "takes its statistics over (sequence, feature) of an input laid out as (batch, sequence, feature)")
    assert "normalized_shape" not in nl101.message + (nl101.fix or "")
    assert nl101.source.line == line_of(DEEP, "self.norm = MyNorm(d)")  # the constructor: where a fix goes


def test_a_formula_finding_points_at_the_line_computing_the_statistic(deep_report):
    nt103 = [f for f in deep_report.findings if f.rule_id == "NT103"]
    assert sorted(f.module for f in nt103) == sorted(f"layers.{i}.input_layernorm" for i in range(18))
    var_line = line_of(DEEP, "var = x.var(-1, keepdim=True)")
    assert {(Path(f.source.file).name, f.source.line) for f in nt103} == {("deep_handwritten.py", var_line)}
    s = next(s for s in deep_report.sites if s.module == "layers.0.input_layernorm")
    assert (s.computation.line, s.definition.line) == (var_line, line_of(DEEP, "self.input_layernorm = BesselNorm(d)"))


def test_a_suppression_on_the_computing_line_suppresses_the_formula_finding(capsys, tmp_path):
    path = tmp_path / "deep.py"
    path.write_text(DEEP.read_text().replace("var = x.var(-1, keepdim=True)",
                                             "var = x.var(-1, keepdim=True)  # normaudit: ignore[NT103]"))
    rc, out, err = run(capsys, path, "--isolated", "--format", "json")
    doc = json.loads(out)
    assert sorted({f["rule_id"] for f in doc["findings"]}) == ["NL101"]
    assert "suppressed 18 finding(s): 18 by '# normaudit: ignore' comments" in doc["notes"]


def test_one_fault_in_18_layers_is_one_group_in_text_and_markdown_and_18_entries_in_json(capsys):
    rc, text, err = run(capsys, DEEP, "--isolated")
    var_line = line_of(DEEP, "var = x.var(-1, keepdim=True)")
    nt = [ln for ln in text.splitlines() if ln.startswith("  NT103")]
    assert len(nt) == 1
    assert nt[0].startswith("  NT103 [norm-type] layers.0-17.input_layernorm (18 modules): layers.0-17.input_layernorm "
                            "(BesselNorm) normalises by the unbiased (Bessel-corrected, divide by N-1) variance")
    at = text.splitlines()[text.splitlines().index(nt[0]) + 1]
    assert at.startswith("      at ") and at.endswith(f"deep_handwritten.py:{var_line}")
    assert "WARNINGS (18 findings in 1 entry)" in text
    rc, md, err = run(capsys, DEEP, "--isolated", "--format", "markdown")
    rows = [ln for ln in md.splitlines() if "`NT103`" in ln and ln.startswith("|")]
    assert len(rows) == 1 and "| `layers.0-17.input_layernorm` (18 modules) |" in rows[0]
    rc, js, err = run(capsys, DEEP, "--isolated", "--format", "json")
    assert sorted(f["module"] for f in json.loads(js)["findings"] if f["rule_id"] == "NT103") == sorted(
        f"layers.{i}.input_layernorm" for i in range(18))


def _site(**kw):
    from normaudit.report import Site

    base = dict(module="m", kind="LayerNorm", class_name="LayerNorm", detected_by="module",
                class_module="torch.nn.modules.normalization", eps=1e-5, normalized_shape=[512],
                reduced_dims=[2], input_shape=[2, 7, 512], input_axes=["batch", "sequence", "feature"])
    base.update(kw)
    return Site(**base)


@pytest.mark.parametrize("kw, text", [
    ({}, "nn.LayerNorm(normalized_shape=[512], eps=1e-05)"),
    ({"affine_weight": True, "affine_bias": False}, "nn.LayerNorm(normalized_shape=[512], eps=1e-05, bias=False)"),
    ({"kind": "RMSNorm", "class_name": "RMSNorm", "eps": 1.1920928955078125e-07, "eps_default": "finfo"},
     "nn.RMSNorm(normalized_shape=[512])"),
    ({"kind": "GroupNorm", "class_name": "GroupNorm", "num_groups": 32, "num_channels": 256},
     "nn.GroupNorm(num_groups=32, num_channels=256, eps=1e-05)"),
    ({"class_module": "mypkg.layers", "class_name": "LayerNorm2d"},
     "`LayerNorm2d` (a torch.nn LayerNorm subclass: mean and variance over the last 512 features, eps 1e-05)"),
    ({"detected_by": "pattern", "kind": "RMSNorm", "class_name": "MyNorm", "class_module": "model", "eps": 1e-6},
     "hand-written RMSNorm `MyNorm` (mean of squares over the last 512 features, eps 1e-06)"),
    ({"detected_by": "pattern", "class_name": "Block", "class_module": "model", "eps": None, "inline": True,
      "reduced_dims": [1, 2], "input_shape": [2, 16, 32]},
     "hand-written LayerNorm in `Block` (mean and variance over the last 2 dims (16x32: sequence, feature), no eps)"),
    ({"detected_by": "functional", "op": "layer_norm", "class_name": "Block", "class_module": "model",
      "reduced_dims": [1], "input_shape": [2, 64, 8, 8], "input_axes": ["batch", "channel", "height", "width"]},
     "F.layer_norm in `Block` (mean and variance over the 64 channels of dim 1, eps 1e-05)"),
    ({"detected_by": "module_walk", "class_name": "T5LayerNorm", "class_module": "transformers.x", "eps": 1e-6},
     "`T5LayerNorm` (LayerNorm by its class name, eps 1e-06)"),
])
def test_site_describe(kw, text):
    assert _site(**kw).describe() == text


@pytest.mark.parametrize("modules, label", [
    (["layers.%d.input_layernorm" % i for i in range(18)], "layers.0-17.input_layernorm"),
    (["h.0.ln_1", "h.1.ln_1", "h.3.ln_1"], "h.{0-1,3}.ln_1"),
    (["enc.layers.0.ln", "enc.layers.1.ln", "dec.layers.0.ln"], "enc.layers.0-1.ln, dec.layers.0.ln"),
    (["a.0.b.0", "a.1.b.1"], "a.0.b.0 .. a.1.b.1"),
    (["norm"], "norm"),
])
def test_module_span(modules, label):
    from normaudit.render.text import module_span

    assert module_span(modules) == label


def test_findings_group_only_when_rule_source_and_message_agree():
    from normaudit.render.text import group_findings
    from normaudit.report import Finding, SourceLocation

    def finding(module, line, msg="{m} adds no eps", rule="NE103"):
        return Finding(rule_id=rule, rule_name="r", category="eps", severity="error", module=module,
                       message=msg.format(m=module), source=SourceLocation(file="m.py", line=line))

    groups = group_findings([finding("h.0.ln", 5), finding("h.1.ln", 5), finding("h.10.ln", 5),
                             finding("h.2.ln", 6), finding("h.3.ln", 5, "{m} has eps 0"),
                             finding("h.4.ln", 5, rule="NE104")])
    assert [(g.count_label, g.message) for g in groups] == [
        ("h.{0-1,10}.ln (3 modules)", "h.{0-1,10}.ln adds no eps"), ("h.2.ln", "h.2.ln adds no eps"),
        ("h.3.ln", "h.3.ln has eps 0"), ("h.4.ln", "h.4.ln adds no eps")]


def test_docstring_examples_of_the_renderers_run():
    import doctest

    from normaudit.render import github, text

    for module in (text, github):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__
