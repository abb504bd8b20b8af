"""Token inputs built from a Hugging Face config.

Token ids ``(B, S)`` below the text vocabulary (and, for a model over several codebooks, the multi-stream
layouts of transformers' audio-token models), per-example language ids, and the word boxes of a document
model. :data:`TEXT_BUILDERS` maps each ``forward`` parameter to its builder: config -> candidate tensors,
first choice first.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import torch

from normaudit.loaders.inputs.base import (AUDIO_CONFIGS, BATCH, SEQ, TEXT_CONFIGS, cfg_value, is_positive_int,
                                           random_ids, single)


def _text_ids(config: Any) -> torch.Tensor:
    vocab = cfg_value(config, ("vocab_size",), TEXT_CONFIGS, 100)
    return random_ids(min(int(vocab), 100))


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
    k = cfg_value(config, CODEBOOK_KEYS, TEXT_CONFIGS + AUDIO_CONFIGS)
    if is_positive_int(k) and k <= 64:
        vocab = min(int(cfg_value(config, ("vocab_size",), TEXT_CONFIGS, 100)), 100)
        yield random_ids(vocab, (BATCH, SEQ, int(k) + 1))
        yield random_ids(vocab, (BATCH, int(k), SEQ))
        yield random_ids(vocab, (BATCH * int(k), SEQ))


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
    width = int(width) if is_positive_int(width) and width in (4, 8) else 4
    corner = torch.rand(BATCH, SEQ, 2) / 2
    box = torch.cat([corner, corner + torch.rand(BATCH, SEQ, 2) / 2], dim=-1)  # x0, y0, x1, y1 in [0, 1]
    if width == 8:
        box = box[..., [0, 1, 2, 1, 2, 3, 0, 3]]
    table = getattr(config, "max_2d_position_embeddings", None)
    if is_positive_int(table):
        yield (box * min(BOX_RANGE, int(table) - 1)).to(torch.int64)
    yield box.contiguous()


#: forward parameter -> candidate token inputs built from the config, first choice first
TEXT_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "input_ids": _token_ids, "decoder_input_ids": single(_text_ids), "lang_ids": _lang_ids, "bbox": _bboxes,
}
