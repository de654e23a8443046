"""Benchmark: the correlated height's host kriging (``correlated_height._krige_batch``), its
factored systems solved by SciPy's triangular solve a cell and NumPy's products (the
reference) against ``depsi.kernels.kriging_numba`` (each cell's substitution and sums in one
compiled pass), in the same process, printed as ratios (no asserts).

Batches shaped like the chain's: ``k`` sources a cell (128 at the chain's density), targets a
cell ``--widths`` (its cells hold 32 on average, their batches are as wide as their fullest
cell), ``--cells`` cells a batch; random sources over 800 m about each cell's centre, a
covariance of 300 m range with a nugget. Per cell, thread CPU time, the smallest of
``--repeat`` runs: NumPy's batched Cholesky and SciPy's solves and sums (the reference);
the compiled substitution and sums alone (NumPy's factor given) and with LAPACK's factor a cell
(the compiled path); and the whole batch (covariances included) each way. ``--points N`` also times
``estimate_correlated_height`` on N points (3 % of 10 m pixels, 40 epochs, the screen's model
given) each way, and the largest difference of its heights.

Run: ``python benchmarks/bench_kriging.py [--cells 300] [--widths 32 48 64] [--points 100000]``
"""

from __future__ import annotations

import argparse
import os
import time

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")  # as the chain runs the kriging

import numpy as np  # noqa: E402
from bench_ldl_columns import smallest  # noqa: E402 - the smallest thread CPU time of calls

from depsi.kernels import kriging_numba  # noqa: E402
from depsi.processing import correlated_height as module  # noqa: E402

SIGNAL = {"sill": 1.0, "range": 300.0, "shape": 1.0, "offset": 0.1}
NOISE = {"nugget": 0.5, "extra_sill": 0.0, "extra_range": 300.0}




def reference(flag: bool):
    """Set whether ``_krige_batch`` takes the compiled pass (True) or SciPy's (False)."""
    module._compiled_kriging = lambda: flag


def compare_batches(rng, n_cells, k, width, repeat):
    nb = rng.uniform(-400, 400, (n_cells, k, 2)).astype(np.float32)
    tp = rng.uniform(-40, 40, (n_cells, width, 2)).astype(np.float32)
    values = rng.standard_normal((n_cells, k))
    valid = np.ones((n_cells, width), dtype=bool)
    cov, c_nt = module._kriging_systems(nb, tp, signal=SIGNAL, noise=NOISE)
    lower = np.linalg.cholesky(cov)
    options = {"signal": SIGNAL, "noise": NOISE, "prior": 0.9}
    per_cell = 1e6 / n_cells
    factor = smallest(lambda: np.linalg.cholesky(cov), repeat) * per_cell
    reference(False)
    scipy = smallest(lambda: module._factored_sums(cov, values, c_nt), repeat) * per_cell
    kriging_numba.factored_sums(cov, values, c_nt)  # compiled and warm
    kriging_numba.whitened_sums(lower, values, c_nt)
    substitution = smallest(lambda: kriging_numba.whitened_sums(lower, values, c_nt),
                            repeat) * per_cell
    factored = smallest(lambda: kriging_numba.factored_sums(cov, values, c_nt),
                        repeat) * per_cell
    times, results = {}, {}
    for name, flag in (("scipy", False), ("compiled", True)):
        reference(flag)
        times[name] = smallest(
            lambda: module._krige_batch(nb, values, tp, valid, **options), repeat) * per_cell
        results[name] = module._krige_batch(nb, values, tp, valid, **options)
    scale = [float(np.abs(r).max()) for r in results["scipy"]]
    rel = max(float(np.abs(a - b).max()) / s
              for a, b, s in zip(results["compiled"], results["scipy"], scale))
    print(f"k {k:>3}, width {width:>3}, {n_cells} cells, us/cell: NumPy's Cholesky {factor:5.1f} "
          f"+ SciPy's solves and sums {scipy - factor:5.1f} = {scipy:5.1f}; compiled: "
          f"substitution and sums {substitution:5.1f}, with LAPACK's factor a cell "
          f"{factored:5.1f} ({scipy / factored:4.2f}x); whole batch {times['scipy']:5.1f} -> "
          f"{times['compiled']:5.1f} ({times['scipy'] / times['compiled']:4.2f}x); "
          f"max rel. diff {rel:.1e}")


def points(rng, n, n_epochs=40):
    """A point result of ``n`` points for ``estimate_correlated_height``."""
    import xarray as xr

    side = int(np.sqrt(n / 0.03))
    flat = rng.choice(side * side, n, replace=False)
    az, rg = np.divmod(flat, side)
    time_ = np.datetime64("2021-01-01") + 12 * np.arange(n_epochs).astype("timedelta64[D]")
    h2ph = np.tile(rng.normal(0, 2.2e-4, n_epochs), (n, 1)).astype(np.float32)
    return xr.Dataset({"height_error": ("space", rng.normal(0, 5.0, n)),
                       "velocity": ("space", np.zeros(n)),
                       "h2ph": (("space", "time"), h2ph)},
                      coords={"azimuth": ("space", az), "range": ("space", rg), "time": time_},
                      attrs={"wavelength": 0.0555, "azimuth_spacing": 10.0,
                             "range_spacing": 10.0})


def compare_estimate(rng, n, repeat):
    ds = points(rng, n)
    heights, seconds = {}, {}
    for name, flag in (("scipy", False), ("compiled", True)):
        reference(flag)
        walls = []
        for _ in range(repeat):
            start = time.perf_counter()
            out = module.estimate_correlated_height(ds, screen_variance=1.0,
                                                    screen_range=400.0)
            walls.append(time.perf_counter() - start)
        seconds[name], heights[name] = min(walls), out["height_error"].values
    diff = float(np.abs(heights["compiled"] - heights["scipy"]).max())
    print(f"estimate_correlated_height, {n} points, {os.cpu_count()} cores: SciPy "
          f"{seconds['scipy']:.2f} s, compiled {seconds['compiled']:.2f} s "
          f"({seconds['scipy'] / seconds['compiled']:4.2f}x); heights' max diff {diff:.1e} m "
          f"(of {float(np.abs(heights['scipy']).max()):.1f} m)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--k", type=int, default=128)
    parser.add_argument("--widths", type=int, nargs="*", default=[32, 48, 64])
    parser.add_argument("--points", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"host kriging, load average {os.getloadavg()[0]:.2f}, compiled kernel ready "
          f"{kriging_numba.ready()}")
    rng = np.random.default_rng(0)
    saved = module._compiled_kriging
    try:
        for width in args.widths:
            compare_batches(rng, args.cells, args.k, width, args.repeat)
        if args.points:
            compare_estimate(rng, args.points, args.repeat)
    finally:
        module._compiled_kriging = saved


if __name__ == "__main__":
    main()
