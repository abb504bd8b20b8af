"""Which graph nodes are activations: values that depend on a model input, on a tensor the forward makes
from no tensor, or on parameters or buffers spread over the input's batch. Statistics over any other node (a
function of parameters, buffers and constants) normalise no activation: weight standardisation (Qiao et al.
2019) is no site."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import fx

from normaudit.vocabulary.graph import op_name, shape, tensor_inputs

# Ops that spread a tensor over new or size-1 dims: ``expand_as`` and ``broadcast_to`` become ``expand`` and
# ``tile`` becomes ``repeat`` under export.
SPREAD_OPS = ("expand", "expand_as", "broadcast_to", "expand_copy", "repeat", "tile")


def created_tensor(node: fx.Node) -> bool:
    """``node`` makes a tensor from no tensor: a factory call whose arguments are all literals
    (``torch.full((B, 1), bos_id)``, ``torch.randint(0, V, (B, S))``, ``torch.zeros(...)``). A forward that
    builds its own input this way (Dia's decoder start tokens, a diffusion decoder's random canvas) feeds
    data, not weights, to the layers after it."""
    if node.op != "call_function" or node.all_input_nodes:
        return False
    v = node.meta.get("val", node.meta.get("tensor_meta"))
    return v is None or isinstance(v, torch.Tensor) or hasattr(v, "shape")


def batch_sizes(gm: fx.GraphModule, names: set) -> set[int]:
    """The batch sizes of the model inputs named ``names``: the leading size of each, when it is over 1."""
    out = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            s = shape(node)
            if s and s[0] > 1:
                out.add(s[0])
    return out


def spread_over_batch(node: fx.Node, batches: set[int]) -> bool:
    """``node`` spreads a tensor over the batch: an expand or repeat whose leading dim is new or of size 1 in
    its source and has an input's batch size in its result (``latents.expand(x.shape[0], -1, -1)``,
    ``pos[:, :T].repeat(B, 1, 1)``). A symbolic trace sees the batch size read off the input
    (``x.shape[0]``); export writes it as a literal, so this is what says the result is one tensor per
    example: learned latents or queries, a positional table. A weight is not spread over the batch."""
    if node.op not in ("call_function", "call_method") or op_name(node) not in SPREAD_OPS:
        return False
    srcs = tensor_inputs(node)
    out, src = shape(node), shape(srcs[0]) if srcs else None
    if out is None or src is None or len(out) < 2 or len(out) < len(src):
        return False
    lead = src[0] if len(src) == len(out) else 1  # a dim expand adds in front has size 1 in the source
    return lead == 1 and out[0] in batches


def activation_nodes(gm: fx.GraphModule, user_inputs: list[str], created: bool = False) -> Optional[set]:
    """The nodes whose value depends on a model input (activations), in one pass over the graph; None when
    the capture names no inputs (then every node counts as one). A node outside this set is a function of
    parameters, buffers and constants only: statistics over it (weight standardisation, Qiao et al. 2019:
    ``F.batch_norm`` over a conv's weight in BiT/timm ``StdConv2d``) normalise no activation.

    With ``created``, tensors the forward creates from no tensor (:func:`created_tensor`) and what is computed
    from them count too: then a node outside the set is a function of parameters and buffers alone, and a
    norm over a decoder input the model made itself (``embed(torch.full(...))``) is still a norm of data.

    Parameters and buffers spread over the batch (:func:`spread_over_batch`) are activations under both
    capture methods: symbolic tracing reads the batch size off an input, export bakes it in."""
    names = set(user_inputs)
    if not names:
        return None
    batches = batch_sizes(gm, names)
    act: set = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.name in names:
                act.add(node)
        elif any(a in act for a in node.all_input_nodes) or (created and created_tensor(node)) \
                or spread_over_batch(node, batches):
            act.add(node)
    return act


def is_act(node: Any, act: Optional[set]) -> bool:
    """``node`` is a graph node in ``act`` (every node when ``act`` is None: the capture names no inputs)."""
    return isinstance(node, fx.Node) and (act is None or node in act)
