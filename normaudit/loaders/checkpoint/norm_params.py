"""The norm parameters of a checkpoint alone, found by name and shape, and their statistics.

:func:`inspect_norm_params` groups the keys under each module prefix that holds running statistics, or
1-D gains and biases under a name saying norm, into a :class:`CheckpointNormGroup` with a guessed kind;
:func:`group_weight_stats` summarises one norm's tensors as a :class:`normaudit.report.WeightStats` (gain
mean, std, range, negative share; non-finite count; running statistics initial or trained), reading only
those small tensors.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Optional

import torch
from pydantic import BaseModel, ConfigDict

from normaudit.loaders.checkpoint.opening import Checkpoint
from normaudit.report import Kind, Site, WeightStats

_WEIGHT_LEAVES = ("weight", "gamma", "scale")
_BIAS_LEAVES = ("bias", "beta")
_STAT_LEAVES = ("running_mean", "running_var", "num_batches_tracked")


class CheckpointNormGroup(BaseModel):
    """One norm found in a checkpoint alone: the keys under one module prefix.

    ``module``: the key prefix (``encoder.layer.0.attention.output.LayerNorm``), in ``Checkpoint.keys()``
    form. ``kind`` is always a guess (``kind_guessed`` is True): ``BatchNorm`` when running statistics
    exist, else what the name says (rms / bn, batchnorm / gn, groupnorm / instance), else ``LayerNorm``
    with a bias, ``RMSNorm`` with a weight only; ``kind_basis`` says which. ``num_features``: length of the
    1-D parameters. ``weights``: statistics of the group's tensors (``WeightStats``).
    """

    model_config = ConfigDict(extra="forbid")

    module: str
    kind: Kind
    kind_guessed: bool = True
    kind_basis: str
    num_features: int
    weights: WeightStats

    def to_site(self) -> Site:
        """A report ``Site`` (``detected_by="checkpoint"``) for checkpoint-only targets."""
        bn = self.kind == "BatchNorm"
        return Site(module=self.module, kind=self.kind, class_name="(checkpoint)", detected_by="checkpoint",
                    normalized_shape=None if bn else [self.num_features],
                    num_channels=self.num_features if bn else None,
                    affine_weight=any(k.rsplit(".", 1)[-1] in _WEIGHT_LEAVES for k in self.weights.keys),
                    affine_bias=self.weights.bias_present,
                    track_running_stats=self.weights.running_state is not None,
                    weights=self.weights,
                    kind_guessed=self.kind_guessed, kind_basis=self.kind_basis)


def _tokens(name: str) -> set[str]:
    return set(filter(None, re.split(r"[^a-z]+", name.lower())))


def _name_says_norm(name: str) -> bool:
    return "norm" in name.lower() or bool(_tokens(name) & {"ln", "bn", "gn", "rms"})


#: PyTorch's BatchNorm eps (``torch.nn.BatchNorm2d(eps=1e-05)``): the one a running variance is checked with
#: when the model, and so its own eps, is unknown
BATCHNORM_DEFAULT_EPS = 1e-5


def group_weight_stats(ckpt: Checkpoint, keys: Iterable[str], *, gain: Optional[str] = None,
                       bias: Optional[str] = None, eps: Optional[float] = None) -> WeightStats:
    """``WeightStats`` over the tensors of one norm, given its checkpoint keys (leaf names ``weight``/
    ``gamma``/``scale``, ``bias``/``beta``, ``running_mean``, ``running_var``, ``num_batches_tracked``).

    ``gain``/``bias``: the keys holding the gain and the bias when their leaf names say nothing (a hand-written
    norm's ``a_2``/``b_2``); by default the first ``weight``/``gamma``/``scale`` and ``bias``/``beta`` key.
    Reads only those tensors; raises ``ValueError`` if one has more than 1 dimension. ``gain_*``: mean,
    population std, min, max of the finite entries of the gain in float32 (None without a gain or with
    no finite entry), ``gain_negative_fraction`` the share of them below 0; ``nonfinite``: NaN/inf count over
    all the tensors; ``running_state``: ``initial`` when running_mean is all 0, running_var all 1 and
    num_batches_tracked 0 or absent, else ``trained`` (None without running statistics). ``shape``/``dtype``:
    those of the gain (else bias, else stats). ``running_var_*``: the running variance checked against
    ``eps`` (the norm's, else :data:`BATCHNORM_DEFAULT_EPS`), see :func:`_running_var_stats`.
    """
    keys = list(keys)
    by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
    ckpt.prefetch(keys)
    for k in keys:
        if len(ckpt.shape(k)) > 1:
            raise ValueError(f"{k!r} has shape {list(ckpt.shape(k))}: not a 1-D norm parameter")
    tensors = {k: ckpt.get(k) for k in keys}
    gain_key = gain if gain in tensors else next((by_leaf[lf] for lf in _WEIGHT_LEAVES if lf in by_leaf), None)
    bias_key = bias if bias in tensors else next((by_leaf[lf] for lf in _BIAS_LEAVES if lf in by_leaf), None)
    stat_keys = {lf: by_leaf[lf] for lf in _STAT_LEAVES if lf in by_leaf}
    ref = gain_key or bias_key or next(iter(stat_keys.values()), None)
    stats = WeightStats(source="checkpoint", keys=keys, bias_present=bias_key is not None,
                        shape=list(tensors[ref].shape) if ref else None,
                        dtype=str(tensors[ref].dtype).removeprefix("torch.") if ref else None)
    stats.nonfinite = sum(t.numel() - int(torch.isfinite(t).sum()) for t in tensors.values()
                          if t.is_floating_point() or t.is_complex())
    if gain_key:
        g = tensors[gain_key].float().reshape(-1)
        if stats.nonfinite:  # boolean indexing only when needed: it is slow under CPU contention
            g = g[torch.isfinite(g)]
        if g.numel():
            stats.gain_mean, stats.gain_std = float(g.mean()), float(g.std(correction=0))
            stats.gain_min, stats.gain_max = float(g.min()), float(g.max())
            stats.gain_negative_fraction = float((g < 0).sum()) / g.numel()
    rm, rv, nbt = (tensors[stat_keys[lf]] if lf in stat_keys else None for lf in _STAT_LEAVES)
    if nbt is not None:
        stats.num_batches_tracked = int(nbt.reshape(-1)[0]) if nbt.numel() else None
    if rm is not None or rv is not None:
        initial = ((rm is None or bool((rm == 0).all())) and (rv is None or bool((rv == 1).all()))
                   and not stats.num_batches_tracked)
        stats.running_state = "initial" if initial else "trained"
    if rv is not None and rv.is_floating_point():
        _running_var_stats(stats, stat_keys["running_var"], rv, BATCHNORM_DEFAULT_EPS if eps is None else eps)
    stats.classify_centre()
    return stats


def _running_var_stats(stats: WeightStats, key: str, rv: torch.Tensor, eps: float) -> None:
    """Fill ``stats.running_var_*`` from the running variance ``rv`` (1-D, one entry per channel): in eval mode
    BatchNorm divides by ``sqrt(running_var + eps)`` (PyTorch docs, ``torch.nn.BatchNorm2d``), NaN for a
    channel where ``running_var + eps < 0`` and a division by zero where it is 0. NaN and inf entries are
    left to the non-finite count (``nonfinite``)."""
    v = rv.float().reshape(-1)  # the sum as eval mode computes it, in float32: -1e-5 + 1e-5 is 0 there
    finite = torch.isfinite(v)
    stats.running_var_key, stats.running_var_eps = key, float(eps)
    if bool(finite.any()):
        stats.running_var_min = float(v[finite].min())
    stats.running_var_invalid = [int(i) for i in torch.nonzero(finite & (v + eps <= 0)).reshape(-1)]


def _guess_kind(name: str, leaves: set[str]) -> tuple[str, str]:
    low, toks = name.lower(), _tokens(name)
    if leaves & {"running_mean", "running_var"}:
        return "BatchNorm", "running statistics present"
    if "rms" in low:
        return "RMSNorm", "name says rms"
    if "batch" in low or "bn" in toks:
        return "BatchNorm", "name says batch norm (no running statistics)"
    if "group" in low or "gn" in toks:
        return "GroupNorm", "name says group norm"
    if "instance" in low:
        return "InstanceNorm", "name says instance norm"
    if leaves & set(_BIAS_LEAVES):
        return "LayerNorm", "bias present, no running statistics"
    return "RMSNorm", "weight only, no bias"


def _natural(key: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("."))


def inspect_norm_params(ckpt: Checkpoint) -> list[CheckpointNormGroup]:
    """Find the norm parameters of a checkpoint by name and shape, one group per module prefix.

    A prefix is a norm when it holds ``running_mean``/``running_var`` (BatchNorm, whatever its name), or
    when its 1-D ``weight``/``bias`` are under a name saying norm (``*norm*``, ``ln``, ``ln_f``, ``bn``,
    ``gn``, ``rms`` tokens) or it has 1-D ``gamma``/``beta``/``scale``; a prefix holding any tensor of 2+
    dimensions is never one. Reads only the groups' 1-D (and 0-D ``num_batches_tracked``) tensors.
    Returns groups sorted by module path (numeric components in numeric order).
    """
    prefixes: dict[str, dict[str, str]] = {}
    too_big: set[str] = set()
    for key in ckpt.keys():
        prefix, _, leaf = key.rpartition(".")
        prefixes.setdefault(prefix, {})[leaf] = key
        if len(ckpt.shape(key)) > 1:
            too_big.add(prefix)
    found = []
    for prefix in sorted(prefixes, key=_natural):
        leaves = prefixes[prefix]
        if prefix in too_big:
            continue
        params = [lf for lf in (*_WEIGHT_LEAVES, *_BIAS_LEAVES) if lf in leaves]
        stats = [lf for lf in _STAT_LEAVES if lf in leaves]
        if any(len(ckpt.shape(leaves[lf])) != 1 for lf in params + stats if lf != "num_batches_tracked"):
            continue
        last = prefix.rpartition(".")[2]
        if not ({"running_mean", "running_var"} & set(stats)
                or (params and _name_says_norm(last))
                or {"gamma", "beta", "scale"} & set(params)):
            continue
        found.append((prefix, last, leaves, [leaves[lf] for lf in params + stats]))
    ckpt.prefetch([k for *_, keys in found for k in keys])
    groups = []
    for prefix, last, leaves, keys in found:
        kind, basis = _guess_kind(last, set(leaves))
        ws = group_weight_stats(ckpt, keys)
        groups.append(CheckpointNormGroup(module=prefix, kind=kind, kind_basis=basis,
                                          num_features=ws.shape[0] if ws.shape else 0, weights=ws))
    return groups
