"""NAD PS selection on an SLC stack in Zarr, against simply reading the same bytes.

Run: ``python benchmarks/bench_selection.py [--shape 2000 2000] [--epochs 60]``. The stack is
simulated once with ``depsi.simulate.write_stack_zarr`` into a cache folder (``--cache``, default
``$TMPDIR/depsi-bench``) and reused. With ``--foreign`` the stack is instead written as another
tool would write it: ``xarray.Dataset.to_zarr`` with Zarr's default codecs and no depsi helper
(``complex`` and ``h2ph``, chunks ``--chunk`` x ``--chunk`` x ``--time-chunk``), and opened with
``depsi.io.slc_zarr.open_slc_zarr``; the reference case is ``--foreign --shape 1000 1000 --epochs
40 --chunk 250`` (time whole) and the same with ``--time-chunk 10``. Every case runs in a fresh
child process, which first does its work on one block (a selection on the first block, a read
of the first chunk: imports, thread pools, zarr's event loop and the allocator's first blocks
are one-time costs of a process, left untimed) and then reports its wall time and its peak
resident memory (``ru_maxrss``) above the memory it had before.
The page cache is warmed first, so the figures are for a warm cache (decompression-bound, not
disk-bound). Besides wall time it prints CPU seconds (user + system) of each case and their ratio
to the one-thread read: on a shared, busy machine wall times swing with the load, CPU time much
less. Nothing is asserted; figures go to docs/selection.md.

Cases, all over ``complex`` and ``h2ph`` (the bytes a selection must read):

- read limit: every stored chunk read (decoded) with zarr, one thread, and with as many threads
  as cores; the smaller of the two is the limit;
- default: ``ps_selection(stack)`` as a user calls it (``engine="auto"``), points computed;
- stream engine: ``ps_selection(engine="stream")``, one pass, with its default number of
  worker threads (the cores) and with one;
- dask engine: ``ps_selection(engine="dask")`` to the lazy STM (reads ``complex`` once), and
  then ``.compute()`` of the point values (reads ``complex`` and ``h2ph`` again);
- pipeline: what ``depsi run`` does up to the points, the stack step (opening, the values
  checked on a sample, geometry and epochs) and the selection step;
- with ``--peer``: TU Delft DePSI 0.1.2's ``ps_selection`` (NAD) on the same store, in its own
  venv (``_peer_selection_driver.py``);
- with ``--compare DIR``: the two engines and the ``depsi run`` case again with the depsi
  package of ``DIR`` (a checkout of an earlier commit), in the same rounds, for before/after
  ratios under the same load.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import resource
import tempfile
import time
import warnings
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
    for name in VARIABLES:  # warm-up: zarr's event loop, codecs, the allocator's first chunk
        group[name][_chunk_slices(group[name])[0]]
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


WAVELENGTH = 0.0555


def _warm_up(stack, **options) -> None:
    """A selection on the first block first: imports, thread pools, zarr's event loop and the
    allocator's first blocks outside the timed run, as the read cases' warm-up read of one
    chunk does for them (one-time costs of a process, not a cost per byte)."""
    from depsi.processing.selection import ps_selection

    az, rg = stack["complex"].data.chunksize[:2]
    corner = stack.isel(azimuth=slice(0, az), range=slice(0, rg))
    ps_selection(corner, threshold=THRESHOLD, **options).compute()


def _use_tree(tree: str | None) -> None:
    """Import depsi from ``tree`` (another checkout, for before/after in one run)."""
    import sys

    if tree:
        sys.path.insert(0, tree)


def _open(path: str):
    import xarray as xr

    if Path(path).name.startswith("foreign_"):
        from depsi.io.slc_zarr import open_slc_zarr

        return open_slc_zarr(path, wavelength=WAVELENGTH)
    return xr.open_zarr(path, consolidated=True)


def case_stream(path: str, prefetch: int, workers: int | None = None,
                tree: str | None = None) -> dict | None:
    """``workers=None``: the engine's default; None back from a depsi without the option."""
    import inspect

    _use_tree(tree)
    from depsi.processing.selection import ps_selection

    options = {"prefetch": prefetch}
    if workers is not None:
        if "workers" not in inspect.signature(ps_selection).parameters:
            return None
        options["workers"] = workers
    stack = _open(path)
    _warm_up(stack, engine="stream", **options)
    base, cpu = _rss_mb(), _cpu_seconds()
    start = time.perf_counter()
    ps = ps_selection(stack, threshold=THRESHOLD, engine="stream", **options)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mb": _peak_mb() - base, "cpu": _cpu_seconds() - cpu,
            "points": ps.sizes["space"]}


def case_dask(path: str, tree: str | None = None) -> dict:
    import dask

    _use_tree(tree)
    from depsi.processing.selection import ps_selection

    stack = _open(path)
    with dask.config.set(scheduler="threads"):
        _warm_up(stack, engine="dask")
    base, cpu = _rss_mb(), _cpu_seconds()
    with dask.config.set(scheduler="threads"):
        start = time.perf_counter()
        ps = ps_selection(stack, threshold=THRESHOLD, engine="dask")
        lazy, lazy_cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        ps = ps.compute()
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "lazy_seconds": lazy, "peak_mb": _peak_mb() - base,
            "cpu": _cpu_seconds() - cpu, "lazy_cpu": lazy_cpu, "points": ps.sizes["space"]}


def case_default(path: str) -> dict:
    """``ps_selection`` as a user calls it: no engine named (``"auto"``), points computed."""
    from depsi.processing.selection import ps_selection

    stack = _open(path)
    _warm_up(stack)
    base, cpu = _rss_mb(), _cpu_seconds()
    start = time.perf_counter()
    ps = ps_selection(stack, threshold=THRESHOLD).compute()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mb": _peak_mb() - base, "cpu": _cpu_seconds() - cpu,
            "points": ps.sizes["space"], "engine": ps.attrs["selection_engine"]}


def _corner_store(path: str) -> str:
    """A copy of the store's first block (its first stored chunk of every variable, same
    attributes), written once beside it: the pipeline case's warm-up input."""
    import xarray as xr

    corner = Path(path).with_name(Path(path).stem + "_corner.zarr")
    if not corner.exists():
        with warnings.catch_warnings():  # a foreign store has no consolidated metadata
            warnings.simplefilter("ignore", RuntimeWarning)
            stack = xr.open_zarr(path)
        az, rg = stack["complex"].data.chunksize[:2]
        block = stack.isel(azimuth=slice(0, az), range=slice(0, rg))
        for variable in block.variables.values():
            variable.encoding = {}
        tmp = corner.with_name(corner.name + ".tmp")
        block.to_zarr(tmp, mode="w", zarr_format=3, consolidated=True)
        tmp.rename(corner)
    return str(corner)


def _pipeline(path: str) -> tuple:
    """The stack and selection steps of ``depsi run`` on the store at ``path``."""
    from depsi.pipeline.config import parse_config
    from depsi.pipeline.steps import StepContext, run_step

    config = parse_config({"input": {"format": "zarr", "path": path},
                           "selection": {"method": "nad", "threshold": THRESHOLD,
                                         "ds": {"enabled": False}}})
    with tempfile.TemporaryDirectory() as work:
        stack = run_step("stack", config, context=StepContext(target=Path(work) / "stack.zarr"))
        return stack, run_step("selection", config, stack=stack).compute()


def case_pipeline(path: str, tree: str | None = None) -> dict:
    """What ``depsi run`` does up to the points: the stack step (open the store, check its
    values on a sample, its geometry and epochs) and the selection step, as in a run. Its
    warm-up is the same two steps on a one-block copy of the store (the steps' own imports
    and first calls, one-time costs of a process as the other cases' warm-ups are)."""
    _use_tree(tree)
    _pipeline(_corner_store(path))
    base, cpu = _rss_mb(), _cpu_seconds()
    start = time.perf_counter()
    _, ps = _pipeline(path)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_mb": _peak_mb() - base, "cpu": _cpu_seconds() - cpu,
            "points": ps.sizes["space"]}


def case_peer(path: str, python: str) -> dict | None:
    """TU Delft DePSI's ``ps_selection`` (NAD) on the same store, in its own venv, points
    computed (``_peer_selection_driver.py``)."""
    import json
    import subprocess

    driver = Path(__file__).with_name("_peer_selection_driver.py")
    done = subprocess.run([python, str(driver), path, str(THRESHOLD)], capture_output=True,
                          text=True, cwd=tempfile.gettempdir(),
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    if done.returncode != 0:
        print(f"peer selection failed: {done.stderr[-2000:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


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


def _foreign_values(shape: tuple[int, int], epochs: int, seed: int = 0):
    """Rayleigh clutter with 2 % bright stable pixels, random phase; h2ph smooth in range."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n_az, n_rg = shape
    slc = np.empty((n_az, n_rg, epochs), np.complex64)
    for start in range(0, n_az, 100):  # in slabs: the float64 temporaries stay small
        rows = slice(start, min(start + 100, n_az))
        size = (rows.stop - rows.start, n_rg, epochs)
        amplitude = rng.rayleigh(1.0, size)
        bright = rng.random(size[:2]) < 0.02
        amplitude[bright] = rng.normal(10.0, 1.0, (int(bright.sum()), epochs))
        slc[rows] = amplitude * np.exp(1j * rng.uniform(-np.pi, np.pi, size))
    bperp = rng.normal(0.0, 100.0, epochs)
    slant_range = 850e3 + 2.3 * np.arange(n_rg)
    h2ph = (bperp[None, None, :] / (slant_range[None, :, None] * np.sin(np.radians(39.0))))
    h2ph = np.broadcast_to(h2ph, (n_az, n_rg, epochs)).astype(np.float32)
    return slc, h2ph


def ensure_foreign_stack(cache: Path, shape: tuple[int, int], epochs: int, chunk: int,
                         time_chunk: int | None) -> Path:
    """A stack written as another tool would: ``to_zarr`` with Zarr's default codecs."""
    import numpy as np
    import pandas as pd
    import xarray as xr

    tc = time_chunk or epochs
    path = cache / f"foreign_{shape[0]}x{shape[1]}x{epochs}_c{chunk}_t{tc}.zarr"
    if not path.exists():
        print(f"writing {path} with default Zarr codecs (once) ...", flush=True)
        slc, h2ph = _foreign_values(shape, epochs)
        dims = ("azimuth", "range", "time")
        ds = xr.Dataset({"complex": (dims, slc), "h2ph": (dims, h2ph)}, coords={
            "azimuth": np.arange(shape[0]), "range": np.arange(shape[1]),
            "time": pd.date_range("2021-01-01", periods=epochs, freq="12D")})
        tmp = path.with_name(path.name + ".tmp")
        ds.chunk({"azimuth": chunk, "range": chunk, "time": tc}).to_zarr(
            tmp, mode="w", zarr_format=3, consolidated=False)
        tmp.rename(path)
    import zarr

    group = zarr.open_group(path, mode="r+")
    if "wavelength" not in group.attrs:  # stores written before it carried its wavelength
        group.attrs["wavelength"] = WAVELENGTH  # (depsi run reads it from the store)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=2, default=(2000, 2000))
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--chunk", type=int, default=256, help="stored chunk side (pixels)")
    parser.add_argument("--foreign", action="store_true",
                        help="a stack written with plain to_zarr and default codecs")
    parser.add_argument("--time-chunk", type=int, default=None,
                        help="time chunk of the --foreign stack (default: time whole)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "depsi-bench")
    parser.add_argument("--repeat", type=int, default=2, help="best of this many runs")
    parser.add_argument("--peer", action="store_true",
                        help="also TU Delft DePSI's ps_selection, in its own venv (created "
                             "once: benchmarks/bench_peer.py's ensure_peer_venv)")
    parser.add_argument("--compare", type=str, default=None, metavar="DIR",
                        help="also run the engines and depsi run with the depsi package "
                             "found in DIR "
                             "(a checkout of an earlier commit), in the same rounds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    args.cache.mkdir(parents=True, exist_ok=True)
    # written in a child: its memory would otherwise count in every child's ru_maxrss
    if args.foreign:
        path = str(_in_child(ensure_foreign_stack, args.cache, tuple(args.shape), args.epochs,
                             args.chunk, args.time_chunk))
    else:
        path = str(_in_child(ensure_stack, args.cache, tuple(args.shape), args.epochs,
                             args.chunk))
    _in_child(case_read, path, 1)  # warm the page cache
    _in_child(_corner_store, path)  # the pipeline case's warm-up input, written once
    cores = os.cpu_count() or 1

    # rounds of every case in turn, so that each round's cases share the machine's load;
    # per case the fastest round is reported, and the median over rounds of its ratio to
    # that round's read limit
    cases = {"read1": (case_read, 1), "read_n": (case_read, cores),
             "stream": (case_stream, 2), "stream1": (case_stream, 2, 1), "default": (case_default,),
             "dask": (case_dask,), "pipeline": (case_pipeline,)}
    if args.peer:
        from bench_peer import ensure_peer_venv

        python = str(ensure_peer_venv(Path.home() / ".cache" / "depsi-bench" / "peer-venv"))
        cases["peer"] = (case_peer, python)
    if args.compare:
        cases |= {"stream_before": (case_stream, 2, None, args.compare),
                  "dask_before": (case_dask, args.compare),
                  "pipeline_before": (case_pipeline, args.compare)}
    rounds = [{name: _in_child(func, path, *fargs) for name, (func, *fargs) in cases.items()}
              for _ in range(args.repeat)]
    report(args, cores, rounds)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def report(args, cores: int, rounds: list[dict]) -> None:
    runs = {name: min((r[name] for r in rounds if r[name] is not None),
                      key=lambda run: run["seconds"], default=None) for name in rounds[0]}
    read1, read_n = runs["read1"], runs["read_n"]
    limit = min(read1["seconds"], read_n["seconds"])
    cpu_limit = read1["cpu"]
    gb = read1["nbytes"] / 1e9

    def ratios(name: str, key: str = "seconds") -> list[float]:
        return [r[name][key] / min(r["read1"]["seconds"], r["read_n"]["seconds"])
                for r in rounds if r.get(name) is not None]

    kind = "foreign (to_zarr, default codecs)" if args.foreign else "simulated"
    print(f"\nNAD selection, {kind} {args.shape[0]} x {args.shape[1]} x {args.epochs} stack, "
          f"chunks {args.chunk} x {args.chunk} x {args.time_chunk or args.epochs}, warm cache, "
          f"{mp.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min), "
          f"{len(rounds)} rounds")
    print(f"bytes read by a selection (complex + h2ph, in memory): {gb:.2f} GB; "
          f"{runs['stream']['points']} points selected")
    labels = {"read1": "read limit, 1 thread", "read_n": f"read limit, {cores} threads",
              "default": f"default (auto: {runs['default']['engine']}), computed",
              "stream": "stream, default workers", "stream1": "stream, 1 worker",
              "dask": "dask engine, computed", "pipeline": "depsi run: stack + selection",
              "peer": "TU Delft DePSI ps_selection", "stream_before": "before: stream engine",
              "dask_before": "before: dask, computed",
              "pipeline_before": "before: depsi run"}
    print(f"{'case':30s} {'seconds':>8s} {'x limit':>8s} {'median x':>8s} {'CPU s':>6s} "
          f"{'x CPU':>6s} {'peak MB':>8s}")
    for name, label in labels.items():
        run = runs.get(name)
        if run is None:
            continue
        print(f"{label:30s} {run['seconds']:8.2f} {run['seconds'] / limit:8.2f} "
              f"{_median(ratios(name)):8.2f} {run['cpu']:6.2f} {run['cpu'] / cpu_limit:6.2f} "
              f"{run['peak_mb']:8.0f}")
        if name in ("dask", "dask_before"):
            print(f"{'  of which to the lazy STM':30s} {run['lazy_seconds']:8.2f} "
                  f"{run['lazy_seconds'] / limit:8.2f} {_median(ratios(name, 'lazy_seconds')):8.2f}"
                  f" {run['lazy_cpu']:6.2f} {run['lazy_cpu'] / cpu_limit:6.2f}")
    print("x limit: fastest run over the fastest read; median x: median over rounds of the "
          "ratio to that round's read; x CPU: CPU seconds over those of the 1-thread read")
    peer, default = runs.get("peer"), runs["default"]
    if peer is not None:
        ours = (("the default", default), ("depsi run", runs["pipeline"]),
                ("before: depsi run", runs.get("pipeline_before")))
        keys = {"the default": "default", "depsi run": "pipeline",
                "before: depsi run": "pipeline_before"}
        for name, own in ((name, own) for name, own in ours if own is not None):
            per_round = [r["peer"]["seconds"] / r[keys[name]]["seconds"] for r in rounds
                         if r.get("peer") is not None and r.get(keys[name]) is not None]
            print(f"TU Delft DePSI over {name}: {peer['seconds'] / own['seconds']:.1f}x "
                  f"(wall, fastest runs; median over rounds {_median(per_round):.1f}x), "
                  f"{peer['cpu'] / own['cpu']:.1f}x (CPU)")
    stream, dask_run = runs["stream"], runs["dask"]
    print(f"peak memory relative to the stack's {gb * 1e3:.0f} MB: stream "
          f"{stream['peak_mb'] / (gb * 1e3):.1%}, dask {dask_run['peak_mb'] / (gb * 1e3):.1%}")

if __name__ == "__main__":
    main()
