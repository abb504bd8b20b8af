"""Hostile and broken files: every file of tests/data/make_bad_ckpts.py (a copy of
../shared/bad-inputs/make_bad_ckpts.py) through the command line, as a target, as --checkpoint and as --config.

Each one gives a report, or exit 2 with exactly one ``normaudit: error:`` line naming the file and its cause;
never a traceback, exit 3, a hang, a file written, or code from a checkpoint or config run (PWNED_* markers).
Several targets go through one process (the CLI audits them in turn and reports each failure on its own line),
so the whole matrix costs three interpreter starts.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from normaudit.cli import main

HERE = Path(__file__).parent
GENERATOR = HERE / "data" / "make_bad_ckpts.py"
PROCESS_TIMEOUT = 300  # seconds; a reader that blocks (a FIFO) would hit it

#: what each generated file gives as a TARGET: None for a report, else a regex the one error line matches.
AS_TARGET = {
    "good.safetensors": None, "good.pt": None, "dirloop": None, "st_nan_gain.safetensors": None,
    "st_evil_names.safetensors": None, "st_metadata_config.safetensors": None,
    "hf_llama_tiny": None, "hf_flash": None, "hf_quant": None,
    "cfgdir": r"cfgdir/config\.json: cannot read model config: expected a regular file, found a directory",
    "devzero.safetensors": r"expected a regular file, found a character device \(a symbolic link to '/dev/zero'\)",
    "fifo.safetensors": r"expected a regular file, found a FIFO \(named pipe\)",
    "loop_a.safetensors": r"loop_a\.safetensors: .*(symbolic link loop|no such file)",
    "empty.bin": r"empty\.bin: cannot read torch checkpoint: the file is empty",
    "empty.pt": r"empty\.pt: cannot read torch checkpoint: the file is empty",
    "empty.safetensors": r"0 bytes, shorter than the 8-byte header length field",
    "evil.bin": r"refusing to unpickle: .*needs code to load: it calls posix\.system",
    "evil_torch_zip.pt": r"refusing to unpickle: .*needs code to load: it calls posix\.system",
    "evil_torch_legacy.pt": r"refusing to unpickle: expected .*needs code to load: it calls posix\.system",
    "evil_plain_pickle.pt": r"refusing to unpickle: a plain pickle, not torch\.save output: .*posix\.system",
    "not_a_pickle.pt": r"expected a torch\.save checkpoint .*found a text file$",
    "zip_junk.bin": r"expected a well-formed pickle \(archive/data\.pkl in the zip archive\), found it garbled",
    "zip_random.bin": r"found a zip archive without \*/data\.pkl \(1 member, none of them \*/data\.pkl\)",
    "zip_truncated.pt": r"found a corrupt or truncated zip archive of 200 bytes",
    "hf_badjson": r"hf_badjson/config\.json:1: invalid JSON in model config",
    "hf_deep": r"hf_deep/config\.json: model config nests lists/objects 100000 levels deep; at most 100",
    "hf_empty": r"hf_empty/config\.json: model config is empty \(0 bytes\)",
    "hf_escape": r"unknown model_type '\\x1b\[31mred\\x1b\]0;title\\x07\\n::error",
    "hf_huge_layers": r"num_hidden_layers is 100000: normaudit refuses configs with more than 1024 layers",
    "hf_list": r"a model config must be a JSON object, found a JSON list",
    "hf_neg_hidden": r"hidden_size is -8: expected a count of 0 or more",
    "hf_noconfig": r"hf_noconfig: no config\.json in this directory",
    "hf_nonutf8": r"model config is not UTF-8 text: byte 0xff at offset 20",
    "hf_remote_code": r"custom model code \(auto_map\) for model_type 'custom'",
    "hf_unknown_type": r"unknown model_type 'no-such-model'",
    "shard_abs": r"expected shard files inside the index's folder, found '/.*good\.safetensors'",
    "shard_outside": r"found '\.\./\.\./\.\./\.\./\.\./\.\./\.\./\.\./etc/passwd' \(holding 1 tensor\), which leaves it",
    "shard_pt_outside": r"found '\.\./good\.pt' \(holding 1 tensor\), which leaves it",
    "shard_st_outside": r"found '\.\./good\.safetensors' \(holding 1 tensor\), which leaves it",
    "shard_devzero": r"shard 'model-00001-of-00001\.safetensors' .*found a character device",
    "shard_dir_as_shard": r"shard 'model-00001-of-00001\.safetensors' .*found a directory",
    "shard_missing": r"missing shard 'model-00001-of-00002\.safetensors' \(holding 1 tensor\)",
    "shard_nonstr": r"expected the shard of 'norm\.weight' to be a file name, found 5",
    "shard_weird_map": r"no 'weight_map' object: .*found 'weight_map' as a JSON array",
    "st_3bytes.safetensors": r"3 bytes, shorter than the 8-byte header length field",
    "st_bad_dtype.safetensors": r"its header is valid JSON, but the safetensors library refuses an entry: unknown variant `F99`",
    "st_deep_json.safetensors": r"safetensors header nests lists/objects 100000 levels deep",
    "st_dtype_size_mismatch.safetensors": r"unreadable safetensors file: .*invalid shape, data type, or offset",
    "st_header_list.safetensors": r"expected a JSON object \(tensor name -> dtype, shape, data_offsets\), found a JSON array",
    "st_header_nonutf8.safetensors": r"safetensors header is not UTF-8 text",
    "st_header_not_json.safetensors": r"corrupted safetensors header: not valid JSON",
    "st_header_only.safetensors": r"describes 1352 bytes of tensor data but only 0 follow it",
    "st_len_100MB.safetensors": r"header length field says 104857600 bytes of JSON header, but the file holds 2024",
    "st_len_huge.safetensors": r"header length field says 9223372036854775808 bytes",
    "st_len_max.safetensors": r"header length field says 18446744073709551615 bytes",
    "st_len_past_eof.safetensors": r"header length field says 2132 bytes of JSON header, but the file holds 2024",
    "st_len_zero.safetensors": r"header length field says 0 bytes",
    "st_meta_deep_config.safetensors": r"__metadata__ entry 'config' nests lists/objects 5000 levels deep",
    "st_metadata_nonstr.safetensors": r"expected __metadata__ to map names to strings",
    "st_offset_negative.safetensors": r"entry 'encoder\.layer\.0\.LayerNorm\.weight' lacks a valid .*\[-64, 0\]",
    "st_offset_reversed.safetensors": r"entry 'encoder\.layer\.0\.LayerNorm\.weight' lacks a valid .*\[64, 0\]",
    "st_offset_past_eof.safetensors": r"describes 1000000000064 bytes of tensor data but only 1352",
    "st_overlap.safetensors": r"unreadable safetensors file: .*invalid offset",
    "st_shape_huge.safetensors": r"unreadable safetensors file: .*overflow",
    "st_shape_negative.safetensors": r"entry .encoder\.layer\.0\.LayerNorm\.weight. lacks a valid .*\"shape\": \[-16\]",
    "st_shape_string.safetensors": r"lacks a valid dtype, shape or data_offsets: .*\"shape\": \"sixteen\"",
    "st_truncated_data.safetensors": r"describes 1352 bytes of tensor data but only 676 follow it",
    "zero_config.json": r"zero_config\.json: model config is empty \(0 bytes\)",
}

#: --checkpoint (the files a model can be audited with); the same expectations as targets, except these
AS_CHECKPOINT_EXTRA = {"hf_llama_tiny": r"hf_llama_tiny: no weights found in directory"}
# (a symlink loop fails the command line's check that --checkpoint exists, before any target: see
# test_checkpoint_symlink_loop)
CHECKPOINTS = [n for n in AS_TARGET if (n.endswith((".safetensors", ".pt", ".bin")) or n.startswith(("shard_", "dirloop")))
               and n != "loop_a.safetensors"]

#: --config: the config files (and things given as one), each a regex of the one error line
AS_CONFIG = {
    "bomb.yaml": r"bomb\.yaml: config refused: its aliases expand it to over 1000000 nodes",
    "python_tag.yaml": r"python_tag\.yaml:1: config refused: .*found the tag 'tag:yaml\.org,2002:python/object/apply:os\.system'",
    "zero_config.json": r"zero_config\.json: config is empty \(0 bytes\)",
    "fifo.safetensors": r"fifo\.safetensors: cannot read config: expected a regular file, found a FIFO",
    "cfgdir/config.json": r"cfgdir/config\.json: cannot read config: expected a regular file, found a directory",
    "hf_deep/config.json": r"hf_deep/config\.json: config nests lists/objects 100000 levels deep",
    "hf_badjson/config.json": r"hf_badjson/config\.json:1: invalid JSON in config",
    "hf_empty/config.json": r"hf_empty/config\.json: config is empty",
    "hf_list/config.json": r"hf_list/config\.json: config must be a mapping \(key: value\), found a list",
    "hf_nonutf8/config.json": r"hf_nonutf8/config\.json:1: config is not UTF-8 text",
    "devzero.safetensors": r"devzero\.safetensors: cannot read config: expected a regular file, found a character device",
    "loop_a.safetensors": r"loop_a\.safetensors: cannot read config: expected a regular file, found a symbolic link loop",
}

MODEL = '''
import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.LayerNorm = nn.LayerNorm(16)
        self.dense = nn.Linear(16, 16)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList([Layer()])


class Net(nn.Module):
    """The model the generator's checkpoints were saved from (same keys and shapes)."""

    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.bn = nn.BatchNorm1d(8)
        self.norm = nn.RMSNorm(16)

    def forward(self, x):
        layer = self.encoder.layer[0]
        h = self.norm(layer.dense(layer.LayerNorm(x)))
        return h, self.bn(h[:, :8])


def build_model():
    return Net()


def example_inputs():
    return (torch.randn(4, 16),)
'''


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_bad_ckpts", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """The generator's files, written into a fresh folder (read-only afterwards for the tests)."""
    root = tmp_path_factory.mktemp("bad-inputs")
    _load_generator().make_all(str(root))
    return root


def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (not following symlinks) with its type, size and mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size if not os.path.isdir(p) else 0, st.st_mtime_ns)
    return out


def _run(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("NORMAUDIT_DEBUG", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "normaudit", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - started


def _check_multi(proc: subprocess.CompletedProcess, expected: dict[str, object], shown: dict[str, str]) -> None:
    """One run over several targets: every failing one has exactly one error line (and one JSON error entry)
    matching its regex, every other one a report; no traceback, no internal error."""
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    errors = {e["target"]: e for e in doc["errors"]}
    reported = {r["target"]["path"] for r in doc["reports"]}
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("normaudit: error: ")]
    for name, pattern in expected.items():
        target = shown[name]
        if pattern is None:
            assert target in reported, (name, errors.get(target))
            continue
        assert target in errors and errors[target]["status"] == 2, (name, sorted(reported))
        message = errors[target]["message"]
        assert re.search(pattern, message), (name, message)
        assert "\x1b" not in message and "\n" not in message, (name, message)
        mine = [ln for ln in lines if ln == f"normaudit: error: {message}"]
        assert len(mine) == 1, (name, lines)
    assert len(lines) == sum(p is not None for p in expected.values()), lines
    assert proc.returncode == 2


def _no_harm(bad: Path, before: dict) -> None:
    assert not list(bad.rglob("PWNED_*")), "code from a checkpoint or config ran"
    assert _snapshot(bad) == before, "a file was written or modified"


def test_every_generated_file_as_a_target(bad, tmp_path):
    """All generated files as TARGETs of one run (JSON report on stdout, one error line per bad file)."""
    assert set(AS_TARGET) <= {p.name for p in bad.iterdir()} | {"loop_a.safetensors"}
    before = _snapshot(bad)
    names = list(AS_TARGET)
    proc, took = _run([*names, "--format", "json", "--isolated"], bad)
    _check_multi(proc, AS_TARGET, {n: n for n in names})
    _no_harm(bad, before)
    assert took < PROCESS_TIMEOUT


def test_every_checkpoint_as_checkpoint_of_a_model(bad, tmp_path):
    """Each checkpoint-like file as the --checkpoint of a model (one target per checkpoint, from a settings
    file), and hf_llama_tiny/config.json as the --config of all of them."""
    model = tmp_path / "net.py"
    model.write_text(MODEL)
    expected = {n: AS_CHECKPOINT_EXTRA.get(n, AS_TARGET[n]) for n in [*CHECKPOINTS, "hf_llama_tiny"]}
    entries = ",\n".join(f'  {{path = "{model}", checkpoint = "{bad / n}"}}' for n in expected)
    settings = tmp_path / "normaudit.toml"
    settings.write_text(f"targets = [\n{entries}\n]\n")
    before = _snapshot(bad)
    proc, _ = _run(["--settings", str(settings), "--config", str(bad / "hf_llama_tiny" / "config.json"),
                    "--format", "json"], tmp_path)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    # every target is net.py: each error message names its checkpoint file
    messages = [e["message"] for e in doc["errors"]]
    assert all(e["status"] == 2 for e in doc["errors"])
    assert len(messages) == sum(p is not None for p in expected.values()), messages
    assert len(doc["reports"]) == sum(p is None for p in expected.values())
    for name, pattern in expected.items():
        if pattern is None:
            continue
        mine = [m for m in messages if re.match(rf"(\S*/)?{re.escape(name)}[/:]", m) and re.search(pattern, m)]
        assert len(mine) == 1, (name, [m for m in messages if name in m])
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("normaudit: error: ")]
    assert sorted(lines) == sorted(f"normaudit: error: {m}" for m in messages)
    assert all(r["target"]["checkpoint"] for r in doc["reports"])
    _no_harm(bad, before)


def test_checkpoint_flag_refuses_a_fifo_at_once(bad, tmp_path):
    """The --checkpoint flag itself (not a settings table): a FIFO is refused, never opened."""
    model = tmp_path / "net.py"
    model.write_text(MODEL)
    proc, _ = _run([str(model), "--checkpoint", str(bad / "fifo.safetensors"), "--isolated"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert re.search(r"fifo\.safetensors: cannot read (safetensors )?checkpoint: expected a regular file, found a FIFO",
                     lines[0]), lines


def test_checkpoint_symlink_loop(bad, capsys, monkeypatch):
    monkeypatch.chdir(bad)
    rc = main(["good.safetensors", "--checkpoint", "loop_a.safetensors", "--isolated"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("normaudit: error: loop_a.safetensors: "), err


def test_yaml_bomb_config_through_the_cli(bad, tmp_path):
    """The billion-laughs YAML as --config: one line, exit 2, at once (before any model is built)."""
    before = _snapshot(bad)
    proc, _ = _run(["good.safetensors", "--config", "bomb.yaml", "--isolated"], bad)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "normaudit: error: bomb.yaml: config refused: its aliases expand it to over 1000000 nodes (expected "
        "plain data; YAML aliases may repeat at most 1000000 nodes in all)"]
    _no_harm(bad, before)


@pytest.mark.parametrize("name", sorted(AS_CONFIG))
def test_each_bad_config(bad, name, capsys, monkeypatch):
    """Each bad --config through the command line's entry point (in this process: the config is refused
    before any model is built, so no interpreter start is needed per file)."""
    monkeypatch.chdir(bad)
    before = _snapshot(bad)
    rc = main(["good.safetensors", "--config", name, "--isolated"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("normaudit: error: "), err
    assert re.search(AS_CONFIG[name], lines[0]), lines[0]
    _no_harm(bad, before)


# ------------------------------------------------------------------- HF configs beyond the generator's
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "rms_norm_eps": 1e-6}


def _hf(tmp_path: Path, data: dict) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(data))
    return d


@pytest.mark.parametrize("extra, kernel", [
    ({"attn_implementation": "flash_attention_2"}, "flash_attention_2"),
    ({"_attn_implementation": "flash_attention_3"}, "flash_attention_3"),
    ({"attn_implementation": "kernels-community/flash-attn"}, "kernels-community/flash-attn"),
])
def test_flash_attention_config_is_audited_with_sdpa(tmp_path, extra, kernel):
    from normaudit.loaders.hf import load_hf_target

    for target in (_hf(tmp_path, dict(TINY_LLAMA, **extra)), tmp_path / "m" / "config.json"):
        mua = load_hf_target(target)
        assert mua.model.config._attn_implementation == "sdpa"
        assert mua.notes == [f"the config asks for attn_implementation {kernel!r}, which cannot run in the capture "
                             "(CPU, no weights): audited with 'sdpa' attention instead; the norms do not depend "
                             "on the attention kernel"]


def test_auto_map_of_a_builtin_model_type_audits_the_builtin_class(tmp_path):
    from normaudit.loaders.hf import load_hf_target

    d = _hf(tmp_path, dict(TINY_LLAMA, auto_map={"AutoModel": "modeling_x.XModel"}, architectures=["XModel"]))
    (d / "modeling_x.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w').write('ran')\n")
    mua = load_hf_target(d)
    assert type(mua.model).__name__ == "LlamaModel" and mua.factory == "AutoModel.from_config"
    assert mua.notes == ["the config names custom model code (auto_map), which normaudit never runs: audited with "
                         "transformers' built-in 'llama' classes, which may differ from the custom code"]
    assert not (tmp_path / "PWNED").exists()


def test_bare_config_with_transformers5_special_floats(tmp_path):
    """A config.json saved by transformers 5 holds inf as {"__float__": "Infinity"} (mamba2's
    time_step_limit): the bare file builds like its directory."""
    import transformers

    from normaudit.loaders.hf import load_hf_target

    transformers.Mamba2Config(hidden_size=64, num_hidden_layers=2, vocab_size=100, num_heads=4, head_dim=32,
                              n_groups=1, state_size=16).save_pretrained(tmp_path)
    text = (tmp_path / "config.json").read_text()
    assert '"__float__": "Infinity"' in text
    for target in (tmp_path, tmp_path / "config.json"):
        mua = load_hf_target(target)
        assert type(mua.model).__name__ == "Mamba2Model"
        assert list(mua.model.config.time_step_limit) == [0.0, float("inf")]


_NOT_REAL = " (no real model has as many; building it would not finish)"


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": 1025}, "num_hidden_layers is 1025: normaudit refuses configs with more than 1024 layers"
     + _NOT_REAL),
    ({"text_config": {"num_hidden_layers": 5000}},
     "text_config.num_hidden_layers is 5000: normaudit refuses configs with more than 1024 layers" + _NOT_REAL),
    ({"num_local_experts": 100000},
     "num_local_experts is 100000: normaudit refuses configs with more than 4096 experts" + _NOT_REAL),
    ({"vocab_size": 2 ** 30},
     "vocab_size is 1073741824: normaudit refuses configs with more than 16777216 in any size" + _NOT_REAL),
    ({"hidden_size": 2 ** 20, "intermediate_size": 2 ** 22, "num_hidden_layers": 1000},
     "the config describes about 1.8e+16 parameters: normaudit refuses configs above 1e+13 (no real model is "
     "as large)"),
    ({"intermediate_size": -1}, "intermediate_size is -1: expected a count of 0 or more"),
])
def test_absurd_hf_configs_refused_before_building(tmp_path, change, message):
    from normaudit.errors import UsageError
    from normaudit.loaders.hf import load_hf_target

    d = _hf(tmp_path, dict(TINY_LLAMA, **change))
    with pytest.raises(UsageError) as info:
        load_hf_target(d)
    assert str(info.value) == f"{d / 'config.json'}: {message}"


def test_real_model_sizes_pass_the_limits():
    """The limits leave room for the largest real configs (Llama 3.1 405B, DeepSeek-V3, a 1000-layer DeepNet)."""
    from normaudit.loaders.hf import check_config_limits

    check_config_limits({"hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
                         "num_attention_heads": 128, "vocab_size": 128256}, "llama405b.json")
    check_config_limits({"hidden_size": 7168, "moe_intermediate_size": 2048, "n_routed_experts": 256,
                         "num_hidden_layers": 61, "vocab_size": 129280, "max_position_embeddings": 163840},
                        "deepseek_v3.json")
    check_config_limits({"d_model": 1024, "encoder_layers": 500, "decoder_layers": 500}, "deepnet.json")


# ------------------------------------------------------------------------------ rule templates
EVIL_RULE = """\
id: NX901
name: evil-template
category: eps
severity: info
when: "True"
message: "{template}"
fix: "nothing"
doc:
  what: a test rule
  why: a test rule
  example: none
  use_instead: none
  references: ["none"]
"""


@pytest.mark.parametrize("template", [
    "{site.__class__.__init__.__globals__}",
    "{site.__class__}",
    "{config[__class__]}",
    "{params._secret}",
    "{0}",
    "{os}",
    "{site.kind:{site.__doc__}}",
])
def test_rule_template_reaching_outside_its_namespace_is_refused_at_load(tmp_path, capsys, template):
    rules = tmp_path / "rules"
    rules.mkdir()
    path = rules / "NX901-evil.yaml"
    path.write_text(EVIL_RULE.format(template=template))
    rc = main(["rules", "--rules", str(rules)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"normaudit: error: {path}: rule NX901 field 'message': "
                                                   "template refused: "), err
    assert "environ" not in err and "PATH" not in err


def test_template_formatter_walks_facts_only():
    from normaudit.engine.evaluator import TemplateError, _format, _Namespace

    names = {"options": _Namespace(dtype="float16"), "params": _Namespace(n=3), "site": None,
             "config": _Namespace(layer_norm_eps=1e-5, items=[1, 2])}
    assert _format("{options.dtype} {params[n]} {config.layer_norm_eps:.0e} {config[items][1]}", names) == \
        "float16 3 1e-05 2"
    for template in ("{config.get.__self__}", "{config.get.x}", "{options.__class__}", "{params[_x]}", "{}"):
        with pytest.raises((TemplateError, KeyError)):
            _format(template, names)


def test_rule_file_that_is_a_fifo_or_yaml_bomb_is_refused(tmp_path, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    os.mkfifo(rules / "NX902-pipe.yaml")
    rc = main(["rules", "--rules", str(rules)])
    _, err = capsys.readouterr()
    assert rc == 2 and "NX902-pipe.yaml: cannot read rule file: expected a regular file, found a FIFO" in err
    (rules / "NX902-pipe.yaml").unlink()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh"))
    (rules / "NX903-bomb.yaml").write_text(bomb)
    rc = main(["rules", "--rules", str(rules)])
    _, err = capsys.readouterr()
    assert rc == 2 and "NX903-bomb.yaml: rule file refused: its aliases expand it to over 1000000 nodes" in err
