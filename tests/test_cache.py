"""The result cache (normaudit.cache): a re-run on unchanged inputs is answered from the cache with the same
report; a change of any key part (target file, a local file it imports, config, checkpoint header, options,
rules, versions) is a miss; entries are JSON; an unwritable cache is skipped; never inside site-packages.

Whether the model ran is seen from the line its ``build_model()`` prints on stderr."""
from __future__ import annotations

import json
import os
import shutil
import site
import textwrap
from pathlib import Path

import pytest
import torch

from normaudit import cache as cache_mod
from normaudit.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "cli"
BUILT = "BUILT-MODEL"

MODEL = textwrap.dedent(f'''
    import sys
    import torch
    from torch import nn
    from helper import HIDDEN


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(HIDDEN, HIDDEN)
            self.norm = nn.LayerNorm(HIDDEN, eps=1e-5)

        def forward(self, x):
            return self.norm(x + self.proj(x))


    def build_model():
        print("{BUILT}", file=sys.stderr)
        return Net()


    def example_inputs():
        return (torch.randn(2, 4, HIDDEN),)
''')


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project: model.py importing helper.py, test rules, a config and a checkpoint; the cache on, in
    tmp_path/cache, with normaudit's own source digest fixed and the test rules alone (other edits of the
    checkout must not count)."""
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / "helper.py").write_text("HIDDEN = 8\n")
    shutil.copytree(FIXTURES / "rules", tmp_path / "rules")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "layer_norm_eps": 1e-5}))
    from safetensors.torch import save_file

    save_file({"norm.weight": torch.ones(8), "norm.bias": torch.zeros(8)}, str(tmp_path / "w.safetensors"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NORMAUDIT_NO_CACHE", raising=False)
    monkeypatch.setenv("NORMAUDIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_mod, "source_digest", lambda: "fixed")
    # Only the test rules: an edit of a shipped rule by someone working on the checkout is no miss here.
    from normaudit.engine import loader

    (tmp_path / "no_shipped_rules").mkdir()
    monkeypatch.setattr(loader, "builtin_rules_dir", lambda: tmp_path / "no_shipped_rules")
    return tmp_path


ARGS = ["model.py", "--rules", "rules", "--select", "NZ", "--isolated", "--format", "json"]


def audit(capfd, *extra: str) -> tuple[int, dict, bool]:
    """Run the CLI; (exit status, the JSON report, whether the model was built)."""
    rc = main(ARGS + list(extra))
    out, err = capfd.readouterr()
    return rc, json.loads(out), BUILT in err


def test_rerun_is_answered_from_the_cache_with_the_same_report(project, capfd):
    rc1, first, built1 = audit(capfd)
    rc2, second, built2 = audit(capfd)
    assert (rc1, built1) == (1, True)
    assert (rc2, built2) == (1, False)
    assert second == first
    assert [(s["module"], s["kind"], s["eps"]) for s in second["sites"]] == [("norm", "LayerNorm", 1e-5)]
    assert [(f["rule_id"], f["module"]) for f in second["findings"]] == [("NZ001", "norm")]


def test_no_cache_neither_reads_nor_writes(project, capfd):
    assert audit(capfd, "--no-cache")[2] is True
    assert audit(capfd, "--no-cache")[2] is True
    assert not (project / "cache").exists()


def _edit_model(project):
    (project / "model.py").write_text(MODEL.replace("eps=1e-5", "eps=1e-6"))


def _edit_helper(project):
    (project / "helper.py").write_text("HIDDEN = 16\n")


def _edit_rules(project):
    rule = project / "rules" / "NZ001-test-layernorm.yaml"
    rule.write_text(rule.read_text().replace("is a LayerNorm", "is a LayerNorm (edited)"))


def _edit_config(project):
    (project / "config.json").write_text(json.dumps({"hidden_size": 8, "layer_norm_eps": 1e-6}))


def _edit_checkpoint_header(project):
    from safetensors.torch import save_file

    save_file({"norm.weight": torch.ones(8), "norm.bias": torch.zeros(8)}, str(project / "w.safetensors"),
              metadata={"format": "pt"})


def _bump_version(project):
    import normaudit

    normaudit.__version__ = "99.0"


@pytest.mark.parametrize("change, extra, model_changes", [
    (_edit_model, [], ("norm", 1e-6)),
    (_edit_helper, [], ("norm", 1e-5)),
    (_edit_rules, [], ("norm", 1e-5)),
    (_edit_config, ["--config", "config.json"], ("norm", 1e-5)),
    (_edit_checkpoint_header, ["--checkpoint", "w.safetensors"], ("norm", 1e-5)),
    (_bump_version, [], ("norm", 1e-5)),
], ids=["target", "imported-file", "rules", "config", "checkpoint-header", "normaudit-version"])
def test_each_key_part_changed_is_a_miss(project, capfd, monkeypatch, change, extra, model_changes):
    import normaudit

    monkeypatch.setattr(normaudit, "__version__", normaudit.__version__)
    assert audit(capfd, *extra)[2] is True
    assert audit(capfd, *extra)[2] is False
    change(project)
    rc, report, built = audit(capfd, *extra)
    assert built is True
    assert (report["sites"][0]["module"], report["sites"][0]["eps"]) == model_changes
    if change is _edit_rules:
        assert report["findings"][0]["message"] == "norm is a LayerNorm (edited)"
    assert audit(capfd, *extra)[2] is False  # the new inputs are cached in turn


@pytest.mark.parametrize("option", [["--dtype", "bfloat16"], ["--select", "NZ001"], ["--input-axes", "B,S,F"],
                                    ["--ignore", "NZ002"]])
def test_changed_options_are_a_miss(project, capfd, option):
    assert audit(capfd)[2] is True
    assert audit(capfd, *option)[2] is True
    assert audit(capfd, *option)[2] is False


def test_torch_and_transformers_versions_are_in_the_key(project, capfd, monkeypatch):
    assert audit(capfd)[2] is True
    real = cache_mod._distribution_version
    for name in ("torch", "transformers"):
        monkeypatch.setattr(cache_mod, "_distribution_version",
                            lambda dist, name=name: "0.0-other" if dist == name else real(dist))
        assert audit(capfd)[2] is True, name
        assert audit(capfd)[2] is False, name


def test_weights_rewritten_under_the_same_header_are_a_miss_by_size_and_mtime(project, capfd, monkeypatch):
    """Above WHOLE_FILE_BYTES a checkpoint is keyed by its header, size and mtime, never its whole weights."""
    monkeypatch.setattr(cache_mod, "WHOLE_FILE_BYTES", 0)
    ckpt = project / "w.safetensors"
    assert audit(capfd, "--checkpoint", "w.safetensors")[2] is True
    before = cache_mod.file_fingerprint(ckpt)
    data = bytearray(ckpt.read_bytes())
    data[-1] ^= 0x01  # one weight byte, the header untouched
    ckpt.write_bytes(bytes(data))
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 10**9))
    after = cache_mod.file_fingerprint(ckpt)
    assert before.split(":")[2] == after.split(":")[2]  # the same header digest
    assert before != after
    assert audit(capfd, "--checkpoint", "w.safetensors")[2] is True


def test_entries_are_json_reports_not_pickles(project, capfd):
    audit(capfd)
    entries = list((project / "cache").rglob("*.json"))
    assert len(entries) == 1
    entry = json.loads(entries[0].read_text())
    assert set(entry) == {"format", "key", "imported", "environ", "report"}
    assert entry["environ"] == {}                        # the model files read no environment variable
    assert list(entry["imported"]) == [str((project / name).resolve()) for name in ("helper.py", "model.py")]
    assert json.loads(entry["report"])["sites"][0]["module"] == "norm"
    assert (project / "cache" / ".gitignore").read_text().endswith("*\n")
    assert (project / "cache" / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55")


def test_a_corrupt_entry_is_a_miss_and_is_replaced(project, capfd):
    audit(capfd)
    entry = next((project / "cache").rglob("*.json"))
    entry.write_text("{not json")
    assert audit(capfd)[2] is True
    assert audit(capfd)[2] is False


def test_an_unwritable_cache_is_skipped_silently_and_noted_with_verbose(project, capfd, monkeypatch):
    (project / "blocker").write_text("a file where the cache directory would go")
    monkeypatch.setenv("NORMAUDIT_CACHE_DIR", str(project / "blocker" / "cache"))
    rc = main(ARGS)
    out, err = capfd.readouterr()
    assert rc == 1 and json.loads(out)["sites"][0]["module"] == "norm"
    assert [ln for ln in err.splitlines() if ln.startswith("normaudit")] == []
    rc = main(ARGS + ["-v"])
    out, err = capfd.readouterr()
    notes = [ln for ln in err.splitlines() if ln.startswith("normaudit")]
    assert rc == 1
    assert notes[0].startswith(f"normaudit: cache {project / 'blocker' / 'cache'} not writable (")
    assert notes[1] == f"normaudit: cache {project / 'blocker' / 'cache'}: 0 of 1 target(s) answered"


def test_cache_directory_beside_the_settings_file_else_xdg_never_site_packages(tmp_path, monkeypatch):
    monkeypatch.delenv("NORMAUDIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    settings = tmp_path / "proj" / "pyproject.toml"
    settings.parent.mkdir()
    settings.write_text("[tool.normaudit]\n")
    assert cache_mod.default_cache_dir(settings) == (tmp_path / "proj" / ".normaudit_cache").resolve()
    assert cache_mod.default_cache_dir(None) == tmp_path / "xdg" / "normaudit"
    packages = Path(site.getsitepackages()[0])
    monkeypatch.setenv("NORMAUDIT_CACHE_DIR", str(packages / "normaudit_cache"))
    assert cache_mod.default_cache_dir(None) == tmp_path / "xdg" / "normaudit"
    monkeypatch.setenv("XDG_CACHE_HOME", str(packages))
    assert cache_mod.default_cache_dir(None) is None
    assert cache_mod.default_cache_dir(packages / "some_pkg" / "pyproject.toml") is None


def test_numerics_runs_and_in_memory_configs_are_never_cached(project):
    from normaudit.engine.loader import load_rules
    from normaudit.options import AuditOptions

    rules = load_rules(["rules"])
    assert cache_mod.cache_key(AuditOptions(target="model.py", probes=["numerics"]), rules) is None
    assert cache_mod.cache_key(AuditOptions(target="model.py", probes=["numerics-backward"]), rules) is None
    assert cache_mod.cache_key(AuditOptions(target="model.py", config_data={"eps": 1e-5}), rules) is None
    batch = cache_mod.cache_key(AuditOptions(target="model.py", probes=["batch"]), rules)
    plain = cache_mod.cache_key(AuditOptions(target="model.py"), rules)
    assert batch is not None and plain is not None and batch != plain


def test_an_environment_variable_a_model_file_reads_is_part_of_its_entry(project, capfd, monkeypatch):
    (project / "helper.py").write_text('import os\nHIDDEN = int(os.environ.get("NA_TEST_HIDDEN", "8"))\n')
    monkeypatch.setenv("NA_TEST_HIDDEN", "8")
    assert audit(capfd)[2] is True
    assert audit(capfd)[2] is False                      # same value: a hit
    monkeypatch.setenv("NA_TEST_HIDDEN", "16")
    rc, report, built = audit(capfd)
    assert built is True                                 # the model is built again, never the 8-wide report
    assert [s["normalized_shape"] for s in report["sites"]] == [[16]]
    monkeypatch.delenv("NA_TEST_HIDDEN")
    assert audit(capfd)[2] is True                       # unset is a value of its own


def test_environment_read_finds_the_names_a_file_reads(tmp_path, monkeypatch):
    src = tmp_path / "m.py"
    src.write_text('import os\nfrom os import environ, getenv\na = os.environ["NA_A"]\nb = environ.get("NA_B", 1)\n'
                   'c = getenv("NA_C")\nd = os.environ.setdefault(\'NA_D\', "x")\n')
    monkeypatch.setenv("NA_A", "1")
    monkeypatch.delenv("NA_B", raising=False)
    assert cache_mod.environment_read([str(src)]) == {"NA_A": "1", "NA_B": None, "NA_C": None,
                                                        "NA_D": os.environ.get("NA_D")}
