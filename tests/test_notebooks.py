"""The tutorial notebooks run top to bottom, are committed without outputs, and the bundled
example data in ``data/`` is what ``scripts/make_data.py`` makes."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

#: Seconds one notebook may take (each runs in well under a minute on two cores).
NOTEBOOK_TIMEOUT = 300


def test_there_are_notebooks():
    names = [path.name for path in NOTEBOOKS]
    assert names == ["01_dask_for_insar.ipynb", "02_ps_processing.ipynb",
                     "03_real_data.ipynb", "04_gpu_and_hpc.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    dirty = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} hold outputs or execution counts; strip "
                       f"them (jupyter nbconvert --clear-output --inplace {path.name})")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path):
    """Execute in the notebooks folder (the notebooks find ``data/`` and ``../shared/realdata``
    from there and write only to temporary folders); fail with the failing cell's error."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(path, as_version=4)
    os.environ.setdefault("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(notebook, timeout=NOTEBOOK_TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{path.name} failed:\n{error}", pytrace=False)
    elapsed = time.perf_counter() - start
    errors = [output for cell in notebook.cells if cell.cell_type == "code"
              for output in cell.get("outputs", []) if output.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0]['ename']}: {errors[0]['evalue']}"
    stderr = "".join(output.get("text", "") for cell in notebook.cells
                     if cell.cell_type == "code" for output in cell.get("outputs", [])
                     if output.get("name") == "stderr")
    for symptom in ("IProgress not found", "Failed to open Zarr store with consolidated"):
        assert symptom not in stderr, f"{path.name}: {symptom!r} in the cells' stderr"
    print(f"{path.name}: {elapsed:.1f} s")


# ---------------------------------------------------------------------------- example data

def _make_data_module():
    spec = importlib.util.spec_from_file_location("make_data", ROOT / "scripts" / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_data_is_small():
    files = [p for p in (ROOT / "data").rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files)
    assert total < 8 * 2**20, f"data/ holds {total / 2**20:.1f} MiB; keep it to a few MB"


def test_example_stm_follows_the_conventions():
    from depsi.io import open_stm
    from depsi.stm import validate

    stm = open_stm(ROOT / "data" / "ps_stm.zarr")
    validate(stm, "points", require_wavelength=True)
    assert stm.sizes["space"] >= 10_000 and stm.sizes["time"] >= 10
    for name in ("complex", "amplitude", "phase", "h2ph"):
        assert stm[name].dims == ("space", "time"), name
    for name in ("lat", "lon", "azimuth", "range"):
        assert name in stm.coords, name
    assert stm["complex"].dtype == np.complex64


def test_make_data_regenerates_identical_content(tmp_path):
    """The committed stores equal a fresh run of the script, value for value."""
    from depsi.io import open_stm

    paths = _make_data_module().make_all(tmp_path)
    for fresh_path in paths:
        committed = open_stm(ROOT / "data" / fresh_path.name).compute()
        fresh = open_stm(fresh_path).compute()
        xr.testing.assert_identical(fresh, committed)
