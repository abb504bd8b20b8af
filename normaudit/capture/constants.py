"""Values a capture keeps as constants: integer and bool buffers (position ids, masks) passed by value, and integer
tensor factories lifted so their values survive tracing."""
from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import nn

from normaudit.capture.fake import CONSTANT_PROPAGATION_LIMIT


class BufferConstants(nn.Module):
    """The model's integer and bool buffers as constants (:func:`integer_buffers`, ``{module path: {name: real
    tensor}}``): called inside the traced forward, it sets each one, re-made from its values
    (``torch.tensor(values)``, a lift), as a plain attribute of its module, whose registered buffer
    :func:`buffers_as_constants` has taken out meanwhile. A forward that reads a buffer as a size (Mimi's
    and EnCodec's ``padding_total``/``stride``/``kernel_size`` in ``F.pad``) then specialises on its value
    instead of failing on a data-dependent guard. Being a child module of :class:`Flatten`, its lifted
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
def buffers_as_constants(model: nn.Module, buffers: dict[str, dict[str, torch.Tensor]]):
    """Take the registered buffers named in ``buffers`` out of their modules meanwhile (export lifts every
    registered buffer as a fake graph input, whose values are unknown), for :class:`BufferConstants` to
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
    for the retry of export that passes them as constants (:class:`BufferConstants`).

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


class LiftedFactories(torch.overrides.TorchFunctionMode):
    """While the example's integer inputs are constants (:class:`Flatten`): a deterministic factory
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
