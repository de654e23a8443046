"""The WGS84 ellipsoid: geodetic coordinates to Earth-fixed (ECEF) ones and back, and the
local east/north/up basis, on whole arrays of points."""

from __future__ import annotations

from typing import Any

import numpy as np

#: WGS84 ellipsoid: semi-major axis (m) and flattening.
WGS84_A = 6378137.0
WGS84_F = 1.0 / 298.257223563
WGS84_E2 = WGS84_F * (2.0 - WGS84_F)


def geodetic_to_ecef(lat: Any, lon: Any, height: Any) -> np.ndarray:
    """WGS84 latitude, longitude (degrees) and ellipsoidal height (m) to ECEF ``(..., 3)`` m.

    Examples
    --------
    >>> geodetic_to_ecef(0.0, 0.0, 0.0).tolist()
    [6378137.0, 0.0, 0.0]
    """
    phi, lam = np.deg2rad(lat), np.deg2rad(lon)
    height = np.asarray(height, dtype=np.float64)
    sin_phi = np.sin(phi)
    normal = WGS84_A / np.sqrt(1.0 - WGS84_E2 * sin_phi**2)
    return np.stack([(normal + height) * np.cos(phi) * np.cos(lam),
                     (normal + height) * np.cos(phi) * np.sin(lam),
                     (normal * (1.0 - WGS84_E2) + height) * sin_phi], axis=-1)


def ecef_to_geodetic(xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ECEF ``(..., 3)`` m to WGS84 latitude, longitude (degrees) and height (m).

    Iterated to below 1e-12 rad (well under a millimetre) for any point near the Earth.

    Examples
    --------
    >>> lat, lon, h = ecef_to_geodetic(geodetic_to_ecef(52.0, 4.9, 30.0))
    >>> round(float(lat), 9), round(float(lon), 9), round(float(h), 6)
    (52.0, 4.9, 30.0)
    """
    xyz = np.asarray(xyz, dtype=np.float64)
    x, y, z = xyz[..., 0], xyz[..., 1], xyz[..., 2]
    p = np.hypot(x, y)
    lon = np.arctan2(y, x)
    phi = np.arctan2(z, p * (1.0 - WGS84_E2))
    for _ in range(6):
        normal = WGS84_A / np.sqrt(1.0 - WGS84_E2 * np.sin(phi) ** 2)
        height = p / np.cos(phi) - normal
        phi = np.arctan2(z, p * (1.0 - WGS84_E2 * normal / (normal + height)))
    normal = WGS84_A / np.sqrt(1.0 - WGS84_E2 * np.sin(phi) ** 2)
    height = p * np.cos(phi) + z * np.sin(phi) - normal * (1.0 - WGS84_E2 * np.sin(phi) ** 2)
    return np.rad2deg(phi), np.rad2deg(lon), height


def enu_basis(lat: Any, lon: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Local east, north and up unit vectors (ECEF, ``(..., 3)``) at geodetic lat/lon."""
    phi, lam = np.deg2rad(lat), np.deg2rad(lon)
    zero = np.zeros_like(phi)
    east = np.stack([-np.sin(lam), np.cos(lam), zero], axis=-1)
    north = np.stack([-np.sin(phi) * np.cos(lam), -np.sin(phi) * np.sin(lam), np.cos(phi)],
                     axis=-1)
    up = np.stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)], axis=-1)
    return east, north, up
