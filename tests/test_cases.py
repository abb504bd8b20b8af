"""The reference cases of shared/cases (real public bug reports) as tests, with exact values asserted.

Each test audits the case's model.py in-process and checks the exact modules flagged, rule ids and facts.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import CASES, audit_file, flagged, loud, requires_cases, site

pytestmark = requires_cases


def test_n01_rms_statistics_over_sequence(rules):
    r = audit_file(CASES / "N01_seq_rmsnorm" / "model.py", rules)
    assert [(s.module, s.kind, s.normalized_axes) for s in r.sites] == [
        ("blocks.0.norm", "RMSNorm", ["sequence", "feature"]),
        ("blocks.1.norm", "RMSNorm", ["sequence", "feature"]),
        ("final_norm", "RMSNorm", ["sequence", "feature"]),
    ]
    assert flagged(r, "NL101", min_severity="error") == ["blocks.0.norm", "blocks.1.norm", "final_norm"]
    s = site(r, "blocks.0.norm")
    assert s.source.file.endswith("N01_seq_rmsnorm/model.py") and s.source.line == 20


def test_n02_layernorm_over_chw_is_resolution_tied(rules):
    r = audit_file(CASES / "N02_resolution_tied_ln" / "model.py", rules)
    s = site(r, "norm")
    assert (s.kind, s.normalized_shape, s.normalized_axes) == ("LayerNorm", [8, 16, 16], ["channel", "height", "width"])
    assert flagged(r, "NL103", min_severity="warning") == ["norm"]
    assert flagged(r, "NL102") == []


def test_n05_convnext_control_is_silent(rules):
    r = audit_file(CASES / "N05_convnext_control" / "model.py", rules)
    assert {(s.module, s.kind, tuple(s.normalized_axes)) for s in r.sites} == {
        ("stem_norm", "LayerNorm", ("channel",)),
        ("blocks.0.norm", "LayerNorm", ("channel",)),
        ("blocks.1.norm", "LayerNorm", ("channel",)),
    }
    assert site(r, "stem_norm").detected_by == "pattern"
    assert site(r, "stem_norm").eps == 1e-6
    assert loud(r) == []


def test_n12_rms_eps_differs_from_config(rules):
    case = CASES / "N12_rms_eps_config"
    r = audit_file(case / "model.py", rules, config=str(case / "config.json"))
    modules = ["layers.0.input_layernorm", "layers.0.post_attention_layernorm", "layers.1.input_layernorm",
               "layers.1.post_attention_layernorm", "norm"]
    assert [s.module for s in r.sites] == modules
    assert all(s.kind == "RMSNorm" and s.eps == 1e-6 for s in r.sites)
    assert flagged(r, "NE101", min_severity="error") == sorted(modules)
    f = next(f for f in r.findings if f.module == "norm" and f.rule_id == "NE101")
    assert f.message == "eps=1e-06, but rms_norm_eps=1e-05 in config.json"


def test_n14_layernorm_eps_ignored(rules):
    case = CASES / "N14_ln_eps_ignored"
    r = audit_file(case / "model.py", rules, config=str(case / "config.json"))
    assert site(r, "embedding_norm").eps == 1e-12
    assert site(r, "layers.0.attention_output_norm").eps == 1e-5
    assert flagged(r, "NE101", min_severity="error") == [
        "layers.0.attention_output_norm", "layers.0.output_norm",
        "layers.1.attention_output_norm", "layers.1.output_norm"]


def test_n26_t5_style_rmsnorm_named_layernorm(rules):
    r = audit_file(CASES / "N26_t5_rms_control" / "model.py", rules)
    s = site(r, "final_layer_norm")
    assert (s.class_name, s.kind, s.eps) == ("T5StyleLayerNorm", "RMSNorm", 1e-6)
    assert loud(r) == []


def test_n30_groupnorm_groups_is_a_usage_error(tmp_path):
    case = CASES / "N30_groupnorm_groups"
    proc = subprocess.run([sys.executable, "-m", "normaudit", "model.py", "--format", "json"], cwd=case,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line == ("normaudit: error: model.py:11: build_model() failed: ValueError: num_channels (16) must be "
                    "divisible by num_groups (32) (raised in torch.nn GroupNorm)")


# --- Every case of the manifest, as the case runner reads it (in-process: one torch import) -------------------

import json
import filecmp

import yaml

from conftest import SHARED_CASES

RANK = {"info": 0, "warning": 1, "error": 2}
MANIFEST = yaml.safe_load((CASES / "manifest.yaml").read_text())["cases"] if CASES.is_dir() else {}


def _run_case(name: str, capsys, monkeypatch) -> tuple[int, dict, str]:
    from normaudit.cli import main

    spec = MANIFEST[name]
    monkeypatch.chdir(CASES / name)
    code = main(["model.py", "--format", "json"] + [str(a) for a in spec.get("args", [])])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_manifest_case(name, capsys, monkeypatch):
    """What ../shared/cases/run_cases.py checks, per case: exit, expected findings, silence, sites, model facts."""
    spec = MANIFEST[name]
    code, report, err = _run_case(name, capsys, monkeypatch)
    if "exit" in spec:
        assert code == spec["exit"]
        for text in spec.get("stderr_contains", []):
            assert text in err
        return
    assert code in (0, 1), err
    findings = report["findings"]
    for exp in spec.get("expect", []):
        cats = exp["category"] if isinstance(exp["category"], list) else [exp["category"]]
        hit = sorted({f["module"] for f in findings
                      if f["category"] in cats and RANK[f["severity"]] >= RANK[exp["severity"]]})
        if exp["modules"] == "any":
            assert hit, f"no {cats} finding at {exp['severity']}+"
        else:
            assert set(exp["modules"]) <= set(hit), (exp, hit)
    flagged_loud = {f["module"] for f in findings if RANK[f["severity"]] >= RANK["warning"]}
    for module in spec.get("not_flagged", []):
        assert module not in flagged_loud
    if spec.get("silent"):
        assert [f for f in findings if RANK[f["severity"]] >= RANK["warning"]] == []
    sites = {s["module"]: s for s in report["sites"]}
    for exp in spec.get("sites", []):
        for key, want in exp.items():
            assert sites[exp["module"]][key] == want, (exp["module"], key)
    for key, want in spec.get("model", {}).items():
        assert report["model"][key] == want


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases not beside the checkout")
def test_copied_cases_are_current():
    """tests/data/cases is a copy of ../shared/cases (so the suite runs without it); keep it current."""
    names = sorted(p.name for p in SHARED_CASES.iterdir() if p.name != "run_cases.py" and not p.name.startswith("."))
    ours = sorted(p.name for p in CASES.iterdir() if not p.name.startswith(".") and p.name != "__pycache__")
    assert ours == names
    for name in names:
        cmp = filecmp.dircmp(SHARED_CASES / name, CASES / name) if (CASES / name).is_dir() else None
        if cmp is None:
            assert filecmp.cmp(SHARED_CASES / name, CASES / name, shallow=False)
        else:
            assert not cmp.left_only and not cmp.right_only and not cmp.diff_files, name
