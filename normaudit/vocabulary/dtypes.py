"""The floating dtypes normaudit reasons about, in one table: the ``--dtype`` choices, the half-precision ones,
and per dtype its size, largest finite value, machine epsilon and smallest subnormal (IEEE 754 binary16 and
binary32/64; bfloat16 is binary32's exponent with 8 significand bits: ``torch.finfo`` gives the same values).
Imports no torch (the rules and the settings read it at start-up); :func:`torch_dtype` converts a name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

#: the precisions an audit runs in (``--dtype``, ``dtype`` in settings)
AUDIT_DTYPES = ("float32", "float16", "bfloat16")
#: the half-precision dtypes: statistics are kept in float32 for them (an upcast) or they are not
HALF_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class DtypeInfo:
    """One floating dtype: ``bytes`` per element, ``max`` its largest finite value, ``eps`` machine epsilon
    (``torch.finfo(dtype).eps``: the gap between 1 and the next value) and ``smallest_subnormal`` (a positive
    value below half of it rounds to 0, round-to-nearest)."""

    bytes: int
    max: float
    eps: float
    smallest_subnormal: float


DTYPES: dict[str, DtypeInfo] = {
    "float16": DtypeInfo(2, 65504.0, 2.0 ** -10, 2.0 ** -24),
    "bfloat16": DtypeInfo(2, 3.3895313892515355e38, 2.0 ** -7, 2.0 ** -133),
    "float32": DtypeInfo(4, 3.4028234663852886e38, 2.0 ** -23, 2.0 ** -149),
    "float64": DtypeInfo(8, 1.7976931348623157e308, 2.0 ** -52, 2.0 ** -1074),
}


def dtype_name(dt: Any) -> Optional[str]:
    """``float16`` for ``torch.float16`` (any torch dtype's name without ``torch.``); None for None."""
    return str(dt).replace("torch.", "") if dt is not None else None


def torch_dtype(name: str) -> Any:
    """The ``torch.dtype`` named ``name`` (a key of :data:`DTYPES`). Raises KeyError for another name."""
    if name not in DTYPES:
        raise KeyError(name)
    import torch

    return getattr(torch, name)
