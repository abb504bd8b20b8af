"""The capture methods: ``torch.fx`` symbolic tracing with shapes from ``ShapeProp`` on fake tensors, and
``torch.export.export(strict=False)``, with the retries export gets (example inputs and integer factories as
constants)."""
from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp

from normaudit.capture.constants import BufferConstants, LiftedFactories, buffers_as_constants
from normaudit.capture.fake import constant_inputs, constant_propagation, meta_val, no_value_checks


def tensor_leaves(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensor_leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensor_leaves(v)]
    if hasattr(obj, "to_tuple") and callable(obj.to_tuple):  # transformers ModelOutput
        return tensor_leaves(obj.to_tuple())
    return []


class Flatten(nn.Module):
    """Wraps the model so export sees only tensors in the output (HF outputs carry caches).

    ``fixed`` holds example inputs passed as constants rather than graph inputs (``{position or keyword:
    real tensor}``). Each is re-made inside the traced forward from its values (``torch.tensor(values)``,
    a lift), so under :func:`constant_propagation` the fake tensor of every integer computation on it
    carries its real value: a forward that turns them into Python numbers (``grid_thw`` -> ``cu_seqlens``
    -> ``lengths.tolist()`` split sizes, image-token counts, ``len(set(ids))``) specialises on them instead
    of failing on a data-dependent size. The free positional inputs fill the other positions, in order."""

    def __init__(self, model: nn.Module, fixed: Optional[dict[Any, torch.Tensor]] = None,
                 buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None, lift: bool = False):
        super().__init__()
        self.m = model
        self.fixed = {k: (t.tolist(), t.dtype) for k, t in (fixed or {}).items()}
        self.consts = BufferConstants(buffers or {})
        self.lift = lift or bool(self.fixed) or bool(self.consts.values)  # factories made constants

    def forward(self, *args, **kwargs):
        if not self.lift:
            return tuple(tensor_leaves(self.m(*args, **kwargs)))
        self.consts(self.m)
        lifted = {k: torch.tensor(values, dtype=dtype) for k, (values, dtype) in self.fixed.items()}
        free = iter(args)
        n = len(args) + sum(isinstance(k, int) for k in lifted)
        args = tuple(lifted[i] if i in lifted else next(free) for i in range(n))
        kwargs = {**{k: v for k, v in lifted.items() if isinstance(k, str)}, **kwargs}
        with LiftedFactories():
            return tuple(tensor_leaves(self.m(*args, **kwargs)))


class _LeafTracer(fx.Tracer):
    """Symbolic tracer that records module stacks and keeps only childless torch.nn modules as leaves
    (plus MultiheadAttention), so composite torch.nn modules such as TransformerEncoderLayer are traced into."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, nn.MultiheadAttention):
            return True
        return super().is_leaf_module(m, module_qualified_name) and not any(True for _ in m.children())


def symbolic_trace_graph(model: nn.Module, args: tuple, mode: FakeTensorMode) -> tuple[fx.GraphModule, list[str]]:
    tracer = _LeafTracer()
    tracer.record_stack_traces = True  # call lines of functional norms and of module calls
    graph = tracer.trace(model)
    gm = fx.GraphModule(tracer.root, graph)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) < len(args):
        raise RuntimeError("more example inputs than forward() parameters")
    with mode:
        ShapeProp(gm).propagate(*args)
    for n in gm.graph.nodes:
        tm = n.meta.get("tensor_meta")
        if "val" not in n.meta and tm is not None:
            n.meta["val"] = meta_val(tm, mode)
    return gm, [p.name for p in placeholders[: len(args)]]


def export_graph(model: nn.Module, args: Any, mode: FakeTensorMode, kwargs: Optional[dict[str, Any]] = None,
            fixed: Optional[dict[Any, torch.Tensor]] = None,
            buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None,
            lift: bool = False) -> tuple[fx.GraphModule, list[str]]:
    """``torch.export.export(strict=False)`` of ``model`` on fake ``args``/``kwargs``; returns the graph
    module and the placeholder names of the user inputs. ``fixed`` (:class:`Flatten`): inputs passed as
    constants, left out of ``args``/``kwargs`` here; their lifted-constant placeholders count as user inputs
    (activations, not parameters). ``buffers`` (:func:`integer_buffers`): integer buffers passed as
    constants (:class:`BufferConstants`). ``lift``: integer factories are constants even without either
    (:class:`LiftedFactories`)."""
    from normaudit.loaders.inputs import forward_kwargs, forward_params

    fixed = dict(fixed or {})
    kwargs = dict(kwargs or {})
    if isinstance(args, dict):
        kwargs, args = {**dict(args), **kwargs}, ()
    args = tuple(a for i, a in enumerate(args) if i not in fixed)
    kwargs = {k: v for k, v in kwargs.items() if k not in fixed}
    for key, value in forward_kwargs(forward_params(model)).items():  # use_cache=False: no cache objects
        kwargs.setdefault(key, value)
    injected = "use_cache" not in kwargs and getattr(getattr(model, "config", None), "use_cache", None) is not None
    if injected:  # a forward taking **kwargs may hand them to a cache-building child
        kwargs["use_cache"] = False
    try:
        ep = export_flat(model, args, kwargs, mode, fixed, buffers, lift)
    except TypeError as exc:  # that forward passes its own use_cache to the child besides **kwargs (Mimi)
        if not injected or "multiple values for keyword argument 'use_cache'" not in str(exc):
            raise
        ep = export_flat(model, args, {k: v for k, v in kwargs.items() if k != "use_cache"}, mode, fixed,
                          buffers, lift)
    from torch.export.graph_signature import InputKind

    def is_input(spec: Any) -> bool:  # a constant lifted by Flatten itself (no module path): a fixed input;
        # one lifted inside the model (``m.lifted_tensor_3``: a factory made constant) is not
        return spec.kind == InputKind.USER_INPUT or (
            bool(fixed) and spec.kind == InputKind.CONSTANT_TENSOR and "." not in str(spec.target))

    user = [s.arg.name for s in ep.graph_signature.input_specs if is_input(s) and hasattr(s.arg, "name")]
    from normaudit.capture.hop import inline_wrapped_regions

    inline_wrapped_regions(ep.graph_module)  # no_grad/autocast bodies: their norms are sites too
    return ep.graph_module, user


def export_flat(model: nn.Module, args: tuple, kwargs: dict[str, Any], mode: FakeTensorMode,
                 fixed: dict[Any, torch.Tensor], buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None,
                 lift: bool = False) -> Any:
    """``torch.export.export(strict=False)`` of :class:`Flatten` around ``model`` under ``mode``, with the
    example's integer inputs ``fixed`` and the integer ``buffers`` as constants (:func:`constant_propagation`)
    when there are any, and integer factories as constants then or with ``lift``."""
    buffers = buffers or {}
    constants = bool(fixed) or bool(buffers) or lift
    with mode, no_value_checks(), (constant_propagation() if constants else contextlib.nullcontext()), \
            buffers_as_constants(model, buffers):
        return torch.export.export(Flatten(model, fixed, buffers, lift), args, kwargs, strict=False)


def attempt_label(method: str, fixed: dict, consts: dict, lift: bool = False) -> str:
    """The attempt's name: the method, and what it passed as constants."""
    if lift and not fixed and not consts:
        return f"{method} (integer factories as constants)"
    if fixed and consts:
        return f"{method} (integer inputs and buffers as constants)"
    if fixed or consts:
        return f"{method} (integer {'inputs' if fixed else 'buffers'} as constants)"
    return method


def attempt_plan(methods: tuple[str, ...], fake_args: Any, inputs: Any,
          buffers: dict[str, dict[str, torch.Tensor]]) -> list[tuple[str, dict, dict, bool]]:
    """The capture attempts of one pass: ``(method, constant inputs, constant buffers, lift)``;
    ``symbolic_trace`` only for positional inputs; ``export``; then the retries of :func:`export_retries`
    (``lift`` true), run only after a data-dependent failure of that export."""
    plan: list[tuple[str, dict, dict, bool]] = []
    for method in methods:
        if method == "symbolic_trace" and isinstance(fake_args, dict):
            continue
        plan.append((method, {}, {}, False))
        if method == "export":
            plan += export_retries(constant_inputs(fake_args, inputs), buffers)
    return plan


def export_retries(fixed: dict[Any, torch.Tensor],
                   buffers: dict[str, dict[str, torch.Tensor]]) -> list[tuple[str, dict, dict, bool]]:
    """The exports to retry after a data-dependent failure, as ``(method, constant inputs, constant buffers,
    True)``: with the example's real integer inputs ``fixed`` as constants (:func:`constant_inputs`) when it
    has some, with those and the model's integer ``buffers`` (:func:`integer_buffers`) when it has some, else
    with integer factories alone as constants (:class:`LiftedFactories`: a length vector from
    ``x.new_ones(B, dtype=torch.long)`` compared with a size, PE-AV's ``modeling_pe_audio_video.py:182``)."""
    retries = []
    if fixed:
        retries.append(("export", fixed, {}, True))
    if buffers:
        retries.append(("export", fixed, buffers, True))
    return retries or [("export", {}, {}, True)]
