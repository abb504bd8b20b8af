"""The GitHub Action (``action.yml``): its steps read only inputs it declares and run scripts that exist, and
those scripts, run here with the environment the runner gives them, install what they should (with a stub
for pip) and audit: the SARIF file written, the concise lines printed, the step's outputs in
``$GITHUB_OUTPUT``, the exit status by ``fail-on``."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_sarif import github_upload_problems, schema_errors

ROOT = Path(__file__).resolve().parents[1]
ACTION = ROOT / "action.yml"
RUN = ROOT / "action" / "run.sh"
INSTALL = ROOT / "action" / "install.sh"
EPS = Path(__file__).parent / "fixtures" / "eps"
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="the action's scripts are bash scripts")

NE102_LINES = [
    "models/eps_models.py:78:1: NE102 [warning] layers.3.ln1: eps=1e-05, but 3 of the 4 LayerNorm sites of its "
    "role (constructed at eps_models.py:78) use eps=1e-06",
    "models/eps_models.py:80:1: NE102 [warning] layers.3.ln2: eps=1e-05, but 3 of the 4 LayerNorm sites of its "
    "role (constructed at eps_models.py:80) use eps=1e-06",
    "Found 2 findings: 2 warnings.",
]


# ------------------------------------------------------------------------------------------ action.yml
@pytest.fixture(scope="module")
def action() -> dict:
    return yaml.safe_load(ACTION.read_text(encoding="utf-8"))


def _steps(action: dict) -> dict[str, dict]:
    return {step.get("id") or step["name"]: step for step in action["runs"]["steps"]}


def test_action_is_composite_and_every_input_it_reads_is_declared(action):
    assert action["runs"]["using"] == "composite"
    text = ACTION.read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{\{\s*inputs\.([\w-]+)", text)) | set(re.findall(r"\binputs\.([\w-]+)\s*==", text))
    assert used == set(action["inputs"])
    assert {name: spec.get("default") for name, spec in action["inputs"].items()} == {
        "targets": "", "fail-on": "", "args": "", "working-directory": ".", "sarif-file": "normaudit.sarif",
        "upload": "true", "python-version": "3.12", "torch-version": "2.13.0", "normaudit": "", "pip-install": ""}


def test_each_run_step_runs_a_script_of_the_action_with_the_inputs_it_reads(action):
    """A ``run`` is one script of ``action/``, given its inputs through ``env`` (never spliced into the
    command: an input is data, not shell); every ``INPUT_*`` the step sets is read by its script and every
    ``INPUT_*`` the script reads is set."""
    runs = [step for step in action["runs"]["steps"] if "run" in step]
    assert [s["id"] for s in runs] == ["install", "audit"]
    for step in runs:
        assert "${{" not in step["run"]
        (script,) = re.findall(r'"\$GITHUB_ACTION_PATH/([\w/.-]+)"', step["run"])
        path = ROOT / script
        assert path in (INSTALL, RUN) and path.is_file() and os.access(path, os.X_OK)
        body = path.read_text(encoding="utf-8")
        read = set(re.findall(r"\$\{?(INPUT_\w+)", body))
        assert set(step["env"]) == read, script
        for name, value in step["env"].items():
            assert value == "${{ inputs.%s }}" % name[len("INPUT_"):].lower().replace("_", "-")


def test_setup_python_first_then_install_audit_upload(action):
    steps = action["runs"]["steps"]
    assert steps[0]["uses"].startswith("actions/setup-python@")
    assert steps[0]["with"] == {"python-version": "${{ inputs.python-version }}"}
    upload = steps[-1]
    assert upload["uses"] == "github/codeql-action/upload-sarif@v3"
    assert upload["with"] == {"sarif_file": "${{ steps.audit.outputs.sarif-file }}"}
    assert upload["if"] == "always() && inputs.upload == 'true' && steps.audit.outputs.sarif-file != ''"
    assert "--index-url https://download.pytorch.org/whl/cpu" in INSTALL.read_text(encoding="utf-8")
    assert "pip" not in RUN.read_text(encoding="utf-8")  # the audit step installs nothing


def test_the_action_outputs_are_the_audit_steps_outputs(action):
    written = set(re.findall(r"echo \"?([\w-]+)=|print\(f\"([\w-]+)=", RUN.read_text(encoding="utf-8")))
    written_names = {a or b for a, b in written}
    assert {name: spec["value"] for name, spec in action["outputs"].items()} == {
        name: "${{ steps.audit.outputs.%s }}" % name for name in ("exit-code", "findings", "sarif-file")}
    assert set(action["outputs"]) == written_names


# ------------------------------------------------------------------------------------------ action/run.sh
@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A checkout (``.git``) with two models under ``models/`` and ``[tool.normaudit]`` naming the first."""
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / "models").mkdir()
    for name in ("NE102_1.py", "NE103_1.py", "eps_models.py"):
        shutil.copy(EPS / name, ws / "models" / name)
    (ws / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.normaudit]\n'
                                       'targets = ["models/NE102_1.py"]\nselect = ["NE"]\n')
    return ws


def _run_step(ws: Path, **inputs: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """action/run.sh as the runner starts it (GITHUB_WORKSPACE, GITHUB_OUTPUT, RUNNER_TEMP, the step's
    ``INPUT_*``), with this checkout's normaudit; returns the process and the outputs it wrote."""
    temp = ws.parent / "runner-temp"
    temp.mkdir(exist_ok=True)
    out = ws.parent / "github-output"
    out.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "INPUT_", "RUNNER_"))}
    env.update(GITHUB_WORKSPACE=str(ws), GITHUB_OUTPUT=str(out), RUNNER_TEMP=str(temp), NORMAUDIT_NO_CACHE="1",
               NORMAUDIT_PYTHON=sys.executable, PYTHONPATH=str(ROOT), NO_COLOR="1")
    env.update({"INPUT_" + k.upper(): v for k, v in inputs.items()})
    proc = subprocess.run([BASH, str(RUN)], cwd=ws.parent, env=env, capture_output=True, text=True, timeout=300)
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert list(temp.iterdir()) == []  # its scratch file is gone
    return proc, outputs


def test_the_settings_targets_below_fail_on_print_the_lines_write_sarif_and_pass(workspace):
    proc, outputs = _run_step(workspace)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == NE102_LINES
    sarif = workspace / "normaudit.sarif"
    assert outputs == {"exit-code": "0", "findings": "2", "sarif-file": str(sarif)}
    log = json.loads(sarif.read_text())
    assert schema_errors(log) == [] and github_upload_problems(log, workspace) == []
    assert [(r["ruleId"], r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
             r["locations"][0]["physicalLocation"]["region"]["startLine"]) for r in log["runs"][0]["results"]] == [
        ("NE102", "models/eps_models.py", 78), ("NE102", "models/eps_models.py", 80)]


def test_a_finding_at_fail_on_fails_the_step(workspace):
    proc, outputs = _run_step(workspace, fail_on="warning")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == NE102_LINES
    assert outputs == {"exit-code": "1", "findings": "2", "sarif-file": str(workspace / "normaudit.sarif")}


def test_named_targets_args_working_directory_and_sarif_file(workspace):
    """Targets and args split as a shell does, run from ``models/``, the SARIF into a new folder; NE103 is an
    error, at the default ``fail-on``."""
    proc, outputs = _run_step(workspace, targets="NE103_1.py\n", args="--select 'NE103' --isolated",
                              working_directory="models", sarif_file="out/audit.sarif")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [
        "NE103_1.py:11:1: NE103 [error] zero: LayerNorm uses eps=0.0: a constant row (or channel) has variance 0, "
        "so it divides 0 by 0 and its output is NaN",
        "eps_models.py:54:1: NE103 [error] bare: NoEpsLayerNorm adds no eps to its statistic: a constant row "
        "(or channel) has variance 0, so it divides 0 by 0 and its output is NaN",
        "Found 2 findings: 2 errors.",
    ]
    sarif = workspace / "models" / "out" / "audit.sarif"
    assert outputs == {"exit-code": "1", "findings": "2", "sarif-file": str(sarif)}
    log = json.loads(sarif.read_text())
    assert schema_errors(log) == []
    assert sorted(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                  for r in log["runs"][0]["results"]) == ["models/NE103_1.py", "models/eps_models.py"]


def test_a_bad_input_is_exit_2_with_one_error_line(workspace):
    proc, outputs = _run_step(workspace, targets="'models/NE102_1.py")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "::error title=normaudit::cannot split the targets input: No closing quotation\n"
    assert outputs == {} and not (workspace / "normaudit.sarif").exists()
    proc, outputs = _run_step(workspace, fail_on="sometimes")
    assert proc.returncode == 2 and "--fail-on" in proc.stderr and "Traceback" not in proc.stderr
    assert outputs == {"exit-code": "2"}  # no SARIF: no sarif-file, and the upload step is skipped


# -------------------------------------------------------------------------------------- action/install.sh
def _install_step(tmp_path: Path, **inputs: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """action/install.sh with a ``python`` whose ``-m pip`` only records its arguments (one JSON list a
    line); any other use runs this interpreter."""
    log = tmp_path / "pip.log"
    log.unlink(missing_ok=True)
    stub = tmp_path / "python"
    stub.write_text(f'#!{BASH}\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                    f'  {sys.executable} -c "import json, sys; print(json.dumps(sys.argv[1:]))" "${{@:3}}" >> {log}\n'
                    f'else\n  exec {sys.executable} "$@"\nfi\n')
    stub.chmod(0o755)
    temp = tmp_path / "runner-temp"
    temp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "INPUT_", "RUNNER_"))}
    env.update(RUNNER_TEMP=str(temp), GITHUB_OUTPUT=str(tmp_path / "out"), GITHUB_ACTION_PATH="/actions/normaudit",
               NORMAUDIT_PYTHON=str(stub))
    env.update({"INPUT_" + k.upper(): v for k, v in inputs.items()})
    proc = subprocess.run([BASH, str(INSTALL)], env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


PIP = ["install", "--disable-pip-version-check", "--no-input"]


def test_install_pins_the_cpu_wheel_then_installs_the_action_checkout_under_the_constraint(tmp_path):
    proc, calls = _install_step(tmp_path)
    assert proc.returncode == 0, proc.stderr
    constraints = str(tmp_path / "runner-temp" / "normaudit-constraints.txt")
    assert calls == [PIP + ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cpu"],
                     PIP + ["--constraint", constraints, "/actions/normaudit"]]
    assert Path(constraints).read_text() == "torch==2.13.0\n"
    assert (tmp_path / "out").read_text() == f"constraints={constraints}\n"


def test_install_a_version_of_normaudit_and_the_models_requirements(tmp_path):
    proc, calls = _install_step(tmp_path, torch_version="2.12.1", normaudit="0.1.0",
                                pip_install="-e . 'transformers>=4.40'")
    assert proc.returncode == 0, proc.stderr
    constraints = str(tmp_path / "runner-temp" / "normaudit-constraints.txt")
    assert calls == [PIP + ["torch==2.12.1", "--index-url", "https://download.pytorch.org/whl/cpu"],
                     PIP + ["--constraint", constraints, "normaudit==0.1.0"],
                     PIP + ["--constraint", constraints, "-e", ".", "transformers>=4.40"]]
    assert Path(constraints).read_text() == "torch==2.12.1\n"
    _, calls = _install_step(tmp_path, normaudit="normaudit[hf]>=0.1")
    assert calls[-1] == PIP + ["--constraint", constraints, "normaudit[hf]>=0.1"]
