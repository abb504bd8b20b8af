"""A file's bytes never reach a message, and links never lead normaudit out of the folder it was given.

A secret-looking file (``GITHUB_TOKEN=ghp_...``) reached through a symlinked target, a symlinked shard of an
index folder, an HF folder whose ``pytorch_model.bin`` is a link, or ``--checkpoint`` (the attack: a link
committed in a pull request, audited in CI, its target's first bytes printed to public logs and SARIF) is
refused naming the link and its real path; the secret's bytes appear nowhere in stdout, stderr or any output
file. A file that is not a checkpoint is described by type (text, zip, unknown format), never quoted.
Links that stay inside the folder, and the Hugging Face hub cache's ``snapshots/*/x -> ../../blobs/...``,
still read."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from normaudit.errors import UsageError
from normaudit.loaders.checkpoint import open_checkpoint

TOKEN = "ghp_" + "x7Qm2" * 7
SECRET = f"GITHUB_TOKEN={TOKEN}\nAWS_SECRET=abc\n"
#: pieces of the secret no output may hold (its bytes as text, and as the hex a message might quote)
PIECES = ["GITHUB", "TOKEN", "ghp_", "x7Qm2", SECRET[:8].encode().hex(), " ".join(f"{b:02x}" for b in b"GITHUB")]

TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64}
MODEL = "import torch\nfrom torch import nn\n\n\ndef build_model():\n    return nn.LayerNorm(8)\n"


@pytest.fixture
def world(tmp_path):
    """``secrets/token.txt`` (the file an attacker's links point at) and a ``repo/`` beside it holding them."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "token.txt").write_text(SECRET)
    repo = tmp_path / "repo"
    repo.mkdir()
    return secrets / "token.txt", repo


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("NORMAUDIT_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "normaudit", *args, "--isolated", "--no-cache"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)


def _assert_no_secret(proc: subprocess.CompletedProcess, *files: Path) -> None:
    texts = {"stdout": proc.stdout, "stderr": proc.stderr, **{str(f): f.read_text() for f in files}}
    for where, text in texts.items():
        for piece in PIECES:
            assert piece not in text, (where, piece, text[-2000:])


def _outputs(repo: Path) -> list[str]:
    return ["--format", "json", "-o", str(repo.parent / "out.json"), "--format", "sarif", "-o",
            str(repo.parent / "out.sarif"), "--format", "text"]


def test_linked_targets_are_refused_and_never_quoted(world):
    secret, repo = world
    os.symlink(secret, repo / "w.bin")
    os.symlink(secret, repo / "w.safetensors")
    (repo / "idx").mkdir()
    os.symlink(secret, repo / "idx" / "model-00001-of-00001.safetensors")
    (repo / "idx" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"norm.weight": "model-00001-of-00001.safetensors"}}))
    (repo / "wdir").mkdir()
    os.symlink(secret, repo / "wdir" / "model.safetensors")
    targets = ["w.bin", "w.safetensors", "idx", "idx/model.safetensors.index.json", "wdir"]
    proc = _run([*targets, *_outputs(repo)], repo)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    _assert_no_secret(proc, repo.parent / "out.json", repo.parent / "out.sarif")
    errors = {e["target"]: e["message"] for e in json.loads((repo.parent / "out.json").read_text())["errors"]}
    assert set(errors) == set(targets)
    real = repr(str(secret))
    assert errors["w.bin"] == (f"w.bin: cannot read checkpoint: it is a symbolic link to {real}, outside the folder "
                               f"it was given in ({str(repo)!r}); normaudit reads nothing outside the folder given "
                               "(name the real file to audit it)")
    assert errors["w.safetensors"].startswith(f"w.safetensors: cannot read checkpoint: it is a symbolic link to {real}")
    for target in ("idx", "idx/model.safetensors.index.json"):
        assert errors[target].startswith(
            "idx/model.safetensors.index.json: checkpoint index names shard 'model-00001-of-00001.safetensors' "
            f"(holding 1 tensor): cannot read checkpoint shard: it is a symbolic link to {real}, outside the "
            f"folder it was given in ({str(repo / 'idx')!r})"), errors[target]
    assert errors["wdir"].startswith(f"wdir/model.safetensors: cannot read checkpoint weights file: it is a symbolic "
                                     f"link to {real}, outside the folder it was given in ({str(repo / 'wdir')!r})")


def test_hf_folder_whose_weights_are_a_link(world):
    secret, repo = world
    hf = repo / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(TINY_LLAMA))
    os.symlink(secret, hf / "pytorch_model.bin")
    proc = _run(["hf", *_outputs(repo)], repo)
    assert proc.returncode == 2, proc.stderr
    _assert_no_secret(proc, repo.parent / "out.json", repo.parent / "out.sarif")
    assert proc.stderr.splitlines() == [
        f"normaudit: error: hf/pytorch_model.bin: cannot read checkpoint weights file: it is a symbolic link to "
        f"{str(secret)!r}, outside the folder it was given in ({str(hf)!r}); normaudit reads nothing outside the "
        "folder given (name the real file to audit it)"]


def test_checkpoint_flag_through_a_link_to_sarif(world):
    secret, repo = world
    (repo / "net.py").write_text(MODEL)
    os.symlink(secret, repo / "secret.bin")
    proc = _run(["net.py", "--checkpoint", "secret.bin", "--format", "sarif", "-o", str(repo.parent / "x.sarif")],
                repo)
    assert proc.returncode == 2, proc.stderr
    _assert_no_secret(proc, repo.parent / "x.sarif")
    assert "secret.bin: cannot read checkpoint: it is a symbolic link to" in proc.stderr


@pytest.mark.parametrize("name, content, found", [
    ("notes.pt", SECRET, "expected a torch.save checkpoint (a zip archive holding */data.pkl, or a pickle), found "
                         "a text file"),
    # a text starting with "c" parses as a protocol-0 pickle GLOBAL: its lines would be quoted as callables
    ("c.pt", "cGITHUB_TOKEN\nghp_x7Qm2\n" + SECRET, "found a text file"),
    ("(.pt", "(" + SECRET, "found a text file"),
    ("notes.safetensors", SECRET, "not a safetensors file: expected an 8-byte header length, then a JSON header, "
                                  "found a text file"),
    ("blob.bin", b"\x00\x01GITHUB_TOKEN" + TOKEN.encode(), "found binary data of an unknown format"),
    ("blob.safetensors", b"\x00\x01GITHUB_TOKEN" + TOKEN.encode(), "found binary data of an unknown format"),
])
def test_a_file_that_is_no_checkpoint_is_described_by_type(tmp_path, name, content, found):
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(UsageError) as info:
        open_checkpoint(path)
    message = str(info.value)
    assert found in message
    for piece in PIECES:
        assert piece not in message


def test_zip_members_are_counted_not_quoted(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "z.bin", "w") as z:
        z.writestr(f"{TOKEN}.txt", b"x")
        z.writestr("other.txt", b"y")
    with pytest.raises(UsageError) as info:
        open_checkpoint(tmp_path / "z.bin")
    assert str(info.value).endswith("found a zip archive without */data.pkl (2 members, none of them */data.pkl)")


def _weights(path: Path) -> None:
    save_file({"norm.weight": torch.ones(4)}, str(path))


def test_links_inside_the_folder_still_read(tmp_path):
    d = tmp_path / "ckpt"
    (d / "store").mkdir(parents=True)
    _weights(d / "store" / "real.safetensors")
    os.symlink("store/real.safetensors", d / "model.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"norm.weight": "model.safetensors"}}))
    for target in (d, d / "model.safetensors", d / "model.safetensors.index.json"):
        with open_checkpoint(target) as ckpt:
            assert ckpt.keys() == ["norm.weight"]
    # the folder given may itself be reached through a link
    os.symlink(d, tmp_path / "alias")
    with open_checkpoint(tmp_path / "alias") as ckpt:
        assert ckpt.keys() == ["norm.weight"]


def test_hub_cache_snapshot_links_into_its_blobs_read(tmp_path):
    """huggingface_hub's cache: ``models--org--name/snapshots/<rev>/<file> -> ../../blobs/<hash>``."""
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    _weights(repo / "blobs" / "0123abcd")
    os.symlink("../../blobs/0123abcd", snap / "model.safetensors")
    (repo / "blobs" / "4567").write_text(json.dumps({"weight_map": {"norm.weight": "model.safetensors"}}))
    os.symlink("../../blobs/4567", snap / "model.safetensors.index.json")
    for target in (snap, snap / "model.safetensors", snap / "model.safetensors.index.json"):
        with open_checkpoint(target) as ckpt:
            assert ckpt.keys() == ["norm.weight"]
    # a link out of the repo's cache folder is still refused
    os.symlink(tmp_path / "elsewhere.safetensors", snap / "other.safetensors")
    _weights(tmp_path / "elsewhere.safetensors")
    with pytest.raises(UsageError, match="outside the folder it was given in"):
        open_checkpoint(snap / "other.safetensors")


def test_a_linked_config_beside_a_checkpoint_is_refused(world):
    secret, repo = world
    _weights(repo / "model.safetensors")
    os.symlink(secret, repo / "config.json")
    with pytest.raises(UsageError) as info:
        open_checkpoint(repo)
    assert str(info.value).startswith(f"{repo / 'config.json'}: cannot read config: it is a symbolic link to "
                                      f"{str(secret)!r}")
