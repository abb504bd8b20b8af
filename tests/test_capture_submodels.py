"""Sub-models captured alone on inputs built for them: a model whose own forward cannot run
(no forward at all, one that wants an inference session) made of Hugging Face models of their own (a ``config``
and a ``main_input_name``), and a tower a whole-model graph never called whose inputs a meta forward decides."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from conftest import _Block, audit_model, site  # noqa: E402
from normaudit.audit import AuditOptions, build_report  # noqa: E402
from normaudit.capture.parts import OWN_INPUTS  # noqa: E402
from normaudit.loaders import ModelUnderAudit  # noqa: E402

OWN = "export" + OWN_INPUTS
BERT_NORMS = ["text.embeddings.LayerNorm", "text.encoder.layer.0.attention.output.LayerNorm",
              "text.encoder.layer.0.output.LayerNorm"]
LLAMA_NORMS = ["lm.layers.0.input_layernorm", "lm.layers.0.post_attention_layernorm", "lm.norm"]


def _bert() -> nn.Module:
    cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                  vocab_size=50, max_position_embeddings=32, layer_norm_eps=1e-7)
    return transformers.BertModel(cfg, add_pooling_layer=False)


def _llama() -> nn.Module:
    cfg = transformers.LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                   intermediate_size=32, vocab_size=50, max_position_embeddings=32, rms_norm_eps=1e-6)
    return transformers.LlamaModel(cfg)


class NoForward(nn.Module):
    """A composite of two models of their own that has no forward itself (transformers' BarkModel)."""

    def __init__(self):
        super().__init__()
        self.text = _bert()
        self.lm = _llama()


class NeedsSession(nn.Module):
    """Runs its text model, then stops for want of an inference session before its language model (SAM2-video
    style ``inference_session.get_obj_num()``)."""

    def __init__(self):
        super().__init__()
        self.text = _bert()
        self.lm = _llama()

    def forward(self, input_ids):
        h = self.text(input_ids).last_hidden_state
        raise RuntimeError(f"an inference session is needed after the text model ({tuple(h.shape)})")


def _build(cls: type) -> nn.Module:
    with torch.device("meta"):
        return cls().eval()


def _audit_assumed(model: nn.Module, inputs: tuple, rules: dict, on_meta: bool = True):
    """Audit ``model`` on ``inputs`` that the tool assumed (as for a config directory), not the user's own: a
    forward failing on them is no usage error."""
    mua = ModelUnderAudit(model=model, inputs=inputs, on_meta=on_meta, kind="python",
                          inputs_assumed="input_ids int64 (2, 8)")
    return build_report(AuditOptions(target=type(model).__name__), mua, rules)


def _parts(report) -> list[tuple[str, str, str]]:
    return [(p.module, p.class_name, p.method) for p in report.capture.parts]


def test_models_of_their_own_captured_when_the_forward_fails_at_once(rules):
    report = _audit_assumed(_build(NoForward), (torch.randint(0, 50, (2, 8)),), rules)
    cap = report.capture
    assert not cap.complete and cap.method == "parts"
    assert _parts(report) == [("text", "BertModel", OWN), ("lm", "LlamaModel", OWN)]
    assert [p.sites for p in cap.parts] == [3, 3]
    assert cap.parts[1].inputs[0] == "input_ids: int64[2, 16]"
    # nn.LayerNorm calls are modules; LlamaRMSNorm computes its RMS in torch ops (a pattern)
    for path, kind, eps, part, how in ([(n, "LayerNorm", 1e-7, "text", "module") for n in BERT_NORMS]
                                       + [(n, "RMSNorm", 1e-6, "lm", "pattern") for n in LLAMA_NORMS]):
        s = site(report, path)
        assert (s.kind, s.eps, s.detected_by, s.captured_part) == (kind, eps, how, part), path
        assert s.input_shape is not None and s.input_shape[-1] == 16 and s.formula is not None
    assert cap.unaudited == [] and "NK101" not in {f.rule_id for f in report.findings}
    assert ("the whole model could not be captured; 2 part(s) captured alone (text, lm): their sites have graph "
            "facts, placement is judged within each part") in report.notes
    assert ("the model's forward reached no part: the 2 part(s) were captured as models of their own on inputs "
            "built for them") in report.notes


def test_recorded_parts_and_models_of_their_own_are_told_apart(rules):
    # the text model runs and is captured on the inputs the forward gave it; the language model, never reached,
    # on inputs built for it; neither is captured twice
    report = _audit_assumed(_build(NeedsSession), (torch.randint(0, 50, (2, 8)),), rules)
    cap = report.capture
    assert not cap.complete and cap.method == "parts"
    assert _parts(report) == [("text", "BertModel", "export"), ("lm", "LlamaModel", OWN)]
    assert cap.parts[0].inputs == ["arg0: int64[2, 8]"]
    assert sorted(s.module for s in report.sites) == sorted(BERT_NORMS + LLAMA_NORMS)
    assert site(report, "lm.norm").captured_part == "lm" and site(report, "lm.norm").eps == 1e-6
    assert ("1 of them on the inputs the model's forward gave them (text), 1 as models of their own on inputs "
            "built for them (lm)") in report.notes


class EmbedsThenSession(nn.Module):
    """Runs the embeddings of its text model only, then stops for want of an inference session."""

    def __init__(self):
        super().__init__()
        self.text = _bert()
        self.lm = _llama()

    def forward(self, input_ids):
        h = self.text.embeddings(input_ids)
        raise RuntimeError(f"an inference session is needed after the embeddings ({tuple(h.shape)})")


def test_model_of_its_own_replaces_the_parts_recorded_inside_it(rules):
    # the forward recorded text.embeddings alone; the text model, holding norms no part covers, is captured
    # whole on inputs built for it, and its graph (which reaches text.embeddings.LayerNorm) replaces that part
    report = _audit_assumed(_build(EmbedsThenSession), (torch.randint(0, 50, (2, 8)),), rules)
    assert _parts(report) == [("text", "BertModel", OWN), ("lm", "LlamaModel", OWN)]
    assert sorted(s.module for s in report.sites) == sorted(BERT_NORMS + LLAMA_NORMS)  # each norm once
    assert site(report, "text.embeddings.LayerNorm").captured_part == "text"
    assert report.capture.unaudited == []


class SideModel(nn.Module):
    """A model of its own with a branch its own forward never calls (``side``)."""

    main_input_name = "input_ids"

    def __init__(self, d: int = 16):
        super().__init__()
        self.config = transformers.PretrainedConfig(vocab_size=50, hidden_size=d)
        self.emb = nn.Embedding(50, d)
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.side = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d, eps=1e-4))

    def forward(self, input_ids):
        return self.norm(self.emb(input_ids))


class CallsTheSide(nn.Module):
    def __init__(self):
        super().__init__()
        self.text = SideModel()

    def forward(self, input_ids):
        h = self.text.side(self.text.emb(input_ids))
        raise RuntimeError(f"an inference session is needed ({tuple(h.shape)})")


def test_model_of_its_own_missing_a_recorded_norm_replaces_nothing(rules):
    # text's own graph never reaches text.side.1, which the recorded part text.side reached: the part stays,
    # text is not captured over it (no norm sited twice, none lost), and text.norm stays unaudited
    report = _audit_assumed(CallsTheSide(), (torch.randint(0, 50, (2, 8)),), rules, on_meta=False)
    assert [(p.module, p.method) for p in report.capture.parts] == [("text.side", "symbolic_trace")]
    assert [(s.module, s.eps) for s in report.sites if s.detected_by != "module_walk"] == [("text.side.1", 1e-4)]
    assert [u.module for u in report.capture.unaudited] == ["text.norm"]


class HostEncoder(nn.Module):
    """A model of its own whose forward leaves torch (``.numpy()``): no graph of it, but of its blocks."""

    main_input_name = "input_ids"

    def __init__(self, d: int = 16):
        super().__init__()
        self.config = transformers.PretrainedConfig(vocab_size=50, hidden_size=d)
        self.emb = nn.Embedding(50, d)
        self.blocks = nn.ModuleList([_Block(d) for _ in range(2)])
        self.final = nn.RMSNorm(d, eps=1e-5)

    def forward(self, input_ids):
        distinct = len(np.unique(input_ids.numpy()))  # host code: neither export nor fake tensors run it
        x = self.emb(input_ids) * (distinct > 0)
        for b in self.blocks:
            x = b(x)
        return self.final(x)


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = HostEncoder()


def test_blocks_of_a_model_of_its_own_that_cannot_be_captured_whole(rules):
    report = _audit_assumed(Holder(), (torch.randint(0, 50, (2, 8)),), rules, on_meta=False)
    assert report.capture.method == "parts"
    assert [(p.module, p.class_name, p.method) for p in report.capture.parts] == [
        ("enc.blocks.0", "_Block", "symbolic_trace" + OWN_INPUTS), ("enc.blocks.1", "_Block", "symbolic_trace" + OWN_INPUTS),
        ("enc.final", "RMSNorm", "symbolic_trace" + OWN_INPUTS)]
    d = 16
    shape = report.capture.parts[0].inputs
    assert len(shape) == 1 and shape[0].startswith("arg0: float32[") and shape[0].endswith(f", {d}]")
    s = site(report, "enc.blocks.1.norm")
    assert (s.kind, s.eps, s.placement, s.block) == ("LayerNorm", 1e-6, "pre", "enc.blocks.1")
    assert (site(report, "enc.final").kind, site(report, "enc.final").eps) == ("RMSNorm", 1e-5)
    assert report.capture.unaudited == []


class PatchTower(nn.Module):
    """A vision tower taking ``pixel_values`` and ``grid_thw`` (Kimi-K2.5's MoonViT): its patch embedding is a
    Conv2d, so it wants images of patches, not the flattened rows the first candidate gives."""

    main_input_name = "pixel_values"

    def __init__(self):
        super().__init__()
        self.config = transformers.PretrainedConfig(patch_size=4, num_channels=3, temporal_patch_size=1)
        self.patch = nn.Conv2d(3, 16, 4, 4)
        self.norm = nn.LayerNorm(16, eps=1e-5)

    def forward(self, pixel_values, grid_thw):
        return self.norm(self.patch(pixel_values).flatten(1))


class TextAndPatches(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.text_norm = nn.LayerNorm(16, eps=1e-6)
        self.vision_tower = PatchTower()

    def forward(self, input_ids):
        return self.text_norm(self.emb(input_ids))


def test_tower_never_called_gets_the_inputs_a_meta_forward_accepts(rules):
    # the model is fake when its towers are captured: the candidates (flattened patches first) are checked by a
    # meta forward on a meta view of the tower (parts.own_inputs), as they would be for a model built on meta
    report = audit_model(_build(TextAndPatches), (torch.randint(0, 50, (2, 8)),), rules=rules, on_meta=True)
    cap = report.capture
    assert cap.complete and cap.method == "symbolic_trace"
    assert [(p.module, p.method, p.inputs) for p in cap.parts] == [
        ("vision_tower", "export", ["pixel_values: float32[8, 3, 4, 4]", "grid_thw: int64[2, 3]"])]
    s = site(report, "vision_tower.norm")
    assert (s.kind, s.eps, s.input_shape, s.captured_part) == ("LayerNorm", 1e-5, [8, 16], "vision_tower")
    assert cap.unaudited == []
