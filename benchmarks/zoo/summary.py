"""The sweep's outputs: ``zoo.tsv`` (one row per target) and ``summary.md`` (the issue's figures).

Definitions used by both:
- captured: normaudit exited 0 or 1 and its capture method is a graph (not ``none``/``module_walk``);
- clean: audited (exit 0/1) with no finding at warning or error;
- recall of one model: of the norm modules a real forward called (:mod:`forward`), the fraction that
  are the module of a site found in a captured graph (``module_walk`` sites, found by walking modules
  without a graph, do not count: they carry no axes, placement or formula facts); ``full recall`` is
  that fraction being 1. ``recall_any`` counts every site.
"""
from __future__ import annotations

import csv
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Optional

#: Class names that say "Norm" about something that is not a norm module (timm ``NormFreeBlock``,
#: ``ConvNormAct`` with ``norm_layer=None``, ``NormMlpClassifierHead``); applied to the ground truth of
#: results written before this filter existed too.
NOT_A_NORM = re.compile(r"Block|Conv|Free|Stage|Head|Attention|Attn|Mlp|MLP|Embed|Model|Encoder|Decoder|Layer$")

COLUMNS = ("corpus", "type", "model", "shrink", "exit", "capture", "complete", "sites", "fwd_norms",
           "norm_modules", "recall", "missing", "extra", "findings", "audit_s", "total_s", "cpu_s", "fwd_inputs", "error")


def _drop_non_norms(r: dict[str, Any]) -> dict[str, Any]:
    """``r`` without ground-truth modules whose class name :data:`NOT_A_NORM` rules out."""
    norms = r.get("norm_modules") or {}
    bad = {path for path, cls in norms.items() if "Norm" in cls and NOT_A_NORM.search(cls)}
    if not bad:
        return r
    r = dict(r, norm_modules={p: c for p, c in norms.items() if p not in bad})
    if r.get("fwd_norms") is not None:
        r["fwd_norms"] = [p for p in r["fwd_norms"] if p not in bad]
    return r


def latest(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per ``(corpus, name)``, the last one written (a rerun into the same folder wins)."""
    by_key = {(r["corpus"], r["name"]): _drop_non_norms(r) for r in results}
    return sorted(by_key.values(), key=lambda r: (r["corpus"], r["name"]))


def audited(r: dict[str, Any]) -> bool:
    return r.get("exit") in (0, 1)


def captured(r: dict[str, Any]) -> bool:
    return audited(r) and r.get("capture") not in (None, "none", "module_walk")


def recall(r: dict[str, Any], key: str = "graph_site_modules") -> Optional[float]:
    """Fraction of forward-called norm modules that are graph sites (``key="site_modules"``: any site);
    None where not measured."""
    called = r.get("fwd_norms")
    if not audited(r) or called is None:
        return None
    if not called:
        return 1.0
    sites = set(r.get(key) or [])
    return sum(1 for m in called if m in sites) / len(called)


def missing(r: dict[str, Any]) -> list[str]:
    """Forward-called norm modules with no graph site in the report."""
    sites = set(r.get("graph_site_modules") or [])
    return [m for m in r.get("fwd_norms") or [] if m not in sites]


def extra(r: dict[str, Any]) -> list[str]:
    """Graph sites whose module is no norm module the forward called (a functional norm inside another
    module, a hand-written norm, or something that is no norm: weight standardisation)."""
    if r.get("fwd_norms") is None:
        return []
    called = set(r["fwd_norms"])
    return [m for m in r.get("graph_site_modules") or [] if m not in called]


def write_tsv(results: Iterable[dict[str, Any]], path: Path) -> None:
    """One row per target with :data:`COLUMNS` (findings as ``RULE@module``, ``;``-separated)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(COLUMNS)
        for r in latest(results):
            rec = recall(r)
            gone, more = missing(r), extra(r)
            w.writerow([
                r["corpus"], r.get("family") or r["name"], r["name"], r.get("shrink", ""), r.get("exit"),
                r.get("capture") or "", r.get("complete", ""), r.get("sites", ""),
                "" if r.get("fwd_norms") is None else len(r["fwd_norms"]), len(r.get("norm_modules") or {}),
                "" if rec is None else f"{rec:.3f}", ",".join(gone[:5]) + (f",+{len(gone) - 5}" if len(gone) > 5
                                                                          else ""),
                ",".join(more[:5]) + (f",+{len(more) - 5}" if len(more) > 5 else ""),
                ";".join(f"{f['rule']}@{f['module'] or '<model>'}" for f in r.get("findings") or []),
                r.get("audit_s", ""), r.get("total_s", ""), r.get("cpu_s", ""), (r.get("fwd_inputs") or "")[:120],
                " ".join(str(r.get("error") or r.get("capture_error") or "").split())[:200]])


def _pct(n: int, d: int) -> str:
    return f"{n} / {d} ({100 * n / d:.1f}%)" if d else "0 / 0"


def corpus_lines(rs: list[dict[str, Any]], corpus: str) -> list[str]:
    """The Markdown figures of one corpus."""
    built = [r for r in rs if r.get("exit") != "build"]
    aud = [r for r in built if audited(r)]
    exits = Counter(str(r.get("exit")) for r in built)
    recs = [x for x in (recall(r) for r in aud) if x is not None]
    recs_any = [x for x in (recall(r, "site_modules") for r in aud) if x is not None]
    times = [r["audit_s"] for r in aud if "audit_s" in r]
    cpu = [r["cpu_s"] for r in rs if r.get("cpu_s") is not None]
    timeouts = [r["name"] for r in rs if r.get("exit") == "timeout"]
    flagged = [r for r in aud if r.get("findings")]
    non_capture = [r for r in aud if any(f["rule"] != "NK101" for f in r.get("findings") or [])]
    rules = Counter(f["rule"] for r in aud for f in r.get("findings") or [])
    lines = [f"## {corpus}", "",
             f"- targets: {len(rs)}; built from small configs: {len(built)} "
             f"(not built: {len(rs) - len(built)})",
             f"- exit codes: {dict(sorted(exits.items()))}",
             f"- audited (exit 0/1): {_pct(len(aud), len(built))}",
             f"- captured as a graph: {_pct(sum(captured(r) for r in built), len(built))}",
             f"- clean (no warning/error finding): {_pct(len(aud) - len(flagged), len(aud))}",
             f"- with a warning/error finding other than NK101 (capture failed): "
             f"{_pct(len(non_capture), len(aud))}",
             f"- recall measured (a real forward ran): {len(recs)}; full recall (every called norm is a "
             f"site): {_pct(sum(1 for x in recs if x == 1.0), len(recs))}; mean recall "
             f"{statistics.mean(recs) if recs else 0:.3f} (graph sites; counting module-walk sites too: "
             f"full {_pct(sum(1 for x in recs_any if x == 1.0), len(recs_any))})",
             f"- graph sites on modules that are no norm module called by the forward (functional or "
             f"hand-written norms, or no norm at all): {sum(len(extra(r)) for r in aud)} in "
             f"{sum(1 for r in aud if extra(r))} models",
             f"- norm modules never called by the forward (not audited by any graph): "
             f"{sum(len(r.get('norm_modules') or {}) - len(r['fwd_norms']) for r in aud if r.get('fwd_norms') is not None)}"
             f" in {sum(1 for r in aud if r.get('fwd_norms') is not None and len(r['fwd_norms']) < len(r.get('norm_modules') or {}))} models",
             f"- audit time per model: median {statistics.median(times) if times else 0:.1f} s, "
             f"max {max(times) if times else 0:.1f} s (wall, on a shared machine); CPU per target (build, "
             f"audit, forward): median {statistics.median(cpu) if cpu else 0:.1f} s, total "
             f"{sum(cpu) / 60:.1f} min",
             f"- timeouts: {len(timeouts)} {timeouts[:20]}",
             f"- findings at warning+ by rule: {dict(rules.most_common())}", ""]
    return lines


def write_markdown(results: Iterable[dict[str, Any]], path: Path, wall_file: Optional[Path] = None) -> None:
    """``summary.md``: per corpus counts, % clean, % captured, recall, median/max time per model."""
    rs = latest(results)
    lines = ["# normaudit zoo sweep", ""]
    if wall_file is not None and wall_file.is_file():
        lines += [f"Wall time of the sweep: {int(wall_file.read_text()) / 60:.1f} min", ""]
    for corpus in sorted({r["corpus"] for r in rs}):
        lines += corpus_lines([r for r in rs if r["corpus"] == corpus], corpus)
    path.write_text("\n".join(lines) + "\n")
