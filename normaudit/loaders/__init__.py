"""Target loading: turn what the user names into a model ready to capture. Each target kind has its own
module; :func:`load_model` dispatches on the target's shape:

- ``model.py`` / ``model.py:factory`` (or an existing extension-less file): :mod:`normaudit.loaders.pyfile`;
- ``package.module:factory`` (or ``package.module``, factory ``build_model``), importable from the
  current directory or the environment: :func:`load_module_target`;
- a directory holding ``config.json``, or a bare ``*.json`` config: :mod:`normaudit.loaders.hf`;
- a checkpoint (``.safetensors``, ``.pt``, ``.pth``, ``.bin``, ``.ckpt``, ``*.index.json``, or a
  directory of weights without ``config.json``): :func:`load_checkpoint_target`;
- an ONNX file (``.onnx``): :func:`normaudit.loaders.onnx_file.onnx_target`;
- a GGUF file (``.gguf``): :func:`normaudit.loaders.gguf_file.gguf_target`;
- a Hugging Face hub id ``org/name[@revision]`` that is no existing path: its snapshot folder in the local cache
  (:mod:`normaudit.loaders.hub`), loaded as above; nothing is downloaded.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Optional

from normaudit.errors import UsageError

from normaudit.loaders.model import CHECKPOINT_SUFFIXES, ModelUnderAudit  # noqa: F401 - the loaders' API

_MODULE_SPEC = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)(?::([A-Za-z_]\w*))?$")


def is_checkpoint_path(path: Path) -> bool:
    """True for a checkpoint file name (``.safetensors``, ``.pt``, ``.pth``, ``.bin``, ``.ckpt``, a sharded
    ``*.index.json``) or a directory of weights without a ``config.json``."""
    name = path.name.lower()
    if name.endswith(".index.json") or path.suffix.lower() in CHECKPOINT_SUFFIXES:
        return True
    if path.is_dir() and not (path / "config.json").is_file():
        from normaudit.loaders.hf import weight_files

        return bool(weight_files(path))
    return False


def load_checkpoint_target(path: Path) -> ModelUnderAudit:
    """Checkpoint-only targets (no model code): :func:`normaudit.loaders.checkpoint.checkpoint_target`."""
    from normaudit.loaders.checkpoint import checkpoint_target

    return checkpoint_target(path)


def _broken_link(path: Path) -> str:
    """Why a symbolic link does not lead to a file: a loop of links, or a dangling one."""
    try:
        path.resolve(strict=True)
    except RuntimeError:
        return "symbolic link loop (the link leads back to itself), not a file"
    except OSError as err:
        if getattr(err, "errno", None) == 40:  # ELOOP
            return "symbolic link loop (the link leads back to itself), not a file"
    return f"dangling symbolic link to {os.readlink(path)!r}: no such file"


def load_model(target: str, max_params: Optional[int] = None) -> ModelUnderAudit:
    """Build the model named by ``target`` (see the module docstring); a model factory that must be built with
    real weights may allocate at most ``max_params`` elements (``--max-params``, default
    :data:`normaudit.options.DEFAULT_MAX_PARAMS`). Raises UsageError for bad targets."""
    from normaudit.loaders.pyfile import load_python_target, split_target

    path, _ = split_target(target)
    if path.is_symlink() and not path.exists():
        raise UsageError(_broken_link(path), file=str(path))
    if path.suffix == ".py" and not path.exists():
        raise UsageError("no such file or directory", file=str(path))
    if path.suffix == ".py" or (path.is_file() and path.suffix == ""):
        loaded = load_python_target(target, max_params)
        return ModelUnderAudit(model=loaded.model, inputs=loaded.inputs, on_meta=loaded.on_meta, kind="python",
                               factory=loaded.factory, origins=loaded.origins, file=loaded.file,
                               notes=list(loaded.notes), build_fn=getattr(loaded.module, loaded.factory, None))
    if path.exists() and not path.is_file() and not path.is_dir():  # a FIFO, a device, a socket: never opened
        from normaudit.loaders.safe_read import require_regular_file

        require_regular_file(path, "target")
    if path.exists():
        from normaudit.phases import phase

        if path.suffix.lower() == ".gguf" and not path.is_dir():
            from normaudit.loaders.gguf_file import gguf_target

            phase("checkpoint")
            return gguf_target(path)
        if is_checkpoint_path(path):
            phase("checkpoint")
            return load_checkpoint_target(path)
        if path.suffix.lower() == ".onnx" and not path.is_dir():
            from normaudit.loaders.onnx_file import onnx_target

            return onnx_target(path)
        if path.is_dir() or path.suffix.lower() == ".json":
            from normaudit.loaders.hf import load_hf_target

            phase("build")
            return load_hf_target(path)
        raise UsageError("unsupported target: give a model .py file (model.py or model.py:factory), a directory "
                         "with a Hugging Face config.json, a config.json, or package.module:factory", file=str(path))
    from normaudit.loaders.hub import is_hub_id, load_hub_target

    if is_hub_id(target):  # a path that exists was dispatched above: a path always wins over an id
        return load_hub_target(target, lambda entry: load_model(entry, max_params))
    m = _MODULE_SPEC.match(target)
    if m and (":" in target or "." in target) and "/" not in target and "\\" not in target:
        return load_module_target(m.group(1), m.group(2) or "build_model", max_params)
    raise UsageError("no such file or directory", file=str(path))


@contextlib.contextmanager
def _cwd_on_path():
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def load_module_target(module_name: str, factory: str, max_params: Optional[int] = None) -> ModelUnderAudit:
    """Import ``module_name`` (from the current directory or the environment) and call ``factory()`` as for a
    model file: on the meta device where possible (else for real, at most ``max_params`` elements), with an
    optional ``example_inputs()`` in the module.

    Nothing is written into the user's tree (no ``__pycache__``). Raises UsageError when the module cannot be
    found or imported, or the factory is missing or fails.
    """
    from normaudit.loaders.pyfile import build_from_module, keep_recursion_limit, safe_str, user_error
    from normaudit.phases import in_worker, phase

    phase("import")
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        with _cwd_on_path():
            try:
                spec = importlib.util.find_spec(module_name)
            except (ImportError, ValueError) as err:
                spec = None
                reason = f"{type(err).__name__}: {err}"
            else:
                reason = f"no module named {module_name!r}"
            if spec is None:
                raise UsageError(f"no such file, and no importable module {module_name!r} ({reason})",
                                 file=module_name)
            origin = Path(spec.origin) if spec.origin and spec.origin not in ("built-in", "frozen") else None
            try:
                with keep_recursion_limit():
                    module = importlib.import_module(module_name)
            except BaseException as exc:  # noqa: BLE001 - user code may raise anything
                if isinstance(exc, KeyboardInterrupt) and not in_worker():
                    raise
                if origin is None:
                    raise UsageError(f"import failed: {type(exc).__name__}: {safe_str(exc)}", file=module_name) from exc
                raise user_error(exc, origin, "import failed") from exc
    finally:
        sys.dont_write_bytecode = old
    where = Path(getattr(module, "__file__", None) or module_name)
    fn = getattr(module, factory, None)
    if fn is None or not callable(fn):
        raise UsageError(f"no callable {factory}() in module {module_name} (define one, or name it as "
                         f"{module_name}:NAME)", file=str(where))
    model, inputs, on_meta, origins, notes = build_from_module(module, fn, factory, where, max_params)
    return ModelUnderAudit(model=model, inputs=inputs, on_meta=on_meta, kind="python",
                           factory=f"{module_name}:{factory}", origins=origins, file=str(where.resolve()),
                           notes=notes, build_fn=fn)
