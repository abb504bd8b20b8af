"""Eps facts: for each site, the eps it actually adds, what each configuration declares for it, what the
other sites of its class use, and what is left of it in the dtype it is added in (:class:`EpsFacts` on
``site.eps_facts``). Rules ``NE1xx`` compare these; this pass only measures.

- ``effective``: ``site.eps``; for ``nn.RMSNorm(eps=None)`` / ``F.rms_norm(eps=None)`` the
  ``torch.finfo(input dtype).eps`` PyTorch substitutes (its docs). ``missing``: a hand-written norm whose
  statistic reaches ``sqrt``/``rsqrt`` with nothing added (a constant row divides 0 by 0).
- ``declared``: one :class:`ConfigEps` per configuration that names an eps key for the site's kind
  (:data:`EPS_KEYS`, first key found, nested dicts searched), each with its ``origin`` (``cli``: ``--config``;
  ``checkpoint``: the config that came with the weights; ``model``: the model's own ``config`` attribute;
  ``library``: a transformers ``PretrainedConfig``, whose code may keep another eps on purpose) and
  ``source``.
- ``peers``/``peer_eps``/``peer_count``: sites grouped by class name *and* kind, so one class's sites are
  compared with each other only (transformers' ConvNeXt hard-codes 1e-6 in its ``ConvNextLayerNorm`` block
  norms while its final ``nn.LayerNorm`` takes ``layer_norm_eps``: two classes, no disagreement).
- ``dtype``: the dtype eps is added in. ``site.formula.eps_dtype`` when the formula pass found it; else a
  fused kernel (``nn.LayerNorm``, ``F.layer_norm``, ``nn.RMSNorm``, batch/group/instance norm) takes eps as a
  double and adds it in its float32 accumulator for half input; else the dtype of the ``+ eps`` node in the
  graph; else ``site.compute_dtype``. ``in_dtype``: eps rounded to that dtype (IEEE 754 round to nearest): 0.0
  for 1e-12 in float16, whose smallest subnormal is 2**-24 ~ 6e-8.

Example::

    >>> from normaudit.report import Site
    >>> s = Site(module="norm", kind="LayerNorm", class_name="Norm", detected_by="pattern", eps=1e-12,
    ...          input_dtype="float16", compute_dtype="float16")
    >>> eps_dtype_of(s, None), rounded(1e-12, "float16"), rounded(1e-12, "bfloat16") > 0
    (('float16', 'compute dtype of the hand-written statistics'), 0.0, True)
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import fx

from normaudit.capture.ir import dtype as node_dtype
from normaudit.capture.ir import op_name, scalar_operand, strip_neutral
from normaudit.report import ConfigEps, EpsFacts, Site

__all__ = ["EPS_KEYS", "ConfigSource", "find_eps_key", "eps_dtype_of", "rounded", "analyse"]

#: Configuration keys declaring the eps of each kind of norm, most specific first.
EPS_KEYS: dict[str, tuple[str, ...]] = {
    "LayerNorm": ("layer_norm_eps", "layer_norm_epsilon", "layernorm_eps", "ln_eps", "norm_eps", "norm_epsilon"),
    "RMSNorm": ("rms_norm_eps", "rms_norm_epsilon", "rmsnorm_eps", "norm_eps", "norm_epsilon", "layer_norm_epsilon",
                "layer_norm_eps"),
    "GroupNorm": ("group_norm_eps", "group_norm_epsilon", "gn_eps"),
    "BatchNorm": ("batch_norm_eps", "batch_norm_epsilon", "bn_eps"),
}
_FLOAT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}
_REL_TOL = 1e-6


@dataclass
class ConfigSource:
    """One configuration the model may be compared with: ``origin`` (``cli``, ``checkpoint``, ``model``,
    ``library``, see the module doc), ``source`` (where, for messages) and the mapping itself."""

    origin: str
    source: str
    data: Mapping[str, Any]


def find_eps_key(data: Any, keys: tuple[str, ...]) -> Optional[tuple[str, float]]:
    """The first of ``keys`` with a numeric value in ``data``, searching nested dicts after the top level."""
    if not isinstance(data, Mapping):
        return None
    for key in keys:
        value = data.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return key, float(value)
    for sub in data.values():
        if isinstance(sub, Mapping):
            found = find_eps_key(sub, keys)
            if found is not None:
                return found
    return None


def rounded(value: float, dtype: str) -> Optional[float]:
    """``value`` stored in the floating dtype named ``dtype`` (None for a non-float dtype)."""
    dt = _FLOAT_DTYPES.get(dtype)
    return None if dt is None else float(torch.tensor(value, dtype=torch.float64).to(dt))


def _effective(site: Site) -> Optional[float]:
    if site.eps is not None:
        return float(site.eps)
    if site.kind == "RMSNorm" and site.detected_by in ("module", "functional") and site.input_dtype in _FLOAT_DTYPES:
        return float(torch.finfo(_FLOAT_DTYPES[site.input_dtype]).eps)
    return None


def _graph_eps_node(nodes: set) -> Optional[fx.Node]:
    """The ``+ eps`` node of a hand-written norm: between its statistic and the sqrt/rsqrt (eps inside), or
    after ``std`` (eps outside)."""
    for node in nodes:
        name = op_name(node)
        if name in ("rsqrt", "sqrt", "pow") and node.args and isinstance(node.args[0], fx.Node):
            cur = node.args[0]
            for _ in range(6):
                cur = strip_neutral(cur)
                if not isinstance(cur, fx.Node):
                    break
                if op_name(cur) == "add" and scalar_operand(cur) is not None:
                    return cur
                if op_name(cur) in ("clamp", "maximum") and cur.args:
                    return cur
                break
        if name == "std":
            for user in node.users:
                if op_name(user) == "add" and scalar_operand(user) is not None:
                    return user
    return None


def eps_dtype_of(site: Site, nodes: Optional[set]) -> tuple[Optional[str], Optional[str]]:
    """(the dtype eps is added in, how that was found); see the module doc for the order of sources."""
    f = site.formula
    if f is not None and f.eps_dtype:
        return f.eps_dtype, "formula"
    if site.detected_by in ("module", "functional") and site.input_dtype in _FLOAT_DTYPES:
        acc = "float32" if site.input_dtype in ("float16", "bfloat16") else site.input_dtype
        return acc, "fused kernel (accumulates in float32 for half input)"
    if nodes:
        node = _graph_eps_node(nodes)
        dt = node_dtype(node) if node is not None else None
        if dt is not None:
            return str(dt).replace("torch.", ""), "dtype of the + eps node"
    if site.compute_dtype:
        return site.compute_dtype, "compute dtype of the hand-written statistics"
    return None, None


def _eps_missing(site: Site, hints: dict) -> bool:
    if site.detected_by != "pattern" or site.eps is not None:
        return False
    f = site.formula
    if f is not None and f.eps_position is not None:
        return f.eps_position == "none"
    return hints.get("how_eps") == "none"


def analyse(ctx: Any, records: list) -> None:
    """Fill ``site.eps_facts`` for every record (``records``: :class:`normaudit.facts.sites.SiteRecord`).

    ``ctx`` is the :class:`normaudit.facts.FactContext`; its ``config_sources`` (a list of
    :class:`ConfigSource`) are compared, or, when empty, ``config``/``config_source`` with the origin in
    ``options["config_origin"]``.
    """
    sources: list[ConfigSource] = list(getattr(ctx, "config_sources", None) or [])
    if not sources and getattr(ctx, "config", None):
        origin = (getattr(ctx, "options", None) or {}).get("config_origin") or "model"
        sources = [ConfigSource(origin, ctx.config_source or "the config", ctx.config)]
    for rec in records:
        site: Site = rec.site
        facts = EpsFacts(effective=_effective(site), missing=_eps_missing(site, getattr(rec, "hints", {}) or {}))
        for src in sources:
            found = find_eps_key(src.data, EPS_KEYS.get(site.kind, ()))
            if found is None:
                continue
            key, value = found
            matches = facts.effective is not None and math.isclose(facts.effective, value, rel_tol=_REL_TOL)
            facts.declared.append(ConfigEps(origin=src.origin, source=src.source, key=key, value=value,
                                            matches=matches))
        if facts.effective is not None:
            facts.dtype, facts.dtype_basis = eps_dtype_of(site, getattr(rec, "nodes", None))
            if facts.dtype is not None:
                facts.in_dtype = rounded(facts.effective, facts.dtype)
        site.eps_facts = facts
    groups: dict[tuple[str, str], list[Site]] = {}
    for rec in records:
        s = rec.site
        if s.detected_by != "checkpoint" and s.eps_facts.effective is not None:
            groups.setdefault((s.class_name, s.kind), []).append(s)
    for members in groups.values():
        counts = Counter(s.eps_facts.effective for s in members)
        value, n = counts.most_common(1)[0]
        majority = value if n * 2 > len(members) else None
        for s in members:
            s.eps_facts.peers = len(members)
            s.eps_facts.peer_eps = majority
            s.eps_facts.peer_count = n if majority is not None else 0
