"""The phase one target's audit has reached (:data:`PHASES`), kept for the worker process that runs it
(:mod:`normaudit.worker`): every layer that runs user code reports its phase here, so a timeout or a crash
names it. Imports nothing of normaudit: the loaders, the capture and the audit all report to it."""
from __future__ import annotations

import contextlib
import gc
from typing import Any

#: The phases of one target's audit, as the error message words them ("timed out ... while capturing the model").
PHASES = {
    "start": "starting the audit",
    "import": "importing the model file",
    "build": "building the model",
    "inputs": "making the example inputs",
    "checkpoint": "reading the checkpoint",
    "onnx": "reading the ONNX graph",
    "capture": "capturing the model",
    "facts": "deriving the facts and running the probes",
    "rules": "evaluating the rules",
    "report": "sending the report",
}

_state: dict[str, Any] = {"channel": None, "phase": "start"}


def _freeze_heap() -> None:
    """In a worker: move every object tracked so far to the collector's permanent generation
    (:func:`gc.freeze`), so that later collections walk only the objects made after this point. Called at each
    new phase (:func:`phase`): what survives into the next phase (modules, the model, its graph) lives until
    the worker exits, and the worker ends with ``os._exit`` (nothing left to free)."""
    if _state["channel"] is not None:
        gc.freeze()


def phase(name: str) -> None:
    """Record that the audit has reached phase ``name`` (a key of :data:`PHASES`); in a worker the parent
    is told, so a timeout or a crash names the phase."""
    _state["phase"] = name
    _freeze_heap()
    channel = _state["channel"]
    if channel is not None:
        with contextlib.suppress(OSError, ValueError):
            channel.send(("phase", name))


def in_worker() -> bool:
    """True inside a worker process (there a ``KeyboardInterrupt`` can only come from the user's code: the
    worker ignores SIGINT and the parent ends it on Ctrl-C)."""
    return _state["channel"] is not None




def report_to(channel: Any) -> None:
    """Send every later :func:`phase` to ``channel`` (an object with ``send((\"phase\", name))``: the worker's
    pipe to its parent, or a Ray task's phase file): called once, first thing in the process that runs the
    audit."""
    _state["channel"] = channel


def current() -> str:
    """The phase reached last (a key of :data:`PHASES`)."""
    return _state["phase"]
