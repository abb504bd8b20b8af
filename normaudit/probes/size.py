"""Size probe (:func:`size_probe`; on by default for graphs of up to :data:`SIZE_PROBE_MAX_NODES` nodes,
``--probe size`` forces it). The model runs a second time on fake tensors with every spatial or sequence
axis of its inputs (as labelled by :mod:`normaudit.facts.axes`) resized to a size that keeps every stride
in the graph integral (patch sizes, pooling, windows) and differs from every channel/feature count in the
graph, so a ``W == C`` coincidence cannot recur. A symbolically traced graph is re-interpreted node by node
(exact per-node shapes, the failing node named); an exported graph, whose sizes are baked in, is replaced
by an eager run of the fake model with module hooks. A site is *tied to the input size* when a dim it
normalises (LayerNorm/RMSNorm) or keeps per channel (BatchNorm/GroupNorm/InstanceNorm dim 1) changes size,
or when the run fails at that norm only at the new size. Facts: ``site.size_probe``
(:class:`normaudit.report.SizeProbe`).
"""
from __future__ import annotations

import contextlib
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.capture.fake import fake_inputs
from normaudit.facts.context import FactContext, Facts
from normaudit.probes.common import axis_dims as _axis_dims
from normaudit.probes.common import one_line as _one_line
from normaudit.quiet import quiet
from normaudit.report import SizeProbe
from normaudit.vocabulary.graph import owner, shape


SIZE_PROBE_MAX_NODES = 1500
RESIZABLE = ("sequence", "height", "width", "depth")
CHANNELWISE = ("BatchNorm", "GroupNorm", "InstanceNorm")

# ============================================================================================ size probe
@dataclass
class ResizePlan:
    """New sizes for the resizable input axes: ``sizes[(label, old)] = new``; ``text`` for the report."""

    sizes: dict[tuple[str, int], int]
    text: str
    per_input: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # input -> [(dim, new size)]


def _two_adic(n: int) -> int:
    return n & -n if n > 0 else 1


def plan_resize(cap: Capture, records: list) -> Optional[ResizePlan]:
    """Choose new sizes for the inputs' spatial/sequence axes (see the module docstring), or None when no
    input has such an axis.

    For an axis of size ``old`` that takes sizes ``s_i`` somewhere in the graph (after strided convs,
    patching, pooling, windows), the new size is a multiple of ``lcm(old / gcd(old, s_i))`` (and of
    ``min(2-adic part of old, 8)``) above ``old``, so every ``s_i * new / old`` stays an integer, chosen so
    that neither it nor any scaled ``s_i`` equals a channel/feature/head count of the graph.
    """
    gm = cap.gm
    if gm is None:
        return None
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name in cap.user_inputs]
    wanted: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for n in inputs:
        dims = _axis_dims(n)
        if not isinstance(dims, list):
            continue
        for k, d in enumerate(dims):
            if len(d) == 1 and len(d[0][0]) == 1 and d[0][0][0] in RESIZABLE and d[0][1] > 1:
                wanted.setdefault((d[0][0][0], int(d[0][1])), []).append((n.name, k))
    if not wanted:
        return None
    seen: dict[str, set[int]] = {lab: set() for lab, _ in wanted}
    forbidden: set[int] = set()
    for node in gm.graph.nodes:
        dims = _axis_dims(node)
        for tensor_dims in (dims if isinstance(dims, tuple) else (dims,)):
            if not isinstance(tensor_dims, list):
                continue
            for d in tensor_dims:
                for names, size in d:
                    if len(names) == 1 and names[0] in seen and size > 1:
                        seen[names[0]].add(int(size))
                    if set(names) <= {"channel", "feature", "head"} and "unknown" not in names:
                        forbidden.add(int(size))
                if len(d) > 1 or len(d[0][0]) > 1:
                    size = math.prod(p[1] for p in d)
                    if set(n for p in d for n in p[0]) <= {"channel", "feature", "head"}:
                        forbidden.add(int(size))
    for rec in records:
        s = rec.site
        forbidden.update(int(x) for x in (s.normalized_shape or []))
        if s.num_channels:
            forbidden.add(int(s.num_channels))
    sizes: dict[tuple[str, int], int] = {}
    for (lab, old) in wanted:
        g = 1
        for s in seen[lab]:
            if s > 0:
                g = math.lcm(g, old // math.gcd(old, s))
        g = math.lcm(g, min(_two_adic(old), 8))
        if g > old:
            g = old
        scaled_from = sorted(s for s in seen[lab] if s > 0)

        def ok(new: int) -> bool:
            if new in forbidden or new <= 0:
                return False
            for s in scaled_from:
                if (s * new) % old == 0 and (s * new) // old in forbidden and (s * new) // old != s:
                    return False
            return True

        cands = [old + g * k for k in range(1, 13)] + [old - g * k for k in range(1, 13) if old - g * k > 1]
        sizes[(lab, old)] = next((c for c in cands if ok(c)), old + g)
    per_input: dict[str, list[tuple[int, int]]] = {}
    for key, places in wanted.items():
        for name, k in places:
            per_input.setdefault(name, []).append((k, sizes[key]))
    text = ", ".join(f"{lab} {old}->{new}" for (lab, old), new in sorted(sizes.items(), key=lambda kv: _order(kv[0][0])))
    return ResizePlan(sizes=sizes, text=text, per_input=per_input)


def _order(label: str) -> int:
    return RESIZABLE.index(label) if label in RESIZABLE else 99


def _resize_tensor(t: torch.Tensor, dim: int, new: int) -> torch.Tensor:
    """``t`` with dim ``dim`` cropped or tiled (repeating its own values) to ``new``."""
    old = t.shape[dim]
    if new <= old:
        return t.narrow(dim, 0, new).clone()
    reps = -(-new // old)
    return torch.cat([t] * reps, dim=dim).narrow(dim, 0, new).clone()


def resized_inputs(inputs: Any, user_inputs: list[str], plan: ResizePlan) -> Any:
    """The real example ``inputs`` (tuple or dict) with the plan's axes resized (values tiled or cropped,
    so token ids and masks stay valid)."""
    def fix(name: str, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        for dim, new in plan.per_input.get(name, []):
            if dim < t.dim():
                t = _resize_tensor(t, dim, new)
        return t

    if isinstance(inputs, dict):
        return {k: fix(k, v) for k, v in inputs.items()}
    return tuple(fix(user_inputs[i] if i < len(user_inputs) else "", v) for i, v in enumerate(inputs))


def _fake_mode(root: nn.Module):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    for t in itertools.chain(root.parameters(), root.buffers()):
        if isinstance(t, FakeTensor):
            return t.fake_mode
    return FakeTensorMode(allow_non_fake_inputs=True)


class _ShapeRecorder(fx.Interpreter):
    """Re-runs a symbolically traced graph and records each node's output shape (the graph is not touched)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm, garbage_collect_values=True)
        self.shapes: dict[fx.Node, Optional[tuple[int, ...]]] = {}
        self.failed: Optional[tuple[fx.Node, BaseException]] = None

    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except Exception as exc:
            self.failed = (n, exc)
            raise
        if isinstance(result, torch.Tensor):
            self.shapes[n] = tuple(int(s) for s in result.shape)
        return result


@contextlib.contextmanager
def _mode_of(root: nn.Module, eval_mode: bool):
    states = {m: m.training for m in root.modules()}
    if eval_mode:
        root.eval()
    try:
        yield
    finally:
        for m, t in states.items():
            m.training = t


def _dims_of_interest(site) -> list[int]:
    if site.kind in ("LayerNorm", "RMSNorm"):
        return list(site.reduced_dims or [])
    if site.kind in CHANNELWISE:
        # a hand-written GroupNorm keeps its channels where its per-channel affine scales (channels-last: dim -1)
        g = getattr(site, "group_split", None)
        dim = g.channel_dim if g is not None and g.channel_dim else 1
        return [dim] if site.input_shape and len(site.input_shape) > dim else []
    return []


def _site_fact(site, plan: ResizePlan, new_shape: Optional[tuple[int, ...]], error: Optional[str]) -> SizeProbe:
    changed: list[int] = []
    if new_shape is not None and site.input_shape is not None and len(new_shape) == len(site.input_shape):
        changed = [d for d in _dims_of_interest(site) if d < len(new_shape) and new_shape[d] != site.input_shape[d]]
    return SizeProbe(resize=plan.text, input_shape=list(new_shape) if new_shape is not None else None,
                     changed_dims=changed, error=error, tied=bool(changed) or error is not None)


def _failed_at_site(node: fx.Node, rec, modules: dict) -> bool:
    s = rec.site
    if node in rec.nodes or node is rec.output:
        return True
    if node.op == "call_module" and str(node.target) == s.module:
        return True
    mod = modules.get(s.module)
    if s.detected_by == "pattern" and owner(node, modules) == s.module and mod is not None \
            and not any(True for _ in mod.children()):
        return True
    return False


def _probe_symbolic(cap: Capture, records: list, fake_args: tuple, plan: ResizePlan) -> tuple[list[str], int]:
    rec_by_input: dict = {}
    interp = _ShapeRecorder(cap.gm)
    failure: Optional[str] = None
    try:
        interp.run(*fake_args)
    except Exception as exc:  # noqa: BLE001 - a failure is a finding, recorded below
        failure = _one_line(exc)
    tied = 0
    notes: list[str] = []
    failed_node = interp.failed[0] if interp.failed else None
    attributed = False
    for rec in records:
        s = rec.site
        err = None
        if failed_node is not None and _failed_at_site(failed_node, rec, cap.modules):
            err, attributed = failure, True
        new_shape = interp.shapes.get(rec.input) if rec.input is not None else None
        s.size_probe = _site_fact(s, plan, new_shape, err)
        tied += s.size_probe.tied
        rec_by_input[id(rec)] = new_shape
    if failed_node is not None and not attributed:
        where = owner(failed_node, cap.modules) or "the model's forward"
        notes.append(f"size probe: at {plan.text} the model fails at {where} ({failed_node.format_node()}), "
                     f"not at a norm: {failure}; later sites not measured")
    return notes, tied


_FUSED = ("layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "local_response_norm")
_REDUCE = ("mean", "var", "std", "var_mean", "std_mean", "sum", "norm", "linalg_vector_norm", "amax")


@dataclass
class _EagerRun:
    """What one eager run on fake tensors saw: per module path, the fused norm calls and reductions made
    directly in its forward (name, input shape), in order; and where it failed."""

    calls: dict[str, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    failed_module: Optional[str] = None
    failed_in_norm: bool = False
    error: Optional[BaseException] = None


def _run_eager(root: nn.Module, fake_args: Any) -> _EagerRun:
    """Run ``root`` (fake) once, with module hooks keeping the stack of active modules and a
    ``TorchFunctionMode`` recording each fused norm call and reduction with the innermost active module."""
    from torch.overrides import TorchFunctionMode

    run = _EagerRun()
    stack: list[str] = []
    handles = []
    for path, mod in root.named_modules():
        def pre(m, args, kwargs, _p=path):
            stack.append(_p)

        def post(m, args, kwargs, out, _p=path):
            if stack and stack[-1] == _p:
                stack.pop()

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in _FUSED or name in _REDUCE:
                t = args[0] if args and isinstance(args[0], torch.Tensor) else None
                if t is not None:
                    run.calls.setdefault(stack[-1] if stack else "", []).append(
                        (name, tuple(int(x) for x in t.shape)))
                if name in _FUSED:
                    try:
                        return func(*args, **kwargs)
                    except Exception:
                        run.failed_in_norm = True
                        raise
            return func(*args, **kwargs)

    try:
        args, kwargs = ((), dict(fake_args)) if isinstance(fake_args, dict) else (tuple(fake_args), {})
        if getattr(getattr(root, "config", None), "use_cache", None) is not None:
            kwargs.setdefault("use_cache", False)
        with Recorder():
            root(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - recorded
        run.failed_module, run.error = (stack[-1] if stack else ""), exc
    finally:
        for h in handles:
            h.remove()
    return run


def _site_call(rec, run: _EagerRun, order: dict[int, int], old: Optional[_EagerRun]) -> Optional[int]:
    """Index, in ``run.calls[site.module]``, of the call that computes this site: the k-th fused norm call
    for a fused site; for a hand-written one the k-th reduction whose input had the site's statistic input
    shape in the run at the captured size (``old``)."""
    s = rec.site
    k = order[id(rec)]
    ref = old if old is not None else run
    calls = ref.calls.get(s.module, [])
    if s.detected_by in ("module", "functional"):
        idx = [i for i, (name, _) in enumerate(calls) if name in _FUSED]
    else:
        src = rec.stat.args[0] if rec.stat is not None and rec.stat.args else rec.input
        want = shape(src) if src is not None else None
        idx = [i for i, (name, shp) in enumerate(calls) if name in _REDUCE and want is not None and shp == want]
    return idx[k] if k < len(idx) else None


def _probe_eager(cap: Capture, records: list, old_args: Any, new_args: Any, plan: ResizePlan) -> tuple[list[str], int]:
    """Eager runs on fake tensors. Fused sites are matched by the order of fused norm calls in their module;
    hand-written ones need a run at the captured size too (to find their reduction among the module's), so
    that run is made only when there are some. (Non-strict export ran the same Python code eagerly at the
    captured size, so that size is known to work.)"""
    old: Optional[_EagerRun] = None
    if any(r.site.detected_by not in ("module", "functional") for r in records):
        old = _run_eager(cap.root, old_args)
        if old.error is not None:
            for rec in records:
                rec.site.size_probe = None
            return [f"size probe skipped: the model does not run eagerly on fake tensors at the captured size "
                    f"({_one_line(old.error)})"], 0
    new = _run_eager(cap.root, new_args)
    order: dict[int, int] = {}
    counters: dict[tuple[str, bool], int] = {}
    for rec in records:
        key = (rec.site.module, rec.site.detected_by in ("module", "functional"))
        order[id(rec)] = counters.get(key, 0)
        counters[key] = order[id(rec)] + 1
    notes: list[str] = []
    tied = 0
    attributed = False
    for rec in records:
        s = rec.site
        mod = cap.modules.get(s.module)
        i = _site_call(rec, new, order, old)
        new_calls = new.calls.get(s.module, [])
        new_shape = None
        ref_calls = (old or new).calls.get(s.module, [])
        if i is not None and i < len(new_calls) and i < len(ref_calls) and new_calls[i][0] == ref_calls[i][0]:
            new_shape = new_calls[i][1]
            if s.detected_by == "pattern" and rec.input is not None and shape(rec.input) is not None \
                    and len(new_shape) != len(shape(rec.input)):
                new_shape = None
        err = None
        reached = i is not None and i < len(new_calls)
        if new.error is not None and new.failed_module == s.module and (
                (new.failed_in_norm and reached and i == len(new_calls) - 1)
                or (s.detected_by == "pattern" and mod is not None and not any(True for _ in mod.children())
                    and (reached or not new_calls))):
            if not (attributed and s.detected_by == "pattern"):
                err, attributed = _one_line(new.error), True
        s.size_probe = _site_fact(s, plan, new_shape, err)
        tied += s.size_probe.tied
    if new.error is not None and not attributed:
        notes.append(f"size probe: at {plan.text} the model fails at {new.failed_module or 'its own forward'}, "
                     f"not at a norm: {_one_line(new.error)}; later sites not measured")
    return notes, tied


def size_probe(ctx: Any, records: list) -> list[str]:
    """Run the size probe (module docstring) and set ``site.size_probe`` on ``records``; returns notes.

    ``ctx`` is a :class:`normaudit.facts.FactContext` (reads ``cap``, ``inputs``, ``dtype``).
    The models and graph are not modified (train/eval flags are restored). Never raises.
    """
    cap = ctx.cap
    if cap.gm is None or ctx.inputs is None:
        return []
    plan = plan_resize(cap, records)
    if plan is None:
        return []
    t0 = time.perf_counter()
    dtype = getattr(torch, ctx.dtype or "float32")
    try:
        mode = _fake_mode(cap.root)
        new_real = resized_inputs(ctx.inputs, list(cap.user_inputs), plan)
        with _mode_of(cap.root, cap.eval_fallback), quiet():
            new_fake = fake_inputs(new_real, mode, dtype)
            with mode:
                if cap.method == "symbolic_trace" and not isinstance(new_fake, dict):
                    notes, tied = _probe_symbolic(cap, records, new_fake, plan)
                else:
                    old_fake = fake_inputs(ctx.inputs, mode, dtype)
                    notes, tied = _probe_eager(cap, records, old_fake, new_fake, plan)
    except Exception as exc:  # noqa: BLE001 - a probe never fails the audit
        for rec in records:
            rec.site.size_probe = None
        return [f"size probe failed ({_one_line(exc)}); no size facts"]
    took = time.perf_counter() - t0
    head = (f"size probe: re-ran the model with {plan.text} ({'graph re-interpreted' if cap.method == 'symbolic_trace' and not isinstance(ctx.inputs, dict) else 'eager run on fake tensors'}, "
            f"{took:.2f} s); {tied} of {len(records)} site(s) tied to the input size")
    return [head] + notes


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``size-probe``: :func:`size_probe` when ``--probe size`` asks for it or by default on a graph of at
    most :data:`SIZE_PROBE_MAX_NODES` nodes (``ctx.graph_nodes``, the full graph's count under
    depth-independent capture, else the captured graph's); otherwise a note says it was skipped."""
    if ctx.cap.gm is None or not facts.records:
        return
    n_nodes = ctx.graph_nodes if ctx.graph_nodes is not None else len(ctx.cap.gm.graph.nodes)
    if "size" in ctx.probes or n_nodes <= SIZE_PROBE_MAX_NODES:
        facts.notes += size_probe(ctx, facts.records)
    else:
        facts.notes.append(f"size probe skipped: the graph has {n_nodes} nodes (default limit "
                           f"{SIZE_PROBE_MAX_NODES}); '--probe size' runs it")
