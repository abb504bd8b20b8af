"""Deeper detection: the facts behind the norm bugs public bug reports found and normaudit missed.

Each class has its facts asserted here on small in-memory models (exact modules and values); the rules over
them are checked against their fixtures (tests/fixtures/<family>/<ID>_<n>.py) by tests/test_rule_fixtures.py.

- the eps an ``eps=None`` RMSNorm really uses, in ``site.eps`` (torch.nn.RMSNorm docs);
- norm modules registered but never applied (``model.unused_norms``);
- hand-written GroupNorm recognised by its computation (``kind``, ``num_groups``, ``group_split``);
- frozen BatchNorms that ``model.train()`` unfreezes (``site.freeze``);
- per-module gain convention against the checkpoint, shape mismatches (``site.weights``);
- casts around the norm (``site.output_dtype``, ``site.formula.cast``).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import audit_file, audit_model, family_rules, load_fixture_module, site

FIXTURES = Path(__file__).parent / "fixtures"


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
    assert default.eps_default == "torch.finfo(input dtype).eps"
    assert (functional.detected_by, functional.eps) == ("functional", eps)
    assert given.eps == 1e-6 and given.eps_default is None
    assert default.eps_facts.effective == eps
    # the constructor quoted as written: no eps argument for the default one
    assert default.describe() == "nn.RMSNorm(normalized_shape=[16])"


# -- registered but never applied ---------------------------------------------------------------------------
PLACEMENT = FIXTURES / "placement"


def test_unused_final_norm_is_named_with_its_checkpoint_keys(tmp_path):
    """nanoGPT without ln_f in forward: the unused norm by name, its keys in the checkpoint, NP101's fix."""
    from safetensors.torch import save_file

    spec = load_fixture_module(PLACEMENT / "NP107_1.py")
    ckpt = tmp_path / "gpt.safetensors"
    save_file({k: v.contiguous() for k, v in spec.build_model().state_dict().items()}, str(ckpt))
    r = audit_file(PLACEMENT / "NP107_1.py", family_rules("placement"), checkpoint=str(ckpt))
    (unused,) = r.model.unused_norms
    assert (unused.module, unused.class_name, unused.kind) == ("transformer.ln_f", "LayerNorm", "LayerNorm")
    assert unused.keys == ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    assert unused.checkpoint_keys == ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    assert (Path(unused.source.file).name, unused.source.line) == ("NP107_1.py", 13)
    (np107,) = [f for f in r.findings if f.rule_id == "NP107"]
    assert "the checkpoint holds its weights (transformer.ln_f.weight, transformer.ln_f.bias)" in np107.message
    (np101,) = [f for f in r.findings if f.rule_id == "NP101"]
    assert np101.fix.startswith("apply `transformer.ln_f`, the norm the model registers but never applies, to the "
                                "stream before lm_head")
    assert any("registered but never applied by the forward: transformer.ln_f" in n for n in r.notes)


def test_np101_fix_without_an_unused_norm_still_says_add():
    r = audit_file(PLACEMENT / "NP101_1.py", family_rules("placement"))
    (np101,) = [f for f in r.findings if f.rule_id == "NP101"]
    assert r.model.unused_norms == [] and np101.fix.startswith("add a final norm after the last block")


def test_unreached_tower_is_no_unused_norm():
    r = audit_file(PLACEMENT / "NP107_3.py", family_rules("placement"))
    assert r.model.unused_norms == []
    assert "vision.post_layernorm" in {u.module for u in r.capture.unaudited} | {s.module for s in r.sites}


# -- hand-written GroupNorm ---------------------------------------------------------------------------------
LAYOUT = FIXTURES / "layout"


def _split(s):
    g = s.group_split
    return (g.groups, g.dim, g.per_group, g.spans, g.channel_dim)


def test_hand_written_group_norms_are_group_norms_with_their_group_count():
    r = audit_file(LAYOUT / "NL107_2.py", family_rules("layout"))
    flat, five, nhwc = site(r, "flat"), site(r, "five_d"), site(r, "nhwc")
    for s, groups in ((flat, 4), (five, 8), (nhwc, 8)):
        assert (s.kind, s.num_groups, s.num_channels, s.detected_by) == ("GroupNorm", groups, 32, "pattern"), s.module
        assert s.reduced_dims == [1, 2, 3] and s.normalized_shape is None
        assert (s.formula.mean_subtracted, s.formula.variance, s.formula.gain, s.formula.bias) == (
            True, "population", "weight", True)
        assert s.channel_axes == ["channel"]
    assert (flat.eps, five.eps, nhwc.eps) == (1e-5, 1e-6, 1e-5)
    assert _split(flat) == (4, 1, 8, [1, 2, 3], 1)
    assert _split(five) == (8, 1, 4, [1, 2, 3], 1)
    assert _split(nhwc) == (8, 3, 4, [1, 2, 3], 3)        # channels-last: the channel dim is grouped in place
    assert nhwc.input_axes == ["batch", "height", "width", "channel"]


def test_channels_last_reshape_groups_rows_and_the_finding_names_them():
    r = audit_file(LAYOUT / "NL107_1.py", family_rules("layout"))
    bad = site(r, "norm_nhwc")
    assert (bad.kind, bad.num_groups, bad.num_channels) == ("GroupNorm", 8, 32)
    assert _split(bad) == (8, 1, 2, [1, 2, 3], 3)         # the groups split height into bands of 2 rows
    (f,) = [f for f in r.findings if f.rule_id == "NL107"]
    assert f.severity == "error" and f.module == "norm_nhwc" and f.source.line == 41
    assert ("into 8 groups along dim 1, which is height: each group holds 2 of the 16 height positions and all "
            "of (width, channel)") in f.message


# -- frozen BatchNorm that model.train() unfreezes ----------------------------------------------------------
BATCHNORM = FIXTURES / "batchnorm"


def _freeze(s):
    z = s.freeze
    return (z.params_frozen, z.eval_as_built, z.model_trainable, z.after_train, z.train_override)


def test_frozen_batchnorm_without_train_override_is_unfrozen_by_train():
    r = audit_file(BATCHNORM / "NB109_1.py", family_rules("batchnorm"))
    assert _freeze(site(r, "backbone.bn1")) == (True, True, True, True, [])
    assert _freeze(site(r, "head_bn")) == (False, False, True, True, [])
    assert site(r, "backbone.bn1").training is False      # the capture keeps the modes as built
    (f, _) = sorted((f for f in r.findings if f.rule_id == "NB109"), key=lambda f: f.module)
    assert f.module == "backbone.bn1" and f.severity == "warning"
    assert "model.train() puts it back in training mode (no train() override keeps it in eval)" in f.message


def test_norm_eval_override_and_a_fully_frozen_model_are_not_flagged():
    rules = family_rules("batchnorm")
    r = audit_file(BATCHNORM / "NB109_2.py", rules)
    assert _freeze(site(r, "backbone.bn2")) == (True, True, True, False, ["Backbone.train"])
    assert _freeze(site(r, "stats_bn")) == (True, False, True, True, ["Backbone.train"])
    teacher = audit_file(f"{BATCHNORM / 'NB109_2.py'}:teacher", rules)
    assert _freeze(site(teacher, "backbone.bn1")) == (True, True, False, False, ["Backbone.train"])
    assert _freeze(site(teacher, "stats_bn")) == (True, True, False, True, ["Backbone.train"])
    assert not [f for f in teacher.findings if f.rule_id == "NB109"]


# -- gain conventions against the checkpoint, shapes --------------------------------------------------------
CHECKPOINT = FIXTURES / "checkpoint"


def test_gain_centre_per_module_against_the_graph_convention(tmp_path):
    """Every site: its gain form from the graph, its checkpoint centre; the final norm is the odd one out."""
    from test_rule_fixtures import audit_fixture

    report, _ = audit_fixture(CHECKPOINT / "NC108_1.py", family_rules("checkpoint"), tmp_path)
    got = {s.module: (s.formula.gain, s.weights.gain_centre) for s in report.sites}
    assert got == {"layers.0.input_layernorm": ("one_plus_weight", "zero"),
                   "layers.0.post_attention_layernorm": ("one_plus_weight", "zero"),
                   "layers.1.input_layernorm": ("one_plus_weight", "zero"),
                   "layers.1.post_attention_layernorm": ("one_plus_weight", "zero"),
                   "norm": ("one_plus_weight", "one")}
    # the per-module rule says what the doubled offset does; the model-level one that the file mixes centres
    assert {(f.rule_id, f.module) for f in report.findings} == {("NC102", "norm"), ("NC108", "norm")}


def test_checkpoint_alone_with_two_centres_is_info(tmp_path):
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    sd = {f"layers.{i}.input_layernorm.weight": torch.randn(16, generator=gen) * 0.05 for i in range(3)}
    sd["norm.weight"] = 1 + torch.randn(16, generator=gen) * 0.05
    save_file(sd, str(tmp_path / "w.safetensors"))
    r = audit_file(tmp_path / "w.safetensors", family_rules("checkpoint"))
    assert {s.module: s.weights.gain_centre for s in r.sites} == {
        "layers.0.input_layernorm": "zero", "layers.1.input_layernorm": "zero", "layers.2.input_layernorm": "zero",
        "norm": "one"}
    (f,) = [f for f in r.findings if f.rule_id == "NC108"]
    assert (f.module, f.severity) == ("norm", "info")


def test_k_norm_sized_like_q_norm_is_a_shape_mismatch(tmp_path):
    from test_rule_fixtures import audit_fixture

    report, _ = audit_fixture(CHECKPOINT / "NC109_1.py", family_rules("checkpoint"), tmp_path)
    (m,) = site(report, "k_norm").weights.shape_mismatch
    assert (m.key, m.checkpoint_key, m.model_shape, m.checkpoint_shape) == ("k_norm.weight", "k_norm.weight", [32], [8])
    assert site(report, "q_norm").weights.shape_mismatch == []


# -- casts around the norm ----------------------------------------------------------------------------------
NORM_TYPE = FIXTURES / "norm_type"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_output_dtype_and_where_the_cast_back_sits(dtype):
    r = audit_file(NORM_TYPE / "NT106_1.py", {}, dtype=dtype)
    got = {s.module: (s.input_dtype, s.output_dtype, s.formula.cast) for s in r.sites}
    wide = "float32" if dtype == "bfloat16" else dtype
    assert got == {"llama": (dtype, dtype, "before_gain"), "gemma": (dtype, dtype, "after_gain"),
                   "torch_rms": (dtype, dtype, None), "fp32_gain": (dtype, wide, "before_gain"),
                   "no_cast_back": (dtype, wide, "none")}


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_called_modules_on_both_graph_flavours(method):
    from normaudit.capture import capture_model
    from normaudit.facts.usage import called_modules

    spec = load_fixture_module(PLACEMENT / "NP107_1.py")
    cap = capture_model(spec.build_model(), spec.example_inputs(), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    called = called_modules(cap.gm, cap.modules)
    assert {"", "transformer", "transformer.h.1.ln2", "lm_head"} <= called
    assert "transformer.ln_f" not in called


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_group_norms_on_both_graph_flavours(method):
    from normaudit.capture import capture_model
    from normaudit.facts.sites import discover_sites

    spec = load_fixture_module(LAYOUT / "NL107_2.py")
    cap = capture_model(spec.build_model(), spec.example_inputs(), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    got = {r.site.module: (r.site.kind, r.site.num_groups, r.site.group_split.dim, r.site.group_split.channel_dim)
           for r in discover_sites(cap)}
    assert got == {"flat": ("GroupNorm", 4, 1, 1), "five_d": ("GroupNorm", 8, 1, 1), "nhwc": ("GroupNorm", 8, 3, 3)}


class _GatedRMSNorm(nn.Module):
    """Mamba-2 / Qwen3-Next gated norm: rms_norm(x) * w * silu(gate); ``offset`` the (1 + w) variant."""

    def __init__(self, d: int, offset: bool):
        super().__init__()
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(d) if offset else torch.ones(d))

    def forward(self, x, gate):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        w = 1.0 + self.weight.float() if self.offset else self.weight.float()
        return (h * w * F.silu(gate.float())).type_as(x)


class _GatedBlock(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.in_proj = nn.Linear(d, 2 * d)
        self.norm = _GatedRMSNorm(d, offset=True)      # the port applies Gemma's offset to the gated norm
        self.plain = _GatedRMSNorm(d, offset=False)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x):
        h, gate = self.in_proj(x).chunk(2, dim=-1)
        return self.out_proj(self.plain(self.norm(h, gate), gate))


def test_offset_wrongly_applied_to_a_gated_norm_is_read_per_module(tmp_path):
    """The gated norm's convention comes from its own graph; its checkpoint gains (near 1) say plain weight."""
    from safetensors.torch import save_file

    model = _GatedBlock()
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    sd["norm.weight"] = 1 + torch.randn(16, generator=gen) * 0.05
    sd["plain.weight"] = 1 + torch.randn(16, generator=gen) * 0.05
    save_file(sd, str(tmp_path / "gated.safetensors"))
    r = audit_model(model, (torch.randn(2, 5, 16),), rules=family_rules("checkpoint"),
                    checkpoint=str(tmp_path / "gated.safetensors"))
    assert {s.module: (s.formula.gain, s.weights.gain_centre) for s in r.sites} == {
        "norm": ("one_plus_weight", "one"), "plain": ("weight", "one")}
    assert {(f.rule_id, f.module) for f in r.findings} == {("NC102", "norm")}


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_group_norms_over_a_grouped_view_and_their_affine(method):
    """A GroupNorm written over ``x.view(N, G, -1)`` (its statistics, F.layer_norm or F.instance_norm of the
    view) is a GroupNorm site over x, whatever computes the statistics; ``group_split.affine`` says whether its
    gain is one per group on the view (with the parameter's shape) or one per channel after the reshape back."""
    from normaudit.capture import capture_model
    from normaudit.facts.sites import discover_sites

    spec = load_fixture_module(BATCHNORM / "NB112_1.py")
    cap = capture_model(spec.build_model(), spec.example_inputs(), on_meta=False, methods=(method,))
    assert cap.method == method, cap.attempts
    got = {r.site.module: (r.site.kind, r.site.detected_by, r.site.num_groups, r.site.num_channels,
                           r.site.reduced_dims, r.site.group_split.affine, r.site.group_split.affine_shape)
           for r in discover_sites(cap) if r.site.group_split is not None}
    assert got == {"gn_group": ("GroupNorm", "pattern", 4, 16, [1, 2, 3], "group", [1, 4, 1]),
                   "ln_group": ("GroupNorm", "functional", 4, 16, [1, 2, 3], "group", [1, 4, 1]),
                   "in_group": ("GroupNorm", "functional", 4, 16, [1, 2, 3], "group", [4]),
                   "gn_channel": ("GroupNorm", "pattern", 4, 16, [1, 2, 3], "channel", None),
                   "ln_channel": ("GroupNorm", "functional", 4, 16, [1, 2, 3], "channel", None)}
