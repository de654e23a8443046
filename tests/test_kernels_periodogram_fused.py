"""The fused Numba periodogram against the array-namespace kernel (the reference): the same
grid node and flags, the refinement to within a small fraction of the grid step, the same
ambiguities; and a cache that never breaks a read-only install."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from depsi.conventions import MISSING_AMBIGUITY, wrap_phase
from depsi.kernels import numba_support
from depsi.kernels.backend import single_threaded_blas
from depsi.kernels.flags import Flag
from depsi.kernels.periodogram import REFINE_TOLERANCE, periodogram

numba_kernel = pytest.importorskip("depsi.kernels.periodogram_numba")
if not numba_kernel.AVAILABLE:
    pytest.skip("Numba is not importable", allow_module_level=True)

WAVELENGTH = 0.0555
M2PH = -4 * np.pi / WAVELENGTH

#: The grid coherence: float32 sums over the epochs in either kernel (the reference's
#: ``_GRID_PRECISION``); seen up to 8e-7.
GRID_PRECISION = 1e-5

#: The refined estimates agree to this fraction of their grid step: the refinement's own stopping
#: rule (REFINE_TOLERANCE). Both kernels stop once a step is below it and take one more Newton
#: step; what is left depends on the path (float32 iterations in the reference, float64 here).
#: Seen on 600 random scenes: up to 1e-8 of a step at 0.3 rad of noise, 5e-5 at 0.8 rad, 1e-4
#: at 2 rad (pure noise, flat peaks).
STEP_FRACTION = REFINE_TOLERANCE

#: Where the peak is flat along a ridge (height and velocity correlated), stopping on the step
#: size leaves the two paths apart by more than STEP_FRACTION of a grid step, but not by more than
#: this fraction of the estimate's own standard deviation (from the least-squares covariance with
#: the phase variance the coherence implies). Seen: 0.012 of it (0.074 m of a 6.0 m standard
#: deviation, 0.8 rad of noise, 26 epochs, the two coherences 3e-9 apart).
STD_FRACTION = 0.05

#: The coherence is flat at the maximum; seen up to 1.2e-7 (2 rad of noise).
COHERENCE_TOLERANCE = 1e-6

#: The residual phase (and the constant phase) follow the estimates: a term STEP_FRACTION of its
#: grid step off moves the model phase by at most STEP_FRACTION * pi / 2 rad (GRID_PHASE_STEP);
#: seen up to 9e-5 rad.
PHASE_TOLERANCE = 3 * STEP_FRACTION * np.pi / 2


def _scene(seed, K, T, sigma, *, nan_fraction=0.0, shared_h2ph=False, span_years=5.0):
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, span_years, T))
    t -= t[0]
    h2ph = rng.normal(0, 1.5e-4, (T,) if shared_h2ph else (K, T))
    height = rng.uniform(-40, 40, K)
    velocity = rng.uniform(-0.04, 0.04, K)
    model = M2PH * (velocity[:, None] * t + np.broadcast_to(h2ph, (K, T)) * height[:, None])
    phase = wrap_phase(model + rng.normal(0, sigma, (K, T)))
    phase[rng.uniform(size=(K, T)) < nan_fraction] = np.nan
    return phase, h2ph, t


def _steps(h2ph, t, extra_steps=()):
    """The grid steps periodogram takes by default (height, velocity, extras)."""
    from depsi.kernels.periodogram import default_step, grid_nodes

    span = np.nanmax(np.nanmax(h2ph, axis=-1) - np.nanmin(h2ph, axis=-1))
    nodes = [grid_nodes(-50, 50, default_step(span, WAVELENGTH)),
             grid_nodes(-0.05, 0.05, default_step(np.ptp(t), WAVELENGTH))]
    return [np.ptp(n) / max(n.size - 1, 1) for n in nodes] + list(extra_steps)


def _standard_deviations(phase, h2ph, t, coherence):
    """Each item's height and velocity standard deviations: the least-squares covariance of
    (height, velocity, constant phase) on its valid epochs, with the phase variance
    ``-2 ln(coherence)``; NaN where it has none."""
    h2ph = np.broadcast_to(h2ph, phase.shape)
    stds = np.full((phase.shape[0], 2), np.nan)
    for item in range(phase.shape[0]):
        valid = np.isfinite(phase[item]) & np.isfinite(h2ph[item])
        design = np.column_stack([M2PH * h2ph[item, valid], M2PH * t[valid],
                                  np.ones(valid.sum())])
        if valid.sum() > 3 and np.isfinite(coherence[item]) and coherence[item] > 0:
            normal = design.T @ design
            if np.linalg.cond(normal) < 1e12:
                variance = -2 * np.log(coherence[item]) * np.diag(np.linalg.inv(normal))[:2]
                stds[item] = np.sqrt(variance)
    return stds


def _assert_agree(reference, fused, steps, names=(), same_grid_stage=False, stds=None):
    """Flags and epochs identical; grid coherence, estimates, coherence and phases within the
    tolerances; ambiguities identical but for ties. Items flagged TOO_FEW_OBSERVATIONS or
    RANK_DEFICIENT have no estimate: their coherence and ambiguities come from a fit with more
    unknowns than the data hold (any of its maxima is one), so only their flags are compared.
    ``same_grid_stage``: the reference's own coarse stage ran, the grid coherence is the same to
    the bit. ``stds``: each item's height and velocity standard deviations
    (:func:`_standard_deviations`); the two estimates may then also differ by STD_FRACTION of
    them, where their coherences agree."""
    np.testing.assert_array_equal(fused.flag, reference.flag)
    np.testing.assert_array_equal(fused.n_valid, reference.n_valid)
    if same_grid_stage:
        np.testing.assert_array_equal(fused.grid_coherence, reference.grid_coherence)
    np.testing.assert_allclose(fused.grid_coherence, reference.grid_coherence, rtol=0,
                               atol=GRID_PRECISION)
    estimates = [("height_error", reference.height_error, fused.height_error),
                 ("velocity", reference.velocity, fused.velocity)]
    estimates += [(name, reference.extra[name], fused.extra[name]) for name in names]
    for column, ((name, ref, got), step) in enumerate(zip(estimates, steps)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=name)
        tolerance = np.full(np.shape(ref), STEP_FRACTION * step)
        if stds is not None and column < 2:
            tolerance = np.fmax(tolerance, STD_FRACTION * stds[:, column])
        apart = np.abs(got - ref) > tolerance
        np.testing.assert_array_equal(apart, False, err_msg=(
            f"{name}: items {np.flatnonzero(apart)} apart by {np.abs(got - ref)[apart]}, "
            f"tolerance {tolerance[apart]}"))
    estimated = np.isin(reference.flag, [Flag.OK, Flag.GRID_ONLY])
    np.testing.assert_allclose(fused.coherence[estimated], reference.coherence[estimated],
                               rtol=0, atol=COHERENCE_TOLERANCE)
    offset = wrap_phase(fused.offset[estimated] - reference.offset[estimated])
    assert np.abs(offset).max(initial=0.0) < PHASE_TOLERANCE
    # ambiguities: the same, except where the residual lies within the tolerance of +-pi (a
    # tie: either side of the wrap is the same phase)
    missing = reference.ambiguity == MISSING_AMBIGUITY
    np.testing.assert_array_equal(fused.ambiguity == MISSING_AMBIGUITY, missing)
    ref_residual, residual = reference.residual_phase[estimated], fused.residual_phase[estimated]
    tie = np.abs(np.abs(ref_residual) - np.pi) < PHASE_TOLERANCE
    np.testing.assert_array_equal(fused.ambiguity[estimated][~tie],
                                  reference.ambiguity[estimated][~tie])
    difference = np.abs(wrap_phase(residual - ref_residual))
    assert np.nanmax(difference, initial=0.0) < PHASE_TOLERANCE


def _both(phase, h2ph, t, **kwargs):
    return (periodogram(phase, h2ph, t, wavelength=WAVELENGTH, fused=False, **kwargs),
            periodogram(phase, h2ph, t, wavelength=WAVELENGTH, fused=True, **kwargs))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), K=st.integers(1, 40), T=st.integers(3, 45),
       sigma=st.sampled_from([0.0, 0.3, 0.8, 2.0]), nan_fraction=st.sampled_from([0.0, 0.2]),
       shared_h2ph=st.booleans(), refine=st.booleans())
def test_fused_kernel_agrees_with_the_reference(seed, K, T, sigma, nan_fraction, shared_h2ph,
                                                refine):
    phase, h2ph, t = _scene(seed, K, T, sigma, nan_fraction=nan_fraction,
                            shared_h2ph=shared_h2ph)
    reference, fused = _both(phase, h2ph, t, refine=refine)
    stds = _standard_deviations(phase, h2ph, t, reference.coherence)
    _assert_agree(reference, fused, _steps(h2ph, t), stds=stds)


def test_the_tolerance_of_a_flat_peak_is_a_small_share_of_its_precision():
    """A scene with a ridge 6 m wide, where the two refinements stopped 0.074 m apart on one
    CPU (0.0066 of a grid step, over the step tolerance) and 1e-5 m apart on another: where
    they stop on a flat peak depends on the CPU's rounding. They agree within STD_FRACTION of
    the height's standard deviation, and that tolerance accepts an estimate moved along the
    ridge by less than that share (with the coherence the same) and refuses one moved by
    more."""
    phase, h2ph, t = _scene(240824, 29, 26, 0.8, shared_h2ph=True)
    reference, fused = _both(phase, h2ph, t, refine=True)
    stds = _standard_deviations(phase, h2ph, t, reference.coherence)
    steps = _steps(h2ph, t)
    _assert_agree(reference, fused, steps, stds=stds)
    apart = np.abs(fused.height_error - reference.height_error) / stds[:, 0]
    assert apart.max() < STD_FRACTION
    ridge = np.nanargmax(stds[:, 0])
    assert stds[ridge, 0] * STD_FRACTION > STEP_FRACTION * steps[0]  # wider than a step's share
    for share, accepted in ((0.9, True), (1.2, False)):
        height = reference.height_error.copy()
        height[ridge] += share * STD_FRACTION * stds[ridge, 0]
        moved = dataclasses.replace(reference, height_error=height)
        if accepted:
            _assert_agree(reference, moved, steps, stds=stds)
            with pytest.raises(AssertionError, match="height_error: items"):
                _assert_agree(reference, moved, steps)  # over the step tolerance alone
        else:
            with pytest.raises(AssertionError, match="height_error: items"):
                _assert_agree(reference, moved, steps, stds=stds)


def test_fused_kernel_agrees_on_many_noisy_arcs():
    phase, h2ph, t = _scene(3, 3000, 60, 0.5)
    reference, fused = _both(phase, h2ph, t)
    _assert_agree(reference, fused, _steps(h2ph, t))
    assert (fused.flag == Flag.OK).mean() > 0.99


def test_fused_kernel_agrees_with_nan_epochs_and_empty_items():
    phase, h2ph, t = _scene(4, 50, 30, 0.3)
    phase[0] = np.nan  # nothing valid
    phase[1, 2:] = np.nan  # fewer epochs than unknowns + 1 (height, velocity, constant)
    h2ph[2, ::2] = np.nan  # a missing baseline marks the epoch missing
    reference, fused = _both(phase, h2ph, t)
    _assert_agree(reference, fused, _steps(h2ph, t))
    assert fused.flag[0] == fused.flag[1] == Flag.TOO_FEW_OBSERVATIONS
    assert np.isnan(fused.coherence[0]) and fused.n_valid[2] == 15


def test_fused_kernel_flags_rank_deficient_items_as_the_reference():
    phase, h2ph, t = _scene(5, 20, 25, 0.3)
    h2ph[:5] = 2e-4  # constant baselines: height and the constant phase are one
    reference, fused = _both(phase, h2ph, t)
    _assert_agree(reference, fused, _steps(h2ph[5:], t))
    assert (fused.flag[:5] == Flag.RANK_DEFICIENT).all()
    assert np.isnan(fused.height_error[:5]).all()


def test_fused_kernel_with_shared_h2ph_containing_nan():
    phase, h2ph, t = _scene(6, 30, 25, 0.3, shared_h2ph=True)
    h2ph[4] = np.nan
    reference, fused = _both(phase, h2ph, t)
    _assert_agree(reference, fused, _steps(h2ph, t))


def test_fused_kernel_agrees_with_extra_regressors():
    phase, h2ph, t = _scene(7, 200, 50, 0.3)
    seasonal = 0.004 * np.sin(2 * np.pi * t)  # 4 mm of seasonal motion added to every arc
    phase = wrap_phase(phase + M2PH * seasonal)
    extra = {"seasonal": (np.sin(2 * np.pi * t), (-0.01, 0.01), 0.002)}
    reference, fused = _both(phase, h2ph, t, extra_regressors=extra)
    _assert_agree(reference, fused, _steps(h2ph, t, [0.002]), names=["seasonal"])
    assert np.median(np.abs(fused.extra["seasonal"] - 0.004)) < 0.001


@pytest.mark.parametrize("velocity_range, mirrored", [((-0.05, 0.05), False),
                                                       ((-0.03, 0.05), True)])
def test_without_the_mirrored_grid_the_grid_stage_is_the_reference_s(monkeypatch,
                                                                      velocity_range, mirrored):
    """An asymmetric grid, or MIRRORED_GRID off, takes the reference's complex GEMM: the same
    grid node and grid coherence, to the bit."""
    monkeypatch.setattr(numba_kernel, "MIRRORED_GRID", mirrored)
    phase, h2ph, t = _scene(11, 400, 40, 0.5)
    reference, fused = _both(phase, h2ph, t, velocity_range=velocity_range)
    _assert_agree(reference, fused, _steps(h2ph, t), same_grid_stage=True)


def test_velocity_only_search_is_the_same_either_way():
    phase, _, t = _scene(8, 30, 25, 0.3)
    reference, fused = _both(phase, None, t)
    for name in ("velocity", "coherence", "ambiguity", "flag"):
        np.testing.assert_array_equal(getattr(fused, name), getattr(reference, name))


def test_fused_kernel_batches_like_one_batch():
    phase, h2ph, t = _scene(9, 300, 40, 0.5)
    # BLAS on one thread, as the chain runs it (as test_kernels_periodogram's batch test): the
    # GEMM of the grid stage rounds by the batch's shape in the last bit, by how much depends on
    # the CPU's OpenBLAS kernel (on an AMD EPYC one item of 300 started its refinement one
    # rounding away and stopped 3.6e-7 of its velocity away); past it every item is computed
    # alone. So: nearly every item to 1e-12, every one within the refinement's own tolerance.
    with single_threaded_blas():
        whole = periodogram(phase, h2ph, t, wavelength=WAVELENGTH, fused=True)
        batched = periodogram(phase, h2ph, t, wavelength=WAVELENGTH, fused=True, max_batch=7)
    _assert_agree(whole, batched, _steps(h2ph, t))
    same = np.ones(phase.shape[0], bool)
    for name in ("height_error", "velocity", "coherence"):
        same &= np.isclose(getattr(batched, name), getattr(whole, name), rtol=1e-12, atol=0)
    assert same.mean() >= 0.98, f"{(~same).sum()} of {same.size} items differ beyond 1e-12"
    np.testing.assert_array_equal(batched.flag, whole.flag)


def test_the_module_switch_chooses_the_reference(monkeypatch):
    import importlib

    module = importlib.import_module("depsi.kernels.periodogram")
    phase, h2ph, t = _scene(10, 20, 30, 0.5)
    reference = periodogram(phase, h2ph, t, wavelength=WAVELENGTH, fused=False)
    monkeypatch.setattr(module, "USE_FUSED", False)
    switched = periodogram(phase, h2ph, t, wavelength=WAVELENGTH)
    np.testing.assert_array_equal(switched.height_error, reference.height_error)


def test_cache_dir_is_none_where_nothing_can_be_written(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocker / "cache"))
    assert numba_support.cache_dir() is None
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))
    assert numba_support.cache_dir() == tmp_path / "cache"


@pytest.mark.slow
def test_unwritable_cache_compiles_without_writing_next_to_the_package(tmp_path):
    """A read-only install: the cache directories cannot be written, the fused kernels (this
    one, ldl_numba's and normal_rhs_numba's) still run and nothing lands beside the
    package's sources."""
    package = os.path.dirname(numba_kernel.__file__)
    before = set(_cache_files(package))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(blocker / "numba"),
               XDG_CACHE_HOME=str(blocker / "xdg"), HOME=str(blocker))
    script = textwrap.dedent("""
        import numpy as np
        import qdldl
        import scipy.sparse as sp
        from depsi.kernels import ldl_numba, normal_rhs_numba, numba_support
        from depsi.kernels.periodogram import periodogram
        assert numba_support.cache_dir() is None
        matrix = sp.csc_matrix(np.array([[4.0, 1.0], [1.0, 3.0]]))
        factors = ldl_numba.LDLFactors(qdldl.Solver(sp.triu(matrix, format="csc")))
        assert np.allclose(matrix @ factors.solve(np.eye(2)), np.eye(2))
        rhs = normal_rhs_numba.normal_rhs(np.array([0]), np.array([1]), np.array([2.0]),
                                          np.array([0]), np.ones((1, 1), np.float32), 2)
        assert rhs.ravel().tolist() == [-2.0, 2.0]
        t = np.linspace(0, 3, 20)
        h2ph = 3e-4 * np.sin(7.0 * np.arange(20))[None].repeat(3, 0)
        phase = np.angle(np.exp(1j * (-4 * np.pi / 0.0555) * (0.01 * t + h2ph * 12.0)))
        res = periodogram(phase, h2ph, t, wavelength=0.0555, fused=True)
        assert np.allclose(res.height_error, 12.0, atol=1e-6), res.height_error
    """)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=600)
    assert set(_cache_files(package)) == before


def _cache_files(folder):
    for root, _, files in os.walk(folder):
        yield from (os.path.join(root, f) for f in files if f.endswith((".nbi", ".nbc")))



@pytest.mark.slow
def test_small_dask_workers_run_the_reference_without_loading_numba():
    """Numba holds about 100 MB in a process: a worker under MIN_WORKER_MEMORY (450 MB here, as
    tests/test_faults.py's) would pass distributed's pause threshold and stall the run, so it
    runs the references (the periodogram's, the network solve's for a w-test tile and the NAD
    screen's sums) and never imports Numba; a roomy worker runs the fused kernels."""
    from distributed import Client, LocalCluster

    def probe():  # defined here, so it travels by value (the module would import Numba)
        import sys

        import numpy

        from depsi.kernels.periodogram import _fused_wanted, periodogram
        from depsi.stm.runtime import fused_kernels

        rng = numpy.random.default_rng(0)
        periodogram(rng.uniform(-3, 3, (8, 12)), rng.normal(0, 1e-4, (8, 12)),
                    numpy.arange(12) / 12, wavelength=0.0555, fused=fused_kernels())
        # a w-test tile's solve on a worker: several right-hand sides (the compiled A^T W y
        # and LDL sweeps where roomy)
        from depsi.processing.network_solver import _NetworkSolve

        grid = numpy.arange(100).reshape(10, 10)
        pairs = numpy.vstack([numpy.c_[grid[:, :-1].ravel(), grid[:, 1:].ravel()],
                              numpy.c_[grid[:-1].ravel(), grid[1:].ravel()]])
        solved = _NetworkSolve(pairs[:, 0], pairs[:, 1], numpy.ones(len(pairs)),
                               rng.normal(size=(len(pairs), 4)).astype(numpy.float32),
                               numpy.arange(len(pairs)), 100, numpy.ones(100, bool), 0)
        assert numpy.isfinite(solved.values()).all()
        # and a block's NAD selection (the screen's compiled sums where roomy)
        from depsi.processing.selection import _block_points

        slc = (rng.normal(size=(6, 7, 12)) + 1j).astype(numpy.complex64)
        counts = _block_points(slc, method="nad", threshold=0.5, offset=(0, 0))[1]
        assert counts["n_candidates"] == 42
        return _fused_wanted(numpy, fused_kernels()), "numba" in sys.modules

    for limit, expected in (("450MB", (False, False)), ("2GB", (True, True))):
        with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=limit,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            assert client.submit(probe, pure=False).result() == expected, limit
