"""The validation memo (normaudit.cache.ValidationMemo): ``rules``, ``explain`` and ``schema`` read rule files, settings files and the
report schema validated before from the cache directory, without pydantic, and never a stale answer: a rule
file or settings file edited (made invalid, or changed) is validated again."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from normaudit.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "cli"

#: Runs the CLI with pydantic (and torch) unimportable; prints which of them ended up imported.
NO_PYDANTIC = ("import sys; sys.modules['pydantic'] = None; sys.modules['torch'] = None; "
               "from normaudit.cli import main; rc = main(sys.argv[1:]); "
               "sys.stderr.write('\\nLOADED %s\\n' % sorted(m for m in ('simpleeval', "
               "'normaudit.engine.schema', 'normaudit.report', 'normaudit.settings_schema') if m in sys.modules)); "
               "raise SystemExit(rc)")


@pytest.fixture
def memo_env(tmp_path, monkeypatch) -> dict:
    """The cache on (conftest turns it off), in ``tmp_path/cache``; the project is ``tmp_path/proj``."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copytree(FIXTURES / "rules", proj / "testrules")
    monkeypatch.setenv("NORMAUDIT_NO_CACHE", "")
    monkeypatch.setenv("NORMAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(proj)
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_blocked(*argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_PYDANTIC, *argv], env=env, capture_output=True, text=True,
                          timeout=120)


def test_second_rules_explain_schema_import_no_pydantic_and_print_the_same(capsys, memo_env):
    (Path.cwd() / "normaudit.toml").write_text('rules = ["testrules"]\nfail-on = "warning"\n')
    first = {cmd: run(capsys, *cmd.split()) for cmd in ("rules", "rules --format json", "explain NZ001", "schema")}
    assert all(rc == 0 for rc, _, _ in first.values()), first
    assert "NZ001  test-layernorm" in first["rules"][1]
    for cmd, (_, out, _) in first.items():
        proc = run_blocked(*cmd.split(), env=memo_env)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == out, cmd
        assert proc.stderr.rstrip().endswith("LOADED []"), proc.stderr
    docs = {r["id"]: r["docs"] for r in json.loads(first["rules --format json"][1])}
    assert (docs["NZ001"], docs["NE101"]) == (None, "docs/rules/NE101.md")


def test_an_edited_rule_file_is_read_again(capsys, memo_env):
    rule = Path("testrules/NZ001-test-layernorm.yaml")
    assert run(capsys, "explain", "NZ001", "--rules", "testrules")[0] == 0
    rule.write_text(rule.read_text().replace("Fires on every LayerNorm (tests only).", "Fires on each LayerNorm."))
    rc, out, _ = run(capsys, "explain", "NZ001", "--rules", "testrules")
    assert rc == 0 and "## What it does\nFires on each LayerNorm.\n" in out
    rule.write_text(rule.read_text().replace("severity: error", "severity: fatal"))
    rc, out, err = run(capsys, "rules", "--rules", "testrules")
    assert (rc, out) == (2, "")
    assert err.startswith(f"normaudit: error: {rule}:6: rule field 'severity': Input should be 'error'"), err


def test_a_new_rule_file_is_listed(capsys, memo_env):
    assert "NZ003" not in run(capsys, "rules", "--rules", "testrules")[1]
    text = Path("testrules/NZ001-test-layernorm.yaml").read_text()
    Path("testrules/NZ003-copy.yaml").write_text(text.replace("NZ001", "NZ003").replace("test-layernorm", "copy"))
    rc, out, _ = run(capsys, "rules", "--rules", "testrules")
    assert rc == 0 and "NZ003  copy" in out


def test_a_settings_file_made_invalid_after_a_memo_is_still_an_error(capsys, memo_env):
    settings = Path("normaudit.toml")
    settings.write_text('rules = ["testrules"]\n')
    assert run(capsys, "rules")[0] == 0
    settings.write_text('rules = ["testrules"]\njobs = "two"\n')
    rc, out, err = run(capsys, "rules")
    assert (rc, out) == (2, "")
    assert err == "normaudit: error: normaudit.toml:2: 'jobs': Input should be a valid integer\n"
    settings.write_text('rules = ["testrules"]\n')  # valid again: the memo of the first run answers
    proc = run_blocked("rules", env=memo_env)
    assert proc.returncode == 0 and "NZ001  test-layernorm" in proc.stdout, proc.stderr


def test_cache_false_in_settings_keeps_no_memo(capsys, memo_env, tmp_path):
    Path("normaudit.toml").write_text('rules = ["testrules"]\ncache = false\n')
    assert run(capsys, "rules")[0] == 0
    assert not (tmp_path / "cache").exists()
    proc = run_blocked("rules", env=memo_env)
    assert proc.returncode == 3 and "import of pydantic halted" in proc.stderr, proc.stderr


def test_the_memo_key_changes_with_the_code_that_validates(monkeypatch, tmp_path):
    from normaudit import cache

    base = cache.validation_key("rules", [["a.yaml", "0" * 64]])
    assert base == cache.validation_key("rules", [["a.yaml", "0" * 64]])
    assert base != cache.validation_key("rules", [["a.yaml", "1" * 64]])
    assert base != cache.validation_key("settings", [["a.yaml", "0" * 64]])
    fingerprint = cache.library_fingerprint()
    assert [f for f, _, _ in fingerprint["pydantic"]][0].endswith("pydantic/__init__.py")
    with monkeypatch.context() as m:
        m.setattr(cache, "library_fingerprint", lambda: {**fingerprint, "pydantic": [["x", 1, 2]]})
        assert base != cache.validation_key("rules", [["a.yaml", "0" * 64]])  # pydantic upgraded
    with monkeypatch.context() as m:
        m.setattr(cache, "source_digest", lambda: "edited")
        assert base != cache.validation_key("rules", [["a.yaml", "0" * 64]])  # normaudit's source edited
    memo = cache.ValidationMemo(tmp_path / "c")
    assert memo.get(base) is None
    memo.put(base, [1, 2])
    assert memo.get(base) == [1, 2] and memo.get(base[::-1]) is None
    entry = next((tmp_path / "c" / "v1" / "valid").rglob("*.json"))
    entry.write_text("{not json")
    assert memo.get(base) is None


def test_schema_honours_cache_false_in_settings(capsys, memo_env, tmp_path):
    Path("normaudit.toml").write_text("cache = false\n")
    rc, out, _ = run(capsys, "schema")
    assert rc == 0 and "Report" in json.loads(out)["title"]
    assert not (tmp_path / "cache").exists()  # no memo written
    proc = run_blocked("schema", env=memo_env)  # and none read: the schema needs pydantic again
    assert proc.returncode == 3 and "import of pydantic halted" in proc.stderr, proc.stderr
    Path("normaudit.toml").write_text("fail-on = \"warning\"\n")  # the cache on: a second call needs no pydantic
    assert run(capsys, "schema")[1] == out
    proc = run_blocked("schema", env=memo_env)
    assert proc.returncode == 0 and proc.stdout == out and proc.stderr.rstrip().endswith("LOADED []"), proc.stderr
