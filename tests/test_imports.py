"""How a model file is imported: its folder stays on ``sys.path`` for the whole audit (imports inside
``build_model()``, ``__init__`` or ``forward`` find its siblings, as under plain Python), and a file inside a
package (``__init__.py`` beside it) is imported as part of that package, so relative imports work."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from normaudit.cli import main
from normaudit.loaders.pyfile import import_plan
from conftest import audit_file

LAZY = """\
import torch, torch.nn as nn
def build_model():
    import consts
    return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8, eps=consts.EPS))
def example_inputs(): return (torch.randn(2, 8),)
"""
DYNAMIC = """\
import importlib, torch, torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        eps = importlib.import_module("consts").EPS
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8, eps=eps)
    def forward(self, x):
        return self.ln(self.fc(x))
def build_model(): return Net()
def example_inputs(): return (torch.randn(2, 8),)
"""
IN_FORWARD = """\
import torch, torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8, eps=0.0)
    def forward(self, x):
        import consts
        return self.ln(self.fc(x) * consts.SCALE)
def build_model(): return Net()
def example_inputs(): return (torch.randn(2, 8),)
"""
PACKAGED = """\
import torch, torch.nn as nn
from .consts import EPS
def build_model(): return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8, eps=EPS))
def example_inputs(): return (torch.randn(2, 8),)
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _json(capsys, *argv: str) -> tuple[int, dict, str]:
    rc = main([*argv, "--format", "json", "--isolated", "--select", "NE103"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else {}), err


def _ne103(doc: dict) -> list[tuple[str, str, int]]:
    return [(f["module"], Path(os.path.relpath(f["source"]["file"])).as_posix(), f["source"]["line"])
            for f in doc["findings"] if f["rule_id"] == "NE103"]


@pytest.mark.parametrize("body, module, line", [(LAZY, "1", 4), (DYNAMIC, "ln", 7)],
                         ids=["import-in-build_model", "import_module-in-__init__"])
def test_sibling_import_inside_build_is_found_in_the_worker(tmp_path, monkeypatch, capsys, body, module, line):
    _tree(tmp_path, {"models/m.py": body, "models/consts.py": "EPS = 0.0\n"})
    monkeypatch.chdir(tmp_path)
    rc, doc, err = _json(capsys, "models/m.py")
    assert "error" not in err and rc == 1
    assert _ne103(doc) == [(module, "models/m.py", line)]
    assert doc["sites"][0]["eps"] == 0.0


def test_sibling_import_inside_forward_is_found_while_capturing(tmp_path, monkeypatch, capsys):
    _tree(tmp_path, {"models/m.py": IN_FORWARD, "models/consts.py": "SCALE = 2.0\n"})
    monkeypatch.chdir(tmp_path)
    rc, doc, err = _json(capsys, "models/m.py")
    assert "error" not in err and rc == 1
    assert _ne103(doc) == [("ln", "models/m.py", 6)]


def test_in_process_audit_keeps_then_restores_sys_path(tmp_path, rules):
    # A sibling name of its own: an in-process audit leaves its imports in sys.modules, which forked
    # workers of later tests would inherit.
    _tree(tmp_path, {"m.py": LAZY.replace("consts", "consts_in_process"), "consts_in_process.py": "EPS = 0.0\n"})
    before = list(sys.path)
    report = audit_file(tmp_path / "m.py", rules)
    assert [(f.module, f.source.line) for f in report.findings if f.rule_id == "NE103"] == [("1", 4)]
    assert sys.path == before


def test_package_file_with_relative_import_is_audited_by_path(tmp_path, monkeypatch, capsys):
    _tree(tmp_path, {"mypkg/__init__.py": "", "mypkg/consts.py": "EPS = 0.0\n", "mypkg/model.py": PACKAGED})
    monkeypatch.chdir(tmp_path)
    rc, doc, err = _json(capsys, "mypkg/model.py")
    assert "error" not in err and rc == 1
    assert _ne103(doc) == [("1", "mypkg/model.py", 3)]


def test_nested_package_parent_relative_and_lazy_sibling_imports(tmp_path, monkeypatch, capsys):
    model = """\
        import torch, torch.nn as nn
        from ..consts import EPS
        from . import layers
        def build_model():
            from .layers import width
            return nn.Sequential(nn.Linear(width(), 8), layers.norm(8, EPS))
        def example_inputs(): return (torch.randn(2, 8),)
        """
    layers = "import torch.nn as nn\ndef width(): return 8\ndef norm(d, eps): return nn.LayerNorm(d, eps=eps)\n"
    _tree(tmp_path, {"top/__init__.py": "", "top/consts.py": "EPS = 0.0\n", "top/sub/__init__.py": "",
                     "top/sub/layers.py": layers, "top/sub/model.py": model})
    plan = import_plan(tmp_path / "top/sub/model.py")
    assert (plan.module_name, plan.package) == ("top.sub.model", "top.sub")
    assert plan.search_paths == (str(tmp_path.resolve()), str((tmp_path / "top/sub").resolve()))
    monkeypatch.chdir(tmp_path)
    rc, doc, err = _json(capsys, "top/sub/model.py")
    assert "error" not in err and rc == 1
    assert _ne103(doc) == [("1", "top/sub/model.py", 6)]  # where the Sequential registers it


def test_loose_file_and_non_identifier_folder_are_not_packages(tmp_path):
    _tree(tmp_path, {"plain/m.py": "", "my-pkg/__init__.py": "", "my-pkg/m.py": ""})
    for folder in ("plain", "my-pkg"):
        plan = import_plan(tmp_path / folder / "m.py")
        assert plan.package is None and plan.module_name.startswith("normaudit_target_")
        assert plan.search_paths == (str((tmp_path / folder).resolve()),)


def test_add_noqa_on_package_file_writes_its_real_line(tmp_path, monkeypatch, capsys):
    _tree(tmp_path, {"mypkg/__init__.py": "", "mypkg/consts.py": "EPS = 0.0\n", "mypkg/model.py": PACKAGED})
    monkeypatch.chdir(tmp_path)
    assert main(["mypkg/model.py", "--isolated", "--select", "NE103", "--add-noqa"]) == 0
    capsys.readouterr()
    lines = (tmp_path / "mypkg/model.py").read_text().splitlines()
    assert lines[2].endswith("  # normaudit: ignore[NE103]")
    assert lines[:2] + lines[3:] == PACKAGED.splitlines()[:2] + PACKAGED.splitlines()[3:]
    rc, doc, err = _json(capsys, "mypkg/model.py")
    assert rc == 0 and _ne103(doc) == []


def test_package_name_taken_by_an_imported_module_says_so(tmp_path, monkeypatch, capsys):
    # A folder named like the standard library's json package, already imported: it cannot be imported by
    # name, so the file is loaded alone and a relative import fails with the reason.
    _tree(tmp_path, {"json/__init__.py": "", "json/consts.py": "EPS = 0.0\n", "json/model.py": PACKAGED})
    monkeypatch.chdir(tmp_path)
    rc = main(["json/model.py", "--isolated"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == ("normaudit: error: json/model.py:2: import failed: ImportError: attempted relative import with no "
                   f"known parent package (package 'json' is already imported from {sys.modules['json'].__file__})")


def test_cache_records_lazily_imported_sibling(tmp_path, monkeypatch, capsys):
    _tree(tmp_path, {"models/m.py": LAZY, "models/consts.py": "EPS = 0.0\n"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NORMAUDIT_NO_CACHE", raising=False)
    monkeypatch.setenv("NORMAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    rc, doc, _ = _json(capsys, "models/m.py")
    assert rc == 1 and _ne103(doc) == [("1", "models/m.py", 4)]
    entry = json.loads(next((tmp_path / "cache").rglob("*.json")).read_text())
    assert str((tmp_path / "models/consts.py").resolve()) in entry["imported"]
    (tmp_path / "models/consts.py").write_text("EPS = 1e-5\n")
    rc, doc, _ = _json(capsys, "models/m.py")
    assert rc == 0 and _ne103(doc) == [] and doc["sites"][0]["eps"] == 1e-5


def test_module_target_lazy_import_from_current_directory(tmp_path, monkeypatch, capsys):
    net = """\
        import torch, torch.nn as nn
        def build_model():
            from lazypkg import consts
            return nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8, eps=consts.EPS))
        def example_inputs(): return (torch.randn(2, 8),)
        """
    _tree(tmp_path, {"lazypkg/__init__.py": "", "lazypkg/consts.py": "EPS = 0.0\n", "lazypkg/net.py": net})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    rc, doc, err = _json(capsys, "lazypkg.net:build_model")
    assert "error" not in err and rc == 1
    assert _ne103(doc) == [("1", "lazypkg/net.py", 4)]


def test_model_file_the_package_imports_itself_runs_once(tmp_path, monkeypatch, capsys):
    model = PACKAGED + "open(__file__ + '.runs', 'a').write('run\\n')\n"
    _tree(tmp_path, {"selfpkg/__init__.py": "from .model import build_model\n", "selfpkg/consts.py": "EPS = 0.0\n",
                     "selfpkg/model.py": model})
    monkeypatch.chdir(tmp_path)
    rc, doc, err = _json(capsys, "selfpkg/model.py")
    assert rc == 1 and _ne103(doc) == [("1", "selfpkg/model.py", 3)]
    assert (tmp_path / "selfpkg/model.py.runs").read_text() == "run\n"


def test_package_root_comes_before_a_module_of_the_package_name_beside_the_file(tmp_path, monkeypatch, capsys):
    # top/shadow/model.py is top.shadow.model; the module top/shadow/top.py beside it must not hide package top.
    _tree(tmp_path, {"top/__init__.py": "", "top/shadow/__init__.py": "", "top/shadow/top.py": "",
                     "top/shadow/consts.py": "EPS = 0.0\n", "top/shadow/model.py": PACKAGED})
    assert import_plan(tmp_path / "top/shadow/model.py").search_paths == (
        str(tmp_path.resolve()), str((tmp_path / "top/shadow").resolve()))
    monkeypatch.chdir(tmp_path)
    rc, doc, err = _json(capsys, "top/shadow/model.py")
    assert "error" not in err and rc == 1
    assert _ne103(doc) == [("1", "top/shadow/model.py", 3)]
