"""In-place norms that overwrite the caller's tensor.

``x = x.float(); x.mul_(torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))`` inside a norm's ``forward``
copies nothing when ``x`` already is float32: ``.float()`` returns the same tensor, so ``mul_`` overwrites the
caller's hidden states, and the residual add after the norm (``x + f(norm(x))``) adds the *normalised* tensor
instead of the stream. In bfloat16 the same ``.float()`` is a copy and the model is right, so the bug shows only
in some dtypes. Public reports: nano-vllm and vLLM RMSNorm kernels/paths writing the normalised result into
the residual's storage, and ports of Llama's RMSNorm that replaced ``x * rsqrt(...)`` by ``x.mul_(...)``.

Symbolic tracing does not model aliasing: an fx graph keeps reading the node from before the in-place op.
Two steps, both over the captured graph:

1. :func:`thread_inplace` (before site discovery): after an in-place method (``mul_``/``div_``/``sub_``/
   ``pow_``/... call_method nodes, or an ``out=`` argument), later reads of the very tensor it mutated are
   pointed at the in-place node instead: all of them when the mutating module made that tensor itself
   (``y = x - mean; y.div_(std); return y``: the caller reads the normalised ``y``), only the module's own
   when the tensor came from outside. The in-place method returns that same tensor object, so the graph
   computes exactly what it did; the norm's own dataflow (``weight * x`` after ``x.mul_``) then reaches its
   gain and its output. The caller's later reads of its own tensor are left as they are: step 2 reports them.
2. :func:`analyse` (after site discovery): for each site, the in-place ops its module runs on its input or
   on an alias of it (back through no-op casts ``.float()``/``.to(dtype)``/``.type_as`` whose input already
   has the target dtype in the audited graph, and ``.view``/``.reshape``/``.contiguous``/``.detach``/
   ``transpose``/``permute``/``unsqueeze``/``squeeze``/indexing, and earlier in-place ops); the nodes
   outside the norm that read that storage after the op (the residual add, another branch, the model's
   caller when it is a model input) are the consumers. Written as ``site.stream.inplace_alias``
   (:class:`normaudit.report.InplaceAlias`: ``op``, ``source``, ``consumers``, ``alias_dtypes``, ``casts``,
   ``caller_input``). ``alias_dtypes`` are the input dtypes for which every cast on the way is a no-op
   (no cast: every floating dtype; ``.float()``: float32 only).

A mutation of a parameter or buffer (a hand-written BatchNorm updating ``running_mean`` in place) is no
alias of an activation and is ignored; so is an in-place op on a tensor the norm made itself (a copy).

Under torch.export (``strict=False``, before decompositions) the in-place aten ops stay in the graph
(``aten.mul_.Tensor``; ``aten.mul.out`` with ``out=``; ``aten.to.dtype`` for a same-dtype ``.float()``), but
the graph follows storage, not names: after the norm's ``x.mul_(...)`` every later read of the caller's tensor
reads the in-place node, so the residual add reads the norm's result and the block looks post-LN / skip-from-
norm. :func:`untangle_export` (run by :func:`thread_inplace` on an aten graph) points those reads back at the
overwritten tensor: readers outside the module of an in-place result that is not the call's last node
directly; when the norm's output *is* the overwritten tensor (``x.to(dtype).mul_(self.weight)``), the graph
alone cannot tell the caller's reads of its ``x`` from reads of ``norm(x)``, so the parent module is traced
alone with the norm kept a leaf (:func:`caller_reads`) and the export readers matching the parent's reads of
the norm's argument (by op for the parent's own ops, by direct child module otherwise) are rewired. Then
:func:`analyse` works as on a traced graph. Not covered on export: a parent that cannot be traced alone
(data-dependent control flow) while the norm's output is the overwritten tensor (no finding, no rewiring),
and inline hand-written norms in a bigger forward (no module boundary in the export graph: their in-place
ops stay as export recorded them).
"""
from __future__ import annotations

import ast
import operator
from typing import Any, Optional

from torch import fx

from normaudit.facts.context import FactContext, Facts
from normaudit.loaders.pyfile import trace_frames
from normaudit.report import InplaceAlias
from normaudit.vocabulary.dtypes import AUDIT_DTYPES, dtype_name
from normaudit.vocabulary.graph import dtype, op_name, owner


#: in-place methods that only change flags or metadata, not values
_NOT_VALUES = {"requires_grad_", "retain_grad", "share_memory_", "resize_", "resize_as_", "set_",
               "record_stream", "pin_memory", "as_strided_", "rename_", "refine_names", "align_to"}
#: ops whose result shares storage with their first argument (given the same dtype for casts)
_VIEW_OPS = {"view", "view_as", "reshape", "reshape_as", "contiguous", "detach", "alias", "transpose",
             "permute", "unsqueeze", "squeeze", "expand", "expand_as", "flatten", "unflatten", "narrow",
             "select", "movedim", "getitem", "unfold", "as_strided", "diagonal", "split", "chunk", "unbind"}
_CAST_METHODS = {"float", "half", "bfloat16", "double", "to", "type_as", "type"}
#: metadata reads: reading ``x.shape`` after the op reads no overwritten values
_METADATA = {"size", "dim", "numel", "stride", "getattr", "is_contiguous", "element_size", "data_ptr",
             "_assert_tensor_metadata", "sym_size", "sym_stride", "sym_numel"}
#: torch.export's placeholder prefixes for parameters, buffers and lifted constants (not activations)
_STATE_PREFIXES = ("p_", "b_", "c_")
#: ``x *= y`` and friends: in place on a tensor (fx rebinds ``x`` to the result, the caller's alias is not)
_PY_INPLACE = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.ipow,
               operator.imod, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift}


_AUG_OPS = {operator.add: ast.Add, operator.sub: ast.Sub, operator.mul: ast.Mult, operator.truediv: ast.Div,
            operator.floordiv: ast.FloorDiv, operator.pow: ast.Pow, operator.mod: ast.Mod}


def _code_line(node: fx.Node) -> Optional[str]:
    """The source text of the innermost frame outside torch/normaudit in the node's recorded stack trace."""
    frames = trace_frames(node.meta.get("stack_trace"))
    return frames[-1].code if frames and frames[-1].code else None


def mark_augmented(gm: fx.GraphModule) -> int:
    """Mark the nodes of augmented assignments on tensors (``x -= mean``, ``x *= torch.rsqrt(v + eps)``) as in
    place (``node.meta["normaudit"]["inplace"]``). A fx Proxy has no ``__isub__``, so symbolic tracing records
    ``x = x - mean`` although eager PyTorch runs ``Tensor.__isub__`` and overwrites ``x``; the recorded source
    line (an ``ast.AugAssign`` with the node's operator) is what tells them apart. Per line, the last node with
    that operator is the assignment. Returns the number marked."""
    last: dict = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _AUG_OPS and node.args and isinstance(node.args[0], fx.Node):
            trace = node.meta.get("stack_trace")
            if trace and dtype(node.args[0]) is not None:
                calls = tuple(str(v) for v in (node.meta.get("nn_module_stack") or {}).values())
                last[(trace, calls, node.target)] = node  # one statement, in one call of the module
    marked = 0
    for (trace, _calls, target), node in last.items():
        try:
            stmt = ast.parse(_code_line(node) or "").body
        except SyntaxError:
            continue
        if stmt and isinstance(stmt[0], ast.AugAssign) and isinstance(stmt[0].op, _AUG_OPS[target]):
            node.meta.setdefault("normaudit", {})["inplace"] = True
            marked += 1
    return marked


def is_inplace(node: fx.Node) -> bool:
    """Whether ``node`` overwrites the values of its first tensor argument (or of its ``out=`` tensor): a
    ``call_method`` named ``<op>_`` (``mul_``, ``copy_``, ``masked_fill_``), an augmented assignment on a
    tensor (``x *= s``: ``operator.imul``), or any call with ``out=``."""
    if isinstance(node.kwargs.get("out"), fx.Node) or (node.meta.get("normaudit") or {}).get("inplace"):
        return True
    if node.op == "call_function" and node.target in _PY_INPLACE:
        return bool(node.args) and isinstance(node.args[0], fx.Node) and dtype(node.args[0]) is not None
    if node.op == "call_function":
        name = _aten_name(node)  # torch.export keeps in-place aten ops (aten.mul_.Tensor) in its graph
        return name.endswith("_") and not name.startswith("_") and name not in _NOT_VALUES
    if node.op != "call_method":
        return False
    name = str(node.target)
    return name.endswith("_") and not name.startswith("_") and name not in _NOT_VALUES


def _aten_name(node: fx.Node) -> str:
    """The aten op's name without overload (``mul_`` for ``aten.mul_.Tensor``); '' for other targets."""
    packet = getattr(node.target, "_overloadpacket", None)
    return packet.__name__ if packet is not None else ""


def _mutated(node: fx.Node) -> Optional[fx.Node]:
    out = node.kwargs.get("out")
    if isinstance(out, fx.Node):
        return out
    first = node.args[0] if node.args else None
    return first if isinstance(first, fx.Node) else None


def _cast(node: fx.Node) -> bool:
    if node.op == "call_function":
        return _aten_name(node) in ("to", "type_as")  # aten.to.dtype returns self for the same dtype
    return node.op == "call_method" and str(node.target) in _CAST_METHODS


def _alias_step(node: fx.Node) -> Optional[fx.Node]:
    """The tensor ``node`` shares storage with (its first argument), or None when it is a fresh tensor: a
    cast to another dtype copies; a cast to the same dtype (in this graph) returns its input."""
    if isinstance(node.kwargs.get("out"), fx.Node):
        return node.kwargs["out"]  # ``torch.mul(x, r, out=x)`` returns its ``out`` tensor
    if node.op not in ("call_method", "call_function") or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    src = node.args[0]
    if is_inplace(node) and not isinstance(node.kwargs.get("out"), fx.Node):
        return src
    if _cast(node):
        if node.kwargs.get("copy") is True:
            return None
        a, b = dtype(src), dtype(node)
        return src if a is not None and a == b else None
    if node.op == "call_function" and node.target is operator.getitem:
        return src if op_name(src) in _VIEW_OPS or dtype(src) is not None else None
    name = str(node.target) if node.op == "call_method" else (_aten_name(node) or getattr(node.target, "__name__", ""))
    return src if name in _VIEW_OPS or op_name(node) in ("view", "transpose") else None


def _within(path: str, scope: str) -> bool:
    return scope == "" or path == scope or path.startswith(scope + ".")


def thread_inplace(gm: fx.GraphModule, modules: dict) -> int:
    """Point later reads of a tensor mutated in place at the in-place node, which returns that same tensor
    object, so the graph computes what it did. Rewired: every later read of a tensor the mutating module made
    itself (its output, read by the caller), and the mutating module's own later reads of a tensor made
    outside it; the caller's later reads of its own tensor stay (they are the aliasing :func:`analyse`
    reports). A torch.export graph (aten ops) goes to :func:`untangle_export` instead. Returns the number of
    reads rewired; recompiles ``gm`` when any."""
    if any(_aten_name(n) for n in gm.graph.nodes):
        return untangle_export(gm, modules)
    mark_augmented(gm)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    changed = 0
    for node in list(gm.graph.nodes):
        if not is_inplace(node):
            continue
        target, scope = _mutated(node), owner(node, modules)
        if target is None or target.op == "get_attr":
            continue  # a parameter/buffer update (running statistics) is no activation's dataflow
        own = target.op not in ("placeholder", "get_attr") and _within(owner(target, modules), scope)
        for user in list(target.users):
            if user is node or order.get(user, -1) <= order[node]:
                continue
            if own or (user.op != "output" and _within(owner(user, modules), scope)):
                user.replace_input_with(target, node)
                changed += 1
    if changed:
        gm.recompile()
    return changed


def _call_end(node: fx.Node, scope: str, modules: dict) -> fx.Node:
    """The last node of the contiguous run of ``scope``'s nodes holding ``node``: the module call's output."""
    end = node
    while end.next.op != "root" and end.next.op != "output" and _within(owner(end.next, modules), scope):
        end = end.next
    return end


def _reader_key(user: fx.Node, parent: str, modules: dict) -> Optional[tuple]:
    """``("op", name)`` for a reader computed by ``parent`` itself, ``("module", child)`` for one inside its
    direct child ``child``; None for a reader elsewhere."""
    where = owner(user, modules)
    if where == parent:
        return ("op", op_name(user))
    rest = where[len(parent) + 1:] if parent else where
    if parent and not where.startswith(parent + "."):
        return None
    return ("module", rest.split(".")[0]) if rest else None


def caller_reads(modules: dict, scope: str) -> Optional[set]:
    """What the caller of the module ``scope`` reads of the tensor it passed to it, after the call: the
    parent module symbolically traced alone, ``scope`` kept a leaf; the readers of the call's argument after
    the call, as :func:`_reader_key` keys, less those that also read the call's result (ambiguous). None when
    the parent does not trace (data-dependent control flow) or never calls ``scope`` with a tensor."""
    parent, _, name = scope.rpartition(".")
    module = modules.get(parent)
    if module is None or not name:
        return None

    class _Leaf(fx.Tracer):
        def is_leaf_module(self, m, qualified_name):
            return qualified_name == name or super().is_leaf_module(m, qualified_name)

    try:
        graph = _Leaf().trace(module)
    except Exception:  # noqa: BLE001 - a parent that cannot be traced alone: no answer, no finding
        return None
    order = {n: i for i, n in enumerate(graph.nodes)}
    keys: set = set()
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target == name]
    for call in calls:
        if not call.args or not isinstance(call.args[0], fx.Node):
            continue
        later = [u for u in call.args[0].users if order[u] > order[call]]
        def key(u):
            return ("module", str(u.target).split(".")[0]) if u.op == "call_module" else ("op", op_name(u))
        keys |= {key(u) for u in later} - {key(u) for u in call.users}
    return keys if calls else None


def untangle_export(gm: fx.GraphModule, modules: dict) -> int:
    """In a torch.export graph, point the caller's reads of a tensor a module overwrote in place back at
    that tensor, as the source reads it (the export graph follows storage: after ``x.mul_(...)`` inside a
    norm, every later read of the caller's ``x`` reads the in-place node). Rewired: outside readers of an
    in-place result (or no-op cast/view of one) that is not the module call's last node, and, when the call's
    output is itself the overwritten tensor, the readers :func:`caller_reads` names (the parent traced
    alone). :func:`analyse` then finds them as readers of the overwritten tensor, as on a traced graph.
    Parameters, buffers and constants (placeholders ``p_``/``b_``/``c_``) are left alone. Returns the
    number of reads rewired; recompiles ``gm`` when any."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    changed, cache = 0, {}
    for node in list(gm.graph.nodes):
        target = _mutated(node) if _aten_name(node) and is_inplace(node) else None
        if target is None:
            continue
        scope = owner(node, modules)
        root, _ = _root(target)
        if root.op == "get_attr" or (root.op == "placeholder" and root.name.startswith(_STATE_PREFIXES)):
            continue
        if not scope or (root.op != "placeholder" and _within(owner(root, modules), scope)):
            continue  # a tensor the module made itself
        end = _call_end(node, scope, modules)
        for alias in sorted(_aliases(root), key=order.get):
            if alias is root or order[alias] < order[node] or not _within(owner(alias, modules), scope):
                continue
            for user in list(alias.users):
                if _within(owner(user, modules), scope) or user.op == "output":
                    continue
                if alias is end:
                    if scope not in cache:
                        cache[scope] = caller_reads(modules, scope) or set()
                    parent = scope.rpartition(".")[0]
                    if _reader_key(user, parent, modules) not in cache[scope]:
                        continue
                user.replace_input_with(alias, root)
                changed += 1
    if changed:
        gm.recompile()
    return changed


def _root(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The tensor whose storage ``node`` writes to, and the casts passed on the way back."""
    casts: list[fx.Node] = []
    seen = 0
    while seen < 64:
        src = _alias_step(node)
        if src is None:
            break
        if _cast(node):
            casts.append(node)
        node, seen = src, seen + 1
    return node, casts


def _aliases(root: fx.Node) -> set:
    """Every node sharing storage with ``root``: ``root`` and the views, no-op casts and in-place results of it."""
    out, todo = {root}, [root]
    while todo:
        n = todo.pop()
        for u in n.users:
            if u not in out and _alias_step(u) is n:
                out.add(u)
                todo.append(u)
    return out


def _line(node: fx.Node) -> Optional[dict]:
    from normaudit.facts.sites import location

    loc = location(node)
    return {"file": loc.file, "line": loc.line} if loc is not None else None


def _alias_dtypes(casts: list[fx.Node]) -> list[str]:
    targets = {dtype_name(dtype(c)) for c in casts if dtype(c) is not None}
    if not casts:
        return list(AUDIT_DTYPES)
    return sorted(targets) if len(targets) == 1 else []


def _related(node: fx.Node, rec: Any, budget: int = 64) -> bool:
    """An in-place op of an inline norm (a functional or hand-written norm inside a larger forward) belongs
    to it when it is one of its nodes or applies its statistic (found among the op's other inputs, looking
    back at most ``budget`` nodes)."""
    if node in rec.nodes:
        return True
    todo = [a for a in node.all_input_nodes if a is not _mutated(node)]
    visited: set = set()
    while todo and len(visited) < budget:
        n = todo.pop()
        if n in visited:
            continue
        visited.add(n)
        if n is rec.stat or n in rec.nodes:
            return True
        todo.extend(n.all_input_nodes)
    return False


def _consumers(root: fx.Node, after: int, scope: str, order: dict, modules: dict) -> list[fx.Node]:
    """Readers of ``root``'s storage outside ``scope`` that run after position ``after``, through the aliases
    made outside ``scope`` (an alias made inside the norm is its own business: its output)."""
    outside = [a for a in _aliases(root) if not _within(owner(a, modules), scope) or a is root]
    found = []
    for alias in outside:
        for user in alias.users:
            if order.get(user, -1) <= after or _within(owner(user, modules), scope):
                continue
            if user.op != "output" and (op_name(user) in _METADATA or _alias_step(user) is alias):
                continue  # a shape read, or a further alias (its readers are visited through it)
            found.append(user)
    return sorted(set(found), key=order.get)


def _site_mutations(gm: fx.GraphModule, rec: Any, modules: dict) -> list[fx.Node]:
    scope = rec.site.module
    inline = rec.site.inline
    return [n for n in gm.graph.nodes if is_inplace(n) and _within(owner(n, modules), scope)
            and (not inline or _related(n, rec))]


def _describe(user: fx.Node, modules: dict) -> dict:
    name = "the model's output" if user.op == "output" else op_name(user)
    return {"module": owner(user, modules), "op": name, "source": _line(user)}


def site_alias(cap: Any, rec: Any, order: dict) -> Optional[dict]:
    """The first in-place op of ``rec``'s norm that overwrites a tensor made outside the norm (its input or
    an alias of it) while something outside reads that tensor afterwards; None when there is none.
    Keys: ``op`` (the method, ``mul_``), ``source`` (its line), ``mutated`` (the node name), ``consumers``,
    ``caller_input`` (the model input overwritten, or None), ``casts`` (the no-op casts on the way),
    ``alias_dtypes`` (input dtypes for which those casts copy nothing)."""
    modules, scope = cap.modules, rec.site.module
    for node in _site_mutations(cap.gm, rec, modules):
        target = _mutated(node)
        if target is None:
            continue
        root, casts = _root(target)
        if root.op == "get_attr" or (root.op != "placeholder" and _within(owner(root, modules), scope)):
            continue  # a parameter/buffer update, or a tensor the norm made itself
        if root.op == "placeholder" and root.name not in (cap.user_inputs or [root.name]):
            continue  # an exported parameter or buffer
        users = _consumers(root, order[node], scope, order, modules)
        caller = root.name if root.op == "placeholder" else None
        if not users and caller is None:
            continue
        name = (str(node.target) if node.op == "call_method" else f"{op_name(node)}(out=)"
                if isinstance(node.kwargs.get("out"), fx.Node) else _aten_name(node) or _code_line(node)
                or op_name(node))
        return {"op": name, "source": _line(node), "mutated": root.name,
                "consumers": [_describe(u, modules) for u in users], "caller_input": caller,
                "casts": [_aten_name(c) or str(c.target) for c in casts], "alias_dtypes": _alias_dtypes(casts)}
    return None


def analyse(cap: Any, records: list) -> None:
    """Write ``site.stream.inplace_alias`` (:func:`site_alias`) on every site whose norm overwrites a tensor
    read elsewhere afterwards. Symbolically traced graphs only (exported graphs are functional)."""
    if cap.gm is None or not any(is_inplace(n) for n in cap.gm.graph.nodes):
        return
    order = {n: i for i, n in enumerate(cap.gm.graph.nodes)}
    for rec in records:
        found = site_alias(cap, rec, order)
        if found is not None:
            rec.site.stream.inplace_alias = InplaceAlias(**found)


def run_dataflow(ctx: FactContext, facts: Facts) -> None:
    """Pass ``inplace-dataflow``: in-place ops read as dataflow inside their module (:func:`thread_inplace`),
    before any pass reads the graph."""
    thread_inplace(ctx.cap.gm, ctx.cap.modules)


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``aliasing``: :func:`analyse` over the graph's sites."""
    analyse(ctx.cap, facts.records)
