"""A real one-node SLURM cluster (scripts/slurm-up.sh): dask-jobqueue workers started as SLURM
jobs give the threads result, survive a cancelled job, and leave no job behind.

The tests skip, with the reason, only where SLURM cannot be started (not root, no apt-get).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

from depsi.cluster import SchedulerStartError, scheduler

try:  # the marker is registered in pyproject.toml; without it --strict-markers would refuse it
    pytestmark = pytest.mark.slurm
except pytest.fail.Exception:  # pragma: no cover - until the marker is registered
    pytestmark = []


def _queue() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.split("\n") if out.stdout.strip() else []


def _slurm_compute(tmp_path: Path, **slurm: object) -> dict:
    return {"scheduler": "slurm", "worker_timeout": 60, "slurm": {
        "cores": 1, "memory": "1GB", "walltime": "00:10:00", "interface": "lo",
        "local_directory": str(tmp_path / "scratch"), "log_directory": str(tmp_path / "logs"),
        **slurm}}


def _expected_fractions() -> tuple[float, float]:
    from depsi.cluster import WORKER_MEMORY

    return (WORKER_MEMORY["distributed.worker.memory.target"],
            WORKER_MEMORY["distributed.worker.memory.spill"])


def _graph() -> da.Array:
    x = da.random.RandomState(0).standard_normal((400, 300), chunks=(50, 300))
    return (x ** 2 + x).mean(axis=0)


@pytest.mark.slow
def test_slurm_cluster_with_two_jobs_equals_threads(slurm_env: dict, tmp_path: Path) -> None:
    with scheduler(scheduler="threads", threads=2):
        expected = _graph().compute()
    with scheduler(_slurm_compute(tmp_path, jobs=2)) as running:
        workers = running.client.scheduler_info()["workers"]
        assert len(workers) == 2
        assert len([line for line in _queue() if line.endswith("RUNNING")]) == 2
        result = _graph().compute()
        # the jobs' workers spill from depsi's fractions (their job script's prologue); a
        # lambda travels by value (the workers cannot import this test module)
        fractions = running.client.run(lambda dask_worker: (
            dask_worker.memory_manager.memory_target_fraction,
            dask_worker.memory_manager.memory_spill_fraction))
    assert set(fractions.values()) == {_expected_fractions()}
    np.testing.assert_array_equal(result, expected)
    assert _queue() == []


@pytest.mark.slow
def test_slurm_run_completes_after_a_worker_job_is_cancelled(
        slurm_env: dict, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()

    def gated_double(block: np.ndarray, gate: str) -> np.ndarray:
        # Local, so it travels by value: SLURM workers cannot import this test module. The test
        # decides when blocks finish (by creating gate/open), so nothing depends on speed.
        (Path(gate) / f"started-{os.getpid()}-{uuid.uuid4().hex}").touch()
        while not (Path(gate) / "open").exists():
            time.sleep(0.01)
        return block * 2

    x = da.random.RandomState(2).standard_normal((20, 40), chunks=(1, 40))
    meta = np.empty((0, 0), x.dtype)  # given, so dask never calls the gated function to find it
    graph = x.map_blocks(gated_double, gate=str(gate), meta=meta).sum(axis=0)
    expected = (x * 2).sum(axis=0).compute(scheduler="synchronous")
    with scheduler(_slurm_compute(tmp_path, jobs=2)) as running:
        future = running.client.compute(graph)
        deadline = time.monotonic() + 120  # only turns a hang into a failure
        while not list(gate.glob("started-*")):
            assert time.monotonic() < deadline, "no block started on the SLURM workers"
            time.sleep(0.05)
        assert not future.done(), "the computation ended while its blocks were held"
        victim = next(iter(running.cluster.workers.values())).job_id
        subprocess.run(["scancel", str(victim)], check=True, timeout=30)
        (gate / "open").touch()
        result = future.result(timeout=120)
    np.testing.assert_array_equal(result, expected)
    assert _queue() == []


@pytest.mark.slow
def test_slurm_jobs_that_cannot_run_fail_with_a_clear_error(
        slurm_env: dict, tmp_path: Path) -> None:
    compute = _slurm_compute(tmp_path, jobs=1, memory="100TB")
    compute["worker_timeout"] = 3
    with pytest.raises(SchedulerStartError,
                       match=r"SLURMCluster: 0 of 1 workers started.*sbatch refuses the job"):
        with scheduler(compute):
            pass
    assert _queue() == []
