"""Results in memory carry the units a saved store has: the readers, ps_selection,
every step of the chain, run_ps_chain and estimate_model hand back the CF attributes of one
table (``depsi.io.cf.CF``), the one save_stm writes, so the two cannot diverge."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
import xarray as xr

from depsi.io import from_binary, open_slc_zarr, save_stm
from depsi.io.cf import CF, with_cf_attributes
from depsi.pipeline.chain import run_ps_chain
from depsi.pipeline.chain_config import chain_config
from depsi.pipeline.steps import CHAIN_STEPS, run_step
from depsi.pipeline.steps.arcs import estimated_arcs
from depsi.pipeline.steps.selection import prepare_points
from depsi.processing.model_fit import estimate_model
from depsi.processing.selection import ps_selection
from depsi.simulate import simulate_stack, write_stack_zarr

STEPS = CHAIN_STEPS


def _attrs(ds: xr.Dataset) -> dict:
    return {name: dict(var.attrs) for name, var in ds.variables.items()}


def _without_units(ds: xr.Dataset) -> list[str]:
    """Variables and coordinates with no ``units``; datetimes (CF-encoded) and strings aside."""
    return sorted(str(name) for name, var in ds.variables.items()
                  if var.dtype.kind not in "mMUSO" and not var.attrs.get("units"))


@pytest.fixture(scope="module")
def stack():
    stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=1)
    return stack


@pytest.fixture(scope="module")
def candidates(stack):
    return ps_selection(stack).compute()


@pytest.fixture(scope="module")
def chain_run(candidates):
    """One run of the chain: the input's attributes before it, and the result."""
    before = _attrs(candidates)
    return before, run_ps_chain(candidates)


@pytest.fixture(scope="module")
def result(chain_run):
    return chain_run[1]


@pytest.fixture(scope="module")
def steps(candidates):
    """Each step's product, the steps run one by one with the default configuration."""
    config = chain_config()
    points = prepare_points(candidates)
    out = {"network": run_step("network", config, selection=points)}
    out["arcs"] = estimated_arcs(out["network"], config)  # the arc STM, computed
    out["integration"] = run_step("integration", config, network=out["network"],
                                  arcs=out["arcs"])
    out["atmosphere"] = run_step("atmosphere", config, network=out["network"],
                                 integration=out["integration"])
    out["densification"] = run_step("densification", config, selection=points,
                                    atmosphere=out["atmosphere"])
    out["model"] = run_step("model", config, selection=points, atmosphere=out["atmosphere"],
                            densification=out["densification"])
    return out


def test_every_variable_and_coordinate_of_a_chain_result_has_units(result):
    assert _without_units(result) == []
    assert "units" not in result["time"].attrs  # CF-encoded on save ("days since ...")


def test_chain_result_attributes_are_the_tables_or_the_inputs_own(result, stack):
    """No variable carries another's attributes (e.g. ``aps`` those of ``unwrapped_phase``)."""
    for name, var in result.variables.items():
        if name not in CF:
            continue
        want = {**CF[name], **(stack[name].attrs if name in stack.variables else {})}
        assert {key: var.attrs.get(key) for key in want} == want, name


def test_velocity_plot_labels_its_axis_with_the_unit(result):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        lines = result.velocity.plot()
        label = " ".join(lines[0].axes.get_ylabel().split())  # xarray wraps long labels
    finally:
        plt.close("all")
    assert label == "line-of-sight velocity [m year-1]"


@pytest.mark.parametrize("step", STEPS)
def test_each_step_hands_back_units(steps, step):
    assert _without_units(steps[step]) == []


def test_estimate_model_hands_back_units(result):
    fit = estimate_model(result, terms=("offset", "velocity", "seasonal"), devices=["cpu"])
    assert _without_units(fit) == []
    assert fit["residual"].attrs["units"] == "m"
    assert fit["sigma2"].attrs["units"] == "m2"  # unit weights: a variance in metres


def test_estimate_model_variance_factor_is_dimensionless_with_weights(result):
    weights = xr.ones_like(result["displacement"]) * 1e6  # (1 mm)^-2
    fit = estimate_model(result.assign(w=weights), weights="w", devices=["cpu"])
    assert fit["sigma2"].attrs["units"] == "1"


def test_ps_selection_hands_back_units(candidates):
    assert _without_units(candidates) == []
    assert candidates["phase"].attrs["units"] == "rad"


def test_from_binary_stack_has_units_and_stays_lazy(tmp_path):
    rng = np.random.default_rng(0)
    files = []
    for k in range(2):
        values = (rng.normal(size=(8, 6)) + 1j * rng.normal(size=(8, 6))).astype(np.complex64)
        files.append(tmp_path / f"slc_{k}.raw")
        values.tofile(files[-1])
    ds = from_binary(files, (8, 6), dates=["2020-01-01", "2020-01-13"], wavelength=0.0555)
    assert _without_units(ds) == []
    assert ds["azimuth"].attrs["units"] == "1" and ds["complex"].attrs["units"] == "1"
    assert isinstance(ds["complex"].data, da.Array)


def test_open_slc_zarr_stack_has_units(tmp_path):
    path = write_stack_zarr(tmp_path / "stack.zarr", shape=(16, 16), n_epochs=4, seed=0,
                            progress=False)
    ds = open_slc_zarr(path)
    assert _without_units(ds) == []
    assert ds["lat"].attrs["units"] == "degrees_north"


def test_the_chain_leaves_its_inputs_attributes_untouched(chain_run, candidates):
    before, _ = chain_run
    assert _attrs(candidates) == before


def test_with_cf_attributes_never_mutates_its_input(result):
    bare = result.copy()
    for var in bare.variables.values():
        var.attrs = {}
    bare["time"].attrs = {"units": "days since 2020-01-01"}  # as some products give it
    attrs, encoding = _attrs(bare), {n: dict(v.encoding) for n, v in bare.variables.items()}
    out = with_cf_attributes(bare)
    assert _attrs(bare) == attrs
    assert {n: dict(v.encoding) for n, v in bare.variables.items()} == encoding
    assert out["velocity"].attrs["units"] == "m year-1"
    assert "units" not in out["time"].attrs and out["time"].encoding["units"] == \
        "days since 2020-01-01"


def test_a_saved_result_opens_in_plain_xarray_without_warnings_with_the_same_units(
        result, tmp_path):
    path = save_stm(result, tmp_path / "stm.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = xr.open_zarr(path)
    assert _without_units(opened) == []
    assert {name: var.attrs.get("units") for name, var in opened.variables.items()} == \
        {name: var.attrs.get("units") for name, var in result.variables.items()}


def test_time_units_given_as_an_attribute_do_not_break_a_save(result, tmp_path):
    given = result.copy()
    given["time"].attrs = {"units": "days since 2020-01-01", "calendar": "standard"}
    path = save_stm(given, tmp_path / "stm.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opened = xr.open_zarr(path)
    np.testing.assert_array_equal(opened["time"].values, result["time"].values)


def test_decomposition_accepts_the_chains_velocity_units():
    from depsi.processing.decomposition import VELOCITY_UNITS

    assert CF["velocity"]["units"] in VELOCITY_UNITS
