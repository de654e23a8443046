"""Faults met by the exports, and sizes checked against what the machine and the disk hold.

A full disk is simulated by raising, inside a writer, the exception its driver raises on one
(the tests run as root, where a file system cannot be filled without mounting one).
"""

from __future__ import annotations

import errno
import json
import shutil
import time
from pathlib import Path

import geopandas as gpd
import numpy as np
import pyogrio.errors
import pytest
import xarray as xr
import yaml

import depsi.io.export as export
import depsi.pipeline.preflight as preflight
from depsi.cli import main
from depsi.errors import ExitCode, classify
from depsi.pipeline.config import parse_config
from depsi.pipeline.preflight import ResourceLimitError, check_disk, check_feasible
from depsi.pipeline.runner import manifest_path

SIMULATE = {"shape": [30, 30], "n_epochs": 8, "seed": 1}


def write_config(folder: Path, workspace: Path, exports: list[str]) -> Path:
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump({"input": {"simulate": dict(SIMULATE)},
                                    "output": {"workspace": str(workspace),
                                               "exports": exports}}))
    return path


@pytest.fixture(scope="module")
def modelled(tmp_path_factory) -> Path:
    """A workspace whose steps up to the model have finished."""
    folder = tmp_path_factory.mktemp("modelled")
    workspace = folder / "ws"
    assert main(["run", str(write_config(folder, workspace, [])), "--to", "model",
                 "--no-progress"]) == 0
    return workspace


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line]


def result_stm(n: int = 5) -> xr.Dataset:
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {"velocity": ("space", rng.normal(size=n)),
         "height_error": ("space", rng.normal(size=n)),
         "temporal_coherence": ("space", rng.uniform(size=n)),
         "displacement": (("space", "time"), rng.normal(size=(n, 2)))},
        coords={"time": np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]"),
                "azimuth": ("space", np.arange(n)), "range": ("space", np.arange(n)),
                "lat": ("space", 52 + rng.uniform(size=n) / 100),
                "lon": ("space", 4 + rng.uniform(size=n) / 100)})


def gpkg_driver_fails(monkeypatch, message: str) -> None:
    """GDAL's GeoPackage driver fails part-way with ``message`` (pyogrio's exception)."""

    def failing(frame, path, *args, **kwargs):
        Path(path).write_bytes(b"SQLite format 3\0 half a table")
        Path(f"{path}-journal").write_bytes(b"journal")
        raise pyogrio.errors.FeatureError(message)

    monkeypatch.setattr(gpd.GeoDataFrame, "to_file", failing)


# ---------------------------------------------------------------------- a full disk in exports
@pytest.mark.slow
def test_disk_full_in_the_geopackage_export_exits_3_naming_the_file(tmp_path, modelled,
                                                                   console, monkeypatch):
    workspace = tmp_path / "ws"
    shutil.copytree(modelled, workspace)
    config = write_config(tmp_path, workspace, ["csv", "gpkg"])
    gpkg_driver_fails(monkeypatch, "Could not add feature to layer at index 0: "
                                   "sqlite3_exec(...) failed: No space left on device")
    assert main(["run", str(config), "--resume", "--no-progress"]) == ExitCode.DISK_FULL
    text = console()
    [line] = error_lines(text)
    assert "disk full (ENOSPC" in line and "points.gpkg" in line, line
    assert "while writing exports" in line and f"depsi run {config} --resume" in line, line
    assert "Traceback" not in text
    assert not (workspace / "exports").exists()
    assert not list(workspace.glob(".exports.*"))
    monkeypatch.undo()
    assert main(["run", str(config), "--resume", "--no-progress"]) == 0
    assert sorted(p.name for p in (workspace / "exports").iterdir()) == ["points.csv",
                                                                        "points.gpkg"]


def test_a_driver_error_on_a_full_file_system_is_disk_full(tmp_path, monkeypatch):
    # SQLite on a full disk may say only that it could not create its tables
    gpkg_driver_fails(monkeypatch, "sqlite3_exec(...) failed: no such table: gpkg_contents")
    monkeypatch.setattr(export, "_free_bytes", lambda folder: 4096)
    path = tmp_path / "points.gpkg"
    with pytest.raises(OSError) as raised:
        export.to_geopackage(result_stm(), path)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert classify(raised.value)[0] == ExitCode.DISK_FULL
    assert list(tmp_path.iterdir()) == []  # neither the half-written file nor its journal


def test_a_driver_error_with_space_left_stays_what_it_was(tmp_path, monkeypatch):
    gpkg_driver_fails(monkeypatch, "sqlite3_exec(...) failed: no such table: gpkg_contents")
    monkeypatch.setattr(export, "_free_bytes", lambda folder: 1 << 40)
    with pytest.raises(pyogrio.errors.FeatureError):
        export.to_geopackage(result_stm(), tmp_path / "points.gpkg")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_that_names_no_file_is_given_the_export_file(tmp_path, monkeypatch):
    def failing(table, path, **kwargs):
        Path(path).write_text("pnt_id,lat")
        raise OSError(errno.ENOSPC, "No space left on device")  # as a buffered flush raises

    monkeypatch.setattr(export.pd.DataFrame, "to_csv", failing)
    path = tmp_path / "points.csv"
    with pytest.raises(OSError) as raised:
        export.to_csv(result_stm(), path)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    code, message = classify(raised.value)
    assert code == ExitCode.DISK_FULL and f"at '{path}'" in message
    assert list(tmp_path.iterdir()) == []


def test_a_quota_exceeded_in_a_driver_message_is_edquot(tmp_path, monkeypatch):
    gpkg_driver_fails(monkeypatch, "Write error: Disk quota exceeded")
    with pytest.raises(OSError) as raised:
        export.to_geopackage(result_stm(), tmp_path / "q.gpkg")
    assert raised.value.errno == errno.EDQUOT


# ------------------------------------------------------------ the disk a resume needs
def nearly_full_disk(monkeypatch) -> int:
    """The workspace's file system has room for exports but not for the simulated stack."""
    free = 10**4  # the stack needs 30 x 30 x 8 x 12 bytes
    monkeypatch.setattr(preflight, "_free_disk", lambda folder: free)
    return free


@pytest.mark.slow
def test_a_resume_that_only_exports_is_not_refused_for_the_stack(tmp_path, modelled,
                                                                monkeypatch):
    workspace = tmp_path / "ws"
    shutil.copytree(modelled, workspace)
    config = write_config(tmp_path, workspace, ["csv"])
    nearly_full_disk(monkeypatch)
    assert main(["run", str(config), "--resume", "--no-progress"]) == 0
    assert (workspace / "exports" / "points.csv").is_file()


@pytest.mark.slow
def test_a_resume_that_redoes_the_stack_is_refused_naming_the_bytes(tmp_path, modelled,
                                                                   console, monkeypatch):
    workspace = tmp_path / "ws"
    shutil.copytree(modelled, workspace)
    manifest_path(workspace, "stack").unlink()
    config = write_config(tmp_path, workspace, ["csv"])
    free = nearly_full_disk(monkeypatch)
    assert main(["run", str(config), "--resume", "--no-progress"]) == ExitCode.RESOURCE_LIMIT
    [line] = error_lines(console())
    assert "input.simulate.shape" in line and f"at most the {free} bytes free" in line, line


def test_check_disk_counts_only_the_steps_that_will_run(monkeypatch):
    free = nearly_full_disk(monkeypatch)
    config = parse_config({"input": {"simulate": dict(SIMULATE)}})
    assert check_disk(config, ["export"]) == {}
    with pytest.raises(ResourceLimitError, match=rf"needs \d+ bytes on disk; .* {free} bytes"):
        check_disk(config, ["stack", "selection"])
    assert "simulated" not in check_feasible(config, steps=())


# ------------------------------------------------------------------------ sizes against the scene
def write_slc_store(path: Path, shape: tuple[int, int], n_epochs: int,
                    chunks: dict[str, int]) -> np.ndarray:
    rng = np.random.default_rng(3)
    slc = (rng.normal(size=(*shape, n_epochs))
           + 1j * rng.normal(size=(*shape, n_epochs))).astype(np.complex64)
    dates = np.datetime64("2020-01-01") + 12 * np.arange(n_epochs)
    xr.Dataset({"complex": (("azimuth", "range", "time"), slc)},
               coords={"time": dates.astype("datetime64[ns]")},
               attrs={"wavelength": 0.0555}).chunk(chunks).to_zarr(path, zarr_format=2)
    return slc


def test_a_store_in_one_pixel_chunks_is_read_in_blocks_of_many(tmp_path):
    from depsi.io.slc_zarr import open_slc_zarr

    slc = write_slc_store(tmp_path / "slc.zarr", (40, 30), 3, {"azimuth": 1, "range": 1})
    ds = open_slc_zarr(tmp_path / "slc.zarr")
    assert ds["complex"].data.numblocks == (1, 1, 1)  # not 40 x 30 tasks of one pixel
    np.testing.assert_array_equal(ds["complex"].values, slc)


def test_a_store_in_large_chunks_keeps_them(tmp_path, monkeypatch):
    import depsi.io.slc_zarr as slc_zarr

    monkeypatch.setattr(slc_zarr, "MIN_STORED_BLOCK_BYTES", 8 * 4 * 10 * 10)
    monkeypatch.setattr(slc_zarr, "MAX_STORED_BLOCKS", 1)
    write_slc_store(tmp_path / "slc.zarr", (24, 20), 4, {"azimuth": 12, "range": 10})
    ds = slc_zarr.open_slc_zarr(tmp_path / "slc.zarr")
    assert ds["complex"].chunks[:2] == ((12, 12), (10, 10))


def claim_elements(store: Path, name: str, n: int) -> None:
    """Edit an array's metadata to claim ``n`` elements along its one dimension."""
    metadata = store / name / "zarr.json"
    document = json.loads(metadata.read_text())
    document["shape"] = [n]
    metadata.write_text(json.dumps(document))


@pytest.mark.parametrize("whole", [True, False], ids=["written whole", "of another writer"])
def test_a_point_store_claiming_a_trillion_elements_is_refused_with_the_numbers(tmp_path,
                                                                               whole):
    from depsi.io.store import STORE_ATTR, StoreIntegrityError, open_stm, save_stm

    store = tmp_path / "ps.zarr"
    save_stm(result_stm(10), store)
    if not whole:
        root = json.loads((store / "zarr.json").read_text())
        root["attributes"].pop(STORE_ATTR)
        (store / "zarr.json").write_text(json.dumps(root))
    for name in ("velocity", "azimuth", "range"):
        claim_elements(store, name, 10**12)
    began = time.perf_counter()
    variable = r"'(velocity|azimuth|range)'"
    expected = variable + (r".*expected all 100000000000 chunks of a store written whole, "
                           r"found 1" if whole else
                           r".*claim shape \(1000000000000,\) \(8000000000000 bytes\), its "
                           r"chunk files hold \d+ bytes; expected at most 1000")
    with pytest.raises(StoreIntegrityError, match=expected):
        open_stm(store)
    assert time.perf_counter() - began < 5.0


def test_a_point_store_with_variables_chunked_differently_opens_with_one_chunking(tmp_path):
    from depsi.io.store import open_stm

    result = result_stm(12)
    encoding = {"velocity": {"chunks": (4,)}, "height_error": {"chunks": (5,)},
                "displacement": {"chunks": (3, 2)}, "azimuth": {"chunks": (6,)}}
    result.to_zarr(tmp_path / "ps.zarr", zarr_format=3, encoding=encoding)
    ds = open_stm(tmp_path / "ps.zarr")
    assert dict(ds.chunks) == {"space": (3, 3, 3, 3), "time": (2,)}  # the largest variable's
    mean = ds.map_blocks(lambda block: block.mean("time")).compute()
    np.testing.assert_allclose(mean["displacement"], result["displacement"].mean("time"))


def test_an_slc_store_with_variables_chunked_differently_opens_with_one_chunking(tmp_path):
    from depsi.io.slc_zarr import open_slc_zarr

    write_slc_store(tmp_path / "slc.zarr", (24, 20), 4, {"azimuth": 12, "range": 10})
    lat = xr.Dataset({"lat": (("azimuth", "range"), np.full((24, 20), 52.0)),
                      "h2ph": (("azimuth", "range", "time"), np.ones((24, 20, 4), "f4"))})
    lat.chunk({"azimuth": 8, "range": 5}).to_zarr(tmp_path / "slc.zarr", mode="a")
    ds = open_slc_zarr(tmp_path / "slc.zarr")
    assert dict(ds.chunks) == {"azimuth": (12, 12), "range": (10, 10), "time": (4,)}
    assert float(ds["h2ph"].sum()) == 24 * 20 * 4
