"""The real-weights fallback is capped: a ``build_model()`` that cannot run on the meta device (``.item()`` of a
tensor it made) is built for real with at most ``--max-params`` tensor elements (default 10**9), each counted
before it is allocated; past the cap it is exit 2 naming the size, at once and without the allocation (a
10**12-parameter model once asked the kernel for 4 TB)."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from normaudit.errors import UsageError
from normaudit.loaders.allocation_cap import AllocationCap, AllocationRefused
from normaudit.loaders.pyfile import build_model_from

HUGE = textwrap.dedent("""
    import torch
    from torch import nn


    def build_model():
        scale = torch.ones(4).sum().item()  # a number from a tensor it made: cannot run on the meta device
        return nn.Sequential(nn.Linear(1_000_000, 1_000_000), nn.LayerNorm(1_000_000))
""")
META_CAUSE = "RuntimeError: Tensor.item() cannot be called on meta tensors, line 7"


def test_a_trillion_parameter_fallback_is_refused_fast_without_allocating(tmp_path):
    """Through ``python -m normaudit`` under a 16 GiB address-space limit: 4 TB is never asked for."""
    (tmp_path / "huge.py").write_text(HUGE)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("NORMAUDIT_DEBUG", None)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "normaudit", "huge.py", "--isolated", "--no-cache"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env, preexec_fn=limit)
    took = time.monotonic() - started
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.splitlines() == [
        f"normaudit: error: huge.py: build_model() could not run on the meta device ({META_CAUSE}), and building it "
        "with real weights was refused before allocating a tensor of 1,000,000,000,000 elements (shape [1000000, "
        "1000000], float32, 3,725.3 GiB) after 4 elements already made: 1,000,000,000,004 in all, above the limit "
        "of 1,000,000,000 (--max-params 1000000000): raise --max-params to build it anyway"]
    assert took < 120


def _needs_real(width: int):
    def build_model():
        n = int(torch.ones(width).sum().item())
        return nn.Sequential(nn.Linear(n, n), nn.LayerNorm(n))
    return build_model


def test_cap_is_max_params(tmp_path):
    where = tmp_path / "m.py"
    build = build_model_from(_needs_real(8), "build_model", where)  # 8 + 64 + 8 + 8 + 8 elements: built
    assert not build.on_meta and sum(p.numel() for p in build.model.parameters()) == 88
    with pytest.raises(UsageError) as info:
        build_model_from(_needs_real(8), "build_model", where, max_params=50)
    assert "refused before allocating a tensor of 64 elements (shape [8, 8], float32, 256 bytes) after 8 " \
           "elements already made: 72 in all, above the limit of 50 (--max-params 50)" in str(info.value)
    build_model_from(_needs_real(8), "build_model", where, max_params=96)


def test_refusal_caught_by_the_model_code_is_still_refused(tmp_path):
    def build_model():
        torch.ones(2).sum().item()
        try:
            big = nn.Linear(4096, 4096)
        except Exception:  # noqa: BLE001 - the model's own fallback must not hide the refusal
            big = nn.Linear(4, 4)
        return big

    with pytest.raises(UsageError, match=r"tensor of 16,777,216 elements \(shape \[4096, 4096\]"):
        build_model_from(build_model, "build_model", tmp_path / "m.py", max_params=1_000_000)


def test_a_model_that_builds_on_meta_is_not_capped(tmp_path):
    build = build_model_from(lambda: nn.Linear(100_000, 100_000), "build_model", tmp_path / "m.py", max_params=10)
    assert build.on_meta


def test_cap_counts_factories_and_shaped_copies_before_allocating():
    cap = AllocationCap(1000)
    with cap:
        a = torch.empty(10, 10)
        torch.zeros_like(a)
        a.new_ones((5,))
        a @ a  # made from counted tensors: not counted again
        torch.arange(20)
    assert cap.total == 100 + 100 + 5 + 20 and cap.refused is None
    with pytest.raises(AllocationRefused), cap:
        torch.randn(1 << 40)
    assert cap.refused[1:3] == (1 << 40, (1 << 40,))
