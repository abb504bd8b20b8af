"""The pydantic models of the settings file (:mod:`normaudit.settings` reads and explains it).

Apart from :mod:`normaudit.settings` so that a command that only needs the raw keys of a settings file it has
validated before (``normaudit rules`` in a project, :func:`normaudit.settings.validated_table`) does not
import pydantic (importing it would be most of such a command's start-up, kept under 0.5 s). Import ``Settings``/``TargetSettings`` from
:mod:`normaudit.settings`, which loads this module on first use.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, PrivateAttr, StrictBool, StrictInt,
                      StrictStr, field_validator)

from normaudit.vocabulary.axes import parse_axis_spec
from normaudit.vocabulary.dtypes import AUDIT_DTYPES

Dtype = Literal[AUDIT_DTYPES]  # type: ignore[valid-type]
FailOn = Literal["error", "warning", "info", "never"]


def _check_axes(value: Optional[str]) -> Optional[str]:
    if value is not None:
        parse_axis_spec(value)  # ValueError -> a validation error naming the key; torch-free (the cache path)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=False)


class TargetSettings(_Strict):
    """One entry of ``targets`` written as a table: a target with its own options."""

    path: str
    config: Optional[str] = None
    checkpoint: Optional[str] = None
    dtype: Optional[Dtype] = None
    batch_size: Optional[PositiveInt] = Field(default=None, alias="batch-size")
    input_axes: Optional[str] = Field(default=None, alias="input-axes")

    _axes = field_validator("input_axes")(classmethod(lambda cls, v: _check_axes(v)))


class Settings(_Strict):
    """The validated contents of a settings file (every key optional)."""

    select: Optional[list[str]] = None
    ignore: Optional[list[str]] = None
    per_module_ignores: dict[str, list[str]] = Field(default_factory=dict, alias="per-module-ignores")
    fail_on: Optional[FailOn] = Field(default=None, alias="fail-on")
    dtype: Optional[Dtype] = None
    batch_size: Optional[PositiveInt] = Field(default=None, alias="batch-size")
    rules: list[str] = Field(default_factory=list)
    targets: list[Union[str, TargetSettings]] = Field(default_factory=list)
    input_axes: Optional[str] = Field(default=None, alias="input-axes")
    config: Optional[str] = None
    baseline: Optional[str] = None
    #: Seconds per target for import, build, capture and probes (``--timeout``; default 300).
    timeout: Optional[PositiveFloat] = None
    #: Targets audited at once (``-j N``; default: the number of CPU cores).
    jobs: Optional[StrictInt] = Field(default=None, gt=0)
    #: The result cache: ``false`` turns it off (``--no-cache``), a string is its directory (relative to the
    #: settings file; ``$NORMAUDIT_CACHE_DIR`` wins), ``true`` the default place (:mod:`normaudit.cache`).
    cache: Optional[Union[StrictBool, StrictStr]] = None
    #: ``true``: capture every block of a stack (``--full-capture``), not each distinct block once
    #: (:mod:`normaudit.capture.repeats`; the report is the same, only slower).
    full_capture: Optional[StrictBool] = Field(default=None, alias="full-capture")
    #: The absolute http(s) URL under which the rule pages ``<ID>.md`` lie (a copy of ``docs/rules``): SARIF's
    #: ``helpUri`` of each shipped rule (:func:`normaudit.render.sarif.docs_base`; without it, from the package
    #: metadata, else no ``helpUri``).
    docs_url: Optional[StrictStr] = Field(default=None, alias="docs-url")

    _axes = field_validator("input_axes")(classmethod(lambda cls, v: _check_axes(v)))

    @field_validator("docs_url")
    @classmethod
    def _check_docs_url(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError(f"must be an absolute http(s) URL without query or fragment, got {value!r}")
        return value

    @field_validator("cache", mode="before")
    @classmethod
    def _check_cache(cls, value: object) -> object:
        if value is not None and not isinstance(value, (bool, str)):
            raise ValueError(f"must be false, true or a directory (a string), got {value!r}")
        if value == "":
            raise ValueError("an empty directory name: give a directory, or false to turn the cache off")
        return value

    #: The file these settings came from (None for defaults); not a key of the file.
    _source: Optional[Path] = PrivateAttr(default=None)

    @property
    def source(self) -> Optional[Path]:
        """The settings file these settings were read from (None for defaults)."""
        return self._source

    def line_of(self, key: str) -> Optional[int]:
        """The line of the settings file where ``key`` is set (for error messages), or None."""
        if self._source is None:
            return None
        try:
            text = self._source.read_text(encoding="utf-8")
        except OSError:
            return None
        return line_of_key(text, key, self._source.name == "pyproject.toml")


def _section_start(lines: list[str], is_pyproject: bool) -> int:
    if not is_pyproject:
        return 0
    for i, line in enumerate(lines):
        if re.match(r"^\s*\[\s*tool\s*\.\s*normaudit\s*[\].]", line):
            return i
    return 0


def line_of_key(text: str, key: str, is_pyproject: bool) -> Optional[int]:
    """1-based line where ``key`` is assigned (or opens a table) inside the normaudit settings."""
    lines = text.splitlines()
    start = _section_start(lines, is_pyproject)
    k = re.escape(key)
    pattern = re.compile(rf"""^\s*(?:["']?{k}["']?\s*=|\[\s*(?:tool\s*\.\s*normaudit\s*\.\s*)?["']?{k}["']?\s*[\].])"""
                         rf"""|[{{,]\s*["']?{k}["']?\s*=""")
    for i in range(start, len(lines)):
        if pattern.search(lines[i]):
            return i + 1
    return None
