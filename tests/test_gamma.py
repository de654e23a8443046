"""GAMMA stacks: parameter files of a real Sentinel-1 stack (PyRate's cropA headers), a
write/read round trip of a simulated stack on those real orbits, and bad input."""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from depsi.conventions import SPEED_OF_LIGHT
from depsi.geometry import GEOMETRY_ATTR, RadarGrid, StackGeometry
from depsi.io.bounded import MetadataError
from depsi.io.gamma import from_gamma, slc_geometry
from depsi.io.gamma_par import BPERP_COLUMNS, parse_par, read_bperp
from depsi.io.gamma_writer import write_gamma
from depsi.simulate import simulate_stack

#: The five dates of the round-trip stack (the first five of the real headers) and its mother.
DATES = ("20180106", "20180130", "20180307", "20180319", "20180331")
MOTHER = 2
SHAPE = (40, 50)
#: The real headers' radar frequency (Hz): Sentinel-1's C band.
S1_FREQUENCY = 5.4050005e9


@pytest.fixture(scope="module")
def gamma(realdata: Path) -> Path:
    return realdata / "gamma_s1_mexico"


def _headers(gamma: Path, pattern: str) -> list[Path]:
    return sorted((gamma / "headers").glob(pattern)) + sorted((gamma / "geometry").glob(pattern))


def _name_date(path: Path) -> str:
    return re.search(r"(\d{8})", path.name).group(1)


# ----------------------------------------------------------------------------------------------
# Real headers
# ----------------------------------------------------------------------------------------------

@pytest.mark.realdata
def test_every_real_header_parses_as_its_kind(gamma):
    counts = {"*_slc.par": ("slc", 13), "*_mli.par": ("mli", 13), "*_dem.par": ("dem", 1),
              "*_base.par": ("base", 30), "*_bperp.par": ("bperp", 30)}
    for pattern, (kind, count) in counts.items():
        files = _headers(gamma, pattern)
        assert len(files) == count, pattern
        assert {parse_par(f)["kind"] for f in files} == {kind}
    assert len(list(gamma.rglob("*.par"))) == 13 + 13 + 1 + 30 + 30


@pytest.mark.realdata
def test_real_image_headers_dates_and_wavelengths_agree_with_names(gamma):
    for path in _headers(gamma, "*_slc.par") + _headers(gamma, "*_mli.par"):
        par = parse_par(path)
        assert "".join(f"{v:02d}" for v in par["date"][:3]) == _name_date(path), path
        assert par["radar_frequency"] == S1_FREQUENCY
        image, _ = slc_geometry(par, str(path))
        assert str(image.date).replace("-", "") == _name_date(path)
        assert image.wavelength == pytest.approx(SPEED_OF_LIGHT / S1_FREQUENCY, rel=1e-15)
        assert (image.sensor, image.polarisation, image.look_side) == ("S1A IW IW1", "VV",
                                                                      "right")


@pytest.mark.realdata
def test_orbits_build_from_every_real_slc_par_and_cover_the_scene(gamma):
    for path in _headers(gamma, "*_slc.par"):
        par = parse_par(path)
        image, orbit = slc_geometry(par, str(path))
        assert str(orbit.reference) == f"{image.date}T00:00:00.000000000"
        assert orbit.time.size == par["number_of_state_vectors"] == 6
        np.testing.assert_allclose(np.diff(orbit.time), par["state_vector_interval"])
        assert orbit.time[0] < par["start_time"] < par["end_time"] < orbit.time[-1]
        np.testing.assert_array_equal(orbit.position[0], par["state_vector_position_1"])
        position, velocity, _ = orbit.state(orbit.time[2:3])
        np.testing.assert_allclose(position[0], par["state_vector_position_3"], atol=1e-6)
        np.testing.assert_allclose(velocity[0], par["state_vector_velocity_3"], atol=1e-9)
        # GAMMA states the sensor's distance from the Earth's centre at the centre time
        centre, _, _ = orbit.state(np.array([par["center_time"]]))
        assert np.linalg.norm(centre) == pytest.approx(par["sar_to_earth_center"], abs=1e-3)


def _vector_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines(keepends=True)
            if line.startswith(("state_vector_", "time_of_first_state_vector"))]


@pytest.mark.realdata
def test_state_vectors_of_another_date_are_refused_by_sar_to_earth_center(gamma, tmp_path):
    """Vectors timed in seconds of the day fit any date of the track: the sensor's distance
    from the Earth's centre that GAMMA states at the centre time tells them apart."""
    own, other = (gamma / "headers" / f"r{d}_VV_slc.par" for d in ("20180106", "20180130"))
    text = own.read_text()
    for line, swapped in zip(_vector_lines(own), _vector_lines(other)):
        text = text.replace(line, swapped)
    damaged = tmp_path / own.name
    damaged.write_text(text)
    with pytest.raises(MetadataError, match=r"(?s)r20180106_VV_slc\.par.*'sar_to_earth_center'"
                                            r".*7073887\.3401 m .*found 7073899\.1954 m"):
        slc_geometry(parse_par(damaged), str(damaged))


@pytest.mark.realdata
def test_state_vectors_that_miss_the_centre_time_are_refused(real_slc_par, tmp_path):
    damaged = tmp_path / "r20180106_VV_slc.par"
    damaged.write_text(re.sub(r"^(center_time:\s+)\S+", r"\g<1>9000.0", real_slc_par,
                              flags=re.M))
    with pytest.raises(MetadataError, match=r"'center_time': expected a time within the state "
                                            r"vectors \(2399\.144213 to 2449\.144213"):
        slc_geometry(parse_par(damaged), str(damaged))


@pytest.mark.realdata
def test_real_mli_par_gives_the_multilooked_grid_timing(gamma):
    for mli_path in _headers(gamma, "*_mli.par"):
        mli = parse_par(mli_path)
        slc = parse_par(gamma / "headers" / f"r{_name_date(mli_path)}_VV_slc.par")
        looks_az, looks_rg = mli["azimuth_looks"], mli["range_looks"]
        assert (looks_az, looks_rg) == (2, 8)
        assert mli["azimuth_lines"] == slc["azimuth_lines"] // looks_az
        assert mli["range_samples"] == slc["range_samples"] // looks_rg
        assert mli["azimuth_line_time"] == pytest.approx(looks_az * slc["azimuth_line_time"],
                                                         rel=1e-6)
        assert mli["range_pixel_spacing"] == pytest.approx(looks_rg * slc["range_pixel_spacing"],
                                                           rel=1e-6)
        # a multi-looked pixel's centre lies half a look (minus half a pixel) further on
        assert mli["start_time"] - slc["start_time"] == pytest.approx(
            0.5 * (looks_az - 1) * slc["azimuth_line_time"], abs=1e-6)
        assert mli["near_range_slc"] - slc["near_range_slc"] == pytest.approx(
            0.5 * (looks_rg - 1) * slc["range_pixel_spacing"], abs=1e-3)


@pytest.mark.realdata
def test_real_bperp_tables_read_with_their_header(gamma):
    mli = parse_par(gamma / "headers" / "r20180106_VV_8rlks_mli.par")
    for path in _headers(gamma, "*_bperp.par"):
        table = read_bperp(path)
        assert tuple(table.columns) == BPERP_COLUMNS
        assert len(table) == 430 and np.isfinite(table.to_numpy()).all()
        assert table["line"].dtype.kind == "i" and table["range"].max() == 8400
        assert (table.attrs["interferogram_lines"], table.attrs["range_samples"]) == (
            mli["azimuth_lines"], mli["range_samples"])
        assert table.attrs["look_side"] == "right" and table.attrs["azimuth_angle"] == 90.0
        assert table.attrs["baseline_vector_tcn"].shape == (3,)
        # the baseline's length is that of its TCN components to the printed digits; its
        # parallel and perpendicular parts make it up to a few mm (GAMMA's own split)
        length = np.sqrt(table["B_t"] ** 2 + table["B_c"] ** 2 + table["B_n"] ** 2)
        np.testing.assert_allclose(table["blen"], length, atol=2e-4)
        np.testing.assert_allclose(np.hypot(table["bpara"], table["bperp"]), table["blen"],
                                   atol=5e-3)


@pytest.mark.realdata
def test_real_base_and_dem_pars_give_vectors_and_the_dem_grid(gamma):
    for path in _headers(gamma, "*_base.par"):
        par = parse_par(path)
        for key in ("initial_baseline(TCN)", "initial_baseline_rate",
                    "precision_baseline(TCN)", "precision_baseline_rate"):
            assert par[key].shape == (3,) and par[key].dtype == np.float64
    dem = parse_par(gamma / "headers" / "cropA_20180106_VV_8rlks_eqa_dem.par")
    assert (dem["DEM_projection"], dem["data_format"], dem["width"], dem["nlines"]) == (
        "EQA", "REAL*4", 100, 60)
    assert dem["post_lat"] == -dem["post_lon"] == pytest.approx(-5.0 / 3600, rel=1e-7)
    assert dem["ellipsoid_name"] == "WGS 84"


# ----------------------------------------------------------------------------------------------
# A simulated stack on the real orbits, written and read back
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_epochs(gamma):
    return [slc_geometry(parse_par(gamma / "headers" / f"r{d}_VV_slc.par"),
                         f"r{d}_VV_slc.par") for d in DATES]


@pytest.fixture(scope="module")
def written(tmp_path_factory, real_epochs):
    """The 40 x 50 simulated stack, 100 lines and 300 samples into the mother's real scene."""
    mother = real_epochs[MOTHER][0]
    grid = RadarGrid(first_line_time=mother.first_line_time
                     + np.timedelta64(int(100 * mother.line_interval * 1e9), "ns"),
                     line_interval=mother.line_interval,
                     near_range=mother.near_range + 300 * mother.range_spacing,
                     range_spacing=mother.range_spacing, look_side=mother.look_side)
    geometry = StackGeometry(grid, [orbit for _, orbit in real_epochs], mother=MOTHER,
                             wavelength=mother.wavelength)
    stack, _ = simulate_stack(shape=SHAPE, n_epochs=len(DATES), seed=1)
    stack = stack[["complex"]].assign_coords(
        time=np.array([np.datetime64(image.date, "ns") for image, _ in real_epochs]))
    stack.attrs = {"wavelength": mother.wavelength, "sensor": "S1A IW IW1",
                   "polarisation": "VV"}
    folder = tmp_path_factory.mktemp("gamma")
    paths = write_gamma(folder, stack, geometry)
    return {"folder": folder, "paths": paths, "stack": stack, "geometry": geometry}


@pytest.fixture(scope="module")
def read_back(written):
    return from_gamma(written["folder"], mother=written["paths"]["mother"])


@pytest.mark.realdata
def test_write_gamma_names_one_big_endian_rslc_and_par_per_date(written):
    paths = written["paths"]
    assert [p.name for p in paths["slc"]] == [f"r{d}.rslc" for d in DATES]
    assert [p.name for p in paths["par"]] == [f"r{d}.rslc.par" for d in DATES]
    assert paths["mother"] == DATES[MOTHER]
    assert not list(written["folder"].glob("*.part"))
    first = np.fromfile(paths["slc"][0], dtype=">c8").reshape(SHAPE)
    np.testing.assert_array_equal(first, written["stack"]["complex"].values[:, :, 0])


@pytest.mark.realdata
def test_round_trip_gives_the_same_pixels_dates_and_wavelength(written, read_back):
    original = written["stack"]
    assert read_back["complex"].dtype == np.complex64
    np.testing.assert_array_equal(read_back["complex"].values.view(np.uint64),
                                  original["complex"].values.view(np.uint64))
    np.testing.assert_array_equal(read_back["time"].values, original["time"].values)
    assert read_back.attrs["wavelength"] == pytest.approx(original.attrs["wavelength"],
                                                          rel=1e-14)
    assert (read_back.attrs["sensor"], read_back.attrs["polarisation"],
            read_back.attrs["pass_direction"]) == ("S1A IW IW1", "VV", "ascending")


@pytest.mark.realdata
def test_round_trip_keeps_the_geometry(written, read_back):
    geometry = StackGeometry.from_attrs(read_back.attrs)
    assert GEOMETRY_ATTR in read_back.attrs and geometry is not None
    original = written["geometry"]
    assert geometry.mother == MOTHER
    assert geometry.grid.first_line_time == original.grid.first_line_time
    for field in ("line_interval", "near_range", "range_spacing", "look_side"):
        assert getattr(geometry.grid, field) == getattr(original.grid, field), field
    for back, orbit in zip(geometry.orbits, original.orbits):
        assert back.reference == orbit.reference
        np.testing.assert_allclose(back.time, orbit.time, rtol=0, atol=1e-9)
        np.testing.assert_allclose(back.position, orbit.position, rtol=0, atol=1e-6)
        np.testing.assert_allclose(back.velocity, orbit.velocity, rtol=0, atol=1e-6)


@pytest.mark.realdata
def test_round_trip_h2ph_from_the_orbits_is_zero_at_the_mother(read_back):
    h2ph = read_back["h2ph"].values
    assert h2ph.shape == (*SHAPE, len(DATES))
    assert np.isfinite(h2ph).all()
    assert (h2ph[:, :, MOTHER] == 0).all()
    others = np.delete(h2ph, MOTHER, axis=2)
    # Sentinel-1's orbital tube: perpendicular baselines of up to ~150 m at ~850 km
    assert (np.abs(others) > 1e-6).all() and (np.abs(others) < 3e-4).all()


@pytest.mark.realdata
def test_from_gamma_stays_lazy_with_file_names_in_the_graph(written, read_back):
    data = read_back["complex"].data
    assert hasattr(data, "dask")
    graph = pickle.dumps(dict(data.__dask_graph__()))
    assert len(graph) < 8000 < data.nbytes
    assert str(written["paths"]["slc"][0]).encode() in graph


@pytest.mark.realdata
def test_written_par_has_the_keys_layout_and_units_of_a_real_slc_par(written, gamma):
    def skeleton(text: str) -> list[tuple[str, int, tuple[str, ...]]]:
        out = []
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            words = rest.split()
            units = tuple(w for w in words if not re.fullmatch(r"[-+.\deE]+", w))
            if key in ("title", "sensor"):
                units = ()
            # columns: the end of the first value, GAMMA's right-alignment
            first = re.search(r"\S+", rest)
            end = len(key) + 1 + first.end() if first else 0
            out.append((key, end if key not in ("title", "sensor") else 0, units))
        return out

    real = (gamma / "headers" / f"r{DATES[MOTHER]}_VV_slc.par").read_text()
    mine = written["paths"]["par"][MOTHER].read_text()
    lossless = {"start_time", "azimuth_line_time", "range_pixel_spacing", "near_range_slc",
                "time_of_first_state_vector", "state_vector_interval"}
    pairs = list(zip(skeleton(mine), skeleton(real)))
    assert len(skeleton(mine)) == len(skeleton(real))
    for (key, end, units), (real_key, real_end, real_units) in pairs:
        assert (key, units) == (real_key, real_units)
        if key not in lossless and not key.startswith(("state_vector_", "center_lat",
                                                        "center_lon", "heading", "incidence",
                                                        "sar_to", "earth_radius", "azimuth_pix",
                                                        "center_range", "far_range", "prf",
                                                        "adc", "center_time", "end_time")):
            assert end == real_end, key


@pytest.mark.realdata
def test_written_secondary_pars_keep_their_own_acquisition_timing(written, real_epochs):
    """Like GAMMA's resampled SLCs: a secondary's line 0 time follows its own orbit."""
    shift_real = [(image.first_line_time - real_epochs[MOTHER][0].first_line_time)
                  / np.timedelta64(1, "ns") * 1e-9
                  - (image.date - real_epochs[MOTHER][0].date) / np.timedelta64(1, "D") * 86400
                  for image, _ in real_epochs]
    mother_start = parse_par(written["paths"]["par"][MOTHER])["start_time"]
    for k, path in enumerate(written["paths"]["par"]):
        shift = parse_par(path)["start_time"] - mother_start
        # the real headers' shifts (line 0 of each date's own scene) within 10 ms
        assert shift == pytest.approx(shift_real[k], abs=0.01), DATES[k]


@pytest.mark.realdata
def test_mother_defaults_to_the_middle_date_or_the_slc_not_resampled(written, tmp_path):
    back = from_gamma(written["folder"])
    assert back.attrs["mother_time"] == "2018-03-07"
    folder = tmp_path / "stack"
    shutil.copytree(written["folder"], folder)
    for suffix in ("", ".par"):
        (folder / f"r{DATES[1]}.rslc{suffix}").rename(folder / f"{DATES[1]}.slc{suffix}")
    back = from_gamma(folder)
    assert back.attrs["mother_time"] == "2018-01-30"
    assert (back["h2ph"].values[:, :, 1] == 0).all()
    with pytest.raises(FileNotFoundError, match=r"mother: expected the mother's SLC and "
                                                r"parameter file \(such as '.*r20190101\.rslc'"):
        from_gamma(folder, mother="20190101")


@pytest.mark.realdata
def test_mother_without_its_slc_is_named_before_any_work(written, tmp_path):
    folder = tmp_path / "stack"
    shutil.copytree(written["folder"], folder)
    mother = written["paths"]["mother"]
    (folder / f"r{mother}.rslc").unlink()
    with pytest.raises(FileNotFoundError, match=rf"expected the SLC beside each SLC parameter "
                                                rf"file, found none for 1: '.*r{mother}\.rslc' "
                                                rf"\(of 'r{mother}\.rslc\.par'\)"):
        from_gamma(folder, mother=mother)
    (folder / f"r{mother}.rslc.par").unlink()
    with pytest.raises(FileNotFoundError, match=rf"found no file of "
                                                rf"{mother[:4]}-{mother[4:6]}-{mother[6:]}"):
        from_gamma(folder, mother=mother)


@pytest.mark.realdata
def test_from_gamma_reads_a_list_of_files_and_scomplex(written, tmp_path):
    slcs = written["paths"]["slc"]
    back = from_gamma([slcs[3], slcs[0], slcs[1]], mother=DATES[0], chunks=(16, 20))
    assert [str(d)[:10].replace("-", "") for d in back["time"].values] == [
        DATES[0], DATES[1], DATES[3]]
    assert back["complex"].data.chunksize == (16, 20, 3)
    # SCOMPLEX: int16 I/Q pairs, big-endian
    values = np.arange(np.prod(SHAPE), dtype=np.int16).reshape(SHAPE)
    for k in (0, 1):
        pairs = np.empty((*SHAPE, 2), dtype=">i2")
        pairs[..., 0], pairs[..., 1] = values + k, -values
        pairs.tofile(tmp_path / f"r{DATES[k]}.rslc")
        text = written["paths"]["par"][k].read_text().replace("FCOMPLEX", "SCOMPLEX")
        (tmp_path / f"r{DATES[k]}.rslc.par").write_text(text)
    back = from_gamma(tmp_path, mother=DATES[0])
    np.testing.assert_array_equal(back["complex"].values[:, :, 1], (values + 1) - 1j * values)


# ----------------------------------------------------------------------------------------------
# Bad input: clear errors naming the file and the field
# ----------------------------------------------------------------------------------------------

@pytest.fixture()
def real_slc_par(gamma) -> str:
    return (gamma / "headers" / "r20180106_VV_slc.par").read_text()


@pytest.mark.realdata
def test_truncated_par_names_the_file_and_the_missing_fields(real_slc_par, tmp_path):
    path = tmp_path / "r20180106_VV_slc.par"
    cut = real_slc_par.index("state_vector_position_4") + len("state_vector_position_4:  -14")
    path.write_text(real_slc_par[:cut])
    with pytest.raises(MetadataError) as error:
        parse_par(path)
    message = str(error.value)
    assert str(path) in message
    assert "'state_vector_position_4': expected 3 numbers; found -14" in message
    assert "state_vector_velocity_6" in message and "5 missing" in message
    assert error.value.paths == [str(path)]
    path.write_text(real_slc_par[:real_slc_par.index("radar_frequency")])
    with pytest.raises(MetadataError, match=r"'radar_frequency': expected a value .* found "
                                            r"the field is missing"):
        parse_par(path)


@pytest.mark.realdata
def test_non_numbers_are_all_reported_with_expected_and_found(real_slc_par, tmp_path):
    path = tmp_path / "r20180106_VV_slc.par"
    path.write_text(real_slc_par.replace("range_samples:                 68116",
                                         "range_samples:                 68116x")
                    .replace("5.4050005e+09  Hz", "C-band  Hz"))
    with pytest.raises(MetadataError) as error:
        parse_par(path)
    message = str(error.value)
    assert str(path) in message and "(2 problems)" in message
    assert "field 'range_samples': expected an integer; found '68116x'" in message
    assert "field 'radar_frequency': expected a number; found 'C-band  Hz'" in message
    assert [p[0] for p in error.value.problems] == ["range_samples", "radar_frequency"]


@pytest.mark.realdata
def test_data_file_of_the_wrong_size_is_named_with_expected_and_found_bytes(written, tmp_path):
    folder = tmp_path / "stack"
    shutil.copytree(written["folder"], folder)
    bad = folder / f"r{DATES[3]}.rslc"
    bad.write_bytes(bad.read_bytes()[:-8])
    expected = SHAPE[0] * SHAPE[1] * 8
    with pytest.raises(ValueError, match=rf"expected {expected} bytes each .* found "
                                         rf"'{re.escape(str(bad))}' has {expected - 8} bytes"):
        from_gamma(folder)


@pytest.mark.realdata
def test_missing_par_is_named(written, tmp_path):
    folder = tmp_path / "stack"
    shutil.copytree(written["folder"], folder)
    (folder / f"r{DATES[4]}.rslc.par").unlink()
    with pytest.raises(FileNotFoundError, match=rf"r{DATES[4]}\.rslc' \(looked for "
                                                rf"'r{DATES[4]}\.rslc\.par'"):
        from_gamma(folder)
    with pytest.raises(FileNotFoundError, match="GAMMA SLC files: 1 of 1 file"):
        from_gamma([folder / "r20990101.rslc"])


@pytest.mark.realdata
def test_inconsistent_stacks_are_refused_before_reading(written, tmp_path):
    folder = tmp_path / "stack"
    shutil.copytree(written["folder"], folder)
    par = folder / f"r{DATES[1]}.rslc.par"
    original = par.read_text()
    par.write_text(original.replace("range_samples:                    50",
                                    "range_samples:                    51"))
    with pytest.raises(MetadataError, match=r"expected one dimensions .* \(40, 51\) in"):
        from_gamma(folder)
    par.write_text(original.replace("date:      2018 01 30", "date:      2018 01 31"))
    with pytest.raises(MetadataError, match=r"expected the date of its name 20180130 .* "
                                            r"found 2018-01-31"):
        from_gamma(folder)
    par.write_text(original.replace("5.4050005e+09", "9.6500000e+09"))
    with pytest.raises(MetadataError, match="expected one radar wavelength for all dates"):
        from_gamma(folder)
    par.write_text(original)
    shutil.copy(folder / f"r{DATES[1]}.rslc", folder / f"{DATES[1]}.slc")
    shutil.copy(par, folder / f"{DATES[1]}.slc.par")
    with pytest.raises(ValueError, match="dates: expected one epoch per date, found "
                                         "duplicates"):
        from_gamma(folder)


@pytest.mark.realdata
def test_write_gamma_refuses_a_wavelength_other_than_the_geometry(written, tmp_path):
    stack = written["stack"].assign_attrs(wavelength=0.031)
    with pytest.raises(ValueError, match=r"stack.attrs\['wavelength'\]: expected the "
                                         r"geometry's .* found 0.031 m"):
        write_gamma(tmp_path, stack, written["geometry"])
    assert not list(tmp_path.iterdir())


def test_empty_and_unknown_files_are_refused(tmp_path):
    empty = tmp_path / "empty.par"
    empty.write_text("")
    with pytest.raises(MetadataError, match=r"(?s)empty\.par.*expected GAMMA 'key: value' lines"
                                            r".*found an empty file"):
        parse_par(empty)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        parse_par(tmp_path / "absent.par")


def test_a_bad_bperp_row_is_named_by_its_line(tmp_path):
    path = tmp_path / "a_bperp.par"
    path.write_text("*** Calculate baseline components perpendicular and parallel to look "
                    "vector ***\n\ninterferogram lines: 10   range samples/line: 20\n"
                    "baseline vector (TCN)   (m):      0.000     40.101      4.516\n"
                    "azimuth angle:      90.0000 (right looking)\n\n"
                    "  line   range      B_t       B_c        B_n     look angle      bpara"
                    "       bperp       blen\n" + "*" * 40 + "\n"
                    "     0      0     0.0000    39.4441     4.4393    27.496918     22.1492"
                    "     32.9386     39.6932\n"
                    "     0    200     0.0000    39.4441     4.4393    27.939152\n")
    with pytest.raises(MetadataError, match=r"'line 10': expected 9 numbers \(a table row\)"):
        read_bperp(path)


def test_read_bperp_refuses_other_parameter_files(tmp_path):
    path = tmp_path / "x_base.par"
    path.write_text("initial_baseline(TCN):  0.0  40.1  4.5   m   m   m\n"
                    "initial_baseline_rate:  0.0  0.06  0.01   m/s m/s m/s\n")
    assert parse_par(path)["initial_baseline(TCN)"].tolist() == [0.0, 40.1, 4.5]
    with pytest.raises(MetadataError, match="expected a base_perp table .* found a base"):
        read_bperp(path)


def test_parse_par_strips_units_and_keeps_text(tmp_path):
    path = tmp_path / "x_slc.par"
    path.write_text("Gamma Interferometric SAR Processor (ISP) - Image Parameter File\n\n"
                    "title:     s1a 2018 (software: IPF 002.84)\n"
                    "range_samples:   8\nfoo_polynomial:  1.5  2  m  m^2\n"
                    "azimuth_deskew:          ON\n")
    with pytest.raises(MetadataError) as error:  # an ISP image without its grid fields
        parse_par(path)
    assert {p[0] for p in error.value.problems} >= {"date", "start_time", "radar_frequency"}
    path.write_text("misc_value:  1.5e3  Hz\nname:  abc 1\nvector: 1 2 3 m m m\n"
                    "title:  2018 s1a\ndate:  2018 01 06 00 40 12.5566\n")
    par = parse_par(path)
    assert par["kind"] == "par"
    assert par["title"] == "2018 s1a" and par["date"][:3].tolist() == [2018, 1, 6]
    assert par["misc_value"] == 1500.0 and par["name"] == "abc 1"
    assert par["vector"].tolist() == [1, 2, 3]


def test_xarray_dataset_without_dates_cannot_be_written(tmp_path):
    stack = xr.Dataset({"complex": (("azimuth", "range", "time"), np.zeros((2, 3, 2), "c8"))},
                       coords={"time": [0, 1]})
    with pytest.raises(ValueError, match=r"stack\['time'\]: expected dates"):
        write_gamma(tmp_path, stack, geometry=None)


@pytest.mark.realdata
def test_write_gamma_writes_a_chunked_stack_band_by_band(written, tmp_path):
    stack = written["stack"].chunk({"azimuth": 16, "range": 20, "time": 2})
    paths = write_gamma(tmp_path, stack, written["geometry"])
    for mine, reference in zip(paths["slc"] + paths["par"],
                               written["paths"]["slc"] + written["paths"]["par"]):
        assert mine.read_bytes() == reference.read_bytes(), mine.name
