"""normaudit.lazy_imports: the optional heavy imports transformers makes at start-up (boto3 through
accelerate, scipy.optimize through transformers.loss) run only when used, in normaudit's own process, and a
model that uses them gets the real thing."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from normaudit import lazy_imports
from normaudit.lazy_imports import Deferred, DeferredModule, defer

ROOT = Path(__file__).resolve().parents[1]

HEAVY = """\
import os
open(os.environ["HEAVY_MARKER"], "a").write("ran\\n")
def double(x):
    return 2 * x
VALUE = 7
"""


@pytest.fixture
def heavy_pkg(tmp_path, monkeypatch):
    """A package ``heavy_g7pkg`` with a submodule ``sub`` whose import writes a marker file."""
    pkg = tmp_path / "heavy_g7pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub.py").write_text(HEAVY)
    (tmp_path / "heavy_g7top.py").write_text(HEAVY)
    marker = tmp_path / "marker"
    monkeypatch.setenv("HEAVY_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield marker
    for name in ("heavy_g7pkg", "heavy_g7pkg.sub", "heavy_g7top"):
        sys.modules.pop(name, None)
        lazy_imports._CALLABLES.pop(name, None)


def test_plain_import_does_not_run_the_module_first_attribute_does(heavy_pkg):
    assert defer(Deferred("heavy_g7top"))
    import heavy_g7top

    assert type(heavy_g7top) is DeferredModule and not heavy_pkg.exists()
    assert heavy_g7top.__name__ == "heavy_g7top" and heavy_g7top.__spec__.name == "heavy_g7top"
    assert not heavy_pkg.exists()
    assert heavy_g7top.VALUE == 7
    assert heavy_pkg.read_text() == "ran\n"
    assert type(heavy_g7top) is type(os) and sys.modules["heavy_g7top"] is heavy_g7top
    assert heavy_g7top.double(4) == 8 and heavy_pkg.read_text() == "ran\n"  # ran once


def test_from_import_of_a_deferred_callable_imports_on_first_call(heavy_pkg):
    assert defer(Deferred("heavy_g7pkg.sub", ("double",)))
    from heavy_g7pkg.sub import double

    assert not heavy_pkg.exists() and double.__name__ == "double" and double.__module__ == "heavy_g7pkg.sub"
    assert double(21) == 42
    assert heavy_pkg.read_text() == "ran\n"
    import heavy_g7pkg.sub as sub

    assert type(sub) is type(os) and double.__wrapped__ is sub.double and sub.VALUE == 7
    # a name not in the table runs the module at the from-import, as without deferral
    sys.modules.pop("heavy_g7pkg.sub")
    sys.modules.pop("heavy_g7pkg")
    assert defer(Deferred("heavy_g7pkg.sub", ("double",)))
    from heavy_g7pkg.sub import VALUE

    assert VALUE == 7 and heavy_pkg.read_text() == "ran\nran\n"


def test_imported_missing_or_parent_imported_modules_are_left_alone(heavy_pkg):
    assert not defer(Deferred("json"))  # already imported
    assert not defer(Deferred("no_such_module_g7"))
    assert not defer(Deferred("no_such_module_g7.sub"))
    import heavy_g7pkg  # noqa: F401

    assert not defer(Deferred("heavy_g7pkg.sub"))  # its parent would not see it
    assert "heavy_g7pkg.sub" not in sys.modules


def test_table_names_the_two_start_up_imports():
    assert [(d.module, d.callables) for d in lazy_imports.DEFERRED] == [
        ("boto3", ()), ("scipy.optimize", ("linear_sum_assignment",)), ("trio", ())]
    assert all(d.reason for d in lazy_imports.DEFERRED)


#: In a fresh process: normaudit's runner prewarms for a Hugging Face config directory, then builds the model
#: there (what a forked worker does); prints which heavy modules ran, then uses boto3 and scipy for real.
PROBE = """\
import json, sys
from normaudit.runner import prewarm
from normaudit.loaders.hf import load_hf_target
prewarm([sys.argv[1]])
from pathlib import Path
mua = load_hf_target(Path(sys.argv[1]))
ran = sorted(m for m in ("boto3", "botocore", "scipy.optimize", "scipy.optimize._optimize", "scipy.linalg", "trio")
             if m in sys.modules and type(sys.modules[m]).__name__ == "module")
deferred = sorted(m for m, v in list(sys.modules.items()) if type(v).__name__ == "DeferredModule")
from transformers.loss import loss_for_object_detection as lod
import numpy as np
rows, cols = lod.linear_sum_assignment(np.array([[4, 1, 3], [2, 0, 5], [3, 2, 2]]))
import boto3
print(json.dumps({"ran": ran, "deferred": deferred, "model": type(mua.model).__name__,
                  "lsa": [rows.tolist(), cols.tolist()], "boto3": bool(boto3.__version__),
                  "after": type(sys.modules["boto3"]).__name__}))
"""


@pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("transformers", "boto3", "scipy", "accelerate")),
                    reason="needs transformers, accelerate, boto3 and scipy installed")
def test_hf_build_in_normaudits_process_runs_neither_and_both_still_work(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ran"] == [] and out["deferred"] == (["boto3", "scipy.optimize"]
                                                    + (["trio"] if importlib.util.find_spec("trio") else []))
    assert out["model"] == "LlamaModel"
    assert out["lsa"] == [[0, 1, 2], [1, 0, 2]]
    assert out["boto3"] and out["after"] == "module"


#: normaudit used as a library (run_audit in the caller's process) defers nothing.
LIBRARY = """\
import sys
from normaudit.audit import AuditOptions, run_audit
report = run_audit(AuditOptions(target=sys.argv[1]), None)
print(",".join(s.module for s in report.sites), sorted(m for m, v in list(sys.modules.items()) if type(v).__name__ == "DeferredModule"))
"""


def test_library_use_defers_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    tiny = ROOT / "tests" / "fixtures" / "cli" / "tiny.py"
    proc = subprocess.run([sys.executable, "-c", LIBRARY, str(tiny)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sites, deferred = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert sites == "layers.0.norm,layers.1.norm,final" and deferred == "[]"
