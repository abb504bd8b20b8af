"""Benchmark of the numerics probe (``--probe numerics``) on a GPT-2-small-sized model (124M parameters).

For float16 and bfloat16 on the CPU (or CUDA when available), in one run:

- ``fwd``: a plain forward of the real model cast to the dtype (median of ``--repeat``), and ``hooked fwd`` the
  same forward with the probe's recorder (every module's hooks, the fused-norm ``TorchFunctionMode``): the
  probe's overhead on the forward itself;
- ``build+fwd``: building the real model from the meta model (as the probe does: materialise, the library's
  ``init_weights()``, cast) plus one plain forward, against ``probe``: the whole probe as an audit runs it
  (``normaudit.probes.numerics.numerics_probe``);
- peak memory of those two, each in a fresh process: the peak resident set above the resident set of the meta
  model (Linux ``VmHWM``, reset through ``/proc/self/clear_refs``).

Usage: ``nice -n 10 python benchmarks/bench_numerics.py [--seq 128] [--repeat 3]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_above(fn):
    """(result, seconds, peak RSS above the RSS before ``fn``)."""
    base = _rss("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    out = fn()
    took = time.perf_counter() - t0
    return out, took, max(0, _rss("VmHWM") - base)


def gpt2_small():
    """A meta GPT-2 small (12 layers, 768 wide, 12 heads, vocab 50257, 1024 positions; 124M parameters)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        return GPT2LMHeadModel(cfg)


def sites_of(model) -> list:
    """The LayerNorm sites of a GPT-2 (module paths), as the records the probe takes."""
    from normaudit.report import Site

    return [SimpleNamespace(site=Site(module=n, kind="LayerNorm", class_name="LayerNorm", detected_by="module",
                                      eps=m.eps, normalized_shape=list(m.normalized_shape)))
            for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)]


def child(kind: str, dtype_name: str, seq: int, repeat: int) -> dict:
    """One measurement in a fresh process (so the peak resident set starts from the same meta model):
    ``plain``: build the real model from meta (as the probe does), cast, ``repeat`` plain forwards, then
    ``repeat`` forwards with the probe's recorder; ``probe``: the whole probe (``numerics_probe``)."""
    from normaudit.probes.common import call_model, materialise
    from normaudit.probes.numerics import DTYPES, Recorder, _NormMode, numerics_probe, pick_device

    dtype, device = DTYPES[dtype_name], pick_device()
    meta = gpt2_small()
    records = sites_of(meta)
    ids = (torch.randint(0, 50257, (1, seq), generator=torch.Generator().manual_seed(0)),)
    out: dict = {"device": str(device)}
    if kind == "probe":
        ctx = SimpleNamespace(probe_model=meta, inputs=ids, options={"dtype": dtype_name}, checkpoint=None)
        section, out["seconds"], out["peak"] = _peak_above(lambda: numerics_probe(ctx, records))
        assert section.error is None and section.sites_measured == 25, (section.error, section.sites_measured)
        out["forward_in_probe"] = section.seconds
        return out

    def build():
        m = materialise(meta)
        init = getattr(m, "init_weights")
        with torch.no_grad():
            init()
        return m.to(device=device, dtype=dtype).eval()

    def plain():
        with torch.no_grad():
            return call_model(real, ids)

    def instrumented():
        rec = Recorder(real, [r.site for r in records], dtype_name)
        try:
            with torch.no_grad(), _NormMode(rec):
                return call_model(real, ids)
        finally:
            rec.close()

    base = _rss("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    real = build()
    out["build_s"] = time.perf_counter() - t0
    plain()  # warm-up
    out["peak"] = max(0, _rss("VmHWM") - base)
    out["weight_bytes"] = sum(p.numel() * p.element_size() for p in real.parameters())
    out["params"] = sum(p.numel() for p in real.parameters())
    out["plain_s"] = statistics.median(_peak_above(plain)[1] for _ in range(repeat))
    out["instrumented_s"] = statistics.median(_peak_above(instrumented)[1] for _ in range(repeat))
    return out


def _in_child(kind: str, dtype: str, seq: int, repeat: int) -> dict:
    import json
    import subprocess

    proc = subprocess.run([sys.executable, __file__, "--child", kind, dtype, "--seq", str(seq), "--repeat",
                           str(repeat)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.seq, args.repeat)))
        return 0
    mib = 2 ** 20
    print(f"GPT-2 small shape (124M parameters), batch 1 x {args.seq} tokens, median of {args.repeat}")
    print(f"{'dtype':9} {'device':6} {'fwd s':>7} {'hooked fwd s':>12} {'x':>5} {'build+fwd s':>11} {'probe s':>8} "
          f"{'x':>5} {'build+fwd peak MiB':>18} {'probe peak MiB':>14} {'x':>5}")
    for name in ("float16", "bfloat16"):
        p, q = _in_child("plain", name, args.seq, args.repeat), _in_child("probe", name, args.seq, args.repeat)
        end_to_end = p["build_s"] + p["plain_s"]
        print(f"{name:9} {p['device']:6} {p['plain_s']:7.3f} {p['instrumented_s']:12.3f} "
              f"{p['instrumented_s'] / p['plain_s']:5.2f} {end_to_end:11.2f} {q['seconds']:8.2f} "
              f"{q['seconds'] / end_to_end:5.2f} {p['peak'] / mib:18.1f} {q['peak'] / mib:14.1f} "
              f"{q['peak'] / max(p['peak'], 1):5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
