"""The inferred inputs of the image-grid vision-language models (GLM-4V, GLM-4.5V; Qwen2-VL's scheme) follow
the config's own relations: ``pixel_values`` rows are the patches of ``image_grid_thw`` (its products
summed), each row ``channels x temporal_patch_size x patch_size^2`` values, ``input_ids`` hold one image
token per merge window (grid product / ``spatial_merge_size``^2) and ``mm_token_type_ids`` marks them, as
the processors return them. Built on the meta device from the library's full-size default config (depths
cut to one layer: the inputs read no depth) and from a config with other patch, merge and temporal sizes."""
from __future__ import annotations

import pytest
import torch

from conftest import audit_model
from normaudit.loaders.inputs import infer_hf_inputs

transformers = pytest.importorskip("transformers")


def _meta(config):
    from normaudit.loaders.meta_init import meta_init_skipped

    with torch.device("meta"), meta_init_skipped():
        return transformers.AutoModel.from_config(config)


def _default(model_type: str):
    if model_type not in transformers.CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    config = transformers.CONFIG_MAPPING[model_type]()
    config.text_config.num_hidden_layers, config.vision_config.depth = 1, 1
    if hasattr(config.text_config, "first_k_dense_replace"):
        config.text_config.first_k_dense_replace = 1
    return config


def _check_relations(config, kwargs) -> None:
    vision = config.vision_config
    grid, pixels = kwargs["image_grid_thw"], kwargs["pixel_values"]
    assert pixels.shape[0] == int(grid.prod(-1).sum())
    assert pixels.shape[1] == vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    per_image = [int(g.prod()) // vision.spatial_merge_size ** 2 for g in grid]
    assert (kwargs["input_ids"] == config.image_token_id).sum(-1).tolist() == per_image
    assert ((kwargs["mm_token_type_ids"] == 1) == (kwargs["input_ids"] == config.image_token_id)).all()


@pytest.mark.parametrize("model_type", ["glm4v", "glm4v_moe"])
def test_full_size_default_config_inputs(model_type):
    # patch 14, temporal patch 2, merge 2, 3 channels: two 4 x 4 patch grids (2 merge windows a side), rows of
    # 3 * 2 * 14 * 14 = 1176 values, 16 / 2^2 = 4 image tokens before the 16 text tokens of each example
    config = _default(model_type)
    assert (config.vision_config.patch_size, config.vision_config.temporal_patch_size,
            config.vision_config.spatial_merge_size) == (14, 2, 2)
    kwargs, said = infer_hf_inputs(_meta(config))
    assert said == ("input_ids int64 (2, 20), pixel_values float (32, 1176), image_grid_thw int64 (2, 3), "
                    "mm_token_type_ids int64 (2, 20)")
    assert kwargs["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    assert (kwargs["input_ids"][:, :4] == config.image_token_id).all()
    assert kwargs["mm_token_type_ids"].tolist() == [[1] * 4 + [0] * 16] * 2
    _check_relations(config, kwargs)


def test_modified_patch_merge_and_temporal_sizes_move_every_input():
    # patch 16, no temporal patching, merge 4: two 8 x 8 grids (2 merge windows of 4 a side), 128 rows of
    # 3 * 1 * 16 * 16 = 768 values, 64 / 4^2 = 4 image tokens per example
    config = _default("glm4v")
    vision = config.vision_config
    vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size, vision.image_size = 16, 1, 4, 448
    kwargs, said = infer_hf_inputs(_meta(config))
    assert said == ("input_ids int64 (2, 20), pixel_values float (128, 768), image_grid_thw int64 (2, 3), "
                    "mm_token_type_ids int64 (2, 20)")
    assert kwargs["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]
    _check_relations(config, kwargs)


def test_glm4v_with_the_checkpoints_rope_settings_is_captured_whole_on_meta(rules):
    """GLM-4V's default config with partial_rotary_factor 0.5, as its checkpoints set it (the default alone
    cannot run: NK111), widths cut so the capture takes seconds: the whole multimodal forward is one graph
    (the image tokens, the grid and mm_token_type_ids agree), every norm module a graph site."""
    config = _default("glm4v")
    text, vision = config.text_config, config.vision_config
    text.rope_parameters = dict(text.rope_parameters, partial_rotary_factor=0.5)
    text.hidden_size, text.num_attention_heads, text.num_key_value_heads = 256, 2, 2
    text.intermediate_size, text.vocab_size = 64, 1024
    vision.hidden_size, vision.num_heads, vision.intermediate_size, vision.out_hidden_size = 64, 2, 64, 256
    config.image_token_id, config.video_token_id = 1000, 1001
    config.image_start_token_id, config.image_end_token_id = 1002, 1003
    config.video_start_token_id, config.video_end_token_id = 1004, 1005
    model = _meta(config).eval()
    report = audit_model(model, rules=rules, on_meta=True)
    assert [(a.method, a.ok) for a in report.capture.attempts] == [
        ("export", False), ("export (integer inputs as constants)", True)]
    assert report.capture.complete and report.capture.parts == [] and report.capture.unaudited == []
    assert report.capture.inputs == ["input_ids: int64[2, 20]", "pixel_values: float32[32, 1176]",
                                     "image_grid_thw: int64[2, 3]", "mm_token_type_ids: int64[2, 20]"]
    from normaudit.vocabulary.kinds import norm_modules

    norms = sorted(p for p, _, _ in norm_modules(dict(model.named_modules())) if p)
    assert sorted({s.module for s in report.sites}) == norms and len(norms) == 10
