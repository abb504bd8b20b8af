"""Run one target's audit (import, build, inputs, capture, facts, probes: all the user code) in a worker process.

The command line audits each target in a child process forked from itself (torch and the rules are already
loaded, so a fork starts at once), under a deadline (``--timeout``, :data:`normaudit.options.DEFAULT_TIMEOUT`
seconds per target). Whatever the user's code does there, the parent ends with a report or one line of error:
an endless loop, a ``time.sleep`` at import, ``os._exit()``, a segfault, ``sys.exit`` or ``KeyboardInterrupt``
raised by the model are a :class:`~normaudit.errors.UsageError` (exit 2) naming the target and the phase
the worker had reached (:data:`normaudit.phases.PHASES`, reported by :func:`normaudit.phases.phase` as the
audit goes). The report travels back as the pydantic JSON of :class:`~normaudit.report.Report`.

:class:`Job` is one running worker: start several and collect them in turn to audit targets in parallel.
Where ``fork`` does not exist (Windows) the audit runs in the process itself, without a deadline.

A worker never outlives the process that forked it, whatever ends that process (SIGKILL included, which no
handler sees): on Linux it asks the kernel for SIGKILL when its parent ends (``prctl(PR_SET_PDEATHSIG)``,
prctl(2)) right after the fork; elsewhere a watchdog thread blocks on a pipe whose only write end the parent
holds, and ends the worker when the read returns end-of-file (the kernel closes the parent's descriptors as
it dies). The command line kills its workers itself on SIGINT and SIGTERM (:mod:`normaudit.cli`).
:func:`normaudit.audit.run_audit` (and :mod:`normaudit.testing`) always run in the calling process.
"""
from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Any, Callable, Optional

from normaudit.errors import UsageError
from normaudit import phases
from normaudit.phases import PHASES, phase

#: prctl(2) option: the signal the kernel sends this process when the thread that forked it ends
PR_SET_PDEATHSIG = 1

@contextlib.contextmanager
def collection_paused():
    """Run the block with Python's cyclic garbage collector off (reference counting still frees what it can).

    For the imports before a fork (:func:`normaudit.runner.prewarm`: torch, ``torch._dynamo``, transformers,
    ~10**6 objects, all long-lived): every full collection meanwhile walks the whole heap grown so far, which
    cost the 70B-config audit ~1.4 s of CPU in the parent (6 full collections). The collector's
    state on entry is restored on exit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # The objects made meanwhile sit in the youngest generation: the first collection after this would walk
        # them all. gc.freeze() then gc.unfreeze() moves every tracked object to the oldest generation (two list
        # splices, no walk): where long-lived objects belong.
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def can_isolate() -> bool:
    """True where workers can be forked (POSIX)."""
    return "fork" in multiprocessing.get_all_start_methods()


class WorkerError(Exception):
    """An internal error of normaudit inside a worker (exit status 3): ``kind`` is the exception's type name."""

    def __init__(self, kind: str, text: str):
        super().__init__(text)
        self.kind = kind
        self.text = text


@contextlib.contextmanager
def user_code_output():
    """While user code and torch run, keep stdout for the report alone: Python-level prints and writes
    to file descriptor 1 (C extensions, ``os.write(1, ...)``, subprocesses) go to stderr; torch's internal
    error logs (fake-tensor tracebacks of shapes that do not fit, already summarised in the report) are
    silenced."""
    torch_logs = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
                  if name == "torch" or name.startswith("torch.")]
    torch_logs.append(logging.getLogger("torch"))
    old_levels = [(log, log.level) for log in torch_logs]
    for log in torch_logs:
        log.setLevel(logging.CRITICAL)
    saved = None
    try:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
    except (OSError, ValueError):
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        if saved is not None:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
                os.dup2(saved, 1)
                os.close(saved)
        for log, level in old_levels:
            log.setLevel(level)


def _user_location(exc: BaseException) -> tuple[Optional[str], Optional[int]]:
    """The innermost frame of ``exc``'s traceback in user code (file, line), or (None, None)."""
    from normaudit.loaders.pyfile import is_user_file

    found: tuple[Optional[str], Optional[int]] = (None, None)
    for fr in traceback.extract_tb(exc.__traceback__):
        if is_user_file(fr.filename):
            found = (fr.filename, fr.lineno)
    return found


def _describe(exc: BaseException, target: str) -> tuple:
    """The message a worker sends for an exception that ended the audit."""
    from normaudit.loaders.pyfile import safe_str

    if isinstance(exc, UsageError):
        return ("usage", exc.message, exc.file, exc.line)
    if isinstance(exc, (SystemExit, KeyboardInterrupt, GeneratorExit)):
        file, line = _user_location(exc)
        text = safe_str(exc) if not isinstance(exc, SystemExit) else repr(exc.code)
        what = f"the model's code raised {type(exc).__name__}" + (f" ({text})" if text else "")
        return ("usage", f"{what} while {PHASES.get(phases.current(), phases.current())}", file or target, line)
    detail = traceback.format_exc() if os.environ.get("NORMAUDIT_DEBUG") else None
    return ("internal", type(exc).__name__, safe_str(exc, 500), detail)


def _set_parent_death_signal() -> bool:
    """Ask the Linux kernel to SIGKILL this process when its parent ends (``prctl(PR_SET_PDEATHSIG, SIGKILL)``,
    through libc with ctypes); False where that is not available (not Linux, no libc, the call failed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class _Lifeline:
    """A pipe from this process to the workers it forks: the parent holds the only write end (each worker
    closes its inherited copy at once), so a worker's read of the other end returns end-of-file exactly when
    the parent has ended. Made once per process (a forked process makes its own)."""

    pid = -1
    read_fd = write_fd = -1

    @classmethod
    def ensure(cls) -> None:
        """Create this process's pipe, if not yet done (descriptors not inherited by programs it executes)."""
        if cls.pid != os.getpid():
            cls.read_fd, cls.write_fd = os.pipe()
            cls.pid = os.getpid()


def _watch_parent() -> None:
    """In a worker: close the inherited write end of the :class:`_Lifeline` and start a daemon thread that
    ends the process (``os._exit``) once the parent's end is closed (the parent has died)."""
    import threading

    read_fd = _Lifeline.read_fd
    with contextlib.suppress(OSError):
        os.close(_Lifeline.write_fd)

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(read_fd, 1):
                pass
        os._exit(1)

    threading.Thread(target=watch, name="normaudit-parent-watchdog", daemon=True).start()


def die_with_parent(parent: int) -> None:
    """In a just-forked worker: make sure it ends when the process ``parent`` (the one that forked it) ends,
    by :func:`_set_parent_death_signal` or else :func:`_watch_parent`; ends at once if the parent is already
    gone (it died between the fork and this call)."""
    if not _set_parent_death_signal():
        _watch_parent()
    if os.getppid() != parent:
        os._exit(1)


def _child(conn: Any, work: Callable[[], Any], target: str, parent: int) -> None:
    """The worker: run ``work`` (returns a pydantic model) with stdout sent to stderr; send back the result.
    It dies with ``parent`` (:func:`die_with_parent`); SIGINT is ignored (the parent decides) and SIGTERM has
    its default action again (the parent's handler, inherited through the fork, is the command line's)."""
    die_with_parent(parent)
    phases.report_to(conn)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not os.environ.get("NORMAUDIT_DEBUG"):
        faulthandler.disable()  # a crash of the model's code is the parent's one line, not a C stack dump
    torch = sys.modules.get("torch")
    if torch is not None:
        # OpenMP's thread pool does not survive a fork of a process that used it (the worker would hang at the
        # first parallel op); one intra-op thread, as torch's DataLoader workers do.
        torch.set_num_threads(1)
    message = run_and_describe(work, target)
    with contextlib.suppress(OSError, ValueError):
        conn.send(message)
        conn.close()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # now: threads the model's code left running must not keep the worker alive


def run_and_describe(work: Callable[[], Any], target: str) -> tuple:
    """Run ``work()`` here with the model's output kept off stdout (:func:`user_code_output`) and return the
    message a worker sends: ``("report", json)``, or the description of the exception that ended it. What a
    Ray task of :mod:`normaudit.runner` runs."""
    try:
        with user_code_output():
            result = work()
            phase("report")
        return ("report", result.model_dump_json())
    except BaseException as exc:  # noqa: BLE001 - everything must travel back as one message
        return _describe(exc, target)


def decode_message(message: tuple, result_type: type) -> Any:
    """The result a worker's final ``message`` carries (a ``result_type`` pydantic model), or raise what it
    describes: :class:`UsageError` (bad input, the model's exit) or :class:`WorkerError` (internal error)."""
    kind = message[0]
    if kind == "report":
        return result_type.model_validate_json(message[1])
    if kind == "usage":
        raise UsageError(message[1], file=message[2], line=message[3])
    if message[3]:
        sys.stderr.write(message[3])
    raise WorkerError(message[1], message[2])


class Job:
    """One target's audit in a worker process: :meth:`start` forks it, :meth:`result` waits for it (at most
    ``timeout`` seconds after the start) and returns the report, or raises :class:`UsageError` (a timeout, a
    crash, an exit, bad input) or :class:`WorkerError` (an internal error).

    Several jobs run at once with :func:`wait_any`, which returns those that have finished (a final message,
    the worker's end, or the deadline passed); :meth:`result` of a finished job does not block."""

    def __init__(self, target: str, work: Callable[[], Any], timeout: float, result_type: type):
        self.target, self.work, self.timeout, self.result_type = target, work, float(timeout), result_type
        self.phase = "start"
        self.process: Any = None
        self.conn: Any = None
        self.deadline = 0.0
        self.finished = False
        self.timed_out = False
        self.message: Optional[tuple] = None

    def start(self) -> "Job":
        """Fork the worker; the deadline starts now."""
        ctx = multiprocessing.get_context("fork")
        receiver, sender = ctx.Pipe(duplex=False)
        _Lifeline.ensure()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():  # "fork() of a multi-threaded process": the worker only runs the audit
            warnings.simplefilter("ignore", DeprecationWarning)
            self.process = ctx.Process(target=_child, args=(sender, self.work, self.target, os.getpid()),
                                       daemon=True)
            # gc.freeze() before the fork, gc.unfreeze() after it in the parent (the recipe of the gc module's
            # docs): the worker's collections never walk the objects it inherited (torch, transformers:
            # ~10**6 of them), nor touch their pages (copy-on-write); the parent's collector is as it was.
            gc.freeze()
            try:
                self.process.start()
            finally:
                gc.unfreeze()
        sender.close()
        self.conn = receiver
        self.deadline = time.monotonic() + self.timeout
        return self

    def waitables(self) -> list:
        """What :func:`multiprocessing.connection.wait` waits on for this job: its pipe and its process."""
        return [self.conn, self.process.sentinel]

    def poll(self) -> bool:
        """Read the messages the worker has sent so far, without blocking; True once the job has finished
        (its final message came, it ended without one, or its deadline passed: then it is killed)."""
        if self.finished:
            return True
        try:
            while self.conn.poll():
                message = self.conn.recv()
                if message[0] == "phase":
                    self.phase = message[1]
                    continue
                self.message, self.finished = message, True
                return True
        except (EOFError, OSError):
            self.finished = True
            return True
        if not self.process.is_alive() and not self.conn.poll():
            self.finished = True
        elif time.monotonic() >= self.deadline:
            self.kill()
            self.finished = self.timed_out = True
        return self.finished

    def result(self) -> Any:
        """Wait for the worker's report (see the class docstring); the worker is gone when this returns."""
        try:
            while not self.poll():
                multiprocessing.connection.wait(self.waitables(), timeout=max(0.0, self.deadline - time.monotonic()))
        except BaseException:
            self.kill()
            self.conn.close()
            raise
        self.conn.close()
        self.process.join(5)
        self.kill()
        if self.timed_out:
            raise UsageError(f"timed out after {self.timeout:g} s while {self._doing()} (--timeout)",
                             file=self.target)
        if self.message is None:
            raise self._died()
        return decode_message(self.message, self.result_type)

    def _doing(self) -> str:
        return PHASES.get(self.phase, self.phase)

    def _died(self) -> UsageError:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            why = f"the model's code crashed ({name}) while {self._doing()}"
        else:
            why = (f"the model's code ended the process (exit status {code}, as os._exit() does) while "
                   f"{self._doing()}")
        return UsageError(why, file=self.target)

    def kill(self) -> None:
        """End the worker now (SIGKILL) and reap it."""
        if self.process is not None and self.process.is_alive():
            self.process.kill()
        if self.process is not None:
            self.process.join(5)


def wait_any(jobs: list[Job]) -> list[Job]:
    """Block until at least one of the running ``jobs`` has finished (see :meth:`Job.poll`) and return the
    finished ones, in the order given; ``jobs`` must not be empty."""
    while True:
        done = [job for job in jobs if job.poll()]
        if done:
            return done
        left = min(job.deadline for job in jobs) - time.monotonic()
        multiprocessing.connection.wait([w for job in jobs for w in job.waitables()], timeout=max(0.0, left))


def run_isolated(target: str, work: Callable[[], Any], timeout: float, result_type: type) -> Any:
    """Run ``work()`` (which returns an instance of the pydantic model ``result_type``) in a worker process
    under ``timeout`` seconds and return its result (see :class:`Job`); in this process where workers cannot
    be forked."""
    if not can_isolate():
        with user_code_output():
            return work()
    return Job(target, work, timeout, result_type).start().result()
