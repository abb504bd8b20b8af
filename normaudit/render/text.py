"""``--format text``: for a person. A table of sites, the block structure, then findings grouped by
severity with ``file:line`` and the fix."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel

from normaudit.render.escape import escape_control, guard_lines
from normaudit.render.numerics_text import numerics_lines
from normaudit.report import ROOT_LABEL, Finding, Report, Site, SourceLocation


def _escaped(value: Any) -> Any:
    if isinstance(value, str):
        return escape_control(value)
    if isinstance(value, BaseModel):
        return value.model_copy(update={k: _escaped(getattr(value, k)) for k in type(value).model_fields})
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_escaped(v) for v in value)
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    return value


def escaped_report(report: Report) -> Report:
    """A copy of ``report`` with :func:`escape_control` applied to every string in it (field values,
    list items, dict keys and values), for the text and markdown renderers."""
    return _escaped(report)


# ------------------------------------------------------------------------------------ finding groups
@dataclass
class FindingGroup:
    """Findings of one rule that say the same thing about several modules at the same source line (one
    fault repeated in every layer): ``label`` spans the modules (``layers.0-17.input_layernorm``), ``message``
    and ``fix`` are the first finding's with its module path replaced by that span."""

    findings: list[Finding]
    label: str
    message: str
    fix: Optional[str]

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def count_label(self) -> str:
        """``label`` with the number of modules when there are several, and of findings when a module holds
        more than one (two norms computed in one module's forward): ``layers.0-17.ln (18 modules)``,
        ``layers.0-2 (3 modules, 6 findings)``, ``attn (2 findings)``."""
        n = len(self.findings)
        modules = len({f.module for f in self.findings})
        if n == 1:
            return self.label
        if modules == n:
            return f"{self.label} ({n} modules)"
        if modules == 1:
            return f"{self.label} ({n} findings)"
        return f"{self.label} ({modules} modules, {n} findings)"


def _module_pattern(module: str) -> Optional[re.Pattern]:
    return re.compile(r"(?<![\w.])" + re.escape(module) + r"(?![\w]|\.\w)") if module else None


def _generic(text: Optional[str], module: str) -> Optional[str]:
    pattern = _module_pattern(module)
    return text if text is None or pattern is None else pattern.sub("\0", text)


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``{0-2,5,7-8}``; one run is written without braces (``0-17``)."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return text if len(runs) == 1 else "{" + text + "}"


def _bucket_span(paths: list[list[str]]) -> str:
    if len(paths) == 1:
        return ".".join(paths[0])
    varying = [i for i in range(len(paths[0])) if len({p[i] for p in paths}) > 1]
    if len(varying) == 1:
        i = varying[0]
        parts = list(paths[0])
        parts[i] = _ranges(sorted({int(p[i]) for p in paths}))
        return ".".join(parts)
    return f"{'.'.join(paths[0])} .. {'.'.join(paths[-1])}"


def module_span(modules: list[str]) -> str:
    """One label for several module paths: paths that differ only in one layer index are written as a
    range (``layers.0-17.input_layernorm``, ``h.{0-3,5}.ln_1``); paths of other shapes are listed
    (``encoder.layers.0-5.ln, decoder.layers.0-5.ln``), at most three spans then ``..``.

    >>> module_span(["layers.%d.norm" % i for i in range(18)])
    'layers.0-17.norm'
    >>> module_span(["enc.0.ln", "enc.1.ln", "dec.0.ln", "dec.2.ln"])
    'enc.0-1.ln, dec.{0,2}.ln'
    """
    unique = list(dict.fromkeys(modules))
    if len(unique) == 1:
        return unique[0] or ROOT_LABEL
    buckets: dict[tuple[str, ...], list[list[str]]] = {}
    for m in unique:
        parts = m.split(".")
        buckets.setdefault(tuple("#" if p.isdigit() else p for p in parts), []).append(parts)
    spans = [_bucket_span(b) for b in buckets.values()]
    return ", ".join(spans[:3] + ([".."] if len(spans) > 3 else []))


#: A number standing alone in a message (``0.104``, ``-3``, ``1e-05``), not one inside a module path or a word.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w|\.\w)")


def _shape(text: Optional[str]) -> Optional[str]:
    """``text`` with its numbers taken out: messages that differ only in measured values group together."""
    return text if text is None else _NUMBER.sub("#", text)


def merge_numbers(texts: list[str]) -> str:
    """One text for several that differ only in their numbers (:data:`_NUMBER`): each number that differs
    is written as its range, smallest to largest as the texts spell them (``up to 0.0873..0.104``).

    >>> merge_numbers(["changed by 0.104 (values 3.82)", "changed by 0.0873 (values 3.82)"])
    'changed by 0.0873..0.104 (values 3.82)'
    """
    columns = list(zip(*(_NUMBER.findall(t) for t in texts)))
    pieces = _NUMBER.split(texts[0])
    out = [pieces[0]]
    for column, piece in zip(columns, pieces[1:]):
        values = sorted(set(column), key=float)
        out.append(values[0] if len(values) == 1 else f"{values[0]}..{values[-1]}")
        out.append(piece)
    return "".join(out)


#: Where the size probe's clause starts in a layout finding's message (rules/layout, rules/batchnorm: the
#: ``probe`` variable). The probe runs the model once: a site it did not reach (the model failed earlier)
#: has no clause, so the clause is not part of the grouping key (:func:`group_findings`).
PROBE_CLAUSE = "; size probe: "


def _split_probe(text: Optional[str]) -> tuple[Optional[str], str]:
    """``(text before the size probe's clause, the clause or "")``."""
    if text is None or PROBE_CLAUSE not in text:
        return text, ""
    i = text.index(PROBE_CLAUSE)
    return text[:i], text[i:]


def _merged_probe(members: list[Finding], label: str) -> str:
    """The size-probe clauses of a group's findings as one text: unchanged when every member has the same
    one (numbers aside), else each distinct clause once, naming the modules it was measured at
    (``; size probe (blocks.0.n2): at sequence 16->24 it raises: ...``); members without one are left out."""
    clauses = [(f, _generic(_split_probe(f.message)[1], f.module) or "") for f in members]
    shapes = list(dict.fromkeys(_shape(c) for _, c in clauses))
    if len(shapes) == 1:
        return merge_numbers([c for _, c in clauses]).replace("\0", label)
    out = []
    for sh in shapes:
        if not sh:
            continue
        same = [(f, c) for f, c in clauses if _shape(c) == sh]
        where = module_span([f.module for f, _ in same])
        text = merge_numbers([c for _, c in same]).replace("\0", where)
        out.append(f"; size probe ({where}): " + text[len(PROBE_CLAUSE):])
    return "".join(out)


def group_findings(findings: list[Finding]) -> list[FindingGroup]:
    """Group findings (in order of first appearance) by rule, severity, source line, and message and fix
    with the module path, the numbers and the size probe's clause (:data:`PROBE_CLAUSE`) taken out (one
    fault over many layers, measured values differing per layer, layers the probe did not reach); each
    group keeps every finding (JSON keeps one entry per module). A group's message names the span of
    modules and the range of each number that differs (:func:`merge_numbers`), and each distinct probe
    clause once (:func:`_merged_probe`)."""
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        src = (f.source.file, f.source.line) if f.source is not None else None
        key = (f.rule_id, f.severity, f.category, src, _shape(_generic(_split_probe(f.message)[0], f.module)),
               _shape(_generic(f.fix, f.module)))
        groups.setdefault(key, []).append(f)
    out = []
    for members in groups.values():
        first = members[0]
        if len(members) == 1:
            out.append(FindingGroup(findings=members, label=first.module or ROOT_LABEL, message=first.message,
                                    fix=first.fix))
            continue
        label = module_span([f.module for f in members])
        main = merge_numbers([_generic(_split_probe(f.message)[0], f.module) for f in members]).replace("\0", label)
        message = main + _merged_probe(members, label)
        fix = merge_numbers([_generic(f.fix, f.module) for f in members]).replace("\0", label) if first.fix else first.fix
        out.append(FindingGroup(findings=members, label=label, message=message, fix=fix))
    return out


# --------------------------------------------------------------------------------------------- text
def _where(src: Optional[SourceLocation]) -> str:
    if src is None:
        return ""
    path = src.file
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except ValueError:
        pass
    return f"{path}:{src.line}" if src.line else path


def _fmt_eps(eps: Optional[float]) -> str:
    return "-" if eps is None else f"{eps:g}"


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out


def _site_row(s: Site) -> list[str]:
    module = s.module or ROOT_LABEL
    if s.call_index:
        module += f" #{s.call_index + 1}"
    stats = (s.formula.stats_dtype if s.formula is not None and s.formula.stats_dtype else s.compute_dtype)
    return [module, s.kind, s.class_name, _fmt_eps(s.eps), ",".join(s.normalized_axes) or "-", s.placement,
            stats or "-"]


def _num(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.4g}"


def _weights_row(s: Site) -> list[str]:
    w = s.weights
    assert w is not None
    module = s.module or ROOT_LABEL
    if s.call_index:
        module += f" #{s.call_index + 1}"
    shape = "x".join(map(str, w.shape)) if w.shape else "-"
    neg = "-" if w.gain_negative_fraction is None else f"{w.gain_negative_fraction:.0%}"
    keys = []
    if w.missing:
        keys.append("missing " + ",".join(k.rsplit(".", 1)[-1] for k in w.missing))
    if w.renamed:
        keys.append("renamed " + ",".join(f"{a.rsplit('.', 1)[-1]}->{b.rsplit('.', 1)[-1]}" for a, b in w.renamed.items()))
    if w.unexpected:
        keys.append("extra " + ",".join(k.rsplit(".", 1)[-1] for k in w.unexpected))
    return [module, s.kind, shape, w.dtype or "-", _num(w.gain_mean), _num(w.gain_std), _num(w.gain_min),
            _num(w.gain_max), neg, {True: "yes", False: "no", None: "-"}[w.bias_present], str(w.nonfinite),
            w.running_state or "-", "; ".join(keys) or "ok"]


def _weights_section(report: Report) -> list[str]:
    """The norm parameters read from a checkpoint (one row per site with ``weights``)."""
    rows = [_weights_row(s) for s in report.sites if s.weights is not None]
    if not rows:
        return []
    where = report.target.checkpoint or report.target.path
    holder = "graph" if report.capture.method == "onnx" else "checkpoint"
    out = ["", f"norm parameters in the {holder} ({where}):"]
    header = ["module", "kind", "shape", "dtype", "gain mean", "std", "min", "max", "<0", "bias", "non-finite",
              "running stats", "keys"]
    if report.capture.method in ("none", "onnx"):  # no model to compare keys with
        header, rows = header[:-1], [r[:-1] for r in rows]
    out += _table(rows, header)
    return out


#: The most characters of a capture failure a header shows (the full text stays in the JSON report).
MAX_FAILURE_CHARS = 200


def capture_failures(attempts: list) -> list[tuple[list[str], str]]:
    """The failed capture attempts as ``(methods, reason)``, each distinct failure once: the reason is the
    first line of the error, cut to :data:`MAX_FAILURE_CHARS`; failures differing only in numbers (symbol
    names ``u8``/``u2``, sizes) are one, naming every method that failed so (``export``, ``export (eval)``)."""
    out: dict[str, tuple[list[str], str]] = {}
    for a in attempts:
        if a.ok:
            continue
        lines = (a.error or "").strip().splitlines()
        reason = lines[0].strip() if lines else ""
        if len(reason) > MAX_FAILURE_CHARS:
            reason = reason[:MAX_FAILURE_CHARS].rstrip() + "…"
        key = re.sub(r"\d+", "#", reason)
        out.setdefault(key, ([], reason))[0].append(a.method)
    return list(out.values())


def _capture_header(cap: Any) -> list[str]:
    """The capture lines of the text header: the method that captured (the successful attempt's label),
    then each distinct failure once (:func:`capture_failures`)."""
    done = [a.method for a in cap.attempts if a.ok]
    how = f"captured with {done[-1] if done else cap.method}" if cap.complete else \
        "capture FAILED: norms found by walking modules"
    if cap.method == "none":
        how = "checkpoint inspected without model code: norms found by key name and shape, kinds guessed"
    if cap.method == "onnx":
        how = "ONNX graph read as it is: norms found by their operators and decomposed forms"
    failed = [f"{', '.join(methods)} failed" + (f": {reason}" if reason else "")
              for methods, reason in capture_failures(cap.attempts)]
    if failed and cap.complete:
        return [how + " (after " + "; ".join(failed) + ")"]
    return [how] + ([f"  {f}" for f in failed] if cap.method != "none" else [])


def findings_section(report: Report, color: bool = False, root: Optional[Path] = None) -> list[str]:
    """The findings of an (escaped) report by severity, each group of one fault over many modules
    (:func:`group_findings`) as one entry with its place and fix; ``["no findings"]`` when there is none.
    A place outside ``root`` (the project root, default :func:`normaudit.report.locations.project_root`),
    such as a library's modeling file, is shown at the model's place inside it, as SARIF shows it, then
    ``(library: transformers/models/llama/modeling_llama.py:297)``."""
    from normaudit.report.locations import anchor_in_root, outside_note, project_root
    from normaudit.render.style import SEVERITY_STYLES, paint

    root = Path(root) if root is not None else project_root()

    lines: list[str] = []
    if not report.findings:
        from normaudit.baseline import baselined_count

        baselined = baselined_count(report)
        lines.append(f"no new findings ({baselined} in the baseline)" if baselined else "no findings")
    for sev in ("error", "warning", "info"):
        group = [f for f in report.findings if f.severity == sev]
        if not group:
            continue
        groups = group_findings(group)
        count = str(len(group)) if len(groups) == len(group) else f"{len(group)} findings in {len(groups)} entr{'y' if len(groups) == 1 else 'ies'}"
        title = f"{sev.upper()}S ({count})" if sev != "info" else f"INFO ({count})"
        lines.append(paint(title, SEVERITY_STYLES[sev], color))
        for g in groups:
            shown, outside = anchor_in_root(g.first, report, root)  # a whole-model finding: the class line
            where = _where(shown) + outside_note(outside)
            rule = paint(g.first.rule_id, SEVERITY_STYLES[sev], color)
            lines.append(f"  {rule} [{g.first.category}] {paint(g.count_label, 'bold', color)}: {g.message}")
            if where:
                lines.append(f"      at {where}")
            if g.fix:
                lines.append(f"      {paint('fix:', 'green', color)} {g.fix}")
        lines.append("")
    return lines


def render(report: Report, rules=None, options=None) -> str:
    """The human-readable report (every string of ``report`` escaped by :func:`escape_control`).

    ``options`` (:class:`normaudit.render.RenderOptions`): ``color`` paints severities and rule ids;
    ``quiet`` leaves only the findings (nothing at all when there is none).
    """
    report = escaped_report(report)
    color = bool(getattr(options, "color", False))
    root = getattr(options, "project_root", None)
    if getattr(options, "quiet", False):
        body = findings_section(report, color, root) if report.findings else []
        return guard_lines("\n".join(body).rstrip()) + "\n" if body else ""
    lines: list[str] = []
    t = report.target
    cap = report.capture
    lines.append(f"normaudit {report.version}: {t.path}  ({report.model.class_name}, dtype {t.dtype})")
    lines += _capture_header(cap)
    if cap.inputs_assumed:
        lines.append(f"inputs assumed: {cap.inputs_assumed}")
    lines.append("")
    rows = [_site_row(s) for s in report.sites]
    lines.append(f"{len(report.sites)} normalisation site(s)")
    if rows and cap.method != "none":
        lines += _table(rows, ["module", "kind", "class", "eps", "axes", "placement", "stats dtype"])
    lines += _weights_section(report)
    lines += numerics_lines(report)
    formulas = {}
    for s in report.sites:
        if s.formula is not None and s.formula.text:
            formulas.setdefault(s.formula.text, []).append(s.module or ROOT_LABEL)
    if formulas:
        lines.append("")
        lines.append("formulas:")
        for text, mods in formulas.items():
            more = f" (+{len(mods) - 1} more)" if len(mods) > 1 else ""
            lines.append(f"  {text}   [{mods[0]}{more}]")
    m = report.model
    if m.blocks or m.placement != "unknown":
        lines.append("")
        lines.append(f"residual scheme: {m.placement}" + (" (parallel attention/MLP branches)" if m.parallel_residual else "")
                     + ("" if m.has_final_norm is None else f", final norm: {'yes' if m.has_final_norm else 'no'}"))
        kinds: dict[tuple, list[str]] = {}
        for b in m.blocks:
            roles = tuple((k[len(b.path) + 1:] if k.startswith(b.path + ".") else k, v) for k, v in b.norms.items())
            kinds.setdefault((b.class_name, roles), []).append(b.path)
        for (cls, roles), paths in kinds.items():
            desc = ", ".join(f"{name}={role}" for name, role in roles) or "no norms"
            span = paths[0] if len(paths) == 1 else f"{paths[0]} .. {paths[-1]} (x{len(paths)})"
            lines.append(f"  {cls} {span}: {desc}")
    lines.append("")
    lines += findings_section(report, color, root)
    for note in report.notes:
        lines.append(f"note: {note}")
    s = report.summary
    lines.append(f"{s.sites} sites, {s.errors} error(s), {s.warnings} warning(s), {s.infos} info")
    return guard_lines("\n".join(lines).rstrip()) + "\n"
