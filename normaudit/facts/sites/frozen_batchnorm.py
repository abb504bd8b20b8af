"""Frozen BatchNorms: ``x * (w * rsqrt(running_var + eps)) + shift`` with the statistic a per-channel buffer,
kind BatchNorm in eval mode with running statistics tracked (hint ``statistic="running_var"``).

Export records the buffer arithmetic (:func:`add_frozen_batchnorm` reads it). Symbolic tracing proxies
parameters only, so it evaluates the buffer arithmetic while tracing and leaves ``x * constant + constant``:
a childless module holding 1-D buffers is then retraced alone with ``make_fx`` on meta tensors to read its
eps (:func:`folded_frozen_batchnorm_sites`)."""
from __future__ import annotations

import copy
import warnings
from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.facts.sites.activations import activation_nodes, is_act
from normaudit.facts.sites.application import SCALE_PATH, view_base
from normaudit.facts.sites.statistics import is_root
from normaudit.vocabulary.graph import FOLLOW, NEUTRAL_OPS, dtype, forward_walk, op_name, owner, scalar_operand, \
    shape, strip_neutral


def buffer_stat(scale_in: fx.Node, act: Optional[set]) -> Optional[tuple[fx.Node, Optional[float]]]:
    """``running_var + eps`` under a sqrt/rsqrt: (the per-channel tensor that is no activation, eps), else
    None. The frozen BatchNorm of torchvision/timm/detectron2/DETR: ``x * (w * (rv + eps).rsqrt()) + shift``."""
    if act is None:
        return None
    node, eps = strip_neutral(scale_in), None
    if isinstance(node, fx.Node) and op_name(node) == "add" and scalar_operand(node) is not None:
        eps = scalar_operand(node)
        node = next((a for a in node.args[:2] if isinstance(a, fx.Node)), None)
    node = view_base(node)
    if not isinstance(node, fx.Node) or node in act or node.op not in ("get_attr", "placeholder"):
        return None
    sh = shape(node)
    if sh is None or len(sh) != 1 or sh[0] < 2:
        return None
    return node, eps


def _apply_to_activation(scale: fx.Node, act: set) -> Optional[tuple[fx.Node, fx.Node, bool]]:
    """Follow ``scale`` (a function of buffers) forward through products with other non-activations and
    reshapes to the mul/div that applies it to an activation: (that node, the activation, a gain was
    multiplied in on the way), or None."""
    gain = False

    def step(user: fx.Node, n: fx.Node) -> Any:
        nonlocal gain
        name = op_name(user)
        others = [a for a in user.args[:2] if a is not n]
        if name in ("mul", "div") and others and is_act(others[0], act):
            return None if name == "div" and user.args[0] is n else (user, others[0], gain)
        if name == "mul" and others and isinstance(others[0], fx.Node) and others[0] not in act:
            gain = True
            return FOLLOW
        return FOLLOW if name in NEUTRAL_OPS or name in SCALE_PATH else None

    return forward_walk(scale, step)


def add_frozen_batchnorm(root: fx.Node, frozen: tuple[fx.Node, Optional[float]], act: Optional[set],
                          add_pattern, modules) -> None:
    """A BatchNorm with frozen statistics written out (torchvision ``FrozenBatchNorm2d``: ``x * scale + shift``
    with ``scale = w * (running_var + eps).rsqrt()``): kind BatchNorm over every dim but the channel dim,
    in eval mode, running statistics tracked. Only where the per-channel size matches the activation's
    channel dim (dim 1)."""
    buf, eps = frozen
    found = _apply_to_activation(root, act) if act is not None else None
    if found is None:
        return
    applied, x, gain = found
    x_shape, n = shape(x), shape(buf)[0]
    if x_shape is None or len(x_shape) < 2 or x_shape[1] != n:
        return
    if op_name(root) == "sqrt" and op_name(applied) != "div":
        return
    dims = [d for d in range(len(x_shape)) if d != 1]
    rec = add_pattern(owner(root, modules), root, buf, applied, x, dims, True, "population", eps,
                      "inside_sqrt" if eps is not None else "none", kind="BatchNorm")
    rec.site.normalized_shape = None
    rec.site.num_channels = n
    rec.site.training, rec.site.track_running_stats = False, True
    rec.site.affine_weight = gain or None  # w folded into the scale before it is applied
    rec.hints["statistic"] = "running_var"


def _folded_candidates(nodes: list[fx.Node], mod: Optional[nn.Module], act: Optional[set]):
    """In a module holding per-channel statistics as buffers (at least two floating 1-D buffers of one length
    C, as running_mean/running_var; children, if any, without parameters or buffers: timm's
    ``FrozenBatchNormAct2d`` holds its activation), the ``x * constant`` multiplies (symbolic tracing's folded
    buffer arithmetic) with an activation of C channels: [(mul, x)]."""
    if act is None or mod is None:
        return []
    if any(True for c in mod.children() for _ in list(c.parameters()) + list(c.buffers())):
        return []
    sizes = [b.shape[0] for b in mod.buffers(recurse=False) if b.is_floating_point() and b.dim() == 1]
    if len(sizes) < 2 or len(set(sizes)) != 1:
        return []
    out = []
    for n in nodes:
        if op_name(n) == "mul" and len(n.args) > 1:
            a, b = n.args[0], n.args[1]
            for x, c in ((a, b), (b, a)):
                if (is_act(x, act) and isinstance(c, fx.Node) and c.op == "get_attr" and c not in act
                        and (shape(x) or (0, 0))[1:2] == (sizes[0],)):
                    out.append((n, x))
    return out


def _retraced_frozen_batchnorm(mod: nn.Module, x: fx.Node) -> Optional[tuple[Optional[float], int, bool]]:
    """(eps, channels, a gain is multiplied in) of a frozen BatchNorm module whose buffer arithmetic symbolic tracing evaluated while
    tracing (it proxies parameters, not buffers, so ``w * (running_var + eps).rsqrt()`` is left as one
    constant): the module alone, on a meta copy, traced at the dispatcher (``make_fx`` records every op,
    buffers included), then read like an exported graph. None when it is not one (or cannot be traced)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x_shape, x_dtype = shape(x), dtype(x)
    if x_shape is None or x_dtype is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy_ = copy.deepcopy(mod).to_empty(device="meta")
            small = make_fx(copy_)(torch.empty(x_shape, dtype=x_dtype, device="meta"))
    except Exception:  # foreign code: no site rather than a crash
        return None
    act = activation_nodes(small, [n.name for n in small.graph.nodes if n.op == "placeholder"])
    for node in small.graph.nodes:
        if not is_root(node):
            continue
        frozen = buffer_stat(node.args[0], act)
        found = _apply_to_activation(node, act) if frozen is not None and act is not None else None
        if found is not None and shape(found[1]) == x_shape:
            return frozen[1], shape(frozen[0])[0], found[2]
    return None


def folded_frozen_batchnorm_sites(owned: dict, records: list, modules: dict, act: Optional[set],
                                   add_pattern) -> None:
    """Frozen BatchNorms whose buffer arithmetic symbolic tracing folded into constants
    (:func:`_folded_candidates`, :func:`_retraced_frozen_batchnorm`), in modules with no site yet."""
    found_paths = {r.site.module for r in records}
    for path, nodes in owned.items():
        if path in found_paths:
            continue
        for mul, x in _folded_candidates(nodes, modules.get(path), act):
            got = _retraced_frozen_batchnorm(modules[path], x)
            if got is None or (shape(x) or (0, 0))[1:2] != (got[1],):
                continue
            eps, channels, gain = got
            rec = add_pattern(path, mul, mul.args[1] if mul.args[0] is x else mul.args[0], mul, x,
                              [d for d in range(len(shape(x))) if d != 1], True, "population", eps,
                              "inside_sqrt" if eps is not None else "none", kind="BatchNorm")
            rec.site.num_channels, rec.site.affine_weight = channels, gain or None
            rec.site.training, rec.site.track_running_stats = False, True
            rec.hints["statistic"] = "running_var"
            break
