"""Spatial integration: accuracy, arc testing, components, reference, bad input."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import xarray as xr

from depsi.processing.arcs import estimate_arcs
from depsi.processing.integration import integrate_network
from depsi.processing.network import form_network
from depsi.processing.network_solver import incidence_matrix
from scenes import predicted_arc_std, simulated_points


def _estimated(**kwargs):
    points, true = simulated_points(aps_std=0.0, **kwargs)
    return points, true, estimate_arcs(form_network(points, method="redundant")).compute()


def _with_cycle_slips(arcs, count, *, seed):
    """A copy of ``arcs`` with a cycle slip in the last 8 epochs of ``count`` random arcs."""
    bad = np.sort(np.random.default_rng(seed).choice(arcs.sizes["arc"], count, replace=False))
    arcs = arcs.copy(deep=True)
    amb = arcs["ambiguity"].values.copy()
    amb[bad, -8:] += 1
    arcs["ambiguity"] = (arcs["ambiguity"].dims, amb)
    return arcs, bad


def test_incidence_matrix_has_minus_one_at_source_plus_one_at_target():
    A = incidence_matrix(np.array([0, 2]), np.array([1, 0]), 3).toarray()
    assert A.tolist() == [[-1, 1, 0], [1, 0, -1]]


def test_integration_recovers_velocity_height_and_displacement_within_noise():
    points, true, arcs = _estimated()
    result = integrate_network(points, arcs)
    keep, ref = result.in_network.values, result.attrs["reference"]
    assert keep.mean() > 0.97
    sd_v, sd_h = predicted_arc_std(points)  # std of a point pair: 1.2 mm/yr, 1.9 m
    v_err = result.velocity.values - (true.velocity.values - true.velocity.values[ref])
    h_err = result.height_error.values - (true.height_error.values - true.height_error.values[ref])
    d_true = true.displacement.values - true.displacement.values[ref]
    d_err = result.displacement.values - d_true
    # measured (seed 1): 0.87 mm/yr, 1.9 m, 2.4 mm
    assert np.sqrt(np.mean(v_err[keep] ** 2)) <= 1.2 * sd_v
    assert np.sqrt(np.mean(h_err[keep] ** 2)) <= 1.5 * sd_h
    # per epoch: sqrt(2) * 0.3 rad of pair noise = 1.9 mm at C band, plus h2ph * height error
    assert np.sqrt(np.mean(d_err[keep] ** 2)) <= 1.5 * (np.sqrt(2) * 0.3 * 0.0556 / (4 * np.pi))
    assert not np.isnan(result.velocity.values[keep]).any()
    assert result.ambiguity.dtype == np.int32


@pytest.mark.slow
def test_planted_wrong_arc_is_detected_and_removed():
    points, true, arcs = _estimated()
    clean_result, clean = integrate_network(points, arcs, return_arcs=True)
    bad = int(np.flatnonzero(clean.arc_kept.values)[10])
    arcs = arcs.copy(deep=True)
    arcs["velocity"][bad] += 0.01  # 10 mm/yr: about 8 sigma of an arc
    arcs["ambiguity"][bad, -5:] += 1  # and a cycle slip in the last epochs
    result, tested = integrate_network(points, arcs, return_arcs=True)
    assert tested.arc_removal_reason.values[bad] == 2
    assert result.attrs["n_arcs_removed_wtest"] <= clean_result.attrs["n_arcs_removed_wtest"] + 2
    ref = result.attrs["reference"]
    keep = result.in_network.values
    v_err = result.velocity.values - (true.velocity.values - true.velocity.values[ref])
    assert np.sqrt(np.mean(v_err[keep] ** 2)) <= 1.2 * predicted_arc_std(points)[0]


def test_disconnected_network_keeps_the_largest_component():
    points, _, _ = _estimated()
    # move a small patch of points 50 km away, too far for any arc of max_length
    far = np.flatnonzero(points.azimuth.values < 15)
    points = points.assign_coords(azimuth=points.azimuth.where(
        ~points.azimuth.isin(points.azimuth.values[far]) | (np.arange(points.sizes["space"])
                                                            > far.max()), points.azimuth + 5000))
    moved = points.azimuth.values > 1000
    arcs = estimate_arcs(form_network(points, method="redundant", max_length=500.0)).compute()
    result = integrate_network(points, arcs)
    assert not result.in_network.values[moved].any()
    assert (result.removal_reason.values[moved] > 0).all()
    assert result.attrs["n_points_removed_component"] + result.attrs[
        "n_points_removed_weak"] >= moved.sum()


def test_given_reference_is_used_and_bad_reference_rejected():
    points, _, arcs = _estimated()
    result = integrate_network(points, arcs, reference=5)
    assert result.attrs["reference"] == 5 and result.velocity.values[5] == 0
    with pytest.raises(ValueError, match="reference"):
        integrate_network(points, arcs, reference=points.sizes["space"])


def test_all_arcs_rejected_is_a_clear_error():
    points, _, arcs = _estimated()
    with pytest.raises(ValueError, match="min_coherence"):
        integrate_network(points, arcs, min_coherence=1.01)


def test_nan_arcs_are_rejected_not_cast_to_integers():
    points, _, arcs = _estimated()
    arcs = arcs.copy(deep=True)
    arcs["velocity"][:] = np.nan  # e.g. rank-deficient arcs of a stack without baselines
    with pytest.raises(ValueError, match="NaN"):
        integrate_network(points, arcs)


def test_too_few_points_left_is_a_clear_error():
    points, _, arcs = _estimated()
    coherence = arcs.temporal_coherence.values.copy()
    coherence[1:] = 0.0  # one usable arc: no point keeps 2 arcs
    with pytest.raises(ValueError, match="fewer than 2 points"):
        integrate_network(points, arcs.assign(temporal_coherence=("arc", coherence)))


def test_off_network_points_have_zero_ambiguity_not_cast_nan():
    points, _ = simulated_points(aps_std=0.0)
    far = points.sizes["space"] - 1
    points = points.assign_coords(azimuth=points.azimuth.where(
        np.arange(points.sizes["space"]) != far, 10**6))
    arcs = estimate_arcs(form_network(points, method="redundant", max_length=500.0)).compute()
    result = integrate_network(points, arcs)
    assert not result.in_network.values[far]
    assert result.ambiguity.values[far].tolist() == [0] * points.sizes["time"]
    assert np.isnan(result.velocity.values[far])


def test_reference_noise_removal_keeps_values_finite_and_rejects_bad_reference():
    from depsi.processing.datum import remove_reference_noise

    points, true, arcs = _estimated()
    result = remove_reference_noise(integrate_network(points, arcs))
    keep = result.in_network.values
    assert np.isfinite(result.reference_noise.values).all()
    assert np.isfinite(result.velocity.values[keep]).all()
    bad = result.copy()
    bad.attrs["reference"] = result.sizes["space"] + 3
    with pytest.raises(ValueError, match="reference"):
        remove_reference_noise(bad)


def test_reference_area_is_the_datum_of_every_result():
    from depsi.processing.datum import apply_reference_area

    points, true, arcs = _estimated()
    single = integrate_network(points, arcs, reference=5)
    result = integrate_network(points, arcs, reference=5, reference_radius=300.0)
    keep, area = result.in_network.values, result.in_reference_area.values
    assert result.attrs["reference"] == 5 and area[5]
    assert result.attrs["reference_radius"] == 300.0
    assert result.attrs["n_reference_area"] == area.sum() > 10
    assert (keep[area]).all()
    # the area's mean is the zero of velocity, height and every epoch's unwrapped phase
    for name in ("velocity", "height_error", "unwrapped_phase"):
        np.testing.assert_allclose(result[name].values[area].mean(axis=0), 0, atol=1e-5)
    # a constant shift of every point, and the same wrapped phases relative to the datum
    shift = result.velocity.values[keep] - single.velocity.values[keep]
    np.testing.assert_allclose(shift, shift[0], atol=1e-7)
    relative = np.angle(np.exp(1j * (result.phase.values - result.reference_phase.values)))
    congruent = np.angle(np.exp(1j * (result.unwrapped_phase.values - relative)))
    assert np.abs(congruent[keep]).max() < 0.5
    # accurate against the truth on the same datum
    v_true = true.velocity.values - true.velocity.values[area].mean()
    h_true = true.height_error.values - true.height_error.values[area].mean()
    sd_v, sd_h = predicted_arc_std(points)
    assert np.sqrt(np.mean((result.velocity.values - v_true)[keep] ** 2)) <= 1.2 * sd_v
    assert np.sqrt(np.mean((result.height_error.values - h_true)[keep] ** 2)) <= 1.5 * sd_h
    # radius None / 0: the reference point alone, values unchanged
    alone = apply_reference_area(single, 0.0)
    assert alone.in_reference_area.values.sum() == 1 and alone.attrs["n_reference_area"] == 1
    np.testing.assert_array_equal(alone.velocity.values, single.velocity.values)
    with pytest.raises(ValueError, match="reference_radius"):
        apply_reference_area(single, -1.0)


def _random_network(n=300, m=3000, seed=1):
    rng = np.random.default_rng(seed)
    source = rng.integers(0, n, m)
    target = (source + rng.integers(1, 20, m)) % n
    return source, target, rng.uniform(0.5, 3.0, m)


@pytest.mark.slow
def test_redundancy_numbers_equal_the_dense_hat_matrix():
    from depsi.processing.network_solver import _solve

    source, target, weights = _random_network()
    n = 300
    _, leverage = _solve(source, target, weights, np.zeros((len(source), 1)),
                         np.arange(len(source)), n, np.ones(n, bool), 0, leverage=True)
    A = incidence_matrix(source, target, n).toarray()[:, 1:]  # reference 0 fixed
    hat = np.einsum("ai,ij,aj->a", A, np.linalg.inv(A.T @ (weights[:, None] * A)), A) * weights
    np.testing.assert_allclose(leverage, hat, atol=1e-12)
    # trace of the hat matrix = number of unknowns: the redundancy numbers sum to m - n + 1
    assert np.isclose((1 - leverage).sum(), len(source) - n + 1)


def test_probed_redundancy_numbers_are_close_for_large_networks(monkeypatch):
    from depsi.processing import network_solver

    source, target, weights = _random_network()
    n = 300
    args = (source, target, weights, np.zeros((len(source), 1)), np.arange(len(source)), n,
            np.ones(n, bool), 0)
    _, exact = network_solver._solve(*args, leverage=True)
    monkeypatch.setattr(network_solver, "EXACT_REDUNDANCY_POINTS", 10)
    _, probed = network_solver._solve(*args, leverage=True)
    # 64 sign probes: the redundancy number (about 0.9) within a few per cent per arc
    assert np.sqrt(np.mean((probed - exact) ** 2)) < 0.05
    assert abs(probed.mean() - exact.mean()) < 0.01


@pytest.mark.parametrize("exact_up_to", [1000, 10])
def test_arcs_removed_by_an_update_equal_a_new_factorisation(monkeypatch, exact_up_to):
    """The w-test's late iterations remove a few arcs each: the solution without them, by the
    Woodbury update of the last factorisation, and the redundancy numbers through it (exact,
    and from the same random probes) are those of a network factorised afresh."""
    from depsi.processing import network_solver

    monkeypatch.setattr(network_solver, "EXACT_REDUNDANCY_POINTS", exact_up_to)
    source, target, weights = _random_network()
    n = 300
    rhs = np.random.default_rng(2).normal(size=(len(source), 5)).astype(np.float32)
    args = (source, target, weights, rhs)
    solved = network_solver._NetworkSolve(*args, np.arange(len(source)), n, np.ones(n, bool), 0)
    removed = np.array([3, 40, 41, 700, 2999])
    assert solved.without(removed[:2]) and solved.without(removed[2:])  # in two iterations
    kept = np.setdiff1d(np.arange(len(source)), removed)
    np.testing.assert_array_equal(solved.arcs(), kept)
    fresh = network_solver._NetworkSolve(*args, kept, n, np.ones(n, bool), 0)
    np.testing.assert_allclose(solved.values(), fresh.values(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(solved.leverage(), fresh.leverage(), rtol=0, atol=1e-10)
    assert not solved.without(np.arange(100, 100 + network_solver.WOODBURY_MAX_NEW + 1))


def test_the_w_test_decides_the_same_with_or_without_updates(monkeypatch):
    """Planted cycle slips: the w-test with Woodbury updates rejects the same arcs as with a
    factorisation every iteration, with the same values, in fewer factorisations."""
    from depsi.processing import network_solver

    points, true, arcs = _estimated()
    arcs, bad = _with_cycle_slips(arcs, 30, seed=3)
    counted = []
    real = network_solver._factorise

    def counting(normal, **options):
        counted.append(normal.shape[0])
        return real(normal, **options)

    monkeypatch.setattr(network_solver, "_factorise", counting)
    updated, updated_arcs = integrate_network(points, arcs, return_arcs=True)
    n_updated = len(counted)
    monkeypatch.setattr(network_solver, "WOODBURY_MAX_NEW", 0)  # every iteration factorises
    counted.clear()
    plain, plain_arcs = integrate_network(points, arcs, return_arcs=True)
    assert updated.attrs["n_test_iterations"] >= 2
    np.testing.assert_array_equal(updated_arcs.arc_removal_reason.values,
                                  plain_arcs.arc_removal_reason.values)
    assert (updated_arcs.arc_removal_reason.values[bad] == 2).all()
    for name in ("velocity", "height_error", "unwrapped_phase"):
        np.testing.assert_allclose(updated[name].values, plain[name].values, rtol=0,
                                   atol=1e-6, err_msg=name)
    assert n_updated < len(counted)


@pytest.mark.slow
def test_many_planted_wrong_arcs_are_removed_in_few_iterations():
    points, true, arcs = _estimated()
    clean_result, clean = integrate_network(points, arcs, return_arcs=True)
    kept = np.flatnonzero(clean.arc_kept.values)
    rng = np.random.default_rng(3)
    bad = np.sort(rng.choice(kept, 12, replace=False))
    arcs = arcs.copy(deep=True)
    amb = arcs["ambiguity"].values.copy()
    amb[bad, -8:] += 1  # a cycle slip in the last 8 epochs of 12 arcs
    arcs["ambiguity"] = (arcs["ambiguity"].dims, amb)
    result, tested = integrate_network(points, arcs, return_arcs=True)
    removed = tested.arc_removal_reason.values == 2
    assert removed[bad].all()
    assert removed.sum() <= clean_result.attrs["n_arcs_removed_wtest"] + 12 + 3
    # several independent arcs go in one iteration: fewer factorisations than removed arcs
    assert result.attrs["n_test_iterations"] < removed.sum()
    ref = result.attrs["reference"]
    keep = result.in_network.values
    v_err = result.velocity.values - (true.velocity.values - true.velocity.values[ref])
    assert np.sqrt(np.mean(v_err[keep] ** 2)) <= 1.2 * predicted_arc_std(points)[0]


@pytest.mark.slow
def test_tiled_testing_rejects_the_planted_arcs_and_agrees_with_the_whole_network(monkeypatch):
    """Large networks are tested tile by tile (factorisations of a tile's size, cost linear in
    the number of points), then solved once as a whole: the decisions are those of the
    whole-network test, and on the whole network next to no kept arc exceeds the critical
    value."""
    from depsi.processing import arc_testing

    points, true, arcs = _estimated()
    arcs, bad = _with_cycle_slips(arcs, 12, seed=5)
    whole, whole_arcs = integrate_network(points, arcs, return_arcs=True)
    monkeypatch.setattr(arc_testing, "TILE_POINTS", points.sizes["space"] // 4)
    tiled, tiled_arcs = integrate_network(points, arcs, return_arcs=True)
    removed = tiled_arcs.arc_removal_reason.values == 2
    assert removed[bad].all()
    agree = removed == (whole_arcs.arc_removal_reason.values == 2)
    assert agree.mean() > 0.995
    assert tiled.attrs["n_test_iterations"] == 0  # the whole network is not iterated on
    exceed = tiled_arcs.w_statistic.values[tiled_arcs.arc_kept.values] > tiled.attrs["w_critical"]
    assert exceed.sum() <= 2
    keep = tiled.in_network.values
    np.testing.assert_allclose(tiled.velocity.values[keep], whole.velocity.values[keep],
                               atol=2e-4)
    # the right-hand sides read from a temporary file through the whole network's solve:
    # the same result to the bit
    from depsi.processing.integration import arc_observations

    observations = arc_observations(points, arcs)
    from depsi.stm import runtime

    monkeypatch.setattr(runtime, "SPILL_BYTES", observations.rhs.nbytes)
    xr.testing.assert_identical(integrate_network(points, observations), tiled)
    assert observations.rhs.spilled
    # every array pageable (each in a file's pages) and paged out before the tiles, the whole
    # network's factorisation and the point results: the same result to the bit
    monkeypatch.setattr(runtime, "PAGEABLE_BYTES", 0)
    paged = []
    original = runtime.page_out
    from depsi.processing import network_solver

    def counting(array=None):
        if array is None:  # (the solve's blocks page out the solution alone)
            paged.append(len(runtime._PAGEABLE))
        return original(array)

    monkeypatch.setattr(network_solver, "page_out", counting)
    monkeypatch.setattr(runtime, "page_out", counting)  # (the tiles')
    import depsi.processing.integration as integration_module

    monkeypatch.setattr(integration_module, "page_out", counting)
    observations = arc_observations(points, arcs)
    assert runtime.is_pageable(observations.coherence)
    assert runtime.is_pageable(observations.rhs.ambiguity)
    xr.testing.assert_identical(integrate_network(points, observations), tiled)
    assert len(paged) == 3 and min(paged) >= 2, paged  # (the last: coherence and spread)


@pytest.mark.slow
def test_arc_observations_integrate_as_the_arcs_do():
    """The chain's second pass hands integration the arcs' observations (the arc STM freed
    first): the result is the one the arcs give, and what they cannot do is refused."""
    from depsi.processing.integration import arc_observations

    points, _, arcs = _estimated()
    observations = arc_observations(points, arcs)
    del arcs["phase"], arcs["h2ph"]  # the observations need them no more
    xr.testing.assert_identical(integrate_network(points, observations),
                                integrate_network(points, _estimated()[2]))
    with pytest.raises(ValueError, match="return_arcs"):
        integrate_network(points, observations, return_arcs=True)
    with pytest.raises(ValueError, match="epochs"):
        integrate_network(points.isel(time=slice(1, None)), observations)
    bad = observations._replace(target=observations.target + points.sizes["space"])
    with pytest.raises(ValueError, match="source/target"):
        integrate_network(points, bad)


@pytest.mark.slow
def test_arc_observations_read_a_stored_arc_stm_a_few_chunks_at_a_time(tmp_path, monkeypatch):
    """`depsi run` integrates its stored arcs: they are read whole chunks at a time (never the
    whole arc STM), and the observations are those of the arcs in memory, bit for bit."""
    import depsi.processing.integration as integration_module
    from depsi.io import open_stm, save_stm

    points, _, arcs = _estimated()
    arcs = arcs.compute()
    n = arcs.sizes["arc"]
    store = save_stm(arcs, tmp_path / "arcs.zarr", chunk_bytes=40_000)
    stored = open_stm(store)
    assert len(stored["phase"].chunks[0]) > 4
    monkeypatch.setattr(integration_module, "OBSERVATION_BATCH", 250)
    reads = []
    real = integration_module.fill_observations

    def recording(observations, start, part):
        reads.append((start, part.sizes["arc"]))
        return real(observations, start, part)

    monkeypatch.setattr(integration_module, "fill_observations", recording)
    lazy = integration_module.arc_observations(points, stored)
    assert len(reads) > 2 and max(size for _, size in reads) <= 250
    assert max(size for _, size in reads) > stored["phase"].chunks[0][0]  # several chunks
    bounds = set(np.cumsum((0,) + stored["phase"].chunks[0]).tolist())
    assert [start for start, _ in reads] == list(np.cumsum([0] + [s for _, s in reads])[:-1])
    assert {start for start, _ in reads} <= bounds  # whole chunks
    assert sum(size for _, size in reads) == n
    whole = integration_module.arc_observations(points, arcs)
    for got, expected in zip(lazy, whole):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.slow
def test_tiles_of_one_wave_share_no_arc():
    """The claim the threads rest on: two tiles of one wave never test a common arc, on a
    random network whose margins reach just under half a tile."""
    from depsi.processing.arc_testing import _tile_waves

    rng = np.random.default_rng(11)
    positions = rng.uniform(0, 1000, (3000, 2))
    source = rng.integers(0, 3000, 20000)
    near = np.argsort(np.hypot(*(positions[source][:, None] - positions[None]).transpose(2, 0, 1)),
                      axis=1)[:, 1:9]
    target = near[np.arange(source.size), rng.integers(0, 8, source.size)]
    cell, margin = 100.0, 49.0
    tile_of_arc = np.floor(0.5 * (positions[source] + positions[target]) / cell).astype(int)
    waves = _tile_waves(np.unique(tile_of_arc, axis=0), cell, margin)
    assert len(waves) == 4 and sum(map(len, waves)) == 100
    for wave in waves:
        seen = np.zeros(source.size, dtype=int)
        for tile in wave:
            lo, hi = tile * cell - margin, (tile + 1) * cell + margin
            inside = np.all((positions >= lo) & (positions < hi), axis=1)
            seen += inside[source] & inside[target]
        assert seen.max() == 1


@pytest.mark.parametrize("margin", [12.0, 49.0, 130.0])
def test_a_tiles_sub_network_is_cut_from_its_neighbours_as_from_every_arc(margin):
    """A tile's sub-network is cut from the arcs of the tiles around it (their midpoints lie in
    its box): the same arcs, in the same order, as a pass over every arc, for margins below
    half a tile, below a tile and beyond it."""
    from scipy.spatial import cKDTree

    from depsi.processing.arc_testing import _arcs_by_tile, _tile_subnetwork

    rng = np.random.default_rng(3)
    positions = rng.uniform(0, 1000, (3000, 2))
    source = rng.integers(0, 3000, 20000)
    _, near = cKDTree(positions).query(positions[source], k=9)
    target = near[np.arange(source.size), rng.integers(1, 9, source.size)]
    arc_ok = rng.random(source.size) > 0.1
    cell, low = 100.0, positions.min(axis=0)
    tile_of_arc = np.floor((0.5 * (positions[source] + positions[target]) - low) / cell
                           ).astype(np.int64)
    by_tile = _arcs_by_tile(tile_of_arc, cell, margin)
    ones = np.ones(source.size)
    for tile in np.unique(tile_of_arc, axis=0):
        lo, hi = low + tile * cell - margin, low + (tile + 1) * cell + margin
        inside = np.all((positions >= lo) & (positions < hi), axis=1)
        expected = np.flatnonzero(arc_ok & inside[source] & inside[target])
        cut = _tile_subnetwork(tile, low=low, cell=cell, margin=margin, positions=positions,
                               source=source, target=target, arc_ok=arc_ok, weights=ones,
                               rhs=ones[:, None], coherence=ones, sd=(1.0, 1.0, 1.0),
                               critical=4.0, max_iterations=1, tile_of_arc=tile_of_arc,
                               by_tile=by_tile)
        if expected.size < 3:
            assert cut is None
            continue
        members, sub = cut
        np.testing.assert_array_equal(members, expected)
        points = np.unique(np.concatenate([source[expected], target[expected]]))
        np.testing.assert_array_equal(points[sub.source], source[expected])
        np.testing.assert_array_equal(points[sub.target], target[expected])
        np.testing.assert_array_equal(sub.positions, positions[points])


@pytest.mark.slow
def test_tiled_testing_gives_the_same_result_on_any_number_of_threads(monkeypatch, caplog):
    import logging

    from depsi.processing import arc_testing

    points, _, arcs = _estimated(shape=(400, 400))
    bad = np.random.default_rng(5).choice(arcs.sizes["arc"], 40, replace=False)
    amb = arcs["ambiguity"].values.copy()
    amb[bad, -8:] += 1
    arcs = arcs.assign(ambiguity=(arcs["ambiguity"].dims, amb))
    monkeypatch.setattr(arc_testing, "TILE_POINTS", points.sizes["space"] // 9)
    runs = []
    for workers in (1, 2, 3):
        monkeypatch.setattr(arc_testing, "worker_threads", lambda workers=workers: workers)
        with caplog.at_level(logging.INFO, logger="depsi.processing.arc_testing"):
            runs.append(integrate_network(points, arcs, return_arcs=True))
        assert "(4 waves," in caplog.text  # tiles did run side by side

    def wave_by_wave(pool, test, waves, *, neighbours_only):
        for wave in waves:  # every tile of a wave reads arc_ok before any of them is applied
            yield from [test(tile) for tile in wave]

    # the tiles started as their neighbours of earlier waves finish decide as wave by wave
    monkeypatch.setattr(arc_testing, "_tiles_by_dependency", wave_by_wave)
    runs.append(integrate_network(points, arcs, return_arcs=True))
    for result, result_arcs in runs[1:]:
        np.testing.assert_array_equal(result_arcs.arc_removal_reason.values,
                                      runs[0][1].arc_removal_reason.values)
        np.testing.assert_array_equal(result.velocity.values, runs[0][0].velocity.values)
    assert (runs[0][1].arc_removal_reason.values[bad] == 2).mean() > 0.9


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_factorisations_with_many_right_hand_sides_do_not_leak():
    # cholespy 2.2 lost each destroyed solver's (n, k) solve workspace: 2.5 MB a solver here,
    # 100 MB over the 40 below (the w-test's tiles build hundreds per network)
    pytest.importorskip("cholespy")

    from depsi.processing.network_solver import _Cholesky

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    normal = _grid_normal(70)  # a 70 x 70 grid network: 4,900 unknowns
    rhs = np.ones((normal.shape[0], 64))
    expected = _Cholesky(normal).solve(rhs)
    before = rss_mb()
    for _ in range(40):
        solved = _Cholesky(normal).solve(rhs)
    assert np.allclose(solved, expected)
    assert rss_mb() - before < 30


def test_tile_and_network_factorisations_agree():
    # a tile's normal matrix goes to QDLDL (it releases the GIL), the whole network's to
    # CHOLMOD (supernodal through CVXOPT, or cholespy's simplicial one), SuperLU where none is
    # installed: all solve the same systems
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    from depsi.processing import network_solver
    from depsi.processing.network_solver import _LDL, _Cholesky, _factorise, _Supernodal

    rng = np.random.default_rng(7)
    side = 40  # a 40 x 40 grid network with diagonals and random weights: 1,599 unknowns
    grid = np.arange(side * side).reshape(side, side)
    pairs = np.vstack([np.c_[grid[:, :-1].ravel(), grid[:, 1:].ravel()],
                       np.c_[grid[:-1].ravel(), grid[1:].ravel()],
                       np.c_[grid[:-1, :-1].ravel(), grid[1:, 1:].ravel()]])
    rows = np.repeat(np.arange(len(pairs)), 2)
    A = sp.csr_matrix((np.tile([-1.0, 1.0], len(pairs)), (rows, pairs.ravel())),
                      shape=(len(pairs), side * side))[:, 1:]
    normal = (A.T @ sp.diags(rng.uniform(0.5, 4.0, len(pairs))) @ A).tocsc()
    rhs = rng.normal(size=(normal.shape[0], 5))
    reference = splu(normal).solve(rhs)
    scale = np.abs(reference).max()
    solvers = [_LDL(normal), _Cholesky(normal), _Supernodal(normal)]
    for solver in solvers:
        np.testing.assert_allclose(solver.solve(rhs), reference, rtol=0, atol=1e-10 * scale)
        np.testing.assert_allclose(solver.solve(rhs[:, 0]), reference[:, 0], rtol=0,
                                   atol=1e-10 * scale)
    b = rhs.copy()  # in place: the solution over the right-hand sides themselves
    assert solvers[-1].solve(b, overwrite_b=True) is b
    np.testing.assert_allclose(b, reference, rtol=0, atol=1e-10 * scale)
    assert isinstance(_factorise(normal), _LDL)
    assert network_solver.LDL_MAX_UNKNOWNS < 148_000  # a 10^6 scene's whole network: CHOLMOD
    small = network_solver.LDL_MAX_UNKNOWNS
    try:
        network_solver.LDL_MAX_UNKNOWNS = normal.shape[0] - 1
        assert isinstance(_factorise(normal), _Supernodal)
    finally:
        network_solver.LDL_MAX_UNKNOWNS = small


def _grid_normal(side: int, rng=None):
    """The normal matrix of a ``side x side`` grid network (the first point the reference),
    its arcs weighted at random in [0.5, 4] by ``rng``, else all 1."""
    import scipy.sparse as sp

    grid = np.arange(side * side).reshape(side, side)
    pairs = np.vstack([np.c_[grid[:, :-1].ravel(), grid[:, 1:].ravel()],
                       np.c_[grid[:-1].ravel(), grid[1:].ravel()]])
    rows = np.repeat(np.arange(len(pairs)), 2)
    A = sp.csr_matrix((np.tile([-1.0, 1.0], len(pairs)), (rows, pairs.ravel())),
                      shape=(len(pairs), side * side))[:, 1:]
    weights = np.ones(len(pairs)) if rng is None else rng.uniform(0.5, 4.0, len(pairs))
    return (A.T @ sp.diags(weights) @ A).tocsc()


def _array_rhs(velocity, height, ambiguity, arc_phase):
    """The right-hand sides as fill_observations wrote them into an array."""
    from depsi.processing.integration import _TWO_PI

    out = np.empty((len(velocity), 2 + ambiguity.shape[1]), np.float32)
    out[:, 0], out[:, 1] = velocity, height
    np.multiply(ambiguity, _TWO_PI, out=out[:, 2:])
    out[:, 2:] += arc_phase
    return out


def test_arc_right_hand_sides_are_the_arrays_rows_to_the_bit():
    """The arcs' right-hand sides kept as the points' phases and the arcs' cycles give every
    row the array gave (slices, index and mask rows, columns, the whole), in a quarter of its
    memory; cycles past int8 widen the store, a missing epoch stays missing."""
    from depsi.conventions import MISSING_AMBIGUITY, wrap_phase
    from depsi.processing.integration import ArcRightHandSides, empty_observations

    rng = np.random.default_rng(3)
    n, n_epochs, m = 300, 9, 150_000
    phase = rng.uniform(-np.pi, np.pi, (n, n_epochs)).astype(np.float32)
    phase[7, 4] = np.nan  # a missing epoch: every arc of point 7 misses it
    source, target = rng.integers(0, n, m), rng.integers(0, n, m)
    arc_phase = wrap_phase(phase[target] - phase[source])
    cycles = rng.integers(-40, 40, (m, n_epochs)).astype(np.int32)
    cycles[np.isnan(arc_phase)] = MISSING_AMBIGUITY
    velocity, height = rng.normal(size=(2, m)).astype(np.float32)
    expected = _array_rhs(velocity, height, cycles, arc_phase)
    rhs = empty_observations(source, target, n_epochs, phase).rhs
    assert isinstance(rhs, ArcRightHandSides)
    for start in range(0, m, 40_000):  # in batches, as the arcs step fills them
        rows = slice(start, start + 40_000)
        rhs.fill(start, velocity[rows], height[rows], cycles[rows], arc_phase[rows])
    assert rhs.ambiguity.dtype == np.int8 and rhs.nbytes == m * (8 + n_epochs)
    assert rhs.shape == expected.shape and len(rhs) == m
    mask = expected[:, 0] > 0
    for key in (slice(None), slice(5, 70_005), slice(3, 900, 7), np.array([m - 1, 0, 17]),
                mask, (slice(None), 1), (mask, slice(2, None)), 11):
        np.testing.assert_array_equal(rhs[key], expected[key], err_msg=str(key))
    np.testing.assert_array_equal(np.asarray(rhs), expected)
    assert np.isnan(expected).any()
    np.testing.assert_array_equal(rhs.finite, np.isfinite(expected).all(axis=1))
    # unchecked (the arcs step, which formed the arcs from these points): the same rows
    unchecked = ArcRightHandSides(phase, source, target)
    unchecked.fill(0, velocity, height, cycles, arc_phase, check=False)
    np.testing.assert_array_equal(unchecked[:], expected)
    np.testing.assert_array_equal(unchecked.finite, rhs.finite)
    # an arc of 300 cycles: the store widens to int16, every row still the array's
    cycles[5, 2] = 300
    wide = ArcRightHandSides(phase, source, target)
    wide.fill(0, velocity, height, cycles, arc_phase)
    assert wide.ambiguity.dtype == np.int16
    np.testing.assert_array_equal(wide[:], _array_rhs(velocity, height, cycles, arc_phase))
    with pytest.raises(ValueError, match="in order"):
        wide.fill(10, velocity[:5], height[:5], cycles[:5], arc_phase[:5])
    # moved to a temporary file (the whole network's solve): every row read back to the bit
    for spilled, values in ((rhs, expected), (wide, wide[:])):
        assert spilled.spill() and spilled.spilled and spilled.nbytes == 0
        assert spilled.motion is None and spilled.ambiguity is None
        scattered = np.random.default_rng(9).permutation(m)[:3000]  # spanning every arc
        for key in (slice(None), slice(5, 70_005), slice(3, 900, 7), np.array([m - 1, 0, 17]),
                    mask, (slice(None), 1), (mask, slice(2, None)), 11, scattered,
                    np.sort(scattered), np.array([], dtype=np.int64)):
            np.testing.assert_array_equal(spilled[key], values[key], err_msg=str(key))
        with pytest.raises(ValueError, match="spill"):
            spilled.fill(m, velocity[:5], height[:5], cycles[:5], arc_phase[:5])


def test_arcs_whose_phases_are_not_their_points_differences_keep_their_own_values():
    """Arcs made elsewhere (their phase not the difference of the points' phases from some
    batch on): every row is kept as an array from then on, those before as they were."""
    from depsi.conventions import wrap_phase
    from depsi.processing.integration import ArcRightHandSides

    rng = np.random.default_rng(4)
    phase = rng.uniform(-np.pi, np.pi, (50, 6)).astype(np.float32)
    source, target = rng.integers(0, 50, 1000), rng.integers(0, 50, 1000)
    arc_phase = wrap_phase(phase[target] - phase[source])
    arc_phase[700:] = wrap_phase(arc_phase[700:] + np.float32(0.25))  # the second batch's own
    cycles = rng.integers(-3, 3, (1000, 6))
    velocity, height = rng.normal(size=(2, 1000)).astype(np.float32)
    rhs = ArcRightHandSides(phase, source, target)
    rhs.fill(0, velocity[:600], height[:600], cycles[:600], arc_phase[:600])
    assert rhs.full is None
    rhs.fill(600, velocity[600:], height[600:], cycles[600:], arc_phase[600:])
    assert rhs.full is not None
    np.testing.assert_array_equal(rhs[:], _array_rhs(velocity, height, cycles, arc_phase))
    assert rhs.spill() and rhs.full is None  # the array's rows from the file, to the bit
    np.testing.assert_array_equal(rhs[:], _array_rhs(velocity, height, cycles, arc_phase))
    np.testing.assert_array_equal(rhs[[999, 3, 3]],
                                  _array_rhs(velocity, height, cycles, arc_phase)[[999, 3, 3]])


def test_right_hand_sides_stay_in_memory_where_no_temporary_file_can_be_written(tmp_path,
                                                                               caplog):
    import logging

    from depsi.processing.integration import ArcRightHandSides

    phase = np.zeros((4, 3), np.float32)
    rhs = ArcRightHandSides(phase, np.array([0, 1]), np.array([1, 2]))
    rhs.fill(0, np.ones(2, np.float32), np.ones(2, np.float32), np.ones((2, 3), np.int32),
             np.zeros((2, 3), np.float32))
    with caplog.at_level(logging.WARNING, logger="depsi.processing.integration"):
        assert not rhs.spill(directory=str(tmp_path / "missing"))
    assert "kept in memory" in caplog.text and not rhs.spilled
    np.testing.assert_array_equal(rhs[:, 2:], np.full((2, 3), 2 * np.pi, np.float32))


@pytest.mark.parametrize("compiled", [True, False])
# QDLDL at 3000 points, CHOLMOD at 60,000
@pytest.mark.parametrize("n", [3000, pytest.param(60_000, marks=pytest.mark.slow)])
def test_the_whole_networks_solution_made_in_place_is_the_solutions_to_the_bit(
        monkeypatch, n, compiled):
    """The whole network's one solve (``solution_only``) forms its right-hand sides in the
    rows of the points' values and solves them there: the values of the unknowns' solution
    and its copy to the bit, NaN off the network, 0 at the reference."""
    from depsi.processing import network_solver
    from depsi.processing.network_solver import _NetworkSolve

    if not compiled:
        monkeypatch.setattr(network_solver, "_compiled_kernels", lambda module: False)
    rng = np.random.default_rng(n)
    # a chain through every point (connected) and arcs to near points (a factor of a
    # network's sparsity); the first 5 points off it
    near = rng.integers(0, n, 5 * n)
    source = np.concatenate([np.arange(n - 1), near])
    target = np.concatenate([np.arange(1, n), (near + rng.integers(1, 50, near.size)) % n])
    m = len(source)
    weights = rng.uniform(0.5, 2.0, m)
    rhs = rng.normal(size=(m, 22)).astype(np.float32)
    point_ok = np.ones(n, bool)
    point_ok[:5] = False
    kept = np.flatnonzero((rng.uniform(size=m) > 0.1) & (source != target)
                          & point_ok[source] & point_ok[target])
    kept = np.union1d(kept, np.arange(5, n - 1))
    expected = _NetworkSolve(source, target, weights, rhs, kept, n, point_ok, 17).values()
    got = _NetworkSolve(source, target, weights, rhs, kept, n, point_ok, 17,
                        solution_only=True).values()
    np.testing.assert_array_equal(got, expected)
    assert np.isnan(got[:5]).all() and (got[17] == 0).all() and np.isfinite(got[5:]).all()


@pytest.mark.parametrize("n", [600, 3000])  # the exact leverage and the probes'
def test_a_tiles_solution_and_leverage_compiled_are_the_references_to_the_bit(monkeypatch, n):
    """A tile's solve with the compiled normal matrix and right-hand sides, its leverage (the
    probes' 64 columns solved at once) and both after a Woodbury update are those of the
    reference path (SciPy's products, 16 probe columns a solve) to the bit."""
    pytest.importorskip("numba")
    from depsi.processing import network_solver
    from depsi.processing.network_solver import _NetworkSolve

    rng = np.random.default_rng(n + 1)
    near = rng.integers(0, n, 5 * n)
    source = np.concatenate([np.arange(n - 1), near])
    target = np.concatenate([np.arange(1, n), (near + rng.integers(1, 50, near.size)) % n])
    keep = source != target
    source, target = source[keep], target[keep]
    m = len(source)
    weights = rng.uniform(0.5, 2.0, m)
    rhs = rng.normal(size=(m, 7)).astype(np.float32)
    point_ok = np.ones(n, bool)
    kept = np.arange(m)
    removed = kept[n + rng.choice(m - n, 20, replace=False)]  # not the chain: connected

    def solve_and_update():
        solved = _NetworkSolve(source, target, weights, rhs, kept, n, point_ok, 3)
        first = solved.values(), solved.leverage()
        assert solved.without(removed)
        return first + (solved.values(), solved.leverage())

    compiled = solve_and_update()
    monkeypatch.setattr(network_solver, "_compiled_kernels", lambda module: False)
    monkeypatch.setattr(network_solver, "PROBE_SOLVE_COLUMNS", network_solver.PROBE_BLOCK)
    reference = solve_and_update()
    for got, expected in zip(compiled, reference):
        np.testing.assert_array_equal(got, expected)
    assert np.ptp(compiled[1]) > 0 and not np.array_equal(compiled[1], compiled[3])


def test_the_whole_networks_solve_in_column_groups_is_one_solve_to_the_bit():
    """CHOLMOD solves the whole network's right-hand sides 16 at a time (its workspace and
    copies follow the group): each column is that of one solve of them all to the bit (a
    group of 15 would not be: CHOLMOD's blocks of four columns round by their count), in
    place where asked."""

    from depsi.processing import network_solver
    from depsi.processing.network_solver import _Cholesky

    rng = np.random.default_rng(5)
    normal = _grid_normal(30, rng)
    solver = _Cholesky(normal)
    assert network_solver.SOLVE_COLUMNS == 16
    for k in (62, 17, 33, 16):  # 17 and 33: a last group of one column
        b = rng.normal(size=(normal.shape[0], k))
        whole = np.zeros_like(b)
        solver._solver.solve(b, whole)
        np.testing.assert_array_equal(solver.solve(b), whole)
        out = b.copy()
        assert solver.solve(out, overwrite_b=True) is out
        np.testing.assert_array_equal(out, whole)


def test_a_tile_starts_after_its_earlier_neighbours_and_before_its_later_ones():
    """The claim the dependency scheduling rests on: on any number of threads, a tile starts
    only once every adjacent tile of an earlier wave was applied, and before any adjacent
    tile of a later wave starts; tiles that are not adjacent run side by side."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from depsi.processing.arc_testing import _tile_waves, _tiles_by_dependency

    tiles = np.array([[i, j] for i in range(6) for j in range(5)])
    waves = _tile_waves(tiles, cell=100.0, margin=10.0)
    wave_of = {tuple(t): w for w, wave in enumerate(waves) for t in wave.tolist()}
    clock, lock = iter(range(10**6)), threading.Lock()
    started, applied, running, most = {}, {}, set(), [0]
    rng = np.random.default_rng(0)
    pauses = {key: rng.uniform(0, 0.01) for key in wave_of}

    def test(tile):
        key = tuple(tile.tolist())
        with lock:
            started[key] = next(clock)
            running.add(key)
            most[0] = max(most[0], len(running))
        time.sleep(pauses[key])
        with lock:
            running.discard(key)
        return key

    for threads in (1, 3):
        started.clear(), applied.clear()
        with ThreadPoolExecutor(threads) as pool:
            for key in _tiles_by_dependency(pool, test, waves, neighbours_only=True):
                with lock:
                    applied[key] = next(clock)
        assert set(applied) == set(wave_of)
        for (i, j), wave in wave_of.items():
            for a in (-1, 0, 1):
                for b in (-1, 0, 1):
                    other = (i + a, j + b)
                    if other in wave_of and wave_of[other] < wave:
                        assert applied[other] < started[(i, j)], (other, (i, j))
    assert most[0] >= 2


@pytest.mark.parametrize("whole", [False, True], ids=["tile", "whole network"])
def test_network_solve_is_the_weighted_least_squares_solution(monkeypatch, whole):
    """``_NetworkSolve`` on a grid network with random weights, factorised as a tile (QDLDL)
    or as the whole network (CHOLMOD's supernodal factor through CVXOPT, its factor solved by
    the compiled sweeps), its right-hand sides by the compiled scatter: the dense weighted
    least-squares solution with the reference fixed at 0."""
    pytest.importorskip("cholespy")
    from depsi.processing import network_solver


    rng = np.random.default_rng(11)
    side = 30
    grid = np.arange(side * side).reshape(side, side)
    pairs = np.vstack([np.c_[grid[:, :-1].ravel(), grid[:, 1:].ravel()],
                       np.c_[grid[:-1].ravel(), grid[1:].ravel()],
                       np.c_[grid[:-1, :-1].ravel(), grid[1:, 1:].ravel()]])
    source, target = pairs[:, 0], pairs[:, 1]
    weights = rng.uniform(0.5, 4.0, len(pairs))
    rhs = rng.normal(size=(len(pairs), 7)).astype(np.float32)
    kept = np.flatnonzero(rng.random(len(pairs)) < 0.9)
    n, reference = side * side, 17
    monkeypatch.setattr(network_solver, "LDL_MAX_UNKNOWNS", 10 if whole else 10**6)
    solved = network_solver._NetworkSolve(source, target, weights, rhs, kept, n,
                                          np.ones(n, bool), reference)
    assert isinstance(solved.lu, network_solver._Supernodal if whole else network_solver._LDL)
    A = np.zeros((kept.size, n))
    A[np.arange(kept.size), source[kept]] = -1.0
    A[np.arange(kept.size), target[kept]] = 1.0
    A = np.delete(A, reference, axis=1)
    sqrt_w = np.sqrt(weights[kept])[:, None]
    expected = np.linalg.lstsq(A * sqrt_w, rhs[kept].astype(np.float64) * sqrt_w,
                               rcond=None)[0]
    values = solved.values()
    assert np.all(values[reference] == 0.0)
    np.testing.assert_allclose(np.delete(values, reference, axis=0), expected, atol=1e-9)


def test_reference_noise_holds_no_float64_copy_of_the_series(monkeypatch):
    """remove_reference_noise reads the neighbours' and the reference's rows in float64 and
    the rest a block at a time: beside its input it holds its output's three series (float32
    and int32) and blocks, not five float64 copies of the series (3.5 GB at 10^7 points, the
    atmosphere step's peak there: docs/benchmarks.md, "Per-point work in blocks")."""
    import tracemalloc

    from depsi.processing import datum
    from depsi.processing.datum import remove_reference_noise
    from scenes import integrated_result

    monkeypatch.setattr(datum, "POINT_BLOCK", 8192)  # blocks far smaller than the points
    result = integrated_result()
    result = result.assign(phase=result["unwrapped_phase"], removal_reason=(
        "space", np.zeros(result.sizes["space"], np.int8))).assign_attrs(reference=0)
    series = result["unwrapped_phase"].size * 8  # one float64 copy
    tracemalloc.start()
    try:
        remove_reference_noise(result)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3.5 * series, peak / series  # 2.9 measured; 6.7 before


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "numba"])
@pytest.mark.parametrize("block", [1, 7, 4096])
def test_largest_misclosure_blocks_equal_the_whole_arrays_to_the_bit(monkeypatch, block,
                                                                      compiled):
    """The w-test's statistic in reused block buffers (NumPy's) or in one compiled pass equals
    the plain expression over whole arrays (float32 misclosures, float64 divisions), NaN where
    a value is NaN or a misclosure and its standard deviation are both zero, infinity where
    only the deviation is, for blocks of one arc, blocks that do not divide the arcs and one
    block."""
    from depsi.processing import arc_testing

    if compiled:
        pytest.importorskip("numba")
    else:
        monkeypatch.setattr(arc_testing, "_compiled_kernels", lambda module: False)
    rng = np.random.default_rng(5)
    n, m, width = 40, 300, 9
    values = rng.normal(scale=300.0, size=(n, width))
    values[3, 4] = np.nan
    values[5, 0] = np.nan  # a velocity's NaN, not only a phase's
    source, target = rng.integers(0, n, m), rng.integers(0, n, m)
    rhs = rng.normal(scale=300.0, size=(m, width)).astype(np.float32)
    sd = (rng.uniform(0.1, 1.0, m), 0.5, rng.uniform(0.1, 1.0, m))
    sd[0][:2] = 0.0  # x / 0: infinity
    source[2], target[2], rhs[2] = 7, 7, 0.0  # a zero misclosure over a zero deviation: NaN
    sd[0][2] = sd[2][2] = 0.0
    expected = np.abs(rhs - (values[target].astype(np.float32)
                             - values[source].astype(np.float32)))
    monkeypatch.setattr(arc_testing, "MISCLOSURE_BLOCK", block)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.maximum(np.maximum(expected[:, 0] / sd[0], expected[:, 1] / sd[1]),
                              expected[:, 2:].max(axis=1) / sd[2])
        found = arc_testing._largest_misclosure(rhs, values, source, target, sd)
    assert np.isnan(found).sum() > 2 and np.isnan(found[2]) and np.isinf(found).any()
    np.testing.assert_array_equal(found, expected)
    assert arc_testing._largest_misclosure(rhs[:0], values, source[:0], target[:0],
                                           (sd[0][:0], 0.5, sd[2][:0])).shape == (0,)
