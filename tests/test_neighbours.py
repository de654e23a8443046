"""The grid search of depsi.kernels.neighbours (the network's and the kriging's neighbours on a
device) finds exactly the neighbours and pairs of SciPy's k-d tree, on NumPy here: scenes of
different sizes and densities (uniform, clustered, on a line, queries outside the points)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial import cKDTree

from depsi.kernels.backend import Device
from depsi.kernels.neighbours import nearest_neighbours, pairs_within
from depsi.processing.network import first_order_indices, redundant_edges, search_device


def _scene(rng: np.random.Generator, n: int, layout: str) -> np.ndarray:
    """``n`` positions (m): uniform over 2 km, half in a dense cluster of 60 m, or on a line."""
    if layout == "uniform":
        return rng.uniform(0, 2000, (n, 2))
    if layout == "clustered":
        return np.concatenate([rng.uniform(0, 2000, (n - n // 2, 2)),
                               rng.normal(500, 60, (n // 2, 2))])
    return np.column_stack([rng.uniform(0, 2000, n), np.full(n, 7.0)])


def _sorted_pairs(pairs: np.ndarray) -> np.ndarray:
    return pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 1500),
       layout=st.sampled_from(["uniform", "clustered", "line"]), k=st.integers(1, 80),
       bound=st.sampled_from([np.inf, 5.0, 60.0, 400.0]))
def test_nearest_neighbours_are_the_kd_tree_neighbours(seed, n, layout, k, bound):
    rng = np.random.default_rng(seed)
    points = _scene(rng, n, layout)
    queries = np.concatenate([points[: min(n, 300)], rng.uniform(-1000, 3000, (50, 2))])
    dist, idx = nearest_neighbours(points, queries, k, upper_bound=bound)
    expected_dist, expected_idx = cKDTree(points).query(queries, k=k, distance_upper_bound=bound)
    expected_dist = expected_dist.reshape(len(queries), k)
    np.testing.assert_array_equal(idx, expected_idx.reshape(len(queries), k))
    np.testing.assert_array_equal(dist, expected_dist)  # summed as the tree sums them


@pytest.mark.parametrize("n", [2000, 8000])
@pytest.mark.parametrize("layout", ["uniform", "clustered"])
def test_pairs_within_are_the_kd_tree_pairs(n, layout):
    points = _scene(np.random.default_rng(n), n, layout)
    for distance in (3.0, 25.0):
        expected = cKDTree(points).query_pairs(distance, output_type="ndarray")
        np.testing.assert_array_equal(pairs_within(points, distance), _sorted_pairs(expected))


def test_equal_distances_are_ordered_by_index():
    # a lattice: four neighbours at one distance from each point inside it
    points = np.stack(np.meshgrid(np.arange(6.0), np.arange(6.0)), -1).reshape(-1, 2)
    dist, idx = nearest_neighbours(points, points, 5)
    inner = 14  # (2, 2): itself, then 8, 13, 15, 20 at distance 1
    assert idx[inner].tolist() == [14, 8, 13, 15, 20]
    np.testing.assert_array_equal(dist, cKDTree(points).query(points, k=5)[0])


@pytest.mark.parametrize("layout", ["uniform", "clustered"])
def test_redundant_edges_on_the_grid_search_are_the_kd_tree_edges(layout):
    positions = _scene(np.random.default_rng(3), 5000, layout)
    for max_length in (None, 80.0):
        reference = redundant_edges(positions, k=2, n_sectors=8, max_length=max_length)
        on_device = redundant_edges(positions, k=2, n_sectors=8, max_length=max_length,
                                    device=Device("cpu"))
        np.testing.assert_array_equal(on_device[0], reference[0])
        np.testing.assert_array_equal(on_device[1], reference[1])


def test_thinned_first_order_points_agree_on_the_grid_search():
    import xarray as xr

    rng = np.random.default_rng(5)
    n = 4000
    points = xr.Dataset({"amplitude_dispersion": ("space", rng.uniform(0.1, 0.4, n))},
                        coords={"azimuth": ("space", rng.integers(0, 400, n)),
                                "range": ("space", rng.integers(0, 1500, n))})
    reference = first_order_indices(points, first_order=500, min_distance=40.0)
    on_device = first_order_indices(points, first_order=500, min_distance=40.0,
                                    device="cpu")
    np.testing.assert_array_equal(on_device, reference)


def test_search_device_is_the_first_cuda_device_and_none_without_one():
    assert search_device(["cpu:0", "cpu:1"]) is None
    assert search_device([Device("cpu", 0)]) is None


def test_nearest_neighbours_refuses_k_below_one():
    with pytest.raises(ValueError, match="k: expected at least 1"):
        nearest_neighbours(np.zeros((3, 2)), np.zeros((1, 2)), 0)
