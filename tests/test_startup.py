"""Start-up without torch: ``--help``, ``--version``, ``rules``, ``explain`` and ``schema`` work in a
process where torch (and transformers) cannot be imported at all; an audit answered wholly from the cache
imports neither. Asserts output, not time (benchmarks/bench_speed.py measures the time)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).parent / "fixtures" / "cli" / "tiny.py"

#: Runs normaudit's CLI with torch and transformers made unimportable (None in sys.modules: ImportError).
BLOCKED = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
           "from normaudit.cli import main; rc = main(sys.argv[1:]); "
           "sys.stderr.write('\\nIMPORTED torch=%s transformers=%s\\n' % tuple(str(type(sys.modules.get(m)).__name__)"
           " for m in ('torch', 'transformers'))); raise SystemExit(rc)")


def run_blocked(*argv: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-c", BLOCKED, *argv], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120)


def _check_no_torch(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().endswith("IMPORTED torch=NoneType transformers=NoneType"), proc.stderr


def test_help_and_version_without_torch():
    proc = run_blocked("--help")
    _check_no_torch(proc)
    assert proc.returncode == 0
    assert proc.stdout.startswith("usage: normaudit [-h]")
    assert "--no-cache" in proc.stdout and "-j N, --jobs N" in proc.stdout
    import normaudit

    proc = run_blocked("--version")
    _check_no_torch(proc)
    assert (proc.returncode, proc.stdout) == (0, f"normaudit {normaudit.__version__}\n")


def test_rules_explain_schema_without_torch():
    proc = run_blocked("rules")
    _check_no_torch(proc)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert any(ln.startswith("NE101  eps-differs-from-config") for ln in lines), proc.stdout
    proc = run_blocked("explain", "NE101")
    _check_no_torch(proc)
    assert proc.returncode == 0
    assert proc.stdout.startswith("NE101 eps-differs-from-config  (eps, ")
    assert "## Why it matters" in proc.stdout
    proc = run_blocked("schema")
    _check_no_torch(proc)
    assert proc.returncode == 0
    schema = json.loads(proc.stdout)
    assert {"sites", "findings"} <= set(schema["properties"])


def test_a_bad_flag_without_torch_is_one_line():
    proc = run_blocked("--no-such-flag")
    _check_no_torch(proc)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == ("normaudit: error: unrecognized arguments: --no-such-flag "
                                           "(see 'normaudit --help')")


def test_an_audit_without_torch_is_one_line_exit_3(tmp_path):
    shutil.copy(TINY, tmp_path / "tiny.py")
    proc = run_blocked("tiny.py", "--isolated", cwd=tmp_path, env={"NORMAUDIT_NO_CACHE": "1"})
    _check_no_torch(proc)
    assert proc.returncode == 3
    assert proc.stderr.splitlines()[0] == ("normaudit: internal error: ModuleNotFoundError: import of torch halted; "
                                           "None in sys.modules (set NORMAUDIT_DEBUG=1 for a traceback)")


def test_a_run_answered_from_the_cache_imports_no_torch(tmp_path):
    """The first run audits (torch); the second, with torch unimportable, is answered from the cache with the
    same report. Another edit of normaudit's source or rules between the two runs (a checkout being worked on)
    is rightly a miss, which fails the second run with exit 3 only: then the pair is run again (3 tries)."""
    shutil.copy(TINY, tmp_path / "tiny.py")
    shutil.copytree(TINY.parent / "rules", tmp_path / "rules")
    env = {"NORMAUDIT_CACHE_DIR": str(tmp_path / "cache"), "NORMAUDIT_NO_CACHE": "", "PYTHONPATH": str(ROOT)}
    argv = ["tiny.py", "--rules", "rules", "--select", "NZ", "--isolated", "--format", "json"]
    for _ in range(3):
        first = subprocess.run([sys.executable, "-m", "normaudit", *argv], cwd=tmp_path,
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert first.returncode == 1, first.stderr
        second = run_blocked(*argv, cwd=tmp_path, env=env)
        _check_no_torch(second)
        if second.returncode != 3:
            break
        assert "import of torch halted" in second.stderr  # a miss: the key changed between the runs
    assert second.returncode == 1
    assert second.stdout == first.stdout
    assert [s["module"] for s in json.loads(second.stdout)["sites"]] == ["layers.0.norm", "layers.1.norm", "final"]


@pytest.mark.parametrize("where", ["flag", "settings"])
def test_a_run_answered_from_the_cache_imports_no_torch_with_input_axes(tmp_path, where):
    """``--input-axes`` (or ``input-axes`` in the settings) is checked by a torch-free parser: the cached run
    still imports no torch (the capture's parser in normaudit.facts.axes imports torch and the capture)."""
    shutil.copy(TINY, tmp_path / "tiny.py")
    shutil.copytree(TINY.parent / "rules", tmp_path / "rules")
    env = {"NORMAUDIT_CACHE_DIR": str(tmp_path / "cache"), "NORMAUDIT_NO_CACHE": "", "PYTHONPATH": str(ROOT)}
    argv = ["tiny.py", "--rules", "rules", "--select", "NZ", "--format", "json"]
    if where == "flag":
        argv += ["--isolated", "--input-axes", "B,S"]
    else:
        (tmp_path / "normaudit.toml").write_text('input-axes = "batch,sequence"\n')
    for _ in range(3):
        first = subprocess.run([sys.executable, "-m", "normaudit", *argv], cwd=tmp_path,
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
        assert first.returncode == 1, first.stderr
        second = run_blocked(*argv, cwd=tmp_path, env=env)
        _check_no_torch(second)
        if second.returncode != 3:
            break
    assert (second.returncode, second.stdout) == (1, first.stdout)


def test_the_axis_vocabulary_is_the_report_s_and_the_flag_parses_without_torch():
    import typing

    from normaudit.report import AxisLabel
    from normaudit.vocabulary.axes import AXIS_LABELS, parse_axis_spec

    assert AXIS_LABELS == typing.get_args(AxisLabel)
    assert parse_axis_spec("B, s,c ,H,W") == ["batch", "sequence", "channel", "height", "width"]
    assert parse_axis_spec("batch,feature") == ["batch", "feature"]
    for spec, error in (("", "no axes given"), ("B,,C", "empty axis in 'B,,C'"), ("B,X", "unknown axis 'X'")):
        with pytest.raises(ValueError, match=re.escape(error)):
            parse_axis_spec(spec)
    out = subprocess.run([sys.executable, "-c", "import sys, normaudit.vocabulary.axes; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


#: Runs the command's entry point (``normaudit.cli.run``, what the console script and ``python -m normaudit``
#: call) on argv, with an atexit handler and a module-level object whose ``__del__`` only a full interpreter
#: teardown runs.
_ENTRY = ("import atexit, sys\n"
          "class Witness:\n"
          "    def __del__(self): sys.stderr.write('TEARDOWN RAN\\n')\n"
          "w = Witness()\n"
          "atexit.register(lambda: sys.stderr.write('ATEXIT RAN\\n'))\n"
          "from normaudit.cli import run\n"
          "sys.argv = ['normaudit', *sys.argv[1:]]\n"
          "run()\n")


def test_the_command_skips_the_interpreter_teardown_but_loses_no_output(tmp_path):
    """After an audit (torch imported) the command leaves with os._exit: the atexit handlers still run and
    stdout and the -o file are complete, but the module teardown (~1.5-2 s with torch and transformers) is
    skipped; the exit status is main's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-c", _ENTRY, str(TINY), "--format", "json", "--no-cache"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(s["module"], s["eps"]) for s in report["sites"]] == [
        ("layers.0.norm", 1e-05), ("layers.1.norm", 1e-05), ("final", 1.1920928955078125e-07)]
    assert "ATEXIT RAN" in proc.stderr and "TEARDOWN RAN" not in proc.stderr
    proc = subprocess.run([sys.executable, "-c", _ENTRY, str(TINY), "--no-cache", "--format", "json", "-o", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["summary"]["sites"] == 3


def test_the_command_exits_normally_where_torch_was_never_imported(tmp_path):
    """``--version`` imports no torch: nothing to save, a normal exit (the teardown runs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _ENTRY, "--version"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    import normaudit

    assert (proc.returncode, proc.stdout) == (0, f"normaudit {normaudit.__version__}\n")
    assert "ATEXIT RAN" in proc.stderr and "TEARDOWN RAN" in proc.stderr


#: In a fresh process: count the scans of transformers' models/ folder while ``import transformers`` (through
#: normaudit's loader; plainly with argv[1] == "plain") and then ``transformers.models`` run; print the
#: count and whether the mapping transformers.models was given equals a fresh scan's.
MODELS_SCAN = r"""
import json, os, sys
real = os.scandir
seen = []
def counting(path='.'):
    seen.append(os.path.normpath(os.fspath(path)))
    return real(path)
os.scandir = counting
import transformers
if sys.argv[1] != "plain":
    from normaudit.loaders.hf import _transformers
    _transformers()
import transformers.models.auto.configuration_auto
iu = transformers.utils.import_utils
models = os.path.join(os.path.dirname(transformers.__file__), "models")
scans = seen.count(models)
original = getattr(iu.define_import_structure, "__wrapped__", iu.define_import_structure)
given = original(models)  # the lru_cache holds the scan under this key: what transformers.models got
iu.create_import_structure_from_path.cache_clear()
fresh = original(os.path.join(models, "__init__.py"))  # a new scan, as models/__init__.py asks for it
norm = lambda x: ({str(sorted(k)) if isinstance(k, frozenset) else str(k): norm(v) for k, v in x.items()}
                  if isinstance(x, dict) else sorted(map(str, x)))
folders = {name.split(".")[0] for modules in given.values() for name in modules}
print(json.dumps({"scans": scans, "same": norm(given) == norm(fresh), "folders": len(folders)}))
"""


def test_transformers_scans_its_models_folder_once_and_gets_the_same_mapping():
    """transformers reads every file of models/ at ``import transformers`` and again at ``transformers.models``
    (an lru_cache miss: a Path key, then a str one). Through normaudit's loader (share_models_scan) the second
    import reuses the first scan: the folder is listed once, not twice, and the mapping is that of a fresh scan."""
    import pytest

    pytest.importorskip("transformers")
    proc = subprocess.run([sys.executable, "-c", MODELS_SCAN, "shared"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["scans"] == 1  # "plain" (transformers 5.24 alone): 2
    assert out["same"] is True
    assert out["folders"] > 400  # every model folder (~550 in 5.24)
