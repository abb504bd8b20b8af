"""Depth-independent capture: audit time and peak RSS against depth.

    nice -n 10 python benchmarks/bench_depth.py [--only 70b]

Audits transformers ``LlamaModel`` configs built on the meta device (no weights), each in a fresh
subprocess of this one run so time and RSS are measured on the same machine and load:

- Llama-2-70B-sized: hidden 8192, FFN 28672, GQA 64 query / 8 key-value heads, 80 layers, and the same with
  2 layers;
- Llama-2-7B-sized: hidden 4096, FFN 11008, 32 heads, 32 layers;

each with the depth-independent capture (``AuditOptions.repeats``, the default) and with the full capture.
Prints per run: the audit's wall and CPU time in-process (``build_report``; CPU time is what the audit costs
when other processes share the cores), the whole process's wall time (imports included) and peak RSS, then
the ratios 70B/2-layer (goal: < 1.5x, 70B < 10 s and < 1 GB on 2 cores) and full/depth-independent, with the
load average (``uptime``) before and after. Also checks that both captures give the same report (JSON apart
from timings).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, re, resource, sys, time
t_start = time.perf_counter()
import torch
from transformers import LlamaConfig, LlamaModel
from normaudit.audit import AuditOptions, build_report
from normaudit.engine.loader import load_rules
from normaudit.loaders import ModelUnderAudit
hidden, ffn, layers, heads, kv, repeats = json.loads(sys.argv[1])
rules = load_rules([])
with torch.device("meta"):
    model = LlamaModel(LlamaConfig(hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                                   num_attention_heads=heads, num_key_value_heads=kv, vocab_size=32000))
mua = ModelUnderAudit(model=model, inputs=(torch.randint(0, 32000, (1, 16)),), on_meta=True, kind="python",
                      origins={})
t0, c0 = time.perf_counter(), time.process_time()
report = build_report(AuditOptions(target="llama", repeats=repeats), mua, rules)
audit, cpu = time.perf_counter() - t0, time.process_time() - c0
d = report.model_dump(mode="json")
d["capture"].pop("attempts"); nodes = d["capture"].pop("num_nodes")
d["notes"] = [re.sub(r"\d+\.\d+ s\b", "<t> s", n) for n in d["notes"]]
print(json.dumps({"audit_s": audit, "cpu_s": cpu, "process_s": time.perf_counter() - t_start, "nodes": nodes,
                  "sites": len(report.sites), "findings": len(report.findings),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "report": d}))
"""

CONFIGS = {
    "70b": (8192, 28672, 80, 64, 8),
    "70b-2layers": (8192, 28672, 2, 64, 8),
    "7b": (4096, 11008, 32, 32, 32),
    "7b-2layers": (4096, 11008, 2, 32, 32),
}


def run(name: str, repeats: bool) -> dict:
    """Audit config ``name`` in a fresh subprocess; returns its measurements (``report``: comparable JSON)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps([*CONFIGS[name], repeats])],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t0
    return out


def _load() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["70b", "7b"], help="one model size only")
    ap.add_argument("--no-full", action="store_true", help="skip the (slow) full captures of the deep configs")
    args = ap.parse_args()
    print(f"load average: {_load()} on {os.cpu_count()} CPUs")
    sizes = [args.only] if args.only else ["7b", "70b"]
    results: dict[tuple[str, bool], dict] = {}
    for size in sizes:
        for name in (size, f"{size}-2layers"):
            for repeats in (True, False):
                if repeats is False and (args.no_full or name.endswith("2layers")):
                    continue  # 2 layers: no stack, the same capture either way
                r = results[(name, repeats)] = run(name, repeats)
                print(f"{name:12s} {'depth-indep.' if repeats else 'full':12s} audit {r['audit_s']:6.2f} s "
                      f"(CPU {r['cpu_s']:6.2f} s)  "
                      f"process {r['wall_s']:6.2f} s  peak RSS {r['rss_mb']:7.1f} MB  graph {r['nodes']:5d} nodes  "
                      f"{r['sites']} sites  {r['findings']} findings", flush=True)
    for size in sizes:
        deep, shallow = results[(size, True)], results[(f"{size}-2layers", True)]
        print(f"{size}: {CONFIGS[size][2]} vs 2 layers (depth-independent): audit x{deep['audit_s'] / shallow['audit_s']:.2f} "
              f"(CPU x{deep['cpu_s'] / shallow['cpu_s']:.2f}), process x{deep['wall_s'] / shallow['wall_s']:.2f}, "
              f"RSS x{deep['rss_mb'] / shallow['rss_mb']:.2f}")
        full = results.get((size, False))
        if full is not None:
            same = full["report"] == deep["report"]
            print(f"{size}: full / depth-independent: audit x{full['audit_s'] / deep['audit_s']:.2f} "
                  f"(CPU x{full['cpu_s'] / deep['cpu_s']:.2f}), "
                  f"RSS x{full['rss_mb'] / deep['rss_mb']:.2f}; same report: {same}")
    print(f"load average after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
