"""The parser of the audit command, ``normaudit [TARGET ...] [options]``: every flag, its type and its help
text (the subcommands' parsers are in :mod:`normaudit.cli.commands`)."""
from __future__ import annotations

import argparse

from normaudit import __version__
from normaudit.arguments import CommandParser
from normaudit.vocabulary.dtypes import AUDIT_DTYPES


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
                             "Settings: [tool.normaudit] in pyproject.toml or normaudit.toml, found from the "
                             "current directory upward; flags override them.")
    for add in (_add_model_arguments, _add_output_arguments, _add_rule_arguments, _add_run_arguments):
        add(p)
    p.set_defaults(output_sequence=[])
    return p


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    """What is audited: the targets, their configuration, weights, precision and batch."""
    p.add_argument("targets", nargs="*", metavar="TARGET",
                   help="model.py[:factory], package.module:factory, a Hugging Face model directory or config.json, or a "
                        "checkpoint alone (.safetensors, .pt, .pth, .bin, a sharded index or a directory of them) "
                        "(default: 'targets' from the settings file)")
    p.add_argument("--config", help="the configuration the model is meant to follow (JSON or YAML)")
    p.add_argument("--checkpoint", help="weights to audit together with the model (one target only; several "
                   "targets each take theirs from 'checkpoint' in the settings' targets)")
    p.add_argument("--dtype", choices=list(AUDIT_DTYPES),
                   help="the precision the model will train or run in (default float32)")
    p.add_argument("--batch-size", type=_positive_int, help="the per-device training micro-batch")


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    """Where the report goes and how much of it: formats, files, quiet, statistics, SARIF root."""
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


def _add_rule_arguments(p: argparse.ArgumentParser) -> None:
    """Which rules apply and which dynamic probes run."""
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
                   help="the most parameters --probe numerics builds for real, and the most tensor elements a "
                        "build_model() that cannot run on the meta device may allocate when it is built with real "
                        "weights (default 1000000000); above it: exit 2, before allocating")


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """How the run goes: baseline, settings, timeout, jobs, executor, cache, adopting, version."""
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
