"""Benchmark: the first ``depsi demo`` on a fresh install against the second, by their chain
time (what ``depsi.demo`` logs as "time per step: ... chain X s"), printed with the ratio (no
asserts).

Each repeat takes a new empty ``NUMBA_CACHE_DIR`` (a fresh install's cache), runs ``depsi demo``
in a subprocess, waits for the background compilation that run started to finish (timed: what
a user waits before a second run is fast), then runs the demo again on that cache.
``--mode inline`` compiles in the first run's process instead (the behaviour before the
background compilation). The load average is printed with each repeat: the machine may be
shared.

Run: ``python benchmarks/bench_first_run.py [--repeat 2] [--mode background|inline]
[--size 300] [--epochs 60] [--json out.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_STEPS = re.compile(r"time per step: simulate ([\d.]+) s, selection ([\d.]+) s, chain ([\d.]+) s")


def demo(cache: Path, out: Path, mode: str, size: int, epochs: int) -> dict:
    """One ``depsi demo`` in a fresh process: its steps' seconds and its wall time."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), DEPSI_NUMBA_COMPILE=mode)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "depsi.cli", "demo", "--out", str(out),
                           "--size", str(size), "--epochs", str(epochs)], env=env,
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    found = _STEPS.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no step times in the demo's log:\n{done.stderr[-2000:]}")
    simulate, selection, chain = (float(v) for v in found.groups())
    return {"simulate_s": simulate, "selection_s": selection, "chain_s": chain,
            "wall_s": round(wall, 1), "background": "background process" in done.stderr}


def wait_for_compilation(cache: Path, timeout: float = 900.0) -> float:
    """Seconds until the cache's background compilation has finished (its log's last line)."""
    start = time.perf_counter()
    log = cache / "warmup.log"
    while time.perf_counter() - start < timeout:
        text = log.read_text() if log.exists() else ""
        if "Numba's kernels are in" in text or " ERROR " in text:
            return time.perf_counter() - start
        time.sleep(0.5)
    raise TimeoutError(f"no end of the background compilation in {log} after {timeout} s")


def one_repeat(mode: str, size: int, epochs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="depsi-first-run-") as folder:
        cache, out = Path(folder) / "numba", Path(folder) / "demo"
        load = os.getloadavg()[0]
        first = demo(cache, out, mode, size, epochs)
        waited = wait_for_compilation(cache) if first["background"] else 0.0
        second = demo(cache, out, mode, size, epochs)
        return {"mode": mode, "load_average": round(load, 2), "first": first,
                "waited_after_first_s": round(waited, 1), "second": second,
                "ratio": round(first["chain_s"] / second["chain_s"], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--mode", choices=("background", "inline"), default="background")
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeat):
        row = one_repeat(args.mode, args.size, args.epochs)
        rows.append(row)
        print(f"{row['mode']}: first chain {row['first']['chain_s']:.1f} s, second "
              f"{row['second']['chain_s']:.1f} s, ratio {row['ratio']:.2f} (waited "
              f"{row['waited_after_first_s']:.1f} s for the compilation between; load "
              f"average {row['load_average']:.2f})", flush=True)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=Path(__file__).parent).stdout.strip()
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"), "commit": commit,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "command": "python benchmarks/bench_first_run.py " + " ".join(sys.argv[1:]),
            "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
