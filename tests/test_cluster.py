"""depsi.cluster.scheduler: every scheduler gives the same numbers, cleans up after itself, and
a LocalCluster survives a worker killed in the middle of a computation."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import dask.array as da
import numpy as np
import psutil
import pytest

from depsi.cluster import RunningScheduler, scheduler, slurm_cluster_kwargs
from depsi.pipeline.config import ComputeConfig, PipelineConfig, SlurmConfig

LOCAL_SCHEDULERS = [
    {"scheduler": "synchronous"},
    {"scheduler": "threads", "threads": 2},
    {"scheduler": "processes", "workers": 2},
    # slow: a LocalCluster takes seconds to start (the quick subset starts one in
    # test_local_cluster_is_closed_on_error_and_interrupt)
    pytest.param({"scheduler": "local", "workers": 2, "threads": 1, "memory_limit": "1GB"},
                 marks=pytest.mark.slow),
]


def column_means(seed: int = 0) -> da.Array:
    """A small reduction over a seeded random array: the same graph on every scheduler."""
    x = da.random.RandomState(seed).standard_normal((400, 300), chunks=(100, 300))
    return (x ** 2 + x).mean(axis=0)


def _children() -> set[int]:
    """Child processes, less multiprocessing's resource tracker (one per parent, kept alive)."""
    children = set()
    for process in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(process.cmdline()):
                children.add(process.pid)
        except psutil.NoSuchProcess:
            pass
    return children


def _wait_for_no_new_children(before: set[int], timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while (left := _children() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {pid for pid in left if psutil.pid_exists(pid)}


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    with scheduler({"scheduler": "synchronous"}):
        return column_means().compute()


@pytest.mark.parametrize("compute", LOCAL_SCHEDULERS, ids=lambda c: c["scheduler"])
def test_every_scheduler_gives_the_same_numbers_and_leaves_no_process(
        compute: dict, reference: np.ndarray) -> None:
    before = _children()
    with scheduler(compute) as running:
        assert isinstance(running, RunningScheduler)
        assert running.name == compute["scheduler"]
        result = column_means().compute()
    np.testing.assert_array_equal(result, reference)
    assert _wait_for_no_new_children(before) == set()


def test_scheduler_accepts_models_and_overrides() -> None:
    with scheduler(ComputeConfig(scheduler="threads", threads=3)) as running:
        assert running.description == "threads: 3 threads"
    with scheduler(PipelineConfig(), scheduler="synchronous") as running:
        assert running.name == "synchronous"
    with scheduler() as running:
        assert running.name == "threads"


def test_wrong_scheduler_name_fails_naming_the_key() -> None:
    with pytest.raises(ValueError, match="scheduler"):
        with scheduler(scheduler="mpi"):
            pass


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_local_cluster_is_closed_on_error_and_interrupt(error: type[BaseException]) -> None:
    before = _children()
    with pytest.raises(error):
        with scheduler(scheduler="local", workers=1, threads=1, memory_limit=None) as running:
            client = running.client
            assert len(client.scheduler_info()["workers"]) == 1
            raise error("stop")
    assert client.status == "closed"
    assert _wait_for_no_new_children(before) == set()


def test_processes_pool_is_shut_down_on_interrupt() -> None:
    before = _children()
    with pytest.raises(KeyboardInterrupt):
        with scheduler(scheduler="processes", workers=1):
            column_means().compute()
            raise KeyboardInterrupt
    assert _wait_for_no_new_children(before) == set()


def test_slurm_options_become_cluster_arguments() -> None:
    kwargs = slurm_cluster_kwargs(SlurmConfig(
        queue="gpu", account="insar", cores=8, processes=2, memory="32GB", walltime="02:00:00",
        job_directives=["--qos=short"], gpus_per_job=2, interface="ib0",
        local_directory="/scratch"))
    assert kwargs["job_extra_directives"] == ["--qos=short", "--gres=gpu:2"]
    assert (kwargs["queue"], kwargs["account"], kwargs["interface"]) == ("gpu", "insar", "ib0")
    assert (kwargs["cores"], kwargs["processes"], kwargs["memory"]) == (8, 2, "32GB")
    assert kwargs["local_directory"] == "/scratch"
    # the workers' spill fractions exported first, the user's prologue after (it may override)
    custom = slurm_cluster_kwargs(SlurmConfig(job_script_prologue=["module load gdal"]))
    assert custom["job_script_prologue"] == [
        "export DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=0.4",
        "export DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=0.5", "module load gdal"]


def _gated_double(block: np.ndarray, gate: str) -> np.ndarray:
    """Leave a mark that a block started, then wait until the test opens ``gate``: the test
    decides when blocks finish, so no step depends on how fast the machine is."""
    folder = Path(gate)
    (folder / f"started-{os.getpid()}-{uuid.uuid4().hex}").touch()
    while not (folder / "open").exists():
        time.sleep(0.01)
    return block * 2


def _wait_until(condition, what: str, timeout: float = 120.0) -> None:
    """Poll ``condition``; the timeout only turns a hang into a failure that says what."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting: {what}")
        time.sleep(0.02)


@pytest.mark.slow
def test_local_cluster_survives_a_killed_worker(tmp_path: Path) -> None:
    x = da.random.RandomState(1).standard_normal((16, 50), chunks=(1, 50))
    gate = tmp_path / "gate"
    gate.mkdir()
    meta = np.empty((0, 0), x.dtype)  # given, so dask never calls the gated function to find it
    graph = x.map_blocks(_gated_double, gate=str(gate), meta=meta).sum(axis=0)
    opened = tmp_path / "opened"
    opened.mkdir()
    (opened / "open").touch()
    with scheduler({"scheduler": "threads", "threads": 8}):
        expected = x.map_blocks(_gated_double, gate=str(opened), meta=meta).sum(axis=0).compute()

    with scheduler(scheduler="local", workers=2, threads=1, memory_limit=None) as running:
        client = running.client
        pids = client.run(os.getpid)
        future = client.compute(graph)
        # each worker runs one thread, so two started blocks mean both workers are busy
        _wait_until(lambda: len(list(gate.glob("started-*"))) >= 2, "both workers in a block")
        assert not future.done(), "the computation ended while its blocks were held"
        victim = sorted(pids.values())[0]
        os.kill(victim, signal.SIGKILL)
        (gate / "open").touch()
        result = future.result(timeout=60)
        client.wait_for_workers(2, timeout=30)
        assert victim not in client.run(os.getpid).values()
    np.testing.assert_array_equal(result, expected)


def _blas_threads(_: object = None) -> list[int]:
    """Threads of every BLAS library loaded where this runs (a task, or the test)."""
    import numpy  # noqa: F401 (its BLAS is what the tasks use)
    from threadpoolctl import threadpool_info

    return sorted({info["num_threads"] for info in threadpool_info()
                   if info["user_api"] == "blas"})


@pytest.mark.parametrize("compute", [{"scheduler": "threads", "threads": 2},
                                     {"scheduler": "processes", "workers": 2}],
                         ids=lambda c: c["scheduler"])
def test_tasks_run_blas_on_one_thread_and_the_block_restores_it(compute: dict) -> None:
    """Tasks are the parallelism: each runs BLAS on one thread, as distributed's workers do
    (a multi-threaded BLAS in every task oversubscribes the cores); after the block this
    process's count is back."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=3, user_api="blas"):
        with scheduler(compute):
            seen = da.from_array(np.arange(4), chunks=1).map_blocks(
                lambda block: np.array([_blas_threads()[-1]] * len(block))).compute()
        assert set(seen.tolist()) == {1}
        assert _blas_threads() == [3]


def _malloc_settings() -> tuple[str | None, str | None]:
    import os

    return os.environ.get("MALLOC_TRIM_THRESHOLD_"), os.environ.get("MALLOC_MMAP_THRESHOLD_")


def _hugepage_advice() -> bool:
    import numpy as np

    return (getattr(np, "_core", None) or np.core).multiarray._get_madvise_hugepage()


@pytest.mark.slow
def test_local_workers_reuse_their_heap_for_temporaries() -> None:
    """A LocalCluster's workers run with glibc's trim and mmap thresholds at WORKER_MALLOC
    (distributed's 64 kB trim threshold alone pins the mmap threshold at 128 kB: every larger
    temporary is mapped and unmapped page by page) and NumPy's huge-page advice off, the
    nannies' other settings kept; after the block the configuration is as before."""
    import dask
    import distributed  # noqa: F401 - its configuration defaults

    from depsi.cluster import WORKER_MALLOC

    before = dask.config.get("distributed.nanny.pre-spawn-environ")
    with scheduler(scheduler="local", workers=1, threads=1, memory_limit=None) as running:
        (settings,) = running.client.run(_malloc_settings).values()
        (blas,) = running.client.run(lambda: __import__("os").environ.get(
            "OPENBLAS_NUM_THREADS")).values()
        (hugepages,) = running.client.run(_hugepage_advice).values()
    assert settings == tuple(str(WORKER_MALLOC[name]) for name in (
        "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"))
    assert blas == "1"
    assert hugepages is False  # NumPy's huge-page advice off in the workers (no_hugepage_advice)
    assert dask.config.get("distributed.nanny.pre-spawn-environ") == before


def test_local_workers_spill_with_room_left_for_their_tasks() -> None:
    """A LocalCluster's workers spill their managed data from WORKER_MEMORY's fractions (a
    task's own arrays are not managed: distributed's 60 % left 1 GB workers too little room at
    10^7 points), restarted workers too; the client's own configuration is left as it was."""
    import dask
    import distributed  # noqa: F401 - its configuration defaults

    from depsi.cluster import WORKER_MEMORY

    def fractions(dask_worker):
        manager = dask_worker.memory_manager
        return manager.memory_target_fraction, manager.memory_spill_fraction

    expected = (WORKER_MEMORY["distributed.worker.memory.target"],
                WORKER_MEMORY["distributed.worker.memory.spill"])
    before = dask.config.get("distributed.worker.memory.target")
    with scheduler(scheduler="local", workers=1, threads=1, memory_limit="1GB") as running:
        assert set(running.client.run(fractions).values()) == {expected}
        running.client.restart()
        assert set(running.client.run(fractions).values()) == {expected}
    assert dask.config.get("distributed.worker.memory.target") == before != expected[0]


def test_this_module_runs_in_the_serial_group(request) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (scripts/test.sh) the modules of
    tests/conftest.py's SERIAL_MODULES carry the group in their node ids, so they run one at a
    time in one worker (two SLURM tests at once wait on each other's jobs and time out). pytest
    9.2 with pytest-xdist 3.8 lost the group silently; this fails instead."""
    import os

    if "PYTEST_XDIST_WORKER" not in os.environ or not request.config.getvalue("loadgroup"):
        pytest.skip("not under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@serial"), request.node.nodeid
