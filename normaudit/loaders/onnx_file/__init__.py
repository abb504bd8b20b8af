"""ONNX files as targets: :func:`open_onnx` reads one as an :class:`OnnxGraph` (the graph and its tensor
table; tensors read lazily, external data included, bytes counted), :func:`onnx_target` makes it the audit's
target. Needs the optional ``onnx`` package (``normaudit[onnx]``).

One module per concern: :mod:`.reading` (file, parse, structure, shape inference), :mod:`.graph` (the
indexed view of the graph), :mod:`.tensors` (initializers and constants, external data)."""
from __future__ import annotations

from normaudit.loaders.onnx_file.graph import OnnxGraph
from normaudit.loaders.onnx_file.reading import INSTALL_HINT, onnx_target, open_onnx, require_onnx

__all__ = ["INSTALL_HINT", "OnnxGraph", "onnx_target", "open_onnx", "require_onnx"]
