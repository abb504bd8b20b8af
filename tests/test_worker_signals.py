"""No worker outlives the command: ``python -m normaudit`` auditing models whose ``build_model()`` never
returns, ended by SIGTERM, SIGKILL or SIGINT (a CI job's cancel, ``timeout``, the OOM killer, Ctrl-C). SIGTERM
and SIGINT are one line and the conventional status (128 + the signal: 143, 130); after SIGKILL the kernel ends
the worker (``prctl(PR_SET_PDEATHSIG)``), and where that is not available the worker's watchdog on the pipe
to its parent does. Each model writes its worker's pid to a file before it spins, so the test knows whom
to look for."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from normaudit.worker import can_isolate

pytestmark = pytest.mark.skipif(not can_isolate(), reason="workers are forked only where fork exists")

SPIN = textwrap.dedent("""
    import os

    def build_model():
        with open(os.path.splitext(os.path.abspath(__file__))[0] + ".pid", "w") as f:
            f.write(str(os.getpid()))
        while True:
            pass
""")

#: seconds: a worker must be gone this soon after its parent
GONE_WITHIN = 5.0
#: the normaudit processes a test started (killed at its end if still running)
_STARTED: list[subprocess.Popen] = []


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for init to reap it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_pids(folder: Path, names: list[str], proc: subprocess.Popen) -> list[int]:
    files = [folder / f"{n}.pid" for n in names]
    deadline = time.monotonic() + 120
    while not all(f.exists() and f.read_text() for f in files):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the workers never started building"
        time.sleep(0.1)
    return [int(f.read_text()) for f in files]


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + GONE_WITHIN
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(autouse=True)
def _no_spinning_leftovers(tmp_path):
    """Whatever a test asserts, the spinning workers it started (their pid files) are killed afterwards."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for f in tmp_path.glob("*.pid"):
        with open(f) as fh:
            text = fh.read()
        if text and _alive(int(text)):
            os.kill(int(text), signal.SIGKILL)


def _default_sigint() -> None:
    """Run the command as a terminal's foreground job is run: SIGINT at its default action. A suite started in
    the background (``pytest &`` in a script) inherits SIGINT ignored, and Python keeps an ignored SIGINT
    ignored, so the command would never hear the signal this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, names: list[str], *extra: str) -> subprocess.Popen:
    for n in names:
        (tmp_path / f"{n}.py").write_text(SPIN)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("NORMAUDIT_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "normaudit", *[f"{n}.py" for n in names], "--isolated",
                             "--no-cache", *extra], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=_default_sigint)
    _STARTED.append(proc)
    return proc


@pytest.mark.parametrize("sig, status, line", [
    (signal.SIGTERM, 143, "normaudit: terminated (SIGTERM)"),
    (signal.SIGINT, 130, "normaudit: interrupted"),
    (signal.SIGKILL, -signal.SIGKILL, None),
])
def test_worker_dies_with_the_command(tmp_path, sig, status, line):
    proc = _start(tmp_path, ["spin"])
    (worker,) = _wait_pids(tmp_path, ["spin"], proc)
    assert _alive(worker)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert _gone([worker]), f"worker {worker} outlived normaudit after {sig.name}"
    if line is not None:
        assert out == "" and err.splitlines() == [line]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_parallel_workers_die_with_the_command(tmp_path, sig):
    """``-j 2``: both running workers."""
    proc = _start(tmp_path, ["spin_a", "spin_b"], "-j", "2")
    workers = _wait_pids(tmp_path, ["spin_a", "spin_b"], proc)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
    assert _gone(workers), f"workers {workers} outlived normaudit after {sig.name}"


WATCHDOG_DRIVER = textwrap.dedent("""
    import functools, os, sys, time
    from normaudit import worker

    worker._set_parent_death_signal = lambda: False  # as where prctl does not exist: the watchdog alone

    def spin(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        while True:
            pass

    jobs = [worker.Job(p, functools.partial(spin, p), 600, None).start() for p in sys.argv[1:]]
    time.sleep(600)
""")


def test_watchdog_ends_workers_where_the_kernel_does_not(tmp_path):
    """Without ``PR_SET_PDEATHSIG`` (not Linux), two workers of one parent both end when it is SIGKILLed:
    each closed the other's inherited copy of the parent's pipe end."""
    files = [tmp_path / "a.pid", tmp_path / "b.pid"]
    proc = subprocess.Popen([sys.executable, "-c", WATCHDOG_DRIVER, *map(str, files)], stdin=subprocess.DEVNULL)
    _STARTED.append(proc)
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text() for f in files):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    workers = [int(f.read_text()) for f in files]
    proc.kill()
    proc.wait(30)
    assert _gone(workers), f"workers {workers} outlived their parent"


def test_ray_task_ends_when_the_command_is_terminated(tmp_path):
    """``--executor ray`` (a local cluster): SIGTERM cancels the task (its process ends) and is the same one
    line and status 143, not Ray's own SIGTERM handler (a C++ stack dump, status 1)."""
    pytest.importorskip("ray")
    proc = _start(tmp_path, ["spin"], "--executor", "ray", "-j", "1")
    (worker,) = _wait_pids(tmp_path, ["spin"], proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err.splitlines()) == (143, "", ["normaudit: terminated (SIGTERM)"])
    assert _gone([worker]), f"the Ray task's process {worker} outlived normaudit"
