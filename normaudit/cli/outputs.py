"""The outputs of an audit run: which format goes where (``--format``/``-o`` paired, at most one to stdout),
that each file may be written and overwrites no input of the run, the rendering of one or several targets'
results in one format, and the writing."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from normaudit import __version__
from normaudit.cli.exits import EXIT_OK
from normaudit.errors import UsageError


@dataclass
class OutputSpec:
    """One rendering of the run: a format and where it goes (None: stdout)."""

    fmt: str
    path: Optional[str] = None


def plan_outputs(sequence: Sequence[tuple[str, str]]) -> list[OutputSpec]:
    """Pair ``--format``/``-o`` options given in ``sequence`` order (``("format"|"output", value)``).

    Each ``-o`` belongs to the closest ``--format`` before it that has no file yet, or, when given before
    any such format, to the next ``--format``; a lone ``-o FILE`` writes the default text format. Formats
    without a file go to stdout (``-o -`` too); at most one output may. Raises UsageError otherwise.

    >>> [(o.fmt, o.path) for o in plan_outputs([("format", "json"), ("output", "a.json"), ("format", "text")])]
    [('json', 'a.json'), ('text', None)]
    """
    specs: list[OutputSpec] = []
    pending: list[str] = []
    paired: list[bool] = []
    for kind, value in sequence:
        if kind == "format":
            specs.append(OutputSpec(value, pending.pop(0) if pending else None))
            paired.append(specs[-1].path is not None)
        elif specs and not paired[-1]:
            specs[-1].path = value
            paired[-1] = True
        else:
            pending.append(value)
    if pending:
        if specs:
            raise UsageError(f"-o {pending[0]} has no --format of its own: give one --format per -o")
        if len(pending) > 1:
            raise UsageError(f"several -o files ({', '.join(pending)}) but no --format: give one --format per -o")
        specs.append(OutputSpec("text", pending[0]))
    if not specs:
        specs.append(OutputSpec("text", None))
    for spec in specs:
        if spec.path == "-":
            spec.path = None
    to_stdout = [s.fmt for s in specs if s.path is None]
    if len(to_stdout) > 1:
        raise UsageError(f"several formats would go to stdout ({', '.join(to_stdout)}): give all but one an -o FILE")
    files = [s.path for s in specs if s.path is not None]
    dup = next((f for f in files if files.count(f) > 1), None)
    if dup is not None:
        raise UsageError("the same -o file is given twice", file=dup)
    return specs


def check_writable(path: str, what: str = "output") -> None:
    """Raise UsageError unless ``path`` can be created or overwritten (checked before the audit runs)."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"cannot write {what} to {path!r}: it is a directory")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"cannot write {what}: directory {str(parent)!r} does not exist", file=path)
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"cannot write {what}: permission denied", file=path)


def inputs_of_run(plan_opts: Sequence[Any], settings: Any) -> list[tuple[str, str]]:
    """``(path, what)`` of every existing file the run reads: targets (the files of a target directory),
    configs, checkpoints and the settings file."""
    from normaudit.options import split_target

    named: list[tuple[str, str]] = []
    for opts in plan_opts:
        named.append((str(split_target(opts.target)[0]), "a target"))
        named += [(p, what) for p, what in ((opts.config, "a config"), (opts.checkpoint, "a checkpoint")) if p]
    if settings is not None and settings.source is not None:
        named.append((str(settings.source), "the settings file"))
    found: list[tuple[str, str]] = []
    for path, what in named:
        p = Path(path)
        if p.is_dir():
            with contextlib.suppress(OSError):
                found += [(str(f), f"a file of {what} directory") for f in p.iterdir() if f.is_file()]
        elif p.exists():
            found.append((path, what))
    return found


def refuse_overwriting_inputs(paths: Sequence[tuple[str, str]], inputs: Sequence[tuple[str, str]]) -> None:
    """Raise UsageError when an output path (``(path, what)``: ``-o`` files, the baseline to write) is the same
    file as one the run reads (:func:`inputs_of_run`), compared by ``os.path.samefile`` (links and ``..``
    included)."""
    for out, kind in paths:
        if not os.path.exists(out):
            continue
        for path, what in inputs:
            with contextlib.suppress(OSError):
                if os.path.samefile(out, path):
                    raise UsageError(f"refusing to write the {kind} over {what} of this run; give another file",
                                     file=out)


def write_output(text: str, path: Optional[str]) -> None:
    """Write ``text``, ending in a newline unless empty, to ``path`` (None: stdout, flushed). Raises
    UsageError when the file cannot be written."""
    text = text if text.endswith("\n") or not text else text + "\n"
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        raise UsageError(f"cannot write output: {err.strerror or err}", file=path) from err


@dataclass
class TargetResult:
    """The outcome of auditing one target: a report, or the exit status and message of its failure."""

    target: str
    report: Any = None
    status: int = EXIT_OK
    error: Optional[str] = None
    #: the failure itself, re-raised after the ``-o`` files are written when the run has this one target
    exception: Optional[BaseException] = None


def render_results(fmt: str, results: list[TargetResult], rules: dict, multi: bool, options: Any = None,
                   statistics: bool = False) -> str:
    """Render the results of a run in one format: one target exactly as its renderer does; several, or one
    that failed, as one document (``json``: an object with ``reports`` and ``errors``; ``sarif``: one log with
    one run holding every target's results, failed targets as its notifications; ``github``: an ``::error``
    per failed target; ``concise``: the lines of all targets sorted together and
    one summary). ``options``: :class:`normaudit.render.RenderOptions`; ``statistics``: the human formats
    (text, concise) print the findings per rule instead (:mod:`normaudit.render.statistics`)."""
    from normaudit.render import HUMAN_FORMATS, get_renderer

    done = [r for r in results if r.report is not None]
    errors = [{"target": r.target, "status": r.status, "message": r.error} for r in results if r.report is None]
    if statistics and fmt in HUMAN_FORMATS:
        from normaudit.render.statistics import render_statistics

        return render_statistics([r.report for r in done], options)
    if fmt == "sarif":
        from normaudit.render import sarif

        root = getattr(options, "project_root", None)
        return sarif.dumps(sarif.build_log([r.report for r in done], rules, root, errors, version=__version__,
                                           docs_url=getattr(options, "docs_url", None)))
    if fmt == "concise":
        from normaudit.render.concise import render_many

        return render_many([r.report for r in done], options, failed=len(errors), targets=len(results) if multi else None)
    render = get_renderer(fmt)
    if not multi and done:
        return render(done[0].report, rules, options)
    if fmt == "json":
        reports = [json.loads(render(r.report, rules)) for r in done]
        summary = {"targets": len(results), "failed": len(errors),
                   "errors": sum(r.report.summary.errors for r in done),
                   "warnings": sum(r.report.summary.warnings for r in done),
                   "infos": sum(r.report.summary.infos for r in done)}
        doc = {"tool": "normaudit", "version": __version__, "reports": reports, "errors": errors, "summary": summary}
        return json.dumps(doc, indent=2)
    parts = [render(r.report, rules, options) for r in done]
    if fmt == "github":
        from normaudit.render.github import escape_data, escape_property

        parts += [f"::error title={escape_property('normaudit ' + e['target'])}::{escape_data(e['message'] or '')}\n"
                  for e in errors]
        return "".join(parts)
    sep = "\n---\n\n" if fmt == "markdown" else "\n"
    text = sep.join(p.rstrip("\n") + "\n" for p in parts if p)
    if fmt == "text" and multi and not getattr(options, "quiet", False):
        totals = [sum(getattr(r.report.summary, k) for r in done) for k in ("errors", "warnings", "infos")]
        text += (f"\n{len(results)} targets ({len(errors)} failed): {totals[0]} error(s), {totals[1]} warning(s), "
                 f"{totals[2]} info\n")
    return text


def render_options(args: argparse.Namespace, spec: OutputSpec, docs_url: Optional[str] = None) -> Any:
    """The :class:`normaudit.render.RenderOptions` of one output: ``--quiet``, ``--project-root``, colour
    for text or concise going to a terminal stdout without ``NO_COLOR``, and ``docs_url`` (the ``docs-url``
    setting: SARIF's ``helpUri`` base)."""
    from normaudit.render import HUMAN_FORMATS, RenderOptions
    from normaudit.report.locations import project_root
    from normaudit.render.style import color_wanted

    color = spec.path is None and spec.fmt in HUMAN_FORMATS and color_wanted(sys.stdout)
    return RenderOptions(project_root=project_root(args.project_root), color=color, quiet=args.quiet,
                         docs_url=docs_url)


def numerics_charts(outputs: Sequence[OutputSpec], options: list, results: list) -> list[tuple[str, Any]]:
    """The ``--probe numerics`` charts to write beside ``--format markdown -o FILE`` outputs (one target with a
    numerics section, matplotlib installed), as (markdown path, report); sets each such output's
    ``numerics_chart`` (replacing the frozen option in ``options``) so the Markdown links the file (GitHub shows
    no embedded ``data:`` image)."""
    import importlib.util

    done = [r.report for r in results if r.report is not None]
    if len(results) != 1 or not done or done[0].numerics is None or importlib.util.find_spec("matplotlib") is None:
        return []
    from normaudit.render.numerics_chart import chart_path

    charts = []
    for i, spec in enumerate(outputs):
        if spec.fmt == "markdown" and spec.path is not None:
            options[i] = dataclasses.replace(options[i], numerics_chart=chart_path(spec.path).name)
            charts.append((spec.path, done[0]))
    return charts
