"""Sizes and config readers shared by the input builders.

The batch, sequence length and image side of every inferred input (:data:`BATCH`, :data:`SEQ`,
:data:`SIDE`), the sub-configs a multimodal config keeps each tower's settings in (:data:`TEXT_CONFIGS`,
:data:`VISION_CONFIGS`, :data:`AUDIO_CONFIGS`), and :func:`cfg_value`, which reads a setting from the first
of them that sets it.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

BATCH, SEQ, SIDE = 2, 16, 64
#: spectrogram frames of a (B, frames, features) input (speech_to_text subsamples by 4)
FRAMES = 64

#: sub-configs that hold the text model: ``model_config`` is the model a wrapper config holds beside its
#: vocoder (FastSpeech2 + HiFi-GAN), with the text vocabulary
TEXT_CONFIGS = ("text_config", "model_config")
VISION_CONFIGS = ("vision_config", "image_config", "video_config")
AUDIO_CONFIGS = ("audio_config", "speech_config", "encoder_config", "asr_config", "semantic_model_config")
#: sub-configs whose presence says the model has an audio tower (``encoder_config`` alone does not)
AUDIO_TOWERS = ("audio_config", "speech_config")


def random_ids(vocab: int, shape=(BATCH, SEQ)) -> torch.Tensor:
    """Random int64 token ids of ``shape`` in ``[0, vocab)`` (``[0, 1)`` for a vocabulary below 1)."""
    return torch.randint(0, max(int(vocab), 1), shape, dtype=torch.int64)


def sub_configs(config: Any, subs: tuple[str, ...], depth: int = 2) -> list[Any]:
    """The sub-configs named in ``subs`` that ``config`` has (and theirs, ``depth`` levels down: NeMo
    SpeechLM's ``audio_config.asr_config``), deepest first, then ``config`` itself."""
    out: list[Any] = []
    for name in subs:
        sub = getattr(config, name, None)
        if sub is not None and not isinstance(sub, (dict, str, list, tuple, int, float)) and sub is not config:
            out += sub_configs(sub, subs, depth - 1) if depth > 1 else [sub]
    return out + [config]


def cfg_value(config: Any, names: tuple[str, ...], subs: tuple[str, ...] = (), default: Any = None) -> Any:
    """The first of ``names`` set (not None) on the sub-configs ``subs`` of ``config``, then on ``config``."""
    for c in sub_configs(config, subs):
        for n in names:
            v = getattr(c, n, None)
            if v is not None:
                return v
    return default


def is_positive_int(v: Any) -> bool:
    """Whether ``v`` is an ``int`` above 0 (not a bool): a count or size a config may hold."""
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def single(fn: Callable[[Any], torch.Tensor]) -> Callable[[Any], Iterator[torch.Tensor]]:
    """A builder (config -> candidate tensors) whose one candidate is ``fn(config)``."""
    return lambda config: iter([fn(config)])
