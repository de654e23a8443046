"""Space-time matrices on disk: atomic Zarr v3 writes, lazy validated reads, epoch appends.

A store is written to a temporary sibling and moved into place when complete, so a crash never
leaves a half-written store at the target path and an existing store is never clobbered unless
asked. Space is stored in Morton order of (azimuth, range) and chunked by bytes; time is one chunk.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import xarray as xr

from depsi.stm.order import morton_order
from depsi.stm.schema import DIMS, STMValidationError, validate

logger = logging.getLogger(__name__)

#: Default target size of one space chunk, in bytes over all (space, ...) variables.
DEFAULT_CHUNK_BYTES = 32 * 2**20

#: Encoding keys kept when rewriting a Dataset; codecs and chunking are chosen anew on write.
_KEPT_ENCODING = ("units", "calendar", "dtype", "_FillValue")


def infer_kind(ds: xr.Dataset) -> str:
    """The STM kind of ``ds`` from its dims: ``"raster"``, ``"arcs"`` or ``"points"``."""
    for kind in ("raster", "arcs", "points"):
        if all(dim in ds.dims for dim in DIMS[kind]):
            return kind
    raise STMValidationError(
        f"dimensions: expected one of {[DIMS[k] for k in DIMS]}, found {tuple(ds.dims)}"
    )


def space_chunk_size(ds: xr.Dataset, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                     dim: str = "space") -> int:
    """Number of items along ``dim`` whose variables together take about ``chunk_bytes``."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes: expected a positive number of bytes, found {chunk_bytes}")
    row_bytes = 0
    for var in ds.variables.values():
        if dim in var.dims:
            others = [ds.sizes[d] for d in var.dims if d != dim]
            row_bytes += var.dtype.itemsize * int(np.prod(others, dtype=np.int64))
    n = int(chunk_bytes // max(row_bytes, 1))
    return max(1, min(n, ds.sizes[dim]))


def is_morton_ordered(ds: xr.Dataset) -> bool:
    """Whether the points of ``ds`` are already in Morton order of (azimuth, range)."""
    order = morton_order(np.asarray(ds["azimuth"].values), np.asarray(ds["range"].values))
    return bool((order == np.arange(order.size)).all())


def to_morton_order(ds: xr.Dataset) -> xr.Dataset:
    """Return ``ds`` with space sorted in Morton order (unchanged when already sorted)."""
    if is_morton_ordered(ds):
        return ds
    order = morton_order(np.asarray(ds["azimuth"].values), np.asarray(ds["range"].values))
    return ds.isel(space=order)


def _clean_encoding(ds: xr.Dataset) -> xr.Dataset:
    """Drop stored codecs and chunking; fixed-width strings become variable-length UTF-8.

    Zarr v3 has no stable specification for fixed-width unicode, so ids such as ``L0001P0002``
    are written as variable-length strings: nothing is truncated, whatever the length.
    """
    ds = ds.copy(deep=False)
    for name in list(ds.variables):
        encoding = {k: v for k, v in ds[name].encoding.items() if k in _KEPT_ENCODING}
        if ds[name].dtype.kind in "UO" and name not in ds.dims:
            ds[name] = ds[name].astype(np.dtypes.StringDType())
        ds[name].encoding = encoding
    return ds


def _chunked(ds: xr.Dataset, kind: str, chunk_bytes: int) -> xr.Dataset:
    lead = DIMS[kind][0]
    chunks = {d: -1 for d in ds.dims}
    chunks[lead] = space_chunk_size(ds, chunk_bytes, dim=lead)
    if kind == "raster":
        # a raster chunk is a square patch of about chunk_bytes over all time
        per_pixel = space_chunk_size(ds, chunk_bytes, dim="azimuth") * ds.sizes["range"]
        side = max(1, int(np.sqrt(per_pixel)))
        chunks["azimuth"] = min(side, ds.sizes["azimuth"])
        chunks["range"] = min(side, ds.sizes["range"])
    return ds.chunk(chunks)


def _compressors(dtype: np.dtype) -> list:
    """LZ4 at a low level behind a byte shuffle for every numeric variable.

    Noisy phase compresses little whatever the codec, so speed wins: 2-3x faster than Zarr's
    default zstd at a store within 2 % of its size (benchmarks/bench_stm.py).
    """
    from zarr.codecs import BloscCodec

    typesize = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    return [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=max(typesize, 1))]


def _temporary_sibling(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:8]}")


def save_stm(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    reorder: bool = True,
) -> Path:
    """Write an STM to a Zarr v3 store, atomically.

    Parameters
    ----------
    ds
        A points, arcs or raster STM (validated first). Dask-backed data is computed chunk by
        chunk while writing.
    path
        Target store. An existing path raises ``FileExistsError`` unless ``overwrite=True``.
    overwrite
        Replace an existing store; the old one is removed only after the new one is complete.
    chunk_bytes
        Target bytes per space chunk (all variables together); time is kept in one chunk.
    reorder
        Sort a points STM with ``azimuth``/``range`` into Morton order before writing.

    Returns
    -------
    Path
        The path of the written store.

    Examples
    --------
    >>> import tempfile, numpy as np, xarray as xr
    >>> ds = xr.Dataset({"amplitude": (("space", "time"), np.ones((4, 2), "f4"))},
    ...                 coords={"time": np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]"),
    ...                         "azimuth": ("space", [1, 0, 1, 0]),
    ...                         "range": ("space", [1, 1, 0, 0])})
    >>> out = save_stm(ds, tempfile.mkdtemp() + "/ps.zarr")
    >>> open_stm(out).azimuth.values.tolist()
    [0, 0, 1, 1]
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"store path {str(path)!r} exists; pass overwrite=True to replace it"
        )
    kind = infer_kind(ds)
    validate(ds, kind=kind)
    if reorder and kind == "points" and {"azimuth", "range"} <= set(ds.variables):
        ds = to_morton_order(ds)
    ds = _chunked(_clean_encoding(ds), kind, chunk_bytes)
    encoding = {name: {"compressors": _compressors(ds[name].dtype)} for name in ds.variables
                if ds[name].dtype.kind in "fciub"}

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_sibling(path, "writing")
    try:
        ds.to_zarr(tmp, mode="w-", zarr_format=3, consolidated=False, encoding=encoding)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    move_into_place(tmp, path)
    logger.info("wrote %s STM %s to %s", kind, dict(ds.sizes), path)
    return path


def move_into_place(tmp: Path, path: Path) -> None:
    """Rename the finished ``tmp`` to ``path``; an old ``path`` is removed only afterwards.

    Every complete product of depsi (stores, exports, simulated stacks) reaches its name this
    way, so a name never points at a half-written product.
    """
    old = None
    if path.exists():
        old = _temporary_sibling(path, "replaced")
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


def open_stm(
    path: str | os.PathLike,
    *,
    kind: str | None = None,
    chunks: dict | None = None,
    check: bool = True,
) -> xr.Dataset:
    """Open an STM store (Zarr v3 or v2) lazily with Dask and validate it.

    Parameters
    ----------
    path
        The store.
    kind
        Expected kind (``"points"``, ``"arcs"``, ``"raster"``); inferred from the dims if None.
    chunks
        Dask chunks; default the store's own chunks with ``time`` in one chunk.
    check
        Validate the conventions (default True).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"STM store {str(path)!r} does not exist")
    consolidated = (path / ".zmetadata").exists() and not (path / "zarr.json").exists()
    ds = xr.open_zarr(path, consolidated=consolidated, chunks={})
    if "time" in ds.dims:
        ds = ds.chunk({"time": -1} | (chunks or {}))
    elif chunks:
        ds = ds.chunk(chunks)
    if check:
        validate(ds, kind=kind or infer_kind(ds))
    return ds


def _check_appendable(old: xr.Dataset, new: xr.Dataset, path: Path) -> None:
    lead = DIMS[infer_kind(old)][0]
    if new.sizes.get(lead) != old.sizes[lead]:
        raise STMValidationError(
            f"dimension {lead!r} of the new epochs: expected {old.sizes[lead]} as in {path}, "
            f"found {new.sizes.get(lead)}"
        )
    for coord in ("azimuth", "range", "source", "target"):
        if coord in old.coords and lead in old[coord].dims:
            if coord not in new.coords or not np.array_equal(old[coord].values,
                                                             new[coord].values):
                raise STMValidationError(
                    f"coordinate {coord!r} of the new epochs: expected the same {lead} "
                    f"points in the same order as {path}, found different values"
                )
    last, first_new = old["time"].values[-1], new["time"].values[0]
    if not first_new > last:
        raise STMValidationError(
            f"coordinate 'time' of the new epochs: expected epochs after the last stored "
            f"epoch {last}, found {first_new}"
        )
    timed_old = {n for n, v in old.data_vars.items() if "time" in v.dims}
    timed_new = {n for n, v in new.data_vars.items() if "time" in v.dims}
    if timed_old != timed_new:
        raise STMValidationError(
            f"time-dependent variables of the new epochs: expected {sorted(timed_old)}, "
            f"found {sorted(timed_new)}"
        )
    for name in timed_old:
        if np.result_type(old[name].dtype, new[name].dtype) != old[name].dtype:
            raise STMValidationError(
                f"variable {name!r} of the new epochs: expected dtype {old[name].dtype}, "
                f"found {new[name].dtype}"
            )


def append_epochs(path: str | os.PathLike, new: xr.Dataset) -> Path:
    """Append new epochs along ``time`` to an existing store without rewriting the old ones.

    The new epochs must follow the last stored epoch and hold the same points (same size and
    ``azimuth``/``range`` in the same order) and the same time-dependent variables. Old chunks are
    untouched: the new epochs go into new chunks along ``time``. If the write fails part way, the
    store is resized back to its old epochs.
    """
    import zarr

    path = Path(path)
    old = open_stm(path)
    kind = infer_kind(old)
    validate(new, kind=kind)
    _check_appendable(old, new, path)

    timed = [n for n, v in new.variables.items() if "time" in v.dims]
    piece = _clean_encoding(new[timed].drop_vars(
        [c for c in new[timed].coords if "time" not in new[c].dims]))
    piece = piece.chunk({d: -1 for d in piece.dims})
    piece.attrs = dict(old.attrs)  # an append writes its attrs over the store's: keep the store's
    group = zarr.open_group(path, mode="r+")
    old_shapes = {name: group[name].shape for name in timed if name in group}
    try:
        piece.to_zarr(path, append_dim="time", consolidated=False)
    except BaseException:
        for name, shape in old_shapes.items():
            group[name].resize(shape)
        raise
    logger.info("appended %d epoch(s) to %s", new.sizes["time"], path)
    return path
