"""Graph capture: a ``torch.fx.GraphModule`` whose nodes carry shapes, on fake tensors.

Methods, in order: ``torch.fx`` symbolic tracing (keeps ``call_module`` nodes; shapes from ``ShapeProp``
under a ``FakeTensorMode``), then ``torch.export.export(strict=False)`` (aten-level, ``nn_module_stack``
on every node). A model built on the meta device is materialised under ``FakeTensorMode`` with
``to_empty(device="cpu")`` first, so no weight memory is allocated. When every method fails in the model's
own mode (e.g. BatchNorm in train mode with one value per channel), the methods are retried in eval mode.
When nothing captures, :func:`capture_model` returns ``gm=None`` and the caller falls back to walking
``named_modules()``.
"""
from __future__ import annotations

import contextlib
import copy
import io
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.shape_prop import ShapeProp

from normaudit.report import CaptureAttempt
from normaudit.vocabulary.kinds import norm_modules


@dataclass
class Capture:
    """The captured graph and how it was obtained.

    ``user_inputs`` names the placeholders that are model inputs (not parameters or buffers), in order;
    ``modules`` maps every ``named_modules()`` path to its module (fake tensors inside).
    """

    gm: Optional[fx.GraphModule]
    method: str
    attempts: list[CaptureAttempt]
    root: nn.Module
    modules: dict[str, nn.Module]
    user_inputs: list[str] = field(default_factory=list)
    eval_fallback: bool = False
    train_error: Optional[str] = None
    #: the parts captured alone (``normaudit.capture.parts.PartCapture``): when the whole model failed, its
    #: parts; else towers the whole-model forward never called, on inputs of their own; and what stopped the
    #: eager forward that recorded the parts' inputs
    parts: list = field(default_factory=list)
    parts_error: Optional[str] = None
    #: the integer and bool buffers' values (:func:`integer_buffers`), for the parts' captures
    buffer_values: dict = field(default_factory=dict)
    #: a part captured on the inputs the model's forward gave it (hidden states, not the model's inputs): their
    #: layout is not read off their rank (:func:`normaudit.facts.axes.input_labels`)
    inputs_recorded: bool = False

    @property
    def complete(self) -> bool:
        return self.gm is not None


def _root_cause(exc: BaseException) -> BaseException:
    """The original exception behind wrappers (ShapeProp and export re-raise with ``from``)."""
    seen = 0
    while exc.__cause__ is not None and seen < 10:
        exc, seen = exc.__cause__, seen + 1
    return exc


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, at most about 300 characters: a longer message keeps its start and its
    end (a message that begins with a module's repr says what went wrong at the end)."""
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:150] + " ... " + text[-145:]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _tensor_leaves(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensor_leaves(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensor_leaves(v)]
    if hasattr(obj, "to_tuple") and callable(obj.to_tuple):  # transformers ModelOutput
        return _tensor_leaves(obj.to_tuple())
    return []


class _Flatten(nn.Module):
    """Wraps the model so export sees only tensors in the output (HF outputs carry caches).

    ``fixed`` holds example inputs passed as constants rather than graph inputs (``{position or keyword:
    real tensor}``). Each is re-made inside the traced forward from its values (``torch.tensor(values)``,
    a lift), so under :func:`_constant_propagation` the fake tensor of every integer computation on it
    carries its real value: a forward that turns them into Python numbers (``grid_thw`` -> ``cu_seqlens``
    -> ``lengths.tolist()`` split sizes, image-token counts, ``len(set(ids))``) specialises on them instead
    of failing on a data-dependent size. The free positional inputs fill the other positions, in order."""

    def __init__(self, model: nn.Module, fixed: Optional[dict[Any, torch.Tensor]] = None,
                 buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None, lift: bool = False):
        super().__init__()
        self.m = model
        self.fixed = {k: (t.tolist(), t.dtype) for k, t in (fixed or {}).items()}
        self.consts = _BufferConstants(buffers or {})
        self.lift = lift or bool(self.fixed) or bool(self.consts.values)  # factories made constants

    def forward(self, *args, **kwargs):
        if not self.lift:
            return tuple(_tensor_leaves(self.m(*args, **kwargs)))
        self.consts(self.m)
        lifted = {k: torch.tensor(values, dtype=dtype) for k, (values, dtype) in self.fixed.items()}
        free = iter(args)
        n = len(args) + sum(isinstance(k, int) for k in lifted)
        args = tuple(lifted[i] if i in lifted else next(free) for i in range(n))
        kwargs = {**{k: v for k, v in lifted.items() if isinstance(k, str)}, **kwargs}
        with _LiftedFactories():
            return tuple(_tensor_leaves(self.m(*args, **kwargs)))


class _BufferConstants(nn.Module):
    """The model's integer and bool buffers as constants (:func:`integer_buffers`, ``{module path: {name: real
    tensor}}``): called inside the traced forward, it sets each one, re-made from its values
    (``torch.tensor(values)``, a lift), as a plain attribute of its module, whose registered buffer
    :func:`_buffers_as_constants` has taken out meanwhile. A forward that reads a buffer as a size (Mimi's
    and EnCodec's ``padding_total``/``stride``/``kernel_size`` in ``F.pad``) then specialises on its value
    instead of failing on a data-dependent guard. Being a child module of :class:`_Flatten`, its lifted
    constants are named ``consts.lifted_tensor_N``: not model inputs."""

    def __init__(self, values: dict[str, dict[str, torch.Tensor]]):
        super().__init__()
        self.values = {path: {name: (t.tolist(), t.dtype) for name, t in named.items()}
                       for path, named in values.items() if named}

    def forward(self, model: nn.Module) -> None:
        for path, named in self.values.items():
            mod = model.get_submodule(path)
            for name, (values, dtype) in named.items():
                object.__setattr__(mod, name, torch.tensor(values, dtype=dtype))


@contextlib.contextmanager
def _buffers_as_constants(model: nn.Module, buffers: dict[str, dict[str, torch.Tensor]]):
    """Take the registered buffers named in ``buffers`` out of their modules meanwhile (export lifts every
    registered buffer as a fake graph input, whose values are unknown), for :class:`_BufferConstants` to
    set as constants; afterwards each module's buffers are as before, in their order, and the plain
    attributes are gone."""
    saved = []
    try:
        for path, named in buffers.items():
            mod = model.get_submodule(path)
            saved.append((mod, dict(mod._buffers)))
            for name in named:
                mod._buffers.pop(name, None)
        yield
    finally:
        for mod, table in saved:
            for name in table:
                mod.__dict__.pop(name, None)
            mod._buffers.clear()
            mod._buffers.update(table)


def _is_value_buffer(t: Any) -> bool:
    """An integer or bool buffer small enough to be a constant (counts, strides, paddings, positions)."""
    return (isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()
            and t.numel() <= CONSTANT_PROPAGATION_LIMIT)


def integer_buffers(model: nn.Module, on_meta: bool) -> dict[str, dict[str, torch.Tensor]]:
    """The values of the integer and bool buffers of ``model`` (``{module path: {name: real CPU tensor}}``),
    for the retry of export that passes them as constants (:class:`_BufferConstants`).

    A real buffer gives its own value (cloned). A buffer on the meta device (a model built under
    ``torch.device("meta")``) has none: for a Hugging Face model its value is what the library itself gives
    a non-persistent buffer after building on meta (``PreTrainedModel._initialize_missing_keys`` moves it
    off meta and runs ``_init_weights`` on its module): the ``_init_weights`` of the nearest enclosing
    ``PreTrainedModel`` is run on the module with the buffer made real, twice, from two different fills;
    a value that depends on the fill (not set by ``_init_weights``) stays unknown. Fake buffers and those
    above :data:`CONSTANT_PROPAGATION_LIMIT` elements are left out. Never raises."""
    from torch._subclasses.fake_tensor import FakeTensor

    out: dict[str, dict[str, torch.Tensor]] = {}
    owners: dict[str, Any] = {}
    for path, mod in model.named_modules():
        if callable(getattr(mod, "_init_weights", None)) and getattr(mod, "config", None) is not None:
            owners[path] = mod
        names = [n for n, t in mod._buffers.items() if _is_value_buffer(t) and not isinstance(t, FakeTensor)]
        real = {n: mod._buffers[n].detach().clone().cpu() for n in names if mod._buffers[n].device.type != "meta"}
        meta = [n for n in names if n not in real]
        if meta and on_meta:
            owner = next((owners[p] for p in sorted(owners, key=len, reverse=True)
                          if p == "" or path == p or path.startswith(p + ".")), None)
            real.update(_initialised_values(owner, mod, meta) if owner is not None else {})
        if real:
            out[path] = real
    return out


def _initialised_values(owner: nn.Module, mod: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """``owner._init_weights(mod)`` run with the meta buffers ``names`` of ``mod`` made real, once filled with
    0 and once with 1: the values of the buffers it set (the same in both runs); the meta buffers are put
    back. The module's meta parameters are initialised on meta (no storage)."""
    saved = dict(mod._buffers)
    runs = []
    try:
        for fill in (0, 1):
            for n in names:
                t = saved[n]
                mod._buffers[n] = torch.full(tuple(t.shape), fill, dtype=t.dtype, device="cpu")
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                owner._init_weights(mod)
            runs.append({n: mod._buffers[n] for n in names})
    except Exception:  # noqa: BLE001 - an init that cannot run here: the values stay unknown
        return {}
    finally:
        mod._buffers.clear()
        mod._buffers.update(saved)
    return {n: runs[0][n].detach().clone() for n in names
            if isinstance(runs[0][n], torch.Tensor) and runs[0][n].device.type == "cpu"
            and torch.equal(runs[0][n], runs[1][n])}


class _LiftedFactories(torch.overrides.TorchFunctionMode):
    """While the example's integer inputs are constants (:class:`_Flatten`): a deterministic factory
    called with Python numbers only (``torch.arange(grid_t * grid_h * grid_w)``, ``torch.zeros(3, n)``)
    returns a constant too, its value computed for real and lifted (``torch.tensor(values)``), so that
    index arithmetic mixing it with the constant inputs (window indices, position ids from ``grid_thw``)
    stays constant up to the ``.tolist()`` that reads it. Factories of more than
    :data:`CONSTANT_PROPAGATION_LIMIT` elements, on another device or taking symbolic sizes stay fake."""

    FACTORIES = frozenset({torch.arange, torch.zeros, torch.ones, torch.full, torch.eye, torch.linspace})
    #: ``x.new_ones(n, dtype=torch.long)`` and its kin, made constant where the result is integer or bool
    #: (lengths, counts: ``x.shape[1] * x.new_ones(B, dtype=torch.long)``, PE-AV's audio/video alignment);
    #: the tensor they are called on gives only dtype and device
    NEW_METHODS = {torch.Tensor.new_ones: torch.ones, torch.Tensor.new_zeros: torch.zeros,
                   torch.Tensor.new_full: torch.full}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.tensor and args and isinstance(args[0], (list, tuple)):
            # a list holding one-element tensors (``[0, n % w, ...]`` from a constant's rows): torch.tensor
            # reads their storage directly, which a fake tensor has not; their .item() is the value (a
            # Python number for a constant, an unbacked symbol otherwise)
            return func(self._items(args[0]), *args[1:], **kwargs)
        if func in self.NEW_METHODS and args and isinstance(args[0], torch.Tensor):
            return self._new(func, args, kwargs)
        if func not in self.FACTORIES or not self._plain(args, kwargs):
            return func(*args, **kwargs)
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():  # out of the fake mode and the export tracer: real numbers
            real = func(*args, **{**kwargs, "device": "cpu"})
        if real.numel() > CONSTANT_PROPAGATION_LIMIT or real.requires_grad:
            return func(*args, **kwargs)
        return torch.tensor(real.tolist(), dtype=real.dtype)

    def _new(self, func, args: tuple, kwargs: dict) -> Any:
        """``self.new_*(size, ...)`` as the matching factory (:data:`NEW_METHODS`) with ``self``'s dtype and
        device unless given, lifted like one where its dtype is integer or bool."""
        base = args[0]
        dtype = kwargs.get("dtype") or base.dtype
        if dtype.is_floating_point or dtype.is_complex or base.device.type not in ("cpu", "meta"):
            return func(*args, **kwargs)
        rest = {k: v for k, v in kwargs.items() if k not in ("dtype", "device")}
        return self.__torch_function__(self.NEW_METHODS[func], (), args[1:], {**rest, "dtype": dtype})

    @classmethod
    def _items(cls, data: Any) -> Any:
        if isinstance(data, torch.Tensor) and data.numel() == 1:
            return data.item()
        if isinstance(data, (list, tuple)):
            return type(data)(cls._items(x) for x in data)
        return data

    @staticmethod
    def _plain(args: tuple, kwargs: dict) -> bool:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type != "cpu":
            return False
        values = list(args) + [v for k, v in kwargs.items() if k not in ("dtype", "device", "layout")]
        flat = [x for v in values for x in (v if isinstance(v, (tuple, list, torch.Size)) else (v,))]
        return all(type(x) in (int, float, bool) for x in flat) and "out" not in kwargs


#: the largest tensor (elements) whose real value fake tensors and the export tracer carry along while
#: the example's integer inputs are constants (torch's default is 1: only scalars)
CONSTANT_PROPAGATION_LIMIT = 1 << 20


@contextlib.contextmanager
def no_value_checks():
    """Turn off ``torch.distributions`` argument validation meanwhile (restored after): a
    ``Categorical(logits=x)`` checks the *values* of ``x`` (``constraint.check(value).all()``), a branch on
    data that no capture on fake tensors can take (BLT's entropy patcher), and which the computation does not
    depend on."""
    from torch.distributions import Distribution

    old = Distribution._validate_args
    Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        Distribution.set_default_validate_args(old)


@contextlib.contextmanager
def _constant_propagation(limit: int = CONSTANT_PROPAGATION_LIMIT):
    """Raise torch's limit on constant propagation (``CONSTANT_NUMEL_LIMIT`` of ``FakeTensorMode`` and of
    the ``make_fx`` proxy tracer) to ``limit`` elements meanwhile: an op whose inputs are all constants
    (tensors lifted from Python values, :class:`_Flatten`) is computed for real and its result stays a
    constant, so ``.tolist()``/``.item()`` on it give Python numbers, not unbacked symbols. Only
    constants are computed: parameters and the other inputs stay fake."""
    import torch._subclasses.fake_tensor as fake_tensor
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    old = fake_tensor.CONSTANT_NUMEL_LIMIT, proxy_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = proxy_tensor.CONSTANT_NUMEL_LIMIT = max(limit, max(old))
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT, proxy_tensor.CONSTANT_NUMEL_LIMIT = old


def constant_inputs(fake_args: Any, real_inputs: Any) -> dict[Any, torch.Tensor]:
    """The example inputs to pass as constants on a retry of export after a data-dependent failure: every
    real (not fake, CPU) integer or bool tensor of ``real_inputs`` (ids, grids, lengths, masks), keyed by
    keyword or position like ``fake_args``."""
    from torch._subclasses.fake_tensor import FakeTensor

    def ok(t: Any) -> bool:
        return (isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and t.device.type == "cpu"
                and not t.is_floating_point() and not t.is_complex())

    if isinstance(fake_args, dict) and isinstance(real_inputs, dict):
        return {k: real_inputs[k] for k in fake_args if ok(real_inputs.get(k))}
    if isinstance(fake_args, (tuple, list)) and isinstance(real_inputs, (tuple, list)):
        return {i: t for i, t in enumerate(real_inputs) if i < len(fake_args) and ok(t)}
    return {}


def data_dependent(error: str) -> bool:
    """Whether a capture failed on a data-dependent size or value (an unbacked symbol of export)."""
    return any(s in error for s in ("GuardOnDataDependentSymNode", "data-dependent", "unbacked"))


class _LeafTracer(fx.Tracer):
    """Symbolic tracer that records module stacks and keeps only childless torch.nn modules as leaves
    (plus MultiheadAttention), so composite torch.nn modules such as TransformerEncoderLayer are traced into."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, nn.MultiheadAttention):
            return True
        return super().is_leaf_module(m, module_qualified_name) and not any(True for _ in m.children())


def fake_inputs(inputs: Any, mode: FakeTensorMode, dtype: torch.dtype) -> Any:
    """Fake copies of the example inputs (floating ones cast to ``dtype``), keeping tuple/dict form."""
    def conv(t):
        if isinstance(t, torch.Tensor):
            if t.is_floating_point() and dtype != torch.float32:
                t = t.to(dtype)
            return mode.from_tensor(t)
        return t

    if isinstance(inputs, dict):
        return {k: conv(v) for k, v in inputs.items()}
    return tuple(conv(t) for t in inputs)


def _symbolic_trace(model: nn.Module, args: tuple, mode: FakeTensorMode) -> tuple[fx.GraphModule, list[str]]:
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
            n.meta["val"] = _meta_val(tm, mode)
    return gm, [p.name for p in placeholders[: len(args)]]


def _meta_val(tm: Any, mode: FakeTensorMode) -> Any:
    """Turn ShapeProp's TensorMetadata (or nested tuples of it) into fake tensors, like export's meta['val']."""
    from torch.fx.passes.shape_prop import TensorMetadata

    if isinstance(tm, TensorMetadata):
        with mode:
            return torch.empty(tm.shape, dtype=tm.dtype, device="cpu")
    if isinstance(tm, (list, tuple)):
        return type(tm)(_meta_val(t, mode) for t in tm)
    if isinstance(tm, dict):
        return {k: _meta_val(v, mode) for k, v in tm.items()}
    return None


def _export(model: nn.Module, args: Any, mode: FakeTensorMode, kwargs: Optional[dict[str, Any]] = None,
            fixed: Optional[dict[Any, torch.Tensor]] = None,
            buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None,
            lift: bool = False) -> tuple[fx.GraphModule, list[str]]:
    """``torch.export.export(strict=False)`` of ``model`` on fake ``args``/``kwargs``; returns the graph
    module and the placeholder names of the user inputs. ``fixed`` (:class:`_Flatten`): inputs passed as
    constants, left out of ``args``/``kwargs`` here; their lifted-constant placeholders count as user inputs
    (activations, not parameters). ``buffers`` (:func:`integer_buffers`): integer buffers passed as
    constants (:class:`_BufferConstants`). ``lift``: integer factories are constants even without either
    (:class:`_LiftedFactories`)."""
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
        ep = _export_flat(model, args, kwargs, mode, fixed, buffers, lift)
    except TypeError as exc:  # that forward passes its own use_cache to the child besides **kwargs (Mimi)
        if not injected or "multiple values for keyword argument 'use_cache'" not in str(exc):
            raise
        ep = _export_flat(model, args, {k: v for k, v in kwargs.items() if k != "use_cache"}, mode, fixed,
                          buffers, lift)
    from torch.export.graph_signature import InputKind

    def is_input(spec: Any) -> bool:  # a constant lifted by _Flatten itself (no module path): a fixed input;
        # one lifted inside the model (``m.lifted_tensor_3``: a factory made constant) is not
        return spec.kind == InputKind.USER_INPUT or (
            bool(fixed) and spec.kind == InputKind.CONSTANT_TENSOR and "." not in str(spec.target))

    user = [s.arg.name for s in ep.graph_signature.input_specs if is_input(s) and hasattr(s.arg, "name")]
    from normaudit.capture.hop import inline_wrapped_regions

    inline_wrapped_regions(ep.graph_module)  # no_grad/autocast bodies: their norms are sites too
    return ep.graph_module, user


def _export_flat(model: nn.Module, args: tuple, kwargs: dict[str, Any], mode: FakeTensorMode,
                 fixed: dict[Any, torch.Tensor], buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None,
                 lift: bool = False) -> Any:
    """``torch.export.export(strict=False)`` of :class:`_Flatten` around ``model`` under ``mode``, with the
    example's integer inputs ``fixed`` and the integer ``buffers`` as constants (:func:`_constant_propagation`)
    when there are any, and integer factories as constants then or with ``lift``."""
    buffers = buffers or {}
    constants = bool(fixed) or bool(buffers) or lift
    with mode, no_value_checks(), (_constant_propagation() if constants else contextlib.nullcontext()), \
            _buffers_as_constants(model, buffers):
        return torch.export.export(_Flatten(model, fixed, buffers, lift), args, kwargs, strict=False)


def capture_model(model: nn.Module, inputs: Any, on_meta: bool, dtype: torch.dtype = torch.float32,
                  methods: tuple[str, ...] = ("symbolic_trace", "export"), parts_fallback: bool = True) -> Capture:
    """Capture ``model`` called on ``inputs`` (a tuple or a dict of keyword inputs).

    ``dtype`` is the precision the model will run in: floating parameters and inputs are cast to it on fake
    tensors, so the graph shows which operations compute in half precision. Never raises for a model that
    cannot be captured: the attempts record each failure. After a data-dependent export failure, export is
    retried with the example's real integer inputs as constants (:func:`constant_inputs`); a multimodal
    forward that still fails is retried on its main tower's inputs alone
    (:func:`normaudit.loaders.inputs.main_tower_inputs`). When no method captures the whole model and
    ``parts_fallback`` is set, its parts are captured alone (:mod:`normaudit.capture.parts`), then the
    Hugging Face models of their own inside it that hold norms no part covers, on inputs built for each
    (:func:`normaudit.capture.parts.capture_submodels`: a forward that fails at once records no part).
    """
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    if not on_meta:
        model = copy.deepcopy(model)  # the caller's real weights stay untouched
    if dtype != torch.float32:
        model.to(dtype)  # on meta or on the private copy, before fake tensors replace the storage
    buffers = integer_buffers(model, on_meta) if not _is_fake(model) else {}
    with mode:
        if on_meta:
            _materialize_fake_(model, mode)
        elif not _is_fake(model):
            _fakeify_(model, mode)
    modules = dict(model.named_modules())
    fake_args = fake_inputs(inputs, mode, dtype)
    attempts: list[CaptureAttempt] = []
    was_training = model.training
    # Per-module modes, restored after an eval-mode retry: a BatchNorm the user froze with .eval() inside
    # a training model must still read as frozen.
    modes = {name: m.training for name, m in modules.items()}
    found, train_error = _try_methods(model, fake_args, inputs, mode, methods, attempts, buffers=buffers)
    if found is None and isinstance(inputs, dict):
        from normaudit.loaders.inputs import main_tower_inputs

        fewer = main_tower_inputs(model, inputs)  # a multimodal forward that fails: its main tower alone
        if fewer is not None:
            _restore_modes(modules, modes)
            found, _ = _try_methods(model, fake_inputs(fewer, mode, dtype), fewer, mode, ("export",), attempts,
                                    " (main tower's inputs only)", buffers)
    _restore_modes(modules, modes)
    if found is not None:
        gm, user, method, train_pass = found
        cap = Capture(gm=gm, method=method, attempts=attempts, root=model, modules=modules,
                      user_inputs=user, eval_fallback=not train_pass and was_training,
                      train_error=train_error if not train_pass else None, buffer_values=buffers)
        if parts_fallback:
            from normaudit.capture.parts import capture_unreached

            with _quiet():
                cap.parts = capture_unreached(cap, mode, dtype)
        return cap
    from normaudit.capture.parts import MAX_SECONDS, capture_submodels, replaced_by

    until = time.perf_counter() + MAX_SECONDS  # the parts and the submodels share one budget
    parts, parts_error = (_capture_parts(model, fake_args, mode, modules, inputs, buffers, dtype, until)
                          if parts_fallback else ([], None))
    _restore_modes(modules, modes)
    cap = Capture(gm=None, method="module_walk", attempts=attempts, root=model, modules=modules,
                  train_error=train_error, parts=parts, parts_error=parts_error, buffer_values=buffers)
    if parts_fallback:  # the models of their own that hold norms no part covers (a forward that fails at once)
        with _quiet():
            cap.parts = replaced_by(parts, capture_submodels(cap, mode, dtype, set(), parts, until))
    return cap


def _try_methods(model: nn.Module, fake_args: Any, inputs: Any, mode: FakeTensorMode, methods: tuple[str, ...],
                 attempts: list[CaptureAttempt], note: str = "",
                 buffers: Optional[dict[str, dict[str, torch.Tensor]]] = None) -> tuple[Optional[tuple], Optional[str]]:
    """Run the capture methods (:func:`_plan`) in the model's own mode, then in eval mode when it was
    training; each attempt is appended to ``attempts`` (labelled with ``note``). Returns ``((gm,
    user_inputs, method, train_pass) or None, the first error in training mode)``; the model is left in
    the mode of the pass that captured (eval after a failed training pass). A training-mode graph that
    skipped blocks of a stack (:func:`skipped_blocks`) counts as failed; it is returned (its attempt then
    reads as the success it was) where no eval-mode method captures, or where the first eval-mode graph skips
    the same blocks (a forward that leaves them out by design in both modes, not at random)."""
    train_error = None
    held = None  # a training-mode graph that skipped blocks (skipped_blocks): kept where eval captures nothing
    was_training = model.training
    for train_pass in ([True, False] if was_training else [False]):
        if not train_pass:
            model.eval()
        guarded = False  # the plain export of this pass failed on a data-dependent size
        for method, fixed, consts, lift in _plan(methods, fake_args, inputs, buffers or {}):
            if lift and not guarded:
                continue  # constants only where export failed on a data-dependent size
            t0 = time.perf_counter()
            label = _label(method, fixed, consts, lift) + note
            label = label if train_pass == was_training else f"{label} (eval)"
            try:
                with _quiet():
                    if method == "symbolic_trace":
                        gm, user = _symbolic_trace(model, fake_args, mode)
                    else:
                        gm, user = _export(model, fake_args, mode, fixed=fixed, buffers=consts, lift=lift)
            except Exception as exc:  # noqa: BLE001 - any failure moves on to the next method
                error = _one_line(_root_cause(exc))
                attempts.append(CaptureAttempt(method=label, ok=False, error=error,
                                               seconds=round(time.perf_counter() - t0, 3)))
                guarded = guarded or (method == "export" and not lift and data_dependent(error))
                if train_pass and train_error is None:
                    train_error = error
                continue
            skipped = skipped_blocks(gm, dict(model.named_modules())) if train_pass else []
            if skipped and held is None:  # layerdrop drawn in Python: the eval pass runs every block
                error = (f"the training-mode trace skipped {len(skipped)} block(s) of a stack at random "
                         f"(layerdrop): {', '.join(skipped[:3])}")
                attempts.append(CaptureAttempt(method=label, ok=False, error=error,
                                               seconds=round(time.perf_counter() - t0, 3)))
                held, train_error = (gm, user, method, train_pass, set(skipped)), train_error or error
                break
            if held is not None and held[4] <= set(skipped_blocks(gm, dict(model.named_modules()))):
                break  # the eval graph skips them too (by design, not at random): the training-mode graph stands
            attempts.append(CaptureAttempt(method=label, ok=True, seconds=round(time.perf_counter() - t0, 3)))
            return (gm, user, method, train_pass), train_error
    if held is not None:
        attempts[:] = [a if a.error is None or not a.error.startswith("the training-mode trace skipped") else
                       CaptureAttempt(method=a.method, ok=True, seconds=a.seconds) for a in attempts]
        return held[:4], None
    return None, train_error


def skipped_blocks(gm: fx.GraphModule, modules: dict[str, nn.Module]) -> list[str]:
    """Paths of the blocks of a stack (children of one ``nn.ModuleList``) that hold a norm module and in which
    no node of ``gm`` was computed, while a sibling of the same class has nodes there or the module holding
    the stack does (every block dropped): what a training-mode forward that skips blocks at random leaves out
    of the graph. A tower that never ran (its owner has no node) is not such a stack. LayerDrop drawn
    in Python is computed for real while tracing (VITS's text encoder: ``np.random.uniform(0, 1) <
    layerdrop``, modeling_vits.py:1113-1115; Fan et al. 2019, arXiv 1909.11556), so a norm of a skipped
    block would be no site. [] for a graph that reached every such block."""
    from normaudit.capture.parts import _under, reached_paths

    reached = reached_paths(gm, modules)
    norms = [path for path, _, _ in norm_modules(modules) if path]
    out: list[str] = []
    for path, mod in modules.items():
        if not isinstance(mod, nn.ModuleList):
            continue
        kids = [(f"{path}.{name}" if path else name, child) for name, child in mod.named_children()]
        ran = {type(child) for p, child in kids if p in reached}
        owner = path.rpartition(".")[0]
        owner_ran = owner in reached or (owner == "" and bool(reached))  # it ran, yet every block was dropped
        out += [p for p, child in kids if (type(child) in ran or owner_ran) and p not in reached
                and any(_under(n, p) for n in norms)]
    return out


def _label(method: str, fixed: dict, consts: dict, lift: bool = False) -> str:
    """The attempt's name: the method, and what it passed as constants."""
    if lift and not fixed and not consts:
        return f"{method} (integer factories as constants)"
    if fixed and consts:
        return f"{method} (integer inputs and buffers as constants)"
    if fixed or consts:
        return f"{method} (integer {'inputs' if fixed else 'buffers'} as constants)"
    return method


def _plan(methods: tuple[str, ...], fake_args: Any, inputs: Any,
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
    with integer factories alone as constants (:class:`_LiftedFactories`: a length vector from
    ``x.new_ones(B, dtype=torch.long)`` compared with a size, PE-AV's ``modeling_pe_audio_video.py:182``)."""
    retries = []
    if fixed:
        retries.append(("export", fixed, {}, True))
    if buffers:
        retries.append(("export", fixed, buffers, True))
    return retries or [("export", {}, {}, True)]


def _capture_parts(model: nn.Module, fake_args: Any, mode: FakeTensorMode, modules: dict[str, nn.Module],
                   real_inputs: Any = None, buffers: Optional[dict] = None,
                   dtype: torch.dtype = torch.float32, until: Optional[float] = None) -> tuple[list, Optional[str]]:
    """:func:`normaudit.capture.parts.capture_parts` over the norm modules :func:`normaudit.vocabulary.kinds.norm_modules` finds
    (``real_inputs``: the example inputs ``fake_args`` were made from; ``buffers``: :func:`integer_buffers`;
    the main tower's inputs alone, :func:`normaudit.loaders.inputs.main_tower_inputs`, record what the
    forward on all inputs does not reach; ``until``: no part capture starts after this ``time.perf_counter()``)."""
    from normaudit.loaders.inputs import main_tower_inputs

    from normaudit.capture.parts import capture_parts
    from normaudit.loaders.inputs import forward_kwargs, forward_params

    norm_paths = [path for path, _, _ in norm_modules(modules) if path]
    if not norm_paths:
        return [], None
    extra = forward_kwargs(forward_params(model)) if isinstance(fake_args, dict) else {}
    with _quiet():
        fewer = main_tower_inputs(model, real_inputs) if isinstance(real_inputs, dict) else None
        fewer_pair = (fake_inputs(fewer, mode, dtype), fewer) if fewer is not None else None
        return capture_parts(model, fake_args, mode, norm_paths, extra, real_inputs, buffers, fewer_pair, until)


def _restore_modes(modules: dict[str, nn.Module], modes: dict[str, bool]) -> None:
    for name, mod in modules.items():
        mod.training = modes[name]


def _is_fake(model: nn.Module) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(p, FakeTensor) for p in model.parameters())


def _materialize_fake_(model: nn.Module, mode: FakeTensorMode) -> None:
    """``model.to_empty(device="cpu")`` under ``mode``: meta parameters and buffers become fake CPU tensors.

    ``to_empty`` visits a module once per parent, so a module registered under two parents (timm
    ``coat_tiny``'s shared convolutional position encodings) gets its weight swapped twice and the second
    swap fails (``Couldn't swap Linear.weight``). Then each module is visited once and each tensor replaced
    once, shared (tied) tensors staying shared.
    """
    try:
        model.to_empty(device="cpu")
        return
    except RuntimeError:
        pass
    done: dict[int, Any] = {}
    for mod in model.modules():  # each module once, however many parents hold it
        for table, as_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(table.items()):
                if t is None:
                    continue
                if id(t) not in done:
                    empty = torch.empty_like(t, device="cpu")
                    done[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if as_param else empty
                table[name] = done[id(t)]
                done[id(table[name])] = table[name]


def _fakeify_(model: nn.Module, mode: FakeTensorMode) -> None:
    """Replace a real model's parameters and buffers by fake copies (same shapes, dtypes, no data)."""
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = nn.Parameter(mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = mode.from_tensor(b)


@contextlib.contextmanager
def _quiet():
    import logging
    import warnings

    logger = logging.getLogger("torch")
    old = logger.level
    logger.setLevel(logging.ERROR)
    # ShapeProp prints a traceback to stderr before re-raising; the failure is recorded in the attempts.
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(old)
