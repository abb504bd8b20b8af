"""Where the model keeps its configuration (normaudit.loaders.config.model_configs), which configs are a
library's, what a norm's constructor call passes as eps (normaudit.facts.constructor), and the eps rules on
real library models (NE101, NE102). Rule fixtures are in tests/fixtures/eps/."""
from __future__ import annotations

import argparse
import ast
import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn

from conftest import audit_model, family_rules, load_fixture_module, site
from normaudit.facts.constructor import constructor_eps, eps_argument
from normaudit.report import SourceLocation
from normaudit.loaders.config import is_library, model_config, model_configs

FIXTURES = Path(__file__).parent / "fixtures" / "eps"
models = load_fixture_module(FIXTURES / "eps_models.py")


@pytest.fixture(scope="module")
def eps_rules():
    return family_rules("eps")


@dataclass
class ModelArgs:
    dim: int = 16
    n_layers: int = 2
    norm_eps: float = 1e-5


class ArgsTuple(NamedTuple):
    dim: int
    norm_eps: float


class PlainHP:
    def __init__(self):
        self.dim, self.norm_eps = 16, 1e-5


class ClassHP:
    dim = 16
    norm_eps = 1e-5


STORAGE = {
    "args-namespace": ("args", lambda: argparse.Namespace(dim=16, norm_eps=1e-5)),
    "params-dataclass": ("params", ModelArgs),
    "cfg-dict": ("cfg", lambda: {"dim": 16, "norm_eps": 1e-5}),
    "hparams-simplenamespace": ("hparams", lambda: types.SimpleNamespace(dim=16, norm_eps=1e-5)),
    "hp-object": ("hp", PlainHP),
    "hp-class-attributes": ("hp", ClassHP),
    "config-namedtuple": ("config", lambda: ArgsTuple(16, 1e-5)),
    "any-name-with-an-eps-key": ("model_hyperparameters", lambda: {"dim": 16, "norm_eps": 1e-5}),
}


def llama_with(attr: str, cfg, block_eps: float = 1e-6) -> nn.Module:
    """Meta's Llama built with ``block_eps`` in its blocks, its config kept as ``self.<attr>``."""
    model = models.LlamaTransformer(ModelArgs(), block_eps=block_eps)
    del model.params
    setattr(model, attr, cfg)
    return model


@pytest.mark.parametrize("name", sorted(STORAGE))
def test_model_config_found_wherever_it_is_kept(name):
    attr, make = STORAGE[name]
    found = model_configs(llama_with(attr, make()))
    assert [(c.path, c.attr, c.data["norm_eps"], c.library) for c in found] == [("", attr, 1e-5, False)]
    assert found[0].source == f"the model's own config (self.{attr})"
    assert model_config(llama_with(attr, make()))["norm_eps"] == 1e-5


@pytest.mark.parametrize("name", sorted(STORAGE))
def test_the_norm_agreeing_with_the_config_is_never_told_to_change(name, eps_rules):
    """The four block norms (1e-6) disagree with norm_eps=1e-5 and are flagged against it; the
    final norm (norm_eps) agrees with the config and gets nothing, although all its peers disagree with it."""
    attr, make = STORAGE[name]
    r = audit_model(llama_with(attr, make()), models.features(), rules=eps_rules)
    got = {(f.rule_id, f.module, f.severity) for f in r.findings}
    assert got == {("NE101", f"layers.{i}.{n}", "error") for i in (0, 1) for n in ("attention_norm", "ffn_norm")}
    f = next(f for f in r.findings if f.module == "layers.0.ffn_norm")
    assert f.message == f"eps=1e-06, but norm_eps=1e-05 in the model's own config (self.{attr})"
    assert f.fix == f"construct RMSNorm with eps=1e-05 (norm_eps in the model's own config (self.{attr}))"


def test_unnamed_attribute_without_eps_keys_is_no_config():
    model = llama_with("tokenizer_options", {"lowercase": True, "max_len": 128})
    assert model_configs(model) == []


def test_config_shared_by_submodules_is_reported_once_at_the_shallowest():
    cfg = {"norm_eps": 1e-5}
    model = models.LlamaTransformer(ModelArgs())
    model.params = cfg
    for block in model.layers:
        block.config = cfg          # the same object handed to every layer (transformers does this)
    model.layers[1].attention_norm.cfg = {"norm_eps": 1e-6}   # a different one, deeper
    found = model_configs(model)
    assert [(c.path, c.attr) for c in found] == [("", "params"), ("layers.1.attention_norm", "cfg")]


def test_a_broken_config_attribute_is_skipped():
    class Exploding:
        @property
        def __dict__(self):
            raise RuntimeError("boom")

    model = llama_with("params", ModelArgs())
    model.args = Exploding()
    assert [c.attr for c in model_configs(model)] == ["params"]


def test_library_configs():
    transformers = pytest.importorskip("transformers")
    assert is_library(transformers.LlamaConfig) and not is_library(ModelArgs) and not is_library(dict)
    assert not is_library(nn.Sequential)  # torch containers are how users compose their own models
    fake_timm = type("VisionTransformer", (nn.Module,), {"__module__": "timm.models.vision_transformer"})
    assert is_library(fake_timm)


def test_diffusers_style_config_property_is_a_library_config(eps_rules):
    """diffusers' ConfigMixin keeps the config in ``_internal_dict`` behind a ``config`` property; its norms may
    use another eps than norm_eps on purpose (a library's code): info at most."""
    class Transformer2DModel(nn.Module):
        __module__ = "diffusers.models.transformers.transformer_2d"

        def __init__(self):
            super().__init__()
            self._internal_dict = {"norm_eps": 1e-5, "num_layers": 2}
            self.blocks = nn.ModuleList(models.Block(16, nn.LayerNorm, eps=1e-6) for _ in range(2))

        @property
        def config(self):
            return self._internal_dict

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    model = Transformer2DModel()
    assert [(c.attr, c.library, c.data["norm_eps"]) for c in model_configs(model)] == [("config", True, 1e-5)]
    r = audit_model(model, models.features(), rules=eps_rules)
    assert {(f.rule_id, f.severity) for f in r.findings} == {("NE101", "info")}
    assert site(r, "blocks.0.ln1").eps_facts.declared[0].origin == "library"


# -- the constructor call ------------------------------------------------------------------------------------
@pytest.mark.parametrize("source,expected", [
    ("RMSNorm(d, eps=config.rms_norm_eps)", ("rms_norm_eps", "config.rms_norm_eps")),
    ("nn.LayerNorm(d, eps=self.config.layer_norm_eps)", ("layer_norm_eps", "self.config.layer_norm_eps")),
    ("nn.LayerNorm(d, cfg['layer_norm_eps'])", ("layer_norm_eps", "cfg['layer_norm_eps']")),
    ("LayerNorm(d, eps=getattr(hp, 'layer_norm_epsilon', 1e-5))",
     ("layer_norm_epsilon", "getattr(hp, 'layer_norm_epsilon', 1e-5)")),
    ("LayerNorm(d, epsilon=cfg.get('norm_eps', 1e-6))", ("norm_eps", "cfg.get('norm_eps', 1e-6)")),
    ("RMSNorm(d, eps=self.eps)", None),            # the module's own attribute, no config
    ("RMSNorm(d, eps=eps)", None),                 # a local name: where it came from is unknown
    ("RMSNorm(d, eps=1e-6)", None),
    ("RMSNorm(d, eps=config.rms_norm_eps * 2)", None),
    ("RMSNorm(d, eps=cfg.a_eps, epsilon=cfg.b_eps)", None),   # two eps arguments: ambiguous
    ("RMSNorm(d)", None),
])
def test_eps_argument(source, expected):
    assert eps_argument(ast.parse(source).body[0].value, source) == expected   # quoted as written


def test_constructor_eps_from_the_definition_line_and_the_parent_init(tmp_path):
    src = tmp_path / "net.py"
    src.write_text("import torch\n"
                   "norms = [\n"
                   "    torch.nn.LayerNorm(4, eps=cfg.layer_norm_eps),\n"
                   "    torch.nn.LayerNorm(4, eps=1e-5)]\n"
                   "pair = (torch.nn.LayerNorm(4, eps=cfg.a_eps), torch.nn.LayerNorm(4, eps=cfg.b_eps))\n")
    ln = nn.LayerNorm(4)
    assert constructor_eps(SourceLocation(file=str(src), line=3), ln, None, None) == \
        ("layer_norm_eps", "cfg.layer_norm_eps")
    assert constructor_eps(SourceLocation(file=str(src), line=4), ln, None, None) is None
    assert constructor_eps(SourceLocation(file=str(src), line=5), ln, None, None) is None   # two calls disagree
    assert constructor_eps(SourceLocation(file=str(tmp_path / "gone.py"), line=3), ln, None, None) is None
    # no recorded line: the parent's __init__ (Llama's final norm: eps=params.norm_eps)
    model = models.LlamaTransformer(ModelArgs())
    assert constructor_eps(None, model.norm, model, "norm") == ("norm_eps", "params.norm_eps")
    assert constructor_eps(None, model.layers[0].ffn_norm, model.layers[0], "ffn_norm") is None   # eps=eps
    assert constructor_eps(None, model.layers[0], model.layers, "0") is None


def test_eps_changed_after_construction_is_an_error_for_any_config(eps_rules):
    """The constructor passed cfg["layer_norm_eps"] (1e-12); the module now holds 1e-5: changed afterwards."""
    class Net(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            self.norm = nn.LayerNorm(16, eps=cfg["layer_norm_eps"])

        def forward(self, x):
            return self.norm(x)

    model = Net({"layer_norm_eps": 1e-12})
    model.norm.eps = 1e-5
    r = audit_model(model, models.features(), rules=eps_rules)
    facts = site(r, "norm").eps_facts
    assert (facts.constructor_eps, facts.changed, facts.declared[0].passed) == ('cfg["layer_norm_eps"]', True, True)
    [f] = r.findings
    assert (f.rule_id, f.severity) == ("NE101", "error")
    assert f.message == ('LayerNorm is constructed with eps=cfg["layer_norm_eps"] yet holds eps=1e-05, but '
                         "layer_norm_eps=1e-12 in the model's own config (self.cfg)")


# -- real library models, through the CLI on a Hugging Face config written in tmp_path (Llama: NE101_7/8) ---
HF_CONFIGS = {
    "qwen3": {"model_type": "qwen3", "architectures": ["Qwen3Model"], "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64,
              "vocab_size": 99, "rms_norm_eps": 1e-6},
    "bert": {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 37, "vocab_size": 99, "layer_norm_eps": 1e-12},
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_library_models_have_no_eps_findings(name, tmp_path, capsys):
    pytest.importorskip("transformers")
    from normaudit.cli import main

    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(HF_CONFIGS[name]))
    rc = main([str(d), "--format", "json", "--select", "NE,NB106", "--isolated"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    report = doc["reports"][0] if "reports" in doc else doc
    assert report["findings"] == []
    eps = {s["eps"] for s in report["sites"]}
    assert eps == {HF_CONFIGS[name].get("rms_norm_eps", HF_CONFIGS[name].get("layer_norm_eps"))}
    # every norm module's constructor was read from transformers' source: it passes the config key
    keys = {s["eps_facts"]["constructor_eps"] for s in report["sites"]}
    assert keys <= {"config.rms_norm_eps", "config.layer_norm_eps"} and keys
