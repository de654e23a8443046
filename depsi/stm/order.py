"""Spatial order of points: Morton (Z-order) keys of (azimuth, range).

Storing space in Morton order makes every space chunk a compact patch of the scene, so neighbour
searches and spatial filters touch few chunks (docs/design.md, "Data model").
"""

from __future__ import annotations

import numpy as np

_MAX_COORD = 2**32


def _spread_bits(values: np.ndarray) -> np.ndarray:
    """Insert a zero bit between each of the low 32 bits of ``values`` (uint64)."""
    v = values.astype(np.uint64) & np.uint64(0xFFFFFFFF)
    v = (v | (v << np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    v = (v | (v << np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    v = (v | (v << np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    v = (v | (v << np.uint64(2))) & np.uint64(0x3333333333333333)
    v = (v | (v << np.uint64(1))) & np.uint64(0x5555555555555555)
    return v


def morton_key(azimuth, range_) -> np.ndarray:
    """Morton key (uint64) interleaving the bits of integer ``azimuth`` and ``range_``.

    Azimuth takes the odd bits, range the even bits. Values must be integers in [0, 2**32).

    Examples
    --------
    >>> morton_key([0, 0, 1, 1], [0, 1, 0, 1]).tolist()
    [0, 1, 2, 3]
    """
    az = np.asarray(azimuth)
    rg = np.asarray(range_)
    for name, values in (("azimuth", az), ("range", rg)):
        if values.size and values.dtype.kind == "f" and not np.isfinite(values).all():
            raise ValueError(f"{name}: expected finite pixel indices, found NaN/inf")
        if values.size and (values.min() < 0 or values.max() >= _MAX_COORD):
            raise ValueError(
                f"{name}: expected pixel indices in [0, 2**32), found range "
                f"[{values.min()}, {values.max()}]"
            )
    return (_spread_bits(az) << np.uint64(1)) | _spread_bits(rg)


def morton_order(azimuth, range_) -> np.ndarray:
    """Indices that sort points into Morton order of (azimuth, range); stable for ties."""
    return np.argsort(morton_key(azimuth, range_), kind="stable")
