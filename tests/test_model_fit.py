"""estimate_model: lazy, equal to the eager kernel, the same on one device and several, and
bad input refused before any computation."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import depsi.processing.model_fit as model_module
from depsi.conventions import years_since
from depsi.kernels.backend import Device, cupy_available
from depsi.kernels.design_matrices import design_matrix
from depsi.kernels.lstsq import lstsq_batched
from depsi.processing.model_fit import estimate_model
from depsi.stm import STMValidationError

WAVELENGTH = 0.0555


def _stm(n_space=90, n_time=25, chunk=30, seed=30):
    rng = np.random.default_rng(seed)
    time = np.datetime64("2019-01-03", "ns") + np.arange(n_time) * np.timedelta64(12, "D")
    t = years_since(time, time[0])
    h2ph = rng.normal(0, 1.5e-4, (n_space, n_time))
    velocity = rng.uniform(-0.02, 0.02, n_space)
    height = rng.uniform(-20, 20, n_space)
    season = rng.uniform(-0.004, 0.004, n_space)
    noise = rng.normal(0, 0.001, (n_space, n_time))
    d = (0.002 + velocity[:, None] * t + h2ph * height[:, None]
         + season[:, None] * np.sin(2 * np.pi * t) + noise)
    d[rng.random(d.shape) < 0.05] = np.nan
    ds = xr.Dataset(
        {"displacement": (("space", "time"), d.astype("f4")),
         "h2ph": (("space", "time"), h2ph.astype("f4")),
         "quality": (("space", "time"), rng.uniform(0.5, 2, d.shape).astype("f4"))},
        coords={"time": time, "azimuth": ("space", np.arange(n_space)),
                "range": ("space", np.arange(n_space) * 2)},
        attrs={"wavelength": WAVELENGTH},
    )
    truth = {"velocity": velocity, "height_error": height, "seasonal_sin": season}
    lazy = ds.assign({name: var.chunk({"space": chunk}) for name, var in ds.data_vars.items()})
    return lazy, truth


TERMS = ("offset", "velocity", "height_error", "seasonal")


def test_estimate_model_is_lazy_and_equals_the_eager_kernel():
    stm, _ = _stm()
    est = estimate_model(stm, terms=TERMS, weights="quality", devices=["cpu"])
    for name in ("velocity", "velocity_std", "sigma2", "flag", "residual", "temporal_coherence"):
        assert isinstance(est[name].data, da.Array), name
    assert est["residual"].dtype == np.float32 and est["flag"].dtype == np.int8
    A, names = design_matrix(years_since(stm.time.values, stm.time.values[0]), terms=TERMS,
                             h2ph=stm.h2ph.values.astype(np.float64))
    ref = lstsq_batched(A, stm.displacement.values, stm.quality.values)
    computed = est.compute()
    for p, name in enumerate(names):
        np.testing.assert_allclose(computed[name].values, ref.x[:, p], rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(computed[f"{name}_std"].values, ref.std[:, p], rtol=1e-10)
    np.testing.assert_allclose(computed.sigma2.values, ref.sigma2, rtol=1e-10)
    np.testing.assert_array_equal(computed.flag.values, ref.flag)
    np.testing.assert_allclose(computed.residual.values, ref.residuals.astype("f4"), rtol=1e-6)
    assert computed.azimuth.values.tolist() == stm.azimuth.values.tolist()


def test_estimate_model_recovers_the_terms():
    stm, truth = _stm(seed=31)
    est = estimate_model(stm, terms=TERMS, devices=["cpu"]).compute()
    # 1 mm noise over ~24 epochs: velocity std ~ 1e-3 / (0.23 * sqrt(24)) ~ 1 mm/yr, and the
    # reported std says so; errors stay within 5 reported standard deviations
    for name in ("velocity", "height_error", "seasonal_sin"):
        z = (est[name].values - truth[name]) / est[f"{name}_std"].values
        assert np.abs(z).max() < 5, name
    assert est.attrs["model_terms"] == ["offset", "velocity", "height_error", "seasonal_sin",
                                        "seasonal_cos"]


def test_several_devices_give_identical_results_and_are_all_used(monkeypatch):
    stm, _ = _stm()
    used = []
    real = model_module.use_device

    def recording(device):
        used.append(device)
        return real(device)

    monkeypatch.setattr(model_module, "use_device", recording)
    one = estimate_model(stm, terms=TERMS, devices=["cpu:0"]).compute()
    used.clear()
    two = estimate_model(stm, terms=TERMS, devices=["cpu:0", "cpu:1"]).compute()
    assert sorted(set(used)) == [Device("cpu", 0), Device("cpu", 1)]
    for name in one.data_vars:
        np.testing.assert_array_equal(two[name].values, one[name].values, err_msg=name)


def test_numpy_backed_input_gives_lazy_output_too():
    stm, _ = _stm(n_space=10)
    est = estimate_model(stm.compute(), devices=["cpu"])
    assert isinstance(est.velocity.data, da.Array)
    assert est.velocity.compute().shape == (10,)


def test_shared_weights_along_time():
    stm, _ = _stm(n_space=12)
    weights = xr.DataArray(np.linspace(1, 2, stm.sizes["time"]), dims="time")
    a = estimate_model(stm, weights=weights, devices=["cpu"]).compute()
    b = estimate_model(stm.assign(w=stm.quality * 0 + weights.astype("f4")), weights="w",
                       devices=["cpu"]).compute()
    np.testing.assert_allclose(a.velocity.values, b.velocity.values, rtol=1e-6)


@pytest.mark.parametrize(("mutate", "kwargs", "match"), [
    (lambda ds: ds.drop_vars("displacement"), {}, "variable 'displacement'"),
    (lambda ds: ds.drop_vars("h2ph"), {"terms": ("velocity", "height_error")}, "'h2ph'"),
    (lambda ds: ds.rename_dims(space="points"), {}, "dimension 'space'"),
    (lambda ds: ds.assign(displacement=ds.displacement.isel(space=0)), {},
     "variable 'displacement'"),
    (lambda ds: ds.assign(phase=ds.displacement), {"variable": "phase"}, "wrapped phase"),
    (lambda ds: ds.assign_coords(time=np.arange(ds.sizes["time"])), {}, "datetime64"),
])
def test_bad_input_raises_before_any_computation(mutate, kwargs, match):
    stm, _ = _stm(n_space=12)
    with dask.config.set(scheduler=_no_compute):
        with pytest.raises(STMValidationError, match=match):
            estimate_model(mutate(stm), devices=["cpu"], **kwargs)


def _no_compute(*args, **kwargs):
    raise AssertionError("estimate_model computed something before validating")


@pytest.mark.skipif(cupy_available(), reason="needs a machine where CuPy does not work")
def test_cuda_device_without_gpu_raises_before_work():
    stm, _ = _stm(n_space=12)
    with pytest.raises(RuntimeError, match="cupy|CuPy"):
        estimate_model(stm, devices=["cuda:0"])


def test_direct_fit_is_estimate_models_fit():
    """The model step's block fit (matrix products over the shared columns, normal equations
    solved directly) is :func:`estimate_model` with an offset, velocity and height error, on
    points with a missing epoch and a constant ``h2ph`` (collinear with the offset: no fit)
    too."""
    from depsi.conventions import phase_per_metre
    from depsi.processing.model_fit import _direct_fit
    from depsi.stm.schema import years_since_mother

    rng = np.random.default_rng(4)
    n, n_epochs = 300, 40
    time = np.datetime64("2021-01-01", "ns") + np.arange(n_epochs) * np.timedelta64(12, "D")
    unwrapped = rng.normal(0, 1, (n, n_epochs)).astype(np.float32)
    unwrapped[3, 5] = np.nan
    aps = rng.normal(0, 1, (n, n_epochs)).astype(np.float32)
    h2ph = rng.normal(0, 2e-4, (n, n_epochs)).astype(np.float32)
    h2ph[7] = 1e-4
    m2ph = phase_per_metre(0.0555)
    stm = xr.Dataset({"observed": (("space", "time"), (unwrapped.astype(np.float64) + aps)
                                   / m2ph),
                      "h2ph": (("space", "time"), h2ph)},
                     coords={"time": time}, attrs={"mother_time": str(time[4])})
    expected = estimate_model(stm, terms=("offset", "velocity", "height_error"),
                              variable="observed", devices=["cpu"]).compute()
    velocity, height = _direct_fit(unwrapped, aps, h2ph, years=years_since_mother(stm),
                                   m2ph=m2ph)
    assert np.isfinite(velocity[3]) and np.isnan(velocity[7]) and np.isnan(height[7])
    np.testing.assert_allclose(velocity, expected["velocity"].values, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(height, expected["height_error"].values, rtol=1e-9, atol=1e-9)
