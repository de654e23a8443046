"""Running a step's own work on this process's threads: whether Dask's threaded scheduler is
the one at work, and a bounded, ordered map over a thread pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

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
