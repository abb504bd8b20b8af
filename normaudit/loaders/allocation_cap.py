"""A cap on what a model factory allocates when it must be built with real weights.

A ``build_model()`` that cannot run on the meta device (``.item()`` of a tensor it made) is built again for
real (:func:`normaudit.loaders.pyfile.build_model_from`); without a cap a 10**12-parameter model asks for 4 TB.
:class:`AllocationCap` is a ``TorchDispatchMode`` (torch's hook on every aten operator, called before the
kernel runs) that counts the elements of each tensor the factory creates, parameters and buffers among them:
the operators that make a tensor from sizes (``empty``, ``zeros``, ``randn``, ``full``, ``arange``...) and
those that make one shaped like another (``*_like``, ``new_*``). Each such call is first evaluated on the
meta device, which allocates nothing, for its shape; a call that would take the running total above the
limit is refused before its memory is asked for. Tensors made by other operators (a product, a
concatenation) come from tensors already counted, so the count is the size of what the factory made.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

#: aten operators (by packet name) that allocate a tensor shaped by a tensor argument
_SHAPED_LIKE = frozenset({"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
                          "randint_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided"})


class AllocationRefused(Exception):
    """What :class:`AllocationCap` raises instead of an allocation that would pass its limit."""


class AllocationCap(TorchDispatchMode):
    """While active, count the elements of the tensors created (see the module docstring); the call that
    would make the total pass ``limit`` raises :class:`AllocationRefused` before allocating and is recorded
    in ``refused`` as ``(total before it, its elements, its shape, its dtype)``, kept even when the user's
    code catches the exception. ``total``: the elements counted so far."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = int(limit)
        self.total = 0
        self.refused: Optional[tuple[int, int, tuple[int, ...], torch.dtype]] = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        made = _made_tensor(func, args, kwargs)
        if made is not None:
            n = made.numel()
            if self.total + n > self.limit:
                if self.refused is None:
                    self.refused = (self.total, n, tuple(made.shape), made.dtype)
                raise AllocationRefused(f"a tensor of {n} elements would pass the cap of {self.limit}")
            self.total += n
        return func(*args, **kwargs)


def _made_tensor(func: Any, args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The meta tensor ``func(*args, **kwargs)`` would create when it allocates a new tensor from sizes or
    from another tensor's shape (see the module docstring); None for any other operator, or when the meta
    evaluation fails (the call then runs uncounted)."""
    name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    flat, _ = tree_flatten((args, kwargs))
    has_tensor = any(isinstance(a, torch.Tensor) for a in flat)
    if has_tensor and name not in _SHAPED_LIKE:
        return None
    schema = getattr(func, "_schema", None)
    names = {a.name for a in getattr(schema, "arguments", ())}
    if not has_tensor and "device" not in names:
        return None
    meta_args, meta_kwargs = tree_map(lambda a: a.to("meta") if isinstance(a, torch.Tensor) else a, (args, kwargs))
    if "device" in names:
        meta_kwargs["device"] = torch.device("meta")
    if "pin_memory" in names:
        meta_kwargs["pin_memory"] = False
    try:
        out = func(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 - an operator without a meta kernel: left to run uncounted
        return None
    return out if isinstance(out, torch.Tensor) else None


def refusal_text(refused: tuple[int, int, tuple[int, ...], torch.dtype], limit: int) -> str:
    """The refused allocation in words: its elements, shape and bytes, and what was counted before it."""
    total, n, shape, dtype = refused
    size = n * torch.empty((), dtype=dtype, device="meta").element_size()
    gib, mib = size / 2 ** 30, size / 2 ** 20
    bytes_text = f"{gib:,.1f} GiB" if gib >= 0.1 else f"{mib:,.1f} MiB" if mib >= 0.1 else f"{size} bytes"
    return (f"a tensor of {n:,} elements (shape {list(shape)}, {str(dtype).replace('torch.', '')}, {bytes_text}) "
            f"after {total:,} elements already made: {total + n:,} in all, above the limit of {limit:,} "
            f"(--max-params {limit})")

