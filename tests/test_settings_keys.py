"""The run keys of the settings file: ``jobs``, ``cache``, ``full-capture`` (and ``timeout``), each
reaching the run, each overridden by its flag, each shown by ``--show-settings`` with its source, and a wrong
type is exit 2 naming file:line."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from normaudit import runner
from normaudit.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "cli"


@pytest.fixture
def project(tmp_path: Path, monkeypatch) -> Path:
    """``tmp_path/proj`` (the current directory) holding the tiny model and the test rules; the user cache
    (``$XDG_CACHE_HOME``) in ``tmp_path/xdg``; the cache on (conftest turns it off)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(FIXTURES / "tiny.py", proj / "tiny.py")
    shutil.copytree(FIXTURES / "rules", proj / "testrules")
    monkeypatch.chdir(proj)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("NORMAUDIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("NORMAUDIT_NO_CACHE", "")
    return proj


@pytest.fixture
def seen(monkeypatch) -> dict:
    """What :func:`normaudit.runner.run_targets` is given by the command line (it still runs)."""
    record: dict = {}
    real = runner.run_targets

    def spy(plan_opts, rules, timeout, jobs=None, **kwargs):
        record.update(repeats=[o.repeats for o in plan_opts], jobs=jobs, timeout=timeout,
                      cache=None if kwargs.get("cache") is None else kwargs["cache"].root)
        return real(plan_opts, rules, timeout, jobs=jobs, **kwargs)

    monkeypatch.setattr(runner, "run_targets", spy)
    return record


def settings(body: str) -> None:
    Path("normaudit.toml").write_text('select = ["NZ"]\nrules = ["testrules"]\n' + body)


def audit(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["tiny.py", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def shown(capsys, *argv: str) -> dict[str, list[str]]:
    """``--show-settings`` rows by key, split on white space."""
    assert main(["--show-settings", *argv]) == 0
    return {ln.split(" = ")[0].lstrip("# "): ln.split() for ln in capsys.readouterr().out.splitlines()[1:]}


def test_jobs_from_the_file_and_the_flag_wins(capsys, project, seen):
    settings("jobs = 3\n")
    assert audit(capsys)[0] == 1 and seen["jobs"] == 3
    assert audit(capsys, "-j", "1")[0] == 1 and seen["jobs"] == 1
    assert shown(capsys)["jobs"] == ["jobs", "=", "3", "#", "normaudit.toml:3"]
    assert shown(capsys, "-j", "2")["jobs"] == ["jobs", "=", "2", "#", "--jobs"]
    assert shown(capsys, "--isolated")["jobs"] == ["jobs", "=", str(runner.default_jobs()), "#", "default"]


def test_timeout_from_the_file_and_the_flag_wins(capsys, project, seen):
    settings("timeout = 40\n")
    assert audit(capsys)[0] == 1 and seen["timeout"] == 40
    assert audit(capsys, "--timeout", "50")[0] == 1 and seen["timeout"] == 50
    assert shown(capsys)["timeout"] == ["timeout", "=", "40.0", "#", "normaudit.toml:3"]


def test_full_capture_from_the_file_and_the_flag_wins(capsys, project, seen):
    settings("")
    assert audit(capsys)[0] == 1 and seen["repeats"] == [True]
    assert audit(capsys, "--full-capture")[0] == 1 and seen["repeats"] == [False]
    settings("full-capture = true\n")
    assert audit(capsys)[0] == 1 and seen["repeats"] == [False]
    assert audit(capsys, "--no-full-capture")[0] == 1 and seen["repeats"] == [True]
    assert shown(capsys)["full-capture"] == ["full-capture", "=", "true", "#", "normaudit.toml:3"]
    assert shown(capsys, "--no-full-capture")["full-capture"] == ["full-capture", "=", "false", "#",
                                                                  "--no-full-capture"]
    assert shown(capsys, "--isolated")["full-capture"] == ["full-capture", "=", "false", "#", "default"]


def test_full_capture_gives_the_same_report(capsys, project):
    settings("cache = false\n")
    fast, full = audit(capsys, "--format", "json"), audit(capsys, "--format", "json", "--full-capture")
    assert fast[0] == full[0] == 1
    strip = [ln for ln in fast[1].splitlines() if '"seconds"' not in ln and "size probe" not in ln]
    assert strip == [ln for ln in full[1].splitlines() if '"seconds"' not in ln and "size probe" not in ln]


def test_cache_directory_from_the_file_and_no_cache_wins(capsys, project, seen, tmp_path, monkeypatch):
    settings('cache = "build/na-cache"\n')
    assert audit(capsys)[0] == 1 and seen["cache"] == project / "build" / "na-cache"
    assert list((project / "build" / "na-cache" / "v1").rglob("*.json"))  # the report was stored there
    assert shown(capsys)["cache"] == ["cache", "=", '"build/na-cache"', "#", "normaudit.toml:3"]
    assert audit(capsys, "--no-cache")[0] == 1 and seen["cache"] is None
    assert shown(capsys, "--no-cache")["cache"] == ["cache", "=", "false", "#", "--no-cache"]
    monkeypatch.setenv("NORMAUDIT_CACHE_DIR", str(tmp_path / "env-cache"))  # the environment wins over the file
    assert audit(capsys)[0] == 1 and seen["cache"] == tmp_path / "env-cache"
    assert shown(capsys)["cache"] == ["cache", "=", f'"{tmp_path / "env-cache"}"', "#", "$NORMAUDIT_CACHE_DIR"]


def test_cache_false_in_the_file_writes_no_cache(capsys, project, seen, tmp_path):
    settings("cache = false\n")
    assert audit(capsys)[0] == 1 and seen["cache"] is None
    assert not (tmp_path / "xdg").exists() and not (project / ".normaudit_cache").exists()
    assert shown(capsys)["cache"] == ["cache", "=", "false", "#", "normaudit.toml:3"]
    settings("")
    assert audit(capsys)[0] == 1 and seen["cache"] == project / ".normaudit_cache"
    assert shown(capsys)["cache"] == ["cache", "=", f'"{project / ".normaudit_cache"}"', "#", "default"]


@pytest.mark.parametrize("body, message", [
    ('jobs = "two"', "'jobs': Input should be a valid integer"),
    ("jobs = 0", "'jobs': Input should be greater than 0"),
    ("jobs = true", "'jobs': Input should be a valid integer"),
    ("jobs = 1.5", "'jobs': Input should be a valid integer"),
    ("cache = 3", "'cache': Value error, must be false, true or a directory (a string), got 3"),
    ('cache = ""', "'cache': Value error, an empty directory name: give a directory, or false to turn the cache off"),
    ('full-capture = "yes"', "'full-capture': Input should be a valid boolean"),
    ("full_capture = true", "unknown key 'full_capture' (did you mean 'full-capture'?)"),
    ("timeout = -1", "'timeout': Input should be greater than 0"),
])
def test_a_wrong_value_is_exit_2_naming_file_and_line(capsys, project, body, message):
    settings(body + "\n")
    rc, out, err = audit(capsys)
    assert (rc, out) == (2, "")
    assert err == f"normaudit: error: normaudit.toml:3: {message}\n"
