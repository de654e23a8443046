"""The kriging systems' distances, factors and whitened products in compiled passes (Numba).

The correlated height's kriging (:func:`depsi.processing.correlated_height._krige_batch`)
factorises each cell's matrix ``K = L L^T`` and needs, for each of the cell's targets, the
prediction ``(L^-1 v) . (L^-1 c)`` and the explained variance ``|L^-1 c|^2``. SciPy solves the
triangular systems one cell a call (the Python call costs as much as the arithmetic at
``k = 128``), writes the whitened ``(cells, k, 1 + width)`` array and reads it again for two
products. Here each cell's forward substitution runs in a buffer of one cell's rows, four rows
at a time (each solved row read once for four), and the two sums are taken as each row is
solved: the whitened array is never formed. The sums are the same as SciPy's to round-off
(another order of the same operations): within a few units of float64 rounding of
``|L^-1 v| |L^-1 c|``, which the tests hold it to. The factor itself (:func:`factored_sums`)
is LAPACK's ``dpotrf`` a cell, in place in a copy of the cell's matrix: NumPy's batched
Cholesky calls the same routine but copies each matrix in and out and clears its upper
triangle, 40 % of its time at ``k = 128``; its factors agree with NumPy's to round-off.

The systems' float32 distances (:func:`distances`) are NumPy's to the bit (the same
operations on the same values: IEEE differences, products, sums and square roots, no fused
multiply-add), without its broadcast temporaries: each cell's second set of points is read
once into two contiguous coordinate rows, and each distance is written once. Likewise the
covariances' float64 step (:func:`scaled_covariance`): ``float64(e) sill - offset`` of
NumPy's float32 exponentials, rounded as NumPy's three passes round it, in one.
"""

from __future__ import annotations

import numpy as np

from depsi.kernels import numba_support
from depsi.kernels.numba_support import jit_cached, numba, sample_array


def _lapack_potrf():
    """LAPACK's ``dpotrf`` as Numba's ``np.linalg.cholesky`` calls it (SciPy's LAPACK, through
    Numba's helper library, by name, so that a cached kernel links it again); None where this
    Numba has no such entry."""
    if numba is None:
        return None
    try:
        from numba.core import types
        from numba.np.linalg import _LAPACK, ensure_lapack

        ensure_lapack()
        return _LAPACK().numba_xxpotrf(types.float64)
    except (ImportError, AttributeError):  # pragma: no cover - another Numba's internals
        return None


_potrf = _lapack_potrf()

#: Whether the compiled kernels can run in this process.
AVAILABLE = _potrf is not None


def _substitute(lower, values, c_nt, rows, predicted, explained):
    """One cell's ``predicted = (L^-1 v) . (L^-1 C)`` and ``explained = |L^-1 C|^2`` (column by
    column): ``L = lower`` lower triangular ``(k, k)`` (its upper triangle not read),
    ``v = values`` ``(k,)``, ``C = c_nt`` ``(k, width)``; ``rows`` a ``(k, 1 + width)``
    buffer, where ``[v | C]`` is whitened in place row by row."""
    k, width = c_nt.shape
    for i in range(k):
        rows[i, 0] = values[i]
        for c in range(width):
            rows[i, c + 1] = c_nt[i, c]
    for c in range(width):
        predicted[c] = 0.0
        explained[c] = 0.0
    start = 0
    while start < k:
        stop = min(start + 4, k)
        first = start
        if stop - start == 4:
            # the block's four rows less every solved row above it, each of those read once
            # for the four (a loop over the columns that vectorises)
            r0, r1, r2, r3 = rows[start], rows[start + 1], rows[start + 2], rows[start + 3]
            for j in range(start):
                l0, l1 = lower[start, j], lower[start + 1, j]
                l2, l3 = lower[start + 2, j], lower[start + 3, j]
                solved = rows[j]
                for c in range(width + 1):
                    x = solved[c]
                    r0[c] -= l0 * x
                    r1[c] -= l1 * x
                    r2[c] -= l2 * x
                    r3[c] -= l3 * x
        else:  # the last rows (k not a multiple of 4): every row above, one at a time
            first = 0
        for i in range(start, stop):
            row = rows[i]
            for j in range(first, i):
                factor = lower[i, j]
                solved = rows[j]
                for c in range(width + 1):
                    row[c] -= factor * solved[c]
            diagonal = lower[i, i]
            for c in range(width + 1):
                row[c] /= diagonal
            data = row[0]
            for c in range(width):
                x = row[c + 1]
                predicted[c] += data * x
                explained[c] += x * x
        start = stop


def _whitened_sums(lower, values, c_nt, predicted, explained):
    """:func:`_substitute` of each cell ``b``: ``lower[b]``, ``values[b]``, ``c_nt[b]`` into
    ``predicted[b]``, ``explained[b]``."""
    n_cells, k, width = c_nt.shape
    rows = np.empty((k, width + 1))
    for b in range(n_cells):
        _substitute(lower[b], values[b], c_nt[b], rows, predicted[b], explained[b])


def _factored_sums(cov, values, c_nt, predicted, explained):
    """Each cell's ``K = cov[b]`` factorised, ``K = L L^T`` (LAPACK's ``dpotrf`` in a copy,
    ``cov`` left as it is), and :func:`_substitute` with its factor. Returns -1, or the first
    cell whose matrix is not positive definite to round-off (then the later cells are not
    solved)."""
    n_cells, k, width = c_nt.shape
    rows = np.empty((k, width + 1))
    lower = np.empty((k, k))
    for b in range(n_cells):
        for i in range(k):
            for j in range(k):
                lower[i, j] = cov[b, i, j]
        # upper in LAPACK's column order is lower in this row order: L in the lower triangle
        if _potrf(ord("d"), ord("U"), k, lower.ctypes, k) != 0:
            return b
        _substitute(lower, values[b], c_nt[b], rows, predicted[b], explained[b])
    return -1


def _distances(a, b, out):
    """``out[c, i, j]``: the distance between ``a[c, i]`` and ``b[c, j]`` (float32), as
    ``sqrt((ax - bx)^2 + (ay - by)^2)`` rounded step by step."""
    n = b.shape[1]
    bx = np.empty(n, np.float32)
    by = np.empty(n, np.float32)
    for c in range(a.shape[0]):
        for j in range(n):
            bx[j] = b[c, j, 0]
            by[j] = b[c, j, 1]
        for i in range(a.shape[1]):
            x, y = a[c, i, 0], a[c, i, 1]
            row = out[c, i]
            for j in range(n):
                dx = x - bx[j]
                dy = y - by[j]
                row[j] = np.sqrt(dx * dx + dy * dy)


def _scaled(correlation, sill, offset, out):
    """``out = float64(correlation) * sill - offset``, element by element (two roundings)."""
    flat = correlation.reshape(-1)
    result = out.reshape(-1)
    for i in range(flat.size):
        result[i] = np.float64(flat[i]) * sill - offset


if AVAILABLE:
    _substitute = jit_cached(_substitute)
    _whitened_sums = jit_cached(_whitened_sums)
    _factored_sums = jit_cached(_factored_sums)
    _distances = jit_cached(_distances)
    _scaled = jit_cached(_scaled)


def samples():
    """The kernels with arguments of the types the kriging passes them (C order)."""
    f4, f8 = np.float32, np.float64
    systems = (sample_array(f8, 3), sample_array(f8, 2), sample_array(f8, 3),
               sample_array(f8, 2), sample_array(f8, 2))
    return [(_factored_sums, systems), (_whitened_sums, systems),
            (_distances, (sample_array(f4, 3), sample_array(f4, 3), sample_array(f4, 3))),
            (_scaled, (sample_array(f4, 3), 1.0, 1.0, sample_array(f8, 3)))]


def ready() -> bool:
    """Whether :func:`factored_sums`, :func:`whitened_sums`, :func:`distances` and
    :func:`scaled_covariance` run compiled in this process
    (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


def factored_sums(cov: np.ndarray, values: np.ndarray, c_nt: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`whitened_sums` of the Cholesky factors of ``cov`` ``(cells, k, k)`` (symmetric;
    factorised by LAPACK a cell, in a copy, as :func:`numpy.linalg.cholesky` factorises them to
    round-off); None where a cell's matrix is not positive definite, for the caller's other
    solve of the whole batch.

    Examples
    --------
    >>> cov = np.array([[[4.0, 2.0], [2.0, 2.0]]])
    >>> predicted, explained = factored_sums(cov, np.array([[2.0, 2.0]]),
    ...                                      np.array([[[2.0], [3.0]]]))
    >>> predicted.tolist(), explained.tolist()
    ([[3.0]], [[5.0]])
    >>> factored_sums(-cov, np.array([[2.0, 2.0]]), np.array([[[2.0], [3.0]]])) is None
    True
    """
    n_cells, _, width = c_nt.shape
    predicted = np.empty((n_cells, width))
    explained = np.empty((n_cells, width))
    failed = _factored_sums(np.ascontiguousarray(cov, dtype=np.float64),
                            np.ascontiguousarray(values, dtype=np.float64),
                            np.ascontiguousarray(c_nt, dtype=np.float64), predicted, explained)
    return None if failed >= 0 else (predicted, explained)


def whitened_sums(lower: np.ndarray, values: np.ndarray, c_nt: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The predictions ``(L^-1 v) . (L^-1 c)`` and explained variances ``|L^-1 c|^2``
    ``(cells, width)`` of a batch of kriging systems: ``lower`` ``(cells, k, k)`` each cell's
    Cholesky factor (lower triangular; the upper triangle is not read), ``values``
    ``(cells, k)`` the sources' values and ``c_nt`` ``(cells, k, width)`` their covariances
    with the targets. Float64, as SciPy's triangular solves give them to round-off.

    Examples
    --------
    >>> lower = np.array([[[2.0, 0.0], [1.0, 1.0]]])
    >>> predicted, explained = whitened_sums(lower, np.array([[2.0, 2.0]]),
    ...                                      np.array([[[2.0], [3.0]]]))
    >>> predicted.tolist(), explained.tolist()
    ([[3.0]], [[5.0]])
    """
    n_cells, _, width = c_nt.shape
    predicted = np.empty((n_cells, width))
    explained = np.empty((n_cells, width))
    _whitened_sums(np.ascontiguousarray(lower, dtype=np.float64),
                   np.ascontiguousarray(values, dtype=np.float64),
                   np.ascontiguousarray(c_nt, dtype=np.float64), predicted, explained)
    return predicted, explained


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The distances ``(cells, m, n)`` between the points of ``a`` ``(cells, m, 2)`` and ``b``
    ``(cells, n, 2)``, float32 (both taken as float32): NumPy's broadcast differences, squares,
    sum and square root, to the bit.

    Examples
    --------
    >>> a = np.array([[[0.0, 0.0], [3.0, 0.0]]], dtype=np.float32)
    >>> distances(a, np.array([[[0.0, 4.0]]], dtype=np.float32)).tolist()
    [[[4.0], [5.0]]]
    """
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    out = np.empty((a.shape[0], a.shape[1], b.shape[1]), dtype=np.float32)
    _distances(a, b, out)
    return out


def scaled_covariance(correlation: np.ndarray, sill: float, offset: float) -> np.ndarray:
    """``sill correlation - offset`` in float64 from a float32 ``correlation`` ``(B, m, n)``:
    NumPy's ``correlation.astype(np.float64)``, ``*= sill``, ``-= offset``, to the bit.

    Examples
    --------
    >>> scaled_covariance(np.full((1, 1, 2), 0.5, dtype=np.float32), 2.0, 0.25).tolist()
    [[[0.75, 0.75]]]
    """
    correlation = np.ascontiguousarray(correlation, dtype=np.float32)
    out = np.empty(correlation.shape)
    _scaled(correlation, float(sill), float(offset), out)
    return out
