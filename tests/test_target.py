"""Loading a model file: factories, input inference, and one-line errors naming the user's file and line."""
from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from normaudit.errors import UsageError
from normaudit.loaders.inputs import infer_inputs
from normaudit.loaders.pyfile import load_python_target


def _write(tmp_path, body: str, name: str = "model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.parametrize("first, shape, dtype", [
    (nn.Embedding(50, 8), (2, 16), torch.int64),
    (nn.Conv2d(3, 8, 3), (2, 3, 64, 64), torch.float32),
    (nn.Conv1d(4, 8, 3), (2, 4, 64), torch.float32),
    (nn.Linear(20, 8), (2, 20), torch.float32),
])
def test_inputs_inferred_from_first_layer(first, shape, dtype):
    inputs, text = infer_inputs(nn.Sequential(first, nn.ReLU()))
    assert tuple(inputs[0].shape) == shape and inputs[0].dtype == dtype
    assert type(first).__name__ in text
    if isinstance(first, nn.Embedding):
        assert int(inputs[0].max()) < 50


def test_model_is_built_on_meta_and_factory_can_be_named(tmp_path):
    path = _write(tmp_path, """
        import torch
        from torch import nn
        def make():
            return nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    """)
    loaded = load_python_target(f"{path}:make")
    assert loaded.on_meta and loaded.factory == "make" and loaded.inputs is None
    assert next(loaded.model.parameters()).device.type == "meta"
    origin = loaded.origins[id(loaded.model[1])]
    assert origin.file == str(path) and origin.line == 5
    assert not (tmp_path / "__pycache__").exists()


def test_factory_needing_real_tensors_is_built_for_real(tmp_path):
    path = _write(tmp_path, """
        import torch
        from torch import nn
        def build_model():
            m = nn.Linear(4, 4)
            assert float(m.weight.abs().sum()) >= 0   # needs real data
            return m
    """)
    loaded = load_python_target(str(path))
    assert loaded.on_meta is False


@pytest.mark.parametrize("body, line, text", [
    ("import torch\ndef build_model(:\n", 2, "import failed: SyntaxError"),
    ("import torch\nx = 1\n", None, "no callable build_model()"),
    ("def build_model():\n    return 3\n", None, "build_model() returned int, not a torch.nn.Module"),
    ("from torch import nn\ndef build_model():\n    return nn.GroupNorm(3, 16)\n", 3,
     "build_model() failed: ValueError: num_channels (16) must be divisible by num_groups (3) (raised in torch.nn GroupNorm)"),
    ("from torch import nn\ndef build_model():\n    return nn.Linear(2, 2)\ndef example_inputs():\n    raise RuntimeError('no data')\n",
     5, "example_inputs() failed: RuntimeError: no data"),
])
def test_bad_model_files_give_one_line_errors(tmp_path, body, line, text):
    path = _write(tmp_path, body)
    with pytest.raises(UsageError) as info:
        load_python_target(str(path))
    err = info.value
    assert err.file == str(path.resolve()) or err.file == str(path)
    assert err.line == line
    assert text in str(err) and "\n" not in str(err)


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load_python_target(str(tmp_path / "nope.py"))


def test_yaml_config_reads_exponent_floats_as_numbers(tmp_path):
    from normaudit.loaders.config import load_config

    path = tmp_path / "cfg.yaml"
    path.write_text("layer_norm_eps: 1e-6\nnested: {rms_norm_eps: 1E-5, name: '1e-6 apart'}\nhidden: 32\n")
    assert load_config(path) == {"layer_norm_eps": 1e-6, "nested": {"rms_norm_eps": 1e-5, "name": "1e-6 apart"},
                                 "hidden": 32}


def test_empty_torch_checkpoint_says_why(tmp_path):
    from normaudit.loaders.checkpoint import open_checkpoint

    path = tmp_path / "empty.pt"
    path.write_bytes(b"")
    with pytest.raises(UsageError) as info:
        open_checkpoint(path)
    assert str(info.value).endswith("empty.pt: cannot read torch checkpoint: the file is empty")
