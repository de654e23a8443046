"""A stack's SAR geometry as data: the state vectors of each acquisition (:class:`Orbit`), the
mother's radar grid (:class:`RadarGrid`) and both together (:class:`StackGeometry`), which a
stack or an STM carries in its attributes as JSON (:data:`GEOMETRY_ATTR`). What is computed
from them is :mod:`depsi.geometry.range_doppler`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.interpolate import CubicHermiteSpline, CubicSpline

from depsi.errors import BadInputError
from depsi.geometry.ellipsoid import ecef_to_geodetic

#: Plausible distance of a SAR satellite from the Earth's centre (m): low orbits to 2000 km.
ORBIT_RADIUS_RANGE = (6.5e6, 8.5e6)
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
