"""What a pass needs to carry its facts from the kept blocks of a reduced capture to a whole stack
(depth-independent capture; the pipeline's side is :mod:`normaudit.pipeline.carry`): the refusal
(:class:`NotCarried`), module-path renaming of a fact (:func:`renamer`), and the canonical text two blocks'
facts are compared by (:func:`dump`)."""
from __future__ import annotations

import copy
import json
import re
from typing import Any, Callable, Optional


class NotCarried(Exception):
    """The facts of the reduced capture cannot be carried to the whole stack: capture the full model."""


def renamer(old: str, new: str) -> Callable[[Any], Any]:
    """A function returning a copy of a value (a string, a pydantic model, containers of them) with the module
    path ``old`` renamed ``new`` wherever it is a whole path or a path's prefix (``layers.2.mlp``, not
    ``layers.20``). The copy is as deep as ``copy.deepcopy``: models and containers are rebuilt, other
    mutable leaves deep-copied."""
    pat = re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w])")
    from pydantic import BaseModel

    def rename(v: Any) -> Any:
        if isinstance(v, str):
            return pat.sub(new, v) if old in v else v
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, BaseModel):
            return v.model_copy(update={name: rename(getattr(v, name)) for name in type(v).model_fields})
        if isinstance(v, dict):
            return {rename(k): rename(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(rename(x) for x in v)
        return copy.deepcopy(v)
    return rename


def under(path: Optional[str], prefix: str) -> bool:
    """``path`` is the module ``prefix`` or lies inside it."""
    return path is not None and (path == prefix or path.startswith(prefix + "."))


def dump(v: Any) -> str:
    """A pydantic value as canonical JSON text (what two blocks' facts are compared by)."""
    return json.dumps(v.model_dump(mode="json"), sort_keys=True)
