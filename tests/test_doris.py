"""DORIS-5 stack folders (doris_stack layout): round trips through write_doris_stack and
from_doris_stack on a geometry built from real DORIS v5 metadata, the crop offset of the radar
grid, a real master.res, and bad input refused before any pixel is read."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from depsi.conventions import SPEED_OF_LIGHT
from depsi.geometry import Orbit, RadarGrid, StackGeometry, radar_to_geo
from depsi.io.bounded import MetadataError
from depsi.io.doris import (
    H2PH_FILE,
    LAT_FILE,
    SLC_FILE,
    from_doris_stack,
)
from depsi.io.doris_writer import write_doris_stack
from depsi.io.metadata import read_metadata
from depsi.simulate import simulate_stack

SHAPE = (40, 50)
#: Where the 40 x 50 crop lies in the real 6878-line mother image (1-based, as DORIS counts).
CROP_START = (3001, 12001)
#: State-vector shifts (m, ECEF X, Y, Z) of the epochs made from the real orbits.
SHIFTS = {1: (50.0, -20.0, 30.0), 4: (-40.0, 70.0, -10.0)}
ONE_MICROSECOND = np.timedelta64(1000, "ns")


def _real_metadata(realdata: Path) -> list[dict]:
    folder = realdata / "sarxarray_slc" / "metadata" / "meta_doris5"
    return [read_metadata(folder / day / "metadata.res")
            for day in ("20180306", "20180312", "20180318")]


def _geometry(realdata: Path, time: np.ndarray, mother: int, wavelength: float,
              crop_start: tuple[int, int] = CROP_START) -> StackGeometry:
    """Five orbits on the stack's dates: the real 2018-03-06 (mother), -12 and -18 state vectors,
    and the 2018-03-06 ones shifted by tens of metres; the grid of the mother's crop."""
    m06, m12, m18 = _real_metadata(realdata)
    vectors = [m12["orbit"], m06["orbit"], m06["orbit"], m18["orbit"], m06["orbit"]]
    orbits = []
    for k, (day, v) in enumerate(zip(time, vectors)):
        position = v[:, 1:] + np.asarray(SHIFTS.get(k, (0.0, 0.0, 0.0)))
        orbits.append(Orbit(day, v[:, 0], position, source=f"epoch {k}"))
    time_of_day = m06["first_azimuth_time"] - m06["first_azimuth_time"].astype("datetime64[D]")
    interval, spacing = m06["azimuth_time_interval"], m06["slant_range_spacing"]
    grid = RadarGrid(
        time[mother] + time_of_day
        + np.timedelta64(round((crop_start[0] - 1) * interval * 1e9), "ns"),
        interval, m06["slant_range_first_pixel"] + (crop_start[1] - 1) * spacing, spacing)
    return StackGeometry(grid, tuple(orbits), mother, wavelength)


@pytest.fixture(scope="module")
def written(tmp_path_factory, realdata):
    """A simulated 40 x 50 x 5 stack written with real-metadata geometry, and what was put in."""
    stack, _ = simulate_stack(shape=SHAPE, n_epochs=5, seed=1)
    stack = stack.compute()
    mother = int(np.flatnonzero(stack.time.values
                                == np.datetime64(stack.attrs["mother_time"]))[0])
    geometry = _geometry(realdata, stack.time.values, mother, stack.attrs["wavelength"])
    height = np.linspace(0.0, 40.0, SHAPE[0] * SHAPE[1]).reshape(SHAPE).astype(np.float32)
    folder = tmp_path_factory.mktemp("doris") / "stack"
    info = write_doris_stack(folder, stack, geometry, height=height, crop_start=CROP_START)
    return {"stack": stack, "geometry": geometry, "height": height, "info": info,
            "folder": folder}


@pytest.fixture(scope="module")
def read(written):
    return from_doris_stack(written["folder"])


def _copy(written, tmp_path: Path) -> Path:
    target = tmp_path / "stack"
    shutil.copytree(written["folder"], target)
    return target


def _no_pixel_reads(monkeypatch):
    """Any memory map of a raster (a pixel read) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a raster was read: np.memmap{args[:1]}")
    monkeypatch.setattr(np, "memmap", refuse)


# ----------------------------------------------------------------------------------------------
# Round trip
# ----------------------------------------------------------------------------------------------

def test_layout_is_one_folder_per_date_with_the_doris_stack_files(written):
    days = [np.datetime_as_string(t, unit="D").replace("-", "")
            for t in written["stack"].time.values]
    assert sorted(p.name for p in written["folder"].iterdir()) == days
    for day in days:
        names = {p.name for p in (written["folder"] / day).iterdir()}
        assert {SLC_FILE, H2PH_FILE, "slave.res", "master.res", "ifgs.res"} <= names
    mother = written["folder"] / days[written["geometry"].mother]
    assert {"phi.raw", "lam.raw", "dem_radar.raw"} <= {p.name for p in mother.iterdir()}


def test_complex_round_trips_bit_for_bit(written, read):
    expected = written["stack"]["complex"].values
    assert read["complex"].dtype == np.complex64
    np.testing.assert_array_equal(read["complex"].values.view(np.uint64),
                                  expected.astype(np.complex64).view(np.uint64))


def test_h2ph_round_trips_and_is_zero_at_the_mother(written, read):
    expected = written["stack"]["h2ph"].values.astype(np.float32)
    h2ph = read["h2ph"].values
    np.testing.assert_array_equal(h2ph, expected)
    assert not h2ph[:, :, written["geometry"].mother].any()


def test_dates_and_wavelength_round_trip(written, read):
    np.testing.assert_array_equal(read["time"].values, written["stack"]["time"].values)
    assert read.attrs["wavelength"] == pytest.approx(written["geometry"].wavelength, rel=1e-12)
    assert read.attrs["mother_time"] == written["stack"].attrs["mother_time"][:10]


def test_orbits_round_trip_within_a_millimetre(written, read):
    back = StackGeometry.from_attrs(read.attrs)
    assert back.mother == written["geometry"].mother
    for given, found in zip(written["geometry"].orbits, back.orbits):
        moments = given.reference + (np.linspace(given.time[0], given.time[-1], 97)
                                     * 1e9).astype("timedelta64[ns]")
        t_found = np.array([found.seconds(m) for m in moments])
        t_given = np.array([given.seconds(m) for m in moments])
        error = np.abs(found.state(t_found)[0] - given.state(t_given)[0])
        assert error.max() < 1e-3


def test_radar_grid_round_trips(written, read):
    given, found = written["geometry"].grid, StackGeometry.from_attrs(read.attrs).grid
    assert abs(found.first_line_time - given.first_line_time) < ONE_MICROSECOND
    assert found.line_interval == pytest.approx(given.line_interval, rel=1e-14)
    assert found.near_range == pytest.approx(given.near_range, abs=1e-6)
    assert found.range_spacing == pytest.approx(given.range_spacing, rel=1e-14)
    assert (read.attrs["azimuth_offset"], read.attrs["range_offset"]) == (3000, 12000)


def test_lat_lon_are_the_geocoded_rasters_written_at_the_height(written, read):
    azimuth, range_ = np.meshgrid(np.arange(SHAPE[0]), np.arange(SHAPE[1]), indexing="ij")
    lat, lon = radar_to_geo(written["geometry"], azimuth, range_, written["height"])
    np.testing.assert_allclose(read["lat"].values, lat.astype(np.float32), rtol=0, atol=1e-6)
    np.testing.assert_allclose(read["lon"].values, lon.astype(np.float32), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(read["height"].values, written["height"])


def test_given_lat_lon_are_read_back_exactly(written, tmp_path):
    lat = np.full(SHAPE, 52.25, np.float32) + np.arange(SHAPE[1], dtype=np.float32) * 1e-4
    lon = np.full(SHAPE, 6.5, np.float32) - np.arange(SHAPE[0], dtype=np.float32)[:, None] * 1e-4
    folder = tmp_path / "stack"
    write_doris_stack(folder, written["stack"], written["geometry"], lat=lat, lon=lon)
    ds = from_doris_stack(folder)
    np.testing.assert_array_equal(ds["lat"].values, lat)
    np.testing.assert_array_equal(ds["lon"].values, lon)
    assert "height" not in ds.coords


def test_opening_reads_no_pixel(written, monkeypatch):
    _no_pixel_reads(monkeypatch)
    ds = from_doris_stack(written["folder"])
    assert dict(ds.sizes) == {"azimuth": 40, "range": 50, "time": 5}


def test_without_h2ph_files_h2ph_comes_from_the_orbits(written, tmp_path):
    folder = _copy(written, tmp_path)
    for path in folder.glob(f"*/{H2PH_FILE}"):
        path.unlink()
    ds = from_doris_stack(folder)
    h2ph = ds["h2ph"].values
    assert "orbits" in ds["h2ph"].attrs["long_name"]
    assert not h2ph[:, :, written["geometry"].mother].any()
    assert (np.abs(np.delete(h2ph, written["geometry"].mother, axis=2)) > 1e-6).all()


# ----------------------------------------------------------------------------------------------
# The crop window of the radar grid
# ----------------------------------------------------------------------------------------------

def test_crop_first_line_101_shifts_the_grid_by_100_lines(written, tmp_path):
    geometry = _geometry(Path(__file__).parent / "data", written["stack"].time.values,
                         written["geometry"].mother, written["geometry"].wavelength,
                         crop_start=(101, 1))
    folder = tmp_path / "stack"
    info = write_doris_stack(folder, written["stack"], geometry, crop_start=(101, 1))
    master = read_metadata(info["master_res_files"][geometry.mother])
    assert master["crop"]["first_line"] == 101
    grid = StackGeometry.from_attrs(from_doris_stack(folder).attrs).grid
    shift = np.timedelta64(round(100 * master["azimuth_time_interval"] * 1e9), "ns")
    assert abs(grid.first_line_time - (master["first_azimuth_time"] + shift)) <= \
        np.timedelta64(1, "ns")
    assert grid.near_range == pytest.approx(master["slant_range_first_pixel"], abs=1e-9)


@pytest.mark.realdata
def test_real_master_res_gives_the_grid_of_its_crop(realdata, tmp_path):
    """A real DORIS v5 master.res (14065 x 49843, as DePSI's test data has it) as the mother of
    a one-date stack; the SLC is a sparse file of the size its resample window gives."""
    res = realdata / "depsi_stm_sparse" / "example.res"
    day = tmp_path / "stack" / "20200328"
    day.mkdir(parents=True)
    for name in ("master.res", "slave.res"):
        shutil.copy(res, day / name)
    with open(day / SLC_FILE, "wb") as slc:
        slc.truncate(14065 * 49843 * 8)
    ds = from_doris_stack(tmp_path / "stack")
    grid = StackGeometry.from_attrs(ds.attrs).grid
    assert dict(ds.sizes) == {"azimuth": 14065, "range": 49843, "time": 1}
    assert grid.first_line_time == np.datetime64("2020-03-28T05:49:19.933511", "ns")
    assert grid.line_interval == pytest.approx(2.055556299999998e-03, rel=1e-15)
    assert grid.near_range == pytest.approx(SPEED_OF_LIGHT * 5.641912410057507e-3 / 2,
                                            rel=1e-15)
    assert ds.attrs["wavelength"] == pytest.approx(0.055465760)


# ----------------------------------------------------------------------------------------------
# Bad input: clear errors before any pixel is read
# ----------------------------------------------------------------------------------------------

def test_a_date_missing_its_h2ph_file_is_named(written, tmp_path, monkeypatch):
    folder = _copy(written, tmp_path)
    day = np.datetime_as_string(written["stack"].time.values[4], unit="D").replace("-", "")
    (folder / day / H2PH_FILE).unlink()
    _no_pixel_reads(monkeypatch)
    with pytest.raises(FileNotFoundError, match=rf"{day}/{H2PH_FILE}"):
        from_doris_stack(folder)


def test_a_raw_file_of_the_wrong_size_is_named_with_the_window(written, tmp_path, monkeypatch):
    folder = _copy(written, tmp_path)
    day = np.datetime_as_string(written["stack"].time.values[1], unit="D").replace("-", "")
    path = folder / day / SLC_FILE
    os.truncate(path, os.path.getsize(path) - 8)
    _no_pixel_reads(monkeypatch)
    with pytest.raises(ValueError, match=r"expected 16000 bytes .* crop window .*found 15992"
                                         r" bytes") as raised:
        from_doris_stack(folder)
    assert str(path) in str(raised.value)


def test_a_lat_raster_of_the_wrong_size_is_named(written, tmp_path, monkeypatch):
    folder = _copy(written, tmp_path)
    path = next(folder.glob(f"*/{LAT_FILE}"))
    os.truncate(path, 4 * 39 * 50)
    _no_pixel_reads(monkeypatch)
    with pytest.raises(ValueError, match="found 7800 bytes") as raised:
        from_doris_stack(folder)
    assert str(path) in str(raised.value)


def test_a_malformed_wavelength_in_slave_res_names_file_and_field(written, tmp_path,
                                                                  monkeypatch):
    folder = _copy(written, tmp_path)
    day = np.datetime_as_string(written["stack"].time.values[3], unit="D").replace("-", "")
    res = folder / day / "slave.res"
    lines = [("Radar_wavelength (m):" + " " * 37 + "0.05x5" if line.startswith(
        "Radar_wavelength (m):") else line) for line in res.read_text().splitlines()]
    res.write_text("\n".join(lines) + "\n")
    _no_pixel_reads(monkeypatch)
    with pytest.raises(MetadataError, match=r"Radar_wavelength \(m\)") as raised:
        from_doris_stack(folder)
    assert str(res) in str(raised.value) and "0.05x5" in str(raised.value)


def test_a_resample_window_other_than_the_mothers_is_refused(written, tmp_path, monkeypatch):
    folder = _copy(written, tmp_path)
    day = np.datetime_as_string(written["stack"].time.values[0], unit="D").replace("-", "")
    res = folder / day / "slave.res"
    text = re.sub(r"(Last_line \(w\.r\.t\. original_master\):\s+)3040", r"\g<1>3041",
                  res.read_text())
    assert "3041" in text
    res.write_text(text)
    _no_pixel_reads(monkeypatch)
    with pytest.raises(MetadataError, match=r"section 'resample': expected the mother's window"):
        from_doris_stack(folder)


def test_a_folder_without_date_folders_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="expected date folders YYYYMMDD"):
        from_doris_stack(tmp_path)


def test_writing_over_an_existing_stack_needs_overwrite(written):
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        write_doris_stack(written["folder"], written["stack"], written["geometry"])


def test_orbits_mode_keeps_the_product_lat_lon_beside_the_geocoded(written):
    ds = from_doris_stack(written["folder"], geometry="orbits")
    half_float32_step = 2.0 ** -19  # degrees, at |lat| or |lon| < 64: phi/lam are float32
    for name in ("lat", "lon"):
        np.testing.assert_allclose(ds[name].values, ds[f"{name}_product"].values, rtol=0,
                                   atol=half_float32_step)
    assert "h2ph_product" in ds.data_vars


def test_a_mother_slc_as_complex_short_master_raw_is_read(written, tmp_path):
    """doris_stack before its fake resample step: the mother's SLC is the crop's int16 I/Q."""
    folder = _copy(written, tmp_path)
    day = np.datetime_as_string(written["stack"].time.values[written["geometry"].mother],
                                unit="D").replace("-", "")
    iq = np.empty((*SHAPE, 2), "<i2")
    iq[..., 0], iq[..., 1] = np.arange(SHAPE[1]), -7
    iq.tofile(folder / day / "master.raw")
    (folder / day / SLC_FILE).unlink()
    ds = from_doris_stack(folder)
    mother = ds["complex"].values[:, :, written["geometry"].mother]
    np.testing.assert_array_equal(mother, np.arange(SHAPE[1]) - 7j * np.ones(SHAPE))
    np.testing.assert_array_equal(ds["complex"].values[:, :, 0],
                                  written["stack"]["complex"].values[:, :, 0])
