"""Differential tests against the real peers: stmtools 0.1.4 and sarxarray 1.4.0.

Each test calls the peer and depsi the same way on the same input and compares what comes
back, including which bad inputs raise. Where depsi differs on purpose (the peers' known bugs, or a
convention of docs/design.md, "Data model"), the test says so in its name and docstring;
docs/migration.md lists the same differences.

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


def test_from_csv_without_keywords_equals_stmtools(peers, realdata):
    """Called as stmtools' users call it, ``from_csv(file)`` gives stmtools' names, dims,
    coordinates (``space`` included), chunks, dtypes and values, in file order."""
    stmtools = peers[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = stmtools.from_csv(realdata / CSV)
    ours = depsi.from_csv(realdata / CSV)
    assert set(ours.coords) == set(theirs.coords)
    assert set(ours.data_vars) == set(theirs.data_vars)
    assert ours.chunks == theirs.chunks
    for name in theirs.variables:
        assert ours[name].dims == theirs[name].dims, name
    xr.testing.assert_equal(ours.compute(), theirs.compute())
    for name in theirs.variables:
        assert ours[name].values.dtype == theirs[name].values.dtype, name


def test_from_csv_names_depsi_keeps_depsi_conventions(peers, realdata):
    """``names="depsi"``: docs/design.md, "Data model" names (``displacement``, ``azimuth``,
    ``range``, ``point_id``), float32 epochs, Morton order; the same values per point as
    stmtools."""
    stmtools = peers[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = stmtools.from_csv(realdata / CSV).compute()
    ours = depsi.from_csv(realdata / CSV, names="depsi")
    assert {"azimuth", "range", "point_id"} <= set(ours.coords) and "displacement" in ours
    assert ours.displacement.dtype == np.float32
    ours, theirs = _by_point(ours, "point_id"), _by_point(theirs, "pnt_id")
    np.testing.assert_allclose(ours.displacement.values, theirs.deformation.values, atol=1e-7)
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


def test_subset_polygon_excludes_edge_points_like_stmtools(peers, stmat):
    """A point on a polygon's edge is outside, as stmtools' ``contains`` query has it;
    ``include_boundary=True`` (depsi only) counts it inside."""
    edge = gpd.GeoDataFrame({"id": [1]}, geometry=[shapely.box(0, 0, 9, 9)], crs="EPSG:4326")
    theirs = theirs_stm(peers, stmat, "subset", method="polygon", polygon=edge)
    ours = ours_stm(stmat, "subset", method="polygon", polygon=edge)
    assert sorted(theirs.lon.values.tolist()) == [1, 2, 3, 4, 5, 6, 7, 8]
    np.testing.assert_array_equal(ours.lon.values, theirs.lon.values)
    covered = ours_stm(stmat, "subset", method="polygon", polygon=edge, include_boundary=True)
    assert sorted(covered.lon.values.tolist()) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_enrich_from_polygon_excludes_edge_points_like_stmtools(peers, stmat):
    edge = gpd.GeoDataFrame({"id": [1]}, geometry=[shapely.box(0, 0, 9, 9)], crs="EPSG:4326")
    theirs = theirs_stm(peers, stmat, "enrich_from_polygon", edge, "id").compute()
    ours = ours_stm(stmat, "enrich_from_polygon", edge, "id").compute()
    inside = np.array([v is not None for v in theirs["id"].values])
    np.testing.assert_array_equal(~np.isnan(ours["id"].values), inside)


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


@pytest.mark.slow
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
    # the same Morton keys and the same points in the same sequence (both read in file order)
    np.testing.assert_array_equal(ours.order.values.astype(np.int64), theirs.order.values)
    np.testing.assert_array_equal(ours.pnt_id.values, theirs.pnt_id.values.astype(str))
    np.testing.assert_allclose(ours.deformation.values, theirs.deformation.values, atol=1e-7)
    assert (ours.district.values == "centre").all()


def test_from_csv_takes_stmtools_float_blocksize(realdata):
    ds = depsi.from_csv(realdata / CSV, blocksize=200e6)
    assert ds.chunks is not None and ds.sizes["space"] == 2500


# --------------------------------------------------------------------------------------------
# The peers' own expectations. Each test below is one test of stmtools' (tests/test_io.py,
# tests/test_stm.py) or sarxarray's (tests/test_io.py, tests/test_stack.py) suite, on the same
# inputs and with the same defaults, run once with the peer (so that the port is checked) and
# once with depsi's function of the same name. A deviation listed in docs/migration.md is an
# xfail on depsi's run only, naming the deviation; read_metadata and private helpers are left
# out (depsi's read_metadata is not the same dict, see docs/migration.md).
# --------------------------------------------------------------------------------------------

IMPLEMENTATIONS = ("peer", "depsi")


class _Impl:
    """One library's way to call the names under test, as its users call them."""

    def __init__(self, which, peers):
        self.which, self.peers = which, peers

    @property
    def is_peer(self):
        return self.which == "peer"

    def from_csv(self, *args, **kwargs):
        if self.is_peer:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return self.peers[0].from_csv(*args, **kwargs)
        return depsi.from_csv(*args, **kwargs)

    def stm(self, ds, method, /, *args, **kwargs):
        if self.is_peer:
            return theirs_stm(self.peers, ds, method, *args, **kwargs)
        return ours_stm(ds, method, *args, **kwargs)

    def stm_property(self, ds, name):
        if self.is_peer:
            with _peer_accessors(self.peers[2]):
                return getattr(ds.copy().stm, name)
        return getattr(ds.copy().stm, name)

    def sar(self, name, *args, **kwargs):
        """sarxarray's module-level function ``name`` or depsi.io's."""
        if self.is_peer:
            return _theirs_stack(self.peers, getattr(self.peers[1], name), *args, **kwargs)
        return getattr(depsi.io, name)(*args, **kwargs)

    def slcstack(self, ds, method, /, *args, **kwargs):
        if self.is_peer:
            return _theirs_stack(self.peers, lambda: getattr(ds.slcstack, method)(*args, **kwargs))
        return getattr(ds.slcstack, method)(*args, **kwargs)


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request, peers):
    return _Impl(request.param, peers)


def deviation(request, impl, reason):
    """Mark depsi's run of this expectation as a listed deviation (strict xfail)."""
    if not impl.is_peer:
        request.applymarker(pytest.mark.xfail(reason=f"docs/migration.md: {reason}",
                                              strict=True))


@pytest.fixture
def example_csv(realdata):
    return realdata / CSV


# ---- stmtools tests/test_io.py ---------------------------------------------------------------


def test_stmtools_expectation_readcsv_dims(impl, example_csv):
    assert dict(impl.from_csv(example_csv).sizes) == {"space": 2500, "time": 11}


def test_stmtools_expectation_readcsv_vars(impl, example_csv):
    expected = {"pnt_height", "pnt_ampconsist", "pnt_enscoh", "pnt_line", "pnt_id", "pnt_flags",
                "pnt_pixel", "pnt_linear", "pnt_demheight", "pnt_demheight_highres",
                "amplitude", "h2ph", "deformation"}
    assert set(impl.from_csv(example_csv).data_vars) == expected


def test_stmtools_expectation_readcsv_output_chunksize(impl, example_csv):
    data = impl.from_csv(example_csv, output_chunksize={"space": 1000, "time": -1})
    assert data.chunks["space"][0] == 1000
    assert data.chunks["time"][0] == 11


def test_stmtools_expectation_readcsv_custom_var_name(impl, example_csv):
    data = impl.from_csv(example_csv,
                         spacetime_pattern={"^d_": "defo", "^a_": "amp", "^h2ph_": "h2ph"})
    assert {"defo", "amp"} <= set(data.data_vars)
    assert not {"deformation", "amplitude"} <= set(data.data_vars)


def test_stmtools_expectation_readcsv_list_coords(impl, example_csv):
    data = impl.from_csv(example_csv, coords_cols=["pnt_lat", "pnt_lon"])
    assert {"pnt_lat", "pnt_lon"} <= set(data.coords)
    assert not {"lat", "lon"} <= set(data.coords)


def test_stmtools_expectation_readcsv_custom_coords(impl, example_csv):
    data = impl.from_csv(example_csv, coords_cols={"pnt_lat": "lat_cus", "pnt_lon": "lon_cus"})
    assert {"lat_cus", "lon_cus"} <= set(data.coords)
    assert "pnt_lat" not in data.coords
    assert not {"lat", "lon"} <= set(data.coords)


def test_stmtools_expectation_readcsv_wrong_pattern(impl, example_csv):
    with pytest.raises(ValueError):
        impl.from_csv(example_csv, spacetime_pattern={"nonexist": "nonexist_data"})


def test_stmtools_expectation_readcsv_timevalues(impl, example_csv):
    data = impl.from_csv(example_csv)
    assert data.time.values[0] == pd.Timestamp("2016-03-27")
    assert data.time.values[-1] == pd.Timestamp("2016-07-15")
    assert (data.time.values[1:] - data.time.values[:-1]).min() > pd.Timedelta("0s")
    assert len(data.time.values) == 11
    assert data.time.dtype == "datetime64[ns]"


def test_stmtools_expectation_readcsv_undated_columns_give_epoch_numbers(request, impl,
                                                                         example_csv, tmp_path):
    deviation(request, impl, "from_csv: dates must be YYYYMMDD; stmtools falls back to epoch "
                             "numbers 0, 1, ... for the whole file, depsi refuses the column")
    frame = pd.read_csv(example_csv)
    frame = frame.rename(columns={f"{p}_20160429": f"{p}_2016/4/29" for p in ("d", "a", "h2ph")})
    frame.to_csv(tmp_path / "example.csv", index=False)
    assert impl.from_csv(tmp_path / "example.csv").time.values[0] == 0


# ---- stmtools tests/test_stm.py (fixtures of its conftest.py and test_stm.py) -----------------


@pytest.fixture
def peer_stmat():
    """stmtools' conftest ``stmat`` (10 points x 5 epochs, Dask), with the ``pnt_height`` its
    ``test_register_datatype`` asks for."""
    import dask.array as da

    return xr.Dataset(
        {"amplitude": (("space", "time"), da.arange(50).reshape((10, 5))),
         "phase": (("space", "time"), da.arange(50).reshape((10, 5))),
         "pnt_height": ("space", da.arange(10))},
        coords={"lon": ("space", da.arange(10)), "lat": ("space", da.arange(10)),
                "time": ("time", np.arange(5))},
    ).unify_chunks()


@pytest.fixture
def peer_stmat_rd(peer_stmat):
    return peer_stmat.drop_vars("pnt_height").rename({"lon": "rdx", "lat": "rdy"})


@pytest.fixture
def stmat_only_point():
    import dask.array as da

    return xr.Dataset(
        {"amplitude": ("space", da.arange(10)), "phase": ("space", da.arange(10)),
         "pnt_height": ("space", da.arange(10))},
        coords={"lon": ("space", da.arange(10)), "lat": ("space", da.arange(10))},
    ).unify_chunks()


def _quadrilateral(corners):
    return shapely.Polygon([*corners, corners[0]])


@pytest.fixture
def peer_polygon():
    """stmtools' ``polygon``: (1, 1) and (3, 3) are vertices (on the boundary), (2, 2) inside."""
    return gpd.GeoDataFrame({"ID": ["001"], "temperature": [15.24]},
                            geometry=[_quadrilateral([(1, 1), (1, 2), (3, 3), (2, 1)])],
                            crs="EPSG:4326")


@pytest.fixture
def peer_multi_polygon():
    return gpd.GeoDataFrame(
        {"ID": ["001", "002"], "temperature": [15.24, 14.12]},
        geometry=[_quadrilateral([(1, 1), (1, 2), (3, 3), (2, 1)]),
                  _quadrilateral([(5, 5), (5, 6), (7, 7), (6, 5)])],
        crs="EPSG:4326")


def test_stmtools_expectation_time_dim_exists(impl, stmat_only_point):
    assert "time" in impl.stm(stmat_only_point, "regulate_dims").dims


def test_stmtools_expectation_time_dim_size_one(impl, stmat_only_point):
    assert impl.stm(stmat_only_point, "regulate_dims").sizes["time"] == 1


def test_stmtools_expectation_time_dim_customed_label(impl, stmat_only_point):
    ds = stmat_only_point.rename({"space": "space2"})
    regulated = impl.stm(ds, "regulate_dims", space_label="space2")
    assert regulated.sizes["time"] == 1 and regulated.sizes["space"] == 10


def test_stmtools_expectation_pnt_time_dim_nonexists(impl, stmat_only_point):
    assert "time" not in impl.stm(stmat_only_point, "regulate_dims")["pnt_height"].dims


def test_stmtools_expectation_subset_works_after_regulate_dims(impl, stmat_only_point):
    regulated = impl.stm(stmat_only_point, "regulate_dims")
    subset = impl.stm(regulated, "subset", method="threshold", var="pnt_height", threshold=">5")
    assert subset.sizes["space"] == 4


def test_stmtools_expectation_numpoints_and_numepochs(impl, peer_stmat):
    assert impl.stm_property(peer_stmat, "num_points") == 10
    assert impl.stm_property(peer_stmat, "num_epochs") == 5


def test_stmtools_expectation_register_datatype(impl, peer_stmat):
    registered = impl.stm(peer_stmat, "register_datatype", "pnt_height", "pntAttrib")
    assert "pnt_height" in registered.attrs["pntAttrib"]


def test_stmtools_expectation_register_datatype_nonexists(impl, peer_stmat):
    with pytest.raises(ValueError):
        impl.stm(peer_stmat, "register_datatype", "non_exist", "pntAttrib")


def test_stmtools_expectation_subset_missing_dimension(impl, stmat_only_point):
    with pytest.raises(KeyError):
        impl.stm(stmat_only_point, "subset", method="threshold", var="pnt_height",
                 threshold=">5")


def test_stmtools_expectation_subset_missing_value(impl, peer_stmat):
    with pytest.raises(ValueError):
        impl.stm(peer_stmat, "subset", method="threshold", var="pnt_height", threshold=">")


def test_stmtools_expectation_subset_method_not_implemented(impl, peer_stmat):
    with pytest.raises(NotImplementedError):
        impl.stm(peer_stmat, "subset", method="something_else")


def test_stmtools_expectation_subset_with_threshold(impl, peer_stmat):
    import dask.array as da

    values = np.ones(10)
    values[:3] = 3
    ds = peer_stmat.assign(thres=("space", da.from_array(values)))
    assert impl.stm(ds, "subset", method="threshold", var="thres", threshold=">2").equals(
        ds.sel(space=[0, 1, 2]))
    assert impl.stm(ds, "subset", method="threshold", var="thres", threshold="<2").equals(
        ds.sel(space=range(3, 10)))


def test_stmtools_expectation_subset_with_polygons(impl, peer_stmat, peer_polygon):
    subset = impl.stm(peer_stmat, "subset", method="polygon", polygon=peer_polygon)
    assert subset.equals(peer_stmat.sel(space=[2]))


def test_stmtools_expectation_subset_with_polygons_rd(impl, peer_stmat_rd, peer_polygon):
    subset = impl.stm(peer_stmat_rd, "subset", method="polygon", polygon=peer_polygon,
                      xlabel="rdx", ylabel="rdy")
    assert subset.equals(peer_stmat_rd.sel(space=[2]))


def test_stmtools_expectation_subset_with_multi_polygons(impl, peer_stmat, peer_multi_polygon):
    subset = impl.stm(peer_stmat, "subset", method="polygon", polygon=peer_multi_polygon)
    assert subset.equals(peer_stmat.sel(space=[2, 6]))


def test_stmtools_expectation_subset_with_multi_polygons_file(impl, peer_stmat,
                                                              peer_multi_polygon, tmp_path):
    path = tmp_path / "multi_polygon.gpkg"
    peer_multi_polygon.to_file(path)
    subset = impl.stm(peer_stmat, "subset", method="polygon", polygon=path)
    assert subset.equals(peer_stmat.sel(space=[2, 6]))


def _enriched_values(ds, field):
    """stmtools' check: the values of the points inside (None outside for stmtools; depsi's
    NaN/"" outside is a listed deviation, so both are left out here)."""
    values = np.asarray(ds[field].values)
    return [v for v in values if v is not None and v == v and v != ""]


@pytest.mark.parametrize("fields", ["ID", ["ID", "temperature"]])
def test_stmtools_expectation_enrich_one_polygon(impl, peer_stmat, peer_polygon, fields):
    enriched = impl.stm(peer_stmat, "enrich_from_polygon", peer_polygon, fields)
    for field in [fields] if isinstance(fields, str) else fields:
        assert field in enriched.data_vars
        assert np.all(_enriched_values(enriched, field) == np.array(peer_polygon[field]))


@pytest.mark.parametrize("fields", ["ID", ["ID", "temperature"]])
def test_stmtools_expectation_enrich_multi_polygon(impl, peer_stmat, peer_multi_polygon, fields):
    enriched = impl.stm(peer_stmat, "enrich_from_polygon", peer_multi_polygon, fields)
    for field in [fields] if isinstance(fields, str) else fields:
        assert field in enriched.data_vars
        assert np.all(_enriched_values(enriched, field) == np.array(peer_multi_polygon[field]))


def test_stmtools_expectation_enrich_multi_polygon_from_file(impl, peer_stmat,
                                                             peer_multi_polygon, tmp_path):
    path = tmp_path / "multi_polygon.gpkg"
    peer_multi_polygon.to_file(path)
    enriched = impl.stm(peer_stmat, "enrich_from_polygon", path, ["ID", "temperature"])
    for field in ("ID", "temperature"):
        assert np.all(_enriched_values(enriched, field) == np.array(peer_multi_polygon[field]))


def test_stmtools_expectation_enrich_exceptions(impl, peer_stmat, peer_multi_polygon):
    with pytest.raises(NotImplementedError):
        impl.stm(peer_stmat, "enrich_from_polygon", 999, "field")
    with pytest.raises(ValueError):
        impl.stm(peer_stmat, "enrich_from_polygon", peer_multi_polygon, "non_exist_field")


def _grid(azimuth, range_):
    import dask.array as da

    return xr.Dataset(coords={"azimuth": ("space", da.from_array(np.array(azimuth))),
                              "range": ("space", da.from_array(np.array(range_)))}).unify_chunks()


STMAT_XY = ([0, 1, 2, 3] * 4, [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)
STMAT_MORTON = ([0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3],
                [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3])


def test_stmtools_expectation_order_attr_exists(impl):
    ordered = impl.stm(_grid(*STMAT_XY), "get_order", xlabel="azimuth", ylabel="range")
    assert "order" in ordered.keys() and isinstance(ordered.order, xr.DataArray)


def test_stmtools_expectation_order(impl):
    ordered = impl.stm(_grid(*STMAT_XY), "get_order", xlabel="azimuth", ylabel="range")
    ordered = ordered.sortby(ordered.order)
    morton = _grid(*STMAT_MORTON)
    assert ordered.azimuth.equals(morton.azimuth) and ordered.range.equals(morton.range)


def test_stmtools_expectation_reorder(impl):
    ordered = impl.stm(_grid(*STMAT_XY), "reorder", xlabel="azimuth", ylabel="range")
    morton = _grid(*STMAT_MORTON)
    assert ordered.azimuth.equals(morton.azimuth) and ordered.range.equals(morton.range)


def test_stmtools_expectation_reorder_lonlat(impl):
    a = [0.00, 0.07, 0.14, 0.21] * 4
    r = [0.00] * 4 + [0.06] * 4 + [0.12] * 4 + [0.18] * 4
    lonlat = _grid(a, r)
    morton = _grid([0.00, 0.07, 0.00, 0.07, 0.14, 0.21, 0.14, 0.21] * 2,
                   [0.00, 0.00, 0.06, 0.06, 0.00, 0.00, 0.06, 0.06,
                    0.12, 0.12, 0.18, 0.18, 0.12, 0.12, 0.18, 0.18])
    naive = impl.stm(lonlat, "reorder", xlabel="azimuth", ylabel="range")
    scaled = impl.stm(lonlat, "reorder", xlabel="azimuth", ylabel="range", xscale=15, yscale=17)
    assert not naive.azimuth.equals(morton.azimuth)
    assert not naive.range.equals(morton.range)
    assert scaled.azimuth.equals(morton.azimuth) and scaled.range.equals(morton.range)


# ---- sarxarray tests/test_io.py and tests/test_stack.py ---------------------------------------


@pytest.fixture
def peer_slcs(realdata):
    return [str(realdata / f) for f in SCENES]


def test_sarxarray_expectation_from_dataset_normal(impl, realdata):
    source = xr.open_zarr(realdata / "sarxarray_slc/zarrs/slcs_example.zarr")
    slcs = impl.sar("from_dataset", source.copy())
    assert all(dim in slcs.sizes for dim in ("azimuth", "range", "time"))
    assert all(var not in slcs.variables for var in ("real", "imag"))
    assert all(var in slcs.variables for var in ("complex", "amplitude", "phase"))


@pytest.mark.parametrize("broken", ["slcs_example_broken_dim.zarr",
                                    "slcs_example_broken_vars.zarr"])
def test_sarxarray_expectation_from_dataset_broken(impl, realdata, broken):
    source = xr.open_zarr(realdata / "sarxarray_slc/zarrs" / broken)
    with pytest.raises(ValueError):
        impl.sar("from_dataset", source.copy())


@pytest.mark.parametrize("one", [False, True])
def test_sarxarray_expectation_loading_vars_and_coords(request, impl, peer_slcs, one):
    deviation(request, impl, "from_binary reads only complex; amplitude and phase are derived "
                             "where needed")
    files = peer_slcs[:1] if one else peer_slcs
    stack = impl.sar("from_binary", files, (100, 100), dtype=np.complex64, chunks=(10, 10))
    assert {"complex", "amplitude", "phase"} <= set(stack.data_vars)
    assert {"azimuth", "range", "time"} <= set(stack.coords)
    assert stack.sizes == {"azimuth": 100, "range": 100, "time": len(files)}
    stack.compute()


def test_sarxarray_expectation_loading_custom_var(request, impl, peer_slcs):
    deviation(request, impl, "from_binary: vlabel is not provided (the variable is complex)")
    stack = impl.sar("from_binary", peer_slcs, (100, 100), dtype=np.complex64, chunks=(10, 10),
                     vlabel="other_types")
    assert "other_types" in stack.data_vars
    assert stack.sizes == {"azimuth": 100, "range": 100, "time": 2}


@pytest.mark.parametrize("chunks, expected", [((10, 10), (10, 10)), ((30, 30), (30, 30)),
                                              ((20, 40), (20, 40)), (None, (100, 100))])
def test_sarxarray_expectation_loading_chunksizes(impl, peer_slcs, chunks, expected):
    kwargs = {} if chunks is None else {"chunks": chunks}
    stack = impl.sar("from_binary", peer_slcs, (100, 100), dtype=np.complex64, **kwargs)
    assert (stack.chunks["azimuth"][0], stack.chunks["range"][0]) == expected


def test_sarxarray_expectation_loading_slcs_string_failing(request, impl, peer_slcs):
    deviation(request, impl, "from_binary accepts one path given as a string (one epoch)")
    with pytest.raises(ValueError):
        impl.sar("from_binary", peer_slcs[0], (100, 100), dtype=np.complex64, chunks=(10, 10))


def test_sarxarray_expectation_loading_slcs_empty_failing(impl):
    with pytest.raises(ValueError):
        impl.sar("from_binary", [], (100, 100), dtype=np.complex64, chunks=(10, 10))


def test_sarxarray_expectation_loading_wrong_customized_dtype_failing(request, impl, peer_slcs):
    deviation(request, impl, "from_binary reads any two-field structured dtype as (real, "
                             "imaginary), whatever the field names")
    with pytest.raises(TypeError):
        impl.sar("from_binary", peer_slcs, (100, 100),
                 dtype=np.dtype([("error1", np.float32), ("error2", np.float32)]),
                 chunks=(10, 10))


NUMPY_STAYS_NUMPY = ("multi_look of a NumPy-backed stack stays NumPy-backed (sarxarray "
                     "chunks it 'auto', so its test asserts ds.chunks)")


@pytest.fixture
def synthetic_stack():
    """sarxarray's ``synthetic_dataset`` (tests/test_stack.py), seeded."""
    rng = np.random.default_rng(5)
    return xr.Dataset(
        {"complex": (("azimuth", "range", "time"),
                     rng.random((10, 10, 10)) + 1j * rng.random((10, 10, 10)))},
        coords={"azimuth": np.arange(600, 610), "range": np.arange(1400, 1410),
                "time": np.arange(1, 11)},
    )


@pytest.mark.parametrize("window, statistics", [((2, 2), "mean"), ((2, 2), "median"),
                                                ((2, 3), "mean")])
def test_sarxarray_expectation_stack_multi_look(request, impl, synthetic_stack, window,
                                                statistics):
    deviation(request, impl, NUMPY_STAYS_NUMPY)
    ds = synthetic_stack
    looked = impl.slcstack(ds, "multi_look", window_size=window, method="coarsen",
                           statistics=statistics)
    n_az, n_rg = 10 // window[0], 10 // window[1]
    assert (looked.azimuth.size, looked.range.size, looked.time.size) == (n_az, n_rg, 10)
    assert looked.attrs["multi-look"] == f"coarsen-{statistics}"
    assert looked.chunks == {"azimuth": (n_az,), "range": (n_rg,), "time": (10,)}
    window_values = ds.complex.isel(azimuth=slice(0, window[0]), range=slice(0, window[1]),
                                    time=0).values
    reduce = np.mean if statistics == "mean" else np.median
    assert np.allclose(looked.complex.isel(azimuth=0, range=0, time=0).values,
                       reduce(window_values))
    assert np.allclose(looked.azimuth.values, np.arange(n_az))
    assert np.allclose(looked.range.values, np.arange(n_rg))
    assert np.allclose(looked.time.values, ds.time.values)


def test_sarxarray_expectation_stack_multi_look_compute_false(request, impl, synthetic_stack):
    from dask.delayed import Delayed

    deviation(request, impl, NUMPY_STAYS_NUMPY)
    delayed = impl.slcstack(synthetic_stack, "multi_look", window_size=(2, 3),
                            method="coarsen", statistics="mean", compute=False)
    assert isinstance(delayed, Delayed)
    results = delayed.compute()
    assert (results.azimuth.size, results.range.size, results.time.size) == (5, 3, 10)
    assert results.chunks == {"azimuth": (5,), "range": (3,), "time": (10,)}
    assert results.attrs["multi-look"] == "coarsen-mean"
