"""How a norm module applies its gain, measured: ``weight`` (x_normed * w) or ``one_plus_weight``
(x_normed * (1 + w), Gemma's RMSNorm).

:func:`gain_form` runs a copy of the module on the CPU with every parameter set to 0 (gain and bias) on a random
input: a norm that scales by ``w`` then outputs 0 everywhere, one that scales by ``1 + w`` outputs the normalised
input itself (rows of unit RMS). Anything else (an error, non-finite values, an output of another shape or
scale) is ``unknown``. The copy is made from the module's class and state on the meta device
(``copy.deepcopy`` + ``to_empty``): no weights are read and the module itself is left as it was.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

#: inputs: rows of this width or the gain's, two rows of three positions
_ROWS = (2, 3)


def gain_form(module: Any) -> str:
    """``weight``, ``one_plus_weight`` or ``unknown`` for ``module`` (see the module docstring)."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not 0 < weight.numel() <= 1 << 16:
        return "unknown"
    try:
        probe = copy.deepcopy(module).to_empty(device="cpu").float()
        with torch.no_grad():
            for p in probe.parameters():
                p.zero_()
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(*_ROWS, weight.numel(), generator=gen)
            y = probe(x)
    except Exception:  # noqa: BLE001 - a library's norm may refuse a bare call: then the form is unknown
        return "unknown"
    y = y[0] if isinstance(y, tuple) else y
    if not isinstance(y, torch.Tensor) or y.shape != x.shape or not bool(torch.isfinite(y).all()):
        return "unknown"
    if float(y.abs().max()) == 0.0:
        return "weight"
    rms = y.float().pow(2).mean(-1).sqrt()
    return "one_plus_weight" if bool(((rms - 1).abs() < 0.05).all()) else "unknown"
