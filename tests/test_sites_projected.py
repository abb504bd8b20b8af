"""An inverse RMS applied to a projection of the tensor it was taken on is an RMSNorm site:
``F.linear(x, W) * rsqrt(mean(x^2, -1) + eps) == F.linear(x * rsqrt(mean(x^2, -1) + eps), W)``. Model: the
hyper-connections of transformers' HY-V4 (DeepSeek-V4 form), whose ``HYV4UnweightedRMSNorm`` returns only
``torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps)`` for its caller to multiply:
``mixes = F.linear(flat, self.fn.float()) * self.input_norm(flat)``. True negatives: the statistic over a dim
the projection contracts (it varies along it), and a projection of another tensor."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts


class UnweightedInverseRMS(nn.Module):
    """HYV4UnweightedRMSNorm: the inverse RMS only."""

    def __init__(self, eps: float = 1e-6, dim: int = -1):
        super().__init__()
        self.eps, self.dim = eps, dim

    def forward(self, x):
        return torch.rsqrt(x.float().square().mean(self.dim, keepdim=True) + self.eps).to(x.dtype)


class HyperConnection(nn.Module):
    """HYV4HyperConnection's mixing logits: a projection of the flattened streams times their inverse RMS."""

    def __init__(self, streams: int = 2, dim: int = 8, eps: float = 1e-5, stat_dim: int = -1, other: bool = False):
        super().__init__()
        self.input_norm = UnweightedInverseRMS(eps, stat_dim)
        # square when the statistic is over tokens, so that its per-feature scale broadcasts
        self.fn = nn.Parameter(torch.randn(streams * dim if stat_dim == 1 else 2 * streams, streams * dim))
        self.other = other

    def forward(self, streams):
        flat = streams.flatten(2).float()
        projected = F.linear(flat.flip(-1) if self.other else flat, self.fn.float())
        mixes = projected * self.input_norm(flat)
        return torch.sigmoid(mixes)


def _sites(model, method):
    x = torch.randn(2, 5, 2, 8)
    cap = capture_model(copy.deepcopy(model), (x,), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    records = collect_facts(FactContext(cap=cap, probe_model=copy.deepcopy(model))).records
    return [(r.site.module, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.input_shape) for r in records]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_inverse_rms_times_a_projection_is_an_rmsnorm(method):
    assert _sites(HyperConnection(), method) == [("input_norm", "RMSNorm", 1e-5, [2], [2, 5, 16])]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
@pytest.mark.parametrize("kw", [{"stat_dim": 1}, {"other": True}], ids=["stat-over-tokens", "other-tensor"])
def test_a_projection_that_does_not_commute_with_the_scale_is_no_site(method, kw):
    assert _sites(HyperConnection(**kw), method) == []


class ExclusiveSelfAttention(nn.Module):
    """transformers NeoMMEExclusiveSelfAttention: removes from each head's output its component along the
    head's unit value vector; ``F.normalize`` gives a direction, no norm (the module holds only ``alpha``)."""

    def __init__(self, heads: int = 4):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((heads,), 0.5))

    def forward(self, attn_output, value_states):
        value_unit = F.normalize(value_states.float(), dim=-1).to(attn_output.dtype)
        projection = (attn_output * value_unit).sum(-1, keepdim=True)
        scale = torch.tanh(self.alpha).to(attn_output.dtype).view(1, 1, -1, 1)
        return attn_output - (scale * projection) * value_unit


class UnitNorm(nn.Module):
    """An L2 RMSNorm module (``F.normalize(x) * sqrt(d) * g``): the true positive beside it."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.g = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.normalize(x, dim=-1) * x.shape[-1] ** 0.5 * self.g


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.v = nn.Linear(8, 8)
        self.xsa = ExclusiveSelfAttention()
        self.norm = UnitNorm()

    def forward(self, x):  # x: (B, S, H, D)
        return self.norm(self.xsa(x, self.v(x)))


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_unit_direction_of_a_projection_is_an_l2norm_not_an_rmsnorm(method):
    """The unit value vector is an L2 normalisation (kind L2Norm, in float32: the input is upcast first), not
    the RMSNorm a module that is only a norm makes of ``F.normalize``."""
    cap = capture_model(Heads(), (torch.randn(2, 5, 4, 8),), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    records = collect_facts(FactContext(cap=cap, probe_model=Heads())).records
    assert [(r.site.module, r.site.kind, r.site.reduced_dims, r.site.eps) for r in records] == [
        ("xsa", "L2Norm", [3], 1e-12), ("norm", "RMSNorm", [3], 1e-12)]
