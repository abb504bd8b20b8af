"""Eps facts: for each site, the eps it actually adds, what each configuration declares for it, what the
other sites of its class use, and what is left of it in the dtype it is added in (:class:`EpsFacts` on
``site.eps_facts``). Rules ``NE1xx`` compare these; this pass only measures.

- ``effective``: ``site.eps``; for ``nn.RMSNorm(eps=None)`` / ``F.rms_norm(eps=None)`` the
  ``torch.finfo(input dtype).eps`` PyTorch substitutes (its docs). ``missing``: a hand-written norm whose
  statistic reaches ``sqrt``/``rsqrt`` with nothing added. ``statistic`` (:func:`statistic_of`): what eps is
  added to, which decides the rows that divide 0 by 0 without it: every constant row for a variance, only an
  all-zero row for a mean square (RMSNorm) or an L2 norm (``x / ||x||_2``). ``model_output``
  (:func:`reaches_output`): the normalised tensor is returned as a model output (an L2-normalised embedding).
  An L2 norm's eps (``F.normalize``'s clamp, 1e-12 by default, in the unit of ``||x||``) is compared with a
  configuration only when its constructor passes a config key: ``layer_norm_eps``/``rms_norm_eps`` name the
  eps of the model's norm layers, not that clamp.
- ``declared``: one :class:`ConfigEps` per configuration that names an eps key for the site's kind
  (:data:`EPS_KEYS`, first key found, nested dicts searched; a bare ``eps``/``epsilon`` at the top level
  only, :data:`GENERIC_EPS_KEYS`), each with its ``origin`` (``cli``: ``--config``; ``checkpoint``: the config
  that came with the weights; ``model``: a config the model keeps itself, wherever it keeps it
  (:func:`normaudit.loaders.config.model_configs`: ``self.config``, ``self.args``, ``self.params``, ... on
  the root or on the submodule holding the norm, the deepest one counting); ``library``: a library's config
  (transformers, diffusers, timm), whose code may keep another eps on purpose) and ``source``.
- ``constructor_eps``/``changed``: the config key the norm's constructor call passes as eps, read from its
  source (:mod:`normaudit.facts.constructor`), and whether the eps it holds differs from every value the
  model's own configs give that key: then it was changed after construction, whatever the config's origin.
- ``peers``/``peer_eps``/``peer_count``/``role``: sites grouped by role (:func:`assign_peers`): one class and
  kind, and one constructor line or one attribute name in modules of one class. Libraries give one class
  different eps in different roles on purpose (qk-norms vs block norms, attention GroupNorm vs resnet
  GroupNorm, head vs backbone BatchNorm; transformers' ConvNeXt hard-codes 1e-6 in its ``ConvNextLayerNorm``
  block norms while its final ``nn.LayerNorm`` takes ``layer_norm_eps``).
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
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
from torch import fx

from normaudit.facts.constructor import builds_elsewhere, constructor_eps, constructor_literal_eps
from normaudit.facts.context import FactContext, Facts
from normaudit.report import ConfigEps, EpsFacts, Site
from normaudit.vocabulary.dtypes import DTYPES, HALF_DTYPES, dtype_name, torch_dtype
from normaudit.vocabulary.graph import dtype as node_dtype
from normaudit.vocabulary.graph import FOLLOW, NEUTRAL_OPS, forward_walk, op_name, scalar_operand, strip_neutral


__all__ = ["EPS_KEYS", "GENERIC_EPS_KEYS", "ConfigSource", "find_eps_key", "find_generic_eps", "all_values",
           "eps_dtype_of", "rounded", "declared_eps", "assign_peers", "analyse", "statistic_of", "reaches_output"]

#: Configuration keys declaring the eps of each kind of norm, most specific first.
EPS_KEYS: dict[str, tuple[str, ...]] = {
    "LayerNorm": ("layer_norm_eps", "layer_norm_epsilon", "layernorm_eps", "ln_eps", "norm_eps", "norm_epsilon"),
    "RMSNorm": ("rms_norm_eps", "rms_norm_epsilon", "rmsnorm_eps", "norm_eps", "norm_epsilon", "layer_norm_epsilon",
                "layer_norm_eps"),
    # diffusers names the eps of its ResNet/attention GroupNorms norm_eps (UNet2DConditionModel config) and
    # resnet_eps (its blocks' arguments)
    "GroupNorm": ("group_norm_eps", "group_norm_epsilon", "gn_eps", "resnet_eps", "norm_eps", "norm_epsilon"),
    "BatchNorm": ("batch_norm_eps", "batch_norm_epsilon", "bn_eps"),
}
#: keys of EPS_KEYS that name no kind of norm: diffusers' ``norm_eps`` is its GroupNorms' eps in a UNet config
#: and its LayerNorms' in a Transformer2DModel config, so a norm whose constructor writes its eps as a number
#: (``nn.GroupNorm(..., eps=1e-6)``) is not declared by them (:func:`declared_eps`'s ``literal``)
UNSPECIFIC_EPS_KEYS = ("norm_eps", "norm_epsilon")
#: keys naming the eps of "the norms" of a model without saying which kind; read at the top level only
GENERIC_EPS_KEYS = ("eps", "epsilon")
_GENERIC_KINDS = ("LayerNorm", "RMSNorm")
_REL_TOL = 1e-6


@dataclass
class ConfigSource:
    """One configuration the model may be compared with: ``origin`` (``cli``, ``checkpoint``, ``model``,
    ``library``, see the module doc), ``source`` (where, for messages) and the mapping itself."""

    origin: str
    source: str
    data: Mapping[str, Any]
    #: the model's own configs only: the submodule path keeping it (``""`` the root); None for --config and
    #: checkpoint configs, which apply to the whole model
    scope: Optional[str] = None


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


def find_generic_eps(data: Any) -> Optional[tuple[str, float]]:
    """A bare ``eps``/``epsilon`` key at the top level of ``data`` only (nested ones belong to optimisers)."""
    if isinstance(data, Mapping):
        for key in GENERIC_EPS_KEYS:
            value = data.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return key, float(value)
    return None


def all_values(data: Any, key: Optional[str], depth: int = 0) -> list[float]:
    """Every numeric value of ``key`` in ``data`` and its nested mappings."""
    if not key or not isinstance(data, Mapping) or depth > 6:
        return []
    out = []
    value = data.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(float(value))
    for sub in data.values():
        if isinstance(sub, Mapping):
            out += all_values(sub, key, depth + 1)
    return out


def rounded(value: float, dtype: str) -> Optional[float]:
    """``value`` stored in the floating dtype named ``dtype`` (None for a non-float dtype)."""
    return None if dtype not in DTYPES else float(torch.tensor(value, dtype=torch.float64).to(torch_dtype(dtype)))


def _effective(site: Site) -> Optional[float]:
    if site.eps is not None:
        return float(site.eps)
    if site.kind == "RMSNorm" and site.detected_by in ("module", "functional") and site.input_dtype in DTYPES:
        return DTYPES[site.input_dtype].eps
    return None


def _graph_eps_node(nodes: set) -> Optional[fx.Node]:
    """The ``+ eps`` node of a hand-written norm: between its statistic and the sqrt/rsqrt (eps inside), or
    after ``std`` (eps outside)."""
    for node in nodes:
        name = op_name(node)
        if name in ("rsqrt", "sqrt", "pow") and node.args and isinstance(node.args[0], fx.Node):
            cur = strip_neutral(node.args[0])
            if op_name(cur) == "add" and scalar_operand(cur) is not None:
                return cur
            if op_name(cur) in ("clamp", "maximum") and cur.args:
                return cur
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
    if site.detected_by in ("module", "functional") and site.input_dtype in DTYPES:
        acc = "float32" if site.input_dtype in HALF_DTYPES else site.input_dtype
        return acc, "fused kernel (accumulates in float32 for half input)"
    if nodes:
        node = _graph_eps_node(nodes)
        dt = node_dtype(node) if node is not None else None
        if dt is not None:
            return dtype_name(dt), "dtype of the + eps node"
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


_CENTRED_KINDS = ("LayerNorm", "GroupNorm", "BatchNorm", "InstanceNorm")


def statistic_of(site: Site, hints: Mapping[str, Any]) -> Optional[str]:
    """What the site's eps is added to: ``variance`` (a centred statistic, or timm SimpleNorm's ``var(x)``:
    0 on every constant row), ``mean_square`` (RMSNorm: 0 on an all-zero row only) or ``l2_norm`` (a unit
    vector ``x / ||x||_2``, sum of squares or ``torch.norm``: 0 on an all-zero row only); None for other kinds.
    Pattern sites read the hints of :func:`normaudit.facts.sites.discover_sites`, the others their kind."""
    if site.detected_by == "pattern":
        if hints.get("statistic") in ("l2_norm", "running_var"):
            return "l2_norm" if hints["statistic"] == "l2_norm" else "variance"
        variance = hints.get("variance")
        if variance in ("population", "unbiased"):
            return "variance"
        return "mean_square" if variance == "mean_square" else None
    if site.kind in _CENTRED_KINDS:
        return "variance"
    return "mean_square" if site.kind == "RMSNorm" else None


def reaches_output(node: Optional[fx.Node], depth: int = 8) -> bool:
    """``node`` is one of the graph's outputs, or reaches one through casts and layout-only ops (views,
    ``getitem``): the normalised tensor is returned to the caller as it is."""
    def step(user: fx.Node, n: fx.Node) -> Any:
        if user.op == "output":
            return True
        return FOLLOW if op_name(user) in NEUTRAL_OPS or op_name(user) in _LAYOUT_OPS else None

    return isinstance(node, fx.Node) and forward_walk(node, step, depth) is True


_LAYOUT_OPS = ("view", "reshape", "_unsafe_view", "permute", "transpose", "contiguous", "clone", "getitem",
               "alias", "detach", "unsqueeze", "squeeze", "expand", "flatten")


def _sources(ctx: Any) -> list[ConfigSource]:
    sources: list[ConfigSource] = list(getattr(ctx, "config_sources", None) or [])
    if not sources and getattr(ctx, "config", None):
        origin = getattr(ctx, "config_origin", None) or "model"
        sources = [ConfigSource(origin, ctx.config_source or "the config", ctx.config)]
    return sources


def _in_scope(src: ConfigSource, module: str) -> bool:
    return not src.scope or module == src.scope or module.startswith(src.scope + ".")


def _parent(modules: Mapping[str, Any], path: str) -> tuple[Any, Optional[str]]:
    """(the module holding ``path``, its attribute name there)."""
    if not path:
        return None, None
    head, _, attr = path.rpartition(".")
    return modules.get(head), attr


def _from_constructor(rec: Any, modules: Mapping[str, Any], read: Any) -> Any:
    """What ``read`` (:func:`constructor_eps`, :func:`constructor_literal_eps`) finds in the constructor call
    of the site's module (module and pattern sites only), or None."""
    site: Site = rec.site
    module = modules.get(site.module) if site.module else None
    if module is None or site.detected_by not in ("module", "pattern", "module_walk"):
        return None
    parent, attr = _parent(modules, site.module)
    return read(site.definition, module, parent, attr)


def _passed_key(rec: Any, modules: Mapping[str, Any]) -> Optional[tuple[str, str]]:
    """(key, text) of the config key the site's constructor passes as eps (module and pattern sites only)."""
    return _from_constructor(rec, modules, constructor_eps)


def _literal_eps(rec: Any, modules: Mapping[str, Any]) -> Optional[float]:
    """The number the site's constructor call writes as its eps (module and pattern sites only), or None."""
    return _from_constructor(rec, modules, constructor_literal_eps)


def _at_path(data: Any, text: Optional[str]) -> Optional[tuple[str, float]]:
    """The number the constructor's eps expression ``text`` names in ``data`` when it is a dotted config path
    into a sub-config (``config.vision_config.rms_norm_eps`` -> ``data["vision_config"]["rms_norm_eps"]``, as
    ``("vision_config.rms_norm_eps", 1e-06)``); None for a top-level key, another expression or no number."""
    parts = (text or "").split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    while parts and parts[0] in ("self", "config"):
        parts.pop(0)
    if len(parts) < 2:
        return None
    node = data
    for part in parts:
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, (int, float)) and not isinstance(node, bool):
        return ".".join(parts), float(node)
    return None


def declared_eps(site: Site, effective: Optional[float], sources: list[ConfigSource],
                 passed: Optional[str], passed_text: Optional[str] = None,
                 literal: bool = False) -> tuple[list[ConfigEps], bool]:
    """What each configuration declares for ``site`` and whether its eps was changed after construction.

    ``--config`` and checkpoint configs apply to every site; of the model's own configs (``scope``: the
    submodule keeping it) only the deepest one holding the site that declares a key counts. ``passed`` (the
    key the constructor passes) is looked up first, at the sub-config ``passed_text`` names when it is a dotted
    path (``eps=config.vision_config.rms_norm_eps``: ERNIE-4.5-VL's resampler, whose text config says another
    eps). ``changed``: the constructor passes a key the model's own
    configs in scope hold, and the eps differs from every value they give it (so it was altered after
    construction, whatever the configs' origin). ``literal``: the constructor writes the eps as a number, so
    only keys naming the site's kind of norm declare it (not :data:`UNSPECIFIC_EPS_KEYS`, nor a bare ``eps``).
    """
    keys = EPS_KEYS.get(site.kind, ())
    if literal:
        keys = tuple(k for k in keys if k not in UNSPECIFIC_EPS_KEYS)
    keys = ((passed,) + keys) if passed else keys
    out: list[ConfigEps] = []
    own = sorted((s for s in sources if s.scope is not None and s.origin in ("model", "library")
                  and _in_scope(s, site.module)), key=lambda s: -len(s.scope or ""))
    shared = [s for s in sources if s.scope is None]
    own_taken = False
    for src in shared + own:
        is_own = src.scope is not None
        if is_own and own_taken:
            continue
        at_path = _at_path(src.data, passed_text) if passed else None
        found = at_path or find_eps_key(src.data, keys) or (
            find_generic_eps(src.data) if site.kind in _GENERIC_KINDS and not literal else None)
        if found is None:
            continue
        key, value = found
        own_taken = own_taken or is_own
        out.append(ConfigEps(origin=src.origin, source=src.source, key=key, value=value,
                             matches=_close(effective, value), passed=bool(passed) and (key == passed or bool(at_path))))
    held = [v for s in own for v in all_values(s.data, passed)] if passed else []
    changed = bool(held) and effective is not None and not any(_close(effective, v) for v in held)
    return out, changed


def _close(a: Optional[float], b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=_REL_TOL)


def analyse(ctx: Any, records: list) -> None:
    """Fill ``site.eps_facts`` for every record (``records``: :class:`normaudit.facts.sites.SiteRecord`).

    ``ctx`` is the :class:`normaudit.facts.FactContext`; its ``config_sources`` (a list of
    :class:`ConfigSource`) are compared, or, when empty, ``config``/``config_source`` with the origin in
    ``config_origin``. Peers: :func:`assign_peers`.
    """
    sources = _sources(ctx)
    cap = getattr(ctx, "cap", None)
    modules: Mapping[str, Any] = getattr(cap, "modules", None) or {}
    for rec in records:
        site: Site = rec.site
        hints = getattr(rec, "hints", {}) or {}
        facts = EpsFacts(effective=_effective(site), missing=_eps_missing(site, hints),
                         statistic=statistic_of(site, hints), model_output=reaches_output(getattr(rec, "output", None)))
        passed = _passed_key(rec, modules) if facts.effective is not None else None
        if passed is not None:
            facts.constructor_eps = passed[1]
        literal = passed is None and facts.effective is not None and _literal_eps(rec, modules) is not None
        if facts.statistic == "l2_norm" and passed is None:
            # the clamp of an L2 norm (F.normalize's eps=1e-12, in the unit of ||x||, not of a variance) is no
            # norm-layer eps: a config's layer_norm_eps/rms_norm_eps names it only when its constructor passes it
            facts.declared, facts.changed = [], False
        else:
            facts.declared, facts.changed = declared_eps(site, facts.effective, sources,
                                                         passed[0] if passed else None, passed[1] if passed else None,
                                                         literal=literal)
        if facts.effective is not None:
            facts.dtype, facts.dtype_basis = eps_dtype_of(site, getattr(rec, "nodes", None))
            if facts.dtype is not None:
                facts.in_dtype = rounded(facts.effective, facts.dtype)
        site.eps_facts = facts
    assign_peers([r.site for r in records], modules)


def _role_keys(site: Site, modules: Mapping[str, Any]) -> list[tuple]:
    """The roles a site has: its constructor line (not where that line builds something else: the user's line
    that built a whole library model, :func:`builds_elsewhere`), and its attribute name in a module of its
    parent's class (numbered children of containers: the path with indices starred)."""
    keys: list[tuple] = []
    functional = site.detected_by == "functional"
    d = site.call if functional else site.definition   # a functional norm is "constructed" where it is called
    parent, attr = _parent(modules, site.module)
    if d is not None and d.line and (functional or not builds_elsewhere(d, site.class_name, attr)):
        keys.append(("line", f"{'called' if functional else 'constructed'} at {Path(d.file).name}:{d.line}",
                     str(d.file), d.line))
    nth = (site.call_index,) if functional else ()
    if attr is not None:
        if attr.isdigit() or parent is None:
            pattern = ".".join("*" if p.isdigit() else p for p in site.module.split("."))
            keys.append(("path", f"modules {pattern}", pattern, *nth))
        else:
            cls = type(parent).__name__
            keys.append(("attr", f"attribute {attr} of {cls}", cls, attr, *nth))
    elif not site.module:
        keys.append(("root", "the model itself", *nth))
    return keys


def assign_peers(sites: list[Site], modules: Mapping[str, Any]) -> None:
    """Group sites of one role (same class and kind, and the same constructor line or the same attribute of
    modules of one class; groups sharing a member merge) and set ``peers``/``peer_eps``/``peer_count``/``role``.

    Roles, not classes: libraries give one class different eps in different roles on purpose (qk-norms vs block
    norms, attention GroupNorm vs resnet GroupNorm, head vs backbone BatchNorm, patch-embed vs block norms)."""
    members = [s for s in sites if s.detected_by != "checkpoint" and s.eps_facts is not None
               and s.eps_facts.effective is not None]
    root = list(range(len(members)))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    first: dict[tuple, int] = {}
    labels: dict[int, str] = {}
    for i, s in enumerate(members):
        for key in _role_keys(s, modules):
            labels.setdefault(i, key[1])
            k = (s.class_name, s.kind, key[0], *key[2:])
            if k in first:
                root[find(i)] = find(first[k])
            else:
                first[k] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(members)):
        groups.setdefault(find(i), []).append(i)
    for idx in groups.values():
        counts = Counter(members[i].eps_facts.effective for i in idx)
        value, n = counts.most_common(1)[0]
        majority = value if n * 2 > len(idx) else None
        for i in idx:
            e = members[i].eps_facts
            e.peers, e.peer_eps, e.peer_count = len(idx), majority, (n if majority is not None else 0)
            e.role = labels.get(idx[0])


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``eps``: :func:`analyse` over every site of the whole model (peers compare across all of them)."""
    analyse(ctx, facts.records)
