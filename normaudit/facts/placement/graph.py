"""The graph index the placement pass reads (:class:`StreamGraph`): topological indices,
ancestor/descendant bitsets, the parameters, the constants (nodes independent of the model inputs), the
nodes of norms and the weighted ops of one captured graph; and :func:`stream_strip`, a value seen through
the aliases the residual stream passes (casts, clones, dropout, views, overflow guards)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.facts.sites import SiteRecord
from normaudit.vocabulary.graph import NEUTRAL_OPS, op_name, owner, tensor_inputs
from normaudit.vocabulary.kinds import builtin_kind


#: value-preserving reshapes the stream may pass through between a norm/residual add and its user
VIEW_OPS = ("view", "permute", "transpose", "flatten", "unflatten", "squeeze", "unsqueeze", "movedim",
            "expand", "expand_as")
#: overflow guards that keep the stream's values (within range) and its shape: T5's float16
#: ``clamp(x, -c, c)`` between sublayers and before the final norm, ``nan_to_num``
GUARD_OPS = ("clamp", "clamp_", "clamp_min", "clamp_max", "clip", "nan_to_num")
#: pooling a projection shortcut may apply before its 1x1 conv (ResNet-D)
POOL_OPS = ("avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool1d", "max_pool2d", "max_pool3d",
            "adaptive_avg_pool2d")
#: elementwise arithmetic that, with a parameter operand, scales or shifts each element: no projection
GAIN_OPS = ("mul", "div", "add", "sub", "addcmul", "addcdiv")
#: parameter-free modules that pass the stream through unchanged (in eval mode, or up to scaling)
NEUTRAL_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
                   nn.Identity)


class StreamGraph:
    """Topological indices, ancestor/descendant bitsets, parameter and weighted-op sets of one graph."""

    def __init__(self, cap: Capture, records: list[SiteRecord]):
        self.cap = cap
        self.modules = cap.modules
        self.nodes: list[fx.Node] = list(cap.gm.graph.nodes)
        self.idx = {n: i for i, n in enumerate(self.nodes)}
        self.inputs = {n: [a for a in tensor_inputs(n) if tensorish(a)] for n in self.nodes}
        self._mark_parameters_and_constants(set(cap.user_inputs))
        self._mark_ancestry()
        self._mark_norms(records)
        self._mark_weighted()
        self._mark_mixing_and_output()

    def _mark_parameters_and_constants(self, user_inputs: set[str]) -> None:
        """``param``: the parameters (``get_attr`` of an ``nn.Parameter``, export's ``p_*`` placeholders);
        ``const``: nodes independent of the model inputs; ``pderived``: computed from parameters (and
        constants) only."""
        self.param: set[fx.Node] = set()
        for n in self.nodes:
            if n.op == "get_attr" and isinstance(_resolve_attr(self.cap.gm, str(n.target)), nn.Parameter):
                self.param.add(n)
            elif n.op == "placeholder" and n.name not in user_inputs and n.name.startswith("p_"):
                self.param.add(n)
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

    def _mark_ancestry(self) -> None:
        """``anc[i]`` and ``desc[i]``: bitsets of the strict ancestors and descendants of node ``i``."""
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

    def _mark_norms(self, records: list[SiteRecord]) -> None:
        """``norm_nodes``: the nodes claimed by a site, the gain/cast chain after it (``site_out``, the end of
        that chain, and ``site_chain`` by ``id`` of the record), and everything a leaf norm module owns."""
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

    def _mark_weighted(self) -> None:
        """``weighted_mask``: the weighted ops outside norms and constants, a ``call_module`` of a module with
        parameters (not a norm) or an op reading a tensor computed from parameters."""
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

    def _mark_mixing_and_output(self) -> None:
        """Bitsets of the output node and of parameter-free mixing ops (Fourier transforms, pooling)."""
        self.output_mask = self.mixing_mask = 0
        for i, n in enumerate(self.nodes):
            name = op_name(n).lower()
            if n.op == "output":
                self.output_mask |= 1 << i
            elif n not in self.const and ("fft" in name or "pool" in name or
                                          (n.op == "call_module" and is_pool_module(self.modules.get(str(n.target))))):
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


def is_pool_module(mod: Optional[nn.Module]) -> bool:
    """``mod`` is a torch.nn pooling module (average, max, adaptive; 1-D to 3-D)."""
    return isinstance(mod, (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
                            nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                            nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d))


def tensorish(node: fx.Node) -> bool:
    """``node`` carries a tensor (or a tuple holding one), by its recorded value; without one, a placeholder,
    a ``get_attr`` or a node with tensor metadata."""
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
