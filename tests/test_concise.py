"""``--format concise``, ``--quiet``, ``--statistics`` and colour: exact lines, for synthetic reports and for
every reference case of tests/data/cases (audited in-process, rendered as the CLI does from the case's folder).
"""
from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import CASES, audit_file
from normaudit.render import RenderOptions, concise, statistics, text
from normaudit.render.style import color_wanted
from normaudit.report import Finding, SourceLocation
from test_render_formats import make_report, make_rules

CLI_FIXTURES = Path(__file__).parent / "fixtures" / "cli"
TEST_RULES = ["--rules", str(CLI_FIXTURES / "rules"), "--select", "NZ,NK", "--isolated"]


@pytest.fixture
def report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return make_report(tmp_path)


def _layers(tmp_path, n=18):
    src = SourceLocation(file=str(tmp_path / "models" / "gpt.py"), line=42)
    return [Finding(rule_id="NE101", rule_name="eps-differs-from-config", category="eps", severity="error",
                    module=f"layers.{i}.ln1", message=f"layers.{i}.ln1: eps is 1e-05", source=src) for i in range(n)]


# --------------------------------------------------------------------------------------------- concise
def test_concise_exact_lines_sorted_by_place(report):
    assert concise.render(report).splitlines() == [
        "models/gpt.py:1:1: NB201 [info] bn: batch of 2 | too small",  # no source: the model (not on disk: line 1)
        "models/gpt.py:42:1: NE101 [error] layers.0.ln1: eps is 1e-05, the config says 1e-06",
        "other/x.py:1:1: NX999 [warning] enc.0.norm_b: no eps at all",
        "Found 3 findings: 1 error, 1 warning, 1 info.",
    ]


def test_concise_groups_one_fault_over_layers(report, tmp_path):
    report.findings = _layers(tmp_path)
    report.summary.errors, report.summary.warnings, report.summary.infos = 18, 0, 0
    assert concise.render(report).splitlines() == [
        "models/gpt.py:42:1: NE101 [error] layers.0-17.ln1 (18 modules): eps is 1e-05",
        "Found 18 findings (1 line, grouped by layer): 18 errors.",
    ]


def test_concise_model_finding_at_the_class_line_and_outside_paths_at_the_model(report, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gpt.py").write_text("import torch\n\nclass ToyModel:\n    pass\n")
    report.findings[2].source = SourceLocation(file="/opt/lib/modeling.py", line=7)
    lines = concise.render(report, options=RenderOptions(quiet=True, project_root=tmp_path)).splitlines()
    assert lines == [  # a line outside the project is shown at the model, as SARIF shows it
        "models/gpt.py:3:1: NB201 [info] bn: batch of 2 | too small",
        "models/gpt.py:3:1: NX999 [warning] enc.0.norm_b: no eps at all (library: /opt/lib/modeling.py:7)",
        "models/gpt.py:42:1: NE101 [error] layers.0.ln1: eps is 1e-05, the config says 1e-06",
    ]


def test_concise_quiet_without_findings_prints_nothing(report):
    empty = report.model_copy(update={"findings": []}, deep=True)
    assert concise.render(empty, options=RenderOptions(quiet=True)) == ""
    assert concise.render(empty) == "No findings.\n"
    assert concise.summary_line(0, 0, 0, failed=1) == "No findings. 1 target failed."
    assert concise.summary_line(2, 1, 0, failed=2) == "Found 3 findings: 2 errors, 1 warning. 2 targets failed."


def test_concise_summary_of_several_targets_says_how_many():
    assert concise.summary_line(2, 1, 0, targets=3) == "Found 3 findings in 3 targets: 2 errors, 1 warning."
    assert concise.summary_line(0, 0, 0, targets=2) == "No findings in 2 targets."
    assert concise.summary_line(1, 0, 0, failed=1, targets=4) == "Found 1 finding in 4 targets (1 failed): 1 error."
    assert concise.summary_line(0, 0, 0, failed=2, targets=2) == "No findings in 2 targets (2 failed)."
    assert concise.summary_line(9, 0, 0, lines=5, baselined=2, targets=2) == \
        "Found 9 new findings in 2 targets (5 lines, grouped by layer) (2 in the baseline): 9 errors."
    assert concise.summary_line(2, 0, 0, targets=1) == "Found 2 findings: 2 errors."


def test_concise_run_of_several_targets_ends_with_their_count(tmp_path, capsys, monkeypatch):
    from normaudit.cli import main

    tiny = Path(__file__).parent / "fixtures" / "cli" / "tiny.py"
    monkeypatch.chdir(tmp_path)
    for name in ("a.py", "b.py"):
        shutil.copy(tiny, tmp_path / name)
    main(["a.py", "b.py", "missing.py", "--format", "concise", "--isolated", "--no-cache", "--select", "NE"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith(" in 3 targets (1 failed).") or " in 3 targets (1 failed): " in last, last


def test_concise_escapes_control_characters(report):
    report.findings = [report.findings[0].model_copy(update={
        "module": "h\x1b[31m.0", "message": "eps\nis\u202ewrong"})]
    (line, _) = concise.render(report).splitlines()
    assert line == "models/gpt.py:42:1: NE101 [error] h\\x1b[31m.0: eps\\nis\\u202ewrong"
    assert "\x1b" not in line


def test_colour_only_when_asked(report):
    plain = concise.render(report)
    painted = concise.render(report, options=RenderOptions(color=True))
    assert "\x1b[" not in plain
    assert "\x1b[1;31mNE101\x1b[0m \x1b[1;31m[error]\x1b[0m" in painted
    assert "\x1b[1;31mERRORS (1)\x1b[0m" in text.render(report, options=RenderOptions(color=True))
    assert "\x1b[" not in text.render(report)


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_color_wanted_needs_a_terminal_and_no_NO_COLOR():
    assert color_wanted(_Stream(True), {}) is True
    assert color_wanted(_Stream(True), {"NO_COLOR": "1"}) is False
    assert color_wanted(_Stream(True), {"NO_COLOR": ""}) is True  # no-color.org: set and not empty
    assert color_wanted(_Stream(False), {}) is False
    assert color_wanted(None, {}) is False


# --------------------------------------------------------------------------------------- text --quiet
def test_text_quiet_is_the_findings_only(report):
    quiet = text.render(report, options=RenderOptions(quiet=True))
    assert quiet.splitlines()[0] == "ERRORS (1)"
    assert "normalisation site(s)" not in quiet and "normaudit 0.1.0" not in quiet
    assert "  NE101 [eps] layers.0.ln1: eps is 1e-05, the config says 1e-06" in quiet.splitlines()
    assert text.render(report.model_copy(update={"findings": []}), options=RenderOptions(quiet=True)) == ""


# ---------------------------------------------------------------------------------------- statistics
def test_statistics_counts_findings_per_rule(report, tmp_path):
    report.findings += _layers(tmp_path, 17)
    assert statistics.rule_counts([report]) == [(18, "NE101", "error", "eps-differs-from-config"),
                                                (1, "NB201", "info", "batchnorm-tiny-batch"),
                                                (1, "NX999", "warning", "unlisted-rule")]
    assert statistics.render_statistics([report, report]).splitlines() == [
        "36  NE101  [error]    eps-differs-from-config",
        " 2  NB201  [info]     batchnorm-tiny-batch",
        " 2  NX999  [warning]  unlisted-rule",
    ]
    assert statistics.render_statistics([report.model_copy(update={"findings": []})]) == ""


# ----------------------------------------------------------------------------------------------- CLI
def _cli(capsys, *argv):
    from normaudit.cli import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_concise_quiet_and_statistics(capsys, tmp_path, monkeypatch):
    shutil.copy(CLI_FIXTURES / "tiny.py", tmp_path / "tiny.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)
    rc, out, _ = _cli(capsys, "tiny.py", "--format", "concise", *TEST_RULES)
    lines = out.splitlines()
    assert rc == 1
    assert lines[-1] == "Found 3 findings (2 lines, grouped by layer): 2 errors, 1 warning."
    assert all(ln.startswith("tiny.py:") for ln in lines[:-1]) and len(lines) >= 2
    assert "\x1b[" not in out  # captured stdout is no terminal
    rc, quiet, _ = _cli(capsys, "tiny.py", "--format", "concise", "--quiet", *TEST_RULES)
    assert quiet.splitlines() == lines[:-1]
    rc, stats, _ = _cli(capsys, "tiny.py", "--statistics", *TEST_RULES)
    assert rc == 1
    assert [ln.split()[:3] for ln in stats.splitlines()] == [["2", "NZ001", "[error]"], ["1", "NZ002", "[warning]"]]


def test_cli_colours_a_terminal_stdout_unless_NO_COLOR(capsys, tmp_path, monkeypatch):
    import sys

    from normaudit.cli.outputs import OutputSpec, render_options
    from normaudit.cli.parser import audit_parser

    monkeypatch.chdir(tmp_path)
    spec = OutputSpec("concise", None)
    args = audit_parser().parse_args(["x.py"])
    monkeypatch.setattr(sys, "stdout", _Stream(True))
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert render_options(args, spec).color is True
    assert render_options(args, OutputSpec("concise", "out.txt")).color is False  # a file: never
    assert render_options(args, OutputSpec("json", None)).color is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert render_options(args, spec).color is False


def test_cli_project_root_must_be_a_directory(capsys, tmp_path, monkeypatch):
    shutil.copy(CLI_FIXTURES / "tiny.py", tmp_path / "tiny.py")
    monkeypatch.chdir(tmp_path)
    rc, out, err = _cli(capsys, "tiny.py", "--format", "sarif", "--project-root", "nowhere", *TEST_RULES)
    assert (rc, out) == (2, "")
    assert err == "normaudit: error: nowhere: --project-root: no such directory\n"


# ------------------------------------------------------------------------- the reference cases, line by line
EXPECTED = {
    'N01_seq_rmsnorm': [
        "model.py:20:1: NL101 [error] blocks.0-1.norm (2 modules): hand-written RMSNorm `SeqRMSNorm` (mean of squares over the last 2 dims (8x16: sequence, feature), eps 1e-06) takes its statistics over (sequence, feature) of an input laid out as (batch, sequence, feature): the sequence axis is mixed into every position's mean and variance, so one example (or one token) changes the output of the others; size probe: at sequence 8->24, the normalised dim 1 changes size with the input",
        "model.py:32:1: NL101 [error] final_norm: hand-written RMSNorm `SeqRMSNorm` (mean of squares over the last 2 dims (8x16: sequence, feature), eps 1e-06) takes its statistics over (sequence, feature) of an input laid out as (batch, sequence, feature): the sequence axis is mixed into every position's mean and variance, so one example (or one token) changes the output of the others; size probe: at sequence 8->24, the normalised dim 1 changes size with the input",
        'Found 3 findings (2 lines, grouped by layer): 3 errors.',
    ],
    'N02_resolution_tied_ln': [
        'model.py:10:1: NL103 [warning] norm: nn.LayerNorm(normalized_shape=[8, 16, 16], eps=1e-05) normalises (channel, height, width) jointly: the spatial sizes are baked into its shape (and its affine parameters), so the model only accepts inputs of that resolution; size probe: at height 16->24, width 16->24 it raises: RuntimeError: Given normalized_shape=[8, 16, 16], expected input with shape [8, 16, 16], but got input of size torch.Size([2, 8, 24, 24])',
        'Found 1 finding: 1 warning.',
    ],
    'N05_convnext_control': [
        'No findings.',
    ],
    'N06_preln_no_final': [
        "model.py:20:1: NP101 [warning] layers.1: pre-LN stack without a final norm: the residual stream leaving layers.1 reaches lm_head un-normalised. In a pre-LN stack only the branches see normalised inputs; the stream itself is a growing sum of every block's output, so its scale depends on depth and nothing normalises it before the output",
        'Found 1 finding: 1 warning.',
    ],
    'N10_skip_from_norm': [
        "model.py:10:1: NP102 [error] layers.0-1.norm1 (2 modules): the norm's output is also the skip path of the residual add that follows (x = norm(x); x = x + f(x)), so every block replaces the residual stream with its normalised version: the identity path of the residual connection is lost",
        'Found 2 findings (1 line, grouped by layer): 2 errors.',
    ],
    'N12_rms_eps_config': [
        'model.py:27:1: NE101 [error] layers.0-1.input_layernorm (2 modules): eps=1e-06, but rms_norm_eps=1e-05 in config.json',
        'model.py:29:1: NE101 [error] layers.0-1.post_attention_layernorm (2 modules): eps=1e-06, but rms_norm_eps=1e-05 in config.json',
        'model.py:46:1: NE101 [error] norm: eps=1e-06, but rms_norm_eps=1e-05 in config.json',
        'Found 5 findings (3 lines, grouped by layer): 5 errors.',
    ],
    'N14_ln_eps_ignored': [
        'model.py:15:1: NE101 [error] layers.0-1.attention_output_norm (2 modules): eps=1e-05, but layer_norm_eps=1e-12 in config.json',
        'model.py:18:1: NE101 [error] layers.0-1.output_norm (2 modules): eps=1e-05, but layer_norm_eps=1e-12 in config.json',
        'Found 4 findings (2 lines, grouped by layer): 4 errors.',
    ],
    'N17_eps_fp16': [
        "model.py:17:1: NN101 [warning] norm: norm (PortedLayerNorm) computes the variance in float16 without an upcast: any element above 256 in magnitude squares past float16's maximum 65504, the statistic becomes inf and the row's output collapses to 0 (or NaN)",
        'model.py:26:1: NE104 [error] norm: eps=1e-12 is added in float16, where it rounds to 0 (the smallest positive float16 is 5.96e-08): a constant row gives 0 / 0 = NaN',
        'Found 2 findings: 1 error, 1 warning.',
    ],
    'N19_gemma_offset_ckpt': [
        "model.py:23:1: NC101 [error] layers.0-1.input_layernorm (2 modules): checkpoint gains are centred near 0 (mean -0.00879..-0.00558, std 0.0529..0.0545, 50..56% negative), the layout of a (1 + weight) norm such as Gemma's, but RMSNorm scales by weight: its output is multiplied by ~0 and flips sign feature by feature",
        "model.py:25:1: NC101 [error] layers.0-1.post_attention_layernorm (2 modules): checkpoint gains are centred near 0 (mean -0.00769..0.00437, std 0.0431..0.0441, 41..59% negative), the layout of a (1 + weight) norm such as Gemma's, but RMSNorm scales by weight: its output is multiplied by ~0 and flips sign feature by feature",
        "model.py:42:1: NC101 [error] norm: checkpoint gains are centred near 0 (mean 0.000689, std 0.0445, 50% negative), the layout of a (1 + weight) norm such as Gemma's, but RMSNorm scales by weight: its output is multiplied by ~0 and flips sign feature by feature",
        'Found 5 findings (3 lines, grouped by layer): 5 errors.',
    ],
    'N23_unbiased_std_ln': [
        "model.py:16:1: NT103 [warning] layers.0-1.norm (2 modules): layers.0-1.norm (HandLayerNorm) normalises by the unbiased (Bessel-corrected, divide by N-1) variance: LayerNorm: (x - mean) / (sqrt(var_unbiased) + eps) * w + b over [feature]. The layer-norm paper and nn.LayerNorm divide by N: with N=16 every output is 0.9682 times nn.LayerNorm's, so weights trained with one do not reproduce the other exactly",
        "model.py:16:1: NT103 [warning] norm: norm (HandLayerNorm) normalises by the unbiased (Bessel-corrected, divide by N-1) variance: LayerNorm: (x - mean) / (sqrt(var_unbiased) + eps) * w + b over [feature]. The layer-norm paper and nn.LayerNorm divide by N: with N=16 every output is 0.9682 times nn.LayerNorm's, so weights trained with one do not reproduce the other exactly",
        'model.py:16:1: NT104 [warning] layers.0-1.norm, norm (3 modules): layers.0-1.norm, norm (HandLayerNorm) adds eps to the standard deviation instead of the variance: LayerNorm: (x - mean) / (sqrt(var_unbiased) + eps) * w + b over [feature]. nn.LayerNorm computes 1/sqrt(var + eps); the two differ wherever the variance is near eps (near-constant rows), and the same eps value means a different amount of damping',
        'Found 6 findings (3 lines, grouped by layer): 6 warnings.',
    ],
    'N26_t5_rms_control': [
        'model.py:22:1: NT101 [info] block.0-2.layer_norm (3 modules): T5StyleLayerNorm is named like a LayerNorm but computes RMSNorm: x / sqrt(mean(x^2) + eps) * w over [feature]. This is the function the model was trained with: keep it, and do not replace the class by nn.LayerNorm',
        'model.py:35:1: NT101 [info] final_layer_norm: T5StyleLayerNorm is named like a LayerNorm but computes RMSNorm: x / sqrt(mean(x^2) + eps) * w over [feature]. This is the function the model was trained with: keep it, and do not replace the class by nn.LayerNorm',
        'Found 4 findings (2 lines, grouped by layer): 4 info.',
    ],
    'N27_bn_batch1': [
        'model.py:7:1: NB101 [error] 1: BatchNorm1d is trained with a micro-batch of 1: PyTorch raises in training: Expected more than 1 value per channel when training, got input size torch.Size([1, 128]); its batch statistics describe one example, not the data, and differ from the running statistics used in eval',
        'Found 1 finding: 1 error.',
    ],
}

_FLAGS = {"--config": "config", "--checkpoint": "checkpoint", "--dtype": "dtype"}
MANIFEST = yaml.safe_load((CASES / "manifest.yaml").read_text())["cases"] if CASES.is_dir() else {}


def test_every_reference_case_has_expected_lines():
    assert sorted(EXPECTED) == sorted(name for name, spec in MANIFEST.items() if "exit" not in spec)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_concise_reference_case(name, rules, monkeypatch):
    spec = MANIFEST[name]
    monkeypatch.chdir(CASES / name)
    args = [str(a) for a in spec.get("args", [])]
    options = {_FLAGS[flag]: value for flag, value in zip(args[::2], args[1::2])}
    report = audit_file("model.py", rules, **options)
    assert concise.render(report).splitlines() == EXPECTED[name]


# ----------------------------------------- findings repeated over layers: grouped, ranges, counts, summary
def _batch_probe_findings(tmp_path):
    """NB108 as the batch probe writes it: one finding per layer at one line, measured values differing."""
    src = SourceLocation(file=str(tmp_path / "models" / "gpt.py"), line=5)
    measured = [("0.104", "3.82"), ("0.0873", "4.19")]
    return [Finding(rule_id="NB108", rule_name="batchnorm-couples-examples", category="batchnorm", severity="info",
                    module=f"layers.{i}.b1",
                    message=f"measured: with example 0 fixed and the other 3 examples changed, BatchNorm2d's output "
                            f"for example 0 changed by up to {change} in train mode (values up to {scale}): its "
                            f"training output depends on the rest of the batch", source=src)
            for i, (change, scale) in enumerate(measured)]


def test_concise_groups_measured_values_per_layer_as_ranges(report, tmp_path):
    report.findings = _batch_probe_findings(tmp_path)
    assert concise.render(report).splitlines() == [
        "models/gpt.py:5:1: NB108 [info] layers.0-1.b1 (2 modules): measured: with example 0 fixed and the other 3 "
        "examples changed, BatchNorm2d's output for example 0 changed by up to 0.0873..0.104 in train mode (values up "
        "to 3.82..4.19): its training output depends on the rest of the batch",
        "Found 2 findings (1 line, grouped by layer): 2 info.",
    ]


def test_findings_differing_in_words_or_at_other_lines_stay_apart(report, tmp_path):
    first, second = _batch_probe_findings(tmp_path)
    other_words = second.model_copy(update={"message": second.message.replace("train mode", "eval mode")})
    other_line = second.model_copy(update={"source": SourceLocation(file=first.source.file, line=6)})
    for pair in ([first, other_words], [first, other_line]):
        report.findings = pair
        lines = concise.render(report).splitlines()
        assert [ln.split(": measured")[0] for ln in lines[:-1]] == [
            "models/gpt.py:5:1: NB108 [info] layers.0.b1",
            f"models/gpt.py:{pair[1].source.line}:1: NB108 [info] layers.1.b1"]
        assert lines[-1] == "Found 2 findings: 2 info."


def test_merge_numbers_keeps_numbers_inside_names_and_words():
    assert text.merge_numbers(["h.0.ln eps 1e-05 at 1.5x", "h.0.ln eps 1e-06 at 1.5x"]) == "h.0.ln eps 1e-06..1e-05 at 1.5x"
    assert text.merge_numbers(["mean -0.00558, 50% negative", "mean -0.00879, 56% negative"]) == \
        "mean -0.00879..-0.00558, 50..56% negative"


def test_text_quiet_header_says_findings_and_entries(report, tmp_path):
    report.findings = _layers(tmp_path, 4) + [report.findings[0]]
    head = text.render(report, options=RenderOptions(quiet=True)).splitlines()[0]
    assert head == "ERRORS (5 findings in 2 entries)"
    report.findings = [report.findings[-1]]
    assert text.render(report, options=RenderOptions(quiet=True)).splitlines()[0] == "ERRORS (1)"


def test_summary_says_what_the_baseline_took_out(report, tmp_path):
    from normaudit.baseline import Baseline, BaselineEntry, apply_baseline, target_key

    key = target_key(report.target.path, tmp_path)
    entries = [BaselineEntry(target=key, rule_id=f.rule_id, module=f.module) for f in report.findings]
    all_in = apply_baseline(report, Baseline(findings=entries), tmp_path)
    assert concise.render(all_in).splitlines() == ["No new findings (3 in the baseline)."]
    assert "no new findings (3 in the baseline)" in text.render(all_in).splitlines()
    two_in = apply_baseline(report, Baseline(findings=entries[:2]), tmp_path)
    assert concise.render(two_in).splitlines()[-1] == "Found 1 new finding (2 in the baseline): 1 warning."
    assert concise.render(report).splitlines()[-1] == "Found 3 findings: 1 error, 1 warning, 1 info."


# ------------------------------------------------- size probe clause: one fault, one line (F2, wrongaxis)
def _wrong_axis_findings(tmp_path):
    """NL101 as the rule writes it for two blocks' LayerNorm over the sequence: the size probe ran the model
    once and it raised at blocks.0.n2, so blocks.1.n2 (never reached) has no probe clause."""
    src = SourceLocation(file=str(tmp_path / "models" / "gpt.py"), line=11)
    base = ("nn.LayerNorm(normalized_shape=[16], eps=1e-05) takes its statistics over (sequence) of an input laid "
            "out as (batch, feature, sequence)")
    clause = ("; size probe: at sequence 16->24 it raises: RuntimeError: Given normalized_shape=[16], expected "
              "input with shape [16], but got input of size torch.Size([2, 32, 24])")
    return [Finding(rule_id="NL101", rule_name="stats-over-batch-or-sequence", category="layout", severity="error",
                    module=f"blocks.{i}.n2", message=base + (clause if i == 0 else ""), source=src)
            for i in range(2)]


def test_size_probe_clause_on_one_block_does_not_split_the_group(report, tmp_path):
    report.findings = _wrong_axis_findings(tmp_path)
    assert concise.render(report).splitlines() == [
        "models/gpt.py:11:1: NL101 [error] blocks.0-1.n2 (2 modules): nn.LayerNorm(normalized_shape=[16], "
        "eps=1e-05) takes its statistics over (sequence) of an input laid out as (batch, feature, sequence); "
        "size probe (blocks.0.n2): at sequence 16->24 it raises: RuntimeError: Given normalized_shape=[16], "
        "expected input with shape [16], but got input of size torch.Size([2, 32, 24])",
        "Found 2 findings (1 line, grouped by layer): 2 errors.",
    ]


def test_size_probe_clause_shared_by_every_block_stays_unlabelled(tmp_path):
    first, second = _wrong_axis_findings(tmp_path)
    second = second.model_copy(update={"message": first.message})
    (group,) = text.group_findings([first, second])
    assert group.label == "blocks.0-1.n2" and group.message == first.message
    assert [f.module for f in group.findings] == ["blocks.0.n2", "blocks.1.n2"]
