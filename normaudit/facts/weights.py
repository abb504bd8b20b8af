"""Weight facts: a checkpoint's norm parameters mapped onto the model's sites (``site.weights``), and the gain
form each site applies when the formula pass could not say (``site.gain_form``).

For each site the *model keys* are the ``state_dict`` names of its module's own parameters and persistent
buffers (``layers.0.input_layernorm.weight``); for a functional or hand-written norm inside a larger module,
only the 1-D ones the size of the normalised region. They are matched onto the checkpoint with
:meth:`normaudit.loaders.checkpoint.Checkpoint.align_keys` (exact, wrapper prefixes, one leading prefix), together
with the names the site does *not* have (``.bias`` of an RMSNorm, ``.scale``, ``.gamma``...), so that the
checkpoint's extra keys under the site's module are found too. Then ``site.weights``
(:class:`normaudit.report.WeightStats`, from :func:`normaudit.loaders.checkpoint.group_weight_stats` over every
checkpoint tensor of the site) carries:

- ``missing``: model keys the checkpoint lacks (``num_batches_tracked`` excepted: old checkpoints lack it and
  loading tolerates that), so they keep their initial values;
- ``renamed``: a checkpoint key that is most likely a missing parameter under another leaf name (a gain saved
  as ``scale`` where the model expects ``weight``): same role (gain or bias) and same shape;
- ``unexpected``: the other checkpoint keys under the module, which ``load_state_dict`` drops (an RMSNorm
  given a bias).

transformers renames ``LayerNorm.gamma``/``LayerNorm.beta`` to ``weight``/``bias`` when it loads (its "legacy"
conversion), so for a transformers model those count as matched.

Which parameter is the gain and which the bias (for the statistics, whatever the names: ``a_2``/``b_2``)
comes from the graph: the weight/bias argument of a functional norm call, else the first arithmetic use of the
parameter (``* p`` gain, ``+ p`` bias); names decide only where the graph shows no use. The same reading gives
the gain form fallback: a parameter reaching the output multiply directly is ``weight``, through ``1 + p``
``one_plus_weight`` (Gemma); built-in modules scale by ``weight`` (``none`` without affine parameters).
``site.formula.gain``, when the formula pass set it, wins; rules read ``site.formula.gain`` first.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from torch import fx, nn

from normaudit.facts.context import FactContext, Facts
from normaudit.report import ShapeMismatch, WeightStats
from normaudit.vocabulary.graph import FOLLOW, NEUTRAL_OPS, NORM_OPS, arg, forward_walk, op_name, scalar_operand


__all__ = ["GAIN_LEAVES", "BIAS_LEAVES", "param_roles", "site_param_names", "analyse"]

GAIN_LEAVES = ("weight", "gamma", "scale", "g")
BIAS_LEAVES = ("bias", "beta", "b")
STAT_LEAVES = ("running_mean", "running_var", "num_batches_tracked")
#: leaf names a norm's parameters are saved under; the ones a site lacks are asked of the checkpoint too
PROBE_LEAVES = ("weight", "gamma", "scale", "bias", "beta", *STAT_LEAVES)
_LEGACY = {"gamma": "weight", "beta": "bias"}
_PATH_OPS = NEUTRAL_OPS + ("view", "unsqueeze", "expand", "expand_as", "reshape", "getitem", "squeeze", "flatten")


def _fqn(module: str, name: str) -> str:
    return f"{module}.{name}" if module else name


def _numel(shape: Optional[list[int]]) -> Optional[int]:
    return math.prod(shape) if shape else None


def site_param_names(site: Any, mod: Optional[nn.Module]) -> list[str]:
    """Names (in ``mod``) of the parameters and persistent buffers that belong to ``site``."""
    if mod is None:
        return []
    persistent = [(n, b) for n, b in mod.named_buffers(recurse=False) if n not in mod._non_persistent_buffers_set]
    items = list(mod.named_parameters(recurse=False)) + persistent
    if site.detected_by in ("module", "module_walk"):
        return [n for n, _ in items]
    if site.kind == "L2Norm" and not site.affine_weight:
        return []  # a unit vector with no gain multiplied in owns none of its module's parameters
    size = _numel(site.normalized_shape) or site.num_channels
    split = getattr(site, "group_split", None)
    if split is not None and split.affine == "group":
        # a hand-written GroupNorm's per-group affine on the grouped view: (1, G, 1) or (G,), one value per group
        return [n for n, t in items if t.numel() == split.groups and sum(int(d) > 1 for d in t.shape) == 1]
    return [n for n, t in items if t.dim() == 1 and (size is None or t.numel() == size)]


class _AllParams:
    """A stand-in site for :func:`site_param_names`: every own parameter and persistent buffer of a module."""

    detected_by = "module"


class _ParamIndex:
    """The graph nodes that read each parameter: ``get_attr`` nodes by target (symbolic tracing); placeholders
    by name (torch.export names them ``p_``/``b_`` + the flattened path, ``m_`` first under normaudit's wrapper)."""

    def __init__(self, gm: Optional[fx.GraphModule], user_inputs: list[str]):
        self.by_key: dict[str, list[fx.Node]] = {}
        if gm is None:
            return
        users = set(user_inputs)
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                self.by_key.setdefault(str(node.target), []).append(node)
            elif node.op == "placeholder" and node.name not in users:
                self.by_key.setdefault(node.name, []).append(node)

    def nodes(self, fqn: str) -> list[fx.Node]:
        flat = fqn.replace(".", "_")
        keys = [fqn] + [f"{kind}_{wrap}{flat}" for kind in ("p", "b") for wrap in ("", "m_")]
        return [n for k in keys for n in self.by_key.get(k, [])]


def _norm_op_role(user: fx.Node, value: fx.Node) -> Optional[str]:
    """``gain``/``bias`` when ``value`` is the weight/bias argument of a functional norm call ``user``."""
    name = op_name(user)
    aten = hasattr(user.target, "_overloadpacket")
    if name in ("layer_norm", "rms_norm", "group_norm"):
        idx = (2, 3)
    elif name in ("batch_norm", "instance_norm"):
        idx = (1, 2) if aten else (3, 4)
    else:
        return None
    if arg(user, idx[0], "weight") is value:
        return "gain"
    if name != "rms_norm" and arg(user, idx[1], "bias") is value:
        return "bias"
    return None


def _role(node: fx.Node) -> tuple[Optional[str], Optional[str]]:
    """(``gain``/``bias``/None, gain form) of a parameter node: the weight/bias argument of a functional norm, or
    its first arithmetic use (``* p`` gain, ``* (1 + p)`` gain of the (1 + weight) form, ``+ p`` bias)."""
    plus_one = False

    def step(user: fx.Node, n: fx.Node) -> Any:
        nonlocal plus_one
        name = op_name(user)
        if name in NORM_OPS and not plus_one:
            role = _norm_op_role(user, n)
            if role:
                return role, "weight" if role == "gain" else None
        if name in _PATH_OPS:
            return FOLLOW
        if name == "add" and scalar_operand(user) == 1.0 and not plus_one:
            plus_one = True
            return FOLLOW
        if name in ("mul", "div"):
            return "gain", "one_plus_weight" if plus_one else "weight"
        return ("bias", None) if name in ("add", "sub") and not plus_one else None

    return forward_walk(node, step, depth=8) or (None, None)


def param_roles(site: Any, names: list[str], gm: Optional[fx.GraphModule] = None,
                user_inputs: Optional[list[str]] = None, index: Optional[_ParamIndex] = None
                ) -> tuple[dict[str, str], Optional[str]]:
    """({name: ``gain``|``bias``|``stat``}, gain form) of a site's parameters: by the graph where it shows a
    use, else by leaf name (``weight``/``gamma``/``scale``/``g`` gain, ``bias``/``beta``/``b`` bias).
    ``index``: a :class:`_ParamIndex` of ``gm`` built once for many sites."""
    index = index or _ParamIndex(gm, user_inputs or [])
    roles: dict[str, str] = {}
    form: Optional[str] = None
    builtin = site.detected_by in ("module", "module_walk") and site.class_name != "(checkpoint)"
    for name in names:
        if name in STAT_LEAVES:
            roles[name] = "stat"
            continue
        role = None
        if not builtin:
            for node in index.nodes(_fqn(site.module, name)):
                role, f = _role(node)
                if role == "gain" and form is None:
                    form = f
                if role:
                    break
        if role is None:
            role = "gain" if name in GAIN_LEAVES else "bias" if name in BIAS_LEAVES else None
        if role:
            roles[name] = role
    return roles, form


def _fallback_gain_form(site: Any, roles: dict[str, str], graph_form: Optional[str]) -> str:
    if site.detected_by == "module":
        return "weight" if site.affine_weight else "none"
    if graph_form:
        return graph_form
    if "gain" not in roles.values():
        return "none" if roles or site.affine_weight is False else "unknown"
    return "unknown"


def analyse(ctx: Any, records: list) -> list[str]:
    """Set ``site.gain_form`` on every record (the formula's gain where the formula pass knows it, else read from
    how the graph uses the site's parameters) and ``site.weights`` from ``ctx.checkpoint`` (when given).
    Returns notes for the report."""
    cap = ctx.cap
    gm = cap.gm
    user_inputs = list(getattr(cap, "user_inputs", []) or [])
    modules = cap.modules
    ckpt = getattr(ctx, "checkpoint", None)
    index = _ParamIndex(gm, user_inputs)
    per_site: list[tuple[Any, list[str], dict[str, str]]] = []
    for rec in records:
        site = rec.site
        known = site.formula is not None and site.formula.gain not in (None, "unknown")
        if known:
            site.gain_form = site.formula.gain
            if ckpt is None:
                continue
        names = site_param_names(site, modules.get(site.module))
        roles, graph_form = param_roles(site, names, gm, user_inputs, index)
        if not known:
            site.gain_form = _fallback_gain_form(site, roles, graph_form)
        per_site.append((site, names, roles))
    if ckpt is None:
        return []
    root = cap.root
    library = type(getattr(root, "config", None)).__module__.split(".")[0] == "transformers"
    model_shapes = {k: list(v.shape) for k, v in root.state_dict().items()}
    model_keys = list(model_shapes)
    # Names the site lacks are asked of the checkpoint only for a module that is the norm itself (all its own
    # parameters belong to the site): under a block calling F.layer_norm, an extra key is not the norm's.
    real = set(model_keys)
    probed: set[str] = set()
    for site, names, _ in per_site:
        mod = modules.get(site.module)
        own = site_param_names(_AllParams, mod) if mod is not None else []
        if mod is not None and sorted(own) == sorted(names):
            probed |= {_fqn(site.module, lf) for lf in PROBE_LEAVES} - real
    mapping, prefix_note = ckpt.align_keys(model_keys, optional=sorted(probed))
    mapping = {k: v for k, v in mapping.items() if k in real or k in probed}
    notes = []
    hits = sum(k in mapping for k in model_keys)
    if prefix_note:
        notes.append(f"checkpoint keys matched to the model's with a prefix: {prefix_note}")
    if model_keys and hits * 2 < len(model_keys):
        notes.append(f"only {hits} of the model's {len(model_keys)} state_dict keys were found in the checkpoint "
                     f"{ckpt.weights_path}: is it the checkpoint of this model?")
    for site, names, roles in per_site:
        ws = _site_weights(ckpt, site, names, roles, mapping, library, real)
        if ws is not None:
            ws.shape_mismatch = _shape_mismatch(ckpt, site, names, mapping, model_shapes)
            site.weights = ws
    return notes


def _shape_mismatch(ckpt, site, names: list[str], mapping: dict[str, str],
                    model_shapes: dict[str, list[int]]) -> list[ShapeMismatch]:
    """The site's parameters whose checkpoint tensor has another shape than the model's: ``load_state_dict``
    raises on them, and loaders that tolerate it (transformers' ``ignore_mismatched_sizes``, conversion scripts
    that copy what fits) leave the norm at its initial values or with a slice of another norm's gains."""
    out = []
    for n in names:
        key = _fqn(site.module, n)
        ck = mapping.get(key)
        if ck is None or key not in model_shapes:
            continue
        have = [int(d) for d in ckpt.shape(ck)]
        if have != model_shapes[key]:
            out.append(ShapeMismatch(key=key, checkpoint_key=ck, model_shape=model_shapes[key], checkpoint_shape=have))
    return out


def _site_weights(ckpt, site, names: list[str], roles: dict[str, str], mapping: dict[str, str],
                  library: bool, real: set[str]) -> Optional[WeightStats]:
    if not names and not any(_fqn(site.module, lf) in mapping for lf in PROBE_LEAVES):
        return None
    matched = {n: mapping[_fqn(site.module, n)] for n in names if _fqn(site.module, n) in mapping}
    extra = {lf: mapping[_fqn(site.module, lf)] for lf in PROBE_LEAVES
             if lf not in names and _fqn(site.module, lf) in mapping and _fqn(site.module, lf) not in real}
    missing = [n for n in names if n not in matched and n != "num_batches_tracked"]
    renamed: dict[str, str] = {}
    for n in list(missing):
        role = roles.get(n)
        if role not in ("gain", "bias"):
            continue
        leaves = ("weight", "gamma", "scale") if role == "gain" else ("bias", "beta")
        for lf in leaves:
            ck = extra.get(lf)
            if ck is None or ck in renamed:
                continue
            if library and _LEGACY.get(lf) == n and site.module.rsplit(".", 1)[-1] == "LayerNorm":
                matched[n] = ck  # transformers renames LayerNorm.gamma/beta on load
            else:
                renamed[ck] = _fqn(site.module, n)
            missing.remove(n)
            del extra[lf]
            break
    unexpected = list(extra.values())
    ckpt_keys = list(dict.fromkeys([*matched.values(), *renamed, *unexpected]))
    ckpt_keys = [k for k in ckpt_keys if len(ckpt.shape(k)) <= 1]
    gain_names = [n for n in names if roles.get(n) == "gain"]
    bias_names = [n for n in names if roles.get(n) == "bias"]
    gain_key = next((matched[n] for n in gain_names if n in matched),
                    next((ck for ck, mk in renamed.items() if mk.rsplit(".", 1)[-1] in gain_names), None))
    bias_key = next((matched[n] for n in bias_names if n in matched), None)
    if ckpt_keys:
        from normaudit.loaders.checkpoint import group_weight_stats

        eps = site.eps if site.kind == "BatchNorm" and isinstance(site.eps, (int, float)) else None
        ws = group_weight_stats(ckpt, ckpt_keys, gain=gain_key, bias=bias_key, eps=eps)
    else:
        ws = WeightStats(source="checkpoint", keys=[], bias_present=False)
    ws.missing = [_fqn(site.module, n) for n in missing]
    ws.unexpected = unexpected
    ws.renamed = renamed
    return ws


def run(ctx: FactContext, facts: Facts) -> None:
    """Pass ``weights``: :func:`analyse` over every site, its notes onto the report's."""
    facts.notes += analyse(ctx, facts.records)
