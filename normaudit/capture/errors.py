"""Capture failures in one line: the root cause behind the wrappers torch re-raises with, whether a failure
comes from a data-dependent value, and which unset config keys a failure names."""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping


def root_cause(exc: BaseException) -> BaseException:
    """The original exception behind wrappers (ShapeProp and export re-raise with ``from``)."""
    seen = 0
    while exc.__cause__ is not None and seen < 10:
        exc, seen = exc.__cause__, seen + 1
    return exc


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, at most about 300 characters: a longer message keeps its start and its
    end (a message that begins with a module's repr says what went wrong at the end)."""
    text = " ".join(str(exc).split())
    if len(text) > 300:
        text = text[:150] + " ... " + text[-145:]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def data_dependent(error: str) -> bool:
    """Whether a capture failed on a data-dependent size or value (an unbacked symbol of export)."""
    return any(s in error for s in ("GuardOnDataDependentSymNode", "data-dependent", "unbacked"))


#: a name a message quotes (`sliding_window`, 'rope_theta', "head_dim"), or a bare snake_case identifier
_QUOTED = re.compile(r"[`'\"]([A-Za-z_][A-Za-z0-9_]*)[`'\"]")
_SNAKE = re.compile(r"\b([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)\b")


def _named(error: str) -> list[str]:
    """The identifiers ``error`` names, quoted ones first, in order, each once."""
    names = _QUOTED.findall(error) + _SNAKE.findall(error)
    return list(dict.fromkeys(names))


def _unset_paths(data: Mapping[str, Any], prefix: str, depth: int = 0) -> Iterable[tuple[str, str]]:
    """``(key, dotted path)`` of every key whose value is None in ``data`` and its nested mappings (3 deep:
    a multimodal config's ``text_config``, a sub-config's own sub-config)."""
    for key, value in data.items():
        if not isinstance(key, str):
            continue
        path = f"{prefix}.{key}" if prefix else key
        if value is None:
            yield key, path
        elif isinstance(value, Mapping) and depth < 3:
            yield from _unset_paths(value, path, depth + 1)


def unset_config_keys(errors: Iterable[str], configs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The dotted paths of the config keys that are None in one of ``configs`` (``(path of the submodule
    keeping it, its mapping)``, the model's own configs) and that a capture error of ``errors`` names:
    the model's forward read a value its config leaves unset (transformers' masking utilities: "Could not
    find a `sliding_window` argument in the config, or it is not set", Step3p7's default config). A key is
    named when the message quotes it or spells it as a snake_case identifier. Each key is given once, at its
    first place in ``configs`` (shallowest first: the root config's ``text_config.sliding_window`` rather
    than the same sub-config kept by a submodule, ``language_model.config.sliding_window``), paths under a
    submodule's config start with that submodule. [] when no error names an unset key."""
    named: list[str] = []
    for error in errors:
        named += [n for n in _named(error or "") if n not in named]
    if not named:
        return []
    found: dict[str, str] = {}
    for scope, data in configs:
        for key, path in _unset_paths(data, ""):
            if key in named and key not in found:
                found[key] = f"{scope}.config.{path}" if scope else path
    return [found[n] for n in named if n in found]
