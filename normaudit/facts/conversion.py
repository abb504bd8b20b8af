"""Conversion facts of a GGUF file: each norm tensor against the Hugging Face config it was converted from.

The config's model (built on the meta device by :mod:`normaudit.loaders.hf`) is mapped onto llama.cpp's tensor
names with the ``gguf`` package's own map (``gguf.get_tensor_name_map(arch, n_blocks)``: HF module paths such as
``model.layers.{bid}.input_layernorm`` -> ``blk.{bid}.attn_norm``): :func:`reference_norms` lists the norms it
has under the names the file should use. :func:`compare` then writes, on each site's ``gguf``
(:class:`normaudit.report.GgufFacts`) and on ``model.gguf`` (:class:`normaudit.report.GgufModelFacts`):

- the eps the config's model uses for the norm (its module's ``eps``/``variance_epsilon``, else the config key
  :data:`normaudit.facts.eps.EPS_KEYS` names for its kind), against the file's ``site.eps`` (rule NC111);
- the reference module, its class and gain form (``gain_forms``: measured by
  :func:`normaudit.probes.gain_form.gain_form`), against the file's gains (rule NC112);
- the shapes the tensor may have (rule NC113): the reference parameter's own shape; without one, for q/k norms,
  a head's width, all heads' width or one row per head (StableLM's stacked per-head norms), from the config's
  ``num_attention_heads``/``num_key_value_heads``/``head_dim``, else from the file's own
  ``head_count``/``head_count_kv``/``key_length``;
- the reference norms the file lacks (rule NC114).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from normaudit.facts.eps import EPS_KEYS, find_eps_key
from normaudit.loaders.gguf_file import Hparams, block_of
from normaudit.report import GgufModelFacts, MissingNorm

#: llama.cpp's tensor kinds (``gguf.MODEL_TENSOR`` names) of the q and k norms, and which uses the kv head count
QK_TENSORS = {"ATTN_Q_NORM": False, "ATTN_K_NORM": True}
#: attribute names a norm module keeps its eps under (torch.nn, transformers' RMSNorms, hand-written ones)
_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads")
_KV_KEYS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads")
_WIDTH_KEYS = ("hidden_size", "d_model", "n_embd", "dim")


@dataclass
class ReferenceNorm:
    """A norm of the config's model under llama.cpp's name: ``stem`` the tensor name without ``.weight``
    (``blk.0.attn_q_norm``), ``tensor`` its ``MODEL_TENSOR`` name, ``module``/``class_name`` the module, ``shape``
    its own gain's shape (None when it keeps none itself: a ModuleList of per-head norms), ``eps`` its eps."""

    stem: str
    tensor: str
    module: str
    class_name: str
    shape: Optional[list[int]]
    eps: Optional[float]
    obj: Any = None


def _candidates(name: str) -> list[str]:
    """``name`` and the same path under other roots (``model.language_model.layers.0.x`` -> ``layers.0.x``,
    ``model.layers.0.x``): the name map knows each architecture's text model under its usual root."""
    parts = name.split(".")
    out = [name]
    for i in range(1, min(len(parts), 4)):
        rest = ".".join(parts[i:])
        out += [rest, "model." + rest]
    return out


def reference_norms(model: Any, name_map: Any) -> list[ReferenceNorm]:
    """The norms of ``model`` (an ``nn.Module``, on meta) that ``name_map`` (``gguf.TensorNameMap``) maps onto a
    norm tensor kind, in ``named_modules()`` order, one per llama.cpp name."""
    out: dict[str, ReferenceNorm] = {}
    for name, mod in model.named_modules():
        if not name:
            continue
        hit = next((r for r in (name_map.get_type_and_name(c) for c in _candidates(name)) if r is not None), None)
        if hit is None or "NORM" not in hit[0].name or hit[1] in out:
            continue
        weight = mod._parameters.get("weight") if hasattr(mod, "_parameters") else None
        eps = next((getattr(mod, a) for a in _EPS_ATTRS if isinstance(getattr(mod, a, None), (int, float))
                    and not isinstance(getattr(mod, a), bool)), None)
        out[hit[1]] = ReferenceNorm(stem=hit[1], tensor=hit[0].name, module=name, class_name=type(mod).__name__,
                                    shape=list(weight.shape) if weight is not None else None,
                                    eps=float(eps) if eps is not None else None, obj=mod)
    return list(out.values())


def _config_int(config: dict, keys: tuple[str, ...]) -> Optional[int]:
    """The first of ``keys`` holding a positive int at the top of ``config`` or in its ``text_config``."""
    for scope in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else {}):
        for key in keys:
            value = scope.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


@dataclass
class _Heads:
    """Head counts and head width of q and k, and where they were read (for messages)."""

    heads: Optional[int]
    kv: Optional[int]
    width: Optional[int]
    basis: str


def _config_heads(config: dict, source: str) -> Optional[_Heads]:
    heads = _config_int(config, _HEAD_KEYS)
    if heads is None:
        return None
    kv = _config_int(config, _KV_KEYS) or heads
    width = _config_int(config, ("head_dim",))
    hidden = _config_int(config, _WIDTH_KEYS)
    if width is None and hidden and hidden % heads == 0:
        width = hidden // heads
    return _Heads(heads, kv, width, f"{source}: {heads} attention heads, {kv} key/value heads of width {width}")


def _file_heads(hp: Hparams, block: Optional[int]) -> Optional[_Heads]:
    heads, kv = hp.heads(block, kv=False), hp.heads(block, kv=True)
    if heads is None or hp.key_length is None:
        return None
    arch = hp.architecture
    return _Heads(heads, kv, hp.key_length, f"the file's {arch}.attention.head_count {heads}, head_count_kv {kv} and "
                                            f"key width {hp.key_length}")


def qk_shapes(heads: _Heads, kv: bool) -> list[list[int]]:
    """The shapes a q (``kv`` False) or k norm's gain may have: one head's width, all (kv) heads' width, or one
    row per head.

    >>> qk_shapes(_Heads(32, 8, 128, ""), kv=True)
    [[128], [1024], [8, 128]]
    """
    n = heads.kv if kv else heads.heads
    if n is None or heads.width is None:
        return []
    return [[heads.width], [n * heads.width], [n, heads.width]]


def _config_eps(kind: str, ref: Optional[ReferenceNorm], config: dict, source: str) -> tuple[Optional[float], Optional[str]]:
    """(eps, where it was read) the config's model uses for a norm of ``kind``: the reference module's own eps,
    else the config key for the kind."""
    if ref is not None and ref.eps is not None:
        return ref.eps, f"{source} ({ref.class_name} {ref.module})"
    found = find_eps_key(config, EPS_KEYS.get(kind, EPS_KEYS["RMSNorm"]))
    if found is None:
        return None, None
    return found[1], f"{source}'s {found[0]}"


def compare(sites: list, facts: GgufModelFacts, hp: Hparams, config: Optional[dict], source: Optional[str],
            refs: Optional[list[ReferenceNorm]], gain_forms: dict[str, str]) -> None:
    """Write the conversion facts (see the module docstring) onto ``sites`` (each with ``gguf`` set) and
    ``facts``. ``config``/``source``: the HF config and its name (None without one); ``refs``: the config's norms
    (:func:`reference_norms`; None when its model could not be built); ``gain_forms``: class name -> gain form."""
    by_stem = {r.stem: r for r in refs or []}
    for site in sites:
        g = site.gguf
        ref = by_stem.get(site.module)
        if config is not None:
            g.config_eps, g.config_eps_source = _config_eps(site.kind, ref, config, source or "the config")
        if ref is not None:
            g.reference_module, g.reference_class = ref.module, ref.class_name
            g.reference_gain_form = gain_forms.get(ref.class_name, "unknown")
            if ref.shape is not None:
                g.expected_shapes = [ref.shape]
                g.shape_basis = f"{source} ({ref.class_name} {ref.module}.weight)"
                continue
        if g.tensor in QK_TENSORS:
            heads = (_config_heads(config, source or "the config") if config is not None else None) \
                or _file_heads(hp, block_of(site.module))
            if heads is not None:
                g.expected_shapes = qk_shapes(heads, QK_TENSORS[g.tensor])
                g.shape_basis = heads.basis
    if refs is not None:
        present = {s.module for s in sites}
        facts.missing_norms = [MissingNorm(module=r.stem, tensor=r.stem + ".weight", reference_module=r.module,
                                           reference_class=r.class_name) for r in refs if r.stem not in present]
