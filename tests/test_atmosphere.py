"""Atmospheric phase screen: estimate at the network points, interpolation to others."""

from __future__ import annotations

import numpy as np
import pytest

from depsi.processing.arcs import estimate_arcs
from depsi.processing.atmosphere import estimate_atmosphere, fit_variogram, interpolate_aps
from depsi.processing.integration import integrate_network
from depsi.processing.network import form_network
from scenes import simulated_points


def _network(aps_std=1.0):
    points, true = simulated_points(aps_std=aps_std)
    arcs = estimate_arcs(form_network(points, method="redundant")).compute()
    return points, true, integrate_network(points, arcs)


def _datum_free_rms(estimate, truth):
    """RMS over points and epochs after removing each epoch's mean (a common screen is
    indistinguishable from the reference's own screen)."""
    error = estimate - truth
    return np.sqrt(np.mean((error - error.mean(axis=0)) ** 2))


@pytest.mark.parametrize("method", ["kriging", "gaussian"])
def test_atmosphere_explains_most_of_the_true_screen(method):
    points, true, result = _network()
    with_aps = estimate_atmosphere(result, method=method)
    ref = result.attrs["reference"]
    truth = true.aps.values - true.aps.values[ref]
    before = _datum_free_rms(0 * truth, truth)  # ~1 rad
    after = _datum_free_rms(with_aps.aps.values, truth)
    # measured (seed 1): 0.98 -> 0.39 rad (kriging); the screen is rough at PS spacing
    assert after < 0.6 * before
    assert with_aps.attrs["aps_method"] == method
    mother = int(np.flatnonzero(points.time.values
                                == np.datetime64(points.attrs["mother_time"]))[0])
    assert np.abs(with_aps.aps.values[:, mother]).max() < 0.5


def test_interpolate_aps_reproduces_the_screen_at_its_own_points():
    _, _, result = _network()
    with_aps = estimate_atmosphere(result, method="kriging")
    again = interpolate_aps(with_aps, with_aps)
    np.testing.assert_allclose(again.values, with_aps.aps.values, atol=1e-4)
    shifted = interpolate_aps(with_aps, np.column_stack([result.azimuth * 10.0 + 5,
                                                         result.range * 10.0 + 5]))
    assert shifted.shape == with_aps.aps.shape and np.isfinite(shifted.values).all()


def test_fit_variogram_recovers_the_scale_of_a_smooth_field():
    rng = np.random.default_rng(0)
    pos = rng.uniform(0, 2000, (400, 2))
    dist = np.hypot(*(pos[:, None] - pos[None]).transpose(2, 0, 1))
    cov = np.exp(-dist / 300.0)
    field = np.linalg.cholesky(cov + 1e-9 * np.eye(400)) @ rng.normal(size=(400, 20))
    fit = fit_variogram(pos, field + rng.normal(0, 0.1, field.shape))
    assert 100 < fit["range"] < 900
    assert fit["nugget"] < 0.1


def test_too_few_points_raise():
    _, _, result = _network()
    with pytest.raises(ValueError, match="at least 3"):
        estimate_atmosphere(result.isel(space=[0, 1]))


def test_gaussian_interpolation_in_blocks_equals_one_block(monkeypatch):
    # the blocks bound the (targets, k, epochs) gather; they must not change a value
    from scipy.spatial import cKDTree

    from depsi.processing import atmosphere

    rng = np.random.default_rng(3)
    sources = rng.uniform(0, 1000, (300, 2))
    values = rng.normal(size=(300, 12))
    targets = rng.uniform(0, 1000, (1001, 2))
    tree = cKDTree(sources)
    monkeypatch.setattr(atmosphere, "GAUSSIAN_BLOCK", 10**6)
    whole = atmosphere._gaussian(tree, values, targets, 80.0)
    monkeypatch.setattr(atmosphere, "GAUSSIAN_BLOCK", 97)
    blocked = atmosphere._gaussian(tree, values, targets, 80.0)
    np.testing.assert_array_equal(blocked, whole)
    # and it is the weighted mean it claims: a constant field stays constant
    flat = atmosphere._gaussian(tree, np.full((300, 12), 2.5), targets, 80.0)
    np.testing.assert_allclose(flat, 2.5, rtol=1e-12)
