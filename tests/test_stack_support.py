"""Whether a stack can support the PS method, and the record of a failed step.

Too few epochs are refused when the stack opens, before selection; a short stack is warned about
with the predicted velocity std; a failing step leaves ``failed.json`` beside the manifests and
``--resume`` says which steps it will redo.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from depsi.cli import main
from depsi.pipeline import parse_config, run_pipeline
from depsi.pipeline.preflight import (
    MAX_VELOCITY_STD,
    MIN_EPOCHS,
    NAD_GUIDANCE_EPOCHS,
    NOMINAL_PHASE_STD,
    StackSupportError,
    check_stack_support,
    predicted_precision,
)
from depsi.pipeline.runner import FAILED_FILE, manifest_path
from depsi.pipeline.steps import STEP_NAMES

SNAP_PAIR = Path(__file__).parent / "data" / "sarxarray_slc" / "zarrs"


def _simulated(workspace: Path, n_epochs: int, shape=(60, 60)) -> dict:
    return {"input": {"simulate": {"shape": list(shape), "n_epochs": n_epochs, "seed": 1}},
            "output": {"workspace": str(workspace), "exports": ["csv"]},
            "compute": {"scheduler": "threads", "threads": 2}}


def _support_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and r.name == "depsi.pipeline.preflight"]


# --------------------------------------------------------------------- predicted precision
def test_velocity_std_of_a_regular_stack_matches_the_closed_form():
    t = np.arange(12) * 12 / 365.25
    expected = NOMINAL_PHASE_STD / (4 * np.pi / 0.0555) / np.sqrt(((t - t.mean()) ** 2).sum())
    found = predicted_precision(t, None, 0.0555)
    assert found["velocity_std"] == pytest.approx(expected, rel=1e-12)
    assert math.isinf(found["height_std"])


def test_velocity_and_height_std_are_the_diagonal_of_the_least_squares_covariance():
    rng = np.random.default_rng(0)
    t, h2ph = np.sort(rng.uniform(0, 3, 25)), rng.normal(0, 1e-4, 25)
    m2ph = 4 * np.pi / 0.031
    design = m2ph * np.column_stack([np.ones(25), t, h2ph])
    covariance = NOMINAL_PHASE_STD ** 2 * np.linalg.inv(design.T @ design)
    found = predicted_precision(t, h2ph, 0.031)
    assert found["velocity_std"] == pytest.approx(np.sqrt(covariance[1, 1]), rel=1e-9)
    assert found["height_std"] == pytest.approx(np.sqrt(covariance[2, 2]), rel=1e-9)


# ------------------------------------------------------------------------------- refusal
def test_the_real_snap_pair_is_refused_before_selection_with_exit_code_2(tmp_path, caplog):
    config = tmp_path / "snap.yaml"
    config.write_text(yaml.safe_dump({"input": {"format": "snap", "path": str(SNAP_PAIR)},
                                      "output": {"workspace": str(tmp_path / "ws"),
                                                 "exports": ["csv"]}}))
    assert main(["run", str(config), "--no-progress"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("input: 2 epochs" in e and f"expected at least {MIN_EPOCHS} epochs" in e
               and "12 days" in e for e in errors), errors
    assert not (tmp_path / "ws" / "ps.zarr").exists()
    assert not manifest_path(tmp_path / "ws", "stack").exists()


def test_fewer_epochs_than_the_arcs_model_needs_are_refused():
    from depsi.simulate import simulate_stack

    stack, _ = simulate_stack(shape=(10, 10), n_epochs=MIN_EPOCHS - 1, seed=1)
    with pytest.raises(StackSupportError, match=rf"input: {MIN_EPOCHS - 1} epochs .*"
                                                rf"expected at least {MIN_EPOCHS} epochs"):
        check_stack_support(stack, parse_config({}))


# ------------------------------------------------------------------------------- warnings
@pytest.mark.slow
def test_a_132_day_stack_warns_of_its_velocity_std_and_still_runs(tmp_path, caplog):
    config = parse_config(_simulated(tmp_path / "ws", 12))
    with caplog.at_level(logging.WARNING, logger="depsi.pipeline.preflight"):
        summary = run_pipeline(config, progress=False)
    assert summary.steps["export"].status == "ran"
    counts = summary.steps["stack"].counts
    assert counts["span_days"] == 132 and counts["velocity_std_mm_yr"] > MAX_VELOCITY_STD * 1000
    warnings = _support_warnings(caplog)
    velocity = [w for w in warnings if "predicted velocity std" in w]
    assert velocity and "12 epochs" in velocity[0] and "132 days" in velocity[0]
    assert f"{counts['velocity_std_mm_yr']:.1f} mm/yr" in velocity[0]
    assert "cannot be resolved" in velocity[0]
    assert any(f"below about {NAD_GUIDANCE_EPOCHS} epochs" in w for w in warnings)
    assert "predicted velocity std" in (tmp_path / "ws" / "depsi.log").read_text()


def test_a_30_epoch_stack_gives_no_warning(tmp_path, caplog):
    config = parse_config(_simulated(tmp_path / "ws", 30))
    with caplog.at_level(logging.WARNING, logger="depsi.pipeline.preflight"):
        summary = run_pipeline(config, stop="stack", progress=False)
    assert _support_warnings(caplog) == []
    assert summary.steps["stack"].counts["support_warnings"] == 0
    assert summary.steps["stack"].counts["drop_height"] is False


def test_an_h2ph_that_does_not_vary_asks_to_drop_the_height(caplog):
    from depsi.simulate import simulate_stack

    stack, _ = simulate_stack(shape=(10, 10), n_epochs=30, seed=1)
    stack = stack.assign(h2ph=stack["h2ph"] * 0)
    with caplog.at_level(logging.WARNING, logger="depsi.pipeline.preflight"):
        report = check_stack_support(stack, parse_config({}))
    assert report["drop_height"] and report["height_std"] is None
    assert any("does not vary" in w and "height term should be dropped" in w
               for w in _support_warnings(caplog))


# ----------------------------------------------------------------- failed.json and resume
def test_a_failing_step_leaves_failed_json_until_resume_completes_it(tmp_path, monkeypatch,
                                                                      caplog):
    from depsi.pipeline.steps import network

    config = parse_config(_simulated(tmp_path / "ws", 20, shape=(40, 40)))

    def broken(inputs, config, context):
        raise ValueError("network: expected a broken step, found one")

    monkeypatch.setattr(network, "run", broken)
    with pytest.raises(ValueError, match="broken step"):
        run_pipeline(config, stop="arcs", progress=False)
    failed = tmp_path / "ws" / FAILED_FILE
    record = json.loads(failed.read_text())
    assert failed.parent == manifest_path(tmp_path / "ws", "stack").parent
    assert record["step"] == "network" and record["exception"] == "ValueError"
    assert record["message"] == "network: expected a broken step, found one"
    assert "broken step" in record["hint"] and record["exit_code"] == 2
    assert {"time", "run_id"} <= set(record)

    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="depsi.pipeline.runner"):
        summary = run_pipeline(config, stop="arcs", resume=True, progress=False)
    plan = ("resume: will redo network (failed last time: ValueError: network: expected a "
            "broken step, found one), arcs; skips stack, selection (finished and valid)")
    assert plan in caplog.text and plan in summary.format()
    assert [summary.steps[s].status for s in STEP_NAMES[:4]] == \
        ["skipped", "skipped", "ran", "ran"]
    assert not failed.exists()
