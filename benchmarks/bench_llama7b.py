"""Audit a Llama-2-7B-sized model end to end and compare with a bare torch.export of the same model.

Both run in fresh subprocesses of this one run, so the ratio is measured on the same machine and load:

    python benchmarks/bench_llama7b.py [--layers 32] [--hidden 4096]

Prints wall time and peak RSS of (a) the full ``normaudit`` CLI on a generated model file (meta device,
fake tensors, every fact pass and rule) and (b) building the same model on meta plus ``torch.export`` on
fake tensors, and the ratio a/b. Targets: (a) under 15 s and 1.5 GB peak RSS on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MODEL_FILE = """
import torch
from transformers import LlamaConfig, LlamaModel

def build_model():
    return LlamaModel(LlamaConfig(hidden_size={hidden}, intermediate_size={ffn}, num_hidden_layers={layers},
                                  num_attention_heads=32, num_key_value_heads=32, vocab_size=32000))

def example_inputs():
    return (torch.randint(0, 32000, (1, 16)),)
"""

BARE_EXPORT = """
import resource, sys, time
t0 = time.perf_counter()
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
sys.path.insert(0, {dir!r})
import model as user
with torch.device("meta"):
    m = user.build_model()
mode = FakeTensorMode(allow_non_fake_inputs=True)
class Flat(torch.nn.Module):
    def __init__(self, m):
        super().__init__(); self.m = m
    def forward(self, ids):
        return self.m(ids, use_cache=False).last_hidden_state
with mode:
    m.to_empty(device="cpu")
    ids = mode.from_tensor(user.example_inputs()[0])
    torch.export.export(Flat(m), (ids,), strict=False)
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def run(cmd: list[str], cwd: str) -> tuple[float, float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall, rss, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "model.py").write_text(MODEL_FILE.format(hidden=args.hidden, ffn=int(args.hidden * 2.6875),
                                                           layers=args.layers))
        # bare export first: RUSAGE_CHILDREN keeps the maximum over children, so measure it in its own child
        bare = subprocess.run([sys.executable, "-c", textwrap.dedent(BARE_EXPORT.format(dir=tmp))], cwd=tmp,
                              capture_output=True, text=True)
        if bare.returncode != 0:
            print(bare.stderr[-2000:])
            return 1
        t_bare_inner, rss_bare = (float(x) for x in bare.stdout.split())
        wall, _, proc = run([sys.executable, "-c",
                             "import resource, sys, time; t0 = time.perf_counter();"
                             "from normaudit.cli import main; rc = main(['model.py', '--format', 'json', '-o', 'r.json']);"
                             "print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, rc)"],
                            cwd=tmp)
        if proc.returncode != 0:
            print(proc.stderr[-2000:])
            return 1
        t_audit, rss_audit, rc = proc.stdout.split()
        report = json.loads(Path(tmp, "r.json").read_text())
    t_audit, rss_audit = float(t_audit), float(rss_audit)
    print(f"model: Llama hidden={args.hidden} layers={args.layers}; sites found: {len(report['sites'])}, "
          f"capture: {report['capture']['method']}, exit {rc}")
    print(f"normaudit (import + audit + report): {t_audit:6.2f} s  peak RSS {rss_audit:7.0f} MB")
    print(f"bare torch.export on fake tensors:   {t_bare_inner:6.2f} s  peak RSS {rss_bare:7.0f} MB")
    print(f"ratio normaudit / bare export: time {t_audit / t_bare_inner:.2f}x, peak RSS {rss_audit / rss_bare:.2f}x")
    print(f"targets: time < 15 s {'OK' if t_audit < 15 else 'MISSED'}; RSS < 1500 MB {'OK' if rss_audit < 1500 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
