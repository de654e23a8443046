"""A run leaves only its products: no writer's lock file stays behind, after a
successful, a failed or an interrupted run, and ``depsi info`` summarises a workspace."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import depsi.io.lock as lock_module
from depsi.cli import main
from depsi.io import save_stm
from depsi.io.lock import lock_path, write_lock
from depsi.pipeline.steps import STEP_NAMES as STEPS
from depsi.pipeline.steps import network, selection


def write_config(folder: Path) -> Path:
    config = {"input": {"simulate": {"shape": [40, 40], "n_epochs": 20, "seed": 1}},
              "output": {"workspace": str(folder / "ws"), "exports": ["csv"]}}
    path = folder / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def lock_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if "lock" in p.name)


@pytest.fixture(scope="module")
def finished_workspace(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    assert main(["run", str(write_config(folder)), "--no-progress"]) == 0
    return folder / "ws"


@pytest.mark.slow
def test_a_finished_run_leaves_no_lock_file(finished_workspace):
    assert (finished_workspace / "stm.zarr").is_dir()
    assert lock_files(finished_workspace) == []


@pytest.mark.parametrize("fault", [RuntimeError("disk on fire"), KeyboardInterrupt()],
                         ids=["failed", "interrupted"])
def test_a_failed_or_interrupted_run_leaves_no_lock_file(tmp_path, monkeypatch, fault):
    def failing_selection(inputs, config, context):
        with write_lock(tmp_path / "ws" / "ps.zarr"):  # fails while holding a writer's lock
            raise fault

    monkeypatch.setattr(selection, "run", failing_selection)
    assert main(["run", str(write_config(tmp_path)), "--no-progress"]) != 0
    assert (tmp_path / "ws" / "stack.zarr").is_dir()  # the steps before it did run
    assert lock_files(tmp_path / "ws") == []


@pytest.mark.slow
def test_info_of_a_workspace_summarises_the_run(finished_workspace, capsys):
    assert main(["info", str(finished_workspace)]) == 0
    out = capsys.readouterr().out
    for step in STEPS:
        assert f"  {step:<13} finished" in out
    model = json.loads((finished_workspace / "model.done.json").read_text())
    assert model["run_id"] in out and model["config_hash"][:16] in out
    assert f"points {model['counts']['points']}" in out
    assert f"result: {finished_workspace / 'stm.zarr'}" in out
    assert f"log: {finished_workspace / 'depsi.log'}" in out
    assert "points.csv" in out
    assert "lock" not in out


def test_info_of_a_failed_workspace_shows_the_missing_steps(tmp_path, monkeypatch, capsys):
    def failing_network(inputs, config, context):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(network, "run", failing_network)
    assert main(["run", str(write_config(tmp_path)), "--no-progress"]) != 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "ws")]) == 0
    out = capsys.readouterr().out
    assert "2 of 9 steps finished" in out
    assert "  selection     finished" in out and "  network       failed" in out
    assert "RuntimeError: disk on fire" in out and "  arcs          missing" in out
    assert "result: none yet" in out


def test_info_of_a_store_indents_a_multi_line_history(tmp_path, capsys):
    ds = xr.Dataset({"amplitude": (("space", "time"), np.ones((4, 2), "f4"))},
                    coords={"time": np.array(["2021-01-01", "2021-01-13"], "datetime64[ns]"),
                            "azimuth": ("space", np.arange(4)), "range": ("space", np.arange(4))},
                    attrs={"history": "simulated\nps_selection(method='nad')", "wavelength": 0.05})
    assert main(["info", str(save_stm(ds, tmp_path / "ps.zarr"))]) == 0
    out = capsys.readouterr().out
    assert "  history:\n    simulated\n    ps_selection(method='nad')\n" in out
    assert "  wavelength: 0.05\n" in out


# ------------------------------------------------------------------------ the lock itself
@pytest.mark.parametrize("kind", ["flock", "soft"])
def test_the_lock_file_exists_only_while_held(tmp_path, kind):
    with write_lock(tmp_path / "ps.zarr", kind=kind, timeout=1) as held:
        assert held.exists()
    assert not held.exists()
    with pytest.raises(ValueError), write_lock(tmp_path / "ps.zarr", kind=kind, timeout=1):
        raise ValueError("the block fails")
    assert list(tmp_path.iterdir()) == []


def test_a_waiter_on_a_removed_lock_file_does_not_become_a_second_holder(tmp_path,
                                                                          monkeypatch):
    """The race unlink-on-release opens: a waiter that opened the file before the holder
    removed it gets a flock on that removed file; it must see that the path now names another
    file (a new holder's) and try again instead of holding too."""
    target = tmp_path / "ps.zarr"
    with write_lock(target, timeout=1):
        stale = lock_module._open_lock_file(lock_path(target))  # the waiter's open
    with write_lock(target, timeout=1):  # a new holder, on a new file at the path
        monkeypatch.setattr(lock_module, "_open_lock_file", lambda path: stale)
        assert lock_module._try_flock(lock_path(target)) is None
    assert not lock_path(target).exists()
    with pytest.raises(OSError):  # the waiter's descriptor was closed, not leaked
        lock_module.os.fstat(stale[0])


def test_threads_contending_for_one_lock_never_both_hold_it(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "POLL_SECONDS", 0.0005)  # many re-tries on new files
    target, inside, overlaps, entries = tmp_path / "ps.zarr", [0], [], []
    guard = threading.Lock()

    def writer(iterations: int) -> None:
        for _ in range(iterations):
            with write_lock(target, timeout=5):
                with guard:
                    inside[0] += 1
                    if inside[0] > 1:
                        overlaps.append(inside[0])
                time.sleep(0.0002)
                with guard:
                    inside[0] -= 1
                    entries.append(1)

    began = time.monotonic()
    threads = [threading.Thread(target=writer, args=(150,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert time.monotonic() - began < 5
    assert overlaps == [] and len(entries) == 600
    assert not lock_path(target).exists()
