"""Batched weighted least squares against per-problem scipy.linalg.lstsq."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from depsi.kernels.flags import Flag
from depsi.kernels.lstsq import lstsq_batched, solve_normal_equations

EPS = np.finfo(np.float64).eps


def _reference(A, y, w):
    """Per-problem scipy.linalg.lstsq on the valid, sqrt-weighted rows; x, cov, rss, n."""
    K, D = y.shape
    xs, covs, rss, n = [], [], [], []
    for k in range(K):
        Ak = A if A.ndim == 2 else A[k]
        keep = np.isfinite(y[k]) & (w[k] > 0)
        sw = np.sqrt(w[k][keep])
        Aw, yw = Ak[keep] * sw[:, None], y[k][keep] * sw
        x = scipy.linalg.lstsq(Aw, yw)[0]
        xs.append(x)
        covs.append(np.linalg.inv(Aw.T @ Aw))
        rss.append(float(((Aw @ x - yw) ** 2).sum()))
        n.append(int(keep.sum()))
    return np.array(xs), np.array(covs), np.array(rss), np.array(n)


def _problems(rng, K=60, D=40, P=3, shared=True):
    A = rng.standard_normal((D, P) if shared else (K, D, P))
    x = rng.standard_normal((K, P))
    y = (x @ A.T if shared else np.einsum("kdp,kp->kd", A, x)) + 0.1 * rng.standard_normal((K, D))
    w = rng.uniform(0.2, 3.0, (K, D))
    y[rng.random((K, D)) < 0.1] = np.nan
    return A, y, w


def _tolerance(A, w):
    """Relative agreement expected of normal equations: a few cond(A_w)^2 eps."""
    Ak = A if A.ndim == 3 else A[None]
    cond = max(np.linalg.cond(a * np.sqrt(w.max())) for a in Ak)
    return 100 * cond**2 * EPS


@pytest.mark.parametrize("shared", [True, False], ids=["shared_A", "per_problem_A"])
def test_lstsq_matches_scipy_with_weights_and_nan(shared):
    rng = np.random.default_rng(1)
    A, y, w = _problems(rng, shared=shared)
    res = lstsq_batched(A, y, w)
    x_ref, cov_ref, rss_ref, n_ref = _reference(A, y, w)
    rtol = _tolerance(A, w)
    assert rtol < 1e-10
    np.testing.assert_allclose(res.x, x_ref, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(res.covariance, cov_ref, rtol=rtol, atol=rtol)
    np.testing.assert_array_equal(res.n_obs, n_ref)
    np.testing.assert_allclose(res.sigma2, rss_ref / (n_ref - 3), rtol=1e-9)
    np.testing.assert_allclose(res.std, np.sqrt(res.sigma2[:, None]
                                                * np.diagonal(cov_ref, axis1=1, axis2=2)),
                               rtol=1e-9)
    assert (res.flag == Flag.OK).all()


def test_residuals_are_nan_exactly_where_observations_are_missing():
    rng = np.random.default_rng(2)
    A, y, w = _problems(rng)
    w[0, :3] = 0.0
    res = lstsq_batched(A, y, w)
    missing = ~np.isfinite(y) | (w <= 0)
    assert (np.isnan(res.residuals) == missing).all()
    fitted = res.x @ A.T
    np.testing.assert_allclose(res.residuals[~missing], (y - fitted)[~missing], atol=1e-12)


def test_unweighted_equals_unit_weights_and_shared_weights():
    rng = np.random.default_rng(3)
    A, y, _ = _problems(rng, shared=False)
    a = lstsq_batched(A, y)
    b = lstsq_batched(A, y, np.ones(y.shape[1]))
    np.testing.assert_allclose(a.x, b.x, rtol=1e-12)
    np.testing.assert_allclose(a.sigma2, b.sigma2, rtol=1e-12)


def test_float32_input_is_solved_in_float64():
    rng = np.random.default_rng(4)
    A, y, w = _problems(rng, shared=False)
    res32 = lstsq_batched(A.astype(np.float32), y.astype(np.float32), w.astype(np.float32))
    res64 = lstsq_batched(A.astype(np.float32).astype(np.float64),
                          y.astype(np.float32).astype(np.float64),
                          w.astype(np.float32).astype(np.float64))
    assert res32.x.dtype == np.float64
    np.testing.assert_allclose(res32.x, res64.x, rtol=1e-12)


def test_rank_deficient_problems_are_flagged_nan_and_do_not_touch_others():
    rng = np.random.default_rng(5)
    A, y, w = _problems(rng, K=20, shared=False)
    A_bad = A.copy()
    A_bad[3, :, 2] = 2 * A_bad[3, :, 0]  # collinear columns
    A_bad[7, :, 1] = A_bad[7, :, 0] * (1 + 1e-9)  # numerically collinear: cond(N) ~ 1e18
    A_bad[11, :, 2] = np.inf  # a non-finite column: every row dropped
    res = lstsq_batched(A_bad, y, w)
    good = np.setdiff1d(np.arange(20), [3, 7, 11])
    assert res.flag[[3, 7]].tolist() == [Flag.RANK_DEFICIENT] * 2
    assert res.flag[11] == Flag.TOO_FEW_OBSERVATIONS
    assert np.isnan(res.x[[3, 7, 11]]).all() and np.isnan(res.covariance[[3, 7, 11]]).all()
    assert np.isnan(res.residuals[[3, 7, 11]]).all()
    alone = lstsq_batched(A[good], y[good], w[good])
    np.testing.assert_array_equal(res.flag[good], 0)
    np.testing.assert_allclose(res.x[good], alone.x, rtol=1e-13)
    np.testing.assert_allclose(res.sigma2[good], alone.sigma2, rtol=1e-13)


def test_shared_design_with_rank_deficient_subset_of_observations():
    t = np.arange(6.0)
    A = np.stack([np.ones(6), t, t**2], axis=1)
    y = np.tile(1 + 0.5 * t, (3, 1))
    y[1, 2:] = np.nan  # two observations for three unknowns
    y[2, [1, 3, 5]] = np.nan  # three left: exactly determined
    res = lstsq_batched(A, y)
    assert res.flag.tolist() == [Flag.OK, Flag.TOO_FEW_OBSERVATIONS, Flag.NO_REDUNDANCY]
    assert np.isnan(res.x[1]).all()
    np.testing.assert_allclose(res.x[2], [1.0, 0.5, 0.0], atol=1e-12)
    assert np.isnan(res.sigma2[2]) and res.dof.tolist() == [3, -1, 0]


def test_non_finite_design_row_counts_as_missing_observation():
    rng = np.random.default_rng(6)
    A, y, w = _problems(rng, K=5, shared=False)
    A_nan = A.copy()
    A_nan[2, 4, 1] = np.nan
    res = lstsq_batched(A_nan, y, w)
    w_ref = w.copy()
    w_ref[2, 4] = 0.0
    ref = lstsq_batched(A, y, w_ref)
    np.testing.assert_allclose(res.x, ref.x, rtol=1e-12)
    assert np.isnan(res.residuals[2, 4])
    assert np.isnan(A_nan[2, 4, 1])  # the input is not modified


def test_batches_give_the_same_result_as_one_batch():
    rng = np.random.default_rng(7)
    for shared in (True, False):
        A, y, w = _problems(rng, K=50, shared=shared)
        one = lstsq_batched(A, y, w)
        many = lstsq_batched(A, y, w, max_batch=7)
        np.testing.assert_allclose(many.x, one.x, rtol=1e-12)
        np.testing.assert_array_equal(many.flag, one.flag)


def test_empty_batch():
    res = lstsq_batched(np.ones((4, 2)), np.zeros((0, 4)))
    assert res.x.shape == (0, 2) and res.residuals.shape == (0, 4)


@pytest.mark.parametrize(("A", "y", "w", "match"), [
    (np.ones((5, 2)), np.ones((3, 4)), None, "A: expected shape"),
    (np.ones((2, 5, 2)), np.ones((3, 5)), None, "A: expected shape"),
    (np.ones((5, 2)), np.ones(5), None, "y: expected shape"),
    (np.ones((5, 2)), np.ones((3, 5)), np.ones(4), "weights: expected shape"),
])
def test_shape_errors_name_the_input(A, y, w, match):
    with pytest.raises(ValueError, match=match):
        lstsq_batched(A, y, w)


def test_solve_normal_equations_rejects_non_finite_without_spreading():
    N = np.stack([np.eye(2) * 2, np.full((2, 2), np.nan), [[4.0, 2.0], [2.0, 3.0]]])
    b = np.array([[2.0, 2.0], [1.0, 1.0], [2.0, 1.0]])
    x, inv, ok = solve_normal_equations(N, b)
    assert ok.tolist() == [True, False, True]
    np.testing.assert_allclose(x[[0, 2]], [[1.0, 1.0], np.linalg.solve(N[2], b[2])])
    assert np.isnan(x[1]).all() and np.isnan(inv[1]).all()
