"""``--executor ray``: the same per-target work as Ray tasks on a local Ray cluster (one process per task,
timeouts cancelled with ``ray.cancel(force=True)``), the same reports as the local executor, in the targets'
order, and stdout kept for the report. Skipped when ray is not installed (``pip install normaudit[ray]``)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from normaudit.cli import main

TINY = Path(__file__).parent / "fixtures" / "cli" / "tiny.py"
TEST_RULES = ["--rules", str(TINY.parent / "rules"), "--select", "NZ", "--isolated"]


def run(capfd, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster (2 CPUs) for the module; the CLI joins it (ray is initialised) and leaves it up."""
    ray = pytest.importorskip("ray")
    from normaudit.runner import local_ray_options

    ray.init(**local_ray_options(2))
    yield ray
    ray.shutdown()


@pytest.fixture
def models(tmp_path, monkeypatch):
    shutil.copy(TINY, tmp_path / "tiny.py")
    shutil.copy(TINY, tmp_path / "tiny2.py")
    (tmp_path / "crash.py").write_text("import os\n\ndef build_model():\n    os._exit(3)\n")
    (tmp_path / "hang.py").write_text("import time\n\ndef build_model():\n    while True:\n        time.sleep(1)\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _sites_and_findings(doc: dict) -> list:
    return [(r["target"]["path"], [(s["module"], s["kind"], s["eps"]) for s in r["sites"]],
             [(f["rule_id"], f["module"], f["message"]) for f in r["findings"]]) for r in doc["reports"]]


def test_ray_gives_the_local_reports_in_order_and_a_crash_is_its_targets_exit_2(ray_cluster, models, capfd):
    targets = ["tiny.py", "crash.py", "tiny2.py"]
    rc_local, out_local, _ = run(capfd, *targets, *TEST_RULES, "--format", "json")
    rc_ray, out_ray, err = run(capfd, *targets, *TEST_RULES, "--executor", "ray", "--format", "json")
    local, remote = json.loads(out_local), json.loads(out_ray)  # stdout is the JSON document alone
    assert rc_local == rc_ray == 2
    assert _sites_and_findings(remote) == _sites_and_findings(local)
    assert [p for p, _, _ in _sites_and_findings(remote)] == ["tiny.py", "tiny2.py"]
    assert remote["errors"] == [{"target": "crash.py", "status": 2,
                                 "message": "crash.py: the model's code crashed or ended the Ray worker process"}]
    assert "normaudit: error: crash.py: the model's code crashed or ended the Ray worker process" in err.splitlines()


def test_ray_timeout_cancels_the_task(ray_cluster, models, capfd):
    rc, out, err = run(capfd, "hang.py", *TEST_RULES, "--executor", "ray", "--timeout", "15")
    assert (rc, out) == (2, "")
    assert err.strip().splitlines()[-1] == "normaudit: error: hang.py: timed out after 15 s as a Ray task (--timeout)"


def test_ray_missing_is_one_line(models, capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    rc, out, err = run(capfd, "tiny.py", *TEST_RULES, "--executor", "ray")
    assert (rc, out) == (2, "")
    assert err.strip() == "normaudit: error: --executor ray needs the ray package: pip install 'normaudit[ray]'"


def test_ray_address_with_the_local_executor_is_a_usage_error(models, capfd):
    rc, out, err = run(capfd, "tiny.py", *TEST_RULES, "--executor", "local", "--ray-address", "auto")
    assert (rc, out) == (2, "")
    assert err.strip() == "normaudit: error: --ray-address needs --executor ray"
