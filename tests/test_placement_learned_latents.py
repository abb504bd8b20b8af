"""A Perceiver resampler's first layer normalises learned latent queries, a tensor computed from parameters
only (Idefics2's connector, modeling_idefics2.py:626-628: ``residual = latents; latents =
input_latents_norm(latents)``, latents the expanded ``latents_q`` parameter). Its role is no evidence of the
stack's residual-norm scheme (NP104 warned on idefics2: 'an embedding norm, but the same norm is pre in the
other blocks'), and export must label it as symbolic_trace does (export's aten.linear of the parameter-only
latents was no weighted op, so the norm read as a q/k norm)."""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from conftest import audit_model
from normaudit.facts import placement
from normaudit.report import Block, StreamFacts


class ResamplerLayer(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.latents_norm, self.context_norm, self.mlp_norm = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o, self.mlp = (nn.Linear(d, d) for _ in range(5))

    def forward(self, latents: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        residual = latents
        lat, ctx = self.latents_norm(latents), self.context_norm(context)
        kv = torch.cat([ctx, lat], dim=1)
        latents = residual + self.o(F.scaled_dot_product_attention(self.q(lat), self.k(kv), self.v(kv)))
        return latents + self.mlp(self.mlp_norm(latents))


class Resampler(nn.Module):
    """Image features (B, N, 16) -> 4 learned latents through 3 layers, then a final norm."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(4, d))
        self.layers = nn.ModuleList(ResamplerLayer(d) for _ in range(3))
        self.norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latents = self.latents.unsqueeze(0).expand(x.shape[0], -1, -1)
        for layer in self.layers:
            latents = layer(latents, x)
        return self.norm(latents)


def _roles(report) -> dict[str, str]:
    return {s.module: s.placement for s in report.sites}


def test_export_labels_the_first_layers_latent_norm_as_symbolic_trace_does(rules):
    traced = audit_model(Resampler().eval(), (torch.randn(2, 5, 16),), rules=rules)
    exported = audit_model(Resampler().eval(), {"x": torch.randn(2, 5, 16)}, rules=rules)
    assert (traced.capture.method, exported.capture.method) == ("symbolic_trace", "export")
    assert _roles(exported)["layers.0.latents_norm"] == _roles(traced)["layers.0.latents_norm"] == "embedding"
    assert _roles(exported)["layers.1.latents_norm"] == "pre"
    assert [f.rule_id for f in exported.findings if f.rule_id.startswith("NP")] == []


def _info(path: str, **flags) -> SimpleNamespace:
    return SimpleNamespace(rec=SimpleNamespace(site=SimpleNamespace(module=path, call_index=0, stream=StreamFacts())), **flags)


def _mixed(first_flags: dict) -> dict:
    blocks = [Block(path=f"layers.{i}", class_name="Layer", norms={f"layers.{i}.norm": r})
              for i, r in enumerate(["embedding", "pre", "pre"])]
    infos = [_info("layers.0.norm", **first_flags), _info("layers.1.norm"), _info("layers.2.norm")]
    placement.mark_mixed(blocks, infos)
    return infos[0].rec.site.stream.model_dump(exclude_defaults=True)


def test_a_norm_of_parameters_only_is_no_evidence_of_mixed_placement():
    assert _mixed({"reads_constant": True}) == {}
    # the same role on the stream is flagged (NP104's true positive)
    assert _mixed({})["majority_placement"] == "pre"
    assert _mixed({})["majority_blocks"] == ["layers.1", "layers.2"]
