"""GGUF files as targets: sites by llama.cpp's tensor names, eps from the metadata, statistics of the norm tensors
only, the config they were converted from, and one-line exit-2 errors for every file the reader refuses. Files are
written with the gguf package's own writer (``gguf.GGUFWriter``); the rules' true positives and negatives are the
fixtures ``tests/fixtures/checkpoint/NC111_*.py`` .. ``NC114_*.py``."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from conftest import audit_file, family_rules, site  # noqa: E402
from normaudit.cli import main  # noqa: E402
from normaudit.errors import UsageError  # noqa: E402
from normaudit.loaders.gguf_file import open_gguf, reader  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RULES = family_rules("checkpoint")


def write(path: Path, arch: str, tensors: dict, meta=None, *, rms_eps=1e-5, ln_eps=None, blocks=2) -> Path:
    """A GGUF file of ``arch`` holding ``tensors`` (name -> array, in this order) and the usual metadata."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(blocks)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    if rms_eps is not None:
        w.add_layer_norm_rms_eps(rms_eps)
    if ln_eps is not None:
        w.add_layer_norm_eps(ln_eps)
    for key, value in (meta or {}).items():
        w.add_array(key, value) if isinstance(value, list) else w.add_string(key, value)
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def ones(n: int, seed: int = 0) -> np.ndarray:
    return (1 + 0.05 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


def llama(path: Path, blocks: int = 2, **kw) -> Path:
    tensors = {"token_embd.weight": np.zeros((32, 64), np.float16)}
    for b in sorted(range(blocks), key=str):  # the order converters of sorted HF keys write: 0, 1, 10, 11, 2, ...
        tensors[f"blk.{b}.attn_norm.weight"] = ones(64, b)
        tensors[f"blk.{b}.attn_q.weight"] = np.zeros((64, 64), np.float16)
        tensors[f"blk.{b}.ffn_norm.weight"] = ones(64, b + 100)
    tensors["output_norm.weight"] = ones(64, 7)
    return write(path, "llama", tensors, blocks=blocks, **kw)


# ------------------------------------------------------------------------------------------------ sites
def test_sites_by_tensor_name_in_block_order_with_eps_and_statistics(tmp_path):
    report = audit_file(llama(tmp_path / "m.gguf", blocks=12), RULES)
    names = [s.module for s in report.sites]
    assert names == [f"blk.{b}.{n}" for b in range(12) for n in ("attn_norm", "ffn_norm")] + ["output_norm"]
    assert report.target.kind == "gguf" and report.target.checkpoint == str(tmp_path / "m.gguf")
    assert report.model.class_name == "GGUF llama" and report.model.gguf.architecture == "llama"
    assert report.model.gguf.block_count == 12 and report.capture.method == "none"
    s = site(report, "blk.3.ffn_norm")
    assert (s.kind, s.eps, s.gain_form, s.normalized_shape) == ("RMSNorm", 1e-05, "weight", [64])
    assert (s.gguf.tensor, s.gguf.ggml_type, s.gguf.eps_key) == ("FFN_NORM", "F32",
                                                                 "llama.attention.layer_norm_rms_epsilon")
    assert s.weights.keys == ["blk.3.ffn_norm.weight"] and s.weights.gain_centre == "one"
    assert abs(s.weights.gain_mean - float(ones(64, 103).mean())) < 1e-6
    assert report.findings == []


def test_layernorm_with_bias_takes_the_layernorm_eps(tmp_path):
    tensors = {"blk.0.attn_norm.weight": ones(64), "blk.0.attn_norm.bias": np.zeros(64, np.float32),
               "output_norm.weight": ones(64, 1), "output_norm.bias": np.zeros(64, np.float32)}
    report = audit_file(write(tmp_path / "g.gguf", "gpt2", tensors, rms_eps=None, ln_eps=1e-5, blocks=1), RULES)
    s = site(report, "blk.0.attn_norm")
    assert (s.kind, s.kind_basis, s.eps, s.gguf.eps_key) == ("LayerNorm", "bias present", 1e-05,
                                                             "gpt2.attention.layer_norm_epsilon")
    assert s.weights.keys == ["blk.0.attn_norm.weight", "blk.0.attn_norm.bias"] and s.weights.bias_present


def test_reads_the_header_and_the_norm_tensors_only(tmp_path, monkeypatch):
    path = llama(tmp_path / "m.gguf")
    got = []
    real = reader.GgufFile.get
    monkeypatch.setattr(reader.GgufFile, "get", lambda self, key: got.append(key) or real(self, key))
    audit_file(path, RULES)
    assert sorted(got) == ["blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "blk.1.attn_norm.weight",
                           "blk.1.ffn_norm.weight", "output_norm.weight"]
    monkeypatch.undo()
    with open_gguf(path) as f:
        header = f.bytes_read
        for key in sorted(got):
            f.get(key)
        assert f.bytes_read == header + 5 * 64 * 4 < f.size


def test_statistics_rules_flag_the_exact_tensors_and_spare_the_others(tmp_path):
    """The checkpoint rules on gain statistics read a GGUF norm as any checkpoint's: NC103 a NaN, NC104 all-zero
    gains, NC108 (with NC112) one norm of five centred near 0; the trained norms beside them are not flagged."""
    tensors = {}
    for b in range(3):
        tensors[f"blk.{b}.attn_norm.weight"] = ones(64, b)
        tensors[f"blk.{b}.ffn_norm.weight"] = ones(64, b + 10)
    tensors["blk.0.attn_norm.weight"][5] = np.nan
    tensors["blk.1.ffn_norm.weight"] = np.zeros(64, np.float32)
    tensors["blk.2.attn_norm.weight"] = (0.1 * np.random.default_rng(3).standard_normal(64)).astype(np.float32)
    tensors["output_norm.weight"] = ones(64, 7)
    report = audit_file(write(tmp_path / "m.gguf", "llama", tensors, blocks=3), RULES)
    got = sorted((f.rule_id, f.module, f.severity) for f in report.findings)
    assert got == [("NC103", "blk.0.attn_norm", "error"), ("NC104", "blk.1.ffn_norm", "warning"),
                   ("NC108", "blk.2.attn_norm", "warning"), ("NC112", "blk.2.attn_norm", "error")]
    nc103 = next(f for f in report.findings if f.rule_id == "NC103")
    assert nc103.message.startswith("1 NaN/inf value(s) in the checkpoint's parameters of this norm "
                                    "(blk.0.attn_norm.weight)")
    assert site(report, "blk.1.ffn_norm").weights.keys == ["blk.1.ffn_norm.weight"]
    assert {s.module for s in report.sites} - {m for _, m, _ in got} == {
        "blk.0.ffn_norm", "blk.1.attn_norm", "blk.2.ffn_norm", "output_norm"}


def test_stacked_per_head_norm_keeps_its_shape_and_fits_the_head_counts(tmp_path):
    """StableLM's converter stacks per-head q/k layernorms into one (heads, head_dim) tensor."""
    q = np.stack([ones(16, h) for h in range(4)])
    tensors = {"blk.0.attn_norm.weight": ones(64), "blk.0.attn_q_norm.weight": q, "output_norm.weight": ones(64)}
    report = audit_file(write(tmp_path / "s.gguf", "stablelm", tensors, blocks=1), RULES)
    s = site(report, "blk.0.attn_q_norm")
    assert s.weights.shape == [4, 16] and s.normalized_shape == [16]
    assert abs(s.weights.gain_mean - float(q.mean())) < 1e-6
    assert s.gguf.expected_shapes == [[16], [64], [4, 16]] and not report.findings


def test_unknown_architecture_and_names_the_architecture_does_not_define(tmp_path):
    report = audit_file(write(tmp_path / "x.gguf", "no-such-arch", {"blk.0.attn_norm.weight": ones(64)}, blocks=1),
                        RULES)
    assert [s.module for s in report.sites] == ["blk.0.attn_norm"] and not report.model.gguf.known_architecture
    assert any("does not know architecture 'no-such-arch'" in n for n in report.notes)
    tensors = {"blk.0.attn_norm.weight": ones(64), "blk.0.attn_q_norm.weight": ones(16)}
    report = audit_file(write(tmp_path / "l.gguf", "llama", tensors, blocks=1), RULES)
    assert [s.module for s in report.sites] == ["blk.0.attn_norm"]
    assert report.model.gguf.unmapped == ["blk.0.attn_q_norm.weight"]
    assert any("does not define (not audited" in n and "blk.0.attn_q_norm.weight" in n for n in report.notes)


def test_config_given_wins_over_the_one_beside_the_file_and_a_yaml_config_compares_keys(tmp_path):
    path = llama(tmp_path / "m.gguf")
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32, "rms_norm_eps": 1e-5}))
    report = audit_file(path, RULES)
    assert report.model.gguf.config_source == "config.json (beside the file)" and report.findings == []
    other = tmp_path / "train.yaml"
    other.write_text("model:\n  rms_norm_eps: 1.0e-6\n")
    report = audit_file(path, RULES, config=str(other))
    assert report.model.gguf.config_source == "train.yaml" and report.model.gguf.reference is None
    assert {f.rule_id for f in report.findings} == {"NC111"} and len(report.findings) == 5
    assert site(report, "output_norm").gguf.config_eps_source == "train.yaml's rms_norm_eps"
    assert any("no Hugging Face config.json" in n for n in report.notes)


def test_gain_form_probe():
    import torch
    from torch import nn

    from normaudit.probes.gain_form import gain_form

    class OffsetRMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(8))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + self.weight)

    class Refuses(nn.LayerNorm):
        def forward(self, x, mask):
            return super().forward(x)

    with torch.device("meta"):
        mods = [OffsetRMSNorm(), nn.RMSNorm(8), nn.LayerNorm(8), Refuses(8)]
    assert [gain_form(m) for m in mods] == ["one_plus_weight", "weight", "weight", "unknown"]
    assert mods[0].weight.is_meta  # the module itself is untouched


# ------------------------------------------------------------------------------------------------ bad files
def _good(tmp_path: Path) -> bytes:
    return llama(tmp_path / "seed.gguf", meta={"x.arr": [1, 2, 3]}).read_bytes()


def _forged_array_length(data: bytes) -> bytes:
    at = data.index(b"x.arr") + len(b"x.arr") + 4 + 4  # key, value type ARRAY, item type
    return data[:at] + struct.pack("<Q", 2 ** 40) + data[at + 8:]


BAD = {
    "empty": (lambda d: b"", "empty file (0 bytes): expected a GGUF file"),
    "not gguf": (lambda d: b"PK\x03\x04" + d[4:], "not a GGUF file: it does not start with the GGUF magic bytes"),
    "truncated header": (lambda d: d[:40], "truncated GGUF file: the header (metadata and tensor table) runs past"),
    "truncated data": (lambda d: d[:-4], "truncated GGUF file: tensor data runs past the end of the file"),
    "forged key length": (lambda d: d[:24] + struct.pack("<Q", 2 ** 62) + d[32:], "truncated GGUF file: the header"),
    "forged array length": (_forged_array_length, "truncated GGUF file: the header"),
    "unknown version": (lambda d: d[:4] + struct.pack("<I", 99) + d[8:], "unsupported GGUF version"),
    "unknown value type": (lambda d: d[:d.index(b"general.architecture") + 20] + struct.pack("<I", 77)
                           + d[d.index(b"general.architecture") + 24:],
                           "corrupt GGUF file: the gguf package cannot read its header"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file_is_one_line_exit_2(tmp_path, capsys, case):
    mutate, text = BAD[case]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(mutate(_good(tmp_path)))
    with pytest.raises(UsageError) as info:
        open_gguf(bad)
    assert str(info.value).startswith(f"{bad}: {text}") or text in str(info.value), str(info.value)
    assert main([str(bad), "--isolated", "--no-cache", "-j", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("normaudit: error: ") and text in err and "Traceback" not in err


def test_header_over_the_limit_and_a_fifo(tmp_path, monkeypatch):
    path = llama(tmp_path / "m.gguf")
    monkeypatch.setattr(reader, "MAX_HEADER_BYTES", 64)
    with pytest.raises(UsageError, match="GGUF header over 0 MiB: refused"):
        open_gguf(path)
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="expected a regular file, found a FIFO"):
        open_gguf(fifo)


def test_missing_gguf_package_gives_the_install_hint(tmp_path, capsys, monkeypatch):
    path = llama(tmp_path / "m.gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)
    assert main([str(path), "--isolated", "--no-cache", "-j", "1"]) == 2
    assert capsys.readouterr().err == (f"normaudit: error: {path}: GGUF files need the 'gguf' package: "
                                       "pip install 'normaudit[gguf]'\n")


def test_help_and_schema_import_neither_gguf_nor_torch_and_schema_names_the_kinds():
    code = ("import sys; from normaudit.cli import main; main(sys.argv[1:]); "
            "sys.stderr.write('LOADED ' + ' '.join(m for m in ('gguf', 'torch', 'huggingface_hub') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NORMAUDIT_NO_CACHE": "1"}
    for argv in (["--help"], ["schema"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True,
                              timeout=120, cwd=ROOT)
        assert proc.stderr.rstrip().endswith("LOADED"), proc.stderr
    kinds = json.loads(proc.stdout)["$defs"]["TargetInfo"]["properties"]["kind"]["enum"]
    assert {"gguf", "hub"} <= set(kinds)
