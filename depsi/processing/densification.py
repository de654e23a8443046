"""Densification: every candidate point tied to its k nearest first-order points.

``densify`` reads each candidate, corrected for the atmospheric phase screen, against the local
reference of its ``k`` nearest first-order points (the mean of their unwrapped phases,
velocities and heights, each neighbour brought to the nearest one's cycles): one arc and one
periodogram per candidate, all of a space chunk in one batched call; candidates whose temporal
coherence is below a threshold are rejected. To first order this is the mean of the ``k``
arcs' estimates at a third of their cost (k = 3), and a datum shifted by constants moves every
candidate by the same. Lazy, one task per space chunk, and embarrassingly parallel (docs/design.md,
"Architecture"): each task gets its chunk's neighbours among the first-order points (found in the
client on the whole network), not the whole network, so its memory follows the chunk size.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import dask.local
import dask.threaded
import numpy as np
import xarray as xr
from dask.base import get_scheduler
from pydantic import Field
from scipy.spatial import cKDTree

from depsi.conventions import MISSING_AMBIGUITY, phase_per_metre, wrap_phase
from depsi.kernels.backend import (
    Device,
    chunk_device,
    chunk_starts,
    resolve_devices,
    to_device,
    to_host,
    use_device,
)
from depsi.kernels.periodogram import mean_phasor, periodogram, result_coherence
from depsi.processing.arcs import (
    DEFAULT_HEIGHT_RANGE,
    DEFAULT_VELOCITY_RANGE,
    heights_resolvable,
)
from depsi.processing.atmosphere import (
    GAUSSIAN_NEIGHBOURS,
    TERRAIN_HEIGHT,
    ScreenInterpolator,
    gaussian_mean,
    screen_interpolator,
    stratified_part,
    terrain_heights,
)
from depsi.processing.datum import POINT_BLOCK
from depsi.processing.network import on_threads, point_positions
from depsi.sections import Section
from depsi.stm.runtime import fused_kernels, workers_client
from depsi.stm.schema import validate, years_since_mother

logger = logging.getLogger(__name__)

#: Candidates with a combined temporal coherence below this are rejected by default (a point's
#: threshold; integration's arcs have their own, DEFAULT_MIN_ARC_COHERENCE).
DEFAULT_MIN_POINT_COHERENCE = 0.7
#: First-order points tied to each candidate by default.
DEFAULT_K = 3


class DensificationConfig(Section):
    """Densification: every other point tied to its nearest first-order points."""

    k: int = Field(DEFAULT_K, ge=1, description="First-order points each candidate is tied to.")
    max_distance: float | None = Field(
        None, gt=0, description="Longest arc from a candidate to a first-order point, m; "
                                "null: no limit.")
    min_coherence: float = Field(
        DEFAULT_MIN_POINT_COHERENCE, ge=0, le=1,
        description="Candidates with a lower temporal coherence are not kept.")

_TWO_PI = 2.0 * np.pi
_FIRST = "first_order"
_OUTPUTS = {"velocity": np.float32, "height_error": np.float32, "unwrapped_phase": np.float32,
            "displacement": np.float32, "ambiguity": np.int32, "temporal_coherence": np.float32,
            "aps": np.float32, "accepted": bool, "n_arcs": np.int16}
_SERIES = ("unwrapped_phase", "displacement", "ambiguity", "aps")
#: The first-order table's rows a chunk of candidates reads, for its neighbours only.
_TABLE_ROWS = ("fo_x", "fo_y", "fo_velocity", "fo_height_error", "fo_unwrapped_phase",
               "fo_h2ph")


#: Candidates per sub-block of a chunk: bounds the (candidates, k, epochs) float64 temporaries
#: of the local reference and the periodogram's outputs (about 100 MB at k = 3 and 60
#: epochs), whatever the chunk size.
SUB_BLOCK = 8192


@dataclass(frozen=True)
class _Shared:
    """What every chunk's task reads alike: small (the epochs' reference phase and times, the
    kriging screen of at most a few thousand points), one graph key shipped once per worker."""

    reference_phase: np.ndarray  # (T,) float64
    years: np.ndarray  # (T,)
    wavelength: float
    kriging: ScreenInterpolator | None  # the screen when kriged; None otherwise
    gaussian_length: float | None  # the Gaussian screen's sigma (m); None when not Gaussian
    regressors: dict[str, np.ndarray] = field(default_factory=dict)  # model terms, (T,) each
    stratified_rate: np.ndarray | None = None  # (T,) rad/m: the screen's stratified part
    height_mean: float = 0.0  # m: the heights the stratified part is centred on
    heights: bool = True  # False where h2ph never varies (no baselines): velocity only


@dataclass(frozen=True)
class _Motion:
    """What a first-order point's residual from its own model reads besides its rows of the
    table: the epochs' times, the phase per metre and the further terms' ``(T,)`` values."""

    years: np.ndarray
    m2ph: float
    regressors: dict[str, np.ndarray] = field(default_factory=dict)

    def residual(self, rows: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 ``(n, T)``: each point's unwrapped phase less its model and its constant
        phase (to float32's precision: only the cycles against the nearest neighbour's are
        read of it), from the table's ``fo_*`` arrays of those points. Row by row: the same
        values for a point whichever rows are computed with it."""
        motion = (rows["fo_velocity"][:, None] * self.years[None, :]
                  + rows["fo_h2ph"] * rows["fo_height_error"][:, None])
        for name, values in self.regressors.items():
            motion = motion + rows[f"fo_{name}"][:, None] * values[None, :]
        part = rows["fo_unwrapped_phase"] - self.m2ph * motion
        part -= np.angle(mean_phasor(part))[:, None]
        return part.astype(np.float32)


def _chunk_payload(c_pos: np.ndarray, table: dict[str, np.ndarray], tree: cKDTree, k: int,
                   screen: ScreenInterpolator | None, c_height: np.ndarray | None,
                   motion: _Motion) -> dict[str, np.ndarray]:
    """What one chunk of candidates reads of the first-order points: their ``k`` nearest (and,
    for a Gaussian screen, its nearest sources), found in the client on the whole network,
    as local indices into the rows of the table (and sources) the chunk uses, those rows only.

    A task's memory then follows its chunk, not the network (at 10^7 points the whole table
    and screen sources were 1.8 GB in every task); the neighbours are those of the whole
    network, ties included, whatever the scheduler."""
    n = len(c_pos)
    _, idx = tree.query(c_pos, k=k, workers=-1)  # the same neighbours on every core
    used, local = _used_rows(idx.reshape(n, k))
    payload = {"c_pos": c_pos, "fo_idx": local}
    payload.update({name: values[used] for name, values in table.items()})
    # the used points' residuals, made here from their rows: the table holds none (0.36 GB
    # at 10^7 points)
    payload["fo_residual"] = motion.residual(payload)
    if screen is not None and screen.method != "kriging":
        ks = min(GAUSSIAN_NEIGHBOURS, screen.tree.n)
        _, idx = screen.tree.query(c_pos, k=ks, workers=-1)
        used, local = _used_rows(idx.reshape(n, ks))
        payload.update({"screen_idx": local,
                        "screen_pos": screen.src_pos[used], "screen_values": screen.values[used]})
    if c_height is not None:  # the candidates' terrain heights, for the stratified part
        payload["c_height"] = c_height
    return payload


def _used_rows(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``idx`` ``(n, k)`` (non-negative) uses, ascending, and each index's position
    among them (int32 ``(n, k)``): ``np.unique(idx, return_inverse=True)``'s, from a mark per
    row up to the largest index and its running count instead of a sort of the ``n k``
    indices (twenty times faster at 10^5 candidates of 16 neighbours)."""
    flat = idx.ravel()
    mark = np.zeros(int(flat.max()) + 1 if flat.size else 0, dtype=bool)
    mark[flat] = True
    # the number of used rows up to each row: one past its position among them
    count = np.cumsum(mark, dtype=np.int64 if mark.size > 2**31 else np.int32)
    local = (count[flat] - 1).reshape(idx.shape).astype(np.int32, copy=False)
    return np.flatnonzero(mark), local


def _distances(pos: np.ndarray, sources: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Distances from each of ``pos`` (n, 2) to its sources ``sources[idx]`` (n, k): the same
    floating-point operations as the KD-tree that found them, so the same values."""
    dx = pos[:, None, 0] - sources[idx, 0]
    dy = pos[:, None, 1] - sources[idx, 1]
    return np.sqrt(dx * dx + dy * dy)


def _densify_chunk(phase: np.ndarray, h2ph: np.ndarray, payload: dict[str, np.ndarray],
                   shared: _Shared, *, max_distance, min_coherence, periodogram_options,
                   device) -> dict[str, np.ndarray]:
    """Densify one chunk of candidates against the first-order points of its ``payload``
    (NumPy in and out; the periodogram on the chunk's device), in sub-blocks of
    :data:`SUB_BLOCK` candidates."""
    n, T = phase.shape
    h2ph = np.broadcast_to(np.asarray(h2ph).reshape(n, -1), (n, T))
    c_pos, idx = payload["c_pos"], payload["fo_idx"]
    f_pos = np.column_stack([payload["fo_x"], payload["fo_y"]])
    values = {name: np.empty((n, T) if name in _SERIES else (n,), dtype)
              for name, dtype in _OUTPUTS.items()}
    for start in range(0, n, SUB_BLOCK):
        rows = slice(start, min(start + SUB_BLOCK, n))
        dist = _distances(c_pos[rows], f_pos, idx[rows])
        near = np.isfinite(dist) & (dist <= (np.inf if max_distance is None else max_distance))
        heights = payload["c_height"][rows] if "c_height" in payload else None
        if shared.kriging is not None:
            aps = shared.kriging(c_pos[rows], heights)
        elif shared.gaussian_length is not None:
            s_idx = payload["screen_idx"][rows]
            aps = gaussian_mean(_distances(c_pos[rows], payload["screen_pos"], s_idx), s_idx,
                                payload["screen_values"], shared.gaussian_length
                                ).astype(np.float32)
            if shared.stratified_rate is not None:  # the turbulent part's sources, plus it
                aps += stratified_part(payload["c_height"][rows], shared.height_mean,
                                       shared.stratified_rate).astype(np.float32)
        else:
            aps = None
        part = _densify_rows(
            phase[rows].astype(np.float64), h2ph[rows].astype(np.float64), idx[rows], near,
            payload, aps, shared, min_coherence=min_coherence,
            periodogram_options=periodogram_options, device=device)
        for name, value in part.items():
            values[name][rows] = value
    return values


def _local_reference(first: dict[str, np.ndarray], idx: np.ndarray, weight: np.ndarray):
    """What a candidate is read against, from its neighbours ``idx`` (n, k) with ``weight``
    (n, k; zero for a neighbour not used, rows summing to 1): the weighted means of their
    velocities, heights and h2ph, and of their unwrapped phases, each brought to the cycles of
    the nearest used neighbour's (the anchor) where their residuals from their own models
    disagree with the anchor's by whole cycles. A neighbour's unwrapping error then neither
    moves the mean nor becomes a false cycle of the candidate, and the mean is linear in the
    neighbours' values: a datum shifted by constants moves every candidate by the same."""
    n, k = idx.shape
    residual = first["fo_residual"][idx]  # (n, k, T)
    anchor = residual[np.arange(n), np.argmax(weight > 0, axis=1)]  # the nearest used
    cycles = np.rint((residual - anchor[:, None, :]) * (1.0 / _TWO_PI))
    phase = np.einsum("nk,nkt->nt", weight, first["fo_unwrapped_phase"][idx] - _TWO_PI * cycles)
    return (phase, np.sum(weight * first["fo_velocity"][idx], axis=1),
            np.sum(weight * first["fo_height_error"][idx], axis=1),
            np.einsum("nk,nkt->nt", weight, first["fo_h2ph"][idx]))


def _densify_rows(phase, h2ph, idx, near, first, aps, shared: _Shared, *, min_coherence,
                  periodogram_options, device) -> dict[str, np.ndarray]:
    """The outputs of :func:`_densify_chunk` for some of its candidates (float64 inputs; the
    screen ``aps`` at them, float32, or None): one periodogram per candidate, on the arc from
    the local reference of its neighbours (:func:`_local_reference`) to its phase less the
    screen."""
    n, T = phase.shape
    years, wavelength = shared.years, shared.wavelength
    m2ph = phase_per_metre(wavelength)
    aps = np.zeros((n, T)) if aps is None else aps.astype(np.float64)
    base = wrap_phase(phase - aps - shared.reference_phase[None, :])  # relative, no APS
    weight = near.astype(np.float64)  # (n, k): equal, so that the datum moves every candidate alike
    total = weight.sum(axis=1)
    has = total > 0
    weight /= np.where(has, total, 1.0)[:, None]
    local, local_velocity, local_height, local_h2ph = _local_reference(first, idx, weight)
    # the model terms: the local reference's, plus the candidate's own where searched
    terms = {name: np.sum(weight * first[f"fo_{name}"][idx], axis=1)
             for name in shared.regressors}
    reduced = wrap_phase(base - local)
    if n:
        with use_device(device):
            pair_h2ph = to_device(0.5 * (h2ph + local_h2ph), device) if shared.heights else None
            res = periodogram(to_device(reduced, device), pair_h2ph, years,
                              wavelength=wavelength, fused=fused_kernels(),
                              **periodogram_options)
        velocity = local_velocity + to_host(res.velocity)
        height = local_height + to_host(res.height_error)
        for name, value in res.extra.items():
            terms[name] = terms[name] + to_host(value)
        amb = to_host(res.ambiguity)
        del res
    else:
        velocity = height = np.zeros(0)
        amb = np.zeros((0, T), np.int32)
    has &= np.isfinite(velocity) & np.isfinite(height) & (amb != MISSING_AMBIGUITY).all(axis=1)
    # local + reduced is base plus whole cycles: the candidate's unwrapped phase is base plus
    # those and the periodogram's ambiguities
    ambiguity = np.rint((local + reduced - base) / _TWO_PI) + np.where(has[:, None], amb, 0)
    unwrapped = base + _TWO_PI * ambiguity
    residual = unwrapped - m2ph * (velocity[:, None] * years[None, :] + h2ph * height[:, None])
    for name, values in terms.items():
        residual -= m2ph * values[:, None] * shared.regressors[name][None, :]
    coherence = result_coherence(residual)
    displacement = unwrapped / m2ph - h2ph * height[:, None]
    displacement -= displacement[:, :1]
    accepted = has & (coherence >= min_coherence)
    nan = ~has
    return {
        "velocity": np.where(nan, np.nan, velocity),
        "height_error": np.where(nan, np.nan, height),
        "unwrapped_phase": np.where(nan[:, None], np.nan, unwrapped),
        "displacement": np.where(nan[:, None], np.nan, displacement),
        # no estimate: 0, masked by accepted (as off-network points, docs/chain.md)
        "ambiguity": np.where(nan[:, None], 0, ambiguity),
        "temporal_coherence": np.where(nan, 0.0, coherence),
        "aps": aps, "accepted": accepted,
        "n_arcs": np.where(has, (weight > 0).sum(axis=1), 0),
    }


def _first_order_table(first_order: xr.Dataset,
                       regressors: Mapping[str, np.ndarray] | None = None
                       ) -> tuple[xr.Dataset, _Motion]:
    """The first-order quantities densification needs, on their own dim (one chunk); with
    model terms, each point's coefficient of each (``fo_<name>``); and the :class:`_Motion`
    that makes a point's residual from its rows (a chunk's payload makes its points'). Points
    whose residual is not finite are left out."""
    regressors = dict(regressors or {})
    required = ("unwrapped_phase", "velocity", "height_error", "h2ph", "reference_phase",
                *regressors)
    validate(first_order, "points", require=required, require_wavelength=True)
    fo = first_order
    if "in_network" in fo and not fo["in_network"].values.all():  # no copy where all are
        fo = fo.isel(space=np.flatnonzero(fo["in_network"].values))
    pos = point_positions(fo)
    n_fo, T = fo.sizes["space"], fo.sizes["time"]
    h2ph = np.broadcast_to(fo["h2ph"].transpose("space", ...).values.reshape(n_fo, -1), (n_fo, T))
    velocity = fo["velocity"].values.astype(np.float64)
    height = fo["height_error"].values.astype(np.float64)
    unwrapped = fo["unwrapped_phase"].transpose("space", "time").values
    years = years_since_mother(fo)
    m2ph = phase_per_metre(float(fo.attrs["wavelength"]))
    coefficients = {f"fo_{name}": fo[name].values.astype(np.float64) for name in regressors}
    model = _Motion(years, m2ph, {name: np.asarray(values) for name, values in
                                  regressors.items()})
    rows_of = {"fo_velocity": velocity, "fo_height_error": height,
               "fo_unwrapped_phase": unwrapped, "fo_h2ph": h2ph, **coefficients}
    finite = np.empty(n_fo, dtype=bool)

    def block(start: int) -> None:  # each block writes its own rows: the float64
        rows = slice(start, start + POINT_BLOCK)  # temporaries follow the block
        residual = model.residual({name: values[rows] for name, values in rows_of.items()})
        finite[rows] = np.isfinite(residual).all(axis=1)

    on_threads(block, range(0, n_fo, POINT_BLOCK))
    table: dict[str, tuple[Any, ...]] = {
        "fo_x": (_FIRST, pos[:, 0]), "fo_y": (_FIRST, pos[:, 1]),
        "fo_velocity": (_FIRST, velocity), "fo_height_error": (_FIRST, height),
        "fo_unwrapped_phase": ((_FIRST, "time"), unwrapped),
        "fo_h2ph": ((_FIRST, "time"), h2ph),
        "fo_reference_phase": ("time", fo["reference_phase"].values),
        **{name: (_FIRST, values) for name, values in coefficients.items()},
    }
    attrs = {k: v for k, v in fo.attrs.items()
             if k.startswith(("variogram_", "stratified_")) or k == "aps_method"}
    if "aps_observed" in fo:
        table["fo_aps_observed"] = ((_FIRST, "time"),
                                    fo["aps_observed"].transpose("space", "time").values)
    if "stratified_rate" in fo:  # the screen's part that follows the terrain
        table["fo_height"] = (_FIRST, terrain_heights(fo, "on"))
        table["stratified_rate"] = ("time", fo["stratified_rate"].values.astype(np.float64))
    ds = xr.Dataset(table, coords={"time": fo["time"].values}, attrs=attrs)
    return (ds if finite.all() else ds.isel({_FIRST: np.flatnonzero(finite)})), model


def _screen(table: xr.Dataset) -> ScreenInterpolator | None:
    """The first-order screen, its kriging system solved once for every chunk."""
    if "fo_aps_observed" not in table:
        return None
    source = xr.Dataset({"aps_observed": (("space", "time"), table["fo_aps_observed"].values)},
                        coords={"time": table["time"].values,
                                "x": ("space", table["fo_x"].values),
                                "y": ("space", table["fo_y"].values)}, attrs=table.attrs)
    if "stratified_rate" in table:
        source = source.assign(stratified_rate=table["stratified_rate"]).assign_coords(
            {TERRAIN_HEIGHT: ("space", table["fo_height"].values)})
    return screen_interpolator(source)


def densify(
    candidates: xr.Dataset,
    first_order: xr.Dataset,
    *,
    k: int = DEFAULT_K,
    max_distance: float | None = None,
    min_coherence: float = DEFAULT_MIN_POINT_COHERENCE,
    height_range: tuple[float, float] = DEFAULT_HEIGHT_RANGE,
    velocity_range: tuple[float, float] = DEFAULT_VELOCITY_RANGE,
    height_step: float | None = None,
    velocity_step: float | None = None,
    devices: Sequence[Device | str | int] | None = None,
    regressors: Mapping[str, np.ndarray] | None = None,
    extra_regressors: Mapping[str, tuple] | None = None,
) -> xr.Dataset:
    """Estimate every candidate point from arcs to its ``k`` nearest first-order points.

    Parameters
    ----------
    candidates
        Point STM with wrapped single-mother ``phase``, ``h2ph``, positions (same convention as
        the first-order points, see :func:`depsi.processing.network.point_positions`).
    first_order
        The integrated first-order network (``unwrapped_phase`` free of atmosphere,
        ``velocity``, ``height_error``, ``reference_phase``, ``h2ph``; optionally
        ``aps_observed`` and the variogram attrs of
        :func:`depsi.processing.atmosphere.estimate_atmosphere`, then arcs are corrected for
        the screen interpolated to each candidate).
    k
        First-order points per candidate (``k >= 1``; 3 by default): their mean is the
        candidate's local reference, with a third of one neighbour's noise at k = 3, and a
        neighbour's unwrapping error (whole cycles against the nearest's residual) is undone.
    max_distance
        Arcs longer than this (m) are not used (``None``: no limit).
    min_coherence
        Candidates whose combined temporal coherence is below this get ``accepted = False``.
    height_range, velocity_range, height_step, velocity_step
        Periodogram search ranges and grid steps of the arc differences (m, m/yr); see
        :func:`depsi.processing.arcs.estimate_arcs`.
    devices
        Devices the candidate chunks are spread over, round-robin; default: those of
        :func:`depsi.kernels.backend.configure_devices`.
    regressors
        Model terms beyond velocity and height error, column name to ``(T,)`` values
        (:attr:`depsi.processing.motion_models.TemporalModel.regressors`): ``first_order``
        holds each point's coefficient under that name. A candidate's motion is its local
        reference's, plus its own difference of the terms in ``extra_regressors``.
    extra_regressors
        The terms the periodogram searches, name to ``(values, (low, high))`` (a subset of
        ``regressors``; see :func:`depsi.kernels.periodogram.periodogram`).

    Returns
    -------
    xarray.Dataset
        Per candidate (lazy over the candidates' space chunks): ``velocity``, ``height_error``,
        ``unwrapped_phase`` (no atmosphere, relative to the reference point),
        ``displacement`` (m, zero at the first epoch), ``ambiguity``, ``temporal_coherence``,
        ``aps``, ``accepted`` and ``n_arcs`` (first-order points in the local reference).
        Candidates with none have NaN estimates and ``accepted = False``.

    Examples
    --------
    >>> import numpy as np
    >>> from depsi.processing import (estimate_arcs, form_network, integrate_network,
    ...                               ps_selection, single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> best = np.argsort(points.amplitude_dispersion.values)
    >>> first, candidates = points.isel(space=best[:40]), points.isel(space=best[40:])
    >>> first_order = integrate_network(first, estimate_arcs(form_network(first)))
    >>> dense = densify(candidates, first_order)
    >>> dense.velocity.dims, int(dense.n_arcs.max())
    (('space',), 3)
    >>> accepted = dense.where(dense.accepted.compute(), drop=True)
    >>> accepted.sizes["space"] > 0
    True
    """
    validate(candidates, "points", require=("phase", "h2ph"), require_wavelength=True)
    if k < 1:
        raise ValueError(f"k: expected >= 1 first-order points per candidate, found {k}")
    regressors = {name: np.asarray(values, dtype=np.float64)
                  for name, values in (regressors or {}).items()}
    extra = dict(extra_regressors or {})
    if sorted(set(extra) - set(regressors)):
        raise ValueError(f"extra_regressors: expected names among regressors "
                         f"{sorted(regressors)}, found {sorted(set(extra) - set(regressors))}")
    table, motion = _first_order_table(first_order, regressors)
    if table.sizes[_FIRST] == 0:
        raise ValueError("first_order: no network point with finite results to densify from")
    keep = [v for v in ("phase", "h2ph") if v in candidates]
    cand = candidates[keep]
    if cand["phase"].chunks is None:
        cand = cand.chunk({"space": 4096})
    # every variable and space coordinate on the phase's space chunks: in-memory coordinates
    # would otherwise become one chunk, inconsistent with the data
    cand = cand.chunk({"space": cand["phase"].data.chunks[0], "time": -1})
    n, T = cand.sizes["space"], cand.sizes["time"]
    chosen = resolve_devices(devices)
    space_chunks = cand.chunks["space"]
    screen = _screen(table)
    shared = _Shared(
        reference_phase=table["fo_reference_phase"].values.astype(np.float64),
        years=years_since_mother(cand), wavelength=float(cand.attrs["wavelength"]),
        kriging=screen if screen is not None and screen.method == "kriging" else None,
        gaussian_length=(0.5 * screen.variogram["range"]
                         if screen is not None and screen.method != "kriging" else None),
        regressors=regressors,
        stratified_rate=None if screen is None else screen.stratified_rate,
        height_mean=0.0 if screen is None else screen.height_mean,
        # decided on the first-order points' h2ph (small, in memory), never a pass over the
        # candidates: a stack without baselines has none anywhere
        heights=heights_resolvable(table["fo_h2ph"]))
    arrays = {name: table[name].values
              for name in _TABLE_ROWS + tuple(f"fo_{name}" for name in regressors)}
    tree = cKDTree(np.column_stack([arrays["fo_x"], arrays["fo_y"]]))
    k_eff = min(int(k), tree.n)
    c_pos = point_positions(cand)  # every candidate's position, in the client
    c_height = (terrain_heights(candidates, "on")
                if screen is not None and screen.stratified_rate is not None else None)
    phase = cand["phase"].transpose("space", "time").data
    h2ph = cand["h2ph"].transpose("space", ...).data
    shared_key = dask.delayed(shared, pure=True)
    options = dict(height_range=tuple(height_range), velocity_range=tuple(velocity_range),
                   height_step=height_step, velocity_step=velocity_step,
                   extra_regressors=extra or None)
    pieces: dict[str, list[da.Array]] = {name: [] for name in _OUTPUTS}
    # in this process's memory (threads, or synchronous), each chunk's neighbours are found in
    # its own task, on the cores the chunks run on; elsewhere here, so that a worker's task
    # gets the rows it reads and not the whole network's tree and table
    in_memory = get_scheduler(collections=[phase]) in (dask.threaded.get, dask.local.get_sync)
    network = (dask.delayed(arrays, pure=True), dask.delayed(tree, pure=True),
               dask.delayed(screen, pure=True)) if in_memory else (arrays, tree, screen)
    # on a cluster each chunk's payload goes to the workers as data (a future), not inside the
    # graph: a task's specification is held by its worker from assignment to run, outside the
    # managed memory that spills, and at 10^7 points the payloads (18 MB a chunk) paused 2 GB
    # workers for good (docs/hpc.md, "Capacity")
    client = None if in_memory else workers_client()
    for i, (start, size) in enumerate(zip(chunk_starts(space_chunks), space_chunks)):
        # the chunk's task gets its neighbours' rows only (found on the whole network)
        payload = (dask.delayed(_chunk_payload, pure=True) if in_memory else _chunk_payload)(
            c_pos[start:start + size], network[0], network[1], k_eff, network[2],
            None if c_height is None else c_height[start:start + size], motion)
        if client is not None:
            # in a list: a dict would be scattered value by value, under its own keys
            payload = client.scatter([payload], hash=False)[0]
        part = dask.delayed(_densify_chunk, pure=True, nout=None)(
            phase.blocks[i], h2ph.blocks[i], payload, shared_key, max_distance=max_distance,
            min_coherence=min_coherence, periodogram_options=options,
            device=chunk_device(chosen, i))
        for name, dtype in _OUTPUTS.items():
            shape = (size, T) if name in _SERIES else (size,)
            pieces[name].append(da.from_delayed(part[name], shape, dtype=dtype))
    result = xr.Dataset(coords=cand.coords, attrs=cand.attrs)
    for name, parts in pieces.items():
        result[name] = (("space", "time") if name in _SERIES else ("space",),
                        da.concatenate(parts, axis=0))
    result.attrs.update({"densify_k": int(k), "densify_min_coherence": min_coherence})
    logger.info("densification of %d candidates against %d first-order points (lazy)",
                n, table.sizes[_FIRST])
    return result
