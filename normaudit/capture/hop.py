"""Inline the grad-mode and autocast regions that ``torch.export`` keeps as higher-order ops.

``torch.export.export`` (training IR) wraps the body of a ``torch.no_grad()`` / ``torch.enable_grad()``
region (a function decorated with ``@torch.no_grad()``, as the DeepSeek-V3.2-style sparse-attention
indexers of transformers' AXK2, HY-V4 and GLM-5 are) in ``wrap_with_set_grad_enabled(enabled, submod, *args)``,
and a ``torch.autocast`` region in ``wrap_with_autocast(device, dtype, enabled, cache_enabled, submod, *args)``
(``torch/export_graph/passes/replace_set_grad_with_hop_pass.py``, ``replace_autocast_with_hop_pass.py``). The ops of
such a region live in a nested graph module, out of reach of every walk over ``gm.graph``: a ``nn.LayerNorm``
called there is no site, and the region's output looks computed by one opaque node.

The analysis needs the data flow, not the grad mode: :func:`inline_wrapped_regions` copies each region's
nodes (with their ``meta``: ``val``, ``nn_module_stack``, ``stack_trace``) into the parent graph in place of
the call. Regions whose outputs are used other than by ``getitem`` are left as they are. Data-dependent
control flow (``torch.cond``, ``map``) is not inlined: which branch runs is unknown.
"""
from __future__ import annotations

import operator
from typing import Any

from torch import fx

#: Higher-order ops that only set a mode around their body, and the position of the body among their args.
WRAPPERS = {"wrap_with_set_grad_enabled": 1, "wrap_with_autocast": 4}


def _wrapper_body(node: fx.Node) -> int | None:
    """Index of the body's ``get_attr`` in ``node.args`` when ``node`` calls a mode-only wrapper, else None."""
    if node.op != "call_function":
        return None
    index = WRAPPERS.get(getattr(node.target, "_name", None) or getattr(node.target, "__name__", ""))
    if index is None or len(node.args) <= index:
        return None
    body = node.args[index]
    return index if isinstance(body, fx.Node) and body.op == "get_attr" else None


def _inline_one(gm: fx.GraphModule, node: fx.Node, index: int) -> bool:
    """Replace the wrapper call ``node`` by the nodes of its body; False (graph untouched) when it cannot."""
    sub = getattr(gm, str(node.args[index].target), None)
    if not isinstance(sub, fx.GraphModule):
        return False
    operands = list(node.args[index + 1:])
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    outputs = [n for n in sub.graph.nodes if n.op == "output"]
    users = list(node.users)
    if len(placeholders) != len(operands) or len(outputs) != 1 or node.kwargs:
        return False
    result = outputs[0].args[0]
    result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    for u in users:
        if u.op != "call_function" or u.target is not operator.getitem or not isinstance(u.args[1], int) \
                or not isinstance(result[u.args[1]], fx.Node):
            return False
    env: dict[fx.Node, Any] = dict(zip(placeholders, operands))
    with gm.graph.inserting_before(node):
        for n in sub.graph.nodes:
            if n.op in ("placeholder", "output"):
                continue
            new = gm.graph.node_copy(n, lambda a: env[a])
            if n.op == "get_attr":  # a nested region's body: give it a free name on the parent
                name, i = f"{n.target}_inlined", 0
                while hasattr(gm, name):
                    i += 1
                    name = f"{n.target}_inlined{i}"
                setattr(gm, name, getattr(sub, str(n.target)))
                new.target = name
            env[n] = new
    for u in users:
        value = result[u.args[1]]
        u.replace_all_uses_with(env.get(value, value))
        gm.graph.erase_node(u)
    body = node.args[index]
    gm.graph.erase_node(node)
    if not body.users:
        gm.graph.erase_node(body)
    return True


def inline_wrapped_regions(gm: fx.GraphModule) -> int:
    """Inline every grad-mode / autocast region of ``gm`` (nested ones too), in place; returns how many were
    inlined. Bodies no longer referenced stay as attributes of ``gm`` (harmless; the graph is recompiled)."""
    count = 0
    changed = True
    while changed:
        changed = False
        for node in list(gm.graph.nodes):
            index = _wrapper_body(node)
            if index is not None and _inline_one(gm, node, index):
                count += 1
                changed = True
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
