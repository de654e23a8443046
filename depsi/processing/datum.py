"""The datum of the network's results: the reference point chosen (by the configuration's point
index, by its position, or by the points' quality), the point results relative to it, and the
datum moved to the mean over a reference area or freed of the reference point's own noise.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import xarray as xr

from depsi.conventions import phase_per_metre, wrap_phase
from depsi.kernels.periodogram import result_coherence
from depsi.processing.network import on_threads, point_positions
from depsi.stm.runtime import page_out, pageable
from depsi.stm.schema import h2ph_rows, years_since_mother

logger = logging.getLogger(__name__)

#: Radius (m) of the reference area: results are relative to the mean over the first-order
#: network points within it (about 250 points at 2000 first-order points per 100 km^2). The
#: datum error is spatially correlated over about a kilometre (atmosphere finer than the
#: screen estimate, projected on the baselines), so smaller areas average little of it out.
DEFAULT_REFERENCE_RADIUS = 2000.0
#: Neighbours of the reference point whose residuals estimate its own noise.
REFERENCE_NEIGHBOURS = 30
#: Points per block of the point results (float64 temporaries of about 10 x 8 bytes per point
#: and epoch: 80 MB a block at 60 epochs)
POINT_BLOCK = 16384
#: Blocks of the point results between two :func:`~depsi.stm.runtime.page_out` calls.
PAGE_OUT_BLOCKS = 16

_TWO_PI = 2.0 * np.pi


def _choose_reference(positions, point_ok, point_quality, fraction=0.05, minimum=10):
    """Best-quality point among those nearest the centre of the network."""
    idx = np.flatnonzero(point_ok)
    centre = 0.5 * (positions[idx].min(axis=0) + positions[idx].max(axis=0))
    dist = np.hypot(*(positions[idx] - centre).T)
    n_near = min(len(idx), max(minimum, int(fraction * len(idx))))
    near = idx[np.argsort(dist, kind="stable")[:n_near]]
    return int(near[np.argmax(point_quality[near])])


def _point_quality(source, target, arc_ok, coherence, n):
    """Each point's mean coherence over its usable arcs (0 where it has none)."""
    weight = np.where(arc_ok, coherence, 0.0)
    count = np.bincount(source, arc_ok, n) + np.bincount(target, arc_ok, n)
    total = np.bincount(source, weight, n) + np.bincount(target, weight, n)
    return np.divide(total, count, out=np.zeros(n), where=count > 0)


def _point_results(points, values, point_ok, point_reason, ref, years,
                   reference_phase=None) -> xr.Dataset:
    """Point Dataset of the integrated values, with ambiguities, displacement, coherence.

    ``reference_phase`` (time,) is the datum the wrapped phases are taken relative to; by default
    the reference point's own phase. Computed over blocks of :data:`POINT_BLOCK` points into the
    result's float32/int32 arrays: the float64 temporaries (ten of the size of the series) follow
    the block, not the points (docs/benchmarks.md, "Per-point work in blocks")."""
    wavelength = float(points.attrs["wavelength"])
    m2ph = phase_per_metre(wavelength)
    n, n_epochs = points.sizes["space"], points.sizes["time"]
    velocity = values[:, 0]
    height = values[:, 1]
    phase_all = points["phase"].transpose("space", "time").values
    h2ph_all = points["h2ph"].transpose("space", ...)
    if reference_phase is None:
        reference_phase = np.asarray(phase_all[ref], dtype=np.float64)
    # the series in a file's pages where large (1.1 GB at 10^7 points): the driver holds a
    # few blocks' rows of them, of what it reads, and of every pageable array besides
    page_out()
    unwrapped_out = pageable((n, n_epochs), np.float32)
    displacement_out = pageable((n, n_epochs), np.float32)
    ambiguity_out = pageable((n, n_epochs), np.int32)
    coherence_out = np.empty(n, np.float32)

    def block(start: int) -> None:  # each block writes its own rows
        if start and start % (PAGE_OUT_BLOCKS * POINT_BLOCK) == 0:
            page_out()  # (rows other threads write or read come back as they are touched)
        rows = slice(start, min(start + POINT_BLOCK, n))
        unwrapped = values[rows, 2:]
        phase = np.asarray(phase_all[rows], dtype=np.float64)
        h2ph = h2ph_rows(h2ph_all, rows, n_epochs)
        relative = wrap_phase(phase - reference_phase)
        # off the network: ambiguity 0, masked by in_network (depsi.conventions.MISSING_AMBIGUITY
        # marks a missing epoch of an arc; a network point has a phase at every epoch)
        ambiguity_out[rows] = np.where(point_ok[rows, None],
                                       np.rint((np.nan_to_num(unwrapped) - relative) / _TWO_PI),
                                       0)
        # H_rel = H - H_ref; the unknown (h2ph - h2ph_ref) * H_ref term is second order
        model = m2ph * (velocity[rows, None] * years[None, :] + h2ph * height[rows, None])
        residual = unwrapped - model
        coherence_out[rows] = result_coherence(residual)
        displacement = unwrapped / m2ph - h2ph * height[rows, None]
        displacement_out[rows] = displacement - displacement[:, :1]
        unwrapped_out[rows] = unwrapped

    on_threads(block, range(0, n, POINT_BLOCK))
    out = points.copy()
    out = out.assign(
        velocity=("space", velocity.astype(np.float32)),
        height_error=("space", height.astype(np.float32)),
        unwrapped_phase=(("space", "time"), unwrapped_out),
        displacement=(("space", "time"), displacement_out),
        ambiguity=(("space", "time"), ambiguity_out),
        temporal_coherence=("space", coherence_out),
        in_network=("space", point_ok),
        removal_reason=("space", point_reason),
        reference_phase=("time", np.asarray(reference_phase).astype(np.float32)),
    )
    return out


class _ShiftedValues:
    """The ``values`` :func:`_point_results` reads, ``(points, 2 + epochs)`` float64: velocity,
    height and the float32 ``series`` plus a per-epoch ``shift`` (NaN off ``keep``), the
    series' rows made a block at a time as they are read (``values[rows, 2:]``), never the
    whole float64 array."""

    def __init__(self, velocity, height, series, shift, keep):
        self.columns = (velocity, height)
        self.series, self.shift, self.keep = series, shift, keep

    def __getitem__(self, key):
        rows, columns = key
        if isinstance(columns, int):
            return self.columns[columns][rows]
        if columns != slice(2, None):
            raise IndexError(f"expected a column (0, 1) or the series (2:), found {columns}")
        block = self.series[rows].astype(np.float64) + self.shift
        block[~self.keep[rows]] = np.nan
        return block


def remove_reference_noise(result: xr.Dataset, *, k: int = REFERENCE_NEIGHBOURS,
                           regressors: Mapping[str, np.ndarray] | None = None) -> xr.Dataset:
    """Take the results relative to the reference point's signal rather than its noisy phase.

    Every integrated value is relative to the reference point, so the reference's own phase
    noise (and its small-scale atmosphere) is a per-epoch term common to all points: it leaks
    into every velocity and height error as one offset (about 1.2 m of height and 0.4 mm/yr for
    0.4 rad of noise and 60 epochs). The reference's ``k`` nearest network neighbours see that
    term, with opposite sign, in their residual phases; their circular mean per epoch estimates
    it, and it is removed from every point: ``unwrapped_phase`` and ``reference_phase`` shift by
    it, velocity and height error by its least-squares velocity and height, and ambiguities,
    displacement and temporal coherence are recomputed.

    Parameters
    ----------
    result
        Output of :func:`~depsi.processing.integration.integrate_network` (its
        ``attrs['reference']`` must index ``space``).
    k
        Neighbours averaged (default :data:`REFERENCE_NEIGHBOURS`); fewer when the network is
        smaller.
    regressors
        Further model terms, column name to ``(T,)`` values (m per unit coefficient), whose
        coefficients ``result`` holds under those names: taken out of the neighbours' residuals
        with velocity and height error (a seasonal signal left in would be read as the
        reference's noise). Refit the terms afterwards
        (:func:`depsi.processing.motion_models.refit_with_terms`).

    Returns
    -------
    xarray.Dataset
        ``result`` with the updated values and ``reference_noise`` (rad, per epoch, the term
        removed); ``attrs['reference_noise_neighbours']`` says how many points estimated it.

    Examples
    --------
    >>> from depsi.processing import (estimate_arcs, form_network, integrate_network,
    ...                               ps_selection, single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> arcs = estimate_arcs(form_network(points))
    >>> result = remove_reference_noise(integrate_network(points, arcs))
    >>> result.reference_noise.dims, result.attrs["reference_noise_neighbours"] > 0
    (('time',), True)
    """
    ref = int(result.attrs["reference"])
    keep = np.asarray(result["in_network"].values, dtype=bool)
    n = result.sizes["space"]
    if not 0 <= ref < n or not keep[ref]:
        raise ValueError(f"result: attrs['reference']={ref} is not a network point of the "
                         f"{n} points")
    positions = point_positions(result)
    candidates = np.flatnonzero(keep & (np.arange(n) != ref))
    k = min(int(k), candidates.size)
    if k < 3:
        logger.warning("reference noise: only %d network neighbours, left in place", k)
        return result
    years = years_since_mother(result)
    wavelength = float(result.attrs["wavelength"])
    m2ph = phase_per_metre(wavelength)
    dist = np.hypot(*(positions[candidates] - positions[ref]).T)
    nbrs = candidates[np.argsort(dist, kind="stable")[:k]]
    # float64 rows of the neighbours and the reference only: the whole series in float64
    # (five copies, 3.5 GB at 1.5 M points) made the atmosphere step's peak at 10^7 points
    series = result["unwrapped_phase"].transpose("space", "time").values
    n_epochs = series.shape[1]
    h2ph_all = result["h2ph"].transpose("space", ...).values

    def h2ph_of(rows) -> np.ndarray:
        return np.broadcast_to(h2ph_all[rows].astype(np.float64).reshape(len(rows), -1),
                               (len(rows), n_epochs))

    velocity = result["velocity"].values.astype(np.float64)
    height = result["height_error"].values.astype(np.float64)
    residual = series[nbrs].astype(np.float64) - m2ph * (velocity[nbrs, None] * years
                                                         + h2ph_of(nbrs) * height[nbrs, None])
    for name, regressor in (regressors or {}).items():  # the model's other terms
        residual -= m2ph * result[name].values[nbrs, None] * np.asarray(regressor)[None, :]
    phasor = np.exp(1j * residual)
    phasor *= np.exp(-1j * np.angle(phasor.mean(axis=1, keepdims=True)))  # own constant out
    noise = -np.angle(phasor.mean(axis=0))  # the reference's term, sign of its own noise
    mother = int(np.argmin(np.abs(years)))
    noise -= noise[mother]
    design = np.column_stack([m2ph * years, m2ph * h2ph_of([ref])[0], np.ones_like(years)])
    d_velocity, d_height, _ = np.linalg.lstsq(design, noise, rcond=None)[0]
    values = _ShiftedValues(np.where(keep, velocity + d_velocity, np.nan),
                            np.where(keep, height + d_height, np.nan), series, noise, keep)
    phase = result["phase"].transpose("space", "time").values
    reference_phase = phase[ref].astype(np.float64) - noise
    updated = _point_results(result, values, keep, result["removal_reason"].values, ref, years,
                             reference_phase=reference_phase)
    updated = updated.assign(reference_noise=("time", noise.astype(np.float32)))
    updated.attrs.update(result.attrs)
    updated.attrs["reference_noise_neighbours"] = int(k)
    logger.info("reference noise from %d neighbours: %.3f rad RMS, velocity %+.2e m/yr, height "
                "%+.2f m", k, np.sqrt(np.mean(noise**2)), d_velocity, d_height)
    return updated


def apply_reference_area(result: xr.Dataset, radius: float | None = DEFAULT_REFERENCE_RADIUS
                         ) -> xr.Dataset:
    """Re-reference every result to the mean over the network points near the reference.

    Relative to one point, that point's own noise (phase noise and atmosphere finer than the
    estimated screen) is an offset common to every point: about 2 m of height error on a
    scene of 0.4 rad noise and 120 epochs. Taking the datum as the plain mean over the
    *reference area*, the network points within ``radius`` of the reference point (StaMPS'
    ``ref_radius``), shrinks that offset by about the square root of their number. The mean
    velocity, height error and unwrapped phase (per epoch) of the area are subtracted from
    every network point; ``reference_phase`` moves by the same phase, so wrapped phases,
    ambiguities and densification against these points stay consistent; displacement and
    temporal coherence are recomputed.

    Parameters
    ----------
    result
        Output of :func:`~depsi.processing.integration.integrate_network` (its
        ``attrs['reference']`` must index ``space``).
    radius
        Radius in metres (positions as :func:`~depsi.processing.network.point_positions`;
        default :data:`DEFAULT_REFERENCE_RADIUS`, the ``integration.reference_radius`` of the
        configuration). ``None`` or 0: the area is the reference point alone (values
        unchanged).

    Returns
    -------
    xarray.Dataset
        ``result`` re-referenced, with ``in_reference_area`` (bool per point) and attrs
        ``reference_radius`` (m; 0.0 for the point alone) and ``n_reference_area``.
        ``attrs['reference']`` stays the central point.

    Examples
    --------
    >>> from depsi.processing import (estimate_arcs, form_network, integrate_network,
    ...                               ps_selection, single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> arcs = estimate_arcs(form_network(points))
    >>> result = apply_reference_area(integrate_network(points, arcs), 100.0)
    >>> int(result.in_reference_area.sum()) == result.attrs["n_reference_area"] > 1
    True
    >>> area = result.velocity.where(result.in_reference_area)
    >>> abs(float(area.mean())) < 1e-6  # the mean over the area is the datum
    True
    """
    ref = int(result.attrs["reference"])
    keep = np.asarray(result["in_network"].values, dtype=bool)
    n = result.sizes["space"]
    if not 0 <= ref < n or not keep[ref]:
        raise ValueError(f"result: attrs['reference']={ref} is not a network point of the "
                         f"{n} points")
    if radius is not None and not (np.isfinite(radius) and radius >= 0):
        raise ValueError(f"reference_radius: expected None or a distance >= 0 in metres, "
                         f"found {radius}")
    radius = 0.0 if radius is None else float(radius)
    positions = point_positions(result)
    dist = np.hypot(*(positions - positions[ref]).T)
    area = keep & (dist <= radius)
    area[ref] = True
    # float64 rows of the area only; the points' values shifted a block at a time
    # (_ShiftedValues): the whole series in float64 (three copies, 2.2 GB at 1.5 M points)
    # made the atmosphere step's end its peak at 10^7 points
    series = result["unwrapped_phase"].transpose("space", "time").values
    velocity = result["velocity"].values.astype(np.float64)
    height = result["height_error"].values.astype(np.float64)
    d_velocity = velocity[area].mean()
    d_height = height[area].mean()
    d_phase = series[area].astype(np.float64).mean(axis=0)
    out = result
    if area.sum() > 1:
        values = _ShiftedValues(np.where(keep, velocity - d_velocity, np.nan),
                                np.where(keep, height - d_height, np.nan), series, -d_phase,
                                keep)
        reference_phase = result["reference_phase"].values.astype(np.float64) + d_phase
        out = _point_results(result, values, keep, result["removal_reason"].values, ref,
                             years_since_mother(result), reference_phase=reference_phase)
        out.attrs.update(result.attrs)
    out = out.assign(in_reference_area=("space", area))
    out.attrs.update({"reference_radius": radius, "n_reference_area": int(area.sum())})
    logger.info("reference area: %d network points within %.0f m of point %d; datum moved by "
                "%+.2e m/yr, %+.2f m", area.sum(), radius, ref, d_velocity, d_height)
    return out


def not_first_order(reference: int) -> ValueError:
    """The error of a configured reference point that is not among the first-order points."""
    return ValueError(f"integration.reference: point {reference} is not among the "
                      f"first-order points; choose one with low amplitude dispersion")


def reference_by_point_index(points: xr.Dataset, reference: int | None) -> int | None:
    """The first-order point whose ``point_index`` is ``reference`` (local index; None: none
    chosen)."""
    if reference is None:
        return None
    found = np.flatnonzero(points["point_index"].values == int(reference))
    if not found.size:
        raise not_first_order(reference)
    return int(found[0])


#: Farthest (m) the point chosen by ``reference_lonlat`` may lie when no radius is configured.
REFERENCE_SEARCH_METRES = 100.0


def reference_by_position(points: xr.Dataset, lonlat: tuple[float, float],
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
