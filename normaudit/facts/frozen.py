"""Frozen BatchNorms that ``model.train()`` unfreezes: ``site.freeze``.

Fine-tuning a detector or segmenter on small batches, one freezes the backbone's BatchNorms: their ``weight``
and ``bias`` get ``requires_grad=False`` and the modules are put in ``eval()`` once. ``requires_grad`` only
stops the affine parameters' updates; what makes a BatchNorm use and update batch statistics is its
``training`` flag, and the next ``model.train()`` (every training loop calls it, often once per epoch) sets it
on every submodule again: the "frozen" norms then normalise with the statistics of each small batch and
overwrite ``running_mean``/``running_var`` with them (PyTorch docs: ``Module.train``, ``BatchNorm2d``). The
control is a ``train()`` override that puts them back in eval, as mmdetection's ``norm_eval`` does
(``super().train(mode)`` then ``m.eval()`` for every ``_BatchNorm``), or torchvision's ``FrozenBatchNorm2d``,
which has no training mode at all.

For every torch.nn BatchNorm site, :class:`normaudit.report.FreezeFacts` records, on the untouched probe copy
of the model (``ctx.probe_model``): whether its parameters are all frozen, whether it is in eval mode as built,
and whether it is in training mode after ``model.train()`` is called on that copy (every module's mode is
restored afterwards); ``train_override`` names the ``train`` methods the model's classes define. ``model.train()``
is the user's code: when it raises, ``after_train`` stays None.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from normaudit.facts.context import FactContext, Facts
from normaudit.report import FreezeFacts


__all__ = ["analyse", "train_overrides"]


def train_overrides(root: nn.Module) -> list[str]:
    """``Class.train`` for every class of the model's modules that defines its own ``train`` (not nn.Module's)."""
    out: list[str] = []
    for mod in root.modules():
        for cls in type(mod).__mro__:
            if cls is nn.Module:
                break
            if "train" in vars(cls):
                name = f"{cls.__qualname__}.train"
                if name not in out:
                    out.append(name)
                break
    return out


def _modes_after_train(root: nn.Module) -> Optional[dict[str, bool]]:
    """Every module's ``training`` flag after ``root.train()``, the flags restored afterwards; None when
    ``train()`` raises."""
    modules = dict(root.named_modules())
    before = {name: m.training for name, m in modules.items()}
    try:
        root.train()
        return {name: m.training for name, m in modules.items()}
    except Exception:  # noqa: BLE001 - the model's own train() override may raise anything
        return None
    finally:
        for name, m in modules.items():
            m.training = before[name]


def analyse(ctx: Any, records: list) -> None:
    """Set ``site.freeze`` on the torch.nn BatchNorm sites (module docstring). Needs ``ctx.probe_model``."""
    root = getattr(ctx, "probe_model", None)
    sites = [r.site for r in records if r.site.kind == "BatchNorm" and r.site.detected_by == "module"]
    if root is None or not sites:
        return
    modules = dict(root.named_modules())
    after = _modes_after_train(root)
    overrides = train_overrides(root)
    trainable = any(p.requires_grad for p in root.parameters())
    for s in sites:
        mod = modules.get(s.module)
        if mod is None:
            continue
        params = list(mod.parameters(recurse=False))
        s.freeze = FreezeFacts(params_frozen=(not any(p.requires_grad for p in params)) if params else None,
                               eval_as_built=not mod.training, model_trainable=trainable,
                               after_train=after.get(s.module) if after is not None else None,
                               train_override=overrides)


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``frozen``: :func:`analyse` over the sites."""
    analyse(ctx, facts.records)
