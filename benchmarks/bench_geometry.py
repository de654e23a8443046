"""Benchmark: geometry from orbits against the loop users would otherwise write, in one run,
printed as ratios (no asserts).

* ``geocode``: range-Doppler geocoding of 10^6 points (``depsi.geometry.radar_to_geo``,
  Newton vectorised over points) against a per-point ``scipy.optimize.fsolve`` of the same two
  equations (zero Doppler, slant range) on the same spline orbit (timed on a subset,
  extrapolated), and against one evaluation of the orbit splines for every point (the floor of
  any geocoder on these orbits).
* ``look_geometry``: positions plus incidence, heading and LOS vectors, 10^6 points.
* ``baselines``: h2ph of 60 epochs for 10^5 points (one zero-Doppler solve per point and epoch).

Run: ``python benchmarks/bench_geometry.py [--quick]`` (``--quick``: 10x fewer points).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from scipy.optimize import fsolve

from depsi.geometry import (
    baselines,
    geodetic_to_ecef,
    look_geometry,
    radar_to_geo,
)
from depsi.geometry.range_doppler import pixel_time_range
from depsi.simulate import simulate_stack, simulated_geometry

QUICK = "--quick" in sys.argv
SCALE = 10 if QUICK else 1


def _timed(function, *args):
    start = time.perf_counter()
    out = function(*args)
    return time.perf_counter() - start, out


def _fsolve_loop(geometry, azimuth, range_, height):
    """What a user would write: one nonlinear solve per point."""
    orbit, grid = geometry.mother_orbit, geometry.grid
    t, slant = pixel_time_range(grid, orbit, azimuth, range_)
    position, velocity, _ = orbit.state(t)
    first = radar_to_geo(geometry, azimuth[:1], range_[:1], height)  # a start near the scene
    out = []
    for k in range(azimuth.size):
        def equations(lat_lon, k=k):
            target = geodetic_to_ecef(lat_lon[0], lat_lon[1], height)
            offset = target - position[k]
            return [offset @ velocity[k] / 7.5e3, np.linalg.norm(offset) - slant[k]]
        out.append(fsolve(equations, [first[0][0], first[1][0]], xtol=1e-13))
    return np.array(out)


def main() -> None:
    stack, _ = simulate_stack(shape=(1000, 1000), n_epochs=60, seed=0)
    geometry = simulated_geometry(stack)
    rng = np.random.default_rng(0)
    n = 1_000_000 // SCALE
    azimuth, range_ = rng.uniform(0, 999, n), rng.uniform(0, 999, n)

    t_vector, (lat, lon) = _timed(radar_to_geo, geometry, azimuth, range_, 0.0)
    few = 300 // SCALE
    t_loop, loop = _timed(_fsolve_loop, geometry, azimuth[:few], range_[:few], 0.0)
    t_splines, _ = _timed(geometry.mother_orbit.state,
                          pixel_time_range(geometry.grid, geometry.mother_orbit, azimuth, 0)[0])
    agree = np.max(np.abs(loop[:, 0] - lat[:few])) * 111e3
    per_point_loop = t_loop / few
    print(f"geocode {n:,} points: {t_vector:.2f} s ({n / t_vector:,.0f} points/s); per-point "
          f"fsolve loop {per_point_loop * 1e6:.0f} us/point -> {per_point_loop * n / t_vector:.0f}x"
          f" slower; the orbit splines alone {t_splines:.2f} s (geocoding = "
          f"{t_vector / t_splines:.1f}x one spline evaluation); fsolve agrees to {agree:.1e} m")

    t_look, _ = _timed(look_geometry, geometry, azimuth, range_, 0.0)
    print(f"look_geometry {n:,} points: {t_look:.2f} s ({n / t_look:,.0f} points/s)")
    m = 100_000 // SCALE
    t_base, _ = _timed(baselines, geometry, azimuth[:m], range_[:m], 0.0)
    print(f"baselines, {len(geometry.orbits)} epochs, {m:,} points: {t_base:.2f} s "
          f"({m * len(geometry.orbits) / t_base:,.0f} point-epochs/s)")


if __name__ == "__main__":
    main()
