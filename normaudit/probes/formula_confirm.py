"""The ``formula-probe`` pass: the graph's formula facts of each small norm module confirmed by running the
module alone on crafted rows (:func:`normaudit.probes.formula.probe_formula`, and its half-precision behaviour by
:func:`normaudit.probes.formula.probe_half_precision`); the probe wins where it measured something, and the
formula's notes say so.

A site is probed when its module is a small norm module: every floating parameter and buffer the size of the
normalised region, under :data:`MAX_PROBE_PARAMS` elements, one site in it. Sites inside a larger module (a
functional call or a hand-written norm in a block's forward) keep the graph facts. Probes are cached per class
and configuration (normalised size, eps and other plain attributes, parameter shapes), so a model with 65
identical RMSNorms probes one. The model's modules are never modified: the probe runs on a copy.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.facts.context import FactContext, Facts
from normaudit.facts.formula import formula_size
from normaudit.facts.sites import SiteRecord
from normaudit.probes.formula import probe_formula, probe_half_precision
from normaudit.report import Formula
from normaudit.vocabulary.dtypes import HALF_DTYPES as HALF
from normaudit.vocabulary.graph import NEUTRAL_OPS, arg, op_name, owner, reach
from normaudit.vocabulary.graph import shape as node_shape


#: the most floating elements (parameters and buffers) of a module the probe runs
MAX_PROBE_PARAMS = 1_000_000
#: the kinds whose formula the probe tells apart (:data:`normaudit.probes.reference.VARIANTS`)
PROBED_KINDS = ("LayerNorm", "RMSNorm")
#: the formula fields a confirmed probe sets (an unconfirmed one only gain and bias)
_PROBED_FIELDS = ("mean_subtracted", "variance", "eps_position", "inverted_scale", "gain", "bias")


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
    n = formula_size(s)
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
    seen = set(reach(rec.output, lambda u, n: inside(owner(u, modules))))
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


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``formula-probe``: every site with a graph formula whose module is worth probing
    (:func:`_probe_module`) is probed once per configuration (:func:`_signature`) in float16 and the audited
    half dtype, the results folded into its formula (:func:`_merge`); a measured kind other than the graph's
    replaces it."""
    cap = ctx.cap
    half = getattr(torch, ctx.dtype) if ctx.dtype in HALF else torch.float16
    per_module: dict[str, int] = {}
    for rec in facts.records:
        per_module[rec.site.module] = per_module.get(rec.site.module, 0) + 1
    cache: dict[tuple, tuple] = {}
    for rec in facts.records:
        s, f = rec.site, rec.site.formula
        if f is None:
            continue
        mod, why = _probe_module(ctx, rec, per_module)
        if why:
            f.notes.append(why)
        if mod is None:
            continue
        key = _signature(mod, rec, str(half))
        if key not in cache:
            cache[key] = _probe(mod, rec, half, cap.modules)
        kind = _merge(f, *cache[key], s.input_dtype)
        if kind is not None and kind != s.kind:
            f.notes.append(f"kind: the graph says {s.kind}, the probe measured {kind}; using the probe")
            s.kind = kind  # type: ignore[assignment]
