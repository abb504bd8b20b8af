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


def finish_group_norm(rec: SiteRecord, split: GroupSplit, modules: dict) -> None:
    """Group facts of a hand-written GroupNorm, and its output taken past the reshape back to the input's shape
    and the per-channel affine (``x * w.view(1, C, 1, 1) + b.view(1, C, 1, 1)``)."""
    s, xs = rec.site, shape(rec.input)
    s.num_groups, s.group_split, s.normalized_shape = split.groups, split, None
    users = [u for u in rec.output.users if not op_name(u).startswith("_assert")]
    if len(users) == 1 and op_name(users[0]) in _GROUP_VIEWS and shape(users[0]) == xs:
        out, chain = extend_affine(users[0], s.module, modules)
        rec.output = out
        rec.nodes |= {users[0], *chain}
        s.affine_weight = any(op_name(c) == "mul" for c in chain) or s.affine_weight
        s.affine_bias = any(op_name(c) == "add" for c in chain) or s.affine_bias
        rec.hints["affine_chain"] = rec.hints.get("affine_chain", []) + [op_name(c) for c in chain]
        split.channel_dim = _affine_dim(chain, xs)
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
