"""Every rule that applies to an ONNX graph (``normaudit.audit_onnx.ONNX_RULES``), a true positive and a true
negative each, on files written with ``onnx.helper``: the exact modules (node scopes) flagged, with their
severity, and none flagged on the negative."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx_builders as ob  # noqa: E402
from onnx_builders import FLOAT, FLOAT16, Nodes, norm, save, vi  # noqa: E402

from normaudit.audit import run_audit  # noqa: E402
from normaudit.audit_onnx import ONNX_RULES  # noqa: E402
from normaudit.engine.loader import load_rules  # noqa: E402
from normaudit.options import AuditOptions  # noqa: E402

RULES = load_rules([])


def audit(path: Path, **kw):
    return run_audit(AuditOptions(target=str(path), **kw), RULES)


def hits(path: Path, rule: str, **kw) -> dict[str, str]:
    """module -> severity of the findings of ``rule`` on the ONNX file ``path``."""
    return {f.module: f.severity for f in audit(path, **kw).findings if f.rule_id == rule}


def _graph(tmp_path: Path, name: str, shape, build, elem=FLOAT, opset: int = 17) -> Path:
    """A graph of input ``x`` of ``shape``: ``build(b, "x")`` adds the nodes and returns the output value."""
    b = Nodes(elem)
    out = build(b, "x")
    return save(tmp_path / f"{name}.onnx", b.nodes, [vi("x", elem, shape)], [vi(out, elem, None)], b.inits,
                opset=opset)


# -- layout ---------------------------------------------------------------------------------------------------
def test_nl101_layer_normalization_over_the_sequence(tmp_path):
    tp = ob.single(tmp_path / "tp.onnx", "LayerNormalization", ["batch", 8, 16], axis=1)
    tn = ob.single(tmp_path / "tn.onnx", "LayerNormalization", ["batch", 8, 16])
    assert hits(tp, "NL101") == {"norm": "error"}
    assert hits(tn, "NL101") == {}


def _nchw(tmp_path: Path, name: str, axis: int, transpose: bool) -> Path:
    def build(b, x):
        if transpose:
            x = b.op("Transpose", [x], "to_nhwc", perm=[0, 2, 3, 1])
        shape = [8, 8, 4] if transpose else [4, 8, 8]
        return norm(b, x, "LayerNormalization", "norm", 0, gain=np.ones(shape[axis:] if axis != -1 else shape[-1:]),
                    axis=axis)
    return _graph(tmp_path, name, ["batch", 4, 8, 8], build)


def test_nl102_and_nl103_layer_norm_of_an_image(tmp_path):
    width = _nchw(tmp_path, "width", -1, False)        # NCHW, last dim: the width
    joint = _nchw(tmp_path, "joint", 1, False)         # NCHW over C, H, W jointly
    channels = _nchw(tmp_path, "channels", -1, True)   # NHWC, last dim: the channels
    assert hits(width, "NL102") == {"norm": "error"} and hits(width, "NL103") == {}
    assert hits(joint, "NL103") == {"norm": "warning"} and hits(joint, "NL102") == {}
    assert hits(channels, "NL102") == {} and hits(channels, "NL103") == {}


def test_nl104_joint_over_two_separate_dims(tmp_path):
    def build(axis):
        def f(b, x):
            x = b.op("Unsqueeze", [x, b.const("axes", [2], ob.INT64)], "fields")
            x = b.op("Tile", [x, b.const("reps", [1, 1, 3, 1], ob.INT64)], "fields")
            return norm(b, x, "LayerNormalization", "norm", 16, gain=np.ones([3, 16] if axis == -2 else [16]),
                        axis=axis)
        return f
    tp = _graph(tmp_path, "tp", ["batch", "sequence", 16], build(-2), opset=17)
    tn = _graph(tmp_path, "tn", ["batch", "sequence", 16], build(-1), opset=17)
    assert hits(tp, "NL104") == {"norm": "warning"}
    assert hits(tn, "NL104") == {}


# -- batchnorm ------------------------------------------------------------------------------------------------
def _bn(tmp_path: Path, name: str, shape, mean=0.0, var=1.0) -> Path:
    c = shape[1]

    def build(b, x):
        ins = [x] + [b.const(f"bn.{k}", np.full(c, v)) for k, v in
                     (("weight", 1.0), ("bias", 0.0), ("running_mean", mean), ("running_var", var))]
        return b.op("BatchNormalization", ins, "bn", epsilon=1e-5)
    return _graph(tmp_path, name, shape, build)


def test_nb102_batch_norm_of_a_token_sequence(tmp_path):
    assert hits(_bn(tmp_path, "tp", ["batch", 8, 16]), "NB102") == {"bn": "error"}
    assert hits(_bn(tmp_path, "tn", ["batch", 4, 8, 8]), "NB102") == {}


def _gn(tmp_path: Path, name: str, groups: int) -> Path:
    def build(b, x):
        ins = [x, b.const("gn.weight", np.ones(4)), b.const("gn.bias", np.zeros(4))]
        return b.op("GroupNormalization", ins, "gn", epsilon=1e-5, num_groups=groups)
    return _graph(tmp_path, name, ["batch", 4, 8, 8], build, opset=21)


def test_nb107_group_norm_of_one_group(tmp_path):
    assert hits(_gn(tmp_path, "tp", 1), "NB107") == {"gn": "info"}
    assert hits(_gn(tmp_path, "tn", 2), "NB107") == {}


# -- eps ------------------------------------------------------------------------------------------------------
def test_ne101_eps_against_the_config(tmp_path):
    """An export that dropped the eps (LayerNormalization's default 1e-5) is found against the HF config."""
    onnx_file = ob.decoder(tmp_path / "m.onnx", form="LayerNormalization", eps=1e-5)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "layer_norm_eps": 1e-6}))
    found = hits(onnx_file, "NE101", config=str(config))
    assert found == {"layers.0.input_layernorm": "error", "layers.1.input_layernorm": "error", "norm": "error"}
    config.write_text(json.dumps({"model_type": "llama", "layer_norm_eps": 1e-5}))
    assert hits(onnx_file, "NE101", config=str(config)) == {}


def test_ne101_config_beside_the_file(tmp_path):
    """A config.json beside the ONNX file (an optimum export folder) is compared without --config."""
    onnx_file = ob.decoder(tmp_path / "model.onnx", form="rms_chain", eps=1e-5)
    (tmp_path / "config.json").write_text(json.dumps({"rms_norm_eps": 1e-6}))
    report = audit(onnx_file)
    assert {f.module for f in report.findings if f.rule_id == "NE101"} == {
        "layers.0.input_layernorm", "layers.1.input_layernorm", "norm"}
    e = report.sites[0].eps_facts
    assert (e.declared[0].origin, e.declared[0].source) == ("checkpoint", "config.json (beside the ONNX file)")


def test_ne102_eps_differs_from_its_peers(tmp_path):
    odd = {"layers.3.input_layernorm": 1e-5}
    assert hits(ob.decoder(tmp_path / "tp.onnx", layers=4, eps_of=odd), "NE102") == {
        "layers.3.input_layernorm": "warning"}
    assert hits(ob.decoder(tmp_path / "tn.onnx", layers=4), "NE102") == {}


def test_ne103_no_eps(tmp_path):
    chain = ob.single(tmp_path / "chain.onnx", "rms_chain", ["batch", "sequence", 16], eps=None)
    zero = ob.single(tmp_path / "zero.onnx", "LayerNormalization", ["batch", "sequence", 16], eps=0.0)
    ok = ob.single(tmp_path / "ok.onnx", "rms_chain", ["batch", "sequence", 16], eps=1e-6)
    assert hits(chain, "NE103") == {"norm": "error"}
    assert hits(zero, "NE103") == {"norm": "error"}
    assert hits(ok, "NE103") == {}


def test_ne104_eps_underflows_in_float16_statistics(tmp_path):
    """1e-12 is 0 in float16: the statistics of stash_type float16 add nothing; in float32 it survives."""
    half = ob.single(tmp_path / "half.onnx", "LayerNormalization", ["batch", "sequence", 16], elem=FLOAT16,
                     eps=1e-12, stash=FLOAT16)
    full = ob.single(tmp_path / "full.onnx", "LayerNormalization", ["batch", "sequence", 16], elem=FLOAT16,
                     eps=1e-12, stash=FLOAT)
    assert hits(half, "NE104") == {"norm": "error"}
    assert hits(full, "NE104") == {}
    site = audit(half).sites[0]
    assert (site.eps, site.eps_facts.dtype, site.eps_facts.in_dtype, site.onnx.stash_type) == (
        1e-12, "float16", 0.0, "float16")


# -- norm type and numerics -----------------------------------------------------------------------------------
def test_nt104_eps_outside_the_root(tmp_path):
    tp = ob.single(tmp_path / "tp.onnx", "ln_chain", ["batch", "sequence", 16], eps_outside=True)
    tn = ob.single(tmp_path / "tn.onnx", "ln_chain", ["batch", "sequence", 16])
    assert hits(tp, "NT104") == {"norm": "warning"}
    assert hits(tn, "NT104") == {}


def test_nn101_squares_in_float16(tmp_path):
    """A float16 graph whose statistics stay in float16 (a decomposed RMSNorm without a cast, a
    LayerNormalization of stash_type float16); an upcast to float32 is fine."""
    chain = ob.single(tmp_path / "chain.onnx", "rms_chain", ["batch", "sequence", 16], elem=FLOAT16)
    stash = ob.single(tmp_path / "stash.onnx", "LayerNormalization", ["batch", "sequence", 16], elem=FLOAT16,
                      stash=FLOAT16)
    upcast = ob.single(tmp_path / "upcast.onnx", "rms_chain", ["batch", "sequence", 16], elem=FLOAT16, upcast=True)
    fused = ob.single(tmp_path / "fused.onnx", "LayerNormalization", ["batch", "sequence", 16], elem=FLOAT16)
    assert hits(chain, "NN101") == {"norm": "warning"}
    assert hits(stash, "NN101") == {"norm": "warning"}
    assert hits(upcast, "NN101") == {} and hits(fused, "NN101") == {}


# -- checkpoint (gain statistics) -----------------------------------------------------------------------------
_RNG = np.random.default_rng(0)
_NEAR_ZERO = _RNG.standard_normal(16) * 0.05
_NEAR_ONE = 1 + _RNG.standard_normal(16) * 0.05


def _gained(tmp_path: Path, name: str, gain, one_plus: bool = False, form: str = "LayerNormalization") -> Path:
    return ob.single(tmp_path / f"{name}.onnx", form, ["batch", "sequence", 16], gain=gain, one_plus=one_plus)


def test_nc101_offset_gains_in_a_weight_norm(tmp_path):
    assert hits(_gained(tmp_path, "tp", _NEAR_ZERO), "NC101") == {"norm": "error"}
    assert hits(_gained(tmp_path, "tn", _NEAR_ONE), "NC101") == {}


def test_nc102_plain_gains_in_an_offset_norm(tmp_path):
    """A gain applied as (1 + w) (the exporter kept the addition) whose w sits near 1: the offset twice."""
    tp = _gained(tmp_path, "tp", _NEAR_ONE, one_plus=True, form="rms_chain")
    tn = _gained(tmp_path, "tn", _NEAR_ZERO, one_plus=True, form="rms_chain")
    assert hits(tp, "NC102") == {"norm": "error"}
    assert hits(tn, "NC102") == {} and hits(tn, "NC101") == {}
    assert audit(tp).sites[0].gain_form == "one_plus_weight"


def test_nc103_nonfinite_gains(tmp_path):
    bad = np.ones(16)
    bad[3] = np.nan
    assert hits(_gained(tmp_path, "tp", bad), "NC103") == {"norm": "error"}
    assert hits(_gained(tmp_path, "tn", np.ones(16)), "NC103") == {}


def test_nc104_all_zero_gains(tmp_path):
    assert hits(_gained(tmp_path, "tp", np.zeros(16)), "NC104") == {"norm": "warning"}
    assert hits(_gained(tmp_path, "tn", np.ones(16)), "NC104") == {}


def test_nc105_running_statistics_never_updated(tmp_path):
    assert hits(_bn(tmp_path, "tp", ["batch", 4, 8, 8]), "NC105") == {"bn": "warning"}
    trained = _bn(tmp_path, "tn", ["batch", 4, 8, 8], mean=0.3, var=2.0)
    assert hits(trained, "NC105") == {}


def test_nc108_gains_around_two_centres(tmp_path):
    gains = {"layers.0.input_layernorm": _NEAR_ONE, "layers.1.input_layernorm": _NEAR_ONE,
             "layers.2.input_layernorm": _NEAR_ONE, "norm": _NEAR_ZERO}
    tp = ob.decoder(tmp_path / "tp.onnx", layers=3, gains=gains)
    tn = ob.decoder(tmp_path / "tn.onnx", layers=3, gains={**gains, "norm": _NEAR_ONE})
    assert hits(tp, "NC108") == {"norm": "warning"}
    assert hits(tn, "NC108") == {}


# -- placement ------------------------------------------------------------------------------------------------
def test_np101_pre_ln_stack_without_a_final_norm(tmp_path):
    tp = ob.decoder(tmp_path / "tp.onnx", layers=3, final=False)
    tn = ob.decoder(tmp_path / "tn.onnx", layers=3)
    report = audit(tp)
    assert {f.module: f.severity for f in report.findings if f.rule_id == "NP101"} == {"layers.2": "warning"}
    assert (report.model.stream_end.module, report.model.stream_end.consumer) == ("layers.2.input_layernorm",
                                                                                 "lm_head")
    assert hits(tn, "NP101") == {}


def _double(tmp_path: Path, name: str, shared: bool) -> Path:
    def build(b, x):
        h = norm(b, x, "LayerNormalization", "first", 16)
        y = norm(b, h, "LayerNormalization", "second", 16)
        return b.op("Add", [h, y], "out") if shared else y
    return _graph(tmp_path, name, ["batch", "sequence", 16], build)


def test_np103_norm_of_a_norm(tmp_path):
    assert hits(_double(tmp_path, "tp", False), "NP103") == {"second": "info"}
    assert hits(_double(tmp_path, "tn", True), "NP103") == {}


def test_every_onnx_rule_is_pinned_here():
    """Each rule of ONNX_RULES has a test above naming it."""
    names = [n for n in globals() if n.startswith("test_")]
    assert [r for r in ONNX_RULES if not any(r.lower() in n for n in names)] == []


def test_nl101_over_a_symbolic_sequence_of_token_ids(tmp_path):
    """(batch, sequence, hidden) from an embedding of token ids, both leading dims symbolic: axis=1 mixes the
    sequence (NL101, naming the module), axis=-1 does not."""
    def build(axis):
        def f(b, ids):
            x = b.op("Gather", [b.const("embed_tokens.weight", np.eye(32, 16)), ids], "embed_tokens")
            return norm(b, x, "LayerNormalization", "encoder.layer.0.output.LayerNorm", 16, axis=axis)
        return f
    paths = {}
    for name, axis in (("tp", 1), ("tn", -1)):
        b = Nodes()
        out = build(axis)(b, "input_ids")
        paths[name] = save(tmp_path / f"{name}.onnx", b.nodes, [vi("input_ids", ob.INT64, ["batch", "sequence"])],
                           [vi(out, FLOAT, None)], b.inits)
    assert hits(paths["tp"], "NL101") == {"encoder.layer.0.output.LayerNorm": "error"}
    site = audit(paths["tp"]).sites[0]
    assert (site.input_axes, site.normalized_axes) == (["batch", "sequence", "feature"], ["sequence", "feature"])
    assert hits(paths["tn"], "NL101") == {}


def test_ne103_ne104_eps_1e_12_in_a_float16_graph(tmp_path):
    """1e-12 is 0 in float16: a decomposed norm without an upcast stores its eps constant in float16, so it
    adds 0 (NE103); a BatchNormalization of a float16 input (no stash_type) holds 1e-12 but adds it in
    float16 (NE104); the chain that casts to float32 first keeps it, as does a BatchNormalization of 1e-5."""
    chain = ob.single(tmp_path / "chain.onnx", "rms_chain", ["batch", "sequence", 16], elem=FLOAT16, eps=1e-12)
    upcast = ob.single(tmp_path / "upcast.onnx", "rms_chain", ["batch", "sequence", 16], elem=FLOAT16, eps=1e-12,
                       upcast=True)

    def bn(eps):
        def f(b, x):
            ins = [x] + [b.const(f"bn.{k}", np.full(4, v)) for k, v in
                         (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.3), ("running_var", 2.0))]
            return b.op("BatchNormalization", ins, "bn", epsilon=eps)
        return f
    bn_tp = _graph(tmp_path, "bn_tp", ["batch", 4, 8, 8], bn(1e-12), elem=FLOAT16)
    bn_tn = _graph(tmp_path, "bn_tn", ["batch", 4, 8, 8], bn(1e-5), elem=FLOAT16)
    assert hits(chain, "NE103") == {"norm": "error"} and hits(chain, "NE104") == {}
    assert audit(chain).sites[0].eps_facts.effective == 0.0
    assert hits(upcast, "NE103") == {} and hits(upcast, "NE104") == {}
    assert audit(upcast).sites[0].eps == 1e-12
    assert hits(bn_tp, "NE104") == {"bn": "error"} and hits(bn_tn, "NE104") == {}
    e = audit(bn_tp).sites[0].eps_facts
    assert (e.effective, e.dtype, e.in_dtype) == (1e-12, "float16", 0.0)
