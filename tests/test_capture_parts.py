"""Capture by parts when the whole forward cannot be captured, the norm modules no capture reached, and the
two capture crashes fixed at the root (unbacked sizes, a module registered under two parents)."""
from __future__ import annotations

import torch
from torch import nn

from conftest import audit_model, site


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.fc = nn.Linear(d, d)

    def forward(self, x, scale=None):
        return x + self.fc(self.norm(x))


class Untraceable(nn.Module):
    """Pre-LN blocks behind a top-level forward that reads its data: no graph of the whole model."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.emb = nn.Embedding(50, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(2)])
        self.final = nn.RMSNorm(d, eps=1e-5)

    def forward(self, ids):
        distinct = len(set(ids.flatten().tolist()))  # a data-dependent Python int
        x = self.emb(ids) * (distinct > 0)
        for b in self.blocks:
            x = b(x, scale=1.0)
        return self.final(x)


def test_parts_captured_alone_get_graph_facts(rules):
    report = audit_model(Untraceable(), (torch.randint(0, 50, (2, 8)),), rules=rules)
    cap = report.capture
    assert not cap.complete and cap.method == "parts"
    assert [(p.module, p.class_name, p.method, p.inputs, p.sites) for p in cap.parts] == [
        ("blocks.0", "Block", "export", ["arg0: float32[2, 8, 16]", "scale: float"], 1),
        ("blocks.1", "Block", "export", ["arg0: float32[2, 8, 16]", "scale: float"], 1),
        ("final", "RMSNorm", "symbolic_trace", ["arg0: float32[2, 8, 16]"], 1)]
    for path, kind, eps in (("blocks.0.norm", "LayerNorm", 1e-6), ("blocks.1.norm", "LayerNorm", 1e-6),
                            ("final", "RMSNorm", 1e-5)):
        s = site(report, path)
        assert (s.kind, s.detected_by, s.eps, s.normalized_axes) == (kind, "module", eps, ["feature"])
        assert s.captured_part == path.rsplit(".", 1)[0] if path != "final" else "final"
        assert s.formula is not None and s.formula.mean_subtracted is (kind == "LayerNorm")
    assert site(report, "blocks.0.norm").placement == "pre" and site(report, "blocks.0.norm").block == "blocks.0"
    assert [(b.path, b.class_name, b.norms) for b in report.model.blocks] == [
        ("blocks.0", "Block", {"norm": "pre"}), ("blocks.1", "Block", {"norm": "pre"})]
    assert cap.unaudited == []
    assert "NK101" not in {f.rule_id for f in report.findings}  # every norm lies in a captured part
    assert any("3 part(s) captured alone (blocks.0, blocks.1, final)" in n for n in report.notes)


class TwoTowers(nn.Module):
    """A text tower that runs and an image tower that the text-only forward never calls."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.text = Block(d)
        self.vision = nn.Sequential(nn.Linear(d, d), nn.LayerNorm(d))

    def forward(self, x, pixels=None):
        h = self.text(x)
        return h if pixels is None else (h, self.vision(pixels))


def test_norms_never_called_are_listed_unaudited(rules):
    report = audit_model(TwoTowers(), (torch.randn(2, 4, 8),), rules=rules)
    assert report.capture.complete
    assert [s.module for s in report.sites] == ["text.norm"]
    assert [(u.module, u.kind) for u in report.capture.unaudited] == [("vision.1", "LayerNorm")]
    assert report.capture.unaudited[0].reason.startswith("no norm computation of it in the captured graph")
    assert any(n.startswith("1 norm module(s) not audited") and n.endswith(": vision.1") for n in report.notes)


class DataDependentRows(nn.Module):
    """A norm over a data-dependent number of rows: export gives the size an unbacked symbol."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        h = self.proj(x)
        return self.norm(h[h.sum(-1) > 0])


def test_unbacked_sizes_do_not_crash(rules):
    report = audit_model(DataDependentRows(), (torch.randn(2, 4, 8),), rules=rules)
    assert report.capture.complete and report.capture.method == "export"
    s = site(report, "norm")
    assert (s.kind, s.eps, s.input_shape) == ("LayerNorm", 1e-5, None)


class SharedBlock(nn.Module):
    def __init__(self, d: int, shared: nn.Module):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pos = shared  # the same module under a second parent (timm coat's shared position encodings)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(self.pos(x)))


class SharedModel(nn.Module):
    def __init__(self, d: int = 8):
        super().__init__()
        self.pos = nn.Linear(d, d)
        self.blocks = nn.ModuleList([SharedBlock(d, self.pos) for _ in range(2)])
        self.final = nn.LayerNorm(d)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.final(x)


def test_module_under_two_parents_materialises_on_meta(rules):
    with torch.device("meta"):
        model = SharedModel()
    report = audit_model(model, (torch.randn(2, 4, 8),), rules=rules, on_meta=True)
    assert report.capture.complete
    assert [(s.module, s.placement) for s in report.sites] == [
        ("blocks.0.norm", "pre"), ("blocks.1.norm", "pre"), ("final", "final")]
