"""Deferred imports of optional heavy libraries that transformers imports at start-up and an audit never uses
(boto3, scipy.optimize, trio: seconds of start-up in every audit): each module of :data:`DEFERRED` is put in :data:`sys.modules` as a lazy module, and runs on the
first use of one of its attributes, as :class:`importlib.util.LazyLoader` does.

Why not ``LazyLoader`` alone: on Python 3.11 a plain ``import boto3`` of a module already in ``sys.modules``
reads its ``__spec__`` (to see whether it is still initialising), and any attribute of a ``LazyLoader``
module runs it. :class:`DeferredModule` serves the import machinery's metadata (:data:`METADATA`) without
running the module, and, for ``from scipy.optimize import linear_sum_assignment``, the callables named in the
table as stand-ins that import the real module on their first call and then call the real function.

What the model's code sees: the same module object (a :class:`DeferredModule` becomes a plain module, with
the real module's contents, the first time any other attribute is read, exactly as under ``LazyLoader``), and
every attribute the real module has. Only a name bound by ``from M import f`` *before* ``M`` ran is the
stand-in (:func:`_stand_in`) rather than ``f`` itself: it calls ``f`` with the same arguments and returns
what ``f`` returns; its ``__wrapped__`` is ``f`` once loaded.

Scope: :func:`install` is called only in normaudit's own command-line process (:mod:`normaudit.runner`,
before the workers fork, and in a Ray task), never by :func:`normaudit.audit.run_audit` or the pytest
plugin: a process that imports normaudit as a library keeps its imports as they are. A module already
imported, not installed, or whose parent package is already imported, is left alone.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass(frozen=True)
class Deferred:
    """One optional heavy import: ``module`` (dotted name), the ``callables`` a from-import may bind before the
    module runs (served as stand-ins), and ``reason``: who imports it at start-up and why deferring is safe."""

    module: str
    callables: tuple[str, ...] = ()
    reason: str = ""


#: The optional heavy imports deferred in normaudit's process (figures: py-spy of the 70B-config audit).
DEFERRED: tuple[Deferred, ...] = (
    Deferred("boto3", (), "accelerate/commands/config/sagemaker.py does `import boto3` at import (reached from "
             "transformers' configuration modules through integrations/accelerate) and uses it only inside "
             "functions that ask AWS about SageMaker roles; 0.6 s of the 70B audit."),
    Deferred("scipy.optimize", ("linear_sum_assignment",),
             "transformers/loss/loss_for_object_detection.py (and the other DETR-family losses) does "
             "`from scipy.optimize import linear_sum_assignment` at import (modeling_utils -> loss_utils) and "
             "calls it only in the Hungarian matcher of a training loss; scipy and scipy.optimize are 0.65 s "
             "of the 70B audit. scipy's own __getattr__ resolves `scipy.optimize` to this module."),
    Deferred("trio", (), "httpcore2/_synchronization.py (huggingface_hub's HTTP stack, imported by "
             "transformers.utils.hub) does `import trio` at import and uses it only under a running trio event "
             "loop; 0.2 s of the 70B audit."),
)

#: Attributes the import machinery reads from a module in ``sys.modules`` (``import M``, ``from M import x``,
#: ``importlib.util.find_spec``): served without running the module.
METADATA = frozenset({"__spec__", "__name__", "__loader__", "__package__", "__path__", "__file__", "__cached__",
                      "__class__"})


#: module name -> the callables served as stand-ins while it is deferred (:attr:`Deferred.callables`)
_CALLABLES: dict[str, frozenset[str]] = {}


class DeferredModule(importlib.util._LazyModule):  # type: ignore[name-defined,misc]
    """A module that runs on its first use (``LazyLoader``'s, see the module docstring), except for the
    :data:`METADATA` attributes and the stand-ins of its deferred callables (:data:`_CALLABLES`)."""

    def __getattribute__(self, attr: str) -> Any:
        if attr in METADATA:
            return types.ModuleType.__getattribute__(self, attr)
        if attr in _CALLABLES.get(types.ModuleType.__getattribute__(self, "__spec__").name, ()):
            return _stand_in(self, attr)
        return super().__getattribute__(attr)


def _load(module: types.ModuleType, attr: str) -> Any:
    """Attribute ``attr`` of ``module``, running the module first if it is still deferred."""
    if type(module) is DeferredModule:
        return importlib.util._LazyModule.__getattribute__(module, attr)  # type: ignore[attr-defined]
    return getattr(module, attr)


def _stand_in(module: types.ModuleType, name: str) -> Callable[..., Any]:
    """A function that runs ``module`` on its first call and calls its attribute ``name`` with the same
    arguments (for a from-import that happened while the module was deferred)."""
    spec = types.ModuleType.__getattribute__(module, "__spec__")

    def call(*args: Any, **kwargs: Any) -> Any:
        real = _load(module, name)
        call.__wrapped__ = real  # type: ignore[attr-defined]
        return real(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = spec.name
    call.__doc__ = f"{spec.name}.{name}, imported on its first call (normaudit.lazy_imports)"
    return call


def _find_spec(name: str) -> Optional[importlib.machinery.ModuleSpec]:
    """The spec of ``name`` found without importing anything (a submodule: through its parent's spec, with the
    parent not imported); None when it is not installed or cannot be found so."""
    parent, _, child = name.rpartition(".")
    try:
        if not parent:
            return importlib.util.find_spec(name)
        parent_spec = _find_spec(parent)
        if parent_spec is None or not parent_spec.submodule_search_locations:
            return None
        return importlib.machinery.PathFinder.find_spec(name, list(parent_spec.submodule_search_locations))
    except (ImportError, ValueError, AttributeError):
        return None


def defer(entry: Deferred) -> bool:
    """Put ``entry.module`` in ``sys.modules`` as a :class:`DeferredModule`; False (nothing done) when it or
    its parent package is already imported, it is not installed, or its loader cannot run lazily."""
    name = entry.module
    if name in sys.modules or name.rpartition(".")[0] in sys.modules:
        return False
    spec = _find_spec(name)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return False
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    _CALLABLES[name] = frozenset(entry.callables)
    loader.exec_module(module)  # the module's class is now LazyLoader's
    module.__class__ = DeferredModule
    sys.modules[name] = module
    return True


def install(entries: tuple[Deferred, ...] = DEFERRED) -> list[str]:
    """Defer every module of ``entries`` that :func:`defer` can (only in normaudit's own process: see the
    module docstring); the names deferred."""
    return [e.module for e in entries if defer(e)]
