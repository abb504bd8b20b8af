"""NC110: a BatchNorm whose checkpoint ``running_var`` has channels with ``running_var + eps <= 0`` is an error
naming the tensor and the channels (in eval mode ``sqrt(running_var + eps)`` is NaN or 0 there), both for a
model audited with ``--checkpoint`` (the model's own eps) and for a checkpoint alone (PyTorch's default eps
1e-5). True positives and true negatives with exact tensor names and channels."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from normaudit.audit import run_audit
from normaudit.engine.loader import load_rules
from normaudit.options import AuditOptions

RESNET = textwrap.dedent("""
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c, eps=EPS)

        def forward(self, x):
            return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(8)
            self.layer1 = nn.Sequential(Block(8), Block(8))
            self.head = nn.Linear(8, 10)

        def forward(self, x):
            x = torch.relu(self.bn(self.stem(x)))
            return self.head(self.layer1(x).mean((2, 3)))


    def build_model():
        return ResNet()


    def example_inputs():
        return (torch.randn(2, 3, 16, 16),)
""")
BN_KEYS = ["bn", "layer1.0.bn1", "layer1.0.bn2", "layer1.1.bn1", "layer1.1.bn2"]
TAIL = ("in eval mode this BatchNorm divides by sqrt(running_var + eps), which is NaN (or 0) for those channels, "
        "and every output of them is NaN or inf")


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def _trained_state(eps_of_bn2: float = 1e-5) -> dict[str, torch.Tensor]:
    """The ResNet's state_dict with trained-looking running statistics (positive variances)."""
    torch.manual_seed(0)
    sd = {}
    for m in BN_KEYS:
        sd.update({f"{m}.weight": torch.rand(8) + 0.5, f"{m}.bias": torch.randn(8) * 0.1,
                   f"{m}.running_mean": torch.randn(8) * 0.1, f"{m}.running_var": torch.rand(8) + 0.5,
                   f"{m}.num_batches_tracked": torch.tensor(1000)})
    sd["stem.weight"] = torch.randn(8, 3, 3, 3)
    for b in ("layer1.0", "layer1.1"):
        sd[f"{b}.conv1.weight"] = torch.randn(8, 8, 3, 3)
        sd[f"{b}.conv2.weight"] = torch.randn(8, 8, 3, 3)
    sd["head.weight"], sd["head.bias"] = torch.randn(10, 8), torch.zeros(10)
    return sd


def _audit(tmp_path: Path, rules, sd: dict, with_model: bool, eps: float = 1e-5):
    ckpt = tmp_path / "bad.pt"
    torch.save(sd, ckpt)
    if not with_model:
        return run_audit(AuditOptions(target=str(ckpt)), rules)
    model = tmp_path / "resnet.py"
    model.write_text(RESNET.replace("EPS", repr(eps)))
    return run_audit(AuditOptions(target=str(model), checkpoint=str(ckpt)), rules)


def _nc110(report) -> dict[str, str]:
    return {f.module: f.message for f in report.findings if f.rule_id == "NC110"}


@pytest.mark.parametrize("with_model", [True, False], ids=["resnet.py --checkpoint", "checkpoint alone"])
def test_one_negative_channel_is_an_error_naming_tensor_and_channel(tmp_path, rules, with_model):
    sd = _trained_state()
    sd["layer1.0.bn2.running_var"][3] = -0.3
    report = _audit(tmp_path, rules, sd, with_model)
    origin = "" if with_model else ", the PyTorch default: without model code its own eps is unknown"
    assert _nc110(report) == {"layer1.0.bn2": (
        "the checkpoint's running variance layer1.0.bn2.running_var has running_var + eps <= 0 (eps 1e-05"
        f"{origin}) in channel(s) 3 (1 of 8 channels; smallest value -0.3): {TAIL}")}
    (finding,) = [f for f in report.findings if f.rule_id == "NC110"]
    assert finding.severity == "error"
    w = next(s for s in report.sites if s.module == "layer1.0.bn2").weights
    assert (w.running_var_key, w.running_var_invalid, w.running_var_eps) == ("layer1.0.bn2.running_var", [3], 1e-5)


@pytest.mark.parametrize("with_model", [True, False], ids=["resnet.py --checkpoint", "checkpoint alone"])
def test_every_channel_negative_and_eps_cancelling_the_variance(tmp_path, rules, with_model):
    """All of bn's at -1; one of layer1.1.bn1 at exactly -eps (running_var + eps is 0: a division by zero)."""
    sd = _trained_state()
    sd["bn.running_var"] = -torch.ones(8)
    sd["layer1.1.bn1.running_var"][6] = -1e-5
    found = _nc110(_audit(tmp_path, rules, sd, with_model))
    assert sorted(found) == ["bn", "layer1.1.bn1"]
    assert "bn.running_var has running_var + eps <= 0" in found["bn"]
    assert "in channel(s) 0, 1, 2, 3, 4, 5, 6, 7 (8 of 8 channels; smallest value -1)" in found["bn"]
    assert "layer1.1.bn1.running_var" in found["layer1.1.bn1"]
    assert "in channel(s) 6 (1 of 8 channels; smallest value -1e-05)" in found["layer1.1.bn1"]


@pytest.mark.parametrize("with_model", [True, False], ids=["resnet.py --checkpoint", "checkpoint alone"])
def test_positive_zero_and_tiny_negative_variances_are_not_flagged(tmp_path, rules, with_model):
    """True negatives: trained positive variances, a dead channel at 0 (sqrt(eps): finite), a tiny negative
    rounding residue above -eps, and NaN (NC103's, not this rule's)."""
    sd = _trained_state()
    sd["layer1.0.bn1.running_var"][0] = 0.0
    sd["layer1.0.bn1.running_var"][1] = -1e-7
    sd["layer1.1.bn2.running_var"][2] = float("nan")
    report = _audit(tmp_path, rules, sd, with_model)
    assert _nc110(report) == {}
    assert [f.module for f in report.findings if f.rule_id == "NC103"] == ["layer1.1.bn2"]


def test_the_models_own_eps_decides(tmp_path, rules):
    """With the model, its eps (0.5 for every bn2) is the one added: -0.3 + 0.5 > 0 is no error there, while
    the checkpoint alone, checked with PyTorch's 1e-5, is."""
    sd = _trained_state()
    sd["layer1.0.bn2.running_var"][3] = -0.3
    assert _nc110(_audit(tmp_path, rules, sd, with_model=True, eps=0.5)) == {}
    sd["layer1.0.bn2.running_var"][4] = -0.7
    found = _nc110(_audit(tmp_path, rules, sd, with_model=True, eps=0.5))
    assert list(found) == ["layer1.0.bn2"] and "(eps 0.5) in channel(s) 4 (1 of 8 channels; smallest value -0.7)" \
        in found["layer1.0.bn2"]
    assert "channel(s) 3, 4 (2 of 8" in _nc110(_audit(tmp_path, rules, sd, with_model=False))["layer1.0.bn2"]


def test_through_the_command_line(tmp_path, capsys, monkeypatch):
    """``normaudit resnet.py --checkpoint bad.pt`` and ``normaudit bn.pt``: exit 1, the error in the report."""
    import json

    from normaudit.cli import main

    monkeypatch.chdir(tmp_path)
    sd = _trained_state()
    sd["layer1.0.bn2.running_var"][3] = -0.3
    torch.save(sd, tmp_path / "bad.pt")
    (tmp_path / "resnet.py").write_text(RESNET.replace("EPS", "1e-05"))
    torch.save({"bn.weight": torch.ones(4), "bn.bias": torch.zeros(4), "bn.running_mean": torch.zeros(4),
                "bn.running_var": -torch.ones(4), "bn.num_batches_tracked": torch.tensor(10)}, tmp_path / "bn.pt")
    for argv, module, key, channels in ((["resnet.py", "--checkpoint", "bad.pt"], "layer1.0.bn2",
                                         "layer1.0.bn2.running_var", "3 (1 of 8"),
                                        (["bn.pt"], "bn", "bn.running_var", "0, 1, 2, 3 (4 of 4")):
        rc = main([*argv, "--format", "json", "--isolated", "--no-cache"])
        report = json.loads(capsys.readouterr().out)
        (finding,) = [f for f in report["findings"] if f["rule_id"] == "NC110"]
        assert (rc, finding["module"], finding["severity"]) == (1, module, "error")
        assert f"running variance {key} has running_var + eps <= 0" in finding["message"]
        assert f"in channel(s) {channels} channels" in finding["message"]
