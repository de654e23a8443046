"""The capacity table's measured rows (what a run needs past one machine): per chain step,
CPU-seconds per point, bytes per point in the driver and in the busiest worker, and the bytes that
leave the workers, on a ``distributed.LocalCluster``.

For each size, a child process opens ``bench_scale.py``'s scene (``_scale_scene.py``, cached in
``--cache``, generated when missing) and runs the chain's steps as
:func:`~depsi.pipeline.chain.run_ps_chain` runs them (``bench_scale.run_chain``) inside a
LocalCluster of ``--workers`` processes of one thread (``--memory-limit`` each). Per step it
records:

- ``wall_s``;
- ``driver_cpu_s`` and ``workers_cpu_s``: the CPU time (user + system) the driver process and
  the worker processes spent in the step (``psutil``), so ``cpu_s`` per point does not depend on
  how many cores the run had;
- ``driver_peak`` and ``worker_peak``: the driver's RSS peak during the step, sampled every
  ``--sample-s`` s, and the largest worker's, sampled by a thread in each worker;
- ``held_bytes``: the data the workers hold at the step's end, all workers together (their
  managed memory: the persisted chunks the next steps read);
- ``out_bytes``: what the workers sent during the step (``Worker.transfer_outgoing_bytes_total``:
  every ``get_data`` answer, to another worker or to the driver's gather), the traffic that
  crosses the network between nodes on a real cluster.

The table is written as Markdown (and ``--json``); ``docs/hpc.md`` "Capacity" carries it with
the extrapolation to 10^8 and 10^9 points.

Run: ``python benchmarks/bench_capacity.py [--sizes 1e5 1e6] [--json out.json]``. Not part of
the test suite.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import _scale_scene as scene_module
import bench_scale
from bench_driver import _DriverSampler, add_arguments, rows_of_children

GB = 2**30


def _cpu_seconds() -> float:
    import psutil

    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


class _WorkerPeak:
    """A thread in a worker process sampling its RSS; :meth:`mark` returns the peak since the
    last mark. One instance a worker, kept on the worker object."""

    def __init__(self, every: float):
        import psutil

        self._process, self._every = psutil.Process(), every
        self.peak = self._process.memory_info().rss
        self._lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True, name="capacity-rss").start()

    def _run(self) -> None:
        while True:
            time.sleep(self._every)
            rss = self._process.memory_info().rss
            with self._lock:
                self.peak = max(self.peak, rss)

    def mark(self) -> int:
        rss = self._process.memory_info().rss
        with self._lock:
            peak, self.peak = max(self.peak, rss), rss
        return int(peak)


def _worker_start(dask_worker, every: float) -> None:
    dask_worker._capacity_peak = _WorkerPeak(every)


def _worker_figures(dask_worker) -> dict:
    """The worker's peak RSS since the last call, its CPU seconds and bytes sent so far."""
    peak = getattr(dask_worker, "_capacity_peak", None)
    return {"peak": peak.mark() if peak is not None else -1, "cpu": _cpu_seconds(),
            "out": int(dask_worker.transfer_outgoing_bytes_total),
            "held": int(dask_worker.state.nbytes)}


class _Steps:
    """``record(name, func)`` as ``bench_scale.run_chain`` calls it."""

    def __init__(self, sampler: _DriverSampler, client):
        self.sampler, self.client, self.steps = sampler, client, []
        self.base = sampler.now()
        self.last = self._workers()

    def _workers(self) -> dict:
        return self.client.run(_worker_figures)

    def __call__(self, name: str, func):
        self.sampler.mark()
        cpu, wall = _cpu_seconds(), time.perf_counter()
        out = func()
        # a step's persisted product is computed in the background: its tasks are the step's
        # (without this wait the last step's tail ran after the clock stopped, its workers'
        # peak never sampled, and the cluster closed under it)
        from distributed import futures_of, wait

        wait(futures_of(out))
        wall = time.perf_counter() - wall
        driver_cpu = _cpu_seconds() - cpu
        now = self._workers()
        # a worker restarted by its nanny appears under a new address: count it from zero
        workers_cpu = sum(f["cpu"] - self.last.get(a, {"cpu": 0.0})["cpu"]
                          for a, f in now.items())
        out_bytes = sum(f["out"] - self.last.get(a, {"out": 0})["out"]
                        for a, f in now.items())
        entry = {"step": name, "wall_s": wall, "driver_cpu_s": driver_cpu,
                 "workers_cpu_s": workers_cpu, "driver_peak": self.sampler.mark(),
                 "worker_peak": max(f["peak"] for f in now.values()),
                 "out_bytes": out_bytes, "held_bytes": sum(f["held"] for f in now.values()),
                 "workers": len(now)}
        self.last = now
        self.steps.append(entry)
        print(f"  {name:14s} {wall:7.1f} s  cpu {driver_cpu:7.1f} + {workers_cpu:7.1f} s  "
              f"driver {entry['driver_peak'] / GB:5.2f} GB  worker "
              f"{entry['worker_peak'] / GB:5.2f} GB  held {entry['held_bytes'] / GB:5.2f} GB  "
              f"out {out_bytes / 1e6:8.1f} MB", flush=True)
        return out


def child(folder: Path, out: Path, workers: int, memory_limit: str, every: float) -> None:
    """Run in the child: the chain on a LocalCluster, every process sampled."""
    import logging

    from depsi.cluster import scheduler
    from depsi.io.store import open_stm

    logging.basicConfig(level=logging.WARNING)
    sampler = _DriverSampler(every)
    cluster = {**bench_scale.LOCAL_CLUSTER, "workers": workers, "memory_limit": memory_limit}
    with scheduler(cluster) as running:
        running.client.run(_worker_start, every=every)
        record = _Steps(sampler, running.client)
        wall = time.perf_counter()
        ps_stm = record("open", lambda: open_stm(folder / scene_module.PS_STORE))
        result = bench_scale.run_chain(ps_stm, {}, record)
        chain_s = time.perf_counter() - wall
        n_result = int(result.sizes["space"])
        del result
    sampler.stop()
    out.write_text(json.dumps({"steps": record.steps, "chain_wall_s": chain_s,
                               "driver_base": record.base,
                               "n_result": n_result, "workers": workers,
                               "memory_limit": memory_limit}))


def table(rows: list[dict]) -> str:
    """Markdown: per step and size, CPU-seconds per point (driver + workers), the driver's and
    the busiest worker's peak, and the bytes out of the workers per point."""
    head = ("| step | points | CPU us/point (driver + workers) | driver peak GB "
            "(B/point above its start) | worker peak GB | held on workers B/point "
            "| out of workers B/point | wall s |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        n = row["n_points"]
        for s in row["steps"]:
            cpu = (s["driver_cpu_s"] + s["workers_cpu_s"]) / n * 1e6
            lines.append(
                f"| {s['step']} | {n:,} | {cpu:.1f} ({s['driver_cpu_s'] / n * 1e6:.1f} + "
                f"{s['workers_cpu_s'] / n * 1e6:.1f}) | {s['driver_peak'] / GB:.2f} "
                f"({(s['driver_peak'] - row['driver_base']) / n:,.0f}) | "
                f"{s['worker_peak'] / GB:.2f} | {s['held_bytes'] / n:,.0f} | "
                f"{s['out_bytes'] / n:,.0f} | "
                f"{s['wall_s']:.1f} |")
        total = sum(s["driver_cpu_s"] + s["workers_cpu_s"] for s in row["steps"])
        peak = max(s["driver_peak"] for s in row["steps"])
        lines.append(f"| **chain** | {n:,} | {total / n * 1e6:.1f} | {peak / GB:.2f} "
                     f"({(peak - row['driver_base']) / n:,.0f}) | "
                     f"{max(s['worker_peak'] for s in row['steps']) / GB:.2f} | "
                     f"{max(s['held_bytes'] for s in row['steps']) / n:,.0f} | "
                     f"{sum(s['out_bytes'] for s in row['steps']) / n:,.0f} | "
                     f"{row['chain_wall_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, [1e5, 1e6])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.workers, args.memory_limit,
              args.sample_s)
        return
    rows = rows_of_children(__file__, args, "capacity", [
        "--workers", str(args.workers), "--memory-limit", args.memory_limit,
        "--sample-s", str(args.sample_s)])
    print(f"\nCapacity per step (LocalCluster {args.workers} workers x 1 thread, "
          f"{args.memory_limit} each)\n")
    print(table(rows))


if __name__ == "__main__":
    main()
