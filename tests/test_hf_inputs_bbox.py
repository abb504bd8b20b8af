"""Word boxes for document models: ``bbox`` built as transformers' LayoutLM/Bros model tests build it
(legal boxes, one per token), tiny real configs on the meta device."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import audit_model  # noqa: E402
from normaudit.loaders.inputs import infer_hf_inputs  # noqa: E402

TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=99)


def _meta(config_cls: str, **kw):
    cfg = getattr(transformers, config_cls)(**kw)
    with torch.device("meta"):
        return transformers.AutoModel.from_config(cfg).eval()


def test_layout_boxes_are_int_coordinates_of_the_position_tables():
    # LayoutLMv3 looks each coordinate up in tables of max_2d_position_embeddings (1024) rows: int64 in 0-1000
    # (its image of ``input_size`` 224 comes with them: tests/test_hf_inputs_int.py)
    model = _meta("LayoutLMv3Config", **TEXT, coordinate_size=4, shape_size=8)
    kwargs, said = infer_hf_inputs(model)
    assert said == "input_ids int64 (2, 16), pixel_values float (2, 3, 224, 224), bbox int64 (2, 16, 4)"
    box = kwargs["bbox"]
    assert int(box.min()) >= 0 and int(box.max()) <= 1000
    assert bool((box[..., 2] >= box[..., 0]).all()) and bool((box[..., 3] >= box[..., 1]).all())


def test_bros_boxes_are_four_float_corners():
    # Bros: dim_bbox 8, no position tables: float corners (x0, y0), (x1, y0), (x1, y1), (x0, y1) in [0, 1]
    model = _meta("BrosConfig", **TEXT, dim_bbox_projection=8)
    kwargs, said = infer_hf_inputs(model)
    assert said == "input_ids int64 (2, 16), bbox float (2, 16, 8)"
    box = kwargs["bbox"]
    assert float(box.min()) >= 0.0 and float(box.max()) <= 1.0
    assert torch.equal(box[..., [0, 1, 2, 5]], box[..., [6, 3, 4, 7]])  # x0, y0, x1, y1 each shared by 2 corners
    assert bool((box[..., 2] >= box[..., 0]).all()) and bool((box[..., 5] >= box[..., 1]).all())


def test_boxes_given_to_layoutlm_keep_a_whole_capture(rules):
    model = _meta("LayoutLMConfig", **TEXT)
    assert infer_hf_inputs(model)[1] == "input_ids int64 (2, 16), bbox int64 (2, 16, 4)"
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export", report.capture.attempts
    graphed = sorted({s.module for s in report.sites if s.detected_by != "module_walk"})
    assert graphed == ["embeddings.LayerNorm", "encoder.layer.0.attention.output.LayerNorm",
                       "encoder.layer.0.output.LayerNorm", "encoder.layer.1.attention.output.LayerNorm",
                       "encoder.layer.1.output.LayerNorm"]
