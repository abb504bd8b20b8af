"""Required and optional ``forward`` inputs that are neither text, images nor audio
(normaudit.loaders.inputs.companions): the exact names, shapes and dtypes built for tiny configs of real
transformers classes, and the captures."""
from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import audit_model  # noqa: E402
from normaudit.loaders.inputs.companions import COMPANION_BUILDERS, COMPANION_VARIANTS  # noqa: E402
from normaudit.loaders.inputs import infer_hf_inputs  # noqa: E402

F, I = torch.float32, torch.int64
TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _auto_meta(config_cls: str, model_cls: str = "", **kw) -> nn.Module:
    cfg = getattr(transformers, config_cls)(**kw)
    with torch.device("meta"):
        if model_cls:
            return getattr(transformers, model_cls)(cfg).eval()
        return transformers.AutoModel.from_config(cfg).eval()


def _norm_modules(model: nn.Module) -> list[str]:
    kinds = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.RMSNorm)
    return [n for n, m in model.named_modules()
            if isinstance(m, kinds) or type(m).__name__.endswith(("LayerNorm", "RMSNorm"))]


def _built(name: str, config) -> tuple[tuple[int, ...], torch.dtype]:
    out = list(COMPANION_BUILDERS[name](config))
    assert len(out) == 1
    return tuple(out[0].shape), out[0].dtype


DRAFTER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, layer_types=["sliding_attention"], block_size=16,
               target_layer_ids=[1, 3, 5])


def test_drafter_gets_embeddings_and_the_target_model_layers_it_conditions_on():
    # a DFlash drafter: forward(noise_embeds (B, block, hidden), context_hidden_states (B, S, hidden * 3 target
    # layers)), both required; its main_input_name noise_embeds has no builder of a known modality
    model = _auto_meta("MuseGlimmerAssistantConfig", **DRAFTER)
    kwargs, said = infer_hf_inputs(model)
    assert said == "noise_embeds float (2, 16, 32), context_hidden_states float (2, 16, 96)"
    assert kwargs["context_hidden_states"].dtype == F


def test_drafter_forward_runs_and_its_norms_are_sites(rules):
    # the whole forward does not export (transformers' sliding-window mask is built over the noise block only,
    # (S, S), against keys over context + block, (S, 2S)); its parts, captured alone, hold every norm
    model = _auto_meta("MuseGlimmerAssistantConfig", **DRAFTER)
    report = audit_model(model, rules=rules, on_meta=True)
    norms = _norm_modules(model)
    graphed = sorted({s.module for s in report.sites if s.detected_by != "module_walk"})
    assert report.capture.method == "parts" and not report.capture.complete
    assert len(norms) == 6 and graphed == sorted(norms) and report.capture.unaudited == []


def test_task_prompt_tokens_are_sized_by_the_task_sequence_length():
    # OneFormer's task_inputs: the task text's token ids, task_seq_len long (its task MLP reads that width)
    cfg = transformers.OneFormerConfig(task_seq_len=11, text_encoder_vocab_size=50)
    out = next(COMPANION_BUILDERS["task_inputs"](cfg))
    assert (tuple(out.shape), out.dtype) == ((2, 11), I) and int(out.max()) < 50


def test_oneformer_gets_its_task_tokens_beside_the_images():
    backbone = dict(model_type="swin", embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], image_size=64,
                    out_features=["stage1", "stage2", "stage3", "stage4"])
    model = _auto_meta("OneFormerConfig", "OneFormerModel", backbone_config=backbone, task_seq_len=9,
                       hidden_dim=32, conv_dim=32, mask_dim=32, encoder_layers=1, decoder_layers=2,
                       dim_feedforward=64, num_queries=8, text_encoder_width=32, text_encoder_num_layers=1,
                       text_encoder_context_length=9, encoder_feedforward_dim=64)
    kwargs, said = infer_hf_inputs(model)
    assert said.endswith("task_inputs int64 (2, 9)") and said.startswith("pixel_values float (2, 3, ")


def test_class_prompts_come_with_their_masks_and_count_per_image():
    # OmDet-Turbo: class prompts flattened to (sum(classes_structure), S) with their masks, task prompts
    # (B, S) with theirs; one class prompt per image keeps classes_input_ids (B, S)
    backbone = dict(model_type="swin", embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1], window_size=7,
                    image_size=64, out_indices=[2, 3, 4])
    text = dict(model_type="clip_text_model", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=16, vocab_size=99)
    model = _auto_meta("OmDetTurboConfig", "OmDetTurboForObjectDetection", text_config=text,
                       backbone_config=backbone, use_timm_backbone=False, backbone=None, image_size=64,
                       encoder_in_channels=[16, 32, 64], vision_features_channels=[8, 8, 8], encoder_hidden_dim=8,
                       decoder_hidden_dim=8, num_queries=10, encoder_layers=1, decoder_num_layers=1,
                       encoder_projection_indices=[2], encoder_attention_heads=2, decoder_num_heads=2,
                       encoder_dim_feedforward=16, task_encoder_hidden_dim=16, decoder_dim_feedforward=16,
                       class_embed_dim=16, text_projection_in_dim=16, text_projection_out_dim=16)
    kwargs, said = infer_hf_inputs(model)
    assert said == ("pixel_values float (2, 3, 64, 64), classes_input_ids int64 (2, 16), classes_attention_mask "
                    "int64 (2, 16), tasks_input_ids int64 (2, 16), tasks_attention_mask int64 (2, 16), "
                    "classes_structure int64 (2,)")
    assert kwargs["classes_structure"].tolist() == [1, 1] and int(kwargs["tasks_attention_mask"].min()) == 1


def test_region_features_and_boxes_are_sized_by_the_config():
    cfg = transformers.LxmertConfig(visual_feat_dim=24, visual_pos_dim=4)
    assert _built("visual_feats", cfg) == ((2, 8, 24), F)
    boxes = next(COMPANION_BUILDERS["visual_pos"](cfg))
    assert tuple(boxes.shape) == (2, 8, 4) and 0 <= float(boxes.min()) and float(boxes.max()) <= 1
    # a config that describes no detector regions gets none (the optional input is left out)
    assert list(COMPANION_BUILDERS["visual_feats"](transformers.BertConfig())) == []


def test_encoder_states_only_for_a_config_that_sizes_a_cross_attention():
    qformer = transformers.Blip2QFormerConfig(hidden_size=32, encoder_hidden_size=48)
    assert _built("encoder_hidden_states", qformer) == ((2, 16, 48), F)
    assert _built("encoder_hidden_states", transformers.BertConfig(hidden_size=32, add_cross_attention=True)) \
        == ((2, 16, 32), F)
    assert list(COMPANION_BUILDERS["encoder_hidden_states"](transformers.BertConfig(hidden_size=32))) == []


def test_query_embeds_of_a_qformer_called_alone():
    assert _built("query_embeds", transformers.Blip2QFormerConfig(hidden_size=32)) == ((2, 16, 32), F)


def test_image_sets_for_a_model_that_cross_attends_to_each_examples_images():
    cfg = transformers.IdeficsConfig(vision_config=dict(embed_dim=32, image_size=28, patch_size=14,
                                                        num_hidden_layers=1, num_attention_heads=4))
    variant = COMPANION_VARIANTS["image_encoder_embeddings"]
    images = next(variant["pixel_values"](cfg))
    mask = next(variant["image_attention_mask"](cfg))
    assert (tuple(images.shape), images.dtype) == ((2, 1, 3, 28, 28), F)
    assert (tuple(mask.shape), mask.dtype) == ((2, 16, 1), I)
