"""A driver that does not grow: on a cluster, densification and the model
step leave every (space, time) series of their products on the workers, one persisted chunk
per space chunk of the input, and give the numbers of the threads run bit for bit.

Before, both steps gathered every densified point's series into NumPy arrays in the client
(about 1 kB a point at 60 epochs: 15 GB of a 16.4 GB driver at 10^7 points). Integration's
w-test runs its tiles as tasks on the workers, with the threads' decisions bit for bit."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from distributed import futures_of, wait

from depsi.cluster import scheduler
from depsi.pipeline.chain import run_ps_chain
from depsi.pipeline.chain_config import chain_config
from depsi.pipeline.steps import BY_NAME, CHAIN_STEPS, call_step
from depsi.pipeline.steps.selection import prepare_points
from depsi.processing import ps_selection
from depsi.processing.correlated_height import estimate_correlated_height
from depsi.processing.model_fit import fit_with_atmosphere, point_uncertainty
from depsi.processing.motion_models import (
    ModelConfig,
    fit_terms_with_atmosphere,
    temporal_model,
)
from depsi.simulate import simulate_stack

SCENE = {"shape": (150, 150), "n_epochs": 20, "seed": 7, "ps_fraction": 0.03}
#: Points per space chunk of the input: several chunks, so several tasks per step.
CHUNK = 200
OPTIONS = {"network": {"first_order": 150}}


def _points():
    stack, _ = simulate_stack(**SCENE)
    return ps_selection(stack).chunk({"space": CHUNK})


@pytest.fixture(scope="module")
def threads_result():
    with scheduler(scheduler="threads", threads=2):
        return run_ps_chain(_points(), **OPTIONS).compute()


@pytest.fixture(scope="module")
def cluster_products():
    """Every chain product of a LocalCluster run, as the in-memory chain makes them."""
    config = chain_config(None, **OPTIONS)
    with scheduler(scheduler="local", workers=2, threads=1, memory_limit=None) as running:
        products = {"selection": prepare_points(_points())}
        for step in CHAIN_STEPS:
            products[step] = call_step(BY_NAME[step].run_in_memory, step, products.__getitem__,
                                       config)
        yield running.client, products


def _held_on_workers(data, client) -> None:
    """``data`` is a Dask array whose every chunk is a finished future on the cluster."""
    assert isinstance(data, da.Array), type(data)
    futures = futures_of(data)
    assert len(futures) == data.npartitions > 1
    wait(futures)  # persisted: computing, or done, on the workers
    assert all(future.status == "finished" for future in futures)
    assert {future.client for future in futures} == {client}


@pytest.mark.slow  # a LocalCluster and two small chains
@pytest.mark.parametrize("step", ["densification", "model"])
def test_series_of_a_step_stay_on_the_workers_chunk_by_chunk(cluster_products, step):
    client, products = cluster_products
    product = products[step]
    series = [name for name, var in product.data_vars.items() if var.dims == ("space", "time")]
    assert {"unwrapped_phase", "displacement", "aps"} <= set(series)
    for name in series:
        _held_on_workers(product[name].data, client)


@pytest.mark.slow
def test_densification_sends_each_chunks_neighbours_to_the_workers_as_data(cluster_products):
    """Each chunk's neighbour payload is a scattered future, not a value inside the graph: a
    task's specification sits in its worker's unmanaged memory from assignment to run, and at
    10^7 points the payloads embedded there (18 MB a chunk) paused 2 GB workers for good."""
    from depsi.pipeline.steps.densification import DENSIFY_READS
    from depsi.pipeline.steps.shared import kept_points
    from depsi.processing.densification import densify

    client, products = cluster_products
    first = kept_points(products["atmosphere"], DENSIFY_READS)
    candidates = products["selection"]
    velocity = densify(candidates, first)["velocity"].data
    graph = dict(velocity.__dask_graph__())
    # what the chunks' tasks read from outside their graph: data already on the workers
    outside = {key for task in graph.values() for key in getattr(task, "dependencies", ())
               if key not in graph}
    assert len(outside) >= velocity.npartitions > 1
    held = {key for keys in client.has_what().values() for key in keys}
    assert outside <= held
    # (the numbers: test_cluster_result_equals_the_threads_result_bit_for_bit, whose chain
    # densifies through these payloads)


@pytest.mark.slow
def test_cluster_result_equals_the_threads_result_bit_for_bit(cluster_products,
                                                             threads_result):
    _, products = cluster_products
    result = products["model"]
    assert result.sizes == threads_result.sizes
    for name, var in threads_result.variables.items():
        np.testing.assert_array_equal(result[name].values, var.values, err_msg=name)


# ------------------------------------------------- the model step's stages, chunk by chunk
@pytest.mark.slow  # a LocalCluster and two small chains
def test_the_first_order_points_come_a_chunk_at_a_time(cluster_products):
    """The network step gathers the first-order points from the workers a chunk at a time
    (``compute()`` would concatenate them on one worker: 0.7 GB at 10^7 points, past a 1 GB
    worker): the same values, dims, attributes and coordinates as the threads compute."""
    from depsi.stm.dask_tools import gathered_by_chunk

    client, products = cluster_products
    lazy = products["selection"].chunk({"space": 40}).isel(space=slice(5, 160))
    assert lazy["phase"].chunks is not None and len(lazy["phase"].chunks[0]) > 1
    got = gathered_by_chunk(lazy, client)
    assert all(var.chunks is None for var in got.variables.values())
    with dask.config.set(scheduler="threads"):
        xr.testing.assert_identical(got, lazy.compute())


def _merged_result(n: int = 900, n_epochs: int = 24) -> xr.Dataset:
    """A merged result as the model step holds it (in memory), of a smooth field plus noise."""
    rng = np.random.default_rng(3)
    time = np.datetime64("2021-01-01", "ns") + np.arange(n_epochs) * np.timedelta64(12, "D")
    x, y = rng.uniform(0, 4000, n), rng.uniform(0, 4000, n)
    h2ph = np.tile(rng.normal(0, 2e-4, n_epochs), (n, 1)).astype(np.float32)
    years = np.arange(n_epochs) * 12 / 365.25
    velocity = 0.004 * np.sin(x / 900.0)
    phase = (-4 * np.pi / 0.0555) * (velocity[:, None] * years + h2ph * 3.0)
    unwrapped = (phase + rng.normal(0, 0.4, (n, n_epochs))).astype(np.float32)
    aps = (0.8 * np.cos(y / 700.0)[:, None] * rng.normal(0, 1, n_epochs)).astype(np.float32)
    return xr.Dataset(
        {"unwrapped_phase": (("space", "time"), unwrapped), "aps": (("space", "time"), aps),
         "h2ph": (("space", "time"), h2ph),
         "displacement": (("space", "time"), np.zeros((n, n_epochs), np.float32)),
         "velocity": ("space", velocity.astype(np.float32)),
         "height_error": ("space", (3.0 + 2.0 * np.sin(x / 800.0) + rng.normal(0, 0.5, n))
                          .astype(np.float32)),
         "temporal_coherence": ("space", np.ones(n, np.float32)),
         "in_reference_area": ("space", np.arange(n) < 20)},
        coords={"time": time, "x": ("space", x), "y": ("space", y)},
        attrs={"wavelength": 0.0555})


def _stages():
    terms = temporal_model(ModelConfig(terms=["seasonal"]), _merged_result()["time"].values)
    return {
        "fit_with_atmosphere": lambda out: fit_with_atmosphere(out, devices=None),
        "fit_terms_with_atmosphere": lambda out: fit_terms_with_atmosphere(out, terms),
        "estimate_correlated_height": lambda out: estimate_correlated_height(out),
        "point_uncertainty": lambda out: point_uncertainty(out),
    }


@pytest.mark.parametrize("stage", list(_stages()))
def test_a_stage_on_dask_series_stays_lazy_and_gives_the_in_memory_numbers(stage):
    """Given series in Dask chunks (those the workers hold), each stage of the model step
    adds its series as tasks per chunk (nothing of them computed into this process) and its
    numbers are those of the in-memory stage bit for bit; the kriging's to float32 round-off
    (its leak gains are BLAS matrix-vector products, whose last bit follows the block's
    length)."""
    run = _stages()[stage]
    expected = run(_merged_result())
    chunked = _merged_result()
    chunked = chunked.assign({name: chunked[name].chunk({"space": 250})
                              for name in ("unwrapped_phase", "aps", "h2ph", "displacement")})
    got = run(chunked)
    for name, var in got.data_vars.items():
        if var.dims == ("space", "time"):
            assert isinstance(var.data, da.Array) and var.data.npartitions == 4, name
    for name, var in expected.variables.items():
        if stage == "estimate_correlated_height" and var.dtype.kind == "f":
            np.testing.assert_allclose(got[name].values, var.values, rtol=1e-5,
                                       atol=1e-6 * float(np.nanmax(np.abs(var.values))),
                                       err_msg=name)
        else:
            np.testing.assert_array_equal(got[name].values, var.values, err_msg=name)


# ------------------------------------------------------- integration: the tiles as tasks
def _tiled_network(monkeypatch):
    """Points, arcs with planted cycle slips, and TILE_POINTS lowered so the network is tested
    in 4 tiles (the whole-network solve follows)."""
    from depsi.processing import arc_testing
    from depsi.processing.arcs import estimate_arcs
    from depsi.processing.network import form_network
    from scenes import simulated_points

    points, _ = simulated_points(aps_std=0.0)
    arcs = estimate_arcs(form_network(points, method="redundant")).compute()
    bad = np.random.default_rng(5).choice(arcs.sizes["arc"], 12, replace=False)
    ambiguity = arcs["ambiguity"].values.copy()
    ambiguity[bad, -8:] += 1
    arcs = arcs.assign(ambiguity=(arcs["ambiguity"].dims, ambiguity))
    monkeypatch.setattr(arc_testing, "TILE_POINTS", points.sizes["space"] // 4)
    return points, arcs, bad


@pytest.mark.slow  # a LocalCluster
def test_the_tiles_w_tests_run_as_tasks_on_a_cluster_and_decide_as_the_threads_do(
        monkeypatch, caplog):
    """On a distributed scheduler each tile's w-test is a task on the workers (the driver
    cuts the tile's sub-network and receives its decisions; its arcs' arrays pageable and
    paged out after each cut); the arcs it rejects, their redundancy numbers and the
    network's solution are those of the threads, bit for bit."""
    import logging

    from depsi.processing.integration import integrate_network

    points, arcs, bad = _tiled_network(monkeypatch)
    with scheduler(scheduler="threads", threads=2):
        expected, expected_arcs = integrate_network(points, arcs, return_arcs=True)
    from depsi.stm import runtime

    # the driver's arcs' arrays pageable (as at 10^7 points), paged out after each tile's cut
    monkeypatch.setattr(runtime, "PAGEABLE_BYTES", 0)
    with scheduler(scheduler="local", workers=2, threads=1, memory_limit=None) as running:
        with caplog.at_level(logging.INFO, logger="depsi.processing.arc_testing"):
            got, got_arcs = integrate_network(points, arcs, return_arcs=True)
        assert "tiles as tasks" in caplog.text
        assert running.client.run_on_scheduler(
            lambda dask_scheduler: sum(1 for key in dask_scheduler.task_prefixes
                                       if "depsi-tile" in key)) > 0
    assert (got_arcs.arc_removal_reason.values[bad] == 2).all()
    np.testing.assert_array_equal(got_arcs.arc_removal_reason.values,
                                  expected_arcs.arc_removal_reason.values)
    np.testing.assert_array_equal(got_arcs.w_statistic.values, expected_arcs.w_statistic.values)
    for name, var in expected.variables.items():
        np.testing.assert_array_equal(got[name].values, var.values, err_msg=name)


@pytest.mark.parametrize("sizes", [{"tcp://a": 1, "tcp://b": 2}, {}])
def test_tiles_in_flight_are_bounded_and_spread_over_the_workers(monkeypatch, sizes):
    """The driver holds at most TILES_IN_FLIGHT tiles a worker thread at once, sends each to
    the worker with the fewest tiles a thread, and gives the outcomes in the wave's order
    (a stand-in client: no cluster); with no worker at the moment (adaptive scaling), the tiles
    go to the scheduler with their tasks, one worker thread's share at a time."""
    from types import SimpleNamespace

    import distributed

    from depsi.processing import arc_testing

    in_flight, peak, placed = set(), [0], []

    class Future:
        def __init__(self, value, worker):
            self.value, self.worker, self.key = value, worker, f"f{id(self)}"

        def result(self):
            return self.value

        def release(self):
            in_flight.discard(self)

    class Client:
        def nthreads(self):
            return sizes

        def scatter(self, data, workers, hash):
            return [Future(data[0], workers[0])]

        def submit(self, function, payload, workers=(None,), **_):
            value = payload.value if isinstance(payload, Future) else payload
            future = Future(function(value), workers[0])
            placed.append(workers[0])
            in_flight.add(future)
            peak[0] = max(peak[0], len(in_flight))
            return future

    def first_done(futures, return_when):
        return SimpleNamespace(done={futures[0]})

    monkeypatch.setattr(distributed, "wait", first_done)
    monkeypatch.setattr(arc_testing, "_tile_subnetwork",
                        lambda tile, **_: (np.array([int(tile[0])]),
                                           SimpleNamespace(own=np.array([True]), tile=tile)))
    monkeypatch.setattr(arc_testing, "_test_subnetwork",
                        lambda sub: (np.array([0.5]), np.array([int(sub.tile[0]) % 2 == 0])))
    wave = np.array([[i, 0] for i in range(20)])
    outcomes = arc_testing._tiles_on_workers(Client(), wave, {})
    assert peak[0] <= arc_testing.TILES_IN_FLIGHT * max(1, sum(sizes.values()))
    assert [int(own[0]) for own, _, _ in outcomes] == list(range(20))
    assert [removed.size for _, _, removed in outcomes] == [1 - i % 2 for i in range(20)]
    if sizes:
        assert placed.count("tcp://b") > placed.count("tcp://a") > 0
    else:
        assert placed == [None] * 20
