"""Network formation: Delaunay and redundant arcs, double differences, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from scipy.spatial import cKDTree

from depsi.conventions import wrap_phase
from depsi.processing.network import (
    NetworkConfig,
    first_order_indices,
    form_network,
    point_positions,
    redundant_edges,
)
from depsi.stm.schema import STMValidationError, validate, years_since_mother
from scenes import simulated_points


def _random_points(n=60, n_epochs=5, seed=0):
    rng = np.random.default_rng(seed)
    az = rng.choice(10_000, n, replace=False)
    times = np.datetime64("2020-01-01") + np.arange(n_epochs) * np.timedelta64(12, "D")
    return xr.Dataset(
        {"phase": (("space", "time"), rng.uniform(-np.pi, np.pi, (n, n_epochs)).astype("f4")),
         "h2ph": (("space", "time"), rng.normal(0, 1e-4, (n, n_epochs)).astype("f4"))},
        coords={"azimuth": ("space", az // 100), "range": ("space", az % 100), "time": times},
        attrs={"wavelength": 0.0555, "mother_time": str(times[0])})


def test_delaunay_network_has_unique_arcs_and_valid_stm():
    points = _random_points()
    arcs = form_network(points, method="delaunay")
    validate(arcs, "arcs")
    pairs = np.column_stack([arcs.source.values, arcs.target.values])
    assert (pairs[:, 0] < pairs[:, 1]).all()
    assert len(np.unique(pairs, axis=0)) == len(pairs)
    # planar triangulation: at most 3n - 6 edges, every point used
    n = points.sizes["space"]
    assert n <= len(pairs) <= 3 * n - 6
    assert np.unique(pairs).size == n


def test_arc_phase_is_wrapped_double_difference_and_h2ph_the_mean():
    points = _random_points()
    arcs = form_network(points)
    s, t = arcs.source.values, arcs.target.values
    phase = points.phase.values.astype(np.float64)
    expected = np.angle(np.exp(1j * (phase[t] - phase[s])))
    np.testing.assert_allclose(arcs.phase.values, expected, atol=1e-5)
    assert (np.abs(arcs.phase.values) <= np.pi + 1e-6).all()
    np.testing.assert_allclose(arcs.h2ph.values,
                               0.5 * (points.h2ph.values[s] + points.h2ph.values[t]), rtol=1e-6)
    pos = point_positions(points)
    np.testing.assert_allclose(arcs.length.values, np.hypot(*(pos[t] - pos[s]).T), rtol=1e-6)


def test_redundant_network_respects_max_length_and_k_per_sector():
    rng = np.random.default_rng(3)
    pos = rng.uniform(0, 1000, (400, 2))
    s, t = redundant_edges(pos, k=1, n_sectors=4, max_length=150.0)
    assert (np.hypot(*(pos[t] - pos[s]).T) <= 150.0).all()
    degree = np.bincount(np.r_[s, t], minlength=400)
    # each point chooses at most k * n_sectors = 4; others may choose it too
    assert np.median(degree) >= 4
    s2, _ = redundant_edges(pos, k=2, n_sectors=8)
    assert len(s2) > 2 * len(s)


def test_redundant_network_is_more_redundant_than_delaunay():
    points = _random_points(n=200)
    delaunay = form_network(points, method="delaunay")
    redundant = form_network(points, method="redundant", k=2, n_sectors=8)
    assert redundant.sizes["arc"] > 1.5 * delaunay.sizes["arc"]
    validate(redundant, "arcs")


def test_lazy_points_give_lazy_arcs_with_same_values():
    points = _random_points()
    eager = form_network(points)
    lazy = form_network(points.chunk({"space": 17}))
    assert lazy.phase.chunks is not None
    np.testing.assert_allclose(lazy.phase.values, eager.phase.values)


def test_too_few_points_and_bad_method_raise_clear_errors():
    points = _random_points(n=2)
    with pytest.raises(ValueError, match="at least 3 points"):
        form_network(points, method="delaunay")
    with pytest.raises(ValueError, match="method"):
        form_network(_random_points(), method="mst")
    with pytest.raises(STMValidationError, match="phase"):
        form_network(_random_points().drop_vars("phase"))


def test_time_in_years_counts_from_mother_and_wrap_is_half_open():
    points = _random_points()
    years = years_since_mother(points)
    assert years[0] == 0.0 and np.isclose(years[1], 12 / 365.25)
    assert wrap_phase(np.array(-np.pi)) == pytest.approx(np.pi)


def test_simulated_points_are_consistent_with_the_phase_model():
    points, true = simulated_points()
    assert points.sizes["space"] > 200
    # the interferometric phase minus the known model and APS is small PS noise
    m2ph = -4 * np.pi / points.attrs["wavelength"]
    years_disp = true.displacement - true.displacement.sel(time=np.datetime64(
        points.attrs["mother_time"]))
    model = m2ph * (years_disp + points.h2ph * true.height_error) + true.aps
    residual = np.angle(np.exp(1j * (points.phase - model)))
    assert float(np.sqrt((residual ** 2).mean())) < 3 * np.sqrt(2) * 0.3



def _scatter(n: int, side: int, seed: int = 0) -> xr.Dataset:
    """``n`` points on a ``side`` x ``side`` pixel grid of 10 m pixels, random dispersions."""
    rng = np.random.default_rng(seed)
    return xr.Dataset({"amplitude_dispersion": ("space", rng.uniform(0.05, 0.3, n))},
                      coords={"azimuth": ("space", rng.integers(0, side, n)),
                              "range": ("space", rng.integers(0, side, n))},
                      attrs={"azimuth_spacing": 10.0, "range_spacing": 10.0})


def test_first_order_points_are_the_best_of_each_cell_on_a_large_scene():
    points = _scatter(20_000, 300)  # 3 km x 3 km: 400 cells of 150 m, more than 100
    chosen = first_order_indices(points, first_order=100, cell_size=150.0)
    cell = (point_positions(points) // 150.0).astype(int)
    key = cell[:, 0] * 1000 + cell[:, 1]
    assert len(chosen) == len(np.unique(key)) == 400
    nad = points.amplitude_dispersion.values
    best = {k: nad[key == k].min() for k in np.unique(key)}
    assert all(nad[i] == best[key[i]] for i in chosen)
    assert (np.diff(chosen) > 0).all()  # in the order of space


def test_first_order_points_are_the_best_count_on_a_small_scene_ties_in_space_order():
    small = _scatter(2_000, 60)  # 600 m x 600 m: 16 cells, fewer than first_order
    chosen = first_order_indices(small, first_order=100)
    nad = small.amplitude_dispersion.values
    assert len(chosen) == 100 and nad[chosen].max() <= np.sort(nad)[99]
    flat = small.drop_vars("amplitude_dispersion")  # all equal: the first in space order
    assert first_order_indices(flat, first_order=5, cell_size=None).tolist() == [0, 1, 2, 3, 4]


def test_ds_are_first_order_only_when_asked_ranked_by_their_phase_std():
    """DS carry no amplitude dispersion (NaN) and a linked phase std (rad): off by default they
    are never first order; with ``ds_first_order`` they rank by that std among the PS' dispersions
    (one scale: a PS's phase std is about D_A), cell by cell, under max_dispersion too."""
    points = _scatter(4_000, 300)
    rng = np.random.default_rng(3)
    ds = rng.random(4_000) < 0.5
    nad = np.where(ds, np.nan, points.amplitude_dispersion.values)
    phase_std = np.where(ds, rng.uniform(0.02, 0.4, 4_000), np.nan)
    points = points.assign(amplitude_dispersion=("space", nad),
                           linked_phase_std=("space", phase_std))
    off = first_order_indices(points, first_order=100, cell_size=150.0)
    assert not ds[off].any()
    on = first_order_indices(points, first_order=100, cell_size=150.0, ds_first_order=True)
    rank = np.where(ds, phase_std, nad)
    cell = (point_positions(points) // 150.0).astype(int)
    key = cell[:, 0] * 1000 + cell[:, 1]
    assert len(on) == len(np.unique(key))
    assert all(rank[i] == rank[key == key[i]].min() for i in on)
    assert 0.3 < ds[on].mean() < 0.8  # both kinds win cells
    capped = first_order_indices(points, first_order=100, cell_size=150.0, max_dispersion=0.1,
                                 ds_first_order=True)
    assert (rank[capped] <= 0.1).all() and ds[capped].any()


def test_first_order_points_respect_max_dispersion_and_refuse_fewer_than_three():
    points = _scatter(500, 60)
    chosen = first_order_indices(points, max_dispersion=0.1)
    nad = points.amplitude_dispersion.values
    assert len(chosen) == (nad <= 0.1).sum() and (nad[chosen] <= 0.1).all()
    with pytest.raises(ValueError, match="at least 3 first-order points, found 0"):
        first_order_indices(points, max_dispersion=0.01)


def test_first_order_defaults_are_the_network_sections():
    points = _scatter(20_000, 300)
    config = NetworkConfig()
    np.testing.assert_array_equal(
        first_order_indices(points),
        first_order_indices(points, first_order=config.first_order,
                            max_dispersion=config.max_dispersion, cell_size=config.cell_size))


def _sequential_greedy(xy: np.ndarray, quality: np.ndarray, min_distance: float) -> np.ndarray:
    """Reference: best first, keep a point when no kept point is closer than min_distance."""
    tree = cKDTree(xy)
    kept = np.zeros(len(xy), bool)
    for index in np.argsort(quality, kind="stable"):
        near = tree.query_ball_point(xy[index], min_distance - 1e-9)
        if not kept[near].any():
            kept[index] = True
    return np.flatnonzero(kept)


def test_first_order_points_at_a_min_distance_are_the_sequential_greedy_best_first():
    points = _scatter(4000, 300, seed=3)
    points.amplitude_dispersion[::97] = np.nan  # never chosen
    chosen = first_order_indices(points, min_distance=90.0, first_order=10**6, cell_size=None)
    xy = point_positions(points)
    assert not cKDTree(xy[chosen]).query_pairs(90.0 - 1e-9), "two chosen closer than 90 m"
    finite = np.flatnonzero(np.isfinite(points.amplitude_dispersion.values))
    expected = finite[_sequential_greedy(xy[finite], points.amplitude_dispersion.values[finite],
                                         90.0)]
    np.testing.assert_array_equal(chosen, expected)
    assert np.nanargmin(points.amplitude_dispersion.values) in chosen


def test_first_order_min_distance_thins_before_the_count_and_refuses_a_non_positive_one():
    points = _scatter(4000, 300, seed=3)
    thinned = first_order_indices(points, min_distance=90.0, first_order=10**6, cell_size=None)
    best = first_order_indices(points, min_distance=90.0, first_order=50, cell_size=None)
    nad = points.amplitude_dispersion.values
    np.testing.assert_array_equal(best, np.sort(thinned[np.argsort(nad[thinned])[:50]]))
    for bad in (0.0, -1.0, np.inf):
        with pytest.raises(ValueError, match="min_distance"):
            first_order_indices(points, min_distance=bad)
