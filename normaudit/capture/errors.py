"""Capture failures in one line: the root cause behind the wrappers torch re-raises with, the line of model code
it was raised from, whether a failure comes from a data-dependent value, and which unset config keys a failure
names."""
from __future__ import annotations

import re
import traceback
from typing import Any, Iterable, Mapping, Optional

from normaudit.loaders.pyfile import is_tool_file
from normaudit.report import SourceLocation


def root_cause(exc: BaseException) -> BaseException:
    """The original exception behind wrappers (ShapeProp and export re-raise with ``from``)."""
    seen = 0
    while exc.__cause__ is not None and seen < 10:
        exc, seen = exc.__cause__, seen + 1
    return exc


def failure_location(exc: BaseException) -> Optional[SourceLocation]:
    """The line of model code (a frame outside torch and normaudit, :func:`is_tool_file`) nearest to where
    ``exc`` was raised: the innermost such frame of the original exception's traceback, else of the wrappers
    that re-raised it (``raise ... from``), outermost last. None where every frame is torch's or normaudit's
    (an op refused inside a torch kernel called from a frame that was not kept)."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 10:
        chain.append(chain[-1].__cause__)
    for e in reversed(chain):
        user = [f for f in traceback.extract_tb(e.__traceback__) if f.lineno and not is_tool_file(f.filename)]
        if user:
            return SourceLocation(file=user[-1].filename, line=user[-1].lineno)
    return None


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


#: an attribute read from an object that lacks it (``'NoneType' object has no attribute 'dtype'``): the name is
#: what was read from some value, not a config key that is unset, so it is not a name the error gives as cause
_NO_ATTRIBUTE = re.compile(r"object has no attribute [`'\"]([A-Za-z_][A-Za-z0-9_]*)[`'\"]")


def _named(error: str) -> list[str]:
    """The identifiers ``error`` names, quoted ones first, in order, each once; the attribute of an
    ``AttributeError`` (:data:`_NO_ATTRIBUTE`) is left out."""
    read = set(_NO_ATTRIBUTE.findall(error))
    names = [n for n in _QUOTED.findall(error) + _SNAKE.findall(error) if n not in read]
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


#: the split of a tensor whose sizes do not add up to its length: on fake tensors (torch._refs) and on real ones
_SPLIT = (re.compile(r"Split sizes add up to (\d+) but got the tensor's size of (\d+)"),
          re.compile(r"split_sizes to sum exactly to (\d+) .*but got split_sizes=\[([\d, ]+)\]"))
#: the rope settings' mapping in a transformers config (5.x: ``rope_parameters``; 4.x: ``rope_scaling``)
_ROPE_KEYS = ("rope_parameters", "rope_scaling")


def _split_sizes(error: str) -> Optional[tuple[int, int]]:
    """``(sum of the split sizes, length of the tensor split)`` of a failed split in ``error``, or None."""
    m = _SPLIT[0].search(error)
    if m:
        return int(m[1]), int(m[2])
    m = _SPLIT[1].search(error)
    if m:
        return sum(int(s) for s in m[2].split(",") if s.strip()), int(m[1])
    return None


def _rope_width(data: Mapping[str, Any], path: str) -> Optional[tuple[int, str, str]]:
    """``(rotary frequencies, the rope mapping's key, how they follow from the config)`` of a config with a
    rope mapping and attention heads: ``len(range(0, int(head_dim * partial_rotary_factor), 2))``, as
    transformers' default rope computes ``inv_freq`` (modeling_rope_utils, ``_compute_default_rope_parameters``),
    ``head_dim`` defaulting to ``hidden_size // num_attention_heads`` and the factor to 1.0 where unset."""
    rope_key = next((k for k in _ROPE_KEYS if isinstance(data.get(k), Mapping)), None)
    hidden, heads = data.get("hidden_size"), data.get("num_attention_heads")
    if rope_key is None or not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0):
        return None
    rope = data[rope_key]
    at = f"{path}." if path else ""
    head_dim = data.get("head_dim")
    if isinstance(head_dim, int) and head_dim > 0:
        said = [f"{at}head_dim {head_dim}"]
    else:
        head_dim = hidden // heads
        said = [f"{at}head_dim unset: hidden_size {hidden} / num_attention_heads {heads} = {head_dim}"]
    factor = rope.get("partial_rotary_factor")
    where = f"{at}{rope_key}.partial_rotary_factor"
    if factor is None and data.get("partial_rotary_factor") is not None:
        factor, where = data.get("partial_rotary_factor"), f"{at}partial_rotary_factor"
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0:
        said.append(f"{where} {factor}")
    else:
        factor = 1.0
        said.append(f"{at}{rope_key}.partial_rotary_factor unset: 1.0")
    width = len(range(0, int(head_dim * factor), 2))
    return width, rope_key, f"{width}, half of head_dim x partial_rotary_factor rounded up ({'; '.join(said)})"


def _configs_with_rope(data: Mapping[str, Any], path: str, depth: int = 0) -> Iterable[tuple[str, Mapping[str, Any]]]:
    if any(isinstance(data.get(k), Mapping) for k in _ROPE_KEYS):
        yield path, data
    for key, value in data.items():
        if isinstance(key, str) and isinstance(value, Mapping) and key not in _ROPE_KEYS and depth < 3:
            yield from _configs_with_rope(value, f"{path}.{key}" if path else key, depth + 1)


def rope_section_conflicts(errors: Iterable[str], configs: Iterable[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Where a capture failed on a split whose sizes do not add up to the tensor's length and that length is
    the rotary frequencies of a config in ``configs`` (``(submodule path, mapping)``, the model's own) whose
    M-RoPE sections do not add up to them: one sentence per such config naming the keys, e.g. GLM-4V's
    default config, whose text model splits its 64 frequencies (head_dim 128, no partial_rotary_factor)
    by the code's default ``mrope_section`` [8, 12, 12] (modeling_glm4v.py ``recomposition_frequencies``)
    while the checkpoints set ``partial_rotary_factor`` 0.5. M-RoPE (Qwen2-VL, Wang et al. 2024, arXiv
    2409.12191) splits the frequencies into temporal, height and width sections, so the sections must add
    up to them. [] when no failure is such a split."""
    splits = [s for s in (_split_sizes(e or "") for e in errors) if s is not None and s[0] != s[1]]
    out: list[str] = []
    for scope, root in configs:
        if out:  # the shallowest config that explains the split (a submodule's is its sub-config again)
            break
        for path, data in _configs_with_rope(root, ""):
            width = _rope_width(data, path)
            if width is None:
                continue
            freqs, rope_key, said = width
            section = data[rope_key].get("mrope_section")
            at = f"{scope}.config." if scope else ""
            key = f"{at}{path + '.' if path else ''}{rope_key}.mrope_section"
            for total, length in splits:
                if length != freqs or (isinstance(section, list) and sum(section) != total):
                    continue
                given = (f"{key} {section} adds up to {total}" if isinstance(section, list)
                         else f"{key} is unset and the model's default adds up to {total}")
                text = f"{given}, but the rotary frequencies it splits are {said}"
                if text not in out:
                    out.append(text)
    return out


def config_error(errors: Iterable[str], keys: Iterable[str] = ()) -> Optional[str]:
    """The first of ``errors`` that names one of ``keys`` (dotted paths of :func:`unset_config_keys`, matched
    by their last part) or fails on a split (what :func:`rope_section_conflicts` reads), for the findings to
    quote; None when there is none."""
    names = {k.rpartition(".")[2] for k in keys}
    return next((e for e in errors if e and (_split_sizes(e) is not None or names & set(_named(e)))), None)
