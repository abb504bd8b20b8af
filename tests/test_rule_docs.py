"""Rule docs generated from the rule files (normaudit/docs.py), ``normaudit rules --format json`` and
``--show-settings``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from normaudit.cli import main
from normaudit.docs import DOCS_DIR, RuleFile, default_locations, doc_path, generate, rule_page, shipped_rules, stale_pages
from normaudit.engine.loader import builtin_rules_dir
from normaudit.engine.schema import Rule

ROOT = Path(__file__).resolve().parents[1]


def test_committed_docs_are_current():
    """The committed docs/rules/ is what the rule files generate: after adding or editing a rule, run
    ``python -m normaudit docs``."""
    if builtin_rules_dir().name == "_rules":
        pytest.skip("an installed normaudit: docs/ is in the source checkout only")
    assert default_locations() == (None, ROOT / DOCS_DIR)
    stale = stale_pages(ROOT / DOCS_DIR, generate())
    assert stale == [], f"stale rule docs {stale}: run 'python -m normaudit docs'"


def test_every_shipped_rule_has_a_page_and_an_index_row():
    pages = generate()
    ids = [rf.rule.id for rf in shipped_rules()]
    assert sorted(pages) == sorted([f"{i}.md" for i in ids] + ["README.md"])
    index = pages["README.md"]
    assert index.startswith(f"# normaudit rules\n\n{len(ids)} rules, generated from")
    for rule_id in ids:
        assert f"| [{rule_id}]({rule_id}.md) |" in index


def test_page_of_one_rule(rules):
    rf = next(r for r in shipped_rules() if r.rule.id == "NE103")
    assert rf.relpath == "eps/NE103-eps-zero.yaml"
    page = rule_page(rf)
    assert page.startswith("# NE103 `eps-zero`\n\n| | |\n|---|---|\n| Category | `eps` |\n| Default severity | `error` |")
    assert "| Rule file | [`rules/eps/NE103-eps-zero.yaml`](../../rules/eps/NE103-eps-zero.yaml) |" in page
    sections = [ln for ln in page.splitlines() if ln.startswith("## ")]
    assert sections == ["## What it does", "## Why it matters", "## Example", "## Use instead", "## How to suppress",
                        "## References"]
    assert "```python\nself.norm = nn.LayerNorm(d, eps=0.0)\n" in page
    assert "`# normaudit: ignore[NE103]`" in page
    assert "[arXiv 1607.06450](https://arxiv.org/abs/1607.06450)" in page
    # a shell example (NB108's is a command line) is not fenced as Python
    nb108 = rule_page(next(r for r in shipped_rules() if r.rule.id == "NB108"))
    assert "```sh\nnormaudit model.py --probe batch" in nb108


def test_fences_and_links_survive_odd_text(rules):
    base = rules["NE103"].model_dump()
    base["doc"].update(example="s = '''\n```\n'''\n", references=["https://example.org/x", "Foo, arXiv:2002.04745v2"])
    page = rule_page(RuleFile(Rule.model_validate(base), "eps/x.yaml"))
    assert "````python\ns = '''\n```\n'''\n````" in page
    assert "- <https://example.org/x>\n- Foo, [arXiv 2002.04745](https://arxiv.org/abs/2002.04745)" in page


def test_docs_command_writes_and_checks(capsys, tmp_path):
    out = tmp_path / "rules-docs"
    assert main(["docs", "--check", "--output", str(out)]) == 1  # nothing there yet
    assert f"{out / 'NE101.md'}: stale (run normaudit docs)" in capsys.readouterr().err
    assert main(["docs", "--output", str(out)]) == 0
    n = len(shipped_rules()) + 1
    assert f"normaudit: {n} rule doc page(s) in {out}: {n} written\n" in capsys.readouterr().err  # fresh: written
    assert main(["docs", "--check", "--output", str(out)]) == 0
    (out / "NE101.md").write_text("edited\n")
    (out / "NX999.md").write_text("a removed rule\n")
    assert stale_pages(out, generate()) == ["NE101.md", "NX999.md"]
    assert main(["docs", "--output", str(out)]) == 0
    assert f"normaudit: {n} rule doc page(s) in {out}: 1 updated, 1 removed\n" in capsys.readouterr().err
    assert not (out / "NX999.md").exists()
    assert (out / "NE101.md").read_text() == generate()["NE101.md"]
    assert main(["docs", "--output", str(out)]) == 0
    assert f"normaudit: {n} rule doc page(s) in {out}: all up to date\n" in capsys.readouterr().err


def test_rules_format_json(capsys, tmp_path, rules):
    extra = tmp_path / "extra"
    extra.mkdir()
    data = rules["NE103"].model_dump()
    data.update(id="NZ901", name="my-rule")
    import yaml

    (extra / "NZ901.yaml").write_text(yaml.safe_dump(data))
    assert main(["rules", "--format", "json", "--rules", str(extra)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in doc] == sorted(rules) + ["NZ901"]
    ne103 = next(r for r in doc if r["id"] == "NE103")
    assert ne103 == {"id": "NE103", "name": "eps-zero", "category": "eps", "severity": "error", "confidence": "high",
                     "summary": "Flags a norm whose eps is 0 (or negative), and a hand-written norm that adds no eps "
                                "at all before its square root, or divides by an L2 norm with nothing added or clamped.",
                     "docs": "docs/rules/NE103.md"}
    assert doc_path("NE103") == ne103["docs"] and (ROOT / ne103["docs"]).is_file()
    assert doc[-1]["docs"] is None  # a user's rule has no page of ours
    assert main(["rules", "--format", "yaml"]) == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


def test_show_settings(capsys, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.normaudit]\nselect = ["NE", "NL"]\nfail-on = "warning"\n'
        'per-module-ignores = {"enc.*" = ["NE101"]}\ntargets = ["m.py", {path = "n.py", dtype = "bfloat16"}]\n')
    monkeypatch.chdir(tmp_path)
    assert main(["--show-settings", "--fail-on", "info", "--timeout", "30"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "# settings file: pyproject.toml ([tool.normaudit])"
    rows = {ln.split(" = ")[0].lstrip("# "): ln for ln in out[1:]}
    assert rows["select"].split() == ["select", "=", '["NE",', '"NL"]', "#", "pyproject.toml:5"]
    assert rows["fail-on"].split() == ["fail-on", "=", '"info"', "#", "--fail-on"]
    assert rows["per-module-ignores"].split("  #")[0].rstrip() == 'per-module-ignores = {"enc.*" = ["NE101"]}'
    assert rows["targets"].split("  #")[0].rstrip() == 'targets = ["m.py", {"path" = "n.py", "dtype" = "bfloat16"}]'
    assert rows["dtype"].split() == ["dtype", "=", '"float32"', "#", "default"]
    assert rows["timeout"].split() == ["timeout", "=", "30.0", "#", "--timeout"]
    assert rows["baseline"] == "# baseline = (not set)"
    assert main(["--show-settings", "--isolated"]) == 0
    assert capsys.readouterr().out.startswith("# settings file: none (defaults; flags override)\n")


def test_show_settings_lists_flags_that_are_no_settings_keys(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--show-settings", "--isolated", "--checkpoint", "w.safetensors", "--probe", "batch",
                 "--probe", "size", "--max-params", "1000", "-j", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split() for ln in out[-3:]] == [
        ["checkpoint", "=", '"w.safetensors"', "#", "--checkpoint", "(command", "line", "only)"],
        ["probe", "=", '["batch",', '"size"]', "#", "--probe", "(command", "line", "only)"],
        ["max-params", "=", "1000", "#", "--max-params", "(command", "line", "only)"]]
    assert ["jobs", "=", "2", "#", "--jobs"] in [ln.split() for ln in out]  # a settings key
    assert main(["--show-settings", "--isolated"]) == 0
    assert "command line only" not in capsys.readouterr().out


def test_docs_command_never_writes_into_an_installed_normaudit(capsys, tmp_path, monkeypatch):
    from normaudit.engine import loader

    installed = tmp_path / "site-packages" / "normaudit" / "_rules"
    monkeypatch.setattr(loader, "builtin_rules_dir", lambda: installed)
    monkeypatch.setattr("normaudit.docs.shipped_rules", lambda root=None: [])
    monkeypatch.chdir(tmp_path)  # no checkout here
    assert main(["docs"]) == 2
    assert capsys.readouterr().err.strip() == (
        "normaudit: error: normaudit is installed, not run from a source checkout, and the current directory holds "
        "no rules/ and docs/rules/: give --output DIR (and --from RULES_DIR)")
    assert not (tmp_path / "site-packages" / "normaudit" / "docs").exists()
    assert main(["docs", "--from", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == "normaudit: error: nowhere: rules directory not found"


def test_installed_normaudit_run_in_the_source_checkout_checks_its_docs(capsys, tmp_path, monkeypatch):
    """A non-editable install run in the checkout (the README's install): ``normaudit docs --check`` documents
    ./rules against ./docs/rules, instead of saying it is not run from a source checkout."""
    import shutil

    from normaudit.engine import loader

    monkeypatch.setattr(loader, "builtin_rules_dir", lambda: tmp_path / "site-packages" / "normaudit" / "_rules")
    checkout = tmp_path / "normaudit-src"
    shutil.copytree(ROOT / "rules", checkout / "rules")
    shutil.copytree(ROOT / DOCS_DIR, checkout / DOCS_DIR)
    monkeypatch.chdir(checkout)
    assert default_locations() == (checkout / "rules", checkout / DOCS_DIR)
    assert main(["docs", "--check"]) == 0
    assert capsys.readouterr().err == ""
    rule = next((checkout / "rules" / "eps").glob("NE103-*.yaml"))
    rule.write_text(rule.read_text().replace("why: >-", "why: >-\n    Edited.", 1))
    assert main(["docs", "--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{checkout / DOCS_DIR / 'NE103.md'}: stale (run normaudit docs)"]
    assert main(["docs"]) == 0
    assert "Edited." in (checkout / DOCS_DIR / "NE103.md").read_text()
    assert not (tmp_path / "site-packages").exists()
