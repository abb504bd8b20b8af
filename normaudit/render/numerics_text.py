"""The ``numerics`` section of the text report (``--probe numerics``): the producer of the first non-finite
value, where the first NaN appears, and per norm site in depth order the statistic against eps and the output
against the dtype's maximum. Reads only :class:`normaudit.report.Report` (no torch)."""
from __future__ import annotations

from typing import Optional

from normaudit.report import ROOT_LABEL, Report


def _g(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3g}"


def _backward_summary(n) -> str:
    """The backward line: the loss, then the first module with a non-finite gradient and the parameters holding
    one, or that every gradient is finite."""
    if n.grad_first_nonfinite is None and not n.grad_nonfinite_param_count:
        return f"loss {_g(n.loss)}, no non-finite gradient"
    where = (f"first non-finite gradient at {n.grad_first_nonfinite or ROOT_LABEL}"
             if n.grad_first_nonfinite is not None else "no module output with a non-finite gradient")
    return f"loss {_g(n.loss)}, {where}, {n.grad_nonfinite_param_count} parameter(s) with non-finite gradients"


def numerics_lines(report: Report) -> list[str]:
    """Lines of the numerics section (empty when the probe did not run)."""
    n = report.numerics
    if n is None:
        return []
    weights = "checkpoint weights" if n.weights == "checkpoint" else "random initial weights"
    seed = f", seed {n.seed}" if n.seed is not None else ""
    lines = ["", f"numerics ({n.dtype}{' autocast' if n.autocast else ''} on {n.device}, {weights}{seed}, "
             f"{n.seconds:.2f} s" + (", with a backward" if n.backward else "") + "):"]
    if n.error:
        return lines + [f"  not measured: {n.error}"]
    if n.producer is None:
        lines.append("  no inf or NaN in the forward")
    else:
        p = n.producer
        lines.append(f"  first non-finite value: {p.module or ROOT_LABEL} ({p.class_name}): {p.cause}")
        if n.first_nan and n.first_nan != p.module:
            lines.append(f"  first NaN: {n.first_nan}")
        if n.propagator_count:
            more = f" (+{n.propagator_count - len(n.propagators)} more)" if n.propagator_count > len(n.propagators) else ""
            lines.append(f"  then passed on by {n.propagator_count} module(s): {', '.join(n.propagators[:6])}"
                         + (" ..." if len(n.propagators) > 6 else "") + more)
    if n.backward:
        lines.append(f"  backward: {_backward_summary(n)}")
    rows = [["module", "stat min / median / max", "rows < 10*eps", "out abs-max", "headroom", "bound", "role"]]
    for s in report.sites:
        m = s.numerics
        if m is None or not m.measured:
            continue
        frac = "-" if m.eps_dominated_fraction is None else f"{100 * m.eps_dominated_fraction:.0f}%"
        rows.append([s.module, f"{_g(m.stat_min)} / {_g(m.stat_median)} / {_g(m.stat_max)}", frac,
                     _g(m.output_absmax), _g(m.headroom), _g(m.output_bound), m.role or ""])
    if len(rows) > 1:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for k, r in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if k == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
    return lines
