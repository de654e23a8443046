"""The chain's per-point standard deviations (``velocity_std``, ``height_error_std``,
``displacement_std``) against the truth of scenes of different atmosphere and noise.

Each estimate is compared as the chain reports it, relative to the reference area: the truth
less its mean over the true PS of ``in_reference_area``; on true PS with temporal coherence
>= 0.8. A 95 % interval is ``estimate +- 1.96 std``; the goal is that it holds the truth for 90
to 98 % of the points (below: the std is too small; above: too large to tell a signal from
noise). Figures measured on every family are in docs/chain.md, "Uncertainty".
"""

from __future__ import annotations

import numpy as np
import pytest

from depsi import run_ps_chain
from depsi.processing.model_fit import Z95
from depsi.processing.selection import ps_selection
from depsi.simulate import simulate_stack
from scenes import FAST_FAMILIES, make_scene, truth_index

COVERAGE = (0.90, 0.98)
FAMILIES = {f.name: f for f in FAST_FAMILIES}


def _coverage(result, index, velocity, height):
    """Fraction of 95 % intervals holding the truth, velocity and height; ``index`` (-1 where
    a result point is no true PS) into the truth's ``velocity`` and ``height``."""
    true_ps = index >= 0
    compared = true_ps & (result["temporal_coherence"].values >= 0.8)
    area = result["in_reference_area"].values & true_ps
    figures = []
    for name, truth in (("velocity", velocity), ("height_error", height)):
        true = np.where(true_ps, truth[np.maximum(index, 0)], np.nan)
        error = result[name].values - (true - true[area].mean())
        inside = np.abs(error[compared]) <= Z95 * result[f"{name}_std"].values[compared]
        figures.append(float(inside.mean()))
    return figures


def _family(name):
    stack, truth = make_scene(FAMILIES[name])
    result = run_ps_chain(ps_selection(stack, method="nad", threshold=0.25).compute())
    index = truth_index(truth, result["azimuth"].values, result["range"].values)
    return result, index, truth["velocity"], truth["height_error"]


def _simulated(seed=0, **kwargs):
    stack, truth = simulate_stack(seed=seed, **kwargs)
    points = ps_selection(stack).compute()
    result = run_ps_chain(points)
    at = result["point_index"].values
    az, rg = points["azimuth"].values[at], points["range"].values[at]
    index = np.where(truth["ps_mask"].values[az, rg], np.arange(at.size), -1)
    return (result, index, truth["velocity"].values[az, rg],
            truth["height_error"].values[az, rg])


@pytest.mark.parametrize("scene", [
    # 0.5 rad screens of 200 m, 0.3 rad noise, 30 epochs of 24 days
    pytest.param(lambda: _family("short-weak"), id="short-weak", marks=pytest.mark.slow),
    # the simulator's own screens (Kolmogorov, 1 rad), 0.3 rad noise
    pytest.param(lambda: _simulated(seed=0), id="simulator-default"),
    # 1 rad screens of 400 m, 0.35 rad noise, DEM errors shared by blocks of buildings
    pytest.param(lambda: _family("building-blocks"), id="building-blocks",
                 marks=pytest.mark.slow),
])
def test_95_percent_intervals_hold_the_truth(scene):
    velocity, height = _coverage(*scene())
    assert COVERAGE[0] <= velocity <= COVERAGE[1], f"velocity coverage {velocity:.3f}"
    assert COVERAGE[0] <= height <= COVERAGE[1], f"height coverage {height:.3f}"


@pytest.mark.slow
def test_std_follows_the_noise_put_in():
    """Without atmosphere the residual is the PS noise alone, so doubling ``ps_noise_std``
    doubles every std. Tolerance: the median over N points of a std from T - 3 degrees of
    freedom is off by about 1.25 / sqrt(2 (T - 3) N), 0.6 % at T = 30 and N = 800; 5 % allows
    for the points and ambiguities that change with the noise."""
    low, high = (_simulated(seed=0, aps_std=0.0, ps_noise_std=noise)[0] for noise in (0.3, 0.6))
    for name in ("velocity_std", "height_error_std", "displacement_std"):
        ratio = float(np.median(high[name].values[..., -1]) /
                      np.median(low[name].values[..., -1]))
        assert ratio == pytest.approx(2.0, rel=0.05), f"{name}: ratio {ratio:.3f}"
    assert (low["displacement_std"].isel(time=0) == 0).all()


def test_the_chain_carries_the_stds_with_their_units():
    result = _simulated(seed=1, shape=(60, 60), n_epochs=20)[0]
    assert result["velocity_std"].attrs["units"] == "m year-1"
    assert result["height_error_std"].attrs["units"] == "m"
    assert result["displacement_std"].dims == result["displacement"].dims
    assert result["displacement_std"].dtype == np.float32
    for name in ("velocity_std", "height_error_std", "displacement_std"):
        assert np.isfinite(result[name].values).all() and (result[name].values >= 0).all()


@pytest.mark.parametrize("case", ["linear", "terms held by some points", "constant h2ph"])
def test_uncertainty_block_is_each_points_own_least_squares(case):
    """The block's matrix products (shared columns, one per-point column) and its direct
    inverses give what each point's own least squares gives: ``numpy.linalg.lstsq`` of its
    design, the residual variance and ``sigma0^2 (A^T A)^+`` (``pinv``) per point, in a loop."""
    from depsi.processing.model_fit import _uncertainty_block

    rng = np.random.default_rng(7)
    n, n_epochs = 40, 30
    years = np.arange(n_epochs) * 12 / 365.25
    m2ph = -4 * np.pi / 0.0555
    unwrapped = rng.normal(0, 1, (n, n_epochs)).astype(np.float32)
    aps = rng.normal(0, 1, (n, n_epochs)).astype(np.float32)
    h2ph = (rng.normal(0, 2e-4, n) if case == "constant h2ph"
            else rng.normal(0, 2e-4, (n, n_epochs))).astype(np.float32)
    regressors = ((np.sin(2 * np.pi * years), np.cos(2 * np.pi * years))
                  if case == "terms held by some points" else ())
    held = rng.random((n, len(regressors))) < 0.5
    dof = np.maximum(n_epochs - 3 - held.sum(axis=1), 1).astype(np.float64)
    common, common_corrected = rng.normal(size=n_epochs), rng.normal(size=n_epochs)
    got = _uncertainty_block(unwrapped, aps, h2ph, dof, held, years=years, m2ph=m2ph,
                             common=common, common_corrected=common_corrected,
                             regressors=regressors)
    for i in range(n):
        h = np.broadcast_to(np.asarray(h2ph[i], np.float64), (n_epochs,))
        design = np.column_stack([m2ph * years, m2ph * h, np.ones(n_epochs)]
                                 + [m2ph * g * held[i, j] for j, g in enumerate(regressors)])
        inverse = np.linalg.pinv(design.T @ design)
        for y, key in ((unwrapped[i] + aps[i].astype(np.float64) - common, "with"),
                       (unwrapped[i].astype(np.float64) - common_corrected, "corrected")):
            fit = np.linalg.lstsq(design, y, rcond=None)[0]
            variance = np.sum((y - design @ fit) ** 2) / dof[i]
            if key == "with":
                np.testing.assert_allclose(got["velocity_std"][i],
                                           np.sqrt(variance * inverse[0, 0]), rtol=1e-7)
                np.testing.assert_allclose(got["height_std"][i],
                                           np.sqrt(variance * inverse[1, 1]), rtol=1e-7)
            else:
                np.testing.assert_allclose(got["corrected_var"][i], variance, rtol=1e-9)
        if regressors:
            full = np.column_stack([design[:, :3]] + [m2ph * g for g in regressors])
            y = unwrapped[i] + aps[i].astype(np.float64) - common
            fit = np.linalg.lstsq(full, y, rcond=None)[0]
            variance = np.sum((y - full @ fit) ** 2) / (n_epochs - 3 - len(regressors))
            np.testing.assert_allclose(
                got["term_std"][i],
                np.sqrt(variance * np.diag(np.linalg.pinv(full.T @ full))[3:]), rtol=1e-7)
