"""The reader of coregistered SNAP "znap" Zarr products (I/Q bands per date) into one SLC stack;
their writer is :mod:`depsi.io.znap_writer`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from depsi.conventions import MONTH_NUMBERS, SPEED_OF_LIGHT
from depsi.geometry import GeometryError, GeometryMode, Orbit, RadarGrid, StackGeometry
from depsi.io.bounded import MetadataError
from depsi.io.metadata import WAVELENGTH_RANGE
from depsi.io.raster import (
    RASTER_DIMS,
    _check_exist,
    _chunks,
    _finish,
    _iq_to_complex64,
    _path_list,
    _raster,
)
from depsi.io.raster_geometry import attach_geometry

logger = logging.getLogger(__name__)

_SNAP_BAND = re.compile(r"^(?P<kind>i|q|h2ph)_(?:(?P<swath>[A-Z]{2}\d)_)?(?P<pol>[HV]{2})"
                        r"(?:_(?P<role>mst|slv\d*))?_(?P<date>\d{2}[A-Za-z]{3}\d{4})$")
_SNAP_DATE = re.compile(r"(\d{2})([A-Za-z]{3})(\d{4})")
#: Where pixel (azimuth, range) lies in the coordinates of a znap product's tie-point grids:
#: rows at the line index itself, columns at the pixel's centre (as measured on the real pair:
#: docs/benchmarks.md, "Geometry from orbits").
SNAP_TIE_POINT_CENTRE = (0.0, 0.5)
#: SNAP writes UTC times as [days, seconds, microseconds] since 2000-01-01.
_MJD2000 = np.datetime64("2000-01-01T00:00:00", "ns")


def _snap_date(text: str, what: str) -> np.datetime64:
    """``19Mar2023`` -> ``2023-03-19`` at 00:00, without the locale."""
    match = _SNAP_DATE.fullmatch(text)
    month = MONTH_NUMBERS.get(match.group(2).lower()) if match else None
    try:
        if month is None or match is None:
            raise ValueError("unknown month")
        return np.datetime64(date(int(match.group(3)), month, int(match.group(1))), "ns")
    except ValueError as err:
        raise ValueError(f"{what}: expected a date such as '19Mar2023', found {text!r} "
                         f"({err})") from None


@dataclass(frozen=True)
class _SnapEpoch:
    date: np.datetime64
    product: Path
    i: str
    q: str
    h2ph: str | None
    role: str | None


def _open_znap(path: Path) -> xr.Dataset:
    """Open a znap product as stored (no masking of SNAP's 0 fill value)."""
    with warnings.catch_warnings():
        # macOS Finder litter (.DS_Store) inside the product folder is not a Zarr node
        warnings.filterwarnings("ignore", message=r"Object at .* is not recognized as a "
                                                  r"component of a Zarr hierarchy")
        try:
            return xr.open_zarr(path, consolidated=False, mask_and_scale=False, chunks={})
        except Exception as err:
            raise ValueError(f"SNAP product '{path}': expected a znap Zarr store readable by "
                             f"xarray.open_zarr, found an error: {err}") from err


#: Keys of a band's Zarr v2 ``.zarray`` the reader needs to read it as written.
ZARRAY_KEYS = ("shape", "chunks", "dtype")
_CHUNK_KEY = re.compile(r"^\d+([./]\d+)*$")


def _zarray(folder: Path, product: Path) -> dict[str, Any]:
    file = folder / ".zarray"
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"SNAP product '{product}': array metadata '{file}': expected Zarr v2 "
                         f"JSON, found an error: {err}") from None
    missing = [k for k in ZARRAY_KEYS if k not in meta]
    if not isinstance(meta, dict) or missing:
        raise ValueError(f"SNAP product '{product}': array metadata '{file}': expected the keys "
                         f"{list(ZARRAY_KEYS)}, found no {missing or 'JSON object'}")
    return meta


def _byte_order(dtype: str) -> str | None:
    """``'>'`` or ``'<'`` for a multi-byte Zarr v2 dtype, None for one-byte or unparsable ones."""
    try:
        parsed = np.dtype(dtype)
    except TypeError:
        return None
    return None if parsed.itemsize == 1 else (">" if parsed.byteorder == ">" or (
        parsed.byteorder == "=" and not np.little_endian) else "<")


def _check_chunk_files(folder: Path, meta: dict[str, Any], product: Path) -> None:
    """Each stored chunk of an uncompressed band holds exactly one chunk of samples."""
    if meta.get("compressor") is not None or meta.get("filters"):
        return
    expected = int(np.prod(meta["chunks"])) * np.dtype(meta["dtype"]).itemsize
    nested = meta.get("dimension_separator") == "/"
    files = (p for p in folder.rglob("*") if p.is_file()) if nested else \
        (p for p in folder.iterdir() if p.is_file())
    for file in files:
        key = str(file.relative_to(folder))
        if _CHUNK_KEY.match(key) and file.stat().st_size != expected:
            raise ValueError(
                f"SNAP product '{product}': band '{folder.name}' chunk '{file}': expected "
                f"{expected} bytes (an uncompressed chunk of {meta['chunks']} samples of "
                f"{meta['dtype']}), found {file.stat().st_size}")


def _check_band_arrays(path: Path) -> None:
    """The I/Q/h2ph bands' ``.zarray`` files and chunks, before the product is opened.

    Every band needs ``shape``, ``chunks`` and ``dtype``; its shape is the product's raster
    size (``.zattrs``) where stated; its byte order is that of the product's other arrays
    (SNAP writes a product in one byte order: a band that differs was not written so); an
    uncompressed chunk file holds exactly one chunk.
    """
    folders = sorted(p for p in path.iterdir() if (p / ".zarray").is_file())
    metas = {folder: _zarray(folder, path) for folder in folders
             if _SNAP_BAND.match(folder.name)}
    try:
        root = json.loads((path / ".zattrs").read_text())
    except (OSError, ValueError):
        root = {}
    size = tuple(root.get(k) for k in ("product_scene_raster_height",
                                       "product_scene_raster_width"))
    for folder, meta in metas.items():
        if None not in size and tuple(meta["shape"]) != size:
            raise ValueError(f"SNAP product '{path}': band '{folder.name}' ('{folder}/.zarray'): "
                             f"field 'shape': expected {list(size)} (the product's raster "
                             f"size in .zattrs), found {meta['shape']}")
    dtypes = {folder: str(zarray.get("dtype")) for folder in folders
              if (zarray := metas.get(folder) or _zarray_or_none(folder)) is not None}
    orders = {f: o for f, d in dtypes.items() if (o := _byte_order(d)) is not None}
    if len(set(orders.values())) > 1:
        counts = {o: sum(v == o for v in orders.values()) for o in set(orders.values())}
        usual = max(counts, key=counts.__getitem__)
        names = {">": "big-endian", "<": "little-endian"}
        odd = ", ".join(f"'{f.name}/.zarray' ({dtypes[f]})" for f, o in orders.items()
                        if o != usual)
        raise ValueError(f"SNAP product '{path}': field 'dtype': expected one byte order for "
                         f"all of its arrays ({names[usual]}, as {counts[usual]} of them), "
                         f"found another in {odd}")
    for folder, meta in metas.items():
        _check_chunk_files(folder, meta, path)


def _zarray_or_none(folder: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / ".zarray").read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _snap_attributes(element: dict) -> dict[str, Any]:
    return {a["name"]: a.get("data", {}).get("elems") for a in element.get("attributes", [])}


def _metadata_elements(file: Path, parsed: dict[bytes, dict[str, Any]]) -> dict[str, Any]:
    """The metadata elements of a ``product_metadata.json`` by name, parsed once per content
    into ``parsed`` (one reading of a stack: its products carry the same stack metadata, every
    secondary's timing and orbit, which grows as epochs times epochs: 12 MB a product at 36
    epochs, 0.5 s to parse). Read-only: shared by every product with the same bytes."""
    content = file.read_bytes()
    digest = hashlib.blake2b(content, digest_size=16).digest()
    if digest not in parsed:
        parsed[digest] = {e.get("name"): e for e in json.loads(content)}
    return parsed[digest]


def _snap_metadata(path: Path, parsed: dict[bytes, dict[str, Any]]) -> dict[str, Any]:
    """Wavelength, mother date, subset offsets from ``SNAP/product_metadata.json``."""
    file = path / "SNAP" / "product_metadata.json"
    if not file.is_file():
        raise MetadataError(f"SNAP product '{path}': expected SNAP/product_metadata.json (for "
                            "the radar frequency), found no such file", paths=[str(file)])
    try:
        elements = _metadata_elements(file, parsed)
    except (ValueError, AttributeError) as err:
        raise MetadataError(f"SNAP metadata '{file}': expected a JSON list of metadata "
                            f"elements, found unreadable content ({err})",
                            paths=[str(file)]) from None
    abstracted = _snap_attributes(elements.get("Abstracted_Metadata", {}))
    frequency = abstracted.get("radar_frequency")
    try:
        if frequency is None:
            raise TypeError
        frequency_hz = float(np.ravel(frequency)[0]) * 1e6  # SNAP states MHz
    except (TypeError, ValueError, IndexError):
        raise MetadataError(f"SNAP metadata '{file}': field 'Abstracted_Metadata/"
                            f"radar_frequency': expected the radar frequency in MHz, found "
                            f"{frequency!r}", paths=[str(file)]) from None
    wavelength = SPEED_OF_LIGHT / frequency_hz
    if not WAVELENGTH_RANGE[0] < wavelength < WAVELENGTH_RANGE[1]:
        raise MetadataError(f"SNAP metadata '{file}': field 'Abstracted_Metadata/"
                            f"radar_frequency': expected a radar frequency in MHz, found "
                            f"{frequency!r} (a wavelength of {wavelength:g} m)", paths=[str(file)])
    mother = None
    master_bands = _snap_attributes(elements.get("Slave_Metadata", {})).get("Master_bands")
    found = _SNAP_DATE.search(master_bands or "")
    if found:
        mother = _snap_date(found.group(0), f"{file}: Slave_Metadata/Master_bands")
    else:
        first_line = abstracted.get("first_line_time")
        if isinstance(first_line, list) and len(first_line) == 3:
            mother = (_MJD2000 + np.timedelta64(int(first_line[0]), "D")).astype(
                "datetime64[D]").astype("datetime64[ns]")

    def integer(name: str) -> int | None:
        value = abstracted.get(name)
        return int(np.ravel(value)[0]) if value is not None else None

    return {"wavelength": wavelength, "radar_frequency": frequency_hz, "mother": mother,
            "azimuth_offset": integer("subset_offset_y"),
            "range_offset": integer("subset_offset_x"), "file": str(file)}


def _snap_time(value: Any, what: str) -> np.datetime64:
    """SNAP's UTC ``[days, seconds, microseconds]`` since 2000-01-01 as datetime64[ns]."""
    try:
        days, seconds, micro = (int(v) for v in value)
    except (TypeError, ValueError):
        raise GeometryError(f"{what}: expected a UTC time [days, seconds, microseconds], "
                            f"found {value!r}") from None
    return (_MJD2000 + np.timedelta64(days, "D") + np.timedelta64(seconds, "s")
            + np.timedelta64(micro, "us"))


def _snap_orbit(element: dict, what: str) -> Orbit:
    """The ``Orbit_State_Vectors`` of an ``Abstracted_Metadata`` or ``Slave_Metadata`` item."""
    children = {e.get("name"): e for e in element.get("elements", [])}
    vectors = children.get("Orbit_State_Vectors", {}).get("elements", [])
    if not vectors:
        raise GeometryError(f"{what}: expected 'Orbit_State_Vectors' with state vectors, "
                            "found none")
    rows = [_snap_attributes(v) for v in vectors]
    try:
        times = np.array([_snap_time(r["time"], f"{what}/Orbit_State_Vectors") for r in rows])
        position = np.array([[float(np.ravel(r[f"{c}_pos"])[0]) for c in "xyz"] for r in rows])
        velocity = np.array([[float(np.ravel(r[f"{c}_vel"])[0]) for c in "xyz"] for r in rows])
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise GeometryError(f"{what}/Orbit_State_Vectors: expected time, x/y/z_pos and "
                            f"x/y/z_vel in every vector, found a vector without {err}") from None
    reference = times[0].astype("datetime64[D]").astype("datetime64[ns]")
    return Orbit(reference, (times - reference) / np.timedelta64(1, "ns") * 1e-9, position,
                 velocity, source=what)


def _snap_line_time(abstracted: dict, fields: dict[str, Any], what: str) -> np.datetime64:
    """Zero-Doppler time of the product's line 0.

    From the burst whose lines hold the subset's first line (``BurstBoundary``:
    ``FirstLineTime`` + (``subset_offset_y`` - ``FirstLineDeburst``) x ``line_time_interval``)
    where the product records its bursts, else ``first_line_time``, which can lie a line or so
    later (figures of the real pair: docs/benchmarks.md, "Geometry from orbits").
    """
    stated = _snap_time(fields.get("first_line_time"), f"{what}/first_line_time")
    children = {e.get("name"): e for e in abstracted.get("elements", [])}
    bursts = [b for swath in children.get("BurstBoundary", {}).get("elements", [])
              for b in swath.get("elements", [])]
    try:
        offset = float(np.ravel(fields.get("subset_offset_y") or [0])[0])
        interval = float(np.ravel(fields["line_time_interval"])[0])
        rows = [_snap_attributes(b) for b in bursts]
        spans = [(float(np.ravel(r["FirstLineDeburst"])[0]),
                  float(np.ravel(r["LastLineDeburst"])[0]),
                  float(np.ravel(r["FirstLineTime"])[0])) for r in rows]
    except (KeyError, TypeError, ValueError, IndexError):
        return stated
    for first, last, seconds in spans:
        if first <= offset <= last:
            moment = _MJD2000 + np.timedelta64(
                int(round((seconds + (offset - first) * interval) * 1e9)), "ns")
            shift = float((stated - moment) / np.timedelta64(1, "ns")) * 1e-9 / interval
            if abs(shift) > 0.1:
                logger.info("%s: line 0 at the burst's timing, %.2f lines before its "
                            "first_line_time", what, shift)
            return moment
    return stated


def _snap_geometry(path: Path, dates: np.ndarray, mother: np.datetime64 | None,
                   wavelength: float, parsed: dict[bytes, dict[str, Any]]) -> StackGeometry:
    """The stack's geometry from a SNAP product's metadata: the mother's timing and orbit
    (``Abstracted_Metadata``) and each secondary's orbit (``Slave_Metadata``)."""
    file = path / "SNAP" / "product_metadata.json"
    elements = _metadata_elements(file, parsed)
    abstracted = elements.get("Abstracted_Metadata", {})
    fields = _snap_attributes(abstracted)
    what = f"SNAP metadata '{file}': Abstracted_Metadata"

    def number(name: str) -> float:
        try:
            return float(np.ravel(fields[name])[0])
        except (KeyError, TypeError, ValueError, IndexError):
            raise GeometryError(f"{what}/{name}: expected a number, found "
                                f"{fields.get(name)!r}") from None

    first_line = _snap_line_time(abstracted, fields, what)
    grid = RadarGrid(first_line, number("line_time_interval"),
                     number("slant_range_to_first_pixel"), number("range_spacing"),
                     look_side="left" if fields.get("antenna_pointing") == "left" else "right")
    orbits = {first_line.astype("datetime64[D]"): _snap_orbit(abstracted, what)}
    for item in elements.get("Slave_Metadata", {}).get("elements", []):
        found = _SNAP_DATE.search(str(item.get("name", ""))[-9:])
        if found:
            day = _snap_date(found.group(0), f"{file}: Slave_Metadata/{item.get('name')}")
            orbits[day.astype("datetime64[D]")] = _snap_orbit(
                item, f"SNAP metadata '{file}': Slave_Metadata/{item.get('name')}")
    days = dates.astype("datetime64[D]")
    missing = [str(d) for d in days if d not in orbits]
    if missing:
        raise GeometryError(f"SNAP metadata '{file}': expected orbit state vectors for every "
                            f"date of the stack, found none for {missing} (orbits of "
                            f"{sorted(str(d) for d in orbits)})")
    # numpy's stubs lack datetime64(datetime64, unit)
    mother_day = first_line.astype("datetime64[D]") if mother is None else \
        np.datetime64(mother, "D")  # type: ignore[call-overload]
    if mother_day not in days:
        raise GeometryError(f"SNAP metadata '{file}': expected the mother's product "
                            f"({mother_day}, whose grid the stack is on) among the stack's "
                            f"dates, found only {[str(d) for d in days]}")
    height = number("avg_scene_height") if "avg_scene_height" in fields else 0.0
    return StackGeometry(grid, tuple(orbits[d] for d in days),
                         int(np.flatnonzero(days == mother_day)[0]), wavelength, height)


def _snap_epochs(ds: xr.Dataset, path: Path, polarisation: str) -> list[_SnapEpoch]:
    bands: dict[tuple[str, str | None], dict[str, str]] = {}
    for name in ds.data_vars:
        match = _SNAP_BAND.match(str(name))
        if match and match["pol"] == polarisation:
            bands.setdefault((match["date"], match["role"]), {})[match["kind"]] = str(name)
    epochs = []
    for (day, role), kinds in bands.items():
        if "i" not in kinds and "q" not in kinds:
            logger.info("SNAP product %s: band %s has no I/Q bands beside it; skipped",
                        path, kinds.get("h2ph"))
            continue
        for part, other in (("i", "q"), ("q", "i")):
            if part not in kinds:
                present = kinds[other]
                raise ValueError(f"SNAP product '{path}': expected band "
                                 f"{part + present[1:]!r} beside {present!r}, "
                                 "found no such band")
        epochs.append(_SnapEpoch(_snap_date(day, f"band {kinds['i']!r} of '{path}'"), path,
                                 kinds["i"], kinds["q"], kinds.get("h2ph"), role))
    return epochs


def _acquisition_days(elements: dict[str, Any], file: Path) -> dict[np.datetime64, str]:
    """The days of the acquisitions a product's metadata describes: the mother's
    ``first_line_time`` and each secondary's (else the date ending its element's name)."""
    days = {}
    items = [("Abstracted_Metadata", elements.get("Abstracted_Metadata", {}))]
    items += [(f"Slave_Metadata/{e.get('name')}", e)
              for e in elements.get("Slave_Metadata", {}).get("elements", [])]
    for where, element in items:
        first_line = _snap_attributes(element).get("first_line_time")
        if isinstance(first_line, list) and len(first_line) == 3:
            day = _snap_time(first_line, f"{file}: {where}/first_line_time")
        elif (found := _SNAP_DATE.search(str(element.get("name", ""))[-9:])) is not None:
            day = _snap_date(found.group(0), f"{file}: {where}")
        else:
            continue
        days[day.astype("datetime64[D]")] = where
    return days


def _check_epoch_names(epochs: list[_SnapEpoch], ds: xr.Dataset, path: Path,
                       parsed: dict[bytes, dict[str, Any]]) -> None:
    """Refuse bands whose names (and so dates) the product does not know: a band missing from
    the product's own ``original_raster_data_node_order``, or dated on a day none of its
    metadata's acquisitions (``first_line_time``) falls on."""
    listed = ds.attrs.get("original_raster_data_node_order")
    file = path / "SNAP" / "product_metadata.json"
    days = _acquisition_days(_metadata_elements(file, parsed), file)
    for epoch in epochs:
        bands = [b for b in (epoch.i, epoch.q, epoch.h2ph) if b is not None]
        unknown = [b for b in bands if listed is not None and b not in listed]
        if unknown and listed is not None:
            raise ValueError(f"SNAP product '{path}': band {unknown[0]!r}: expected one of the "
                             f"bands its .zattrs lists in original_raster_data_node_order "
                             f"{list(listed)}, found a band of another name (renamed?)")
        day = epoch.date.astype("datetime64[D]")
        if days and day not in days:
            raise ValueError(f"SNAP metadata '{file}': band {epoch.i!r} of '{path}': expected "
                             f"its date {day} to be that of an acquisition the metadata "
                             f"describes (first_line_time: "
                             f"{ {str(d): w for d, w in sorted(days.items())} }), found none")


def _interpolate_tie_points(grid: np.ndarray, azimuth: np.ndarray, range_: np.ndarray, *,
                            offset: tuple[float, float], subsampling: tuple[float, float],
                            centre: tuple[float, float] = (0.5, 0.5)) -> np.ndarray:
    """Bilinear interpolation of a SNAP tie-point grid at pixel indices (azimuth, range).

    SNAP's convention: pixel ``i`` covers ``[i, i + 1)`` and is sampled at its centre
    ``i + centre`` (0.5 by default); tie point ``k`` lies at ``offset + k * subsampling``.
    Outside the grid the outermost cell is extended linearly, as SNAP does.

    Examples
    --------
    >>> grid = np.array([[0.0, 10.0], [100.0, 110.0]])
    >>> _interpolate_tie_points(grid, np.array([[-0.5], [9.5]]), np.array([[-0.5, 4.5]]),
    ...                         offset=(0.0, 0.0), subsampling=(10.0, 10.0))
    array([[  0.,   5.],
           [100., 105.]])
    """
    grid = np.asarray(grid, dtype=np.float64)
    pos_az = (np.asarray(azimuth, dtype=np.float64) + centre[0] - offset[0]) / subsampling[0]
    pos_rg = (np.asarray(range_, dtype=np.float64) + centre[1] - offset[1]) / subsampling[1]
    i0 = np.clip(np.floor(pos_az).astype(np.int64), 0, grid.shape[0] - 2)
    j0 = np.clip(np.floor(pos_rg).astype(np.int64), 0, grid.shape[1] - 2)
    wa, wr = pos_az - i0, pos_rg - j0
    return ((1 - wa) * (1 - wr) * grid[i0, j0] + (1 - wa) * wr * grid[i0, j0 + 1]
            + wa * (1 - wr) * grid[i0 + 1, j0] + wa * wr * grid[i0 + 1, j0 + 1])


def _tie_point_geometry(ds: xr.Dataset, name: str, path: Path) -> dict[str, Any]:
    var = ds[name]
    need = ("offset_y", "offset_x", "subsampling_y", "subsampling_x")
    missing = [k for k in need if k not in var.attrs]
    if missing:
        raise ValueError(f"SNAP product '{path}': tie-point grid {name!r}: expected attributes "
                         f"{list(need)}, found no {missing}")
    grid = np.asarray(var.values, dtype=np.float64)
    if grid.ndim != 2 or min(grid.shape) < 2 or not np.isfinite(grid).all():
        raise ValueError(f"SNAP product '{path}': tie-point grid {name!r}: expected a finite "
                         f"grid of at least 2 x 2 points, found shape {grid.shape} with "
                         f"{int((~np.isfinite(grid)).sum())} non-finite value(s)")
    return {"grid": grid, "offset": (float(var.attrs["offset_y"]), float(var.attrs["offset_x"])),
            "subsampling": (float(var.attrs["subsampling_y"]),
                            float(var.attrs["subsampling_x"]))}


def _tie_point_block(azimuth: np.ndarray, range_: np.ndarray, **geometry: Any) -> np.ndarray:
    return _interpolate_tie_points(geometry["grid"], azimuth, range_,
                                   offset=geometry["offset"], subsampling=geometry["subsampling"],
                                   centre=geometry.get("centre", (0.5, 0.5)))


def _tie_point_raster(geometry: dict[str, Any], shape: tuple[int, int],
                      block: tuple[int, int]) -> da.Array:
    """Lazy per-pixel interpolation of a tie-point grid; the graph holds only the grid."""
    azimuth = da.arange(shape[0], chunks=block[0], dtype=np.float64)[:, None]
    range_ = da.arange(shape[1], chunks=block[1], dtype=np.float64)[None, :]
    return da.map_blocks(_tie_point_block, azimuth, range_, dtype=np.float64,
                         chunks=(azimuth.chunks[0], range_.chunks[1]),
                         meta=np.empty((0, 0), dtype=np.float64), **geometry)


def from_snap(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    polarisation: str = "VV",
    geometry: GeometryMode = "product",
    chunks: Any = None,
) -> xr.Dataset:
    """Read coregistered SNAP "znap" Zarr products (I/Q bands per date) into one SLC stack.

    Every ``i_<pol>_<date>`` / ``q_<pol>_<date>`` pair (also ``i_IW3_VV_mst_31Mar2023``-style
    names) of every product becomes one epoch ``i + 1j * q`` (values as stored: SNAP's no-data
    value 0 stays 0). ``h2ph_<pol>_<date>`` becomes ``h2ph``; the mother of the coregistration
    has none and gets zeros (a secondary without one gets NaN, with a warning). ``lat``/``lon``
    are the ``latitude``/``longitude`` tie-point grids interpolated bilinearly to every pixel
    (lazily, in SNAP's pixel-centre convention). ``wavelength`` is ``c / radar_frequency`` of
    ``SNAP/product_metadata.json``.

    Parameters
    ----------
    paths
        One or more ``.znap`` product folders of one coregistered stack.
    polarisation
        Which polarisation's bands to read.
    geometry
        ``"product"``: SNAP's own ``h2ph`` bands and tie-point lat/lon (h2ph from the orbits
        only where no band has it). ``"orbits"``: h2ph and lat/lon computed from the orbit state
        vectors of the metadata (:func:`depsi.io.raster_geometry.attach_geometry`; geocoded at
        ``avg_scene_height``), SNAP's kept as ``h2ph_product``, ``lat_product``,
        ``lon_product``. Either way the geometry goes into ``attrs["sar_geometry"]`` so that
        selected points are geocoded with their line of sight.
    chunks
        Block shape as in :func:`~depsi.io.binary.from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64) and ``h2ph`` (float32) on ``(azimuth, range, time)``, ``lat`` and
        ``lon`` (float64) on ``(azimuth, range)``; attrs ``wavelength``, ``polarisation``,
        ``coregistration_mother_time`` (ISO date), ``azimuth_offset``/``range_offset`` (the
        subset's position in the SNAP scene).

    Raises
    ------
    FileNotFoundError
        A missing product.
    ValueError
        No band of ``polarisation``, an I band without its Q band, bands of different shapes,
        the same date in two products, tie-point grids without their geometry; a band's
        ``.zarray`` without ``shape``/``chunks``/``dtype``, of another shape than the
        product's raster or another byte order than the product's other arrays, a chunk file
        of the wrong size, a band the product's ``.zattrs`` does not list, a band's date that
        no acquisition of the product's metadata (``first_line_time``) falls on (each named).
    MetadataError
        Missing/malformed ``product_metadata.json`` or products of different wavelengths.

    Examples
    --------
    The real SNAP pair in a clone's test data (``tests/data``, see its README):

    >>> from pathlib import Path
    >>> import depsi
    >>> folder = Path(depsi.__file__).parents[1] / "tests" / "data" / "sarxarray_slc" / "zarrs"
    >>> ds = from_snap(sorted(folder.glob("*-coreg.znap")))
    >>> dict(ds.sizes), round(ds.attrs["wavelength"], 4)
    ({'azimuth': 84, 'range': 338, 'time': 2}, 0.0555)
    """
    if not isinstance(polarisation, str) or not re.fullmatch(r"[HV]{2}", polarisation):
        raise ValueError(f"polarisation: expected one of 'VV', 'VH', 'HH', 'HV', "
                         f"found {polarisation!r}")
    products = _path_list(paths, "paths")
    _check_exist(products, "SNAP products", kind="product")
    for product in products:
        _check_band_arrays(product)
    opened = {p: _open_znap(p) for p in products}
    parsed: dict[bytes, dict[str, Any]] = {}  # this reading's metadata documents, by content
    meta = {p: _snap_metadata(p, parsed) for p in products}

    wavelengths = {p: m["wavelength"] for p, m in meta.items()}
    first = next(iter(wavelengths.values()))
    if any(abs(w - first) > 1e-5 * first for w in wavelengths.values()):
        raise MetadataError("wavelength: expected one radar wavelength for the stack, found "
                            + "; ".join(f"{w:.6f} m in '{p}'" for p, w in wavelengths.items()),
                            paths=[str(p) for p in products])

    epochs = [e for p in products for e in _snap_epochs(opened[p], p, polarisation)]
    for product in products:
        _check_epoch_names([e for e in epochs if e.product == product], opened[product],
                           product, parsed)
    if not epochs:
        found = sorted({m["pol"] for ds in opened.values() for n in ds.data_vars
                        if (m := _SNAP_BAND.match(str(n)))})
        raise ValueError(f"polarisation: expected I/Q bands of {polarisation!r} in "
                         f"{[str(p) for p in products]}, found polarisations {found}")
    epochs.sort(key=lambda e: e.date)
    dates = np.array([e.date for e in epochs], dtype="datetime64[ns]")
    for a, b in zip(epochs, epochs[1:]):
        if a.date == b.date:
            raise ValueError(f"dates: expected one epoch per date, found {str(a.date)[:10]} in "
                             f"band {a.i!r} of '{a.product}' and band {b.i!r} of '{b.product}'")
    shapes = {(str(e.product), e.i): opened[e.product][e.i].shape for e in epochs}
    shape = next(iter(shapes.values()))
    if any(s != shape for s in shapes.values()) or len(shape) != 2:
        raise ValueError(f"bands: expected one (azimuth, range) shape for all I/Q bands, found "
                         f"{ {f'{p}:{b}': s for (p, b), s in shapes.items()} }")

    mother = next((m["mother"] for m in meta.values() if m["mother"] is not None), None)
    block = _chunks(chunks, shape, len(epochs))
    planes, h2ph = [], []
    for epoch in epochs:
        ds = opened[epoch.product]
        planes.append(da.map_blocks(_iq_to_complex64, ds[epoch.i].data, ds[epoch.q].data,
                                    dtype=np.complex64))
        if epoch.h2ph is not None:
            h2ph.append(ds[epoch.h2ph].data.astype(np.float32))
        else:
            is_mother = epoch.role == "mst" or (mother is not None and epoch.date == mother)
            if not is_mother:
                logger.warning("SNAP product %s: no h2ph band for %s: h2ph is NaN for this date",
                               epoch.product, str(epoch.date)[:10])
            h2ph.append(da.full(shape, 0.0 if is_mother else np.nan, dtype=np.float32,
                                chunks=planes[-1].chunks))
    cube = da.stack(planes, axis=-1).rechunk(block)
    reference = meta[products[0]]
    attrs = {"wavelength": first, "polarisation": polarisation,
             "coregistration_mother_time": None if mother is None else str(mother)[:10],
             "azimuth_offset": reference["azimuth_offset"],
             "range_offset": reference["range_offset"]}
    out = _raster(cube, dates, attrs)
    if any(e.h2ph is not None for e in epochs):
        out["h2ph"] = (RASTER_DIMS, da.stack(h2ph, axis=-1).rechunk(block))

    geo_source = opened[products[0]]
    if {"latitude", "longitude"} <= set(geo_source.data_vars):
        for name, coord in (("latitude", "lat"), ("longitude", "lon")):
            tie_grid = _tie_point_geometry(geo_source, name, products[0]) | {
                "centre": SNAP_TIE_POINT_CENTRE}
            out = out.assign_coords({coord: (("azimuth", "range"),
                                             _tie_point_raster(tie_grid, shape, block[:2]))})
    else:
        logger.warning("SNAP product %s has no latitude/longitude tie-point grids: no lat/lon",
                       products[0])
    try:
        stack_geometry = _snap_geometry(products[0], dates, mother, first, parsed)
    except GeometryError:
        if geometry == "orbits" or "h2ph" not in out.data_vars:
            raise
        logger.warning("SNAP product %s: no usable orbits; the product's h2ph and lat/lon "
                       "are used as they are", products[0], exc_info=True)
    else:
        out = attach_geometry(out, stack_geometry, mode=geometry)
    return _finish(out, "depsi.io.znap.from_snap",
                   lazy_coords=("lat", "lon", "lat_product", "lon_product"))


__all__ = [
    "SNAP_TIE_POINT_CENTRE",
    "from_snap",
]
