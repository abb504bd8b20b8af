"""What every loader returns: :class:`ModelUnderAudit`, a model ready to capture with its inputs, origins and
notes; and the file suffixes that name a checkpoint. Imports no torch (start-up without torch)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from torch import nn

CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


@dataclass
class ModelUnderAudit:
    """A model ready to capture, from whatever target kind produced it.

    ``file`` is the file the model came from (the model's .py file, or the ``config.json``); ``weights``
    names weight files found beside a Hugging Face config (recorded, not read); ``notes`` go into the report.
    """

    model: nn.Module
    inputs: Any
    on_meta: bool
    kind: str
    factory: Optional[str] = None
    origins: dict = field(default_factory=dict)
    inputs_assumed: Optional[str] = None
    file: Optional[str] = None
    weights: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the factory itself (Python targets), for probes that rebuild the model with its real initialisation
    build_fn: Any = None
    #: a Hugging Face hub id target (``org/name@revision``) and what of the local cache it resolved to
    hub: Optional[str] = None
    resolved: Optional[str] = None
