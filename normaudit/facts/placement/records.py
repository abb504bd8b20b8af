"""The records of the placement pass: one residual add (:class:`ResidualAdd`) and one norm's placement
state (:class:`SiteInfo`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

from torch import fx

from normaudit.facts.sites import SiteRecord


@dataclass
class ResidualAdd:
    """One residual add ``skip + branch`` found in the graph.

    ``skip_src`` is the skip operand seen through casts/dropout/views; ``reads`` the stream value the
    branch is computed from (``skip_src``, or an earlier stream value for parallel layouts); ``terms`` the
    branch operand split at non-residual adds (one per parallel sublayer); ``shortcut`` the weighted
    projection on the skip side, if any.
    """

    node: fx.Node
    skip: fx.Node
    skip_src: fx.Node
    branch: fx.Node
    reads: fx.Node
    terms: list[fx.Node] = field(default_factory=list)
    parallel: bool = False
    shortcut: Optional[fx.Node] = None
    block: Optional[str] = None


@dataclass
class SiteInfo:
    """One norm as the placement pass sees it: its record, input (seen through aliases) and output (the end of
    its gain/cast chain), its block, its role so far (``placement``), the innermost residual add whose branch
    it lies in (``add``) and all of them (``adds``)."""

    rec: SiteRecord
    inp: Optional[fx.Node]
    out: Optional[fx.Node]
    block: Optional[str]
    placement: str = "unknown"
    add: Optional[ResidualAdd] = None
    adds: list[ResidualAdd] = field(default_factory=list)
    #: its output feeds a projection shortcut as well as the branch: ``pre`` here, whichever scheme the
    #: identity-shortcut blocks of its class follow (raw skip, ResNetV2; normed skip, timm PreXception)
    feeds_shortcut: bool = False
    #: its input depends on no model input: learned latent queries expanded over the batch, read by the first
    #: layer of a Perceiver resampler (Idefics2's connector, modeling_idefics2.py:626-628); no residual stream
    reads_constant: bool = False


def site_key(info: SiteInfo) -> str:
    """The key of a norm in :attr:`normaudit.report.Block.norms`: its module path, ``#2``, ``#3``... for
    repeated calls."""
    s = info.rec.site
    return s.module + (f"#{s.call_index + 1}" if s.call_index else "")


def norms_by_branch(infos: list[SiteInfo]) -> dict[fx.Node, list[SiteInfo]]:
    """The norms inside each residual add's branch (:attr:`SiteInfo.adds`, set by pass 1), by the add's node."""
    branch_norms: dict[fx.Node, list[SiteInfo]] = defaultdict(list)
    for info in infos:
        for a in info.adds:
            branch_norms[a.node].append(info)
    return branch_norms
