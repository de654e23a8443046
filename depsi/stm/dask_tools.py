"""Dask graph helpers of the chain's steps: computing a lazy Dataset into one array per
variable, gathering a product chunk by chunk or keeping its rows on the workers, cutting a
slice's graph down to its own tasks, chunking a NumPy array by views. The memory of the
process and its workers is :mod:`depsi.stm.runtime`'s.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Hashable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.typing import Key

from depsi.stm.runtime import pageable


def _shares_memory_with_workers(arrays: list) -> bool:
    """Whether the current Dask scheduler runs tasks in this process (threads, synchronous)."""
    import dask.local
    import dask.threaded
    from dask.base import get_scheduler

    if get_scheduler(collections=arrays) is dask.local.get_sync:
        return True
    # the threaded scheduler runs on the configured pool where one is set: threads only if
    # it is not a pool of processes
    return (get_scheduler(collections=arrays) is dask.threaded.get
            and not isinstance(dask.config.get("pool", None), ProcessPoolExecutor))


def computed_in_place(ds: xr.Dataset, *, in_process: bool = False
                      ) -> dict[Hashable, tuple[tuple[Hashable, ...], np.ndarray]]:
    """Every data variable of ``ds`` computed straight into one NumPy array each.

    ``ds.compute()`` holds every chunk's result and then concatenates them, twice the memory of
    the result at the end; here each chunk is written into its place in a preallocated array as
    it is done (``dask.array.store``), all variables in one pass over the graph. Returns
    ``{name: (dims, values)}``, for ``Dataset.assign``.

    ``in_process=True`` computes on this process's threads whatever the current scheduler: for
    a graph whose inputs are this process's own arrays (views made by :func:`chunked_view`),
    which a distributed scheduler would otherwise copy whole into the graph it ships (see
    docs/benchmarks.md, "Dask graphs and the workers").

    Examples
    --------
    >>> ds = xr.Dataset({"a": ("x", da.arange(6, chunks=2))})
    >>> computed_in_place(ds)["a"][1].tolist()
    [0, 1, 2, 3, 4, 5]
    """
    lazy = [name for name, var in ds.data_vars.items() if var.chunks is not None]
    if lazy and in_process:
        # the threaded scheduler takes the configured pool when there is one: a process pool
        # (depsi's "processes" scheduler sets one) would run the blocks elsewhere
        with dask.config.set(scheduler="threads", pool=None):
            return computed_in_place(ds)
    if lazy and not _shares_memory_with_workers([ds[name].data for name in lazy]):
        ds = ds.compute()  # workers in other processes (distributed, processes) cannot write here
        lazy = []
    out = {name: (var.dims, np.empty(var.shape, var.dtype) if name in lazy
                  else np.asarray(var.values)) for name, var in ds.data_vars.items()}
    if lazy:
        da.store([ds[name].data for name in lazy], [out[name][1] for name in lazy], lock=False)
    return out


def gathered_by_chunk(ds: xr.Dataset, client) -> xr.Dataset:
    """``ds`` computed on ``client``'s workers and brought into this process a chunk at a time,
    each written into its place in one preallocated array a variable. ``ds.compute()`` on a
    distributed scheduler ends in a task that concatenates every chunk on one worker: at 10^7
    points the first-order points' phases and h2ph (0.7 GB) in a worker of 1 GB, which its
    nanny restarted. Large variables are :func:`~depsi.stm.runtime.pageable` (the first-order
    points' phases and h2ph: a step whose peak does not read them lets their pages go,
    :func:`~depsi.stm.runtime.page_out`)."""
    from distributed import as_completed

    def gathered(var: xr.Variable) -> xr.Variable:
        if var.chunks is None:
            return var
        data = var.data
        values = pageable(data.shape, data.dtype)  # (large: in a file's pages, page_out)
        blocks = list(np.ndindex(*data.numblocks))
        bounds = [np.cumsum((0,) + c) for c in data.chunks]
        futures = client.compute([data.blocks[index] for index in blocks])
        where = {future.key: index for future, index in zip(futures, blocks)}
        for future in as_completed(futures):
            index = where[future.key]
            place = tuple(slice(b[i], b[i + 1]) for b, i in zip(bounds, index))
            values[place] = future.result()
            future.release()
        return xr.Variable(var.dims, values, var.attrs, encoding=var.encoding)

    # the coordinates too: each concatenated whole would sit on one worker
    out = {name: gathered(var.variable) for name, var in ds.data_vars.items()}
    coords = {name: gathered(coord.variable) for name, coord in ds.coords.items()}
    return xr.Dataset(out, coords=coords, attrs=ds.attrs)


def culled(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with each Dask variable's graph cut down to the tasks its own chunks need.

    A slice of a lazy result (a batch of its chunks) keeps the whole graph it was cut from, and
    a distributed scheduler gets that whole graph pickled and sent before it culls it; here
    each variable keeps the tasks found by a walk from its own keys (:func:`needed_tasks`), so
    the cost follows the batch, not the graph it was cut from. The values are the same.

    Examples
    --------
    >>> whole = xr.Dataset({"a": ("x", da.arange(6, chunks=2) + 1)})
    >>> batch = culled(whole.isel(x=slice(0, 2)))
    >>> len(batch["a"].data.__dask_graph__()), batch["a"].values.tolist()
    (3, [1, 2])
    """
    from dask.core import flatten

    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        data = var.data
        if not isinstance(data, da.Array):
            continue
        graph = needed_tasks(data.__dask_graph__(), flatten(data.__dask_keys__()))
        out[name].data = da.Array(graph, data.name, data.chunks, meta=data._meta)
    return out


def culled_rows(ds: xr.Dataset, rows: slice, dim: str = "space") -> xr.Dataset:
    """``culled(ds.isel({dim: rows}))`` at a cost that follows the rows, not ``ds``'s graph.

    Slicing a Dask array copies its graph's table of layers (``HighLevelGraph`` checks every
    layer), so a loop over batches of a graph of one layer a chunk (densification's) grows
    with batches x chunks. Here each variable along ``dim`` is first cut to the tasks of the
    chunks that ``rows`` meets, then sliced; the tasks and values are those of
    ``culled(ds.isel({dim: rows}))``.

    Examples
    --------
    >>> whole = xr.Dataset({"a": ("space", da.arange(6, chunks=2) + 1)})
    >>> batch = culled_rows(whole, slice(2, 4))
    >>> len(batch["a"].data.__dask_graph__()), batch["a"].values.tolist()
    (3, [3, 4])
    """
    import itertools

    if not isinstance(rows, slice) or rows.step not in (None, 1):
        raise ValueError(f"rows: expected a slice of step 1, found {rows!r}")
    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        data = var.data
        if not isinstance(data, da.Array) or dim not in var.dims:
            continue
        axis = var.dims.index(dim)
        start, stop, _ = rows.indices(data.shape[axis])
        bounds = np.cumsum((0,) + data.chunks[axis])
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = max(int(np.searchsorted(bounds, stop, side="left")), first + 1)
        blocks = [range(first, min(last, n)) if d == axis else range(n)
                  for d, n in enumerate(data.numblocks)]
        keys = [(data.name, *index) for index in itertools.product(*blocks)]
        graph = needed_tasks(data.__dask_graph__(), keys)
        out[name].data = da.Array(graph, data.name, data.chunks, meta=data._meta)
    return culled(out.isel({dim: rows}))


def needed_tasks(graph: Mapping, keys: Iterable[Hashable]) -> dict:
    """The tasks of ``graph`` that computing ``keys`` needs: ``keys``' own and, recursively,
    those they depend on; nothing else of the graph is looked at.

    ``dask.optimization.cull`` takes a dict, and ``dict(HighLevelGraph)`` materialises every
    layer (looking up a key whose layer is not named by it scans all layers): a batch of a
    graph of many layers cost the whole graph. In a ``HighLevelGraph`` a task's dependencies
    are looked up in the layer their name says, else in the task's own layer and the layers
    it depends on (the graph's declared dependencies), as dask builds them.

    Examples
    --------
    >>> x = da.arange(8, chunks=2) * 2
    >>> sorted(needed_tasks(x.__dask_graph__(), [(x.name, 1)]), key=str)  # doctest: +ELLIPSIS
    [('arange-...', 1), ('mul-...', 1)]
    """
    from dask.core import keys_in_tasks
    from dask.highlevelgraph import HighLevelGraph

    if not isinstance(graph, HighLevelGraph):
        from dask.optimization import cull

        return cull(graph, list(keys))[0]
    layers, depends = graph.layers, graph.dependencies
    found: dict = {}  # key -> (its layer's name, its task)

    def locate(key, near: str | None) -> bool:
        if key in found:
            return True
        name = key if isinstance(key, str) else key[0] if type(key) is tuple and key else None
        candidates = [name] if isinstance(name, str) and name in layers else []
        if near is not None:
            candidates += [near, *depends.get(near, ())]
        for layer_name in candidates:
            layer = layers[layer_name]
            try:
                found[key] = (layer_name, layer[key])
            except (KeyError, TypeError):  # not in this layer; TypeError: not hashable
                continue
            return True
        return False

    out: dict = {}
    work = [key for key in keys if locate(key, None)]
    while work:
        key = work.pop()
        if key in out:
            continue
        layer_name, task = found[key]
        out[key] = task
        near = _Membership(functools.partial(locate, near=layer_name))
        # keys_in_tasks only asks `key in near`; its annotation asks for a Collection
        dependencies = keys_in_tasks(near, [task], as_list=True)  # type: ignore[arg-type]
        work.extend(dep for dep in dependencies if dep not in out)
    return out


class _Membership:
    """``key in self``: ``contains(key)``, for :func:`dask.core.keys_in_tasks`."""

    __slots__ = ("contains",)

    def __init__(self, contains):
        self.contains = contains

    def __contains__(self, key) -> bool:
        return self.contains(key)


def chunked_view(values: np.ndarray, chunks: int, axis: int = 0) -> da.Array:
    """A Dask array of ``values`` chunked by ``chunks`` along ``axis`` whose blocks are *views*
    of it: ``da.from_array`` (and so ``Dataset.chunk``) copies NumPy input whole first, twice
    the memory of a large in-memory STM. ``values`` must not change while the graph lives.

    Examples
    --------
    >>> x = np.arange(10.0)
    >>> view = chunked_view(x, 4)
    >>> view.chunks, float(view.sum().compute())
    (((4, 4, 2),), 45.0)
    >>> all(np.shares_memory(block, x) for block in dict(view.dask).values())
    True
    """
    from dask.highlevelgraph import HighLevelGraph

    values = np.asarray(values)
    size = values.shape[axis]
    bounds = list(range(0, size, max(int(chunks), 1))) + [size]
    if size == 0:
        bounds = [0, 0]
    name = f"view-{uuid.uuid4().hex}"  # not a hash of the values: that reads them all
    graph: dict[Key, np.ndarray] = {}
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        key = tuple(i if d == axis else 0 for d in range(values.ndim))
        index = tuple(slice(start, stop) if d == axis else slice(None)
                      for d in range(values.ndim))
        graph[(name,) + key] = values[index]
    block_chunks = tuple(tuple(np.diff(bounds).tolist()) if d == axis else (values.shape[d],)
                         for d in range(values.ndim))
    return da.Array(HighLevelGraph.from_collections(name, graph, dependencies=()), name,
                    block_chunks, meta=values[tuple(slice(0, 0) for _ in values.shape)])


def _rows_where(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    return values[keep]


def rows_kept_on_workers(ds: xr.Dataset, keep: Hashable, dim: str = "space"
                         ) -> tuple[xr.Dataset, np.ndarray]:
    """The rows of ``ds`` along ``dim`` where its boolean variable ``keep`` holds, each chunk
    filtered by its own task and left on the workers (persisted): this process receives
    ``keep`` alone (a byte a row), and holds the other in-memory variables' kept rows.

    Every Dask variable along ``dim`` must have ``keep``'s chunks along it (one task computes
    the chunk's values and its mask). Returns the kept rows (without ``keep``; the Dask
    variables on the workers, chunked by what each chunk kept) and their indices into ``ds``.

    Examples
    --------
    >>> ds = xr.Dataset({"a": ("space", da.arange(6, chunks=3)),
    ...                  "ok": ("space", da.from_array(np.arange(6) % 2 == 0, chunks=3))})
    >>> kept, index = rows_kept_on_workers(ds, "ok")
    >>> kept["a"].data.chunks, kept["a"].values.tolist(), index.tolist()
    (((2, 1),), [0, 2, 4], [0, 2, 4])
    """
    mask = ds[keep].data
    lazy = [name for name, var in ds.variables.items()
            if name != keep and isinstance(var.data, da.Array) and dim in var.dims]
    filtered = []
    for name in lazy:
        var = ds[name]
        index = "".join(chr(ord("a") + i) for i in range(var.ndim))
        row = index[var.dims.index(dim)]
        filtered.append(da.blockwise(_rows_where, index, var.data, index, mask, row,
                                     dtype=var.dtype, adjust_chunks={row: lambda n: np.nan}))
    *filtered, mask = dask.persist(*filtered, mask)
    kept = np.asarray(mask.compute(), dtype=bool)
    bounds = np.cumsum((0,) + mask.chunks[0])
    counts = tuple(int(n) for n in np.add.reduceat(kept.astype(np.int64), bounds[:-1])) \
        if kept.size else ()
    rows = np.flatnonzero(kept)
    out = ds.drop_vars([keep, *lazy]).isel({dim: rows}, missing_dims="ignore")
    for name, data in zip(lazy, filtered):
        var = ds[name]
        chunks = tuple(counts if d == dim else c for d, c in zip(var.dims, data.chunks))
        known = da.Array(data.dask, data.name, chunks, meta=data._meta)
        out[name] = xr.Variable(var.dims, known, var.attrs)
    return xr.Dataset({name: out[name].variable for name in ds.data_vars if name != keep},
                      coords={name: out[name].variable for name in ds.coords
                              if name in out.variables}, attrs=ds.attrs), rows
