"""One norm module applied at two places of one residual block: ``StreamFacts.reapplied_of``.

A block written ``x = x + att(self.norm(x)); x = x + ff(self.norm(x))`` (pre-LN) or
``x = self.norm(x + att(x)); x = self.norm(x + ff(x))`` (post-LN) computes with one set of norm parameters
where the intended model has two, so a checkpoint of that model does not load (its second norm's keys are
unexpected) and a model trained so shares one gain between two sublayers (public reports: allenai/OLMo #222,
bentrevett/pytorch-seq2seq PR #100, ml-explore/mlx #1636).

A later call of a norm module is *reapplied* when, in the same block (``site.block``), it has the same stream
role as an earlier call of the same module (both ``pre``, or both ``post``), its input descends from that
call's output (it normalises a later point of the stream, not the same tensor) and it is called from another
line of code. What this leaves out, on purpose:

- a parallel residual (GPT-J, Falcon, Command-R): one call whose output feeds both branches; a second call on
  the same tensor computes the same values;
- a norm reused across time steps or loop iterations (LN-LSTM, ALBERT's layer shared across depth, a
  recurrent block): every call comes from the same line;
- one norm shared by two parallel streams of a block (Pegasus-X's local and global tokens): the second input
  does not descend from the first output;
- q/k norms and norms inside a branch (placement ``qk``, ``sandwich``), whose reuse is a design (Llama 4's one
  ``qk_norm`` for queries and keys), and a norm whose calls take different roles (Gemma 3n's AltUp router norm).
"""
from __future__ import annotations

from normaudit.facts.placement.graph import StreamGraph
from normaudit.facts.placement.records import SiteInfo, site_key

#: the stream roles in which a second call of one module is a second norm of the block
_STREAM_ROLES = ("pre", "post")


def _reusable(info: SiteInfo) -> bool:
    s = info.rec.site
    return (s.detected_by in ("module", "pattern") and not s.inline and s.block is not None
            and info.inp is not None and info.out is not None and s.call is not None
            and info.placement in _STREAM_ROLES)


def mark_reapplied(g: StreamGraph, infos: list[SiteInfo]) -> None:
    """Set ``site.stream.reapplied_of`` on every later call of a norm module that is reapplied (module doc) to
    the key of the earliest such earlier call (:func:`normaudit.facts.placement.records.site_key`,
    ``blocks.0.norm``)."""
    seen: dict[tuple[str, str], list[SiteInfo]] = {}
    for info in infos:
        if not _reusable(info):
            continue
        s = info.rec.site
        earlier = seen.setdefault((s.module, s.block or ""), [])
        for first in earlier:
            f = first.rec.site
            if (first.placement == info.placement and (f.call.file, f.call.line) != (s.call.file, s.call.line)
                    and g.is_anc(first.out, info.inp)):
                s.stream.reapplied_of = site_key(first)
                break
        earlier.append(info)
