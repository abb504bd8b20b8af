"""Silence what a library says while normaudit runs it: the library's logger below ERROR and Python
warnings, and with ``stderr`` what it prints there (torch.fx's ``ShapeProp`` prints a traceback before it
re-raises; the failure is recorded in the capture attempts instead). Imports nothing of normaudit."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Iterator


@contextlib.contextmanager
def quiet(logger: str = "torch", stderr: bool = False) -> Iterator[None]:
    """Within the block, the ``logging`` logger named ``logger`` (``torch``, ``transformers``) passes only
    ERROR and above, every Python warning is ignored, and with ``stderr`` the block's writes to
    ``sys.stderr`` are dropped; all three are restored on exit."""
    log = logging.getLogger(logger)
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            warnings.simplefilter("ignore")
            if stderr:
                stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
            yield
    finally:
        log.setLevel(old)
