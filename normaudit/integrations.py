"""Training-framework integrations of :func:`normaudit.monitor`.

:class:`NormauditCallback` is a ``transformers.TrainerCallback``: it attaches a monitor to the trainer's model at
``on_train_begin``, numbers steps as the Trainer does, and at the end of the step where the first non-finite
value appears it logs the module and step and (``action="stop"``) stops training; ``action="warn"`` only warns.

Steps are the Trainer's: the step that, once finished, makes ``state.global_step`` equal to N is step N
(1-based, the number the Trainer logs), so a run stopped at step N ends with ``trainer.state.global_step == N``.
Gradient-accumulation micro-batches share their optimizer step's number.

Importing this module imports ``transformers``; ``import normaudit`` does not.
"""
from __future__ import annotations

import logging
from typing import Any, Literal, Optional

from transformers import TrainerCallback

from normaudit.probes.monitor import Monitor, NonFiniteEvent, monitor

logger = logging.getLogger("normaudit")


class NormauditCallback(TrainerCallback):
    """Stop (or warn) at the first inf/NaN of a ``transformers.Trainer`` run, naming the layer and the step.

    Args:
        action: ``"stop"`` sets ``control.should_training_stop`` at the end of the step (the optimizer step of
            that step has already run: the Trainer offers no hook between backward and the update that can skip
            it); ``"warn"`` logs and goes on.
        modules, every: as in :class:`normaudit.probes.monitor.Monitor` (``every`` counts Trainer steps).

    After training, ``events`` holds every event (:class:`~normaudit.probes.monitor.NonFiniteEvent`) and
    ``stopped_at`` the step training was stopped at (None when it was not). Each event is also logged as a
    warning on the ``normaudit`` logger and added to the Trainer's ``state.log_history``.

    Raises:
        ValueError: an unknown ``action`` (and the monitor's own argument checks).
    """

    def __init__(self, action: Literal["stop", "warn"] = "stop", *, modules: Literal["all", "norms"] = "all",
                 every: int = 1):
        if action not in ("stop", "warn"):
            raise ValueError(f"action must be 'stop' or 'warn', not {action!r}")
        self.action, self.modules, self.every = action, modules, every
        self.monitor: Optional[Monitor] = None
        self.events: list[NonFiniteEvent] = []
        self.stopped_at: Optional[int] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Attach the monitor to the model being trained."""
        if model is None:
            raise ValueError("NormauditCallback: the Trainer passed no model to on_train_begin")
        self.monitor = monitor(model, modules=self.modules, every=self.every, on_nonfinite="record",
                               auto_step=False)
        self.monitor.step(state.global_step + 1)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Number the coming forward/backward passes with the step they belong to."""
        if self.monitor is not None:
            self.monitor.step(state.global_step + 1)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """Check the step that just ended; log its event and stop training if asked."""
        if self.monitor is None:
            return control
        self.monitor.check()
        for event in self.monitor.events[len(self.events):]:
            self.events.append(event)
            logger.warning("%s", event)
            state.log_history.append({"step": event.step, "normaudit_nonfinite": event.model_dump(mode="json")})
            if self.action == "stop" and self.stopped_at is None:
                control.should_training_stop = True
                self.stopped_at = event.step
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the monitor's hooks."""
        if self.monitor is not None:
            self.monitor.close()
            self.events.extend(self.monitor.events[len(self.events):])
            self.monitor = None
