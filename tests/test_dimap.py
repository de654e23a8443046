"""SNAP BEAM-DIMAP: a simulated raster written with a real Sentinel-1 geometry reads back whole.

The geometry is the real SNAP pair's (``tests/data/sarxarray_slc/zarrs/*-coreg.znap``): the
31 Mar 2023 mother's timing and orbit, the 19 Mar 2023 secondary's orbit; three more epochs 12
days apart reuse those orbits shifted by tens of metres.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from depsi.geometry import Orbit, RadarGrid, StackGeometry, baselines, radar_to_geo
from depsi.io.dimap import from_dimap
from depsi.io.dimap_writer import write_dimap
from depsi.simulate import simulate_stack

pytestmark = pytest.mark.realdata

MJD2000 = np.datetime64("2000-01-01T00:00:00", "ns")
DATES = np.array(["2023-03-07", "2023-03-19", "2023-03-31", "2023-04-12", "2023-04-24"],
                 dtype="datetime64[ns]")
MOTHER = 2
#: Metres per degree of latitude (and of longitude at the equator).
METRES_PER_DEGREE = 111_320.0


def _utc(elems: list[int]) -> np.datetime64:
    days, seconds, micro = elems
    return (MJD2000 + np.timedelta64(days, "D") + np.timedelta64(seconds, "s")
            + np.timedelta64(micro, "us"))


def _attributes(element: dict) -> dict:
    return {a["name"]: a.get("data", {}).get("elems") for a in element.get("attributes", [])}


def _snap_orbit(element: dict, source: str) -> Orbit:
    vectors = next(e for e in element["elements"] if e["name"] == "Orbit_State_Vectors")
    rows = [_attributes(v) for v in vectors["elements"]]
    times = [_utc(r["time"]) for r in rows]
    reference = times[0]
    return Orbit(reference=reference,
                 time=[(t - reference) / np.timedelta64(1, "ns") * 1e-9 for t in times],
                 position=[[r[k][0] for k in ("x_pos", "y_pos", "z_pos")] for r in rows],
                 velocity=[[r[k][0] for k in ("x_vel", "y_vel", "z_vel")] for r in rows],
                 source=source)


def _shifted(orbit: Orbit, days: int, shift: tuple[float, float, float]) -> Orbit:
    return Orbit(reference=orbit.reference + np.timedelta64(days, "D"), time=orbit.time,
                 position=orbit.position + np.array(shift), velocity=orbit.velocity,
                 source=f"{orbit.source} + {days} d")


@pytest.fixture(scope="module")
def geometry(realdata: Path) -> StackGeometry:
    folder = realdata / "sarxarray_slc" / "zarrs"
    pair = {}
    for day in ("20230319", "20230331"):
        file = folder / f"{day}-coreg.znap" / "SNAP" / "product_metadata.json"
        pair[day] = {e["name"]: e for e in json.loads(file.read_text())}
    abstracted = pair["20230331"]["Abstracted_Metadata"]
    timing = _attributes(abstracted)
    mother = _snap_orbit(abstracted, "31Mar2023")
    secondary = _snap_orbit(pair["20230319"]["Slave_Metadata"]["elements"][0], "19Mar2023")
    grid = RadarGrid(first_line_time=_utc(timing["first_line_time"]),
                     line_interval=timing["line_time_interval"][0],
                     near_range=timing["slant_range_to_first_pixel"][0],
                     range_spacing=timing["range_spacing"][0],
                     look_side=timing["antenna_pointing"])
    orbits = (_shifted(secondary, -12, (20.0, -35.0, 15.0)), secondary, mother,
              _shifted(mother, 12, (-40.0, 25.0, 30.0)),
              _shifted(secondary, 36, (55.0, 10.0, -45.0)))
    wavelength = 299_792_458.0 / (timing["radar_frequency"][0] * 1e6)
    return StackGeometry(grid=grid, orbits=orbits, mother=MOTHER, wavelength=wavelength,
                         height=timing["avg_scene_height"][0])


@pytest.fixture(scope="module")
def stack(geometry: StackGeometry):
    simulated, _ = simulate_stack(shape=(40, 50), n_epochs=5, seed=1, start="2023-03-07",
                                  mother_index=MOTHER, wavelength=geometry.wavelength)
    return simulated.compute()


@pytest.fixture(scope="module")
def product(tmp_path_factory, stack, geometry) -> Path:
    return write_dimap(tmp_path_factory.mktemp("dimap") / "stack.dim", stack, geometry)


def _copy(product: Path, folder: Path) -> Path:
    import shutil

    shutil.copy(product, folder / product.name)
    shutil.copytree(product.with_suffix(".data"), folder / product.with_suffix(".data").name)
    return folder / product.name


# ----------------------------------------------------------------------------------------------
# Round trip
# ----------------------------------------------------------------------------------------------

def test_round_trip_keeps_complex_bit_for_bit(product, stack):
    ds = from_dimap(product)
    assert ds["complex"].dtype == np.complex64
    assert np.array_equal(ds["complex"].values.view(np.uint64),
                          stack["complex"].values.view(np.uint64))


def test_round_trip_keeps_h2ph_of_secondaries_and_zero_for_mother(product, stack):
    h2ph = from_dimap(product)["h2ph"].values
    expected = stack["h2ph"].values.copy()
    expected[:, :, MOTHER] = 0.0
    assert np.array_equal(h2ph, expected)


def test_round_trip_keeps_dates_wavelength_and_mother(product, geometry):
    ds = from_dimap(product)
    assert np.array_equal(ds["time"].values, DATES)
    assert ds.attrs["wavelength"] == pytest.approx(geometry.wavelength, rel=1e-12)
    assert ds.attrs["coregistration_mother_time"] == "2023-03-31"


def test_round_trip_keeps_orbits_to_a_micrometre(product, geometry):
    read = StackGeometry.from_attrs(from_dimap(product).attrs)
    assert read.mother == MOTHER
    assert read.height == pytest.approx(geometry.height)
    for original, back in zip(geometry.orbits, read.orbits):
        moments = original.reference + (np.linspace(original.time[0], original.time[-1], 50)
                                        * 1e9).astype("timedelta64[ns]")
        p0, v0, _ = original.state(np.array([original.seconds(m) for m in moments]))
        p1, v1, _ = back.state(np.array([back.seconds(m) for m in moments]))
        assert np.abs(p1 - p0).max() < 1e-6
        assert np.abs(v1 - v0).max() < 1e-6


def test_round_trip_keeps_the_radar_grid(product, geometry):
    grid = StackGeometry.from_attrs(from_dimap(product).attrs).grid
    assert abs((grid.first_line_time - geometry.grid.first_line_time)
               / np.timedelta64(1, "ns")) <= 500
    assert grid.line_interval == geometry.grid.line_interval
    assert grid.near_range == geometry.grid.near_range
    assert grid.range_spacing == geometry.grid.range_spacing
    assert grid.look_side == "right"


def test_tie_point_lat_lon_lie_within_a_metre_of_geocoding(product, geometry):
    ds = from_dimap(product)
    az, rg = np.meshgrid(np.arange(40.0), np.arange(50.0), indexing="ij")
    lat, lon = radar_to_geo(geometry, az, rg)
    north = (ds["lat"].values - lat) * METRES_PER_DEGREE
    east = (ds["lon"].values - lon) * METRES_PER_DEGREE * np.cos(np.deg2rad(lat))
    assert np.hypot(north, east).max() < 1.0
    assert 52.0 < lat.mean() < 52.6  # Amsterdam


def test_read_is_lazy_and_the_graph_holds_no_pixels(product):
    ds = from_dimap(product, chunks=(16, 50))
    assert ds["complex"].chunks == ((16, 16, 8), (50,), (5,))
    graph = dict(ds["complex"].data.__dask_graph__())
    assert all(not (isinstance(v, np.ndarray) and v.size > 100) for v in graph.values())


def test_orbit_h2ph_agrees_with_the_product_h2ph_written_from_baselines(tmp_path, stack,
                                                                        geometry):
    az, rg = np.meshgrid(np.arange(40.0), np.arange(50.0), indexing="ij")
    product_h2ph = baselines(geometry, az, rg)["h2ph"].astype(np.float32)
    path = write_dimap(tmp_path / "b.dim", stack.assign(h2ph=(stack["h2ph"].dims,
                                                              product_h2ph)), geometry)
    ds = from_dimap(path, geometry="orbits")
    orbits, written = ds["h2ph"].values, ds["h2ph_product"].values
    secondaries = [k for k in range(5) if k != MOTHER]
    assert (np.sign(orbits[..., secondaries]) == np.sign(written[..., secondaries])).all()
    assert np.abs(orbits - written)[..., secondaries].max() <= (
        0.03 * np.abs(written[..., secondaries]).min())
    assert "lat_product" in ds.coords and "lat" in ds.coords


def test_pair_products_sharing_the_mother_read_as_one_stack(tmp_path, stack, geometry):
    first = write_dimap(tmp_path / "early.dim", stack.isel(time=[0, 1, 2]),
                        geometry.select_epochs([0, 1, 2]))
    second = write_dimap(tmp_path / "late.dim", stack.isel(time=[2, 3, 4]),
                         geometry.select_epochs([2, 3, 4]))
    ds = from_dimap([second, first])
    assert np.array_equal(ds["time"].values, DATES)
    assert np.array_equal(ds["complex"].values, stack["complex"].values)
    read = StackGeometry.from_attrs(ds.attrs)
    assert read.mother == MOTHER
    assert np.allclose(read.orbits[4].position, geometry.orbits[4].position, atol=1e-6)


def test_written_files_are_big_endian_float32_envi(product):
    data = product.with_suffix(".data")
    header = (data / "i_VV_mst_31Mar2023.hdr").read_text()
    assert re.search(r"^data type = 4$", header, re.M)
    assert re.search(r"^byte order = 1$", header, re.M)
    assert (data / "i_VV_slv1_07Mar2023.img").stat().st_size == 40 * 50 * 4
    assert (data / "h2ph_VV_slv4_24Apr2023.hdr").is_file()
    assert not (data / "h2ph_VV_mst_31Mar2023.hdr").exists()
    assert (data / "tie_point_grids" / "latitude.img").is_file()
    assert "19-MAR-2023" in product.read_text()


def test_write_refuses_to_overwrite_and_replaces_when_asked(tmp_path, stack, geometry):
    path = write_dimap(tmp_path / "s.dim", stack, geometry)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_dimap(path, stack, geometry)
    write_dimap(path, stack.isel(azimuth=slice(0, 20)), geometry, overwrite=True)
    assert from_dimap(path).sizes["azimuth"] == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.data", "s.dim"]


# ----------------------------------------------------------------------------------------------
# Bad input: named file and field, before any pixel is read
# ----------------------------------------------------------------------------------------------

def test_header_with_wrong_samples_names_file_and_field(tmp_path, product):
    path = _copy(product, tmp_path)
    header = path.with_suffix(".data") / "q_VV_slv2_19Mar2023.hdr"
    header.write_text(header.read_text().replace("samples = 50", "samples = 49"))
    with pytest.raises(ValueError, match=r"q_VV_slv2_19Mar2023\.hdr.*'samples': expected 50 "
                                         r"\(NCOLS of the \.dim\), found 49"):
        from_dimap(path)


def test_header_saying_little_endian_is_refused_not_followed(tmp_path, product):
    path = _copy(product, tmp_path)
    header = path.with_suffix(".data") / "i_VV_slv1_07Mar2023.hdr"
    header.write_text(header.read_text().replace("byte order = 1", "byte order = 0"))
    with pytest.raises(ValueError, match=r"i_VV_slv1_07Mar2023\.hdr.*'byte order': expected 1 "
                                         r"\(big-endian.*found 0"):
        from_dimap(path)


def test_missing_image_file_is_named(tmp_path, product):
    path = _copy(product, tmp_path)
    (path.with_suffix(".data") / "i_VV_slv3_12Apr2023.img").unlink()
    with pytest.raises(FileNotFoundError, match=r"i_VV_slv3_12Apr2023\.img"):
        from_dimap(path)


def test_image_of_the_wrong_size_is_named(tmp_path, product):
    path = _copy(product, tmp_path)
    image = path.with_suffix(".data") / "i_VV_mst_31Mar2023.img"
    image.write_bytes(image.read_bytes()[:-4])
    with pytest.raises(ValueError, match=r"i_VV_mst_31Mar2023\.img': expected 8000 bytes.*"
                                         r"found 7996"):
        from_dimap(path)


def test_i_band_without_q_band_is_named(tmp_path, product):
    path = _copy(product, tmp_path)
    path.write_text(path.read_text().replace("<BAND_NAME>q_VV_slv1_07Mar2023</BAND_NAME>",
                                             "<BAND_NAME>amplitude_07Mar2023</BAND_NAME>"))
    with pytest.raises(ValueError, match=r"expected band 'q_VV_slv1_07Mar2023' beside "
                                         r"'i_VV_slv1_07Mar2023'"):
        from_dimap(path)


def test_missing_orbit_of_a_secondary_is_named(tmp_path, product):
    path = _copy(product, tmp_path)
    text = path.read_text().replace('name="stack_12Apr2023"', 'name="unknown"')
    text = text.replace("i_VV_slv3_12Apr2023 q_VV_slv3_12Apr2023", "-")
    path.write_text(text.replace("12-APR-2023", "13-APR-2023"))
    with pytest.raises(ValueError, match=r"Slave_Metadata: expected an element for band "
                                         r"'i_VV_slv3_12Apr2023'"):
        from_dimap(path)
    assert from_dimap(path, geometry=None).sizes["time"] == 5


def test_wrong_polarisation_says_what_the_product_holds(product):
    with pytest.raises(ValueError, match=r"'VH'.*found polarisations \['VV'\]"):
        from_dimap(product, polarisation="VH")


def test_line_zero_is_timed_from_the_burst_holding_the_subset(tmp_path, product, geometry):
    """With a BurstBoundary (as SNAP writes for TOPS), line 0 is the burst's FirstLineTime
    plus subset_offset_y lines, not the (1.2 lines late) subset first_line_time."""
    import xml.etree.ElementTree as ET

    copied = _copy(product, tmp_path)
    tree = ET.parse(copied)
    abstracted = next(e for e in tree.iter("MDElem") if e.get("name") == "Abstracted_Metadata")
    interval = geometry.grid.line_interval
    offset_y = 912
    # a burst that starts 912 lines and 2.5 ms before the stated first_line_time
    stated = geometry.grid.first_line_time
    burst_start = stated - np.timedelta64(int(round((offset_y * interval + 2.5e-3) * 1e9)),
                                          "ns")
    seconds = (burst_start - np.datetime64("2000-01-01T00:00:00", "ns")) / np.timedelta64(
        1, "ns") * 1e-9
    for attr in abstracted.findall("MDATTR"):
        if attr.get("name") == "subset_offset_y":
            attr.text = str(offset_y)
    boundary = ET.SubElement(abstracted, "MDElem", name="BurstBoundary")
    burst = ET.SubElement(ET.SubElement(boundary, "MDElem", name="IW3"), "MDElem", name="Burst0")
    for name, value in (("FirstLineDeburst", "0.0"), ("LastLineDeburst", "1523.0"),
                        ("FirstLineTime", repr(float(seconds)))):
        ET.SubElement(burst, "MDATTR", name=name, type="float64").text = value
    tree.write(copied, encoding="ISO-8859-1", xml_declaration=True)
    grid = StackGeometry.from_attrs(from_dimap(copied).attrs).grid
    expected = stated - np.timedelta64(2_500_000, "ns")
    assert abs((grid.first_line_time - expected) / np.timedelta64(1, "ns")) < 2_000
