"""The model step: the result STM, first-order and densified points in the input's order with
velocity, height and the model's terms fitted with the atmosphere, the atmosphere's leak into
heights removed, and each point's geometry and uncertainty."""

from __future__ import annotations

import logging
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr

from depsi.geometry import POINT_GEOMETRY, correct_positions
from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline.steps import ConfigView, Inputs, StepContext
from depsi.pipeline.steps.shared import UNSPLIT_CHUNKS, ChainRecord, kept_points, model_terms
from depsi.processing.arcs import heights_resolvable
from depsi.processing.correlated_height import estimate_correlated_height
from depsi.processing.model_fit import fit_with_atmosphere, point_uncertainty
from depsi.processing.motion_models import fit_terms_with_atmosphere
from depsi.processing.network import point_positions
from depsi.processing.results import RESULT_VARIABLES, merged_in_input_order, result_view
from depsi.processing.scatterers import SCATTERER_VARIABLES
from depsi.stm.dask_tools import computed_in_place
from depsi.stm.runtime import page_out, release_memory
from depsi.stm.schema import validate

logger = logging.getLogger(__name__)


def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """The result STM: first-order and densified points in the input's order, velocity and
    height fitted with the atmosphere, and the atmosphere's leak into heights removed.

    BLAS at one thread in a block, as in the atmosphere step; given the only references (as
    :func:`run_ps_chain` gives them), the first pass goes once its kept points' results are
    copied, and the densified points once merged."""
    points = inputs["selection"]
    first = inputs["atmosphere"]
    dense = inputs["densification"]
    with single_threaded_blas(), dask.config.set(UNSPLIT_CHUNKS):
        page_out()  # (the first pass's pageable series: read back as the merge needs them)
        first_kept = kept_points(first, RESULT_VARIABLES + ("in_reference_area",))
        record = ChainRecord.of(first, "model")
        if record.reference_radius is None or record.n_reference_area is None:
            raise ValueError("model: expected the atmosphere step's product with its reference "
                             f"area in its record, found {record}")
        reference_global = int(first["point_index"].values[record.reference])
        # run_ps_chain passes the only references to the first pass and the densified points:
        # the first pass goes once its kept points' results are copied, and the merge lets the
        # densified points' variables go one by one (not held in this frame)
        del first
        n_kept = first_kept.sizes["space"]
        area_global = first_kept["point_index"].values[first_kept["in_reference_area"].values]
        parts = [result_view(first_kept, order=1), dense]
        del dense, first_kept
        release_memory()
        out = merged_in_input_order(parts.pop(0), parts.pop())
        release_memory()
        out["in_reference_area"] = ("space", np.isin(out["point_index"].values, area_global))
        h2ph = points["h2ph"].transpose("space", ...).isel(space=out["point_index"].values)
        on_workers = isinstance(out["unwrapped_phase"].data, da.Array)
        if on_workers:
            # the densified points are on the workers (the densification step): so is every
            # series of the result, a task per chunk of it
            rows = out["unwrapped_phase"].data.chunks[0]
            data = h2ph.data if isinstance(h2ph.data, da.Array) else da.from_array(h2ph.values)
            out = out.assign(h2ph=(h2ph.dims, data.rechunk((rows,) + ((-1,) * (data.ndim - 1)))))
        else:
            # read by this process's threads: on a cluster the gather's last task would
            # concatenate it on one worker, over a small worker's memory limit
            values = computed_in_place(xr.Dataset({"h2ph": h2ph.drop_vars(list(h2ph.coords))}),
                                       in_process=True)["h2ph"][1]
            out = out.assign(h2ph=(h2ph.dims, values))
        out.attrs = {"wavelength": float(points.attrs["wavelength"]),
                     "mother_time": str(points.attrs.get("mother_time", ""))}
        # the scene's pixel spacing places the points for the correlated-height kriging (the
        # Sentinel-1 default stretches a 10 m x 10 m grid 3.5 : 1)
        out.attrs.update({name: float(points.attrs[name]) for name in
                          ("azimuth_spacing", "range_spacing") if name in points.attrs})
        section = config.atmosphere
        terms = model_terms(config, out)
        # a stack without baselines (h2ph zero everywhere): no height in the model or results
        heights = heights_resolvable(out["h2ph"])
        if terms:  # every method: aps is zero without one
            out = fit_terms_with_atmosphere(out, terms, choice=config.model.choice,
                                            alpha=config.model.alpha)
        elif section.method != "none":
            out = fit_with_atmosphere(out, devices=context.devices)
        # on the workers, each stage's series are computed once and kept there for the next
        # (which reads them several times: the kriging's sample, its field, the uncertainty)
        out = out.persist() if on_workers else out
        if section.method != "none":
            if section.correlated_height and heights:
                # out is this step's own: its series are updated in place (no second copy)
                out = estimate_correlated_height(out, overwrite=True, devices=context.devices)
                out = out.persist() if on_workers else out
        out = point_uncertainty(out, terms).drop_vars("h2ph")
        fitted = {k: v for k, v in out.attrs.items()
                  if k.startswith(("correlated_height_", "model_"))}
        out.attrs = dict(points.attrs) | fitted
        out.attrs.pop("interferogram", None)
        out.attrs.update({
            "wavelength": float(points.attrs["wavelength"]),
            "mother_time": str(points.attrs.get("mother_time", "")),
            "reference": reference_global,
            "reference_radius": float(record.reference_radius),
            "n_reference_area": int(record.n_reference_area),
            "n_first_order": int(record.n_first_order),
            "n_first_order_kept": int(n_kept),
            "n_densified": int((out["order"].values == 2).sum()),
            "n_rejected": int(points.sizes["space"] - out.sizes["space"]),
        })
        # each point's distance from the reference point: its velocity is relative to it
        index = out["point_index"].values
        placed = point_positions(points.isel(space=np.append(index, reference_global)))
        out = out.assign_coords(reference_distance=("space", np.hypot(
            *(placed[:-1] - placed[-1]).T), {"units": "m", "long_name":
                                              "distance from the reference point"}))
        # each point's line-of-sight geometry (from selection's geocoding) travels with it
        out = out.assign_coords({name: ("space", points[name].values[index],
                                         dict(points[name].attrs))
                                 for name in POINT_GEOMETRY if name in points.coords})
        # and its kind (PS or DS) with its SHP count, where the selection found DS
        out = out.assign({name: ("space", points[name].values[index], dict(points[name].attrs))
                          for name in SCATTERER_VARIABLES if name in points.data_vars})
        # positions moved by the estimated height errors (where the orbits are known)
        out = correct_positions(out)
        if not heights:
            dropped = [str(name) for name in out.data_vars
                       if str(name).startswith("height_error")]
            out = out.drop_vars(dropped)
            out.attrs["height_term"] = "none: the stack has no baselines (h2ph)"
            logger.warning("model: no baselines in the stack: velocity and displacement only; "
                           "the results carry no height error (%s left out)",
                           ", ".join(dropped))
        if on_workers:  # computed once, and kept there for whoever reads or writes it
            out = out.persist()
        return with_cf_attributes(validate(out, "points"))


def counts(result: xr.Dataset) -> dict[str, Any]:
    """The result's points, first-order and densified; the reference point, logged."""
    counted = {"points": int(result.sizes["space"])}
    if "order" in result:
        order = result["order"].values
        counted |= {"first_order": int((order == 1).sum()),
                    "densified": int((order == 2).sum())}
    if "reference" in result.attrs and "point_index" in result.variables:
        where = np.flatnonzero(result["point_index"].values == int(result.attrs["reference"]))
        if where.size:
            logger.info("chain: reference point is point_index %d (azimuth %d, range %d)",
                        int(result.attrs["reference"]), int(result["azimuth"].values[where[0]]),
                        int(result["range"].values[where[0]]))
    return counted
