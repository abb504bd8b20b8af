"""A failed capture attempt names the line of model code its failure was raised from (``location``), so a
report on a library model says which library line blocks the capture; torch's and normaudit's own frames are
never that line."""
from __future__ import annotations

import inspect

import torch
from torch import nn

from normaudit.capture import capture_model
from normaudit.capture.errors import failure_location


class BranchesOnValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        if x.sum() > 1e9:  # a Python branch on a tensor's value: neither method captures it
            return x
        return self.norm(x)


def test_every_failed_attempt_points_at_the_branch():
    cap = capture_model(BranchesOnValue(), (torch.randn(2, 8),), on_meta=False)
    failed = [a for a in cap.attempts if not a.ok]
    assert cap.gm is None and [a.method for a in failed][:2] == ["symbolic_trace", "export"]
    line = inspect.getsourcelines(BranchesOnValue.forward)[1] + 1
    assert {(a.location.file, a.location.line) for a in failed} == {(__file__, line)}


def test_a_wrapped_failure_keeps_the_line_of_the_original_raise():
    def model_code():
        raise ValueError("inside the model")

    try:
        try:
            model_code()
        except ValueError as inner:
            raise RuntimeError("re-raised by a wrapper") from inner
    except RuntimeError as outer:
        loc = failure_location(outer)
    assert (loc.file, loc.line) == (__file__, inspect.getsourcelines(model_code)[1] + 1)


def test_a_failure_inside_torch_alone_has_no_location():
    try:
        nn.Module().register_buffer(1, None)  # raised by torch/nn/modules/module.py's own Python
    except TypeError as exc:
        assert failure_location(exc) is not None  # this test's frame is model code
        exc.__traceback__ = exc.__traceback__.tb_next  # torch's frames are left
        assert exc.__traceback__ is not None and failure_location(exc) is None
