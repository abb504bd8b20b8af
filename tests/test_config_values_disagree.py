"""A config whose values contradict each other so that its forward cannot run: NK111 names the keys
(:func:`normaudit.capture.errors.rope_section_conflicts`), in place of NK101's general capture failure."""
from __future__ import annotations

import pytest

from conftest import audit_file, flagged
from normaudit.capture.errors import config_error, rope_section_conflicts

FAKE_SPLIT = "ValueError: Split sizes add up to 32 but got the tensor's size of 64"
REAL_SPLIT = ("RuntimeError: split_with_sizes expects split_sizes to sum exactly to 64 (input tensor's size at "
              "dimension -1), but got split_sizes=[8, 12, 12]")
GLM4V_TEXT = {"hidden_size": 4096, "num_attention_heads": 32, "rope_parameters": {"rope_type": "default",
                                                                                   "rope_theta": 10000.0}}


def test_unset_sections_against_the_rotary_width_name_every_key():
    expected = ["text_config.rope_parameters.mrope_section is unset and the model's default adds up to 32, but "
                "the rotary frequencies it splits are 64, half of head_dim x partial_rotary_factor rounded up "
                "(text_config.head_dim unset: hidden_size 4096 / num_attention_heads 32 = 128; "
                "text_config.rope_parameters.partial_rotary_factor unset: 1.0)"]
    configs = [("", {"text_config": GLM4V_TEXT}), ("language_model", GLM4V_TEXT)]
    assert rope_section_conflicts([FAKE_SPLIT], configs) == expected
    assert rope_section_conflicts([REAL_SPLIT], configs) == expected


def test_given_sections_and_factor_are_quoted_with_their_values():
    text = {"hidden_size": 4096, "num_attention_heads": 96,
            "rope_parameters": {"partial_rotary_factor": 0.5, "mrope_section": [8, 12, 12]}}
    assert rope_section_conflicts(["ValueError: Split sizes add up to 32 but got the tensor's size of 11"],
                                  [("", text)]) == [
        "rope_parameters.mrope_section [8, 12, 12] adds up to 32, but the rotary frequencies it splits are 11, "
        "half of head_dim x partial_rotary_factor rounded up (head_dim unset: hidden_size 4096 / "
        "num_attention_heads 96 = 42; rope_parameters.partial_rotary_factor 0.5)"]


def test_a_split_of_another_length_or_fitting_sections_is_no_conflict():
    fitting = dict(GLM4V_TEXT, rope_parameters={"partial_rotary_factor": 0.5})  # 32 frequencies
    assert rope_section_conflicts([FAKE_SPLIT], [("", fitting)]) == []
    assert rope_section_conflicts(["ValueError: Split sizes add up to 32 but got the tensor's size of 48"],
                                  [("", GLM4V_TEXT)]) == []
    assert rope_section_conflicts(["RuntimeError: shape mismatch"], [("", GLM4V_TEXT)]) == []


def test_the_error_quoted_is_the_one_read():
    errors = ["GuardOnDataDependentSymNode: Eq(u8, 0)", "ValueError: `mm_token_type_ids` is missing", FAKE_SPLIT]
    assert config_error(errors) == FAKE_SPLIT
    sliding = "ValueError: Could not find a `sliding_window` argument in the config, or it is not set"
    assert config_error(errors[:2] + [sliding], ["text_config.sliding_window"]) == sliding


def test_glm4v_default_rope_settings_name_the_rope_keys(tmp_path):
    """transformers' GLM-4V default config leaves partial_rotary_factor and mrope_section unset: its 64 rotary
    frequencies (head_dim 128) are split by the code's default mrope_section [8, 12, 12], so it cannot run, on
    real tensors either. The rope settings kept, head_dim 128 kept, widths, depths and vocabulary cut so the
    audit takes seconds."""
    transformers = pytest.importorskip("transformers")
    if "glm4v" not in transformers.CONFIG_MAPPING:
        pytest.skip("this transformers has no glm4v")
    config = transformers.CONFIG_MAPPING["glm4v"]()
    text, vision = config.text_config, config.vision_config
    assert text.rope_parameters == {"rope_theta": 10000.0, "rope_type": "default"}
    text.hidden_size, text.num_attention_heads, text.num_key_value_heads = 256, 2, 2
    text.intermediate_size, text.num_hidden_layers, text.vocab_size = 64, 1, 1024
    vision.hidden_size, vision.num_heads, vision.intermediate_size = 64, 2, 64
    vision.out_hidden_size, vision.depth = 256, 1
    config.image_token_id, config.video_token_id = 1000, 1001
    config.image_start_token_id, config.image_end_token_id = 1002, 1003
    config.video_start_token_id, config.video_end_token_id = 1004, 1005
    config.save_pretrained(tmp_path)
    report = audit_file(tmp_path)
    assert flagged(report, "NK111") == [""] and flagged(report, "NK101") == []
    (finding,) = [f for f in report.findings if f.rule_id == "NK111"]
    assert ("text_config.rope_parameters.mrope_section is unset and the model's default adds up to 32, but the "
            "rotary frequencies it splits are 64, half of head_dim x partial_rotary_factor rounded up "
            "(text_config.head_dim unset: hidden_size 256 / num_attention_heads 2 = 128; "
            "text_config.rope_parameters.partial_rotary_factor unset: 1.0)") in finding.message
    assert "(ValueError: Split sizes add up to 32 but got the tensor's size of 64)" in finding.message
