"""Fake tensors for capture: example inputs made fake, a meta model given fake storage (no weight memory), and
constant propagation on fake tensors so integer computations keep their values."""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode


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
def constant_propagation(limit: int = CONSTANT_PROPAGATION_LIMIT):
    """Raise torch's limit on constant propagation (``CONSTANT_NUMEL_LIMIT`` of ``FakeTensorMode`` and of
    the ``make_fx`` proxy tracer) to ``limit`` elements meanwhile: an op whose inputs are all constants
    (tensors lifted from Python values, :class:`Flatten`) is computed for real and its result stays a
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


def meta_val(tm: Any, mode: FakeTensorMode) -> Any:
    """Turn ShapeProp's TensorMetadata (or nested tuples of it) into fake tensors, like export's meta['val']."""
    from torch.fx.passes.shape_prop import TensorMetadata

    if isinstance(tm, TensorMetadata):
        with mode:
            return torch.empty(tm.shape, dtype=tm.dtype, device="cpu")
    if isinstance(tm, (list, tuple)):
        return type(tm)(meta_val(t, mode) for t in tm)
    if isinstance(tm, dict):
        return {k: meta_val(v, mode) for k, v in tm.items()}
    return None


def is_fake(model: nn.Module) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(p, FakeTensor) for p in model.parameters())


def materialize_fake_(model: nn.Module, mode: FakeTensorMode) -> None:
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


def fakeify_(model: nn.Module, mode: FakeTensorMode) -> None:
    """Replace a real model's parameters and buffers by fake copies (same shapes, dtypes, no data)."""
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None:
                mod._parameters[name] = nn.Parameter(mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = mode.from_tensor(b)
