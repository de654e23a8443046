"""The lazy raster machinery every SLC reader shares: input checks (files, dates, wavelength),
block shapes, one memory-mapped window per Dask block, and the finished raster Dataset.

A reader checks its input before any pixel is read and returns a Dask-backed Dataset
``(azimuth, range, time)`` with ``complex`` (complex64) and ``time`` as dates; the task graph
holds file names and windows, never pixel data: one task per block.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

from depsi.io.bounded import MetadataError
from depsi.io.cf import with_cf_attributes
from depsi.io.metadata import WAVELENGTH_RANGE, resolve_metadata
from depsi.io.store import DEFAULT_CHUNK_BYTES
from depsi.io.validate import check_epoch_span
from depsi.stm.schema import validate

logger = logging.getLogger(__name__)

#: Dimensions of an SLC stack, in storage order.
RASTER_DIMS = ("azimuth", "range", "time")

#: Names accepted for interleaved 16-bit integer I/Q pairs (DORIS ``complex_short``, GDAL
#: ``CInt16``, SNAP exports).
COMPLEX_INT16_NAMES = ("complex_int16", "complex_short", "cint16")

#: Names DORIS writes for complex float32 data.
COMPLEX64_NAMES = ("complex_real4",)

_BYTEORDERS: dict[str, Literal["<", ">", "="]] = {"<": "<", "little": "<", ">": ">", "big": ">",
                                                   "=": "=", "native": "="}


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
        clashes = [f"{d}: {[names[int(i)] for i in np.flatnonzero(time == d)]}"
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
    return out[0], out[1], out[2]


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

    ``reader`` is the reading function's qualified name (``depsi.io.binary.from_binary``), which
    goes into ``history``.

    Dask-backed coordinates (interpolated lat/lon) are left out of validation so that opening a
    stack never computes a full-scene array.
    """
    history = ds.attrs.get("history", "")
    ds.attrs["history"] = (history + "\n" if history else "") + f"read by {reader}"
    validate(ds.drop_vars([c for c in lazy_coords if c in ds.variables]), kind="raster")
    return with_cf_attributes(ds)


def _iq_to_complex64(real: np.ndarray, imag: np.ndarray) -> np.ndarray:
    """``real + 1j * imag`` as native complex64, whatever the byte order or dtype of the parts."""
    out = np.empty(np.broadcast_shapes(real.shape, imag.shape), dtype=np.complex64)
    out.real = real
    out.imag = imag
    return out


# ----------------------------------------------------------------------------------------------
# Raw binary files: one memory-mapped window per block
# ----------------------------------------------------------------------------------------------

def _file_dtype(dtype: Any, byteorder: str) -> np.dtype:
    """The on-disk dtype: complex, or a two-field (real, imaginary) structured dtype."""
    if byteorder not in _BYTEORDERS:
        raise ValueError(f"byteorder: expected one of {sorted(_BYTEORDERS)}, found {byteorder!r}")
    base: np.dtype
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
    fields = base.fields
    two_parts = base.names is not None and fields is not None and len(base.names) == 2 and all(
        fields[n][0].kind in "iuf" for n in base.names)
    if base.kind != "c" and not two_parts:
        raise ValueError(f"dtype: expected complex64, complex128, 'complex_int16' or a "
                         f"structured (re, im) dtype, found {base}")
    return base.newbyteorder(_BYTEORDERS[byteorder])


def _to_complex64(block: np.ndarray) -> np.ndarray:
    if block.dtype.names:
        real, imag = block.dtype.names
        return _iq_to_complex64(block[real], block[imag])
    return block.astype(np.complex64)


def _dtype_name(file_dtype: np.dtype) -> str:
    fields = file_dtype.fields
    if file_dtype.names and fields is not None:
        return "(" + ", ".join(f"{n}: {fields[n][0]}" for n in file_dtype.names) + ")"
    return str(file_dtype)


def _size_hint(size: int, shape: tuple[int, int]) -> str:
    pixels = shape[0] * shape[1]
    for itemsize, name in ((8, "complex64"), (4, "complex_int16"), (16, "complex128")):
        if size == pixels * itemsize:
            return f" (that is {name} data of this shape)"
    return ""


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
        return ("depsi.io.raster._BinaryStack", self.paths, stats, self.file_shape,
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


# ----------------------------------------------------------------------------------------------
# Writing: one row of blocks at a time
# ----------------------------------------------------------------------------------------------

def _azimuth_blocks(ds: xr.Dataset) -> list[slice]:
    bounds = np.cumsum((0, *ds.chunks["azimuth"]))
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


__all__ = [
    "COMPLEX64_NAMES",
    "COMPLEX_INT16_NAMES",
    "RASTER_DIMS",
]
