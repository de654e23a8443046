"""Writing a raster stack with its geometry as a DORIS-5 stack folder (TU Delft ``doris_stack``
layout), read back by :func:`depsi.io.doris.from_doris_stack`; for fixtures and ``depsi simulate
--format doris``.

The layout, and the plain readings where the public sources are silent, are the ones
:mod:`depsi.io.doris` describes. The ``.res`` layout helpers here (``_doris_time``, ``_section``,
``_fields``, ``_process_control``) also format the simulator's DORIS v5 like result files.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np
import xarray as xr

from depsi.conventions import MONTH_ABBREVIATIONS, SPEED_OF_LIGHT
from depsi.geometry import (
    GeometryError,
    Orbit,
    RadarGrid,
    StackGeometry,
    baselines,
    look_geometry,
    radar_to_geo,
)
from depsi.io.doris import (
    EPOCH_RES,
    H2PH_FILE,
    HEIGHT_FILE,
    IFGS_RES,
    LAT_FILE,
    LON_FILE,
    MOTHER_RES,
    REAL_DTYPE,
    SLC_FILE,
)
from depsi.io.metadata import WAVELENGTH_RTOL
from depsi.io.raster import RASTER_DIMS

logger = logging.getLogger(__name__)

#: Seconds between the orbit state vectors written to ``precise_orbits`` (doris_stack: 1 s).
ORBIT_SAMPLING_S = 1.0

_SEPARATOR = "*" * 67 + " "


# ----------------------------------------------------------------------------------------------
# Writing: DORIS v5 result files
# ----------------------------------------------------------------------------------------------

#: The interferogram result file's process control: only the coarse orbits were computed.
IFGS_PROCESS_CONTROL = {"coarse_orbits": 1, "coarse_correl": 0, "fine_coreg": 0,
                        "timing_error": 0, "dem_assist": 0, "comp_coregpm": 0, "interfero": 0,
                        "coherence": 0, "comp_refphase": 0, "subtr_refphase": 0,
                        "comp_refdem": 0, "subtr_refdem": 0, "filtphase": 0, "unwrap": 0,
                        "est_orbits": 0, "slant2h": 0, "geocoding": 0, "dinsar": 0,
                        "NOT_USED2": 0}


def _doris_time(moment: np.datetime64) -> str:
    """``2018-Mar-06 17:24:29.954980`` (month names without the locale).

    Examples
    --------
    >>> _doris_time(np.datetime64("2018-03-06T17:24:29.954980"))
    '2018-Mar-06 17:24:29.954980'
    """
    # numpy's stubs lack datetime64(datetime64, unit)
    text = np.datetime_as_string(np.datetime64(moment, "ns").astype("datetime64[us]"), unit="us")  # type: ignore[call-overload]
    year, month, rest = text.split("-", 2)
    day, clock = rest.split("T")
    return f"{year}-{MONTH_ABBREVIATIONS[int(month) - 1]}-{day} {clock}"


def _section(name: str, lines: list[str]) -> list[str]:
    return [_SEPARATOR, f"*_Start_{name}:", _SEPARATOR, *lines, _SEPARATOR,
            f"* End_{name}:_NORMAL", _SEPARATOR, "", "", ""]


def _fields(pairs: list[tuple[str, Any]], width: int) -> list[str]:
    return [f"{key + ':':<{width}}{value}" for key, value in pairs]


def _process_control(steps: dict[str, int]) -> list[str]:
    return ["Start_process_control", *(f"{k}:\t\t{v}" for k, v in steps.items()),
            "End_process_control", "", "", ""]


def _header(kind: str, lines: list[tuple[str, Any]]) -> list[str]:
    return ["=" * 47, f"{kind + ':':<40}", *_fields(lines, 40), "=" * 47, "", "", ""]


@dataclass(frozen=True)
class _Scene:
    """What every result file of a stack being written shares."""

    shape: tuple[int, int]
    crop_start: tuple[int, int]
    grid: RadarGrid
    wavelength: float
    heading: float
    lat: np.ndarray  # (2, 2) corners: [first, last line] x [first, last pixel]
    lon: np.ndarray
    centre: tuple[float, float]
    attrs: dict[str, Any]

    def window(self, reference: str) -> list[tuple[str, Any]]:
        (line, pixel), (n_az, n_rg) = self.crop_start, self.shape
        return [(f"First_line (w.r.t. {reference})", line),
                (f"Last_line (w.r.t. {reference})", line + n_az - 1),
                (f"First_pixel (w.r.t. {reference})", pixel),
                (f"Last_pixel (w.r.t. {reference})", pixel + n_rg - 1)]


def _orbit_lines(orbit: Orbit, day: np.datetime64) -> list[str]:
    """State vectors every ``ORBIT_SAMPLING_S`` s of the UTC day of ``day``, over the orbit."""
    # numpy's stubs lack datetime64(datetime64, unit)
    offset = float((orbit.reference - np.datetime64(day, "D").astype("datetime64[ns]"))  # type: ignore[call-overload]
                   / np.timedelta64(1, "ns")) * 1e-9
    first = math.ceil(orbit.time[0] + offset - 1e-9)
    last = math.floor(orbit.time[-1] + offset + 1e-9)
    seconds = np.arange(first, last + 1e-9, ORBIT_SAMPLING_S)
    positions, _, _ = orbit.state(seconds - offset)
    lines = [" t(s)    X(m)                 Y(m)                 Z(m)                ",
             f"NUMBER_OF_DATAPOINTS:       {seconds.size}"]
    lines += [f" {s:.6f}".rstrip("0").rstrip(".") + f"   {x:<20.9f} {y:<20.9f} {z:<20.9f}"
              for s, (x, y, z) in zip(seconds, positions)]
    return lines


def _readfiles(scene: _Scene, first_time: np.datetime64, data_file: str) -> list[str]:
    grid, (n_az, n_rg), (line, pixel) = scene.grid, scene.shape, scene.crop_start
    near_range = grid.near_range - (pixel - 1) * grid.range_spacing
    near_time = 2.0 * near_range / SPEED_OF_LIGHT
    sampling_rate = SPEED_OF_LIGHT / (2.0 * grid.range_spacing)
    lines_original, pixels_original = line - 1 + n_az, pixel - 1 + n_rg
    attrs = scene.attrs
    corners = {"ul": (0, 0), "ur": (0, 1), "lr": (1, 1), "ll": (1, 0)}
    heading = scene.heading
    pairs = [
        ("Volume_file", "dummy"), ("Volume_ID", "dummy"), ("Volume_identifier", "dummy"),
        ("Volume_set_identifier", "dummy"), ("Number of records in ref. file", "dummy"),
        ("SAR_PROCESSOR", attrs.get("sar_processor", "dummy")),
        ("SWATH", attrs.get("swath", "dummy")),
        ("PASS", "Ascending" if abs(heading) < 90 else "Descending"),
        ("IMAGE_MODE", attrs.get("image_mode", "IW")),
        ("polarisation", attrs.get("polarisation", "dummy")),
        ("Product type specifier", attrs.get("sensor", "dummy")),
        ("Logical volume generating facility", "depsi.io.doris"),
        ("Location and date/time of product creation", "dummy"),
        ("Number_of_lines_Swath", lines_original), ("number_of_pixels_Swath", pixels_original),
        ("rangePixelSpacing", f"{grid.range_spacing:.6e}"),
        ("RADAR_FREQUENCY (HZ)", repr(SPEED_OF_LIGHT / scene.wavelength)),
        ("Scene location", f"lat: {scene.centre[0]!r} lon:{scene.centre[1]!r}"),
        ("Sensor platform mission identifer", attrs.get("sensor", "dummy")),
        ("Scene_center_heading", repr(heading)),
        ("Scene_centre_latitude", repr(scene.centre[0])),
        ("Scene_centre_longitude", repr(scene.centre[1])),
        ("Radar_wavelength (m)", repr(scene.wavelength)),
        ("First_pixel_azimuth_time (UTC)", _doris_time(first_time)),
        ("Pulse_Repetition_Frequency (computed, Hz)", repr(1.0 / grid.line_interval)),
        ("Azimuth_time_interval (s)", repr(grid.line_interval)),
        ("Range_time_to_first_pixel (2way) (ms)", repr(near_time * 1e3)),
        ("Range_sampling_rate (computed, MHz)", repr(sampling_rate / 1e6)),
        ("Datafile", data_file), ("Dataformat", "complex_real4"),
        ("Number_of_lines_original", lines_original),
        ("Number_of_pixels_original", pixels_original),
        *((f"Scene_{c}_corner_latitude", repr(float(scene.lat[i, j])))
          for c, (i, j) in corners.items()),
        *((f"Scene_{c}_corner_longitude", repr(float(scene.lon[i, j])))
          for c, (i, j) in corners.items()),
        ("deramp", 0), ("reramp", 0), ("ESD_correct", 0),
        ("First_line (w.r.t. output_image)", 1),
        ("Last_line (w.r.t. output_image)", lines_original),
        ("First_pixel (w.r.t. output_image)", 1),
        ("Last_pixel (w.r.t. output_image)", pixels_original),
        ("Number_of_pixels_output_image", pixels_original),
        ("Number_of_lines_output_image", lines_original),
    ]
    return _section("readfiles", _fields(pairs, 58))


def _res_text(scene: _Scene, orbit: Orbit, day: np.datetime64, kind: str) -> str:
    """``master.res`` (kind ``MASTER``) or ``slave.res`` (``SLAVE``) of the date ``day``.

    The first line is at the mother grid's time of day on ``day`` (a secondary's own first line
    time is not known from a stack on the mother's grid).
    """
    grid_time = scene.grid.first_line_time
    time_of_day = grid_time - grid_time.astype("datetime64[D]").astype("datetime64[ns]")
    crop_offset = np.timedelta64(round((scene.crop_start[0] - 1) * scene.grid.line_interval
                                       * 1e9), "ns")
    # numpy's stubs lack datetime64(datetime64, unit), here and below
    first_time = np.datetime64(day, "D").astype("datetime64[ns]") + time_of_day - crop_offset  # type: ignore[call-overload]
    crop_file = np.datetime_as_string(np.datetime64(day, "D")) + ".raw"  # type: ignore[call-overload]
    lines = _header(f"{kind} RESULTFILE", [
        ("Created by", "depsi.io.doris.write_doris_stack"),
        ("DVersion", "Version (2015) (For TOPSAR)"), ("FFTW library", "used"),
        ("VECLIB library", "not used"), ("LAPACK library", "not used"),
        ("Compiled at", "XXXXXXXX"), ("By GUN gcc", "XXXXXXXX")])
    lines += _process_control({"readfiles": 1, "precise_orbits": 1, "crop": 1,
                               "sim_amplitude": 0, "master_timing": 0, "oversample": 0,
                               "resample": 1, "filt_azi": 0, "filt_range": 0, "NOT_USED": 0})
    lines += _readfiles(scene, first_time, crop_file)
    lines += _section("precise_orbits", _orbit_lines(orbit, day))
    lines += _section("crop", _fields([("Data_output_file", crop_file),
                                       ("Data_output_format", "complex_short"),
                                       *scene.window("original_image")], 43))
    n_az, n_rg = scene.shape
    lines += _section("resample", _fields([
        ("Normalization_Lines", f"1 {n_az}"), ("Normalization_Pixels", f"1 {n_rg}"),
        ("Shifted azimuth spectrum", 0), ("Data_output_file", SLC_FILE),
        ("Data_output_format", "complex_real4"),
        ("Interpolation kernel", "12 point raised cosine kernel"),
        *scene.window("original_master")], 44))
    return "\n".join(lines[:-3]) + "\n"


def _ifgs_text(scene: _Scene, geometry: StackGeometry, epoch: int, days: float) -> str:
    """``ifgs.res``: the baseline to the mother at the scene centre (``coarse_orbits``)."""
    n_az, n_rg = scene.shape
    centre = (np.array([n_az // 2], float), np.array([n_rg // 2], float))
    base = baselines(geometry, *centre)
    bperp, bpar = float(base["bperp"][0, epoch]), float(base["bpar"][0, epoch])
    incidence = float(base["incidence"][0])
    ground = float(base["slant_range"][0]) * math.sin(math.radians(incidence))

    def baseline(key: str, unit: str, value: Any, comment: str) -> str:
        return f"{key:<15}{unit + ':':<10}{value:<15}// {comment}"

    line, pixel = scene.crop_start
    lines = ["=" * 53, f"{'INTERFEROGRAM RESULTFILE:':<40}{IFGS_RES}",
             f"{'Created by:':<40}depsi.io.doris.write_doris_stack",
             f"{'InSAR Processor:':<40}Doris (Delft o-o Radar Interferometric Software)",
             "", "", ""]
    lines += _process_control(IFGS_PROCESS_CONTROL)
    control = f"({line - 1 + n_az // 2}, {pixel - 1 + n_rg // 2}, 0)"
    lines += _section("coarse_orbits", [
        f"{'Some info for pixel:':<45}{line - 1 + n_az // 2}, {pixel - 1 + n_rg // 2} (not used)",
        baseline("Btemp:", "[days]", round(days), "Temporal baseline"),
        baseline("Bperp", "[m]", f"{bperp:.1f}", "Perpendicular baseline"),
        baseline("Bpar", "[m]", f"{bpar:.1f}", "Parallel baseline"),
        baseline("inc_angle", "[deg]", f"{incidence:.1f}", "incidence angle"),
        # none at zero baseline (the mother): infinite
        *([baseline("Height_amb", "[m]", f"{scene.wavelength * ground / (2 * bperp):.1f}",
                    "height = h_amb*phase/2pi (approximately)")] if bperp else []),
        f"Control point master (line,pixel,hei) =      {control}",
        f"{'Coarse_orbits_translation_lines:':<45}0",
        f"{'Coarse_orbits_translation_pixels:':<45}0"])
    return "\n".join(lines[:-3]) + "\n"


# ----------------------------------------------------------------------------------------------
# Writing: rasters and the folder
# ----------------------------------------------------------------------------------------------

def _as_raster(value: Any, shape: tuple[int, int], name: str) -> xr.DataArray | None:
    if value is None:
        return None
    array = value if isinstance(value, xr.DataArray) else xr.DataArray(
        value, dims=("azimuth", "range"))
    if array.shape != shape:
        raise ValueError(f"{name}: expected an (azimuth, range) raster of shape {shape}, "
                         f"found shape {array.shape}")
    return array


def _row_blocks(stack: xr.Dataset) -> list[slice]:
    chunks = stack["complex"].chunks
    sizes = chunks[0] if chunks else (stack.sizes["azimuth"],)
    edges = np.cumsum((0, *sizes))
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def _check_writable(stack: xr.Dataset, geometry: StackGeometry) -> np.ndarray:
    missing = [d for d in RASTER_DIMS if d not in stack.dims]
    if missing or "complex" not in stack.data_vars:
        raise ValueError(f"stack: expected a raster Dataset with 'complex' on {RASTER_DIMS}, "
                         f"found dims {tuple(stack.dims)} and variables {list(stack.data_vars)}")
    time = stack["time"].values
    if time.dtype.kind != "M":
        raise ValueError(f"stack: coordinate 'time': expected dates (datetime64), found "
                         f"dtype {time.dtype}")
    if len(geometry.orbits) != time.size:
        raise GeometryError(f"geometry: expected one orbit per epoch ({time.size}), found "
                            f"{len(geometry.orbits)}")
    wavelength = stack.attrs.get("wavelength")
    if wavelength is not None and abs(float(wavelength) - geometry.wavelength) > \
            WAVELENGTH_RTOL * geometry.wavelength:
        raise ValueError(f"stack: attribute 'wavelength': expected the geometry's "
                         f"{geometry.wavelength!r} m, found {wavelength!r} m")
    days = time.astype("datetime64[D]")
    grid_day = geometry.grid.first_line_time.astype("datetime64[D]")
    if grid_day != days[geometry.mother]:
        raise GeometryError(f"geometry: field 'grid.first_line_time': expected a time on the "
                            f"mother's date {days[geometry.mother]}, found "
                            f"{geometry.grid.first_line_time}")
    if np.unique(days).size != days.size:
        raise ValueError(f"stack: coordinate 'time': expected one epoch per date (one folder "
                         f"each), found {[str(d) for d in days]}")
    return time


def write_doris_stack(folder: str | os.PathLike, stack: xr.Dataset, geometry: StackGeometry, *,
                      lat: Any = None, lon: Any = None, height: Any = None,
                      crop_start: tuple[int, int] = (1, 1), overwrite: bool = False
                      ) -> dict[str, Any]:
    """Write a raster stack and its geometry as a DORIS-5 stack folder (doris_stack layout).

    Per date ``YYYYMMDD/``: ``slave_rsmp_reramped.raw`` (little-endian complex64),
    ``h2ph_srd.raw`` (float32, when the stack has ``h2ph``), ``slave.res`` (this date: its
    orbit every second in ``precise_orbits``, ``crop`` and ``resample`` windows),
    ``master.res`` (the mother's, in every folder as doris_stack keeps it) and ``ifgs.res``
    (``coarse_orbits``: baselines at the scene centre). In the mother's folder also
    ``phi.raw``/``lam.raw`` (float32 lat/lon, by default geocoded from the geometry at
    ``height``) and ``dem_radar.raw`` when ``height`` is given. Rasters go one row of blocks at a
    time into ``*.part`` files, renamed when all are complete.

    Parameters
    ----------
    folder
        The ``stack`` folder; created if absent.
    stack
        ``complex`` (and optionally ``h2ph``) on ``(azimuth, range, time)``, ``time`` as dates,
        attrs ``wavelength`` (else the geometry's).
    geometry
        The stack's geometry: the mother's grid and one orbit per epoch, in time order.
    lat, lon
        ``(azimuth, range)`` degrees to write; default: geocoded from ``geometry``.
    height
        ``(azimuth, range)`` heights (m, WGS84 ellipsoid) to write as ``dem_radar.raw`` and
        geocode at; default: ``geometry.height``, and no ``dem_radar.raw``.
    crop_start
        ``(First_line, First_pixel)`` of the stack's window in the mother's original image
        (1-based, as DORIS counts): the ``.res`` timing refers to that original image.
    overwrite
        Replace files of a previous stack; otherwise existing files raise.

    Returns
    -------
    dict
        ``folder``, ``dates`` (datetime64[ns]), ``mother_index``, ``shape``, and per date the
        lists ``slc_files``, ``h2ph_files`` (None without h2ph), ``res_files``
        (``slave.res``), ``master_res_files``, ``ifgs_res_files``; ``lat_file``, ``lon_file``,
        ``height_file`` (None without height).

    Raises
    ------
    ValueError, GeometryError
        A stack without ``complex`` or dates, two epochs on one date, orbits other than one
        per epoch, a wavelength other than the geometry's, a grid whose first line is not on
        the mother's date, rasters of another shape.
    FileExistsError
        When a file to write exists and ``overwrite`` is False.

    Examples
    --------
    See :func:`depsi.io.doris.from_doris_stack`.
    """
    folder = Path(folder)
    time = _check_writable(stack, geometry)
    shape = (stack.sizes["azimuth"], stack.sizes["range"])
    if not (len(crop_start) == 2 and all(isinstance(v, (int, np.integer)) and v >= 1
                                         for v in crop_start)):
        raise ValueError(f"crop_start: expected (First_line, First_pixel), 1-based integers, "
                         f"found {crop_start!r}")
    lat, lon, height = (_as_raster(v, shape, n) for v, n in ((lat, "lat"), (lon, "lon"),
                                                             (height, "height")))
    days = [np.datetime_as_string(t, unit="D").replace("-", "") for t in time]
    mother = geometry.mother
    files = {
        "slc_files": [folder / d / SLC_FILE for d in days],
        "h2ph_files": ([folder / d / H2PH_FILE for d in days] if "h2ph" in stack.data_vars
                       else None),
        "res_files": [folder / d / EPOCH_RES for d in days],
        "master_res_files": [folder / d / MOTHER_RES for d in days],
        "ifgs_res_files": [folder / d / IFGS_RES for d in days],
        "lat_file": folder / days[mother] / LAT_FILE,
        "lon_file": folder / days[mother] / LON_FILE,
        "height_file": None if height is None else folder / days[mother] / HEIGHT_FILE,
    }
    targets = [p for v in files.values() for p in (v if isinstance(v, list) else [v]) if p]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"files already exist in '{folder}': {existing[:3]}"
                              f"{' ...' if len(existing) > 3 else ''}; pass overwrite=True")
    for d in days:
        (folder / d).mkdir(parents=True, exist_ok=True)

    corners = _write_rasters(stack, geometry, files, lat, lon, height)
    wavelength = float(stack.attrs.get("wavelength", geometry.wavelength))
    centre = look_geometry(geometry, shape[0] // 2, shape[1] // 2,
                           None if height is None else
                           float(height[shape[0] // 2, shape[1] // 2]))
    scene = _Scene(shape=shape, crop_start=(int(crop_start[0]), int(crop_start[1])),
                   grid=geometry.grid, wavelength=wavelength,
                   heading=float(centre["heading"]), lat=corners[0], lon=corners[1],
                   centre=(float(centre["lat"]), float(centre["lon"])),
                   attrs={k: str(v) for k, v in stack.attrs.items() if isinstance(v, str)})
    mother_text = _res_text(scene, geometry.orbits[mother], time[mother], "MASTER")
    texts: dict[Path, str] = {}
    for k, day in enumerate(time):
        texts[files["master_res_files"][k]] = mother_text
        texts[files["res_files"][k]] = _res_text(scene, geometry.orbits[k], day, "SLAVE")
        btemp = float((day - time[mother]) / np.timedelta64(1, "D"))
        texts[files["ifgs_res_files"][k]] = _ifgs_text(scene, geometry, k, btemp)
    _replace_all({path: text.encode() for path, text in texts.items()})
    logger.info("wrote a %d x %d x %d DORIS stack to %s (mother %s)", *shape, len(days),
                folder, days[mother])
    return {"folder": folder, "dates": time.astype("datetime64[ns]"), "mother_index": mother,
            "shape": shape, **files}


def _replace_all(contents: dict[Path, bytes]) -> None:
    parts = {path: path.with_name(path.name + ".part") for path in contents}
    try:
        for path, data in contents.items():
            parts[path].write_bytes(data)
        for path, part in parts.items():
            os.replace(part, path)
    except BaseException:
        for part in parts.values():
            part.unlink(missing_ok=True)
        raise


def _write_rasters(stack: xr.Dataset, geometry: StackGeometry, files: dict[str, Any],
                   lat: xr.DataArray | None, lon: xr.DataArray | None,
                   height: xr.DataArray | None) -> tuple[np.ndarray, np.ndarray]:
    """All rasters, one row of blocks at a time, into ``.part`` files; the corner lat/lon."""
    outputs = [*files["slc_files"], *(files["h2ph_files"] or []), files["lat_file"],
               files["lon_file"], *([files["height_file"]] if height is not None else [])]
    parts = [p.with_name(p.name + ".part") for p in outputs]
    n_time = stack.sizes["time"]
    has_h2ph = files["h2ph_files"] is not None
    range_ = np.arange(stack.sizes["range"], dtype=np.float64)
    rows_lat, rows_lon = [], []
    try:
        with contextlib.ExitStack() as opened:
            handles = [opened.enter_context(open(p, "wb")) for p in parts]
            for rows in _row_blocks(stack):
                block = stack.isel(azimuth=rows)
                arrays = [block["complex"].data, block["h2ph"].data if has_h2ph else None,
                          *(None if v is None else v[rows].data for v in (lat, lon, height))]
                slc, h2ph, lat_b, lon_b, height_b = dask.compute(*arrays)
                if lat_b is None or lon_b is None:
                    azimuth = np.arange(rows.start, rows.stop, dtype=np.float64)[:, None]
                    geo = radar_to_geo(geometry, azimuth, range_[None, :], height_b)
                    lat_b = geo[0] if lat_b is None else lat_b
                    lon_b = geo[1] if lon_b is None else lon_b
                out = iter(handles)
                for t in range(n_time):
                    next(out).write(np.ascontiguousarray(slc[:, :, t], dtype="<c8").tobytes())
                for t in range(n_time if has_h2ph else 0):
                    next(out).write(np.ascontiguousarray(h2ph[:, :, t], REAL_DTYPE).tobytes())
                for raster in (lat_b, lon_b, height_b):
                    if raster is not None:
                        next(out).write(np.ascontiguousarray(raster, REAL_DTYPE).tobytes())
                rows_lat.append(np.asarray(lat_b, np.float64)[[0, -1]][:, [0, -1]])
                rows_lon.append(np.asarray(lon_b, np.float64)[[0, -1]][:, [0, -1]])
        for part, final in zip(parts, outputs):
            os.replace(part, final)
    except BaseException:
        for part in parts:
            part.unlink(missing_ok=True)
        raise
    # rows of [first, last line] x [first, last pixel] of each block: the first and the last
    return (np.array([rows_lat[0][0], rows_lat[-1][1]]),
            np.array([rows_lon[0][0], rows_lon[-1][1]]))


__all__ = ["ORBIT_SAMPLING_S", "write_doris_stack"]
