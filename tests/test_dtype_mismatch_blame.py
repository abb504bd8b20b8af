"""``--dtype float16`` on a model whose forward makes float32 tensors itself (a timestep embedding): the error
names the first module whose input dtype differs from its weights' (and the line calling it), and says what
runs such a model in float16 (autocast; or the tensor made in its input's dtype), instead of blaming a layer
modules later that the fake tensors let the float32 tensor reach."""
from __future__ import annotations

import textwrap

import pytest

from normaudit.cli import main

UNET = textwrap.dedent("""
    import math
    import torch
    from torch import nn


    class TimeEmbedding(nn.Module):
        def __init__(self, dim=16):
            super().__init__()
            self.dim = dim
            self.lin = nn.Linear(dim, 8)

        def forward(self, t):
            half = self.dim // 2
            freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
            args = t[:, None].float() * freqs[None]
            emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
            return self.lin(emb)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.time = TimeEmbedding()
            self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
            self.norm = nn.GroupNorm(2, 8)
            self.conv_out = nn.Conv2d(8, 3, 3, padding=1)

        def forward(self, x, t):
            h = self.conv_in(x)
            h = h + self.time(t)[:, :, None, None]
            h = self.norm(h)
            return self.conv_out(h)


    def build_model():
        return Net()


    def example_inputs():
        return (torch.randn(2, 3, 8, 8), torch.tensor([1.0, 5.0]))
""")


def _run(tmp_path, capsys, monkeypatch, source: str, dtype: str) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "unet.py").write_text(source)
    rc = main(["unet.py", "--dtype", dtype, "--isolated", "--no-cache"])
    out, err = capsys.readouterr()
    return rc, err


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_first_mismatching_module_is_named_with_its_call_line(tmp_path, capsys, monkeypatch, dtype):
    rc, err = _run(tmp_path, capsys, monkeypatch, UNET, dtype)
    assert rc == 2
    (line,) = err.splitlines()
    assert line.startswith("normaudit: error: unet.py:18: the model's forward fails on its example_inputs(): ")
    assert line.endswith(
        f"; the first module whose input dtype differs from its weights' is time.lin (Linear: float32 input, "
        f"{dtype} weights; the error above surfaced later): the forward makes a float32 tensor itself (an explicit "
        f"dtype=, .float()), which weights cast to {dtype} do not take, and model.to(torch.{dtype}) fails the "
        f"same way; in {dtype} such a model runs under torch.autocast, which casts each op's inputs: make that "
        f"tensor in the dtype of the input it meets (.to(x.dtype)) to audit it in {dtype}")


def test_the_same_model_audits_in_float32_and_once_the_tensor_follows_the_weights(tmp_path, capsys, monkeypatch):
    rc, err = _run(tmp_path, capsys, monkeypatch, UNET, "float32")
    assert rc == 0 and "error" not in err
    fixed = UNET.replace("return self.lin(emb)", "return self.lin(emb.to(self.lin.weight.dtype))")
    rc, err = _run(tmp_path, capsys, monkeypatch, fixed, "float16")
    assert rc == 0 and "error" not in err


def test_a_failure_that_is_no_dtype_mismatch_keeps_its_message(tmp_path, capsys, monkeypatch):
    wrong = UNET.replace("torch.randn(2, 3, 8, 8)", "torch.randn(2, 4, 8, 8)")
    rc, err = _run(tmp_path, capsys, monkeypatch, wrong, "float16")
    assert rc == 2
    assert "first module whose input dtype differs" not in err
    assert err.startswith("normaudit: error: unet.py:")
