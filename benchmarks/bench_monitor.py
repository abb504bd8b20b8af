"""Overhead of ``normaudit.monitor()`` on a training step of a small GPT on CPU.

Runs plain and monitored training steps of one model alternately in the same process (so both see the same
machine load) and prints the median step time of each, wall and process CPU time (CPU time is the steadier
on a shared machine), and their ratio (also of the means, which is what ``every=10`` saves), for ``modules="all"``, ``modules="norms"`` and ``every=10``.
Target: monitored / plain < 1.10. One intra-op thread by default (``--threads 0``: torch's default).

    python benchmarks/bench_monitor.py [--layers 4] [--d-model 256] [--seq 64] [--batch 8] [--steps 30]

The model is transformers' GPT-2 (a config of the given size, random weights) when transformers is installed,
else a minimal pre-LN GPT written here. One step = forward, cross-entropy loss, backward, AdamW update.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from normaudit.probes.monitor import monitor  # noqa: E402


def build(layers: int, d: int, seq: int, vocab: int) -> nn.Module:
    """A GPT-2 of ``layers`` blocks of width ``d`` (heads of 64), context ``seq``, vocabulary ``vocab``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=max(1, d // 64), n_positions=seq, vocab_size=vocab,
                     bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def step_time(model: nn.Module, opt, ids: torch.Tensor) -> tuple[float, float]:
    """Wall and process CPU seconds for one training step (forward, loss, backward, update)."""
    w0, c0 = time.perf_counter(), time.process_time()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - w0, time.process_time() - c0


def measure(model, opt, ids, steps: int, **monitor_kwargs) -> dict[str, float]:
    """Median plain and monitored step times (wall and CPU, s), plain and monitored steps alternating one by
    one so that both see the same machine load; the monitor is attached and closed outside the timed step
    (its per-step host read happens inside it, at the end of backward)."""
    times: dict[str, list[float]] = {"plain_wall": [], "plain_cpu": [], "mon_wall": [], "mon_cpu": []}
    events = 0
    for _ in range(2):                                     # warm-up
        step_time(model, opt, ids)
    for i in range(steps):
        wall, cpu = step_time(model, opt, ids)
        times["plain_wall"].append(wall)
        times["plain_cpu"].append(cpu)
        mon = monitor(model, auto_step=False, **monitor_kwargs)
        mon.step(i)                                        # the run's step number, for every=k
        wall, cpu = step_time(model, opt, ids)
        events += len(mon.close().events)
        times["mon_wall"].append(wall)
        times["mon_cpu"].append(cpu)
    out = {k: statistics.median(v) for k, v in times.items()}
    out.update({k + "_mean": statistics.fmean(v) for k, v in times.items()})
    out["events"] = events
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a.layers, a.d_model, a.seq, a.vocab)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    n_params = sum(p.numel() for p in model.parameters())
    n_mods = sum(1 for _ in model.modules())
    print(f"GPT-2 {a.layers} layers, d={a.d_model}, seq={a.seq}, batch={a.batch}: {n_params / 1e6:.1f}M params, "
          f"{n_mods} modules, {torch.get_num_threads()} threads, torch {torch.__version__}")
    for label, kw in [("all modules", {}), ("norms only", {"modules": "norms"}), ("all, every=10", {"every": 10})]:
        m = measure(model, opt, ids, a.steps, **kw)
        print(f"{label:14s} plain {m['plain_wall'] * 1e3:7.1f} ms wall {m['plain_cpu'] * 1e3:7.1f} ms cpu | "
              f"monitored {m['mon_wall'] * 1e3:7.1f} ms wall {m['mon_cpu'] * 1e3:7.1f} ms cpu | "
              f"ratio wall {m['mon_wall'] / m['plain_wall']:.3f} cpu {m['mon_cpu'] / m['plain_cpu']:.3f} "
              f"(of means: cpu {m['mon_cpu_mean'] / m['plain_cpu_mean']:.3f}) | "
              f"events {m['events']}", flush=True)

if __name__ == "__main__":
    main()
