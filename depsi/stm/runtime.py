"""The runtime of the chain's process and its Dask workers: running a step's own work on this
process's threads (whether Dask's threaded scheduler is the one at work, a bounded, ordered map
over a thread pool), the allocator's hold on freed memory and NumPy's huge-page advice, arrays
that wait in temporary files (spilled, or in a file's pages that can be paged out), and what a
worker's memory limit allows (the kernels' batches, Numba or not).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from depsi.kernels.backend import register_host_memory_cap

if TYPE_CHECKING:
    import mmap

Item = TypeVar("Item")
Result = TypeVar("Result")


def runs_on_threads(collection: Any) -> bool:
    """Whether ``collection`` would be computed by Dask's threaded scheduler (this process's
    threads), as configured where this is called."""
    import dask.threaded
    from dask.base import get_scheduler

    return get_scheduler(collections=[collection]) is dask.threaded.get


def in_order_on_threads(work: Callable[[Item], Result], items: Sequence[Item], *,
                        threads: int) -> Iterator[Result]:
    """``work(item)`` for each of ``items`` on a pool of ``threads`` threads, the results
    yielded in the items' order, each once it is done; at most two items a thread are
    submitted ahead of the one yielded, so no barrier holds the threads idle behind a slow
    item and the memory held follows the threads, not the items.

    Examples
    --------
    >>> list(in_order_on_threads(lambda n: n * n, range(5), threads=2))
    [0, 1, 4, 9, 16]
    """
    from concurrent.futures import ThreadPoolExecutor

    threads = max(1, threads)
    ahead = 2 * threads
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending = [pool.submit(work, item) for item in items[:ahead]]
        for index in range(len(items)):
            done = pending.pop(0).result()
            if index + ahead < len(items):
                pending.append(pool.submit(work, items[index + ahead]))
            yield done


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, Windows, musl)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: Arrays from this size get pages of their own, handed back when freed (:func:`bound_allocator`).
MMAP_THRESHOLD = 16 << 20
#: The same bound while the chain's own work runs in this process (:func:`tune_memory`): its
#: steps' block-sized temporaries (16-128 MiB) come from heaps that stay with the process
#: between blocks instead of fresh pages every time (docs/benchmarks.md, "The driver's
#: allocator, pages and temporary files").
WORKING_MMAP_THRESHOLD = 128 << 20
#: glibc tuning a user may have set for the process; :func:`bound_allocator` then leaves it.
_USER_TUNING = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


@functools.cache
def bound_allocator() -> bool:
    """Bound what glibc keeps of freed memory in this process, once: at most one heap arena a
    core (glibc's default is eight, each keeping what its threads freed) and arrays from
    :data:`MMAP_THRESHOLD` (16 MiB) always mapped on their own (by default, once such an array
    is freed, glibc serves arrays up to 32 MB from heaps that stay resident). True when set;
    False in a Dask worker (distributed tunes its own workers), where the user set glibc's
    tuning (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES``), or where the
    C library has no ``mallopt``. Measured on the chain's driver: docs/benchmarks.md,
    "The driver's allocator, pages and temporary files".
    """
    mallopt = _mallopt()
    if (_this_worker() is not None or any(name in os.environ for name in _USER_TUNING)
            or mallopt is None):
        return False
    arenas = max(1, os.cpu_count() or 1)
    return mallopt(_M_ARENA_MAX, arenas) == 1 and _mmap_threshold(MMAP_THRESHOLD)


@functools.cache
def _mallopt():
    """glibc's ``mallopt``, or None where the C library has none."""
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def _mmap_threshold(nbytes: int) -> bool:
    """glibc's mmap and trim thresholds at ``nbytes`` (True when set): arrays from that size
    get pages of their own, and the heap keeps at most that much free at its top."""
    mallopt = _mallopt()
    return mallopt is not None and all(mallopt(parameter, nbytes) == 1
                                       for parameter in (_M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD))


#: NumPy's switch for its huge-page advice (read at import; a user's setting is left).
HUGEPAGE_VARIABLE = "NUMPY_MADVISE_HUGEPAGE"


@functools.cache
def no_hugepage_advice() -> bool:
    """Stop NumPy advising the kernel to back new arrays of 4 MiB and more with transparent
    huge pages (``madvise(MADV_HUGEPAGE)``), once in this process. True when switched off;
    False where the user set :data:`HUGEPAGE_VARIABLE` (their choice stands) or this NumPy has
    no such switch.

    With the kernel's ``transparent_hugepage`` at ``madvise`` (Debian's and many clusters' default),
    every advised array is faulted in 2 MiB at a time from free blocks of that size, compacted or,
    on a virtual machine that reports free pages to its host, backed anew by the host. The chain's
    steps free and allocate block-sized arrays of 16-64 MiB all the time (docs/benchmarks.md, "The
    driver's allocator, pages and temporary files"). Arrays allocated before the call keep the
    advice they had. Dask workers are processes of their own: :mod:`depsi.cluster` starts a
    LocalCluster's with the variable set to ``0``.
    """
    if HUGEPAGE_VARIABLE in os.environ:
        return False
    import importlib

    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            setter = getattr(importlib.import_module(name), "_set_madvise_hugepage", None)
        except ImportError:
            continue
        if setter is not None:
            setter(False)
            return True
    return False


def workers_client():
    """The ``distributed.Client`` the current Dask scheduler submits to, or None (threads,
    synchronous, a process pool): where a step's product can stay on the workers, chunk by
    chunk, instead of coming whole into this process (docs/hpc.md, "The driver: what stays in
    the client process").

    Examples
    --------
    >>> workers_client() is None  # the threaded scheduler
    True
    """
    from dask.base import get_scheduler

    owner = getattr(get_scheduler(), "__self__", None)
    try:
        from distributed import Client
    except ImportError:
        return None
    return owner if isinstance(owner, Client) else None


def tune_memory() -> int | None:
    """The chain process's memory settings before a scheduler's threads start:
    :func:`bound_allocator` and :func:`no_hugepage_advice` once (each leaves what the user
    set), then the allocator's mmap threshold for the scheduler configured where this is
    called: :data:`MMAP_THRESHOLD` under a ``distributed`` client (the driver holds results
    between its workers' tasks, and its peak is what a small node allows), else
    :data:`WORKING_MMAP_THRESHOLD` (the steps' blocks run on this process's threads, and every
    block's temporaries faulted in anew cost 15-20 % of the chain's CPU time at 10^6). Returns
    the threshold set, None where the allocator is not ours to tune (a user's tuning, a Dask
    worker, no glibc).

    Examples
    --------
    >>> tune_memory() in (WORKING_MMAP_THRESHOLD, None)  # the threaded scheduler
    True
    """
    bounded = bound_allocator()
    no_hugepage_advice()
    if not bounded:
        return None
    threshold = MMAP_THRESHOLD if workers_client() is not None else WORKING_MMAP_THRESHOLD
    return threshold if _mmap_threshold(threshold) else None


def release_memory() -> bool:
    """Hand the heap's free pages back to the operating system (glibc's ``malloc_trim(0)``);
    False where the C library cannot (nothing is done there). The first call also bounds what
    the allocator keeps from then on (:func:`bound_allocator`).

    Once a large array (up to 32 MB) has been freed, glibc serves arrays below that size from
    its heap, and a heap freed around live allocations stays with the process (a chain's
    block-sized temporaries, between its steps). The chain calls this between steps.

    Examples
    --------
    >>> isinstance(release_memory(), bool)
    True
    """
    bound_allocator()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class SpilledArrays:
    """Arrays moved out of this process's memory into one unnamed temporary file (in
    ``directory``, default the system's: ``$TMPDIR``), read back by rows or whole; the file
    goes when this object is closed or collected. The driver's arrays that a long step does
    not read until its end (the arcs' right-hand sides through the whole network's solve,
    the screen through the second network pass) wait here instead of in its memory. Raises
    :class:`OSError` where the file cannot be written (nothing is moved then).

    Examples
    --------
    >>> spilled = SpilledArrays({"a": np.arange(12.0).reshape(4, 3)})
    >>> spilled.rows("a", 1, 3).tolist()
    [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]
    >>> spilled.load("a").shape, spilled.nbytes
    ((4, 3), 96)
    """

    #: Bytes written at a time (no copy of a whole array).
    WRITE_BYTES = 64 * 2**20

    def __init__(self, arrays: Mapping[str, np.ndarray], directory: str | None = None):
        import tempfile

        self._file = tempfile.TemporaryFile(prefix="depsi-spill-", dir=directory)
        self._layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        offset = 0
        try:
            for name, array in arrays.items():
                array = np.asarray(array)
                row_bytes = max(1, array.nbytes // max(len(array), 1))
                step = max(1, self.WRITE_BYTES // row_bytes)
                for first in range(0, len(array), step):
                    self._file.write(np.ascontiguousarray(array[first:first + step]).tobytes())
                self._layout[name] = (offset, array.dtype, array.shape)
                offset += array.nbytes
            self._file.flush()
        except BaseException:
            self._file.close()
            raise
        #: bytes in the file
        self.nbytes = offset

    def __contains__(self, name: str) -> bool:
        return name in self._layout

    def rows(self, name: str, low: int, high: int, *, out: np.ndarray | None = None
             ) -> np.ndarray:
        """Rows ``low:high`` of the array ``name`` (a new array, or read into ``out``, a
        C-contiguous array of their shape and dtype; thread-safe: positioned reads)."""
        offset, dtype, shape = self._layout[name]
        if out is None:
            out = np.empty((high - low,) + shape[1:], dtype)
        elif out.shape != (high - low,) + shape[1:] or out.dtype != dtype or (
                not out.flags.c_contiguous):
            raise ValueError(f"out: expected a C-contiguous {dtype} array of shape "
                             f"{(high - low,) + shape[1:]}, found {out.dtype} {out.shape}")
        view = out.data.cast("B")  # the array's own buffer, as memoryview(out)
        start = offset + low * int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        done = 0
        while done < len(view):  # (a read may return fewer bytes than asked)
            count = os.preadv(self._file.fileno(), [view[done:]], start + done)
            if count <= 0:
                raise OSError(f"{name}: the temporary file ended at byte {start + done}")
            done += count
        return out

    def load(self, name: str, *, pageable_out: bool = False) -> np.ndarray:
        """The whole array ``name`` (with ``pageable_out``, read into a :func:`pageable`
        one)."""
        _, dtype, shape = self._layout[name]
        out = pageable(shape, dtype) if pageable_out else None
        return self.rows(name, 0, shape[0], out=out)

    def close(self) -> None:
        self._file.close()


#: Arrays the driver holds of at least this many bytes in all go to a temporary file while a
#: step does not read them (:func:`spilled_if_large`, the arcs' right-hand sides'
#: :meth:`~depsi.processing.integration.ArcRightHandSides.spill`): from about 3x10^6 points.
SPILL_BYTES = 256 * 2**20


def spilled_if_large(arrays: Mapping[str, np.ndarray]) -> SpilledArrays | None:
    """``arrays`` moved to a :class:`SpilledArrays` file where they hold at least
    :data:`SPILL_BYTES` together and the file can be written; else None (the caller keeps
    them; a warning is logged where the file failed)."""
    if sum(np.asarray(a).nbytes for a in arrays.values()) < SPILL_BYTES:
        return None
    try:
        return SpilledArrays(arrays)
    except OSError as error:
        import logging

        logging.getLogger(__name__).warning("%s kept in memory (no temporary file for them: "
                                            "%s)", ", ".join(arrays), error)
        return None


#: Arrays of at least this many bytes that :func:`pageable` makes live in a temporary file's
#: pages (smaller ones are ordinary arrays): from about 4x10^6 arcs of float64 (3x10^6 points).
PAGEABLE_BYTES = 32 * 2**20

#: The memory maps of the live pageable arrays (:func:`page_out` lets their pages go), and the
#: lock their threads take to add to it or list it.
_PAGEABLE: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
_PAGEABLE_LOCK = threading.Lock()


def pageable(shape, dtype, *, zeros: bool = False, directory: str | None = None
             ) -> np.ndarray:
    """An empty array (uninitialised, as :func:`numpy.empty`; zeroed with ``zeros``) whose
    memory is the pages of an unnamed temporary file in ``directory`` (default ``$TMPDIR``),
    mapped shared, where it holds at least :data:`PAGEABLE_BYTES` and the file's space can be
    reserved; else an ordinary array (a warning logged where the file failed).

    It reads and writes as any array. :func:`page_out` takes its pages out of this process's
    resident memory: they stay in the file (the kernel's page cache, written back and
    reclaimed under pressure, as any file's) and come back as they are read. The driver's
    arrays a step does not read at its peak (the arcs' ends, weights and the points' phases
    through the whole network's factorisation) leave its memory without their owners
    letting go of them. The file's space is reserved up front (``posix_fallocate``): a full
    disk is an :class:`OSError` here, never a fault at a later write.

    Examples
    --------
    >>> import depsi.stm.runtime as tools
    >>> a = tools.pageable((3, 2), np.float64)  # small: an ordinary array
    >>> a[:] = 1.0; float(a.sum()), a.shape
    (6.0, (3, 2))
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(s) for s in np.atleast_1d(shape))
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    empty = np.zeros if zeros else np.empty
    if nbytes < PAGEABLE_BYTES or nbytes == 0 or not hasattr(os, "posix_fallocate"):
        return empty(shape, dtype)  # (small, or no reserved file space here: not POSIX)
    import mmap
    import tempfile

    try:
        with tempfile.TemporaryFile(prefix="depsi-pages-", dir=directory) as file:
            os.posix_fallocate(file.fileno(), 0, nbytes)
            pages = mmap.mmap(file.fileno(), nbytes)  # shared; keeps its own descriptor
    except OSError as error:
        import logging

        logging.getLogger(__name__).warning("an array of %.2f GB kept in memory (no temporary "
                                            "file for it: %s)", nbytes / 2**30, error)
        return empty(shape, dtype)
    with _PAGEABLE_LOCK:
        _PAGEABLE.add(pages)
    return np.frombuffer(pages, dtype).reshape(shape)  # (a new file reads as zeros)


def pageable_copy(array: np.ndarray) -> np.ndarray:
    """``array``'s values in a :func:`pageable` array."""
    array = np.asarray(array)
    out = pageable(array.shape, array.dtype)
    np.copyto(out, array)
    return out


def _pages_of(array: np.ndarray):
    """The memory map of a :func:`pageable` ``array`` (or of the array it views), else None."""
    import mmap

    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, memoryview):  # (np.frombuffer's base)
        base = base.obj
    if not isinstance(base, mmap.mmap):
        return None
    with _PAGEABLE_LOCK:
        return base if base in _PAGEABLE else None


def is_pageable(array: np.ndarray) -> bool:
    """Whether ``array`` (or the array it is a view of) lives in a :func:`pageable` file."""
    return _pages_of(array) is not None


def page_out(array: np.ndarray | None = None) -> int:
    """Every live :func:`pageable` array's pages (or only ``array``'s: nothing where it is
    not pageable) out of this process's resident memory (``madvise(MADV_DONTNEED)`` on its
    shared file mapping: the values stay in the file and are read back on their next use, the
    same to the bit). Returns the bytes of the arrays paged out (resident or not)."""
    import mmap

    if array is not None:
        pages = _pages_of(array)
        maps = [] if pages is None else [pages]
    else:
        with _PAGEABLE_LOCK:
            maps = list(_PAGEABLE)
    total = 0
    for pages in maps:
        if pages.closed:
            continue
        pages.madvise(mmap.MADV_DONTNEED)
        total += len(pages)
    return total


#: A Dask worker with a smaller memory limit runs the array-namespace kernels instead of the
#: fused ones (depsi.kernels.numba_support): Numba and a compiled kernel hold about 100 MB in
#: each process (RSS 193 -> 301 MB after the first fused periodogram), which put 450 MB
#: workers past distributed's pause threshold (80 % of the limit, 360 MB), where they run
#: nothing more and the run stalls. From 768 MiB (80 %: 614 MB) a worker keeps room for its
#: chunks, and a 1 GB worker (a SLURM job's usual) runs the same kernel as the client, so its
#: results equal a threads run's bit for bit; below, they equal it to the fused kernel's
#: tested agreement (tests/test_kernels_periodogram_fused.py).
MIN_WORKER_MEMORY = 768 << 20


def _this_worker():
    """The Dask worker this code runs in, or None."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _memory_limit(worker) -> int | None:
    """A worker's memory limit in bytes, None when it has none (or for no worker)."""
    limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    return int(limit) if limit else None


def roomy_process() -> bool:
    """Whether this process can afford Numba's memory: outside a Dask worker, or in a worker
    whose memory limit is none or at least :data:`MIN_WORKER_MEMORY`.

    Examples
    --------
    >>> roomy_process()  # not a Dask worker
    True
    """
    limit = _memory_limit(_this_worker())
    return not limit or limit >= MIN_WORKER_MEMORY


#: Share of a Dask worker's memory limit its tasks may fill: distributed pauses a worker at
#: 80 % (``distributed.worker.memory.pause``) and its nanny kills it at 95 %.
WORKER_MEMORY_TARGET = 0.8
#: Least room a worker's task is told it has (of its limit, per thread): past the target a
#: batch of one item per kernel call would crawl, and a batch this size still fits under the
#: nanny's 95 %.
WORKER_MEMORY_FLOOR = 1 / 16


def worker_free_bytes() -> int | None:
    """Room for one task's temporaries under this Dask worker's memory limit, if this is a
    worker with one: the limit's :data:`WORKER_MEMORY_TARGET` less what the process holds,
    shared by the worker's threads (each runs a task at once), at least
    :data:`WORKER_MEMORY_FLOOR` of the limit a thread. Registered with
    :func:`depsi.kernels.backend.register_host_memory_cap`, so the kernels' batches fit it.

    Without it a kernel sized its batches from the machine's free memory, and a worker with a
    450 MB limit on a 24 GB machine ran a periodogram of 65,536 arcs in one batch, past the
    nanny's 95 % (``tests/test_faults.py``, the small-worker chain, failed so in CI).

    Examples
    --------
    >>> worker_free_bytes() is None  # not a Dask worker
    True
    """
    worker = _this_worker()
    limit = _memory_limit(worker)
    if limit is None:
        return None
    import psutil

    threads = max(int(getattr(worker.state, "nthreads", 1) or 1), 1)
    held = psutil.Process().memory_info().rss
    room = max(WORKER_MEMORY_TARGET * limit - held, WORKER_MEMORY_FLOOR * limit * threads)
    return int(room / threads)


register_host_memory_cap(worker_free_bytes)


def fused_kernels() -> bool | None:
    """The ``fused`` argument of :func:`depsi.kernels.periodogram.periodogram` for this process:
    None (the kernel's default, the fused kernel where Numba is) unless this is a Dask worker
    below :data:`MIN_WORKER_MEMORY`, then False (the array-namespace kernel, no Numba loaded).

    Examples
    --------
    >>> fused_kernels() is None  # not a Dask worker
    True
    """
    return None if roomy_process() else False
