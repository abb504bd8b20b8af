"""Property tests of every checkpoint and config reader on mutated files: random byte flips,
truncations, header lengths, nesting depth and names. The property: the reader returns a result or raises
UsageError (exit 2) with a one-line message; never another exception (exit 3) and never a hang.

The readers are called in this process (fast). Profiles: ``ci`` (the default: a few seconds in all,
derandomised so a run is reproducible) and ``long`` (``HYPOTHESIS_PROFILE=long python -m pytest
tests/test_fuzz_readers.py``: thousands of cases per reader). benchmarks/fuzz_readers.py runs mutated files
through the command line instead and counts outcomes.
"""
from __future__ import annotations

import atexit
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from normaudit.errors import UsageError  # noqa: E402
from normaudit.loaders.checkpoint import inspect_norm_params, open_checkpoint, scan_pickle  # noqa: E402
from normaudit.loaders.config import load_config  # noqa: E402
from normaudit.loaders.hf import _read_json, check_config_limits, requested_attention  # noqa: E402
from normaudit.loaders.safe_read import MAX_NESTING, json_nesting, loads_json, loads_yaml  # noqa: E402

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("long", max_examples=2000, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

_WORK = Path(tempfile.mkdtemp(prefix="normaudit-fuzz-"))
atexit.register(shutil.rmtree, _WORK, True)


@pytest.fixture(scope="module")
def seeds() -> dict[str, bytes]:
    """Well-formed files to mutate: a safetensors file, a torch.save zip and legacy file, an index."""
    import torch
    from safetensors.torch import save_file

    state = {"encoder.layer.0.LayerNorm.weight": torch.ones(16), "encoder.layer.0.LayerNorm.bias": torch.zeros(16),
             "encoder.layer.0.dense.weight": torch.randn(4, 16), "bn.running_mean": torch.zeros(8),
             "bn.running_var": torch.ones(8), "bn.weight": torch.ones(8), "norm.weight": torch.ones(16)}
    d = _WORK / "seeds"
    d.mkdir(exist_ok=True)
    save_file(state, d / "a.safetensors", metadata={"format": "pt", "config": json.dumps({"rms_norm_eps": 1e-6})})
    torch.save(state, d / "a.pt")
    torch.save(state, d / "legacy.pt", _use_new_zipfile_serialization=False)
    return {name: (d / name).read_bytes() for name in ("a.safetensors", "a.pt", "legacy.pt")}


@st.composite
def mutated(draw, blob: bytes) -> bytes:
    """``blob`` with a few of: byte flips, a truncation, a random span inserted, the first 8 bytes replaced."""
    data = bytearray(blob)
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "length"]))
        if kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif kind == "insert":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(max_size=16))
        elif kind == "length":
            n = draw(st.one_of(st.integers(0, 2 ** 64 - 1), st.integers(0, len(data) + 16)))
            data[:8] = struct.pack("<Q", n)
    return bytes(data)


def _open_and_inspect(path: Path) -> None:
    """The property: a result, or UsageError with one line naming the file."""
    try:
        with open_checkpoint(path) as ckpt:
            groups = inspect_norm_params(ckpt)
            assert isinstance(groups, list)
            _ = ckpt.config
    except UsageError as err:
        text = str(err)
        assert "\n" not in text and "\x1b" not in text
        assert path.name in text


def _write(name: str, data: bytes) -> Path:
    path = _WORK / name
    path.write_bytes(data)
    return path


@settings(PROFILE)
@given(data=st.data())
def test_safetensors_reader(seeds, data):
    _open_and_inspect(_write("m.safetensors", data.draw(mutated(seeds["a.safetensors"]))))


@settings(PROFILE)
@given(header=st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                           max_leaves=20),
       payload=st.binary(max_size=64))
def test_safetensors_reader_random_headers(header, payload):
    """Any JSON value as the header (odd dtypes, shapes, offsets, names, __metadata__)."""
    raw = json.dumps(header).encode()
    _open_and_inspect(_write("h.safetensors", struct.pack("<Q", len(raw)) + raw + payload))


@settings(PROFILE)
@given(depth=st.integers(0, 20000), kind=st.sampled_from(["header", "metadata"]))
def test_safetensors_nesting(depth, kind):
    nest = "[" * depth + "]" * depth
    if kind == "header":
        raw = ('{"x": ' + nest + "}").encode()
    else:
        raw = json.dumps({"__metadata__": {"config": nest}}).encode()
    _open_and_inspect(_write("n.safetensors", struct.pack("<Q", len(raw)) + raw))


@settings(PROFILE)
@given(data=st.data(), seed=st.sampled_from(["a.pt", "legacy.pt"]), suffix=st.sampled_from([".pt", ".bin"]))
def test_torch_reader(seeds, data, seed, suffix):
    _open_and_inspect(_write("m" + suffix, data.draw(mutated(seeds[seed]))))


@settings(PROFILE)
@given(blob=st.binary(max_size=256))
def test_pickle_scanner_never_raises(blob):
    found, corrupt, count = scan_pickle(blob)
    assert isinstance(found, list) and (corrupt is None or isinstance(corrupt, str)) and count >= 0


_SHARD_NAMES = st.one_of(st.text(max_size=24), st.sampled_from(
    ["a.safetensors", "../a.safetensors", "/etc/passwd", "sub/../../a.safetensors", "a.pt", "C:\\x.bin", "", "."]),
    st.integers(), st.none(), st.lists(st.integers(), max_size=2))


@settings(PROFILE)
@given(wmap=st.one_of(st.dictionaries(st.text(max_size=24), _SHARD_NAMES, max_size=4), st.lists(st.integers()),
                      st.text(max_size=8), st.none()),
       top=st.sampled_from(["weight_map", "weights", None]))
def test_sharded_index_reader(seeds, wmap, top):
    d = _WORK / "idx"
    d.mkdir(exist_ok=True)
    (d / "a.safetensors").write_bytes(seeds["a.safetensors"])
    (d / "a.pt").write_bytes(seeds["a.pt"])
    path = d / "model.safetensors.index.json"
    path.write_text(json.dumps({top: wmap} if top else wmap))
    _open_and_inspect(path)


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=5),
                     max_leaves=30)
_HF_KEYS = st.sampled_from(["model_type", "num_hidden_layers", "hidden_size", "vocab_size", "num_local_experts",
                            "attn_implementation", "_attn_implementation", "text_config", "auto_map", "n_layer"])


@settings(PROFILE)
@given(config=st.dictionaries(_HF_KEYS, st.one_of(_JSON, st.integers(-2 ** 70, 2 ** 70)), max_size=6),
       blob=st.one_of(st.none(), st.binary(max_size=64)))
def test_hf_config_readers(config, blob):
    """The readers an HF target runs before building: the JSON reader, the limits, the attention request."""
    path = _write("config.json", blob if blob is not None else json.dumps(config).encode())
    try:
        data = _read_json(path)
        check_config_limits(data, str(path))
        requested_attention(data)
    except UsageError as err:
        assert "\n" not in str(err)


@settings(PROFILE)
@given(data=st.data(), suffix=st.sampled_from([".json", ".yaml"]))
def test_load_config(data, suffix):
    value = data.draw(_JSON)
    if suffix == ".json":
        text = json.dumps(value).encode()
    else:
        import yaml

        text = yaml.safe_dump(value).encode()
    path = _write("c" + suffix, data.draw(mutated(text)))
    try:
        assert isinstance(load_config(path), dict)
    except UsageError as err:
        assert "\n" not in str(err) and path.name in str(err)


@settings(PROFILE)
@given(depth=st.integers(0, 5000), opener=st.sampled_from(["[", "{\"a\": ", "- "]), suffix=st.sampled_from(["json", "yaml"]))
def test_nesting_depth_bounded(depth, opener, suffix):
    if opener == "- ":
        text = "".join("  " * i + "- \n" for i in range(depth)) + "  " * depth + "1\n"
    else:
        closer = "]" if opener == "[" else "}"
        text = opener * depth + "1" + closer * depth
    load = loads_json if suffix == "json" else loads_yaml
    try:
        load(text, "config", "c")
        assert depth <= MAX_NESTING + 1 or opener == "- "
    except UsageError as err:
        assert "\n" not in str(err)


@settings(PROFILE)
@given(fanout=st.integers(1, 12), levels=st.integers(1, 9))
def test_yaml_aliases_bounded(fanout, levels):
    """Alias chains: accepted while small, refused (not expanded) once past the node limit."""
    lines = [f"l0: &l0 [{', '.join(['x'] * fanout)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]")
    expanded = sum(fanout ** (i + 1) for i in range(levels))
    try:
        data = loads_yaml("\n".join(lines), "config", "c.yaml")
        assert expanded <= 1_000_000 and isinstance(data, dict)
    except UsageError as err:
        assert "aliases expand it to over 1000000 nodes" in str(err) and expanded > 1_000_000 // 2


@settings(PROFILE)
@given(text=st.text(alphabet="[]{}\"\\ a,", max_size=200))
def test_json_nesting_is_an_upper_bound_of_parsers_depth(text):
    depth = json_nesting(text)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return
    assert _depth(value) <= depth


def _depth(value) -> int:
    if isinstance(value, (list, dict)):
        children = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(c) for c in children), default=0)
    return 0
