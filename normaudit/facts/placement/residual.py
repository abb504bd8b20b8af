"""Residual adds (:func:`find_residual_adds`) and the stream they carry (:func:`stream_reach`).

``add(a, b)`` (one shape on both sides and the result) is residual when ``b`` (the branch) is computed from
``a`` (the skip, seen through casts, dropout, clones, views and overflow guards such as ``clamp``) through
at least one *weighted* op (a linear/conv/embedding/matmul with a parameter, a ``call_module`` with
parameters) that is not part of a norm (He et al. 2016, arXiv 1512.03385, eq. 1).

- The branch may read an earlier value of the stream than the one it is added to
  (``x + attn(ln1(x)) + mlp(ln2(x))``): the skip's chain of residual adds is searched.
- A skip that is itself ``[norm](W(x))`` with a single weighted op ``W`` (a projection shortcut, He et al.
  2016, eq. 2; an elementwise gain such as ``x * mu`` is no projection), seen through poolings before or
  after ``W`` (also a pooling written as ``view`` + ``amax``), counts too; the shortcut is then a second
  branch. A pooled identity ``pool(x)`` is the skip ``x``.
- A sum of parallel one-layer branches of one input (``[norm](W_i(x))``, ``[norm](x)``, a low-rank adapter
  ``W x + B A x``) is no residual add: a re-parameterisation folds it into one layer.
- A branch without weights counts when a parameter-free mixing op (a Fourier transform, a pooling) computes
  it from the skip (``LayerNorm(x + fft(x).real)``).
- An add whose branch reads the skip only across residual adds already found is a long skip, not the stream
  (a position bias or value embedding shared by every layer, an outer ``x0 + s * LN(h)`` around the stack,
  U-Net/FPN skips).
- The add is *parallel* when its branch is a sum of weighted terms that read the same stream value, or when
  it reads an earlier stream value than its skip.

Known forms: ResNet-D's average-pooled projection shortcut (timm resnet.py, ``downsample_avg``); PoolFormer's
pooling token mixer (timm metaformer.py, ``Pooling``)."""
from __future__ import annotations

from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.placement.graph import POOL_OPS, StreamGraph, is_pool_module, tensorish
from normaudit.facts.placement.records import ResidualAdd
from normaudit.vocabulary.graph import dtype, op_name, reach, shape


# -- residual adds -------------------------------------------------------------------------------------------
def _same_shapes(*nodes: fx.Node) -> bool:
    shapes = [shape(n) for n in nodes]
    known = [s for s in shapes if s is not None]
    return all(s == known[0] for s in known)


def _through_pool(g: StreamGraph, node: Any) -> Any:
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
                (node.op == "call_module" and is_pool_module(g.modules.get(str(node.target)))):
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


def _shortcut_source(g: StreamGraph, skip: fx.Node) -> Optional[tuple[fx.Node, fx.Node]]:
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


def _terms(g: StreamGraph, branch: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> list[fx.Node]:
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


def find_residual_adds(g: StreamGraph) -> list[ResidualAdd]:
    """Every residual add of the graph, in graph order (see the module docstring).

    A residual connection is ``y = x + F(x)`` with a weighted residual function ``F`` (He et al. 2016,
    arXiv 1512.03385, eq. 1; a projection ``W_s x`` on the shortcut when shapes change, eq. 2); the
    Transformer wraps every sublayer in one (Vaswani et al. 2017, section 3.1).
    """
    found: dict[fx.Node, ResidualAdd] = {}
    res_mask = 0
    for n in g.nodes:
        ops = _add_operands(g, n)
        if ops is None:
            continue
        best = _identity_residual(g, n, ops, found, res_mask)
        if best is None:  # projection shortcut: both sides weighted from one stream value
            best = _projection_residual(g, n, ops, res_mask)
        if best is None:
            continue
        best.terms = _terms(g, best.branch, found)
        weighted_terms = [t for t in best.terms if g.weighted_between(best.reads, t)]
        best.parallel = len(weighted_terms) >= 2 or (best.reads is not best.skip_src and best.shortcut is None)
        found[n] = best
        res_mask |= 1 << g.idx[n]
    return list(found.values())


def _add_operands(g: StreamGraph, n: fx.Node) -> Optional[list[fx.Node]]:
    """The two operands of ``n`` when it is an add of two different tensors of its own shape outside any norm;
    else None."""
    if op_name(n) != "add" or n.op == "call_module" or n in g.norm_nodes:
        return None
    ops = [a for a in n.args[:2] if isinstance(a, fx.Node)]
    if len(ops) != 2 or ops[0] is ops[1] or not all(tensorish(a) for a in ops):
        return None
    if not _same_shapes(ops[0], ops[1], n):
        return None
    return ops


def _identity_residual(g: StreamGraph, n: fx.Node, ops: list[fx.Node], found: dict[fx.Node, ResidualAdd],
                       res_mask: int) -> Optional[ResidualAdd]:
    """The add ``n`` as ``skip + branch`` with the branch computed through weights (or a parameter-free mixing
    op) from the skip or an earlier value of its stream (back along the skip's residual adds in ``found``);
    when both operands qualify, the one whose branch reads the skip itself wins. None when neither does."""
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
    return best


def _projection_residual(g: StreamGraph, n: fx.Node, ops: list[fx.Node], res_mask: int) -> Optional[ResidualAdd]:
    """The add ``n`` as ``[norm](W(x)) + branch``: a projection shortcut ``W`` of a stream value ``x`` the
    branch is weighted from too (:func:`_shortcut_source`); not a sum of parallel one-layer branches of
    ``x``. None when neither operand is such a shortcut."""
    for skip, branch in ((ops[1], ops[0]), (ops[0], ops[1])):
        sc = _shortcut_source(g, skip)
        if sc is None:
            continue
        src, proj = sc
        if g.weighted_between(src, branch) and not g.anc_or_eq(proj, branch) and \
                not _long_skip(g, src, branch, res_mask) and not _parallel_projections(g, branch, src):
            return ResidualAdd(node=n, skip=skip, skip_src=g.strip(skip), branch=branch, reads=src, shortcut=proj)
    return None


def _parallel_projections(g: StreamGraph, branch: fx.Node, src: fx.Node) -> bool:
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


def _linear_chain(g: StreamGraph, node: fx.Node, src: fx.Node) -> bool:
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


def _long_skip(g: StreamGraph, src: fx.Node, branch: fx.Node, res_mask: int) -> bool:
    """The branch reads ``src`` only across residual adds already found: ``src`` is not the stream this add
    continues but a value re-injected later (a position bias or value embedding shared by every layer, an
    outer ``x0 + s * LN(h)`` around a whole stack, a U-Net/FPN long skip)."""
    j = g.idx[branch]
    return bool(g.desc[g.idx[src]] & (g.anc[j] | (1 << j)) & res_mask)


def _mixes(g: StreamGraph, src: fx.Node, branch: fx.Node) -> bool:
    """A parameter-free mixing op (a Fourier transform, a pooling) lies between ``src`` and ``branch``, and
    ``branch`` is not ``src`` seen through aliases: FNet's ``x + fft(x).real``, PoolFormer's pooling mixer."""
    if g.strip(branch) is src or not g.is_anc(src, branch):
        return False
    j = g.idx[branch]
    return bool(g.mixing_mask & g.desc[g.idx[src]] & (g.anc[j] | (1 << j)))


def stream_reach(g: StreamGraph, start: fx.Node, residual: dict[fx.Node, ResidualAdd]) -> list[ResidualAdd]:
    """Residual adds that take ``start`` forward as their skip (the stream), not through a branch."""
    def follow(u: fx.Node, n: fx.Node) -> bool:
        ra = residual.get(u)
        return ra is None or ra.skip is n  # reached through a branch: the stream ends here for this path

    return [ra for ra in (residual.get(u) for u in reach(start, follow)) if ra is not None]
