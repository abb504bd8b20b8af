"""Every rule file is complete and valid; the loader rejects bad files with file, line and field."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from normaudit.engine.loader import builtin_rules_dir, load_rule_file, load_rules
from normaudit.engine.evaluator import evaluate, fp_rounds_to_zero
from normaudit.errors import UsageError
from normaudit.report import ModelFacts, Site

RULE_FILES = sorted(builtin_rules_dir().rglob("*.yaml"))
FAMILY = {"layout": "L", "placement": "P", "eps": "E", "norm-type": "T", "batchnorm": "B", "numerics": "N",
          "checkpoint": "C", "capture": "K"}


def test_rules_are_found():
    assert len(RULE_FILES) >= 4


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rule_file_is_complete(path: Path):
    rule = load_rule_file(path)
    assert path.name == f"{rule.id}-{rule.name}.yaml"
    assert rule.id[1] == FAMILY[rule.category], "the id's family letter matches the category"
    for section in ("what", "why", "example", "use_instead"):
        assert len(getattr(rule.doc, section).strip()) >= 20, section
    assert rule.doc.references
    assert rule.fix.strip() and rule.message.strip()


def test_rule_ids_are_unique():
    rules = load_rules()
    assert len(rules) == len(RULE_FILES)


def test_bad_rule_file_names_file_line_and_field(tmp_path):
    bad = tmp_path / "NL999-bad.yaml"
    bad.write_text("id: NL999\nname: bad\ncategory: layout\nseverity: fatal\nwhen: 'True'\nmessage: m\nfix: f\n"
                   "doc: {what: w, why: y, example: e, use_instead: u, references: [r]}\n")
    with pytest.raises(UsageError) as info:
        load_rules([tmp_path])
    text = str(info.value)
    assert str(bad) in text or "NL999-bad.yaml" in text
    assert ":4:" in text and "severity" in text


def test_unknown_field_and_bad_expression_are_rejected(tmp_path):
    base = ("id: NL998\nname: ok-name\ncategory: layout\nseverity: info\nmessage: m\nfix: f\n"
            "doc: {what: w, why: y, example: e, use_instead: u, references: [r]}\n")
    (tmp_path / "a.yaml").write_text(base + "when: 'True'\nwehn: 'x'\n")
    with pytest.raises(UsageError, match="wehn"):
        load_rule_file(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text(base + "when: 'site.eps >'\n")
    with pytest.raises(UsageError, match="invalid expression"):
        load_rule_file(tmp_path / "b.yaml")


def test_user_rule_directory_adds_rules(tmp_path):
    (tmp_path / "NK950-any-rmsnorm.yaml").write_text(
        "id: NK950\nname: any-rmsnorm\ncategory: capture\nseverity: info\napplies_to: [RMSNorm]\n"
        "when: 'site.eps < params.limit'\nparams: {limit: 1.0e-5}\nmessage: 'eps {site.eps:g} is small'\nfix: f\n"
        "doc: {what: w, why: y, example: e, use_instead: u, references: [r]}\n")
    rules = load_rules([tmp_path])
    sites = [Site(module="a", kind="RMSNorm", class_name="X", detected_by="pattern", eps=1e-6),
             Site(module="b", kind="RMSNorm", class_name="X", detected_by="pattern", eps=1e-5),
             Site(module="c", kind="LayerNorm", class_name="Y", detected_by="module", eps=1e-6)]
    found = evaluate([rules["NK950"]], sites, ModelFacts(class_name="M"), {}, None, {})
    assert [(f.module, f.message) for f in found] == [("a", "eps 1e-06 is small")]


def test_fp_rounds_to_zero():
    assert fp_rounds_to_zero(1e-12, "float16") and not fp_rounds_to_zero(1e-7, "float16")
    assert not fp_rounds_to_zero(1e-12, "bfloat16") and not fp_rounds_to_zero(1e-12, "float32")


def test_installed_command_finds_shipped_rules(tmp_path):
    """Run from an unrelated directory: the installed package (wheel or editable) must find its rules."""
    proc = subprocess.run([sys.executable, "-m", "normaudit", "rules"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=_env_without_checkout())
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^NL101\s+stats-over-batch-or-sequence\s+layout\s+error", proc.stdout, re.M)
    explain = subprocess.run([sys.executable, "-m", "normaudit", "explain", "NE101"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, env=_env_without_checkout())
    assert explain.returncode == 0 and "## Why it matters" in explain.stdout and "1607.06450" in explain.stdout


def _env_without_checkout():
    import os

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def test_for_each_gives_one_finding_per_element(tmp_path):
    """A model-scope rule with ``for_each`` is evaluated once per element (``each``), each its own finding at
    ``module_expr``; an empty list gives none; ``for_each`` on a site rule is refused when loaded."""
    from normaudit.report import UnusedNorm

    head = ("id: NK951\nname: each-unused\ncategory: capture\nseverity: info\n{scope}for_each: 'model.unused_norms'\n"
            "when: 'each.kind == \"LayerNorm\"'\nmodule_expr: 'each.module'\nmessage: '{{each.module}} unused'\n"
            "fix: f\ndoc: {{what: w, why: y, example: e, use_instead: u, references: [r]}}\n")
    (tmp_path / "NK951-each-unused.yaml").write_text(head.format(scope="scope: model\n"))
    rule = load_rules([tmp_path])["NK951"]
    unused = [UnusedNorm(module=m, class_name=k, kind=k) for m, k in
              (("a.ln", "LayerNorm"), ("b.rms", "RMSNorm"), ("c.ln", "LayerNorm"))]
    found = evaluate([rule], [], ModelFacts(class_name="M", unused_norms=unused), {}, None, {})
    assert [(f.module, f.message) for f in found] == [("a.ln", "a.ln unused"), ("c.ln", "c.ln unused")]
    assert evaluate([rule], [], ModelFacts(class_name="M"), {}, None, {}) == []
    (tmp_path / "NK951-each-unused.yaml").write_text(head.format(scope=""))
    with pytest.raises(UsageError, match="for_each is for rules of scope model"):
        load_rules([tmp_path])
