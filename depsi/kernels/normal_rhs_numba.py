"""The network's normal-equation right-hand sides ``A^T W y`` in one compiled pass (Numba).

``A`` is the network's incidence matrix (-1 at an arc's source, +1 at its target) and ``y``
the arcs' float32 ``(arcs, nrhs)`` right-hand sides. SciPy's sparse product needs them as
float64 first, a strided copy of a few columns at a time (0.7 s of the whole network's solve
at 10^6 points, and the memory traffic of three passes); here each arc's row is read once, in
float32, and added to its two points' rows in float64. The additions are SciPy's, in its
order (each point's arcs in increasing order, ``(+-w) * y`` each), so the result is its to the
bit.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from depsi.kernels import numba_support
from depsi.kernels.numba_support import jit_cached, numba, sample_array

#: Whether the compiled kernel can run in this process.
AVAILABLE = numba is not None
#: Arcs a call reads at a time from right-hand sides formed when read.
BLOCK = 65536


def _scatter(source_column, target_column, weights, kept, rhs, out):
    """``out[column] += (-+ w) * rhs[arc]`` over ``kept`` arcs in order (float64)."""
    n_columns = rhs.shape[1]
    for i in range(kept.shape[0]):
        arc = kept[i]
        w = weights[arc]
        source, target = source_column[arc], target_column[arc]
        for c in range(n_columns):
            value = np.float64(rhs[arc, c])
            out[source, c] += (-w) * value
            out[target, c] += w * value


def _normal_matrix(source_column, target_column, weights, n_unknown):
    """``A^T W A`` as CSC ``(indptr, indices, data)``, each column's rows ascending: the
    arcs' ends are ``source_column`` and ``target_column`` (``n_unknown`` for the reference,
    whose row and column are dropped). Each entry is the sum SciPy's product ``(A^T W) A``
    forms, in its order (from 0, the arcs at the point in increasing order: ``+w`` on the
    diagonal, ``-w`` beside it), and entries that sum to 0 are dropped, as it drops them."""
    m = source_column.shape[0]
    start = np.zeros(n_unknown + 1, np.int64)
    for j in range(m):
        if source_column[j] < n_unknown:
            start[source_column[j] + 1] += 1
        if target_column[j] < n_unknown:
            start[target_column[j] + 1] += 1
    for i in range(n_unknown):
        start[i + 1] += start[i]
    fill = start[:-1].copy()
    arcs = np.empty(start[n_unknown], np.int64)  # each point's arcs, in increasing order
    for j in range(m):
        for end in (source_column[j], target_column[j]):
            if end < n_unknown:
                arcs[fill[end]] = j
                fill[end] += 1
    indptr = np.zeros(n_unknown + 1, np.int64)
    indices = np.empty(start[n_unknown] + n_unknown, np.int64)
    data = np.empty(start[n_unknown] + n_unknown)
    position = np.full(n_unknown, -1, np.int64)  # where a row is in the column being made
    nnz = 0
    for i in range(n_unknown):
        first = nnz
        indices[nnz] = i
        data[nnz] = 0.0
        nnz += 1
        for a in range(start[i], start[i + 1]):
            j = arcs[a]
            w = weights[j]
            data[first] += w
            other = target_column[j] if source_column[j] == i else source_column[j]
            if other < n_unknown:
                if position[other] < 0:
                    position[other] = nnz
                    indices[nnz] = other
                    data[nnz] = 0.0
                    nnz += 1
                data[position[other]] += -w
        kept = first
        for p in range(first, nnz):  # rows ascending (a few entries: insertion sort)
            if indices[p] != i:
                position[indices[p]] = -1
            if data[p] == 0.0:
                continue
            row, value = indices[p], data[p]
            q = kept
            while q > first and indices[q - 1] > row:
                indices[q] = indices[q - 1]
                data[q] = data[q - 1]
                q -= 1
            indices[q] = row
            data[q] = value
            kept += 1
        nnz = kept
        indptr[i + 1] = nnz
    return indptr, indices[:nnz].copy(), data[:nnz].copy()


if AVAILABLE:
    _scatter = jit_cached(_scatter)
    _normal_matrix = jit_cached(_normal_matrix)


def samples():
    """The kernel with arguments of the types the network solver passes it (the arcs'
    right-hand sides float32)."""
    i8, f8 = np.int64, np.float64
    return [(_scatter, (sample_array(i8, 1), sample_array(i8, 1), sample_array(f8, 1),
                        sample_array(i8, 1), sample_array(np.float32, 2), sample_array(f8, 2))),
            (_normal_matrix, (sample_array(i8, 1), sample_array(i8, 1), sample_array(f8, 1),
                              1))]


def ready() -> bool:
    """Whether :func:`normal_rhs` runs compiled in this process
    (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


def normal_rhs(source_column: np.ndarray, target_column: np.ndarray, weights: np.ndarray,
               kept: np.ndarray, rhs: np.ndarray, n_unknown: int, *,
               column: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """``A^T W y`` ``(n_unknown, nrhs)`` over the arcs ``kept`` (indices into the arrays, in
    increasing order), ``source_column`` and ``target_column`` each arc's points' unknowns
    (``n_unknown`` for the reference and points off the network, whose row is dropped).
    ``rhs``: an array, or any object whose ``rhs[rows]`` gives those rows as one
    (:class:`depsi.processing.integration.ArcRightHandSides`), read :data:`BLOCK` arcs at a
    time. ``column``: given, ``source_column`` and ``target_column`` are the arcs' points and
    ``column[point]`` their unknowns, looked up a block of arcs at a time (no ``(arcs,)``
    copies). ``out``: a zeroed float64 ``(n_unknown + 1, nrhs)`` array to sum into (the result
    is its first ``n_unknown`` rows).

    Examples
    --------
    >>> rhs = np.array([[1.0], [2.0]], dtype=np.float32)
    >>> normal_rhs(np.array([0, 1]), np.array([1, 2]), np.array([1.0, 0.5]),
    ...            np.array([0, 1]), rhs, 2).ravel().tolist()
    [-1.0, 0.0]
    >>> normal_rhs(np.array([0, 1]), np.array([1, 2]), np.array([1.0, 0.5]),
    ...            np.array([0, 1]), rhs, 2, column=np.array([0, 1, 2])).ravel().tolist()
    [-1.0, 0.0]
    """
    if out is None:
        out = np.zeros((n_unknown + 1, rhs.shape[1]))
    if isinstance(rhs, np.ndarray):
        if column is not None:
            source_column, target_column = column[source_column], column[target_column]
        _scatter(np.ascontiguousarray(source_column, dtype=np.int64),
                 np.ascontiguousarray(target_column, dtype=np.int64),
                 np.ascontiguousarray(weights, dtype=np.float64),
                 np.ascontiguousarray(kept, dtype=np.int64), np.ascontiguousarray(rhs), out)
        return out[:n_unknown]
    # rows formed when read (an object with rhs[rows]): a block of kept arcs at a time, each
    # added in the same order, so the sums are the array's to the bit
    kept = np.asarray(kept, dtype=np.int64)
    for first in range(0, kept.size, BLOCK):
        arcs = kept[first:first + BLOCK]
        sources, targets = source_column[arcs], target_column[arcs]
        if column is not None:
            sources, targets = column[sources], column[targets]
        _scatter(np.ascontiguousarray(sources, dtype=np.int64),
                 np.ascontiguousarray(targets, dtype=np.int64),
                 np.ascontiguousarray(weights[arcs], dtype=np.float64),
                 np.arange(arcs.size, dtype=np.int64), np.ascontiguousarray(rhs[arcs]), out)
    return out[:n_unknown]


def normal_matrix(source_column: np.ndarray, target_column: np.ndarray, weights: np.ndarray,
                  n_unknown: int) -> sp.csc_matrix:
    """The normal matrix ``A^T W A`` ``(n_unknown, n_unknown)`` of the arcs ``source_column ->
    target_column`` (each end's unknown, ``n_unknown`` for the reference) with ``weights``:
    SciPy's ``(A^T W @ A).tocsc()`` to the bit (the same entries, sums and order), from the
    arcs' ends in one pass, without the incidence matrix and its weighted transpose.

    Examples
    --------
    >>> normal_matrix(np.array([0, 1, 0]), np.array([1, 2, 2]), np.array([1.0, 2.0, 4.0]),
    ...               2).toarray().tolist()
    [[5.0, -1.0], [-1.0, 3.0]]
    """
    indptr, indices, data = _normal_matrix(
        np.ascontiguousarray(source_column, dtype=np.int64),
        np.ascontiguousarray(target_column, dtype=np.int64),
        np.ascontiguousarray(weights, dtype=np.float64), int(n_unknown))
    index = np.int32 if max(indices.size, n_unknown) < 2**31 else np.int64  # as SciPy's
    return sp.csc_matrix((data, indices.astype(index), indptr.astype(index)),
                         shape=(n_unknown, n_unknown))
