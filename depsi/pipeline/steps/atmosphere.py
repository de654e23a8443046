"""The atmosphere step: the screen estimated from the first pass, a second network pass on the
phases it corrects (or a refit of each point), then the reference point's noise and the
reference area: the datum every later step is tied to."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import numpy as np
import xarray as xr

from depsi.conventions import wrap_phase
from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline.steps import ConfigView, Inputs, StepContext
from depsi.pipeline.steps.shared import ChainRecord, model_terms, network_points, searched_terms
from depsi.processing.atmosphere import estimate_atmosphere, second_network_pass
from depsi.processing.datum import apply_reference_area, remove_reference_noise
from depsi.processing.integration import refit_points
from depsi.processing.motion_models import refit_with_terms
from depsi.stm.runtime import pageable, release_memory, spilled_if_large

logger = logging.getLogger(__name__)


def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """The screen from the first pass, a second network pass on corrected phases, then the
    reference point's noise and the reference area (``method: none``: only the latter two).

    Given the only references to its inputs (as :func:`run_ps_chain` gives them), it lets the
    first pass go once the screen is estimated, and the network's points before the second
    pass."""
    network = inputs["network"]
    first = inputs["integration"]
    with single_threaded_blas():
        section = config.atmosphere
        points = network_points(network)
        record = ChainRecord.of(first, "atmosphere")
        terms = model_terms(config, first)
        if section.correlated_height and section.method == "none":
            logger.info("atmosphere.correlated_height needs an atmosphere method: not applied")
        if section.method == "none":
            aps = xr.zeros_like(first["unwrapped_phase"])
            aps.attrs = {}  # a screen, not unwrapped_phase: the table's attributes for aps
            result = first.assign(aps=aps)
        else:
            keep = np.flatnonzero(first["in_network"].values)
            local = int(np.flatnonzero(keep == record.reference)[0])
            # the screen from the kept points (in_network: the others are no source), at
            # every first-pass point, then cut to the kept ones: no copy of the first pass's
            # series (1.6 GB at 10^7 points)
            screen = estimate_atmosphere(first, method=section.method,
                                         temporal_window=section.temporal_window,
                                         regressors=terms.regressors,
                                         stratified=section.stratified)
            # the second pass needs only the screen: the first pass's result (given the only
            # reference, as run_ps_chain gives it) goes
            screen_attrs = {a: screen.attrs[a] for a in screen.attrs
                            if a.startswith(("variogram_", "stratified_")) or a == "aps_method"}
            stratified_rate = screen.get("stratified_rate")
            aps = screen["aps"].transpose("space", "time").values
            aps_observed = screen["aps_observed"].transpose("space", "time").values
            if keep.size != first.sizes["space"]:
                aps, aps_observed = aps[keep], aps_observed[keep]
            unwrapped = None
            if section.second_pass == "refit":
                unwrapped = first["unwrapped_phase"].transpose("space", "time").values[keep] - aps
                first_attrs = {**first.attrs, "reference": local}
            del first, screen
            release_memory()
            # the screen is not read again until the second pass is done: in a temporary
            # file meanwhile where it is large (0.72 GB at 10^7 points), the corrected phases
            # made from it there a block at a time
            parked = spilled_if_large({"aps": aps, "aps_observed": aps_observed})
            if parked is not None:
                del aps, aps_observed
                corrected = corrected_points(points, keep,
                                              lambda rows: parked.rows("aps", rows.start,
                                                                       rows.stop))
            else:
                corrected = corrected_points(points, keep, lambda rows: aps[rows])
            # the network's points (given the only reference) are not read again: their
            # phases, h2ph and arcs go before the second pass (0.9 GB at 10^7 points)
            del points, network
            if unwrapped is not None:
                result = refit_points(corrected, unwrapped, local)
                result.attrs = {**first_attrs, **result.attrs, "second_pass": "refit"}
                del unwrapped
            else:
                result = second_network_pass(
                    corrected, local, network=config.network, arcs=config.arcs,
                    integration=config.integration,
                    extra_regressors=searched_terms(config, corrected, "arcs"),
                    devices=context.devices)
            result = refit_with_terms(result, terms)
            if parked is not None:
                # back into a file's pages: the datum's point results page them out
                aps = parked.load("aps", pageable_out=True)
                aps_observed = parked.load("aps_observed", pageable_out=True)
                parked.close()
            result["aps"] = ("space", "time"), aps
            result["aps_observed"] = (("space", "time"), aps_observed)
            result.attrs.update(screen_attrs)
            if stratified_rate is not None:
                result["stratified_rate"] = stratified_rate.drop_vars(
                    list(stratified_rate.coords))
        if config.integration.reference_noise:
            result = remove_reference_noise(result, regressors=terms.regressors)
        # before densification: densified points are tied to these values and reference phase
        result = apply_reference_area(result, config.integration.reference_radius)
        # the terms' coefficients follow the datum's phases (velocity and height refitted too)
        result = refit_with_terms(result, terms)
        record = replace(record, reference=int(result.attrs["reference"]),
                         reference_radius=float(result.attrs["reference_radius"]),
                         n_reference_area=int(result.attrs["n_reference_area"]))
        return with_cf_attributes(record.on(result))



#: Points a block of :func:`corrected_points`.
CORRECTED_BLOCK = 65536


def corrected_points(points: xr.Dataset, keep: np.ndarray, aps_rows) -> xr.Dataset:
    """``points`` at ``keep`` with their phases corrected by the screen (``aps_rows(rows)``:
    the screen's rows of ``keep[rows]``, a slice), float32, and their h2ph: both
    :func:`~depsi.stm.runtime.pageable` (the second pass holds them through its whole
    network's factorisation, which lets their pages go: 0.72 GB at 10^7 points), made a block
    of points at a time (no whole copy of the points' series, of their difference from the
    screen or of its float64 wrap beside them: 2 GB at 10^7 points). The values of
    ``wrap_phase(points.isel(space=keep).phase - aps).astype(float32)``, to the bit."""
    phase_all = points["phase"].transpose("space", "time")
    n_epochs = phase_all.sizes["time"]
    series = {"phase": pageable((keep.size, n_epochs), np.float32)}
    h2ph = points["h2ph"]
    spatial_h2ph = "space" in h2ph.dims
    if spatial_h2ph:
        h2ph = h2ph.transpose("space", ...)
        series["h2ph"] = pageable((keep.size,) + h2ph.shape[1:], h2ph.dtype)
    phase_values, h2ph_values = phase_all.values, h2ph.values
    for start in range(0, keep.size, CORRECTED_BLOCK):
        rows = slice(start, min(start + CORRECTED_BLOCK, keep.size))
        series["phase"][rows] = wrap_phase(phase_values[keep[rows]] - aps_rows(rows))
        if spatial_h2ph:
            series["h2ph"][rows] = h2ph_values[keep[rows]]
    corrected = points.drop_vars(list(series)).isel(space=keep)
    assigned = {"phase": xr.Variable(("space", "time"), series["phase"])}
    if spatial_h2ph:
        assigned["h2ph"] = xr.Variable(h2ph.dims, series["h2ph"], h2ph.attrs,
                                       encoding=h2ph.encoding)
    return corrected.assign(assigned)


def counts(product: xr.Dataset) -> dict[str, Any]:
    """The first-order points the network kept."""
    return {"kept": int(product["in_network"].values.sum())}
