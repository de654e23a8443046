"""Simulated stacks written to disk: Zarr, the flat DORIS folder of ``.raw`` files with DORIS v5
like ``.res`` metadata, and every format users bring (:data:`STACK_FORMATS`), through the
writers of :mod:`depsi.io` beside their readers. The ``.res`` texts are the simulator's: they
state the scene's own geometry (its orbits, timing and corners) in depsi.io.doris's layout.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from depsi.conventions import SPEED_OF_LIGHT
from depsi.io.binary import binary_folder_files, write_binary_folder
from depsi.io.doris_writer import (
    IFGS_PROCESS_CONTROL,
    _doris_time,
    _fields,
    _process_control,
    _section,
)
from depsi.io.slc_zarr import _refuse_existing, write_slc_zarr
from depsi.io.writers import STACK_FORMATS, write_slc_stack
from depsi.simulate.scene import (
    ACQUISITION_SECOND_OF_DAY,
    GROUND_SPEED,
    HEADING_DEG,
    INCIDENCE_CENTRE_DEG,
    PIXEL_SPACING,
    SCENE_CENTRE,
    SLANT_RANGE_CENTRE,
    _orbit_geometry,
    _range_geometry,
    simulate_stack,
    simulated_geometry,
)


def write_stack_zarr(path: str | os.PathLike, *, overwrite: bool = False,
                     progress: bool = True, **simulate_kwargs: Any) -> Path:
    """Simulate a stack and write it to a Zarr v3 store, block by block, in bounded memory.

    The stack goes to the root group of ``path`` and the truth to its group ``"truth"``
    (``xr.open_zarr(path)``, ``xr.open_zarr(path, group="truth")``), chunked like the Dask
    arrays, with time in one chunk. The store is written to a hidden sibling
    ``.<name>.tmp-<id>`` and renamed into place when complete, so ``path`` never holds a
    half-written store. Metadata are consolidated.

    Parameters
    ----------
    path
        The store to create.
    overwrite
        Replace an existing ``path`` (only after the new store is complete).
    progress
        Show a tqdm progress bar over the rows of blocks.
    **simulate_kwargs
        Keyword arguments of :func:`simulate_stack` (``chunks`` sets the Zarr chunks, and with
        them the memory used: about two chunks per thread).

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    FileExistsError
        When ``path`` exists and ``overwrite`` is False.

    Examples
    --------
    >>> import tempfile, pathlib, xarray as xr
    >>> store = pathlib.Path(tempfile.mkdtemp()) / "stack.zarr"
    >>> _ = write_stack_zarr(store, shape=(16, 16), n_epochs=4, progress=False)
    >>> xr.open_zarr(store)["complex"].shape, xr.open_zarr(store, group="truth")["aps"].dtype
    ((16, 16, 4), dtype('float32'))
    """
    path = Path(path)
    _refuse_existing(path, overwrite)
    stack, truth = simulate_stack(**simulate_kwargs)
    return write_slc_zarr(path, stack, groups={"truth": truth}, overwrite=overwrite,
                          progress=progress)


# --- DORIS v5 like result files (their layout helpers are depsi.io.doris_writer's) -----------

def _orbit_lines(bperp: float, centre_second: float) -> list[str]:
    """200 state vectors, 1 s apart, of a circular orbit shifted by ``bperp`` across track."""
    geometry = _orbit_geometry()
    seconds = np.floor(centre_second) - 100 + np.arange(200)
    angle = geometry["omega"] * (seconds - centre_second)
    positions = geometry["radius"] * (np.cos(angle)[:, None] * geometry["radial"]
                                      + np.sin(angle)[:, None] * geometry["along"])
    # depsi's h2ph = -B_perp / (R sin(theta)): B_perp positive is a secondary above the
    # mother's line of sight (as in simulated_geometry)
    positions += bperp * geometry["perpendicular"]
    lines = [" t(s)    X(m)                 Y(m)                  Z(m)                ",
             "NUMBER_OF_DATAPOINTS:       200"]
    lines += [f" {int(s)}   {x:<20.9f} {y:<21.9f} {z:<20.9f}"
              for s, (x, y, z) in zip(seconds, positions)]
    return lines


def _res_text(scene_info: dict[str, Any], t: int) -> str:
    """A DORIS v5 like ``master.res`` / ``slave_YYYYMMDD.res`` for epoch ``t``."""
    info = scene_info
    n_az, n_rg = info["shape"]
    is_mother = t == info["mother_index"]
    date = info["time"][t]
    first_time = date + np.timedelta64(int(ACQUISITION_SECOND_OF_DAY * 1e6), "us")
    interval = PIXEL_SPACING[0] / GROUND_SPEED
    centre_offset = np.timedelta64(int(round(n_az / 2 * interval * 1e6)), "us")
    slant_spacing = PIXEL_SPACING[1] * math.sin(np.deg2rad(INCIDENCE_CENTRE_DEG))
    sampling_rate = SPEED_OF_LIGHT / (2.0 * slant_spacing)
    near_time = 2.0 * info["slant_range"][0] / SPEED_OF_LIGHT
    centre_time = 2.0 * SLANT_RANGE_CENTRE / SPEED_OF_LIGHT
    days = int((date - info["time"][0]) / np.timedelta64(1, "D"))
    lat, lon = info["lat"], info["lon"]
    corners = {"ul": (0, 0), "ur": (0, -1), "lr": (-1, -1), "ll": (-1, 0)}
    data_file = info["slc_files"][t].name
    kind = "MASTER" if is_mother else "SLAVE"

    lines = ["=" * 47, f"{kind + ' RESULTFILE:':<40}",
             *_fields([("Created by", f"depsi.simulate (synthetic stack, seed {info['seed']})"),
                       ("DVersion", "Version (2015) (For TOPSAR)"),
                       ("FFTW library", "used"), ("VECLIB library", "not used"),
                       ("LAPACK library", "not used"), ("Compiled at", "XXXXXXXX"),
                       ("By GUN gcc", "XXXXXXXX")], 40),
             "=" * 47, "", "", ""]
    lines += _process_control({"readfiles": 1, "precise_orbits": 1, "crop": 1,
                               "sim_amplitude": 0, "master_timing": 0, "oversample": 0,
                               "resample": 0 if is_mother else 1, "filt_azi": 0,
                               "filt_range": 0, "NOT_USED": 0})
    readfiles = [
        ("Volume_file", "dummy"), ("Volume_ID", str(info["seed"])),
        ("Volume_identifier", "dummy"), ("Volume_set_identifier", "dummy"),
        ("Number of records in ref. file", "dummy"), ("SAR_PROCESSOR", "Sentinel-1A"),
        ("SWATH", "IW2"), ("PASS", "Ascending"), ("IMAGE_MODE", "IW"), ("polarisation", "VV"),
        ("Product type specifier", "S1A"),
        ("Logical volume generating facility", "depsi.simulate"),
        ("Location and date/time of product creation", "simulated"),
        ("Number_of_lines_Swath", n_az), ("number_of_pixels_Swath", n_rg),
        ("rangePixelSpacing", f"{slant_spacing:.6e}"),
        ("azimuthPixelSpacing", f"{PIXEL_SPACING[0]:.6e}"),
        ("total_Burst", 1), ("Burst_number_index", 1),
        ("RADAR_FREQUENCY (HZ)", f"{SPEED_OF_LIGHT / info['wavelength']:.15e}"),
        ("Scene identification", f"Orbit: {30000 + round(days * 175 / 12)}"),
        ("Scene location", f"lat: {SCENE_CENTRE[0]:.15e} lon:{SCENE_CENTRE[1]:.15e}"),
        ("Sensor platform mission identifer", "S1A"),
        ("Scene_center_heading", f"{HEADING_DEG:.15e}"),
        ("Scene_centre_latitude", repr(float(SCENE_CENTRE[0]))),
        ("Scene_centre_longitude", repr(float(SCENE_CENTRE[1]))),
        ("Radar_wavelength (m)", f"{info['wavelength']:.9f}"),
        ("Azimuth_steering_rate (deg/s)", "1.397440818000000e+00"),
        ("Pulse_Repetition_Frequency_raw_data(TOPSAR)", "1.685817302492702e+03"),
        ("First_pixel_azimuth_time (UTC)", _doris_time(first_time)),
        ("Pulse_Repetition_Frequency (computed, Hz)", f"{1.0 / interval:.15e}"),
        ("Azimuth_time_interval (s)", f"{interval:.15e}"),
        ("Total_azimuth_band_width (Hz)", f"{0.65 / interval:.15e}"),
        ("Weighting_azimuth", "Hamming"),
        ("Range_time_to_first_pixel (2way) (ms)", f"{near_time * 1e3:.15f}"),
        ("Range_sampling_rate (computed, MHz)", f"{sampling_rate / 1e6:.9f}"),
        ("Total_range_band_width (MHz)", f"{0.85 * sampling_rate / 1e6:.9f}"),
        ("Weighting_range", "Hamming"),
        ("DC_reference_azimuth_time", _doris_time(first_time + centre_offset)),
        ("DC_reference_range_time", f"{centre_time:.15e}"),
        ("Xtrack_f_DC_constant (Hz, early edge)", "0.000000e+00"),
        ("Xtrack_f_DC_linear (Hz/s, early edge)", "0.000000e+00"),
        ("Xtrack_f_DC_quadratic (Hz/s/s, early edge)", "0.000000e+00"),
        ("FM_reference_azimuth_time", _doris_time(first_time + centre_offset)),
        ("FM_reference_range_time", f"{near_time:.15e}"),
        ("FM_polynomial_constant_coeff (Hz, early edge)", "-2.049174485762047e+03"),
        ("FM_polynomial_linear_coeff (Hz/s, early edge)", "3.542453933485016e+05"),
        ("FM_polynomial_quadratic_coeff (Hz/s/s, early edge)", "-5.439588256539609e+07"),
        ("Datafile", data_file), ("Dataformat", "complex_real4"),
        ("Number_of_lines_original", n_az), ("Number_of_pixels_original", n_rg),
        *((f"Scene_{c}_corner_latitude", repr(float(lat[i, j])))
          for c, (i, j) in corners.items()),
        *((f"Scene_{c}_corner_longitude", repr(float(lon[i, j])))
          for c, (i, j) in corners.items()),
        ("deramp", 0), ("reramp", 0), ("ESD_correct", 0),
        ("First_line (w.r.t. output_image)", 1), ("Last_line (w.r.t. output_image)", n_az),
        ("First_pixel (w.r.t. output_image)", 1), ("Last_pixel (w.r.t. output_image)", n_rg),
        ("Number_of_pixels_output_image", n_rg), ("Number_of_lines_output_image", n_az),
    ]
    lines += _section("readfiles", _fields(readfiles, 58))
    centre_second = ACQUISITION_SECOND_OF_DAY + n_az / 2 * interval
    lines += _section("precise_orbits", _orbit_lines(float(info["bperp"][t]), centre_second))
    lines += _section("crop", _fields([
        ("Data_output_file", data_file), ("Data_output_format", "complex_real4"),
        ("First_line (w.r.t. original_image)", 1), ("Last_line (w.r.t. original_image)", n_az),
        ("First_pixel (w.r.t. original_image)", 1),
        ("Last_pixel (w.r.t. original_image)", n_rg)], 43))
    if not is_mother:
        lines += _section("resample", _fields([
            ("Normalization_Lines", f"1 {n_az}"), ("Normalization_Pixels", f"1 {n_rg}"),
            ("Shifted azimuth spectrum", 0), ("Data_output_file", data_file),
            ("Data_output_format", "complex_real4"),
            ("Interpolation kernel", "12 point raised cosine kernel"),
            ("First_line (w.r.t. original_master)", 1),
            ("Last_line (w.r.t. original_master)", n_az),
            ("First_pixel (w.r.t. original_master)", 1),
            ("Last_pixel (w.r.t. original_master)", n_rg)], 44))
    return "\n".join(lines[:-3]) + "\n"


def _ifgs_text(scene_info: dict[str, Any], t: int) -> str:
    """A DORIS v5 like ``ifgs.res`` with the baseline (``coarse_orbits``) of epoch ``t``."""
    info = scene_info
    n_az, n_rg = info["shape"]
    bperp = float(info["bperp"][t])
    theta = INCIDENCE_CENTRE_DEG
    days = int((info["time"][t] - info["time"][info["mother_index"]]) / np.timedelta64(1, "D"))
    ground = SLANT_RANGE_CENTRE * math.sin(np.deg2rad(theta))
    height_ambiguity = (info["wavelength"] * ground / (2.0 * bperp)) if bperp else float("inf")

    def baseline(key, unit, value, comment):
        return f"{key:<15}{unit + ':':<10}{value:<15}// {comment}"

    geometry = _orbit_geometry()
    horizontal = bperp * float(geometry["perpendicular"] @ geometry["look"])
    vertical = bperp * float(geometry["perpendicular"] @ geometry["up"])
    alpha = math.degrees(math.atan2(vertical, horizontal)) if bperp else 0.0
    lines = ["=" * 53, f"{'INTERFEROGRAM RESULTFILE:':<40}{info['ifgs_files'][t].name}",
             f"{'Created by:':<40}depsi.simulate (synthetic stack, seed {info['seed']})",
             f"{'InSAR Processor:':<40}Doris (Delft o-o Radar Interferometric Software)",
             "", "", ""]
    lines += _process_control(IFGS_PROCESS_CONTROL)
    lines += _section("coarse_orbits", [
        f"{'Some info for pixel:':<45}{n_az // 2}, {n_rg // 2} (not used)",
        baseline("Btemp:", "[days]", days, "Temporal baseline"),
        baseline("Bperp", "[m]", f"{bperp:.1f}", "Perpendicular baseline"),
        baseline("Bpar", "[m]", "0.0", "Parallel baseline"),
        baseline("Bh", "[m]", f"{horizontal:.1f}", "Horizontal baseline"),
        baseline("Bv", "[m]", f"{vertical:.1f}", "Vertical baseline"),
        baseline("B", "[m]", f"{abs(bperp):.1f}", "Baseline (distance between sensors)"),
        baseline("alpha", "[deg]", f"{alpha:.1f}", "Baseline orientation"),
        baseline("theta", "[deg]", f"{theta:.1f}", "look angle"),
        baseline("inc_angle", "[deg]", f"{theta:.1f}", "incidence angle"),
        baseline("orbitconv", "[deg]", "0", "angle between orbits"),
        baseline("Height_amb", "[m]", f"{height_ambiguity:.1f}",
                 "height = h_amb*phase/2pi (approximately)"),
        f"Control point master (line,pixel,hei) =      ({n_az // 2}, {n_rg // 2}, 0)",
        f"Control point slave  (line,pixel,hei) =      ({n_az // 2}, {n_rg // 2}, 0)",
        "Estimated translation slave w.r.t. master (slave-master):",
        "Positive offsetL:                            slave image is to the bottom",
        "Positive offsetP:                            slave image is to the right",
        f"{'Coarse_orbits_translation_lines:':<45}0",
        f"{'Coarse_orbits_translation_pixels:':<45}0"])
    return "\n".join(lines[:-3]) + "\n"


def write_stack_binary(folder: str | os.PathLike, *, overwrite: bool = False,
                       progress: bool = True, **simulate_kwargs: Any) -> dict[str, Any]:
    """Simulate a stack and write it as raw per-epoch files with DORIS v5 like metadata.

    Per epoch (``YYYYMMDD`` its date): ``slc_YYYYMMDD.raw`` (little-endian complex64,
    azimuth-major ``(n_azimuth, n_range)``), ``h2ph_YYYYMMDD.raw`` (little-endian float32, same
    layout), a result file (``master.res`` for the mother epoch, ``slave_YYYYMMDD.res`` for the
    others: ``readfiles``, ``precise_orbits``, ``crop`` and, for slaves, ``resample`` sections
    with the real DORIS v5 field names) and, for the slaves, ``ifgs_YYYYMMDD.res`` with the
    baseline to the mother (``coarse_orbits``). Rasters are written one row of blocks at a time
    (memory: one row of blocks of ``complex`` and ``h2ph``) to ``*.part`` files renamed when
    complete.

    Parameters
    ----------
    folder
        Created if absent.
    overwrite
        Replace files of the same names; otherwise they raise.
    progress
        Show a tqdm progress bar over the rows of blocks.
    **simulate_kwargs
        Keyword arguments of :func:`simulate_stack`.

    Returns
    -------
    dict
        ``folder``, ``slc_files``, ``h2ph_files``, ``res_files`` (one per epoch),
        ``ifgs_res_files`` (None at the mother), ``shape`` (n_azimuth, n_range), ``dates``
        (datetime64[ns]), ``mother_index``, ``wavelength``, ``bperp``, ``dtype``
        (``"<c8"``), ``h2ph_dtype`` (``"<f4"``).

    Raises
    ------
    FileExistsError
        When a file to write exists and ``overwrite`` is False.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> out = write_stack_binary(tempfile.mkdtemp(), shape=(8, 6), n_epochs=3, progress=False)
    >>> np.fromfile(out["slc_files"][0], dtype="<c8").reshape(out["shape"]).shape
    (8, 6)
    >>> out["res_files"][1].name
    'master.res'
    """
    folder = Path(folder)
    stack, _ = simulate_stack(**simulate_kwargs)
    time = stack["time"].values
    mother = int(np.flatnonzero(time == np.datetime64(stack.attrs["mother_time"]))[0])
    files = binary_folder_files(folder, time, mother)
    shape = (stack.sizes["azimuth"], stack.sizes["range"])
    corner_rows = [0, shape[0] - 1]
    corner_cols = [0, shape[1] - 1]
    corners = stack[["lat", "lon"]].isel(azimuth=corner_rows, range=corner_cols).compute()
    info = {"shape": shape, "mother_index": mother, "time": time, "seed": stack.attrs["seed"],
            "wavelength": float(stack.attrs["wavelength"]), "bperp": stack["bperp"].values,
            "slant_range": _range_geometry(shape[1])[0], "lat": corners["lat"].values,
            "lon": corners["lon"].values, "slc_files": files["slc_files"],
            "ifgs_files": files["ifgs_res_files"]}
    texts = {path: _res_text(info, t) for t, path in enumerate(files["res_files"])}
    texts |= {path: _ifgs_text(info, t) for t, path in enumerate(files["ifgs_res_files"])
              if path is not None}
    written = write_binary_folder(folder, stack, texts, overwrite=overwrite, progress=progress)
    return written | {"wavelength": info["wavelength"], "bperp": info["bperp"]}


def write_stack(folder: str | os.PathLike, *, format: str, overwrite: bool = False,
                **simulate_kwargs: Any) -> dict[str, Any]:
    """Simulate a stack and write it in one of the formats users bring, through depsi's writers.

    Parameters
    ----------
    folder
        Where the stack goes (created; a BEAM-DIMAP product is ``folder/stack.dim``).
    format
        One of :data:`STACK_FORMATS`: ``doris`` (DORIS-5 stack folder, doris_stack layout),
        ``gamma`` (rslc + slc.par), ``isce2`` (topsStack merged/ layout), ``dimap`` (SNAP
        BEAM-DIMAP), ``snap`` (SNAP znap Zarr products, one ``YYYYMMDD-coreg.znap`` per date),
        ``geotiff`` (one complex GeoTIFF and one h2ph GeoTIFF per epoch; dates and
        wavelength then come from the configuration).
    overwrite
        Replace the files of an existing stack; otherwise a folder that holds them already is
        refused (FileExistsError) before anything is written.
    **simulate_kwargs
        Keyword arguments of :func:`simulate_stack`.

    Returns
    -------
    dict
        ``folder``, ``path`` (what a reader or ``input.path`` takes), ``format``, ``dates``
        (ISO strings), ``wavelength``, ``truth`` (the simulated truth), ``geometry``.
    """
    if format not in STACK_FORMATS:
        raise ValueError(f"format: expected one of {STACK_FORMATS}, found {format!r}")
    folder = Path(folder)
    stack, truth = simulate_stack(**simulate_kwargs)
    geometry = simulated_geometry(stack)
    raster = stack.drop_vars([n for n in stack.coords if n not in ("azimuth", "range", "time")])
    path = write_slc_stack(folder, raster, geometry, format=format, overwrite=overwrite)
    return {"folder": folder, "path": path, "format": format,
            "dates": [np.datetime_as_string(t, unit="D") for t in stack["time"].values],
            "wavelength": float(stack.attrs["wavelength"]), "truth": truth,
            "geometry": geometry}
