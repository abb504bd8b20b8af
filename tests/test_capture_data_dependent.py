"""Capture of forwards whose sizes are computed from integer inputs: a
vision tower's ``cu_seqlens`` from ``grid_thw`` (``repeat_interleave``, ``cumsum``, ``.tolist()`` split
sizes), window indices from ``torch.arange`` mixed with the grid, a ``torch.distributions`` argument check on
the values of an activation, and a model whose training-mode forward refuses to run without labels, so
that its parts are recorded in eval mode. Each is a small hand-written model reproducing the mechanism of
the transformers models named in its docstring."""
from __future__ import annotations

import torch
from torch import nn

from conftest import _Block, audit_model, site
from normaudit.capture import capture_model


class PatchTower(nn.Module):
    """A Qwen2-VL-style vision tower: ``cu_seqlens`` computed from ``grid_thw`` by tensor ops, then per-image
    chunks split by ``lengths.tolist()``; each chunk gets the blocks, and a merger norm closes it. On fake
    tensors ``repeat_interleave`` has a data-dependent length and the split sizes are unbacked symbols."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.embed = nn.Linear(6, d)
        self.blocks = nn.ModuleList([_Block(d) for _ in range(2)])
        self.merger_norm = nn.RMSNorm(d, eps=1e-5)

    def forward(self, patches, grid_thw):
        x = self.embed(patches)
        cu = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0]).cumsum(0)
        cu = nn.functional.pad(cu, (1, 0))
        lengths = (cu[1:] - cu[:-1]).tolist()
        chunks = []
        for chunk in torch.split(x, lengths, dim=0):
            for block in self.blocks:
                chunk = block(chunk)
            chunks.append(chunk)
        return self.merger_norm(torch.cat(chunks))


GRID = torch.tensor([[1, 2, 2], [1, 2, 3]])  # 4 + 6 patches


def test_sizes_computed_from_integer_inputs_are_constants():
    cap = capture_model(PatchTower(), (torch.randn(10, 6), GRID), on_meta=False, methods=("export",),
                        parts_fallback=False)
    assert [(a.method, a.ok) for a in cap.attempts] == [
        ("export", False), ("export (integer inputs as constants)", True)]
    assert "GuardOnDataDependentSymNode" in cap.attempts[0].error
    splits = [n.args[1] for n in cap.gm.graph.nodes if n.target == torch.ops.aten.split_with_sizes.default]
    assert splits == [[4, 6]]  # the real lengths, computed from the grid on the way
    norms = [tuple(n.meta["val"].shape) for n in cap.gm.graph.nodes if "layer_norm" in str(n.target)]
    assert norms == [(4, 8), (4, 8), (6, 8), (6, 8)]


def test_whole_tower_captured_with_every_fact(rules):
    report = audit_model(PatchTower(), (torch.randn(10, 6), GRID), rules=rules)
    assert report.capture.complete and report.capture.method == "export"
    assert [(s.module, s.call_index) for s in report.sites] == [
        ("blocks.0.norm", 0), ("blocks.1.norm", 0), ("blocks.0.norm", 1), ("blocks.1.norm", 1),
        ("merger_norm", 0)]
    for path, kind, eps in (("blocks.0.norm", "LayerNorm", 1e-6), ("merger_norm", "RMSNorm", 1e-5)):
        s = site(report, path)
        assert (s.kind, s.eps, s.normalized_axes, s.detected_by) == (kind, eps, ["feature"], "module")
    assert site(report, "blocks.1.norm").placement == "pre"
    assert report.capture.unaudited == []


class WindowTower(nn.Module):
    """A Qwen2.5-VL/EXAONE-4.5-style window index: ``torch.arange`` over each image's merged grid, padded to
    whole windows, and the window lengths read back with ``.tolist()``. The factory is not an input: its
    values, mixed with the grid's, must be constants too."""

    def __init__(self, d: int = 8, window: int = 2):
        super().__init__()
        self.window = window
        self.embed = nn.Linear(6, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, patches, grid_thw):
        x = self.embed(patches)
        sizes = []
        for t, h, w in grid_thw.tolist():
            index = torch.arange(t * h * w).reshape(t, h, w)
            pad_w = (self.window - w % self.window) % self.window
            index = nn.functional.pad(index, (0, pad_w), "constant", -100)
            per_window = (index.reshape(t, h, -1, self.window) != -100).sum([0, 1, 3])
            sizes += per_window.tolist()
        return torch.cat([self.norm(c) for c in torch.split(x, sizes, dim=0)])


def test_factories_mixed_with_integer_inputs_are_constants(rules):
    report = audit_model(WindowTower(), (torch.randn(10, 6), GRID), rules=rules)
    assert report.capture.complete
    assert [a.method for a in report.capture.attempts][-1] == "export (integer inputs as constants)"
    # image 1: 2x2 -> one window of 4; image 2: 2x3 padded to 2x4 -> windows of 4 and 2
    assert [(s.module, s.call_index, s.input_shape) for s in report.sites] == [
        ("norm", 0, [4, 8]), ("norm", 1, [4, 8]), ("norm", 2, [2, 8])]


class EntropyPatcher(nn.Module):
    """BLT's entropy patcher: a ``Categorical(logits=...)`` whose default argument validation checks the
    logits' values (a branch on data); the entropy itself is plain tensor arithmetic."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        logits = self.head(self.norm(self.proj(x)))
        return torch.distributions.Categorical(logits=logits).entropy()


def test_distribution_argument_checks_do_not_stop_the_capture(rules):
    assert torch.distributions.Distribution._validate_args  # on by default: the check reads the values
    report = audit_model(EntropyPatcher(), (torch.randn(2, 4, 8),), rules=rules)
    assert report.capture.complete and [a.ok for a in report.capture.attempts][-1]
    assert [(s.module, s.kind, s.normalized_axes) for s in report.sites] == [("norm", "LayerNorm", ["feature"])]
    assert torch.distributions.Distribution._validate_args  # restored after the capture


class NeedsLabelsToTrain(nn.Module):
    """FastSpeech2-Conformer-like: the training-mode forward demands labels; in eval mode it runs, but a
    length regulator branches on the sum of predicted durations (a value of the data), so no whole-model
    capture exists. Its encoder and decoder still get captured alone, on inputs recorded in eval mode."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.encoder = nn.Sequential(_Block(d), _Block(d))
        self.duration = nn.Linear(d, 1)
        self.decoder = nn.Sequential(_Block(d), nn.LayerNorm(d, eps=1e-3))

    def forward(self, x, labels=None):
        if self.training and labels is None:
            raise ValueError("All labels must be provided to run in training mode.")
        h = self.encoder(x)
        if self.duration(h).sum() == 0:  # data-dependent branch
            h = h * 2
        return self.decoder(h)


def test_parts_recorded_in_eval_mode_when_training_forward_refuses():
    from normaudit.capture.parts import covers_all

    model = NeedsLabelsToTrain()
    assert model.training
    cap = capture_model(model, (torch.randn(2, 5, 8),), on_meta=False)
    assert not cap.complete and covers_all(cap)
    assert [a.method for a in cap.attempts] == ["symbolic_trace", "export", "symbolic_trace (eval)",
                                               "export (eval)", "export (integer factories as constants) (eval)"]
    assert [(p.path, type(p.capture.root).__name__, p.inputs, p.capture.method) for p in cap.parts] == [
        ("encoder", "Sequential", ["arg0: float32[2, 5, 8]"], "symbolic_trace"),
        ("decoder", "Sequential", ["arg0: float32[2, 5, 8]"], "symbolic_trace")]
    norms = {p.path: [n.target for n in p.capture.gm.graph.nodes if n.op == "call_module"
                      and isinstance(p.capture.modules[n.target], nn.LayerNorm)] for p in cap.parts}
    assert norms == {"encoder": ["0.norm", "1.norm"], "decoder": ["0.norm", "1"]}
    assert all(m.training for m in cap.root.modules())  # the modes are restored after the eval record


class _Cfg:
    use_cache = True


class _Inner(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x, use_cache=None, **kwargs):
        return self.norm(x)


class PassesOwnUseCache(nn.Module):
    """Mimi's encoder: a config with ``use_cache``, a forward taking ``**kwargs`` that hands them on to a
    child together with its own ``use_cache=``; the capture's injected ``use_cache=False`` would collide."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.config = _Cfg()
        self.inner = _Inner(d)

    def forward(self, x, **kwargs):
        return self.inner(x, use_cache=False, **kwargs)


def test_injected_use_cache_never_collides_with_the_forwards_own():
    cap = capture_model(PassesOwnUseCache(), {"x": torch.randn(2, 3, 8)}, on_meta=False, parts_fallback=False)
    assert cap.complete and [(a.method, a.ok) for a in cap.attempts] == [("export", True)]
    assert [n.meta["nn_module_stack"].popitem()[1][0] for n in cap.gm.graph.nodes
            if "layer_norm" in str(n.target)] == ["m.inner.norm"]


def test_long_errors_keep_their_end():
    from normaudit.capture.errors import one_line

    text = one_line(TypeError(repr(nn.Sequential(*[nn.Linear(4, 4) for _ in range(20)]))
                               + " got multiple values for keyword argument 'use_cache'"))
    assert text.startswith("TypeError: Sequential( (0): Linear(") and len(text) < 320
    assert text.endswith("got multiple values for keyword argument 'use_cache'")


class ChunkedAudio(nn.Module):
    """Qwen3-ASR's audio chunks: per-example lengths after a stride-2 conv, cut into windows of ``window``
    frames, the boundaries built with ``torch.tensor`` from a list holding one-element tensors (rows of the
    lengths), then ``cumsum`` and ``.tolist()`` split sizes."""

    def __init__(self, d: int = 8, window: int = 3):
        super().__init__()
        self.window = window
        self.proj = nn.Linear(4, d)
        self.norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, frames, lengths):
        x = self.proj(frames)
        chunks = [0]
        for n in (lengths - 1) // 2 + 1:
            chunks += [self.window] * int(n // self.window)
            if n % self.window != 0:
                chunks += [n % self.window]
        cu = torch.tensor(chunks).cumsum(-1)
        return torch.cat([self.norm(c) for c in torch.split(x, (cu[1:] - cu[:-1]).tolist(), dim=0)])


def test_tensor_from_a_list_of_constant_elements():
    lengths = torch.tensor([9, 4])  # -> 5 and 2 frames: windows 3+2 and 2
    cap = capture_model(ChunkedAudio(), (torch.randn(7, 4), lengths), on_meta=False, methods=("export",),
                        parts_fallback=False)
    assert [(a.method, a.ok) for a in cap.attempts] == [
        ("export", False), ("export (integer inputs as constants)", True)]
    assert [tuple(n.meta["val"].shape) for n in cap.gm.graph.nodes if "layer_norm" in str(n.target)] == [
        (3, 8), (2, 8), (2, 8)]
    assert len(cap.user_inputs) == 2  # frames and the lifted lengths; constants made inside are not inputs


def test_factory_constants_are_not_model_inputs():
    cap = capture_model(WindowTower(), (torch.randn(10, 6), GRID), on_meta=False, methods=("export",),
                        parts_fallback=False)
    assert cap.complete and len(cap.user_inputs) == 2
    placeholders = [n.name for n in cap.gm.graph.nodes if n.op == "placeholder"]
    assert sum("lifted_tensor" in p for p in placeholders) > 1  # the aranges, lifted, are in the graph
