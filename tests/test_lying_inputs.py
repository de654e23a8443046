"""SLC stacks whose files contradict each other are refused before any pixel is read, with a
message naming the file, the field, the value found and the value expected.

Each case writes a valid small stack with depsi's writers and then makes one of its files lie.
"""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from depsi.geometry import GeometryError, Orbit, StackGeometry
from depsi.io.writers import write_slc_stack
from depsi.pipeline.config import parse_config
from depsi.pipeline.input_stack import _open_stack_unchecked
from depsi.simulate import simulate_stack
from depsi.simulate.scene import simulated_geometry


@pytest.fixture(scope="module")
def scene():
    stack, _ = simulate_stack(shape=(20, 24), n_epochs=5, seed=0)
    raster = stack.drop_vars([n for n in stack.coords if n not in ("azimuth", "range", "time")])
    return raster, simulated_geometry(stack)


@pytest.fixture(scope="module")
def written(scene, tmp_path_factory):
    """One valid stack per format, written once; each test lies in its own copy."""
    raster, geometry = scene
    root = tmp_path_factory.mktemp("valid")
    return {fmt: write_slc_stack(root / fmt, raster, geometry, format=fmt)
            for fmt in ("doris", "isce2", "dimap", "geotiff")}


def _copy(written, fmt, tmp_path):
    folder = written[fmt] if written[fmt].is_dir() else written[fmt].parent
    shutil.copytree(folder, tmp_path / fmt)
    return tmp_path / fmt if written[fmt].is_dir() else tmp_path / fmt / written[fmt].name


def _open(fmt, path, **section):
    return _open_stack_unchecked(parse_config({
        "input": {"format": fmt, "path": str(path), **section},
        "output": {"workspace": str(path.parent / "ws")}}))


# ----------------------------------------------------------------------------------------------
# A secondary's orbit that is really the mother's
# ----------------------------------------------------------------------------------------------

def test_isce2_secondary_with_the_mothers_orbit_is_refused(written, tmp_path):
    stack = _copy(written, "isce2", tmp_path)
    shutil.copy(stack / "reference" / "IW1.xml", stack / "secondarys" / "20200101" / "IW1.xml")
    with pytest.raises(GeometryError, match=r"orbits\[0\] \(.*20200101/IW1\.xml\): expected "
                                            r"the epoch's own state vectors, found the mother's"):
        _open("isce2", stack)


def test_doris_secondary_with_the_mothers_orbit_is_refused(written, tmp_path):
    stack = _copy(written, "doris", tmp_path)
    section = re.compile(r"\*_Start_precise_orbits:.*?End_precise_orbits", re.S)
    mother = section.search((stack / "20200125" / "slave.res").read_text()).group(0)
    secondary = stack / "20200101" / "slave.res"
    secondary.write_text(section.sub(lambda _: mother, secondary.read_text()))
    with pytest.raises(GeometryError, match=r"orbits\[0\] \(.*20200101/slave\.res.*\): "
                                            r"expected the epoch's own state vectors"):
        _open("doris", stack)


def test_doris_orbit_that_misses_its_acquisition_day_is_refused(written, tmp_path):
    stack = _copy(written, "doris", tmp_path)
    secondary = stack / "20200101" / "slave.res"
    # the state vectors' times (seconds of the day) moved three days on
    secondary.write_text(re.sub(r"(?m)^ (6\d{4}) ", lambda m: f" {int(m[1]) + 3 * 86400} ",
                                secondary.read_text()))
    with pytest.raises(GeometryError, match=r"epoch 0 \(2020-01-01\), orbit .*20200101/slave"
                                            r"\.res.*: expected state vectors covering the "
                                            r"epoch's acquisition day 2020-01-01, found them "
                                            r"from 2020-01-04T17:22:50"):
        _open("doris", stack)


def test_a_geometry_whose_secondary_repeats_the_mothers_vectors_is_refused(scene):
    _, geometry = scene
    mother = geometry.mother_orbit
    copy = Orbit(np.datetime64("2020-01-01"), mother.time + mother.seconds("2020-01-01"),
                 mother.position, mother.velocity, source="copy")
    with pytest.raises(GeometryError, match=r"orbits\[0\] \(copy\): expected the epoch's own "
                                            r"state vectors, found the mother's \(orbits\[2\]"):
        StackGeometry(geometry.grid, (copy,) + geometry.orbits[1:], geometry.mother,
                      geometry.wavelength)


# ----------------------------------------------------------------------------------------------
# GeoTIFF stacks: dates in the configuration against the dates in the file names
# ----------------------------------------------------------------------------------------------

DATES = ["2020-01-01", "2020-01-13", "2020-01-25", "2020-02-06", "2020-02-18"]


def test_geotiff_dates_contradicting_the_file_names_are_refused(written, tmp_path):
    stack = _copy(written, "geotiff", tmp_path)
    swapped = [DATES[1], DATES[0], *DATES[2:]]
    with pytest.raises(ValueError, match=r"input\.dates\[0\]: expected the date in the name of "
                                         r"'.*slc_20200101\.tif', 2020-01-01, found 2020-01-13"):
        _open("geotiff", stack, dates=swapped, wavelength=0.0556)


def test_geotiff_h2ph_name_contradicting_the_dates_is_refused(written, tmp_path):
    stack = _copy(written, "geotiff", tmp_path)
    (stack / "h2ph_20200218.tif").rename(stack / "h2ph_20200219.tif")
    with pytest.raises(ValueError, match=r"input\.dates \(in time order\)\[4\]: expected the "
                                         r"date in the name of '.*h2ph_20200219\.tif', "
                                         r"2020-02-19, found 2020-02-18"):
        _open("geotiff", stack, dates=DATES, wavelength=0.0556)


def test_geotiff_dates_agreeing_with_the_file_names_open(written, tmp_path):
    stack = _copy(written, "geotiff", tmp_path)
    opened = _open("geotiff", stack, dates=DATES, wavelength=0.0556)
    assert [str(t)[:10] for t in opened["time"].values] == DATES


def test_from_geotiff_checks_the_dates_against_the_file_names(written):
    from depsi.io import from_geotiff

    files = sorted(written["geotiff"].glob("slc_*.tif"))[:2]
    with pytest.raises(ValueError, match=r"dates\[1\]: expected the date in the name of "
                                         r"'.*slc_20200113\.tif', 2020-01-13, found 2020-01-12"):
        from_geotiff(files, dates=["2020-01-01", "2020-01-12"], wavelength=0.0556)


# ----------------------------------------------------------------------------------------------
# Position rasters that are not degrees
# ----------------------------------------------------------------------------------------------

def _overwrite_raster(path, value):
    import rasterio

    with rasterio.open(path, "r+") as raster:
        data = raster.read(1)
        data[3, 4] = value
        raster.write(data, 1)


@pytest.mark.parametrize(("name", "value"), [("lat", 999.0), ("lon", -181.0)])
def test_geotiff_position_raster_outside_wgs84_degrees_is_refused(written, tmp_path, name,
                                                                    value):
    stack = _copy(written, "geotiff", tmp_path)
    _overwrite_raster(stack / f"{name}.tif", value)
    with pytest.raises(ValueError, match=rf"'.*{name}\.tif': expected {name} in WGS84 degrees "
                                         rf"within .*, found .*{value:g}"):
        _open("geotiff", stack, dates=DATES, wavelength=0.0556)


# ----------------------------------------------------------------------------------------------
# DEMs that are not placed, or placed elsewhere
# ----------------------------------------------------------------------------------------------

def _write_dem(path, lat0, lon0, **profile):
    import rasterio

    lats = np.linspace(lat0 + 0.05, lat0 - 0.05, 21)
    lons = np.linspace(lon0 - 0.05, lon0 + 0.05, 21)
    step_lon, step_lat = lons[1] - lons[0], lats[1] - lats[0]
    profile = {"crs": "EPSG:4326", "transform": rasterio.Affine(
        step_lon, 0, lons[0] - step_lon / 2, 0, step_lat, lats[0] - step_lat / 2)} | profile
    with rasterio.open(path, "w", driver="GTiff", width=21, height=21, count=1,
                       dtype="float32", **{k: v for k, v in profile.items() if v is not None}
                       ) as tif:
        tif.write(np.full((1, 21, 21), 100.0, np.float32))
    return path


@pytest.mark.parametrize(("missing", "found"), [("crs", "a coordinate reference system"),
                                                ("transform", "a geotransform")])
def test_dem_without_crs_or_geotransform_is_refused(tmp_path, missing, found):
    from depsi.geometry import open_dem

    path = _write_dem(tmp_path / "dem.tif", 52.0, 4.9, **{missing: None})
    with pytest.raises(GeometryError, match=rf"DEM '.*dem\.tif': expected {found}.*found none"):
        open_dem(path)


def test_dem_away_from_the_scene_is_refused_before_the_pixels(written, tmp_path):
    from depsi.geometry import radar_to_geo
    from depsi.pipeline.input_stack import _check_stack_geometry

    stack = _open("isce2", written["isce2"])
    lat0, lon0 = radar_to_geo(StackGeometry.from_attrs(stack.attrs), 10.0, 12.0)
    here = _write_dem(tmp_path / "here.tif", float(lat0), float(lon0))
    away = _write_dem(tmp_path / "away.tif", float(lat0) + 3.0, float(lon0))
    config = parse_config({"input": {"format": "isce2", "path": str(written["isce2"]),
                                     "dem": str(here)},
                           "output": {"workspace": str(tmp_path / "ws")}})
    _check_stack_geometry(stack, config)
    config = parse_config({"input": {"format": "isce2", "path": str(written["isce2"]),
                                     "dem": str(away)},
                           "output": {"workspace": str(tmp_path / "ws")}})
    with pytest.raises(GeometryError, match=r"input\.dem '.*away\.tif': expected a DEM covering "
                                            r"the scene, found one over lat \d+\.\d+\.\.\d+.* "
                                            r"while the scene lies over lat"):
        _check_stack_geometry(stack, config)


# ----------------------------------------------------------------------------------------------
# A radar grid the orbit cannot see
# ----------------------------------------------------------------------------------------------

def test_near_range_below_the_satellites_height_is_refused(scene):
    from depsi.geometry import RadarGrid

    _, geometry = scene
    grid = geometry.grid
    low = RadarGrid(grid.first_line_time, grid.line_interval, 5.0e5, grid.range_spacing)
    with pytest.raises(GeometryError, match=r"'near_range': expected more than the mother "
                                            r"orbit's height above the ellipsoid \(\d+ m, .*\), "
                                            r"found 500000 m"):
        StackGeometry(low, geometry.orbits, geometry.mother, geometry.wavelength)


def test_isce2_near_range_below_the_satellites_height_is_refused(written, tmp_path):
    stack = _copy(written, "isce2", tmp_path)
    xml = stack / "reference" / "IW1.xml"
    text = xml.read_text()
    near = re.search(r'(?s)<property name="startingrange">\s*<value>([^<]+)</value>', text)
    assert near, "the ISCE2 writer's starting range"
    xml.write_text(text[:near.start(1)] + "400000.0" + text[near.end(1):])
    with pytest.raises(GeometryError, match=r"'near_range': .*found 400000 m"):
        _open("isce2", stack)


# ----------------------------------------------------------------------------------------------
# BEAM-DIMAP band files outside the product
# ----------------------------------------------------------------------------------------------

def test_dimap_band_reference_outside_the_product_is_refused(written, tmp_path):
    dim = _copy(written, "dimap", tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    band = dim.with_suffix(".data") / "i_VV_slv1_01Jan2020"
    for suffix in (".hdr", ".img"):
        shutil.copy(band.with_suffix(suffix), elsewhere / f"band{suffix}")
    dim.write_text(dim.read_text().replace('href="stack.data/i_VV_slv1_01Jan2020.hdr"',
                                           'href="../elsewhere/band.hdr"'))
    with pytest.raises(ValueError, match=r"DIMAP product '.*stack\.dim': field 'DATA_FILE_PATH "
                                         r"href': expected a file inside the product's folder "
                                         r"'.*', found '\.\./elsewhere/band\.hdr' resolving to "
                                         r"'.*elsewhere/band\.hdr'"):
        _open("dimap", dim)


def test_dimap_band_linked_outside_the_product_is_refused(written, tmp_path):
    dim = _copy(written, "dimap", tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    band = dim.with_suffix(".data") / "i_VV_slv1_01Jan2020.img"
    shutil.move(band, elsewhere / band.name)
    band.symlink_to(elsewhere / band.name)
    with pytest.raises(ValueError, match=r"'DATA_FILE_PATH href': expected a file inside the "
                                         r"product's folder .* resolving to '.*elsewhere/"
                                         r"i_VV_slv1_01Jan2020\.img'"):
        _open("dimap", dim)


# ----------------------------------------------------------------------------------------------
# Stacks without their mother's product
# ----------------------------------------------------------------------------------------------

def test_isce2_stack_without_its_reference_product_is_refused(written, tmp_path):
    from depsi.io.isce2 import ISCE2Error

    stack = _copy(written, "isce2", tmp_path)
    shutil.rmtree(stack / "reference")
    with pytest.raises(ISCE2Error, match=r"expected the reference product '.*reference/IW\*\.xml'"
                                         r" beside the secondaries' .*found no such file"):
        _open("isce2", stack)


def test_doris_stack_without_its_master_res_is_refused(written, tmp_path):
    stack = _copy(written, "doris", tmp_path)
    for res in stack.glob("*/master.res"):
        res.unlink()
    with pytest.raises(FileNotFoundError, match=r"expected a master\.res in the date folders"):
        _open("doris", stack)


def test_snap_stack_without_its_mothers_product_is_refused(scene, tmp_path):
    raster, geometry = scene
    stack = write_slc_stack(tmp_path / "snap", raster, geometry, format="snap")
    shutil.rmtree(stack / "20200125-coreg.znap")
    with pytest.raises(GeometryError, match=r"expected the mother's product \(2020-01-25, .*\) "
                                            r"among the stack's dates, found only"):
        _open("snap", stack, geometry="orbits")
