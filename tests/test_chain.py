"""The chain in one call, on a simulated stack with truth."""

from __future__ import annotations

import numpy as np
import pytest

from depsi import run_ps_chain
from scenes import predicted_arc_std, simulated_points


def _errors(result, true):
    """Estimate minus truth, the truth taken on the chain's datum: its mean over the
    reference area."""
    idx, area = result.point_index.values, result.in_reference_area.values
    assert area[np.flatnonzero(idx == result.attrs["reference"])[0]]
    assert area.sum() == result.attrs["n_reference_area"]

    def relative(name):
        values = true[name].values[idx]
        return values - values[area].mean(axis=0)

    return (result.velocity.values - relative("velocity"),
            result.height_error.values - relative("height_error"),
            result.displacement.values - relative("displacement"))


def test_chain_without_atmosphere_matches_truth_within_noise():
    points, true = simulated_points(aps_std=0.0)
    result = run_ps_chain(points, network={"first_order": 150})
    v, h, d = _errors(result, true)
    sd_v, sd_h = predicted_arc_std(points)
    # measured (seed 1, reference area = all 150 first-order points): 0.80 mm/yr, 1.5 m,
    # 1.8 mm (0.93 mm/yr, 1.5 m, 2.0 mm relative to the reference point); all 309 PS kept
    assert result.sizes["space"] >= 0.95 * points.sizes["space"]
    assert np.sqrt(np.mean(v**2)) <= 1.2 * sd_v
    assert np.sqrt(np.mean(h**2)) <= 1.5 * sd_h
    assert np.sqrt(np.mean(d**2)) <= 1.5 * np.sqrt(2) * 0.3 * 0.0556 / (4 * np.pi)
    for name in ("velocity", "height_error", "displacement", "temporal_coherence", "aps"):
        assert not np.isnan(result[name].values).any(), name
    assert set(np.unique(result.order.values)) == {1, 2}


def test_chain_with_atmosphere_keeps_points_and_stays_close():
    points, true = simulated_points(aps_std=0.3)
    result = run_ps_chain(points, network={"first_order": 150})
    v, h, _ = _errors(result, true)
    # measured (seed 1): v 1.2 mm/yr, H 1.9 m on the reference-area datum (2.9 m relative to
    # the reference point alone, whose own atmosphere offset every point); the screen is rough
    # at PS spacing
    assert result.sizes["space"] >= 0.95 * points.sizes["space"]
    assert np.sqrt(np.mean(v**2)) <= 2e-3
    assert np.std(h) <= 3.0
    assert not np.isnan(result.velocity.values).any()


def test_chain_forms_interferograms_from_complex():
    points, true = simulated_points(aps_std=0.0)
    # the SLCs alone, with their own h2ph (minus the interferograms', zero at the mother)
    slcs = points.drop_vars("phase").assign(h2ph=-points["h2ph"])
    result = run_ps_chain(slcs, network={"first_order": 150}, atmosphere={"method": "none"})
    v, _, _ = _errors(result, true)
    assert np.sqrt(np.mean(v**2)) <= 1.2 * predicted_arc_std(points)[0]


def test_reference_outside_first_order_is_rejected():
    points, _ = simulated_points(aps_std=0.0)
    worst = int(np.argmax(points.amplitude_dispersion.values))
    with pytest.raises(ValueError, match="reference"):
        run_ps_chain(points, network={"first_order": 10}, integration={"reference": worst})


def test_too_few_first_order_points_is_a_clear_error():
    points, _ = simulated_points(aps_std=0.0)
    with pytest.raises(ValueError, match="first_order"):
        run_ps_chain(points, network={"first_order": 2})


def test_chain_forms_interferograms_from_selection_output():
    """``ps_selection`` returns SLC ``complex`` and the SLC ``phase``; the chain must not take
    that phase for an interferogram."""
    points, true = simulated_points(aps_std=0.0)
    # as selection gives them: the SLCs, their phase and their own h2ph, no interferogram
    slc = points.assign(phase=(points.phase.dims, np.angle(points.complex.values)
                               .astype(np.float32)), h2ph=-points["h2ph"])
    slc.attrs = {k: v for k, v in points.attrs.items() if k != "interferogram"}
    result = run_ps_chain(slc, network={"first_order": 150},
                           atmosphere={"method": "none"})
    v, _, _ = _errors(result, true)
    assert np.sqrt(np.mean(v**2)) <= 1.2 * predicted_arc_std(points)[0]


def test_chain_leaves_its_input_and_its_attrs_untouched():
    import xarray as xr

    points, _ = simulated_points(aps_std=0.5)
    before = points.copy(deep=True)
    attrs = dict(points.attrs)
    result = run_ps_chain(points, network={"first_order": 150})
    xr.testing.assert_identical(points, before)
    assert points.attrs == attrs
    # the reference is an index into the input, among the kept points
    assert result.attrs["reference"] in set(result["point_index"].values.tolist())
