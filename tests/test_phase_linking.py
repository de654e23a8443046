"""Distributed scatterers against their truth: the SHP test keeps the homogeneous pixels at its
nominal false-alarm rate, EMI's linked phase is within 1.2x the Cramér-Rao bound, and the
kernels give the same numbers on NumPy and CuPy (on a GPU where there is one, and through the
NumPy stand-in for CuPy otherwise).

Tolerances come from the number of samples: a rate measured on N independent trials is allowed
three binomial standard deviations, ``3 sqrt(p (1 - p) / N)``; an RMSE over P pixels carries
the standard error of the mean of the pixels' squared errors.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from depsi.conventions import wrap_phase
from depsi.kernels.backend import cupy_available, to_host
from depsi.kernels.phase_linking import (
    MAGNITUDES,
    cramer_rao_bound,
    effective_samples,
    gather_neighbours,
    glrt_threshold,
    lag_averaged,
    link_phases,
    sample_coherence,
    sequential_phase_linking,
    short_lag_coherence,
    short_lag_noise_threshold,
    temporal_coherence,
    temporal_coherence_tile,
    window_offsets,
)
from depsi.processing.distributed_scatterers import phase_linking, select_shp
from depsi.simulate.ds import (
    circular_gaussian_looks,
    exponential_coherence,
    simulate_ds_stack,
)

REPO = Path(__file__).resolve().parents[1]
ALPHA = 0.05
#: The issue's bar: EMI's phase RMSE at most this many times the Cramér-Rao bound.
CRB_FACTOR = 1.2


def _binomial_tolerance(p: float, n: int) -> float:
    return 3.0 * math.sqrt(p * (1.0 - p) / n)


# ------------------------------------------------------------------------------ SHP selection
def _window_truth(truth, window):
    """For every pixel and window cell: same region (the centre excluded), other region."""
    region = truth["region"].values
    half_az, half_rg = window[0] // 2, window[1] // 2
    padded = np.pad(region.astype(np.int32), ((half_az, half_az), (half_rg, half_rg)),
                    constant_values=-1)
    offsets = window_offsets(window)
    rows = np.arange(region.shape[0])[:, None, None] + half_az + offsets[:, 0]
    cols = np.arange(region.shape[1])[None, :, None] + half_rg + offsets[:, 1]
    neighbour = padded[rows, cols]
    centre = (offsets == 0).all(axis=1)
    same = (neighbour == region[:, :, None]) & ~centre
    other = (neighbour >= 0) & (neighbour != region[:, :, None])
    return same, other


def _retention(shp, truth, window):
    same, other = _window_truth(truth, window)
    mask = shp["shp"].values
    return mask[same].mean(), (mask[other].mean() if other.any() else np.nan)


def test_glrt_threshold_rejects_alpha_of_equal_powers_on_independent_epochs():
    rng = np.random.default_rng(31)
    n_pairs, n_epochs = 20_000, 30
    intensity = rng.exponential(1.0, (2, n_pairs, n_epochs)).mean(axis=-1)
    rejected = np.abs(np.log(intensity[0] / intensity[1])) > glrt_threshold(ALPHA, n_epochs)
    assert abs(rejected.mean() - ALPHA) <= _binomial_tolerance(ALPHA, n_pairs)


def test_effective_samples_of_the_default_coherence_model_are_few():
    times = np.arange(30) * 12.0
    assert effective_samples(np.eye(30)) == 30
    assert 5 < effective_samples(exponential_coherence(times)) < 12


def test_shp_selection_keeps_the_homogeneous_pixels_at_its_false_alarm_rate():
    """Three stripes 6 dB apart, correlated speckle (the default coherence model): at alpha the
    test keeps 1 - alpha of the same-region neighbours, three binomial deviations allowed over
    the pixels (each pixel's mean enters all its pairs, so pixels, not pairs, are the trials)."""
    window = (11, 11)
    stack, truth = simulate_ds_stack(shape=(96, 96), n_epochs=30, seed=11)
    shp = select_shp(stack, window=window, alpha=ALPHA).compute()
    kept, accepted_other = _retention(shp, truth, window)
    assert kept >= 1 - ALPHA - _binomial_tolerance(ALPHA, 96 * 96)
    assert accepted_other < 0.5  # 6 dB apart: most foreign pixels are told apart


def test_shp_false_alarm_rate_is_alpha_in_one_homogeneous_region():
    window = (11, 11)
    stack, truth = simulate_ds_stack(shape=(96, 96), n_epochs=30, seed=12,
                                     region_powers=(1.0,))
    shp = select_shp(stack, window=window, alpha=ALPHA).compute()
    kept, _ = _retention(shp, truth, window)
    # the pixels are the trials, and the threshold is a quantile of 2 x 96 x 94 pairs
    tolerance = math.hypot(_binomial_tolerance(ALPHA, 96 * 96),
                           _binomial_tolerance(ALPHA, 2 * 96 * 94))
    assert abs((1 - kept) - ALPHA) <= tolerance


def test_the_textbook_threshold_rejects_far_more_than_alpha_of_correlated_speckle():
    """Why the threshold is calibrated on the scene: with the exact threshold for independent
    epochs, coherent speckle (worth ~9 of its 30 epochs) loses a quarter of its SHP."""
    window = (11, 11)
    stack, truth = simulate_ds_stack(shape=(64, 64), n_epochs=30, seed=13,
                                     region_powers=(1.0,))
    shp = select_shp(stack, window=window, alpha=ALPHA, calibration="epochs").compute()
    kept, _ = _retention(shp, truth, window)
    assert kept < 0.85
    exact = select_shp(stack, window=window, alpha=ALPHA,
                       calibration=effective_samples(truth["coherence"].values)).compute()
    assert _retention(exact, truth, window)[0] >= 1 - ALPHA - _binomial_tolerance(ALPHA, 64 * 64)


def test_shp_selection_does_not_depend_on_the_chunks():
    stack, _ = simulate_ds_stack(shape=(50, 70), n_epochs=12, seed=14)
    one = select_shp(stack.chunk({"azimuth": 50, "range": 70}), window=(5, 7)).compute()
    many = select_shp(stack.chunk({"azimuth": 16, "range": 24}), window=(5, 7)).compute()
    np.testing.assert_array_equal(one["shp"].values, many["shp"].values)
    assert float(one["shp_threshold"]) == float(many["shp_threshold"])
    centre = int(np.flatnonzero((window_offsets((5, 7)) == 0).all(axis=1))[0])
    assert one["shp"].values[:, :, centre].all()
    assert not one["shp"].values[0, 0, 0]  # outside the scene


# ---------------------------------------------------------------------------- phase linking
def _linked_rmse(n_epochs, n_looks, method, seed, n_pixels=1000, **kwargs):
    """(RMSE, its standard error, CRB) over pixels of the default coherence model."""
    coherence = exponential_coherence(np.arange(n_epochs) * 12.0)
    rng = np.random.default_rng(seed)
    theta = wrap_phase(rng.uniform(-np.pi, np.pi, n_epochs))
    theta[0] = 0.0
    looks = circular_gaussian_looks(coherence, theta, (n_pixels, n_looks), rng)
    with threadpool_limits(1):
        gamma, _ = sample_coherence(looks)
        phase, _ = link_phases(gamma, method=method, **kwargs)
    squared = np.mean(wrap_phase(phase - theta)[:, 1:] ** 2, axis=1)
    rmse = float(np.sqrt(squared.mean()))
    standard_error = float(squared.std() / np.sqrt(n_pixels) / (2 * squared.mean()) * rmse)
    crb = float(np.sqrt(cramer_rao_bound(coherence, n_looks)[1:].mean()))
    return rmse, standard_error, crb


@pytest.mark.parametrize("n_epochs, n_looks, n_pixels", [
    # at 20 looks the lag-averaged EMI sits at 1.19x (10 seeds x 1000 pixels: 1.15-1.22, mean
    # 1.191; the sample magnitudes' EMI 1.29): 5000 pixels put the standard error at 0.011
    (30, 20, 5000),
    (30, 50, 1000),
    pytest.param(30, 200, 1000, marks=pytest.mark.slow),
    pytest.param(60, 100, 1000, marks=pytest.mark.slow),
    pytest.param(120, 200, 1000, marks=pytest.mark.slow),
])
def test_emi_phase_rmse_is_within_1_2_of_the_cramer_rao_bound(n_epochs, n_looks, n_pixels):
    rmse, standard_error, crb = _linked_rmse(n_epochs, n_looks, "emi", seed=n_epochs + n_looks,
                                             n_pixels=n_pixels)
    assert standard_error < 0.05 * crb  # enough pixels for the verdict to mean something
    assert rmse <= CRB_FACTOR * crb, f"EMI RMSE {rmse:.4f} rad = {rmse / crb:.3f} x CRB"


def _coherence_case(n_epochs, *, seasonal=False, irregular=False, seed=0):
    """A coherence model unlike the default one: revisits of 6-48 days (``irregular``), and
    each epoch's coherence varying with the season between 0.5 and 1 (``seasonal``, so that
    decorrelation no longer depends on the epochs' separation alone)."""
    rng = np.random.default_rng(seed)
    days = np.arange(n_epochs) * 12.0
    if irregular:
        days = np.cumsum(rng.choice([6, 12, 24, 48], n_epochs)).astype(np.float64)
    coherence = exponential_coherence(days)
    if seasonal:
        season = np.diag(0.75 + 0.25 * np.cos(2 * np.pi * days / 365.25))
        coherence = season @ coherence @ season + np.eye(n_epochs) - season**2
    return coherence, rng


@pytest.mark.parametrize("seasonal, irregular", [
    pytest.param(True, False, marks=pytest.mark.slow), (False, True),
    pytest.param(True, True, marks=pytest.mark.slow)])
def test_lag_averaged_magnitudes_help_where_decorrelation_is_not_a_function_of_the_lag(
        seasonal, irregular):
    """The lag-averaged weights assume decorrelation depends on the epochs' separation; where
    it does not (a seasonal coherence, irregular revisits: measured 4-7 % lower RMSE at 60
    epochs and 50 looks) their steadiness still beats the sample magnitudes' exactness."""
    coherence, rng = _coherence_case(60, seasonal=seasonal, irregular=irregular, seed=3)
    theta = wrap_phase(rng.uniform(-np.pi, np.pi, 60))
    theta[0] = 0.0
    looks = circular_gaussian_looks(coherence, theta, (800, 50), rng)
    with threadpool_limits(1):
        gamma, _ = sample_coherence(looks)
        rmse = {m: float(np.sqrt(np.mean(wrap_phase(
            link_phases(gamma, magnitudes=m)[0] - theta)[:, 1:] ** 2))) for m in MAGNITUDES}
    crb = float(np.sqrt(cramer_rao_bound(coherence, 50)[1:].mean()))
    assert rmse["lag"] < 0.98 * rmse["sample"], (rmse, crb)


def test_lag_averaged_equals_the_mean_of_each_diagonal():
    rng = np.random.default_rng(4)
    raw = rng.uniform(0.1, 0.9, (5, 7, 7))
    magnitude = (raw + np.swapaxes(raw, 1, 2)) / 2
    for start in (0, 2):
        averaged = lag_averaged(magnitude, start)
        block = magnitude[:, start:, start:]
        for i in range(block.shape[1]):
            for j in range(block.shape[2]):
                expected = np.diagonal(block, offset=abs(i - j), axis1=1, axis2=2).mean(-1)
                np.testing.assert_allclose(averaged[:, start + i, start + j], expected)
        np.testing.assert_array_equal(averaged[:, :start], magnitude[:, :start])
        np.testing.assert_array_equal(averaged[:, :, :start], magnitude[:, :, :start])
    with pytest.raises(ValueError, match="magnitudes"):
        link_phases(np.eye(3)[None].astype(np.complex128), magnitudes="median")


@pytest.mark.slow
def test_emi_beats_evd_and_unshrunk_emi_with_few_looks():
    emi, _, crb = _linked_rmse(60, 50, "emi", seed=7, n_pixels=300)
    evd, _, _ = _linked_rmse(60, 50, "evd", seed=7, n_pixels=300)
    published, _, _ = _linked_rmse(60, 50, "emi", seed=7, n_pixels=300, weight_shrinkage=0.0,
                                   magnitudes="sample")
    assert emi < evd < published


def test_cramer_rao_bound_falls_as_one_over_looks():
    coherence = exponential_coherence(np.arange(20) * 12.0)
    np.testing.assert_allclose(cramer_rao_bound(coherence, 10),
                               4 * cramer_rao_bound(coherence, 40), rtol=1e-12)


def test_bias_correction_brings_the_sample_coherence_magnitude_to_the_truth():
    coherence = exponential_coherence([0.0, 1e9], gamma0=0.3, gamma_inf=0.3)
    looks = circular_gaussian_looks(coherence, np.zeros(2), (4000, 10), np.random.default_rng(3))
    raw = np.abs(sample_coherence(looks)[0][:, 0, 1]) ** 2
    corrected = np.abs(sample_coherence(looks, bias_correction=True)[0][:, 0, 1]) ** 2
    assert abs(corrected.mean() - 0.09) < abs(raw.mean() - 0.09) / 2


@pytest.mark.slow
def test_phase_linking_of_a_stack_matches_its_truth_where_the_shp_are_pure():
    """End to end on a simulated stack: pixels whose SHP hold only their own region are linked
    as the kernel test says (within 1.2x the bound at their own look count, RMSE over all such
    pixels); pixels with foreign SHP are worse, and flagged by a lower temporal coherence."""
    window = (11, 11)
    stack, truth = simulate_ds_stack(shape=(48, 96), n_epochs=30, seed=21)
    shp = select_shp(stack, window=window).compute()
    with threadpool_limits(1):
        linked = phase_linking(stack, shp).compute()
    _, other = _window_truth(truth, window)
    pure = linked["ds_candidate"].values & ~(shp["shp"].values & other).any(axis=-1)
    error = wrap_phase(linked["phase"].values - truth["phase"].values)[pure][:, 1:]
    n_looks = linked["shp_count"].values[pure]
    crb = cramer_rao_bound(np.broadcast_to(truth["coherence"].values, (n_looks.size, 30, 30)),
                           n_looks)[:, 1:]
    assert pure.sum() > 1000
    assert np.sqrt(np.mean(error**2)) <= CRB_FACTOR * np.sqrt(crb.mean())
    mixed = linked["ds_candidate"].values & ~pure
    coherence = linked["temporal_coherence"].values
    assert np.nanmean(coherence[mixed]) < np.nanmean(coherence[pure])


# ------------------------------------------------------------------- sequential estimator
def _sequential_case(n_epochs, n_looks=100, n_pixels=300, ministack=15, max_compressed=None):
    coherence = exponential_coherence(np.arange(n_epochs) * 12.0)
    rng = np.random.default_rng(n_epochs)
    theta = wrap_phase(rng.uniform(-np.pi, np.pi, n_epochs))
    theta[0] = 0.0
    looks = circular_gaussian_looks(coherence, theta, (n_pixels, n_looks), rng)
    crb = float(np.sqrt(cramer_rao_bound(coherence, n_looks)[1:].mean()))
    tracemalloc.start()
    try:
        with threadpool_limits(1):
            phase, compressed = sequential_phase_linking(
                (looks[..., k:k + ministack] for k in range(0, n_epochs, ministack)),
                max_compressed=max_compressed)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rmse = float(np.sqrt(np.mean(wrap_phase(phase - theta)[:, 1:] ** 2)))
    return rmse, crb, peak, compressed.shape[-1]


@pytest.mark.slow
def test_sequential_estimator_keeps_memory_flat_and_emi_accuracy_from_30_to_120_epochs():
    """Mini-stacks of 15 with their compressed SLCs: memory grows with the number of
    mini-stacks only (1 to 8 here), far below the 16x of a 4x longer full coherence matrix, and
    the phase stays within 1.2x the Cramér-Rao bound. With ``max_compressed`` 3 it stops
    growing once three compressed SLCs are carried (measured 1.19x from 30 to 120 epochs, 1.02x
    from 120 to 240, against 1.54x and 1.5x with all of them), at most 2 % above the
    unbounded estimator's RMSE (measured 0.9 % at 120 epochs)."""
    short, long_ = _sequential_case(30), _sequential_case(120)
    for rmse, crb, _, _ in (short, long_):
        assert rmse <= CRB_FACTOR * crb
    assert long_[2] < 2.0 * short[2]
    capped = {n: _sequential_case(n, max_compressed=3) for n in (30, 120, 180)}
    assert [capped[n][3] for n in capped] == [2, 3, 3]
    assert capped[30][:2] == short[:2]  # two mini-stacks: nothing dropped, the same estimator
    assert capped[120][2] < 1.3 * capped[30][2] and capped[180][2] < 1.05 * capped[120][2]
    assert capped[120][0] <= CRB_FACTOR * capped[120][1]
    assert capped[120][0] <= 1.02 * long_[0]


def test_a_cap_the_stack_never_reaches_changes_nothing():
    """``max_compressed`` at or above the mini-stacks a stack has: the unbounded estimator, to
    the bit; below it, the first compressed SLC is kept (the datum stays the first epoch)."""
    rng = np.random.default_rng(5)
    n_epochs = 20
    coherence = exponential_coherence(np.arange(n_epochs) * 12.0)
    theta = wrap_phase(rng.uniform(-np.pi, np.pi, n_epochs))
    looks = circular_gaussian_looks(coherence, theta, (30, 40), rng)
    runs = {cap: sequential_phase_linking(
        (looks[..., k:k + 5] for k in range(0, n_epochs, 5)), max_compressed=cap)
        for cap in (None, 4, 9, 2)}
    for cap in (4, 9):
        np.testing.assert_array_equal(runs[cap][0], runs[None][0])
        np.testing.assert_array_equal(runs[cap][1], runs[None][1])
    phase, compressed = runs[2]
    assert compressed.shape[-1] == 2 and (phase[:, 0] == 0).all()
    np.testing.assert_array_equal(compressed[..., 0], runs[None][1][..., 0])
    np.testing.assert_array_equal(phase[:, :10], runs[None][0][:, :10])  # nothing dropped yet
    assert not np.array_equal(phase[:, 15:], runs[None][0][:, 15:])


# ------------------------------------------------------------------------ the pre-screen
def test_short_lag_coherence_is_the_superdiagonal_of_the_sample_coherence():
    """The pre-screen's proxy, summed cell by cell over a block, is the mean of the
    consecutive-epoch magnitudes of each pixel's sample coherence over its SHP."""
    rng = np.random.default_rng(3)
    window, n_epochs = (3, 5), 9
    coherence = exponential_coherence(np.arange(n_epochs) * 12.0)
    slc = circular_gaussian_looks(coherence, rng.uniform(-3, 3, n_epochs), (8, 10), rng)
    weights = rng.random((6, 6, 15)) < 0.7
    proxy = short_lag_coherence(slc, weights, window)
    rows, cols = np.nonzero(np.ones((6, 6), bool))
    gamma, _ = sample_coherence(gather_neighbours(slc, rows, cols, window), weights[rows, cols])
    expected = np.abs(np.diagonal(gamma, offset=1, axis1=1, axis2=2)).mean(axis=1)
    np.testing.assert_allclose(proxy[rows, cols], expected, rtol=1e-5)


@pytest.mark.parametrize(("n_looks", "n_epochs"), [(20, 30), (121, 30)])
def test_prescreen_bound_passes_few_pixels_without_coherence(n_looks, n_epochs):
    """Pure noise: the proxy's mean is the Beta(1, L - 1) model's ``E|g|`` within its standard
    error, and at 3 standard deviations at most 1 % of the pixels pass (0.13 % for a normal
    tail; the mean of magnitudes is skewed a little, measured 0.1-0.35 %)."""
    rng = np.random.default_rng(11)
    n_pixels = 2000
    looks = ((rng.standard_normal((n_pixels, n_looks, n_epochs))
              + 1j * rng.standard_normal((n_pixels, n_looks, n_epochs))) / np.sqrt(2.0))
    power = (np.abs(looks) ** 2).sum(axis=1)
    cross = np.abs((looks[..., :-1] * np.conj(looks[..., 1:])).sum(axis=1))
    proxy = (cross / np.sqrt(power[:, :-1] * power[:, 1:])).mean(axis=1)
    mean = short_lag_noise_threshold(n_looks, n_epochs, 0.0)
    std = (short_lag_noise_threshold(n_looks, n_epochs, 1.0) - mean)
    assert abs(proxy.mean() - mean) < 4 * std / np.sqrt(n_pixels)
    assert (proxy > short_lag_noise_threshold(n_looks, n_epochs, 3.0)).mean() < 0.01


def test_temporal_coherence_in_tiles_is_the_full_one():
    """Summed over every pair of epoch groups, less the diagonal, the tiles give
    temporal_coherence of the whole T x T sample coherence (the mini-stack path's acceptance is
    the full linking's)."""
    rng = np.random.default_rng(8)
    n_epochs = 13
    coherence = exponential_coherence(np.arange(n_epochs) * 12.0)
    looks = circular_gaussian_looks(coherence, rng.uniform(-3, 3, n_epochs), (20, 30), rng)
    weights = rng.random((20, 30)) < 0.8
    phase = rng.uniform(-np.pi, np.pi, (20, n_epochs)).astype(np.float32)
    gamma, _ = sample_coherence(looks, weights)
    groups = [(0, 5), (5, 10), (10, 13)]
    total = sum(temporal_coherence_tile(looks[..., a0:a1], looks[..., b0:b1], phase[:, a0:a1],
                                        phase[:, b0:b1], weights)
                for a0, a1 in groups for b0, b1 in groups)
    np.testing.assert_allclose((total - n_epochs) / (n_epochs * (n_epochs - 1)),
                               temporal_coherence(gamma, phase), atol=1e-5)


@pytest.mark.slow
def test_ministack_linking_of_a_stack_is_the_full_one_within_the_bound():
    """Mini-stacks of 10 of 40 epochs against all at once, same SHP: the two estimates of one
    truth differ by at most what two estimators each within 1.2x the Cramér-Rao bound (at the
    true coherence and the SHP count) can, sqrt(2) 1.2 CRB in RMS; and each is within 1.2x of
    the other's error to the truth."""
    stack, truth = simulate_ds_stack(shape=(24, 36), n_epochs=40, seed=4)
    stack = stack.compute()
    shp = select_shp(stack, window=(7, 7), min_looks=10).compute()
    with threadpool_limits(1):  # small eigenproblems: BLAS threads only spin
        full = phase_linking(stack, shp).compute()
        sequential = phase_linking(stack, shp, ministack=10).compute()
    assert sequential.attrs["ministack"] == 10
    linked = np.isfinite(full["temporal_coherence"].values)
    np.testing.assert_array_equal(np.isfinite(sequential["temporal_coherence"].values), linked)
    looks = shp["shp_count"].values[linked].astype(float)
    variance = cramer_rao_bound(np.broadcast_to(truth["coherence"].values,
                                                (looks.size, 40, 40)), looks)
    crb = np.sqrt(np.mean(variance[:, 1:]))
    difference = wrap_phase(sequential["phase"].values[linked] - full["phase"].values[linked])
    assert (difference[:, 0] == 0).all()  # one datum: the first epoch
    assert np.sqrt(np.mean(difference[:, 1:] ** 2)) <= np.sqrt(2.0) * CRB_FACTOR * crb
    errors = [np.sqrt(np.mean(wrap_phase(d["phase"].values[linked]
                                         - truth["phase"].values[linked])[:, 1:] ** 2))
              for d in (full, sequential)]
    assert errors[1] <= CRB_FACTOR * errors[0] and errors[0] <= CRB_FACTOR * errors[1]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"ministack": 1}, "ministack: expected at least 2"),
    ({"ministack": 10, "reference": 3}, "expected reference 0"),
    ({"ministack": 10, "max_compressed": 0}, "max_compressed: expected at least 1"),
])
def test_ministack_linking_refuses_what_it_cannot_do(kwargs, match):
    stack, _ = simulate_ds_stack(shape=(12, 12), n_epochs=6)
    shp = select_shp(stack, window=(3, 3), min_looks=3)
    with pytest.raises(ValueError, match=match):
        phase_linking(stack, shp, **kwargs)


# ----------------------------------------------------------------------------- NumPy / CuPy
def _kernel_outputs(xp, n_epochs=12):
    """Every kernel on one batch, inputs moved to ``xp``; outputs on the host."""
    coherence = exponential_coherence(np.arange(n_epochs) * 12.0)
    rng = np.random.default_rng(5)
    theta = rng.uniform(-np.pi, np.pi, n_epochs)
    looks = xp.asarray(circular_gaussian_looks(coherence, theta, (64, 30), rng))
    gamma, n_looks = sample_coherence(looks, bias_correction=True)
    out = {"coherence": gamma}
    for method in ("emi", "evd"):
        out[f"phase_{method}"], out[f"eigenvalue_{method}"] = link_phases(gamma, method=method)
    out["temporal_coherence"] = temporal_coherence(gamma, out["phase_emi"])
    out["crb"] = cramer_rao_bound(gamma, n_looks)
    out["sequential"], out["compressed"] = sequential_phase_linking(
        looks[..., k:k + 4] for k in range(0, n_epochs, 4))
    out["sequential_capped"], out["compressed_capped"] = sequential_phase_linking(
        (looks[..., k:k + 2] for k in range(0, n_epochs, 2)), max_compressed=2)
    out["short_lag_coherence"] = short_lag_coherence(
        looks.reshape(8, 8, 30, n_epochs)[:, :, 0], xp.ones((6, 6, 9), dtype=bool), (3, 3))
    out["temporal_coherence_tile"] = temporal_coherence_tile(
        looks[..., :4], looks[..., 4:], out["phase_emi"][:, :4], out["phase_emi"][:, 4:],
        xp.ones(looks.shape[:2], dtype=bool))
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="CuPy or a working CUDA device is missing")
def test_kernels_on_cupy_match_numpy_to_float32_round_off():
    import cupy

    cpu, gpu = _kernel_outputs(np), _kernel_outputs(cupy)
    for name, value in cpu.items():
        got = to_host(gpu[name])
        if name.startswith(("phase", "sequential")):
            got, value = wrap_phase(got - value), np.zeros_like(value)
        scale = np.sqrt(np.mean(np.abs(value) ** 2)) or 1.0
        assert np.sqrt(np.mean(np.abs(got - value) ** 2)) / scale < 1e-5, name


_STAND_IN_CHECK = textwrap.dedent("""
    import sys
    import numpy as np
    import cupy
    sys.path.insert(0, sys.argv[1])
    from kernel_outputs import outputs
    cpu, gpu = outputs(np), outputs(cupy)
    for name, value in cpu.items():
        assert type(gpu[name]).__module__ == "cupy", (name, type(gpu[name]))
        np.testing.assert_array_equal(np.asarray(gpu[name]), value, err_msg=name)
    print("same", sorted(cpu))
""")


@pytest.mark.slow  # a child process importing depsi
@pytest.mark.skipif(cupy_available(), reason="a real GPU is here: the CuPy test covers it")
def test_kernels_take_one_code_path_on_the_cupy_stand_in(tmp_path):
    """By construction: with tests/cupy_stand_in.py as ``cupy`` in a child process, the kernels
    keep their arrays in the "device" namespace end to end and give NumPy's numbers exactly."""
    package = tmp_path / "stand_in" / "cupy"
    package.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "cupy_stand_in.py", package / "__init__.py")
    helper = tmp_path / "helper"
    helper.mkdir()
    source = Path(__file__).read_text()
    start = source.index("def _kernel_outputs")
    end = source.index("@pytest.mark.gpu")
    (helper / "kernel_outputs.py").write_text(
        "import numpy as np\n"
        "from depsi.kernels.phase_linking import (cramer_rao_bound, link_phases,\n"
        "    sample_coherence, sequential_phase_linking, short_lag_coherence,\n"
        "    temporal_coherence, temporal_coherence_tile)\n"
        "from depsi.simulate.ds import circular_gaussian_looks, exponential_coherence\n\n"
        + source[start:end].replace("def _kernel_outputs", "def outputs"))
    path = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _STAND_IN_CHECK, str(helper)],
                          env=os.environ | {"PYTHONPATH": path}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "same" in done.stdout
