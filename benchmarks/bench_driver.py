"""The driver's memory per chain step on a LocalCluster: what the client process holds as the
number of points grows.

For each size, a child process opens ``bench_scale.py``'s scene (``_scale_scene.py``, cached in
``--cache``; generated when missing) and runs the chain's steps of
:data:`depsi.pipeline.steps.STEPS` as :func:`~depsi.pipeline.chain.run_ps_chain` runs them
(``bench_scale.run_chain``), inside a ``distributed.LocalCluster`` of 2 worker processes of
1 thread (``--memory-limit`` each, default 2 GB). A psutil thread samples the driver's (the
child's own) resident memory every ``--sample-s`` seconds; per step it reports the RSS at the
step's start, its peak during the step, and that peak less the RSS at the start of the chain
(``added``); the table gives each step's peak with what it added to the RSS it started from
(the live lines also the largest worker's RSS after each step).

The figures scale with N where a step materialises whole-scene arrays in the driver; they stay
at the size of the first-order network where the step's O(N) work runs in the workers' tasks.

Run: ``python benchmarks/bench_driver.py [--sizes 1e5 2e5] [--json out.json]``. Not part of the
test suite.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _scale_scene as scene_module
import bench_scale

GB = 2**30


class _DriverSampler:
    """The driver's RSS sampled in a thread; the peak since the last :meth:`mark`."""

    def __init__(self, every: float):
        import psutil

        self._process = psutil.Process()
        self._every = every
        self._lock = threading.Lock()
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")
        self._thread.start()

    def now(self) -> int:
        return int(self._process.memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            rss = self.now()
            with self._lock:
                self.peak = max(self.peak, rss)

    def mark(self) -> int:
        """The peak since the last mark (this sample included); starts a new interval."""
        rss = self.now()
        with self._lock:
            peak, self.peak = max(self.peak, rss), rss
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _StepRecorder:
    """``record(name, func)`` as ``bench_scale.run_chain`` calls it: wall time, the driver's
    RSS at the start and its peak during each step, the workers' peak memory."""

    def __init__(self, sampler: _DriverSampler, client):
        self.sampler, self.client, self.steps = sampler, client, []
        self.base = sampler.now()

    def _workers(self) -> int:
        """The largest worker RSS now (-1 when the workers cannot be asked)."""
        try:
            return max(self.client.run(_worker_rss).values())
        except Exception:  # noqa: BLE001 - reported as missing, never fatal
            return -1

    def __call__(self, name: str, func):
        start = self.sampler.now()
        self.sampler.mark()
        wall = time.perf_counter()
        out = func()
        entry = {"step": name, "wall_s": time.perf_counter() - wall, "start_rss": start,
                 "peak_rss": self.sampler.mark(), "end_rss": self.sampler.now(),
                 "added": 0, "worker_rss": self._workers()}
        entry["added"] = entry["peak_rss"] - self.base
        self.steps.append(entry)
        print(f"  {name:14s} {entry['wall_s']:7.1f} s  driver peak "
              f"{entry['peak_rss'] / GB:6.2f} GB (+{entry['added'] / GB:5.2f})  worker "
              f"{entry['worker_rss'] / GB:5.2f} GB", flush=True)
        return out


def _worker_rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def child(folder: Path, out: Path, memory_limit: str, every: float) -> None:
    """Run in the child: the chain on a LocalCluster with the driver sampled."""
    import logging

    from depsi.cluster import scheduler
    from depsi.io.store import open_stm

    logging.basicConfig(level=logging.WARNING)
    sampler = _DriverSampler(every)
    cluster = {**bench_scale.LOCAL_CLUSTER, "memory_limit": memory_limit}
    with scheduler(cluster) as running:
        record = _StepRecorder(sampler, running.client)
        wall = time.perf_counter()
        ps_stm = record("open", lambda: open_stm(folder / scene_module.PS_STORE))
        result = bench_scale.run_chain(ps_stm, {}, record)
        chain_s = time.perf_counter() - wall
        n_result = int(result.sizes["space"])
        lazy = bench_scale._lazy_variables(result)
        del result
    sampler.stop()
    out.write_text(json.dumps({"steps": record.steps, "chain_wall_s": chain_s,
                               "base_rss": record.base, "n_result": n_result,
                               "lazy_variables": lazy}))


def table(rows: list[dict]) -> str:
    """Markdown: per step and size, the driver's peak RSS (GB), what the step added to the RSS
    it started from, and its wall time."""
    steps = [s["step"] for s in rows[0]["steps"]]
    head = "| step | " + " | ".join(f"{r['n_points']:,}: driver peak GB (+ in the step)"
                                     for r in rows) + " |"
    lines = [head, "|---|" + "---|" * len(rows)]
    for name in steps:
        cells = []
        for r in rows:
            s = next((s for s in r["steps"] if s["step"] == name), None)
            if s is None:
                cells.append("-")
                continue
            grown = (s["peak_rss"] - s["start_rss"]) / GB
            cells.append(f"{s['peak_rss'] / GB:.2f} (+{grown:.2f}), {s['wall_s']:.0f} s")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| chain wall s | " + " | ".join(f"{r['chain_wall_s']:.0f}" for r in rows)
                 + " |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, sizes: list[float]) -> None:
    """The options this script and ``bench_capacity.py`` share."""
    parser.add_argument("--sizes", nargs="+", type=float, default=sizes)
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "depsi-bench-scale")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-limit", default="2GB", help="each worker's memory limit")
    parser.add_argument("--sample-s", type=float, default=0.05,
                        help="seconds between samples of the processes' RSS")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--child", nargs=2, metavar=("SCENE", "OUT"), help=argparse.SUPPRESS)


def rows_of_children(script: str, args: argparse.Namespace, suffix: str,
                     child_args: list[str]) -> list[dict]:
    """For each of ``args.sizes``: the scale scene (generated when missing), run by ``script
    --child SCENE OUT *child_args`` in a process of its own; the rows, with its JSON (also
    written to ``args.json``)."""
    args.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes:
        n = int(size)
        bench_scale.ensure_scene(args.cache, n, args.seed, None)
        folder = bench_scale.scene_folder(args.cache, n, args.seed)
        out = args.cache / f"{folder.name}.{suffix}.json"
        out.unlink(missing_ok=True)
        print(f"{n:,} points", flush=True)
        subprocess.run([sys.executable, script, "--child", str(folder), str(out), *child_args],
                       check=True)
        rows.append({"n_points": n, **json.loads(out.read_text())})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, [1e5, 2e5])
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.memory_limit, args.sample_s)
        return
    rows = rows_of_children(__file__, args, "driver", [
        "--memory-limit", args.memory_limit, "--sample-s", str(args.sample_s)])
    print("\nDriver RSS per step (LocalCluster 2 workers x 1 thread, "
          f"{args.memory_limit} each)\n")
    print(table(rows))


if __name__ == "__main__":
    main()
