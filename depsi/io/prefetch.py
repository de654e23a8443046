"""Background reading: load the next block on one worker thread while the caller computes.

:func:`prefetched` is the reusable piece (one worker thread, a bounded queue, errors re-raised in
the consumer, the thread always joined); :func:`iter_blocks` uses it to walk a raster stack
``(azimuth, range, time)`` block by block, so reading block n+1 overlaps the compute on block n
(DESIGN.md §5, "IO overlaps compute").
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import product
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


def _put(out: queue.Queue, value: Any, stop: threading.Event) -> bool:
    """Put ``value`` unless asked to stop first; whether it was put."""
    while not stop.is_set():
        try:
            out.put(value, timeout=_POLL_SECONDS)
            return True
        except queue.Full:
            continue
    return False


def _work(load: Callable, items: Iterable, out: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in items:
            if stop.is_set():
                return
            if not _put(out, (item, load(item)), stop):
                return
    except BaseException as error:  # handed to the consumer, which re-raises it
        _put(out, _Failure(error), stop)
        return
    _put(out, _DONE, stop)


def _drain(out: queue.Queue) -> None:
    while True:
        try:
            out.get_nowait()
        except queue.Empty:
            return


def prefetched(
    load: Callable[[Item], Result],
    items: Iterable[Item],
    *,
    prefetch: int = 2,
    progress: bool = False,
    total: int | None = None,
    desc: str | None = None,
) -> Iterator[tuple[Item, Result]]:
    """Yield ``(item, load(item))`` with up to ``prefetch`` loads done ahead on a worker thread.

    The worker starts at the first ``next()``. When the consumer finishes, breaks off (the
    generator is closed), or raises (``KeyboardInterrupt`` included), the worker is told to stop,
    the queue is emptied and the thread is joined: it never outlives the loop (it finishes the
    load in progress first). An exception raised by ``load`` is re-raised in the consumer.

    Parameters
    ----------
    load
        Called on the worker thread for each item; should release the GIL for real overlap
        (file reads, decompression and NumPy do).
    items
        The work items, consumed on the worker thread.
    prefetch
        Maximum number of loaded results waiting in the queue (>= 1).
    progress
        Show a tqdm progress bar (one step per item).
    total, desc
        Length and label of the progress bar.

    Examples
    --------
    >>> [result for _, result in prefetched(lambda x: x * x, range(4))]
    [0, 1, 4, 9]
    """
    if int(prefetch) < 1:
        raise ValueError(f"prefetch: expected a queue size >= 1, found {prefetch!r}")
    out: queue.Queue = queue.Queue(maxsize=int(prefetch))
    stop = threading.Event()
    worker = threading.Thread(target=_work, args=(load, items, out, stop),
                              name="depsi-prefetch", daemon=True)
    bar = tqdm(total=total, desc=desc, unit="block", disable=not progress)
    worker.start()
    try:
        while True:
            try:
                value = out.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if not worker.is_alive() and out.empty():
                    raise RuntimeError("prefetch worker stopped without a result") from None
                continue
            if value is _DONE:
                return
            if isinstance(value, _Failure):
                raise value.error
            bar.update(1)
            yield value
    finally:
        stop.set()
        _drain(out)
        worker.join()
        bar.close()


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
        shape = tuple(int(b) for b in block_shape)
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"block_shape: expected two positive sizes (azimuth, range), "
                             f"found {block_shape!r}")
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


def _lead_variables(stack: xr.Dataset, variables: Sequence[str]) -> dict[str, xr.Variable]:
    """The variables as xarray Variables with dims ``(azimuth, range, ...)``."""
    out = {}
    for name in variables:
        var = stack[name].variable
        out[name] = var.transpose("azimuth", "range", ...)
    return out


def _read(variables: dict[str, xr.Variable], slices: tuple[slice, slice]) -> dict[str, np.ndarray]:
    """Read a block of each variable; Dask chunks are computed without a final copy.

    ``dask.compute`` copies a single-chunk result when finalising it; computing the chunks as
    delayed pieces and joining them here avoids that extra pass over every block.
    """
    pieces, shapes, block = [], {}, {}
    for name, var in variables.items():
        part = var[slices]
        if isinstance(part.data, dask.array.Array):
            chunks = part.data.to_delayed()
            shapes[name] = (len(pieces), chunks.shape)
            pieces.extend(chunks.ravel().tolist())
        else:
            block[name] = np.asarray(part.values)
    if pieces:
        loaded = dask.compute(*pieces, scheduler="sync")
        for name, (start, grid) in shapes.items():
            parts = loaded[start:start + int(np.prod(grid))]
            if len(parts) == 1:
                block[name] = np.asarray(parts[0])
            else:
                nested = np.empty(len(parts), dtype=object)
                for index, chunk in enumerate(parts):  # element-wise: never broadcast arrays
                    nested[index] = chunk
                block[name] = concatenate3(nested.reshape(grid).tolist())
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


def iter_blocks(
    stack: xr.Dataset,
    block_shape: tuple[int, int] | None = None,
    *,
    prefetch: int = 2,
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
        Number of blocks read ahead (queue size); memory holds about ``prefetch + 2`` blocks.
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
    names = list(variables) if variables is not None else _raster_variables(stack)
    missing = [name for name in names if name not in stack.variables]
    if missing:
        raise KeyError(f"variables {missing}: expected in the stack, found "
                       f"{sorted(map(str, stack.variables))}")
    flat = [name for name in names if not {"azimuth", "range"} <= set(stack[name].dims)]
    if flat:
        raise ValueError(f"variables {flat}: expected dims including ('azimuth', 'range'), "
                         f"found {[stack[name].dims for name in flat]}")
    slices = block_slices(stack, block_shape, variables=names)
    logger.debug("iterating %d blocks of %s", len(slices), names)
    lead = _lead_variables(stack, names)
    yield from prefetched(lambda s: _read(lead, s), slices, prefetch=prefetch,
                          progress=progress, total=len(slices), desc=desc)
