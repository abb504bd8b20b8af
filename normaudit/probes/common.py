"""Helpers shared by the dynamic probes (:mod:`normaudit.probes`): a real copy of a model to run, calling it on
example inputs, one-line error text, quiet runs."""
from __future__ import annotations

import copy
import itertools
from typing import Any, Optional

import torch
from torch import fx, nn


def axis_dims(node: fx.Node) -> Any:
    """The axis pass's per-dim provenance of ``node`` (``node.meta["normaudit"]["axis_dims"]``), or None."""
    return (node.meta.get("normaudit") or {}).get("axis_dims")


def first_tensor(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The first tensor among a call's positional then keyword arguments, or None."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def one_line(exc: BaseException) -> str:
    """One line of what was raised: the exception type and message, without fx's "While executing" and
    traceback additions, at most 240 characters."""
    text = " ".join(str(exc).split())
    text = text.split(" While executing ")[0].strip()
    if len(text) > 240:
        text = text[:237] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def materialise(model: nn.Module, seed: int = 0) -> nn.Module:
    """A real CPU copy of ``model`` for probing (the argument is never modified).

    A model with meta (or fake) tensors is copied and given storage with ``to_empty(device="cpu")``; then
    every module's ``reset_parameters()`` runs under ``torch.manual_seed(seed)``, and what no module reset
    is filled by name: 1-D ``weight``/``gamma``/``scale``/``g`` -> 1, ``bias``/``beta``/``b`` -> 0, other
    parameters N(0, 0.02^2), floating buffers 0 (rotary ``inv_freq`` 0: no rotation), integer buffers 0.
    A real model is deep-copied as is. Raises what ``to_empty`` or a ``reset_parameters`` raises.
    """
    from torch._subclasses.fake_tensor import FakeTensor

    m = copy.deepcopy(model)
    tensors = list(itertools.chain(m.parameters(), m.buffers()))
    if not any(t.is_meta or isinstance(t, FakeTensor) for t in tensors):
        return m
    m.to_empty(device="cpu")
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            for t in m.parameters():
                t.fill_(float("nan")) if t.is_floating_point() else None
            for b in m.buffers():
                if b.is_floating_point():
                    b.fill_(float("nan"))
                elif b.dtype != torch.bool:
                    b.fill_(-7919)
            for mod in m.modules():
                reset = getattr(mod, "reset_parameters", None)
                if callable(reset):
                    try:
                        reset()
                    except Exception:  # noqa: BLE001 - fall back to the name-based fill below
                        pass
            for name, p in m.named_parameters():
                if not p.is_floating_point() or not torch.isnan(p).any():
                    continue
                leaf = name.rsplit(".", 1)[-1].lower()
                if p.dim() <= 1 and leaf in ("weight", "gamma", "scale", "g", "alpha", "a_2", "gain"):
                    p.fill_(1.0)
                elif p.dim() <= 1 and leaf in ("bias", "beta", "b", "b_2", "shift"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
            for b in m.buffers():
                if b.is_floating_point() and torch.isnan(b).any():
                    b.zero_()
                elif not b.is_floating_point() and b.dtype != torch.bool and (b == -7919).any():
                    b.zero_()
    finally:
        torch.random.set_rng_state(gen_state)
    return m


def call_model(model: nn.Module, args: Any) -> Any:
    """Call ``model`` on example inputs (a dict: keywords; else positional), with ``use_cache=False`` for
    Hugging Face models that have a cache."""
    a, kw = ((), dict(args)) if isinstance(args, dict) else (tuple(args), {})
    if getattr(getattr(model, "config", None), "use_cache", None) is not None:
        kw.setdefault("use_cache", False)
    return model(*a, **kw)


def out_tensor(out: Any) -> Optional[torch.Tensor]:
    """The output tensor of a call: the tensor itself, or the first element of a tuple/list; else None."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None
