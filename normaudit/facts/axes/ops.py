"""Reading an fx node's op for the axis pass: its raw name under either graph flavour (``call_method``
target, aten overload packet, function name), a dims argument given as a list or as varargs, and the op
families the pass treats alike."""
from __future__ import annotations

import re
from typing import Optional

from torch import fx

from normaudit.vocabulary.graph import arg


# ops whose output has the input's rank and layout, possibly with other sizes (pooling, resampling, padding)
LAYOUT_KEEPING = re.compile(
    r"(pool|interpolate|upsample|upsampling|pad|pixel_shuffle|pixel_unshuffle|roll|flip|cumsum|cumprod|"
    r"softmax|log_softmax|repeat|tile|index_select|gather|scatter|masked_scatter|slice_scatter|"
    r"select_scatter|index_put|index_add|narrow|grid_sample|affine_grid|channel_shuffle|tril|triu|resize)")
ELEMENTWISE = ("add", "sub", "mul", "div", "rsub")


def raw_name(node: fx.Node) -> str:
    """The op as written: a ``call_method`` target, an aten overload packet's name, else the target's name."""
    if node.op == "call_method":
        return str(node.target)
    packet = getattr(node.target, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(node.target, "__name__", str(node.target))


def is_aten(node: fx.Node) -> bool:
    """``node`` calls an aten op (an exported graph), not a torch function or method."""
    return hasattr(node.target, "_overloadpacket")


def dims_arg(node: fx.Node, index: int, name: str) -> Optional[list[int]]:
    """A dims argument given as a list or as varargs (``x.permute(0, 2, 1)``)."""
    dims = arg(node, index, name, None)
    if dims is None:
        return None
    if isinstance(dims, (list, tuple)):
        return [int(d) for d in dims] if all(isinstance(d, int) for d in dims) else None
    if isinstance(dims, int):
        rest = node.args[index:]
        return [int(d) for d in rest] if all(isinstance(d, int) for d in rest) else None
    return None
