"""Rules evaluated once per class of sites equal in every fact the rule reads (normaudit.engine.evaluator):
the facts a rule reads (``site_reads``), and findings identical to evaluating every site alone."""
from __future__ import annotations

import ast

import pytest

from normaudit.engine import evaluator
from normaudit.engine.evaluator import evaluate, site_reads
from normaudit.engine.loader import load_rules
from normaudit.report import EpsFacts, ModelFacts, Site


def reads(*exprs: str) -> list[str]:
    """``site_reads`` of ``exprs`` written back as dotted paths, sorted (``<site>``: the whole site)."""
    out = []
    for chain in site_reads([ast.parse(e).body[0] for e in exprs]):
        parts = [f".{s[1]}" if s[0] == "attr" else f"[{s[1]!r}]" if s[0] == "item" else f".{s[1]}{s[2]!r}"
                 for s in chain]
        out.append("site" + "".join(parts) if chain else "<site>")
    return sorted(out)


def test_reads_follow_attributes_literal_subscripts_and_pure_calls():
    assert reads("site.formula.gain == 'weight' and site.eps > 0") == ["site.eps", "site.formula.gain"]
    assert reads("site.extra.get('skip', False)", "site.extra['k'] or site.describe()") == [
        "site.describe()", "site.extra.get('skip', False)", "site.extra['k']"]
    assert reads("site.input_shape[-1] > 1") == ["site.input_shape[-1]"]


def test_reads_stop_at_what_is_not_a_literal_path():
    assert reads("site.extra[key]") == ["site.extra"]  # the key is a name: the whole dict is read
    assert reads("site.module.rpartition('.')[2]") == ["site.module"]  # a method of the value read
    assert reads("site.formula", "site.formula.gain") == ["site.formula"]  # the whole covers its parts


@pytest.mark.parametrize("expr", ["len(site)", "any(s is site for s in sites)", "[site for site in sites]",
                                  "site.formula is sites[0].formula", "site.extra.pop('k')"])
def test_any_other_use_reads_the_whole_site_or_the_value_it_calls(expr):
    got = reads(expr)
    assert got == (["site.extra"] if "pop" in expr else ["<site>"])


def _stack(n: int, odd: int, odd_eps: float) -> list[Site]:
    """``n`` RMSNorm sites of identical blocks (module path apart), block ``odd`` built with ``odd_eps``."""
    sites = []
    for i in range(n):
        eps = odd_eps if i == odd else 1e-6
        sites.append(Site(module=f"layers.{i}.norm", kind="RMSNorm", class_name="RMSNorm", detected_by="module",
                          eps=eps, block=f"layers.{i}", normalized_axes=["feature"],
                          eps_facts=EpsFacts(effective=eps, peers=n, peer_eps=1e-6, peer_count=n - 1,
                                             role="constructed at model.py:5")))
    return sites


#: the options an audit gives the rules (normaudit.audit._build_report)
OPTIONS = {"dtype": "float32", "batch_size": 1, "checkpoint": False, "capture_method": "export", "train_error": None,
           "capture_error": None, "probes": [], "config_origin": None, "library_model": False}


def _per_site(monkeypatch) -> None:
    """Make every rule read the whole site: each site its own class (the evaluation site by site)."""
    monkeypatch.setattr(evaluator, "_COMPILED", {})
    monkeypatch.setattr(evaluator, "site_reads", lambda nodes: ((),))


def test_eighty_identical_sites_run_each_rule_once_per_class_and_flag_the_odd_one(monkeypatch):
    rules = load_rules([])
    active = list(rules.values())
    sites = _stack(80, odd=5, odd_eps=1e-3)
    runs = []
    real_run = evaluator._run
    monkeypatch.setattr(evaluator, "_run", lambda c, names: runs.append((c.rule.id, names["site"])) or real_run(c, names))
    monkeypatch.setattr(evaluator, "_COMPILED", {})
    found = evaluate(active, sites, ModelFacts(class_name="M"), {}, None, OPTIONS)
    assert [(f.rule_id, f.module) for f in found] == [("NE102", "layers.5.norm")]
    assert "eps=0.001, but 79 of the 80 RMSNorm sites" in found[0].message
    ne102 = [s.module for rid, s in runs if rid == "NE102"]
    assert ne102 == ["layers.0.norm", "layers.5.norm"]  # the 79 alike share one run, the odd one its own
    assert len(runs) < 3 * len(active)
    _per_site(monkeypatch)
    runs.clear()
    alone = evaluate(active, sites, ModelFacts(class_name="M"), {}, None, OPTIONS)
    assert [f.model_dump() for f in alone] == [f.model_dump() for f in found]
    assert len([1 for rid, _ in runs if rid == "NE102"]) == 80


def test_messages_name_each_member_of_a_class(tmp_path, monkeypatch):
    (tmp_path / "NK951-name.yaml").write_text(
        "id: NK951\nname: small-eps\ncategory: capture\nseverity: info\napplies_to: [RMSNorm]\n"
        "let: {e: 'site.eps'}\nwhen: 'e < 1e-5'\nmessage: '{site.module} in {site.block}: eps {e:g}'\nfix: f\n"
        "doc: {what: w, why: y, example: e, use_instead: u, references: [r]}\n")
    rule = load_rules([tmp_path])["NK951"]
    monkeypatch.setattr(evaluator, "_COMPILED", {})
    found = evaluate([rule], _stack(4, odd=2, odd_eps=1e-3), ModelFacts(class_name="M"), {}, None, {})
    assert [f.message for f in found] == ["layers.0.norm in layers.0: eps 1e-06", "layers.1.norm in layers.1: eps 1e-06",
                                          "layers.3.norm in layers.3: eps 1e-06"]


def test_a_rule_reading_the_module_path_runs_on_every_site(tmp_path, monkeypatch):
    (tmp_path / "NK952-path.yaml").write_text(
        "id: NK952\nname: layer-three\ncategory: capture\nseverity: info\napplies_to: [RMSNorm]\n"
        "when: \"site.module.startswith('layers.3')\"\nmessage: '{site.module}'\nfix: f\n"
        "doc: {what: w, why: y, example: e, use_instead: u, references: [r]}\n")
    rule = load_rules([tmp_path])["NK952"]
    monkeypatch.setattr(evaluator, "_COMPILED", {})
    found = evaluate([rule], _stack(6, odd=0, odd_eps=1e-6), ModelFacts(class_name="M"), {}, None, {})
    assert [f.module for f in found] == ["layers.3.norm"]


def test_a_failing_rule_names_the_first_site_it_fails_on(tmp_path, monkeypatch):
    (tmp_path / "NK953-fails.yaml").write_text(
        "id: NK953\nname: fails\ncategory: capture\nseverity: info\napplies_to: [RMSNorm]\n"
        "when: '1 / (site.eps - 1e-3) > 0'\nmessage: m\nfix: f\n"
        "doc: {what: w, why: y, example: e, use_instead: u, references: [r]}\n")
    rule = load_rules([tmp_path])["NK953"]
    monkeypatch.setattr(evaluator, "_COMPILED", {})
    with pytest.raises(evaluator.RuleError, match=r"NK953 failed on layers\.4\.norm: ZeroDivisionError"):
        evaluate([rule], _stack(8, odd=4, odd_eps=1e-3), ModelFacts(class_name="M"), {}, None, {})
