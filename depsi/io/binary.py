"""Raw binary SLC stacks: one headerless file per epoch (:func:`from_binary`) and the DORIS
stack folder of ``slc_YYYYMMDD.raw`` files with ``.res`` metadata (:func:`open_binary_folder`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize
from tqdm.auto import tqdm

from depsi.geometry import Orbit, RadarGrid, StackGeometry
from depsi.io.metadata import read_metadata_stack
from depsi.io.raster import (
    _azimuth_blocks,
    _BinaryStack,
    _check_exist,
    _chunks,
    _dtype_name,
    _epochs,
    _file_dtype,
    _finish,
    _path_list,
    _raster,
    _size_hint,
)
from depsi.io.raster_geometry import attach_geometry
from depsi.io.validate import InputValidationError

logger = logging.getLogger(__name__)


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
    return _finish(ds, "depsi.io.binary.from_binary")


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
# Writing a DORIS stack folder
# ----------------------------------------------------------------------------------------------

def binary_folder_files(folder: str | os.PathLike, time: np.ndarray, mother: int
                        ) -> dict[str, list]:
    """The files of a DORIS stack folder, one per epoch (``YYYYMMDD`` its date).

    ``slc_files`` (``slc_YYYYMMDD.raw``), ``h2ph_files`` (``h2ph_YYYYMMDD.raw``),
    ``res_files`` (``master.res`` at the mother, ``slave_YYYYMMDD.res`` elsewhere) and
    ``ifgs_res_files`` (``ifgs_YYYYMMDD.res``, None at the mother), as
    :func:`open_binary_folder` finds them.

    Examples
    --------
    >>> files = binary_folder_files("stack", np.array(["2023-03-19", "2023-03-31"], "M8[ns]"), 0)
    >>> [p.name for p in files["res_files"]], files["ifgs_res_files"][0]
    (['master.res', 'slave_20230331.res'], None)
    """
    folder = Path(folder)
    dates = [np.datetime_as_string(t, unit="D").replace("-", "") for t in time]
    slc_files = [folder / f"slc_{d}.raw" for d in dates]
    h2ph_files = [folder / f"h2ph_{d}.raw" for d in dates]
    res_files = [folder / ("master.res" if t == mother else f"slave_{d}.res")
                 for t, d in enumerate(dates)]
    ifgs_files = [None if t == mother else folder / f"ifgs_{d}.res" for t, d in enumerate(dates)]
    return {"slc_files": slc_files, "h2ph_files": h2ph_files, "res_files": res_files,
            "ifgs_res_files": ifgs_files}


def write_binary_folder(folder: str | os.PathLike, stack: xr.Dataset,
                        texts: Mapping[Path, str], *, overwrite: bool = False,
                        progress: bool = True) -> dict[str, Any]:
    """Write a stack's ``complex`` and ``h2ph`` as a DORIS stack folder, with its metadata texts.

    Rasters (:func:`binary_folder_files`: little-endian complex64 and float32, azimuth-major
    ``(n_azimuth, n_range)``) are written one row of blocks at a time (memory: one row of
    blocks of ``complex`` and ``h2ph``) to ``*.part`` files renamed when complete; then each
    of ``texts`` (the ``.res`` files, by path) is written.

    Parameters
    ----------
    folder
        Created if absent.
    stack
        ``complex`` and ``h2ph`` on ``(azimuth, range, time)``, ``mother_time`` in its attrs.
    texts
        The metadata files' contents by path (``res_files`` and ``ifgs_res_files`` of
        :func:`binary_folder_files`).
    overwrite
        Replace files of the same names; otherwise they raise.
    progress
        Show a tqdm progress bar over the rows of blocks.

    Returns
    -------
    dict
        The files of :func:`binary_folder_files`, ``folder``, ``shape``, ``dates``
        (datetime64[ns]), ``mother_index``, ``dtype`` (``"<c8"``), ``h2ph_dtype``
        (``"<f4"``).

    Raises
    ------
    FileExistsError
        When a file to write exists and ``overwrite`` is False.
    """
    folder = Path(folder)
    time = stack["time"].values
    mother = int(np.flatnonzero(time == np.datetime64(stack.attrs["mother_time"]))[0])
    dates = [np.datetime_as_string(t, unit="D").replace("-", "") for t in time]
    layout = binary_folder_files(folder, time, mother)
    slc_files, h2ph_files = layout["slc_files"], layout["h2ph_files"]
    targets = [*slc_files, *h2ph_files, *texts]
    existing = [str(p) for p in targets if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"files already exist in '{folder}': {existing[:3]}"
                              f"{' ...' if len(existing) > 3 else ''}; pass overwrite=True")
    folder.mkdir(parents=True, exist_ok=True)
    shape = (stack.sizes["azimuth"], stack.sizes["range"])
    logger.info("writing %d epochs of %d x %d raw SLC and h2ph files to %s",
                len(dates), *shape, folder)

    parts = [p.with_name(p.name + ".part") for p in (*slc_files, *h2ph_files)]
    try:
        with contextlib.ExitStack() as files:
            handles = [files.enter_context(open(p, "wb")) for p in parts]
            for rows in tqdm(_azimuth_blocks(stack), desc=f"writing {folder.name}",
                             unit="block row", disable=not progress):
                block = stack.isel(azimuth=rows)
                slc, h2ph = dask.compute(block["complex"].data, block["h2ph"].data)
                for t in range(len(dates)):
                    handles[t].write(np.ascontiguousarray(slc[:, :, t], dtype="<c8").tobytes())
                    handles[len(dates) + t].write(
                        np.ascontiguousarray(h2ph[:, :, t], dtype="<f4").tobytes())
        for part, final in zip(parts, (*slc_files, *h2ph_files)):
            os.replace(part, final)
    except BaseException:
        for part in parts:
            part.unlink(missing_ok=True)
        raise

    for path, text in texts.items():
        path.write_text(text)
    return {"folder": folder, **layout, "shape": shape, "dates": time, "mother_index": mother,
            "dtype": "<c8", "h2ph_dtype": "<f4"}


__all__ = [
    "H2PH_ITEMSIZE",
    "binary_folder_files",
    "from_binary",
    "open_binary_folder",
    "write_binary_folder",
]
