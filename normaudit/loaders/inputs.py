"""Infer example inputs for a model that does not provide ``example_inputs()``.

From the first layer in ``named_modules()`` order: ``Embedding`` -> int64 ``(2, 16)``;
``Conv1d`` -> ``(2, C_in, 64)``; ``Conv2d`` -> ``(2, C_in, 64, 64)``; ``Conv3d`` -> ``(2, C_in, 16, 32, 32)``;
``Linear`` -> ``(2, in_features)``; a norm first -> ``(2, 16, *normalized_shape)`` or ``(2, C, 64, 64)``.

Hugging Face models (a ``config`` attribute and ``main_input_name``) get the inputs their ``forward``
takes, sized from the config and its nested ``text_config``/``vision_config``/``audio_config`` sub-configs,
as transformers' own model tests build them (:func:`infer_hf_inputs`): ``input_ids``, ``pixel_values``
``(B, num_channels, H, W)`` (``(B, num_frames, C, H, W)`` for video models), ``input_features``
``(B, num_mel_bins, frames)`` or ``(B, frames, features)``, ``input_values`` ``(B, samples)``,
``decoder_input_ids`` for encoder-decoders, image placeholder tokens for vision-language models, audio
placeholder tokens for audio-language models; the windows of a time-series forecaster (``past_values``,
``past_time_features``, ``future_values``...), multi-codebook token ids, prompt images, per-language
``lang_ids``, patch positions; required parameters named after a known kind (``qformer_input_ids``).
Where a layout is ambiguous the candidates are tried on the meta device (no weight memory) and the first
that runs is kept.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import math
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

BATCH, SEQ, SIDE = 2, 16, 64
#: audio samples of a raw-waveform input (0.2 s at 16 kHz; wav2vec2's feature encoder strides by 320)
SAMPLES = 3200
#: spectrogram frames of a (B, frames, features) input (speech_to_text subsamples by 4)
FRAMES = 64

#: sub-configs that hold the text model: ``model_config``, the model a wrapper config holds beside its vocoder
#: (FastSpeech2 + HiFi-GAN: its 78-token ``vocab_size`` lies there; the default 100 overran the embedding)
_TEXT = ("text_config", "model_config")
_VISION = ("vision_config", "image_config", "video_config")
_AUDIO = ("audio_config", "speech_config", "encoder_config", "asr_config", "semantic_model_config")
#: sub-configs whose presence says the model has an audio tower (``encoder_config`` alone does not)
_AUDIO_TOWERS = ("audio_config", "speech_config")
#: log-mel widths of the feature extractors of transformers' speech models (Whisper-v3, Parakeet, Gemma
#: audio: 128; Whisper, Conformer/FastConformer, Speech2Text: 80), tried when the config names no width
MEL_WIDTHS = (128, 80)


def _ids(vocab: int, shape=(BATCH, SEQ)) -> torch.Tensor:
    return torch.randint(0, max(int(vocab), 1), shape, dtype=torch.int64)


def _configs(config: Any, subs: tuple[str, ...], depth: int = 2) -> list[Any]:
    """The sub-configs named in ``subs`` that ``config`` has (and theirs, ``depth`` levels down: NeMo
    SpeechLM's ``audio_config.asr_config``), deepest first, then ``config`` itself."""
    out: list[Any] = []
    for name in subs:
        sub = getattr(config, name, None)
        if sub is not None and not isinstance(sub, (dict, str, list, tuple, int, float)) and sub is not config:
            out += _configs(sub, subs, depth - 1) if depth > 1 else [sub]
    return out + [config]


def cfg_value(config: Any, names: tuple[str, ...], subs: tuple[str, ...] = (), default: Any = None) -> Any:
    """The first of ``names`` set (not None) on the sub-configs ``subs`` of ``config``, then on ``config``."""
    for c in _configs(config, subs):
        for n in names:
            v = getattr(c, n, None)
            if v is not None:
                return v
    return default


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _pair(size: Any) -> tuple[int, int]:
    if isinstance(size, dict):
        size = size.get("height", size.get("shortest_edge", SIDE)), size.get("width", size.get("shortest_edge", SIDE))
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def _text_ids(config: Any) -> torch.Tensor:
    vocab = cfg_value(config, ("vocab_size",), _TEXT, 100)
    return _ids(min(int(vocab), 100))


#: config keys that count the codebooks (token streams) of an audio-token model (Bark's fine model:
#: ``n_codes_total``)
CODEBOOK_KEYS = ("num_codebooks", "n_codes_total")


def _token_ids(config: Any) -> Iterator[torch.Tensor]:
    """Token-id candidates: ``(B, S)``; for a model over several codebooks (K, :data:`CODEBOOK_KEYS` of the
    config) also the multi-stream layouts of transformers' audio-token models: ``(B, S, K + 1)`` (Kyutai
    STT: the text stream and K audio streams; Bark's fine model embeds its first K, ``input_ids[:, :, i]``),
    ``(B, K, S)`` (Moshi-style), ``(B * K, S)`` (MusicGen)."""
    ids = _text_ids(config)
    yield ids
    k = cfg_value(config, CODEBOOK_KEYS, _TEXT + _AUDIO)
    if _is_int(k) and k <= 64:
        vocab = min(int(cfg_value(config, ("vocab_size",), _TEXT, 100)), 100)
        yield _ids(vocab, (BATCH, SEQ, int(k) + 1))
        yield _ids(vocab, (BATCH, int(k), SEQ))
        yield _ids(vocab, (BATCH * int(k), SEQ))


_IMAGE_SIZE_KEYS = ("image_size", "input_size", "img_size")


def _image_size(config: Any) -> Any:
    """The config's image size (:data:`_IMAGE_SIZE_KEYS` on it or its vision sub-configs), else the one of
    the backbone a vision sub-config holds (SAM2, EdgeTAM: ``vision_config.backbone_config.image_size``,
    1024, which the FPN's ``backbone_feature_sizes`` are built for), else :data:`SIDE`."""
    size = cfg_value(config, _IMAGE_SIZE_KEYS, _VISION)
    if size is not None:
        return size
    for sub in _configs(config, _VISION, depth=1)[:-1]:
        size = cfg_value(getattr(sub, "backbone_config", None), _IMAGE_SIZE_KEYS)
        if size is not None:
            return size
    return SIDE


def _image(config: Any) -> torch.Tensor:
    """``(B, C, H, W)``, or ``(B, T, C, H, W)`` for a video model (``num_frames`` in the config)."""
    channels = int(cfg_value(config, ("num_channels", "in_channels", "input_channels"), _VISION, 3))
    h, w = _pair(_image_size(config))
    side = max(_query_side(config), _pyramid_side(config))
    h, w = max(h, side), max(w, side)
    frames = cfg_value(config, ("num_frames",), _VISION)
    if isinstance(frames, int) and frames > 0:
        return torch.randn(BATCH, frames, channels, h, w)
    return torch.randn(BATCH, channels, h, w)


def _pyramid_side(config: Any) -> int:
    """Smallest image side for a model that rescales the image by each of ``scaled_images_ratios`` and cuts
    every scaled copy into ``patch_size`` square patches (DepthPro: ratios 0.25, 0.5, 1 and 384-pixel
    patches need 1536, as its forward raises below ``min(ratios) * side < patch_size``): ``ceil(patch_size
    / min(ratios))``. 0 when the config has no such pyramid."""
    ratios, patch = getattr(config, "scaled_images_ratios", None), getattr(config, "patch_size", None)
    if not (isinstance(ratios, (list, tuple)) and ratios and _is_int(patch)
            and all(isinstance(r, (int, float)) and r > 0 for r in ratios)):
        return 0
    return math.ceil(int(patch) / min(min(ratios), 1))


#: strides of the backbone maps a two-stage DETR reads when its config names none (ResNet C3-C5, Swin
#: stages 2-4: Deformable DETR, Grounding DINO)
DETR_STRIDES = (8, 16, 32)


def _query_side(config: Any) -> int:
    """Smallest square side (a multiple of the coarsest stride) whose multi-scale feature maps hold at least
    ``num_queries`` tokens, for a detector that picks its decoder queries by ``topk(num_queries)`` over the
    encoder's flattened maps (RT-DETR, D-FINE, PP-DocLayout: ``feat_strides`` 8, 16, 32 and 300 queries need
    128 x 128: 256 + 64 + 16 tokens; a ``two_stage`` DETR without ``feat_strides``: :data:`DETR_STRIDES`,
    Grounding DINO's 900 queries over 4 levels need 256 x 256). Levels past ``feat_strides`` (``num_feature_levels``) each halve the
    last map, as the models' extra stride-2 convolutions do. 0 when the config has no such keys."""
    strides, queries = getattr(config, "feat_strides", None), getattr(config, "num_queries", None)
    if strides is None and getattr(config, "two_stage", None) is True:
        strides = DETR_STRIDES
    if not (isinstance(strides, (list, tuple)) and strides and all(_is_int(s) for s in strides)
            and _is_int(queries)):
        return 0
    strides = [int(s) for s in strides]
    levels = getattr(config, "num_feature_levels", None)
    while _is_int(levels) and len(strides) < levels:
        strides.append(strides[-1] * 2)
    step = max(strides)
    side = step
    while sum((-(-side // s)) ** 2 for s in strides) < queries and side < 4096:
        side += step
    return side


#: frames of a video input when the config names none (InstructBLIP-Video's tests use 4)
VIDEO_FRAMES = 4


def _images(config: Any) -> Iterator[torch.Tensor]:
    """Image candidates: :func:`_image`; half of ``image_size``'s height when it is twice the width
    (SegGPT: ``image_size`` is the prompt and the input stacked, each input half of it); an image pair
    ``(B, 2, C, H, W)`` (keypoint matchers: EfficientLoFTR, SuperGlue, LightGlue); a clip of
    :data:`VIDEO_FRAMES` frames ``(B, T, C, H, W)`` for a video model whose config names no frame count."""
    first = _image(config)
    yield first
    if first.dim() == 4:
        b, c, h, w = first.shape
        if h == 2 * w:
            yield torch.randn(b, c, h // 2, w)
        yield torch.randn(b, 2, c, h, w)
        yield torch.randn(b, VIDEO_FRAMES, c, h, w)


def _videos(config: Any) -> Iterator[torch.Tensor]:
    """Video candidates ``(B, T, C, H, W)``: the config's ``num_frames``, else :data:`VIDEO_FRAMES` frames."""
    first = _image(config)
    yield first if first.dim() == 5 else first.unsqueeze(1).expand(-1, VIDEO_FRAMES, -1, -1, -1).contiguous()


def _lang_ids(config: Any) -> Iterator[torch.Tensor]:
    """X-MOD's ``lang_ids`` ``(B,)``: the first language of ``config.languages`` (its adapters are chosen
    per example by index); nothing when the config lists no languages."""
    languages = getattr(config, "languages", None)
    if isinstance(languages, (list, tuple)) and languages:
        yield torch.zeros(BATCH, dtype=torch.int64)


#: page coordinates of a document model's word boxes: LayoutLM's tokenizers normalise them to 0-1000
BOX_RANGE = 1000


def _bboxes(config: Any) -> Iterator[torch.Tensor]:
    """Word boxes of a document model, one per token of :func:`_text_ids`: legal ``(x0, y0, x1, y1)``
    (``x0 <= x1``, ``y0 <= y1``), as transformers' LayoutLM/Bros/UDOP model tests make them legal.

    ``(B, S, dim_bbox)`` where the config names the width (Bros: 8, the four corners
    ``(x0, y0), (x1, y0), (x1, y1), (x0, y1)``), else ``(B, S, 4)``. With ``max_2d_position_embeddings`` in
    the config (coordinates looked up in position tables: LayoutLM, LayoutLMv2/v3, LiLT, UDOP, whose tests
    draw them as ``ids_tensor(..., 1000)``) int64 coordinates in ``[0, min(1000, max_2d_position_embeddings -
    1)]`` first, then float ones in ``[0, 1]`` (Bros scales them by ``bbox_scale``): a meta forward stops at
    a data-dependent step (the padding check on ``input_ids``) before either dtype is read, so it cannot
    choose between them."""
    width = getattr(config, "dim_bbox", None)
    width = int(width) if _is_int(width) and width in (4, 8) else 4
    corner = torch.rand(BATCH, SEQ, 2) / 2
    box = torch.cat([corner, corner + torch.rand(BATCH, SEQ, 2) / 2], dim=-1)  # x0, y0, x1, y1 in [0, 1]
    if width == 8:
        box = box[..., [0, 1, 2, 1, 2, 3, 0, 3]]
    table = getattr(config, "max_2d_position_embeddings", None)
    if _is_int(table):
        yield (box * min(BOX_RANGE, int(table) - 1)).to(torch.int64)
    yield box.contiguous()


def _features(config: Any) -> Iterator[torch.Tensor]:
    """Spectrogram candidates: Whisper-style ``(B, mel, 2 * max_source_positions)``, Qwen3-ASR-style
    ``(B, mel, 2 * n_window)``, then ``(B, frames, F)``."""
    mel = cfg_value(config, ("num_mel_bins",), _AUDIO)
    positions = cfg_value(config, ("max_source_positions",), _AUDIO)
    if mel and positions:
        yield torch.randn(BATCH, int(mel), 2 * int(positions))
    window = cfg_value(config, ("n_window",), _AUDIO)
    if mel and _is_int(window):  # Qwen3-ASR: frames a multiple of two attention windows
        yield torch.randn(BATCH, int(mel), 2 * int(window))
    per = cfg_value(config, ("input_feat_per_channel",), _AUDIO)
    if per:
        yield torch.randn(BATCH, FRAMES, int(per) * int(cfg_value(config, ("input_channels",), _AUDIO, 1)))
    size = cfg_value(config, ("feature_size", "feature_projection_input_dim", "input_dim", "num_mel_bins"), _AUDIO)
    stacked = cfg_value(config, ("num_stacked_frames",), _AUDIO)
    if size and _is_int(stacked):  # FunASR low-frame-rate input: consecutive frames stacked into one vector
        yield torch.randn(BATCH, FRAMES, int(size) * int(stacked))
    for width in [int(size)] if size else MEL_WIDTHS:
        yield torch.randn(BATCH, FRAMES, width)
        yield torch.randn(BATCH, 1, FRAMES * 4, width)
        yield torch.randn(BATCH, width, FRAMES * 4)


def _values(config: Any) -> Iterator[torch.Tensor]:
    """Waveform candidates ``(B, samples)``, ``(B, channels, samples)``; AST-style ``(B, max_length, mel)``."""
    mel, length = cfg_value(config, ("num_mel_bins",), _AUDIO), cfg_value(config, ("max_length",), _AUDIO)
    if mel and isinstance(length, int):
        yield torch.randn(BATCH, length, int(mel))
    channels = cfg_value(config, ("audio_channels", "channels"), _AUDIO)
    samples = _samples(config)
    if isinstance(channels, int):
        yield torch.randn(BATCH, channels, samples)
    yield torch.randn(BATCH, samples)
    yield torch.randn(BATCH, 1, samples)


#: config keys whose product is a codec's hop (samples per frame): DAC/XCodec/NeuCodec ``downsampling_ratios``,
#: EnCodec/Mimi ``upsampling_ratios``, MuseSpark's ``patch_sizes``
_HOP_KEYS = ("downsampling_ratios", "upsampling_ratios", "patch_sizes")


def _hop(config: Any) -> int:
    """Samples per frame of a codec: the product of :data:`_HOP_KEYS`, or ``hop_length``; 1 when the config
    gives neither (or a hop outside 2-48000)."""
    hop = 1
    ratios = cfg_value(config, _HOP_KEYS, _AUDIO + ("acoustic_model_config",))
    if isinstance(ratios, (list, tuple)) and ratios and all(_is_int(r) for r in ratios):
        for r in ratios:
            hop *= int(r)
    else:
        length = cfg_value(config, ("hop_length",), _AUDIO + ("acoustic_model_config",))
        hop = int(length) if _is_int(length) else 1
    return hop if 1 < hop <= 48000 else 1


def _samples(config: Any) -> int:
    """Waveform length: :data:`SAMPLES`, rounded up to a whole number of the codec's frames (:func:`_hop`)
    when the config gives one (some codecs require it)."""
    hop = _hop(config)
    return -(-SAMPLES // hop) * hop


def _with_aligned_frames(config: Any, choices: dict[str, list[torch.Tensor]]) -> None:
    """For a codec that encodes a waveform and its spectrogram together (XCodec2, NeuCodec: an acoustic
    encoder on ``input_values`` and a semantic one on ``input_features``, concatenated frame by frame), put
    first, in place, ``input_features`` candidates ``(B, samples / hop, F)`` of one frame per hop of the
    waveform, for each width ``F`` of the ``(B, T, F)`` candidates, and the mono ``(B, 1, samples)``
    waveform first (as XCodec2's model test builds them: its mel hop equals the acoustic hop)."""
    hop = _hop(config)
    values, features = choices.get("input_values"), choices.get("input_features")
    if hop == 1 or not values or not features:
        return
    samples = _samples(config)
    widths = dict.fromkeys(int(t.shape[-1]) for t in features if t.dim() == 3)
    aligned = [torch.randn(BATCH, samples // hop, w) for w in widths]
    features[:0] = aligned
    values.sort(key=lambda t: tuple(t.shape) != (BATCH, 1, samples))  # stable: the mono waveform first


def _patches(config: Any) -> Iterator[torch.Tensor]:
    """Qwen2-VL-style flattened patches ``(B * g * g, C * temporal_patch * patch * patch)`` (the temporal
    patch is ``temporal_patch_size``, MuseSpark's ``patch_temporal``) for a ``g x g``
    patch grid per image (``g`` = 2 merge windows), with :func:`_grid` giving ``image_grid_thw``; then the
    same patches unflattened, ``(B * g * g, C, patch, patch)`` (Kimi-K2.5's tower convolves each patch)."""
    g = _grid_side(config)
    channels = int(cfg_value(config, ("in_channels", "num_channels"), _VISION, 3))
    temporal = int(cfg_value(config, ("temporal_patch_size", "patch_temporal"), _VISION, 1))
    patch = int(cfg_value(config, ("patch_size",), _VISION, 14))
    yield torch.randn(BATCH * g * g, channels * temporal * patch * patch)
    if temporal == 1:
        yield torch.randn(BATCH * g * g, channels, patch, patch)


def _grid_side(config: Any) -> int:
    return 2 * int(cfg_value(config, ("spatial_merge_size", "merge_size"), _VISION, 1))


def _grid(config: Any) -> torch.Tensor:
    g = _grid_side(config)
    return torch.tensor([[1, g, g]] * BATCH, dtype=torch.int64)


def _merge_sizes(config: Any) -> torch.Tensor:
    """VideoLLaMA3-style ``merge_sizes``: one spatial merge size per image of :func:`_grid`."""
    merge = int(cfg_value(config, ("spatial_merge_size", "merge_size"), _VISION, 1))
    return torch.tensor([merge] * BATCH, dtype=torch.int64)


def _packed_grid_side(config: Any) -> int:
    """Side of each image's patch grid in :func:`_packed_patches`: two merge windows
    (``window_kernel_size``, MiniCPM-V's ViT merger), else 4."""
    window = cfg_value(config, ("window_kernel_size",), _VISION)
    if isinstance(window, (list, tuple)) and window and all(_is_int(w) for w in window):
        return 2 * max(int(w) for w in window)
    return 2 * int(window) if _is_int(window) else 4


def _packed_patches(config: Any) -> Iterator[torch.Tensor]:
    """NaViT-style packed images (MiniCPM-V): the patches of :data:`BATCH` images of ``g x g`` patches
    (:func:`_packed_grid_side`) laid side by side in one row, ``(1, C, patch, B * g * g * patch)``; the
    tower's patch convolution gives one token per patch, split into images by ``target_sizes``."""
    g = _packed_grid_side(config)
    channels = int(cfg_value(config, ("num_channels", "in_channels"), _VISION, 3))
    patch = int(cfg_value(config, ("patch_size",), _VISION, 14))
    yield torch.randn(1, channels, patch, BATCH * g * g * patch)


def _target_sizes(config: Any) -> torch.Tensor:
    """``target_sizes`` ``(B, 2)``: the (height, width) in patches of each image of :func:`_packed_patches`."""
    g = _packed_grid_side(config)
    return torch.tensor([[g, g]] * BATCH, dtype=torch.int64)


def _position_grid_side(config: Any) -> int:
    """Side of the patch grid of :func:`_patch_rows`: two pooling windows (``pooling_kernel_size``)."""
    return 2 * int(cfg_value(config, ("pooling_kernel_size",), _VISION, 2))


def _patch_rows(config: Any) -> Iterator[torch.Tensor]:
    """Gemma-4-style patchified images ``(B, g * g, C * patch * patch)`` for a ``g x g`` patch grid
    (:func:`_position_grid_side`), with :func:`_patch_positions` giving ``pixel_position_ids``."""
    g = _position_grid_side(config)
    channels = int(cfg_value(config, ("num_channels", "in_channels"), _VISION, 3))
    patch = int(cfg_value(config, ("patch_size",), _VISION, 16))
    yield torch.randn(BATCH, g * g, channels * patch * patch)


def _patch_positions(config: Any) -> Iterator[torch.Tensor]:
    """``pixel_position_ids`` ``(B, g * g, 2)``: the (x, y) of each patch of :func:`_patch_rows`, row by row
    (no padding patch, which would be ``(-1, -1)``)."""
    g = _position_grid_side(config)
    ys, xs = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
    grid = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
    yield grid.unsqueeze(0).expand(BATCH, -1, -1).contiguous()


def _patch_mask(config: Any) -> Iterator[torch.Tensor]:
    """``pixel_attention_mask`` ``(B, g * g)`` over the patch rows of :func:`_patch_rows`: every patch
    valid (int64 ones, as Siglip2's image processor gives)."""
    g = _position_grid_side(config)
    yield torch.ones(BATCH, g * g, dtype=torch.int64)


def _spatial_shapes(config: Any) -> Iterator[torch.Tensor]:
    """``spatial_shapes`` ``(B, 2)``: the (height, width) in patches of each image of :func:`_patch_rows`."""
    g = _position_grid_side(config)
    yield torch.tensor([[g, g]] * BATCH, dtype=torch.int64)


def _mel_frames(config: Any) -> Iterator[torch.Tensor]:
    """Gemma3n-style ``audio_mel`` ``(B, frames, mel)`` (``input_feat_size`` or ``num_mel_bins`` wide)."""
    mel = cfg_value(config, ("input_feat_size", "num_mel_bins", "feature_size"), _AUDIO)
    if mel:
        yield torch.randn(BATCH, FRAMES, int(mel))


def _past_length(config: Any) -> int:
    """Time steps of a forecaster's ``past_values``: ``context_length + max(lags_sequence)`` for the lagged
    models (TimeSeriesTransformer, Informer, Autoformer: ``config._past_length`` in transformers), else
    ``context_length`` (PatchTST, PatchTSMixer)."""
    context = int(cfg_value(config, ("context_length",), (), SEQ))
    lags = getattr(config, "lags_sequence", None)
    if isinstance(lags, (list, tuple)) and lags and all(_is_int(v) for v in lags):
        return context + max(lags)
    return context


def _series(config: Any, length: int) -> torch.Tensor:
    """A target series over ``length`` steps: ``(B, T)`` for one variate (``input_size`` 1), ``(B, T, V)``
    for ``V`` variates (``input_size`` of the lagged models, ``num_input_channels`` of PatchTST)."""
    lagged = getattr(config, "lags_sequence", None) is not None
    variates = cfg_value(config, ("input_size",) if lagged else ("num_input_channels", "input_size"), (), 1)
    if lagged and int(variates) == 1:
        return torch.randn(BATCH, length)
    return torch.randn(BATCH, length, int(variates))


def _time_features(config: Any, length: int) -> torch.Tensor:
    """``(B, T, num_time_features + num_dynamic_real_features)``: the covariates a lagged forecaster
    concatenates to its lagged inputs (width 0 when the config has none)."""
    width = sum(int(getattr(config, k, 0) or 0) for k in ("num_time_features", "num_dynamic_real_features"))
    return torch.randn(BATCH, length, width)


def _prediction_length(config: Any) -> int:
    return int(cfg_value(config, ("prediction_length",), (), SEQ // 2))


def _static_categorical(config: Any) -> Iterator[torch.Tensor]:
    """``(B, num_static_categorical_features)`` category ids below each feature's ``cardinality``; nothing
    when the config has no static categorical feature (forward then takes None)."""
    count = int(getattr(config, "num_static_categorical_features", 0) or 0)
    cards = list(getattr(config, "cardinality", None) or [])
    if count > 0 and len(cards) >= count and all(_is_int(c) for c in cards[:count]):
        yield torch.stack([torch.randint(0, c, (BATCH,)) for c in cards[:count]], dim=1)


def _static_real(config: Any) -> Iterator[torch.Tensor]:
    count = int(getattr(config, "num_static_real_features", 0) or 0)
    if count > 0:
        yield torch.randn(BATCH, count)


def _past_values(config: Any) -> Iterator[torch.Tensor]:
    """``past_values`` candidates: :func:`_series` over :func:`_past_length` steps; for one variate also
    ``(B, T)`` (TimesFM patches a univariate ``(B, T)`` series into ``patch_length`` chunks)."""
    series = _series(config, _past_length(config))
    yield series
    if series.dim() == 3 and series.shape[-1] == 1:
        yield series[..., 0].contiguous()


#: the inputs of transformers' time-series forecasters, as their model tests build them
#: (``TimeSeriesTransformerModelTester.prepare_config_and_inputs``): past and future windows of the series,
#: their time features, an all-observed mask; TimesFM's padding flags (0: observed, float as the model
#: computes ``1 - pad``) and frequency class ``(B, 1)`` (0: high frequency). Given future values, the models run their decoders too.
SERIES_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "past_values": lambda c: _past_values(c),
    "past_values_padding": lambda c: iter([torch.zeros(BATCH, _past_length(c))]),
    "freq": lambda c: iter([torch.zeros(BATCH, 1, dtype=torch.int64)]),
    "past_time_features": lambda c: iter([_time_features(c, _past_length(c))]),
    "past_observed_mask": lambda c: iter([torch.ones_like(_series(c, _past_length(c)), dtype=torch.bool)]),
    "future_values": lambda c: iter([_series(c, _prediction_length(c))]),
    "future_time_features": lambda c: iter([_time_features(c, _prediction_length(c))]),
    "static_categorical_features": _static_categorical,
    "static_real_features": _static_real,
}


def _trajectory(config: Any, key: Optional[str]) -> Iterator[torch.Tensor]:
    """One step-aligned stream of an offline-RL trajectory ``(B, SEQ, width)``: ``config.<key>`` wide
    (``state_dim`` states, ``act_dim`` actions), one wide for ``key`` None (rewards, returns-to-go); nothing
    when the config has no ``state_dim`` (no trajectory model)."""
    width = 1 if key is None else cfg_value(config, (key,))
    if _is_int(cfg_value(config, ("state_dim",))) and _is_int(width):
        yield torch.randn(BATCH, SEQ, int(width))


def _timesteps(config: Any) -> Iterator[torch.Tensor]:
    """Each trajectory step's time index ``(B, SEQ)`` int64, below ``max_ep_len`` (the timestep embedding's
    rows); nothing without a ``state_dim`` and ``max_ep_len``."""
    length = cfg_value(config, ("max_ep_len",))
    if _is_int(cfg_value(config, ("state_dim",))) and _is_int(length):
        yield torch.arange(SEQ).remainder(int(length)).expand(BATCH, SEQ).contiguous()


#: a Decision-Transformer-style trajectory, as its model test builds it: states ``(B, T, state_dim)``, actions
#: ``(B, T, act_dim)``, rewards and returns-to-go ``(B, T, 1)``, timesteps ``(B, T)`` int64
TRAJECTORY_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "states": lambda c: _trajectory(c, "state_dim"), "actions": lambda c: _trajectory(c, "act_dim"),
    "rewards": lambda c: _trajectory(c, None), "returns_to_go": lambda c: _trajectory(c, None),
    "timesteps": _timesteps,
}


def _one(fn: Callable[[Any], torch.Tensor]) -> Callable[[Any], Iterator[torch.Tensor]]:
    return lambda config: iter([fn(config)])


#: forward parameter -> candidate tensors built from the config, first choice first
BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "input_ids": _token_ids, "decoder_input_ids": _one(_text_ids), "pixel_values": _images,
    "pixel_values_videos": _videos, "lang_ids": _lang_ids, "input_features": _features, "input_values": _values,
    "audio_mel": _mel_frames, "bbox": _bboxes, **SERIES_BUILDERS, **TRAJECTORY_BUILDERS,
}
#: optional forward inputs built whenever ``forward`` takes them, as they switch on a part of the model the
#: main input alone leaves un-run (a forecaster's decoder runs on ``future_values``); left out when their
#: builder gives nothing for this config (no static features)
EXTRAS = ("future_values", "future_time_features", "static_categorical_features", "static_real_features",
          "lang_ids", "bbox", *TRAJECTORY_BUILDERS)
#: inputs given besides ``main_input_name`` when ``forward`` takes them: the other towers of a multimodal model
COMPANIONS = ("input_ids", "pixel_values", "input_features", "pixel_values_videos", "input_values")
#: when ``forward`` takes the key, the inputs are built by the value's builders instead (patch-list VLMs)
VARIANTS: dict[str, dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = {
    "image_grid_thw": {"pixel_values": _patches, "image_grid_thw": _one(_grid)},
    # Gemma 4's vision tower: patch rows with their (x, y) positions
    "pixel_position_ids": {"pixel_values": _patch_rows, "pixel_position_ids": _patch_positions},
    # NaFlex patch rows with their validity mask and each image's patch grid (Siglip2)
    "spatial_shapes": {"pixel_values": _patch_rows, "pixel_attention_mask": _patch_mask,
                       "spatial_shapes": _spatial_shapes},
    # NaViT-style packed patches with each image's patch grid (MiniCPM-V)
    "target_sizes": {"pixel_values": _packed_patches, "target_sizes": _one(_target_sizes)},
    # vision towers of patch-list VLMs called alone: ``forward(pixel_values | hidden_states, grid_thw)``
    "grid_thw": {"pixel_values": _patches, "hidden_states": _patches, "grid_thw": _one(_grid),
                 "merge_sizes": _one(_merge_sizes)},
}
#: required forward parameters ending so are masks over the time axis of the input they name the prefix
#: of (``input_features_mask``, ``audio_mel_mask``): all positions valid
_MASK_SUFFIX = "_mask"


#: name endings of required ``forward`` parameters that are one more input of a known kind: a second text
#: stream (InstructBLIP's ``qformer_input_ids``), a prompt image and its masks (SegGPT's
#: ``prompt_pixel_values``, ``prompt_masks``: image-shaped, as its model test builds them)
SUFFIX_BUILDERS: tuple[tuple[str, str], ...] = (("input_ids", "input_ids"), ("pixel_values", "pixel_values"),
                                                ("_masks", "pixel_values"))


def _with_suffix_builders(params: dict[str, inspect.Parameter],
                          builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> None:
    """Give the required parameters of ``forward`` no builder knows by name the builder of the input kind
    their name ends with (:data:`SUFFIX_BUILDERS`), in place."""
    for name in _required(params):
        if name in builders:
            continue
        kind = next((k for end, k in SUFFIX_BUILDERS if name.endswith(end) and k in builders), None)
        if kind is not None:
            builders[name] = builders[kind]


#: values tried, first choice first, for a required ``int`` parameter of ``forward`` (an index into the
#: model's own tables: Bark's fine model predicts codebook ``codebook_idx``, refuses 0, the coarse model's,
#: and picks ``lm_heads[codebook_idx - n_codes_given]``); a meta forward keeps the first the model accepts
INT_CANDIDATES = (1, 0)


def _is_int_annotation(param: inspect.Parameter) -> bool:
    return param.annotation is int or param.annotation == "int"


def _with_int_builders(params: dict[str, inspect.Parameter],
                       builders: dict[str, Callable[[Any], Iterator[Any]]]) -> None:
    """Give each required ``int`` parameter of ``forward`` no builder knows the :data:`INT_CANDIDATES`, in
    place: without it such a model gets no inputs at all (Bark's fine model, whose ``main_input_name`` is
    its int ``codebook_idx``). The candidates are plain ints, passed as such (export keeps them constant)."""
    for name in _required(params):
        if name not in builders and _is_int_annotation(params[name]):
            builders[name] = lambda config: iter(INT_CANDIDATES)


def _main_input_name(model: Any) -> Optional[str]:
    """``model.main_input_name``: a string, or for a model with several main inputs (transformers allows a
    list: OneFormer's ``["pixel_values", "task_inputs"]``) the first of them; None when there is none."""
    name = getattr(model, "main_input_name", None)
    if isinstance(name, (list, tuple)):
        name = next((n for n in name if isinstance(n, str)), None)
    return name if isinstance(name, str) else None


def _with_renamed_main(model: nn.Module, params: dict[str, inspect.Parameter],
                       builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> None:
    """When ``forward`` does not name ``main_input_name`` and no required parameter has a builder, give the
    first required parameter the builder of the main input, in place: VibeVoice's acoustic tokenizer
    encoder declares ``input_values`` but its forward takes the waveform as ``hidden_states`` ``(B, 1, T)``.
    Not for an ``input_ids`` main input (the name towers inherit from ``PreTrainedModel`` whatever they take)."""
    main, required = _main_input_name(model), _required(params)
    if (main in _named(params) or main == "input_ids" or main not in builders or not required
            or any(n in builders for n in required)):
        return
    builders[required[0]] = builders[main]


#: main inputs that are float features of some width (a waveform, a spectrogram), given the widths the model
#: declares (:func:`_width_candidates`) after their own candidates
_FEATURE_INPUTS = ("input_values", "input_features")


def _first_layer_width(model: nn.Module) -> Optional[torch.Tensor]:
    """The input the model's first ``Linear``/``Conv1d`` (in ``named_modules()`` order) takes: ``(B, FRAMES,
    in_features)`` for a ``Linear`` (Granite Speech 5 projects 4 stacked delta-expanded mel frames, a width
    no config key holds), ``(B, in_channels, SEQ)`` for a ``Conv1d`` (a codec decoder's latents ``(B, latent
    channels, frames)``). None when no such layer comes before an ``Embedding``."""
    for _, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            return None
        if isinstance(module, nn.Linear):
            return torch.randn(BATCH, FRAMES, module.in_features)
        if isinstance(module, nn.Conv1d):
            return torch.randn(BATCH, module.in_channels, SEQ)
    return None


def _width_candidates(model: nn.Module, config: Any) -> Iterator[torch.Tensor]:
    """Main-input candidates for a model whose input is already features of a width it declares, not raw
    data: the first layer's input (:func:`_first_layer_width`), then hidden states ``(B, SEQ, width)`` of the
    config's ``hidden_size``/``d_model`` (SpeechT5 without pre-nets takes ``input_values`` so, Perceiver
    without a preprocessor its ``inputs``, as their model tests build them)."""
    first = _first_layer_width(model)
    if first is not None:
        yield first
    width = cfg_value(config, ("d_model", "hidden_size"))
    if _is_int(width) and 0 < int(width) <= 65536:
        yield torch.randn(BATCH, SEQ, int(width))


def _feature_main(model: nn.Module, params: dict[str, inspect.Parameter],
                  builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> Optional[str]:
    """The forward parameter that takes the main input when that is float features: ``main_input_name``
    (one of :data:`_FEATURE_INPUTS`, or a name no builder knows: Perceiver's ``inputs``), or the required
    parameter given its builder by :func:`_with_renamed_main`. None otherwise (token ids, images)."""
    main = _main_input_name(model)
    if main is None or (main in builders and main not in _FEATURE_INPUTS):
        return None
    if main in _named(params):
        return main
    return next((n for n in _required(params) if main in builders and builders.get(n) is builders[main]), None)


def _with_width_inputs(model: nn.Module, params: dict[str, inspect.Parameter],
                       builders: dict[str, Callable[[Any], Iterator[torch.Tensor]]]) -> None:
    """Give the float-features main input (:func:`_feature_main`) the widths the model declares
    (:func:`_width_candidates`) after its own candidates, in place; an encoder-decoder's
    ``decoder_<main>`` (SpeechT5's ``decoder_input_values``, which its decoder cannot run without) gets the
    same builder, so both take the same candidate (:func:`_combinations` ties inputs of one builder)."""
    target = _feature_main(model, params, builders)
    if target is None:
        return
    own = builders.get(target)

    def chained(config: Any) -> Iterator[torch.Tensor]:
        seen: list[tuple[int, ...]] = []
        for t in [*(own(config) if own else ()), *_width_candidates(model, config)]:
            if tuple(t.shape) not in seen:
                seen.append(tuple(t.shape))
                yield t

    builders[target] = chained
    twin = "decoder_" + target
    if twin in _named(params) and getattr(model.config, "is_encoder_decoder", False):
        builders[twin] = chained


def _forward_params(model: Any) -> dict[str, inspect.Parameter]:
    """Parameters of ``model.forward`` (or of a callable), empty when there is no signature."""
    try:
        return dict(inspect.signature(model.forward if isinstance(model, nn.Module) else model).parameters)
    except (TypeError, ValueError):
        return {}


def _named(params: dict[str, inspect.Parameter]) -> list[str]:
    """Named parameters of ``forward`` (not ``*args``/``**kwargs``), in order."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [n for n, p in params.items() if p.kind in kinds and n != "self"]


def _required(params: dict[str, inspect.Parameter]) -> list[str]:
    """Named parameters of ``forward`` without a default: inputs the model cannot run without."""
    return [n for n in _named(params) if params[n].default is inspect.Parameter.empty]


def _wanted(model: nn.Module, config: Any, params: dict[str, inspect.Parameter],
            builders: Optional[dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = None,
            extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """The forward inputs to build: the main input, the other modalities' inputs, decoder inputs.

    The main input is ``main_input_name`` when ``forward`` names it; else (a tower that inherits
    ``input_ids`` as its main input name but takes ``pixel_values``/``hidden_states``) the first required
    parameter a builder knows. A required parameter ``forward`` cannot run without, that a builder knows,
    is added too (``grid_thw``, ``merge_sizes``)."""
    builders = BUILDERS if builders is None else builders
    named, required = _named(params), _required(params)
    main = _main_input_name(model)
    if named and main not in named:
        main = next((n for n in required if n in builders), None)
    names = [main] if main in builders else []
    for extra in COMPANIONS:
        if extra in params and extra not in names and _has_modality(config, extra):
            names.append(extra)
    if getattr(config, "is_encoder_decoder", False):
        names += [n for n in ("decoder_input_ids", f"decoder_{main}") if n in params and n in builders
                  and n not in names]
    names += [n for n in required if n in builders and n not in names and names]
    names += [n for n in extras if n in params and n in builders and n not in names and names]
    return names


def _has_modality(config: Any, name: str) -> bool:
    """Whether the config describes the tower that takes ``name`` (a vision sub-config, a text vocabulary)."""
    if name == "pixel_values":  # a vision sub-config, or image sizes in the config itself (ViLT; LayoutLMv3's
        # ``input_size``: without its image, the patch embedding's LayerNorm and ``norm`` never ran)
        return (any(getattr(config, s, None) is not None for s in _VISION)
                or (getattr(config, "patch_size", None) is not None
                    and any(getattr(config, k, None) is not None for k in _IMAGE_SIZE_KEYS)))
    if name in ("input_features", "input_values"):
        return any(getattr(config, s, None) is not None for s in _AUDIO_TOWERS)
    if name == "pixel_values_videos":
        return getattr(config, "video_config", None) is not None
    return cfg_value(config, ("vocab_size",), _TEXT) is not None


def _describe(kwargs: dict[str, Any]) -> str:
    def one(k: str, v: Any) -> str:
        if not isinstance(v, torch.Tensor):
            return f"{k} = {v!r}"
        kind = "int64" if v.dtype == torch.int64 else "bool" if v.dtype == torch.bool else "float"
        return f"{k} {kind} {tuple(v.shape)}"

    return ", ".join(one(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor) or _is_plain_int(v))


def _is_plain_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def infer_hf_inputs(model: nn.Module) -> Optional[tuple[Any, str]]:
    """Inputs for a ``transformers.PreTrainedModel``, or None when the model is not one we know.

    Returns ``(kwargs, description)``. Each input named by :func:`_wanted` gets the candidates of
    :data:`BUILDERS`; on a meta model the combinations are tried with a forward on meta tensors and the
    first that runs is kept (else the first candidates). Vision-language models get image placeholder
    tokens in ``input_ids``, audio-language models audio ones (:func:`_with_placeholders`). Never raises.
    """
    config = getattr(model, "config", None)
    name = _main_input_name(model)
    if config is None or name is None:
        return None
    params = _forward_params(model)
    from normaudit.loaders.companion_inputs import COMPANION_BUILDERS, COMPANION_EXTRAS, COMPANION_VARIANTS

    builders = {**COMPANION_BUILDERS, **BUILDERS}
    variants, extras = {**VARIANTS, **COMPANION_VARIANTS}, EXTRAS + COMPANION_EXTRAS
    for key, variant in variants.items():
        if key in params:
            builders.update(variant)
    _with_suffix_builders(params, builders)
    _with_int_builders(params, builders)
    _with_renamed_main(model, params, builders)
    _with_width_inputs(model, params, builders)
    names = _wanted(model, config, params, builders, extras)
    if not names:
        return None
    if any(n in names for n in ("pixel_values", "hidden_states")):  # the grid of a patch list goes with it
        names += [n for key, variant in variants.items() if key in params
                  for n in variant if n in params and n not in names]
    sized = _with_declared_image_size(model, config)
    choices = {n: list(builders[n](sized)) for n in names}
    choices = {n: c for n, c in choices.items() if c or n not in extras}
    _with_aligned_frames(sized, choices)
    if any(not c for c in choices.values()):
        return None
    first = _with_masks(params, {n: c[0] for n, c in choices.items()})[0]
    kwargs = _pick(model, params, choices, {n: builders[n] for n in choices}) or first
    kwargs = _with_placeholders(model, config, kwargs, params)
    return kwargs, _describe(kwargs)


class _DeclaredImageSize:
    """``config`` seen with ``image_size`` set (every other attribute read from ``config``)."""

    def __init__(self, config: Any, size: tuple[int, int]):
        self._config = config
        self.image_size = size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def _with_declared_image_size(model: nn.Module, config: Any) -> Any:
    """``config``, or, when it names no image size but a submodule declares one (a timm backbone's
    ``pretrained_cfg['input_size']``, wrapped by ``TimmWrapper``: Perception Encoder video towers need
    336 x 336), ``config`` seen with that ``image_size`` (:class:`_DeclaredImageSize`)."""
    if cfg_value(config, ("image_size", "input_size", "img_size"), _VISION) is not None:
        return config
    for _, module in model.named_modules():
        declared = declared_input_size(module)
        if declared is not None and len(declared[0]) == 3:
            return _DeclaredImageSize(config, declared[0][1:])
    return config


def _with_masks(params: dict[str, inspect.Parameter], combo: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """``combo`` completed with the ``<input>_mask`` parameters of ``forward`` (all ones, bool,
    over the time axis of ``<input>``): one candidate with the time axis at dim 1 (``(B, T, F)``), one at
    the last dim (``(B, mel, T)``). ``[combo]`` when ``forward`` takes no such mask. Optional masks are
    given too: NeMo SpeechLM counts audio frames from ``input_features_mask`` although it defaults to None."""
    masks = [(n, n[: -len(_MASK_SUFFIX)]) for n in _named(params)
             if n.endswith(_MASK_SUFFIX) and n[: -len(_MASK_SUFFIX)] in combo and n not in combo]
    if not masks:
        return [combo]
    out = []
    for dim in (1, -1):
        extra = {m: torch.ones(BATCH, combo[src].shape[dim], dtype=torch.bool)
                 for m, src in masks if combo[src].dim() >= 3}
        if len(extra) == len(masks):
            out.append({**combo, **extra})
    return out or [combo]


#: inputs of the other towers of a multimodal model, left out by :func:`main_tower_inputs`
_TOWER_INPUTS = ("pixel_values", "pixel_values_videos", "input_features", "input_values", "image_grid_thw",
                 "video_grid_thw", "grid_thw", "merge_sizes", "audio_mel", "target_sizes",
                 "spatial_shapes", "pixel_attention_mask")


def main_tower_inputs(model: nn.Module, kwargs: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The keyword inputs of ``model``'s main tower only (a vision-language model's text, without its image
    inputs and their placeholder tokens), for a retry when the multimodal forward cannot be captured: the
    towers left out are then captured alone as parts the forward never called. None when ``kwargs`` hold
    no other tower's inputs, or the main input is one of them."""
    params = _forward_params(model)
    main = _main_input_name(model)
    if main not in _named(params) or main in _TOWER_INPUTS:
        return None
    drop = {k for k in kwargs if k in _TOWER_INPUTS}
    drop |= {k for k in kwargs if k.endswith(_MASK_SUFFIX) and k[: -len(_MASK_SUFFIX)] in drop}
    if not drop:
        return None
    out = {k: v for k, v in kwargs.items() if k not in drop}
    token = _image_token(getattr(model, "config", None))
    ids = out.get("input_ids")
    if token is not None and isinstance(ids, torch.Tensor) and bool((ids == token).any()):
        vocab = cfg_value(model.config, ("vocab_size",), _TEXT, 100)
        out["input_ids"] = _ids(min(int(vocab), 100, token) or 1, (BATCH, SEQ))  # no image placeholders
    return out


def _combinations(choices: dict[str, list[torch.Tensor]], limit: int = 16,
                  ties: Optional[dict[str, Any]] = None) -> Iterator[dict[str, torch.Tensor]]:
    """Candidate input sets: every main-input candidate with the first of the others, then each other
    input's further candidates with the first of the rest (a companion's layout: CLVP's ``(B, mel, T)``
    features beside its text), then fewer inputs. At most ``limit`` sets. Inputs with the same ``ties``
    value (built by one builder: SegGPT's input and prompt images) take the same candidate together."""
    names = list(choices)
    ties = ties or {}
    count, done = 0, set()
    for name in names:
        group = [n for n in names if n == name or (n in ties and ties[n] == ties.get(name))]
        if done & set(group):
            continue
        done |= set(group)
        for i in range(1 if name != names[0] else 0, len(choices[name])):
            yield {n: choices[n][i] if n in group and i < len(choices[n]) else choices[n][0] for n in names}
            count += 1
            if count >= limit:
                return
    for n in names[1:]:  # a companion that breaks the forward is left out
        if count >= limit:
            return
        yield {k: choices[k][0] for k in names if k != n}
        count += 1


def _pick(model: nn.Module, params: dict, choices: dict[str, list[torch.Tensor]],
          ties: Optional[dict[str, Any]] = None) -> Optional[dict[str, Any]]:
    """The first combination a meta forward accepts (only for a model on the meta device), else None."""
    if not _on_meta(model):
        return None
    for combo in _combinations(choices, ties=ties):
        for candidate in _with_masks(params, combo):
            if _runs_on_meta(model, params, _with_placeholders(model, model.config, candidate, params)):
                return candidate
    return None


def _on_meta(model: nn.Module) -> bool:
    p = next(iter(model.parameters()), None)
    return p is not None and p.device.type == "meta"


def forward_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """Extra keyword inputs every capture passes where ``forward`` takes them: ``use_cache=False`` (no
    cache objects whose ``get_seq_length`` would need real numbers)."""
    return {"use_cache": False} if "use_cache" in params else {}


#: what a meta forward raises at a step that needs real numbers (``.item()``, ``nonzero()``), not a shape
_DATA_DEPENDENT_ON_META = ("meta tensor", "a correct data-independent implementation does not exist")


def _runs_on_meta(model: nn.Module, params: dict, kwargs: dict[str, Any]) -> bool:
    import warnings

    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    meta.update(forward_kwargs(params))
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            model(**meta)
    except Exception as exc:  # noqa: BLE001 - any other failure rejects this candidate
        # .item()/.tolist() need real numbers, nonzero()/boolean-mask indexing a data-dependent size (no
        # meta kernel): the shapes were accepted up to there
        return any(m in str(exc) for m in _DATA_DEPENDENT_ON_META)
    return True


def _image_token(config: Any) -> Optional[int]:
    for key in ("image_token_id", "image_token_index"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v >= 0:
            return v
    return None


def _with_image_tokens(model: nn.Module, config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """For a vision-language model (an ``image_token_id``): ``input_ids`` with as many image placeholder
    tokens per example as ``get_image_features`` returns features per image (counted on the meta device)."""
    token = _image_token(config)
    ids, pixels = kwargs.get("input_ids"), kwargs.get("pixel_values")
    if token is None or ids is None or pixels is None or not hasattr(model, "get_image_features"):
        return kwargs
    extra = {k: v for k, v in kwargs.items() if k not in ("input_ids", "pixel_values")}
    per_image = _image_feature_count(model, pixels, extra)
    grid = extra.get("image_grid_thw")
    if per_image is None and isinstance(grid, torch.Tensor):  # one token per merge window of the grid
        merge = int(cfg_value(config, ("spatial_merge_size", "merge_size"), _VISION, 1))
        per_image = int(grid[0].prod()) // (merge * merge)
    if per_image is None:
        return kwargs
    vocab = cfg_value(config, ("vocab_size",), _TEXT, 100)
    text = _ids(min(int(vocab), 100, token) or 1, (BATCH, SEQ))
    image = torch.full((BATCH, per_image), token, dtype=torch.int64)
    return {**kwargs, "input_ids": torch.cat([image, text], dim=1)}


def _with_placeholders(model: nn.Module, config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """``kwargs`` with the placeholder tokens the model's fusion of towers needs in ``input_ids``: image
    tokens (:func:`_with_image_tokens`), then audio tokens (:func:`_with_audio_tokens`)."""
    kwargs = _with_image_positions(config, kwargs, params)
    return _with_audio_tokens(model, config, _with_image_tokens(model, config, kwargs, params))


def _with_image_positions(config: Any, kwargs: dict[str, Any], params: dict) -> dict[str, Any]:
    """Kosmos-2 style grounding (``forward`` takes ``image_embeds_position_mask``): ``input_ids`` with
    ``latent_query_num`` image positions after the first token and the mask marking them (1 there, 0
    elsewhere), as Kosmos-2's model test builds them; the image features are written into those positions."""
    ids, latent = kwargs.get("input_ids"), getattr(config, "latent_query_num", None)
    if ("image_embeds_position_mask" not in params or "pixel_values" not in kwargs or not _is_int(latent)
            or not isinstance(ids, torch.Tensor) or ids.dim() != 2):
        return kwargs
    ids = torch.cat([ids[:, :1], _ids(min(int(cfg_value(config, ("vocab_size",), _TEXT, 100)), 100),
                                      (BATCH, int(latent))), ids[:, 1:]], dim=1)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 1:1 + int(latent)] = True
    return {**kwargs, "input_ids": ids, "image_embeds_position_mask": mask}


def _audio_token(config: Any) -> Optional[int]:
    for key in ("audio_token_id", "audio_token_index"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v >= 0:
            return v
    return None


def _with_audio_tokens(model: nn.Module, config: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """For an audio-language model (``get_audio_features``) given ``input_features`` and ``input_ids``:
    with an ``audio_token_id``, ``input_ids`` holding one placeholder per audio feature of each example
    before the text (NeMo SpeechLM, Qwen2-Audio style: features scattered into the placeholders); with no
    audio token key at all, text as long as the audio features (Voxtral-Realtime adds them position by
    position). Counted on the meta device; ``kwargs`` unchanged when the count cannot be had."""
    ids, feats = kwargs.get("input_ids"), kwargs.get("input_features")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or not isinstance(feats, torch.Tensor):
        return kwargs
    extra = {k: v for k, v in kwargs.items() if k not in ("input_ids", "input_features")}
    per_example = _feature_count(model, "get_audio_features", "input_features", feats, extra)
    if not per_example:
        return kwargs
    token = _audio_token(config)
    vocab = min(int(cfg_value(config, ("vocab_size",), _TEXT, 100)), 100)
    if token is not None:
        text = _ids(min(vocab, token) or 1, (BATCH, SEQ))
        audio = torch.full((BATCH, per_example), token, dtype=torch.int64)
        return {**kwargs, "input_ids": torch.cat([audio, text], dim=1)}
    if any("audio" in k and "token" in k for k in vars(config)):  # a placeholder scheme not known here
        return kwargs
    return {**kwargs, "input_ids": _ids(vocab, (BATCH, per_example))}


def _image_feature_count(model: nn.Module, pixels: torch.Tensor, extra: dict[str, Any]) -> Optional[int]:
    """Features one example's images give (``get_image_features`` on meta tensors), or None when it does
    not run. ``extra`` holds other image inputs (``image_grid_thw``) passed where the method takes them."""
    return _feature_count(model, "get_image_features", "pixel_values", pixels, extra)


def _feature_count(model: nn.Module, method: str, key: str, values: torch.Tensor,
                   extra: dict[str, Any]) -> Optional[int]:
    """Features per example that ``model.<method>(<key>=values, **extra)`` returns, run on meta tensors
    (``get_image_features`` / ``get_audio_features``), or None when it does not run or the model is not on
    the meta device. Only the ``extra`` inputs the method takes are passed."""
    if not _on_meta(model) or not hasattr(model, method):
        return None
    takes = _forward_params(getattr(model, method))
    more = {k: v.to("meta") if v.is_floating_point() else v for k, v in extra.items() if k in takes}
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            out = getattr(model, method)(**{key: values.to("meta")}, **more)
    except Exception:  # noqa: BLE001
        return None
    for attr in ("pooler_output", "last_hidden_state"):
        if not isinstance(out, torch.Tensor) and getattr(out, attr, None) is not None:
            out = getattr(out, attr)
            break
    if isinstance(out, (list, tuple)) and out and all(isinstance(t, torch.Tensor) for t in out):
        total = sum(int(t.reshape(-1, t.shape[-1]).shape[0]) for t in out)
    elif isinstance(out, torch.Tensor) and out.dim() >= 2:
        total = int(out.reshape(-1, out.shape[-1]).shape[0])
    else:
        return None
    return total // BATCH if total % BATCH == 0 else None


def declared_input_size(model: nn.Module) -> Optional[tuple[tuple[int, ...], str]]:
    """The input size a model declares for itself: timm's ``pretrained_cfg`` / ``default_cfg``
    ``input_size`` ``(C, H, W)`` (many timm models, ViTs with fixed position embeddings, Swin windows, need
    exactly it). Returns ``((C, H, W), attribute name)`` or None when the model declares none."""
    for attr in ("pretrained_cfg", "default_cfg"):
        cfg = getattr(model, attr, None)
        size = cfg.get("input_size") if isinstance(cfg, dict) else None
        if (isinstance(size, (tuple, list)) and len(size) in (2, 3, 4)
                and all(isinstance(v, int) and 0 < v <= 4096 for v in size)):
            return tuple(size), attr
    return None


def infer_inputs(model: nn.Module) -> tuple[Any, str]:
    """Guess example inputs from the model's first layer.

    Returns ``(inputs, description)`` where inputs is a tuple (positional) or a dict (keyword) and the
    description says what was assumed, for the report. Raises ValueError when no first layer gives a clue.
    """
    hf = infer_hf_inputs(model)
    if hf is not None:
        return hf
    declared = declared_input_size(model)
    if declared is not None:
        shape = (BATCH, *declared[0])
        return (torch.randn(shape),), f"float {shape} from the model's {declared[1]}['input_size']"
    for _, mod in model.named_modules():
        if isinstance(mod, nn.Embedding):
            return (_ids(min(mod.num_embeddings, 100)),), f"int64 token ids ({BATCH}, {SEQ}) from the first layer Embedding({mod.num_embeddings}, {mod.embedding_dim})"
        if isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d)):
            shape = (BATCH, mod.in_channels, SIDE)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}(in_channels={mod.in_channels})"
        if isinstance(mod, (nn.Conv2d, nn.ConvTranspose2d)):
            shape = (BATCH, mod.in_channels, SIDE, SIDE)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}(in_channels={mod.in_channels})"
        if isinstance(mod, (nn.Conv3d, nn.ConvTranspose3d)):
            shape = (BATCH, mod.in_channels, 16, 32, 32)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}(in_channels={mod.in_channels})"
        if isinstance(mod, nn.Linear):
            shape = (BATCH, mod.in_features)
            return (torch.randn(shape),), f"float {shape} from the first layer Linear(in_features={mod.in_features})"
        if isinstance(mod, (nn.LayerNorm, nn.RMSNorm)) and mod.normalized_shape:
            shape = (BATCH, SEQ, *mod.normalized_shape)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}{tuple(mod.normalized_shape)}"
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.num_features:
            shape = (BATCH, mod.num_features, SIDE, SIDE) if isinstance(mod, nn.BatchNorm2d) else (BATCH, mod.num_features)
            return (torch.randn(shape),), f"float {shape} from the first layer {type(mod).__name__}({mod.num_features})"
    raise ValueError("cannot infer example inputs from the first layer; define example_inputs() in the model file")
