"""Shared test helpers: audit a model file or an in-memory model and get the pydantic Report."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest
from torch import nn

from normaudit.audit import AuditOptions, build_report, run_audit
from normaudit.engine.loader import load_rules
from normaudit.loaders import ModelUnderAudit

ROOT = Path(__file__).resolve().parents[1]
#: The reference cases (real public bug reports), copied from ``../shared/cases`` so the suite runs in a
#: clone without ``../shared`` beside it; ``test_cases.py`` checks the copy is current when it is there.
CASES = ROOT / "tests" / "data" / "cases"
SHARED_CASES = ROOT.parent / "shared" / "cases"


@pytest.fixture(autouse=True)
def _no_result_cache(monkeypatch):
    """The command line's result cache (normaudit.cache) is off in tests: a test that patches normaudit
    in-process must not get the report of an earlier test; tests/test_cache.py turns it on."""
    monkeypatch.setenv("NORMAUDIT_NO_CACHE", "1")


@pytest.fixture(scope="session")
def rules():
    return load_rules()


def audit_file(path: Path | str, rules=None, **kwargs: Any):
    """Audit a model file in-process (paths in kwargs are taken as given)."""
    return run_audit(AuditOptions(target=str(path), **kwargs), rules)


def audit_model(model, inputs=None, rules=None, on_meta: bool = False, **kwargs: Any):
    """Audit an in-memory model."""
    opts = AuditOptions(target=type(model).__name__, **kwargs)
    return build_report(opts, ModelUnderAudit(model=model, inputs=inputs, on_meta=on_meta, kind="python"),
                        rules if rules is not None else load_rules())


def site(report, module: str, call_index: int = 0):
    """The site of ``module`` (KeyError naming the modules found when absent)."""
    for s in report.sites:
        if s.module == module and s.call_index == call_index:
            return s
    raise KeyError(f"no site {module!r}; sites: {[s.module for s in report.sites]}")


def flagged(report, rule_id: Optional[str] = None, category: Optional[str] = None, min_severity: str = "info"):
    """Module paths with a finding of ``rule_id``/``category`` at or above ``min_severity``."""
    rank = {"info": 0, "warning": 1, "error": 2}
    return sorted({f.module for f in report.findings
                   if (rule_id is None or f.rule_id == rule_id) and (category is None or f.category == category)
                   and rank[f.severity] >= rank[min_severity]})


def loud(report):
    """Findings at warning or error."""
    return [(f.rule_id, f.module, f.message) for f in report.findings if f.severity in ("warning", "error")]


def family_rules(family: str) -> dict:
    """Only the shipped rules of one family folder (``rules/<family>/``), by id: tests of a family must not
    depend on other families' rules."""
    from normaudit.engine.loader import builtin_rules_dir, load_rule_file

    rules = [load_rule_file(p) for p in sorted((builtin_rules_dir() / family).glob("*.yaml"))]
    return {r.id: r for r in rules}


def load_fixture_module(path: Path):
    """Import a fixture file as a module (its folder on sys.path meanwhile, for sibling imports)."""
    import importlib.util
    import sys

    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"{path.parent.name}_fixture_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))


requires_cases = pytest.mark.skipif(not CASES.is_dir(), reason="tests/data/cases not found")


class _Block(nn.Module):
    """A pre-LN residual block ``x + fc(norm(x))`` (LayerNorm eps 1e-6) for the capture tests' small models;
    reports name its class ``_Block``."""

    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.norm(x))


def pytest_addoption(parser):
    parser.addoption("--dump-reports", metavar="DIR", default=None,
                     help="write every report the suite builds to DIR as <test id>__<hash>.json, checkout paths "
                          "as <repo>: benchmarks/compare_reports.py compares two such folders")


#: the functions that build a report; --dump-reports wraps them
REPORT_BUILDERS = ("normaudit.audit._build_report", "normaudit.audit.checkpoint_only_report")


def pytest_configure(config):
    """With ``--dump-reports DIR``: every report built during the run (in this process or a worker forked
    from it) is written to DIR, named by the test that built it."""
    out = config.getoption("--dump-reports")
    if not out:
        return
    import functools
    import hashlib
    import importlib
    import os
    import re

    os.makedirs(out, exist_ok=True)

    def dumping(build):
        @functools.wraps(build)
        def wrapper(*args, **kwargs):
            report = build(*args, **kwargs)
            test = os.environ.get("PYTEST_CURRENT_TEST", "none").rsplit(" (", 1)[0]
            text = report.model_dump_json(indent=1).replace(str(ROOT), "<repo>")
            digest = hashlib.sha1(text.encode()).hexdigest()[:12]
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test)[:180]
            Path(out, f"{name}__{digest}.json").write_text(text)
            return report
        return wrapper

    for dotted in REPORT_BUILDERS:
        module, _, attr = dotted.rpartition(".")
        module = importlib.import_module(module)
        setattr(module, attr, dumping(getattr(module, attr)))
