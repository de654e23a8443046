"""The depsi command line."""

import subprocess
import sys

import numpy as np
import xarray as xr

from depsi.cli import main
from depsi.io import save_stm


def test_help_explains_the_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in ("demo", "simulate", "info"):
        assert command in out


def test_console_script_runs():
    result = subprocess.run([sys.executable, "-m", "depsi.cli", "--help"], capture_output=True,
                            text=True, check=True)
    assert "space-time" in result.stdout


def test_info_describes_a_store(tmp_path, capsys):
    ds = xr.Dataset(
        {"amplitude": (("space", "time"), np.ones((6, 2), "f4"))},
        coords={"time": np.array(["2021-01-01", "2021-01-13"], "datetime64[ns]"),
                "azimuth": ("space", np.arange(6)), "range": ("space", np.arange(6))},
        attrs={"wavelength": 0.0555},
    )
    path = save_stm(ds, tmp_path / "ps.zarr")
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "space=6" in out and "time=2" in out
    assert "amplitude" in out and "float32" in out
    assert "wavelength: 0.0555" in out
    assert "Zarr v3" in out


def test_info_on_a_missing_store_fails_cleanly(tmp_path, caplog):
    assert main(["info", str(tmp_path / "missing.zarr")]) == 2
    assert "missing.zarr" in caplog.text


def test_info_reads_the_real_v2_store(realdata, capsys):
    assert main(["info", str(realdata / "depsi_stm_sparse" / "stm_sparse.zarr")]) == 0
    out = capsys.readouterr().out
    assert "Zarr v2" in out and "space=156" in out and "complex64" in out


def test_overwrite_can_be_switched_on_and_off_for_every_command():
    from depsi.cli import build_parser

    parser = build_parser()
    for command, default in ((["demo"], True), (["simulate", "s.zarr"], False),
                             (["config"], False)):
        assert parser.parse_args(command).overwrite is default, command
        assert parser.parse_args([*command, "--overwrite"]).overwrite is True, command
        assert parser.parse_args([*command, "--no-overwrite"]).overwrite is False, command


def test_demo_with_no_overwrite_keeps_an_earlier_output(tmp_path, caplog):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "earlier.txt").write_text("kept")
    assert main(["demo", "--out", str(out), "--no-overwrite", "--size", "16",
                 "--epochs", "4"]) == 2
    assert (out / "earlier.txt").read_text() == "kept"
    assert "exists" in caplog.text


def test_config_example_replaces_a_file_only_with_overwrite(tmp_path, caplog):
    path = tmp_path / "depsi.yaml"
    path.write_text("mine\n")
    assert main(["config", "--example", str(path)]) == 2
    assert path.read_text() == "mine\n" and "--overwrite" in caplog.text
    assert main(["config", "--example", str(path), "--overwrite"]) == 0
    assert path.read_text() != "mine\n"


def test_simulate_binary_replaces_an_earlier_stack_only_with_overwrite(tmp_path, caplog):
    folder = tmp_path / "binary"
    command = ["simulate", str(folder), "--format", "binary", "--azimuth", "8", "--range", "6",
               "--epochs", "3"]
    assert main(command) == 0
    first = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert main([*command, "--seed", "1"]) == 2
    assert "already exist" in caplog.text and str(folder) in caplog.text
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == first
    assert main([*command, "--seed", "1", "--overwrite"]) == 0
    replaced = {path.name: path.read_bytes() for path in folder.iterdir()}
    assert replaced.keys() == first.keys()
    assert any(replaced[name] != first[name] for name in first if name.startswith("slc_"))
