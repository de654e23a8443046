"""Densification: candidates tied to k first-order points, lazy over space chunks."""

from __future__ import annotations

import numpy as np
import pytest

from depsi.kernels.backend import single_threaded_blas
from depsi.processing.arcs import estimate_arcs
from depsi.processing.densification import densify
from depsi.processing.integration import integrate_network
from depsi.processing.network import form_network
from scenes import integrated_result, predicted_arc_std, simulated_points


def _split(aps_std=0.0):
    points, true = simulated_points(aps_std=aps_std)
    first = np.arange(0, points.sizes["space"], 2)
    others = np.arange(1, points.sizes["space"], 2)
    fo = points.isel(space=first)
    result = integrate_network(fo, estimate_arcs(form_network(fo, method="redundant")).compute())
    return points, true, result, first, others


def test_densified_points_are_accurate_within_noise():
    points, true, result, first, others = _split()
    dense = densify(points.isel(space=others), result, k=3).compute()
    ref = first[result.attrs["reference"]]
    ok = dense.accepted.values
    assert ok.mean() > 0.95
    v_err = dense.velocity.values - (true.velocity.values[others] - true.velocity.values[ref])
    h_err = dense.height_error.values - (true.height_error.values[others]
                                         - true.height_error.values[ref])
    sd_v, sd_h = predicted_arc_std(points)
    # measured (seed 1): about 0.9 mm/yr and 1.4 m, averaging 3 arcs
    assert np.sqrt(np.mean(v_err[ok] ** 2)) <= 1.2 * sd_v
    assert np.sqrt(np.mean(h_err[ok] ** 2)) <= 1.5 * sd_h
    assert (dense.n_arcs.values[ok] == 3).all()
    assert not np.isnan(dense.displacement.values[ok]).any()


def test_densify_is_lazy_over_space_chunks():
    points, _, result, _, others = _split()
    dense = densify(points.isel(space=others).chunk({"space": 40}), result)
    assert dense.velocity.chunks is not None and len(dense.velocity.chunks[0]) > 1
    assert dense.accepted.compute().values.dtype == bool


def test_noise_candidates_are_rejected():
    points, _, result, _, others = _split()
    rng = np.random.default_rng(5)
    cand = points.isel(space=others[:40]).copy(deep=True)
    cand["phase"] = (cand.phase.dims, rng.uniform(-np.pi, np.pi, cand.phase.shape)
                     .astype(np.float32))
    dense = densify(cand, result).compute()
    assert dense.accepted.values.mean() < 0.1


def test_bad_k_raises():
    points, _, result, _, others = _split()
    with pytest.raises(ValueError, match="k"):
        densify(points.isel(space=others), result, k=0)


def test_densified_points_follow_the_reference_area_datum():
    """Re-referencing the first-order points to a reference area moves every densified point
    by the same constants: densification is consistent with the datum."""
    from depsi.processing.datum import apply_reference_area

    points, _, result, first, others = _split()
    area = apply_reference_area(result, 300.0)
    assert area.attrs["n_reference_area"] > 5
    cand = points.isel(space=others)
    before = densify(cand, result, k=3).compute()
    after = densify(cand, area, k=3).compute()
    ok = before.accepted.values & after.accepted.values
    assert ok.mean() > 0.95
    keep = result.in_network.values
    for name, atol in (("velocity", 1e-7), ("height_error", 1e-4)):  # float32 rounding
        shift = area[name].values[keep][0] - result[name].values[keep][0]
        np.testing.assert_allclose(after[name].values[ok] - before[name].values[ok], shift,
                                   atol=atol)
    d_phase = (area.unwrapped_phase.values[keep][0] - result.unwrapped_phase.values[keep][0])
    change = after.unwrapped_phase.values[ok] - before.unwrapped_phase.values[ok]
    assert np.abs(change - d_phase[None, :]).max() < 1e-3


@pytest.mark.slow
def test_the_screen_is_factorised_once_for_every_chunk(monkeypatch):
    """Kriging the first-order screen to the candidates: one Cholesky factorisation per call
    of densify, however many space chunks it has."""
    import depsi.processing.atmosphere as atmosphere_module
    from depsi.processing.atmosphere import estimate_atmosphere, interpolate_aps

    points, _, result, _, others = _split(aps_std=1.0)
    with_aps = estimate_atmosphere(result.isel(space=np.flatnonzero(result.in_network.values)),
                                   method="kriging")
    calls = []
    real = atmosphere_module.cho_factor

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(atmosphere_module, "cho_factor", counting)
    candidates = points.isel(space=others).chunk({"space": 25})
    dense = densify(candidates, with_aps)
    assert len(dense.chunks["space"]) >= 4
    dense = dense.compute()
    assert len(calls) == 1
    expected = interpolate_aps(with_aps, candidates).values
    np.testing.assert_allclose(dense.aps.values, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["kriging", "gaussian"])
def test_each_chunk_gets_its_neighbours_only_and_the_result_of_one_chunk(monkeypatch, method):
    """A chunk's task receives the rows of its candidates' nearest first-order points (and
    screen sources), not the whole network: at 10^7 points the whole table and screen were
    1.8 GB in every task. The neighbours are found on the whole network, so the result is
    that of one chunk holding every candidate, and the Gaussian screen that of
    interpolate_aps (same sources, ties included)."""
    import depsi.processing.densification as densification_module
    from depsi.processing.atmosphere import estimate_atmosphere, interpolate_aps

    points, _, result, _, others = _split(aps_std=1.0)
    with_aps = estimate_atmosphere(result.isel(space=np.flatnonzero(result.in_network.values)),
                                   method=method)
    x = points["x"].values[others] if "x" in points else points["range"].values[others]
    candidates = points.isel(space=others[np.argsort(x, kind="stable")])  # compact chunks
    rows = []
    real = densification_module._chunk_payload

    def recording(*args, **kwargs):
        payload = real(*args, **kwargs)
        rows.append((payload["fo_velocity"].size, payload.get("screen_values", ()).__len__()))
        return payload

    monkeypatch.setattr(densification_module, "_chunk_payload", recording)
    with single_threaded_blas():  # as the chain runs it
        chunked = densify(candidates.chunk({"space": 25}), with_aps).compute()
        whole = densify(candidates.chunk({"space": -1}), with_aps).compute()
    n_sources = int(np.isfinite(with_aps.aps_observed.values).all(axis=1).sum())
    n_chunks = len(rows) - 1
    assert n_chunks >= 4
    fo_rows = np.array([r[0] for r in rows[:n_chunks]])
    assert fo_rows.max() < 0.5 * with_aps.sizes["space"]
    if method == "gaussian":
        assert max(r[1] for r in rows[:n_chunks]) < 0.8 * n_sources
        np.testing.assert_array_equal(chunked.aps.values,
                                      interpolate_aps(with_aps, candidates).values)
    for name in chunked.data_vars:  # bit for bit: per candidate, the same arithmetic
        np.testing.assert_array_equal(chunked[name].values, whole[name].values, err_msg=name)


def test_a_neighbours_unwrapping_error_does_not_reach_the_candidates():
    """A first-order point whose unwrapped phase is a whole cycle off at some epochs (an
    unwrapping error) is brought to the nearest neighbour's cycles in every local reference it
    is not the nearest of: those candidates come out as without the error. (A plain mean of
    the three neighbours would move their reference by a third of a cycle at those epochs.)"""
    from scipy.spatial import cKDTree

    from depsi.processing.network import point_positions

    points, _, result, _, others = _split()
    keep = np.flatnonzero(result.in_network.values)
    cand = points.isel(space=others)
    _, idx = cKDTree(point_positions(result)[keep]).query(point_positions(cand), k=3)
    bad = np.bincount(idx[:, 1:].ravel(), minlength=keep.size).argmax()  # most often 2nd/3rd
    touched = (idx[:, 1:] == bad).any(axis=1) & (idx[:, 0] != bad)
    assert touched.sum() >= 3
    broken = result.copy(deep=True)
    unwrapped = broken["unwrapped_phase"].transpose("space", "time").values
    unwrapped[keep[bad], 5:12] += 2 * np.pi
    broken["unwrapped_phase"] = (("space", "time"), unwrapped)
    before = densify(cand, result, k=3).compute()
    after = densify(cand, broken, k=3).compute()
    for name in ("velocity", "height_error", "temporal_coherence"):
        np.testing.assert_allclose(after[name].values[touched], before[name].values[touched],
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(after.ambiguity.values[touched],
                                  before.ambiguity.values[touched])


@pytest.mark.slow
def test_the_first_order_table_holds_its_series_once(monkeypatch):
    """Densification's table of the first-order points holds their series once (not copied
    where all are kept and finite) and no residuals: a chunk's payload makes its points'
    residuals from their rows, each point's the same whichever rows it is made with (a block
    of all the points, to the bit); the table's peak is under 1.5 times the float64 series
    (6.4 times before the table was made in blocks)."""
    import tracemalloc

    import depsi.processing.densification as densification
    from depsi.processing.atmosphere import estimate_atmosphere
    from depsi.processing.densification import _TABLE_ROWS, _first_order_table

    result = integrated_result()
    screen = estimate_atmosphere(result, method="gaussian")
    first = result.assign(aps_observed=screen["aps_observed"])
    first.attrs.update({k: v for k, v in screen.attrs.items()
                        if k.startswith("variogram_") or k == "aps_method"})
    series = result["unwrapped_phase"].size * 8
    tracemalloc.start()
    try:
        table, motion = _first_order_table(first)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * series, peak / series
    assert "fo_residual" not in table
    rows = {name: table[name].values for name in _TABLE_ROWS}
    whole = motion.residual(rows)
    assert whole.dtype == np.float32 and np.isfinite(whole).all()
    some = np.random.default_rng(0).permutation(len(whole))[:40]
    np.testing.assert_array_equal(motion.residual({k: v[some] for k, v in rows.items()}),
                                  whole[some])
    monkeypatch.setattr(densification, "POINT_BLOCK", 7)  # the finite check's blocks
    assert _first_order_table(first)[0].sizes == table.sizes


@pytest.mark.parametrize("k", [1, 16])
def test_used_rows_are_numpys_unique_with_inverse(k):
    """A chunk's used rows and local indices are ``np.unique``'s (sorted rows, inverse), with
    repeated, unused and top rows among the indices."""
    from depsi.processing.densification import _used_rows

    rng = np.random.default_rng(k)
    idx = rng.integers(0, 5000, (3000, k))
    idx[0, 0], idx[-1, -1] = 0, 9999
    used, local = _used_rows(idx)
    expected, inverse = np.unique(idx, return_inverse=True)
    np.testing.assert_array_equal(used, expected)
    np.testing.assert_array_equal(local, inverse.reshape(idx.shape))
    assert local.dtype == np.int32
    np.testing.assert_array_equal(used[local], idx)
