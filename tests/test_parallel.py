"""``-j N``: targets audited in parallel worker processes (normaudit.runner), each isolated (one target's crash
or timeout is that target's exit 2, the others go on), the output in the targets' order, a progress line on
stderr only when stderr is a terminal."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from normaudit.cli import audit_command, main

TINY = Path(__file__).parent / "fixtures" / "cli" / "tiny.py"
TEST_RULES = ["--rules", str(TINY.parent / "rules"), "--select", "NZ", "--isolated"]

CRASH = textwrap.dedent('''
    import os
    def build_model():
        os._exit(3)
''')

HANG = textwrap.dedent('''
    import time
    def build_model():
        while True:
            time.sleep(1)
''')

#: Two models that each wait for the other to have started building: both finish only when they run at once.
RENDEZVOUS = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny import build_model as _tiny, example_inputs

    def build_model():
        here = Path(__file__).parent
        (here / "{me}.started").write_text("")
        while not (here / "{other}.started").exists():
            time.sleep(0.05)
        return _tiny()
''')


def run(capfd, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return rc, out, err


@pytest.fixture
def models(tmp_path):
    shutil.copy(TINY, tmp_path / "tiny.py")
    shutil.copy(TINY, tmp_path / "tiny2.py")
    (tmp_path / "crash.py").write_text(CRASH)
    (tmp_path / "hang.py").write_text(HANG)
    (tmp_path / "a.py").write_text(RENDEZVOUS.format(me="a", other="b"))
    (tmp_path / "b.py").write_text(RENDEZVOUS.format(me="b", other="a"))
    return tmp_path


def _sites_and_findings(doc: dict) -> list:
    return [(r["target"]["path"], [(s["module"], s["kind"], s["eps"]) for s in r["sites"]],
             [(f["rule_id"], f["module"]) for f in r["findings"]]) for r in doc["reports"]]


def test_crash_and_timeout_are_their_targets_exit_2_and_the_others_go_on_in_order(models, capfd):
    targets = [models / "crash.py", models / "tiny.py", models / "hang.py", models / "tiny2.py"]
    rc, out, err = run(capfd, *targets, *TEST_RULES, "-j", "4", "--timeout", "15", "--format", "json")
    doc = json.loads(out)
    assert rc == 2
    assert [Path(r["target"]["path"]).name for r in doc["reports"]] == ["tiny.py", "tiny2.py"]
    assert [(Path(e["target"]).name, e["status"]) for e in doc["errors"]] == [("crash.py", 2), ("hang.py", 2)]
    assert doc["errors"][0]["message"] == (f"{models / 'crash.py'}: the model's code ended the process "
                                           "(exit status 3, as os._exit() does) while building the model")
    assert doc["errors"][1]["message"] == (f"{models / 'hang.py'}: timed out after 15 s while building the "
                                           "model (--timeout)")
    errors = [ln for ln in err.splitlines() if ln.startswith("normaudit: error:")]
    assert errors == [f"normaudit: error: {e['message']}" for e in doc["errors"]]  # in the targets' order
    assert doc["summary"] == {"targets": 4, "failed": 2, "errors": 4, "warnings": 2, "infos": 0}


def test_parallel_output_is_the_serial_output(models, capfd):
    targets = [models / "tiny.py", models / "tiny2.py", TINY]
    rc1, out1, _ = run(capfd, *targets, *TEST_RULES, "-j", "1", "--format", "json")
    rc3, out3, _ = run(capfd, *targets, *TEST_RULES, "-j", "3", "--format", "json")
    assert rc1 == rc3 == 1
    serial, parallel = json.loads(out1), json.loads(out3)
    assert _sites_and_findings(parallel) == _sites_and_findings(serial)
    assert [Path(p).name for p, _, _ in _sites_and_findings(parallel)] == ["tiny.py", "tiny2.py", "tiny.py"]
    assert _sites_and_findings(parallel)[0][1] == [("layers.0.norm", "LayerNorm", 1e-5),
                                                   ("layers.1.norm", "LayerNorm", 1e-5), ("final", "RMSNorm", 2.0 ** -23)]  # eps=None: finfo(float32).eps


def test_two_jobs_run_at_the_same_time(models, capfd):
    """a.py and b.py each wait for the other to start: with -j 2 both finish; with -j 1 a times out building (b
    never started while it waited)."""
    rc, out, err = run(capfd, models / "a.py", models / "b.py", *TEST_RULES, "-j", "2", "--timeout", "60",
                       "--format", "json")
    assert rc == 1, err
    assert json.loads(out)["summary"]["failed"] == 0
    for name in ("a", "b"):
        (models / f"{name}.started").unlink()
    rc, out, err = run(capfd, models / "a.py", models / "b.py", *TEST_RULES, "-j", "1", "--timeout", "5",
                       "--format", "json")
    doc = json.loads(out)
    assert rc == 2
    assert doc["errors"][0]["message"] == f"{models / 'a.py'}: timed out after 5 s while building the model (--timeout)"


def test_progress_lines_only_when_stderr_is_a_terminal(models, capfd, monkeypatch):
    targets = [models / "tiny.py", models / "crash.py"]
    _, _, err = run(capfd, *targets, *TEST_RULES, "-j", "2")
    assert not [ln for ln in err.splitlines() if ln.startswith("normaudit: [")]
    monkeypatch.setattr(audit_command, "_stderr_is_tty", lambda: True)
    _, _, err = run(capfd, *targets, *TEST_RULES, "-j", "2")
    progress = sorted(ln.rsplit(" (", 1)[0] for ln in err.splitlines() if ln.startswith("normaudit: ["))
    assert len(progress) == 2
    assert {p.split("] ", 1)[1] for p in progress} == {f"{models / 'tiny.py'}: 2 error(s), 1 warning(s), 0 info",
                                                      f"{models / 'crash.py'}: failed"}
    assert sorted(p.split("]")[0] for p in progress) == ["normaudit: [1/2", "normaudit: [2/2"]


def test_jobs_must_be_positive(capfd):
    rc, _, err = run(capfd, TINY, "-j", "0")
    assert rc == 2
    assert err.strip() == "normaudit: error: argument -j/--jobs: must be at least 1, got 0 (see 'normaudit --help')"


#: In a fresh process: prewarm the targets given, then print which transformers modelling modules it imported.
PREWARM = ("import json, sys; from normaudit.runner import prewarm, shared_model_types; targets = sys.argv[1:]; "
           "prewarm(targets); print(json.dumps([shared_model_types(targets), sorted(m for m in sys.modules "
           "if m.startswith('transformers.models.') and '.modeling_' in m)]))")


def test_prewarm_imports_the_modelling_module_of_a_model_type_two_targets_share(tmp_path):
    """Several Hugging Face targets of one model_type: the parent imports its modelling module once before
    the forks (each worker would import it again); a type only one target has, an unknown type, a config that
    is not JSON and a FIFO named config.json import nothing and raise nothing (their workers report them)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("transformers")
    gpt2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 99, "n_positions": 64}
    targets = []
    for name, config in (("a", gpt2), ("b", gpt2), ("c", {**gpt2, "model_type": "bert"}),
                         ("d", {"model_type": "no-such-type"}), ("e", {"model_type": "no-such-type"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        targets.append(str(tmp_path / name))
    (tmp_path / "bad.json").write_text("{not json")
    os.mkfifo(tmp_path / "fifo.json")
    targets += [str(tmp_path / "bad.json"), str(tmp_path / "fifo.json")]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", PREWARM, *targets], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    shared, imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert shared == ["gpt2", "no-such-type"]
    assert "transformers.models.gpt2.modeling_gpt2" in imported
    assert not any("bert" in m for m in imported)  # one target only: its worker imports it, no gain here


#: In a fresh process: prewarm the targets given, then print whether torch.export's tracer was imported.
PREWARM_EXPORT = ("import sys; from normaudit.runner import prewarm; prewarm(sys.argv[1:]); "
                  "print('torch.export._trace' in sys.modules)")


@pytest.mark.parametrize("kind, expected", [("model.py", "True"), ("weights.safetensors", "False")])
def test_prewarm_imports_the_export_tracer_for_model_targets_only(tmp_path, kind, expected):
    """torch.export imports ``torch.export._trace`` on its first call (~0.3 s of CPU): the parent imports it
    before the forks for any target that is captured (a model file), so each worker does not import it again;
    a checkpoint-only run captures nothing and imports no tracer."""
    import os
    import subprocess
    import sys

    target = tmp_path / kind
    target.write_text("")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", PREWARM_EXPORT, str(target)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == expected


def test_imports_before_the_fork_run_with_the_collector_off_and_land_in_the_oldest_generation():
    """``collection_paused`` (the parent's imports before the forks): no collection runs inside, the
    objects made inside are in generation 2 afterwards (no collection has to walk them as young ones) and the
    collector's state on entry is restored (on, or off)."""
    import gc

    from normaudit.worker import collection_paused

    assert gc.isenabled()
    collected = []
    callback = lambda phase, info: collected.append(info["generation"]) if phase == "start" else None  # noqa: E731
    gc.callbacks.append(callback)
    try:
        with collection_paused():
            assert not gc.isenabled()
            made = [[i] for i in range(20000)]  # 20000 tracked lists: ~28 gen-0 thresholds
        assert collected == []
        assert gc.isenabled()
        assert gc.get_count()[0] < 5
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert id(made) in oldest and id(made[-1]) in oldest
        gc.disable()
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.callbacks.remove(callback)
    assert gc.get_freeze_count() == 0


class _Frozen(BaseModel):
    at_start: int
    after_phase: int
    made_before_phase: bool


def _frozen_counts() -> _Frozen:
    import gc

    from normaudit.phases import phase

    at_start = gc.get_freeze_count()
    made = [[i] for i in range(5000)]
    phase("build")
    frozen = gc.get_freeze_count()
    return _Frozen(at_start=at_start, after_phase=frozen, made_before_phase=frozen >= at_start + len(made))


def test_a_worker_starts_with_the_parents_objects_frozen_and_freezes_at_each_phase():
    """A forked worker's collections never walk what it inherited: the parent freezes its heap just before the
    fork and unfreezes it just after (its own collector is unchanged), so the worker starts with every object
    of the parent in the permanent generation; each new phase of the worker freezes what was made before it."""
    import gc

    from normaudit.worker import Job

    tracked = len(gc.get_objects())
    out = Job("t", _frozen_counts, 60, _Frozen).start().result()
    assert gc.get_freeze_count() == 0  # the parent unfroze
    assert out.at_start >= tracked * 0.9
    assert out.after_phase > out.at_start
    assert out.made_before_phase
