"""Target loading: turn what the user names (a model .py file, later HF directories and checkpoints) into
a model ready to capture. Each target kind has its own module; :func:`load_model` dispatches."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from torch import nn

from normaudit.errors import UsageError


@dataclass
class ModelUnderAudit:
    """A model ready to capture, from whatever target kind produced it."""

    model: nn.Module
    inputs: Any
    on_meta: bool
    kind: str
    factory: Optional[str] = None
    origins: dict = field(default_factory=dict)
    inputs_assumed: Optional[str] = None


def load_model(target: str) -> ModelUnderAudit:
    """Build the model named by ``target``. Raises UsageError for bad targets."""
    from normaudit.target.pyfile import load_python_target, split_target

    path, _ = split_target(target)
    if path.suffix == ".py" or (path.is_file() and path.suffix == ""):
        loaded = load_python_target(target)
        return ModelUnderAudit(model=loaded.model, inputs=loaded.inputs, on_meta=loaded.on_meta, kind="python",
                               factory=loaded.factory, origins=loaded.origins)
    if not path.exists():
        raise UsageError("no such file or directory", file=str(path))
    raise UsageError("unsupported target: give a model .py file (model.py or model.py:factory)", file=str(path))


