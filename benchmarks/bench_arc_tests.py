"""Benchmark: the network's arc tests (``arc_testing._test_network``: the integration step's
tiles and whole-network solve, and the atmosphere step's second network pass) on the inputs a
real chain run gives them, this checkout against another (``--baseline``, e.g. a worktree of
the previous commit), back to back in alternating child processes; process CPU seconds and
wall seconds, best of ``--repeat`` and the spread, and whether the outcomes (arcs kept, points
removed, values, reference, w-statistics, iterations) are the same to the bit. No asserts.

``--capture`` first runs the chain on a scale scene's store (``bench_scale.py`` caches them)
and pickles every ``_test_network`` call's inputs and outcomes (about 85 MB at 10^5 points).
BLAS at one thread, as the chain runs it.

Run::

    python benchmarks/bench_arc_tests.py --capture /tmp/depsi-bench-scale/n100000-seed0/ps.zarr \\
        --calls /tmp/arc-tests-1e5.pkl
    python benchmarks/bench_arc_tests.py --calls /tmp/arc-tests-1e5.pkl --baseline ../base
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OUTCOMES = ("arc_ok", "point_reason", "values", "reference", "w_stat", "iterations",
            "removed")


def capture(store: str, calls_path: str) -> None:
    """Run the chain on ``store``, pickling each ``_test_network`` call (inputs, outcomes)."""
    import depsi.processing.integration as integration
    from depsi.io.store import open_stm
    from depsi.pipeline.chain import run_ps_chain

    original = integration._test_network
    calls = []

    def recorded(*args, **kwargs):
        inputs = [np.array(a) if hasattr(a, "shape") else a for a in args]
        outcome = original(*args, **kwargs)
        calls.append((inputs, {k: v for k, v in kwargs.items() if k != "devices"},
                      [np.array(o) for o in outcome]))
        return outcome

    integration._test_network = recorded
    run_ps_chain(open_stm(store))
    with open(calls_path, "wb") as f:
        pickle.dump(calls, f, protocol=5)
    print(f"{len(calls)} calls of _test_network ({[c[0][6] for c in calls]} points)")


def time_calls(calls_path: str) -> None:
    """One run of every call (the child's part): JSON of CPU and wall seconds and sameness."""
    from depsi.kernels.backend import single_threaded_blas
    from depsi.processing import arc_testing

    calls = pickle.load(open(calls_path, "rb"))
    report = []
    with single_threaded_blas():
        for inputs, kwargs, expected in calls:
            args = [a.copy() if isinstance(a, np.ndarray) else a for a in inputs]
            wall, cpu = time.perf_counter(), time.process_time()
            outcome = arc_testing._test_network(*args, **kwargs)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            same = [bool(np.array_equal(np.asarray(got), np.asarray(want),
                                        equal_nan=np.asarray(want).dtype.kind == "f"))
                    for got, want in zip(outcome, expected)]
            report.append({"points": int(inputs[6]), "cpu": cpu, "wall": wall,
                           "same": dict(zip(OUTCOMES, same))})
    print(json.dumps(report))


def child(checkout: Path, calls_path: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                          "--calls", calls_path], env=env, check=True, capture_output=True,
                         text=True, cwd=checkout).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", required=True, help="pickle of the captured calls")
    parser.add_argument("--capture", metavar="STORE", help="run the chain on STORE first")
    parser.add_argument("--baseline", type=Path, help="another checkout, timed beside this")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return time_calls(args.calls)
    if args.capture:
        capture(args.capture, args.calls)
    here = Path(__file__).resolve().parents[1]
    checkouts = {"this": here} | ({"baseline": args.baseline.resolve()} if args.baseline
                                 else {})
    runs: dict[str, list[list[dict]]] = {name: [] for name in checkouts}
    for _ in range(args.repeat):  # alternating: both see the same load
        for name, checkout in checkouts.items():
            runs[name].append(child(checkout, args.calls))
    for index in range(len(runs["this"][0])):
        print(f"call {index} ({runs['this'][0][index]['points']} points)")
        best = {}
        for name in checkouts:
            cpu = sorted(run[index]["cpu"] for run in runs[name])
            wall = sorted(run[index]["wall"] for run in runs[name])
            same = {k for run in runs[name] for k, v in run[index]["same"].items() if not v}
            best[name] = cpu[0]
            verdict = ("as captured, to the bit" if not same
                       else "differ: " + ", ".join(sorted(same)))
            print(f"  {name:8s} CPU best {cpu[0]:.2f} s (spread {cpu[0]:.2f}-{cpu[-1]:.2f}), "
                  f"wall best {wall[0]:.2f} s; outcomes {verdict}")
        if "baseline" in best:
            print(f"  CPU ratio baseline / this: {best['baseline'] / best['this']:.2f}x")


if __name__ == "__main__":
    main()
