"""Range-Doppler geometry from orbit state vectors: geocoding, baselines, h2ph, line of sight.

A stack's geometry is its mother's radar grid (azimuth time of line 0, line interval, slant
range of pixel 0, range spacing) and one orbit per epoch. From them, for any pixel at a height:
its WGS84 position (zero-Doppler range-Doppler geocoding, exact on the ellipsoid), the
perpendicular and parallel baselines of every epoch, ``h2ph = -B_perp / (R sin(incidence))``, the
incidence angle, the heading and the line-of-sight unit vector (east, north, up, pointing from
the ground to the satellite). Every function works on whole arrays of points at once: Newton
iterations vectorised over points, no Python loop over points. The same laid on a raster stack
(h2ph and lat/lon rasters, :func:`~depsi.io.raster_geometry.attach_geometry`) is
:mod:`depsi.io.raster_geometry`.

Sign of ``h2ph``: ``h2ph = d(R_secondary - R_mother) / dh``, the change of the range difference
when a point is raised at a fixed pixel, ``= -B_perp / (R sin(incidence))`` with ``B_perp``
positive when the secondary lies above the mother's line of sight. It is SNAP's convention
(its ``h2ph`` band; measured on the real SNAP pair, ``tests/test_geometry.py``), per SLC.
The interferograms ``slc_mother * conj(slc)`` of :mod:`depsi.processing.interferogram` carry
``h2ph_mother - h2ph``, so that with SLC phases ``-4 pi R / wavelength`` a height error's
phase is ``m2ph * h2ph * height_error`` (``tests/test_sign.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from depsi.geometry.ellipsoid import (
    WGS84_A,
    WGS84_E2,
    ecef_to_geodetic,
    enu_basis,
    geodetic_to_ecef,
)
from depsi.geometry.orbit import Orbit, RadarGrid, StackGeometry

#: Newton iterations of geocoding and of the zero-Doppler time at most; each squares the error,
#: and they stop once every step is below CONVERGED_RADIANS (1e-12 rad: 6 um on the ground)
#: or CONVERGED_SECONDS (1e-9 s: 7 um along the orbit).
NEWTON_ITERATIONS = 8
CONVERGED_RADIANS = 1e-12
CONVERGED_SECONDS = 1e-9


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("...i,...i->...", a, b)


def zero_doppler_time(orbit: Orbit, target: np.ndarray, guess: Any = None) -> np.ndarray:
    """Seconds after ``orbit.reference`` at which ``target`` (ECEF ``(..., 3)``) is at zero
    Doppler, ``(target - P(t)) . V(t) = 0``, by Newton's method from ``guess``."""
    target = np.asarray(target, dtype=np.float64)
    if guess is None:
        t = _bracketed_start(orbit, target)
    else:
        t = np.broadcast_to(np.asarray(guess, np.float64), target.shape[:-1]).copy()
    for _ in range(NEWTON_ITERATIONS):
        position, velocity, acceleration = orbit.state(t)
        offset = target - position
        f = _dot(offset, velocity)
        slope = _dot(offset, acceleration) - _dot(velocity, velocity)
        step = f / slope
        t = t - step
        if not np.nanmax(np.abs(step), initial=0.0) > CONVERGED_SECONDS:
            break
    return t


#: State vectors probed per orbit to bracket a zero-Doppler time before Newton's method.
_BRACKET_PROBES = 64


def _bracketed_start(orbit: Orbit, target: np.ndarray) -> np.ndarray:
    """A start for Newton's method: the probe time nearest the Doppler's sign change, so that
    an orbit hours long (a whole precise-orbit file) converges as a short one does."""
    probes = orbit.time[:: max(1, orbit.time.size // _BRACKET_PROBES)]
    position, velocity, _ = orbit.state(probes)
    doppler = (np.einsum("...i,ki->...k", target, velocity)
               - np.einsum("ki,ki->k", position, velocity))
    return probes[np.argmin(np.abs(doppler), axis=-1)]


def pixel_time_range(grid: RadarGrid, orbit: Orbit, azimuth: Any, range_: Any
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Azimuth time (s after ``orbit.reference``) and slant range (m) of pixel indices."""
    t = orbit.seconds(grid.first_line_time) + np.asarray(azimuth, np.float64) * grid.line_interval
    r = grid.near_range + np.asarray(range_, np.float64) * grid.range_spacing
    return t, r


def _initial_target(position: np.ndarray, velocity: np.ndarray, slant_range: np.ndarray,
                    height: np.ndarray, look_side: str) -> np.ndarray:
    """A point at ``slant_range`` from the satellite, across track, on a sphere of the local
    Earth radius plus ``height``: the start of the geocoding iterations."""
    radius = np.linalg.norm(position, axis=-1)
    up = position / radius[..., None]
    along = velocity - _dot(velocity, up)[..., None] * up
    along /= np.linalg.norm(along, axis=-1)[..., None]
    side = np.cross(along, up)  # to the right of the track
    if look_side == "left":
        side = -side
    lat, _, _ = ecef_to_geodetic(position)
    phi = np.deg2rad(lat)
    earth = WGS84_A * np.sqrt((1 - WGS84_E2 * (2 - WGS84_E2) * np.sin(phi) ** 2)
                              / (1 - WGS84_E2 * np.sin(phi) ** 2))
    target_radius = earth + height
    cos_angle = (radius**2 + slant_range**2 - target_radius**2) / (2 * radius * slant_range)
    angle = np.arccos(np.clip(cos_angle, -1.0, 1.0))
    return position + slant_range[..., None] * (np.cos(angle)[..., None] * -up
                                                + np.sin(angle)[..., None] * side)


def radar_to_geo(geometry: StackGeometry, azimuth: Any, range_: Any, height: Any = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Latitude and longitude (WGS84 degrees) of pixels at ellipsoidal heights (m).

    Range-Doppler geocoding on the mother's orbit: the point at ``height`` on the WGS84
    ellipsoid whose zero-Doppler time is the pixel's azimuth time and whose distance from the
    satellite is the pixel's slant range, by Newton's method on latitude and longitude.

    Parameters
    ----------
    geometry
        The stack's geometry.
    azimuth, range_
        Pixel indices (fractional allowed), broadcast together.
    height
        Heights (m); default: ``geometry.height``.
    """
    grid, orbit = geometry.grid, geometry.mother_orbit
    azimuth, range_ = np.broadcast_arrays(np.asarray(azimuth, np.float64),
                                          np.asarray(range_, np.float64))
    h = np.broadcast_to(np.asarray(geometry.height if height is None else height, np.float64),
                        azimuth.shape)
    t, slant = pixel_time_range(grid, orbit, azimuth, range_)
    position, velocity, _ = orbit.state(t)
    lat, lon, _ = ecef_to_geodetic(_initial_target(position, velocity, slant, h,
                                                   grid.look_side))
    for _ in range(NEWTON_ITERATIONS):
        target = geodetic_to_ecef(lat, lon, h)
        offset = target - position
        distance = np.linalg.norm(offset, axis=-1)
        f_doppler = _dot(offset, velocity)
        f_range = distance - slant
        phi, lam = np.deg2rad(lat), np.deg2rad(lon)
        sin_phi = np.sin(phi)
        w = 1.0 - WGS84_E2 * sin_phi**2
        normal = WGS84_A / np.sqrt(w)
        meridian = WGS84_A * (1 - WGS84_E2) / w**1.5
        d_phi = (meridian + h)[..., None] * np.stack(
            [-sin_phi * np.cos(lam), -sin_phi * np.sin(lam), np.cos(phi)], axis=-1)
        d_lam = ((normal + h) * np.cos(phi))[..., None] * np.stack(
            [-np.sin(lam), np.cos(lam), np.zeros_like(lam)], axis=-1)
        unit = offset / distance[..., None]
        a11, a12 = _dot(velocity, d_phi), _dot(velocity, d_lam)
        a21, a22 = _dot(unit, d_phi), _dot(unit, d_lam)
        det = a11 * a22 - a12 * a21
        step_phi = (a22 * f_doppler - a12 * f_range) / det
        step_lam = (a11 * f_range - a21 * f_doppler) / det
        lat = lat - np.rad2deg(step_phi)
        lon = lon - np.rad2deg(step_lam)
        if not (np.nanmax(np.abs(step_phi), initial=0.0) > CONVERGED_RADIANS
                or np.nanmax(np.abs(step_lam), initial=0.0) > CONVERGED_RADIANS):
            break
    return lat, (lon + 180.0) % 360.0 - 180.0


def geo_to_radar(geometry: StackGeometry, lat: Any, lon: Any, height: Any = None, *,
                 epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fractional pixel indices (azimuth, range) of WGS84 points seen from one epoch's orbit
    (default the mother's), on the stack's radar grid."""
    orbit = geometry.orbits[geometry.mother if epoch is None else epoch]
    grid = geometry.grid
    h = geometry.height if height is None else height
    target = geodetic_to_ecef(lat, lon, h)
    t0 = orbit.seconds(grid.first_line_time)
    # a secondary's own acquisition is days away from the grid's time: start mid-orbit
    t = zero_doppler_time(orbit, target, guess=t0 if epoch in (None, geometry.mother) else None)
    position, _, _ = orbit.state(t)
    slant = np.linalg.norm(target - position, axis=-1)
    return (t - t0) / grid.line_interval, (slant - grid.near_range) / grid.range_spacing


def look_geometry(geometry: StackGeometry, azimuth: Any, range_: Any, height: Any = None
                  ) -> dict[str, np.ndarray]:
    """Per pixel: ``lat``, ``lon``, ``incidence`` (deg, from the local ellipsoid normal),
    ``heading`` (deg clockwise from north, of the flight direction), ``los_east``,
    ``los_north``, ``los_up`` (unit vector from the ground to the mother satellite) and
    ``slant_range`` (m)."""
    grid, orbit = geometry.grid, geometry.mother_orbit
    azimuth, range_ = np.broadcast_arrays(np.asarray(azimuth, np.float64),
                                          np.asarray(range_, np.float64))
    h = np.broadcast_to(np.asarray(geometry.height if height is None else height, np.float64),
                        azimuth.shape)
    lat, lon = radar_to_geo(geometry, azimuth, range_, h)
    target = geodetic_to_ecef(lat, lon, h)
    t, _ = pixel_time_range(grid, orbit, azimuth, range_)
    position, velocity, _ = orbit.state(t)
    to_satellite = position - target
    slant = np.linalg.norm(to_satellite, axis=-1)
    los = to_satellite / slant[..., None]
    east, north, up = enu_basis(lat, lon)
    los_enu = [_dot(los, e) for e in (east, north, up)]
    heading = np.rad2deg(np.arctan2(_dot(velocity, east), _dot(velocity, north)))
    return {"lat": lat, "lon": lon, "incidence": np.rad2deg(np.arccos(los_enu[2])),
            "heading": heading, "los_east": los_enu[0], "los_north": los_enu[1],
            "los_up": los_enu[2], "slant_range": slant}


def baselines(geometry: StackGeometry, azimuth: Any, range_: Any, height: Any = None
              ) -> dict[str, np.ndarray]:
    """Perpendicular and parallel baselines of every epoch to the mother, and ``h2ph``.

    For each pixel, geocoded at ``height`` on the mother's orbit, and each epoch: the
    secondary's position at its own zero-Doppler time of the point, the baseline
    ``B = P_secondary - P_mother``, ``bpar = R_mother - R_secondary`` (the range difference,
    m) and ``bperp`` the component of ``B`` perpendicular to the mother's line of sight in the
    zero-Doppler plane, positive when the secondary is further from the Earth than the line of
    sight (above it), as SNAP's ``Perp Baseline``. ``h2ph = -bperp / (R_mother sin(incidence))``
    is the change of ``R_secondary - R_mother`` per metre of height at a fixed pixel, SNAP's
    sign, per SLC (the interferograms ``slc_mother * conj(slc)`` carry ``h2ph_mother - h2ph``,
    :mod:`depsi.processing.interferogram`).

    Returns
    -------
    dict
        ``bperp``, ``bpar``, ``h2ph`` with the pixels' shape plus a trailing epoch axis, and
        the mother's ``incidence`` (deg) and ``slant_range`` (m) per pixel.
    """
    grid, mother = geometry.grid, geometry.mother_orbit
    azimuth, range_ = np.broadcast_arrays(np.asarray(azimuth, np.float64),
                                          np.asarray(range_, np.float64))
    h = np.broadcast_to(np.asarray(geometry.height if height is None else height, np.float64),
                        azimuth.shape)
    lat, lon = radar_to_geo(geometry, azimuth, range_, h)
    target = geodetic_to_ecef(lat, lon, h)
    t_m, _ = pixel_time_range(grid, mother, azimuth, range_)
    p_m, v_m, _ = mother.state(t_m)
    look = target - p_m
    r_m = np.linalg.norm(look, axis=-1)
    look /= r_m[..., None]
    # perpendicular to the line of sight in the zero-Doppler plane, pointing away from Earth
    normal = np.cross(v_m, look)
    normal /= np.linalg.norm(normal, axis=-1)[..., None]
    normal *= np.sign(_dot(normal, p_m))[..., None]
    _, _, up = enu_basis(lat, lon)
    incidence = np.arccos(_dot(-look, up))
    bperp_columns: list[np.ndarray] = []
    bpar_columns: list[np.ndarray] = []
    for k, orbit in enumerate(geometry.orbits):
        if k == geometry.mother:
            bperp_columns.append(np.zeros_like(r_m))
            bpar_columns.append(np.zeros_like(r_m))
            continue
        t_k = zero_doppler_time(orbit, target)
        p_k, _, _ = orbit.state(t_k)
        base = p_k - p_m
        bperp_columns.append(_dot(base, normal))
        bpar_columns.append(r_m - np.linalg.norm(target - p_k, axis=-1))
    bperp = np.stack(bperp_columns, axis=-1)
    bpar = np.stack(bpar_columns, axis=-1)
    h2ph = -bperp / (r_m * np.sin(incidence))[..., None]
    return {"bperp": bperp, "bpar": bpar, "h2ph": h2ph, "incidence": np.rad2deg(incidence),
            "slant_range": r_m}
