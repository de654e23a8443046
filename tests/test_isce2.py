"""ISCE2 topsStack reader and writer: a round trip keeps pixels, dates, orbits and geometry;
malformed stacks fail with the file and field named, before any pixel is read."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from depsi.geometry import (
    GeometryError,
    Orbit,
    RadarGrid,
    StackGeometry,
    baselines,
    look_geometry,
)
from depsi.io.isce2 import ISCE2Error, from_isce2, read_image_header, read_swath_product
from depsi.io.isce2_writer import write_isce2
from depsi.io.raster_geometry import h2ph_raster
from depsi.simulate import simulate_stack

SHAPE = (40, 50)
DATES = np.array(["2023-03-07", "2023-03-19", "2023-03-31", "2023-04-12", "2023-04-24"],
                 dtype="datetime64[ns]")
#: SNAP's pair: 2023-03-31 is the mother (Abstracted_Metadata), 2023-03-19 the secondary.
MOTHER = 2
#: Offsets (m, radial) of the orbits reused for the dates SNAP has no product for.
SHIFTS = (-40.0, 0.0, 0.0, 30.0, 60.0)
SPEED_OF_LIGHT = 299_792_458.0
#: SNAP writes UTC times as [days, seconds, microseconds] since 2000-01-01.
MJD2000 = np.datetime64("2000-01-01T00:00:00", "ns")


def _snap_time(value: list[int]) -> np.datetime64:
    days, seconds, micro = value
    return (MJD2000 + np.timedelta64(days, "D") + np.timedelta64(seconds, "s")
            + np.timedelta64(micro, "us"))


def _abstracted(product: Path) -> dict:
    elements = json.loads((product / "SNAP" / "product_metadata.json").read_text())
    return next(e for e in elements if e["name"] == "Abstracted_Metadata")


def _value(abstracted: dict, name: str):
    return next(a["data"]["elems"] for a in abstracted["attributes"] if a["name"] == name)


def _snap_orbit(abstracted: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Times (seconds of day), positions and velocities of SNAP's Orbit_State_Vectors."""
    vectors = next(e for e in abstracted["elements"] if e["name"] == "Orbit_State_Vectors")
    times, positions, velocities = [], [], []
    for vector in vectors["elements"]:
        fields = {a["name"]: a["data"]["elems"] for a in vector["attributes"]}
        moment = _snap_time(fields["time"])
        times.append((moment - moment.astype("datetime64[D]")) / np.timedelta64(1, "ns") * 1e-9)
        positions.append([fields[f"{c}_pos"][0] for c in "xyz"])
        velocities.append([fields[f"{c}_vel"][0] for c in "xyz"])
    return np.array(times), np.array(positions), np.array(velocities)


def _secondary(product: Path) -> dict:
    elements = json.loads((product / "SNAP" / "product_metadata.json").read_text())
    return next(e for e in elements if e["name"] == "Slave_Metadata")["elements"][0]


def sentinel1_geometry(realdata: Path) -> StackGeometry:
    """Five Sentinel-1 epochs 12 days apart from the real SNAP pair's orbits (2023-03-31 the
    mother, 2023-03-19 its secondary), the others those orbits moved radially by tens of
    metres."""
    product = realdata / "sarxarray_slc" / "zarrs" / "20230319-coreg.znap"
    mother, other = _abstracted(product), _secondary(product)
    assert _value(other, "first_line_time")[0] == _value(mother, "first_line_time")[0] - 12
    sources = [other, other, mother, mother, other]
    orbits = []
    for k, (source, shift) in enumerate(zip(sources, SHIFTS)):
        t, position, velocity = _snap_orbit(source)
        radial = position / np.linalg.norm(position, axis=1)[:, None]
        orbits.append(Orbit(DATES[k], t, position + shift * radial, velocity,
                            source=f"SNAP orbit, epoch {k}"))
    grid = RadarGrid(first_line_time=_snap_time(_value(mother, "first_line_time")),
                     line_interval=_value(mother, "line_time_interval")[0],
                     near_range=_value(mother, "slant_range_to_first_pixel")[0],
                     range_spacing=_value(mother, "range_spacing")[0])
    wavelength = SPEED_OF_LIGHT / (_value(mother, "radar_frequency")[0] * 1e6)
    return StackGeometry(grid, orbits, mother=MOTHER, wavelength=wavelength,
                         height=_value(mother, "avg_scene_height")[0])


@pytest.fixture(scope="module")
def written(realdata, tmp_path_factory):
    geometry = sentinel1_geometry(realdata)
    stack, _ = simulate_stack(shape=SHAPE, n_epochs=5, seed=1)
    stack = stack.assign_coords(time=DATES)
    stack.attrs = {**stack.attrs, "wavelength": geometry.wavelength}
    folder = tmp_path_factory.mktemp("isce2") / "stack"
    info = write_isce2(folder, stack, geometry)
    return {"folder": folder, "stack": stack, "geometry": geometry, "info": info}


@pytest.fixture(scope="module")
def opened(written):
    return from_isce2(written["folder"])


@pytest.fixture
def copy(written, tmp_path):
    """A private copy of the written stack, to break."""
    return Path(shutil.copytree(written["folder"], tmp_path / "stack"))


@pytest.fixture
def no_pixel_reads(monkeypatch):
    """Any memory map or raw read fails: the error under test must come before."""
    def refuse(*args, **kwargs):
        raise AssertionError("a pixel was read before the input was checked")
    monkeypatch.setattr(np, "memmap", refuse)
    monkeypatch.setattr(np, "fromfile", refuse)


def _raw(path: Path, dtype: str, bands: int = 1) -> np.ndarray:
    data = np.fromfile(path, dtype=dtype)
    return data.reshape(SHAPE[0], bands, SHAPE[1]) if bands > 1 else data.reshape(SHAPE)


# ----------------------------------------------------------------------------------------------
# The round trip
# ----------------------------------------------------------------------------------------------

def test_round_trip_keeps_complex_values_bit_for_bit(written, opened):
    expected = written["stack"]["complex"].values
    found = opened["complex"].values
    assert found.dtype == np.complex64
    assert np.array_equal(found.view(np.uint64), expected.view(np.uint64))


def test_round_trip_keeps_dates_wavelength_and_mother(written, opened):
    assert np.array_equal(opened["time"].values, DATES)
    assert opened.attrs["wavelength"] == written["geometry"].wavelength
    assert opened.attrs["mother_time"] == "2023-03-31"
    assert StackGeometry.from_attrs(opened.attrs).mother == MOTHER


def test_round_trip_orbits_agree_within_a_micrometre(written, opened):
    original = written["geometry"]
    read = StackGeometry.from_attrs(opened.attrs)
    for k, (before, after) in enumerate(zip(original.orbits, read.orbits)):
        assert after.reference == np.datetime64(DATES[k], "ns")
        assert np.diff(after.time).max() <= 10.0 + 1e-6  # sampled every 10 s
        position, velocity, _ = before.state(after.time)
        assert np.abs(after.position - position).max() < 1e-6
        assert np.abs(after.velocity - velocity).max() < 1e-9


def test_round_trip_keeps_the_radar_grid(written, opened):
    before, after = written["geometry"].grid, StackGeometry.from_attrs(opened.attrs).grid
    assert abs((after.first_line_time - before.first_line_time) / np.timedelta64(1, "ns")) < 1e3
    assert after.line_interval == before.line_interval
    assert after.near_range == before.near_range
    assert after.range_spacing == before.range_spacing


def test_lat_lon_are_the_written_files_and_their_geocoding(written, opened):
    geom = written["folder"] / "merged" / "geom_reference"
    lat, lon = _raw(geom / "lat.rdr.full", "<f8"), _raw(geom / "lon.rdr.full", "<f8")
    assert np.array_equal(opened["lat"].values, lat)
    assert np.array_equal(opened["lon"].values, lon)
    az, rg = np.meshgrid(np.arange(SHAPE[0]), np.arange(SHAPE[1]), indexing="ij")
    look = look_geometry(written["geometry"], az, rg)
    assert np.array_equal(lat, look["lat"]) and np.array_equal(lon, look["lon"])
    assert 52.0 < lat.mean() < 53.0 and 4.0 < lon.mean() < 5.5  # Amsterdam, SNAP's scene


def test_height_is_hgt_and_geocodes_the_geometry(written, opened):
    hgt = _raw(written["folder"] / "merged" / "geom_reference" / "hgt.rdr.full", "<f8")
    assert np.array_equal(opened["height"].values, hgt)
    assert StackGeometry.from_attrs(opened.attrs).height == written["geometry"].height


def test_h2ph_zero_at_the_mother_and_equal_to_the_original_orbits(written, opened):
    h2ph = opened["h2ph"].values
    assert h2ph.shape == (*SHAPE, 5) and h2ph.dtype == np.float32
    assert np.all(h2ph[:, :, MOTHER] == 0.0)
    expected = h2ph_raster(written["geometry"], np.arange(SHAPE[0]), np.arange(SHAPE[1]),
                           opened["complex"].chunks).compute()
    assert np.allclose(h2ph, expected, rtol=1e-5, atol=1e-9)


def test_los_gives_incidence_heading_and_the_look_vector(written, opened):
    az, rg = np.meshgrid(np.arange(SHAPE[0]), np.arange(SHAPE[1]), indexing="ij")
    look = look_geometry(written["geometry"], az, rg)
    # float32 angles in the file: 1e-4 degrees
    assert np.allclose(opened["incidence"].values, look["incidence"], atol=1e-4)
    for name in ("los_east", "los_north", "los_up"):
        assert np.allclose(opened[name].values, look[name], atol=2e-6)
    # heading from the LOS azimuth assumes the LOS horizontal and square to the track; the
    # velocity's own heading at the target differs by about 0.1 degree
    assert np.allclose(opened["heading"].values, look["heading"], atol=0.2)
    assert -172.0 < float(opened["heading"].mean()) < -169.0  # descending Sentinel-1


def test_los_band_two_is_isce_azimuth_from_north_anticlockwise(written):
    los = _raw(written["folder"] / "merged" / "geom_reference" / "los.rdr.full", "<f4", 2)
    look = look_geometry(written["geometry"], 20, 25)
    # the target-to-satellite vector's azimuth, from north anticlockwise (Topozero)
    azimuth = np.rad2deg(np.arctan2(-look["los_east"], look["los_north"]))
    assert abs(los[20, 1, 25] - azimuth) < 1e-4 and abs(los[20, 0, 25] - look["incidence"]) < 1e-4
    # MintPy utils0.heading2azimuth_angle: about 90 - heading for a right-looking radar
    assert abs(los[20, 1, 25] - ((90.0 - look["heading"] + 180.0) % 360.0 - 180.0)) < 0.2


def test_baseline_text_has_isce_sign_and_layout(written):
    text = (written["folder"] / "baselines" / "20230331_20230412" /
            "20230331_20230412.txt").read_text()
    assert re.fullmatch(r"swath: IW1\nBperp \(average\): \S+\nBpar \(average\): \S+\n", text)
    bperp = float(re.search(r"Bperp \(average\): (\S+)", text).group(1))
    depsi = baselines(written["geometry"], (SHAPE[0] - 1) / 2, (SHAPE[1] - 1) / 2)["bperp"][3]
    assert bperp == pytest.approx(-depsi)  # right-looking: ISCE's sign is the opposite
    assert depsi > 0  # the mother's orbit moved 30 m up sees the point from higher
    assert -30.0 < bperp < -10.0  # 30 m up, seen at about 40 degrees off the vertical


def test_reference_xml_follows_the_product_manager_layout(written):
    root = ET.parse(written["folder"] / "reference" / "IW1.xml").getroot()
    assert root.tag == "productmanager_name"
    burst = root.find("component[@name='instance']/component[@name='bursts']/"
                      "component[@name='burst1']")
    start = burst.find("property[@name='burststartutc']/value").text
    assert re.fullmatch(r"2023-03-31 \d\d:\d\d:\d\d\.\d{6}", start)
    names = [c.get("name") for c in burst.findall(
        "component[@name='orbit']/component[@name='state_vectors']/component")]
    assert names == sorted(names) and len(names) >= 4  # string-sorted, as ISCE's dumper
    product = read_swath_product(written["folder"] / "secondarys" / "20230319" / "IW1.xml")
    assert product.wavelength == written["geometry"].wavelength
    assert np.all(np.diff(product.state_time) > np.timedelta64(0, "ns"))


def test_image_header_from_vrt_equals_the_xml(written):
    slc = written["info"]["slc"][0]
    from_xml = read_image_header(slc)
    Path(f"{slc}.xml").rename(f"{slc}.xml.away")
    try:
        from_vrt = read_image_header(slc)
    finally:
        Path(f"{slc}.xml.away").rename(f"{slc}.xml")
    keep = ("width", "length", "bands", "data_type", "scheme", "byteorder")
    assert all(getattr(from_xml, k) == getattr(from_vrt, k) for k in keep)
    los = read_image_header(written["info"]["geometry"]["los"])
    assert (los.bands, los.scheme, los.data_type) == (2, "BIL", "FLOAT")


def test_lazy_graph_holds_file_names_not_pixels(opened):
    import pickle

    graph = dict(opened["complex"].data.__dask_graph__())
    assert len(pickle.dumps(graph)) < 20_000


# ----------------------------------------------------------------------------------------------
# Malformed stacks: the file and the field named, before any pixel is read
# ----------------------------------------------------------------------------------------------

def test_width_disagreeing_with_the_file_size_names_file_field_and_bytes(copy, no_pixel_reads):
    xml = copy / "merged" / "SLC" / "20230331" / "20230331.slc.full.xml"
    xml.write_text(re.sub(r'(<property name="width">\s*<value>)50<', r"\g<1>49<",
                          xml.read_text()))
    with pytest.raises(ISCE2Error) as caught:
        from_isce2(copy)
    message = str(caught.value)
    assert "20230331.slc.full'" in message and "'width' 49" in message
    assert f"expected {40 * 49 * 8} bytes" in message and f"found {40 * 50 * 8} bytes" in message


def test_a_missing_secondary_xml_is_named(copy, no_pixel_reads):
    (copy / "secondarys" / "20230412" / "IW1.xml").unlink()
    with pytest.raises(FileNotFoundError, match=r"secondary 20230412 .*secondarys/20230412/"
                                                r"IW\*\.xml"):
        from_isce2(copy)


def test_a_missing_lat_file_is_named(copy, no_pixel_reads):
    for path in (copy / "merged" / "geom_reference").glob("lat.rdr.full*"):
        path.unlink()
    with pytest.raises(FileNotFoundError, match=r"expected 'lat\.rdr\.full'"):
        from_isce2(copy)


def test_a_lat_file_without_its_raw_data_is_named(copy, no_pixel_reads):
    (copy / "merged" / "geom_reference" / "lat.rdr.full").unlink()
    with pytest.raises(FileNotFoundError, match=r"lat\.rdr\.full'.*expected the raw file"):
        from_isce2(copy)


def test_a_product_without_sensing_start_names_the_field(copy, no_pixel_reads):
    xml = copy / "reference" / "IW1.xml"
    xml.write_text(xml.read_text().replace('name="sensingstart"', 'name="sensing"'))
    with pytest.raises(ISCE2Error, match=r"IW1\.xml', burst 1: field 'sensingstart'"):
        from_isce2(copy)


def test_neither_orbits_nor_baselines_is_an_error(copy, no_pixel_reads):
    for name in ("reference", "secondarys", "baselines", "merged/baselines"):
        shutil.rmtree(copy / name)
    with pytest.raises(GeometryError, match=r"expected orbits in reference/\*\.xml or "
                                            r"baselines in merged/baselines, found neither"):
        from_isce2(copy)


def test_a_virtual_mosaic_is_refused_with_the_way_out(copy, no_pixel_reads):
    slc = copy / "merged" / "SLC" / "20230307" / "20230307.slc.full"
    slc.unlink()  # mergeBursts.py with virtual files writes only the .xml and the .vrt
    vrt = Path(f"{slc}.vrt")
    vrt.write_text(vrt.read_text().replace("VRTRawRasterBand", "VRTSourcedRasterBand"))
    with pytest.raises(ISCE2Error, match="virtual_merge False"):
        from_isce2(copy)


# ----------------------------------------------------------------------------------------------
# Without orbits: baselines
# ----------------------------------------------------------------------------------------------

def test_without_state_vectors_h2ph_comes_from_the_baseline_files(copy, opened):
    for xml in [copy / "reference" / "IW1.xml", *copy.glob("secondarys/*/IW1.xml")]:
        root = ET.parse(xml).getroot()
        for orbit in root.iter("component"):
            vectors = orbit.find("component[@name='state_vectors']")
            if vectors is not None:
                orbit.remove(vectors)
        ET.ElementTree(root).write(xml)
    ds = from_isce2(copy)
    assert "sar_geometry" not in ds.attrs and ds.attrs["mother_time"] == "2023-03-31"
    assert ds["bperp"].values[MOTHER] == 0.0
    centre = (SHAPE[0] // 2, SHAPE[1] // 2)
    # one average Bperp per date: within a few per mille of the orbits' h2ph at the centre
    assert np.allclose(ds["h2ph"].values[centre], opened["h2ph"].values[centre], rtol=5e-3)


def test_stripmap_layout_reads_pixels_geometry_and_baselines(copy, written, caplog):
    """stripmapStack names: DATE.slc, lat.rdr, baselines/REF_SEC.txt; metadata in shelves."""
    for path in sorted(copy.glob("merged/SLC/*/*.slc.full*")) + sorted(
            copy.glob("merged/geom_reference/*.rdr.full*")):
        path.rename(path.with_name(path.name.replace(".full", "")))
    for name in ("reference", "secondarys", "baselines", "merged/baselines"):
        shutil.rmtree(copy / name)
    (copy / "baselines").mkdir()
    (copy / "baselines" / "20230331_20230424.txt").write_text(
        "PERP_BASELINE_BOTTOM -61.0\nPERP_BASELINE_TOP -63.0\n")
    for day in ("20230307", "20230319", "20230412"):
        (copy / "baselines" / f"20230331_{day}.txt").write_text(
            "PERP_BASELINE_BOTTOM 1.0\nPERP_BASELINE_TOP 1.0\n")
    ds = from_isce2(copy)
    assert np.array_equal(ds["complex"].values, written["stack"]["complex"].values)
    assert ds["bperp"].values.tolist() == [-1.0, -1.0, 0.0, -1.0, 62.0]
    assert "h2ph" not in ds and "only 'bperp' per date" in caplog.text


def test_merged_grid_of_several_swaths_starts_at_the_first_line_and_nearest_range():
    from depsi.io.isce2 import SwathProduct, _merged_grid

    def swath(number, start_s, stop_s, near, samples):
        day = np.datetime64("2023-03-31T05:50:00", "ns")
        return SwathProduct(Path(f"IW{number}.xml"), number,
                            day + np.timedelta64(int(start_s * 1e9), "ns"),
                            day + np.timedelta64(int(stop_s * 1e9), "ns"), 0.002, near, 2.0,
                            samples, 0.0555, "DESCENDING", np.array([], "datetime64[ns]"),
                            np.empty((0, 3)), np.empty((0, 3)))

    grid, shape = _merged_grid([swath(2, 1.0, 3.0, 850_000.0, 1001),
                                swath(1, 0.5, 2.5, 800_000.0, 1001)])
    assert grid.first_line_time == np.datetime64("2023-03-31T05:50:00.5", "ns")
    assert grid.near_range == 800_000.0 and grid.look_side == "right"
    # mergeBurstsVirtual: round((3.0 - 0.5) / dt) + 1 lines, round((852000 - 800000) / dr) + 1
    assert shape == (1251, 26001)
