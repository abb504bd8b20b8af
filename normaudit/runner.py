"""Running the targets of one command: cache look-up, then the misses in parallel worker processes (``-j N``)
or as Ray tasks (``--executor ray``), results handed on in the targets' order.

- :func:`run_targets` looks every target up in the :class:`~normaudit.cache.ResultCache` first, runs the
  misses, stores their reports and calls ``on_result`` for each target in the order given, as soon as it and
  all targets before it are done (a long run streams its results).
- Local executor: at most ``jobs`` forked workers at a time (:class:`~normaudit.worker.Job`, each under its
  own ``--timeout``); a crash or timeout of one is that target's error and the others go on. Before the first
  fork, the parent defers the optional heavy imports transformers makes at start-up
  (:data:`normaudit.lazy_imports.DEFERRED`: boto3, scipy.optimize), then imports torch, ``torch._dynamo`` (``FakeTensorMode`` imports ``torch._dynamo.config``, which
  loads all of dynamo: about 2 s that each worker would otherwise pay again), ``torch.export._trace`` (imported
  by torch.export on its first call: ~0.25 s of CPU per worker) and, for Hugging Face targets,
  transformers and the modelling module of each ``model_type`` that several targets share
  (:func:`shared_model_types`).
- Ray executor: the same per-target work (:func:`audit_target`) as Ray tasks, one process per task
  (``max_calls=1``, no retries), at most ``jobs`` in flight (default: the cluster's CPUs), each cancelled with
  ``ray.cancel(force=True)`` past ``--timeout`` seconds after its submission; results are taken as they
  finish (``ray.wait``). ``ray.init(address=...)`` joins an existing cluster (``--ray-address``), else starts
  a local one that is shut down at the end; SIGINT and SIGTERM cancel the tasks in flight (``ray.cancel(force=True)``
  ends their processes) and shut the local cluster down, and when the driver is killed outright Ray's own
  fate-sharing ends the tasks' processes (and, a minute or two later, its agents). Ray's own output stays off the user's terminal
  (:func:`ray_driver_quiet`: no dashboard, no worker logs, the driver's stdout to ``os.devnull``, the ``ray``
  logger at ERROR); a task reports its phase (:class:`PhaseFile`), so a crash or a timeout names it ("while
  building the model") as the local executor's errors do. The cluster's workers must have normaudit (and the model's
  dependencies) installed and see the target files at the same paths.

The report a worker sends back is the report before the baseline: the parent applies the baseline, so the
cached report does not depend on it.
"""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, Field

from normaudit.errors import UsageError
from normaudit.report import Report

EXECUTORS = ("local", "ray")


class WorkerResult(BaseModel):
    """What one target's work sends back: its report and the files of the modules it imported (the local
    part of the cache key, :func:`normaudit.cache.imported_files`)."""

    report: Report
    imported: list[str] = Field(default_factory=list)


@dataclass
class Outcome:
    """One target's outcome: a report (``cached`` when it came from the cache), or the exception that ended
    its audit (a :class:`UsageError` is exit 2, anything else exit 3); ``seconds`` of wall time."""

    report: Optional[Report] = None
    error: Optional[BaseException] = None
    cached: bool = False
    seconds: float = 0.0


def default_jobs() -> int:
    """The number of CPU cores this process may use (``-j`` default of the local executor)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def audit_target(opts: Any, rules: dict) -> WorkerResult:
    """Audit one target in this process (what a worker or a Ray task runs): the report before any baseline,
    and the files it imported."""
    from normaudit.cache import imported_files
    from normaudit.job import audit_one

    before = set(sys.modules)
    report = audit_one(opts, rules, None, Path("."))
    return WorkerResult(report=report, imported=imported_files(before))


class PhaseFile:
    """A Ray task's report of the phase it has reached (:func:`normaudit.phases.phase`), written to ``path``
    on the task's machine: the driver reads it when the task's process dies, so the error names the phase
    as the local executor's does. Only where the driver's folder is seen (a local cluster, a shared disk)."""

    def __init__(self, path: str):
        self.path = path

    def send(self, message: tuple) -> None:
        """Take a worker message; ``("phase", name)`` overwrites the file with ``name``."""
        if message and message[0] == "phase":
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(str(message[1]))


def read_phase(path: Optional[str]) -> Optional[str]:
    """The phase a Ray task last wrote to ``path`` (:class:`PhaseFile`), or None."""
    try:
        with open(path or "", encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def ray_task(opts: Any, rules: dict, cwd: str, phase_file: Optional[str] = None) -> tuple:
    """The body of one Ray task: :func:`audit_target` as a worker message (:func:`normaudit.worker.run_and_describe`),
    run in the driver's directory ``cwd`` where it exists (relative target paths, report paths as local runs
    give them); the task's process serves this one task (``max_calls=1``), so the change does not leak. The
    phases reached go to ``phase_file`` (:class:`PhaseFile`) when its folder exists here."""
    from normaudit import phases, worker
    from normaudit.lazy_imports import install
    from normaudit.loaders.hf import set_offline

    install()  # the task's process is normaudit's own (max_calls=1)
    set_offline()
    if os.path.isdir(cwd):
        os.chdir(cwd)
    if phase_file and os.path.isdir(os.path.dirname(phase_file)):
        phases.report_to(PhaseFile(phase_file))
    return worker.run_and_describe(functools.partial(audit_target, opts, rules), opts.target)


def _looks_hf(target: str) -> bool:
    p = Path(target)
    return (p.is_dir() and (p / "config.json").is_file()) or (p.suffix == ".json" and not p.name.endswith(".index.json"))


def _looks_checkpoint(target: str) -> bool:
    from normaudit.loaders import CHECKPOINT_SUFFIXES

    p = Path(target)
    return p.suffix in CHECKPOINT_SUFFIXES or p.name.endswith(".index.json") or (p.is_dir() and not _looks_hf(target))


def prewarm(targets: list[str]) -> None:
    """Import in this process what the workers forked from it would each import again (see the module
    docstring); nothing for checkpoint-only targets. First the optional heavy imports of
    :data:`normaudit.lazy_imports.DEFERRED` are deferred (this is normaudit's own process)."""
    from normaudit.lazy_imports import install

    install()
    import normaudit.audit  # noqa: F401 - torch, capture, facts, target loaders

    if not all(_looks_checkpoint(t) for t in targets):
        import torch._dynamo  # noqa: F401
        import torch.export._trace  # noqa: F401 - torch.export imports it on its first call: ~0.3 s per worker
    if any(_looks_hf(t) for t in targets):
        from normaudit.loaders.hf import _transformers

        try:
            _transformers()  # offline, and transformers.models reuses the scan of its folder (share_models_scan)
        except UsageError:  # not installed: each worker says so
            return
        for model_type in shared_model_types(targets):
            _import_modeling(model_type)


#: at most this many model types' modelling modules are imported before the fork (each costs ~1-2 s, on one core)
MAX_PREWARMED_TYPES = 4


def shared_model_types(targets: list[str]) -> list[str]:
    """The ``model_type`` of the Hugging Face targets that at least two of ``targets`` share (the workers of
    both would each import its modelling module again), most shared first, at most
    :data:`MAX_PREWARMED_TYPES`. A config that cannot be read counts for nothing (its worker reports it)."""
    from normaudit.loaders.hf import _read_json

    counts: dict[str, int] = {}
    for t in targets:
        if not _looks_hf(t):
            continue
        p = Path(t)
        try:
            model_type = _read_json(p / "config.json" if p.is_dir() else p).get("model_type")
        except Exception:  # noqa: BLE001 - bad input is the worker's to report
            continue
        if isinstance(model_type, str) and model_type:
            counts[model_type] = counts.get(model_type, 0) + 1
    shared = sorted((t for t, n in counts.items() if n >= 2), key=lambda t: -counts[t])
    return shared[:MAX_PREWARMED_TYPES]


def _import_modeling(model_type: str) -> None:
    """Import transformers' own modelling module of ``model_type`` (``transformers.models.llama.modeling_llama``),
    quietly; nothing when transformers does not know the type or the import fails (the worker reports it)."""
    import importlib

    from normaudit.quiet import quiet

    try:
        from transformers.models.auto import configuration_auto

        if model_type not in configuration_auto.CONFIG_MAPPING_NAMES:
            return
        module = configuration_auto.model_type_to_module_name(model_type)
        old = sys.dont_write_bytecode
        sys.dont_write_bytecode = True
        try:
            with quiet("transformers"), contextlib.redirect_stdout(io.StringIO()):
                importlib.import_module(f"transformers.models.{module}.modeling_{module.rpartition('.')[2]}")
        finally:
            sys.dont_write_bytecode = old
    except Exception:  # noqa: BLE001 - the worker builds the model and reports what fails
        return


class _InOrder:
    """Hands outcomes to ``on_result(index, outcome)`` in index order, each as soon as those before it are."""

    def __init__(self, outcomes: list, on_result: Optional[Callable[[int, Outcome], None]]):
        self.outcomes, self.on_result, self.next = outcomes, on_result, 0

    def flush(self) -> None:
        while self.next < len(self.outcomes) and self.outcomes[self.next] is not None:
            if self.on_result is not None:
                self.on_result(self.next, self.outcomes[self.next])
            self.next += 1


def run_targets(plan_opts: list, rules: dict, timeout: float, jobs: Optional[int] = None, executor: str = "local",
                cache: Any = None, ray_address: Optional[str] = None, progress: bool = False,
                on_result: Optional[Callable[[int, Outcome], None]] = None) -> list[Outcome]:
    """Audit every target of ``plan_opts`` (:class:`normaudit.audit.AuditOptions`) and return their
    :class:`Outcome` in the same order (see the module docstring). ``cache``: a
    :class:`~normaudit.cache.ResultCache` or None (``--no-cache``); ``progress``: one line on stderr per
    finished target. Raises UsageError only for the executor itself (ray missing, cluster unreachable)."""
    from normaudit.cache import cache_key

    outcomes: list[Optional[Outcome]] = [None] * len(plan_opts)
    order = _InOrder(outcomes, on_result)
    keys = [cache_key(o, rules) if cache is not None else None for o in plan_opts]
    pending = []
    for i, key in enumerate(keys):
        report = cache.get(key) if cache is not None else None
        if report is None:
            pending.append(i)
        else:
            outcomes[i] = Outcome(report=report, cached=True)
    finished = [len(plan_opts) - len(pending)]

    def done(i: int, result: Optional[WorkerResult], error: Optional[BaseException], seconds: float) -> None:
        if result is not None and cache is not None:
            cache.put(keys[i], result.report, result.imported)
        outcomes[i] = Outcome(report=result.report if result else None, error=error, seconds=seconds)
        finished[0] += 1
        if progress:
            _progress_line(finished[0], len(plan_opts), plan_opts[i].target, outcomes[i])
        order.flush()

    order.flush()
    if pending and executor == "ray":
        _run_ray(pending, plan_opts, rules, timeout, jobs, ray_address, done)
    elif pending:
        _run_local(pending, plan_opts, rules, timeout, jobs or default_jobs(), done)
    return outcomes  # type: ignore[return-value]


def _progress_line(k: int, n: int, target: str, outcome: Outcome) -> None:
    r = outcome.report
    what = (f"{r.summary.errors} error(s), {r.summary.warnings} warning(s), {r.summary.infos} info"
            if r is not None else "failed")
    print(f"normaudit: [{k}/{n}] {target}: {what} ({outcome.seconds:.1f}s)", file=sys.stderr, flush=True)


def _run_local(pending: list[int], plan_opts: list, rules: dict, timeout: float, jobs: int, done: Callable) -> None:
    """At most ``jobs`` forked workers at a time; in this process, one after another, where fork does not exist."""
    from normaudit.worker import Job, can_isolate, collection_paused, user_code_output, wait_any

    if not can_isolate():
        from normaudit.lazy_imports import install

        install()  # this is the command line's own process
        for i in pending:
            started = time.monotonic()
            try:
                with user_code_output():
                    result = audit_target(plan_opts[i], rules)
            except Exception as exc:  # noqa: BLE001 - the target's outcome
                done(i, None, exc, time.monotonic() - started)
            else:
                done(i, result, None, time.monotonic() - started)
        return
    with collection_paused():  # ~10**6 long-lived objects: a full collection meanwhile would walk them all
        prewarm([plan_opts[i].target for i in pending])
    queue = list(pending)
    running: dict[Any, tuple[int, float]] = {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                i = queue.pop(0)
                work = functools.partial(audit_target, plan_opts[i], rules)
                job = Job(plan_opts[i].target, work, timeout, WorkerResult).start()
                running[job] = (i, time.monotonic())
            for job in wait_any(list(running)):
                i, started = running.pop(job)
                try:
                    result = job.result()
                except Exception as exc:  # noqa: BLE001 - the target's outcome
                    done(i, None, exc, time.monotonic() - started)
                else:
                    done(i, result, None, time.monotonic() - started)
    finally:
        for job in running:
            job.kill()


#: ``ray.init`` options of every run: no dashboard, the workers' output and Ray's logging kept off the driver.
RAY_QUIET = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False,
             "logging_level": logging.ERROR}
#: environment of the driver while Ray runs: no log deduplication summaries, no usage-stats prompt
RAY_QUIET_ENV = {"RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def local_ray_options(jobs: Optional[int] = None) -> dict[str, Any]:
    """``ray.init`` options for a local cluster: ``jobs`` CPUs (None: all), and workers that import this very
    normaudit (its directory first on their ``PYTHONPATH``), not another copy installed elsewhere."""
    import normaudit

    here = str(Path(normaudit.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    options: dict[str, Any] = {**RAY_QUIET, "runtime_env": {"env_vars": {"PYTHONPATH": path}}}
    if jobs:
        options["num_cpus"] = jobs
    return options


def _ray_init(ray: Any, address: Optional[str], jobs: Optional[int]) -> bool:
    """Join the cluster at ``address``, or start a local one (``jobs`` CPUs); True when this call started it
    (the caller shuts it down). An unreachable cluster is a UsageError."""
    if ray.is_initialized():
        return False
    kwargs = {"address": address, **RAY_QUIET} if address else local_ray_options(jobs)
    try:
        with _signal_handlers_kept():
            ray.init(**kwargs)
    except (ConnectionError, ValueError, RuntimeError) as err:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray cluster"
        raise UsageError(f"--executor ray: cannot start or join {where}: {' '.join(str(err).split())[:300]}") from None
    return True


@contextlib.contextmanager
def _signal_handlers_kept():
    """Restore this process's SIGINT and SIGTERM handlers after the block: ``ray.init`` installs its own
    SIGTERM handler (a C++ stack dump, exit status 1), which would skip the command's (its workers' tasks
    cancelled, one line, status 143). Nothing outside the main thread, where handlers cannot be set."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _ray_error(ray: Any, err: BaseException, target: str, phase: Optional[str] = None) -> BaseException:
    """A Ray failure of one task as that target's error, naming the ``phase`` the task had reported
    (:data:`normaudit.phases.PHASES`) like the local executor's."""
    from normaudit.phases import PHASES

    if isinstance(err, (ray.exceptions.WorkerCrashedError, ray.exceptions.LocalRayletDiedError)):
        doing = f" while {PHASES.get(phase, phase)}" if phase else ""
        return UsageError(f"the model's code crashed or ended the Ray worker process{doing}", file=target)
    return err


@contextlib.contextmanager
def ray_driver_quiet():
    """While Ray runs in this process, keep its own output off the user's terminal: the driver's stdout
    (where Ray's error listener prints ``(raylet) A worker died ...`` with ANSI colours) goes to
    ``os.devnull`` at the Python and file-descriptor level, the ``ray`` logger (the token-authentication
    banner of ``ray.init``) shows errors only, :data:`RAY_QUIET_ENV` is set. What normaudit itself says goes
    to stderr (explicitly) and is untouched; the reports are printed after."""
    ray_log = logging.getLogger("ray")
    level, env = ray_log.level, {k: os.environ.get(k) for k in RAY_QUIET_ENV}
    ray_log.setLevel(logging.ERROR)
    os.environ.update(RAY_QUIET_ENV)
    saved = None
    with open(os.devnull, "w", encoding="utf-8") as sink:
        try:
            sys.stdout.flush()
            saved = os.dup(1)
            os.dup2(sink.fileno(), 1)
        except (OSError, ValueError):
            saved = None
        try:
            with contextlib.redirect_stdout(sink):
                yield
        finally:
            if saved is not None:
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(saved, 1)
                    os.close(saved)
            ray_log.setLevel(level)
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _run_ray(pending: list[int], plan_opts: list, rules: dict, timeout: float, jobs: Optional[int],
             address: Optional[str], done: Callable) -> None:
    """The pending targets as Ray tasks (see the module docstring)."""
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs the ray package: pip install 'normaudit[ray]'") from None
    with ray_driver_quiet(), tempfile.TemporaryDirectory(prefix="normaudit-ray-") as phases:
        _ray_tasks(ray, pending, plan_opts, rules, timeout, jobs, address, done, phases)


def _ray_tasks(ray: Any, pending: list[int], plan_opts: list, rules: dict, timeout: float, jobs: Optional[int],
               address: Optional[str], done: Callable, phases: str = "") -> None:
    """Submit at most ``jobs`` tasks at a time (default: the cluster's CPUs), take results as they finish,
    cancel (``force=True``) those past ``timeout`` seconds since submission; task ``i`` reports its phase
    in ``phases/i`` (:class:`PhaseFile`)."""
    from normaudit.phases import PHASES
    from normaudit.worker import decode_message

    started_here = _ray_init(ray, address, jobs)
    in_flight: dict[Any, tuple[int, float]] = {}
    try:
        window = jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))
        task = ray.remote(max_calls=1, max_retries=0, num_cpus=1)(ray_task)
        rules_ref = ray.put(rules)  # once in the object store, not pickled again with every task
        queue = list(pending)
        while queue or in_flight:
            while queue and len(in_flight) < window:
                i = queue.pop(0)
                in_flight[task.remote(plan_opts[i], rules_ref, os.getcwd(), _phase_path(phases, i))] = (
                    i, time.monotonic())
            first_deadline = min(t0 for _, t0 in in_flight.values()) + timeout
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=max(0.0, first_deadline - time.monotonic()))
            for ref in ready:
                i, started = in_flight.pop(ref)
                try:
                    result = decode_message(ray.get(ref), WorkerResult)
                except Exception as exc:  # noqa: BLE001 - the target's outcome
                    err = _ray_error(ray, exc, plan_opts[i].target, read_phase(_phase_path(phases, i)))
                    done(i, None, err, time.monotonic() - started)
                else:
                    done(i, result, None, time.monotonic() - started)
            now = time.monotonic()
            for ref, (i, started) in list(in_flight.items()):
                if now - started >= timeout:
                    ray.cancel(ref, force=True)
                    del in_flight[ref]
                    doing = read_phase(_phase_path(phases, i))
                    doing = f" while {PHASES.get(doing, doing)}" if doing else ""
                    err = UsageError(f"timed out after {timeout:g} s as a Ray task{doing} (--timeout)",
                                     file=plan_opts[i].target)
                    done(i, None, err, now - started)
    finally:
        for ref in in_flight:
            ray.cancel(ref, force=True)
        if started_here:
            ray.shutdown()


def _phase_path(phases: str, i: int) -> Optional[str]:
    return os.path.join(phases, str(i)) if phases else None
