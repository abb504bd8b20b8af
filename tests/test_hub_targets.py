"""Hugging Face hub ids as targets: ``org/name[@revision]`` read from a local cache folder laid out as
huggingface_hub lays it out (``models--org--name/blobs/``, ``snapshots/<commit>/`` with links into the blobs,
``refs/<revision>``), found through ``HF_HUB_CACHE`` or ``HF_HOME``; an id the cache lacks is exit 2 naming the
cache and the command that fetches it; a path that exists wins over an id; nothing is downloaded."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")
gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

from huggingface_hub import constants  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from conftest import audit_file, family_rules, site  # noqa: E402
from normaudit.cli import main  # noqa: E402
from normaudit.errors import UsageError  # noqa: E402
from normaudit.loaders.hub import fetch_command, parse_hub_id, resolve_hub_id  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RULES = family_rules("checkpoint")
MAIN = "a" * 40
V1 = "b" * 40


def _weights(path: Path, gain: float) -> None:
    """A weights-only safetensors file: one RMSNorm-like gain and a linear weight."""
    save_file({"model.norm.weight": torch.full((16,), gain), "model.layers.0.mlp.weight": torch.zeros(4, 16)},
              str(path))


def cached_repo(cache: Path, repo: str, commits: dict[str, float], refs: dict[str, str]) -> Path:
    """Write ``repo`` into the hub cache folder ``cache``: per commit a snapshot holding ``model.safetensors`` (a
    link into ``blobs/``, named by its sha256 as huggingface_hub names LFS blobs) with gains of the given value,
    and ``refs/<name>`` holding a commit hash. Returns the repository's folder."""
    storage = cache / ("models--" + repo.replace("/", "--"))
    (storage / "blobs").mkdir(parents=True)
    (storage / "refs").mkdir()
    for commit, gain in commits.items():
        snap = storage / "snapshots" / commit
        snap.mkdir(parents=True)
        tmp = storage / "blobs" / "tmp"
        _weights(tmp, gain)
        blob = storage / "blobs" / hashlib.sha256(tmp.read_bytes()).hexdigest()
        tmp.rename(blob)
        (snap / "model.safetensors").symlink_to(os.path.relpath(blob, snap))
    for name, commit in refs.items():
        (storage / "refs" / name).write_text(commit)
    return storage


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache folder, the one huggingface_hub reads in this process and ``HF_HUB_CACHE`` names."""
    folder = tmp_path / "hub-cache"
    folder.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))  # read by huggingface_hub at import time
    return folder


def _cli(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m normaudit ARGS`` with this checkout first on the path and ``env`` added."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    full.update(PYTHONPATH=str(ROOT), NORMAUDIT_NO_CACHE="1", **env)
    return subprocess.run([sys.executable, "-m", "normaudit", *args], env=full, capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_parse_hub_id():
    assert parse_hub_id("acme/tiny") == ("acme/tiny", None)
    assert parse_hub_id("Qwen/Qwen3-0.6B@v1.0") == ("Qwen/Qwen3-0.6B", "v1.0")
    assert parse_hub_id(f"acme/tiny@{MAIN}") == ("acme/tiny", MAIN)
    for not_an_id in ("model.py", "models/gpt.py", "out/model.gguf", "a/b/c", "../x", "acme/tiny@", "acme--x/y",
                      "pkg.mod:build"):
        assert parse_hub_id(not_an_id) is None, not_an_id


def test_main_and_a_revision_read_their_snapshots(cache):
    storage = cached_repo(cache, "acme/tiny", {MAIN: 1.0, V1: 0.0}, {"main": MAIN, "v1": V1})
    report = audit_file("acme/tiny", RULES)
    assert (report.target.kind, report.target.path) == ("hub", "acme/tiny")
    assert report.target.resolved == str(storage / "snapshots" / MAIN)
    assert [s.module for s in report.sites] == ["model.norm"] and site(report, "model.norm").weights.gain_mean == 1.0
    assert any(f"hub id acme/tiny read from the local Hugging Face cache: {storage / 'snapshots' / MAIN}" == n
               for n in report.notes)
    for target in ("acme/tiny@v1", f"acme/tiny@{V1}"):
        report = audit_file(target, RULES)
        assert report.target.resolved == str(storage / "snapshots" / V1), target
        assert site(report, "model.norm").weights.gain_mean == 0.0


def test_a_snapshot_holding_one_gguf_file_is_audited_as_that_file(cache):
    from test_gguf import llama

    storage = cache / "models--acme--tiny-GGUF"
    snap = storage / "snapshots" / MAIN
    snap.mkdir(parents=True)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(MAIN)
    llama(snap / "tiny-f16.gguf", blocks=1)
    report = audit_file("acme/tiny-GGUF", RULES)
    assert (report.target.kind, report.target.resolved) == ("hub", str(snap / "tiny-f16.gguf"))
    assert [s.module for s in report.sites] == ["blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"]
    assert report.model.gguf.architecture == "llama"


def test_an_id_not_in_the_cache_names_the_cache_and_the_fetch_command(cache, capsys):
    cached_repo(cache, "acme/tiny", {MAIN: 1.0}, {"main": MAIN})
    import huggingface_hub

    tool = fetch_command("x/y", None, huggingface_hub).split()[0]
    assert tool == ("huggingface-cli" if huggingface_hub.__version__.startswith("0.") else "hf")
    cases = {"acme/absent": f"`{tool} download acme/absent`",
             "acme/tiny@v9": f"at revision 'v9' is not in the local cache {cache}: normaudit never downloads; "
                             f"fetch it with `{tool} download acme/tiny --revision v9`"}
    for target, text in cases.items():
        assert main([target, "--isolated", "--no-cache", "-j", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"normaudit: error: {target}: no such file or directory, "
                                                       "and the Hugging Face hub id"), err
        assert str(cache) in err and text in err and "Traceback" not in err


def test_a_ref_that_leads_outside_the_snapshots_is_refused(cache):
    storage = cached_repo(cache, "acme/tiny", {MAIN: 1.0}, {"main": MAIN})
    (storage / "refs" / "evil").write_text("../../../../etc")
    with pytest.raises(UsageError) as info:
        resolve_hub_id("acme/tiny@evil")
    assert "acme/tiny" in str(info.value) and "/etc" not in str(info.value).split("lead")[0]


def test_missing_huggingface_hub_gives_the_install_hint(cache, capsys, monkeypatch):
    cached_repo(cache, "acme/tiny", {MAIN: 1.0}, {"main": MAIN})
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    assert main(["acme/tiny", "--isolated", "--no-cache", "-j", "1"]) == 2
    assert capsys.readouterr().err == ("normaudit: error: Hugging Face hub ids need the 'huggingface_hub' package: "
                                       "pip install 'normaudit[hub]'\n")


def test_cli_honours_hf_hub_cache_and_hf_home_and_a_path_that_exists_wins(tmp_path):
    cached_repo(tmp_path / "c1", "acme/tiny", {MAIN: 1.0}, {"main": MAIN})
    cached_repo(tmp_path / "home" / "hub", "acme/tiny", {V1: 0.0}, {"main": V1})
    work = tmp_path / "work"
    work.mkdir()
    for env, commit in (({"HF_HUB_CACHE": str(tmp_path / "c1")}, MAIN),
                        ({"HF_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}, V1)):
        proc = _cli(["acme/tiny", "--format", "json", "--isolated"], env, work)
        assert proc.returncode == 0, proc.stderr
        target = json.loads(proc.stdout)["target"]
        assert target["kind"] == "hub" and target["resolved"].endswith(f"models--acme--tiny/snapshots/{commit}")
    (work / "acme" / "tiny").mkdir(parents=True)
    _weights(work / "acme" / "tiny" / "model.safetensors", 0.5)
    proc = _cli(["acme/tiny", "--format", "json", "--isolated"], {"HF_HUB_CACHE": str(tmp_path / "c1")}, work)
    report = json.loads(proc.stdout)
    assert report["target"]["kind"] == "checkpoint" and report["target"]["resolved"] is None
    assert report["sites"][0]["weights"]["gain_mean"] == 0.5
