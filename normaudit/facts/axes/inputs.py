"""Labels of the model inputs: parsed from ``--input-axes`` (:func:`parse_input_axes`), else inferred from
an input's name, dtype and rank and the first layer reading it (:func:`input_labels`): token ids, images,
videos, audio, spectrograms (mel bins ordered by the config's mel-bin count), embeddings, sequence-first
inputs of torch.nn RNNs and Transformers, single-channel maps read by a convolution."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import fx, nn

from normaudit.capture import Capture
from normaudit.facts.axes.dims import UNK, Dim, Label
from normaudit.facts.axes.ops import dims_arg, raw_name
from normaudit.vocabulary.axes import parse_axis_spec
from normaudit.vocabulary.graph import FOLLOW, arg, forward_walk, op_name, shape, val


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

    out: list[Label] = [(name,) for name in parse_axis_spec(spec)]
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
    def step(user: fx.Node, n: fx.Node) -> Any:
        # the layer is boxed: the first layer found ends the walk even when it is None (a module the
        # capture does not name, a convolution of a non-3-D input)
        name = op_name(user)
        if name == "module":
            return (cap.modules.get(str(user.target)),)
        if name == "conv":
            return (nn.Conv1d(1, 1, 1) if len(shape(node) or ()) == 3 else None,)
        if name in ("batch_norm", "instance_norm", "group_norm"):
            return ({"batch_norm": nn.BatchNorm1d(1), "instance_norm": nn.InstanceNorm1d(1),
                     "group_norm": nn.GroupNorm(1, 1)}[name],)
        if name in ("linear", "matmul", "layer_norm", "rms_norm", "embedding"):
            return (nn.Identity(),)
        if name in ("to", "alias", "dropout", "contiguous"):
            return FOLLOW
        return FOLLOW if name in ("mul", "div", "add", "sub") and shape(user) == shape(node) else None

    found = forward_walk(node, step, depth=8)
    return found[0] if found is not None else None


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
      (for inputs named like videos ``(batch, channel, sequence, height, width)`` when a 3-D convolution reads
      them, else ``(batch, sequence, channel, height, width)``);
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
        if "video" in name and _read_by_conv3d(node, cap):  # (N, C, T, H, W): Conv3d reads dim 1 as channels
            return [("batch",), ("channel",), ("sequence",), ("height",), ("width",)]
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
        if first is None and _patches_last_axis(node, shp):
            return [("batch",), ("channel",), ("sequence",)]
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
    read by a 1-D convolution (Speech2Text's ``input_features.transpose(1, 2)`` into ``Conv1d``);
    ``"channels"`` when padding alone leads it to a 1-D convolution (``conv1d(F.pad(x, (k - 1, 0)))``, a
    causal convolution: ``(B, C, T)`` as Conv1d reads it); None otherwise (padding, casts and a transpose of the map's spatial dims may come between)."""
    frontier = [(node, "input")]
    for _ in range(8):
        nxt = []
        for n, state in frontier:
            for user in n.users:
                conv = _conv_rank(user, cap)
                if conv is not None and (state, conv) in (("map", 2), ("channels_last", 1)):
                    return state
                if conv == 1 and state == "input" and user.args and user.args[0] is not node:
                    return "channels"  # padded (F.pad, causal or not) and read by a 1-D conv as (B, C, T)
                step = _conv_path_step(user, n, state) if conv is None else None
                if step is not None:
                    nxt.append((user, step))
        frontier = nxt
    return None


def _read_by_conv3d(node: fx.Node, cap: Capture) -> bool:
    """True when a rank-5 input reaches a 3-D convolution through padding, casts and copies only
    (:data:`_CONV_PATH_OPS`): the convolution reads dim 1 as channels and dims 2-4 as (time or depth, height,
    width), PyTorch's ``Conv3d`` layout ``(N, C, D, H, W)``."""
    frontier = [node]
    for _ in range(6):
        nxt = []
        for n in frontier:
            for user in n.users:
                if _conv_rank(user, cap) == 3 and user.args and user.args[0] is n:
                    return True
                name = op_name(user)
                if (name in _CONV_PATH_OPS or raw_name(user) in _CONV_PATH_OPS) and user.args and user.args[0] is n:
                    nxt.append(user)
        frontier = nxt
    return False


_LAYOUT_OPS = ("view", "reshape", "_unsafe_view", "permute", "transpose", "contiguous", "flatten", "clone")


def _patches_last_axis(node: fx.Node, shp: Any) -> bool:
    """True when a rank-3 input ``(B, X, L)`` is cut into patches along its last axis by layout ops alone,
    the 1-D patch embedding ``Rearrange('b c (n p) -> b n (p c)')`` written as ``view(B, X, n, p)``,
    ``permute(0, 2, 3, 1)`` and ``reshape(B, n, p * X)`` (or ``transpose(1, 2).reshape(B, n, p * X)``): a
    tensor of shape ``(B, L / p, p * X)`` for some patch size ``1 < p < L`` is reached through a permute or
    transpose. The input is then a signal ``(batch, channel, length)`` and each token a patch of its
    samples and channels, as a 2-D ViT's patches are of pixels."""
    dims = [int(d) if isinstance(d, int) else None for d in shp]
    if None in dims:
        return False
    b, x, length = dims
    frontier, moved = [(node, False)], False
    for _ in range(5):
        nxt = []
        for n, moved in frontier:
            for user in n.users:
                name = op_name(user)
                if not (name in _LAYOUT_OPS or raw_name(user) in _LAYOUT_OPS) or not user.args or user.args[0] is not n:
                    continue
                now = moved or name in ("permute", "transpose") or raw_name(user) in ("permute", "transpose")
                us = shape(user)
                if now and us is not None and len(us) == 3 and us[0] == b and us[1] * us[2] == x * length:
                    p = us[2] // x if us[2] % x == 0 else 0
                    if 1 < p < length and length % p == 0 and us[1] == length // p:
                        return True
                nxt.append((user, now))
        frontier = nxt
    return False


def _conv_path_step(user: fx.Node, src: fx.Node, state: str) -> Optional[str]:
    """One step of :func:`_conv_reading`: the layout state after ``user`` reads ``src`` (``"input"``: no
    layout op yet, ``"map"``, ``"channels_last"``), None when the path ends there."""
    name, rank = op_name(user), len(shape(src) or ())
    if name in _CONV_PATH_OPS or raw_name(user) in _CONV_PATH_OPS:
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
    if op_name(node) == "permute" or raw_name(node) == "permute":
        dims = dims_arg(node, 1, "dims")
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
    convolution is ``(batch, sequence, feature)``; a padded input read by a 1-D convolution ``(batch, channel,
    sequence)``."""
    if layout == "channels_last":
        return [("batch",), ("sequence",), ("feature",)]
    if layout == "channels":
        return [("batch",), ("channel",), ("sequence",)]
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


def input_dims(node: fx.Node, cap: Capture, declared: Optional[list[Label]]) -> list[Dim]:
    """The dims of a model input: one part per dim, labelled by :func:`input_labels`."""
    shp = shape(node) or ()
    labels = input_labels(node, cap, declared)
    return [((lab, int(s)),) for lab, s in zip(labels, shp)]
