"""Differential tests against the real peers: stmtools 0.1.4 and sarxarray 1.4.0.

Each test calls the peer and depsi the same way on the same input and compares what comes
back, including which bad inputs raise. Where depsi differs on purpose (the peers' known bugs,
or a convention of DESIGN.md §3), the test says so in its name and docstring; docs/migration.md
lists the same differences.

Both peers register accessors on ``xr.Dataset`` (``.stm``, ``.slcstack``) on import. The
``peers`` fixture imports them once, keeps their accessor classes, and puts depsi's back, so
the rest of the test session keeps seeing depsi's accessors; ``theirs(ds)`` runs a peer method
with the peer's accessor in place (stmtools calls ``self._obj.stm._in_polygon`` internally).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pandas as pd
import pytest
import shapely
import xarray as xr

import depsi  # noqa: F401  (registers depsi's accessors)

gpd = pytest.importorskip("geopandas")

CSV = "depsi_ps_csv/example.csv"


def _accessor(name):
    return xr.Dataset.__dict__.get(name)


@pytest.fixture(scope="module")
def peers():
    """(stmtools, sarxarray) modules and their accessor descriptors; depsi's stay registered."""
    ours = {name: _accessor(name) for name in ("stm", "slcstack")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stmtools = pytest.importorskip("stmtools")
        sarxarray = pytest.importorskip("sarxarray")
    theirs = {name: _accessor(name) for name in ("stm", "slcstack")}
    for name, descriptor in ours.items():
        setattr(xr.Dataset, name, descriptor)
    yield stmtools, sarxarray, theirs
    for name, descriptor in ours.items():
        setattr(xr.Dataset, name, descriptor)


@contextlib.contextmanager
def _peer_accessors(theirs):
    ours = {name: _accessor(name) for name in theirs}
    for name, descriptor in theirs.items():
        setattr(xr.Dataset, name, descriptor)
    try:
        yield
    finally:
        for name, descriptor in ours.items():
            setattr(xr.Dataset, name, descriptor)


def theirs_stm(peers, ds: xr.Dataset, method: str, /, *args, **kwargs):
    """``ds.stm.<method>(...)`` with stmtools' accessor, on a fresh copy (no cached accessor)."""
    _, _, accessors = peers
    with _peer_accessors(accessors), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(ds.copy().stm, method)(*args, **kwargs)


def ours_stm(ds: xr.Dataset, method: str, /, *args, **kwargs):
    return getattr(ds.copy().stm, method)(*args, **kwargs)


def _raises_both(peers, ds, method, /, *args, expected=Exception, **kwargs):
    """Both raise ``expected``; returns the two exceptions."""
    with pytest.raises(expected) as theirs:
        theirs_stm(peers, ds, method, *args, **kwargs)
    with pytest.raises(expected) as ours:
        ours_stm(ds, method, *args, **kwargs)
    return theirs.value, ours.value


# --------------------------------------------------------------------------------------------
# fixtures: stmtools' own test STMs (tests/test_stm.py of stmtools 0.1.4), rebuilt here
# --------------------------------------------------------------------------------------------


@pytest.fixture
def stmat():
    """stmtools' ``stmat`` fixture: 50 points x 10 epochs on a 5 x 10 grid, chunked by 25."""
    npoints, ntime = 50, 10
    rng = np.random.default_rng(0)
    return xr.Dataset(
        data_vars={
            "amplitude": (("space", "time"), rng.random((npoints, ntime))),
            "phase": (("space", "time"), rng.random((npoints, ntime))),
            "pnt_height": ("space", rng.random(npoints)),
        },
        coords={
            "lon": ("space", np.arange(npoints, dtype=np.float64)),
            "lat": ("space", np.arange(npoints, dtype=np.float64)),
            "azimuth": ("space", np.repeat(np.arange(5), 10)),
            "range": ("space", np.tile(np.arange(10), 5)),
            "time": ("time", pd.date_range("2021-01-01", periods=ntime)),
        },
    ).chunk({"space": 25, "time": -1})


@pytest.fixture
def polygons():
    """Two parcels with a numeric and a text field; no point lies on an edge."""
    return gpd.GeoDataFrame(
        {"id": [1, 2], "name": ["north", "south"]},
        geometry=[shapely.box(-0.5, -0.5, 9.5, 9.5), shapely.box(19.5, 19.5, 29.5, 29.5)],
        crs="EPSG:4326",
    )


# --------------------------------------------------------------------------------------------
# stmtools: from_csv
# --------------------------------------------------------------------------------------------


def _by_point(ds, id_name):
    ids = np.asarray(ds[id_name].values).astype(str)
    return ds.isel(space=np.argsort(ids, kind="stable"))


def test_from_csv_accepts_stmtools_keywords_and_gives_the_same_values(peers, realdata):
    """Same keywords, same values per point. Deliberate: depsi stores points in Morton order
    (not file order) and holds per-epoch values as float32. (stmtools 0.1.4 truncates
    ``pnt_id`` to one character with older pandas/dask; depsi always keeps the whole text.)"""
    stmtools = peers[0]
    path = realdata / CSV
    keywords = {
        "spacetime_pattern": {"^d_": "deformation", "^a_": "amplitude", "^h2ph_": "h2ph"},
        "coords_cols": {"pnt_lat": "lat", "pnt_lon": "lon"},
        "output_chunksize": {"space": 1000, "time": -1},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = stmtools.from_csv(path, **keywords)
    ours = depsi.from_csv(path, **keywords)
    assert set(ours.coords) - {"space"} == set(theirs.coords) - {"space"}
    assert set(ours.data_vars) == set(theirs.data_vars)
    assert ours.chunksizes["space"][0] == theirs.chunksizes["space"][0] == 1000
    theirs = theirs.compute()
    np.testing.assert_array_equal(ours.time.values, theirs.time.values)
    ours = ours.compute()
    order = np.lexsort((ours.pnt_pixel.values, ours.pnt_line.values))
    ref = np.lexsort((theirs.pnt_pixel.values, theirs.pnt_line.values))
    for name in theirs.variables:
        if name == "space":
            continue
        a, b = ours[name].values[order] if "space" in ours[name].dims else ours[name].values, (
            theirs[name].values[ref] if "space" in theirs[name].dims else theirs[name].values)
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_from_csv_default_names_follow_depsi_conventions_on_purpose(peers, realdata):
    """Deliberate: without keywords depsi names by DESIGN.md §3 (``displacement``, ``azimuth``,
    ``range``, ``point_id``); stmtools says ``deformation`` and keeps ``pnt_*`` names."""
    stmtools = peers[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = stmtools.from_csv(realdata / CSV)
    ours = depsi.from_csv(realdata / CSV)
    assert "deformation" in theirs and "displacement" in ours
    assert {"azimuth", "range", "point_id"} <= set(ours.coords)
    np.testing.assert_array_equal(ours.time.values, theirs.time.values)


@pytest.mark.parametrize("keywords", [
    {"spacetime_pattern": {"^nothing_": "x"}},
    {"space_pattern": "^nothing_"},
])
def test_from_csv_refuses_patterns_matching_no_column_like_stmtools(peers, realdata, keywords):
    stmtools = peers[0]
    with pytest.raises(ValueError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stmtools.from_csv(realdata / CSV, **keywords)
    with pytest.raises(ValueError):
        depsi.from_csv(realdata / CSV, **keywords)


# --------------------------------------------------------------------------------------------
# stmtools: the .stm accessor
# --------------------------------------------------------------------------------------------


def test_add_metadata_same_attrs(peers, stmat):
    meta = {"techniqueId": "PS", "wavelength": 0.0555}
    assert theirs_stm(peers, stmat, "add_metadata", meta).attrs == ours_stm(
        stmat, "add_metadata", meta).attrs


@pytest.mark.parametrize("labels, dims", [
    ({"space_label": "points"}, ("points",)),
    ({"space_label": "points", "time_label": "epochs"}, ("points", "epochs")),
    ({}, ("space",)),
])
def test_regulate_dims_same_dims_and_values(peers, labels, dims):
    rng = np.random.default_rng(1)
    ds = xr.Dataset({
        "amplitude": (dims, rng.random((6, 3)[:len(dims)])),
        "pnt_height": (dims[:1], rng.random(6)),
    })
    theirs = theirs_stm(peers, ds, "regulate_dims", **labels)
    ours = ours_stm(ds, "regulate_dims", **labels)
    assert dict(ours.sizes) == dict(theirs.sizes)
    for name in ds.data_vars:
        assert ours[name].dims == theirs[name].dims
        np.testing.assert_array_equal(ours[name].values, theirs[name].values)


def test_regulate_dims_without_any_label_raises_like_stmtools(peers):
    ds = xr.Dataset({"a": (("p", "e"), np.zeros((2, 3)))})
    _raises_both(peers, ds, "regulate_dims", expected=ValueError)


def test_regulate_dims_with_a_missing_label_raises_like_stmtools(peers):
    ds = xr.Dataset({"a": (("p", "e"), np.zeros((2, 3)))})
    _raises_both(peers, ds, "regulate_dims", space_label="nope", expected=ValueError)


@pytest.mark.parametrize("threshold", [">0.5", "<0.3"])
def test_subset_threshold_same_points(peers, stmat, threshold):
    theirs = theirs_stm(peers, stmat, "subset", method="threshold", var="pnt_height",
                        threshold=threshold)
    ours = ours_stm(stmat, "subset", method="threshold", var="pnt_height", threshold=threshold)
    np.testing.assert_array_equal(ours.lon.values, theirs.lon.values)
    np.testing.assert_array_equal(ours.amplitude.values, theirs.amplitude.values)


def test_subset_keeps_integer_coordinates_where_stmtools_casts_them_to_float(peers, stmat):
    """Deliberate: stmtools selects with ``where(drop=True)``, which turns ``azimuth`` into
    float64; depsi indexes and keeps int64."""
    theirs = theirs_stm(peers, stmat, "subset", method="threshold", var="pnt_height",
                        threshold=">0.5")
    ours = ours_stm(stmat, "subset", method="threshold", var="pnt_height", threshold=">0.5")
    np.testing.assert_array_equal(ours.azimuth.values, theirs.azimuth.values)
    assert ours.azimuth.dtype == np.int64


@pytest.mark.parametrize("kwargs, expected", [
    ({"method": "threshold", "var": "pnt_height"}, ValueError),  # no threshold
    ({"method": "threshold", "threshold": ">1"}, ValueError),  # no var
    ({"method": "threshold", "var": "pnt_height", "threshold": "=1"}, ValueError),
    ({"method": "polygon"}, ValueError),  # no polygon
    ({"method": "nope"}, NotImplementedError),
])
def test_subset_bad_arguments_raise_like_stmtools(peers, stmat, kwargs, expected):
    _raises_both(peers, stmat, "subset", expected=expected, **kwargs)


def test_subset_without_time_dimension_raises_key_error_like_stmtools(peers, stmat):
    points = stmat.isel(time=0, drop=True)[["pnt_height"]]
    _raises_both(peers, points, "subset", method="threshold", var="pnt_height",
                 threshold=">0.5", expected=KeyError)


def test_subset_polygon_same_points(peers, stmat, polygons):
    theirs = theirs_stm(peers, stmat, "subset", method="polygon", polygon=polygons)
    ours = ours_stm(stmat, "subset", method="polygon", polygon=polygons)
    np.testing.assert_array_equal(ours.lon.values, theirs.lon.values)
    np.testing.assert_array_equal(ours.amplitude.values, theirs.amplitude.values)


def test_subset_polygon_from_a_file_same_points(peers, stmat, polygons, tmp_path):
    path = tmp_path / "parcels.gpkg"
    polygons.to_file(path)
    theirs = theirs_stm(peers, stmat, "subset", method="polygon", polygon=path)
    ours = ours_stm(stmat, "subset", method="polygon", polygon=path)
    np.testing.assert_array_equal(ours.lon.values, theirs.lon.values)


def test_subset_polygon_with_a_hole_same_points(peers, stmat):
    """A point in a polygon's hole is outside, for both (the hole case reported against
    stmtools does not reproduce with 0.1.4 on points; kept as a regression test)."""
    ring = shapely.Polygon(shapely.box(-0.5, -0.5, 9.5, 9.5).exterior.coords,
                           [shapely.box(2.5, 2.5, 4.5, 4.5).exterior.coords])
    frame = gpd.GeoDataFrame({"id": [1]}, geometry=[ring], crs="EPSG:4326")
    theirs = theirs_stm(peers, stmat, "subset", method="polygon", polygon=frame)
    ours = ours_stm(stmat, "subset", method="polygon", polygon=frame)
    assert sorted(ours.lon.values.tolist()) == [0, 1, 2, 5, 6, 7, 8, 9]
    np.testing.assert_array_equal(ours.lon.values, theirs.lon.values)


def test_stmtools_accessor_mutates_its_dataset_where_depsi_does_not(peers, stmat):
    """Deliberate: stmtools' methods assign their result to the accessor's ``_obj``, so the
    next call on the same ``ds.stm`` sees it (``get_order``, ``reorder``, ``add_metadata``)."""
    _, _, accessors = peers
    fresh = stmat.copy()
    with _peer_accessors(accessors):
        accessor = fresh.stm
        accessor.add_metadata({"a": 1})
    assert accessor._obj.attrs == {"a": 1}  # theirs: the accessor's Dataset changed
    ours = stmat.copy().stm
    ours.add_metadata({"a": 1})
    assert ours._obj.attrs == {}


def test_enrich_from_polygon_same_values_inside(peers, stmat, polygons):
    """Same values for points inside a polygon. Deliberate: outside every polygon depsi writes
    NaN (numbers) or "" (text) with a numeric/str dtype; stmtools writes None in an object
    array, which Zarr cannot store."""
    theirs = theirs_stm(peers, stmat, "enrich_from_polygon", polygons, ["id", "name"]).compute()
    ours = ours_stm(stmat, "enrich_from_polygon", polygons, ["id", "name"]).compute()
    inside = np.array([v is not None for v in theirs["id"].values])
    assert inside.sum() == 20
    np.testing.assert_array_equal(ours["id"].values[inside],
                                  theirs["id"].values[inside].astype(float))
    np.testing.assert_array_equal(ours["name"].values[inside],
                                  theirs["name"].values[inside].astype(str))
    assert np.isnan(ours["id"].values[~inside]).all()
    assert (ours["name"].values[~inside] == "").all()


def test_enrich_from_polygon_with_a_single_field_name(peers, stmat, polygons):
    theirs = theirs_stm(peers, stmat, "enrich_from_polygon", polygons, "id").compute()
    ours = ours_stm(stmat, "enrich_from_polygon", polygons, "id").compute()
    inside = np.array([v is not None for v in theirs["id"].values])
    np.testing.assert_array_equal(ours["id"].values[inside],
                                  theirs["id"].values[inside].astype(float))


@pytest.mark.parametrize("args", [
    ("nope",),  # unknown field
])
def test_enrich_from_polygon_unknown_field_raises_value_error_like_stmtools(peers, stmat,
                                                                           polygons, args):
    _raises_both(peers, stmat, "enrich_from_polygon", polygons, *args, expected=ValueError)


def test_enrich_from_polygon_unknown_coordinate_raises_value_error_like_stmtools(peers, stmat,
                                                                                polygons):
    _raises_both(peers, stmat, "enrich_from_polygon", polygons, "id", xlabel="x",
                 expected=ValueError)


@pytest.mark.parametrize("scales", [{}, {"xscale": 1.0, "yscale": 1.0}])
def test_get_order_same_morton_keys(peers, stmat, scales):
    theirs = theirs_stm(peers, stmat, "get_order", **scales).order.values
    ours = ours_stm(stmat, "get_order", **scales).order.values
    np.testing.assert_array_equal(ours.astype(np.int64), theirs)


def test_get_order_on_scaled_lon_lat_same_keys(peers, stmat):
    ds = stmat.assign_coords(lon=stmat.lon * 0.013 + 4.9, lat=stmat.lat * 0.011 + 52.3)
    kwargs = {"xlabel": "lon", "ylabel": "lat", "xscale": 1000.0, "yscale": 1000.0}
    theirs = theirs_stm(peers, ds, "get_order", **kwargs).order.values
    ours = ours_stm(ds, "get_order", **kwargs).order.values
    np.testing.assert_array_equal(ours.astype(np.int64), theirs)


def test_get_order_keeps_32_bits_where_stmtools_wraps_at_65536(peers, stmat):
    """Deliberate: pymorton (under stmtools) keeps only the low 16 bits of each scaled
    coordinate, so lat 52.3 scaled by 15000 (784 500) wraps and the order is wrong; depsi
    interleaves 32 bits. Below 65 536 the keys are equal (tests above)."""
    ds = stmat.assign_coords(lon=stmat.lon * 0.001 + 4.9, lat=stmat.lat * 0.001 + 52.3)
    kwargs = {"xlabel": "lon", "ylabel": "lat", "xscale": 15000.0, "yscale": 15000.0}
    theirs = theirs_stm(peers, ds, "get_order", **kwargs).order.values
    ours = ours_stm(ds, "get_order", **kwargs).order.values
    assert theirs.max() < 2**32 <= ours.max()
    x = np.floor(ds.lon.values * 15000).astype(np.int64) & 0xFFFF
    y = np.floor(ds.lat.values * 15000).astype(np.int64) & 0xFFFF
    from depsi.stm.order import morton_key
    np.testing.assert_array_equal(theirs, morton_key(y, x).astype(np.int64))


def test_reorder_same_order_of_points(peers, stmat):
    shuffled = stmat.isel(space=np.random.default_rng(2).permutation(stmat.sizes["space"]))
    theirs = theirs_stm(peers, shuffled, "reorder")
    ours = ours_stm(shuffled, "reorder")
    np.testing.assert_array_equal(ours.azimuth.values, theirs.azimuth.values)
    np.testing.assert_array_equal(ours.range.values, theirs.range.values)
    np.testing.assert_array_equal(ours.amplitude.values, theirs.amplitude.values)


def test_enrich_from_dataset_raster_same_values(peers, stmat):
    """A raster with (time, lat, lon) sampled at each point, nearest: same values."""
    rng = np.random.default_rng(3)
    lon = np.arange(-1.0, 52.0, 1.0)
    lat = np.arange(-1.0, 52.0, 1.0)
    raster = xr.Dataset(
        {"temperature": (("lat", "lon", "time"), rng.random((lat.size, lon.size, 10)))},
        coords={"time": stmat.time.values, "lat": lat, "lon": lon},
    )
    points = stmat.drop_vars(["azimuth", "range"])
    theirs = theirs_stm(peers, points, "enrich_from_dataset", raster, "temperature")
    ours = ours_stm(points, "enrich_from_dataset", raster, "temperature")
    assert ours["temperature"].dims == theirs["temperature"].dims == ("space", "time")
    np.testing.assert_array_equal(ours["temperature"].values, theirs["temperature"].values)


def test_enrich_from_dataset_points_same_values(peers, stmat):
    rng = np.random.default_rng(4)
    points = stmat.drop_vars(["azimuth", "range"])
    other = xr.Dataset(
        {"temperature": (("space", "time"), rng.random((30, 10)))},
        coords={"lon": ("space", rng.uniform(0, 50, 30)), "lat": ("space", rng.uniform(0, 50, 30)),
                "time": stmat.time.values},
    )
    theirs = theirs_stm(peers, points, "enrich_from_dataset", other, "temperature")
    ours = ours_stm(points, "enrich_from_dataset", other, "temperature")
    np.testing.assert_array_equal(ours["temperature"].values, theirs["temperature"].values)


def test_enrich_from_dataset_existing_field_raises_value_error_like_stmtools(peers, stmat):
    raster = xr.Dataset({"amplitude": (("time", "lat", "lon"), np.zeros((10, 2, 2)))},
                        coords={"time": stmat.time.values, "lat": [0.0, 1.0], "lon": [0.0, 1.0]})
    _raises_both(peers, stmat.drop_vars(["azimuth", "range"]), "enrich_from_dataset", raster,
                 "amplitude", expected=ValueError)


def test_enrich_from_dataset_unknown_field_raises_value_error_like_stmtools(peers, stmat):
    raster = xr.Dataset({"t": (("time", "lat", "lon"), np.zeros((10, 2, 2)))},
                        coords={"time": stmat.time.values, "lat": [0.0, 1.0], "lon": [0.0, 1.0]})
    _raises_both(peers, stmat.drop_vars(["azimuth", "range"]), "enrich_from_dataset", raster,
                 "nope", expected=ValueError)


# --------------------------------------------------------------------------------------------
# sarxarray: from_binary, from_dataset, multi_look, the .slcstack accessor
# --------------------------------------------------------------------------------------------

SCENES = ("sarxarray_slc/scene_0.binaray", "sarxarray_slc/scene_1.binaray")


def _theirs_stack(peers, func, *args, **kwargs):
    _, _, accessors = peers
    with _peer_accessors(accessors), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return func(*args, **kwargs)


@pytest.fixture
def binary_stacks(peers, realdata):
    sarxarray = peers[1]
    files = [realdata / f for f in SCENES]
    theirs = _theirs_stack(peers, sarxarray.from_binary, files, (100, 100), chunks=(50, 50))
    ours = depsi.io.from_binary(files, (100, 100), chunks=(50, 50))
    return theirs, ours


def test_from_binary_same_pixels(binary_stacks):
    """Same complex values and pixel/epoch coordinates. Deliberate: depsi reads ``complex``
    only (amplitude and phase are derived where needed, by ``.slcstack.mrm`` too)."""
    theirs, ours = binary_stacks
    np.testing.assert_array_equal(ours.complex.values, theirs.complex.values)
    for name in ("azimuth", "range", "time"):
        np.testing.assert_array_equal(ours[name].values, theirs[name].values)


def test_from_binary_refuses_a_string_like_sarxarray(peers, realdata):
    sarxarray = peers[1]
    path = str(realdata / SCENES[0])
    with pytest.raises(ValueError):
        _theirs_stack(peers, sarxarray.from_binary, path, (100, 100))
    # Deliberate: depsi reads one file given as a string (a one-epoch stack)
    assert depsi.io.from_binary(path, (100, 100)).sizes["time"] == 1


def test_mrm_same_map(peers, binary_stacks):
    theirs, ours = binary_stacks
    expected = _theirs_stack(peers, lambda: theirs.slcstack.mrm().values)
    np.testing.assert_allclose(ours.slcstack.mrm().values, expected, rtol=1e-6)


@pytest.mark.parametrize("statistics", ["mean", "median"])
def test_multi_look_same_values_and_coordinates(peers, binary_stacks, statistics):
    sarxarray = peers[1]
    theirs, _ = binary_stacks
    stack = theirs[["amplitude"]]
    expected = _theirs_stack(peers, sarxarray.multi_look, stack.copy(), (3, 4),
                             statistics=statistics)
    ours = depsi.io.multi_look(stack, (3, 4), statistics=statistics)
    assert dict(ours.sizes) == dict(expected.sizes)
    np.testing.assert_allclose(ours.amplitude.values, expected.amplitude.values, rtol=1e-6)
    np.testing.assert_array_equal(ours.azimuth.values, expected.azimuth.values)
    np.testing.assert_array_equal(ours.range.values, expected.range.values)
    assert ours.attrs["multi-look"] == expected.attrs["multi-look"]
    assert "multi-look" not in stack.attrs  # deliberate: sarxarray writes into its input


def test_multi_look_accessor_same_as_function(binary_stacks):
    _, ours = binary_stacks
    np.testing.assert_array_equal(ours.slcstack.multi_look((2, 2)).complex.values,
                                  depsi.io.multi_look(ours, (2, 2)).complex.values)


@pytest.mark.parametrize("kwargs", [
    {"window_size": (200, 2)},
    {"window_size": (2, 2), "method": "nope"},
    {"window_size": (2, 2), "statistics": "max"},
])
def test_multi_look_bad_arguments_raise_value_error_like_sarxarray(peers, binary_stacks, kwargs):
    sarxarray = peers[1]
    theirs, ours = binary_stacks
    with pytest.raises(ValueError):
        _theirs_stack(peers, sarxarray.multi_look, theirs, **kwargs)
    with pytest.raises(ValueError):
        depsi.io.multi_look(ours, **kwargs)


def test_point_selection_same_points(peers, binary_stacks):
    theirs, ours = binary_stacks
    expected = _theirs_stack(peers, lambda: theirs.slcstack.point_selection(0.6, chunks=100))
    selected = ours.slcstack.point_selection(0.6, chunks=100)
    assert 0 < selected.sizes["space"] < 10_000
    assert dict(selected.sizes) == dict(expected.sizes)
    np.testing.assert_array_equal(selected.azimuth.values, expected.azimuth.values)
    np.testing.assert_array_equal(selected.range.values, expected.range.values)
    np.testing.assert_array_equal(selected.complex.values, expected.complex.values)


def test_point_selection_unknown_method_raises_not_implemented_like_sarxarray(peers,
                                                                              binary_stacks):
    theirs, ours = binary_stacks
    with pytest.raises(NotImplementedError):
        _theirs_stack(peers, lambda: theirs.slcstack.point_selection(0.6, method="nmad"))
    with pytest.raises(NotImplementedError):
        ours.slcstack.point_selection(0.6, method="nmad")


def test_from_dataset_same_stack_without_changing_the_input(peers, realdata):
    """Same complex/amplitude/phase. Deliberate: sarxarray adds ``complex`` to the Dataset
    it is given; depsi leaves it as it was."""
    sarxarray = peers[1]
    source = xr.open_zarr(realdata / "sarxarray_slc/zarrs/slcs_example.zarr")
    theirs = _theirs_stack(peers, sarxarray.from_dataset, source.copy())
    ours = depsi.io.from_dataset(source)
    assert "complex" not in source
    for name in ("complex", "amplitude", "phase"):
        np.testing.assert_allclose(ours[name].values, theirs[name].values, rtol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("broken", ["slcs_example_broken_dim.zarr",
                                    "slcs_example_broken_vars.zarr"])
def test_from_dataset_refuses_broken_stores_like_sarxarray(peers, realdata, broken):
    sarxarray = peers[1]
    source = xr.open_zarr(realdata / "sarxarray_slc/zarrs" / broken)
    with pytest.raises(ValueError):
        _theirs_stack(peers, sarxarray.from_dataset, source.copy())
    with pytest.raises(ValueError):
        depsi.io.from_dataset(source)


def test_subset_polygon_includes_edge_points_where_stmtools_excludes_them(peers, stmat):
    """Deliberate: a point on a polygon's edge is inside for depsi (``covers``); stmtools'
    ``contains`` query leaves it out."""
    edge = gpd.GeoDataFrame({"id": [1]}, geometry=[shapely.box(0, 0, 9, 9)], crs="EPSG:4326")
    theirs = theirs_stm(peers, stmat, "subset", method="polygon", polygon=edge)
    ours = ours_stm(stmat, "subset", method="polygon", polygon=edge)
    assert sorted(theirs.lon.values.tolist()) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert sorted(ours.lon.values.tolist()) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_register_datatype_same_attrs_and_same_error(peers, stmat):
    theirs = theirs_stm(peers, stmat, "register_datatype", ["amplitude", "phase"], "obsData")
    ours = ours_stm(stmat, "register_datatype", ["amplitude", "phase"], "obsData")
    assert ours.attrs == theirs.attrs
    _raises_both(peers, stmat, "register_datatype", "nope", "obsData", expected=ValueError)


def test_register_metadata_same_attrs(peers, stmat):
    meta = {"techniqueId": "PS", "datasetId": "demo", "obsDataKeys": ["amplitude"]}
    assert ours_stm(stmat, "register_metadata", meta).attrs == theirs_stm(
        peers, stmat, "register_metadata", meta).attrs


def test_num_points_and_num_epochs_same(peers, stmat):
    _, _, accessors = peers
    with _peer_accessors(accessors):
        theirs = (stmat.copy().stm.num_points, stmat.copy().stm.num_epochs)
    assert (stmat.copy().stm.num_points, stmat.copy().stm.num_epochs) == theirs


def test_subset_density_is_offered_where_stmtools_0_1_4_has_none(peers, stmat):
    """Deliberate: stmtools 0.1.4 documents ``method="density"`` but raises
    NotImplementedError; depsi keeps one point per dx by dy cell."""
    with pytest.raises(NotImplementedError):
        theirs_stm(peers, stmat, "subset", method="density", dx=10.0, dy=10.0)
    assert ours_stm(stmat, "subset", method="density", dx=10.0, dy=10.0).sizes["space"] == 5


def test_stmtools_readme_workflow_runs_unchanged_with_the_same_points(peers, realdata, tmp_path):
    """stmtools' README workflow (read with patterns, subset by a polygon file, enrich from
    it, threshold on a point attribute, reorder by scaled lon/lat), run with stmtools and with
    depsi: the same points come out."""
    stmtools = peers[0]
    polygon_file = tmp_path / "area.gpkg"
    gpd.GeoDataFrame({"district": ["centre"]},
                     geometry=[shapely.box(4.9095, 52.3455, 4.9115, 52.3470)],
                     crs="EPSG:4326").to_file(polygon_file)

    def workflow(reader, run):
        stm = reader(realdata / CSV, spacetime_pattern={"^d_": "deformation", "^a_": "amplitude",
                                                        "^h2ph_": "h2ph"},
                     coords_cols={"pnt_lat": "lat", "pnt_lon": "lon"},
                     output_chunksize={"space": 500, "time": -1})
        stm = run(stm, "subset", method="polygon", polygon=str(polygon_file))
        stm = run(stm, "enrich_from_polygon", str(polygon_file), "district")
        stm = run(stm, "subset", method="threshold", var="pnt_enscoh", threshold=">0.7")
        return run(stm, "reorder", xlabel="lon", ylabel="lat", xscale=1000.0,
                   yscale=1000.0).compute()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = workflow(stmtools.from_csv,
                          lambda ds, m, *a, **k: theirs_stm(peers, ds, m, *a, **k))
    ours = workflow(depsi.from_csv, ours_stm)
    assert 0 < ours.sizes["space"] < 2500
    # the same Morton keys in the same sequence; points with equal keys keep their earlier
    # order, which is file order for stmtools and depsi's stored Morton order (deliberate)
    np.testing.assert_array_equal(ours.order.values.astype(np.int64), theirs.order.values)
    ours, theirs = _by_point(ours, "pnt_id"), _by_point(theirs, "pnt_id")
    np.testing.assert_array_equal(ours.pnt_id.values, theirs.pnt_id.values.astype(str))
    np.testing.assert_allclose(ours.deformation.values, theirs.deformation.values, atol=1e-7)
    assert (ours.district.values == "centre").all()


def test_from_csv_takes_stmtools_float_blocksize(realdata):
    ds = depsi.from_csv(realdata / CSV, blocksize=200e6)
    assert ds.chunks is not None and ds.sizes["space"] == 2500
