"""BatchNorm/GroupNorm/InstanceNorm facts (normaudit.facts.batchnorm), the batch-independence probe
(normaudit.probes.batch.batch_probe) and the batchnorm rules NB1xx, with exact modules and values.

The rules' fixtures (tests/fixtures/batchnorm/<ID>_<n>.py) are run by test_rule_fixtures.py.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from normaudit.probes import batch as probes_pass
from normaudit.facts.batchnorm import groupnorm_config_problems

from conftest import CASES, audit_file, audit_model, flagged, site
from test_axes import FIXTURES, my_rules  # noqa: F401 - my_rules is a fixture

def test_batch_of_one_error_quotes_pytorch(my_rules):
    from test_axes import load_fixture

    spec = load_fixture(FIXTURES / "batchnorm" / "NB101_1.py")
    r = audit_model(spec.build_model(), spec.example_inputs(), rules=my_rules)
    assert r.capture.attempts[-1].method.endswith("(eval)")   # PyTorch refused train mode at batch 1
    flat, img = site(r, "bn_flat"), site(r, "bn_img")
    assert (flat.batchnorm.values_per_channel, img.batchnorm.values_per_channel) == (1, 256)
    f = next(f for f in r.findings if f.module == "bn_flat")
    assert f.message.startswith("BatchNorm1d is trained with a micro-batch of 1: PyTorch raises in training: "
                                "Expected more than 1 value per channel when training, got input size "
                                "torch.Size([1, 16])")
    # --batch-size 1 on inputs of batch 4: nothing raised at capture, the message is derived from the shapes
    r = audit_model(spec.build_model(), (torch.randn(4, 3, 16, 16),), rules=my_rules, batch_size=1)
    assert [(f.module, f.severity) for f in r.findings if f.rule_id == "NB101"] == [("bn_flat", "error"),
                                                                                   ("bn_img", "warning")]
    assert site(r, "bn_flat").batchnorm.train_error == ("Expected more than 1 value per channel when training, "
                                                       "got input size torch.Size([1, 16])")


@pytest.mark.skipif(not (CASES / "N27_bn_batch1").is_dir(), reason="tests/data/cases not found")
def test_batchnorm1d_trained_one_example_at_a_time_is_only_nb101(my_rules):
    r = audit_file(CASES / "N27_bn_batch1" / "model.py", my_rules)
    assert [(f.rule_id, f.module, f.severity) for f in r.findings] == [("NB101", "1", "error")]


# ------------------------------------------------------------------------ batch-independence probe
class Both(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(20, 32)
        self.bn = nn.BatchNorm1d(32)
        self.ln = nn.LayerNorm(32)
        self.drop = nn.Dropout(0.5)     # same seed in both runs: the same mask for example 0

    def forward(self, x):
        return self.ln(self.drop(torch.relu(self.bn(self.fc(x)))))


def test_batch_probe_flags_batchnorm_and_passes_layernorm(my_rules):
    model = Both()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    r = audit_model(model, (torch.randn(2, 20),), rules=my_rules, probes=["batch"])
    bn, ln = site(r, "bn").batch_probe, site(r, "ln").batch_probe
    assert (bn.batch_size, bn.coupled, ln.coupled) == (4, True, False)
    assert bn.row0_max_change > 0.05 and bn.row0_max_change > 1000 * bn.tolerance
    assert ln.row0_max_change == 0.0 and ln.row0_scale > 0.5
    assert flagged(r, "NB108") == ["bn"] and flagged(r, "NL106") == []
    dumped = r.model_dump(mode="json")
    assert next(s for s in dumped["sites"] if s["module"] == "bn")["batch_probe"]["row0_max_change"] == bn.row0_max_change
    assert any(n.startswith("batch probe: 4 examples in train mode") for n in r.notes)
    # the user's model is untouched (running statistics, weights, mode)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and model.training


def test_batch_probe_gives_the_same_numbers_on_every_run_and_keeps_the_callers_rng(my_rules):
    model, inputs = Both(), (torch.randn(2, 20),)
    runs, draws = [], []
    for seed, probes in ((1, ["batch"]), (2, ["batch"]), (2, [])):
        torch.manual_seed(seed)
        runs.append(audit_model(copy.deepcopy(model), inputs, rules=my_rules, probes=probes))
        draws.append(torch.rand(3))
    assert site(runs[0], "bn").batch_probe.row0_max_change > 0
    assert [s.batch_probe for s in runs[0].sites] == [s.batch_probe for s in runs[1].sites]
    assert torch.equal(draws[1], draws[2])  # the probe drew from its own generator state


def test_batch_probe_materialises_a_meta_model(my_rules):
    with torch.device("meta"):
        model = Both()
    r = audit_model(model, (torch.randn(2, 20),), rules=my_rules, probes=["batch"], on_meta=True)
    assert (site(r, "bn").batch_probe.coupled, site(r, "ln").batch_probe.coupled) == (True, False)


def test_batch_probe_is_opt_in_and_refuses_large_models(monkeypatch, my_rules):
    r = audit_model(Both(), (torch.randn(2, 20),), rules=my_rules)
    assert all(s.batch_probe is None for s in r.sites)
    monkeypatch.setattr(probes_pass, "BATCH_PROBE_MAX_PARAMS", 100)
    r = audit_model(Both(), (torch.randn(2, 20),), rules=my_rules, probes=["batch"])
    assert all(s.batch_probe is None for s in r.sites)
    assert "batch probe skipped: the model has 0M parameters (limit 0M)" in " ".join(r.notes)


def test_batch_probe_on_a_transformer_layer(my_rules):
    """A pre-LN Transformer encoder layer (dropout on): no LayerNorm couples examples."""
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, norm_first=True)
    r = audit_model(layer, (torch.randn(2, 6, 16),), rules=my_rules, probes=["batch"])
    assert [(s.module, s.batch_probe.coupled, s.batch_probe.row0_max_change) for s in r.sites] == [
        ("norm1", False, 0.0), ("norm2", False, 0.0)]


def test_batch_probe_token_ids_couple_a_batchnorm_right_after_the_embedding(my_rules):
    """Integer ids: the other examples hold other tokens (drawn in row 0's range), so a BatchNorm pooling
    (batch, sequence) right after the embedding sees other statistics (with rolled ids it saw the same
    multiset of tokens, and its change stayed at rounding, 2.4e-07)."""
    r = audit_file(FIXTURES / "batchnorm" / "NB110_1.py", my_rules, probes=["batch"])
    bn, ln = site(r, "blocks.0.n1").batch_probe, site(r, "blocks.0.n2").batch_probe
    assert (bn.coupled, ln.coupled, ln.row0_max_change) == (True, False, 0.0)
    assert bn.row0_max_change > 0.05 and bn.row0_max_change > 1000 * bn.tolerance
    assert flagged(r, "NB108") == ["blocks.0.n1"] and flagged(r, "NL106") == []


def test_other_rows_ids_masks_and_ignore_index():
    from normaudit.probes.batch import _other_rows

    ids = torch.tensor([[5, 9, 7, 5, 12, 30]])
    other = _other_rows(ids, 0, 3, 1)
    assert other.shape == (3, 6) and other.dtype == ids.dtype
    assert int(other.min()) >= 5 and int(other.max()) <= 30
    assert any(sorted(row.tolist()) != sorted(ids[0].tolist()) for row in other)   # not a permutation of row 0
    assert torch.equal(other, _other_rows(ids, 0, 3, 1)) and not torch.equal(other, _other_rows(ids, 0, 3, 2))
    ones = torch.ones(1, 6, dtype=torch.long)
    assert torch.equal(_other_rows(ones, 0, 3, 1), torch.ones(3, 6, dtype=torch.long))
    pad = torch.tensor([[1, 1, 1, 1, 0, 0]])
    assert _other_rows(pad, 0, 3, 1).sum(dim=1).tolist() == [4, 4, 4]
    labels = torch.tensor([[-100, 3, 8, -100]])
    out = _other_rows(labels, 0, 2, 1)
    assert (out[:, [0, 3]] == -100).all() and ((out[:, 1:3] >= 3) & (out[:, 1:3] <= 8)).all()


def test_causal_op_and_conv_source_on_traced_graphs():
    from torch import fx
    from normaudit.facts.batchnorm import causal_op, conv_source

    class TrilMask(nn.Module):
        def forward(self, s):                      # (batch, t, t) scores
            return s.masked_fill(torch.triu(torch.ones_like(s, dtype=torch.bool), 1), float("-inf")).softmax(-1)

    class NotCausal(nn.Module):
        def forward(self, q):
            return nn.functional.scaled_dot_product_attention(q, q, q, is_causal=False)

    class ConvBN(nn.Module):
        def __init__(self):
            super().__init__()
            self.dw, self.lin, self.bn = nn.Conv1d(4, 4, 3, padding=1), nn.Linear(4, 4), nn.BatchNorm1d(4)

        def forward(self, x):                      # (batch, 4, t)
            return self.bn(nn.functional.silu(self.dw(x))) + self.bn(self.lin(x.transpose(1, 2)).transpose(1, 2))

    assert causal_op(fx.symbolic_trace(TrilMask()).graph) == "triu"
    assert causal_op(fx.symbolic_trace(NotCausal()).graph) is None and causal_op(None) is None
    gm = fx.symbolic_trace(ConvBN())
    modules = dict(gm.named_modules())
    bn_inputs = [n.args[0] for n in gm.graph.nodes if n.op == "call_module" and n.target == "bn"]
    assert [conv_source(n, modules) for n in bn_inputs] == ["dw", None]


class _PositionMask(nn.Module):
    """Scores (batch, t, t) masked the way transformers' masking_utils does it: a comparison of position
    indices (``kv_idx <= q_idx`` over ``cache_position``) instead of a ``tril``; ``band``: a bidirectional
    window ``kv_idx < q_idx + 3`` (not causal)."""

    def __init__(self, band: bool = False):
        super().__init__()
        self.band = band

    def forward(self, s):
        pos = torch.arange(s.shape[-1]) + 0
        kv, q = pos[None, None, :], pos[None, :, None]
        allowed = kv < q + 3 if self.band else kv <= q
        return s.masked_fill(~allowed, float("-inf")).softmax(-1)


@pytest.mark.parametrize("band,expected", [
    (False, "a causal mask: position comparison le (key index <= query index)"),
    (True, None),
])
def test_causal_op_reads_position_comparison_masks(band, expected):
    from normaudit.facts.batchnorm import causal_op

    graph = torch.export.export(_PositionMask(band), (torch.zeros(2, 8, 8),)).graph
    assert causal_op(graph) == expected


def test_causal_op_on_transformers_masking_utils():
    transformers = pytest.importorskip("transformers")
    from normaudit.capture import capture_model
    from normaudit.facts.batchnorm import causal_op

    def graph(cls, cfg):
        with torch.device("meta"):
            model = cls(cfg)
        return capture_model(model, {"input_ids": torch.zeros(2, 16, dtype=torch.long)}, True, torch.float32).gm.graph

    small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, vocab_size=100)
    llama = graph(transformers.LlamaModel, transformers.LlamaConfig(num_key_value_heads=4, **small))
    bert = graph(transformers.BertModel, transformers.BertConfig(**small))
    assert causal_op(llama) == "a causal mask: position comparison le (key index <= query index)"
    assert causal_op(bert) is None


# ------------------------------------------------------------------------ GroupNorm groups vs the config
@pytest.mark.parametrize("config,expected", [
    ({"norm_num_groups": 32, "block_out_channels": [16, 64, 96]},
     [{"groups_key": "norm_num_groups", "groups": 32, "channels_key": "block_out_channels",
       "channels": [16, 64, 96], "bad": [16]}]),
    ({"unet": {"resnet_groups": 8, "block_out_channels": [32, 64]}}, []),
    ({"params": {"ch": 48, "ch_mult": [1, 2, 4], "num_groups": 32}},
     [{"groups_key": "num_groups", "groups": 32, "channels_key": "ch*ch_mult", "channels": [48, 96, 192],
       "bad": [48]}]),
    ({"norm_num_groups": 32, "block_out_channels": "wide"}, []),
    ({"hidden_size": 768}, []),
    ({}, []),
])
def test_groupnorm_config_problems(config, expected):
    assert groupnorm_config_problems(config) == expected


def test_groupnorm_config_finding_message(my_rules):
    path = FIXTURES / "batchnorm" / "NB106_1.py"
    r = audit_file(path, my_rules, config=str(path.with_suffix(".json")))
    f = next(f for f in r.findings if f.rule_id == "NB106")
    assert (f.module, f.severity) == ("", "error")
    assert f.message == ("NB106_1.json sets norm_num_groups=32 but block_out_channels=[16, 32, 48]: [16, 48] not "
                         "divisible by 32, and nn.GroupNorm(32, C) raises at construction for those channel counts")


def test_eval_statistics_follow_the_running_buffers(my_rules):
    """``site.batchnorm.eval_statistics``: ``batch`` exactly where eval mode can only use the batch's statistics
    (no running buffers: built with track_running_stats=False, or a functional batch_norm given none), with the
    values per channel at batch size 1; the flag switched off after construction keeps the buffers eval uses."""
    from test_axes import load_fixture

    spec = load_fixture(FIXTURES / "batchnorm" / "NB111_1.py")
    r = audit_model(spec.build_model(), spec.example_inputs(), rules=my_rules)
    got = {m: (site(r, m).batchnorm.eval_statistics, site(r, m).batchnorm.eval_values_at_batch_one)
           for m in ("bn_img", "bn_tracked", "fnorm", "bn_switched", "bn_flat")}
    assert got == {"bn_img": ("batch", 256), "bn_tracked": ("running", None), "fnorm": ("batch", 256),
                   "bn_switched": ("running", None), "bn_flat": ("batch", 1)}
    # what PyTorch does in eval: bn_switched uses its (initial) buffers, bn_flat raises at batch 1
    model = spec.build_model().eval()
    x = torch.randn(3, 8, 4, 4)
    assert torch.allclose(model.bn_switched(x), x / (1 + 1e-5) ** 0.5)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        model.bn_flat(torch.randn(1, 16))


def test_padding_input_is_found_whether_lengths_are_passed_by_keyword_or_position(my_rules):
    """NB104's ``padding_input``: the same for positional and keyword inputs, also where export bakes the
    lengths into the graph as a constant (a data-dependent trim leaves no placeholder for them)."""
    from test_axes import load_fixture

    spec = load_fixture(FIXTURES / "batchnorm" / "NB104_2.py")
    got = []
    for inputs in (spec.example_inputs(), spec.keyword_inputs()):
        r = audit_model(spec.build_model(), inputs, rules=my_rules)
        # baked in: the graph alone does not name it
        assert r.capture.attempts[-1].method == "export (integer inputs as constants)"
        got.append((site(r, "conv_module.bn").batchnorm.padding_input, flagged(r, "NB104")))
    assert got == [("lengths", ["conv_module.bn"])] * 2
