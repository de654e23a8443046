"""The compiled per-point passes of :mod:`depsi.kernels.gather_numba` against their NumPy
references: the Gaussian screen within its derived bound, the moved series and the
displacement standard deviations to the bit."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial import cKDTree

from depsi.kernels import gather_numba
from depsi.processing import atmosphere, correlated_height, model_fit


@pytest.fixture
def numpy_path(monkeypatch):
    """Call it to run the callers' NumPy references (as where Numba cannot be loaded); its
    ``undo`` runs the compiled kernels again."""
    def use_numpy():
        monkeypatch.setattr(gather_numba, "ready", lambda: False)
    use_numpy.undo = monkeypatch.undo
    return use_numpy


def _both(function, numpy_path, *args, **kwargs):
    """``function``'s result compiled, then through its NumPy reference."""
    assert gather_numba.ready()  # the tests compile Numba's kernels (tests/conftest.py)
    compiled = function(*args, **kwargs)
    numpy_path()
    return compiled, function(*args, **kwargs)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 5, 16])
def test_gaussian_mean_compiled_within_the_bound_of_numpys(dtype, k, numpy_path):
    """Neighbours from a k-d tree, values of mixed signs and scales (a screen of tens of
    radians with outliers): the compiled mean is NumPy's to within
    ``gaussian_error(k, u) * sum_j w_j |v_j|`` (u the values' unit roundoff), which NumPy's
    float32 GEMV alone reaches to a fair fraction, and the kernel's float64 sum is closer to
    the exact mean (float64 of the same weights) than NumPy's is."""
    rng = np.random.default_rng(k)
    sources = rng.uniform(0, 5000, (3000, 2))
    targets = rng.uniform(0, 5000, (2000, 2))
    values = (rng.normal(0, 20, (3000, 37)) * rng.choice([1, 1e-3, 50], (3000, 1))
              ).astype(dtype)
    dist, idx = cKDTree(sources).query(targets, k=k)
    dist, idx = dist.reshape(-1, k), idx.reshape(-1, k)
    compiled, reference = _both(atmosphere.gaussian_mean, numpy_path, dist, idx, values, 400.0)
    assert compiled.dtype == reference.dtype == dtype
    w = np.exp(-0.5 * (dist / 400.0) ** 2) + 1e-12
    w /= w.sum(axis=1, keepdims=True)
    scale = np.einsum("nk,nkt->nt", w, np.abs(values[idx].astype(np.float64)))
    exact = np.einsum("nk,nkt->nt", w, values[idx].astype(np.float64))
    u = np.finfo(dtype).eps / 2
    bound = gather_numba.gaussian_error(k, u) * scale
    diff = np.abs(compiled.astype(np.float64) - reference)
    assert (diff <= bound).all(), float(np.max(diff / bound))
    # one rounding into the values' precision after float64 sums
    near = u * np.abs(exact) + (2 * k + 9) * 2.0 ** -53 * scale
    assert (np.abs(compiled - exact) <= near).all()
    if k > 1 and dtype == np.float32:
        assert np.any(diff > 0)  # the two paths differ: the comparison is not vacuous


def test_gaussian_screen_of_the_interpolator_compiled_and_numpy(numpy_path):
    """The atmosphere's Gaussian screen (blocks on threads, k-d tree neighbours) compiled and
    through NumPy, within the bound for its 16 neighbours and float32 values."""
    rng = np.random.default_rng(3)
    src = rng.uniform(0, 3000, (500, 2))
    values = rng.normal(0, 2, (500, 12))
    screen = atmosphere.ScreenInterpolator(src, values, {"range": 600.0}, "gaussian")
    dst = rng.uniform(0, 3000, (20000, 2))
    compiled, reference = _both(screen, numpy_path, dst)
    bound = (gather_numba.gaussian_error(atmosphere.GAUSSIAN_NEIGHBOURS, 2.0 ** -24)
             * np.abs(values).max())
    assert np.max(np.abs(compiled.astype(np.float64) - reference)) <= bound


@pytest.mark.parametrize("h2ph_shape", ["point", "epoch"])
@pytest.mark.parametrize("h2ph_dtype", [np.float32, np.float64])
def test_moved_block_compiled_is_numpys_to_the_bit(h2ph_shape, h2ph_dtype, numpy_path):
    """The field's phase moved into a float32 series, h2ph per point or per epoch, in float32
    or float64: the same float32 numbers (NaN where the series has one)."""
    rng = np.random.default_rng(5)
    n, n_epochs = 4000, 41
    series = rng.normal(0, 30, (n, n_epochs)).astype(np.float32)
    series[7, 3] = np.nan
    shape = (n,) if h2ph_shape == "point" else (n, n_epochs)
    h2ph = rng.normal(0, 3e-4, shape).astype(h2ph_dtype)
    field = rng.normal(0, 5, n)
    compiled, reference = _both(correlated_height._moved_block, numpy_path, series, h2ph,
                                field, -226.4)
    assert compiled.dtype == reference.dtype == np.float32
    np.testing.assert_array_equal(compiled.view(np.int32), reference.view(np.int32))
    numpy_path.undo()
    in_place = series.copy()  # as correlated_height moves a series it owns
    assert correlated_height._moved_block(in_place, h2ph, field, -226.4, out=in_place
                                          ) is in_place
    np.testing.assert_array_equal(in_place.view(np.int32), reference.view(np.int32))
    strided = np.zeros((n_epochs, n), np.float32).T  # an out the kernel cannot write
    correlated_height._moved_block(series, h2ph, field, -226.4, out=strided)
    np.testing.assert_array_equal(strided.view(np.int32), reference.view(np.int32))


@pytest.mark.parametrize("h2ph_shape", ["point", "epoch"])
def test_displacement_std_compiled_is_numpys_to_the_bit(h2ph_shape, numpy_path):
    """Each point's displacement std per epoch, h2ph per point or per epoch (float32, as the
    stores hold it): the same float32 numbers, zero at the first epoch."""
    rng = np.random.default_rng(9)
    n, n_epochs = 3000, 33
    shape = (n,) if h2ph_shape == "point" else (n, n_epochs)
    h2ph = rng.normal(0, 3e-4, shape).astype(np.float32)
    corrected_var = rng.uniform(0, 1e-5, n)
    height_std = rng.uniform(0, 3, n)
    height_std[11] = np.nan
    share = rng.uniform(0.5, 1.5, n_epochs)
    compiled, reference = _both(model_fit._displacement_std_block, numpy_path, h2ph,
                                corrected_var, height_std, epoch_share=share,
                                n_epochs=n_epochs)
    assert compiled.dtype == reference.dtype == np.float32
    np.testing.assert_array_equal(compiled.view(np.int32), reference.view(np.int32))
    assert not compiled[:, 0].any()
    numpy_path.undo()
    out = np.full((n + 5, n_epochs), np.nan, np.float32)
    model_fit._displacement_std_block(h2ph, corrected_var, height_std, epoch_share=share,
                                      n_epochs=n_epochs, out=out[5:])
    np.testing.assert_array_equal(out[5:].view(np.int32), reference.view(np.int32))
    assert np.isnan(out[:5]).all()


@pytest.mark.parametrize("h2ph_dtype", [np.float32, np.float64])
def test_leak_gain_compiled_within_the_bound_of_numpys(h2ph_dtype, numpy_path):
    """The height-leak gain's square root from baselines of every kind: random, nearly
    proportional to time (the unexplained part a small difference of large sums), constant
    (none), with a NaN, and per point: NaN where NumPy's is, elsewhere within
    ``leak_gain_error(T, conditioning)`` of it, the conditioning ``|h|^2 / u`` from NumPy's
    float64 sums (up to 10^12 here, next to the 1e-12 threshold)."""
    rng = np.random.default_rng(2)
    n, n_epochs = 6000, 47
    years = np.sort(rng.uniform(-3, 2, n_epochs))
    h2ph = rng.normal(0, 3e-4, (n, n_epochs))
    along = rng.normal(0, 3e-4, (n // 3, 1)) * years  # nearly proportional to time
    h2ph[:n // 3] = along + rng.normal(0, 1, (n // 3, 1)) * 10.0 ** rng.uniform(
        -8, -5, (n // 3, 1)) * rng.normal(0, 1, (n // 3, n_epochs))
    h2ph[-3] = 2e-4  # constant baselines
    h2ph[-2, 5] = np.nan
    h2ph = h2ph.astype(h2ph_dtype)
    compiled, reference = _both(correlated_height._gain_block, numpy_path, h2ph,
                                years=years, m2ph=-226.4)
    np.testing.assert_array_equal(np.isnan(compiled), np.isnan(reference))
    assert np.isnan(reference[-3:-1]).all() and np.isfinite(reference[:-3]).mean() > 0.95
    h = h2ph.astype(np.float64) - h2ph.astype(np.float64).mean(axis=1, keepdims=True)
    conditioning = np.einsum("nt,nt->n", h, h) * (226.4 * reference) ** 2  # |h|^2 / u
    finite = np.isfinite(reference)
    assert conditioning[finite].max() > 1e3  # ill-conditioned points are among them
    bound = gather_numba.leak_gain_error(n_epochs, conditioning[finite])
    relative = np.abs(compiled[finite] - reference[finite]) / reference[finite]
    assert (relative <= bound).all(), float(np.max(relative / bound))
    assert relative.max() > 0  # the two paths' sums differ: the comparison is not vacuous
    numpy_path.undo()
    per_point = correlated_height._gain_block(h2ph[:, 0], years=years, m2ph=-226.4)
    assert np.isnan(per_point).all()  # constant baselines: no gain, as NumPy's
