"""Store safety against real processes: writers SIGKILLed at every stage of
``append_epochs`` and ``save_stm``, two writers at once, and a store damaged on disk.

Every killed write is followed by a reader: the store must open as exactly the old or exactly the
new content, never a mix, and retrying the same write must finish it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from depsi.io import append_epochs, open_stm, save_stm
from depsi.io.lock import StoreLockedError, write_lock
from depsi.io.store import JOURNAL, STAGING, StoreIntegrityError, verify_store

ROOT = Path(__file__).resolve().parents[1]
DATES = np.arange("2020-01-01", "2021-01-01", 12, dtype="datetime64[D]").astype("datetime64[ns]")


def point_stm(n=300, t=8, seed=0):
    rng = np.random.default_rng(seed)
    position = rng.permutation(n)
    az, rg = position // 29, position % 29
    slc = (rng.normal(size=(n, t)) + 1j * rng.normal(size=(n, t))).astype("c8")
    return xr.Dataset(
        {"complex": (("space", "time"), slc), "amplitude": (("space", "time"), np.abs(slc)),
         "h2ph": (("space", "time"), rng.normal(size=(n, t)).astype("f4"))},
        coords={"time": DATES[:t], "azimuth": ("space", az), "range": ("space", rg),
                "lat": ("space", 52 + az * 1e-4), "lon": ("space", 4 + rg * 1e-4)},
        attrs={"wavelength": 0.0555})


def contents(ds: xr.Dataset) -> dict[str, np.ndarray]:
    return {name: np.asarray(var.values) for name, var in ds.variables.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def is_same(a: dict, b: dict) -> bool:
    try:
        assert_same(a, b)
    except AssertionError:
        return False
    return True


_WRITER = """
import os, sys, time
sys.path.insert(0, {root!r})
from depsi.io import append_epochs, open_stm, save_stm
import depsi.io.store as store
mode, path, source = sys.argv[1], sys.argv[2], sys.argv[3]
if os.environ.get("NO_EXCHANGE"):
    store._exchange = lambda a, b: False
new = open_stm(source).load()
if mode == "append":
    append_epochs(path, new, lock_timeout=60)
elif mode == "append-failing":
    import dask.array as da
    def fail(block):
        time.sleep(0.5)
        raise RuntimeError("disk on fire")
    new["h2ph"] = new["h2ph"].copy(data=da.from_array(new["h2ph"].values, chunks=(50, -1))
                                    .map_blocks(fail, dtype="f4"))
    append_epochs(path, new, lock_timeout=60)
elif mode == "save":
    save_stm(new, path, overwrite=True, chunk_bytes=4000, lock_timeout=60)
print("done")
"""


def run_writer(mode: str, path: Path, source: Path, *, fault: str | None = None,
               env: dict | None = None, wait: bool = True):
    script = _WRITER.format(root=str(ROOT))
    environment = {**os.environ, **(env or {})}
    if fault:
        environment["DEPSI_FAULT_AT"] = fault
    process = subprocess.Popen([sys.executable, "-c", script, mode, str(path), str(source)],
                               env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if not wait:
        return process
    out, err = process.communicate(timeout=120)
    return process.returncode, out + err


@pytest.fixture(scope="module")
def epochs(tmp_path_factory):
    """Stores of the STM's epochs: 0-3 (old), 3-5 and 5-6 (appends), 0-5 and 0-6 (truths)."""
    folder = tmp_path_factory.mktemp("epochs")
    full = point_stm()
    stores = {}
    for name, part in {"old": slice(0, 3), "first": slice(3, 5), "second": slice(5, 6),
                       "after_first": slice(0, 5), "after_second": slice(0, 6),
                       "other": slice(5, 8)}.items():
        stores[name] = save_stm(full.isel(time=part), folder / f"{name}.zarr", chunk_bytes=4000)
    return stores


#: Named points of append_epochs at which the writer SIGKILLs itself, and what a reader must
#: see afterwards: the old store (rolled back) or the new one (published, completed on open).
APPEND_STAGES = {
    "append:journal": "old", "append:staged-one": "old", "append:staged": "old",
    "append:publishing": "new", "append:moving": "new", "append:moved": "new",
    "append:metadata": "new", "append:before-commit": "new", "append:committed": "new",
}


@pytest.mark.parametrize("scenario", ["new-chunk", "partial-chunk"])
@pytest.mark.parametrize("stage", list(APPEND_STAGES))
@pytest.mark.slow
def test_append_killed_at_any_stage_leaves_old_or_new_and_retry_finishes(
        epochs, tmp_path, stage, scenario):
    path = tmp_path / "ps.zarr"
    if scenario == "new-chunk":  # 3 epochs in one time chunk of 3; the append opens chunk 1
        shutil.copytree(epochs["old"], path)
        source, old, new = epochs["first"], epochs["old"], epochs["after_first"]
    else:  # 5 epochs, chunk 1 holds 3..4: the append rewrites that partly filled chunk
        shutil.copytree(epochs["old"], path)
        append_epochs(path, open_stm(epochs["first"]))
        source, old, new = epochs["second"], epochs["after_first"], epochs["after_second"]
    old_values, new_values = contents(open_stm(old)), contents(open_stm(new))

    code, output = run_writer("append", path, source, fault=stage)
    assert code == -signal.SIGKILL, output

    seen = contents(open_stm(path))
    expected = old_values if APPEND_STAGES[stage] == "old" else new_values
    assert_same(seen, expected)
    assert not (path / JOURNAL).exists() and not (path / STAGING).exists()
    verify_store(path)

    # the same append, retried (here, not in a second process: nothing kills it, and the
    # writer's import costs about 3 s of each of these 18 cases)
    append_epochs(path, open_stm(source).load(), lock_timeout=60)
    assert_same(contents(open_stm(path)), new_values)


@pytest.mark.parametrize("trial", range(6))
@pytest.mark.slow
def test_append_killed_at_a_random_moment_leaves_old_or_new(epochs, tmp_path, trial):
    """SIGKILL from outside after a random delay, whatever the writer is doing then."""
    path = tmp_path / "ps.zarr"
    shutil.copytree(epochs["old"], path)
    old_values = contents(open_stm(epochs["old"]))
    new_values = contents(open_stm(epochs["after_first"]))
    process = run_writer("append", path, epochs["first"], wait=False)
    time.sleep(np.random.default_rng(trial).uniform(0.8, 2.5))
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    seen = contents(open_stm(path))
    assert is_same(seen, old_values) or is_same(seen, new_values)
    assert run_writer("append", path, epochs["first"])[0] == 0
    assert_same(contents(open_stm(path)), new_values)


@pytest.mark.parametrize("stage,exchange", [("save:written", True), ("save:written", False),
                                            ("move:old-aside", False)])
@pytest.mark.slow
def test_save_over_a_store_killed_leaves_the_old_one_and_no_siblings(epochs, tmp_path, stage,
                                                                      exchange):
    path = tmp_path / "ps.zarr"
    shutil.copytree(epochs["old"], path)
    old_values = contents(open_stm(path))
    code, output = run_writer("save", path, epochs["other"], fault=stage,
                              env={} if exchange else {"NO_EXCHANGE": "1"})
    assert code == -signal.SIGKILL, output
    assert_same(contents(open_stm(path)), old_values)  # restored when it had been set aside
    assert run_writer("save", path, epochs["other"])[0] == 0
    assert_same(contents(open_stm(path)), contents(open_stm(epochs["other"])))
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith("-lock")] == ["ps.zarr"]


# ---------------------------------------------------------------------------- two writers
@pytest.mark.parametrize("trial", range(4))
@pytest.mark.slow
def test_two_processes_appending_the_same_epochs_never_duplicate(epochs, tmp_path, trial):
    path = tmp_path / "ps.zarr"
    shutil.copytree(epochs["old"], path)
    writers = [run_writer("append", path, epochs["first"], wait=False) for _ in range(2)]
    results = [(w.wait(timeout=120), w.communicate()) for w in writers]
    assert [code for code, _ in results] == [0, 0], results  # the second finds it done
    assert_same(contents(open_stm(path)), contents(open_stm(epochs["after_first"])))


@pytest.mark.parametrize("trial", range(4))
@pytest.mark.slow
def test_two_processes_appending_different_epochs_never_interleave(epochs, tmp_path, trial):
    path = tmp_path / "ps.zarr"
    shutil.copytree(epochs["old"], path)
    first = run_writer("append", path, epochs["first"], wait=False)
    later = run_writer("append", path, epochs["other"], wait=False)
    codes = [first.wait(timeout=120), later.wait(timeout=120)]
    first.communicate(), later.communicate()
    stored = open_stm(path)
    times = stored["time"].values
    assert (np.diff(times) > np.timedelta64(0)).all()
    truth = point_stm().sel(time=times)
    truth = truth.isel(space=np.lexsort((truth["range"].values, truth["azimuth"].values)))
    back = np.lexsort((stored["range"].values, stored["azimuth"].values))
    np.testing.assert_array_equal(stored["complex"].values[back], truth["complex"].values)
    # either order is fine; a refused writer says why and changed nothing
    assert codes in ([0, 0], [0, 1], [1, 0])
    assert times.size == {(0, 0): 8, (0, 1): 5, (1, 0): 6}[tuple(codes)]


@pytest.mark.parametrize("trial", range(3))
@pytest.mark.slow
def test_a_failed_append_does_not_remove_another_writers_epochs(epochs, tmp_path, trial):
    path = tmp_path / "ps.zarr"
    shutil.copytree(epochs["old"], path)
    failing = run_writer("append-failing", path, epochs["first"], wait=False)
    good = run_writer("append", path, epochs["first"], wait=False)
    failed_code, good_code = failing.wait(timeout=120), good.wait(timeout=120)
    failing.communicate(), good.communicate()
    assert good_code == 0
    assert_same(contents(open_stm(path)), contents(open_stm(epochs["after_first"])))
    assert failed_code in (0, 1)  # 0: it ran second and found the epochs already appended


@pytest.mark.slow
def test_a_second_writer_waits_then_names_the_lock(epochs, tmp_path):
    path = tmp_path / "ps.zarr"
    shutil.copytree(epochs["old"], path)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time; sys.path.insert(0, {str(ROOT)!r})
        from depsi.io.lock import write_lock
        with write_lock({str(path)!r}):
            print("held", flush=True); time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        began = time.monotonic()
        with pytest.raises(StoreLockedError, match=r"ps\.zarr.*expected no other writer"):
            append_epochs(path, open_stm(epochs["first"]), lock_timeout=0.5)
        assert time.monotonic() - began >= 0.5
        assert open_stm(path).sizes["time"] == 3
        holder.send_signal(signal.SIGKILL)  # the kernel drops a dead holder's lock
        holder.wait(timeout=30)
        append_epochs(path, open_stm(epochs["first"]), lock_timeout=10)
        assert open_stm(path).sizes["time"] == 5
    finally:
        holder.kill()
        holder.wait()


def test_soft_lock_also_excludes_a_second_writer(tmp_path):
    with write_lock(tmp_path / "ps.zarr", kind="soft", timeout=1):
        with write_lock(tmp_path / "ps.zarr", kind="soft", timeout=1):  # re-entrant
            pass
        script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                  f"from depsi.io.lock import write_lock\n"
                  f"with write_lock({str(tmp_path / 'ps.zarr')!r}, kind='soft', timeout=0.3):"
                  f" pass\n")
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert done.returncode == 1 and "StoreLockedError" in done.stderr


# -------------------------------------------------------------------------------- integrity
def test_every_array_carries_a_crc32c_checksum(epochs):
    import json

    for meta in Path(epochs["old"]).glob("*/zarr.json"):
        codecs = [c["name"] for c in json.loads(meta.read_text())["codecs"]]
        assert codecs[-1] == "crc32c", meta


def _chunk_files(path: Path, name: str) -> list[Path]:
    return sorted(p for p in (path / name / "c").rglob("*") if p.is_file())


def test_a_truncated_chunk_raises_naming_variable_and_chunk(epochs, tmp_path):
    path = Path(shutil.copytree(epochs["old"], tmp_path / "ps.zarr"))
    chunk = _chunk_files(path, "complex")[1]
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    ds = open_stm(path)  # opening reads no chunk data
    with pytest.raises(StoreIntegrityError, match=r"variable 'complex', chunk.*checksum"):
        _ = ds["complex"].values
    with pytest.raises(StoreIntegrityError, match="'complex'"):
        verify_store(path)


def test_a_flipped_byte_raises(epochs, tmp_path):
    path = Path(shutil.copytree(epochs["old"], tmp_path / "ps.zarr"))
    chunk = _chunk_files(path, "amplitude")[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreIntegrityError, match="'amplitude'"):
        _ = open_stm(path)["amplitude"].values


def test_a_missing_chunk_of_a_complete_store_raises_instead_of_reading_fill(epochs, tmp_path):
    path = Path(shutil.copytree(epochs["old"], tmp_path / "ps.zarr"))
    _chunk_files(path, "azimuth")[0].unlink()
    with pytest.raises(StoreIntegrityError, match=r"'azimuth'.*expected all \d+ chunks"):
        open_stm(path)


def test_a_chunk_removed_after_opening_raises_when_read(epochs, tmp_path):
    path = Path(shutil.copytree(epochs["old"], tmp_path / "ps.zarr"))
    ds = open_stm(path)
    _chunk_files(path, "h2ph")[-1].unlink()
    with pytest.raises(StoreIntegrityError, match=r"variable 'h2ph', chunk .*found none"):
        _ = ds["h2ph"].values


def test_an_all_nan_chunk_is_written_and_reads_back(tmp_path):
    ds = point_stm()
    ds["h2ph"] = ds["h2ph"].where(ds["space"] > 1000)  # all NaN: zarr would skip such chunks
    path = save_stm(ds, tmp_path / "ps.zarr", chunk_bytes=4000)
    assert np.isnan(open_stm(path)["h2ph"].values).all()
    assert verify_store(path)["h2ph"] > 1


def test_info_verify_checks_every_chunk(epochs, tmp_path, capsys):
    from depsi.cli import main

    path = Path(shutil.copytree(epochs["old"], tmp_path / "ps.zarr"))
    assert main(["info", str(path), "--verify"]) == 0
    assert "verified:" in capsys.readouterr().out
    chunk = _chunk_files(path, "lat")[0]
    chunk.write_bytes(chunk.read_bytes()[:-3])
    assert main(["info", str(path)]) == 0  # without --verify no chunk is read
    assert main(["info", str(path), "--verify"]) == 2


def test_an_array_whose_metadata_is_gone_is_not_silently_dropped(epochs, tmp_path):
    path = Path(shutil.copytree(epochs["old"], tmp_path / "ps.zarr"))
    (path / "azimuth" / "zarr.json").unlink()
    with pytest.raises(StoreIntegrityError, match=r"arrays \['azimuth'\].*no metadata"):
        open_stm(path)
