"""Placement of each norm on the residual stream (pre-LN, post-LN, sandwich, final, ...).

Pre-LN vs post-LN is a Transformer design choice, not part of the LayerNorm paper: post-LN in
Vaswani et al. 2017 ("Attention Is All You Need", arXiv 1706.03762, ``LayerNorm(x + Sublayer(x))``),
pre-LN analysed by Xiong et al. 2020 (arXiv 2002.04745, ``x + Sublayer(LayerNorm(x))`` plus a final
LayerNorm), depth and warm-up of post-LN by Liu et al. 2020 (arXiv 2004.08249). Sandwich norms (a norm on
the branch output before the add) follow Ding et al. 2021 (CogView, arXiv 2105.13290) and Gemma 2;
query/key norms Dehghani et al. 2023 (arXiv 2302.05442).

The pass reads the canonical IR (:mod:`normaudit.vocabulary.graph`), so symbolically traced graphs
(``call_module`` nodes, ``get_attr`` parameters) and exported aten graphs (parameters as ``p_*``
placeholders, ``nn_module_stack`` on every node) give the same answer.

1. **Residual adds.** ``add(a, b)`` (same shape on both sides and the result) is residual when ``b`` (the
   branch) is computed from ``a`` (the skip, seen through casts, dropout, clones, views and overflow
   guards such as T5's float16 ``clamp``) through at
   least one *weighted* op (a linear/conv/embedding/matmul with a parameter, a ``call_module`` with
   parameters) that is not part of a norm. The branch may read an earlier value of the stream than the one
   it is added to (``x + attn(ln1(x)) + mlp(ln2(x))``): the skip's chain of residual adds is searched.
   A skip that is itself ``[norm](W(x))`` with a single weighted op ``W`` (a projection shortcut,
   ResNet downsampling; an elementwise gain such as RWKV's time mix ``x * mu`` is no projection), seen through poolings before or after ``W`` (ResNet-D, Hiera/SAM2's pooled
   ``proj(norm1(x))``, also as ``view`` + ``amax``), also counts; the shortcut is then a second branch. A
   pooled identity ``pool(x)`` is the skip ``x``. A sum of parallel one-layer branches of one input
   (``[norm](W_i(x))``, ``[norm](x)``: RepVGG/MobileOne) is no residual add. A branch without weights counts
   when a parameter-free mixing op (a Fourier transform, a pooling) computes it from the skip (FNet's
   ``LayerNorm(x + fft(x).real)``). An add whose branch reads the skip only across residual adds already
   found is a long skip, not the stream (a position bias or value embedding shared by every layer, an
   outer ``x0 + s * LN(h)`` around the stack, U-Net/FPN skips).
   The add is *parallel* (GPT-J, GPT-NeoX ``use_parallel_residual``, Falcon ``parallel_attn``) when its
   branch is a sum of weighted terms that read the same stream value, or when it reads an earlier stream
   value than its skip.
2. **Site placement** (``Site.placement``), in this order:
   ``none`` for every norm of a model without residual adds;
   ``qk``: the norm's output reaches attention scores (``scaled_dot_product_attention`` or an
   activation-activation ``matmul`` that feeds a softmax; contrastive logits do not) as tensor data without
   any weighted op in between (its ``.shape``
   sizing the q/k views of a projection does not count: that is the block input, ``pre``);
   ``sandwich``: the norm lies inside a residual branch and its output *is* the branch (up to casts,
   dropout, views, drop-path, layer-scale); ``pre``: inside a residual branch otherwise
   (``branch_position`` ``input`` when it reads the stream value the branch reads, ``inner`` when deeper,
   e.g. ConvNeXt, ResNet);
   a norm on the stream whose output is the skip of the next residual add: ``post`` inside a repeated
   block or after a residual add, ``embedding`` before the first residual add outside any block, or when
   it starts a stream (it ends a non-residual block, or a projection re-embeds the stream it starts);
   ``embedding`` when its output reaches later residual adds only through a projection (patch
   embedding, Swin patch merging);
   after the last residual add: ``post`` when it reads that add directly and no norm sits in that add's
   branch (``LayerNorm(x + f(x))``), ``final`` otherwise; ``none`` when no residual add is around it.
3. **Model facts**: ``placement`` from the roles of the block norms (``pre``; ``post``; ``sandwich`` when
   branch-output norms appear without post norms and some norm reads a branch's input, ``post`` when
   branch-output norms close branches whose input no norm reads: res-post-norm, Liu et al. 2022, Swin V2,
   arXiv 2111.09883, and a post-activation ResNet's ``x + BN(conv(...))``, He et al. 2016); ``mixed`` for pre with post, or when blocks of one class
   disagree; ``none`` without residual adds; ``unknown``), ``parallel_residual``, ``has_final_norm``
   (every stack's last residual add reaches a norm, through at most one linear projection or an
   attention pooling head whose query does not read the stream, and one of them is ``final``), ``num_residual_adds`` and
   ``blocks``: the innermost numbered child of a ModuleList/Sequential of same-class modules that owns a
   residual add and a weighted op of its branch (``layers.0``, ``encoder.block.1``), with each norm's role.

Per-site facts in ``Site.extra`` (present only when they apply): ``branch_position``; ``skip_from_norm``
(the norm reads the residual stream -- a residual add, a model input, an embedding lookup -- and its
output is the skip of a residual add of its own block although the norm does not close a sublayer of that
block: ``x = norm(x); x = x + f(x)``, unless that add is itself closed by a ``post`` norm,
``x = ln(x + f(x))``, as in any post-LN stack, blocks as submodules or not; a norm ending a non-residual
block, conv -> BN of a stride-2 block or a patch embedding, starts a new stream instead, as does one whose
stream ends in a projection that re-embeds it, gcvit's downsampler, and an embedding norm inside the first
block, RWKV's ``blocks.0.pre_ln``); ``no_identity_lost`` (with ``skip_from_norm``: the stream it overwrites
has no identity path to lose, being already a norm's output or read by no ``pre`` norm of a branch input:
normalised at every block, as in post-LN; :func:`_cuts_identity`); ``contracted_by_scores`` (a q/k norm
reducing the dims its scores contract: head_dim, or the tokens of cross-covariance attention); ``feeds_norm`` / ``reads_norm`` (the module of a
norm that is the only consumer of / the only input to this one, with nothing but casts and views
between); ``majority_placement`` and ``majority_blocks`` (the role of the same norm in a strict majority of the
blocks of the same class, when this one differs; ``post``, ``final`` and ``embedding`` are one role, the
stream norm, which the first and last blocks of a stack see differently); ``unnormed_stream_end`` (and
``stack_blocks``, how many blocks its stack has) on the norms in the branch of a stack's last residual add
when that add reaches the output without a norm (the module it reaches, or ``output``), with
``stream_end_conv`` when that module is a convolution computing the model output from the stream (a signal
decoder's output conv: audio or image synthesis, not logits). Residual adds are marked in ``node.meta["normaudit"]["residual"]``.

Example::

    >>> import torch
    >>> from torch import nn
    >>> from normaudit.capture import capture_model
    >>> from normaudit.facts.sites import discover_sites
    >>> from normaudit.report import ModelFacts
    >>> layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=True)
    >>> cap = capture_model(layer, (torch.randn(2, 5, 16),), on_meta=False)
    >>> records, facts = discover_sites(cap), ModelFacts(class_name="TransformerEncoderLayer")
    >>> analyse(cap, records, facts)
    >>> [(r.site.module, r.site.placement) for r in records], facts.placement
    ([('norm1', 'pre'), ('norm2', 'pre')], 'pre')
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.vocabulary.graph import NEUTRAL_OPS, dtype, op_name, owner, shape, tensor_inputs
from normaudit.facts.sites import SiteRecord
from normaudit.vocabulary.kinds import builtin_kind
from normaudit.report import Block, ModelFacts

#: value-preserving reshapes the stream may pass through between a norm/residual add and its user
VIEW_OPS = ("view", "permute", "transpose", "flatten", "unflatten", "squeeze", "unsqueeze", "movedim",
            "expand", "expand_as")
#: overflow guards that keep the stream's values (within range) and its shape: T5's float16
#: ``clamp(x, -c, c)`` between sublayers and before the final norm, ``nan_to_num``
GUARD_OPS = ("clamp", "clamp_", "clamp_min", "clamp_max", "clip", "nan_to_num")
#: pooling a projection shortcut may apply before its 1x1 conv (ResNet-D)
POOL_OPS = ("avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d",
            "adaptive_avg_pool2d")
#: ops that compute attention scores from two activations
SCORE_OPS = ("sdpa", "matmul", "einsum", "baddbmm")
#: ops that project their input by a weight operand (a linear or conv layer, a matmul with a weight)
PROJECTION_OPS = ("linear", "addmm", "mm", "bmm", "matmul", "conv", "conv1d", "conv2d", "conv3d", "einsum")
#: ops that read only the size, dtype and device of their tensor input, not its values
SHAPE_ONLY_OPS = ("new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "zeros_like", "ones_like",
                  "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "size", "dim", "numel",
                  "sym_size", "sym_numel", "sym_stride")
#: elementwise arithmetic that, with a parameter operand, scales or shifts each element: no projection
GAIN_OPS = ("mul", "div", "add", "sub", "addcmul", "addcdiv")
CONTAINERS = (nn.ModuleList, nn.Sequential)
#: parameter-free modules that pass the stream through unchanged (in eval mode, or up to scaling)
NEUTRAL_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
                   nn.Identity)
BLOCK_ROLES = ("pre", "post", "sandwich")
#: roles of a norm on the stream that differ only by where the block sits in the stack: the closing norm of
#: the last block before the head is ``final`` where the others are ``post``; one whose stream goes on
#: through a projection (the first block of a stage, a block before a downsampler) is ``embedding``
STREAM_ROLES = {"final": "post", "embedding": "post"}


@dataclass
class ResidualAdd:
    """One residual add ``skip + branch`` found in the graph.

    ``skip_src`` is the skip operand seen through casts/dropout/views; ``reads`` the stream value the
    branch is computed from (``skip_src``, or an earlier stream value for parallel layouts); ``terms`` the
    branch operand split at non-residual adds (one per parallel sublayer); ``shortcut`` the weighted
    projection on the skip side, if any.
    """

    node: fx.Node
    skip: fx.Node
    skip_src: fx.Node
    branch: fx.Node
    reads: fx.Node
    terms: list[fx.Node] = field(default_factory=list)
    parallel: bool = False
    shortcut: Optional[fx.Node] = None
    block: Optional[str] = None


class _Graph:
    """Topological indices, ancestor/descendant bitsets, parameter and weighted-op sets of one graph."""

    def __init__(self, cap: Capture, records: list[SiteRecord]):
        self.cap = cap
        self.modules = cap.modules
        self.nodes: list[fx.Node] = list(cap.gm.graph.nodes)
        self.idx = {n: i for i, n in enumerate(self.nodes)}
        self.inputs = {n: [a for a in tensor_inputs(n) if _tensorish(a)] for n in self.nodes}
        user_inputs = set(cap.user_inputs)
        self.param: set[fx.Node] = set()
        for n in self.nodes:
            if n.op == "get_attr" and isinstance(_resolve_attr(cap.gm, str(n.target)), nn.Parameter):
                self.param.add(n)
            elif n.op == "placeholder" and n.name not in user_inputs and n.name.startswith("p_"):
                self.param.add(n)
        # const: independent of the model inputs; pderived: computed from parameters (and constants) only
        self.const: set[fx.Node] = set()
        self.pderived: set[fx.Node] = set()
        for n in self.nodes:
            ins = self.inputs[n]
            if n.op == "placeholder":
                if n.name not in user_inputs and (user_inputs or n in self.param):
                    self.const.add(n)
            elif n.op == "get_attr":
                self.const.add(n)
            elif n.op in ("call_function", "call_method") and all(a in self.const for a in ins):
                self.const.add(n)
            if n in self.param or (n in self.const and any(a in self.pderived for a in ins)):
                self.pderived.add(n)
        anc = [0] * len(self.nodes)
        for i, n in enumerate(self.nodes):
            acc = 0
            for a in self.inputs[n]:
                j = self.idx[a]
                acc |= anc[j] | (1 << j)
            anc[i] = acc
        self.anc = anc
        desc = [0] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            for a in self.inputs[self.nodes[i]]:
                j = self.idx[a]
                desc[j] |= desc[i] | (1 << i)
        self.desc = desc
        # norm nodes: claimed by a site, the gain/cast chain after it, and everything a leaf norm module owns
        self.norm_nodes: set[fx.Node] = set()
        self.site_out: dict[int, fx.Node] = {}
        self.site_chain: dict[int, set[fx.Node]] = {}
        leaf_norms = {r.site.module for r in records if r.module_obj is not None and r.site.module
                      and not any(True for _ in r.module_obj.children())}
        for r in records:
            self.norm_nodes |= set(r.nodes)
            if r.output is not None:
                end, chain = self._extend_output(r)
                self.site_out[id(r)] = end
                self.site_chain[id(r)] = set(chain)
                self.norm_nodes |= set(chain) | {r.output}
        for n in self.nodes:
            if n.op != "placeholder" and owner(n, self.modules) in leaf_norms:
                self.norm_nodes.add(n)
        self.weighted_mask = 0
        for i, n in enumerate(self.nodes):
            if n in self.norm_nodes or n in self.const:
                continue
            if n.op == "call_module":
                mod = self.modules.get(str(n.target))
                if mod is not None and builtin_kind(mod) is None and any(True for _ in mod.parameters()):
                    self.weighted_mask |= 1 << i
            elif n.op in ("call_function", "call_method"):
                if any(a in self.pderived for a in self.inputs[n]):
                    self.weighted_mask |= 1 << i

        self._mark_mixing_and_output()

    def _mark_mixing_and_output(self) -> None:
        """Bitsets of the output node and of parameter-free mixing ops (Fourier transforms, pooling)."""
        self.output_mask = self.mixing_mask = 0
        for i, n in enumerate(self.nodes):
            name = op_name(n).lower()
            if n.op == "output":
                self.output_mask |= 1 << i
            elif n not in self.const and ("fft" in name or "pool" in name or
                                          (n.op == "call_module" and _is_pool_module(self.modules.get(str(n.target))))):
                self.mixing_mask |= 1 << i

    def strip(self, node: Any) -> Any:
        return stream_strip(node, self.modules)

    def is_alias(self, node: fx.Node) -> bool:
        """``node`` passes its first input through unchanged (cast, clone, dropout, view, Identity)."""
        return self.strip(node) is not node

    # -- helpers -------------------------------------------------------------------------------------------
    def _real_users(self, node: fx.Node) -> list[fx.Node]:
        return [u for u in node.users if "assert" not in op_name(u)]

    def _extend_output(self, rec: SiteRecord) -> tuple[fx.Node, list[fx.Node]]:
        """The last node of a norm: its output followed through casts and the gain/bias (param operand)."""
        node = rec.output
        chain: list[fx.Node] = []
        path = owner(node, self.modules)
        for _ in range(8):
            users = self._real_users(node)
            if len(users) != 1:
                break
            u = users[0]
            if u.op == "output" or owner(u, self.modules) != path:
                break
            name = op_name(u)
            if name in NEUTRAL_OPS or name == "type_as":
                pass
            elif name in ("mul", "add", "div", "sub"):
                others = [a for a in self.inputs[u] if a is not node]
                if not all(a in self.pderived for a in others):
                    break
            else:
                break
            chain.append(u)
            node = u
        return node, chain

    def is_anc(self, a: fx.Node, b: fx.Node) -> bool:
        """``a`` is a strict ancestor of ``b``."""
        return bool((self.anc[self.idx[b]] >> self.idx[a]) & 1)

    def anc_or_eq(self, a: fx.Node, b: fx.Node) -> bool:
        return a is b or self.is_anc(a, b)

    def weighted_between(self, src: fx.Node, dst: fx.Node) -> bool:
        """Some weighted op lies on a path from ``src`` (exclusive) to ``dst`` (inclusive)."""
        j = self.idx[dst]
        return bool(self.weighted_mask & self.desc[self.idx[src]] & (self.anc[j] | (1 << j)))

    def is_weighted(self, n: fx.Node) -> bool:
        return bool((self.weighted_mask >> self.idx[n]) & 1)

    def is_gain(self, n: fx.Node) -> bool:
        """``n`` is elementwise arithmetic of one activation with parameters (``x * gamma``, ``x + bias``,
        ``shift(x) * (1 - mix)``): weighted, but a per-element scaling or offset, not a projection that mixes
        features (a linear/conv layer, a matmul with a weight)."""
        if op_name(n) not in GAIN_OPS or not self.is_weighted(n):
            return False
        return len([a for a in self.inputs[n] if a not in self.pderived and a not in self.const]) == 1


def _is_pool_module(mod: Optional[nn.Module]) -> bool:
    return isinstance(mod, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
                            nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                            nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d))


def _tensorish(node: fx.Node) -> bool:
    v = node.meta.get("val")
    if v is None:
        return node.op in ("placeholder", "get_attr") or "tensor_meta" in node.meta
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, (list, tuple)):
        return any(isinstance(x, torch.Tensor) for x in v)
    return False


def _resolve_attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def stream_strip(node: Any, modules: Optional[dict[str, nn.Module]] = None) -> Any:
    """Follow casts, clones, dropout, views and overflow guards (clamp) back to the value they carry (the stream seen through
    aliases). With ``modules``, parameter-free ``nn.Dropout``/``nn.Identity`` modules called as
    ``call_module`` nodes (symbolic tracing) are looked through too, as export's dropout ops are."""
    for _ in range(32):
        if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
            return node
        name = op_name(node)
        if name in NEUTRAL_OPS or name in VIEW_OPS or name in GUARD_OPS or name == "type_as":
            node = node.args[0]
            continue
        if name == "module" and modules is not None and isinstance(modules.get(str(node.target)), NEUTRAL_MODULES):
            node = node.args[0]
            continue
        return node
    return node


# -- residual adds -------------------------------------------------------------------------------------------
def _same_shapes(*nodes: fx.Node) -> bool:
    shapes = [shape(n) for n in nodes]
    known = [s for s in shapes if s is not None]
    return all(s == known[0] for s in known)


def _through_pool(g: _Graph, node: Any) -> Any:
    """Follow poolings (functional, ``max_pool2d_with_indices(...)[0]``, or a pooling module) and aliases back
    to the value pooled."""
    for _ in range(8):
        node = g.strip(node)
        if not isinstance(node, fx.Node) or not node.args or not isinstance(node.args[0], fx.Node):
            return node
        name = op_name(node)
        if name == "getitem" and "pool" in op_name(node.args[0]):
            node = node.args[0]
        elif name in ("amax", "max", "mean") and _is_split_view(node.args[0]):
            node = node.args[0]  # Hiera's max-pool of tokens: x.view(B, stride, -1, C).amax(dim=1)
        elif name in POOL_OPS or name.startswith("max_pool") or \
                (node.op == "call_module" and _is_pool_module(g.modules.get(str(node.target)))):
            node = node.args[0]
        else:
            return node
    return node


def _is_split_view(node: fx.Node) -> bool:
    """``node`` is a view/reshape that adds dims (splits one axis into a window and the rest), the first step
    of a pooling written as ``view`` + ``amax``/``mean`` over the window dim."""
    if op_name(node) not in ("view", "reshape", "unflatten") or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    before, after = shape(node.args[0]), shape(node)
    return before is not None and after is not None and len(after) > len(before)


def _shortcut_source(g: _Graph, skip: fx.Node) -> Optional[tuple[fx.Node, fx.Node]]:
    """For a projection shortcut ``[norm](W(pool(x)))`` or ``pool(W(x))`` (Hiera / SAM2 MultiScaleBlock pool
    the projected tokens like their queries) return ``(x, W)``; else None."""
    node = _through_pool(g, skip)
    if node in g.norm_nodes:  # a norm on the shortcut: look through it to its input
        for a in g.inputs[node]:
            if a not in g.pderived and a not in g.norm_nodes:
                node = g.strip(a)
                break
        else:
            return None
        while node in g.norm_nodes:
            ins = [a for a in g.inputs[node] if a not in g.pderived]
            if not ins:
                return None
            node = g.strip(ins[0])
    if not g.is_weighted(node) or g.is_gain(node):
        return None  # an elementwise gain is no projection: RWKV's time mix x * mu + shift(x) * (1 - mu)
    acts = [a for a in g.inputs[node] if a not in g.pderived and a not in g.const]
    if len(acts) != 1:
        return None
    if op_name(node) == "embedding" or isinstance(g.modules.get(str(node.target)) if node.op == "call_module" else None,
                                                   nn.Embedding):
        return None  # token + position embeddings are two lookups of the ids, not a shortcut
    src = _through_pool(g, acts[0])
    dt = dtype(src)
    if dt is not None and not dt.is_floating_point:
        return None
    return src, node


def _terms(g: _Graph, branch: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> list[fx.Node]:
    """Split a branch at plain (non-residual) adds into its summands."""
    out: list[fx.Node] = []
    todo = [branch]
    while todo and len(out) < 16:
        n = todo.pop(0)
        s = g.strip(n)
        if isinstance(s, fx.Node) and op_name(s) == "add" and s not in residual:
            ins = g.inputs[s]
            if len(ins) == 2 and not any(a in g.pderived for a in ins):
                todo.extend(ins)
                continue
        out.append(n)
    return out


def find_residual_adds(g: _Graph) -> list[ResidualAdd]:
    """Every residual add of the graph, in graph order (see the module docstring, step 1).

    A residual connection is ``y = x + F(x)`` with a weighted residual function ``F`` (He et al. 2016,
    arXiv 1512.03385, eq. 1; a projection ``W_s x`` on the shortcut when shapes change, eq. 2); the
    Transformer wraps every sublayer in one (Vaswani et al. 2017, section 3.1).
    """
    found: dict[fx.Node, ResidualAdd] = {}
    res_mask = 0
    for n in g.nodes:
        if op_name(n) != "add" or n.op == "call_module" or n in g.norm_nodes:
            continue
        ops = [a for a in n.args[:2] if isinstance(a, fx.Node)]
        if len(ops) != 2 or ops[0] is ops[1] or not all(_tensorish(a) for a in ops):
            continue
        if not _same_shapes(ops[0], ops[1], n):
            continue
        best: Optional[ResidualAdd] = None
        for skip, branch in ((ops[0], ops[1]), (ops[1], ops[0])):
            if skip in g.pderived or branch in g.pderived:
                continue
            src = _through_pool(g, skip)  # a strided identity shortcut pools the stream (MaxViT MbConvBlock)
            chain, cur = [], src
            for _ in range(4):
                chain.append(cur)
                prev = found.get(cur)
                if prev is None:
                    break
                cur = g.strip(prev.skip)
            reads = next((c for c in chain if g.weighted_between(c, branch) and not _long_skip(g, c, branch, res_mask)),
                         None)
            if reads is None and _mixes(g, src, branch) and not _long_skip(g, src, branch, res_mask):
                reads = src  # a weightless mixing branch: LayerNorm(x + fft(x)) (FNet), x + pool(x) - x
            if reads is None:
                continue
            cand = ResidualAdd(node=n, skip=skip, skip_src=src, branch=branch, reads=reads)
            if best is None or (best.reads is not best.skip_src and reads is src):
                best = cand
        if best is None:  # projection shortcut: both sides weighted from one stream value
            for skip, branch in ((ops[1], ops[0]), (ops[0], ops[1])):
                sc = _shortcut_source(g, skip)
                if sc is None:
                    continue
                src, proj = sc
                if g.weighted_between(src, branch) and not g.anc_or_eq(proj, branch) and \
                        not _long_skip(g, src, branch, res_mask) and not _parallel_projections(g, branch, src):
                    best = ResidualAdd(node=n, skip=skip, skip_src=g.strip(skip), branch=branch, reads=src,
                                       shortcut=proj)
                    break
        if best is None:
            continue
        best.terms = _terms(g, best.branch, found)
        weighted_terms = [t for t in best.terms if g.weighted_between(best.reads, t)]
        best.parallel = len(weighted_terms) >= 2 or (best.reads is not best.skip_src and best.shortcut is None)
        found[n] = best
        res_mask |= 1 << g.idx[n]
    return list(found.values())


def _parallel_projections(g: _Graph, branch: fx.Node, src: fx.Node) -> bool:
    """Every summand of ``branch`` is, like the projection on the other side, one weighted op of ``src``
    (``[norm](W(src))``), ``[norm](src)`` or ``src``: a sum of parallel conv(+BN) branches of one input
    (RepVGG, Ding et al. 2021, arXiv 2101.03697; MobileOne / FastViT MobileOneBlock; Inception-style sums),
    which a re-parameterisation folds into one conv, not a residual function ``F`` beside a shortcut (He et
    al. 2016, eq. 2: ``F`` stacks several layers)."""
    terms: list[fx.Node] = []
    todo = [branch]
    while todo and len(terms) < 16:
        n = g.strip(todo.pop())
        ins = g.inputs[n] if isinstance(n, fx.Node) else []
        if isinstance(n, fx.Node) and op_name(n) == "add" and len(ins) in (1, 2) \
                and not any(a in g.pderived or a in g.const for a in ins):
            todo.extend(ins)  # a sum of branches; one tensor operand: ``branch + 0`` (an absent branch)
        else:
            terms.append(n)
    for t in terms:
        if not isinstance(t, fx.Node):
            return False
        sc = _shortcut_source(g, t)
        if sc is not None and sc[0] is src or _linear_chain(g, t, src):
            continue
        base = t
        while base in g.norm_nodes:  # [norm](src): the identity branch of a RepVGG block
            ins = [a for a in g.inputs[base] if a not in g.pderived]
            if not ins:
                break
            base = g.strip(ins[0])
        if base is not src:
            return False
    return True


def _linear_chain(g: _Graph, node: fx.Node, src: fx.Node) -> bool:
    """``node`` is ``src`` seen through a chain of linear layers (``nn.Linear``/conv modules or ``linear``
    / ``conv`` ops with one activation input), dropouts and scalings by a constant, with no nonlinearity:
    the low-rank adapter ``B(A(x))`` of LoRA (Hu et al. 2021, arXiv 2106.09685), which Zamba2 adds to its
    shared MLP's and attention's projections (``W x + B A x``). Such a sum is one linear map ``(W + BA) x``,
    not a residual function beside a projection shortcut."""
    cur, steps = g.strip(node), 0
    while isinstance(cur, fx.Node) and cur is not src and steps < 8:
        steps += 1
        mod = g.modules.get(str(cur.target)) if cur.op == "call_module" else None
        acts = [a for a in g.inputs[cur] if a not in g.pderived and a not in g.const]
        name = op_name(cur)
        linear = g.is_weighted(cur) and (name in ("linear", "conv") or isinstance(mod, (nn.Linear, nn.modules.conv._ConvNd)))
        passive = name in ("dropout", "mul", "div") or isinstance(mod, (nn.Dropout, nn.Identity))
        if len(acts) != 1 or not (linear or passive):
            return False
        cur = g.strip(acts[0])
    return cur is src and steps > 0


def _long_skip(g: _Graph, src: fx.Node, branch: fx.Node, res_mask: int) -> bool:
    """The branch reads ``src`` only across residual adds already found: ``src`` is not the stream this add
    continues but a value re-injected later (a position bias or value embedding shared by every layer, an
    outer ``x0 + s * LN(h)`` around a whole stack, a U-Net/FPN long skip)."""
    j = g.idx[branch]
    return bool(g.desc[g.idx[src]] & (g.anc[j] | (1 << j)) & res_mask)


def _mixes(g: _Graph, src: fx.Node, branch: fx.Node) -> bool:
    """A parameter-free mixing op (a Fourier transform, a pooling) lies between ``src`` and ``branch``, and
    ``branch`` is not ``src`` seen through aliases: FNet's ``x + fft(x).real``, PoolFormer's pooling mixer."""
    if g.strip(branch) is src or not g.is_anc(src, branch):
        return False
    j = g.idx[branch]
    return bool(g.mixing_mask & g.desc[g.idx[src]] & (g.anc[j] | (1 << j)))


# -- blocks ----------------------------------------------------------------------------------------------------
def _numbered_children(modules: dict[str, nn.Module]) -> set[str]:
    """Numbered children of a ModuleList/Sequential whose children are all of one class (not norms)."""
    out: set[str] = set()
    for path, mod in modules.items():
        parent, _, last = path.rpartition(".")
        if not last.isdigit() or builtin_kind(mod) is not None:
            continue
        container = modules.get(parent if parent else "")
        if not isinstance(container, CONTAINERS):
            continue
        if len({type(c) for c in container.children()}) == 1:
            out.add(path)
    return out


def _prefixes(path: str) -> list[str]:
    """``a.b.c`` -> ``[a.b.c, a.b, a]`` (innermost first)."""
    parts = path.split(".") if path else []
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]


def _inside(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + ".")


def _assign_blocks(g: _Graph, adds: list[ResidualAdd]) -> set[str]:
    """Give each residual add its block: the innermost numbered same-class child that owns the add and at
    least one weighted op of its branch (so a ``SublayerConnection`` that only receives its sublayer as a
    callable is not a block, but the layer that owns the sublayer is). Returns the set of blocks."""
    numbered = _numbered_children(g.modules)
    blocks: set[str] = set()
    for a in adds:
        j = g.idx[a.branch]
        mask = g.weighted_mask & g.desc[g.idx[a.reads]] & (g.anc[j] | (1 << j))
        owners = set()
        i = 0
        while mask and len(owners) < 64:
            if mask & 1:
                owners.add(owner(g.nodes[i], g.modules))
            mask >>= 1
            i += 1
        for p in _prefixes(owner(a.node, g.modules)):
            if p in numbered and any(_inside(o, p) for o in owners):
                a.block = p
                blocks.add(p)
                break
    return blocks


def _block_of(path: str, blocks: set[str]) -> Optional[str]:
    return next((p for p in _prefixes(path) if p in blocks), None)


# -- placement of sites ------------------------------------------------------------------------------------
def _unwrap_branch(g: _Graph, node: fx.Node) -> list[fx.Node]:
    """The nodes a branch operand passes back through: casts, dropout, views, drop-path and layer-scale
    multiplies (the last one is what the branch really computes)."""
    seen: list[fx.Node] = []
    for _ in range(16):
        while isinstance(node, fx.Node):  # one alias at a time, recording each
            seen.append(node)
            if g.strip(node) is node:
                break
            node = node.args[0]
        if not isinstance(node, fx.Node):
            return seen
        if op_name(node) in ("mul", "div") and node.args:
            acts = [a for a in g.inputs[node] if a not in g.pderived and a not in g.const]
            # a scalar, a parameter (layer scale) or a random keep-mask (drop path) on the other side
            if len(acts) == 1:
                node = acts[0]
                continue
            rand = [a for a in acts if _is_random(g, a)]
            if len(acts) == 2 and op_name(node) == "mul" and len(rand) == 1:
                node = acts[0] if acts[1] is rand[0] else acts[1]
                continue
        return seen
    return seen


def _is_random(g: _Graph, node: fx.Node) -> bool:
    """A drop-path keep mask: computed from random ops and shapes only, not from the stream."""
    todo, seen = [node], 0
    while todo and seen < 16:
        n = todo.pop()
        seen += 1
        name = op_name(n)
        if name in ("rand", "bernoulli", "rand_like", "empty", "new_empty", "bernoulli_", "uniform_"):
            return True
        if name in ("floor", "floor_", "add", "div", "to", "alias") or name in VIEW_OPS:
            todo.extend(g.inputs[n])
    return False


def _reaches_scores(g: _Graph, start: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> bool:
    """The norm output reaches attention scores with no weighted op, norm or residual add in between."""
    todo, seen = deque([start]), {start}
    while todo:
        n = todo.popleft()
        for u in n.users:
            if u in seen or n not in g.inputs[u]:
                continue  # only tensor data flow: x.shape/x.size() feeding a view of q/k is not q/k itself
            seen.add(u)
            name = op_name(u)
            if u in residual or u.op == "output" or name in SHAPE_ONLY_OPS:
                continue  # x.new_zeros(...) / zeros_like(x): only x's size, dtype and device flow on
            if name in SCORE_OPS:
                acts = [a for a in g.inputs[u] if a not in g.pderived and a not in g.const]
                if name == "sdpa":
                    q_k = [a for a in u.args[:2] if isinstance(a, fx.Node)]
                    if n in q_k:
                        return True
                    continue
                if len(acts) >= 2 and not g.is_weighted(u) and (_feeds_softmax(g, u) or _weights_values(g, u)):
                    return True
                continue
            if g.is_weighted(u) or (u in g.norm_nodes and u not in (start,)) or name == "module" \
                    or (name in PROJECTION_OPS and any(a in g.param for a in g.inputs[u])):
                # a projection by a weight; also of a tensor computed from parameters only (a Perceiver
                # resampler's learned latents in its first layer), which is_weighted leaves unmarked: export's
                # aten.linear then stops here as symbolic_trace's call_module does
                continue
            todo.append(u)
            if len(seen) > 400:
                return False
    return False


def _is_softmax(g: _Graph, node: fx.Node) -> bool:
    """``node`` is a softmax or log-softmax, functional or an ``nn.Softmax``/``nn.LogSoftmax`` module."""
    return "softmax" in op_name(node) or (node.op == "call_module" and isinstance(
        g.modules.get(str(node.target)), (nn.Softmax, nn.LogSoftmax)))


def _weights_values(g: _Graph, node: fx.Node) -> bool:
    """``node`` (an activation-activation product) weights values by an attention map: one operand comes from a
    softmax through a few views, dropout or casts (``attn.softmax(-1) @ v``), so a norm on ``v`` is inside the
    attention as q/k norms are."""
    todo, seen = list(g.inputs[node]), 0
    while todo and seen < 16:
        n = todo.pop()
        seen += 1
        name = op_name(n)
        if _is_softmax(g, n):
            return True
        if name in NEUTRAL_OPS or name in VIEW_OPS or name in ("reshape", "contiguous", "clone", "type_as") or (
                n.op == "call_module" and isinstance(g.modules.get(str(n.target)), nn.Dropout)):
            todo.extend(g.inputs[n])
    return False


#: what scores may pass through on their way to the softmax: scaling, a bias or mask, and a relative position
#: bias written into a slice of them (timm MViTv2 ``attn[:, :, 1:, 1:] = (attn[...].view(...) + rel_h +
#: rel_w).view(...)``: slicing, reshapes, the scatter or ``copy_`` back)
_SCORE_STEPS = ("add", "sub", "mul", "div", "masked_fill", "where", "exp", "tanh", "reshape", "contiguous",
                "clone", "getitem", "slice", "select", "narrow", "slice_scatter", "select_scatter", "copy_",
                "index_put", "index_put_", "setitem", "add_", "mul_", "div_", "masked_fill_")


def _feeds_softmax(g: _Graph, node: fx.Node) -> bool:
    """Scores ``node`` reach a softmax within a few elementwise steps (scaling, a bias or mask, views): an
    attention map. Contrastive logits (CLIP's ``text @ image.T * logit_scale.exp()``, whose softmax lives in
    the loss outside the forward) and other activation products are not."""
    frontier = [node]
    for _ in range(8):
        nxt = []
        for n in frontier:
            for u in n.users:
                name = op_name(u)
                if _is_softmax(g, u):
                    return True
                if name in _SCORE_STEPS or name in NEUTRAL_OPS or name in VIEW_OPS or name in GUARD_OPS:
                    nxt.append(u)
        frontier = nxt[:32]
    return False


def _contracted_by_scores(g: _Graph, info: "_SiteInfo") -> bool:
    """The dims a q/k norm reduces over are the dims its attention scores contract, followed from the
    norm's output through transposes/permutes to a ``matmul`` (left operand: its last dim; right operand: its
    second-to-last) or ``sdpa`` (q and k: their last dim). True for the usual q/k norm over head_dim
    (Dehghani et al. 2023) and for cross-covariance attention, which L2-normalises q and k over the tokens
    because its scores are a channel x channel map (XCiT, El-Nouby et al. 2021, arXiv 2106.09681, eq. 3;
    timm edgenext CrossCovarianceAttn)."""
    dims, rank = info.rec.site.reduced_dims, len(shape(info.out) or ())
    if not dims or not rank:
        return False
    todo, seen = [(info.out, {d % rank for d in dims})], 0
    while todo and seen < 64:
        n, red = todo.pop()
        seen += 1
        for u in n.users:
            name, nd = op_name(u), len(shape(u) or ())
            if g.is_alias(u) and name not in ("transpose", "permute") and shape(u) == shape(n) and u.args[0] is n:
                todo.append((u, red))
            elif name in ("transpose", "permute") and u.args[0] is n and nd == rank:
                perm = _permutation(u, rank)
                if perm is not None:
                    todo.append((u, {perm.index(d) for d in red}))
            elif name in ("matmul", "sdpa") and nd:
                pos = [i for i, a in enumerate(u.args[:2]) if a is n]
                if pos:
                    want = rank - 1 if (pos[0] == 0 or name == "sdpa") else rank - 2
                    return red == {want}
    return False


def _permutation(node: fx.Node, rank: int) -> Optional[list[int]]:
    """The dim order of a ``transpose``/``permute`` node's output (``out[i] = in[perm[i]]``)."""
    args = [a for a in node.args[1:]] or list(node.kwargs.values())
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = list(args[0])
    if not all(isinstance(a, int) for a in args):
        return None
    if op_name(node) == "transpose" and len(args) == 2:
        perm = list(range(rank))
        a, b = args[0] % rank, args[1] % rank
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    perm = [a % rank for a in args]
    return perm if sorted(perm) == list(range(rank)) else None


def _stream_reach(g: _Graph, start: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> list[ResidualAdd]:
    """Residual adds that take ``start`` forward as their skip (the stream), not through a branch."""
    out: list[ResidualAdd] = []
    todo, seen = deque([start]), {start}
    while todo:
        n = todo.popleft()
        for u in n.users:
            if u in seen:
                continue
            ra = residual.get(u)
            if ra is not None:
                if ra.skip is n:
                    seen.add(u)
                    out.append(ra)
                    todo.append(u)
                continue  # reached through a branch: the stream ends here for this path
            seen.add(u)
            todo.append(u)
    return out


@dataclass
class _SiteInfo:
    rec: SiteRecord
    inp: Optional[fx.Node]
    out: Optional[fx.Node]
    block: Optional[str]
    placement: str = "unknown"
    add: Optional[ResidualAdd] = None
    adds: list[ResidualAdd] = field(default_factory=list)
    #: its output feeds a projection shortcut as well as the branch: ``pre`` here, whichever scheme the
    #: identity-shortcut blocks of its class follow (raw skip, ResNetV2; normed skip, timm PreXception)
    feeds_shortcut: bool = False
    #: its input depends on no model input: learned latent queries expanded over the batch, read by the first
    #: layer of a Perceiver resampler (Idefics2's connector, modeling_idefics2.py:626-628); no residual stream
    reads_constant: bool = False


def analyse(cap: Capture, records: list[SiteRecord], model: ModelFacts) -> None:
    """Set ``site.placement``, ``site.block`` and the placement facts in ``site.extra`` for every record, and
    ``model.placement``/``parallel_residual``/``has_final_norm``/``num_residual_adds``/``blocks``.

    See the module docstring for the definitions (Vaswani et al. 2017; Xiong et al. 2020, arXiv 2002.04745;
    Liu et al. 2020, arXiv 2004.08249). Reads the graph; writes only ``node.meta["normaudit"]``.
    """
    if cap.gm is None:
        return
    g = _Graph(cap, records)
    adds = find_residual_adds(g)
    residual = {a.node: a for a in adds}
    for a in adds:
        a.node.meta.setdefault("normaudit", {})["residual"] = {
            "skip": a.skip.name, "branch": a.branch.name, "reads": a.reads.name, "parallel": a.parallel,
            "shortcut": a.shortcut.name if a.shortcut is not None else None}
    candidates = _assign_blocks(g, adds)
    add_mask = 0
    for a in adds:
        add_mask |= 1 << g.idx[a.node]

    infos: list[_SiteInfo] = []
    for rec in records:
        inp = g.strip(rec.input) if isinstance(rec.input, fx.Node) else None
        out = g.site_out.get(id(rec))
        info = _SiteInfo(rec=rec, inp=inp, out=out, block=_block_of(rec.site.module, candidates),
                         reads_constant=inp is not None and inp in g.const)
        rec.site.block = info.block
        infos.append(info)

    # pass 1: qk norms and norms inside a residual branch
    for info in infos:
        if info.inp is None or info.out is None:
            continue
        if not adds:
            info.placement = "none"
            continue
        if _reaches_scores(g, info.out, residual):
            info.placement = "qk"
            if _contracted_by_scores(g, info):
                info.rec.site.extra["contracted_by_scores"] = True
            continue
        _branch_placement(g, info, adds)

    branch_norms: dict[fx.Node, list[_SiteInfo]] = defaultdict(list)
    for info in infos:
        for a in info.adds:
            branch_norms[a.node].append(info)

    # pass 2: norms on the stream
    skip_from_norm: list[tuple[_SiteInfo, ResidualAdd]] = []
    for info in infos:
        if info.placement != "unknown" or info.inp is None or info.out is None:
            continue
        skipped = _stream_placement(g, info, residual, add_mask, branch_norms)
        if skipped is not None:
            skip_from_norm.append((info, skipped))

    # a norm output as the skip is the fault only when the add it feeds is not itself closed by a post norm:
    # in a post-LN stack (x = ln(x + f(x))) the stream is the output of a norm everywhere, the embedding norm
    # included, whether or not the layers are submodules
    post_inputs = {i.inp for i in infos if i.placement == "post" and i.inp is not None}
    for info, add in skip_from_norm:
        if add.node not in post_inputs:
            info.rec.site.extra["skip_from_norm"] = True
            if not _cuts_identity(g, info, add, infos, residual):
                info.rec.site.extra["no_identity_lost"] = True

    for info in infos:
        info.rec.site.placement = info.placement  # type: ignore[assignment]

    _double_norms(g, infos)
    _model_facts(g, adds, residual, infos, model, candidates)


def _cuts_identity(g: _Graph, info: "_SiteInfo", add: ResidualAdd, infos: list["_SiteInfo"],
                   residual: dict[fx.Node, ResidualAdd]) -> bool:
    """A norm whose output is the skip of its block's residual add (``x = norm(x); x = x + f(x)``) cuts an
    identity path the stack keeps elsewhere: a pre-LN fault (Xiong et al. 2020 keep ``x`` on the skip). Not
    when the stream it reads is already a norm's output (``LN(LN(x))``: nothing un-normalised is lost; a
    post-LN layer's output re-normalised by the next block, GroundingDINO's fusion layer after the
    deformable layer's ``final_layer_norm``); not when no norm of its stream is a ``pre`` norm reading a
    branch's input (the stream is normalised at every block, as in post-LN: no identity path to keep;
    GroundingDINO's BiAttentionBlock captured alone, whose stack is post-LN). The stream: the residual adds
    the norm's input continues (back along their skips) and those its add leads to."""
    norm_outs = {n for o in infos if o is not info for n in (g.site_out.get(id(o.rec)), o.rec.output) if n is not None}
    if info.inp in norm_outs:
        return False
    stream = {add.node} | {a.node for a in _stream_reach(g, add.node, residual)}
    node: Any = info.inp
    for _ in range(64):
        node = g.strip(node)
        stream.add(node)
        if node not in residual:
            break
        node = residual[node].skip
    return any(o.placement == "pre" and o.rec.site.extra.get("branch_position") == "input" and not o.feeds_shortcut
               and o.inp in stream for o in infos)


def _stream_placement(g: _Graph, info: "_SiteInfo", residual: dict[fx.Node, ResidualAdd], add_mask: int,
                      branch_norms: dict[fx.Node, list["_SiteInfo"]]) -> Optional[ResidualAdd]:
    """Pass 2 for one norm outside any residual branch: ``post``/``embedding``/``final``/``none`` (module
    docstring, step 2). Returns the residual add of its own block whose skip the norm's output is when that
    may be a skip-from-norm fault, else None."""
    after_add = info.inp in residual or bool(g.anc[g.idx[info.inp]] & add_mask)
    ahead = _stream_reach(g, info.out, residual)
    mine = _own_nodes(g, info)
    direct = [a for a in ahead if g.strip(a.skip) in mine]
    if direct:
        # its output is the skip of the next residual add: a norm on the stream
        # a norm that ends a non-residual block (conv -> BN of a downsampler, a patch embedding) or whose
        # stream a projection re-embeds (a downsampler's local residual) starts a stream: ``embedding``
        reads = _reads_stream(g, info.inp, residual)
        local = reads and _reembedded(g, direct[0], ahead, add_mask)
        # an embedding norm inside the first block: it reads the embeddings before any residual add and the
        # branch has its own pre norm on its output (RWKV's blocks.0.pre_ln, ln0 of the reference:
        # x = pre_ln(x); x = x + attn(ln1(x)))
        in_block = not after_add and any(o.placement == "pre" and o.inp in mine
                                         for o in branch_norms.get(direct[0].node, []))
        starts = not reads or local or in_block or (info.block is None and not after_add)
        info.placement = "embedding" if starts else "post"
        closes = info.inp in residual and residual[info.inp].block == info.block
        if direct[0].block == info.block and not closes and reads and not local and not in_block:
            return direct[0]
    elif ahead:
        info.placement = "embedding"  # feeds a projection that (re-)embeds the stream (patch merging)
    elif not after_add:
        info.placement = "none"
    elif info.inp in residual and not branch_norms.get(info.inp):
        info.placement = "post"  # LayerNorm(x + f(x)) closing the last sublayer
    else:
        info.placement = "final"
    return None


def _branch_placement(g: _Graph, info: "_SiteInfo", adds: list[ResidualAdd]) -> None:
    """Pass 1 for one norm: the residual adds whose branch (or projection shortcut) it lies in, and its role
    there (``sandwich`` when its output is the branch, else ``pre`` with ``branch_position``); the innermost
    (first) add decides."""
    for a in adds:
        sides = [a.branch] + ([a.skip] if a.shortcut is not None else [])
        side = next((s for s in sides if g.anc_or_eq(info.out, s)), None)
        if side is not None and a.shortcut is not None and g.anc_or_eq(info.out, a.reads) \
                and not g.weighted_between(info.out, a.reads):
            # pre-activation block with a projection shortcut (ResNetV2, PreAct ResNet): the norm of the
            # block input feeds both the branch and the shortcut projection, x_pre = norm(x);
            # y = conv_s(x_pre) + F(x_pre): a pre norm, as in the blocks with an identity shortcut
            info.adds.append(a)
            if info.add is None:
                info.add, info.placement, info.feeds_shortcut = a, "pre", True
                info.rec.site.extra["branch_position"] = "input"
            continue
        if side is None or g.anc_or_eq(info.out, a.reads):
            continue  # not in a branch, or the norm's output is (upstream of) the stream the branch reads
        if not g.anc_or_eq(a.reads, info.inp):
            continue
        info.adds.append(a)
        if info.add is not None:
            continue  # the innermost (first) add decides; later ones are outer or parallel adds
        info.add = a
        ends = {n for t in ([side] if side is not a.branch else a.terms + [a.branch]) for n in _unwrap_branch(g, t)}
        if ends & _own_nodes(g, info):
            info.placement = "sandwich"
            info.rec.site.extra["branch_position"] = "output"
        else:
            info.placement = "pre"
            info.rec.site.extra["branch_position"] = "input" if info.inp is a.reads else "inner"


def _reads_stream(g: _Graph, node: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> bool:
    """``node`` (a norm's input, seen through aliases) is the residual stream: a residual add's output, a
    model input, a token embedding lookup, or a sum/scaling of those (token + position embeddings,
    ``emb * sqrt(d)``). A norm that ends a non-residual block (conv -> BN of a stride-2 or channel-changing
    block, a patch-embedding or projection conv -> norm, a downsampler) reads its own block's computation,
    not the stream, so its output being the next block's identity is the start of a new stream."""
    todo, seen = [g.strip(node)], 0
    while todo and seen < 16:
        n = todo.pop()
        seen += 1
        if not isinstance(n, fx.Node):
            continue
        if n in residual or (n.op == "placeholder" and n.name in g.cap.user_inputs):
            return True
        name = op_name(n)
        mod = g.modules.get(str(n.target)) if n.op == "call_module" else None
        if name == "embedding" or isinstance(mod, nn.Embedding):
            return True
        if name in ("add", "sub"):
            todo.extend(g.strip(a) for a in g.inputs[n] if a not in g.const)
        elif (name in ("mul", "div") or name in GUARD_OPS) and isinstance(n.args[0], fx.Node):
            todo.append(g.strip(n.args[0]))  # emb * sqrt(d); not x * mask (a mask is no stream)
    return False


def _reembedded(g: _Graph, first: ResidualAdd, ahead: list[ResidualAdd], add_mask: int) -> bool:
    """The stream a norm's output starts (``first``, the add it is the skip of, then the adds of ``ahead``
    that take the previous one as their skip) ends in
    weighted ops that re-embed it for later residual adds, not in a norm: a downsampler's local residual
    block followed by its reduction conv (timm gcvit Downsample2d: ``norm1 -> x + f(x) -> conv``). The
    identity path across the stages is cut by that projection on purpose, so the norm before the local block
    loses nothing. In ``x = norm(x); x = x + f(x)`` repeated over a stack the stream goes on into the next
    block's norm (or to the head, with no residual add after it)."""
    last = first.node
    for _ in range(len(ahead)):
        nxt = next((a for a in ahead if g.strip(a.skip) is last), None)
        if nxt is None:
            break
        last = nxt.node
    todo, ends = [last], []
    for _ in range(64):
        if not todo:
            break
        n = todo.pop()
        for u in g._real_users(n):
            if g.is_alias(u) and u.args[0] is n:
                todo.append(u)
            else:
                ends.append(u)
    return bool(ends) and all(g.is_weighted(u) and u not in g.norm_nodes and g.desc[g.idx[u]] & add_mask
                              for u in ends)


def _own_nodes(g: _Graph, info: "_SiteInfo") -> set[fx.Node]:
    """The nodes of a norm that may carry its result: output, gain/cast chain, claimed nodes."""
    return {info.out, info.rec.output} | set(info.rec.nodes) | g.site_chain.get(id(info.rec), set())


def _double_norms(g: _Graph, infos: list[_SiteInfo]) -> None:
    """Mark a norm whose output goes only into another norm (through casts, dropout and views)."""
    by_input: dict[fx.Node, list[_SiteInfo]] = defaultdict(list)
    for info in infos:
        for n in {info.rec.input, info.inp} - {None}:
            by_input[n].append(info)

    def belongs(u: fx.Node, other: _SiteInfo) -> bool:
        return u in other.rec.nodes or u is other.rec.output or owner(u, g.modules) == other.rec.site.module

    for info in infos:
        if info.out is None:
            continue
        node, target = info.out, None
        for _ in range(16):
            users = g._real_users(node)
            readers = [o for o in by_input.get(node, []) if o is not info]
            hit = next((o for o in readers if users and all(belongs(u, o) for u in users)), None)
            if hit is not None:
                target = hit
                break
            if len(users) != 1 or not g.is_alias(users[0]) or users[0].args[0] is not node:
                break
            node = users[0]
        if target is not None:
            info.rec.site.extra["feeds_norm"] = target.rec.site.module
            target.rec.site.extra["reads_norm"] = info.rec.site.module


def _key(info: _SiteInfo) -> str:
    s = info.rec.site
    return s.module + (f"#{s.call_index + 1}" if s.call_index else "")


def _model_facts(g: _Graph, adds: list[ResidualAdd], residual: dict[fx.Node, ResidualAdd], infos: list[_SiteInfo],
                 model: ModelFacts, candidates: set[str]) -> None:
    model.num_residual_adds = len(adds)
    model.parallel_residual = any(a.parallel for a in adds)
    # blocks, in graph order of their first norm or add
    order: dict[str, int] = {}
    for info in infos:
        if info.block is not None and info.out is not None:
            order.setdefault(info.block, g.idx[info.out])
    for a in adds:
        if a.block is not None:
            order[a.block] = min(order.get(a.block, g.idx[a.node]), g.idx[a.node])
    blocks: dict[str, Block] = {}
    for path in sorted(order, key=lambda p: order[p]):
        mod = g.modules.get(path)
        blocks[path] = Block(path=path, class_name=type(mod).__name__ if mod is not None else "?")
    for info in sorted((i for i in infos if i.out is not None), key=lambda i: g.idx[i.out]):
        if info.block in blocks:
            blocks[info.block].norms[_key(info)] = info.placement  # type: ignore[assignment]
    model.blocks = list(blocks.values())
    add_sizes: dict[str, set[int]] = defaultdict(set)
    for a in adds:
        size = _numel(a.node)
        if a.block is not None and size is not None:
            add_sizes[a.block].add(size)
    _mark_mixed(model.blocks, infos, add_sizes)

    roles: set[str] = set()
    for b in model.blocks:
        roles |= {p for p in b.norms.values() if p in BLOCK_ROLES}
    if not model.blocks:
        roles = {i.placement for i in infos if i.placement in BLOCK_ROLES}
    if "pre" in roles and "post" in roles:
        # pre norms that say nothing about the scheme: one feeding a projection shortcut is ``pre`` whichever
        # scheme its class follows (_mark_mixed), one deep inside a branch (conv -> BN) leaves the stream be
        settled = {i.placement for i in infos if i.placement in BLOCK_ROLES and not i.feeds_shortcut
                   and i.rec.site.extra.get("branch_position") != "inner" and (i.block in blocks or not model.blocks)}
        roles = settled or roles
    mixed_blocks = any("majority_placement" in i.rec.site.extra for i in infos)
    if not adds:
        model.placement = "none"
        model.has_final_norm = None
        return
    if not roles:
        model.placement = "none" if all(i.placement == "none" for i in infos) else "unknown"
    elif mixed_blocks or ("pre" in roles and "post" in roles) or ("post" in roles and "sandwich" in roles):
        model.placement = "mixed"
    elif "sandwich" in roles:
        # a sandwich normalises the branch's input and its output (CogView, Gemma 2); norms that close the
        # branch while its input stays raw are res-post-norm (Swin V2), and a CNN's conv -> BN -> ReLU ->
        # conv -> BN branch (ResNet v1, x + BN(conv(...))) is that too: ``post``
        model.placement = "sandwich" if _branch_input_normed(infos) else "post"
    else:
        model.placement = "pre" if roles == {"pre"} else "post"
    # every stack's last residual add reaches a norm on the stream, and there is a closing norm
    stream_norm_inputs = {i.inp for i in infos if i.placement in ("final", "post", "embedding") and i.inp is not None}
    branch_norms: dict[fx.Node, list[_SiteInfo]] = defaultdict(list)
    for info in infos:
        for a in info.adds:
            branch_norms[a.node].append(info)
    ends_normed = True
    for a in adds:
        if not a.node.users and a.node.op == "call_method" and str(a.node.target).endswith("_"):
            continue  # x.add_(f(x)) under symbolic tracing: fx does not see the mutation flow on
        if not (g.desc[g.idx[a.node]] & g.output_mask):
            continue  # a second stream left unused after the loop (dead code under symbolic tracing)
        if _stream_reach(g, a.node, residual) or _normed_later(g, a.node, stream_norm_inputs):
            continue
        ends_normed = False
        consumer = _consumer(g, a.node)
        conv_head = _is_conv_module(g.modules.get(consumer)) and bool(g.desc[g.idx[a.node]] & g.output_mask)
        for info in branch_norms.get(a.node, []):
            info.rec.site.extra["unnormed_stream_end"] = consumer
            if conv_head:
                info.rec.site.extra["stream_end_conv"] = True
            info.rec.site.extra["stack_blocks"] = _stack_size(model.blocks, info.block)
    model.has_final_norm = ends_normed and any(i.placement == "final" for i in infos)


def _branch_input_normed(infos: list[_SiteInfo]) -> bool:
    """Some norm normalises the stream value a residual branch reads (``pre`` at ``branch_position``
    ``input``), as the first norm of a sandwich does; one that also feeds a projection shortcut (a ResNet
    stem's conv -> BN before the first block's 1x1 projection) is no evidence (``_SiteInfo.feeds_shortcut``)."""
    return any(i.placement == "pre" and i.rec.site.extra.get("branch_position") == "input" and not i.feeds_shortcut
               for i in infos)


def _consumer(g: _Graph, node: fx.Node) -> str:
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
            if path and not _inside(home, path) and not (mod is not None and not g.is_weighted(u) and not any(
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


def _stack_size(blocks: list[Block], block: Optional[str]) -> int:
    """How many blocks share ``block``'s container (``layers.3`` -> the blocks ``layers.*``); 0 without one."""
    if block is None:
        return 0
    parent = block.rpartition(".")[0]
    return sum(1 for b in blocks if b.path.rpartition(".")[0] == parent)


def _stack_pattern(path: str) -> str:
    """The stack a block belongs to: its container path with every layer index replaced by ``*``
    (``encoder.layers.3`` -> ``encoder.layers``, ``stages.1.blocks.0`` -> ``stages.*.blocks``), so the blocks of
    every stage of one backbone are peers while two stacks under different parents are not."""
    return ".".join("*" if p.isdigit() else p for p in path.split(".")[:-1])


def _numel(node: Optional[fx.Node]) -> Optional[int]:
    """How many elements the tensor ``node`` holds, from its shape metadata; None when unknown or symbolic."""
    dims = shape(node) if isinstance(node, fx.Node) else None
    if dims is None:
        return None
    try:
        return math.prod(int(d) for d in dims)
    except (TypeError, ValueError):
        return None


def _no_evidence(info: Optional[_SiteInfo], sizes: set[int]) -> bool:
    """Whether a norm's role says nothing about its block's residual-norm scheme (:func:`_mark_mixed`): it
    feeds a projection shortcut and the branch, reads a tensor that depends on no model input (the learned
    latents of a resampler's first layer), or reads another size than its block's residual adds."""
    return (getattr(info, "feeds_shortcut", False) or getattr(info, "reads_constant", False)
            or _off_stream(info, sizes))


def _off_stream(info: Optional[_SiteInfo], sizes: set[int]) -> bool:
    """The norm's input holds another number of elements than every residual add of its block: it cannot
    read that block's residual stream (a width-changing first layer), so its role says nothing about the
    block's residual-norm scheme. False when either size is unknown."""
    inp = getattr(info, "inp", None)
    size = _numel(inp) if inp is not None else None
    return bool(sizes) and size is not None and size not in sizes


def _normed_later(g: _Graph, node: fx.Node, norm_inputs: set[fx.Node]) -> bool:
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
            if (g.is_alias(u) or name in POOL_OPS or scaling or _is_pool_module(mod) or isinstance(mod, nn.Flatten) or
                    name in ("getitem", "select", "slice", "index", "index_select", "type_as", "mean", "amax",
                             "adaptive_avg_pool1d", "cat")):
                todo.append((u, projected))
            elif not projected and g.is_weighted(u) and (name in ("linear", "conv") or isinstance(
                    mod, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))):
                todo.append((u, True))
            elif _attention_pool(g, u, n, node):
                todo.append((u, False))  # pooled tokens: their output projection may come next
    return False


def _attention_pool(g: _Graph, attn: fx.Node, src: fx.Node, stream: fx.Node) -> bool:
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
            return _feeds_softmax(g, node) and not all(g.anc_or_eq(stream, a) for a in g.inputs[node])
        ins = [a for a in g.inputs[node] if a not in g.pderived and a not in g.const]
        if len(ins) != 1:
            return False
        node = ins[0]
    return False


def _mark_mixed(blocks: list[Block], infos: list[Any], add_sizes: Optional[dict[str, set[int]]] = None) -> None:
    """Flag norms whose role differs from the same norm in most blocks of the same class in the same stack
    (``_stack_pattern``: an audio encoder's layers and a projector's layers of one class are two stacks).
    A norm feeding a projection shortcut and the branch (``_SiteInfo.feeds_shortcut``) is no evidence
    either way: the blocks with an identity shortcut decide, and it is never flagged; nor is a norm reading a
    tensor computed from parameters only (``_SiteInfo.reads_constant``); nor is a norm whose
    input has another size than every residual add of its block (the first layer of FunASR's SenseVoice
    encoder normalises 560-wide stacked features and, its width changing, has no residual around it).
    ``add_sizes`` (block path -> element counts of its residual adds) None: sizes unknown, no norm is left out
    for its size (capture/repeats.py re-marks carried blocks without graph nodes, and falls back to the full
    capture when the model's mixed flags would change)."""
    add_sizes = add_sizes or {}
    by_key = {(_key(i)): i for i in infos}
    groups: dict[tuple, list[Block]] = defaultdict(list)
    for b in blocks:
        rel = tuple(k[len(b.path) + 1:] if k.startswith(b.path + ".") else k for k in b.norms)
        groups[(_stack_pattern(b.path), b.class_name, rel)].append(b)
    for (_, _, rel), all_members in groups.items():
        for pos, name in enumerate(rel):
            members = [b for b in all_members if not _no_evidence(by_key.get(list(b.norms)[pos]),
                                                                   add_sizes.get(b.path, set()))]
            if len(members) < 2:
                continue
            roles = [list(b.norms.values())[pos] for b in members]
            counts = Counter(STREAM_ROLES.get(r, r) for r in roles)
            if len(counts) < 2:
                continue
            top = max(counts.values())
            if list(counts.values()).count(top) > 1:
                continue  # a tie has no majority: which blocks differ is not known
            majority = next(r for r in roles if counts[STREAM_ROLES.get(r, r)] == top)
            for b, role in zip(members, roles):
                if STREAM_ROLES.get(role, role) != STREAM_ROLES.get(majority, majority):
                    info = by_key.get(list(b.norms)[pos])
                    if info is not None:
                        info.rec.site.extra["majority_placement"] = majority
                        info.rec.site.extra["majority_blocks"] = [
                            m.path for m, r in zip(members, roles)
                            if STREAM_ROLES.get(r, r) == STREAM_ROLES.get(majority, majority)]
