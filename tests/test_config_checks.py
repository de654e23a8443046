"""A configuration and its temporal model are checked before any step runs: a refusal names the
key, the value found and what was expected, and leaves the workspace without step products."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from depsi.cli import main
from depsi.pipeline.manifest import manifest_path
from depsi.pipeline.steps import STEP_NAMES

#: The small simulated input of every whole run here (12 epochs, 2020-01-01 every 12 days).
SIMULATED = {"simulate": {"shape": [40, 40], "n_epochs": 12}}


def refused_run(tmp_path: Path, caplog, **sections) -> str:
    """Run ``depsi run`` on a configuration of the simulated input and ``sections``; assert it
    fails before any step and return its ERROR lines."""
    workspace = tmp_path / "ws"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"input": SIMULATED, "output": {"workspace": str(workspace)},
                                      **sections}))
    with caplog.at_level(logging.INFO):
        code = main(["run", str(config), "--no-progress"])
    assert code != 0
    for step in STEP_NAMES:
        assert not manifest_path(workspace, step).exists(), step
    assert not any((workspace / name).exists() for name in ("stack.zarr", "ps.zarr"))
    assert "step stack:" not in caplog.text
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


# ------------------------------------------------------------------- the model and its epochs
def test_a_model_with_more_unknowns_than_epochs_is_refused_naming_both_counts(tmp_path, caplog):
    errors = refused_run(tmp_path, caplog, model={
        "terms": ["seasonal", "semi_annual", "step", "breakpoint"],
        "step_dates": ["2020-02-01", "2020-03-01", "2020-04-01"],
        "breakpoint_dates": ["2020-02-15", "2020-03-15"]})
    assert "model.terms" in errors and "['seasonal', 'semi_annual', 'step', 'breakpoint']" \
        in errors, errors
    assert "12 unknowns per point" in errors and "for 12 epochs" in errors, errors
    assert "expected fewer unknowns than epochs" in errors, errors


def test_a_breakpoint_at_the_first_epoch_is_refused_naming_the_date(tmp_path, caplog):
    errors = refused_run(tmp_path, caplog, model={"terms": ["breakpoint"],
                                                  "breakpoint_dates": ["2020-01-01"]})
    assert "model.breakpoint_dates: 2020-01-01 has no epoch before it" in errors, errors
    assert "2020-01-01 to 2020-05-12" in errors, errors


def test_a_breakpoint_at_the_last_epoch_is_refused_naming_the_date(tmp_path, caplog):
    errors = refused_run(tmp_path, caplog, model={"terms": ["breakpoint"],
                                                  "breakpoint_dates": ["2020-05-12"]})
    assert "model.breakpoint_dates: 2020-05-12 has no epoch after it" in errors, errors


def test_a_step_after_the_last_epoch_is_refused_naming_the_date(tmp_path, caplog):
    errors = refused_run(tmp_path, caplog, model={"terms": ["step"],
                                                  "step_dates": ["2020-06-01"]})
    assert "model.step_dates: 2020-06-01 has no epoch on or after it" in errors, errors
    assert "the last epoch is 2020-05-12" in errors, errors


def test_a_step_on_the_first_epoch_is_refused(tmp_path, caplog):
    errors = refused_run(tmp_path, caplog, model={"terms": ["step"],
                                                  "step_dates": ["2019-12-01"]})
    assert "model.step_dates: 2019-12-01 has no epoch before it" in errors, errors


def test_a_model_the_epochs_support_passes_the_check():
    from depsi.pipeline.preflight import check_model_support
    from depsi.processing.motion_models import ModelConfig

    time = np.datetime64("2020-01-01") + np.arange(12) * np.timedelta64(12, "D")
    model = ModelConfig(terms=["seasonal", "step"], step_dates=["2020-05-12"])
    assert check_model_support(model, time) == {"unknowns": 6, "epochs": 12}


# ----------------------------------------------------------- the thermal term's temperatures
#: The simulated input's epochs.
EPOCHS = np.datetime64("2020-01-01", "ns") + np.arange(12) * np.timedelta64(12, "D")
CELSIUS = [3.5 + i for i in range(12)]


def _rows(values, separator=",", decimal="."):
    return [f"{str(t)[:10]}{separator}{str(v).replace('.', decimal)}"
            for t, v in zip(EPOCHS, values)]


@pytest.mark.parametrize(("name", "write"), [
    ("byte-order mark", lambda path: path.write_bytes(
        ("\ufeffdate,temperature\n" + "\n".join(_rows(CELSIUS)) + "\n").encode("utf-8"))),
    ("CRLF", lambda path: path.write_bytes(
        ("date,temperature\r\n" + "\r\n".join(_rows(CELSIUS)) + "\r\n").encode("utf-8"))),
    ("semicolons", lambda path: path.write_text(
        "date;temperature\n" + "\n".join(_rows(CELSIUS, ";", ",")) + "\n")),
    ("Excel CSV UTF-8 with semicolons and CRLF", lambda path: path.write_bytes(
        ("\ufeffDate;Temperature\r\n" + "\r\n".join(_rows(CELSIUS, ";", ",")) + "\r\n")
        .encode("utf-8"))),
])
def test_a_temperature_file_as_spreadsheets_write_it_is_read(tmp_path, name, write):
    from depsi.processing.motion_models import read_temperature

    path = tmp_path / "temperature.csv"
    write(path)
    np.testing.assert_array_equal(read_temperature(path, EPOCHS), CELSIUS)


def test_the_unit_of_the_temperatures_read_is_logged(tmp_path, caplog):
    from depsi.processing.motion_models import read_temperature

    path = tmp_path / "temperature.csv"
    path.write_text("date,temperature\n" + "\n".join(_rows([t + 273.15 for t in CELSIUS])))
    with caplog.at_level(logging.INFO, logger="depsi.processing.motion_models"):
        read_temperature(path, EPOCHS)
    assert "12 rows" in caplog.text and "read in kelvin" in caplog.text, caplog.text


def test_a_header_with_both_separators_is_refused(tmp_path):
    from depsi.processing.motion_models import read_temperature

    path = tmp_path / "temperature.csv"
    path.write_text("date;temperature,station\n")
    with pytest.raises(ValueError, match=r"model.temperature: expected columns separated by "
                                         r"',' or by ';', found both"):
        read_temperature(path, EPOCHS)


def test_temperatures_in_mixed_units_are_refused_before_any_step(tmp_path, caplog):
    mixed = CELSIUS[:9] + [t + 273.15 for t in CELSIUS[9:]]  # the last three rows in kelvin
    path = tmp_path / "temperature.csv"
    path.write_text("date,temperature\n" + "\n".join(_rows(mixed)) + "\n")
    errors = refused_run(tmp_path, caplog, model={"terms": ["thermal"],
                                                  "temperature": str(path)})
    assert "model.temperature: expected one unit" in errors, errors
    assert "kelvin (above 200) on lines 11, 12, 13 (3 rows)" in errors, errors
    assert "degrees Celsius (at most 200) on lines 2, 3, 4, 5, 6, ... (9 rows)" in errors, errors


# ----------------------------------------------------------------- dates YAML reads as dates
def test_unquoted_input_dates_are_read_as_iso_text():
    from depsi.pipeline.config import parse_config

    config = parse_config(yaml.safe_load(
        "input:\n  format: geotiff\n  path: /data/stack\n"
        "  dates: [2023-01-06, 2023-01-18, 2023-01-30 00:00:00]\n  wavelength: 0.0555\n"))
    assert config.input.dates == ["2023-01-06", "2023-01-18", "2023-01-30"]


def test_unquoted_step_and_breakpoint_dates_are_read_as_iso_text():
    from depsi.pipeline.config import parse_config

    config = parse_config(yaml.safe_load(
        "model:\n  terms: [step, breakpoint]\n  step_dates: [2020-03-01]\n"
        "  breakpoint_dates: [2020-04-01]\n"))
    assert (config.model.step_dates, config.model.breakpoint_dates) == (
        ["2020-03-01"], ["2020-04-01"])


# ------------------------------------------------------------------------ compute resources
def test_a_memory_limit_below_a_workers_own_needs_is_refused_naming_the_key(tmp_path, caplog):
    errors = refused_run(tmp_path, caplog, compute={"scheduler": "local", "memory_limit": "1B"})
    assert "compute.memory_limit: expected at least 268435456 bytes" in errors, errors
    assert "found '1B' (1 byte)" in errors, errors


# ------------------------------------------------------------------------- the scene's size
def test_a_ds_window_larger_than_the_scene_is_refused_before_any_step(tmp_path, caplog):
    errors = refused_run(tmp_path, caplog,
                         selection={"ds": {"enabled": True, "window": [11, 51]}})
    assert "selection.ds.window: expected at most the scene's 40 x 40 pixels (azimuth x range)" \
        ", found [11, 51]" in errors, errors


def test_a_ds_window_larger_than_a_read_stack_is_refused_by_the_stack_step(tmp_path):
    from depsi.pipeline.config import parse_config
    from depsi.pipeline.steps import StepContext, run_step

    config = parse_config({"input": SIMULATED, "output": {"workspace": str(tmp_path)},
                           "selection": {"ds": {"enabled": True, "window": [41, 5]}}})
    with pytest.raises(ValueError, match=r"selection.ds.window: .* 40 x 40 pixels .* \[41, 5\]"):
        run_step("stack", config, context=StepContext(target=tmp_path / "stack.zarr"))


def test_the_epochs_and_scene_of_a_zarr_store_are_checked_before_any_step(tmp_path):
    from depsi.pipeline.config import parse_config
    from depsi.pipeline.preflight import StackConfigError, check_feasible
    from depsi.simulate import write_stack_zarr

    store = tmp_path / "stack.zarr"
    write_stack_zarr(store, shape=(30, 20), n_epochs=8)
    with pytest.raises(StackConfigError, match=r"selection.ds.window: .* 30 x 20 pixels"):
        check_feasible(parse_config({"input": {"path": str(store)},
                                     "selection": {"ds": {"enabled": True, "window": [5, 21]}}}))
    with pytest.raises(StackConfigError, match=r"model.step_dates: 2021-01-01 .* last epoch is "
                                               r"2020-03-25"):
        check_feasible(parse_config({"input": {"path": str(store)},
                                     "model": {"terms": ["step"], "step_dates": ["2021-01-01"]}}))


def test_a_ds_window_larger_than_the_scene_under_auto_is_refused_before_any_step(tmp_path,
                                                                                 caplog):
    errors = refused_run(tmp_path, caplog, selection={"ds": {"enabled": "auto",
                                                             "window": [5, 41]}})
    assert "selection.ds.window: expected at most the scene's 40 x 40 pixels" in errors, errors
    assert "found [5, 41]" in errors and "selection.ds.enabled: auto" in errors, errors


def test_a_ds_window_is_not_checked_when_no_ds_are_selected():
    from depsi.pipeline.config import parse_config
    from depsi.pipeline.preflight import check_ds_window

    config = parse_config({"selection": {"ds": {"enabled": False, "window": [99, 99]}}})
    check_ds_window(config, (40, 40))


# --------------------------------------------------------------- the documented configurations
DOCS = Path(__file__).resolve().parents[1] / "docs"
#: A line put just before a ```yaml fence of the docs whose block is not a configuration of
#: ``depsi run`` (a fragment, another tool's file): its block is not parsed.
NOT_A_CONFIGURATION = "<!-- not a configuration -->"
_FENCE = re.compile(r"^```ya?ml\s*$")


def _documented_configurations() -> list:
    blocks = []
    for page in sorted(DOCS.rglob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if not _FENCE.match(line.strip()):
                continue
            if number and lines[number - 1].strip() == NOT_A_CONFIGURATION:
                continue
            end = next(i for i in range(number + 1, len(lines)) if lines[i].strip() == "```")
            where = f"{page.relative_to(DOCS.parent)}:{number + 1}"
            blocks.append(pytest.param("\n".join(lines[number + 1:end]), id=where))
    return blocks


def test_the_docs_hold_configurations_to_check():
    assert len(_documented_configurations()) >= 5


@pytest.mark.parametrize("text", _documented_configurations())
def test_every_documented_configuration_parses(text, request):
    """Each ```yaml block of the docs is a configuration (its sections; the rest defaults)."""
    from depsi.pipeline.config import parse_config

    parse_config(yaml.safe_load(text), source=request.node.callspec.id)


#: The small simulated stack a documented block without an input runs on, and its dates.
DOCUMENTED_RUN_EPOCHS = 12
#: What the documented blocks need that only a cluster has: their runs are tests/test_slurm.py's.
CLUSTER_SCHEDULERS = ("slurm",)


def _runnable_documented_blocks() -> list:
    runnable = []
    for param in _documented_configurations():
        block = yaml.safe_load(param.values[0])
        if (block.get("compute") or {}).get("scheduler") not in CLUSTER_SCHEDULERS:
            runnable.append(pytest.param(block, id=param.id))
    return runnable


def _simulated_input(folder: Path, fmt: str) -> tuple[dict, list[str]]:
    """A small simulated stack written in ``fmt`` into ``folder``: its input section's path
    (and dates) and its dates."""
    from depsi.io.writers import write_slc_stack
    from depsi.simulate import simulate_stack, simulated_geometry

    stack, _ = simulate_stack(shape=(40, 40), n_epochs=DOCUMENTED_RUN_EPOCHS, seed=3)
    stack = stack.compute()
    dates = [str(np.datetime64(t, "D")) for t in stack["time"].values]
    path = write_slc_stack(folder, stack, simulated_geometry(stack), format=fmt)
    return {"path": str(path), "dates": dates}, dates


def _whole_configuration(block: dict, tmp_path: Path, realdata: Path) -> dict:
    """A documented block made a whole configuration: a small input in place of its paths
    (the real Houston crop for the raw interferogram layout), a workspace in ``tmp_path``."""
    config = {key: dict(value) if isinstance(value, dict) else value
              for key, value in block.items()}
    section = config.get("input")
    if section is None:
        config["input"] = {"simulate": {"shape": [40, 40], "n_epochs": DOCUMENTED_RUN_EPOCHS}}
        dates = [str(np.datetime64("2020-01-01") + np.timedelta64(12 * k, "D"))
                 for k in range(DOCUMENTED_RUN_EPOCHS)]
    elif section["format"] == "interferograms":
        crop = realdata / "psps_houston_crop"
        section |= {"path": str(crop), "shape": [64, 64]}
        dates = []
    else:
        written, dates = _simulated_input(tmp_path / "stack", section["format"])
        section |= {k: v for k, v in written.items() if k in section}
    if isinstance(config.get("model"), dict) and config["model"].get("temperature"):
        table = tmp_path / "temperature.csv"
        table.write_text("date,temperature\n" + "".join(
            f"{d},{15 + 10 * np.sin(2 * np.pi * k / 30):.2f}\n" for k, d in enumerate(dates)))
        config["model"]["temperature"] = str(table)
    config["output"] = {"workspace": str(tmp_path / "ws")}
    return config


def test_the_docs_hold_runnable_configurations():
    assert len(_runnable_documented_blocks()) >= 4


@pytest.mark.slow
@pytest.mark.realdata
@pytest.mark.parametrize("block", _runnable_documented_blocks())
def test_every_documented_configuration_runs(block, tmp_path, realdata, caplog):
    """Each ```yaml block of the docs, on a small input in place of its paths, runs with
    ``depsi run`` to its exports (a cluster's compute section is tests/test_slurm.py's)."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_whole_configuration(block, tmp_path, realdata)))
    with caplog.at_level(logging.INFO):
        code = main(["run", str(config), "--no-progress"])
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert code == 0, errors
    assert (tmp_path / "ws" / "exports" / "points.csv").is_file()


def test_two_steps_with_no_epoch_between_them_are_refused():
    from depsi.pipeline.preflight import StackConfigError, check_model_support
    from depsi.processing.motion_models import ModelConfig

    model = ModelConfig(terms=["step"], step_dates=["2020-02-05", "2020-02-01"])
    with pytest.raises(StackConfigError, match=r"model.step_dates: 2020-02-01 and 2020-02-05 "
                                               r"have no epoch between them"):
        check_model_support(model, EPOCHS)
