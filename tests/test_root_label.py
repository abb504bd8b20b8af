"""The root module (module path "") has one name in every output format: ``(root)``.

An unused suppression (NK901) or another finding about the model as a whole has module "": text, concise and
github annotations called it ``<root>`` while markdown and SARIF said ``(root)``, so one finding had two names
(a stale ``# normaudit: ignore[NE101]`` comment gave ``models/half.py:22:1: NK901 [info] <root>: ...`` in
concise output and ``(root)`` in SARIF).
"""
from __future__ import annotations

import json

from normaudit.render import RenderOptions, concise, github, markdown, sarif, text
from normaudit.render.text import group_findings
from normaudit.report import ROOT_LABEL
from normaudit.report import Finding, SourceLocation
from test_render_formats import make_report, make_rules


def _root_finding_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = make_report(tmp_path)
    src = SourceLocation(file=str(tmp_path / "models" / "gpt.py"), line=22)
    report.findings = [Finding(rule_id="NK901", rule_name="unused-suppression", category="capture", severity="info",
                               module="", message="unused suppression '# normaudit: ignore[NE101]': NE101 matched "
                               "no finding", source=src)]
    report.summary.errors, report.summary.warnings, report.summary.infos = 0, 0, 1
    return report


def test_root_label_is_the_same_in_every_format(tmp_path, monkeypatch):
    report = _root_finding_report(tmp_path, monkeypatch)
    rules = make_rules()
    assert ROOT_LABEL == "(root)"
    assert [g.label for g in group_findings(report.findings)] == ["(root)"]
    assert concise.render(report, options=RenderOptions(quiet=True)).splitlines() == [
        "models/gpt.py:22:1: NK901 [info] (root): unused suppression '# normaudit: ignore[NE101]': NE101 matched "
        "no finding"]
    shown = text.render(report, options=RenderOptions(quiet=True))
    assert "  NK901 [capture] (root): unused suppression '# normaudit: ignore[NE101]'" in shown
    assert github.render(report, rules).splitlines() == [
        "::notice file=models/gpt.py,line=22,title=NK901 unused-suppression::unused suppression "
        "'# normaudit: ignore[NE101]': NE101 matched no finding"]
    assert "| `NK901` unused-suppression | (root) |" in markdown.render(report, rules)
    result = json.loads(sarif.render(report, rules))["runs"][0]["results"][0]
    assert result["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == "(root)"
    for out in (concise.render(report), shown, markdown.render(report, rules), sarif.render(report, rules)):
        assert "<root>" not in out
