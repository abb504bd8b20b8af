"""Gain, bias and running-statistics facts of ONNX sites (``Site.weights``), computed as for a checkpoint
(:func:`normaudit.loaders.checkpoint.group_weight_stats`: gain mean, std, range and negative share,
non-finite count, BatchNorm running statistics initial or trained), reading only the site's own tensors
(a gain stored as ``(C, 1)`` for a broadcast counts as its ``C`` values). The keys are the tensors' names in
the graph."""
from __future__ import annotations

from typing import Any, Optional

from normaudit.facts.onnx_graph.record import OnnxSiteRecord
from normaudit.loaders.onnx_file import OnnxGraph
from normaudit.loaders.onnx_file.tensors import MAX_READ_ELEMENTS, numel
from normaudit.report import WeightStats

_LEAVES = (("gain", "weight"), ("bias", "bias"), ("mean", "running_mean"), ("var", "running_var"))


class _TensorsAsCheckpoint:
    """The few methods of :class:`normaudit.loaders.checkpoint.Checkpoint` that ``group_weight_stats`` calls,
    over ONNX tensors: ``keys`` maps the leaf names it knows (``x.weight``) to tensor names."""

    def __init__(self, g: OnnxGraph, keys: dict[str, str]):
        self.g, self.keys = g, keys

    def prefetch(self, keys: Any) -> None:
        return None

    def shape(self, key: str) -> tuple[int, ...]:
        return (numel(self.g.store.dims(self.keys[key]) or []),)

    def get(self, key: str) -> Any:
        import numpy as np
        import torch

        arr = self.g.store.array(self.keys[key])
        return torch.from_numpy(np.array(arr, dtype=np.float32).reshape(-1))


def site_weights(g: OnnxGraph, rec: OnnxSiteRecord) -> Optional[WeightStats]:
    """The :class:`WeightStats` of one site's tensors, None when it has none (or one is too large to be a
    norm parameter). Raises UsageError for a tensor whose stored data is corrupt."""
    from normaudit.loaders.checkpoint import group_weight_stats

    tensors = {leaf: getattr(rec, attr) for attr, leaf in _LEAVES if getattr(rec, attr)}
    if not tensors or any(numel(g.store.dims(t) or []) > MAX_READ_ELEMENTS for t in tensors.values()):
        return None
    if any((g.store.dtype(t) or "").startswith(("string", "complex")) for t in tensors.values()):
        return None
    keys = {f"site.{leaf}": name for leaf, name in tensors.items()}
    stats = group_weight_stats(_TensorsAsCheckpoint(g, keys), list(keys))
    stats.keys = list(dict.fromkeys(tensors.values()))
    ref = tensors.get("weight") or tensors.get("bias") or next(iter(tensors.values()))
    stats.shape, stats.dtype = g.store.dims(ref), g.store.dtype(ref)
    return stats
