"""Facts of the norms PyTorch computes: built-in norm modules (``nn.LayerNorm``, ``nn.RMSNorm``,
``nn.BatchNorm1d/2d/3d``, ``nn.SyncBatchNorm``, ``nn.GroupNorm``, ``nn.InstanceNorm1d/2d/3d``,
``nn.LocalResponseNorm``) read from their attributes, functional calls (``F.layer_norm``, ``F.rms_norm``,
``F.batch_norm``, ``F.group_norm``, ``F.instance_norm`` and their aten forms) read from their arguments, the
dims each reduces (PyTorch docs of each module), the eps PyTorch substitutes for ``eps=None``, and
:func:`walk_modules`, the module walk used when no capture worked."""
from __future__ import annotations

from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.sites.record import SiteRecord
from normaudit.report import LrnArgs, Site, SourceLocation
from normaudit.vocabulary.graph import arg, op_name, shape
from normaudit.vocabulary.kinds import builtin_kind, norm_modules
from normaudit.vocabulary.dtypes import DTYPES


def _is_aten(node: fx.Node) -> bool:
    return hasattr(node.target, "_overloadpacket")


def module_facts(site: Site, mod: nn.Module, in_shape: Optional[tuple[int, ...]]) -> None:
    """Fill eps/affine/normalized_shape/groups from a built-in norm module's attributes."""
    kind = site.kind
    if kind in ("LayerNorm", "RMSNorm"):
        site.normalized_shape = [int(s) for s in mod.normalized_shape]
        eps = getattr(mod, "eps", None)
        site.eps = float(eps) if eps is not None else None
        site.affine_weight = getattr(mod, "weight", None) is not None
        site.affine_bias = getattr(mod, "bias", None) is not None
        if kind == "RMSNorm" and eps is None:
            site.eps_default = "torch.finfo(input dtype).eps"
    elif kind in ("BatchNorm", "InstanceNorm"):
        site.eps = float(mod.eps)
        site.num_channels = int(mod.num_features)
        site.affine_weight = site.affine_bias = bool(mod.affine)
        site.track_running_stats = bool(mod.track_running_stats)
        site.training = bool(mod.training)
        site.batchnorm.momentum = mod.momentum
    elif kind == "GroupNorm":
        site.eps = float(mod.eps)
        site.num_groups = int(mod.num_groups)
        site.num_channels = int(mod.num_channels)
        site.affine_weight = site.affine_bias = bool(mod.affine)
    elif kind == "LocalResponseNorm":
        site.lrn = LrnArgs(size=mod.size, alpha=mod.alpha, beta=mod.beta, k=mod.k)


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


def functional_facts(site: Site, node: fx.Node, name: str) -> None:
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


def resolve_default_eps(site: Site) -> None:
    """``nn.RMSNorm(d)`` / ``F.rms_norm(x, shape)`` with ``eps=None``: PyTorch substitutes
    ``torch.finfo(x.dtype).eps`` (torch.nn.RMSNorm docs), so the eps used depends on the input dtype
    (1.19e-07 in float32, 9.77e-04 in float16, 7.81e-03 in bfloat16). Store that effective value in
    ``site.eps`` (CONTRACT.md) and keep ``site.eps_default`` saying where it came from."""
    if site.kind != "RMSNorm" or site.eps is not None or site.detected_by not in ("module", "functional"):
        return
    if site.detected_by == "functional" and site.op != "rms_norm":
        return
    if site.input_dtype not in DTYPES:
        return
    site.eps = DTYPES[site.input_dtype].eps
    site.eps_default = "torch.finfo(input dtype).eps"
    site.eps_default_dtype = site.input_dtype


def walk_modules(modules: dict[str, nn.Module], origins: Optional[dict[int, SourceLocation]] = None) -> list[SiteRecord]:
    """Fallback when no capture worked: norms found by walking ``named_modules()``
    (:func:`normaudit.vocabulary.kinds.norm_modules`: built-ins by class, hand-written ones by a class name
    containing 'norm' and 1-D parameters), each a site with the eps its module holds."""
    origins = origins or {}
    out = []
    for path, mod, kind in norm_modules(modules):
        site = Site(module=path, kind=kind, class_name=type(mod).__name__, detected_by="module_walk",
                    source=origins.get(id(mod)), definition=origins.get(id(mod)))
        if builtin_kind(mod) is not None:
            module_facts(site, mod, None)
        else:
            for attr in ("eps", "variance_epsilon", "epsilon"):
                v = getattr(mod, attr, None)
                if isinstance(v, float):
                    site.eps = v
                    break
        out.append(SiteRecord(site=site, module_obj=mod))
    return out
