"""An indexed, read-only view of one ONNX graph: who produces and who reads each value, each value's dtype and
shape (as shape inference left them), the attributes of a node, and the constant a value holds where it is one
(an initializer or a ``Constant`` node, through ``Identity`` and ``Cast``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from normaudit.loaders.onnx_file.tensors import TensorStore, dtype_name

#: one dimension of a value's shape: a size, a symbolic name (``dim_param``: ``batch``), or None (unknown)
Dim = Union[int, str, None]
#: the ONNX domains of the standard operators
STANDARD_DOMAINS = ("", "ai.onnx")
#: operators whose output has their first input's shape (and dtype, but for Cast): where shape inference leaves
#: such an output unknown (the outputs of function operators such as GroupNormalization), it is copied
SHAPE_KEEPING = ("LayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization",
                 "BatchNormalization", "LpNormalization", "LRN", "Identity", "Dropout", "Cast", "Relu", "Gelu",
                 "Sigmoid", "Tanh", "Erf", "Softmax", "Neg", "Sqrt", "Reciprocal")


def _value_types(graph: Any) -> dict[str, tuple[Optional[str], Optional[list[Dim]]]]:
    """value name -> (dtype name, shape) from the graph's inputs, outputs, value_info and initializers."""
    out: dict[str, tuple[Optional[str], Optional[list[Dim]]]] = {}
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        tt = info.type.tensor_type if info.type.HasField("tensor_type") else None
        if tt is None:
            continue
        shape: Optional[list[Dim]] = None
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        out[info.name] = (dtype_name(tt.elem_type), shape)
    for t in graph.initializer:
        out[t.name] = (dtype_name(t.data_type), [int(d) for d in t.dims])
    return out


def _constant_tensor(node: Any) -> Any:
    """The value of a ``Constant`` node as a ``TensorProto`` named after its output, or None."""
    from onnx import helper, numpy_helper

    import numpy as np

    for a in node.attribute:
        if a.name == "value" and a.HasField("t"):
            return a.t
        value = helper.get_attribute_value(a)
        if a.name in ("value_float", "value_floats"):
            return numpy_helper.from_array(np.asarray(value, dtype=np.float32))
        if a.name in ("value_int", "value_ints"):
            return numpy_helper.from_array(np.asarray(value, dtype=np.int64))
    return None


class OnnxGraph:
    """The main graph of an ONNX model (see the module docstring).

    ``nodes``: the graph's nodes in their (topological) order; ``labels[i]``: node ``i``'s name, or
    ``OpType_i`` for an unnamed node; ``producer``: value -> index of the node writing it; ``consumers``:
    value -> indices of the nodes reading it; ``inputs``: the graph inputs that are no initializer;
    ``outputs``: the graph outputs; ``opsets``: domain -> opset version; ``store``: the tensors
    (:class:`~normaudit.loaders.onnx_file.tensors.TensorStore`); ``file_bytes``: bytes read from the ``.onnx``
    file; ``inferred``: shape inference ran; ``notes``: what the reader could not do.
    """

    def __init__(self, path: Path, model: Any, file_bytes: int, inferred: bool, notes: list[str]):
        self.path = path
        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.labels = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(self.nodes)]
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        tensors = {t.name: t for t in graph.initializer}
        for i, n in enumerate(self.nodes):
            for v in n.output:
                if v:
                    self.producer[v] = i
            for v in n.input:
                if v:
                    self.consumers.setdefault(v, []).append(i)
            if n.op_type == "Constant" and n.domain in STANDARD_DOMAINS and n.output and n.output[0]:
                t = _constant_tensor(n)
                if t is not None:
                    tensors[n.output[0]] = t
        self.store = TensorStore(path, tensors)
        self.store.check_external()
        self.types = _value_types(graph)
        self._fill_shapes()
        self.inputs = [i.name for i in graph.input if i.name not in tensors]
        self.outputs = [o.name for o in graph.output]
        self.opsets = {o.domain or "": int(o.version) for o in model.opset_import}
        self.file_bytes = file_bytes
        self.inferred = inferred
        self.notes = notes

    def _fill_shapes(self) -> None:
        """Copy the input's shape to the output of a :data:`SHAPE_KEEPING` node that inference left unknown."""
        for i, n in enumerate(self.nodes):
            if n.op_type not in SHAPE_KEEPING or not self.standard(i) or not n.input or not n.output:
                continue
            out, src = n.output[0], self.types.get(n.input[0])
            if not out or src is None or src[1] is None or self.types.get(out, (None, None))[1] is not None:
                continue
            to = self.number(n, "to", None) if n.op_type == "Cast" else None
            dtype = (dtype_name(to) if isinstance(to, int) else None) if n.op_type == "Cast" else src[0]
            self.types[out] = (self.types.get(out, (None, None))[0] or dtype, list(src[1]))

    @property
    def bytes_read(self) -> int:
        """Bytes read so far: the ``.onnx`` file and the external data of the tensors read."""
        return self.file_bytes + self.store.bytes_read

    def standard(self, i: int) -> bool:
        """Node ``i`` is a standard ONNX operator (the default domain)."""
        return self.nodes[i].domain in STANDARD_DOMAINS

    def op(self, value: str) -> Optional[str]:
        """The op type of the standard node producing ``value`` (None for an input, a tensor or a custom op)."""
        i = self.producer.get(value)
        return self.nodes[i].op_type if i is not None and self.standard(i) else None

    def node_of(self, value: str) -> Any:
        """The node producing ``value``, or None."""
        i = self.producer.get(value)
        return self.nodes[i] if i is not None else None

    def users(self, value: str) -> list[int]:
        """Indices of the nodes reading ``value``."""
        return self.consumers.get(value, [])

    def dtype(self, value: str) -> Optional[str]:
        """The dtype name of ``value`` (``float16``), None where unknown."""
        return self.types.get(value, (None, None))[0]

    def shape(self, value: str) -> Optional[list[Dim]]:
        """The shape of ``value`` (sizes, symbolic names, None for an unknown dim), None where unknown."""
        return self.types.get(value, (None, None))[1]

    def rank(self, value: str) -> Optional[int]:
        shape = self.shape(value)
        return len(shape) if shape is not None else None

    @staticmethod
    def attr(node: Any, name: str, default: Any = None) -> Any:
        """The value of attribute ``name`` of ``node`` (``onnx.helper.get_attribute_value``), else ``default``."""
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                try:
                    return helper.get_attribute_value(a)
                except Exception:  # noqa: BLE001 - an attribute of an undefined type in a corrupt file
                    return default
        return default

    def number(self, node: Any, name: str, default: Any) -> Any:
        """A numeric attribute (int or float) of ``node``; ``default`` when absent or of another type (a
        corrupt file may hold a string or a list where a number belongs)."""
        value = self.attr(node, name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return default
        return value

    def tensor_source(self, value: str) -> Optional[str]:
        """The tensor (initializer or constant) ``value`` is, through ``Identity``, ``Cast`` and ``CastLike``
        nodes; None when it is computed."""
        for _ in range(8):
            if value in self.store:
                return value
            node = self.node_of(value)
            if node is None or self.op(value) not in ("Identity", "Cast", "CastLike") or not node.input:
                return None
            value = node.input[0]
        return None

    def const(self, value: str, max_elements: int = 1 << 20) -> Any:
        """The numbers ``value`` holds when it is a tensor (:meth:`tensor_source`), as a float64 numpy array for
        floating and integer tensors; None when computed, larger than ``max_elements``, or of another dtype.
        The value as the tensor stores it: a ``Cast`` on the way changes the dtype eps is added in, which the
        eps facts take from the consumer, not from here."""
        import numpy as np

        src = self.tensor_source(value)
        if src is None:
            return None
        arr = self.store.array(src, max_elements)
        if arr is None:
            return None
        try:
            return np.asarray(arr, dtype=np.float64)
        except (TypeError, ValueError):
            return None

    def scalar(self, value: str) -> Optional[float]:
        """The one number ``value`` holds (a tensor of one element), else None."""
        arr = self.const(value, max_elements=1)
        return float(arr.reshape(-1)[0]) if arr is not None and arr.size == 1 else None
