"""Norm sites of the ONNX normalisation operators (ONNX operator specification, opsets 1-23):

- ``LayerNormalization`` (opset 17): mean and variance over dims ``axis..rank-1``, ``epsilon`` (default
  1e-5) inside the square root, statistics in ``stash_type`` (default 1, float32);
- ``RMSNormalization`` (opset 23): mean of squares over ``axis..rank-1``, ``epsilon``, ``stash_type``;
- ``GroupNormalization`` (opset 18, ``stash_type`` from 21): ``num_groups`` groups of channels, statistics
  over each group and the spatial dims;
- ``InstanceNormalization``: per example and channel over the spatial dims (dims 2..); the form exporters give
  ``nn.GroupNorm`` (``Reshape`` to ``(N, G, -1)``, ``InstanceNormalization``, ``Reshape`` back, then the
  per-channel gain and bias) is a GroupNorm of ``G`` groups;
- ``BatchNormalization``: per channel (dim 1) over the batch and spatial dims, with the running statistics as
  inputs; eps added in the input's dtype (no ``stash_type``);
- ``LpNormalization``: ``x / ||x||_p`` along ``axis``, no eps; p=2 is an RMSNorm up to sqrt(d) (statistic
  ``l2_norm``), as ``F.normalize`` is in a PyTorch graph; another p is ``Other``;
- ``LRN``: local response normalisation across channels (``size``, ``alpha``, ``beta``, ``bias``).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from normaudit.facts.onnx_graph.record import HALF, OnnxSiteRecord, affine_after, scale_form
from normaudit.loaders.onnx_file import OnnxGraph
from normaudit.loaders.onnx_file.tensors import dtype_name
from normaudit.report import Formula, LrnArgs, Site

FUSED_OPS = ("LayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization",
             "BatchNormalization", "LpNormalization", "LRN")
_NP = {"float32": np.float32, "float16": np.float16, "float64": np.float64}


def clean_eps(value: Optional[float], dtype: Optional[str]) -> Optional[float]:
    """``value`` as the shortest decimal its stored dtype reads back exactly (a float32 attribute holding
    1e-5 is 9.99999974e-06: reported as 1e-05, what the model was built with); unchanged for other dtypes."""
    if value is None or not np.isfinite(value):
        return value
    kind = _NP.get(dtype or "float32")
    if kind is None:
        try:
            import ml_dtypes

            kind = getattr(ml_dtypes, dtype or "", None)
        except ImportError:
            kind = None
    return float(str(kind(value))) if kind is not None else float(value)


def _dims_from(axis: Any, rank: Optional[int], to_end: bool = True) -> Optional[list[int]]:
    """Dims ``axis..rank-1`` (``to_end``) or ``[axis]``, ``axis`` taken modulo ``rank``; None when unknown."""
    if rank is None or not isinstance(axis, int) or not -rank <= axis < rank:
        return None
    a = axis % rank
    return list(range(a, rank)) if to_end else [a]


def _stash(node: Any, g: OnnxGraph, has_stash: bool) -> Optional[str]:
    """The dtype the statistics are held in: ``stash_type`` where the op has it (default float32)."""
    if not has_stash:
        return None
    return dtype_name(int(g.number(node, "stash_type", 1))) or "float32"


def _formula(kind: str, inp_dtype: Optional[str], stats: Optional[str], gain_form: str, bias: bool) -> Formula:
    """The formula of a fused op: what the specification computes."""
    upcast = (stats not in HALF) if inp_dtype in HALF and stats else None
    return Formula(mean_subtracted=kind != "RMSNorm", variance="mean_square" if kind == "RMSNorm" else "population",
                   eps_position="inside_sqrt", gain=gain_form, bias=bias, stats_dtype=stats, upcast=upcast, fused=True,
                   eps_dtype=stats)


def _base(g: OnnxGraph, i: int, kind: str, reduced: Optional[list[int]], eps: Optional[float]) -> Site:
    node = g.nodes[i]
    x = node.input[0]
    shape = g.shape(x)
    ints = shape if shape is not None and all(isinstance(d, int) for d in shape) else None
    return Site(module=g.labels[i], kind=kind, class_name=node.op_type, detected_by="onnx", op=node.op_type,
                eps=eps, reduced_dims=reduced, input_shape=ints, input_dtype=g.dtype(x),
                output_dtype=g.dtype(node.output[0]) if node.output else None)


def _norm_layer(g: OnnxGraph, i: int, kind: str) -> OnnxSiteRecord:
    """LayerNormalization and RMSNormalization."""
    node = g.nodes[i]
    x = node.input[0]
    reduced = _dims_from(g.number(node, "axis", -1), g.rank(x))
    stats = _stash(node, g, True)
    eps = clean_eps(float(g.number(node, "epsilon", 1e-5)), "float32")
    site = _base(g, i, kind, reduced, eps)
    gain, form = scale_form(g, node.input[1] if len(node.input) > 1 else "")
    bias = g.tensor_source(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    shape = g.shape(x)
    if reduced and shape is not None and all(isinstance(shape[d], int) for d in reduced):
        site.normalized_shape = [shape[d] for d in reduced]
    elif gain is not None:
        site.normalized_shape = g.store.dims(gain)
    site.affine_weight, site.affine_bias = form != "none", bias is not None
    site.compute_dtype = stats
    site.formula = _formula(kind, site.input_dtype, stats, form, bias is not None)
    return OnnxSiteRecord(site=site, anchor=i, nodes=[i], inp=x, out=node.output[0], gain=gain, bias=bias,
                          gain_form=form, statistic="mean_square" if kind == "RMSNorm" else "variance",
                          eps_dtype=stats, eps_basis="stash_type of the operator")


def _channel_norm(g: OnnxGraph, i: int, kind: str) -> OnnxSiteRecord:
    """GroupNormalization, InstanceNormalization and BatchNormalization: per-channel (dim 1) statistics."""
    node = g.nodes[i]
    x = node.input[0]
    rank = g.rank(x)
    reduced = None if rank is None else ([0] if kind == "BatchNorm" else [1] if kind == "GroupNorm" else []) \
        + list(range(2, rank))
    has_stash = kind == "GroupNorm" and (g.opsets.get("", 0) >= 21 or g.attr(node, "stash_type") is not None)
    stats = _stash(node, g, has_stash)
    eps_dtype = stats or g.dtype(x)
    site = _base(g, i, kind, reduced, clean_eps(float(g.number(node, "epsilon", 1e-5)), "float32"))
    shape = g.shape(x)
    site.num_channels = shape[1] if shape is not None and len(shape) > 1 and isinstance(shape[1], int) else None
    gain, form = scale_form(g, node.input[1] if len(node.input) > 1 else "")
    bias = g.tensor_source(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    rec = OnnxSiteRecord(site=site, anchor=i, nodes=[i], inp=x, out=node.output[0], gain=gain, bias=bias,
                         gain_form=form, statistic="variance", eps_dtype=eps_dtype,
                         eps_basis="stash_type of the operator" if stats else "the input's dtype (the operator has no stash_type)")
    if kind == "GroupNorm":
        groups = g.number(node, "num_groups", None)
        site.num_groups = groups if isinstance(groups, int) else None
    if kind == "BatchNorm":
        rec.mean = g.tensor_source(node.input[3]) if len(node.input) > 3 else None
        rec.var = g.tensor_source(node.input[4]) if len(node.input) > 4 else None
        site.training = bool(g.number(node, "training_mode", 0))
        site.track_running_stats = True
    site.affine_weight, site.affine_bias = form != "none", bias is not None
    site.compute_dtype = eps_dtype
    return rec


def _group_norm_form(g: OnnxGraph, rec: OnnxSiteRecord) -> OnnxSiteRecord:
    """An InstanceNormalization between ``Reshape(N, C, ...) -> (N, G, -1)`` and a ``Reshape`` back, the form
    of ``nn.GroupNorm`` exporters emit: the record becomes a GroupNorm of G groups over the reshaped input,
    with the gain and bias that follow the reshape back."""
    node = g.nodes[rec.anchor]
    pre = g.node_of(node.input[0])
    if pre is None or g.op(node.input[0]) != "Reshape":
        return rec
    src, mid = pre.input[0], g.shape(node.input[0])
    outer = g.shape(src)
    users = g.users(node.output[0])
    if (outer is None or len(outer) < 3 or mid is None or len(mid) != 3 or not isinstance(mid[1], int)
            or not isinstance(outer[1], int) or mid[1] <= 0 or outer[1] % mid[1] or mid[1] == outer[1]
            or len(users) != 1 or g.nodes[users[0]].op_type != "Reshape"):
        return rec
    site = rec.site
    nodes = [g.producer[node.input[0]], rec.anchor, users[0]]
    gain, bias, form, out = affine_after(g, g.nodes[users[0]].output[0], nodes)
    site.kind, site.num_groups, site.num_channels = "GroupNorm", mid[1], outer[1]
    site.class_name = "InstanceNormalization (GroupNorm form)"
    site.reduced_dims = list(range(1, len(outer)))
    site.input_shape = outer if all(isinstance(d, int) for d in outer) else None
    site.input_dtype = g.dtype(src)
    if form != "none":
        rec.gain, rec.gain_form = gain, form
    if bias is not None:
        rec.bias = bias
    site.affine_weight, site.affine_bias = rec.gain_form != "none", rec.bias is not None
    rec.inp, rec.out, rec.nodes = src, out, nodes
    site.output_dtype = g.dtype(out)
    return rec


def _lp(g: OnnxGraph, i: int) -> OnnxSiteRecord:
    node = g.nodes[i]
    x = node.input[0]
    p = g.number(node, "p", 2)
    kind = "RMSNorm" if p == 2 else "Other"
    site = _base(g, i, kind, _dims_from(g.number(node, "axis", -1), g.rank(x), to_end=False), None)
    site.affine_weight = site.affine_bias = False
    return OnnxSiteRecord(site=site, anchor=i, nodes=[i], inp=x, out=node.output[0],
                          statistic="l2_norm" if p == 2 else None)


def _lrn(g: OnnxGraph, i: int) -> OnnxSiteRecord:
    node = g.nodes[i]
    x = node.input[0]
    rank = g.rank(x)
    site = _base(g, i, "LocalResponseNorm", [1] if rank and rank > 1 else None, None)
    size = g.number(node, "size", 1)
    # the attributes are float32: read back as the decimals the model was built with (clean_eps)
    def real(name: str, default: float) -> float:
        return clean_eps(float(g.number(node, name, default)), "float32")

    site.lrn = LrnArgs(size=int(size) if isinstance(size, int) else 1, alpha=real("alpha", 1e-4),
                       beta=real("beta", 0.75), k=real("bias", 1.0))
    return OnnxSiteRecord(site=site, anchor=i, nodes=[i], inp=x, out=node.output[0])


def fused_site(g: OnnxGraph, i: int) -> Optional[OnnxSiteRecord]:
    """The site of node ``i`` when it is one of :data:`FUSED_OPS` (standard domain, with its input), else None."""
    node = g.nodes[i]
    if node.op_type not in FUSED_OPS or not g.standard(i) or not node.input or not node.input[0] or not node.output:
        return None
    op = node.op_type
    if op in ("LayerNormalization", "RMSNormalization"):
        return _norm_layer(g, i, "LayerNorm" if op == "LayerNormalization" else "RMSNorm")
    if op == "InstanceNormalization":
        return _group_norm_form(g, _channel_norm(g, i, "InstanceNorm"))
    if op in ("GroupNormalization", "BatchNormalization"):
        return _channel_norm(g, i, "GroupNorm" if op == "GroupNormalization" else "BatchNorm")
    return _lp(g, i) if op == "LpNormalization" else _lrn(g, i)
