"""The PyTorch module path of an ONNX node, where the exporter recorded it, so that an ONNX report names the
norms as the model's own report does (``layers.0.input_layernorm``):

- ``torch.onnx.export(..., dynamo=True)`` writes node metadata: ``pkg.torch.onnx.name_scopes`` (the module
  paths from the root to the node, then the fx node's name: ``['', 'layers.0', 'layers.0.input_layernorm',
  'pow_1']``) and ``pkg.torch.onnx.class_hierarchy`` (the classes of those modules, then the aten op);
- the TorchScript exporter (``dynamo=False``) names nodes by scope: ``/layers.0/input_layernorm/ReduceMean``;
- any other node keeps its ONNX name (``OpType_i`` for an unnamed node).

Example::

    >>> from onnx import helper
    >>> module_path(helper.make_node("Sqrt", ["a"], ["b"], name="/layers.0/norm/Sqrt"), "x")
    ModulePath(path='layers.0.norm', class_name=None, class_module=None, source='node_name')
    >>> module_path(helper.make_node("Sqrt", ["a"], ["b"], name="ln_f"), "ln_f").path
    'ln_f'
"""
from __future__ import annotations

import ast
from typing import Any, NamedTuple, Optional

_SCOPES = "pkg.torch.onnx.name_scopes"
_CLASSES = "pkg.torch.onnx.class_hierarchy"
#: longest metadata value parsed (a name-scope list of a deep model is a few hundred characters)
_MAX_META = 4096


class ModulePath(NamedTuple):
    """``path``: the module path (or the node's name); ``class_name``/``class_module``: the PyTorch class of
    that module where recorded; ``source``: ``name_scopes``, ``node_name`` or ``node``."""

    path: str
    class_name: Optional[str]
    class_module: Optional[str]
    source: str


def _str_list(text: Optional[str]) -> Optional[list[str]]:
    """A Python list of strings written as text (the exporter's metadata), else None; never evaluates code."""
    if not text or len(text) > _MAX_META:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def module_path(node: Any, label: str) -> ModulePath:
    """Where ``node`` (an ONNX ``NodeProto``; ``label`` its display name) sits in the PyTorch model, as the
    module docstring describes."""
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = _str_list(meta.get(_SCOPES))
    if scopes and len(scopes) >= 2:
        classes = _str_list(meta.get(_CLASSES)) or []
        owner = classes[len(scopes) - 2] if len(classes) >= len(scopes) - 1 else None
        mod, _, cls = owner.rpartition(".") if owner else ("", "", "")
        return ModulePath(scopes[-2], cls or None, mod or None, "name_scopes")
    name = node.name or ""
    if name.startswith("/") and name.count("/") >= 1:
        parts = name.split("/")[1:-1]
        if all(parts):
            return ModulePath(".".join(parts), None, None, "node_name")
    return ModulePath(label, None, None, "node")


def block_of(path: str) -> Optional[str]:
    """The repeated block a module path lies in: the path up to its last numbered component (``layers.0`` of
    ``layers.0.input_layernorm``); None outside one."""
    parts = path.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].isdigit():
            return ".".join(parts[: i + 1]) if i + 1 < len(parts) else None
    return None
