"""Write a raster stack and its geometry as SNAP "znap" Zarr products, one per date.

The layout is the one of the real SNAP pair in ``tests/data/sarxarray_slc/zarrs``
(``20230319-coreg.znap``, ``20230331-coreg.znap``), read back by
:func:`depsi.io.znap.from_snap`:

- one product per epoch, ``YYYYMMDD-coreg.znap``, each a Zarr v2 group (``.zgroup``,
  ``.zattrs`` with ``znap_format``, ``product_name``, raster size, time coverage, the tie-point
  geocoding and ``original_raster_data_node_order``);
- bands ``i_<pol>_<DDMonYYYY>`` and ``q_<pol>_<DDMonYYYY>`` (units ``real``/``imaginary``) and,
  for a secondary of a stack with ``h2ph``, ``h2ph_<pol>_<DDMonYYYY>``; the mother has no h2ph
  band (SNAP writes none). Every array is big-endian float32 (``>f4``), uncompressed, with
  ``dimension_separator`` ``.``, fill value 0 and ``_ARRAY_DIMENSIONS`` ``[y, x]``;
- tie-point grids ``latitude``/``longitude`` (``[yt, xt]``, units ``degree``) with ``offset_x``,
  ``offset_y``, ``subsampling_x``, ``subsampling_y`` in SNAP's pixel-centre convention (tie point
  ``k`` at ``offset + k * subsampling``, pixel ``i`` sampled at ``i + 0.5``), geocoded by
  :func:`~depsi.geometry.radar_to_geo` at the geometry's height;
- ``SNAP/product_metadata.json``: a JSON list of metadata elements ``{name, attributes:
  [{name, readOnly, data: {type, elems}}], elements: [...]}``. ``Abstracted_Metadata`` holds
  the mother's timing (``first_line_time`` and the other UTC values as ``[days, seconds,
  microseconds]`` since 2000-01-01), ``radar_frequency`` (MHz), ``slant_range_to_first_pixel``,
  ``range_spacing``, ``avg_scene_height``, ``antenna_pointing``, ``subset_offset_x/y`` and its
  ``Orbit_State_Vectors/orbit_vectorN``; ``Slave_Metadata`` holds ``Master_bands`` and one
  element per secondary, ``<name>_Orb_<DDMonYYYY>``, with its own timing and orbit. As in the
  real pair, every product carries the same (the stack's) metadata.

State vectors are sampled every second across each orbit's span (at whole microseconds), so an
orbit of 1 s vectors comes back exactly. Each product appears whole or not at all: all are
written in a temporary sibling folder and then renamed into place.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from depsi.conventions import MONTH_ABBREVIATIONS, SPEED_OF_LIGHT
from depsi.geometry import (
    Orbit,
    StackGeometry,
    geodetic_to_ecef,
    radar_to_geo,
    zero_doppler_time,
)
from depsi.io.raster_geometry import check_stack_for_writing

__all__ = ["write_znap"]

RASTER_DIMS = ("azimuth", "range", "time")
ZNAP_FORMAT = "0.1"
#: SNAP's UTC epoch: times are [days, seconds, microseconds] after it.
SNAP_EPOCH = np.datetime64("2000-01-01T00:00:00", "ns")
#: Seconds between the state vectors written.
ORBIT_INTERVAL_SECONDS = 1
#: Largest tie-point spacing (pixels); grids have at least 3 x 3 points.
TIE_POINT_SUBSAMPLING = 16
#: Bytes of the stack held in memory at once while writing (one band of lines, all epochs).
WRITE_BUDGET_BYTES = 256 * 2**20
_ARRAY: dict[str, Any] = {"dtype": ">f4", "compressors": None, "filters": None, "fill_value": 0.0,
          "chunk_key_encoding": {"name": "v2", "separator": "."}}
_GEOCODING: dict[str, Any] = {"TiePointGeoCoding": {
    "___persistence_id___": "TiePointGC:1",
    "Coordinate_Reference_System": {"Horizontal_CS": {
        "HORIZONTAL_CS_TYPE": "GEOGRAPHIC",
        "Geographic_CS": {"Horizontal_Datum": {
            "HORIZONTAL_DATUM_NAME": "WGS-84",
            "Ellipsoid": {"ELLIPSOID_NAME": "WGS-84", "Ellipsoid_Parameters": {
                "ELLIPSOID_MAJ_AXIS": {"unit": "M", "value": "6378137.0"},
                "ELLIPSOID_MIN_AXIS": {"unit": "M", "value": "6356752.3"}}}}}}},
    "Geoposition": {"Geoposition_Points": {"TIE_POINT_GRID_NAME_LAT": "latitude",
                                           "TIE_POINT_GRID_NAME_LON": "longitude"}}}}
_VECTOR_DATA = {
    "ground_control_points.csv": (
        "#defaultCSS=symbol:plus; stroke:#ff8800; stroke-opacity:0.8; stroke-width:1.0\n"
        "org.esa.snap.GroundControlPoint\tgeometry:Point\tstyle_css:String\tlabel:String\t"
        "text:String\tpixelPos:Point\tgeoPos:Point\tdateTime:Date\n"),
    "pins.csv": (
        "#defaultCSS=symbol:pin; fill:#0000ff; fill-opacity:0.7; stroke:#ffffff; "
        "stroke-opacity:1.0; stroke-width:0.5\n"
        "org.esa.snap.Pin\tgeometry:Point\tstyle_css:String\tlabel:String\ttext:String\t"
        "pixelPos:Point\tgeoPos:Point\tdateTime:Date\n")}


# ----------------------------------------------------------------------------------------------
# Small helpers: SNAP times, date tags, metadata elements
# ----------------------------------------------------------------------------------------------

def _snap_utc(moment: Any) -> list[int]:
    """SNAP's UTC ``[days, seconds, microseconds]`` since 2000-01-01, to the microsecond.

    Examples
    --------
    >>> _snap_utc(np.datetime64("2023-03-31T05:50:35.812250"))
    [8490, 21035, 812250]
    """
    # numpy's stubs type datetime64 - datetime64 as datetime.timedelta, not timedelta64
    ns = int((np.datetime64(moment, "ns") - SNAP_EPOCH) / np.timedelta64(1, "ns"))  # type: ignore[operator]
    micro = (ns + 500) // 1000
    days, rest = divmod(micro, 86_400_000_000)
    seconds, micro = divmod(rest, 1_000_000)
    return [int(days), int(seconds), int(micro)]


def _iso(moment: Any) -> str:
    return np.datetime_as_string(np.datetime64(moment, "us")) + "Z"


def _date_tag(moment: Any) -> str:
    """``19Mar2023`` (English month, whatever the locale).

    Examples
    --------
    >>> _date_tag(np.datetime64("2023-03-19T05:50"))
    '19Mar2023'
    """
    day = np.datetime_as_string(np.datetime64(moment, "D"))
    return f"{day[8:10]}{MONTH_ABBREVIATIONS[int(day[5:7]) - 1]}{day[:4]}"


def _attribute(name: str, value: Any, kind: str, unit: str | None = None) -> dict[str, Any]:
    if kind == "float64":
        elems: Any = [float(value)]
    elif kind in ("int32", "uint32"):
        elems = [int(value)]
    elif kind == "uint8":
        elems = base64.b64encode(bytes([int(value)])).decode("ascii")
    elif kind == "utc":
        elems = _snap_utc(value)
    else:
        elems = str(value)
    out: dict[str, Any] = {"name": name, "readOnly": False, "data": {"type": kind,
                                                                     "elems": elems}}
    if unit is not None:
        out["unit"] = unit
    return out


def _element(name: str, attributes: list[dict] | None = None,
             elements: list[dict] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if attributes:
        out["attributes"] = attributes
    if elements:
        out["elements"] = elements
    return out


def _orbit_samples(orbit: Orbit) -> tuple[list[np.datetime64], np.ndarray, np.ndarray]:
    """State vectors every :data:`ORBIT_INTERVAL_SECONDS` across the orbit's span, at whole
    microseconds (the first at or after the orbit's first vector)."""
    first = orbit.reference + np.timedelta64(int(round(orbit.time[0] * 1e9)), "ns")
    start = SNAP_EPOCH + np.timedelta64(int(np.ceil(
        (first - SNAP_EPOCH) / np.timedelta64(1, "us"))) * 1000, "ns")
    start_s = orbit.seconds(start)
    count = int(np.floor((orbit.time[-1] - start_s) / ORBIT_INTERVAL_SECONDS + 1e-9)) + 1
    moments: list[np.datetime64] = [start + np.timedelta64(k * ORBIT_INTERVAL_SECONDS, "s")
                                    for k in range(count)]
    position, velocity, _ = orbit.state(np.array([orbit.seconds(m) for m in moments]))
    return moments, position, velocity


def _orbit_element(orbit: Orbit) -> dict[str, Any]:
    moments, position, velocity = _orbit_samples(orbit)
    vectors = []
    for k, moment in enumerate(moments):
        attributes = [_attribute("time", moment, "utc")]
        attributes += [_attribute(f"{c}_pos", position[k, i], "float64", "m")
                       for i, c in enumerate("xyz")]
        attributes += [_attribute(f"{c}_vel", velocity[k, i], "float64", "m/s")
                       for i, c in enumerate("xyz")]
        vectors.append(_element(f"orbit_vector{k + 1}", attributes))
    return _element("Orbit_State_Vectors", elements=vectors)


def _timing(name: str, first_line: np.datetime64, near: float, geometry: StackGeometry,
            orbit: Orbit, shape: tuple[int, int], polarisation: str) -> list[dict[str, Any]]:
    grid = geometry.grid
    last_line = first_line + np.timedelta64(int(round((shape[0] - 1) * grid.line_interval
                                                      * 1e9)), "ns")
    _, velocity, _ = orbit.state(np.array([orbit.seconds(first_line)]))
    frequency_mhz = SPEED_OF_LIGHT / geometry.wavelength / 1e6
    return [_attribute(*row) for row in (
        ("PRODUCT", name, "ascii"), ("PRODUCT_TYPE", "SLC", "ascii"),
        ("SPH_DESCRIPTOR", "depsi simulated SLC", "ascii"),
        ("antenna_pointing", grid.look_side, "ascii"),
        ("PASS", "ASCENDING" if velocity[0, 2] > 0 else "DESCENDING", "ascii"),
        ("first_line_time", first_line, "utc"), ("last_line_time", last_line, "utc"),
        ("SAMPLE_TYPE", "COMPLEX", "ascii"), ("mds1_tx_rx_polar", polarisation, "ascii"),
        ("azimuth_looks", 1.0, "float64"), ("range_looks", 1.0, "float64"),
        ("range_spacing", grid.range_spacing, "float64", "m"),
        ("radar_frequency", frequency_mhz, "float64", "MHz"),
        ("line_time_interval", grid.line_interval, "float64", "s"),
        ("num_output_lines", shape[0], "uint32", "lines"),
        ("num_samples_per_line", shape[1], "uint32", "samples"),
        ("avg_scene_height", geometry.height, "float64", "m"),
        ("slant_range_to_first_pixel", near, "float64", "m"))]


# ----------------------------------------------------------------------------------------------
# The writer
# ----------------------------------------------------------------------------------------------

def _check_writable(stack: xr.Dataset, geometry: StackGeometry) -> xr.Dataset:
    return check_stack_for_writing(stack, geometry, dates_in="product and band names",
                                   raster="znap")


def _tie_points(size: int) -> tuple[np.ndarray, float, float]:
    """Tie-point pixel indices (from 0), SNAP offset and subsampling: at least 3 points, at
    most :data:`TIE_POINT_SUBSAMPLING` pixels apart, the first on pixel 0's centre and the
    last at or beyond the last pixel's."""
    step = int(max(1, min(TIE_POINT_SUBSAMPLING, np.ceil(max(size - 1, 1) / 2))))
    count = max(3, int(np.ceil(max(size - 1, 0) / step)) + 1)
    return np.arange(count, dtype=np.float64) * step, 0.5, float(step)


def _metadata(stack: xr.Dataset, geometry: StackGeometry, names: list[dict[str, str]],
              shape: tuple[int, int], origin: tuple[int, int], polarisation: str,
              product: str) -> list[dict[str, Any]]:
    grid, mother = geometry.grid, geometry.mother
    time = stack["time"].values
    first_line = grid.first_line_time + np.timedelta64(
        int(round(origin[0] * grid.line_interval * 1e9)), "ns")
    near = grid.near_range + origin[1] * grid.range_spacing
    abstracted = _timing(f"{product}_{_date_tag(time[mother])}", first_line, near, geometry,
                         geometry.mother_orbit, shape, polarisation)
    abstracted += [
        _attribute("subset_offset_x", int(stack.attrs.get("range_offset") or 0) + origin[1],
                   "uint32", "samples"),
        _attribute("subset_offset_y", int(stack.attrs.get("azimuth_offset") or 0) + origin[0],
                   "uint32", "samples"),
        _attribute("coregistered_stack", 1, "uint8", "flag")]
    secondaries = []
    # a secondary's own first line and near range: its view of pixel (0, 0) on the mother grid
    lat, lon = radar_to_geo(geometry, np.array([float(origin[0])]), np.array([float(origin[1])]))
    target = geodetic_to_ecef(lat, lon, geometry.height)
    for k, (moment, orbit) in enumerate(zip(time, geometry.orbits)):
        if k == mother:
            continue
        t = zero_doppler_time(orbit, target)
        position, _, _ = orbit.state(t)
        name = f"{product}_Orb_{_date_tag(moment)}"
        attributes = _timing(name, orbit.reference + np.timedelta64(int(round(t[0] * 1e9)), "ns"),
                             float(np.linalg.norm(target[0] - position[0])), geometry, orbit,
                             shape, polarisation)
        attributes.append(_attribute("Slave_bands", f"{names[k]['i']} {names[k]['q']}", "ascii"))
        secondaries.append(_element(name, attributes, [_orbit_element(orbit)]))
    master_bands = (f"i_{polarisation}_mst_{_date_tag(time[mother])} "
                    f"q_{polarisation}_mst_{_date_tag(time[mother])}")
    return [_element("Abstracted_Metadata", abstracted,
                     [_orbit_element(geometry.mother_orbit)]),
            _element("Slave_Metadata", [_attribute("Master_bands", master_bands, "ascii")],
                     secondaries)]


def _rows_per_block(shape: tuple[int, int], n_time: int) -> int:
    per_row = max(1, shape[1] * n_time * 12)  # complex64 + float32 h2ph
    return int(max(1, min(shape[0], WRITE_BUDGET_BYTES // per_row)))


def _product_root_attrs(product: str, stack: xr.Dataset, geometry: StackGeometry,
                        shape: tuple[int, int], origin: tuple[int, int],
                        bands: list[str]) -> dict[str, Any]:
    grid = geometry.grid
    first_line = grid.first_line_time + np.timedelta64(
        int(round(origin[0] * grid.line_interval * 1e9)), "ns")
    last_line = first_line + np.timedelta64(int(round((shape[0] - 1) * grid.line_interval
                                                      * 1e9)), "ns")
    return {"znap_format": ZNAP_FORMAT, "product_name": product, "product_type": "SLC",
            "product_description": "Coregistered SLC stack written by depsi",
            "product_scene_raster_width": int(shape[1]),
            "product_scene_raster_height": int(shape[0]),
            "time_coverage_start": _iso(first_line), "time_coverage_end": _iso(last_line),
            "geocoding": _GEOCODING,
            "original_raster_data_node_order": bands + ["latitude", "longitude"]}


def write_znap(
    folder: str | os.PathLike,
    stack: xr.Dataset,
    geometry: StackGeometry,
    *,
    polarisation: str = "VV",
    overwrite: bool = False,
) -> list[Path]:
    """Write a raster stack and its geometry as SNAP znap products, one per date.

    Parameters
    ----------
    folder
        Where the products go (created): ``folder/YYYYMMDD-coreg.znap``, one per epoch.
    stack
        ``complex`` on ``(azimuth, range, time)`` with dates in ``time``, optional ``h2ph``,
        ``wavelength`` in attrs; ``azimuth``/``range`` consecutive pixel indices of
        ``geometry``'s grid (a subset's offset moves the written first-line time and range).
    geometry
        The stack's geometry, one orbit per epoch in time order.
    polarisation
        The polarisation named in the band names.
    overwrite
        Replace existing products of the same names.

    Returns
    -------
    list of pathlib.Path
        The products written, in time order.

    Raises
    ------
    FileExistsError
        A product exists and ``overwrite`` is False.
    ValueError, GeometryError
        No ``complex``, other dimensions, times that are not distinct dates, orbits not around
        their epoch's date, a wavelength different from the geometry's, pixel indices with gaps.

    Examples
    --------
    >>> import tempfile
    >>> from depsi.io import from_snap
    >>> from depsi.simulate import simulate_stack, simulated_geometry
    >>> stack, _ = simulate_stack(shape=(20, 30), n_epochs=3, seed=0)
    >>> geometry = simulated_geometry(stack)
    >>> raster = stack.drop_vars([c for c in stack.coords if c not in stack.dims])
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     products = write_znap(folder, raster, geometry)
    ...     ds = from_snap(products)
    ...     [p.name for p in products] == [f"{str(t)[:10].replace('-', '')}-coreg.znap"
    ...                                    for t in stack["time"].values]
    ...     bool((ds["complex"].values == stack["complex"].values).all())
    True
    True
    """
    import zarr

    if not isinstance(polarisation, str) or not re.fullmatch(r"[HV]{2}", polarisation):
        raise ValueError(f"polarisation: expected one of 'VV', 'VH', 'HH', 'HV', "
                         f"found {polarisation!r}")
    stack = _check_writable(stack, geometry)
    folder = Path(folder)
    time = stack["time"].values
    shape = (stack.sizes["azimuth"], stack.sizes["range"])
    targets = [folder / f"{np.datetime_as_string(t, unit='D').replace('-', '')}-coreg.znap"
               for t in time]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"folder: expected no products {existing}, found them (pass "
                              "overwrite=True to replace them)")
    origin = (int(stack["azimuth"].values[0]) if shape[0] else 0,
              int(stack["range"].values[0]) if shape[1] else 0)
    names = [{kind: f"{kind}_{polarisation}_{_date_tag(t)}" for kind in ("i", "q", "h2ph")}
             for t in time]
    has_h2ph = "h2ph" in stack.data_vars
    product = f"depsi_SLC_{np.datetime_as_string(time[geometry.mother], unit='D')}_Stack"
    metadata = json.dumps(_metadata(stack, geometry, names, shape, origin, polarisation,
                                    product), indent=1)
    az_nodes, _, az_step = _tie_points(shape[0])
    az_offset = 0.0  # rows at the line index itself, as SNAP's (snap.SNAP_TIE_POINT_CENTRE)
    rg_nodes, rg_offset, rg_step = _tie_points(shape[1])
    lat, lon = radar_to_geo(geometry, origin[0] + az_nodes[:, None],
                            origin[1] + rg_nodes[None, :])
    tie_attrs: dict[str, Any] = {"subsampling_y": az_step, "subsampling_x": rg_step,
                                 "units": "degree", "offset_x": rg_offset,
                                 "offset_y": az_offset, "znap_format": ZNAP_FORMAT}
    rows = _rows_per_block(shape, len(time))
    chunks = (max(rows, 1), max(shape[1], 1))

    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".znap.", suffix=".tmp", dir=folder))
    try:
        arrays: list[dict[str, Any]] = []
        for k, target in enumerate(targets):
            bands = [names[k]["i"], names[k]["q"]]
            if has_h2ph and k != geometry.mother:
                bands.append(names[k]["h2ph"])
            group = zarr.open_group(work / target.name, mode="w", zarr_format=2)
            group.attrs.update(_product_root_attrs(product, stack, geometry, shape, origin,
                                                   bands))
            written = {}
            for band in bands:
                unit = "imaginary" if band.startswith("q_") else "real"
                written[band] = group.create_array(
                    band, shape=shape, chunks=chunks, **_ARRAY,
                    attributes={"znap_format": ZNAP_FORMAT, "_ARRAY_DIMENSIONS": ["y", "x"],
                                "units": unit, "geocoding": _GEOCODING})
            arrays.append(written)
            for name, values in (("latitude", lat), ("longitude", lon)):
                grid = group.create_array(name, shape=values.shape, chunks=values.shape,
                                          **_ARRAY, attributes={
                                              "_ARRAY_DIMENSIONS": ["yt", "xt"], **tie_attrs})
                grid[:] = values.astype(np.float32)
            snap = work / target.name / "SNAP"
            zarr.open_group(snap, mode="w", zarr_format=2)
            (snap / "product_metadata.json").write_text(metadata)
            (snap / "vector_data").mkdir()
            for file, text in _VECTOR_DATA.items():
                (snap / "vector_data" / file).write_text(text)

        complex_data = stack["complex"].data
        h2ph_data = stack["h2ph"].transpose(*RASTER_DIMS).data if has_h2ph else None
        for start in range(0, shape[0], rows):  # one band of lines at a time
            window = slice(start, min(start + rows, shape[0]))
            if isinstance(complex_data, da.Array):
                block, factors = da.compute(complex_data[window],
                                            h2ph_data[window] if h2ph_data is not None else None)
            else:
                block = complex_data[window]
                factors = np.asarray(h2ph_data[window]) if h2ph_data is not None else None
            block = np.asarray(block).astype(np.complex64, copy=False)
            for k, written in enumerate(arrays):
                written[names[k]["i"]][window] = np.ascontiguousarray(block[:, :, k].real)
                written[names[k]["q"]][window] = np.ascontiguousarray(block[:, :, k].imag)
                if names[k]["h2ph"] in written:
                    written[names[k]["h2ph"]][window] = np.asarray(
                        factors[:, :, k], dtype=np.float32)
        _replace(work, targets)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return targets


def _replace(work: Path, targets: list[Path]) -> None:
    """Move the finished products into place, an old product of the same name out first."""
    trash = Path(tempfile.mkdtemp(prefix=".znap.", suffix=".old", dir=work.parent))
    try:
        for target in targets:
            if target.exists():
                os.replace(target, trash / target.name)
            os.replace(work / target.name, target)
    finally:
        shutil.rmtree(trash, ignore_errors=True)
