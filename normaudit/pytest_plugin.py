"""An opt-in pytest plugin: audit the ``targets`` of ``[tool.normaudit]`` as test items, one per target.

Installed with normaudit (the ``pytest11`` entry point) but off unless enabled, by any of::

    pytest --normaudit
    pytest -p normaudit.pytest_plugin       # also without the entry point (normaudit not installed)
    [tool.pytest.ini_options]
    normaudit = true

Each target of the settings file that applies to pytest's rootdir (``normaudit.toml`` or ``pyproject.toml``
with ``[tool.normaudit]``, found from the rootdir upward, as the ``normaudit`` command finds it from the
current directory) becomes an item ``<settings file>::<target>`` (``pyproject.toml::models/gpt.py``), so
``-k gpt`` selects it. An item runs the ``normaudit`` command on its target with the settings file
(:func:`normaudit.cli.main`: the same worker isolation, ``--timeout``, ``fail-on``, baseline and
suppressions), and fails when the command would exit non-zero: with the findings as concise lines
(``path:line:col: CODE [severity] module: message``, :mod:`normaudit.render.concise`) for exit 1, with the
command's one-line error for bad input (2) or an internal error (3). ``--normaudit-fail-on`` overrides
the settings' ``fail-on`` for the items.
"""
from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

_KEY = "normaudit"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--normaudit``, ``--normaudit-fail-on`` and the ini option ``normaudit`` (bool, default false)."""
    group = parser.getgroup("normaudit", "normaudit: audit the normalisation layers of [tool.normaudit] targets")
    group.addoption("--normaudit", action="store_true", default=False,
                    help="audit the targets of [tool.normaudit] as test items, one per target")
    group.addoption("--normaudit-fail-on", choices=["error", "warning", "info", "never"], default=None,
                    help="lowest severity that fails a normaudit item (default: fail-on of the settings, else error)")
    parser.addini(_KEY, type="bool", default=False,
                  help="audit the targets of [tool.normaudit] as test items (as --normaudit)")


def enabled(config: pytest.Config) -> bool:
    """True when the plugin is enabled: ``--normaudit`` or ``-p normaudit.pytest_plugin``; or the ini option
    when pytest runs what it finds itself (no paths or node ids given: ``pytest tests/test_x.py`` runs that
    file alone)."""
    plugins = getattr(config.option, "plugins", None) or []
    if config.getoption("--normaudit") or __name__ in plugins:
        return True
    explicit = getattr(config, "args_source", None) == pytest.Config.ArgsSource.ARGS
    return bool(config.getini(_KEY)) and not explicit


class NormauditItem(pytest.Item):
    """One target of the settings file, audited by the ``normaudit`` command."""

    def __init__(self, *, target: str, settings_file: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target
        self.settings_file = settings_file
        self.add_marker(_KEY)

    def runtest(self) -> None:
        """Run ``normaudit TARGET --settings FILE --format concise``; raise :class:`NormauditFailure`
        unless it exits 0."""
        from normaudit.cli import main

        fail_on = self.config.getoption("--normaudit-fail-on")
        with tempfile.TemporaryDirectory(prefix="normaudit-pytest-") as tmp:
            out = Path(tmp) / "findings.txt"
            argv = [self.target, "--settings", str(self.settings_file), "--format", "concise", "--quiet",
                    "-o", str(out)]
            argv += ["--fail-on", fail_on] if fail_on else []
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                status = main(argv)
            text = out.read_text(encoding="utf-8") if out.is_file() else ""
        if status == 0:
            return
        if status == 1:
            raise NormauditFailure(status, [ln for ln in text.splitlines() if ln.strip()])
        problems = [ln for ln in err.getvalue().splitlines() if ln.startswith("normaudit: ")]
        raise NormauditFailure(status, problems or [f"normaudit exited with status {status}"])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Optional[str] = None) -> Any:
        """The concise lines (or the error line) alone, no traceback of normaudit's own code."""
        if isinstance(excinfo.value, NormauditFailure):
            return "\n".join(excinfo.value.lines)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, Optional[int], str]:
        return self.settings_file, None, f"normaudit {self.target}"


class NormauditSettingsFile(pytest.File):
    """The settings file as a collector: one :class:`NormauditItem` per entry of its ``targets``."""

    def collect(self) -> Iterator[NormauditItem]:
        from normaudit.errors import UsageError
        from normaudit.settings import load_settings

        try:
            settings = load_settings(self.path)
        except UsageError as err:
            raise pytest.UsageError(f"normaudit: error: {err}") from None
        for target in settings.targets:
            spec = target if isinstance(target, str) else target.path
            yield NormauditItem.from_parent(self, name=spec, target=spec, settings_file=self.path)


class NormauditFailure(Exception):
    """An audited target that exits non-zero: ``status`` (1 findings, 2 bad input, 3 internal error) and the
    lines to show."""

    def __init__(self, status: int, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.status = status
        self.lines = lines


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Append one item per target when enabled (first, so ``-k``/``-m`` deselect them like any test)."""
    if not enabled(config):
        return
    from normaudit.errors import UsageError
    from normaudit.settings import find_settings_file

    try:
        path = find_settings_file(Path(config.rootpath))
    except UsageError as err:
        raise pytest.UsageError(f"normaudit: error: {err}") from None
    if path is None:
        return
    collector = NormauditSettingsFile.from_parent(session, path=path)
    ours = list(collector.collect())
    # counted as collected like any test ("collected 4 items"), and seen by the plugins that read reports
    config.hook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, ours))
    items.extend(ours)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "normaudit: a normaudit audit of a [tool.normaudit] target")
