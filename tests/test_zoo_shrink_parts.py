"""The zoo sweep's shrink (benchmarks/zoo/targets.py): widths of embeddings concatenated into the model width
keep making it up. LayoutLMv3 concatenates 4 box-coordinate embeddings of
``coordinate_size`` and 2 of ``shape_size`` (4 x 128 + 2 x 128 = hidden 768); left at 128 beside hidden 64,
its text forward failed on 768 vs 64 and the sweep's layoutlmv3 had no graph (NK101)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "zoo"
sys.path.insert(0, str(ZOO))

targets = pytest.importorskip("targets")

LAYOUT = {"hidden_size": 768, "num_attention_heads": 12, "num_hidden_layers": 12, "intermediate_size": 3072,
          "coordinate_size": 128, "shape_size": 128, "patch_size": 16, "input_size": 224, "type_vocab_size": 2,
          "max_2d_position_embeddings": 1024}


def test_parts_that_fill_the_width_scale_with_it():
    d = targets.shrink_config_dict(LAYOUT, "small3")
    assert (d["hidden_size"], d["coordinate_size"], d["shape_size"]) == (96, 16, 16)
    assert 4 * d["coordinate_size"] + 2 * d["shape_size"] == d["hidden_size"]
    # geometry and counts are left as they were
    assert (d["patch_size"], d["input_size"], d["type_vocab_size"], d["max_2d_position_embeddings"]) == (16, 224, 2,
                                                                                                          1024)


def test_a_level_that_leaves_a_part_fractional_is_a_misfit():
    # hidden 64 of 768: 128 -> 10.67; the sweep takes the next level ("small3")
    with pytest.raises(targets.ShrinkMisfit, match="coordinate_size 128 is a part of hidden_size 768"):
        targets.shrink_config_dict(LAYOUT, "small")


def test_widths_that_do_not_sum_to_the_width_are_left_alone():
    # VibeVoice's diffusion head: latent 64 and frequency embedding 256 beside hidden 4096 make up no sum of it
    d = targets.shrink_config_dict({"hidden_size": 4096, "latent_size": 64, "frequency_embedding_size": 256,
                                    "num_hidden_layers": 4})
    assert (d["hidden_size"], d["latent_size"], d["frequency_embedding_size"]) == (64, 64, 256)
    # one part alone is no concatenation (a classifier projection of hidden / 3)
    d = targets.shrink_config_dict({"hidden_size": 768, "classifier_proj_size": 256})
    assert (d["hidden_size"], d["classifier_proj_size"]) == (64, 256)


def test_layoutlmv3_text_forward_runs_at_the_level_chosen():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cls = transformers.CONFIG_MAPPING["layoutlmv3"]
    config = cls.from_dict(targets.shrink_config_dict(cls().to_dict(), "small3"))
    torch.manual_seed(0)
    model = transformers.LayoutLMv3Model(config).eval()
    ids = torch.randint(0, 100, (2, 16))
    box = torch.tensor([10, 20, 110, 220]).expand(2, 16, 4)
    with torch.no_grad():
        out = model(input_ids=ids, bbox=box).last_hidden_state
    assert tuple(out.shape) == (2, 16, 96)


def test_the_worker_records_a_misfit_level_and_tries_the_next():
    """The worker's level order (``worker._level_dicts``) hands a misfit level on as its error: "small" of
    LayoutLMv3's widths is one (no integer parts of hidden 64), "small3" is the first dict tried."""
    worker = pytest.importorskip("worker")
    tried = list(worker._level_dicts(LAYOUT))
    assert tried[0][0] == "small" and isinstance(tried[0][1], targets.ShrinkMisfit)
    assert tried[1][0] == "small3" and isinstance(tried[1][1], dict)
    assert (tried[1][1]["hidden_size"], tried[1][1]["coordinate_size"]) == (96, 16)
