"""Arc estimation with the periodogram: known arc differences recovered within the noise."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from depsi.processing.arcs import estimate_arcs
from depsi.processing.network import form_network
from depsi.stm.schema import STMValidationError, years_since_mother
from scenes import PS_NOISE, predicted_arc_std, simulated_points


def test_estimate_arcs_recovers_known_differences_within_noise():
    points, true = simulated_points(aps_std=0.0)
    arcs = estimate_arcs(form_network(points)).compute()
    s, t = arcs.source.values, arcs.target.values
    dv = true.velocity.values[t] - true.velocity.values[s]
    dh = true.height_error.values[t] - true.height_error.values[s]
    sd_v, sd_h = predicted_arc_std(points)  # about 1.2 mm/yr and 1.9 m
    rms_v = np.sqrt(np.mean((arcs.velocity.values - dv) ** 2))
    rms_h = np.sqrt(np.mean((arcs.height_error.values - dh) ** 2))
    # measured (seed 1): 1.1 mm/yr, 2.1 m; allow 1.5x the noise-derived std
    assert rms_v <= 1.5 * sd_v
    assert rms_h <= 1.5 * sd_h
    # expected ensemble coherence exp(-sigma^2 / 2) with sigma = sqrt(2) * 0.3: 0.91
    assert np.median(arcs.temporal_coherence.values) == pytest.approx(np.exp(-PS_NOISE**2),
                                                                      abs=0.05)


def test_ambiguities_unwrap_the_arc_phase_to_the_model():
    points, true = simulated_points(aps_std=0.0)
    arcs = estimate_arcs(form_network(points)).compute()
    unwrapped = arcs.phase.values + 2 * np.pi * arcs.ambiguity.values
    m2ph = -4 * np.pi / points.attrs["wavelength"]
    years = years_since_mother(points)
    model = m2ph * (arcs.velocity.values[:, None] * years + arcs.h2ph.values
                    * arcs.height_error.values[:, None])
    residual = unwrapped - model
    residual -= residual.mean(axis=1, keepdims=True)
    assert np.abs(residual).max() < np.pi + 1.0


def test_estimate_arcs_is_lazy_over_arc_chunks():
    points, _ = simulated_points(aps_std=0.0)
    arcs = form_network(points).chunk({"arc": 200})
    est = estimate_arcs(arcs)
    assert est.velocity.chunks is not None and len(est.velocity.chunks[0]) > 1
    assert est.ambiguity.dtype == np.int32 and est.ambiguity.dims == ("arc", "time")


def test_constant_h2ph_is_flagged_not_silent_when_height_is_asked_for():
    points, _ = simulated_points(aps_std=0.0)
    points["h2ph"] = points.h2ph * 0
    est = estimate_arcs(form_network(points), height=True).compute()
    # height is not identifiable: NaN estimates and a nonzero flag, no garbage
    assert (est.flag.values != 0).all()
    assert np.isnan(est.height_error.values).all()
    assert est.ambiguity.dtype == np.int32


def test_zero_h2ph_gives_velocity_only_arcs_by_default():
    points, true = simulated_points(aps_std=0.0, height_error_std=0.0)
    points["h2ph"] = points.h2ph * 0
    arcs = estimate_arcs(form_network(points)).compute()
    assert arcs.attrs["height_estimated"] == 0
    assert (arcs.height_error.values == 0).all() and (arcs.flag.values == 0).all()
    dv = true.velocity.values[arcs.target.values] - true.velocity.values[arcs.source.values]
    years = years_since_mother(points)
    sd_v = np.sqrt(2) * PS_NOISE / (4 * np.pi / points.attrs["wavelength"]
                                    * np.sqrt(np.sum((years - years.mean()) ** 2)))
    assert np.sqrt(np.mean((arcs.velocity.values - dv) ** 2)) <= 1.5 * sd_v
    assert not np.isnan(arcs.temporal_coherence.values).any()


def test_mother_epoch_with_zero_h2ph_is_handled():
    points, _ = simulated_points(aps_std=0.0)
    mother = int(np.flatnonzero(points.time.values
                                == np.datetime64(points.attrs["mother_time"]))[0])
    assert (points.h2ph.values[:, mother] == 0).all()  # the mother column is exactly zero
    est = estimate_arcs(form_network(points)).compute()
    assert est.attrs["height_estimated"] == 1
    assert (est.flag.values == 0).mean() > 0.99
    assert np.isfinite(est.height_error.values[est.flag.values == 0]).all()


def test_time_without_dates_is_a_clear_error():
    points, _ = simulated_points(aps_std=0.0)
    points = points.assign_coords(time=np.arange(points.sizes["time"]))
    with pytest.raises(STMValidationError, match="time.*datetime64.*assign"):
        estimate_arcs(form_network(points))


def test_real_stm_runs_with_plausible_coherence_and_no_nan(realdata):
    """DePSI's real sparse STM (156 multi-looked points, 10 epochs, Amsterdam): no dates, no
    wavelength, no h2ph in the store. Assigned explicitly here: Sentinel-1 C band (0.0555 m),
    11-day spacing, h2ph zero (so velocity-only arcs)."""
    from depsi.io import open_stm
    from depsi.processing.integration import integrate_network
    from depsi.processing.interferogram import single_mother_interferograms

    stm = open_stm(realdata / "depsi_stm_sparse" / "stm_sparse.zarr").compute()
    stm = stm.assign_coords(time=np.datetime64("2016-03-27", "ns")
                            + stm.time.values * np.timedelta64(11, "D"))
    stm = stm.assign(h2ph=xr.zeros_like(stm.amplitude))
    stm.attrs["wavelength"] = 0.0555
    points = single_mother_interferograms(stm.drop_vars("phase"))
    arcs = estimate_arcs(form_network(points, method="redundant")).compute()
    coherence = arcs.temporal_coherence.values
    # measured: 1346 arcs, coherence 5/50/95 % = 0.43 / 0.85 / 0.96; random phases give
    # 0.21 / 0.40 / 0.62 for 10 epochs, so most arcs are far above noise
    assert not np.isnan(coherence).any() and not np.isnan(arcs.velocity.values).any()
    assert np.median(coherence) > 0.7 and np.percentile(coherence, 95) <= 1.0
    assert np.median(np.abs(arcs.velocity.values)) < 0.03
    result = integrate_network(points, arcs)
    keep = result.in_network.values
    assert keep.mean() > 0.9
    assert np.isfinite(result.velocity.values[keep]).all()
    assert np.isfinite(result.displacement.values[keep]).all()
