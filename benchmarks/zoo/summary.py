"""The sweep's outputs: ``zoo.tsv`` (one row per target) and ``summary.md`` (the issue's figures).

Definitions used by both:
- captured: normaudit exited 0 or 1 and its capture method is a graph (not ``none``/``module_walk``);
- clean: audited (exit 0/1) with no finding at warning or error;
- recall of one model: of the norm modules a real forward called (:mod:`forward`), the fraction that
  are the module of a site found in a captured graph (``module_walk`` sites, found by walking modules
  without a graph, do not count: they carry no axes, placement or formula facts); ``full recall`` is
  that fraction being 1. ``recall_any`` counts every site;
- covered: captured (whole graph or parts) with every forward-called norm module a graph site;
- norm module: a torch.nn norm or a class whose name names a norm (:func:`says_norm`), holding no norm;
- exact sites: the graph sites on norm modules are exactly the forward-called norm modules; graph sites in
  modules that are no norm module (functional norms inside attention) are counted apart (``functional``);
- crash: exit 3, an exception the worker caught, or a worker that died;
- mode: how a transformers type was sized (``careful``, ``full``, ``plain``: ``sweep.py --mode``); a result
  without one is ``careful``. Each mode is a column of its own, and a type counts as covered as users get
  it only where it is covered in every mode swept (:func:`mode_coverage`).
"""
from __future__ import annotations

import csv
import re
import statistics
from pathlib import Path
from typing import Any, Iterable, Optional

#: Words that, after the last "Norm" of a class name (its head noun: English CamelCase puts it last), say the
#: class is something else that has a norm in its name: timm ``NormFreeBlock``/``NormMlpClassifierHead``/
#: ``NormLinear``, wav2vec2's ``LayerNormConvLayer``, roberta-prelayernorm's ``...SelfOutput``/``...Pooler``,
#: ``PatchTSMixerNormLayer`` (a wrapper), StableLM's ``LayerNormPerHead`` (a list of LayerNorms).
NOT_A_NORM = re.compile(r"Block|Conv|Free|Stage|Head|Attention|Attn|Mlp|MLP|Embed|Model|Encoder|Decoder|Layer|"
                        r"Output|Pooler|Linear|Net|Cell|Classifier")
#: Words right before the last "Norm" that make the class a block holding a conv/linear and (maybe) a norm:
#: timm ``ConvNormAct``/``Conv2dNorm``/``SeparableConvNormAct`` (``norm_layer=None``: no norm at all),
#: ``LinearNorm``, ``ConvMlpWithNorm``
_BLOCK_BEFORE_NORM = re.compile(r"(Conv(\dd)?|Linear|With)$")
#: "Norm" as a word (not ``Normal``, ``Normed``, ``Normalization``)
NORM_WORD = re.compile(r"Norm(?![a-z])")
#: classes named Norm that compute no statistic: mobilebert's ``NoNorm`` (``x * weight + bias``), a weight
#: reparametrisation (``_WeightNorm``)
_NO_STATISTIC = re.compile(r"^NoNorm$|WeightNorm")


def strip_model_prefix(name: str, prefixes: Iterable[str] = ()) -> str:
    """``name`` without the longest of ``prefixes`` it starts with (case-insensitive, at a CamelCase
    boundary): the model's own name (``RobertaPreLayerNorm``, ``ConvNextV2``, ``EmbeddingGemma2``) says
    nothing about what one of its classes is. A prefix may be written as a model type (``roberta-prelayernorm``:
    letters and digits compared)."""
    for prefix in sorted((re.sub(r"[^0-9a-z]", "", p.lower()) for p in prefixes), key=len, reverse=True):
        if prefix and name.lower().startswith(prefix) and len(name) > len(prefix) and name[len(prefix)].isupper():
            return name[len(prefix):]
    return name


def says_norm(name: str, prefixes: Iterable[str] = ()) -> bool:
    """Whether the class name ``name`` names a norm module: with the model's name prefix removed
    (:func:`strip_model_prefix`), it has the word "Norm", no :data:`NOT_A_NORM` word after the last one (the
    head noun is the norm: ``ConvNextV2LayerNorm``, ``PeAudioEncoderRMSNorm``, ``FrozenBatchNormAct2d``,
    ``EvoNorm2dS0``), no conv/linear block word right before it, and it is no statistic-free "norm"
    (:data:`_NO_STATISTIC`)."""
    name = strip_model_prefix(name, prefixes)
    words = list(NORM_WORD.finditer(name))
    if not words or _NO_STATISTIC.search(name):
        return False
    last = words[-1]
    return not (NOT_A_NORM.search(name[last.end():]) or _BLOCK_BEFORE_NORM.search(name[:last.start()]))


COLUMNS = ("corpus", "type", "model", "shrink", "exit", "capture", "complete", "sites", "fwd_norms",
           "norm_modules", "recall", "missing", "extra", "findings", "audit_s", "total_s", "cpu_s", "fwd_inputs", "error",
           "functional", "mode")


def _drop_non_norms(r: dict[str, Any]) -> dict[str, Any]:
    """``r`` without ground-truth modules whose class name says Norm but names no norm (:func:`says_norm`,
    the model type as the prefix): results written before the ground truth's class test was right."""
    norms = r.get("norm_modules") or {}
    prefixes = [str(r.get("family") or r.get("name") or "")]
    bad = {path for path, cls in norms.items() if NORM_WORD.search(cls) and not says_norm(cls, prefixes)}
    if not bad:
        return r
    r = dict(r, norm_modules={p: c for p, c in norms.items() if p not in bad})
    if r.get("fwd_norms") is not None:
        r["fwd_norms"] = [p for p in r["fwd_norms"] if p not in bad]
    return r


def mode(r: dict[str, Any]) -> str:
    """How the target was sized (``careful`` for a result written before the sweep had modes)."""
    return r.get("mode") or "careful"


def latest(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per ``(corpus, mode, name)``, the last one written (a rerun into the same folder wins)."""
    by_key = {(r["corpus"], mode(r), r["name"]): _drop_non_norms(r) for r in results}
    return sorted(by_key.values(), key=lambda r: (r["corpus"], MODE_ORDER.get(mode(r), 9), r["name"]))


#: the order of the modes' columns
MODE_ORDER = {"careful": 0, "full": 1, "plain": 2}


def column(r: dict[str, Any]) -> str:
    """The summary column of ``r``: its corpus, with the mode beside it where that is not ``careful``."""
    return r["corpus"] if mode(r) == "careful" else f"{r['corpus']} ({mode(r)})"


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


def _norm_sites(r: dict[str, Any]) -> list[str]:
    """Graph sites whose module is itself a norm module of the model (``norm_modules``: a torch.nn norm or a
    class named as one, :func:`says_norm`)."""
    norms = r.get("norm_modules") or {}
    return [m for m in r.get("graph_site_modules") or [] if m in norms]


def functional(r: dict[str, Any]) -> list[str]:
    """Graph sites in modules that are no norm module: a functional or hand-written norm inside another
    module (Swin-V2's cosine attention ``F.normalize`` in ``attention.self``), or something that is no norm
    at all. Counted apart: no forward-hook ground truth can see them, so they are neither hits nor misses.
    Empty where no forward ran (the norm modules of a model never built for real are not known)."""
    if r.get("fwd_norms") is None:
        return []
    norms = r.get("norm_modules") or {}
    return [m for m in r.get("graph_site_modules") or [] if m not in norms]


def extra(r: dict[str, Any]) -> list[str]:
    """Graph sites on norm modules that the forward did not call (the capture ran a norm no input set of the
    ground truth reached, or a site was put on the wrong norm module)."""
    if r.get("fwd_norms") is None:
        return []
    called = set(r["fwd_norms"])
    return [m for m in _norm_sites(r) if m not in called]


def _few(paths: list[str], n: int = 5) -> str:
    return ",".join(paths[:n]) + (f",+{len(paths) - n}" if len(paths) > n else "")


def write_tsv(results: Iterable[dict[str, Any]], path: Path) -> None:
    """One row per target with :data:`COLUMNS` (findings as ``RULE@module``, ``;``-separated)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(COLUMNS)
        for r in latest(results):
            rec = recall(r)
            w.writerow([
                r["corpus"], r.get("family") or r["name"], r["name"], r.get("shrink", ""), r.get("exit"),
                r.get("capture") or "", r.get("complete", ""), r.get("sites", ""),
                "" if r.get("fwd_norms") is None else len(r["fwd_norms"]), len(r.get("norm_modules") or {}),
                "" if rec is None else f"{rec:.3f}", _few(missing(r)), _few(extra(r)),
                ";".join(f"{f['rule']}@{f['module'] or '<model>'}" for f in r.get("findings") or []),
                r.get("audit_s", ""), r.get("total_s", ""), r.get("cpu_s", ""), (r.get("fwd_inputs") or "")[:120],
                " ".join(str(r.get("error") or r.get("capture_error") or "").split())[:200], _few(functional(r)),
                mode(r)])


def _pct(n: int, d: int) -> str:
    return f"{n} / {d} ({100 * n / d:.1f}%)" if d else "0 / 0"


def crashed(r: dict[str, Any]) -> bool:
    """normaudit exited 3 (internal error), the worker caught an exception, or the worker process died."""
    return r.get("exit") in (3, "crash", "worker died")


def covered(r: dict[str, Any]) -> bool:
    """Captured as a graph (whole model or parts) with every norm module a forward called a graph site; where
    no forward ran, the report's own ``complete`` (a whole-model graph reaching every norm module) or, for a
    capture by parts, every norm module of the model a graph site of some part (:func:`every_norm_sited`)."""
    if not captured(r):
        return False
    if r.get("fwd_norms") is not None:
        return not missing(r)
    return bool(r.get("complete")) or every_norm_sited(r)


def every_norm_sited(r: dict[str, Any]) -> bool:
    """Whether the model has norm modules and each is a graph site (of the whole graph or of a part)."""
    norms = r.get("norm_modules") or {}
    return bool(norms) and set(_norm_sites(r)) == set(norms)


def exact_sites(r: dict[str, Any]) -> Optional[bool]:
    """Whether the graph sites on norm modules are exactly the norm modules a forward called (None: no forward
    ran); sites in other modules (:func:`functional`) are left out of the comparison."""
    if not audited(r) or r.get("fwd_norms") is None:
        return None
    return set(_norm_sites(r)) == set(r["fwd_norms"])


def _time(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} / {max(values):.1f}" if values else "n/a"


def corpus_figures(rs: list[dict[str, Any]]) -> dict[str, str]:
    """The closing note's figures of one corpus, as ``{row label: cell}`` (Markdown table cells).

    Denominators: "built" for capture and crash rows (a target whose shrunk config no level builds is the
    sweep's, not normaudit's), "audited" (exit 0/1) for clean, "measured" (a real forward ran) for recall."""
    built = [r for r in rs if r.get("exit") != "build"]
    aud = [r for r in built if audited(r)]
    measured = [r for r in aud if r.get("fwd_norms") is not None]
    flagged = [r for r in aud if r.get("findings")]
    superset = [r for r in measured if not missing(r)]
    return {
        "targets": str(len(rs)),
        "built (small config / timm model)": _pct(len(built), len(rs)),
        "audited (exit 0 or 1)": _pct(len(aud), len(built)),
        "exit 2 (refused)": str(sum(1 for r in built if r.get("exit") == 2)),
        "crashes (exit 3, worker error)": str(sum(1 for r in built if crashed(r))),
        "timeouts": str(sum(1 for r in built if r.get("exit") == "timeout")),
        "captured as a graph": _pct(sum(captured(r) for r in built), len(built)),
        "graph or parts covering every norm": _pct(sum(covered(r) for r in built), len(built)),
        "clean (no warning/error finding)": _pct(len(aud) - len(flagged), len(aud)),
        "recall measured (a forward ran)": _pct(len(measured), len(aud)),
        "every forward norm is a graph site": _pct(len(superset), len(measured)),
        "graph sites on norm modules = forward norms": _pct(sum(1 for r in measured if exact_sites(r)),
                                                             len(measured)),
        "models with functional sites in other modules": str(sum(1 for r in measured if functional(r))),
        "forward norms that are graph sites (all measured models)": _pct(*_norm_hits(measured)),
        "covered, of all targets": _pct(sum(covered(r) for r in built), len(rs)),
        **{f"not covered: {cause}": str(n) for cause, n in uncovered_causes(rs).items()},
        "audit s per model, median / max": _time([r["audit_s"] for r in aud if r.get("audit_s") is not None]),
        "target s (build + audit + forward), median / max":
            _time([r["total_s"] for r in rs if r.get("total_s") is not None]),
        "CPU s per target, median / max": _time([r["cpu_s"] for r in rs if r.get("cpu_s") is not None]),
        "CPU min, all targets": f"{sum(r.get('cpu_s') or 0 for r in rs) / 60:.1f}",
    }


#: why a target is not covered (:func:`uncovered_cause`), in the summary's order
CAUSES = ("not built", "inputs (no input set runs the model)", "capture failed (a forward ran, or exit 2/3, timeout)",
          "captured, norms missed (forward norms, or the report's own count where none ran)")


def uncovered_cause(r: dict[str, Any]) -> Optional[str]:
    """Why ``r`` is not :func:`covered` (None where it is), one of :data:`CAUSES`: no shrink level built
    (the sweep's); no graph and no input set of the ground truth ran either (the model wants inputs neither
    normaudit nor the sweep builds: BROS ``bbox``, LXMERT ``visual_feats``, or a shrink misfit); no graph
    although a real forward ran (normaudit's capture; exit 2/3, crashes and timeouts too); a graph missing norms a forward called
    (where no forward ran: the report's own ``complete`` false, as :func:`covered` reads it)."""
    if r.get("exit") == "build":
        return CAUSES[0]
    if covered(r):
        return None
    if not captured(r):
        return CAUSES[1] if audited(r) and r.get("fwd_norms") is None else CAUSES[2]
    return CAUSES[3]


def uncovered_causes(rs: list[dict[str, Any]]) -> dict[str, int]:
    """Number of targets per :data:`CAUSES` entry (zeros kept: the note quotes every cause)."""
    counts = dict.fromkeys(CAUSES, 0)
    for r in rs:
        cause = uncovered_cause(r)
        if cause is not None:
            counts[cause] += 1
    return counts


def _norm_hits(measured: list[dict[str, Any]]) -> tuple[int, int]:
    """(forward-called norm modules that are graph sites, forward-called norm modules), summed over models."""
    return (sum(len(r["fwd_norms"]) - len(missing(r)) for r in measured),
            sum(len(r["fwd_norms"]) for r in measured))


def findings_by_rule(rs: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
    """``(rule, severity, sorted model names)`` of every warning/error finding, most models first."""
    models: dict[tuple[str, str], set[str]] = {}
    for r in rs:
        for f in r.get("findings") or []:
            models.setdefault((f["rule"], f["severity"]), set()).add(r["name"])
    return sorted(((rule, sev, sorted(names)) for (rule, sev), names in models.items()),
                  key=lambda x: (-len(x[2]), x[0]))


def _failures(rs: list[dict[str, Any]]) -> list[str]:
    """Markdown lines naming the targets not built, crashed, timed out or refused (exit 2), with the error."""
    lines = []
    for label, test in (("not built", lambda r: r.get("exit") == "build"), ("crash", crashed),
                        ("timeout", lambda r: r.get("exit") == "timeout"), ("exit 2", lambda r: r.get("exit") == 2)):
        for r in (r for r in rs if test(r)):
            error = " ".join(str(r.get("error") or r.get("capture_error") or "").split())[:160]
            lines.append(f"- {label}: `{r['name']}`: {error}")
    return lines


def _uncovered(rs: list[dict[str, Any]]) -> list[str]:
    """Markdown lines naming each built target that is not :func:`covered`: its cause (:data:`CAUSES`), the last
    capture error and the line of library code it was raised from, so a library limitation is named by its line."""
    lines = []
    for r in rs:
        cause = uncovered_cause(r)
        if cause is None or cause == CAUSES[0]:
            continue
        error = " ".join(str(r.get("capture_error") or r.get("error") or "").split())[:160]
        where = f" (at `{r['capture_location']}`)" if r.get("capture_location") else ""
        lines.append(f"- `{r['name']}` ({mode(r)}): {cause}: {error}{where}")
    return lines


def write_markdown(results: Iterable[dict[str, Any]], path: Path, wall_file: Optional[Path] = None) -> None:
    """``summary.md``: one table (a row per figure of :func:`corpus_figures`, a column per corpus), then per
    corpus the warning/error findings by rule with the models named, the built targets not covered (cause,
    error, library line) and the failed targets."""
    rs = latest(results)
    corpora = list(dict.fromkeys(column(r) for r in rs))
    by_corpus = {c: [r for r in rs if column(r) == c] for c in corpora}
    figures = {c: corpus_figures(by_corpus[c]) for c in corpora}
    lines = ["# normaudit zoo sweep", ""]
    if wall_file is not None and wall_file.is_file():
        lines += [f"Wall time of the sweep: {int(wall_file.read_text()) / 60:.1f} min", ""]
    lines += ["| | " + " | ".join(corpora) + " |", "|---|" + "---|" * len(corpora)]
    for row in (figures[corpora[0]] if corpora else {}):
        lines.append(f"| {row} | " + " | ".join(figures[c][row] for c in corpora) + " |")
    lines += mode_coverage_lines(rs)
    for corpus in corpora:
        lines += ["", f"## {corpus}: findings at warning or error, by rule", ""]
        rules = findings_by_rule(by_corpus[corpus])
        lines += ["| rule | severity | models | names |", "|---|---|---|---|"] if rules else ["none"]
        lines += [f"| {rule} | {sev} | {len(names)} | {', '.join(names)} |" for rule, sev, names in rules]
        uncovered = _uncovered(by_corpus[corpus])
        if uncovered:
            lines += ["", f"## {corpus}: built, not covered: the cause and the library's line", ""] + uncovered
        failed = _failures(by_corpus[corpus])
        if failed:
            lines += ["", f"## {corpus}: not built, crashed, timed out, refused", ""] + failed
    path.write_text("\n".join(lines) + "\n")


def mode_coverage(rs: list[dict[str, Any]], corpus: str) -> Optional[dict[str, Any]]:
    """Coverage of ``corpus`` across the modes swept (``rs``: :func:`latest` results), or None where it was
    swept in one mode only: ``modes`` (in :data:`MODE_ORDER`), ``types`` (built in every mode), ``every``
    (of those, covered in every mode: a type covered only under the careful shrink is not covered as users
    get it), and per mode the types of ``types`` covered there but not in every mode (``only``)."""
    by_mode: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rs:
        if r["corpus"] == corpus:
            by_mode.setdefault(mode(r), {})[r["name"]] = r
    if len(by_mode) < 2:
        return None
    order = sorted(by_mode, key=lambda m: MODE_ORDER.get(m, 9))
    types = sorted(set.intersection(*({n for n, r in by_mode[m].items() if r.get("exit") != "build"}
                                      for m in order)))
    every = [n for n in types if all(covered(by_mode[m][n]) for m in order)]
    only = {m: [n for n in types if covered(by_mode[m][n]) and n not in every] for m in order}
    return {"modes": order, "types": types, "every": every, "only": only}


def mode_coverage_lines(rs: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of :func:`mode_coverage` for each corpus swept in several modes (none otherwise)."""
    lines: list[str] = []
    for corpus in sorted({r["corpus"] for r in rs}):
        cov = mode_coverage(rs, corpus)
        if cov is None:
            continue
        lines += ["", f"## {corpus}: coverage across the modes ({', '.join(cov['modes'])})", "",
                  f"- types built in every mode: {len(cov['types'])}",
                  f"- covered in every mode: {_pct(len(cov['every']), len(cov['types']))}"]
        for m, names in cov["only"].items():
            if names:
                lines.append(f"- covered under {m} but not in every mode ({len(names)}): {', '.join(names)}")
    return lines
