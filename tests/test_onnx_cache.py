"""The result cache of an ONNX target keys the files beside it: a model whose external data changed (the
``.onnx`` file itself byte for byte the same) is audited again, not answered with the stored report."""
from __future__ import annotations

import json

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import onnx_builders as ob  # noqa: E402

from normaudit import cache as cache_mod  # noqa: E402
from normaudit.cli import main  # noqa: E402


def test_changed_external_data_is_a_cache_miss(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NORMAUDIT_NO_CACHE", raising=False)
    monkeypatch.setenv("NORMAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_mod, "source_digest", lambda: "fixed")
    (tmp_path / "m").mkdir()
    path = ob.decoder(tmp_path / "m" / "model.onnx", layers=2, external=True)
    graph = path.read_bytes()

    def nc103() -> list[str]:
        rc = main([str(path), "--isolated", "--format", "json", "--select", "NC103"])
        out = capfd.readouterr().out
        assert rc in (0, 1)
        return [f["module"] for f in json.loads(out)["findings"]]

    assert nc103() == [] and nc103() == []
    assert list((tmp_path / "cache").rglob("*.json")), "the first run stored its report"
    model = onnx.load(str(path), load_external_data=False)
    (gain,) = [t for t in model.graph.initializer if t.name == "norm.weight"]
    offset = int({e.key: e.value for e in gain.external_data}["offset"])
    with open(tmp_path / "m" / "model.onnx.data", "r+b") as f:  # norm.weight[5] = NaN, in place
        f.seek(offset + 5 * 4)
        f.write(np.array([np.nan], np.float32).tobytes())
    assert path.read_bytes() == graph  # only model.onnx.data differs
    assert nc103() == ["norm"]
