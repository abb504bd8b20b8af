"""Norm modules whose forward returns its input unchanged (``nn.LayerNorm`` monkeypatched to an identity class,
a hand-written norm left as ``return x``): the forward calls them and they normalise nothing, which the report
says (``model.identity_norms`` and a note), instead of calling them "never called" / "never applied" (NP107).
A norm the forward really never calls is still an unused norm."""
from __future__ import annotations

import textwrap

import pytest

from normaudit.audit import run_audit
from normaudit.engine.loader import load_rules
from normaudit.options import AuditOptions

PATCHED = textwrap.dedent("""
    import torch
    from torch import nn


    class Identity(nn.LayerNorm):
        def forward(self, x):
            return x


    nn.LayerNorm = Identity  # a test helper's "no norm" switch left on


    class Block(nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.norm = nn.LayerNorm(d)
            self.fc = nn.Linear(d, d)

        def forward(self, x):
            return x + self.fc(self.norm(x))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block()])
            self.final = nn.LayerNorm(16)
            self.spare = nn.LayerNorm(16)  # registered, never called

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.final(x)


    def build_model():
        return Net()


    def example_inputs():
        return (torch.randn(2, 5, 16),)
""")

HAND_WRITTEN = textwrap.dedent("""
    import torch
    from torch import nn


    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x  # TODO: normalise


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
            self.norm = RMSNorm(16)
            self.real = nn.LayerNorm(16)

        def forward(self, x):
            return self.real(self.norm(self.proj(x)))


    def build_model():
        return Net()


    def example_inputs():
        return (torch.randn(2, 5, 16),)
""")


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def _audit(tmp_path, source: str, rules):
    path = tmp_path / "model.py"
    path.write_text(source)
    return run_audit(AuditOptions(target=str(path)), rules)


def test_monkeypatched_identity_layernorm_is_called_and_computes_no_norm(tmp_path, rules, monkeypatch):
    from torch import nn

    monkeypatch.setattr(nn, "LayerNorm", nn.LayerNorm)  # the model file replaces it: put it back afterwards
    report = _audit(tmp_path, PATCHED, rules)
    assert report.model.identity_norms == ["blocks.0.norm", "blocks.1.norm", "final"]
    assert [u.module for u in report.model.unused_norms] == ["spare"]
    assert [u.module for u in report.capture.unaudited] == ["spare"]
    assert [(f.rule_id, f.module) for f in report.findings if f.rule_id == "NP107"] == [("NP107", "spare")]
    (np107,) = [f for f in report.findings if f.rule_id == "NP107"]
    assert "also never applied" not in np107.message
    assert ("3 norm module(s) called by the forward but compute no norm: the forward of their class (Identity) "
            "returns its input unchanged, so nothing is normalised (a norm class replaced by an identity, as when "
            "one is monkeypatched over nn.LayerNorm): blocks.0.norm, blocks.1.norm, final") in report.notes
    assert "1 norm module(s) registered but never applied by the forward: spare" in report.notes
    assert not any("never called" in n and "final" in n for n in report.notes), report.notes


def test_hand_written_norm_returning_its_input(tmp_path, rules):
    report = _audit(tmp_path, HAND_WRITTEN, rules)
    assert report.model.identity_norms == ["norm"]
    assert report.model.unused_norms == [] and report.capture.unaudited == []
    assert not [f for f in report.findings if f.rule_id == "NP107"]
    assert [s.module for s in report.sites] == ["real"]
    assert any(n.startswith("1 norm module(s) called by the forward but compute no norm: the forward of their "
                            "class (RMSNorm) returns its input unchanged") and n.endswith(": norm")
               for n in report.notes), report.notes
