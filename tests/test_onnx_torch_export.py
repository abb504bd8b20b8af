"""A real ``torch.onnx.export`` (the dynamo exporter, on CPU) of a 2-block pre-LN transformer with
``nn.LayerNorm`` and ``nn.RMSNorm``: the sites found are the PyTorch modules, by the names the exporter
recorded (``pkg.torch.onnx.name_scopes``), with their exact eps, placement and the nodes behind them; the eps
against an HF config (NE101) flags exactly the norms the config contradicts."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from normaudit.audit import run_audit  # noqa: E402
from normaudit.engine.loader import load_rules  # noqa: E402
from normaudit.options import AuditOptions  # noqa: E402

RULES = load_rules([])
D = 16


class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)): a pre-LN block (attention replaced by a linear map)."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D, eps=1e-6)
        self.attn = nn.Linear(D, D)
        self.ln2 = nn.RMSNorm(D, eps=1e-5)
        self.mlp = nn.Linear(D, D)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(D, eps=1e-6)
        self.head = nn.Linear(D, 8)

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("export") / "tiny.onnx"
    try:
        torch.onnx.export(Tiny().eval(), (torch.randn(2, 5, D),), str(path), dynamo=True, verbose=False)
    except Exception as err:  # noqa: BLE001 - any exporter failure is an environment without a working exporter
        pytest.skip(f"torch.onnx.export (dynamo) cannot run here: {type(err).__name__}: {str(err)[:200]}")
    return path


def audit(path: Path, **kw):
    return run_audit(AuditOptions(target=str(path), **kw), RULES)


def test_sites_of_a_real_export(exported):
    report = audit(exported)
    got = {s.module: (s.kind, s.eps, s.placement, s.normalized_axes, s.onnx.op_type, s.onnx.module_from)
           for s in report.sites}
    assert got == {
        "layers.0.ln1": ("LayerNorm", 1e-6, "pre", ["feature"], "LayerNormalization", "name_scopes"),
        "layers.0.ln2": ("RMSNorm", 1e-5, "pre", ["feature"], "ReduceMean", "name_scopes"),
        "layers.1.ln1": ("LayerNorm", 1e-6, "pre", ["feature"], "LayerNormalization", "name_scopes"),
        "layers.1.ln2": ("RMSNorm", 1e-5, "pre", ["feature"], "ReduceMean", "name_scopes"),
        "norm": ("LayerNorm", 1e-6, "final", ["feature"], "LayerNormalization", "name_scopes"),
    }
    by = {s.module: s for s in report.sites}
    # nn.RMSNorm is exported decomposed: x * rsqrt(mean(x^2) + eps) * w
    assert by["layers.0.ln2"].formula.text == "x / sqrt(mean(x^2) + eps) * w"
    import onnx

    ops = {n.name: n.op_type for n in onnx.load(str(exported), load_external_data=False).graph.node}
    assert [ops[n] for n in by["layers.0.ln2"].onnx.nodes] == ["Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal",
                                                               "Mul", "Mul"]
    assert by["layers.0.ln1"].onnx.stash_type == "float32"
    assert (report.model.placement, report.model.has_final_norm) == ("pre", True)
    assert {s.module: s.weights.gain_mean for s in report.sites} == dict.fromkeys(got, 1.0)
    assert report.findings == []


def test_eps_of_a_real_export_against_the_config(exported, tmp_path):
    """The config says rms_norm_eps 1e-6 and layer_norm_eps 1e-6: the two RMSNorms (1e-5) are flagged, the
    LayerNorms not; a config agreeing with every norm flags none."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"rms_norm_eps": 1e-6, "layer_norm_eps": 1e-6}))
    found = {f.module: f.severity for f in audit(exported, config=str(config)).findings if f.rule_id == "NE101"}
    assert found == {"layers.0.ln2": "error", "layers.1.ln2": "error"}
    config.write_text(json.dumps({"rms_norm_eps": 1e-5, "layer_norm_eps": 1e-6}))
    assert [f.rule_id for f in audit(exported, config=str(config)).findings] == []
