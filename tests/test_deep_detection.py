"""Issue 15 (deeper detection): the facts behind the norm bugs public bug reports found and normaudit missed.

Each class has its facts asserted here on small in-memory models (exact modules and values); the rules over
them are checked against their fixtures by the family tests (tests/fixtures/<family>/<ID>_<n>.py).

- item 6: the eps an ``eps=None`` RMSNorm really uses, in ``site.eps`` (torch.nn.RMSNorm docs);
- item 1: norm modules registered but never applied (``model.unused_norms``);
- item 3: hand-written GroupNorm recognised by its computation (``kind``, ``num_groups``, ``group_split``);
- item 4: frozen BatchNorms that ``model.train()`` unfreezes (``site.freeze``);
- item 7: per-module gain convention against the checkpoint, shape mismatches (``site.weights``);
- item 8: casts around the norm (``site.output_dtype``, ``site.formula.cast``).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import audit_model, family_rules, site


class _RMSPair(nn.Module):
    """nn.RMSNorm without eps, F.rms_norm without eps, and nn.RMSNorm with one."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.default = nn.RMSNorm(d)
        self.given = nn.RMSNorm(d, eps=1e-6)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        x = self.default(x)
        x = self.proj(F.rms_norm(x, (x.shape[-1],)))
        return self.given(x)


@pytest.mark.parametrize("dtype, eps", [("float32", 2.0 ** -23), ("float16", 2.0 ** -10), ("bfloat16", 2.0 ** -7)])
def test_rmsnorm_without_eps_reports_the_eps_of_its_dtype(dtype, eps):
    """``nn.RMSNorm(d)``: eps=None resolves to torch.finfo(x.dtype).eps, so it changes with the dtype."""
    r = audit_model(_RMSPair(), (torch.randn(2, 4, 16),), rules={}, dtype=dtype)
    default, functional, given = site(r, "default"), site(r, ""), site(r, "given")
    assert (default.eps, default.input_dtype) == (eps, dtype)
    assert default.extra["eps_default"] == "torch.finfo(input dtype).eps"
    assert (functional.detected_by, functional.eps) == ("functional", eps)
    assert given.eps == 1e-6 and "eps_default" not in given.extra
    assert default.eps_facts.effective == eps
    # the constructor quoted as written: no eps argument for the default one
    assert default.describe() == "nn.RMSNorm(normalized_shape=[16])"
