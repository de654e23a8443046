"""Benchmark of the PS chain: one run prints every figure below.

1. Arc estimation: arcs per second of ``estimate_arcs`` (periodogram, 60 epochs).
2. Spatial integration: ``integrate_network`` time for 10^3, 10^4, 10^5 points (Delaunay,
   about 3 arcs per point; synthetic arc estimates with noise), and the growth factor of the
   time against the growth of the points (1.0 = linear).
3. Densification: candidate points per second of ``densify`` (k = 3).
4. End to end: a simulated 1000 x 1000 x 60 stack stored in Zarr (cached in
   ``$DEPSI_BENCH_CACHE``, default ``/tmp/depsi-bench-cache``) -> ``ps_selection`` ->
   ``run_ps_chain``, against one plain read of the store's bytes (every file read once) and one
   decoded read of ``complex``.

Run: ``python benchmarks/bench_chain.py [--quick]`` (``--quick`` skips 10^5 and uses a
500 x 500 stack). Not part of the test suite.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import xarray as xr

from depsi import run_ps_chain
from depsi.conventions import wrap_phase
from depsi.processing.arcs import estimate_arcs
from depsi.processing.densification import densify
from depsi.processing.integration import integrate_network
from depsi.processing.network import form_network

N_EPOCHS = 60
WAVELENGTH = 0.0556
M2PH = -4 * np.pi / WAVELENGTH


def _points(n_points, n_epochs=N_EPOCHS, seed=0):
    """Random points of a smooth velocity field with known truth (noise 0.3 rad)."""
    rng = np.random.default_rng(seed)
    side = int(np.sqrt(n_points) * 10)
    times = np.datetime64("2020-01-01") + np.arange(n_epochs) * np.timedelta64(12, "D")
    years = np.arange(n_epochs) * 12 / 365.25
    az, rg = rng.integers(0, side, n_points), rng.integers(0, side, n_points)
    velocity = 0.01 * np.sin(az / side * 3) * np.cos(rg / side * 2)
    height = rng.normal(0, 5, n_points)
    h2ph = rng.normal(0, 2e-4, n_epochs)
    h2ph[0] = 0
    phase = wrap_phase(M2PH * (velocity[:, None] * years + height[:, None] * h2ph)
                       + rng.normal(0, 0.3, (n_points, n_epochs)))
    return xr.Dataset(
        {"phase": (("space", "time"), phase.astype("f4")),
         "h2ph": (("space", "time"), np.tile(h2ph, (n_points, 1)).astype("f4"))},
        coords={"azimuth": ("space", az), "range": ("space", rg), "time": times},
        attrs={"wavelength": WAVELENGTH, "mother_time": str(times[0])})


def _timed(func, *args, **kwargs):
    start = time.perf_counter()
    out = func(*args, **kwargs)
    return out, time.perf_counter() - start


def bench_arcs(n_points=4000):
    arcs = form_network(_points(n_points))
    est, seconds = _timed(lambda: estimate_arcs(arcs).compute())
    n = arcs.sizes["arc"]
    print(f"arc estimation: {n} arcs x {N_EPOCHS} epochs in {seconds:.2f} s = "
          f"{n / seconds:,.0f} arcs/s (median coherence "
          f"{np.median(est.temporal_coherence.values):.2f})")
    return est


def _synthetic_estimates(points, arcs, rng):
    """Arc estimates = exact differences of the points' values plus noise (no periodogram)."""
    src, tgt = arcs.source.values, arcs.target.values
    n_arcs, n_epochs = arcs.sizes["arc"], arcs.sizes["time"]
    value = rng.normal(0, 1, (points.sizes["space"], 2 + n_epochs))
    diff = value[tgt] - value[src] + rng.normal(0, 0.05, (n_arcs, 2 + n_epochs))
    unwrapped = diff[:, 2:] * 3
    return arcs.assign(
        velocity=("arc", diff[:, 0] * 1e-3), height_error=("arc", diff[:, 1]),
        temporal_coherence=("arc", np.full(n_arcs, 0.9)),
        phase=(("arc", "time"), wrap_phase(unwrapped).astype("f4")),
        ambiguity=(("arc", "time"),
                   np.rint((unwrapped - wrap_phase(unwrapped)) / (2 * np.pi)).astype("i4")))


def bench_integration(sizes):
    rng = np.random.default_rng(1)
    times = []
    for n in sizes:
        points = _points(n, seed=n)
        arcs = form_network(points)
        arcs = _synthetic_estimates(points, arcs.compute(), rng)
        result, seconds = _timed(integrate_network, points, arcs)
        times.append(seconds)
        print(f"integration: {n:>7,} points, {arcs.sizes['arc']:>7,} arcs, {N_EPOCHS} epochs: "
              f"{seconds:6.2f} s ({result.attrs['n_arcs_removed_wtest']} arcs removed by "
              f"w-test)")
    for (n0, t0), (n1, t1) in zip(zip(sizes, times), zip(sizes[1:], times[1:])):
        growth = np.log(t1 / t0) / np.log(n1 / n0)
        print(f"  {n0:,} -> {n1:,} points: time x{t1 / t0:.1f} for points x{n1 / n0:.0f} "
              f"(growth exponent {growth:.2f}; 1.0 = linear)")


def bench_densification(n_first=5000, n_candidates=50_000):
    first = _points(n_first + n_candidates, seed=3)
    fo = first.isel(space=slice(0, n_first))
    cand = first.isel(space=slice(n_first, None)).chunk({"space": 8192})
    result = integrate_network(fo, estimate_arcs(form_network(fo, method="redundant")).compute())
    dense, seconds = _timed(lambda: densify(cand, result).compute())
    print(f"densification: {n_candidates:,} candidates (k=3) against {n_first:,} first-order "
          f"points in {seconds:.2f} s = {n_candidates / seconds:,.0f} points/s "
          f"({dense.accepted.values.mean():.0%} accepted)")


def _stack(cache: Path, shape, n_epochs):
    from depsi.simulate import write_stack_zarr

    store = cache / f"stack_{shape[0]}x{shape[1]}x{n_epochs}.zarr"
    if not store.exists():
        cache.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        write_stack_zarr(store, shape=shape, n_epochs=n_epochs, seed=5, ps_fraction=0.01,
                         aps_std=1.0, ps_noise_std=0.4, height_error_std=8.0,
                         velocity_max=0.03, progress=False)
        print(f"(wrote {store} in {time.perf_counter() - start:.0f} s)")
    return store


def _plain_read(store: Path) -> tuple[int, float]:
    start = time.perf_counter()
    total = 0
    for path in store.rglob("*"):
        if path.is_file() and "truth" not in path.parts:
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    total += len(chunk)
    return total, time.perf_counter() - start


def bench_end_to_end(shape, n_epochs=N_EPOCHS):
    from depsi.processing.selection import ps_selection
    from depsi.simulate import PIXEL_SPACING

    cache = Path(os.environ.get("DEPSI_BENCH_CACHE", "/tmp/depsi-bench-cache"))
    store = _stack(cache, shape, n_epochs)
    n_bytes, t_read = _plain_read(store)
    stack = xr.open_zarr(store)
    _, t_decode = _timed(lambda: stack["complex"].data.sum().compute())

    def chain():
        ps = ps_selection(xr.open_zarr(store), method="nad", engine="stream")
        ps.attrs.update(azimuth_spacing=PIXEL_SPACING[0], range_spacing=PIXEL_SPACING[1])
        t_sel = time.perf_counter()
        return ps, run_ps_chain(ps), t_sel

    start = time.perf_counter()
    ps, result, t_sel = chain()
    total = time.perf_counter() - start
    print(f"end to end: {shape[0]}x{shape[1]}x{n_epochs} stack ({n_bytes / 2**20:,.0f} MiB "
          f"stored): selection {t_sel - start:.1f} s + chain {total - (t_sel - start):.1f} s = "
          f"{total:.1f} s for {ps.sizes['space']:,} PS -> {result.sizes['space']:,} points")
    print(f"  plain read of the bytes {t_read:.2f} s; decoded read of complex {t_decode:.2f} s; "
          f"end to end = {total / t_read:.1f}x the plain read, "
          f"{total / t_decode:.1f}x the decoded read")


def main(argv):
    quick = "--quick" in argv
    print(f"bench_chain: {os.cpu_count()} CPUs, devices: CPU")
    bench_arcs()
    bench_integration([1_000, 10_000] if quick else [1_000, 10_000, 100_000])
    bench_densification(n_candidates=10_000 if quick else 50_000)
    bench_end_to_end((500, 500) if quick else (1000, 1000))


if __name__ == "__main__":
    main(sys.argv[1:])
