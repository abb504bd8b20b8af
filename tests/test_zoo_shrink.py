"""The zoo sweep's config shrink (benchmarks/zoo/targets.py): keys derived from others keep their relation,
and a shrink whose sizes no longer fit each other is caught by a forward on the meta device (issue 10: such
rows were the sweep's failures, measured as normaudit's)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "zoo"
sys.path.insert(0, str(ZOO))

targets = pytest.importorskip("targets")


def test_rotary_dim_fits_the_shrunk_head():
    # GPT-J / CodeGen: rotary_dim 64 of 256-wide heads; 4 heads of 64 hidden are 16 wide
    d = targets.shrink_config_dict({"n_embd": 4096, "n_head": 16, "n_layer": 28, "rotary_dim": 64})
    assert (d["n_embd"], d["n_head"], d["n_layer"], d["rotary_dim"]) == (64, 4, 2, 16)


def test_multi_head_latent_attention_dims_stay_consistent():
    # DeepSeek-V3: qk_head_dim = qk_nope_head_dim + qk_rope_head_dim, head_dim = qk_rope_head_dim
    d = targets.shrink_config_dict({"hidden_size": 7168, "num_attention_heads": 128, "qk_nope_head_dim": 128,
                                    "qk_rope_head_dim": 64, "qk_head_dim": 192, "head_dim": 64, "v_head_dim": 128})
    assert (d["qk_nope_head_dim"], d["qk_rope_head_dim"], d["qk_head_dim"], d["head_dim"]) == (8, 8, 16, 8)


def test_other_head_dim_keys_are_cut_like_head_dim():
    d = targets.shrink_config_dict({"hidden_size": 2560, "mamba_headdim": 640, "swa_head_dim": 128})
    assert (d["mamba_headdim"], d["swa_head_dim"]) == (16, 16)


def test_wide_level_keeps_full_size_heads():
    d = targets.shrink_config_dict({"hidden_size": 8192, "num_attention_heads": 64, "intermediate_size": 29568,
                                    "num_hidden_layers": 80, "head_dim": 128}, "wide")
    assert (d["hidden_size"], d["num_attention_heads"], d["intermediate_size"], d["num_hidden_layers"],
            d["head_dim"]) == (512, 4, 1024, 2, 128)
    assert targets.SHRINK_LEVELS == ("small", "wide", "layers", "default")


def test_meta_forward_tells_a_shrink_that_breaks_the_model():
    # Qwen2.5-VL's text model: mrope_section [16, 24, 24] is written for 128-wide heads; at hidden 64 the
    # rotary split fails, at the "wide" level (4 heads of 128) it runs
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    forward = pytest.importorskip("forward")
    cls = transformers.CONFIG_MAPPING["qwen2_5_vl_text"]
    results = {}
    for level in ("small", "wide"):
        config = cls.from_dict(targets.shrink_config_dict(cls().to_dict(), level))
        with torch.device("meta"):
            model = transformers.AutoModel.from_config(config)
        results[level] = forward.runs_on_meta(model, config)
    assert results["small"][0] is False and "split_with_sizes" in results["small"][1]
    assert results["wide"] == (True, "input_ids")
