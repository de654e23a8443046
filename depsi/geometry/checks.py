"""Checks that refuse a geometry no acquisition could have: orbits that miss their epochs, a
radar grid and orbits that image no possible scene."""

from __future__ import annotations

from typing import Any

import numpy as np

from depsi.geometry.orbit import GeometryError, StackGeometry
from depsi.geometry.range_doppler import look_geometry

#: Incidence angles (deg) a spaceborne SAR images at: every mission's swaths lie within
#: about 10-65 deg (Sentinel-1 29-46, TerraSAR-X 15-60, RADARSAT-2 10-60, ALOS-2 8-70 at its
#: extremes); outside this range a radar grid or orbit is wrong, not the sensor unusual.
INCIDENCE_RANGE = (5.0, 75.0)
#: Largest distance (m) between a scene corner geocoded from the orbits and the product's own
#: lat/lon there: terrain height moves a corner by height / tan(incidence) (a few km at most),
#: the wrong look side or grid by hundreds of kilometres.
CORNER_TOLERANCE = 20e3

#: Slack (hours) around an epoch's date within which its state vectors must lie: an
#: acquisition that starts just before midnight UTC carries the next day's date in some products.
ACQUISITION_SLACK_HOURS = 2


def check_orbits_cover_epochs(geometry: StackGeometry, times: Any, *, source: str = "stack"
                              ) -> None:
    """Refuse a geometry whose epoch's orbit does not cover that epoch's acquisition.

    ``times`` are the stack's epochs in the order of ``geometry.orbits``: a date (midnight) says
    the acquisition lies within that UTC day, a time of day says when it happened. Each orbit's
    state vectors must reach that day (within :data:`ACQUISITION_SLACK_HOURS`), or that moment
    (within two state-vector intervals, as far as :meth:`Orbit.state` extrapolates).

    Raises
    ------
    GeometryError
        Naming the source, the epoch, its orbit's time span and the acquisition expected.
    """
    times = np.asarray(times).astype("datetime64[ns]")
    if len(times) != len(geometry.orbits):
        raise GeometryError(f"{source}: expected one orbit per epoch ({len(times)}), found "
                            f"{len(geometry.orbits)}")
    slack = np.timedelta64(ACQUISITION_SLACK_HOURS, "h")
    for k, (moment, orbit) in enumerate(zip(times, geometry.orbits)):
        first, last = orbit.span
        day = moment.astype("datetime64[D]").astype("datetime64[ns]")
        if moment == day:
            start, end = day - slack, day + np.timedelta64(1, "D") + slack
            expected = f"the epoch's acquisition day {day.astype('datetime64[D]')}"
        else:
            margin = np.timedelta64(int(2e9 * float(np.median(np.diff(orbit.time)))), "ns")
            start, end = moment - margin, moment + margin
            expected = f"the epoch's acquisition at {moment}"
        if last < start or first > end:
            raise GeometryError(f"{source}: epoch {k} ({moment.astype('datetime64[D]')}), "
                                f"orbit {orbit.source}: expected state vectors covering "
                                f"{expected}, found them from {first} to {last}")


def check_scene_geometry(geometry: StackGeometry, azimuth: Any, range_: Any, *,
                         lat: Any = None, lon: Any = None, source: str = "stack") -> None:
    """Refuse a radar grid and orbits that image no possible scene, naming what is wrong.

    At the scene's corners (``azimuth``, ``range_``: their pixel coordinates on the radar
    grid, ``(4,)`` arrays in the order first line near range, first line far range, last line
    near range, last line far range): the incidence must be within :data:`INCIDENCE_RANGE`;
    with the product's own ``lat``/``lon`` at those corners, each corner geocoded from the
    orbits must lie within :data:`CORNER_TOLERANCE` of them, which a wrong look side or a grid
    of another product does not.

    Examples
    --------
    >>> from depsi.simulate import simulate_stack
    >>> from depsi.simulate.scene import simulated_geometry
    >>> stack, _ = simulate_stack(shape=(50, 60), n_epochs=4)
    >>> geometry = simulated_geometry(stack)
    >>> azimuth, range_ = [0, 0, 49, 49], [0, 59, 0, 59]
    >>> check_scene_geometry(geometry, azimuth, range_)
    >>> from depsi.geometry.orbit import RadarGrid
    >>> far = RadarGrid(**{**geometry.grid.to_dict(), "near_range": 4.5e6})
    >>> check_scene_geometry(StackGeometry(far, geometry.orbits, geometry.mother,
    ...                      geometry.wavelength), azimuth, range_)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    depsi.geometry.orbit.GeometryError: stack: radar grid (near_range 4500000 m, ...: expected ...
    """
    azimuth = np.asarray(azimuth, np.float64)
    range_ = np.asarray(range_, np.float64)
    look = look_geometry(geometry, azimuth, range_)
    low, high = INCIDENCE_RANGE
    incidence = look["incidence"]
    if not (np.isfinite(incidence).all() and (incidence >= low).all()
            and (incidence <= high).all()):
        grid = geometry.grid
        raise GeometryError(
            f"{source}: radar grid (near_range {grid.near_range:.0f} m, range_spacing "
            f"{grid.range_spacing:g} m, range pixels {range_.min():.0f}-{range_.max():.0f}) "
            "and the mother orbit "
            f"({geometry.mother_orbit.source}): expected incidence angles within {low:g}-"
            f"{high:g} deg at the scene's corners, found {np.nanmin(incidence):.1f}-"
            f"{np.nanmax(incidence):.1f} deg")
    if lat is None or lon is None:
        return
    lat, lon = np.asarray(lat, np.float64), np.asarray(lon, np.float64)
    given = np.isfinite(lat) & np.isfinite(lon)
    if not given.any():
        return
    # great-circle distance on a sphere of the Earth's mean radius: a check at kilometres
    phi1, phi2 = np.radians(look["lat"]), np.radians(lat)
    dphi, dlam = phi2 - phi1, np.radians(lon - look["lon"])
    chord = np.sin(dphi / 2) ** 2 + np.cos(phi1) * np.cos(phi2) * np.sin(dlam / 2) ** 2
    distance = 2 * 6_371_000.0 * np.arcsin(np.sqrt(np.clip(chord, 0.0, 1.0)))
    worst = int(np.nanargmax(np.where(given, distance, -1.0)))
    if distance[worst] > CORNER_TOLERANCE:
        corner = ("first line, near range", "first line, far range", "last line, near range",
                  "last line, far range")[worst]
        raise GeometryError(
            f"{source}: the scene's corner ({corner}) geocoded from the orbits and the radar "
            f"grid (look_side {geometry.grid.look_side!r}) is at lat {look['lat'][worst]:.4f}, "
            f"lon {look['lon'][worst]:.4f}; the product's lat/lon there is {lat[worst]:.4f}, "
            f"{lon[worst]:.4f}: expected them within {CORNER_TOLERANCE / 1e3:g} km, found "
            f"{distance[worst] / 1e3:.1f} km apart (another look side, grid or orbit?)")
