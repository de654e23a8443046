"""Benchmark: network formation and sparse spatial integration at 10^4, 3x10^4 and 10^5 points.

Synthetic arcs (exact differences of random point values plus small noise, coherence 0.9) on a
Delaunay network; prints the time of ``form_network`` and ``integrate_network`` per size and the
growth of the integration time against the growth of the number of points (1.0 = linear).
Run: ``python benchmarks/bench_network.py [n_epochs]``.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import xarray as xr

from depsi.processing.integration import integrate_network
from depsi.processing.network import form_network


def synthetic(n_points: int, n_epochs: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    side = int(np.sqrt(n_points) * 10)
    times = np.datetime64("2020-01-01") + np.arange(n_epochs) * np.timedelta64(12, "D")
    points = xr.Dataset(
        {"phase": (("space", "time"), rng.uniform(-np.pi, np.pi, (n_points, n_epochs))
                   .astype("f4")),
         "h2ph": (("space", "time"), np.tile(rng.normal(0, 1e-4, n_epochs), (n_points, 1))
                  .astype("f4"))},
        coords={"azimuth": ("space", rng.integers(0, side, n_points)),
                "range": ("space", rng.integers(0, side, n_points)), "time": times},
        attrs={"wavelength": 0.0555, "mother_time": str(times[0])})
    t0 = time.perf_counter()
    arcs = form_network(points)
    t_network = time.perf_counter() - t0
    m = arcs.sizes["arc"]
    src, tgt = arcs.source.values, arcs.target.values
    phase = points.phase.values.astype("f8")
    difference = phase[tgt] - phase[src]
    ambiguity = np.rint((difference - arcs.phase.values) / (2 * np.pi))
    velocity = rng.normal(0, 0.01, n_points)
    height = rng.normal(0, 10, n_points)
    arcs = arcs.assign(
        velocity=("arc", velocity[tgt] - velocity[src] + rng.normal(0, 1e-5, m)),
        height_error=("arc", height[tgt] - height[src] + rng.normal(0, 1e-3, m)),
        temporal_coherence=("arc", np.full(m, 0.9)),
        ambiguity=(("arc", "time"), ambiguity.astype("i4")),
    )
    return points, arcs, t_network


def main(n_epochs: int = 30) -> None:
    timings = []
    for n in (10_000, 30_000, 100_000):
        points, arcs, t_network = synthetic(n, n_epochs)
        t0 = time.perf_counter()
        result = integrate_network(points, arcs)
        t_int = time.perf_counter() - t0
        timings.append((n, arcs.sizes["arc"], t_network, t_int))
        print(f"{n:>7d} points {arcs.sizes['arc']:>7d} arcs {n_epochs} epochs: "
              f"network {t_network:6.2f} s, integration {t_int:6.2f} s "
              f"({result.attrs['n_points_kept']} points kept)")
    for (n0, _, _, t0), (n1, _, _, t1) in zip(timings[:-1], timings[1:]):
        print(f"{n0} -> {n1} points: x{n1 / n0:.1f} points, x{t1 / t0:.2f} time, "
              f"scaling exponent {np.log(t1 / t0) / np.log(n1 / n0):.2f} (1.0 = linear)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
