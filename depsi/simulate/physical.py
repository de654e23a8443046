"""SLC values computed from the orbits alone, ``exp(-4 pi i R / wavelength)``: the sign reference.

:mod:`depsi.simulate.scene` builds its SLCs from depsi's own phase model, so a stack simulated
there agrees with the chain's sign by construction, right or wrong. Here nothing of the phase
model is used: a target is placed on the WGS84 ellipsoid at a pixel and a height
(:func:`~depsi.geometry.radar_to_geo`), moved along its line of sight towards the mother's
satellite by a displacement, and its SLC value at each epoch is ``exp(-4 pi i R_t /
wavelength)`` with ``R_t`` the distance from that epoch's satellite at its own zero-Doppler
time (:func:`~depsi.geometry.zero_doppler_time`) to the moved target: the SLC phase of ESA's
Sentinel-1 products, ISCE2, SNAP, GAMMA and DORIS (docs/concepts.md, "Phase model and sign
convention"). A chain that reads these SLCs must find the displacement with its sign (positive
towards the satellite) and the height it was given.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depsi.geometry import (
    StackGeometry,
    baselines,
    geodetic_to_ecef,
    look_geometry,
    radar_to_geo,
    zero_doppler_time,
)


def orbit_slcs(geometry: StackGeometry, azimuth: Any, range_: Any, height: Any,
               displacement: Any, *, reference_phase_removed: bool = True) -> np.ndarray:
    """SLC values ``exp(-4 pi i R / wavelength)`` of point targets, from the orbits alone.

    Parameters
    ----------
    geometry
        The stack's radar grid, orbits (one per epoch) and wavelength.
    azimuth, range_
        The targets' pixels (1-D, one per target).
    height
        The targets' heights above the ellipsoid (m), per target or one for all.
    displacement
        ``(target, epoch)``: each target's motion along its line of sight, positive towards
        the mother's satellite (m).
    reference_phase_removed
        Subtract from each range that of the pixel's point on the ellipsoid (height 0) at the
        same epoch: the reference ("flat-Earth") phase that DORIS, SNAP, ISCE2 and GAMMA remove
        from co-registered SLCs or their interferograms, computed from the same orbits. Without
        it the values carry the whole range, and an interferogram's phase the parallel
        baseline (hundreds of cycles across a scene).

    Returns
    -------
    numpy.ndarray
        complex128 ``(target, epoch)``, of modulus one.
    """
    azimuth = np.asarray(azimuth, np.float64)
    range_ = np.asarray(range_, np.float64)
    height = np.broadcast_to(np.asarray(height, np.float64), azimuth.shape)
    displacement = np.asarray(displacement, np.float64)
    lat, lon = radar_to_geo(geometry, azimuth, range_, height)
    target = geodetic_to_ecef(lat, lon, height)
    look = look_geometry(geometry, azimuth, range_, height)
    los = _enu_to_ecef(lat, lon, look["los_east"], look["los_north"], look["los_up"])
    surface = geodetic_to_ecef(*radar_to_geo(geometry, azimuth, range_, 0.0), 0.0)
    ranges = np.empty(displacement.shape)
    for epoch, orbit in enumerate(geometry.orbits):  # one orbit per epoch; points vectorised
        moved = target + displacement[:, epoch, None] * los
        position, _, _ = orbit.state(zero_doppler_time(orbit, moved))
        ranges[:, epoch] = np.linalg.norm(moved - position, axis=-1)
        if reference_phase_removed:
            position, _, _ = orbit.state(zero_doppler_time(orbit, surface))
            ranges[:, epoch] -= np.linalg.norm(surface - position, axis=-1)
    return np.exp(-4j * np.pi * ranges / geometry.wavelength)


def _enu_to_ecef(lat, lon, east, north, up) -> np.ndarray:
    from depsi.geometry import enu_basis

    e, n, u = enu_basis(lat, lon)
    return east[..., None] * e + north[..., None] * n + up[..., None] * u


def orbit_points(geometry: StackGeometry, azimuth: Any, range_: Any, height: Any,
                 velocity: Any, times: Any) -> xr.Dataset:
    """A point STM of :func:`orbit_slcs` targets moving at constant velocities.

    ``complex`` (complex64), ``h2ph`` (SNAP's per-SLC sign, from
    :func:`~depsi.geometry.baselines` at height 0: the targets' heights are height errors
    against it), ``azimuth``, ``range``, ``lat``, ``lon`` and the attributes ``wavelength`` and
    ``mother_time``; ``times`` are the epochs' dates (one per orbit), ``velocity`` m/yr towards
    the satellite, counted from the mother epoch.
    """
    from depsi.conventions import years_since

    times = np.asarray(times, "datetime64[ns]")
    azimuth = np.asarray(azimuth, np.float64)
    range_ = np.asarray(range_, np.float64)
    years = years_since(times, times[geometry.mother])
    displacement = np.asarray(velocity, np.float64)[:, None] * years[None, :]
    slc = orbit_slcs(geometry, azimuth, range_, height, displacement)
    h2ph = baselines(geometry, azimuth, range_, 0.0)["h2ph"]
    lat, lon = radar_to_geo(geometry, azimuth, range_, 0.0)
    return xr.Dataset(
        {"complex": (("space", "time"), slc.astype(np.complex64)),
         "h2ph": (("space", "time"), h2ph.astype(np.float32))},
        coords={"time": times, "azimuth": ("space", azimuth.astype(np.int64)),
                "range": ("space", range_.astype(np.int64)),
                "lat": ("space", lat), "lon": ("space", lon)},
        attrs={"wavelength": geometry.wavelength,
               "mother_time": str(np.datetime_as_string(times[geometry.mother], unit="s"))})


__all__ = ["orbit_points", "orbit_slcs"]
