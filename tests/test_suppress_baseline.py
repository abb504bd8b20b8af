"""Inline suppressions (``# normaudit: ignore[ID]``), unused suppressions (NK901) and baselines."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from normaudit.cli import main
from normaudit.suppress import parse_comment, scan_source

FIXTURES = Path(__file__).parent / "fixtures" / "cli"
RULES = ["--rules", str(FIXTURES / "rules"), "--isolated"]
LN = "        self.norm = nn.LayerNorm(d)"
RMS = "        self.final = nn.RMSNorm(d)"


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def audit(capsys, model: Path, *extra) -> tuple[int, dict]:
    rc, out, err = run(capsys, model, "--format", "json", "--select", "NZ,NK", *RULES, *extra)
    assert rc in (0, 1), err
    return rc, json.loads(out)


def found(doc: dict) -> list[tuple[str, str]]:
    return sorted((f["rule_id"], f["module"]) for f in doc["findings"])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.py"
    shutil.copy(FIXTURES / "tiny.py", path)
    return path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


# ---------------------------------------------------------------------------------------------- parsing
def test_comment_forms():
    assert parse_comment("# normaudit: ignore[NE101]") == ("normaudit: ignore[NE101]", ["NE101"])
    assert parse_comment("# noqa: E501  # normaudit: ignore[NE101,NL101]")[1] == ["NE101", "NL101"]
    assert parse_comment("#normaudit:ignore[ eps-differs-from-config ]")[1] == ["eps-differs-from-config"]
    assert parse_comment("# normaudit: ignore")[1] is None
    assert parse_comment("# normaudit: ignore[]")[1] is None
    assert parse_comment("# normaudit: ignored things") is None
    assert parse_comment("# see normaudit docs") is None


def test_a_comment_covers_its_line_and_a_multi_line_call_it_closes_and_strings_do_not_count():
    src = ('x = "# normaudit: ignore[NE101]"\n'
           "norm = make(\n"
           "    8,\n"
           ")  # normaudit: ignore[NE101]\n"
           "layers = [make(8),  # normaudit: ignore\n"
           "          make(8)]\n")
    idx = scan_source(src)
    assert [(s.line, s.codes) for s in idx.suppressions] == [(4, ["NE101"]), (5, None)]
    assert [s.line for s in idx.covering(2)] == [4] and [s.line for s in idx.covering(4)] == [4]
    assert [s.line for s in idx.covering(5)] == [5]
    assert idx.covering(1) == [] and idx.covering(3) == [] and idx.covering(6) == []


# ----------------------------------------------------------------------------------------- suppressions
def test_suppression_by_id_list_and_bare(capsys, model):
    rc, doc = audit(capsys, model)
    assert found(doc) == [("NZ001", "layers.0.norm"), ("NZ001", "layers.1.norm"), ("NZ002", "final")]
    edit(model, LN, LN + "  # normaudit: ignore[NZ001]")
    rc, doc = audit(capsys, model)
    assert found(doc) == [("NZ002", "final")]
    assert "suppressed 2 finding(s): 2 by '# normaudit: ignore' comments" in doc["notes"]
    assert doc["summary"]["errors"] == 0 and rc == 0
    edit(model, RMS, RMS + "  # normaudit: ignore")
    rc, doc = audit(capsys, model)
    assert found(doc) == [] and "suppressed 3 finding(s): 3 by '# normaudit: ignore' comments" in doc["notes"]


def test_suppression_by_rule_name_and_several_ids(capsys, model):
    edit(model, LN, LN + "  # normaudit: ignore[test-layernorm]")
    edit(model, RMS, RMS + "  # normaudit: ignore[NZ001, NZ002]")
    rc, doc = audit(capsys, model)
    # NZ001 in the second comment matched nothing: reported, pointing at that comment
    assert found(doc) == [("NK901", "final")]
    (unused,) = doc["findings"]
    assert unused["severity"] == "info" and unused["source"]["line"] == 24
    assert unused["message"] == "unused suppression '# normaudit: ignore[NZ001, NZ002]': NZ001 matched no finding"
    assert unused["fix"] == "remove NZ001 from the comment"


def test_suppression_on_the_construction_line_of_a_hand_written_norm(capsys, tmp_path):
    """A norm computed by hand inside a module's forward belongs to that module: a comment where the module
    is constructed suppresses it."""
    path = tmp_path / "hand.py"
    path.write_text("import torch\nfrom torch import nn\n\n\n"
                    "class MyRMSNorm(nn.Module):\n"
                    "    def __init__(self, d, eps=1e-6):\n"
                    "        super().__init__()\n"
                    "        self.weight = nn.Parameter(torch.ones(d))\n"
                    "        self.eps = eps\n\n"
                    "    def forward(self, x):\n"
                    "        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight\n\n\n"
                    "class M(nn.Module):\n"
                    "    def __init__(self):\n"
                    "        super().__init__()\n"
                    "        self.fc = nn.Linear(8, 8)\n"
                    "        self.a = MyRMSNorm(8)  # normaudit: ignore[NZ002]\n"
                    "        self.b = MyRMSNorm(8)\n\n"
                    "    def forward(self, x):\n"
                    "        return self.b(self.a(self.fc(x)))\n\n\n"
                    "def build_model():\n    return M()\n\n\n"
                    "def example_inputs():\n    return (torch.randn(2, 8),)\n")
    rc, doc = audit(capsys, path)
    assert sorted((s["module"], s["kind"]) for s in doc["sites"]) == [("a", "RMSNorm"), ("b", "RMSNorm")]
    assert found(doc) == [("NZ002", "b")]


def test_unused_and_unknown_suppressions_are_info_findings(capsys, model):
    edit(model, RMS, RMS + "  # normaudit: ignore[NZ001, NX999]")
    edit(model, "        self.emb = nn.Embedding(50, d)", "        self.emb = nn.Embedding(50, d)  # normaudit: ignore")
    rc, doc = audit(capsys, model)
    unused = {f["source"]["line"]: f for f in doc["findings"] if f["rule_id"] == "NK901"}
    assert set(unused) == {22, 24}
    assert unused[22]["message"] == "'# normaudit: ignore' suppresses no finding"
    assert unused[22]["fix"] == "remove the comment" and unused[22]["module"] == ""
    assert unused[24]["message"] == ("unused suppression '# normaudit: ignore[NZ001, NX999]': NZ001 matched no finding; "
                                     "NX999 is not a rule")
    # a rule left out of the run is not reported as unused; an unknown id still is
    rc, doc = audit(capsys, model, "--select", "NZ002,NK")
    assert [f["message"] for f in doc["findings"] if f["rule_id"] == "NK901" and f["source"]["line"] == 24] == [
        "unused suppression '# normaudit: ignore[NZ001, NX999]': NX999 is not a rule"]
    # NK901 can itself be ignored
    rc, doc = audit(capsys, model, "--ignore", "NK901")
    assert not [f for f in doc["findings"] if f["rule_id"] == "NK901"]


def _no_final_norm(model: Path) -> None:
    """``final`` registered but never applied: NP101 (no final norm), about the model as a whole (no line of
    its own), shown at ``class Tiny`` (line 19), and NP107 (unused norm), at ``final``'s constructor (line 24)."""
    edit(model, "        return self.final(h)", "        return h")


def _model_findings(capsys, target, *extra) -> dict:
    rc, out, err = run(capsys, target, "--format", "json", "--isolated", "--select", "NP101,NP107,NE,NK", *extra)
    assert rc in (0, 1), err
    return json.loads(out)


def test_model_level_findings_are_suppressed_on_the_class_line(capsys, model):
    _no_final_norm(model)
    doc = _model_findings(capsys, model)
    assert found(doc) == [("NP101", "layers.1"), ("NP107", "final")]
    sources = {f["rule_id"]: f["source"] for f in doc["findings"]}
    assert sources["NP101"] is None and sources["NP107"]["line"] == 24
    edit(model, "class Tiny(nn.Module):", "class Tiny(nn.Module):  # normaudit: ignore[NP101]")
    doc = _model_findings(capsys, model)
    assert found(doc) == [("NP107", "final")]
    assert "suppressed 1 finding(s): 1 by '# normaudit: ignore' comments" in doc["notes"]
    edit(model, "ignore[NP101]", "ignore[NP101, NE101, NP107]")
    doc = _model_findings(capsys, model)
    # NE101 and NP107 have lines of their own (a site's, the unused norm's constructor): on the class line
    # they match nothing, NK901 says so, and NP107 stays
    assert found(doc) == [("NK901", ""), ("NP107", "final")]
    (unused,) = [f for f in doc["findings"] if f["rule_id"] == "NK901"]
    assert unused["source"]["line"] == 19
    assert unused["message"] == ("unused suppression '# normaudit: ignore[NP101, NE101, NP107]': "
                                 "NE101, NP107 matched no finding")
    edit(model, "ignore[NP101, NE101, NP107]", "ignore[NP101]")
    edit(model, RMS, RMS + "  # normaudit: ignore[NP107]")
    doc = _model_findings(capsys, model)
    assert found(doc) == [] and "suppressed 2 finding(s): 2 by '# normaudit: ignore' comments" in doc["notes"]


def test_model_level_suppression_on_the_factory_line(capsys, model):
    """The model class defined in another file: the factory's ``def`` line is where the finding is shown."""
    _no_final_norm(model)
    target = model.parent / "factory.py"
    target.write_text("from tiny import Tiny, example_inputs  # noqa: F401\n\n\n"
                      "def build_model():  # normaudit: ignore\n    return Tiny()\n")
    doc = _model_findings(capsys, target)
    # NP101 is shown at the factory line and suppressed there; NP107 has its own line, in tiny.py
    assert found(doc) == [("NP107", "final")]
    assert "suppressed 1 finding(s): 1 by '# normaudit: ignore' comments" in doc["notes"]
    edit(target, "  # normaudit: ignore", "")
    doc = _model_findings(capsys, target)
    assert found(doc) == [("NP101", "layers.1"), ("NP107", "final")]
    rc, out, _ = run(capsys, target, "--format", "concise", "--isolated", "--select", "NP101,NP107,NE,NK")
    assert any(line.startswith(f"{target}:4:1: NP101 [warning] layers.1: ")  # shown where it is suppressed
               for line in out.splitlines())


# -------------------------------------------------------------------------------------------- baselines
def test_baseline_round_trip(capsys, model, tmp_path):
    baseline = tmp_path / "normaudit-baseline.json"
    rc, out, err = run(capsys, model, "--select", "NZ", *RULES, "--write-baseline", baseline)
    assert rc == 0 and "wrote 3 finding(s) to the baseline" in err
    data = json.loads(baseline.read_text())
    assert data["findings"] == [
        {"target": "tiny.py", "rule_id": "NZ001", "module": "layers.0.norm", "count": 1},
        {"target": "tiny.py", "rule_id": "NZ001", "module": "layers.1.norm", "count": 1},
        {"target": "tiny.py", "rule_id": "NZ002", "module": "final", "count": 1}]
    assert set(data) == {"tool", "baseline_version", "findings"}  # no line numbers, no messages

    rc, doc = audit(capsys, model, "--baseline", baseline)
    assert rc == 0 and doc["findings"] == []
    assert "3 finding(s) matched the baseline and are not reported" in doc["notes"]

    # lines move: still the same findings
    model.write_text("# a new header comment\n\n" + model.read_text())
    assert audit(capsys, model, "--baseline", baseline)[0] == 0

    # a new fault: a third block -> only its finding is reported, exit 1
    edit(model, "def __init__(self, d=8, n=2):", "def __init__(self, d=8, n=3):")
    rc, doc = audit(capsys, model, "--baseline", baseline)
    assert rc == 1 and found(doc) == [("NZ001", "layers.2.norm")]
    assert doc["summary"]["errors"] == 1 and doc["summary"]["warnings"] == 0

    # a fixed fault: the stale entry is noted
    edit(model, "        self.final = nn.RMSNorm(d)", "        self.final = nn.Identity()")
    rc, doc = audit(capsys, model, "--baseline", baseline)
    assert "1 baselined finding(s) no longer occur: refresh the baseline with --write-baseline" in doc["notes"]


def test_baseline_from_settings_and_from_another_directory(capsys, model, tmp_path, monkeypatch):
    rc, _, _ = run(capsys, model, "--select", "NZ", *RULES, "--write-baseline", tmp_path / "base.json")
    (tmp_path / "normaudit.toml").write_text('targets = ["tiny.py"]\nbaseline = "base.json"\nselect = ["NZ"]\n'
                                             f'rules = ["{FIXTURES / "rules"}"]\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    rc, out, err = run(capsys, "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["findings"] == []
