"""Reading DePSI-style CSV exports: real files, conventions, Zarr round trips, bad input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from depsi.io.csv import from_csv
from depsi.stm import STMValidationError, morton_key, validate

HAS_STORE = importlib.util.find_spec("depsi.io.store") is not None


def write(tmp_path: Path, text: str, name: str = "ps.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def example(realdata) -> Path:
    return realdata / "depsi_ps_csv" / "example.csv"


@pytest.fixture(scope="module")
def example_ds(example) -> xr.Dataset:
    return from_csv(example, names="depsi")


# ---- the real export -----------------------------------------------------------------------


def test_real_csv_has_2500_points_and_11_dated_epochs(example_ds):
    ds = example_ds
    assert dict(ds.sizes) == {"space": 2500, "time": 11}
    assert ds["time"].dtype == np.dtype("datetime64[ns]")
    expected = pd.date_range("2016-03-27", "2016-07-15", freq="11D").values
    np.testing.assert_array_equal(ds["time"].values, expected)
    validate(ds, kind="points")


def test_real_csv_follows_naming_and_dtype_conventions(example_ds):
    ds = example_ds
    assert set(ds.coords) == {"time", "point_id", "lat", "lon", "azimuth", "range"}
    assert {"displacement", "amplitude", "h2ph", "flags", "height", "demheight",
            "demheight_highres", "enscoh", "ampconsist", "linear"} == set(ds.data_vars)
    for name in ("displacement", "amplitude", "h2ph"):
        assert ds[name].dims == ("space", "time") and ds[name].dtype == np.float32
    assert ds["lat"].dtype == ds["lon"].dtype == np.float64
    assert ds["azimuth"].dtype == ds["range"].dtype == np.int64
    assert ds["point_id"].dtype == np.dtype("<U18")
    assert ds["displacement"].attrs["units"] == "m"


def test_real_csv_is_in_morton_order(example_ds):
    key = morton_key(example_ds["azimuth"].values, example_ds["range"].values).astype(np.int64)
    assert np.all(np.diff(key) > 0)


def test_real_csv_values_equal_pandas_columns(example, example_ds):
    frame = pd.read_csv(example, index_col=0).set_index("pnt_id")
    ds = example_ds
    frame = frame.loc[ds["point_id"].values]  # same point order
    np.testing.assert_array_equal(ds["lat"].values, frame["pnt_lat"].to_numpy())
    np.testing.assert_array_equal(ds["azimuth"].values, frame["pnt_line"].to_numpy())
    np.testing.assert_array_equal(ds["enscoh"].values, frame["pnt_enscoh"].to_numpy())
    np.testing.assert_array_equal(ds["flags"].values, frame["pnt_flags"].to_numpy())
    days = [str(t)[:10].replace("-", "") for t in ds["time"].values]
    for prefix, name in (("d_", "displacement"), ("a_", "amplitude"), ("h2ph_", "h2ph")):
        columns = frame[[prefix + day for day in days]].to_numpy()
        np.testing.assert_array_equal(ds[name].values, columns.astype(np.float32))
        np.testing.assert_allclose(ds[name].values, columns, rtol=1e-6, atol=1e-9)


def test_example2_prefixes_def_and_amp_map_to_same_variables(realdata, example_ds):
    ds = from_csv(realdata / "depsi_ps_csv" / "example2.csv", names="depsi")
    assert {"displacement", "amplitude", "h2ph"} <= set(ds.data_vars)
    np.testing.assert_array_equal(ds["point_id"].values, example_ds["point_id"].values)
    np.testing.assert_allclose(ds["amplitude"].values, example_ds["amplitude"].values)


def test_blocksize_gives_dask_chunks_of_about_that_many_bytes(example):
    ds = from_csv(example, blocksize="100kB", names="depsi")
    assert isinstance(ds["displacement"].data, da.Array)
    sizes = ds["displacement"].chunks[0]
    assert len(sizes) > 1 and ds["displacement"].chunks[1] == (11,)
    row_bytes = 3 * 11 * 4 + 7 * 8 + 4 * 8 + 18 * 4  # epoch vars, point vars, coords, id
    assert abs(sizes[0] * row_bytes - 100_000) < row_bytes


def test_reading_in_row_blocks_gives_the_same_dataset(example, example_ds, monkeypatch):
    import depsi.io.csv as csv_module

    monkeypatch.setattr(csv_module, "ROWS_PER_READ", 333)
    xr.testing.assert_identical(from_csv(example, names="depsi"), example_ds)


# ---- strings survive a Zarr round trip ------------------------------------------------------


def long_id_csv(tmp_path: Path) -> Path:
    return write(tmp_path, (
        ",pnt_id,pnt_line,pnt_pixel,pnt_lat,pnt_lon,d_20200101,d_20200113\n"
        "0,L00000001P00000002_with_a_long_tail,1,2,52.0,4.0,0.0,0.001\n"
        "1,L0P0,0,0,52.1,4.1,0.0,-0.001\n"
    ))


# zarr warns that fixed-width unicode has no stable Zarr v3 specification yet
@pytest.mark.filterwarnings("ignore:The data type.*does not have a Zarr V3 specification")
def test_long_ids_survive_zarr_v3_round_trip(tmp_path):
    ds = from_csv(long_id_csv(tmp_path), names="depsi")
    assert ds["point_id"].dtype == np.dtype("<U35")
    ds.to_zarr(tmp_path / "ps.zarr", zarr_format=3, consolidated=False)
    back = xr.open_zarr(tmp_path / "ps.zarr", consolidated=False)
    assert back["point_id"].values.tolist() == ["L0P0", "L00000001P00000002_with_a_long_tail"]
    np.testing.assert_array_equal(back["displacement"].values, ds["displacement"].values)


@pytest.mark.skipif(not HAS_STORE, reason="depsi.io.store not there yet")
def test_long_ids_survive_save_stm_and_open_stm(tmp_path):
    from depsi.io.store import open_stm, save_stm

    ds = from_csv(long_id_csv(tmp_path), names="depsi")
    back = open_stm(save_stm(ds, tmp_path / "ps.zarr"))
    assert back["point_id"].values.tolist() == ds["point_id"].values.tolist()
    xr.testing.assert_equal(back["displacement"].compute(), ds["displacement"])


# ---- shapes of input -------------------------------------------------------------------------


def test_unknown_prefix_keeps_its_name_and_missing_dates_are_nan(tmp_path):
    path = write(tmp_path, (
        "pnt_line,pnt_pixel,pnt_quality,d_20200101,d_20200113,coh_20200113\n"
        "0,0,good,0.0,0.002,0.9\n"
    ))
    ds = from_csv(path, names="depsi")
    assert ds["coh"].dims == ("space", "time")
    np.testing.assert_array_equal(ds["coh"].values, np.array([[np.nan, 0.9]], "f4"))
    assert ds["quality"].values.tolist() == ["good"]


def test_custom_prefixes_rename_variables(tmp_path):
    path = write(tmp_path, "pnt_line,pnt_pixel,ph_20200101\n0,0,0.5\n")
    assert "phase" in from_csv(path, prefixes={"ph": "phase"}, names="depsi")


# ---- bad input ---------------------------------------------------------------------------------


def test_csv_without_epoch_columns_names_file_and_pattern(tmp_path):
    path = write(tmp_path, "pnt_id,pnt_line,pnt_pixel\nL0P0,0,0\n", name="points_only.csv")
    with pytest.raises(STMValidationError, match=r"points_only.csv.*<prefix>_YYYYMMDD"):
        from_csv(path, names="depsi")


@pytest.mark.parametrize("column", ["d_20161345", "d_2016032", "a_20160230"])
def test_unparseable_date_names_the_column(tmp_path, column):
    path = write(tmp_path, f"pnt_line,pnt_pixel,d_20160327,{column}\n0,0,0.0,0.1\n")
    with pytest.raises(STMValidationError, match=f"column '{column}'.*YYYYMMDD"):
        from_csv(path, names="depsi")


def test_two_prefixes_for_one_variable_are_named(tmp_path):
    path = write(tmp_path, "pnt_line,pnt_pixel,d_20200101,def_20200113\n0,0,0.0,0.1\n")
    with pytest.raises(STMValidationError, match=r"'d_' and 'def_'.*'displacement'"):
        from_csv(path, names="depsi")


def test_non_integer_pixel_index_is_named(tmp_path):
    path = write(tmp_path, "pnt_line,pnt_pixel,d_20200101\n0.5,0,0.0\n")
    with pytest.raises(STMValidationError, match="'pnt_line'.*whole pixel indices"):
        from_csv(path, names="depsi")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.csv"):
        from_csv(tmp_path / "nothing.csv", names="depsi")
