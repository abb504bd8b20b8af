"""Axis labels and the dims that carry them. A dimension (:data:`Dim`) is a tuple of *parts*,
``(names, size)`` from the outermost to the innermost, so a merged dimension remembers what it is made of; its
public label (:data:`Label`, :func:`dim_label`) is the tuple of its base names. Helpers build, resize and
read dims, and turn them into the labels the report shows (:func:`to_labels`, :func:`flat_labels`,
:func:`axes_text`)."""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

import torch


Label = tuple[str, ...]
UNK: Label = ("unknown",)
SPATIAL = ("height", "width", "depth")
#: token axes: a reshape that merges a fixed number of neighbouring tokens into the features marks the inner
#: piece :data:`PATCH` (see :func:`reshape_dims`)
TOKEN = ("batch", "sequence")
#: marks the inner piece of a spatial axis split by a reshape (``H -> (H/2, 2)``): an offset inside a patch or
#: window of fixed size; never a public label by itself (:func:`dim_label`)
PATCH = "patch"
#: One part of a dimension: its base names and its size.
Part = tuple[Label, int]
#: A dimension: its parts, outermost first (their sizes multiply to the dim's size).
Dim = tuple[Part, ...]


def named_dim(name: str, size: int) -> Dim:
    """A dim of one part: base name ``name``, size ``size``."""
    return (((name,), int(size)),)


def unknown_dim(size: int) -> Dim:
    """A dim of one ``unknown`` part of size ``size``."""
    return ((UNK, int(size)),)


def dim_size(d: Dim) -> int:
    """The size of a dim: the product of its parts' sizes."""
    return math.prod(p[1] for p in d)


def dim_names(parts: Iterable[Part]) -> list[str]:
    """The base names of some parts, in order, without repeats, ``unknown`` and :data:`PATCH`."""
    out: list[str] = []
    for names, _ in parts:
        for n in names:
            if n not in ("unknown", PATCH) and n not in out:
                out.append(n)
    return out


def dim_label(d: Dim) -> Label:
    """The public label of one dimension: its base names in order, ``("unknown",)`` when none is known.

    A dim merged from ``head`` and ``feature`` parts (attention heads merged back) is ``("feature",)``. A dim
    merged from channel/feature parts and spatial parts that are all offsets inside a fixed patch (the inner
    piece of a split spatial axis, :data:`PATCH`) is the channel/feature dim of a space-to-depth: Swin's
    patch merging ``reshape(B, H/2, 2, W/2, 2, C) -> (B, H/2, W/2, 4C)`` normalises ``4C`` channels whose
    size does not depend on the resolution (Liu et al. 2021, arXiv 2103.14030, section 3.1). Likewise a
    dim merged from channel/feature parts and batch/sequence parts that are all :data:`PATCH` pieces (a fixed
    number of neighbouring tokens, :func:`reshape_dims` with ``fixed``) is a channel/feature dim: Qwen2/3-VL's
    vision patch merger ``x.view(-1, hidden * merge**2)`` on packed patches ``(tokens, hidden)`` normalises
    ``4 * hidden`` features, a count set by the model, not by the input.
    """
    names = dim_names(d)
    if not names:
        return UNK
    if "feature" in names and set(names) <= {"head", "feature"}:
        return ("feature",)
    for axes in (SPATIAL, TOKEN):
        mixed = [p for p in d if set(p[0]) & set(axes)]
        if mixed and ({"channel", "feature"} & set(names)) and all(PATCH in p[0] for p in mixed):
            names = [n for n in names if n not in axes]
            if "head" in names and "feature" in names:
                names.remove("head")
    return tuple(names)


def is_unknown(d: Dim) -> bool:
    """No part of ``d`` has a known base name."""
    return not dim_names(d)


def resized(d: Dim, size: int) -> Dim:
    """The same axis at another size (a strided conv, a pool, a slice): parts merge when the size changes."""
    size = int(size)
    if dim_size(d) == size:
        return d
    names = tuple(dim_names(d)) or UNK
    return ((names, size),)


def same_dims(x: list[Dim], out_shape: Sequence[int]) -> list[Dim]:
    """Input dims carried to an output of the same rank, each resized to the output's size."""
    return [resized(d, s) for d, s in zip(x, out_shape)]


def unknown_dims(out_shape: Optional[Sequence[int]]) -> Optional[list[Dim]]:
    """One :func:`unknown_dim` per size of ``out_shape``; None for no shape."""
    return [unknown_dim(s) for s in out_shape] if out_shape is not None else None


def tensor_unknowns(t: Any) -> Any:
    """Unknown dims for a tensor value, a tuple of such for a tuple or list of values, None for anything else."""
    if isinstance(t, torch.Tensor):
        return [unknown_dim(s) for s in t.shape]
    if isinstance(t, (tuple, list)):
        return tuple(tensor_unknowns(u) for u in t)
    return None


def to_labels(dims: Any) -> Any:
    """Public labels from dims: a list of :data:`Label` per tensor (tuples for tuple outputs)."""
    if isinstance(dims, list):
        return [dim_label(d) for d in dims]
    if isinstance(dims, tuple):
        return tuple(to_labels(d) for d in dims)
    return None


def flat_labels(labels: Sequence[Label]) -> list[str]:
    """Base labels of some dims, in order, without repeats (``unknown`` only when nothing else is known).

    Dims that are attention heads of a split feature (``head`` together with ``feature``) read as
    ``feature``: normalising ``(head, feature)`` jointly is normalising the hidden features.
    """
    out: list[str] = []
    for lab in labels:
        for x in lab:
            if x not in out and x != "unknown":
                out.append(x)
    if "head" in out and "feature" in out:
        out.remove("head")
    if not out and labels:
        out = ["unknown"]
    return out


def axes_text(labels: Optional[Sequence[Label]]) -> Optional[list[str]]:
    """Readable per-dim labels: ``['batch', 'height*width', 'channel']``."""
    if labels is None:
        return None
    return ["*".join(lab) for lab in labels]


def product(xs: Iterable[int]) -> int:
    """The product of some sizes (1 for none)."""
    return math.prod(int(x) for x in xs)
