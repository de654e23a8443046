"""Many right-hand sides through QDLDL's factors in one compiled pass: QDLDL's own solve, one
column at a time, to the bit."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

qdldl = pytest.importorskip("qdldl")
ldl_numba = pytest.importorskip("depsi.kernels.ldl_numba")
if not ldl_numba.AVAILABLE:
    pytest.skip("Numba is not importable", allow_module_level=True)


def _network_normal_matrix(rng, n, arcs_per_point=4, reach=40):
    """``A^T A`` of a random network of n points (a graph Laplacian) plus a small diagonal:
    the sparsity of the integration tiles' normal matrices."""
    source = rng.integers(0, n, arcs_per_point * n)
    target = (source + rng.integers(1, reach, source.size)) % n
    adjacency = sp.coo_matrix((rng.uniform(0.5, 2.0, source.size), (source, target)),
                              shape=(n, n))
    adjacency = adjacency + adjacency.T
    degree = sp.diags(np.asarray(adjacency.sum(axis=1)).ravel())
    return (degree - adjacency + 1e-3 * sp.eye(n)).tocsc()


@pytest.mark.parametrize("n, k", [(1, 3), (50, 2), (800, 64), (2000, 17)])
def test_many_columns_equal_qdldl_one_column_at_a_time(n, k):
    rng = np.random.default_rng(n + k)
    matrix = _network_normal_matrix(rng, n) if n > 1 else sp.csc_matrix([[2.5]])
    solver = qdldl.Solver(sp.triu(matrix, format="csc"))
    b = rng.standard_normal((n, k))
    expected = np.stack([solver.solve(np.ascontiguousarray(b[:, j])) for j in range(k)], axis=1)
    np.testing.assert_array_equal(ldl_numba.LDLFactors(solver).solve(b), expected)


def test_the_network_solver_s_ldl_gives_qdldl_s_columns_to_the_bit():
    from depsi.processing.network_solver import _LDL

    rng = np.random.default_rng(3)
    matrix = _network_normal_matrix(rng, 500)
    solver = _LDL(matrix)
    b = np.asfortranarray(rng.standard_normal((500, 20)).astype(np.float32))
    together = solver.solve(b)
    one_by_one = np.stack([solver.solve(b[:, j].astype(np.float64)) for j in range(20)], axis=1)
    np.testing.assert_array_equal(together, one_by_one)
    np.testing.assert_allclose(matrix @ together, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n, k", [(1, 1), (60, 3), (1500, 48)])
def test_cholesky_factors_solve_with_a_permuted_factor(n, k):
    """The sweeps over a permuted ``L L^T`` factor (SciPy's dense Cholesky of ``P A P^T`` in
    CSC, diagonal first) solve ``A x = b`` to the system's rounding, in place too; a factor
    without its diagonal first is refused."""
    rng = np.random.default_rng(n + k)
    matrix = _network_normal_matrix(rng, n).toarray() if n > 1 else np.array([[2.5]])
    permutation = rng.permutation(n)
    permuted = matrix[np.ix_(permutation, permutation)]
    lower = sp.csc_matrix(np.linalg.cholesky(permuted))
    lower.sort_indices()
    factors = ldl_numba.CholeskyFactors(lower.indptr, lower.indices, lower.data, permutation)
    b = rng.standard_normal((n, k))
    expected = np.linalg.solve(matrix, b)
    scale = np.abs(expected).max() * np.linalg.cond(matrix)
    np.testing.assert_allclose(factors.solve(b), expected, rtol=0, atol=1e-13 * scale)
    in_place = b.copy()
    assert factors.solve(in_place, out=in_place) is in_place
    np.testing.assert_array_equal(in_place, factors.solve(b))
    if n > 1:
        with pytest.raises(ValueError, match="diagonal first"):
            ldl_numba.CholeskyFactors(lower.indptr, lower.indices[::-1].copy(), lower.data,
                                      permutation)


def test_the_supernodal_factor_solves_the_network_and_refuses_an_indefinite_matrix():
    """CHOLMOD's supernodal factor through CVXOPT, read out and solved by the sweeps: the
    network's systems to the rounding of a direct solve; a matrix that is not positive
    definite raises LinAlgError, not CVXOPT's ArithmeticError."""
    from depsi.processing import network_solver

    # the test suite compiles kernels inline (tests/conftest.py): the sweeps run here
    assert network_solver._compiled_kernels("ldl_numba")
    rng = np.random.default_rng(5)
    matrix = _network_normal_matrix(rng, 3000)
    b = rng.standard_normal((3000, 20))
    from scipy.sparse.linalg import splu

    expected = splu(matrix).solve(b)
    solver = network_solver._Supernodal(matrix)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(solver.solve(b), expected, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(solver.solve(b[:, 3]), expected[:, 3], rtol=0, atol=1e-9 * scale)
    indefinite = (matrix - 2.0 * sp.eye(3000)).tocsc()
    with pytest.raises(np.linalg.LinAlgError, match="not positive definite"):
        network_solver._Supernodal(indefinite)


def test_the_whole_network_keeps_cholespy_where_the_supernodal_copy_would_not_fit(monkeypatch):
    """The supernodal factor and its read-out copy need about three factors' memory: under a
    small driver's limit the whole network goes to cholespy's in-place factor instead."""
    from depsi.processing import network_solver

    assert network_solver._compiled_kernels("ldl_numba")  # compiled inline in the test suite
    matrix = _network_normal_matrix(np.random.default_rng(2), 2000)
    monkeypatch.setattr(network_solver, "LDL_MAX_UNKNOWNS", 100)
    assert isinstance(network_solver._factorise(matrix), network_solver._Supernodal)
    needed = 3 * 16 * network_solver.SUPERNODAL_FILL * 2000 * np.log2(2000)
    monkeypatch.setattr(network_solver, "available_host_memory", lambda: int(needed) - 1)
    assert isinstance(network_solver._factorise(matrix), network_solver._Cholesky)
