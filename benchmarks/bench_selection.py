"""NAD PS selection on a simulated SLC stack in Zarr, against simply reading the same bytes.

Run: ``python benchmarks/bench_selection.py [--shape 2000 2000] [--epochs 60]``. The stack is
simulated once with ``depsi.simulate.write_stack_zarr`` into a cache folder (``--cache``, default
``$TMPDIR/depsi-bench``) and reused. Every case runs in a fresh child process, which reports its
wall time and its peak resident memory (``ru_maxrss``) above the memory it had after imports.
The page cache is warmed first, so the figures are for a warm cache (decompression-bound, not
disk-bound). Besides wall time it prints CPU seconds (user + system) of each case and their ratio
to the one-thread read: on a shared, busy machine wall times swing with the load, CPU time much
less. Nothing is asserted; figures go to docs/selection.md.

Cases, all over ``complex`` and ``h2ph`` (the bytes a selection must read):

- read limit: every stored chunk read with zarr, one thread, and with two threads;
- stream engine: ``ps_selection(engine="stream")``, one pass with prefetching;
- dask engine: ``ps_selection(engine="dask")`` to the lazy STM (reads ``complex`` once), and
  then ``.compute()`` of the point values (reads ``complex`` and ``h2ph`` again).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

VARIABLES = ("complex", "h2ph")
THRESHOLD = 0.25


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _chunk_slices(array) -> list[tuple[slice, ...]]:
    from itertools import product

    ranges = [range(0, size, chunk) for size, chunk in zip(array.shape, array.chunks)]
    return [tuple(slice(start, start + chunk) for start, chunk in zip(corner, array.chunks))
            for corner in product(*ranges)]


def case_read(path: str, threads: int) -> dict:
    """Read every chunk of the selection's variables; nothing else."""
    import zarr

    group = zarr.open_group(path, mode="r")
    jobs = [(group[name], s) for name in VARIABLES for s in _chunk_slices(group[name])]
    nbytes = sum(group[name].nbytes for name in VARIABLES)
    base, cpu = _rss_mb(), _cpu_seconds()
    start = time.perf_counter()
    if threads == 1:
        for array, s in jobs:
            array[s]
    else:
        with ThreadPoolExecutor(threads) as pool:
            for _ in pool.map(lambda job: job[0][job[1]], jobs):
                pass
    return {"seconds": time.perf_counter() - start, "peak_mb": _peak_mb() - base,
            "cpu": _cpu_seconds() - cpu, "nbytes": nbytes}


def _open(path: str):
    import xarray as xr

    return xr.open_zarr(path, consolidated=True)


def case_stream(path: str, prefetch: int) -> dict:
    from depsi.processing.selection import ps_selection

    stack = _open(path)
    base, cpu = _rss_mb(), _cpu_seconds()
    start = time.perf_counter()
    ps = ps_selection(stack, threshold=THRESHOLD, engine="stream", prefetch=prefetch)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mb": _peak_mb() - base, "cpu": _cpu_seconds() - cpu,
            "points": ps.sizes["space"]}


def case_dask(path: str) -> dict:
    import dask

    from depsi.processing.selection import ps_selection

    stack = _open(path)
    base, cpu = _rss_mb(), _cpu_seconds()
    with dask.config.set(scheduler="threads"):
        start = time.perf_counter()
        ps = ps_selection(stack, threshold=THRESHOLD, engine="dask")
        lazy, lazy_cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        ps = ps.compute()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "lazy_seconds": lazy, "peak_mb": _peak_mb() - base,
            "cpu": _cpu_seconds() - cpu, "lazy_cpu": lazy_cpu, "points": ps.sizes["space"]}


def _in_child(func, *args) -> dict:
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(func, *args).result()


def ensure_stack(cache: Path, shape: tuple[int, int], epochs: int, chunk: int) -> Path:
    from depsi.simulate import write_stack_zarr

    path = cache / f"stack_{shape[0]}x{shape[1]}x{epochs}_c{chunk}.zarr"
    if not path.exists():
        print(f"simulating {path} (once) ...", flush=True)
        start = time.perf_counter()
        write_stack_zarr(path, shape=shape, n_epochs=epochs, seed=0, chunks=chunk)
        print(f"  written in {time.perf_counter() - start:.0f} s", flush=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=2, default=(2000, 2000))
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--chunk", type=int, default=256, help="stored chunk side (pixels)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "depsi-bench")
    parser.add_argument("--repeat", type=int, default=2, help="best of this many runs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    path = str(ensure_stack(args.cache, tuple(args.shape), args.epochs, args.chunk))
    _in_child(case_read, path, 1)  # warm the page cache

    def best(func, *fargs):
        runs = [_in_child(func, path, *fargs) for _ in range(args.repeat)]
        return min(runs, key=lambda r: r["seconds"])

    read1, read2 = best(case_read, 1), best(case_read, 2)
    limit = min(read1["seconds"], read2["seconds"])
    stream = best(case_stream, 2)
    dask_run = best(case_dask)
    gb = read1["nbytes"] / 1e9

    print(f"\nNAD selection, {args.shape[0]} x {args.shape[1]} x {args.epochs} stack, chunks "
          f"{args.chunk} x {args.chunk} x {args.epochs}, warm page cache, "
          f"{mp.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min)")
    print(f"bytes read by a selection (complex + h2ph, in memory): {gb:.2f} GB; "
          f"{stream['points']} points selected")
    rows = [
        ("read limit, 1 thread", read1["seconds"], read1["cpu"], read1["peak_mb"]),
        ("read limit, 2 threads", read2["seconds"], read2["cpu"], read2["peak_mb"]),
        ("stream, prefetch 2", stream["seconds"], stream["cpu"], stream["peak_mb"]),
        ("dask engine, to lazy STM", dask_run["lazy_seconds"], dask_run["lazy_cpu"], None),
        ("dask engine, computed", dask_run["seconds"], dask_run["cpu"], dask_run["peak_mb"]),
    ]
    cpu_limit = read1["cpu"]
    print(f"{'case':30s} {'seconds':>8s} {'GB/s':>6s} {'x limit':>8s} {'CPU s':>6s} "
          f"{'x CPU':>6s} {'peak MB':>8s}")
    for name, seconds, cpu, peak in rows:
        peak_text = f"{peak:8.0f}" if peak is not None else f"{'':8s}"
        print(f"{name:30s} {seconds:8.2f} {gb / seconds:6.2f} {seconds / limit:8.2f} "
              f"{cpu:6.2f} {cpu / cpu_limit:6.2f} {peak_text}")
    print(f"peak memory relative to the stack's {gb * 1e3:.0f} MB: stream "
          f"{stream['peak_mb'] / (gb * 1e3):.1%}, dask {dask_run['peak_mb'] / (gb * 1e3):.1%}")


if __name__ == "__main__":
    main()
