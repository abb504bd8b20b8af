"""SARIF ``helpUri``: a shipped rule links ``<base>/<ID>.md`` only where the base of the rule pages is known
(the ``docs-url`` setting, else a repository URL in the package metadata), and no rule has one otherwise;
the log stays valid against the SARIF 2.1.0 schema either way."""
from __future__ import annotations

import json
import shutil
from email.message import Message
from pathlib import Path

import pytest

from normaudit.cli import main
from normaudit.render import RenderOptions, sarif
from test_render_formats import make_report, make_rules
from test_sarif import github_upload_problems, schema_errors

FIXTURES = Path(__file__).parent / "fixtures" / "cli"
BASE = "https://example.org/normaudit/rules"


def _metadata_with(monkeypatch, *urls: str) -> None:
    """The installed normaudit's metadata as if its ``[project.urls]`` held ``urls`` (``"Label, url"``)."""
    from importlib import metadata

    real = metadata.metadata

    def fake(name: str):
        if name != "normaudit":
            return real(name)
        msg = Message()
        msg["Name"] = "normaudit"
        for url in urls:
            msg["Project-URL"] = url
        return msg

    monkeypatch.setattr(metadata, "metadata", fake)


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """``tmp_path/proj`` (the current directory, a git top level) holding the tiny model."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / ".git").mkdir()
    shutil.copy(FIXTURES / "tiny.py", proj / "tiny.py")
    monkeypatch.chdir(proj)
    return proj


def _descriptors(log: dict) -> dict[str, dict]:
    return {d["id"]: d for d in log["runs"][0]["tool"]["driver"]["rules"]}


def test_the_installed_metadata_names_no_repository():
    """normaudit's pyproject.toml has no ``[project.urls]`` today, so the default is no ``helpUri``; a
    repository entry added there turns the links on (and this test tells to update the next one)."""
    assert sarif.docs_base() is None


def test_sarif_from_the_cli_without_docs_url_has_no_help_uri(project, capsys):
    Path("normaudit.toml").write_text('select = ["NE", "NP"]\n')
    assert main(["tiny.py", "--format", "sarif", "-o", "out.sarif"]) == 0, capsys.readouterr().err
    log = json.loads(Path("out.sarif").read_text())
    assert schema_errors(log) == [] and github_upload_problems(log, project) == []
    rules = _descriptors(log)
    assert {"NE101", "NP101"} <= set(rules)
    assert [i for i, d in rules.items() if "helpUri" in d] == []
    assert rules["NE101"]["help"]["markdown"].startswith("## NE101 ")  # the page's text is still there


def test_sarif_from_the_cli_with_docs_url_links_each_shipped_rule(project, capsys):
    Path("normaudit.toml").write_text(f'select = ["NE", "NP"]\ndocs-url = "{BASE}"\n')
    assert main(["tiny.py", "--format", "sarif", "-o", "out.sarif"]) == 0, capsys.readouterr().err
    log = json.loads(Path("out.sarif").read_text())
    assert schema_errors(log) == [] and github_upload_problems(log, project) == []
    rules = _descriptors(log)
    assert rules["NE101"]["helpUri"] == "https://example.org/normaudit/rules/NE101.md"
    assert {i: d.get("helpUri") for i, d in rules.items()} == {i: f"{BASE}/{i}.md" for i in rules}
    shown = main(["--show-settings"])
    assert shown == 0
    assert f'docs-url = "{BASE}"' in capsys.readouterr().out


def test_docs_url_with_a_trailing_slash_and_a_test_rule_of_no_shipped_id(tmp_path, monkeypatch):
    """A trailing ``/`` is not doubled; NB201 and NX999 (rules of the tests, not shipped) get no link."""
    monkeypatch.chdir(tmp_path)
    options = RenderOptions(project_root=tmp_path, docs_url=BASE + "/")
    log = json.loads(sarif.render(make_report(tmp_path), make_rules(), options))
    assert schema_errors(log) == []
    rules = _descriptors(log)
    assert rules["NE101"]["helpUri"] == f"{BASE}/NE101.md"
    assert "helpUri" not in rules["NB201"] and "helpUri" not in rules["NX999"]


@pytest.mark.parametrize("value", ["example.org/rules", "ftp://example.org/rules", "https://", "https://x.org/a b",
                                   "https://x.org/r?ref=main", 3])
def test_a_docs_url_that_is_no_absolute_http_url_is_refused(project, capsys, value):
    Path("normaudit.toml").write_text('select = ["NE"]\n' + f"docs-url = {json.dumps(value)}\n")
    assert main(["tiny.py", "--format", "sarif", "-o", "out.sarif"]) == 2
    err = capsys.readouterr().err
    assert "normaudit.toml:2" in err and "docs-url" in err
    assert not Path("out.sarif").exists()


@pytest.mark.parametrize(("urls", "base"), [
    (["Source, https://github.com/org/normaudit"], "https://github.com/org/normaudit/blob/HEAD/docs/rules"),
    (["Homepage, https://org.example/", "Repository, https://github.com/org/normaudit.git/"],
     "https://github.com/org/normaudit/blob/HEAD/docs/rules"),
    (["Source Code, https://gitlab.com/group/sub/normaudit"],
     "https://gitlab.com/group/sub/normaudit/-/blob/HEAD/docs/rules"),
    # where a documentation site puts a rule's page is not known; a repository on an unknown host, a page
    # inside a repository and a plain http URL are not taken either
    (["Documentation, https://normaudit.readthedocs.io/"], None),
    (["Repository, https://git.example.org/org/normaudit"], None),
    (["Repository, https://github.com/org/normaudit/tree/dev"], None),
    (["Repository, http://github.com/org/normaudit"], None),
    ([], None),
])
def test_the_base_from_the_package_metadata(monkeypatch, urls, base):
    _metadata_with(monkeypatch, *urls)
    assert sarif.docs_base() == base
    assert sarif.docs_base(BASE) == BASE  # the setting wins


def test_a_repository_in_the_metadata_links_the_rule_pages_there(tmp_path, monkeypatch):
    _metadata_with(monkeypatch, "Repository, https://github.com/org/normaudit")
    monkeypatch.chdir(tmp_path)
    log = json.loads(sarif.render(make_report(tmp_path), make_rules(), RenderOptions(project_root=tmp_path)))
    assert schema_errors(log) == []
    assert _descriptors(log)["NE101"]["helpUri"] == "https://github.com/org/normaudit/blob/HEAD/docs/rules/NE101.md"


def test_information_uri_only_from_the_metadata(tmp_path, monkeypatch):
    """``tool.driver.informationUri`` is the metadata's home page, else its repository, else left out (never
    a page the project may not own)."""
    monkeypatch.chdir(tmp_path)

    def driver() -> dict:
        log = json.loads(sarif.render(make_report(tmp_path), make_rules(), RenderOptions(project_root=tmp_path)))
        assert schema_errors(log) == []
        return log["runs"][0]["tool"]["driver"]

    _metadata_with(monkeypatch)
    assert "informationUri" not in driver()
    _metadata_with(monkeypatch, "Repository, https://github.com/org/normaudit")
    assert driver()["informationUri"] == "https://github.com/org/normaudit"
    _metadata_with(monkeypatch, "Repository, https://github.com/org/normaudit", "Homepage, https://normaudit.org")
    assert driver()["informationUri"] == "https://normaudit.org"
