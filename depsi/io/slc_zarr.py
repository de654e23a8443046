"""SLC stacks stored as Zarr (v2 or v3): :func:`open_slc_zarr` reads them lazily as depsi's
raster conventions, refusing stores whose chunk files are missing (a missing chunk reads as
zeros).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import shutil
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
import zarr
from tqdm.auto import tqdm

from depsi.io.paths import TEMPORARY, temporary_sibling
from depsi.io.raster import (
    RASTER_DIMS,
    _azimuth_blocks,
    _check_wavelength,
    _chunks,
    _finish,
    _iq_to_complex64,
    _parse_dates,
)
from depsi.io.store import ZARR_METADATA_FILES, one_chunking
from depsi.io.validate import check_epoch_span
from depsi.stm.schema import STMValidationError

logger = logging.getLogger(__name__)

#: Variables of an SLC store whose chunks must all be on disk: a missing chunk reads as the fill
#: value (zeros) without a message. Stores must be written with every chunk (depsi's writers
#: do; zarr's ``write_empty_chunks=False`` leaves out all-fill chunks, which no SLC has).
ZARR_CHECKED_VARIABLES = ("complex", "real", "imag", "h2ph", "lat", "lon")
#: Missing chunk keys shown in a message (the count is always given).
_SHOWN_KEYS = 5


@dataclass(frozen=True)
class _ZarrArray:
    """What an array's metadata claims: its chunk grid and how its chunk files are named."""

    name: str
    dims: tuple[str, ...]
    grid: tuple[int, ...]
    prefix: str
    separator: str
    source: str
    shape: tuple[int, ...] = ()
    chunks: tuple[int, ...] = ()


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
    return _ZarrArray(name, dims, grid, prefix, separator, source, tuple(shape), tuple(chunks))


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
            if file in ZARR_METADATA_FILES:
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


def _check_zarr_chunks(path: Path, claims: list[_ZarrArray]) -> list[tuple[_ZarrArray, int]]:
    """Refuse an SLC store whose arrays lack chunk files their metadata claims.

    Missing ``h2ph`` chunks all in one time chunk are returned instead (the claim and that
    time chunk): they may be the mother's zeros, which zarr leaves out;
    :func:`_check_h2ph_chunks` decides once the dates are known.
    """
    deferred = []
    for claim in claims:
        present = _present_chunks(path / claim.name, claim)
        time_axis = claim.dims.index("time") if "time" in claim.dims else None
        spatial = int(np.prod([n for i, n in enumerate(claim.grid) if i != time_axis]))
        maybe_mother = claim.name == "h2ph" and time_axis is not None
        count, shown = _missing_chunks(present, claim,
                                       max(spatial, _SHOWN_KEYS) if maybe_mother else _SHOWN_KEYS)
        if count <= 0:
            continue
        if (maybe_mother and time_axis is not None and len(shown) == count
                and len({k[time_axis] for k in shown}) == 1):
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


#: Stored (azimuth, range) chunks whose blocks, with time whole, hold fewer bytes than this are
#: read in blocks of many of them when there are more than :data:`MAX_STORED_BLOCKS`: one Dask
#: task per tiny chunk (a store chunked in 1 x 1 pixels has one per pixel) costs more in
#: scheduling than its pixels in work.
MIN_STORED_BLOCK_BYTES = 2**20
#: Stored (azimuth, range) blocks up to which a store's own chunks are kept however small.
MAX_STORED_BLOCKS = 1024


def _whole_chunks(target: int, stored: int) -> int:
    """The multiple of ``stored`` nearest below ``target`` (at least ``stored``)."""
    return max(stored, target // stored * stored)


def _default_blocks(path: Path, claims: list[_ZarrArray]) -> dict[str, int]:
    """Dask chunks to open a store with by default: its stored (azimuth, range) chunks with
    time whole, or, when those are tiny and many (:data:`MIN_STORED_BLOCK_BYTES`), blocks of whole
    stored chunks about :data:`~depsi.io.store.DEFAULT_CHUNK_BYTES` large. ``claims``: what
    the store's metadata says of its arrays (:func:`_zarr_claims`, the last one of a name the
    array's own document, as xarray reads it)."""
    by_name = {claim.name: claim for claim in claims}
    variable = next((by_name[n] for n in ("complex", "real") if n in by_name), None)
    if variable is None or not set(RASTER_DIMS) <= set(variable.dims):
        return {"time": -1}  # refused with its layout once opened
    step = dict(zip(variable.dims, variable.chunks))
    size = dict(zip(variable.dims, variable.shape))
    shape = (size["azimuth"], size["range"])
    n_time = size["time"]
    itemsize = np.dtype(np.complex64).itemsize
    n_blocks = math.ceil(shape[0] / step["azimuth"]) * math.ceil(shape[1] / step["range"])
    if (step["azimuth"] * step["range"] * n_time * itemsize >= MIN_STORED_BLOCK_BYTES
            or n_blocks <= MAX_STORED_BLOCKS):
        return {"time": -1}
    azimuth, range_, _ = _chunks(None, shape, n_time)
    blocks = {"azimuth": _whole_chunks(azimuth, step["azimuth"]),
              "range": _whole_chunks(range_, step["range"]), "time": -1}
    logger.info("SLC store '%s' is stored in chunks of %d x %d pixels: reading it in blocks "
                "of %d x %d", path, step["azimuth"], step["range"], blocks["azimuth"],
                blocks["range"])
    return blocks


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
        Block shape as in :func:`~depsi.io.binary.from_binary`; default: the store's chunks
        with time whole, or blocks of many of them when they are tiny
        (:data:`MIN_STORED_BLOCK_BYTES`).

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
    claims = _zarr_claims(path, v3)
    deferred = _check_zarr_chunks(path, claims)
    # By default each Dask chunk spans every stored time chunk of its (azimuth, range) block:
    # zarr then decodes them straight into one array, where a rechunk after opening would
    # copy every block once more to join its time chunks.
    ds = xr.open_zarr(path, consolidated=consolidated,
                      chunks=_default_blocks(path, claims) if chunks is None else {})
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
        ds = one_chunking(ds.chunk({"time": -1}))
    else:
        ds = ds.chunk(dict(zip(RASTER_DIMS, block)))
    return _finish(ds, "depsi.io.slc_zarr.open_slc_zarr")


# ----------------------------------------------------------------------------------------------
# Writing an SLC stack to Zarr
# ----------------------------------------------------------------------------------------------

def _refuse_existing(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"path '{path}' already exists; pass overwrite=True to replace it")


def _move_into_place(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename the finished ``tmp`` to ``path``; an old ``path`` goes only once ``tmp`` is done."""
    from depsi.io.store import move_into_place

    _refuse_existing(path, overwrite)
    move_into_place(tmp, path)


def _spatial_part(ds: xr.Dataset, rows: slice) -> xr.Dataset:
    part = ds.isel(azimuth=rows)
    return part.drop_vars([n for n in part.variables if "azimuth" not in part[n].dims])


def write_slc_zarr(path: str | os.PathLike, stack: xr.Dataset, *,
                   groups: Mapping[str, xr.Dataset] | None = None, overwrite: bool = False,
                   progress: bool = True) -> Path:
    """Write an SLC stack to a Zarr v3 store, block by block, in bounded memory.

    The stack goes to the root group of ``path`` and each of ``groups`` to its group
    (``xr.open_zarr(path, group=name)``), chunked like the Dask arrays. The store is written to
    a hidden sibling ``.<name>.tmp-<id>`` and renamed into place when complete, so ``path``
    never holds a half-written store. Metadata are consolidated; :func:`open_slc_zarr` reads
    it back.

    Parameters
    ----------
    path
        The store to create.
    stack
        The raster stack ``(azimuth, range, time)``, Dask-backed (one row of blocks is computed
        at a time: memory about two chunks per thread).
    groups
        Further datasets on the same azimuth blocks, by group name (the simulator's truth).
    overwrite
        Replace an existing ``path`` (only after the new store is complete).
    progress
        Show a tqdm progress bar over the rows of blocks.

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
    >>> import tempfile, pathlib, numpy as np, xarray as xr
    >>> store = pathlib.Path(tempfile.mkdtemp()) / "stack.zarr"
    >>> stack = xr.Dataset({"complex": (("azimuth", "range", "time"), np.ones((4, 3, 2), "c8"))},
    ...                    coords={"time": np.array(["2023-03-19", "2023-03-31"], "M8[ns]")}
    ...                    ).chunk({"azimuth": 2})
    >>> _ = write_slc_zarr(store, stack, progress=False)
    >>> open_slc_zarr(store, wavelength=0.0555)["complex"].shape
    (4, 3, 2)
    """
    path = Path(path)
    _refuse_existing(path, overwrite)
    tmp = temporary_sibling(path, TEMPORARY)
    logger.info("writing SLC stack %s (%.3g GB complex) via %s", path,
                stack["complex"].nbytes / 1e9, tmp)
    try:
        parts: tuple[tuple[xr.Dataset, str | None], ...] = (
            (stack, None), *((ds, name) for name, ds in (groups or {}).items()))
        for ds, group in parts:
            ds.to_zarr(tmp, group=group, mode="w", compute=False, zarr_format=3,
                       consolidated=False)
        rows = _azimuth_blocks(stack)
        for block in tqdm(rows, desc=f"writing {path.name}", unit="block row",
                          disable=not progress):
            for ds, group in parts:
                _spatial_part(ds, block).to_zarr(tmp, group=group, region={"azimuth": block},
                                                 zarr_format=3, consolidated=False)
        with warnings.catch_warnings():
            # zarr 3 warns that consolidated metadata is not yet part of the v3 spec
            warnings.filterwarnings("ignore", message="Consolidated metadata",
                                    category=UserWarning)
            zarr.consolidate_metadata(str(tmp))
        _move_into_place(tmp, path, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("wrote %s", path)
    return path


__all__ = [
    "ZARR_CHECKED_VARIABLES",
    "open_slc_zarr",
    "write_slc_zarr",
]
