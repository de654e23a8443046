"""The w-test's largest misclosure of each arc in one compiled pass (Numba).

For each arc, ``|y - (x_target - x_source)|`` in float32 over its columns (velocity, height,
each epoch's phase), each divided by its standard deviation in float64, and the largest of
the three: :func:`depsi.processing.arc_testing._largest_misclosure`'s statistic. NumPy needs
a gather of both ends' rows, their casts and three passes over an ``(arcs, columns)`` buffer
(a quarter of a tile's w-test); here each arc's row is read once. The operations are NumPy's
in the same precision and order (float32 differences, float64 quotients, NaN wherever a
misclosure or quotient is NaN), so the result is its to the bit.
"""

from __future__ import annotations

import numpy as np

from depsi.kernels import numba_support
from depsi.kernels.numba_support import jit_cached, numba, sample_array

#: Whether the compiled kernel can run in this process.
AVAILABLE = numba is not None


def _largest(values, source, target, rhs, sd_velocity, sd_height, sd_phase, out):
    """``out[i]``: arc ``i``'s largest misclosure over its standard deviation (NaN where
    any is NaN, as ``np.maximum`` and ``max`` give it)."""
    n_columns = rhs.shape[1]
    row = np.empty(n_columns, np.float32)
    # the phases' largest |misclosure| by its bits: a float32 without its sign bit orders as
    # its bits do, and a NaN's are above infinity's, so the integer maximum is NumPy's max
    # (NaN where any is) in a loop that vectorises
    bits = row.view(np.int32)
    for i in range(source.shape[0]):
        s, t = source[i], target[i]
        for c in range(n_columns):
            row[c] = rhs[i, c] - (np.float32(values[t, c]) - np.float32(values[s, c]))
        phase = np.int32(0)
        for c in range(2, n_columns):
            phase = max(phase, bits[c] & np.int32(0x7FFFFFFF))
        largest = np.float64(abs(row[0])) / sd_velocity[i]
        quotient = np.float64(abs(row[1])) / sd_height[i]
        if not quotient <= largest:  # NaN in either is kept, as np.maximum keeps it
            largest = quotient if largest == largest else largest
        bits[0] = phase
        quotient = np.float64(row[0]) / sd_phase[i]
        if not quotient <= largest:
            largest = quotient if largest == largest else largest
        out[i] = largest


if AVAILABLE:
    # NumPy's division (x / 0 is inf or NaN), not Python's ZeroDivisionError
    _largest = jit_cached(error_model="numpy")(_largest)


def samples():
    """The kernel with arguments of the types the w-test passes it (float64 values, float32
    right-hand sides)."""
    i8, f8 = np.int64, np.float64
    return [(_largest, (sample_array(f8, 2), sample_array(i8, 1), sample_array(i8, 1),
                        sample_array(np.float32, 2), sample_array(f8, 1), sample_array(f8, 1),
                        sample_array(f8, 1), sample_array(f8, 1)))]


def ready() -> bool:
    """Whether :func:`largest_misclosure` runs compiled in this process
    (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


def largest_misclosure(values: np.ndarray, source: np.ndarray, target: np.ndarray,
                       rhs: np.ndarray, sd_velocity: np.ndarray, sd_height: np.ndarray,
                       sd_phase: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Into ``out`` (float64 ``(arcs,)``): each arc's largest misclosure over its standard
    deviation, for the arcs ``source -> target`` with right-hand sides ``rhs`` (float32
    ``(arcs, columns)``, columns velocity, height, then phases) and the points' ``values``
    (float64 ``(points, columns)``); each standard deviation a float64 ``(arcs,)``.

    Examples
    --------
    >>> values = np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    >>> rhs = np.array([[1.5, 2.0, 1.0]], dtype=np.float32)
    >>> one = np.ones(1)
    >>> largest_misclosure(values, np.array([0]), np.array([1]), rhs, one, one, 0.5 * one,
    ...                    np.empty(1)).tolist()
    [4.0]
    """
    _largest(np.ascontiguousarray(values, dtype=np.float64),
             np.ascontiguousarray(source, dtype=np.int64),
             np.ascontiguousarray(target, dtype=np.int64), np.ascontiguousarray(rhs),
             np.ascontiguousarray(sd_velocity, dtype=np.float64),
             np.ascontiguousarray(sd_height, dtype=np.float64),
             np.ascontiguousarray(sd_phase, dtype=np.float64), out)
    return out
