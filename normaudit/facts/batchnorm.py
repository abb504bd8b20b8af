"""BatchNorm/GroupNorm/InstanceNorm facts: which axis is treated as channels, how many values each channel's
statistics see, repeated calls, padded sequences, and GroupNorm groups against the configuration.

Per site (``site.channel_axes`` and ``site.batchnorm``, :class:`normaudit.report.BatchNormFacts`):

- ``channel_axes`` (BatchNorm, GroupNorm, InstanceNorm): the axis labels of the input's dim 1, the dim these
  norms keep one statistic (and one affine weight) per (PyTorch docs: ``(N, C, *)`` input). ``sequence``
  there means a ``(batch, seq, feature)`` tensor went straight into ``BatchNorm1d``.
- ``values_per_channel`` (BatchNorm): the number of values each channel's batch statistics are taken over in
  training at the audited micro-batch (``ctx.batch_size``): the product of the reduced dims' sizes, with
  the example batch replaced by the micro-batch. PyTorch raises ``Expected more than 1 value per channel when
  training`` when it is 1 (``torch.nn.functional._verify_batch_size``).
- ``calls_per_forward`` (BatchNorm): how many times the module runs in one forward (more than one: a shared
  BatchNorm inside an unrolled recurrent loop; its statistics then mix time steps, Cooijmans et al. 2016).
- ``padding_input`` (BatchNorm): the name of a model input that looks like a padding mask (``*mask*``,
  ``*lengths*``), when the norm's statistics cover the sequence axis.
- ``conv_input`` (BatchNorm, when the statistics cover the sequence axis): the convolution that produces the
  norm's input (a module path or an op name), looking back through layout and elementwise ops (transpose,
  activation, dropout, masking); None when the input is not a convolution's output (token features straight
  from the residual stream).
- ``conv_sibling`` (same condition): a convolution that reads the same tensor as the norm (the norm's input or
  a pass-through producer of it): the norm is the skip branch of a reparameterisable conv block (MobileOne,
  RepMixer: ``bn(x) + bn2(conv(x))``, folded into the conv at inference); None otherwise.
- ``model_input`` (same condition): the model input the norm reads through layout ops only (PANNs' and
  CLAP/HTSAT's ``bn0``: ``bn0(input_features.transpose(1, 3))``, a per-mel-bin standardisation of the raw
  features, not token features of the residual stream); None otherwise.

Model level (``model.groupnorm_config``): :func:`groupnorm_config_facts`, the configuration's GroupNorm
group counts that do not divide its channel counts, for a model that has GroupNorms. ``model.causal_attention``:
the first graph op that makes attention causal (``scaled_dot_product_attention(...,
is_causal=True)``, a ``tril``/``triu`` mask, a lower-triangular comparison of position indices as
transformers' ``masking_utils`` builds it), else None; computed only for a model with a BatchNorm over the
sequence axis.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Callable, Iterable, Optional

from torch import fx

from normaudit.facts.axes import flat_labels
from normaudit.facts.context import FactContext, Facts
from normaudit.report import GroupNormProblem, ModelFacts
from normaudit.vocabulary.graph import shape


CHANNELWISE = ("BatchNorm", "GroupNorm", "InstanceNorm")

#: configuration keys naming the number of GroupNorm groups (diffusers, HF, timm, LDM/openai UNet configs)
GROUP_KEYS = ("norm_num_groups", "resnet_groups", "num_groups", "norm_groups", "group_norm_groups",
              "num_norm_groups", "gn_groups", "groupnorm_groups", "num_group_norm_groups")
#: keys naming the channel counts those GroupNorms see: lists, or single counts
CHANNEL_LIST_KEYS = ("block_out_channels", "hidden_sizes", "channels", "channel_list", "encoder_channels",
                     "decoder_channels", "stage_channels", "widths")
CHANNEL_INT_KEYS = ("hidden_size", "out_channels", "model_channels", "base_channels", "ch", "width")
#: a base width times a list of multipliers (LDM ``ch``/``ch_mult``, openai ``model_channels``/``channel_mult``)
MULT_KEYS = (("model_channels", "channel_mult"), ("base_channels", "channel_mult"), ("ch", "ch_mult"),
             ("base_channels", "channel_multipliers"))


def _find(mapping: Any, keys: Iterable[str]) -> Optional[tuple[str, Any, dict]]:
    """The first of ``keys`` present (not None) in ``mapping`` or a nested mapping: (key, value, the mapping)."""
    if not isinstance(mapping, dict):
        return None
    for key in keys:
        if mapping.get(key) is not None:
            return key, mapping[key], mapping
    for sub in mapping.values():
        if isinstance(sub, dict):
            found = _find(sub, keys)
            if found is not None:
                return found
    return None


def _as_int(v: Any) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def groupnorm_config_problems(config: Any) -> list[dict[str, Any]]:
    """GroupNorm group counts in ``config`` that do not divide the channel counts it declares.

    Reads a groups key (:data:`GROUP_KEYS`, e.g. ``norm_num_groups``) and, in the same (possibly nested)
    mapping or anywhere in ``config``, the channel counts: a list (:data:`CHANNEL_LIST_KEYS`, e.g.
    ``block_out_channels``), a base width times multipliers (:data:`MULT_KEYS`) or a single count
    (:data:`CHANNEL_INT_KEYS`). ``nn.GroupNorm(G, C)`` raises at construction unless ``C % G == 0``
    (PyTorch docs, Wu & He 2018), so this finds the fault from the configuration alone, before any model is
    built. Returns one dict per problem: ``groups_key``, ``groups``, ``channels_key``, ``channels`` (all the
    declared counts) and ``bad`` (those not divisible). Never raises; an empty list when nothing applies.

        >>> groupnorm_config_problems({"norm_num_groups": 32, "block_out_channels": [16, 64]})[0]["bad"]
        [16]
    """
    found = _find(config, GROUP_KEYS)
    if found is None:
        return []
    gkey, groups, where = found
    g = _as_int(groups)
    if g is None or g <= 0:
        return []
    candidates: list[tuple[str, list[int]]] = []
    for base_key, mult_key in MULT_KEYS:
        base, mult = where.get(base_key), where.get(mult_key)
        if _as_int(base) and isinstance(mult, (list, tuple)) and all(_as_int(m) for m in mult):
            candidates.append((f"{base_key}*{mult_key}", [_as_int(base) * _as_int(m) for m in mult]))
            break
    if not candidates:
        for scope in (where, config):
            lst = _find(scope, CHANNEL_LIST_KEYS)
            if lst is not None:
                key, value, _ = lst
                if isinstance(value, (list, tuple)):
                    ints = [_as_int(v) for v in value]
                    if ints and all(i is not None and i > 0 for i in ints):
                        candidates.append((key, ints))
                        break
                elif _as_int(value):
                    candidates.append((key, [_as_int(value)]))
                    break
    if not candidates:
        one = _find(where, CHANNEL_INT_KEYS)
        if one is not None and _as_int(one[1]) and _as_int(one[1]) > 0:
            candidates.append((one[0], [_as_int(one[1])]))
    out = []
    for key, channels in candidates:
        bad = [c for c in channels if c % g]
        if bad:
            out.append({"groups_key": gkey, "groups": g, "channels_key": key, "channels": channels, "bad": bad})
    return out


def groupnorm_config_facts(config: Any, sites: Iterable[Any]) -> list[dict[str, Any]]:
    """:func:`groupnorm_config_problems` of ``config`` that concern the model's GroupNorms: none without a
    GroupNorm site (a groups key alone, ``num_groups`` of grouped attention or convolutions, says nothing about
    a model that has no GroupNorm), and, where the sites' group counts are known, only a count one of them
    uses. ``sites``: :class:`normaudit.report.Site` objects.

        >>> from normaudit.report import Site
        >>> cfg = {"num_groups": 32, "hidden_size": 48}
        >>> ln = Site(module="ln", kind="LayerNorm", class_name="LayerNorm", detected_by="module")
        >>> groupnorm_config_facts(cfg, [ln])
        []
        >>> gn = Site(module="gn", kind="GroupNorm", class_name="GroupNorm", detected_by="module", num_groups=32)
        >>> [p["bad"] for p in groupnorm_config_facts(cfg, [gn])]
        [[48]]
    """
    groupnorms = [s for s in sites if s.kind == "GroupNorm"]
    if not groupnorms:
        return []
    counts = {s.num_groups for s in groupnorms if s.num_groups}
    return [p for p in groupnorm_config_problems(config) if not counts or p["groups"] in counts]


def _mask_input(ctx: Any) -> Optional[str]:
    """The name of a model input that looks like a padding mask or lengths, else None.

    Keyword inputs are named by their keys; positional ones by the forward's parameters they bind to
    (:func:`_positional_names`), then the graph's placeholders: a capture that baked an input into the graph
    as a constant (export retried with constants after a data-dependent size, ``x[:, :lengths.max()]``) has no
    placeholder for it, yet the model still takes it."""
    names: list[str] = []
    inputs = ctx.inputs
    if isinstance(inputs, dict):
        names = list(inputs)
    else:
        names = _positional_names(getattr(ctx.cap, "root", None), inputs)
        if ctx.cap is not None and ctx.cap.gm is not None:
            names += [n for n in ctx.cap.user_inputs if n not in names]
    for n in names:
        low = n.lower()
        if "mask" in low or "length" in low or low.endswith("lens"):
            return n
    return None


def _positional_names(model: Any, inputs: Any) -> list[str]:
    """The names of the forward parameters that positional ``inputs`` (a tuple) bind to, in order; [] when the
    signature cannot be read or does not bind them."""
    import inspect

    if model is None or not isinstance(inputs, (tuple, list)):
        return []
    try:
        return list(inspect.signature(model.forward).bind_partial(*inputs).arguments)
    except (TypeError, ValueError):
        return []


def analyse(ctx: Any, records: list, model: ModelFacts, env: dict[fx.Node, Any]) -> None:
    """Fill the facts of the module docstring on ``records`` (``SiteRecord``) and ``model``.

    ``env`` is the axis pass's node -> labels map (:func:`normaudit.facts.axes.label_graph`); ``ctx`` a
    :class:`normaudit.facts.FactContext` (reads ``batch_size``, ``train_error``, ``config``, ``inputs``).
    """
    micro = ctx.batch_size
    calls = Counter(r.site.module for r in records if r.site.kind == "BatchNorm")
    example_batch = _example_batch(ctx)
    mask = None
    causal_looked_for = False
    for rec in records:
        s = rec.site
        if s.kind not in CHANNELWISE:
            continue
        labels = env.get(rec.input) if rec.input is not None else None
        if isinstance(labels, list) and len(labels) > 1:
            # a hand-written GroupNorm's channels: the dim its per-channel affine scales, not always dim 1
            dim = s.group_split.channel_dim if s.group_split is not None and s.group_split.channel_dim else 1
            s.channel_axes = flat_labels([labels[dim if dim < len(labels) else 1]])  # type: ignore[assignment]
        if s.kind != "BatchNorm":
            continue
        s.batchnorm.calls_per_forward = calls[s.module]
        shp = s.input_shape or (list(shape(rec.input)) if rec.input is not None and shape(rec.input) else None)
        s.batchnorm.eval_statistics = eval_statistics(s, getattr(rec, "module_obj", None))
        if s.batchnorm.eval_statistics == "batch" and shp and s.reduced_dims is not None:
            s.batchnorm.eval_values_at_batch_one = int(math.prod(shp[d] for d in s.reduced_dims
                                                                 if 0 < d < len(shp)))
        if shp and s.reduced_dims is not None:
            values = math.prod(shp[d] for d in s.reduced_dims if d < len(shp))
            if micro and example_batch and "batch" in (s.normalized_axes or []) and values % example_batch == 0:
                values = values // example_batch * int(micro)
            s.batchnorm.values_per_channel = int(values)
            if values == 1 and s.training:
                texts = [ctx.train_error] + [a.error for a in getattr(ctx.cap, "attempts", [])]
                raised = next((m for m in map(_one_value_error, texts) if m), None)
                if raised is None and micro:
                    raised = (f"Expected more than 1 value per channel when training, got input size "
                              f"torch.Size({[int(micro)] + list(shp[1:])})")
                s.batchnorm.train_error = raised
        if "sequence" in (s.normalized_axes or []):
            if mask is None:
                mask = _mask_input(ctx) or ""
            s.batchnorm.padding_input = mask or None
            modules = _modules(ctx)
            s.batchnorm.conv_input = conv_source(rec.input, modules)
            s.batchnorm.conv_sibling = conv_sibling(rec.input, modules)
            s.batchnorm.model_input = input_source(rec.input, modules)
            if not causal_looked_for:
                model.causal_attention = causal_op(ctx.cap.gm.graph if ctx.cap and ctx.cap.gm else None)
                causal_looked_for = True


def eval_statistics(site: Any, mod: Any) -> Optional[str]:
    """What a BatchNorm site normalises with in eval mode: ``batch`` when it has no running averages, else
    ``running``; None when the site does not say (a BatchNorm found by its class name alone).

    A module with ``running_mean``/``running_var`` attributes (torch.nn BatchNorm and its subclasses) decides
    by its buffers, as ``_BatchNorm.forward`` does: in eval it passes ``training=True`` to ``F.batch_norm``
    exactly when both are None (``track_running_stats=False`` at construction registers them as None; the
    flag turned off afterwards keeps the buffers, which eval then uses: PyTorch BatchNorm docs). Otherwise a
    functional ``batch_norm`` given no running buffers (``site.track_running_stats`` False) can only use the
    batch's."""
    if mod is not None and hasattr(mod, "running_mean") and hasattr(mod, "running_var"):
        return "batch" if mod.running_mean is None and mod.running_var is None else "running"
    if site.track_running_stats is None:
        return None
    return "running" if site.track_running_stats else "batch"


#: ops a convolution's output passes through on its way to the norm without ceasing to be a conv map
_PASS_THROUGH = re.compile(r"(transpose|permute|view|reshape|contiguous|clone|dropout|relu|gelu|silu|glu|swish|"
                           r"sigmoid|tanh|hardtanh|elu|mish|masked_fill|squeeze|unsqueeze|flatten|type_as|"
                           r"^to$|^to\.|float|^mul|_to_copy|alias|detach|expand)")


def _modules(ctx: Any) -> dict[str, Any]:
    """Module path -> module of the captured graph module (empty without one)."""
    gm = ctx.cap.gm if ctx.cap is not None else None
    return dict(gm.named_modules()) if gm is not None else {}


def _op_name(node: fx.Node, modules: dict[str, Any]) -> str:
    """A node's op as a lower-case name: the module class for call_module, else the target's name."""
    if node.op == "call_module":
        return type(modules.get(str(node.target))).__name__.lower()
    target = node.target
    return str(getattr(target, "__name__", target)).lower()


def _origin(node: Optional[fx.Node], modules: dict[str, Any], depth: int = 12,
            stop: Callable[[str], bool] = lambda name: False) -> Optional[fx.Node]:
    """The first node at or above ``node`` that is no pass-through op, following the first tensor argument:
    a graph input, constant or output, a module with parameters, an op :data:`_PASS_THROUGH` does not match
    (parameter-free modules such as activations and dropout count as pass-through), or an op whose name
    ``stop`` accepts; None when ``depth`` steps meet none. Never raises."""
    for _ in range(depth):
        if not isinstance(node, fx.Node):
            return None
        if node.op in ("placeholder", "get_attr", "output"):
            return node
        name = _op_name(node, modules)
        mod = modules.get(str(node.target)) if node.op == "call_module" else None
        if stop(name) or (mod is not None and next(mod.parameters(), None) is not None) or (
                mod is None and not _PASS_THROUGH.search(name)):
            return node
        node = next((a for a in node.args if isinstance(a, fx.Node)), None)
    return None


def conv_source(node: Optional[fx.Node], modules: dict[str, Any], depth: int = 12) -> Optional[str]:
    """The convolution whose output reaches ``node`` through pass-through ops only (:func:`_origin`), as its
    module path (call_module) or op name; None when the chain meets any other op (a linear layer, an add, a
    graph input) within ``depth`` steps. Never raises."""
    origin = _origin(node, modules, depth, stop=lambda name: "conv" in name)
    if origin is None or origin.op in ("placeholder", "get_attr", "output"):
        return None
    name = _op_name(origin, modules)
    if "conv" not in name:
        return None
    return str(origin.target) if origin.op == "call_module" else name


def input_source(node: Optional[fx.Node], modules: dict[str, Any], depth: int = 12) -> Optional[str]:
    """The name of the graph input (placeholder) that reaches ``node`` through pass-through ops only
    (:func:`_origin`); None when the chain meets a module with parameters (an embedding, a linear or conv
    layer) or any other op within ``depth`` steps. Never raises."""
    origin = _origin(node, modules, depth)
    return str(origin.name) if origin is not None and origin.op == "placeholder" else None


def conv_sibling(node: Optional[fx.Node], modules: dict[str, Any], depth: int = 4) -> Optional[str]:
    """A convolution (module path or op name) that reads ``node`` or one of its producers reached through
    pass-through ops (:data:`_PASS_THROUGH`, first tensor argument, up to ``depth`` steps); None when there is
    none. Never raises."""
    for _ in range(depth):
        if not isinstance(node, fx.Node):
            return None
        for user in node.users:
            if user.op in ("call_module", "call_function", "call_method") and "conv" in _op_name(user, modules):
                return str(user.target) if user.op == "call_module" else _op_name(user, modules)
        if node.op in ("placeholder", "get_attr") or not _PASS_THROUGH.search(_op_name(node, modules)):
            return None
        node = next((a for a in node.args if isinstance(a, fx.Node)), None)
    return None


def causal_op(graph: Optional[fx.Graph]) -> Optional[str]:
    """The first op of ``graph`` that makes attention causal: ``scaled_dot_product_attention`` called with
    ``is_causal=True`` (keyword, or the 6th positional argument of PyTorch's (query, key, value, attn_mask,
    dropout_p, is_causal)), a ``tril``/``triu`` (the usual causal mask), or a comparison of position indices whose
    value is lower-triangular (:func:`_lower_triangular`); None when there is none or no graph."""
    if graph is None:
        return None
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name = str(getattr(node.target, "__name__", node.target)).lower()
        if "scaled_dot_product_attention" in name:
            causal = node.kwargs.get("is_causal", node.args[5] if len(node.args) > 5 else False)
            if causal is True:
                return "scaled_dot_product_attention(is_causal=True)"
        elif re.search(r"(^|\.)(tril|triu)(_|\.|$)", name):
            return name.split(".")[0]
        elif _COMPARE.search(name) and _lower_triangular(node):
            return f"a causal mask: position comparison {name.split('.')[0]} (key index <= query index)"
    return None


#: comparisons of two tensors (aten ``le.Tensor``, ``torch.le``, ``operator.le``, ``Tensor.le``)
_COMPARE = re.compile(r"(^|\.)(le|lt|ge|gt)(\.tensor|_|$)")
#: ops a position-index tensor is computed with: from ``arange`` through indexing, offsets and layout ops only
_POSITION_OPS = re.compile(r"(^|\.)(arange|add|sub|rsub|mul|neg|unsqueeze|view|reshape|expand|index|select|slice|"
                           r"to|_to_copy|type_as|clone|contiguous|alias|lift_fresh_copy|getitem|le|lt|ge|gt)"
                           r"(_|\.|$)")
_MAX_MASK_NUMEL = 1 << 20


def _lower_triangular(node: fx.Node) -> bool:
    """Whether the comparison ``node`` computes a causal mask from positions alone: both operands are computed
    from ``arange`` (and constants) only, and its value, evaluated for real on the graph's sizes, is
    ``key <= query`` broadcast over leading dims: ``mask[..., i, j] == (j <= i)`` with more than one query.
    This is how transformers' ``masking_utils`` builds causal masks (``causal_mask_function``: ``kv_idx <=
    q_idx`` over ``cache_position``); a bidirectional or sliding-window band is not lower-triangular."""
    import torch

    try:
        value = _evaluate(node, {}, 0)
    except Exception:  # noqa: BLE001 - anything not computable from positions alone is no causal mask here
        return False
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or value.dim() < 2 or value.shape[-2] < 2:
        return False
    q, k = value.shape[-2], value.shape[-1]
    offset = k - q  # a longer key axis (cached positions) puts the diagonal at j = i + offset
    want = torch.ones(q, k, dtype=torch.bool).tril(offset)
    return bool((value == want).all())


def _evaluate(arg: Any, memo: dict, depth: int) -> Any:
    """The concrete value of ``arg`` (an fx node, or a nest of them) when it is computed by
    :data:`_POSITION_OPS` from Python numbers only; raises ValueError otherwise (a model input, a parameter,
    any other op, more than 64 ops deep or more than 2**20 elements)."""
    import torch

    if isinstance(arg, (list, tuple)):
        return type(arg)(_evaluate(a, memo, depth) for a in arg)
    if not isinstance(arg, fx.Node):
        if isinstance(arg, torch.Tensor) or callable(arg):
            raise ValueError("not a position constant")
        return arg
    if arg in memo:
        return memo[arg]
    name = str(getattr(arg.target, "__name__", arg.target)).lower()
    if depth > 64 or arg.op not in ("call_function", "call_method") or not _POSITION_OPS.search(name):
        raise ValueError(f"not a position op: {arg.op} {name}")
    args = _evaluate(list(arg.args), memo, depth + 1)
    kwargs = {k: _evaluate(v, memo, depth + 1) for k, v in arg.kwargs.items() if k not in ("device", "pin_memory")}
    if "arange" in name:
        kwargs["device"] = "cpu"
    if arg.op == "call_method":
        value = getattr(args[0], arg.target)(*args[1:], **kwargs)
    else:
        value = arg.target(*args, **kwargs)
    if isinstance(value, torch.Tensor) and value.numel() > _MAX_MASK_NUMEL:
        raise ValueError("too large")
    memo[arg] = value
    return value


_ONE_VALUE = re.compile(r"Expected more than 1 value per channel when training, got input size "
                        r"torch\.Size\(\[[^\]]*\]\)")


def _one_value_error(text: Optional[str]) -> Optional[str]:
    """PyTorch's one-value-per-channel message out of a capture error (which may carry a traceback)."""
    if not text:
        return None
    m = _ONE_VALUE.search(text)
    return m.group(0) if m else None


def _example_batch(ctx: Any) -> Optional[int]:
    """The batch size of the example inputs (dim 0 of the first tensor input)."""
    import torch

    inputs = ctx.inputs
    first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else (inputs[0] if inputs else None)
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return int(first.shape[0])
    return None


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``batchnorm``: :func:`analyse` over the graph's sites, with the axis labels of its nodes."""
    analyse(ctx, facts.records, facts.model, facts.node_axes)


def run_groupnorm_config(ctx: FactContext, facts: Facts) -> None:
    """Pass ``groupnorm-config``: the configuration's GroupNorm group counts that do not divide the channels it
    declares (:func:`groupnorm_config_facts`), over every GroupNorm site of the whole model
    (``model.groupnorm_config``)."""
    facts.model.groupnorm_config = [GroupNormProblem(**p) for p in
                                    groupnorm_config_facts(ctx.config or {}, [r.site for r in facts.records])]
