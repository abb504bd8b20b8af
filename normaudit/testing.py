"""A pytest helper: audit an in-memory model inside a test.

::

    from normaudit.testing import assert_norms_ok

    def test_norms():
        assert_norms_ok(build_model(), (torch.randint(0, 100, (2, 16)),), fail_on="warning")

Pass the factory itself (``assert_norms_ok(build_model)``) to have findings point at the lines that
construct each norm, which also makes ``# normaudit: ignore[ID]`` comments there apply.
"""
from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Optional, Union

import torch
from torch import nn

from normaudit.report import ROOT_LABEL, SEVERITY_RANK, Report

__all__ = ["assert_norms_ok", "format_findings"]


@lru_cache(maxsize=8)
def _rules(dirs: tuple[str, ...]):
    from normaudit.engine.loader import load_rules

    return load_rules(list(dirs))


def format_findings(report: Report, fail_on: str = "info") -> str:
    """The findings of ``report`` at or above ``fail_on``, one per line with location and fix."""
    floor = SEVERITY_RANK.get(fail_on, 0)
    lines = []
    for f in report.findings:
        if SEVERITY_RANK[f.severity] < floor:
            continue
        where = f" ({f.source.file}:{f.source.line})" if f.source is not None and f.source.line else ""
        lines.append(f"{f.rule_id} {f.severity} {f.module or ROOT_LABEL}: {f.message}{where}")
        if f.fix:
            lines.append(f"    fix: {f.fix}")
    return "\n".join(lines)


def assert_norms_ok(model: Union[nn.Module, Callable[[], nn.Module]], example_inputs: Any = None, *,
                    fail_on: str = "warning", select: Optional[Iterable[str]] = None,
                    ignore: Optional[Iterable[str]] = None, config: Union[str, Mapping[str, Any], None] = None,
                    dtype: str = "float32", batch_size: Optional[int] = None, input_axes: Optional[str] = None,
                    per_module_ignores: Optional[Mapping[str, list[str]]] = None,
                    rules: Iterable[str] = ()) -> Report:
    """Audit ``model`` and raise ``AssertionError`` listing the findings at or above ``fail_on``.

    ``model`` is an ``nn.Module`` (not modified: capture works on a copy) or a zero-argument factory
    returning one (then findings carry the lines that construct each norm). ``example_inputs`` is a tuple
    of positional inputs, a dict of keyword inputs or one tensor; None infers them from the first layer.
    ``config`` is the configuration the model should follow: a JSON/YAML file path or a mapping.
    ``select``/``ignore`` take rule ids, id prefixes, names or categories as on the command line;
    ``fail_on`` is ``error``, ``warning``, ``info`` or ``never``. Returns the report when the check passes.
    Bad input (e.g. an unknown dtype) raises :class:`normaudit.errors.UsageError`.
    """
    from normaudit.audit import AuditOptions, build_report
    from normaudit.options import exit_status
    from normaudit.vocabulary.dtypes import AUDIT_DTYPES
    from normaudit.errors import UsageError
    from normaudit.loaders import ModelUnderAudit

    if fail_on not in ("error", "warning", "info", "never"):
        raise UsageError(f"fail_on must be error, warning, info or never, not {fail_on!r}")
    if dtype not in AUDIT_DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}; use float32, float16 or bfloat16")
    origins: dict = {}
    if not isinstance(model, nn.Module):
        if not callable(model):
            raise TypeError(f"model must be an nn.Module or a factory returning one, not {type(model).__name__}")
        from normaudit.loaders.pyfile import record_origins

        with record_origins(origins):
            model = model()
        if not isinstance(model, nn.Module):
            raise TypeError(f"the factory returned {type(model).__name__}, not an nn.Module")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    elif isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    elif example_inputs is not None and not isinstance(example_inputs, (tuple, dict)):
        raise TypeError(f"example_inputs must be a tuple, a dict or a tensor, not {type(example_inputs).__name__}")
    config_path = str(config) if config is not None and not isinstance(config, Mapping) else None
    opts = AuditOptions(target=f"<{type(model).__name__}>", config=config_path, dtype=dtype, batch_size=batch_size,
                        select=list(select or []), ignore=list(ignore or []), input_axes=input_axes,
                        rules_dirs=list(rules), per_module_ignores=dict(per_module_ignores or {}),
                        config_data=dict(config) if isinstance(config, Mapping) else None)
    on_meta = any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers()))
    if on_meta:  # capture materialises a meta model in place: work on a (free) copy
        model = copy.deepcopy(model)
    mua = ModelUnderAudit(model=model, inputs=example_inputs, on_meta=on_meta, kind="python", origins=origins)
    report = build_report(opts, mua, _rules(tuple(str(r) for r in rules)))
    if exit_status(report, fail_on) != 0:
        n = sum(SEVERITY_RANK[f.severity] >= SEVERITY_RANK[fail_on] for f in report.findings)
        raise AssertionError(f"normaudit: {n} finding(s) at or above {fail_on!r} in {type(model).__name__}:\n"
                             + format_findings(report, fail_on))
    return report
