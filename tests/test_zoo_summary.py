"""benchmarks/zoo/summary.py's coverage of a target no real forward ran for: a capture by parts
counts as covering every norm when each norm module of the model is a graph site of some part."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "zoo"))
summary = pytest.importorskip("summary")

NORMS = {"vision.ln": "LayerNorm", "text.layers.0.norm": "RMSNorm", "text.norm": "RMSNorm"}


def _parts(sites: list[str], **kw) -> dict:
    return {"corpus": "transformers", "name": "m", "exit": 1, "capture": "parts", "complete": False,
            "norm_modules": NORMS, "graph_site_modules": sites, "fwd_norms": None, **kw}


def test_parts_with_every_norm_module_a_site_is_covered():
    r = _parts(["text.layers.0.norm", "text.norm", "vision.ln"])
    assert summary.every_norm_sited(r)
    assert summary.covered(r) and summary.uncovered_cause(r) is None


def test_parts_missing_one_norm_module_is_not_covered():
    r = _parts(["text.layers.0.norm", "text.norm"])
    assert not summary.every_norm_sited(r)
    assert not summary.covered(r)
    assert summary.uncovered_cause(r) == summary.CAUSES[3]


def test_module_walk_is_never_covered_and_a_forward_decides_where_it_ran():
    assert not summary.covered(_parts(list(NORMS), capture="module_walk"))
    # a real forward ran: its called norms decide, not the norm modules
    assert summary.covered(_parts(["text.norm"], fwd_norms=["text.norm"]))
    assert not summary.covered(_parts(list(NORMS), fwd_norms=["text.norm", "other.norm"]))
    # no norm modules at all: nothing shows the parts cover anything
    assert not summary.covered(_parts([], norm_modules={}))


def test_summary_names_each_uncovered_target_with_its_library_line(tmp_path):
    walked = _parts(list(NORMS), name="clvp", capture="module_walk", mode="careful",
                    capture_error="TypeError: conv1d() received an invalid combination of arguments",
                    capture_location="transformers/models/clvp/modeling_clvp.py:735")
    whole = _parts(list(NORMS), name="llama", capture="export", complete=True)
    summary.write_markdown([walked, whole], tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    section = text.split("## transformers: built, not covered: the cause and the library's line\n\n")[1]
    assert section.splitlines()[0] == (
        "- `clvp` (careful): inputs (no input set runs the model): TypeError: conv1d() received an "
        "invalid combination of arguments (at `transformers/models/clvp/modeling_clvp.py:735`)")
    assert "`llama`" not in section


def test_library_line_is_relative_to_site_packages():
    worker = pytest.importorskip("worker")
    loc = {"file": "/usr/lib/python3.11/site-packages/transformers/models/clvp/modeling_clvp.py", "line": 735}
    assert worker.library_line(loc) == "transformers/models/clvp/modeling_clvp.py:735"
    assert worker.library_line({"file": "/work/m/model.py", "line": 3}) == "/work/m/model.py:3"
    assert worker.library_line(None) == ""
