"""ONNX files for the tests, written with ``onnx.helper`` (the format's own writer): a graph from nodes
(:func:`save`), the nodes of each norm form (:func:`norm`: the operators and the decomposed chains exporters
emit), and a small decoder (:func:`decoder`: token ids -> embedding -> pre-LN blocks -> final norm -> head)
whose node names carry module scopes as the TorchScript exporter writes them (``/layers.0/input_layernorm/...``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT, FLOAT16, INT64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
_NP = {FLOAT: np.float32, FLOAT16: np.float16, INT64: np.int64}


def vi(name: str, elem: int, shape: Optional[Sequence]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def tensor(name: str, values, elem: int = FLOAT) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=_NP.get(elem, np.float32)), name)


def save(path: Path, nodes: list, inputs: list, outputs: list, inits: list = (), opset: int = 17,
         external: bool = False) -> Path:
    """Write a model of one graph; ``external``: every tensor in ``<name>.data`` beside it."""
    graph = helper.make_graph(nodes, "test_graph", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = 9
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=0)
    else:
        onnx.save_model(model, str(path))
    return path


class Nodes:
    """Nodes and tensors being collected, with unique value names and scoped node names."""

    def __init__(self, elem: int = FLOAT):
        self.nodes: list = []
        self.inits: list = []
        self.elem = elem
        self.n = 0

    def const(self, name: str, values, elem: Optional[int] = None) -> str:
        self.inits.append(tensor(name, values, elem or self.elem))
        return name

    def op(self, op: str, inputs: list[str], scope: str = "", name: Optional[str] = None, **attrs) -> str:
        self.n += 1
        out = f"v{self.n}"
        node_name = name or (f"/{scope.replace('.', '/')}/{op}_{self.n}" if scope else f"{op}_{self.n}")
        self.nodes.append(helper.make_node(op, inputs, [out], name=node_name, **attrs))
        return out


def norm(b: Nodes, x: str, form: str, scope: str, hidden: int, eps: Optional[float] = 1e-5, *, gain=None,
         bias=None, axis: int = -1, stash: int = 1, eps_outside: bool = False, upcast: bool = False,
         one_plus: bool = False) -> str:
    """The nodes of one norm over the last dim (``axis``) of ``x``; returns its output value.

    ``form``: ``LayerNormalization``, ``RMSNormalization`` (operators; ``stash`` their stash_type), ``ln_chain``
    or ``rms_chain`` (decomposed: ``eps`` None adds none, ``eps_outside`` adds it after the root, ``upcast``
    casts to float32 before the statistics and back after); ``gain``/``bias`` the values (default ones/zeros);
    ``one_plus``: the gain applied as ``(1 + w)``."""
    key = scope.replace("/", ".")
    g = np.ones(hidden) if gain is None else np.asarray(gain)
    bias = np.zeros(g.shape) if bias is None else bias
    w = b.const(f"{key}.weight", g)
    if one_plus:
        w = b.op("Add", [w, b.const(f"{key}.one", 1.0)], scope)
    if form in ("LayerNormalization", "RMSNormalization"):
        ins = [x, w] + ([b.const(f"{key}.bias", bias)]
                        if form == "LayerNormalization" else [])
        return b.op(form, ins, scope, axis=axis, epsilon=1e-5 if eps is None else eps, stash_type=stash)
    h = b.op("Cast", [x], scope, to=FLOAT) if upcast else x
    reduce = dict(axes=[axis])
    if form == "ln_chain":
        mean = b.op("ReduceMean", [h], scope, **reduce)
        h = b.op("Sub", [h, mean], scope)
    two = b.const(f"{key}.two", 2.0, FLOAT if upcast else None)
    var = b.op("ReduceMean", [b.op("Pow", [h, two], scope)], scope, **reduce)
    stat_elem = FLOAT if upcast else None
    if eps is not None and not eps_outside:
        var = b.op("Add", [var, b.const(f"{key}.eps", eps, stat_elem)], scope)
    root = b.op("Sqrt", [var], scope)
    if eps is not None and eps_outside:
        root = b.op("Add", [root, b.const(f"{key}.eps", eps, stat_elem)], scope)
    y = b.op("Div", [h, root], scope)
    if upcast:
        y = b.op("Cast", [y], scope, to=b.elem)
    y = b.op("Mul", [y, w], scope)
    if form == "ln_chain":
        y = b.op("Add", [y, b.const(f"{key}.bias", bias)], scope)
    return y


def decoder(path: Path, layers: int = 2, hidden: int = 16, form: str = "rms_chain", eps: float = 1e-6,
            eps_of: Optional[dict] = None, final: bool = True, elem: int = FLOAT, gains: Optional[dict] = None,
            upcast: bool = False, vocab: int = 32, external: bool = False) -> Path:
    """A pre-LN decoder: ``input_ids`` (batch, sequence) -> Gather(embed_tokens) -> ``layers`` blocks of
    ``x + W(input_layernorm(x))`` -> ``norm`` (when ``final``) -> lm_head. ``eps_of``/``gains``: per module path
    (``layers.1.input_layernorm``) its eps / gain values."""
    eps_of, gains = eps_of or {}, gains or {}
    b = Nodes(elem)
    rng = np.random.default_rng(0)
    table = b.const("embed_tokens.weight", rng.standard_normal((vocab, hidden)) * 0.02)
    x = b.op("Gather", [table, "input_ids"], "embed_tokens")
    for i in range(layers):
        mod = f"layers.{i}.input_layernorm"
        h = norm(b, x, form, mod, hidden, eps_of.get(mod, eps), gain=gains.get(mod), upcast=upcast)
        w = b.const(f"layers.{i}.mlp.weight", rng.standard_normal((hidden, hidden)) * 0.02)
        x = b.op("Add", [x, b.op("MatMul", [h, w], f"layers.{i}.mlp")], f"layers.{i}")
    if final:
        x = norm(b, x, form, "norm", hidden, eps_of.get("norm", eps), gain=gains.get("norm"), upcast=upcast)
    head = b.const("lm_head.weight", rng.standard_normal((hidden, vocab)) * 0.02)
    b.op("MatMul", [x, head], "lm_head")
    b.nodes[-1].output[0] = "logits"
    return save(path, b.nodes, [vi("input_ids", INT64, ["batch", "sequence"])],
                [vi("logits", elem, ["batch", "sequence", vocab])], b.inits, external=external)


def single(path: Path, form: str, shape: Sequence, elem: int = FLOAT, opset: int = 17, **kw) -> Path:
    """One norm of ``form`` (see :func:`norm`) over a graph input ``x`` of ``shape``, scope ``norm``."""
    b = Nodes(elem)
    hidden = shape[-1] if kw.get("axis", -1) == -1 else int(np.prod(shape[kw["axis"]:]))
    if "gain" not in kw and kw.get("axis", -1) != -1:
        kw["gain"] = np.ones(shape[kw["axis"]:])
        kw["bias"] = np.zeros(shape[kw["axis"]:])
    norm(b, "x", form, "norm", hidden, **kw)
    b.nodes[-1].output[0] = "y"
    return save(path, b.nodes, [vi("x", elem, shape)], [vi("y", elem, shape)], b.inits, opset=opset)

