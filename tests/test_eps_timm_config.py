"""NE101 against a library's config, the timm case: the configuration a timm model keeps is a library's, like
transformers' ``PretrainedConfig`` (tests/fixtures/eps/NE101_7.py, NE101_8.py) and diffusers' ``ConfigMixin``
(tests/test_eps_config.py::test_diffusers_style_config_property_is_a_library_config) already are.

timm builds its ViT norms with ``norm_layer=partial(nn.LayerNorm, eps=1e-6)`` and keeps ``pretrained_cfg``
(input size, mean/std, crop: timm/models/_builder.py ``model.pretrained_cfg = pretrained_cfg``), which names
no norm's eps: no config, no finding. A timm-defined model holding a config that does name an eps key
(``layer_norm_eps``) is a library's choice: info at most, while the same model defined by a user is an error.
"""
from __future__ import annotations

from functools import partial

import torch
from torch import nn

from conftest import audit_model, family_rules
from normaudit.loaders.config import model_configs

PRETRAINED_CFG = {"url": "", "num_classes": 10, "input_size": (3, 16, 16), "pool_size": None,
                  "crop_pct": 0.9, "interpolation": "bicubic", "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5),
                  "first_conv": "patch_embed.proj", "classifier": "head"}


class Block(nn.Module):
    """timm vision_transformer.Block, attention and MLP reduced to one Linear each."""

    def __init__(self, d: int, norm_layer):
        super().__init__()
        self.norm1, self.attn = norm_layer(d), nn.Linear(d, d)
        self.norm2, self.mlp = norm_layer(d), nn.Linear(d, d)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """timm's ViT layout: patch_embed.proj, blocks.N, norm, head; ``extra_cfg`` is kept as ``self.cfg``."""

    def __init__(self, d: int = 16, extra_cfg=None):
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, d, 4, 4)
        self.blocks = nn.Sequential(*[Block(d, norm_layer) for _ in range(2)])
        self.norm, self.head = norm_layer(d), nn.Linear(d, 10)
        self.pretrained_cfg = dict(PRETRAINED_CFG)
        if extra_cfg is not None:
            self.cfg = extra_cfg

    def forward(self, x):
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


class TimmVisionTransformer(VisionTransformer):
    __module__ = "timm.models.vision_transformer"


IMAGES = (torch.randn(2, 3, 16, 16),)
NORMS = ["blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1", "blocks.1.norm2", "norm"]


def _ne(report):
    return sorted((f.rule_id, f.module, f.severity) for f in report.findings if f.rule_id.startswith("NE"))


def test_timm_pretrained_cfg_names_no_eps_and_is_no_config():
    model = TimmVisionTransformer()
    assert model_configs(model) == []
    report = audit_model(model, IMAGES, rules=family_rules("eps"))
    assert sorted(s.module for s in report.sites) == NORMS
    assert {s.eps for s in report.sites} == {1e-6}
    assert _ne(report) == []


def test_a_config_kept_by_a_timm_model_is_a_library_config():
    cfg = {"layer_norm_eps": 1e-5}
    timm_model = TimmVisionTransformer(extra_cfg=cfg)
    assert [(c.path, c.attr, c.library) for c in model_configs(timm_model)] == [("", "cfg", True)]
    timm_report = audit_model(timm_model, IMAGES, rules=family_rules("eps"))
    assert {(r, s) for r, _, s in _ne(timm_report)} == {("NE101", "info")}
    assert sorted(m for _, m, _ in _ne(timm_report)) == NORMS
    # the same code defined by a user: its own config, so the disagreement is an error
    user_model = VisionTransformer(extra_cfg=dict(cfg))
    assert [(c.path, c.attr, c.library) for c in model_configs(user_model)] == [("", "cfg", False)]
    assert _ne(audit_model(user_model, IMAGES, rules=family_rules("eps"))) == [
        ("NE101", m, "error") for m in NORMS]
