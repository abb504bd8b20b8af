"""Load a model from a Python file by the CONTRACT convention.

``model.py`` (factory ``build_model``) or ``model.py:factory``; an optional ``example_inputs()`` returns a
tuple of positional inputs or a dict of keyword inputs. A file in a package (an ``__init__.py`` beside it)
is imported as part of the package, by its dotted name (:func:`import_plan`), so its relative imports work.
Import and build failures become :class:`~normaudit.errors.UsageError` naming the user's file and line, the
exception and, where the failing frame is inside ``torch.nn``, the module class that raised (``GroupNorm``).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import re
import site
import sys
import sysconfig
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import torch
from torch import nn

from normaudit.errors import UsageError
from normaudit.loaders.allocation_cap import AllocationCap, refusal_text
from normaudit.loaders.safe_read import require_regular_file
from normaudit.options import DEFAULT_MAX_PARAMS, split_target  # noqa: F401 - in torch-free options for the CLI; imported from here too
from normaudit.report import SourceLocation
from normaudit.phases import in_worker, phase


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
    notes: list[str] = field(default_factory=list)


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
    nn_root = _package_root(torch) / "nn"
    while tb is not None:
        frame = tb.tb_frame
        if _under(_resolved(frame.f_code.co_filename), (nn_root,)):
            owner = frame.f_locals.get("self")
            if isinstance(owner, nn.Module):
                module_class = type(owner).__name__
        tb = tb.tb_next
    text = safe_str(exc)
    message = f"{what}: {type(exc).__name__}: {text}" if text else f"{what}: {type(exc).__name__}"
    if module_class:
        message += f" (raised in torch.nn {module_class})"
    return UsageError(message, file=str(user_file), line=line)


def safe_str(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``str(exc)``, at most ``limit`` characters; an exception whose ``__str__`` itself
    raises (user code may define anything) is described instead of letting that second error escape."""
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ of user code
        return f"(its message cannot be shown: {type(exc).__name__}.__str__ raised)"
    text = text.strip().splitlines()[0] if text.strip() else ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextlib.contextmanager
def keep_recursion_limit():
    """Undo a lowered recursion limit (``sys.setrecursionlimit(50)`` in a model file) once user code returns,
    so normaudit's own code keeps the interpreter's limit; a raised limit is kept (the model may need it)."""
    saved = sys.getrecursionlimit()
    try:
        yield
    finally:
        if sys.getrecursionlimit() < saved:
            sys.setrecursionlimit(saved)


@dataclass(frozen=True)
class ImportPlan:
    """How a model file is imported, as plain Python or pytest (``importmode=prepend``) would.

    ``path``: the file, resolved. ``package``: the dotted name of the package it belongs to (its folder has
    an ``__init__.py``; the root is found by walking up the ``__init__.py`` files, as pytest does) or None
    for a loose file. ``module_name``: the name it is imported under (``mypkg.model``; a hashed private name
    for a loose file). ``search_paths``: what goes on ``sys.path`` (in this order) for the import and the
    whole audit: for a package, the parent of the package root (so its name finds this package before a
    module of that name beside the file); then the file's folder (``python model.py`` puts it there).
    """

    path: Path
    module_name: str
    package: Optional[str]
    search_paths: tuple[str, ...]


def import_plan(path: Path) -> ImportPlan:
    """The :class:`ImportPlan` of the model file ``path`` (which must exist). A folder whose name is no Python
    identifier ends the package (it cannot be imported by name), as does a file stem that is none."""
    resolved = path.resolve()
    parts = [] if resolved.name == "__init__.py" else [resolved.stem]
    root = resolved.parent
    while (root / "__init__.py").is_file() and root.name.isidentifier():
        parts.insert(0, root.name)
        root = root.parent
    in_package = len(parts) > 1 or (resolved.name == "__init__.py" and bool(parts))
    if not in_package or not all(p.isidentifier() for p in parts):
        name = "normaudit_target_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
        return ImportPlan(resolved, name, None, (str(resolved.parent),))
    package = ".".join(parts if resolved.name == "__init__.py" else parts[:-1])
    paths = (str(root), str(resolved.parent))
    return ImportPlan(resolved, ".".join(parts), package, paths)


def target_search_paths(target: str) -> tuple[str, ...]:
    """The ``sys.path`` entries the audit of ``target`` keeps for all its phases (build, inputs, capture,
    probes), so imports inside ``build_model()`` or ``forward`` find what a module-level import finds: those
    of :func:`import_plan` for a model file; the current directory for a ``package.module:factory`` target
    (when ``''`` is not on ``sys.path``); nothing for other targets."""
    path, _ = split_target(target)
    if path.suffix == ".py" or (path.is_file() and path.suffix == ""):
        return import_plan(path).search_paths if path.is_file() else ()
    if not path.exists() and "/" not in target and "\\" not in target and "" not in sys.path:
        return (os.getcwd(),)
    return ()


@contextlib.contextmanager
def on_sys_path(paths: tuple[str, ...]):
    """Put ``paths`` first on ``sys.path`` (in that order) while the block runs; afterwards one occurrence of
    each is removed again (the user's code may have added or removed entries meanwhile: theirs are kept)."""
    sys.path[0:0] = list(paths)
    try:
        yield
    finally:
        for p in paths:
            with contextlib.suppress(ValueError):
                sys.path.remove(p)


def _package_clash(plan: ImportPlan) -> Optional[str]:
    """Why the package of ``plan`` cannot be imported by name: a module of the same top-level name already
    imported from elsewhere (None when there is none)."""
    top = plan.module_name.split(".")[0]
    mod = sys.modules.get(top)
    if mod is None:
        return None
    root = Path(plan.search_paths[0]) / top
    locations = [Path(p).resolve() for p in getattr(mod, "__path__", None) or []]
    if root.resolve() in locations:
        return None
    where = getattr(mod, "__file__", None) or "elsewhere"
    return f"package {top!r} is already imported from {where}"


def import_file(path: Path) -> ModuleType:
    """Import ``path`` as a fresh module without writing ``__pycache__`` into the user's tree; a file inside
    a package (:func:`import_plan`) is imported as part of it, its package first, so relative imports work.

    Raises UsageError when the file is missing or its import raises.
    """
    if not path.is_file():
        if os.path.lexists(path):  # a FIFO, a device (a link to /dev/zero), a directory: say which
            require_regular_file(path, "model file")
        raise UsageError("no such file", file=str(path))
    plan = import_plan(path)
    clash = _package_clash(plan) if plan.package else None
    if clash:
        plan = ImportPlan(plan.path, "normaudit_target_" + hashlib.sha1(str(plan.path).encode()).hexdigest()[:12],
                          None, plan.search_paths[1:])
    old_dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    phase("import")
    try:
        with on_sys_path(plan.search_paths), keep_recursion_limit():
            return _exec_plan(plan)
    except UsageError:
        raise
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything
        if isinstance(exc, KeyboardInterrupt) and not in_worker():
            raise
        err = user_error(exc, plan.path, "import failed")
        if clash and isinstance(exc, ImportError) and "relative import" in safe_str(exc):
            err = UsageError(f"{err.message} ({clash})", file=err.file, line=err.line)
        raise err from exc
    finally:
        sys.dont_write_bytecode = old_dont_write


def _exec_plan(plan: ImportPlan) -> ModuleType:
    """Execute the file of ``plan`` as a fresh module named ``plan.module_name``, its package imported first
    as the import system does. A module the package's ``__init__.py`` itself just imported from this file is
    used as it is (executing it twice would make two copies of its classes); one left in ``sys.modules`` by
    an earlier audit in this process is executed again (the file may have changed since)."""
    is_init = plan.path.name == "__init__.py"
    if plan.package and not is_init:
        stale = plan.module_name in sys.modules
        importlib.import_module(plan.package)
        done = sys.modules.get(plan.module_name)
        if not stale and done is not None and _resolved(getattr(done, "__file__", None) or "") == plan.path:
            return done
    locations = [str(plan.path.parent)] if is_init else None
    spec = importlib.util.spec_from_file_location(plan.module_name, plan.path, submodule_search_locations=locations)
    if spec is None or spec.loader is None:
        raise UsageError("cannot be imported as a Python module", file=str(plan.path))
    module = importlib.util.module_from_spec(spec)
    previous = sys.modules.get(plan.module_name)
    sys.modules[plan.module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if previous is not None:
            sys.modules[plan.module_name] = previous
        else:
            sys.modules.pop(plan.module_name, None)
        raise
    if plan.package and not is_init:
        setattr(sys.modules[plan.package], plan.module_name.rpartition(".")[2], module)
    return module


# ------------------------------------------------------------------------------- whose code is this frame?
def _resolved(filename: str) -> Optional[Path]:
    """``filename`` of a code object as a resolved path, or None for ``<string>``-like pseudo files."""
    if not filename or filename.startswith("<"):
        return None
    return _resolve_cached(filename)


@functools.lru_cache(maxsize=4096)
def _resolve_cached(filename: str) -> Optional[Path]:
    try:
        return Path(filename).resolve()
    except (OSError, RuntimeError, ValueError):
        return None


@functools.lru_cache(maxsize=8192)  # per constructed module and stack frame: a deep model asks thousands of times
def _under(path: Optional[Path], roots: tuple[Path, ...]) -> bool:
    """``path`` is one of ``roots`` or inside one (by path components; pure, so cached)."""
    return path is not None and any(path == r or r in path.parents for r in roots)


def _package_root(module: ModuleType) -> Path:
    return Path(module.__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def tool_roots() -> tuple[Path, ...]:
    """The real directories of the installed normaudit and torch packages (their frames are never user code)."""
    import normaudit

    return (_package_root(normaudit), _package_root(torch))


@functools.lru_cache(maxsize=1)
def installed_roots() -> tuple[Path, ...]:
    """Where the interpreter keeps code that is not the user's: normaudit, torch, the standard library,
    site-packages (``sysconfig`` paths ``stdlib``, ``platstdlib``, ``purelib``, ``platlib``, ``scripts``,
    ``site.getsitepackages()``, the user site), resolved."""
    paths = sysconfig.get_paths()
    raw = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")]
    with contextlib.suppress(AttributeError):  # virtualenv's old site module
        raw += list(site.getsitepackages()) + [site.getusersitepackages()]
    roots = list(tool_roots())
    for r in raw:
        if r and os.path.isdir(r):
            roots.append(Path(r).resolve())
    return tuple(dict.fromkeys(roots))


def is_user_file(filename: str, target: Optional[Path] = None) -> bool:
    """True when code in ``filename`` is the user's: the target file itself; files in the target's directory
    (its local imports, even when the target is an installed package) outside normaudit and torch; and any
    file outside every installation root (:func:`installed_roots`). Decided by the files' real paths, never
    by a substring of them, so a checkout named ``normaudit`` or ``torch`` is still the user's."""
    path = _resolved(filename)
    if path is None:
        return False
    if target is not None:
        target = _resolve_cached(str(target)) or target
        if path == target:
            return True
        if (target.parent not in installed_roots() and _under(path, (target.parent,))
                and not _under(path, tool_roots())):
            return True
    return not _under(path, installed_roots())


def is_tool_file(filename: str) -> bool:
    """True for code of normaudit or torch themselves (by their installed roots) and for ``<...>`` pseudo
    files: frames a recorded stack trace skips to reach the model's code."""
    path = _resolved(filename)
    return path is None or _under(path, tool_roots())


#: One frame of a formatted stack trace (``traceback.format_list``, as fx records it in ``node.meta["stack_trace"]``):
#: ``  File "<name>", line <n>, in <function>`` and, where the source was found, the code line after it. The name
#: may hold any character a path can, a newline or a quote included, so it ends at the last ``", line <n>, in ``
#: of its frame, not at the first quote or at the end of a line.
_FRAME = re.compile(r'^ *File "(?P<file>.*?)", line (?P<line>\d+), in [^\n]*(?:\n(?P<code>(?! *File ")[^\n]*))?',
                    re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class TraceFrame:
    """One frame of a recorded stack trace: the file as Python named it, its 1-based line and the stripped
    source text of that line ('' where the trace holds none)."""

    file: str
    line: int
    code: str


def trace_frames(stack_trace: Optional[str], user_only: bool = True) -> list[TraceFrame]:
    """The frames of a stack trace as fx records it (``node.meta["stack_trace"]``), outermost first; with
    ``user_only`` the frames of torch and normaudit (:func:`is_tool_file`) are left out. A file name with a
    newline or a quote in it is one frame (the traceback module writes names unescaped); text that is not a
    frame is skipped, never an error."""
    frames = []
    for m in _FRAME.finditer(stack_trace or ""):
        name = m.group("file")
        if user_only and is_tool_file(name):
            continue
        frames.append(TraceFrame(file=name, line=int(m.group("line")), code=(m.group("code") or "").strip()))
    return frames


def _caller_location(target: Optional[Path] = None) -> Optional[SourceLocation]:
    """The innermost stack frame in user code (:func:`is_user_file`): where user code constructed a module."""
    frame = sys._getframe(2)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename, target):
            return SourceLocation(file=frame.f_code.co_filename, line=frame.f_lineno)
        frame = frame.f_back
    return None


@contextlib.contextmanager
def record_origins(origins: dict[int, SourceLocation], target: Optional[Path] = None):
    """Record, for every submodule registered while the block runs, the user line that constructed it
    (``id(module) -> SourceLocation``), through torch's global module registration hook. ``target`` is the
    model file (or the factory's file) whose directory counts as user code (:func:`is_user_file`)."""
    def hook(module, name, submodule):
        if isinstance(submodule, nn.Module) and id(submodule) not in origins:
            loc = _caller_location(target)
            if loc is not None:
                origins[id(submodule)] = loc

    handle = torch.nn.modules.module.register_module_module_registration_hook(hook)
    try:
        yield origins
    finally:
        handle.remove()


# ------------------------------------------------------------------------------------ building user models
#: Factories whose size comes from Python scalars (schedules, constants): under a meta build they still make
#: small CPU tensors, so ``[x.item() for x in torch.linspace(0, 0.1, depth)]`` (timm's drop-path rates) works.
_SCALAR_FACTORIES = frozenset(f for f in (torch.linspace, torch.logspace, torch.arange, torch.tensor,
                                          torch.as_tensor, torch.scalar_tensor) if f is not None)
_TO_DEVICE = frozenset({torch.Tensor.cuda, torch.Tensor.to})
_ACCELERATORS = ("cuda", "mps", "xpu", "hpu", "npu")


def _is_accelerator(device: Any) -> bool:
    if isinstance(device, int):  # .cuda(0)
        return True
    if isinstance(device, (str, torch.device)):
        with contextlib.suppress(RuntimeError, TypeError):
            return torch.device(device).type in _ACCELERATORS
    return False


def _only_python_numbers(data: Any) -> bool:
    if isinstance(data, (bool, int, float)):
        return True
    return isinstance(data, (list, tuple)) and all(_only_python_numbers(d) for d in data)


class BuildMode(torch.overrides.TorchFunctionMode):
    """The device policy while a factory builds the model (a ``TorchFunctionMode`` inside the meta device
    context, so it sees each call first):

    - ``.cuda()``, ``.to('cuda')`` and ``device='cuda'`` (or ``mps``/``xpu``...) are kept where the build
      happens (meta, or CPU): the audit captures on fake CPU tensors. Each request is recorded in
      ``accelerator_requests``.
    - on a meta build (``meta=True``), the scalar factories of :data:`_SCALAR_FACTORIES` without an explicit
      device make CPU tensors (drop-path schedules, constants read with ``.item()``); parameters and the rest
      stay on meta.
    """

    def __init__(self, meta: bool):
        super().__init__()
        self.meta = meta
        self.accelerator_requests: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _TO_DEVICE:
            return self._keep_device(func, args, kwargs)
        if _is_accelerator(kwargs.get("device")):
            self.accelerator_requests.append(f"device={str(kwargs['device'])!r}")
            kwargs["device"] = "meta" if self.meta else "cpu"
        elif (self.meta and func in _SCALAR_FACTORIES and "device" not in kwargs
              and (func not in (torch.tensor, torch.as_tensor) or _only_python_numbers(args[0] if args else None))):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)

    def _keep_device(self, func, args, kwargs):
        """``Tensor.cuda(...)`` is the tensor itself; ``Tensor.to(...)`` keeps the dtype part only."""
        if func is torch.Tensor.cuda:
            self.accelerator_requests.append(".cuda()")
            return args[0]
        rest = list(args[1:])
        if rest and _is_accelerator(rest[0]):
            self.accelerator_requests.append(f".to({str(rest[0])!r})")
            rest[0] = args[0].device
        if _is_accelerator(kwargs.get("device")):
            self.accelerator_requests.append(f".to(device={str(kwargs['device'])!r})")
            kwargs["device"] = args[0].device
        return func(args[0], *rest, **kwargs)


def _call(fn: Callable[[], Any], path: Path, what: str, mode: Optional[BuildMode] = None,
          cap: Optional[AllocationCap] = None) -> Any:
    """Call user code ``fn`` (under ``torch.device('meta')`` and ``mode`` when ``mode.meta``, under the
    allocation ``cap`` when given); any exception it raises, ``SystemExit`` included, becomes a UsageError
    naming ``path`` (KeyboardInterrupt too in a worker)."""
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        with keep_recursion_limit(), contextlib.ExitStack() as stack:
            if mode is not None and mode.meta:
                stack.enter_context(torch.device("meta"))
            if mode is not None:
                stack.enter_context(mode)
            if cap is not None:
                stack.enter_context(cap)
            return fn()
    except KeyboardInterrupt as exc:
        if not in_worker():
            raise
        raise user_error(exc, path, what) from exc
    except BaseException as exc:  # noqa: BLE001
        raise user_error(exc, path, what) from exc
    finally:
        sys.dont_write_bytecode = old


@dataclass
class Build:
    """A model built from a factory: ``on_meta`` False when it had to be built with real weights
    (``meta_error`` says why); ``notes`` go into the report."""

    model: nn.Module
    on_meta: bool
    origins: dict[int, SourceLocation]
    notes: list[str] = field(default_factory=list)
    meta_error: Optional[str] = None


def build_model_from(fn: Callable[[], Any], factory: str, where: Path, max_params: Optional[int] = None) -> Build:
    """Call the factory on the meta device (no weight memory) when it allows it, else for real; both under
    :class:`BuildMode`. A real build is said in the notes and on stderr with the bytes its parameters and
    buffers take; it may create at most ``max_params`` elements of tensors (default
    :data:`normaudit.options.DEFAULT_MAX_PARAMS`), each counted before it is allocated
    (:class:`~normaudit.loaders.allocation_cap.AllocationCap`). Raises UsageError naming ``where`` when the
    factory fails, returns no ``nn.Module``, or its real build would pass that cap (naming the size)."""
    origins: dict[int, SourceLocation] = {}
    mode = BuildMode(meta=True)
    meta_error = None
    try:
        with record_origins(origins, where):
            model = _call(fn, where, f"{factory}() failed", mode)
        if isinstance(model, nn.Module) and _has_meta_mixed(model):
            raise RuntimeError("some parameters are not on the meta device (the factory made or loaded real ones)")
    except (UsageError, RuntimeError) as err:
        # The factory may need real tensors (data-dependent init); build for real. If it fails again
        # the error is the user's and names their line.
        meta_error = _meta_cause(err, factory)
        mode = BuildMode(meta=False)
        model = _real_build(fn, factory, where, meta_error, origins, mode, max_params)
    if not isinstance(model, nn.Module):
        raise UsageError(f"{factory}() returned {type(model).__name__}, not a torch.nn.Module", file=str(where))
    build = Build(model=model, on_meta=meta_error is None, origins=origins, meta_error=meta_error)
    if mode.accelerator_requests:
        asked = ", ".join(dict.fromkeys(mode.accelerator_requests))
        build.notes.append(f"{factory}() asked for an accelerator ({asked}): the model was kept on "
                           f"{'the meta device' if build.on_meta else 'the CPU'} for the audit, which captures "
                           "on fake CPU tensors")
    if meta_error is not None:
        size = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
        note = (f"the model was materialised: {factory}() could not run on the meta device ({meta_error}), so it "
                f"was built with real weights: {_human_bytes(size)} of parameters and buffers")
        build.notes.append(note)
        print(f"normaudit: note: {_display(where)}: {note}", file=sys.stderr)
    return build


def _real_build(fn: Callable[[], Any], factory: str, where: Path, meta_error: str, origins: dict,
                mode: BuildMode, max_params: Optional[int]) -> Any:
    """The factory's second call, for real (it could not run on meta: ``meta_error``), under an
    :class:`AllocationCap` of ``max_params`` elements; a refused allocation is a UsageError naming its size,
    also when the user's code caught the refusal."""
    limit = DEFAULT_MAX_PARAMS if max_params is None else int(max_params)
    cap = AllocationCap(limit)
    origins.clear()
    try:
        with record_origins(origins, where):
            model = _call(fn, where, f"{factory}() failed", mode, cap)
    except UsageError:
        if cap.refused is None:
            raise
        model = None
    if cap.refused is not None:
        raise UsageError(f"{factory}() could not run on the meta device ({meta_error}), and building it with real "
                         f"weights was refused before allocating {refusal_text(cap.refused, limit)}: raise "
                         "--max-params to build it anyway", file=str(where))
    return model


def _meta_cause(err: BaseException, factory: str) -> str:
    """Why a meta build failed, for the note: the exception and the user's line, without the 'failed' prefix."""
    if isinstance(err, UsageError):
        text = err.message.removeprefix(f"{factory}() failed: ")
        return f"{text}, line {err.line}" if err.line else text
    return safe_str(err)


def _human_bytes(n: int) -> str:
    """``n`` bytes as ``'1536 bytes (1.5 KiB)'``, in binary units (KiB, MiB, GiB)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n} bytes ({n / size:.1f} {unit})"
    return f"{n} bytes"


def _display(path: Path) -> str:
    with contextlib.suppress(ValueError):
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel
    return str(path)


def build_from_module(module: ModuleType, fn: Callable[[], Any], factory: str, where: Path,
                      max_params: Optional[int] = None
                      ) -> tuple[nn.Module, Any, bool, dict[int, SourceLocation], list[str]]:
    """Build the model (:func:`build_model_from`, a real build capped at ``max_params`` elements) and call the
    module's ``example_inputs()`` if it has one.

    Returns ``(model, inputs or None, on_meta, origins, notes)``. Raises UsageError naming ``where`` when the
    factory or ``example_inputs()`` raise, return the wrong type or ``example_inputs`` is not a function.
    """
    phase("build")
    build = build_model_from(fn, factory, where, max_params)
    inputs = None
    ex = getattr(module, "example_inputs", None)
    if ex is not None and not callable(ex):
        raise UsageError(f"example_inputs is not a function (it is a {type(ex).__name__} object): define example_inputs() "
                         "returning a tuple or a dict of inputs", file=str(where))
    if ex is not None:
        phase("inputs")
        mode = BuildMode(meta=False)
        inputs = _call(ex, where, "example_inputs() failed", mode)
        if mode.accelerator_requests:
            asked = ", ".join(dict.fromkeys(mode.accelerator_requests))
            build.notes.append(f"example_inputs() asked for an accelerator ({asked}): the inputs were kept on the "
                               "CPU for the audit")
        inputs = as_example_inputs(inputs, str(where), "; return a tuple or a dict")
    return build.model, inputs, build.on_meta, build.origins, build.notes


def as_example_inputs(value: Any, where: Optional[str], refusal: str) -> Any:
    """What ``example_inputs()`` returned as the audit takes it: a tensor becomes a 1-tuple, a list a tuple, a
    tuple (positional inputs) or dict (keyword inputs) stays. Raises UsageError (file ``where``) for anything
    else, the message ``example_inputs() returned <type>`` followed by ``refusal``."""
    if isinstance(value, torch.Tensor):
        value = (value,)
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, (tuple, dict)):
        raise UsageError(f"example_inputs() returned {type(value).__name__}{refusal}", file=where)
    return value


def load_python_target(spec: str, max_params: Optional[int] = None) -> LoadedModel:
    """Import the file, build the model (on the meta device when the factory allows it, else for real with at
    most ``max_params`` elements: :func:`build_model_from`) and its inputs.

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
    model, inputs, on_meta, origins, notes = build_from_module(module, fn, factory, path, max_params)
    return LoadedModel(model=model, inputs=inputs, on_meta=on_meta, file=str(path.resolve()),
                       factory=factory, module=module, origins=origins, notes=notes)


def _has_meta_mixed(model: nn.Module) -> bool:
    """True when some parameters of a meta-built model are not on meta (a factory that loads real weights).
    Buffers may be real CPU tensors (a rotary ``inv_freq`` made from ``torch.arange``): they are kept."""
    return len({p.device.type for p in model.parameters()}) > 1
