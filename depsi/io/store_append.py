"""Appending epochs to a space-time matrix store, crash-safe and retryable: the new chunks are
staged inside the store, then published under a journal that :mod:`depsi.io.store` completes or
rolls back (``recover_interrupted``) after a crash."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
import xarray as xr

from depsi.io.lock import write_lock
from depsi.io.store import (
    JOURNAL,
    STAGING,
    STORE_ATTR,
    _CheckedChunks,
    _fault_point,
    _finish_append,
    _publish,
    _store_arrays,
    _store_record,
    _write_json_atomic,
    infer_kind,
    open_stm,
    recover_interrupted,
)
from depsi.kernels.statistics import amplitude_of, phase_of
from depsi.stm.schema import DIMS, STMValidationError, validate

logger = logging.getLogger(__name__)


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
            f"time-dependent variables of the new epochs: expected {sorted(timed_old, key=str)}, "
            f"found {sorted(timed_new, key=str)}"
        )
    for name in timed_old:
        if np.result_type(old[name].dtype, new[name].dtype) != old[name].dtype:
            raise STMValidationError(
                f"variable {name!r} of the new epochs: expected dtype {old[name].dtype}, "
                f"found {new[name].dtype}"
            )


def _sources(obj, depth: int = 0) -> list[Path]:
    """The stores a lazily read array (or what wraps it) reads from, as far as can be told."""
    if depth > 8:
        return []
    if isinstance(obj, _CheckedChunks):
        return [obj.folder.parent]
    root = getattr(getattr(obj, "store", None), "root", None)  # a zarr array on a LocalStore
    if root is not None:
        return [Path(root)]
    found = []
    for attr in ("array", "_array", "variable", "_data"):  # xarray's lazy indexing wrappers
        inner = getattr(obj, attr, None)
        if inner is not None and inner is not obj and not isinstance(inner, np.ndarray):
            found += _sources(inner, depth + 1)
    return found


def _check_not_reading(path: Path, new: xr.Dataset) -> None:
    """Refuse epochs read lazily from the store being appended to: the append would read the
    store while it changes it; refused rather than loaded, as they may not fit in memory."""
    target = path.resolve()
    for name, var in new.variables.items():
        if "time" not in var.dims:
            continue  # only the time-dependent variables are read to be written
        data = var._data
        candidates: Iterable[Any]
        if hasattr(data, "__dask_graph__"):
            candidates = dict(data.__dask_graph__()).values()
        else:
            candidates = [data]
        for candidate in candidates:
            for source in _sources(candidate):
                if source.resolve() == target:
                    raise STMValidationError(
                        f"append_epochs: the new epochs are read lazily from the store being "
                        f"appended to ({path}), variable {name!r}; compute them first "
                        f"(new.compute()) or write them elsewhere")


def _append_token(new: xr.Dataset) -> str:
    """Which epochs an append added, recorded so that a retry of it is recognised."""
    times = np.asarray(new["time"].values)
    return f"{times.size} epochs {times[0]} .. {times[-1]}"


def _already_appended(old: xr.Dataset, new: xr.Dataset, path: Path) -> bool:
    """Whether ``new`` is exactly the last append to the store (a retried, finished append)."""
    n = new.sizes["time"]
    if _store_record(path).get("last_append") != _append_token(new):
        return False
    if n > old.sizes["time"] or not np.array_equal(old["time"].values[-n:],
                                                   new["time"].values):
        return False
    tail = old.isel(time=slice(-n, None))
    for name, var in new.data_vars.items():
        if "time" not in var.dims or name not in tail:
            continue
        a, b = tail[name].transpose(*var.dims).data, var.data
        same = (a == b) | ((a != a) & (b != b))
        if not bool(same.all()):
            return False
    return True


def _encoded(var: xr.Variable, name: str, old: xr.Variable, dtype: np.dtype, path: Path):
    """The new epochs of ``name`` encoded as the store holds ``old`` (units, fill, dtype)."""
    if var.dtype.kind == "M":
        from xarray.coding.times import decode_cf_datetime, encode_cf_datetime

        # a stored datetime variable carries its units
        units = cast(str, old.encoding.get("units"))
        calendar = old.encoding.get("calendar")
        numbers = np.asarray(encode_cf_datetime(var.values, units, calendar, dtype)[0])
        back = decode_cf_datetime(numbers, units, calendar)
        if not np.array_equal(np.asarray(back, dtype=var.dtype), var.values):
            raise STMValidationError(
                f"coordinate {name!r} of the new epochs: expected times representable in the "
                f"store's units {units!r}, found {var.values[:3]}")
        return np.asarray(numbers, dtype=dtype)
    if old.encoding.get("scale_factor") is not None or old.encoding.get("add_offset") is not None:
        raise STMValidationError(f"variable {name!r} in {path}: expected unscaled data to append "
                                 f"to, found scale_factor/add_offset")
    return var.data.astype(dtype)


def _stage(path: Path, staging: Path, new: xr.Dataset, old_raw: xr.Dataset) -> dict:
    """Write the new epochs into ``staging``, a Zarr store of the extended arrays that holds
    only the chunks the append writes; returns the journal's publish plan."""
    import dask.array as da
    import zarr

    group = _store_arrays(path)
    plan: dict[str, Any] = {"arrays": {}, "root": None}
    n_new = new.sizes["time"]
    for name, array in group.items():
        dims = list(array.metadata.dimension_names or ())
        if "time" not in dims:
            continue
        axis = dims.index("time")
        old_len, step = array.shape[axis], array.chunks[axis]
        shape = list(array.shape)
        shape[axis] = old_len + n_new
        document = json.loads((path / name / "zarr.json").read_text())
        document["shape"] = shape
        (staging / name).mkdir(parents=True)
        (staging / name / "zarr.json").write_text(json.dumps(document))
        target = zarr.open_array(zarr.storage.LocalStore(staging), path=name, mode="r+",
                                 config={"write_empty_chunks": True})
        if old_len % step:  # the last time chunk is partly filled: start from its old bytes
            for source in (path / name).rglob("*"):
                if source.is_file() and source.name != "zarr.json":
                    rel = source.relative_to(path / name)
                    coords = _chunk_coords(rel, array)
                    if coords is not None and coords[axis] == old_len // step:
                        (staging / name / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(source, staging / name / rel)
        values = _encoded(new[name].variable.transpose(*dims), name, old_raw[name].variable,
                          array.dtype.to_native_dtype() if hasattr(array.dtype, "to_native_dtype")
                          else np.dtype(array.dtype), path)
        region = tuple(slice(old_len, old_len + n_new) if i == axis else slice(None)
                       for i in range(len(dims)))
        lazy = da.asarray(values).rechunk(
            {i: (array.chunks[i] if i != axis else -1) for i in range(len(dims))})
        # dask's annotation of targets leaves out zarr arrays, which it writes to
        da.store(lazy, target, regions=region, lock=False)  # type: ignore[arg-type]
        plan["arrays"][name] = document
        _fault_point("append:staged-one")
    root = json.loads((path / "zarr.json").read_text())
    record = dict(root.get("attributes", {}).get(STORE_ATTR) or {"format": 1})
    record["epochs"] = int(old_raw.sizes["time"]) + n_new
    record["last_append"] = _append_token(new)
    root.setdefault("attributes", {})[STORE_ATTR] = record
    plan["root"] = root
    return plan


def _chunk_coords(rel: Path, array) -> tuple[int, ...] | None:
    parts = rel.as_posix().split("/")
    if parts[0] == "c":
        parts = parts[1:]
    if len(parts) == 1 and "." in parts[0]:
        parts = parts[0].split(".")
    try:
        coords = tuple(int(p) for p in parts)
    except ValueError:
        return None
    return coords if len(coords) == len(array.shape) else None


def append_epochs(path: str | os.PathLike, new: xr.Dataset, *,
                  lock_timeout: float | None = None) -> Path:
    """Append new epochs along ``time`` to an existing store, crash-safe and retryable.

    The new epochs must follow the last stored epoch and hold the same points (same size and
    ``azimuth``/``range`` in the same order) and the same time-dependent variables. Old chunks
    are untouched (a partly filled last time chunk is rewritten whole, holding the same old
    values). The append holds the store's writer lock, writes the new chunks into a staging
    folder readers never look at, and only then publishes them with a journal: the store is at
    every moment either the old or the new one, and an append killed at any point is rolled
    back (not yet published) or completed (published) by the next ``append_epochs`` or
    ``open_stm``. Appending the same epochs again after that is a no-op.

    Parameters
    ----------
    path
        A Zarr v3 store written by :func:`~depsi.io.store.save_stm`.
    new
        The new epochs, an STM of the same kind.
    lock_timeout
        Seconds to wait for another writer of ``path``.

    Raises
    ------
    STMValidationError
        Before anything is staged, for new epochs that do not fit the store, or that are read
        lazily from ``path`` itself (say ``open_stm(path).isel(...)``): those are refused rather
        than loaded, as they may be far larger than memory; ``new.compute()`` them first.
    """
    path = Path(path)
    with write_lock(path, timeout=lock_timeout):
        recover_interrupted(path)
        old = open_stm(path)
        kind = infer_kind(old)
        validate(new, kind=kind)
        if not (path / "zarr.json").exists():
            raise STMValidationError(
                f"store {str(path)!r}: expected a Zarr v3 store to append to, found Zarr v2; "
                "rewrite it with save_stm first")
        if _already_appended(old, new, path):
            logger.info("the %d epoch(s) are already the last of %s: nothing to append",
                        new.sizes["time"], path)
            return path
        _check_appendable(old, new, path)
        _check_not_reading(path, new)
        old_raw = xr.open_dataset(path, engine="zarr", consolidated=False, chunks=None,
                                  cache=False)
        staging = path / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        _write_json_atomic(path / JOURNAL, {"state": "staging"})
        _fault_point("append:journal")
        try:
            staging.mkdir()
            plan = _stage(path, staging, new, old_raw)
        except BaseException:
            _finish_append(path)  # roll back: nothing was visible
            raise
        _fault_point("append:staged")
        _write_json_atomic(path / JOURNAL, {"state": "publishing", "plan": plan})
        _fault_point("append:publishing")
        _publish(path, plan)
    logger.info("appended %d epoch(s) to %s", new.sizes["time"], path)
    return path


def epoch_coords(ds: xr.Dataset) -> list[str]:
    """Per-epoch coordinates other than ``time`` (``bperp``, ...)."""
    return [str(n) for n, c in ds.coords.items() if c.dims == ("time",) and n != "time"]


def check_epoch_variables(old: xr.Dataset, new: xr.Dataset) -> None:
    """An STMValidationError unless ``new`` has the store's per-epoch ``h2ph`` and
    coordinates (when ``old`` has them)."""
    needed = [name for name in ("h2ph", *epoch_coords(old)) if name in old.variables]
    missing = [name for name in needed if name not in new.variables]
    if missing:
        raise STMValidationError(f"new epochs: expected {missing} as the store has them, "
                                 f"found {sorted(map(str, new.variables))}")


def epochs_to_append(old: xr.Dataset, new: xr.Dataset) -> xr.Dataset:
    """The new epochs of a point store (``complex`` and ``h2ph`` as the store has it, at its
    points) with exactly the store's per-epoch variables and coordinates, ready for
    :func:`append_epochs`."""
    check_epoch_variables(old, new)
    slc = new["complex"].transpose("space", "time").values.astype(old["complex"].dtype)
    dims = ("space", "time")
    data = {"complex": (dims, slc), "amplitude": (dims, amplitude_of(slc)),
            "phase": (dims, phase_of(slc))}
    if "h2ph" in old.data_vars:
        data["h2ph"] = (dims, new["h2ph"].transpose("space", "time").values
                        .astype(old["h2ph"].dtype))
    coords = {"time": new["time"].values,
              **{name: ("time", new[name].values) for name in epoch_coords(old)}}
    for name in ("azimuth", "range"):
        coords[name] = ("space", (new if name in new.coords else old)[name].values)
    # append_epochs writes these attributes over the store's: carry the stored ones
    return xr.Dataset(data, coords=coords, attrs=dict(old.attrs))


__all__ = ["append_epochs", "check_epoch_variables", "epoch_coords", "epochs_to_append"]
