"""The zoo sweep's config shrink (benchmarks/zoo/targets.py): keys derived from others keep their relation,
and a shrink whose sizes no longer fit each other is caught by a forward on the meta device (such
rows were the sweep's failures, counted as normaudit's)."""
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
    assert targets.SHRINK_LEVELS == ("small", "small3", "wide", "layers", "pairs", "default", "filled")


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


def test_expert_groups_still_divide_the_shrunk_experts():
    # DeepSeek-V3.2 / AXK1: 256 experts in 8 routing groups, 4 groups picked; at 4 experts, 8 groups of 0
    # experts made the router's view(-1, 8, 0) fail; each group keeps 2 experts (its score sums its best 2)
    d = targets.shrink_config_dict({"hidden_size": 7168, "n_routed_experts": 256, "n_group": 8, "topk_group": 4,
                                    "num_experts_per_tok": 8})
    assert (d["n_routed_experts"], d["n_group"], d["topk_group"], d["num_experts_per_tok"]) == (4, 2, 2, 2)


def test_experts_per_token_spellings_are_cut():
    # Kimi-Linear / Bailing: num_experts_per_token 8 of 4 experts: topk out of range
    d = targets.shrink_config_dict({"hidden_size": 2048, "num_experts": 256, "num_experts_per_token": 8,
                                    "moe_top_k": 6})
    assert (d["num_experts"], d["num_experts_per_token"], d["moe_top_k"]) == (4, 2, 2)


def test_heads_times_head_width_stays_expand_times_hidden():
    # Mamba2's validator: hidden_size * expand == num_heads * head_dim; n_groups divides the heads
    d = targets.shrink_config_dict({"hidden_size": 4096, "expand": 2, "num_heads": 128, "head_dim": 64,
                                    "n_groups": 8})
    assert (d["hidden_size"], d["num_heads"], d["head_dim"], d["n_groups"]) == (64, 4, 32, 4)
    # Bamba: the same relation under a prefix (mamba_n_heads with mamba_d_head)
    d = targets.shrink_config_dict({"hidden_size": 4096, "mamba_expand": 2, "mamba_n_heads": 128,
                                    "mamba_d_head": 64, "num_attention_heads": 32, "head_dim": 128})
    assert (d["mamba_n_heads"], d["mamba_d_head"], d["num_attention_heads"], d["head_dim"]) == (4, 32, 4, 16)


def test_width_multiples_of_the_model_width_are_kept():
    # Zamba2: attention_hidden_size = 2 * hidden_size, attention_head_dim = attention_hidden_size / heads,
    # mamba_headdim * n_mamba_heads = mamba_expand * hidden_size
    d = targets.shrink_config_dict({"hidden_size": 2560, "attention_hidden_size": 5120, "num_attention_heads": 32,
                                    "attention_head_dim": 160, "n_mamba_heads": 8, "mamba_headdim": 640,
                                    "mamba_expand": 2})
    assert (d["attention_hidden_size"], d["attention_head_dim"], d["n_mamba_heads"], d["mamba_headdim"]) == \
        (128, 32, 4, 32)


def test_layer_index_lists_point_into_the_shrunk_depth():
    layer_types = ["mamba"] * 5 + ["hybrid"] + ["mamba"] * 48
    d = targets.shrink_config_dict({"num_hidden_layers": 54, "hybrid_layer_ids": [6, 12, 18, 24, 30, 36],
                                    "layers_block_type": layer_types, "global_attn_indexes": [0, 1],
                                    "encode_proj_layers": [2], "hidden_size": 256})
    assert d["hybrid_layer_ids"] == [1] and d["layers_block_type"] == ["mamba", "hybrid"]
    # indices already inside the depth, and feature-map indices, stay
    assert d["global_attn_indexes"] == [0, 1] and d["encode_proj_layers"] == [2]


def test_stage_widths_stay_multiples_of_group_norm_groups():
    # BiT: GroupNorm(32) over every stage width; widths cut to 16.. made 8 channels of 32 groups
    d = targets.shrink_config_dict({"hidden_sizes": [256, 512, 1024, 2048], "num_groups": 32, "depths": [3, 4, 6, 3]})
    assert d["hidden_sizes"] == [32, 64, 128, 256] and d["depths"] == [2, 2, 2, 2]


def test_small3_level_widths_divide_by_three():
    # LiLT: four 2-D position embeddings of hidden_size // 6 concatenated back to hidden_size
    d = targets.shrink_config_dict({"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
                                    "head_dim": 64}, "small3")
    assert (d["hidden_size"], d["num_attention_heads"], d["intermediate_size"], d["head_dim"]) == (96, 4, 192, 24)
    assert d["hidden_size"] // 6 * 6 == d["hidden_size"]


@pytest.mark.parametrize("model_type, level", [
    ("deepseek_v32", "small"), ("mamba2", "small"), ("zamba2", "small"), ("jamba", "small"),
    ("inkling2_loop_text", "small"), ("gemma3n_text", "small"), ("kimi_linear", "small"), ("lilt", "small3")])
def test_shrunk_config_builds_and_runs_a_forward(model_type, level):
    # the level the sweep picks for these types builds on meta and runs for real on CPU with every norm
    # module called (before: each fell back to a shrink whose forward failed, measured as NK101). A forward on
    # meta tensors is no judge: the meta grouped_mm of MoE experts refuses float32, and lilt's meta forward
    # stops on .item() before the mismatched matmul
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    forward = pytest.importorskip("forward")
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    cls = transformers.CONFIG_MAPPING[model_type]
    config = cls.from_dict(targets.shrink_config_dict(cls().to_dict(), level))
    with torch.device("meta"):
        meta = transformers.AutoModel.from_config(config)
    assert sum(p.numel() for p in meta.parameters()) < 50_000_000
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config)
    called, label = forward.forward_norms(model, config)
    assert called is not None, label
    assert called == set(forward.norm_modules(model))


def test_layer_counts_periods_and_positions_fit_the_depth():
    # Jamba: attention every 8th layer from 4 left 2 layers without attention (its cache then had no attention
    # layer: get_seq_length failed); DeepSeek-V3: 3 dense layers first made both shrunk layers dense
    d = targets.shrink_config_dict({"num_hidden_layers": 32, "attn_layer_period": 8, "attn_layer_offset": 4,
                                    "expert_layer_period": 2, "expert_layer_offset": 1, "first_k_dense_replace": 3})
    assert (d["attn_layer_period"], d["attn_layer_offset"], d["expert_layer_period"], d["expert_layer_offset"],
            d["first_k_dense_replace"]) == (2, 1, 2, 1, 1)


def test_loop_positions_stay_multiples_of_their_block():
    # Inkling2-loop's validator: loop start/end multiples of n_layers_per_attn_res_block, start > 0
    d = targets.shrink_config_dict({"num_hidden_layers": 24, "n_layers_per_attn_res_block": 6,
                                    "loop_layer_index_start": 6, "loop_layer_index_end": 18})
    assert (d["n_layers_per_attn_res_block"], d["loop_layer_index_start"], d["loop_layer_index_end"]) == (1, 1, 2)


def test_gemma3n_kv_sharing_and_per_layer_vocab_shrink():
    d = targets.shrink_config_dict({"num_hidden_layers": 35, "num_kv_shared_layers": 15, "vocab_size": 262400,
                                    "vocab_size_per_layer_input": 262144, "hidden_size": 2048})
    assert (d["num_kv_shared_layers"], d["vocab_size"], d["vocab_size_per_layer_input"]) == (0, 1024, 1024)


def test_sliding_window_given_where_sliding_heads_are_configured():
    # Step3p7: num_sliding_attention_heads set, sliding_window left None for the checkpoint to give; the
    # model builds its sliding mask from it unconditionally. Mistral's None (no sliding) stays None.
    d = targets.shrink_config_dict({"sliding_window": None, "num_sliding_attention_heads": 64, "hidden_size": 4096})
    assert d["sliding_window"] == 8 and d["num_sliding_attention_heads"] == 4
    d = targets.shrink_config_dict({"sliding_window": None, "use_sliding_window": False, "hidden_size": 4096})
    assert d["sliding_window"] is None


def test_filled_level_gives_sizes_left_to_the_checkpoint():
    # dots1 / Hunyuan / ESM defaults leave expert counts, head_dim, vocab_size None: no level builds them
    base = {"hidden_size": 4096, "num_attention_heads": 32, "n_routed_experts": None, "num_experts_per_tok": None,
            "n_shared_experts": None, "head_dim": None, "vocab_size": None, "pad_token_id": None}
    assert targets.shrink_config_dict(base)["n_routed_experts"] is None
    d = targets.shrink_config_dict(base, "filled")
    assert (d["n_routed_experts"], d["num_experts_per_tok"], d["n_shared_experts"], d["head_dim"],
            d["vocab_size"], d["hidden_size"]) == (4, 2, 1, 16, 1024, 64)
    # the one token id given: ESM compares its ids with pad_token_id (input_ids.ne(None) fails)
    assert d["pad_token_id"] == 1


def test_mrope_sections_follow_the_shrunk_rotary_width():
    # Qwen2-VL / GLM-4V: [16, 24, 24] are half of 128-wide heads; 4 heads of 64 hidden are 16 wide (8 pairs).
    # Left as they were, the rotary embedding's split failed ("split_sizes ... sum exactly to 8") at every
    # width level but "wide"
    base = {"hidden_size": 3584, "num_attention_heads": 28, "rope_parameters": {"rope_type": "default",
                                                                              "mrope_section": [16, 24, 24]}}
    assert targets.shrink_config_dict(base)["rope_parameters"] == {"rope_type": "default", "mrope_section": [2, 3, 3]}
    assert targets.shrink_config_dict(base, "wide")["rope_parameters"]["mrope_section"] == [16, 24, 24]
    assert base["rope_parameters"]["mrope_section"] == [16, 24, 24]  # the caller's dict is not changed
    # HY-V4-VL: sections sum to qk_rope_head_dim // 2 (its validator), qk_rope_head_dim 64 -> 8
    d = targets.shrink_config_dict({"hidden_size": 4096, "num_attention_heads": 32, "qk_rope_head_dim": 64,
                                    "rope_parameters": {"mrope_section": [12, 10, 10]}})
    assert (d["qk_rope_head_dim"], d["rope_parameters"]["mrope_section"]) == (8, [2, 1, 1])
    # sections that did not fit the defaults' heads either are the checkpoint's business: left alone
    d = targets.shrink_config_dict({"hidden_size": 4096, "num_attention_heads": 32,
                                    "rope_parameters": {"mrope_section": [8, 12, 12]}})
    assert d["rope_parameters"]["mrope_section"] == [8, 12, 12]


def test_mrope_sections_split():
    assert targets.mrope_sections(8) == [3, 3, 2]  # no library sections: equal thirds, remainder off the last
    assert targets.mrope_sections(12) == [4, 4, 4]
    assert targets.mrope_sections(32, [8, 12, 12]) == [8, 12, 12]
    assert sum(targets.mrope_sections(12, [16, 24, 24])) == 12


def test_widths_and_groups_tied_to_the_model_width_stay_tied():
    # WavTokenizer's validator: codebook_dim == hidden_size (no projection around the quantizer); Mimi's
    # upsampling conv has one group per channel (upsample_groups == hidden_size: "in_channels must be
    # divisible by groups"). A count that only happens to be small is left alone.
    d = targets.shrink_config_dict({"hidden_size": 512, "codebook_dim": 512, "upsample_groups": 512,
                                    "num_attention_heads": 8, "codebook_size": 2048, "num_groups": 32})
    assert (d["hidden_size"], d["codebook_dim"], d["upsample_groups"], d["codebook_size"], d["num_groups"]) == \
        (64, 64, 64, 2048, 32)


def test_per_layer_lists_of_lists_keep_every_kind():
    # MoonshineStreaming's encoder: sliding_windows per layer, [left, right] pairs (a list entry raised
    # "unhashable type: 'list'" and no level was built)
    d = targets.shrink_config_dict({"num_hidden_layers": 6, "sliding_windows": [[16, 4], [16, 4], [16, 0],
                                                                                 [16, 0], [16, 4], [16, 4]]})
    assert d["sliding_windows"] == [[16, 4], [16, 0]]


def test_filled_level_switches_on_optional_parts_the_model_builds_anyway():
    # Qwen4-Exp builds its QSA indexer on every indexed-attention layer though the defaults leave all five
    # indexer_* keys None (its validator: all or none, budget a multiple of the compress ratio, one KV head);
    # DeepSeek-OCR-2 indexes mlp_layer_types its defaults leave None; Chameleon reads vocabulary_map["<image>"]
    base = {"num_hidden_layers": 32, "hidden_size": 2048, "num_attention_heads": 16, "indexer_n_heads": None,
            "indexer_kv_heads": None, "indexer_head_dim": None, "indexer_budget": None,
            "indexer_compress_ratio": None, "mlp_layer_types": None, "vocabulary_map": None, "bos_token_id": 0,
            "eos_token_id": 2, "pad_token_id": 1}
    d = targets.shrink_config_dict(base, "filled")
    assert (d["indexer_n_heads"], d["indexer_kv_heads"], d["indexer_head_dim"], d["indexer_budget"],
            d["indexer_compress_ratio"]) == (4, 1, 16, 8, 4)
    assert d["mlp_layer_types"] == ["dense", "sparse"]
    assert d["vocabulary_map"] == {"<image>": 3}
    assert targets.shrink_config_dict(base)["indexer_budget"] is None  # only the last level fills


def test_missing_keys_are_derived_from_the_others():
    # MoonshineStreaming's decoder reads num_key_value_heads, absent from its config class
    d = {"hidden_size": 320, "num_attention_heads": 8, "encoder_num_attention_heads": 2}
    assert targets.missing_key_value(d, "num_key_value_heads") == 8
    assert targets.missing_key_value(d, "dropout") == 0.0
    assert targets.missing_key_value(d, "dropout_rate") == 0.0
    assert targets.missing_key_value(d, "rope_theta") == 10000.0
    # Nemotron's defaults leave num_key_value_heads None and its attention divides by it: "filled" gives heads
    filled = targets.shrink_config_dict({"hidden_size": 6144, "num_attention_heads": 48,
                                         "num_key_value_heads": None}, "filled")
    assert (filled["num_attention_heads"], filled["num_key_value_heads"]) == (4, 4)
    assert targets.missing_key_value(d, "vocabulary_map") is None


def test_layer_parts_that_sum_to_the_depth_keep_summing_to_it():
    # Dory's validator: n_input_layers + n_recurrent_layers + n_output_layers == num_hidden_layers (16 + 40 +
    # 16 of 72: every level but "default" was refused, and the full-size model was audited: 29 CPU s)
    d = targets.shrink_config_dict({"num_hidden_layers": 72, "n_input_layers": 16, "n_recurrent_layers": 40,
                                    "n_output_layers": 16, "hidden_size": 4096})
    assert (d["num_hidden_layers"], d["n_input_layers"], d["n_recurrent_layers"], d["n_output_layers"]) == \
        (6, 2, 2, 2)
    # counts that do not sum to the depth are not its parts
    d = targets.shrink_config_dict({"num_hidden_layers": 32, "n_input_layers": 3, "n_output_layers": 4})
    assert (d["num_hidden_layers"], d["n_input_layers"], d["n_output_layers"]) == (2, 3, 4)


def test_compound_scaling_coefficients_follow_the_shrunk_width():
    # EfficientNet-B7 defaults: the last stage is round_filters(1280 * 2.0) = 2560 = hidden_dim; hidden_dim
    # shrunk alone to 64 failed its last BatchNorm ("running_mean should contain 2560 elements not 64")
    d = targets.shrink_config_dict({"hidden_dim": 2560, "width_coefficient": 2.0, "depth_coefficient": 3.1,
                                    "depth_divisor": 8, "num_hidden_layers": 64})
    assert (d["hidden_dim"], d["width_coefficient"], d["depth_coefficient"]) == (64, 0.05, 1.0)
    assert targets.shrink_config_dict({"hidden_dim": 2560, "width_coefficient": 2.0}, "layers")["width_coefficient"] == 2.0


def test_missing_keys_are_added_where_they_are_lacking():
    # DBRX's attention sub-config class reads rope_theta, which it does not define
    d = {"d_model": 6144, "n_heads": 48, "attn_config": {"kv_n_heads": 8}, "id2label": {"0": "a"}}
    assert targets.add_missing_key(d, "rope_theta")
    assert d["rope_theta"] == 10000.0 and d["attn_config"]["rope_theta"] == 10000.0 and "rope_theta" not in d["id2label"]
    assert not targets.add_missing_key(d, "vocabulary_map")


def test_tower_widths_tied_to_the_text_width_stay_tied():
    # Dots3-Note's validator: vision_config.adapter_out_dim == text_config.hidden_size (2048 both)
    d = targets.shrink_config_dict({"text_config": {"hidden_size": 2048, "num_attention_heads": 16},
                                    "vision_config": {"hidden_size": 1536, "adapter_out_dim": 2048,
                                                      "patch_dim": 14}})
    assert (d["text_config"]["hidden_size"], d["vision_config"]["hidden_size"],
            d["vision_config"]["adapter_out_dim"], d["vision_config"]["patch_dim"]) == (64, 64, 64, 14)


def test_out_features_that_are_not_stage_names_are_left_alone():
    # backbones name their output stages; EfficientLoFTR's out_features (list[int], strictly typed) are widths
    assert targets.shrink_config_dict({"num_hidden_layers": 4, "out_features": ["stage1", "stage4"]})[
        "out_features"] == ["stage2"]
    assert targets.shrink_config_dict({"num_hidden_layers": 4, "out_features": [64, 64, 128]})[
        "out_features"] == [64, 64, 128]


def test_placeholder_tokens_are_put_inside_the_shrunk_text_vocab():
    # LLaVA-like: the text vocab is cut to 1024, the top-level image/video ids kept their checkpoint values
    # (a real forward's embedding lookup then fails); the text model's own bos/eos keep their ids
    d = targets.shrink_config_dict({
        "image_token_index": 32000, "video_token_index": 32001, "vision_start_token_id": 31999,
        "text_config": {"hidden_size": 4096, "vocab_size": 32064, "bos_token_id": 1, "eos_token_id": 1023}})
    assert d["text_config"]["vocab_size"] == 1024 and d["text_config"]["eos_token_id"] == 1023
    assert (d["vision_start_token_id"], d["image_token_index"], d["video_token_index"]) == (1020, 1021, 1022)


def test_placeholder_tokens_left_none_are_given_one():
    # BLIP-2 / Voxtral: image_token_index / audio_token_id None in the defaults: no placeholder is built
    d = targets.shrink_config_dict({"image_token_index": None, "audio_token_id": None, "pad_token_id": None,
                                    "text_config": {"hidden_size": 2560, "vocab_size": 50272}})
    assert (d["image_token_index"], d["audio_token_id"], d["pad_token_id"]) == (1023, 1022, None)
    # ids already inside the vocab and the "default" level are left alone
    same = {"image_token_index": 5, "text_config": {"hidden_size": 64, "vocab_size": 99}}
    assert targets.shrink_config_dict(same)["image_token_index"] == 5
    assert targets.shrink_config_dict({"image_token_index": None, "vocab_size": 50272}, "default")[
        "image_token_index"] is None


def test_blip2_image_forward_runs_the_whole_model_with_filled_placeholders():
    # the shrunk BLIP-2 (image_token_index None -> 1023) runs its vision tower, Q-Former and projector in one
    # forward on normaudit's own inputs (placeholders counted on the meta twin)
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    forward = pytest.importorskip("forward")
    cls = transformers.CONFIG_MAPPING["blip-2"]
    config = cls.from_dict(targets.shrink_config_dict(cls().to_dict()))
    assert config.image_token_index == 1023
    torch.manual_seed(0)
    model = transformers.Blip2Model(config)
    called, label = forward.forward_norms(model, config)
    assert "normaudit's inputs" in label.split(" | ")
    assert {"vision_model.post_layernorm", "qformer.layernorm"} <= called


def test_filled_level_derives_layer_types_and_per_layer_type_rope():
    # LFM2-MoE: layer_types None (indexed per layer); Cohere-Compass: rope_parameters {} beside layer_types,
    # read as rope_parameters[layer_type]
    d = targets.shrink_config_dict({"hidden_size": 2048, "num_hidden_layers": 32, "layer_types": None}, "filled")
    assert d["layer_types"] == ["full_attention", "full_attention"] and d["num_hidden_layers"] == 2
    d = targets.shrink_config_dict({"hidden_size": 2048, "num_hidden_layers": 40, "rope_parameters": {},
                                    "layer_types": ["sliding_attention"] * 39 + ["full_attention"]}, "filled")
    assert d["rope_parameters"] == {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    assert targets.shrink_config_dict({"num_hidden_layers": 4, "rope_parameters": {},
                                       "layer_types": ["full_attention"] * 4})["rope_parameters"] == {}


def test_several_automodel_classes_name_the_first_in_architectures():
    # Funnel: MODEL_MAPPING_NAMES["funnel"] == ("FunnelModel", "FunnelBaseModel"); AutoModel failed on the tuple
    transformers = pytest.importorskip("transformers")
    config = targets.model_config(transformers.FunnelConfig())
    assert config.architectures == ["FunnelModel"]


def test_mrope_sections_go_into_each_per_layer_type_entry():
    transformers = pytest.importorskip("transformers")
    cls = transformers.CONFIG_MAPPING["cohere_compass_text"]
    config = cls.from_dict(targets.shrink_config_dict(cls().to_dict(), "filled"))
    targets.fill_rope_sections(config)
    assert config.rope_parameters == {"full_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                         "mrope_section": [3, 3, 2]}}


def test_filled_sections_keep_interleaved_height_and_width_equal():
    # ERNIE-4.5-VL-MoE's defaults leave mrope_section out (its modeling falls back to [22, 22, 20]) and its
    # rotary embedding stacks the height and width frequencies: with Qwen2-VL's proportions ([2, 3, 3] of 8)
    # the forward failed, "stack expects each tensor to be equal size, but got [2, 16, 2] ... [2, 16, 3]"
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cls = transformers.CONFIG_MAPPING["ernie4_5_vl_moe"]
    config = cls.from_dict(targets.shrink_config_dict(cls().to_dict()))
    targets.fill_rope_sections(config)
    text = config.text_config
    assert (text.hidden_size, text.num_attention_heads, text.rope_parameters["mrope_section"]) == (64, 4, [3, 3, 2])
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config)
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 100, (2, 16)))
    assert tuple(out.last_hidden_state.shape) == (2, 16, 64)


def test_width_named_after_a_sibling_sub_config_follows_its_shrink():
    # BLT: encoder_config/decoder_config.hidden_size_global is global_config.hidden_size (2048); left as it was,
    # the local encoder's patch projection did "[2*u2 + 4, 64] X [2048, 128]" in capture
    transformers = pytest.importorskip("transformers")
    base = transformers.CONFIG_MAPPING["blt"]().to_dict()
    assert base["encoder_config"]["hidden_size_global"] == base["global_config"]["hidden_size"] == 2048
    d = targets.shrink_config_dict(base)
    assert (d["global_config"]["hidden_size"], d["encoder_config"]["hidden_size_global"],
            d["decoder_config"]["hidden_size_global"], d["encoder_config"]["hidden_size"]) == (64, 64, 64, 64)
    w = targets.shrink_config_dict(base, "wide")
    assert (w["global_config"]["hidden_size"], w["encoder_config"]["hidden_size_global"]) == (512, 512)
    # a width that names a sibling but never equalled it is left to the shrink of widths alone
    d = targets.shrink_config_dict({"a_config": {"hidden_size_b": 300}, "b_config": {"hidden_size": 2048}})
    assert (d["a_config"]["hidden_size_b"], d["b_config"]["hidden_size"]) == (300, 64)


def test_filled_level_gives_clamp_bounds_and_expert_top_k_left_none():
    # DBRX's attn_config.clip_qkv None reaches clamp(min=None, max=None); DeepSeek-V2's num_experts_per_tok
    # None reaches topk(k=None): both build at "small" and fail in the forward, so the sweep tries "filled"
    transformers = pytest.importorskip("transformers")
    dbrx = transformers.CONFIG_MAPPING["dbrx"]().to_dict()
    assert dbrx["attn_config"]["clip_qkv"] is None
    assert targets.shrink_config_dict(dbrx)["attn_config"]["clip_qkv"] is None
    assert targets.shrink_config_dict(dbrx, "filled")["attn_config"]["clip_qkv"] == 8.0
    ds = transformers.CONFIG_MAPPING["deepseek_v2"]().to_dict()
    d = targets.shrink_config_dict(ds, "filled")
    assert (d["n_routed_experts"], d["num_experts_per_tok"], d["n_group"], d["topk_group"]) == (4, 2, 1, 1)
    assert targets.shrink_config_dict(ds)["num_experts_per_tok"] is None


def test_filled_level_gives_a_padding_id_the_defaults_leave_none():
    from transformers import EsmConfig

    base = EsmConfig().to_dict()
    assert base["pad_token_id"] is None  # ESM's defaults; its forward calls input_ids.ne(pad_token_id)
    assert targets.shrink_config_dict(base, "filled")["pad_token_id"] == 1
    assert targets.shrink_config_dict(base, "small")["pad_token_id"] is None
    assert targets.shrink_config_dict({**base, "pad_token_id": 0}, "filled")["pad_token_id"] == 0


def test_image_sizes_above_448_are_cut_to_a_multiple_of_patch_and_merge():
    # Mistral3 / LightOnOCR: 1540 px of 14-px patches, merged 2x2 by a key of the parent config
    d = {"spatial_merge_size": 2, "vision_config": {"image_size": 1540, "patch_size": 14}}
    assert targets.shrink_image_sizes(d) == {"spatial_merge_size": 2,
                                             "vision_config": {"image_size": 224, "patch_size": 14}}
    assert d["vision_config"]["image_size"] == 1540  # a copy: the level's dict is kept for the fallback
    # SAM: the vision tower and the prompt encoder stay equal; SAM2's Hiera [h, w] at stem stride 4
    sam = targets.shrink_image_sizes({"vision_config": {"image_size": 1024, "patch_size": 16},
                                      "prompt_encoder_config": {"image_size": 1024, "patch_size": 16}})
    assert (sam["vision_config"]["image_size"], sam["prompt_encoder_config"]["image_size"]) == (224, 224)
    # SAM's prompt encoder also names its grid (1024 / 16 = 64): it stays image_size // patch_size
    sam = targets.shrink_image_sizes({"vision_config": {"image_size": 1024, "patch_size": 16},
                                      "prompt_encoder_config": {"image_size": 1024, "patch_size": 16,
                                                                "image_embedding_size": 64}})
    assert sam["prompt_encoder_config"] == {"image_size": 224, "patch_size": 16, "image_embedding_size": 14}
    sam2 = targets.shrink_image_sizes({"vision_config": {"backbone_config": {
        "image_size": [1024, 1024], "patch_stride": [4, 4]}}, "prompt_encoder_config": {"image_size": 1024,
                                                                                        "patch_size": 16}})
    assert sam2["vision_config"]["backbone_config"]["image_size"] == [224, 224]
    assert sam2["prompt_encoder_config"]["image_size"] == 224
    # a unit that does not divide 224: the largest multiple below it (patch 32 x merge 3 = 96 -> 192)
    assert targets.shrink_image_sizes({"image_size": 960, "patch_size": 32, "merge_size": 3})["image_size"] == 192
    # an EfficientNet (ALIGN) with no patch: even sizes; sizes up to 448 are left, and the dict itself returned
    assert targets.shrink_image_sizes({"vision_config": {"image_size": 600}})["vision_config"]["image_size"] == 224
    small = {"vision_config": {"image_size": 384, "patch_size": 16}, "text_config": {"vocab_size": 1024}}
    assert targets.shrink_image_sizes(small) is small


def test_long_context_is_cut_to_a_multiple_of_the_patch_length():
    # TimesFM-2.5: context_length 16384 (the past_values length both forwards build) -> 512 = 16 patches of 32
    d = targets.shrink_config_dict({"hidden_size": 1280, "num_hidden_layers": 20, "context_length": 16384,
                                    "patch_length": 32, "max_position_embeddings": 16384})
    assert (d["context_length"], d["patch_length"], d["max_position_embeddings"]) == (512, 32, 16384)
    assert targets.shrink_config_dict({"hidden_size": 1280, "context_length": 16384}, "layers")["context_length"] == 512
    # TimesFM-1's 512 and RWKV's 1024 are left
    assert targets.shrink_config_dict({"hidden_size": 1280, "context_length": 1024})["context_length"] == 1024
    assert targets.shrink_config_dict({"context_length": 16384}, "default")["context_length"] == 16384


def test_depth_derived_from_a_per_stack_count_keeps_its_ratio():
    # HRM-Text: num_hidden_layers = num_layers_per_stack * H_cycles * (L_cycles + 1) = 16 * 2 * 4 = 128
    base = {"hidden_size": 1024, "num_hidden_layers": 128, "num_layers_per_stack": 16, "H_cycles": 2,
            "L_cycles": 3}
    d = targets.shrink_config_dict(base)
    assert (d["num_layers_per_stack"], d["num_hidden_layers"], d["H_cycles"], d["L_cycles"]) == (2, 16, 2, 3)
    # a per-stack count that does not divide the depth is no such relation: only the depth is cut
    d = targets.shrink_config_dict({"num_hidden_layers": 30, "num_layers_per_stack": 16})
    assert (d["num_hidden_layers"], d["num_layers_per_stack"]) == (2, 16)


def test_pairs_level_keeps_two_layers_of_each_kind():
    # Zamba ties the shared attention block of every "hybrid" layer to the first one: with one hybrid layer
    # transformers finds no tie target and refuses the build at every 2-layer level
    kinds = ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 5 + ["hybrid"] + ["mamba"]
    base = {"hidden_size": 3712, "num_hidden_layers": 12, "layers_block_type": kinds}
    d = targets.shrink_config_dict(base, "pairs")
    assert (d["num_hidden_layers"], d["layers_block_type"]) == (4, ["mamba", "mamba", "hybrid", "hybrid"])
    assert d["hidden_size"] == 64
    assert targets.shrink_config_dict(base)["layers_block_type"] == ["mamba", "hybrid"]
    # one kind only: the pairs level is the small one
    one = {"hidden_size": 3712, "num_hidden_layers": 12, "layer_types": ["full"] * 12}
    assert targets.shrink_config_dict(one, "pairs") == targets.shrink_config_dict(one)


def test_zamba_builds_at_the_pairs_level():
    transformers = pytest.importorskip("transformers")
    import torch

    cls = transformers.CONFIG_MAPPING["zamba"]
    config = cls.from_dict(targets.shrink_config_dict(cls().to_dict(), "pairs"))
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    assert [type(m).__name__ for m in model.layers] == ["ZambaMambaDecoderLayer", "ZambaMambaDecoderLayer",
                                                        "ZambaHybridLayer", "ZambaHybridLayer"]
    with pytest.raises(ValueError, match="tie_weights_keys"):
        with torch.device("meta"):
            transformers.AutoModel.from_config(cls.from_dict(targets.shrink_config_dict(cls().to_dict())))


def test_each_level_is_tried_with_its_image_sizes_cut_first():
    pytest.importorskip("transformers")
    worker = pytest.importorskip("worker")
    base = {"hidden_size": 768, "num_hidden_layers": 12, "vision_config": {"image_size": 1024, "patch_size": 16}}
    tried = [(level, d["vision_config"]["image_size"]) for level, d in worker._level_dicts(base)]
    assert tried == [("small (images cut)", 224), ("small", 1024), ("small3 (images cut)", 224), ("small3", 1024),
                     ("wide (images cut)", 224), ("wide", 1024), ("layers (images cut)", 224), ("layers", 1024),
                     ("default", 1024), ("filled", 1024)]  # "pairs" is "small" here (no per-layer list)
    # nothing to cut: each level once; "layers" equals "default" where only widths would shrink
    assert [level for level, _ in worker._level_dicts({"hidden_size": 768, "num_hidden_layers": 12})] == [
        "small", "small3", "wide", "layers", "default", "filled"]
    assert [level for level, _ in worker._level_dicts({"hidden_size": 768})] == [
        "small", "small3", "wide", "layers", "filled"]
    errors = {}
    assert worker._level_name("small (images cut)", errors) == "small"
    assert errors == {"images": "cut to <= 224 px (targets.shrink_image_sizes)"}
    assert worker._level_name("layers", errors) == "layers"
