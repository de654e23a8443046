"""Input that cannot be right is refused with a message naming the file and field:
hostile YAML configs, strings aimed at the SLURM batch script, malformed CSV tables, STMs
with impossible coordinates, and stores asking for pickles. Each test names one input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from depsi.io import from_csv, open_stm, save_stm
from depsi.io.store import StoreIntegrityError
from depsi.pipeline.config import ConfigError, load_config, parse_config
from depsi.stm import STMValidationError
from depsi.stm.schema import validate

DATES = np.array(["2020-01-01", "2020-01-13", "2020-01-25"], "datetime64[ns]")


def points(n=6, **attrs):
    return xr.Dataset({"amplitude": (("space", "time"), np.ones((n, 3), "f4"))},
                      coords={"time": DATES, "azimuth": ("space", np.arange(n)),
                              "range": ("space", np.arange(n) % 2)},
                      attrs={"wavelength": 0.0555, **attrs})


# ------------------------------------------------------------------------------------ config
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_billion_laughs_is_refused_at_once(tmp_path):
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]"
              for i in range(8)]
    began = time.monotonic()
    with pytest.raises(ConfigError, match="anchor or alias"):
        load_config(write(tmp_path, "\n".join(lines)))
    assert time.monotonic() - began < 2


def test_deeply_nested_lists_are_refused_without_recursion_error(tmp_path):
    with pytest.raises(ConfigError, match="levels of nesting"):
        load_config(write(tmp_path, "[" * 100_000 + "]" * 100_000))


def test_an_oversized_config_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="at most"):
        load_config(write(tmp_path, "# " + "x" * 2**21))


def test_a_config_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"compute:\n  scheduler: \xff\xfe\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_config(path)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_numbers_are_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="arcs.height_range"):
        load_config(write(tmp_path, f"arcs:\n  height_range: {value}\n"))


@pytest.mark.parametrize("key,value", [
    ("queue", "normal\nrm -rf /"), ("account", "proj; rm -rf /"), ("queue", "a b"),
    ("job_directives", ["--qos=short\nrm -rf /"]), ("job_script_prologue", ["ok\r\nbad"]),
    ("interface", "ib0\x00")])
def test_strings_reaching_the_batch_script_are_one_safe_line(key, value):
    with pytest.raises(ConfigError, match=f"compute.slurm.{key}"):
        parse_config({"compute": {"slurm": {key: value}}})


def test_slurm_script_refuses_a_job_name_with_a_newline(tmp_path):
    from depsi.cli import slurm_batch_script

    path = write(tmp_path, "compute:\n  scheduler: slurm\n")
    with pytest.raises(ValueError, match="job_name"):
        slurm_batch_script(path, job_name="x\nrm -rf /")
    script = slurm_batch_script(path, job_name="depsi")
    assert "rm -rf" not in script


def test_a_huge_bad_value_gives_a_short_message():
    with pytest.raises(ConfigError) as info:
        parse_config({"compute": {"workers": ["x"] * 10**6}})
    assert len(str(info.value)) < 500


# --------------------------------------------------------------------------------------- CSV
def test_a_repeated_csv_column_is_refused(tmp_path):
    path = tmp_path / "ps.csv"
    path.write_text("pnt_id,pnt_line,pnt_pixel,d_20160327,d_20160327\nL1P1,1,1,0.0,0.1\n")
    with pytest.raises(STMValidationError, match=r"'d_20160327'\] more than once"):
        from_csv(path, names="depsi")


def test_non_numeric_latitude_in_csv_is_refused(tmp_path):
    path = tmp_path / "ps.csv"
    path.write_text("pnt_id,pnt_line,pnt_pixel,pnt_lat,d_20160327\nL1P1,1,1,north,0.0\n")
    with pytest.raises(STMValidationError, match="'pnt_lat'.*expected numbers"):
        from_csv(path, names="depsi")


def test_duplicate_positions_in_csv_are_refused(tmp_path):
    path = tmp_path / "ps.csv"
    path.write_text("pnt_line,pnt_pixel,d_20160327\n1,1,0.0\n1,1,0.5\n")
    with pytest.raises(STMValidationError, match="duplicated position"):
        from_csv(path, names="depsi")


# ------------------------------------------------------------------------------- validation
def test_non_numeric_coordinates_are_refused():
    ds = points().assign_coords(lat=("space", np.array(["52.1"] * 6)))
    with pytest.raises(STMValidationError, match="coordinate 'lat': expected numbers"):
        validate(ds)


def test_an_stm_without_epochs_is_refused():
    with pytest.raises(STMValidationError, match="dimension 'time'.*size 0"):
        validate(points().isel(time=slice(0, 0)))


def test_an_stm_without_points_stays_valid():
    validate(points().isel(space=slice(0, 0)))  # an empty selection is a result, not an error


def test_duplicate_positions_are_refused_by_save(tmp_path):
    ds = points().assign_coords(range=("space", np.zeros(6, int)),
                                azimuth=("space", [0, 1, 2, 2, 3, 4]))
    with pytest.raises(STMValidationError, match="1 duplicated position"):
        save_stm(ds, tmp_path / "ps.zarr")
    validate(ds)  # an STM in memory may hold them; a stored or read one may not


@pytest.mark.parametrize("wavelength", [-5, 0, float("inf"), "green"])
def test_a_wavelength_that_is_present_must_be_a_radar_wavelength(wavelength):
    with pytest.raises(STMValidationError, match="attribute 'wavelength'"):
        validate(points(wavelength=wavelength))


# ------------------------------------------------------------------------------------ stores
def test_open_stm_on_a_file_names_it(tmp_path):
    path = tmp_path / "ps.zarr"
    path.write_text("not a store")
    with pytest.raises(StoreIntegrityError, match=r"ps\.zarr.*found a file"):
        open_stm(path)


def test_open_stm_on_an_empty_folder_names_it(tmp_path):
    (tmp_path / "ps.zarr").mkdir()
    with pytest.raises(StoreIntegrityError, match=r"ps\.zarr.*an empty folder"):
        open_stm(tmp_path / "ps.zarr")


def test_a_pickle_codec_in_a_v3_store_is_refused_before_decoding(tmp_path):
    path = save_stm(points(), tmp_path / "ps.zarr")
    meta = path / "azimuth" / "zarr.json"
    document = json.loads(meta.read_text())
    document["codecs"].insert(0, {"name": "numcodecs.pickle"})
    meta.write_text(json.dumps(document))
    with pytest.raises(StoreIntegrityError, match="'azimuth'.*pickle"):
        open_stm(path)


def test_an_object_dtype_v2_store_is_refused_whatever_numcodecs_allows(tmp_path):
    path = tmp_path / "v2.zarr"
    (path / "payload").mkdir(parents=True)
    (path / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (path / "payload" / ".zarray").write_text(json.dumps({
        "zarr_format": 2, "shape": [1], "chunks": [1], "dtype": "|O", "compressor": None,
        "fill_value": None, "order": "C", "filters": [{"id": "pickle", "protocol": 5}]}))
    (path / "payload" / "0").write_bytes(b"\x80\x05N.")
    with pytest.raises(StoreIntegrityError, match="'payload'.*pickle"):
        open_stm(path)


def test_a_killed_replace_is_undone_by_the_next_open(tmp_path):
    path = save_stm(points(), tmp_path / "ps.zarr")
    aside = tmp_path / ".ps.zarr.replaced-0badf00d"
    path.rename(aside)  # what a writer killed between its two renames leaves
    (tmp_path / ".ps.zarr.writing-0badf00d").mkdir()
    assert open_stm(path).sizes["space"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ps.zarr"]  # no lock file left
