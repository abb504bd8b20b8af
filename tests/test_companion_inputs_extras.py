"""Optional ``forward`` inputs a model raises without, built where the config describes them
(companions.COMPANION_EXTRAS / COMPANION_VARIANTS through infer_hf_inputs): exact inputs and captures."""
from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import audit_model  # noqa: E402
from normaudit.loaders.inputs import infer_hf_inputs  # noqa: E402

TEXT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _meta(config_cls: str, model_cls: str, **kw) -> nn.Module:
    cfg = getattr(transformers, config_cls)(**kw)
    with torch.device("meta"):
        return getattr(transformers, model_cls)(cfg).eval()


def _norm_modules(model: nn.Module) -> list[str]:
    kinds = (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._BatchNorm, nn.RMSNorm)
    return [n for n, m in model.named_modules()
            if isinstance(m, kinds) or type(m).__name__.endswith(("LayerNorm", "RMSNorm"))]


CASES = {
    # LXMERT raises "visual_feats cannot be None": detector regions (B, R, visual_feat_dim) and their boxes
    "regions": (("LxmertConfig", "LxmertModel", dict(TEXT, vocab_size=99, l_layers=1, x_layers=1, r_layers=1,
                                                      visual_feat_dim=24, visual_pos_dim=4)),
                "input_ids int64 (2, 16), visual_feats float (2, 8, 24), visual_pos float (2, 8, 4)", 12),
    # a Q-Former called alone: its query embeddings and the image encoder's features it cross-attends to
    "encoder_states": (("Blip2QFormerConfig", "Blip2QFormerModel", dict(TEXT, vocab_size=99, encoder_hidden_size=48)),
                       "query_embeds float (2, 16, 32), encoder_hidden_states float (2, 16, 48)", 6),
    # IDEFICS cross-attends to a set of images per example: (B, 1, C, H, W) and which tokens see them
    "image_sets": (("IdeficsConfig", "IdeficsModel", dict(TEXT, vocab_size=99, num_hidden_layers=1,
                                                           vision_config=dict(embed_dim=32, image_size=28,
                                                                              patch_size=14, num_hidden_layers=1,
                                                                              num_attention_heads=4,
                                                                              intermediate_size=64))),
                   "input_ids int64 (2, 16), pixel_values float (2, 1, 3, 28, 28), image_attention_mask int64 (2, 16, 1)",
                   None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_optional_inputs_the_forward_needs_are_built_and_captured(case, rules):
    (config_cls, model_cls, kw), expected, count = CASES[case]
    model = _meta(config_cls, model_cls, **kw)
    assert infer_hf_inputs(model)[1] == expected
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export", report.capture.attempts
    norms = _norm_modules(model)
    graphed = sorted({s.module for s in report.sites if s.detected_by != "module_walk"})
    assert graphed == sorted(norms) and report.capture.unaudited == []
    if count is not None:
        assert len(norms) == count


def test_no_encoder_states_for_a_model_that_does_not_cross_attend():
    # BERT takes encoder_hidden_states but, built without add_cross_attention, runs (and is audited) on text
    model = _meta("BertConfig", "BertModel", **TEXT, vocab_size=99)
    assert infer_hf_inputs(model)[1] == "input_ids int64 (2, 16)"
