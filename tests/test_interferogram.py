"""Single-mother interferograms: mother column, relative h2ph, mother choice, round trip."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from depsi.processing.interferogram import ifg_to_slc, single_mother_interferograms
from depsi.processing.selection import ps_selection
from depsi.simulate import simulate_stack
from depsi.stm.schema import STMValidationError


@pytest.fixture(scope="module")
def ps() -> xr.Dataset:
    stack, _ = simulate_stack(shape=(64, 64), n_epochs=12, seed=2)
    return ps_selection(stack, threshold=0.25, engine="dask")


def test_mother_column_has_zero_phase_and_zero_h2ph(ps):
    ifg = single_mother_interferograms(ps, mother=4).compute()
    mother = ifg.sel(time=ifg.attrs["mother_time"])
    assert (mother["phase"].values == 0).all()
    assert (mother["h2ph"].values == 0).all()
    assert (mother["complex"].values.imag == 0).all()
    np.testing.assert_allclose(mother["amplitude"].values, abs(ps["complex"][:, 4]) ** 2,
                               rtol=1e-6)
    assert ifg.attrs["mother_time"] == str(ps["time"].values[4].astype("datetime64[s]"))


def test_phase_and_h2ph_are_differences_to_the_mother(ps):
    ifg = single_mother_interferograms(ps, mother=4).compute()
    slc = ps.compute()
    # slc_mother * conj(slc): the mother's phase minus each epoch's
    difference = np.angle(slc["complex"].values[:, [4]]) - np.angle(slc["complex"].values)
    wrapped = np.angle(np.exp(1j * difference))
    error = np.angle(np.exp(1j * (ifg["phase"].values - wrapped)))
    assert np.abs(error).max() < 1e-5
    assert (ifg["phase"].values > -np.pi).all() and (ifg["phase"].values <= np.pi + 1e-6).all()
    np.testing.assert_array_equal(ifg["h2ph"].values,
                                  slc["h2ph"].values[:, [4]] - slc["h2ph"].values)


def test_default_mother_is_the_mother_time_attribute(ps):
    ifg = single_mother_interferograms(ps)
    assert ifg.attrs["mother_time"] == ps.attrs["mother_time"]
    no_attr = ps.copy()
    del no_attr.attrs["mother_time"]
    middle = single_mother_interferograms(no_attr)
    assert middle.attrs["mother_time"] == str(ps["time"].values[6].astype("datetime64[s]"))


def test_mother_by_calendar_day(ps):
    day = str(ps["time"].values[3].astype("datetime64[D]"))
    assert single_mother_interferograms(ps, mother=day).attrs["mother_time"].startswith(day)


def test_unknown_mother_date_names_date_and_range(ps):
    with pytest.raises(STMValidationError, match=r"'1999-01-01'.*12 epochs from 2020-01-01"):
        single_mother_interferograms(ps, mother="1999-01-01")
    with pytest.raises(STMValidationError, match=r"epoch index in \[-12, 12\)"):
        single_mother_interferograms(ps, mother=12)
    with pytest.raises(STMValidationError, match="'complex'"):
        single_mother_interferograms(ps.drop_vars("complex"))


def test_interferograms_are_lazy(ps):
    ifg = single_mother_interferograms(ps, mother=2)
    for name in ("complex", "amplitude", "phase", "h2ph"):
        assert isinstance(ifg[name].data, da.Array), name
    assert "amplitude_dispersion" in ifg


def test_ifg_to_slc_round_trip(ps):
    ifg = single_mother_interferograms(ps, mother=7)
    back = ifg_to_slc(ifg, ps).compute()
    slc = ps.compute()
    np.testing.assert_allclose(back["complex"].values, slc["complex"].values, rtol=1e-5)
    np.testing.assert_array_equal(back["complex"].values[:, 7], slc["complex"].values[:, 7])
    np.testing.assert_allclose(back["h2ph"].values, slc["h2ph"].values, atol=1e-9)
    assert back.attrs["mother_time"] == ps.attrs["mother_time"]


def test_ifg_to_slc_zero_mother_gives_nan_without_warning(ps):
    slc = ps.compute()
    mother = slc["complex"].isel(time=5, drop=True).copy()
    mother[0] = 0
    ifg = single_mother_interferograms(slc, mother=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = ifg_to_slc(ifg, mother)
    assert np.isnan(back["complex"].values[0, :5]).all()
    assert "h2ph" not in back


def test_ifg_to_slc_needs_the_mother_time(ps):
    with pytest.raises(STMValidationError, match="mother_time"):
        ifg_to_slc(ps.drop_attrs(), ps)


def test_interferograms_save_and_reopen(ps, tmp_path):
    from depsi.io.store import open_stm, save_stm

    ifg = single_mother_interferograms(ps, mother=3)
    reopened = open_stm(save_stm(ifg, tmp_path / "ifg.zarr"))
    assert reopened.attrs["mother_time"] == ifg.attrs["mother_time"]
    assert (reopened["h2ph"].sel(time=ifg.attrs["mother_time"]).values == 0).all()
