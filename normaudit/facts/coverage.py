"""What an audit without a whole-model graph did not check: ``model.partial_capture``.

When neither symbolic tracing nor ``torch.export`` captures the whole model, the norms come from submodules
captured alone (:mod:`normaudit.capture.parts`) or from walking ``named_modules()``. Every per-site fact read
off a part's graph is still computed, but the checks that need the whole forward are not:

- the final norm and the end of the residual stream (NP101): no part holds the stream from the embedding to
  the output, so ``model.has_final_norm`` stays None;
- norms registered but never applied (NP107): only the whole forward tells a skipped norm from one the
  example inputs never reach;
- the size probe (NL105, and the size evidence NL101-NL103 and NB102 read) and, when asked for, the batch
  probe (NL106, NB108): both re-run the whole model's graph;
- the placement of the norms whose residual stream no capture held (NP102-NP106, NP109): those found by the
  walk, and those in a part without a residual add (a part that is one norm module or one attention), whose
  ``placement`` reads ``none`` or ``unknown`` for want of a stream, not because they are off it.

:func:`partial_capture` lists them, with the error that stopped the whole-model capture.
"""
from __future__ import annotations

from typing import Any, Optional

from normaudit.capture.parts import covers_all
from normaudit.facts.context import FactContext, Facts
from normaudit.report import PartialCapture, UncheckedCheck

__all__ = ["partial_capture", "run"]

#: the longest capture error kept in the fact (its first line)
MAX_REASON = 160


def _reason(attempts: list) -> Optional[str]:
    """The first line of the first failed attempt's error, shortened to :data:`MAX_REASON` characters."""
    err = next((a.error for a in attempts if not a.ok and a.error), None)
    if not err:
        return None
    line = err.strip().splitlines()[0] if err.strip() else err
    return line if len(line) <= MAX_REASON else line[:MAX_REASON - 3] + "..."


def _holds_residual(part: Any) -> bool:
    """Whether the placement pass found a residual add in ``part``'s graph (it marks each add's node)."""
    gm = getattr(part.capture, "gm", None)
    return gm is not None and any("residual" in n.meta.get("normaudit", {}) for n in gm.graph.nodes)


def partial_capture(cap: Any, records: list, probes: list[str]) -> Optional[PartialCapture]:
    """The checks not run on ``cap`` (a :class:`normaudit.capture.Capture` with no whole-model graph) and the
    sites whose placement no capture saw; None when the whole model was captured (``cap.gm``)."""
    if cap.gm is not None:
        return None
    method = "parts" if covers_all(cap) else "module_walk"  # as the report's ``capture.method`` says
    streamless = {p.path for p in cap.parts if not _holds_residual(p)}
    unplaced = [r.site.module for r in records
                if r.site.detected_by == "module_walk" or r.site.captured_part in streamless]
    checks = [
        UncheckedCheck(name="final norm", rules=["NP101"],
                       why="no captured part holds the residual stream from the embedding to the output"),
        UncheckedCheck(name="norms never applied", rules=["NP107"],
                       why="only the whole forward tells a skipped norm from one the inputs never reach"),
        UncheckedCheck(name="size probe", rules=["NL105"], why="it re-runs the whole model's graph"),
    ]
    if "batch" in probes:
        checks.append(UncheckedCheck(name="batch probe", rules=["NL106", "NB108"],
                                     why="it re-runs the whole model's graph"))
    if unplaced:
        checks.append(UncheckedCheck(
            name=f"placement of {len(dict.fromkeys(unplaced))} norm(s)",
            rules=["NP102", "NP103", "NP104", "NP105", "NP106", "NP109"],
            why="no capture held their residual stream (found by walking the modules, or alone in a part "
                "without a residual add), so their placement reads none or unknown"))
    return PartialCapture(method=method, reason=_reason(cap.attempts), parts=len(cap.parts), checks=checks,
                          unplaced=list(dict.fromkeys(unplaced)), sites=len(records))


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``coverage``: ``model.partial_capture`` (:func:`partial_capture`)."""
    facts.model.partial_capture = partial_capture(ctx.cap, facts.records, list(ctx.probes or []))
