"""Distributed scatterers beside the persistent ones: the DS pixels of a stack as points of a
point STM (:func:`ds_selection`), and PS and DS in one point STM for the chain
(:func:`merge_scatterers`), each point flagged by ``scatterer`` with its SHP count.

A DS point's signal is its linked phase
(:func:`depsi.processing.distributed_scatterers.phase_linking`) with the amplitude of its SHP's
mean intensity: ``complex = sqrt(shp_intensity) exp(j phase)``, so the chain forms its
interferograms as it does a PS's. Its ``amplitude_dispersion`` is NaN: the
first-order network is chosen by amplitude dispersion among the PS (NaN is never chosen), and a
DS is densified against it (see docs/steps/distributed.md for why).
"""

from __future__ import annotations

import logging
from enum import IntEnum
from typing import Any, Final, Literal, cast

import dask
import dask.array as da
import numpy as np
import xarray as xr
from pydantic import Field, field_validator

from depsi.geometry import POSITIONS_ATTR, geocode_points
from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import batch_size, single_threaded_blas
from depsi.kernels.phase_linking import (
    DEFAULT_ALPHA,
    METHODS,
    cramer_rao_bound,
    gather_neighbours,
    link_ministack,
    phase_linking_bytes_per_pixel,
    window_offsets,
)
from depsi.processing.distributed_scatterers import (
    DEFAULT_MIN_LOOKS,
    DEFAULT_WINDOW,
    check_ministack,
    n_compressed,
    phase_linking,
    resolve_max_compressed,
    select_shp,
)
from depsi.sections import Section
from depsi.stm.order import morton_order
from depsi.stm.schema import STMValidationError, validate

logger = logging.getLogger(__name__)


class Scatterer(IntEnum):
    """Values of the ``scatterer`` flag (int8, CF ``flag_values``/``flag_meanings``)."""

    PS = 0
    DS = 1


#: dtype and CF attributes of the ``scatterer`` variable.
SCATTERER_DTYPE = np.int8
SCATTERER_ATTRS = {
    "flag_values": np.array([s.value for s in Scatterer], dtype=SCATTERER_DTYPE),
    "flag_meanings": " ".join(s.name.lower() for s in Scatterer),
    "long_name": "kind of scatterer: persistent (ps) or distributed (ds)",
    "units": "1",
}

#: Phase linking of the DS points: EMI, 1.04-1.30x the Cramér-Rao bound on the simulated DS
#: stacks where EVD is at 1.15-1.34x (docs/steps/distributed.md).
DEFAULT_DS_METHOD: Final = "emi"

#: A DS candidate becomes a DS point when the temporal coherence of its linked phase (against
#: its sample coherence phases) reaches this. Measured on decorrelated pixels (no signal at all):
#: at most 0.48 with 20 looks and 30 epochs (EMI and EVD), 0.37 with 121 looks, lower with more
#: epochs; DS of the default coherence model (0.7 short-term, 0.2 long-term) reach 0.86-0.99.
DEFAULT_MIN_TEMPORAL_COHERENCE = 0.6

#: The pre-screen before phase linking: a candidate is linked only when the mean magnitude of its
#: SHP-averaged interferograms of consecutive epochs is above the mean that pixels with no
#: coherence reach by this many of its standard deviations
#: (:func:`depsi.kernels.phase_linking.short_lag_noise_threshold`): 0.26 at 20 looks and 30
#: epochs, 0.10 at 121 looks. DS accepted at temporal coherence 0.6, in nine coherence models
#: (``g0`` 0.4-0.9, ``g_inf`` 0-0.4) and 20-121 looks, had 0.27 or more
#: (docs/steps/distributed.md).
DEFAULT_PRESCREEN_SIGMAS = 3.0

#: Phase linking all epochs at once (None) or mini-stack by mini-stack: the sequential estimator
#: keeps a task's matrices at ``(K + M)^2`` instead of ``T^2``, at an accuracy measured equal
#: within the noise (docs/steps/distributed.md); all at once stays the default, the result
#: every earlier run gave.
DEFAULT_MINISTACK = None

#: With mini-stacks, the compressed SLCs a mini-stack is linked beside, at most: the first (the
#: datum's) and the latest ones, so that a task's matrices and looks stop growing with the
#: epochs (dolphin caps them too, its ``max_num_compressed``). ``"auto"``: enough to summarise
#: about 45 epochs (:func:`depsi.processing.distributed_scatterers.resolve_max_compressed`: 3 for
#: mini-stacks of 15, 9 for 5), about 1 % of phase RMSE at 120 epochs whatever the mini-stack
#: (docs/steps/distributed.md); with mini-stacks of 15 the traced peak 1.24x from 30 to 120
#: epochs against 1.54x with every compressed SLC, and 1.09x from 60 to 240.
DEFAULT_MAX_COMPRESSED: Final = "auto"

#: The DS product's state for :func:`update_ds_selection` (with mini-stacks): the compressed
#: SLCs per look and the SHP mask, ``(space, shp_cell[, compressed_slc])``; a merged product
#: drops them.
STATE_VARIABLES = ("ds_compressed", "ds_shp", "ds_update_coherence")

#: Point variables of the selection that the chain's result carries to the exports.
SCATTERER_VARIABLES = ("scatterer", "shp_count", "linked_coherence")


class DSConfig(Section):
    """Distributed scatterers beside the PS: SHP selection, phase linking, acceptance."""

    enabled: bool | Literal["auto"] = Field(
        "auto", description="Add distributed scatterers (DS) to the PS: pixels with enough "
                            "statistically homogeneous pixels (SHP), their phase linked over "
                            "them. auto: only where the amplitudes cannot separate the pixels "
                            "(selection fell back to the phase) or the input is "
                            "interferograms; elsewhere the points are the PS alone.")
    window: tuple[int, int] = Field(
        DEFAULT_WINDOW, description="SHP search window [azimuth, range] in pixels, odd sizes: "
                                    "at most window[0] x window[1] looks per DS.")
    alpha: float = Field(
        DEFAULT_ALPHA, gt=0, lt=1,
        description="False-alarm rate of the SHP test (GLRT on the mean intensity): the share "
                    "of truly homogeneous neighbours rejected.")
    min_looks: int = Field(
        DEFAULT_MIN_LOOKS, ge=2,
        description="SHP (the pixel included) a pixel needs to be a DS candidate.")
    method: Literal["emi", "evd"] = Field(
        DEFAULT_DS_METHOD, description="Phase linking: emi (eigendecomposition-based maximum "
                                       "likelihood) or evd (largest eigenvector).")
    min_temporal_coherence: float = Field(
        DEFAULT_MIN_TEMPORAL_COHERENCE, ge=0, lt=1,
        description="A DS candidate is kept when the temporal coherence of its linked phase "
                    "reaches this (decorrelated pixels stay below 0.5).")
    prescreen_sigmas: float | None = Field(
        DEFAULT_PRESCREEN_SIGMAS, ge=0,
        description="Pre-screen before phase linking: a candidate is linked only when the mean "
                    "coherence of its SHP between consecutive epochs is this many standard "
                    "deviations above that of pixels with no coherence at all; null: link "
                    "every candidate. Assumes coherence does not grow with the time between "
                    "epochs.")
    ministack: int | None = Field(
        DEFAULT_MINISTACK, ge=2,
        description="Link the phases mini-stack by mini-stack of this many epochs (the "
                    "sequential estimator with compressed SLCs: memory of one mini-stack, not "
                    "of every epoch); null: all epochs at once.")
    max_compressed: int | Literal["auto"] | None = Field(
        DEFAULT_MAX_COMPRESSED,
        description="With ministack: link each mini-stack beside at most this many compressed "
                    "SLCs of the earlier ones (the first and the latest), so memory stops "
                    "growing with the epochs; auto: enough to summarise about 45 epochs (3 "
                    "for mini-stacks of 15); null: all of them.")

    @field_validator("window")
    @classmethod
    def _odd_window(cls, window: tuple[int, int]) -> tuple[int, int]:
        window_offsets(window)  # odd positive sizes, or its ValueError
        return window

    @field_validator("max_compressed")
    @classmethod
    def _compressed_count(cls, max_compressed):
        check_ministack(None, max_compressed=max_compressed)  # >= 1, "auto" or None
        return max_compressed


def _check_arguments(window, alpha, min_looks, method, min_temporal_coherence,
                     prescreen_sigmas, ministack, max_compressed) -> None:
    window_offsets(window)  # odd positive sizes, or a ValueError naming the window
    if not 0 < float(alpha) < 1:
        raise ValueError(f"alpha: expected a false-alarm rate in (0, 1), found {alpha!r}")
    if int(min_looks) < 2 or int(min_looks) > int(window[0]) * int(window[1]):
        raise ValueError(f"min_looks: expected 2 .. {int(window[0]) * int(window[1])} looks "
                         f"(the window's cells), found {min_looks!r}")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, found {method!r}")
    if not 0 <= float(min_temporal_coherence) < 1:
        raise ValueError(f"min_temporal_coherence: expected a value in [0, 1), found "
                         f"{min_temporal_coherence!r}")
    if prescreen_sigmas is not None and not float(prescreen_sigmas) >= 0:
        raise ValueError(f"prescreen_sigmas: expected >= 0 standard deviations or None, found "
                         f"{prescreen_sigmas!r}")
    check_ministack(ministack, max_compressed=max_compressed)


def _accepted_block(phase, coherence, count, intensity, phase_std, candidate, *extra,
                    min_coherence, offset, with_state=False):
    """The accepted DS pixels of one block: positions and values (one block's task). With
    ``with_state`` the first two of ``extra`` are the compressed SLCs and the SHP mask."""
    keep = candidate & (coherence >= min_coherence) & np.isfinite(coherence)
    ia, ir = np.nonzero(keep)
    values = {"azimuth": ia + offset[0], "range": ir + offset[1], "phase": phase[ia, ir],
              "linked_coherence": coherence[ia, ir], "shp_count": count[ia, ir],
              "shp_intensity": intensity[ia, ir], "linked_phase_std": phase_std[ia, ir]}
    if with_state:
        compressed, shp, *extra = extra
        values |= {"compressed": compressed[ia, ir], "shp": shp[ia, ir]}
    # the stack's time series (h2ph) and (azimuth, range) coordinates at the accepted pixels
    values |= {f"extra_{k}": values_[ia, ir] for k, values_ in enumerate(extra)}
    return values, int(candidate.sum()), int((candidate & np.isfinite(coherence)).sum())


def _blocks(array, chunks):
    """``array`` (Dask) rechunked to ``chunks`` in azimuth and range (one chunk along its other
    axes), as a grid of delayed.

    Not optimised one by one: an optimised graph gets new key names, so the outputs of one
    phase-linking task, delayed separately, each ran their own copy of it (every block was
    linked four times)."""
    rechunked = array.rechunk({0: chunks[0], 1: chunks[1]}
                              | {axis: -1 for axis in range(2, array.ndim)})
    return rechunked.to_delayed(optimize_graph=False)


@single_threaded_blas()
def ds_selection(
    stack: xr.Dataset,
    *,
    window: tuple[int, int] = DEFAULT_WINDOW,
    alpha: float = DEFAULT_ALPHA,
    min_looks: int = DEFAULT_MIN_LOOKS,
    method: str = DEFAULT_DS_METHOD,
    min_temporal_coherence: float = DEFAULT_MIN_TEMPORAL_COHERENCE,
    prescreen_sigmas: float | None = DEFAULT_PRESCREEN_SIGMAS,
    ministack: int | None = DEFAULT_MINISTACK,
    max_compressed: int | str | None = DEFAULT_MAX_COMPRESSED,
    device: str | None = None,
) -> xr.Dataset:
    """Distributed scatterers of a raster stack, as a point STM beside :func:`ps_selection`'s.

    Every pixel's statistically homogeneous pixels (SHP) are found in its ``window``
    (:func:`~depsi.processing.distributed_scatterers.select_shp`); a pixel with ``min_looks``
    SHP is a DS candidate, its phase history linked from its coherence matrix over them
    (:func:`~depsi.processing.distributed_scatterers.phase_linking`), and it becomes a DS point
    when its linked phase's temporal coherence reaches ``min_temporal_coherence``. One pass over the
    stack, block by block with halos; each block's task keeps only its accepted pixels.

    Before linking, a candidate is pre-screened (``prescreen_sigmas``): it is linked only when
    the mean magnitude of its SHP-averaged interferograms of consecutive epochs (``O(T looks)``)
    is above what pixels with no coherence at all reach, by ``prescreen_sigmas`` of its
    standard deviation. On a decorrelated background this leaves out nearly every background
    pixel before its ``O(T^2 looks + T^3)`` coherence matrix, eigenproblem and bound. It assumes
    that coherence does not grow with the time between epochs, so a pixel incoherent between
    consecutive epochs is incoherent over every span and its linked phase would be rejected
    anyway (decorrelated pixels reach a temporal coherence of 0.48 at most). What it can lose:
    DS that decorrelate between consecutive epochs but stay coherent over longer spans
    (seasonal or alternating decorrelation), and, with ``min_temporal_coherence`` lowered to
    the noise's level, the noise pixels the full linking would then accept. The bound is set on
    the noise (3 standard deviations pass 0.1-0.35 % of pure-noise pixels); no DS accepted at
    0.6 in nine measured coherence models, 20-121 looks, fell under it
    (docs/steps/distributed.md).

    Parameters
    ----------
    stack
        Raster stack ``(azimuth, range, time)`` with ``complex`` and optionally ``h2ph`` and
        ``(azimuth, range)`` coordinates such as ``lat``/``lon``.
    window, alpha, min_looks
        The SHP test (:class:`DSConfig`).
    method
        ``"emi"`` or ``"evd"``.
    min_temporal_coherence
        Acceptance threshold on the linked phase's temporal coherence.
    prescreen_sigmas
        The pre-screen's margin over the noise, in standard deviations; None: every candidate
        is linked.
    ministack
        Epochs a mini-stack of the sequential estimator; None: all epochs at once. With it a
        block's batch holds the looks of one or two mini-stacks and ``(K + M)^2`` matrices
        (``K`` mini-stacks so far, ``M`` epochs each) instead of every epoch's looks and a
        ``T x T`` matrix; the acceptance is the same temporal coherence over every pair of
        epochs, formed tile by tile.
    max_compressed
        With ``ministack``: the compressed SLCs each mini-stack is linked beside, at most (the
        first and the latest); ``"auto"``: enough for about 45 epochs; None: all of the earlier
        mini-stacks'.
    device
        Where phase linking runs (``"cpu"``, ``"cuda:0"``); default the CPU.

    Returns
    -------
    xarray.Dataset
        Point STM ``(space, time)`` in Morton order: ``complex`` (``sqrt(shp_intensity)
        exp(j phase)``, complex64), ``amplitude``, ``phase`` (the linked phase, zero at the
        first epoch), ``h2ph`` (when in the stack), the stack's coordinates at the points;
        per point ``scatterer`` (all DS), ``shp_count`` (looks), ``linked_coherence`` (the
        temporal coherence of the linked phase), ``linked_phase_std`` (rad, the Cramér-Rao
        bound at the estimated coherence) and ``amplitude_dispersion`` (NaN: a DS is never a
        first-order point). Attributes: the stack's, ``n_ds``, ``n_ds_candidates``,
        ``n_ds_linked`` (the candidates the pre-screen passed) and the parameters
        (``ds_window``, ...).

    Examples
    --------
    >>> from depsi.simulate import simulate_stack
    >>> stack, truth = simulate_stack(shape=(48, 48), n_epochs=12, ds_regions=1,
    ...                               ds_region_size=20)
    >>> ds = ds_selection(stack, window=(7, 7))
    >>> ds.sizes["space"] > 200, set(ds["scatterer"].values.tolist()) == {int(Scatterer.DS)}
    (True, True)
    """
    validate(stack, kind="raster", require=("complex",))
    sizes = tuple(int(w) for w in window)
    _check_arguments(sizes, alpha, min_looks, method, min_temporal_coherence, prescreen_sigmas,
                     ministack, max_compressed)
    window = (sizes[0], sizes[1])  # two sizes, as checked
    if stack.attrs.get(POSITIONS_ATTR) == "orbits":  # geocoded at the points, as the PS are
        stack = stack.drop_vars([c for c in ("lat", "lon") if c in stack.coords])
    max_compressed = resolve_max_compressed(max_compressed, ministack)
    shp = select_shp(stack, window=window, alpha=alpha, min_looks=min_looks)
    linked = phase_linking(stack, shp, method=method, prescreen_sigmas=prescreen_sigmas,
                           ministack=ministack, max_compressed=max_compressed, device=device)
    phase = linked["phase"].data
    chunks = phase.chunks
    timed_names = [name for name in ("h2ph",) if name in stack.data_vars]
    timed = [stack[name].transpose("azimuth", "range", "time").data for name in timed_names]
    coord_names = [str(n) for n, c in stack.coords.items() if set(c.dims) == {"azimuth", "range"}]
    coords2d = [stack[name].transpose("azimuth", "range").data for name in coord_names]
    arrays = [phase] + [linked[name].data for name in (
        "temporal_coherence", "shp_count", "shp_intensity", "phase_std", "ds_candidate")]
    with_state = "compressed" in linked  # mini-stacks: what the next one continues from
    if with_state:
        arrays += [linked["compressed"].data, _dask(shp["shp"].data)]
    arrays += [_dask(a) for a in timed + coords2d]
    grids = [_blocks(a, chunks) for a in arrays]
    az_edges, rg_edges = np.cumsum((0, *chunks[0])), np.cumsum((0, *chunks[1]))
    task = dask.delayed(_accepted_block, pure=True)
    tasks = [task(*(grid[(i, j) + (0,) * (grid.ndim - 2)] for grid in grids),
                  min_coherence=float(min_temporal_coherence),
                  offset=(int(az_edges[i]), int(rg_edges[j])), with_state=with_state)
             for i in range(len(chunks[0])) for j in range(len(chunks[1]))]
    results = dask.compute(*tasks)
    parts = {key: np.concatenate([r[0][key] for r in results]) for key in results[0][0]}
    n_candidates = sum(r[1] for r in results)
    n_linked = sum(r[2] for r in results)
    points = _ds_points(stack, parts, timed_names, coord_names)
    step = (f"ds_selection(window={list(window)}, alpha={alpha}, min_looks={min_looks}, "
            f"method={method!r}, min_temporal_coherence={min_temporal_coherence}, "
            f"prescreen_sigmas={prescreen_sigmas}, ministack={ministack}, "
            f"max_compressed={max_compressed})")
    points.attrs |= {"history": f"{stack.attrs.get('history', '')}\n{step}".strip(),
                     "n_ds": int(points.sizes["space"]), "n_ds_candidates": int(n_candidates),
                     "n_ds_linked": int(n_linked),
                     "ds_window": list(window), "ds_alpha": float(alpha),
                     "ds_min_looks": int(min_looks), "ds_method": method,
                     "ds_min_temporal_coherence": float(min_temporal_coherence),
                     "shp_effective_epochs": float(shp["shp_effective_epochs"].values)}
    if prescreen_sigmas is not None:  # no attribute when off (attributes hold no None)
        points.attrs["ds_prescreen_sigmas"] = float(prescreen_sigmas)
    if ministack is not None:
        points.attrs["ds_ministack"] = int(ministack)
        if max_compressed is not None:
            points.attrs["ds_max_compressed"] = int(max_compressed)
        # what update_ds_selection continues from: the state's last epoch and the pixel grid
        points.attrs["ds_state_end"] = str(stack["time"].values[-1])
        for name in ("azimuth", "range"):
            labels = stack[name].values
            points.attrs[f"ds_raster_{name}"] = [labels[0].item(), labels[-1].item(),
                                                 int(labels.size)]
    logger.info("ds_selection: %d DS of %d candidates (%d looks or more of a %d x %d window; "
                "%d linked after the pre-screen) with linked-phase coherence >= %g",
                points.sizes["space"], n_candidates, min_looks, *window, n_linked,
                min_temporal_coherence)
    return with_cf_attributes(geocode_points(points))


def _dask(array):
    return array if isinstance(array, da.Array) else da.from_array(array)


def _ds_points(stack: xr.Dataset, parts: dict, timed_names: list, coord_names: list
               ) -> xr.Dataset:
    """The DS point STM (Morton order) from the accepted pixels' arrays."""
    order = morton_order(stack["azimuth"].values[parts["azimuth"]],
                         stack["range"].values[parts["range"]])
    parts = {key: values[order] for key, values in parts.items()}
    amplitude = np.sqrt(parts["shp_intensity"]).astype(np.float32)
    phase = parts["phase"].astype(np.float32)
    slc = (amplitude[:, None] * np.exp(1j * phase)).astype(np.complex64)
    dims = ("space", "time")
    data: dict[str, tuple[Any, ...]] = {
        "complex": (dims, slc),
        "amplitude": (dims, np.broadcast_to(amplitude[:, None], slc.shape).copy()),
        "phase": (dims, phase)}
    data |= {name: (dims, parts[f"extra_{k}"]) for k, name in enumerate(timed_names)}
    n = slc.shape[0]
    data |= {
        "amplitude_dispersion": ("space", np.full(n, np.nan, np.float32)),
        "scatterer": ("space", np.full(n, Scatterer.DS, SCATTERER_DTYPE), SCATTERER_ATTRS),
        "shp_count": ("space", parts["shp_count"].astype(np.int16),
                      {"units": "1", "long_name": "statistically homogeneous pixels (looks)"}),
        "linked_coherence": ("space", parts["linked_coherence"].astype(np.float32)),
        "linked_phase_std": ("space", parts["linked_phase_std"].astype(np.float32)),
    }
    if "compressed" in parts:  # the sequential estimator's state, for update_ds_selection
        data |= {
            "ds_compressed": (("space", "shp_cell", "compressed_slc"),
                              parts["compressed"].astype(np.complex64), {
                "long_name": "compressed SLCs the next mini-stack is linked beside"}),
            "ds_shp": (("space", "shp_cell"), parts["shp"].astype(bool), {
                "long_name": "statistically homogeneous pixels of the window"}),
            "ds_update_coherence": ("space", np.full(n, np.nan, np.float32), {
                "units": "1", "long_name": "temporal coherence of the last update's new "
                                           "epochs (NaN before any update)"})}
    coords = {"time": stack["time"].values,
              **{str(name): c.variable for name, c in stack.coords.items()
                 if c.dims == ("time",) and name != "time"},
              "azimuth": ("space", stack["azimuth"].values[parts["azimuth"]]),
              "range": ("space", stack["range"].values[parts["range"]])}
    coords |= {name: ("space", parts[f"extra_{len(timed_names) + k}"])
               for k, name in enumerate(coord_names)}
    return xr.Dataset(data, coords=coords, attrs=dict(stack.attrs))


def _fill_value(dtype: np.dtype):
    """What a point without a variable gets: NaN for numbers with one, zero or False else."""
    if dtype.kind in "fc":
        return np.nan
    return False if dtype.kind == "b" else 0


def _filled(template: xr.DataArray, n: int) -> xr.Variable:
    """A variable like ``template`` (dims, dtype, attrs) for ``n`` other points, filled."""
    shape = tuple(n if dim == "space" else size for dim, size in template.sizes.items())
    values = np.full(shape, _fill_value(template.dtype), dtype=template.dtype)
    return xr.Variable(template.dims, values, dict(template.attrs))


def merge_scatterers(ps: xr.Dataset, ds: xr.Dataset) -> xr.Dataset:
    """PS and DS in one point STM, in Morton order, each point flagged by ``scatterer``.

    A pixel that is both stays a PS (its DS point is dropped). Variables one kind has and the
    other lacks are filled on the other: NaN for numbers (``amp_sum``, ``linked_coherence``,
    ...), 0 for counts (``amp_count``; ``shp_count`` 0 on a PS, which has no SHP) and False for
    flags (``selected``: selected as a PS candidate).

    Parameters
    ----------
    ps
        :func:`~depsi.processing.selection.ps_selection`'s point STM.
    ds
        :func:`ds_selection`'s, from the same stack.

    Returns
    -------
    xarray.Dataset
        The points of both, lazy where ``ps`` is; attributes ``ps``'s with ``n_ds`` (the DS
        kept), ``n_ds_dropped`` (DS pixels that are PS) and the DS parameters.

    Examples
    --------
    >>> from depsi.processing.selection import ps_selection
    >>> from depsi.simulate import simulate_stack
    >>> stack, truth = simulate_stack(shape=(48, 48), n_epochs=12, ds_regions=1,
    ...                               ds_region_size=20)
    >>> points = merge_scatterers(ps_selection(stack), ds_selection(stack, window=(7, 7)))
    >>> sorted(set(points["scatterer"].values.tolist())), points.attrs["n_ds"] > 200
    ([0, 1], True)
    """
    for points in (ps, ds):
        validate(points, kind="points", require=("complex",))
    # the sequential estimator's state is the DS product's own (update_ds_selection)
    ds = ds.drop_vars([name for name in STATE_VARIABLES if name in ds.variables])
    if "scatterer" not in ds or (ds["scatterer"].values != Scatterer.DS).any():
        raise STMValidationError("ds: expected ds_selection's point STM (scatterer DS on every "
                                 f"point), found variables {sorted(map(str, ds.data_vars))}")
    if not np.array_equal(ps["time"].values, ds["time"].values):
        raise STMValidationError(f"ds: expected the epochs of ps ({ps.sizes['time']}), found "
                                 f"{ds.sizes['time']} different ones: select both from one stack")
    if "scatterer" in ps and (ps["scatterer"].values != Scatterer.PS).any():
        raise STMValidationError("ps: expected PS alone, found points flagged DS (merged "
                                 "already?)")
    n_rg = int(max(ps["range"].max(initial=0), ds["range"].max(initial=0))) + 1
    ps_keys = ps["azimuth"].values.astype(np.int64) * n_rg + ps["range"].values
    ds_keys = ds["azimuth"].values.astype(np.int64) * n_rg + ds["range"].values
    kept = np.flatnonzero(~np.isin(ds_keys, ps_keys))
    ds = ds.isel(space=kept)
    ps = ps.assign(scatterer=("space", np.full(ps.sizes["space"], Scatterer.PS,
                                               SCATTERER_DTYPE), SCATTERER_ATTRS))
    sides = []
    for own, other in ((ps, ds), (ds, ps)):
        n = own.sizes["space"]
        variables = {name: _filled(other[name], n)
                     for name in other.data_vars if name not in own.data_vars}
        coords = {name: _filled(other[name], n) for name in other.coords
                  if "space" in other[name].dims and name not in own.coords}
        sides.append(own.assign(variables).assign_coords(coords))
    for name in sides[0].data_vars:  # one dtype per variable (a PS's complex64 decides)
        sides[1][name] = sides[1][name].astype(sides[0][name].dtype)
    names = list(sides[0].data_vars)
    merged = xr.concat([sides[0], sides[1][names]], dim="space", data_vars="all",
                       coords="minimal", compat="override", join="exact",
                       combine_attrs="override")
    order = morton_order(merged["azimuth"].values, merged["range"].values)
    merged = merged.isel(space=order)
    ds_attrs = {k: v for k, v in ds.attrs.items() if k.startswith(("ds_", "n_ds", "shp_"))}
    merged.attrs = dict(ps.attrs) | ds_attrs | {
        "n_ds": int(kept.size), "n_ds_dropped": int(ds_keys.size - kept.size),
        "history": f"{ps.attrs.get('history', '')}\nmerge_scatterers(n_ds={kept.size})".strip()}
    logger.info("merge_scatterers: %d PS and %d DS (%d DS pixels are PS and stay PS)",
                ps.sizes["space"], kept.size, ds_keys.size - kept.size)
    return with_cf_attributes(merged)


#: ``ds_state_end`` while :func:`update_ds_selection` writes the state: a store left so by a
#: killed update is refused rather than continued from a half-written state.
_STATE_WRITING = "writing"


def _ds_state(old: xr.Dataset, path) -> int:
    """How many of the stored epochs the stored state covers (a DS product with mini-stacks),
    or a clear error."""
    missing = [name for name in STATE_VARIABLES if name not in old.data_vars]
    if "scatterer" not in old.data_vars or (old["scatterer"].values != Scatterer.DS).any():
        raise STMValidationError(f"store {str(path)!r}: expected ds_selection's DS product "
                                 "(scatterer DS on every point; a merged product drops the "
                                 "state: update the DS product, then merge)")
    if missing or "ds_ministack" not in old.attrs:
        absent = missing + ([] if "ds_ministack" in old.attrs else ["ds_ministack"])
        raise STMValidationError(
            f"store {str(path)!r}: expected the sequential estimator's state (variables "
            f"{list(STATE_VARIABLES)}, attribute ds_ministack), found {absent} missing: select "
            "with ds_selection(..., ministack=M) to update a DS product later")
    end = str(old.attrs.get("ds_state_end"))
    if end == _STATE_WRITING:
        raise ValueError(f"store {str(path)!r}: an earlier update was killed while it wrote the "
                         "compressed SLCs, so the state is neither the old nor the new one; "
                         "rerun ds_selection on the whole stack")
    times = [str(t) for t in old["time"].values]
    if end not in times:
        raise ValueError(f"store {str(path)!r}: its state ends at {end}, not a stored epoch")
    return times.index(end) + 1


def _raster_positions(stack: xr.Dataset, old: xr.Dataset, path) -> tuple[np.ndarray, ...]:
    """The points' positions in the new epochs' raster, which must be the first run's grid."""
    positions = []
    for name in ("azimuth", "range"):
        labels = stack[name].values
        first_last_size = [labels[0].item(), labels[-1].item(), int(labels.size)]
        stored = old.attrs.get(f"ds_raster_{name}")
        if stored is not None and list(stored) != first_last_size:
            raise STMValidationError(
                f"new_epochs: expected the first run's {name} grid {list(stored)} (first, last, "
                f"size), found {first_last_size}: the windows' looks must be the same pixels")
        index = np.searchsorted(labels, old[name].values)
        index = np.clip(index, 0, labels.size - 1)
        if not np.array_equal(labels[index], old[name].values):
            raise STMValidationError(f"new_epochs: expected every stored point's {name} in "
                                     "the raster, found some missing")
        positions.append(index)
    return tuple(positions)


def _linked_update(slc, rows, cols, compressed, shp, *, window, ministack, max_compressed,
                   method):
    """The new epochs of a batch of points, mini-stack by mini-stack beside their compressed
    SLCs: the linked phase, the temporal coherence terms summed over the pairs each mini-stack's
    problem forms with a new epoch (among the new epochs and with the compressed SLCs), their
    count, the bound's variance summed over the new epochs, and the compressed SLCs after
    them."""
    n_new = slc.shape[-1]
    weights = shp.astype(np.float32)
    pieces, total, pairs, variance = [], 0.0, 0, 0.0
    for start in range(0, n_new, ministack):
        looks = gather_neighbours(slc[..., start:start + ministack], rows, cols, window)
        n_old = compressed.shape[-1]
        new, compressed, gamma, n_looks, _ = link_ministack(
            looks, compressed, weights, method=method, return_coherence=True,
            max_compressed=max_compressed)
        pieces.append(new)
        variance = variance + cramer_rao_bound(gamma, n_looks, reference=0)[:, n_old:].sum(-1)
        if gamma.shape[-1] < 3:  # two SLCs: any linked phase fits them, no figure of fit
            continue
        # the compressed SLCs are on the datum (phase 0): the pairs with a new epoch
        theta = np.concatenate([np.zeros((new.shape[0], n_old)), new], axis=1)
        term = np.real(np.exp(1j * (np.angle(gamma) - theta[:, :, None] + theta[:, None, :])))
        new_pairs = np.ones(term.shape[1:], bool)
        new_pairs[:n_old, :n_old] = False
        np.fill_diagonal(new_pairs, False)
        total = total + term[:, new_pairs].sum(axis=1)
        pairs += int(new_pairs.sum())
    return np.concatenate(pieces, axis=-1), total, pairs, variance, compressed


@single_threaded_blas()
def update_ds_selection(ds_store, new_epochs: xr.Dataset) -> xr.Dataset:
    """Add new epochs to a stored DS product, linking them as its next mini-stack(s) beside the
    stored compressed SLCs: the old epochs are not read again, and new epochs cost what one
    mini-stack costs (the sequential estimator's promise, Ansari, De Zan and Bamler 2017).

    The product must come from ``save_stm(ds_selection(..., ministack=M))``, which keeps the
    state (``ds_compressed``: the compressed SLCs per look, ``ds_shp``: the SHP mask). Each new
    mini-stack of ``M`` epochs is linked beside at most ``ds_max_compressed`` compressed SLCs,
    as the first run's last mini-stacks were, on the same datum (the first epoch): the new
    epochs' phases, bounds and compressed SLCs are those :func:`ds_selection` on the whole
    stack with the first run's SHP would give (to float32 round-off; where the first run's
    epochs are a whole number of mini-stacks, else the mini-stacks start elsewhere). Add
    epochs a whole mini-stack at a time: shorter mini-stacks are linked less well (one epoch
    at a time, 15 % above the phase RMSE of whole mini-stacks, measured), and logged. What
    stays: the points and their SHP (rerun :func:`ds_selection` to find new DS), their
    amplitude (the SHP's mean intensity of the first run) and ``linked_coherence``, the
    acceptance's figure over the first run's epochs: the temporal coherence over every pair of
    epochs needs the old epochs' looks, which the update does not keep. What is updated:
    ``linked_phase_std`` (the bound's root mean square over every epoch), the state, and
    ``ds_update_coherence``: the temporal
    coherence over the pairs the update's problems form with a new epoch (the new epochs among
    themselves and with the compressed SLCs), a per-update figure like dolphin's per-mini-stack
    one, which drops where a DS decorrelates in the new epochs (NaN where each problem was
    two SLCs, one new epoch beside one compressed SLC, which any phase fits). It reads higher
    than the
    whole stack's temporal coherence (compressed SLCs average their mini-stack's noise: median
    0.97 against 0.88 over every pair of 40 epochs on a simulated stack, correlation 0.89).

    A killed update leaves the old store (killed while appending: ``append_epochs`` rolls it
    back), or the new epochs without the new state, which the same call completes, or a
    half-written state, which is refused with a message (rerun :func:`ds_selection`).

    Parameters
    ----------
    ds_store
        The DS product's store.
    new_epochs
        Raster stack ``(azimuth, range, time)`` of the epochs after the last stored one, on the
        first run's pixel grid, with ``complex`` (and ``h2ph`` when the store has it).

    Returns
    -------
    xarray.Dataset
        The updated store, reopened lazily.

    Examples
    --------
    >>> import tempfile
    >>> from depsi.io.store import save_stm
    >>> from depsi.simulate.ds import simulate_ds_stack
    >>> stack, _ = simulate_ds_stack(shape=(24, 24), n_epochs=12)
    >>> path = save_stm(ds_selection(stack.isel(time=slice(0, 8)), window=(5, 5),
    ...                              min_looks=10, ministack=4), tempfile.mkdtemp() + "/ds")
    >>> update_ds_selection(path, stack.isel(time=slice(8, 12))).sizes["time"]
    12
    """
    from pathlib import Path

    import zarr

    from depsi.io.store import consolidate_metadata, open_stm
    from depsi.io.store_append import (
        append_epochs,
        check_epoch_variables,
        epoch_coords,
        epochs_to_append,
    )

    path = Path(ds_store)
    old = open_stm(path, kind="points")
    n_state = _ds_state(old, path)
    validate(new_epochs, kind="raster", require=("complex",))
    check_epoch_variables(old, new_epochs)  # h2ph and per-epoch coordinates, before any work
    stored_after = old["time"].values[n_state:]
    if stored_after.size and not np.array_equal(
            stored_after, new_epochs["time"].values[:stored_after.size]):
        raise ValueError(f"store {str(path)!r}: its last {stored_after.size} epoch(s) have no "
                         "state yet (an update killed after its append) and new_epochs does "
                         "not start with them: pass the same new epochs again to complete it")
    last = old["time"].values[n_state - 1]
    if not (new_epochs["time"].values > last).all():
        raise ValueError(f"new_epochs: expected epochs after the last stored one ({last}), "
                         f"found from {new_epochs['time'].values.min()}")
    window = tuple(int(w) for w in old.attrs["ds_window"])
    ministack = int(old.attrs["ds_ministack"])
    max_compressed = old.attrs.get("ds_max_compressed")
    max_compressed = None if max_compressed is None else int(max_compressed)
    half = (window[0] // 2, window[1] // 2)
    rows, cols = _raster_positions(new_epochs, old, path)
    raster = new_epochs["complex"].transpose("azimuth", "range", "time")
    n_az, n_rg = raster.shape[:2]
    compressed_old = old["ds_compressed"].values
    shp = old["ds_shp"].values
    n_points, n_new, n_cells = rows.size, raster.shape[2], shp.shape[1]
    n_kept = compressed_old.shape[-1] + n_compressed(n_new, ministack, None)
    n_kept = n_kept if max_compressed is None else min(n_kept, max_compressed)
    phase = np.empty((n_points, n_new), np.float32)
    compressed = np.empty((n_points, n_cells, n_kept), np.complex64)
    total, variance, pairs = np.zeros(n_points), np.empty(n_points), 0
    width = ministack + n_kept
    step = batch_size(phase_linking_bytes_per_pixel(width, n_cells), max_items=max(n_points, 1))
    for start in range(0, n_points, step):  # points in Morton order: compact boxes
        at = slice(start, start + step)
        a0, a1 = int(rows[at].min()) - half[0], int(rows[at].max()) + half[0] + 1
        r0, r1 = int(cols[at].min()) - half[1], int(cols[at].max()) + half[1] + 1
        block = np.zeros((a1 - a0, r1 - r0, n_new), np.complex64)  # zero beyond the scene
        inside = raster.isel(azimuth=slice(max(a0, 0), min(a1, n_az)),
                             range=slice(max(r0, 0), min(r1, n_rg))).values
        block[max(a0, 0) - a0:max(a0, 0) - a0 + inside.shape[0],
              max(r0, 0) - r0:max(r0, 0) - r0 + inside.shape[1]] = inside
        phase[at], total[at], pairs, variance[at], compressed[at] = _linked_update(
            block, rows[at] - a0 - half[0], cols[at] - r0 - half[1], compressed_old[at],
            shp[at], window=window, ministack=ministack, max_compressed=max_compressed,
            method=str(old.attrs["ds_method"]))
    # NaN where every problem was two SLCs (one new epoch beside one compressed SLC)
    coherence = (total / pairs if pairs else np.full(n_points, np.nan)).astype(np.float32)
    short = n_new % ministack  # the update's last mini-stack, when not a whole one
    if short:
        logger.warning("update_ds_selection: a mini-stack of %d new epoch(s), not %d: the "
                       "sequential estimator links short mini-stacks less well (one epoch at "
                       "a time: 15 %% above the phase RMSE of whole mini-stacks, measured); add "
                       "epochs a whole mini-stack at a time", short, ministack)
    phase_std = np.sqrt((old["linked_phase_std"].values.astype(np.float64) ** 2
                         * (n_state - 1) + variance) / (n_state + n_new - 1))

    amplitude = old["amplitude"].isel(time=0).values.astype(np.float32)
    new_points = xr.Dataset(
        {"complex": (("space", "time"),
                     (amplitude[:, None] * np.exp(1j * phase)).astype(np.complex64))},
        coords={"time": new_epochs["time"].values,
                **{name: ("time", new_epochs[name].values) for name in epoch_coords(old)}})
    if "h2ph" in old.data_vars:
        points_at = {"azimuth": xr.DataArray(rows, dims="space"),
                     "range": xr.DataArray(cols, dims="space")}  # the points alone, any chunks
        h2ph = new_epochs["h2ph"].isel(points_at).transpose("space", "time")
        new_points["h2ph"] = (("space", "time"), np.asarray(h2ph.values))
    append_epochs(path, epochs_to_append(old, new_points))  # a no-op when appended already

    # not the consolidated view: its shapes would not follow the resize (consolidated after)
    group = zarr.open_group(path, mode="r+", use_consolidated=False)
    group.attrs["ds_state_end"] = _STATE_WRITING  # a kill from here on is refused, not trusted
    with zarr.config.set({"array.write_empty_chunks": True}):  # a store written whole
        state = cast(zarr.Array, group["ds_compressed"])  # variables are arrays, not groups
        if state.shape != compressed.shape:
            state.resize(compressed.shape)
        state[...] = compressed
        cast(zarr.Array, group["ds_update_coherence"])[...] = coherence
        cast(zarr.Array, group["linked_phase_std"])[...] = phase_std.astype(np.float32)
    times = new_epochs["time"].values
    step_text = f"update_ds_selection(+{times.size} epochs)"
    group.attrs.update({"ds_state_end": str(times[-1]),
                        "history": f"{old.attrs.get('history', '')}\n{step_text}".strip()})
    consolidate_metadata(path)
    logger.info("update_ds_selection: linked %d new epoch(s) of %d DS in %s beside %d "
                "compressed SLC(s); update coherence median %.3f, lowest %.3f", times.size,
                n_points, path, compressed_old.shape[-1], float(np.median(coherence)),
                float(coherence.min(initial=1.0)))
    return open_stm(path, kind="points")
