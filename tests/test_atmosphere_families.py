"""The chain's accuracy and calibration on atmospheres it was not tuned to.

Scenes from ``tests/scenes.py`` (:data:`~scenes.ATMOSPHERE_FAMILIES`, a generator that shares
no code with :mod:`depsi.simulate`): screens with a Gaussian (smooth) covariance, power-law
(von Karman) screens of the two turbulent regimes (1-D spectral slopes 5/3 and 8/3), an
anisotropic screen (exponential covariance stretched 1 : 0.15 and rotated 30 degrees) and a
stratified part ``k_t * terrain height`` on a given height raster (coordinate ``height`` of the
stack, a DEM in radar geometry, from which the chain estimates the stratified part) over an
exponential screen; white height errors everywhere; three scenes (seeds) per family, figures
pooled. What a user runs:
``ps_selection(method="nad", threshold=0.25)`` then ``run_ps_chain`` with defaults; scored on
the true PS with temporal coherence >= 0.8 about the median difference (the datum), against
each family's own floors from its truth (true ambiguities): *noise* (atmosphere removed
perfectly), *kriging* (best linear correction of the heights with the generator's exact
covariances, :func:`scenes.kriging_floor`) and *no correction* (atmosphere left in).

Targets: heights <= 1.2 x the kriging floor, velocity <= 1.1 x the no-correction
floor, and the 95 % intervals ``estimate +- 1.96 std`` of ``velocity_std`` and
``height_error_std`` holding 90-98 % of the truth. Where the chain misses a target today the
test is a strict xfail carrying the measured figure, so the gap stays recorded and a fix shows
as an XPASS. Figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest

from depsi import run_ps_chain
from depsi.processing.selection import ps_selection
from scenes import (
    ATMOSPHERE_FAMILIES,
    format_figures,
    kriging_floor,
    make_scene,
    score,
    truth_index,
)

logger = logging.getLogger(__name__)

KRIGING_FACTOR = 1.2
VELOCITY_FACTOR = 1.1
COVERAGE = (0.90, 0.98)  # of the 95 % intervals
RECOVERED = 0.95
SEEDS = (0, 100, 200)  # added to each family's seed: three scenes per family

#: Targets the chain misses today, pooled over the three scenes, as ``(check, family):
#: reason`` with the measured figure (none since the screen model chosen by fit, the scene's
#: pixel spacing and per-point kriging variances, 2026-12-02).
GAPS: dict[tuple[str, str], str] = {}


def _families(check):
    """The families as parameters, a strict xfail on those of ``GAPS`` for ``check``."""
    params = []
    for family in ATMOSPHERE_FAMILIES:
        reason = GAPS.get((check, family.name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(family, marks=marks, id=family.name))
    return params


def _coverage(result, truth, coherent, which, name):
    """Fraction of the truth inside ``estimate +- 1.96 std`` (errors about their median)."""
    error = result[name].values[coherent] - truth[name][which]
    error = error - np.median(error)
    return float(np.mean(np.abs(error) <= 1.959964 * result[f"{name}_std"].values[coherent]))


def _run_scene(family):
    stack, truth = make_scene(family)
    ps = ps_selection(stack, method="nad", threshold=0.25).compute()
    result = run_ps_chain(ps)
    figures = score(result, truth)
    idx = truth_index(truth, result["azimuth"].values, result["range"].values)
    coherent = (idx >= 0) & (result["temporal_coherence"].values >= 0.8)
    which = idx[coherent]
    figures["height_kriging"] = kriging_floor(truth, which)
    figures["velocity_coverage"] = _coverage(result, truth, coherent, which, "velocity")
    figures["height_coverage"] = _coverage(result, truth, coherent, which, "height_error")
    line = (f"{family.name} seed {family.seed}: {format_figures(figures)}, kriging floor "
            f"{figures['height_kriging']:.2f} m, 95 % intervals hold velocity "
            f"{figures['velocity_coverage']:.3f} height {figures['height_coverage']:.3f}")
    logger.info(line)
    print(line)
    return figures


@functools.lru_cache(maxsize=len(ATMOSPHERE_FAMILIES))
def _run(family):
    """The family's figures pooled over ``SEEDS`` scenes: RMSEs and floors as root mean
    squares, coverages and counts as means and sums (one scene's coverage moves by +-4 %
    with its draw of the atmosphere, which every point's error shares)."""
    runs = [_run_scene(family.with_seed(family.seed + offset)) for offset in SEEDS]
    pooled = {}
    for key in runs[0]:
        values = np.array([run[key] for run in runs], dtype=np.float64)
        if key.endswith(("_rmse", "_noise", "_nocorr", "_kriging")):
            pooled[key] = float(np.sqrt(np.mean(values**2)))
        elif key.endswith("_coverage"):
            pooled[key] = float(np.mean(values))
        else:
            pooled[key] = int(values.sum())
    pooled["runs"] = runs
    return pooled


@pytest.mark.slow
@pytest.mark.parametrize("family", _families("floors"))
def test_floors_are_ordered_on_family(family):
    """noise < kriging < no-correction for heights, noise < no-correction for velocity: a
    check of the generator and of the floors' covariances on each atmosphere."""
    f = _run(family)
    assert f["height_noise"] < f["height_kriging"] < f["height_nocorr"], f
    assert f["velocity_noise"] < f["velocity_nocorr"], f


@pytest.mark.slow
@pytest.mark.parametrize("family", _families("points"))
def test_chain_keeps_true_ps_on_family(family):
    f = _run(family)
    assert f["n_nan"] == 0, f"{family.name}: NaN in reported points: {f}"
    assert f["true_ps_in_result"] >= RECOVERED * f["n_true_ps"], f"{family.name}: {f}"


@pytest.mark.slow
@pytest.mark.parametrize("family", _families("heights"))
def test_heights_reach_kriging_floor_on_family(family):
    f = _run(family)
    assert f["height_rmse"] <= f["height_nocorr"], f"{family.name}: worse than no correction"
    assert f["height_rmse"] <= KRIGING_FACTOR * f["height_kriging"], (
        f"{family.name}: heights {f['height_rmse'] / f['height_kriging']:.2f}x the kriging "
        f"floor: {f}")


@pytest.mark.slow
@pytest.mark.parametrize("family", _families("velocity"))
def test_velocity_reaches_nocorr_floor_on_family(family):
    f = _run(family)
    assert f["velocity_rmse"] <= VELOCITY_FACTOR * f["velocity_nocorr"], (
        f"{family.name}: velocity {f['velocity_rmse'] / f['velocity_nocorr']:.2f}x the "
        f"no-correction floor: {f}")


@pytest.mark.slow
@pytest.mark.parametrize("family", _families("velocity_coverage"))
def test_velocity_intervals_cover_truth_on_family(family):
    f = _run(family)
    assert COVERAGE[0] <= f["velocity_coverage"] <= COVERAGE[1], f"{family.name}: {f}"


@pytest.mark.slow
@pytest.mark.parametrize("family", _families("height_coverage"))
def test_height_intervals_cover_truth_on_family(family):
    f = _run(family)
    assert COVERAGE[0] <= f["height_coverage"] <= COVERAGE[1], f"{family.name}: {f}"
