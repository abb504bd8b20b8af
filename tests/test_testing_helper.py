"""``normaudit.testing.assert_norms_ok``: the pytest helper over in-memory models."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from normaudit.errors import UsageError
from normaudit.report import Report
from normaudit.testing import assert_norms_ok

TEST_RULES = [str(Path(__file__).parent / "fixtures" / "cli" / "rules")]


class Block(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=eps)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, d: int = 8, eps: float = 1e-5):
        super().__init__()
        self.layers = nn.Sequential(Block(d, eps), Block(d, eps))

    def forward(self, x):
        return self.layers(x)


def test_a_clean_model_passes_and_returns_the_report():
    model = Net(eps=1e-12)
    report = assert_norms_ok(model, (torch.randn(2, 5, 8),), config={"layer_norm_eps": 1e-12}, select=["NE101"])
    assert isinstance(report, Report)
    assert [s.module for s in report.sites] == ["layers.0.norm", "layers.1.norm"]
    assert report.findings == []


def test_findings_raise_assertion_error_listing_them():
    with pytest.raises(AssertionError) as info:
        assert_norms_ok(Net(), torch.randn(2, 5, 8), config={"layer_norm_eps": 1e-12}, select=["NE101"])
    text = str(info.value)
    assert text.startswith("normaudit: 2 finding(s) at or above 'warning' in Net:")
    assert "NE101 error layers.0.norm:" in text and "NE101 error layers.1.norm:" in text
    assert "fix: " in text


def test_fail_on_select_ignore_and_rules():
    x = torch.randn(2, 5, 8)
    kw = dict(rules=TEST_RULES, select=["NZ"])
    with pytest.raises(AssertionError, match="NZ001 error layers.0.norm"):
        assert_norms_ok(Net(), x, **kw)
    report = assert_norms_ok(Net(), x, fail_on="never", **kw)
    assert sorted(f.module for f in report.findings) == ["layers.0.norm", "layers.1.norm"]
    assert assert_norms_ok(Net(), x, ignore=["NZ001"], **kw).findings == []
    assert assert_norms_ok(Net(), x, per_module_ignores={"layers.*": ["NZ001"]}, **kw).findings == []


def test_inputs_are_inferred_and_the_model_is_left_alone():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = assert_norms_ok(model, rules=TEST_RULES, select=["NZ"], fail_on="never")
    assert report.capture.inputs_assumed and [s.module for s in report.sites] == ["1"]
    assert model.training and all(p.device.type == "cpu" for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.a = nn.LayerNorm(8)  # normaudit: ignore[NZ001]
        self.b = nn.LayerNorm(8)

    def forward(self, x):
        return self.b(self.a(self.fc(x)))


def test_a_factory_gives_source_lines_and_honours_suppressions():
    report = assert_norms_ok(Pair, torch.randn(2, 8), rules=TEST_RULES, select=["NZ"], fail_on="never")
    line_b = Pair.__init__.__code__.co_firstlineno + 4
    assert [(f.module, f.source.line, f.source.file) for f in report.findings] == [("b", line_b, __file__)]
    assert "suppressed 1 finding(s): 1 by '# normaudit: ignore' comments" in report.notes


def test_bad_arguments():
    with pytest.raises(UsageError, match="unknown dtype"):
        assert_norms_ok(Net(), dtype="float8")
    with pytest.raises(UsageError, match="fail_on"):
        assert_norms_ok(Net(), fail_on="sometimes")
    with pytest.raises(TypeError):
        assert_norms_ok(Net(), example_inputs=3)
