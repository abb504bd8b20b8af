"""Every read is bounded by the size a regular file declares, and a FIFO, a device or a link to one is
refused wherever it appears (target, shard, directory member, config, settings, baseline), never opened for
reading: one ``normaudit: error:`` line saying what was found, at once. The result cache's fingerprint of a
target does not read such a file either (a weights directory whose shard links to ``/dev/zero`` once read
until the kernel killed the process)."""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from normaudit.cache import file_fingerprint, path_fingerprint
from normaudit.cli import main

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/zero") or not hasattr(os, "mkfifo"),
                                reason="needs /dev/zero and named pipes")

MODEL = "from torch import nn\n\n\ndef build_model():\n    return nn.LayerNorm(8)\n"
DEVZERO = "expected a regular file, found a character device (a symbolic link to '/dev/zero')"
FIFO = "expected a regular file, found a FIFO (named pipe)"


@pytest.fixture(autouse=True)
def _alarm():
    """A read that blocks (a FIFO) or never ends (/dev/zero) fails the test instead of hanging it."""
    def stop(signum, frame):
        raise TimeoutError("a read did not end")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _error(capsys, argv: list[str]) -> str:
    rc = main([*map(str, argv), "--isolated"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("normaudit: error: "), err
    return lines[0][len("normaudit: error: "):]


def _weights(path: Path) -> None:
    save_file({"norm.weight": torch.ones(4)}, str(path))


def test_fingerprint_never_reads_a_device_or_a_fifo(tmp_path):
    os.symlink("/dev/zero", tmp_path / "zero.safetensors")
    os.mkfifo(tmp_path / "pipe.bin")
    _weights(tmp_path / "model.safetensors")
    assert file_fingerprint(tmp_path / "zero.safetensors") is None
    assert file_fingerprint(tmp_path / "pipe.bin") is None
    found = path_fingerprint(str(tmp_path))
    assert found["zero.safetensors"] is None and found["pipe.bin"] is None and found["model.safetensors"]


def test_weights_directory_whose_shard_is_dev_zero_through_the_command(tmp_path):
    """The command itself, with the result cache on (its key fingerprints the directory), under an 8 GiB
    address-space limit: exit 2 at once, not a process the kernel kills."""
    d = tmp_path / "shard_devzero"
    d.mkdir()
    os.symlink("/dev/zero", d / "model-00001-of-00001.safetensors")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"norm.weight": "model-00001-of-00001.safetensors"}}))
    env = dict(os.environ, NORMAUDIT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("NORMAUDIT_DEBUG", None)
    env.pop("NORMAUDIT_NO_CACHE", None)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    proc = subprocess.run([sys.executable, "-m", "normaudit", "shard_devzero", "--timeout", "30"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env, preexec_fn=limit)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        "normaudit: error: shard_devzero/model.safetensors.index.json: checkpoint index names shard "
        f"'model-00001-of-00001.safetensors' (holding 1 tensor): cannot read checkpoint shard: {DEVZERO}"]


def test_directory_member_that_is_a_device_or_fifo(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "wd"
    d.mkdir()
    _weights(d / "model.safetensors")
    os.symlink("/dev/zero", d / "extra.safetensors")
    assert _error(capsys, ["wd"]) == f"wd/extra.safetensors: cannot read checkpoint directory member: {DEVZERO}"
    (d / "extra.safetensors").unlink()
    os.mkfifo(d / "optimizer.bin")
    (tmp_path / "net.py").write_text(MODEL)
    assert _error(capsys, ["net.py", "--checkpoint", "wd"]) == (
        f"wd/optimizer.bin: cannot read checkpoint directory member: {FIFO}")
    (d / "optimizer.bin").unlink()
    os.mkfifo(d / "config.json")
    assert _error(capsys, ["wd"]) == f"wd/config.json: cannot read checkpoint directory member: {FIFO}"


def test_model_file_that_is_a_device_or_fifo(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("/dev/zero", tmp_path / "zero.py")
    os.mkfifo(tmp_path / "pipe.py")
    os.symlink("/dev/zero", tmp_path / "zero")
    assert _error(capsys, ["zero.py"]) == f"zero.py: cannot read model file: {DEVZERO}"
    assert _error(capsys, ["pipe.py"]) == f"pipe.py: cannot read model file: {FIFO}"
    assert _error(capsys, ["zero"]) == f"zero: cannot read target: {DEVZERO}"


def test_hf_config_that_is_a_device(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").mkdir()
    os.symlink("/dev/zero", tmp_path / "hf" / "config.json")
    assert _error(capsys, ["hf"]) == f"hf/config.json: cannot read model config: {DEVZERO}"


def test_settings_and_baseline_that_are_fifos(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(MODEL)
    os.mkfifo(tmp_path / "base.json")
    assert _error(capsys, ["net.py", "--baseline", "base.json"]) == f"base.json: cannot read baseline: {FIFO}"
    os.mkfifo(tmp_path / "s.toml")
    rc = main(["net.py", "--settings", "s.toml"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.splitlines() == [f"normaudit: error: s.toml: cannot read settings file: {FIFO}"]
    # a settings file found on the way up (not named) is refused too, not skipped
    sub = tmp_path / "proj"
    sub.mkdir()
    shutil.copy(tmp_path / "net.py", sub / "net.py")
    os.mkfifo(sub / "normaudit.toml")
    monkeypatch.chdir(sub)
    rc = main(["net.py"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.splitlines() == [
        f"normaudit: error: normaudit.toml: cannot read settings file: {FIFO}"]


def test_deeply_nested_baseline_is_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(MODEL)
    (tmp_path / "base.json").write_text("[" * 100000 + "]" * 100000)
    assert _error(capsys, ["net.py", "--baseline", "base.json"]) == (
        "base.json: not a normaudit baseline: it nests lists/objects deeper than 100 levels")
