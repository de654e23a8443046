"""A driver that does not grow (issue 34, item 3): on a cluster, densification and the model
step leave every (space, time) series of their products on the workers, one persisted chunk
per space chunk of the input, and give the numbers of the threads run bit for bit.

Before, both steps gathered every densified point's series into NumPy arrays in the client
(about 1 kB a point at 60 epochs: 15 GB of a 16.4 GB driver at 10^7 points)."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from distributed import futures_of, wait

from depsi.cluster import scheduler
from depsi.pipeline.chain import run_ps_chain
from depsi.pipeline.chain_config import chain_config
from depsi.pipeline.chain_steps import prepare_points
from depsi.pipeline.steps import BY_NAME, CHAIN_STEPS, call_step
from depsi.processing import ps_selection
from depsi.simulate import simulate_stack

pytestmark = pytest.mark.slow  # a LocalCluster and two small chains

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


@pytest.mark.parametrize("step", ["densification", "model"])
def test_series_of_a_step_stay_on_the_workers_chunk_by_chunk(cluster_products, step):
    client, products = cluster_products
    product = products[step]
    series = [name for name, var in product.data_vars.items() if var.dims == ("space", "time")]
    assert {"unwrapped_phase", "displacement", "aps"} <= set(series)
    for name in series:
        _held_on_workers(product[name].data, client)


def test_cluster_result_equals_the_threads_result_bit_for_bit(cluster_products,
                                                             threads_result):
    _, products = cluster_products
    result = products["model"]
    assert result.sizes == threads_result.sizes
    for name, var in threads_result.variables.items():
        np.testing.assert_array_equal(result[name].values, var.values, err_msg=name)
