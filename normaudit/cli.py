"""Command line (CONTRACT.md):

    normaudit [TARGET ...] [--config PATH] [--checkpoint PATH] [--dtype float32|float16|bfloat16]
                     [--batch-size N] [--format FMT [-o FILE]]... [-q] [--statistics] [--project-root DIR]
                     [--fail-on error|warning|info|never]
                     [--select IDS] [--ignore IDS] [--rules DIR] [--input-axes B,C,H,W]
                     [--probe batch|size|numerics|numerics-backward|numerics-autocast] [--max-params N]
                     [--baseline FILE] [--write-baseline FILE] [--settings FILE] [--isolated]
                     [--timeout SECONDS] [--add-noqa] [--show-settings]
                     [-j N] [--executor local|ray] [--ray-address ADDRESS] [--no-cache] [-v]
    normaudit rules [--format text|json]    list the rules
    normaudit explain ID         print one rule's documentation
    normaudit schema             print the JSON schema of the report
    normaudit docs [--output DIR] [--check] generate docs/rules/ from the rule files (:mod:`normaudit.docs`)

``--add-noqa`` writes ``# normaudit: ignore[ID]`` on each finding's line in the user's own files
(:mod:`normaudit.noqa`), the one option that edits them; ``--show-settings`` prints the settings in force.
``--add-noqa`` and ``--write-baseline`` say on stderr what they wrote and print no report, unless a ``--format``
or ``-o`` asks for one.

TARGET: ``model.py[:factory]``, ``package.module:factory``, a directory with a Hugging Face ``config.json``,
a bare ``config.json``, or a checkpoint alone (``.safetensors``, ``.pt``, ``.pth``, ``.bin``, a sharded index). Without TARGET the ``targets`` of the settings file (``[tool.normaudit]`` in
``pyproject.toml`` or ``normaudit.toml``, see :mod:`normaudit.settings`) are audited; flags override the
settings.

Outputs: each ``-o FILE`` belongs to the ``--format`` just before it (or, given first, the next one); a
format without ``-o`` goes to stdout, and at most one may. With several targets, ``json`` is one document
``{"tool", "version", "reports": [...], "errors": [...], "summary"}``; with one target it is exactly the
report object of CONTRACT.md. A lone target that fails (exit 2 or 3) leaves stdout empty but still writes
each ``-o`` file, as several targets do: SARIF with the error notification and no results, ``json`` the
several-targets document with ``"reports": []`` and the error in ``errors`` (there is no report to write).
``sarif`` is one log with one run holding every target's results (paths
relative to ``--project-root``, default the git top level); ``concise`` sorts all targets' lines together
under one summary. ``-q/--quiet`` leaves the findings only and ``--statistics`` prints the findings per rule
instead, in the human formats (``text``, ``concise``), which are coloured on a terminal without ``NO_COLOR``.

Each target's user code (import, build, capture, probes) runs in a worker process under ``--timeout``
seconds (:mod:`normaudit.worker`): a hang or a crash of the model's code is exit 2 naming the phase;
``-j N`` targets run at once, or as Ray tasks (``--executor ray``), and an unchanged target's report comes
from the result cache (:mod:`normaudit.runner`, :mod:`normaudit.cache`; ``--no-cache``). No
output (``-o``, ``--write-baseline``) may overwrite a target, config, checkpoint or settings file of the run.

Exit status: 0 no finding at or above --fail-on, 1 such findings, 2 bad input or usage, 3 internal error;
with several targets, the worst over the targets. ``--write-baseline`` exits 0 once the file is written.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence

from normaudit import __version__
from normaudit.arguments import CommandParser
from normaudit.errors import UsageError
from normaudit.options import DEFAULT_TIMEOUT

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
FORMATS = ["text", "concise", "json", "sarif", "github", "markdown"]


def _ids(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class _OutputAction(argparse.Action):
    """Records ``--format`` and ``-o`` in command-line order, so each ``-o`` pairs with its own format."""

    def __call__(self, parser, namespace, values, option_string=None):
        seq = list(getattr(namespace, "output_sequence", None) or [])
        seq.append((self.dest, values))
        namespace.output_sequence = seq


def audit_parser() -> argparse.ArgumentParser:
    """The parser of the audit command (``normaudit [TARGET ...] [options]``)."""
    p = CommandParser(prog="normaudit", description="Audit the normalisation layers of a PyTorch model.",
                epilog="Other commands: 'normaudit rules', 'normaudit explain ID', 'normaudit schema', "
                       "'normaudit docs' (generate docs/rules/). "
                       "Settings: [tool.normaudit] in pyproject.toml or normaudit.toml, found from the current "
                       "directory upward; flags override them.")
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="model.py[:factory], package.module:factory, a Hugging Face model directory or config.json, or a "
                        "checkpoint alone (.safetensors, .pt, .pth, .bin, a sharded index or a directory of them) "
                        "(default: 'targets' from the settings file)")
    p.add_argument("--config", help="the configuration the model is meant to follow (JSON or YAML)")
    p.add_argument("--checkpoint", help="weights to audit together with the model (one target only; several "
                   "targets each take theirs from 'checkpoint' in the settings' targets)")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="the precision the model will train or run in (default float32)")
    p.add_argument("--batch-size", type=_positive_int, help="the per-device training micro-batch")
    p.add_argument("--format", dest="format", action=_OutputAction, choices=FORMATS,
                   help="output format (default text); repeat, each with its own -o, to write several in one run")
    p.add_argument("-o", "--output", dest="output", action=_OutputAction, metavar="FILE",
                   help="write the preceding --format to FILE instead of stdout")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print the findings only: no site table, header or summary (text and concise formats)")
    p.add_argument("--statistics", action="store_true",
                   help="print the number of findings per rule instead of the findings (text and concise formats)")
    p.add_argument("--project-root", metavar="DIR",
                   help="the directory SARIF paths are relative to (default: the git top level, else the "
                        "current directory)")
    p.add_argument("--fail-on", choices=["error", "warning", "info", "never"],
                   help="lowest severity that makes the exit status 1 (default error)")
    p.add_argument("--select", type=_ids, help="comma-separated rule ids, id prefixes, names or categories")
    p.add_argument("--ignore", type=_ids, help="comma-separated rule ids, id prefixes, names or categories")
    p.add_argument("--rules", action="append", metavar="DIR", help="a directory of extra rule files")
    p.add_argument("--input-axes", help="axes of the first input, e.g. B,C,H,W or batch,sequence")
    p.add_argument("--probe", action="append", default=[], choices=["batch", "size", "numerics", "numerics-backward",
                                                                 "numerics-autocast"],
                   help="opt-in dynamic probe: 'batch' runs a small real copy of the model and checks that each "
                        "norm's output for one example does not depend on the other examples; 'size' forces the "
                        "re-capture at other spatial/sequence sizes on graphs above 1500 nodes (smaller ones get it "
                        "by default); 'numerics' runs the model for real in --dtype (weights from --checkpoint, "
                        "else the factory's random init) and reports the first module making inf/NaN, eps-dominated "
                        "norms and headroom to the dtype's maximum; 'numerics-backward' adds one backward; "
                        "'numerics-autocast' keeps float32 weights and runs under torch.autocast instead of casting")
    p.add_argument("--max-params", type=_positive_int, metavar="N",
                   help="the most parameters --probe numerics builds for real (default 1000000000); above it: exit 2")
    p.add_argument("--baseline", metavar="FILE", help="report only findings not recorded in this baseline")
    p.add_argument("--write-baseline", metavar="FILE", help="record the current findings as the baseline")
    p.add_argument("--settings", metavar="FILE", help="the normaudit settings file (default: normaudit.toml or "
                   "pyproject.toml [tool.normaudit] from the current directory upward)")
    p.add_argument("--isolated", action="store_true", help="ignore every settings file")
    p.add_argument("--timeout", type=_positive_seconds, metavar="SECONDS",
                   help="seconds each target may take to import, build, capture and probe its model "
                        "(default 300); past it the target is exit 2 naming the phase")
    p.add_argument("-j", "--jobs", type=_positive_int, metavar="N",
                   help="targets audited at once, each in its own worker process (default: the number of CPU cores; "
                        "with --executor ray, the cluster's CPUs)")
    p.add_argument("--executor", choices=["local", "ray"],
                   help="where the targets run: 'local' worker processes (default) or Ray tasks ('pip install "
                        "normaudit[ray]'), on a local Ray cluster or the one --ray-address names")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="the Ray cluster to run on (as ray.init(address=...): 'auto', 'ray://HOST:10001'); "
                        "implies --executor ray")
    p.add_argument("--full-capture", action=argparse.BooleanOptionalAction, default=None,
                   help="capture every block of a stack of identical blocks instead of each distinct block once "
                        "with its facts carried to the others (same report, slower; 'full-capture' in settings)")
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the result cache (.normaudit_cache/ beside the settings file, "
                        "else $XDG_CACHE_HOME/normaudit; NORMAUDIT_NO_CACHE=1 does the same)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say on stderr where the cache is, how many targets it answered, and why it was skipped")
    p.add_argument("--add-noqa", action="store_true",
                   help="write '# normaudit: ignore[ID]' on the line of each finding in your own files (never in "
                        "installed packages), merging with existing ones; the only option that edits your files")
    p.add_argument("--show-settings", action="store_true",
                   help="print the settings in force and the file they came from, and exit")
    p.add_argument("--version", action="version", version=f"normaudit {__version__}")
    p.set_defaults(output_sequence=[])
    return p


# ------------------------------------------------------------------------------------------ other commands
def _listed_rules(argv_rules: Optional[list[str]]) -> tuple[list[str], dict[str, Any], Any]:
    """The ``--rules`` directories (else those of the settings file), the rules for ``rules``/``explain``, and
    the validation memo they came through: read from the memo of the cache directory when these files were
    validated before by this code (:func:`normaudit.engine.loader.load_rules_listed`,
    :func:`normaudit.settings.validated_table`: no pydantic, under 0.5 s), else loaded and validated."""
    from normaudit.cache import validation_memo
    from normaudit.engine.loader import load_rules_listed
    from normaudit.settings import table_rules, validated_table

    source, table = validated_table() if not argv_rules else (None, {})
    dirs = argv_rules or table_rules(source, table)
    memo = validation_memo(source, table.get("cache"))
    return dirs, load_rules_listed(dirs, memo), memo


def _first_sentence(text: str) -> str:
    """The first sentence of a rule's ``doc.what``, on one line."""
    flat = " ".join(text.split())
    cut = re.search(r"\.(\s+[A-Z]|$)", flat)
    return flat[: cut.start() + 1] if cut else flat


def _cmd_rules(argv: Sequence[str]) -> int:
    """``normaudit rules [--format text|json]``: one line per rule, or a JSON list of objects with ``id``,
    ``name``, ``category``, ``severity``, ``confidence``, ``summary`` (first sentence of ``doc.what``) and
    ``docs`` (the generated page, ``docs/rules/ID.md``; null for a rule from ``--rules DIR``)."""
    p = CommandParser(prog="normaudit rules", description="List the rules.")
    p.add_argument("--rules", action="append", metavar="DIR")
    p.add_argument("--format", choices=["text", "json"], default="text")
    args = p.parse_args(argv)
    dirs, rules, memo = _listed_rules(args.rules)
    ordered = sorted(rules.values(), key=lambda r: r.id)
    if args.format == "json":
        from normaudit.docs import doc_path
        from normaudit.engine.loader import load_rules_listed

        shipped = set(load_rules_listed([], memo)) if dirs else set(rules)
        print(json.dumps([{"id": r.id, "name": r.name, "category": r.category, "severity": r.severity,
                           "confidence": r.confidence, "summary": _first_sentence(r.doc.what),
                           "docs": doc_path(r.id) if r.id in shipped else None} for r in ordered], indent=2))
        return EXIT_OK
    width = max((len(r.name) for r in rules.values()), default=0)
    for rule in ordered:
        print(f"{rule.id}  {rule.name.ljust(width)}  {rule.category:<10} {rule.severity:<8} {_first_sentence(rule.doc.what)}")
    return EXIT_OK


def _cmd_docs(argv: Sequence[str]) -> int:
    """``normaudit docs [--output DIR] [--check]``: generate the rule pages (:mod:`normaudit.docs`)."""
    from normaudit.docs import main as docs_main

    return docs_main(argv, prog="normaudit docs")


def _cmd_explain(argv: Sequence[str]) -> int:
    p = CommandParser(prog="normaudit explain", description="Print one rule's documentation.")
    p.add_argument("rule_id")
    p.add_argument("--rules", action="append", metavar="DIR")
    args = p.parse_args(argv)
    rules = _listed_rules(args.rules)[1]
    key = args.rule_id.strip()
    rule = rules.get(key.upper()) or next((r for r in rules.values() if r.name == key), None)
    if rule is None:
        raise UsageError(f"no rule {key!r}; 'normaudit rules' lists them")
    d = rule.doc
    print(f"{rule.id} {rule.name}  ({rule.category}, {rule.severity})\n")
    for title, body in (("What it does", d.what), ("Why it matters", d.why), ("Example", d.example),
                        ("Use instead", d.use_instead)):
        print(f"## {title}\n{body.rstrip()}\n")
    print("## References")
    for ref in d.references:
        print(f"- {ref}")
    return EXIT_OK


def _cmd_schema(argv: Sequence[str]) -> int:
    """``normaudit schema``: the JSON schema of the report, kept in the validation memo of the cache directory
    (keyed by normaudit's source and pydantic's files, :func:`normaudit.cache.validation_key`) so that a second
    call builds no pydantic model. The settings file's ``cache`` key is honoured as by the audit (``cache =
    false``: no memo is read or written; a directory: the memo is kept there)."""
    from normaudit.cache import validation_key, validation_memo
    from normaudit.settings import validated_table

    p = CommandParser(prog="normaudit schema", description="Print the JSON schema of the report (--format json).")
    p.parse_args(argv)
    source, table = validated_table()
    memo = validation_memo(source, table.get("cache"))
    key = validation_key("report-schema", None) if memo is not None else ""
    text = memo.get(key) if memo is not None else None
    if not isinstance(text, str):
        from normaudit.report import Report

        text = json.dumps(Report.model_json_schema(), indent=2)
        if memo is not None:
            memo.put(key, text)
    print(text)
    return EXIT_OK


# ------------------------------------------------------------------------------------------------- outputs
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


def _inputs_of_run(plan_opts: Sequence[Any], settings: Any) -> list[tuple[str, str]]:
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
    file as one the run reads (:func:`_inputs_of_run`), compared by ``os.path.samefile`` (links and ``..``
    included)."""
    for out, kind in paths:
        if not os.path.exists(out):
            continue
        for path, what in inputs:
            with contextlib.suppress(OSError):
                if os.path.samefile(out, path):
                    raise UsageError(f"refusing to write the {kind} over {what} of this run; give another file",
                                     file=out)


def _write(text: str, path: Optional[str]) -> None:
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
        return sarif.dumps(sarif.build_log([r.report for r in done], rules, root, errors, version=__version__))
    if fmt == "concise":
        from normaudit.render.concise import render_many

        return render_many([r.report for r in done], options, failed=len(errors))
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


def render_options(args: argparse.Namespace, spec: OutputSpec) -> Any:
    """The :class:`normaudit.render.RenderOptions` of one output: ``--quiet``, ``--project-root``, and
    colour for text or concise going to a terminal stdout without ``NO_COLOR``."""
    from normaudit.render import HUMAN_FORMATS, RenderOptions
    from normaudit.render.locations import project_root
    from normaudit.render.style import color_wanted

    color = spec.path is None and spec.fmt in HUMAN_FORMATS and color_wanted(sys.stdout)
    return RenderOptions(project_root=project_root(args.project_root), color=color, quiet=args.quiet)


def _numerics_charts(outputs: Sequence[OutputSpec], options: list, results: list) -> list[tuple[str, Any]]:
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


# --------------------------------------------------------------------------------------------------- audit
def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _check_selectors(patterns: list[str], rules: dict, option: str, settings: Any = None, key: str = "") -> None:
    """Raise UsageError for a selector that matches no rule (a typo would otherwise select nothing)."""
    from typing import get_args

    from normaudit.report import Category

    categories = set(get_args(Category))
    for p in patterns:
        if p in categories or any(r.id.startswith(p) or r.name == p for r in rules.values()):
            continue
        msg = f"{option}: {p!r} matches no rule id, id prefix, rule name or category ('normaudit rules' lists them)"
        if settings is not None and settings.source is not None:
            raise UsageError(msg, file=str(settings.source), line=settings.line_of(key))
        raise UsageError(msg)


def _target_options(t: Any, args: argparse.Namespace, settings: Any, rules_dirs: list[str]):
    from normaudit.options import AuditOptions
    from normaudit.settings import TargetSettings

    spec = t if isinstance(t, TargetSettings) else TargetSettings(path=str(t))
    return AuditOptions(
        target=spec.path,
        config=args.config or spec.config or settings.config,
        checkpoint=args.checkpoint or spec.checkpoint,
        dtype=args.dtype or spec.dtype or settings.dtype or "float32",
        batch_size=args.batch_size or spec.batch_size or settings.batch_size,
        rules_dirs=rules_dirs,
        select=args.select if args.select is not None else list(settings.select or []),
        ignore=args.ignore if args.ignore is not None else list(settings.ignore or []),
        input_axes=args.input_axes or spec.input_axes or settings.input_axes,
        probes=list(args.probe), max_params=getattr(args, "max_params", None),
        per_module_ignores=dict(settings.per_module_ignores),
        repeats=not _full_capture(args, settings))


def _full_capture(args: argparse.Namespace, settings: Any) -> bool:
    """``--full-capture``/``--no-full-capture``, else the settings' ``full-capture``, else False (capture each
    distinct block once, :mod:`normaudit.capture.repeats`)."""
    flag = getattr(args, "full_capture", None)
    return bool(flag if flag is not None else getattr(settings, "full_capture", None))


def _preflight(opts: Any) -> None:
    """Cheap checks of one target's options, before any model is built (bad input fails fast)."""
    from normaudit.loaders.config import load_config

    if opts.config:
        load_config(opts.config)
    if opts.checkpoint and not Path(opts.checkpoint).exists():
        raise UsageError("checkpoint not found", file=opts.checkpoint)


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
            result.status, result.error = EXIT_INTERNAL, f"internal error: {_internal_text(outcome.error)}"
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


@dataclass
class RunPlan:
    """What an audit run was asked for, checked before any target runs (:func:`_plan_run`)."""

    outputs: list[OutputSpec]
    rules: dict
    plan_opts: list
    fail_on: str
    baseline: Any
    baseline_base: Path
    timeout: float


def _cmd_audit(argv: Sequence[str]) -> int:
    """``normaudit [TARGET ...] [options]``: parse, read the settings, check the run (:func:`_plan_run`), audit
    the targets (:func:`_audit_targets`) and write the outputs (:func:`_finish_run`); returns the exit status."""
    args = audit_parser().parse_intermixed_args(argv)  # first: --help/--version import nothing more
    from normaudit.settings import discover_settings
    from normaudit.loaders.hf import set_offline

    set_offline()  # never touch the network (Hugging Face targets)
    outputs = plan_outputs(args.output_sequence)
    settings = discover_settings(args.settings, args.isolated)
    if args.show_settings:
        return _show_settings(args, settings)
    plan = _plan_run(args, settings, outputs)
    results = _audit_targets(plan.plan_opts, plan.rules, plan.baseline, plan.baseline_base, plan.timeout,
                             plan.fail_on, args, settings)
    return _finish_run(args, plan, results)


def _run_targets_of(args: argparse.Namespace, settings: Any) -> list[Any]:
    """The targets of the run: those named on the command line (each with its own table from the settings
    file, when it has one), else the settings' ``targets``. Raises UsageError when there are none, or when
    ``--checkpoint`` (one file's weights) is given for several targets."""
    targets: list[Any] = list(args.targets) or list(settings.targets)
    if not targets:
        raise UsageError("no TARGET given, and no 'targets' in a settings file ([tool.normaudit] in pyproject.toml "
                         "or normaudit.toml); try 'normaudit model.py'")
    if args.targets and settings.targets:  # a named target keeps its own options from the settings
        from normaudit.settings import TargetSettings

        tables = {os.path.normpath(t.path): t for t in settings.targets if isinstance(t, TargetSettings)}
        targets = [tables.get(os.path.normpath(t), t) for t in targets]
    if args.checkpoint and len(targets) > 1:  # one file's weights would be read as every target's
        raise UsageError(f"--checkpoint applies to one target, and this run has {len(targets)}; give each target "
                         "its own with 'checkpoint' in its table of the settings' targets "
                         "(targets = [{path = \"model.py\", checkpoint = \"model.safetensors\"}])")
    return targets


def _plan_run(args: argparse.Namespace, settings: Any, outputs: list[OutputSpec]) -> RunPlan:
    """Every check that needs no model, before any target runs (bad input fails fast, exit 2): the outputs
    are writable and overwrite no input, the rules load, selectors name rules, the input axes parse, each
    target's config and checkpoint exist; then the baseline is read."""
    from normaudit.baseline import baseline_dir, load_baseline
    from normaudit.engine.loader import load_rules

    targets = _run_targets_of(args, settings)
    for spec in outputs:
        if spec.path is not None:
            check_writable(spec.path)
    if args.project_root is not None and not Path(args.project_root).is_dir():
        raise UsageError("--project-root: no such directory", file=args.project_root)
    if args.write_baseline:
        check_writable(args.write_baseline, "baseline")
    rules_dirs = args.rules if args.rules is not None else list(settings.rules)
    rules = load_rules(rules_dirs)
    plan_opts = [_target_options(t, args, settings, rules_dirs) for t in targets]
    written = [(s.path, f"{s.fmt} output") for s in outputs if s.path is not None]
    written += [(args.write_baseline, "baseline")] if args.write_baseline else []
    refuse_overwriting_inputs(written, _inputs_of_run(plan_opts, settings))
    if args.add_noqa:
        _check_add_noqa(args, plan_opts)
    _check_run_selectors(args, settings, plan_opts[0], rules)
    if args.input_axes is not None:
        from normaudit.facts.axes import parse_input_axes

        try:
            parse_input_axes(args.input_axes)
        except ValueError as err:
            raise UsageError(f"--input-axes {args.input_axes!r}: {err}") from None
    for opts in plan_opts:
        _preflight(opts)
    baseline_path = args.baseline or settings.baseline
    baseline = load_baseline(baseline_path) if baseline_path and not args.write_baseline else None
    return RunPlan(outputs=outputs, rules=rules, plan_opts=plan_opts,
                   fail_on=args.fail_on or settings.fail_on or "error", baseline=baseline,
                   baseline_base=baseline_dir(baseline_path), timeout=args.timeout or settings.timeout or DEFAULT_TIMEOUT)


def _check_run_selectors(args: argparse.Namespace, settings: Any, first: Any, rules: dict) -> None:
    """``--select``/``--ignore`` (else the settings' ``select``/``ignore``, named by file and line) and each
    ``per-module-ignores`` entry must match a rule (:func:`_check_selectors`)."""
    for name, flag in (("select", args.select), ("ignore", args.ignore)):
        if flag is not None:
            _check_selectors(flag, rules, f"--{name}")
        else:
            _check_selectors(getattr(first, name), rules, name, settings, name)
    for glob, codes in settings.per_module_ignores.items():
        _check_selectors(codes, rules, f"per-module-ignores {glob!r}", settings, glob)


def _finish_run(args: argparse.Namespace, plan: RunPlan, results: list[TargetResult]) -> int:
    """Render and write every output (a lone failed target: the ``-o`` files, then its error is raised), the
    numerics charts, the baseline (``--write-baseline``) and the ``noqa`` comments (``--add-noqa``); returns
    the exit status, the worst over the targets."""
    from normaudit.baseline import write_baseline

    multi = len(plan.plan_opts) > 1
    options = [render_options(args, spec) for spec in plan.outputs]  # before stdout is redirected: colour on a tty
    charts = _numerics_charts(plan.outputs, options, results)
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
            _write(text, path)
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


def _check_add_noqa(args: argparse.Namespace, plan_opts: list) -> None:
    """Refuse ``--add-noqa`` with ``--write-baseline`` (two ways to adopt, pick one) and for targets that are
    not on disk (:func:`normaudit.noqa.check_targets`), before anything runs."""
    from normaudit.noqa import check_targets

    if args.write_baseline:
        raise UsageError("--add-noqa and --write-baseline are two ways to adopt normaudit: give one")
    check_targets([o.target for o in plan_opts])


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


COMMANDS = {"rules": _cmd_rules, "explain": _cmd_explain, "schema": _cmd_schema, "docs": _cmd_docs}


def _internal_text(exc: BaseException) -> str:
    """``Kind: message`` of an internal error on one line (a worker's error keeps its own kind); also where
    torch itself cannot be imported (the error may be that)."""
    try:
        from normaudit.loaders.pyfile import safe_str
    except ImportError:
        def safe_str(err: BaseException, limit: int) -> str:
            try:
                return str(err)[:limit]
            except Exception:  # noqa: BLE001 - a __str__ that raises
                return f"<{type(err).__name__}>"

    kind = getattr(exc, "kind", None) or type(exc).__name__
    return f"{kind}: {' '.join(safe_str(exc, 500).split())}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``normaudit`` command; returns the exit status (0, 1, 2 or 3, see CONTRACT.md)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # A subcommand name wins over a same-named path (the repo's own rules/ directory); audit such a
        # path as ./rules.
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        return _cmd_audit(argv)
    except UsageError as err:
        print(f"normaudit: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `normaudit rules | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")
        return EXIT_OK
    except KeyboardInterrupt:
        print("normaudit: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # argparse --help/--version
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - CONTRACT: internal errors are exit 3, one line
        if os.environ.get("NORMAUDIT_DEBUG"):
            raise
        print(f"normaudit: internal error: {_internal_text(exc)} (set NORMAUDIT_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


def run() -> NoReturn:
    """The ``normaudit`` command: :func:`main` on ``sys.argv``, then end the process with its exit status.

    Once torch is imported, a normal interpreter exit spends ~1.5-2 s tearing down the modules of torch,
    ``torch._dynamo`` and transformers (measured: ``python -c "import torch, torch._dynamo,
    transformers.models.llama.modeling_llama"`` 8.4-8.8 s, the same ending in ``os._exit(0)`` 6.6-6.8 s, on 2
    cores). That teardown frees nothing the command still needs, so after ``main`` returns the command runs what
    was registered with :mod:`atexit` (logging's flush, temporary directories' cleanup), flushes stdout and
    stderr and leaves with :func:`os._exit`, as the worker processes already do. Where torch was never imported
    (``--help``, ``rules``, ``explain``, ``schema``) there is nothing to save and it exits normally. In-process
    callers (tests, the pytest plugin, the zoo sweep) call :func:`main`, which returns."""
    code = main()
    if sys.modules.get("torch") is None:
        raise SystemExit(code)
    import atexit

    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
