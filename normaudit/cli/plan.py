"""The plan of an audit run: the targets (named, else the settings'), each target's options merged from its
flags, its table in the settings file and the settings (flags win), and every check that needs no model
(outputs, rules, selectors, input axes, configs, checkpoints), so bad input fails before any model is built."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from normaudit.cli.outputs import OutputSpec, check_writable, inputs_of_run, refuse_overwriting_inputs
from normaudit.errors import UsageError
from normaudit.options import DEFAULT_TIMEOUT
from normaudit.vocabulary.axes import parse_axis_spec


@dataclass
class RunPlan:
    """What an audit run was asked for, checked before any target runs (:func:`plan_run`)."""

    outputs: list[OutputSpec]
    rules: dict
    plan_opts: list
    fail_on: str
    baseline: Any
    baseline_base: Path
    timeout: float
    #: the ``docs-url`` setting (SARIF's ``helpUri`` base), None when not set
    docs_url: Optional[str] = None


def plan_run(args: argparse.Namespace, settings: Any, outputs: list[OutputSpec]) -> RunPlan:
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
    plan_opts = [target_options(t, args, settings, rules_dirs) for t in targets]
    written = [(s.path, f"{s.fmt} output") for s in outputs if s.path is not None]
    written += [(args.write_baseline, "baseline")] if args.write_baseline else []
    refuse_overwriting_inputs(written, inputs_of_run(plan_opts, settings))
    if args.add_noqa:
        _check_add_noqa(args, plan_opts)
    _check_run_selectors(args, settings, plan_opts[0], rules)
    if args.input_axes is not None:
        try:
            parse_axis_spec(args.input_axes)  # torch-free: a run answered from the cache imports no torch
        except ValueError as err:
            raise UsageError(f"--input-axes {args.input_axes!r}: {err}") from None
    for opts in plan_opts:
        _preflight(opts)
    baseline_path = args.baseline or settings.baseline
    baseline = load_baseline(baseline_path) if baseline_path and not args.write_baseline else None
    return RunPlan(outputs=outputs, rules=rules, plan_opts=plan_opts,
                   fail_on=args.fail_on or settings.fail_on or "error", baseline=baseline,
                   baseline_base=baseline_dir(baseline_path), timeout=args.timeout or settings.timeout or DEFAULT_TIMEOUT,
                   docs_url=settings.docs_url)


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


def target_options(t: Any, args: argparse.Namespace, settings: Any, rules_dirs: list[str]):
    """The :class:`normaudit.options.AuditOptions` of target ``t`` (a path, or its
    :class:`normaudit.settings.TargetSettings` table): each option from the flag in ``args``, else the
    target's table, else the top level of ``settings``, else the default (``--checkpoint`` has no top-level key; the probes
    and ``--max-params`` come from the flags alone, the per-module ignores from the settings alone);
    ``rules_dirs`` as given."""
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

    for path, what in ((opts.target, "target"), (opts.config, "config"), (opts.checkpoint, "checkpoint")):
        if path:
            _check_utf8_name(str(path), what)
    if opts.config:
        load_config(opts.config)
    if opts.checkpoint and not Path(opts.checkpoint).exists():
        raise UsageError("checkpoint not found", file=opts.checkpoint)


def _check_add_noqa(args: argparse.Namespace, plan_opts: list) -> None:
    """Refuse ``--add-noqa`` with ``--write-baseline`` (two ways to adopt, pick one) and for targets that are
    not on disk (:func:`normaudit.noqa.check_targets`), before anything runs."""
    from normaudit.noqa import check_targets

    if args.write_baseline:
        raise UsageError("--add-noqa and --write-baseline are two ways to adopt normaudit: give one")
    check_targets([o.target for o in plan_opts])


def _check_utf8_name(path: str, what: str) -> None:
    """Refuse a path that is not UTF-8 text (its undecodable bytes reach Python as lone surrogates, PEP 383):
    the reports (JSON, SARIF) and the messages are UTF-8 and cannot hold it. The error shows the bytes."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(path[err.start]) - 0xDC00 if 0xDC80 <= ord(path[err.start]) <= 0xDCFF else ord(path[err.start])
        raise UsageError(f"the {what}'s path is not UTF-8 text (byte 0x{byte:02x} at offset {err.start}), and "
                         "normaudit's reports are: rename it", file=path) from None
