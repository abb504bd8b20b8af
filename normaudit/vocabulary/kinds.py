"""The norm kinds normaudit knows and how a module or an op names one: the torch.nn norm classes
(:data:`BUILTIN_KINDS`), the functional/aten norm ops (:data:`OP_KINDS`), and the norm modules of a model found
by walking ``named_modules()`` (:func:`norm_modules`: built-ins by class, hand-written ones by a class name that
says norm). The kinds are those of ``normaudit.report.Kind`` (CONTRACT.md); :data:`L2_KIND` has no torch.nn
class and no fused op: it is found by what the graph computes (``normaudit.facts.sites.l2``)."""
from __future__ import annotations

from typing import Optional

from torch import nn

BUILTIN_KINDS: list[tuple[type, str]] = [
    (nn.LayerNorm, "LayerNorm"),
    (nn.RMSNorm, "RMSNorm") if hasattr(nn, "RMSNorm") else (nn.LayerNorm, "LayerNorm"),
    (nn.modules.batchnorm._BatchNorm, "BatchNorm"),
    (nn.GroupNorm, "GroupNorm"),
    (nn.modules.instancenorm._InstanceNorm, "InstanceNorm"),
    (nn.LocalResponseNorm, "LocalResponseNorm"),
    (nn.CrossMapLRN2d, "LocalResponseNorm"),
]
#: kinds whose statistics subtract the mean (LayerNorm: Ba et al. 2016 eq. 3; BatchNorm, GroupNorm, InstanceNorm)
MEAN_SUBTRACTING_KINDS = ("LayerNorm", "BatchNorm", "GroupNorm", "InstanceNorm")
#: ``x / max(||x||_p, eps)`` (PyTorch docs: torch.nn.functional.normalize, p=2, dim=1, eps=1e-12 by default)
#: outside a module that is only a norm: a unit vector, which the layout rules' premise (per-example feature
#: statistics) does not cover; inside a norm module the same computation is an RMSNorm up to sqrt(d)
L2_KIND = "L2Norm"
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


def walk_kind(mod: nn.Module) -> Optional[str]:
    """The kind a module walk gives ``mod``: its built-in kind, else, for a class whose name contains
    ``norm`` and whose own parameters are all 1-D (a per-feature gain and bias), ``RMSNorm`` / ``LayerNorm``
    when the name says ``rms`` / ``layer``, otherwise ``Other``; None for anything else."""
    kind = builtin_kind(mod)
    if kind is not None:
        return kind
    low = type(mod).__name__.lower()
    params = list(mod.parameters(recurse=False))
    if "norm" not in low or not params or any(p.dim() != 1 for p in params):
        return None
    return "RMSNorm" if "rms" in low else "LayerNorm" if "layer" in low else "Other"


def norm_modules(modules: dict[str, nn.Module]) -> list[tuple[str, nn.Module, str]]:
    """``(path, module, kind)`` of every norm module of ``modules`` (a ``named_modules()`` mapping) by
    :func:`walk_kind`, in the mapping's order."""
    out = []
    for path, mod in modules.items():
        kind = walk_kind(mod)
        if kind is not None:
            out.append((path, mod, kind))
    return out
