"""The zoo sweep's ground truth (benchmarks/zoo/forward.py) and its comparison with the sites
(benchmarks/zoo/summary.py): which modules are norm modules (class names with the
model's own name removed, the head noun after the last "Norm"; a named norm must compute a statistic), the
inputs normaudit itself builds as one input set (on a meta twin, as the command builds them), towers run
alone, and sites in modules that are no norm module counted apart."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "zoo"
sys.path.insert(0, str(ZOO))

summary = pytest.importorskip("summary")
forward = pytest.importorskip("forward")

NORMS = ["LayerNorm", "ConvNextV2LayerNorm", "DINOv3ConvNextLayerNorm", "EmbeddingGemma2RMSNorm",
         "PeAudioEncoderRMSNorm", "FrozenBatchNormAct2d", "EvoNorm2dS0a", "LayerNorm2dFp32", "RmsNormGated",
         "GlobalResponseNorm", "AdaLayerNormZero", "T5LayerNorm"]
NOT_NORMS = ["RobertaPreLayerNormPooler", "NormFreeBlock", "NormMlpClassifierHead", "GlobalResponseNormMlp",
             "ConvNormAct", "Conv2dNorm", "SeparableConvNormAct", "NormLinear", "Wav2Vec2LayerNormConvLayer",
             "DFineConvNormLayer", "StableLmLayerNormPerHead", "Sapiens2NormalEstimatorOutput",
             "Inkling2NormedEmbedding", "NoNorm", "AutoModelForNormalEstimation"]


@pytest.mark.parametrize("name", NORMS)
def test_class_names_that_name_a_norm(name):
    assert summary.says_norm(name)


@pytest.mark.parametrize("name", NOT_NORMS)
def test_class_names_that_say_norm_of_something_else(name):
    assert not summary.says_norm(name)


def test_model_prefix_is_removed_before_the_class_test():
    # "Norm" in the model's own name says nothing about the class
    assert summary.strip_model_prefix("RobertaPreLayerNormSelfOutput", ["roberta-prelayernorm"]) == "SelfOutput"
    assert summary.strip_model_prefix("ConvNextV2LayerNorm", ["ConvNextV2"]) == "LayerNorm"
    assert summary.strip_model_prefix("Qwen2VLModel", ["qwen"]) == "Qwen2VLModel"  # no CamelCase boundary
    assert not summary.says_norm("RobertaPreLayerNormEmbeddings", ["roberta-prelayernorm"])
    assert summary.says_norm("RobertaPreLayerNormRMSNorm", ["roberta-prelayernorm"])


def test_model_prefixes_come_from_the_defining_modules_pretrained_model():
    modeling = pytest.importorskip("transformers.models.roberta_prelayernorm.modeling_roberta_prelayernorm")
    assert forward.model_prefixes(modeling.RobertaPreLayerNormPooler) == ["RobertaPreLayerNorm"]
    assert forward.model_prefixes(nn.LayerNorm) == []


def test_stored_results_are_refiltered_by_the_class_test():
    r = {"corpus": "transformers", "name": "roberta-prelayernorm", "exit": 0,
         "norm_modules": {"pooler": "RobertaPreLayerNormPooler", "embeddings.LayerNorm": "LayerNorm"},
         "fwd_norms": ["embeddings.LayerNorm", "pooler"], "graph_site_modules": ["embeddings.LayerNorm"]}
    (got,) = summary.latest([r])
    assert got["fwd_norms"] == ["embeddings.LayerNorm"] and list(got["norm_modules"]) == ["embeddings.LayerNorm"]
    assert summary.exact_sites(got) is True


def test_sites_outside_norm_modules_are_counted_apart_and_unrun_norm_sites_are_extra():
    r = {"corpus": "transformers", "name": "swinv2", "exit": 0,
         "norm_modules": {"layers.0.ln": "LayerNorm", "layers.1.ln": "LayerNorm", "head.ln": "LayerNorm"},
         "fwd_norms": ["layers.0.ln", "layers.1.ln"],
         "graph_site_modules": ["layers.0.attention.self", "layers.0.ln", "layers.1.ln"]}
    assert summary.functional(r) == ["layers.0.attention.self"]
    assert summary.extra(r) == [] and summary.exact_sites(r) is True
    r["graph_site_modules"].append("head.ln")  # a site on a norm module no forward called
    assert summary.extra(r) == ["head.ln"] and summary.exact_sites(r) is False
    assert summary.functional(dict(r, fwd_norms=None)) == []  # no forward ran: the norm modules are not known
    fig = summary.corpus_figures([r])
    assert fig["models with functional sites in other modules"] == "1"
    assert fig["graph sites on norm modules = forward norms"] == "0 / 1 (0.0%)"


class AdaRmsNorm(nn.Module):
    """Voxtral-Realtime's TextAdaRmsNorm: a conditioning MLP (linear -> gelu -> linear), no statistic."""

    def __init__(self):
        super().__init__()
        self.linear1, self.linear2 = nn.Linear(8, 4, bias=False), nn.Linear(4, 8, bias=False)

    def forward(self, x):
        return self.linear2(nn.functional.gelu(self.linear1(x)))


class HandRMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ada_rms_norm, self.norm, self.ln = AdaRmsNorm(), HandRMSNorm(), nn.LayerNorm(8)

    def forward(self, x):
        return self.ln(self.norm(x) * (1 + self.ada_rms_norm(x)))


def test_a_named_norm_counts_only_when_it_computes_a_statistic():
    block = Block()
    assert set(forward.norm_modules(block)) == {"ada_rms_norm", "norm", "ln"}
    x = torch.randn(2, 3, 8)
    assert forward.called_norms(block, lambda: block(x)) == {"norm", "ln"}


def test_meta_twin_keeps_ties_and_leaves_the_model_real():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
    model[1].weight = model[0].weight
    twin = forward.meta_twin(model)
    assert all(p.is_meta for p in twin.parameters()) and not any(p.is_meta for p in model.parameters())
    assert twin[1].weight is twin[0].weight


def _tiny_llava(image_token: int, vocab: int):
    transformers = pytest.importorskip("transformers")
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=16, patch_size=8)
    text = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2, vocab_size=vocab)
    config = transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token,
                                      vision_feature_layer=-1)
    torch.manual_seed(0)
    return transformers.LlavaModel(config).eval(), config


VISION = {"vision_tower.pre_layrnorm", "vision_tower.encoder.layers.0.layer_norm1",
          "vision_tower.encoder.layers.0.layer_norm2", "vision_tower.post_layernorm"}
TEXT = {"language_model.layers.0.input_layernorm", "language_model.layers.0.post_attention_layernorm",
        "language_model.norm"}


def test_normaudits_inputs_run_the_image_tower_with_placeholder_tokens():
    model, config = _tiny_llava(image_token=100, vocab=128)
    inputs = forward._normaudit_inputs(model)
    assert int((inputs["input_ids"] == 100).sum()) == 2 * 4  # 4 patches per image, 2 images
    called, label = forward.forward_norms(model, config)
    assert called == VISION | TEXT
    assert "normaudit's inputs" in label and "alone" not in label


def test_a_tower_no_whole_model_set_runs_is_run_alone_on_normaudits_inputs():
    # the image token lies outside the vocabulary: no whole-model image set runs on CPU, the text set does
    model, config = _tiny_llava(image_token=200, vocab=128)
    called, label = forward.forward_norms(model, config)
    assert called == VISION | TEXT
    assert "vision_tower alone" in label and "normaudit's inputs" not in label.split(" | ")
