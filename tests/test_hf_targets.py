"""Hugging Face targets: a directory with ``config.json``, or a bare ``config.json``, built offline on the
meta device with transformers. Tiny BERT, GPT-2 and Llama configs are written into tmp_path."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from normaudit.cli import main  # noqa: E402
from normaudit.loaders import load_model  # noqa: E402
from normaudit.loaders.hf import weight_files  # noqa: E402

CONFIGS = {
    "bert": {"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 37, "vocab_size": 99, "max_position_embeddings": 64,
             "layer_norm_eps": 1e-12},
    "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "vocab_size": 99, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0, "layer_norm_epsilon": 1e-5},
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 37, "vocab_size": 99,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-6},
}


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def write(root: Path, name: str, config: dict) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config, indent=2))
    return d


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_bert_gpt2_llama_configs_offline(capsys, tmp_path, no_network):
    bert = write(tmp_path, "bert", CONFIGS["bert"])
    gpt2 = write(tmp_path, "gpt2", CONFIGS["gpt2"]) / "config.json"  # a bare config.json
    llama = write(tmp_path, "llama", CONFIGS["llama"])
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    rc, out, err = run(capsys, bert, gpt2, llama, "--format", "json", "--select", "NE101", "--isolated")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["errors"] == []
    by_target = {Path(r["target"]["path"]).parent.name if r["target"]["path"].endswith(".json")
                 else Path(r["target"]["path"]).name: r for r in doc["reports"]}
    bert_r, gpt2_r, llama_r = by_target["bert"], by_target["gpt2"], by_target["llama"]
    assert (bert_r["target"]["kind"], gpt2_r["target"]["kind"], llama_r["target"]["kind"]) == (
        "hf_dir", "hf_config", "hf_dir")
    assert bert_r["model"]["class_name"] == "BertForMaskedLM" and llama_r["model"]["class_name"] == "LlamaForCausalLM"
    assert gpt2_r["model"]["class_name"] == "GPT2Model"

    def sites(r):
        return {s["module"]: (s["kind"], s["eps"]) for s in r["sites"]}

    assert sites(bert_r)["bert.encoder.layer.1.output.LayerNorm"] == ("LayerNorm", 1e-12)
    assert len(sites(bert_r)) == 6  # embeddings, 2 x 2 in the layers, the MLM head transform
    assert sites(gpt2_r) == {m: ("LayerNorm", 1e-5) for m in ["h.0.ln_1", "h.0.ln_2", "h.1.ln_1", "h.1.ln_2", "ln_f"]}
    assert sites(llama_r)["model.norm"] == ("RMSNorm", 1e-6) and len(sites(llama_r)) == 5
    for r in doc["reports"]:
        assert r["findings"] == []  # eps comes from the config: nothing differs
        assert r["capture"]["inputs"] and r["capture"]["inputs_assumed"].startswith("input_ids")
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written into the model directories


def test_one_hf_target_is_a_single_report_and_config_mismatch_is_found(capsys, tmp_path, no_network):
    llama = write(tmp_path, "llama", CONFIGS["llama"])
    cfg = tmp_path / "train.yaml"
    cfg.write_text("model:\n  rms_norm_eps: 1.0e-5\n")
    rc, out, err = run(capsys, llama, "--config", cfg, "--format", "json", "--select", "NE101", "--isolated")
    doc = json.loads(out)
    assert "reports" not in doc and doc["target"]["kind"] == "hf_dir"
    assert rc == 1 and {f["rule_id"] for f in doc["findings"]} == {"NE101"}
    assert len(doc["findings"]) == 5


def test_weights_beside_the_config_are_recorded_not_read_while_loading(tmp_path):
    d = write(tmp_path, "llama", CONFIGS["llama"])
    (d / "model.safetensors").write_bytes(b"not read")
    assert weight_files(d) == ["model.safetensors"]
    mua = load_model(str(d))
    assert mua.kind == "hf_dir" and mua.on_meta and mua.weights == ["model.safetensors"]
    assert all(p.device.type == "meta" for p in mua.model.parameters())
    assert mua.notes == []  # the audit reads them as the model's checkpoint (tests/test_weights.py)


@pytest.mark.parametrize("config, expected", [
    ('{"model_type": "llama",\n "hidden_size": }', "config.json:2: invalid JSON"),
    ('{"hidden_size": 32}', "config.json: config.json has no 'model_type'"),
    ('{"model_type": "no-such-model"}', "config.json: unknown model_type 'no-such-model'"),
    ('{"model_type": "my-custom", "auto_map": {"AutoModel": "m.M"}}', "config.json: the config uses custom model code"),
    ('[1, 2]', "config.json: a model config must be a JSON object"),
])
def test_bad_hf_configs_are_exit_2(capsys, tmp_path, config, expected):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(config)
    rc, out, err = run(capsys, d, "--isolated")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], err


def test_directory_without_config_or_weights_is_exit_2(capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    rc, _, err = run(capsys, tmp_path / "empty", "--isolated")
    assert rc == 2 and "no config.json in this directory" in err


def test_checkpoint_targets_are_dispatched_to_the_checkpoint_loader(tmp_path, monkeypatch):
    import normaudit.loaders as target
    from normaudit.loaders import is_checkpoint_path

    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    weights_dir = tmp_path / "w"
    weights_dir.mkdir()
    (weights_dir / "pytorch_model.bin").write_bytes(b"")
    assert is_checkpoint_path(f) and is_checkpoint_path(weights_dir)
    assert not is_checkpoint_path(write(tmp_path, "hf", CONFIGS["gpt2"]))
    monkeypatch.setattr(target, "load_checkpoint_target", lambda path: ("checkpoint", path))
    assert load_model(str(f)) == ("checkpoint", f)
    assert load_model(str(weights_dir)) == ("checkpoint", weights_dir)
