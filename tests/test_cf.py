"""CF-style metadata: units on every variable we write, stores that open in plain xarray."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr

from depsi.io import append_epochs, save_stm
from depsi.io.cf import CF, LOS_SIGN_CONVENTION, with_cf_attributes

RESULT_UNITS = {"velocity": "m year-1", "height_error": "m", "displacement": "m",
                "temporal_coherence": "1", "phase": "rad", "lat": "degrees_north",
                "lon": "degrees_east"}


def _result(n=6, t=4, start="2020-01-01"):
    rng = np.random.default_rng(0)
    time = np.datetime64(start, "ns") + np.arange(t) * np.timedelta64(12, "D")
    return xr.Dataset(
        {"velocity": ("space", rng.normal(size=n).astype("f4")),
         "height_error": ("space", rng.normal(size=n).astype("f4")),
         "temporal_coherence": ("space", rng.random(n).astype("f4")),
         "displacement": (("space", "time"), rng.normal(size=(n, t)).astype("f4")),
         "phase": (("space", "time"), rng.uniform(-3, 3, (n, t)).astype("f4"))},
        coords={"time": time, "azimuth": ("space", np.arange(n)),
                "range": ("space", np.arange(n)[::-1].copy()),
                "lat": ("space", 52 + rng.random(n)), "lon": ("space", 4 + rng.random(n))},
        attrs={"wavelength": 0.0555})


def test_results_get_si_units_and_long_names_without_touching_the_input():
    ds = _result()
    out = with_cf_attributes(ds)
    for name, units in RESULT_UNITS.items():
        assert out[name].attrs["units"] == units
        assert out[name].attrs["long_name"]
        assert "units" not in ds[name].attrs
    assert out.lat.attrs["standard_name"] == "latitude"
    assert out.time.attrs["standard_name"] == "time"
    assert out.velocity.attrs["comment"] == LOS_SIGN_CONVENTION


def test_existing_units_are_kept():
    ds = _result()
    ds["velocity"].attrs["units"] = "mm/yr"
    assert with_cf_attributes(ds).velocity.attrs["units"] == "mm/yr"


def test_a_saved_stm_opens_in_plain_xarray_without_warnings_and_every_number_has_units(
        tmp_path):
    path = save_stm(_result(), tmp_path / "stm.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = xr.open_zarr(path)
    for name, var in opened.variables.items():
        if name == "time":
            assert "units" in var.encoding  # CF time units, e.g. "days since ..."
            continue
        assert var.attrs.get("units"), name
        assert var.attrs.get("long_name"), name
    for name, units in RESULT_UNITS.items():
        assert opened[name].attrs["units"] == units


def test_consolidated_metadata_follows_an_append(tmp_path):
    first = _result()
    path = save_stm(first, tmp_path / "stm.zarr", reorder=False)
    later = _result(start="2020-02-18").drop_vars(["velocity", "height_error",
                                                    "temporal_coherence"])
    later = later.assign_coords(azimuth=first.azimuth, range=first.range)
    append_epochs(path, later.assign(velocity=first.velocity, height_error=first.height_error,
                                     temporal_coherence=first.temporal_coherence))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = xr.open_zarr(path)
    assert opened.sizes["time"] == 8


def test_every_table_entry_has_a_long_name():
    assert all(attrs.get("long_name") for attrs in CF.values())


@pytest.mark.parametrize("name", ["velocity", "displacement"])
def test_line_of_sight_variables_state_the_sign_convention(name):
    assert "positive towards the satellite" in CF[name]["comment"]
