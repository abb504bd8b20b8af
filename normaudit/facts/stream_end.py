"""Where a pre-LN residual stream leaves its stack un-normalised: the model-level fact
:class:`normaudit.report.StreamEnd` (``model.stream_end``) that NP101 reads.

In a pre-LN Transformer (Xiong et al. 2020, arXiv 2002.04745) every block computes ``x + f(norm(x))``, so only
the branches see normalised inputs and the stream itself is a growing sum of every block's output; the stack is
closed by a final norm before the head. The placement pass marks the norms in the branch of a stack's last
residual add whose stream reaches the output (or the module it reaches) with no norm between
(``site.stream``: ``unnormed_stream_end``, ``stream_end_conv``, ``stack_blocks``). Of those, the ones that read
the stream at their block's input (``branch_position`` ``input``: a norm placed deeper inside the branch,
ConvNeXt style, does not make a pre-LN stack) in a stack of more than one block (a single transformer block
nested in a U-Net, closed by a projection, has no depth for the stream to grow with) stand for the stream's
end; the last of them is the fact's site.
"""
from __future__ import annotations

from typing import Any, Optional

from normaudit.report import ModelFacts, Site, StreamEnd


def stream_end(sites: list[Site], model: ModelFacts) -> Optional[StreamEnd]:
    """The :class:`~normaudit.report.StreamEnd` of a model's ``sites`` and facts (module docstring), or None
    when no pre-LN norm reads a stream that leaves un-normalised.

        >>> from normaudit.report import Site
        >>> s = Site(module="layers.1.ln1", kind="LayerNorm", class_name="LayerNorm", detected_by="module",
        ...          placement="pre", block="layers.1",
        ...          stream={"unnormed_stream_end": "lm_head", "branch_position": "input", "stack_blocks": 2})
        >>> stream_end([s], ModelFacts(class_name="GPT"))
        StreamEnd(module='layers.1.ln1', block='layers.1', consumer='lm_head', output_conv=False, unused_norm=None)
    """
    ends = [s for s in sites if s.stream.unnormed_stream_end is not None and s.placement == "pre"
            and s.stream.branch_position == "input" and (s.stream.stack_blocks or 0) != 1]
    if not ends:
        return None
    last = ends[-1]
    consumer = last.stream.unnormed_stream_end
    outside = [u for u in model.unused_norms if not any(u.module.startswith(b.path + ".") for b in model.blocks)]
    return StreamEnd(module=last.module, block=last.block, consumer=None if consumer == "output" else consumer,
                     output_conv=last.stream.stream_end_conv,
                     unused_norm=outside[-1].module if outside else None)


def run(ctx: Any, facts: Any) -> None:
    """Pass ``stream-end``: ``model.stream_end`` over every site of the whole model (after the carry-over of
    depth-independent capture: the stack sizes are the whole stacks')."""
    facts.model.stream_end = stream_end([r.site for r in facts.records], facts.model)
