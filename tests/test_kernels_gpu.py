"""CuPy against NumPy: the same kernels on the GPU agree to float32 round-off (relative RMS
< 1e-5). Skipped where CuPy cannot be imported or no CUDA device works."""

from __future__ import annotations

import numpy as np
import pytest

from depsi.conventions import wrap_phase
from depsi.kernels.backend import cupy_available, to_host
from depsi.kernels.lstsq import lstsq_batched
from depsi.kernels.network_inversion import invert_network
from depsi.kernels.periodogram import periodogram

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cupy_available(), reason="CuPy or a working CUDA device is missing"),
]

WAVELENGTH = 0.0555
M2PH = -4 * np.pi / WAVELENGTH
RELATIVE_RMS = 1e-5


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def _relative_rms(gpu, cpu):
    gpu, cpu = to_host(gpu).astype(np.float64), np.asarray(cpu, dtype=np.float64)
    both = np.isfinite(cpu) & np.isfinite(gpu)
    assert (np.isfinite(cpu) == np.isfinite(gpu)).all(), "NaN pattern differs"
    scale = np.sqrt(np.mean(cpu[both] ** 2)) or 1.0
    return float(np.sqrt(np.mean((gpu[both] - cpu[both]) ** 2)) / scale)


@pytest.mark.parametrize("shared", [True, False], ids=["shared_A", "per_problem_A"])
def test_lstsq_cupy_matches_numpy(cp, shared):
    rng = np.random.default_rng(40)
    K, D, P = 5000, 60, 3
    A = rng.standard_normal((D, P) if shared else (K, D, P)).astype(np.float32)
    y = rng.standard_normal((K, D)).astype(np.float32)
    y[rng.random((K, D)) < 0.05] = np.nan
    w = rng.uniform(0.5, 2, (K, D)).astype(np.float32)
    A[..., 5, 1] = np.nan  # a non-finite design row: dropped as an observation
    cpu = lstsq_batched(A, y, w)
    gpu = lstsq_batched(cp.asarray(A), cp.asarray(y), cp.asarray(w))
    assert isinstance(gpu.x, cp.ndarray)
    for name in ("x", "covariance", "std", "residuals", "sigma2"):
        assert _relative_rms(getattr(gpu, name), getattr(cpu, name)) < RELATIVE_RMS, name
    np.testing.assert_array_equal(to_host(gpu.flag), cpu.flag)


def test_periodogram_cupy_matches_numpy(cp):
    rng = np.random.default_rng(41)
    K, T = 3000, 60
    t = np.sort(rng.uniform(0, 5, T))
    t -= t[0]
    h2ph = rng.normal(0, 1.5e-4, (K, T)).astype(np.float32)
    height, velocity = rng.uniform(-40, 40, K), rng.uniform(-0.04, 0.04, K)
    phase = wrap_phase(M2PH * (velocity[:, None] * t + h2ph * height[:, None])
                       + rng.normal(0, 0.4, (K, T))).astype(np.float32)
    phase[:, 7] = np.nan
    kwargs = dict(wavelength=WAVELENGTH, height_step=100 / 49, velocity_step=0.1 / 49)
    cpu = periodogram(phase, h2ph, t, **kwargs)
    gpu = periodogram(cp.asarray(phase), cp.asarray(h2ph), t, **kwargs)
    for name in ("height_error", "velocity", "coherence", "residual_phase"):
        assert _relative_rms(getattr(gpu, name), getattr(cpu, name)) < RELATIVE_RMS, name
    # grid nodes closer than complex64 round-off may swap; the refined peaks still agree
    assert (to_host(gpu.ambiguity) == cpu.ambiguity).all(axis=1).mean() > 0.999


def test_invert_network_cupy_matches_numpy(cp):
    rng = np.random.default_rng(42)
    K, T = 2000, 30
    pairs = np.array([(a, b) for a in range(T) for b in range(a + 1, min(a + 4, T))])
    series = np.cumsum(rng.normal(0, 1, (K, T)), axis=1)
    ifg = series[:, pairs[:, 1]] - series[:, pairs[:, 0]] + rng.normal(0, 0.1, (K, len(pairs)))
    ifg[rng.random(ifg.shape) < 0.03] = np.nan
    cpu = invert_network(ifg, pairs, T)
    gpu = invert_network(cp.asarray(ifg), pairs, T)
    for name in ("series", "residuals", "sigma2"):
        assert _relative_rms(getattr(gpu, name), getattr(cpu, name)) < RELATIVE_RMS, name
    np.testing.assert_array_equal(to_host(gpu.flag), cpu.flag)
    np.testing.assert_array_equal(to_host(gpu.component), cpu.component)


def test_estimate_model_on_cupy_matches_numpy():
    import xarray as xr

    from depsi.processing.model_fit import estimate_model

    rng = np.random.default_rng(43)
    time = np.datetime64("2020-01-01", "ns") + np.arange(30) * np.timedelta64(12, "D")
    d = rng.normal(0, 0.001, (400, 30)).astype("f4") + np.linspace(0, 0.01, 30, dtype="f4")
    stm = xr.Dataset({"displacement": (("space", "time"), d)}, coords={"time": time})
    stm = stm.chunk({"space": 100})
    cpu = estimate_model(stm, devices=["cpu"]).compute()
    gpu = estimate_model(stm, devices=["cuda:0"]).compute()
    for name in ("offset", "velocity", "sigma2", "residual"):
        assert _relative_rms(gpu[name].values, cpu[name].values) < RELATIVE_RMS, name
