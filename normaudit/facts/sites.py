"""Site discovery: every normalisation computation in the captured graph, each one :class:`SiteRecord`.

Three detectors, in this order, each skipping nodes already claimed:

1. built-in modules (``nn.LayerNorm``, ``nn.RMSNorm``, ``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm``,
   ``nn.GroupNorm``, ``nn.InstanceNorm1d/2d/3d``, ``nn.LocalResponseNorm``), as ``call_module`` nodes
   (symbolic tracing) or the aten op / decomposed ops they own (export);
2. functional calls (``F.layer_norm``, ``F.rms_norm``, ``F.batch_norm``, ``F.group_norm``,
   ``F.instance_norm`` and their aten forms) inside any other module's forward;
3. hand-written norms, recognised by what they compute: a statistic over some dims (``var``/``std``, or a
   ``mean`` of squares, centred or not), turned into a scale by ``sqrt``/``rsqrt``/``pow(-0.5)`` (or ``std``
   itself), applied to the same tensor by ``mul``/``div``. ``kind`` follows the computation: mean
   subtracted -> LayerNorm, not -> RMSNorm (Zhang & Sennrich 2019), whatever the class is called.
   ``torch.var_mean`` counts (its variance reaches the root through ``getitem``). Inside a module that is
   only a norm, ``x / max(||x||_2 [* d ** -0.5], eps)`` and ``F.normalize`` are RMSNorm too (the L2 norm is
   the RMS up to sqrt(d), which the gain absorbs; hint ``statistic="l2_norm"``).

The module of a site is the innermost module whose forward produced it (CONTRACT.md).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.capture.ir import (NEUTRAL_OPS, arg, dtype, op_name, owner, reduction, scalar_operand, shape,
                                  strip_neutral)
from normaudit.report import Site, SourceLocation

BUILTIN_KINDS: list[tuple[type, str]] = [
    (nn.LayerNorm, "LayerNorm"),
    (nn.RMSNorm, "RMSNorm") if hasattr(nn, "RMSNorm") else (nn.LayerNorm, "LayerNorm"),
    (nn.modules.batchnorm._BatchNorm, "BatchNorm"),
    (nn.GroupNorm, "GroupNorm"),
    (nn.modules.instancenorm._InstanceNorm, "InstanceNorm"),
    (nn.LocalResponseNorm, "LocalResponseNorm"),
    (nn.CrossMapLRN2d, "LocalResponseNorm"),
]
OP_KINDS = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm", "batch_norm": "BatchNorm",
            "group_norm": "GroupNorm", "instance_norm": "InstanceNorm", "local_response_norm": "LocalResponseNorm"}


def builtin_kind(mod: Optional[nn.Module]) -> Optional[str]:
    """The kind of a built-in torch.nn norm module, or None for anything else."""
    if mod is None:
        return None
    for cls, kind in BUILTIN_KINDS:
        if isinstance(mod, cls):
            return kind
    return None


@dataclass
class SiteRecord:
    """A site and the graph nodes behind it.

    ``input`` is the tensor the norm normalises, ``output`` the node carrying its result (after gain and
    bias where those are recognised), ``stat`` the reduction node for hand-written norms, ``nodes`` every
    node claimed by this site.
    """

    site: Site
    input: Optional[fx.Node] = None
    output: Optional[fx.Node] = None
    stat: Optional[fx.Node] = None
    nodes: set = field(default_factory=set)
    module_obj: Optional[nn.Module] = None
    hints: dict[str, Any] = field(default_factory=dict)


def _is_aten(node: fx.Node) -> bool:
    return hasattr(node.target, "_overloadpacket")


def _dtype_str(dt: Optional[torch.dtype]) -> Optional[str]:
    return str(dt).replace("torch.", "") if dt is not None else None


def _module_facts(site: Site, mod: nn.Module, in_shape: Optional[tuple[int, ...]]) -> None:
    """Fill eps/affine/normalized_shape/groups from a built-in norm module's attributes."""
    kind = site.kind
    if kind in ("LayerNorm", "RMSNorm"):
        site.normalized_shape = [int(s) for s in mod.normalized_shape]
        eps = getattr(mod, "eps", None)
        site.eps = float(eps) if eps is not None else None
        site.affine_weight = getattr(mod, "weight", None) is not None
        site.affine_bias = getattr(mod, "bias", None) is not None
        if kind == "RMSNorm" and eps is None:
            site.extra["eps_default"] = "torch.finfo(input dtype).eps"
    elif kind in ("BatchNorm", "InstanceNorm"):
        site.eps = float(mod.eps)
        site.num_channels = int(mod.num_features)
        site.affine_weight = site.affine_bias = bool(mod.affine)
        site.track_running_stats = bool(mod.track_running_stats)
        site.training = bool(mod.training)
        site.extra["momentum"] = mod.momentum
    elif kind == "GroupNorm":
        site.eps = float(mod.eps)
        site.num_groups = int(mod.num_groups)
        site.num_channels = int(mod.num_channels)
        site.affine_weight = site.affine_bias = bool(mod.affine)
    elif kind == "LocalResponseNorm":
        site.extra.update(size=mod.size, alpha=mod.alpha, beta=mod.beta, k=mod.k)


def reduced_dims_for(kind: str, rank: int, normalized_len: int = 1) -> list[int]:
    """Dims a fused norm reduces over, for an input of ``rank`` dims (PyTorch docs of each module)."""
    if kind in ("LayerNorm", "RMSNorm"):
        return list(range(rank - normalized_len, rank))
    if kind == "BatchNorm":
        return [d for d in range(rank) if d != 1]
    if kind == "GroupNorm":
        return list(range(1, rank))
    if kind == "InstanceNorm":
        return list(range(2, rank))
    if kind == "LocalResponseNorm":
        return [1] if rank > 1 else []
    return []


def _size_value(node: fx.Node) -> Any:
    """Evaluate ``x.shape``/``x.size()`` and indexing or slicing of it from the recorded shapes
    (symbolic tracing keeps these as nodes): an int, a tuple of ints, or None when unknown."""
    name = op_name(node)
    if name == "getattr" and len(node.args) > 1 and node.args[1] == "shape" and isinstance(node.args[0], fx.Node):
        return shape(node.args[0])
    if name == "size" and node.args and isinstance(node.args[0], fx.Node):
        full = shape(node.args[0])
        dim = arg(node, 1, "dim", None)
        if full is None:
            return None
        return full if dim is None else full[int(dim)]
    if name == "getitem" and isinstance(node.args[0], fx.Node):
        base = _size_value(node.args[0])
        if isinstance(base, tuple):
            try:
                return base[node.args[1]]
            except (TypeError, IndexError):
                return None
    return None


def _normalized_shape(node: fx.Node) -> Optional[list[int]]:
    """``normalized_shape`` of a functional layer_norm/rms_norm call. Entries computed from the input's
    size (``(x.shape[-1],)``: fx nodes under symbolic tracing) are read from the input's shape instead."""
    ns = arg(node, 1, "normalized_shape")
    if ns is None:
        return None
    if isinstance(ns, fx.Node):
        value = _size_value(ns)
        ns = list(value) if isinstance(value, tuple) else [value if value is not None else ns]
    elif isinstance(ns, int):
        ns = [ns]
    ns = [(_size_value(d) if isinstance(d, fx.Node) else d) if not isinstance(d, int) else d for d in ns]
    ns = [d if d is not None else object() for d in ns]
    in_shape = shape(node.args[0]) if node.args else None
    out: list[int] = []
    for k, dim in enumerate(ns):
        if isinstance(dim, int):
            out.append(int(dim))
        elif in_shape is not None and len(in_shape) >= len(ns):
            out.append(in_shape[len(in_shape) - len(ns) + k])
        else:
            return None
    return out


def _functional_facts(site: Site, node: fx.Node, name: str) -> None:
    """Fill facts from a functional norm call's arguments (aten schema or torch.nn.functional signature)."""
    aten = _is_aten(node)
    if name == "layer_norm":
        site.normalized_shape = _normalized_shape(node)
        w, b = arg(node, 2, "weight"), arg(node, 3, "bias")
        eps = arg(node, 4, "eps", 1e-5)
    elif name == "rms_norm":
        site.normalized_shape = _normalized_shape(node)
        w, b = arg(node, 2, "weight"), None
        eps = arg(node, 3, "eps", None)
    elif name == "group_norm":
        site.num_groups = int(arg(node, 1, "num_groups"))
        w, b = arg(node, 2, "weight"), arg(node, 3, "bias")
        eps = arg(node, 4, "eps", 1e-5)
        in_shape = shape(node.args[0])
        site.num_channels = in_shape[1] if in_shape and len(in_shape) > 1 else None
    elif name == "batch_norm":
        if aten:
            w, b = arg(node, 1, "weight"), arg(node, 2, "bias")
            training, eps = arg(node, 5, "training", False), arg(node, 7, "eps", 1e-5)
            rm = arg(node, 3, "running_mean")
        else:
            w, b = arg(node, 3, "weight"), arg(node, 4, "bias")
            training, eps = arg(node, 5, "training", False), arg(node, 7, "eps", 1e-5)
            rm = arg(node, 1, "running_mean")
        site.training = bool(training)
        site.track_running_stats = rm is not None
    elif name == "instance_norm":
        if aten:
            w, b = arg(node, 1, "weight"), arg(node, 2, "bias")
            rm = arg(node, 3, "running_mean")
        else:
            w, b = arg(node, 3, "weight"), arg(node, 4, "bias")
            rm = arg(node, 1, "running_mean")
        eps = arg(node, 7, "eps", 1e-5)
        site.track_running_stats = rm is not None
    else:
        w = b = None
        eps = None
    site.eps = float(eps) if isinstance(eps, (int, float)) else None
    site.affine_weight = w is not None
    site.affine_bias = b is not None


def _find_stat(scale_in: fx.Node) -> Optional[tuple[fx.Node, Optional[float], str]]:
    """From the argument of sqrt/rsqrt, walk back through ``+ eps``/clamp/casts to the statistic.

    Returns (statistic node, eps, how eps enters) or None.
    """
    node, eps, how = scale_in, None, "none"
    for _ in range(6):
        node = strip_neutral(node)
        if not isinstance(node, fx.Node):
            return None
        name = op_name(node)
        if name == "add":
            c = scalar_operand(node)
            if c is None:
                return None
            eps, how = c, "inside_sqrt"
            node = node.args[0] if isinstance(node.args[0], fx.Node) else node.args[1]
            continue
        if name in ("clamp", "maximum"):
            c = arg(node, 1, "min", None)
            if isinstance(c, (int, float)):
                eps, how = float(c), "clamp"
            node = node.args[0]
            continue
        if name == "getitem" and len(node.args) > 1 and node.args[1] == 0 and isinstance(node.args[0], fx.Node):
            # var, mean = torch.var_mean(...): the variance is element 0 of the tuple
            red = reduction(node.args[0])
            if red is not None and red.op == "var_mean":
                return node.args[0], eps, how
            return None
        if reduction(node) is not None:
            return node, eps, how
        return None
    return None


def _l2_stat(node: fx.Node) -> Optional[tuple[fx.Node, tuple[int, ...]]]:
    """If ``node`` is a 2-norm of a tensor over some dims (``torch.norm``/``x.norm``/``linalg_vector_norm``
    with p=2, or ``F.normalize``, which divides by it) return (source, dims), else None."""
    name = op_name(node)
    if name == "normalize" and node.args and isinstance(node.args[0], fx.Node):
        if arg(node, 1, "p", 2.0) not in (2, 2.0):
            return None
        in_shape = shape(node.args[0])
        dim = arg(node, 2, "dim", 1)
        if in_shape is None or not isinstance(dim, int) or not in_shape:
            return None
        return node.args[0], (dim % len(in_shape),)
    if name not in ("norm", "linalg_vector_norm"):
        return None
    p = arg(node, 1, "p", "fro") if name == "norm" else arg(node, 1, "ord", 2)
    if p not in (2, 2.0, "fro"):
        return None
    red = reduction(node)
    if red is None:
        return None
    return red.source, red.dims


def _l2_scale(norm: fx.Node) -> tuple[fx.Node, Optional[float], str]:
    """From a 2-norm node, follow a scaling by a constant (``* d ** -0.5``) and ``clamp(min=eps)`` /
    ``+ eps`` forward: (last node of that chain, eps, how eps enters)."""
    node, eps, how = norm, None, "none"
    for _ in range(4):
        users = [u for u in node.users if not op_name(u).startswith("_assert")]
        if len(users) != 1:
            break
        u = users[0]
        name = op_name(u)
        if name in ("mul", "div") and u.args and u.args[0] is node and scalar_operand(u) is not None:
            node = u
            continue
        if name == "mul" and len(u.args) > 1 and u.args[1] is node and scalar_operand(u) is not None:
            node = u
            continue
        if name in ("clamp", "maximum") and u.args and u.args[0] is node:
            c = arg(u, 1, "min", None)
            if not isinstance(c, (int, float)) or isinstance(c, bool):
                break
            eps, how, node = float(c), "clamp", u
            continue
        if name == "add" and scalar_operand(u) is not None:
            eps, how, node = scalar_operand(u), "outside_sqrt", u
            continue
        if name in NEUTRAL_OPS:
            node = u
            continue
        break
    return node, eps, how


def _square_source(node: fx.Node) -> Optional[fx.Node]:
    """If ``node`` is x**2 / x*x / square(x) return x, else None."""
    name = op_name(node)
    if name == "pow" and len(node.args) > 1 and node.args[1] == 2 and isinstance(node.args[0], fx.Node):
        return node.args[0]
    if name == "square" and isinstance(node.args[0], fx.Node):
        return node.args[0]
    if name == "mul" and len(node.args) > 1 and node.args[0] is node.args[1] and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def _centered_source(node: fx.Node) -> Optional[fx.Node]:
    """If ``node`` is ``x - mean(x)`` (through casts) return x, else None."""
    node = strip_neutral(node)
    if isinstance(node, fx.Node) and op_name(node) == "sub" and len(node.args) > 1:
        a, m = node.args[0], strip_neutral(node.args[1])
        if isinstance(m, fx.Node) and op_name(m) == "mean":
            red = reduction(m)
            if red is not None and strip_neutral(red.source) is strip_neutral(a):
                return a
    return None


def _analyse_stat(stat: fx.Node) -> Optional[dict[str, Any]]:
    """What a statistic node measures: source tensor, reduced dims, centred or not, estimator."""
    red = reduction(stat)
    if red is None:
        return None
    if red.op in ("var", "std", "var_mean", "std_mean"):
        return {"source": red.source, "dims": red.dims, "centered": True,
                "variance": "unbiased" if (red.correction or 0) >= 1 else "population", "std": red.op == "std"}
    if red.op == "mean":
        sq = _square_source(strip_neutral(red.source))
        if sq is None:
            return None
        centred = _centered_source(sq)
        if centred is not None:
            return {"source": centred, "dims": red.dims, "centered": True, "variance": "population", "std": False}
        return {"source": sq, "dims": red.dims, "centered": False, "variance": "mean_square", "std": False}
    return None


def _related(node: Any, source: fx.Node, depth: int = 5) -> bool:
    """True when ``node`` is ``source`` or derives from it (or its centred form) within a few hops."""
    target = strip_neutral(source)
    frontier = [node]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if not isinstance(n, fx.Node):
                continue
            s = strip_neutral(n)
            if s is target or n is source:
                return True
            if isinstance(s, fx.Node) and op_name(s) in ("sub", "mul", "div", "to", "add", "alias"):
                nxt.extend(a for a in s.args if isinstance(a, fx.Node))
        frontier = nxt
    return False


def _apply_node(scale: fx.Node, source: fx.Node, by: str) -> Optional[fx.Node]:
    """The mul/div that applies ``scale`` to the source tensor (following casts/expands forward)."""
    frontier = [scale]
    for _ in range(4):
        nxt = []
        for n in frontier:
            for user in n.users:
                name = op_name(user)
                if name in ("mul", "div") and len(user.args) > 1:
                    other = user.args[0] if user.args[1] is n else user.args[1]
                    if user.args[0] is n and name == "div":
                        continue
                    if _related(other, source):
                        return user
                if name in NEUTRAL_OPS or name in ("expand", "expand_as", "unsqueeze", "view"):
                    nxt.append(user)
        frontier = nxt
    return None


def _extend_affine(out: fx.Node, owner_path: str, modules) -> tuple[fx.Node, list[fx.Node]]:
    """Follow the gain multiply / bias add (and casts) that stay inside the same module."""
    chain = []
    node = out
    for _ in range(6):
        # export adds _assert_tensor_metadata checks beside casts: they consume nothing
        users = [u for u in node.users if not op_name(u).startswith("_assert")]
        if len(users) != 1:
            break
        u = users[0]
        if owner(u, modules) != owner_path:
            break
        if op_name(u) in ("mul", "add", "to", "alias", "type_as"):
            chain.append(u)
            node = u
            continue
        break
    return node, chain


def _location(node: Optional[fx.Node], skip_inner: int = 0) -> Optional[SourceLocation]:
    """A frame of the node's recorded stack trace outside torch: the innermost one, or ``skip_inner``
    frames further out (1 gives the caller of a hand-written norm's ``forward``)."""
    if node is None:
        return None
    st = node.meta.get("stack_trace")
    if not st:
        return None
    frames: list[SourceLocation] = []
    for line in st.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            fname = line[6:line.index('"', 6)]
            norm = fname.replace("\\", "/")
            if "/torch/" in norm or "/normaudit/" in norm or norm.startswith("<"):
                continue
            try:
                lineno = int(line.split(", line ")[1].split(",")[0])
            except (IndexError, ValueError):
                continue
            frames.append(SourceLocation(file=fname, line=lineno))
    if not frames:
        return None
    return frames[max(0, len(frames) - 1 - skip_inner)]


def _norm_like(mod: Optional[nn.Module]) -> bool:
    """A module that is only a norm: no submodules, parameters at most 1-D (so its forward is the norm)."""
    return (mod is not None and not any(True for _ in mod.children())
            and all(p.dim() <= 1 for p in mod.parameters(recurse=False)))


def discover_sites(cap: Capture, origins: Optional[dict[int, SourceLocation]] = None) -> list[SiteRecord]:
    """Find every normalisation computation in ``cap.gm`` (see the module docstring)."""
    origins = origins or {}
    gm = cap.gm
    assert gm is not None
    records: list[SiteRecord] = []
    claimed: set[fx.Node] = set()
    modules = cap.modules
    owned: dict[str, list[fx.Node]] = defaultdict(list)
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method", "call_module"):
            owned[owner(node, modules)].append(node)

    def new(path: str, kind: str, by: str, node: fx.Node, opname: Optional[str]) -> SiteRecord:
        mod = modules.get(path)
        site = Site(module=path, kind=kind, class_name=type(mod).__name__ if mod is not None else "?",
                    detected_by=by, op=opname)
        rec = SiteRecord(site=site, module_obj=mod)
        # The call: for a hand-written norm module, where its forward is called, not a line inside it.
        site.call = _location(node, skip_inner=1 if by == "pattern" and _norm_like(mod) else 0)
        site.definition = origins.get(id(mod)) if mod is not None else None
        # Where a fix goes: the constructor line of a norm module, the call line of a functional norm.
        site.source = (site.call or site.definition) if by == "functional" else (site.definition or site.call)
        # What computes it: the call of a functional norm; for a hand-written one the statistic's line
        # (add_pattern); nothing for a torch.nn module (torch computes it).
        site.computation = None if by == "module" else _location(node)
        site.class_module = type(mod).__module__ if mod is not None else None
        return rec

    # 1 + 2: built-in modules and functional calls
    seen_builtin: set[str] = set()
    for node in gm.graph.nodes:
        name = op_name(node)
        if name == "module":
            mod = modules.get(str(node.target))
            kind = builtin_kind(mod)
            if kind is None:
                continue
            rec = new(str(node.target), kind, "module", node, type(mod).__name__)
            rec.input, rec.output = node.args[0] if node.args else None, node
            _module_facts(rec.site, mod, shape(rec.input))
        elif name in OP_KINDS and node.op == "call_function":
            path = owner(node, modules)
            mod = modules.get(path)
            kind = OP_KINDS[name]
            if builtin_kind(mod) is not None:
                rec = new(path, builtin_kind(mod), "module", node, name)
                _module_facts(rec.site, mod, shape(node.args[0]))
            else:
                rec = new(path, kind, "functional", node, name)
                _functional_facts(rec.site, node, name)
            rec.input, rec.output = node.args[0], node
        else:
            continue
        rec.nodes.add(node)
        claimed.add(node)
        seen_builtin.add(rec.site.module)
        records.append(rec)

    # built-in modules captured as decomposed ops (export of LocalResponseNorm)
    for path, nodes in owned.items():
        mod = modules.get(path)
        kind = builtin_kind(mod)
        if kind is None or path in seen_builtin or not nodes:
            continue
        node_set = set(nodes)
        first = next((a for n in nodes for a in n.args if isinstance(a, fx.Node) and a not in node_set), None)
        rec = new(path, kind, "module", nodes[0], type(mod).__name__)
        rec.input, rec.output = first, nodes[-1]
        rec.nodes |= node_set
        claimed |= node_set
        _module_facts(rec.site, mod, shape(first))
        records.append(rec)

    def add_pattern(path: str, node: fx.Node, stat: fx.Node, applied: fx.Node, src: fx.Node, dims,
                    centered: bool, variance: str, eps: Optional[float], how: str) -> SiteRecord:
        nonlocal claimed
        rec = new(path, "LayerNorm" if centered else "RMSNorm", "pattern", node, None)
        rec.input = strip_neutral(src)
        rec.stat = stat
        rec.site.computation = _location(stat) or rec.site.computation
        rec.site.extra["inline"] = not _norm_like(rec.module_obj)
        out, chain = _extend_affine(applied, path, modules)
        rec.output = out
        rec.nodes |= {node, stat, applied, *chain}
        claimed |= rec.nodes
        in_shape = shape(rec.input)
        rec.site.reduced_dims = list(dims)
        if in_shape is not None:
            rank = len(in_shape)
            if dims and list(dims) == list(range(rank - len(dims), rank)):
                rec.site.normalized_shape = [in_shape[d] for d in dims]
        rec.site.eps = eps
        rec.site.compute_dtype = _dtype_str(dtype(stat))
        rec.hints.update(how_eps=how, variance=variance, centered=centered,
                         applied_by=op_name(applied), affine_chain=[op_name(c) for c in chain])
        params = [p for p in (rec.module_obj.parameters(recurse=False) if rec.module_obj is not None else [])
                  if p.dim() == 1]
        rec.site.affine_weight = any(op_name(c) == "mul" for c in chain) or None
        rec.site.affine_bias = any(op_name(c) == "add" for c in chain) or (False if params else None)
        records.append(rec)
        return rec

    # 3: hand-written norms
    for node in gm.graph.nodes:
        if node in claimed or builtin_kind(modules.get(owner(node, modules))) is not None:
            continue
        name = op_name(node)
        stat = eps = how = None
        if name in ("rsqrt", "sqrt") and node.args and isinstance(node.args[0], fx.Node):
            found = _find_stat(node.args[0])
            if found is None:
                continue
            stat, eps, how = found
        elif name == "pow" and len(node.args) > 1 and node.args[1] in (0.5, -0.5) and isinstance(node.args[0], fx.Node):
            found = _find_stat(node.args[0])
            if found is None:
                continue
            stat, eps, how = found
        elif name == "std":
            stat, eps, how = node, None, "none"
        elif _l2_stat(node) is not None:
            # x / max(||x||_2 [* d ** -0.5], eps), F.normalize: RMSNorm up to a constant the gain absorbs.
            # Only inside a module that is only a norm: an L2-normalised embedding elsewhere (cosine
            # similarity) is not a normalisation layer.
            path = owner(node, modules)
            if not _norm_like(modules.get(path)):
                continue
            src, dims = _l2_stat(node)
            if op_name(node) == "normalize":
                scale, applied = node, node
                eps_v = arg(node, 3, "eps", 1e-12)
                eps, how = (float(eps_v) if isinstance(eps_v, (int, float)) else None), "clamp"
            else:
                scale, eps, how = _l2_scale(node)
                applied = _apply_node(scale, src, "div")
                if applied is None or op_name(applied) != "div":
                    continue
            rec = add_pattern(path, node, node, applied, src, dims, False, "mean_square", eps, how)
            rec.hints["statistic"] = "l2_norm"
            continue
        else:
            continue
        info = _analyse_stat(stat)
        if info is None:
            continue
        scale = node
        if name in ("std", "sqrt") or (name == "pow" and node.args[1] == 0.5):
            # eps added to the std/RMS after the root: x / (sqrt(var) + eps), x / (x.std() + eps)
            adds = [u for u in node.users if op_name(u) == "add" and scalar_operand(u) is not None]
            if adds:
                scale, eps, how = adds[0], scalar_operand(adds[0]), "outside_sqrt"
        by = "div" if name in ("sqrt", "std") else "mul"
        if name == "pow" and node.args[1] == 0.5:
            by = "div"
        applied = _apply_node(scale, info["source"], by)
        if applied is None:
            continue
        add_pattern(owner(node, modules), node, stat, applied, info["source"], info["dims"], info["centered"],
                    info["variance"], eps, how)

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    records.sort(key=lambda r: min((order[n] for n in r.nodes), default=len(order)))
    _finish(records)
    return records


def _finish(records: list[SiteRecord]) -> None:
    """Number repeated calls per module and fill shape facts (records are in graph order)."""
    counts: dict[str, int] = defaultdict(int)
    for rec in records:
        s = rec.site
        s.call_index = counts[s.module]
        counts[s.module] += 1
        in_shape = shape(rec.input) if rec.input is not None else None
        if in_shape is not None:
            s.input_shape = list(in_shape)
            s.input_dtype = _dtype_str(dtype(rec.input))
            if s.reduced_dims is None:
                n = len(s.normalized_shape or [1])
                s.reduced_dims = reduced_dims_for(s.kind, len(in_shape), n)
            if s.kind == "GroupNorm" and s.num_channels is None and len(in_shape) > 1:
                s.num_channels = in_shape[1]
        if s.compute_dtype is None and s.input_dtype is not None:
            fused = s.detected_by in ("module", "functional")
            if fused and s.input_dtype in ("float16", "bfloat16"):
                s.compute_dtype = "float32"
            else:
                s.compute_dtype = s.input_dtype


def walk_modules(modules: dict[str, nn.Module], origins: Optional[dict[int, SourceLocation]] = None) -> list[SiteRecord]:
    """Fallback when no capture worked: norms found by walking ``named_modules()`` (built-ins by class,
    hand-written ones by a class name containing 'norm' and 1-D parameters)."""
    origins = origins or {}
    out = []
    for path, mod in modules.items():
        kind = builtin_kind(mod)
        name = type(mod).__name__
        if kind is None:
            low = name.lower()
            params = list(mod.parameters(recurse=False))
            if "norm" not in low or not params or any(p.dim() != 1 for p in params):
                continue
            kind = "RMSNorm" if "rms" in low else "LayerNorm" if "layer" in low else "Other"
        site = Site(module=path, kind=kind, class_name=name, detected_by="module_walk",
                    source=origins.get(id(mod)), definition=origins.get(id(mod)))
        if builtin_kind(mod) is not None:
            _module_facts(site, mod, None)
        else:
            for attr in ("eps", "variance_epsilon", "epsilon"):
                v = getattr(mod, attr, None)
                if isinstance(v, float):
                    site.eps = v
                    break
        out.append(SiteRecord(site=site, module_obj=mod))
    return out
