"""Checkpoint readers and checkpoint-only inspection of normalisation parameters.

:func:`open_checkpoint` opens ``.safetensors`` files (lazily, through ``safetensors.safe_open``), sharded
checkpoints (``*.index.json`` with a ``weight_map``), model directories (``config.json`` + weights) and
``.pt/.pth/.bin/.ckpt`` files (``torch.load(..., weights_only=True)`` only: normaudit never unpickles
arbitrary objects) as a :class:`Checkpoint`. :func:`inspect_norm_params` finds the norm parameters of a
checkpoint by name and shape and summarises them as ``normaudit.report.WeightStats``, reading only the
small 1-D tensors.

One module per concern: :mod:`.common` (JSON and message helpers), :mod:`.safetensors_file`,
:mod:`.torch_file` and :mod:`.formats` (the readers of each format, sharded indexes included),
:mod:`.opening` (:class:`Checkpoint`, key alignment, :func:`open_checkpoint`), :mod:`.norm_params` (norms
found by name and shape, their statistics).
"""
from __future__ import annotations

from normaudit.loaders.checkpoint.norm_params import CheckpointNormGroup, group_weight_stats, inspect_norm_params
from normaudit.loaders.checkpoint.opening import Checkpoint, checkpoint_target, open_checkpoint
from normaudit.loaders.checkpoint.torch_file import scan_pickle

__all__ = [
    "Checkpoint",
    "CheckpointNormGroup",
    "open_checkpoint",
    "inspect_norm_params",
    "group_weight_stats",
    "checkpoint_target",
    "scan_pickle",
]
