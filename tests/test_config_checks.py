"""A configuration and its temporal model are checked before any step runs: a refusal names the
key, the value found and what was expected, and leaves the workspace without step products."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
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
    from depsi.processing.temporal_model import ModelConfig

    time = np.datetime64("2020-01-01") + np.arange(12) * np.timedelta64(12, "D")
    model = ModelConfig(terms=["seasonal", "step"], step_dates=["2020-05-12"])
    assert check_model_support(model, time) == {"unknowns": 6, "epochs": 12}
