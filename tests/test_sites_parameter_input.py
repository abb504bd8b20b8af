"""A norm whose input is made from parameters or buffers alone, broadcast over the batch (learned latents or
queries expanded to ``(B, N, D)``: Perceiver, Q-Former; a positional table expanded or sliced to the input's
length and repeated), normalises a per-example tensor: it is a site, with the same facts whether the model is
captured by symbolic tracing (a tuple of inputs) or by ``torch.export`` (a dict of keyword inputs).

Symbolic tracing sees the batch size read off the input (``x.shape[0]``), so the broadcast depends on the
input; export bakes that size into the graph as a literal, so the broadcast must be recognised by its shape.
Statistics of a weight that is not spread over the batch (a weight-norm layer's ``F.normalize``) stay out
under both."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts

X = torch.randn(2, 8, 16)
INPUTS = {"symbolic_trace": lambda: (X.clone(),), "export": lambda: {"x": X.clone()}}


def _sites(model: nn.Module, method: str) -> list[tuple]:
    """(module, kind, eps, detected_by, normalized_shape, normalized_axes) of every site, in graph order, of
    ``model`` captured on ``X`` given as a tuple (symbolic tracing) or as a dict (export). The dims of a
    parameter's broadcast carry no input's labels, so its ``normalized_axes`` is ``unknown`` under both."""
    cap = capture_model(copy.deepcopy(model), INPUTS[method](), on_meta=False)
    assert cap.method == method, cap.attempts
    recs = collect_facts(FactContext(cap=cap, probe_model=copy.deepcopy(model))).records
    return [(r.site.module, r.site.kind, r.site.eps, r.site.detected_by, r.site.normalized_shape,
             r.site.normalized_axes) for r in recs]


class HandRMS(nn.Module):
    """A hand-written RMSNorm (the transformers form)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.w = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        v = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(v + self.eps) * self.w


class Latents(nn.Module):
    """Learned latent queries expanded over the batch, normalised by a hand-written RMSNorm and by
    ``F.layer_norm`` inline; the input goes through a linear layer beside them."""

    def __init__(self):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(4, 16))
        self.norm = HandRMS(16, 1e-6)
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        q = self.latents.unsqueeze(0).expand(x.shape[0], -1, -1)
        k = F.layer_norm(q, (16,), eps=1e-4)
        return self.lin(x).mean(1) + self.norm(q).mean(1) + k.mean(1)


class PositionalTable(nn.Module):
    """A positional table of the input's length, expanded over the batch and normalised by a hand-written
    RMSNorm and an ``nn.LayerNorm``."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 8, 16))
        self.norm = HandRMS(16, 1e-5)
        self.ln = nn.LayerNorm(16, eps=1e-3)
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        p = self.pos.expand(x.shape[0], -1, -1)
        return self.lin(x).mean(1) + self.norm(p).mean(1) + self.ln(p).mean(1)


class SlicedTable(nn.Module):
    """A positional table longer than the input, sliced to the input's length and repeated over the batch."""

    def __init__(self):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 12, 16))
        self.norm = HandRMS(16, 1e-5)
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        r = self.pos[:, : x.shape[1]].repeat(x.shape[0], 1, 1)
        return self.lin(x).mean(1) + self.norm(r).mean(1)


class BufferTable(nn.Module):
    """A positional buffer (sinusoidal, not learned) expanded over the batch. Symbolic tracing keeps buffers as
    real tensors, which a traced size cannot expand, so only export captures it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("pos", torch.randn(1, 8, 16))
        self.norm = HandRMS(16, 1e-5)
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x).mean(1) + self.norm(self.pos.expand(x.shape[0], -1, -1)).mean(1)


class WeightNormLinear(nn.Module):
    """A weight-norm linear layer (``g * v / ||v||``, Salimans & Kingma 2016): its ``F.normalize`` is of a
    weight, not of data, and is no site; the hand-written RMSNorm after it is one."""

    def __init__(self):
        super().__init__()
        self.v = nn.Parameter(torch.randn(16, 16))
        self.g = nn.Parameter(torch.ones(16, 1))
        self.norm = HandRMS(16, 1e-6)

    def forward(self, x):
        return self.norm(F.linear(x, self.g * F.normalize(self.v, dim=1)))


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_norms_of_latents_expanded_over_the_batch_are_sites(method):
    assert _sites(Latents(), method) == [
        ("", "LayerNorm", 1e-4, "functional", [16], ["unknown"]),
        ("norm", "RMSNorm", 1e-6, "pattern", [16], ["unknown"]),
    ]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_norms_of_a_positional_table_expanded_over_the_batch_are_sites(method):
    assert _sites(PositionalTable(), method) == [
        ("norm", "RMSNorm", 1e-5, "pattern", [16], ["unknown"]),
        ("ln", "LayerNorm", 1e-3, "module", [16], ["unknown"]),
    ]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_norm_of_a_table_sliced_to_the_input_and_repeated_is_a_site(method):
    assert _sites(SlicedTable(), method) == [("norm", "RMSNorm", 1e-5, "pattern", [16], ["unknown"])]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_weight_normalised_by_a_weight_norm_layer_stays_out(method):
    assert _sites(WeightNormLinear(), method) == [("norm", "RMSNorm", 1e-6, "pattern", [16], ["feature"])]


def test_norm_of_a_buffer_expanded_over_the_batch_is_a_site():
    assert _sites(BufferTable(), "export") == [("norm", "RMSNorm", 1e-5, "pattern", [16], ["unknown"])]
    # a tuple of inputs: symbolic tracing fails on the buffer's expand, and export is what captures it
    cap = capture_model(BufferTable(), (X.clone(),), on_meta=False)
    assert [a.method for a in cap.attempts if a.ok] == ["export"]
