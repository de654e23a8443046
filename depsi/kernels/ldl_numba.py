"""Many right-hand sides through one sparse ``L D L^T`` factorisation (QDLDL's factors) in one
compiled pass (Numba), where QDLDL's binding solves one right-hand side per call; and through
one sparse Cholesky factor ``L L^T`` (CHOLMOD's, read out of its supernodal factorisation:
:class:`CholeskyFactors`).

``A = P (I + L) D (I + L)^T P^T`` with ``L`` strictly lower triangular (CSC), as
``qdldl.Solver.factors()`` returns it. The same operations in the same order as QDLDL's
``solve`` (the forward and backward sweeps, the multiplication by ``1 / D``), so each column
is QDLDL's result to the bit; the sweeps visit each factor entry once for all columns instead
of once per column. Figures: ``docs/benchmarks.md`` ("The integration tiles' solves").
"""

from __future__ import annotations

import numpy as np

from depsi.kernels import numba_support
from depsi.kernels.numba_support import jit_cached, numba, sample_array

#: Whether the compiled solve can run in this process.
AVAILABLE = numba is not None


def _sweeps(Lp, Li, Lx, d_inverse, permutation, b, x):
    """``x = P (I + L)^-T D^-1 (I + L)^-1 P^T b`` for the columns of ``b`` (n, k), row-major."""
    n, k = b.shape
    y = np.empty((n, k))
    for i in range(n):
        y[i] = b[permutation[i]]
    for j in range(n):  # (I + L) z = y, column by column of L
        for index in range(Lp[j], Lp[j + 1]):
            row = Li[index]
            value = Lx[index]
            for c in range(k):
                y[row, c] -= value * y[j, c]
    for i in range(n):
        for c in range(k):
            y[i, c] *= d_inverse[i]
    for j in range(n - 1, -1, -1):  # (I + L)^T w = z
        for index in range(Lp[j], Lp[j + 1]):
            row = Li[index]
            value = Lx[index]
            for c in range(k):
                y[j, c] -= value * y[row, c]
    for i in range(n):
        x[permutation[i]] = y[i]


def _cholesky_sweeps(Lp, Li, Lx, permutation, b, x):
    """``x = P^T L^-T L^-1 P b`` for the columns of ``b`` (n, k), row-major, with ``L`` lower
    triangular in CSC, each column's diagonal its first entry, and ``(P b)[i] =
    b[permutation[i]]``. ``x`` may be ``b`` itself."""
    n, k = b.shape
    y = np.empty((n, k))
    for i in range(n):
        y[i] = b[permutation[i]]
    for j in range(n):  # L z = y, column by column
        inverse = 1.0 / Lx[Lp[j]]
        for c in range(k):
            y[j, c] *= inverse
        for index in range(Lp[j] + 1, Lp[j + 1]):
            row = Li[index]
            value = Lx[index]
            for c in range(k):
                y[row, c] -= value * y[j, c]
    for j in range(n - 1, -1, -1):  # L^T w = z
        for index in range(Lp[j] + 1, Lp[j + 1]):
            row = Li[index]
            value = Lx[index]
            for c in range(k):
                y[j, c] -= value * y[row, c]
        inverse = 1.0 / Lx[Lp[j]]
        for c in range(k):
            y[j, c] *= inverse
    for i in range(n):
        x[permutation[i]] = y[i]


if AVAILABLE:
    _sweeps = jit_cached(_sweeps)
    _cholesky_sweeps = jit_cached(_cholesky_sweeps)


def samples():
    """The sweeps with arguments of the types :class:`LDLFactors` and
    :class:`CholeskyFactors` pass them."""
    i8, f8 = np.int64, np.float64
    return [(_sweeps, (sample_array(i8, 1), sample_array(i8, 1), sample_array(f8, 1),
                       sample_array(f8, 1), sample_array(i8, 1), sample_array(f8, 2),
                       sample_array(f8, 2))),
            (_cholesky_sweeps, (sample_array(i8, 1), sample_array(i8, 1), sample_array(f8, 1),
                                sample_array(i8, 1), sample_array(f8, 2), sample_array(f8, 2)))]


def ready() -> bool:
    """Whether :class:`LDLFactors` runs compiled in this process
    (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


class LDLFactors:
    """QDLDL's factors of one matrix, for :meth:`solve` of many right-hand sides at once.

    Examples
    --------
    >>> import qdldl, scipy.sparse as sp
    >>> A = sp.csc_matrix(np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]]))
    >>> factors = LDLFactors(qdldl.Solver(sp.triu(A, format="csc")))
    >>> b = np.arange(6.0).reshape(3, 2)
    >>> bool(np.allclose(A @ factors.solve(b), b))
    True
    """

    def __init__(self, solver):
        L, d, permutation = solver.factors()
        L = L.tocsc()
        self._Lp = np.ascontiguousarray(L.indptr, dtype=np.int64)
        self._Li = np.ascontiguousarray(L.indices, dtype=np.int64)
        self._Lx = np.ascontiguousarray(L.data, dtype=np.float64)
        self._d_inverse = 1.0 / np.asarray(d, dtype=np.float64)  # as QDLDL keeps it
        self._permutation = np.ascontiguousarray(permutation, dtype=np.int64)

    def solve(self, b: np.ndarray) -> np.ndarray:
        """``A^-1 b`` for ``b`` of shape (n, k)."""
        b = np.ascontiguousarray(b, dtype=np.float64)
        x = np.empty_like(b)
        _sweeps(self._Lp, self._Li, self._Lx, self._d_inverse, self._permutation, b, x)
        return x


class CholeskyFactors:
    """A sparse Cholesky factor ``P A P^T = L L^T``, for :meth:`solve` of many right-hand
    sides in one compiled pass over its entries.

    ``Lp``, ``Li``, ``Lx``: ``L`` in CSC with each column's rows sorted and its diagonal
    first (CHOLMOD's simplicial layout); ``permutation``: ``(P b)[i] = b[permutation[i]]``.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]])
    >>> L = sp.csc_matrix(np.linalg.cholesky(A))
    >>> factors = CholeskyFactors(L.indptr, L.indices, L.data, np.arange(3))
    >>> b = np.arange(6.0).reshape(3, 2)
    >>> bool(np.allclose(A @ factors.solve(b), b))
    True
    """

    def __init__(self, Lp, Li, Lx, permutation):
        self._Lp = np.ascontiguousarray(Lp, dtype=np.int64)
        self._Li = np.ascontiguousarray(Li, dtype=np.int64)
        self._Lx = np.ascontiguousarray(Lx, dtype=np.float64)
        self._permutation = np.ascontiguousarray(permutation, dtype=np.int64)
        n = len(self._Lp) - 1
        first = self._Lp[:-1]
        if (len(self._permutation) != n or np.any(first >= self._Lp[1:])
                or np.any(self._Li[first] != np.arange(n))):
            raise ValueError("expected a lower-triangular CSC factor with each column's "
                             "diagonal first, and a permutation of its rows")

    def solve(self, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
        """``A^-1 b`` for ``b`` of shape (n, k); written into ``out`` (float64, C-ordered,
        which may be ``b`` itself) where given."""
        b = np.ascontiguousarray(b, dtype=np.float64)
        x = np.empty_like(b) if out is None else out
        _cholesky_sweeps(self._Lp, self._Li, self._Lx, self._permutation, b, x)
        return x
