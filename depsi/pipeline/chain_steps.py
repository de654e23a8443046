"""The PS chain's steps: each a function of its input products and the config sections it
declares in :data:`depsi.pipeline.steps.STEPS`, calling the science of :mod:`depsi.processing`.

:func:`~depsi.pipeline.chain.run_ps_chain` runs them in memory and ``depsi run``
(:func:`~depsi.pipeline.runner.run_pipeline`) with a checkpoint after each; both go through
the same table, so they compute the same result.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import dask
import dask.array as da
import numpy as np
import xarray as xr

from depsi.conventions import wrap_phase
from depsi.io.cf import with_cf_attributes
from depsi.io.geometry import POINT_GEOMETRY, correct_positions
from depsi.kernels.backend import Device, single_threaded_blas
from depsi.pipeline.steps import EDGE
from depsi.processing.arcs import estimate_arcs, heights_resolvable
from depsi.processing.atmosphere import estimate_atmosphere, terrain_heights
from depsi.processing.correlated_height import estimate_correlated_height
from depsi.processing.datum import apply_reference_area, remove_reference_noise
from depsi.processing.densification import densify
from depsi.processing.integration import (
    ArcObservations,
    arc_observations,
    empty_observations,
    fill_observations,
    integrate_network,
    refit_points,
)
from depsi.processing.model import fit_with_atmosphere, point_uncertainty
from depsi.processing.network import (
    ARC_CHUNK,
    NetworkConfig,
    arcs_from_edges,
    first_order_indices,
    network_edges,
    point_positions,
    worker_threads,
)
from depsi.processing.results import RESULT_VARIABLES, merged_in_input_order, result_view
from depsi.processing.scatterers import SCATTERER_VARIABLES
from depsi.processing.temporal_model import (
    TemporalModel,
    fit_terms_with_atmosphere,
    refit_with_terms,
    temporal_model,
)
from depsi.stm.dask_tools import (
    computed_in_place,
    culled_rows,
    gathered_by_chunk,
    page_out,
    pageable,
    pageable_copy,
    release_memory,
    rows_kept_on_workers,
    spilled_if_large,
    workers_client,
)
from depsi.stm.schema import validate

if TYPE_CHECKING:
    from depsi.pipeline.chain_config import ChainConfig

logger = logging.getLogger(__name__)

#: Arcs estimated at a time by :func:`observations_step`: the arc STM of one batch (about 750
#: bytes per arc at 60 epochs) in several chunks, so every thread has work. A multiple of
#: ``ARC_CHUNK``, so the periodogram sees the chunks of the whole arc STM and the values are
#: those of :func:`arcs_step` bit for bit (a GEMM's rounding depends on its block's shape).
ARC_BATCH = 4 * ARC_CHUNK


Devices = Sequence[Device | str | int] | None

#: The attribute of a chain step's product that holds its :class:`ChainRecord`.
RECORD_ATTR = "depsi_chain"


@dataclass(frozen=True)
class ChainRecord:
    """What a chain step's product tells the steps after it besides its variables: the size
    and kind of the first-order network and, once integrated, its datum. The one channel
    between steps outside the variables, stored as one attribute so that a product on disk
    carries it too.

    Attributes
    ----------
    n_first_order
        First-order points chosen by the network step.
    network_method
        How their arcs were formed (``network.method``).
    reference
        The reference point, an index into the product's own space (after integration).
    reference_radius, n_reference_area
        The reference area: its radius in metres and its number of points (after the
        atmosphere step, which fixes the datum).
    """

    n_first_order: int
    network_method: str
    reference: int | None = None
    reference_radius: float | None = None
    n_reference_area: int | None = None

    @classmethod
    def of(cls, product: xr.Dataset, step: str) -> ChainRecord:
        """The record of a chain product, read by ``step``."""
        data = product.attrs.get(RECORD_ATTR)
        if not isinstance(data, dict) or set(data) != {f for f in cls.__dataclass_fields__}:
            raise ValueError(f"{step}: expected the product of the step before it, with its "
                             f"record attrs[{RECORD_ATTR!r}], found {data!r}")
        return cls(**data)

    def on(self, product: xr.Dataset) -> xr.Dataset:
        """``product`` carrying this record (its attributes are a new dict)."""
        product.attrs = {**product.attrs, RECORD_ATTR: asdict(self)}
        return product


#: Fancy indexing of points read from a store keeps each variable's chunks (split by itemsize,
#: the variables of one block would disagree, and the steps' map_blocks need them equal).
UNSPLIT_CHUNKS = {"array.slicing.split_large_chunks": False}

def prepare_points(ps_stm: xr.Dataset) -> xr.Dataset:
    """The chain's input points: single-mother interferograms (formed from ``complex`` when
    the STM holds SLC values) with ``point_index`` (position along the input's space)."""
    points = ps_stm
    if "complex" in points and (("phase" not in points) or "interferogram" not in points.attrs):
        # SLC values (e.g. straight from ps_selection, whose ``phase`` is the SLC phase):
        # form single-mother interferograms first
        from depsi.processing.interferogram import single_mother_interferograms

        points = single_mother_interferograms(points)
    validate(points, "points", require=("phase", "h2ph"), require_wavelength=True)
    return points.assign_coords(point_index=("space", np.arange(points.sizes["space"])))


def _not_first_order(reference: int) -> ValueError:
    return ValueError(f"integration.reference: point {reference} is not among the "
                      f"first-order points; choose one with low amplitude dispersion")


def _with_edges(points: xr.Dataset, section: NetworkConfig, *, second_pass: bool = False
                ) -> xr.Dataset:
    """``points`` with the arcs of ``section`` among them (``edge_source``, ``edge_target``);
    with ``second_pass`` those of its ``second_pass_k``."""
    k = section.k if not second_pass or section.second_pass_k is None else section.second_pass_k
    source, target = network_edges(point_positions(points), method=section.method, k=k,
                                   n_sectors=section.n_sectors, max_length=section.max_length)
    # held by the driver from the network to the atmosphere step: large, in a file's pages,
    # which the whole network's factorisation lets go (depsi.stm.dask_tools.page_out)
    return points.assign({"edge_source": (EDGE, pageable_copy(source)),
                          "edge_target": (EDGE, pageable_copy(target))})


def check_config(points: xr.Dataset, config: ChainConfig) -> np.ndarray:
    """Refuse, before any work, settings the points cannot meet; the first-order indices."""
    section = config.network
    chosen = first_order_indices(points, first_order=section.first_order,
                                 max_dispersion=section.max_dispersion,
                                 cell_size=section.cell_size,
                                 ds_first_order=section.ds_first_order)
    reference = config.integration.reference
    if reference is not None and not np.isin(int(reference), chosen):
        raise _not_first_order(reference)
    _terms(config, points)  # the model's terms at the points' epochs, before any arc
    if config.atmosphere.method != "none":  # a stratified part on: the points' heights
        terrain_heights(points, config.atmosphere.stratified)
    return chosen


@single_threaded_blas()
def network_step(points: xr.Dataset, config: ChainConfig) -> xr.Dataset:
    """The first-order points (computed) and the arcs between them.

    Returns
    -------
    xarray.Dataset
        The first-order point STM (``point_index`` into the chain's input) with the arcs as
        ``edge_source``, ``edge_target`` (dim ``edge``, indices into its space).
    """
    chosen = check_config(points, config)
    release_memory()
    first = points.isel(space=chosen)
    client = workers_client()
    # on a cluster a chunk at a time into this process: not concatenated on one worker
    first = first.compute() if client is None else gathered_by_chunk(first, client)
    network = _with_edges(first, config.network)
    record = ChainRecord(n_first_order=int(len(chosen)), network_method=config.network.method)
    return with_cf_attributes(record.on(network))


def _network_points(network: xr.Dataset) -> xr.Dataset:
    return network.drop_dims(EDGE) if EDGE in network.dims else network


def _terms(config: ChainConfig, product: xr.Dataset) -> TemporalModel:
    """The regressors of ``model.terms`` at the epochs of ``product``."""
    return temporal_model(config.model, product["time"].values)


def _searched(config: ChainConfig, product: xr.Dataset, step: str) -> dict[str, tuple]:
    """The terms ``step``'s periodogram searches (``model.arcs`` or ``model.densification``;
    null: every term), as the kernel's ``extra_regressors``."""
    return _terms(config, product).search(getattr(config.model, step),
                                          float(product.attrs["wavelength"]))


@single_threaded_blas()
def arcs_step(network: xr.Dataset, config: ChainConfig, *, devices: Devices = None,
              compute: bool = True) -> xr.Dataset:
    """Every arc of the network estimated by the periodogram (computed arc STM; with
    ``compute=False`` lazy, for writing to a store chunk by chunk as ``depsi run`` does: from
    a network read lazily from its store, no variable of the arc STM is then ever whole in
    memory)."""
    points = _network_points(network)
    arcs = arcs_from_edges(points, network["edge_source"].values,
                           network["edge_target"].values)
    arcs.attrs["network_method"] = ChainRecord.of(network, "arcs").network_method
    section = config.arcs
    estimated = estimate_arcs(arcs, height_range=section.height_range,
                              velocity_range=section.velocity_range,
                              height_step=section.height_step,
                              velocity_step=section.velocity_step, devices=devices,
                              extra_regressors=_searched(config, points, "arcs"))
    # only the estimates are computed, each into one array: the arcs' phase and h2ph (in
    # memory already) are not copied again, and no chunk list is concatenated
    new = [name for name in estimated.data_vars if name not in arcs.data_vars]
    if not compute:
        return with_cf_attributes(
            arcs.assign(estimated[new].data_vars).assign_attrs(estimated.attrs))
    return with_cf_attributes(
        arcs.assign(computed_in_place(estimated[new])).assign_attrs(estimated.attrs))


def lazy_arcs_step(network: xr.Dataset, config: ChainConfig, *, devices: Devices = None
                   ) -> xr.Dataset:
    """:func:`arcs_step` uncomputed, as ``depsi run`` writes it to its store chunk by chunk."""
    return arcs_step(network, config, devices=devices, compute=False)


@single_threaded_blas()
def observations_step(network: xr.Dataset, config: ChainConfig, *, devices: Devices = None
                      ) -> ArcObservations:
    """Every arc of the network estimated by the periodogram, as integration's observations.

    The values of ``arc_observations(points, arcs_step(network, config))``, made
    :data:`ARC_BATCH` arcs at a time: each batch's arc STM (phase, h2ph, ambiguity) is formed,
    estimated on the active scheduler and turned into its rows of the observations, then let
    go, so the whole arc STM is never in memory.
    """
    release_memory()
    # in memory once (the first-order points), not read
    # again by every batch where the network comes lazily from a store; no copy if it is
    points = _network_points(network).compute()
    source = np.asarray(network["edge_source"].values, dtype=np.int64)
    target = np.asarray(network["edge_target"].values, dtype=np.int64)
    positions = point_positions(points)
    height = heights_resolvable(points["h2ph"])  # decided once, for every batch
    section = config.arcs
    searched = _searched(config, points, "arcs")
    # the right-hand sides as the points' phases and the arcs' cycles (a quarter of the array)
    observations = empty_observations(source, target, points.sizes["time"],
                                      points["phase"].transpose("space", "time").values)
    for start in range(0, len(source), ARC_BATCH):
        rows = slice(start, start + ARC_BATCH)
        arcs = arcs_from_edges(points, source[rows], target[rows], positions)
        estimated = estimate_arcs(arcs, height_range=section.height_range,
                                  velocity_range=section.velocity_range,
                                  height_step=section.height_step,
                                  velocity_step=section.velocity_step, devices=devices,
                                  height=height, extra_regressors=searched)
        new = [name for name in estimated.data_vars if name not in arcs.data_vars]
        # the arcs' phases are arcs_from_edges's of these points: rows need no check
        fill_observations(observations, start, arcs.assign(computed_in_place(estimated[new])),
                          formed_here=True)
        logger.info("arcs: %d of %d estimated", min(start + ARC_BATCH, len(source)),
                    len(source))
    return observations


def _local_reference(points: xr.Dataset, reference: int | None) -> int | None:
    if reference is None:
        return None
    found = np.flatnonzero(points["point_index"].values == int(reference))
    if not found.size:
        raise _not_first_order(reference)
    return int(found[0])


#: Farthest (m) the point chosen by ``reference_lonlat`` may lie when no radius is configured.
REFERENCE_SEARCH_METRES = 100.0


def _reference_by_position(points: xr.Dataset, lonlat: tuple[float, float],
                           radius: float | None) -> int:
    """The first-order point nearest to ``lonlat`` (local index), within ``radius`` metres."""
    if not {"lat", "lon"} <= set(points.variables):
        raise ValueError("integration.reference_lonlat: expected points with lat/lon "
                         "(geocoded from the orbits or given by the product), found none")
    lon0, lat0 = lonlat
    lat = np.deg2rad(np.asarray(points["lat"].values, np.float64))
    lon = np.deg2rad(np.asarray(points["lon"].values, np.float64))
    # haversine on the mean Earth radius: metres, good to 0.5 % for the distances that matter
    dlat, dlon = lat - np.deg2rad(lat0), lon - np.deg2rad(lon0)
    a = np.sin(dlat / 2) ** 2 + np.cos(lat) * np.cos(np.deg2rad(lat0)) * np.sin(dlon / 2) ** 2
    distance = 2 * 6_371_008.8 * np.arcsin(np.sqrt(np.clip(a, 0, 1)))
    nearest = int(np.nanargmin(distance))
    limit = radius if radius else REFERENCE_SEARCH_METRES
    if not distance[nearest] <= limit:
        raise ValueError(f"integration.reference_lonlat: expected a first-order point within "
                         f"{limit:g} m of lon {lon0}, lat {lat0}, found the nearest "
                         f"{distance[nearest]:.0f} m away (point_index "
                         f"{int(points['point_index'].values[nearest])})")
    logger.info("reference: point_index %d, %.1f m from lon %g, lat %g",
                int(points["point_index"].values[nearest]), distance[nearest], lon0, lat0)
    return nearest


@single_threaded_blas()
def integration_step(network: xr.Dataset, arcs: xr.Dataset | ArcObservations,
                     config: ChainConfig) -> xr.Dataset:
    """The network solution with arc testing: every first-order point, ``in_network`` kept.

    ``arcs``: those of :func:`observations_step` (as :func:`run_ps_chain` gives them), or the
    arc STM of :func:`arcs_step`. Given the only reference to an arc STM, it is freed once its
    observations are made, before the network is solved."""
    release_memory()
    points = _network_points(network)
    record = ChainRecord.of(network, "integration")
    if not isinstance(arcs, ArcObservations):
        arcs = arc_observations(points, arcs)  # rebinding drops this frame's arc STM
    section = config.integration
    reference = (_local_reference(points, section.reference)
                 if section.reference_lonlat is None
                 else _reference_by_position(points, section.reference_lonlat,
                                             section.reference_radius))
    searched = {name: values for name, (values, *_) in
                _searched(config, points, "arcs").items()}
    result = integrate_network(points, arcs, reference=reference,
                               min_coherence=section.min_coherence, alpha=section.alpha,
                               max_iterations=section.max_iterations, regressors=searched)
    # with model terms, the points' motion as the whole model (the atmosphere's residual and
    # densification's local reference read it)
    result = refit_with_terms(result, _terms(config, result))
    record = replace(record, reference=int(result.attrs["reference"]))
    return with_cf_attributes(record.on(result))


def atmosphere_step(network: xr.Dataset, first: xr.Dataset, config: ChainConfig, *,
                    devices: Devices = None) -> xr.Dataset:
    """The screen from the first pass, a second network pass on corrected phases, then the
    reference point's noise and the reference area (``method: none``: only the latter two)."""
    # BLAS at one thread: a block, not the decorator, whose wrapper would hold the
    # arguments this step lets go
    with single_threaded_blas():
        section = config.atmosphere
        points = _network_points(network)
        record = ChainRecord.of(first, "atmosphere")
        terms = _terms(config, first)
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
                corrected = _corrected_points(points, keep,
                                              lambda rows: parked.rows("aps", rows.start,
                                                                       rows.stop))
            else:
                corrected = _corrected_points(points, keep, lambda rows: aps[rows])
            # the network's points (given the only reference) are not read again: their
            # phases, h2ph and arcs go before the second pass (0.9 GB at 10^7 points)
            del points, network
            if unwrapped is not None:
                result = refit_points(corrected, unwrapped, local)
                result.attrs = {**first_attrs, **result.attrs, "second_pass": "refit"}
                del unwrapped
            else:
                observations = observations_step(_with_edges(corrected, config.network,
                                                             second_pass=True), config,
                                                 devices=devices)
                integration = config.integration
                searched = {name: values for name, (values, *_) in
                            _searched(config, corrected, "arcs").items()}
                result = integrate_network(corrected, observations, reference=local,
                                           min_coherence=integration.min_coherence,
                                           alpha=integration.alpha,
                                           max_iterations=integration.max_iterations,
                                           regressors=searched)
                result.attrs["second_pass"] = "network"
                del observations
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


#: Points a block of :func:`_corrected_points`.
CORRECTED_BLOCK = 65536


def _corrected_points(points: xr.Dataset, keep: np.ndarray, aps_rows) -> xr.Dataset:
    """``points`` at ``keep`` with their phases corrected by the screen (``aps_rows(rows)``:
    the screen's rows of ``keep[rows]``, a slice), float32, and their h2ph: both
    :func:`~depsi.stm.dask_tools.pageable` (the second pass holds them through its whole
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


#: What densification reads of the first pass (besides positions and ``point_index``).
DENSIFY_READS = ("unwrapped_phase", "velocity", "height_error", "h2ph", "reference_phase",
                 "aps_observed", "stratified_rate", "in_network")


def _kept(first: xr.Dataset, names: tuple[str, ...]) -> xr.Dataset:
    """The points kept by the network, with only the variables ``names`` (those present):
    a step copies what it reads, not the whole first pass; nothing where every point is kept
    (after the atmosphere's second pass, as a rule: 1.3 GB of series at 10^7 points)."""
    kept = first[[name for name in names if name in first.data_vars]]
    in_network = first["in_network"].values
    return kept if in_network.all() else kept.isel(space=np.flatnonzero(in_network))


@single_threaded_blas()
def densification_step(points: xr.Dataset, first: xr.Dataset, config: ChainConfig, *,
                       devices: Devices = None) -> xr.Dataset:
    """Every point not kept in the network, estimated against the local reference of its
    nearest first-order points; the accepted ones, as result variables with ``order`` 2."""
    with dask.config.set(UNSPLIT_CHUNKS):
        return _densified(points, first, config, devices)


def _densified(points: xr.Dataset, first: xr.Dataset, config: ChainConfig,
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
    terms = _terms(config, first)
    first_kept = _kept(first, DENSIFY_READS + terms.columns)
    section, arcs = config.densification, config.arcs
    dense = densify(points.isel(space=others), first_kept, k=section.k,
                    max_distance=section.max_distance, min_coherence=section.min_coherence,
                    height_range=arcs.height_range, velocity_range=arcs.velocity_range,
                    height_step=arcs.height_step, velocity_step=arcs.velocity_step,
                    devices=devices, regressors=terms.regressors,
                    extra_regressors=_searched(config, first, "densification"))
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


def _accepted_by_chunk(dense: xr.Dataset, bounds: np.ndarray, out: dict):
    """Each space chunk of ``dense`` (``bounds``: the chunks' edges) computed, and its
    accepted rows written into ``out`` (name to ``(dims, array)`` over every row of
    ``dense``) from the chunk's first row on; yields ``(first row, accepted rows)`` per chunk
    in chunk order, each once its rows are written. Under the threaded scheduler each chunk is
    a task of this process's threads, its own graph only (:func:`culled_rows`) run by the
    synchronous scheduler in its thread, at most two chunks a thread ahead of the one yielded
    (no barrier between batches of chunks, whose slowest chunk held the others' threads idle;
    the rows are written, their pages first touched, on every thread); under another
    scheduler, one chunk at a time through it."""
    from concurrent.futures import ThreadPoolExecutor

    import dask.threaded
    from dask.base import get_scheduler

    threaded = get_scheduler(collections=[dense]) is dask.threaded.get

    def written(chunk: int) -> tuple[int, int]:
        rows = slice(int(bounds[chunk]), int(bounds[chunk + 1]))
        part = result_view(culled_rows(dense, rows).compute(
            **({"scheduler": "sync"} if threaded else {})), order=2, keep=("accepted",))
        keep = np.flatnonzero(part["accepted"].values)
        for name, (dims, values) in out.items():
            values[rows.start:rows.start + keep.size] = part[name].transpose(*dims).values[keep]
        return rows.start, keep.size

    chunks = range(len(bounds) - 1)
    if not threaded:
        yield from map(written, chunks)
        return
    ahead = 2 * max(1, worker_threads())
    with ThreadPoolExecutor(max_workers=max(1, worker_threads())) as pool:
        pending = [pool.submit(written, chunk) for chunk in chunks[:ahead]]
        for chunk in chunks:
            done = pending.pop(0).result()
            if chunk + ahead < len(chunks):
                pending.append(pool.submit(written, chunk + ahead))
            yield done


def model_step(points: xr.Dataset, first: xr.Dataset, dense: xr.Dataset, config: ChainConfig,
               *, devices: Devices = None) -> xr.Dataset:
    """The result STM: first-order and densified points in the input's order, velocity and
    height fitted with the atmosphere, and the atmosphere's leak into heights removed."""
    with single_threaded_blas(), dask.config.set(UNSPLIT_CHUNKS):  # as in atmosphere_step
        page_out()  # (the first pass's pageable series: read back as the merge needs them)
        first_kept = _kept(first, RESULT_VARIABLES + ("in_reference_area",))
        record = ChainRecord.of(first, "model")
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
            # the densified points are on the workers (densification_step): so is every
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
        terms = _terms(config, out)
        # a stack without baselines (h2ph zero everywhere): no height in the model or results
        heights = heights_resolvable(out["h2ph"])
        if terms:  # every method: aps is zero without one
            out = fit_terms_with_atmosphere(out, terms, choice=config.model.choice,
                                            alpha=config.model.alpha)
        elif section.method != "none":
            out = fit_with_atmosphere(out, devices=devices)
        # on the workers, each stage's series are computed once and kept there for the next
        # (which reads them several times: the kriging's sample, its field, the uncertainty)
        out = out.persist() if on_workers else out
        if section.method != "none":
            if section.correlated_height and heights:
                # out is this step's own: its series are updated in place (no second copy)
                out = estimate_correlated_height(out, overwrite=True)
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
            dropped = [name for name in out.data_vars if name.startswith("height_error")]
            out = out.drop_vars(dropped)
            out.attrs["height_term"] = "none: the stack has no baselines (h2ph)"
            logger.warning("model: no baselines in the stack: velocity and displacement only; "
                           "the results carry no height error (%s left out)",
                           ", ".join(dropped))
        if on_workers:  # computed once, and kept there for whoever reads or writes it
            out = out.persist()
        return with_cf_attributes(validate(out, "points"))


