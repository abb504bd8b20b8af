"""Every shipped rule against its fixtures, and every rule has a true positive and a true negative among them.

A fixture is a model file ``tests/fixtures/<folder>/<ID>_<n>.py`` named after the rule it was written for (a
rule's tests sit beside it under its id, as semgrep's do) with ``build_model()``, ``example_inputs()`` where
the inputs cannot be inferred, the other factories its cases name, ``make_checkpoint(model, path)`` where a
case audits a checkpoint, and ``EXPECT``: a list of cases. A case is one audit of the file and what one rule
must make of it; every key but ``rule`` and ``flagged`` is optional::

    EXPECT = [
        {"rule": "NE101",                      # the rule under test
         "flagged": {"norm": "error"},         # exactly the modules it flags, each with the severity of its one
                                               #   finding there (a list of severities: several findings)
         "not_flagged": ["layers.0.ln1"],      # true negatives: sites it does not flag (for a rule of model
                                               #   scope also a module holding sites, as a block or "" the model,
                                               #   or a module the capture left unaudited)
         # the audit (normaudit.options.AuditOptions)
         "factory": "build_post",              # the target is "<file>:<factory>" (without it: the file)
         "dtype": "float16", "probes": ["numerics"], "batch_size": 8,
         "config": "NE101_2.json",             # a file beside the fixture
         "checkpoint": "w.safetensors",        # written by make_checkpoint(build_model(), <tmp>/w.safetensors)
                                               #   after torch.manual_seed(0)
         "gguf": "m.gguf",                     # the target is <tmp>/m.gguf, written by make_gguf(<tmp>/m.gguf)
                                               #   (the fixture needs no build_model())
         "requires": ["transformers"],         # the case is skipped when one of these cannot be imported
         # what else the report must say
         "message_has": ["eps=1e-06"],         # substrings of the message of some finding of the rule
         "fix_has": ["construct RMSNorm"],     # ... of its fix
         "also_silent": ["NE102"],             # rules with no finding at all
         "silent": True,                       # no finding of any rule at warning or error
         "source": {"ln_f": "NP107_1.py:13"},  # the file name and line each finding on a module points at
         "model": {"placement": "pre"},        # fields of report.model
         "placement": {"norm": "final"},       # site.placement per module
         "axes": {"norm": ["feature"]},        # site.normalized_axes per module
         "input_axes": {...}, "channel_axes": {...},   # site.input_axes, site.channel_axes per module
         "capture": "export",                  # report.capture.method
         "keys": {"norm1": ["norm1.weight"]},  # site.weights.keys: the checkpoint keys mapped onto a site
         "gain_form": "weight"},               # every site's gain form (its formula's, else the checkpoint's)
    ]

Every finding of the rule is also checked to be of the rule's category (the folder of its file in rules/), to
carry a fix and to have no unfilled template ("{", "None") in its text; with a checkpoint or a GGUF file, every
module a rule of site scope flags is a site with checkpoint weights. Cases of one file with the same audit share one report.

The audit runs the rules :func:`audit_rules` names for the fixture's folder: a family's fixtures must not
depend on other families' rules, but layout and batchnorm share theirs (NL107's fixtures pin that NB102
stays silent on hand-written group norms, NB108's that NL106 does on a BatchNorm), a norm_type audit runs its
one rule, and a numerics audit every shipped rule (its ``silent`` cases say no rule at all warns).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import audit_file, family_rules, load_fixture_module, site
from normaudit.engine.loader import builtin_rules_dir, load_rules

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_NAME = re.compile(r"N[A-Z]\d{3}_\w+\.py")
FIXTURE_FILES = sorted(p for p in FIXTURES.glob("*/N*.py") if FIXTURE_NAME.fullmatch(p.name))
SEVERITIES = ("info", "warning", "error")
RANK = {s: i for i, s in enumerate(SEVERITIES)}
#: the keys that choose the audit (the rest say what the report must hold)
AUDIT_KEYS = ("factory", "config", "checkpoint", "dtype", "probes", "batch_size", "gguf")
CASE_KEYS = {"rule", "flagged", "not_flagged", "requires", "message_has", "fix_has", "also_silent", "silent",
             "source", "model", "placement", "axes", "input_axes", "channel_axes", "capture", "keys",
             "gain_form", *AUDIT_KEYS}


@functools.lru_cache(maxsize=None)
def shipped_rules() -> dict:
    """Every shipped rule by id (normaudit.engine.loader.load_rules), loaded once."""
    return load_rules()


@functools.lru_cache(maxsize=None)
def rule_folders() -> dict[str, str]:
    """``{rule id: its folder in rules/}`` (the folder is the rule's category)."""
    return {p.name.split("-")[0]: p.parent.name for p in builtin_rules_dir().glob("*/*.yaml")}


@functools.lru_cache(maxsize=None)
def _families(*names: str) -> dict:
    """The rules of the given folders of rules/, in the order of their file paths."""
    out: dict = {}
    for name in sorted(names):
        out.update(family_rules(name))
    return out


def audit_rules(folder: str, rule_id: str) -> dict:
    """The rules an audit of a fixture in ``tests/fixtures/<folder>`` runs for a case of ``rule_id`` (why they
    differ by folder: the module docstring)."""
    if folder in ("layout", "batchnorm"):
        return _families("batchnorm", "layout")
    if folder == "norm_type":
        return {rule_id: shipped_rules()[rule_id]}
    if folder == "numerics":
        return shipped_rules()
    return _families(folder)


@functools.lru_cache(maxsize=None)
def fixture_cases(path: Path) -> list[dict]:
    """The cases of one fixture file (its ``EXPECT``)."""
    expect = load_fixture_module(path).EXPECT
    assert isinstance(expect, list), f"{path.name}: EXPECT is a list of cases"
    return expect


def audit_fixture(path: Path, rules, tmp_path: Path, index: int = 0):
    """Audit fixture ``path`` as its case ``index`` says (with ``rules``); returns (report, case)."""
    case = fixture_cases(path)[index]
    for name in case.get("requires", []):
        pytest.importorskip(name)
    kwargs: dict[str, Any] = {k: case[k] for k in ("dtype", "probes", "batch_size") if k in case}
    if "config" in case:
        kwargs["config"] = str(path.parent / case["config"])
    if "checkpoint" in case:
        module = load_fixture_module(path)
        ckpt = tmp_path / case["checkpoint"]
        torch.manual_seed(0)
        module.make_checkpoint(module.build_model(), ckpt)
        kwargs["checkpoint"] = str(ckpt)
    target = f"{path}:{case['factory']}" if "factory" in case else path
    if "gguf" in case:
        target = tmp_path / case["gguf"]
        load_fixture_module(path).make_gguf(target)
    return audit_file(target, rules, **kwargs), case


_REPORTS: dict = {}


def fixture_report(path: Path, index: int, tmp_path: Path):
    """:func:`audit_fixture` with the rules of the fixture's folder, one report per file and audit (cached:
    the cases of one audit share it)."""
    case = fixture_cases(path)[index]
    rules = audit_rules(path.parent.name, case["rule"])
    key = (str(path), json.dumps({k: case.get(k) for k in AUDIT_KEYS}, sort_keys=True), tuple(rules))
    if key not in _REPORTS:
        _REPORTS[key] = audit_fixture(path, rules, tmp_path, index)[0]
    return _REPORTS[key], case


def _params():
    out = []
    for path in FIXTURE_FILES:
        cases = fixture_cases(path)
        for i, case in enumerate(cases):
            name = f"{path.parent.name}/{path.stem}" + (f"-{i}" if len(cases) > 1 else "")
            out.append(pytest.param(path, i, id=name))
    return out


def _severities(want) -> list[str]:
    return sorted([want] if isinstance(want, str) else want)


def _check_findings(report, case, got: dict[str, list]) -> None:
    """The rule flags exactly the modules of ``flagged``, with those severities, and says what the case
    says its findings say."""
    rule = case["rule"]
    assert {m: sorted(f.severity for f in fs) for m, fs in got.items()} == {
        m: _severities(want) for m, want in case["flagged"].items()}, [(f.module, f.message) for fs in got.values()
                                                                       for f in fs]
    findings = [f for fs in got.values() for f in fs]
    for text in case.get("message_has", []):
        assert any(text in f.message for f in findings), (text, [f.message for f in findings])
    for text in case.get("fix_has", []):
        assert any(text in (f.fix or "") for f in findings), (text, [f.fix for f in findings])
    for f in findings:
        assert f.category == rule_folders()[rule] and f.fix and "{" not in f.message + f.fix \
            and "None" not in f.message, (f.category, f.message, f.fix)
    for module, want in case.get("source", {}).items():
        for f in got[module]:
            assert f.source is not None and f"{Path(f.source.file).name}:{f.source.line}" == want, (module, f.source)
    if "checkpoint" in case or ("gguf" in case and shipped_rules()[rule].scope == "site"):
        for module in got:
            assert site(report, module).weights is not None, module
    for other in case.get("also_silent", []):
        assert not [f for f in report.findings if f.rule_id == other], other
    if case.get("silent"):
        assert [(f.rule_id, f.module, f.message) for f in report.findings if RANK[f.severity] >= 1] == []


def _known(report, module: str, scope: str) -> bool:
    """Whether ``module`` names something the report audited: a site; for a rule of model scope also a module
    holding a site (a block, a stack, "" the model) or one the capture left unaudited."""
    sites = {s.module for s in report.sites}
    if module in sites:
        return True
    if scope != "model":
        return False
    return any(module == "" or s.startswith(module + ".") for s in sites) or \
        module in {u.module for u in report.capture.unaudited}


def _check_negatives(report, case, got: dict[str, list]) -> None:
    scope = shipped_rules()[case["rule"]].scope
    for module in case.get("not_flagged", []):
        assert _known(report, module, scope), f"true negative {module!r} is not in the report: " \
            f"{sorted(s.module for s in report.sites)}"
        assert module not in got, (module, [f.message for f in got[module]])


def _check_facts(report, case) -> None:
    """The model facts, placements, axes, capture and checkpoint facts the case names."""
    for key, want in case.get("model", {}).items():
        assert getattr(report.model, key) == want, (key, report.model)
    for module, want in case.get("placement", {}).items():
        assert site(report, module).placement == want, (module, [(s.module, s.placement) for s in report.sites])
    for field, attr in (("axes", "normalized_axes"), ("input_axes", "input_axes"), ("channel_axes", "channel_axes")):
        for module, want in case.get(field, {}).items():
            assert getattr(site(report, module), attr) == want, (field, module)
    if "capture" in case:
        assert report.capture.method == case["capture"]
    for module, keys in case.get("keys", {}).items():
        assert site(report, module).weights.keys == keys, module
    if "gain_form" in case:
        for s in report.sites:
            form = s.gain_form
            assert form == case["gain_form"], (s.module, form)


@pytest.mark.parametrize("path,index", _params())
def test_rule_fixture(path, index, tmp_path):
    report, case = fixture_report(path, index, tmp_path)
    got: dict[str, list] = {}
    for f in report.findings:
        if f.rule_id == case["rule"]:
            got.setdefault(f.module, []).append(f)
    _check_findings(report, case, got)
    _check_negatives(report, case, got)
    _check_facts(report, case)


def test_every_case_is_well_formed():
    """Every case uses only the keys above, names shipped rules and severities that exist."""
    for path in FIXTURE_FILES:
        for i, case in enumerate(fixture_cases(path)):
            where = f"{path.parent.name}/{path.name} case {i}"
            assert set(case) <= CASE_KEYS, (where, sorted(set(case) - CASE_KEYS))
            assert case["rule"] in shipped_rules() and set(case.get("also_silent", [])) <= set(shipped_rules()), where
            assert all(s in SEVERITIES for want in case["flagged"].values() for s in _severities(want)), where


def test_every_rule_has_a_true_positive_and_a_true_negative():
    """A true positive: a case in which the rule flags a module; a true negative: one in which it flags
    nothing, or that names a module it must not flag."""
    positives, negatives = set(), set()
    for path in FIXTURE_FILES:
        for case in fixture_cases(path):
            if case["flagged"]:
                positives.add(case["rule"])
            if not case["flagged"] or case.get("not_flagged"):
                negatives.add(case["rule"])
    shipped = set(shipped_rules())
    assert shipped - positives == set(), "rules without a true-positive fixture"
    assert shipped - negatives == set(), "rules without a true-negative fixture"
