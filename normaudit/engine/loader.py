"""Discover and validate rule files: every ``*.yaml`` under the shipped rules directory and any
``--rules DIR``. No registry table: the files are the rules."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Optional

from normaudit.errors import UsageError

if TYPE_CHECKING:
    from normaudit.engine.schema import Rule


def builtin_rules_dir() -> Path:
    """The rules shipped with normaudit: ``normaudit/_rules`` in a wheel, ``rules/`` in a source checkout."""
    packaged = Path(__file__).resolve().parents[1] / "_rules"  # importlib.resources.files: 30 ms more
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "rules"


def _shipped(path: Path) -> bool:
    """True for a rule file shipped with normaudit (under :func:`builtin_rules_dir`)."""
    try:
        path.resolve().relative_to(_builtin_resolved())
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _builtin_resolved() -> Path:
    return builtin_rules_dir().resolve()


def _line_of(text: str, field: str) -> Optional[int]:
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(f"{field}:"):
            return i
    return None


def load_rule_file(path: Path) -> Rule:
    """Parse and validate one rule file. Raises UsageError naming the file, line and field.

    A rule file is untrusted input like a config (:mod:`normaudit.loaders.safe_read`): a regular UTF-8 file,
    plain YAML data (no tags building objects, aliases and nesting bounded), and message/fix templates that
    reach only the rule's own names (:func:`normaudit.engine.evaluator.check_template`)."""
    import yaml
    from pydantic import ValidationError

    from normaudit.engine.schema import Rule
    from normaudit.loaders.safe_read import loads_yaml, read_regular

    raw = read_regular(path, "rule file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"rule file is not UTF-8 text: byte 0x{raw[err.start]:02x} at offset {err.start}",
                         file=str(path), line=raw[: err.start].count(b"\n") + 1) from None
    if _shipped(path) and hasattr(yaml, "CSafeLoader"):
        # normaudit's own rules: libyaml's loader (ten times faster; the bounds are for users' files)
        data = yaml.load(text, Loader=yaml.CSafeLoader)  # noqa: S506 - a safe loader
    else:
        data = loads_yaml(text, "rule file", str(path))
    if not isinstance(data, dict):
        raise UsageError("a rule file must be a mapping", file=str(path))
    try:
        rule = Rule.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(root)"
        top = str(first["loc"][0]) if first["loc"] else ""
        raise UsageError(f"rule field '{field}': {first['msg']}", file=str(path), line=_line_of(text, top)) from err
    from normaudit.engine.evaluator import compile_rule

    compile_rule(rule, str(path))
    return rule


def rule_files(extra_dirs: Iterable[str | Path] = ()) -> list[Path]:
    """The rule files, in load order: every ``*.yaml`` under the shipped rules directory, then under each of
    ``extra_dirs`` (sorted paths). Raises UsageError for a directory that does not exist."""
    files: list[Path] = []
    for d in [builtin_rules_dir(), *[Path(d) for d in extra_dirs]]:
        if not d.is_dir():
            raise UsageError("rules directory not found", file=str(d))
        files += sorted(d.rglob("*.yaml"))
    return files


def load_rules(extra_dirs: Iterable[str | Path] = ()) -> dict[str, Rule]:
    """All rules by id, shipped ones first. Raises UsageError for a bad file or a duplicate id."""
    rules: dict[str, Rule] = {}
    where: dict[str, Path] = {}
    for path in rule_files(extra_dirs):
        rule = load_rule_file(path)
        if rule.id in rules:
            raise UsageError(f"duplicate rule id {rule.id} (also in {where[rule.id]})", file=str(path))
        rules[rule.id] = rule
        where[rule.id] = path
    return rules


def _record(data: dict[str, Any]) -> Any:
    """A rule as plain attributes (``rule.id``, ``rule.doc.what``), from :meth:`Rule.model_dump` data."""
    from types import SimpleNamespace

    return SimpleNamespace(**{**data, "doc": SimpleNamespace(**data["doc"])})


def load_rules_listed(extra_dirs: Iterable[str | Path] = (), memo: Any = None) -> dict[str, Any]:
    """The rules by id for commands that only print them (``normaudit rules``, ``explain``): when ``memo`` (a
    :class:`normaudit.cache.ValidationMemo`) holds these very files (names and contents) validated by this
    very code, records with the fields of :class:`~normaudit.engine.schema.Rule` read from it without
    pydantic, YAML or the rule compiler (those two commands start in under 0.5 s); else :func:`load_rules` (which
    raises UsageError for a bad file) and the memo records the result."""
    if memo is None:
        return load_rules(extra_dirs)
    from normaudit.cache import validation_key
    from normaudit.loaders.safe_read import read_regular

    files = rule_files(extra_dirs)
    parts = [[str(f.resolve()), hashlib.sha256(read_regular(f, "rule file")).hexdigest()] for f in files]
    key = validation_key("rules", parts)
    stored = memo.get(key)
    if isinstance(stored, list):
        try:
            return {data["id"]: _record(data) for data in stored}
        except (KeyError, TypeError):  # an entry not written by this code: validate again
            pass
    rules = load_rules(extra_dirs)
    memo.put(key, [rule.model_dump(mode="json") for rule in rules.values()])
    return rules
