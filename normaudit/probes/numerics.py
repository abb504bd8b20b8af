"""Numerics probe (``--probe numerics``; ``numerics-backward`` adds one backward, ``numerics-autocast`` runs float32
weights under ``torch.autocast``): run the model for real
in the audited dtype and see where non-finite values appear and how close each norm runs to eps and to the
dtype's maximum.

The model is built for real (:func:`real_model`): weights from ``--checkpoint`` when given, else as the factory
initialises them (the report then says the weights are random), cast to ``--dtype`` (as ``model.half()`` does:
floating parameters and buffers) and run once in eval mode on the example inputs, on CUDA when available, else
on the CPU. The run is seeded (:data:`NUMERICS_SEED`, ``NumericsReport.seed``; ``torch.random.fork_rng``
restores the caller's RNG state after): the factory and ``example_inputs()`` are called again under it, so
random weights and random inputs are the same on every run. Models above ``--max-params`` parameters are refused (exit 2) before anything is built; peak memory
is the float32 model plus its cast copy, one tensor at a time (at most ~1.5x the float32 weights), plus the
activations of one forward.

Per module (every module, as transformers' ``DebugUnderflowOverflow`` watches them): forward hooks record the
abs-max of the finite values and the NaN/inf counts of its floating inputs and output, and its own weights'
abs-max. The *producer* is the first module, in the order calls return (children before their parent), whose
output holds a non-finite value while its inputs are finite; *first NaN* the first whose output holds a NaN
while its inputs hold none (the producer itself, or a norm turning inf into NaN: ``inf - inf`` in the mean
subtraction); *propagators* the later modules with non-finite inputs and outputs (ancestors of the producer
are neither). Per norm site: the statistic eps is added to (variance, or mean square for RMSNorm) per row,
in float32, from the norm's real input (a fused call ``F.layer_norm``/``F.rms_norm``/``F.group_norm``/
``F.batch_norm``/``F.instance_norm`` is seen through a ``TorchFunctionMode`` and attributed to the module whose
forward makes it; a hand-written norm module through its forward hook; a norm computed inline in a larger
module is not measured), the share of rows below 10 * eps, the output abs-max against the dtype's maximum.

Sources: the triage list of mixed-precision norm debugging (variance far below eps, stability of the
statistic in the dtype, the layer where NaN first appears); transformers ``debug_utils.DebugUnderflowOverflow``
(per-module abs-min/abs-max, the frames before the first inf/NaN); IEEE 754 (float16 max 65504).
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from normaudit.errors import UsageError
from normaudit.facts.context import FactContext, Facts
from normaudit.facts.numerics import DTYPE_MAX, bound_from_values
from normaudit.options import DEFAULT_MAX_PARAMS
from normaudit.phases import phase
from normaudit.probes.common import call_model, materialise, one_line, out_tensor
from normaudit.quiet import quiet
from normaudit.report import ModuleNumerics, NumericsReport, SiteNumerics, TensorStats
from normaudit.vocabulary.dtypes import torch_dtype


#: a row is eps-dominated when its statistic is below this many times eps
EPS_DOMINATED_FACTOR = 10.0
#: modules kept in ``NumericsReport.before`` (the calls that returned just before the producer)
FRAMES_BEFORE = 5
MAX_PROPAGATORS = 50
#: ``torch.manual_seed`` of the probe's run (the factory's random weights, ``example_inputs()``, dropout), so two
#: runs give the same numbers; the caller's RNG state is restored after (``torch.random.fork_rng``)
NUMERICS_SEED = 0
_ROWS_KEPT = 1 << 20
_FUSED = {"layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm"}


def check_size(model: nn.Module, max_params: Optional[int], where: Optional[str] = None) -> int:
    """The number of parameters of ``model`` (meta or real; shared ones once). Raises UsageError (exit 2, naming
    ``where``) when it exceeds ``max_params`` (default :data:`DEFAULT_MAX_PARAMS`)."""
    limit = DEFAULT_MAX_PARAMS if max_params is None else int(max_params)
    n = sum(p.numel() for p in model.parameters())
    if n > limit:
        gib = n * 4 / 2**30
        need = f"{gib:.1f} GiB" if gib >= 0.1 else f"{n * 4 / 2**20:.1f} MiB"
        raise UsageError(f"--probe numerics: the model has {n:,} parameters, above the limit of {limit:,} "
                         f"(--max-params {limit}); building it for real takes about {need} in float32: raise "
                         "--max-params to run it anyway", file=where)
    return n


# ============================================================================================ statistics
def tensor_stats(tensors: list[torch.Tensor], memo: Optional[dict] = None) -> TensorStats:
    """Abs-max of the finite values and NaN/inf counts over floating ``tensors`` (others are skipped).

    One ``aminmax`` pass per tensor when it is finite (the common case), the counts only otherwise. ``memo``
    (``id(tensor) -> (weakref, version, stats)``) reuses the stats of a tensor seen before in the same run: a module's
    input is mostly an earlier module's output."""
    out = TensorStats()
    best = None
    for t in tensors:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
            continue
        one = _one_tensor(t, memo)
        out.numel += one.numel
        out.nan, out.inf = out.nan + one.nan, out.inf + one.inf
        if one.absmax is not None:
            best = one.absmax if best is None else max(best, one.absmax)
    out.absmax = best
    return out


def _one_tensor(t: torch.Tensor, memo: Optional[dict]) -> TensorStats:
    key = t
    try:
        version = t._version
    except RuntimeError:  # an inference-mode tensor has no version counter: never reused
        version, memo = None, None
    if memo is not None:
        hit = memo.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == version:  # not modified in place since
            return hit[2]
    t = t.detach()
    lo, hi = torch.aminmax(t)
    m = max(-float(lo), float(hi))
    if math.isfinite(m):
        stats = TensorStats(absmax=m, numel=t.numel())
    else:
        finite = t[torch.isfinite(t)]
        stats = TensorStats(absmax=float(finite.abs().amax()) if finite.numel() else None,
                            nan=int(torch.isnan(t).sum()), inf=int(torch.isinf(t).sum()), numel=t.numel())
    if memo is not None:
        try:
            memo[id(key)] = (weakref.ref(key), version, stats)
        except TypeError:  # a tensor subclass without weak references
            pass
    return stats


def _leaves(obj: Any, depth: int = 0) -> list[torch.Tensor]:
    """Tensors in nested tuples/lists/dicts (a transformers ``ModelOutput`` is a dict)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 4:
        return []
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _leaves(o, depth + 1)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _leaves(o, depth + 1)]
    return []


def _merge(a: Optional[TensorStats], b: TensorStats) -> TensorStats:
    if a is None:
        return b
    best = [v for v in (a.absmax, b.absmax) if v is not None]
    return TensorStats(absmax=max(best) if best else None, nan=a.nan + b.nan, inf=a.inf + b.inf,
                       numel=a.numel + b.numel)


def row_statistic(op: str, x: torch.Tensor, args: tuple, kwargs: dict, mean_subtracted: bool,
                  dims: Optional[list[int]] = None) -> Optional[torch.Tensor]:
    """The statistic eps is added to, one value per normalised row, in float32 (1-D), for a norm call
    ``op`` on input ``x``: variance (population) for a mean-subtracting norm, mean of squares otherwise;
    BatchNorm in eval mode: its ``running_var``. ``dims``: the normalised dims of a hand-written norm."""
    xf = x.detach().float()
    if op in ("layer_norm", "rms_norm"):
        shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
        k = len(shape) if isinstance(shape, (tuple, list, torch.Size)) else 1
        rows = xf.reshape(-1, math.prod(xf.shape[-k:]) if k else 1)
        mean_subtracted = op == "layer_norm"
    elif op == "group_norm":
        groups = int(args[1] if len(args) > 1 else kwargs.get("num_groups", 1))
        rows = xf.reshape(xf.shape[0] * groups, -1)
    elif op == "batch_norm":
        training = args[5] if len(args) > 5 else kwargs.get("training", False)
        running_var = args[2] if len(args) > 2 else kwargs.get("running_var")
        if not training and isinstance(running_var, torch.Tensor):
            return running_var.detach().float().reshape(-1)
        rows = xf.transpose(0, 1).reshape(xf.shape[1], -1)
    elif op == "instance_norm":
        rows = xf.reshape(xf.shape[0] * xf.shape[1], -1)
    else:  # a hand-written norm module: its reduced dims
        if not dims:
            return None
        dims = [d % xf.dim() for d in dims]
        keep = [d for d in range(xf.dim()) if d not in dims]
        rows = xf.permute(*keep, *dims).reshape(-1, math.prod(xf.shape[d] for d in dims))
    if mean_subtracted:
        return rows.var(dim=1, unbiased=False)
    return rows.pow(2).mean(dim=1)


@dataclass
class _SiteAcc:
    """What the forward showed of one site (accumulated over its calls)."""

    site: Any
    calls: int = 0
    stats: list[torch.Tensor] = field(default_factory=list)
    kept: int = 0
    inputs: Optional[TensorStats] = None
    output: Optional[TensorStats] = None

    def add(self, stat: Optional[torch.Tensor], inp: TensorStats, out: TensorStats) -> None:
        self.calls += 1
        self.inputs, self.output = _merge(self.inputs, inp), _merge(self.output, out)
        if stat is not None and self.kept < _ROWS_KEPT:
            s = stat.detach().float().cpu().reshape(-1)[: _ROWS_KEPT - self.kept]
            self.stats.append(s)
            self.kept += s.numel()


@dataclass
class _Call:
    module: str
    class_name: str
    inputs: TensorStats
    nested_norms: int = 0


# ============================================================================================ recorder
class _NormMode(torch.overrides.TorchFunctionMode):
    """Sees every fused norm call (``F.layer_norm`` ...) and hands it to the recorder with its result."""

    def __init__(self, recorder: "Recorder"):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in _FUSED and args and isinstance(args[0], torch.Tensor):
            self.recorder.fused_call(name, args, kwargs, out)
        return out


class Recorder:
    """Forward hooks on every module of ``model`` (see the module docstring); ``sites`` are the report's sites.

    After a run: ``calls`` (every module call, in return order, as :class:`ModuleNumerics`), ``producer``,
    ``first_nan``, ``propagators``, ``site_acc`` per site key ``(module, call_index)``."""

    def __init__(self, model: nn.Module, sites: list, dtype: str):
        self.dtype = dtype
        self.names = {id(m): n for n, m in model.named_modules()}
        self.modules = dict(model.named_modules())
        self.stack: list[_Call] = []
        self.calls: list[ModuleNumerics] = []
        self.producer: Optional[ModuleNumerics] = None
        self.first_nan: Optional[str] = None
        self.propagators: list[str] = []
        self.propagator_count = 0
        self.fused_index: dict[int, int] = {}
        self.site_acc: dict[tuple[str, int], _SiteAcc] = {}
        self.by_key = {(s.module, s.call_index): s for s in sites}
        self.hand_written = {s.module for s in sites if s.detected_by == "pattern" and not s.inline}
        self.grad_first: Optional[str] = None
        self.handles: list[Any] = []
        self.backward = False
        self.memo: dict[int, Any] = {}
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post, with_kwargs=True))

    def close(self) -> None:
        """Remove every hook."""
        for h in self.handles:
            h.remove()

    def _pre(self, module, args, kwargs):
        self.stack.append(_Call(self.names.get(id(module), "?"), type(module).__name__,
                                tensor_stats(_leaves(args) + _leaves(kwargs), self.memo)))
        self.fused_index[len(self.stack)] = 0

    def _post(self, module, args, kwargs, output):
        call = self.stack.pop() if self.stack else _Call(self.names.get(id(module), "?"), type(module).__name__,
                                                         TensorStats())
        out = tensor_stats(_leaves(output), self.memo)
        rec = ModuleNumerics(module=call.module, class_name=call.class_name, order=len(self.calls),
                             inputs=call.inputs, output=out)
        self.calls.append(rec)
        if call.module in self.hand_written and args and isinstance(args[0], torch.Tensor):
            site = self.by_key.get((call.module, 0))
            if site is not None:
                stat = row_statistic("", args[0], args, kwargs, site.kind != "RMSNorm", site.reduced_dims)
                self._acc(site).add(stat, call.inputs, out)
        self._classify(rec)
        if self.backward:
            self._grad_hooks(call.module, output)

    def _classify(self, rec: ModuleNumerics) -> None:
        inp, out = rec.inputs, rec.output
        first_nan = self.first_nan is None and out.nan and not inp.nan
        if first_nan:
            self.first_nan = rec.module
        if self.producer is None:
            if out.nonfinite and not inp.nonfinite:
                self.producer = rec
            return
        if first_nan or _is_ancestor(rec.module, self.producer.module):
            return
        if inp.nonfinite and out.nonfinite:
            self.propagator_count += 1
            if len(self.propagators) < MAX_PROPAGATORS:
                self.propagators.append(rec.module)

    def fused_call(self, op: str, args: tuple, kwargs: dict, out: Any) -> None:
        """A fused norm call inside the innermost running module: accumulate its site's statistics."""
        depth = len(self.stack)
        if depth == 0:
            return
        index = self.fused_index.get(depth, 0)
        self.fused_index[depth] = index + 1
        module = self.stack[-1].module
        site = self.by_key.get((module, index)) or self.by_key.get((module, 0))
        if site is None or module in self.hand_written:
            return
        stat = row_statistic(op, args[0], args, kwargs, site.kind != "RMSNorm")
        self._acc(site).add(stat, tensor_stats([args[0]], self.memo), tensor_stats(_leaves(out), self.memo))

    def _acc(self, site) -> _SiteAcc:
        key = (site.module, site.call_index)
        if key not in self.site_acc:
            self.site_acc[key] = _SiteAcc(site)
        return self.site_acc[key]

    def _grad_hooks(self, module: str, output: Any) -> None:
        for t in _leaves(output):
            if t.requires_grad and t.is_floating_point():
                t.register_hook(lambda g, m=module: self._grad(m, g))

    def _grad(self, module: str, g: torch.Tensor) -> None:
        if self.grad_first is None and not bool(torch.isfinite(g).all()):
            self.grad_first = module


def _is_ancestor(path: str, of: str) -> bool:
    return path == "" or of == path or of.startswith(path + ".")


def _own_absmax(m: nn.Module) -> Optional[float]:
    values = [tensor_stats([p]).absmax for p in m.parameters(recurse=False) if p.is_floating_point()]
    values = [v for v in values if v is not None]
    return max(values) if values else None


# ============================================================================================ the real model
def pick_device() -> torch.device:
    """CUDA when available, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def real_model(probe_model: nn.Module, ckpt: Any, build_fn: Any, where: Optional[str]) -> tuple[nn.Module, str, list[str]]:
    """A real float32 CPU copy of the audited model (``probe_model`` is never modified): ``(model, weights,
    notes)`` with ``weights`` ``checkpoint`` or ``random``.

    With a checkpoint (:class:`normaudit.loaders.checkpoint.Checkpoint`), its tensors are copied in by the
    aligned keys (``ckpt.align_keys``) over a materialised copy (:func:`normaudit.probes.common.materialise`);
    without one, the factory ``build_fn`` is called again off the meta device (its own initialisation), or for
    a library model its ``init_weights()`` runs over the materialised copy. Raises UsageError when the factory
    fails on the second call.
    """
    notes: list[str] = []
    is_meta = any(t.is_meta for t in probe_model.parameters())
    if ckpt is None and build_fn is not None and is_meta:
        from pathlib import Path

        from normaudit.loaders.pyfile import BuildMode, _call

        model = _call(build_fn, Path(where or "model.py"), "build_model() failed (numerics probe)", BuildMode(meta=False))
        if not isinstance(model, nn.Module):
            raise UsageError("build_model() returned no torch.nn.Module on its second call (numerics probe)",
                             file=where)
        return model, "random", notes
    model = materialise(probe_model)
    if ckpt is None:
        init = getattr(model, "init_weights", None)
        if is_meta and callable(init):
            with torch.no_grad(), quiet():
                try:
                    init()
                except Exception as exc:  # noqa: BLE001 - keep the generic initialisation
                    notes.append(f"numerics probe: {type(model).__name__}.init_weights() failed ({one_line(exc)}); "
                                 "weights initialised by reset_parameters()")
        return model, "random", notes
    keys = list(model.state_dict().keys())
    mapping, _ = ckpt.align_keys(keys)
    state = model.state_dict()
    loaded = 0
    with torch.no_grad():
        for mk, ck in mapping.items():
            t = ckpt.get(ck)
            if tuple(t.shape) == tuple(state[mk].shape):
                state[mk].copy_(t.to(state[mk].dtype))
                loaded += 1
    if loaded < len(keys):
        notes.append(f"numerics probe: {loaded} of {len(keys)} state_dict entries loaded from the checkpoint; the "
                     "others keep their initial values")
    return model, "checkpoint", notes


def _cast_inputs(inputs: Any, dtype: torch.dtype, device: torch.device) -> Any:
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.to(device)
        return t.to(dtype) if t.is_floating_point() else t

    if isinstance(inputs, dict):
        return {k: one(v) for k, v in inputs.items()}
    return tuple(one(v) for v in inputs)


# ============================================================================================ facts
def site_facts(acc: _SiteAcc, dtype: str) -> SiteNumerics:
    """``SiteNumerics`` (measured fields) from what the forward showed of one site."""
    site = acc.site
    num = site.numerics or SiteNumerics()
    num.measured, num.calls = True, acc.calls
    num.statistic = "mean_square" if site.kind == "RMSNorm" else "variance"
    num.input, num.output = acc.inputs, acc.output
    num.dtype_max = DTYPE_MAX[dtype]
    num.output_absmax = acc.output.absmax if acc.output is not None else None
    if num.output_absmax:
        num.headroom = num.dtype_max / num.output_absmax
    if acc.stats:
        stats = torch.cat(acc.stats)
        finite = stats[torch.isfinite(stats)]
        num.rows = int(stats.numel())
        if finite.numel():
            num.stat_min, num.stat_max = float(finite.min()), float(finite.max())
            num.stat_median = float(finite.median())
        eps = site.eps if site.eps is not None else 0.0
        num.eps_dominated_below = EPS_DOMINATED_FACTOR * eps
        num.eps_dominated_fraction = float((finite < num.eps_dominated_below).sum()) / max(num.rows, 1)
    return num


def producer_cause(p: ModuleNumerics, site: Any, dtype: str) -> tuple[str, str]:
    """Why the producer's output is non-finite (module docstring), from its inputs, weights and, for a norm,
    its eps, statistic and gains: ``(kind, text)``, ``kind`` one of :data:`normaudit.report.CauseKind`
    (``eps_zero``, ``gain_overflow``, ``stat_overflow``, ``overflow``, ``nan``), ``text`` the sentence."""
    top = DTYPE_MAX[dtype]
    num = getattr(site, "numerics", None) if site is not None else None
    if site is not None and num is not None:
        if (site.eps or 0.0) == 0.0 and num.stat_min == 0.0:
            return "eps_zero", (f"a row with {num.statistic} 0 and eps {site.eps if site.eps is not None else 'none'}: "
                                "0/0 = NaN (a constant row, or all zeros)")
        gain = num.gain_absmax
        if p.output.inf and num.output_bound is not None and num.output_bound > top:
            return "gain_overflow", (f"the gains are too large for {dtype}: |gain| up to {gain:.4g} times "
                                     f"sqrt(D={num.features}) can reach {num.output_bound:.4g}, above its maximum {top:g}")
        if site.formula is not None and site.formula.upcast is False and (p.inputs.absmax or 0) ** 2 > top:
            return "stat_overflow", (f"the statistic overflows: inputs up to {p.inputs.absmax:.4g} square past "
                                     f"{dtype}'s maximum {top:g} without an upcast to float32")
    if p.output.inf and not p.output.nan:
        return "overflow", (f"overflow: values past {dtype}'s maximum {top:g} (inputs' abs-max {_g(p.inputs.absmax)}, "
                            f"weights' abs-max {_g(p.weights_absmax)})")
    return "nan", (f"NaN from finite inputs (inputs' abs-max {_g(p.inputs.absmax)}, weights' abs-max "
                   f"{_g(p.weights_absmax)}): 0/0, inf - inf or 0 * inf inside its forward")


def _g(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _model_bounds(model: nn.Module, records: list, dtype: str) -> None:
    """Without a checkpoint bound: the output bound of each LayerNorm/RMSNorm module site from the real
    model's own gain and bias (``bound_source`` ``model``)."""
    modules = dict(model.named_modules())
    for rec in records:
        s = rec.site
        if s.numerics is not None and s.numerics.output_bound is not None:
            continue
        mod = modules.get(s.module)
        if mod is None or s.detected_by not in ("module", "pattern") or s.inline:
            continue
        params = dict(mod.named_parameters(recurse=False))
        gains = [p for n, p in params.items() if p.dim() <= 1 and n in ("weight", "gamma", "scale", "g", "a_2", "gain")]
        biases = [p for n, p in params.items() if p.dim() <= 1 and n in ("bias", "beta", "b", "b_2", "shift")]
        if not gains:
            continue
        g = gains[0].detach().float()
        b = tensor_stats([biases[0]]).absmax if biases else 0.0
        bound_from_values(s, float(g.min()), float(g.max()), b, "model", dtype)


def _run(model: nn.Module, inputs: Any, rec: Recorder, backward: bool, amp: Any) -> tuple[Any, Optional[float]]:
    """One forward (and with ``backward`` one backward of the mean of the first output, in float32), under the
    context ``amp`` (``torch.autocast`` or a null context)."""
    rec.backward = backward
    with quiet(), amp, _NormMode(rec):
        if not backward:
            with torch.no_grad():
                return call_model(model, inputs), None
        out = call_model(model, inputs)
    t = out_tensor(out) if not isinstance(out, dict) else next(iter(_leaves(out)), None)
    if t is None or not t.requires_grad:
        return out, None
    loss = t.float().mean()
    loss.backward()
    return out, float(loss.detach())


def numerics_probe(ctx: Any, records: list, build_fn: Any = None, where: Optional[str] = None,
                   backward: bool = False, autocast: bool = False) -> NumericsReport:
    """Run the numerics probe (module docstring) on ``ctx.probe_model`` with ``ctx.inputs`` in
    ``ctx.dtype``; sets ``site.numerics`` of the measured sites and returns the ``numerics`` section.
    With ``autocast`` (``--probe numerics-autocast``) the weights stay float32 and the run is under
    ``torch.autocast(device, dtype)``, as mixed-precision training runs (matmuls in the dtype, reductions such
    as layer_norm in float32).

    A model that cannot be built or run leaves ``error`` set (and nothing measured) rather than failing the
    audit; a factory that fails on its second call raises UsageError.
    """
    dtype_name = str(ctx.dtype or "float32")
    device = pick_device()
    ckpt = getattr(ctx, "checkpoint", None)
    autocast = autocast and dtype_name != "float32"
    report = NumericsReport(dtype=dtype_name, device=str(device), weights="checkpoint" if ckpt else "random",
                            backward=backward, autocast=autocast)
    cast = torch.float32 if autocast else torch_dtype(dtype_name)
    if ctx.probe_model is None or ctx.inputs is None:
        report.error = "no model or example inputs to run"
        return report
    devices = [torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(NUMERICS_SEED)
        report.seed = NUMERICS_SEED
        return _seeded_probe(ctx, records, build_fn, where, report, device, cast)


def seeded_inputs(build_fn: Any, inputs: Any, where: Optional[str]) -> tuple[Any, bool]:
    """The example inputs made again under the probe's seed: ``example_inputs()`` of the module defining
    ``build_fn`` is called again (as the factory is, :func:`real_model`), so random inputs
    (``torch.randint``/``randn``) are the same on every run. ``(inputs, True)``, or ``(inputs, False)`` with the
    given ones when there is no such function (a library model's inferred inputs). Raises UsageError (file
    ``where``) when the second call fails or returns no tuple/dict."""
    module = sys.modules.get(getattr(build_fn, "__module__", None) or "")
    ex = getattr(module, "example_inputs", None)
    if build_fn is None or not callable(ex):
        return inputs, False
    from pathlib import Path

    from normaudit.loaders.pyfile import BuildMode, _call, as_example_inputs

    again = _call(ex, Path(where or "model.py"), "example_inputs() failed (numerics probe)", BuildMode(meta=False))
    return as_example_inputs(again, where, " on its second call (numerics probe)"), True


def _seeded_probe(ctx: Any, records: list, build_fn: Any, where: Optional[str], report: NumericsReport,
                  device: torch.device, cast: torch.dtype) -> NumericsReport:
    """:func:`numerics_probe` after the seed: build, run, fill ``report``."""
    dtype_name, ckpt, autocast = report.dtype, getattr(ctx, "checkpoint", None), report.autocast
    t0 = time.perf_counter()
    try:
        model, report.weights, notes = real_model(ctx.probe_model, ckpt, build_fn, where)
        report.notes += notes
        model = model.to(device=device, dtype=cast).eval()
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - a probe never fails the audit
        report.error = f"the model could not be built for real: {one_line(exc)}"
        return report
    inputs, report.inputs_seeded = seeded_inputs(build_fn, ctx.inputs, where)
    if ckpt is None:
        _model_bounds(model, records, dtype_name)
    rec = Recorder(model, [r.site for r in records], dtype_name)
    try:
        amp = torch.autocast(device.type, dtype=torch_dtype(dtype_name)) if autocast else contextlib.nullcontext()
        out, report.loss = _run(model, _cast_inputs(inputs, cast, device), rec, report.backward, amp)
        report.output = tensor_stats(_leaves(out))
    except Exception as exc:  # noqa: BLE001
        report.error = f"the forward{'/backward' if report.backward else ''} failed in {dtype_name}: {one_line(exc)}"
    finally:
        rec.close()
    report.seconds = round(time.perf_counter() - t0, 3)
    report.modules = len(rec.names)
    _fill(report, rec, records, model, dtype_name)
    return report


def _fill(report: NumericsReport, rec: Recorder, records: list, model: nn.Module, dtype: str) -> None:
    """Site facts, the producer (with its cause), first NaN, propagators and gradient facts into ``report``."""
    for acc in rec.site_acc.values():
        acc.site.numerics = site_facts(acc, dtype)
    report.sites_measured = len(rec.site_acc)
    by_module = {r.site.module: r.site for r in records if r.site.call_index == 0}
    p = rec.producer
    if p is not None:
        report.before = rec.calls[max(0, p.order - FRAMES_BEFORE):p.order]
        for call in [p, *report.before]:  # weights' abs-max only where reported (a full pass over the weights)
            mod = rec.modules.get(call.module)
            call.weights_absmax = _own_absmax(mod) if mod is not None else None
        p.cause_kind, p.cause = producer_cause(p, by_module.get(p.module), dtype)
        report.producer = p
    report.first_nan, report.propagators, report.propagator_count = rec.first_nan, rec.propagators, rec.propagator_count
    roles = {m: "propagator" for m in rec.propagators}
    if rec.first_nan:
        roles[rec.first_nan] = "first_nan"
    if p is not None:
        roles[p.module] = "producer"
    for r in records:
        if r.site.numerics is not None and r.site.numerics.measured and r.site.module in roles:
            r.site.numerics.role = roles[r.site.module]  # type: ignore[assignment]
    if report.backward:
        report.grad_first_nonfinite = rec.grad_first
        bad = [n for n, q in model.named_parameters() if q.grad is not None and not bool(torch.isfinite(q.grad).all())]
        report.grad_nonfinite_params, report.grad_nonfinite_param_count = bad[:20], len(bad)
    skipped = [r.site.module for r in records if (r.site.module, r.site.call_index) not in rec.site_acc]
    if skipped and not report.error:
        report.notes.append(f"numerics probe: {len(skipped)} site(s) not measured (computed inline in a larger "
                            f"module's forward, or not called): {', '.join(skipped[:5])}"
                            + (" ..." if len(skipped) > 5 else ""))


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``numerics-probe``: :func:`numerics_probe` when ``--probe numerics`` (``numerics-backward``,
    ``numerics-autocast``) asks for it, its section in ``facts.numerics``."""
    asked = [p for p in ctx.probes if p.startswith("numerics")]
    if not asked:
        return
    phase("numerics")
    facts.numerics = numerics_probe(ctx, facts.records, ctx.build_fn, ctx.file,
                                    backward="numerics-backward" in asked, autocast="numerics-autocast" in asked)
