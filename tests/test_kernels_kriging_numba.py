"""The kriging systems' compiled passes: the distances and covariances NumPy's to the bit; the
factors, whitened products and sums NumPy's Cholesky, SciPy's triangular solves and NumPy's
products to round-off, on random systems and on the correlated height's own batches; and where
a cell's Cholesky fails the whole batch is still solved by LU."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import solve_triangular

from depsi.kernels import kriging_numba
from depsi.processing import correlated_height as module


def test_the_compiled_kriging_is_available():
    """Numba is a dependency and its entry to LAPACK's dpotrf is found: were a Numba release
    to drop that private entry, the kriging would fall back to NumPy, and this says so."""
    assert kriging_numba.AVAILABLE

SIGNAL = {"sill": 1.0, "range": 300.0, "shape": 1.5, "offset": 0.1}
NOISE = {"nugget": 1.0, "extra_sill": 0.3, "extra_range": 200.0}

#: Relative tolerance of the compiled sums against SciPy's, of the largest |prediction| or
#: explained variance of the batch. A forward substitution's error is at most about
#: ``k eps cond(L)`` of the whitened values (Higham, Accuracy and Stability, thm. 8.5); the
#: kriging matrices (a nugget on the diagonal, k <= 128) keep ``cond(L)`` to tens, so the two
#: orders of the same operations differ by at most ~1e-12, and by 6e-15 measured (k = 60 and
#: 128); far below the float32 covariances' 1e-7.
RTOL = 1e-12


def _reference(lower, values, c_nt):
    rhs = np.concatenate([values[..., None], c_nt], axis=2)
    whitened = np.stack([solve_triangular(lower[b], rhs[b], lower=True, check_finite=False)
                         for b in range(len(lower))])
    return (np.einsum("bk,bkw->bw", whitened[..., 0], whitened[..., 1:]),
            np.einsum("bkw,bkw->bw", whitened[..., 1:], whitened[..., 1:]))


def _assert_close(got, expected):
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=0, atol=RTOL * float(np.abs(e).max()))


def _batch(rng, n_cells, k, width, nugget=1.0):
    """A batch's inputs as the kriging cuts them: float32 positions about each cell's
    centre, float64 values."""
    nb = rng.uniform(-400, 400, (n_cells, k, 2)).astype(np.float32)
    tp = rng.uniform(-40, 40, (n_cells, width, 2)).astype(np.float32)
    return nb, rng.standard_normal((n_cells, k)), tp, NOISE | {"nugget": nugget}


def _numpy_distances(a, b):
    dx = a[:, :, None, 0] - b[:, None, :, 0]
    dy = a[:, :, None, 1] - b[:, None, :, 1]
    return np.sqrt(dx * dx + dy * dy)


@pytest.mark.parametrize("shape", [(3, 1, 1), (4, 17, 5), (2, 128, 61)])
def test_the_compiled_distances_are_numpy_s_to_the_bit(monkeypatch, shape):
    rng = np.random.default_rng(shape[1])
    n_cells, m, n = shape
    a = rng.uniform(-500, 500, (n_cells, m, 2)).astype(np.float32)
    b = rng.uniform(-50, 50, (n_cells, n, 2)).astype(np.float32)
    for first, second in ((a, b), (a, a), (b, a)):
        expected = _numpy_distances(first, second)
        got = kriging_numba.distances(first, second)
        assert got.dtype == np.float32 and expected.dtype == np.float32
        np.testing.assert_array_equal(got, expected)
        # as the kriging's systems take them, compiled or not
        monkeypatch.setattr(module, "_compiled_kriging", lambda: True)
        np.testing.assert_array_equal(module._distances(first, second), expected)
        monkeypatch.setattr(module, "_compiled_kriging", lambda: False)
        np.testing.assert_array_equal(module._distances(first, second), expected)


@pytest.mark.parametrize("extra_sill", [0.0, 0.3])
@pytest.mark.parametrize("shape", [1.0, 1.5])
def test_the_compiled_systems_are_numpy_s_to_the_bit(monkeypatch, shape, extra_sill):
    """The distances and the covariances' float64 step compiled, the exponentials NumPy's."""
    rng = np.random.default_rng(int(10 * shape))
    nb, _, tp, noise = _batch(rng, 5, 37, 11)
    signal = {"sill": 0.83, "range": 270.0, "shape": shape, "offset": 0.137}
    noise = noise | {"extra_sill": extra_sill}
    monkeypatch.setattr(module, "_compiled_kriging", lambda: True)
    got = module._kriging_systems(nb, tp, signal=signal, noise=noise)
    monkeypatch.setattr(module, "_compiled_kriging", lambda: False)
    expected = module._kriging_systems(nb, tp, signal=signal, noise=noise)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)
    correlation = rng.uniform(0, 1, (3, 40, 50)).astype(np.float32)
    np.testing.assert_array_equal(
        kriging_numba.scaled_covariance(correlation, 0.83, 0.137),
        correlation.astype(np.float64) * 0.83 - 0.137)


@pytest.mark.parametrize("k, width", [(1, 1), (2, 3), (5, 1), (7, 9), (60, 33), (128, 59)])
def test_the_compiled_sums_are_scipy_s_solves_to_round_off(k, width):
    """Blocks of four rows and the rows left over (k not a multiple of four)."""
    rng = np.random.default_rng(k * 100 + width)
    nb, values, tp, noise = _batch(rng, 6, k, width)
    cov, c_nt = module._kriging_systems(nb, tp, signal=SIGNAL, noise=noise)
    lower = np.linalg.cholesky(cov)
    got = kriging_numba.whitened_sums(lower, values, c_nt)
    _assert_close(got, _reference(lower, values, c_nt))
    # the upper triangle is not read; float32 values are taken as float64
    lower[:, np.triu_indices(k, 1)[0], np.triu_indices(k, 1)[1]] = np.nan
    again = kriging_numba.whitened_sums(lower, values.astype(np.float32), c_nt)
    _assert_close(again, _reference(np.tril(np.nan_to_num(lower)),
                                    values.astype(np.float32).astype(np.float64), c_nt))


@pytest.mark.parametrize("k, width", [(3, 2), (61, 17), (128, 48)])
def test_the_compiled_factor_and_sums_are_the_reference_s_to_round_off(k, width):
    """LAPACK's factor a cell and the substitution against NumPy's batched Cholesky and
    SciPy's solves; the matrices left as they were; None where one cell's is indefinite."""
    rng = np.random.default_rng(k + width)
    nb, values, tp, noise = _batch(rng, 7, k, width)
    cov, c_nt = module._kriging_systems(nb, tp, signal=SIGNAL, noise=noise | {"extra_sill": 0})
    assert cov.dtype == np.float64
    copy = cov.copy()
    got = kriging_numba.factored_sums(cov, values, c_nt)
    np.testing.assert_array_equal(cov, copy)
    _assert_close(got, _reference(np.linalg.cholesky(cov), values, c_nt))
    cov[4] -= 3.0 * np.eye(k)  # one cell not positive definite
    assert kriging_numba.factored_sums(cov, values, c_nt) is None
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(cov)


@pytest.fixture
def calls(monkeypatch):
    """The compiled passes made to run (compiled in this process where the cache lacks them),
    and the calls of them and of the LU solve counted."""
    seen = {"factored": 0, "whitened": 0, "lu": 0}
    factored, whitened = kriging_numba.factored_sums, kriging_numba.whitened_sums
    lu = module._lu_solved

    def counted(name, function):
        def call(*args):
            seen[name] += 1
            return function(*args)
        return call

    monkeypatch.setattr(kriging_numba, "factored_sums", counted("factored", factored))
    monkeypatch.setattr(kriging_numba, "whitened_sums", counted("whitened", whitened))
    monkeypatch.setattr(module, "_lu_solved", counted("lu", lu))
    monkeypatch.setattr(module, "_compiled_kriging", lambda: True)
    return seen


@pytest.mark.parametrize("extra_sill", [0.0, 0.3])
@pytest.mark.parametrize("nugget, indefinite", [(1.0, None), (0.05, None), (-2.0, None),
                                                (1.0, 13)])
def test_the_kriging_batch_agrees_with_the_reference_and_falls_back_to_lu(
        calls, monkeypatch, extra_sill, nugget, indefinite):
    """A negative nugget makes every cell's matrix indefinite, ``indefinite`` one cell's: the
    Cholesky fails (the compiled factor returns None, NumPy's raises) and the whole batch is
    solved by LU, the reference's result to the bit. The extra term's float32 matrices keep
    NumPy's factor, the substitution compiled."""
    rng = np.random.default_rng(11)
    nb, values, tp, noise = _batch(rng, 20, 64, 40, nugget=nugget)
    noise = noise | {"extra_sill": extra_sill}
    valid = rng.uniform(size=(20, 40)) < 0.9
    options = {"signal": SIGNAL, "noise": noise, "prior": 0.9}
    if indefinite is not None:
        systems = module._kriging_systems

        def one_indefinite(*args, **kwargs):
            cov, c_nt = systems(*args, **kwargs)
            cov[indefinite] -= 3.0 * np.eye(cov.shape[1], dtype=cov.dtype)
            return cov, c_nt

        monkeypatch.setattr(module, "_kriging_systems", one_indefinite)
    got = module._krige_batch(nb, values, tp, valid, **options)
    monkeypatch.setattr(module, "_compiled_kriging", lambda: False)
    expected = module._krige_batch(nb, values, tp, valid, **options)
    falls_back = nugget < 0 or indefinite is not None
    float64 = extra_sill == 0
    assert calls == {"factored": int(float64), "whitened": int(not float64 and not falls_back),
                     "lu": 2 * int(falls_back)}
    if falls_back:
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)
    else:
        _assert_close(got, expected)
    assert np.isfinite(got[0]).all() and np.abs(got[0]).max() > 0.1
