"""A config that leaves a value the model's forward reads unset (None): NK110 names the key instead of
NK101's general capture failure (:func:`normaudit.capture.errors.unset_config_keys`)."""
from __future__ import annotations

import pytest

from conftest import audit_file, flagged
from normaudit.capture.errors import unset_config_keys

SLIDING = "ValueError: Could not find a `sliding_window` argument in the config, or it is not set"


def test_the_unset_key_named_by_the_error_is_found_in_a_nested_config():
    configs = [("", {"text_config": {"sliding_window": None, "hidden_size": 8}, "vision_config": {"x": None}}),
               ("language_model", {"sliding_window": None})]
    assert unset_config_keys([SLIDING], configs) == ["text_config.sliding_window"]


def test_a_key_set_or_not_named_is_no_unset_key():
    assert unset_config_keys([SLIDING], [("", {"sliding_window": 4096, "head_dim": None})]) == []
    assert unset_config_keys(["RuntimeError: shape '[2, 8]' is invalid"], [("", {"head_dim": None})]) == []


def test_an_attribute_read_from_none_is_no_unset_key():
    """transformers' TVP at its zoo config: ``'NoneType' object has no attribute 'dtype'`` reads ``dtype`` from
    some None value; that the config's ``dtype`` is None too (every PretrainedConfig's default) is no cause."""
    error = "AttributeError: 'NoneType' object has no attribute 'dtype'"
    assert unset_config_keys([error], [("", {"dtype": None, "sliding_window": None})]) == []
    assert unset_config_keys([error + "; " + SLIDING], [("", {"dtype": None, "sliding_window": None})]) \
        == ["sliding_window"]


def test_a_key_kept_only_by_a_submodule_is_given_under_it():
    assert unset_config_keys(["TypeError: 'NoneType' for rope_theta"], [("visual", {"rope_theta": None})]) \
        == ["visual.config.rope_theta"]


def test_step3p7_default_config_names_text_config_sliding_window(tmp_path):
    """Step3p7's default config (transformers 5.x) leaves ``text_config.sliding_window`` None, while its
    forward builds the sliding-window mask whatever its layer types (modeling_step3p7.py,
    ``create_sliding_window_causal_mask``); both stacks cut to one layer, so the audit takes seconds."""
    transformers = pytest.importorskip("transformers")
    if "step3p7" not in transformers.CONFIG_MAPPING:
        pytest.skip("this transformers has no step3p7")
    config = transformers.CONFIG_MAPPING["step3p7"]()
    assert config.text_config.sliding_window is None
    text = config.text_config
    text.num_hidden_layers, text.layer_types, text.mlp_layer_types = 1, text.layer_types[:1], text.mlp_layer_types[:1]
    config.vision_config.num_hidden_layers = 1
    config.save_pretrained(tmp_path)
    report = audit_file(tmp_path)
    assert flagged(report, "NK110") == [""]
    assert flagged(report, "NK101") == []
    (finding,) = [f for f in report.findings if f.rule_id == "NK110"]
    assert "leaves text_config.sliding_window unset and its forward needs it" in finding.message
    assert finding.fix.startswith("set text_config.sliding_window in the model's config")
