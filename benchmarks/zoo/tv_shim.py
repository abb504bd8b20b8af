"""Make ``import torchvision`` work on CPU torch when the installed torchvision wheel is a CUDA build.

The registry's torchvision 0.28 wheel for torch 2.13 carries a CUDA ``_C`` extension that does not load on
the CPU torch wheel; torchvision then still calls ``torch.library.register_fake("torchvision::nms")``
(``torchvision/_meta_registrations.py``), which raises ``RuntimeError: operator torchvision::nms does not
exist`` and the import fails. This shim declares the operator schemas (copied from torchvision's
``csrc/ops/*.cpp`` ``m.def(...)`` lines) before torchvision is imported, so the import succeeds; the ops
have no CPU kernel, so calling one (nms, roi_align, deform_conv2d, ...) raises ``NotImplementedError``.
Only the sweep's worker imports it; it changes nothing when torchvision's own extension loads.

Usage: ``import tv_shim; tv_shim.install()`` before anything imports torchvision or timm, or
``tv_shim.install_on_import()`` (what the venv's ``.pth`` file runs at startup, before torch is importable),
which defers ``install()`` to the first ``import torchvision``.
"""

from __future__ import annotations

import importlib.abc
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width,"
    " int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height,"
    " SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width,"
    " int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale,"
    " int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width,"
    " int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width,"
    " int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale,"
    " SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels,"
    " SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width)"
    " -> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height,"
    " SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width)"
    " -> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale,"
    " SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height,"
    " SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h,"
    " SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups,"
    " SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask,"
    " Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h,"
    " SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask)"
    " -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
    "_cuda_version() -> int",
)

_LIBRARY = None  # the torch.library.Library holding the definitions; kept alive, the ops die with it


def _exists(name: str) -> bool:
    """True when ``torchvision::<name>`` is already a registered operator."""
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def install() -> None:
    """Declare every torchvision operator schema that is not registered yet (idempotent).

    Raises nothing on a torchvision whose extension loads: then every schema exists and nothing is defined.
    """
    global _LIBRARY
    import torch

    missing = [s for s in _SCHEMAS if not _exists(s.split("(", 1)[0])]
    if not missing:
        return
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")
    for schema in missing:
        _LIBRARY.define(schema)


class _InstallBeforeTorchvision(importlib.abc.MetaPathFinder):
    """Import hook: runs ``install()`` when ``torchvision`` is first imported, then removes itself."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - MetaPathFinder protocol
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            install()
        return None  # the normal finders import torchvision itself


def install_on_import() -> None:
    """Defer ``install()`` to the first ``import torchvision`` (safe before torch is on ``sys.path``)."""
    if not any(isinstance(f, _InstallBeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallBeforeTorchvision())
