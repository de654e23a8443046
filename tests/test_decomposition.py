"""Ascending + descending LOS velocities to vertical and east (depsi.processing.decomposition).

The scenes are synthetic, with their own oracle: a smooth vertical and east velocity field, two
point sets with Sentinel-1-like geometry and LOS velocities formed exactly from the field.

LOS unit vector from heading and incidence (derived here, independently of depsi.geometry):
the heading ``alpha`` is the flight direction, clockwise from north. A right-looking radar looks
at azimuth ``alpha + 90 deg``, so the horizontal part of the vector from the ground to the
satellite points at ``alpha - 90 deg``, with length ``sin(theta)`` for the incidence ``theta``
at the ground, and its up part is ``cos(theta)``:

    l = (sin(theta) sin(alpha - 90), sin(theta) cos(alpha - 90), cos(theta))
      = (-sin(theta) cos(alpha), sin(theta) sin(alpha), cos(theta))     (east, north, up)

Ascending (alpha ~ -12 deg) looks east, so ``l`` points west (e < 0); descending (alpha ~ -168)
looks west, ``l`` points east; both have a small negative north part.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import xarray as xr
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from depsi.processing.decomposition import MIN_DETERMINANT, decompose
from depsi.stm.schema import STMValidationError

LAT0, LON0 = 52.0, 4.9
_A, _E2 = 6378137.0, 6.69437999014e-3  # WGS84


def metres_per_degree(lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(north, east) metres per degree of latitude and longitude on the WGS84 ellipsoid."""
    s2 = np.sin(np.deg2rad(lat)) ** 2
    meridian = _A * (1 - _E2) / (1 - _E2 * s2) ** 1.5
    normal = _A / np.sqrt(1 - _E2 * s2)
    return np.deg2rad(meridian), np.deg2rad(normal * np.cos(np.deg2rad(lat)))


def los_vector(heading_deg, incidence_deg) -> np.ndarray:
    """Ground-to-satellite unit vector (east, north, up) of a right-looking radar, (..., 3)."""
    alpha, theta = np.deg2rad(heading_deg), np.deg2rad(incidence_deg)
    return np.stack(np.broadcast_arrays(-np.sin(theta) * np.cos(alpha),
                                        np.sin(theta) * np.sin(alpha), np.cos(theta)), axis=-1)


# the field: amplitudes (m/yr) and wavelengths (degrees) of its smooth terms
UP_MEAN, UP_AMP, UP_WL = -0.008, 0.004, (0.05, 0.08)
EAST_MEAN, EAST_AMP, EAST_WL = 0.003, 0.002, (0.07, 0.05)


def field(lat, lon) -> tuple[np.ndarray, np.ndarray]:
    """(east, up) velocity in m/yr."""
    k = 2 * np.pi
    up = UP_MEAN + UP_AMP * np.sin(k * (lat - LAT0) / UP_WL[0]) * np.cos(
        k * (lon - LON0) / UP_WL[1])
    east = EAST_MEAN + EAST_AMP * np.cos(k * (lat - LAT0) / EAST_WL[0]) * np.sin(
        k * (lon - LON0) / EAST_WL[1])
    return east, up


def field_gradient_bound() -> tuple[float, float]:
    """Upper bounds of |grad v_east| and |grad v_up| in m/yr per metre over the scene."""
    m_lat, m_lon = metres_per_degree(np.array(LAT0 + 0.03))  # smallest east scale of the box
    k = 2 * np.pi
    east = np.hypot(EAST_AMP * k / EAST_WL[0] / m_lat, EAST_AMP * k / EAST_WL[1] / m_lon)
    up = np.hypot(UP_AMP * k / UP_WL[0] / m_lat, UP_AMP * k / UP_WL[1] / m_lon)
    return float(east), float(up)


def scatter(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points over a box of about 5.5 x 5.5 km about (LAT0, LON0)."""
    rng = np.random.default_rng(seed)
    return LAT0 + rng.uniform(-0.025, 0.025, n), LON0 + rng.uniform(-0.04, 0.04, n)


def sentinel1_los(lat, lon, orbit: str, seed: int) -> np.ndarray:
    """Sentinel-1 IW geometry: incidence 30-45 deg across the swath, near range on the side
    the satellite is on (west for ascending, east for descending)."""
    rng = np.random.default_rng(seed)
    across = (lon - (LON0 - 0.04)) / 0.08  # 0 at the west edge, 1 at the east edge
    if orbit == "ascending":
        heading, incidence = -12.0, 30.0 + 15.0 * across
    else:
        heading, incidence = -168.0, 30.0 + 15.0 * (1.0 - across)
    return los_vector(heading + rng.uniform(-0.5, 0.5, lat.size), incidence)


def track(lat, lon, los, velocity, std=None, displacement=None, time=None) -> xr.Dataset:
    ds = xr.Dataset({"velocity": ("space", velocity, {"units": "m/yr"}),
                     "los_east": ("space", los[:, 0]), "los_north": ("space", los[:, 1]),
                     "los_up": ("space", los[:, 2])},
                    coords={"lat": ("space", lat), "lon": ("space", lon)})
    if std is not None:
        ds["velocity_std"] = ("space", std, {"units": "m/yr"})
    if displacement is not None:
        ds = ds.assign_coords(time=time)
        ds["displacement"] = (("space", "time"), displacement, {"units": "m"})
    return ds


def observe(lat, lon, los, north: float = 0.0) -> np.ndarray:
    """LOS velocity, exactly, of the field (plus a uniform north velocity) at the points."""
    east, up = field(lat, lon)
    return los[:, 0] * east + los[:, 1] * north + los[:, 2] * up


def coincident_pair(n: int = 200, seed: int = 0, north: float = 0.0):
    lat, lon = scatter(n, seed)
    los_a, los_d = sentinel1_los(lat, lon, "ascending", 1), sentinel1_los(lat, lon, "descending", 2)
    asc = track(lat, lon, los_a, observe(lat, lon, los_a, north))
    desc = track(lat, lon, los_d, observe(lat, lon, los_d, north))
    return asc, desc


# ------------------------------------------------------------------------------ geometry
def test_the_los_formula_gives_sentinel1_look_directions():
    asc, desc = los_vector(-12.0, 38.0), los_vector(-168.0, 38.0)
    np.testing.assert_allclose([np.linalg.norm(asc), np.linalg.norm(desc)], 1.0, atol=1e-15)
    assert asc[0] < -0.5 and desc[0] > 0.5  # satellite west of the ground when ascending
    assert -0.15 < asc[1] < 0 and -0.15 < desc[1] < 0
    assert abs(asc[0] * desc[2] - desc[0] * asc[2]) > 0.9  # a well-conditioned pair


# ------------------------------------------------------------------------------ pairs
def test_pairs_of_coincident_points_recover_the_field():
    asc, desc = coincident_pair()
    out = decompose(asc, desc)
    east, up = field(asc.lat.values, asc.lon.values)
    assert out.sizes["space"] == asc.sizes["space"]
    np.testing.assert_array_equal(out.source_ascending, np.arange(asc.sizes["space"]))
    np.testing.assert_array_equal(out.source_descending, np.arange(asc.sizes["space"]))
    np.testing.assert_allclose(out.vertical, up, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.east, east, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.distance, 0.0, atol=1e-6)
    np.testing.assert_allclose(out.lat, asc.lat, rtol=0, atol=1e-10)
    np.testing.assert_allclose(out.lon, asc.lon, rtol=0, atol=1e-10)


def test_pairs_recover_a_known_north_motion_exactly():
    asc, desc = coincident_pair(north=0.004)
    out = decompose(asc, desc, north=0.004)
    east, up = field(asc.lat.values, asc.lon.values)
    np.testing.assert_allclose(out.vertical, up, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.east, east, rtol=0, atol=1e-12)
    assert out.attrs["north_velocity"] == 0.004


def test_pairs_of_jittered_points_recover_the_field_within_its_variation():
    n, jitter = 300, 20.0  # metres each way: partners within 28.3 m < max_distance
    rng = np.random.default_rng(5)
    lat_a, lon_a = scatter(n, 3)
    m_lat, m_lon = metres_per_degree(lat_a)
    offset = rng.uniform(-jitter, jitter, (n, 2))
    lat_d, lon_d = lat_a + offset[:, 1] / m_lat, lon_a + offset[:, 0] / m_lon
    los_a = sentinel1_los(lat_a, lon_a, "ascending", 1)
    los_d = sentinel1_los(lat_d, lon_d, "descending", 2)
    asc = track(lat_a, lon_a, los_a, observe(lat_a, lon_a, los_a))
    desc = track(lat_d, lon_d, los_d, observe(lat_d, lon_d, los_d))

    out = decompose(asc, desc, max_distance=50.0)

    assert out.sizes["space"] == n  # every point has its partner within range
    own = np.hypot(offset[:, 0], offset[:, 1])
    assert (out.distance.values <= own + 1e-3).all()  # the nearest is no farther than the partner
    partner = out.source_descending.values == np.arange(n)
    assert partner.mean() > 0.8
    np.testing.assert_allclose(out.distance.values[partner], own[partner], rtol=0, atol=1e-3)
    # each track sees the field half the pair's distance from the midpoint: its LOS velocity is
    # off by at most (|e| G_east + |u| G_up) d/2, and the solution by |A^-1| times that
    g_east, g_up = field_gradient_bound()
    la, ld = los_a[out.source_ascending.values], los_d[out.source_descending.values]
    half = out.distance.values / 2
    rhs_error = np.stack([np.abs(la[:, 0]) * g_east + np.abs(la[:, 2]) * g_up,
                          np.abs(ld[:, 0]) * g_east + np.abs(ld[:, 2]) * g_up], axis=1) * half[
                              :, None]
    matrix = np.stack([la[:, [0, 2]], ld[:, [0, 2]]], axis=1)
    bound = np.einsum("nij,nj->ni", np.abs(np.linalg.inv(matrix)), rhs_error) + 1e-12
    east, up = field(out.lat.values, out.lon.values)
    assert (np.abs(out.east.values - east) <= bound[:, 0]).all()
    assert (np.abs(out.vertical.values - up) <= bound[:, 1]).all()
    assert np.abs(out.vertical.values - up).max() > 1e-9  # the jitter is felt at all


def test_pairs_leave_out_points_farther_than_max_distance():
    lat, lon = np.array([LAT0, LAT0 + 0.01]), np.array([LON0, LON0])
    m_lat, _ = metres_per_degree(lat)
    los_a, los_d = los_vector(-12.0, [35.0, 35.0]), los_vector(-168.0, [35.0, 35.0])
    lat_d = lat + np.array([30.0, 80.0]) / m_lat  # 30 m and 80 m north of their partners
    asc = track(lat, lon, los_a, observe(lat, lon, los_a))
    desc = track(lat_d, lon, los_d, observe(lat_d, lon, los_d))
    out = decompose(asc, desc, max_distance=50.0)
    assert out.source_ascending.values.tolist() == [0]
    np.testing.assert_allclose(out.distance, [30.0], atol=1e-3)
    np.testing.assert_allclose(out.lat, [LAT0 + 15.0 / m_lat[0]], rtol=0, atol=1e-9)


def test_pairs_skip_points_without_a_finite_velocity():
    asc, desc = coincident_pair(n=50)
    velocity = desc.velocity.values.copy()
    velocity[7] = np.nan
    desc = desc.assign(velocity=("space", velocity))
    out = decompose(asc, desc, max_distance=5000.0)
    assert 7 not in out.source_descending.values
    assert np.isfinite(out.vertical.values).all()


def test_pairs_decompose_displacement_on_common_epochs():
    time = np.array(["2020-01-01", "2020-07-01", "2021-01-01"], dtype="datetime64[ns]")
    t = (time - time[0]) / np.timedelta64(1, "D") / 365.25
    north = 0.002
    asc, desc = coincident_pair(n=20, north=north)
    asc = track(asc.lat.values, asc.lon.values, np.stack([asc.los_east, asc.los_north,
                asc.los_up], axis=1), asc.velocity.values,
                displacement=asc.velocity.values[:, None] * t, time=time)
    desc = track(desc.lat.values, desc.lon.values, np.stack([desc.los_east, desc.los_north,
                 desc.los_up], axis=1), desc.velocity.values,
                 displacement=desc.velocity.values[:, None] * t, time=time)
    out = decompose(asc.chunk(space=7), desc.chunk(space=7), north=north)
    assert out.vertical_displacement.dims == ("space", "time")
    np.testing.assert_allclose(out.vertical_displacement, out.vertical.values[:, None] * t,
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.east_displacement, out.east.values[:, None] * t,
                               rtol=0, atol=1e-12)
    assert out.vertical_displacement.attrs["units"] == "m"


# ------------------------------------------------------------------------------ grid
def test_grid_recovers_a_constant_field():
    lat_a, lon_a = scatter(400, 11)
    lat_d, lon_d = scatter(400, 12)
    los_a = sentinel1_los(lat_a, lon_a, "ascending", 1)
    los_d = sentinel1_los(lat_d, lon_d, "descending", 2)
    motion = np.array([0.003, 0.0, -0.012])  # east, north, up (m/yr)
    asc, desc = track(lat_a, lon_a, los_a, los_a @ motion), track(lat_d, lon_d, los_d,
                                                                   los_d @ motion)

    out = decompose(asc, desc, method="grid", resolution=1000.0)

    assert out.sizes["space"] >= 20
    np.testing.assert_allclose(out.east, motion[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(out.vertical, motion[2], rtol=0, atol=1e-6)
    assert (out.count_ascending > 0).all() and (out.count_descending > 0).all()
    assert out.count_ascending.sum() <= 400
    cell = out.x.values / 1000.0 - 0.5
    np.testing.assert_allclose(cell, np.round(cell), atol=1e-9)  # centres of 1 km cells
    assert out.attrs["decomposition_method"] == "grid" and out.attrs["resolution"] == 1000.0
    assert "distance" not in out


def test_grid_cell_centres_hold_their_points():
    lat_a, lon_a = scatter(300, 21)
    los_a = sentinel1_los(lat_a, lon_a, "ascending", 1)
    los_d = sentinel1_los(lat_a, lon_a, "descending", 2)
    asc = track(lat_a, lon_a, los_a, observe(lat_a, lon_a, los_a))
    desc = track(lat_a, lon_a, los_d, observe(lat_a, lon_a, los_d))
    out = decompose(asc, desc, method="grid", resolution=2000.0)
    m_lat, m_lon = metres_per_degree(np.array(LAT0))
    # a cell's centre is within half a diagonal of the scene's points (plus a tangent-plane
    # distortion of well under a metre over 5 km)
    lat_span = (np.abs(out.lat.values[:, None] - lat_a[None]) * m_lat).min(axis=1)
    assert (lat_span <= 1000.0 * np.sqrt(2) + 1.0).all()
    assert out.count_ascending.sum() == 300 and out.count_descending.sum() == 300


# ------------------------------------------------------------------------------ conditioning
def test_ill_conditioned_pairs_are_nan_and_counted(caplog):
    asc, desc = coincident_pair(n=40)
    los = np.stack([desc.los_east, desc.los_north, desc.los_up], axis=1)
    los[:5] = np.stack([asc.los_east, asc.los_north, asc.los_up], axis=1)[:5]  # parallel LOS
    lat, lon = desc.lat.values, desc.lon.values
    desc = track(lat, lon, los, observe(lat, lon, los))
    with caplog.at_level(logging.WARNING, logger="depsi.processing.decomposition"):
        out = decompose(asc, desc)
    assert np.isnan(out.vertical.values[:5]).all() and np.isnan(out.east.values[:5]).all()
    assert (np.abs(out.determinant.values[:5]) < MIN_DETERMINANT).all()
    assert out.attrs["ill_conditioned"] == 5
    assert "5 of 40 point(s) ill-conditioned" in caplog.text
    east, up = field(lat[5:], lon[5:])
    np.testing.assert_allclose(out.vertical.values[5:], up, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.east.values[5:], east, rtol=0, atol=1e-12)


def test_the_same_track_twice_is_refused():
    asc, _ = coincident_pair(n=10)
    with pytest.raises(ValueError, match="nearly parallel LOS.*same track passed twice"):
        decompose(asc, asc)


# ------------------------------------------------------------------------------ precision
def test_std_propagation_matches_a_monte_carlo_of_the_solve():
    side, sigma_a, sigma_d = 150, 0.002, 0.003  # 22,500 points, 100 m apart
    rng = np.random.default_rng(42)
    grid_lat, grid_lon = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")
    m_lat, m_lon = metres_per_degree(np.array(LAT0))
    lat = LAT0 + grid_lat.ravel() * 100.0 / m_lat
    lon = LON0 + grid_lon.ravel() * 100.0 / m_lon
    n = lat.size
    los_a = np.repeat(los_vector(-12.0, 34.0)[None], n, axis=0)
    los_d = np.repeat(los_vector(-168.0, 41.0)[None], n, axis=0)
    motion = np.array([0.002, 0.0, -0.005])
    v_a = los_a @ motion + sigma_a * rng.standard_normal(n)
    v_d = los_d @ motion + sigma_d * rng.standard_normal(n)
    asc = track(lat, lon, los_a, v_a, std=np.full(n, sigma_a))
    desc = track(lat, lon, los_d, v_d, std=np.full(n, sigma_d))

    out = decompose(asc, desc, max_distance=1.0)

    assert out.sizes["space"] == n and (out.source_descending.values == np.arange(n)).all()
    # the sample std has a relative standard error of 1/sqrt(2(n-1)): allow five of them
    tolerance = 5.0 / np.sqrt(2 * (n - 1))
    for name, true in (("east", motion[0]), ("vertical", motion[2])):
        sample = out[name].values
        reported = out[f"{name}_std"].values
        np.testing.assert_allclose(reported, reported[0], rtol=1e-12)
        assert abs(sample.std(ddof=1) / reported[0] - 1) < tolerance
        assert abs(sample.mean() - true) < 5 * reported[0] / np.sqrt(n)
    cov = np.cov(out.east.values, out.vertical.values)[0, 1]
    reported_cov = out.east_vertical_covariance.values[0]
    cov_se = np.sqrt((out.east_std.values[0] ** 2 * out.vertical_std.values[0] ** 2
                      + reported_cov**2) / n)
    assert abs(cov - reported_cov) < 5 * cov_se


def test_no_std_when_one_track_lacks_it():
    asc, desc = coincident_pair(n=10)
    asc = asc.assign(velocity_std=("space", np.full(10, 0.001), {"units": "m/yr"}))
    out = decompose(asc, desc)
    assert "vertical_std" not in out and "east_std" not in out


def test_every_output_variable_has_units():
    asc, desc = coincident_pair(n=10)
    asc = asc.assign(velocity_std=("space", np.full(10, 0.001)))
    desc = desc.assign(velocity_std=("space", np.full(10, 0.002)))
    for out in (decompose(asc, desc), decompose(asc, desc, method="grid", resolution=500.0)):
        for name in out.variables:
            assert "units" in out[name].attrs, name
        assert {"decomposition_method", "north_velocity", "min_determinant",
                "history"} <= set(out.attrs)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("which", ["ascending", "descending"])
@pytest.mark.parametrize("variable", ["lat", "lon", "velocity", "los_east", "los_north",
                                      "los_up"])
def test_a_missing_variable_is_named_with_its_track(which, variable):
    tracks = dict(zip(("ascending", "descending"), coincident_pair(n=5)))
    tracks[which] = tracks[which].drop_vars(variable)
    with pytest.raises(STMValidationError, match=f"{which}: variable '{variable}'"):
        decompose(tracks["ascending"], tracks["descending"])


@pytest.mark.parametrize("change, message", [
    (lambda d: d.assign(los_up=-d.los_up), "descending: variable 'los_up': expected > 0"),
    (lambda d: d.assign(los_east=2 * d.los_east), "descending: variables 'los_east'.*unit vector"),
    (lambda d: d.assign(velocity=d.velocity.assign_attrs(units="mm/yr")),
     "descending: variable 'velocity': expected units 'm/yr', found 'mm/yr'"),
    (lambda d: d.assign(velocity=d.velocity.expand_dims(time=2).transpose()),
     r"descending: variable 'velocity': expected dims \('space',\)"),
    (lambda d: d.rename_dims(space="point"), "descending: expected a dimension 'space'"),
])
def test_a_malformed_track_is_named(change, message):
    asc, desc = coincident_pair(n=5)
    with pytest.raises(STMValidationError, match=message):
        decompose(asc, change(desc))


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "nearest"}, "method: expected one of"),
    ({"method": "grid"}, "resolution: expected a positive cell size"),
    ({"method": "grid", "resolution": -5.0}, "resolution: expected a positive cell size"),
    ({"resolution": 100.0}, "resolution: expected None for method 'pairs'"),
    ({"max_distance": 0.0}, "max_distance: expected a positive distance"),
    ({"north": np.nan}, "north: expected a finite north velocity"),
])
def test_bad_parameters_are_refused(kwargs, message):
    asc, desc = coincident_pair(n=5)
    with pytest.raises(ValueError, match=message):
        decompose(asc, desc, **kwargs)


def test_a_non_dataset_is_refused():
    _, desc = coincident_pair(n=5)
    with pytest.raises(TypeError, match="ascending: expected an xarray.Dataset"):
        decompose(desc.velocity, desc)


def test_the_inputs_are_not_modified():
    asc, desc = coincident_pair(n=10)
    before_a, before_d = asc.copy(deep=True), desc.copy(deep=True)
    decompose(asc, desc)
    xr.testing.assert_identical(asc, before_a)
    xr.testing.assert_identical(desc, before_d)


# ------------------------------------------------------------------------------ property
angles = st.floats(-180.0, 180.0, allow_nan=False)
incidences = st.floats(20.0, 50.0, allow_nan=False)
speeds = st.floats(-0.1, 0.1, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(angles, incidences, angles, incidences, speeds, speeds, speeds)
def test_exactly_formed_los_velocities_are_inverted_for_any_good_geometry(
        heading_a, incidence_a, heading_d, incidence_d, east, north, up):
    l_a, l_d = los_vector(heading_a, incidence_a), los_vector(heading_d, incidence_d)
    assume(abs(l_a[0] * l_d[2] - l_d[0] * l_a[2]) >= 1.01 * MIN_DETERMINANT)
    motion = np.array([east, north, up])
    lat, lon = np.array([LAT0]), np.array([LON0])
    asc = track(lat, lon, l_a[None], np.array([l_a @ motion]))
    desc = track(lat, lon, l_d[None], np.array([l_d @ motion]))
    out = decompose(asc, desc, north=north)
    assert abs(out.east.values[0] - east) < 1e-9
    assert abs(out.vertical.values[0] - up) < 1e-9
