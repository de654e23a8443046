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
                     "03_real_data.ipynb", "04_gpu_and_hpc.ipynb",
                     "05_distributed_scatterers.ipynb", "06_real_stack.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    dirty = [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} hold outputs or execution counts; strip "
                       f"them (jupyter nbconvert --clear-output --inplace {path.name})")


#: The notebook the quick subset runs (the shortest); the others are marked slow.
QUICK_NOTEBOOK = "03_real_data"


@pytest.mark.parametrize("path", [
    pytest.param(path, id=path.stem, marks=[] if path.stem == QUICK_NOTEBOOK else pytest.mark.slow)
    for path in NOTEBOOKS])
def test_notebook_runs(path):
    """Execute in the notebooks folder (the notebooks find ``data/`` and ``../tests/data``
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


def test_real_test_data_is_small_and_each_set_keeps_its_licence_and_provenance():
    data = ROOT / "tests" / "data"
    total = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    # 4.4 MiB of it is the one real multi-epoch stack (93 epochs of 64 x 64 pixels)
    assert total < 10 * 2**20, f"tests/data holds {total / 2**20:.1f} MiB; keep it to a few MB"
    readme = (data / "README.md").read_text()
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        assert list(folder.glob("LICENSE*")), f"{folder.name}: no licence file beside the data"
        assert f"`{folder.name}/`" in readme, f"{folder.name}: not described in README.md"


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


#: Tolerances between the committed example data and a fresh run of ``scripts/make_data.py``
#: under another NumPy/BLAS build: the data are float32, so values may differ by a few float32
#: rounding steps (eps = 1.2e-7) where vectorised sin/cos/exp or summation order differ
#: (measured: phase up to 4.8e-7 rad). Integers, dates, shapes, dtypes and attrs must not differ.
PHASE_ATOL = 1e-5  # rad, on the wrapped difference
FLOAT32_RTOL = 1e-5  # relative to the magnitude of the variable
DEGREES_ATOL = 1e-9  # lat/lon (float64 from sin/cos): 0.1 mm on the ground


def _wrapped(angle: np.ndarray) -> np.ndarray:
    return np.angle(np.exp(1j * angle.astype(np.float64)))


def assert_same_up_to_builds(fresh: xr.Dataset, committed: xr.Dataset) -> None:
    """``fresh`` equals ``committed`` exactly in structure, integers and dates, and in
    floating-point values up to round-off that differs between NumPy/BLAS builds."""
    assert dict(fresh.sizes) == dict(committed.sizes)
    assert set(fresh.variables) == set(committed.variables)
    assert fresh.attrs == committed.attrs
    for name, variable in committed.variables.items():
        got, want = fresh[name].variable, variable
        assert (got.dims, got.dtype) == (want.dims, want.dtype), name
        assert got.attrs == want.attrs, name
        a, b = got.values, want.values
        if a.dtype.kind in "fc":
            assert np.array_equal(np.isnan(a), np.isnan(b)), f"{name}: NaNs moved"
        if name == "phase":
            np.testing.assert_allclose(_wrapped(a - b), 0.0, rtol=0, atol=PHASE_ATOL,
                                       err_msg=name, equal_nan=True)
        elif name in ("lat", "lon"):
            np.testing.assert_allclose(a, b, rtol=0, atol=DEGREES_ATOL, err_msg=name)
        elif a.dtype.kind in "fc":
            scale = float(np.nanmax(np.abs(b))) if b.size else 0.0
            np.testing.assert_allclose(a, b, rtol=0, atol=FLOAT32_RTOL * scale, err_msg=name,
                                       equal_nan=True)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.slow
def test_make_data_regenerates_the_committed_content_up_to_float32_round_off(tmp_path):
    """The committed stores equal a fresh run of the script: same structure, integers and
    dates exactly, floats within round-off that differs between NumPy/BLAS builds."""
    from depsi.io import open_stm

    paths = _make_data_module().make_all(tmp_path)
    for fresh_path in paths:
        committed = open_stm(ROOT / "data" / fresh_path.name).compute()
        fresh = open_stm(fresh_path).compute()
        assert_same_up_to_builds(fresh, committed)


def test_build_tolerant_comparison_still_catches_a_real_change():
    """The tolerances are loose enough for round-off and tight enough for a real change."""
    base = xr.Dataset({"phase": ("space", np.array([3.14159, -1.0], np.float32)),
                       "amplitude": ("space", np.array([10.0, 20.0], np.float32))},
                      coords={"azimuth": ("space", np.array([1, 2]))})
    roundoff = base.copy(deep=True)
    roundoff["phase"].values[:] = [-3.14159 + 4e-7, -1.0 + 4e-7]  # across the +-pi wrap
    roundoff["amplitude"].values[:] = [10.000002, 20.000002]
    assert_same_up_to_builds(roundoff, base)
    for name, value in (("phase", -1.001), ("amplitude", 20.01)):
        changed = base.copy(deep=True)
        changed[name].values[1] = value
        with pytest.raises(AssertionError, match=name):
            assert_same_up_to_builds(changed, base)
    moved = base.copy(deep=True)
    moved["azimuth"].values[1] = 3
    with pytest.raises(AssertionError, match="azimuth"):
        assert_same_up_to_builds(moved, base)
