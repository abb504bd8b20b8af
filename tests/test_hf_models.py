"""Clean real models no one here wrote (transformers, tiny configs, built on the meta device, no downloads):
every norm module is one site with the right kind and eps, and nothing is flagged at warning or above."""
from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import audit_model, loud  # noqa: E402


def _norm_modules(model: nn.Module) -> list[str]:
    out = []
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if isinstance(mod, (nn.LayerNorm, nn.RMSNorm)) or cls.endswith(("LayerNorm", "RMSNorm")):
            out.append(name)
    return out


def _build(config_cls, model_cls, **kw):
    cfg = config_cls(**kw)
    with torch.device("meta"):
        model = model_cls(cfg)
    return model, cfg


CASES = {
    "bert": ("BertConfig", "BertModel", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=64, vocab_size=100), "LayerNorm", 1e-12, "feature"),
    "gpt2": ("GPT2Config", "GPT2Model", dict(n_embd=32, n_layer=2, n_head=4, vocab_size=100,
                                             bos_token_id=0, eos_token_id=0), "LayerNorm", 1e-5, "feature"),
    "llama": ("LlamaConfig", "LlamaModel", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=4, vocab_size=100,
                                                rms_norm_eps=1e-5), "RMSNorm", 1e-5, "feature"),
    "t5": ("T5Config", "T5Model", dict(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, vocab_size=100,
                                       layer_norm_epsilon=1e-6), "RMSNorm", 1e-6, "feature"),
    "vit": ("ViTConfig", "ViTModel", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=64, image_size=32, patch_size=8), "LayerNorm", 1e-12, None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_clean_transformers_model(name, rules):
    cfg_name, model_name, kw, kind, eps, axis = CASES[name]
    model, cfg = _build(getattr(transformers, cfg_name), getattr(transformers, model_name), **kw)
    expected = _norm_modules(model)
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete
    assert [s.module for s in report.sites] == expected
    assert {s.kind for s in report.sites} == {kind}
    assert {s.eps for s in report.sites} == {eps}
    for s in report.sites:
        assert s.normalized_axes == [axis] if axis else s.normalized_axes in (["feature"], ["channel"]), s
    assert loud(report) == []
    if name in ("llama", "t5"):  # hand-written RMSNorms: the gain multiply belongs to the site
        assert {(s.affine_weight, s.affine_bias) for s in report.sites} == {(True, False)}


def test_t5_layer_norm_is_rmsnorm_by_computation(rules):
    model, _ = _build(transformers.T5Config, transformers.T5Model, d_model=32, d_ff=64, num_layers=1,
                      num_heads=4, d_kv=8, vocab_size=100)
    report = audit_model(model, rules=rules, on_meta=True)
    s = next(s for s in report.sites if s.module == "encoder.final_layer_norm")
    assert (s.class_name, s.kind, s.detected_by) == ("T5LayerNorm", "RMSNorm", "pattern")
    assert s.reduced_dims == [2] and s.normalized_shape == [32]


def test_convnext_layer_norms_are_over_channels(rules):
    model, cfg = _build(transformers.ConvNextConfig, transformers.ConvNextModel, hidden_sizes=[8, 16],
                        depths=[1, 1], num_stages=2, image_size=32)
    report = audit_model(model, rules=rules, on_meta=True)
    assert [s.module for s in report.sites] == _norm_modules(model)
    assert {s.kind for s in report.sites} == {"LayerNorm"}
    assert all(s.normalized_axes == ["channel"] for s in report.sites)
    # Block norms hard-code 1e-6 in transformers; layer_norm_eps (1e-12) applies to the final norm only.
    eps = {s.module: s.eps for s in report.sites}
    assert eps["layernorm"] == cfg.layer_norm_eps == 1e-12
    assert eps["encoder.stages.0.layers.0.layernorm"] == 1e-6
    assert loud(report) == []
    # The disagreement with the model's own config is reported, as info only.
    assert {f.rule_id for f in report.findings} == {"NE101"}
    assert {f.severity for f in report.findings} == {"info"}
