"""Command line (CONTRACT.md):

    normaudit TARGET [--config PATH] [--checkpoint PATH] [--dtype float32|float16|bfloat16]
                     [--batch-size N] [--format FMT] [-o FILE] [--fail-on error|warning|info|never]
                     [--select IDS] [--ignore IDS] [--rules DIR] [--input-axes B,C,H,W]
    normaudit rules              list the rules
    normaudit explain ID         print one rule's documentation
    normaudit schema             print the JSON schema of the report

Exit status: 0 no finding at or above --fail-on, 1 such findings, 2 bad input or usage, 3 internal error.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Optional, Sequence

from normaudit import __version__
from normaudit.errors import UsageError

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def _ids(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def audit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="normaudit", description="Audit the normalisation layers of a PyTorch model.",
                                epilog="Other commands: 'normaudit rules', 'normaudit explain ID', 'normaudit schema'.")
    p.add_argument("target", help="model.py[:factory], a Hugging Face model directory or config.json, or a checkpoint")
    p.add_argument("--config", help="the configuration the model is meant to follow (JSON or YAML)")
    p.add_argument("--checkpoint", help="weights to audit together with the model")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="the precision the model will train or run in")
    p.add_argument("--batch-size", type=int, help="the per-device training micro-batch")
    p.add_argument("--format", action="append", choices=["text", "json", "sarif", "github", "markdown"],
                   help="output format; repeat with -o to write several formats in one run")
    p.add_argument("-o", "--output", action="append", help="write to FILE instead of stdout (pairs with --format)")
    p.add_argument("--fail-on", default="error", choices=["error", "warning", "info", "never"])
    p.add_argument("--select", type=_ids, default=[], help="comma-separated rule ids, id prefixes or categories")
    p.add_argument("--ignore", type=_ids, default=[], help="comma-separated rule ids, id prefixes or categories")
    p.add_argument("--rules", action="append", default=[], metavar="DIR", help="a directory of extra rule files")
    p.add_argument("--input-axes", help="axes of the first input, e.g. B,C,H,W or batch,sequence")
    p.add_argument("--probe", action="append", default=[], choices=["batch"],
                   help="opt-in dynamic probe on a small real copy of the model: 'batch' checks that each "
                        "norm's output for one example does not depend on the other examples")
    p.add_argument("--version", action="version", version=f"normaudit {__version__}")
    return p


def _cmd_rules(argv: Sequence[str]) -> int:
    from normaudit.engine.loader import load_rules

    p = argparse.ArgumentParser(prog="normaudit rules", description="List the rules.")
    p.add_argument("--rules", action="append", default=[], metavar="DIR")
    args = p.parse_args(argv)
    rules = load_rules(args.rules)
    width = max((len(r.name) for r in rules.values()), default=0)
    for rule in sorted(rules.values(), key=lambda r: r.id):
        print(f"{rule.id}  {rule.name.ljust(width)}  {rule.category:<10} {rule.severity:<8} {rule.doc.what.splitlines()[0]}")
    return EXIT_OK


def _cmd_explain(argv: Sequence[str]) -> int:
    from normaudit.engine.loader import load_rules

    p = argparse.ArgumentParser(prog="normaudit explain", description="Print one rule's documentation.")
    p.add_argument("rule_id")
    p.add_argument("--rules", action="append", default=[], metavar="DIR")
    args = p.parse_args(argv)
    rules = load_rules(args.rules)
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
    from normaudit.report import Report

    print(json.dumps(Report.model_json_schema(), indent=2))
    return EXIT_OK


def _write(text: str, path: Optional[str]) -> None:
    if path is None or path == "-":
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")
    except OSError as err:
        raise UsageError(f"cannot write output: {err.strerror}", file=path) from err


def _cmd_audit(argv: Sequence[str]) -> int:
    from normaudit.audit import AuditOptions, exit_status, run_audit
    from normaudit.engine.loader import load_rules
    from normaudit.render import get_renderer

    args = audit_parser().parse_args(argv)
    formats = args.format or ["text"]
    outputs = args.output or []
    if len(outputs) > len(formats):
        raise UsageError("more -o files than --format options: give one --format per -o")
    opts = AuditOptions(target=args.target, config=args.config, checkpoint=args.checkpoint, dtype=args.dtype,
                        batch_size=args.batch_size, rules_dirs=args.rules, select=args.select,
                        ignore=args.ignore, input_axes=args.input_axes, probes=args.probe)
    rules = load_rules(opts.rules_dirs)
    # User code may print; keep stdout for the report alone.
    with contextlib.redirect_stdout(sys.stderr):
        report = run_audit(opts, rules)
        rendered = [(get_renderer(fmt)(report, rules), outputs[i] if i < len(outputs) else None)
                    for i, fmt in enumerate(formats)]
    for text, path in rendered:
        _write(text, path)
    return exit_status(report, args.fail_on)


COMMANDS = {"rules": _cmd_rules, "explain": _cmd_explain, "schema": _cmd_schema}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``normaudit`` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS and not os.path.exists(argv[0]):
            return COMMANDS[argv[0]](argv[1:])
        return _cmd_audit(argv)
    except UsageError as err:
        print(f"normaudit: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("normaudit: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # argparse
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - CONTRACT: internal errors are exit 3, one line
        if os.environ.get("NORMAUDIT_DEBUG"):
            raise
        text = " ".join(str(exc).split())[:500]
        print(f"normaudit: internal error: {type(exc).__name__}: {text} (set NORMAUDIT_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL
