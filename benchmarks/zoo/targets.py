"""The sweep's corpora: every AutoModel type of the installed transformers, one model per timm family.

transformers: every ``model_type`` of ``MODEL_MAPPING_NAMES`` (the ``AutoModel`` table), its config class
built with defaults and shrunk to test sizes (:func:`shrink_config_dict`: hidden 64, 2 layers, 4 heads,
small FFN/vocab, applied to nested text/vision/audio/... sub-configs too), the way transformers' own model
testers size models. A shrink that transformers refuses or cannot build falls back to a milder one
(:data:`SHRINK_LEVELS`), and the level used is recorded.

timm: one model per module of ``timm.list_modules()`` (a "family"), the smallest by parameter count,
estimated cheaply: names are ranked by their size word (``atto`` < ``femto`` < ... < ``tiny`` < ``small``
< ``base``...), and only the best few are built on the meta device to count parameters.
"""
from __future__ import annotations

import copy
import math
import re
from typing import Any

#: Shrink levels tried in order: "small" (all sizes), "small3" (the same with widths of 96 = 2^5 * 3: models
#: that take ``hidden_size // 6`` or ``// 3`` per part, LiLT's 2-D position embeddings), "wide" (depth and
#: counts, widths of one 128-wide head per head: rotary sections and head-dim tables written for full-size
#: heads still fit), "layers" (only depth), "default" (config as is), and, only where none of these builds,
#: "filled" ("small" with the sizes a library's defaults leave to the checkpoint, ``None``, given test values:
#: ESM ``vocab_size``, dots1 expert counts, Hunyuan ``head_dim``). "pairs" (before "default"): "small" with
#: two layers of each kind of a per-layer list (:func:`_keep_kinds`): a block shared by every layer of one
#: kind is tied across them, and transformers refuses a tie with no second layer to tie (Zamba's
#: ``shared_transf``, ``tie_weights_keys`` matching nothing: every other level failed and the 76-layer
#: default was audited, 134 CPU s).
SHRINK_LEVELS = ("small", "small3", "wide", "layers", "pairs", "default", "filled")

HIDDEN = 64
HEADS = 4
LAYERS = 2
FFN = 128
#: (hidden, FFN, factor on :data:`_SMALL_DIMS`) of the levels that shrink widths
WIDTHS = {"small": (HIDDEN, FFN, 1), "small3": (96, 192, 1.5), "wide": (512, 1024, 8)}

_LAYER_KEYS = re.compile(
    r"^(num_hidden_layers|num_layers|n_layers?|encoder_layers|decoder_layers|num_encoder_layers|"
    r"num_decoder_layers|num_.*_layers|.*_num_layers|num_blocks|n_blocks|depth|num_hidden_blocks|"
    r"text_layers|vision_layers)$")
_HEAD_KEYS = re.compile(r"^(num_attention_heads|n_heads?|encoder_attention_heads|decoder_attention_heads|"
                        r"num_heads|attention_heads|.*_attention_heads|.*_num_heads|.*_n_heads)$")
_KV_KEYS = re.compile(r"^(.*_)?(num_key_value_heads|num_kv_heads|n_kv_heads|multi_query_group_num)$")
_HIDDEN_KEYS = re.compile(r"^(hidden_size|d_model|n_embd|embed_dim|dim|hidden_dim|model_dim|word_embed_proj_dim|"
                          r"embedding_size|projection_dim|text_embed_dim|vision_embed_dim|n_embed|emb_dim|"
                          r"d_embed|hidden_channels)$")
_FFN_KEYS = re.compile(r"^(intermediate_size|ffn_dim|encoder_ffn_dim|decoder_ffn_dim|n_inner|d_ff|"
                       r"moe_intermediate_size|shared_expert_intermediate_size|intermediate_size_mlp|"
                       r"ffn_hidden_size|mlp_dim|d_inner|dim_feedforward|inner_dim|feed_forward_size|"
                       r".*_intermediate_size)$")
_EXPERT_KEYS = re.compile(r"^(num_experts|n_routed_experts|num_local_experts|moe_num_experts|n_experts)$")
_TOPK_KEYS = re.compile(r"^(num_experts_per_tok|num_experts_per_token|moe_topk|moe_top_k|top_k|top_k_experts|"
                        r"num_selected_experts|moe_k)$")
_SMALL_DIMS = {"head_dim": 16, "d_head": 16, "attention_head_size": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
               "kv_lora_rank": 32, "q_lora_rank": 32, "d_kv": 16, "attention_head_dim": 16}
_TOKEN_KEY = re.compile(r".*(_token_id|_token_index|_token_ids|_id)$")


def _max_token_id(d: dict[str, Any]) -> int:
    """Largest special-token id named anywhere in a config dict (so a shrunk vocab still holds it)."""
    best = -1
    for key, value in d.items():
        key = str(key)
        if key in ("id2label", "label2id"):
            continue
        if isinstance(value, dict):
            best = max(best, _max_token_id(value))
        elif _TOKEN_KEY.match(key) and isinstance(value, int) and not isinstance(value, bool):
            best = max(best, value)
        elif _TOKEN_KEY.match(key) and isinstance(value, list):
            best = max([best] + [v for v in value if isinstance(v, int) and not isinstance(v, bool)])
    return best


def _truncate_per_layer(d: dict[str, Any], old: int, new: int, pairs: bool = False) -> None:
    """Cut lists/strings that hold one entry per layer (``layer_types``, hybrid patterns) to ``new``
    (:func:`_keep_kinds`; ``pairs``: the "pairs" level)."""
    for key, value in list(d.items()):
        if key in ("id2label", "label2id") or old <= new:
            continue
        per_layer_str = isinstance(value, str) and re.search(r"pattern|layer|block|override", key)
        if (isinstance(value, list) or per_layer_str) and len(value) == old and old > 2:
            d[key] = _keep_kinds(value, new, pairs)


def _keep_kinds(value, new: int, pairs: bool = False):
    """First ``new`` entries of a per-layer list, every kind of layer kept where ``new`` allows it
    (``["sliding"] * 5 + ["full"]`` -> ``["sliding", "full"]``: validators want each kind present); with
    ``pairs`` (the "pairs" level) and ``new`` at least twice the kinds, each kind twice, in order of first
    appearance (``["mamba", "mamba", "hybrid", "hybrid"]``)."""
    head = list(value[:new])
    kinds = list({repr(v): v for v in value}.values())  # entries may be lists (Moonshine ``sliding_windows``)
    if pairs and isinstance(value, list) and len(kinds) > 1 and new >= 2 * len(kinds):
        return [k for k in kinds for _ in (0, 1)] + head[:new - 2 * len(kinds)]
    if isinstance(value, list) and len(kinds) <= new and {repr(v) for v in kinds} - {repr(v) for v in head}:
        head = [kinds[i] if i < len(kinds) else value[0] for i in range(new)]
    return head if isinstance(value, list) else "".join(head)


def _pairs_depth(d: dict[str, Any], old: int) -> int:
    """Depth of the "pairs" level: two layers of each kind of the longest-kinded per-layer list of length
    ``old`` in ``d`` (0 where there is none)."""
    kinds = [len({repr(v) for v in value}) for key, value in d.items()
             if key not in ("id2label", "label2id") and isinstance(value, list) and len(value) == old and old > 2]
    return 2 * max(kinds, default=0)


def _fit_layer_indices(d: dict[str, Any]) -> None:
    """Point layer indices (backbone ``out_features``/``out_indices``, ``vision_feature_layer``) at layers
    that still exist after the depth shrink: the backbone default, and the last layer."""
    if isinstance(d.get("per_layer_config"), dict):
        d["per_layer_config"] = {k: v for k, v in d["per_layer_config"].items() if int(k) < LAYERS}
    if isinstance(d.get("out_indices"), list):
        d["out_indices"] = [LAYERS]
    if isinstance(d.get("out_features"), list) and all(isinstance(v, str) for v in d["out_features"]):
        d["out_features"] = [f"stage{LAYERS}"]  # stage names; EfficientLoFTR's out_features are widths
    for key in ("vision_feature_layer", "vision_feature_layers", "feature_layer"):
        value = d.get(key)
        if _is_int(value) and value >= LAYERS:
            d[key] = -1
        elif isinstance(value, list) and any(_is_int(v) and v >= LAYERS for v in value):
            d[key] = [-1]


#: int lists that index feature maps or levels, not layers: left alone by :func:`_fit_index_lists`
_NOT_LAYER_INDICES = re.compile(r"out_indices|out_features|proj|return|summary|token|channels|size|dims?$")
_INDEX_LIST = re.compile(r"(indices|indexes|idxs|_idx|_ids|_layers)$")


def _fit_index_lists(d: dict[str, Any], old: int) -> None:
    """Lists of layer indices (Zamba2 ``hybrid_layer_ids``, SAM ``global_attn_indexes``, Bamba
    ``attn_layer_indices``, mllama ``cross_attention_layers``) that point past the shrunk depth: indices
    beyond it become the last layer, as :func:`_keep_kinds` puts the rarer layer kinds last (a hybrid model
    keeps one attention layer; with none, its cache has no attention layer to measure)."""
    for key, value in list(d.items()):
        if not (isinstance(value, list) and value and all(_is_int(v) for v in value)) or len(value) == old:
            continue
        if not _INDEX_LIST.search(key) or _NOT_LAYER_INDICES.search(key):
            continue
        if min(value) >= 0 and max(value) < old and max(value) >= LAYERS:
            d[key] = sorted({min(v, LAYERS - 1) for v in value})


#: ints that count layers of a special kind at the start or end of the stack (DeepSeek ``first_k_dense_replace``)
_SPECIAL_COUNT = re.compile(r"^(first_k_dense_replace|num_dense_layers|num_first_.*_layers|num_last_.*_layers|"
                            r"num_global_layers)$")
#: ints that give a period of layer kinds (Jamba ``attn_layer_period``, AFMoE ``global_attn_every_n_layers``)
_PERIOD = re.compile(r"^(.*_period|.*_interval|.*_every_n_layers|layer_group_size|n_layers_per_.*|interleave_.*_step)$")
_POSITION = re.compile(r"^(.*_index_start|.*_start_index|.*_index_end|.*_end_index|insert_layer_id|.*_offset)$")


def _fit_layer_counts(d: dict[str, Any], old: int) -> None:
    """Layer counts, periods and positions stay inside the shrunk depth, every kind of layer kept: a count of
    special layers at one end of the stack becomes 1 (all of them: all), a period longer than the depth
    becomes the depth (its special layer the last), a start/end/offset past the depth the last layer (Jamba:
    ``attn_layer_period`` 8, offset 4 of 2 layers left no attention layer), and a position that was a multiple
    of a period stays one. Gemma3n's KV sharing needs a layer of each kind before the shared ones: 2 layers
    leave no room, so ``num_kv_shared_layers`` is 0."""
    orig = dict(d)
    for key, value in list(d.items()):
        if not _is_int(value) or value <= 0:
            continue
        if _SPECIAL_COUNT.match(key):
            d[key] = LAYERS if value >= old else min(value, LAYERS - 1)
        elif _PERIOD.match(key) and value > LAYERS:
            d[key] = LAYERS
        elif _POSITION.match(key) and value >= LAYERS and value < old:
            d[key] = LAYERS if "end" in key else LAYERS - 1  # an end index is one past the last layer
        elif key == "num_kv_shared_layers":
            d[key] = 0
    for period in (k for k, v in orig.items() if _PERIOD.match(k) and _is_int(v) and v > 1):
        for key in (k for k, v in orig.items() if _POSITION.match(k) and not k.endswith("_offset") and _is_int(v)
                    and v > 0):  # an offset counts within its own period
            if orig[key] % orig[period] == 0:  # Inkling2-loop: loop start/end stay multiples of the block
                d[period] = math.gcd(d[period], d[key])


_LAYER_PART = re.compile(r"^(n|num)_(?!hidden_)\w+_layers$")


def _layer_parts(d: dict[str, Any], key: str) -> dict[str, int] | None:
    """Counts of the parts of a layer stack that sum to its depth ``d[key]`` (Dory: ``n_input_layers +
    n_recurrent_layers + n_output_layers == num_hidden_layers``, its validator), each cut to :data:`LAYERS`;
    the depth is then their sum (every part kept). None where no such parts are given."""
    parts = {k: v for k, v in d.items() if k != key and _LAYER_PART.match(k) and _is_int(v) and v > 0}
    if len(parts) < 2 or sum(parts.values()) != d[key]:
        return None
    for k, v in parts.items():
        d[k] = min(v, LAYERS)
    return parts


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shrink_lists(d: dict[str, Any]) -> None:
    """Shrink per-stage lists of hierarchical models (Swin/ConvNeXt/ResNet ``depths``, ``hidden_sizes``)."""
    for key, value in list(d.items()):
        if not (isinstance(value, list) and value and all(_is_int(v) for v in value)):
            continue
        if key in ("depths", "num_layers", "layers", "encoder_layers", "block_repeats", "num_blocks"):
            d[key] = [min(v, LAYERS) for v in value]
        elif key in ("num_heads", "num_attention_heads", "attention_heads", "encoder_attention_heads"):
            d[key] = [min(v, 2) for v in value]
        elif key in ("hidden_sizes", "embed_dims", "dims", "embed_dim", "hidden_dims", "channels", "widths"):
            groups = d.get("num_groups") if _is_int(d.get("num_groups")) else 1  # GroupNorm groups (BiT)
            f = max(1, value[0] // max(16, groups))
            if all(v % f == 0 for v in value):
                d[key] = [max(v // f, 2) for v in value]


def shrink_config_dict(d: dict[str, Any], level: str = "small") -> dict[str, Any]:
    """Return a copy of a transformers config dict (``config.to_dict()``) shrunk to test sizes.

    ``level`` is one of :data:`SHRINK_LEVELS`. Nested sub-config dicts (``text_config``, ``vision_config``,
    ``audio_config``, ``encoder``, ``decoder``...) are shrunk the same way. Patch sizes, mel bins and
    sampling rates are kept (they tie to each other); image sizes too (the worker tries each level with
    :func:`shrink_image_sizes` first); widths, depths, counts and a long ``context_length`` shrink.
    """
    d = copy.deepcopy(d)
    if d.get("prediction_length", 0) is None:  # time-series configs have no default horizon
        d["prediction_length"] = 8
    if "sliding_window" in d and d["sliding_window"] is None and any(
            "sliding" in k and _is_int(v) and v > 0 for k, v in d.items()):
        d["sliding_window"] = 8  # Step3p7: sliding heads configured, the window left to the checkpoint
    if level == "default":
        return d
    if level == "filled":
        _fill_checkpoint_sizes(d)
    subs = {}
    for key, value in list(d.items()):
        if (isinstance(value, dict) and all(isinstance(k, str) for k in value)  # a sub-config, not a table
                and key not in ("id2label", "label2id", "rope_parameters", "rope_scaling")):
            subs[key], d[key] = value, shrink_config_dict(value, level)
    _keep_text_width(subs, d)
    _keep_named_tower_widths(subs, d)
    pairs = level == "pairs"
    level = "small" if level in ("filled", "pairs") else level
    if isinstance(d.get("architecture"), str) and "model_args" in d and level in WIDTHS:
        d["model_args"] = dict(timm_model_args(d["architecture"], WIDTHS[level][0]), **(d["model_args"] or {}))
    staged = any(isinstance(d.get(k), list) for k in ("depths", "hidden_sizes", "embed_dims"))
    layer_keys = [k for k, v in d.items() if _LAYER_KEYS.match(k) and _is_int(v) and v > LAYERS and not staged]
    base_depths = [d[k] for k in layer_keys]
    for key in layer_keys:
        old, new = d[key], LAYERS * len(_layer_parts(d, key) or [None])
        new = max(new, _pairs_depth(d, old)) if pairs else new
        d[key] = new
        _truncate_per_layer(d, old, new, pairs)
    if layer_keys:
        _fit_stack_depth(d, layer_keys, base_depths)
        _fit_layer_indices(d)
        _fit_index_lists(d, max(base_depths))
        _fit_layer_counts(d, max(base_depths))
    _fit_context_length(d)
    if level == "layers":
        return d
    _shrink_widths(d, *WIDTHS[level])
    _shrink_lists(d)
    fit_placeholder_tokens(d)
    return d


_PER_STACK = re.compile(r"^(num|n)_layers_per_stack$")


def _fit_stack_depth(d: dict[str, Any], layer_keys: list[str], base_depths: list[int]) -> None:
    """A depth the config derives from a per-stack count keeps its ratio to it: HRM-Text's ``__post_init__``
    rewrites ``num_hidden_layers`` to ``num_layers_per_stack * H_cycles * (L_cycles + 1)`` (16 * 2 * 4 = 128,
    one cache slot per attention call of the recurrent forward) and a saved config carries both. The depth
    alone cut to 2 left 16 blocks per stack and 2 cache slots (every level: ``IndexError: list index out of
    range`` in the forward, audited with 16 blocks per stack); now the stack is cut to :data:`LAYERS` and the
    depth to ``LAYERS * 128 / 16`` = 16. ``d``: the dict after the depth cut (changed in place)."""
    for key, value in list(d.items()):
        if not (_PER_STACK.match(key) and _is_int(value) and value > LAYERS):
            continue
        for depth_key, old in zip(layer_keys, base_depths):
            if depth_key != key and old % value == 0 and old // value > 1:
                d[key], d[depth_key] = LAYERS, LAYERS * (old // value)


#: the longest context (time steps) a forecaster's shrunk ``context_length`` keeps
CONTEXT = 512
_PATCH_LENGTH = re.compile(r"^(patch_length|patch_len|input_patch_len|patch_size)$")


def _fit_context_length(d: dict[str, Any]) -> None:
    """A ``context_length`` above 2048 (TimesFM-2.5: 16384, the length of the ``past_values`` both the ground
    truth and normaudit build from it: 93 s of export) is cut to :data:`CONTEXT`, rounded down to a multiple
    of the patch length (``patch_length`` 32: the model folds the context into patches). ``d``: one config
    level, changed in place."""
    value = d.get("context_length")
    if not (_is_int(value) and value > 2048):
        return
    patch = next((v for k, v in d.items() if _PATCH_LENGTH.match(k) and _is_int(v) and v > 0), 1)
    if value % patch == 0 and CONTEXT >= patch:
        d["context_length"] = CONTEXT // patch * patch


#: image sizes above :data:`IMAGE_MAX` pixels are cut to about :data:`IMAGE` (a multiple of their unit)
IMAGE_MAX = 448
IMAGE = 224
_IMAGE_KEYS = ("image_size", "img_size")
#: ints an image side must be a multiple of: its patch (or a patch stride of the stem), the patch merge
_IMAGE_UNIT = re.compile(r"^(patch_size|patch_stride|spatial_merge_size|merge_size)$")


def _config_levels(d: dict[str, Any], parents: tuple = ()):
    """``(level, its ancestors)`` for ``d`` and every sub-config dict below it."""
    yield d, parents
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("id2label", "label2id") and all(isinstance(k, str) for k in value):
            yield from _config_levels(value, parents + (d,))


def _image_unit(levels: tuple) -> int:
    """Least common multiple of the :data:`_IMAGE_UNIT` ints (lists too: ``patch_stride`` ``[4, 4]``) of
    ``levels`` (the level holding an image size and its ancestors: Mistral3's ``spatial_merge_size`` sits
    above its ``vision_config``), and 2."""
    unit = 2
    for level in levels:
        for key, value in level.items():
            if _IMAGE_UNIT.match(str(key)):
                for v in value if isinstance(value, list) else [value]:
                    unit = math.lcm(unit, v) if _is_int(v) and v > 0 else unit
    return unit


def shrink_image_sizes(d: dict[str, Any]) -> dict[str, Any]:
    """Copy of a (shrunk) config dict whose image sizes (:data:`_IMAGE_KEYS`, ints or ``[h, w]``) above
    :data:`IMAGE_MAX` are cut to the largest multiple of their unit (:func:`_image_unit`) not above
    :data:`IMAGE` (at least one unit). Each original size maps to one new size everywhere in the config, the
    unit the lcm over every level that holds it: SAM's ``vision_config`` and ``prompt_encoder_config`` both
    say 1024 and stay equal (1024 -> 224, 14 patches of 16, one 14-window), Mistral3's 1540 px of 14-px
    patches merged 2x2 -> 224 (16 patches a side), SAM2's Hiera at stride 4 -> 224 (stages of 56/28/14/7
    patches, its windows 8/4/14/7 divide each). The ground-truth forward (real tensors on CPU) and the
    audit's inputs are sized from these keys: at 1024-1540 px that forward alone took 50-60 CPU s. A model
    whose other keys tie to the size (position-embedding grids) and refuse the cut is caught by the level
    choice, which then takes the sizes as they were (``worker._choose_level``). Returns ``d`` itself when no
    size is above :data:`IMAGE_MAX`."""
    units: dict[int, int] = {}
    for level, parents in _config_levels(d):
        for key in _IMAGE_KEYS:
            value = level.get(key)
            for size in value if isinstance(value, list) else [value]:
                if _is_int(size) and size > IMAGE_MAX:
                    units[size] = math.lcm(units.get(size, 1), _image_unit(parents + (level,)))
    new = {size: max(unit, IMAGE // unit * unit) for size, unit in units.items() if unit < size}
    if not new:
        return d
    d = copy.deepcopy(d)
    for level, _ in _config_levels(d):
        _fit_image_grid(level, new)
        for key in _IMAGE_KEYS:
            value = level.get(key)
            if isinstance(value, list):
                level[key] = [new.get(v, v) if _is_int(v) else v for v in value]
            elif _is_int(value):
                level[key] = new.get(value, value)
    return d


#: patches per side of an image, a size of its own (SAM's prompt encoder: ``image_embedding_size`` 64 of 1024 px)
_IMAGE_GRID = re.compile(r"^image_embedding_size$")


def _fit_image_grid(level: dict[str, Any], new: dict[int, int]) -> None:
    """A :data:`_IMAGE_GRID` key of a config level whose ``image_size`` is cut (``new``: old size -> new) that
    was ``image_size // patch_size`` stays so (SAM: 64 -> 14; left at 64, the mask decoder's dense
    embeddings mismatch the 14 x 14 image embedding, and the level fell back to 1024 px)."""
    size, patch = level.get("image_size"), level.get("patch_size")
    if not (_is_int(size) and _is_int(patch) and patch > 0 and size in new):
        return
    for key, value in list(level.items()):
        if _IMAGE_GRID.match(key) and value == size // patch:
            level[key] = new[size] // patch


#: placeholder tokens a multimodal model scatters its image/video/audio features into (``image_token_index``)
_PLACEHOLDER = re.compile(r"^(image|video|audio)_token_(id|index)$")
_TOP_TOKEN = re.compile(r"^\w+_token_(id|index)$")


def _text_vocab(d: dict[str, Any]) -> int | None:
    text = d.get("text_config") if isinstance(d.get("text_config"), dict) else d
    vocab = text.get("vocab_size", d.get("vocab_size"))
    return vocab if _is_int(vocab) and vocab > 0 else None


def fit_placeholder_tokens(d: dict[str, Any]) -> None:
    """Special-token ids of a multimodal config's top level lie inside the shrunk text vocabulary, and
    placeholder ids (:data:`_PLACEHOLDER`) the defaults leave ``None`` are given one, as transformers' model
    testers do (BLIP-2 ``image_token_index`` 4 of a 99-token vocab). The text sub-config's vocab is cut to
    1024 while the ids beside it keep their checkpoint values (LLaVA ``image_token_index`` 32000, Qwen2-VL
    151655): a real forward then fails on the embedding lookup, and with ``None`` (BLIP-2, InstructBLIP,
    Voxtral, MiniCPM-V) no placeholder is built, so the towers never run with the whole model. Ids out of
    range are mapped, in their order, to the highest ids no in-range special token holds; ``None``
    placeholders get the next ones down. ``d``: the shrunk config dict, changed in place."""
    vocab = _text_vocab(d)
    if vocab is None or vocab < 16:
        return
    keys = [k for k, v in d.items() if _TOP_TOKEN.match(str(k)) and (_is_int(v) and v >= vocab
                                                                     or v is None and _PLACEHOLDER.match(k))]
    if not keys:
        return
    taken = {v for v in _all_token_ids(d) if v < vocab}
    free = (i for i in range(vocab - 1, 0, -1) if i not in taken)
    old = sorted({d[k] for k in keys if d[k] is not None})
    new = dict(zip(old, sorted(next(free) for _ in old)))
    for k in keys:
        d[k] = new[d[k]] if d[k] is not None else next(free)


def _all_token_ids(d: dict[str, Any]):
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("id2label", "label2id"):
            yield from _all_token_ids(value)
        elif _TOKEN_KEY.match(str(key)) and _is_int(value):
            yield value


_HEAD_DIM_KEY = re.compile(r"^(.*_)?head_?dim$")


#: activation bounds a model passes to ``clamp(-v, v)`` when given (DBRX ``clip_qkv``: 8 in its checkpoint;
#: None reaches ``clamp(min=None, max=None)``, which torch refuses)
_CLIP_KEYS = re.compile(r"^clip_(qkv|value|activations?)$")
#: (key pattern, test value) of the "filled" level beyond the sizes: an optional feature switched on by a
#: group of keys that must all be given (Qwen4-Exp's QSA indexer: ``indexer_n_heads``, ``indexer_kv_heads``,
#: ``indexer_head_dim``, ``indexer_budget`` a multiple of ``indexer_compress_ratio``). One KV head divides
#: every head count.
_FILL_OPTIONAL = ((re.compile(r"^.*_kv_heads$"), 1), (re.compile(r"^.*_budget$"), 8),
                  (re.compile(r"^.*_compress_ratio$"), 4), (_HEAD_KEYS, HEADS), (_CLIP_KEYS, 8.0))


def _fill_checkpoint_sizes(d: dict[str, Any]) -> None:
    """Give test values to sizes a library's defaults leave ``None`` for the checkpoint to give (the level
    "filled", tried only where no other level builds): vocabulary, expert counts, top-k, expert groups, head
    width, MoE FFN width, the keys of :data:`_FILL_OPTIONAL` (clamp bounds among them); ``mlp_layer_types`` as the library's configs
    derive it (``["dense"] + ["sparse"] * (n - 1)``: DeepSeek-OCR-2's text model indexes it, its defaults
    leave it ``None``); a ``vocabulary_map`` (Chameleon, Emu3: BPE names to ids, read for ``"<image>"`` at
    construction) holding only ``"<image>"``, at the first id above the config's special tokens; a padding id
    (1) where it is None."""
    layers = next((v for k, v in d.items() if _LAYER_KEYS.match(k) and _is_int(v) and v > 0), None)
    _fill_rope_per_layer_type(d)
    for key, value in list(d.items()):
        if value is not None:
            continue
        optional = next((v for pattern, v in _FILL_OPTIONAL if pattern.match(key)), None)
        if key == "vocab_size":
            d[key] = 1024
        elif key == "mlp_layer_types" and layers:
            d[key] = ["dense"] + ["sparse"] * (layers - 1)
        elif key == "layer_types" and layers:  # LFM2-MoE indexes it; transformers' configs default it so
            d[key] = ["full_attention"] * layers
        elif key == "vocabulary_map":
            d[key] = {"<image>": _max_token_id(d) + 1}
        elif key == "pad_token_id":  # ESM's position ids compare the ids with it (input_ids.ne(None) fails);
            d[key] = 1  # transformers' ESM model test gives 1
        elif optional is not None:
            d[key] = optional
        elif _KV_KEYS.match(key):  # Nemotron divides its heads by num_key_value_heads, left None
            d[key] = missing_key_value(d, key)
        elif _EXPERT_KEYS.match(key):
            d[key] = 4
        elif _TOPK_KEYS.match(key):
            d[key] = 2
        elif key in ("n_group", "topk_group", "num_expert_group", "n_shared_experts"):
            d[key] = 1
        elif _HEAD_DIM_KEY.match(key) or key == "head_dim":
            d[key] = _SMALL_DIMS["head_dim"]
        elif _FFN_KEYS.match(key):
            d[key] = FFN


def _fill_rope_per_layer_type(d: dict[str, Any]) -> None:
    """An empty ``rope_parameters`` beside ``layer_types`` gets one default RoPE entry per layer type
    (``{"full_attention": {"rope_type": "default", "rope_theta": ...}}``), the per-layer-type form Gemma 3
    and ModernBERT write: Cohere-Compass's rotary embedding reads ``rope_parameters[layer_type]`` and its
    defaults leave the dict empty for the checkpoint. ``rope_theta`` is the config's, else 10000."""
    kinds = d.get("layer_types")
    if d.get("rope_parameters") != {} or not (isinstance(kinds, list) and kinds and all(isinstance(k, str) for k in kinds)):
        return
    theta = d.get("rope_theta") if isinstance(d.get("rope_theta"), (int, float)) else 10000.0
    d["rope_parameters"] = {k: {"rope_type": "default", "rope_theta": theta} for k in dict.fromkeys(kinds)}


def _shrink_widths(d: dict[str, Any], hidden: int = HIDDEN, ffn: int = FFN, factor: float = 1) -> None:
    """Set widths, heads, FFN sizes, expert counts and vocabulary of one config level to test sizes.

    Keys derived from others keep their relation: ``rotary_dim`` at most the head width, ``qk_head_dim``
    the sum of its nope and rope parts, a ``head_dim`` equal to ``qk_rope_head_dim`` (DeepSeek) stays so,
    and any other ``*head_dim`` key is cut like ``head_dim`` (Zamba2's ``mamba_headdim``).
    """
    base = dict(d)
    small = {k: int(v * factor) for k, v in _SMALL_DIMS.items()}
    heads_before = next((v for k, v in d.items() if _HEAD_KEYS.match(k) and _is_int(v)), None)
    for key, value in list(d.items()):
        if not _is_int(value) or value <= 0:
            continue
        if (_HIDDEN_KEYS.match(key) or key.endswith("_hidden_size")) and value > hidden:
            d[key] = hidden
        elif _HEAD_KEYS.match(key) and value > HEADS:
            d[key] = HEADS
        elif _FFN_KEYS.match(key) and value > ffn:
            d[key] = ffn
        elif _EXPERT_KEYS.match(key) and value > 4:
            d[key] = 4
        elif _TOPK_KEYS.match(key) and value > 2:
            d[key] = 2
        elif key in small and value > small[key]:
            d[key] = small[key]
        elif _HEAD_DIM_KEY.match(key) and value > small["head_dim"]:
            d[key] = small["head_dim"]
    for key, value in list(d.items()):
        if _KV_KEYS.match(key) and _is_int(value) and heads_before:
            d[key] = HEADS if value >= heads_before else min(value, HEADS // 2)
    _keep_derived(d, base, hidden)
    if _is_int(d.get("vocab_size")) and d["vocab_size"] > 1024:
        d["vocab_size"] = max(1024, _max_token_id(d) + 1)
    if _is_int(d.get("vocab_size_per_layer_input")) and _is_int(d.get("vocab_size")):  # Gemma3n per-layer
        d["vocab_size_per_layer_input"] = min(d["vocab_size_per_layer_input"], d["vocab_size"])


def _keep_derived(d: dict[str, Any], base: dict[str, Any], hidden: int) -> None:
    """Restore relations between width keys that the shrink of each key alone broke."""
    heads = next((v for k, v in d.items() if _HEAD_KEYS.match(k) and _is_int(v)), None)
    width = d.get("head_dim") if _is_int(d.get("head_dim")) else (hidden // heads if heads else None)
    if _is_int(d.get("rotary_dim")) and width and d["rotary_dim"] > width:
        d["rotary_dim"] = width
    if all(_is_int(d.get(k)) for k in ("qk_nope_head_dim", "qk_rope_head_dim")):
        if _is_int(base.get("qk_head_dim")):
            d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
        if _is_int(base.get("head_dim")) and base["head_dim"] == base["qk_rope_head_dim"]:
            d["head_dim"] = d["qk_rope_head_dim"]
    _keep_width_multiples(d, base)
    _keep_width_parts(d, base)
    _keep_head_products(d, base)
    _keep_expert_groups(d)
    _keep_rope_sections(d, base)
    _keep_compound_scaling(d, base)


def _keep_compound_scaling(d: dict[str, Any], base: dict[str, Any]) -> None:
    """EfficientNet's compound scaling (ALIGN's vision tower too): every stage width is ``round_filters(w *
    width_coefficient)`` and the last one must equal ``hidden_dim`` (its BatchNorm), so the coefficient
    scales with the shrunk width (B7: 2.0 of 2560 -> 0.05 of 64, ``round_filters(1280) == 64``); the depth
    coefficient is at most 1 (B0's repeats). Before, the shrunk ``hidden_dim`` alone broke the last
    BatchNorm at every width level and the full-depth B7 at 600 px was audited (264 CPU s)."""
    key = _primary_hidden(d)
    wc = base.get("width_coefficient")
    if key and isinstance(wc, float) and _is_int(base.get(key)) and base[key] != d[key]:
        d["width_coefficient"] = wc * d[key] / base[key]
    if isinstance(base.get("depth_coefficient"), float) and base["depth_coefficient"] > 1:
        d["depth_coefficient"] = 1.0


def _rotary_half(d: dict[str, Any]) -> int | None:
    """Half the rotary width of one config level (frequencies per position): ``qk_rope_head_dim`` (MLA: the
    rotary part of each head, HY-V4-VL), else ``head_dim`` (or hidden / heads) times ``partial_rotary_factor``
    (top level or in ``rope_parameters``), halved; None when unknown."""
    if _is_int(d.get("qk_rope_head_dim")):
        return d["qk_rope_head_dim"] // 2
    heads = next((v for k, v in d.items() if _HEAD_KEYS.match(k) and _is_int(v) and v > 0), None)
    hidden = d.get(_primary_hidden(d) or "")
    head = d["head_dim"] if _is_int(d.get("head_dim")) else (hidden // heads if _is_int(hidden) and heads else None)
    rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor")) or 1.0
    return int(head * factor) // 2 if head else None


def mrope_sections(half: int, like: list[int] | None = None) -> list[int]:
    """Multimodal RoPE sections (temporal, height, width) summing to ``half`` frequencies, in the proportions of
    ``like`` (the library's sections for full-size heads), else in equal thirds, the remainder taken from the
    last (8 -> ``[3, 3, 2]``): a model that interleaves two sections (ERNIE-4.5-VL stacks its height and
    width frequencies, ``torch.stack([freq_h, freq_w])``, and falls back to ``[22, 22, 20]`` in its
    modeling code) needs them equal, which Qwen2-VL's proportions ``[16, 24, 24]`` (8 -> ``[2, 3, 3]``)
    broke for the first two; models that only split and concatenate the sections take any sizes."""
    like = like or [1, 1, 1]
    out = [max(1, round(v * half / sum(like))) for v in like]
    out[-1] = half - sum(out[:-1])
    return out


def _keep_rope_sections(d: dict[str, Any], base: dict[str, Any]) -> None:
    """``rope_parameters["mrope_section"]`` that summed to half the rotary width of full-size heads (Qwen2-VL,
    GLM-4V: ``[16, 24, 24]`` of 128-wide heads) sums to half the shrunk width, in the same proportions: the
    model splits its frequencies by these sizes."""
    rope = d.get("rope_parameters")
    sections = rope.get("mrope_section") if isinstance(rope, dict) else None
    if not (isinstance(sections, list) and sections and all(_is_int(v) for v in sections)):
        return
    old, new = _rotary_half(base), _rotary_half(d)
    if old and new and old != new and sum(sections) == old and new >= len(sections):
        d["rope_parameters"] = dict(rope, mrope_section=mrope_sections(new, sections))


_PRIMARY_HIDDEN = ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim", "model_dim")
_EXPAND_KEYS = re.compile(r"^(.*_)?expand$")


def _primary_hidden(d: dict[str, Any]) -> str | None:
    return next((k for k in _PRIMARY_HIDDEN if _is_int(d.get(k))), None)


#: widths and group counts that, equal to the model width in the defaults, must stay equal to it: a
#: quantizer without projections (WavTokenizer ``codebook_dim``), a depthwise upsampling conv (Mimi's
#: ``upsample_groups``, one group per channel), an adapter's input (Dots3-Note ``adapter_input_size``)
_TIED_TO_WIDTH = re.compile(r"(_dim|_groups|_channels|_input_size)$")


def _keep_width_multiples(d: dict[str, Any], base: dict[str, Any]) -> None:
    """A width key that was an integer multiple of the model width stays that multiple of the shrunk width
    (Zamba2: ``attention_hidden_size = 2 * hidden_size``; shrunk alone to 64 both, the attention input
    no longer matches the concatenation it is fed); a width or group count (:data:`_TIED_TO_WIDTH`) equal to
    the model width stays equal to it."""
    key = _primary_hidden(d)
    if key is None or not _is_int(base.get(key)) or base[key] == d[key]:
        return
    for other, value in base.items():
        if other == key or not (_is_int(value) and _is_int(d.get(other))):
            continue
        if d[other] == value:  # left as is by the shrink
            if _TIED_TO_WIDTH.search(other) and value == base[key]:
                d[other] = d[key]
        elif (_HIDDEN_KEYS.match(other) or other.endswith("_hidden_size")) and value % base[key] == 0 \
                and 1 < value // base[key] <= 4:
            d[other] = d[key] * (value // base[key])


#: ``*_size`` keys that are geometry or counts, not widths (the shrink keeps them: they tie to each other)
_NOT_WIDTH_PART = re.compile(r"(patch|image|input|crop|tubelet|kernel|window|chunk|block|merge|spec|pool|vocab|"
                             r"bucket|grid|state|context|codebook|step|batch|label)\w*_size$")
#: most times one part appears in the concatenation (LayoutLMv3: 4 box coordinates)
_MAX_PART_COUNT = 4


class ShrinkMisfit(ValueError):
    """A shrink level whose widths cannot keep a relation the model checks (raised by :func:`shrink_config_dict`;
    the sweep then tries the next level)."""


def _width_parts(d: dict[str, Any], base: dict[str, Any], key: str) -> list[str]:
    """Keys of the width parts that together make up the model width ``base[key]`` (:func:`_keep_width_parts`):
    two to six ``*_size`` keys left as is by the shrink (no :data:`_NOT_WIDTH_PART` geometry), each below the
    width, and counts of 1 to :data:`_MAX_PART_COUNT` of each that sum to it exactly; [] where none do."""
    import itertools

    parts = [k for k, v in base.items() if k != key and k.endswith("_size") and not _NOT_WIDTH_PART.search(k)
             and _is_int(v) and 1 < v < base[key] and d.get(k) == v]
    counts = range(1, _MAX_PART_COUNT + 1)
    if not 2 <= len(parts) <= 6 or not any(sum(c * base[k] for c, k in zip(cs, parts)) == base[key]
                                 for cs in itertools.product(counts, repeat=len(parts))):
        return []
    return parts


def _keep_width_parts(d: dict[str, Any], base: dict[str, Any]) -> None:
    """Widths of embeddings concatenated into the model width keep making it up: each part is scaled by the
    width's shrink factor. LayoutLMv3 concatenates 4 box-coordinate embeddings of ``coordinate_size`` and 2
    of ``shape_size`` into ``hidden_size`` (tables at modeling_layoutlmv3.py:108-111, ``torch.cat`` at 126:
    4 x 128 + 2 x 128 = 768); left at 128 beside hidden 64, every text forward fails on ``768 vs 64``.
    Raises :class:`ShrinkMisfit` where the factor leaves a part fractional (hidden 64 of 768: 128 -> 10.7),
    so that the sweep takes the next level ("small3": 96 of 768, parts of 16)."""
    key = _primary_hidden(d)
    if key is None or not _is_int(base.get(key)) or base[key] == d[key]:
        return
    parts = _width_parts(d, base, key)
    for part in parts:
        scaled = base[part] * d[key]
        if scaled % base[key]:
            raise ShrinkMisfit(f"{part} {base[part]} is a part of {key} {base[key]}: no integer part of "
                               f"{key} {d[key]}")
        d[part] = scaled // base[key]


def _keep_text_width(subs: dict[str, dict[str, Any]], d: dict[str, Any]) -> None:
    """A tower's width key (:data:`_TIED_TO_WIDTH`) equal to the language model's width in the defaults
    stays equal to the shrunk one (Dots3-Note's validator: ``vision_config.adapter_out_dim ==
    text_config.hidden_size``): towers project into the text model. ``subs``: the sub-configs of ``d``
    before their shrink, by key; ``d``: the config, its sub-configs shrunk."""
    old_text, new_text = subs.get("text_config"), d.get("text_config")
    width = _primary_hidden(old_text) if isinstance(old_text, dict) else None
    if width is None or not _is_int(new_text.get(width)) or old_text[width] == new_text[width]:
        return
    for name, old in subs.items():
        if name == "text_config":
            continue
        for key, value in old.items():
            if _TIED_TO_WIDTH.search(key) and value == old_text[width] and d[name].get(key) == value:
                d[name][key] = new_text[width]


_NAMED_WIDTH = re.compile(r"^hidden_size_(?P<a>\w+)$|^(?P<b>\w+)_hidden_size$")


def _keep_named_tower_widths(subs: dict[str, dict[str, Any]], d: dict[str, Any]) -> None:
    """A sub-config's width key that names a sibling sub-config (``hidden_size_<name>`` or
    ``<name>_hidden_size`` beside ``<name>_config``) and equals that sibling's width in the defaults stays
    equal to its shrunk width (BLT: ``encoder_config.hidden_size_global`` 2048 is ``global_config.hidden_size``;
    the local encoder's cross-attention projects patches into the global model: left at 2048, its forward
    fails on ``[.., 64] x [2048, 128]``). ``subs``: the sub-configs before their shrink, by key; ``d``: the
    config, its sub-configs shrunk, changed in place."""
    for name, old in subs.items():
        for key, value in old.items():
            named = _NAMED_WIDTH.match(key)
            tower = named and f"{named['a'] or named['b']}_config"
            if not (tower and tower in subs and tower != name and _is_int(value)):
                continue
            width = _primary_hidden(subs[tower])
            new = d[tower].get(width) if width else None
            if _is_int(new) and subs[tower][width] == value and d[name].get(key) == value:
                d[name][key] = new


_HEAD_COUNT = re.compile(r"^(?P<p>.*?)_?(num_attention_heads|num_heads|n_heads|n_head|attention_heads)$|"
                         r"^n_(?P<q>.+)_heads$")
_HEAD_WIDTH = re.compile(r"^(?P<p>.*?)_?(head_dim|headdim|d_head|attention_head_dim|attention_head_size)$")


def _keep_head_products(d: dict[str, Any], base: dict[str, Any]) -> None:
    """Heads × head width = a width stays true after the shrink (Mamba2/Bamba validators:
    ``num_heads * head_dim == expand * hidden_size``; Zamba2: ``attention_head_dim`` of
    ``attention_hidden_size``). Pairs are a head count and a head width of the same prefix (``mamba_n_heads``
    with ``mamba_d_head``); a width is any hidden-like key, or ``expand`` times the model width. The count is
    cut to at most :data:`HEADS`, the head width follows."""
    widths = {k: (base[k], d[k]) for k in base if _is_int(base[k]) and _is_int(d.get(k))
              and (_HIDDEN_KEYS.match(k) or k.endswith("_hidden_size"))}
    key = _primary_hidden(d)
    for e in (k for k in base if _EXPAND_KEYS.match(k) and _is_int(base[k]) and key):
        widths[e + "*" + key] = (base[e] * base[key], d[e] * d[key])
    for hk, hv in base.items():
        count = _HEAD_COUNT.match(hk)
        if not (count and _is_int(hv) and hv > 0):
            continue
        for wk, wv in base.items():
            width = _HEAD_WIDTH.match(wk)
            if not (width and width["p"] == (count["p"] or count["q"] or "") and _is_int(wv)):
                continue
            match = next((new for old, new in widths.values() if hv * wv == old and old != new), None)
            heads = min(d[hk], HEADS)
            if match is not None and match % heads == 0:
                d[hk], d[wk] = heads, match // heads


_GROUP_KEYS = re.compile(r"^(.*_)?(n_groups|ngroups|num_groups)$")


def _keep_expert_groups(d: dict[str, Any]) -> None:
    """Counts that must divide the shrunk counts still do: routing groups of experts (DeepSeek ``n_group``,
    ``topk_group``: each group keeps at least 2 experts, as its score is the sum of its 2 best), and state
    groups of Mamba heads (``n_groups`` dividing the head count)."""
    experts = next((v for k, v in d.items() if _EXPERT_KEYS.match(k) and _is_int(v)), None)
    for key in ("n_group", "num_expert_group"):
        if experts and _is_int(d.get(key)) and d[key] > 1 and experts % d[key] or experts and \
                _is_int(d.get(key)) and experts // max(d[key], 1) < 2:
            d[key] = max(1, experts // 2)
            if _is_int(d.get("topk_group")):
                d["topk_group"] = min(d["topk_group"], d[key])
    heads = next((v for k, v in d.items() if _HEAD_COUNT.match(k) and _is_int(v) and "attention" not in k), None)
    for key, value in list(d.items()):
        if _GROUP_KEYS.match(key) and _is_int(value) and heads and value > 1 and heads % value:
            d[key] = math.gcd(value, heads)


#: widths, depth and heads of :func:`plain_shrink_dict`
PLAIN_WIDTH, PLAIN_LAYERS, PLAIN_HEADS = 64, 2, 4


def plain_shrink_dict(d: dict[str, Any]) -> dict[str, Any]:
    """Copy of a transformers config dict shrunk the plain way, keeping no relation between its keys: in the
    dict and every nested sub-config dict, each width (:data:`_HIDDEN_KEYS`, ``*_hidden_size``,
    :data:`_FFN_KEYS`) above :data:`PLAIN_WIDTH` becomes it, each depth (:data:`_LAYER_KEYS`) above
    :data:`PLAIN_LAYERS` becomes it, each head count (:data:`_HEAD_KEYS`) above :data:`PLAIN_HEADS` becomes it
    and each KV head count (:data:`_KV_KEYS`) above it too. Nothing else changes: head dims, image sizes,
    patch and merge sizes, per-layer lists, vocabularies and the ``None`` sizes stay as the defaults give
    them, as a user's own quick shrink of a config would leave them (the sweep's ``--mode plain``: coverage
    where the careful shrink of :func:`shrink_config_dict` is not there to keep the model consistent)."""
    d = copy.deepcopy(d)
    for key, value in list(d.items()):
        if isinstance(value, dict) and key not in ("id2label", "label2id", "rope_parameters", "rope_scaling"):
            d[key] = plain_shrink_dict(value)
        elif not _is_int(value):
            continue
        elif (_HIDDEN_KEYS.match(key) or key.endswith("_hidden_size") or _FFN_KEYS.match(key)) and value > PLAIN_WIDTH:
            d[key] = PLAIN_WIDTH
        elif _LAYER_KEYS.match(key) and value > PLAIN_LAYERS:
            d[key] = PLAIN_LAYERS
        elif (_HEAD_KEYS.match(key) or _KV_KEYS.match(key)) and value > PLAIN_HEADS:
            d[key] = PLAIN_HEADS
    return d


def transformers_types(only: set[str] | None = None) -> list[str]:
    """The ``model_type`` of every AutoModel entry of the installed transformers, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return sorted(t for t in MODEL_MAPPING_NAMES if only is None or t in only)


_SIZE_WORDS = ("atto", "zepto", "femto", "pico", "nano", "xxxs", "xxs", "tiny", "t", "xs", "xsmall", "micro",
               "mini", "lite0", "b0", "small", "s", "s0", "mobile", "lite", "18", "r18", "medium", "m", "base",
               "b", "large", "l", "huge", "h", "giant", "g")


def _size_rank(name: str) -> tuple[int, int, str]:
    """Sort key guessing a timm model's size from its name (size word, then first number, then name)."""
    tokens = re.split(r"[_\-.]", name)
    rank = min((_SIZE_WORDS.index(t) for t in tokens if t in _SIZE_WORDS), default=len(_SIZE_WORDS))
    numbers = [int(n) for n in re.findall(r"\d+", name)]
    return rank, numbers[0] if numbers else 0, name


def timm_families(only: set[str] | None = None, candidates: int = 3) -> list[tuple[str, str, int]]:
    """One ``(family, model_name, n_params)`` per ``timm.list_modules()`` entry: its smallest model.

    timm's own unit-test models (``test_*``) are left out. The ``candidates`` best names by :func:`_size_rank` are built on the meta device (no weight memory)
    and the one with the fewest parameters wins; a family none of whose candidates builds is skipped.
    """
    import timm
    import torch

    out = []
    for family in timm.list_modules():
        if only is not None and family not in only:
            continue
        names = [n for n in timm.list_models(module=family) if not n.startswith("test_")]  # timm's unit-test nets
        names = sorted(names, key=_size_rank)[:candidates]
        best = None
        for name in names:
            try:
                with torch.device("meta"):
                    model = timm.create_model(name, pretrained=False)
            except Exception:  # noqa: BLE001 - a model timm itself cannot build is not a candidate
                continue
            n = sum(p.numel() for p in model.parameters())
            if best is None or n < best[2]:
                best = (family, name, n)
        if best is not None:
            out.append(best)
    return out


def add_missing_key(d: dict[str, Any], key: str) -> bool:
    """Give ``key`` its :func:`missing_key_value` in the config dict ``d`` and in each sub-config dict that
    lacks it (the error names the config class, not where it sits); returns whether any was added."""
    added = False
    for sub in [d] + [v for k, v in d.items() if isinstance(v, dict) and k not in ("id2label", "label2id")]:
        value = missing_key_value(sub, key) if key not in sub else None
        if value is not None:
            sub[key], added = value, True
    return added


def missing_key_value(d: dict[str, Any], key: str) -> Any:
    """A value for ``key``, read by a model but absent from its config class's defaults ``d`` (the
    checkpoints' config.json gives it), derived from the other keys as transformers' configs default it; None
    where no rule derives one. KV heads (MoonshineStreaming's decoder reads ``num_key_value_heads``) default
    to the head count of the same prefix (multi-head attention, every config's default when they are None);
    a dropout to 0.0, ``rope_theta`` to 10000."""
    kv = _KV_KEYS.match(key)
    if kv:
        prefix = kv[1] or ""
        heads = next((v for k, v in d.items() if _HEAD_KEYS.match(k) and k.startswith(prefix) and _is_int(v)), None)
        return heads
    if "dropout" in key:  # T5Gemma2's encoder reads dropout_rate
        return 0.0
    if key == "rope_theta":  # DBRX's attention config: the RoPE base of the RoFormer paper
        return 10000.0
    return None


def timm_model_args(architecture: str, hidden: int) -> dict[str, Any]:
    """``timm.create_model`` keyword arguments that shrink a timm model named in a transformers config
    (``TimmWrapperConfig``: ``architecture`` and ``model_args``; PE-Audio-Video's video tower is timm's
    ViT-L ``vit_pe_core_large_patch14_336``): ``depth`` :data:`LAYERS`, ``embed_dim`` ``hidden``,
    ``num_heads`` :data:`HEADS`, those the model class's constructor takes (read from the class of the model
    built on the meta device). Empty where timm is not installed or does not build the name."""
    import inspect

    try:
        import timm
        import torch

        with torch.device("meta"):
            model = timm.create_model(architecture, pretrained=False)
    except Exception:  # noqa: BLE001 - no shrink without timm; the wrapper's model is then built as named
        return {}
    params = inspect.signature(type(model).__init__).parameters
    wanted = {"depth": LAYERS, "embed_dim": hidden, "num_heads": HEADS}
    return {k: v for k, v in wanted.items() if k in params}


def model_config(config):
    """The config the type's ``AutoModel`` class takes: ``config`` itself, or where that class takes one of
    its sub-configs (MusicGen: ``MusicgenModel`` is the decoder, built from ``MusicgenDecoderConfig``, the
    ``decoder`` of ``MusicgenConfig``), that sub-config, its ``architectures`` naming the class so that
    normaudit, which reads ``architectures`` first, builds the same model."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(config.model_type)
    if isinstance(name, tuple) and name and not getattr(config, "architectures", None):
        config.architectures = [name[0]]  # several classes (Funnel: FunnelModel, FunnelBaseModel): AutoModel
        return config  # fails on the tuple; the first is the one AutoModel means
    wanted = getattr(getattr(transformers, name, None), "config_class", None) if isinstance(name, str) else None
    if wanted is None or isinstance(config, wanted):
        return config
    sub = next((v for v in vars(config).values() if isinstance(v, wanted)), None)
    if sub is None:
        return config
    sub.architectures = [name]
    return sub


def fill_rope_sections(config) -> None:
    """Give ``rope_parameters["mrope_section"]`` to each (sub-)config whose class says its model reads one
    (``ignore_keys_at_rope_validation`` names it) but whose defaults leave it out: GLM-Image and GLM-4.6V
    fall back to ``[8, 12, 12]`` written for their checkpoints' 64-frequency rotary part, HunYuan-VL to none
    at all. The sections sum to half the rotary width of the shrunk heads (:func:`mrope_sections`); a
    ``rope_parameters`` given per layer type (``{"full_attention": {...}}``) gets them in each entry."""
    from transformers import PretrainedConfig

    todo, seen = [config], set()
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        todo += [v for v in vars(c).values() if isinstance(v, PretrainedConfig)]
        rope = getattr(c, "rope_parameters", None)
        reads = "mrope_section" in (getattr(type(c), "ignore_keys_at_rope_validation", None) or ())
        per_type = [v for v in rope.values() if isinstance(v, dict)] if isinstance(rope, dict) else []
        for entry in per_type if per_type and len(per_type) == len(rope) else [rope]:  # per layer type: each
            if reads and isinstance(entry, dict) and entry.get("mrope_section") is None:
                half = _rotary_half(dict(vars(c)))
                if half and half >= 3:
                    entry["mrope_section"] = mrope_sections(half)
