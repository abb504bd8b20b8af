"""Formula facts: what each normalisation site computes, read from the graph and confirmed numerically.

For every LayerNorm/RMSNorm-like site (and the fused BatchNorm/GroupNorm/InstanceNorm ops) this pass sets
``site.formula`` (:class:`normaudit.report.Formula`):

- ``mean_subtracted``; ``variance``: ``population`` (Ba et al. 2016 eq. 4, ``torch.nn.LayerNorm``),
  ``unbiased`` (Bessel-corrected, ``x.std()``/``torch.var`` default) or ``mean_square`` (RMSNorm, Zhang &
  Sennrich 2019); ``eps_position``: ``inside_sqrt`` (``sqrt(v + eps)``), ``outside_sqrt`` (``sqrt(v) + eps``),
  ``clamp``, ``none``; ``inverted_scale``: the input is *multiplied* by the RMS (``x / rsqrt(...)``) so the
  output grows with the input; ``gain``: ``weight`` (``* w``), ``one_plus_weight`` (``* (1 + w)``, Gemma),
  ``none``; ``bias``; ``size``: the number of elements each statistic is taken over.
- ``fused``: a fused kernel (``nn.LayerNorm``, ``F.layer_norm``, ``nn.RMSNorm``, ``F.rms_norm``, batch/group/
  instance norm) whose statistics accumulate in float32 for half-precision input.
- ``upcast``: the statistics are kept in float32 when the input is half precision: an explicit cast before
  the square (``x.to(torch.float32).pow(2).mean()``), a fused kernel, or ``std`` (its kernel accumulates in
  float32 and the std itself fits). A property of the code, whatever ``--dtype`` is.
- ``stats_dtype``: the dtype the squares/variance are held in at the audited ``--dtype``; ``eps_dtype``: the
  dtype of the tensor eps is added to (what decides whether a tiny eps rounds to 0).
- ``confirmed``: None when only the graph was read; True/False when the site's module was run alone and a
  reference formula did / did not reproduce it (the ``formula-probe`` pass,
  :mod:`normaudit.probes.formula_confirm`, which also fills ``eps_measured``/``eps_matches``/``max_error``, the
  measured ``upcast`` and ``constant_row_finite``).
- ``notes``: where the probe overrode the graph, or why the module was not probed.
- ``cast`` and ``text`` (:func:`run_text`, after the probe): where the cast back sits, and
  :func:`normaudit.facts.formula_text.formula_text`.

Fused ops give their facts from the op; hand-written norms from the site's nodes and the hints of
:mod:`normaudit.facts.sites`.

Example::

    >>> from normaudit.report import Formula
    >>> from normaudit.facts.formula_text import formula_text
    >>> formula_text("RMSNorm", Formula(variance="mean_square", gain="one_plus_weight", bias=False), ["feature"])
    'RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w) over [feature]'
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import fx

from normaudit.facts.context import FactContext, Facts
from normaudit.facts.formula_text import formula_text, special_text
from normaudit.facts.sites import SiteRecord
from normaudit.report import Formula
from normaudit.vocabulary.dtypes import HALF_DTYPES as HALF, dtype_name
from normaudit.vocabulary.graph import (NEUTRAL_OPS, dtype, op_name, owner, reduction, scalar_operand, strip_neutral,
                                       strip_through)
from normaudit.vocabulary.kinds import L2_KIND

FUSED_KINDS = ("LayerNorm", "RMSNorm", "BatchNorm", "GroupNorm", "InstanceNorm")
# ops a parameter passes through on its way to the gain multiply (casts, views, broadcasting)
_PARAM_PATH = NEUTRAL_OPS + ("view", "unsqueeze", "expand", "expand_as", "getitem", "reshape", "squeeze",
                             "flatten", "permute", "transpose")
#: value-preserving reshapes between the normalised tensor and its gain multiply, followed forwards: a grouped
#: view back to the features (``.view(N, C, H, W)``, ``.reshape``), ``.flatten(-2)`` of a gated group RMSNorm
#: that normalises (B, L, G, C/G) and scales (B, L, C), ``.permute``/``.transpose`` back to the input's layout
_RESHAPES = ("view", "type_as", "reshape", "_unsafe_view", "flatten", "unflatten", "permute", "transpose", "movedim",
             "contiguous", "squeeze", "unsqueeze")
#: steps back along :data:`_PARAM_PATH` to a gain's parameter (8 nodes looked at)
_PARAM_STEPS = 7
_CAST_DTYPES = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}


_dt = dtype_name


# ------------------------------------------------------------------------------------------- graph facts
class _GainReader:
    """What the graph says about a site's nodes (parameters = placeholders that are not user inputs, or
    ``get_attr`` nodes)."""

    def __init__(self, user_inputs: list[str]):
        self.user_inputs = set(user_inputs)

    def is_param(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and (
            node.op == "get_attr" or (node.op == "placeholder" and node.name not in self.user_inputs))

    def gain_form(self, node: Any) -> Optional[str]:
        """``weight`` when ``node`` is a parameter (through casts/views), ``one_plus_weight`` for
        ``1 + parameter``, else None."""
        node = strip_through(node, _PARAM_PATH, _PARAM_STEPS)
        if not isinstance(node, fx.Node):
            return None
        if self.is_param(node):
            return "weight"
        if op_name(node) == "add" and scalar_operand(node) == 1.0:
            other = next((a for a in node.args if isinstance(a, fx.Node)), None)
            return "one_plus_weight" if self._reaches_param(other) else None
        return None

    def _reaches_param(self, node: Any) -> bool:
        node = strip_through(node, _PARAM_PATH, _PARAM_STEPS)
        return isinstance(node, fx.Node) and self.is_param(node)


def _cast_target(node: fx.Node) -> Optional[torch.dtype]:
    """The dtype a cast node converts to, from its arguments (meta alone cannot tell a float32 capture's
    explicit ``.to(torch.float32)`` from a no-op)."""
    if node.op == "call_method" and str(node.target) in _CAST_DTYPES:
        return _CAST_DTYPES[str(node.target)]
    for a in list(node.args[1:]) + list(node.kwargs.values()):
        if isinstance(a, torch.dtype):
            return a
    # type_as(other) and friends: an upcast only where the capture shows the dtype widen
    src = node.args[0] if node.args else None
    if dtype(node) is not None and dtype(src) is not None and dtype(node).itemsize > dtype(src).itemsize:
        return dtype(node)
    return None


def _upcast_before(stat: fx.Node, stop: Optional[fx.Node], within: Optional[set]) -> bool:
    """A cast to float32/float64 on the way from the site's input to its statistic (inside the site's module
    when ``within`` is given: a cast elsewhere in the model says nothing about this norm)."""
    frontier, seen = [stat], 0
    while frontier and seen < 40:
        node = frontier.pop()
        seen += 1
        if node is stop or (within is not None and node not in within):
            continue
        if op_name(node) == "to" and _cast_target(node) in (torch.float32, torch.float64):
            return True
        if node.op in ("placeholder", "get_attr"):
            continue
        frontier.extend(a for a in node.args if isinstance(a, fx.Node))
    return False


def _scale_node(rec: SiteRecord) -> Optional[fx.Node]:
    """The sqrt/rsqrt/pow(±0.5)/std node that turns the statistic into a scale."""
    for n in rec.nodes:
        name = op_name(n)
        if name in ("rsqrt", "sqrt") or (name == "pow" and len(n.args) > 1 and n.args[1] in (0.5, -0.5)):
            return n
    for n in rec.nodes:
        if op_name(n) in ("std", "std_mean"):
            return n
    return None


def _applied_node(rec: SiteRecord, scale: fx.Node) -> Optional[fx.Node]:
    for n in rec.nodes:
        if n is not scale and op_name(n) in ("mul", "div") and _feeds(scale, n):
            return n
    return None


def _feeds(src: fx.Node, dst: fx.Node, depth: int = 4) -> bool:
    frontier = [dst]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for a in n.args:
                if a is src:
                    return True
                if isinstance(a, fx.Node) and op_name(a) in NEUTRAL_OPS + ("add", "expand", "view", "unsqueeze"):
                    nxt.append(a)
        frontier = nxt
    return False


def _eps_node(scale: fx.Node, how: str) -> Optional[fx.Node]:
    """The node where eps enters: the ``add``/``clamp`` under the sqrt, or the ``add`` on the std/RMS."""
    if how in ("inside_sqrt", "clamp"):
        node = strip_neutral(scale.args[0]) if scale.args else None
        return node if isinstance(node, fx.Node) and op_name(node) in ("add", "clamp", "maximum") else None
    if how == "outside_sqrt":
        return next((u for u in scale.users if op_name(u) == "add" and scalar_operand(u) is not None), None)
    return None


def _affine(g: _GainReader, rec: SiteRecord, applied: fx.Node, owner_nodes: Optional[set]) -> tuple[Optional[str], bool]:
    """(gain form, bias) from the multiplies/adds by parameters around the applying node: before it on the
    normalised operand (``a_2 * (x - mean) / (std + eps)``) and after it (``(x * rsqrt(..)) * w + b``), staying
    inside the site's module."""
    gain, bias = None, False
    src = strip_neutral(rec.input) if rec.input is not None else None
    # backwards along the numerator
    node = next((a for a in applied.args if isinstance(a, fx.Node) and not _feeds_scale(a)), None)
    for _ in range(6):
        if not isinstance(node, fx.Node) or node is src:
            break
        name = op_name(node)
        if name == "mul":
            forms = [g.gain_form(a) for a in node.args[:2]]
            found = next((f for f in forms if f), None)
            if found:
                gain = gain or found
                node = node.args[1] if forms[0] else node.args[0]
                continue
            break
        if name in NEUTRAL_OPS:
            node = node.args[0] if node.args else None
            continue
        break
    # forwards from the applying node
    frontier, steps = [applied], 0
    while frontier and steps < 12:
        node = frontier.pop(0)
        steps += 1
        for u in node.users:
            if not u.users and op_name(u) not in ("output",):
                continue  # _assert_tensor_metadata and other sinks
            if owner_nodes is not None and u not in owner_nodes:
                continue
            name = op_name(u)
            if name in ("mul", "add"):
                other = [a for a in u.args[:2] if a is not node]
                form = g.gain_form(other[0]) if other else None
                if form is None and other and not isinstance(other[0], fx.Node):
                    frontier.append(u)  # a scalar multiple: keep following
                    continue
                if form is None:
                    continue
                if name == "mul":
                    gain = gain or form
                else:
                    bias = True
                frontier.append(u)
            elif name in NEUTRAL_OPS or name in _RESHAPES:
                frontier.append(u)  # reshape: a group norm's (N, G, -1) back to (N, C, H, W) before its affine
    return gain, bias


def _feeds_scale(node: fx.Node) -> bool:
    """True for the scale operand of the applying node (sqrt/rsqrt/std/+eps), False for the normalised one."""
    n = strip_neutral(node)
    for _ in range(3):
        if not isinstance(n, fx.Node):
            return False
        name = op_name(n)
        if name in ("rsqrt", "sqrt", "std", "std_mean") or (name == "pow" and len(n.args) > 1 and n.args[1] in (0.5, -0.5)):
            return True
        if name in ("add", "expand", "view", "unsqueeze") and n.args and isinstance(n.args[0], fx.Node):
            n = strip_neutral(n.args[0])
            continue
        return False
    return False


def formula_size(site) -> Optional[int]:
    """The number of elements each statistic of ``site`` is taken over (the product of its reduced dims' sizes);
    None when its input shape is unknown."""
    if site.input_shape and site.reduced_dims is not None:
        try:
            return math.prod(site.input_shape[d] for d in site.reduced_dims)
        except IndexError:
            return None
    return None


def graph_formula(rec: SiteRecord, g: _GainReader, owner_nodes: Optional[set] = None) -> Optional[Formula]:
    """Formula facts from the graph alone (no text, not confirmed), or None for a site it cannot describe."""
    s = rec.site
    in_dt = s.input_dtype
    if s.detected_by in ("module", "functional") and s.kind in FUSED_KINDS:
        mean = s.kind != "RMSNorm"
        return Formula(mean_subtracted=mean, variance="population" if mean else "mean_square",
                       eps_position="inside_sqrt", gain="weight" if s.affine_weight else "none",
                       bias=bool(s.affine_bias), inverted_scale=False, fused=True, upcast=True,
                       stats_dtype="float32" if in_dt in HALF else in_dt,
                       eps_dtype="float32" if in_dt in HALF else in_dt, size=formula_size(s))
    if s.detected_by != "pattern" or rec.stat is None:
        return None
    h = rec.hints
    if h.get("statistic") == "grn":
        # Global Response Normalization: x * (1 + w * nx) + b, nx = ||x||_2 / (mean_C ||x||_2 + eps)
        held = _dt(dtype(rec.stat))
        return Formula(mean_subtracted=False, variance="none", eps_position="outside_sqrt", gain="weight",
                       bias=True, inverted_scale=False, fused=False, upcast=False, stats_dtype=held, eps_dtype=held,
                       size=formula_size(s))
    if h.get("statistic") == "running_var":
        # frozen BatchNorm: x * (w * rsqrt(running_var + eps)) + (b - running_mean * scale), in the buffers' dtype
        held = _dt(dtype(rec.stat))
        return Formula(mean_subtracted=True, variance="population", eps_position=h.get("how_eps") or "none",
                       gain="weight" if s.affine_weight else "none", bias=bool(s.affine_bias), inverted_scale=False,
                       fused=False, upcast=held in ("float32", "float64") and in_dt in HALF, stats_dtype=held,
                       eps_dtype=held, size=formula_size(s))
    f = Formula(mean_subtracted=h.get("centered"), variance=h.get("variance"), size=formula_size(s))
    scale = _scale_node(rec)
    how = h.get("how_eps") or "none"
    if scale is not None and how == "none":
        add = _eps_node(scale, "outside_sqrt")
        if add is not None:
            how = "outside_sqrt"
            if s.eps is None:
                s.eps = scalar_operand(add)
    f.eps_position = how if how in ("inside_sqrt", "outside_sqrt", "clamp", "none") else "unknown"
    applied = _applied_node(rec, scale) if scale is not None else None
    if scale is not None and applied is not None:
        name = op_name(scale)
        inverse = name == "rsqrt" or (name == "pow" and scale.args[1] == -0.5)
        f.inverted_scale = (op_name(applied) == "div") == inverse
        gain, bias = _affine(g, rec, applied, owner_nodes)
        f.gain, f.bias = gain or "none", bias
    elif s.kind == L2_KIND:
        # x / max(||x||_2, eps) has no root node: its gain is the multiply the affine chain found, if any
        f.gain, f.bias = ("weight" if s.affine_weight else "none"), bool(s.affine_bias)
    red = reduction(rec.stat)
    stat_op = red.op if red is not None else None
    f.fused = False
    entry_dt = _entry_dtype(rec.stat, owner_nodes) or in_dt
    f.stats_dtype = _held_dtype(rec.stat, stat_op, red)
    f.upcast = (stat_op in ("std", "std_mean") or _upcast_before(rec.stat, strip_neutral(rec.input), owner_nodes)
                or (entry_dt in HALF and f.stats_dtype in ("float32", "float64")))
    eps_node = _eps_node(scale, how) if scale is not None else None
    f.eps_dtype = _dt(dtype(eps_node)) if eps_node is not None else None
    if f.eps_dtype is None and f.eps_position != "none":
        f.eps_dtype = f.stats_dtype
    return f


def _held_dtype(stat: fx.Node, op: Optional[str], red) -> Optional[str]:
    """The dtype the squares / variance are held in, read off the captured graph: the square node of a
    mean of squares, the output of var; std accumulates in float32 inside its kernel and only the std (which
    fits any half dtype where the variance might not) is stored."""
    if op == "mean" and red is not None:
        return _dt(dtype(strip_neutral(red.source))) or _dt(dtype(stat))
    held = _dt(dtype(stat))
    if op in ("std", "std_mean") and held in HALF:
        return "float32"
    return held


def _entry_dtype(stat: fx.Node, within: Optional[set]) -> Optional[str]:
    """The dtype of the activation entering the site's module on the way to its statistic (the site's
    ``input`` is taken through casts, so it may be the float32 tensor before a previous module's cast)."""
    if within is None:
        return None
    frontier, seen = [stat], set()
    while frontier and len(seen) < 40:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        for a in node.args:
            if not isinstance(a, fx.Node) or a.op == "get_attr":
                continue
            if a not in within:
                if a.op == "placeholder" or dtype(a) is not None:
                    return _dt(dtype(a))
                continue
            frontier.append(a)
    return None


def _is_cast(node: fx.Node, prev: fx.Node) -> bool:
    """A dtype conversion: ``to``/``type_as``/``float()`` with an explicit dtype, or one the capture shows."""
    if op_name(node) not in ("to", "type_as", "_to_copy"):
        return False
    if str(node.target) == "type_as" or any(isinstance(a, fx.Node) for a in node.args[1:]):
        return True  # type_as(x), to(x.dtype): a cast back to a dtype read at run time, whatever it is here
    return _cast_target(node) is not None or (dtype(node) is not None and dtype(node) != dtype(prev))


def _cast_facts(rec: SiteRecord, f: Formula, g: _GainReader) -> None:
    """``site.output_dtype`` (the dtype of the site's output node) and, for a hand-written norm, ``f.cast``: where
    the cast back after the normalisation sits relative to the gain multiply, walking forward from the applying
    node through the site's affine chain: ``before_gain`` (``w * x_normed.to(input_dtype)``, Llama's RMSNorm: a
    float32 gain then promotes the product), ``after_gain`` (``(x_normed * w).to(input_dtype)``, Gemma's), ``none``
    (no cast after the normalisation: a norm that upcast its input returns float32)."""
    s = rec.site
    s.output_dtype = _dt(dtype(rec.output)) if rec.output is not None else None
    scale = _scale_node(rec) if s.detected_by == "pattern" and rec.stat is not None else None
    node = _applied_node(rec, scale) if scale is not None else None
    if node is None:
        return
    seq: list[str] = []
    for _ in range(12):
        if node is rec.output:
            break
        users = [u for u in node.users if u in rec.nodes and not op_name(u).startswith("_assert")]
        if len(users) != 1:
            break
        u = users[0]
        if _is_cast(u, node):
            seq.append("cast")
        elif op_name(u) == "mul" and any(g.gain_form(a) for a in u.args[:2] if a is not node):
            seq.append("gain")
        node = u
    if "cast" not in seq:
        f.cast = "none"
    elif "gain" in seq:
        f.cast = "before_gain" if seq.index("cast") < seq.index("gain") else "after_gain"
    else:
        f.cast = "no_gain"


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``formula``: ``site.formula`` of every site whose computation the graph shows (see the module
    docstring), and ``site.eps`` of a hand-written norm whose eps is added outside the square root where site
    discovery found none; the numeric confirmation (:mod:`normaudit.probes.formula_confirm`) and the text
    (:func:`run_text`) come after. Nothing in the graph or the models is modified."""
    cap = ctx.cap
    g = _GainReader(list(cap.user_inputs))
    owned: Optional[dict[str, set]] = None
    for rec in facts.records:
        owner_nodes = None
        if rec.site.detected_by == "pattern":
            if owned is None:
                owned = {}
                for node in cap.gm.graph.nodes:
                    owned.setdefault(owner(node, cap.modules), set()).add(node)
            owner_nodes = owned.get(rec.site.module)
        f = graph_formula(rec, g, owner_nodes)
        if f is not None:
            rec.site.formula = f


def run_text(ctx: FactContext, facts: Facts) -> None:
    """Pass ``formula-text``: where the cast back sits (:func:`_cast_facts`) and the formula's text
    (:func:`normaudit.facts.formula_text.formula_text`), once the probe has confirmed or corrected the formula."""
    g = _GainReader(list(ctx.cap.user_inputs))
    for rec in facts.records:
        s, f = rec.site, rec.site.formula
        if f is None:
            continue
        _cast_facts(rec, f, g)
        f.text = special_text(rec, f) or formula_text(s.kind, f, s.normalized_axes)
