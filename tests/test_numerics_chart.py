"""The numerics chart of the Markdown report (normaudit.render.numerics_chart): per norm site in depth
order the input statistic against eps and 10*eps and the output abs-max against the dtype's max, the first
non-finite site marked. Runs the real probe on the post-LN float16 overflow fixture (NN102_1: blocks.1.proj
overflows, blocks.1.norm is where the first NaN appears) and on the same model in bfloat16 (all finite)."""
from __future__ import annotations

import base64
import builtins
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import audit_file
from normaudit.engine.loader import load_rules
from normaudit.render import markdown, numerics_chart

FIXTURE = Path(__file__).parent / "fixtures" / "numerics" / "NN102_1.py"
NORMS = ["blocks.0.norm", "blocks.1.norm", "blocks.2.norm", "blocks.3.norm"]
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def rules():
    return load_rules()


@pytest.fixture(scope="module")
def overflow(rules):
    return audit_file(FIXTURE, rules, dtype="float16", probes=["numerics"])


@pytest.fixture(scope="module")
def finite(rules):
    return audit_file(FIXTURE, rules, dtype="bfloat16", probes=["numerics"])


def _ids(svg: str, prefix: str) -> list[str]:
    root = ET.fromstring(svg)
    pattern = re.compile(rf"{prefix}-\d+$")
    return sorted(e.get("id") for e in root.iter() if pattern.match(e.get("id") or ""))


def _texts(svg: str) -> list[str]:
    return ["".join(e.itertext()) for e in ET.fromstring(svg).iter(f"{SVG_NS}text")]


def test_sites_in_depth_order_and_first_nonfinite(overflow):
    sites = numerics_chart.measured_sites(overflow)
    assert [s.module for s in sites] == NORMS
    assert numerics_chart.first_nonfinite(sites) == 1  # blocks.1.norm, role first_nan


def test_chart_one_mark_per_site_eps_lines_and_first_nonfinite_label(overflow):
    pytest.importorskip("matplotlib")
    svg = numerics_chart.chart_svg(overflow)
    for prefix in ("stat", "out", "eps", "eps10"):
        assert _ids(svg, prefix) == [f"{prefix}-{i}" for i in range(4)], prefix
    root = ET.fromstring(svg)
    assert [e for e in root.iter() if e.get("id") == "first-nonfinite"]
    assert [e for e in root.iter() if e.get("id") == "dtype-max"]
    texts = _texts(svg)
    assert "first non-finite: blocks.1.norm" in texts
    assert "dtype max 6.55e+04" in texts
    assert [t for t in texts if t in NORMS] == NORMS  # the x tick labels, in depth order


def test_chart_of_a_finite_run_marks_nothing(finite):
    pytest.importorskip("matplotlib")
    svg = numerics_chart.chart_svg(finite)
    assert _ids(svg, "stat") == [f"stat-{i}" for i in range(4)]
    assert not [e for e in ET.fromstring(svg).iter() if e.get("id") == "first-nonfinite"]
    assert not [t for t in _texts(svg) if t.startswith("first non-finite")]


def test_chart_is_deterministic_without_date(overflow):
    pytest.importorskip("matplotlib")
    a, b = numerics_chart.chart_svg(overflow), numerics_chart.chart_svg(overflow)
    assert a == b
    assert "<dc:date>" not in a


def test_markdown_embeds_the_chart_and_keeps_the_table(overflow, rules):
    pytest.importorskip("matplotlib")
    text = markdown.render(overflow, rules)
    assert "### Numerics" in text
    match = re.search(r'<img alt="numerics per norm site" src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)">', text)
    assert match
    assert base64.b64decode(match.group(1)).decode("utf-8") == numerics_chart.chart_svg(overflow)
    assert "| `blocks.0.norm` | 1e-05 | 0.986 / 1.22 / 1.73 | 0% | 3.23 |" in text
    assert "| `blocks.1.norm` **first non-finite** | 1e-05 | — / — / — |" in text
    assert "First non-finite value produced by `blocks.1.proj`: overflow" in text


def test_a_chart_too_large_for_a_comment_is_not_inlined(overflow, rules, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(numerics_chart, "MAX_INLINE_CHARS", 1000)
    text = markdown.render(overflow, rules)
    assert "data:image/svg+xml" not in text
    assert [line for line in text.splitlines() if "too large to inline" in line][0].startswith("The numerics chart (")
    assert "| `blocks.0.norm` | 1e-05 | 0.986 / 1.22 / 1.73 | 0% | 3.23 |" in text


def test_markdown_links_a_chart_file_beside_it(overflow, rules, tmp_path):
    pytest.importorskip("matplotlib")
    md = tmp_path / "report.md"
    written = numerics_chart.write_chart(overflow, md)
    assert written == tmp_path / "report.numerics.svg"
    assert written.read_text(encoding="utf-8") == numerics_chart.chart_svg(overflow)
    text = markdown.render(overflow, rules, SimpleNamespace(numerics_chart=written.name, project_root=None))
    assert "![numerics per norm site](report.numerics.svg)" in text
    assert "data:image/svg+xml" not in text


def test_without_matplotlib_one_line_says_how_to_get_the_chart(overflow, rules, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    text = markdown.render(overflow, rules)
    lines = text.splitlines()
    assert [line for line in lines if "matplotlib" in line] == [numerics_chart.INSTALL_HINT]
    assert "pip install 'normaudit[plot]'" in numerics_chart.INSTALL_HINT
    assert "data:image/svg+xml" not in text
    assert "| `blocks.0.norm` | 1e-05 | 0.986 / 1.22 / 1.73 | 0% | 3.23 |" in text
    assert numerics_chart.write_chart(overflow, "unused.md") is None


def test_no_numerics_section_without_the_probe(rules):
    report = audit_file(FIXTURE, rules, dtype="float16")
    assert report.numerics is None
    assert "### Numerics" not in markdown.render(report, rules)


def test_cli_writes_the_chart_beside_a_markdown_output_and_links_it(tmp_path, capfd):
    pytest.importorskip("matplotlib")
    from normaudit.cli import main

    md = tmp_path / "report.md"
    rc = main([str(FIXTURE), "--probe", "numerics", "--dtype", "float16", "--isolated", "--no-cache",
               "--format", "markdown", "-o", str(md), "--fail-on", "never"])
    capfd.readouterr()
    assert rc == 0
    assert "![numerics per norm site](report.numerics.svg)" in md.read_text(encoding="utf-8")
    svg = (tmp_path / "report.numerics.svg").read_text(encoding="utf-8")
    assert 'id="first-nonfinite"' in svg and "blocks.1.norm" in svg
