"""Export retried with integer factories as constants after a data-dependent failure, for a model with no
integer inputs or buffers to pass as constants: PE-AV's encoder compares a length vector
made by ``x.new_ones(B, dtype=torch.long)`` with a size (``modeling_pe_audio_video.py:182-193``), a branch
on values that fake tensors alone cannot take."""
from __future__ import annotations

import torch
from torch import nn

from normaudit.capture import capture_model
from normaudit.facts.sites import discover_sites


class AlignThenNorm(nn.Module):
    """Video and audio features ``(B, T, 8)``: aligned when their lengths differ, then normalised."""

    def __init__(self):
        super().__init__()
        self.resample = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8, eps=1e-6)

    def forward(self, video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        lengths = audio.shape[1] * audio.new_ones(audio.shape[0], dtype=torch.long)
        if (lengths == video.shape[1]).all():
            return self.norm(video + audio)
        return self.norm(self.resample(video))


def test_integer_new_ones_lifted_after_a_data_dependent_export_failure():
    model = AlignThenNorm().eval()
    cap = capture_model(model, (torch.randn(2, 4, 8), torch.randn(2, 4, 8)), on_meta=False)
    assert cap.gm is not None and cap.method == "export"
    tried = [(a.method, a.ok) for a in cap.attempts]
    assert tried[-1] == ("export (integer factories as constants)", True)
    assert ("export", False) in tried and "GuardOnDataDependentSymNode" in next(
        a.error for a in cap.attempts if a.method == "export")
    sites = discover_sites(cap)
    assert [(r.site.module, r.site.kind, r.site.eps) for r in sites] == [("norm", "LayerNorm", 1e-6)]
    # the branch taken is the one the real lengths choose: equal lengths, no resampling in the graph
    assert not any("resample" in str(n.meta.get("nn_module_stack", {})) for n in cap.gm.graph.nodes)


def test_float_new_ones_stays_fake_and_plain_export_needs_no_retry():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(x * x.new_ones(x.shape[-1]))  # float: not lifted, and nothing data-dependent

    cap = capture_model(Scale().eval(), {"x": torch.randn(2, 4, 8)}, on_meta=False)
    assert [(a.method, a.ok) for a in cap.attempts] == [("export", True)]
