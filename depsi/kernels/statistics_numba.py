"""The NAD screen's float32 sums in one compiled pass (Numba).

:func:`depsi.kernels.statistics.nad_screen` needs, for every pixel, the sum of its amplitudes
and of their squares, to any order of summation and to a known relative error. In NumPy that
is ``|slc|`` into a buffer and two ``einsum`` passes over it; here each complex value is read
once, its squared modulus ``re² + im²`` and its square root summed at once, in float32 with
the additions reordered for SIMD (``fastmath={"reassoc"}``: NaN and infinity keep their
meaning). The terms differ from the squares and amplitudes of ``np.abs(slc)`` by a few units
of float32 rounding, which the screen's bound counts (:data:`TERM_ERROR`).
"""

from __future__ import annotations

import numpy as np

from depsi.kernels import numba_support
from depsi.kernels.numba_support import jit_cached, numba, sample_array

#: Whether the compiled kernel can run in this process.
AVAILABLE = numba is not None

#: Relative difference, in units of float32 rounding (2**-24), by which one term of
#: :func:`screen_sums` may differ from the amplitude (or its square) that ``np.abs`` gives:
#: ``re² + im²`` in float32 is the squared modulus to 2 units and its square root the modulus
#: to 1.5, while ``np.abs`` is within 1 unit (2 where it is only faithfully rounded) of the
#: modulus, so the square of its value is within 4; 8 covers both terms with room.
TERM_ERROR = 8


def _screen_sums(flat, total, total_sq):
    """``total[i] += sum_j |flat[i, j]|``, ``total_sq[i] += sum_j |flat[i, j]|²`` (float32,
    any order of summation)."""
    n_epochs = flat.shape[1]
    for i in range(flat.shape[0]):
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        for j in range(n_epochs):
            z = flat[i, j]
            q = z.real * z.real + z.imag * z.imag
            s2 += q
            s1 += np.sqrt(q)
        total[i] += s1
        total_sq[i] += s2


if AVAILABLE:
    _screen_sums = jit_cached(fastmath={"reassoc"})(_screen_sums)


def samples():
    """The kernel with arguments of the types the screen passes it (complex64 rows)."""
    f4 = np.float32
    return [(_screen_sums, (sample_array(np.complex64, 2), sample_array(f4, 1),
                            sample_array(f4, 1)))]


def ready() -> bool:
    """Whether :func:`screen_sums` runs compiled in this process
    (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


def screen_sums(pieces: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Float32 sums of the amplitudes and of their squares per pixel over complex64 time
    pieces ``(..., time)`` of one leading shape, flattened: ``(pixels,)`` each.

    Examples
    --------
    >>> total, total_sq = screen_sums([np.array([[3 + 4j, 0j]], dtype=np.complex64)])
    >>> total.tolist(), total_sq.tolist()
    ([5.0], [25.0])
    """
    n = int(np.prod(pieces[0].shape[:-1]))
    total, total_sq = np.zeros(n, np.float32), np.zeros(n, np.float32)
    for piece in pieces:
        _screen_sums(np.ascontiguousarray(piece.reshape(n, piece.shape[-1])), total, total_sq)
    return total, total_sq
