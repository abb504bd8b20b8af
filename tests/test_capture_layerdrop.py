"""Parts capture of a stack with layerdrop: the parts' inputs are recorded in eval mode, so a training-mode
model whose forward skips blocks at random (``if self.training and torch.rand([]) < p: continue``,
SeamlessM4T's speech encoder) still has every block captured."""
from __future__ import annotations

import torch
from torch import nn

from conftest import audit_model, site


class Layer(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class LayerDropEncoder(nn.Module):
    """Pre-LN layers skipped at random in training (layerdrop 1.0: a training forward skips them all)."""

    def __init__(self, d: int = 16, layerdrop: float = 1.0):
        super().__init__()
        self.layers = nn.ModuleList([Layer(d) for _ in range(2)])
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.layerdrop = layerdrop

    def forward(self, x):
        for layer in self.layers:
            if self.training and torch.rand([]) < self.layerdrop:
                continue
            x = layer(x)
        return self.norm(x)


class Speech(nn.Module):
    """A top-level forward that reads its data (no graph of the whole model in either mode)."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.encoder = LayerDropEncoder(d)

    def forward(self, x):
        if float(x.abs().sum()) < 0:  # a data-dependent branch
            x = -x
        return self.encoder(x)


def test_layerdrop_stack_in_training_mode_has_every_layer_captured(rules):
    model = Speech().train()
    report = audit_model(model, (torch.randn(2, 8, 16),), rules=rules)
    cap = report.capture
    assert not cap.complete and cap.method == "parts"
    assert [(p.module, p.class_name, p.method, p.inputs, p.sites) for p in cap.parts] == [
        ("encoder.layers.0", "Layer", "symbolic_trace", ["arg0: float32[2, 8, 16]"], 1),
        ("encoder.layers.1", "Layer", "symbolic_trace", ["arg0: float32[2, 8, 16]"], 1),
        ("encoder.norm", "LayerNorm", "symbolic_trace", ["arg0: float32[2, 8, 16]"], 1)]
    for path, eps in (("encoder.layers.0.norm", 1e-6), ("encoder.layers.1.norm", 1e-6), ("encoder.norm", 1e-5)):
        s = site(report, path)
        assert (s.kind, s.detected_by, s.eps, s.normalized_axes) == ("LayerNorm", "module", eps, ["feature"])
    assert cap.unaudited == []
    assert model.training and all(m.training for m in model.modules())  # the modes are restored


def test_recording_keeps_what_only_a_training_forward_reaches():
    """A holder only the training forward calls (eval stops before it) is recorded by the training pass."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from normaudit.capture.parts import _record_best

    class TrainOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.LayerNorm(16), nn.LayerNorm(16)

        def forward(self, x):
            x = self.a(x)
            if not self.training:
                raise ValueError("eval stops here")
            return self.b(x)

    model = TrainOnly().train()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        x = torch.randn(2, 16)
    recorded, error = _record_best(model, (x,), mode, {"a", "b"}, None, None)
    assert sorted(recorded) == ["a", "b"] and error is None
    assert [tuple(recorded[p][0][0].shape) for p in ("a", "b")] == [(2, 16), (2, 16)]
    assert model.training
