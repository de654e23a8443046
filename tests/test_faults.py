"""Faults the pipeline survives (docs/design.md, "Errors and bad input"): the `depsi run` process
SIGKILLed in the middle of a step, the same config on a LocalCluster, a process pool and a real
SLURM cluster, and workers whose memory limit is several times smaller than the stack.

Every run is compared with one undisturbed threads run of the same config."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import yaml

from depsi.io import open_stm
from depsi.pipeline import parse_config, run_pipeline
from depsi.pipeline.runner import manifest_path
from depsi.pipeline.steps import STEP_NAMES
from depsi.simulate import simulate_stack

SIMULATE = {"shape": [120, 120], "n_epochs": 20, "seed": 7, "ps_fraction": 0.03}


def config_data(workspace: Path, **compute) -> dict:
    return {"input": {"simulate": dict(SIMULATE)},
            "network": {"first_order": 150},  # the other points go through densification
            "output": {"workspace": str(workspace), "exports": ["csv"]},
            "compute": {"scheduler": "threads", "threads": 2, **compute}}


def assert_same_result(workspace: Path, reference: Path) -> None:
    """The result STMs are equal to float round-off, variable by variable."""
    got, expected = open_stm(workspace / "stm.zarr"), open_stm(reference / "stm.zarr")
    assert got.sizes == expected.sizes
    for name in expected.variables:
        a, b = got[name].values, expected[name].values
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-9, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The workspace of an undisturbed threads run of the small config."""
    workspace = tmp_path_factory.mktemp("faults") / "threads"
    run_pipeline(parse_config(config_data(workspace)), progress=False)
    return workspace


# --------------------------------------------------------------------------- SIGKILL and resume
#: A `depsi run` whose result store stalls after it is fully written and before it is moved
#: into place, touching a flag file: the most adversarial moment for a SIGKILL, reached every time.
_STALLING_RUN = """
import pathlib, sys, time
import depsi.io.store as store
move = store.move_into_place
def stall(tmp, path):
    if path.name == "stm.zarr":
        pathlib.Path(sys.argv[2]).touch()
        time.sleep(600)
    move(tmp, path)
store.move_into_place = stall
from depsi.cli import main
sys.exit(main(["run", sys.argv[1], "--no-progress"]))
"""


def _run_and_kill_when(config_path: Path, ready, timeout: float = 120.0,
                       command: list[str] | None = None) -> None:
    command = command or [sys.executable, "-m", "depsi.cli", "run", str(config_path),
                          "--no-progress"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while not ready():
            if process.poll() is not None:
                pytest.fail(f"depsi run ended (exit {process.returncode}) before the kill point")
            if time.monotonic() > deadline:
                pytest.fail("the kill point was not reached in time")
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL


#: A `depsi run` that stalls inside densification (after the atmosphere step's product and
#: manifest are written), touching a flag file: the kill lands in that step every time.
_STALLING_DENSIFICATION = """
import pathlib, sys, time
import depsi.pipeline.steps.densification as densification
def stall(*args, **kwargs):
    pathlib.Path(sys.argv[2]).touch()
    time.sleep(600)
densification.densify = stall
from depsi.cli import main
sys.exit(main(["run", sys.argv[1], "--no-progress"]))
"""

EARLIER = STEP_NAMES[:STEP_NAMES.index("densification")]


@pytest.mark.slow
def test_sigkill_inside_densification_resumes_without_redoing_earlier_steps(reference,
                                                                             tmp_path):
    workspace = tmp_path / "ws"
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config_data(workspace)))
    stalled = tmp_path / "stalled"
    _run_and_kill_when(config_path, stalled.exists, command=[
        sys.executable, "-c", _STALLING_DENSIFICATION, str(config_path), str(stalled)])

    assert not manifest_path(workspace, "densification").exists()
    manifests = {step: manifest_path(workspace, step).read_text() for step in EARLIER}
    products = [workspace / name for name in ("ps.zarr", "network.zarr", "arcs.zarr",
                                              "integration.zarr", "atmosphere.zarr")]
    stamps = {p: p.stat().st_mtime_ns for p in products}

    from depsi.cli import main

    assert main(["run", str(config_path), "--resume", "--no-progress"]) == 0
    assert {step: manifest_path(workspace, step).read_text() for step in EARLIER} == manifests
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    log = (workspace / "depsi.log").read_text().split("--resume")[-1]
    last_run = log[log.rfind("depsi run: steps"):]
    for step in EARLIER:
        assert f"step {step}: skipped" in last_run, step
    assert "step densification: redone (no manifest densification.done.json)" in last_run
    assert not list(workspace.glob(".*writing*"))
    assert_same_result(workspace, reference)


@pytest.mark.slow
def test_sigkill_while_the_product_is_being_written_leaves_no_trusted_product(reference,
                                                                              tmp_path):
    workspace = tmp_path / "ws"
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config_data(workspace)))
    stalled = tmp_path / "stalled"
    _run_and_kill_when(config_path, stalled.exists, command=[
        sys.executable, "-c", _STALLING_RUN, str(config_path), str(stalled)])
    # killed with the complete result in its temporary sibling, not yet under its name
    assert list(workspace.glob(".stm.zarr.*"))
    assert not (workspace / "stm.zarr").exists()
    assert not manifest_path(workspace, "model").exists()
    summary = run_pipeline(parse_config(config_data(workspace)), resume=True, progress=False)
    assert summary.steps["model"].status == "ran"
    assert summary.steps["densification"].status == "skipped"
    assert not list(workspace.glob(".stm.zarr.*"))
    assert_same_result(workspace, reference)


# ---------------------------------------------------------------------- other schedulers
@pytest.mark.slow
def test_local_cluster_run_equals_the_threads_run(reference, tmp_path):
    workspace = tmp_path / "local"
    config = parse_config(config_data(workspace, scheduler="local", workers=2, threads=1))
    summary = run_pipeline(config, progress=False)
    assert summary.scheduler.startswith("local: 2 workers")
    assert_same_result(workspace, reference)


@pytest.mark.slow
def test_process_pool_run_equals_the_threads_run(reference, tmp_path):
    workspace = tmp_path / "processes"
    run_pipeline(parse_config(config_data(workspace, scheduler="processes", workers=2)),
                 progress=False)
    assert_same_result(workspace, reference)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_cluster_run_equals_the_threads_run(slurm_env, reference, tmp_path):  # noqa: F811
    workspace = tmp_path / "slurm"
    compute = {"scheduler": "slurm", "worker_timeout": 90, "slurm": {
        "cores": 1, "memory": "1GB", "walltime": "00:10:00", "interface": "lo", "jobs": 2,
        "local_directory": str(tmp_path / "scratch"), "log_directory": str(tmp_path / "logs")}}
    data = config_data(workspace)
    data["compute"] = compute
    summary = run_pipeline(parse_config(data), progress=False)
    assert summary.scheduler.startswith("slurm: 2 jobs")
    assert_same_result(workspace, reference)


# ----------------------------------------------------------------------- memory-bound workers
#: Worker memory limit of the memory test. A fresh worker with depsi imported takes ~180 MB, and
#: Dask pauses a worker at 80 % of its limit: the limit leaves room for a few chunks, no more.
WORKER_MEMORY = "450MB"
#: The stack: a 300 x 300 simulated scene tiled 7 x 7 (1.6 GB of complex64 + float32 h2ph,
#: 3.5 times a worker's limit).
TILE, REPEAT, EPOCHS = 300, 7, 30


def _write_tiled_stack(path: Path) -> int:
    """A large stack written quickly: one simulated scene repeated; returns its bytes."""
    stack, _ = simulate_stack(shape=(TILE, TILE), n_epochs=EPOCHS, seed=11, ps_fraction=0.002)
    stack = stack.drop_vars([n for n in ("lat", "lon") if n in stack.variables]).compute()
    size = TILE * REPEAT
    chunks = (250, 250, EPOCHS)
    tiled = {name: (("azimuth", "range", "time"),
                    da.tile(da.from_array(stack[name].values), (REPEAT, REPEAT, 1))
                    .rechunk(chunks))
             for name in ("complex", "h2ph")}
    big = xr.Dataset(tiled, coords={"azimuth": np.arange(size), "range": np.arange(size),
                                    "time": stack["time"].values}, attrs=stack.attrs)
    big.to_zarr(path, mode="w", zarr_format=3, consolidated=False)
    return int(big["complex"].nbytes + big["h2ph"].nbytes)


@pytest.fixture(scope="module")
def large_stack(tmp_path_factory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("large") / "stack.zarr"
    return path, _write_tiled_stack(path)


def _memory_bound_config(stack_path: Path, workspace: Path):
    return parse_config({
        "input": {"path": str(stack_path), "format": "zarr"},
        "output": {"workspace": str(workspace), "exports": []},
        "compute": {"scheduler": "local", "workers": 2, "threads": 1,
                    "memory_limit": WORKER_MEMORY}})


@pytest.mark.slow
def test_workers_with_a_small_memory_limit_select_from_a_larger_stack_and_complete_the_chain(
        large_stack, tmp_path):
    # one run for both (the selection alone took a third of the whole run's time)
    from dask.utils import parse_bytes

    stack_path, stack_bytes = large_stack
    assert stack_bytes > 3 * parse_bytes(WORKER_MEMORY)
    summary = run_pipeline(_memory_bound_config(stack_path, tmp_path / "ws"), progress=False)
    selected = summary.steps["selection"].counts["selected"]
    assert selected > REPEAT**2 * TILE**2 * 0.001
    # the repeated scene selects the same pixels in every tile
    assert open_stm(tmp_path / "ws" / "ps.zarr").sizes["space"] % REPEAT**2 == 0
    result = open_stm(tmp_path / "ws" / "stm.zarr")
    # The tiled scene is not one physical scene: its deformation, atmosphere and h2ph jump at
    # every tile seam, so arcs across seams are rightly rejected; a fair share must survive.
    assert summary.steps["model"].counts["points"] == result.sizes["space"]
    assert result.sizes["space"] > 0.1 * selected
    assert np.isfinite(result["velocity"].values).all()
    assert np.isfinite(result["displacement"].values).all()


@pytest.mark.slow
def test_local_cluster_run_survives_a_worker_killed_mid_step(reference, tmp_path):
    """A LocalCluster worker is SIGKILLed while the chain step runs: the run completes, the
    nanny replaces the worker, and the result equals the undisturbed threads run."""
    import threading

    import psutil

    workspace = tmp_path / "local-killed"
    config = parse_config(config_data(workspace, scheduler="local", workers=2, threads=1))
    selection_done = manifest_path(workspace, "selection")
    killed: list[int] = []

    def kill_a_worker_when_the_chain_starts():
        deadline = time.monotonic() + 120
        while not selection_done.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        # the nannies live in this process and spawn one worker process each
        workers = [p for p in psutil.Process().children()
                   if "spawn_main" in " ".join(p.cmdline())]
        if workers:
            workers[0].kill()
            killed.append(workers[0].pid)

    killer = threading.Thread(target=kill_a_worker_when_the_chain_starts, daemon=True)
    killer.start()
    summary = run_pipeline(config, progress=False)
    killer.join(timeout=5)
    assert killed, "no worker process was found to kill"
    assert summary.steps["model"].status == "ran"
    assert_same_result(workspace, reference)
