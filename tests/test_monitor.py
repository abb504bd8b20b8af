"""normaudit.monitor(): the layer and the step where inf/NaN first appears in a training loop."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import normaudit
from normaudit.probes.monitor import Monitor, NonFiniteError, monitor, norm_kinds

ROOT = Path(__file__).resolve().parents[1]
NAN_STEP = 3


class NaNGrad(torch.autograd.Function):
    """Identity in forward; its backward returns NaN (a module whose backward breaks)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


class Tap(nn.Module):
    """Identity, or NaNGrad when ``on``."""

    def __init__(self):
        super().__init__()
        self.on = False

    def forward(self, x):
        return NaNGrad.apply(x) if self.on else x


class Block(nn.Module):
    """Pre-LN MLP block: x + fc2(act(fc1(tap(ln(x)))))."""

    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.ln = nn.LayerNorm(d, eps=eps)
        self.tap = Tap()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d)
        self.overflow = False

    def forward(self, x):
        h = self.fc1(self.tap(self.ln(x)))
        if self.overflow:                      # the block's own code, no submodule, overflows
            h = torch.exp(h * 1000.0)
        return x + self.fc2(self.act(h))


class Net(nn.Module):
    def __init__(self, d: int = 16, n: int = 3):
        super().__init__()
        self.emb = nn.Linear(8, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln_f(h))


def train(model, mon, steps=6, before_step=None, loss_fn=None, explicit_steps=False, accumulate=1):
    """A plain loop; an update whose loss is not finite is skipped (as AMP's GradScaler does), so later steps
    start from finite weights again."""
    torch.manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(steps):
        for _ in range(accumulate):
            if before_step is not None:
                before_step(step)
            out = model(torch.randn(4, 8))
            loss = loss_fn(out) if loss_fn else out.pow(2).mean()
            loss.backward()
        if torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()):
            opt.step()
        opt.zero_grad()
        if explicit_steps:
            mon.step()
    return mon.close()


def nan_output_at(module, step_box, step):
    """Forward hook: one NaN in ``module``'s output when the loop's step is ``step``; records the input."""
    seen = {}

    def hook(mod, args, out):
        if step_box[0] == step:
            seen["input_absmax"] = float(args[0].detach().abs().max())
            seen["weight_absmax"] = max(float(p.detach().abs().max()) for p in mod.parameters())
            out = out.clone()
            out[0, 0] = float("nan")
            return out
    module.register_forward_hook(hook)
    return seen


def test_forward_nan_at_step_3_reports_that_step_and_layer():
    torch.manual_seed(0)
    model, box = Net(), [None]
    seen = nan_output_at(model.blocks[1].fc1, box, NAN_STEP)
    mon = monitor(model)
    report = train(model, mon, before_step=lambda s: box.__setitem__(0, s))
    assert len(report.events) == 1
    ev = report.first
    assert (ev.step, ev.phase, ev.cause, ev.module, ev.class_name) == (3, "forward", "module", "blocks.1.fc1", "Linear")
    assert not ev.is_norm and ev.norm_kind is None
    assert ev.input_absmax == pytest.approx(seen["input_absmax"])
    assert ev.weight_absmax == pytest.approx(seen["weight_absmax"])
    assert ev.first_norm == "blocks.2.ln"
    assert ev.propagated_to[:3] == ["blocks.1.act", "blocks.1.fc2", "blocks.2.ln"]
    assert "blocks.1" not in ev.propagated_to          # the producer's own container is not a propagator
    assert report.forwards_seen == report.forwards_checked == 6


def test_correct_loop_reports_nothing():
    torch.manual_seed(0)
    model = Net()
    report = train(model, monitor(model))
    assert report.events == [] and report.first is None
    assert report.forwards_checked == 6


def test_backward_nan_at_step_3_reports_the_module_whose_backward_made_it():
    torch.manual_seed(0)
    model = Net()
    tap = model.blocks[1].tap
    grads = {}

    def before(step):
        tap.on = step == NAN_STEP

    def keep_grad(mod, args, out):
        if tap.on:
            out.register_hook(lambda g: grads.__setitem__("out", float(g.abs().max())))
    tap.register_forward_hook(keep_grad)
    report = train(model, monitor(model), before_step=before)
    assert len(report.events) == 1
    ev = report.first
    assert (ev.step, ev.phase, ev.cause, ev.module, ev.class_name) == (3, "backward", "module", "blocks.1.tap", "Tap")
    assert ev.input_absmax == pytest.approx(grads["out"])    # the finite gradient it received
    assert ev.first_norm == "blocks.1.ln"                    # the first norm its NaN gradient reaches
    assert "blocks.0.fc2" in ev.propagated_to


def test_code_of_a_block_outside_its_submodules_is_the_producer():
    torch.manual_seed(0)
    model = Net()
    report = train(model, monitor(model), before_step=lambda s: setattr(model.blocks[2], "overflow", s == NAN_STEP))
    ev = report.first
    assert (ev.step, ev.phase, ev.cause, ev.module, ev.class_name) == (3, "forward", "module", "blocks.2", "Block")
    assert ev.propagated_to[:2] == ["blocks.2.act", "blocks.2.fc2"]
    assert ev.first_norm == "ln_f"


def test_layernorm_with_eps_0_on_a_constant_row_is_the_producer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16, eps=0.0), nn.Linear(16, 1))
    lin = model[0]

    def before(step):
        with torch.no_grad():   # a zero layer: every row of the norm's input is constant (variance 0)
            lin.weight.mul_(0.0 if step == NAN_STEP else 1.0)
            lin.bias.mul_(0.0 if step == NAN_STEP else 1.0)
    report = train(model, monitor(model), steps=4, before_step=before)
    ev = report.first
    assert (ev.step, ev.phase, ev.cause, ev.module) == (3, "forward", "module", "1")
    assert ev.is_norm and ev.norm_kind == "LayerNorm" and ev.first_norm == "1"
    assert ev.input_absmax == 0.0
    assert ev.propagated_to == ["2"]


def test_non_finite_gradient_from_the_loss_is_the_loss():
    torch.manual_seed(0)
    model = Net()
    report = train(model, monitor(model), steps=2, loss_fn=lambda out: torch.sqrt(out * 0.0).sum())
    ev = report.first
    assert (ev.step, ev.phase, ev.cause, ev.module, ev.class_name) == (0, "backward", "loss", "", "loss")
    assert ev.first_norm == "ln_f"
    assert len(report.events) == 2


def test_sampling_checks_one_step_in_k():
    torch.manual_seed(0)
    model, box = Net(), [None]
    nan_output_at(model.blocks[0].fc2, box, 3)
    nan_output_at(model.blocks[0].fc2, box, 4)
    report = train(model, monitor(model, every=2), before_step=lambda s: box.__setitem__(0, s))
    assert [(e.step, e.module) for e in report.events] == [(4, "blocks.0.fc2")]
    assert (report.forwards_seen, report.forwards_checked) == (6, 3)


def test_explicit_steps_with_gradient_accumulation():
    torch.manual_seed(0)
    model, box, forwards = Net(), [None], [0]

    def before(step):
        forwards[0] += 1
        box[0] = forwards[0]
    nan_output_at(model.blocks[1].fc2, box, 2 * NAN_STEP + 2)   # the second micro-batch of step 3
    mon = monitor(model, auto_step=False)
    report = train(model, mon, before_step=before, explicit_steps=True, accumulate=2)
    assert [(e.step, e.module) for e in report.events] == [(3, "blocks.1.fc2")]
    assert (report.forwards_seen, report.forwards_checked) == (12, 12)


def test_raise_stops_the_loop_in_backward_and_warn_warns():
    torch.manual_seed(0)
    model, box = Net(), [None]
    nan_output_at(model.blocks[1].fc1, box, NAN_STEP)
    with pytest.raises(NonFiniteError) as err, monitor(model, on_nonfinite="raise") as mon:
        train(model, mon, before_step=lambda s: box.__setitem__(0, s))
    assert (err.value.event.step, err.value.event.module) == (3, "blocks.1.fc1")
    assert "step 3" in str(err.value) and "blocks.1.fc1 (Linear)" in str(err.value)
    assert all(not m._forward_hooks for m in model.modules() if m is not model.blocks[1].fc1)
    with pytest.warns(RuntimeWarning, match=r"step 3 in forward: produced by blocks\.1\.fc1"):
        train(model, monitor(model, on_nonfinite="warn"), before_step=lambda s: box.__setitem__(0, s))


def test_eval_forward_without_grad_is_checked_and_does_not_advance_the_step():
    torch.manual_seed(0)
    model = Net()
    mon = monitor(model)
    model(torch.randn(2, 8)).sum().backward()            # step 0
    model.eval()
    with torch.no_grad():
        x = torch.randn(2, 8)
        x[1, 3] = float("inf")
        model(x)
    ev = mon.close().first
    assert (ev.step, ev.phase, ev.cause, ev.module) == (0, "forward", "input", "emb")


def test_norms_only_is_coarser():
    torch.manual_seed(0)
    model, box = Net(), [None]
    nan_output_at(model.blocks[1].fc1, box, NAN_STEP)
    mon = monitor(model, modules="norms")
    assert mon.paths == ["", "blocks.0.ln", "blocks.1.ln", "blocks.2.ln", "ln_f"]
    ev = train(model, mon, before_step=lambda s: box.__setitem__(0, s)).first
    assert (ev.step, ev.module, ev.class_name, ev.first_norm) == (3, "", "Net", "blocks.2.ln")


def test_in_place_updates_of_module_outputs_still_train():
    """The reason for tensor hooks over full backward hooks: torchvision-style ``out += identity`` and
    ``ReLU(inplace=True)`` must keep working under the monitor."""

    class Res(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.bn = nn.BatchNorm2d(3)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            out = self.bn(self.conv(x))
            out += x
            return self.relu(out)

    torch.manual_seed(0)
    model = Res()
    mon = monitor(model)
    for step in range(3):
        x = torch.randn(2, 3, 8, 8)
        if step == 2:
            x[0, 0, 0, 0] = float("nan")
        model(x).mean().backward()
    report = mon.close()
    assert [(e.step, e.cause, e.module) for e in report.events] == [(2, "input", "conv")]
    assert mon.kinds == {"bn": "BatchNorm"}


def test_close_removes_every_hook_and_the_report_is_json():
    torch.manual_seed(0)
    model, box = Net(), [None]
    with monitor(model) as mon:
        assert model.blocks[0].fc1._forward_hooks
        box[0] = 0
        x = torch.randn(2, 8)
        x[0, 0] = float("nan")
        model(x).sum().backward()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    data = json.loads(mon.report.model_dump_json())
    assert data["events"][0]["module"] == "emb" and data["events"][0]["output_absmax"] == "NaN"


def test_norm_kinds_by_class_as_the_module_walk():
    class LlamaRMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(4))

    model = nn.Sequential(nn.Linear(4, 4), nn.GroupNorm(2, 4), LlamaRMSNorm())
    assert norm_kinds(model) == {"1": "GroupNorm", "2": "RMSNorm"}


@pytest.mark.parametrize("kwargs, message", [({"modules": "some"}, "modules must be"),
                                             ({"every": 0}, "every must be"),
                                             ({"on_nonfinite": "stop"}, "on_nonfinite must be")])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Monitor(nn.Linear(2, 2), **kwargs)


def test_lazy_attribute_keeps_import_normaudit_free_of_torch():
    code = ("import sys, normaudit; assert 'torch' not in sys.modules, 'eager torch'; "
            "from normaudit import monitor; assert 'torch' in sys.modules; print(monitor.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "normaudit.probes.monitor"
    assert normaudit.monitor is monitor
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        normaudit.nope


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_reruns_are_not_mistaken_for_producers(reentrant):
    """torch.utils.checkpoint re-runs each block's forward inside backward (its module hooks fire again)."""

    class CheckpointedNet(Net):
        def forward(self, x):
            h = self.emb(x)
            for b in self.blocks:
                h = torch.utils.checkpoint.checkpoint(b, h, use_reentrant=reentrant)
            return self.head(self.ln_f(h))

    torch.manual_seed(0)
    model, box = CheckpointedNet(), [None]
    nan_output_at(model.blocks[1].fc1, box, NAN_STEP)
    report = train(model, monitor(model), before_step=lambda s: box.__setitem__(0, s))
    assert [(e.step, e.phase, e.module) for e in report.events] == [(3, "forward", "blocks.1.fc1")]
    assert report.first.first_norm == "blocks.2.ln"


def test_a_parameter_passed_to_a_module_keeps_no_hook_across_steps():
    """Hooks on a leaf tensor (here a parameter given to a module as its input) outlive the step unless
    removed; the monitor removes them when it reads the step."""

    class PosNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.randn(4, 8))
            self.drop = nn.Dropout(0.0)
            self.fc = nn.Linear(8, 1)

        def forward(self, x):
            return self.fc(x + self.drop(self.pos))

    torch.manual_seed(0)
    model = PosNet()
    report = train(model, monitor(model), steps=3)
    assert report.events == [] and report.forwards_checked == 3
    assert not model.pos._backward_hooks


def _inf_weight_net() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 1))
    with torch.no_grad():
        model[0].weight[0, 0] = float("inf")
    return model


def test_warning_points_at_the_users_forward_or_backward_line_not_into_torch():
    import inspect

    model = _inf_weight_net()
    with monitor(model, on_nonfinite="warn"), pytest.warns(RuntimeWarning) as caught:
        out = model(torch.randn(4, 8))
        line_backward = inspect.currentframe().f_lineno + 1
        out.mean().backward()                                  # the step's host read: the warning comes here
        with torch.no_grad():
            line_forward = inspect.currentframe().f_lineno + 1
            model(torch.randn(4, 8))                           # no backward can follow: read at forward's end
    assert [(Path(w.filename).resolve(), w.lineno) for w in caught] == [
        (Path(__file__).resolve(), line_backward), (Path(__file__).resolve(), line_forward)]
    assert "step 0 in forward: produced by non-finite weights of 0 (Linear)" in str(caught[0].message)


def test_raise_comes_from_backward_when_one_follows_else_from_the_forward_call():
    model = _inf_weight_net()
    with monitor(model, on_nonfinite="raise") as mon:
        out = model(torch.randn(4, 8))                         # grad enabled: checked at the end of backward
        assert mon.events == []
        with pytest.raises(NonFiniteError) as err:
            out.mean().backward()
        assert (err.value.event.step, err.value.event.phase, err.value.event.module) == (0, "forward", "0")
        with torch.no_grad(), pytest.raises(NonFiniteError) as err:
            model(torch.randn(4, 8))                           # no backward can follow: raised by the call
        assert (err.value.event.step, err.value.event.module) == (1, "0")
