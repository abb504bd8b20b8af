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

The package parses and prints; the per-target job it hands to the executors is :mod:`normaudit.job`.
:mod:`~normaudit.cli.parser` holds the audit command's flags, :mod:`~normaudit.cli.plan` merges the settings
into each target's options and checks the run, :mod:`~normaudit.cli.audit_command` runs and finishes it,
:mod:`~normaudit.cli.outputs` renders and writes, :mod:`~normaudit.cli.commands` holds the other subcommands and
:mod:`~normaudit.cli.exits` the exit statuses.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn, Optional, Sequence

from normaudit.cli.audit_command import cmd_audit
from normaudit.cli.commands import COMMANDS
from normaudit.cli.exits import (EXIT_INTERNAL, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, Terminated,
                                 internal_text, sigterm_as_interrupt)
from normaudit.errors import UsageError


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``normaudit`` command; returns the exit status (0, 1, 2 or 3, see CONTRACT.md; 130
    after SIGINT and 143 after SIGTERM, the workers killed first)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sigterm = sigterm_as_interrupt()
    try:
        with sigterm:
            # A subcommand name wins over a same-named path (the repo's own rules/ directory); audit such a
            # path as ./rules.
            if argv and argv[0] in COMMANDS:
                return COMMANDS[argv[0]](argv[1:])
            return cmd_audit(argv)
    except UsageError as err:
        print(f"normaudit: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `normaudit rules | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")
        return EXIT_OK
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated) or sigterm.received:
            print("normaudit: terminated (SIGTERM)", file=sys.stderr)
            return EXIT_SIGTERM
        print("normaudit: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except SystemExit as exc:  # argparse --help/--version
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - CONTRACT: internal errors are exit 3, one line
        if os.environ.get("NORMAUDIT_DEBUG"):
            raise
        print(f"normaudit: internal error: {internal_text(exc)} (set NORMAUDIT_DEBUG=1 for a traceback)",
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
