"""The rule file schema: one YAML file per rule under ``rules/<family>/<ID>-<name>.yaml``.

Every rule file is validated by :class:`Rule` when loaded (``extra="forbid"``: an unknown or misspelt
field is an error naming the file and field). Rules never import torch; they read facts only.
"""
from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from normaudit.report import Category, Kind, Severity

RULE_ID = re.compile(r"^N[A-Z][0-9]{3}$")
RULE_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class RuleDoc(BaseModel):
    """The documentation every rule carries (ruff-style fixed sections); ``normaudit explain ID`` prints it."""

    model_config = ConfigDict(extra="forbid")

    what: str
    why: str
    example: str
    use_instead: str
    references: list[str] = Field(min_length=1)


class Rule(BaseModel):
    """A declarative rule.

    - ``scope``: ``site`` evaluates ``when`` once per site whose kind is in ``applies_to``;
      ``model`` evaluates it once per model (findings then point at ``module_expr`` or the root), or, with
      ``for_each`` (an expression giving a list), once per element of that list, bound to the name ``each``:
      one finding per element (a model-level fact that lists several modules, each its own finding).
    - ``when``: a simpleeval expression over the names documented in ``normaudit.engine.evaluator``
      (``site``, ``model``, ``config``, ``options``, helper functions).
    - ``message``/``fix``: ``str.format`` templates over the same names.
    - ``params``: constants the rule's condition reads as ``params.NAME`` (thresholds kept as data).
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    name: str
    category: Category
    severity: Severity
    confidence: Literal["high", "medium", "low"] = "high"
    scope: Literal["site", "model"] = "site"
    applies_to: list[Kind] = Field(default_factory=list)
    when: str
    let: dict[str, str] = Field(default_factory=dict)
    severity_when: dict[Severity, str] = Field(default_factory=dict)
    module_expr: Optional[str] = None
    for_each: Optional[str] = None
    message: str
    fix: str
    params: dict[str, object] = Field(default_factory=dict)
    #: where a site finding points: ``site`` (the site's ``source``: a norm module's constructor, a functional
    #: norm's call) or ``computation`` (the line computing the statistic, for findings about the formula;
    #: the site's ``source`` where there is none, as for torch.nn modules)
    locate: Literal["site", "computation"] = "site"
    doc: RuleDoc

    @field_validator("for_each")
    @classmethod
    def _check_for_each(cls, value: Optional[str], info) -> Optional[str]:
        if value is not None and info.data.get("scope") != "model":
            raise ValueError("for_each is for rules of scope model (a site rule runs per site already)")
        return value

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not RULE_ID.match(value):
            raise ValueError(f"rule id {value!r} must look like NE101: 'N', a family letter, three digits")
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not RULE_NAME.match(value):
            raise ValueError(f"rule name {value!r} must be kebab-case")
        return value
