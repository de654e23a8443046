"""Writing a raster stack with its geometry as one coregistered SNAP BEAM-DIMAP product
(``NAME.dim`` + ``NAME.data/``), read back by :func:`depsi.io.dimap.from_dimap`.

The layout is the one :mod:`depsi.io.dimap` describes. Where the public sources are silent, the
writer names the secondaries ``slv1``, ``slv2``, ... in time order, writes no h2ph band for the
mother (SNAP writes none), writes each secondary's ``first_line_time`` and
``slant_range_to_first_pixel`` as its zero-Doppler time and range of pixel (0, 0) on the
mother's grid, and places tie points on pixel centres at most ``TIE_POINT_SPACING`` pixels
apart.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from depsi.conventions import MONTH_ABBREVIATIONS, SPEED_OF_LIGHT
from depsi.geometry import (
    Orbit,
    RadarGrid,
    StackGeometry,
    geodetic_to_ecef,
    radar_to_geo,
    zero_doppler_time,
)
from depsi.io.dimap import DIMAP_DTYPES, ENVI_TYPE_CODES
from depsi.io.raster import RASTER_DIMS
from depsi.io.raster_geometry import check_stack_for_writing

#: Most pixels between tie points the writer puts down: bilinear interpolation of lat/lon over
#: 32 Sentinel-1 pixels (about 75 m by 450 m) errs by far less than a millimetre.
TIE_POINT_SPACING = 32
#: Shortest and longest interval (s) at which the writer samples orbit state vectors.
ORBIT_INTERVAL_RANGE = (1, 10)


def _format_utc(moment: np.datetime64) -> str:
    """SNAP's UTC text, rounded to the microsecond.

    Examples
    --------
    >>> _format_utc(np.datetime64("2023-03-19T05:50:35.812250"))
    '19-MAR-2023 05:50:35.812250'
    """
    # numpy's stubs lack datetime64(datetime64, unit)
    exact = np.datetime64(moment, "ns")  # type: ignore[call-overload]
    micro = exact.astype("datetime64[us]")
    if exact - micro.astype("datetime64[ns]") >= np.timedelta64(500, "ns"):
        micro = micro + np.timedelta64(1, "us")
    text = str(micro)
    date_part, clock = text.split("T")
    year, month, day = date_part.split("-")
    clock = clock if "." in clock else clock + ".000000"
    return f"{day}-{MONTH_ABBREVIATIONS[int(month) - 1].upper()}-{year} {clock}"


def _date_tag(moment: np.datetime64) -> str:
    # numpy's stubs lack datetime64(datetime64, unit)
    day = np.datetime_as_string(np.datetime64(moment, "D"))  # type: ignore[call-overload]
    return f"{day[8:10]}{MONTH_ABBREVIATIONS[int(day[5:7]) - 1]}{day[:4]}"


def _sub(parent: ET.Element, tag: str, text: Any = None, **attrib: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrib)
    if text is not None:
        element.text = str(text)
    return element


def _md_attr(parent: ET.Element, name: str, value: Any, kind: str, unit: str | None = None
             ) -> None:
    attrib = {"name": name}
    if unit is not None:
        attrib["unit"] = unit
    attrib["type"] = kind
    text = repr(float(value)) if kind == "float64" else str(value)
    _sub(parent, "MDATTR", text, **attrib)


def _orbit_samples(orbit: Orbit) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """State vectors at whole microseconds every 1-10 s across the orbit's span (its own
    interval when that lies in the range, so its own vectors come back exactly)."""
    spacing = float(np.median(np.diff(orbit.time)))
    step = int(np.clip(round(spacing), *ORBIT_INTERVAL_RANGE))
    first = orbit.reference + np.timedelta64(int(round(orbit.time[0] * 1e9)), "ns")
    # numpy's stubs lack datetime64(datetime64, unit)
    start = np.datetime64(first, "us")  # type: ignore[call-overload]
    start_s = orbit.seconds(start)
    if start_s < orbit.time[0] - 1e-9:
        start_s += 1e-6
        start = start + np.timedelta64(1, "us")
    count = int(np.floor((orbit.time[-1] - start_s) / step + 1e-9)) + 1
    moments = [start + np.timedelta64(k * step, "s") for k in range(count)]
    seconds = [orbit.seconds(m) for m in moments]
    position, velocity, _ = orbit.state(np.array(seconds))
    return np.array(moments), position, velocity


def _orbit_element(parent: ET.Element, orbit: Orbit) -> None:
    vectors = _sub(parent, "MDElem", name="Orbit_State_Vectors")
    moments, position, velocity = _orbit_samples(orbit)
    for k, moment in enumerate(moments, 1):
        vector = _sub(vectors, "MDElem", name=f"orbit_vector{k}")
        _md_attr(vector, "time", _format_utc(moment), "utc")
        for axis, name in enumerate("xyz"):
            _md_attr(vector, f"{name}_pos", position[k - 1, axis], "float64", "m")
        for axis, name in enumerate("xyz"):
            _md_attr(vector, f"{name}_vel", velocity[k - 1, axis], "float64", "m/s")


def _timing_attrs(parent: ET.Element, *, name: str, first_line: np.datetime64, near: float,
                  grid: RadarGrid, shape: tuple[int, int], frequency_mhz: float,
                  orbit: Orbit, height: float) -> None:
    _, velocity, _ = orbit.state(np.array([orbit.seconds(first_line)]))
    last_line = first_line + np.timedelta64(int(round((shape[0] - 1) * grid.line_interval
                                                      * 1e9)), "ns")
    for key, value, kind, unit in (
            ("PRODUCT", name, "ascii", None), ("PRODUCT_TYPE", "SLC", "ascii", None),
            ("SAMPLE_TYPE", "COMPLEX", "ascii", None),
            ("antenna_pointing", grid.look_side, "ascii", None),
            ("PASS", "ASCENDING" if velocity[0, 2] > 0 else "DESCENDING", "ascii", None),
            ("first_line_time", _format_utc(first_line), "utc", None),
            ("last_line_time", _format_utc(last_line), "utc", None),
            ("line_time_interval", grid.line_interval, "float64", "s"),
            ("radar_frequency", frequency_mhz, "float64", "MHz"),
            ("range_spacing", grid.range_spacing, "float64", "m"),
            ("slant_range_to_first_pixel", near, "float64", "m"),
            ("num_output_lines", shape[0], "uint32", "lines"),
            ("num_samples_per_line", shape[1], "uint32", "samples"),
            ("avg_scene_height", height, "float64", "m")):
        _md_attr(parent, key, value, kind, unit)


def _band_names(stack_time: np.ndarray, mother: int, polarisation: str) -> list[dict[str, str]]:
    names, k = [], 0
    for index, moment in enumerate(stack_time):
        if index == mother:
            role = "mst"
        else:
            k += 1
            role = f"slv{k}"
        tag = f"{polarisation}_{role}_{_date_tag(moment)}"
        names.append({"i": f"i_{tag}", "q": f"q_{tag}", "h2ph": f"h2ph_{tag}", "role": role})
    return names


def _write_envi(folder: Path, name: str, data_type: str, shape: tuple[int, int],
                description: str) -> np.memmap:
    (folder / f"{name}.hdr").write_text(
        "ENVI\n"
        f"description = {{{description}}}\n"
        f"samples = {shape[1]}\nlines = {shape[0]}\nbands = 1\nheader offset = 0\n"
        f"file type = ENVI Standard\ndata type = {ENVI_TYPE_CODES[data_type]}\n"
        f"interleave = bsq\nbyte order = 1\nband names = {{ {name} }}\n")
    return np.memmap(folder / f"{name}.img", dtype=DIMAP_DTYPES[data_type], mode="w+",
                     shape=shape)


def _tie_point_nodes(size: int) -> tuple[np.ndarray, float]:
    """Tie-point pixel positions (from 0) and their step: pixel centres, at most
    TIE_POINT_SPACING apart, the first and the last pixel included."""
    count = max(2, int(np.ceil((size - 1) / TIE_POINT_SPACING)) + 1)
    step = max(size - 1, 1) / (count - 1)
    return np.arange(count) * step, step


def _check_writable(stack: xr.Dataset, geometry: StackGeometry) -> xr.Dataset:
    return check_stack_for_writing(stack, geometry, dates_in="band names", raster="DIMAP")


def write_dimap(
    path: str | os.PathLike,
    stack: xr.Dataset,
    geometry: StackGeometry,
    *,
    polarisation: str = "VV",
    overwrite: bool = False,
) -> Path:
    """Write a raster stack and its geometry as one coregistered SNAP BEAM-DIMAP product.

    The mother's bands are ``i_<pol>_mst_<date>`` / ``q_...``, the secondaries'
    ``i_<pol>_slvN_<date>`` / ``q_...`` and, when the stack has ``h2ph``,
    ``h2ph_<pol>_slvN_<date>`` (N from 1 in time order), each a big-endian float32 ENVI file.
    ``latitude``/``longitude`` tie-point grids come from
    :func:`~depsi.geometry.radar_to_geo` at ``geometry.height`` (the stack's own lat/lon are
    not used). ``Abstracted_Metadata`` holds the mother's timing, radar frequency and orbit,
    ``Slave_Metadata`` each secondary's orbit; state vectors are sampled every 1-10 s across
    each orbit's span. The product appears whole or not at all: it is written in a temporary
    sibling folder and renamed into place, the ``.data`` folder before the ``.dim``.

    Parameters
    ----------
    path
        The ``NAME.dim`` to write; ``NAME.data`` goes beside it.
    stack
        ``complex`` on ``(azimuth, range, time)`` with dates in ``time``, optional ``h2ph``,
        ``wavelength`` in attrs; ``azimuth``/``range`` consecutive pixel indices of
        ``geometry``'s grid (a subset's offset moves the written first-line time and range).
    geometry
        The stack's geometry, one orbit per epoch in time order.
    polarisation
        The polarisation named in the band names.
    overwrite
        Replace an existing product of that name.

    Returns
    -------
    pathlib.Path
        The ``.dim`` written.

    Raises
    ------
    FileExistsError
        The product exists and ``overwrite`` is False.
    ValueError, GeometryError
        No ``complex``, other dimensions, times that are not distinct dates, orbits not around
        their epoch's date, a wavelength different from the geometry's, pixel indices with gaps.

    Examples
    --------
    See :func:`~depsi.io.dimap.from_dimap`.
    """
    path = Path(path)
    if path.suffix != ".dim":
        raise ValueError(f"path: expected a file name ending in .dim, found '{path}'")
    if not isinstance(polarisation, str) or not re.fullmatch(r"[HV]{2}", polarisation):
        raise ValueError(f"polarisation: expected one of 'VV', 'VH', 'HH', 'HV', "
                         f"found {polarisation!r}")
    data_dir = path.with_suffix(".data")
    if not overwrite and (path.exists() or data_dir.exists()):
        raise FileExistsError(f"path: expected no product at '{path}', found one (pass "
                              "overwrite=True to replace it)")
    stack = _check_writable(stack, geometry)
    shape = (stack.sizes["azimuth"], stack.sizes["range"])
    time = stack["time"].values
    names = _band_names(time, geometry.mother, polarisation)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent))
    try:
        _write_product(work, path.stem, stack, geometry, names, shape, polarisation)
        _replace(work, path, data_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


def _write_product(work: Path, stem: str, stack: xr.Dataset, geometry: StackGeometry,
                   names: list[dict[str, str]], shape: tuple[int, int],
                   polarisation: str) -> None:
    data_dir = work / f"{stem}.data"
    (data_dir / "tie_point_grids").mkdir(parents=True)
    az0 = int(stack["azimuth"].values[0]) if shape[0] else 0
    rg0 = int(stack["range"].values[0]) if shape[1] else 0
    has_h2ph = "h2ph" in stack.data_vars
    files = {}
    for k, band in enumerate(names):
        files[band["i"]] = _write_envi(data_dir, band["i"], "float32", shape, "real")
        files[band["q"]] = _write_envi(data_dir, band["q"], "float32", shape, "imaginary")
        if has_h2ph and k != geometry.mother:
            files[band["h2ph"]] = _write_envi(data_dir, band["h2ph"], "float32", shape, "h2ph")
    complex_data = stack["complex"].data
    h2ph_data = stack["h2ph"].transpose(*RASTER_DIMS).data if has_h2ph else None
    rows = (complex_data.chunks[0] if isinstance(complex_data, da.Array) else (shape[0],))
    start = 0
    for size in rows:  # one band of lines at a time: memory stays one block of the stack
        window = slice(start, start + size)
        block = np.asarray(complex_data[window])
        factors = np.asarray(h2ph_data[window]) if h2ph_data is not None else None
        for k, band in enumerate(names):
            files[band["i"]][window] = block[:, :, k].real
            files[band["q"]][window] = block[:, :, k].imag
            if factors is not None and k != geometry.mother:
                files[band["h2ph"]][window] = factors[:, :, k]
        start += size
    for mapped in files.values():
        mapped.flush()
    del files

    az_nodes, az_step = _tie_point_nodes(shape[0])
    rg_nodes, rg_step = _tie_point_nodes(shape[1])
    lat, lon = radar_to_geo(geometry, az0 + az_nodes[:, None], rg0 + rg_nodes[None, :])
    for name, values in (("latitude", lat), ("longitude", lon)):
        grid = _write_envi(data_dir / "tie_point_grids", name, "float32", values.shape, "deg")
        grid[:] = values
        grid.flush()
        del grid
    # rows at the line indices, columns at pixel centres, as SNAP's (snap.SNAP_TIE_POINT_CENTRE)
    grid_info = {"offsets": (0.0, 0.5), "steps": (az_step, rg_step), "shape": lat.shape}
    root = _header(stem, stack, geometry, names, shape, polarisation, has_h2ph, grid_info,
                   (az0, rg0))
    ET.indent(root)
    ET.ElementTree(root).write(work / f"{stem}.dim", encoding="ISO-8859-1",
                               xml_declaration=True)


def _header(stem: str, stack: xr.Dataset, geometry: StackGeometry, names: list[dict[str, str]],
            shape: tuple[int, int], polarisation: str, has_h2ph: bool, grid_info: dict,
            origin: tuple[int, int]) -> ET.Element:
    grid = geometry.grid
    first_line = grid.first_line_time + np.timedelta64(
        int(round(origin[0] * grid.line_interval * 1e9)), "ns")
    near = grid.near_range + origin[1] * grid.range_spacing
    frequency_mhz = SPEED_OF_LIGHT / geometry.wavelength / 1e6
    root = ET.Element("Dimap_Document", name=f"{stem}.dim")
    ident = _sub(root, "Metadata_Id")
    _sub(ident, "METADATA_FORMAT", "DIMAP", version="2.13.0")
    _sub(ident, "METADATA_PROFILE", "BEAM-DATAMODEL-V1")
    dataset = _sub(root, "Dataset_Id")
    _sub(dataset, "DATASET_SERIES", "BEAM-PRODUCT")
    _sub(dataset, "DATASET_NAME", stem)
    production = _sub(root, "Production")
    _sub(production, "DATASET_PRODUCER_NAME", "depsi")
    _sub(production, "PRODUCT_TYPE", "SLC")
    _sub(production, "PRODUCT_SCENE_RASTER_START_TIME", _format_utc(first_line))
    crs = _sub(root, "Coordinate_Reference_System")
    horizontal = _sub(crs, "Horizontal_CS")
    _sub(horizontal, "HORIZONTAL_CS_TYPE", "GEOGRAPHIC")
    datum = _sub(_sub(horizontal, "Geographic_CS"), "Horizontal_Datum")
    _sub(datum, "HORIZONTAL_DATUM_NAME", "WGS84")
    ellipsoid = _sub(datum, "Ellipsoid")
    _sub(ellipsoid, "ELLIPSOID_NAME", "WGS-84")
    parameters = _sub(ellipsoid, "Ellipsoid_Parameters")
    _sub(parameters, "ELLIPSOID_MAJ_AXIS", "6378137.0", unit="M")
    _sub(parameters, "ELLIPSOID_MIN_AXIS", "6356752.314245179", unit="M")
    points = _sub(_sub(root, "Geoposition"), "Geoposition_Points")
    _sub(points, "TIE_POINT_GRID_NAME_LAT", "latitude")
    _sub(points, "TIE_POINT_GRID_NAME_LON", "longitude")

    bands: list[tuple[str, str | None]] = []
    for k, band in enumerate(names):
        bands += [(band["i"], "real"), (band["q"], "imaginary")]
        if has_h2ph and k != geometry.mother:
            bands.append((band["h2ph"], None))
    dims = _sub(root, "Raster_Dimensions")
    _sub(dims, "NCOLS", shape[1])
    _sub(dims, "NROWS", shape[0])
    _sub(dims, "NBANDS", len(bands))
    access = _sub(root, "Data_Access")
    _sub(access, "DATA_FILE_FORMAT", "ENVI")
    _sub(access, "DATA_FILE_FORMAT_DESC", "ENVI File Format")
    _sub(access, "DATA_FILE_ORGANISATION", "BAND_SEPARATE")
    for index, (name, _) in enumerate(bands):
        entry = _sub(access, "Data_File")
        _sub(entry, "DATA_FILE_PATH", href=f"{stem}.data/{name}.hdr")
        _sub(entry, "BAND_INDEX", index)
    for index, name in enumerate(("latitude", "longitude")):
        entry = _sub(access, "Tie_Point_Grid_File")
        _sub(entry, "TIE_POINT_GRID_FILE_PATH", href=f"{stem}.data/tie_point_grids/{name}.hdr")
        _sub(entry, "TIE_POINT_GRID_INDEX", index)
    grids = _sub(root, "Tie_Point_Grids")
    _sub(grids, "NUM_TIE_POINT_GRIDS", 2)
    for index, name in enumerate(("latitude", "longitude")):
        info = _sub(grids, "Tie_Point_Grid_Info")
        for tag, value in (("TIE_POINT_GRID_INDEX", index), ("TIE_POINT_DESCRIPTION", name),
                           ("PHYSICAL_UNIT", "deg"), ("TIE_POINT_GRID_NAME", name),
                           ("DATA_TYPE", "float32"), ("NCOLS", grid_info["shape"][1]),
                           ("NROWS", grid_info["shape"][0]),
                           ("OFFSET_X", repr(grid_info["offsets"][1])),
                           ("OFFSET_Y", repr(grid_info["offsets"][0])),
                           ("STEP_X", repr(grid_info["steps"][1])),
                           ("STEP_Y", repr(grid_info["steps"][0])),
                           ("CYCLIC", "true" if name == "longitude" else "false")):
            _sub(info, tag, value)
    interpretation = _sub(root, "Image_Interpretation")
    for index, (name, unit) in enumerate(bands):
        info = _sub(interpretation, "Spectral_Band_Info")
        for tag, value in (("BAND_INDEX", index), ("BAND_DESCRIPTION", ""), ("BAND_NAME", name),
                           ("BAND_RASTER_WIDTH", shape[1]), ("BAND_RASTER_HEIGHT", shape[0]),
                           ("DATA_TYPE", "float32"), ("PHYSICAL_UNIT", unit),
                           ("SCALING_FACTOR", "1.0"), ("SCALING_OFFSET", "0.0"),
                           ("LOG10_SCALED", "false"),
                           ("NO_DATA_VALUE_USED", "true" if unit else "false"),
                           ("NO_DATA_VALUE", "0.0")):
            if value is not None:
                _sub(info, tag, value)

    metadata = _sub(_sub(root, "Dataset_Sources"), "MDElem", name="metadata")
    mother = geometry.mother
    abstracted = _sub(metadata, "MDElem", name="Abstracted_Metadata")
    mother_name = f"{stem}_{_date_tag(stack['time'].values[mother])}"
    _timing_attrs(abstracted, name=mother_name, first_line=first_line, near=near, grid=grid,
                  shape=shape, frequency_mhz=frequency_mhz, orbit=geometry.mother_orbit,
                  height=geometry.height)
    _md_attr(abstracted, "subset_offset_x", int(stack.attrs.get("range_offset") or 0)
             + origin[1], "uint32", "samples")
    _md_attr(abstracted, "subset_offset_y", int(stack.attrs.get("azimuth_offset") or 0)
             + origin[0], "uint32", "samples")
    _md_attr(abstracted, "coregistered_stack", 1, "uint8", "flag")
    _orbit_element(abstracted, geometry.mother_orbit)
    slave = _sub(metadata, "MDElem", name="Slave_Metadata")
    _md_attr(slave, "Master_bands", f"{names[mother]['i']} {names[mother]['q']}", "ascii")
    # a secondary's own first line and near range: its view of pixel (0, 0) on the mother grid
    lat, lon = radar_to_geo(geometry, np.array([float(origin[0])]), np.array([float(origin[1])]))
    target = geodetic_to_ecef(lat, lon, geometry.height)
    for k, (moment, orbit) in enumerate(zip(stack["time"].values, geometry.orbits)):
        if k == mother:
            continue
        t = zero_doppler_time(orbit, target)
        position, _, _ = orbit.state(t)
        secondary = _sub(slave, "MDElem", name=f"{stem}_{_date_tag(moment)}")
        _timing_attrs(secondary, name=f"{stem}_{_date_tag(moment)}",
                      first_line=orbit.reference + np.timedelta64(int(round(t[0] * 1e9)), "ns"),
                      near=float(np.linalg.norm(target[0] - position[0])), grid=grid,
                      shape=shape, frequency_mhz=frequency_mhz, orbit=orbit,
                      height=geometry.height)
        slave_bands = [names[k]["i"], names[k]["q"]]
        _md_attr(secondary, "Slave_bands", " ".join(slave_bands), "ascii")
        _orbit_element(secondary, orbit)
    return root


def _replace(work: Path, path: Path, data_dir: Path) -> None:
    """Move the finished product into place: the old .dim goes first, the new .dim last, so a
    reader sees either no product or a whole one."""
    old = [p for p in (path, data_dir) if p.exists()]
    trash = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", suffix=".old", dir=path.parent))
    try:
        for item in old:
            os.replace(item, trash / item.name)
        os.replace(work / data_dir.name, data_dir)
        os.replace(work / path.name, path)
    finally:
        shutil.rmtree(trash, ignore_errors=True)


__all__ = ["TIE_POINT_SPACING", "write_dimap"]
