"""An op that refuses to trace while its inputs need grad (FlexAttention on CPU: "does not support backward on
CPU. Please set the input requires_grad to False", as in torchtitan's Llama 3, Qwen 3, DeepSeek-V3 models) is
captured whole with the parameters' requires_grad off for the capture, not by parts or a module walk; the
user's model keeps its flags."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.flex_attention import flex_attention

from tests.conftest import audit_model


class _Block(nn.Module):
    def __init__(self, d=32, h=2):
        super().__init__()
        self.h = h
        self.norm = nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        return x + self.out(flex_attention(q, k, v).transpose(1, 2).reshape(b, s, d))


class _FlexLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(2))
        self.norm = nn.RMSNorm(32)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def test_flex_attention_model_is_captured_whole_without_grad():
    model = _FlexLM()
    report = audit_model(model, (torch.randn(2, 8, 32),))
    ok = [a.method for a in report.capture.attempts if a.ok]
    assert (report.capture.method, report.capture.complete, ok) == ("export", True,
                                                                    ["export (parameters without grad)"])
    assert "does not support backward on CPU" in report.capture.attempts[1].error
    assert [(s.module, s.placement) for s in report.sites] == [("layers.0.norm", "pre"), ("layers.1.norm", "pre"),
                                                               ("norm", "final")]
    assert report.model.placement == "pre" and report.model.has_final_norm is True
    assert all(p.requires_grad for p in model.parameters())


def test_a_model_that_captures_with_grad_gets_no_extra_attempt():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    report = audit_model(model, (torch.randn(2, 8),))
    assert [a.method for a in report.capture.attempts] == ["symbolic_trace"]
