"""Space-time matrices on disk: atomic Zarr v3 writes, lazy validated reads, and the completion or
rollback of an interrupted epoch append (the append itself is :mod:`depsi.io.store_append`).

A store is written to a temporary sibling and moved into place when complete, so a crash never
leaves a half-written store at the target path and an existing store is never clobbered unless
asked. Space is stored in Morton order of (azimuth, range) and chunked by bytes; time is one chunk.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Hashable
from pathlib import Path

import numpy as np
import xarray as xr

from depsi.errors import BadInputError
from depsi.io.cf import with_cf_attributes
from depsi.io.lock import write_lock
from depsi.io.paths import REPLACED, TEMPORARY, WRITING, temporary_sibling, temporary_siblings
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


def one_chunking(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with one chunking per dimension: where its variables are chunked differently
    along a dimension (as stores of other writers may be), all take the chunks of the largest
    variable chunked along it, so that ``ds.chunks`` and ``xr.map_blocks`` work.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"a": ("space", np.zeros(6)), "b": ("space", np.ones(6))})
    >>> ds = ds.assign(a=ds.a.chunk(3), b=ds.b.chunk(2))
    >>> dict(one_chunking(ds).chunks)
    {'space': (3, 3)}
    """
    chosen: dict[Hashable, tuple[int, ...]] = {}
    consistent = True
    for var in sorted(ds.variables.values(), key=lambda v: v.nbytes, reverse=True):
        for dim, chunks in zip(var.dims, var.chunks or ()):
            consistent &= chosen.setdefault(dim, chunks) == chunks
    return ds if consistent else ds.chunk(chosen)


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
    """LZ4 at a low level behind a byte shuffle, then a crc32c checksum of the chunk.

    Noisy phase compresses little whatever the codec, so speed wins: 2-3x faster than Zarr's
    default zstd at a store within 2 % of its size (benchmarks/bench_stm.py). The checksum (4
    bytes a chunk) turns a damaged chunk into an error instead of numbers.
    """
    from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

    if dtype.kind not in "fciubmM":  # variable-length strings
        return [ZstdCodec(level=1), Crc32cCodec()]
    typesize = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    return [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=max(typesize, 1)),
            Crc32cCodec()]


# ------------------------------------------------------------------ errors, faults, renames
class StoreIntegrityError(BadInputError, ValueError):
    """A store is damaged, incomplete or unsafe to read; the message names path and part."""


class _MidPublish(StoreIntegrityError):
    """The metadata read disagree with each other: an append may be publishing right now."""


#: Root attribute recording how depsi wrote a store: ``{"format", "complete", "epochs"}``.
STORE_ATTR = "depsi_store"
#: Journal of an append in progress, inside the store
#: (see :func:`~depsi.io.store_append.append_epochs`).
JOURNAL = ".depsi-append.json"
#: Staging folder of an append in progress, inside the store; readers never look there.
STAGING = ".depsi-append"
#: Data types a store may hold; anything else (objects, pickles) is refused before decoding.
_SAFE_V2_OBJECT_CODECS = {"vlen-utf8", "vlen-bytes"}


def _fault_point(stage: str) -> None:
    """Die here by SIGKILL when ``DEPSI_FAULT_AT`` names ``stage`` (fault-injection tests)."""
    if os.environ.get("DEPSI_FAULT_AT") == stage:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2); False where unsupported."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    return False  # EINVAL/ENOSYS: a file system without the exchange; fall back


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def move_into_place(tmp: Path, path: Path) -> None:
    """Put the finished ``tmp`` at ``path``; an old ``path`` is removed only afterwards.

    Every complete product of depsi (stores, exports, simulated stacks) reaches its name this
    way, so a name never points at a half-written product. Over an existing ``path`` the two are
    swapped in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); elsewhere the old one is
    renamed aside first, and a crash between the two renames leaves it as ``.<name>.replaced-*``,
    which the next write or open of ``path`` puts back (:func:`recover_interrupted`).
    """
    if not path.exists():
        os.replace(tmp, path)
        return
    if _exchange(tmp, path):
        _remove(tmp)  # now the old product
        return
    old = temporary_sibling(path, REPLACED)
    os.replace(path, old)
    _fault_point("move:old-aside")
    os.replace(tmp, path)
    _remove(old)


def recover_interrupted(path: str | os.PathLike) -> list[Path]:
    """Undo what a killed writer of ``path`` left; call with :func:`write_lock` held.

    A missing ``path`` with a ``.<name>.replaced-*`` sibling (killed between the two renames of
    :func:`move_into_place`) gets its old product back; the remaining ``.<name>.writing-*`` and
    ``.<name>.replaced-*`` siblings are removed; an append journal is completed or rolled back.

    Returns
    -------
    list of Path
        The siblings removed or restored.
    """
    path = Path(path)
    siblings = temporary_siblings(path, WRITING) + sorted(
        temporary_siblings(path, REPLACED), key=lambda p: p.stat().st_mtime_ns)
    replaced = [p for p in siblings if ".replaced-" in p.name]
    if not path.exists() and replaced:
        logger.warning("restoring %s from %s, left by a writer killed while replacing it",
                       path, replaced[-1])
        os.replace(replaced[-1], path)
    for stale in siblings:
        if stale.exists():
            logger.warning("removing %s, left by an interrupted write of %s", stale, path)
            _remove(stale)
    if (path / JOURNAL).exists():
        _finish_append(path)
    return siblings


# ------------------------------------------------------------------------------------- write
def save_stm(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    reorder: bool = True,
    lock_timeout: float | None = None,
) -> Path:
    """Write an STM to a Zarr v3 store, atomically, with a checksum in every chunk.

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
    lock_timeout
        Seconds to wait for another writer of ``path`` (:func:`depsi.io.lock.write_lock`).

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
    validate(ds, kind=kind, unique_positions=True)
    if reorder and kind == "points" and {"azimuth", "range"} <= set(ds.variables):
        ds = to_morton_order(ds)
    ds = _chunked(_clean_encoding(with_cf_attributes(ds)), kind, chunk_bytes)
    ds.attrs = {k: v for k, v in ds.attrs.items() if k != STORE_ATTR}
    ds.attrs[STORE_ATTR] = {"format": 1, "complete": True,
                            "epochs": int(ds.sizes["time"]) if "time" in ds.dims else None,
                            "arrays": sorted(map(str, ds.variables))}
    encoding = {name: {"compressors": _compressors(ds[name].dtype)} for name in ds.variables}

    with write_lock(path, timeout=lock_timeout):
        recover_interrupted(path)
        if path.exists() and not overwrite:
            raise FileExistsError(
                f"store path {str(path)!r} exists; pass overwrite=True to replace it")
        tmp = temporary_sibling(path, WRITING)
        try:
            ds.to_zarr(tmp, mode="w-", zarr_format=3, consolidated=False, encoding=encoding,
                       write_empty_chunks=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        consolidate_metadata(tmp)
        _fault_point("save:written")
        move_into_place(tmp, path)
    logger.info("wrote %s STM %s to %s", kind, dict(ds.sizes), path)
    return path


# -------------------------------------------------------------------------------------- read
def _metadata_files(path: Path) -> list[Path]:
    names = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")
    found: list[Path] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in ("c", STAGING)]  # chunk folders hold no metadata
        found.extend(Path(root) / f for f in files if f in names)
    return found


def _unsafe_codecs(node: object) -> list[str]:
    """Names of pickle (code-executing) codecs anywhere in a metadata document."""
    found = []
    if isinstance(node, dict):
        for key in ("name", "id"):
            value = node.get(key)
            if isinstance(value, str) and "pickle" in value.lower():
                found.append(value)
        for value in node.values():
            found += _unsafe_codecs(value)
    elif isinstance(node, list):
        for value in node:
            found += _unsafe_codecs(value)
    return found


def check_store_safe(path: str | os.PathLike) -> None:
    """Refuse a store whose metadata asks for object dtypes or pickle codecs.

    Decoding a pickle runs code chosen by whoever wrote the file; depsi never does, whatever
    numcodecs' own opt-in setting says. Only metadata files are read.

    Raises
    ------
    StoreIntegrityError
        Naming the array and the dtype or codec found.
    """
    path = Path(path)
    for meta in _metadata_files(path):
        where = meta.parent.relative_to(path).as_posix() or "/"
        try:
            document = json.loads(meta.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise StoreIntegrityError(
                f"metadata {str(meta)!r}: expected JSON, found unreadable content ({err})"
            ) from None
        unsafe = _unsafe_codecs(document)
        if unsafe:
            raise StoreIntegrityError(
                f"array {where!r} in {str(path)!r}: expected numeric or string codecs, found "
                f"{sorted(set(unsafe))} (refused: decoding a pickle runs arbitrary code)")
        if not isinstance(document, dict):
            continue
        dtype = document.get("dtype") if meta.name == ".zarray" else document.get("data_type")
        if meta.name == ".zarray" and isinstance(dtype, str) and "O" in dtype:
            codec_ids = {str(f.get("id")) for f in (document.get("filters") or [])
                         if isinstance(f, dict)}
            if not codec_ids or not codec_ids <= _SAFE_V2_OBJECT_CODECS:
                raise StoreIntegrityError(
                    f"array {where!r} in {str(path)!r}: expected numeric or string data, "
                    f"found object dtype {dtype!r} with codecs {sorted(codec_ids)}")
        if meta.name == "zarr.json" and isinstance(dtype, str) and dtype.lower() in (
                "object", "|o", "o"):
            raise StoreIntegrityError(
                f"array {where!r} in {str(path)!r}: expected numeric or string data, found "
                f"data type {dtype!r}")


def check_store_path(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"STM store {str(path)!r} does not exist")
    if not path.is_dir():
        raise StoreIntegrityError(
            f"STM store {str(path)!r}: expected a Zarr store (a folder), found a file")
    if not any((path / name).exists() for name in ("zarr.json", ".zgroup", ".zmetadata")):
        found = sorted(p.name for p in path.iterdir())[:5]
        raise StoreIntegrityError(
            f"STM store {str(path)!r}: expected a Zarr group (zarr.json or .zgroup), found "
            + (f"a folder with {found}" if found else "an empty folder"))


class _CheckedChunks:
    """A store array read chunk by chunk: a missing chunk of a complete store, or a chunk that
    fails its checksum, raises naming the variable and the chunk."""

    def __init__(self, variable: xr.Variable, name: str, folder: Path, zarr_array,
                 complete: bool):
        self.variable, self.name, self.folder = variable, name, folder
        self.shape, self.dtype, self.ndim = variable.shape, variable.dtype, variable.ndim
        self.chunk_shape = zarr_array.chunks
        self.encode_key = zarr_array.metadata.encode_chunk_key
        self.complete = complete

    def _chunks_of(self, key: tuple) -> list[tuple[int, ...]]:
        import itertools

        ranges = []
        for k, size, step in zip(key, self.shape, self.chunk_shape):
            start, stop, _ = k.indices(size) if isinstance(k, slice) else (k, k + 1, 1)
            if stop <= start:
                return []  # nothing read, no chunk touched
            ranges.append(range(start // step, (stop - 1) // step + 1))
        return list(itertools.product(*ranges))

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        chunks = self._chunks_of(key)
        if self.complete:
            missing = [c for c in chunks if not (self.folder / self.encode_key(c)).exists()]
            if missing:
                raise StoreIntegrityError(
                    f"variable {self.name!r}, chunk {missing[0]} in {str(self.folder)!r}: "
                    f"expected the chunk file {self.encode_key(missing[0])!r} of a store "
                    f"written whole, found none")
        try:
            return np.asarray(self.variable[key].values)
        except ValueError as err:
            if "checksum" not in str(err).lower():
                raise
            raise StoreIntegrityError(
                f"variable {self.name!r}, chunk(s) {chunks[:4]} in {str(self.folder)!r}: "
                f"expected data matching its crc32c checksum, found damaged data ({err})"
            ) from None


def _store_arrays(path: Path) -> dict:
    """The arrays of the store's root group (an append's journal and staging folder are not
    Zarr nodes: Zarr's warning about them is expected and not shown)."""
    import warnings

    import zarr

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Object at \.depsi-append")
        # the arrays themselves, never the consolidated copy in the root
        return dict(zarr.open_group(path, mode="r", use_consolidated=False).arrays())


def _store_record(path: Path) -> dict:
    root = path / "zarr.json"
    if not root.exists():
        return {}
    record = json.loads(root.read_text()).get("attributes", {}).get(STORE_ATTR)
    return record if isinstance(record, dict) else {}


def _open_checked(path: Path, consolidated: bool) -> xr.Dataset:
    import dask.array as da
    from dask.base import tokenize

    record = _store_record(path)
    group = _store_arrays(path)
    complete = bool(record.get("complete"))
    _check_claims(path, group, complete)  # before any index is decoded
    try:
        raw = xr.open_dataset(path, engine="zarr", consolidated=consolidated, chunks=None,
                              cache=False)
    except ValueError as err:
        if "checksum" in str(err).lower():
            raise StoreIntegrityError(
                f"STM store {str(path)!r}: expected index coordinates matching their crc32c "
                f"checksums, found damaged data ({err})") from None
        raise _MidPublish(f"STM store {str(path)!r}: expected consistent metadata, found "
                          f"{err}") from err
    if complete:
        missing = sorted(set(record.get("arrays") or ()) - set(group))
        if missing:
            raise StoreIntegrityError(
                f"STM store {str(path)!r}: expected the arrays {missing} of a store written "
                f"whole, found no metadata (zarr.json) for them")
    stamp = (path / "zarr.json").stat().st_mtime_ns if (path / "zarr.json").exists() else 0
    for name in [str(n) for n in raw.variables]:  # a store names its arrays with strings
        if name in raw.indexes:
            continue
        var = raw[name].variable
        array = group[name]
        reader = _CheckedChunks(var, name, path / name, array, complete)
        data = da.from_array(reader, chunks=array.chunks if var.ndim else (),
                             name=f"open_stm-{name}-" + tokenize(str(path), name, stamp),
                             meta=np.empty((0,) * var.ndim, dtype=var.dtype))
        raw[name] = var.copy(deep=False, data=data)
    epochs = record.get("epochs")
    if epochs is not None and raw.sizes.get("time") != epochs:
        raise _MidPublish(
            f"STM store {str(path)!r}: expected {epochs} epochs as recorded, found "
            f"{raw.sizes.get('time')} (an append is being published or was interrupted)")
    raw.attrs = {k: v for k, v in raw.attrs.items() if k != STORE_ATTR}
    return raw


#: Metadata files of a Zarr array or group (v2 and v3); every other file is a chunk.
ZARR_METADATA_FILES = frozenset({".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json"})
#: A store's metadata may claim this many times the bytes its chunk files hold (compression of
#: noisy SAR phase is under 2x; an all-fill chunk is not stored at all, so the ratio is
#: generous)...
MAX_CLAIMED_TO_STORED = 1000
#: ... once an array claims more than this many bytes (small arrays are not worth refusing).
MIN_CLAIMED_BYTES_CHECKED = 1 * 2**30


def _chunk_files(folder: Path) -> tuple[int, int]:
    """Number and bytes of the chunk files of an array (its metadata files aside)."""
    count = size = 0
    for root, _, files in os.walk(folder):
        for file in files:
            if file not in ZARR_METADATA_FILES:
                count += 1
                size += (Path(root) / file).stat().st_size
    return count, size


def _check_claims(path: Path, group: dict, complete: bool) -> None:
    """Refuse arrays whose metadata claim what their chunk files cannot hold, counting the
    files (never walking the claimed chunk grid, which may be astronomically large): a store
    written whole must have every chunk, and no array may claim more than
    :data:`MAX_CLAIMED_TO_STORED` times the bytes of its files (beyond
    :data:`MIN_CLAIMED_BYTES_CHECKED`)."""
    for name, array in group.items():
        count, stored = _chunk_files(path / name)
        if complete and count != array.nchunks:
            raise StoreIntegrityError(
                f"variable {name!r} in {str(path)!r}: expected all {array.nchunks} chunks of a "
                f"store written whole, found {count}")
        claimed = int(np.prod(array.shape, dtype=object)) * array.dtype.itemsize
        if claimed > max(MAX_CLAIMED_TO_STORED * stored, MIN_CLAIMED_BYTES_CHECKED):
            raise StoreIntegrityError(
                f"variable {name!r} in {str(path)!r}: its metadata claim shape {array.shape} "
                f"({claimed} bytes), its chunk files hold {stored} bytes; expected at most "
                f"{MAX_CLAIMED_TO_STORED} times the stored bytes")


def open_stm(
    path: str | os.PathLike,
    *,
    kind: str | None = None,
    chunks: dict | None = None,
    check: bool = True,
) -> xr.Dataset:
    """Open an STM store (Zarr v3 or v2) lazily with Dask and validate it.

    Before any array is decoded the store's metadata is checked (no object dtypes, no pickle
    codecs), an interrupted append is completed or rolled back, and a store that depsi wrote
    whole must have every chunk file; reading a chunk that fails its checksum raises
    :class:`StoreIntegrityError` naming the variable and chunk.

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
    if not path.exists() and temporary_siblings(path, REPLACED):
        with write_lock(path):
            recover_interrupted(path)
    check_store_path(path)
    check_store_safe(path)
    if (path / JOURNAL).exists():
        with write_lock(path):
            recover_interrupted(path)
    consolidated = (path / ".zmetadata").exists() and not (path / "zarr.json").exists()
    try:
        ds = _open_checked(path, consolidated)
    except _MidPublish:
        # a concurrent append may be publishing: wait for its writer, then read once more
        with write_lock(path):
            recover_interrupted(path)
            ds = _open_checked(path, consolidated)
    if "time" in ds.dims:
        ds = ds.chunk({"time": -1} | (chunks or {}))
    elif chunks:
        ds = ds.chunk(chunks)
    ds = one_chunking(ds)
    if check:
        validate(ds, kind=kind or infer_kind(ds))
    return ds


def verify_store(path: str | os.PathLike) -> dict[str, int]:
    """Read every chunk of every array of a store and check it; returns chunks per variable.

    Raises
    ------
    StoreIntegrityError
        The first missing or damaged chunk, naming the variable and chunk.
    """
    ds = open_stm(path, check=False)
    counts = {}
    for name, var in ds.variables.items():
        if var.chunks is None:
            continue
        var.data.map_blocks(lambda block: np.zeros((1,) * block.ndim, "i1"), dtype="i1",
                            chunks=tuple((1,) * len(c) for c in var.chunks)).compute()
        counts[str(name)] = int(np.prod([len(c) for c in var.chunks]))
    return counts


# ------------------------------------------------------- append: publishing and its recovery
def _write_json_atomic(path: Path, document: dict) -> None:
    tmp = temporary_sibling(path, TEMPORARY)
    with open(tmp, "w") as f:
        json.dump(document, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _consolidated(path: Path, root: dict) -> dict:
    """The root document ``root`` with Zarr v3 consolidated metadata of the arrays in ``path``.

    Plain ``xr.open_zarr`` reads consolidated metadata first and warns when there is none.
    The arrays' own ``zarr.json`` files stay the truth depsi reads (``open_stm`` never uses
    the consolidated copy); writing the root last, atomically, keeps the copy in step.
    """
    arrays = {}
    for child in sorted(path.iterdir()):
        meta = child / "zarr.json"
        if child.is_dir() and child.name != STAGING and meta.is_file():
            arrays[child.name] = json.loads(meta.read_text())
    return {**root, "consolidated_metadata": {"kind": "inline", "must_understand": False,
                                              "metadata": arrays}}


def consolidate_metadata(path: str | os.PathLike) -> None:
    """Write consolidated metadata into the root ``zarr.json`` of a flat Zarr v3 store."""
    path = Path(path)
    root = json.loads((path / "zarr.json").read_text())
    _write_json_atomic(path / "zarr.json", _consolidated(path, root))


def _publish(path: Path, plan: dict) -> None:
    """Move the staged chunks into the store, then the new metadata, the root last.

    Every step is idempotent, so a killed publish is finished by running it again. Until the
    root's ``depsi_store.epochs`` changes, readers see the old epochs: staged chunks are either
    outside the old shape or hold the old values unchanged where the old shape reaches.
    """
    staging = path / STAGING
    for name in plan["arrays"]:
        folder = staging / name
        files = [p for p in folder.rglob("*") if p.is_file() and p.name != "zarr.json"] \
            if folder.exists() else []
        for i, source in enumerate(files):
            target = path / name / source.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
            if i == len(files) // 2:
                _fault_point("append:moving")
    _fault_point("append:moved")
    for i, (name, document) in enumerate(plan["arrays"].items()):
        _write_json_atomic(path / name / "zarr.json", document)
        if i == 0:
            _fault_point("append:metadata")
    _fault_point("append:before-commit")
    _write_json_atomic(path / "zarr.json", _consolidated(path, plan["root"]))
    _fault_point("append:committed")
    (path / JOURNAL).unlink()
    shutil.rmtree(staging, ignore_errors=True)


def _finish_append(path: Path) -> None:
    """Complete (published) or roll back (staging) the append a journal describes."""
    try:
        journal = json.loads((path / JOURNAL).read_text())
    except (OSError, ValueError):
        journal = {"state": "staging"}  # killed while writing the journal itself
    if journal.get("state") == "publishing":
        logger.warning("completing the append to %s that a killed writer had staged", path)
        _publish(path, journal["plan"])
        return
    logger.warning("rolling back the unfinished append to %s (its epochs were never visible)",
                   path)
    shutil.rmtree(path / STAGING, ignore_errors=True)
    (path / JOURNAL).unlink(missing_ok=True)


