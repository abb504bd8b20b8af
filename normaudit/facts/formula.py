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
- ``confirmed``: None when only the graph was read; True/False when the site's module was run alone
  (:func:`normaudit.probes.formula.probe_formula`) and a reference formula did / did not reproduce it.
  ``eps_measured``/``eps_matches``/``max_error`` come from that probe; ``upcast`` is then measured by
  :func:`normaudit.probes.formula.probe_half_precision` in float16 (the only half dtype whose squares overflow),
  and ``constant_row_finite`` in ``--dtype`` when it is half (else float16).
- ``notes``: where the probe overrode the graph, or why the module was not probed.
- ``text``: :func:`normaudit.probes.reference.formula_text`.

Graph first: fused ops give their facts from the op; hand-written norms from the site's nodes and the hints
of :mod:`normaudit.facts.sites`. Then a site whose module is a small norm module (every parameter the size of
the normalised region, under :data:`MAX_PROBE_PARAMS` parameters, one site in it) is probed on a copy; the
probe wins where it measured something, and the note says so. Sites inside a larger module (a functional
call or a hand-written norm in a block's forward) keep the graph facts. Probes are cached per class and
configuration (normalised size, eps and other plain attributes, parameter shapes), so a model with 65
identical RMSNorms probes one.

Example::

    >>> import torch
    >>> from normaudit.report import Formula
    >>> from normaudit.probes.reference import formula_text
    >>> formula_text("RMSNorm", Formula(variance="mean_square", gain="one_plus_weight", bias=False), ["feature"])
    'RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w) over [feature]'
"""
from __future__ import annotations

import copy
import math
from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.vocabulary.graph import NEUTRAL_OPS, arg, dtype, op_name, owner, reduction, scalar_operand, strip_neutral
from normaudit.vocabulary.graph import shape as node_shape
from normaudit.probes.formula import probe_formula, probe_half_precision
from normaudit.probes.reference import formula_text
from normaudit.facts.sites import SiteRecord
from normaudit.report import Formula

MAX_PROBE_PARAMS = 1_000_000
HALF = ("float16", "bfloat16")
FUSED_KINDS = ("LayerNorm", "RMSNorm", "BatchNorm", "GroupNorm", "InstanceNorm")
PROBED_KINDS = ("LayerNorm", "RMSNorm")
# ops a parameter passes through on its way to the gain multiply (casts, views, broadcasting)
_PARAM_PATH = NEUTRAL_OPS + ("view", "unsqueeze", "expand", "expand_as", "getitem", "reshape", "squeeze",
                             "flatten", "permute", "transpose")
_CAST_DTYPES = {"float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16}
_PROBED_FIELDS = ("mean_subtracted", "variance", "eps_position", "inverted_scale", "gain", "bias")


def _dt(d: Optional[torch.dtype]) -> Optional[str]:
    return str(d).replace("torch.", "") if d is not None else None


# ------------------------------------------------------------------------------------------- graph facts
class _Graph:
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
        for _ in range(8):
            if not isinstance(node, fx.Node):
                return None
            if self.is_param(node):
                return "weight"
            name = op_name(node)
            if name == "add" and scalar_operand(node) == 1.0:
                other = next((a for a in node.args if isinstance(a, fx.Node)), None)
                return "one_plus_weight" if self._reaches_param(other) else None
            if name in _PARAM_PATH and node.args:
                node = node.args[0]
                continue
            return None
        return None

    def _reaches_param(self, node: Any) -> bool:
        for _ in range(8):
            if not isinstance(node, fx.Node):
                return False
            if self.is_param(node):
                return True
            if op_name(node) in _PARAM_PATH and node.args:
                node = node.args[0]
                continue
            return False
        return False


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


def _affine(g: _Graph, rec: SiteRecord, applied: fx.Node, owner_nodes: Optional[set]) -> tuple[Optional[str], bool]:
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
            elif name in NEUTRAL_OPS or name in ("view", "type_as", "reshape", "_unsafe_view"):
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


def _size(site) -> Optional[int]:
    if site.input_shape and site.reduced_dims is not None:
        try:
            return math.prod(site.input_shape[d] for d in site.reduced_dims)
        except IndexError:
            return None
    return None


def graph_formula(rec: SiteRecord, g: _Graph, owner_nodes: Optional[set] = None) -> Optional[Formula]:
    """Formula facts from the graph alone (no text, not confirmed), or None for a site it cannot describe."""
    s = rec.site
    in_dt = s.input_dtype
    if s.detected_by in ("module", "functional") and s.kind in FUSED_KINDS:
        mean = s.kind != "RMSNorm"
        return Formula(mean_subtracted=mean, variance="population" if mean else "mean_square",
                       eps_position="inside_sqrt", gain="weight" if s.affine_weight else "none",
                       bias=bool(s.affine_bias), inverted_scale=False, fused=True, upcast=True,
                       stats_dtype="float32" if in_dt in HALF else in_dt,
                       eps_dtype="float32" if in_dt in HALF else in_dt, size=_size(s))
    if s.detected_by != "pattern" or rec.stat is None:
        return None
    h = rec.hints
    if h.get("statistic") == "grn":
        # Global Response Normalization: x * (1 + w * nx) + b, nx = ||x||_2 / (mean_C ||x||_2 + eps)
        held = _dt(dtype(rec.stat))
        return Formula(mean_subtracted=False, variance="none", eps_position="outside_sqrt", gain="weight",
                       bias=True, inverted_scale=False, fused=False, upcast=False, stats_dtype=held, eps_dtype=held,
                       size=_size(s))
    if h.get("statistic") == "running_var":
        # frozen BatchNorm: x * (w * rsqrt(running_var + eps)) + (b - running_mean * scale), in the buffers' dtype
        held = _dt(dtype(rec.stat))
        return Formula(mean_subtracted=True, variance="population", eps_position=h.get("how_eps") or "none",
                       gain="weight" if s.affine_weight else "none", bias=bool(s.affine_bias), inverted_scale=False,
                       fused=False, upcast=held in ("float32", "float64") and in_dt in HALF, stats_dtype=held,
                       eps_dtype=held, size=_size(s))
    f = Formula(mean_subtracted=h.get("centered"), variance=h.get("variance"), size=_size(s))
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


# ------------------------------------------------------------------------------------------------ probing
def _probe_module(ctx: Any, rec: SiteRecord, per_module: dict[str, int]) -> tuple[Optional[nn.Module], Optional[str]]:
    """The site's own module, materialised, when it is a small norm module worth probing; else (None, why)."""
    s = rec.site
    if s.kind not in PROBED_KINDS or ctx.probe_model is None:
        return None, None
    if per_module.get(s.module, 0) > 1:
        return None, "not probed: the module computes more than one norm"
    if not s.input_shape or s.reduced_dims is None:
        return None, "not probed: input shape unknown"
    try:
        mod = ctx.probe_model.get_submodule(s.module) if s.module else ctx.probe_model
    except AttributeError:
        return None, None
    n = _size(s)
    tensors = [t for t in list(mod.parameters()) + list(mod.buffers()) if t.is_floating_point()]
    if sum(t.numel() for t in tensors) > MAX_PROBE_PARAMS:
        return None, "not probed: module too large"
    if any(t.numel() != n for t in tensors):
        return None, "not probed: the norm is part of a larger module (graph facts only)"
    return mod, None


def _signature(mod: nn.Module, rec: SiteRecord, half: str) -> tuple:
    s = rec.site
    rank = len(s.input_shape or ())
    attrs = tuple(sorted((k, v) for k, v in vars(mod).items()
                         if not k.startswith("_") and isinstance(v, (int, float, str, bool, tuple, type(None)))))
    params = tuple((k, tuple(p.shape), str(p.dtype)) for k, p in mod.named_parameters())
    dims = tuple(d - rank for d in s.reduced_dims or ())
    key = (type(mod), dims, tuple(s.input_shape[d] for d in s.reduced_dims or ()), s.eps, attrs, params, half)
    try:
        hash(key)
    except TypeError:  # a tuple attribute holding a list: probe this module on its own
        key = (id(mod), half)
    return key


_LAYOUT_OPS = ("permute", "transpose", "contiguous", "clone") + NEUTRAL_OPS


def module_input_layout(rec: SiteRecord, modules: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape of the tensor entering the site's module, the reduced dims in its coordinates). A channels-first
    norm (timm ``LayerNorm2d``, ConvNeXt's ``channels_first`` LayerNorm) permutes its (N, C, H, W) input to
    (N, H, W, C) and normalises the last dim: the probe must feed (N, C, H, W) and read dim 1. The permutes
    and transposes inside the module between its input and the site's input are undone; without them this is
    the site's own input shape and reduced dims."""
    s = rec.site
    dims = tuple(s.reduced_dims or ())
    here = (tuple(s.input_shape or ()), dims)
    node, m = rec.input, list(range(len(s.input_shape or ())))  # site dim d is dim m[d] of ``node``
    for _ in range(12):
        if not isinstance(node, fx.Node) or owner(node, modules) != s.module or op_name(node) not in _LAYOUT_OPS:
            break
        src = node.args[0] if node.args else None
        rank = len(node_shape(src) or ())
        if op_name(node) == "permute":
            p = arg(node, 1, "dims", None)
            p = list(node.args[1:]) if isinstance(p, int) else list(p or [])
            if len(p) != rank:
                return here
            p = [int(d) % rank for d in p]
        elif op_name(node) == "transpose":
            a, b = (int(arg(node, 1, "dim0")) % rank, int(arg(node, 2, "dim1")) % rank) if rank else (0, 0)
            p = list(range(rank))
            p[a], p[b] = p[b], p[a]
        else:
            p = list(range(rank))
        if rank != len(m):
            return here
        m = [p[i] for i in m]
        node = src
    if not isinstance(node, fx.Node) or node is rec.input or node_shape(node) is None:
        return here
    return tuple(node_shape(node)), tuple(m[d] for d in dims)


def _trailing_children(rec: SiteRecord, modules: dict) -> list[str]:
    """Names of the direct children of the site's module that run only on the norm's output (timm's NormAct
    layers, ``BatchNormAct2d``/``LayerNormAct2d``/``RmsNormAct2d``: ``x = self.act(self.drop(norm(x)))``):
    every graph node they own is reached forward from ``rec.output`` inside the module."""
    s = rec.site
    if rec.output is None or not isinstance(rec.output, fx.Node):
        return []
    prefix = f"{s.module}." if s.module else ""
    inside = (lambda o: o == s.module or o.startswith(prefix)) if s.module else (lambda o: True)
    seen: set = set()
    frontier = [rec.output]
    while frontier:
        for u in frontier.pop().users:
            if u not in seen and inside(owner(u, modules)):
                seen.add(u)
                frontier.append(u)
    by_child: dict[str, list[fx.Node]] = {}
    for node in rec.output.graph.nodes:
        o = owner(node, modules)
        if o != s.module and o.startswith(prefix) and inside(o):
            by_child.setdefault(o[len(prefix):].split(".")[0], []).append(node)
    return [c for c, nodes in by_child.items() if all(n in seen for n in nodes)]


def _norm_only(mod: nn.Module, rec: SiteRecord, modules: Optional[dict]) -> nn.Module:
    """``mod``, or a copy of it whose parameterless children that run after the norm (an activation, a dropout:
    :func:`_trailing_children`) are ``nn.Identity``, so the probe reads the norm's own output."""
    if modules is None:
        return mod
    children = dict(mod.named_children())
    names = [c for c in _trailing_children(rec, modules) if c in children
             and not any(True for _ in children[c].parameters()) and not any(True for _ in children[c].buffers())]
    if not names:
        return mod
    mod = copy.deepcopy(mod)
    for c in names:
        setattr(mod, c, nn.Identity())
    return mod


def _probe(mod: nn.Module, rec: SiteRecord, half: torch.dtype, modules: Optional[dict] = None):
    """Run both probes on a copy of ``mod`` (materialised on the CPU when on meta: the probe sets the gain
    and bias itself, and no other floating tensor exists in a probed module), fed in the layout of the
    module's own input (:func:`module_input_layout`), its activation after the norm made the identity
    (:func:`_norm_only`)."""
    s = rec.site
    if any(t.is_meta for t in list(mod.parameters()) + list(mod.buffers())):
        mod = copy.deepcopy(mod).to_empty(device="cpu")
    mod = _norm_only(mod, rec, modules)
    shape, dims = module_input_layout(rec, modules) if modules is not None else (
        tuple(s.input_shape), tuple(s.reduced_dims or ()))
    # keep the probe small: only the normalised dims matter, other positions just hold probe rows
    small = tuple(sz if d in dims else min(sz, 8) for d, sz in enumerate(shape))
    # tensors of a few thousand elements: one thread is faster than waking a pool (and far steadier on a
    # loaded machine)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        r = probe_formula(mod, dims, small, s.eps)
        # upcast is only observable where squares overflow: float16 (bfloat16 has float32's range, so a
        # norm computing in bfloat16 passes the overflow test). The audit's own half dtype, when it is another,
        # decides whether a constant row stays finite.
        h16 = probe_half_precision(mod, dims, small, torch.float16)
        h = h16 if half == torch.float16 else probe_half_precision(mod, dims, small, half)
        return r, h16, h
    finally:
        torch.set_num_threads(threads)


def _merge(f: Formula, r, h16, h, in_dt: Optional[str]) -> Optional[str]:
    """Fold probe results into graph facts (the probe wins where it measured something). Returns the
    probe's kind when it confirmed one."""
    if r.error is not None:
        f.notes.append(f"probe failed ({r.error}): graph facts only")
        return None
    f.confirmed = r.confirmed
    f.max_error = r.max_error
    f.eps_measured, f.eps_matches = r.eps_measured, r.eps_matches
    fields = _PROBED_FIELDS if r.confirmed else ("gain", "bias")
    if not r.confirmed:
        f.notes.append(f"probe could not confirm a reference formula (max rel. error {r.max_error:.2g}, "
                       f"closest {r.reference}): graph facts kept except gain and bias")
    for name in fields:
        p = getattr(r, name)
        if p is None or p == "unknown":
            continue
        gv = getattr(f, name)
        if gv is not None and gv != p:
            f.notes.append(f"{name}: the graph says {gv}, the probe measured {p}; using the probe")
        setattr(f, name, p)
    if h16.error is None and h16.upcast is not None:
        if f.upcast is not None and f.upcast != h16.upcast and not f.fused:
            f.notes.append(f"upcast: the graph says {f.upcast}, the float16 probe measured {h16.upcast}; using the probe")
        if not f.fused:
            f.upcast = h16.upcast
        if f.stats_dtype is None and in_dt is not None:  # the graph did not show it
            f.stats_dtype = "float32" if in_dt in HALF and f.upcast else in_dt
    if h.error is None:
        f.constant_row_finite = h.constant_row_finite
    return r.kind if r.confirmed and r.kind in PROBED_KINDS else None


def _special_text(rec: SiteRecord, f: Formula) -> Optional[str]:
    """The formula text of sites the LayerNorm/RMSNorm template does not describe: Global Response
    Normalization (Woo et al. 2023, eq. 1-3), sums of squares (nGPT's ``x * rsqrt(sum(x^2) + eps)``, a unit
    L2 norm) and the EvoNorm forms (Liu et al. 2020: a gated numerator,
    ``x * sigmoid(v * x)``, or a ``max`` of two denominators), and cumulative norms (statistics of steps
    ``0..t`` along a time dim, Gemma3n audio's cumulative GroupNorm)."""
    s, h = rec.site, rec.hints
    axes = ", ".join(s.normalized_axes or []) or "?"
    if h.get("statistic") == "grn":
        return f"Other (GRN): x * (1 + w * nx) + b, nx = ||x||_2 / (mean(||x||_2) + eps) over [{axes}]"
    if h.get("sum_of_squares"):
        return formula_text(s.kind, f, s.normalized_axes or []).replace("mean(x^2)", "sum(x^2)")
    if h.get("statistic") == "l2_norm" and "l2_pre" in h:
        return _l2_text(rec, f)
    form = h.get("form")
    if form == "cumulative":  # statistics of steps 0..t (a streaming norm): mean and variance are running ones
        t = s.extra.get("cumulative_dim")
        centred = ("(x - mean_0..t) / sqrt(var_pop_0..t + eps)" if f.mean_subtracted
                   else "x / sqrt(mean_0..t(x^2) + eps)")
        gain = " * w" if f.gain == "weight" else ""
        bias = " + b" if f.bias else ""
        return f"Other (cumulative): {centred}{gain}{bias} over [{axes}] of steps 0..t along dim {t}"
    if form == "gated":
        return f"Other (EvoNorm-S): x * sigmoid(v * x) / sqrt(var_pop + eps) * w + b over [{axes}]"
    if form == "combined":
        return f"Other (EvoNorm-B): x / max(sqrt(running_var + eps), v * x + sqrt(var_pop + eps)) * w + b over [{axes}]"
    return None


def _l2_text(rec: SiteRecord, f: Formula) -> str:
    """The formula text of a norm by the 2-norm (``x / max(||x||_2, eps)``, ``F.normalize``, ZAYA's
    ``x * sqrt(d) / max(||x||_2, eps)``), written as computed: the denominator is ``||x||_2``, or
    ``sqrt(mean(x^2))`` where a constant ``d ** -0.5`` turns it into the RMS before eps enters
    (``||x||_2 = sqrt(sum(x^2)) = sqrt(d) * sqrt(mean(x^2))`` over the ``d`` reduced elements), and a
    constant factor after eps multiplies the numerator (``sqrt(d)`` when it is that). Gain and bias as
    :func:`normaudit.probes.reference.formula_text` writes them."""
    s, h = rec.site, rec.hints
    shp = s.input_shape or []
    d = math.prod(shp[i] for i in s.reduced_dims or [] if i < len(shp)) if shp else None

    def named(c: float, word: str = "sqrt(d)") -> str:
        return word if d and math.isclose(c, math.sqrt(d), rel_tol=1e-6) else f"{c:g}"

    pre, post = float(h["l2_pre"]), float(h["l2_post"])
    if d and math.isclose(pre, d ** -0.5, rel_tol=1e-6):
        den = "sqrt(mean(x^2))"
    else:
        den = "||x||_2" if math.isclose(pre, 1.0) else f"{named(1 / pre)} ** -1 * ||x||_2"
    num = "x" if math.isclose(post, 1.0) else f"x * {named(1 / post)}"
    body = {"clamp": f"{num} / max({den}, eps)", "outside_sqrt": f"{num} / ({den} + eps)"}.get(
        f.eps_position or "", f"{num} / {den}")
    gain = {"weight": " * w", "one_plus_weight": " * (1 + w)", "none": "", "unknown": " * g(w)?"}.get(
        f.gain or "weight", "")  # as formula_text writes them
    return f"{s.kind}: {body}{gain}{' + b' if f.bias else ''} over [{', '.join(s.normalized_axes or []) or '?'}]"


_WIDTH = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def _is_cast(node: fx.Node, prev: fx.Node) -> bool:
    """A dtype conversion: ``to``/``type_as``/``float()`` with an explicit dtype, or one the capture shows."""
    if op_name(node) not in ("to", "type_as", "_to_copy"):
        return False
    if str(node.target) == "type_as" or any(isinstance(a, fx.Node) for a in node.args[1:]):
        return True  # type_as(x), to(x.dtype): a cast back to a dtype read at run time, whatever it is here
    return _cast_target(node) is not None or (dtype(node) is not None and dtype(node) != dtype(prev))


def _cast_facts(rec: SiteRecord, f: Formula, g: _Graph) -> None:
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


def analyse(ctx: Any, records: list[SiteRecord]) -> None:
    """Set ``site.formula`` on every record (see the module docstring). ``ctx`` is a
    :class:`normaudit.facts.FactContext`; nothing in the graph or the models is modified."""
    cap = ctx.cap
    g = _Graph(list(cap.user_inputs))
    audit_dtype = (ctx.options or {}).get("dtype", "float32")
    half = getattr(torch, audit_dtype) if audit_dtype in HALF else torch.float16
    per_module: dict[str, int] = {}
    for rec in records:
        per_module[rec.site.module] = per_module.get(rec.site.module, 0) + 1
    owned: Optional[dict[str, set]] = None
    cache: dict[tuple, tuple] = {}
    for rec in records:
        s = rec.site
        owner_nodes = None
        if s.detected_by == "pattern":
            if owned is None:
                from normaudit.vocabulary.graph import owner
                owned = {}
                for node in cap.gm.graph.nodes:
                    owned.setdefault(owner(node, cap.modules), set()).add(node)
            owner_nodes = owned.get(s.module)
        f = graph_formula(rec, g, owner_nodes)
        if f is None:
            continue
        mod, why = _probe_module(ctx, rec, per_module)
        if why:
            f.notes.append(why)
        if mod is not None:
            key = _signature(mod, rec, str(half))
            if key not in cache:
                cache[key] = _probe(mod, rec, half, cap.modules)
            kind = _merge(f, *cache[key], s.input_dtype)
            if kind is not None and kind != s.kind:
                f.notes.append(f"kind: the graph says {s.kind}, the probe measured {kind}; using the probe")
                s.kind = kind  # type: ignore[assignment]
        _cast_facts(rec, f, g)
        f.text = _special_text(rec, f) or formula_text(s.kind, f, s.normalized_axes)
        s.formula = f
