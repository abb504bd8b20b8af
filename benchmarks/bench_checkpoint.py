"""Benchmark: checkpoint-only norm inspection vs loading the whole safetensors file.

    python benchmarks/bench_checkpoint.py [--size-gb N] [--dir DIR]

Writes a Llama-shaped float32 safetensors file of about N GB (default 2) in a temp dir: 32 layers, each
with one big 2-D matrix and three 1-D norms (input_layernorm, post_attention_layernorm, self_attn.q_norm),
plus model.norm (97 norm vectors). Then measures, in one run:
  (a) inspect_norm_params(open_checkpoint(f)): wall time and Checkpoint.bytes_read;
  (b) safetensors.torch.load_file(f) and .sum() of every tensor: wall time; bytes = the file size.
Also prints the disk reads the kernel did for each cold run (/proc/self/io read_bytes, read-ahead
included). Each is timed cold (the file's pages dropped from the page cache with posix_fadvise after fsync, best
effort) and warm (run again right after). Prints the ratios against the targets (bytes < 1%, time < 0.1)
and deletes the file. Exit status 0 when both cold ratios meet their targets, else 1.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from normaudit.loaders.checkpoint import inspect_norm_params, open_checkpoint  # noqa: E402

LAYERS, HIDDEN = 32, 4096


def write_checkpoint(path: Path, size_gb: float) -> None:
    rows = max(1, int(size_gb * 1e9 / (LAYERS * HIDDEN * 4)))
    sd: dict[str, torch.Tensor] = {}
    g = torch.Generator().manual_seed(0)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        sd[p + "mlp.down_proj.weight"] = torch.randn(rows, HIDDEN, generator=g)
        sd[p + "input_layernorm.weight"] = 1 + 0.01 * torch.randn(HIDDEN, generator=g)
        sd[p + "post_attention_layernorm.weight"] = 1 + 0.01 * torch.randn(HIDDEN, generator=g)
        sd[p + "self_attn.q_norm.weight"] = torch.ones(128)
    sd["model.norm.weight"] = torch.ones(HIDDEN)
    save_file(sd, str(path))
    del sd


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk_read_bytes() -> int | None:
    """Bytes this process caused to be fetched from storage (Linux /proc/self/io, read-ahead included)."""
    try:
        with open("/proc/self/io") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith("read_bytes:"))
    except (OSError, StopIteration, ValueError):
        return None


def _delta(before: int | None) -> int | None:
    after = disk_read_bytes()
    return None if before is None or after is None else after - before


def run_inspect(path: Path) -> tuple[float, int, int, int | None]:
    io0, t0 = disk_read_bytes(), time.perf_counter()
    with open_checkpoint(path) as ckpt:
        groups = inspect_norm_params(ckpt)
        read = ckpt.bytes_read
    return time.perf_counter() - t0, read, len(groups), _delta(io0)


def run_full(path: Path) -> tuple[float, int | None]:
    io0, t0 = disk_read_bytes(), time.perf_counter()
    sd = load_file(str(path))
    total = sum(float(t.sum()) for t in sd.values())
    dt = time.perf_counter() - t0
    del sd
    assert total == total  # touch the result
    return dt, _delta(io0)


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.2f} MB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0, help="approximate file size in GB (default 2)")
    ap.add_argument("--dir", default=None, help="where to write the temp file (default: system temp)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="normaudit-bench-", dir=args.dir))
    path = tmp / "model.safetensors"
    try:
        t0 = time.perf_counter()
        write_checkpoint(path, args.size_gb)
        size = path.stat().st_size
        print(f"wrote {path} ({size / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")

        drop_cache(path)
        a_cold, a_bytes, n_groups, a_disk = run_inspect(path)
        a_warm, *_ = run_inspect(path)
        drop_cache(path)
        b_cold, b_disk = run_full(path)
        b_warm, _ = run_full(path)

        print(f"(a) inspect_norm_params: {n_groups} groups, bytes_read {a_bytes:,} B, "
              f"{a_cold * 1e3:.1f} ms cold, {a_warm * 1e3:.1f} ms warm; disk reads (cold) {_mb(a_disk)}")
        print(f"(b) load_file + sum:     file {size:,} B, {b_cold * 1e3:.1f} ms cold, {b_warm * 1e3:.1f} ms warm; "
              f"disk reads (cold) {_mb(b_disk)}")
        frac, r_cold, r_warm = a_bytes / size, a_cold / b_cold, a_warm / b_warm
        ok_bytes, ok_time = frac < 0.01, r_cold < 0.1
        print(f"bytes fraction: {frac:.5%}  (target < 1%)   {'OK' if ok_bytes else 'MISSED'}")
        print(f"time ratio:     {r_cold:.4f} cold, {r_warm:.4f} warm  (target < 0.1)   {'OK' if ok_time else 'MISSED'}")
        return 0 if ok_bytes and ok_time else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
