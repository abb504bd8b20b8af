"""Configuration files the model is meant to follow (``--config``): JSON or YAML, HF ``config.json`` or a
training config. Parse errors are :class:`UsageError` with the file and line."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from normaudit.errors import UsageError


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a JSON or YAML mapping (``.json``: JSON, anything else: YAML), as untrusted input.

    Only a regular file of at most 64 MiB is read (a FIFO or device is refused before opening); nesting is
    bounded (100 levels), YAML builds plain data only (no ``!!python`` tags) and its aliases may expand to
    at most a million nodes (:mod:`normaudit.loaders.safe_read`); transformers 5's ``{"__float__":
    "Infinity"}`` reads as the float. Raises UsageError naming the file (and line) for any of these, bad
    syntax, or a document that is not a mapping.
    """
    from normaudit.loaders.safe_read import loads_json, loads_yaml, read_regular

    p = Path(path)
    if not os.path.lexists(p):
        raise UsageError("config file not found", file=str(p))
    raw = read_regular(p, "config")
    if p.suffix.lower() == ".json":
        data = loads_json(raw, "config", str(p))
    else:
        data = loads_yaml(raw.decode("utf-8", errors="replace"), "config", str(p))
    if not isinstance(data, dict):
        found = "an empty file" if data is None else f"a {type(data).__name__}"
        raise UsageError(f"config must be a mapping (key: value), found {found}", file=str(p))
    return _numbers(data)


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _numbers(value: Any) -> Any:
    """YAML 1.1 (PyYAML) reads ``1e-6`` (no dot in the mantissa) as a string: take such strings as the
    floats every other reader (JSON, Python, YAML 1.2) sees."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and _FLOAT.match(value.strip()):
        return float(value)
    return value


def model_config(model: Any) -> Optional[dict[str, Any]]:
    """The model's own configuration as a plain dict: the shallowest of :func:`model_configs` (the root's
    ``config``, ``args``, ``params``, ... attribute), or None when the model keeps none."""
    found = model_configs(model)
    return dict(found[0].data) if found else None


#: attribute names models keep their configuration under (Meta's Llama ``params: ModelArgs``, Lightning
#: ``hparams``, nanoGPT ``config``, ...), in order of preference; the checkpoint reader's names among them
CONFIG_ATTRS = ("config", "model_args", "args", "params", "cfg", "hparams", "hyper_parameters", "hp", "hps",
                "conf", "configs", "opt", "opts", "settings", "model_config", "model_cfg", "_config", "_cfg")
#: top-level packages whose configuration objects (and the models holding them) are a library's own
LIBRARY_PACKAGES = ("transformers", "diffusers", "timm", "torchvision", "open_clip", "mmcv", "mmdet", "mmseg",
                    "mmengine", "fairseq", "peft", "sentence_transformers", "ultralytics", "lightning")
_EPS_NAME = re.compile(r"(?:^|_)(?:eps|epsilon)(?:$|_)", re.IGNORECASE)
_SIMPLE = (int, float, str, bool, type(None))
_MAX_DEPTH = 4


@dataclass
class OwnConfig:
    """A configuration the model keeps itself: ``data`` (a plain dict) found as attribute ``attr`` of the
    submodule at ``path`` (``""``: the root; it governs the norms under ``path``). ``library``: the config
    object, or the module holding it, is a library's (:data:`LIBRARY_PACKAGES` or a file under
    site-packages: transformers ``PretrainedConfig``, diffusers ``ConfigMixin``'s ``config``, timm's
    ``pretrained_cfg``), whose code may keep another eps on purpose."""

    path: str
    attr: str
    data: dict[str, Any]
    library: bool

    @property
    def source(self) -> str:
        """Where, for messages: ``the model's own config (self.params)`` or ``... (encoder.args)``."""
        return f"the model's own config ({self.path or 'self'}.{self.attr})"


def model_configs(model: Any) -> list[OwnConfig]:
    """Every configuration the model keeps, on the root and on submodules, shallowest first.

    A configuration is an attribute holding a mapping, a dataclass, a namespace, a NamedTuple, an object with
    ``to_dict()`` (transformers) or a plain object, taken when it is under a name of :data:`CONFIG_ATTRS` or
    declares an eps key (``norm_eps``, ``rms_norm_eps``, ``layer_norm_epsilon``, ``eps``, ...). An object
    shared by a module and its submodules (transformers passes one config to every layer) is reported once,
    at the shallowest module. Never raises: a config that cannot be read is skipped.
    """
    import torch

    out: list[OwnConfig] = []
    held: dict[int, list[str]] = {}
    cache: dict[int, Optional[dict]] = {}
    try:
        modules = list(model.named_modules()) if isinstance(model, torch.nn.Module) else [("", model)]
    except Exception:  # noqa: BLE001 - a broken model is reported elsewhere
        return out
    for path, module in modules:
        for attr, obj in _config_attributes(module):
            if any(p == "" or path == p or path.startswith(p + ".") for p in held.get(id(obj), [])):
                continue
            if id(obj) not in cache:
                cache[id(obj)] = _as_dict(obj, 0, set())
            data = cache[id(obj)]
            if not data or (attr not in CONFIG_ATTRS and not _has_eps_key(data)):
                continue
            held.setdefault(id(obj), []).append(path)
            out.append(OwnConfig(path, attr, data, is_library(type(obj)) or is_library(type(module))))
    out.sort(key=lambda c: (c.path.count(".") + (c.path != ""), _attr_rank(c.attr)))
    return out


def _attr_rank(attr: str) -> int:
    return CONFIG_ATTRS.index(attr) if attr in CONFIG_ATTRS else len(CONFIG_ATTRS)


def _config_attributes(module: Any) -> list[tuple[str, Any]]:
    """(name, value) of the instance attributes of ``module`` that may hold a configuration."""
    try:
        items = list(vars(module).items())
    except TypeError:
        return []
    if "config" not in vars(module) and isinstance(getattr(type(module), "config", None), property):
        try:  # diffusers' ConfigMixin: ``config`` is a property over ``_internal_dict``
            items.append(("config", module.config))
        except Exception:  # noqa: BLE001 - a property of user code may raise anything
            pass
    return [(k, v) for k, v in items if (not k.startswith("_") or k in CONFIG_ATTRS) and _config_like(v)]


def _config_like(obj: Any) -> bool:
    """A mapping or an attribute bag, not a tensor, module, function, class or scalar (False for an object
    whose attributes raise)."""
    import types

    import torch

    try:
        if isinstance(obj, (torch.Tensor, torch.nn.Module, types.ModuleType, type, *_SIMPLE, list, tuple, set,
                            bytes)):
            return isinstance(obj, tuple) and hasattr(obj, "_asdict")
        if callable(obj) and not hasattr(obj, "to_dict"):
            return False
        return isinstance(obj, Mapping) or hasattr(obj, "__dict__")
    except Exception:  # noqa: BLE001 - user objects may raise anything from attribute access
        return False


def _as_dict(obj: Any, depth: int, seen: set) -> Optional[dict[str, Any]]:
    """A plain-dict copy of a config object: nested configs converted, other values kept when simple."""
    if depth > _MAX_DEPTH or id(obj) in seen:
        return None
    seen = seen | {id(obj)}
    try:
        if isinstance(obj, Mapping):
            raw = dict(obj.items())
        elif isinstance(obj, tuple) and hasattr(obj, "_asdict"):
            raw = dict(obj._asdict())
        elif callable(getattr(obj, "to_dict", None)):
            # before the dataclass fields: transformers 5's PretrainedConfig is a dataclass, and a subclass
            # written the classic way (attributes set in __init__) keeps its keys out of dataclasses.fields
            raw = obj.to_dict()
            if not isinstance(raw, Mapping):
                return None
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            raw = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        else:
            cls_defaults = {k: v for k, v in vars(type(obj)).items()
                            if not k.startswith("_") and isinstance(v, _SIMPLE)}
            raw = {**cls_defaults, **{k: v for k, v in vars(obj).items() if not k.startswith("_")}}
    except Exception:  # noqa: BLE001 - user config objects may raise anything
        return None
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            continue
        if isinstance(value, _SIMPLE):
            out[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, _SIMPLE) for v in value):
            out[key] = list(value)
        elif _config_like(value):
            sub = _as_dict(value, depth + 1, seen)
            if sub is not None:
                out[key] = sub
    return _numbers(out)


def _has_eps_key(data: Any, depth: int = 0) -> bool:
    if not isinstance(data, dict) or depth > _MAX_DEPTH:
        return False
    return any(_EPS_NAME.search(k) and isinstance(v, (int, float)) and not isinstance(v, bool)
               for k, v in data.items()) or any(_has_eps_key(v, depth + 1) for v in data.values())


def is_library(cls: type) -> bool:
    """True when ``cls`` is defined by a library: a package of :data:`LIBRARY_PACKAGES`, or a module whose file
    lies under an installation root (site-packages, the interpreter's library); the user's own code, even
    installed editable, lies elsewhere. Decided by the module's real file, never by a substring of its path."""
    name = getattr(cls, "__module__", None) or ""
    if name.split(".")[0] in LIBRARY_PACKAGES:
        return True
    if name.split(".")[0] == "torch":  # nn.Sequential & co. are how users compose their own models
        return False
    file = getattr(sys.modules.get(name), "__file__", None)
    if not file or name == "__main__":
        return False
    try:
        resolved = Path(file).resolve()
    except (OSError, RuntimeError):
        return False
    return any(root in resolved.parents for root in _install_roots())


@functools.lru_cache(maxsize=1)
def _install_roots() -> tuple[Path, ...]:
    """The directories third-party packages are installed in (site-packages of this interpreter)."""
    import site
    import sysconfig

    roots = [sysconfig.get_paths().get(k) for k in ("purelib", "platlib")]
    try:
        roots += list(site.getsitepackages()) + [site.getusersitepackages()]
    except AttributeError:  # virtualenv's old site module
        pass
    out = []
    for r in roots:
        if r:
            try:
                out.append(Path(r).resolve())
            except (OSError, RuntimeError):
                continue
    return tuple(dict.fromkeys(out))
