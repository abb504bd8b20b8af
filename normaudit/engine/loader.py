"""Discover and validate rule files: every ``*.yaml`` under the shipped rules directory and any
``--rules DIR``. No registry table: the files are the rules."""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Iterable, Optional

import yaml
from pydantic import ValidationError

from normaudit.engine.schema import Rule
from normaudit.errors import UsageError


def builtin_rules_dir() -> Path:
    """The rules shipped with normaudit: ``normaudit/_rules`` in a wheel, ``rules/`` in a source checkout."""
    packaged = Path(str(resources.files("normaudit"))) / "_rules"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "rules"


def _line_of(text: str, field: str) -> Optional[int]:
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(f"{field}:"):
            return i
    return None


def load_rule_file(path: Path) -> Rule:
    """Parse and validate one rule file. Raises UsageError naming the file, line and field."""
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise UsageError(f"invalid YAML in rule file: {getattr(err, 'problem', err)}", file=str(path),
                         line=mark.line + 1 if mark else None) from err
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


def load_rules(extra_dirs: Iterable[str | Path] = ()) -> dict[str, Rule]:
    """All rules by id, shipped ones first. Raises UsageError for a bad file or a duplicate id."""
    rules: dict[str, Rule] = {}
    where: dict[str, Path] = {}
    dirs = [builtin_rules_dir(), *[Path(d) for d in extra_dirs]]
    for d in dirs:
        if not d.is_dir():
            raise UsageError("rules directory not found", file=str(d))
        for path in sorted(d.rglob("*.yaml")):
            rule = load_rule_file(path)
            if rule.id in rules:
                raise UsageError(f"duplicate rule id {rule.id} (also in {where[rule.id]})", file=str(path))
            rules[rule.id] = rule
            where[rule.id] = path
    return rules
