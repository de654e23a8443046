"""Growth of the chain's steps with the number of points, on any layout.

A user measured densification quadratic in the number of chunks on points stored in raster order
(10^5 -> 10^6 PS: 2.2 s -> 256 s): every batch of chunks materialised the whole graph. This
times the chain's steps at two sizes for three layouts of the same scene and prints, per layout
and step, the growth exponent ``log(t2/t1) / log(n2/n1)`` (1 = linear):

- ``morton``: the store as ``_scale_scene.py`` writes it (Morton order, 32 MB space chunks);
- ``raster``: the same points in raster order (azimuth, then range), same chunks;
- ``chunks1e4``: Morton order in space chunks of 10^4 points (many chunks).

Each layout is written to its own Zarr store (cached with the scene in ``--cache``, default
``$TMPDIR/depsi-bench-growth``) and opened lazily, so a step reads it as it would read a user's
store. The steps are those of ``run_ps_chain`` (see ``bench_scale.py``), run one by one in this
process and timed in CPU seconds of the process (all threads): on a machine shared with other
work, wall time says more about the neighbours than about the step. Besides the steps:
``batch cuts``, the CPU time densification spent cutting its batches' graphs (in
``culled_rows``, or ``culled`` where the chain slices first); ``batches: culled(isel)`` and
``batches: culled_rows``, densification's loop over batches of two chunks on its lazy result,
graphs only (no compute), cut as the chain cuts them (``culled(dense.isel(space=rows))``) and
with :func:`depsi.stm.dask_tools.culled_rows`. The baseline is the same step at the smaller
size in the same run.

Checks (asserts, here, not in the test suite): the exponent of each step named in ``--check``
(default densification) is at most ``--max-exponent`` (default 1.1) on every layout.

Run: ``python benchmarks/bench_growth.py [--sizes 5e4 2e5] [--layouts morton raster chunks1e4]
[--check densification] [--steps densification]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import tempfile
import time
from pathlib import Path

import _scale_scene as scene_module
import numpy as np
import xarray as xr

from depsi.pipeline.steps import CHAIN_STEPS

#: The layouts timed, by name: (order of the points, points per space chunk or None: the store's).
LAYOUTS = {"morton": ("morton", None), "raster": ("raster", None),
           "chunks1e4": ("morton", 10_000)}
#: The steps of ``run_ps_chain``, as ``bench_scale.py`` times them (its input's preparation
#: first).
STEPS = ("prepare", *CHAIN_STEPS)


def scene_store(n_points: int, cache: Path) -> Path:
    """The Morton-ordered point store of an ``n_points`` scene (written once, then reused)."""
    folder = cache / f"n{n_points}-v{scene_module.GENERATOR_VERSION}"
    if not folder.exists():
        scene_module.write_scene(n_points, folder)
    return folder / scene_module.PS_STORE


def layout_store(n_points: int, layout: str, cache: Path) -> Path:
    """The scene's points in ``layout``, as a Zarr store of their own (written once)."""
    source = scene_store(n_points, cache)
    order, chunk = LAYOUTS[layout]
    if order == "morton" and chunk is None:
        return source
    path = cache / f"n{n_points}-v{scene_module.GENERATOR_VERSION}" / f"{layout}.zarr"
    if path.exists():
        return path
    ds = xr.open_zarr(source, consolidated=False).compute()
    if order == "raster":
        ds = ds.isel(space=np.lexsort((ds["range"].values, ds["azimuth"].values)))
    size = chunk or xr.open_zarr(source, consolidated=False).chunks["space"][0]
    ds = ds.chunk({"space": size, "time": -1})
    for var in ds.variables.values():
        var.encoding = {}
    tmp = path.with_name(f".{path.name}.writing")
    ds.to_zarr(tmp, mode="w", consolidated=False)
    os.replace(tmp, path)
    return path


def chain_modules():
    """The module of densification's step and ``chain_config`` (where they now live)."""
    from depsi.pipeline.chain_config import chain_config
    from depsi.pipeline.steps import densification

    return densification, chain_config


class _Instrumented:
    """Wraps the chain's batch cutter (``culled_rows``, or ``culled`` where the chain still
    slices first), adding up its seconds, and ``densify``, keeping the lazy result, whose batch
    loop is then timed on its own."""

    def __init__(self, chain):
        self.chain, self.seconds, self.dense = chain, 0.0, None
        self.cutter = "culled_rows" if hasattr(chain, "culled_rows") else "culled"
        self.originals = {self.cutter: getattr(chain, self.cutter), "densify": chain.densify}

    def __enter__(self):
        def cut(*args, **kwargs):
            start = time.process_time()
            try:
                return self.originals[self.cutter](*args, **kwargs)
            finally:
                self.seconds += time.process_time() - start

        def densify(*args, **kwargs):
            self.dense = self.originals["densify"](*args, **kwargs)
            return self.dense

        setattr(self.chain, self.cutter, cut)
        self.chain.densify = densify
        return self

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(self.chain, name, original)


def batch_loop_seconds(dense: xr.Dataset, cut) -> float:
    """CPU seconds of densification's loop over batches of chunks, graphs only (no compute):
    ``cut(dense, rows)`` for every batch of two chunks."""
    bounds = np.cumsum((0,) + dense.chunks["space"])
    start = time.process_time()
    for first in range(0, len(bounds) - 1, 2):
        cut(dense, slice(int(bounds[first]), int(bounds[min(first + 2, len(bounds) - 1)])))
    return time.process_time() - start


def run_steps(path: Path, steps: tuple[str, ...]) -> dict[str, float]:
    """CPU seconds (this process, all threads) of each chain step on the store at ``path``
    (all run up to densification; those of ``steps`` kept), of ``culled`` within
    densification, and of densification's batch loop on its graph: as the chain slices
    (``culled(isel)``) and with :func:`depsi.stm.dask_tools.culled_rows`."""
    from depsi.stm.dask_tools import culled, culled_rows

    chain, chain_config = chain_modules()
    ps_stm = xr.open_zarr(path, consolidated=False).chunk({"time": -1})
    config = chain_config(None)
    times = {}

    def timed(name, func):
        start = time.process_time()
        out = func()
        times[name] = time.process_time() - start
        return out

    from depsi.pipeline.steps import run_step
    from depsi.pipeline.steps.selection import prepare_points

    points = timed("prepare", lambda: prepare_points(ps_stm))
    network = timed("network", lambda: run_step("network", config, selection=points))
    arcs = [timed("arcs", lambda: run_step("arcs", config, network=network))]
    first = [timed("integration", lambda: run_step("integration", config, network=network,
                                                   arcs=arcs.pop()))]
    first = [timed("atmosphere", lambda: run_step("atmosphere", config, network=network,
                                                  integration=first.pop()))]
    with _Instrumented(chain) as probe:
        dense = [timed("densification", lambda: run_step(
            "densification", config, selection=points, atmosphere=first[0]))]
    times["batch cuts"] = probe.seconds
    if probe.dense is not None:
        times["batches: culled(isel)"] = batch_loop_seconds(
            probe.dense, lambda ds, rows: culled(ds.isel(space=rows)))
        times["batches: culled_rows"] = batch_loop_seconds(probe.dense, culled_rows)
    probe.dense = None
    if "model" in steps:
        timed("model", lambda: run_step("model", config, selection=points,
                                        atmosphere=first.pop(), densification=dense.pop()))
    return {name: t for name, t in times.items() if name in steps or name not in STEPS}


def exponent(t1: float, t2: float, n1: int, n2: int) -> float:
    return math.log(max(t2, 1e-9) / max(t1, 1e-9)) / math.log(n2 / n1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs=2, type=float, default=[5e4, 2e5])
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--check", nargs="*", choices=STEPS, default=["densification"])
    parser.add_argument("--max-exponent", type=float, default=1.1)
    parser.add_argument("--cache", type=Path,
                        default=Path(tempfile.gettempdir()) / "depsi-bench-growth")
    args = parser.parse_args(argv)
    n1, n2 = (int(n) for n in args.sizes)
    steps = tuple(args.steps)
    args.cache.mkdir(parents=True, exist_ok=True)
    results = {}
    for layout in args.layouts:
        for n in (n1, n2):
            path = layout_store(n, layout, args.cache)
            chunks = len(xr.open_zarr(path, consolidated=False).chunks["space"])
            results[layout, n] = run_steps(path, steps)
            gc.collect()
            print(f"{layout:10s} n={n:>9,d} chunks={chunks:>4d} "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in results[layout, n].items()),
                  flush=True)
    print(f"\nCPU s\n\n| layout | step | {n1:,} | {n2:,} | exponent |\n|---|---|---|---|---|")
    failed = []
    for layout in args.layouts:
        for step in results[layout, n1]:
            t1, t2 = results[layout, n1][step], results[layout, n2][step]
            e = exponent(t1, t2, n1, n2)
            print(f"| {layout} | {step} | {t1:.2f} | {t2:.2f} | {e:.2f} |")
            if step in args.check and e > args.max_exponent:
                failed.append(f"{layout} {step}: exponent {e:.2f} > {args.max_exponent}")
    for line in failed:
        print("FAILED:", line)
    assert not failed, "; ".join(failed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
