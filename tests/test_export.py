"""Exports of a result STM read back with the tools users read them with: the CSV with pandas,
the GeoPackage with geopandas, the GeoTIFF with rioxarray; plots are written as images."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from depsi.io.export import (
    grid_points,
    plot_time_series,
    plot_velocity_map,
    to_csv,
    to_geopackage,
    to_geotiff,
)


@pytest.fixture
def result() -> xr.Dataset:
    """Nine points on a 3 x 3 lon/lat lattice (0.01 deg apart), two per cell at the centre."""
    lon, lat = np.meshgrid(4.90 + 0.01 * np.arange(3), 52.30 + 0.01 * np.arange(3))
    lon, lat = np.append(lon.ravel(), 4.912), np.append(lat.ravel(), 52.312)
    n, n_time = lon.size, 4
    velocity = np.linspace(-0.02, 0.02, n)
    years = np.arange(n_time) * 12 / 365.25
    time = np.datetime64("2021-03-01", "ns") + np.arange(n_time) * np.timedelta64(12, "D")
    return xr.Dataset(
        {"velocity": ("space", velocity),
         "height_error": ("space", np.linspace(-3.0, 3.0, n)),
         "temporal_coherence": ("space", np.full(n, 0.9)),
         "displacement": (("space", "time"), velocity[:, None] * years)},
        coords={"time": time, "azimuth": ("space", np.arange(n) * 10),
                "range": ("space", np.arange(n) * 3 + 1), "lat": ("space", lat),
                "lon": ("space", lon)},
        attrs={"wavelength": 0.0556})


def test_csv_has_depsi_columns_and_round_trips_the_values(result, tmp_path):
    table = pd.read_csv(to_csv(result, tmp_path / "points.csv"))
    assert list(table.columns[:8]) == ["pnt_id", "lat", "lon", "azimuth", "range", "velocity",
                                       "height_error", "temporal_coherence"]
    assert list(table.columns[8:]) == ["d_20210301", "d_20210313", "d_20210325", "d_20210406"]
    assert table["pnt_id"][1] == "L10P4"
    np.testing.assert_allclose(table["velocity"], result["velocity"], rtol=1e-8)
    np.testing.assert_allclose(table.iloc[:, 8:], result["displacement"], rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(table["lat"], result["lat"], rtol=0, atol=1e-9)


def test_csv_and_geopackage_carry_the_standard_deviations(result, tmp_path):
    result = result.assign(velocity_std=("space", np.full(result.sizes["space"], 1e-3)),
                           height_error_std=("space", np.full(result.sizes["space"], 2.0)),
                           displacement_std=0.002 * xr.ones_like(result["displacement"]))
    table = pd.read_csv(to_csv(result, tmp_path / "points.csv"))
    assert list(table.columns[5:10]) == ["velocity", "velocity_std", "height_error",
                                         "height_error_std", "temporal_coherence"]
    assert list(table.columns[14:]) == ["std_d_20210301", "std_d_20210313", "std_d_20210325",
                                        "std_d_20210406"]
    np.testing.assert_allclose(table.iloc[:, 14:], result["displacement_std"], rtol=1e-8)
    gpd = pytest.importorskip("geopandas")
    frame = gpd.read_file(to_geopackage(result, tmp_path / "points.gpkg"))
    np.testing.assert_allclose(frame["height_error_std"], 2.0)
    assert "std_d_20210406" in frame.columns


def test_csv_write_leaves_no_temporary_file(result, tmp_path):
    to_csv(result, tmp_path / "points.csv")
    # the writer's lock file .points.csv-lock stays, by design (depsi.io.lock)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith("-lock")] == ["points.csv"]


def test_geopackage_points_are_wgs84_with_the_values(result, tmp_path):
    gpd = pytest.importorskip("geopandas")
    frame = gpd.read_file(to_geopackage(result, tmp_path / "points.gpkg"))
    assert frame.crs.to_epsg() == 4326
    np.testing.assert_allclose(frame.geometry.x, result["lon"])
    np.testing.assert_allclose(frame.geometry.y, result["lat"])
    np.testing.assert_allclose(frame["velocity"], result["velocity"])
    assert "d_20210406" in frame.columns


def test_geopackage_without_the_geo_extra_says_what_to_install(result, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "geopandas", None)
    with pytest.raises(ImportError, match=r"depsi\[geo\]"):
        to_geopackage(result, tmp_path / "points.gpkg")


def test_grid_is_the_mean_per_cell_and_nan_elsewhere(result):
    grid = grid_points(result, resolution=0.01)
    assert grid.shape == (3, 3)
    velocity = result["velocity"].values
    # the centre cell holds point 4 and the extra point 9: their mean
    np.testing.assert_allclose(grid.sel(x=4.915, y=52.315, method="nearest"),
                               (velocity[4] + velocity[9]) / 2, rtol=1e-6)
    # north up: the first row is the northernmost lattice row (points 6, 7, 8)
    np.testing.assert_allclose(grid.values[0], velocity[6:9], rtol=1e-6)
    coarse = grid_points(result.isel(space=[0, 8]), resolution=0.01)
    assert np.isnan(coarse.values).sum() == coarse.size - 2


def test_geotiff_reads_back_with_crs_and_grid_values(result, tmp_path):
    rioxarray = pytest.importorskip("rioxarray")
    path = to_geotiff(result, tmp_path / "velocity.tif", resolution=0.01)
    grid = rioxarray.open_rasterio(path, masked=True).squeeze("band", drop=True)
    assert grid.rio.crs.to_epsg() == 4326
    expected = grid_points(result, resolution=0.01)
    np.testing.assert_allclose(grid.values, expected.values, rtol=1e-6)
    np.testing.assert_allclose(grid.x, expected.x)
    np.testing.assert_allclose(grid.y, expected.y)


def test_geotiff_in_radar_coordinates_has_no_crs(result, tmp_path):
    rioxarray = pytest.importorskip("rioxarray")
    path = to_geotiff(result, tmp_path / "v.tif", coordinates="radar", resolution=10,
                      variable="height_error")
    grid = rioxarray.open_rasterio(path, masked=True).squeeze("band", drop=True)
    assert grid.rio.crs is None
    assert np.isfinite(grid.values).sum() == result.sizes["space"]


def test_plots_are_written_as_png(result, tmp_path):
    for path in (plot_velocity_map(result, tmp_path / "map.png"),
                 plot_time_series(result, tmp_path / "ts.png", points=[0, 5])):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 5_000


def test_time_series_of_a_point_out_of_range_is_refused(result, tmp_path):
    with pytest.raises(IndexError, match="points"):
        plot_time_series(result, tmp_path / "ts.png", points=[99])
