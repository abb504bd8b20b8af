"""The audit of an ONNX file: its graph read (:func:`normaudit.loaders.onnx_file.open_onnx`), its facts
(:func:`normaudit.facts.onnx_graph.analyse`), the rules that apply to a graph without model code
(:data:`ONNX_RULES`) evaluated over them, and the report.

The config the eps are compared with is ``--config`` and a ``config.json`` beside the file (the layout of an
``optimum`` export); the dtype audited is the graph's own float type."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from normaudit import __version__
from normaudit.engine.evaluator import evaluate
from normaudit.engine.options import RuleOptions
from normaudit.engine.schema import Rule
from normaudit.errors import UsageError
from normaudit.facts.eps import ConfigSource
from normaudit.facts.onnx_graph import analyse, graph_dtype
from normaudit.loaders.config import load_config
from normaudit.loaders.onnx_file import open_onnx
from normaudit.loaders.onnx_file.tensors import stored_bytes
from normaudit.loaders.safe_read import loads_json, read_regular
from normaudit.options import AuditOptions
from normaudit.phases import phase
from normaudit.report import SEVERITY_RANK, CaptureInfo, Report, SourceLocation, Summary, TargetInfo
from normaudit.suppress import filter_findings

#: The rules whose facts an ONNX graph gives (see the README): layout (axes reduced against the input's
#: layout), GroupNorm and BatchNorm channels, eps (against the config, the peers, zero, the dtype), eps outside
#: the root and statistics in float16 (decomposed norms and ``stash_type``), gain statistics (as for a
#: checkpoint), and placement (a pre-LN stream without a final norm, a norm of a norm). The others read facts
#: only model code gives (probes, constructors, the model's own config, module usage).
ONNX_RULES = ("NL101", "NL102", "NL103", "NL104", "NB102", "NB107", "NE101", "NE102", "NE103", "NE104", "NT104",
              "NN101", "NC101", "NC102", "NC103", "NC104", "NC105", "NC108", "NP101", "NP103")


def _active(rules: dict[str, Rule], opts: AuditOptions) -> list[Rule]:
    """The rules of :data:`ONNX_RULES` that ``--select``/``--ignore`` keep (matched as the audit of any target
    matches them: by id prefix, name or category)."""
    def match(rule: Rule, patterns: list[str]) -> bool:
        return any(rule.id.startswith(p) or rule.name == p or rule.category == p for p in patterns)

    return [r for r in rules.values() if r.id in ONNX_RULES and (not opts.select or match(r, opts.select))
            and not match(r, opts.ignore)]


def config_sources(opts: AuditOptions, path: Path) -> tuple[list[ConfigSource], dict, Optional[str], Optional[str]]:
    """(the configs compared, the config in force, its source name, its origin): ``--config`` (origin ``cli``)
    and a ``config.json`` beside the ONNX file (origin ``checkpoint``: it came with the export)."""
    sources: list[ConfigSource] = []
    if opts.config:
        sources.append(ConfigSource("cli", Path(opts.config).name, load_config(opts.config)))
    if opts.config_data is not None:
        sources = [ConfigSource("cli", "the given config", dict(opts.config_data))]
    beside = path.parent / "config.json"
    if beside.is_file() and not (opts.config and Path(opts.config).resolve() == beside.resolve()):
        data = loads_json(read_regular(beside, "config"), "config", file=str(beside))
        if isinstance(data, dict):
            sources.append(ConfigSource("checkpoint", "config.json (beside the ONNX file)", data))
    if not sources:
        return [], {}, None, None
    first = sources[0]
    return sources, dict(first.data), first.source, first.origin


def onnx_report(opts: AuditOptions, mua: Any, rules: dict[str, Rule]) -> Report:
    """The report of the ONNX file ``mua.file`` (see the module docstring). Raises UsageError for an
    unreadable or corrupt file, a missing ``onnx`` package, or ``--checkpoint`` (the graph holds its weights)."""
    path = Path(mua.file or opts.target)
    if opts.checkpoint:
        raise UsageError("the target is an ONNX graph, which holds its own weights: give --checkpoint with a model "
                         "target only", file=opts.checkpoint)
    phase("onnx")
    g = open_onnx(path)
    sources, config, source, origin = config_sources(opts, path)
    phase("facts")
    facts = analyse(g, sources)
    sites = [r.site for r in facts.records]
    for s in sites:
        s.source = SourceLocation(file=str(path))
    dtype = graph_dtype(g)
    facts.model.config_source = source
    phase("rules")
    options = RuleOptions(dtype=dtype, batch_size=opts.batch_size, checkpoint=True, capture_method="onnx",
                          config_origin=origin)
    active = _active(rules, opts)
    findings = evaluate(active, sites, facts.model, config, source, options)
    kept = filter_findings(findings, sites=sites, model=facts.model, rules=rules, active=active,
                           per_module_ignores=opts.per_module_ignores, config=config, config_source=source,
                           options=options, target_file=None)
    findings = kept.findings
    findings.sort(key=lambda f: (-SEVERITY_RANK[f.severity], f.module, f.rule_id))
    notes = [_graph_note(g, len(sites), dtype)] + g.notes + facts.notes + list(mua.notes) + kept.notes()
    if opts.dtype != "float32" and opts.dtype != dtype:
        notes.append(f"--dtype {opts.dtype} does not apply: an ONNX graph computes in its own types ({dtype})")
    if any(p for p in opts.probes):
        notes.append("probes run model code: an ONNX graph was only read (give the model file for --probe)")
    by_kind: dict[str, int] = {}
    for s in sites:
        by_kind[s.kind] = by_kind.get(s.kind, 0) + 1
    summary = Summary(sites=len(sites), by_kind=by_kind, errors=sum(f.severity == "error" for f in findings),
                      warnings=sum(f.severity == "warning" for f in findings),
                      infos=sum(f.severity == "info" for f in findings))
    target = TargetInfo(path=opts.target, kind="onnx", config=opts.config, dtype=dtype, batch_size=opts.batch_size)
    info = CaptureInfo(method="onnx", complete=True, num_nodes=len(g.nodes), fake_tensors=False,
                       inputs=[f"{n}: {g.dtype(n) or '?'}{g.shape(n) if g.shape(n) is not None else ''}" for n in g.inputs])
    return Report(version=__version__, target=target, capture=info, model=facts.model, sites=sites,
                  findings=findings, summary=summary, notes=notes)


def _graph_note(g: Any, sites: int, dtype: str) -> str:
    """What was read: the producer, opset, nodes and tensors, the bytes read of the file and its external data."""
    total = g.file_bytes + sum(stored_bytes(t) for t in g.store.tensors.values() if t.data_location == 1)
    producer = " ".join(p for p in (g.model.producer_name, g.model.producer_version) if p) or "unknown producer"
    return (f"ONNX graph ({producer}, opset {g.opsets.get('', '?')}, {len(g.nodes)} nodes, {len(g.store.tensors)} "
            f"tensors, {dtype}): {sites} norm site(s) read from its operators and decomposed norms; read "
            f"{g.bytes_read} of {total} bytes (the graph, and only the norms' parameters of its external data); "
            "only the rules that apply to a graph without model code ran")

