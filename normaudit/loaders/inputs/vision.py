"""Image inputs built from a Hugging Face config.

Images ``(B, C, H, W)`` sized from the config (at least as large as a detector's decoder queries or an image
pyramid's patches need), image pairs and video clips ``(B, T, C, H, W)``, and the patch lists of
vision-language towers with the grids that go with them: flattened patches with ``image_grid_thw``, patch
rows with their positions or validity mask, NaViT-packed patches with ``target_sizes``. Also the input size
a model declares for itself (timm's ``pretrained_cfg``). :data:`VISION_BUILDERS` maps ``forward``
parameters to builders (config -> candidate tensors, first choice first); :data:`VISION_VARIANTS` names the
builders that replace them when ``forward`` takes a patch-list parameter.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from normaudit.loaders.inputs.base import (BATCH, SIDE, VISION_CONFIGS, cfg_value, is_positive_int, single,
                                           sub_configs)

IMAGE_SIZE_KEYS = ("image_size", "input_size", "img_size")


def _pair(size: Any) -> tuple[int, int]:
    if isinstance(size, dict):
        size = size.get("height", size.get("shortest_edge", SIDE)), size.get("width", size.get("shortest_edge", SIDE))
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    return int(size), int(size)


def _image_size(config: Any) -> Any:
    """The config's image size (:data:`IMAGE_SIZE_KEYS` on it or its vision sub-configs), else the one of
    the backbone a vision sub-config holds (SAM2, EdgeTAM: ``vision_config.backbone_config.image_size``,
    1024, which the FPN's ``backbone_feature_sizes`` are built for), else :data:`SIDE`."""
    size = cfg_value(config, IMAGE_SIZE_KEYS, VISION_CONFIGS)
    if size is not None:
        return size
    for sub in sub_configs(config, VISION_CONFIGS, depth=1)[:-1]:
        size = cfg_value(getattr(sub, "backbone_config", None), IMAGE_SIZE_KEYS)
        if size is not None:
            return size
    return SIDE


def _image(config: Any) -> torch.Tensor:
    """``(B, C, H, W)``, or ``(B, T, C, H, W)`` for a video model (``num_frames`` in the config)."""
    channels = int(cfg_value(config, ("num_channels", "in_channels", "input_channels"), VISION_CONFIGS, 3))
    h, w = _pair(_image_size(config))
    side = max(_query_side(config), _pyramid_side(config))
    h, w = max(h, side), max(w, side)
    frames = cfg_value(config, ("num_frames",), VISION_CONFIGS)
    if isinstance(frames, int) and frames > 0:
        return torch.randn(BATCH, frames, channels, h, w)
    return torch.randn(BATCH, channels, h, w)


def _pyramid_side(config: Any) -> int:
    """Smallest image side for a model that rescales the image by each of ``scaled_images_ratios`` and cuts
    every scaled copy into ``patch_size`` square patches (DepthPro: ratios 0.25, 0.5, 1 and 384-pixel
    patches need 1536, as its forward raises below ``min(ratios) * side < patch_size``): ``ceil(patch_size
    / min(ratios))``. 0 when the config has no such pyramid."""
    ratios, patch = getattr(config, "scaled_images_ratios", None), getattr(config, "patch_size", None)
    if not (isinstance(ratios, (list, tuple)) and ratios and is_positive_int(patch)
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
    if not (isinstance(strides, (list, tuple)) and strides and all(is_positive_int(s) for s in strides)
            and is_positive_int(queries)):
        return 0
    strides = [int(s) for s in strides]
    levels = getattr(config, "num_feature_levels", None)
    while is_positive_int(levels) and len(strides) < levels:
        strides.append(strides[-1] * 2)
    step = max(strides)
    side = step
    while sum((-(-side // s)) ** 2 for s in strides) < queries and side < 4096:
        side += step
    return side


#: frames of a video input when the config names none (InstructBLIP-Video's tests use 4)
VIDEO_FRAMES = 4


def images(config: Any) -> Iterator[torch.Tensor]:
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


def _patches(config: Any) -> Iterator[torch.Tensor]:
    """Qwen2-VL-style flattened patches ``(B * g * g, C * temporal_patch * patch * patch)`` (the temporal
    patch is ``temporal_patch_size``, MuseSpark's ``patch_temporal``) for a ``g x g``
    patch grid per image (``g`` = 2 merge windows), with :func:`_grid` giving ``image_grid_thw``; then the
    same patches unflattened, ``(B * g * g, C, patch, patch)`` (Kimi-K2.5's tower convolves each patch)."""
    g = _grid_side(config)
    channels = int(cfg_value(config, ("in_channels", "num_channels"), VISION_CONFIGS, 3))
    temporal = int(cfg_value(config, ("temporal_patch_size", "patch_temporal"), VISION_CONFIGS, 1))
    patch = int(cfg_value(config, ("patch_size",), VISION_CONFIGS, 14))
    yield torch.randn(BATCH * g * g, channels * temporal * patch * patch)
    if temporal == 1:
        yield torch.randn(BATCH * g * g, channels, patch, patch)


def _grid_side(config: Any) -> int:
    return 2 * int(cfg_value(config, ("spatial_merge_size", "merge_size"), VISION_CONFIGS, 1))


def _grid(config: Any) -> torch.Tensor:
    g = _grid_side(config)
    return torch.tensor([[1, g, g]] * BATCH, dtype=torch.int64)


def _merge_sizes(config: Any) -> torch.Tensor:
    """VideoLLaMA3-style ``merge_sizes``: one spatial merge size per image of :func:`_grid`."""
    merge = int(cfg_value(config, ("spatial_merge_size", "merge_size"), VISION_CONFIGS, 1))
    return torch.tensor([merge] * BATCH, dtype=torch.int64)


def _packed_grid_side(config: Any) -> int:
    """Side of each image's patch grid in :func:`_packed_patches`: two merge windows
    (``window_kernel_size``, MiniCPM-V's ViT merger), else 4."""
    window = cfg_value(config, ("window_kernel_size",), VISION_CONFIGS)
    if isinstance(window, (list, tuple)) and window and all(is_positive_int(w) for w in window):
        return 2 * max(int(w) for w in window)
    return 2 * int(window) if is_positive_int(window) else 4


def _packed_patches(config: Any) -> Iterator[torch.Tensor]:
    """NaViT-style packed images (MiniCPM-V): the patches of :data:`BATCH` images of ``g x g`` patches
    (:func:`_packed_grid_side`) laid side by side in one row, ``(1, C, patch, B * g * g * patch)``; the
    tower's patch convolution gives one token per patch, split into images by ``target_sizes``."""
    g = _packed_grid_side(config)
    channels = int(cfg_value(config, ("num_channels", "in_channels"), VISION_CONFIGS, 3))
    patch = int(cfg_value(config, ("patch_size",), VISION_CONFIGS, 14))
    yield torch.randn(1, channels, patch, BATCH * g * g * patch)


def _target_sizes(config: Any) -> torch.Tensor:
    """``target_sizes`` ``(B, 2)``: the (height, width) in patches of each image of :func:`_packed_patches`."""
    g = _packed_grid_side(config)
    return torch.tensor([[g, g]] * BATCH, dtype=torch.int64)


def _position_grid_side(config: Any) -> int:
    """Side of the patch grid of :func:`_patch_rows`: two pooling windows (``pooling_kernel_size``)."""
    return 2 * int(cfg_value(config, ("pooling_kernel_size",), VISION_CONFIGS, 2))


def _patch_rows(config: Any) -> Iterator[torch.Tensor]:
    """Gemma-4-style patchified images ``(B, g * g, C * patch * patch)`` for a ``g x g`` patch grid
    (:func:`_position_grid_side`), with :func:`_patch_positions` giving ``pixel_position_ids``."""
    g = _position_grid_side(config)
    channels = int(cfg_value(config, ("num_channels", "in_channels"), VISION_CONFIGS, 3))
    patch = int(cfg_value(config, ("patch_size",), VISION_CONFIGS, 16))
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


class _DeclaredImageSize:
    """``config`` seen with ``image_size`` set (every other attribute read from ``config``)."""

    def __init__(self, config: Any, size: tuple[int, int]):
        self._config = config
        self.image_size = size

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


def with_declared_image_size(model: nn.Module, config: Any) -> Any:
    """``config``, or, when it names no image size but a submodule declares one (a timm backbone's
    ``pretrained_cfg['input_size']``, wrapped by ``TimmWrapper``: Perception Encoder video towers need
    336 x 336), ``config`` seen with that ``image_size`` (:class:`_DeclaredImageSize`)."""
    if cfg_value(config, ("image_size", "input_size", "img_size"), VISION_CONFIGS) is not None:
        return config
    for _, module in model.named_modules():
        declared = declared_input_size(module)
        if declared is not None and len(declared[0]) == 3:
            return _DeclaredImageSize(config, declared[0][1:])
    return config


#: forward parameter -> candidate image inputs built from the config, first choice first
VISION_BUILDERS: dict[str, Callable[[Any], Iterator[torch.Tensor]]] = {
    "pixel_values": images, "pixel_values_videos": _videos,
}


#: when ``forward`` takes the key, the inputs are built by the value's builders instead (patch-list VLMs)
VISION_VARIANTS: dict[str, dict[str, Callable[[Any], Iterator[torch.Tensor]]]] = {
    "image_grid_thw": {"pixel_values": _patches, "image_grid_thw": single(_grid)},
    # Gemma 4's vision tower: patch rows with their (x, y) positions
    "pixel_position_ids": {"pixel_values": _patch_rows, "pixel_position_ids": _patch_positions},
    # NaFlex patch rows with their validity mask and each image's patch grid (Siglip2)
    "spatial_shapes": {"pixel_values": _patch_rows, "pixel_attention_mask": _patch_mask,
                       "spatial_shapes": _spatial_shapes},
    # NaViT-style packed patches with each image's patch grid (MiniCPM-V)
    "target_sizes": {"pixel_values": _packed_patches, "target_sizes": single(_target_sizes)},
    # vision towers of patch-list VLMs called alone: ``forward(pixel_values | hidden_states, grid_thw)``
    "grid_thw": {"pixel_values": _patches, "hidden_states": _patches, "grid_thw": single(_grid),
                 "merge_sizes": single(_merge_sizes)},
}
