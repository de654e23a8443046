"""SAR imaging geometry from orbit state vectors: range-Doppler geocoding, baselines, h2ph, LOS.

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

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import xarray as xr
from scipy.interpolate import CubicHermiteSpline, CubicSpline

from depsi.errors import BadInputError

logger = logging.getLogger(__name__)

#: WGS84 ellipsoid: semi-major axis (m) and flattening.
WGS84_A = 6378137.0
WGS84_F = 1.0 / 298.257223563
WGS84_E2 = WGS84_F * (2.0 - WGS84_F)

#: Plausible distance of a SAR satellite from the Earth's centre (m): low orbits to 2000 km.
ORBIT_RADIUS_RANGE = (6.5e6, 8.5e6)
#: Incidence angles (deg) a spaceborne SAR images at: every mission's swaths lie within
#: about 10-65 deg (Sentinel-1 29-46, TerraSAR-X 15-60, RADARSAT-2 10-60, ALOS-2 8-70 at its
#: extremes); outside this range a radar grid or orbit is wrong, not the sensor unusual.
INCIDENCE_RANGE = (5.0, 75.0)
#: Largest distance (m) between a scene corner geocoded from the orbits and the product's own
#: lat/lon there: terrain height moves a corner by height / tan(incidence) (a few km at most),
#: the wrong look side or grid by hundreds of kilometres.
CORNER_TOLERANCE = 20e3
#: Newton iterations of geocoding and of the zero-Doppler time at most; each squares the error,
#: and they stop once every step is below CONVERGED_RADIANS (1e-12 rad: 6 um on the ground)
#: or CONVERGED_SECONDS (1e-9 s: 7 um along the orbit).
NEWTON_ITERATIONS = 8
CONVERGED_RADIANS = 1e-12
CONVERGED_SECONDS = 1e-9
#: Attribute under which a stack or STM carries its geometry (a JSON string).
GEOMETRY_ATTR = "sar_geometry"
#: Attribute saying a stack's lat/lon rasters are computed from its orbits (``"orbits"``):
#: selection then geocodes only the selected points instead of reading them.
POSITIONS_ATTR = "positions_from"

LookSide = Literal["right", "left"]
GeometryMode = Literal["product", "orbits"]


class GeometryError(BadInputError, ValueError):
    """A geometry field is missing or impossible; the message names the source and the field."""


def _seconds(moment: Any, reference: np.datetime64) -> float:
    # numpy's stubs type datetime64 - datetime64 as datetime.timedelta, not timedelta64
    elapsed = np.datetime64(moment, "ns") - reference
    return float(elapsed / np.timedelta64(1, "ns")) * 1e-9  # type: ignore[operator]


# ----------------------------------------------------------------------------------------------
# The data model: orbits, the radar grid, a stack's geometry
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Orbit:
    """State vectors of one acquisition, Earth-fixed (ECEF, WGS84).

    Parameters
    ----------
    reference
        UTC time that ``time`` counts from.
    time
        ``(n,)`` seconds after ``reference``, strictly increasing, at least 4 vectors.
    position
        ``(n, 3)`` m.
    velocity
        ``(n, 3)`` m/s, or None (then a cubic spline of the positions gives them).
    source
        Where the vectors were read (named in errors).
    """

    reference: np.datetime64
    time: np.ndarray
    position: np.ndarray
    velocity: np.ndarray | None = None
    source: str = "orbit"
    _splines: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # numpy's stubs lack datetime64(datetime64, unit)
        reference = np.datetime64(self.reference, "ns")  # type: ignore[call-overload]
        time = np.asarray(self.time, dtype=np.float64).ravel()
        position = np.asarray(self.position, dtype=np.float64)
        velocity = None if self.velocity is None else np.asarray(self.velocity, np.float64)
        where = f"{self.source}: state vectors"
        if position.shape != (time.size, 3):
            raise GeometryError(f"{where}: expected positions of shape ({time.size}, 3) (one "
                                f"X, Y, Z per time), found {position.shape}")
        if velocity is not None and velocity.shape != position.shape:
            raise GeometryError(f"{where}: expected velocities of shape {position.shape}, "
                                f"found {velocity.shape}")
        if time.size < 4:
            raise GeometryError(f"{where}: expected at least 4 state vectors, found "
                                f"{time.size}")
        if not (np.isfinite(time).all() and np.isfinite(position).all()
                and (velocity is None or np.isfinite(velocity).all())):
            raise GeometryError(f"{where}: expected finite times, positions and velocities, "
                                "found NaN or inf")
        if (np.diff(time) <= 0).any():
            raise GeometryError(f"{where}: expected strictly increasing times, found "
                                f"{time[:6].tolist()}...")
        radius = np.linalg.norm(position, axis=1)
        if radius.min() < ORBIT_RADIUS_RANGE[0] or radius.max() > ORBIT_RADIUS_RANGE[1]:
            raise GeometryError(f"{where}: expected Earth-fixed positions {ORBIT_RADIUS_RANGE[0]:g}"
                                f"..{ORBIT_RADIUS_RANGE[1]:g} m from the Earth's centre, found "
                                f"{radius.min():.6g}..{radius.max():.6g} m")
        if velocity is not None:
            spline = CubicHermiteSpline(time, position, velocity, axis=0)
        else:
            spline = CubicSpline(time, position, axis=0)
        splines = (spline, spline.derivative(1), spline.derivative(2))
        for name, value in (("reference", reference), ("time", time), ("position", position),
                            ("velocity", velocity), ("_splines", splines)):
            object.__setattr__(self, name, value)

    def seconds(self, moment: Any) -> float:
        """``moment`` (UTC) in seconds after :attr:`reference`."""
        return _seconds(moment, self.reference)

    @property
    def span(self) -> tuple[np.datetime64, np.datetime64]:
        """UTC times of the first and the last state vector."""
        first, last = (self.reference + np.timedelta64(int(round(t * 1e9)), "ns")
                       for t in (self.time[0], self.time[-1]))
        return first, last

    def same_vectors(self, other: Orbit) -> bool:
        """Whether ``other`` holds the very same positions: two acquisitions never do, a copy
        of one orbit under another date does."""
        return np.array_equal(self.position, other.position)

    def state(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Position, velocity and acceleration at ``t`` (s after reference), each ``(..., 3)``."""
        t = np.asarray(t, dtype=np.float64)
        lo, hi = self.time[0], self.time[-1]
        # a cubic extrapolates well over a couple of state-vector intervals, not further
        margin = 2.0 * float(np.median(np.diff(self.time)))
        if t.size and (np.nanmin(t) < lo - margin or np.nanmax(t) > hi + margin):
            raise GeometryError(f"{self.source}: azimuth times {np.nanmin(t):.3f}.."
                                f"{np.nanmax(t):.3f} s lie far outside the state vectors "
                                f"({lo:.3f}..{hi:.3f} s after {self.reference}): wrong orbit "
                                "or wrong timing")
        return tuple(s(t) for s in self._splines)

    def to_dict(self) -> dict[str, Any]:
        return {"reference": str(self.reference), "time": self.time.tolist(),
                "position": self.position.tolist(),
                "velocity": None if self.velocity is None else self.velocity.tolist(),
                "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Orbit:
        return cls(reference=np.datetime64(data["reference"], "ns"), time=data["time"],
                   position=data["position"], velocity=data.get("velocity"),
                   source=data.get("source", "orbit"))


@dataclass(frozen=True)
class RadarGrid:
    """Where the pixels of a stack lie in time and range (the mother's, for a coregistered one).

    Parameters
    ----------
    first_line_time
        UTC zero-Doppler azimuth time of line (azimuth index) 0 of the stack.
    line_interval
        Seconds between lines.
    near_range
        One-way slant range (m) of pixel (range index) 0.
    range_spacing
        Slant-range pixel spacing (m).
    look_side
        ``"right"`` (Sentinel-1, TerraSAR-X, ...) or ``"left"``.
    """

    first_line_time: np.datetime64
    line_interval: float
    near_range: float
    range_spacing: float
    look_side: LookSide = "right"

    def __post_init__(self) -> None:
        # numpy's stubs lack datetime64(datetime64, unit)
        object.__setattr__(self, "first_line_time", np.datetime64(self.first_line_time, "ns"))  # type: ignore[call-overload]
        checks = {"line_interval": (self.line_interval, 1e-6, 1.0),
                  "near_range": (self.near_range, 1e5, 5e6),
                  "range_spacing": (self.range_spacing, 1e-2, 1e3)}
        for name, (value, lo, hi) in checks.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = float("nan")
            if not lo <= number <= hi:
                raise GeometryError(f"radar grid: field {name!r}: expected a value between "
                                    f"{lo:g} and {hi:g}, found {value!r}")
            object.__setattr__(self, name, number)
        if self.look_side not in ("right", "left"):
            raise GeometryError(f"radar grid: field 'look_side': expected 'right' or 'left', "
                                f"found {self.look_side!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"first_line_time": str(self.first_line_time),
                "line_interval": self.line_interval, "near_range": self.near_range,
                "range_spacing": self.range_spacing, "look_side": self.look_side}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RadarGrid:
        return cls(**data)


@dataclass(frozen=True)
class StackGeometry:
    """The geometry of one coregistered stack: the mother's grid and one orbit per epoch.

    Parameters
    ----------
    grid
        The radar grid of the stack's pixels.
    orbits
        One orbit per epoch, in the stack's time order.
    mother
        Index of the epoch whose grid the stack is on.
    wavelength
        Radar wavelength (m).
    height
        Height (m above the WGS84 ellipsoid) to geocode at when no height raster is given:
        the product's own (SNAP ``avg_scene_height``, ...), else 0.
    """

    grid: RadarGrid
    orbits: tuple[Orbit, ...]
    mother: int
    wavelength: float
    height: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "orbits", tuple(self.orbits))
        if not self.orbits:
            raise GeometryError("geometry: expected one orbit per epoch, found none")
        if not 0 <= int(self.mother) < len(self.orbits):
            raise GeometryError(f"geometry: field 'mother': expected an epoch index in "
                                f"0..{len(self.orbits) - 1}, found {self.mother!r}")
        object.__setattr__(self, "mother", int(self.mother))
        if not 1e-3 < float(self.wavelength) < 1.0:
            raise GeometryError(f"geometry: field 'wavelength': expected metres between 0.001 "
                                f"and 1, found {self.wavelength!r}")
        if not np.isfinite(self.height) or abs(self.height) > 9000:
            raise GeometryError(f"geometry: field 'height': expected a height in metres, "
                                f"found {self.height!r}")
        mother = self.orbits[self.mother]
        # no line of sight from the satellite reaches the ground nearer than straight down
        altitude = float(ecef_to_geodetic(mother.position)[2].min())
        if self.grid.near_range <= altitude:
            raise GeometryError(f"geometry: radar grid field 'near_range': expected more than "
                                f"the mother orbit's height above the ellipsoid "
                                f"({altitude:.0f} m, {mother.source}), found "
                                f"{self.grid.near_range:.0f} m: lines of sight into the Earth")
        for k, orbit in enumerate(self.orbits):
            if k != self.mother and orbit.same_vectors(mother):
                raise GeometryError(
                    f"geometry: orbits[{k}] ({orbit.source}): expected the epoch's own state "
                    f"vectors, found the mother's (orbits[{self.mother}], {mother.source}): "
                    "its baselines would all be zero")

    @property
    def mother_orbit(self) -> Orbit:
        return self.orbits[self.mother]

    def to_json(self) -> str:
        return json.dumps({"grid": self.grid.to_dict(),
                           "orbits": [o.to_dict() for o in self.orbits],
                           "mother": self.mother, "wavelength": float(self.wavelength),
                           "height": float(self.height)})

    @classmethod
    def from_json(cls, text: str) -> StackGeometry:
        data = json.loads(text)
        return cls(grid=RadarGrid.from_dict(data["grid"]),
                   orbits=tuple(Orbit.from_dict(o) for o in data["orbits"]),
                   mother=data["mother"], wavelength=data["wavelength"],
                   height=data.get("height", 0.0))

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> StackGeometry | None:
        """The geometry a stack or STM carries in ``attrs``, or None."""
        text = attrs.get(GEOMETRY_ATTR)
        return None if text is None else cls.from_json(text)

    def select_epochs(self, index: Sequence[int]) -> StackGeometry:
        """The geometry of a subset of epochs (the mother must stay)."""
        index = [int(i) for i in index]
        if self.mother not in index:
            raise GeometryError(f"geometry: the mother epoch {self.mother} is not among the "
                                f"epochs kept {index}")
        return StackGeometry(self.grid, tuple(self.orbits[i] for i in index),
                             index.index(self.mother), self.wavelength, self.height)


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


# ----------------------------------------------------------------------------------------------
# Ellipsoid
# ----------------------------------------------------------------------------------------------

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


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("...i,...i->...", a, b)


# ----------------------------------------------------------------------------------------------
# Range-Doppler
# ----------------------------------------------------------------------------------------------

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
    >>> far = RadarGrid(**{**geometry.grid.to_dict(), "near_range": 4.5e6})
    >>> check_scene_geometry(StackGeometry(far, geometry.orbits, geometry.mother,
    ...                      geometry.wavelength), azimuth, range_)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    depsi.io.geometry.GeometryError: stack: radar grid (near_range 4500000 m, ...: expected ...
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


# ----------------------------------------------------------------------------------------------
# Points
# ----------------------------------------------------------------------------------------------

#: Points geocoded per batch (bounds the Newton iterations' temporaries to a few hundred MB).
GEOCODE_BATCH = 500_000

#: Per-point coordinates :func:`geocode_points` adds: name -> (units, long name).
POINT_GEOMETRY = {
    "incidence_angle": ("degree", "incidence angle of the line of sight at the point"),
    "heading": ("degree", "heading of the flight direction, clockwise from north"),
    "los_east": ("1", "east component of the unit vector from the point to the satellite"),
    "los_north": ("1", "north component of the unit vector from the point to the satellite"),
    "los_up": ("1", "up component of the unit vector from the point to the satellite"),
}


def _point_heights(points: xr.Dataset, geometry: StackGeometry) -> np.ndarray:
    if "height" in points.variables and points["height"].dims == ("space",):
        height = np.asarray(points["height"].values, np.float64)
        return np.where(np.isfinite(height), height, geometry.height)
    return np.full(points.sizes["space"], geometry.height)


def _batched(function, n: int, *arrays: np.ndarray) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, max(n, 1), GEOCODE_BATCH):  # batches of points, not single points
        window = slice(start, start + GEOCODE_BATCH)
        for key, value in function(*(a[window] for a in arrays)).items():
            parts.setdefault(key, []).append(value)
    return {k: np.concatenate(v) for k, v in parts.items()}


def geocode_points(points: xr.Dataset, *, force: bool = False) -> xr.Dataset:
    """A point STM with its positions and line-of-sight geometry from the stack's orbits.

    Needs the geometry in ``points.attrs`` (:func:`~depsi.io.raster_geometry.attach_geometry`
    puts it on a stack and selection carries it to the points). Each point is geocoded at its
    ``height`` coordinate when the points have one (a DEM or the product's height raster, NaN
    falling back), else at the geometry's scene height. ``lat``/``lon`` are added when absent
    (or replaced with ``force``); ``incidence_angle``, ``heading`` and
    ``los_east``/``los_north``/``los_up`` are always added, as coordinates on ``space``.

    Examples
    --------
    Without a geometry the points come back as they were:

    >>> import xarray as xr, numpy as np
    >>> pts = xr.Dataset(coords={"azimuth": ("space", [0]), "range": ("space", [0])})
    >>> geocode_points(pts) is pts
    True
    """
    geometry = StackGeometry.from_attrs(points.attrs)
    if geometry is None:
        return points
    n = points.sizes["space"]
    azimuth = np.asarray(points["azimuth"].values, np.float64)
    range_ = np.asarray(points["range"].values, np.float64)
    height = _point_heights(points, geometry)
    found = _batched(lambda a, r, h: look_geometry(geometry, a, r, h), n, azimuth, range_,
                     height)
    coords: dict[str, Any] = {}
    if force or "lat" not in points.variables or "lon" not in points.variables:
        coords["lat"] = ("space", found["lat"], {"units": "degrees_north",
                                                 "long_name": "latitude (WGS84), geocoded"})
        coords["lon"] = ("space", found["lon"], {"units": "degrees_east",
                                                 "long_name": "longitude (WGS84), geocoded"})
    source = {"incidence_angle": "incidence", "heading": "heading", "los_east": "los_east",
              "los_north": "los_north", "los_up": "los_up"}
    for name, (units, long_name) in POINT_GEOMETRY.items():
        coords[name] = ("space", found[source[name]].astype(np.float32),
                        {"units": units, "long_name": long_name})
    logger.info("geocoded %d points from the orbits (heights %s)", n,
                "per point" if "height" in points.variables else f"{geometry.height:g} m")
    return points.assign_coords(coords)


#: Geocode -> sample the DEM -> geocode again, until no height changes by more than
#: DEM_TOLERANCE (m): each pass shrinks the height error by the DEM's slope times
#: cot(incidence), at most DEM_ITERATIONS passes.
DEM_ITERATIONS = 12
DEM_TOLERANCE = 1e-3


def open_dem(path: str | Any) -> xr.DataArray:
    """A DEM raster in geographic coordinates (WGS84 lon/lat degrees, heights in m above the
    ellipsoid) as a DataArray on ``(lat, lon)``; needs rioxarray (the ``geo`` extra)."""
    import warnings

    import rasterio
    import rioxarray

    with warnings.catch_warnings():
        # a DEM without a geotransform is refused below, by name, instead of a warning
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(path) as src:
            crs, transform = src.crs, src.transform
    if crs is None:
        raise GeometryError(f"DEM '{path}': expected a coordinate reference system (WGS84 "
                            "lon/lat), found none")
    if transform.is_identity:
        raise GeometryError(f"DEM '{path}': expected a geotransform placing its pixels in "
                            "lon/lat, found none (the identity)")
    # one raster file opens as one DataArray (a list or Dataset only for subdatasets)
    raster = cast(xr.DataArray, rioxarray.open_rasterio(path, masked=True))
    dem = raster.squeeze("band", drop=True)
    if not crs.is_geographic:
        raise GeometryError(f"DEM '{path}': expected geographic coordinates (WGS84 lon/lat), "
                            f"found the projected CRS {crs.to_string()}")
    return dem.rename({"y": "lat", "x": "lon"}).astype(np.float64)


def dem_bounds(dem: xr.DataArray) -> tuple[float, float, float, float]:
    """South, north, west and east edges (degrees) of the DEM's pixel centres."""
    lat, lon = dem["lat"].values, dem["lon"].values
    return float(lat.min()), float(lat.max()), float(lon.min()), float(lon.max())


def check_dem_covers(dem: xr.DataArray, lat: Any, lon: Any, *, source: str = "DEM") -> None:
    """Refuse a DEM on which none of the positions ``lat``/``lon`` (degrees) lies.

    Raises
    ------
    GeometryError
        Naming the DEM, its extent and the positions' extent.
    """
    lat, lon = np.asarray(lat, np.float64), np.asarray(lon, np.float64)
    south, north, west, east = dem_bounds(dem)
    inside = (lat >= south) & (lat <= north) & (lon >= west) & (lon <= east)
    if lat.size and not inside.any():
        raise GeometryError(f"{source}: expected a DEM covering the scene, found one over "
                            f"lat {south:.4f}..{north:.4f}, lon {west:.4f}..{east:.4f} while "
                            f"the scene lies over lat {np.nanmin(lat):.4f}.."
                            f"{np.nanmax(lat):.4f}, lon {np.nanmin(lon):.4f}.."
                            f"{np.nanmax(lon):.4f}")


def geocode_with_dem(points: xr.Dataset, dem: xr.DataArray) -> xr.Dataset:
    """Points geocoded at the heights of a DEM: geocode, sample the DEM at the positions
    (bilinear), geocode again at those heights, until the heights settle
    (:data:`DEM_TOLERANCE`). The heights become the ``height`` coordinate; positions outside
    the DEM keep the scene's height.

    Raises
    ------
    GeometryError
        When the points carry no geometry (a DEM needs the orbits to be used).
    """
    if StackGeometry.from_attrs(points.attrs) is None:
        raise GeometryError("dem: expected points with their orbits (attrs 'sar_geometry') to "
                            "geocode on a DEM, found none")
    located = geocode_points(points, force=True)
    check_dem_covers(dem, located["lat"].values, located["lon"].values, source="dem")
    previous = np.full(located.sizes["space"], np.inf)
    for _ in range(DEM_ITERATIONS):
        height = np.asarray(dem.interp(lat=xr.DataArray(located["lat"].values, dims="space"),
                                       lon=xr.DataArray(located["lon"].values, dims="space")
                                       ).values, np.float64)
        located = geocode_points(located.assign_coords(height=(
            "space", height,
            {"units": "m", "long_name": "height above the WGS84 ellipsoid, from the DEM"})),
            force=True)
        settled = np.isnan(height) | (np.abs(height - previous) <= DEM_TOLERANCE)
        previous = height
        if settled.all():
            break
    outside = int(np.isnan(located["height"].values).sum())
    if outside:
        logger.warning("dem: %d of %d points lie outside the DEM: geocoded at the scene's "
                       "height", outside, located.sizes["space"])
    return located


def correct_positions(result: xr.Dataset) -> xr.Dataset:
    """Each point's position moved to where its estimated height error puts it.

    A point whose height is ``h + height_error`` lies, at the same pixel, displaced away from
    the sensor by about ``height_error / tan(incidence)`` (a higher point is imaged nearer the
    sensor than it lies): its position is re-geocoded at the
    corrected height and the shift is added to ``lat``/``lon`` (whatever their source). The
    positions before the correction stay as ``lat_uncorrected``/``lon_uncorrected``.
    Without a geometry in the attrs, or without ``height_error``, the result is returned as is.
    """
    geometry = StackGeometry.from_attrs(result.attrs)
    if geometry is None or "height_error" not in result or not {"lat", "lon"} <= set(
            result.variables) or "lat_uncorrected" in result.variables:
        return result
    n = result.sizes["space"]
    azimuth = np.asarray(result["azimuth"].values, np.float64)
    range_ = np.asarray(result["range"].values, np.float64)
    height = _point_heights(result, geometry)
    error = np.asarray(result["height_error"].values, np.float64)
    error = np.where(np.isfinite(error), error, 0.0)

    def shift(a, r, h, e):
        lat0, lon0 = radar_to_geo(geometry, a, r, h)
        lat1, lon1 = radar_to_geo(geometry, a, r, h + e)
        return {"lat": lat1 - lat0, "lon": lon1 - lon0}

    moved = _batched(shift, n, azimuth, range_, height, error)
    lat, lon = result["lat"], result["lon"]
    return result.assign_coords(
        lat=("space", np.asarray(lat.values, np.float64) + moved["lat"],
             {"units": "degrees_north", "long_name": "latitude (WGS84), corrected for the "
                                                     "estimated height error"}),
        lon=("space", np.asarray(lon.values, np.float64) + moved["lon"],
             {"units": "degrees_east", "long_name": "longitude (WGS84), corrected for the "
                                                    "estimated height error"}),
        lat_uncorrected=("space", np.asarray(lat.values), dict(lat.attrs)),
        lon_uncorrected=("space", np.asarray(lon.values), dict(lon.attrs)))


__all__ = [
    "GEOMETRY_ATTR",
    "GeometryError",
    "Orbit",
    "RadarGrid",
    "StackGeometry",
    "baselines",
    "INCIDENCE_RANGE",
    "check_dem_covers",
    "check_scene_geometry",
    "check_orbits_cover_epochs",
    "correct_positions",
    "geocode_points",
    "geocode_with_dem",
    "open_dem",
    "ecef_to_geodetic",
    "enu_basis",
    "geo_to_radar",
    "geodetic_to_ecef",
    "look_geometry",
    "radar_to_geo",
    "zero_doppler_time",
]
