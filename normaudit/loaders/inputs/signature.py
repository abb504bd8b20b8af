"""What a model's ``forward`` takes, and whether a forward on the meta device accepts given inputs.

Its parameters (:func:`forward_params`; the named and the required ones), its main input
(``main_input_name``), the keyword inputs every capture adds where ``forward`` takes them
(:func:`forward_kwargs`), and a trial forward on meta tensors (:func:`runs_on_meta`).
"""
from __future__ import annotations

import contextlib
import inspect
import io
from typing import Any, Optional

import torch
from torch import nn


def forward_params(model: Any) -> dict[str, inspect.Parameter]:
    """Parameters of ``model.forward`` (or of a callable), empty when there is no signature."""
    try:
        return dict(inspect.signature(model.forward if isinstance(model, nn.Module) else model).parameters)
    except (TypeError, ValueError):
        return {}


def named_params(params: dict[str, inspect.Parameter]) -> list[str]:
    """Named parameters of ``forward`` (not ``*args``/``**kwargs``), in order."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in params.items() if p.kind in kinds and n != "self"]


def required_params(params: dict[str, inspect.Parameter]) -> list[str]:
    """Named parameters of ``forward`` without a default: inputs the model cannot run without."""
    return [n for n in named_params(params) if params[n].default is inspect.Parameter.empty]


def main_input_name(model: Any) -> Optional[str]:
    """``model.main_input_name``: a string, or for a model with several main inputs (transformers allows a
    list: OneFormer's ``["pixel_values", "task_inputs"]``) the first of them; None when there is none."""
    name = getattr(model, "main_input_name", None)
    if isinstance(name, (list, tuple)):
        name = next((n for n in name if isinstance(n, str)), None)
    return name if isinstance(name, str) else None


def on_meta(model: nn.Module) -> bool:
    """Whether ``model``'s first parameter is on the meta device (False for a model without parameters)."""
    p = next(iter(model.parameters()), None)
    return p is not None and p.device.type == "meta"


def forward_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """Extra keyword inputs every capture passes where ``forward`` takes them: ``use_cache=False`` (no
    cache objects whose ``get_seq_length`` would need real numbers)."""
    return {"use_cache": False} if "use_cache" in params else {}


#: what a meta forward raises at a step that needs real numbers (``.item()``, ``nonzero()``), not a shape
_DATA_DEPENDENT_ON_META = ("meta tensor", "a correct data-independent implementation does not exist")


def runs_on_meta(model: nn.Module, params: dict, kwargs: dict[str, Any]) -> bool:
    """Whether a forward of ``model`` (on the meta device) on ``kwargs`` moved to meta, plus
    :func:`forward_kwargs`, accepts their shapes: it runs, or stops only at a step that needs real numbers
    (:data:`_DATA_DEPENDENT_ON_META`). ``params``: the parameters of its ``forward``. Warnings and printed
    output are silenced."""
    import warnings

    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    meta.update(forward_kwargs(params))
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model(**meta)
    except Exception as exc:  # noqa: BLE001 - any other failure rejects this candidate
        # .item()/.tolist() need real numbers, nonzero()/boolean-mask indexing a data-dependent size (no
        # meta kernel): the shapes were accepted up to there
        return any(m in str(exc) for m in _DATA_DEPENDENT_ON_META)
    return True
