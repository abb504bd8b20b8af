"""Dynamic probes: analyses that *run the model* (the static facts, :mod:`normaudit.facts`, only read the
captured graph).

- :mod:`normaudit.probes.size`: re-run on fake tensors with the spatial/sequence axes resized (``--probe size``).
- :mod:`normaudit.probes.batch`: a small real copy in train mode, is each example normalised alone (``--probe batch``).
- :mod:`normaudit.probes.formula`: one norm module alone on crafted rows, which reference formula
  (:mod:`normaudit.probes.reference`) it computes, and its half-precision behaviour.
- :mod:`normaudit.probes.common`: shared helpers (a real copy of a meta model, calling a model on its inputs).
"""
from __future__ import annotations

from typing import Any


def run(ctx: Any, records: list, env: dict) -> list[str]:
    """Run the probes ``ctx.options`` asks for (``probes``: ``size`` forces the size probe, ``batch`` runs the
    batch probe); the size probe also runs by default on graphs of up to :data:`normaudit.probes.size.SIZE_PROBE_MAX_NODES` nodes.
    Returns notes for the report."""
    from normaudit.probes import batch, size

    cap = ctx.cap
    if cap.gm is None or not records:
        return []
    probes = list((ctx.options or {}).get("probes") or [])
    notes: list[str] = []
    n_nodes = len(cap.gm.graph.nodes)
    if "size" in probes or n_nodes <= size.SIZE_PROBE_MAX_NODES:
        notes += size.size_probe(ctx, records)
    else:
        notes.append(f"size probe skipped: the graph has {n_nodes} nodes (default limit {size.SIZE_PROBE_MAX_NODES}); "
                     f"'--probe size' runs it")
    if "batch" in probes:
        notes += batch.batch_probe(ctx, records, env)
    return notes
