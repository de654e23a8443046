"""The sign of every velocity and height error, pinned by physics rather than by depsi's model.

The SLCs here are ``exp(-4 pi i R / wavelength)`` with ``R`` computed from the orbits
(:mod:`depsi.simulate.physical`): the SLC phase of ESA's Sentinel-1 products, ISCE2, SNAP,
GAMMA and DORIS (docs/concepts.md). Nothing of depsi's phase model enters them, so a sign error
in the model, in the interferograms or in a reader shows here, where the simulator (built from
the model) cannot see it.
"""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depsi import run_ps_chain
from depsi.conventions import phase_per_metre, years_since
from depsi.geometry import baselines
from depsi.io.writers import STACK_FORMATS, write_slc_stack
from depsi.pipeline.config import parse_config
from depsi.pipeline.input_stack import _open_stack_unchecked
from depsi.processing.interferogram import single_mother_interferograms
from depsi.simulate import simulate_stack
from depsi.simulate.physical import orbit_points, orbit_slcs
from depsi.simulate.scene import simulated_geometry


@pytest.fixture(scope="module")
def geometry_and_times():
    stack, _ = simulate_stack(shape=(200, 200), n_epochs=30, seed=3)
    return simulated_geometry(stack), stack["time"].values


def _truth(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    azimuth, range_ = rng.integers(0, 200, n), rng.integers(0, 200, n)
    height = rng.uniform(-20.0, 20.0, n)
    velocity = 0.01 * np.sin(azimuth / 60.0) + 0.005 * np.cos(range_ / 50.0)   # m/yr
    return azimuth, range_, height, velocity


def test_orbit_interferograms_follow_the_phase_model(geometry_and_times):
    """``phase = m2ph * (displacement + h2ph * height)`` of the interferograms depsi forms, to
    1e-4 rad, for targets moving towards the satellite and raised above the ellipsoid; with
    the displacement's sign turned, the model misses by about a radian."""
    geometry, times = geometry_and_times
    azimuth, range_, height, velocity = _truth(300)
    points = orbit_points(geometry, azimuth, range_, height, velocity, times)
    ifg = single_mother_interferograms(points).compute()
    m2ph = phase_per_metre(geometry.wavelength)
    years = years_since(times, times[geometry.mother])
    displacement = velocity[:, None] * years
    height_phase = m2ph * ifg["h2ph"].values * height[:, None]
    right = np.angle(np.exp(1j * (ifg["phase"].values - m2ph * displacement - height_phase)))
    flipped = np.angle(np.exp(1j * (ifg["phase"].values + m2ph * displacement - height_phase)))
    assert np.abs(right).max() < 1e-4          # measured 6.5e-5 (float32 SLCs)
    assert flipped.std() > 0.5                 # measured 0.89
    # and the height term: with its sign turned the model misses as well
    wrong_height = np.angle(np.exp(1j * (ifg["phase"].values - m2ph * displacement
                                         + height_phase)))
    assert wrong_height.std() > 0.5


@pytest.mark.slow
def test_the_chain_finds_motion_towards_the_satellite_positive(geometry_and_times):
    """The whole chain on orbit SLCs (0.15 rad of noise per epoch): velocities and height
    errors equal the targets' up to the chain's reference, with slope one, not minus one."""
    geometry, times = geometry_and_times
    azimuth, range_, height, velocity = _truth(400, seed=1)
    points = orbit_points(geometry, azimuth, range_, height, velocity, times)
    noise = np.random.default_rng(2).normal(0.0, 0.15, points["complex"].shape)
    points["complex"] = points["complex"] * np.exp(1j * noise).astype(np.complex64)
    result = run_ps_chain(points)
    index = result["point_index"].values
    estimated = result["velocity"].values.astype(np.float64)
    kept = np.isfinite(estimated)
    assert kept.sum() > 350
    slope = np.polyfit(velocity[index][kept], estimated[kept], 1)[0]
    assert 0.9 < slope < 1.1, slope
    # the height error's spatially correlated part is reported beside it (docs/chain.md)
    estimated_height = (result["height_error"].values.astype(np.float64)
                        + result["height_error_correlated"].values)
    slope_height = np.polyfit(height[index][kept], estimated_height[kept], 1)[0]
    assert 0.9 < slope_height < 1.1, slope_height


def _raster_stack(geometry, times, shape=(12, 14)):
    """Orbit SLCs and h2ph on ``(azimuth, range, time)``: a bowl moving towards the satellite."""
    azimuth, range_ = (a.ravel() for a in np.mgrid[0:shape[0], 0:shape[1]])
    velocity = 0.02 * np.exp(-((azimuth - 6) ** 2 + (range_ - 7) ** 2) / 30.0)
    height = 5.0 * np.sin(range_ / 3.0)
    years = years_since(times, times[geometry.mother])
    slc = orbit_slcs(geometry, azimuth, range_, height, velocity[:, None] * years)
    h2ph = baselines(geometry, azimuth, range_, 0.0)["h2ph"]
    dims = ("azimuth", "range", "time")
    stack = xr.Dataset(
        {"complex": (dims, slc.reshape(*shape, -1).astype(np.complex64)),
         "h2ph": (dims, h2ph.reshape(*shape, -1).astype(np.float32))},
        coords={"azimuth": np.arange(shape[0]), "range": np.arange(shape[1]), "time": times},
        attrs={"wavelength": geometry.wavelength,
               "mother_time": str(np.datetime_as_string(times[geometry.mother], unit="s"))})
    return stack, velocity.reshape(shape), height.reshape(shape)


@pytest.mark.parametrize("fmt", STACK_FORMATS)
def test_each_format_keeps_the_sign_of_the_orbit_slcs(tmp_path, geometry_and_times, fmt):
    """Orbit SLCs written in each format and read back: the same values, and interferograms
    whose phase says the bowl moves towards the satellite (a negative phase, m2ph < 0)."""
    geometry, times = geometry_and_times
    geometry = geometry.select_epochs(range(8, 20))
    times = times[8:20]
    stack, velocity, height = _raster_stack(geometry, times)
    path = write_slc_stack(tmp_path / "stack", stack, geometry, format=fmt)
    section = {"format": fmt, "path": str(path)}
    if fmt == "geotiff":
        section |= {"dates": [str(np.datetime64(t, "D")) for t in times],
                    "wavelength": geometry.wavelength}
    read = _open_stack_unchecked(parse_config({"input": section}))
    np.testing.assert_allclose(read["complex"].values, stack["complex"].values, atol=1e-5)
    points = read.stack(space=("azimuth", "range")).reset_index("space").transpose(
        "space", "time")
    points.attrs["mother_time"] = stack.attrs["mother_time"]
    ifg = single_mother_interferograms(points[["complex"]]).compute()
    last = ifg["phase"].values[:, -1].reshape(velocity.shape)   # a year or less from the mother
    moving = velocity > 0.01
    # the interferogram's h2ph is the mother's minus the epoch's (SNAP's per-SLC sign)
    h2ph = stack["h2ph"].values
    ifg_h2ph = h2ph[..., geometry.mother] - h2ph[..., -1]
    m2ph = phase_per_metre(geometry.wavelength)
    displacement = velocity * years_since(times[-1:], times[geometry.mother])[0]
    np.testing.assert_allclose(last, m2ph * (displacement + ifg_h2ph * height), atol=1e-3)
    # motion towards the satellite is negative phase: with its sign turned the model misses
    flipped = m2ph * (-displacement + ifg_h2ph * height)
    assert np.abs(last - flipped)[moving].min() > 0.4      # 2 m2ph d, d about 2.5 mm
