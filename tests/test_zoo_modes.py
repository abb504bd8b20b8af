"""The zoo sweep's modes (benchmarks/zoo: ``sweep.py --mode careful,full,plain``): the jobs of each mode, the
plain shrink that keeps no relation between a config's keys, and the summary's coverage per mode side by
side, where a type covered only under the careful shrink is not covered as users get it."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "zoo"
sys.path.insert(0, str(ZOO))

summary = pytest.importorskip("summary")
sweep = pytest.importorskip("sweep")
targets = pytest.importorskip("targets")

NORMS = {"ln_f": "LayerNorm", "h.0.ln_1": "LayerNorm"}


def _result(name: str, mode: str, complete: bool, **more) -> dict:
    graph = ["h.0.ln_1", "ln_f"] if complete else []
    r = {"corpus": "transformers", "name": name, "exit": 0 if complete else 1, "shrink": mode,
         "capture": "export" if complete else "module_walk", "complete": complete, "graph_site_modules": graph,
         "site_modules": ["h.0.ln_1", "ln_f"], "norm_modules": NORMS, "fwd_norms": None, "findings": [],
         "audit_s": 1.0, "total_s": 1.0, "cpu_s": 1.0, **more}
    if mode != "careful":
        r["mode"] = mode
    return r


def test_jobs_of_each_mode_go_to_their_own_folders(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(targets, "transformers_types", lambda only=None: ["bert", "gpt2"])
    args = argparse.Namespace(corpus="transformers", only=None, shuffle=None, limit=None, out=tmp_path,
                              mode="careful,full")
    jobs = sweep.enumerate_jobs(args)
    assert [(j["name"], j["mode"], Path(j["dir"]).relative_to(tmp_path).as_posix()) for j in jobs] == [
        ("bert", "careful", "targets/transformers/bert"), ("gpt2", "careful", "targets/transformers/gpt2"),
        ("bert", "full", "targets/transformers-full/bert"), ("gpt2", "full", "targets/transformers-full/gpt2")]


def test_an_unknown_mode_is_refused():
    with pytest.raises(SystemExit, match="unknown mode"):
        sweep.modes(argparse.Namespace(mode="careful,huge"))


def test_plain_shrink_cuts_widths_depths_and_heads_and_keeps_the_rest():
    d = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151552, "rope_parameters": {"mrope_section": [8, 12, 12]},
         "vision_config": {"hidden_size": 1536, "depth": 24, "patch_size": 14, "image_size": 336,
                           "spatial_merge_size": 2}}
    out = targets.plain_shrink_dict(d)
    assert out == {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151552,
                   "rope_parameters": {"mrope_section": [8, 12, 12]},
                   "vision_config": {"hidden_size": 64, "depth": 2, "patch_size": 14, "image_size": 336,
                                     "spatial_merge_size": 2}}
    assert d["hidden_size"] == 4096  # a copy


def test_coverage_across_modes_counts_a_type_covered_only_when_careful_as_not_covered():
    rs = summary.latest([_result("gpt2", "careful", True), _result("gpt2", "full", True),
                         _result("glm4v", "careful", True), _result("glm4v", "full", False),
                         _result("step3p7", "careful", True),
                         dict(_result("step3p7", "full", False), exit="build")])
    cov = summary.mode_coverage(rs, "transformers")
    assert cov == {"modes": ["careful", "full"], "types": ["glm4v", "gpt2"], "every": ["gpt2"],
                   "only": {"careful": ["glm4v"], "full": []}}
    assert summary.mode_coverage([r for r in rs if summary.mode(r) == "careful"], "transformers") is None


def test_summary_gives_each_mode_a_column(tmp_path: Path):
    rows = [_result("gpt2", "careful", True), _result("gpt2", "full", True), _result("glm4v", "careful", True),
            _result("glm4v", "full", False)]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary.write_markdown([json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()],
                           tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    assert "| | transformers | transformers (full) |" in text
    assert "| covered, of all targets | 2 / 2 (100.0%) | 1 / 2 (50.0%) |" in text
    assert "- covered in every mode: 1 / 2 (50.0%)" in text
    assert "- covered under careful but not in every mode (1): glm4v" in text
