"""Readers of coregistered SLC stacks into lazy raster Datasets ``(azimuth, range, time)``.

Each reader checks its input before any pixel is read (files present, sizes, dates, wavelengths)
and returns a Dask-backed Dataset with ``complex`` (complex64), ``time`` as dates, ``wavelength``
in the attributes when the source gives it, and ``h2ph``, ``lat``/``lon`` where the format holds
them. The task graph holds file names and windows, never pixel data: one task per block.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from dask.base import tokenize

from depsi.conventions import MONTH_NUMBERS, SPEED_OF_LIGHT
from depsi.io.cf import with_cf_attributes
from depsi.io.geometry import (
    GeometryError,
    GeometryMode,
    Orbit,
    RadarGrid,
    StackGeometry,
    attach_geometry,
)
from depsi.io.metadata import (
    WAVELENGTH_RANGE,
    MetadataError,
    read_metadata_stack,
    resolve_metadata,
)
from depsi.io.store import DEFAULT_CHUNK_BYTES
from depsi.io.validate import InputValidationError, check_epoch_span
from depsi.stm.schema import STMValidationError, validate

logger = logging.getLogger(__name__)

#: Dimensions of an SLC stack, in storage order.
RASTER_DIMS = ("azimuth", "range", "time")

#: Names accepted for interleaved 16-bit integer I/Q pairs (DORIS ``complex_short``, GDAL
#: ``CInt16``, SNAP exports).
COMPLEX_INT16_NAMES = ("complex_int16", "complex_short", "cint16")

#: Names DORIS writes for complex float32 data.
COMPLEX64_NAMES = ("complex_real4",)

_BYTEORDERS = {"<": "<", "little": "<", ">": ">", "big": ">", "=": "=", "native": "="}


# ----------------------------------------------------------------------------------------------
# Shared checks: files, dates, wavelength, chunks
# ----------------------------------------------------------------------------------------------

def _path_list(files: str | os.PathLike | Iterable[str | os.PathLike], what: str) -> list[Path]:
    items = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not items:
        raise ValueError(f"{what}: expected at least one path, found none")
    return [Path(f) for f in items]


def _check_exist(paths: Sequence[Path], what: str, *, kind: str = "file") -> None:
    test = Path.is_file if kind == "file" else Path.exists
    missing = [str(p) for p in paths if not test(p)]
    if missing:
        raise FileNotFoundError(f"{what}: {len(missing)} of {len(paths)} {kind}(s) do not "
                                f"exist: {missing}")


def _parse_dates(dates: Iterable[Any], n: int, *, what: str = "dates") -> np.ndarray:
    """One ``datetime64[ns]`` per epoch from strings, dates, datetimes or datetime64 values."""
    items = [dates] if isinstance(dates, (str, date, np.datetime64)) else list(dates)
    if len(items) != n:
        raise ValueError(f"{what}: expected {n} dates (one per epoch), found {len(items)}")
    parsed = []
    for i, value in enumerate(items):
        if not isinstance(value, (str, date, datetime, np.datetime64, pd.Timestamp)):
            raise ValueError(f"{what}[{i}]: expected a date (string, date or datetime64), "
                             f"found {type(value).__name__} {value!r}")
        try:
            stamp = pd.Timestamp(value)
        except (ValueError, TypeError, OverflowError) as err:
            raise ValueError(f"{what}[{i}]: expected a date such as '2023-03-19' or "
                             f"'20230319', found {value!r} ({err})") from None
        if stamp is pd.NaT:
            raise ValueError(f"{what}[{i}]: expected a date, found {value!r} (not a time)")
        if stamp.tzinfo is not None:
            stamp = stamp.tz_convert("UTC").tz_localize(None)
        parsed.append(stamp.to_datetime64())
    return np.array(parsed, dtype="datetime64[ns]")


def _check_wavelength(value: Any, what: str) -> float:
    try:
        wavelength = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a radar wavelength in metres, found {value!r}") \
            from None
    if not WAVELENGTH_RANGE[0] < wavelength < WAVELENGTH_RANGE[1]:
        raise ValueError(f"{what}: expected a radar wavelength in metres between "
                         f"{WAVELENGTH_RANGE[0]:g} and {WAVELENGTH_RANGE[1]:g}, found {value!r}")
    return wavelength


@dataclass(frozen=True)
class _Epochs:
    """The time axis of a stack, its wavelength, and the order that sorts the sources by time."""

    time: np.ndarray
    wavelength: float | None
    order: np.ndarray


def _epochs(n: int, names: Sequence[str], *, dates: Any, metadata: Any,
            wavelength: float | None) -> _Epochs:
    """Dates and wavelength from ``dates=``/``metadata=``/``wavelength=``, cross-checked."""
    stack = resolve_metadata(metadata) if metadata is not None else None
    if stack is not None and len(stack["dates"]) != n:
        raise ValueError(f"metadata: expected {n} epochs (one per data file), found "
                         f"{len(stack['dates'])} in {stack['files']}")
    if dates is not None:
        time = _parse_dates(dates, n)
        if stack is not None:
            given = time.astype("datetime64[D]")
            described = stack["dates"].astype("datetime64[D]")
            if not np.array_equal(given, described):
                bad = int(np.argmax(given != described))
                raise ValueError(f"dates: expected the dates of the metadata, found "
                                 f"{given[bad]} for {names[bad]} where {stack['files'][bad]} "
                                 f"says {described[bad]}")
    elif stack is not None:
        time = np.asarray(stack["dates"], dtype="datetime64[ns]")
    else:
        logger.warning("no dates= or metadata= given: time holds epoch indices 0..%d, not dates",
                       n - 1)
        time = np.arange(n, dtype=np.int64)

    if wavelength is not None:
        wavelength = _check_wavelength(wavelength, "wavelength")
        if stack is not None and abs(stack["wavelength"] - wavelength) > 1e-5 * wavelength:
            raise MetadataError(f"wavelength: expected {wavelength!r} m as given, found "
                                f"{stack['wavelength']!r} m in the metadata {stack['files']}",
                                paths=stack["files"])
    elif stack is not None:
        wavelength = _check_wavelength(stack["wavelength"], "metadata wavelength")

    unique, counts = np.unique(time, return_counts=True)
    if (counts > 1).any():
        clashes = [f"{d}: {[names[i] for i in np.flatnonzero(time == d)]}"
                   for d in unique[counts > 1]]
        raise ValueError(f"dates: expected one epoch per date, found duplicates "
                         f"{'; '.join(clashes)}")
    check_epoch_span(time, "dates")
    order = np.argsort(time, kind="stable")
    if not np.array_equal(order, np.arange(n)):
        logger.info("sorting %d epochs by date", n)
    return _Epochs(time=time[order], wavelength=wavelength, order=order)


def _chunks(chunks: Any, shape: tuple[int, int], n_time: int,
            itemsize: int = np.dtype(np.complex64).itemsize) -> tuple[int, int, int]:
    """Block shape ``(azimuth, range, time)``; default: time whole, about DEFAULT_CHUNK_BYTES.

    The default block is a band of whole lines when one line fits, so a block is read as long
    contiguous runs of each file.
    """
    n_az, n_rg = shape
    if chunks is None:
        pixels = max(1, DEFAULT_CHUNK_BYTES // (itemsize * n_time))
        if pixels >= n_rg:
            return (max(1, min(n_az, pixels // n_rg)), n_rg, n_time)
        side = max(1, int(np.sqrt(pixels)))
        return (min(side, n_az), min(side, n_rg), n_time)
    if isinstance(chunks, dict):
        unknown = set(chunks) - set(RASTER_DIMS)
        if unknown:
            raise ValueError(f"chunks: expected keys among {RASTER_DIMS}, found {sorted(unknown)}")
        chunks = tuple(chunks.get(d, -1) for d in RASTER_DIMS)
    chunks = tuple(chunks)
    if len(chunks) == 2:
        chunks = (*chunks, -1)
    if len(chunks) != 3:
        raise ValueError(f"chunks: expected (azimuth, range) or (azimuth, range, time) block "
                         f"sizes, found {chunks!r}")
    out = []
    for size, total, dim in zip(chunks, (n_az, n_rg, n_time), RASTER_DIMS):
        if size in (-1, None):
            size = total
        if not isinstance(size, (int, np.integer)) or size <= 0:
            raise ValueError(f"chunks[{dim!r}]: expected a positive integer or -1, "
                             f"found {size!r}")
        out.append(int(min(size, total)))
    return tuple(out)


def _raster(complex_data: da.Array, time: np.ndarray, attrs: dict[str, Any],
            *, azimuth: np.ndarray | None = None, range_: np.ndarray | None = None
            ) -> xr.Dataset:
    n_az, n_rg, _ = complex_data.shape
    coords = {
        "azimuth": np.arange(n_az, dtype=np.int64) if azimuth is None else azimuth,
        "range": np.arange(n_rg, dtype=np.int64) if range_ is None else range_,
        "time": time,
    }
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return xr.Dataset({"complex": (RASTER_DIMS, complex_data)}, coords=coords, attrs=attrs)


def _finish(ds: xr.Dataset, reader: str, lazy_coords: Sequence[str] = ()) -> xr.Dataset:
    """Validate as a raster STM; coordinates in ``lazy_coords`` are checked by the reader.

    Dask-backed coordinates (interpolated lat/lon) are left out of validation so that opening a
    stack never computes a full-scene array.
    """
    history = ds.attrs.get("history", "")
    ds.attrs["history"] = (history + "\n" if history else "") + f"read by depsi.io.slc.{reader}"
    validate(ds.drop_vars([c for c in lazy_coords if c in ds.variables]), kind="raster")
    return with_cf_attributes(ds)


def _iq_to_complex64(real: np.ndarray, imag: np.ndarray) -> np.ndarray:
    """``real + 1j * imag`` as native complex64, whatever the byte order or dtype of the parts."""
    out = np.empty(np.broadcast_shapes(real.shape, imag.shape), dtype=np.complex64)
    out.real = real
    out.imag = imag
    return out


# ----------------------------------------------------------------------------------------------
# Raw binary files
# ----------------------------------------------------------------------------------------------

def _file_dtype(dtype: Any, byteorder: str) -> np.dtype:
    """The on-disk dtype: complex, or a two-field (real, imaginary) structured dtype."""
    if byteorder not in _BYTEORDERS:
        raise ValueError(f"byteorder: expected one of {sorted(_BYTEORDERS)}, found {byteorder!r}")
    if isinstance(dtype, str) and dtype.lower() in COMPLEX_INT16_NAMES:
        base = np.dtype([("re", "i2"), ("im", "i2")])
    elif isinstance(dtype, str) and dtype.lower() in COMPLEX64_NAMES:
        base = np.dtype(np.complex64)
    else:
        try:
            base = np.dtype(dtype)
        except TypeError:
            raise ValueError(f"dtype: expected complex64, complex128, 'complex_int16' or a "
                             f"structured (re, im) dtype, found {dtype!r}") from None
    two_parts = base.names is not None and len(base.names) == 2 and all(
        base.fields[n][0].kind in "iuf" for n in base.names)
    if base.kind != "c" and not two_parts:
        raise ValueError(f"dtype: expected complex64, complex128, 'complex_int16' or a "
                         f"structured (re, im) dtype, found {base}")
    return base.newbyteorder(_BYTEORDERS[byteorder])


def _to_complex64(block: np.ndarray) -> np.ndarray:
    if block.dtype.names:
        real, imag = block.dtype.names
        return _iq_to_complex64(block[real], block[imag])
    return block.astype(np.complex64)


class _BinaryStack:
    """Array-like over one raw file per epoch; indexing memory-maps only the window asked for.

    Dask holds one of these per stack (file names, shape, dtype: a few hundred bytes) and calls
    ``__getitem__`` once per block, so the task graph never contains pixel data.
    """

    def __init__(self, paths: Sequence[Path], shape: tuple[int, int], file_dtype: np.dtype):
        self.paths = tuple(str(p) for p in paths)
        self.file_shape = shape
        self.file_dtype = file_dtype
        self.shape = (*shape, len(self.paths))
        self.dtype = np.dtype(np.complex64)
        self.ndim = 3

    def __dask_tokenize__(self) -> tuple:
        stats = [(os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in self.paths]
        return ("depsi.io.slc._BinaryStack", self.paths, stats, self.file_shape,
                self.file_dtype.descr)

    def __getitem__(self, key: tuple[slice, slice, slice]) -> np.ndarray:
        azimuth, range_, epochs = key
        files = self.paths[epochs]
        rows = range(self.file_shape[0])[azimuth]
        cols = range(self.file_shape[1])[range_]
        out = np.empty((len(rows), len(cols), len(files)), dtype=np.complex64)
        for k, path in enumerate(files):
            mapped = np.memmap(path, dtype=self.file_dtype, mode="r", shape=self.file_shape)
            out[:, :, k] = _to_complex64(mapped[azimuth, range_])
            del mapped
        return out


def from_binary(
    files: str | os.PathLike | Iterable[str | os.PathLike],
    shape: tuple[int, int],
    *,
    dtype: Any = np.complex64,
    dates: Iterable[Any] | None = None,
    metadata: Any = None,
    wavelength: float | None = None,
    chunks: Any = None,
    byteorder: str = "<",
) -> xr.Dataset:
    """Read a stack of raw SLC files, one per epoch, lazily by memory-mapped blocks.

    Parameters
    ----------
    files
        One raw file per epoch (no header), each ``shape`` pixels in row-major (line) order.
    shape
        ``(n_azimuth, n_range)`` of every file.
    dtype
        ``np.complex64`` (DORIS ``complex_real4``), ``np.complex128``, ``"complex_int16"``
        (interleaved int16 I/Q pairs, DORIS ``complex_short``) or a structured two-field
        ``(re, im)`` dtype. The result is always complex64.
    dates
        One date per file (strings such as ``"2023-03-19"``/``"20230319"``, dates, datetime64).
    metadata
        Instead of (or checked against) ``dates``: a dict from
        :func:`~depsi.io.metadata.read_metadata_stack`, a list of per-file dicts, or the
        ``.res`` paths, one per file in the same order. Gives ``time`` and ``wavelength``.
    wavelength
        Radar wavelength (m) when no metadata is given.
    chunks
        Block shape ``(azimuth, range)`` or ``(azimuth, range, time)`` or a dict by dimension;
        default: whole lines, all epochs, about ``DEFAULT_CHUNK_BYTES`` per block.
    byteorder
        ``"<"`` little-endian (default), ``">"`` big-endian, ``"="`` native.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64, Dask) on ``(azimuth, range, time)``, epochs sorted by date,
        ``azimuth``/``range`` pixel indices from 0, ``wavelength`` in attrs when known.

    Raises
    ------
    FileNotFoundError
        Missing files (all named).
    ValueError
        A file whose size is not ``shape`` times the item size (named, with expected and found
        bytes), a number of dates or metadata files different from the number of files, an
        unparseable or duplicate date, an unknown dtype.
    MetadataError
        Malformed metadata or mixed wavelengths.

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for k in range(2):
    ...     (np.full((4, 6), 1 + 1j * k, dtype="<c8")).tofile(folder / f"slc{k}.raw")
    >>> ds = from_binary([folder / "slc0.raw", folder / "slc1.raw"], (4, 6),
    ...                  dates=["2023-03-19", "2023-03-31"], wavelength=0.0555)
    >>> ds.complex.shape, ds.complex.dtype.name, complex(ds.complex[0, 0, 1])
    ((4, 6, 2), 'complex64', (1+1j))
    """
    paths = _path_list(files, "files")
    if (len(shape) != 2 or not all(isinstance(s, (int, np.integer)) and s > 0 for s in shape)):
        raise ValueError(f"shape: expected (n_azimuth, n_range) positive integers, "
                         f"found {shape!r}")
    shape = (int(shape[0]), int(shape[1]))
    file_dtype = _file_dtype(dtype, byteorder)
    _check_exist(paths, "files")
    expected = shape[0] * shape[1] * file_dtype.itemsize
    wrong = [(p, os.path.getsize(p)) for p in paths if os.path.getsize(p) != expected]
    if wrong:
        details = "; ".join(f"'{p}' has {size} bytes" + _size_hint(size, shape)
                            for p, size in wrong)
        raise ValueError(f"files: expected {expected} bytes each ({shape[0]} x {shape[1]} "
                         f"pixels of {file_dtype.itemsize}-byte {_dtype_name(file_dtype)}), "
                         f"found {details}")
    epochs = _epochs(len(paths), [str(p) for p in paths], dates=dates, metadata=metadata,
                     wavelength=wavelength)
    ordered = [paths[i] for i in epochs.order]
    block = _chunks(chunks, shape, len(paths))
    stack = _BinaryStack(ordered, shape, file_dtype)
    data = da.from_array(stack, chunks=block, lock=False, fancy=False, asarray=False,
                         meta=np.empty((0, 0, 0), dtype=np.complex64),
                         name="from_binary-" + tokenize(stack))
    ds = _raster(data, epochs.time, {"wavelength": epochs.wavelength})
    return _finish(ds, "from_binary")


def _dtype_name(file_dtype: np.dtype) -> str:
    if file_dtype.names:
        return "(" + ", ".join(f"{n}: {file_dtype.fields[n][0]}" for n in file_dtype.names) + ")"
    return str(file_dtype)


def _size_hint(size: int, shape: tuple[int, int]) -> str:
    pixels = shape[0] * shape[1]
    for itemsize, name in ((8, "complex64"), (4, "complex_int16"), (16, "complex128")):
        if size == pixels * itemsize:
            return f" (that is {name} data of this shape)"
    return ""


def open_binary_folder(folder: str | os.PathLike) -> xr.Dataset:
    """A DORIS stack folder: ``slc_YYYYMMDD.raw`` per epoch with ``master.res`` /
    ``slave_YYYYMMDD.res`` metadata, and ``h2ph_YYYYMMDD.raw`` (float32) when present.

    The metadata give the shape, the dates and the wavelength (:func:`from_binary` with
    ``metadata=``); ``ifgs_*.res`` files are not epochs and are skipped.

    Parameters
    ----------
    folder
        The folder, as :func:`depsi.simulate.write_stack_binary` writes one.

    Returns
    -------
    xarray.Dataset
        ``complex`` and, when every epoch has its file, ``h2ph`` on ``(azimuth, range, time)``,
        lazily, epochs sorted by date.

    Raises
    ------
    FileNotFoundError
        When the folder holds no ``.res`` file, or a listed raster is missing.

    Examples
    --------
    >>> import tempfile
    >>> from depsi.simulate import write_stack_binary
    >>> info = write_stack_binary(tempfile.mkdtemp(), shape=(16, 20), n_epochs=3, progress=False)
    >>> ds = open_binary_folder(info["folder"])
    >>> ds.complex.shape, ds.h2ph.dims
    ((16, 20, 3), ('azimuth', 'range', 'time'))
    """
    folder = Path(folder)
    res_files = sorted(p for p in folder.glob("*.res") if not p.name.startswith("ifgs_"))
    if not res_files:
        raise FileNotFoundError(f"folder {str(folder)!r}: expected DORIS .res files "
                                f"(master.res, slave_YYYYMMDD.res), found none")
    metadata = read_metadata_stack(res_files)
    shape = (int(metadata["number_of_lines"]), int(metadata["number_of_pixels"]))
    dates = [np.datetime_as_string(np.datetime64(d, "D")).replace("-", "")
             for d in metadata["dates"]]
    slc_files = [folder / f"slc_{day}.raw" for day in dates]
    stack = from_binary(slc_files, shape, metadata=metadata)
    h2ph_files = [folder / f"h2ph_{day}.raw" for day in dates]
    if _check_h2ph_files(h2ph_files, shape, folder):
        layers = [da.from_array(np.memmap(p, dtype="<f4", mode="r", shape=shape),
                                chunks=stack["complex"].data.chunks[:2]) for p in h2ph_files]
        order = np.argsort(np.asarray(metadata["dates"], dtype="datetime64[ns]"), kind="stable")
        h2ph = da.stack([layers[i] for i in order], axis=-1)
        stack["h2ph"] = (("azimuth", "range", "time"), h2ph.rechunk(stack["complex"].chunks))
        stack["h2ph"].attrs.update(units="1", source=f"{folder}/h2ph_YYYYMMDD.raw")
    return _with_res_geometry(stack, metadata, res_files)


#: Bytes per pixel of an ``h2ph_YYYYMMDD.raw`` file (little-endian float32).
H2PH_ITEMSIZE = 4


def _check_h2ph_files(files: Sequence[Path], shape: tuple[int, int], folder: Path) -> bool:
    """True when every epoch has its h2ph file of the right size; False when none has one.

    Some present and some missing, or a file of the wrong size, raises naming the files: a
    stack read without one epoch's h2ph would silently lose h2ph for every epoch.
    """
    missing = [p for p in files if not p.is_file()]
    if len(missing) == len(files):
        return False
    if missing:
        raise InputValidationError(
            f"folder {str(folder)!r}: expected an h2ph_YYYYMMDD.raw for every epoch (or none), "
            f"found {len(files) - len(missing)} of {len(files)}; missing: "
            f"{[p.name for p in missing]}")
    pixels = shape[0] * shape[1]
    expected = pixels * H2PH_ITEMSIZE
    wrong = [(p, p.stat().st_size) for p in files if p.stat().st_size != expected]
    if wrong:
        hints = {pixels * 8: " (that is float64 data of this shape)",
                 pixels * 2: " (that is float16 data of this shape)"}
        details = "; ".join(f"'{p}' has {size} bytes{hints.get(size, '')}" for p, size in wrong)
        raise InputValidationError(
            f"h2ph files: expected {expected} bytes each ({shape[0]} x {shape[1]} pixels of "
            f"little-endian float32), found {details}")
    return True


def _with_res_geometry(stack: xr.Dataset, metadata: dict[str, Any],
                       res_files: Sequence[Path]) -> xr.Dataset:
    """The stack with its geometry from the ``.res`` orbits (precise_orbits) and the mother's
    timing (``master.res``), so that its points are geocoded; as it was when the files hold
    no orbits (a warning says so)."""
    epochs = metadata["epochs"]
    if any(m.get("orbit") is None for m in epochs):
        logger.warning("DORIS folder %s: not every .res file has precise_orbits: no geometry "
                       "from the orbits, points are not geocoded", res_files[0].parent)
        return stack
    names = [Path(m["path"]).name for m in epochs]
    mother = names.index("master.res") if "master.res" in names else len(epochs) // 2
    order = np.argsort(np.asarray(metadata["dates"], dtype="datetime64[ns]"), kind="stable")
    orbits = [Orbit(m["date"], m["orbit"][:, 0], m["orbit"][:, 1:4], None,
                    source=f"'{m['path']}' section 'precise_orbits'") for m in epochs]
    meta = epochs[mother]
    window = meta.get("crop") or {"first_line": 1, "first_pixel": 1}
    interval = meta["azimuth_time_interval"]
    grid = RadarGrid(meta["first_azimuth_time"] + np.timedelta64(
        round((window["first_line"] - 1) * interval * 1e9), "ns"), interval,
        meta["slant_range_first_pixel"] + (window["first_pixel"] - 1)
        * meta["slant_range_spacing"], meta["slant_range_spacing"])
    geometry = StackGeometry(grid, tuple(orbits[i] for i in order),
                             int(np.flatnonzero(order == mother)[0]), metadata["wavelength"])
    return attach_geometry(stack, geometry)


# ----------------------------------------------------------------------------------------------
# SNAP "znap" Zarr products
# ----------------------------------------------------------------------------------------------

_SNAP_BAND = re.compile(r"^(?P<kind>i|q|h2ph)_(?:(?P<swath>[A-Z]{2}\d)_)?(?P<pol>[HV]{2})"
                        r"(?:_(?P<role>mst|slv\d*))?_(?P<date>\d{2}[A-Za-z]{3}\d{4})$")
_SNAP_DATE = re.compile(r"(\d{2})([A-Za-z]{3})(\d{4})")
#: Where pixel (azimuth, range) lies in the coordinates of a znap product's tie-point grids:
#: rows at the line index itself, columns at the pixel's centre. Measured on the real pair
#: (tests/test_geometry.py): seen from the orbits, its tie rows fall on lines 0.000, 303.978 and
#: 608.001, its columns on pixel + 0.42.
SNAP_TIE_POINT_CENTRE = (0.0, 0.5)
#: SNAP writes UTC times as [days, seconds, microseconds] since 2000-01-01.
_MJD2000 = np.datetime64("2000-01-01T00:00:00", "ns")


def _snap_date(text: str, what: str) -> np.datetime64:
    """``19Mar2023`` -> ``2023-03-19`` at 00:00, without the locale."""
    match = _SNAP_DATE.fullmatch(text)
    month = MONTH_NUMBERS.get(match.group(2).lower()) if match else None
    try:
        if month is None:
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


def _snap_attributes(element: dict) -> dict[str, Any]:
    return {a["name"]: a.get("data", {}).get("elems") for a in element.get("attributes", [])}


def _snap_metadata(path: Path) -> dict[str, Any]:
    """Wavelength, mother date, subset offsets from ``SNAP/product_metadata.json``."""
    file = path / "SNAP" / "product_metadata.json"
    if not file.is_file():
        raise MetadataError(f"SNAP product '{path}': expected SNAP/product_metadata.json (for "
                            "the radar frequency), found no such file", paths=[str(file)])
    try:
        elements = {e.get("name"): e for e in json.loads(file.read_text())}
    except (ValueError, AttributeError) as err:
        raise MetadataError(f"SNAP metadata '{file}': expected a JSON list of metadata "
                            f"elements, found unreadable content ({err})",
                            paths=[str(file)]) from None
    abstracted = _snap_attributes(elements.get("Abstracted_Metadata", {}))
    frequency = abstracted.get("radar_frequency")
    try:
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
        position = [[float(np.ravel(r[f"{c}_pos"])[0]) for c in "xyz"] for r in rows]
        velocity = [[float(np.ravel(r[f"{c}_vel"])[0]) for c in "xyz"] for r in rows]
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
    where the product records its bursts, else ``first_line_time``. On the real pair SNAP's
    ``first_line_time`` of the subset lies 1.2 lines (2.5 ms) after its burst's timing; with
    the burst's, the orbits' geocoding agrees with SNAP's own per-pixel latitude/longitude to
    0.12 m, with ``first_line_time`` to 16.6 m (tests/test_geometry.py).
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
                   wavelength: float) -> StackGeometry:
    """The stack's geometry from a SNAP product's metadata: the mother's timing and orbit
    (``Abstracted_Metadata``) and each secondary's orbit (``Slave_Metadata``)."""
    file = path / "SNAP" / "product_metadata.json"
    elements = {e.get("name"): e for e in json.loads(file.read_text())}
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
    mother_day = first_line.astype("datetime64[D]") if mother is None else \
        np.datetime64(mother, "D")
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
        vectors of the metadata (:func:`depsi.io.geometry.attach_geometry`; geocoded at
        ``avg_scene_height``), SNAP's kept as ``h2ph_product``, ``lat_product``,
        ``lon_product``. Either way the geometry goes into ``attrs["sar_geometry"]`` so that
        selected points are geocoded with their line of sight.
    chunks
        Block shape as in :func:`from_binary`.

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
        the same date in two products, tie-point grids without their geometry.
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
    opened = {p: _open_znap(p) for p in products}
    meta = {p: _snap_metadata(p) for p in products}

    wavelengths = {p: m["wavelength"] for p, m in meta.items()}
    first = next(iter(wavelengths.values()))
    if any(abs(w - first) > 1e-5 * first for w in wavelengths.values()):
        raise MetadataError("wavelength: expected one radar wavelength for the stack, found "
                            + "; ".join(f"{w:.6f} m in '{p}'" for p, w in wavelengths.items()),
                            paths=[str(p) for p in products])

    epochs = [e for p in products for e in _snap_epochs(opened[p], p, polarisation)]
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
        stack_geometry = _snap_geometry(products[0], dates, mother, first)
    except GeometryError:
        if geometry == "orbits" or "h2ph" not in out.data_vars:
            raise
        logger.warning("SNAP product %s: no usable orbits; the product's h2ph and lat/lon "
                       "are used as they are", products[0], exc_info=True)
    else:
        out = attach_geometry(out, stack_geometry, mode=geometry)
    return _finish(out, "from_snap", lazy_coords=("lat", "lon", "lat_product", "lon_product"))


# ----------------------------------------------------------------------------------------------
# GeoTIFF (any GDAL-readable raster) through rioxarray
# ----------------------------------------------------------------------------------------------

BandLayout = Literal["complex", "iq"]


def _require_rioxarray() -> Any:
    try:
        import rioxarray
    except ImportError as err:
        raise ImportError("from_geotiff needs rioxarray (and rasterio): install the 'geo' extra,"
                          " pip install 'depsi[geo]'") from err
    return rioxarray


def from_geotiff(
    files: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    dates: Iterable[Any] | None = None,
    band_layout: BandLayout = "complex",
    metadata: Any = None,
    wavelength: float | None = None,
    chunks: Any = None,
) -> xr.Dataset:
    """Read complex SLC rasters in any GDAL format (GeoTIFF, ENVI, ...) into one SLC stack.

    Needs the optional ``geo`` extra (``rioxarray``, ``rasterio``).

    Parameters
    ----------
    files
        One or more rasters of the same size; their bands, file after file, are the epochs.
    dates
        One date per epoch (see :func:`from_binary`); or give ``metadata``.
    band_layout
        ``"complex"``: each band is one complex epoch (GDAL ``CFloat32``/``CInt16``/...).
        ``"iq"``: bands come in pairs, in-phase then quadrature, one pair per epoch.
    metadata, wavelength
        As in :func:`from_binary`.
    chunks
        Block shape as in :func:`from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64) on ``(azimuth, range, time)``; attrs ``wavelength`` when known,
        ``crs`` (WKT) and ``transform`` when the rasters are georeferenced.

    Raises
    ------
    ImportError
        Without rioxarray.
    FileNotFoundError, ValueError
        Missing files, rasters of different sizes, real bands with ``band_layout="complex"``,
        an odd number of bands with ``"iq"``, a number of epochs different from the dates.

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np
    >>> try:
    ...     import rasterio
    ... except ImportError:  # without the 'geo' extra
    ...     rasterio = None
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "slc.tif"
    >>> if rasterio is not None:
    ...     with rasterio.open(path, "w", driver="GTiff", width=5, height=3, count=1,
    ...                        dtype="complex64", transform=rasterio.Affine(1, 0, 0, 0, -1, 3)
    ...                        ) as tif:
    ...         tif.write(np.full((1, 3, 5), 1 + 2j, dtype="c8"))
    ...     ds = from_geotiff([path], dates=["2023-03-19"], wavelength=0.0555)
    ...     print(complex(ds.complex[0, 0, 0]))
    ... else:
    ...     print(1 + 2j)
    (1+2j)
    """
    rioxarray = _require_rioxarray()
    import rasterio

    if band_layout not in ("complex", "iq"):
        raise ValueError(f"band_layout: expected 'complex' or 'iq', found {band_layout!r}")
    paths = _path_list(files, "files")
    _check_exist(paths, "files")
    info = {}
    with warnings.catch_warnings():
        # an SLC in radar geometry has no geotransform by nature
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        for path in paths:
            with rasterio.open(path) as src:
                info[path] = (src.height, src.width, src.count, src.dtypes, src.crs,
                              src.transform)
    shapes = {p: i[:2] for p, i in info.items()}
    shape = shapes[paths[0]]
    if any(s != shape for s in shapes.values()):
        raise ValueError(f"files: expected one raster size for all files, found "
                         f"{ {str(p): s for p, s in shapes.items()} }")
    for path, (_, _, count, dtypes, _, _) in info.items():
        is_complex = [t.startswith("complex") for t in dtypes]
        if band_layout == "complex" and not all(is_complex):
            raise ValueError(f"band_layout='complex': expected complex bands, found "
                             f"{sorted(set(dtypes))} in '{path}' (for real I and Q bands use "
                             "band_layout='iq')")
        if band_layout == "iq" and (count % 2 or any(is_complex)):
            raise ValueError(f"band_layout='iq': expected an even number of real bands (I, Q "
                             f"per epoch), found {count} band(s) of {sorted(set(dtypes))} in "
                             f"'{path}'")
    per_file = [info[p][2] // (2 if band_layout == "iq" else 1) for p in paths]
    n_epochs = sum(per_file)
    names = [f"{p} epoch {k}" for p, n in zip(paths, per_file) for k in range(n)]
    if dates is None and metadata is None:
        raise ValueError("dates: expected one date per epoch (or metadata=), found neither")
    epochs = _epochs(n_epochs, names, dates=dates, metadata=metadata, wavelength=wavelength)
    block = _chunks(chunks, shape, n_epochs)

    planes = []
    for path in paths:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            bands = rioxarray.open_rasterio(path, chunks={"band": 1, "y": block[0],
                                                          "x": block[1]},
                                            lock=False, mask_and_scale=False).data
        if band_layout == "complex":
            planes += [bands[b].astype(np.complex64) for b in range(bands.shape[0])]
        else:
            planes += [da.map_blocks(_iq_to_complex64, bands[b], bands[b + 1],
                                     dtype=np.complex64)
                       for b in range(0, bands.shape[0], 2)]
    cube = da.stack([planes[i] for i in epochs.order], axis=-1).rechunk(block)
    _, _, _, _, crs, transform = info[paths[0]]
    attrs: dict[str, Any] = {"wavelength": epochs.wavelength}
    if crs is not None:
        attrs["crs"] = crs.to_wkt()
        attrs["transform"] = [float(v) for v in tuple(transform)[:6]]
    return _finish(_raster(cube, epochs.time, attrs), "from_geotiff")


# ----------------------------------------------------------------------------------------------
# SLC stacks stored as Zarr
# ----------------------------------------------------------------------------------------------

#: Variables of an SLC store whose chunks must all be on disk: a missing chunk reads as the fill
#: value (zeros) without a message. Stores must be written with every chunk (depsi's writers
#: do; zarr's ``write_empty_chunks=False`` leaves out all-fill chunks, which no SLC has).
ZARR_CHECKED_VARIABLES = ("complex", "real", "imag", "h2ph", "lat", "lon")
#: Missing chunk keys shown in a message (the count is always given).
_SHOWN_KEYS = 5
_ZARR_METADATA_FILES = {".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"}


@dataclass(frozen=True)
class _ZarrArray:
    """What an array's metadata claims: its chunk grid and how its chunk files are named."""

    name: str
    dims: tuple[str, ...]
    grid: tuple[int, ...]
    prefix: str
    separator: str
    source: str


def _read_json(file: Path, store: Path) -> dict[str, Any]:
    try:
        document = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise STMValidationError(f"SLC store '{store}': expected JSON metadata in '{file}', "
                                 f"found unreadable content ({err})") from None
    if not isinstance(document, dict):
        raise STMValidationError(f"SLC store '{store}': expected a JSON object in '{file}', "
                                 f"found {type(document).__name__}")
    return document


def _zarr_claim(name: str, meta: dict[str, Any], attrs: dict[str, Any], v3: bool,
                source: str) -> _ZarrArray:
    try:
        shape = [int(n) for n in meta["shape"]]
        if v3:
            chunks = [int(n) for n in meta["chunk_grid"]["configuration"]["chunk_shape"]]
            encoding = meta.get("chunk_key_encoding") or {"name": "default"}
            default = encoding.get("name", "default") == "default"
            separator = (encoding.get("configuration") or {}).get(
                "separator", "/" if default else ".")
            prefix = "c" if default else ""
            dims = tuple(meta.get("dimension_names") or ())
        else:
            chunks = [int(n) for n in meta["chunks"]]
            separator = meta.get("dimension_separator") or "."
            prefix = ""
            dims = tuple(attrs.get("_ARRAY_DIMENSIONS") or ())
    except (KeyError, TypeError, ValueError) as err:
        raise STMValidationError(f"{source}: expected 'shape' and a regular chunk grid, found "
                                 f"no usable {err}") from None
    if len(chunks) != len(shape) or any(c <= 0 for c in chunks) or any(n < 0 for n in shape):
        raise STMValidationError(f"{source}: expected positive chunk sizes, one per dimension "
                                 f"of shape {shape}, found chunks {chunks}")
    grid = tuple(-(-n // c) for n, c in zip(shape, chunks))
    return _ZarrArray(name, dims, grid, prefix, separator, source)


def _zarr_claims(path: Path, v3: bool) -> list[_ZarrArray]:
    """Every checked array's claim, from each metadata document xarray or zarr may read."""
    claims = []
    if not v3 and (path / ".zmetadata").is_file():
        documents = _read_json(path / ".zmetadata", path).get("metadata") or {}
        for name in ZARR_CHECKED_VARIABLES:
            meta = documents.get(f"{name}/.zarray")
            if isinstance(meta, dict):
                claims.append(_zarr_claim(name, meta, documents.get(f"{name}/.zattrs") or {},
                                          v3, f"SLC store '{path}' (.zmetadata): variable "
                                              f"{name!r}"))
    for name in ZARR_CHECKED_VARIABLES:
        file = path / name / ("zarr.json" if v3 else ".zarray")
        if not file.is_file():
            continue
        meta = _read_json(file, path)
        if v3 and meta.get("node_type") != "array":
            continue
        attrs = {} if v3 or not (path / name / ".zattrs").is_file() else _read_json(
            path / name / ".zattrs", path)
        claims.append(_zarr_claim(name, meta, attrs, v3, f"SLC store '{path}': variable "
                                                         f"{name!r}"))
    return claims


def _chunk_index(key: str, claim: _ZarrArray) -> tuple[int, ...] | None:
    if claim.prefix:
        if key == claim.prefix and not claim.grid:
            return ()
        if not key.startswith(claim.prefix + claim.separator):
            return None
        key = key[len(claim.prefix) + 1:]
    try:
        index = tuple(int(part) for part in key.split(claim.separator))
    except ValueError:
        return None
    if not claim.grid:
        return () if index == (0,) else None
    if len(index) != len(claim.grid) or not all(0 <= i < n for i, n in zip(index, claim.grid)):
        return None
    return index


def _present_chunks(folder: Path, claim: _ZarrArray) -> set[tuple[int, ...]]:
    present = set()
    for root, _, files in os.walk(folder):
        relative = Path(root).relative_to(folder)
        for file in files:
            if file in _ZARR_METADATA_FILES:
                continue
            key = (relative / file).as_posix()
            index = _chunk_index(key if claim.separator == "/" else file, claim)
            if index is not None and (claim.separator == "/" or relative == Path(".")):
                present.add(index)
    return present


def _missing_chunks(present: set[tuple[int, ...]], claim: _ZarrArray, limit: int
                    ) -> tuple[int, list[tuple[int, ...]]]:
    """(count of missing chunks, the first ``limit`` of them).

    The grid is walked only until ``limit`` are found, so a grid that claims far more chunks
    than the store has files costs no more than its files.
    """
    count = int(np.prod(claim.grid, dtype=object)) - len(present)
    found = []
    if count > 0:
        for index in itertools.product(*(range(n) for n in claim.grid)):
            if index not in present:
                found.append(index)
                if len(found) >= limit:
                    break
    return count, found


def _key_text(index: tuple[int, ...], claim: _ZarrArray) -> str:
    parts = [claim.prefix] if claim.prefix else []
    return claim.separator.join(parts + [str(i) for i in index]) or "0"


def _check_zarr_chunks(path: Path, v3: bool) -> list[tuple[_ZarrArray, int]]:
    """Refuse an SLC store whose arrays lack chunk files their metadata claims.

    Missing ``h2ph`` chunks all in one time chunk are returned instead (the claim and that
    time chunk): they may be the mother's zeros, which zarr leaves out;
    :func:`_check_h2ph_chunks` decides once the dates are known.
    """
    deferred = []
    for claim in _zarr_claims(path, v3):
        present = _present_chunks(path / claim.name, claim)
        time_axis = claim.dims.index("time") if "time" in claim.dims else None
        spatial = int(np.prod([n for i, n in enumerate(claim.grid) if i != time_axis]))
        maybe_mother = claim.name == "h2ph" and time_axis is not None
        count, shown = _missing_chunks(present, claim,
                                       max(spatial, _SHOWN_KEYS) if maybe_mother else _SHOWN_KEYS)
        if count <= 0:
            continue
        if maybe_mother and len(shown) == count and len({k[time_axis] for k in shown}) == 1:
            deferred.append((claim, shown[0][time_axis]))
            continue
        raise STMValidationError(
            f"{claim.source}: expected all {int(np.prod(claim.grid, dtype=object))} chunks "
            f"of its chunk grid {claim.grid} on disk, found {count} missing (such as "
            f"{[_key_text(k, claim) for k in shown[:_SHOWN_KEYS]]}): a missing chunk reads "
            "as zeros")
    return deferred


def _check_h2ph_chunks(deferred: list[tuple[_ZarrArray, int]], ds: xr.Dataset,
                       path: Path) -> None:
    """Missing h2ph chunks are allowed only where they hold the mother epoch alone (zeros)."""
    for claim, time_chunk in deferred:
        size = ds["h2ph"].encoding.get("chunks") or ds["h2ph"].encoding.get("preferred_chunks")
        axis = claim.dims.index("time")
        step = size[axis] if isinstance(size, (tuple, list)) else None
        epochs = (np.arange(ds.sizes["time"])[time_chunk * step:(time_chunk + 1) * step]
                  if step else np.arange(0))
        mother = ds.attrs.get("mother_time") or ds.attrs.get("coregistration_mother_time")
        days = ds["time"].values[epochs].astype("datetime64[D]") if ds["time"].dtype.kind == \
            "M" else np.array([])
        if mother is None or days.size != 1 or str(days[0]) != str(mother)[:10]:
            raise STMValidationError(
                f"{claim.source}: expected all chunks of its chunk grid {claim.grid} on disk "
                f"(only the mother epoch's may be left out as zeros), found missing chunks "
                f"in time chunk {time_chunk} (epochs {[str(d) for d in days] or epochs.tolist()},"
                f" mother {mother!r}): a missing chunk reads as zeros")


def open_slc_zarr(
    path: str | os.PathLike,
    *,
    dates: Iterable[Any] | None = None,
    wavelength: float | None = None,
    chunks: Any = None,
) -> xr.Dataset:
    """Open an SLC stack stored as Zarr (v2 or v3) lazily, as depsi's raster conventions.

    Reads stores written by ``xr.Dataset.to_zarr`` with dims ``(azimuth, range, time)`` and
    either ``complex`` or the ``real`` / ``imag`` pair of sarxarray, which becomes ``complex``
    (complex64). ``lat``/``lon`` data variables on ``(azimuth, range)`` become coordinates.

    Parameters
    ----------
    path
        The store.
    dates
        Dates for a store whose ``time`` holds epoch indices (as sarxarray's do).
    wavelength
        Radar wavelength (m) when the store's attrs have none.
    chunks
        Block shape as in :func:`from_binary`; default: the store's chunks with time whole.

    Raises
    ------
    FileNotFoundError
        No such store.
    STMValidationError
        Dimensions other than ``(azimuth, range, time)``, or neither ``complex`` nor both
        ``real`` and ``imag``; the message names what the store holds.

    Examples
    --------
    >>> import tempfile, numpy as np, xarray as xr
    >>> store = tempfile.mkdtemp() + "/slc.zarr"
    >>> xr.Dataset({"real": (("azimuth", "range", "time"), np.ones((2, 3, 2), "f4")),
    ...             "imag": (("azimuth", "range", "time"), np.zeros((2, 3, 2), "f4"))},
    ...            coords={"time": np.array(["2023-03-19", "2023-03-31"], "datetime64[ns]")}
    ...            ).to_zarr(store, zarr_format=2, consolidated=False)  # doctest: +ELLIPSIS
    <...>
    >>> ds = open_slc_zarr(store, wavelength=0.0555)
    >>> ds.complex.dtype.name, list(ds.data_vars)
    ('complex64', ['complex'])
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"SLC store '{path}' does not exist")
    v3 = (path / "zarr.json").is_file()
    if not v3 and not (path / ".zgroup").is_file():
        raise STMValidationError(f"SLC store '{path}': expected a Zarr group (a .zgroup or "
                                 "zarr.json file), found neither")
    consolidated = (path / ".zmetadata").is_file() and not v3
    deferred = _check_zarr_chunks(path, v3)
    # By default each Dask chunk spans every stored time chunk of its (azimuth, range) block:
    # zarr then decodes them straight into one array, where a rechunk after opening would
    # copy every block once more to join its time chunks.
    ds = xr.open_zarr(path, consolidated=consolidated, chunks={"time": -1} if chunks is None
                      else {})
    layout = "; ".join(f"{n} {tuple(v.dims)}" for n, v in ds.data_vars.items()) or "nothing"
    if deferred and "h2ph" in ds.data_vars:
        _check_h2ph_chunks(deferred, ds, path)

    missing = [d for d in RASTER_DIMS if d not in ds.dims]
    if missing:
        raise STMValidationError(f"SLC store '{path}': expected dimensions {RASTER_DIMS}, "
                                 f"found {tuple(ds.dims)} (no {missing}); variables: {layout}")
    if "complex" not in ds.data_vars:
        parts = [p for p in ("real", "imag") if p in ds.data_vars]
        if len(parts) != 2:
            found = (f"only {parts[0]!r}, not {({'real', 'imag'} - set(parts)).pop()!r}"
                     if parts else "neither")
            raise STMValidationError(f"SLC store '{path}': expected a 'complex' variable or "
                                     f"both 'real' and 'imag', found {found}; variables: "
                                     f"{layout}")
        real, imag = (ds[p].transpose(*RASTER_DIMS, ...) for p in ("real", "imag"))
        if real.dims != imag.dims or real.shape != imag.shape:
            raise STMValidationError(f"SLC store '{path}': expected 'real' and 'imag' of one "
                                     f"shape, found {real.sizes} and {imag.sizes}")
        data = da.map_blocks(_iq_to_complex64, real.data, imag.data, dtype=np.complex64)
        ds = ds.drop_vars(["real", "imag"]).assign(complex=(real.dims, data))
    elif ds["complex"].dtype != np.complex64:
        ds["complex"] = ds["complex"].astype(np.complex64)
    for name in ("lat", "lon"):
        if name in ds.data_vars and set(ds[name].dims) == {"azimuth", "range"}:
            ds = ds.set_coords(name)
    ds = ds.transpose(*RASTER_DIMS, ...)

    if dates is not None:
        ds = ds.assign_coords(time=_parse_dates(dates, ds.sizes["time"]))
    check_epoch_span(ds["time"].values, f"SLC store '{path}': time")
    if wavelength is not None:
        wavelength = _check_wavelength(wavelength, "wavelength")
        stored = ds.attrs.get("wavelength")
        if stored is not None and abs(float(stored) - wavelength) > 1e-5 * wavelength:
            raise ValueError(f"wavelength: expected {wavelength!r} m as given, found "
                             f"{stored!r} m in the attrs of '{path}'")
        ds.attrs["wavelength"] = wavelength
    block = _chunks(chunks, (ds.sizes["azimuth"], ds.sizes["range"]), ds.sizes["time"])
    if chunks is None:
        ds = ds.chunk({"time": -1})
    else:
        ds = ds.chunk(dict(zip(RASTER_DIMS, block)))
    return _finish(ds, "open_slc_zarr")


__all__ = [
    "COMPLEX_INT16_NAMES",
    "RASTER_DIMS",
    "from_binary",
    "from_geotiff",
    "from_snap",
    "open_binary_folder",
    "open_slc_zarr",
]
