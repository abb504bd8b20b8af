"""The command line: output formats, several targets, the JSON contract, bad input (exit 2, one line).

Most tests call ``normaudit.cli.main`` in-process (each subprocess would import torch again); one test
runs the installed ``normaudit`` command to check the real process boundary.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from normaudit.cli import audit_command, main, outputs
from normaudit.cli.outputs import plan_outputs
from normaudit.cli.parser import audit_parser
from normaudit.errors import UsageError

FIXTURES = Path(__file__).parent / "fixtures" / "cli"
TINY = FIXTURES / "tiny.py"
TEST_RULES = ["--rules", str(FIXTURES / "rules"), "--select", "NZ,NK", "--isolated"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` in-process; returns (exit status, stdout, stderr)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert "Traceback" not in err
    assert lines[0].startswith("normaudit: error: ")
    return lines[0]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A private copy of the tiny model, in a directory of its own."""
    path = tmp_path / "tiny.py"
    shutil.copy(TINY, path)
    return path


# ------------------------------------------------------------------------------------- the JSON contract
def test_json_for_one_target_is_exactly_the_report(capsys, tiny):
    rc, out, err = run(capsys, tiny, "--format", "json", *TEST_RULES)
    assert rc == 1  # NZ001 is an error
    doc = json.loads(out)  # exactly one JSON document on stdout
    assert doc["tool"] == "normaudit" and "reports" not in doc
    assert {"sites", "model", "findings", "summary", "target"} <= set(doc)
    assert {s["module"] for s in doc["sites"]} == {"layers.0.norm", "layers.1.norm", "final"}
    for site in doc["sites"]:
        assert {"module", "kind", "eps", "normalized_axes", "placement"} <= set(site)
    assert {"placement", "parallel_residual"} <= set(doc["model"])
    assert sorted((f["rule_id"], f["module"]) for f in doc["findings"]) == [
        ("NZ001", "layers.0.norm"), ("NZ001", "layers.1.norm"), ("NZ002", "final")]
    for f in doc["findings"]:
        assert {"rule_id", "category", "severity", "module", "message", "source"} <= set(f)
        assert f["source"]["line"] in (12, 24)


def test_schema_command_describes_the_report(capsys, tiny):
    rc, out, _ = run(capsys, "schema")
    assert rc == 0
    schema = json.loads(out)
    assert {"sites", "findings", "model"} <= set(schema["properties"])
    rc, report, _ = run(capsys, tiny, "--format", "json", *TEST_RULES)
    jsonschema.validate(json.loads(report), schema)


# ------------------------------------------------------------------------------------------------ outputs
def test_several_formats_in_one_run(capsys, tiny, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.sarif"
    rc, out, _ = run(capsys, tiny, "--format", "json", "-o", a, "--format", "sarif", "-o", b,
                     "--format", "github", *TEST_RULES)
    assert rc == 1
    assert json.loads(a.read_text())["summary"]["errors"] == 2
    sarif = json.loads(b.read_text())
    assert sarif["version"] == "2.1.0" and len(sarif["runs"]) == 1
    # the unpaired format on stdout; the two layers' NZ001 are one annotation (layers.0-1.norm)
    assert out.count("::error ") == 1 and out.count("::warning ") == 1 and "layers.0-1.norm (2 modules)" in out


@pytest.mark.parametrize("sequence, expected", [
    ([], [("text", None)]),
    ([("format", "json")], [("json", None)]),
    ([("output", "r.txt")], [("text", "r.txt")]),
    ([("format", "json"), ("output", "a.json"), ("format", "text")], [("json", "a.json"), ("text", None)]),
    ([("format", "json"), ("format", "sarif"), ("output", "b.sarif")], [("json", None), ("sarif", "b.sarif")]),
    ([("output", "a.json"), ("format", "json"), ("format", "text")], [("json", "a.json"), ("text", None)]),
    ([("format", "json"), ("output", "-"), ("format", "sarif"), ("output", "b")], [("json", None), ("sarif", "b")]),
])
def test_format_and_output_pairing(sequence, expected):
    assert [(s.fmt, s.path) for s in plan_outputs(sequence)] == expected


@pytest.mark.parametrize("sequence, cause", [
    ([("format", "json"), ("format", "text")], "several formats would go to stdout"),
    ([("format", "json"), ("output", "a"), ("output", "b")], "-o b has no --format"),
    ([("output", "a"), ("output", "b")], "give one --format per -o"),
    ([("format", "json"), ("output", "a"), ("format", "sarif"), ("output", "a")], "the same -o file"),
])
def test_bad_format_and_output_pairing(sequence, cause):
    with pytest.raises(UsageError, match=cause):
        plan_outputs(sequence)


# ------------------------------------------------------------------------------------------ several targets
def test_several_targets_make_one_json_document(capsys, tmp_path, tiny):
    other = tmp_path / "other.py"
    other.write_text(tiny.read_text().replace("nn.RMSNorm(d)", "nn.Identity()"))
    rc, out, err = run(capsys, tiny, other, "--format", "json", "--fail-on", "warning", *TEST_RULES)
    assert rc == 1
    doc = json.loads(out)
    assert [r["target"]["path"] for r in doc["reports"]] == [str(tiny), str(other)]
    assert doc["errors"] == [] and doc["summary"]["targets"] == 2
    assert doc["summary"]["errors"] == 4 and doc["summary"]["warnings"] == 1
    assert "[1/2]" not in err  # stderr is not a terminal: no progress lines


def test_one_checkpoint_for_several_targets_is_refused(capsys, tmp_path, tiny):
    """One --checkpoint read as every target's weights gave false checkpoint errors (NC106, NC109) on the
    targets it does not belong to: with several targets it is bad input, before anything runs."""
    other = tmp_path / "other.py"
    other.write_text(tiny.read_text())
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    rc, out, err = run(capsys, tiny, other, "--checkpoint", weights, *TEST_RULES)
    assert rc == 2 and out == ""
    assert one_line_error(err) == (
        "normaudit: error: --checkpoint applies to one target, and this run has 2; give each target its own "
        "with 'checkpoint' in its table of the settings' targets "
        '(targets = [{path = "model.py", checkpoint = "model.safetensors"}])')


def test_exit_status_is_the_worst_over_targets_and_failures_do_not_hide_reports(capsys, tmp_path, tiny, monkeypatch):
    monkeypatch.setattr(audit_command, "_stderr_is_tty", lambda: True)
    missing = tmp_path / "missing.py"
    out_json = tmp_path / "out.json"
    rc, out, err = run(capsys, tiny, missing, "--format", "json", "-o", out_json, "--format", "github", *TEST_RULES)
    assert rc == 2
    assert out.count("::error file=") == 1 and out.count("::warning file=") == 1  # NZ001 of 2 layers: one group
    assert out.splitlines()[-1].startswith("::error title=normaudit ") and "no such file or directory" in out
    doc = json.loads(out_json.read_text())
    assert len(doc["reports"]) == 1 and doc["reports"][0]["summary"]["errors"] == 2
    assert doc["errors"] == [{"target": str(missing), "status": 2, "message": f"{missing}: no such file or directory"}]
    assert "[1/2] " in err and "[2/2] " in err  # progress lines on a terminal
    assert f"normaudit: error: {missing}: no such file or directory" in err


def test_several_targets_text_and_sarif(capsys, tmp_path, tiny):
    other = tmp_path / "other.py"
    shutil.copy(tiny, other)
    sarif = tmp_path / "all.sarif"
    rc, out, _ = run(capsys, tiny, other, "--format", "text", "--format", "sarif", "-o", sarif, *TEST_RULES,
                     "--project-root", tmp_path)
    assert rc == 1
    assert out.count("normaudit 0.") == 2 and "2 targets (0 failed): 4 error(s), 2 warning(s)" in out
    log = json.loads(sarif.read_text())
    assert len(log["runs"]) == 1  # one run per invocation (GitHub refuses several runs of one category)
    assert {r["properties"]["target"] for r in log["runs"][0]["results"]} == {"tiny.py:build_model",
                                                                             "other.py:build_model"}
    schema = json.loads((Path(__file__).parent / "data" / "sarif-2.1.0.schema.json").read_text())
    jsonschema.validate(log, schema)


# ---------------------------------------------------------------------------------------------- bad input
def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, text the one stderr line must contain)."""
    (tmp_path / "syntax.py").write_text("import torch\n\ndef build_model(:\n    pass\n")
    (tmp_path / "nofactory.py").write_text("import torch\n")
    (tmp_path / "raises.py").write_text("from torch import nn\n\ndef build_model():\n    return nn.GroupNorm(3, 4)\n")
    (tmp_path / "bad.json").write_text('{"layer_norm_eps": 1e-5,\n "x": }\n')
    (tmp_path / "bad.yaml").write_text("a: 1\nb: [1, 2\n")
    (tmp_path / "loop_a.pt").symlink_to("loop_b.pt")
    (tmp_path / "loop_b.pt").symlink_to("loop_a.pt")
    (tmp_path / "gone.py").symlink_to("nothere.py")
    rules = tmp_path / "badrules"
    rules.mkdir()
    (rules / "NZ777-x.yaml").write_text("id: NZ777\nname: x\ncategory: eps\nseverity: [error\nwhen: 'True'\n")
    rules2 = tmp_path / "badrules2"
    rules2.mkdir()
    (rules2 / "NZ776-y.yaml").write_text("id: NZ776\nname: y\ncategory: eps\nseverity: error\nwhen: 'True'\n"
                                         "message: m\nfix: f\n")
    (tmp_path / "bad-baseline.json").write_text("[1, 2")
    (tmp_path / "settings.toml").write_text("select = [\"NZ\"]\nfail-on = \"sometimes\"\n")
    tiny = str(tmp_path / "tiny.py")
    return {
        "nonexistent target": ([str(tmp_path / "nope.py")], "nope.py: no such file or directory"),
        "nonexistent directory target": ([str(tmp_path / "nodir")], "nodir: no such file or directory"),
        "syntax error": ([str(tmp_path / "syntax.py")], "syntax.py:3: import failed: SyntaxError"),
        "missing factory": ([str(tmp_path / "nofactory.py")], "nofactory.py: no callable build_model()"),
        "missing named factory": ([tiny + ":make"], "tiny.py: no callable make()"),
        "factory raises": ([str(tmp_path / "raises.py")], "raises.py:4: build_model() failed: ValueError"),
        "bad config JSON": ([tiny, "--config", str(tmp_path / "bad.json")], "bad.json:2: invalid JSON"),
        "bad config YAML": ([tiny, "--config", str(tmp_path / "bad.yaml")], "bad.yaml:3: invalid YAML"),
        "missing config": ([tiny, "--config", str(tmp_path / "none.yaml")], "none.yaml: config file not found"),
        "unwritable -o": ([tiny, "-o", str(tmp_path / "no" / "dir" / "out.txt")], "out.txt: cannot write output"),
        "-o is a directory": ([tiny, "--format", "json", "-o", str(tmp_path)],
                              f"cannot write output to {str(tmp_path)!r}: it is a directory"),
        "symbolic link loop": ([str(tmp_path / "loop_a.pt")], "loop_a.pt: symbolic link loop"),
        "dangling link": ([str(tmp_path / "gone.py")], "gone.py: dangling symbolic link to 'nothere.py'"),
        "bad rule file": ([tiny, "--rules", str(rules)], "NZ777-x.yaml:5: invalid YAML in rule file"),
        "incomplete rule file": ([tiny, "--rules", str(rules2)], "NZ776-y.yaml: rule field 'doc': Field required"),
        "missing rules dir": ([tiny, "--rules", str(tmp_path / "nodir")], "rules directory not found"),
        "bad baseline": ([tiny, "--baseline", str(tmp_path / "bad-baseline.json")], "bad-baseline.json:1: invalid JSON"),
        "bad settings value": ([tiny, "--settings", str(tmp_path / "settings.toml")], "settings.toml:2: 'fail-on'"),
        "unknown --select": ([tiny, "--select", "NZ9"], "--select: 'NZ9' matches no rule"),
        "bad --input-axes": ([tiny, "--input-axes", "B,Q"], "--input-axes 'B,Q': unknown axis 'Q'"),
        "bad --batch-size": ([tiny, "--batch-size", "0"], "argument --batch-size: must be at least 1"),
        "bad --dtype": ([tiny, "--dtype", "float8"], "argument --dtype: invalid choice"),
        "two formats on stdout": ([tiny, "--format", "json", "--format", "text"], "several formats would go to stdout"),
        "unknown module target": (["nosuchpkg_xyz.models:build"], "no importable module 'nosuchpkg_xyz.models'"),
    }


@pytest.mark.parametrize("name", [
    "nonexistent target", "nonexistent directory target", "syntax error", "missing factory",
    "missing named factory", "factory raises", "bad config JSON", "bad config YAML", "missing config",
    "unwritable -o", "-o is a directory", "bad rule file", "incomplete rule file", "missing rules dir", "bad baseline",
    "bad settings value", "unknown --select", "bad --input-axes", "bad --batch-size", "bad --dtype",
    "two formats on stdout", "unknown module target", "symbolic link loop", "dangling link",
])
def test_bad_input_is_one_line_and_exit_2(name, capsys, tmp_path, tiny):
    argv, expected = _bad_inputs(tmp_path)[name]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc, out, err = run(capsys, *argv, *([] if "--settings" in argv else ["--isolated"]))
    assert rc == 2, err
    assert expected in one_line_error(err)
    assert out == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written, no __pycache__


def test_a_failing_user_rule_is_bad_input_naming_its_file(capsys, tmp_path, tiny):
    rules = tmp_path / "myrules"
    rules.mkdir()
    (rules / "NZ778-broken.yaml").write_text(
        (FIXTURES / "rules" / "NZ001-test-layernorm.yaml").read_text()
        .replace("NZ001", "NZ778").replace("test-layernorm", "broken").replace('"True"', '"site.no_such_fact > 1"'))
    rc, _, err = run(capsys, tiny, "--rules", rules, "--select", "NZ778", "--isolated")
    assert rc == 2
    line = one_line_error(err)
    assert "NZ778-broken.yaml" in line and "rule NZ778 failed" in line


# ------------------------------------------------------------------------------- the user's tree stays clean
def test_nothing_is_written_into_the_users_tree(capsys, tmp_path):
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "layers.py").write_text("from torch import nn\n\ndef block(d):\n    return nn.Sequential(nn.Linear(d, d), "
                                   "nn.LayerNorm(d))\n")
    (pkg / "model.py").write_text("import torch\nfrom torch import nn\nfrom layers import block\n\n"
                                  "def build_model():\n    return nn.Sequential(block(8), block(8))\n\n"
                                  "def example_inputs():\n    return (torch.randn(2, 8),)\n")
    before = sorted(str(p) for p in pkg.rglob("*"))
    rc, _, err = run(capsys, pkg / "model.py", *TEST_RULES)
    assert rc == 1, err
    assert sorted(str(p) for p in pkg.rglob("*")) == before
    assert not list(tmp_path.rglob("__pycache__"))


def test_package_module_factory_target(capsys, tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "parts.py").write_text("from torch import nn\n\nclass Net(nn.Module):\n    def __init__(self):\n"
                                  "        super().__init__()\n        self.fc = nn.Linear(8, 8)\n"
                                  "        self.norm = nn.LayerNorm(8)\n\n    def forward(self, x):\n"
                                  "        return self.norm(self.fc(x))\n")
    (pkg / "models.py").write_text("import torch\nfrom .parts import Net\n\ndef make():\n    return Net()\n\n"
                                   "def example_inputs():\n    return (torch.randn(2, 8),)\n")
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "mypkg.models:make", "--format", "json", *TEST_RULES)
    assert rc == 1, err
    doc = json.loads(out)
    assert doc["target"]["factory"] == "mypkg.models:make"
    assert [(f["rule_id"], f["module"], f["source"]["line"]) for f in doc["findings"]] == [("NZ001", "norm", 7)]
    assert not list(tmp_path.rglob("__pycache__"))
    rc, _, err = run(capsys, "mypkg.models:nothing", *TEST_RULES)
    assert rc == 2 and "no callable nothing() in module mypkg.models" in one_line_error(err)


def test_real_process_exit_codes_and_stderr(tmp_path):
    """The installed command: bad input is exit 2 with one line and no traceback (one subprocess)."""
    proc = subprocess.run([sys.executable, "-m", "normaudit", str(tmp_path / "missing.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "normaudit: error: missing.py: no such file or directory"
    assert proc.stdout == ""


def test_docstring_examples():
    import doctest

    import normaudit.suppress

    for module in (outputs, normaudit.suppress):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_json_stdout_survives_fd_writes_and_torch_logs(tmp_path):
    """User code writing to file descriptor 1, and torch logging tracebacks for a model that cannot be
    captured, must not corrupt the one JSON document on stdout nor put a traceback on stderr. (Inputs that
    do not fit the model at all are exit 2: tests/test_bad_models.py.) The data-dependent branch is never
    taken on the example inputs (the capture by parts runs the forward once for real and must not reach the
    norm, else the result would depend on the random inputs)."""
    import json
    import subprocess
    import sys

    model = tmp_path / "noisy.py"
    model.write_text("import os, torch\nfrom torch import nn\n"
                     "def build_model():\n    os.write(1, b'FD1 write\\n')\n    print('py print')\n"
                     "    return Noisy()\n"
                     "class Noisy(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                     "        self.norm = nn.LayerNorm(4)\n"
                     "    def forward(self, x):\n        return self.norm(x) if x.sum() > 1e9 else x\n"
                     "def example_inputs():\n    return (torch.randn(2, 4),)\n")
    proc = subprocess.run([sys.executable, "-m", "normaudit", str(model), "--format", "json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0
    report = json.loads(proc.stdout)
    assert report["capture"]["method"] == "module_walk"
    assert [f["rule_id"] for f in report["findings"]] == ["NK101", "NK102"]  # NK102: the checks a module walk did not run
    assert "FD1 write" in proc.stderr and "py print" in proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------- failed targets: what each output says; --help
CRASH = "import os\n\n\ndef build_model():\n    os._exit(7)\n"
CRASH_TEXT = "crash.py: the model's code ended the process (exit status 7, as os._exit() does) while building the model"


def _failed_outputs(capsys, tmp_path, *targets):
    rc, out, err = run(capsys, *targets, "--format", "concise", "--format", "sarif", "-o", tmp_path / "c.sarif",
                       "--format", "json", "-o", tmp_path / "c.json", "--isolated", "--no-cache")
    sarif_log = json.loads((tmp_path / "c.sarif").read_text())
    return rc, out, err, sarif_log, json.loads((tmp_path / "c.json").read_text())


def test_a_lone_failing_target_still_writes_sarif_and_json(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "crash.py").write_text(CRASH)
    rc, out, err, log, doc = _failed_outputs(capsys, tmp_path, "crash.py")
    assert (rc, out, err) == (2, "", f"normaudit: error: {CRASH_TEXT}\n")
    (run_,) = log["runs"]
    assert run_["results"] == []
    notification = {"level": "error", "message": {"text": CRASH_TEXT},  # the path said once
                    "properties": {"target": "crash.py", "exitStatus": 2}}
    assert run_["invocations"] == [{"executionSuccessful": False, "toolExecutionNotifications": [notification]}]
    assert doc["reports"] == [] and doc["errors"] == [{"target": "crash.py", "status": 2, "message": CRASH_TEXT}]
    assert doc["summary"] == {"targets": 1, "failed": 1, "errors": 0, "warnings": 0, "infos": 0}
    # the same documents as a run of several targets gives
    rc, out, err, log2, doc2 = _failed_outputs(capsys, tmp_path, "crash.py", "missing.py")
    assert rc == 2 and out == "No findings in 2 targets (2 failed).\n"
    assert log2["runs"][0]["invocations"][0]["toolExecutionNotifications"][0] == notification
    assert log2["runs"][0]["invocations"][0]["toolExecutionNotifications"][1]["message"]["text"] == \
        "missing.py: no such file or directory"
    assert doc2["errors"][0] == doc["errors"][0]


def test_a_lone_missing_target_writes_its_error_into_the_files(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err, log, doc = _failed_outputs(capsys, tmp_path, "missing.py")
    assert (rc, out, err) == (2, "", "normaudit: error: missing.py: no such file or directory\n")
    assert log["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"] == \
        "missing.py: no such file or directory"
    assert doc["errors"] == [{"target": "missing.py", "status": 2, "message": "missing.py: no such file or directory"}]


def test_help_names_every_target_kind_and_command(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "or a checkpoint alone (.safetensors, .pt, .pth, .bin, a sharded index or a directory of them)" in out
    assert ("Other commands: 'normaudit rules', 'normaudit explain ID', 'normaudit schema', 'normaudit docs' "
            "(generate docs/rules/).") in out


def test_readme_usage_block_names_every_flag():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    if not readme.is_file():
        pytest.skip("README.md is in the source checkout only")
    usage = readme.read_text(encoding="utf-8").split("## Usage", 1)[1].split("```")[1]
    flags = [o for a in audit_parser()._actions for o in a.option_strings]
    spelled = {o: re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", usage) is not None for o in flags}
    assert [o for o, found in spelled.items() if not found and not (o.startswith("--") and any(
        s.startswith("-") and not s.startswith("--") and spelled[s] for s in _aliases(o)))] == []


def _aliases(option: str) -> list[str]:
    action = next(a for a in audit_parser()._actions if option in a.option_strings)
    return list(action.option_strings)


# ------------------------------------------------------------------------- adopting: baseline, noqa comments
def test_write_baseline_says_what_it_wrote_and_prints_no_report(capsys, tiny, tmp_path):
    baseline = tmp_path / "baseline.json"
    rc, out, err = run(capsys, tiny, *TEST_RULES, "--write-baseline", baseline)
    assert (rc, out) == (0, "")
    assert err == f"normaudit: wrote 3 finding(s) to the baseline {baseline}\n"
    assert [f["module"] for f in json.loads(baseline.read_text())["findings"]] == [
        "layers.0.norm", "layers.1.norm", "final"]
    # a format asked for explicitly is still printed
    rc, out, _ = run(capsys, tiny, *TEST_RULES, "--write-baseline", baseline, "--format", "json")
    assert rc == 0 and [f["module"] for f in json.loads(out)["findings"]] == ["layers.0.norm", "layers.1.norm", "final"]


def test_add_noqa_says_what_it_wrote_and_prints_no_report(capsys, tiny):
    rc, out, err = run(capsys, tiny, *TEST_RULES, "--add-noqa")
    assert (rc, out) == (0, "")
    assert err == "normaudit: added 2 suppression comment(s) for 3 finding(s) in 1 file(s)\n"
    lines = tiny.read_text().splitlines()
    assert lines[11] == "        self.norm = nn.LayerNorm(d)  # normaudit: ignore[NZ001]"
    assert lines[23] == "        self.final = nn.RMSNorm(d)  # normaudit: ignore[NZ002]"
