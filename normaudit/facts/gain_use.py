"""Gains registered but never read: ``site.unread_gain``.

A hand-written norm whose module registers a gain (``self.weight = nn.Parameter(torch.ones(d))``) and whose
forward returns the normalised tensor alone computes a norm without its learned scale: the checkpoint fills the
parameter, ``load_state_dict`` reports nothing missing or unexpected, and every trained gain is ignored
(1bit-MONSTER #1154, fixed in PR #1160). The captured graph shows it: no node reads the parameter (symbolic
tracing makes a ``get_attr`` node only for what the forward reads; ``torch.export`` lifts every parameter to a
placeholder, which then has no users).

A site has an unread gain when it is a hand-written norm module (``detected_by`` ``pattern``, not a norm computed
inline in a larger module), its formula applies no gain (``formula.gain`` ``none``: a gain multiplied in after a
view, reshape or flatten back to the features is a gain, :mod:`normaudit.facts.formula`), and one of its own 1-D
parameters named as a gain (``weight``, ``gamma``, ``scale``, ``g``) with the size of the normalised extent (when
known) is read by no node of the graph under any of its names (a parameter tied to another module counts as
read where that module reads it).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.context import FactContext, Facts
from normaudit.facts.weights import GAIN_LEAVES
from normaudit.report import UnreadGain

__all__ = ["read_parameters", "unread_gain", "run"]


def read_parameters(gm: fx.GraphModule, user_inputs: list[str]) -> set[str]:
    """The graph's parameter and buffer reads that some node uses: ``get_attr`` targets (symbolic tracing) and
    the names of lifted placeholders (``torch.export``: ``p_<path with _>``), each as written in the graph."""
    users = set(user_inputs)
    out: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.users:
            out.add(str(node.target))
        elif node.op == "placeholder" and node.name not in users and node.users:
            out.add(node.name)
    return out


def _graph_names(fqn: str) -> list[str]:
    """The names a parameter ``fqn`` is read under: its path (``get_attr``) and export's placeholder names
    (``p_`` + the path with ``_``, ``p_m_`` under normaudit's wrapper module)."""
    flat = fqn.replace(".", "_")
    return [fqn, f"p_{flat}", f"p_m_{flat}"]


def _aliases(root: nn.Module) -> dict[int, list[str]]:
    """Every name of each parameter of ``root`` by ``id`` (tied parameters have several)."""
    names: dict[int, list[str]] = {}
    for name, p in root.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return names


def unread_gain(site: Any, mod: Optional[nn.Module], read: set[str],
                aliases: dict[int, list[str]]) -> Optional[UnreadGain]:
    """The unread gain of ``site`` (its module ``mod``; ``read`` from :func:`read_parameters`, ``aliases`` from
    the capture's root), or None (module docstring)."""
    if mod is None or site.detected_by != "pattern" or site.inline or site.formula is None \
            or site.formula.gain != "none":
        return None
    extent = math.prod(site.normalized_shape) if site.normalized_shape else site.num_channels
    for name, p in mod.named_parameters(recurse=False):
        if p.dim() != 1 or name not in GAIN_LEAVES or (extent is not None and p.numel() != extent):
            continue
        fqns = aliases.get(id(p)) or [f"{site.module}.{name}" if site.module else name]
        if not any(g in read for fqn in fqns for g in _graph_names(fqn)):
            return UnreadGain(param=name, shape=list(p.shape))
    return None


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``gain-use``: ``site.unread_gain`` of every record (:func:`unread_gain`)."""
    cap = ctx.cap
    if cap.gm is None:
        return
    read = read_parameters(cap.gm, list(cap.user_inputs))
    aliases = _aliases(cap.root)
    for rec in facts.records:
        rec.site.unread_gain = unread_gain(rec.site, rec.module_obj, read, aliases)
