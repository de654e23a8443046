"""The chain's accuracy on scene families it was not tuned on, against floors from each truth.

Scenes come from ``tests/scenes.py``, a generator that shares no code with
:mod:`depsi.simulate` (exponential-covariance screens of 200 m to 3 km and 0.5 to 2 rad, PS
density 1-5 %, revisit 6/12/24 days, 30-120 epochs, noise 0.3-0.5 rad, h2ph varying across
range, bowl plus ramp velocities, white or block-correlated height errors). Each test runs
what a user runs, ``ps_selection(method="nad", threshold=0.25)`` then ``run_ps_chain``, and
compares on true PS with temporal coherence >= 0.8, after removing the median difference (the
datum), with three floors computed from the same truth with the true ambiguities:

- *noise floor*: a per-point least-squares fit of offset, velocity and height error with the
  atmosphere removed perfectly;
- *no-correction floor*: the same fit with the atmosphere left in;
- *kriging floor*: the no-correction heights less the best linear prediction of the
  atmosphere's projection on the baselines from every true PS, with this generator's exact
  covariances. No linear correction of the heights does better; on short correlation lengths it
  sits above 2 m (issue-c: 2.17 m), so the height goal is ``max(2 m, 1.5 x noise floor,
  1.25 x kriging floor)``.

Goals: velocity <= 1.1 x the no-correction floor and heights within the goal above on
white-height families; on every family heights never above the no-correction floor, >= 95 % of
the true PS in the result and no NaN in a reported point. Figures measured are in
docs/benchmarks.md.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from depsi import run_ps_chain
from depsi.processing.selection import ps_selection
from scenes import (
    FAST_FAMILIES,
    SLOW_FAMILIES,
    format_figures,
    kriging_floor,
    make_scene,
    score,
    truth_index,
)

logger = logging.getLogger(__name__)

VELOCITY_FACTOR = 1.1
HEIGHT_GOAL = 2.0
NOISE_FACTOR = 1.5
KRIGING_FACTOR = 1.25
RECOVERED = 0.95


def _run(family):
    stack, truth = make_scene(family)
    ps = ps_selection(stack, method="nad", threshold=0.25).compute()
    result = run_ps_chain(ps)
    figures = score(result, truth)
    idx = truth_index(truth, result["azimuth"].values, result["range"].values)
    coherent = (idx >= 0) & (result["temporal_coherence"].values >= 0.8)
    figures["height_kriging"] = kriging_floor(truth, idx[coherent])
    line = f"{family.name}: {format_figures(figures)}, kriging floor " \
           f"{figures['height_kriging']:.2f} m"
    logger.info(line)
    print(line)
    return figures


def _check(family, figures):
    f = figures
    assert f["n_nan"] == 0, f"{family.name}: NaN in reported points: {f}"
    assert f["true_ps_in_result"] >= RECOVERED * f["n_true_ps"], f"{family.name}: {f}"
    assert f["height_rmse"] <= f["height_nocorr"], \
        f"{family.name}: heights worse than no atmosphere correction: {f}"
    if family.height_blocks > 0:
        return  # correlated DEM errors: only "never worse than no correction" is asked
    assert f["velocity_rmse"] <= VELOCITY_FACTOR * f["velocity_nocorr"], f"{family.name}: {f}"
    goal = max(HEIGHT_GOAL, NOISE_FACTOR * f["height_noise"], KRIGING_FACTOR * f["height_kriging"])
    assert f["height_rmse"] <= goal, f"{family.name}: height above {goal:.2f} m: {f}"


@pytest.mark.parametrize("family", FAST_FAMILIES, ids=lambda f: f.name)
@pytest.mark.slow
def test_chain_reaches_floors_on_scene_family(family):
    _check(family, _run(family))


@pytest.mark.slow
@pytest.mark.parametrize("family", SLOW_FAMILIES, ids=lambda f: f.name)
def test_chain_reaches_floors_on_large_scene_family(family):
    _check(family, _run(family))


@pytest.mark.slow
def test_floors_are_ordered_on_the_truth():
    """The oracle floors themselves: noise <= kriging <= no-correction for heights (a check of
    the generator and the floor code, which a broken covariance would fail)."""
    family = FAST_FAMILIES[0]
    _, truth = make_scene(family)
    which = np.arange(len(truth["azimuth"]))
    from scenes import oracle_floors

    floors = oracle_floors(truth, which)
    kriging = kriging_floor(truth, which)
    assert floors["height_noise"] < kriging < floors["height_nocorr"]
    assert floors["velocity_noise"] < floors["velocity_nocorr"]
