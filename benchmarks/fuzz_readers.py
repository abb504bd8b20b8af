"""Fuzz the checkpoint and config readers through the command line: mutated files, counted outcomes.

    python benchmarks/fuzz_readers.py [--cases 1000] [--seed 0] [--timeout 60] [--keep DIR] [--only KIND ...]

Writes well-formed seeds (a safetensors file, a torch.save zip and legacy file, a sharded index, an HF
config.json, JSON and YAML training configs, ONNX models with inline and external data when onnx is
installed, a GGUF file written with ``gguf.GGUFWriter`` when gguf is), mutates them at random (byte flips,
truncations, inserted spans, random header lengths, deep nesting, odd names), and runs each through
``normaudit.cli.main`` in a forked child (the same path as ``normaudit FILE``, without an interpreter start per
case): checkpoints, GGUF files and ONNX models (and a model beside a mutated external-data file) as the
TARGET, configs as ``--config`` of a checkpoint target, config.json files as HF targets.

Outcomes: ``report`` (exit 0/1, stdout a JSON report), ``exit-2`` (exactly one ``normaudit: error:`` line,
no traceback), ``crash`` (exit 3, a signal, a traceback, or an exit 2 that is not one clean line) and
``hang`` (past ``--timeout`` seconds; the child is killed). Prints the counts and the first crashes; with
``--keep`` the crashing files are copied there. Takes minutes (each case imports nothing anew, but an HF
target builds a model). Not a test: tests/test_fuzz_readers.py is the fast in-process version.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def make_seeds(d: Path) -> dict[str, Path]:
    """Well-formed files to mutate, written into ``d``."""
    import torch
    from safetensors.torch import save_file

    state = {"encoder.layer.0.LayerNorm.weight": torch.ones(16), "encoder.layer.0.LayerNorm.bias": torch.zeros(16),
             "encoder.layer.0.dense.weight": torch.randn(4, 16), "bn.running_mean": torch.zeros(8),
             "bn.running_var": torch.ones(8), "bn.weight": torch.ones(8), "norm.weight": torch.ones(16)}
    save_file(state, d / "good.safetensors", metadata={"format": "pt", "config": json.dumps({"rms_norm_eps": 1e-6})})
    torch.save(state, d / "good.pt")
    torch.save(state, d / "legacy.pt", _use_new_zipfile_serialization=False)
    index = {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in state}}
    (d / "index.json").write_text(json.dumps(index))
    hf = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-6}
    (d / "config.json").write_text(json.dumps(hf))
    train = {"model": {"dim": 64, "n_layers": 2, "norm_eps": 1e-5, "layers": [{"eps": 1e-6}] * 3}, "lr": 3e-4}
    (d / "train.json").write_text(json.dumps(train))
    (d / "train.yaml").write_text("defaults: &d {norm_eps: 1.0e-5}\nmodel:\n  <<: *d\n  dim: 64\n  layers: [1, 2, 3]\n")
    onnx_seeds(d)
    write_gguf_seed(d / "good.gguf")
    return {p.name: p for p in d.iterdir()}


def onnx_seeds(d: Path) -> None:
    """``good.onnx`` (a LayerNormalization, a decomposed RMSNorm and a BatchNormalization, data inline) and
    ``ext.onnx`` with its tensors in ``ext.onnx.data``, written with ``onnx.helper``; nothing without onnx."""
    try:
        import numpy as np
        import onnx
        from onnx import helper, numpy_helper
    except ImportError:
        return
    f = onnx.TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.ones(16, np.float32), "ln.weight"),
             numpy_helper.from_array(np.zeros(16, np.float32), "ln.bias"),
             numpy_helper.from_array(np.ones(16, np.float32), "norm.weight"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    inits += [numpy_helper.from_array(np.full(4, v, np.float32), f"bn.{k}") for k, v in
              (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.1), ("running_var", 2.0))]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["h"], name="/layers.0/ln/LN",
                              epsilon=1e-5),
             helper.make_node("Pow", ["h", "two"], ["sq"], name="/norm/Pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="/norm/ReduceMean", keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="/norm/Add"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="/norm/Sqrt"),
             helper.make_node("Div", ["h", "rms"], ["n"], name="/norm/Div"),
             helper.make_node("Mul", ["n", "norm.weight"], ["y"], name="/norm/Mul"),
             helper.make_node("BatchNormalization", ["img", "bn.weight", "bn.bias", "bn.running_mean",
                                                     "bn.running_var"], ["z"], name="/bn/BN", epsilon=1e-5)]
    graph = helper.make_graph(nodes, "seed", [helper.make_tensor_value_info("x", f, ["batch", "sequence", 16]),
                                              helper.make_tensor_value_info("img", f, ["batch", 4, 8, 8])],
                              [helper.make_tensor_value_info("y", f, None), helper.make_tensor_value_info("z", f, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save_model(model, str(d / "good.onnx"))
    onnx.save_model(model, str(d / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.onnx.data", size_threshold=0)



def write_gguf_seed(path: Path) -> None:
    """A small llama GGUF file (metadata with an array and a string, norms and a matrix); nothing without gguf."""
    try:
        import gguf
        import numpy as np
    except ImportError:
        return
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(16)
    w.add_head_count(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("blk.0.attn_norm.weight", np.ones(16, np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((16, 16), np.float16))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(16, np.float32))
    w.add_tensor("output_norm.weight", np.ones(16, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def mutate(rng: random.Random, blob: bytes, text: bool) -> bytes:
    """A few random edits of ``blob``; for text seeds also deep nesting and odd strings."""
    data = bytearray(blob)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["flip", "flip", "truncate", "insert", "length"] + (["nest", "string"] if text else []))
        i = rng.randint(0, len(data))
        if kind == "flip" and data:
            data[min(i, len(data) - 1)] = rng.randrange(256)
        elif kind == "truncate":
            del data[i:]
        elif kind == "insert":
            data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == "length":
            n = rng.choice([0, 2 ** 63, 2 ** 64 - 1, rng.randint(0, len(data) + 64)])
            data[:8] = struct.pack("<Q", n)
        elif kind == "nest":
            depth = rng.choice([50, 150, 5000, 100000])
            data[i:i] = b"[" * depth + b"]" * depth
        elif kind == "string":
            data[i:i] = rng.choice([b'"\\u001b[31m"', b'"../../etc/passwd"', b"&a [*a]", b"!!python/name:os.system",
                                    b'{"__float__": "Infinity"}', b"\xff\xfe", b"\x00"])
    return bytes(data)


def plan(seeds: dict[str, Path], cases: int, rng: random.Random, work: Path,
         only: tuple[str, ...] = ()) -> list[tuple[str, list[str], Path]]:
    """(kind, argv, file) per case (of the kinds ``only`` names, else all); the files are written into ``work``."""
    mix = [("safetensors", "good.safetensors", 0.33), ("torch-zip", "good.pt", 0.2), ("torch-legacy", "legacy.pt", 0.1),
           ("index", "index.json", 0.1), ("config-json", "train.json", 0.1), ("config-yaml", "train.yaml", 0.1),
           ("hf-config", "config.json", 0.07), ("gguf", "good.gguf", 0.15), ("onnx", "good.onnx", 0.1),
           ("onnx-external", "ext.onnx", 0.05)]
    mix = [m for m in mix if m[1] in seeds and (not only or m[0] in only)]  # no GGUF/ONNX seed without its package
    if not mix:
        raise SystemExit(f"no seed of the kinds {', '.join(only)}")
    out = []
    for n in range(cases):
        kind, seed, _ = rng.choices(mix, weights=[w for *_, w in mix])[0]
        blob = mutate(rng, seeds[seed].read_bytes(), text=seed.endswith((".json", ".yaml")))
        case = work / f"case{n:05d}"
        case.mkdir()
        if kind == "onnx-external":  # the graph intact or mutated, its external data mutated
            (case / "ext.onnx.data").write_bytes(mutate(rng, seeds["ext.onnx.data"].read_bytes(), text=False))
            if rng.random() < 0.5:
                blob = seeds[seed].read_bytes()
        if kind == "index":
            shutil.copy(seeds["good.safetensors"], case / "model-00001-of-00001.safetensors")
            path = case / "model.safetensors.index.json"
        elif kind == "hf-config":
            path = case / "config.json"
        else:
            path = case / seeds[seed].name
        path.write_bytes(blob)
        if kind.startswith("config-"):
            argv = [str(seeds["good.safetensors"]), "--config", str(path)]
        else:
            argv = [str(path)]
        out.append((kind, [*argv, "--format", "json", "--isolated"], path))
    return out


def run_case(argv: list[str], timeout: float, work: Path) -> tuple[str, str]:
    """Run ``normaudit.cli.main(argv)`` in a forked child; (outcome, detail)."""
    out_path, err_path = work / "stdout", work / "stderr"
    pid = os.fork()
    if pid == 0:  # child
        try:
            for fd, p in ((1, out_path), (2, err_path)):
                f = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(f, fd)
                os.close(f)
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            from normaudit.cli import main

            rc = main(argv)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
        except BaseException:  # noqa: BLE001 - anything escaping main() is a crash
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
            os._exit(99)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hang", f"over {timeout} s"
        time.sleep(0.01)
    err = err_path.read_text(errors="replace")
    if os.WIFSIGNALED(status):
        return "crash", f"signal {os.WTERMSIG(status)}"
    rc = os.WEXITSTATUS(status)
    if "Traceback" in err or rc not in (0, 1, 2):
        return "crash", f"exit {rc}: {err.strip()[-300:]}"
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.startswith("normaudit: error: ")]
        if len(lines) != 1 or "\x1b" in err:
            return "crash", f"exit 2 without one clean error line: {err.strip()[:300]}"
        return "exit-2", lines[0]
    try:
        json.loads(out_path.read_text())
    except ValueError:
        return "crash", f"exit {rc} without a JSON report"
    return "report", ""


def main() -> int:
    """Run the fuzzer and print the counts; exit 1 when any case crashed or hung."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--keep", help="copy crashing and hanging cases into this folder")
    ap.add_argument("--only", nargs="+", default=(), metavar="KIND",
                    help="fuzz only these kinds (safetensors, torch-zip, torch-legacy, index, config-json, "
                         "config-yaml, hf-config, gguf, onnx, onnx-external)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import normaudit.cli  # noqa: F401 - imported once, before forking
    import torch  # noqa: F401

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="normaudit-fuzz-cli-"))
    try:
        (work / "seeds").mkdir()
        seeds = make_seeds(work / "seeds")
        cases = plan(seeds, args.cases, rng, work, tuple(args.only))
        counts: Counter = Counter()
        by_kind: dict[str, Counter] = {}
        bad: list[tuple[str, str, Path]] = []
        started = time.monotonic()
        for n, (kind, argv, path) in enumerate(cases, 1):
            outcome, detail = run_case(argv, args.timeout, work)
            counts[outcome] += 1
            by_kind.setdefault(kind, Counter())[outcome] += 1
            if n % 100 == 0:
                print(f"  ... {n} cases: {dict(counts)}", file=sys.stderr, flush=True)
            if outcome in ("crash", "hang"):
                bad.append((outcome, detail, path))
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    shutil.copytree(path.parent, Path(args.keep) / path.parent.name, dirs_exist_ok=True)
        took = time.monotonic() - started
        print(f"cases {len(cases)}  exit-2 {counts['exit-2']}  reports {counts['report']}  crashes {counts['crash']}  "
              f"hangs {counts['hang']}  ({took:.0f} s)")
        for kind, c in sorted(by_kind.items()):
            print(f"  {kind:13s} " + "  ".join(f"{k} {c[k]}" for k in ("exit-2", "report", "crash", "hang")))
        for outcome, detail, path in bad[:10]:
            print(f"{outcome}: {path.relative_to(work)}: {detail}")
        return 1 if bad else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
