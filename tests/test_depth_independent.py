"""Depth-independent capture (normaudit.capture.repeats): the report of the reduced capture
(each stack of identical blocks captured as four blocks, the facts carried over) is the report of the full
capture, apart from timing and capture-method fields, on every model of the suite: the fixtures, the
reference cases and the transformers tiny configs of test_hf_models (deepened so they have a stack).

A model without a stack never takes the fast path (``plan_repeats`` is None: the same code runs either way),
so only the models with one are audited twice. To make the fast path engage on the suite's shallow models,
stacks of five blocks count (``MIN_BLOCKS``) and the size probe's default node limit is 0 in both paths
(the size probe runs only on graphs the full capture keeps, see ``normaudit.pipeline.carry.reduced_context``).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from normaudit.audit import AuditOptions, build_report
from normaudit.capture import repeats
from normaudit.loaders import ModelUnderAudit, load_model

ROOT = Path(__file__).resolve().parent
MODEL_FILES = sorted(p for p in (ROOT / "fixtures").rglob("*.py")) + sorted((ROOT / "data" / "cases").glob("*/model.py"))


def comparable(report) -> dict:
    """The report's JSON without what differs by design: attempt timings, the graph's node count, seconds
    in notes."""
    d = report.model_dump(mode="json")
    d["capture"].pop("attempts", None)
    d["capture"].pop("num_nodes", None)
    d["notes"] = [re.sub(r"\d+\.\d+ s\b", "<t> s", n) for n in d["notes"]]
    return d


@pytest.fixture
def deep_enough(monkeypatch):
    from normaudit.probes import size

    monkeypatch.setattr(repeats, "MIN_BLOCKS", 5)
    monkeypatch.setattr(size, "SIZE_PROBE_MAX_NODES", 0)


@pytest.mark.usefixtures("deep_enough")
def test_every_suite_model_gives_the_full_report(rules, monkeypatch):
    monkeypatch.chdir(ROOT)
    checked, reduced = [], []
    for path in MODEL_FILES:
        try:
            mua = load_model(str(path))
        except Exception:  # noqa: BLE001 - a fixture of bad input: nothing to capture
            continue
        if repeats.plan_repeats(mua.model, mua.origins) is None:
            continue  # no stack: the fast path is never taken
        full = build_report(AuditOptions(target=str(path), repeats=False), load_model(str(path)), rules)
        fast = build_report(AuditOptions(target=str(path), repeats=True), load_model(str(path)), rules)
        assert comparable(fast) == comparable(full), path
        checked.append(path.name)
        if fast.capture.num_nodes < full.capture.num_nodes:
            reduced.append(path.name)
    print(f"stacks in {len(checked)} suite models, reduced capture kept in {len(reduced)}: {reduced}")
    assert checked, "no suite model has a stack of identical blocks"


def _hf(name: str, layers: int):
    transformers = pytest.importorskip("transformers")
    from test_hf_models import CASES

    cfg_name, model_name, kw, *_ = CASES[name]
    kw = dict(kw)
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if key in kw:
            kw[key] = layers
    cfg = getattr(transformers, cfg_name)(**kw)
    with torch.device("meta"):
        model = getattr(transformers, model_name)(cfg)
    return model


@pytest.mark.usefixtures("deep_enough")
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "t5", "vit"])
def test_transformers_tiny_configs_give_the_full_report(name, rules):
    model = _hf(name, 5)
    plan = repeats.plan_repeats(model, {})
    assert plan is not None and plan.stacks[0].kept == ["0", "1", "2", "4"] and plan.stacks[0].elided == ["3"]

    def make():
        return ModelUnderAudit(model=copy.deepcopy(model), inputs=None, on_meta=True, kind="python", origins={})

    full = build_report(AuditOptions(target=name, repeats=False), make(), rules)
    fast = build_report(AuditOptions(target=name, repeats=True), make(), rules)
    assert comparable(fast) == comparable(full)
    assert fast.capture.num_nodes < full.capture.num_nodes  # the reduced capture was kept, not the fallback
    assert "depth-independent" in next(a.method for a in fast.capture.attempts if a.ok)


class _Block(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=eps)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x))


class _Stack(nn.Module):
    def __init__(self, eps=(1e-5,) * 6, by_index: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(8, e) for e in eps)
        self.final = nn.LayerNorm(8)
        self.by_index = by_index

    def forward(self, x):
        if self.by_index:
            for i in range(len(self.blocks)):
                x = self.blocks[i](x)
        else:
            for blk in self.blocks:
                x = blk(x)
        return self.final(x)


def _audit(model: nn.Module, rules, repeats_on: bool):
    mua = ModelUnderAudit(model=copy.deepcopy(model), inputs=(torch.randn(2, 5, 8),), on_meta=False, kind="python",
                          origins={})
    return build_report(AuditOptions(target="stack", repeats=repeats_on), mua, rules)


def test_one_block_with_another_eps_is_no_stack():
    eps = (1e-5, 1e-5, 1e-5, 1e-5, 1e-3, 1e-5)
    assert repeats.find_stacks(_Stack(eps), {}) == []
    stacks = repeats.find_stacks(_Stack(), {})
    assert [(s.path, s.kept, s.rep, s.elided) for s in stacks] == [("blocks", ["0", "1", "2", "5"], "2", ["3", "4"])]


def test_tied_blocks_are_no_stack():
    model = _Stack()
    model.blocks[4].fc.weight = model.blocks[3].fc.weight
    assert repeats.find_stacks(model, {}) == []


@pytest.mark.usefixtures("deep_enough")
def test_stack_carried_over_exactly(rules):
    full, fast = _audit(_Stack(), rules, False), _audit(_Stack(), rules, True)
    assert comparable(fast) == comparable(full)
    assert [s.module for s in fast.sites] == [f"blocks.{i}.norm" for i in range(6)] + ["final"]
    assert [b.path for b in fast.model.blocks] == [f"blocks.{i}" for i in range(6)]
    assert fast.model.num_residual_adds == full.model.num_residual_adds == 6
    assert "blocks.3..4 carried over from blocks.2" in next(a.method for a in fast.capture.attempts if a.ok)


@pytest.mark.usefixtures("deep_enough")
def test_indexing_an_elided_block_falls_back_to_the_full_capture(rules):
    full, fast = _audit(_Stack(by_index=True), rules, False), _audit(_Stack(by_index=True), rules, True)
    assert comparable(fast) == comparable(full)
    assert fast.capture.num_nodes == full.capture.num_nodes
    assert not any("depth-independent" in a.method for a in fast.capture.attempts)


def test_full_graph_small_enough_for_the_size_probe_is_captured_whole(rules):
    report = _audit(_Stack(), rules, True)  # default limits: 6 tiny blocks, the size probe runs on the full graph
    assert not any("depth-independent" in a.method for a in report.capture.attempts)
    assert any(n.startswith("size probe: re-ran") for n in report.notes)


@pytest.mark.usefixtures("deep_enough")
def test_one_block_with_another_eps_is_flagged_alone(rules):
    eps = (1e-5,) * 5 + (1e-3,) + (1e-5,) * 2
    full, fast = _audit(_Stack(eps), rules, False), _audit(_Stack(eps), rules, True)
    assert comparable(fast) == comparable(full)
    assert [(f.rule_id, f.module) for f in fast.findings if f.rule_id.startswith("NE")] == [("NE102", "blocks.5.norm")]
    assert [s.eps for s in fast.sites] == [1e-5] * 5 + [1e-3] + [1e-5] * 3


@pytest.mark.usefixtures("deep_enough")
def test_rules_see_every_carried_block_as_its_own_site(rules):
    """Eight identical blocks built with eps=0, the depth-independent capture kept: every elided block's norm is
    a site the rules run on (the class of identical sites shares one evaluation, each gets its own finding)."""
    fast = _audit(_Stack((0.0,) * 8), rules, True)
    assert "blocks.3..6 carried over from blocks.2" in next(a.method for a in fast.capture.attempts if a.ok)
    assert comparable(fast) == comparable(_audit(_Stack((0.0,) * 8), rules, False))
    assert [f.module for f in fast.findings if f.rule_id == "NE103"] == [f"blocks.{i}.norm" for i in range(8)]


class _NumberedBlock(nn.Module):
    """A block whose forward reads its number: block 5 normalises with another eps (the signature, which
    leaves block numbers out, cannot see it)."""

    def __init__(self, d: int, layer_idx: int, read_always: bool):
        super().__init__()
        self.layer_idx, self.read_always = layer_idx, read_always
        self.weight = nn.Parameter(torch.ones(d))
        self.fc = nn.Linear(d, d)

    def forward(self, x, cache=None):
        eps = 1e-5
        if self.read_always or cache is not None:
            eps = 1e-3 if self.layer_idx == 5 else 1e-5
        return x + self.fc(torch.nn.functional.layer_norm(x, (x.shape[-1],), self.weight, None, eps))


class _NumberedStack(nn.Module):
    def __init__(self, read_always: bool):
        super().__init__()
        self.blocks = nn.ModuleList(_NumberedBlock(8, i, read_always) for i in range(8))

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


@pytest.mark.usefixtures("deep_enough")
def test_a_block_reading_its_number_is_captured_whole(rules):
    assert [s.path for s in repeats.find_stacks(_NumberedStack(True), {})] == ["blocks"]
    full, fast = _audit(_NumberedStack(True), rules, False), _audit(_NumberedStack(True), rules, True)
    assert not any("depth-independent" in a.method for a in fast.capture.attempts)
    assert comparable(fast) == comparable(full)
    assert [(f.rule_id, f.module) for f in fast.findings if f.rule_id.startswith("NE")] == [("NE102", "blocks.5")]


@pytest.mark.usefixtures("deep_enough")
def test_a_block_number_read_only_for_a_cache_keeps_the_reduced_capture(rules):
    full, fast = _audit(_NumberedStack(False), rules, False), _audit(_NumberedStack(False), rules, True)
    assert "blocks.3..6 carried over from blocks.2" in next(a.method for a in fast.capture.attempts if a.ok)
    assert comparable(fast) == comparable(full)
    assert [s.eps for s in fast.sites] == [1e-5] * 8


@pytest.mark.usefixtures("deep_enough")
def test_the_users_meta_model_is_left_on_meta_and_serves_as_the_probe_model(rules):
    """The depth-independent path captures a copy of its reduced model, so the user's meta model is no copy's
    source of fake tensors: it stays on meta and the formula probe reads it (no deep copy of the whole model)."""
    model = _hf("llama", 5)
    mua = ModelUnderAudit(model=model, inputs=None, on_meta=True, kind="python", origins={})
    report = build_report(AuditOptions(target="llama", repeats=True), mua, rules)
    assert "depth-independent" in next(a.method for a in report.capture.attempts if a.ok)
    assert all(p.is_meta for p in model.parameters()) and all(b.is_meta for b in model.buffers())
    assert all(s.formula is not None and s.formula.confirmed for s in report.sites)
