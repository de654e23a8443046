"""Per-problem quality flags shared by every batched kernel.

A kernel returns one integer code per problem (point, arc, pixel) instead of raising for the
batch, so one bad problem never spoils the others. One code per problem; when several apply,
the lowest non-zero code in the list below that applies wins (the most severe one first).
"""

from __future__ import annotations

from enum import IntEnum


class Flag(IntEnum):
    """Codes of the ``flag`` arrays kernels return (stored as ``int8``).

    ======================  ====  ===============================================================
    name                    code  meaning
    ======================  ====  ===============================================================
    OK                      0     solved; every output valid
    RANK_DEFICIENT          1     design singular or condition number above ``1/rcond`` for the
                                  observations present; estimates NaN
    TOO_FEW_OBSERVATIONS    2     fewer valid observations than unknowns; estimates NaN
    NO_REDUNDANCY           3     exactly as many observations as unknowns: estimates valid, but
                                  the a-posteriori variance (and what scales with it) is NaN
    DISCONNECTED            4     (network inversion) some epochs are not connected to the
                                  reference epoch; those epochs are NaN, the others valid
    GRID_ONLY               5     (periodogram) the refinement did not raise the coherence; the
                                  best coarse-grid node is returned, valid to the grid step
    ======================  ====  ===============================================================

    Examples
    --------
    >>> Flag(2).name
    'TOO_FEW_OBSERVATIONS'
    >>> int(Flag.OK)
    0
    """

    OK = 0
    RANK_DEFICIENT = 1
    TOO_FEW_OBSERVATIONS = 2
    NO_REDUNDANCY = 3
    DISCONNECTED = 4
    GRID_ONLY = 5


#: dtype of every ``flag`` array.
FLAG_DTYPE = "int8"
