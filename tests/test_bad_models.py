"""Every hostile or broken model file of ``../shared/bad-inputs/models`` (copied into tests/data/bad_models, so
the suite runs without ../shared) through the command line, as its README says: a report (exit 0/1, stdout
exactly the JSON report), or exit 2 with exactly one ``normaudit: error:`` line naming the file and no
traceback; never exit 3 or a hang; nothing written beside the models.

Starting Python and torch costs seconds per process, so one driver process imports normaudit once and forks
a fresh child per file (after one warm-up audit) that runs the real ``normaudit.cli.main`` with its own stdout/stderr (the audit then
forks its worker as the installed command does); two tests run ``python -m normaudit`` itself. The copies
sit in a folder named ``normaudit`` (locations must not depend on the path's names).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODELS = Path(__file__).parent / "data" / "bad_models"
TIMEOUT = 3  # --timeout for the endless loops (seconds)

#: Files that give a report, with their extra arguments.
REPORTS = {"prints.py": [], "prints_fd.py": [], "latin1.py": [], "low_recursion.py": [],
           "cnn_suppress.py": ["--batch-size", "1"]}

#: Files that are exit 2, with the one error line each must give (cwd: the folder above models/).
ERRORS = {
    "bad_inputs.py": "models/bad_inputs.py: example_inputs() returned int; return a tuple or a dict",
    "empty.py": "models/empty.py: no callable build_model() (define one, or name the factory as FILE.py:NAME)",
    "factory_not_callable.py": "models/factory_not_callable.py: no callable build_model() (define one, or name "
                               "the factory as FILE.py:NAME)",
    "inputs_not_callable.py": "models/inputs_not_callable.py: example_inputs is not a function (it is a int "
                              "object): define example_inputs() returning a tuple or a dict of inputs",
    "kbint.py": "models/kbint.py:5: build_model() failed: KeyboardInterrupt",
    "memerr.py": "models/memerr.py:5: build_model() failed: MemoryError: boom",
    "nonutf8.py": "models/nonutf8.py: import failed: SyntaxError: source code string cannot contain null bytes",
    "os_exit.py": "models/os_exit.py: the model's code ended the process (exit status 0, as os._exit() does) "
                  "while building the model",
    "raises.py": "models/raises.py:7: build_model() failed: KeyError: 'hidden'",
    "recerr.py": "models/recerr.py:5: build_model() failed: RecursionError",
    "returns_int.py": "models/returns_int.py: build_model() returned int, not a torch.nn.Module",
    "segv.py": "models/segv.py: the model's code crashed (SIGSEGV) while building the model",
    "str_raises.py": "models/str_raises.py:8: build_model() failed: E: (its message cannot be shown: E.__str__ "
                     "raised)",
    "syntax_error.py": "models/syntax_error.py:4: import failed: SyntaxError: invalid syntax (syntax_error.py, "
                       "line 4)",
    "sysexit0.py": "models/sysexit0.py:6: build_model() failed: SystemExit: 0",
    "sysexit_import.py": "models/sysexit_import.py:2: import failed: SystemExit: 0",
    "sysexit_msg.py": "models/sysexit_msg.py:6: build_model() failed: SystemExit: bye",
    "wrong_shape_inputs.py": "models/wrong_shape_inputs.py: the model's forward fails on its example_inputs(): "
                             "RuntimeError: Given normalized_shape=[8], expected input with shape [8], but got "
                             "input of size torch.Size([2, 9]) (raised in torch.nn LayerNorm)",
    "loops.py": f"models/loops.py: timed out after {TIMEOUT} s while building the model (--timeout)",
    "loops_forward.py": f"models/loops_forward.py: timed out after {TIMEOUT} s while capturing the model "
                        "(--timeout)",
    "sleeps_import.py": f"models/sleeps_import.py: timed out after {TIMEOUT} s while importing the model file "
                        "(--timeout)",
}
LOOPS = ("loops.py", "loops_forward.py", "sleeps_import.py")

DRIVER = textwrap.dedent("""
    import json, os, signal, sys, time
    import torch
    from normaudit.cli import main
    from normaudit.testing import assert_norms_ok

    # Import what an audit imports (torch.export, the rules, the renderers) once, before the forks.
    assert_norms_ok(torch.nn.LayerNorm(8), (torch.randn(2, 8),), fail_on="never")

    work, cases = sys.argv[1], json.loads(sys.argv[2])
    results = {}
    for name, argv, limit in cases:
        out, err = os.path.join(work, "..", name + ".out"), os.path.join(work, "..", name + ".err")
        sys.stdout.flush(); sys.stderr.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.chdir(work)
            fd_out, fd_err = os.open(out, os.O_WRONLY | os.O_CREAT), os.open(err, os.O_WRONLY | os.O_CREAT)
            os.dup2(fd_out, 1); os.dup2(fd_err, 2)
            rc = 3
            try:
                rc = main(argv)
            finally:
                sys.stdout.flush(); sys.stderr.flush()
                os._exit(rc)
        status = None
        while time.monotonic() - started < limit:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL); os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status) if status is not None else "hang"
        results[name] = {"rc": code, "stdout": open(out).read(), "stderr": open(err).read(),
                         "seconds": round(time.monotonic() - started, 2)}
    print(json.dumps(results))
""")


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def _cases() -> list[list]:
    names = sorted(p.name for p in MODELS.glob("*.py"))
    assert set(names) == set(REPORTS) | set(ERRORS), "every copied model file has an expectation"
    cases = []
    for name in names:
        argv = [f"models/{name}", "--format", "json", *REPORTS.get(name, [])]
        if name in LOOPS:
            argv += ["--timeout", str(TIMEOUT)]
        cases.append([name, argv, 120])
    return cases


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """Every model file run through ``normaudit.cli.main`` in a fresh forked process: name -> rc, stdout, stderr."""
    root = tmp_path_factory.mktemp("bad") / "normaudit" / "proj"
    models = root / "models"
    shutil.copytree(MODELS, models)
    before = _listing(models)
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(root), json.dumps(_cases())], capture_output=True,
                          text=True, timeout=900, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    return results, before, _listing(models), models


def test_nothing_is_written_beside_the_models(bad_runs):
    _, before, after, _ = bad_runs
    assert after == before


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_bad_model_is_exit_2_with_one_line(bad_runs, name):
    result = bad_runs[0][name]
    assert result["rc"] == 2, result
    assert result["stdout"] == ""
    assert "Traceback" not in result["stderr"]
    errors = [line for line in result["stderr"].splitlines() if line.startswith("normaudit: error:")]
    assert errors == [f"normaudit: error: {ERRORS[name]}"]


@pytest.mark.parametrize("name", LOOPS)
def test_endless_user_code_ends_at_the_timeout(bad_runs, name):
    assert TIMEOUT <= bad_runs[0][name]["seconds"] < TIMEOUT + 60


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_odd_but_valid_model_gives_a_report(bad_runs, name):
    result = bad_runs[0][name]
    assert result["rc"] in (0, 1), result
    assert "Traceback" not in result["stderr"]
    report = json.loads(result["stdout"])  # stdout is exactly the report
    assert report["target"]["path"] == f"models/{name}"
    assert report["summary"]["sites"] >= 1


def test_user_prints_go_to_stderr(bad_runs):
    results = bad_runs[0]
    for text in ("hello from import", "to stderr at import", "hello from __init__", "hello from build_model",
                 "hello from example_inputs"):
        assert text in results["prints.py"]["stderr"]
    for text in ("raw fd1 write at import", "subprocess-echo-at-build", "raw fd1 write in forward"):
        assert text in results["prints_fd.py"]["stderr"]


def test_lowered_recursion_limit_is_audited(bad_runs):
    report = json.loads(bad_runs[0]["low_recursion.py"]["stdout"])
    assert [(s["module"], s["kind"], s["eps"]) for s in report["sites"]] == [("", "LayerNorm", 1e-05)]


def test_suppression_on_the_last_line_of_a_sequential(bad_runs):
    results, _, _, models = bad_runs
    report = json.loads(results["cnn_suppress.py"]["stdout"])
    nb101 = sorted((f["module"], f["source"]["line"]) for f in report["findings"] if f["rule_id"] == "NB101")
    assert nb101 == [("features.1", 10), ("features.4", 11)]
    assert all(f["source"]["file"] == str(models / "cnn_suppress.py") for f in report["findings"] if f["source"])


def test_installed_command_segfault_and_timeout(tmp_path):
    """``python -m normaudit`` itself: a segfault in build_model and an endless forward are exit 2, one line."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("segv.py", "loops_forward.py"):
        shutil.copy(MODELS / name, models / name)
    for name, extra in (("segv.py", []), ("loops_forward.py", ["--timeout", str(TIMEOUT)])):
        proc = subprocess.run([sys.executable, "-m", "normaudit", f"models/{name}", "--format", "json", *extra],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"normaudit: error: {ERRORS[name]}\n")
