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
