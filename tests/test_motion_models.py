"""The chain's temporal model terms: regressors, the temperature file,
the model choice's false-alarm rate and power, and the periodogram's search of the terms."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from pydantic import ValidationError
from scipy import stats

from depsi.conventions import phase_per_metre
from depsi.processing.arcs import estimate_arcs
from depsi.processing.motion_models import (
    ModelConfig,
    candidates,
    fit_models,
    read_temperature,
    temporal_model,
)

WAVELENGTH = 0.0555
TIME = np.datetime64("2021-01-05", "ns") + np.arange(60) * np.timedelta64(12, "D")
YEARS = (TIME - TIME[30]) / np.timedelta64(1, "D") / 365.25


def _temperature_file(tmp_path, time=TIME, values=None):
    values = 10 + 10 * np.cos(2 * np.pi * np.arange(len(time)) * 12 / 365.25) \
        if values is None else values
    path = tmp_path / "temperature.csv"
    path.write_text("date,temperature\n" + "".join(
        f"{str(t)[:10]},{v}\n" for t, v in zip(time, values)))
    return path


@pytest.mark.parametrize("section, words", [
    ({"terms": ["thermal"]}, "needs temperature"),
    ({"terms": ["step"]}, "needs step_dates"),
    ({"terms": ["breakpoint"]}, "needs breakpoint_dates"),
    ({"terms": ["seasonal"], "arcs": ["thermal"]}, "among model.terms"),
    ({"terms": ["seasonal", "seasonal"]}, "each term once"),
    ({"terms": ["step"], "step_dates": ["2021-13-01"]}, "YYYY-MM-DD"),
    ({"terms": ["seasonal"], "seasonal_range": [0.02, -0.02]}, "seasonal_range"),
])
def test_model_section_refuses_what_cannot_be_fitted(section, words):
    with pytest.raises(ValidationError, match=words):
        ModelConfig(**section)


def test_regressors_follow_the_calendar_and_the_dates(tmp_path):
    config = ModelConfig(terms=["seasonal", "semi_annual", "thermal", "step", "breakpoint"],
                         temperature=_temperature_file(tmp_path), step_dates=["2021-06-01"],
                         breakpoint_dates=["2021-09-01"])
    model = temporal_model(config, TIME)
    assert model.columns == ("seasonal_sin", "seasonal_cos", "semi_annual_sin",
                             "semi_annual_cos", "thermal", "step_20210601",
                             "breakpoint_20210901")
    # the annual phase counts from 1 January of the first epoch's year, not from the mother
    day = (TIME - np.datetime64("2021-01-01")) / np.timedelta64(1, "D")
    np.testing.assert_allclose(model.regressors["seasonal_cos"],
                               np.cos(2 * np.pi * day / 365.25), atol=1e-12)
    np.testing.assert_allclose(model.regressors["semi_annual_sin"],
                               np.sin(4 * np.pi * day / 365.25), atol=1e-12)
    assert abs(model.regressors["thermal"].mean()) < 1e-12  # centred on the epochs' mean
    step = model.regressors["step_20210601"]
    assert step[TIME < np.datetime64("2021-06-01")].max() == 0 and step[-1] == 1
    brk = model.regressors["breakpoint_20210901"]
    later = TIME >= np.datetime64("2021-09-01")
    assert (brk[~later] == 0).all()
    np.testing.assert_allclose(np.diff(brk[later]), 12 / 365.25)
    assert set(model.search(["seasonal"], WAVELENGTH)) == {"seasonal_sin", "seasonal_cos"}


def test_a_term_that_does_not_vary_is_refused():
    with pytest.raises(ValueError, match="does not vary"):
        temporal_model(ModelConfig(terms=["step"], step_dates=["2030-01-01"]), TIME)


def test_temperature_file_is_checked_before_use(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.temperature"):
        read_temperature(tmp_path / "missing.csv", TIME)
    short = _temperature_file(tmp_path, TIME[:-2], np.zeros(58))
    with pytest.raises(ValueError, match=r"no temperature for 2 epoch\(s\).*2022-12-"):
        read_temperature(short, TIME)
    bad = tmp_path / "bad.csv"
    bad.write_text("date,temperature\n2021-01-05,warm\n")
    with pytest.raises(ValueError, match="line 2"):
        read_temperature(bad, TIME)
    columns = tmp_path / "columns.csv"
    columns.write_text("day,temp\n2021-01-05,3\n")
    with pytest.raises(ValueError, match="expected columns 'date' and 'temperature'"):
        read_temperature(columns, TIME)
    twice = tmp_path / "twice.csv"
    twice.write_text("date,temperature\n2021-01-05,3\n2021-01-05,4\n")
    with pytest.raises(ValueError, match="twice"):
        read_temperature(twice, TIME)


def test_candidates_are_every_combination():
    model = temporal_model(ModelConfig(terms=["seasonal", "step", "breakpoint"],
                                       step_dates=["2021-06-01"],
                                       breakpoint_dates=["2021-09-01"]), TIME)
    names, masks = candidates(model)
    assert len(names) == 8 and names[0] == "linear" and names[-1] == "seasonal+step+breakpoint"
    assert masks.shape == (8, 4) and not masks[0].any() and masks[-1].all()
    full_names, full = candidates(model, "full")
    assert full_names == ("seasonal+step+breakpoint",) and full.all()


def _series(rng, n, model, coefficients=None, noise=0.003):
    h2ph = np.tile(rng.normal(0.0, 1.5e-4, len(TIME)), (n, 1))
    y = (rng.normal(0, 0.01, n)[:, None] * YEARS + h2ph * rng.normal(0, 10, n)[:, None]
         + rng.normal(0, noise, (n, len(TIME))))
    for name, values in (coefficients or {}).items():
        y += values[:, None] * model.regressors[name][None, :]
    return y, h2ph


@pytest.mark.parametrize("alpha", [0.005, 0.05])
def test_model_choice_false_alarm_rate_is_alpha(alpha):
    """Linear series with white noise: each F test keeps its term with probability alpha. With
    one term the kept fraction is binomial(n, alpha): asserted within 4.5 of its std."""
    rng = np.random.default_rng(3)
    model = temporal_model(ModelConfig(terms=["seasonal"]), TIME)
    n = 20000
    y, h2ph = _series(rng, n, model)
    fit = fit_models(y, h2ph, YEARS, model, alpha=alpha)
    kept = float(np.mean(fit.choice != 0))
    assert abs(kept - alpha) <= 4.5 * np.sqrt(alpha * (1 - alpha) / n), kept
    # the linear points' coefficients of the term are 0: the model they keep has none
    assert (fit.coefficients["seasonal_sin"][fit.choice == 0] == 0).all()


def test_model_choice_power_matches_the_noncentral_f():
    """Series with a seasonal term of known size: the fraction kept is the power of the F test
    at its noncentrality (within 4.5 binomial stds), and the coefficients are unbiased."""
    rng = np.random.default_rng(4)
    model = temporal_model(ModelConfig(terms=["seasonal"]), TIME)
    n, noise, amplitude, alpha = 6000, 0.003, 0.0012, 0.005
    coefficients = {"seasonal_sin": np.full(n, amplitude), "seasonal_cos": np.zeros(n)}
    y, h2ph = _series(rng, n, model, coefficients, noise)
    fit = fit_models(y, h2ph, YEARS, model, alpha=alpha)
    design = np.column_stack([YEARS, h2ph[0], np.ones(len(TIME)),
                              model.regressors["seasonal_sin"], model.regressors["seasonal_cos"]])
    beta = np.array([0, 0, 0, amplitude, 0])
    # noncentrality: the term's signal left after projecting out the linear model, over sigma^2
    linear = design[:, :3]
    signal = design @ beta
    left = signal - linear @ np.linalg.lstsq(linear, signal, rcond=None)[0]
    dof = len(TIME) - 5
    power = stats.ncf.sf(stats.f.ppf(1 - alpha, 2, dof), 2, dof, left @ left / noise**2)
    kept = float(np.mean(fit.choice == 1))
    assert abs(kept - power) <= 4.5 * np.sqrt(power * (1 - power) / n), (kept, power)
    full = fit_models(y, h2ph, YEARS, model, choice="full")
    assert abs(full.coefficients["seasonal_sin"].mean() - amplitude) < 5 * noise / np.sqrt(n)


def test_model_choice_picks_the_right_term():
    rng = np.random.default_rng(5)
    model = temporal_model(ModelConfig(terms=["seasonal", "step"],
                                       step_dates=["2021-09-01"]), TIME)
    n = 300
    coefficients = {"seasonal_sin": np.r_[np.full(100, 0.008), np.zeros(200)],
                    "seasonal_cos": np.zeros(n),
                    "step_20210901": np.r_[np.zeros(100), np.full(100, 0.01), np.zeros(100)]}
    y, h2ph = _series(rng, n, model, coefficients, 0.002)
    fit = fit_models(y, h2ph, YEARS, model)
    names = np.array(fit.names)[fit.choice]
    assert (names[:100] == "seasonal").mean() > 0.97
    assert (names[100:200] == "step").mean() > 0.97
    assert (names[200:] == "linear").mean() > 0.95
    # each step's std from its own model's design, the noise put in: within 4.5 of it
    design = np.column_stack([YEARS, h2ph[0], np.ones(len(TIME)),
                              model.regressors["step_20210901"]])
    std = 0.002 * np.sqrt(np.linalg.inv(design.T @ design)[3, 3])
    np.testing.assert_allclose(fit.coefficients["step_20210901"][100:200], 0.01, atol=4.5 * std)


def _arcs(rng, n, model):
    m2ph = phase_per_metre(WAVELENGTH)
    h2ph = np.tile(rng.normal(0.0, 1.5e-4, len(TIME)), (n, 1))
    truth = {"velocity": rng.uniform(-0.01, 0.01, n), "height_error": rng.uniform(-20, 20, n),
             "seasonal_sin": rng.uniform(-0.015, 0.015, n),
             "seasonal_cos": rng.uniform(-0.015, 0.015, n)}
    unwrapped = m2ph * (truth["velocity"][:, None] * YEARS
                        + h2ph * truth["height_error"][:, None]
                        + truth["seasonal_sin"][:, None] * model.regressors["seasonal_sin"]
                        + truth["seasonal_cos"][:, None] * model.regressors["seasonal_cos"])
    unwrapped += rng.normal(0, 0.5, unwrapped.shape)
    arcs = xr.Dataset(
        {"phase": (("arc", "time"), np.angle(np.exp(1j * unwrapped)).astype(np.float32)),
         "h2ph": (("arc", "time"), h2ph.astype(np.float32))},
        coords={"time": TIME, "source": ("arc", np.zeros(n, np.int64)),
                "target": ("arc", np.arange(1, n + 1))},
        attrs={"wavelength": WAVELENGTH, "mother_time": str(TIME[30])})
    return arcs, unwrapped, truth


def test_arcs_search_the_terms_where_an_unmodelled_one_costs_cycles():
    """Arcs with seasonal differences up to 15 mm (3.4 rad): the linear search gets cycles
    wrong, the search with the seasonal terms gets none, and recovers each difference."""
    rng = np.random.default_rng(6)
    model = temporal_model(ModelConfig(terms=["seasonal"]), TIME)
    arcs, unwrapped, truth = _arcs(rng, 400, model)

    def wrong(estimated):
        found = arcs["phase"].values + 2 * np.pi * estimated["ambiguity"].values
        off = np.rint(((found - unwrapped) - (found - unwrapped)[:, :1]) / (2 * np.pi))
        return int((off != 0).any(axis=1).sum())

    linear = estimate_arcs(arcs).compute()
    searched = estimate_arcs(arcs, extra_regressors=model.search(None, WAVELENGTH)).compute()
    assert wrong(searched) == 0 and wrong(linear) > 40
    assert searched.attrs["extra_terms"] == ["seasonal_sin", "seasonal_cos"]
    error = searched["seasonal_sin"].values - truth["seasonal_sin"]
    assert np.sqrt(np.mean(error**2)) < 0.5 / abs(phase_per_metre(WAVELENGTH)) * np.sqrt(2 / 60) * 2
    with pytest.raises(ValueError, match="needs h2ph that varies"):
        estimate_arcs(arcs.assign(h2ph=xr.zeros_like(arcs["h2ph"])),
                      extra_regressors=model.search(None, WAVELENGTH))


@pytest.mark.slow
def test_depsi_run_with_a_model_section_exports_the_terms(tmp_path):
    """``depsi run`` from a configuration with a ``model:`` section gives what run_ps_chain
    gives, and the CSV carries each point's model and its terms with their stds; a new alpha
    redoes the model step alone."""
    import json

    import pandas as pd

    from depsi.io import open_stm
    from depsi.pipeline import parse_config, run_pipeline
    from depsi.pipeline.chain import run_ps_chain

    model = {"terms": ["seasonal", "step"], "step_dates": ["2020-06-01"],
             "arcs": ["seasonal"], "densification": ["seasonal"]}
    data = {"input": {"simulate": {"shape": [96, 96], "n_epochs": 40, "seed": 2,
                                   "ps_fraction": 0.05}},
            "network": {"first_order": 200}, "model": model,
            "output": {"workspace": str(tmp_path / "ws"), "exports": ["csv"]},
            "compute": {"scheduler": "threads", "threads": 2}}
    config = parse_config(json.loads(json.dumps(data)))
    run_pipeline(config, progress=False)
    got = open_stm(tmp_path / "ws" / "stm.zarr").compute()
    expected = run_ps_chain(open_stm(tmp_path / "ws" / "ps.zarr"), config.chain())
    got = got.isel(space=np.argsort(got["point_index"].values))
    expected = expected.isel(space=np.argsort(expected["point_index"].values))
    for name in ("velocity", "height_error", "seasonal_sin", "seasonal_cos", "step_20200601",
                 "seasonal_sin_std", "step_20200601_std", "model_choice", "velocity_std"):
        np.testing.assert_array_equal(got[name].values, expected[name].values, err_msg=name)
    assert got.attrs["model_names"] == ["linear", "seasonal", "step", "seasonal+step"]
    assert got["step_20200601"].attrs["units"] == "m"
    table = pd.read_csv(next((tmp_path / "ws").rglob("*.csv")))
    for column in ("model", "seasonal_sin", "seasonal_sin_std", "seasonal_cos_std",
                   "step_20200601", "step_20200601_std"):
        assert column in table.columns, column
    assert set(table["model"]) <= set(got.attrs["model_names"])
    assert np.isfinite(table["seasonal_sin_std"]).all() and (table["seasonal_sin_std"] > 0).all()

    data["model"] = {**model, "alpha": 0.05}
    summary = run_pipeline(parse_config(json.loads(json.dumps(data))), resume=True,
                           progress=False)
    ran = [name for name, record in summary.steps.items() if record.status == "ran"]
    assert ran == ["model", "export"], summary.format()


def test_a_model_the_epochs_cannot_carry_is_refused_before_any_arc(tmp_path, monkeypatch):
    """A temperature file without some epochs, or a step after the last epoch: refused by the
    chain's first step (naming the file or term), before any arc is estimated."""
    from depsi.pipeline.chain import run_ps_chain
    from depsi.processing import integration
    from depsi.processing.selection import ps_selection
    from depsi.simulate import simulate_stack

    stack, _ = simulate_stack(shape=(40, 40), n_epochs=12, seed=3)
    ps = ps_selection(stack).compute()
    estimated = []
    monkeypatch.setattr(integration, "estimate_arcs",
                        lambda *a, **k: estimated.append(1) or pytest.fail("arcs estimated"))
    short = _temperature_file(tmp_path, stack["time"].values[:-1], np.zeros(11))
    with pytest.raises(ValueError, match=r"model.temperature: no temperature for 1 epoch"):
        run_ps_chain(ps, model={"terms": ["thermal"], "temperature": str(short)})
    with pytest.raises(ValueError, match="'step'.*does not vary"):
        run_ps_chain(ps, model={"terms": ["step"], "step_dates": ["2030-01-01"]})
    assert not estimated
