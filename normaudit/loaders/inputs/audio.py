"""Audio inputs built from a Hugging Face config.

Spectrogram features in the layouts of transformers' speech models (``(B, mel, T)``, ``(B, T, F)``, stacked
frames), raw waveforms ``(B, samples)`` or ``(B, channels, samples)`` rounded up to whole frames of a codec's
hop, Gemma3n-style mel frames; and, for a codec that encodes a waveform and its spectrogram together,
spectrogram candidates of one frame per hop (:func:`with_aligned_frames`). :data:`AUDIO_BUILDERS` maps
``forward`` parameters to builders (config -> candidate tensors, first choice first).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from normaudit.loaders.inputs.base import AUDIO_CONFIGS, BATCH, FRAMES, cfg_value, is_positive_int

#: audio samples of a raw-waveform input (0.2 s at 16 kHz; wav2vec2's feature encoder strides by 320)
SAMPLES = 3200
#: log-mel widths of the feature extractors of transformers' speech models (Whisper-v3, Parakeet, Gemma
#: audio: 128; Whisper, Conformer/FastConformer, Speech2Text: 80), tried when the config names no width
MEL_WIDTHS = (128, 80)


def _features(config: Any) -> Iterator[torch.Tensor]:
    """Spectrogram candidates: Whisper-style ``(B, mel, 2 * max_source_positions)``, Qwen3-ASR-style
    ``(B, mel, 2 * n_window)``, then ``(B, frames, F)``."""
    mel = cfg_value(config, ("num_mel_bins",), AUDIO_CONFIGS)
    positions = cfg_value(config, ("max_source_positions",), AUDIO_CONFIGS)
    if mel and positions:
        yield torch.randn(BATCH, int(mel), 2 * int(positions))
    window = cfg_value(config, ("n_window",), AUDIO_CONFIGS)
    if mel and is_positive_int(window):  # Qwen3-ASR: frames a multiple of two attention windows
        yield torch.randn(BATCH, int(mel), 2 * int(window))
    per = cfg_value(config, ("input_feat_per_channel",), AUDIO_CONFIGS)
    if per:
        yield torch.randn(BATCH, FRAMES, int(per) * int(cfg_value(config, ("input_channels",), AUDIO_CONFIGS, 1)))
    size = cfg_value(config, ("feature_size", "feature_projection_input_dim", "input_dim", "num_mel_bins"),
                     AUDIO_CONFIGS)
    stacked = cfg_value(config, ("num_stacked_frames",), AUDIO_CONFIGS)
    if size and is_positive_int(stacked):  # FunASR low-frame-rate input: consecutive frames stacked into one vector
        yield torch.randn(BATCH, FRAMES, int(size) * int(stacked))
    for width in [int(size)] if size else MEL_WIDTHS:
        yield torch.randn(BATCH, FRAMES, width)
        yield torch.randn(BATCH, 1, FRAMES * 4, width)
        yield torch.randn(BATCH, width, FRAMES * 4)


def _values(config: Any) -> Iterator[torch.Tensor]:
    """Waveform candidates ``(B, samples)``, ``(B, channels, samples)``; AST-style ``(B, max_length, mel)``."""
    mel, length = cfg_value(config, ("num_mel_bins",), AUDIO_CONFIGS), cfg_value(config, ("max_length",), AUDIO_CONFIGS)
    if mel and isinstance(length, int):
        yield torch.randn(BATCH, length, int(mel))
    channels = cfg_value(config, ("audio_channels", "channels"), AUDIO_CONFIGS)
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
    ratios = cfg_value(config, _HOP_KEYS, AUDIO_CONFIGS + ("acoustic_model_config",))
    if isinstance(ratios, (list, tuple)) and ratios and all(is_positive_int(r) for r in ratios):
        for r in ratios:
            hop *= int(r)
    else:
        length = cfg_value(config, ("hop_length",), AUDIO_CONFIGS + ("acoustic_model_config",))
        hop = int(length) if is_positive_int(length) else 1
    return hop if 1 < hop <= 48000 else 1


def _samples(config: Any) -> int:
    """Waveform length: :data:`SAMPLES`, rounded up to a whole number of the codec's frames (:func:`_hop`)
    when the config gives one (some codecs require it)."""
    hop = _hop(config)
    return -(-SAMPLES // hop) * hop


def with_aligned_frames(config: Any, choices: dict[str, list[torch.Tensor]]) -> None:
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


def _mel_frames(config: Any) -> Iterator[torch.Tensor]:
    """Gemma3n-style ``audio_mel`` ``(B, frames, mel)`` (``input_feat_size`` or ``num_mel_bins`` wide)."""
    mel = cfg_value(config, ("input_feat_size", "num_mel_bins", "feature_size"), AUDIO_CONFIGS)
    if mel:
        yield torch.randn(BATCH, FRAMES, int(mel))


#: forward parameter -> candidate audio inputs built from the config, first choice first
AUDIO_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "input_features": _features, "input_values": _values, "audio_mel": _mel_frames,
}
