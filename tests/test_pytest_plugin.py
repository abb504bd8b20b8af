"""The opt-in pytest plugin (normaudit/pytest_plugin.py): off unless enabled, one item per target of
``[tool.normaudit]``, failing with concise lines."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]

CLEAN = '''import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))


def example_inputs():
    return (torch.randn(2, 8),)
'''
BUGGY = CLEAN.replace("nn.LayerNorm(8))", "nn.LayerNorm(8, eps=0.0))")
BROKEN = 'raise RuntimeError("boom")\n'
SETTINGS = '[tool.normaudit]\ntargets = ["clean.py", "buggy.py", {path = "broken.py"}]\nselect = ["NE"]\n'


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """Three targets (clean, one error, an import error) and one ordinary test."""
    pytester.makefile(".py", clean=CLEAN, buggy=BUGGY, broken=BROKEN)
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    pytester.makefile(".toml", pyproject=SETTINGS)
    return pytester


def _entry_point_site(tmp: Path) -> Path:
    """A directory holding a distribution whose entry points are those pyproject.toml declares for pytest,
    so a subprocess loads the plugin the way an installed normaudit would."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    dist = tmp / "site" / "normaudit_plugin_probe-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: normaudit-plugin-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()))
    return tmp / "site"


def _collected(project: pytest.Pytester, site: Path, *args: str) -> list[str]:
    """Node ids a pytest run in ``project`` collects, with ``site`` (the plugin's entry point) importable."""
    project.syspathinsert(site)
    project._monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    result = project.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    return [ln for ln in result.stdout.lines if "::" in ln]


def test_installed_plugin_is_off_unless_enabled(project, tmp_path):
    site = _entry_point_site(tmp_path)
    items = ["pyproject.toml::clean.py", "pyproject.toml::buggy.py", "pyproject.toml::broken.py"]
    assert _collected(project, site) == ["test_ok.py::test_ok"]
    assert _collected(project, site, "--normaudit") == ["test_ok.py::test_ok", *items]
    # -p with the module name, while the entry point also loads it: registered once, enabled
    assert _collected(project, site, "-p", "normaudit.pytest_plugin") == ["test_ok.py::test_ok", *items]
    assert _collected(project, site, "--normaudit", "-k", "buggy") == ["pyproject.toml::buggy.py"]


def test_ini_option_enables_it_unless_paths_are_given(project, tmp_path):
    site = _entry_point_site(tmp_path)
    project.makefile(".toml", pyproject=SETTINGS + "\n[tool.pytest.ini_options]\nnormaudit = true\n")
    assert _collected(project, site)[1:] == ["pyproject.toml::clean.py", "pyproject.toml::buggy.py",
                                             "pyproject.toml::broken.py"]
    assert _collected(project, site, "test_ok.py") == ["test_ok.py::test_ok"]


def test_items_fail_with_concise_lines(project):
    result = project.runpytest("-p", "normaudit.pytest_plugin", "-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "collected 4 items" in out  # the three targets count as collected tests
    failures = {ln.split(" - ")[0]: ln for ln in result.stdout.lines if ln.startswith("FAILED ")}
    assert sorted(failures) == ["FAILED pyproject.toml::broken.py", "FAILED pyproject.toml::buggy.py"]
    concise = [ln for ln in result.stdout.lines if ln.startswith("buggy.py:")]
    assert concise == ["buggy.py:6:1: NE103 [error] 1: LayerNorm uses eps=0.0: a constant row (or channel) has "
                       "variance 0, so it divides 0 by 0 and its output is NaN"]
    errors = [ln for ln in result.stdout.lines if ln.startswith("normaudit: error: ")]
    assert len(errors) == 1 and errors[0].startswith("normaudit: error: broken.py:1: ") and "boom" in errors[0]
    assert "Traceback" not in out and "normaudit/cli/" not in out


def test_no_settings_file_means_no_items(pytester):
    pytester.makepyfile(test_ok="def test_ok():\n    pass\n")
    result = pytester.runpytest("-p", "normaudit.pytest_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_plugin_module_imports_no_torch():
    """Loaded into every pytest run of an environment with normaudit installed: it must stay light."""
    import subprocess

    code = "import sys, normaudit.pytest_plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"
