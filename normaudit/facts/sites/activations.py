"""Which graph nodes are activations: values that depend on a model input, or on a tensor the forward makes
from no tensor. Statistics over any other node (a function of parameters, buffers and constants) normalise no
activation: weight standardisation (Qiao et al. 2019) is no site."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import fx


def created_tensor(node: fx.Node) -> bool:
    """``node`` makes a tensor from no tensor: a factory call whose arguments are all literals
    (``torch.full((B, 1), bos_id)``, ``torch.randint(0, V, (B, S))``, ``torch.zeros(...)``). A forward that
    builds its own input this way (Dia's decoder start tokens, a diffusion decoder's random canvas) feeds
    data, not weights, to the layers after it."""
    if node.op != "call_function" or node.all_input_nodes:
        return False
    v = node.meta.get("val", node.meta.get("tensor_meta"))
    return v is None or isinstance(v, torch.Tensor) or hasattr(v, "shape")


def activation_nodes(gm: fx.GraphModule, user_inputs: list[str], created: bool = False) -> Optional[set]:
    """The nodes whose value depends on a model input (activations), in one pass over the graph; None when
    the capture names no inputs (then every node counts as one). A node outside this set is a function of
    parameters, buffers and constants only: statistics over it (weight standardisation, Qiao et al. 2019:
    ``F.batch_norm`` over a conv's weight in BiT/timm ``StdConv2d``) normalise no activation.

    With ``created``, tensors the forward creates from no tensor (:func:`created_tensor`) and what is computed
    from them count too: then a node outside the set is a function of parameters and buffers alone, and a
    norm over a decoder input the model made itself (``embed(torch.full(...))``) is still a norm of data."""
    names = set(user_inputs)
    if not names:
        return None
    act: set = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.name in names:
                act.add(node)
        elif any(a in act for a in node.all_input_nodes) or (created and created_tensor(node)):
            act.add(node)
    return act


def is_act(node: Any, act: Optional[set]) -> bool:
    """``node`` is a graph node in ``act`` (every node when ``act`` is None: the capture names no inputs)."""
    return isinstance(node, fx.Node) and (act is None or node in act)
