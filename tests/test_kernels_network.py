"""Interferogram-network inversion: exact recovery, noise at the predicted level, NaN
interferograms, per-pixel weights, disconnected networks flagged and not crashed."""

from __future__ import annotations

import numpy as np
import pytest

from depsi.kernels.flags import Flag
from depsi.kernels.network_inversion import connected_components, invert_network


def _small_baseline_pairs(T, reach=3):
    return np.array([(a, b) for a in range(T) for b in range(a + 1, min(a + reach + 1, T))])


def _series(rng, K, T):
    series = np.cumsum(rng.normal(0, 1, (K, T)), axis=1)
    return series - series[:, :1]


def _ifg(series, pairs):
    return series[:, pairs[:, 1]] - series[:, pairs[:, 0]]


def test_noise_free_series_recovered_exactly():
    rng = np.random.default_rng(20)
    pairs = _small_baseline_pairs(15)
    truth = _series(rng, 40, 15)
    res = invert_network(_ifg(truth, pairs), pairs, 15)
    np.testing.assert_allclose(res.series, truth, atol=1e-12)
    assert (res.flag == Flag.OK).all()
    np.testing.assert_allclose(res.residuals, 0.0, atol=1e-12)


def test_noise_matches_the_predicted_covariance():
    rng = np.random.default_rng(21)
    T, sigma = 12, 0.2
    pairs = _small_baseline_pairs(T)
    truth = _series(rng, 2000, T)
    ifg = _ifg(truth, pairs) + rng.normal(0, sigma, (2000, len(pairs)))
    res = invert_network(ifg, pairs, T)
    A = np.zeros((len(pairs), T))
    A[np.arange(len(pairs)), pairs[:, 1]] = 1
    A[np.arange(len(pairs)), pairs[:, 0]] = -1
    predicted = sigma * np.sqrt(np.diag(np.linalg.inv(A[:, 1:].T @ A[:, 1:])))
    observed = (res.series - truth)[:, 1:].std(axis=0)
    # 2000 samples: the sample std is within ~3 % (2 sigma) of the truth
    np.testing.assert_allclose(observed, predicted, rtol=0.05)
    assert abs(np.mean(res.sigma2) / sigma**2 - 1) < 0.05


def _reference_lstsq(ifg, pairs, T, weights):
    """Per pixel: drop missing interferograms, weighted lstsq with epoch 0 fixed."""
    out = np.full((ifg.shape[0], T), np.nan)
    for k in range(ifg.shape[0]):
        keep = np.isfinite(ifg[k])
        A = np.zeros((keep.sum(), T))
        A[np.arange(keep.sum()), pairs[keep, 1]] = 1
        A[np.arange(keep.sum()), pairs[keep, 0]] = -1
        sw = np.sqrt(weights[k][keep])
        x = np.linalg.lstsq(A[:, 1:] * sw[:, None], ifg[k][keep] * sw, rcond=None)[0]
        out[k] = np.concatenate([[0.0], x])
    return out


def test_nan_interferograms_equal_dropping_them_per_pixel():
    rng = np.random.default_rng(22)
    T = 10
    pairs = _small_baseline_pairs(T, reach=4)
    truth = _series(rng, 30, T)
    ifg = _ifg(truth, pairs) + rng.normal(0, 0.1, (30, len(pairs)))
    ifg[rng.random(ifg.shape) < 0.15] = np.nan
    ifg[0, :] = _ifg(truth, pairs)[0]  # one complete pixel: the shared path
    weights = rng.uniform(0.5, 2.0, len(pairs))
    res = invert_network(ifg, pairs, T, weights=weights)
    connected = res.flag != Flag.DISCONNECTED
    ref = _reference_lstsq(ifg, pairs, T, np.broadcast_to(weights, ifg.shape))
    np.testing.assert_allclose(res.series[connected], ref[connected], atol=1e-10)
    assert np.isnan(res.residuals[~np.isfinite(ifg)]).all()


def test_per_pixel_weights_equal_shared_weights():
    rng = np.random.default_rng(23)
    pairs = _small_baseline_pairs(9)
    ifg = _ifg(_series(rng, 20, 9), pairs) + rng.normal(0, 0.1, (20, len(pairs)))
    weights = rng.uniform(0.5, 2.0, len(pairs))
    shared = invert_network(ifg, pairs, 9, weights=weights)  # one normal matrix, one GEMM
    per_pixel = invert_network(ifg, pairs, 9, weights=np.tile(weights, (20, 1)))
    np.testing.assert_allclose(per_pixel.series, shared.series, atol=1e-12)
    np.testing.assert_allclose(per_pixel.sigma2, shared.sigma2, rtol=1e-10)


def test_per_pixel_weights_match_reference():
    rng = np.random.default_rng(24)
    pairs = _small_baseline_pairs(8)
    ifg = _ifg(_series(rng, 10, 8), pairs) + rng.normal(0, 0.1, (10, len(pairs)))
    weights = rng.uniform(0.2, 5.0, ifg.shape)
    res = invert_network(ifg, pairs, 8, weights=weights, max_batch=3)
    np.testing.assert_allclose(res.series, _reference_lstsq(ifg, pairs, 8, weights), atol=1e-10)


def test_disconnected_network_is_flagged_not_crashed():
    rng = np.random.default_rng(25)
    T = 8
    pairs = _small_baseline_pairs(T, reach=1)  # a chain 0-1-2-...-7
    truth = _series(rng, 3, T)
    ifg = _ifg(truth, pairs)
    ifg[1, 3] = np.nan  # breaks pixel 1 between epochs 3 and 4
    ifg[2, :] = np.nan  # nothing at all
    res = invert_network(ifg, pairs, T)
    assert res.flag.tolist() == [Flag.NO_REDUNDANCY, Flag.DISCONNECTED, Flag.DISCONNECTED]
    np.testing.assert_allclose(res.series[0], truth[0], atol=1e-12)
    np.testing.assert_allclose(res.series[1, :4], truth[1, :4], atol=1e-12)
    assert np.isnan(res.series[1, 4:]).all()
    assert res.component[1].tolist() == [0, 0, 0, 0, 4, 4, 4, 4]
    assert res.series[2, 0] == 0 and np.isnan(res.series[2, 1:]).all()
    assert res.component[2].tolist() == list(range(T))


def test_disconnected_shared_network_flags_every_pixel():
    pairs = np.array([[0, 1], [1, 2], [0, 2], [3, 4]])
    truth = np.array([[0.0, 1, 2, 3, 5], [0.0, -1, -2, -3, -4]])
    res = invert_network(_ifg(truth, pairs), pairs, 5)
    assert (res.flag == Flag.DISCONNECTED).all()
    np.testing.assert_allclose(res.series[:, :3], truth[:, :3], atol=1e-12)
    assert np.isnan(res.series[:, 3:]).all()


def test_other_reference_epoch():
    rng = np.random.default_rng(26)
    pairs = _small_baseline_pairs(7)
    truth = _series(rng, 5, 7)
    res = invert_network(_ifg(truth, pairs), pairs, 7, reference=3)
    np.testing.assert_allclose(res.series, truth - truth[:, 3:4], atol=1e-12)


def test_connected_components_by_label_propagation():
    pairs = np.array([[0, 5], [5, 2], [1, 3], [4, 6], [6, 1]])
    mask = np.array([[True] * 5, [True, False, True, True, True], [False] * 5])
    labels = connected_components(mask, pairs, 7)
    assert labels.tolist() == [[0, 1, 0, 1, 1, 0, 1], [0, 1, 2, 1, 1, 0, 1], list(range(7))]


@pytest.mark.parametrize(("pairs", "match"), [
    (np.array([[0, 1], [1, 5]]), "epoch indices in"),
    (np.array([[0, 1], [2, 2]]), "different epochs"),
    (np.array([[0.0, 1.0], [1.0, 2.0]]), "integer"),
])
def test_bad_pairs_raise(pairs, match):
    with pytest.raises(ValueError, match=match):
        invert_network(np.zeros((1, 2)), pairs, 3)
