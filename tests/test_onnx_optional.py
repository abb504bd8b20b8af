"""The ``onnx`` package is the optional extra ``normaudit[onnx]``: without it an ONNX target is exit 2 with
the install hint, one line; ``import normaudit`` and ``normaudit --help`` import no onnx (start-up stays
cheap: the loader imports it only for an ONNX target), and the report schema lists the target kind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: normaudit's CLI with onnx made unimportable (None in sys.modules: ImportError), reporting what it imported
WITHOUT_ONNX = ("import sys; sys.modules['onnx'] = None; from normaudit.cli import main; rc = main(sys.argv[1:]); "
                "sys.stderr.write('ONNX=%s\\n' % type(sys.modules.get('onnx')).__name__); raise SystemExit(rc)")


def _run(code: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)


def test_an_onnx_target_without_the_package_names_the_extra(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x08\x09")  # never parsed: the package is asked for first
    proc = _run(WITHOUT_ONNX, str(path), "--isolated")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"normaudit: error: {path}: auditing an ONNX file needs the onnx package, which is not installed: "
        "pip install 'normaudit[onnx]'", "ONNX=NoneType"]


def test_import_and_help_import_no_onnx():
    code = ("import sys, normaudit, normaudit.loaders, normaudit.report; from normaudit.cli import main; "
            "rc = main(['--help']); sys.stderr.write('onnx imported: %s\\n' % ('onnx' in sys.modules)); "
            "raise SystemExit(rc)")
    proc = _run(code)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: normaudit")
    assert proc.stderr.splitlines()[-1] == "onnx imported: False", proc.stderr


def test_the_schema_lists_the_onnx_target_kind(capsys):
    from normaudit.cli import main

    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "onnx" in schema["$defs"]["TargetInfo"]["properties"]["kind"]["enum"]


def test_the_extra_is_declared():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(req.startswith("onnx>=") for req in project["optional-dependencies"]["onnx"])
    assert 'pip install --quiet ".[onnx]"' in (ROOT / ".ci" / "run").read_text()
