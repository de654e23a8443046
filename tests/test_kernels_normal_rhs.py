"""The compiled ``A^T W y`` of the network solve against SciPy's sparse product."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

normal_rhs_numba = pytest.importorskip("depsi.kernels.normal_rhs_numba")


def _network(rng, n, m, n_rhs, *, reach, share):
    """Random arcs among ``n`` points (each to a point within ``reach`` indices), their weights,
    float32 right-hand sides and the kept arcs (about ``share`` of them)."""
    source = rng.integers(0, n, m)
    target = (source + rng.integers(1, reach, m)) % n
    weights = rng.uniform(0.5, 4.0, m)
    rhs = rng.normal(size=(m, n_rhs)).astype(np.float32)
    return source, target, weights, rhs, np.flatnonzero(rng.random(m) < share)


def _columns(rng, n, share, reference):
    """Each point's unknown (about ``share`` of the points on the network; the others and the
    ``reference`` map to ``n_unknown``, the dropped row) and ``n_unknown``."""
    unknown = rng.random(n) < share
    unknown[reference] = False
    n_unknown = int(unknown.sum())
    col = np.full(n, n_unknown, dtype=np.int64)
    col[unknown] = np.arange(n_unknown)
    return col, n_unknown


@pytest.mark.parametrize("order", ["increasing", "shuffled"])
def test_normal_rhs_is_the_sparse_products_to_the_bit(order):
    """Each point's sum over its arcs in the sparse product's order: SciPy's float64 result
    exactly, with points off the network and the reference (their rows dropped), and the kept
    arcs in any order (the product's columns follow ``kept``'s order, as the kernel does)."""
    from depsi.processing.network_solver import incidence_matrix

    rng = np.random.default_rng(3)
    n, m = 500, 4000
    source, target, weights, rhs, kept = _network(rng, n, m, 9, reach=40, share=0.7)
    if order == "shuffled":
        kept = rng.permutation(kept)
    col, n_unknown = _columns(rng, n, 0.95, reference=11)
    A = incidence_matrix(col[source[kept]], col[target[kept]], n_points=n_unknown + 1)
    AtW = A[:, :-1].tocsc().T.multiply(weights[kept][None, :]).tocsr()
    AtW_all = sp.csr_matrix((AtW.data, kept[AtW.indices], AtW.indptr), shape=(n_unknown, m))
    expected = AtW_all @ rhs.astype(np.float64)
    got = normal_rhs_numba.normal_rhs(col[source], col[target], weights, kept, rhs, n_unknown)
    np.testing.assert_array_equal(got, expected)


def test_normal_rhs_of_rows_formed_when_read_is_the_arrays_to_the_bit(monkeypatch):
    """Right-hand sides formed when read (an object with ``rhs[rows]``) are read a block of
    kept arcs at a time, each added in the same order: the array's sums exactly."""
    n = 300
    source, target, weights, rhs, kept = _network(np.random.default_rng(5), n, 5000, 7,
                                                  reach=30, share=0.6)

    class Rows:  # rows formed when read
        shape, ndim = rhs.shape, 2

        def __getitem__(self, rows):
            return rhs[rows]

    monkeypatch.setattr(normal_rhs_numba, "BLOCK", 333)  # many blocks, the last short
    np.testing.assert_array_equal(
        normal_rhs_numba.normal_rhs(source, target, weights, kept, Rows(), n),
        normal_rhs_numba.normal_rhs(source, target, weights, kept, rhs, n))


@pytest.mark.parametrize("formed", [False, True], ids=["array", "rows-when-read"])
def test_normal_rhs_looks_the_unknowns_up_by_block_into_a_given_array(monkeypatch, formed):
    """``column=``: the arcs' points mapped to their unknowns a block at a time (no
    ``(arcs,)`` copies), summed into a given zeroed array (``out=``, here pageable): the sums of
    the mapped arrays exactly, in that array."""
    from depsi.stm import runtime

    n = 400
    source, target, weights, rhs, kept = _network(np.random.default_rng(9), n, 6000, 5,
                                                  reach=25, share=0.8)
    unknown = np.random.default_rng(1).random(n) < 0.9
    column = np.where(unknown, np.arange(n), n)
    expected = normal_rhs_numba.normal_rhs(column[source], column[target], weights, kept, rhs, n)

    class Rows:
        shape, ndim = rhs.shape, 2

        def __getitem__(self, rows):
            return rhs[rows]

    monkeypatch.setattr(normal_rhs_numba, "BLOCK", 777)
    monkeypatch.setattr(runtime, "PAGEABLE_BYTES", 0)
    out = runtime.pageable((n + 1, rhs.shape[1]), np.float64, zeros=True)
    got = normal_rhs_numba.normal_rhs(source, target, weights, kept, Rows() if formed else rhs,
                                      n, column=column, out=out)
    np.testing.assert_array_equal(got, expected)
    assert np.shares_memory(got, out) and runtime.is_pageable(got)


@pytest.mark.parametrize("order", ["increasing", "shuffled"])
def test_normal_matrix_is_the_sparse_products_to_the_bit(order):
    """``A^T W A`` from the arcs' ends: SciPy's ``(A^T W @ A).tocsc()`` exactly (the same
    entries, rows ascending, each sum's bits), with parallel arcs (off-diagonal sums of
    several terms), zero weights (entries summing to 0 dropped), points off the network and
    the reference (their rows and columns dropped)."""
    from depsi.processing.network_solver import incidence_matrix

    rng = np.random.default_rng(4)
    n, m = 300, 3000
    source, target, weights, _, kept = _network(rng, n, m, 1, reach=6, share=0.8)
    weights = weights ** 3  # sums whose order shows in their last bits
    weights[rng.random(m) < 0.03] = 0.0
    if order == "shuffled":
        kept = rng.permutation(kept)
    col, n_unknown = _columns(rng, n, 0.9, reference=7)
    A = incidence_matrix(col[source[kept]], col[target[kept]], n_points=n_unknown + 1)
    A = A[:, :-1].tocsc()
    expected = (A.T.multiply(weights[kept][None, :]).tocsr() @ A).tocsc()
    got = normal_rhs_numba.normal_matrix(col[source[kept]], col[target[kept]], weights[kept],
                                         n_unknown)
    pairs = np.sort(np.column_stack([source[kept], target[kept]]), axis=1)
    assert len(np.unique(pairs, axis=0)) < len(pairs)  # parallel arcs present
    assert got.indices.dtype == expected.indices.dtype
    np.testing.assert_array_equal(got.indptr, expected.indptr)
    np.testing.assert_array_equal(got.indices, expected.indices)
    np.testing.assert_array_equal(got.data.view(np.int64), expected.data.view(np.int64))
