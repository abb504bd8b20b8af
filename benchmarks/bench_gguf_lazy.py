"""Benchmark: auditing a GGUF file with a Llama-7B tensor table reads its header and norm tensors only.

    python benchmarks/bench_gguf_lazy.py [--layers 32] [--vocab 32000] [--dir DIR] [--keep]

Writes, with the gguf package's own writer (``gguf.GGUFWriter``), the header of a llama GGUF file holding the
tensor table of Llama-7B (token_embd and output (32000, 4096), per block attn_norm, ffn_norm (4096,), attn_q/k/v/
output (4096, 4096), ffn_gate/ffn_up (11008, 4096), ffn_down (4096, 11008), all F16 but the F32 norms; 291
tensors, about 13.5 GB) and a tokenizer of ``--vocab`` tokens in the metadata, as converted files have. The data
region is made sparse (``os.truncate`` to the size the table implies) and only the norm gains are written into it
(near 1), at the offsets ``gguf.GGUFReader`` reports, so the file takes a few MB on disk.

Then the audit (``normaudit.audit.run_audit`` of the file, checkpoint rules) runs once with the file's pages
dropped from the page cache (fsync, then ``posix_fadvise(DONTNEED)``), and prints:
  - wall time of the audit;
  - bytes read as the reader counts them (``GgufFile.bytes_read``: the header, then each tensor :meth:`get` copies);
  - the file's pages in the page cache after the audit (``mincore``: what the memory map faulted in, the kernel's
    read-ahead included; the pages present before the audit are subtracted);
  - each as a fraction of the file size, against the target of 1%.
Exit status 0 when both fractions are under 1%, else 1. The file is deleted unless ``--keep``. Linux only (mincore).
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HIDDEN, FFN, VOCAB_ROWS = 4096, 11008, 32000


def tensor_table(layers: int) -> list[tuple[str, tuple[int, ...], type]]:
    """(name, shape in PyTorch order, numpy dtype) of Llama-7B's tensors under llama.cpp's names."""
    table = [("token_embd.weight", (VOCAB_ROWS, HIDDEN), np.float16)]
    for b in range(layers):
        p = f"blk.{b}."
        table += [(p + "attn_norm.weight", (HIDDEN,), np.float32)]
        table += [(p + f"attn_{n}.weight", (HIDDEN, HIDDEN), np.float16) for n in ("q", "k", "v", "output")]
        table += [(p + "ffn_norm.weight", (HIDDEN,), np.float32), (p + "ffn_gate.weight", (FFN, HIDDEN), np.float16),
                  (p + "ffn_up.weight", (FFN, HIDDEN), np.float16), (p + "ffn_down.weight", (HIDDEN, FFN), np.float16)]
    table += [("output_norm.weight", (HIDDEN,), np.float32), ("output.weight", (VOCAB_ROWS, HIDDEN), np.float16)]
    return table


def write_sparse_gguf(path: Path, layers: int, vocab: int) -> int:
    """Write the sparse file (see the module docstring); returns the number of norm tensors written."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(4096)
    w.add_block_count(layers)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(32)
    w.add_head_count_kv(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"tok{i}" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    table = tensor_table(layers)
    for name, shape, dtype in table:
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    # the data region as the writer's tensor table lays it out: it starts at the header's end padded to the
    # alignment, and each tensor's offset is the sum of the padded sizes before it (GGUFWriter.ggml_pad)
    align = w.data_alignment
    start = gguf.GGUFWriter.ggml_pad(path.stat().st_size, align)
    offsets, at = {}, 0
    for name, shape, dtype in table:
        offsets[name] = start + at
        at += gguf.GGUFWriter.ggml_pad(int(np.prod(shape)) * np.dtype(dtype).itemsize, align)
    os.truncate(path, start + at)
    by_name = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}  # the reader agrees on every offset
    assert all(int(by_name[n].data_offset) == off for n, off in offsets.items())
    rng = np.random.default_rng(0)
    norms = [n for n, shape, _ in table if len(shape) == 1]
    fd = os.open(path, os.O_WRONLY)
    try:
        for name in norms:
            gain = (1 + 0.02 * rng.standard_normal(HIDDEN)).astype(np.float32)
            os.pwrite(fd, gain.tobytes(), offsets[name])
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(norms)


def drop_cache(path: Path) -> None:
    """Drop the file's pages from the page cache (best effort: they are clean after fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache now (``mincore`` over a fresh read-only mapping: touches no page)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        try:
            if libc.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
    return sum(1 for v in vec if v & 1) * page


def audit(path: Path) -> tuple[float, int, int]:
    """(seconds, the reader's bytes_read, sites) of one audit of ``path`` with the checkpoint rules."""
    from normaudit.audit import run_audit
    from normaudit.engine.loader import load_rules
    from normaudit.loaders.gguf_file import reader
    from normaudit.options import AuditOptions

    rules = {k: r for k, r in load_rules().items() if r.category == "checkpoint"}
    counted: list[int] = []
    real_close = reader.GgufFile.close

    def close(self):
        if self._r is not None:
            counted.append(self.bytes_read)
        real_close(self)

    reader.GgufFile.close = close
    try:
        t0 = time.perf_counter()
        report = run_audit(AuditOptions(target=str(path)), rules)
        took = time.perf_counter() - t0
    finally:
        reader.GgufFile.close = real_close
    return took, sum(counted), len(report.sites)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000, help="tokens of the tokenizer kept in the metadata")
    ap.add_argument("--dir", help="where to write the file (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the file")
    args = ap.parse_args()
    os.environ.setdefault("NORMAUDIT_NO_CACHE", "1")
    import normaudit.audit  # noqa: F401 - imported before timing: torch and the rules are not the reader's cost

    work = Path(args.dir or tempfile.mkdtemp(prefix="normaudit-bench-gguf-"))
    work.mkdir(parents=True, exist_ok=True)
    path = work / "llama-7b-sparse.gguf"
    try:
        t0 = time.perf_counter()
        norms = write_sparse_gguf(path, args.layers, args.vocab)
        size = path.stat().st_size
        on_disk = os.stat(path).st_blocks * 512
        print(f"file {size / 1e9:.2f} GB ({on_disk / 1e6:.1f} MB on disk), {len(tensor_table(args.layers))} "
              f"tensors, {norms} norms, written in {time.perf_counter() - t0:.1f} s")
        drop_cache(path)
        before = resident_bytes(path)
        took, counted, sites = audit(path)
        faulted = max(0, resident_bytes(path) - before)
        print(f"audit {took:.2f} s, {sites} sites")
        print(f"bytes read (reader's count): {counted:,} = {100 * counted / size:.4f}% of the file")
        print(f"pages faulted in (mincore, read-ahead included): {faulted:,} = {100 * faulted / size:.4f}% "
              f"of the file ({before:,} resident before)")
        ok = counted / size < 0.01 and faulted / size < 0.01
        print("target (< 1% of the bytes):", "met" if ok else "MISSED")
        return 0 if ok else 1
    finally:
        if not args.keep:
            if args.dir:
                path.unlink(missing_ok=True)
            else:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
