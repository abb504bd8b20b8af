"""Axis provenance: a label for every dimension of every tensor in the graph.

Model inputs are labelled by what they are (token ids -> ``(batch, sequence)``; images ->
``(batch, channel, height, width)``; audio or 1-D conv input -> ``(batch, channel, sequence)``; or as the
user declares with ``--input-axes``), and the labels are carried forward node by node through
permute/transpose/movedim, view/reshape/flatten/unflatten/squeeze/unsqueeze (merged and split axes),
convolution (channel axis), linear/matmul/einsum (feature axis), embedding, attention head split and merge,
scaled-dot-product attention, pooling/upsampling/padding, slicing, concatenation, split/chunk/unbind and
reductions, for both graph flavours (``call_module``/``call_method`` nodes of a symbolic trace and aten ops
of ``torch.export``). A site's ``normalized_axes`` is the set of labels of the dims its statistics reduce,
never a guess from comparing sizes.

Each dimension is a tuple of *parts*, ``(names, size)`` from the outermost to the innermost, so a merged
dimension remembers what it is made of: ``flatten(2)`` of an ``(N, C, 16, 16)`` tensor gives a last dim of
parts ``(("height",), 16), (("width",), 16)``; viewing it back as ``(16, 16)`` recovers ``height`` and
``width`` exactly, and ``view(B*S, D)`` followed by ``view(B, S, D)`` recovers ``batch`` and ``sequence``.
Splitting a ``feature`` dim in two (``view(B, S, H, D // H)``) gives ``head`` and ``feature``; merging
them back gives ``feature``. Sizes are used only to follow a reshape (which part goes where), which is
exactly how ``view`` itself lays out memory.

Public labels are tuples of base names (:data:`Label`), e.g. ``("batch",)``, ``("height", "width")``;
:func:`label_graph` returns them per node and stores them under ``node.meta["normaudit"]["axes"]``.

Example::

    >>> import torch
    >>> from torch import nn
    >>> from normaudit.capture import capture_model
    >>> m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(2))
    >>> cap = capture_model(m, (torch.randn(2, 3, 10, 10),), on_meta=False)
    >>> env = label_graph(cap)
    >>> axes_text(env[list(cap.gm.graph.nodes)[-2]])
    ['batch', 'channel', 'height*width']
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.vocabulary.graph import arg, op_name, reduction, shape, tensor_inputs, val

Label = tuple[str, ...]
UNK: Label = ("unknown",)
LETTERS = {"B": "batch", "N": "batch", "S": "sequence", "T": "sequence", "L": "sequence", "H": "height",
           "W": "width", "D": "depth", "C": "channel", "F": "feature", "E": "feature", "K": "head"}
BASE = ("batch", "sequence", "height", "width", "depth", "channel", "feature", "head", "unknown")
SPATIAL = ("height", "width", "depth")
#: token axes: a reshape that merges a fixed number of neighbouring tokens into the features marks the inner
#: piece :data:`PATCH` (see :func:`_reshape`)
TOKEN = ("batch", "sequence")
#: marks the inner piece of a spatial axis split by a reshape (``H -> (H/2, 2)``): an offset inside a patch or
#: window of fixed size; never a public label by itself (:func:`dim_label`)
PATCH = "patch"

#: One part of a dimension: its base names and its size.
Part = tuple[Label, int]
#: A dimension: its parts, outermost first (their sizes multiply to the dim's size).
Dim = tuple[Part, ...]

# ops whose output has the input's rank and layout, possibly with other sizes (pooling, resampling, padding)
_LAYOUT_KEEPING = re.compile(
    r"(pool|interpolate|upsample|upsampling|pad|pixel_shuffle|pixel_unshuffle|roll|flip|cumsum|cumprod|"
    r"softmax|log_softmax|repeat|tile|index_select|gather|scatter|masked_scatter|slice_scatter|"
    r"select_scatter|index_put|index_add|narrow|grid_sample|affine_grid|channel_shuffle|tril|triu|resize)")
_NORM_TUPLE_OPS = ("layer_norm", "rms_norm", "batch_norm", "group_norm", "instance_norm")
_SPLIT_OPS = ("split", "split_with_sizes", "chunk", "tensor_split", "unsafe_split", "unsafe_chunk",
              "unsafe_split_with_sizes")


# --------------------------------------------------------------------------------------------- dims
def _dim(name: str, size: int) -> Dim:
    return (((name,), int(size)),)


def _unk(size: int) -> Dim:
    return ((UNK, int(size)),)


def _dsize(d: Dim) -> int:
    return math.prod(p[1] for p in d)


def _names(parts: Iterable[Part]) -> list[str]:
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
    number of neighbouring tokens, :func:`_reshape` with ``fixed``) is a channel/feature dim: Qwen2/3-VL's
    vision patch merger ``x.view(-1, hidden * merge**2)`` on packed patches ``(tokens, hidden)`` normalises
    ``4 * hidden`` features, a count set by the model, not by the input.
    """
    names = _names(d)
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


def _is_unknown(d: Dim) -> bool:
    return not _names(d)


def _tidy(d: Sequence[Part]) -> Dim:
    """Drop size-1 parts of a multi-part dim, fuse neighbours with the same names (and head+feature)."""
    parts = [p for p in d if p[1] != 1] or list(d[:1])
    out: list[Part] = []
    for names, size in parts:
        if out and (out[-1][0] == names or (out[-1][0] == ("head",) and names == ("feature",))):
            out[-1] = (names, out[-1][1] * size)
        else:
            out.append((names, size))
    return tuple(out)


def _resize(d: Dim, size: int) -> Dim:
    """The same axis at another size (a strided conv, a pool, a slice): parts merge when the size changes."""
    size = int(size)
    if _dsize(d) == size:
        return d
    names = tuple(_names(d)) or UNK
    return ((names, size),)


def _same(x: list[Dim], out_shape: Sequence[int]) -> list[Dim]:
    """Input dims carried to an output of the same rank, each resized to the output's size."""
    return [_resize(d, s) for d, s in zip(x, out_shape)]


def _unknowns(out_shape: Optional[Sequence[int]]) -> Optional[list[Dim]]:
    return [_unk(s) for s in out_shape] if out_shape is not None else None


# --------------------------------------------------------------------------------------------- inputs
def parse_input_axes(spec: str, inputs: Any = None) -> list[Label]:
    """Parse ``"B,C,H,W"`` or ``"batch,channel,height,width"`` into labels (one per dim of the first input).

    Letters: B/N batch, S/T/L sequence, C channel, H height, W width, D depth, F/E feature, K head.
    Raises ValueError naming the unknown axis, or for an empty spec (or an empty axis, ``"B,,C"``).
    With ``inputs`` (the model's example inputs: a tuple of positional inputs or a dict of keyword inputs),
    the number of axes must equal the rank of the first input when that is a tensor; otherwise raises
    :class:`normaudit.errors.UsageError` naming both ranks and the input's shape (exit status 2), since the
    declaration would otherwise be silently ignored.
    """
    from normaudit.errors import UsageError

    if not spec.strip():
        raise ValueError("no axes given; give one axis per dim of the model's first input, e.g. B,C,H,W")
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty axis in {spec!r}; give one axis per dim, e.g. B,C,H,W")
        name = LETTERS.get(part.upper(), part.lower()) if len(part) == 1 else part.lower()
        if name not in BASE:
            raise ValueError(f"unknown axis {part!r}; use one of B,S,C,H,W,D,F or {', '.join(BASE)}")
        out.append((name,))
    first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else (
        inputs[0] if isinstance(inputs, (tuple, list)) and inputs else inputs)
    if isinstance(first, torch.Tensor) and first.dim() != len(out):
        raise UsageError(f"--input-axes {spec} has {len(out)} ax{'is' if len(out) == 1 else 'es'} but the model's "
                         f"first input has rank {first.dim()} (shape {list(first.shape)})")
    return out


def _first_consumer_module(node: fx.Node, cap: Capture) -> Optional[nn.Module]:
    """The first layer reading ``node`` (through casts and element-wise arithmetic that keeps its shape:
    ``x * scale + pos_emb(x)`` before the first block, FunASR's encoder), as a module (an aten conv counts as
    Conv1d)."""
    frontier, seen = [node], 0
    while frontier and seen < 8:
        nxt = []
        for n in frontier:
            for user in n.users:
                name = op_name(user)
                if name == "module":
                    return cap.modules.get(str(user.target))
                if name == "conv":
                    return nn.Conv1d(1, 1, 1) if len(shape(node) or ()) == 3 else None
                if name in ("batch_norm", "instance_norm", "group_norm"):
                    return {"batch_norm": nn.BatchNorm1d(1), "instance_norm": nn.InstanceNorm1d(1),
                            "group_norm": nn.GroupNorm(1, 1)}[name]
                if name in ("linear", "matmul", "layer_norm", "rms_norm", "embedding"):
                    return nn.Identity()
                if name in ("to", "alias", "dropout", "contiguous"):
                    nxt.append(user)
                elif name in ("mul", "div", "add", "sub") and shape(user) == shape(node):
                    nxt.append(user)
        frontier, seen = nxt, seen + 1
    return None


_IMAGE_NAMES = ("pixel", "image", "img", "picture", "photo")
#: first layers that read their input's last dim as features (:func:`_first_consumer_module` gives an
#: ``nn.Identity`` for a functional linear, matmul or layer/RMS norm)
_READS_FEATURES = (nn.Identity, nn.Linear, nn.LayerNorm, nn.RMSNorm)
_AUDIO_NAMES = ("input_values", "waveform", "wav", "audio", "signal")
_EMBED_NAMES = ("inputs_embeds", "embeds", "hidden_states", "embedding")


def input_labels(node: fx.Node, cap: Capture, declared: Optional[list[Label]] = None) -> list[Label]:
    """Labels for a model input, from the declaration, else its name, dtype, rank and the first layer reading it.

    - ``declared`` (``--input-axes``) wins when its length equals the input's rank;
    - integer inputs (token ids, masks, positions): ``(batch, sequence)``;
    - floating rank 4 ``(batch, channel, height, width)`` (``(batch, channel, sequence, feature)`` for inputs
      named like spectrograms: :func:`_spectrogram_labels`; ``(batch, ?, ?, feature)`` for the recorded
      hidden states of a part, ``cap.inputs_recorded``, read first by a linear layer or a layer/RMS norm),
      rank 5 ``(batch, channel, depth, height, width)``
      (``(batch, sequence, channel, height, width)`` for inputs named like videos);
    - floating rank 3: ``(batch, channel, sequence)`` when a 1-D conv or a BatchNorm1d/InstanceNorm1d/
      GroupNorm reads it first; ``(sequence, batch, feature)`` when a torch.nn RNN or MultiheadAttention
      with ``batch_first=False`` reads it first, or the model is a torch.nn Transformer built that way;
      ``(batch, sequence, feature)`` otherwise (and for ``inputs_embeds``);
    - floating rank 2: ``(batch, sequence)`` for raw audio (``input_values``), ``(batch, feature)`` otherwise.
    """
    shp = shape(node)
    v = val(node)
    if shp is None:
        return []
    rank = len(shp)
    if declared is not None and len(declared) == rank:
        return list(declared)
    name = node.name.lower()
    floating = isinstance(v, torch.Tensor) and v.is_floating_point()
    if not floating:
        if rank == 4 and "mask" in name:
            return [("batch",), UNK, ("sequence",), ("sequence",)]
        base = [("batch",), ("sequence",)]
        return (base + [UNK] * rank)[:rank] if rank >= 2 else [("sequence",)] * rank
    if rank == 5:
        if "video" in name:
            return [("batch",), ("sequence",), ("channel",), ("height",), ("width",)]
        return [("batch",), ("channel",), ("depth",), ("height",), ("width",)]
    if rank == 4:
        if "mask" in name:
            return [("batch",), UNK, ("sequence",), ("sequence",)]
        if any(k in name for k in _SPECTROGRAM_NAMES):
            return _spectrogram_labels(shp, cap)
        if getattr(cap, "inputs_recorded", False) and isinstance(_first_consumer_module(node, cap), _READS_FEATURES):
            # hidden states a part was given ((B, tiles, tokens, D) in Llama 4's vision encoder) read by a
            # layer over their last dim: not an image
            return [("batch",), UNK, UNK, ("feature",)]
        return [("batch",), ("channel",), ("height",), ("width",)]
    if rank == 3:
        if any(k in name for k in _EMBED_NAMES):
            return [("batch",), ("sequence",), ("feature",)]
        first = _first_consumer_module(node, cap)
        if isinstance(first, (nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d, nn.InstanceNorm1d, nn.GroupNorm)):
            return [("batch",), ("channel",), ("sequence",)]
        if _sequence_first(first, cap.root):
            return [("sequence",), ("batch",), ("feature",)]
        layout = _conv_reading(node, cap) if first is None else None
        if layout is not None:
            return _read_by_conv_labels(layout, shp, name, cap)
        if first is None and any(k in name for k in ("feature", "mel", "spectrogram")):
            return [("batch",), ("channel",), ("sequence",)]
        return [("batch",), ("sequence",), ("feature",)]
    if rank == 2:
        if any(k in name for k in _AUDIO_NAMES):
            return [("batch",), ("sequence",)]
        if "mask" in name:
            return [("batch",), ("sequence",)]
        return [("batch",), ("feature",)]
    if rank == 1:
        return [("feature",)]
    return [UNK] * rank


_SPECTROGRAM_NAMES = ("input_features", "mel", "spectrogram", "fbank")
_MEL_KEYS = ("num_mel_bins", "n_mels", "mel_bins", "feature_size", "num_mel_filters", "input_feat_size",
             "input_feat_per_channel")


def _mel_counts(cap: Capture) -> set:
    """The mel-bin counts a model's config declares (its own keys and its audio/encoder sub-config's)."""
    config = getattr(getattr(cap, "root", None), "config", None)
    configs = [config] + [getattr(config, k, None) for k in ("audio_config", "encoder_config")]
    return {getattr(c, k, None) for c in configs if c is not None for k in _MEL_KEYS} - {None}


def _time_and_mel(shp: Any, first: int, cap: Capture) -> list[Label]:
    """Labels of dims ``first`` and ``first + 1`` of a spectrogram: ``(sequence, feature)`` (time frames,
    then mel bins: the feature extractors' layout), or ``(feature, sequence)`` when dim ``first``, not the
    next, has the config's mel-bin count (:func:`_mel_counts`)."""
    mels = _mel_counts(cap)
    dims = [int(d) if isinstance(d, int) else None for d in shp]
    if dims[first] is not None and dims[first] in mels and dims[first + 1] not in mels:
        return [("feature",), ("sequence",)]
    return [("sequence",), ("feature",)]


def _spectrogram_labels(shp: Any, cap: Capture) -> list[Label]:
    """Labels of a rank-4 spectrogram input (``input_features`` of CLAP/HTSAT, PANNs-style audio CNNs):
    ``(batch, channel, sequence, feature)``, or ``(batch, channel, feature, sequence)`` when dim 2, not
    dim 3, has the config's mel-bin count (:func:`_time_and_mel`). The mel axis is a feature axis, not an
    image width: a BatchNorm2d over it after ``transpose(1, 3)`` (PANNs' and HTSAT's ``bn0``) normalises
    each mel bin, as designed."""
    return [("batch",), ("channel",)] + _time_and_mel(shp, 2, cap)


#: ops a model input passes through on its way to its first convolution without changing what its dims are
_CONV_PATH_OPS = ("to", "alias", "dropout", "contiguous", "pad", "constant_pad_nd", "clone")


def _conv_reading(node: fx.Node, cap: Capture) -> Optional[str]:
    """How a rank-3 ``(batch, X, Y)`` input reaches its first convolution, when a layout op leads there:
    ``"map"`` when it is unsqueezed into one channel, ``(B, 1, X, Y)``, and read by a 2-D convolution (a
    single-channel map: Gemma3n's, Gemma4's and Parakeet's audio subsampling ``input_features.unsqueeze(1)``
    into ``Conv2d``, AST's patch embedding); ``"channels_last"`` when it is transposed to ``(B, Y, X)`` and
    read by a 1-D convolution (Speech2Text's ``input_features.transpose(1, 2)`` into ``Conv1d``); None
    otherwise (padding, casts and a transpose of the map's spatial dims may come between)."""
    frontier = [(node, "input")]
    for _ in range(8):
        nxt = []
        for n, state in frontier:
            for user in n.users:
                conv = _conv_rank(user, cap)
                if conv is not None and (state, conv) in (("map", 2), ("channels_last", 1)):
                    return state
                step = _conv_path_step(user, n, state) if conv is None else None
                if step is not None:
                    nxt.append((user, step))
        frontier = nxt
    return None


def _conv_path_step(user: fx.Node, src: fx.Node, state: str) -> Optional[str]:
    """One step of :func:`_conv_reading`: the layout state after ``user`` reads ``src`` (``"input"``: no
    layout op yet, ``"map"``, ``"channels_last"``), None when the path ends there."""
    name, rank = op_name(user), len(shape(src) or ())
    if name in _CONV_PATH_OPS or _raw_name(user) in _CONV_PATH_OPS:
        return state if user.args and user.args[0] is src else None
    if state == "input" and name == "unsqueeze" and rank == 3 and arg(user, 1, "dim", None) in (1, -3):
        return "map"
    if state == "input" and rank == 3 and _swaps_last_two(user):
        return "channels_last"
    if state == "map" and rank == 4 and _swaps_last_two(user):
        return "map"  # the map's two spatial dims exchanged (AST: unsqueeze(1).transpose(2, 3))
    return None


def _swaps_last_two(node: fx.Node) -> bool:
    """``transpose``/``permute`` exchanging only the last two dims of its input."""
    rank = len(shape(node.args[0]) or ()) if node.args else 0
    if op_name(node) == "transpose" and len(node.args) >= 3:
        return rank >= 2 and {int(d) % rank for d in node.args[1:3] if isinstance(d, int)} == {rank - 2, rank - 1}
    if op_name(node) == "permute" or _raw_name(node) == "permute":
        dims = _dims_arg(node, 1, "dims")
        return dims is not None and rank >= 2 and [d % rank for d in dims] == list(range(rank - 2)) + [rank - 1,
                                                                                                        rank - 2]
    return False


def _conv_rank(node: fx.Node, cap: Capture) -> Optional[int]:
    """The number of spatial dims of a convolution node (``Conv2d`` module or aten/functional conv), else None."""
    if op_name(node) == "module":
        mod = cap.modules.get(str(node.target))
        w = getattr(mod, "weight", None) if isinstance(mod, nn.modules.conv._ConvNd) else None
        return w.dim() - 2 if isinstance(w, torch.Tensor) else None
    if op_name(node) != "conv":
        return None
    w = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
    ws = shape(w) if isinstance(w, fx.Node) else None
    return len(ws) - 2 if ws is not None else None


def _read_by_conv_labels(layout: str, shp: Any, name: str, cap: Capture) -> list[Label]:
    """Labels of a rank-3 input read by a convolution after a layout op (:func:`_conv_reading`): a
    single-channel map is ``(batch, sequence, feature)`` for audio (time frames and mel bins, ordered by
    :func:`_time_and_mel`) and ``(batch, height, width)`` otherwise; a channels-last sequence read by a 1-D
    convolution is ``(batch, sequence, feature)``."""
    if layout == "channels_last":
        return [("batch",), ("sequence",), ("feature",)]
    if any(k in name for k in _SPECTROGRAM_NAMES + _AUDIO_NAMES):
        return [("batch",)] + _time_and_mel(shp, 1, cap)
    return [("batch",), ("height",), ("width",)]


_TORCH_TRANSFORMERS = (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder, nn.TransformerEncoderLayer,
                       nn.TransformerDecoderLayer)


def _sequence_first(first: Optional[nn.Module], root: Optional[nn.Module]) -> bool:
    """True when a (seq, batch, feature) layout is what reads the input: a torch.nn RNN/LSTM/GRU or
    MultiheadAttention with ``batch_first=False`` as the first layer, or a torch.nn Transformer model built
    with ``batch_first=False`` (their default)."""
    if isinstance(first, (nn.RNNBase, nn.MultiheadAttention)):
        return not first.batch_first
    if isinstance(root, _TORCH_TRANSFORMERS):
        mha = next((m for m in root.modules() if isinstance(m, nn.MultiheadAttention)), None)
        return mha is not None and not mha.batch_first
    return False


def _input_dims(node: fx.Node, cap: Capture, declared: Optional[list[Label]]) -> list[Dim]:
    shp = shape(node) or ()
    labels = input_labels(node, cap, declared)
    return [((lab, int(s)),) for lab, s in zip(labels, shp)]


# --------------------------------------------------------------------------------------------- transfer
def _reshape(x: list[Dim], out_shape: Sequence[int], fixed: Optional[Sequence[bool]] = None) -> list[Dim]:
    """Dims after a view/reshape: the input's parts, in memory order, are dealt out to the output dims.

    A part larger than what an output dim still needs is split (outer piece first; a split ``feature``
    gives ``head`` then ``feature``); size-1 dims take a size-1 part when one is next, else ``unknown``.
    The inner piece of a split spatial axis is marked :data:`PATCH` (an offset inside a fixed patch); so is
    the inner piece of a split batch/sequence axis when the output dim it goes to has a size fixed by the
    model (``fixed[i]``, :func:`_fixed_sizes`): a fixed number of neighbouring tokens merged into that dim.
    """
    stream: list[Part] = [p for d in x for p in d]
    out: list[Dim] = []
    k = 0
    for s in out_shape:
        s = int(s)
        if s == 1:
            if k < len(stream) and stream[k][1] == 1:
                out.append((stream[k],))
                k += 1
            else:
                out.append(_unk(1))
            continue
        acc: list[Part] = []
        prod = 1
        while prod < s:
            while k < len(stream) and stream[k][1] == 1:
                k += 1
            if k >= len(stream) or s % prod:
                break
            names, n = stream[k]
            need = s // prod
            if need % n == 0:
                acc.append(stream[k])
                prod *= n
                k += 1
            elif n % need == 0:
                outer = ("head",) if names == ("feature",) else names
                acc.append((outer, need))
                nxt = len(out) + 1
                fixed_next = fixed is not None and nxt < len(fixed) and fixed[nxt]
                patchy = set(names) <= set(SPATIAL) or (fixed_next and set(names) <= set(TOKEN))
                inner = names + (PATCH,) if patchy and PATCH not in names else names
                stream[k] = (inner, n // need)
                prod *= need
            else:
                break
        if prod != s:  # irregular regrouping (e.g. (6, 4) -> (4, 6)): what is left merges
            rest = stream[k:]
            merged = tuple(_names(acc + rest)) or UNK
            out.append(((merged, s),))
            for s2 in out_shape[len(out):]:
                out.append(((merged, int(s2)),))
            return out[: len(out_shape)]
        out.append(_tidy(acc))
    return out


def as_tokens(dims: list[Dim]) -> list[Dim]:
    """Patch tokens: a conv feature map whose spatial grid was flattened into one token axis and moved before
    its channels, ``(B, C, H, W) -> flatten(2) -> transpose(1, 2) -> (B, H*W, C)`` (ViT patch embedding,
    Dosovitskiy et al. 2020, arXiv 2010.11929, eq. 1), carries each token's embedding: its last dim is a
    ``feature`` axis, as the same axis is after every block's Linear layers, so identical layers get one
    label. A channels-last map that keeps ``H`` and ``W`` apart (ConvNeXt's ``permute(0, 2, 3, 1)``) keeps
    its ``channel`` axis."""
    if len(dims) < 3 or _names(dims[-1]) != ["channel"]:
        return dims
    grid = any(len({n for names, _ in d for n in names if n in SPATIAL}) >= 2
               and not any(PATCH in names for names, _ in d) for d in dims[:-1])
    if not grid:
        return dims
    return dims[:-1] + [tuple((("feature",), size) for _, size in dims[-1])]


def _permute(x: list[Dim], perm: Sequence[int]) -> list[Dim]:
    rank = len(x)
    return [x[int(p) % rank] for p in perm]


def _broadcast(out_shape: Sequence[int], inputs: Sequence[Optional[list[Dim]]],
               in_shapes: Sequence[Optional[Sequence[int]]]) -> list[Dim]:
    """Elementwise broadcasting: each output dim takes the first known label among inputs of that size."""
    rank = len(out_shape)
    result: list[Optional[Dim]] = [None] * rank
    for labs, ishp in zip(inputs, in_shapes):
        if labs is None or ishp is None or len(labs) != len(ishp) or len(ishp) > rank:
            continue
        off = rank - len(ishp)
        for k, d in enumerate(labs):
            j = off + k
            if ishp[k] == out_shape[j] and (result[j] is None or (_is_unknown(result[j]) and not _is_unknown(d))):
                if out_shape[j] != 1 or result[j] is None:
                    result[j] = d
    return [r if r is not None else _unk(s) for r, s in zip(result, out_shape)]


def _matmul(x: Optional[list[Dim]], y: Optional[list[Dim]], out_shape: Sequence[int],
            xs: Optional[Sequence[int]], ys: Optional[Sequence[int]]) -> list[Dim]:
    """``x @ y``: batch dims broadcast, rows from ``x``, columns from ``y`` (a weight's columns: feature)."""
    r = len(out_shape)
    x = x if x is not None and xs is not None else ([_unk(s) for s in xs] if xs is not None else None)
    y = y if y is not None and ys is not None else ([_unk(s) for s in ys] if ys is not None else None)
    if x is None or y is None or not x or not y:
        return [_unk(s) for s in out_shape]
    if len(y) == 1:
        return _broadcast(out_shape, [x[:-1]], [list(xs)[:-1]])
    last = y[-1] if not _is_unknown(y[-1]) else _dim("feature", out_shape[-1])
    if len(x) == 1:
        return (y[:-2] + [last])[-r:]
    row = x[-2] if not _is_unknown(x[-2]) or any(not _is_unknown(d) for d in x) else _dim("feature", xs[-2])
    batch = _broadcast(list(out_shape[:-2]), [x[:-2], y[:-2]], [list(xs[:-2]), list(ys[:-2])]) if r > 2 else []
    return batch + [_resize(row, out_shape[-2]), _resize(last, out_shape[-1])]


def _einsum(eq: str, operands: list[Optional[list[Dim]]], shapes: list, out_shape: Sequence[int]) -> list[Dim]:
    """``torch.einsum``: each output letter takes the dims its letter had in an operand."""
    eq = eq.replace(" ", "")
    if "..." in eq or "->" not in eq:
        return [_unk(s) for s in out_shape]
    lhs, rhs = eq.split("->")
    specs = lhs.split(",")
    letters: dict[str, Dim] = {}
    for spec, labs, shp in zip(specs, operands, shapes):
        if labs is None or len(labs) != len(spec):
            continue
        for ch, d in zip(spec, labs):
            if ch not in letters or (_is_unknown(letters[ch]) and not _is_unknown(d)):
                letters[ch] = d
    out = []
    for ch, s in zip(rhs, out_shape):
        d = letters.get(ch)
        out.append(_resize(d, s) if d is not None else _unk(s))
    if len(out) != len(out_shape):
        return [_unk(s) for s in out_shape]
    # a contraction against a weight (unknown) leaves its new letters as features
    return out


def _index(x: list[Dim], idx: Any, out_shape: Sequence[int]) -> list[Dim]:
    """Dims after ``x[idx]`` for int/slice/None/Ellipsis indexing (advanced indexing: unknown)."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    out: list[Dim] = []
    k = 0
    n_real = sum(1 for i in idx if i is not None and i is not Ellipsis)
    for i in idx:
        if i is None:
            out.append(_unk(1))
        elif i is Ellipsis:
            take = len(x) - n_real
            out.extend(x[k:k + take])
            k += take
        elif isinstance(i, int):
            k += 1
        elif isinstance(i, slice):
            out.append(x[k] if k < len(x) else _unk(1))
            k += 1
        else:
            return [_unk(s) for s in out_shape]
    out.extend(x[k:])
    if len(out) != len(out_shape):
        return [_unk(s) for s in out_shape]
    return _same(out, out_shape)


def _conv(x: list[Dim], out_shape: Sequence[int], n_spatial: Optional[int]) -> list[Dim]:
    """Convolution: the channel axis becomes ``channel`` (size C_out); spatial axes keep their labels."""
    r = len(out_shape)
    n_spatial = n_spatial if n_spatial is not None else max(r - 2, 1)
    c = r - n_spatial - 1  # channel dim: 1 when batched, 0 unbatched
    if c < 0 or len(x) != r:
        return [_unk(s) for s in out_shape]
    out = _same(x, out_shape)
    out[c] = _dim("channel", out_shape[c])
    return out


def _seq_module(mod: nn.Module, x: list[Dim], node: fx.Node) -> Any:
    """Labels of an RNN/LSTM/GRU call: (output, hidden state(s))."""
    v = val(node)
    if not isinstance(v, (tuple, list)) or not v or not isinstance(v[0], torch.Tensor):
        return None
    out0 = v[0]
    first = _same(x[:-1], tuple(out0.shape)[:-1]) + [_dim("feature", out0.shape[-1])] if len(x) == out0.dim() else \
        [_unk(s) for s in out0.shape]
    rest = tuple(_tensor_unknowns(t) for t in v[1:])
    return (first,) + rest


def _tensor_unknowns(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return [_unk(s) for s in t.shape]
    if isinstance(t, (tuple, list)):
        return tuple(_tensor_unknowns(u) for u in t)
    return None


def _module_dims(node: fx.Node, mod: Optional[nn.Module], x: Optional[list[Dim]], env: dict) -> Any:
    """Labels of a ``call_module`` node (symbolic trace keeps torch.nn leaf modules as calls)."""
    out_shape = shape(node)
    ins = tensor_inputs(node)
    in_shape = shape(ins[0]) if ins else None
    if mod is None:
        return _fallback(node, env)
    if isinstance(mod, nn.MultiheadAttention) and x is not None:
        v = val(node)
        first = list(x)
        if isinstance(v, (tuple, list)) and v and isinstance(v[0], torch.Tensor) and len(x) == v[0].dim():
            first = _same(x, tuple(v[0].shape))
        return (first,) + tuple(_tensor_unknowns(t) for t in (v[1:] if isinstance(v, (tuple, list)) else ()))
    if isinstance(mod, nn.RNNBase) and x is not None:
        return _seq_module(mod, x, node)
    if out_shape is None:
        return _tensor_unknowns(val(node))
    if x is None:
        return _unknowns(out_shape)
    if isinstance(mod, (nn.Linear, nn.Bilinear, nn.LazyLinear)) and len(x) == len(out_shape):
        return _same(x[:-1], out_shape[:-1]) + [_dim("feature", out_shape[-1])]
    if isinstance(mod, (nn.Embedding,)):
        return _same(x, out_shape[:-1]) + [_dim("feature", out_shape[-1])] if len(x) + 1 == len(out_shape) \
            else _unknowns(out_shape)
    if isinstance(mod, nn.EmbeddingBag):
        return [_dim("batch", out_shape[0]), _dim("feature", out_shape[-1])] if len(out_shape) == 2 \
            else _unknowns(out_shape)
    if isinstance(mod, nn.modules.conv._ConvNd):
        return _conv(x, out_shape, mod.weight.dim() - 2 if getattr(mod, "weight", None) is not None else None)
    if isinstance(mod, (nn.Flatten, nn.Unflatten)) and in_shape is not None:
        return _reshape(x, out_shape)
    if len(x) == len(out_shape) and _LAYOUT_KEEPING.search(type(mod).__name__.lower()):
        return _same(x, out_shape)
    return _fallback(node, env)


_ELEMENTWISE = ("add", "sub", "mul", "div", "rsub")


def _fallback(node: fx.Node, env: dict, params: Optional[set] = None) -> Optional[list[Dim]]:
    """Elementwise broadcasting over the tensor inputs (the default for ops not followed explicitly).

    A last dim that only a parameter provides, broadcast against a size-1 dim of a labelled input
    (``x.unsqueeze(-1) * W``: numeric features turned into embeddings), is a ``feature`` dim.
    """
    out_shape = shape(node)
    if out_shape is None:
        return _tensor_unknowns(val(node))
    ins = [n for n in tensor_inputs(node) if isinstance(env.get(n), list)]
    floats = [n for n in ins if _floating(n)]
    if floats and isinstance(val(node), torch.Tensor) and val(node).is_floating_point():
        ins = floats  # integer/bool operands of a float result are indices or masks, not its layout
    out = _broadcast(out_shape, [env.get(n) for n in ins], [shape(n) for n in ins])
    if params and out and out_shape[-1] > 1 and _is_unknown(out[-1]) and op_name(node) in _ELEMENTWISE:
        from_param = any(n in params and shape(n) and shape(n)[-1] == out_shape[-1] for n in ins)
        expanded = any(n not in params and shape(n) and shape(n)[-1] == 1 and any(not _is_unknown(d) for d in env[n])
                       for n in ins)
        if from_param and expanded:
            out[-1] = _dim("feature", out_shape[-1])
    return out


#: ops that write values into their first input at given indices (the output is that input, updated): the
#: index tensors are positions, not data laid out like the output
_WRITE_INTO = ("index_add", "index_copy", "index_fill", "index_put", "index_reduce", "scatter", "scatter_add",
               "scatter_reduce", "masked_fill", "masked_scatter", "put", "slice_scatter", "select_scatter")


def _write_into(node: fx.Node, ins: list, env: dict, out_shape: Sequence[int]) -> list[Dim]:
    """Labels of ``self.index_add_(dim, index, source)`` and its kin: ``self``'s labels; where those are
    unknown (a ``zeros`` buffer sized from the input, as in a mixture-of-experts combine), the labels of a
    floating-point source of the same rank at the same dim and size, except the indexed dim (tokens routed
    to an expert are not the buffer's rows in order). Integer/bool inputs (indices, masks) never label it."""
    base = env.get(ins[0])
    out = list(base) if isinstance(base, list) and len(base) == len(out_shape) else [_unk(s) for s in out_shape]
    indexed = arg(node, 1, "dim", None)
    indexed = indexed % len(out_shape) if isinstance(indexed, int) and out_shape else None
    for src in ins[1:]:
        labs, shp, v = env.get(src), shape(src), val(src)
        if not isinstance(labs, list) or shp is None or len(shp) != len(out_shape):
            continue
        if isinstance(v, torch.Tensor) and not v.is_floating_point():
            continue
        for k, (d, size) in enumerate(zip(labs, shp)):
            if k != indexed and _is_unknown(out[k]) and not _is_unknown(d) and int(size) == int(out_shape[k]):
                out[k] = d
    return [_resize(d, s) for d, s in zip(out, out_shape)]


def _floating(node: fx.Node) -> bool:
    v = val(node)
    return not isinstance(v, torch.Tensor) or v.is_floating_point()


def _raw_name(node: fx.Node) -> str:
    if node.op == "call_method":
        return str(node.target)
    packet = getattr(node.target, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(node.target, "__name__", str(node.target))


def _is_aten(node: fx.Node) -> bool:
    return hasattr(node.target, "_overloadpacket")


def _dims_arg(node: fx.Node, index: int, name: str) -> Optional[list[int]]:
    """A dims argument given as a list or as varargs (``x.permute(0, 2, 1)``)."""
    dims = arg(node, index, name, None)
    if dims is None:
        return None
    if isinstance(dims, (list, tuple)):
        return [int(d) for d in dims] if all(isinstance(d, int) for d in dims) else None
    if isinstance(dims, int):
        rest = node.args[index:]
        return [int(d) for d in rest] if all(isinstance(d, int) for d in rest) else None
    return None


def _fixed_sizes(node: fx.Node, rank: int, cap: Optional[Capture] = None,
                 params: Optional[set] = None) -> Optional[list[bool]]:
    """For a ``view``/``reshape`` node, which output dims have a size fixed by the model, not by the input.

    A size given as a plain int is fixed when another size of the same call is inferred (``-1``) or traced
    from the input (an fx node: ``x.size(0) // 4`` under symbolic tracing): ``x.view(-1, hidden * 4)``
    fixes the last dim and leaves the token count to the input. Export graphs keep the ``-1`` as written.
    The last size, unless written ``-1``, is also fixed when a parameter downstream has it
    (:func:`_sized_by_parameter`): ``x.reshape(n // 4, 4 * d)`` with ``n, d = x.shape`` (plain ints under
    export, traced under symbolic tracing) feeding ``nn.LayerNorm(4 * d)`` or ``nn.Linear(4 * d, ...)``.
    Returns None when that cannot be told (``flatten``, ``view_as``, plain ints no parameter explains).
    """
    if _raw_name(node) not in ("view", "reshape", "_unsafe_view", "_reshape_alias"):
        return None
    sizes = node.args[1:] if len(node.args) > 1 else [node.kwargs.get("shape", node.kwargs.get("size"))]
    if len(sizes) == 1 and isinstance(sizes[0], (list, tuple)):
        sizes = sizes[0]
    if len(sizes) != rank or not rank:
        return None
    free = [not isinstance(z, int) or z == -1 for z in sizes]
    fixed = [not f for f in free] if any(free) else [False] * rank
    out_shape = shape(node)
    if cap is not None and out_shape and sizes[-1] != -1 and _sized_by_parameter(node, int(out_shape[-1]), cap,
                                                                                 params or set()):
        fixed[-1] = True
    return fixed if any(fixed) else None


def _frames_as_features(node: fx.Node, dims: list[Dim], cap: Optional[Capture],
                        params: Optional[set]) -> list[Dim]:
    """``dims`` of a reshape, with a last dim made only of the inner pieces of a cut token axis
    (:data:`PATCH` parts of batch/sequence, no channel/feature part) relabelled ``feature`` when a parameter
    reading it has its size (:func:`_sized_by_parameter`): a waveform ``(batch, samples)`` cut into frames,
    ``x.reshape(B, -1, frame_len)`` read by ``nn.Linear(frame_len, hidden)`` (MoonshineStreaming), is
    ``(batch, sequence, feature)``: the frame is the token and its samples are its features, like a ViT
    patch's pixels. Without such a parameter (a window of tokens split off for attention) the dim stays."""
    last = dims[-1] if dims else ()
    if cap is None or not last or any(PATCH not in names or not set(names) - {PATCH} <= set(TOKEN)
                                      for names, _ in last):
        return dims
    size = _dsize(last)
    if size > 1 and _sized_by_parameter(node, size, cap, params or set()):
        return dims[:-1] + [((("feature",), size),)]
    return dims


#: element-wise unary maps a feature passes through unchanged in layout (compressions, activations)
_UNARY = ("pow", "square", "neg", "abs", "sign", "exp", "log", "log1p", "sqrt", "rsqrt", "asinh", "sinh", "tanh",
          "atan", "sigmoid", "silu", "gelu", "relu", "erf", "clamp", "clip")


def _sized_by_parameter(node: fx.Node, size: int, cap: Capture, params: set) -> bool:
    """True when a layer reading ``node`` (through casts and element-wise ops that keep its shape) holds a
    parameter whose last dim is ``size`` along ``node``'s last dim: a Linear's input features, a LayerNorm's
    or RMSNorm's normalised shape, a matmul by a weight, a gain multiplied in. The model then fixes that
    size, whatever the input."""
    frontier, seen = [node], {node}
    for _ in range(6):
        nxt = []
        for n in frontier:
            for user in n.users:
                if user in seen:
                    continue
                seen.add(user)
                if _parameter_size(user, n, cap, params) == size:
                    return True
                if shape(user) == shape(node) and (op_name(user) in ("to", "alias", "dropout", "contiguous")
                                                   or op_name(user) in _ELEMENTWISE + _UNARY):
                    nxt.append(user)
        frontier = nxt
    return False


def _parameter_size(user: fx.Node, src: fx.Node, cap: Capture, params: set) -> Optional[int]:
    """The size a parameter of ``user`` fixes along the last dim of its input ``src`` (see
    :func:`_sized_by_parameter`), else None."""
    name = op_name(user)
    if name == "module":
        mod = cap.modules.get(str(user.target))
        w = getattr(mod, "weight", None) if isinstance(mod, (nn.Linear, nn.LayerNorm, nn.RMSNorm)) else None
        return int(w.shape[-1]) if isinstance(w, torch.Tensor) and w.dim() else None
    if name in ("layer_norm", "rms_norm"):
        ns = arg(user, 1, "normalized_shape", None)
        return int(ns[-1]) if isinstance(ns, (list, tuple)) and ns and isinstance(ns[-1], int) else None
    operands = [a for a in user.args[:3] if isinstance(a, fx.Node) and a is not src and a in params]
    ws = [shape(a) for a in operands if shape(a)]
    if name == "linear" and ws:
        return int(ws[0][-1])
    if name == "matmul" and ws and len(ws[0]) >= 2:
        return int(ws[0][-2])
    if name in ("mul", "add") and ws:
        return int(ws[0][-1])
    return None


def _transfer(node: fx.Node, cap: Capture, env: dict, params: Optional[set] = None) -> Any:
    """Labels of one non-placeholder node from the labels of its inputs (``params``: the nodes holding
    parameters and buffers): getitem, several outputs, dense layers, writes into a buffer, layout ops,
    reductions and joins, else element-wise broadcasting (:func:`_fallback`)."""
    name = op_name(node)
    out_shape = shape(node)
    if name in ("get_attr", "output"):
        return _unknowns(out_shape)
    ins = tensor_inputs(node)
    x0 = env.get(ins[0]) if ins else None
    x = x0 if isinstance(x0, list) else None
    in_shape = shape(ins[0]) if ins else None
    if x is not None and in_shape is not None and len(x) != len(in_shape):
        x = None
    raw = _raw_name(node)

    if name == "module":
        return _module_dims(node, cap.modules.get(str(node.target)), x, env)
    if name == "getitem":
        return _getitem_dims(node, env, out_shape)
    if out_shape is None:  # several outputs
        return _multi_output_dims(node, name, raw, x, in_shape)
    dims = _dense_dims(node, name, raw, ins, x, in_shape, out_shape, env)
    if dims is not None:
        return dims
    if raw.rstrip("_") in _WRITE_INTO and ins and tuple(in_shape or ()) == tuple(out_shape):
        return _write_into(node, ins, env, out_shape)
    if x is None:
        return _fallback(node, env, params)
    dims = _layout_dims(node, name, raw, x, out_shape, cap, params)
    if dims is None:
        dims = _reduced_or_joined_dims(node, name, raw, x, in_shape, out_shape, env)
    return dims if dims is not None else _fallback(node, env, params)


def _getitem_dims(node: fx.Node, env: dict, out_shape: Optional[Sequence[int]]) -> Any:
    """Labels of ``x[idx]``: an element of a tuple output, or an indexed tensor (:func:`_index`)."""
    src, idx = node.args[0], node.args[1]
    base = env.get(src)
    if isinstance(base, tuple) and isinstance(idx, int):
        return base[idx] if -len(base) <= idx < len(base) else None
    if isinstance(base, list) and out_shape is not None and shape(src) is not None:
        return _index(base, idx, out_shape)
    return _unknowns(out_shape) if out_shape is not None else _tensor_unknowns(val(node))


def _multi_output_dims(node: fx.Node, name: str, raw: str, x: Optional[list[Dim]],
                       in_shape: Optional[Sequence[int]]) -> Any:
    """Labels of an op with several outputs (a tuple of dims lists): split/chunk, unbind, the fused norms'
    (output, mean, rstd), reductions returning values and indices, else outputs shaped like the input."""
    v = val(node)
    if not isinstance(v, (tuple, list)):
        return None
    if x is not None and (name in _SPLIT_OPS or raw in _SPLIT_OPS):
        return tuple(_same(x, tuple(t.shape)) if isinstance(t, torch.Tensor) and t.dim() == len(x)
                     else _tensor_unknowns(t) for t in v)
    if x is not None and raw in ("unbind", "unstack"):
        d = int(arg(node, 1, "dim", 0)) % len(x)
        rest = x[:d] + x[d + 1:]
        return tuple(_same(rest, tuple(t.shape)) if isinstance(t, torch.Tensor) and t.dim() == len(rest)
                     else _tensor_unknowns(t) for t in v)
    if x is not None and name in _NORM_TUPLE_OPS:
        first = list(x) if isinstance(v[0], torch.Tensor) and tuple(v[0].shape) == tuple(in_shape or ()) \
            else _tensor_unknowns(v[0])
        return (first,) + tuple(_tensor_unknowns(t) for t in v[1:])
    if x is not None and raw in ("max", "min", "sort", "topk", "kthvalue", "mode", "median", "var_mean",
                                 "std_mean", "aminmax", "cummax", "cummin"):
        return _reduced_outputs(node, x, v)
    return tuple(_same(x, tuple(t.shape)) if x is not None and isinstance(t, torch.Tensor)
                 and tuple(t.shape) == tuple(in_shape or ()) else _tensor_unknowns(t) for t in v)


def _reduced_outputs(node: fx.Node, x: list[Dim], v: Sequence[Any]) -> tuple:
    """Labels of the outputs of ``max``/``min``/``sort``/``topk``/``var_mean``... along some dims of ``x``."""
    red = reduction(node)
    outs = []
    for t in v:
        if not isinstance(t, torch.Tensor):
            outs.append(None)
        elif t.dim() == len(x):
            outs.append(_same(x, tuple(t.shape)) if red is None or red.keepdim
                        else [_unk(s) for s in t.shape])
        elif red is not None and t.dim() == len(x) - len(red.dims):
            outs.append(_same([d for k, d in enumerate(x) if k not in red.dims], tuple(t.shape)))
        elif t.dim() == len(x) - 1 and isinstance(arg(node, 1, "dim", None), int):
            d = int(arg(node, 1, "dim")) % len(x)
            outs.append(_same(x[:d] + x[d + 1:], tuple(t.shape)))
        else:
            outs.append(_tensor_unknowns(t))
    return tuple(outs)


def _dense_dims(node: fx.Node, name: str, raw: str, ins: list, x: Optional[list[Dim]],
                in_shape: Optional[Sequence[int]], out_shape: Sequence[int], env: dict) -> Optional[list[Dim]]:
    """Labels of casts and copies, linear/matmul/einsum, embedding, convolution and attention; None for any
    other op (or when their operands' labels are missing)."""
    if name in ("to", "alias", "dropout") or raw in ("contiguous", "clone", "detach", "requires_grad_",
                                                       "zeros_like", "ones_like", "empty_like", "full_like",
                                                       "rand_like", "randn_like", "new_empty", "lift_fresh"):
        if x is not None and len(x) == len(out_shape) and tuple(in_shape or ()) == tuple(out_shape):
            return list(x)
    if name == "linear" and out_shape:
        src = node.args[1] if raw == "addmm" and len(node.args) > 1 else (ins[0] if ins else None)
        xs = env.get(src) if isinstance(src, fx.Node) else None
        if isinstance(xs, list) and len(xs) == len(out_shape):
            return _same(xs[:-1], out_shape[:-1]) + [_dim("feature", out_shape[-1])]
        return _unknowns(out_shape[:-1]) + [_dim("feature", out_shape[-1])]
    if name in ("matmul", "baddbmm") or raw in ("baddbmm", "addbmm"):
        a, b = (node.args[1], node.args[2]) if raw in ("baddbmm", "addbmm") else (node.args[0], node.args[1])
        if isinstance(a, fx.Node) and isinstance(b, fx.Node):
            la, lb = env.get(a), env.get(b)
            return _matmul(la if isinstance(la, list) else None, lb if isinstance(lb, list) else None,
                           out_shape, shape(a), shape(b))
    if name == "einsum":
        eq = node.args[0] if node.args and isinstance(node.args[0], str) else arg(node, 0, "equation", None)
        ops = node.args[1:]
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = ops[0]
        if isinstance(eq, str):
            labs = [env.get(o) if isinstance(o, fx.Node) and isinstance(env.get(o), list) else None for o in ops]
            return _einsum(eq, labs, [shape(o) for o in ops], out_shape)
    if name == "embedding":
        idx = node.args[1] if _is_aten(node) else node.args[0]
        labs = env.get(idx) if isinstance(idx, fx.Node) else None
        if isinstance(labs, list) and len(labs) + 1 == len(out_shape):
            return _same(labs, out_shape[:-1]) + [_dim("feature", out_shape[-1])]
        return _unknowns(out_shape[:-1]) + [_dim("feature", out_shape[-1])]
    if name == "conv" and x is not None:
        w = node.args[1] if len(node.args) > 1 else node.kwargs.get("weight")
        ws = shape(w) if isinstance(w, fx.Node) else None
        return _conv(x, out_shape, len(ws) - 2 if ws is not None else None)
    if name == "sdpa" and x is not None:
        v_node = node.args[2] if len(node.args) > 2 else node.kwargs.get("value")
        vl = env.get(v_node) if isinstance(v_node, fx.Node) else None
        last = vl[-1] if isinstance(vl, list) and vl else _dim("feature", out_shape[-1])
        if len(x) == len(out_shape):
            return _same(x[:-1], out_shape[:-1]) + [_resize(last, out_shape[-1])]
    return None


def _layout_dims(node: fx.Node, name: str, raw: str, x: list[Dim], out_shape: Sequence[int], cap: Capture,
                 params: Optional[set]) -> Optional[list[Dim]]:
    """Labels after permute/transpose/movedim, view/reshape/flatten/squeeze, unsqueeze, expand, select and
    diagonal of a labelled input ``x``; None for any other op."""
    rank = len(x)
    if name == "permute" or raw == "permute":
        dims = _dims_arg(node, 1, "dims")
        if dims is not None and len(dims) == rank:
            return as_tokens(_permute(x, dims))
    if name == "transpose":
        if raw in ("t", "numpy_T") or (rank == 2 and len(node.args) == 1 and not node.kwargs):
            return list(reversed(x)) if rank == 2 else list(x)
        d0, d1 = arg(node, 1, "dim0", 0), arg(node, 2, "dim1", 1)
        if isinstance(d0, int) and isinstance(d1, int) and rank:
            labs = list(x)
            a, b = d0 % rank, d1 % rank
            labs[a], labs[b] = labs[b], labs[a]
            return as_tokens(labs)
    if name == "movedim":
        src, dst = arg(node, 1, "source", None), arg(node, 2, "destination", None)
        if isinstance(src, int):
            src, dst = [src], [dst]
        if isinstance(src, (list, tuple)) and isinstance(dst, (list, tuple)) and len(src) == len(dst):
            src = [int(s) % rank for s in src]
            dst = [int(d) % rank for d in dst]
            order = [k for k in range(rank) if k not in src]
            result: list[Optional[Dim]] = [None] * rank
            for s, d in zip(src, dst):
                result[d] = x[s]
            it = iter(order)
            return [r if r is not None else x[next(it)] for r in result]
    if name in ("view", "flatten", "unflatten", "squeeze", "view_as", "reshape_as", "_reshape_alias",
                "reshape") or raw in ("view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze",
                                      "view_as", "reshape_as", "ravel"):
        return _frames_as_features(node, _reshape(x, out_shape, _fixed_sizes(node, len(out_shape), cap, params)),
                                   cap, params)
    if name == "unsqueeze":
        d = int(arg(node, 1, "dim", 0)) % (rank + 1)
        labs = list(x)
        labs.insert(d, _unk(1))
        return labs
    if name in ("expand", "expand_as", "broadcast_to"):
        ext = [_unk(s) for s in out_shape[: len(out_shape) - rank]] + list(x)
        return [d if _dsize(d) == s else _unk(s) for d, s in zip(ext, out_shape)]
    if name == "select":
        d = int(arg(node, 1, "dim", 0)) % rank
        return _same(x[:d] + x[d + 1:], out_shape)
    if raw == "diagonal" and len(out_shape) == rank - 1:
        d1, d2 = int(arg(node, 2, "dim1", 0)) % rank, int(arg(node, 3, "dim2", 1)) % rank
        return _same([d for k, d in enumerate(x) if k not in (d1, d2)], out_shape[:-1]) + [_unk(out_shape[-1])]
    if raw in ("diagonal", "unfold", "as_strided", "stride"):
        return _unknowns(out_shape)
    return None


def _reduced_or_joined_dims(node: fx.Node, name: str, raw: str, x: list[Dim], in_shape: Optional[Sequence[int]],
                            out_shape: Sequence[int], env: dict) -> Optional[list[Dim]]:
    """Labels after a reduction, an arg-reduction, cat/stack, or an op that keeps the layout at other sizes
    (slicing, padding, pooling); None for any other op."""
    rank = len(x)
    red = reduction(node)
    if red is not None:
        if red.keepdim or len(out_shape) == rank:
            return [_unk(1) if k in red.dims else d for k, d in enumerate(x)]
        kept = [d for k, d in enumerate(x) if k not in red.dims]
        return kept if len(kept) == len(out_shape) else _unknowns(out_shape)
    if raw in ("argmax", "argmin", "logsumexp", "prod", "all", "any", "count_nonzero", "nansum", "nanmean") \
            and len(out_shape) < rank:
        d = arg(node, 1, "dim", None)
        if isinstance(d, int):
            d = d % rank
            return _same(x[:d] + x[d + 1:], out_shape)
    if name in ("cat", "concat", "concatenate") and node.args and isinstance(node.args[0], (list, tuple)):
        parts = [(env.get(a), shape(a)) for a in node.args[0] if isinstance(a, fx.Node)]
        parts = [(p, s) for p, s in parts if isinstance(p, list) and s is not None and len(p) == len(out_shape)]
        if parts:
            d = int(arg(node, 1, "dim", 0)) % len(out_shape)
            res = []
            for k, s in enumerate(out_shape):
                cands = [p[k] for p, _ in parts]
                known = [c for c in cands if not _is_unknown(c)]
                res.append(_resize((known or cands)[0], s) if k == d else
                           _broadcast([s], [[c] for c in cands], [[ps[k]] for _, ps in parts])[0])
            return res
    if name == "stack" and node.args and isinstance(node.args[0], (list, tuple)):
        first = next((env.get(a) for a in node.args[0] if isinstance(a, fx.Node)
                      and isinstance(env.get(a), list)), None)
        if first is not None and len(first) + 1 == len(out_shape):
            d = int(arg(node, 1, "dim", 0)) % len(out_shape)
            labs = list(first)
            labs.insert(d, _unk(out_shape[d]))
            return _same(labs, out_shape)
    if len(out_shape) == rank and tuple(in_shape or ()) != tuple(out_shape) and (
            name in ("slice", "narrow", "index", "index_select", "gather", "pad", "constant_pad_nd", "repeat",
                     "tile", "roll") or _LAYOUT_KEEPING.search(raw)):
        return _same(x, out_shape)
    return None


# --------------------------------------------------------------------------------------------- the pass
def label_dims(cap: Capture, declared_inputs: Optional[list[Label]] = None) -> dict[fx.Node, Any]:
    """Run the axis pass over ``cap.gm``; returns node -> dims (a list of :data:`Dim` per tensor, a tuple of
    such lists for tuple outputs, None for non-tensors).

    ``declared_inputs`` (from ``--input-axes``) labels the first user input. A node whose transfer raises is
    labelled ``unknown`` (the pass never fails a run); the error is kept in ``node.meta["normaudit"]``.
    """
    env: dict[fx.Node, Any] = {}
    gm = cap.gm
    if gm is None:
        return env
    user_inputs = list(cap.user_inputs)
    first_input = user_inputs[0] if user_inputs else None
    params = {n for n in gm.graph.nodes if n.op == "get_attr" or (n.op == "placeholder" and n.name not in user_inputs)}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.name in user_inputs:
                dims: Any = _input_dims(node, cap, declared_inputs if node.name == first_input else None)
            else:
                dims = _unknowns(shape(node))
        else:
            try:
                dims = _transfer(node, cap, env, params)
            except Exception as exc:  # noqa: BLE001 - an op we do not understand: unknown, never a crash
                node.meta.setdefault("normaudit", {})["axes_error"] = f"{type(exc).__name__}: {exc}"
                dims = _fallback_safe(node)
        out_shape = shape(node)
        if isinstance(dims, list) and out_shape is not None and len(dims) != len(out_shape):
            dims = _unknowns(out_shape)
        env[node] = dims
        _mutated(node, dims, env)
    return env


def _mutated(node: fx.Node, dims: Any, env: dict) -> None:
    """An in-place op (``final.index_add_(...)``, ``x.mul_(...)``) under symbolic tracing: later users read
    the mutated tensor through its first argument's node, so that node takes the op's labels (export
    graphs are functional: their users read the op's output)."""
    raw = _raw_name(node)
    if node.op == "placeholder" or not raw.endswith("_") or raw.startswith("_") or not isinstance(dims, list):
        return
    ins = tensor_inputs(node)
    if ins and isinstance(env.get(ins[0]), list) and shape(ins[0]) == shape(node):
        env[ins[0]] = [d if not _is_unknown(d) else old for d, old in zip(dims, env[ins[0]])]


def _fallback_safe(node: fx.Node) -> Any:
    out_shape = shape(node)
    if out_shape is not None:
        return _unknowns(out_shape)
    try:
        return _tensor_unknowns(val(node))
    except RuntimeError:  # a data-dependent (unbacked) size: GuardOnDataDependentSymNode
        return None


def to_labels(dims: Any) -> Any:
    """Public labels from dims: a list of :data:`Label` per tensor (tuples for tuple outputs)."""
    if isinstance(dims, list):
        return [dim_label(d) for d in dims]
    if isinstance(dims, tuple):
        return tuple(to_labels(d) for d in dims)
    return None


def label_graph(cap: Capture, declared_inputs: Optional[list[Label]] = None) -> dict[fx.Node, Any]:
    """Run the axis pass over ``cap.gm``; returns node -> labels (a list of :data:`Label` per tensor, a
    tuple for tuple outputs) and stores them under ``node.meta["normaudit"]["axes"]`` (and the dims with
    their parts, :func:`label_dims`, under ``["axis_dims"]``)."""
    dims = label_dims(cap, declared_inputs)
    env: dict[fx.Node, Any] = {}
    for node, d in dims.items():
        labs = to_labels(d)
        env[node] = labs
        meta = node.meta.setdefault("normaudit", {})
        meta["axes"] = labs
        meta["axis_dims"] = d
    return env


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
