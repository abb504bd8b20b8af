"""A training-mode export that skipped blocks of a stack at random (LayerDrop drawn in Python, computed for
real while tracing: VITS's text encoder, ``np.random.uniform(0, 1) < layerdrop``, modeling_vits.py:1113-1115)
is retried in eval mode, which runs every block; a stack that leaves a block out by design in both modes
keeps its training-mode graph."""
from __future__ import annotations

import torch
from torch import nn

from conftest import _Block, audit_model
from normaudit.capture import skipped_blocks


class PythonLayerDrop(nn.Module):
    """Three pre-LN layers; in training the draws (a Python list standing for np.random) skip layer 1."""

    def __init__(self, d: int = 16, draws=(0.5, 0.01, 0.7)):
        super().__init__()
        self.layers = nn.ModuleList([_Block(d) for _ in range(3)])
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.draws, self.layerdrop = draws, 0.1

    def forward(self, x):
        for layer, u in zip(self.layers, self.draws):
            if self.training and u < self.layerdrop:
                continue
            x = layer(x)
        return self.norm(x)


class SkipsByDesign(PythonLayerDrop):
    """Layer 1 is left out in both modes (VITS's duration predictor drops a flow in its reverse pass)."""

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i != 1:
                x = layer(x)
        return self.norm(x)


def test_random_skip_in_training_is_retried_in_eval_and_every_norm_is_a_site(rules):
    report = audit_model(PythonLayerDrop().train(), (torch.randn(2, 8, 16),), rules=rules)
    cap = report.capture
    assert [(a.method, a.ok) for a in cap.attempts] == [("symbolic_trace", False), ("symbolic_trace (eval)", True)]
    assert cap.attempts[0].error == ("the training-mode trace skipped 1 block(s) of a stack at random "
                                     "(layerdrop): layers.1")
    assert sorted(s.module for s in report.sites) == ["layers.0.norm", "layers.1.norm", "layers.2.norm", "norm"]


def test_a_block_left_out_in_both_modes_keeps_the_training_graph(rules):
    report = audit_model(SkipsByDesign().train(), (torch.randn(2, 8, 16),), rules=rules)
    cap = report.capture
    assert [(a.method, a.ok, a.error) for a in cap.attempts] == [("symbolic_trace", True, None)]
    assert sorted(s.module for s in report.sites) == ["layers.0.norm", "layers.2.norm", "norm"]


def test_skipped_blocks_names_only_norm_holding_blocks_whose_sibling_ran():
    model = PythonLayerDrop().train()
    gm = torch.export.export(model, (torch.randn(2, 8, 16),), strict=False).module()
    assert skipped_blocks(gm, dict(model.named_modules())) == ["layers.1"]
    model.eval()
    gm = torch.export.export(model, (torch.randn(2, 8, 16),), strict=False).module()
    assert skipped_blocks(gm, dict(model.named_modules())) == []


def test_a_stack_whose_every_block_was_dropped_is_retried_in_eval(rules):
    """Two layers both dropped (no sibling ran, but the encoder holding them did): the eval graph has them."""
    report = audit_model(PythonLayerDrop(draws=(0.01, 0.02, 0.03)).train(), (torch.randn(2, 8, 16),), rules=rules)
    assert [(a.method, a.ok) for a in report.capture.attempts] == [("symbolic_trace", False),
                                                                   ("symbolic_trace (eval)", True)]
    assert sorted(s.module for s in report.sites) == ["layers.0.norm", "layers.1.norm", "layers.2.norm", "norm"]
