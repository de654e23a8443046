"""The densification step: every point not kept in the network, estimated against the local
reference of its nearest first-order points; the accepted ones, gathered a chunk at a time."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import xarray as xr

from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline.steps import ConfigView, Inputs, StepContext
from depsi.pipeline.steps.shared import (
    UNSPLIT_CHUNKS,
    Devices,
    kept_points,
    model_terms,
    searched_terms,
)
from depsi.processing.densification import densify
from depsi.processing.network import worker_threads
from depsi.processing.results import result_view
from depsi.stm.dask_tools import culled_rows, rows_kept_on_workers
from depsi.stm.runtime import (
    in_order_on_threads,
    page_out,
    release_memory,
    runs_on_threads,
    workers_client,
)

logger = logging.getLogger(__name__)

#: What densification reads of the first pass (besides positions and ``point_index``).
DENSIFY_READS = ("unwrapped_phase", "velocity", "height_error", "h2ph", "reference_phase",
                 "aps_observed", "stratified_rate", "in_network")


@single_threaded_blas()
def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """Every point not kept in the network, estimated against the local reference of its
    nearest first-order points; the accepted ones, as result variables with ``order`` 2."""
    with dask.config.set(UNSPLIT_CHUNKS):
        return _densified(inputs["selection"], inputs["atmosphere"], config, context.devices)


def _densified(points: xr.Dataset, first: xr.Dataset, config: ConfigView,
               devices: Devices) -> xr.Dataset:
    release_memory()
    # the first pass's pageable series leave memory: the table reads back those it needs
    page_out()
    # the points outside the network, by a mask (np.setdiff1d's hash-based unique is slow with
    # NumPy 2.4; docs/benchmarks.md, "Array operations")
    outside = np.ones(points.sizes["space"], dtype=bool)
    outside[first["point_index"].values[first["in_network"].values]] = False
    others = np.flatnonzero(outside)
    if not others.size:
        return with_cf_attributes(result_view(first.isel(space=slice(0, 0)), order=2))
    terms = model_terms(config, first)
    first_kept = kept_points(first, DENSIFY_READS + terms.columns)
    section, arcs = config.densification, config.arcs
    dense = densify(points.isel(space=others), first_kept, k=section.k,
                    max_distance=section.max_distance, min_coherence=section.min_coherence,
                    height_range=arcs.height_range, velocity_range=arcs.velocity_range,
                    height_step=arcs.height_step, velocity_step=arcs.velocity_step,
                    devices=devices, regressors=terms.regressors,
                    extra_regressors=searched_terms(config, first, "densification"))
    del first_kept  # each chunk's task holds its own neighbours' rows
    page_out()  # (the table is made: the first pass's series are not read again here)
    if workers_client() is not None:
        # on a cluster the accepted points stay on the workers, chunk by chunk: this process
        # receives the accepted flags alone (docs/hpc.md, "The driver")
        accepted, _ = rows_kept_on_workers(
            result_view(dense, order=2, keep=("accepted",)), "accepted")
        logger.info("densification: %d of %d candidates accepted (on the workers)",
                    accepted.sizes["space"], others.size)
        return with_cf_attributes(accepted)
    # a chunk a task on this process's threads (each chunk's graph run by its own thread, no
    # barrier between batches of chunks), each chunk's accepted points written by that thread
    # into arrays sized for every candidate, at the chunk's own rows, then moved down to the
    # accepted rows before them, in chunk order: memory follows the chunk size and the
    # result (at most twice the accepted rows' pages touched), with no list of parts
    # concatenated at the end
    template = result_view(dense.isel(space=slice(0, 0)), order=2)
    out = {name: (var.dims, np.empty((others.size,) + var.shape[1:], var.dtype))
           for name, var in template.variables.items() if "space" in var.dims}
    bounds = np.cumsum((0,) + dense.chunks["space"])
    count = 0
    for start, size in _accepted_by_chunk(dense, bounds, out):
        if start != count:  # the rows before are written: no other thread writes here
            for _, values in out.values():
                values[count:count + size] = values[start:start + size]
        count += size
    space = {name: (dims, values[:count]) for name, (dims, values) in out.items()}
    accepted = xr.Dataset({name: space[name] for name in template.data_vars},
                          coords={name: space.get(name, template[name].variable)
                                  for name in template.coords}, attrs=template.attrs)
    logger.info("densification: %d of %d candidates accepted", count, others.size)
    return with_cf_attributes(accepted)


def _accepted_by_chunk(dense: xr.Dataset, bounds: np.ndarray, out: dict
                       ) -> Iterator[tuple[int, int]]:
    """Each space chunk of ``dense`` (``bounds``: the chunks' edges) computed, and its
    accepted rows written into ``out`` (name to ``(dims, array)`` over every row of
    ``dense``) from the chunk's first row on; yields ``(first row, accepted rows)`` per chunk
    in chunk order, each once its rows are written. Under the threaded scheduler each chunk is
    a task of this process's threads, its own graph only (:func:`culled_rows`) run by the
    synchronous scheduler in its thread, at most two chunks a thread ahead of the one yielded
    (no barrier between batches of chunks, whose slowest chunk held the others' threads idle;
    the rows are written, their pages first touched, on every thread); under another
    scheduler, one chunk at a time through it."""
    threaded = runs_on_threads(dense)

    def written(chunk: int) -> tuple[int, int]:
        rows = slice(int(bounds[chunk]), int(bounds[chunk + 1]))
        part = result_view(culled_rows(dense, rows).compute(
            **({"scheduler": "sync"} if threaded else {})), order=2, keep=("accepted",))
        keep = np.flatnonzero(part["accepted"].values)
        for name, (dims, values) in out.items():
            # gathered straight into the rows (a fancy index would copy them first; take's
            # "clip" mode writes into out unbuffered, the indices being valid)
            np.take(part[name].transpose(*dims).values, keep, axis=0, mode="clip",
                    out=values[rows.start:rows.start + keep.size])
        return rows.start, keep.size

    chunks = range(len(bounds) - 1)
    if not threaded:
        yield from map(written, chunks)
        return
    yield from in_order_on_threads(written, chunks, threads=worker_threads())


def counts(product: xr.Dataset) -> dict[str, Any]:
    """The densified points accepted."""
    return {"accepted": int(product.sizes["space"])}
