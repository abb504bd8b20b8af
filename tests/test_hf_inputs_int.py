"""A required ``int`` parameter of ``forward``: Bark's fine model takes the codebook to
predict, ``codebook_idx``, as its main input; with no value for it normaudit built no inputs at all and the
fine model's 5 norms stayed unaudited (the zoo sweep's bark: NK101). Also: an image size named
``input_size`` (LayoutLMv3) brings the image. Tiny real configs on the meta device."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from conftest import audit_model  # noqa: E402
from normaudit.loaders.inputs import infer_hf_inputs  # noqa: E402
from normaudit.loaders.inputs.builders import INT_CANDIDATES  # noqa: E402

BARK = dict(hidden_size=32, num_layers=2, num_heads=2, block_size=64, input_vocab_size=60, output_vocab_size=60,
            n_codes_total=4, n_codes_given=1)


def _fine(on_meta: bool = True):
    cfg = transformers.BarkFineConfig(**BARK)
    if not on_meta:
        torch.manual_seed(0)
        return transformers.BarkFineModel(cfg).eval()
    with torch.device("meta"):
        return transformers.BarkFineModel(cfg).eval()


def test_int_main_input_gets_a_value_the_model_accepts():
    # codebook_idx 0 is refused (the coarse model's), 1 picks lm_heads[1 - n_codes_given]; the token ids are
    # one stream per codebook, (B, S, n_codes_total + 1), of which the model embeds the first 4
    assert INT_CANDIDATES == (1, 0)
    kwargs, said = infer_hf_inputs(_fine())
    assert said == "codebook_idx = 1, input_ids int64 (2, 16, 5)"
    assert kwargs["codebook_idx"] == 1 and type(kwargs["codebook_idx"]) is int
    real = _fine(on_meta=False)
    with torch.no_grad():
        logits = real(**kwargs).logits
    assert tuple(logits.shape) == (2, 16, 60)


def test_fine_model_is_captured_whole_on_them(rules):
    report = audit_model(_fine(), rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export", report.capture.attempts
    graphed = sorted({s.module for s in report.sites if s.detected_by != "module_walk"})
    assert graphed == ["layernorm_final", "layers.0.layernorm_1", "layers.0.layernorm_2", "layers.1.layernorm_1",
                       "layers.1.layernorm_2"]
    assert not [f for f in report.findings if f.severity in ("warning", "error")]


def test_optional_int_parameters_get_no_value():
    # only required ints are given one: an optional int keeps its default (no builder, not in the inputs)
    class Net(torch.nn.Module):
        main_input_name = "input_ids"

        def __init__(self):
            super().__init__()
            self.config = transformers.PretrainedConfig(vocab_size=50)
            self.emb = torch.nn.Embedding(50, 16)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, input_ids, layer: int = 3):
            return self.norm(self.emb(input_ids))

    with torch.device("meta"):
        net = Net()
    kwargs, said = infer_hf_inputs(net)
    assert said == "input_ids int64 (2, 16)" and list(kwargs) == ["input_ids"]


def test_an_image_size_named_input_size_brings_the_image(rules):
    # LayoutLMv3 sizes its image by ``input_size`` (224) and ``patch_size``: given only ids and boxes, its
    # patch embedding's LayerNorm and the final ``norm`` of the visual tokens never ran (sweep: 5 of 7 norms)
    cfg = transformers.LayoutLMv3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, vocab_size=99, coordinate_size=4, shape_size=8,
                                        input_size=32, patch_size=16)
    with torch.device("meta"):
        model = transformers.LayoutLMv3Model(cfg).eval()
    kwargs, said = infer_hf_inputs(model)
    assert said == "input_ids int64 (2, 16), pixel_values float (2, 3, 32, 32), bbox int64 (2, 16, 4)"
    report = audit_model(model, rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export", report.capture.attempts
    graphed = sorted({s.module for s in report.sites if s.detected_by != "module_walk"})
    assert graphed == ["LayerNorm", "embeddings.LayerNorm", "encoder.layer.0.attention.output.LayerNorm",
                       "encoder.layer.0.output.LayerNorm", "encoder.layer.1.attention.output.LayerNorm",
                       "encoder.layer.1.output.LayerNorm", "norm"]


def test_token_ids_stay_inside_a_wrapped_models_vocabulary():
    # FastSpeech2ConformerWithHifiGanConfig holds its text model as ``model_config`` (vocab_size 78 in the
    # defaults); without it the default vocabulary of 100 gave ids the embedding refused (IndexError)
    from normaudit.loaders.inputs.text import _text_ids

    cfg = transformers.PretrainedConfig()
    cfg.model_config = transformers.PretrainedConfig(vocab_size=40)
    torch.manual_seed(0)
    ids = torch.cat([_text_ids(cfg) for _ in range(20)])
    assert tuple(ids.shape) == (40, 16) and int(ids.max()) < 40 and int(ids.max()) >= 30
