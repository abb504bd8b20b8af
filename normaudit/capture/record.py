"""The result of a capture: :class:`Capture`, the graph and how it was obtained."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import fx, nn

from normaudit.report import CaptureAttempt


@dataclass
class Capture:
    """The captured graph and how it was obtained.

    ``user_inputs`` names the placeholders that are model inputs (not parameters or buffers), in order;
    ``modules`` maps every ``named_modules()`` path to its module (fake tensors inside).
    """

    gm: Optional[fx.GraphModule]
    method: str
    attempts: list[CaptureAttempt]
    root: nn.Module
    modules: dict[str, nn.Module]
    user_inputs: list[str] = field(default_factory=list)
    eval_fallback: bool = False
    train_error: Optional[str] = None
    #: the parts captured alone (``normaudit.capture.parts.PartCapture``): when the whole model failed, its
    #: parts; else towers the whole-model forward never called, on inputs of their own; and what stopped the
    #: eager forward that recorded the parts' inputs
    parts: list = field(default_factory=list)
    parts_error: Optional[str] = None
    #: the integer and bool buffers' values (:func:`integer_buffers`), for the parts' captures
    buffer_values: dict = field(default_factory=dict)
    #: a part captured on the inputs the model's forward gave it (hidden states, not the model's inputs): their
    #: layout is not read off their rank (:func:`normaudit.facts.axes.input_labels`)
    inputs_recorded: bool = False

    @property
    def complete(self) -> bool:
        return self.gm is not None
