"""Benchmark: the chain's per-point passes that built large temporaries, each compiled
(:mod:`depsi.kernels.gather_numba`) or rewritten against its NumPy form, in the same process,
on one block of the size the chain gives it, printed as ratios (no asserts).

* ``gaussian_mean``: a block of :data:`~depsi.processing.atmosphere.GAUSSIAN_BLOCK` targets,
  16 neighbours among 1.5 * 10^5 float32 sources of 60 epochs (the atmosphere's screen at
  10^6 points), sources and targets in raster order as in a store; NumPy's
  ``(targets, k, epochs)`` gather and batched GEMV against the kernel.
* ``moved``: a block of correlated_height's ``BLOCK`` points, 60 epochs, float32 h2ph per epoch,
  into the step's array.
* ``leak gain``: the correlated height's ``_gain_block`` on the same block.
* ``displacement_std``: a block of model_fit's ``FIT_BLOCK`` points, into the step's array.
* ``used_rows``: a densification chunk's neighbour rows (5 * 10^4 candidates, 16 neighbours
  among 1.5 * 10^5 first-order points): ``np.unique(return_inverse=True)`` against the marks.
* ``take``: a chunk's accepted rows (90 % of 5 * 10^4, 60 epochs float32) into the result's
  rows: a fancy-index copy then a copy, against ``np.take(out=)``.

Each line: the NumPy form's and the new one's smallest CPU time of ``--repeat`` calls (process
time, all threads; one thread works here), their ratio, and the minor page faults of one call
(fresh pages of the temporaries, where the allocator returned them to the system).

Run: ``python benchmarks/bench_gather.py [--repeat 5]``. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
from scipy.spatial import cKDTree

from depsi.kernels import gather_numba
from depsi.processing import atmosphere, correlated_height, model_fit
from depsi.processing.densification import _used_rows

N_EPOCHS = 60


def _raster(positions: np.ndarray) -> np.ndarray:
    """``positions`` in raster order (rows of 50 m, then x), as a store's points are: a
    block's neighbours are near each other in memory."""
    return positions[np.lexsort((positions[:, 0], np.floor(positions[:, 1] / 50.0)))]


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(func, repeat: int) -> tuple[float, int]:
    """Smallest process time of ``repeat`` calls (after one untimed call) and the fewest minor
    page faults of one."""
    func()
    times, faults = [], []
    for _ in range(repeat):
        start, fault = time.process_time(), _faults()
        func()
        times.append(time.process_time() - start)
        faults.append(_faults() - fault)
    return min(times), min(faults)


def timed(compiled: bool, function, *args, **kwargs):
    """A call of ``function`` with the compiled kernels, or with the NumPy references (as
    where Numba cannot be loaded)."""
    def call():
        saved = gather_numba.ready
        if not compiled:
            gather_numba.ready = lambda: False  # type: ignore[method-assign]
        try:
            function(*args, **kwargs)
        finally:
            gather_numba.ready = saved  # type: ignore[method-assign]
    return call


def line(name: str, old, new, repeat: int) -> None:
    (t_old, f_old), (t_new, f_new) = measure(old, repeat), measure(new, repeat)
    print(f"| {name} | {1e3 * t_old:.1f} | {1e3 * t_new:.1f} | {t_old / t_new:.1f}x "
          f"| {f_old:,} | {f_new:,} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    assert gather_numba.ready(), "compile the kernels first: python -m depsi.kernels.warmup"
    rng = np.random.default_rng(0)
    sources = _raster(rng.uniform(0, 2e4, (150_000, 2)))
    screen = rng.normal(0, 1, (len(sources), N_EPOCHS)).astype(np.float32)
    tree = cKDTree(sources)
    targets = _raster(rng.uniform(0, 2e4, (4 * atmosphere.GAUSSIAN_BLOCK, 2)))
    dist, idx = tree.query(targets[:atmosphere.GAUSSIAN_BLOCK], k=16)

    n = correlated_height.BLOCK
    series = rng.normal(0, 30, (n, N_EPOCHS)).astype(np.float32)
    h2ph = rng.normal(0, 3e-4, (n, N_EPOCHS)).astype(np.float32)
    field = rng.normal(0, 5, n)
    years = np.linspace(-2.0, 2.0, N_EPOCHS)

    m = model_fit.FIT_BLOCK
    share = rng.uniform(0.5, 1.5, N_EPOCHS)
    cv, hs = rng.uniform(0, 1e-5, m), rng.uniform(0, 3, m)

    _, chunk_idx = tree.query(_raster(rng.uniform(0, 2e4, (200_000, 2)))[:50_000], k=16)
    part = rng.normal(0, 1, (50_000, N_EPOCHS)).astype(np.float32)
    keep = np.flatnonzero(rng.uniform(size=50_000) < 0.9)

    def fancy():
        out = np.empty_like(part)  # the result's rows, untouched as in the step
        out[:keep.size] = part[keep]

    def take():
        out = np.empty_like(part)
        np.take(part, keep, axis=0, mode="clip", out=out[:keep.size])

    print("| pass | NumPy CPU ms | new CPU ms | ratio | NumPy minor faults | new minor faults |")
    print("|---|---|---|---|---|---|")
    args = (dist, idx, screen, 400.0)
    line(f"gaussian_mean ({atmosphere.GAUSSIAN_BLOCK} x 16 x {N_EPOCHS})",
         timed(False, atmosphere.gaussian_mean, *args),
         timed(True, atmosphere.gaussian_mean, *args), repeat)
    # both into the step's array, as the steps write them
    args, kwargs = (series, h2ph, field, -226.4), {"out": np.empty_like(series)}
    line(f"moved ({n} x {N_EPOCHS})",
         timed(False, correlated_height._moved_block, *args, **kwargs),
         timed(True, correlated_height._moved_block, *args, **kwargs), repeat)
    line(f"leak gain ({n} x {N_EPOCHS})",
         timed(False, correlated_height._gain_block, h2ph, years=years, m2ph=-226.4),
         timed(True, correlated_height._gain_block, h2ph, years=years, m2ph=-226.4), repeat)
    args = (h2ph[:m], cv, hs)
    kwargs = {"epoch_share": share, "n_epochs": N_EPOCHS, "out": np.empty_like(series[:m])}
    line(f"displacement_std ({m} x {N_EPOCHS})",
         timed(False, model_fit._displacement_std_block, *args, **kwargs),
         timed(True, model_fit._displacement_std_block, *args, **kwargs), repeat)
    line("used_rows (50,000 x 16 of 150,000)",
         lambda: np.unique(chunk_idx, return_inverse=True), lambda: _used_rows(chunk_idx),
         repeat)
    line(f"take ({keep.size} of 50,000 x {N_EPOCHS})", fancy, take, repeat)


if __name__ == "__main__":
    main()
