"""Audit the zoo: every AutoModel type of transformers and one model per timm family, with normaudit.

    python benchmarks/zoo/sweep.py --corpus transformers,timm --timeout 120 -j 2 --out /tmp/zoo

Run it with the sweep's venv python (``benchmarks/zoo/setup_venv.sh``: timm + torchvision beside the main
environment). Targets are handed to workers (:mod:`worker`), long-lived processes that audit one target
at a time and are killed and restarted when a target passes ``--timeout`` seconds (build, audit and the
ground-truth forward together), after ``--restart-every`` targets, or when its resident memory after a
target passes ``--max-rss-mb``. Writes into ``--out``:
``results.jsonl`` (one JSON object per target, appended as they finish), ``zoo.tsv`` and ``summary.md``
(:mod:`summary`), and ``targets/<corpus>/<name>/`` (the target as written, its report and log).

``--mode`` says how each transformers type is sized, a comma list of :data:`worker.MODES`: "careful" (the
default: the shrink of :mod:`targets` that keeps the config's relations, a real forward as ground truth),
"full" (the library's default config at full size, built on the meta device, audited, no forward) and
"plain" (widths 64, 2 layers, no relation kept). Each mode's targets go to ``targets/<corpus>-<mode>/``
(careful: ``targets/<corpus>/``) and the summary gives each mode's figures side by side. timm models are
audited at their own (full) size in the careful mode and are not repeated in the others.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import summary  # noqa: E402


@dataclass
class Worker:
    """One worker process, its job channel (stdin) and result channel (a pipe), and the job it runs."""

    proc: subprocess.Popen
    results: Any
    job: Optional[dict[str, Any]] = None
    started: float = 0.0
    served: int = 0
    buffer: bytes = field(default=b"")


def start_worker(python: str, log: Path) -> Worker:
    """Start ``worker.py`` in its own session (so a timeout kills it and everything it started)."""
    read_fd, write_fd = os.pipe()
    with open(log, "ab") as err:
        proc = subprocess.Popen([python, str(HERE / "worker.py"), "--result-fd", str(write_fd)],
                                stdin=subprocess.PIPE, stdout=err, stderr=err, pass_fds=(write_fd,),
                                start_new_session=True, cwd=str(log.parent))
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    return Worker(proc=proc, results=read_fd)


def stop_worker(worker: Worker) -> None:
    """Kill the worker's process group (its own session, started by :func:`start_worker`)."""
    if worker.proc.poll() is None:
        try:
            os.killpg(worker.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    worker.proc.wait()
    os.close(worker.results)
    if worker.proc.stdin:
        try:
            worker.proc.stdin.close()
        except BrokenPipeError:
            pass


def modes(args) -> list[str]:
    """The modes of ``--mode`` (a comma list of :data:`MODES`), in their order; raises SystemExit on an
    unknown one."""
    wanted = [m for m in (args.mode or "careful").split(",") if m]
    unknown = [m for m in wanted if m not in MODES]
    if unknown or not wanted:
        raise SystemExit(f"--mode: unknown mode(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(MODES)}")
    return wanted


#: the sizes a transformers type is audited at (:data:`worker.MODES`, repeated here: the driver imports no torch)
MODES = ("careful", "full", "plain")


def enumerate_jobs(args) -> list[dict[str, Any]]:
    """The sweep's targets, timm first (a smaller corpus, read first when triaging a running sweep), then the
    transformers types once per mode of ``--mode`` (:func:`modes`)."""
    import targets

    only = set(args.only.split(",")) if args.only else None
    jobs: list[dict[str, Any]] = []
    corpora = args.corpus.split(",")
    if "timm" in corpora and "careful" in modes(args):
        cache = args.out / "timm_models.json"
        if cache.is_file():
            picked = json.loads(cache.read_text())
        elif only is not None:  # only the families asked for (a partial list is not cached)
            picked = targets.timm_families(only)
        else:
            picked = targets.timm_families()
            cache.write_text(json.dumps(picked))
        for family, name, n_params in picked:
            if only is None or family in only or name in only:
                jobs.append({"corpus": "timm", "name": name, "family": family, "params_meta": n_params})
    if "transformers" in corpora:
        types = targets.transformers_types(only)
        if args.shuffle is not None:  # a sweep cut short is then still a fair sample
            random.Random(args.shuffle).shuffle(types)
        jobs += [{"corpus": "transformers", "name": t, "mode": m} for m in modes(args) for t in types]
    for job in jobs:
        mode = job.setdefault("mode", "careful")
        folder = job["corpus"] if mode == "careful" else f"{job['corpus']}-{mode}"
        job["dir"] = str(args.out / "targets" / folder / job["name"])
    return jobs[: args.limit] if args.limit else jobs


def dispatch(worker: Worker, job: dict[str, Any]) -> None:
    """Hand ``job`` to an idle worker."""
    worker.job, worker.started = job, time.monotonic()
    worker.proc.stdin.write((json.dumps(job) + "\n").encode())
    worker.proc.stdin.flush()


def failure(job: dict[str, Any], kind: str, seconds: float) -> dict[str, Any]:
    """The result recorded for a target whose worker timed out or died."""
    return {"corpus": job["corpus"], "name": job["name"], "family": job.get("family", ""),
            "mode": job.get("mode", "careful"), "exit": kind,
            "total_s": round(seconds, 1), "error": f"{kind} after {seconds:.0f} s"}


def read_result(worker: Worker) -> Optional[dict[str, Any]]:
    """A finished result from the worker's pipe, or None (nothing complete yet); raises EOFError on death."""
    try:
        chunk = os.read(worker.results, 1 << 20)
    except BlockingIOError:
        return None
    if not chunk:
        raise EOFError
    worker.buffer += chunk
    if b"\n" not in worker.buffer:
        return None
    line, worker.buffer = worker.buffer.split(b"\n", 1)
    return json.loads(line)


def run(args, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run every job on ``args.jobs`` workers; returns the results in completion order."""
    pending, done = list(jobs), []
    sel = selectors.DefaultSelector()
    workers = [start_worker(args.python, args.out / f"worker{i}.log") for i in range(args.jobs)]
    for w in workers:
        sel.register(w.results, selectors.EVENT_READ, w)
    out = open(args.out / "results.jsonl", "a")

    def finish(w: Worker, result: dict[str, Any], restart: bool) -> Worker:
        result.setdefault("family", w.job.get("family", ""))
        done.append(result)
        out.write(json.dumps(result) + "\n")
        out.flush()
        print(f"[{len(done)}/{len(jobs)}] {result['corpus']} {result['name']} ({result.get('mode', 'careful')}): "
              f"exit {result.get('exit')} "
              f"{result.get('total_s', '')} s", flush=True)
        w.job = None
        w.served += 1
        if not (restart or w.served >= args.restart_every or (result.get("rss_mb") or 0) > args.max_rss_mb):
            return w
        sel.unregister(w.results)
        stop_worker(w)
        fresh = start_worker(args.python, args.out / f"worker{workers.index(w)}.log")
        sel.register(fresh.results, selectors.EVENT_READ, fresh)
        workers[workers.index(w)] = fresh
        return fresh

    try:
        while pending or any(w.job for w in workers):
            for w in list(workers):
                if w.job is None and pending:
                    dispatch(w, pending.pop(0))
            for key, _ in sel.select(timeout=1.0):
                w = key.data
                try:
                    result = read_result(w)
                except EOFError:
                    finish(w, failure(w.job, "worker died", time.monotonic() - w.started), True)
                    continue
                if result is not None:
                    finish(w, result, False)
            for w in list(workers):
                if w.job is not None and time.monotonic() - w.started > args.timeout:
                    finish(w, failure(w.job, "timeout", time.monotonic() - w.started), True)
    finally:
        for w in workers:
            stop_worker(w)
        out.close()
    return done


def main(argv=None) -> int:
    """Parse the command line, run the sweep, write the TSV and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="transformers,timm", help="comma list: transformers, timm")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per target (default 120)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="parallel workers (default 2)")
    parser.add_argument("--out", type=Path, required=True, help="output directory (created)")
    parser.add_argument("--mode", default="careful", help="comma list of how transformers types are sized: "
                        "careful (relations kept, a real forward), full (library defaults, full size, meta "
                        "only), plain (widths 64, 2 layers, no relation kept); default careful")
    parser.add_argument("--only", help="comma list of model types / timm families or model names")
    parser.add_argument("--limit", type=int, help="audit only the first N targets")
    parser.add_argument("--restart-every", type=int, default=200, help="restart a worker after N targets "
                        "(default 200; a restart costs ~10 CPU s of imports)")
    parser.add_argument("--max-rss-mb", type=float, default=4000.0, help="restart a worker whose resident "
                        "memory after a target exceeds this (default 4000 MB)")
    parser.add_argument("--shuffle", type=int, metavar="SEED", help="audit transformers types in a "
                        "shuffled order (seeded)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the workers")
    parser.add_argument("--summarise", action="store_true", help="only rewrite zoo.tsv/summary.md from "
                        "results.jsonl")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarise:
        start = time.monotonic()
        jobs = enumerate_jobs(args)
        print(f"{len(jobs)} targets, {args.jobs} workers, timeout {args.timeout:.0f} s", flush=True)
        run(args, jobs)
        (args.out / "wall_seconds.txt").write_text(f"{time.monotonic() - start:.0f}\n")
    results = [json.loads(line) for line in open(args.out / "results.jsonl")]
    summary.write_tsv(results, args.out / "zoo.tsv")
    summary.write_markdown(results, args.out / "summary.md", wall_file=args.out / "wall_seconds.txt")
    print(f"wrote {args.out / 'zoo.tsv'} and {args.out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
