"""The norms of a GGUF file, found by llama.cpp's own tensor names, and the hyperparameters its metadata holds.

Which tensors are norms comes from the ``gguf`` package, never from a table of ours: ``MODEL_TENSORS[arch]``
lists the tensor kinds an architecture has and ``TENSOR_NAMES`` their names (``blk.{bid}.attn_norm``); a kind
is a norm when the package calls it one (``ATTN_NORM``, ``ATTN_Q_NORM``, ``FFN_POST_NORM``, ``OUTPUT_NORM``...:
``NORM`` in its ``MODEL_TENSOR`` name). A file whose architecture the installed package does not know is searched
for the norm names of every architecture. Norm-named tensors that the file's architecture does not define are
listed apart (llama.cpp does not load them).

Each norm becomes a report site (:func:`gguf_sites`): its module the tensor name without ``.weight``/``.bias``
(``blk.0.attn_norm``), its gain and bias statistics those of any checkpoint
(:func:`normaudit.loaders.checkpoint.group_weight_stats`), its eps from ``<arch>.attention.layer_norm_rms_epsilon``
(RMSNorm) or ``<arch>.attention.layer_norm_epsilon`` (LayerNorm), its gain form ``weight``: llama.cpp multiplies
every norm's output by the stored gain, whatever the architecture (its converter stores Gemma's 1 + w).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from normaudit.loaders.gguf_file.reader import GgufFile

_SUFFIXES = (".weight", ".bias")


@dataclass
class GgufNorm:
    """One norm tensor group of a GGUF file: ``module`` the tensor name without its suffix (``blk.3.ffn_norm``),
    ``tensor`` the package's ``MODEL_TENSOR`` name (``FFN_NORM``), ``weight``/``bias`` the tensors' names."""

    module: str
    tensor: str
    weight: Optional[str] = None
    bias: Optional[str] = None

    @property
    def keys(self) -> list[str]:
        """The tensors of the norm: gain first."""
        return [k for k in (self.weight, self.bias) if k]


@dataclass
class Hparams:
    """What the metadata says of the model's shape and norms (None where the file has no usable value).

    ``head_count``/``head_count_kv`` may be per-block lists (some architectures store one per block);
    ``key_length`` the head width of q and k (``<arch>.attention.key_length``, else embedding_length /
    head_count); ``eps`` the eps of each kind with its key: ``{"RMSNorm": (key, value), "LayerNorm": ...}``."""

    architecture: Optional[str]
    block_count: Optional[int] = None
    embedding_length: Optional[int] = None
    head_count: Any = None
    head_count_kv: Any = None
    key_length: Optional[int] = None
    eps: dict[str, tuple[str, float]] = field(default_factory=dict)

    def heads(self, block: Optional[int], kv: bool) -> Optional[int]:
        """The head count (``kv``: of keys and values) of ``block`` (None: the first block)."""
        value = self.head_count_kv if kv else self.head_count
        if kv and value is None:
            value = self.head_count
        if isinstance(value, list):
            i = block or 0
            value = value[i] if 0 <= i < len(value) else None
        return _count(value)


def _count(value: Any) -> Optional[int]:
    """``value`` when it is a positive int (a count read from the file), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def hparams(gfile: GgufFile) -> Hparams:
    """The hyperparameters of ``gfile`` (:class:`Hparams`), read from its metadata keys as the ``gguf`` package
    spells them (``gguf.Keys``)."""
    keys = gfile._gguf.Keys
    arch = gfile.architecture
    hp = Hparams(architecture=arch)
    if arch is None:
        return hp
    key = lambda template: template.format(arch=arch)  # noqa: E731
    hp.block_count = _count(gfile.field(key(keys.LLM.BLOCK_COUNT)))
    hp.embedding_length = _count(gfile.field(key(keys.LLM.EMBEDDING_LENGTH)))
    hp.head_count = _heads(gfile.field(key(keys.Attention.HEAD_COUNT)))
    hp.head_count_kv = _heads(gfile.field(key(keys.Attention.HEAD_COUNT_KV)))
    hp.key_length = _count(gfile.field(key(keys.Attention.KEY_LENGTH)))
    first = hp.heads(None, kv=False)
    if hp.key_length is None and hp.embedding_length and first and hp.embedding_length % first == 0:
        hp.key_length = hp.embedding_length // first
    for kind, template in (("RMSNorm", keys.Attention.LAYERNORM_RMS_EPS), ("LayerNorm", keys.Attention.LAYERNORM_EPS)):
        value = gfile.field(key(template))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            hp.eps[kind] = (key(template), _shortest(gfile, key(template), float(value)))
    return hp


def _shortest(gfile: GgufFile, key: str, value: float) -> float:
    """``value`` as written before it was stored: a FLOAT32 field holds 1e-5 as 9.99999974e-06, and the shortest
    decimal that rounds to the same float32 is the number the converter wrote (numpy's ``str`` of a float32)."""
    import numpy as np

    if gfile.field_type(key) == "FLOAT32":
        return float(str(np.float32(value)))
    return value


def _heads(value: Any) -> Any:
    """A head count or a per-block list of them, as read (a list only when every entry is an int)."""
    if isinstance(value, list):
        return value if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value) else None
    return _count(value)


def _norm_patterns(gguf: Any, arch: Optional[str]) -> tuple[list[tuple[str, re.Pattern]], bool]:
    """([(MODEL_TENSOR name, name pattern)] of the norm tensor kinds of ``arch``, whether the package knows
    ``arch``); for an unknown one, the norm kinds of every architecture."""
    by_name = {name: a for a, name in gguf.MODEL_ARCH_NAMES.items()}
    known = arch in by_name
    kinds = gguf.MODEL_TENSORS[by_name[arch]] if known else list(gguf.TENSOR_NAMES)
    out, seen = [], set()
    for kind in kinds:
        name = gguf.TENSOR_NAMES.get(kind)
        if name is None or "NORM" not in kind.name or name in seen:
            continue
        seen.add(name)
        out.append((kind.name, re.compile(re.escape(name).replace(r"\{bid\}", r"(\d+)") + "$")))
    return out, known


def find_norms(gfile: GgufFile) -> tuple[list[GgufNorm], list[str], bool]:
    """(the norms of ``gfile`` in the file's order, the norm-named tensors its architecture does not define,
    whether the installed ``gguf`` package knows the architecture); see the module docstring."""
    patterns, known = _norm_patterns(gfile._gguf, gfile.architecture)
    norms: dict[str, GgufNorm] = {}
    unmapped = []
    for key in gfile.keys():
        stem, suffix = next(((key[: -len(s)], s) for s in _SUFFIXES if key.endswith(s)), (key, ""))
        kind = next((k for k, pattern in patterns if pattern.match(stem)), None)
        if kind is None or not suffix:
            if known and kind is None and "norm" in stem.rsplit(".", 1)[-1]:
                unmapped.append(key)
            continue
        norm = norms.setdefault(stem, GgufNorm(module=stem, tensor=kind))
        setattr(norm, suffix[1:], key)
    return [n for n in norms.values() if n.weight or n.bias], unmapped, known


class _Flat:
    """A view of a GGUF file whose tensors are 1-D (each flattened), so a stacked norm (StableLM's per-head q/k
    norms, ``(n_head, head_dim)``) gets the statistics of all its gains."""

    def __init__(self, gfile: GgufFile):
        self._f = gfile

    def shape(self, key: str) -> tuple[int, ...]:
        return (math.prod(self._f.shape(key)),)

    def get(self, key: str) -> Any:
        return self._f.get(key).reshape(-1)

    def prefetch(self, keys: Any) -> None:
        self._f.prefetch(keys)


def block_of(module: str) -> Optional[int]:
    """The block number of a GGUF tensor name (``blk.12.attn_norm`` -> 12), None outside the blocks."""
    m = re.match(r"^(?:[a-z]+\.)?blk\.(\d+)\.", module)
    return int(m.group(1)) if m else None


def _order(norms: list[GgufNorm]) -> Any:
    """The sort key of the sites: the norms before the first block (``token_embd_norm``), the blocks in numeric
    order (converters may write ``blk.10`` before ``blk.2``), then the rest (``output_norm``); the file's order
    within each."""
    index = {n.module: i for i, n in enumerate(norms)}
    first = min((i for n, i in index.items() if block_of(n) is not None), default=len(norms))

    def key(norm: GgufNorm) -> tuple[int, int, int]:
        block, i = block_of(norm.module), index[norm.module]
        return (1, block, i) if block is not None else (0 if i < first else 2, 0, i)

    return key


def _kind(norm: GgufNorm, hp: Hparams) -> tuple[str, str, Optional[tuple[str, float]]]:
    """(kind, the basis of the guess, (eps key, eps)) of a norm: a bias makes it a LayerNorm; else the eps the
    metadata declares (an RMS eps: RMSNorm; only a LayerNorm eps: LayerNorm); else RMSNorm (weight only)."""
    rms, ln = hp.eps.get("RMSNorm"), hp.eps.get("LayerNorm")
    if norm.bias:
        return "LayerNorm", "bias present", ln or rms
    if rms:
        return "RMSNorm", f"weight only, the file declares {rms[0]}", rms
    if ln:
        return "LayerNorm", f"the file declares {ln[0]} only", ln
    return "RMSNorm", "weight only, no bias", None


def gguf_sites(gfile: GgufFile, hp: Optional[Hparams] = None) -> tuple[list[Any], list[str], bool]:
    """(the report sites of ``gfile``'s norms, the norm-named tensors its architecture does not define, whether
    the architecture is known); each site with ``weights`` (gain and bias statistics, reading only those
    tensors), ``eps``, ``gain_form`` ``weight`` and ``gguf`` (:class:`normaudit.report.GgufFacts`)."""
    from normaudit.loaders.checkpoint import CheckpointNormGroup, group_weight_stats
    from normaudit.report import GgufFacts

    hp = hp or hparams(gfile)
    norms, unmapped, known = find_norms(gfile)
    sites = []
    for norm in sorted(norms, key=_order(norms)):
        shape = gfile.shape(norm.weight or norm.bias)
        reader = gfile if len(shape) <= 1 else _Flat(gfile)
        stats = group_weight_stats(reader, norm.keys, gain=norm.weight, bias=norm.bias)
        stats.shape = list(shape)
        kind, basis, eps = _kind(norm, hp)
        group = CheckpointNormGroup(module=norm.module, kind=kind, kind_basis=basis,
                                    num_features=shape[-1] if shape else 0, weights=stats)
        site = group.to_site()
        site.eps = eps[1] if eps else None
        site.gain_form = "weight"
        site.gguf = GgufFacts(tensor=norm.tensor, ggml_type=gfile.ggml_type(norm.weight or norm.bias),
                              eps_key=eps[0] if eps else None)
        sites.append(site)
    return sites, unmapped, known
