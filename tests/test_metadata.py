"""DORIS v4/v5 metadata: values as the real files state them, and clear errors for bad files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from depsi.io.bounded import MetadataError
from depsi.io.metadata import SPEED_OF_LIGHT, detect_driver, read_metadata, read_metadata_stack

GOOD_DORIS5 = ("20180306", "20180312", "20180318")
GOOD_DORIS4 = ("20180301", "20180312", "20180323")


@pytest.fixture(scope="module")
def meta_dir(realdata: Path) -> Path:
    return realdata / "sarxarray_slc" / "metadata"


def doris5(meta_dir: Path, name: str) -> Path:
    return meta_dir / "meta_doris5" / name / "metadata.res"


def doris4(meta_dir: Path, name: str) -> Path:
    return meta_dir / "meta_doris4" / name / "metadata.res"


MINIMAL_DORIS5 = """DVersion:                               Version (2015) (For TOPSAR)
Start_process_control
readfiles:\t\t1
crop:\t\t0
End_process_control
*******************************************************************
*_Start_readfiles:
*******************************************************************
RADAR_FREQUENCY (HZ):                      5.405000454334350e+09
Radar_wavelength (m):                      0.055465760
First_pixel_azimuth_time (UTC):            2018-Mar-06 17:24:29.954980
Pulse_Repetition_Frequency (computed, Hz): 4.864863102995529e+02
Range_time_to_first_pixel (2way) (ms):     6.013024343276740
Range_sampling_rate (computed, MHz):       64.345238126
Number_of_lines_original:                  6878
Number_of_pixels_original:                 25133
*******************************************************************
* End_readfiles:_NORMAL
*******************************************************************
"""


@pytest.mark.realdata
def test_doris5_sentinel1_values_are_those_the_file_states(meta_dir: Path) -> None:
    meta = read_metadata(doris5(meta_dir, "20180306"), driver="doris5")
    assert meta["driver"] == "doris5"
    assert meta["sensor"] == "S1B" and meta["polarisation"] == "VV" and meta["swath"] == "IW3"
    assert meta["pass_direction"] == "ascending"
    assert meta["wavelength"] == 0.055465760
    assert meta["radar_frequency"] == 5.405000454334350e09
    assert abs(SPEED_OF_LIGHT / meta["radar_frequency"] - meta["wavelength"]) < 1e-8
    assert meta["first_azimuth_time"] == np.datetime64("2018-03-06T17:24:29.954980", "ns")
    assert meta["date"] == np.datetime64("2018-03-06", "ns")
    assert meta["prf"] == 4.864863102995529e02
    assert meta["azimuth_time_interval"] == 2.055556299999998e-03
    assert meta["range_time_first_pixel"] == pytest.approx(6.013024343276740e-3, rel=1e-15)
    assert meta["range_sampling_rate"] == pytest.approx(64.345238126e6, rel=1e-15)
    assert meta["slant_range_first_pixel"] == pytest.approx(901_329.674, abs=1e-3)
    assert meta["range_pixel_spacing"] == 2.329562
    assert meta["heading"] == -1.573212888897563e01
    assert (meta["scene_centre_latitude"], meta["scene_centre_longitude"]) == (
        53.54352136900687, 6.557386154885761)
    assert (meta["number_of_lines_original"], meta["number_of_pixels_original"]) == (6878, 25133)
    assert meta["crop"] == {"data_file": "2018-03-06.raw", "data_format": "complex_short",
                            "first_line": 1, "last_line": 6878, "first_pixel": 1,
                            "last_pixel": 25133, "number_of_lines": 6878,
                            "number_of_pixels": 25133}
    assert meta["resample"]["data_format"] == "complex_real4"
    # the stack's data are the resampled images: 6881 x 24865 w.r.t. the mother
    assert (meta["number_of_lines"], meta["number_of_pixels"]) == (6881, 24865)
    orbit = meta["orbit"]
    assert orbit.shape == (200, 4)
    np.testing.assert_array_equal(
        orbit[0], [62569, 4954320.931616273, 78580.69269184131, 5042109.736565054])
    assert orbit[-1, 0] == 62768


@pytest.mark.realdata
def test_doris5_reads_baseline_geometry_from_ifgs_res_beside_it(meta_dir: Path) -> None:
    meta = read_metadata(doris5(meta_dir, "20180306"))
    assert meta["perpendicular_baseline"] == -60.2
    assert meta["parallel_baseline"] == -61.6
    assert meta["look_angle"] == 38.3 and meta["incidence_angle"] == 43.6
    assert meta["height_of_ambiguity"] == 294.8
    assert (meta["ifg_number_of_lines"], meta["ifg_number_of_pixels"]) == (6881, 24865)
    assert "perpendicular_baseline" not in read_metadata(doris5(meta_dir, "20180318"))


@pytest.mark.realdata
def test_doris4_tandemx_values_are_those_the_file_states(meta_dir: Path) -> None:
    meta = read_metadata(doris4(meta_dir, "20180301"), driver="doris4")
    assert meta["driver"] == "doris4" and meta["sensor"] == "TDX-1"
    assert meta["pass_direction"] == "ascending"
    assert meta["wavelength"] == 0.031066581527999
    assert meta["radar_frequency"] == pytest.approx(SPEED_OF_LIGHT / 0.031066581527999)
    assert meta["first_azimuth_time"] == np.datetime64("2018-03-01T17:19:09.165", "ns")
    assert meta["prf"] == 3.43051038544788526e03
    assert meta["azimuth_time_interval"] == pytest.approx(1 / 3.43051038544788526e03)
    assert meta["range_time_first_pixel"] == pytest.approx(3.909066443017814e-3, rel=1e-15)
    assert meta["range_sampling_rate"] == pytest.approx(164.829163e6, rel=1e-15)
    assert meta["scene_centre_latitude"] == 5.25403896702452542e01
    assert (meta["number_of_lines_original"], meta["number_of_pixels_original"]) == (
        27445, 18238)
    crop = meta["crop"]
    assert (crop["first_line"], crop["last_line"], crop["first_pixel"], crop["last_pixel"]) == (
        3740, 5989, 5195, 7446)
    assert (crop["number_of_lines"], crop["number_of_pixels"]) == (2250, 2252)
    assert (meta["number_of_lines"], meta["number_of_pixels"]) == (1750, 1752)
    assert meta["orbit"].shape == (12, 4) and meta["orbit"][0, 0] == 62302


@pytest.mark.parametrize("folder, name, expected", [
    ("meta_doris4", "20180301", "doris4"),
    ("meta_doris5", "20180306", "doris5"),
])
@pytest.mark.realdata
def test_auto_driver_tells_doris4_from_doris5(meta_dir: Path, folder: str, name: str,
                                              expected: str) -> None:
    path = meta_dir / folder / name / "metadata.res"
    assert detect_driver(path.read_text()) == expected
    assert read_metadata(path)["driver"] == expected


@pytest.mark.realdata
def test_depsi_example_res_is_a_descending_sentinel1_acquisition(realdata: Path) -> None:
    meta = read_metadata(realdata / "depsi_stm_sparse" / "example.res")
    assert meta["date"] == np.datetime64("2020-03-28", "ns")
    assert meta["pass_direction"] == "descending" and meta["swath"] == "IW2"
    assert meta["wavelength"] == 0.055465760 and meta["orbit"].shape == (200, 4)


@pytest.mark.realdata
def test_wrong_timestamp_names_file_field_and_value(meta_dir: Path) -> None:
    path = doris5(meta_dir, "20180318_error_timestamp")
    with pytest.raises(MetadataError) as info:
        read_metadata(path)
    message = str(info.value)
    assert str(path) in message
    assert "First_pixel_azimuth_time (UTC)" in message and "'XXXX YYYY AAAA'" in message
    # the same file also states a 999 m wavelength: both problems are reported at once
    assert "Radar_wavelength (m)" in message and "999.05546576" in message
    assert {p[0] for p in info.value.problems} == {"First_pixel_azimuth_time (UTC)",
                                                   "Radar_wavelength (m)"}


@pytest.mark.realdata
def test_wrong_wavelength_names_field_value_and_the_frequency_check(meta_dir: Path) -> None:
    path = doris5(meta_dir, "20180318_error_wavelength")
    with pytest.raises(MetadataError) as info:
        read_metadata(path)
    message = str(info.value)
    assert str(path) in message and "Radar_wavelength (m)" in message
    assert "999.05546576" in message and "0.055466 m" in message
    assert info.value.problems[0][0] == "Radar_wavelength (m)"
    # the file is also cut short after readfiles although process control lists more steps
    assert "section 'precise_orbits'" in message and "truncated" in message


@pytest.mark.realdata
def test_missing_wavelength_field_is_named(meta_dir: Path) -> None:
    path = doris5(meta_dir, "20180318_missing_fields")
    with pytest.raises(MetadataError, match=r"Radar_wavelength \(m\).*missing") as info:
        read_metadata(path)
    assert str(path) in str(info.value) and info.value.paths == [str(path)]


@pytest.mark.realdata
def test_doris4_file_read_as_doris5_hints_at_the_right_driver(meta_dir: Path) -> None:
    with pytest.raises(MetadataError, match=r"pass driver='doris4'"):
        read_metadata(doris4(meta_dir, "20180301"), driver="doris5")


@pytest.mark.parametrize("old, new, field", [
    ("2018-Mar-06 17:24", "2018-Feb-31 17:24", "First_pixel_azimuth_time (UTC)"),
    ("2018-Mar-06 17:24", "1018-Mar-06 17:24", "First_pixel_azimuth_time (UTC)"),
    ("4.864863102995529e+02", "fast", "Pulse_Repetition_Frequency (computed, Hz)"),
    ("Number_of_lines_original:                  6878",
     "Number_of_lines_original:                  -3", "Number_of_lines_original"),
    ("Range_sampling_rate (computed, MHz):       64.345238126\n", "", "Range_sampling_rate"),
    ("Radar_wavelength (m):                      0.055465760",
     "Radar_wavelength (m):                      0.0600", "Radar_wavelength (m)"),
])
def test_synthetic_corruptions_name_the_field(tmp_path: Path, old: str, new: str,
                                              field: str) -> None:
    assert old in MINIMAL_DORIS5
    path = tmp_path / "slave.res"
    path.write_text(MINIMAL_DORIS5.replace(old, new))
    with pytest.raises(MetadataError, match=field.replace("(", r"\(").replace(")", r"\)")):
        read_metadata(path)


def test_minimal_doris5_file_reads(tmp_path: Path) -> None:
    path = tmp_path / "slave.res"
    path.write_text(MINIMAL_DORIS5)
    meta = read_metadata(path)
    assert meta["crop"] is None and meta["orbit"] is None
    assert meta["number_of_lines"] == 6878


@pytest.mark.realdata
def test_orbit_count_must_match_the_declared_number(meta_dir: Path, tmp_path: Path) -> None:
    text = doris4(meta_dir, "20180301").read_text()
    lines = text.splitlines()
    drop = next(i for i, line in enumerate(lines) if line.strip().startswith("62412"))
    path = tmp_path / "slave.res"
    path.write_text("\n".join(lines[:drop] + lines[drop + 1:]))
    with pytest.raises(MetadataError, match=r"NUMBER_OF_DATAPOINTS.*12 orbit.*11 vector"):
        read_metadata(path)


def test_a_file_that_is_not_doris_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.res"
    path.write_text("just some text\n")
    with pytest.raises(MetadataError, match="DORIS"):
        read_metadata(path)
    with pytest.raises(FileNotFoundError, match="nothing.res"):
        read_metadata(tmp_path / "nothing.res")


@pytest.mark.realdata
def test_stack_combines_dates_and_common_values(meta_dir: Path) -> None:
    paths = [doris5(meta_dir, n) for n in GOOD_DORIS5]
    stack = read_metadata_stack(paths)
    np.testing.assert_array_equal(
        stack["dates"], np.array(["2018-03-06", "2018-03-12", "2018-03-18"], "datetime64[ns]"))
    assert stack["first_azimuth_times"][1] == np.datetime64("2018-03-12T17:25:12.005028", "ns")
    assert stack["wavelength"] == 0.055465760 and stack["files"] == [str(p) for p in paths]
    assert stack["prf"] == 4.864863102995529e02  # the same in every epoch: one value
    assert stack["sensor"] == ["S1B", "S1A", "S1B"]  # differs: one per epoch
    np.testing.assert_array_equal(stack["number_of_lines_original"], [6878, 6875, 6887])
    assert {"sensor", "orbit", "first_azimuth_time"} <= set(stack["varying"])
    assert len(stack["epochs"]) == 3


@pytest.mark.realdata
def test_stack_of_mixed_wavelengths_names_the_files(meta_dir: Path) -> None:
    s1, tdx = doris5(meta_dir, "20180306"), doris4(meta_dir, "20180312")
    with pytest.raises(MetadataError, match="wavelength") as info:
        read_metadata_stack([s1, tdx])
    assert str(s1) in str(info.value) and str(tdx) in str(info.value)
    assert "0.05546576" in str(info.value) and "0.031066581527999" in str(info.value)


@pytest.mark.realdata
def test_stack_with_duplicate_dates_names_the_files(meta_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy" / "metadata.res"
    copy.parent.mkdir()
    shutil.copy(doris4(meta_dir, "20180312"), copy)
    with pytest.raises(MetadataError, match="duplicate dates 2018-03-12") as info:
        read_metadata_stack([doris4(meta_dir, "20180301"), doris4(meta_dir, "20180312"), copy])
    assert str(copy) in str(info.value)


@pytest.mark.realdata
def test_stack_with_a_malformed_file_fails_on_that_file(meta_dir: Path) -> None:
    bad = doris5(meta_dir, "20180318_error_timestamp")
    with pytest.raises(MetadataError, match="20180318_error_timestamp"):
        read_metadata_stack([doris5(meta_dir, "20180306"), bad])


def test_flat_simulated_stack_pairs_each_epoch_with_its_ifgs_file(tmp_path):
    from depsi.simulate import write_stack_binary

    info = write_stack_binary(tmp_path / "stack", shape=(32, 32), n_epochs=4, seed=3,
                              progress=False)
    for res, date, bperp in zip(info["res_files"], info["dates"], info["bperp"]):
        meta = read_metadata(res)
        assert meta["date"] == date
        if bperp != 0:
            assert meta["perpendicular_baseline"] == pytest.approx(bperp, abs=0.05)
