"""The ``.stm`` accessor: known answers, laziness, non-mutation and error messages."""

from __future__ import annotations

import copy

import dask
import dask.array as da
import numpy as np
import pytest
import shapely
import xarray as xr

import depsi.stm  # noqa: F401  (registers .stm)
from depsi.stm import STMValidationError, accessor, morton_order
from depsi.stm.accessor import STMKeyError

gpd = pytest.importorskip("geopandas")

TIMES = np.array(["2020-01-01", "2020-01-13", "2020-01-25"], dtype="datetime64[ns]")


def make_stm(n_azimuth: int = 20, n_range: int = 30, *, chunks: int | None = None) -> xr.Dataset:
    """A grid of points in Morton order; lon = range / 10, lat = azimuth / 10 (cell centres)."""
    az, rg = np.meshgrid(np.arange(n_azimuth), np.arange(n_range), indexing="ij")
    az, rg = az.ravel(), rg.ravel()
    order = morton_order(az, rg)
    az, rg = az[order], rg[order]
    n = az.size
    ds = xr.Dataset(
        {
            "amplitude": (("space", "time"),
                          np.arange(n * 3, dtype="f4").reshape(n, 3)),
            "coherence": ("space", (np.arange(n) % 10) / 10.0),
        },
        coords={
            "time": TIMES,
            "azimuth": ("space", az),
            "range": ("space", rg),
            "lon": ("space", rg / 10 + 0.05),
            "lat": ("space", az / 10 + 0.05),
        },
    )
    return ds.chunk({"space": chunks, "time": -1}) if chunks else ds


def forbid_compute(*args, **kwargs):
    raise AssertionError("a Dask computation was triggered")


def ring(cx, cy, outer, inner):
    """A square polygon of half-width ``outer`` with a square hole of half-width ``inner``."""
    return shapely.Polygon(
        shapely.box(cx - outer, cy - outer, cx + outer, cy + outer).exterior.coords,
        [shapely.box(cx - inner, cy - inner, cx + inner, cy + inner).exterior.coords],
    )


def points(xy) -> xr.Dataset:
    xy = np.asarray(xy, dtype=float)
    return xr.Dataset(
        {"amplitude": (("space", "time"), np.ones((len(xy), 3), "f4"))},
        coords={"time": TIMES, "lon": ("space", xy[:, 0]), "lat": ("space", xy[:, 1])},
    )


# ---- sizes, dims, metadata -------------------------------------------------------------


def test_num_points_and_num_epochs_are_sizes_of_space_and_time():
    ds = make_stm(4, 5)
    assert (ds.stm.num_points, ds.stm.num_epochs) == (20, 3)


def test_num_points_without_space_dim_names_the_dims_found():
    with pytest.raises(STMKeyError, match=r"'space'.*found dims \('time',\)"):
        _ = xr.Dataset({"a": ("time", [1.0])}).stm.num_points


def test_regulate_dims_renames_labels_and_keeps_pnt_variables_space_only():
    ds = xr.Dataset(
        {"height": ("pnt", [1.0, 2.0]), "pnt_flags": ("pnt", [1, 2])},
        coords={"pnt": ["a", "b"]},
    )
    out = ds.stm.regulate_dims(space_label="pnt")
    assert out["height"].dims == ("space", "time") and out.sizes["time"] == 1
    assert out["pnt_flags"].dims == ("space",)
    assert out["pnt"].values.tolist() == ["a", "b"]


def test_regulate_dims_renames_time_label_with_its_coordinate():
    ds = xr.Dataset({"d": (("date", "pnt"), np.zeros((3, 2)))}, coords={"date": TIMES})
    out = ds.stm.regulate_dims(space_label="pnt", time_label="date")
    assert out["d"].dims == ("space", "time")
    np.testing.assert_array_equal(out["time"].values, TIMES)


def test_regulate_dims_unknown_label_names_label_and_dims():
    with pytest.raises(STMKeyError, match=r"space_label 'points'.*found dims \('pnt',\)"):
        xr.Dataset({"h": ("pnt", [1.0])}).stm.regulate_dims(space_label="points")


def test_regulate_dims_without_any_space_or_time_needs_a_label():
    with pytest.raises(STMKeyError, match="space_label/time_label"):
        xr.Dataset({"h": ("pnt", [1.0])}).stm.regulate_dims()


def test_add_metadata_returns_new_dataset_with_attrs():
    ds = make_stm(2, 2)
    out = ds.stm.add_metadata({"wavelength": 0.0555})
    assert out.attrs["wavelength"] == 0.0555 and "wavelength" not in ds.attrs


def test_register_metadata_checks_listed_variables_exist():
    ds = make_stm(2, 2)
    out = ds.stm.register_metadata({"techniqueId": "PS", "obsDataKeys": "amplitude"})
    assert out.attrs == {"techniqueId": "PS", "obsDataKeys": ["amplitude"]}
    with pytest.raises(STMKeyError, match="'phase'.*obsDataKeys"):
        ds.stm.register_metadata({"obsDataKeys": ["amplitude", "phase"]})


def test_register_datatype_records_variables_under_the_datatype():
    ds = make_stm(2, 2)
    out = ds.stm.register_datatype(["coherence"], "pntAttrib")
    assert out.attrs["pntAttrib"] == ["coherence"]


def test_register_datatype_missing_variable_is_named_and_is_a_key_error():
    with pytest.raises(KeyError, match="'velocity'"):
        make_stm(2, 2).stm.register_datatype(["coherence", "velocity"], "pntAttrib")


def test_register_datatype_rejects_unknown_datatype():
    with pytest.raises(ValueError, match=r"datatype.*'space'"):
        make_stm(2, 2).stm.register_datatype("coherence", "space")


# ---- order -----------------------------------------------------------------------------


def test_get_order_gives_morton_keys_of_scaled_coordinates():
    ds = xr.Dataset(coords={"azimuth": ("space", [1, 0, 1]), "range": ("space", [1, 0, 0])})
    # x (azimuth) takes the even bits, y (range) the odd ones, as stmtools/pymorton
    assert ds.stm.get_order()["order"].values.tolist() == [3, 0, 1]
    ll = xr.Dataset(coords={"lat": ("space", [0.26, 0.05]), "lon": ("space", [0.11, 0.05])})
    # scaled by 10 and floored: x=2 -> 0b0100, y=1 -> 0b0010, key 6; (0, 0) -> 0
    assert ll.stm.get_order("lat", "lon", 10, 10)["order"].values.tolist() == [6, 0]


def test_reorder_sorts_points_and_keeps_data_with_them():
    ds = make_stm(6, 7)
    shuffled = ds.isel(space=np.random.default_rng(1).permutation(ds.sizes["space"]))
    # depsi stores points with azimuth in the odd bits: that is stmtools' order of (range, azimuth)
    out = shuffled.stm.reorder(xlabel="range", ylabel="azimuth")
    np.testing.assert_array_equal(out["azimuth"].values, ds["azimuth"].values)
    np.testing.assert_array_equal(out["amplitude"].values, ds["amplitude"].values)
    assert np.all(np.diff(out["order"].values.astype(np.int64)) > 0)


def test_reorder_keeps_data_lazy_without_computing_it():
    ds = make_stm(6, 7, chunks=10).isel(space=slice(None, None, -1))
    ds = ds.assign_coords(azimuth=ds["azimuth"].compute(), range=ds["range"].compute())
    with dask.config.set(scheduler=forbid_compute):
        out = ds.stm.reorder()
    assert isinstance(out["amplitude"].data, da.Array)


def test_get_order_missing_coordinate_is_named():
    with pytest.raises(STMKeyError, match=r"coordinate 'azimuth'.*found variables"):
        points([[0, 0]]).stm.get_order()


# ---- subsets ---------------------------------------------------------------------------


@pytest.mark.parametrize(("threshold", "expected"),
                         [(">0.7", lambda c: c > 0.7), (">=0.7", lambda c: c >= 0.7),
                          ("<0.3", lambda c: c < 0.3), ("<= 2e-1", lambda c: c <= 0.2)])
def test_subset_threshold_keeps_points_satisfying_comparison(threshold, expected):
    ds = make_stm(20, 30)  # coherence cycles 0.0 .. 0.9: 60 points of each value
    out = ds.stm.subset(method="threshold", var="coherence", threshold=threshold)
    keep = np.flatnonzero(expected(ds["coherence"].values))
    assert out.sizes["space"] == {">0.7": 120, "<0.3": 180}.get(threshold, 180)
    xr.testing.assert_identical(out, ds.isel(space=keep))


@pytest.mark.parametrize("threshold", ["0.7", "=>0.7", ">>0.7", ">abc", "<0.3>0.1", 0.7])
def test_subset_threshold_bad_string_is_named(threshold):
    with pytest.raises(ValueError, match=r"threshold: expected a comparison.*found"):
        make_stm(2, 2).stm.subset(method="threshold", var="coherence", threshold=threshold)


def test_subset_threshold_needs_a_space_only_variable():
    with pytest.raises(STMValidationError, match=r"'amplitude'.*found dims \('space', 'time'\)"):
        make_stm(2, 2).stm.subset(method="threshold", var="amplitude", threshold=">1")


def test_subset_threshold_missing_variable_is_named():
    with pytest.raises(STMKeyError, match="variable 'enscoh'"):
        make_stm(2, 2).stm.subset(method="threshold", var="enscoh", threshold=">1")


def test_subset_unknown_method_is_named():
    with pytest.raises(ValueError, match="found 'random'"):
        make_stm(2, 2).stm.subset(method="random")


def test_subset_density_keeps_best_point_per_cell():
    # 2 x 2 cells of 0.5 x 0.5 hold 4 + 3 + 1 + 0 points; one NaN score never wins
    xy = [[0.1, 0.1], [0.2, 0.2], [0.3, 0.3], [0.4, 0.4],
          [0.6, 0.1], [0.7, 0.2], [0.8, 0.3], [0.1, 0.9]]
    ds = points(xy).assign(score=("space", [1.0, 5.0, 3.0, np.nan, 2.0, 0.5, 2.5, -1.0]))
    best = ds.stm.subset(method="density", dx=0.5, dy=0.5, by="score")
    assert best["score"].values.tolist() == [5.0, 2.5, -1.0]
    worst = ds.stm.subset(method="density", dx=0.5, dy=0.5, by="score", best="min")
    assert worst["score"].values.tolist() == [1.0, 0.5, -1.0]
    first = ds.stm.subset(method="density", dx=0.5, dy=0.5)
    assert first["score"].values.tolist()[:2] == [1.0, 2.0]


def test_subset_density_count_is_number_of_occupied_cells_and_order_kept():
    ds = make_stm(20, 30, chunks=64)  # lon 0.05..2.95, lat 0.05..1.95 in 0.1 steps
    out = ds.stm.subset(method="density", dx=0.5, dy=0.5, by="coherence")
    assert out.sizes["space"] == 6 * 4
    assert isinstance(out["amplitude"].data, da.Array)
    key = depsi.stm.morton_key(out["azimuth"].values, out["range"].values)
    assert np.all(np.diff(key.astype(np.int64)) > 0)
    cell = np.floor(out["lon"].values / 0.5) * 10 + np.floor(out["lat"].values / 0.5)
    assert np.unique(cell).size == 24


def test_subset_density_requires_positive_cell_sizes():
    with pytest.raises(ValueError, match="expected dy a positive cell size.*found -1"):
        make_stm(2, 2).stm.subset(method="density", dx=1.0, dy=-1)


def test_subset_polygon_keeps_points_inside_and_order():
    ds = make_stm(20, 30)
    area = shapely.box(1.0, 0.5, 2.0, 1.0)  # lon 1.05..1.95 x lat 0.55..0.95: 10 x 5 points
    out = ds.stm.subset(method="polygon", polygon=area)
    assert out.sizes["space"] == 50
    assert np.all(np.diff(morton_order(out["azimuth"], out["range"])) == 1)


def test_subset_polygon_from_file(tmp_path):
    path = tmp_path / "area.gpkg"
    gpd.GeoDataFrame({"id": [1]}, geometry=[ring(1.5, 1.0, 0.5, 0.2)], crs=4326).to_file(path)
    out = make_stm(20, 30).stm.subset(method="polygon", polygon=path)
    assert out.sizes["space"] == 10 * 10 - 4 * 4


# ---- enrich_from_polygon: known answers --------------------------------------------------


def test_enrich_from_polygon_excludes_holes_and_covers_multipolygon_parts():
    frame = gpd.GeoDataFrame(
        {"name": ["ring", "pair"], "value": [7, 9]},
        geometry=[ring(0, 0, 2, 1),
                  shapely.MultiPolygon([shapely.box(10, 0, 11, 1), shapely.box(20, 0, 21, 1)])],
    )
    ds = points([[1.5, 0], [0, 0], [3, 3], [10.5, 0.5], [20.5, 0.5], [15, 0.5], [2, 0]])
    out = ds.stm.enrich_from_polygon(frame, ["name", "value"])
    assert out["name"].values.tolist() == ["ring", "", "", "pair", "pair", "", ""]
    np.testing.assert_array_equal(out["value"].values, [7, np.nan, np.nan, 9, 9, np.nan, np.nan])
    assert out["name"].dtype.kind == "U" and out["value"].dtype == np.float64


def test_enrich_from_polygon_edge_point_is_outside_unless_boundary_is_included():
    """(2, 0) lies on the ring's outer edge: outside as in stmtools, inside on request."""
    frame = gpd.GeoDataFrame({"name": ["ring"]}, geometry=[ring(0, 0, 2, 1)])
    ds = points([[2, 0], [1, 0], [1.5, 0]])  # outer edge, hole's edge, interior
    assert ds.stm.enrich_from_polygon(frame, "name")["name"].values.tolist() == ["", "", "ring"]
    covered = ds.stm.enrich_from_polygon(frame, "name", include_boundary=True)
    assert covered["name"].values.tolist() == ["ring", "ring", "ring"]
    kept = ds.stm.subset(method="polygon", polygon=frame, include_boundary=True)
    assert kept.sizes["space"] == 3


def test_enrich_from_polygon_overlap_takes_first_polygon():
    frame = gpd.GeoDataFrame({"rank": ["first", "second"]},
                             geometry=[shapely.box(0, 0, 2, 2), shapely.box(1, 1, 3, 3)])
    out = points([[1.5, 1.5], [2.5, 2.5], [0.5, 0.5]]).stm.enrich_from_polygon(frame, "rank")
    assert out["rank"].values.tolist() == ["first", "second", "first"]
    flipped = frame.iloc[::-1].reset_index(drop=True)
    out = points([[1.5, 1.5]]).stm.enrich_from_polygon(flipped, "rank")
    assert out["rank"].values.tolist() == ["second"]


def brute_force_first_polygon(geoms, xy, test=shapely.contains_xy):
    inside = np.stack([test(g, xy[:, 0], xy[:, 1]) for g in geoms])
    return np.where(inside.any(0), np.argmax(inside, axis=0), np.nan)


@pytest.mark.parametrize(("size", "count"), [((0.3, 1.0), 60), ((0.002, 0.02), 400),
                                             ((3.0, 8.0), 5)])
def test_enrich_from_polygon_matches_brute_force_on_random_rings(size, count):
    rng = np.random.default_rng(7)
    xy = rng.uniform(0, 10, (20_000, 2))
    xy[:50] = [5.0, 5.0]  # repeated points
    centres = rng.uniform(0, 10, (count, 2))
    outer = rng.uniform(*size, count)
    geoms = [ring(cx, cy, r, r / 4) for (cx, cy), r in zip(centres, outer)]
    frame = gpd.GeoDataFrame({"k": np.arange(count)}, geometry=geoms)
    out = points(xy).stm.enrich_from_polygon(frame, "k")
    np.testing.assert_array_equal(out["k"].values, brute_force_first_polygon(geoms, xy))


def test_enrich_from_polygon_handles_small_blocks_and_degenerate_extents(monkeypatch):
    monkeypatch.setattr(accessor, "BLOCK_POINTS", 5)
    xy = np.array([[0.5, 0.5]] * 6 + [[x, 2.5] for x in np.linspace(0, 4, 9)]
                  + [[9.0, 9.0]] * 5 + [[np.nan, 0.5], [1.5, 1.5]])
    geoms = [ring(1, 1, 1, 0.25), shapely.box(2, 2, 3, 3), shapely.box(8, 8, 9.5, 9.5)]
    frame = gpd.GeoDataFrame({"k": [0, 1, 2]}, geometry=geoms)
    out = points(xy).stm.enrich_from_polygon(frame, "k")
    np.testing.assert_array_equal(out["k"].values, brute_force_first_polygon(geoms, xy))
    assert np.isnan(out["k"].values[-2]) and out["k"].values[-1] == 0
    covered = points(xy).stm.enrich_from_polygon(frame, "k", include_boundary=True)
    np.testing.assert_array_equal(covered["k"].values,
                                  brute_force_first_polygon(geoms, xy, shapely.intersects_xy))


def test_enrich_from_polygon_reprojects_polygons_to_lonlat():
    box = gpd.GeoSeries([shapely.box(0, 0, 1, 1)], crs=4326).to_crs(3857)
    frame = gpd.GeoDataFrame({"name": ["a"]}, geometry=box, crs=3857)
    out = points([[0.5, 0.5], [1.5, 0.5]]).stm.enrich_from_polygon(frame, "name")
    assert out["name"].values.tolist() == ["a", ""]


def test_enrich_from_polygon_reads_vector_file(tmp_path):
    path = tmp_path / "parcels.gpkg"
    gpd.GeoDataFrame({"name": ["a", "b"]}, geometry=[ring(0, 0, 2, 1), shapely.box(5, 5, 6, 6)],
                     crs=4326).to_file(path)
    out = points([[1.5, 0], [0, 0], [5.5, 5.5]]).stm.enrich_from_polygon(str(path), "name")
    assert out["name"].values.tolist() == ["a", "", "b"]


# ---- enrich_from_polygon: laziness -------------------------------------------------------


def test_enrich_from_polygon_is_lazy_per_space_chunk_and_computes_same_values():
    ds = make_stm(20, 30, chunks=50)
    frame = gpd.GeoDataFrame({"name": ["r"], "v": [2.5]}, geometry=[ring(1.5, 1.0, 0.5, 0.2)])
    with dask.config.set(scheduler=forbid_compute):
        out = ds.stm.enrich_from_polygon(frame, ["name", "v"])
    assert isinstance(out["name"].data, da.Array)
    assert out["name"].chunks == ds["amplitude"].chunks[:1]
    eager = ds.compute().stm.enrich_from_polygon(frame, ["name", "v"])
    xr.testing.assert_identical(out.compute(), eager)
    assert int((eager["name"] == "r").sum()) == 84


def test_enrich_from_polygon_with_lazy_coordinates_stays_lazy():
    ds = points([[0.5, 0.5], [5, 5], [0.2, 0.8], [9, 9]])
    ds = ds.assign_coords(lon=ds["lon"].chunk(2), lat=ds["lat"].chunk(2))
    with dask.config.set(scheduler=forbid_compute):
        out = ds.stm.enrich_from_polygon([shapely.box(0, 0, 1, 1)], [])
        out = out.stm.enrich_from_polygon(
            gpd.GeoDataFrame({"n": [1]}, geometry=[shapely.box(0, 0, 1, 1)]), "n")
    np.testing.assert_array_equal(out["n"].values, [1, np.nan, 1, np.nan])


# ---- enrich_from_polygon: errors -------------------------------------------------------------


def test_enrich_from_polygon_unreadable_file_names_the_file(tmp_path):
    path = tmp_path / "broken.gpkg"
    path.write_text("not a geopackage")
    with pytest.raises(ValueError, match="broken.gpkg"):
        points([[0, 0]]).stm.enrich_from_polygon(path, "name")
    with pytest.raises(FileNotFoundError, match="missing.shp"):
        points([[0, 0]]).stm.enrich_from_polygon(tmp_path / "missing.shp", "name")


def test_enrich_from_polygon_missing_field_names_field_and_available_ones():
    frame = gpd.GeoDataFrame({"name": ["a"]}, geometry=[shapely.box(0, 0, 1, 1)])
    with pytest.raises(KeyError, match=r"\['height'\].*found fields \['name'\]"):
        points([[0, 0]]).stm.enrich_from_polygon(frame, ["name", "height"])


def test_enrich_from_polygon_fields_need_a_frame_not_bare_geometries():
    with pytest.raises(ValueError, match="carry no fields"):
        points([[0, 0]]).stm.enrich_from_polygon([shapely.box(0, 0, 1, 1)], "name")


def test_enrich_from_polygon_rejects_non_polygon_geometry():
    with pytest.raises(ValueError, match="found LineString at position 1"):
        points([[0, 0]]).stm.subset(method="polygon", polygon=[
            shapely.box(0, 0, 1, 1), shapely.LineString([(0, 0), (1, 1)])])


def test_enrich_from_polygon_missing_coordinate_is_named():
    with pytest.raises(STMKeyError, match="coordinate 'x'"):
        points([[0, 0]]).stm.enrich_from_polygon([shapely.box(0, 0, 1, 1)], [], xlabel="x")


def test_enrich_from_polygon_refuses_to_overwrite_a_variable():
    frame = gpd.GeoDataFrame({"amplitude": [1.0]}, geometry=[shapely.box(0, 0, 1, 1)])
    with pytest.raises(STMValidationError, match="'amplitude'.*already"):
        points([[0, 0]]).stm.enrich_from_polygon(frame, "amplitude")


# ---- enrich_from_dataset -------------------------------------------------------------------


def test_enrich_from_dataset_samples_nearest_raster_cell():
    dem = xr.Dataset({"dem": (("lat", "lon"), np.arange(12.0).reshape(3, 4))},
                     coords={"lat": [2.0, 1.0, 0.0], "lon": [0.0, 1.0, 2.0, 3.0]})
    out = points([[0.1, 0.1], [2.9, 1.8], [1.4, 1.2]]).stm.enrich_from_dataset(dem, "dem")
    assert out["dem"].dims == ("space",)
    assert out["dem"].values.tolist() == [8.0, 3.0, 5.0]


def test_enrich_from_dataset_takes_nearest_epoch_of_time_fields():
    times = np.array(["2019-12-31", "2020-01-14", "2020-02-01"], dtype="datetime64[ns]")
    aps = xr.Dataset({"aps": (("time", "y", "x"), np.arange(12.0).reshape(3, 2, 2))},
                     coords={"time": times, "y": [0.0, 1.0], "x": [0.0, 1.0]})
    ds = points([[0, 0], [1, 1]]).rename({"lon": "x", "lat": "y"})
    out = ds.stm.enrich_from_dataset(aps, "aps")
    assert out["aps"].dims == ("space", "time")
    np.testing.assert_array_equal(out["aps"].values, [[0, 4, 8], [3, 7, 11]])


def test_enrich_from_dataset_point_set_uses_nearest_point():
    other = xr.Dataset({"velocity": ("space", [1.0, 2.0, 3.0])},
                       coords={"lon": ("space", [0.0, 5.0, 10.0]),
                               "lat": ("space", [0.0, 5.0, 10.0])})
    out = make_stm(2, 2, chunks=2).stm.enrich_from_dataset(other, "velocity")
    assert out["velocity"].values.tolist() == [1.0, 1.0, 1.0, 1.0]
    out = points([[9, 9], [4, 6], [-1, 0]]).stm.enrich_from_dataset(other, ["velocity"])
    assert out["velocity"].values.tolist() == [3.0, 2.0, 1.0]


def test_enrich_from_dataset_keeps_lazy_raster_lazy():
    dem = xr.Dataset({"dem": (("lat", "lon"), da.arange(12.0, chunks=6).reshape(3, 4))},
                     coords={"lat": [0.0, 1.0, 2.0], "lon": [0.0, 1.0, 2.0, 3.0]})
    with dask.config.set(scheduler=forbid_compute):
        out = points([[3, 2], [0, 0]]).stm.enrich_from_dataset(dem, "dem")
    assert isinstance(out["dem"].data, da.Array)
    assert out["dem"].values.tolist() == [11.0, 0.0]


def test_enrich_from_dataset_missing_field_and_coordinates_are_named():
    dem = xr.Dataset({"dem": (("row", "col"), np.zeros((2, 2)))})
    with pytest.raises(STMKeyError, match=r"field 'height'.*\['dem'\]"):
        points([[0, 0]]).stm.enrich_from_dataset(dem, "height")
    with pytest.raises(STMKeyError, match=r"\('lon', 'lat'\) or \('x', 'y'\)"):
        points([[0, 0]]).stm.enrich_from_dataset(dem, "dem")


# ---- no method changes its input -----------------------------------------------------------


FRAME = gpd.GeoDataFrame({"name": ["a"]}, geometry=[shapely.box(0, 0, 1, 1)])
CALLS = {
    "regulate_dims": lambda s: s.drop_dims("time").stm.regulate_dims(),
    "add_metadata": lambda s: s.stm.add_metadata({"a": 1}),
    "register_metadata": lambda s: s.stm.register_metadata({"obsDataKeys": ["amplitude"]}),
    "register_datatype": lambda s: s.stm.register_datatype("amplitude", "obsData"),
    "get_order": lambda s: s.stm.get_order(),
    "reorder": lambda s: s.stm.reorder(),
    "threshold": lambda s: s.stm.subset(method="threshold", var="coherence", threshold=">0.5"),
    "density": lambda s: s.stm.subset(method="density", dx=0.5, dy=0.5, by="coherence"),
    "polygon": lambda s: s.stm.subset(method="polygon", polygon=FRAME),
    "enrich_from_polygon": lambda s: s.stm.enrich_from_polygon(FRAME, "name"),
    "enrich_from_dataset": lambda s: s.stm.enrich_from_dataset(
        xr.Dataset({"z": (("lat", "lon"), np.ones((2, 2)))}, coords={"lat": [0, 1], "lon": [0, 1]}),
        "z"),
}


@pytest.mark.parametrize("chunks", [None, 40])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_method_leaves_input_unchanged(name, chunks):
    ds = make_stm(8, 10, chunks=chunks).assign_attrs(history="made")
    before = copy.deepcopy(ds)
    out = CALLS[name](ds)
    xr.testing.assert_identical(ds, before)
    assert out is not ds
