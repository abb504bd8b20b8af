"""The declared pass list (normaudit.pipeline.PASSES) is consistent: names unique, stages in running order,
and every fact a pass reads is written by a pass before it or is part of the context, so a pass moved before
the one it depends on fails here instead of silently reading nothing."""
from __future__ import annotations

from normaudit.pipeline.passes import CONTEXT, PASSES, STAGES


def _covered(read: str, written: set[str]) -> bool:
    """A read is covered by a write of it or of a field above it (``site.stream`` covers
    ``site.stream.inplace_alias``), or of one below it (a pass writing ``site.stream.inplace_alias`` and another
    ``site.stream`` together make ``site.stream``)."""
    return any(read == w or read.startswith(w + ".") or w.startswith(read + ".") for w in written)


def test_names_are_unique_and_stages_run_in_order():
    names = [p.name for p in PASSES]
    assert len(names) == len(set(names))
    order = [STAGES.index(p.stage) for p in PASSES]
    assert order == sorted(order)


def test_every_read_is_written_before_or_given():
    written: set[str] = set(CONTEXT)
    missing = []
    for p in PASSES:
        for read in p.reads:
            if not _covered(read, written):
                missing.append((p.name, read))
        written |= set(p.writes)
    assert missing == []


def test_site_facts_come_from_the_records():
    """``records`` (site discovery) is written before any pass reads a site field."""
    first_records = next(i for i, p in enumerate(PASSES) if "records" in p.writes)
    assert all(not any(r.startswith("site.") or r == "records" for r in p.reads) for p in PASSES[:first_records])
