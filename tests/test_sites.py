"""Site discovery on both graph flavours: built-in modules, functional calls, hand-written norms, and the
module-walk fallback when nothing captures."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import CASES, audit_model, site
from normaudit.capture import capture_model
from normaudit.facts.context import FactContext
from normaudit.pipeline import collect_facts


class AllBuiltins(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, eps=1e-3)
        self.gn = nn.GroupNorm(2, 8, eps=1e-4)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.lrn = nn.LocalResponseNorm(3)
        self.ln = nn.LayerNorm(8, eps=1e-6)
        self.rms = nn.RMSNorm(8, eps=1e-7)
        self.bn1 = nn.BatchNorm1d(8)

    def forward(self, x):
        y = self.lrn(self.inorm(self.gn(self.bn(self.conv(x)))))
        y = y.mean((2, 3))
        return self.bn1(self.rms(self.ln(y)))


EXPECTED_BUILTINS = [
    ("bn", "BatchNorm", 1e-3, ["batch", "height", "width"]),
    ("gn", "GroupNorm", 1e-4, ["channel", "height", "width"]),
    ("inorm", "InstanceNorm", 1e-5, ["height", "width"]),
    ("lrn", "LocalResponseNorm", None, ["channel"]),
    ("ln", "LayerNorm", 1e-6, ["channel"]),
    ("rms", "RMSNorm", 1e-7, ["channel"]),
    ("bn1", "BatchNorm", 1e-5, ["batch"]),
]


def _facts(model, inputs, methods):
    cap = capture_model(copy.deepcopy(model), inputs, on_meta=False, methods=methods)
    assert cap.method == methods[0], cap.attempts
    return cap, collect_facts(FactContext(cap=cap)).records


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_builtin_norm_modules(method):
    _, records = _facts(AllBuiltins(), (torch.randn(2, 3, 16, 16),), (method,))
    got = [(r.site.module, r.site.kind, r.site.eps, r.site.normalized_axes) for r in records]
    assert got == EXPECTED_BUILTINS
    gn = next(r.site for r in records if r.site.module == "gn")
    assert (gn.num_groups, gn.num_channels, gn.affine_weight) == (2, 8, True)
    bn = next(r.site for r in records if r.site.module == "bn")
    assert (bn.training, bn.track_running_stats, bn.reduced_dims) == (True, True, [0, 2, 3])


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.weight = nn.Parameter(torch.ones(16))

    def forward(self, x):
        h = F.layer_norm(self.proj(x), (16,), self.weight, None, 1e-8)
        return F.group_norm(h.transpose(1, 2), 4, eps=1e-3)


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_functional_calls_belong_to_the_calling_module(method):
    _, records = _facts(Functional(), (torch.randn(2, 5, 16),), (method,))
    got = [(r.site.module, r.site.kind, r.site.detected_by, r.site.eps, r.site.affine_weight, r.site.affine_bias,
            r.site.call_index) for r in records]
    assert got == [("", "LayerNorm", "functional", 1e-8, True, False, 0),
                   ("", "GroupNorm", "functional", 1e-3, False, False, 1)]
    assert records[0].site.normalized_axes == ["feature"]
    assert records[1].site.num_groups == 4


class HandLN(nn.Module):
    """Population variance, eps inside the sqrt (Ba et al. 2016 eq. 3-4)."""

    def __init__(self, d):
        super().__init__()
        self.g, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True, unbiased=False)
        return (x - mu) / torch.sqrt(var + 1e-5) * self.g + self.b


class GemmaStyle(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        x32 = x.float()
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (out * (1.0 + self.weight.float())).type_as(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = HandLN(16)
        self.b = GemmaStyle(16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.b(self.fc(self.a(x)))


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_hand_written_norms_by_computation(method):
    _, records = _facts(Net(), (torch.randn(2, 7, 16),), (method,))
    got = [(r.site.module, r.site.kind, r.site.class_name, r.site.detected_by, r.site.eps, r.site.normalized_shape,
            r.site.normalized_axes) for r in records]
    assert got == [("a", "LayerNorm", "HandLN", "pattern", 1e-5, [16], ["feature"]),
                   ("b", "RMSNorm", "GemmaStyle", "pattern", 1e-6, [16], ["feature"])]
    assert records[0].hints["variance"] == "population"


def test_attention_scaling_and_softmax_are_not_norms():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = q @ k.transpose(-2, -1) / torch.sqrt(torch.tensor(16.0))
            return torch.softmax(scores, -1) @ v

    r = audit_model(Attn(), (torch.randn(2, 5, 16),))
    assert r.sites == []


def test_uncapturable_model_falls_back_to_module_walk():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8, eps=1e-3)
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            # data-dependent control flow: neither tracer can follow it; never taken on the example inputs, so
            # the capture by parts (one real forward) does not reach the norm either (deterministic)
            if x.sum() > 1e9:
                return self.norm(self.fc(x))
            return self.fc(x)

    r = audit_model(DataDependent(), (torch.randn(2, 8),))
    assert r.capture.method == "module_walk" and r.capture.complete is False
    lifted = "export (integer factories as constants)"  # the retry after a data-dependent export failure
    assert [a.method for a in r.capture.attempts] == ["symbolic_trace", "export", lifted, "symbolic_trace (eval)",
                                                      "export (eval)", f"{lifted} (eval)"]
    assert [(s.module, s.kind, s.eps, s.detected_by) for s in r.sites] == [("norm", "LayerNorm", 1e-3, "module_walk")]
    assert any("capture failed" in n for n in r.notes)
    nk = [(f.rule_id, f.severity, f.module) for f in r.findings if f.rule_id == "NK101"]
    assert nk == [("NK101", "warning", "")]
    assert "could not be captured" in next(f.message for f in r.findings if f.rule_id == "NK101")
    captured = audit_model(nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)), (torch.randn(2, 8),))
    assert [f.rule_id for f in captured.findings if f.rule_id == "NK101"] == []


def test_capture_does_not_touch_the_callers_model():
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    audit_model(model, (torch.randn(2, 7, 16),))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(type(p).__name__ == "FakeTensor" for p in model.parameters())


def test_symbolic_trace_and_export_agree_on_reference_cases(rules):
    import importlib.util

    for name in ("N01_seq_rmsnorm", "N05_convnext_control", "N23_unbiased_std_ln", "N26_t5_rms_control"):
        spec = importlib.util.spec_from_file_location(f"case_{name}", CASES / name / "model.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        model, inputs = mod.build_model(), mod.example_inputs()
        per_method = []
        for method in ("symbolic_trace", "export"):
            _, records = _facts(model, inputs, (method,))
            per_method.append([(r.site.module, r.site.kind, r.site.eps, r.site.normalized_axes, r.site.reduced_dims)
                               for r in records])
        assert per_method[0] == per_method[1], name


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_functional_normalized_shape_from_input_size(method):
    class SizeFromInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            h = self.fc(x)
            return F.layer_norm(h, (h.shape[-1],))

    _, records = _facts(SizeFromInput(), (torch.randn(2, 3, 8),), (method,))
    assert [(r.site.kind, r.site.normalized_shape, r.site.reduced_dims, r.site.normalized_axes) for r in records] == [
        ("LayerNorm", [8], [2], ["feature"])]


def test_eval_fallback_keeps_modules_the_user_froze(capfd):
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 8), nn.BatchNorm1d(8))
    model[3].eval()  # frozen by the user; model[1] still trains and raises at batch 1
    r = audit_model(model, (torch.randn(1, 4),))
    assert r.capture.complete and r.capture.method == "symbolic_trace"
    assert [a.method for a in r.capture.attempts][-1] == "symbolic_trace (eval)"
    assert [(s.module, s.training) for s in r.sites] == [("1", True), ("3", False)]
    assert model.training and not model[3].training
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_source_is_the_constructor_of_a_norm_module_and_the_call_of_a_functional_norm(tmp_path, method, monkeypatch):
    from conftest import audit_file

    path = tmp_path / "m.py"
    path.write_text(
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from torch import nn\n"
        "class RMS(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.weight = nn.Parameter(torch.ones(8))\n"
        "    def forward(self, x):\n"
        "        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.norm = RMS()\n"                                  # line 13: constructs
        "        self.fc = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        h = self.norm(x)\n"                                   # line 16: calls
        "        return F.layer_norm(self.fc(h), (8,))\n"              # line 17: functional call
        "def build_model():\n"
        "    return Block()\n"
        "def example_inputs():\n"
        "    return (torch.randn(2, 3, 8),)\n")
    import functools

    import normaudit.audit

    monkeypatch.setattr(normaudit.audit, "capture_model", functools.partial(capture_model, methods=(method,)))
    r = audit_file(path)
    assert r.capture.method == method
    lines = [(s.module, s.detected_by, s.source.line, s.definition.line if s.definition else None, s.call.line)
             for s in r.sites]
    assert lines == [("norm", "pattern", 13, 13, 16), ("", "functional", 17, None, 17)]


class VarMeanLN(nn.Module):
    """torch.var_mean returns a tuple: the variance reaches rsqrt through ``getitem``."""

    def __init__(self, d, dim=-1):
        super().__init__()
        self.w, self.b, self.dim = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), dim

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=self.dim, keepdim=True, correction=0)
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.w + self.b


class LucidrainsRMS(nn.Module):
    """F.normalize(x) * sqrt(d) * g: x / max(||x||_2, eps) rescaled, i.e. an RMSNorm."""

    def __init__(self, d):
        super().__init__()
        self.scale, self.gamma = d ** 0.5, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class ClampRMS(nn.Module):
    def __init__(self, d, eps=1e-8):
        super().__init__()
        self.scale, self.eps, self.g = d ** -0.5, eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x / (torch.norm(x, dim=-1, keepdim=True) * self.scale).clamp(min=self.eps) * self.g


class NormZoo(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.a, self.b, self.c = VarMeanLN(d), LucidrainsRMS(d), ClampRMS(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x):
        return self.c(self.fc(self.b(self.a(x))))


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_var_mean_normalize_and_clamped_norm_are_recognised(method):
    _, records = _facts(NormZoo(), (torch.randn(2, 7, 16),), (method,))
    got = [(r.site.module, r.site.kind, r.site.detected_by, r.site.eps, r.site.reduced_dims, r.site.normalized_shape,
            r.site.normalized_axes) for r in records]
    assert got == [("a", "LayerNorm", "pattern", 1e-5, [2], [16], ["feature"]),
                   ("b", "RMSNorm", "pattern", 1e-12, [2], [16], ["feature"]),
                   ("c", "RMSNorm", "pattern", 1e-8, [2], [16], ["feature"])]
    assert records[0].hints["variance"] == "population"
    assert [r.hints["how_eps"] for r in records] == ["inside_sqrt", "clamp", "clamp"]
    assert all(r.site.affine_weight for r in records)


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_var_mean_over_sequence_and_feature(method):
    class Net2(nn.Module):
        def __init__(self):
            super().__init__()
            self.n = VarMeanLN(16, dim=(1, 2))
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            return self.fc(self.n(x))

    _, records = _facts(Net2(), (torch.randn(2, 7, 16),), (method,))
    assert [(r.site.module, r.site.kind, r.site.reduced_dims, r.site.normalized_axes) for r in records] == [
        ("n", "LayerNorm", [1, 2], ["sequence", "feature"])]


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_cosine_similarity_normalisations_are_l2norm_sites(method):
    """``F.normalize`` and ``x / ||x||.clamp(min=eps)`` outside a norm module are L2Norm sites over their dim,
    with their eps and no gain (PyTorch docs, torch.nn.functional.normalize: eps default 1e-12)."""
    class Retriever(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            q = F.normalize(self.q(x), dim=-1)
            k = self.k(x)
            k = k / torch.norm(k, dim=-1, keepdim=True).clamp(min=1e-6)
            return q @ k.transpose(-2, -1)

    _, records = _facts(Retriever(), (torch.randn(2, 7, 16),), (method,))
    assert [(r.site.module, r.site.call_index, r.site.kind, r.site.eps, r.site.reduced_dims, r.site.normalized_axes,
             r.site.affine_weight, r.site.formula.gain) for r in records] == [
        ("", 0, "L2Norm", 1e-12, [2], ["feature"], None, "none"),
        ("", 1, "L2Norm", 1e-6, [2], ["feature"], None, "none")]
    assert [r.hints["how_eps"] for r in records] == ["clamp", "clamp"]
