"""The stack simulator: determinism, chunk independence, conventions, statistics, writers."""

from __future__ import annotations

import re

import numpy as np
import pytest
import xarray as xr

from depsi.simulate import (
    INCIDENCE_CENTRE_DEG,
    RAYLEIGH_NAD,
    SLANT_RANGE_CENTRE,
    TILE_SIZE,
    simulate_stack,
    write_stack_binary,
    write_stack_zarr,
)
from depsi.stm import validate

SMALL = {"shape": (64, 64), "n_epochs": 12, "seed": 7}


@pytest.fixture(scope="module")
def small():
    """A 64 x 64 x 12 stack with many PS, computed once: (stack, truth)."""
    stack, truth = simulate_stack(**SMALL, ps_fraction=0.2)
    return stack.compute(), truth.compute()


def _interferogram_residual(stack: xr.Dataset, truth: xr.Dataset) -> np.ndarray:
    """wrap(single-mother interferogram - truth model) on PS pixels, (n_ps, time)."""
    mother = int(np.flatnonzero(stack.time.values == np.datetime64(stack.attrs["mother_time"]))[0])
    slc = stack["complex"].values
    ifg = slc[..., mother:mother + 1] * np.conj(slc)  # the chain's: slc_mother * conj(slc)
    displacement = truth["displacement"].values.astype(np.float64)
    m2ph = -4 * np.pi / stack.attrs["wavelength"]
    # the stack's h2ph is SNAP's per SLC (zero at the mother); the interferogram's is minus it
    model = m2ph * (displacement - displacement[..., mother:mother + 1]
                    - stack["h2ph"].values * truth["height_error"].values[..., None])
    model = model + truth["aps"].values
    ps = truth["ps_mask"].values
    return np.angle(ifg[ps] * np.exp(-1j * model[ps])), mother


def test_same_seed_gives_identical_stack():
    first = [ds.compute() for ds in simulate_stack(**SMALL)]
    second = [ds.compute() for ds in simulate_stack(**SMALL)]
    xr.testing.assert_identical(first[0], second[0])
    xr.testing.assert_identical(first[1], second[1])


def test_different_seed_gives_different_stack():
    stack_a, truth_a = simulate_stack(**SMALL)
    stack_b, truth_b = simulate_stack(**{**SMALL, "seed": SMALL["seed"] + 1})
    assert not np.array_equal(stack_a["complex"].values, stack_b["complex"].values)
    assert not np.array_equal(truth_a["aps"].values, truth_b["aps"].values)
    assert not np.array_equal(stack_a["bperp"].values, stack_b["bperp"].values)


def test_values_do_not_depend_on_chunking_across_tiles():
    # larger than one internal tile, with chunks that cut through tiles
    kwargs = {"shape": (TILE_SIZE + 44, TILE_SIZE + 20), "n_epochs": 3, "seed": 3}
    whole = [ds.compute() for ds in simulate_stack(**kwargs, chunks=(300, 300))]
    cut = simulate_stack(**kwargs, chunks={"azimuth": 100, "range": 170})
    assert cut[0]["complex"].data.numblocks == (3, 2, 1)
    for reference, chunked in zip(whole, cut):
        xr.testing.assert_identical(reference, chunked.compute())


def test_stack_is_lazy_with_time_in_one_chunk():
    stack, truth = simulate_stack(shape=(40, 30), n_epochs=5, chunks=(16, 20))
    for ds in (stack, truth):
        for name, var in ds.data_vars.items():
            assert var.chunks is not None, name
            if "time" in var.dims:
                assert var.chunks[var.dims.index("time")] == (5,), name
    assert stack["complex"].chunks[:2] == ((16, 16, 8), (20, 10))


def test_stack_follows_raster_conventions(small):
    stack, truth = small
    validate(stack, kind="raster", require=("complex", "h2ph"), require_wavelength=True)
    assert stack["complex"].dims == ("azimuth", "range", "time")
    assert stack["complex"].dtype == np.complex64
    assert stack["h2ph"].dtype == np.float32
    for name in ("azimuth", "range"):
        assert stack[name].dtype == np.int64
        np.testing.assert_array_equal(stack[name], np.arange(64))
    assert stack["time"].dtype == "datetime64[ns]"
    assert (np.diff(stack["time"].values) == np.timedelta64(12, "D")).all()
    assert stack["time"].values[0] == np.datetime64("2020-01-01")
    assert stack["lat"].dims == stack["lon"].dims == ("azimuth", "range")
    assert stack["lat"].dtype == stack["lon"].dtype == np.float64
    assert stack["bperp"].dims == ("time",) and stack["bperp"].dtype == np.float32
    assert stack.attrs["wavelength"] == 0.0556 and stack.attrs["seed"] == 7
    assert np.datetime64(stack.attrs["mother_time"]) == stack["time"].values[6]
    assert "simulate_stack" in stack.attrs["history"]
    assert truth["ps_mask"].dtype == bool
    for name in ("velocity", "height_error", "aps", "displacement", "amplitude_dispersion"):
        assert truth[name].dtype == np.float32, name
    xr.testing.assert_identical(truth["lat"], stack["lat"])


def test_geolocation_is_a_10_m_grid_near_amsterdam(small):
    stack, _ = small
    lat, lon = stack["lat"].values, stack["lon"].values
    assert abs(lat.mean() - 52.37) < 0.05 and abs(lon.mean() - 4.90) < 0.05
    metres_per_degree_lat = 111_250.0
    metres_per_degree_lon = metres_per_degree_lat * np.cos(np.deg2rad(lat.mean()))
    step_azimuth = np.hypot(np.diff(lat, axis=0) * metres_per_degree_lat,
                            np.diff(lon, axis=0) * metres_per_degree_lon)
    step_range = np.hypot(np.diff(lat, axis=1) * metres_per_degree_lat,
                          np.diff(lon, axis=1) * metres_per_degree_lon)
    np.testing.assert_allclose(step_azimuth, 10.0, rtol=0.01)
    np.testing.assert_allclose(step_range, 10.0, rtol=0.01)


def test_ps_fraction_close_to_requested(small):
    _, truth = small
    n = truth["ps_mask"].size
    p = 0.2
    assert abs(float(truth["ps_mask"].mean()) - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_ps_amplitude_stable_and_ds_amplitude_rayleigh(small):
    stack, truth = small
    amplitude = np.abs(stack["complex"].values).astype(np.float64)
    ps = truth["ps_mask"].values
    n_epochs = amplitude.shape[-1]
    # distributed scatterers share one Rayleigh law: pooled std / mean -> sqrt(4/pi - 1);
    # the standard error of a coefficient of variation is below cv / sqrt(n) here
    ds = amplitude[~ps]
    assert abs(ds.std() / ds.mean() - RAYLEIGH_NAD) < 5 * RAYLEIGH_NAD / np.sqrt(ds.size)
    # PS: sample NAD per pixel from n_epochs values has standard error ~ nad / sqrt(2 n)
    expected = truth["amplitude_dispersion"].values[ps]
    assert ((expected >= 0.1) & (expected <= 0.2)).all()
    np.testing.assert_allclose(truth["amplitude_dispersion"].values[~ps], RAYLEIGH_NAD,
                               rtol=1e-6)
    sample = amplitude[ps].std(axis=-1, ddof=1) / amplitude[ps].mean(axis=-1)
    standard_error = expected / np.sqrt(2 * n_epochs)
    assert abs(np.mean(sample - expected)) < 5 * np.sqrt(np.mean(standard_error**2) / ps.sum())
    assert (sample < expected + 6 * standard_error).all()
    assert amplitude[ps].mean() > 2 * ds.mean()


def test_h2ph_is_zero_at_mother_and_matches_geometry(small):
    stack, _ = small
    h2ph = stack["h2ph"].values
    bperp = stack["bperp"].values
    assert (h2ph[..., 6] == 0).all() and bperp[6] == 0
    assert bperp.std() > 20  # random baselines of ~100 m
    # h2ph = -B_perp / (R sin(theta)) (SNAP's sign): ~1.9e-4 for 100 m at 850 km and 39 deg
    factor = -np.delete(h2ph, 6, axis=-1) / np.delete(bperp, 6).astype(np.float64)
    reference = 1.0 / (SLANT_RANGE_CENTRE * np.sin(np.deg2rad(INCIDENCE_CENTRE_DEG)))
    np.testing.assert_allclose(factor, reference, rtol=0.01)
    # it varies smoothly across range (larger range, smaller factor) and not in azimuth
    across = factor[0, :, 0]
    assert (np.diff(across) < 0).all()
    np.testing.assert_allclose(factor[:, :, 0], factor[:1, :, 0].repeat(64, 0), rtol=1e-6)


def test_displacement_is_zero_at_first_epoch_and_follows_velocity(small):
    stack, truth = small
    displacement = truth["displacement"].values
    assert (displacement[..., 0] == 0).all()
    years = (stack["time"].values - stack["time"].values[0]) / np.timedelta64(1, "D") / 365.25
    np.testing.assert_allclose(displacement, truth["velocity"].values[..., None] * years,
                               atol=1e-7)
    velocity = truth["velocity"].values
    assert velocity.min() < -0.005 and np.abs(velocity).max() <= 0.02 + 1e-9


def test_seasonal_term_is_an_annual_sine():
    stack, truth = (ds.compute() for ds in simulate_stack(
        shape=(32, 32), n_epochs=31, seasonal_amplitude=0.004, velocity_max=0.0))
    years = (stack["time"].values - stack["time"].values[0]) / np.timedelta64(1, "D") / 365.25
    expected = truth["seasonal_amplitude"].values[..., None] * np.sin(2 * np.pi * years)
    np.testing.assert_allclose(truth["displacement"].values, expected, atol=1e-7)
    assert 0 < truth["seasonal_amplitude"].values.max() <= 0.004


def test_interferogram_equals_truth_model_without_noise():
    stack, truth = (ds.compute() for ds in simulate_stack(**SMALL, ps_fraction=0.2,
                                                          ps_noise_std=0.0))
    residual, _ = _interferogram_residual(stack, truth)
    assert residual.size > 0
    assert np.abs(residual).max() < 1e-4  # complex64 round-off only


def test_interferogram_residual_has_the_noise_put_in(small):
    stack, truth = small
    residual, mother = _interferogram_residual(stack, truth)
    assert np.abs(residual[:, mother]).max() < 1e-5
    # noise N(0, s) per SLC epoch -> noise_t - noise_mother ~ N(0, s sqrt(2)) off the mother;
    # the mean of squares over P pixels has relative standard error <= sqrt(2 / P)
    sigma = 0.3 * np.sqrt(2)
    off_mother = np.delete(residual, mother, axis=1)
    n_ps = off_mother.shape[0]
    ratio = off_mother.std() / sigma
    assert abs(ratio - 1) < 5 / np.sqrt(2 * n_ps)
    assert np.abs(off_mother).max() < 6 * sigma


def test_aps_is_spatially_correlated_and_zero_at_mother(small):
    _, truth = small
    aps = truth["aps"].values
    assert (aps[..., 6] == 0).all()
    for t in (0, 3, 11):
        screen = aps[..., t]
        assert screen.std() > 0.1
        along = np.corrcoef(screen[:-1].ravel(), screen[1:].ravel())[0, 1]
        across = np.corrcoef(screen[:, :-1].ravel(), screen[:, 1:].ravel())[0, 1]
        assert along > 0.8 and across > 0.8
    # different epochs are independent screens
    assert abs(np.corrcoef(aps[..., 0].ravel(), aps[..., 11].ravel())[0, 1]) < 0.9


def test_invalid_arguments_raise_naming_them():
    with pytest.raises(ValueError, match="mother_index"):
        simulate_stack(shape=(8, 8), n_epochs=4, mother_index=4)
    with pytest.raises(ValueError, match="ps_fraction"):
        simulate_stack(shape=(8, 8), n_epochs=4, ps_fraction=1.5)
    with pytest.raises(ValueError, match="shape"):
        simulate_stack(shape=(8, 0), n_epochs=4)
    with pytest.raises(ValueError, match="chunks"):
        simulate_stack(shape=(8, 8), n_epochs=4, chunks="big")


def test_zarr_round_trip_equals_in_memory_stack(tmp_path):
    kwargs = {"shape": (40, 36), "n_epochs": 6, "seed": 2, "chunks": (16, 20)}
    path = write_stack_zarr(tmp_path / "stack.zarr", progress=False, **kwargs)
    assert path == tmp_path / "stack.zarr"
    assert [p.name for p in tmp_path.iterdir()] == ["stack.zarr"]  # no temporary left
    stack, truth = (ds.compute() for ds in simulate_stack(**kwargs))
    stored = xr.open_zarr(path)
    assert stored["complex"].encoding["chunks"] == (16, 20, 6)
    xr.testing.assert_identical(stored.compute(), stack)
    xr.testing.assert_identical(xr.open_zarr(path, group="truth").compute(), truth)


def test_zarr_refuses_existing_path_and_overwrite_replaces_it(tmp_path):
    path = tmp_path / "stack.zarr"
    write_stack_zarr(path, shape=(8, 8), n_epochs=3, seed=0, progress=False)
    with pytest.raises(FileExistsError, match=re.escape(str(path))):
        write_stack_zarr(path, shape=(8, 8), n_epochs=3, seed=1, progress=False)
    assert xr.open_zarr(path).attrs["seed"] == 0
    write_stack_zarr(path, overwrite=True, shape=(8, 8), n_epochs=3, seed=1, progress=False)
    assert xr.open_zarr(path).attrs["seed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["stack.zarr"]


def test_binary_files_read_back_equal_the_stack(tmp_path):
    kwargs = {"shape": (20, 24), "n_epochs": 4, "seed": 5, "chunks": (8, 24)}
    out = write_stack_binary(tmp_path, progress=False, **kwargs)
    stack, _ = simulate_stack(**kwargs)
    stack = stack.compute()
    assert out["shape"] == (20, 24) and out["wavelength"] == 0.0556
    np.testing.assert_array_equal(out["dates"], stack["time"].values)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "master.res" in names and "slc_20200113.raw" in names
    assert "slave_20200101.res" in names and "ifgs_20200101.res" in names
    assert not [n for n in names if n.endswith(".part")]
    for t in range(4):
        slc = np.fromfile(out["slc_files"][t], dtype="<c8").reshape(20, 24)
        h2ph = np.fromfile(out["h2ph_files"][t], dtype="<f4").reshape(20, 24)
        np.testing.assert_array_equal(slc, stack["complex"].values[..., t])
        np.testing.assert_array_equal(h2ph, stack["h2ph"].values[..., t])
    with pytest.raises(FileExistsError):
        write_stack_binary(tmp_path, progress=False, **kwargs)


def test_binary_metadata_has_the_doris5_fields(tmp_path):
    out = write_stack_binary(tmp_path, shape=(20, 24), n_epochs=3, seed=0, progress=False)
    text = out["res_files"][0].read_text()
    # the fields and layout a DORIS v5 reader (e.g. sarxarray's patterns) looks for
    assert re.search(r"^DVersion:\s+Version \(2015\) \(For TOPSAR\)$", text, re.M)
    wavelength = re.search(r"^Radar_wavelength \(m\):\s+([\d.Ee+-]+)$", text, re.M)
    assert float(wavelength.group(1)) == pytest.approx(0.0556)
    stamp = re.search(r"^First_pixel_azimuth_time \(UTC\):\s+(.+)$", text, re.M).group(1)
    assert stamp == "2020-Jan-01 17:24:30.000000"
    assert re.search(r"^Number_of_lines_original:\s+20$", text, re.M)
    assert re.search(r"^Number_of_pixels_original:\s+24$", text, re.M)
    range_time = re.search(r"^Range_time_to_first_pixel \(2way\) \(ms\):\s+([\d.]+)$", text,
                           re.M)
    assert 5.0 < float(range_time.group(1)) < 6.5
    assert re.search(r"^NUMBER_OF_DATAPOINTS:\s+200$", text, re.M)
    orbit = re.findall(r"^ (\d+)\s+([-+]?\d+\.\d+)\s+([-+]?\d+\.\d+)\s+([-+]?\d+\.\d+)\s*$",
                       text, re.M)
    radius = np.linalg.norm(np.array(orbit, dtype=float)[:, 1:], axis=1)
    assert len(orbit) == 200 and (np.abs(radius - 7.03e6) < 1e5).all()
    assert "*_Start_resample:" in text and "Data_output_file:                           " \
        "slc_20200101.raw" in text
    master = out["res_files"][1].read_text()
    assert master.startswith("=" * 47 + "\nMASTER RESULTFILE:")
    assert "*_Start_resample:" not in master and "*_Start_crop:" in master
    ifgs = out["ifgs_res_files"][0].read_text()
    bperp = re.search(r"^Bperp\s+\[m\]:\s+([-\d.]+)", ifgs, re.M).group(1)
    assert float(bperp) == pytest.approx(float(out["bperp"][0]), abs=0.05)
