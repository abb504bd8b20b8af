"""Capture of forwards that read integer buffers as sizes: EnCodec's, Mimi's,
WavTokenizer's and Pocket-TTS's causal convolutions keep ``stride``, ``kernel_size`` and ``padding_total``
as non-persistent int64 buffers and pad by them (``F.pad(x, (self.padding_total, extra))``,
``modeling_encodec.py`` ``EncodecConv1d``). Built on the meta device those buffers have no values, and
export lifts every buffer as a fake input: the pad sizes become unbacked symbols and export fails on a
data-dependent guard. The retry passes the integer buffers as constants, their values read from a real
buffer or, on meta, from what the library's own ``_init_weights`` gives them (as transformers does after
building a model on meta). Each model here is small and hand-written (a ``transformers`` PreTrainedModel
subclass where the mechanism is the library's)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import audit_model, site
from normaudit.capture import capture_model
from normaudit.capture.constants import integer_buffers

transformers = pytest.importorskip("transformers")


class CausalConv(nn.Module):
    """EnCodec-style causal conv: the pad sizes are integer buffers (``modeling_encodec.py`` EncodecConv1d)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride)
        self.stride = nn.Buffer(torch.tensor(stride, dtype=torch.int64), persistent=False)
        self.kernel_size = nn.Buffer(torch.tensor(kernel, dtype=torch.int64), persistent=False)
        self.padding_total = nn.Buffer(torch.tensor(kernel - stride, dtype=torch.int64), persistent=False)

    def forward(self, x):
        length = x.shape[-1]
        n_frames = (length - self.kernel_size + self.padding_total) / self.stride + 1
        n_frames = torch.ceil(n_frames).to(torch.int64) - 1
        extra = n_frames * self.stride + self.kernel_size - self.padding_total - length
        return self.conv(nn.functional.pad(x, (self.padding_total, extra)))


class _Layer(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class CodecConfig(transformers.PretrainedConfig):
    model_type = "normaudit_test_codec"

    def __init__(self, hidden_size: int = 16, sliding_window: int = 64, **kwargs):
        self.hidden_size = hidden_size
        self.sliding_window = sliding_window
        super().__init__(**kwargs)


class CodecEncoder(transformers.PreTrainedModel):
    """A Mimi-style encoder: strided causal convs, then a transformer over the frames (a Python branch on
    their count against the sliding window: the guard export cannot take on an unbacked size), and a final
    norm. ``_init_weights`` sets the conv buffers, as ``MimiPreTrainedModel._init_weights`` does."""

    config_class = CodecConfig
    main_input_name = "input_values"

    def __init__(self, config: CodecConfig):
        super().__init__(config)
        d = config.hidden_size
        self.convs = nn.ModuleList([CausalConv(1, d, 7), CausalConv(d, d, 4, stride=2)])
        self.layers = nn.ModuleList([_Layer(d) for _ in range(2)])
        self.final_norm = nn.LayerNorm(d, eps=1e-6)

    def _init_weights(self, module):
        if isinstance(module, CausalConv):
            kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
            transformers.initialization.constant_(module.stride, stride)
            transformers.initialization.constant_(module.kernel_size, kernel)
            transformers.initialization.constant_(module.padding_total, kernel - stride)

    def forward(self, input_values):
        x = input_values
        for conv in self.convs:
            x = conv(x)
        x = x.transpose(1, 2)
        if x.shape[1] > self.config.sliding_window:
            x = x[:, -self.config.sliding_window:]
        for layer in self.layers:
            x = layer(x)
        return self.final_norm(x)


def _meta_encoder() -> CodecEncoder:
    with torch.device("meta"):
        return CodecEncoder(CodecConfig())


def test_meta_buffers_get_their_values_from_init_weights():
    model = _meta_encoder()
    assert model.convs[1].padding_total.device.type == "meta"
    values = integer_buffers(model, on_meta=True)
    assert sorted(values) == ["convs.0", "convs.1"]
    assert {k: int(v) for k, v in values["convs.1"].items()} == {"stride": 2, "kernel_size": 4, "padding_total": 2}
    assert {k: int(v) for k, v in values["convs.0"].items()} == {"stride": 1, "kernel_size": 7, "padding_total": 6}
    assert model.convs[1].padding_total.device.type == "meta"  # the model's own buffers are left as they were


def test_meta_buffers_read_as_pad_sizes_are_constants_on_the_retry():
    model = _meta_encoder()
    cap = capture_model(model, (torch.randn(2, 1, 40),), on_meta=True, methods=("export",), parts_fallback=False)
    assert [(a.method, a.ok) for a in cap.attempts] == [
        ("export", False), ("export (integer buffers as constants)", True)]
    assert "GuardOnDataDependentSymNode" in cap.attempts[0].error
    pads = [list(n.args[1]) for n in cap.gm.graph.nodes if n.target == torch.ops.aten.pad.default]
    assert pads == [[6, 0], [2, 0]]  # padding_total, and no extra padding for 40 -> 40 frames
    norms = [tuple(n.meta["val"].shape) for n in cap.gm.graph.nodes if "layer_norm" in str(n.target)]
    assert norms == [(2, 20, 16)] * 3  # 40 samples -> 40 -> (40 + 2 - 4) // 2 + 1 = 20 frames
    # the buffers are registered again, in their order, and the constants' placeholders are not inputs
    assert list(model.convs[1]._buffers) == ["stride", "kernel_size", "padding_total"]
    assert "padding_total" not in model.convs[1].__dict__
    assert cap.user_inputs == ["args_0"]  # the one positional input; the constants are not inputs


def test_meta_codec_audited_whole_with_every_fact(rules):
    report = audit_model(_meta_encoder(), (torch.randn(2, 1, 40),), rules=rules, on_meta=True)
    assert report.capture.complete and report.capture.method == "export"
    assert report.capture.attempts[-1].method == "export (integer buffers as constants)"
    assert [s.module for s in report.sites] == ["layers.0.norm", "layers.1.norm", "final_norm"]
    assert site(report, "layers.1.norm").placement == "pre"
    assert (site(report, "final_norm").eps, site(report, "final_norm").normalized_axes) == (1e-6, ["channel"])
    assert report.capture.unaudited == []


def test_real_buffers_give_their_own_values():
    model = CodecEncoder(CodecConfig())
    values = integer_buffers(model, on_meta=False)
    assert {k: int(v) for k, v in values["convs.1"].items()} == {"stride": 2, "kernel_size": 4, "padding_total": 2}


class UnsetBuffer(CodecEncoder):
    """``_init_weights`` leaves the buffers alone: on meta their values are unknown."""

    def _init_weights(self, module):
        pass


def test_a_buffer_init_weights_does_not_set_stays_unknown():
    with torch.device("meta"):
        model = UnsetBuffer(CodecConfig()).eval()
    assert integer_buffers(model, on_meta=True) == {}
    cap = capture_model(model, (torch.randn(2, 1, 40),), on_meta=True, methods=("export",), parts_fallback=False)
    # no retry with made-up buffer values; only the factories (values from Python numbers) as constants
    assert [(a.method, a.ok) for a in cap.attempts] == [("export", False),
                                                        ("export (integer factories as constants)", False)]


class PlainNet(nn.Module):
    """Not a library model: its meta buffers have no source of values."""

    def __init__(self):
        super().__init__()
        self.conv = CausalConv(1, 8, 3)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.conv(x).transpose(1, 2))


def test_meta_buffers_of_a_plain_module_stay_unknown_real_ones_are_used():
    with torch.device("meta"):
        meta = PlainNet()
    assert integer_buffers(meta, on_meta=True) == {}
    assert {k: int(v) for k, v in integer_buffers(PlainNet(), on_meta=False)["conv"].items()} == {
        "stride": 1, "kernel_size": 3, "padding_total": 2}


class _MoeLayer(nn.Module):
    """A decoder layer whose experts loop over the experts hit (``for e in hit``, Step3p7Experts): a
    data-dependent length no capture on fake tensors takes; its norms and attention still capture alone."""

    def __init__(self, d: int, experts: int = 3):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d, eps=1e-6)
        self.attn = nn.Linear(d, d)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=1e-6)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(experts)])

    def forward(self, x):
        x = x + self.attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        choice = self.router(h).argmax(-1)
        out = torch.zeros_like(h)
        for e in torch.unique(choice):
            out = out + self.experts[int(e)](h) * (choice == e).unsqueeze(-1)
        return x + out


class TinyVlm(nn.Module):
    """A vision-language model: image features replace the placeholder tokens after a count check
    (``get_placeholder_mask``) that the example's ids do not pass, so neither the whole forward nor its
    recording on all inputs reaches the language model; its MoE layers stop the text-only capture too."""

    main_input_name = "input_ids"

    def __init__(self, d: int = 8):
        super().__init__()
        self.vision_norm = nn.LayerNorm(d)
        self.patch = nn.Linear(12, d)
        self.embed_tokens = nn.Embedding(16, d)
        self.layers = nn.ModuleList([_MoeLayer(d) for _ in range(2)])
        self.norm = nn.RMSNorm(d, eps=1e-5)

    def forward(self, input_ids, pixel_values=None):
        x = self.embed_tokens(input_ids)
        if pixel_values is not None:
            feats = self.vision_norm(self.patch(pixel_values.flatten(2)))
            mask = input_ids == 15
            torch._check(int(mask.sum()) == feats.shape[0] * feats.shape[1], lambda: "image tokens do not match")
            x = x.masked_scatter(mask.unsqueeze(-1), feats)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def test_language_model_parts_recorded_on_the_main_towers_inputs(rules):
    inputs = {"input_ids": torch.randint(0, 4, (2, 6)), "pixel_values": torch.randn(2, 3, 3, 4)}
    report = audit_model(TinyVlm().eval(), inputs, rules=rules)
    assert not report.capture.complete
    assert report.capture.unaudited == []
    assert {s.module for s in report.sites if s.detected_by != "module_walk"} == {
        "vision_norm", "layers.0.input_layernorm", "layers.0.post_attention_layernorm",
        "layers.1.input_layernorm", "layers.1.post_attention_layernorm", "norm"}
    assert site(report, "layers.1.post_attention_layernorm").eps == 1e-6
    assert site(report, "norm").normalized_axes == ["feature"]
