"""NE103 on hand-written norms computed inside a larger module (q/k norms in an attention block's forward)
points at the line computing each statistic, not at the line constructing the module, so ``--add-noqa`` and
a reader land on the division; grouped output counts modules and findings apart."""
from __future__ import annotations


from normaudit.cli import main
from normaudit.render import concise
from normaudit.render.text import group_findings
from normaudit.report import Finding, SourceLocation
from tests.conftest import audit_file

MODEL = '''import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.g = nn.Parameter(torch.ones(d))

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        q = q / q.pow(2).mean(-1, keepdim=True).sqrt() * self.g
        k = k / k.pow(2).mean(-1, keepdim=True).sqrt() * self.g
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Attn() for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def build_model():
    return Net()


def example_inputs():
    return (torch.randn(2, 5, 16),)
'''


def test_ne103_points_at_each_statistic_of_a_hand_written_norm(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    report = audit_file(path, select=["NE103"])
    got = sorted((f.module, f.source.line) for f in report.findings if f.rule_id == "NE103")
    assert got == [("layers.0", 13), ("layers.0", 14), ("layers.1", 13), ("layers.1", 14), ("layers.2", 13),
                   ("layers.2", 14)]
    lines = concise.render(report).splitlines()
    assert [line.split(": NE103")[0] for line in lines[:2]] == [f"{path}:13:1", f"{path}:14:1"]
    assert all("layers.0-2 (3 modules): Attn adds no eps" in line for line in lines[:2])


def test_add_noqa_writes_on_the_statistic_lines(tmp_path, monkeypatch):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    assert main(["model.py", "--isolated", "--select", "NE103", "--add-noqa", "--no-cache"]) == 0
    changed = [line for line in path.read_text().splitlines() if "normaudit: ignore" in line]
    assert changed == [f"        {v} = {v} / {v}.pow(2).mean(-1, keepdim=True).sqrt() * self.g  # normaudit: ignore[NE103]"
                       for v in "qk"]


def _finding(module: str, line: int) -> Finding:
    return Finding(rule_id="NE103", rule_name="eps-zero", category="eps", severity="error", module=module,
                   message=f"{module} adds no eps", source=SourceLocation(file="m.py", line=line))


def test_group_counts_modules_and_findings_apart():
    two_per_module = [_finding(f"layers.{i}", 5) for i in range(3) for _ in range(2)]
    assert [g.count_label for g in group_findings(two_per_module)] == ["layers.0-2 (3 modules, 6 findings)"]
    one_per_module = [_finding(f"layers.{i}", 5) for i in range(3)]
    assert [g.count_label for g in group_findings(one_per_module)] == ["layers.0-2 (3 modules)"]
    assert [g.count_label for g in group_findings([_finding("attn", 5)] * 2)] == ["attn (2 findings)"]
