"""The Dask and memory helpers of the steps (``depsi.stm.dask_tools``, ``depsi.stm.runtime``):
computing in place, culled batches, views as chunks, heap pages handed back, pageable arrays."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

from depsi.stm.dask_tools import chunked_view, computed_in_place, culled

#: Run in a fresh process: the heap of a long test session (what earlier tests left) decides
#: what a trim can return, so in-process the figure depends on the tests before it.
_TRIM_CHECK = """
import numpy as np, psutil
from depsi.stm.runtime import _malloc_trim, release_memory
if _malloc_trim() is None:
    print("no-trim", release_memory())
else:
    process, mb = psutil.Process(), 2**20
    big = np.ones(16 * mb // 8)
    del big  # raises glibc's threshold for serving arrays from the heap
    held, freed = [], []
    for _ in range(300):
        freed.append(np.ones(mb // 8))
        held.append(np.ones(1024))
    freed.clear()
    before = process.memory_info().rss
    released = release_memory()
    print("trim", released, (before - process.memory_info().rss) // mb)
"""


def _fresh_python(script: str, *args: str, **environ: str) -> list[str]:
    """``script``'s printed words, run in a fresh process without glibc's tuning from this
    one's environment (distributed's nanny sets MALLOC_TRIM_THRESHOLD_ here once a cluster test
    ran: it would trim before the code under test could) nor NumPy's huge-page switch, and with
    ``environ`` added."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MALLOC_", "GLIBC_")) and k != "NUMPY_MADVISE_HUGEPAGE"}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, check=True, env=env | environ).stdout.split()


def test_release_memory_returns_the_heaps_free_pages():
    """After a freed 16 MB array, glibc serves 1 MB arrays from its heap and keeps them
    resident when freed around live ones (the chain's block temporaries); release_memory hands
    them back. Where the C library has no malloc_trim, it says so and does nothing."""
    out = _fresh_python(_TRIM_CHECK)
    if out[0] == "no-trim":
        assert out[1] == "False"
        return
    assert out[1] == "True" and int(out[2]) > 200, out


#: A 24 MiB array freed with a small live one allocated after it, then a third one made. Under
#: glibc's defaults the first such array, once freed, raises the size from which arrays get
#: pages of their own, so the second comes from the heap and stays resident when freed;
#: bounded, it is handed back. Prints the setting made, the MiB the free handed back and the
#: MiB the third array faulted in anew. ``sys.argv[1]``: "default" (glibc's), "bound"
#: (bound_allocator), "threads" or "client" (tune_memory on threads, or under a distributed
#: client).
_ALLOCATOR_CHECK = """
import sys, numpy as np, psutil
from depsi.stm.runtime import bound_allocator, tune_memory
mode = sys.argv[1]
if mode == "client":
    from distributed import Client
    client = Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None)
setting = {"default": lambda: None, "bound": bound_allocator}.get(mode, tune_memory)()
process, mb = psutil.Process(), 2**20
big = np.ones(24 * mb // 8)
del big
big = np.ones(24 * mb // 8)
held = np.ones(1024)
before = process.memory_info().rss
del big
dropped = before - process.memory_info().rss
again = np.ones(24 * mb // 8)
print(setting, dropped // mb, (process.memory_info().rss - before + dropped) // mb)
"""


def _glibc_allocator() -> None:
    """Skip where the C library is not glibc: there is no allocator to bound or tune."""
    from depsi.stm.runtime import _malloc_trim

    if _malloc_trim() is None:
        pytest.skip("not glibc: nothing to bound or tune")


@pytest.mark.slow
def test_bound_allocator_hands_back_a_freed_large_array():
    """Bounded, a freed 24 MiB array leaves the process at once; under glibc's defaults (the
    control, run the same way) the second one stays resident. A user's own tuning is left."""
    _glibc_allocator()
    bounded = _fresh_python(_ALLOCATOR_CHECK, "bound")
    default = _fresh_python(_ALLOCATOR_CHECK, "default")
    assert bounded[0] == "True" and int(bounded[1]) >= 20, bounded
    assert int(default[1]) <= 4, default  # the check can fail: without the bound nothing left
    assert _fresh_python(_ALLOCATOR_CHECK, "bound", MALLOC_ARENA_MAX="4")[0] == "False"


@pytest.mark.slow
def test_tune_memory_keeps_block_sized_arrays_on_threads_and_hands_them_back_under_a_client():
    """On threads, a freed 24 MiB array stays resident and its pages serve the next one
    (nothing faulted in anew); under a distributed client it leaves the process at once and
    the next one is faulted in anew (24 MiB)."""
    from depsi.stm.runtime import MMAP_THRESHOLD, WORKING_MMAP_THRESHOLD

    _glibc_allocator()
    threads = _fresh_python(_ALLOCATOR_CHECK, "threads")
    client = _fresh_python(_ALLOCATOR_CHECK, "client")
    assert int(threads[0]) == WORKING_MMAP_THRESHOLD, threads
    assert int(threads[1]) <= 2 and int(threads[2]) <= 2, threads
    assert int(client[0]) == MMAP_THRESHOLD, client
    assert int(client[1]) >= 20 and int(client[2]) >= 20, client


_HUGEPAGE_CHECK = """
import numpy as np
from depsi.stm.runtime import no_hugepage_advice
getter = (getattr(np, "_core", None) or np.core).multiarray._get_madvise_hugepage
before = getter()
print(before, no_hugepage_advice(), getter())
"""


@pytest.mark.slow
def test_no_hugepage_advice_switches_numpys_advice_off_unless_the_user_chose():
    """NumPy's huge-page advice is off after the call (it was on, NumPy's default on Linux);
    a user's NUMPY_MADVISE_HUGEPAGE stands, either way."""
    if not hasattr((getattr(np, "_core", None) or np.core).multiarray, "_get_madvise_hugepage"):
        pytest.skip("this NumPy has no huge-page switch")
    before, switched, after = _fresh_python(_HUGEPAGE_CHECK)
    assert (switched, after) == ("True", "False"), (before, switched, after)
    assert _fresh_python(_HUGEPAGE_CHECK, NUMPY_MADVISE_HUGEPAGE="1")[1:] == ["False", "True"]
    assert _fresh_python(_HUGEPAGE_CHECK, NUMPY_MADVISE_HUGEPAGE="0") == ["False"] * 3


def _pid_block(block: np.ndarray) -> np.ndarray:
    import os

    return np.full(block.shape, os.getpid(), dtype=np.int64)


@pytest.mark.parametrize("compute", [
    {"scheduler": "local", "workers": 1, "threads": 1, "memory_limit": None},
    pytest.param({"scheduler": "processes", "workers": 1}, marks=pytest.mark.slow)],
    ids=lambda c: c["scheduler"])
def test_computed_in_place_in_process_keeps_the_work_here_under_a_cluster(compute):
    """Under a LocalCluster or a process pool, ``in_process=True`` runs the blocks on this
    process's threads (the chain's final fit: its inputs are views of this process's arrays,
    which the cluster would get copied into its graph); without it, the workers run them. (The
    threaded scheduler would take a configured process pool as its own: the blocks were then
    written in other processes, and the chain's heights under `processes` were all zero.)"""
    import os

    from depsi.cluster import scheduler

    values = np.arange(40.0).reshape(8, 5)
    lazy = xr.Dataset({"pid": (("space", "time"), da.map_blocks(
        _pid_block, chunked_view(values, 2), dtype=np.int64))})
    with scheduler(compute):
        here = computed_in_place(lazy, in_process=True)["pid"][1]
        there = computed_in_place(lazy)["pid"][1]
    assert (here == os.getpid()).all()
    assert (there != os.getpid()).all()


def _head(payload: np.ndarray) -> dict:
    return {"a": payload[:10]}


def test_culled_keeps_only_the_tasks_a_slice_needs():
    """A slice of a lazy result keeps the whole graph; culled() keeps what its chunks need, so a
    distributed scheduler is not sent every chunk's inputs (densification's batches at 10^7:
    2.4 GB each). The values are the same."""
    import pickle

    parts = []
    for i in range(20):
        piece = dask.delayed(_head, pure=True)(np.full(250_000, float(i)))  # 2 MB each
        parts.append(da.from_delayed(piece["a"], (10,), dtype=float))
    ds = xr.Dataset({"v": ("space", da.concatenate(parts))})
    batch = ds.isel(space=slice(0, 20))
    whole = len(pickle.dumps(dict(batch["v"].data.__dask_graph__())))
    cut = culled(batch)
    size = len(pickle.dumps(dict(cut["v"].data.__dask_graph__())))
    assert whole > 30e6 and size < 6e6
    np.testing.assert_array_equal(cut["v"].values, batch["v"].values)
    np.testing.assert_array_equal(cut["v"].values, np.repeat([0.0, 1.0], 10))


def _chunk_result(block: np.ndarray, shared: np.ndarray) -> dict:
    return {"sum": block.sum(axis=1) + shared[0], "block": block}


def _densify_like(n_chunks: int) -> xr.Dataset:
    """A graph shaped like densification's: a fancy-indexed input, one delayed task a chunk on
    its block and a shared value, each output concatenated from one piece a chunk."""
    values = da.random.random((n_chunks * 20, 3), chunks=(20, 3))
    values = values[np.arange(0, n_chunks * 20, 2)]  # a gather: one layer for every chunk
    shared = dask.delayed(np.ones(2), pure=True)
    pieces = {"sum": [], "block": []}
    for i, size in enumerate(values.chunks[0]):
        part = dask.delayed(_chunk_result, pure=True, nout=None)(values.blocks[i], shared)
        pieces["sum"].append(da.from_delayed(part["sum"], (size,), dtype=float))
        pieces["block"].append(da.from_delayed(part["block"], (size, 3), dtype=float))
    return xr.Dataset({"sum": ("space", da.concatenate(pieces["sum"])),
                       "block": (("space", "t"), da.concatenate(pieces["block"]))})


def test_culled_keeps_exactly_the_batchs_tasks_without_reading_the_whole_graph(monkeypatch):
    """A batch of b chunks of a densification-shaped graph keeps the tasks dask's own cull of
    the materialised graph keeps, a fixed number a chunk; and culled never iterates over the
    whole graph (each batch did: batches x graph size, quadratic in the chunks)."""
    from dask.core import flatten
    from dask.highlevelgraph import HighLevelGraph
    from dask.optimization import cull

    ds = _densify_like(40)
    bounds = np.cumsum((0,) + ds.chunks["space"])
    batches = {b: ds.isel(space=slice(0, int(bounds[b]))) for b in (1, 2, 4)}
    oracle = {b: cull(dict(batch["sum"].data.__dask_graph__()),
                      list(flatten(batch["sum"].data.__dask_keys__())))[0]
              for b, batch in batches.items()}

    def whole_graph_read(self):
        raise AssertionError("culled iterated over the whole graph")

    monkeypatch.setattr(HighLevelGraph, "__iter__", whole_graph_read)
    cut = {b: culled(batch) for b, batch in batches.items()}
    monkeypatch.undo()
    counts = {b: len(c["sum"].data.__dask_graph__()) for b, c in cut.items()}
    for b in batches:
        assert set(cut[b]["sum"].data.__dask_graph__()) == set(oracle[b])
    per_chunk = counts[2] - counts[1]
    assert counts[4] - counts[2] == 2 * per_chunk  # tasks proportional to the batch
    assert counts[4] < len(dict(ds["sum"].data.__dask_graph__())) / 5
    for b, batch in batches.items():
        np.testing.assert_array_equal(cut[b]["block"].values, batch["block"].values)


def test_culled_rows_is_culled_isel_without_copying_the_graphs_layers(monkeypatch):
    """culled_rows(ds, rows) keeps the tasks and values of culled(ds.isel(space=rows)); and
    no graph it builds holds ds's table of layers (isel copies it: one layer a chunk, so a
    loop over batches grew with batches x chunks)."""
    from dask.highlevelgraph import HighLevelGraph

    from depsi.stm.dask_tools import culled_rows

    ds = _densify_like(40)
    bounds = np.cumsum((0,) + ds.chunks["space"])
    sizes = []
    original = HighLevelGraph.__init__

    def counted(self, layers, *args, **kwargs):
        sizes.append(len(layers))
        original(self, layers, *args, **kwargs)

    for rows in (slice(int(bounds[2]), int(bounds[4])), slice(5, 47), slice(0, 0)):
        expected = culled(ds.isel(space=rows))
        monkeypatch.setattr(HighLevelGraph, "__init__", counted)
        cut = culled_rows(ds, rows)
        monkeypatch.undo()
        for name in ("sum", "block"):
            assert cut[name].data.name == expected[name].data.name
            assert set(cut[name].data.__dask_graph__()) == set(
                expected[name].data.__dask_graph__())
            np.testing.assert_array_equal(cut[name].values, expected[name].values)
    assert len(ds["sum"].data.__dask_graph__().layers) > 40 and max(sizes) <= 2


def test_a_dask_workers_memory_limit_caps_the_free_host_memory_its_batches_see():
    # the small-worker chain in CI ran a periodogram of 65,536 arcs in one batch sized from the
    # machine's 24 GB, past its 450 MB worker's limit (the nanny killed it four times)
    from dask.utils import parse_bytes
    from distributed import Client, LocalCluster

    from depsi.kernels import backend
    from depsi.stm import runtime

    limit = parse_bytes("450MB")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, memory_limit=limit,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        in_worker = client.submit(backend.available_host_memory, pure=False).result()
        items = client.submit(backend.batch_size, 1e6, "cpu", pure=False).result()
    assert runtime.WORKER_MEMORY_FLOOR * limit <= in_worker
    assert in_worker <= runtime.WORKER_MEMORY_TARGET * limit / 2  # two threads share it
    assert items <= backend.DEFAULT_SAFETY * in_worker / 1e6 + 1
    # outside a worker: no cap of this kind, the machine's (or container's) free memory
    assert runtime.worker_free_bytes() is None
    assert runtime.worker_free_bytes in backend._HOST_MEMORY_CAPS


#: A pageable array of 64 MiB written, paged out and read back, the process's resident memory
#: measured at each moment (in a fresh process: nothing else of the session's in its pages).
_PAGE_CHECK = """
import numpy as np, psutil
from depsi.stm import runtime
process, mb = psutil.Process(), 2**20
start = process.memory_info().rss
a = runtime.pageable((8 * mb,), np.float64)
a[:] = np.arange(a.size)
written = process.memory_info().rss
paged = runtime.page_out()
out = process.memory_info().rss
same = bool((a == np.arange(a.size)).all())
print(runtime.is_pageable(a), (written - start) // mb, (written - out) // mb, paged // mb, same)
"""


@pytest.mark.slow
def test_page_out_lets_a_pageable_arrays_memory_go_and_its_values_stay():
    """A 64 MiB pageable array takes its pages as it is written; page_out hands all of them
    back; every value reads back the same after it (the pages come from the file)."""
    pageable, written, freed, paged, same = _fresh_python(_PAGE_CHECK)
    assert pageable == "True" and same == "True"
    assert int(written) >= 60 and int(freed) >= 60 and int(paged) == 64, (written, freed)


def test_pageable_arrays_behave_as_arrays_and_small_ones_are_ordinary(monkeypatch, tmp_path):
    from depsi.stm import runtime

    small = runtime.pageable((4, 3), np.int16)
    assert small.shape == (4, 3) and small.dtype == np.int16
    assert not runtime.is_pageable(small)  # below PAGEABLE_BYTES: no file
    monkeypatch.setattr(runtime, "PAGEABLE_BYTES", 0)
    rng = np.random.default_rng(0)
    values = rng.normal(size=(1000, 7)).astype(np.float32)
    copy = runtime.pageable_copy(values)
    assert runtime.is_pageable(copy) and runtime.is_pageable(copy[3:, 2])
    assert copy.dtype == np.float32 and np.array_equal(copy, values)
    copy[5] += 1.0  # writable, and a write survives the page-out
    runtime.page_out()
    # one array's pages alone (a view names its array's); an ordinary array has none
    assert runtime.page_out(copy[10:20]) == copy.nbytes
    assert runtime.page_out(values) == 0
    zeros = runtime.pageable((50, 3), np.int32, zeros=True)
    assert runtime.is_pageable(zeros) and not zeros.any()
    assert np.array_equal(copy[5], values[5] + 1.0) and np.array_equal(copy[6:], values[6:])
    assert not runtime.is_pageable(copy[::2].copy())  # a copy is ordinary memory
    # the file goes with the array: no file left in its directory
    kept = runtime.pageable((100,), np.float64, directory=str(tmp_path))
    kept[:] = 1.0
    assert runtime.is_pageable(kept) and list(tmp_path.iterdir()) == []


def test_pageable_falls_back_to_memory_with_a_warning_where_no_file_can_be_made(
        monkeypatch, caplog, tmp_path):
    from depsi.stm import runtime

    monkeypatch.setattr(runtime, "PAGEABLE_BYTES", 0)
    with caplog.at_level("WARNING", logger="depsi.stm.runtime"):
        array = runtime.pageable((10, 2), np.float64, directory=str(tmp_path / "missing"))
    array[:] = 2.0
    assert not runtime.is_pageable(array) and float(array.sum()) == 40.0
    assert "kept in memory (no temporary file" in caplog.text
