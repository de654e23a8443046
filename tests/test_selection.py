"""Amplitude statistics, PS selection (both engines) and incremental epochs."""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from depsi.io.store import open_stm, save_stm
from depsi.kernels import statistics_numba
from depsi.kernels.statistics import amplitude_sums, moments_from_sums, nad_screen
from depsi.processing.network import worker_threads
from depsi.processing.selection import (
    amplitude_statistics,
    ps_selection,
    resolve_engine,
    update_selection,
)
from depsi.simulate import simulate_stack
from depsi.stm.order import morton_order
from depsi.stm.schema import STMValidationError

TIME = np.datetime64("2021-01-01", "ns") + np.arange(24) * np.timedelta64(6, "D")


def _raster(slc: np.ndarray, *, chunks=None, h2ph=None) -> xr.Dataset:
    n_az, n_rg, n_t = slc.shape
    rng = np.random.default_rng(7)
    data = {"complex": (("azimuth", "range", "time"),
                        da.from_array(slc, chunks=chunks) if chunks else slc)}
    data["h2ph"] = (("azimuth", "range", "time"),
                    h2ph if h2ph is not None else rng.normal(0, 1e-4, slc.shape).astype("f4"))
    return xr.Dataset(data, coords={
        "azimuth": np.arange(n_az) + 100, "range": np.arange(n_rg) + 50, "time": TIME[:n_t],
        "lat": (("azimuth", "range"), rng.uniform(52, 53, (n_az, n_rg))),
        "lon": (("azimuth", "range"), rng.uniform(4, 5, (n_az, n_rg)))},
        attrs={"wavelength": 0.0555, "mother_time": str(TIME[n_t // 2])})


@pytest.fixture(scope="module")
def small_stack() -> xr.Dataset:
    """24 x 30 pixels, 24 epochs: Rayleigh clutter, 40 bright stable pixels, NaN and zero pixels."""
    rng = np.random.default_rng(3)
    shape = (24, 30, 24)
    amplitude = rng.rayleigh(1.0, shape).astype(np.float32)
    bright = rng.choice(shape[0] * shape[1], 40, replace=False)
    az, rg = np.unravel_index(bright, shape[:2])
    amplitude[az, rg] = rng.normal(10, 1.5, (40, shape[2]))
    slc = (amplitude * np.exp(1j * rng.uniform(-np.pi, np.pi, shape))).astype(np.complex64)
    slc[0, 0] = np.nan                      # all epochs missing
    slc[1, 1] = 0                           # zero amplitude (no data)
    slc[az[0], rg[0], 3:6] = np.nan         # a bright pixel with missing epochs
    slc[5, 7, ::2] = np.nan
    return _raster(slc)


@pytest.fixture(scope="module")
def simulated():
    stack, truth = simulate_stack(shape=(200, 200), n_epochs=30, seed=0)
    return stack.persist(), truth["ps_mask"].values


# --------------------------------------------------------------------------------------------
# amplitude statistics


def test_statistics_equal_numpy_on_the_finite_epochs(small_stack):
    stats = amplitude_statistics(small_stack.chunk(azimuth=10, range=12)).compute()
    amplitude = np.abs(small_stack["complex"].values).astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's own all-NaN slices
        mean = np.nanmean(amplitude, axis=-1)
        std = np.nanstd(amplitude, axis=-1)
    amplitude32 = amplitude.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(amplitude32, axis=-1)
        mad = np.nanmedian(np.abs(amplitude32 - median[..., None]), axis=-1)
    usable = np.isfinite(mean) & (mean > 0)
    # float32 outputs of float64 accumulations: equal to float32 round-off
    np.testing.assert_allclose(stats.amplitude_mean.values[usable], mean[usable], rtol=1e-6)
    np.testing.assert_allclose(stats.amplitude_std.values[usable], std[usable], rtol=2e-6)
    np.testing.assert_allclose(stats.amplitude_dispersion.values[usable],
                               (std / np.where(usable, mean, 1))[usable], rtol=2e-6)
    # median and MAD are order statistics of the float32 amplitudes: exact
    np.testing.assert_array_equal(stats.amplitude_median.values[usable], median[usable])
    np.testing.assert_array_equal(stats.amplitude_mad.values[usable], mad[usable])
    np.testing.assert_array_equal(stats.amplitude_dispersion_mad.values[usable],
                                  (mad / np.where(usable, median, 1))[usable])
    np.testing.assert_array_equal(stats.amp_count.values,
                                  np.isfinite(amplitude).sum(axis=-1))


def test_statistics_unusable_pixels_are_nan_without_warning(small_stack):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = amplitude_statistics(small_stack).compute()
    for name in ("amplitude_dispersion", "amplitude_dispersion_mad"):
        assert np.isnan(stats[name].values[0, 0]) and np.isnan(stats[name].values[1, 1])
    assert stats.amp_count.values[0, 0] == 0 and stats.amplitude_mean.values[1, 1] == 0
    assert np.isfinite(stats.amplitude_dispersion.values[2:, 2:]).all()


def test_statistics_are_lazy_and_read_each_chunk_once(small_stack):
    reads = []

    def source(block, block_info=None):
        reads.append(block_info[0]["chunk-location"])
        return block

    slc = da.map_blocks(source, da.from_array(small_stack["complex"].values, chunks=(8, 10, -1)),
                        meta=np.empty((0, 0, 0), np.complex64))
    stack = small_stack.assign(complex=(("azimuth", "range", "time"), slc))
    stats = amplitude_statistics(stack)
    assert all(isinstance(var.data, da.Array) for var in stats.data_vars.values())
    assert reads == []
    stats.compute()
    assert sorted(reads) == sorted({tuple(r) for r in reads}) and len(reads) == 3 * 3


def test_statistics_time_window_uses_only_its_epochs(small_stack):
    window = (TIME[4], TIME[11])
    stats = amplitude_statistics(small_stack, time_window=window).compute()
    part = amplitude_statistics(small_stack.isel(time=slice(4, 12))).compute()
    xr.testing.assert_identical(stats, part)
    assert stats.attrs["statistics_epochs"] == 8


def test_amplitude_sums_of_time_pieces_equal_the_joined_epochs_bit_for_bit(small_stack):
    """A block read one time chunk at a time gives the sums of the joined block, exactly; a
    pixel with a missing epoch in any piece is counted and summed without it."""
    slc = small_stack["complex"].values
    pieces = [slc[..., :5], slc[..., 5:6], slc[..., 6:17], slc[..., 17:]]
    joined = amplitude_sums(slc)
    for sums in (amplitude_sums(pieces), amplitude_sums([np.abs(p) for p in pieces])):
        for got, expected in zip(sums, joined):
            np.testing.assert_array_equal(got, expected)
    amplitude = np.abs(slc).astype(np.float64)
    finite = np.isfinite(amplitude)
    np.testing.assert_array_equal(joined[0], finite.sum(axis=-1))
    np.testing.assert_array_equal(joined[1], np.where(finite, amplitude, 0).sum(axis=-1))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("n_epochs", [3, 24, 300])
def test_nad_screen_never_drops_a_pixel_the_exact_nad_selects(n_epochs, compiled, monkeypatch):
    """Pixels around the threshold to a few float32 ulps, among clutter: every pixel whose
    exact float32 NAD is below the threshold stays for the exact computation, and clearly
    dispersed pixels are screened out; with the screen's sums compiled and in NumPy."""
    assert statistics_numba.ready()  # the tests compile Numba's kernels (tests/conftest.py)
    if not compiled:
        monkeypatch.setattr(statistics_numba, "ready", lambda: False)
    rng = np.random.default_rng(n_epochs)
    threshold = 0.25
    sign = np.where(np.arange(n_epochs) % 2, -1.0, 1.0)
    if n_epochs % 2:
        sign[-1] = 0.0
    spread = threshold * (1 + np.linspace(-3e-6, 3e-6, 2001))  # NAD of +-spread about 1
    scale = np.sqrt(n_epochs / max((sign != 0).sum(), 1))
    edge = 1 + np.outer(spread * scale, sign) * rng.choice([1, -1], (spread.size, 1))
    edge *= rng.uniform(0.5, 200, (spread.size, 1))
    clutter = rng.rayleigh(1.0, (3000, n_epochs))
    amplitude = np.concatenate([edge, clutter]).astype(np.float32)
    phase = rng.uniform(-np.pi, np.pi, amplitude.shape)
    slc = (amplitude * np.exp(1j * phase)).astype(np.complex64)
    nad = moments_from_sums(*amplitude_sums(slc))[2].astype(np.float32)
    selected = nad < threshold
    kept = nad_screen(slc, threshold)
    assert 0 < selected.sum() < edge.shape[0]  # the edge really straddles the threshold
    assert kept[selected].all()
    pieces = [slc[:, :n_epochs // 3], slc[:, n_epochs // 3:]]
    assert nad_screen(pieces, threshold)[selected].all()
    clutter_kept = kept[edge.shape[0]:].mean()
    assert clutter_kept < 0.05 or n_epochs < 10  # NAD about 0.52 once there are epochs enough


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**32 - 1), st.floats(-15, 15))
def test_compiled_screen_sums_stay_within_the_bound_the_screen_assumes(n_epochs, seed, power):
    """Each sum of :func:`statistics_numba.screen_sums` is that of ``np.abs``'s amplitudes
    (and their squares), summed exactly, to ``g + TERM_ERROR u`` relatively, whatever the
    magnitudes (1e-15 to 1e15: squares in float32's normal range; smaller sums are never
    trusted by the screen) and the number of epochs."""
    rng = np.random.default_rng(seed)
    scale = np.float32(10.0 ** (power * rng.uniform(0, 1, (64, 1))))
    slc = (rng.normal(size=(64, n_epochs)) + 1j * rng.normal(size=(64, n_epochs))) * scale
    slc = slc.astype(np.complex64)
    amplitude = np.abs(slc).astype(np.float64)
    assert np.isfinite(amplitude).all()
    exact, exact_sq = amplitude.sum(axis=1), np.square(amplitude).sum(axis=1)
    total, total_sq = statistics_numba.screen_sums([slc[:, :n_epochs // 2],
                                                    slc[:, n_epochs // 2:]])
    u = 2.0 ** -24
    g = n_epochs * u / (1 - n_epochs * u)
    bound = g + statistics_numba.TERM_ERROR * u * (1 + g)
    assert np.all(np.abs(total - exact) <= bound * exact)
    assert np.all(np.abs(total_sq - exact_sq) <= bound * exact_sq)


def test_nad_screen_keeps_missing_zero_and_tiny_pixels_for_the_exact_statistics():
    slc = np.full((5, 8), 3 + 4j, np.complex64)
    slc[:, ::2] = 30
    slc[0, 3] = np.nan
    slc[1, 5] = np.inf
    slc[2] = 0
    slc[3] *= np.float32(1e-30)  # squares below the float32 normal range
    assert nad_screen(slc, 0.25).tolist() == [True, True, True, True, False]
    assert nad_screen(slc.astype(np.complex128), 0.25).all()  # not screened: exact for all


# --------------------------------------------------------------------------------------------
# ps_selection


def test_ps_selection_recovers_simulated_ps(simulated):
    stack, truth = simulated
    ps = ps_selection(stack, method="nad", threshold=0.25)
    selected = np.zeros_like(truth)
    selected[ps["azimuth"].values, ps["range"].values] = True
    hits = (selected & truth).sum()
    precision, recall = hits / selected.sum(), hits / truth.sum()
    # seed 0, 200 x 200 x 30: 798 simulated PS, 796 selected, all true: precision 1.000,
    # recall 0.997 (simulated PS NAD 0.1-0.2, clutter 0.52)
    assert precision >= 0.95 and recall >= 0.95, (precision, recall)


def test_ps_selection_nmad_selects_on_the_nmad_statistic(small_stack):
    ps = ps_selection(small_stack, method="nmad", threshold=0.12).compute()
    nmad = amplitude_statistics(small_stack).amplitude_dispersion_mad.values
    az, rg = np.nonzero(nmad < 0.12)
    assert set(zip(ps["azimuth"].values - 100, ps["range"].values - 50)) == set(zip(az, rg))
    np.testing.assert_array_equal(
        ps["amplitude_dispersion"].values,
        nmad[ps["azimuth"].values - 100, ps["range"].values - 50])
    assert ps.attrs["selection_variable"] == "amplitude_dispersion_mad"


@pytest.mark.parametrize("method", ["nad", "nmad"])
def test_engines_give_identical_results(small_stack, method):
    lazy = ps_selection(small_stack.chunk(azimuth=10, range=16), method=method, threshold=0.25)
    streamed = ps_selection(small_stack, method=method, threshold=0.25, engine="stream",
                            block_shape=(7, 9), prefetch=1)
    xr.testing.assert_identical(lazy.compute(), streamed)


def test_engines_identical_on_simulated_stack(simulated):
    stack, _ = simulated
    lazy = ps_selection(stack, threshold=0.25).compute()
    streamed = ps_selection(stack, threshold=0.25, engine="stream", block_shape=(64, 96))
    xr.testing.assert_identical(lazy, streamed)
    rechunked = ps_selection(stack.chunk(azimuth=50, range=100), threshold=0.25,
                             engine="stream")
    xr.testing.assert_identical(lazy, rechunked)


@pytest.mark.parametrize("workers", [1, 3])
def test_stream_engine_on_any_number_of_workers_equals_the_dask_engine(small_stack, workers):
    stack = small_stack.chunk(azimuth=7, range=9)
    lazy = ps_selection(stack, threshold=0.25).compute()
    streamed = ps_selection(stack, threshold=0.25, engine="stream", workers=workers)
    xr.testing.assert_identical(lazy, streamed)


def test_stream_engine_threads_follow_the_dask_configuration():
    with dask.config.set(num_workers=3):
        assert worker_threads() == 3
    assert worker_threads() >= 1


@pytest.mark.parametrize("method", ["nad", "nmad"])
def test_stream_engine_on_a_stack_chunked_along_time_equals_the_dask_engine(small_stack,
                                                                           method):
    """Blocks read in time pieces (never joined along time) select exactly the same points
    with the same values, also with a time window that cuts through the pieces."""
    stack = small_stack.chunk(azimuth=10, range=16, time=5)
    for window in (None, (TIME[3], TIME[13])):
        lazy = ps_selection(stack, method=method, threshold=0.25, time_window=window)
        streamed = ps_selection(stack, method=method, threshold=0.25, time_window=window,
                                engine="stream", workers=2)
        xr.testing.assert_identical(lazy.compute(), streamed)


def test_ps_selection_output_content(small_stack):
    ps = ps_selection(small_stack, threshold=0.25).compute()
    assert ps["complex"].dims == ("space", "time") and ps["complex"].dtype == np.complex64
    assert order_is_morton(ps)
    az = ps["azimuth"].values - 100
    rg = ps["range"].values - 50
    np.testing.assert_array_equal(ps["complex"].values, small_stack["complex"].values[az, rg])
    np.testing.assert_array_equal(ps["h2ph"].values, small_stack["h2ph"].values[az, rg])
    np.testing.assert_array_equal(ps["lat"].values, small_stack["lat"].values[az, rg])
    np.testing.assert_array_equal(ps["amplitude"].values, np.abs(ps["complex"].values))
    phase = ps["phase"].values[np.isfinite(ps["phase"].values)]
    assert (phase > -np.pi).all() and (phase <= np.float32(np.pi)).all()
    assert (ps["amplitude_dispersion"].values < 0.25).all() and ps["selected"].values.all()
    assert ps.attrs["n_selected"] == ps.sizes["space"] == 40
    assert ps.attrs["n_excluded"] == 2 and ps.attrs["wavelength"] == 0.0555
    assert ps.attrs["selection_method"] == "nad" and ps.attrs["selection_threshold"] == 0.25


def order_is_morton(ps: xr.Dataset) -> bool:
    order = morton_order(ps["azimuth"].values, ps["range"].values)
    return bool((order == np.arange(order.size)).all())


def test_ps_selection_dask_engine_is_lazy(small_stack):
    ps = ps_selection(small_stack.chunk(azimuth=12, range=15), threshold=0.25, engine="dask")
    for name in ("complex", "amplitude", "phase", "h2ph", "amplitude_dispersion", "amp_sum"):
        assert isinstance(ps[name].data, da.Array), name
    assert isinstance(ps["azimuth"].data, np.ndarray)


def test_dask_engine_reads_complex_once_to_select_and_h2ph_only_when_computed(small_stack):
    reads = []

    def source(name):
        def read(block, block_info=None):
            reads.append(name)
            return block
        values = small_stack[name].values
        return da.map_blocks(read, da.from_array(values, chunks=(12, 15, -1)),
                             meta=np.empty((0, 0, 0), values.dtype))

    stack = small_stack.assign(complex=(small_stack["complex"].dims, source("complex")),
                               h2ph=(small_stack["h2ph"].dims, source("h2ph")))
    ps = ps_selection(stack, engine="dask")
    assert sorted(reads) == ["complex"] * 4
    ps["h2ph"].compute()
    assert reads.count("h2ph") == 4


def test_auto_engine_streams_when_every_pixel_fits_and_records_the_choice(small_stack):
    auto = ps_selection(small_stack, threshold=0.25)
    assert auto.attrs["selection_engine"] == "stream"
    assert not any(isinstance(v.data, da.Array) for v in auto.data_vars.values())
    dask_engine = ps_selection(small_stack, threshold=0.25, engine="dask").compute()
    assert dask_engine.attrs["selection_engine"] == "dask"
    xr.testing.assert_identical(auto.drop_attrs(), dask_engine.drop_attrs())


def test_auto_engine_builds_the_lazy_graph_when_the_worst_case_would_not_fit(small_stack,
                                                                             monkeypatch):
    import depsi.kernels.backend as backend

    # the stream engine's worst case: every pixel's complex, amplitude, phase and h2ph
    worst = 24 * 30 * 24 * (8 + 8 + 4)
    assert small_stack["complex"].shape == (24, 30, 24)
    monkeypatch.setattr(backend, "available_host_memory", lambda: int(2 * worst) + 2)
    assert resolve_engine(small_stack)[0] == "stream"
    monkeypatch.setattr(backend, "available_host_memory", lambda: int(2 * worst) - 2)
    engine, why = resolve_engine(small_stack)
    assert engine == "dask" and "would not fit" in why
    ps = ps_selection(small_stack.chunk(azimuth=12, range=15), threshold=0.25)
    assert ps.attrs["selection_engine"] == "dask" and isinstance(ps["phase"].data, da.Array)


def test_auto_engine_leaves_the_reading_to_a_distributed_client(small_stack):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster):
        assert resolve_engine(small_stack) == ("dask", "a distributed client is active")
    assert resolve_engine(small_stack)[0] == "stream"


def test_ps_selection_keeps_all_epochs_with_a_time_window(small_stack):
    ps = ps_selection(small_stack, threshold=0.25, time_window=(None, TIME[11])).compute()
    assert ps.sizes["time"] == 24 and (ps["amp_count"].values <= 12).all()
    assert ps.attrs["statistics_end"] == str(TIME[11])


def test_ps_selection_no_division_warning(small_stack):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ps_selection(small_stack, threshold=0.25, engine="stream").sizes["space"]
        ps_selection(small_stack, method="nmad", threshold=0.25).compute()


def _exploding_stack(small_stack: xr.Dataset, name: str) -> xr.Dataset:
    def explode(block):
        raise RuntimeError(f"{name} was read")

    values = small_stack[name]
    data = da.map_blocks(explode, da.from_array(values.values, chunks=(12, 15, -1)),
                         meta=np.empty((0, 0, 0), values.dtype))
    return small_stack.assign({name: (values.dims, data)})


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "psc"}, "method"),
    ({"engine": "spark"}, "engine"),
    ({"threshold": 0}, "threshold"),
    ({"threshold": -0.1}, "threshold"),
    ({"threshold": float("nan")}, "threshold"),
    ({"prefetch": 0}, "prefetch"),
    ({"workers": 0}, "workers"),
    ({"time_window": ("2030-01-01", None)}, "time_window"),
])
def test_bad_arguments_fail_before_reading(small_stack, kwargs, match):
    stack = _exploding_stack(small_stack, "complex")
    with pytest.raises(ValueError, match=match):
        ps_selection(stack, **kwargs)


def test_missing_or_mistyped_complex_is_refused(small_stack):
    with pytest.raises(STMValidationError, match="'complex'"):
        ps_selection(small_stack.drop_vars("complex"))
    real = small_stack.assign(complex=abs(small_stack["complex"]))
    with pytest.raises(STMValidationError, match="complex dtype"):
        ps_selection(real)
    with pytest.raises(STMValidationError, match="'complex'.*dims"):
        ps_selection(small_stack.assign(complex=small_stack["complex"].isel(time=0)))


def test_failed_selection_leaves_no_partial_store(small_stack, tmp_path):
    ps = ps_selection(_exploding_stack(small_stack, "h2ph"), threshold=0.25, engine="dask")
    with pytest.raises(RuntimeError, match="h2ph was read"):
        save_stm(ps, tmp_path / "ps.zarr")
    # only the writer's lock file may stay (depsi.io.lock)
    assert [p for p in tmp_path.iterdir() if not p.name.endswith("-lock")] == []


# --------------------------------------------------------------------------------------------
# update_selection


def test_update_selection_equals_full_recompute(simulated, tmp_path):
    stack, _ = simulated
    path = save_stm(ps_selection(stack.isel(time=slice(0, 27)), threshold=0.25),
                    tmp_path / "ps.zarr")
    update_selection(path, stack.isel(time=slice(27, 29)))
    updated = update_selection(path, stack.isel(time=[29]), threshold=0.2).compute()

    at = {"azimuth": xr.DataArray(updated["azimuth"].values, dims="space"),
          "range": xr.DataArray(updated["range"].values, dims="space")}
    full = amplitude_statistics(stack).isel(at).compute()
    np.testing.assert_array_max_ulp(updated["amplitude_dispersion"].values,
                                    full["amplitude_dispersion"].values, maxulp=2)
    np.testing.assert_array_equal(updated["amp_count"].values, 30)
    np.testing.assert_allclose(updated["amp_sumsq"].values, full["amp_sumsq"].values, rtol=1e-12)
    np.testing.assert_array_equal(updated["selected"].values,
                                  updated["amplitude_dispersion"].values < 0.2)
    assert 0 < updated["selected"].sum() < updated.sizes["space"]
    points = stack.isel(at).transpose("space", "time")
    np.testing.assert_array_equal(updated["complex"].values, points["complex"].values)
    np.testing.assert_array_equal(updated["h2ph"].values, points["h2ph"].values)
    assert updated.sizes["time"] == 30 and updated.attrs["statistics_epochs"] == 30
    assert updated.attrs["n_selected"] == int(updated["selected"].sum())


def test_update_selection_accepts_point_values(small_stack, tmp_path):
    path = save_stm(ps_selection(small_stack.isel(time=slice(0, 20))), tmp_path / "ps.zarr")
    stored = open_stm(path)
    at = {"azimuth": xr.DataArray(stored["azimuth"].values, dims="space"),
          "range": xr.DataArray(stored["range"].values, dims="space")}
    new = small_stack[["complex", "h2ph"]].isel(time=slice(20, 24)).sel(at)
    updated = update_selection(path, new.transpose("space", "time").drop_vars(["lat", "lon"]))
    full = amplitude_statistics(small_stack).sel(at).compute()
    np.testing.assert_array_max_ulp(updated["amplitude_dispersion"].values,
                                    full["amplitude_dispersion"].values, maxulp=2)
    assert updated.sizes["time"] == 24


def test_update_selection_with_bad_epochs_changes_nothing(small_stack, tmp_path):
    path = save_stm(ps_selection(small_stack.isel(time=slice(0, 20))), tmp_path / "ps.zarr")
    before = open_stm(path).compute()
    with pytest.raises(STMValidationError, match="after the last stored epoch"):
        update_selection(path, small_stack.isel(time=[19, 20]))
    with pytest.raises(STMValidationError, match="h2ph"):
        update_selection(path, small_stack.isel(time=[20]).drop_vars("h2ph"))
    xr.testing.assert_identical(open_stm(path).compute(), before)


def test_update_selection_refuses_nmad(small_stack, tmp_path):
    nad_path = save_stm(ps_selection(small_stack.isel(time=slice(0, 20)), threshold=0.25),
                        tmp_path / "nad.zarr")
    with pytest.raises(ValueError, match="NMAD needs the median of the full"):
        update_selection(nad_path, small_stack.isel(time=[20]), method="nmad")
    nmad_path = save_stm(ps_selection(small_stack.isel(time=slice(0, 20)), method="nmad",
                                      threshold=0.25), tmp_path / "nmad.zarr")
    with pytest.raises(ValueError, match="NMAD needs the full history"):
        update_selection(nmad_path, small_stack.isel(time=[20]))
    assert open_stm(nmad_path).sizes["time"] == 20


def test_update_selection_refuses_a_gap_after_the_time_window(small_stack, tmp_path):
    ps = ps_selection(small_stack.isel(time=slice(0, 20)), threshold=0.25,
                      time_window=(None, TIME[15]))
    path = save_stm(ps, tmp_path / "ps.zarr")
    with pytest.raises(ValueError, match="running sums end at"):
        update_selection(path, small_stack.isel(time=[20]))
    assert open_stm(path).sizes["time"] == 20


def test_empty_selection_is_a_valid_empty_stm(small_stack, tmp_path):
    lazy = ps_selection(small_stack.chunk(azimuth=12, range=15), threshold=1e-6)
    streamed = ps_selection(small_stack, threshold=1e-6, engine="stream")
    assert lazy.sizes["space"] == 0 and lazy.attrs["n_selected"] == 0
    xr.testing.assert_identical(lazy.compute(), streamed)
    assert open_stm(save_stm(streamed, tmp_path / "empty.zarr")).sizes["space"] == 0


def test_phase_selection_keeps_the_coherent_patch_and_leaves_the_clutter():
    """Selection on the phase similarity to the neighbours: decorrelated clutter (20 epochs of
    independent phases: similarity about 0.35, at most 0.69 here) stays out at the default
    threshold 0.75; at 0.6 most of what is chosen lies in the coherent DS patch (measured
    88 %, 106 of its 571 pixels)."""
    from depsi.processing.selection import DEFAULT_PHASE_THRESHOLD

    stack, truth = simulate_stack(shape=(60, 60), n_epochs=20, seed=4, ps_fraction=0.01,
                                  ds_regions=1, ds_region_size=24)
    stack, truth = stack.compute(), truth.compute()
    coherent = truth["ds_mask"].values | truth["ps_mask"].values
    strict = ps_selection(stack, method="phase")
    assert strict.attrs["selection_threshold"] == DEFAULT_PHASE_THRESHOLD
    assert coherent[strict["azimuth"].values, strict["range"].values].all()
    loose = ps_selection(stack, method="phase", threshold=0.6)
    inside = truth["ds_mask"].values[loose["azimuth"].values, loose["range"].values]
    assert inside.mean() > 0.8 and inside.sum() > 80
    np.testing.assert_allclose(loose["phase_std"].values,
                               np.sqrt(-np.log(loose["phase_similarity"].values)), rtol=1e-5)
    with pytest.raises(ValueError, match="at most 1"):
        ps_selection(stack, method="phase", threshold=1.5)


def test_amplitude_selection_falls_back_to_the_phase_where_it_passes_most_pixels(caplog):
    """Multilooked amplitudes (stable everywhere): NAD passes nearly every pixel, so the
    selection says so and selects on the phase instead."""
    from depsi.processing.selection import AMPLITUDE_BLIND_MIN_PIXELS

    rng = np.random.default_rng(0)
    shape = (40, 40, 30)
    assert shape[0] * shape[1] >= AMPLITUDE_BLIND_MIN_PIXELS
    amplitude = 10.0 * (1.0 + 0.05 * rng.standard_normal(shape))
    slc = (amplitude * np.exp(1j * rng.uniform(-np.pi, np.pi, shape))).astype(np.complex64)
    stack = xr.Dataset({"complex": (("azimuth", "range", "time"), slc)},
                       coords={"azimuth": np.arange(shape[0]), "range": np.arange(shape[1]),
                               "time": np.datetime64("2020-01-01", "ns")
                               + np.arange(shape[2]) * np.timedelta64(12, "D")},
                       attrs={"wavelength": 0.0555})
    with caplog.at_level("WARNING"):
        ps = ps_selection(stack)
    assert "selecting on the phase similarity" in caplog.text
    assert ps.attrs["selection_method"] == "phase"
    assert ps.attrs["selection_instead_of"] == "nad"
    assert ps.sizes["space"] == 0      # random phases everywhere: nothing is stable
