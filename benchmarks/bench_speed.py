"""Speed of the command line, in one run, as ratios measured on the same machine and load:

    python benchmarks/bench_speed.py [--repeat 3] [--no-ray] [--no-depth] [--no-full] [--cli-only]

0. depth: ``normaudit DIR --no-cache`` on a Llama-2-70B-sized Hugging Face config directory (hidden 8192, FFN
   28672, GQA 64/8, 80 layers) vs the same config with 2 layers: wall, CPU and peak RSS of the whole command
   (parent and worker), the goal being under 10 s and 1 GB on 2 cores and within 1.5x of 2 layers, and its ratio
   to ``python -c "import torch"`` measured in the same run (the load a shared machine adds cancels); then
   :mod:`bench_depth`'s in-process audits (``build_report``) of the 70B and 7B configs: 80 vs 2 layers, and the
   full capture vs the depth-independent one (``--no-full`` skips the full ones, the slow part;
   ``--no-depth`` skips all of item 0);
1. start-up: ``normaudit --help``, ``--version``, ``rules``, ``explain NE101`` and ``schema`` wall and CPU time
   (best of ``--repeat``, after one run that fills the validation memo and the byte-code cache, as an installed
   normaudit has them), and their ratio to a bare ``python -c pass`` (the floor no command goes under); the
   goal is under 0.5 s wall on an idle machine;
2. cache: a re-run of an unchanged target answered from the cache vs the same audit with ``--no-cache``;
3. ``-j 2`` vs ``-j 1`` over 8 targets (copies of examples/buggy_lm.py, examples/convnext_block.py and the CLI
   tests' tiny model, ``--no-cache``);
4. ``--executor ray`` (a local Ray cluster started by the run, its start included) vs local ``-j 2`` on the
   same 8 targets, and the same less the start and stop of a bare local Ray cluster (measured apart); skipped
   when ray is not installed.

Every command is a fresh subprocess of this checkout (``PYTHONPATH`` set to it) in a temporary project; the
machine's load (``os.getloadavg``) is printed before and after. Nothing is written outside the temporary
directory: byte code goes to a ``PYTHONPYCACHEPREFIX`` there (filled by one unmeasured audit first: with a prefix,
Python reads no ``__pycache__`` of site-packages, so the first run compiles torch). CPU seconds are those of the child
processes (``resource.getrusage``), which a loaded machine inflates less than wall time.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_depth  # noqa: E402 - the in-process depth measurements (its CONFIGS and run())
MODELS = [ROOT / "examples" / "buggy_lm.py", ROOT / "examples" / "convnext_block.py",
          ROOT / "tests" / "fixtures" / "cli" / "tiny.py"]


def timed_cpu(argv: list[str], cwd: Path, env: dict, expect: tuple[int, ...] = (0, 1)) -> tuple[float, float]:
    """Wall and CPU (user + system, of the child and its children) seconds of one subprocess; raises when its
    exit status is not in ``expect``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in expect:
        raise SystemExit(f"bench_speed: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def timed(argv: list[str], cwd: Path, env: dict, expect: tuple[int, ...] = (0, 1)) -> float:
    """Wall seconds of one subprocess (:func:`timed_cpu`)."""
    return timed_cpu(argv, cwd, env, expect)[0]


def best(argv: list[str], cwd: Path, env: dict, repeat: int) -> tuple[float, float]:
    """The best wall and the best CPU seconds over ``repeat`` runs."""
    runs = [timed_cpu(argv, cwd, env) for _ in range(repeat)]
    return min(w for w, _ in runs), min(c for _, c in runs)


def load() -> str:
    """``uptime``'s load averages (1, 5, 15 min) and the CPUs."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f"  ({os.cpu_count()} CPUs)"


RAY_START = ("import ray; from normaudit.runner import local_ray_options, ray_driver_quiet\n"
             "with ray_driver_quiet():\n    ray.init(**local_ray_options(2)); ray.shutdown()")


def make_project(tmp: Path) -> list[str]:
    """Eight model files in ``tmp`` (distinct names: no two targets share a cache entry or a module name)."""
    names = []
    for i in range(8):
        src = MODELS[i % len(MODELS)]
        name = f"m{i}_{src.stem}.py"
        shutil.copy(src, tmp / name)
        names.append(name)
    return names


Row = tuple  # (measure, a wall s, b wall s, a cpu s, b cpu s); a peak-RSS row: MB in place of s, cpu None

#: what a child prints on its stderr's last line: wall, CPU (of its own children) and the largest child's peak RSS
MEASURED = ("import json, resource, subprocess, sys, time\n"
            "t = time.perf_counter(); rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
            "wall = time.perf_counter() - t; r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "print(json.dumps({'rc': rc, 'wall': wall, 'cpu': r.ru_utime + r.ru_stime, 'rss_mb': r.ru_maxrss / 1024}),"
            " file=sys.stderr); sys.exit(rc)")


def measured(argv: list[str], cwd: Path, env: dict, expect: tuple[int, ...] = (0, 1)) -> dict:
    """Wall, CPU (user + system) seconds and peak RSS (MB, of the largest process: the parent or its worker)
    of one command, run under a small Python parent (``RUSAGE_CHILDREN`` of its own); raises when the exit
    status is not in ``expect``."""
    proc = subprocess.run([sys.executable, "-c", MEASURED, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode not in expect:
        raise SystemExit(f"bench_speed: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stderr.strip().splitlines()[-1])


def hf_config_dir(tmp: Path, name: str, layers: int) -> Path:
    """A Hugging Face directory ``tmp/name`` with a Llama-2-70B-sized ``config.json`` of ``layers`` layers."""
    hidden, ffn, _, heads, kv = bench_depth.CONFIGS["70b"]
    d = tmp / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": ffn, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hidden // heads, "vocab_size": 32000,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False}))
    return d


def cli_depth_rows(cli: list[str], tmp: Path, env: dict, repeat: int = 1) -> list[Row]:
    """70B vs 2 layers through the command line (wall, CPU, RSS) and ``python -c "import torch"``, each round
    of ``repeat`` measuring the three one after the other (the same load) and printing the load average; the
    rows hold the round with the median 70B wall time."""
    deep, shallow = hf_config_dir(tmp, "llama70b", 80), hf_config_dir(tmp, "llama70b_2layers", 2)
    measured(cli + [str(shallow), "--isolated", "--no-cache"], tmp, env)  # byte code into PYTHONPYCACHEPREFIX
    print(f"{'normaudit DIR --no-cache':<42} {'wall (s)':>8} {'cpu (s)':>8} {'RSS (MB)':>8}")
    rounds = []
    for _ in range(max(1, repeat)):
        a = measured(cli + [str(deep), "--isolated", "--no-cache"], tmp, env)
        b = measured(cli + [str(shallow), "--isolated", "--no-cache"], tmp, env)
        floor = measured([cli[0], "-c", "import torch"], tmp, env, expect=(0,))  # the same load, the same byte code
        for name, m in (("llama 70B-sized, 80 layers", a), ("the same, 2 layers", b),
                        ("python -c 'import torch'", floor)):
            print(f"{name:<42} {m['wall']:8.2f} {m['cpu']:8.2f} {m['rss_mb']:8.0f}")
        print(f"{'  70B / import torch (wall)':<42} {a['wall'] / floor['wall']:8.2f}   load {load()}", flush=True)
        rounds.append((a, b, floor))
    a, b, floor = sorted(rounds, key=lambda r: r[0]["wall"])[len(rounds) // 2]
    return [("CLI 70B / 2 layers (--no-cache)", a["wall"], b["wall"], a["cpu"], b["cpu"]),
            ("CLI 70B / python -c 'import torch'", a["wall"], floor["wall"], a["cpu"], floor["cpu"]),
            ("CLI 70B / 2 layers peak RSS (MB)", a["rss_mb"], b["rss_mb"], None, None)]


def depth_rows(cli: list[str], tmp: Path, env: dict, full: bool) -> list[Row]:
    """70B vs 2 layers through the command line (:func:`cli_depth_rows`), then :mod:`bench_depth`'s in-process
    audits: 80 vs 2 layers, full vs depth-independent capture on 7B and 70B (``full``)."""
    rows = cli_depth_rows(cli, tmp, env)
    results = {}
    for size in ("70b", "7b"):
        for name, repeats in ((size, True), (f"{size}-2layers", True), (size, False)):
            if repeats or full:
                r = results[(name, repeats)] = bench_depth.run(name, repeats)
                print(f"in-process {name:<12s} {'depth-indep.' if repeats else 'full':12s} audit {r['audit_s']:6.2f} s "
                      f"(CPU {r['cpu_s']:6.2f} s)  process {r['wall_s']:6.2f} s  RSS {r['rss_mb']:6.0f} MB", flush=True)
        d, s = results[(size, True)], results[(f"{size}-2layers", True)]
        rows.append((f"in-process audit {size} / 2 layers", d["audit_s"], s["audit_s"], d["cpu_s"], s["cpu_s"]))
        rows.append((f"in-process {size} / 2 layers peak RSS (MB)", d["rss_mb"], s["rss_mb"], None, None))
        f = results.get((size, False))
        if f is not None:
            rows.append((f"full / depth-indep. capture {size}", f["audit_s"], d["audit_s"], f["cpu_s"], d["cpu_s"]))
            if f["report"] != d["report"]:
                print(f"WARNING: {size}: the full and the depth-independent capture give different reports")
    return rows


def startup_rows(py: str, cli: list[str], tmp: Path, env: dict, repeat: int) -> list[Row]:
    """Print the start-up table (every torch-free command) and return the ``--help`` and ``rules`` rows."""
    rows: list[Row] = []
    bare_wall, bare_cpu = best([py, "-c", "pass"], tmp, env, repeat)
    print(f"{'start-up (best of ' + str(repeat) + ')':<42} {'wall (s)':>8} {'cpu (s)':>8}")
    print(f"{'python -c pass':<42} {bare_wall:8.3f} {bare_cpu:8.3f}")
    for what in (["--help"], ["--version"], ["rules"], ["explain", "NE101"], ["schema"]):
        timed(cli + what, tmp, env)  # fills the validation memo and the byte-code cache
        wall, cpu = best(cli + what, tmp, env, repeat)
        print(f"{'normaudit ' + ' '.join(what):<42} {wall:8.3f} {cpu:8.3f}")
        if what[0] in ("--help", "rules"):
            rows.append((f"normaudit {what[0]} / python -c pass", wall, bare_wall, cpu, bare_cpu))
    return rows


def run_rows(py: str, cli: list[str], tmp: Path, env: dict, targets: list[str], ray: bool) -> list[Row]:
    """Cached vs uncached (one target), ``-j 2`` vs ``-j 1`` and Ray vs local (eight targets)."""
    one = [targets[0], "--isolated"]
    timed(cli + one + ["--no-cache"], tmp, env)  # byte code of torch & co. into the fresh PYTHONPYCACHEPREFIX
    uncached = timed_cpu(cli + one + ["--no-cache"], tmp, env)
    timed(cli + one, tmp, env)  # fills the cache
    cached = timed_cpu(cli + one, tmp, env)
    rows = [("cached / uncached re-run (1 target)", cached[0], uncached[0], cached[1], uncached[1])]
    many = targets + ["--isolated", "--no-cache"]
    serial = timed_cpu(cli + many + ["-j", "1"], tmp, env)
    parallel = timed_cpu(cli + many + ["-j", "2"], tmp, env)
    rows.append(("-j 2 / -j 1 (8 targets)", parallel[0], serial[0], parallel[1], serial[1]))
    if not ray:
        print("ray: not installed (pip install 'normaudit[ray]') or --no-ray: skipped")
        return rows
    on_ray = timed_cpu(cli + many + ["--executor", "ray", "-j", "2"], tmp, env)
    rows.append(("ray / local -j 2 (8 targets)", on_ray[0], parallel[0], on_ray[1], parallel[1]))
    start = timed_cpu([py, "-c", RAY_START], tmp, env, expect=(0,))
    rows.append(("ray less cluster start+stop / local -j 2", on_ray[0] - start[0], parallel[0],
                 on_ray[1] - start[1], parallel[1]))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each start-up command (best taken)")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray executor")
    ap.add_argument("--no-depth", action="store_true", help="skip the 70B/7B depth measurements (item 0)")
    ap.add_argument("--no-full", action="store_true", help="skip the (slow) full captures of the deep configs")
    ap.add_argument("--cli-only", action="store_true", help="only the command line on the 70B config vs 2 layers "
                    "and import torch, --repeat rounds (the median one in the table)")
    args = ap.parse_args()
    py = sys.executable
    cli = [py, "-m", "normaudit"]
    print(f"load average before: {load()}")
    with tempfile.TemporaryDirectory(prefix="bench_speed_") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NORMAUDIT_CACHE_DIR": str(tmp / "cache"),
               "NORMAUDIT_NO_CACHE": "", "PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(tmp / "pyc")}
        if args.cli_only:
            rows = cli_depth_rows(cli, tmp, env, args.repeat)
        else:
            targets = make_project(tmp)
            rows = [] if args.no_depth else depth_rows(cli, tmp, env, not args.no_full)
            rows += startup_rows(py, cli, tmp, env, args.repeat)
            rows += run_rows(py, cli, tmp, env, targets,
                             not args.no_ray and importlib.util.find_spec("ray") is not None)
    print(f"load average after:  {load()}")
    print("(cpu: user + system of the processes each command waited for; Ray's own daemons are partly outside)")
    print(f"{'measure (s, or MB for RSS)':<42} {'a':>8} {'b':>8} {'a/b':>7} {'a cpu':>8} {'b cpu':>8} {'cpu a/b':>7}")
    for name, a, b, ac, bc in rows:
        cpu = f"{ac:8.2f} {bc:8.2f} {ac / bc if bc else 0:7.2f}" if ac is not None else ""
        print(f"{name:<42} {a:8.2f} {b:8.2f} {a / b:7.2f} {cpu}")
    print(json.dumps({name: {"a_s": round(a, 3), "b_s": round(b, 3), "ratio": round(a / b, 3),
                             "a_cpu_s": round(ac, 3), "b_cpu_s": round(bc, 3)} if ac is not None else
                      {"a_mb": round(a, 1), "b_mb": round(b, 1), "ratio": round(a / b, 3)}
                      for name, a, b, ac, bc in rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
