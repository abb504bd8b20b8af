"""**Batch-independence probe** (:func:`batch_probe`, opt-in: ``--probe batch``). Layer normalisation's
central property is that each example is normalised by its own statistics, independent of the other
examples in the batch (Ba, Kiros, Hinton 2016, arXiv 1607.06450, section 3); batch normalisation's
training-mode output depends on them by design (Ioffe & Szegedy 2015, arXiv 1502.03167). The probe makes
it executable: a small real copy of the model (materialised from the meta model, parameters initialised
deterministically; refused above :data:`BATCH_PROBE_MAX_PARAMS` parameters; never on fake tensors) runs in
train mode on a batch of :data:`PROBE_BATCH` twice, example 0 identical and the other examples different,
with the same random seed (so dropout masks agree). A forward pre-hook pins example 0's input of every
site module to its value in the first run, so a change in example 0's output is caused by that site alone.
Facts: ``site.batch_probe`` (:class:`normaudit.report.BatchProbe`), with the measured maximum absolute
change of example 0's output.
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional

import torch

from normaudit.capture import Capture
from normaudit.facts.context import FactContext, Facts
from normaudit.probes.common import axis_dims as _axis_dims, call_model as _call, first_tensor as _first_tensor
from normaudit.probes.common import materialise, one_line as _one_line, out_tensor as _out_tensor
from normaudit.quiet import quiet
from normaudit.report import BatchProbe


BATCH_PROBE_MAX_PARAMS = 50_000_000
PROBE_BATCH = 4


def _batch_dims(cap: Capture) -> dict[str, Optional[int]]:
    out: dict[str, Optional[int]] = {}
    for n in cap.gm.graph.nodes if cap.gm is not None else ():
        if n.op == "placeholder" and n.name in cap.user_inputs:
            dims = _axis_dims(n)
            out[n.name] = next((k for k, d in enumerate(dims or []) if d[0][0] == ("batch",)), None) \
                if isinstance(dims, list) else None
    return out


def _other_rows(row0: torch.Tensor, dim: int, count: int, variant: int) -> torch.Tensor:
    """``count`` examples unlike ``row0``, seeded by ``variant`` (so the two probe batches differ).

    Floats: random with row 0's mean and spread. Integer ids: drawn uniformly within row 0's range
    [min, max], so ids stay in the vocabulary and each example holds other tokens (a roll of row 0 would
    keep the batch's multiset of tokens, and so any statistic pooled over (batch, sequence) right after
    the embedding, unchanged); negative entries (``-100`` labels) are kept. 0/1 masks: row 0 rolled along the last axis, so an all-ones mask stays all
    ones and a padding mask keeps its count of real positions. Booleans and scalars: copies of row 0.
    """
    g = torch.Generator().manual_seed(1000 + variant)
    rows = []
    is_mask = not row0.is_floating_point() and row0.numel() > 0 and bool(((row0 == 0) | (row0 == 1)).all())
    for j in range(count):
        if row0.is_floating_point():
            std = float(row0.float().std()) if row0.numel() > 1 else 1.0
            std = std if math.isfinite(std) and std > 0 else 1.0
            r = torch.randn(row0.shape, generator=g, dtype=torch.float32) * std + float(row0.float().mean())
            rows.append(r.to(row0.dtype))
        elif row0.dtype == torch.bool or row0.dim() == 0 or row0.is_complex():
            rows.append(row0.clone())
        elif is_mask:
            shift = 1 + variant * (count + 1) + j
            rows.append(torch.roll(row0, shifts=shift % max(row0.shape[-1], 1), dims=-1))
        else:
            valid = row0 >= 0                  # negative entries (ignore_index -100 labels) stay as they are
            lo, hi = (int(row0[valid].min()), int(row0[valid].max())) if bool(valid.any()) else (0, 0)
            r = torch.randint(lo, hi + 1, row0.shape, generator=g, dtype=torch.int64).to(row0.dtype)
            rows.append(torch.where(valid, r, row0))
    return torch.cat(rows, dim=dim)


def _probe_batches(inputs: Any, user_inputs: list[str], batch_dims: dict[str, Optional[int]]) -> tuple[Any, Any]:
    """Two batches of :data:`PROBE_BATCH` examples sharing example 0 (the first example of ``inputs``)."""
    def make(name: str, t: Any, variant: int) -> Any:
        d = batch_dims.get(name)
        if not isinstance(t, torch.Tensor) or d is None or d >= t.dim():
            return t
        row0 = t.narrow(d, 0, 1)
        return torch.cat([row0, _other_rows(row0, d, PROBE_BATCH - 1, variant)], dim=d)

    if isinstance(inputs, dict):
        return ({k: make(k, v, 1) for k, v in inputs.items()}, {k: make(k, v, 2) for k, v in inputs.items()})
    names = [user_inputs[i] if i < len(user_inputs) else "" for i in range(len(inputs))]
    return (tuple(make(n, v, 1) for n, v in zip(names, inputs)), tuple(make(n, v, 2) for n, v in zip(names, inputs)))


def batch_probe(ctx: Any, records: list, env: dict) -> list[str]:
    """Run the batch-independence probe (module docstring); sets ``site.batch_probe``; returns notes.

    ``env`` is the axis pass's node -> labels map (the batch axis of each site's input). Never raises: a
    model that cannot be materialised or run leaves the sites unmeasured, with a note.
    """
    cap = ctx.cap
    model = ctx.probe_model
    if model is None or cap.gm is None or ctx.inputs is None:
        return ["batch probe skipped: no capture or no example inputs"]
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > BATCH_PROBE_MAX_PARAMS:
        return [f"batch probe skipped: the model has {n_params / 1e6:.0f}M parameters (limit "
                f"{BATCH_PROBE_MAX_PARAMS // 1_000_000}M); run it on a smaller configuration of the same code"]
    batch_dims = _batch_dims(cap)
    if not any(d is not None for d in batch_dims.values()):
        return ["batch probe skipped: no model input has a batch axis"]
    t0 = time.perf_counter()
    try:
        real = materialise(model)
    except Exception as exc:  # noqa: BLE001
        return [f"batch probe skipped: the model could not be materialised ({_one_line(exc)})"]
    real.train()
    xa, xb = _probe_batches(ctx.inputs, list(cap.user_inputs), batch_dims)
    modules = dict(real.named_modules())
    measured = _measurable(records, env, modules)
    if not measured:
        return ["batch probe: no site could be measured"]
    try:
        record_a, record_b = _run_pair(real, xa, xb, measured, modules)
    except Exception as exc:  # noqa: BLE001
        for rec in records:
            if rec.site.batch_probe is not None and rec.site.batch_probe.note is None:
                rec.site.batch_probe.note = "not measured: the model failed in the probe run"
        return [f"batch probe failed: the model does not run on a real batch of {PROBE_BATCH} in train mode "
                f"({_one_line(exc)})"]
    coupled = _compare(records, measured, record_a, record_b)
    took = time.perf_counter() - t0
    return [f"batch probe: {PROBE_BATCH} examples in train mode, example 0 fixed ({took:.2f} s); "
            f"{coupled} site(s) couple examples"]


def _measurable(records: list, env: dict, modules: dict) -> dict[str, tuple[int, list]]:
    """Give every site a :class:`BatchProbe` (with the reason when it cannot be measured); returns the
    measurable module paths -> (the batch dim of their input, [])."""
    site_paths = {r.site.module for r in records}
    measured: dict[str, tuple[int, list]] = {}   # path -> (batch dim, [per-call site])
    for rec in records:
        s = rec.site
        labels = env.get(rec.input) if rec.input is not None else None
        bd = next((k for k, lab in enumerate(labels) if "batch" in lab), None) if isinstance(labels, list) else None
        note = None
        if not s.module:
            note = "not measured: a norm in the model's own forward"
        elif s.module not in modules:
            note = "not measured: module not found in the copy"
        elif any(p != s.module and p.startswith(s.module + ".") for p in site_paths):
            note = "not measured: the module contains other norms"
        elif bd is None:
            note = "not measured: the site's input has no batch axis"
        s.batch_probe = BatchProbe(batch_size=PROBE_BATCH, note=note)
        if note is None:
            measured.setdefault(s.module, (bd, []))
    return measured


def _make_hooks(path: str, bd: int, record_a: dict, record_b: dict, state: dict):
    """Forward pre/post hooks of one measured module: in phase ``a`` they record each call's input and
    output; in phase ``b`` they pin example 0 of the input (dim ``bd``) to phase ``a``'s and record the
    output."""
    def pre(m, args, kwargs):
        if state["phase"] != "b":
            t = _first_tensor(args, kwargs)
            record_a[path].append([t.detach().clone() if t is not None else None, None])
            return None
        k = len(record_b[path])
        record_b[path].append([None, None])
        ref = record_a[path][k][0] if k < len(record_a[path]) else None
        t = _first_tensor(args, kwargs)
        if ref is None or t is None or t.shape != ref.shape or t.dim() <= bd:
            return None
        pinned = t.clone()
        pinned.narrow(bd, 0, 1).copy_(ref.narrow(bd, 0, 1))
        args = tuple(pinned if a is t else a for a in args)
        kwargs = {key: (pinned if v is t else v) for key, v in kwargs.items()}
        return args, kwargs

    def post(m, args, kwargs, out):
        o = _out_tensor(out)
        rec_list = record_a[path] if state["phase"] != "b" else record_b[path]
        if rec_list:
            rec_list[-1][1] = o.detach().clone() if o is not None else None
        return None

    return pre, post


def _run_pair(real: torch.nn.Module, xa: Any, xb: Any, measured: dict, modules: dict) -> tuple[dict, dict]:
    """Run ``real`` on batch ``xa``, restore its buffers, then on ``xb`` with example 0 pinned, both from the
    same seed; returns the recorded (input, output) pairs per measured path of each run. Raises what the
    model raises; hooks and the global RNG state are restored either way."""
    record_a: dict[str, list] = {p: [] for p in measured}
    record_b: dict[str, list] = {p: [] for p in measured}
    state = {"phase": "a"}
    handles = []
    for path, (bd, _) in measured.items():
        pre, post = _make_hooks(path, bd, record_a, record_b, state)
        handles.append(modules[path].register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(modules[path].register_forward_hook(post, with_kwargs=True))
    buffers = {k: v.detach().clone() for k, v in real.state_dict(keep_vars=True).items()}
    rng = torch.random.get_rng_state()
    try:
        with torch.no_grad(), quiet():
            torch.manual_seed(0)
            _call(real, xa)
            real.load_state_dict(buffers, strict=False)
            state["phase"] = "b"
            torch.manual_seed(0)
            _call(real, xb)
    finally:
        for h in handles:
            h.remove()
        torch.random.set_rng_state(rng)
    return record_a, record_b


def _compare(records: list, measured: dict, record_a: dict, record_b: dict) -> int:
    """Fill each measured site's :class:`BatchProbe` from the change of its example-0 output between the two
    runs (coupled when above 1e-6 of its scale); returns the number of coupled sites."""
    coupled = 0
    for rec in records:
        s = rec.site
        if s.batch_probe is None or s.batch_probe.note is not None or s.module not in measured:
            continue
        bd = measured[s.module][0]
        k = s.call_index
        a = record_a[s.module][k][1] if k < len(record_a[s.module]) else None
        b = record_b[s.module][k][1] if k < len(record_b[s.module]) else None
        if a is None or b is None or a.shape != b.shape or a.dim() <= bd or not a.is_floating_point():
            s.batch_probe.note = "not measured: no comparable tensor output"
            continue
        a0, b0 = a.narrow(bd, 0, 1).double(), b.narrow(bd, 0, 1).double()
        change = float((a0 - b0).abs().max()) if a0.numel() else 0.0
        scale = float(a0.abs().max()) if a0.numel() else 0.0
        tol = 1e-6 * max(1.0, scale)
        s.batch_probe.row0_max_change = change
        s.batch_probe.row0_scale = scale
        s.batch_probe.tolerance = tol
        s.batch_probe.coupled = not (change <= tol)
        coupled += bool(s.batch_probe.coupled)
    return coupled


#: ``torch.manual_seed`` of the probe's materialised weights and random batch: the same numbers on every run
BATCH_PROBE_SEED = 0


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``batch-probe``: :func:`batch_probe` when ``--probe batch`` asks for it, under
    :data:`BATCH_PROBE_SEED` with the caller's RNG state kept (``torch.random.fork_rng``)."""
    if "batch" in ctx.probes and ctx.cap.gm is not None and facts.records:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(BATCH_PROBE_SEED)
            facts.notes += batch_probe(ctx, facts.records, facts.node_axes)
