"""GAMMA Remote Sensing stacks: :func:`from_gamma` opens a coregistered stack (one big-endian SLC
per date with its ``.par``) lazily with its orbit geometry, :func:`slc_geometry` reads one
image's timing and orbit. Parameter files are parsed by :mod:`depsi.io.gamma_par`; the writer
(fixtures, ``depsi simulate``) is :mod:`depsi.io.gamma_writer`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from dask.base import tokenize

from depsi.conventions import SPEED_OF_LIGHT
from depsi.geometry import GeometryMode, Orbit, RadarGrid, StackGeometry
from depsi.io.bounded import MetadataError, _raise_problems
from depsi.io.gamma_par import _DATE_IN_NAME, SLC_FORMATS, parse_par
from depsi.io.metadata import WAVELENGTH_RTOL
from depsi.io.raster import (
    _BinaryStack,
    _check_exist,
    _chunks,
    _epochs,
    _file_dtype,
    _path_list,
    _raster,
)
from depsi.io.raster_geometry import attach_geometry
from depsi.stm.schema import validate

logger = logging.getLogger(__name__)

#: Suffixes of GAMMA SLC data files: ``.slc`` as acquired, ``.rslc`` resampled to the mother.
SLC_SUFFIXES = (".slc", ".rslc")

#: The ``sensor:`` line's last word, when it is one of these, is the polarisation.
POLARISATIONS = ("HH", "HV", "VH", "VV")

#: Largest difference (m) between ``sar_to_earth_center`` and the distance of the file's own
#: state vectors from the Earth's centre at ``center_time``: GAMMA's headers agree to 0.2 mm,
#: the vectors of another date of a Sentinel-1 stack are 0.5 to 56 m off (docs/benchmarks.md).
SAR_RADIUS_TOLERANCE = 0.1

# ----------------------------------------------------------------------------------------------
# Geometry of one image: timing, wavelength, orbit
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GammaImage:
    """What one GAMMA image parameter file says of its image: grid timing and description.

    The first five fields are those of :class:`~depsi.geometry.RadarGrid`
    (:meth:`grid_fields`, :attr:`radar_grid`).
    """

    first_line_time: np.datetime64
    line_interval: float
    near_range: float
    range_spacing: float
    look_side: str
    date: np.datetime64
    wavelength: float
    shape: tuple[int, int]
    image_format: str
    heading: float | None
    incidence_angle: float | None
    center_lat: float | None
    center_lon: float | None
    sensor: str | None
    polarisation: str | None
    source: str

    def grid_fields(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~depsi.geometry.RadarGrid`."""
        return {"first_line_time": self.first_line_time, "line_interval": self.line_interval,
                "near_range": self.near_range, "range_spacing": self.range_spacing,
                "look_side": self.look_side}

    @property
    def radar_grid(self) -> RadarGrid:
        return RadarGrid(**self.grid_fields())


def _midnight(par: dict[str, Any]) -> np.datetime64:
    day = par["date"]
    return np.datetime64(f"{int(day[0]):04d}-{int(day[1]):02d}-{int(day[2]):02d}", "ns")


def _seconds_after(reference: np.datetime64, seconds: float) -> np.datetime64:
    return reference + np.timedelta64(int(round(float(seconds) * 1e9)), "ns")


def _look_side(par: dict[str, Any], source: str) -> str:
    angle = par.get("azimuth_angle", 90.0)
    if abs(angle - 90.0) < 1e-3:
        return "right"
    if abs(angle - 270.0) < 1e-3 or abs(angle + 90.0) < 1e-3:
        return "left"
    raise MetadataError(f"GAMMA parameter file '{source}': field 'azimuth_angle': expected 90 "
                        f"(right looking) or 270 (left looking) degrees, found {angle!r}",
                        paths=[source], problems=[("azimuth_angle", "90 or 270", str(angle))])


def _orbit(par: dict[str, Any], source: str) -> Orbit:
    n = par.get("number_of_state_vectors")
    if not isinstance(n, int):
        _raise_problems(source, [("number_of_state_vectors", "an integer (the orbit's state "
                                  "vectors are needed for the geometry)", "the field is missing")])
    time = par["time_of_first_state_vector"] + par["state_vector_interval"] * np.arange(n)
    position = np.stack([par[f"state_vector_position_{k}"] for k in range(1, n + 1)])
    velocity = np.stack([par[f"state_vector_velocity_{k}"] for k in range(1, n + 1)])
    return Orbit(reference=_midnight(par), time=time, position=position, velocity=velocity,
                 source=source)


def _check_orbit_is_own(par: dict[str, Any], orbit: Orbit, source: str) -> None:
    """Refuse state vectors that are not this acquisition's own.

    They are timed in seconds of the day only, so vectors of another date of the same track
    cover the same times: they must cover ``center_time`` and, where the file states
    ``sar_to_earth_center`` (GAMMA's distance of the sensor from the Earth's centre at the
    centre time), be within :data:`SAR_RADIUS_TOLERANCE` of it there.
    """
    centre, radius = par.get("center_time"), par.get("sar_to_earth_center")
    if centre is None:
        return
    t = orbit.seconds(_seconds_after(_midnight(par), centre))
    lo, hi = float(orbit.time[0]), float(orbit.time[-1])
    if not lo <= t <= hi:
        _raise_problems(source, [("center_time", f"a time within the state vectors ({lo:.6f} "
                                  f"to {hi:.6f} s of the day)", f"{float(centre):.6f} s: the "
                                  "vectors of another acquisition?")])
    if radius is None:
        return
    found = float(np.linalg.norm(orbit.state(np.array([t]))[0]))
    if abs(found - float(radius)) > SAR_RADIUS_TOLERANCE:
        _raise_problems(source, [(
            "sar_to_earth_center", f"the distance of the file's state vectors from the "
            f"Earth's centre at center_time, {found:.4f} m (within {SAR_RADIUS_TOLERANCE} m)",
            f"{float(radius):.4f} m: state vectors of another acquisition?")])


def _sensor(par: dict[str, Any]) -> tuple[str | None, str | None]:
    line = par.get("sensor")
    if not line:
        return None, None
    words = line.split()
    if words[-1].upper() in POLARISATIONS:
        return " ".join(words[:-1]) or None, words[-1].upper()
    return line, None


def slc_geometry(par: dict[str, Any], source: str = "slc.par") -> tuple[GammaImage, Orbit]:
    """The radar-grid timing, description and orbit of one GAMMA image parameter file.

    ``date`` + ``start_time`` (seconds of the day, UTC) is the time of line 0,
    ``azimuth_line_time`` the line interval, ``near_range_slc`` the slant range of sample 0,
    ``range_pixel_spacing`` the range spacing, ``c / radar_frequency`` the wavelength and
    ``azimuth_angle`` the look side (90: right, 270: left). The state vectors
    (``time_of_first_state_vector`` + k ``state_vector_interval``, positions and velocities)
    become an :class:`~depsi.geometry.Orbit` whose reference is the date at 00:00 UTC.

    Parameters
    ----------
    par
        From :func:`~depsi.io.gamma_par.parse_par` of a ``*_slc.par`` (or ``*_mli.par``,
        whose orbit is the same).
    source
        Where ``par`` was read, named in errors.

    Returns
    -------
    (GammaImage, Orbit)

    Raises
    ------
    MetadataError
        No state vectors, state vectors that are not the image's own (not covering
        ``center_time``, or another distance from the Earth's centre there than
        ``sar_to_earth_center``), or an azimuth angle other than 90 / 270.

    Examples
    --------
    >>> from pathlib import Path
    >>> import depsi
    >>> folder = Path(depsi.__file__).parents[1] / "tests" / "data" / "gamma_s1_mexico"
    >>> image, orbit = slc_geometry(parse_par(folder / "headers" / "r20180106_VV_slc.par"))
    >>> str(image.first_line_time), image.look_side, round(image.wavelength, 6)
    ('2018-01-06T00:40:12.556599000', 'right', 0.055466)
    >>> str(orbit.reference), orbit.time.tolist()[:2]
    ('2018-01-06T00:00:00.000000000', [2399.144213, 2409.144213])
    """
    midnight = _midnight(par)
    sensor, polarisation = _sensor(par)

    def optional(key: str) -> float | None:
        value = par.get(key)
        return None if value is None else float(value)

    image = GammaImage(
        first_line_time=_seconds_after(midnight, par["start_time"]),
        line_interval=float(par["azimuth_line_time"]), near_range=float(par["near_range_slc"]),
        range_spacing=float(par["range_pixel_spacing"]), look_side=_look_side(par, source),
        date=midnight.astype("datetime64[D]"),
        wavelength=SPEED_OF_LIGHT / float(par["radar_frequency"]),
        shape=(int(par["azimuth_lines"]), int(par["range_samples"])),
        image_format=str(par["image_format"]).upper(), heading=optional("heading"),
        incidence_angle=optional("incidence_angle"), center_lat=optional("center_latitude"),
        center_lon=optional("center_longitude"), sensor=sensor, polarisation=polarisation,
        source=source)
    orbit = _orbit(par, source)
    _check_orbit_is_own(par, orbit, source)
    return image, orbit


# ----------------------------------------------------------------------------------------------
# Reading a stack
# ----------------------------------------------------------------------------------------------

def _par_of(data: Path) -> Path | None:
    """The parameter file beside an SLC: ``X.rslc.par``, or GAMMA-Python's ``X_rslc.par``."""
    for candidate in (data.with_name(data.name + ".par"),
                      data.with_name(f"{data.stem}_{data.suffix.lstrip('.')}.par")):
        if candidate.is_file():
            return candidate
    return None


def _slc_of(par: Path) -> Path | None:
    """The SLC a parameter file describes (``X.rslc`` of ``X.rslc.par`` or ``X_rslc.par``)."""
    if par.name.lower().endswith(tuple(f"{s}.par" for s in SLC_SUFFIXES)):
        return par.with_name(par.name[:-len(".par")])
    stem, _, kind = par.name[:-len(".par")].rpartition("_")
    return par.with_name(f"{stem}.{kind}") if f".{kind.lower()}" in SLC_SUFFIXES else None


def _slc_files(paths_or_folder: Any) -> list[Path]:
    if isinstance(paths_or_folder, (str, os.PathLike)) and Path(paths_or_folder).is_dir():
        folder = Path(paths_or_folder)
        files = sorted(p for p in folder.iterdir()
                       if p.is_file() and p.suffix.lower() in SLC_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"folder '{folder}': expected GAMMA SLC files (*.slc or "
                                    f"*.rslc, each with its .par), found none")
        # a parameter file without its SLC: a date (the mother's, perhaps) lost its data
        orphans = [(par, slc) for par in sorted(folder.glob("*.par"))
                   if (slc := _slc_of(par)) is not None and not slc.exists()]
        if orphans:
            raise FileNotFoundError(
                f"folder '{folder}': expected the SLC beside each SLC parameter file, found "
                f"none for {len(orphans)}: " + "; ".join(f"'{slc}' (of '{par.name}')"
                                                         for par, slc in orphans))
        return files
    paths = _path_list(paths_or_folder, "paths_or_folder")
    _check_exist(paths, "GAMMA SLC files")
    return paths


def _is_resampled(path: Path) -> bool:
    return path.suffix.lower() == ".rslc" or bool(re.match(r"^r\d{8}", path.name))


def _read_pars(files: Sequence[Path]) -> list[dict[str, Any]]:
    """Every SLC's parameter file, parsed; all missing and malformed files reported at once."""
    pars, missing, errors = [], [], []
    for path in files:
        par_path = _par_of(path)
        if par_path is None:
            missing.append(f"'{path}' (looked for '{path.name}.par' and "
                           f"'{path.stem}_{path.suffix.lstrip('.')}.par')")
            continue
        try:
            par = parse_par(par_path)
        except MetadataError as err:
            errors.append(err)
            continue
        par["_par_path"] = str(par_path)
        pars.append(par)
    if missing:
        raise FileNotFoundError(f"GAMMA SLC files: expected a .par beside each, found none for "
                                f"{len(missing)} of {len(files)}: " + "; ".join(missing))
    if errors:
        raise MetadataError("\n".join(str(e) for e in errors),
                            paths=[p for e in errors for p in e.paths],
                            problems=[p for e in errors for p in e.problems])
    not_slc = [f"'{p['_par_path']}' is a {p['kind']} parameter file" for p in pars
               if p["kind"] != "slc"]
    if not_slc:
        raise MetadataError("GAMMA SLC files: expected SLC parameter files (image_format "
                            f"FCOMPLEX or SCOMPLEX), found: {'; '.join(not_slc)}",
                            paths=[p["_par_path"] for p in pars])
    return pars


def _check_stack(files: Sequence[Path], images: Sequence[GammaImage]) -> None:
    """One size, format and wavelength for all; each file's size and name date right."""
    sources = [im.source for im in images]
    for what, values in (("dimensions (azimuth_lines, range_samples)", [im.shape for im in images]),
                         ("image_format", [im.image_format for im in images])):
        if len(set(values)) > 1:
            raise MetadataError(f"GAMMA stack: expected one {what} for all dates, found "
                                + "; ".join(f"{v} in '{s}'" for v, s in zip(values, sources)),
                                paths=sources)
    first = images[0].wavelength
    if any(abs(im.wavelength - first) > WAVELENGTH_RTOL * first for im in images):
        raise MetadataError("GAMMA stack: expected one radar wavelength for all dates, found "
                            + "; ".join(f"{im.wavelength:.7f} m in '{im.source}'"
                                        for im in images), paths=sources)
    for path, image in zip(files, images):
        named = _DATE_IN_NAME.search(path.name)
        if named and np.datetime64(pd.Timestamp(named.group(1)), "D") != image.date:
            raise MetadataError(f"GAMMA SLC '{path}': expected the date of its name "
                                f"{named.group(1)} in '{image.source}', found {image.date}",
                                paths=[image.source],
                                problems=[("date", named.group(1), str(image.date))])
    itemsize = _gamma_dtype(images[0]).itemsize
    rows, cols = images[0].shape
    expected = rows * cols * itemsize
    wrong = [(p, os.path.getsize(p)) for p in files if os.path.getsize(p) != expected]
    if wrong:
        details = "; ".join(f"'{p}' has {size} bytes" for p, size in wrong)
        raise ValueError(f"GAMMA SLC files: expected {expected} bytes each ({rows} lines x "
                         f"{cols} samples of {itemsize}-byte {images[0].image_format}, as the "
                         f".par files say), found {details}")


def _gamma_dtype(image: GammaImage) -> np.dtype:
    dtype, byteorder = SLC_FORMATS[image.image_format]
    return _file_dtype(dtype, byteorder)


def _choose_mother(mother: Any, files: Sequence[Path], time: np.ndarray) -> tuple[int, str]:
    """Index (in date order) of the mother, and why it was chosen."""
    days = time.astype("datetime64[D]")
    if mother is not None:
        try:
            wanted = np.datetime64(pd.Timestamp(str(mother)), "D")
        except ValueError:
            raise ValueError(f"mother: expected a date such as '20180307', found "
                             f"{mother!r}") from None
        hits = np.flatnonzero(days == wanted)
        if not hits.size:
            stamp = str(wanted).replace("-", "")
            folder = files[0].parent if files else Path(".")
            raise FileNotFoundError(
                f"mother: expected the mother's SLC and parameter file (such as "
                f"'{folder / f'r{stamp}.rslc'}' and its .par) among the stack's dates "
                f"{[str(d) for d in days]}, found no file of {wanted} (given {mother!r})")
        return int(hits[0]), "given as mother="
    original = [i for i, p in enumerate(files) if not _is_resampled(p)]
    if len(original) == 1 and len(files) > 1:
        return original[0], f"the only SLC not resampled ({files[original[0]].name})"
    return len(files) // 2, "the middle date (no mother= given and no single SLC that is not " \
                            "resampled)"


def from_gamma(
    paths_or_folder: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    geometry: GeometryMode = "product",
    height: Any = None,
    mother: Any = None,
    chunks: Any = None,
) -> xr.Dataset:
    """Read a coregistered GAMMA SLC stack (one SLC per date) lazily, with its orbit geometry.

    Each SLC (``rYYYYMMDD*.slc``, ``YYYYMMDD.rslc``, ...) has its ISP parameter file beside it
    (``YYYYMMDD.rslc.par``, or ``..._rslc.par``). Data are GAMMA's big-endian FCOMPLEX
    (float32 I/Q) or SCOMPLEX (int16 I/Q), read by memory-mapped blocks: the task graph holds
    file names only. Before any pixel is read: every SLC has its ``.par``, every ``.par``
    parses, all have one size, format and wavelength, dates are unique and agree with any
    date in the file names, and every file has ``azimuth_lines * range_samples * itemsize``
    bytes.

    The geometry: GAMMA SLCs carry no h2ph, so it comes from the orbits (each date keeps its
    own state vectors in its ``.par``): the stack's radar grid is the mother's timing and
    ``h2ph`` is computed by :func:`~depsi.io.raster_geometry.attach_geometry` (zero at the mother).
    The mother is ``mother=`` when given, else the one SLC that is not resampled (a ``.slc``
    whose name does not start with ``r`` + date, among ``.rslc`` / ``r...`` files), else the
    middle date (index ``n // 2`` in date order); the choice is logged.

    Parameters
    ----------
    paths_or_folder
        A folder (every ``*.slc`` / ``*.rslc`` in it) or the SLC files.
    geometry
        ``"product"`` or ``"orbits"``, as ``mode`` of
        :func:`~depsi.io.raster_geometry.attach_geometry` (``"orbits"`` also geocodes every pixel:
        lazy ``lat`` / ``lon``).
    height
        A height (m above the ellipsoid) for the geometry, or heights on ``(azimuth, range)``
        (then the coordinate ``height``; the geometry's own height stays 0). Default 0.
    mother
        The mother's date (``"20180307"``, ``"2018-03-07"``).
    chunks
        Block shape as in :func:`depsi.io.binary.from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64, Dask) and ``h2ph`` (float32) on ``(azimuth, range, time)``,
        epochs sorted by date; attrs ``wavelength``, ``sensor``, ``polarisation``,
        ``pass_direction`` (``"ascending"`` when the mother's ``|heading| < 90``), those of
        :func:`~depsi.io.raster_geometry.attach_geometry` (``sar_geometry``, ``mother_time``, ...).

    Raises
    ------
    FileNotFoundError
        Missing SLCs or parameter files (all named: an SLC without its ``.par``, a ``.par``
        without its SLC, a ``mother`` whose files are not in the stack).
    MetadataError
        Malformed parameter files (each bad field), mixed sizes, formats or wavelengths, a date
        that disagrees with the file name.
    ValueError
        A data file of the wrong size (named, expected and found bytes), duplicate dates, a
        ``mother`` that is not a date.

    Examples
    --------
    See :func:`~depsi.io.gamma_writer.write_gamma`, whose example writes a stack and reads it
    back.
    """
    files = _slc_files(paths_or_folder)
    pars = _read_pars(files)
    read = [slc_geometry(p, p["_par_path"]) for p in pars]
    images = [image for image, _ in read]
    _check_stack(files, images)
    if any(int(p.get("line_header_size", 0)) != 0 for p in pars):
        raise MetadataError("GAMMA stack: expected line_header_size 0, found "
                            + "; ".join(f"{p.get('line_header_size')} in '{p['_par_path']}'"
                                        for p in pars), paths=[p["_par_path"] for p in pars])
    epochs = _epochs(len(files), [str(f) for f in files],
                     # numpy's stubs lack datetime64(datetime64, unit)
                     dates=[np.datetime64(im.date, "ns") for im in images],  # type: ignore[call-overload]
                     metadata=None, wavelength=images[0].wavelength)
    files = [files[i] for i in epochs.order]
    images = [images[i] for i in epochs.order]
    orbits = [read[i][1] for i in epochs.order]
    index, why = _choose_mother(mother, files, epochs.time)
    logger.info("GAMMA stack of %d dates: mother %s, %s", len(files), images[index].date, why)

    shape = images[0].shape
    block = _chunks(chunks, shape, len(files))
    stack = _BinaryStack(files, shape, _gamma_dtype(images[0]))
    data = da.from_array(stack, chunks=block, lock=False, fancy=False, asarray=False,
                         meta=np.empty((0, 0, 0), dtype=np.complex64),
                         name="from_gamma-" + tokenize(stack))
    head = images[index]
    attrs = {"wavelength": epochs.wavelength, "sensor": head.sensor,
             "polarisation": head.polarisation,
             "pass_direction": None if head.heading is None else
             ("ascending" if abs(head.heading) < 90 else "descending")}
    raster = _raster(data, epochs.time, attrs)

    scalar_height = height is None or np.ndim(height) == 0
    # given a wavelength, _epochs returns it checked
    stack_geometry = StackGeometry(grid=head.radar_grid, orbits=tuple(orbits), mother=index,
                                   wavelength=cast(float, epochs.wavelength),
                                   height=float(height) if scalar_height and height is not None
                                   else 0.0)
    out = attach_geometry(raster, stack_geometry, mode=geometry,
                          height=None if scalar_height else height)
    out.attrs["history"] = "read by depsi.io.gamma.from_gamma"
    validate(out.drop_vars([c for c in ("lat", "lon") if c in out.variables]), kind="raster")
    return out


__all__ = ["POLARISATIONS", "SAR_RADIUS_TOLERANCE", "GammaImage", "from_gamma", "slc_geometry"]
