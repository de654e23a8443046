"""The network step: the first-order points, chosen among the selection's, and the arcs
between them; the settings the points cannot meet are refused here, before any arc."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline.steps import EDGE, ConfigView, Inputs, StepContext
from depsi.pipeline.steps.shared import ChainRecord, Devices, model_terms
from depsi.processing.atmosphere import terrain_heights
from depsi.processing.datum import not_first_order
from depsi.processing.network import (
    NetworkConfig,
    first_order_indices,
    network_edges,
    point_positions,
    search_device,
)
from depsi.stm.dask_tools import gathered_by_chunk
from depsi.stm.runtime import pageable_copy, release_memory, workers_client


def with_edges(points: xr.Dataset, section: NetworkConfig, devices: Devices = None
               ) -> xr.Dataset:
    """``points`` with the arcs of ``section`` among them (``edge_source``, ``edge_target``);
    the neighbour search on the first CUDA device of ``devices`` where there is one
    (:func:`~depsi.processing.network.search_device`)."""
    source, target = network_edges(point_positions(points), method=section.method, k=section.k,
                                   n_sectors=section.n_sectors, max_length=section.max_length,
                                   device=search_device(devices))
    # held by the driver from the network to the atmosphere step: large, in a file's pages,
    # which the whole network's factorisation lets go (depsi.stm.runtime.page_out)
    return points.assign({"edge_source": (EDGE, pageable_copy(source)),
                          "edge_target": (EDGE, pageable_copy(target))})


def check_config(points: xr.Dataset, config: ConfigView) -> np.ndarray:
    """Refuse, before any work, settings the points cannot meet; the first-order indices."""
    section = config.network
    chosen = first_order_indices(points, first_order=section.first_order,
                                 max_dispersion=section.max_dispersion,
                                 cell_size=section.cell_size,
                                 ds_first_order=section.ds_first_order)
    reference = config.integration.reference
    if reference is not None and not np.isin(int(reference), chosen):
        raise not_first_order(reference)
    model_terms(config, points)  # the model's terms at the points' epochs, before any arc
    if config.atmosphere.method != "none":  # a stratified part on: the points' heights
        terrain_heights(points, config.atmosphere.stratified)
    return chosen


@single_threaded_blas()
def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """The first-order points (computed) and the arcs between them.

    Returns
    -------
    xarray.Dataset
        The first-order point STM (``point_index`` into the chain's input) with the arcs as
        ``edge_source``, ``edge_target`` (dim ``edge``, indices into its space).
    """
    points = inputs["selection"]
    chosen = check_config(points, config)
    release_memory()
    first = points.isel(space=chosen)
    client = workers_client()
    # on a cluster a chunk at a time into this process: not concatenated on one worker
    first = first.compute() if client is None else gathered_by_chunk(first, client)
    network = with_edges(first, config.network, context.devices)
    record = ChainRecord(n_first_order=int(len(chosen)), network_method=config.network.method)
    return with_cf_attributes(record.on(network))


def counts(product: xr.Dataset) -> dict[str, Any]:
    """The first-order points and their arcs."""
    return {"first_order": int(product.sizes["space"]), "arcs": int(product.sizes[EDGE])}
