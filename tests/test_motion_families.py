"""Motion beyond a straight line through the whole chain: seasonal and
thermal scene families of tests/scenes.py against their matching linear family (the same scene,
screens, noise and heights, without the term) and against the Cramér-Rao bound of each term.

Targets: velocity RMSE within 1.1x the linear family's on the same PS; seasonal and thermal
coefficient RMSE within 1.5x their bound; wrong ambiguities within the Poisson 95 % interval of
the rate the terms' extra unknowns imply (:func:`expected_wrong`); 95 % intervals of the terms
cover 90-98 %. Each family is pooled over 24 scenes: the
velocity ratio varies from 0.98 to 1.14 between scenes, and the target sits just above the
terms' own cost (the seasonal terms inflate the velocity's Cramér-Rao bound 1.09x), so three
scenes (1.108 pooled) or eight (1.070) could not tell the chain's 1.095 from the 1.1 target.
All the module's tests run in one pytest-xdist worker, which runs each chain once.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import norm, poisson

from depsi import run_ps_chain
from depsi.processing.motion_models import ModelConfig, temporal_model
from depsi.processing.selection import ps_selection
from scenes import (
    Family,
    make_scene,
    motion_bounds,
    truth_index,
    write_temperature,
    wrong_ambiguities,
)

logger = logging.getLogger(__name__)

VELOCITY_FACTOR = 1.1
BOUND_FACTOR = 1.5
COVERAGE = (0.90, 0.98)
SEEDS = tuple(range(0, 2400, 100))

pytestmark = pytest.mark.xdist_group("motion_families")

#: A 3 km scene of 60 epochs at 12 days (two years), 1 rad screens over 400 m.
LINEAR = Family("motion", shape=(300, 300), n_epochs=60, revisit_days=12, aps_std=1.0,
                aps_length=400.0, ps_fraction=0.03, noise_std=0.35, h2ph_variation=0.4,
                seed=21)
#: Annual terms of 5-10 mm at any phase, and 0.3 mm/K of either sign over a 20 K swing.
FAMILIES = {
    "seasonal": (replace(LINEAR, seasonal_amplitude=(0.005, 0.010)), ["seasonal"]),
    "thermal": (replace(LINEAR, thermal_coefficient=(0.0003, 0.0003), temperature_range=20.0),
                ["thermal"]),
}


def _rms_about_median(error):
    error = np.asarray(error, dtype=np.float64)
    return float(np.sqrt(np.mean((error - np.median(error)) ** 2)))


@functools.cache
def _chain(family: Family, terms: tuple[str, ...], folder: str):
    stack, truth = make_scene(family)
    ps = ps_selection(stack, method="nad", threshold=0.25).compute()
    model = {"terms": list(terms)}
    if "thermal" in terms:
        model["temperature"] = write_temperature(
            truth, stack["time"].values, f"{folder}/temperature_{family.seed}.csv")
    result = run_ps_chain(ps, model=model) if terms else run_ps_chain(ps)
    idx = truth_index(truth, result["azimuth"].values, result["range"].values)
    coherent = (idx >= 0) & (result["temporal_coherence"].values >= 0.8)
    return result, truth, idx, coherent, temporal_model(ModelConfig(**model), stack["time"].values)


def _scene_figures(family, terms, linear, folder):
    result, truth, idx, coherent, model = _chain(family, tuple(terms), folder)
    base, _, base_idx, base_coherent, _ = _chain(linear, (), folder)
    # velocity on the PS coherent in both runs: the same points, the same screens and noise
    both = np.intersect1d(idx[coherent], base_idx[base_coherent])
    at = {i: k for k, i in enumerate(idx)}
    at_base = {i: k for k, i in enumerate(base_idx)}
    rows = np.array([at[i] for i in both])
    base_rows = np.array([at_base[i] for i in both])
    figures = {
        "velocity": _rms_about_median(result["velocity"].values[rows]
                                      - truth["velocity"][both]),
        "velocity_linear": _rms_about_median(base["velocity"].values[base_rows]
                                             - truth["velocity"][both]),
        "wrong": wrong_ambiguities(result, truth),
        "wrong_linear": wrong_ambiguities(base, truth),
        "points": int((idx >= 0).sum()),
        "points_linear": int((base_idx >= 0).sum()),
        "n": int(len(both)),
        "extra_columns": len(model.columns),
    }
    which = idx[coherent]
    bounds = motion_bounds(truth, which, model.regressors)
    # the velocity's own cost of the further terms, for white errors: the floor it can reach
    figures["velocity_inflation"] = bounds["velocity"] / motion_bounds(truth, which, {})[
        "velocity"]
    for name in ("velocity", "height_error"):
        error = result[name].values[coherent] - truth[name][which]
        inside = np.abs(error - np.median(error)) <= 1.959964 * result[f"{name}_std"].values[
            coherent]
        figures[f"{name}_coverage"] = float(np.mean(inside))
    names = result.attrs["model_names"]
    kept = np.bincount(result["model_choice"].values[coherent], minlength=len(names))
    figures["kept"] = float(kept[1:].sum() / kept.sum())
    for column in model.columns:
        error = result[column].values[coherent] - truth[column][which]
        figures[f"{column}_rmse"] = _rms_about_median(error)
        figures[f"{column}_bound"] = bounds[column]
        inside = np.abs(error - np.median(error)) <= 1.959964 * result[f"{column}_std"].values[
            coherent]
        figures[f"{column}_coverage"] = float(np.mean(inside))
    line = f"{family.name}/{'+'.join(terms)} seed {family.seed}: " + ", ".join(
        f"{k} {v:.3g}" for k, v in figures.items())
    logger.info(line)
    print(line)
    return figures


@functools.cache
def _pooled(name: str, folder: str) -> dict:
    family, terms = FAMILIES[name]
    runs = [_scene_figures(family.with_seed(family.seed + s), terms,
                           LINEAR.with_seed(LINEAR.seed + s), folder) for s in SEEDS]
    pooled = {}
    for key in runs[0]:
        values = np.array([run[key] for run in runs], dtype=np.float64)
        if key in ("wrong", "wrong_linear", "points", "points_linear", "n"):
            pooled[key] = int(values.sum())
        elif key == "extra_columns":
            pooled[key] = int(values[0])
        elif key.endswith(("_coverage", "_inflation")) or key == "kept":
            pooled[key] = float(values.mean())
        else:
            pooled[key] = float(np.sqrt(np.mean(values**2)))
    return pooled


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("motion"))


def expected_wrong(*, wrong_linear: int, points_linear: int, points: int, extra_columns: int,
                   n_epochs: int, noise_std: float) -> float:
    """Wrong-ambiguity PS expected of a family whose arcs estimate ``extra_columns`` more
    unknowns than the linear family's from the same ``n_epochs``.

    No estimator does better in expectation: more unknowns from the same epochs widen the float
    ambiguities' covariance (in the Loewner order), and the integer success rate falls with it
    (Teunissen's integer least squares). The linear family's rate is fitted with a Gaussian tail
    (a PS is wrong when the residual of one of its epochs passes +-pi), and its residual variance
    grown by ``extra_columns / n_epochs`` of an arc's noise variance (``2 noise_std**2``).
    docs/benchmarks.md ("Motion families") traces the wrong PS.
    """
    per_epoch = wrong_linear / (points_linear * n_epochs)
    residual_variance = (np.pi / norm.isf(per_epoch / 2)) ** 2
    grown = residual_variance + extra_columns / n_epochs * 2 * noise_std**2
    return float(points * n_epochs * 2 * norm.sf(np.pi / np.sqrt(grown)))


def test_expected_wrong_grows_with_the_extra_unknowns():
    """The figures of docs/benchmarks.md: 14 wrong PS of the linear family's ~64,600 (a residual
    std of 0.68 rad) grow to 17.0 with the two seasonal columns, 15.4 with the thermal one."""
    common = dict(wrong_linear=14, points_linear=64_594, points=64_594, n_epochs=60,
                  noise_std=LINEAR.noise_std)
    assert expected_wrong(extra_columns=0, **common) == pytest.approx(14.0, rel=1e-9)
    assert expected_wrong(extra_columns=2, **common) == pytest.approx(17.0, abs=0.1)
    assert expected_wrong(extra_columns=1, **common) == pytest.approx(15.4, abs=0.1)
    assert np.pi / norm.isf(14 / (64_594 * 60) / 2) == pytest.approx(0.68, abs=0.005)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_velocity_as_good_as_on_the_linear_family(name, folder):
    f = _pooled(name, folder)
    assert f["n"] > 0.9 * len(SEEDS) * 2700 * 0.9, f
    assert f["velocity"] <= VELOCITY_FACTOR * f["velocity_linear"], (
        f"{name}: velocity {f['velocity'] / f['velocity_linear']:.3f}x the linear family's: {f}")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_velocity_at_the_floor_of_its_model(name, folder):
    """The linear family's velocity (at its no-correction floor) times the terms' inflation
    of the velocity std is the floor of the family's model: within 5 % of it (a term its test
    did not keep leaves its projection in the velocity: at 0.3 mm/K the tests keep the thermal
    term on about 74 % of the points; measured 1.004x on seasonal, 1.033x on thermal over the
    24 scenes)."""
    f = _pooled(name, folder)
    floor = f["velocity_linear"] * f["velocity_inflation"]
    assert f["velocity"] <= 1.05 * floor, (
        f"{name}: velocity {f['velocity'] / floor:.3f}x its model's floor: {f}")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_terms_reach_their_cramer_rao_bound(name, folder):
    f = _pooled(name, folder)
    columns = [key[:-len("_rmse")] for key in f if key.endswith("_rmse")]
    assert columns, f
    for column in columns:
        assert f[f"{column}_rmse"] <= BOUND_FACTOR * f[f"{column}_bound"], (
            f"{name}: {column} {f[f'{column}_rmse'] / f[f'{column}_bound']:.2f}x its bound: {f}")
        assert COVERAGE[0] <= f[f"{column}_coverage"] <= COVERAGE[1], f"{name}: {column}: {f}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_velocity_and_height_intervals_cover_the_truth(name, folder):
    f = _pooled(name, folder)
    for key in ("velocity_coverage", "height_error_coverage"):
        assert COVERAGE[0] <= f[key] <= COVERAGE[1], f"{name}: {key}: {f}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_wrong_ambiguities_at_the_rate_the_extra_unknowns_imply(name, folder):
    """Measured over the 24 scenes: 22 and 17 wrong PS against 17.0 and 15.4 expected (the
    linear family's 14)."""
    f = _pooled(name, folder)
    family, _ = FAMILIES[name]
    expected = expected_wrong(wrong_linear=f["wrong_linear"], points_linear=f["points_linear"],
                              points=f["points"], extra_columns=f["extra_columns"],
                              n_epochs=family.n_epochs, noise_std=family.noise_std)
    low, high = poisson.interval(0.95, expected)
    assert low <= f["wrong"] <= high, (
        f"{name}: {f['wrong']} wrong PS, expected {expected:.1f} (95 %: {low:.0f}-{high:.0f}): "
        f"{f}")


@pytest.mark.slow
def test_points_keep_the_term_they_have(folder):
    """Seasonal amplitudes of 5-10 mm are 5-10 times their std: nearly every point keeps the
    seasonal model. On the linear family the same tests keep it on about alpha of the points."""
    assert _pooled("seasonal", folder)["kept"] >= 0.98
    result, _, _, coherent, _ = _chain(LINEAR, ("seasonal",), folder)
    kept = float(np.mean(result["model_choice"].values[coherent] != 0))
    alpha = result.attrs["model_alpha"]
    n = int(coherent.sum())
    assert kept <= alpha + 4.5 * np.sqrt(alpha * (1 - alpha) / n), kept
