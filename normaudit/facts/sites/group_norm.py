"""Hand-written GroupNorms (Wu & He 2018): statistics of a grouped view of ``x`` (``x.reshape(N, G, -1)``,
``x.view(N, G, C // G, H, W)``, channels-last ``x.view(N, H * W, G, C // G)``) whose result is given back
``x``'s layout. The site normalises the tensor before the reshape; its record carries how the groups divide
it (:class:`normaudit.report.GroupSplit`) and the per-channel affine after the reshape back."""
from __future__ import annotations

import math
from typing import Any, Optional

from torch import fx

from normaudit.facts.sites.application import extend_affine
from normaudit.facts.sites.record import SiteRecord
from normaudit.report import GroupSplit
from normaudit.vocabulary.graph import NEUTRAL_OPS, op_name, reach, shape, strip_neutral


_GROUP_VIEWS = ("view", "reshape", "_unsafe_view")


def group_view(src: Any, dims) -> Optional[tuple[fx.Node, GroupSplit]]:
    """A GroupNorm written out (Wu & He 2018, eq. 1 with S_i the group's C/G channels and all positions):
    statistics of a view of ``x`` taken over every dim but the batch dim and one group dim:
    ``x.reshape(N, G, -1)``, ``x.view(N, G, C // G, H, W)``, or channels-last ``x.view(N, H * W, G, C // G)``
    over dims (1, 3). Returns (x, how the groups divide x), or None for any other reduction.

    ``GroupSplit.dim`` is the dim of ``x`` the group dim splits (row-major: the view dims before the group
    dim cover exactly x's dims before it): the channel dim for the three forms above; an image-row axis for a
    channels-last (N, H, W, C) tensor reshaped to (N, G, -1) without moving C first. When no dim of ``x`` is
    split evenly, the groups follow the first dim whose leading product the group count divides."""
    view = strip_neutral(src)
    if not isinstance(view, fx.Node) or op_name(view) not in _GROUP_VIEWS or not view.args:
        return None
    base = strip_neutral(view.args[0])
    xs, vs = shape(base) if isinstance(base, fx.Node) else None, shape(view)
    if not xs or not vs or len(xs) < 2 or len(vs) < 3 or xs[0] != vs[0] or math.prod(vs[1:]) != math.prod(xs[1:]):
        return None
    kept = sorted(set(range(1, len(vs))) - {d % len(vs) for d in dims})
    if len(kept) != 1 or 0 in {d % len(vs) for d in dims}:
        return None
    k = kept[0]
    groups, pre, spans = vs[k], math.prod(vs[1:k]), list(range(1, len(xs)))
    if not 1 < groups < math.prod(xs[1:]):
        return None
    for j in range(1, len(xs)):
        if math.prod(xs[1:j]) == pre and xs[j] % groups == 0:
            return base, GroupSplit(groups=groups, dim=j, per_group=xs[j] // groups, spans=spans)
    if k != 1:
        return None
    before = 1
    for j in range(1, len(xs)):
        if (before * xs[j]) % groups == 0:
            return base, GroupSplit(groups=groups, dim=j, per_group=before * xs[j] // groups, spans=spans)
        before *= xs[j]
    return None


def restored(applied: fx.Node, xs: Optional[tuple[int, ...]], hops: int = 6) -> bool:
    """True when the normalised grouped view ``applied`` is given back the layout ``xs`` of the tensor it
    views, as a GroupNorm's output is (Wu & He 2018: the groups are a temporary view of the channels): it has
    that shape already (the statistic applied to ``x`` itself), or a reshape to ``xs`` follows within a few
    casts, element-wise ops and per-group affine ops. A result that stays in the view (a waveform cut into
    frames of a fixed length, each frame standardised and read by ``nn.Linear(frame_len, hidden)``:
    MoonshineStreaming's FrameCMVN) is a norm over the view's own dims, not a grouping of ``x``'s channels."""
    if not xs or hops < 1:
        return False

    def follow(user: fx.Node, n: fx.Node) -> bool:
        name = op_name(user)
        return name in NEUTRAL_OPS or name in _GROUP_VIEWS or name in ("mul", "add", "sub", "div", "contiguous")

    # the nodes within ``hops - 1`` steps, ``applied`` included, are the ones whose shape is looked at
    return any(tuple(shape(n) or ()) == tuple(xs) for n in [applied, *reach(applied, follow, hops - 1)])


def functional_group_norm(rec: SiteRecord, name: str, modules: dict) -> bool:
    """A GroupNorm written with a functional norm over a grouped view (Wu & He 2018, and the older ports that
    turn GroupNorm into InstanceNorm by reshaping to (N, G, C // G * H * W)): ``F.layer_norm(x.view(N, G, -1),
    x.shape[-1:])`` or ``F.instance_norm(x.view(N, G, -1))`` whose result is given back ``x``'s layout. Turns
    ``rec`` (a functional LayerNorm or InstanceNorm site) into a GroupNorm site over ``x`` with its
    :class:`GroupSplit` and returns True; False (``rec`` untouched) for any other input."""
    s, view = rec.site, rec.input
    vs = shape(view) if isinstance(view, fx.Node) else None
    if name not in ("layer_norm", "instance_norm") or not vs or len(vs) < 3:
        return False
    n = len(s.normalized_shape or [1]) if name == "layer_norm" else len(vs) - 2
    found = group_view(view, list(range(len(vs) - n, len(vs))))
    if found is None:
        return False
    base, split = found
    out, chain = extend_affine(rec.output, s.module, modules)
    if not restored(out, shape(base)):
        return False
    gain = arg_gain(rec.output) if name == "instance_norm" else None
    rec.output, rec.input = out, base
    rec.nodes |= set(chain)
    s.kind, s.reduced_dims = "GroupNorm", list(range(1, len(shape(base))))
    s.affine_weight = s.affine_weight or any(op_name(c) == "mul" for c in chain) or None
    s.affine_bias = s.affine_bias or any(op_name(c) == "add" for c in chain) or None
    finish_group_norm(rec, split, modules, view_gain=gain)
    return True


def arg_gain(node: fx.Node) -> Optional[fx.Node]:
    """The weight argument of an ``instance_norm`` call (``F.instance_norm(input, running_mean, running_var,
    weight, ...)``; ``aten.instance_norm(input, weight, bias, ...)`` under export; or ``weight=``), None when
    absent."""
    at = 1 if hasattr(node.target, "_overloadpacket") else 3
    w = node.kwargs.get("weight", node.args[at] if len(node.args) > at else None)
    return w if isinstance(w, fx.Node) else None


def _group_gain(nodes: set, vs: Optional[tuple[int, ...]], groups: int) -> Optional[fx.Node]:
    """The operand of a gain multiply among ``nodes`` that acts on the grouped view (shape ``vs``) with one value
    per group: right-aligned with ``vs``, its only dim above 1 is of size ``groups`` where ``vs`` has the
    groups. None when there is none."""
    if not vs:
        return None
    for node in nodes:
        if op_name(node) != "mul" or tuple(shape(node) or ()) != tuple(vs):
            continue
        for a in node.args[:2]:
            ws = shape(a) if isinstance(a, fx.Node) else None
            if ws is None or len(ws) > len(vs) or tuple(ws) == tuple(vs):
                continue
            big = [len(vs) - len(ws) + i for i, d in enumerate(ws) if d > 1]
            if len(big) == 1 and vs[big[0]] == groups and ws[big[0] - len(vs) + len(ws)] == groups:
                return a
    return None


def _param_shape(node: Optional[fx.Node], module: Any) -> Optional[list[int]]:
    """The shape of the parameter a gain operand reads (through views), as its module holds it; else the
    operand's shape."""
    src = strip_neutral(node) if isinstance(node, fx.Node) else None
    hops = 0
    while isinstance(src, fx.Node) and src.op not in ("get_attr", "placeholder") and hops < 4 and src.args:
        src, hops = strip_neutral(src.args[0]), hops + 1
    if isinstance(src, fx.Node) and src.op == "get_attr" and module is not None:
        leaf = str(src.target).rsplit(".", 1)[-1]
        p = getattr(module, leaf, None)
        if p is not None and hasattr(p, "shape"):
            return [int(d) for d in p.shape]
    ws = shape(node) if isinstance(node, fx.Node) else None
    return [int(d) for d in ws] if ws else None


def finish_group_norm(rec: SiteRecord, split: GroupSplit, modules: dict,
                      view_gain: Optional[fx.Node] = None) -> None:
    """Group facts of a hand-written GroupNorm, and its output taken past the reshape back to the input's shape
    and the per-channel affine (``x * w.view(1, C, 1, 1) + b.view(1, C, 1, 1)``). A gain applied on the
    grouped view with one value per group (``view_gain``, or a multiply found among the record's nodes) is
    ``split.affine == "group"``: Wu & He 2018 (eq. 2 and their code) learn one gamma and beta per channel."""
    s, xs = rec.site, shape(rec.input)
    s.num_groups, s.group_split, s.normalized_shape = split.groups, split, None
    vs = shape(rec.stat.args[0]) if rec.stat is not None and rec.stat.args and \
        isinstance(rec.stat.args[0], fx.Node) else None
    per_group = view_gain if view_gain is not None else _group_gain(rec.nodes, vs or shape(rec.output), split.groups)
    users = [u for u in rec.output.users if not op_name(u).startswith("_assert")]
    if len(users) == 1 and op_name(users[0]) in _GROUP_VIEWS and shape(users[0]) == xs:
        out, chain = extend_affine(users[0], s.module, modules)
        rec.output = out
        rec.nodes |= {users[0], *chain}
        s.affine_weight = any(op_name(c) == "mul" for c in chain) or s.affine_weight
        s.affine_bias = any(op_name(c) == "add" for c in chain) or s.affine_bias
        rec.hints["affine_chain"] = rec.hints.get("affine_chain", []) + [op_name(c) for c in chain]
        split.channel_dim = _affine_dim(chain, xs)
    if per_group is not None:
        split.affine, split.affine_shape = "group", _param_shape(per_group, rec.module_obj)
        s.affine_weight = True
        s.num_channels = int(xs[split.dim])
        return
    split.affine = "channel" if split.channel_dim is not None else None
    gains = [p for p in (rec.module_obj.parameters(recurse=False) if rec.module_obj is not None else [])
             if sum(int(d) > 1 for d in p.shape) == 1]
    s.num_channels = int(gains[0].numel()) if gains else int(xs[split.dim])


def _affine_dim(chain: list[fx.Node], xs: tuple[int, ...]) -> Optional[int]:
    """The dim of an input of shape ``xs`` that the gain multiply of ``chain`` scales per position: its
    operand's shape right-aligned with ``xs`` (``w`` of shape (C,) scales the last dim, ``w.view(1, C, 1, 1)``
    dim 1). None when there is no gain multiply or it broadcasts over more than one dim."""
    for node in chain:
        if op_name(node) != "mul":
            continue
        for a in node.args[:2]:
            ws = shape(a) if isinstance(a, fx.Node) else None
            if ws is None or len(ws) > len(xs) or ws == xs:
                continue
            offset = len(xs) - len(ws)
            big = [offset + i for i, d in enumerate(ws) if d > 1]
            if len(big) == 1 and ws[big[0] - offset] == xs[big[0]]:
                return big[0]
    return None
