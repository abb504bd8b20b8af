"""The end of each stack's residual stream. The last residual add of a stack is normalised when it reaches
a norm on the stream through casts, views, slicing, token gathers, pooling, scalings by a constant, at most
one linear projection, or an attention pooling head whose query does not read the stream. Where it is not,
the norms in that add's branch get ``unnormed_stream_end`` in ``Site.stream`` (the module the stream reaches
un-normalised, or ``output``), ``stack_blocks`` (how many blocks the stack has) and ``stream_end_conv`` when
that module is a convolution computing the model output from the stream (a signal decoder's output conv:
audio or image synthesis, not logits).

Over the whole model, :func:`find_stream_end` turns those marks into the model-level fact ``model.stream_end``
(:class:`normaudit.report.StreamEnd`) that NP101 reads: in a pre-LN Transformer (Xiong et al. 2020, arXiv
2002.04745) every block computes ``x + f(norm(x))``, so only the branches see normalised inputs and the
stream itself is a growing sum of every block's output, closed by a final norm before the head. Of the marked
norms, those that read the stream at their block's input (``branch_position`` ``input``: a norm deeper inside
the branch, ConvNeXt style, does not make a pre-LN stack) in a stack of more than one block (a single block
nested in a U-Net, closed by a projection, has no depth for the stream to grow with) stand for the stream's
end; the last of them is the fact's site."""
from __future__ import annotations

from typing import Optional

from torch import fx, nn

from normaudit.facts.context import FactContext, Facts
from normaudit.facts.placement.blocks import is_inside, stack_size
from normaudit.facts.placement.graph import POOL_OPS, StreamGraph, is_pool_module
from normaudit.facts.placement.records import ResidualAdd, SiteInfo, norms_by_branch
from normaudit.facts.placement.residual import stream_reach
from normaudit.facts.placement.scores import feeds_softmax
from normaudit.report import Block, ModelFacts, Site, StreamEnd
from normaudit.vocabulary.graph import op_name, owner


def stream_ends_normed(g: StreamGraph, adds: list[ResidualAdd], residual: dict[fx.Node, ResidualAdd],
                       infos: list[SiteInfo], blocks: list[Block]) -> bool:
    """Whether the last residual add of every stack reaches a norm on the stream (:func:`_normed_later`). On
    the norms in the branch of one that does not: ``unnormed_stream_end`` (:func:`_consumer`),
    ``stream_end_conv`` and ``stack_blocks`` (module docstring)."""
    stream_norm_inputs = {i.inp for i in infos if i.placement in ("final", "post", "embedding") and i.inp is not None}
    branch_norms = norms_by_branch(infos)
    ends_normed = True
    for a in adds:
        if not a.node.users and a.node.op == "call_method" and str(a.node.target).endswith("_"):
            continue  # x.add_(f(x)) under symbolic tracing: fx does not see the mutation flow on
        if not (g.desc[g.idx[a.node]] & g.output_mask):
            continue  # a second stream left unused after the loop (dead code under symbolic tracing)
        if stream_reach(g, a.node, residual) or _normed_later(g, a.node, stream_norm_inputs):
            continue
        ends_normed = False
        consumer = _consumer(g, a.node)
        conv_head = _is_conv_module(g.modules.get(consumer)) and bool(g.desc[g.idx[a.node]] & g.output_mask)
        for info in branch_norms.get(a.node, []):
            info.rec.site.stream.unnormed_stream_end = consumer
            if conv_head:
                info.rec.site.stream.stream_end_conv = True
            info.rec.site.stream.stack_blocks = stack_size(blocks, info.block)
    return ends_normed


def _consumer(g: StreamGraph, node: fx.Node) -> str:
    """What first uses a stream value, seen through casts and views: a module path or ``output``."""
    todo, seen = [node], 0
    home = owner(node, g.modules)
    while todo and seen < 64:
        n = todo.pop(0)
        seen += 1
        for u in n.users:
            name = op_name(u)
            if u.op == "output":
                return "output"
            if g.is_alias(u) or name == "getitem" or "assert" in name:
                todo.append(u)
                continue
            path = owner(u, g.modules)
            mod = g.modules.get(path) if path else None
            if path and not is_inside(home, path) and not (mod is not None and not g.is_weighted(u) and not any(
                    True for _ in mod.parameters())):  # passing through a drop path / Identity is no consumer
                return path
            todo.append(u)
    return "output"


def _is_conv_module(mod: Optional[nn.Module]) -> bool:
    """``mod`` is a torch convolution (``nn.Conv1d/2d/3d``, transposed ones) or a wrapper holding one as its
    only weighted layer (a causal-padding ``Conv1d`` wrapper)."""
    if mod is None:
        return False
    weighted = [m for m in mod.modules() if any(True for _ in m.parameters(recurse=False))]
    return bool(weighted) and all(isinstance(m, nn.modules.conv._ConvNd) for m in weighted)


def _normed_later(g: StreamGraph, node: fx.Node, norm_inputs: set[fx.Node]) -> bool:
    """``node`` reaches a stream norm's input through casts, views, slicing, token gathers (``x[order]`` under export
    is ``index``: MuseSpark's vision tower undoes its window order before ``ln_post``), pooling (functional or a pooling
    / ``nn.Flatten`` module), scalings by a constant (diffusers' ``(x + h) / output_scale_factor``) and at
    most one linear projection (a conv or linear layer: a SAM/ViTDet neck ``conv1 -> LayerNorm2d`` normalises
    the projected stream)."""
    todo, seen = [(node, False)], 0
    while todo and seen < 64:
        n, projected = todo.pop()
        seen += 1
        if n in norm_inputs:
            return True
        for u in n.users:
            name = op_name(u)
            mod = g.modules.get(str(u.target)) if u.op == "call_module" else None
            scaling = name in ("mul", "div") and all(a in g.const for a in g.inputs[u] if a is not n)
            if (g.is_alias(u) or name in POOL_OPS or scaling or is_pool_module(mod) or isinstance(mod, nn.Flatten) or
                    name in ("getitem", "select", "slice", "index", "index_select", "type_as", "mean", "amax",
                             "adaptive_avg_pool1d", "cat")):
                todo.append((u, projected))
            elif not projected and g.is_weighted(u) and (name in ("linear", "conv") or isinstance(
                    mod, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))):
                todo.append((u, True))
            elif _attention_pool(g, u, n, node):
                todo.append((u, False))  # pooled tokens: their output projection may come next
    return False


def _attention_pool(g: StreamGraph, attn: fx.Node, src: fx.Node, stream: fx.Node) -> bool:
    """``attn`` pools the ``stream`` over its tokens with attention: ``src`` (the stream's key or value
    projection, seen through views) is its key or value and the query does not depend on the stream (a
    learned probe: VideoPrism's and SigLIP's attention pooling heads, Set Transformer's PMA, Lee et al.
    2019, arXiv 1810.00825), so the output has the probe's tokens, not the stream's: the sequence axis is
    reduced, as by a mean. ``sdpa(q, k, v)``, or the eager ``softmax(q @ k^T) @ v`` reached from ``v``
    (the scores reached from ``k`` go on only through ``v``'s product)."""
    name = op_name(attn)
    if name == "sdpa":
        q = attn.args[0] if attn.args else None
        return isinstance(q, fx.Node) and src in attn.args[1:3] and not g.anc_or_eq(stream, q)
    if name not in ("matmul", "bmm", "einsum") or g.is_weighted(attn):
        return False
    acts = [a for a in g.inputs[attn] if a not in g.pderived and a not in g.const]
    if len(acts) != 2 or src not in acts:
        return False
    probs = acts[1] if acts[0] is src else acts[0]
    node = probs
    for _ in range(12):  # back from the attention map through softmax, scaling, masks, dropout to the scores
        if op_name(node) in ("matmul", "bmm", "einsum") and len(g.inputs[node]) == 2:  # q @ k^T (q may be a
            # parameter's projection: a constant of the graph)
            return feeds_softmax(g, node) and not all(g.anc_or_eq(stream, a) for a in g.inputs[node])
        ins = [a for a in g.inputs[node] if a not in g.pderived and a not in g.const]
        if len(ins) != 1:
            return False
        node = ins[0]
    return False


def find_stream_end(sites: list[Site], model: ModelFacts) -> Optional[StreamEnd]:
    """The :class:`~normaudit.report.StreamEnd` of a model's ``sites`` and facts (module docstring), or None
    when no pre-LN norm reads a stream that leaves un-normalised.

        >>> from normaudit.report import Site
        >>> s = Site(module="layers.1.ln1", kind="LayerNorm", class_name="LayerNorm", detected_by="module",
        ...          placement="pre", block="layers.1",
        ...          stream={"unnormed_stream_end": "lm_head", "branch_position": "input", "stack_blocks": 2})
        >>> find_stream_end([s], ModelFacts(class_name="GPT"))
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


def run_stream_end(ctx: FactContext, facts: Facts) -> None:
    """Pass ``stream-end``: ``model.stream_end`` over every site of the whole model (after the carry-over of
    depth-independent capture: the stack sizes are the whole stacks')."""
    facts.model.stream_end = find_stream_end([r.site for r in facts.records], facts.model)
