"""The zoo sweep's summary (benchmarks/zoo/summary.py) on a hand-made results.jsonl: the closing note's table
per corpus (targets, built, audited, % captured, % covering every norm, % clean, recall, crashes,
timeouts, median/max time) and the warning/error findings by rule with the models named."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "zoo"
sys.path.insert(0, str(ZOO))

summary = pytest.importorskip("summary")

NORMS = {"ln_f": "LayerNorm", "h.0.ln_1": "LayerNorm"}
RESULTS = [
    # clean, exported, every forward norm a graph site and no other site
    {"corpus": "transformers", "name": "gpt2", "exit": 0, "shrink": "small", "capture": "export", "complete": True,
     "sites": 2, "graph_site_modules": ["h.0.ln_1", "ln_f"], "site_modules": ["h.0.ln_1", "ln_f"],
     "norm_modules": NORMS, "fwd_norms": ["h.0.ln_1", "ln_f"], "findings": [], "audit_s": 2.0, "total_s": 3.0,
     "cpu_s": 3.0},
    # parts capture that misses one forward norm, with a warning
    {"corpus": "transformers", "name": "qwen2_vl", "exit": 1, "shrink": "small", "capture": "parts",
     "complete": False, "sites": 1, "graph_site_modules": ["ln_f"], "site_modules": ["h.0.ln_1", "ln_f"],
     "norm_modules": NORMS, "fwd_norms": ["h.0.ln_1", "ln_f"], "audit_s": 6.0, "total_s": 9.0, "cpu_s": 9.0,
     "findings": [{"rule": "NP101", "severity": "warning", "module": "", "message": "no final norm",
                   "source": "modeling.py:10"}]},
    # module walk only: capture failed; no forward ran; covered falls back to the report's `complete`
    {"corpus": "transformers", "name": "vilt", "exit": 1, "shrink": "small", "capture": "module_walk",
     "complete": False, "sites": 2, "graph_site_modules": [], "site_modules": ["h.0.ln_1", "ln_f"],
     "norm_modules": NORMS, "fwd_norms": None, "audit_s": 4.0, "total_s": 4.0, "cpu_s": 4.0,
     "findings": [{"rule": "NK101", "severity": "warning", "module": "", "message": "capture failed",
                   "source": "None:None"}]},
    {"corpus": "transformers", "name": "chameleon", "exit": "build", "error": "RuntimeError: no shrink level builds",
     "total_s": 0.5},
    {"corpus": "transformers", "name": "csm", "exit": "timeout", "error": "timeout after 181 s", "total_s": 181.0},
    {"corpus": "transformers", "name": "reformer", "exit": 3, "shrink": "small", "audit_s": 1.0, "total_s": 1.5,
     "cpu_s": 1.5, "error": "GuardOnDataDependentSymNode"},
    # timm: one clean model with a functional norm site beyond the norm modules, one with an error finding
    {"corpus": "timm", "name": "resnet18", "family": "resnet", "exit": 0, "capture": "fx", "complete": True,
     "graph_site_modules": ["bn1", "stem.norm"], "site_modules": ["bn1", "stem.norm"],
     "norm_modules": {"bn1": "BatchNorm2d"}, "fwd_norms": ["bn1"], "findings": [], "audit_s": 1.0,
     "total_s": 2.0, "cpu_s": 2.0},
    {"corpus": "timm", "name": "convnext_atto", "family": "convnext", "exit": 1, "capture": "fx", "complete": True,
     "graph_site_modules": ["norm"], "site_modules": ["norm"], "norm_modules": {"norm": "LayerNorm2d"},
     "fwd_norms": ["norm"], "audit_s": 3.0, "total_s": 5.0, "cpu_s": 5.0,
     "findings": [{"rule": "NP102", "severity": "error", "module": "stages.1.downsample.0", "message": "skip",
                   "source": "convnext.py:200"}]},
]


@pytest.fixture()
def sweep_dir(tmp_path: Path) -> Path:
    # a rerun of qwen2_vl written earlier is superseded by the later line (latest wins)
    stale = dict(RESULTS[1], exit="timeout")
    lines = [json.dumps(stale)] + [json.dumps(r) for r in RESULTS]
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "wall_seconds.txt").write_text("1500\n")
    return tmp_path


def test_transformers_figures():
    rs = summary.latest(RESULTS)
    fig = summary.corpus_figures([r for r in rs if r["corpus"] == "transformers"])
    assert fig["targets"] == "6"
    assert fig["built (small config / timm model)"] == "5 / 6 (83.3%)"
    assert fig["audited (exit 0 or 1)"] == "3 / 5 (60.0%)"
    assert (fig["crashes (exit 3, worker error)"], fig["timeouts"], fig["exit 2 (refused)"]) == ("1", "1", "0")
    assert fig["captured as a graph"] == "2 / 5 (40.0%)"
    assert fig["graph or parts covering every norm"] == "1 / 5 (20.0%)"
    assert fig["clean (no warning/error finding)"] == "1 / 3 (33.3%)"
    assert fig["recall measured (a forward ran)"] == "2 / 3 (66.7%)"
    assert fig["every forward norm is a graph site"] == "1 / 2 (50.0%)"
    assert fig["graph sites on norm modules = forward norms"] == "1 / 2 (50.0%)"
    assert fig["audit s per model, median / max"] == "4.0 / 6.0"
    assert fig["target s (build + audit + forward), median / max"] == "3.5 / 181.0"
    assert fig["CPU s per target, median / max"] == "3.5 / 9.0"
    assert fig["CPU min, all targets"] == f"{17.5 / 60:.1f}"


def test_timm_figures_extra_site_is_not_exact():
    rs = summary.latest(RESULTS)
    fig = summary.corpus_figures([r for r in rs if r["corpus"] == "timm"])
    assert fig["graph or parts covering every norm"] == "2 / 2 (100.0%)"
    assert fig["every forward norm is a graph site"] == "2 / 2 (100.0%)"
    # resnet18's stem.norm site is in no norm module (a functional norm): counted apart, not a mismatch
    assert fig["graph sites on norm modules = forward norms"] == "2 / 2 (100.0%)"
    assert fig["models with functional sites in other modules"] == "1"
    assert fig["clean (no warning/error finding)"] == "1 / 2 (50.0%)"


def test_markdown_table_and_findings_by_rule(sweep_dir: Path):
    results = [json.loads(line) for line in open(sweep_dir / "results.jsonl")]
    out = sweep_dir / "summary.md"
    summary.write_markdown(results, out, wall_file=sweep_dir / "wall_seconds.txt")
    text = out.read_text().splitlines()
    assert "Wall time of the sweep: 25.0 min" in text
    assert text[text.index("| | timm | transformers |") + 1] == "|---|---|---|"
    assert "| audited (exit 0 or 1) | 2 / 2 (100.0%) | 3 / 5 (60.0%) |" in text
    assert "| timeouts | 0 | 1 |" in text  # the stale qwen2_vl timeout was superseded
    assert "| NP102 | error | 1 | convnext_atto |" in text
    transformers_rules = text[text.index("## transformers: findings at warning or error, by rule"):]
    assert "| NK101 | warning | 1 | vilt |" in transformers_rules
    assert "| NP101 | warning | 1 | qwen2_vl |" in transformers_rules
    assert "- not built: `chameleon`: RuntimeError: no shrink level builds" in text
    assert "- crash: `reformer`: GuardOnDataDependentSymNode" in text
    assert "- timeout: `csm`: timeout after 181 s" in text


def test_tsv_row_names_missing_and_extra(tmp_path: Path):
    out = tmp_path / "zoo.tsv"
    summary.write_tsv(RESULTS, out)
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    header = rows[0]
    by_model = {row[header.index("model")]: dict(zip(header, row)) for row in rows[1:]}
    assert by_model["qwen2_vl"]["missing"] == "h.0.ln_1"
    assert by_model["qwen2_vl"]["recall"] == "0.500"
    assert (by_model["resnet18"]["extra"], by_model["resnet18"]["functional"]) == ("", "stem.norm")
    assert by_model["convnext_atto"]["findings"] == "NP102@stages.1.downsample.0"


def test_ground_truth_counts_norms_of_every_input_set_and_no_pseudo_norms():
    """The sweep's ground truth (forward.forward_norms): the union over the input sets that run (a text set and
    an image set call different towers), GRN counted, NoNorm (affine only) and _WeightNorm (a weight
    reparametrisation) not."""
    forward = pytest.importorskip("forward")
    import torch
    from torch import nn

    class NoNorm(nn.Module):  # mobilebert's: x * weight + bias, no statistic
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x):
            return x * self.weight

    class ConvNextV2GRN(nn.Module):  # transformers' GRN: x * (1 + gamma * Nx), Nx from an L2 norm over space
        def forward(self, x):
            gx = torch.linalg.vector_norm(x, ord=2, dim=-1, keepdim=True)
            return x + x * (gx / (gx.mean(dim=-1, keepdim=True) + 1e-6))

    class TwoTowers(nn.Module):
        main_input_name = "input_ids"

        def __init__(self):
            super().__init__()
            self.text_norm, self.image_norm = nn.LayerNorm(8), nn.LayerNorm(8)
            self.affine, self.grn = NoNorm(), ConvNextV2GRN()
            self.embed = nn.Embedding(16, 8)

        def forward(self, input_ids=None, pixel_values=None):
            if pixel_values is not None:
                return self.grn(self.image_norm(pixel_values.flatten(1)[:, :8]))
            return self.affine(self.text_norm(self.embed(input_ids)))

    class Config:
        vocab_size, image_size, num_channels, patch_size = 16, 4, 3, 2

        def to_dict(self):
            return {"vocab_size": 16}

    model = TwoTowers()
    assert set(forward.norm_modules(model)) == {"text_norm", "image_norm", "grn"}
    called, label = forward.forward_norms(model, Config())
    assert called == {"text_norm", "image_norm", "grn"}
    assert "input_ids" in label and "pixel_values" in label


def test_uncovered_targets_counted_by_cause():
    rs = [r for r in summary.latest(RESULTS) if r["corpus"] == "transformers"]
    causes = {r["name"]: summary.uncovered_cause(r) for r in rs}
    assert causes == {"gpt2": None, "qwen2_vl": summary.CAUSES[3],
                      "vilt": "inputs (no input set runs the model)", "chameleon": "not built",
                      "csm": "capture failed (a forward ran, or exit 2/3, timeout)",
                      "reformer": "capture failed (a forward ran, or exit 2/3, timeout)"}
    fig = summary.corpus_figures(rs)
    assert summary.CAUSES[3].startswith("captured, norms missed")
    assert [fig[f"not covered: {c}"] for c in summary.CAUSES] == ["1", "1", "2", "1"]
    assert fig["covered, of all targets"] == "1 / 6 (16.7%)"
    # gpt2 2 of 2 forward norms, qwen2_vl 1 of 2
    assert fig["forward norms that are graph sites (all measured models)"] == "3 / 4 (75.0%)"
