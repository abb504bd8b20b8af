"""Hand-written norms, recognised by what they compute: a statistic over some dims (:mod:`.statistics`),
turned into a scale by ``sqrt``/``rsqrt``/``pow(-0.5)`` (or ``std`` itself), applied to the same tensor by
``mul``/``div`` (:mod:`.application`). ``kind`` follows the computation, whatever the class is called:

- a centred numerator (``x - mean``) -> LayerNorm; a grouped view of it given back ``x``'s layout ->
  GroupNorm (:mod:`.group_norm`);
- ``x`` itself -> RMSNorm (Zhang & Sennrich 2019), also when the statistic is a variance
  (``x * rsqrt(var(x) + eps)``: formula variance ``unbiased``, ``mean_subtracted`` False);
- a gated numerator (``x * sigmoid(v * x) / group_std``) or a ``max``/``+`` of denominators, and a
  cumulative statistic -> Other (EvoNorm: Liu et al. 2020);
- a sum of squares (``x * rsqrt(sum(x^2) + eps)``) -> RMSNorm inside a module that is only a norm and owns a
  gain, else L2Norm (a unit vector, :mod:`.l2`);
- the 2-norm forms (:mod:`.l2`) and frozen BatchNorms (:mod:`.frozen_batchnorm`) are found on the same walk.

A statistic of a parameter (weight standardisation) is no site."""
from __future__ import annotations

from typing import Any, Optional

from torch import fx

from normaudit.facts.sites.activations import is_act
from normaudit.facts.sites.application import apply_node, combined_denominator, feeds_from, norm_like, \
    numerator_form
from normaudit.facts.sites.frozen_batchnorm import add_frozen_batchnorm, buffer_stat
from normaudit.facts.sites.group_norm import finish_group_norm, group_view, restored
from normaudit.facts.sites.l2 import add_l2, grn_root, has_gain, l2_stat, learned_rescale
from normaudit.facts.sites.statistics import analyse_stat, find_stat, is_root
from normaudit.vocabulary.graph import op_name, owner, scalar_operand, shape
from normaudit.vocabulary.kinds import L2_KIND, builtin_kind


def hand_written_sites(gm: fx.GraphModule, modules: dict, claimed: set, act: Optional[set], add_pattern,
                       data: Optional[set] = None) -> None:
    """Detector 3 of :mod:`normaudit.facts.sites`: statistics turned into a scale by a root and applied to the
    tensor they were taken on (and the 2-norm forms, and frozen BatchNorms read off an exported graph). New
    sites go through ``add_pattern`` (the closure of :func:`normaudit.facts.sites.discover_sites`), which
    also extends ``claimed``. ``data`` (default ``act``): the nodes a statistic may be taken on
    (:func:`normaudit.facts.sites.activations.activation_nodes` with ``created``)."""
    data = act if data is None else data
    for node in gm.graph.nodes:
        if node in claimed or builtin_kind(modules.get(owner(node, modules))) is not None:
            continue
        found = _statistic(node, act, add_pattern, modules, data)
        if found is not None:
            stat, eps, how = found
            _add_scaled_statistic(node, stat, eps, how, act, add_pattern, modules, data)


def _statistic(node: fx.Node, act: Optional[set], add_pattern, modules: dict,
               data: Optional[set]) -> Optional[tuple[fx.Node, Optional[float], str]]:
    """The statistic ``node`` turns into a scale: (statistic node, eps, how eps enters) when ``node`` is a root
    of one (:func:`find_stat`) or a ``std``; else None. A root of a per-channel buffer (a frozen BatchNorm) and
    a 2-norm are recorded here instead (:func:`add_frozen_batchnorm`, :func:`add_l2`)."""
    if grn_root(node):  # GRN with its 2-norm written out: sqrt(sum(x^2)) divided by its channel mean
        add_l2(node, act, add_pattern, modules, data)
        return None
    if is_root(node):
        found = find_stat(node.args[0])
        if found is None:
            frozen = buffer_stat(node.args[0], act)
            if frozen is not None:
                add_frozen_batchnorm(node, frozen, act, add_pattern, modules)
        return found
    if op_name(node) == "std":
        return node, None, "none"
    if l2_stat(node) is not None:
        add_l2(node, act, add_pattern, modules, data)
    return None


def _root_divides(node: fx.Node) -> bool:
    """``node`` gives the std or RMS itself (``sqrt``, ``std``, ``pow(x, 0.5)``), which divides the tensor; else
    it gives the inverse (``rsqrt``, ``pow(x, -0.5)``), which multiplies it."""
    name = op_name(node)
    return name in ("std", "sqrt") or (name == "pow" and node.args[1] == 0.5)


def _add_scaled_statistic(node: fx.Node, stat: fx.Node, eps: Optional[float], how: str, act: Optional[set],
                          add_pattern, modules: dict, data: Optional[set]) -> None:
    """Record the site of the statistic ``stat`` made a scale at ``node`` when that scale is applied to the
    tensor the statistic was taken on; its kind from the numerator and denominator (module docstring)."""
    info = analyse_stat(stat)
    if info is None or not is_act(info["source"], data):
        return  # statistics of a parameter (weight standardisation) normalise no activation
    scale = node
    if _root_divides(node):
        # eps added to the std/RMS after the root: x / (sqrt(var) + eps), x / (x.std() + eps)
        adds = [u for u in node.users if op_name(u) == "add" and scalar_operand(u) is not None]
        if adds:
            scale, eps, how = adds[0], scalar_operand(adds[0]), "outside_sqrt"
    by = "div" if _root_divides(node) else "mul"
    applied = apply_node(scale, info["source"], by, info["dims"], act)
    if applied is None:
        return
    path = owner(node, modules)
    l2 = info.get("statistic") == "l2_norm"
    if l2 and not norm_like(modules.get(path)) and eps is None and not learned_rescale(applied, act):
        return  # x / sqrt(sum(x^2)) outside a norm module, with no eps and no gain: a cosine similarity
    l2_outside = l2 and not (norm_like(modules.get(path)) and has_gain(modules.get(path)))
    other = next((a for a in applied.args[:2] if not feeds_from(a, scale)), None)
    form = numerator_form(other, info["source"], act)
    centered = info["centered"] if form in ("unknown", "gated") else form == "centred"
    combined = combined_denominator(scale, applied)
    cumulative = info.get("statistic") == "cumulative"  # statistics over steps 0..t: no per-step norm
    kind = "Other" if form == "gated" or combined or cumulative else L2_KIND if l2_outside else None
    group = group_view(info["source"], info["dims"]) if kind is None and centered else None
    if group is not None and not restored(applied, shape(group[0])):
        group = None  # the result stays in the view: a norm over the view's dims (a framed waveform)
    if group is not None:  # a hand-written GroupNorm: the site normalises the tensor before the reshape
        base, split = group
        rec = add_pattern(path, node, stat, applied, base, list(range(1, len(shape(base)))),
                          True, info["variance"], eps, how, kind="GroupNorm")
        finish_group_norm(rec, split, modules)
        return
    rec = add_pattern(path, node, stat, applied, info["source"], info["dims"], centered,
                      info["variance"], eps, how, kind=kind)
    _pattern_hints(rec, info, kind, form)


def _pattern_hints(rec: Any, info: dict[str, Any], kind: Optional[str], form: str) -> None:
    """The hints the formula and eps passes read off a hand-written site: a cumulative statistic and its time
    dim, the form of an Other (``gated`` or ``combined``), a sum of squares (``statistic="l2_norm"``)."""
    if info.get("statistic") == "cumulative":
        rec.hints.update(statistic="cumulative", form="cumulative")
        rec.site.cumulative_dim = info["cumulative_dim"]
    else:
        if kind == "Other":
            rec.hints["form"] = "gated" if form == "gated" else "combined"
        if "statistic" in info:
            rec.hints["statistic"] = info["statistic"]
            rec.hints["sum_of_squares"] = True
