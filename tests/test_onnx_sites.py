"""The sites of ONNX graphs and their facts, exact: each normalisation operator and decomposed form, its kind,
eps, reduced dims and axes, the module path read from node names and exporter metadata, placement from the
residual adds, gain statistics from initializers (external data included: only the norms' bytes read)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper  # noqa: E402

import onnx_builders as ob  # noqa: E402
from onnx_builders import FLOAT, Nodes, norm, save, vi  # noqa: E402

from normaudit.audit import run_audit  # noqa: E402
from normaudit.engine.loader import load_rules  # noqa: E402
from normaudit.facts.onnx_graph import find_sites  # noqa: E402
from normaudit.facts.onnx_graph.axes import reshape_labels  # noqa: E402
from normaudit.facts.onnx_graph.names import block_of, module_path  # noqa: E402
from normaudit.loaders.onnx_file import open_onnx  # noqa: E402
from normaudit.options import AuditOptions  # noqa: E402

RULES = load_rules([])


def audit(path: Path, **kw):
    return run_audit(AuditOptions(target=str(path), **kw), RULES)


def _operators(tmp_path: Path) -> Path:
    """One graph holding every normalisation operator (opset 23)."""
    b = Nodes()
    img = "image"
    c = 4
    bn = b.op("BatchNormalization", [img] + [b.const(f"bn.{k}", np.full(c, v)) for k, v in
                                             (("w", 1.0), ("b", 0.0), ("m", 0.5), ("v", 2.0))], name="bn", epsilon=1e-3)
    gn = b.op("GroupNormalization", [bn, b.const("gn.w", np.ones(c)), b.const("gn.b", np.zeros(c))], name="gn",
              epsilon=1e-6, num_groups=2)
    inn = b.op("InstanceNormalization", [gn, b.const("in.w", np.ones(c)), b.const("in.b", np.zeros(c))], name="in")
    lrn = b.op("LRN", [inn], name="lrn", size=3, alpha=2e-4, beta=0.5, bias=2.0)
    seq = "tokens"
    ln = b.op("LayerNormalization", [seq, b.const("ln.w", np.ones(16)), b.const("ln.b", np.zeros(16))], name="ln",
              epsilon=1e-6)
    rms = b.op("RMSNormalization", [ln, b.const("rms.w", np.ones(16))], name="rms", epsilon=1e-5)
    lp = b.op("LpNormalization", [rms], name="lp", axis=-1, p=2)
    return save(tmp_path / "ops.onnx", b.nodes, [vi(img, FLOAT, ["batch", 4, 8, 8]), vi(seq, FLOAT, ["batch", "sequence", 16])],
                [vi(lrn, FLOAT, None), vi(lp, FLOAT, None)], b.inits, opset=23)


def test_every_normalisation_operator(tmp_path):
    report = audit(_operators(tmp_path))
    got = {s.module: (s.kind, s.eps, s.reduced_dims, s.normalized_axes) for s in report.sites}
    assert got == {
        "bn": ("BatchNorm", 1e-3, [0, 2, 3], ["batch", "height", "width"]),
        "gn": ("GroupNorm", 1e-6, [1, 2, 3], ["channel", "height", "width"]),
        "in": ("InstanceNorm", 1e-5, [2, 3], ["height", "width"]),
        "lrn": ("LocalResponseNorm", None, [1], ["channel"]),
        "ln": ("LayerNorm", 1e-6, [2], ["feature"]),
        "rms": ("RMSNorm", 1e-5, [2], ["feature"]),
        "lp": ("RMSNorm", None, [2], ["feature"]),
    }
    by = {s.module: s for s in report.sites}
    assert by["bn"].channel_axes == ["channel"] and by["bn"].weights.running_state == "trained"
    assert by["gn"].num_groups == 2 and by["gn"].num_channels == 4
    assert (by["lrn"].lrn.size, by["lrn"].lrn.alpha, by["lrn"].lrn.beta, by["lrn"].lrn.k) == (3, 2e-4, 0.5, 2.0)
    assert by["lp"].eps_facts.statistic == "l2_norm" and not by["lp"].eps_facts.missing
    assert by["ln"].onnx.model_dump() == {"node": "ln", "op_type": "LayerNormalization", "nodes": ["ln"],
                                          "stash_type": "float32", "module_from": "node"}
    assert by["ln"].input_axes == ["batch", "sequence", "feature"]
    assert report.target.kind == "onnx" and report.capture.method == "onnx"


def test_decomposed_forms_and_their_formula(tmp_path):
    shape = ["batch", "sequence", 16]
    cases = {"ln": dict(form="ln_chain"), "rms": dict(form="rms_chain", eps=1e-6),
             "outside": dict(form="ln_chain", eps_outside=True), "none": dict(form="rms_chain", eps=None)}
    got = {}
    for name, kw in cases.items():
        report = audit(ob.single(tmp_path / f"{name}.onnx", kw.pop("form"), shape, **kw))
        (s,) = report.sites
        got[name] = (s.kind, s.eps, s.formula.eps_position, s.formula.text, s.eps_facts.missing)
    assert got == {
        "ln": ("LayerNorm", 1e-5, "inside_sqrt", "(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * w + b", False),
        "rms": ("RMSNorm", 1e-6, "inside_sqrt", "x / sqrt(mean(x^2) + eps) * w", False),
        "outside": ("LayerNorm", 1e-5, "outside_sqrt", "(x - mean(x)) / (sqrt(mean((x - mean(x))^2)) + eps) * w + b", False),
        "none": ("RMSNorm", None, "none", "x / sqrt(mean(x^2)) * w", True),
    }


def test_group_norm_as_exporters_emit_it(tmp_path):
    """Reshape (N, C, H, W) -> (N, G, -1), InstanceNormalization, Reshape back, per-channel gain and bias: a
    GroupNorm of G groups whose gain is the multiply after the reshape."""
    b = Nodes()
    r = b.op("Reshape", ["x", b.const("to_groups", [0, 2, -1], ob.INT64)], name="/gn/Reshape")
    inn = b.op("InstanceNormalization", [r, b.const("ones", np.ones(2)), b.const("zeros", np.zeros(2))],
               name="/gn/InstanceNormalization", epsilon=1e-5)
    back = b.op("Shape", ["x"], name="/gn/Shape")
    y = b.op("Reshape", [inn, back], name="/gn/Reshape_1")
    y = b.op("Mul", [y, b.const("gn.weight", np.full((4, 1, 1), 0.5))], name="/gn/Mul")
    y = b.op("Add", [y, b.const("gn.bias", np.zeros((4, 1, 1)))], name="/gn/Add")
    path = save(tmp_path / "gn.onnx", b.nodes, [vi("x", FLOAT, [2, 4, 8, 8])], [vi(y, FLOAT, None)], b.inits)
    (s,) = audit(path).sites
    assert (s.module, s.kind, s.num_groups, s.num_channels, s.reduced_dims) == ("gn", "GroupNorm", 2, 4, [1, 2, 3])
    assert (s.weights.keys, s.weights.gain_mean) == (["gn.weight", "gn.bias"], 0.5)
    assert s.onnx.nodes == ["/gn/Reshape", "/gn/InstanceNormalization", "/gn/Reshape_1", "/gn/Mul", "/gn/Add"]


def test_module_paths_from_node_names_and_metadata():
    legacy = helper.make_node("ReduceMean", ["a"], ["b"], name="/model/layers.3/input_layernorm/ReduceMean")
    assert module_path(legacy, "x").path == "model.layers.3.input_layernorm"
    dynamo = helper.make_node("Pow", ["a"], ["b"], name="node_pow_1")
    helper.set_metadata_props(dynamo, {
        "pkg.torch.onnx.name_scopes": "['', 'layers.0', 'layers.0.input_layernorm', 'pow_1']",
        "pkg.torch.onnx.class_hierarchy": "['m.M', 'm.Block', 'm.LlamaRMSNorm', 'aten.pow.Tensor_Scalar']"})
    assert module_path(dynamo, "node_pow_1") == ("layers.0.input_layernorm", "LlamaRMSNorm", "m", "name_scopes")
    hostile = helper.make_node("Pow", ["a"], ["b"], name="n")
    helper.set_metadata_props(hostile, {"pkg.torch.onnx.name_scopes": "__import__('os').system('true')"})
    assert module_path(hostile, "n").path == "n"
    assert (block_of("layers.0.input_layernorm"), block_of("norm"), block_of("h.11")) == ("layers.0", None, None)


def test_placement_of_pre_and_post_ln_stacks(tmp_path):
    pre = audit(ob.decoder(tmp_path / "pre.onnx", layers=2))
    assert {s.module: (s.placement, s.stream.branch_position, s.block) for s in pre.sites} == {
        "layers.0.input_layernorm": ("pre", "input", "layers.0"),
        "layers.1.input_layernorm": ("pre", "input", "layers.1"),
        "norm": ("final", None, None)}
    assert (pre.model.placement, pre.model.has_final_norm, pre.model.num_residual_adds) == ("pre", True, 2)
    b = Nodes()   # post-LN: x = norm(x + f(x)), twice, after an embedding norm
    x = norm(b, "x", "LayerNormalization", "embeddings.LayerNorm", 16)
    for i in range(2):
        f = b.op("MatMul", [x, b.const(f"layers.{i}.w", np.eye(16))], f"layers.{i}.dense")
        x = norm(b, b.op("Add", [x, f], f"layers.{i}"), "LayerNormalization", f"layers.{i}.output.LayerNorm", 16)
    post = audit(save(tmp_path / "post.onnx", b.nodes, [vi("x", FLOAT, ["batch", "sequence", 16])],
                      [vi(x, FLOAT, None)], b.inits))
    assert {s.module: s.placement for s in post.sites} == {
        "embeddings.LayerNorm": "embedding", "layers.0.output.LayerNorm": "post", "layers.1.output.LayerNorm": "post"}
    assert post.model.placement == "post"
    alone = audit(ob.single(tmp_path / "alone.onnx", "LayerNormalization", ["batch", "sequence", 16]))
    assert (alone.sites[0].placement, alone.model.placement) == ("none", "none")


def test_sandwich_norm_closes_its_branch(tmp_path):
    b = Nodes()
    x = "x"
    h = norm(b, x, "rms_chain", "layers.0.input_layernorm", 16)
    f = b.op("MatMul", [h, b.const("w", np.eye(16))], "layers.0.mlp")
    out = norm(b, f, "rms_chain", "layers.0.post_feedforward_layernorm", 16)
    y = b.op("Add", [x, out], "layers.0")
    report = audit(save(tmp_path / "s.onnx", b.nodes, [vi("x", FLOAT, ["batch", "sequence", 16])],
                        [vi(y, FLOAT, None)], b.inits))
    assert {s.module: (s.placement, s.stream.branch_position) for s in report.sites} == {
        "layers.0.input_layernorm": ("pre", "input"), "layers.0.post_feedforward_layernorm": ("sandwich", "output")}
    assert report.model.placement == "sandwich"


def test_reshape_labels_split_and_merge():
    assert reshape_labels(["batch", "sequence", "feature"], ["batch", 8, 64], ["batch", 8, 4, 16]) == [
        "batch", "sequence", "head", "feature"]
    assert reshape_labels(["batch", "channel", "height", "width"], [2, 4, 8, 8], [2, 4, 64]) == [
        "batch", "channel", "height*width"]
    assert reshape_labels(["batch", "channel", "height*width"], [2, 4, 64], [2, 4, 8, 8]) == [
        "batch", "channel", "height", "width"]
    assert reshape_labels(["batch", "feature"], [2, 6], [3, 4]) == ["unknown", "unknown"]
    assert reshape_labels(["batch", "feature"], [2, "n"], [3, 4]) is None


def test_external_data_only_the_norm_tensors_are_read(tmp_path):
    """Weights in external data: the audit reads the graph and the norms' gains, not the large matrices."""
    path = ob.decoder(tmp_path / "ext.onnx", layers=2, hidden=256, vocab=4096, external=True)
    data = tmp_path / "ext.onnx.data"
    g = open_onnx(path)
    records = find_sites(g)
    from normaudit.facts.onnx_graph.weights import site_weights

    stats = [site_weights(g, r) for r in records]
    assert [s.gain_mean for s in stats] == [1.0, 1.0, 1.0]
    norm_bytes = 3 * 256 * 4 + 3 * 4   # three gains; the eps and exponent scalars are external too
    assert g.store.bytes_read <= norm_bytes + 3 * 4
    assert g.store.bytes_read < data.stat().st_size / 100
    report = audit(path)
    assert report.sites[0].weights.keys == ["layers.0.input_layernorm.weight"]


def test_external_data_outside_the_folder_is_refused(tmp_path):
    path = ob.single(tmp_path / "m.onnx", "LayerNormalization", ["batch", "sequence", 16])
    model = onnx.load(str(path))
    for t in model.graph.initializer:
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        t.external_data.add(key="location", value="../secret.bin")
    onnx.save_model(model, str(path))
    with pytest.raises(Exception) as err:
        audit(path)
    assert "only a file inside the model's folder is read" in str(err.value)
    assert type(err.value).__name__ == "UsageError"


def test_external_data_truncated_is_a_usage_error(tmp_path):
    path = ob.decoder(tmp_path / "m.onnx", external=True)
    data = tmp_path / "m.onnx.data"
    os.truncate(data, 100)
    with pytest.raises(Exception) as err:
        audit(path)
    assert type(err.value).__name__ == "UsageError" and "is truncated" in str(err.value)
