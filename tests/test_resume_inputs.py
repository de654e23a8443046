"""``depsi run --resume`` after the input files changed, and after a manifest was damaged.

A resumed run on a changed input must give what a fresh run on that input gives, and say which
file changed; a damaged manifest redoes its step with a warning, never a traceback. Every case
copies one finished workspace per format, kept with relative paths (so the copy's config and
manifests are those of the original), changes one thing and resumes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from depsi.cli import main
from depsi.io import open_stm
from depsi.pipeline import parse_config, run_pipeline
from depsi.pipeline.fingerprint import input_changes, input_fingerprint, sampled_hash
from depsi.pipeline.runner import manifest_path, verify_workspace
from depsi.simulate import write_stack, write_stack_binary

SCENE = {"shape": (40, 40), "n_epochs": 8, "seed": 5}
#: The mother epoch of SCENE's stacks (kept in every case); SPARE is left out of the first run
#: (to be added), GONE removed, SWAPPED and DONOR exchange rasters.
DATES = ["20200101", "20200113", "20200125", "20200206", "20200218", "20200301", "20200313",
         "20200325"]
MOTHER, SPARE, GONE, SWAPPED, DONOR = DATES[4], DATES[6], DATES[1], DATES[2], DATES[3]

#: Per format: the files of one epoch (relative to the stack), its SLC and its h2ph raster.
LAYOUT = {
    "binary": {"epoch": lambda d: [f"slc_{d}.raw", f"h2ph_{d}.raw", f"slave_{d}.res",
                                   f"ifgs_{d}.res"],
               "slc": "slc_{}.raw", "h2ph": "h2ph_{}.raw"},
    "doris": {"epoch": lambda d: [d], "slc": "{}/slave_rsmp_reramped.raw",
              "h2ph": "{}/h2ph_srd.raw"},
    "gamma": {"epoch": lambda d: [f"r{d}.rslc", f"r{d}.rslc.par"], "slc": "r{}.rslc",
              "h2ph": None},
}


def _config(workspace="ws", fmt="binary"):
    """The configuration of a case, its paths relative to the case's folder."""
    return parse_config({"input": {"format": fmt, "path": "stack"},
                         "output": {"workspace": workspace, "exports": []},
                         "compute": {"scheduler": "threads", "threads": 2}})


def _move_epoch(fmt, date, source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in LAYOUT[fmt]["epoch"](date):
        shutil.move(source / name, target / name)


def _template(root: Path, fmt: str, stop: str) -> Path:
    """A stack (SPARE set aside in ``spare/``) and its workspace run up to ``stop``."""
    if fmt == "binary":
        write_stack_binary(root / "stack", progress=False, **SCENE)
    else:
        write_stack(root / "stack", format=fmt, **SCENE)
    _move_epoch(fmt, SPARE, root / "stack", root / "spare")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        run_pipeline(_config("ws", fmt), stop=stop, progress=False)
    return root


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    made: dict[tuple[str, str], Path] = {}

    def get(fmt: str, stop: str = "selection") -> Path:
        if (fmt, stop) not in made:
            made[fmt, stop] = _template(tmp_path_factory.mktemp(f"{fmt}-{stop}"), fmt, stop)
        return made[fmt, stop]

    return get


@pytest.fixture
def copy_of(templates, tmp_path, monkeypatch):
    """A copy of a finished template (mtimes kept), the working folder moved into it."""
    def copy(fmt: str, stop: str = "selection") -> Path:
        root = tmp_path / "case"
        shutil.copytree(templates(fmt, stop), root)
        monkeypatch.chdir(root)
        return root

    return copy


# ------------------------------------------------------------------------------- the changes
def _replace_keeping_mtime(path: Path, data: bytes) -> None:
    stat = path.stat()
    assert len(data) == stat.st_size and data != path.read_bytes()
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def change_slc(root: Path, fmt: str) -> str:
    """One epoch's SLC overwritten by another's bytes: same size, same mtime."""
    pattern = LAYOUT[fmt]["slc"]
    _replace_keeping_mtime(root / "stack" / pattern.format(SWAPPED),
                           (root / "stack" / pattern.format(DONOR)).read_bytes())
    return f"{pattern.format(SWAPPED)} (content)"


def change_h2ph(root: Path, fmt: str) -> str:
    pattern = LAYOUT[fmt]["h2ph"]
    path = root / "stack" / pattern.format(SWAPPED)
    h2ph = np.fromfile(path, dtype="<f4")
    _replace_keeping_mtime(path, (h2ph * np.float32(1.5)).astype("<f4").tobytes())
    return f"{pattern.format(SWAPPED)} (content)"


#: The radar wavelength written instead of the simulated one, and its frequency (the readers
#: check that the two agree).
WAVELENGTH = 0.0562
FREQUENCY = 299792458.0 / WAVELENGTH


def change_wavelength(root: Path, fmt: str) -> str:
    """Every metadata file given another radar wavelength (and the matching frequency)."""
    changed = []
    for path in sorted((root / "stack").rglob("*")):
        if path.suffix not in (".res", ".par"):
            continue
        text = path.read_text()
        new = re.sub(r"(Radar_wavelength \(m\):\s+)\S+", rf"\g<1>{WAVELENGTH}", text)
        new = re.sub(r"(RADAR_FREQUENCY \(HZ\):\s+)\S+", rf"\g<1>{FREQUENCY!r}", new)
        new = re.sub(r"(radar_frequency:\s+)\S+", rf"\g<1>{FREQUENCY:.15e}", new)
        if new != text:
            path.write_text(new)
            changed.append(path.relative_to(root / "stack").as_posix())
    assert changed
    return f"{changed[0]} (content)"


def remove_epoch(root: Path, fmt: str) -> str:
    _move_epoch(fmt, GONE, root / "stack", root / "removed")
    return f"{LAYOUT[fmt]['epoch'](GONE)[0]}"  # a folder (doris) or the first file


def add_epoch(root: Path, fmt: str) -> str:
    _move_epoch(fmt, SPARE, root / "spare", root / "stack")
    return f"{LAYOUT[fmt]['epoch'](SPARE)[0]}"


CASES = [("binary", change_slc), ("binary", change_h2ph), ("binary", change_wavelength),
         ("binary", remove_epoch), ("binary", add_epoch),
         ("doris", change_slc), ("doris", change_h2ph), ("doris", change_wavelength),
         ("doris", remove_epoch),
         ("gamma", change_slc), ("gamma", change_wavelength), ("gamma", add_epoch)]


def _fresh(stop: str, fmt: str) -> xr.Dataset:
    """The product of ``stop`` from a fresh run on the input as it is now."""
    run_pipeline(_config("fresh", fmt), stop=stop, progress=False)
    return open_stm(Path("fresh") / ("stm.zarr" if stop == "model" else "ps.zarr")).compute()


@pytest.mark.parametrize("fmt, change", CASES,
                         ids=[f"{fmt}-{change.__name__}" for fmt, change in CASES])
@pytest.mark.slow
def test_resume_after_an_input_change_redoes_the_steps_and_names_the_file(copy_of, fmt,
                                                                         change):
    root = copy_of(fmt)
    before = open_stm(root / "ws" / "ps.zarr").compute()
    named = change(root, fmt)

    summary = run_pipeline(_config("ws", fmt), stop="selection", resume=True, progress=False)

    assert summary.steps["stack"].status == summary.steps["selection"].status == "ran"
    assert summary.steps["stack"].reason.startswith("input changed: ")
    assert named in summary.steps["stack"].reason
    assert "redone: input changed: " in summary.format()
    assert "step stack: redone (input changed: " in (root / "ws" / "depsi.log").read_text()
    resumed = open_stm(root / "ws" / "ps.zarr").compute()
    assert resumed.identical(_fresh("selection", fmt))
    assert not resumed.identical(before)


@pytest.mark.slow
def test_resume_after_an_slc_change_redoes_every_later_step_as_a_fresh_run(copy_of):
    """The SLC changed and resumed up to selection, then changed back and resumed to the end:
    every step is redone, and the result is the template's, a fresh run on that input."""
    root = copy_of("binary", stop="model")
    fresh = open_stm(root / "ws" / "stm.zarr").compute()
    path = root / "stack" / LAYOUT["binary"]["slc"].format(SWAPPED)
    original = path.read_bytes()
    change_slc(root, "binary")
    run_pipeline(_config(), stop="selection", resume=True, progress=False)
    _replace_keeping_mtime(path, original)

    summary = run_pipeline(_config(), resume=True, progress=False)

    assert {r.status for r in summary.steps.values()} == {"ran"}
    assert f"{path.name} (content)" in summary.steps["stack"].reason
    assert "was rewritten since" in summary.steps["model"].reason
    assert open_stm(root / "ws" / "stm.zarr").compute().identical(fresh)


def test_resume_with_unchanged_inputs_skips_even_with_new_mtimes_of_metadata(copy_of):
    root = copy_of("binary")
    for path in (root / "stack").glob("*.res"):
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 10**9))  # touched, not changed
    (root / "stack" / ".DS_Store").write_bytes(b"\0" * 10)
    summary = run_pipeline(_config(), stop="selection", resume=True, progress=False)
    assert summary.steps["stack"].status == summary.steps["selection"].status == "skipped"


# --------------------------------------------------------------------------- damaged manifests
def _drop_run_id(path: Path) -> None:
    manifest = json.loads(path.read_text())
    del manifest["run_id"]
    path.write_text(json.dumps(manifest))


DAMAGES = {"missing run_id": _drop_run_id,
           "not JSON": lambda path: path.write_text('{"version": 1, "run_id": '),
           "a JSON list": lambda path: path.write_text("[1, 2, 3]")}
DAMAGED = [(DAMAGES[kind], step) for kind, step in (("missing run_id", "selection"),
                                                    ("not JSON", "selection"),
                                                    ("a JSON list", "selection"),
                                                    ("missing run_id", "stack"))]


@pytest.mark.parametrize("damage, step", DAMAGED,
                         ids=["selection-missing run_id", "selection-not JSON",
                              "selection-a JSON list", "stack-missing run_id"])
def test_a_damaged_manifest_redoes_its_step_with_a_warning(copy_of, caplog, damage, step):
    root = copy_of("binary")
    damage(manifest_path(root / "ws", step))
    with caplog.at_level(logging.WARNING, logger="depsi.pipeline.runner"):
        summary = run_pipeline(_config(), stop="selection", resume=True, progress=False)
    assert summary.steps[step].status == summary.steps["selection"].status == "ran"
    if step == "selection":
        assert summary.steps["stack"].status == "skipped"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"manifest {step}.done.json is damaged" in w for w in warnings), warnings
    assert f"manifest {step}.done.json is damaged" in summary.steps[step].reason


def test_cli_resume_over_a_damaged_manifest_exits_zero(copy_of, caplog):
    root = copy_of("binary")
    _drop_run_id(manifest_path(root / "ws", "selection"))
    (root / "config.yaml").write_text(json.dumps(_config().model_dump(mode="json")))
    with caplog.at_level(logging.WARNING):
        assert main(["run", "config.yaml", "--resume", "--to", "selection",
                     "--no-progress"]) == 0
    assert "selection.done.json is damaged (missing run_id)" in caplog.text


# ------------------------------------------------------------------------ depsi info --verify
def test_info_verify_a_workspace_before_and_after_an_input_change(copy_of, capsys):
    root = copy_of("binary")
    assert main(["info", "--verify", "ws"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^stack\s+ok$", out, re.M) and re.search(r"^selection\s+ok$", out, re.M)
    assert re.search(r"^model\s+not run$", out, re.M)

    named = change_slc(root, "binary")
    assert main(["info", "--verify", "ws"]) == 2
    out = capsys.readouterr().out
    assert re.search(rf"^stack\s+stale: input changed: {re.escape(named)}$", out, re.M), out
    assert re.search(r"^selection\s+stale: ", out, re.M)


def test_verify_workspace_reports_a_damaged_manifest(copy_of):
    root = copy_of("binary")
    manifest_path(root / "ws", "selection").write_text("[]")
    checks = {check.step: check for check in verify_workspace(root / "ws")}
    assert checks["stack"].state == "ok"
    assert checks["selection"].state == "damaged"
    assert "selection.done.json is damaged" in checks["selection"].reason


# ------------------------------------------------------------------------ the fingerprint alone
def _folder_config(folder: Path, fmt: str = "binary", workspace: Path | None = None):
    return parse_config({"input": {"format": fmt, "path": str(folder)},
                         "output": {"workspace": str(workspace or folder.parent / "ws")}})


def test_a_large_raster_replaced_with_size_and_mtime_kept_is_seen(tmp_path):
    folder = tmp_path / "stack"
    folder.mkdir()
    raster = folder / "slc_20230331.raw"
    rng = np.random.default_rng(0)
    raster.write_bytes(rng.bytes(8 * 2**20))
    config = _folder_config(folder)
    before = input_fingerprint(config)
    assert "sample" in before["files"]["slc_20230331.raw"]
    _replace_keeping_mtime(raster, rng.bytes(8 * 2**20))
    assert input_changes(before, input_fingerprint(config)) == ["slc_20230331.raw (content)"]


def test_a_touched_raster_counts_as_modified_a_touched_metadata_file_does_not(tmp_path):
    folder = tmp_path / "stack"
    folder.mkdir()
    (folder / "slc.raw").write_bytes(b"\1" * 300_000)
    (folder / "master.res").write_text("Radar_wavelength (m): 0.0556\n")
    config = _folder_config(folder)
    before = input_fingerprint(config)
    for path in folder.iterdir():
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 10**9))
    assert input_changes(before, input_fingerprint(config)) == ["slc.raw (modified)"]


def test_junk_and_a_workspace_inside_the_input_are_not_inputs(tmp_path):
    folder = tmp_path / "stack"
    folder.mkdir()
    (folder / "slc.raw").write_bytes(b"\1" * 100)
    config = _folder_config(folder, workspace=folder / "ws")
    before = input_fingerprint(config)
    (folder / "ws").mkdir()
    (folder / "ws" / "stack.done.json").write_text("{}")
    for junk in (".DS_Store", "._slc.raw", ".slc.raw-lock", "slc.raw~"):
        (folder / junk).write_bytes(b"x")
    assert input_changes(before, input_fingerprint(config)) == []


def test_zarr_chunks_by_name_and_size_metadata_by_content(tmp_path):
    store = tmp_path / "stack.zarr"
    xr.Dataset({"amplitude": (("azimuth", "range"), np.ones((4, 4), "f4"))}).to_zarr(
        store, zarr_format=2, consolidated=True)
    config = _folder_config(store, fmt="zarr")
    record = input_fingerprint(config)
    chunk = next(label for label in record["files"] if label.startswith("amplitude/0"))
    assert set(record["files"][chunk]) == {"size", "mtime_ns"}
    assert "sha256" in record["files"]["amplitude/.zarray"]
    assert "sha256" in record["files"][".zmetadata"]


def test_a_dim_file_brings_its_data_folder(tmp_path):
    written = write_stack(tmp_path / "dimap", format="dimap", shape=(8, 8), n_epochs=3, seed=1)
    labels = input_fingerprint(_folder_config(written["path"], fmt="dimap"))["files"]
    assert "stack.dim" in labels
    assert any(label.startswith("stack.data/") and label.endswith(".img") for label in labels)


@pytest.mark.slow
def test_ten_thousand_files_fingerprint_in_seconds(tmp_path):
    folder = tmp_path / "stack"
    metadata = tmp_path / "master.res"
    metadata.write_bytes(b"x" * 2000)
    for i in range(100):
        sub = folder / f"{i:03d}"
        sub.mkdir(parents=True)
        for j in range(100):
            os.link(metadata, sub / f"{j:03d}.res")  # quick to make, each a file to hash
    began = time.perf_counter()
    record = input_fingerprint(_folder_config(folder))
    assert len(record["files"]) == 10_000
    assert time.perf_counter() - began < 10


def test_sampled_hash_reads_the_whole_of_a_small_file_and_samples_a_large_one(tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    small.write_bytes(b"a" * 1000)
    data = bytearray(4 * 2**20)
    large.write_bytes(bytes(data))
    first = sampled_hash(large)
    data[2**21] = 1  # between the samples: not read
    large.write_bytes(bytes(data))
    assert sampled_hash(large) == first
    data[-1] = 1  # in the last HEAD_BYTES
    large.write_bytes(bytes(data))
    assert sampled_hash(large) != first
    small_first = sampled_hash(small)
    small.write_bytes(b"a" * 500 + b"b" + b"a" * 499)  # anywhere in a small file
    assert sampled_hash(small) != small_first
