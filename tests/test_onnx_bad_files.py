"""Broken and hostile ONNX files through the command line: each is exit 2 with exactly one
``normaudit: error:`` line naming the file and its cause, never a traceback, and never the file's own text
(a marker written into the model's names and doc strings must not appear). External data outside the model's
folder (a ``../`` location, an absolute one, a symbolic link) is refused naming both paths, before any tensor
is read; external data too short for a tensor it holds is refused even when that tensor is no norm's."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")

import onnx_builders as ob  # noqa: E402

from normaudit.cli import main  # noqa: E402

MARKER = "MARKER_FROM_THE_FILE"


def run(capsys, path: Path) -> str:
    """The one error line of ``normaudit PATH`` (asserting exit 2 and nothing else on stderr)."""
    rc = main([str(path), "--isolated"])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("normaudit: error: "), err
    assert MARKER not in err and "Traceback" not in err
    return lines[0][len("normaudit: error: "):]


def _good(tmp_path: Path, external: bool = False) -> Path:
    """A decoder whose graph name, doc string and node names carry :data:`MARKER`."""
    path = ob.decoder(tmp_path / "m.onnx", layers=2, external=external)
    model = onnx.load(str(path), load_external_data=False)
    model.doc_string = model.graph.doc_string = MARKER
    model.graph.name = MARKER
    for n in model.graph.node:
        n.name = f"{MARKER}/{n.name}"
    onnx.save_model(model, str(path))
    return path


def test_truncated_and_garbage_files(tmp_path, capsys):
    good = _good(tmp_path).read_bytes()
    for n, cut in enumerate((len(good) // 2, len(good) - 3, 7)):
        bad = tmp_path / f"cut{n}.onnx"
        bad.write_bytes(good[:cut])
        msg = run(capsys, bad)
        assert msg.startswith(f"{bad}: ") and ("cannot parse the ONNX model" in msg
                                               or "not a complete ONNX model" in msg), msg
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert run(capsys, tmp_path / "empty.onnx") == (
        f"{tmp_path / 'empty.onnx'}: not a complete ONNX model (a truncated or corrupt file?): it holds no graph")
    (tmp_path / "text.onnx").write_text(f"{MARKER} is not a protobuf\n")
    assert "cannot parse the ONNX model: not an ONNX protobuf" in run(capsys, tmp_path / "text.onnx")


def test_a_protobuf_that_is_not_a_model(tmp_path, capsys):
    """A GraphProto (and a NodeProto) written alone parse as a ModelProto of unknown fields: no graph."""
    model = onnx.load(str(_good(tmp_path)))
    for name, msg in (("graph", model.graph), ("node", model.graph.node[0])):
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(msg.SerializeToString())
        assert run(capsys, path).endswith("not a complete ONNX model (a truncated or corrupt file?): it holds no graph")


def test_a_node_reading_an_undefined_value_is_named_by_position(tmp_path, capsys):
    path = _good(tmp_path)
    model = onnx.load(str(path))
    model.graph.node[3].input[0] = MARKER
    onnx.save_model(model, str(path))
    assert run(capsys, path) == (
        f"{path}: not a complete ONNX model (a truncated or corrupt file?): node 3 of {len(model.graph.node)} "
        f"({model.graph.node[3].op_type}) reads a value no earlier node, initializer or graph input defines")


def _relocate(path: Path, location: str) -> None:
    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save_model(model, str(path))


def test_external_data_outside_the_folder_names_both_paths(tmp_path, capsys):
    path = _good(tmp_path, external=True)
    first = onnx.load(str(path), load_external_data=False).graph.initializer[0].name
    _relocate(path, "../secret.bin")
    assert run(capsys, path) == (
        f"{path}: tensor {first!r} names its external data '../secret.bin', that is "
        f"{str(tmp_path.parent / 'secret.bin')!r}, outside the model's folder {str(tmp_path)!r}: only a file "
        "inside the model's folder is read")
    _relocate(path, "/etc/passwd")
    assert "that is '/etc/passwd', outside the model's folder" in run(capsys, path)


def test_external_data_through_a_link_out_of_the_folder(tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    inside = tmp_path / "model"
    inside.mkdir()
    path = _good(inside, external=True)
    os.replace(inside / "m.onnx.data", outside / "m.onnx.data")
    os.symlink(outside / "m.onnx.data", inside / "m.onnx.data")
    msg = run(capsys, path)
    assert msg.startswith(f"{inside / 'm.onnx.data'}: cannot read the external data of tensor ")
    assert f"it is a symbolic link to {str(outside / 'm.onnx.data')!r}, outside the folder it was given in " \
           f"({str(inside)!r})" in msg


def test_truncated_external_data_is_refused_before_reading(tmp_path, capsys):
    """The data file cut short: the last tensor (the head's matrix, no norm's) no longer fits."""
    path = _good(tmp_path, external=True)
    data = tmp_path / "m.onnx.data"
    size = data.stat().st_size
    os.truncate(data, size - 4)
    msg = run(capsys, path)
    assert msg.startswith(f"{data}: external data of tensor ") and msg.endswith(
        f"expected, the file has {size - 4} bytes")
    assert " is truncated: " in msg


def test_external_data_missing(tmp_path, capsys):
    path = _good(tmp_path, external=True)
    (tmp_path / "m.onnx.data").unlink()
    msg = run(capsys, path)
    assert msg.startswith(f"{tmp_path / 'm.onnx.data'}: cannot read the external data of tensor ")
    assert msg.endswith(": no such file or directory")


def test_a_name_that_is_not_utf8(tmp_path, capsys):
    """A node name whose bytes are no UTF-8 (protobuf returns it as bytes): refused by position."""
    path = _good(tmp_path)
    model = onnx.load(str(path))
    model.graph.node[2].name = "/layers/ZZZZ/x"
    data = model.SerializeToString()
    assert data.count(b"ZZZZ") == 1
    path.write_bytes(data.replace(b"ZZZZ", b"\xcb\xcb\xcb\xcb"))
    assert run(capsys, path) == (f"{path}: not a complete ONNX model (a truncated or corrupt file?): node 2 of "
                                 f"{len(model.graph.node)} has a name that is not UTF-8 text")
