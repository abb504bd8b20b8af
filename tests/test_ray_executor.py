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
    crashed = "crash.py: the model's code crashed or ended the Ray worker process while building the model"
    assert remote["errors"] == [{"target": "crash.py", "status": 2, "message": crashed}]
    # Ray's own "(raylet) A worker died ..." (ANSI-coloured) stays off the user's terminal: our line alone
    assert err.splitlines() == [f"normaudit: error: {crashed}"]


def test_ray_timeout_cancels_the_task(ray_cluster, models, capfd):
    rc, out, err = run(capfd, "hang.py", *TEST_RULES, "--executor", "ray", "--timeout", "15")
    assert (rc, out) == (2, "")
    assert err.strip().splitlines() == [
        "normaudit: error: hang.py: timed out after 15 s as a Ray task while building the model (--timeout)"]


def test_ray_driver_quiet_drops_rays_output_and_restores_stdout_and_logging(capfd):
    import logging
    import os

    from normaudit.runner import ray_driver_quiet

    child = logging.getLogger("ray._private.authentication.authentication_token_setup")
    before = (logging.getLogger("ray").level, os.environ.get("RAY_DEDUP_LOGS"))
    with ray_driver_quiet():
        child.warning("Token authentication is enabled for this Ray cluster.")   # ray.init's banner
        print("\x1b[33m(raylet)\x1b[0m A worker died or was killed")            # Ray's error listener
        os.write(1, b"fd 1 from a C extension\n")
        print("normaudit: error: kept", file=sys.stderr)
        assert os.environ["RAY_DEDUP_LOGS"] == "0"
    print("after")
    out, err = capfd.readouterr()
    assert (out, err) == ("after\n", "normaudit: error: kept\n")
    assert (logging.getLogger("ray").level, os.environ.get("RAY_DEDUP_LOGS")) == before


def test_ray_missing_is_one_line(models, capfd, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    rc, out, err = run(capfd, "tiny.py", *TEST_RULES, "--executor", "ray")
    assert (rc, out) == (2, "")
    assert err.strip() == "normaudit: error: --executor ray needs the ray package: pip install 'normaudit[ray]'"


def test_ray_address_with_the_local_executor_is_a_usage_error(models, capfd):
    rc, out, err = run(capfd, "tiny.py", *TEST_RULES, "--executor", "local", "--ray-address", "auto")
    assert (rc, out) == (2, "")
    assert err.strip() == "normaudit: error: --ray-address needs --executor ray"
