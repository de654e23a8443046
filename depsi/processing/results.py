"""The result STM's points: the variables every point of a result carries, and the merge of
first-order and densified points back into the input's order."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

#: Variables of the result STM.
RESULT_VARIABLES = ("velocity", "height_error", "displacement", "temporal_coherence",
                    "ambiguity", "aps", "unwrapped_phase")

#: Coordinates along space a result keeps (the rest are the inputs' own).
RESULT_COORDS = ("time", "azimuth", "range", "lat", "lon", "x", "y", "point_index")


def result_view(ds: xr.Dataset, *, order: int, keep: tuple[str, ...] = ()) -> xr.Dataset:
    """The result variables of one set of points (and ``keep``), with their ``order``
    (1 first-order, 2 densified)."""
    out = ds[list(RESULT_VARIABLES) + list(keep)]
    out = out.assign(order=("space", np.full(ds.sizes["space"], order, dtype=np.int8)))
    drop = [c for c in out.coords if c not in RESULT_COORDS and "space" in out[c].dims]
    return out.drop_vars(drop)


def merged_in_input_order(a: xr.Dataset, b: xr.Dataset) -> xr.Dataset:
    """The points of ``a`` and ``b`` (their common variables) in the order of ``point_index``,
    each variable written once into its place (no concatenated copy sorted again).

    ``b``'s variables are dropped from this frame's ``b`` as they are copied: given the only
    reference to ``b``, memory holds its rest and the merged variables so far, not both whole.
    """
    index = np.concatenate([a["point_index"].values, b["point_index"].values])
    place = np.empty(index.size, np.int64)
    place[np.argsort(index, kind="stable")] = np.arange(index.size)
    n_a = a.sizes["space"]
    merged: dict[Hashable, tuple[tuple[Hashable, ...], Any]] = {}
    lazy = _LazyMerge(place, n_a, b) if any(
        isinstance(b[name].data, da.Array) for name in b.data_vars) else None
    for name, var in a.variables.items():
        if "space" not in var.dims or name not in b.variables:
            continue
        var = var.transpose("space", ...)
        other = b[name].transpose(*var.dims)
        if lazy is not None and isinstance(other.data, da.Array):
            merged[name] = (var.dims, lazy(var.values, other.data))
            b = b.drop_vars([name])
            continue
        values = np.empty((index.size,) + var.shape[1:],
                          np.result_type(var.dtype, other.dtype))
        values[place[:n_a]] = var.values
        values[place[n_a:]] = other.values
        merged[name] = (var.dims, values)
        del other
        b = b.drop_vars([name])
    return xr.Dataset({name: merged[name] for name in a.data_vars if name in merged},
                      coords={name: merged.get(name, a[name].variable) for name in a.coords
                              if name in merged or "space" not in a[name].dims})


def _merged_block(own: np.ndarray, inserted: np.ndarray, at: np.ndarray) -> np.ndarray:
    """One chunk of a lazily merged variable: the chunk's own rows with ``inserted`` rows at
    the local positions ``at`` (the others in their order)."""
    out = np.empty((own.shape[0] + inserted.shape[0],) + own.shape[1:],
                   np.result_type(own.dtype, inserted.dtype))
    mine = np.ones(out.shape[0], bool)
    mine[at] = False
    out[at] = inserted
    out[mine] = own
    return out


class _LazyMerge:
    """The merge of :func:`merged_in_input_order` for ``b``'s Dask variables (those a
    cluster's workers hold): each of ``b``'s space chunks gets the rows of ``a`` (in memory,
    the first-order points) that fall among its own in the merged order, so every chunk is
    one task and nothing of ``b`` comes into this process."""

    def __init__(self, place: np.ndarray, n_a: int, b: xr.Dataset):
        chunks = next(b[name].data.chunks[b[name].dims.index("space")]
                      for name in b.data_vars if isinstance(b[name].data, da.Array))
        bounds = np.cumsum((0,) + tuple(chunks))
        place_a = place[:n_a]
        order = np.argsort(place_a, kind="stable")
        # b's rows before each of a's: its place less a's rows before it
        before = np.empty(n_a, np.int64)
        before[order] = place_a[order] - np.arange(n_a)
        chunk = np.minimum(np.searchsorted(bounds[1:], before, side="right"), len(chunks) - 1)
        counts = np.bincount(chunk, minlength=len(chunks))
        self.sizes = tuple(int(n) for n in np.asarray(chunks) + counts)
        starts = np.cumsum((0,) + self.sizes)[:-1]
        by_chunk = np.lexsort((place_a, chunk))  # a's rows chunk by chunk, in merged order
        self.order, self.counts = by_chunk, tuple(int(n) for n in counts)
        self.at = da.from_array(place_a[by_chunk] - starts[chunk[by_chunk]],
                                chunks=(self.counts,))

    def __call__(self, values_a: np.ndarray, data_b: da.Array) -> da.Array:
        from depsi.stm.runtime import workers_client

        chunks = (self.counts,) + tuple((s,) for s in values_a.shape[1:])
        client = workers_client()
        if client is None:
            inserted = da.from_array(values_a[self.order], chunks=chunks)
        else:
            # each chunk's rows go to the workers as data: not a copy of every row in this
            # process and again inside the graph (1.3 GB of series at 10^7 points)
            bounds = np.cumsum((0,) + self.counts)
            pieces = client.scatter([values_a[self.order[start:stop]] for start, stop
                                     in zip(bounds[:-1], bounds[1:])], hash=False)
            inserted = da.concatenate(
                [da.from_delayed(piece, (count,) + values_a.shape[1:], dtype=values_a.dtype)
                 for piece, count in zip(pieces, self.counts)], axis=0)
        index = "".join(chr(ord("a") + i) for i in range(data_b.ndim))
        dtype = np.result_type(values_a.dtype, data_b.dtype)
        return da.blockwise(_merged_block, index, data_b.rechunk(
            {i: -1 for i in range(1, data_b.ndim)}), index, inserted, index, self.at,
            index[0], dtype=dtype, adjust_chunks={index[0]: self.sizes},
            align_arrays=False)
