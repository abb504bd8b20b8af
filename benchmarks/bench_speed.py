"""Speed of the command line (issue 14, items 2-5), in one run, as ratios measured on the same machine and load:

    python benchmarks/bench_speed.py [--repeat 3] [--no-ray]

1. start-up: ``normaudit --help`` and ``normaudit rules`` wall time (best of ``--repeat``), and their ratio to a
   bare ``python -c pass`` (the floor no command goes under);
2. cache: a re-run of an unchanged target answered from the cache vs the same audit with ``--no-cache``;
3. ``-j 2`` vs ``-j 1`` over 8 targets (copies of examples/buggy_lm.py, examples/convnext_block.py and the CLI
   tests' tiny model, ``--no-cache``);
4. ``--executor ray`` (a local Ray cluster started by the run, its start included) vs local ``-j 2`` on the
   same 8 targets; skipped when ray is not installed.

Every command is a fresh subprocess of this checkout (``PYTHONPATH`` set to it) in a temporary project; the
machine's load (``os.getloadavg``) is printed before and after. Nothing is written outside the temporary
directory.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = [ROOT / "examples" / "buggy_lm.py", ROOT / "examples" / "convnext_block.py",
          ROOT / "tests" / "fixtures" / "cli" / "tiny.py"]


def timed(argv: list[str], cwd: Path, env: dict, expect: tuple[int, ...] = (0, 1)) -> float:
    """Wall seconds of one subprocess; raises when its exit status is not in ``expect``."""
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    if proc.returncode not in expect:
        raise SystemExit(f"bench_speed: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return seconds


def best(argv: list[str], cwd: Path, env: dict, repeat: int) -> float:
    return min(timed(argv, cwd, env) for _ in range(repeat))


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_project(tmp: Path) -> list[str]:
    """Eight model files in ``tmp`` (distinct names: no two targets share a cache entry or a module name)."""
    names = []
    for i in range(8):
        src = MODELS[i % len(MODELS)]
        name = f"m{i}_{src.stem}.py"
        shutil.copy(src, tmp / name)
        names.append(name)
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each start-up command (best taken)")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray executor")
    args = ap.parse_args()
    py = sys.executable
    cli = [py, "-m", "normaudit"]
    rows: list[tuple[str, float, float, str]] = []
    print(f"load average before: {load()}  ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="bench_speed_") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NORMAUDIT_CACHE_DIR": str(tmp / "cache"),
               "NORMAUDIT_NO_CACHE": ""}
        targets = make_project(tmp)

        bare = best([py, "-c", "pass"], tmp, env, args.repeat)
        for what in (["--help"], ["rules"]):
            t = best(cli + what, tmp, env, args.repeat)
            rows.append((f"normaudit {what[0]} / python -c pass", t, bare, "start-up"))

        one = [targets[0], "--isolated"]
        uncached = timed(cli + one + ["--no-cache"], tmp, env)
        timed(cli + one, tmp, env)  # fills the cache
        cached = timed(cli + one, tmp, env)
        rows.append(("cached / uncached re-run (1 target)", cached, uncached, "cache"))

        many = targets + ["--isolated", "--no-cache"]
        serial = timed(cli + many + ["-j", "1"], tmp, env)
        parallel = timed(cli + many + ["-j", "2"], tmp, env)
        rows.append(("-j 2 / -j 1 (8 targets)", parallel, serial, "parallel"))

        if not args.no_ray and importlib.util.find_spec("ray") is not None:
            ray = timed(cli + many + ["--executor", "ray", "-j", "2"], tmp, env)
            rows.append(("ray / local -j 2 (8 targets)", ray, parallel, "ray"))
        else:
            print("ray: not installed (pip install 'normaudit[ray]') or --no-ray: skipped")
    print(f"load average after:  {load()}")
    print(f"{'measure':<42} {'a (s)':>8} {'b (s)':>8} {'a/b':>7}")
    for name, a, b, _ in rows:
        print(f"{name:<42} {a:8.2f} {b:8.2f} {a / b:7.2f}")
    print(json.dumps({name: {"a_s": round(a, 3), "b_s": round(b, 3), "ratio": round(a / b, 3)}
                      for name, a, b, _ in rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
