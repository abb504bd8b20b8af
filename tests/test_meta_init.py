"""The torch initialisers skip meta tensors while a Hugging Face model is built on meta
(:mod:`normaudit.loaders.meta_init`): restored after (also after an error), real tensors still
initialised, each initialiser returning its tensor, tied weights still tied, and no initialiser reaching a
meta tensor during the build (what made the build's time grow with the depth)."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

from normaudit.loaders.meta_init import INIT_FUNCTIONS, MODULES, meta_init_skipped


def _initialisers() -> dict[tuple[str, str], object]:
    return {(m, n): sys.modules[m].__dict__[n] for m in MODULES if m in sys.modules
            for n in INIT_FUNCTIONS if n in sys.modules[m].__dict__}


def test_meta_tensors_are_returned_as_they_are_and_real_ones_initialised():
    before = _initialisers()
    assert ("torch.nn.init", "kaiming_uniform_") in before and ("torch.nn.modules.activation", "xavier_uniform_") in before
    meta = torch.empty(4, 3, device="meta")
    real = torch.zeros(4, 3)
    with meta_init_skipped():
        assert nn.init.kaiming_uniform_(meta, a=5 ** 0.5) is meta
        assert nn.init.normal_(meta, std=0.02) is meta
        assert sys.modules["torch.nn.modules.activation"].xavier_uniform_(meta) is meta
        torch.manual_seed(0)
        assert nn.init.normal_(real, std=1.0) is real
        with pytest.raises(ValueError, match="fewer than 2 dimensions"):
            nn.init.kaiming_uniform_(torch.zeros(3))  # real tensors: the original, with its errors
    assert real.abs().sum().item() > 0
    assert _initialisers() == before  # the very same function objects


def test_restored_after_an_error_and_when_nested():
    before = _initialisers()
    with pytest.raises(RuntimeError, match="boom"):
        with meta_init_skipped():
            with meta_init_skipped():
                assert nn.init.uniform_.__wrapped__ is before[("torch.nn.init", "uniform_")]  # not wrapped twice
            assert nn.init.uniform_ is not before[("torch.nn.init", "uniform_")]
            raise RuntimeError("boom")
    assert _initialisers() == before


LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_hidden_layers": 3,
         "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 37, "vocab_size": 99,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6}


def _load(tmp_path, **extra):
    pytest.importorskip("transformers")
    from normaudit.loaders.hf import load_hf_target

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **extra}))
    return load_hf_target(tmp_path).model


def test_hf_build_reaches_no_initialiser_with_a_meta_tensor(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import transformers.initialization  # noqa: F401 - its table of torch's originals, taken before the patch below

    calls: list[str] = []
    for name in ("kaiming_uniform_", "normal_", "uniform_"):
        original = getattr(nn.init, name)

        def counting(tensor, *args, _name=name, _original=original, **kwargs):
            calls.append(f"{_name} {tensor.device}")
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(nn.init, name, counting)
    with torch.device("meta"):  # the control: a plain meta build calls them for every Linear and Embedding
        nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 4))
    # (each twice: under the device mode an initialiser calls itself again through handle_torch_function)
    assert set(calls) == {"normal_ meta", "kaiming_uniform_ meta", "uniform_ meta"}
    calls.clear()
    model = _load(tmp_path)
    assert calls == []
    assert model.model.layers[2].mlp.down_proj.weight.is_meta
    assert tuple(model.model.layers[2].mlp.down_proj.weight.shape) == (32, 37)
    assert nn.init.kaiming_uniform_.__name__ == "counting"  # put back: the test's own, not normaudit's wrapper


def test_hf_build_keeps_tied_weights_tied(tmp_path):
    before = _initialisers()
    tied = _load(tmp_path, tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    (tmp_path / "config.json").unlink()
    untied = _load(tmp_path, tie_word_embeddings=False)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert _initialisers() == before
    table = sys.modules["transformers.initialization"].TORCH_INIT_FUNCTIONS
    assert table["normal_"] is torch.nn.init.normal_  # transformers' table of the originals is put back too
