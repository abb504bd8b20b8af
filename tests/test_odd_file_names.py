"""A model file whose name holds a newline, a terminal escape, a colon, a space or bytes that are not UTF-8
is audited or is exit 2 with one line showing the name escaped; never exit 3. An internal error in a worker
brings the worker's traceback to stderr under ``NORMAUDIT_DEBUG=1``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from normaudit.worker import Job, WorkerError, can_isolate

GOOD = "from torch import nn\n\n\ndef build_model():\n    return nn.LayerNorm(8)\n"
RAISES = "def build_model():\n    raise KeyError('hidden')\n"

#: names that give a report (each file holds GOOD)
GOOD_NAMES = ["new\nline.py", "esc\x1b[31mred.py", "sp ace $x [y].py", "tab\there.py", "bidi\u202etxt.py"]


def _run(args: list, cwd, debug: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("NORMAUDIT_DEBUG", None)
    if debug:
        env["NORMAUDIT_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "normaudit", *args, "--isolated", "--no-cache"], cwd=cwd,
                          capture_output=True, timeout=300, env=env, stdin=subprocess.DEVNULL)


def test_odd_names_are_audited_and_a_failing_one_is_one_escaped_line(tmp_path):
    for name in GOOD_NAMES:
        (tmp_path / name).write_text(GOOD)
    (tmp_path / "rai\nses.py").write_text(RAISES)
    proc = _run([*GOOD_NAMES, "rai\nses.py", "--format", "json"], tmp_path)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "internal error" not in err
    doc = json.loads(proc.stdout)
    assert sorted(r["target"]["path"] for r in doc["reports"]) == sorted(GOOD_NAMES)
    assert [e["status"] for e in doc["errors"]] == [2]
    assert err.splitlines() == ["normaudit: error: rai\\x0ases.py:2: build_model() failed: KeyError: 'hidden'"]


def test_a_name_that_is_not_utf8_is_exit_2_naming_its_bytes(tmp_path):
    name = os.fsdecode(b"caf\xe9.py")  # Latin-1 bytes: not UTF-8
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.py"), "w") as f:
        f.write(GOOD)
    for args, what in (([name], "target"), ([name, "--format", "sarif"], "target"),
                       (["good.py", "--checkpoint", name], "checkpoint")):
        (tmp_path / "good.py").write_text(GOOD)
        proc = _run(args, tmp_path)
        assert (proc.returncode, proc.stdout) == (2, b""), proc.stderr
        assert proc.stderr.decode().splitlines() == [
            f"normaudit: error: caf\\xe9.py: the {what}'s path is not UTF-8 text (byte 0xe9 at offset 3), and "
            "normaudit's reports are: rename it"]


@pytest.mark.skipif(not can_isolate(), reason="workers are forked only where fork exists")
def test_worker_traceback_reaches_the_debug_output(tmp_path, capfd, monkeypatch):
    """An internal error in a worker whose target's name holds a newline: the error keeps its kind and text,
    and with ``NORMAUDIT_DEBUG=1`` the worker's own frames are printed."""
    monkeypatch.setenv("NORMAUDIT_DEBUG", "1")

    def broken_audit():
        raise ZeroDivisionError("inside the worker")

    with pytest.raises(WorkerError) as info:
        Job("new\nline.py", broken_audit, 60, None).start().result()
    assert (info.value.kind, info.value.text) == ("ZeroDivisionError", "inside the worker")
    err = capfd.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken_audit" in err
    assert "ZeroDivisionError: inside the worker" in err


def test_internal_error_through_the_command_keeps_the_worker_frames(tmp_path):
    """The same through ``python -m normaudit`` (a sitecustomize breaks the audit inside the worker only)."""
    (tmp_path / "new\nline.py").write_text(GOOD)
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import normaudit.job as job

        def broken(*args, **kwargs):
            raise ZeroDivisionError("inside the worker")

        job.audit_one = broken
    """))
    env_path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=env_path, PYTHONDONTWRITEBYTECODE="1", NORMAUDIT_DEBUG="1")
    proc = subprocess.run([sys.executable, "-m", "normaudit", "new\nline.py", "--isolated", "--no-cache"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode not in (0, 2), proc.stderr
    assert "in broken" in proc.stderr and "ZeroDivisionError: inside the worker" in proc.stderr
    env.pop("NORMAUDIT_DEBUG")
    proc = subprocess.run([sys.executable, "-m", "normaudit", "new\nline.py", "--isolated", "--no-cache"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 3
    assert proc.stderr.splitlines() == ["normaudit: internal error: ZeroDivisionError: inside the worker (set "
                                        "NORMAUDIT_DEBUG=1 for a traceback)"]


#: a hand-written RMSNorm: a pattern site, whose source lines come from the recorded stack trace
HAND_WRITTEN = textwrap.dedent('''\
    import torch
    from torch import nn


    class RMS(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            v = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(v + self.eps) * self.w


    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.norm = RMS(16)

        def forward(self, x):
            return self.norm(self.lin(x))


    def build_model():
        return M()


    def example_inputs():
        return (torch.randn(2, 16),)
''')


@pytest.mark.parametrize("name", ["new\nline.py", 'qu"ote\nd.py'])
def test_a_hand_written_norm_in_an_odd_name_keeps_its_source_lines(tmp_path, name):
    """The stack trace fx records writes the file name unescaped, so a newline splits its frame over two
    lines; the site's lines still come from it, and the cached second run gives the same report."""
    (tmp_path / name).write_text(HAND_WRITTEN)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", NORMAUDIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NORMAUDIT_DEBUG", None)
    env.pop("NORMAUDIT_NO_CACHE", None)
    reports = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "normaudit", name, "--isolated", "--format", "json"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        reports.append(json.loads(proc.stdout))
    assert reports[0]["sites"] == reports[1]["sites"]
    (site,) = reports[0]["sites"]
    assert (site["module"], site["kind"], site["detected_by"], site["eps"]) == ("norm", "RMSNorm", "pattern", 1e-6)
    assert site["source"]["line"] == 20 and site["call"]["line"] == 23
    assert site["computation"]["line"] == 12
    assert {site[k]["file"] for k in ("source", "call", "computation")} == {str(tmp_path / name)}


def test_trace_frames_reads_a_name_with_a_newline_as_one_frame():
    import traceback

    from normaudit.loaders.pyfile import trace_frames

    summary = traceback.StackSummary.from_list([("/m/a\nb.py", 7, "forward", "return x * s"),
                                                ("/m/c.py", 3, "f", "")])
    frames = trace_frames("".join(summary.format()), user_only=False)
    assert [(f.file, f.line, f.code) for f in frames] == [("/m/a\nb.py", 7, "return x * s"), ("/m/c.py", 3, "")]
    assert trace_frames("not a stack trace\n", user_only=False) == [] and trace_frames(None) == []
