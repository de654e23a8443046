"""Read DORIS-5 stack folders (TU Delft ``doris_stack``, Sentinel-1) as raster stacks.

``from_doris_stack`` opens the ``stack/`` folder that doris_stack leaves (and DePSI users keep),
one folder per acquisition date, as a Dask-backed ``(azimuth, range, time)`` Dataset with its
:class:`~depsi.geometry.StackGeometry`; :func:`depsi.io.doris_writer.write_doris_stack`
(for fixtures and ``depsi simulate``) writes a stack in that layout.

The layout, per date folder ``YYYYMMDD/``, as TUDelftGeodesy/Doris
``doris_stack/main_code/single_master_stack.py`` writes it (``update_res``, ``image_path``,
``fake_master_resample``, the geocoding symlinks) and the DePSI / PyDePSI example scripts and
CAROLINE's DePSI set-up read it (mother's ``slave.res``, ``phi.raw`` lat, ``lam.raw`` lon,
float32; zero h2ph at the mother):

``slave_rsmp_reramped.raw``
    The SLC resampled onto the mother's grid and reramped, in the ``Data_output_format`` of the
    ``resample`` section of ``slave.res`` (``complex_real4``: complex64; ``complex_short``:
    int16 I/Q pairs). The mother's folder holds one too (doris_stack fakes a resample step for
    the mother, writing complex64); failing that, the mother's SLC is read from ``master.raw``
    or ``slc.raw`` in the ``crop`` section's format.
``slave.res``
    This date's result file: ``readfiles`` (its acquisition), ``precise_orbits`` (state vectors:
    seconds of the UTC day, X, Y, Z), ``crop`` (window w.r.t. its original image) and
    ``resample`` (window w.r.t. the original mother image: the size of the ``.raw`` files).
``master.res``
    The mother's result file, copied into every folder: its ``crop`` window and timing are the
    stack's radar grid, its ``First_pixel_azimuth_time`` gives the mother date.
``ifgs.res``
    The interferogram with the mother (``coarse_orbits``: baselines at the scene centre).
``h2ph_srd.raw``
    float32 height-to-phase factors w.r.t. the mother (DORIS ``comp_refdem``,
    ``CRD_OUT_DEM_H2PH``).
``phi.raw``, ``lam.raw``, ``dem_radar.raw``
    float32 latitude, longitude (degrees) and height (m) of every pixel, computed in the
    mother's folder and linked into the others.

Where the public sources are silent, this module takes the plain reading:

- Byte order is little-endian (doris_stack on Linux writes with ``numpy.memmap`` and C++
  ``ofstream``, both native).
- The mother's h2ph is zero; its own ``h2ph_srd.raw``, if any, is not read (doris_stack's fake
  mother steps link other dates' products into the mother's folder).
- ``dem_radar.raw`` holds heights above the WGS84 ellipsoid (doris_stack's ``create_dem``
  removes EGM96 from SRTM before radar-coding).
- The mother's crop window is the stack's window: every date's resample window must be that
  window (``First_line``/``Last_line``/``First_pixel``/``Last_pixel`` w.r.t. original_master).
- Sentinel-1 looks right.
- Line ``k`` of the stack is at ``First_pixel_azimuth_time + (First_line - 1 + k) *
  Azimuth_time_interval`` of ``master.res``; pixel ``j`` at slant range
  ``c * Range_time_to_first_pixel / 2 + (First_pixel - 1 + j) * slant_range_spacing``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize

from depsi.geometry import (
    GeometryError,
    GeometryMode,
    Orbit,
    RadarGrid,
    StackGeometry,
)
from depsi.io.binary import from_binary
from depsi.io.bounded import MetadataError
from depsi.io.metadata import combine_metadata, read_metadata
from depsi.io.raster import RASTER_DIMS, _chunks, _file_dtype
from depsi.io.raster_geometry import attach_geometry

logger = logging.getLogger(__name__)

#: The resampled, reramped SLC of every date (the mother's too), as doris_stack names it.
SLC_FILE = "slave_rsmp_reramped.raw"
#: Where else the mother's SLC may be, in the ``crop`` section's format.
MOTHER_SLC_FILES = ("master.raw", "slc.raw")
#: Height-to-phase factors of a date w.r.t. the mother (float32).
H2PH_FILE = "h2ph_srd.raw"
#: Latitude, longitude and height rasters of the mother (float32), as DORIS geocoding names them.
LAT_FILE, LON_FILE, HEIGHT_FILE = "phi.raw", "lam.raw", "dem_radar.raw"
#: Result files of a date folder.
MOTHER_RES, EPOCH_RES, IFGS_RES = "master.res", "slave.res", "ifgs.res"
#: On-disk dtype of every real raster (little-endian float32, DORIS ``real4``).
REAL_DTYPE = np.dtype("<f4")

_DATE_FOLDER = re.compile(r"^\d{8}$")


# ----------------------------------------------------------------------------------------------
# Lazy real rasters
# ----------------------------------------------------------------------------------------------

class _RealStack:
    """Array-like ``(azimuth, range, n)`` over float32 files (None: zeros), memory-mapped per block.

    As :class:`depsi.io.raster._BinaryStack`: the graph holds file names, never pixel data.
    """

    def __init__(self, paths: Sequence[Path | None], shape: tuple[int, int]):
        self.paths = tuple(None if p is None else str(p) for p in paths)
        self.file_shape = shape
        self.shape = (*shape, len(self.paths))
        self.dtype = np.dtype(np.float32)
        self.ndim = 3

    def __dask_tokenize__(self) -> tuple:
        stats = [None if p is None else (os.stat(p).st_mtime_ns, os.stat(p).st_size)
                 for p in self.paths]
        return ("depsi.io.doris._RealStack", self.paths, stats, self.file_shape)

    def __getitem__(self, key: tuple[slice, slice, slice]) -> np.ndarray:
        azimuth, range_, epochs = key
        rows = range(self.file_shape[0])[azimuth]
        cols = range(self.file_shape[1])[range_]
        files = self.paths[epochs]
        out = np.zeros((len(rows), len(cols), len(files)), dtype=np.float32)
        for k, path in enumerate(files):
            if path is not None:
                mapped = np.memmap(path, dtype=REAL_DTYPE, mode="r", shape=self.file_shape)
                out[:, :, k] = mapped[azimuth, range_]
                del mapped
        return out


def _real_raster(paths: Sequence[Path | None], shape: tuple[int, int],
                 chunks: tuple[int, int]) -> da.Array:
    stack = _RealStack(paths, shape)
    return da.from_array(stack, chunks=(*chunks, len(paths)), lock=False, fancy=False,
                         asarray=False, meta=np.empty((0, 0, 0), dtype=np.float32),
                         name="doris-real-" + tokenize(stack))


# ----------------------------------------------------------------------------------------------
# Reading: the plan of a stack, checked before any pixel is read
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Epoch:
    day: str
    folder: Path
    res: Path
    meta: dict[str, Any]
    slc: Path
    data_format: str


def _date_folders(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise FileNotFoundError(f"DORIS stack folder '{folder}' does not exist")
    found = sorted(p for p in folder.iterdir() if p.is_dir() and _DATE_FOLDER.match(p.name))
    if not found and (folder / "stack").is_dir():
        return _date_folders(folder / "stack")
    if not found:
        raise FileNotFoundError(f"DORIS stack folder '{folder}': expected date folders "
                                f"YYYYMMDD (doris_stack's stack/), found none")
    return found


def _day(moment: np.datetime64) -> str:
    # numpy's stubs lack datetime64(datetime64, unit)
    return np.datetime_as_string(np.datetime64(moment, "D")).replace("-", "")  # type: ignore[call-overload]


def _mother(folders: list[Path]) -> tuple[str, dict[str, Any]]:
    """The mother date and its ``master.res`` metadata; every ``master.res`` must agree."""
    found = [f / MOTHER_RES for f in folders if (f / MOTHER_RES).is_file()]
    if not found:
        raise FileNotFoundError(f"DORIS stack '{folders[0].parent}': expected a {MOTHER_RES} "
                                f"in the date folders (it gives the mother), found none")
    days = {path: _day(read_metadata(path)["first_azimuth_time"]) for path in found}
    mother = days[found[0]]
    others = {str(p): d for p, d in days.items() if d != mother}
    if others:
        raise MetadataError(f"{MOTHER_RES}: expected one mother date for the stack, found "
                            f"{mother} in '{found[0]}' and {others}", paths=[str(p) for p in found])
    path = folders[0].parent / mother / MOTHER_RES
    if not path.is_file():
        raise FileNotFoundError(f"DORIS stack '{folders[0].parent}': the {MOTHER_RES} files "
                                f"give mother date {mother}, but '{path}' does not exist")
    return mother, read_metadata(path)


def _window(meta: dict[str, Any], section: str) -> dict[str, Any] | None:
    window = meta.get(section)
    return window if window and "number_of_lines" in window else None


def _bounds(window: dict[str, Any]) -> tuple[int, int, int, int]:
    return (window["first_line"], window["last_line"], window["first_pixel"],
            window["last_pixel"])


def _stack_window(mother_meta: dict[str, Any]) -> dict[str, Any]:
    """The mother's crop (1-based, inclusive, w.r.t. its original image), else the whole image."""
    crop = _window(mother_meta, "crop")
    if crop is not None:
        return crop
    lines = mother_meta["number_of_lines_original"]
    pixels = mother_meta["number_of_pixels_original"]
    return {"first_line": 1, "last_line": lines, "first_pixel": 1, "last_pixel": pixels,
            "number_of_lines": lines, "number_of_pixels": pixels, "data_file": None,
            "data_format": None}


def _epoch(folder: Path, mother: str, stack_window: dict[str, Any]) -> _Epoch:
    """One date's metadata, SLC file and format; its window must be the stack's."""
    res = folder / EPOCH_RES
    if not res.is_file() and folder.name == mother and (folder / MOTHER_RES).is_file():
        res = folder / MOTHER_RES
    if not res.is_file():
        raise FileNotFoundError(f"DORIS stack date {folder.name}: expected '{res}' (this "
                                f"date's metadata), found no such file")
    meta = read_metadata(res, driver="doris5")
    if _day(meta["first_azimuth_time"]) != folder.name:
        raise MetadataError(f"metadata file '{res}': field 'First_pixel_azimuth_time (UTC)': "
                            f"expected a time on {folder.name} (the folder's date), found "
                            f"{meta['first_azimuth_time']}", paths=[str(res)])
    resample = _window(meta, "resample")
    section, window = ("resample", resample) if resample else ("crop", _window(meta, "crop"))
    if resample is None and folder.name != mother:
        raise MetadataError(f"metadata file '{res}': section 'resample': expected the window "
                            f"of the resampled image (First_line/Last_line/First_pixel/"
                            f"Last_pixel w.r.t. original_master), found no such section",
                            paths=[str(res)])
    window = window or stack_window
    if _bounds(window) != _bounds(stack_window):
        raise MetadataError(f"metadata file '{res}': section '{section}': expected the "
                            f"mother's window (First_line, Last_line, First_pixel, Last_pixel) "
                            f"= {_bounds(stack_window)}, found {_bounds(window)}",
                            paths=[str(res)])
    slc, data_format = folder / SLC_FILE, "complex_real4"  # doris_stack's reramped SLC
    if resample and resample.get("data_file") in (None, SLC_FILE):
        data_format = resample.get("data_format") or data_format
    if not slc.is_file() and folder.name == mother:
        fallback = next((folder / n for n in MOTHER_SLC_FILES if (folder / n).is_file()), None)
        if fallback is not None:
            crop = _window(meta, "crop") or {}
            slc, data_format = fallback, crop.get("data_format") or "complex_short"
    if not slc.is_file():
        names = [SLC_FILE, *MOTHER_SLC_FILES] if folder.name == mother else [SLC_FILE]
        raise FileNotFoundError(f"DORIS stack date {folder.name}: expected the SLC "
                                f"{' or '.join(names)} in '{folder}', found none")
    try:
        _file_dtype(data_format, "<")
    except ValueError:
        raise MetadataError(f"metadata file '{res}': field 'Data_output_format' (section "
                            f"'{section}'): expected complex_real4 or complex_short, found "
                            f"{data_format!r}", paths=[str(res)]) from None
    return _Epoch(folder.name, folder, res, meta, slc, data_format)


def _check_size(path: Path, shape: tuple[int, int], itemsize: int, what: str, source: str
                ) -> None:
    expected = shape[0] * shape[1] * itemsize
    size = os.path.getsize(path)
    if size != expected:
        raise ValueError(f"'{path}': expected {expected} bytes ({shape[0]} lines x {shape[1]} "
                         f"pixels of {itemsize}-byte {what}, as {source}), found {size} bytes")


def _h2ph_files(epochs: list[_Epoch], mother: str) -> list[Path | None] | None:
    """One ``h2ph_srd.raw`` per secondary date (None at the mother), or None if no date has one."""
    wanted = {e.day: e.folder / H2PH_FILE for e in epochs if e.day != mother}
    present = {d: p for d, p in wanted.items() if p.is_file()}
    if not present:
        return None
    missing = [str(p) for d, p in wanted.items() if d not in present]
    if missing:
        raise FileNotFoundError(f"{H2PH_FILE}: expected one per secondary date (since "
                                f"{len(present)} of {len(wanted)} dates have one), found none "
                                f"at {missing}")
    return [None if e.day == mother else present[e.day] for e in epochs]


def _mother_raster(epochs: list[_Epoch], mother: str, name: str) -> Path | None:
    """``name`` in the mother's folder, else in the first date folder that has it."""
    folders = [e.folder for e in epochs if e.day == mother] + \
              [e.folder for e in epochs if e.day != mother]
    return next((f / name for f in folders if (f / name).is_file()), None)


def _orbit(epoch: _Epoch) -> Orbit:
    vectors = epoch.meta.get("orbit")
    source = f"'{epoch.res}' section 'precise_orbits'"
    if vectors is None:
        raise GeometryError(f"{source}: expected orbit state vectors (t X Y Z lines), found "
                            "none")
    return Orbit(reference=epoch.meta["date"], time=vectors[:, 0], position=vectors[:, 1:4],
                 velocity=None, source=source)


def _radar_grid(meta: dict[str, Any], window: dict[str, Any]) -> RadarGrid:
    """The grid of the crop: line k at t0 + (first_line - 1 + k) dt; pixel j likewise in range."""
    interval = meta["azimuth_time_interval"]
    offset_ns = round((window["first_line"] - 1) * interval * 1e9)
    return RadarGrid(
        first_line_time=meta["first_azimuth_time"] + np.timedelta64(offset_ns, "ns"),
        line_interval=interval,
        near_range=(meta["slant_range_first_pixel"]
                    + (window["first_pixel"] - 1) * meta["slant_range_spacing"]),
        range_spacing=meta["slant_range_spacing"], look_side="right")


def from_doris_stack(folder: str | os.PathLike, *, geometry: GeometryMode = "product",
                     chunks: Any = None) -> xr.Dataset:
    """Open a DORIS-5 stack folder (doris_stack's ``stack/``) as a lazy SLC stack with geometry.

    Every check runs before any pixel is read: the date folders, each date's ``slave.res`` (its
    date against the folder name, the wavelength, the resampled window against the mother's
    crop), the mother's ``master.res``, and the size of every raster against the windows.

    Parameters
    ----------
    folder
        The ``stack`` folder with one ``YYYYMMDD`` folder per date (or its parent).
    geometry
        ``"product"``: keep the stack's ``h2ph_srd.raw`` and ``phi``/``lam`` where present;
        ``"orbits"``: compute h2ph and lat/lon from the orbits as well (see
        :func:`~depsi.io.raster_geometry.attach_geometry`).
    chunks
        Block shape as in :func:`~depsi.io.binary.from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64) and ``h2ph`` (float32; zero at the mother; from the orbits when
        no date has an ``h2ph_srd.raw``) on ``(azimuth, range, time)``, all Dask; coordinates
        ``lat``/``lon`` (from ``phi.raw``/``lam.raw``) and ``height`` (``dem_radar.raw``) on
        ``(azimuth, range)`` where present; attrs ``wavelength``, ``sar_geometry`` and the
        others of :func:`~depsi.io.raster_geometry.attach_geometry`, ``azimuth_offset`` /
        ``range_offset`` (the crop's position in the mother's original image, 0-based).

    Raises
    ------
    FileNotFoundError
        No date folders, no ``master.res``, a date without ``slave.res`` or SLC, or some
        secondary dates with ``h2ph_srd.raw`` and others without (the missing ones named).
    MetadataError
        A malformed ``.res`` (file and field named), mixed mothers, a date other than the
        folder's, a window other than the mother's crop, an unknown data format.
    ValueError
        A raster whose size differs from the window (file, expected and found bytes).
    GeometryError
        A ``.res`` without orbit state vectors or with impossible ones.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> from depsi.geometry import Orbit, RadarGrid, StackGeometry
    >>> time = np.datetime64("2020-01-01", "ns") + np.arange(2) * np.timedelta64(12, "D")
    >>> t = np.arange(20000.0, 20100.0)
    >>> omega = 2 * np.pi / 5900  # a circular polar orbit, 7000 km from the Earth's centre
    >>> xyz = 7.0e6 * np.stack([np.cos(omega * t), 0 * t, np.sin(omega * t)], axis=-1)
    >>> orbits = [Orbit(d, t, xyz + [0.0, 100.0 * k, 0.0]) for k, d in enumerate(time)]
    >>> grid = RadarGrid(time[0] + np.timedelta64(20050, "s"), 0.002, 800e3, 2.33)
    >>> stack = xr.Dataset({"complex": (RASTER_DIMS, np.ones((4, 5, 2), "c8")),
    ...                     "h2ph": (RASTER_DIMS, np.zeros((4, 5, 2), "f4"))},
    ...                    coords={"time": time}, attrs={"wavelength": 0.0555})
    >>> from depsi.io.doris_writer import write_doris_stack
    >>> folder = tempfile.mkdtemp()
    >>> _ = write_doris_stack(folder, stack, StackGeometry(grid, orbits, 0, 0.0555))
    >>> ds = from_doris_stack(folder)
    >>> dict(ds.sizes), ds.attrs["mother_time"]
    ({'azimuth': 4, 'range': 5, 'time': 2}, '2020-01-01')
    """
    folders = _date_folders(Path(folder))
    mother, mother_meta = _mother(folders)
    window = _stack_window(mother_meta)
    shape = (window["number_of_lines"], window["number_of_pixels"])
    epochs = [_epoch(f, mother, window) for f in folders]
    stack_meta = combine_metadata([e.meta for e in epochs])  # one wavelength, unique dates
    window_source = (f"the crop window (First_line..Last_line, First_pixel..Last_pixel) of "
                     f"'{folders[0].parent / mother / MOTHER_RES}' gives")
    for e in epochs:
        _check_size(e.slc, shape, _file_dtype(e.data_format, "<").itemsize, e.data_format,
                    window_source)
    h2ph_files = _h2ph_files(epochs, mother)
    rasters = {name: _mother_raster(epochs, mother, name)
               for name in (LAT_FILE, LON_FILE, HEIGHT_FILE)}
    for path in [*(h2ph_files or []), *rasters.values()]:
        if path is not None:
            _check_size(path, shape, REAL_DTYPE.itemsize, "real4 (float32)", window_source)
    orbits = tuple(_orbit(e) for e in epochs)
    mother_index = [e.day for e in epochs].index(mother)
    stack_geometry = StackGeometry(_radar_grid(mother_meta, window), orbits, mother_index,
                                   stack_meta["wavelength"])

    stack = _slc_stack(epochs, shape, chunks)
    block = stack["complex"].data.chunksize[:2]
    if h2ph_files is not None:
        h2ph = _real_raster(h2ph_files, shape, block).rechunk(stack["complex"].data.chunks)
        stack["h2ph"] = (RASTER_DIMS, h2ph)
        stack["h2ph"].attrs.update(units="1", long_name=f"height-to-phase factor ({H2PH_FILE})")
    lazy = {name: _real_raster([path], shape, block)[:, :, 0]
            for name, path in rasters.items() if path is not None}
    for name, coord in ((LAT_FILE, "lat"), (LON_FILE, "lon")):
        if name in lazy:
            stack = stack.assign_coords({coord: (("azimuth", "range"),
                                                 lazy[name].astype(np.float64))})
    stack.attrs.update(azimuth_offset=int(window["first_line"]) - 1,
                       range_offset=int(window["first_pixel"]) - 1)
    height = lazy.get(HEIGHT_FILE)
    if height is None:
        logger.info("DORIS stack %s: no %s: geocoding at the ellipsoid", folder, HEIGHT_FILE)
    return attach_geometry(stack, stack_geometry, mode=geometry, height=height)


def _slc_stack(epochs: list[_Epoch], shape: tuple[int, int], chunks: Any) -> xr.Dataset:
    """``from_binary`` per data format (almost always one), joined along time."""
    block = _chunks(chunks, shape, len(epochs))
    parts = []
    for data_format in dict.fromkeys(e.data_format for e in epochs):
        group = [e for e in epochs if e.data_format == data_format]
        parts.append(from_binary([e.slc for e in group], shape, dtype=data_format,
                                 metadata=[e.meta for e in group], chunks=block, byteorder="<"))
    if len(parts) == 1:
        return parts[0]
    joined = xr.concat(parts, dim="time", combine_attrs="override").sortby("time")
    return joined.chunk(dict(zip(RASTER_DIMS, block)))


__all__ = [
    "H2PH_FILE",
    "HEIGHT_FILE",
    "LAT_FILE",
    "LON_FILE",
    "SLC_FILE",
    "from_doris_stack",
]
