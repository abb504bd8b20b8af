"""``--add-noqa`` (normaudit/noqa.py): comments where the suppressor looks, merged with existing ones, the
file otherwise byte-identical, installed packages never touched."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from torch.nn.modules import normalization

from normaudit.cli import main
from normaudit.noqa import add_noqa, edit_source, split_lines
from normaudit.report import SourceLocation
from tests.conftest import audit_file

MODEL = '''# -*- coding: latin-1 -*-
"""Round-trip fixture for --add-noqa (caf\xe9): a latin-1 file with CRLF line endings."""
import torch
from torch import nn

from helpers import make_norm


class Net(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.config = {"layer_norm_eps": 1e-6}
        self.a = nn.LayerNorm(d, eps=1e-6)
        self.b = nn.LayerNorm(d)  # a note about b
        self.c = nn.LayerNorm(d, eps=0.0)  # normaudit: ignore[NE101]
        self.d = nn.LayerNorm(d, \\
                              eps=1e-5)
        self.e = nn.Sequential(
            nn.Linear(d, d),
            nn.LayerNorm(d),
        )
        self.f = make_norm(d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        x = x + self.proj(self.a(x))
        x = x + self.proj(self.b(x))
        x = x + self.proj(self.c(x))
        x = x + self.proj(self.d(x))
        x = x + self.e(x)
        return self.f(x)


def build_model():
    return Net()


def example_inputs():
    return (torch.randn(2, 4, 16),)
'''
HELPERS = "from torch import nn\n\n\ndef make_norm(d):\n    return nn.LayerNorm(d, eps=1e-3)\n"
#: line -> the line after --add-noqa (1-based, without the CRLF)
EXPECTED = {
    14: '        self.b = nn.LayerNorm(d)  # a note about b  # normaudit: ignore[NE101]',
    15: '        self.c = nn.LayerNorm(d, eps=0.0)  # normaudit: ignore[NE101, NE103]',
    17: '                              eps=1e-5)  # normaudit: ignore[NE101]',
    20: '            nn.LayerNorm(d),  # normaudit: ignore[NE101]',
    22: '        self.f = make_norm(d)  # normaudit: ignore[NE101]',
}
ARGS = ["--isolated", "--select", "NE", "--fail-on", "info"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A model file in latin-1 with CRLF endings, and a helper module beside it."""
    (tmp_path / "model.py").write_bytes(MODEL.replace("\n", "\r\n").encode("latin-1"))
    (tmp_path / "helpers.py").write_text(HELPERS)
    return tmp_path / "model.py"


def _findings(doc: dict) -> list[tuple[str, str, int]]:
    return sorted((f["rule_id"], f["module"], f["source"]["line"]) for f in doc["findings"])


def test_add_noqa_round_trip(capsys, project):
    before = project.read_bytes()
    report = project.parent / "before.json"
    # every finding gets suppressed, so nothing is left to fail on: exit 0; the report is the audit's
    assert main([str(project), "--add-noqa", "--format", "json", "-o", str(report), *ARGS]) == 0
    assert _findings(json.loads(report.read_text())) == [
        ("NE101", "b", 14), ("NE101", "d", 16), ("NE101", "e.1", 20), ("NE101", "f", 22), ("NE103", "c", 15)]
    err = capsys.readouterr().err
    assert "normaudit: added 5 suppression comment(s) for 5 finding(s) in 1 file(s)" in err
    after = project.read_bytes()
    old_lines, new_lines = before.split(b"\r\n"), after.split(b"\r\n")
    assert len(old_lines) == len(new_lines)
    for i, (old, new) in enumerate(zip(old_lines, new_lines), 1):
        assert new == (EXPECTED[i].encode("latin-1") if i in EXPECTED else old), i
    assert after.startswith(b"# -*- coding: latin-1 -*-\r\n") and "caf\xe9".encode("latin-1") in after
    assert (project.parent / "helpers.py").read_text() == HELPERS
    assert main([str(project), "--format", "json", *ARGS]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"] == [] and "suppressed 6 finding(s): 6 by '# normaudit: ignore' comments" in doc["notes"]
    assert main([str(project), "--add-noqa", *ARGS]) == 0  # a second run changes nothing
    assert "added 0 suppression comment(s) for 0 finding(s) in 0 file(s)" in capsys.readouterr().err
    assert project.read_bytes() == after


def test_findings_outside_user_files_are_left(project):
    report = audit_file(project, select=["NE"])
    by_module = {f.module: f for f in report.findings}
    assert sorted(by_module) == ["b", "c", "d", "e.1", "f"]
    torch_file, yaml_file = Path(normalization.__file__), Path(yaml.__file__)
    installed = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (torch_file, yaml_file)}
    # in an installed package, about a module with no site: nowhere to write
    lib = [by_module[m].model_copy(update={"source": SourceLocation(file=str(p), line=3), "module": "lib.norm"})
           for m, p in (("b", torch_file), ("c", yaml_file))]
    # a checkpoint finding with no line (shown at the checkpoint file): nowhere to write
    lost = by_module["d"].model_copy(update={"source": None, "module": "not.a.site", "category": "checkpoint"})
    # in an installed package, but its module's site was constructed in the model file: that line
    via_site = by_module["e.1"].model_copy(update={"source": SourceLocation(file=str(torch_file), line=3)})
    report = report.model_copy(update={"findings": [*lib, lost, via_site]})
    before = project.read_bytes()
    result = add_noqa([(report, project)])
    assert [f.source.file if f.source else None for f in result.left] == [str(torch_file), str(yaml_file), None]
    assert result.findings == 1 and result.added == 1 and result.files == [str(project.resolve())]
    for p, (data, mtime) in installed.items():
        assert p.read_bytes() == data and p.stat().st_mtime_ns == mtime
    changed = [(i, new) for i, (old, new) in enumerate(zip(before.split(b"\r\n"), project.read_bytes().split(b"\r\n")), 1)
               if old != new]
    assert changed == [(20, EXPECTED[20].encode())]


def test_model_level_findings_go_on_the_class_line(project):
    """A finding about the model as a whole (no line of its own) is shown at ``class Net`` (line 9), so its
    comment goes there; a model whose class and factory are not in the target file has no such line."""
    report = audit_file(project, select=["NE"])
    whole = report.findings[0].model_copy(update={"source": None, "module": "", "rule_id": "NP101",
                                                  "category": "placement"})
    before = project.read_bytes()
    result = add_noqa([(report.model_copy(update={"findings": [whole]}), project)])
    assert result.findings == 1 and result.added == 1 and result.left == []
    changed = [(i, new) for i, (old, new) in enumerate(zip(before.split(b"\r\n"), project.read_bytes().split(b"\r\n")), 1)
               if old != new]
    assert changed == [(9, b"class Net(nn.Module):  # normaudit: ignore[NP101]")]
    elsewhere = report.model_copy(update={"findings": [whole], "model": report.model.model_copy(
        update={"class_name": "Other"}), "target": report.target.model_copy(update={"factory": "other"})})
    result = add_noqa([(elsewhere, project)])
    assert result.left == [whole] and result.added == 0


def test_add_noqa_round_trip_of_a_model_level_finding(capsys, tmp_path):
    path = tmp_path / "gpt.py"
    path.write_text(MODEL_NO_FINAL)
    args = [str(path), "--isolated", "--select", "NP101", "--fail-on", "info"]
    assert main([*args, "--format", "json"]) == 1
    assert [(f["rule_id"], f["module"], f["source"]) for f in json.loads(capsys.readouterr().out)["findings"]] == [
        ("NP101", "blocks.1", None)]
    assert main([*args, "--add-noqa"]) == 0
    assert "added 1 suppression comment(s) for 1 finding(s) in 1 file(s)" in capsys.readouterr().err
    assert path.read_text() == MODEL_NO_FINAL.replace("class GPT(nn.Module):",
                                                      "class GPT(nn.Module):  # normaudit: ignore[NP101]")
    assert main([*args, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []


MODEL_NO_FINAL = '''import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


class GPT(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.emb = nn.Embedding(32, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(2)])
        self.head = nn.Linear(d, 32)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return GPT()


def example_inputs():
    return (torch.randint(0, 32, (2, 8)),)
'''


def test_add_noqa_refuses_targets_not_on_disk(capsys, tmp_path):
    assert main(["json.decoder:JSONDecoder", "--add-noqa", "--isolated"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("normaudit: error: --add-noqa needs targets that are files or directories on disk, not "
                   "'json.decoder:JSONDecoder' (name the model file: path/to/model.py[:factory])")


def test_add_noqa_with_write_baseline_is_usage_error(capsys, project):
    before = project.read_bytes()
    rc = main([str(project), "--add-noqa", "--write-baseline", str(project.parent / "b.json"), "--isolated"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == ("normaudit: error: --add-noqa and --write-baseline are two ways to "
                                               "adopt normaudit: give one")
    assert project.read_bytes() == before and not (project.parent / "b.json").exists()


# ------------------------------------------------------------------------------------------ edit_source
@pytest.mark.parametrize("text, wanted, expected", [
    # a bare line, a line with another comment, an existing directive extended (its spelling kept)
    ("x = f(1)\n", {1: {"NE101"}}, "x = f(1)  # normaudit: ignore[NE101]\n"),
    ("x = f(1)   # keep me\n", {1: {"NE101"}}, "x = f(1)   # keep me  # normaudit: ignore[NE101]\n"),
    ("x = f(1)  # NormAudit: ignore[nl101]\n", {1: {"NE101", "NB101"}},
     "x = f(1)  # NormAudit: ignore[nl101, NB101, NE101]\n"),
    # already covered: a bare ignore, or every code listed -> unchanged
    ("x = f(1)  # normaudit: ignore\n", {1: {"NE101"}}, "x = f(1)  # normaudit: ignore\n"),
    ("x = f(1)  # normaudit: ignore[NE101]\n", {1: {"NE101"}}, "x = f(1)  # normaudit: ignore[NE101]\n"),
    # the last line without a newline, trailing blanks, CRLF, a lone CR, a form feed (no line break)
    ("a = 1\nx = f(1)", {2: {"NE101"}}, "a = 1\nx = f(1)  # normaudit: ignore[NE101]"),
    ("x = f(1)   \r\ny = 2\r\n", {1: {"NE101"}}, "x = f(1)  # normaudit: ignore[NE101]\r\ny = 2\r\n"),
    ("a = 1\rx = f(1)\r", {2: {"NE101"}}, "a = 1\rx = f(1)  # normaudit: ignore[NE101]\r"),
    ("\x0cx = f(1)\ny = 2\n", {2: {"NE101"}}, "\x0cx = f(1)\ny = 2  # normaudit: ignore[NE101]\n"),
    # a backslash continuation: after the call's closing parenthesis (suppress.py covers its first line)
    ("x = f(1, \\\n      2)\n", {1: {"NE101"}}, "x = f(1, \\\n      2)  # normaudit: ignore[NE101]\n"),
    # the first line of a call over several lines can take the comment itself
    ("x = f(\n    1,\n)\n", {1: {"NE101"}}, "x = f(  # normaudit: ignore[NE101]\n    1,\n)\n"),
    # '#' inside a string is not a comment
    ('x = f("# normaudit: ignore[NE101]")\n', {1: {"NE101"}},
     'x = f("# normaudit: ignore[NE101]")  # normaudit: ignore[NE101]\n'),
])
def test_edit_source(text, wanted, expected):
    new, written, unplaced = edit_source(text, wanted)
    assert new == expected
    assert written == (0 if new == text else 1) and unplaced == []


def test_edit_source_line_inside_a_string_is_unplaced():
    text = 'x = g("""a\nb""" + \\\n  "c")\n'
    new, written, unplaced = edit_source(text, {1: {"NE101"}, 2: {"NE103"}, 9: {"NE101"}})
    # line 1 ends inside a string: the comment follows the call it starts (line 3); line 2 starts no call
    assert new == 'x = g("""a\nb""" + \\\n  "c")  # normaudit: ignore[NE101]\n' and written == 1
    assert unplaced == [(2, "the line cannot take a comment (a continuation or inside a string)"),
                        (9, "no line 9: the file has 3 (changed since the audit?)")]


def test_split_lines_keeps_every_byte():
    text = "a\r\nb\rc\x0cd\ne"
    assert split_lines(text) == ["a\r\n", "b\r", "c\x0cd\n", "e"]
    assert "".join(split_lines(text)) == text
