"""Markdown output (``--format markdown``) for a pull-request comment.

Layout: a title naming the target; a summary (findings by severity, sites by kind, model placement,
capture method); the findings table (severity, rule, module, message, location); the rules that
fired, collapsed; the site inventory, collapsed in ``<details>``; and a Mermaid flowchart with one
block of each kind from ``report.model.blocks`` showing the residual stream and where each norm sits.

Blocks are grouped by class name and the roles of their norms by relative name (``layers.0`` and
``layers.1`` of a Llama share ``input_layernorm: pre, post_attention_layernorm: pre``); each group is
drawn once, titled ``<class> x N``. Within a block, norms are read in the order ``Block.norms`` lists
them (execution order) and assigned to residual branches:

- ``pre`` opens a new branch and sits between the stream and the sublayer;
- ``sandwich`` sits on the branch output, before the add, when the open branch has an input norm and
  no output norm yet (otherwise it opens a branch as its input norm);
- ``post`` sits on the stream after the branch's add;
- ``qk`` is attached to the open branch's sublayer (attention);
- other roles (``none``, ``unknown``, ``final``, ``embedding``) are listed beside the stream.

Two branches are labelled ``attn`` and ``mlp``, three ``attn``, ``cross_attn``, ``mlp``. With
``model.parallel_residual`` and only ``pre`` norms, the branches read the same stream and share one
add. Without blocks (or blocks without norms) the diagram is omitted.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from normaudit.engine.schema import Rule
from normaudit.render.sarif import first_sentence, source_path
from normaudit.render.escape import code, escape_cell, guard_lines
from normaudit.render.numerics_chart import markdown_lines
from normaudit.render.text import capture_failures, escaped_report, group_findings
from normaudit.report import SEVERITY_RANK, Block, Finding, Report, Site, SourceLocation

MAX_FINDING_ROWS = 200
MAX_SITE_ROWS = 400

_SEVERITY_LABEL = {"error": "error", "warning": "warning", "info": "info"}
_SEVERITY_ICON = {"error": "\U0001F534", "warning": "\U0001F7E0", "info": "\U0001F535"}


# ---------------------------------------------------------------------------------------------- text


def _plural(count: int, word: str, plural: Optional[str] = None) -> str:
    return f"{count} {word if count == 1 else (plural or word + 's')}"


def _location(source: Optional[SourceLocation]) -> str:
    if source is None or not source.file:
        return "—"
    path, _ = source_path(source.file)
    return code(f"{path}:{source.line}" if source.line else path)


def _placed(finding: Finding, report: Optional[Report], root: Path) -> str:
    """The location cell of a finding: its source, moved inside ``root`` as :func:`_findings_table` says; a
    finding without one (a whole-model finding) at the model's place (:func:`normaudit.report.locations.
    finding_anchor`: the class line), as concise, github and SARIF show it."""
    from normaudit.report.locations import anchor_in_root, outside_note

    if report is None:
        return _location(finding.source)
    shown, outside = anchor_in_root(finding, report, root)
    return _location(shown) + escape_cell(outside_note(outside))


def _module(module: str) -> str:
    return code(module) if module else "(root)"


def _target(report: Report) -> str:
    target = report.target
    path, _ = source_path(target.path)
    return f"{path}:{target.factory}" if target.factory else path


# ------------------------------------------------------------------------------------------- summary


def _summary(report: Report) -> list[str]:
    s = report.summary
    by_kind = dict(s.by_kind) or dict(Counter(site.kind for site in report.sites))
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])))
    findings = (f"**{_plural(s.errors, 'error')}**, **{_plural(s.warnings, 'warning')}**, "
                f"**{s.infos} info**")
    lines = [
        f"- **Findings:** {findings}",
        f"- **Sites:** {s.sites}" + (f" ({kinds})" if kinds else ""),
    ]
    model = report.model
    facts = [f"placement `{model.placement}`"]
    if model.parallel_residual:
        facts.append("parallel residual")
    if model.has_final_norm is not None:
        facts.append("final norm" if model.has_final_norm else "no final norm")
    if model.num_parameters:
        facts.append(f"{model.num_parameters:,} parameters")
    lines.append(f"- **Model:** {code(model.class_name)}, " + ", ".join(facts))

    capture = report.capture
    text = f"- **Capture:** `{capture.method}` ({'complete' if capture.complete else 'incomplete'}"
    failed = capture_failures(capture.attempts)  # each distinct failure once, its first line
    if failed:
        text += "; after " + ", ".join(
            ", ".join(f"`{m}`" for m in methods) + " failed" + (f": {escape_cell(reason)}" if reason else "")
            for methods, reason in failed)
    text += ")"
    if capture.inputs_assumed:
        text += f"; inputs assumed: {escape_cell(capture.inputs_assumed)}"
    lines.append(text)

    target = report.target
    extra = [f"dtype `{target.dtype}`"]
    if target.config:
        extra.append(f"config {code(source_path(target.config)[0])}")
    if target.checkpoint:
        extra.append(f"checkpoint {code(source_path(target.checkpoint)[0])}")
    if target.batch_size:
        extra.append(f"batch size {target.batch_size}")
    lines.append("- **Run:** " + ", ".join(extra))
    return lines


# ------------------------------------------------------------------------------------------ findings


def _findings_table(findings: list[Finding], report: Optional[Report] = None, root: Optional[Path] = None) -> list[str]:
    """One row per group of findings (:func:`normaudit.render.text.group_findings`: the same fault in many
    modules is one row naming them all, ``layers.0-17.ln`` (18 modules)). With ``report``, a place outside
    ``root`` (a library's file) is shown at the model's place inside it, as SARIF shows it, then
    ``(library: transformers/models/llama/modeling_llama.py:297)``."""
    from normaudit.report.locations import project_root

    root = Path(root) if root is not None else project_root()
    ordered = sorted(findings, key=lambda f: (-SEVERITY_RANK[f.severity], f.rule_id, f.module))
    groups = group_findings(ordered)
    lines = ["| Severity | Rule | Module | Message | Location |", "|---|---|---|---|---|"]
    for g in groups[:MAX_FINDING_ROWS]:
        f = g.first
        message = escape_cell(g.message)
        if g.fix:
            message += "<br>**Fix:** " + escape_cell(g.fix)
        module = _module(f.module) if len(g.findings) == 1 else f"{code(g.label)} ({len(g.findings)} modules)"
        lines.append(
            f"| {_SEVERITY_ICON[f.severity]} {_SEVERITY_LABEL[f.severity]} | `{f.rule_id}` {f.rule_name} "
            f"| {module} | {message} | {_placed(f, report, root)} |")
    if len(groups) > MAX_FINDING_ROWS:
        rest = sum(len(g.findings) for g in groups[MAX_FINDING_ROWS:])
        lines.append("")
        lines.append(f"…and {rest} more findings (see `--format json`).")
    return lines


def _rules_section(findings: list[Finding], rules: dict[str, Rule]) -> list[str]:
    hit = sorted({f.rule_id for f in findings if f.rule_id in rules})
    if not hit:
        return []
    lines = ["<details><summary>Rules that fired</summary>", ""]
    for rule_id in hit:
        rule = rules[rule_id]
        lines.append(f"- **`{rule.id}` {rule.name}** ({rule.category}): "
                     f"{escape_cell(first_sentence(rule.doc.what))} {escape_cell(first_sentence(rule.doc.why))}")
    lines += ["", "</details>"]
    return lines


# --------------------------------------------------------------------------------------------- sites


def _eps(site: Site) -> str:
    return "—" if site.eps is None else f"{site.eps:g}"


def _sites_section(sites: list[Site]) -> list[str]:
    lines = [f"<details><summary>Site inventory ({_plural(len(sites), 'site')})</summary>", ""]
    if not sites:
        return lines + ["No normalisation site found.", "", "</details>"]
    lines += ["| Module | Kind | Class | eps | Normalized axes | Placement | Source |",
              "|---|---|---|---|---|---|---|"]
    for site in sites[:MAX_SITE_ROWS]:
        module = _module(site.module)
        if site.call_index:
            module += f" (call {site.call_index + 1})"
        axes = ", ".join(site.normalized_axes) or "—"
        lines.append(f"| {module} | {site.kind} | {code(site.class_name)} | {_eps(site)} | {axes} "
                     f"| {site.placement} | {_location(site.source or site.definition)} |")
    if len(sites) > MAX_SITE_ROWS:
        lines += ["", f"…and {len(sites) - MAX_SITE_ROWS} more sites (see `--format json`)."]
    return lines + ["", "</details>"]


# ------------------------------------------------------------------------------------------- diagram


@dataclass
class _Branch:
    pre: list[str] = field(default_factory=list)
    qk: list[str] = field(default_factory=list)
    inner: list[str] = field(default_factory=list)
    post: list[str] = field(default_factory=list)


def _relative(block_path: str, module: str) -> str:
    if block_path and module.startswith(block_path + "."):
        return module[len(block_path) + 1:]
    return module or "(root)"


def block_signature(block: Block) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The grouping key of a block: its class name and its norms' roles by relative name, in order."""
    return block.class_name, tuple((_relative(block.path, m), p) for m, p in block.norms.items())


def group_blocks(blocks: list[Block]) -> list[list[Block]]:
    """Group blocks with the same :func:`block_signature`, in order of first appearance."""
    groups: dict[tuple, list[Block]] = {}
    for block in blocks:
        groups.setdefault(block_signature(block), []).append(block)
    return list(groups.values())


def _branches(norms: list[tuple[str, str]]) -> tuple[list[_Branch], list[tuple[str, str]]]:
    branches: list[_Branch] = []
    others: list[tuple[str, str]] = []

    def open_branch() -> _Branch:
        branches.append(_Branch())
        return branches[-1]

    for name, placement in norms:
        cur = branches[-1] if branches else None
        if placement == "pre":
            open_branch().pre.append(name)
        elif placement == "sandwich":
            if cur is not None and cur.pre and not cur.inner and not cur.post:
                cur.inner.append(name)
            else:
                open_branch().pre.append(name)
        elif placement == "post":
            if cur is None or cur.post:
                cur = open_branch()
            cur.post.append(name)
        elif placement == "qk":
            (cur if cur is not None and not cur.post else open_branch()).qk.append(name)
        else:
            others.append((name, placement))
    return branches, others


def _sublayer_names(branches: list[_Branch]) -> list[str]:
    n = len(branches)
    if n == 1:
        return ["attn" if branches[0].qk else "sublayer"]
    if n == 2:
        return ["attn", "mlp"]
    if n == 3:
        return ["attn", "cross_attn", "mlp"]
    return [f"sublayer{i + 1}" for i in range(n)]


def _label(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'


class _Diagram:
    """The Mermaid nodes of one block's subgraph: node ids prefixed per block, each node declared once, norm
    nodes labelled with their kind and placement and remembered for the ``norm`` class."""

    _SHAPES = {"box": ("[", "]"), "circle": ("((", "))"), "stadium": ("([", "])"), "round": ("(", ")")}

    def __init__(self, prefix: str, norms: list[tuple[str, str]], kind_of: dict[str, Optional[str]]):
        self.prefix, self.kind_of = prefix, kind_of
        self.nodes: dict[str, str] = {}
        self.norm_ids: list[str] = []
        self.order = {name: i for i, (name, _) in enumerate(norms)}
        self.placement_of = dict(norms)

    def node(self, key: str, shape: str, text: str, norm: bool = False) -> str:
        """The id of node ``key`` (declared with ``shape`` and ``text`` on first use)."""
        ident = self.prefix + key
        if ident not in self.nodes:
            open_, close = self._SHAPES[shape]
            self.nodes[ident] = f"    {ident}{open_}{_label(text)}{close}"
            if norm:
                self.norm_ids.append(ident)
        return ident

    def norm_node(self, name: str) -> str:
        """The id of the norm ``name`` (relative path), labelled with its kind and placement."""
        kind, placement = self.kind_of.get(name), self.placement_of[name]
        text = f"{name}<br/>{kind}, {placement}" if kind else f"{name}<br/>{placement}"
        return self.node(f"n{self.order[name]}", "box", text, norm=True)


def _parallel_edges(d: _Diagram, branches: list, stream: str, edges: list[str]) -> str:
    """Edges of a parallel block (attention and MLP read one normed stream, or each its own, into one
    add); returns the stream node after the block."""
    add = d.node("add1", "circle", "+")
    if len(branches) == 1:
        b = branches[0]
        head = [d.norm_node(n) for n in b.pre]
        attn = d.node("attn", "round", "attn")
        mlp = d.node("mlp", "round", "mlp")
        edges.append(" --> ".join([stream, *head, attn, add]))
        edges.append(" --> ".join([head[-1] if head else stream, mlp, add]))
        for q in b.qk:
            edges.append(f"{d.norm_node(q)} -.-> {attn}")
    else:
        for b, name in zip(branches, ("attn", "mlp")):
            sub = d.node(name, "round", name)
            edges.append(" --> ".join([stream, *[d.norm_node(n) for n in b.pre], sub, add]))
            for q in b.qk:
                edges.append(f"{d.norm_node(q)} -.-> {sub}")
    edges.append(f"{stream} --> {add}")
    return add


def _sequential_edges(d: _Diagram, branches: list, names: list[str], stream: str, edges: list[str]) -> str:
    """Edges of residual branches one after the other (pre norms, sublayer, inner norms, add, post norms);
    returns the stream node after the last."""
    for i, (b, name) in enumerate(zip(branches, names), start=1):
        sub = d.node(name, "round", name)
        add = d.node(f"add{i}", "circle", "+")
        pre = [d.norm_node(n) for n in b.pre]
        inner = [d.norm_node(n) for n in b.inner]
        edges.append(" --> ".join([stream, *pre, sub, *inner, add]))
        edges.append(f"{stream} --> {add}")
        for q in b.qk:
            edges.append(f"{d.norm_node(q)} -.-> {sub}")
        stream = add
        if b.post:
            post = [d.norm_node(n) for n in b.post]
            edges.append(" --> ".join([stream, *post]))
            stream = post[-1]
    return stream


def _block_diagram(index: int, group: list[Block], kinds: dict[str, str], parallel: bool) -> list[str]:
    """Mermaid lines (a ``subgraph``) for one group of identical blocks."""
    first = group[0]
    norms = [(_relative(first.path, m), p) for m, p in first.norms.items()]
    d = _Diagram(f"k{index}_", norms, {_relative(first.path, m): kinds.get(m) for m in first.norms})
    branches, others = _branches(norms)
    names = _sublayer_names(branches)

    title = first.class_name
    if len(group) > 1:
        title += f" x {len(group)} ({group[0].path} … {group[-1].path})"
    elif first.path:
        title += f" ({first.path})"
    lines = [f"  subgraph {d.prefix}block[{_label(title)}]", "    direction TB"]

    edges: list[str] = []
    stream = d.node("x", "stadium", "x")
    only_pre = all(not b.inner and not b.post for b in branches)
    if parallel and branches and only_pre and len(branches) <= 2:
        stream = _parallel_edges(d, branches, stream, edges)
    else:
        stream = _sequential_edges(d, branches, names, stream, edges)
    out = d.node("out", "stadium", "out")
    edges.append(f"{stream} --> {out}")
    for name, _ in others:
        d.norm_node(name)

    lines += list(d.nodes.values())
    lines += [f"    {edge}" for edge in edges]
    lines.append("  end")
    if d.norm_ids:
        lines.append(f"  class {','.join(d.norm_ids)} norm")
    return lines


def mermaid(report: Report) -> Optional[str]:
    """The Mermaid flowchart (without the code fence) of one block per kind.

    Returns None when ``report.model.blocks`` holds no block with a norm (the diagram is omitted).
    """
    groups = [group for group in group_blocks(report.model.blocks) if group[0].norms]
    if not groups:
        return None
    kinds: dict[str, str] = {}
    for site in report.sites:
        kinds.setdefault(site.module, site.kind)
    lines = ["flowchart TB", "  classDef norm fill:#fff3bf,stroke:#e67700,color:#000"]
    for index, group in enumerate(groups):
        lines += _block_diagram(index, group, kinds, report.model.parallel_residual)
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- render


def render(report: Report, rules: dict[str, Rule], options=None) -> str:
    """Render ``report`` as Markdown for a pull-request comment.

    ``rules`` maps rule id -> :class:`Rule`; the rules that fired are summarised from their docs.
    ``options`` is accepted for a uniform renderer signature. Every string of ``report`` is escaped first (:func:`normaudit.render.text.escape_control`: no control
    character or workflow command reaches the comment or a CI log). The output ends in a newline.
    """
    report = escaped_report(report)
    out = [f"## normaudit: {code(_target(report))}", ""]
    out += _summary(report)
    if report.notes:
        out.append("")
        out += [f"> {escape_cell(note)}" + ("  " if i < len(report.notes) - 1 else "")
                for i, note in enumerate(report.notes)]
    out += ["", "### Findings", ""]
    if report.findings:
        out += _findings_table(report.findings, report, getattr(options, "project_root", None))
        section = _rules_section(report.findings, rules)
        if section:
            out += [""] + section
    else:
        out.append("No findings.")
    out += ["", "### Normalisation sites", ""]
    out += _sites_section(report.sites)
    if report.numerics is not None:  # the chart and table of --probe numerics (normaudit.render.numerics_chart)
        out += markdown_lines(report, getattr(options, "numerics_chart", None))
    diagram = mermaid(report)
    if diagram is not None:
        out += ["", "### Block structure", "", "```mermaid", diagram, "```"]
    return guard_lines("\n".join(out)) + "\n"
