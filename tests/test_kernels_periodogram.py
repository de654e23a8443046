"""Periodogram: known heights and velocities recovered within the noise; the coarse grid equals
a per-arc loop over the grid; refinement far below the grid step; NaN epochs and ambiguities."""

from __future__ import annotations

import numpy as np
import pytest

from depsi.conventions import MISSING_AMBIGUITY, wrap_phase
from depsi.kernels.backend import single_threaded_blas
from depsi.kernels.flags import Flag
from depsi.kernels.periodogram import default_step, ensemble_coherence, grid_nodes, periodogram

WAVELENGTH = 0.0555
M2PH = -4 * np.pi / WAVELENGTH


def _arcs(rng, K, T, sigma, span_years=5.0):
    t = np.sort(rng.uniform(0, span_years, T))
    t -= t[0]
    h2ph = rng.normal(0, 1.5e-4, (K, T))
    height = rng.uniform(-40, 40, K)
    velocity = rng.uniform(-0.04, 0.04, K)
    model = M2PH * (velocity[:, None] * t + h2ph * height[:, None])
    noise = rng.normal(0, sigma, (K, T))
    return t, h2ph, height, velocity, model, noise


def _cramer_rao_std(t, h2ph, sigma):
    """Linearised std of (height, velocity) for phase noise sigma, with the constant phase
    estimated too: sigma * sqrt(diag((J^T J)^-1)), J = [m2ph h2ph, m2ph t, 1], per item."""
    K, T = h2ph.shape
    J = np.stack([M2PH * h2ph, np.broadcast_to(M2PH * t, (K, T)), np.ones((K, T))], axis=2)
    cov = np.linalg.inv(np.einsum("ktp,ktq->kpq", J, J))
    return sigma * np.sqrt(np.diagonal(cov, axis1=1, axis2=2)[:, :2])


def test_periodogram_recovers_height_and_velocity_within_noise():
    rng = np.random.default_rng(10)
    sigma = 0.3
    t, h2ph, height, velocity, model, noise = _arcs(rng, 400, 60, sigma)
    res = periodogram(wrap_phase(model + noise), h2ph, t, wavelength=WAVELENGTH)
    crb = _cramer_rao_std(t, h2ph, sigma)
    z_height = (res.height_error - height) / crb[:, 0]
    z_velocity = (res.velocity - velocity) / crb[:, 1]
    # normalised errors: unit variance at the Cramer-Rao bound; 400 samples put the sample
    # RMS within ~7 % (2 sigma) of the truth, the wrapped-normal noise adds a few %
    assert np.sqrt(np.mean(z_velocity**2)) < 1.2
    assert np.sqrt(np.mean(z_height**2)) < 1.2
    assert abs(z_velocity.mean()) < 0.2 and abs(z_height.mean()) < 0.2
    assert (res.flag == Flag.OK).all()


def test_ambiguities_resolved_for_99_percent_of_arcs_at_half_radian_noise():
    rng = np.random.default_rng(11)
    sigma = 0.5
    t, h2ph, _, velocity, model, noise = _arcs(rng, 1000, 60, sigma)
    phase = wrap_phase(model + noise)
    res = periodogram(phase, h2ph, t, wavelength=WAVELENGTH)
    unwrapped = phase + 2 * np.pi * res.ambiguity
    # right ambiguities: the unwrapped phase is the true one (model + noise), epoch by epoch
    correct = (np.abs(unwrapped - (model + noise)) < np.pi).all(axis=1)
    assert correct.mean() >= 0.99
    # velocity error at the Cramer-Rao bound, itself well below the grid step
    step = np.diff(grid_nodes(-0.05, 0.05, default_step(np.ptp(t), WAVELENGTH)))[0]
    crb = np.sqrt(np.mean(_cramer_rao_std(t, h2ph, sigma)[:, 1] ** 2))
    rms = np.sqrt(np.mean((res.velocity - velocity) ** 2))
    assert rms < 1.2 * crb < 0.2 * step


def _coherence_loop(phase, h2ph, t, heights, velocities):
    """Straightforward reference: per arc, per grid node, the ensemble coherence."""
    K = phase.shape[0]
    best = np.zeros((K, 3))
    for k in range(K):
        valid = np.isfinite(phase[k])
        grid = np.zeros((heights.size, velocities.size))
        for i, H in enumerate(heights):
            for j, v in enumerate(velocities):
                model = M2PH * (v * t + h2ph[k] * H)
                grid[i, j] = np.abs(np.mean(np.exp(1j * (phase[k] - model))[valid]))
        i, j = np.unravel_index(grid.argmax(), grid.shape)
        second = np.sort(grid.ravel())[-2]
        best[k] = heights[i], velocities[j], grid[i, j] - second
    return best, grid


def test_coarse_stage_equals_a_per_arc_loop_over_the_grid():
    rng = np.random.default_rng(12)
    t, h2ph, _, _, model, noise = _arcs(rng, 24, 30, 0.4)
    phase = wrap_phase(model + noise)
    phase[3, 5:9] = np.nan
    heights, velocities = grid_nodes(-50, 50, 5.0), grid_nodes(-0.05, 0.05, 0.005)
    res = periodogram(phase, h2ph, t, wavelength=WAVELENGTH, height_step=5.0,
                      velocity_step=0.005, refine=False)
    ref, _ = _coherence_loop(phase, h2ph, t, heights, velocities)
    clear = ref[:, 2] > 1e-5  # complex64 sums: nodes closer than that may swap
    assert clear.sum() >= 20
    np.testing.assert_array_equal(res.height_error[clear], ref[clear, 0])
    np.testing.assert_array_equal(res.velocity[clear], ref[clear, 1])
    # the returned coherence is the reference's grid maximum
    ref_max = np.array([np.abs(np.nanmean(np.exp(1j * (phase[k] - M2PH * (
        res.velocity[k] * t + h2ph[k] * res.height_error[k]))))) for k in range(24)])
    np.testing.assert_allclose(res.coherence, ref_max, rtol=1e-12)
    np.testing.assert_allclose(res.grid_coherence, ref_max, rtol=1e-5)  # complex64 sums


def test_refinement_goes_far_below_the_grid_step():
    rng = np.random.default_rng(13)
    t, h2ph, height, velocity, model, _ = _arcs(rng, 50, 40, 0.0)
    res = periodogram(wrap_phase(model), h2ph, t, wavelength=WAVELENGTH, height_step=4.0,
                      velocity_step=0.004)
    assert np.abs(res.velocity - velocity).max() < 1e-6 * 0.004
    assert np.abs(res.height_error - height).max() < 1e-6 * 4.0
    np.testing.assert_allclose(res.coherence, 1.0, atol=1e-12)
    assert (res.coherence >= res.grid_coherence).all()


def test_refined_estimate_is_the_coherence_maximum():
    rng = np.random.default_rng(14)
    t, h2ph, _, _, model, noise = _arcs(rng, 3, 40, 0.6)
    phase = wrap_phase(model + noise)
    res = periodogram(phase, h2ph, t, wavelength=WAVELENGTH)
    for k in range(3):  # a dense local grid around the estimate finds nothing higher
        dh, dv = np.meshgrid(np.linspace(-1, 1, 41), np.linspace(-2e-4, 2e-4, 41))
        model_k = M2PH * ((res.velocity[k] + dv.ravel()[:, None]) * t
                          + h2ph[k] * (res.height_error[k] + dh.ravel()[:, None]))
        local = np.abs(np.exp(1j * (phase[k] - model_k)).mean(axis=1))
        assert local.max() <= res.coherence[k] + 1e-12


def test_nan_epochs_are_ignored():
    rng = np.random.default_rng(15)
    t, h2ph, _, _, model, noise = _arcs(rng, 20, 50, 0.3)
    phase = wrap_phase(model + noise)
    drop = np.zeros(50, bool)
    drop[[4, 17, 30, 31]] = True
    with_nan = phase.copy()
    with_nan[:, drop] = np.nan
    a = periodogram(with_nan, h2ph, t, wavelength=WAVELENGTH, height_step=5.0,
                    velocity_step=2e-3)
    b = periodogram(phase[:, ~drop], h2ph[:, ~drop], t[~drop], wavelength=WAVELENGTH,
                    height_step=5.0, velocity_step=2e-3)
    # the same maximum, to the refinement's tolerance (1e-9 of the grid step)
    np.testing.assert_allclose(a.velocity, b.velocity, rtol=0, atol=1e-8 * 2e-3)
    np.testing.assert_allclose(a.height_error, b.height_error, rtol=0, atol=1e-8 * 5.0)
    np.testing.assert_allclose(a.coherence, b.coherence, rtol=1e-12)
    assert np.isnan(a.residual_phase[:, drop]).all()
    assert (a.ambiguity[:, drop] == MISSING_AMBIGUITY).all()
    np.testing.assert_array_equal(a.ambiguity[:, ~drop], b.ambiguity)
    assert (a.n_valid == 46).all()


def test_ambiguity_and_residual_reconstruct_the_phase():
    rng = np.random.default_rng(16)
    t, h2ph, _, _, model, noise = _arcs(rng, 30, 45, 0.5)
    phase = wrap_phase(model + noise)
    res = periodogram(phase, h2ph, t, wavelength=WAVELENGTH)
    fitted = M2PH * (res.velocity[:, None] * t + h2ph * res.height_error[:, None])
    lhs = phase + 2 * np.pi * res.ambiguity
    rhs = fitted + res.offset[:, None] + res.residual_phase
    np.testing.assert_allclose(lhs, rhs, atol=1e-9)
    assert (np.abs(res.residual_phase) <= np.pi).all()
    np.testing.assert_allclose(ensemble_coherence(res.residual_phase), res.coherence, rtol=1e-9)


def test_shared_h2ph_equals_per_item_h2ph():
    rng = np.random.default_rng(17)
    t, h2ph, _, _, _, _ = _arcs(rng, 1, 40, 0.0)
    h2ph = h2ph[0]
    height, velocity = rng.uniform(-30, 30, 15), rng.uniform(-0.03, 0.03, 15)
    phase = wrap_phase(M2PH * (velocity[:, None] * t + h2ph * height[:, None])
                       + rng.normal(0, 0.4, (15, 40)))
    shared = periodogram(phase, h2ph, t, wavelength=WAVELENGTH)
    per_item = periodogram(phase, np.tile(h2ph, (15, 1)), t, wavelength=WAVELENGTH)
    np.testing.assert_allclose(shared.velocity, per_item.velocity, rtol=1e-9)
    # the two coarse grids round differently (BLAS kernels by CPU), so Newton starts elsewhere
    # and lands on the same float64 maximum: 1e-8 m of height is 1e-9 rad of model phase here
    np.testing.assert_allclose(shared.height_error, per_item.height_error, rtol=1e-9,
                               atol=1e-8)


def test_extra_seasonal_term_is_recovered():
    rng = np.random.default_rng(18)
    t, h2ph, height, velocity, model, noise = _arcs(rng, 40, 60, 0.1, span_years=4.0)
    amplitude = rng.uniform(-0.006, 0.006, 40)
    season = np.sin(2 * np.pi * t)
    phase = wrap_phase(model + M2PH * amplitude[:, None] * season + noise)
    res = periodogram(phase, h2ph, t, wavelength=WAVELENGTH,
                      extra_regressors={"seasonal_sin": (season, (-0.01, 0.01))})
    # noise 0.1 rad over 60 epochs: amplitude std ~ 0.1 / (226 * 0.7 * sqrt(60)) ~ 0.1 mm
    assert np.abs(res.extra["seasonal_sin"] - amplitude).max() < 1e-3
    assert np.abs(res.velocity - velocity).max() < 1e-3


def test_constant_h2ph_is_rank_deficient_and_few_epochs_too_few():
    t = np.linspace(0, 2, 12)
    phase = wrap_phase(M2PH * 0.01 * t)[None].repeat(3, axis=0)
    h2ph = np.tile(np.linspace(-2e-4, 2e-4, 12) ** 2, (3, 1))
    h2ph[0] = 1e-4  # height and constant phase cannot be told apart
    phase[1, 2:] = np.nan  # two epochs for three unknowns (height, velocity, constant phase)
    phase[2] = np.nan
    res = periodogram(phase, h2ph, t, wavelength=WAVELENGTH)
    assert res.flag.tolist() == [Flag.RANK_DEFICIENT, Flag.TOO_FEW_OBSERVATIONS,
                                 Flag.TOO_FEW_OBSERVATIONS]
    assert np.isnan(res.velocity).all() and np.isnan(res.coherence[2])


def test_default_grid_step_follows_the_phase_criterion():
    # between adjacent velocity nodes the modelled phase changes by pi/2 over the time span
    step = default_step(4.0, WAVELENGTH)
    assert abs(abs(M2PH) * step * 4.0 - np.pi / 2) < 1e-12
    nodes = grid_nodes(-0.05, 0.05, step)
    assert nodes[0] == -0.05 and nodes[-1] == 0.05 and np.diff(nodes).max() <= step


def test_batches_give_the_same_result_as_one_batch():
    rng = np.random.default_rng(19)
    t, h2ph, _, _, model, noise = _arcs(rng, 25, 30, 0.3)
    phase = wrap_phase(model + noise)
    # BLAS on one thread, as the chain runs the kernel: threaded GEMMs round by the batch's
    # shape, which the float64 step from a float32 iterate within 1e-3 of a grid step carries
    # to ~1e-11 of the velocity
    with single_threaded_blas():
        one = periodogram(phase, h2ph, t, wavelength=WAVELENGTH)
        many = periodogram(phase, h2ph, t, wavelength=WAVELENGTH, max_batch=4)
    np.testing.assert_allclose(many.velocity, one.velocity, rtol=1e-12)
    np.testing.assert_array_equal(many.ambiguity, one.ambiguity)


def test_no_items():
    res = periodogram(np.zeros((0, 5)), np.ones(5) * 1e-4, np.arange(5.0),
                      wavelength=WAVELENGTH)
    assert res.velocity.shape == (0,) and res.ambiguity.shape == (0, 5)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(phase=np.zeros(5)), "phase: expected shape"),
    (dict(h2ph=np.zeros(4)), "h2ph: expected shape"),
    (dict(time_years=np.zeros(4)), "time_years"),
])
def test_shape_errors_name_the_input(kwargs, match):
    args = dict(phase=np.zeros((2, 5)), h2ph=np.zeros(5), time_years=np.arange(5.0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        periodogram(args["phase"], args["h2ph"], args["time_years"], wavelength=WAVELENGTH)


# ------------------------------------------------------------ velocity only (h2ph=None)
def _previous_velocity_only(phase, years, *, wavelength, velocity_range, velocity_step):
    """The NumPy-only velocity search that depsi.processing.arcs had before it became the
    kernel's ``h2ph=None`` case, kept verbatim (with its own phase wrapping) as the reference."""
    def wrap(x):
        return np.pi - np.mod(np.pi - x, 2 * np.pi)

    m2ph = -4.0 * np.pi / wavelength
    step = velocity_step or default_step(float(np.ptp(years)), wavelength) / 8
    nodes = grid_nodes(*velocity_range, step)
    valid = np.isfinite(phase)
    z = np.where(valid, np.exp(1j * np.where(valid, phase, 0.0)), 0.0).astype(np.complex64)
    power = np.abs(z @ np.exp(-1j * m2ph * np.outer(years, nodes)).astype(np.complex64))
    best = power.argmax(axis=1)
    rows = np.arange(len(best))
    inner = (best > 0) & (best < len(nodes) - 1)
    p0 = power[rows, best]
    pm = power[rows, np.maximum(best - 1, 0)]
    pp = power[rows, np.minimum(best + 1, len(nodes) - 1)]
    curvature = pm - 2 * p0 + pp
    ok = inner & (curvature < 0)
    shift = np.clip(np.where(ok, 0.5 * (pm - pp) / np.where(ok, curvature, -1.0), 0.0), -.5, .5)
    spacing = nodes[1] - nodes[0] if len(nodes) > 1 else 0.0
    velocity = nodes[best] + shift * spacing
    model = m2ph * velocity[:, None] * years[None, :]
    offset = np.angle(np.sum(z * np.exp(-1j * model), axis=1))
    residual = wrap(np.where(valid, phase, 0.0) - model - offset[:, None])
    coherence = ensemble_coherence(np.where(valid, residual, np.nan))
    cycles = np.rint((model + offset[:, None] + residual - np.where(valid, phase, 0.0))
                     / (2 * np.pi))
    ambiguity = np.where(valid, cycles, MISSING_AMBIGUITY).astype(np.int32)
    return velocity, coherence, ambiguity


def _velocity_only_arcs(rng, K, T, sigma, missing=0.0):
    t = np.sort(rng.uniform(0, 4, T))
    t -= t[0]
    velocity = rng.uniform(-0.04, 0.04, K)
    phase = wrap_phase(M2PH * velocity[:, None] * t + rng.uniform(-np.pi, np.pi, (K, 1))
                       + rng.normal(0, sigma, (K, T)))
    phase[rng.random((K, T)) < missing] = np.nan
    return t, velocity, phase


def test_velocity_only_case_equals_the_previous_numpy_search():
    rng = np.random.default_rng(12)
    t, _, phase = _velocity_only_arcs(rng, 500, 45, 0.6, missing=0.05)
    phase = phase.astype(np.float32)  # as arc phases are stored
    for step in (None, 2e-4):
        velocity, coherence, ambiguity = _previous_velocity_only(
            phase.astype(np.float64), t, wavelength=WAVELENGTH, velocity_range=(-0.05, 0.05),
            velocity_step=step)
        res = periodogram(phase, None, t, wavelength=WAVELENGTH, velocity_range=(-0.05, 0.05),
                          velocity_step=step)
        np.testing.assert_array_equal(res.velocity, velocity)
        # the residuals are wrapped by subtracting whole cycles (wrap_phase), the reference's by
        # a floating remainder: the two differ in the last bit, and so may the coherence
        np.testing.assert_allclose(res.coherence, coherence, rtol=1e-14, atol=0)
        np.testing.assert_array_equal(res.ambiguity, ambiguity)
        assert (res.height_error == 0).all() and (res.flag == Flag.OK).all()


def test_velocity_only_recovers_velocity_and_reconstructs_the_phase():
    rng = np.random.default_rng(13)
    sigma = 0.3
    t, velocity, phase = _velocity_only_arcs(rng, 400, 60, sigma)
    res = periodogram(phase, None, t, wavelength=WAVELENGTH)
    # the Cramer-Rao std of the velocity with the constant phase estimated too
    crb = sigma / (abs(M2PH) * np.sqrt(np.sum((t - t.mean()) ** 2)))
    assert np.std((res.velocity - velocity) / crb) < 1.3
    unwrapped = phase + 2 * np.pi * res.ambiguity
    model = M2PH * res.velocity[:, None] * t + res.offset[:, None] + res.residual_phase
    np.testing.assert_allclose(unwrapped, model, atol=1e-9)
    assert np.allclose(res.coherence, np.abs(np.mean(np.exp(1j * res.residual_phase), axis=1)))


def test_velocity_only_batches_flags_and_refusals():
    rng = np.random.default_rng(14)
    t, _, phase = _velocity_only_arcs(rng, 50, 20, 0.5)
    phase[3, 1:] = np.nan  # one epoch left: too few for velocity and the constant phase
    phase[4] = np.nan
    one = periodogram(phase, None, t, wavelength=WAVELENGTH)
    many = periodogram(phase, None, t, wavelength=WAVELENGTH, max_batch=7)
    # the grid sums are complex64 GEMMs, whose rounding depends on the batch's shape (and
    # the CPU's BLAS kernels): velocities to 1e-5 relative, and the constant phase to what
    # such a velocity difference moves it by: |m2ph| x 4e-7 m/yr x 2 yr (mean epoch), 2e-4 rad
    for name, atol in (("velocity", 1e-7), ("coherence", 1e-7), ("offset", 2e-4)):
        np.testing.assert_allclose(getattr(many, name), getattr(one, name), rtol=1e-5,
                                   atol=atol, err_msg=name)
    for name in ("ambiguity", "flag", "n_valid"):
        np.testing.assert_array_equal(getattr(many, name), getattr(one, name), err_msg=name)
    assert one.flag[3] == one.flag[4] == Flag.TOO_FEW_OBSERVATIONS
    assert np.isnan(one.velocity[[3, 4]]).all() and (one.ambiguity[4] == MISSING_AMBIGUITY).all()
    assert (np.delete(one.flag, [3, 4]) == Flag.OK).all()
    coarse = periodogram(phase, None, t, wavelength=WAVELENGTH, refine=False)
    nodes = grid_nodes(-0.05, 0.05, default_step(np.ptp(t), WAVELENGTH) / 8)
    assert np.isin(coarse.velocity[:3], nodes).all()
    with pytest.raises(ValueError, match="extra_regressors: expected none without h2ph"):
        periodogram(phase, None, t, wavelength=WAVELENGTH,
                    extra_regressors={"s": (np.sin(t), (-1, 1))})


@pytest.mark.parametrize("scale", [1e-9, 1e-4, 1e-2, 1.0])
def test_moved_sums_equal_a_fresh_evaluation(scale):
    """The sums of cos and sin of the residual after the float64 Newton step, from the series
    in the step's model phase (small steps) or evaluated afresh (items with a step beyond
    the series' reach, here the larger scales), equal a direct float64 evaluation to the
    rounding of a sum of 60 terms."""
    import importlib

    module = importlib.import_module("depsi.kernels.periodogram")  # not the function
    rng = np.random.default_rng(3)
    K, T = 500, 60
    vmask = (rng.random((K, T)) > 0.1).astype(float)
    phase0 = rng.uniform(-np.pi, np.pi, (K, T)) * vmask
    m2ph = -4 * np.pi / 0.0555
    shared = m2ph * (np.arange(T) * 0.03)[:, None]
    model = module._Model(m2ph * 3e-4 * rng.standard_normal((K, T)) * vmask, shared,
                          np.concatenate([shared, np.ones((T, 1))], axis=1))
    theta = np.stack([rng.uniform(-20, 20, K), rng.uniform(-0.02, 0.02, K)])
    step = np.stack([scale * rng.standard_normal(K), 1e-3 * scale * rng.standard_normal(K)])
    c, s, _, _ = module._evaluate(np, phase0, vmask, model, theta)
    delta = model.phase(step)
    C, S = module._moved_sums(np, phase0, vmask, model, theta + step, c, s, delta)
    _, _, C_direct, S_direct = module._evaluate(np, phase0, vmask, model, theta + step)
    np.testing.assert_allclose(C, C_direct, rtol=0, atol=5e-14)
    np.testing.assert_allclose(S, S_direct, rtol=0, atol=5e-14)
    far = (np.abs(delta) > module._SERIES_REACH).any(axis=1)
    assert far.any() == (scale >= 1e-2)


def test_result_coherence_is_the_ensemble_coherence_to_float32():
    """The results' coherence (float32 trigonometry after whole cycles are taken off) equals
    the float64 one to 1e-6, over residuals of many cycles and every coherence from noise to
    one; a row with NaN stays NaN."""
    from depsi.kernels.periodogram import result_coherence

    rng = np.random.default_rng(4)
    spread = rng.uniform(0.0, 3.0, (2000, 1))
    residual = rng.normal(0.0, 1.0, (2000, 60)) * spread + rng.integers(-300, 300, (2000, 1))
    np.testing.assert_allclose(result_coherence(residual), ensemble_coherence(residual),
                               rtol=0, atol=1e-6)
    residual[5, 7] = np.nan
    assert np.isnan(result_coherence(residual)[5]) and np.isfinite(result_coherence(residual)[6])
