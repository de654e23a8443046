"""write_znap: a simulated stack as SNAP znap products, read back by from_snap."""

from __future__ import annotations

import json

import numpy as np
import pytest

from depsi.geometry import GeometryError, StackGeometry, radar_to_geo
from depsi.io import from_snap
from depsi.io.znap_writer import _date_tag, write_znap
from depsi.simulate import simulate_stack, simulated_geometry

METRES_PER_DEGREE = 111_320.0
SHAPE = (40, 50)


@pytest.fixture(scope="module")
def scene():
    stack, _ = simulate_stack(shape=SHAPE, n_epochs=5, seed=1)
    geometry = simulated_geometry(stack)
    raster = stack.drop_vars([c for c in stack.coords if c not in stack.dims])
    return raster, geometry


@pytest.fixture(scope="module")
def folder(tmp_path_factory, scene):
    raster, geometry = scene
    path = tmp_path_factory.mktemp("znap")
    write_znap(path, raster, geometry)
    return path


def _products(folder):
    return sorted(folder.glob("*.znap"))


def _distance_m(lat_a, lon_a, lat_b, lon_b):
    north = (lat_a - lat_b) * METRES_PER_DEGREE
    east = (lon_a - lon_b) * METRES_PER_DEGREE * np.cos(np.deg2rad(lat_b))
    return np.hypot(north, east)


def test_one_product_per_date_in_the_real_layout(folder, scene):
    raster, geometry = scene
    days = [np.datetime_as_string(t, unit="D").replace("-", "") for t in raster["time"].values]
    assert [p.name for p in _products(folder)] == [f"{d}-coreg.znap" for d in days]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left
    for k, product in enumerate(_products(folder)):
        assert json.loads((product / ".zgroup").read_text()) == {"zarr_format": 2}
        root = json.loads((product / ".zattrs").read_text())
        assert root["znap_format"] == "0.1"
        assert (root["product_scene_raster_height"], root["product_scene_raster_width"]) == SHAPE
        bands = {p.name for p in product.iterdir() if (p / ".zarray").is_file()}
        tag = _date_tag(raster["time"].values[k])
        expected = {f"i_VV_{tag}", f"q_VV_{tag}", "latitude", "longitude"}
        if k != geometry.mother:
            expected.add(f"h2ph_VV_{tag}")
        assert bands == expected
        array = json.loads((product / f"i_VV_{tag}" / ".zarray").read_text())
        assert array["dtype"] == ">f4" and array["dimension_separator"] == "."
        assert array["zarr_format"] == 2 and array["shape"] == list(SHAPE)
        assert json.loads((product / f"q_VV_{tag}" / ".zattrs").read_text())[
            "_ARRAY_DIMENSIONS"] == ["y", "x"]
        grid = json.loads((product / "latitude" / ".zarray").read_text())
        assert grid["dtype"] == ">f4" and min(grid["shape"]) >= 3
        attrs = json.loads((product / "latitude" / ".zattrs").read_text())
        assert attrs["_ARRAY_DIMENSIONS"] == ["yt", "xt"]
        assert {"offset_x", "offset_y", "subsampling_x", "subsampling_y"} <= set(attrs)
        assert (product / "SNAP" / ".zgroup").is_file()


def test_metadata_holds_the_mother_timing_and_every_orbit(folder, scene):
    raster, geometry = scene
    elements = {e["name"]: e for e in json.loads(
        (_products(folder)[0] / "SNAP" / "product_metadata.json").read_text())}
    fields = {a["name"]: a["data"] for a in elements["Abstracted_Metadata"]["attributes"]}
    assert fields["radar_frequency"]["type"] == "float64"
    assert fields["radar_frequency"]["elems"][0] == pytest.approx(
        299_792_458.0 / geometry.wavelength / 1e6)
    assert fields["first_line_time"]["type"] == "utc"
    assert len(fields["first_line_time"]["elems"]) == 3
    vectors = {e["name"]: e for e in elements["Abstracted_Metadata"]["elements"]}[
        "Orbit_State_Vectors"]["elements"]
    orbit = geometry.mother_orbit
    assert len(vectors) == int(round(orbit.time[-1] - orbit.time[0])) + 1  # every second
    slave = elements["Slave_Metadata"]
    mother_tag = json.dumps(slave["attributes"][0]["data"]["elems"])
    assert "mst" in mother_tag
    assert len(slave["elements"]) == raster.sizes["time"] - 1
    assert all("_Orb_" in e["name"] for e in slave["elements"])


def test_round_trip_is_bit_for_bit(folder, scene):
    raster, geometry = scene
    ds = from_snap(_products(folder))
    assert np.array_equal(ds["time"].values, raster["time"].values)
    assert ds["complex"].dtype == np.complex64
    assert np.array_equal(ds["complex"].values.view(np.uint64),
                          raster["complex"].values.astype(np.complex64).view(np.uint64))
    assert np.array_equal(ds["h2ph"].values, raster["h2ph"].values)
    assert ds.attrs["wavelength"] == pytest.approx(raster.attrs["wavelength"], rel=1e-12)
    mother = np.datetime_as_string(raster["time"].values[geometry.mother], unit="D")
    assert ds.attrs["coregistration_mother_time"] == mother


def test_orbit_h2ph_agrees_with_the_written_h2ph(folder, scene):
    raster, geometry = scene
    ds = from_snap(_products(folder), geometry="orbits")
    secondaries = [k for k in range(raster.sizes["time"]) if k != geometry.mother]
    written = raster["h2ph"].values[..., secondaries]
    orbits = ds["h2ph"].values[..., secondaries]
    np.testing.assert_allclose(orbits, written, rtol=1e-4, atol=0)
    assert np.array_equal(ds["h2ph_product"].values, raster["h2ph"].values)


def test_tie_point_lat_lon_lie_within_a_metre_of_geocoding(folder, scene):
    _, geometry = scene
    ds = from_snap(_products(folder))
    az, rg = np.meshgrid(np.arange(SHAPE[0], dtype=float), np.arange(SHAPE[1], dtype=float),
                         indexing="ij")
    lat, lon = radar_to_geo(geometry, az, rg)
    assert _distance_m(ds["lat"].values, ds["lon"].values, lat, lon).max() < 1.0


def test_orbits_and_grid_come_back(folder, scene):
    _, geometry = scene
    read = StackGeometry.from_attrs(from_snap(_products(folder)).attrs)
    assert read.mother == geometry.mother
    assert read.height == pytest.approx(geometry.height)
    assert len(read.orbits) == len(geometry.orbits)
    for original, back in zip(geometry.orbits, read.orbits):
        moments = original.reference + (original.time * 1e9).astype("timedelta64[ns]")
        p0, v0, _ = original.state(original.time)
        p1, v1, _ = back.state(np.array([back.seconds(m) for m in moments]))
        assert np.abs(p1 - p0).max() < 1e-6
        assert np.abs(v1 - v0).max() < 1e-6
    grid = read.grid
    assert abs((grid.first_line_time - geometry.grid.first_line_time)
               / np.timedelta64(1, "ns")) <= 500
    assert grid.line_interval == geometry.grid.line_interval
    assert grid.near_range == geometry.grid.near_range
    assert grid.range_spacing == geometry.grid.range_spacing
    assert grid.look_side == geometry.grid.look_side


def test_a_subset_keeps_its_place_on_the_grid(tmp_path, scene):
    raster, geometry = scene
    subset = raster.isel(azimuth=slice(10, 30), range=slice(5, 45))
    ds = from_snap(write_znap(tmp_path, subset, geometry))
    assert ds.attrs["azimuth_offset"] == 10 and ds.attrs["range_offset"] == 5
    assert np.array_equal(ds["complex"].values, subset["complex"].values)
    az, rg = np.meshgrid(subset["azimuth"].values.astype(float),
                         subset["range"].values.astype(float), indexing="ij")
    lat, lon = radar_to_geo(geometry, az, rg)
    assert _distance_m(ds["lat"].values, ds["lon"].values, lat, lon).max() < 1.0
    orbit_ds = from_snap(sorted(tmp_path.glob("*.znap")), geometry="orbits")
    secondaries = [k for k in range(subset.sizes["time"]) if k != geometry.mother]
    written = subset["h2ph"].values[..., secondaries]
    np.testing.assert_allclose(orbit_ds["h2ph"].values[..., secondaries], written, rtol=1e-4,
                               atol=0)


def test_existing_products_are_kept_unless_overwrite(tmp_path, scene):
    raster, geometry = scene
    write_znap(tmp_path, raster, geometry)
    with pytest.raises(FileExistsError, match="overwrite"):
        write_znap(tmp_path, raster, geometry)
    changed = raster.assign(complex=raster["complex"] * 2)
    products = write_znap(tmp_path, changed, geometry, overwrite=True)
    assert np.array_equal(from_snap(products)["complex"].values, changed["complex"].values)
    assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in products]


def test_the_polarisation_names_the_bands(tmp_path, scene):
    raster, geometry = scene
    products = write_znap(tmp_path, raster, geometry, polarisation="VH")
    assert any(p.name.startswith("i_VH_") for p in products[0].iterdir())
    assert from_snap(products, polarisation="VH").sizes["time"] == raster.sizes["time"]


def test_bad_input_is_refused_before_anything_is_written(tmp_path, scene):
    raster, geometry = scene
    with pytest.raises(ValueError, match="polarisation"):
        write_znap(tmp_path / "a", raster, geometry, polarisation="XX")
    with pytest.raises(GeometryError, match="one orbit per epoch"):
        write_znap(tmp_path / "b", raster.isel(time=[0, 1, 2]), geometry)
    with pytest.raises(ValueError, match="complex"):
        write_znap(tmp_path / "c", raster.drop_vars("complex"), geometry)
    with pytest.raises(ValueError, match="consecutive"):
        write_znap(tmp_path / "d", raster.isel(range=[0, 2, 3]), geometry)
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------------------------
# Damaged products: refused naming the file, before any pixel is read
# ----------------------------------------------------------------------------------------------

@pytest.fixture()
def copied(tmp_path, folder):
    import shutil

    shutil.copytree(folder, tmp_path / "stack")
    return tmp_path / "stack"


def _band(copied, kind="i", index=1):
    product = _products(copied)[index]
    return product, next(product.glob(f"{kind}_VV_*"))


def _rewrite_zarray(band, change):
    meta = json.loads((band / ".zarray").read_text())
    change(meta)
    (band / ".zarray").write_text(json.dumps(meta))


def test_a_chunk_of_the_wrong_size_names_the_chunk_and_its_band(copied):
    _, band = _band(copied, "q")
    chunk = band / "0.0"
    chunk.write_bytes(chunk.read_bytes()[:-8])
    expected = SHAPE[0] * SHAPE[1] * 4
    with pytest.raises(ValueError, match=rf"band '{band.name}' chunk '.*0\.0': expected "
                                         rf"{expected} bytes .*found {expected - 8}"):
        from_snap(_products(copied))


def test_a_band_of_another_byte_order_than_its_product_is_refused(copied):
    _, band = _band(copied, "i")
    _rewrite_zarray(band, lambda meta: meta.update(dtype="<f4"))
    with pytest.raises(ValueError, match=rf"'dtype': expected one byte order .*big-endian.*"
                                         rf"'{band.name}/\.zarray' \(<f4\)"):
        from_snap(_products(copied))


def test_a_zarray_without_shape_names_the_file_and_the_key(copied):
    _, band = _band(copied, "h2ph")
    _rewrite_zarray(band, lambda meta: meta.pop("shape"))
    with pytest.raises(ValueError, match=rf"{band.name}/\.zarray': expected the keys "
                                         r"\['shape', 'chunks', 'dtype'\], found no \['shape'\]"):
        from_snap(_products(copied))


def _another_day(tag: str) -> str:
    """``19Mar2023`` -> ``28Mar2023`` (``27Mar2023`` for the 28th)."""
    return ("27" if tag[:2] == "28" else "28") + tag[2:]


def test_a_band_renamed_to_another_date_is_refused(copied):
    product, band = _band(copied, "i")
    old = band.name[-9:]
    new = _another_day(old)
    for named in product.glob(f"*_VV_{old}"):
        named.rename(product / named.name.replace(old, new))
    with pytest.raises(ValueError, match=rf"band '\w+_VV_{new}': expected one of the bands its "
                                         r"\.zattrs lists"):
        from_snap(_products(copied))


def test_a_band_dated_on_no_acquisition_of_the_metadata_is_refused(copied):
    product, band = _band(copied, "i")
    old = band.name[-9:]
    new = _another_day(old)
    for named in product.glob(f"*_VV_{old}"):
        named.rename(product / named.name.replace(old, new))
    root = json.loads((product / ".zattrs").read_text())
    root["original_raster_data_node_order"] = [
        b.replace(old, new) for b in root["original_raster_data_node_order"]]
    (product / ".zattrs").write_text(json.dumps(root))
    with pytest.raises(ValueError, match=rf"product_metadata\.json': band 'i_VV_{new}' .*"
                                         r"expected its date .* to be that of an acquisition"):
        from_snap(_products(copied))
