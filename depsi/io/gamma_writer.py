"""Writing a raster stack with its geometry as a GAMMA Remote Sensing stack (``rYYYYMMDD.rslc``
+ ``.rslc.par`` per date, in the layout of GAMMA's own), read back by
:func:`depsi.io.gamma.from_gamma`."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from depsi.conventions import SPEED_OF_LIGHT
from depsi.geometry import (
    Orbit,
    StackGeometry,
    ecef_to_geodetic,
    enu_basis,
    geodetic_to_ecef,
    look_geometry,
    radar_to_geo,
    zero_doppler_time,
)
from depsi.geometry.ellipsoid import WGS84_A, WGS84_F
from depsi.io.metadata import WAVELENGTH_RTOL
from depsi.io.raster import RASTER_DIMS

logger = logging.getLogger(__name__)

#: Interval (s) of the state vectors :func:`write_gamma` samples from each orbit, as GAMMA's
#: Sentinel-1 import writes them.
STATE_VECTOR_INTERVAL = 10.0


def _number(value: float, spec: str) -> str:
    """``value`` in GAMMA's format ``spec``, with more digits where those would lose it."""
    text = format(value, spec)
    if isinstance(value, (int, np.integer)) or float(text) == value:
        return text
    kind = spec[-1]
    width, _, decimals = spec[:-1].partition(".")
    for more in range(int(decimals) + 1, 18):
        text = format(value, f"{width}.{more}{kind}")
        if float(text) == value:
            return text
    return repr(float(value))


def _line(key: str, values: Sequence[str], units: str = "", *, column: int = 36,
          step: int = 16, gap: str = "   ") -> str:
    """``key:``, the first value ending at ``column`` and the others right-aligned in ``step``
    characters each (GAMMA's layout), then the units."""
    first = f"{key}:"
    text = first + " " * max(1, column - len(first) - len(values[0])) + values[0]
    text += "".join(v.rjust(step) if len(v) < step else " " + v for v in values[1:])
    return text + (gap + units if units else "")


def _epoch_timing(geometry: StackGeometry, shape: tuple[int, int]
                  ) -> list[tuple[float, float]]:
    """Per epoch: the shift of line 0's time (s) and of near range (m) from the mother's.

    A resampled GAMMA SLC keeps its own acquisition's timing: the time its orbit sees the
    ground of the mother's line 0 and its range to it (at mid-range, the stack's height).
    """
    lat, lon = radar_to_geo(geometry, np.array([0.0]), np.array([shape[1] / 2.0]))
    target = geodetic_to_ecef(lat, lon, geometry.height)
    mother = geometry.mother_orbit
    t_m = zero_doppler_time(mother, target, guess=mother.seconds(geometry.grid.first_line_time))
    r_m = np.linalg.norm(target - mother.state(t_m)[0], axis=-1)
    out = []
    for orbit in geometry.orbits:
        t_k = zero_doppler_time(orbit, target)
        r_k = np.linalg.norm(target - orbit.state(t_k)[0], axis=-1)
        moment_m = mother.reference + np.timedelta64(int(round(float(t_m[0]) * 1e9)), "ns")
        moment_k = orbit.reference + np.timedelta64(int(round(float(t_k[0]) * 1e9)), "ns")
        # the shift within the day: acquisitions of one track come at the same time of day
        shift = ((moment_k - moment_k.astype("datetime64[D]"))
                 - (moment_m - moment_m.astype("datetime64[D]"))) / np.timedelta64(1, "ns")
        out.append((float(shift) * 1e-9, float(r_k[0] - r_m[0])))
    return out


def _state_vectors(orbit: Orbit, midnight: np.datetime64, what: str
                   ) -> tuple[float, float, np.ndarray, np.ndarray]:
    """First time (s of the day), interval and state vectors sampled from ``orbit``."""
    span = float(orbit.time[-1] - orbit.time[0])
    interval = STATE_VECTOR_INTERVAL if span >= 3 * STATE_VECTOR_INTERVAL else span / 3.0
    times = orbit.time[0] + interval * np.arange(int(np.floor(span / interval + 1e-9)) + 1)
    position, velocity, _ = orbit.state(times)
    offset = float((orbit.reference - midnight) / np.timedelta64(1, "ns")) * 1e-9
    first = float(times[0]) + offset
    if not -86400.0 < first < 2 * 86400.0:
        raise ValueError(f"{what}: expected an orbit around its date {midnight.astype('M8[D]')},"
                         f" found state vectors from {orbit.reference} + {orbit.time[0]:.3f} s")
    return first, interval, position, velocity


def _par_text(*, day: np.datetime64, start: float, shape: tuple[int, int], near_range: float,
              geometry: StackGeometry, orbit: Orbit, centre: dict[str, float], sensor: str,
              what: str) -> str:
    """An ISP SLC parameter file in the layout of GAMMA's own (``par_S1_SLC``): same keys,
    columns and units. The fields the reader uses keep every digit of their value."""
    grid = geometry.grid
    lines_, samples = shape
    dt, spacing = grid.line_interval, grid.range_spacing
    end = start + (lines_ - 1) * dt
    far = near_range + (samples - 1) * spacing
    # numpy's stubs lack datetime64(datetime64, unit)
    midnight = np.datetime64(day, "ns")  # type: ignore[call-overload]
    first, interval, position, velocity = _state_vectors(orbit, midnight, what)
    # GAMMA's sar_to_earth_center: this acquisition's own sensor at its own centre time
    centre_time = midnight + np.timedelta64(int(round(0.5 * (start + end) * 1e9)), "ns")
    sar_radius = float(np.linalg.norm(orbit.state(np.array([orbit.seconds(centre_time)]))[0]))
    y, m, d = str(np.datetime64(day, "D")).split("-")  # type: ignore[call-overload]

    def exact(value: float, spec: str) -> list[str]:
        return [_number(float(value), spec)]

    def shown(value: float, spec: str) -> list[str]:
        return [format(float(value), spec)]

    zero_poly = ["0.00000", "0.00000"] + ["0.00000e+00"] * 4
    zero_doppler = ["0.00000e+00"] * 4
    out = ["Gamma Interferometric SAR Processor (ISP) - Image Parameter File", "",
           f"title:     {sensor} {y}{m}{d} (software: depsi.io.gamma.write_gamma)",
           f"sensor:    {sensor}",
           f"date:      {y} {m} {d}",
           _line("start_time", exact(start, ".6f"), "s"),
           _line("center_time", shown(0.5 * (start + end), ".6f"), "s"),
           _line("end_time", shown(end, ".6f"), "s"),
           _line("azimuth_line_time", exact(dt, ".7e"), "s"),
           _line("line_header_size", ["0"]),
           _line("range_samples", [str(samples)]),
           _line("azimuth_lines", [str(lines_)]),
           _line("range_looks", ["1"]),
           _line("azimuth_looks", ["1"]),
           _line("image_format", ["FCOMPLEX"]),
           _line("image_geometry", ["SLANT_RANGE"], column=39),
           _line("range_scale_factor", ["1.0000000e+00"], column=37),
           _line("azimuth_scale_factor", ["1.0000000e+00"], column=37),
           _line("center_latitude", shown(centre["lat"], ".7f"), "degrees"),
           _line("center_longitude", shown(centre["lon"], ".7f"), "degrees"),
           _line("heading", shown(centre["heading"], ".7f"), "degrees"),
           _line("range_pixel_spacing", exact(spacing, ".6f"), "m"),
           _line("azimuth_pixel_spacing", shown(centre["azimuth_spacing"], ".6f"), "m"),
           _line("near_range_slc", exact(near_range, ".4f"), "m", column=37, gap="  "),
           _line("center_range_slc", shown(0.5 * (near_range + far), ".4f"), "m", column=37,
                 gap="  "),
           _line("far_range_slc", shown(far, ".4f"), "m", column=37, gap="  ")]
    out += [_line(f"{which}_slant_range_polynomial", zero_poly, "s m 1 m^-1 m^-2 m^-3 ",
                  column=44, step=13, gap="  ") for which in ("first", "center", "last")]
    out += [_line("incidence_angle", shown(centre["incidence"], ".4f"), "degrees"),
            _line("azimuth_deskew", ["ON"], column=27),
            _line("azimuth_angle", ["90.0000" if grid.look_side == "right" else "270.0000"],
                  "degrees"),
            _line("radar_frequency", exact(SPEED_OF_LIGHT / geometry.wavelength, ".7e"), "Hz",
                  column=37, gap="  "),
            _line("adc_sampling_rate", shown(SPEED_OF_LIGHT / (2 * spacing), ".7e"), "Hz",
                  column=37, gap="  "),
            _line("chirp_bandwidth", ["0.0000000e+00"], "Hz", column=37, gap="  "),
            _line("prf", shown(1.0 / dt, ".7f"), "Hz", column=37, gap="  "),
            _line("azimuth_proc_bandwidth", ["0.00000"], "Hz", column=37, gap="  "),
            _line("doppler_polynomial", zero_doppler, "Hz     Hz/m     Hz/m^2     Hz/m^3",
                  step=13, gap="  "),
            _line("doppler_poly_dot", zero_doppler, "Hz/s   Hz/s/m   Hz/s/m^2   Hz/s/m^3",
                  step=13, gap="  "),
            _line("doppler_poly_ddot", zero_doppler,
                  "Hz/s^2 Hz/s^2/m Hz/s^2/m^2 Hz/s^2/m^3", step=13, gap="  "),
            _line("receiver_gain", ["0.0000"], "dB", column=37, gap="  "),
            _line("calibration_gain", ["0.0000"], "dB", column=37, gap="  "),
            _line("sar_to_earth_center", shown(sar_radius, ".4f"), "m", column=45),
            _line("earth_radius_below_sensor", shown(centre["earth_radius"], ".4f"), "m",
                  column=45),
            _line("earth_semi_major_axis", shown(WGS84_A, ".4f"), "m", column=45),
            _line("earth_semi_minor_axis", shown(WGS84_A * (1 - WGS84_F), ".4f"), "m",
                  column=45),
            _line("number_of_state_vectors", [str(len(position))], column=45),
            _line("time_of_first_state_vector", exact(first, ".6f"), "s", column=45),
            _line("state_vector_interval", exact(interval, ".6f"), "s", column=45)]
    for k, (p, v) in enumerate(zip(position, velocity), 1):
        out.append(_line(f"state_vector_position_{k}", [_number(float(x), ".4f") for x in p],
                         "m   m   m", column=39))
        out.append(_line(f"state_vector_velocity_{k}", [_number(float(x), ".5f") for x in v],
                         "m/s m/s m/s", column=39))
    return "\n".join(out) + "\n\n"


def _scene_centre(geometry: StackGeometry, shape: tuple[int, int]) -> dict[str, float]:
    """The scene-centre fields of an SLC parameter file, as GAMMA states them: the heading of
    the velocity in the local frame below the sensor at the centre time (which is what GAMMA's
    ``heading`` is, to 1e-7 degree on the real headers), the incidence at the centre pixel."""
    look = look_geometry(geometry, (shape[0] - 1) / 2.0, (shape[1] - 1) / 2.0)
    orbit = geometry.mother_orbit
    t = orbit.seconds(geometry.grid.first_line_time) \
        + 0.5 * (shape[0] - 1) * geometry.grid.line_interval
    position, velocity, _ = orbit.state(np.array([t]))
    lat, lon, _ = ecef_to_geodetic(position)
    east, north, _ = enu_basis(lat, lon)
    heading = np.rad2deg(np.arctan2(np.sum(velocity * east), np.sum(velocity * north)))
    radius = float(np.linalg.norm(position))
    earth = float(np.linalg.norm(geodetic_to_ecef(look["lat"], look["lon"], geometry.height)))
    return {"lat": float(look["lat"]), "lon": float(look["lon"]), "heading": float(heading),
            "incidence": float(look["incidence"]),
            "earth_radius": earth,
            "azimuth_spacing": float(np.linalg.norm(velocity)) * geometry.grid.line_interval
            * earth / radius}


def _check_writable(stack: xr.Dataset, geometry: StackGeometry) -> xr.DataArray:
    if "complex" not in stack.data_vars:
        raise ValueError(f"stack: expected a 'complex' variable, found "
                         f"{sorted(map(str, stack.data_vars))}")
    slc = stack["complex"]
    if set(slc.dims) != set(RASTER_DIMS):
        raise ValueError(f"stack['complex']: expected dims {RASTER_DIMS}, found {slc.dims}")
    time = stack["time"].values
    if time.dtype.kind != "M":
        raise ValueError(f"stack['time']: expected dates (datetime64), found {time.dtype}")
    days = time.astype("datetime64[D]")
    if len(np.unique(days)) != len(days):
        raise ValueError(f"stack['time']: expected one epoch per date, found "
                         f"{[str(d) for d in days]}")
    if len(geometry.orbits) != len(days):
        raise ValueError(f"geometry: expected one orbit per epoch ({len(days)}), found "
                         f"{len(geometry.orbits)}")
    stated = stack.attrs.get("wavelength")
    if stated is not None and abs(float(stated) - geometry.wavelength) \
            > WAVELENGTH_RTOL * geometry.wavelength:
        raise ValueError(f"stack.attrs['wavelength']: expected the geometry's "
                         f"{geometry.wavelength!r} m, found {stated!r} m")
    return slc.transpose(*RASTER_DIMS)


def _write_slcs(paths: Sequence[Path], data: Any, shape: tuple[int, int]) -> None:
    """One big-endian complex64 file per epoch, band of lines by band (one Dask block row at
    a time, so memory holds one band of every epoch)."""
    maps = [np.memmap(p, dtype=">c8", mode="w+", shape=shape) for p in paths]
    bounds = np.cumsum((0, *data.chunks[0])) if isinstance(data, da.Array) else (0, shape[0])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        band = np.asarray(data[lo:hi])
        for k, mapped in enumerate(maps):
            mapped[lo:hi] = band[:, :, k]
    for mapped in maps:
        mapped.flush()


def _replace_all(parts: dict[Path, Path]) -> None:
    for part, final in parts.items():
        os.replace(part, final)


def write_gamma(folder: str | os.PathLike, stack: xr.Dataset, geometry: StackGeometry
                ) -> dict[str, Any]:
    """Write a raster stack and its geometry as a GAMMA stack: ``rYYYYMMDD.rslc`` + ``.par``.

    Each epoch's SLC is big-endian FCOMPLEX (``>c8``), lines in azimuth order; its ISP
    parameter file has the keys, layout and units of GAMMA's own Sentinel-1 ``*_slc.par``,
    with the epoch's state vectors sampled from its orbit every
    :data:`STATE_VECTOR_INTERVAL` s over the orbit's span (``orbit.state``). Numbers are in
    GAMMA's formats, with more digits where those would not give the value back exactly (so
    the geometry reads back unchanged). The mother's file has the stack's grid timing; each
    other date the timing of its own acquisition of the same ground (the time its orbit sees
    line 0 and its range to it), as resampled GAMMA SLCs keep. Instrument fields GAMMA copies
    from the raw product and depsi does not know (chirp bandwidth, Doppler polynomials) are 0.

    Every file is written to ``*.part`` first and renamed when all are complete. All files
    are named ``r...`` (resampled), so give ``mother=`` (returned as ``"mother"``) to
    :func:`~depsi.io.gamma.from_gamma` unless the mother is the middle date.

    Parameters
    ----------
    folder
        Created if needed; files of the same names are replaced.
    stack
        ``complex`` on ``(azimuth, range, time)``, ``time`` as dates; attrs ``wavelength``
        (checked against the geometry's), optional ``sensor`` and ``polarisation`` (for the
        ``sensor:`` line; default ``"depsi"``).
    geometry
        The stack's geometry, one orbit per epoch in time order.

    Returns
    -------
    dict
        ``folder``, ``slc`` and ``par`` (lists of paths in date order), ``mother`` (the mother's
        date, ``YYYYMMDD``).

    Raises
    ------
    ValueError
        No ``complex``, time not dates or repeated, one orbit per epoch missing, a wavelength
        other than the geometry's, an orbit far from its epoch's date.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import numpy as np, xarray as xr, depsi
    >>> from depsi.io.gamma import from_gamma, slc_geometry
    >>> from depsi.io.gamma_par import parse_par
    >>> headers = Path(depsi.__file__).parents[1] / "tests/data/gamma_s1_mexico/headers"
    >>> read = [slc_geometry(parse_par(headers / f"r{d}_VV_slc.par"))
    ...         for d in ("20180106", "20180130", "20180307")]
    >>> image = read[1][0]
    >>> geometry = StackGeometry(image.radar_grid, [orbit for _, orbit in read], mother=1,
    ...                          wavelength=image.wavelength)
    >>> slc = np.arange(2 * 3 * 3, dtype="c8").reshape(2, 3, 3) * (1 + 1j)
    >>> stack = xr.Dataset({"complex": (("azimuth", "range", "time"), slc)},
    ...                    coords={"time": [np.datetime64(im.date, "ns") for im, _ in read]},
    ...                    attrs={"wavelength": image.wavelength})
    >>> written = write_gamma(tempfile.mkdtemp(), stack, geometry)
    >>> [p.name for p in written["slc"]], written["mother"]
    (['r20180106.rslc', 'r20180130.rslc', 'r20180307.rslc'], '20180130')
    >>> back = from_gamma(written["folder"], mother=written["mother"])
    >>> bool((back.complex.values == slc).all()), back.h2ph.shape
    (True, (2, 3, 3))
    """
    slc = _check_writable(stack, geometry)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shape = (slc.sizes["azimuth"], slc.sizes["range"])
    days = stack["time"].values.astype("datetime64[D]")
    names = [str(d).replace("-", "") for d in days]
    sensor = " ".join(str(s) for s in (stack.attrs.get("sensor") or "depsi",
                                       stack.attrs.get("polarisation")) if s)
    centre = _scene_centre(geometry, shape)
    timing = _epoch_timing(geometry, shape)
    # seconds of the mother's date (beyond 86400 for a scene that starts after midnight)
    mother_start = float((geometry.grid.first_line_time - days[geometry.mother].astype("M8[ns]"))
                         / np.timedelta64(1, "ns")) * 1e-9

    slc_paths = [folder / f"r{name}.rslc" for name in names]
    par_paths = [folder / f"r{name}.rslc.par" for name in names]
    parts = {p.with_name(p.name + ".part"): p for p in slc_paths + par_paths}
    try:
        _write_slcs([p.with_name(p.name + ".part") for p in slc_paths], slc.data, shape)
        for k, (path, orbit) in enumerate(zip(par_paths, geometry.orbits)):
            shift, range_shift = (0.0, 0.0) if k == geometry.mother else timing[k]
            text = _par_text(day=days[k], start=mother_start + shift, shape=shape,
                             near_range=geometry.grid.near_range + range_shift,
                             geometry=geometry, orbit=orbit, centre=centre, sensor=sensor,
                             what=f"geometry.orbits[{k}] ({days[k]})")
            path.with_name(path.name + ".part").write_text(text)
    except BaseException:
        for part in parts:
            part.unlink(missing_ok=True)
        raise
    _replace_all(parts)
    logger.info("wrote a GAMMA stack of %d dates to %s (mother %s)", len(names), folder,
                names[geometry.mother])
    return {"folder": folder, "slc": slc_paths, "par": par_paths,
            "mother": names[geometry.mother]}


__all__ = ["STATE_VECTOR_INTERVAL", "write_gamma"]
