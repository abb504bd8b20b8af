"""Load a model from a Python file by the CONTRACT convention.

``model.py`` (factory ``build_model``) or ``model.py:factory``; an optional ``example_inputs()`` returns a
tuple of positional inputs or a dict of keyword inputs. Import and build failures become
:class:`~normaudit.errors.UsageError` naming the user's file and line, the exception and, where the failing
frame is inside ``torch.nn``, the module class that raised (``GroupNorm``).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import torch
from torch import nn

from normaudit.errors import UsageError
from normaudit.report import SourceLocation


@dataclass
class LoadedModel:
    """A model built from user code.

    ``on_meta`` is True when the model was built under ``torch.device("meta")`` (no weight memory);
    ``inputs`` is None when the file has no ``example_inputs()``.
    """

    model: nn.Module
    inputs: Any
    on_meta: bool
    file: str
    factory: str
    module: Optional[ModuleType] = None
    origins: dict = field(default_factory=dict)


def split_target(spec: str) -> tuple[Path, Optional[str]]:
    """Split ``path.py:factory`` into the path and the factory name (None when absent)."""
    if ":" in spec:
        head, _, tail = spec.rpartition(":")
        if head.endswith(".py") and tail.isidentifier():
            return Path(head), tail
    return Path(spec), None


def user_error(exc: BaseException, user_file: Path, what: str) -> UsageError:
    """Turn an exception raised by user code into a one-line :class:`UsageError`.

    The line is the deepest frame inside ``user_file`` (else the deepest frame outside torch); the
    message names the exception type and text and, when a frame inside ``torch.nn`` belongs to an
    ``nn.Module`` method, that module's class.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    user_file = user_file.resolve()
    line = None
    for fr in frames:
        try:
            if Path(fr.filename).resolve() == user_file:
                line = fr.lineno
        except OSError:
            continue
    if line is None and isinstance(exc, SyntaxError) and exc.filename:
        if Path(exc.filename).resolve() == user_file:
            line = exc.lineno
    module_class = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        fname = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/nn/" in fname:
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module):
                module_class = type(owner).__name__
        tb = tb.tb_next
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = f"{what}: {type(exc).__name__}: {text}" if text else f"{what}: {type(exc).__name__}"
    if module_class:
        message += f" (raised in torch.nn {module_class})"
    return UsageError(message, file=str(user_file), line=line)


def import_file(path: Path) -> ModuleType:
    """Import ``path`` as a fresh module without writing ``__pycache__`` into the user's tree.

    Raises UsageError when the file is missing or its import raises.
    """
    if not path.is_file():
        raise UsageError("no such file", file=str(path))
    resolved = path.resolve()
    name = "normaudit_target_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise UsageError("cannot be imported as a Python module", file=str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    old_dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    sys.path.insert(0, str(resolved.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything
        sys.modules.pop(name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise user_error(exc, resolved, "import failed") from exc
    finally:
        sys.dont_write_bytecode = old_dont_write
        with contextlib.suppress(ValueError):
            sys.path.remove(str(resolved.parent))
    return module


def _caller_location() -> Optional[SourceLocation]:
    """The innermost stack frame outside torch and normaudit: where user code constructed a module."""
    frame = sys._getframe(2)
    while frame is not None:
        fname = frame.f_code.co_filename.replace("\\", "/")
        if "/torch/" not in fname and "/normaudit/" not in fname and not fname.startswith("<"):
            return SourceLocation(file=frame.f_code.co_filename, line=frame.f_lineno)
        frame = frame.f_back
    return None


@contextlib.contextmanager
def record_origins(origins: dict[int, SourceLocation]):
    """Record, for every submodule registered while the block runs, the user line that constructed it
    (``id(module) -> SourceLocation``), through torch's global module registration hook."""
    def hook(module, name, submodule):
        if isinstance(submodule, nn.Module) and id(submodule) not in origins:
            loc = _caller_location()
            if loc is not None:
                origins[id(submodule)] = loc

    handle = torch.nn.modules.module.register_module_module_registration_hook(hook)
    try:
        yield origins
    finally:
        handle.remove()


def _call(fn: Callable[[], Any], path: Path, what: str, meta: bool) -> Any:
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        if meta:
            with torch.device("meta"):
                return fn()
        return fn()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        raise user_error(exc, path, what) from exc
    finally:
        sys.dont_write_bytecode = old


def build_from_module(module: ModuleType, fn: Callable[[], Any], factory: str, where: Path
                      ) -> tuple[nn.Module, Any, bool, dict[int, SourceLocation]]:
    """Call the factory (on the meta device when it allows it, else for real) and ``example_inputs()``.

    Returns ``(model, inputs or None, on_meta, origins)``. Raises UsageError naming ``where`` when the
    factory or ``example_inputs()`` raise or return the wrong type.
    """
    on_meta = True
    origins: dict[int, SourceLocation] = {}
    try:
        with record_origins(origins):
            model = _call(fn, where, f"{factory}() failed", meta=True)
        if isinstance(model, nn.Module) and _has_meta_mixed(model):
            raise RuntimeError("meta build mixed devices")
    except (UsageError, RuntimeError):
        # The factory may need real tensors (data-dependent init); build for real. If it fails again
        # the error is the user's and names their line.
        on_meta = False
        origins.clear()
        with record_origins(origins):
            model = _call(fn, where, f"{factory}() failed", meta=False)
    if not isinstance(model, nn.Module):
        raise UsageError(f"{factory}() returned {type(model).__name__}, not a torch.nn.Module", file=str(where))
    inputs = None
    ex = getattr(module, "example_inputs", None)
    if callable(ex):
        inputs = _call(ex, where, "example_inputs() failed", meta=False)
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if isinstance(inputs, list):
            inputs = tuple(inputs)
        if not isinstance(inputs, (tuple, dict)):
            raise UsageError(f"example_inputs() returned {type(inputs).__name__}; return a tuple or a dict",
                             file=str(where))
    return model, inputs, on_meta, origins


def load_python_target(spec: str) -> LoadedModel:
    """Import the file, build the model (on the meta device when the factory allows it) and its inputs.

    Raises UsageError when the file cannot be imported, the factory is missing or not callable, it does
    not return an ``nn.Module``, or ``build_model()``/``example_inputs()`` raise.
    """
    path, factory = split_target(spec)
    factory = factory or "build_model"
    module = import_file(path)
    fn = getattr(module, factory, None)
    if fn is None or not callable(fn):
        raise UsageError(f"no callable {factory}() (define one, or name the factory as FILE.py:NAME)",
                         file=str(path))
    model, inputs, on_meta, origins = build_from_module(module, fn, factory, path)
    return LoadedModel(model=model, inputs=inputs, on_meta=on_meta, file=str(path.resolve()),
                       factory=factory, module=module, origins=origins)


def _has_meta_mixed(model: nn.Module) -> bool:
    """True when some tensors of a meta-built model are not on meta (a factory that loads real data)."""
    devices = {t.device.type for t in list(model.parameters()) + list(model.buffers())}
    return len(devices) > 1
