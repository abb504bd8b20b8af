"""Eps facts (normaudit.facts.eps) and the eps rules (rules/eps/NE1xx).

The rules' fixtures (tests/fixtures/eps/<ID>_<n>.py) are run by test_rule_fixtures.py; the tests here audit
some of them again for the facts behind the findings.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import CASES, audit_file, family_rules, requires_cases, site
from normaudit.facts.eps import EPS_KEYS, eps_dtype_of, find_eps_key, rounded
from normaudit.report import Formula, Site
from test_rule_fixtures import audit_fixture

FIXTURES = Path(__file__).parent / "fixtures" / "eps"


@pytest.fixture(scope="module")
def eps_rules():
    """Only the eps rules: these tests must not depend on other families' rules."""
    return family_rules("eps")


# -- facts ------------------------------------------------------------------------------------------------
def test_every_config_source_is_reported_with_its_origin(eps_rules, tmp_path):
    report, _ = audit_fixture(FIXTURES / "NE101_3.py", eps_rules, tmp_path)
    facts = site(report, "norm").eps_facts
    assert [(c.origin, c.source, c.key, c.value, c.matches) for c in facts.declared] == [
        ("cli", "NE101_3.json", "rms_norm_eps", 1e-6, True),
        ("checkpoint", "weights.safetensors:__metadata__.config (with the checkpoint)", "rms_norm_eps", 1e-5, False),
    ]
    # three norms of three roles (Block.ln1, Block.ln2, the final norm): no peers
    assert (facts.effective, facts.dtype, facts.peers, facts.peer_eps, facts.peer_count) == (1e-6, "float32", 1, 1e-6, 1)
    # --config wins for the rules' `config` name; the checkpoint's config is still compared
    assert report.model.config_source == "NE101_3.json"


def test_peers_group_by_role_and_need_a_majority(eps_rules, tmp_path):
    """Peers: one class and kind, and one constructor line or one attribute of modules of one class."""
    report, _ = audit_fixture(FIXTURES / "NE102_2.py", eps_rules, tmp_path)
    stem = site(report, "stem_norm").eps_facts
    assert (stem.peers, stem.peer_eps, stem.peer_count) == (1, 1e-6, 1)
    block = site(report, "blocks.1.1").eps_facts       # both built by one statement (the ModuleList line)
    assert (block.peers, block.peer_eps, block.peer_count) == (2, 1e-6, 2)
    assert block.role == f"constructed at NE102_2.py:{site(report, 'blocks.0.1').definition.line}"
    final = site(report, "layernorm").eps_facts
    assert (final.peers, final.peer_eps) == (1, 1e-12)
    report, _ = audit_fixture(FIXTURES / "NE102_1.py", eps_rules, tmp_path)
    last, first = site(report, "layers.3.ln1").eps_facts, site(report, "layers.0.ln1").eps_facts
    assert (last.peers, last.peer_eps, last.peer_count, first.peer_eps) == (4, 1e-6, 3, 1e-6)
    assert site(report, "norm").eps_facts.peers == 1


def test_eps_dtype_sources():
    hand = Site(module="n", kind="LayerNorm", class_name="N", detected_by="pattern", eps=1e-12,
                input_dtype="float16", compute_dtype="float16")
    assert eps_dtype_of(hand, None) == ("float16", "compute dtype of the hand-written statistics")
    fused = Site(module="n", kind="LayerNorm", class_name="LayerNorm", detected_by="module", eps=1e-12,
                 input_dtype="float16", compute_dtype="float32")
    assert eps_dtype_of(fused, None)[0] == "float32"
    hand.formula = Formula(eps_dtype="float32")  # the formula pass found an upcast: it wins
    assert eps_dtype_of(hand, None) == ("float32", "formula")


def test_rounding_is_ieee_round_to_nearest():
    assert rounded(1e-12, "float16") == 0.0 and rounded(1e-12, "bfloat16") > 0
    assert rounded(2.0 ** -25, "float16") == 0.0           # exactly half the smallest subnormal: ties to even
    assert rounded(2.0 ** -24, "float16") == 2.0 ** -24     # the smallest subnormal survives
    assert rounded(1e-5, "float16") > 0 and rounded(1e-3, "int8") is None


def test_find_eps_key_order_and_nesting():
    assert find_eps_key({"norm_eps": 1e-5, "rms_norm_eps": 1e-6}, EPS_KEYS["RMSNorm"]) == ("rms_norm_eps", 1e-6)
    assert find_eps_key({"text_config": {"rms_norm_eps": 1e-6}}, EPS_KEYS["RMSNorm"]) == ("rms_norm_eps", 1e-6)
    assert find_eps_key({"layer_norm_eps": "1e-5", "ln_eps": True}, EPS_KEYS["LayerNorm"]) is None
    assert find_eps_key({"layer_norm_eps": 1e-12}, EPS_KEYS["GroupNorm"]) is None


@requires_cases
def test_n17_fp16_eps_facts(eps_rules):
    r = audit_file(CASES / "N17_eps_fp16" / "model.py", eps_rules, dtype="float16")
    pre, norm = site(r, "pre_norm").eps_facts, site(r, "norm").eps_facts
    assert (pre.dtype, pre.in_dtype > 0) == ("float32", True)
    assert (norm.dtype, norm.in_dtype) == ("float16", 0.0)
    assert [(f.rule_id, f.module, f.severity) for f in r.findings] == [("NE104", "norm", "error")]


def test_checkpoint_config_origin():
    """The config beside a checkpoint is the user's statement (origin checkpoint) unless the model is a transformers
    model of the same model_type (origin library: its code decides), or it is the file the model was built from."""
    from types import SimpleNamespace

    from normaudit.audit import checkpoint_config_source
    from normaudit.loaders import ModelUnderAudit

    ckpt = SimpleNamespace(config={"model_type": "bert", "layer_norm_eps": 1e-12},
                           config_source="/w/bert/config.json")
    plain = ModelUnderAudit(model=torch.nn.Module(), inputs=(), on_meta=False, kind="python", file="/w/model.py")
    src = checkpoint_config_source(ckpt, plain, None)
    assert (src.origin, src.source) == ("checkpoint", "config.json (with the checkpoint)")

    class Lib(torch.nn.Module):
        pass

    lib = Lib()
    lib.config = type("BertConfig", (), {"__module__": "transformers.models.bert"})()
    mua = ModelUnderAudit(model=lib, inputs=(), on_meta=True, kind="python", file="/w/model.py")
    assert checkpoint_config_source(ckpt, mua, {"model_type": "bert"}).origin == "library"
    assert checkpoint_config_source(ckpt, mua, {"model_type": "roberta"}).origin == "checkpoint"
    embedded = SimpleNamespace(config={"rms_norm_eps": 1e-5}, config_source="/w/x.safetensors:__metadata__.config")
    assert checkpoint_config_source(embedded, plain, None).source == \
        "x.safetensors:__metadata__.config (with the checkpoint)"


def test_clip_embedding_l2_normalisation_is_no_eps_zero_norm(eps_rules):
    """transformers CLIPModel (modeling_clip.py:800-801): ``image_embeds / _get_vector_norm(image_embeds)``
    (a sum of squares to the power 0.5, no eps) L2-normalises the pooled embeddings for cosine logits that
    only a loss outside the forward turns into a softmax. That is a cosine similarity, not a normalisation
    layer: no site on the top module, so no NE103 (eps 0); the towers' own norms keep their eps."""
    transformers = pytest.importorskip("transformers")
    from conftest import audit_model

    cfg = transformers.CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         vocab_size=100, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16)
    with torch.device("meta"):
        model = transformers.CLIPModel(cfg)
    inputs = {"input_ids": torch.randint(0, 100, (2, 7)), "pixel_values": torch.randn(2, 3, 32, 32)}
    report = audit_model(model, inputs, rules=eps_rules, on_meta=True)
    assert report.capture.complete
    modules = {s.module for s in report.sites}
    assert "" not in modules and {"text_model.final_layer_norm", "vision_model.post_layernorm"} <= modules
    assert [s.eps for s in report.sites if s.module == "text_model.final_layer_norm"] == [1e-5]
    assert not [f for f in report.findings if f.rule_id == "NE103"]


def test_xclip_temperature_before_einsum_is_no_site(eps_rules):
    """transformers XCLIPModel (modeling_x_clip.py:1118-1123) normalises its embeddings with
    ``x / x.norm(p=2, dim=-1, keepdim=True)`` (no eps) and multiplies the temperature into one factor before
    ``einsum("bd,bkd->bk", video, logit_scale * text)``: the same cosine logits as CLIP's, so no site on the top
    module and no NE103 (it was an error in the zoo sweep); the towers' LayerNorms keep eps 1e-5."""
    transformers = pytest.importorskip("transformers")
    from conftest import audit_model

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    cfg = transformers.XCLIPConfig(
        text_config=dict(small, vocab_size=100, max_position_embeddings=16),
        vision_config=dict(small, image_size=32, patch_size=16, num_frames=2, mit_hidden_size=32,
                           mit_intermediate_size=64, mit_num_hidden_layers=1, mit_num_attention_heads=2),
        projection_dim=32, prompt_layers=1, prompt_num_attention_heads=2, prompt_attention_dropout=0.0)
    with torch.device("meta"):
        model = transformers.XCLIPModel(cfg)
    inputs = {"input_ids": torch.randint(0, 100, (2, 7)), "pixel_values": torch.randn(1, 2, 3, 32, 32)}
    report = audit_model(model, inputs, rules=eps_rules, on_meta=True)
    assert report.capture.complete
    modules = {s.module for s in report.sites}
    assert "" not in modules and "text_model.final_layer_norm" in modules
    assert [s.eps for s in report.sites if s.module == "text_model.final_layer_norm"] == [1e-5]
    assert not [f for f in report.findings if f.rule_id == "NE103"]


@pytest.mark.parametrize("dtype, expected", [("float16", [("NE104", "", "error")]), ("float32", [])])
def test_normalize_default_clamp_underflows_in_float16_only(dtype, expected):
    """F.normalize's default clamp eps=1e-12 is 0 in float16 (smallest subnormal 6e-8), not in float32."""
    from torch.nn import functional as F

    from conftest import audit_model, family_rules

    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.g = torch.nn.Linear(16, 16), torch.nn.Parameter(torch.ones(16))

        def forward(self, x):
            return F.normalize(self.fc(x), dim=-1) * self.g

    report = audit_model(Normed(), (torch.randn(2, 5, 16),), rules=family_rules("eps"), dtype=dtype)
    assert [(s.module, s.kind, s.eps) for s in report.sites] == [("", "L2Norm", 1e-12)]
    assert [(f.rule_id, f.module, f.severity) for f in report.findings] == expected


def test_a_line_that_builds_a_whole_model_is_no_constructor_role(tmp_path):
    """The construction line recorded for a norm built inside a library is the user's line that built the
    whole model; it holds no call of the norm's class, so it is no role (every module of the model shares it),
    while a line that constructs the norm, directly or as the call assigned to ``self.<attr>``, is one."""
    from normaudit.facts.constructor import builds_elsewhere
    from normaudit.report import SourceLocation

    f = tmp_path / "model.py"
    f.write_text("def build_model():\n    return UNet2DConditionModel(sample_size=8)\n"
                 "class B:\n    def __init__(self, norm_cls):\n        self.norm = norm_cls(16, eps=1e-6)\n"
                 "        self.gn = nn.GroupNorm(4, 16)\n")
    assert builds_elsewhere(SourceLocation(file=str(f), line=2), "GroupNorm", "norm") is True
    assert builds_elsewhere(SourceLocation(file=str(f), line=5), "GroupNorm", "norm") is False   # self.norm = ...
    assert builds_elsewhere(SourceLocation(file=str(f), line=6), "GroupNorm", "gn") is False
    assert builds_elsewhere(SourceLocation(file=str(tmp_path / "gone.py"), line=2), "GroupNorm", "norm") is False


def test_a_literal_eps_is_read_from_a_helper_the_init_calls():
    """diffusers' Transformer2DModel builds its GroupNorm in ``self._init_continuous_input(...)``, called by
    ``__init__``: its literal eps is found there; a config key passed the same way is found too."""
    from normaudit.facts.constructor import constructor_eps, constructor_literal_eps

    class Block(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self._init_input(config)

        def _init_input(self, config):
            self.norm = torch.nn.GroupNorm(num_groups=4, num_channels=16, eps=1e-6)
            self.ln = torch.nn.LayerNorm(16, eps=config.layer_norm_eps)

    class Cfg:
        layer_norm_eps = 1e-5

    block = Block(Cfg())
    assert constructor_literal_eps(None, block.norm, block, "norm") == 1e-6
    assert constructor_literal_eps(None, block.ln, block, "ln") is None
    assert constructor_eps(None, block.ln, block, "ln") == ("layer_norm_eps", "config.layer_norm_eps")
