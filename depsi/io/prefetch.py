"""Background reading: load the next blocks on worker threads while the caller computes.

:func:`prefetched` is the reusable piece (one or more worker threads, a bounded look-ahead, results
in item order, errors re-raised in the consumer, the threads always joined); :func:`iter_blocks`
uses it to walk a raster stack ``(azimuth, range, time)`` block by block, so reading block n+1
overlaps the compute on block n (docs/design.md, "Hardware mapping").
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import count, product
from typing import Any, TypeVar

import dask
import dask.array
import numpy as np
import xarray as xr
from dask.array.core import concatenate3
from tqdm.auto import tqdm

from depsi.io.store import DEFAULT_CHUNK_BYTES

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")

#: Seconds between checks of the stop flag while the worker waits for room in the queue.
_POLL_SECONDS = 0.05

_DONE = object()

#: Bytes of decoded blocks that a reader of a stack's sample (:func:`hand_over`) may keep for the
#: stream pass that reads the stack whole, over all stacks together: the stack's check decodes
#: whole stored chunks that the pass then takes instead of decoding them again.
HANDOVER_BYTES = 4 * DEFAULT_CHUNK_BYTES

#: Handed-over blocks by ``id`` of the Dask array they are of: (a weak reference to it, its
#: blocks by ``(azimuth start, stop, range start, stop)``). An entry goes when its array goes.
_handed: dict[int, tuple[weakref.ref, dict[tuple[int, int, int, int], np.ndarray]]] = {}
_handed_lock = threading.Lock()


class _Failure:
    """An exception raised by the worker, carried to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def bars_wanted(progress: bool) -> bool:
    """Progress bars on a terminal or in a notebook; none when output is redirected (a log
    file would otherwise fill with carriage returns and cursor-up escapes)."""
    if not progress:
        return False
    if _in_notebook():
        return True
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where tqdm.auto draws widgets), not merely when
    ipykernel has been imported somewhere."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001 - any failure means: not in a kernel
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class _Loads:
    """Items loaded ahead of the consumer by worker threads, handed over in item order.

    Workers take items in order from one shared iterator, at most ``ahead`` items taken and not
    yet handed to the consumer (a semaphore), so memory holds at most ``ahead`` results or
    loads in progress. A failure (of ``load`` or of the iterator) is stored at its item's place:
    the consumer gets every earlier item first, then the exception.
    """

    def __init__(self, load: Callable, items: Iterable, ahead: int) -> None:
        self._load = load
        self._source = iter(items)
        self._taking = threading.Lock()
        self._room = threading.Semaphore(ahead)
        self._ready = threading.Condition()
        self._results: dict[int, Any] = {}
        self._taken = 0
        self._end: int | None = None
        self.stop = threading.Event()

    def _take(self) -> tuple[int, Any] | None:
        """The next item and its index; None when there is none (or after a failure)."""
        with self._taking:
            if self._end is not None:
                return None
            index = self._taken
            try:
                item = next(self._source)
            except StopIteration:
                self._finish(index, None)
                return None
            except BaseException as error:  # handed to the consumer, which re-raises it
                self._finish(index + 1, _Failure(error), index)
                return None
            self._taken += 1
            return index, item

    def _finish(self, end: int, failure: _Failure | None, index: int | None = None) -> None:
        with self._ready:
            self._end = end
            if failure is not None and index is not None:
                self._results[index] = failure
            self._ready.notify_all()

    def work(self) -> None:
        while not self.stop.is_set():
            if not self._room.acquire(timeout=_POLL_SECONDS):
                continue
            taken = self._take()
            if taken is None:
                self._room.release()
                return
            index, item = taken
            value: tuple[Any, Any] | _Failure
            try:
                value = (item, self._load(item))
            except BaseException as error:  # handed to the consumer, which re-raises it
                value = _Failure(error)
                with self._taking:  # no later item is taken after a failure
                    self._end = index + 1 if self._end is None else min(self._end, index + 1)
            with self._ready:
                self._results[index] = value
                self._ready.notify_all()

    def get(self, index: int, workers: list[threading.Thread]) -> Any:
        """The result of item ``index`` (waiting for it), or ``_DONE`` past the last item."""
        with self._ready:
            while index not in self._results:
                if self._end is not None and index >= self._end:
                    return _DONE
                if not any(worker.is_alive() for worker in workers):
                    raise RuntimeError("prefetch workers stopped without a result")
                self._ready.wait(_POLL_SECONDS)
            value = self._results.pop(index)
        self._room.release()
        return value


def prefetched(
    load: Callable[[Item], Result],
    items: Iterable[Item],
    *,
    prefetch: int = 2,
    workers: int = 1,
    progress: bool = False,
    total: int | None = None,
    desc: str | None = None,
) -> Iterator[tuple[Item, Result]]:
    """Yield ``(item, load(item))`` in item order, loads done ahead on worker threads.

    At most ``prefetch + workers`` items are loaded or being loaded ahead of the consumer:
    ``workers`` loads run at once and up to ``prefetch`` finished results wait. The workers
    start at the first ``next()``. When the consumer finishes, breaks off (the generator is
    closed), or raises (``KeyboardInterrupt`` included), the workers are told to stop and
    joined: none outlives the loop (each finishes the load in progress first). An exception
    raised by ``load`` is re-raised in the consumer, after every earlier item.

    Parameters
    ----------
    load
        Called on a worker thread for each item; should release the GIL for real overlap
        (file reads, decompression and NumPy do).
    items
        The work items, consumed (in order) on the worker threads.
    prefetch
        Maximum number of loaded results waiting for the consumer (>= 1).
    workers
        Number of worker threads loading at once (>= 1); with several, ``load`` must be
        thread-safe.
    progress
        Show a tqdm progress bar (one step per item).
    total, desc
        Length and label of the progress bar.

    Examples
    --------
    >>> [result for _, result in prefetched(lambda x: x * x, range(4))]
    [0, 1, 4, 9]
    >>> [result for _, result in prefetched(lambda x: x * x, range(4), workers=3)]
    [0, 1, 4, 9]
    """
    if int(prefetch) < 1:
        raise ValueError(f"prefetch: expected a queue size >= 1, found {prefetch!r}")
    if int(workers) < 1:
        raise ValueError(f"workers: expected a number of threads >= 1, found {workers!r}")
    loads = _Loads(load, items, int(prefetch) + int(workers))
    threads = [threading.Thread(target=loads.work, name="depsi-prefetch", daemon=True)
               for _ in range(int(workers))]
    bar = tqdm(total=total, desc=desc, unit="block", disable=not progress)
    for thread in threads:
        thread.start()
    try:
        for index in count():
            value = loads.get(index, threads)
            if value is _DONE:
                return
            if isinstance(value, _Failure):
                raise value.error
            bar.update(1)
            yield value
    finally:
        loads.stop.set()
        for thread in threads:
            thread.join()
        bar.close()


def _block_key(slices: tuple[slice, slice]) -> tuple[int, int, int, int]:
    azimuth, range_ = slices
    return int(azimuth.start), int(azimuth.stop), int(range_.start), int(range_.stop)


def _handed_blocks(data: Any) -> dict[tuple[int, int, int, int], np.ndarray] | None:
    """The blocks handed over for ``data`` (the caller holds ``_handed_lock``)."""
    entry = _handed.get(id(data))
    if entry is None or entry[0]() is not data:
        return None
    return entry[1]


def _forget(key: int) -> None:
    """Called when an array with blocks handed over goes: its entry goes too. Without the
    lock (a garbage collection may run this on a thread that holds it); the readers of
    ``_handed`` iterate over snapshots of it."""
    _handed.pop(key, None)


def _held() -> int:
    """Bytes of the blocks kept now."""
    return sum(block.nbytes for _, blocks in tuple(_handed.values())
               for block in tuple(blocks.values()))


def handover_room() -> int:
    """Bytes that :func:`hand_over` may still keep (:data:`HANDOVER_BYTES` less those kept)."""
    with _handed_lock:
        return HANDOVER_BYTES - _held()


def hand_over(data: dask.array.Array, slices: tuple[slice, slice], values: np.ndarray) -> bool:
    """Keep ``values``, the decoded block ``slices`` (azimuth, range; every other axis whole)
    of the Dask array ``data``, for the next read of that block by :func:`iter_processed_blocks`
    (where it reads the store directly, :func:`stored_source`), which takes it instead of
    decoding the block again.

    A check that reads a sample of a stack before a pass reads it whole (the stack check,
    :func:`depsi.io.validate.validate_stack`) hands its decoded blocks over, so that the pass
    decodes every block once. The block is taken by its first read (and then belongs to the
    reader); the blocks of ``data`` that no read took go when ``data`` goes, or when a pass
    over it ends (:func:`drop_handed_over`). Nothing is kept (False back) when it would take
    the blocks kept over :data:`HANDOVER_BYTES`, or when ``values`` is not the block's shape.
    """
    if not isinstance(data, dask.array.Array):
        return False
    shape = (slices[0].stop - slices[0].start, slices[1].stop - slices[1].start,
             *data.shape[2:])
    if values.shape != shape or values.dtype != data.dtype:
        return False
    key = id(data)
    with _handed_lock:
        if _held() + values.nbytes > HANDOVER_BYTES:
            return False
        blocks = _handed_blocks(data)
        if blocks is None:
            blocks = {}
            _handed[key] = (weakref.ref(data), blocks)
            weakref.finalize(data, _forget, key)
        blocks[_block_key(slices)] = values
    return True


def take_handed_over(data: Any, slices: tuple[slice, slice]) -> np.ndarray | None:
    """The block ``slices`` of ``data`` handed over by :func:`hand_over`, now the caller's (no
    later read gets it), or None."""
    with _handed_lock:
        blocks = _handed_blocks(data)
        return None if blocks is None else blocks.pop(_block_key(slices), None)


def handed_over_pixel(data: Any, azimuth: int, range_: int) -> np.ndarray | None:
    """A copy of the values at pixel ``(azimuth, range_)`` of ``data`` (every other axis
    whole) from a block handed over by :func:`hand_over` that holds it (the block stays), or
    None."""
    with _handed_lock:
        for (a0, a1, r0, r1), block in tuple((_handed_blocks(data) or {}).items()):
            if a0 <= azimuth < a1 and r0 <= range_ < r1:
                return block[azimuth - a0, range_ - r0].copy()
    return None


def drop_handed_over(data: Any) -> None:
    """Forget the blocks of ``data`` that no read took (a pass over it has read them all)."""
    with _handed_lock:
        if _handed_blocks(data) is not None:
            _handed.pop(id(data), None)


def _block_edges(size: int, step: int | None, chunks: tuple[int, ...] | None) -> list[slice]:
    if step is None and chunks is not None:
        edges = np.concatenate([[0], np.cumsum(chunks)])
    else:
        edges = np.append(np.arange(0, size, step), size)
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def default_block_shape(stack: xr.Dataset, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                        variables: Sequence[str] | None = None) -> tuple[int, int]:
    """A square ``(azimuth, range)`` block whose variables take about ``chunk_bytes``.

    Examples
    --------
    >>> ds = xr.Dataset({"complex": (("azimuth", "range", "time"), np.zeros((64, 64, 8), "c8"))})
    >>> default_block_shape(ds, chunk_bytes=8 * 8 * 16 * 16)
    (16, 16)
    """
    names = list(variables) if variables is not None else _raster_variables(stack)
    pixel_bytes = 0
    for name in names:
        var = stack[name]
        others = [stack.sizes[d] for d in var.dims if d not in ("azimuth", "range")]
        pixel_bytes += var.dtype.itemsize * int(np.prod(others, dtype=np.int64))
    side = max(1, int(np.sqrt(chunk_bytes / max(pixel_bytes, 1))))
    return min(side, stack.sizes["azimuth"]), min(side, stack.sizes["range"])


def _raster_variables(stack: xr.Dataset) -> list[str]:
    return [str(name) for name, var in stack.variables.items()
            if "azimuth" in var.dims and "range" in var.dims]


def block_slices(
    stack: xr.Dataset,
    block_shape: tuple[int, int] | None = None,
    *,
    variables: Sequence[str] | None = None,
) -> list[tuple[slice, slice]]:
    """The ``(azimuth, range)`` slices of the blocks :func:`iter_blocks` visits, in order.

    Without ``block_shape`` the blocks follow the Dask chunks of the stack (so each stored chunk
    is read exactly once), or, for an unchunked stack, squares of about
    :data:`~depsi.io.store.DEFAULT_CHUNK_BYTES`.
    """
    for dim in ("azimuth", "range"):
        if dim not in stack.dims:
            raise ValueError(f"stack: expected dims including ('azimuth', 'range'), "
                             f"found {tuple(stack.dims)}")
    if block_shape is not None:
        sizes = tuple(int(b) for b in block_shape)
        if len(sizes) != 2 or min(sizes) < 1:
            raise ValueError(f"block_shape: expected two positive sizes (azimuth, range), "
                             f"found {block_shape!r}")
        shape: tuple[int | None, ...] = sizes
        az_chunks = rg_chunks = None
    else:
        chunks = stack[variables[0]].chunksizes if variables else stack.chunksizes
        az_chunks, rg_chunks = chunks.get("azimuth"), chunks.get("range")
        shape = (None, None)
        if az_chunks is None or rg_chunks is None:
            shape = default_block_shape(stack, variables=variables)
    azimuth = _block_edges(stack.sizes["azimuth"], shape[0], az_chunks)
    range_ = _block_edges(stack.sizes["range"], shape[1], rg_chunks)
    return list(product(azimuth, range_))


def _lead_variables(stack: xr.Dataset, variables: Sequence[str],
                    time_last: bool = False) -> dict[str, xr.Variable]:
    """The variables as xarray Variables with dims ``(azimuth, range, ...)`` (``time`` last)."""
    out = {}
    for name in variables:
        var = stack[name].variable
        order = ("azimuth", "range", ..., "time") if time_last and "time" in var.dims else (
            "azimuth", "range", ...)
        out[name] = var.transpose(*order)
    return out


def _joined(parts: Sequence, grid: tuple[int, ...]) -> np.ndarray:
    if len(parts) == 1:
        return np.asarray(parts[0])
    nested = np.empty(len(parts), dtype=object)
    for index, chunk in enumerate(parts):  # element-wise: never broadcast arrays
        nested[index] = chunk
    return concatenate3(nested.reshape(grid).tolist())


def stored_source(data: Any) -> Any | None:
    """The lazily indexed store array behind a Dask array that does nothing but read it chunk
    by chunk, or None.

    A variable opened with chunks (``xr.open_zarr``, ``xr.open_dataset(chunks=...)``) is a
    Dask array of one ``getter`` task per chunk over one ``original-`` array, xarray's lazy
    view of the store. A block of it read through that view is the same values, without
    building, optimising and scheduling a graph per block (about 5 ms of Python a block, 15 %
    of a selection's time on top of decoding its bytes: docs/benchmarks.md, "Selection").
    Any other graph (a transpose, a window, arithmetic, a lock) gives None: read through Dask.
    """
    if not isinstance(data, dask.array.Array):
        return None
    try:
        layers = data.__dask_graph__().layers  # type: ignore[attr-defined]  # a HighLevelGraph
        if len(layers) != 2:
            return None
        (original,) = (name for name in layers if str(name).startswith("original-"))
        (source,) = layers[original].values()
        task = layers[data.name][(data.name, *(0,) * data.ndim)]
        if (task.func is not dask.array.core.getter or task.kwargs
                or len(task.args) != 2 or getattr(task.args[0], "key", None) != original):
            return None
    except (AttributeError, KeyError, TypeError, ValueError):  # not a plain read's graph
        return None
    if getattr(source, "shape", None) != data.shape or not hasattr(source, "__getitem__"):
        return None
    return source


def _read_stored(source: Any, chunks: tuple[tuple[int, ...], ...], slices: tuple[slice, slice],
                 split: bool, decoded: np.ndarray | None = None) -> Any:
    """A block of a :func:`stored_source` (``split``: one array per chunk along the last
    axis, as :func:`_read` gives a split Dask variable); ``decoded``: the block already decoded
    (:func:`take_handed_over`), cut as it would have been read."""
    edges = np.cumsum((0, *chunks[-1]))
    if decoded is not None:
        if not split or len(edges) == 2:
            return [decoded] if split else decoded
        # contiguous pieces, as a read gives them (a compiled kernel is typed on the layout)
        return [np.ascontiguousarray(decoded[..., int(a):int(b)])
                for a, b in zip(edges[:-1], edges[1:])]
    if not split:
        return np.asarray(source[slices])
    return [np.asarray(source[(*slices, *(slice(None),) * (len(chunks) - 3),
                               slice(int(a), int(b)))])
            for a, b in zip(edges[:-1], edges[1:])]


def _read(variables: dict[str, xr.Variable], slices: tuple[slice, slice],
          split: Sequence[str] = (), sources: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read a block of each variable; Dask chunks are computed without a final copy.

    ``dask.compute`` copies a single-chunk result when finalising it; computing the chunks as
    delayed pieces and joining them here avoids that extra pass over every block. A variable
    in ``split`` (time last) is read as a list of arrays, one per Dask chunk along ``time``,
    never joined along time. A variable with a store array in ``sources``
    (:func:`stored_source`) is read from it directly.
    """
    pieces: list[Any] = []
    shapes: dict[str, tuple[int, tuple[int, ...]]] = {}
    block: dict[str, Any] = {}
    for name, var in variables.items():
        source = (sources or {}).get(name)
        if source is not None and var.chunks is not None:
            block[name] = _read_stored(source, var.chunks, slices, name in split,
                                       take_handed_over(var.data, slices))
            continue
        part = var[slices]
        if isinstance(part.data, dask.array.Array):
            chunks = part.data.to_delayed()
            shapes[name] = (len(pieces), chunks.shape)
            pieces.extend(chunks.ravel().tolist())
        else:
            values = np.asarray(part.values)
            block[name] = [values] if name in split else values
    if pieces:
        loaded = dask.compute(*pieces, scheduler="sync")
        for name, (start, grid) in shapes.items():
            parts = loaded[start:start + int(np.prod(grid))]
            if name not in split:
                block[name] = _joined(parts, grid)
                continue
            along_time = [parts[k::grid[-1]] for k in range(grid[-1])]
            block[name] = [_joined(chunks, (*grid[:-1], 1)) for chunks in along_time]
    return {name: block[name] for name in variables}


def load_block(stack: xr.Dataset, slices: tuple[slice, slice],
               variables: Sequence[str]) -> dict[str, np.ndarray]:
    """Read one block of ``variables`` into NumPy, each with dims ``(azimuth, range, ...)``.

    Dask-backed variables are computed together on the calling thread (synchronous scheduler,
    so a prefetch thread does not start a thread pool of its own).

    Examples
    --------
    >>> ds = xr.Dataset({"h2ph": (("time", "range", "azimuth"), np.zeros((3, 5, 4), "f4"))})
    >>> load_block(ds, (slice(0, 2), slice(1, 5)), ["h2ph"])["h2ph"].shape
    (2, 4, 3)
    """
    return _read(_lead_variables(stack, variables), slices)


def _checked_variables(stack: xr.Dataset, variables: Sequence[str] | None) -> list[str]:
    names = list(variables) if variables is not None else _raster_variables(stack)
    missing = [name for name in names if name not in stack.variables]
    if missing:
        raise KeyError(f"variables {missing}: expected in the stack, found "
                       f"{sorted(map(str, stack.variables))}")
    flat = [name for name in names if not {"azimuth", "range"} <= set(stack[name].dims)]
    if flat:
        raise ValueError(f"variables {flat}: expected dims including ('azimuth', 'range'), "
                         f"found {[stack[name].dims for name in flat]}")
    return names


def iter_processed_blocks(
    stack: xr.Dataset,
    process: Callable[[tuple[slice, slice], dict[str, np.ndarray]], Result],
    block_shape: tuple[int, int] | None = None,
    *,
    prefetch: int = 2,
    workers: int = 1,
    variables: Sequence[str] | None = None,
    split_time: bool = False,
    handed_over_first: bool = False,
    progress: bool = False,
    desc: str = "reading blocks",
) -> Iterator[tuple[tuple[slice, slice], Result]]:
    """Read each block and apply ``process`` to it on ``workers`` threads; results in order.

    Each worker reads a block (decompression releases the GIL) and processes it at once, so
    with several workers the reading of some blocks overlaps the processing of others and only
    the (usually small) results wait for the caller: memory holds about ``workers`` blocks and
    ``prefetch`` results.

    Parameters
    ----------
    stack, block_shape, variables, progress, desc
        As in :func:`iter_blocks`.
    process
        ``process(slices, block)`` with the block as :func:`iter_blocks` yields it; called on
        the worker threads, so it must be thread-safe.
    prefetch
        Results of ``process`` waiting for the caller (>= 1).
    workers
        Blocks read and processed at once (threads, >= 1).
    split_time
        Give every variable with a ``time`` dim to ``process`` as a list of arrays (``time``
        last), one per Dask chunk along ``time``: a stack opened with its stored time chunks
        (``xr.open_zarr``) is then read chunk by chunk, each stored chunk decoded once into its
        own piece, and never joined along time in memory. A Dask chunk is never cut (a graph
        that derives the values, a dtype conversion say, would be computed once per cut). A
        variable in memory comes as a list of one array.
    handed_over_first
        Visit the blocks handed over by a check that decoded them (:func:`hand_over`) first,
        the others in order after them: the handed-over blocks are let go at the pass's start
        instead of waiting in memory for their turn (for a caller that does not depend on the
        order of the blocks).

    Yields
    ------
    slices, result
        The block's ``(azimuth_slice, range_slice)`` and ``process(slices, block)``.

    Examples
    --------
    >>> ds = xr.Dataset({"complex": (("azimuth", "range", "time"), np.ones((4, 6, 3), "c8"))})
    >>> total = lambda slices, block: float(abs(block["complex"]).sum())
    >>> [result for _, result in iter_processed_blocks(ds, total, (4, 3), workers=2)]
    [36.0, 36.0]
    """
    names = _checked_variables(stack, variables)
    slices = block_slices(stack, block_shape, variables=names)
    logger.debug("iterating %d blocks of %s on %d thread(s)", len(slices), names, workers)
    lead = _lead_variables(stack, names, time_last=split_time)
    if handed_over_first:
        with _handed_lock:
            handed = {key for var in lead.values()
                      for key in tuple(_handed_blocks(var.data) or ())}
        slices = sorted(slices, key=lambda s: _block_key(s) not in handed)  # stable
    split = [name for name, var in lead.items() if split_time and "time" in var.dims]
    sources = {name: source for name, var in lead.items()
               if (source := stored_source(var.data)) is not None}
    try:
        yield from prefetched(lambda s: process(s, _read(lead, s, split, sources)), slices,
                              prefetch=prefetch, workers=workers, progress=progress,
                              total=len(slices), desc=desc)
    finally:  # handed-over blocks this pass did not take (blocks of another shape) go now
        for var in lead.values():
            drop_handed_over(var.data)


def iter_blocks(
    stack: xr.Dataset,
    block_shape: tuple[int, int] | None = None,
    *,
    prefetch: int = 2,
    workers: int = 1,
    variables: Sequence[str] | None = None,
    progress: bool = False,
    desc: str = "reading blocks",
) -> Iterator[tuple[tuple[slice, slice], dict[str, np.ndarray]]]:
    """Walk a raster stack block by block, reading the next blocks in the background.

    Parameters
    ----------
    stack
        Raster stack with dims ``(azimuth, range[, time])``, lazy (Dask/Zarr) or in memory.
    block_shape
        ``(n_azimuth, n_range)`` of a block; default the stack's own chunks (see
        :func:`block_slices`). Blocks span the whole of every other dim (all of ``time``).
    prefetch
        Number of blocks read ahead (queue size); memory holds about
        ``prefetch + workers + 1`` blocks.
    workers
        Blocks read at once (threads).
    variables
        Data variables or coordinates to load; default all with both ``azimuth`` and ``range``
        dims (``complex``, ``h2ph``, ``lat``, ``lon``, ...).
    progress
        Show a tqdm progress bar over the blocks.
    desc
        Label of the progress bar.

    Yields
    ------
    slices, block
        ``(azimuth_slice, range_slice)`` positions of the block in the stack, and a dict of the
        loaded NumPy arrays, each with dims ``(azimuth, range, ...)``.

    Examples
    --------
    >>> ds = xr.Dataset({"complex": (("azimuth", "range", "time"), np.ones((4, 6, 3), "c8"))})
    >>> [(s, b["complex"].shape) for s, b in iter_blocks(ds, (4, 3))]  # doctest: +ELLIPSIS
    [((slice(0, 4, None), slice(0, 3, None)), (4, 3, 3)), ((slice(0, 4, None), ...), (4, 3, 3))]
    """
    yield from iter_processed_blocks(stack, lambda slices, block: block, block_shape,
                                     prefetch=prefetch, workers=workers, variables=variables,
                                     progress=progress, desc=desc)
