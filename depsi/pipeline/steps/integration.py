"""The integration step: the network solution with arc testing, on the configured reference
point (by its index or its position) or one chosen by the points' quality."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import xarray as xr

from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline.steps import ConfigView, Inputs, StepContext
from depsi.pipeline.steps.shared import ChainRecord, model_terms, network_points, searched_terms
from depsi.processing.datum import reference_by_point_index, reference_by_position
from depsi.processing.integration import ArcObservations, arc_observations, integrate_network
from depsi.processing.motion_models import refit_with_terms
from depsi.stm.runtime import release_memory


@single_threaded_blas()
def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """The network solution with arc testing: every first-order point, ``in_network`` kept.

    Its arcs: the observations of the arcs step in memory (as :func:`run_ps_chain` gives them),
    or its arc STM (as ``depsi run`` stores it). Given the only reference to an arc STM, it is
    freed once its observations are made, before the network is solved."""
    network = inputs["network"]
    arcs: xr.Dataset | ArcObservations = inputs["arcs"]
    release_memory()
    points = network_points(network)
    record = ChainRecord.of(network, "integration")
    if not isinstance(arcs, ArcObservations):
        arcs = arc_observations(points, arcs)  # rebinding drops this frame's arc STM
    section = config.integration
    reference = (reference_by_point_index(points, section.reference)
                 if section.reference_lonlat is None
                 else reference_by_position(points, section.reference_lonlat,
                                            section.reference_radius))
    searched = {name: values for name, (values, *_) in
                searched_terms(config, points, "arcs").items()}
    result = integrate_network(points, arcs, reference=reference,
                               min_coherence=section.min_coherence, alpha=section.alpha,
                               max_iterations=section.max_iterations, regressors=searched,
                               devices=context.devices)
    # with model terms, the points' motion as the whole model (the atmosphere's residual and
    # densification's local reference read it)
    result = refit_with_terms(result, model_terms(config, result))
    record = replace(record, reference=int(result.attrs["reference"]))
    return with_cf_attributes(record.on(result))


def counts(product: xr.Dataset) -> dict[str, Any]:
    """The first-order points and those the network kept."""
    return {"first_order": int(product.sizes["space"]),
            "kept": int(product["in_network"].values.sum())}
