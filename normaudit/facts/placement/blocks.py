"""Blocks and stacks. A block is the innermost numbered child of a ModuleList/Sequential of same-class
modules that owns a residual add and a weighted op of its branch (``layers.0``, ``encoder.block.1``); a
stack is the blocks under one container path, layer indices read as ``*`` (``stages.*.blocks``)."""
from __future__ import annotations

import math
from typing import Optional

from torch import fx, nn

from normaudit.facts.placement.graph import StreamGraph
from normaudit.facts.placement.records import ResidualAdd
from normaudit.report import Block
from normaudit.vocabulary.graph import owner, shape
from normaudit.vocabulary.kinds import builtin_kind


CONTAINERS = (nn.ModuleList, nn.Sequential)


# -- blocks ----------------------------------------------------------------------------------------------------
def _numbered_children(modules: dict[str, nn.Module]) -> set[str]:
    """Numbered children of a ModuleList/Sequential whose children are all of one class (not norms)."""
    out: set[str] = set()
    for path, mod in modules.items():
        parent, _, last = path.rpartition(".")
        if not last.isdigit() or builtin_kind(mod) is not None:
            continue
        container = modules.get(parent if parent else "")
        if not isinstance(container, CONTAINERS):
            continue
        if len({type(c) for c in container.children()}) == 1:
            out.add(path)
    return out


def _prefixes(path: str) -> list[str]:
    """``a.b.c`` -> ``[a.b.c, a.b, a]`` (innermost first)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]


def is_inside(path: str, prefix: str) -> bool:
    """Module ``path`` is ``prefix`` or one of its descendants (``a.b`` is inside ``a``, ``ab`` is not)."""
    return path == prefix or path.startswith(prefix + ".")


def assign_blocks(g: StreamGraph, adds: list[ResidualAdd]) -> set[str]:
    """Give each residual add its block: the innermost numbered same-class child that owns the add and at
    least one weighted op of its branch (so a ``SublayerConnection`` that only receives its sublayer as a
    callable is not a block, but the layer that owns the sublayer is). Returns the set of blocks."""
    numbered = _numbered_children(g.modules)
    blocks: set[str] = set()
    for a in adds:
        j = g.idx[a.branch]
        mask = g.weighted_mask & g.desc[g.idx[a.reads]] & (g.anc[j] | (1 << j))
        owners = set()
        i = 0
        while mask and len(owners) < 64:
            if mask & 1:
                owners.add(owner(g.nodes[i], g.modules))
            mask >>= 1
            i += 1
        for p in _prefixes(owner(a.node, g.modules)):
            if p in numbered and any(is_inside(o, p) for o in owners):
                a.block = p
                blocks.add(p)
                break
    return blocks


def block_of(path: str, blocks: set[str]) -> Optional[str]:
    """The innermost of ``blocks`` that module ``path`` lies in, or None."""
    return next((p for p in _prefixes(path) if p in blocks), None)


def stack_size(blocks: list[Block], block: Optional[str]) -> int:
    """How many blocks share ``block``'s container (``layers.3`` -> the blocks ``layers.*``); 0 without one."""
    if block is None:
        return 0
    parent = block.rpartition(".")[0]
    return sum(1 for b in blocks if b.path.rpartition(".")[0] == parent)


def stack_pattern(path: str) -> str:
    """The stack a block belongs to: its container path with every layer index replaced by ``*``
    (``encoder.layers.3`` -> ``encoder.layers``, ``stages.1.blocks.0`` -> ``stages.*.blocks``), so the blocks of
    every stage of one backbone are peers while two stacks under different parents are not."""
    return ".".join("*" if p.isdigit() else p for p in path.split(".")[:-1])


def numel(node: Optional[fx.Node]) -> Optional[int]:
    """How many elements the tensor ``node`` holds, from its shape metadata; None when unknown or symbolic."""
    dims = shape(node) if isinstance(node, fx.Node) else None
    if dims is None:
        return None
    try:
        return math.prod(int(d) for d in dims)
    except (TypeError, ValueError):
        return None
