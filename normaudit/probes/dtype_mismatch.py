"""The first module whose input dtype differs from its weights', for a forward that fails in a reduced precision.

Audited in ``--dtype float16`` the model's parameters and example inputs are cast to float16, but a forward
that makes float32 tensors itself (a diffusion model's timestep embedding: ``torch.arange(half,
dtype=torch.float32)``, ``t.float()``) feeds them to float16 layers. On real tensors the first such layer
raises; on the fake tensors of the capture an ``nn.Linear`` lets the float32 tensor through (its matmul has
no dtype check there), and the error surfaces modules later, naming an innocent layer (a Conv2d whose bias is
float16). :func:`first_dtype_mismatch` runs the forward once more on fake tensors with a pre-hook on every
module and names the first module called with a floating input of another dtype than its own floating
parameters, with the line of the user's code that called it.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from torch.utils._pytree import tree_flatten


@dataclass
class DtypeMismatch:
    """``module`` (its ``named_modules()`` path) of class ``class_name`` was called with a floating input of
    ``input_dtype`` while its own floating parameters are ``weight_dtype``; ``line`` is the line of the user's
    file that called it (None where no frame of that file was on the stack)."""

    module: str
    class_name: str
    input_dtype: str
    weight_dtype: str
    line: Optional[int] = None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def first_dtype_mismatch(root: nn.Module, args: Any, mode: Any, user_file: Optional[str]) -> Optional[DtypeMismatch]:
    """The first module of ``root`` called, in the forward on ``args`` (fake tensors of ``mode``: a tuple of
    positional inputs or a dict of keyword inputs), with a floating tensor input whose dtype is not that of its
    own floating parameters (see the module docstring); None when every module's inputs match (or the
    forward stops before one does not). The forward's own error is not raised here."""
    found: list[DtypeMismatch] = []
    user = str(Path(user_file).resolve()) if user_file else None

    def hook_for(path: str):
        def hook(mod: nn.Module, hook_args: tuple, hook_kwargs: dict) -> None:
            if found:
                return
            weights = {p.dtype for p in mod.parameters(recurse=False) if p.is_floating_point()}
            if len(weights) != 1:
                return
            (weight,) = weights
            flat, _ = tree_flatten((hook_args, hook_kwargs))
            other = next((t.dtype for t in flat if isinstance(t, torch.Tensor) and t.is_floating_point()
                          and t.dtype != weight), None)
            if other is not None:
                found.append(DtypeMismatch(path, type(mod).__name__, _dtype_name(other), _dtype_name(weight),
                                           _calling_line(user)))
        return hook

    handles = [m.register_forward_pre_hook(hook_for(p), with_kwargs=True) for p, m in root.named_modules() if p]
    try:
        with mode, torch.no_grad():
            root(**args) if isinstance(args, dict) else root(*args)
    except Exception:  # noqa: BLE001 - the forward fails: the mismatch before the failure is what is asked
        pass
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


def _calling_line(user_file: Optional[str]) -> Optional[int]:
    """The line of the innermost frame of ``user_file`` on the current stack (the call of the module)."""
    if user_file is None:
        return None
    line = None
    for frame in traceback.extract_stack():
        try:
            if str(Path(frame.filename).resolve()) == user_file:
                line = frame.lineno
        except OSError:
            continue
    return line


def mismatch_advice(m: DtypeMismatch, dtype: str) -> str:
    """What to say about a mismatch found while auditing in ``dtype``: the module, both dtypes, the likely
    cause and what to do (autocast, or making the tensor in the input's dtype)."""
    return (f"the first module whose input dtype differs from its weights' is {m.module} ({m.class_name}: "
            f"{m.input_dtype} input, {m.weight_dtype} weights; the error above surfaced later): the forward makes a "
            f"{m.input_dtype} tensor itself (an explicit dtype=, .float()), which weights cast to {dtype} do not "
            f"take, and model.to(torch.{dtype}) fails the same way; in {dtype} such a model runs under torch.autocast, "
            "which casts each op's inputs: make that tensor in the dtype of the input it meets (.to(x.dtype)) to "
            f"audit it in {dtype}")
