"""Settings files: discovery, every key, flags overriding them, and errors naming file and line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from normaudit.cli import main
from normaudit.cli.parser import audit_parser
from normaudit.errors import UsageError
from normaudit.settings import Settings, TargetSettings, discover_settings, find_settings_file, load_settings

FIXTURES = Path(__file__).parent / "fixtures" / "cli"


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """A project directory (the current directory) holding the tiny model and the test rules."""
    shutil.copy(FIXTURES / "tiny.py", tmp_path / "tiny.py")
    shutil.copytree(FIXTURES / "rules", tmp_path / "testrules")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_pyproject(root: Path, body: str) -> Path:
    path = root / "pyproject.toml"
    path.write_text('[project]\nname = "demo"\n\n[tool.normaudit]\n' + body)
    return path


# ------------------------------------------------------------------------------------------------ discovery
def test_normaudit_toml_wins_over_pyproject_and_search_goes_upward(tmp_path):
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    (tmp_path / "a" / "pyproject.toml").write_text('[project]\nname = "x"\n')  # no [tool.normaudit]: skipped
    write_pyproject(tmp_path, 'fail-on = "info"\n')
    assert find_settings_file(sub) == (tmp_path / "pyproject.toml").resolve()
    (tmp_path / "normaudit.toml").write_text('fail-on = "warning"\n')
    assert find_settings_file(sub) == (tmp_path / "normaudit.toml").resolve()
    assert discover_settings(start=sub).fail_on == "warning"
    assert discover_settings(isolated=True, start=sub) == Settings()
    assert discover_settings(str(tmp_path / "pyproject.toml")).fail_on == "info"


def test_every_key_is_read_and_relative_paths_follow_the_settings_file(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "sub").mkdir(parents=True)
    write_pyproject(root, """\
select = ["NE", "NL101"]
ignore = ["NL103"]
per-module-ignores = {"encoder.layers.*" = ["NE101"]}
fail-on = "warning"
dtype = "bfloat16"
batch-size = 4
rules = ["tools/rules"]
input-axes = "B,S"
config = "configs/model.yaml"
baseline = "normaudit-baseline.json"
targets = ["models/gpt.py", "models/gpt.py:small", "mypkg.models:build",
           {path = "models/unet.py", input-axes = "B,C,H,W", batch-size = 2, dtype = "float16", config = "configs/unet.yaml", checkpoint = "ckpt/unet.safetensors"}]
""")
    monkeypatch.chdir(root / "sub")
    s = discover_settings()
    assert s.source == Path("../pyproject.toml")
    assert (s.select, s.ignore) == (["NE", "NL101"], ["NL103"])
    assert s.per_module_ignores == {"encoder.layers.*": ["NE101"]}
    assert (s.fail_on, s.dtype, s.batch_size, s.input_axes) == ("warning", "bfloat16", 4, "B,S")
    assert s.rules == ["../tools/rules"]
    assert (s.config, s.baseline) == ("../configs/model.yaml", "../normaudit-baseline.json")
    assert s.targets[:3] == ["../models/gpt.py", "../models/gpt.py:small", "mypkg.models:build"]
    unet = s.targets[3]
    assert isinstance(unet, TargetSettings)
    assert (unet.path, unet.input_axes, unet.batch_size, unet.dtype) == ("../models/unet.py", "B,C,H,W", 2, "float16")
    assert (unet.config, unet.checkpoint) == ("../configs/unet.yaml", "../ckpt/unet.safetensors")


def test_flags_override_settings_and_target_tables_override_top_level():
    from normaudit.cli.plan import target_options

    s = Settings.model_validate({"select": ["NE"], "ignore": ["NL"], "dtype": "float16", "batch-size": 8,
                                 "input-axes": "B,S", "config": "c.yaml", "per-module-ignores": {"a.*": ["NE"]}})
    table = TargetSettings.model_validate({"path": "m.py", "dtype": "bfloat16", "input-axes": "B,C,H,W"})
    none = audit_parser().parse_intermixed_args([])
    o = target_options("m.py", none, s, ["r"])
    assert (o.select, o.ignore, o.dtype, o.batch_size, o.input_axes, o.config) == (["NE"], ["NL"], "float16", 8, "B,S",
                                                                                 "c.yaml")
    assert o.per_module_ignores == {"a.*": ["NE"]} and o.rules_dirs == ["r"]
    o = target_options(table, none, s, [])
    assert (o.dtype, o.input_axes, o.batch_size) == ("bfloat16", "B,C,H,W", 8)
    flags = audit_parser().parse_intermixed_args(["--select", "NL", "--ignore", "", "--dtype", "float32",
                                                  "--batch-size", "2", "--input-axes", "B,S,F", "--config", "x.json"])
    o = target_options(table, flags, s, [])
    assert (o.select, o.ignore, o.dtype, o.batch_size, o.input_axes, o.config) == (["NL"], [], "float32", 2, "B,S,F",
                                                                                 "x.json")


# ------------------------------------------------------------------------------------------ end to end
def test_targets_from_settings_are_audited_without_a_target_argument(capsys, project):
    (project / "other.py").write_text((project / "tiny.py").read_text().replace("nn.RMSNorm(d)", "nn.Identity()"))
    write_pyproject(project, """\
targets = ["tiny.py", {path = "other.py", dtype = "bfloat16", batch-size = 3}]
rules = ["testrules"]
select = ["NZ", "NK"]
fail-on = "warning"
dtype = "float16"
""")
    rc, out, _ = run(capsys, "--format", "json")
    assert rc == 1
    doc = json.loads(out)
    got = [(r["target"]["path"], r["target"]["dtype"], r["target"]["batch_size"]) for r in doc["reports"]]
    assert got == [("tiny.py", "float16", 2), ("other.py", "bfloat16", 3)]
    # one target named on the command line keeps its table options, and is a single report
    rc, out, _ = run(capsys, "other.py", "--format", "json")
    assert json.loads(out)["target"]["dtype"] == "bfloat16"
    # select from the settings: only NZ002 (a warning) -> fail-on warning -> 1; the flag overrides -> 0
    (project / "normaudit.toml").write_text('targets = ["tiny.py"]\nrules = ["testrules"]\nselect = ["NZ002"]\n'
                                            'fail-on = "warning"\n')
    assert run(capsys)[0] == 1
    assert run(capsys, "--fail-on", "error")[0] == 0
    assert run(capsys, "--select", "NZ001")[0] == 1


def test_per_module_ignores_drop_matching_findings(capsys, project):
    (project / "normaudit.toml").write_text("""\
targets = ["tiny.py"]
rules = ["testrules"]
select = ["NZ"]
per-module-ignores = {"layers.*" = ["NZ001"], "final" = ["norm-type"], "emb" = ["NZ"]}
""")
    rc, out, _ = run(capsys, "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["findings"] == []
    assert "suppressed 3 finding(s): 3 by per-module-ignores" in doc["notes"]
    (project / "normaudit.toml").write_text('targets = ["tiny.py"]\nrules = ["testrules"]\nselect = ["NZ"]\n'
                                            'per-module-ignores = {"layers.1.*" = ["NZ001"]}\n')
    doc = json.loads(run(capsys, "--format", "json")[1])
    assert sorted(f["module"] for f in doc["findings"]) == ["final", "layers.0.norm"]


def test_settings_config_and_input_axes_reach_the_audit(capsys, project, monkeypatch):
    (project / "cfg.json").write_text('{"layer_norm_eps": 1e-12}')
    (project / "normaudit.toml").write_text('targets = ["tiny.py"]\nconfig = "cfg.json"\nselect = ["NE101"]\n'
                                            'input-axes = "S,B"\n')
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")
    rc, out, _ = run(capsys, "--format", "json")
    doc = json.loads(out)
    assert doc["target"]["config"] == "../cfg.json"
    assert {tuple(s["input_axes"]) for s in doc["sites"]} == {("sequence", "batch", "feature")}
    assert doc["model"]["config_source"] == "cfg.json"
    assert {f["module"] for f in doc["findings"] if f["rule_id"] == "NE101"} >= {"layers.0.norm", "layers.1.norm"}
    assert rc == 1


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("body, expected", [
    ('fail_on = "warning"\n', "pyproject.toml:5: unknown key 'fail_on' (did you mean 'fail-on'?)"),
    ('select = ["NE"]\nexclude = ["x"]\n', "pyproject.toml:6: unknown key 'exclude'; known keys: select, ignore"),
    ('targets = [{path = "m.py", dtyp = "float16"}]\n',
     "pyproject.toml:5: unknown key 'dtyp' in a targets entry (did you mean 'dtype'?)"),
    ('fail-on = "sometimes"\n', "pyproject.toml:5: 'fail-on': Input should be 'error', 'warning', 'info' or 'never'"),
    ('batch-size = 0\n', "pyproject.toml:5: 'batch-size': Input should be greater than 0"),
    ('select = "NE"\n', "pyproject.toml:5: 'select': Input should be a valid list"),
    ('input-axes = "B,Q"\n', "pyproject.toml:5: 'input-axes': Value error, unknown axis 'Q'"),
    ('select = ["NE"\n', "pyproject.toml:5: invalid TOML: Unclosed array"),
    ('[tool.normaudit.per-module-ignores]\n"a.*" = "NE101"\n', "pyproject.toml:6: 'per-module-ignores.a.*': Input should be a valid list"),
])
def test_bad_settings_name_file_line_and_key(tmp_path, body, expected, monkeypatch):
    write_pyproject(tmp_path, body)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        discover_settings()
    assert str(info.value).startswith(expected), str(info.value)


def test_tool_table_in_normaudit_toml_gets_a_hint(tmp_path):
    (tmp_path / "normaudit.toml").write_text('[tool.normaudit]\nselect = ["NE"]\n')
    with pytest.raises(UsageError, match=r"normaudit.toml:1: unknown key 'tool' \(in normaudit.toml write the keys"):
        load_settings(tmp_path / "normaudit.toml")


def test_unknown_key_is_exit_2_from_the_command_line(capsys, project):
    write_pyproject(project, 'targets = ["tiny.py"]\nselct = ["NE"]\n')
    rc, out, err = run(capsys)
    assert rc == 2 and out == ""
    assert err.strip() == "normaudit: error: pyproject.toml:6: unknown key 'selct' (did you mean 'select'?)"


def test_selectors_in_settings_must_name_rules(capsys, project):
    write_pyproject(project, 'targets = ["tiny.py"]\nper-module-ignores = {"x.*" = ["NQ1"]}\n')
    rc, _, err = run(capsys)
    assert rc == 2
    assert err.strip() == ("normaudit: error: pyproject.toml:6: per-module-ignores 'x.*': 'NQ1' matches no rule id, "
                           "id prefix, rule name or category ('normaudit rules' lists them)")


def test_no_target_and_no_settings_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(capsys, "--isolated")
    assert rc == 2 and "no TARGET given, and no 'targets' in a settings file" in err


def test_rules_command_reads_rules_from_settings(capsys, project):
    (project / "normaudit.toml").write_text('rules = ["testrules"]\n')
    rc, out, _ = run(capsys, "rules")
    assert rc == 0 and "NZ001  test-layernorm" in out and "NK901" in out
