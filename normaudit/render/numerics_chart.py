"""The numerics chart of the Markdown report (``--probe numerics`` with ``--format markdown``).

Per norm site in depth order (the order of ``report.sites``, measured sites only), two panels sharing the x axis:

- top, log scale: the input statistic eps is added to (variance, or mean square for RMSNorm), its min..max over the
  normalised rows as a vertical range with the median as a dot, against the site's eps (solid tick) and 10*eps
  (dashed tick; rows below it are eps-dominated, ``SiteNumerics.eps_dominated_below``);
- bottom, log scale: the output abs-max as a bar against the largest finite value of the dtype run in (a line).

A site whose input or output holds inf/NaN has no statistic: it gets a red ``x`` marker in both panels instead,
and the first such site (the ``producer`` or ``first_nan`` role of :class:`normaudit.report.SiteNumerics`, else
the first with a non-finite count) is shaded and labelled ``first non-finite: <module>``. Every per-site artist has
an SVG id (``stat-<i>``, ``out-<i>``, ``eps-<i>``, ``eps10-<i>``, ``first-nonfinite``), so tools and tests can find
them in the XML.

The SVG is made by matplotlib (the optional extra ``normaudit[plot]``), with the Agg-free SVG backend, text kept as
text (``svg.fonttype: none``), ids salted with a constant (``svg.hashsalt``) and no date in the metadata: the same
report gives the same bytes. Without matplotlib, :func:`chart_svg` raises ImportError and
:func:`markdown_lines` says in one line how to get the chart.

Embedding: GitHub strips ``data:`` image URIs and inline ``<svg>`` from rendered Markdown, so on GitHub the chart
must be a file beside the Markdown, linked relatively (:func:`chart_path` names it: ``report.md`` ->
``report.numerics.svg``; :func:`write_chart` writes it). Where no file is given, :func:`markdown_lines` embeds an
``<img src="data:image/svg+xml;base64,...">``, which VS Code, GitLab, Jupyter, pandoc and browsers render.
"""
from __future__ import annotations

import base64
import math
from pathlib import Path
from typing import Optional

from normaudit.render.escape import code, escape_cell
from normaudit.report import Report, Site

INSTALL_HINT = ("The numerics chart needs matplotlib: `pip install 'normaudit[plot]'`; the table below has the "
                "same numbers.")
#: the longest ``data:`` image inlined, in characters: GitHub caps a comment at 65,536 characters; a larger chart
#: is left to a file beside the Markdown (:func:`write_chart`)
MAX_INLINE_CHARS = 50_000
_RED = "#c92a2a"
_BLUE = "#1c7ed6"


def measured_sites(report: Report) -> list[Site]:
    """The sites with ``--probe numerics`` measurements, in depth (execution) order."""
    return [s for s in report.sites if s.numerics is not None and s.numerics.measured]


def first_nonfinite(sites: list[Site]) -> Optional[int]:
    """Index in ``sites`` of the first site where a non-finite value appears: the first with role ``producer`` or
    ``first_nan``, else the first whose input or output holds a NaN or inf; None when all are finite."""
    for i, s in enumerate(sites):
        if s.numerics.role in ("producer", "first_nan"):
            return i
    for i, s in enumerate(sites):
        counts = [t for t in (s.numerics.input, s.numerics.output) if t is not None]
        if any(t.nan or t.inf for t in counts):
            return i
    return None


def _label(site: Site) -> str:
    name = site.module or "(root)"
    return name + (f" (call {site.call_index + 1})" if site.call_index else "")


def _floor(sites: list[Site]) -> float:
    """A positive value below every finite positive value drawn in the top panel (a statistic of 0 sits there)."""
    values = [v for s in sites for v in (s.numerics.stat_min, s.numerics.stat_max, s.eps)
              if v is not None and v > 0 and math.isfinite(v)]
    return min(values) / 10 if values else 1e-12


def _stat_panel(ax, sites: list[Site]) -> None:
    floor = _floor(sites)
    top = max([s.numerics.stat_max for s in sites if s.numerics.stat_max and math.isfinite(s.numerics.stat_max)]
              + [10 * (s.eps or 0) for s in sites] + [floor * 10])
    for i, s in enumerate(sites):
        m = s.numerics
        if m.stat_min is None or m.stat_max is None:  # a non-finite input: no statistic
            ax.plot([i], [top], marker="x", color=_RED, markersize=8, linestyle="none", gid=f"stat-{i}")
        else:
            lo, mid, hi = (max(v, floor) for v in (m.stat_min, m.stat_median or m.stat_min, m.stat_max))
            ax.plot([i, i], [lo, hi], color=_BLUE, linewidth=3, solid_capstyle="butt", gid=f"stat-{i}")
            ax.plot([i], [mid], marker="o", color=_BLUE, markersize=4, linestyle="none")
        if s.eps:
            ax.hlines(s.eps, i - 0.4, i + 0.4, colors="black", linewidth=1.2, gid=f"eps-{i}")
            ax.hlines(10 * s.eps, i - 0.4, i + 0.4, colors="black", linestyles="dashed", linewidth=0.8,
                      gid=f"eps10-{i}")
    ax.set_yscale("log")
    ax.minorticks_off()  # minor log ticks are half the SVG's bytes
    ax.set_ylabel("input variance / mean square")
    ax.set_title("input statistic (min-max, dot = median) vs eps (solid) and 10*eps (dashed); x = inf/NaN", fontsize=9)


def _output_panel(ax, sites: list[Site]) -> None:
    dtype_max = next((s.numerics.dtype_max for s in sites if s.numerics.dtype_max), None)
    values = [s.numerics.output_absmax for s in sites]
    finite = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    floor = min(finite) / 10 if finite else 1e-3
    for i, v in enumerate(values):
        if v is None or not math.isfinite(v):
            ax.plot([i], [dtype_max or floor * 100], marker="x", color=_RED, markersize=8, linestyle="none",
                    gid=f"out-{i}")
        else:
            ax.bar([i], [max(v, floor) - floor], bottom=floor, width=0.6, color=_BLUE, gid=f"out-{i}")
    if dtype_max:
        ax.axhline(dtype_max, color=_RED, linestyle="dashed", linewidth=1, gid="dtype-max")
        ax.text(-0.5, dtype_max, f"dtype max {dtype_max:.4g}", ha="left", va="bottom", fontsize=8,
                color=_RED)
    ax.set_yscale("log")
    ax.minorticks_off()
    ax.set_ylabel("output abs-max")


def _figure(report: Report, sites: list[Site]):
    from matplotlib.figure import Figure

    n = len(sites)
    fig = Figure(figsize=(max(6.0, 0.3 * n + 2), 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    bad = first_nonfinite(sites)
    _stat_panel(top, sites)
    _output_panel(bottom, sites)
    labels = [_label(s) for s in sites]
    bottom.set_xticks(range(n), labels, rotation=90, fontsize=7)
    bottom.set_xlim(-0.6, n - 0.4)
    if bad is not None:
        for ax in (top, bottom):
            ax.axvspan(bad - 0.5, bad + 0.5, color=_RED, alpha=0.15, gid="first-nonfinite" if ax is top else None)
        top.text(bad, 0.5, f"first non-finite: {labels[bad]}", transform=top.get_xaxis_transform(),
                 ha="left" if bad < n / 2 else "right", va="center", fontsize=8, color=_RED,
                 bbox={"facecolor": "white", "edgecolor": _RED, "linewidth": 0.5})
        bottom.get_xticklabels()[bad].set_color(_RED)
    n_info = report.numerics
    if n_info is not None:
        fig.suptitle(f"normaudit numerics: {n_info.dtype} on {n_info.device}, "
                     f"{'checkpoint' if n_info.weights == 'checkpoint' else 'random'} weights", fontsize=10)
    return fig


def chart_svg(report: Report) -> Optional[str]:
    """The chart as SVG text, deterministic for a given report; None when no site was measured.

    Raises ImportError when matplotlib is not installed (``pip install 'normaudit[plot]'``).
    """
    import io

    import matplotlib

    sites = measured_sites(report)
    if not sites:
        return None
    with matplotlib.rc_context({"svg.hashsalt": "normaudit", "svg.fonttype": "none"}):
        fig = _figure(report, sites)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "normaudit (matplotlib)"})
    return buf.getvalue()


def chart_path(markdown_path: Path | str) -> Path:
    """Where the chart of ``markdown_path`` goes: beside it, ``report.md`` -> ``report.numerics.svg``."""
    path = Path(markdown_path)
    return path.with_name(path.stem + ".numerics.svg")


def write_chart(report: Report, markdown_path: Path | str) -> Optional[Path]:
    """Write the chart beside the Markdown file ``markdown_path`` (:func:`chart_path`); returns the path written,
    or None when there is nothing to draw or matplotlib is missing."""
    try:
        svg = chart_svg(report)
    except ImportError:
        return None
    if svg is None:
        return None
    out = chart_path(markdown_path)
    out.write_text(svg, encoding="utf-8")
    return out


def _g(v: Optional[float]) -> str:
    return "—" if v is None else f"{v:.3g}"


def _table(sites: list[Site], bad: Optional[int]) -> list[str]:
    lines = ["| Module | eps | stat min / median / max | rows < 10*eps | out abs-max | headroom | role |",
             "|---|---|---|---|---|---|---|"]
    for i, s in enumerate(sites):
        m = s.numerics
        frac = "—" if m.eps_dominated_fraction is None else f"{100 * m.eps_dominated_fraction:.0f}%"
        module = code(_label(s)) + (" **first non-finite**" if i == bad else "")
        lines.append(f"| {module} | {_g(s.eps)} | {_g(m.stat_min)} / {_g(m.stat_median)} / {_g(m.stat_max)} "
                     f"| {frac} | {_g(m.output_absmax)} | {_g(m.headroom)} | {m.role or ''} |")
    return lines


def markdown_lines(report: Report, chart_file: Optional[str] = None) -> list[str]:
    """The ``### Numerics`` section: the chart, then the per-site table; empty without a numerics run.

    ``chart_file``: the chart's file name relative to the Markdown (written by :func:`write_chart`), linked as an
    image (what renders on GitHub); None embeds the SVG as a base64 ``data:`` image (up to
    :data:`MAX_INLINE_CHARS`, else one line says so). Without matplotlib one line
    (:data:`INSTALL_HINT`) says how to get the chart, and the table stays.
    """
    n = report.numerics
    if n is None:
        return []
    lines = ["", "### Numerics", ""]
    if n.error:
        return lines + [f"Not measured: {escape_cell(n.error)}"]
    if n.producer is not None:
        lines += [f"First non-finite value produced by {code(n.producer.module or '(root)')}: "
                  f"{escape_cell(n.producer.cause or '')}", ""]
    sites = measured_sites(report)
    if not sites:
        return lines + ["No norm site was measured."]
    if chart_file:
        lines += [f"![numerics per norm site]({chart_file})", ""]
    else:
        try:
            svg = chart_svg(report)
        except ImportError:
            lines += [INSTALL_HINT, ""]
        else:
            data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
            if len(data) > MAX_INLINE_CHARS:
                lines += [f"The numerics chart ({len(data):,} characters) is too large to inline; write it beside "
                          "the Markdown with `normaudit.render.numerics_chart.write_chart` and link it.", ""]
            else:
                lines += [f'<img alt="numerics per norm site" src="data:image/svg+xml;base64,{data}">', ""]
    return lines + _table(sites, first_nonfinite(sites))
