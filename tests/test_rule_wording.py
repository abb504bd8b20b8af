"""Exact wording of rule messages and fixes in edge cases: what they say must stay true when a measured value
is degenerate (NN104's fix when the median variance is 0)."""
from __future__ import annotations

import pytest

from normaudit.engine.evaluator import evaluate
from normaudit.engine.loader import builtin_rules_dir, load_rule_file
from normaudit.report import ModelFacts, Site, SiteNumerics


def _nn104_fix(median: float) -> str:
    (path,) = builtin_rules_dir().rglob("NN104-*.yaml")
    n = SiteNumerics(measured=True, statistic="variance", rows=32, stat_min=0.0, stat_median=median, stat_max=0.5,
                     eps_dominated_below=1e-4, eps_dominated_fraction=0.75)
    site = Site(module="blocks.0.ln", kind="LayerNorm", class_name="LayerNorm", detected_by="module", eps=1e-5,
                numerics=n)
    (finding,) = evaluate([load_rule_file(path)], [site], ModelFacts(class_name="M"), {}, None, {})
    return finding.fix


@pytest.mark.parametrize("median, tail", [
    (0.0123456, "; or lower eps to well below the typical variance (0.0123)"),
    (0.0, " (the median variance is 0: most rows are constant, and their normalised output is 0 whatever eps is)"),
])
def test_nn104_fix_says_something_true_when_the_median_is_zero(median, tail):
    assert _nn104_fix(median) == ("check what feeds blocks.0.ln: a nearly constant input (padding, a collapsed or "
                                  "zero-initialised branch) or inputs scaled far below 1" + tail)
