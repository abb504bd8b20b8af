"""The axis labels of a tensor dim normaudit speaks of (``normaudit.report.AxisLabel``: ``batch``, ``sequence``,
``height``, ``width``, ``depth``, ``channel``, ``feature``, ``head``, ``unknown``), the letters ``--input-axes``
takes for them, and the parser of an ``--input-axes`` spec. Imports no torch: the command line checks the flag
before it knows whether any target is audited."""
from __future__ import annotations

#: ``--input-axes`` letters: B/N batch, S/T/L sequence, H height, W width, D depth, C channel, F/E feature, K head
AXIS_LETTERS = {"B": "batch", "N": "batch", "S": "sequence", "T": "sequence", "L": "sequence", "H": "height",
                "W": "width", "D": "depth", "C": "channel", "F": "feature", "E": "feature", "K": "head"}
#: every axis label, in the order of ``normaudit.report.AxisLabel``
AXIS_LABELS = ("batch", "sequence", "height", "width", "depth", "channel", "feature", "head", "unknown")


def parse_axis_spec(spec: str) -> list[str]:
    """The axis labels of an ``--input-axes`` spec (``"B,C,H,W"`` or ``"batch,channel,height,width"``), one per
    dim of the model's first input, without torch: the command line checks the flag and the settings' key
    before it knows whether any target must be audited (a run answered from the cache imports no torch).
    Raises ValueError naming the unknown axis, or for an empty spec or an empty axis (``"B,,C"``)."""
    if not spec.strip():
        raise ValueError("no axes given; give one axis per dim of the model's first input, e.g. B,C,H,W")
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty axis in {spec!r}; give one axis per dim, e.g. B,C,H,W")
        name = AXIS_LETTERS.get(part.upper(), part.lower()) if len(part) == 1 else part.lower()
        if name not in AXIS_LABELS:
            raise ValueError(f"unknown axis {part!r}; use one of B,S,C,H,W,D,F or {', '.join(AXIS_LABELS)}")
        out.append(name)
    return out
