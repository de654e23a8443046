"""The arcs' right-hand sides formed from their points' phases in one compiled pass (Numba).

Integration keeps each arc's observations as its velocity and height, its cycles and the
points' wrapped phases (:class:`depsi.processing.integration.ArcRightHandSides`) and forms a
row when it is read: ``[velocity, height, float32(2 pi cycles) + wrap(phase[target] -
phase[source])]``. In NumPy that is a gather of both points' rows and eight passes over the
block (the wrap's rounding, comparisons and corrections, the cycles' product, the sum); here
each arc's row is formed in one pass, with NumPy's float32 operations in NumPy's order, so the
rows are the reference's to the bit (:func:`form_rows_reference`, the namespace path kept
beside it and held to it by a test).
"""

from __future__ import annotations

import numpy as np

from depsi.conventions import wrap_phase
from depsi.kernels import numba_support
from depsi.kernels.numba_support import jit_cached, numba, sample_array

#: Whether the compiled kernel can run in this process.
AVAILABLE = numba is not None

_TWO_PI = 2.0 * np.pi


def _form(phase, source, target, rows, motion, cycles, out):
    """``out[i] = [motion[r], float32(2 pi cycles[r]) + wrap(phase[t] - phase[s])]`` for each
    ``r = rows[i]`` (float32; the wrap as :func:`depsi.conventions.wrap_phase` computes it in
    float32: its constants rounded to float32, as NumPy rounds a Python float against a float32
    array)."""
    inverse = np.float32(1.0 / _TWO_PI)
    cycle = np.float32(_TWO_PI)
    low, high = np.float32(-np.pi), np.float32(np.pi)
    one, zero = np.float32(1.0), np.float32(0.0)
    n_epochs = phase.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        s, t = source[r], target[r]
        out[i, 0] = motion[r, 0]
        out[i, 1] = motion[r, 1]
        for e in range(n_epochs):
            d = phase[t, e] - phase[s, e]
            wrapped = d - np.rint(d * inverse) * cycle
            moved = (one if wrapped <= low else zero) - (one if wrapped > high else zero)
            wrapped = wrapped + moved * cycle
            out[i, 2 + e] = np.float32(np.float64(cycles[r, e]) * _TWO_PI) + wrapped


if AVAILABLE:
    _form = jit_cached(_form)


def samples():
    """The kernel with arguments of the types integration passes it (the phases float32, the
    cycles int8)."""
    f4, i8 = np.float32, np.int64
    return [(_form, (sample_array(f4, 2), sample_array(i8, 1), sample_array(i8, 1),
                     sample_array(i8, 1), sample_array(f4, 2), sample_array(np.int8, 2),
                     sample_array(f4, 2)))]


def ready() -> bool:
    """Whether :func:`form_rows` runs compiled in this process (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


def form_rows(phase: np.ndarray, source: np.ndarray, target: np.ndarray, rows: np.ndarray,
              motion: np.ndarray, cycles: np.ndarray) -> np.ndarray:
    """The right-hand sides of the arcs ``rows`` (indices into ``source``, ``target``,
    ``motion`` ``(arcs, 2)`` float32 and ``cycles`` ``(arcs, epochs)`` integers) from the
    points' float32 ``phase`` ``(points, epochs)``: float32 ``(rows, 2 + epochs)``.

    Examples
    --------
    >>> phase = np.array([[0.5, -3.0], [-0.5, 3.0]], np.float32)
    >>> out = form_rows(phase, np.array([0]), np.array([1]), np.array([0]),
    ...                 np.array([[1.0, 2.0]], np.float32), np.array([[1, 0]], np.int8))
    >>> out.astype(np.float64).round(4).tolist()
    [[1.0, 2.0, 5.2832, -0.2832]]
    """
    out = np.empty((rows.shape[0], 2 + phase.shape[1]), np.float32)
    _form(phase, source, target, np.ascontiguousarray(rows, dtype=np.int64), motion, cycles, out)
    return out


def form_rows_reference(phase, source, target, rows, motion, cycles) -> np.ndarray:
    """:func:`form_rows` in NumPy (the reference; where Numba is not)."""
    out = np.empty((len(rows), 2 + phase.shape[1]), np.float32)
    out[:, :2] = motion[rows]
    # 2 pi times the cycles (in float64) to float32, then the float32 arc phase added
    np.multiply(cycles[rows], _TWO_PI, out=out[:, 2:])
    out[:, 2:] += wrap_phase(phase[target[rows]] - phase[source[rows]]).astype(np.float32,
                                                                               copy=False)
    return out
