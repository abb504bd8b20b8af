"""The audit command, ``normaudit [TARGET ...] [options]``: parse, read the settings, plan the run
(:mod:`normaudit.cli.plan`), audit the targets through the result cache and the executors
(:mod:`normaudit.runner`), apply the baseline, write the outputs (:mod:`normaudit.cli.outputs`), the
baseline file or the ``noqa`` comments, and compute the exit status, the worst over the targets."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from normaudit.cli.exits import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, internal_text
from normaudit.cli.outputs import (TargetResult, numerics_charts, plan_outputs, render_options, render_results,
                                   write_output)
from normaudit.cli.parser import audit_parser
from normaudit.cli.plan import RunPlan, plan_run
from normaudit.errors import UsageError
from normaudit.options import DEFAULT_TIMEOUT


def cmd_audit(argv: Sequence[str]) -> int:
    """``normaudit [TARGET ...] [options]``: parse, read the settings, check the run
    (:func:`normaudit.cli.plan.plan_run`), audit the targets (:func:`_audit_targets`) and write the outputs
    (:func:`_finish_run`); returns the exit status."""
    args = audit_parser().parse_intermixed_args(argv)  # first: --help/--version import nothing more
    from normaudit.settings import discover_settings
    from normaudit.loaders.hf import set_offline

    set_offline()  # never touch the network (Hugging Face targets)
    outputs = plan_outputs(args.output_sequence)
    settings = discover_settings(args.settings, args.isolated)
    if args.show_settings:
        return _show_settings(args, settings)
    plan = plan_run(args, settings, outputs)
    results = _audit_targets(plan.plan_opts, plan.rules, plan.baseline, plan.baseline_base, plan.timeout,
                             plan.fail_on, args, settings)
    return _finish_run(args, plan, results)


def _show_settings(args: argparse.Namespace, settings: Any) -> int:
    """``--show-settings``: print the settings in force (:func:`normaudit.settings.show_settings`), each key
    with its source: a flag (or the environment variable that overrides it), the file and line, or the default."""
    from normaudit.cache import cache_root
    from normaudit.runner import default_jobs
    from normaudit.settings import show_settings

    flags = {"select": args.select, "ignore": args.ignore, "fail-on": args.fail_on, "dtype": args.dtype,
             "batch-size": args.batch_size, "rules": args.rules, "input-axes": args.input_axes,
             "config": args.config, "baseline": args.baseline, "timeout": args.timeout,
             "targets": list(args.targets) or None, "jobs": args.jobs, "full-capture": args.full_capture,
             "cache": False if args.no_cache else None,
             "checkpoint": args.checkpoint, "probe": args.probe or None, "max-params": args.max_params}
    where = {"targets": "command line", "cache": "--no-cache",
             "full-capture": "--no-full-capture" if args.full_capture is False else "--full-capture"}
    env_cache = _cache_from_environment(settings.cache)
    if flags["cache"] is None and env_cache is not None:
        flags["cache"], where["cache"] = env_cache
    root = cache_root(settings.source, settings.cache)
    defaults = {"fail-on": "error", "dtype": "float32", "timeout": DEFAULT_TIMEOUT, "jobs": default_jobs(),
                "full-capture": False, "cache": str(root) if root is not None else False}
    sys.stdout.write(show_settings(settings, flags, defaults, where))
    return EXIT_OK


def _cache_from_environment(setting: Any) -> Optional[tuple[Any, str]]:
    """``(value, source)`` of the cache setting when an environment variable decides it over the file's
    ``setting`` (:func:`normaudit.cache.cache_root`): ``NORMAUDIT_NO_CACHE`` turns it off,
    ``NORMAUDIT_CACHE_DIR`` names the directory (unless the file says ``cache = false``); else None."""
    if os.environ.get("NORMAUDIT_NO_CACHE", "") not in ("", "0"):
        return False, "$NORMAUDIT_NO_CACHE"
    if os.environ.get("NORMAUDIT_CACHE_DIR") and setting is not False:
        return os.environ["NORMAUDIT_CACHE_DIR"], "$NORMAUDIT_CACHE_DIR"
    return None


def _audit_targets(plan_opts: list, rules: dict, baseline: Any, base: Path, timeout: float,
                   fail_on: str, args: Optional[argparse.Namespace] = None, settings: Any = None) -> list[TargetResult]:
    """Audit the targets (:func:`normaudit.runner.run_targets`: the result cache, then ``-j N`` worker
    processes or Ray tasks, each under ``timeout`` seconds) and apply the baseline; results in the targets'
    order. With several targets one target's bad input (exit 2) or internal error (exit 3) is that target's
    result, said on stderr as soon as the targets before it are done, and the others go on."""
    from normaudit.options import exit_status
    from normaudit.baseline import apply_baseline
    from normaudit.runner import run_targets

    multi = len(plan_opts) > 1
    debug = bool(os.environ.get("NORMAUDIT_DEBUG"))
    results: list[TargetResult] = []

    def on_result(i: int, outcome: Any) -> None:
        result = TargetResult(target=plan_opts[i].target)
        if outcome.report is not None:
            report = outcome.report if baseline is None else apply_baseline(outcome.report, baseline, base)
            result.report, result.status = report, exit_status(report, fail_on)
        elif isinstance(outcome.error, UsageError):
            result.status, result.error = EXIT_USAGE, str(outcome.error)
        else:  # one target's internal error must not hide the others
            if debug:
                raise outcome.error
            result.status, result.error = EXIT_INTERNAL, f"internal error: {internal_text(outcome.error)}"
        if not multi:  # said once, by main(), after the -o files are written
            result.exception = outcome.error
        results.append(result)
        if result.error and multi:
            print(f"normaudit: error: {result.error}", file=sys.stderr)

    verbose = bool(args is not None and args.verbose)
    cache = _result_cache(args, settings, verbose)
    executor = (args.executor or ("ray" if args.ray_address else "local")) if args is not None else "local"
    if args is not None and args.ray_address and executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    jobs = (args.jobs or getattr(settings, "jobs", None)) if args is not None else None
    outcomes = run_targets(plan_opts, rules, timeout, jobs=jobs,
                           executor=executor, cache=cache, ray_address=args.ray_address if args is not None else None,
                           progress=multi and _stderr_is_tty(), on_result=on_result)
    if verbose and cache is not None:
        hits = sum(o.cached for o in outcomes)
        print(f"normaudit: cache {cache.root}: {hits} of {len(outcomes)} target(s) answered", file=sys.stderr)
    return results


def _result_cache(args: Optional[argparse.Namespace], settings: Any, verbose: bool) -> Any:
    """The :class:`normaudit.cache.ResultCache` of this run, None with ``--no-cache``/``NORMAUDIT_NO_CACHE``
    or where no cache directory may be used."""
    from normaudit.cache import ResultCache, cache_disabled, cache_root

    setting = getattr(settings, "cache", None)
    no_cache = args is not None and args.no_cache
    if cache_disabled(no_cache, setting):
        return None
    root = cache_root(getattr(settings, "source", None), setting, no_cache)
    if root is None:
        if verbose:
            print("normaudit: no cache directory outside site-packages: results not cached", file=sys.stderr)
        return None
    note = (lambda text: print(f"normaudit: {text}", file=sys.stderr)) if verbose else None
    return ResultCache(root, note)


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _finish_run(args: argparse.Namespace, plan: RunPlan, results: list[TargetResult]) -> int:
    """Render and write every output (a lone failed target: the ``-o`` files, then its error is raised), the
    numerics charts, the baseline (``--write-baseline``) and the ``noqa`` comments (``--add-noqa``); returns
    the exit status, the worst over the targets."""
    from normaudit.baseline import write_baseline

    multi = len(plan.plan_opts) > 1
    options = [render_options(args, spec, plan.docs_url) for spec in plan.outputs]  # before stdout is redirected: colour on a tty
    charts = numerics_charts(plan.outputs, options, results)
    with contextlib.redirect_stdout(sys.stderr):
        rendered = [(render_results(spec.fmt, results, plan.rules, multi, opts, args.statistics), spec.path,
                     spec.fmt) for spec, opts in zip(plan.outputs, options)]
    failure = next((r.exception for r in results if r.exception is not None), None)
    quiet_stdout = _adopting_only(args)
    for text, path, fmt in rendered:
        # a failed lone target: stdout stays empty (the error goes to stderr), files are written; GitHub's
        # workflow commands are read from stdout, so its ``::error`` line is printed there too
        if path is None and quiet_stdout:
            continue
        if failure is None or path is not None or fmt == "github":
            write_output(text, path)
    for path, report in charts:
        from normaudit.render.numerics_chart import write_chart

        write_chart(report, path)
    if failure is not None:
        raise failure
    status = max(r.status for r in results)
    if args.write_baseline:
        n = write_baseline(args.write_baseline, [r.report for r in results if r.report is not None])
        print(f"normaudit: wrote {n} finding(s) to the baseline {args.write_baseline}", file=sys.stderr)
        if status == EXIT_FINDINGS:
            status = EXIT_OK
    if args.add_noqa:
        status = _add_noqa(results, plan.fail_on)
    return status


def _adopting_only(args: argparse.Namespace) -> bool:
    """True when the run writes a baseline or ``noqa`` comments and no ``--format``/``-o`` was asked for: then,
    as a linter's ``--add-noqa`` does, it says what it wrote (on stderr) instead of printing the report too."""
    return bool(args.write_baseline or args.add_noqa) and not args.output_sequence


def _add_noqa(results: list[TargetResult], fail_on: str) -> int:
    """``--add-noqa`` after the audit: write the comments (:func:`normaudit.noqa.add_noqa`), say what was
    done on stderr, and return the exit status the findings left (not suppressed) give."""
    from normaudit.options import exit_status
    from normaudit.noqa import add_noqa
    from normaudit.options import split_target

    done = [r for r in results if r.report is not None]
    outcome = add_noqa([(r.report, split_target(r.target)[0]) for r in done])
    for file, line, cause in outcome.unplaced:
        print(f"normaudit: {file}:{line}: {cause}", file=sys.stderr)
    print(outcome.summary(), file=sys.stderr)
    left = {id(f) for f in outcome.left}
    status = max([r.status for r in results if r.report is None], default=EXIT_OK)
    for r in done:
        rest = r.report.model_copy(update={"findings": [f for f in r.report.findings if id(f) in left]})
        status = max(status, exit_status(rest, fail_on))
    return status
