"""The tables for other viewers (EGMS's point product, QGIS/InSAR Explorer) read back with
pandas and geopandas from a chain result on a small simulated stack."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml

from depsi import run_ps_chain
from depsi.cli import main
from depsi.io.export import (
    EGMS_COLUMNS,
    MM_DECIMALS,
    QGIS_FIELDS,
    to_egms_csv,
    to_egms_geopackage,
    to_qgis_csv,
    to_qgis_geopackage,
)
from scenes import simulated_points

gpd = pytest.importorskip("geopandas")

#: Largest difference of a value written in mm from the result's: half the last decimal kept,
#: plus float32 rounding of the result's metres.
MM_TOLERANCE = 0.5 * 10.0**-MM_DECIMALS + 1e-4


@pytest.fixture(scope="module")
def result() -> xr.Dataset:
    """The chain's result on a 60 x 60 stack of 12 epochs, with lat/lon (2 s: the two CSV
    tests stay in the quick subset)."""
    points, _ = simulated_points(shape=(60, 60), n_epochs=12, aps_std=0.0)
    return run_ps_chain(points).compute()


def _dates(result: xr.Dataset) -> list[str]:
    return list(pd.DatetimeIndex(result["time"].values).strftime("%Y%m%d"))


def _mm(result: xr.Dataset, name: str) -> np.ndarray:
    return 1e3 * np.asarray(result[name].transpose("space", ...).values, dtype=np.float64)


def test_egms_csv_has_the_product_columns_in_mm(result, tmp_path):
    table = pd.read_csv(to_egms_csv(result, tmp_path / "egms.csv"))
    dates = _dates(result)
    assert list(table.columns) == [*EGMS_COLUMNS, *dates]
    np.testing.assert_allclose(table["mean_velocity"], _mm(result, "velocity"),
                               atol=MM_TOLERANCE, rtol=0)
    np.testing.assert_allclose(table["mean_velocity_std"], _mm(result, "velocity_std"),
                               atol=MM_TOLERANCE, rtol=0)
    np.testing.assert_allclose(table[dates], _mm(result, "displacement"),
                               atol=MM_TOLERANCE, rtol=0)
    np.testing.assert_array_equal(table["line"], result["azimuth"])
    np.testing.assert_array_equal(table["pixel"], result["range"])
    np.testing.assert_allclose(table["latitude"], result["lat"], atol=1e-9, rtol=0)
    np.testing.assert_allclose(table["temporal_coherence"], result["temporal_coherence"],
                               rtol=1e-6)
    assert table["pid"][0].startswith("L")
    for empty in ("height_wgs84", "rmse", "acceleration", "acceleration_std"):
        assert table[empty].isna().all(), empty


@pytest.mark.slow
def test_egms_easting_northing_are_etrs89_laea_over_europe(result, tmp_path):
    pyproj = pytest.importorskip("pyproj")
    table = pd.read_csv(to_egms_csv(result, tmp_path / "egms.csv"))
    to_laea = pyproj.Transformer.from_crs("EPSG:4326", "EPSG:3035", always_xy=True)
    easting, northing = to_laea.transform(result["lon"].values, result["lat"].values)
    np.testing.assert_allclose(table["easting"], easting, atol=1e-3, rtol=0)
    np.testing.assert_allclose(table["northing"], northing, atol=1e-3, rtol=0)


@pytest.mark.slow
def test_egms_geopackage_is_wgs84_points_with_mean_velocity(result, tmp_path):
    frame = gpd.read_file(to_egms_geopackage(result, tmp_path / "egms.gpkg"))
    assert frame.crs.to_epsg() == 4326
    assert {"mean_velocity", *_dates(result)} <= set(frame.columns)
    np.testing.assert_allclose(frame.geometry.x, result["lon"], atol=1e-9, rtol=0)
    np.testing.assert_allclose(frame.geometry.y, result["lat"], atol=1e-9, rtol=0)
    np.testing.assert_allclose(frame["mean_velocity"], _mm(result, "velocity"),
                               atol=MM_TOLERANCE, rtol=0)


@pytest.mark.slow
def test_egms_seasonality_is_the_amplitude_of_the_annual_term(result, tmp_path):
    n = result.sizes["space"]
    seasonal = result.assign(seasonal_sin=("space", np.full(n, 0.003)),
                             seasonal_cos=("space", np.full(n, -0.004)))
    seasonal.attrs = {**result.attrs, "model_columns": ["seasonal_sin", "seasonal_cos"]}
    table = pd.read_csv(to_egms_csv(seasonal, tmp_path / "egms.csv"))
    np.testing.assert_allclose(table["seasonality"], 5.0)
    assert table["seasonality_std"].isna().all()


@pytest.mark.slow
def test_qgis_geopackage_has_the_fields_insar_explorer_reads(result, tmp_path):
    frame = gpd.read_file(to_qgis_geopackage(result, tmp_path / "qgis.gpkg"))
    fields = [f"D{date}" for date in _dates(result)]
    assert frame.crs.to_epsg() == 4326
    assert list(frame.columns[:6]) == list(QGIS_FIELDS)
    assert set(fields) <= set(frame.columns)
    np.testing.assert_allclose(frame["VEL"], _mm(result, "velocity"), atol=MM_TOLERANCE,
                               rtol=0)
    np.testing.assert_allclose(frame["V_STDEV"], _mm(result, "velocity_std"),
                               atol=MM_TOLERANCE, rtol=0)
    np.testing.assert_allclose(frame[fields], _mm(result, "displacement"), atol=MM_TOLERANCE,
                               rtol=0)
    np.testing.assert_allclose(frame["HEIGHT"], result["height_error"], rtol=1e-6)
    np.testing.assert_allclose(frame["H_STDEV"], result["height_error_std"], rtol=1e-6)
    np.testing.assert_allclose(frame["COHERENCE"], result["temporal_coherence"], rtol=1e-6)
    np.testing.assert_allclose(frame.geometry.x, result["lon"], atol=1e-9, rtol=0)


def test_qgis_csv_is_the_same_table(result, tmp_path):
    table = pd.read_csv(to_qgis_csv(result, tmp_path / "qgis.csv"))
    frame = gpd.read_file(to_qgis_geopackage(result, tmp_path / "qgis.gpkg"))
    pd.testing.assert_frame_equal(table, pd.DataFrame(frame.drop(columns="geometry")),
                                  check_dtype=False)


@pytest.mark.slow
def test_a_result_without_height_term_exports_with_height_empty(result, tmp_path):
    flat = result.drop_vars(["height_error", "height_error_std"])
    flat.attrs = {**result.attrs, "height_term": "absent: no baselines"}
    frame = gpd.read_file(to_qgis_geopackage(flat, tmp_path / "qgis.gpkg"))
    assert frame["HEIGHT"].isna().all() and frame["H_STDEV"].isna().all()
    assert not frame["VEL"].isna().any()
    assert len(pd.read_csv(to_egms_csv(flat, tmp_path / "egms.csv"))) == flat.sizes["space"]


@pytest.mark.slow
@pytest.mark.parametrize("writer", [to_egms_csv, to_egms_geopackage, to_qgis_csv,
                                    to_qgis_geopackage])
def test_a_result_without_positions_is_refused_naming_them(result, tmp_path, writer):
    with pytest.raises(KeyError, match=r"lacks \['lat', 'lon'\]"):
        writer(result.drop_vars(["lat", "lon"]), tmp_path / "out")


@pytest.mark.slow
def test_depsi_run_writes_the_egms_and_qgis_exports(tmp_path):
    config = tmp_path / "depsi.yaml"
    workspace = tmp_path / "workspace"
    config.write_text(yaml.safe_dump({
        "input": {"simulate": {"shape": [60, 60], "n_epochs": 12}},
        "output": {"workspace": str(workspace), "exports": ["egms", "qgis"]},
        "compute": {"scheduler": "threads", "threads": 2}}))
    assert main(["run", str(config), "--no-progress"]) == 0
    exports = workspace / "exports"
    for name in ("egms.csv", "egms.gpkg", "qgis.gpkg", "qgis.csv"):
        assert (exports / name).is_file(), name
    assert "VEL" in gpd.read_file(exports / "qgis.gpkg").columns
