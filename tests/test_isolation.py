"""User code in its place: the worker process (timeouts, crashes, exits, phases), locations decided by real
module identity (a checkout named ``normaudit``), outputs that would overwrite the run's inputs, and how
factories are built (meta through ``.item()`` on schedules, ``.cuda()`` on a CPU machine, materialised
builds said with their bytes)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel

from normaudit import cli
from normaudit.errors import UsageError
from normaudit.loaders.pyfile import installed_roots, is_tool_file, is_user_file, load_python_target
from normaudit.phases import phase
from normaudit.worker import WorkerError, run_isolated


class Result(BaseModel):
    value: int


def _isolated(work, timeout: float = 60):
    return run_isolated("models/m.py", work, timeout, Result)


# ------------------------------------------------------------------------------------------------- worker
def test_worker_returns_the_result():
    assert _isolated(lambda: Result(value=7)) == Result(value=7)


def _loop_in(name: str):
    def work():
        phase(name)
        while True:
            pass
    return work


def test_worker_timeout_names_the_phase():
    started = time.monotonic()
    with pytest.raises(UsageError) as info:
        _isolated(_loop_in("capture"), timeout=1)
    assert str(info.value) == "models/m.py: timed out after 1 s while capturing the model (--timeout)"
    assert time.monotonic() - started < 30


def _exit_in_build():
    phase("build")
    os._exit(0)


def _segfault_in_import():
    phase("import")
    os.kill(os.getpid(), signal.SIGSEGV)


def test_worker_hard_exits_and_crashes_are_usage_errors():
    with pytest.raises(UsageError) as info:
        _isolated(_exit_in_build)
    assert str(info.value) == ("models/m.py: the model's code ended the process (exit status 0, as os._exit() "
                               "does) while building the model")
    with pytest.raises(UsageError) as info:
        _isolated(_segfault_in_import)
    assert str(info.value) == "models/m.py: the model's code crashed (SIGSEGV) while importing the model file"


def _raise(exc: BaseException, where: str = "facts"):
    def work():
        phase(where)
        raise exc
    return work


def test_worker_exceptions_travel_back():
    with pytest.raises(UsageError) as info:
        _isolated(_raise(UsageError("bad eps", file="cfg.yaml", line=3)))
    assert str(info.value) == "cfg.yaml:3: bad eps"
    with pytest.raises(UsageError) as info:
        _isolated(_raise(KeyboardInterrupt()))
    raise_line = Path(__file__).read_text().splitlines().index("        raise exc") + 1
    assert str(info.value) == (f"{os.path.relpath(__file__)}:{raise_line}: the model's code raised "
                               "KeyboardInterrupt while deriving the facts and running the probes")
    with pytest.raises(UsageError) as info:
        _isolated(_raise(SystemExit(4), "capture"))
    assert str(info.value) == (f"{os.path.relpath(__file__)}:{raise_line}: the model's code raised SystemExit (4) "
                               "while capturing the model")
    with pytest.raises(WorkerError) as info:
        _isolated(_raise(ValueError("boom")))
    assert (info.value.kind, info.value.text) == ("ValueError", "boom")


def _leaves_a_thread_running():
    import threading

    threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    return Result(value=2)


def test_worker_ends_despite_threads_left_running():
    started = time.monotonic()
    assert _isolated(_leaves_a_thread_running) == Result(value=2)
    assert time.monotonic() - started < 30


def _parallel_op():
    return Result(value=int(torch.ones(1 << 22).exp().sum() > 0))


def test_worker_runs_torch_after_the_parent_used_its_thread_pool():
    """OpenMP's pool does not survive fork(): a worker forked from a process that ran a parallel op (pytest,
    notebooks, normaudit.testing callers) must still run parallel ops instead of hanging."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert float(torch.ones(1 << 22).exp().sum()) > 0  # the parent's pool is started
        assert _isolated(_parallel_op, timeout=60) == Result(value=1)
    finally:
        torch.set_num_threads(threads)


def _noisy():
    print("python print")
    os.write(1, b"fd1 write\n")
    return Result(value=1)


def test_worker_keeps_stdout_for_the_report(capfd):
    assert _isolated(_noisy) == Result(value=1)
    out, err = capfd.readouterr()
    assert out == ""
    assert "python print" in err and "fd1 write" in err


# -------------------------------------------------------------------------------------------- locations
def test_user_files_by_real_roots(tmp_path):
    checkout = tmp_path / "normaudit" / "torch" / "proj"
    checkout.mkdir(parents=True)
    model = checkout / "model.py"
    model.write_text("x = 1\n")
    assert is_user_file(str(model)) and is_user_file(str(model), model)
    assert not is_tool_file(str(model))
    assert not is_user_file(torch.nn.modules.normalization.__file__)
    assert not is_user_file(cli.__file__) and is_tool_file(cli.__file__)
    assert not is_user_file(contextlib.__file__)
    assert not is_user_file("<string>") and is_tool_file("<frozen runpy>")
    # A target installed in site-packages is the user's, with the files beside it (not torch's).
    site_target = Path(json.__file__).parent / "decoder.py"  # stands for a file under an installed root
    assert any(r in site_target.resolve().parents for r in installed_roots())
    assert is_user_file(str(site_target), site_target)
    assert not is_user_file(str(site_target))


LOCATED = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.LayerNorm(16, eps=1e-6)
        self.out = nn.LayerNorm(16, eps=1e-6)

    def forward(self, x):
        return self.out(self.inp(x))


def build_model():
    return Net()


def example_inputs():
    return (torch.randn(2, 4, 16),)
"""


def _run(capsys, *argv):
    rc = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_locations_in_a_checkout_named_normaudit(tmp_path, capsys, monkeypatch):
    """A model under ``.../normaudit/proj/``: findings point at the model file's own lines, and an inline
    suppression there still works."""
    proj = tmp_path / "normaudit" / "proj"
    proj.mkdir(parents=True)
    model, config = proj / "model.py", proj / "config.json"
    model.write_text(LOCATED)
    config.write_text('{"layer_norm_eps": 1e-5}')
    monkeypatch.chdir(proj)
    rc, out, _ = _run(capsys, "model.py", "--config", "config.json", "--format", "json", "--select", "NE101")
    report = json.loads(out)
    assert rc == 1
    assert [(f["rule_id"], f["module"], f["source"]) for f in report["findings"]] == [
        ("NE101", "inp", {"file": str(model.resolve()), "line": 8}),
        ("NE101", "out", {"file": str(model.resolve()), "line": 9})]
    model.write_text(LOCATED.replace("eps=1e-6)\n        self.out", "eps=1e-6)  # normaudit: ignore[NE101]\n"
                                                                     "        self.out"))
    rc, out, _ = _run(capsys, "model.py", "--config", "config.json", "--format", "json", "--select", "NE101")
    assert [(f["module"], f["source"]["line"]) for f in json.loads(out)["findings"]] == [("out", 9)]


# ------------------------------------------------------------------------------- outputs over the inputs
def test_outputs_never_overwrite_the_runs_inputs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text("from torch import nn\ndef build_model():\n    return nn.LayerNorm(4)\n")
    (tmp_path / "cfg.json").write_text('{"layer_norm_eps": 1e-5}')
    (tmp_path / "link.py").symlink_to(tmp_path / "m.py")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    cases = [
        (["m.py", "-o", "m.py"], "m.py: refusing to write the text output over a target of this run"),
        (["m.py", "--format", "json", "-o", "link.py"], "link.py: refusing to write the json output over a target "
                                                        "of this run"),
        (["m.py", "--config", "cfg.json", "--write-baseline", "cfg.json"],
         "cfg.json: refusing to write the baseline over a config of this run"),
    ]
    for argv, message in cases:
        rc, out, err = _run(capsys, *argv)
        assert (rc, out, err) == (2, "", f"normaudit: error: {message}; give another file\n")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# ------------------------------------------------------------------------------------------------ timeout
def test_timeout_flag_and_setting(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop.py").write_text("def build_model():\n    while True:\n        pass\n")
    rc, _, err = _run(capsys, "loop.py", "--timeout", "0")
    assert (rc, err) == (2, "normaudit: error: argument --timeout: must be a positive number of seconds, got 0 "
                            "(see 'normaudit --help')\n")
    (tmp_path / "normaudit.toml").write_text("timeout = 1.5\n")
    rc, _, err = _run(capsys, "loop.py")
    assert (rc, err) == (2, "normaudit: error: loop.py: timed out after 1.5 s while building the model "
                            "(--timeout)\n")
    (tmp_path / "normaudit.toml").write_text("timeout = -1\n")
    rc, _, err = _run(capsys, "loop.py")
    assert rc == 2 and err.startswith("normaudit: error: normaudit.toml:1: ") and "timeout" in err


# ------------------------------------------------------------------------------------------------- builds
def _model_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_drop_path_schedule_builds_on_meta(tmp_path):
    """timm's ``[x.item() for x in torch.linspace(...)]`` and a rotary ``inv_freq`` from ``torch.arange``: the
    model stays on meta (parameters), the schedule-made buffer keeps its real values."""
    path = _model_file(tmp_path, """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self, d=8, depth=3):
                super().__init__()
                self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]
                self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in self.rates)
                self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))

        def build_model():
            return Net()
    """)
    loaded = load_python_target(str(path))
    assert loaded.on_meta and loaded.notes == []
    assert {p.device.type for p in loaded.model.parameters()} == {"meta"}
    assert loaded.model.rates == pytest.approx([0.0, 0.05, 0.1])
    assert torch.equal(loaded.model.inv_freq, 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))


def test_materialised_build_is_said_with_its_bytes(tmp_path, capsys):
    path = _model_file(tmp_path, """
        import torch
        from torch import nn

        def build_model():
            m = nn.LayerNorm(16)
            m.scale = float(torch.rand(1).item())
            return m
    """)
    loaded = load_python_target(str(path))
    note = ("the model was materialised: build_model() could not run on the meta device (RuntimeError: "
            "Tensor.item() cannot be called on meta tensors, line 7), so it was built with real weights: "
            "128 bytes of parameters and buffers")
    assert not loaded.on_meta and loaded.notes == [note]
    assert capsys.readouterr().err == f"normaudit: note: {path}: {note}\n"


def test_cuda_requests_stay_on_meta(tmp_path):
    path = _model_file(tmp_path, """
        import torch
        from torch import nn

        def build_model():
            m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)).cuda()
            m.register_buffer("mask", torch.ones(3, device="cuda"))
            return m.to("cuda", torch.float32)

        def example_inputs():
            return (torch.randn(2, 8).to(device="cuda"),)
    """)
    loaded = load_python_target(str(path))
    assert loaded.on_meta
    assert {t.device.type for t in list(loaded.model.parameters()) + list(loaded.model.buffers())} == {"meta"}
    assert loaded.notes == ["build_model() asked for an accelerator (.cuda(), device='cuda', .to('cuda')): the "
                            "model was kept on the meta device for the audit, which captures on fake CPU tensors",
                            "example_inputs() asked for an accelerator (.to(device='cuda')): the inputs were kept "
                            "on the CPU for the audit"]
    assert loaded.inputs[0].device.type == "cpu"


def test_lowered_recursion_limit_is_restored(tmp_path):
    path = _model_file(tmp_path, """
        import sys
        from torch import nn
        sys.setrecursionlimit(50)

        def build_model():
            sys.setrecursionlimit(60)
            return nn.LayerNorm(4)
    """)
    limit = sys.getrecursionlimit()
    loaded = load_python_target(str(path))
    assert loaded.on_meta and sys.getrecursionlimit() == limit
