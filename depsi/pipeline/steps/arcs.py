"""The arcs step: every arc of the network estimated by the periodogram, as an arc STM (what
``depsi run`` stores) or, in memory, as integration's observations batch by batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline.steps import ConfigView, Inputs, StepContext
from depsi.pipeline.steps.shared import ChainRecord, Devices, network_points, searched_terms
from depsi.processing.arcs import estimate_arcs
from depsi.processing.integration import ArcObservations, estimated_observations
from depsi.processing.network import arcs_from_edges
from depsi.stm.dask_tools import computed_in_place
from depsi.stm.runtime import release_memory


@single_threaded_blas()
def estimated_arcs(network: xr.Dataset, config: ConfigView, *, devices: Devices = None,
                   compute: bool = True) -> xr.Dataset:
    """Every arc of the network estimated by the periodogram (computed arc STM; with
    ``compute=False`` lazy, for writing to a store chunk by chunk as ``depsi run`` does: from
    a network read lazily from its store, no variable of the arc STM is then ever whole in
    memory)."""
    points = network_points(network)
    arcs = arcs_from_edges(points, network["edge_source"].values,
                           network["edge_target"].values)
    arcs.attrs["network_method"] = ChainRecord.of(network, "arcs").network_method
    section = config.arcs
    estimated = estimate_arcs(arcs, height_range=section.height_range,
                              velocity_range=section.velocity_range,
                              height_step=section.height_step,
                              velocity_step=section.velocity_step, devices=devices,
                              extra_regressors=searched_terms(config, points, "arcs"))
    # only the estimates are computed, each into one array: the arcs' phase and h2ph (in
    # memory already) are not copied again, and no chunk list is concatenated
    new = [name for name in estimated.data_vars if name not in arcs.data_vars]
    if not compute:
        return with_cf_attributes(
            arcs.assign(estimated[new].data_vars).assign_attrs(estimated.attrs))
    return with_cf_attributes(
        arcs.assign(computed_in_place(estimated[new])).assign_attrs(estimated.attrs))


def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """The arc STM uncomputed, as ``depsi run`` writes it to its store chunk by chunk."""
    return estimated_arcs(inputs["network"], config, devices=context.devices, compute=False)


@single_threaded_blas()
def run_in_memory(inputs: Inputs, config: ConfigView, context: StepContext
                  ) -> ArcObservations:
    """Every arc of the network estimated by the periodogram, as integration's observations
    (:func:`~depsi.processing.integration.estimated_observations`: the values of the arc STM
    estimated whole, made a batch at a time, so the whole arc STM is never in memory)."""
    network = inputs["network"]
    release_memory()
    # in memory once (the first-order points), not read
    # again by every batch where the network comes lazily from a store; no copy if it is
    points = network_points(network).compute()
    section = config.arcs
    return estimated_observations(
        points, np.asarray(network["edge_source"].values, dtype=np.int64),
        np.asarray(network["edge_target"].values, dtype=np.int64),
        height_range=section.height_range, velocity_range=section.velocity_range,
        height_step=section.height_step, velocity_step=section.velocity_step,
        devices=context.devices, extra_regressors=searched_terms(config, points, "arcs"))


def counts(product: xr.Dataset) -> dict[str, Any]:
    """The arcs estimated."""
    return {"arcs": int(product.sizes["arc"])}
