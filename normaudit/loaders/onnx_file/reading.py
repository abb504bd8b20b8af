"""Opening an ONNX file as an :class:`~normaudit.loaders.onnx_file.graph.OnnxGraph`: the file read through
:mod:`normaudit.loaders.safe_read`, parsed with the ``onnx`` package without external data
(``load_external_data=False``: the tensor table only), checked for the structure a truncated or corrupt file
lacks, model-local functions inlined (``onnx.inliner``), and shapes inferred (``onnx.shape_inference``).

The ``onnx`` package is the optional extra ``normaudit[onnx]``; without it an ONNX target is refused with the
install hint (:func:`require_onnx`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from normaudit.errors import UsageError
from normaudit.loaders.onnx_file.graph import OnnxGraph
from normaudit.loaders.safe_read import read_regular

#: protobuf's own limit on one message: an ONNX file over 2 GiB cannot be parsed (weights go to external data)
MAX_MODEL_BYTES = 2 ** 31 - 1
#: what to run when the ``onnx`` package is missing
INSTALL_HINT = "pip install 'normaudit[onnx]'"


def require_onnx(path: str) -> Any:
    """The ``onnx`` module; UsageError naming ``path`` and the install hint when it is not installed."""
    try:
        import onnx
    except ImportError:
        raise UsageError(f"auditing an ONNX file needs the onnx package, which is not installed: {INSTALL_HINT}",
                         file=path) from None
    return onnx


def _parse(data: bytes, path: str) -> Any:
    """The ``ModelProto`` in ``data``; UsageError for bytes that are no ONNX protobuf."""
    import onnx

    try:
        # parsing bytes reads no external data (onnx.load(path, load_external_data=False) does the same)
        model = onnx.ModelProto.FromString(data)
    except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError, RuntimeWarning or ValueError
        detail = " ".join(str(err).split())[:160] or type(err).__name__
        raise UsageError(f"cannot parse the ONNX model: not an ONNX protobuf, or a truncated or corrupt one "
                         f"({detail})", file=path) from None
    return model


def check_structure(model: Any, path: str) -> None:
    """Refuse a model a truncated or corrupt file leaves: no graph, no opset, no outputs, or a node (or graph
    output) reading a value no earlier node, initializer or graph input defines (ONNX graphs are topologically
    sorted). Raises UsageError naming the file and the first such value."""
    what = "not a complete ONNX model (a truncated or corrupt file?)"
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise UsageError(f"{what}: it holds no graph", file=path)
    if not model.opset_import:
        raise UsageError(f"{what}: it declares no opset (opset_import is empty)", file=path)
    if not model.graph.output:
        raise UsageError(f"{what}: its graph has no outputs", file=path)
    defined = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    defined |= {s.values.name for s in model.graph.sparse_initializer}
    _check_text(model, path)
    count = len(model.graph.node)
    for i, node in enumerate(model.graph.node):
        for v in node.input:
            if v and v not in defined:
                raise UsageError(f"{what}: node {i} of {count}{_op_label(node.op_type)} reads a value no earlier "
                                 "node, initializer or graph input defines", file=path)
        defined.update(v for v in node.output if v)
    for j, out in enumerate(model.graph.output):
        if out.name not in defined:
            raise UsageError(f"{what}: graph output {j} of {len(model.graph.output)} is defined by no node",
                             file=path)


def _check_text(model: Any, path: str) -> None:
    """Refuse names that are not UTF-8 text (the ONNX format's strings are; protobuf hands a corrupt one over
    as bytes): of the nodes (name, operator, domain, inputs, outputs, metadata), the tensors, the graph's
    inputs and outputs, and the graph itself. The UsageError says where, never what."""
    what = "not a complete ONNX model (a truncated or corrupt file?)"
    graph = model.graph

    def texts(*values: Any) -> bool:
        return all(isinstance(v, str) for v in values)

    if not texts(graph.name, model.producer_name, model.producer_version, model.domain):
        raise UsageError(f"{what}: the model's or graph's name is not UTF-8 text", file=path)
    for i, node in enumerate(graph.node):
        if not texts(node.name, node.op_type, node.domain, *node.input, *node.output,
                     *(v for p in node.metadata_props for v in (p.key, p.value))):
            raise UsageError(f"{what}: node {i} of {len(graph.node)} has a name that is not UTF-8 text", file=path)
    for kind, items in (("initializer", graph.initializer), ("graph input", graph.input),
                        ("graph output", graph.output), ("value_info entry", graph.value_info)):
        for i, item in enumerate(items):
            if not texts(item.name):
                raise UsageError(f"{what}: {kind} {i} of {len(items)} has a name that is not UTF-8 text", file=path)
    for i, t in enumerate(graph.initializer):
        if not texts(*(v for e in t.external_data for v in (e.key, e.value))):
            raise UsageError(f"{what}: initializer {i} of {len(graph.initializer)} names its external data in "
                             "bytes that are not UTF-8 text", file=path)


def _op_label(op_type: str) -> str:
    """`` (Add)`` for an operator name that is a short identifier; nothing else of a corrupt file's bytes is
    put in a message (names and values are the file's text)."""
    return f" ({op_type})" if op_type.isidentifier() and op_type.isascii() and len(op_type) <= 40 else ""


def _inline(model: Any, path: str) -> Any:
    """``model`` with its model-local functions inlined (exporters may wrap a module's ops in one)."""
    if not model.functions:
        return model
    from onnx import inliner

    try:
        return inliner.inline_local_functions(model)
    except Exception as err:  # noqa: BLE001 - the inliner raises on malformed functions
        raise UsageError(f"cannot inline the model's local functions (corrupt file?): {type(err).__name__}",
                         file=path) from None


def _infer(model: Any, notes: list[str]) -> tuple[Any, bool]:
    """``model`` with inferred shapes (``onnx.shape_inference.infer_shapes``, lenient: no type check, no
    strict mode); the model as it is, and a note, where inference fails."""
    from onnx import shape_inference

    try:
        return shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True), True
    except Exception as err:  # noqa: BLE001 - InferenceError, or a protobuf error of a hostile model
        notes.append(f"ONNX shape inference failed ({' '.join(str(err).split())[:160]}): shapes and dtypes are "
                     "those the file records")
        return model, False


def open_onnx(path: str | Path) -> OnnxGraph:
    """Read and check the ONNX model at ``path`` (see the module docstring), external data left unread.

    Raises UsageError naming the file: the onnx package missing, not a regular file, over 2 GiB, not an ONNX
    protobuf, or not a complete graph (:func:`check_structure`)."""
    p = str(path)
    require_onnx(p)
    data = read_regular(p, "ONNX model", max_bytes=MAX_MODEL_BYTES)
    model = _parse(data, p)
    check_structure(model, p)
    if model.functions:
        model = _inline(model, p)
        _check_text(model, p)  # the nodes the functions held
    notes: list[str] = []
    model, inferred = _infer(model, notes)
    return OnnxGraph(Path(p), model, file_bytes=len(data), inferred=inferred, notes=notes)


def onnx_target(path: str | Path) -> Any:
    """An ONNX file given as the audit's TARGET: a :class:`normaudit.loaders.ModelUnderAudit` of kind ``onnx``
    with no PyTorch model; the audit opens the file itself (:func:`open_onnx`, in ``normaudit.audit_onnx``), so
    a missing package or an unreadable file is a UsageError there."""
    from normaudit.loaders.model import ModelUnderAudit

    p = Path(path)
    require_onnx(str(p))
    return ModelUnderAudit(model=None, inputs=(), on_meta=False, kind="onnx", file=str(p), weights=[p.name])
