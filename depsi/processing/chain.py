"""The PS chain in one call: from a point STM to velocities, heights and time series.

``run_ps_chain`` wires the steps of DESIGN.md §1: single-mother interferograms (when needed),
first-order selection, network, arc estimation, integration with testing, atmosphere,
a second network pass on atmosphere-corrected phases, and densification of all other points.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import xarray as xr

from depsi.conventions import phase_per_metre, wrap_phase
from depsi.processing.arcs import DEFAULT_HEIGHT_RANGE, DEFAULT_VELOCITY_RANGE, estimate_arcs
from depsi.processing.atmosphere import DEFAULT_TEMPORAL_WINDOW, estimate_atmosphere
from depsi.processing.correlated_height import estimate_correlated_height
from depsi.processing.densification import DEFAULT_K, densify
from depsi.processing.integration import (
    DEFAULT_MIN_COHERENCE,
    apply_reference_area,
    integrate_network,
    remove_reference_noise,
)
from depsi.processing.model import estimate_model
from depsi.processing.network import form_network
from depsi.stm.schema import validate, years_since_mother

logger = logging.getLogger(__name__)

#: First-order points taken (best amplitude dispersion) when ``first_order`` is None.
DEFAULT_FIRST_ORDER = 2000

#: Radius (m) of the reference area: results are relative to the mean over the first-order
#: network points within it (about 250 points at 2000 first-order points per 100 km^2). The
#: datum error is spatially correlated over about a kilometre (atmosphere finer than the
#: screen estimate, projected on the baselines), so smaller areas average little of it out.
DEFAULT_REFERENCE_RADIUS = 2000.0

#: Variables of the result STM.
RESULT_VARIABLES = ("velocity", "height_error", "displacement", "temporal_coherence",
                    "ambiguity", "aps", "unwrapped_phase")


def _first_order_indices(points: xr.Dataset, first_order: int | float | None) -> np.ndarray:
    """Indices of the first-order points: best N, or NAD <= threshold, by amplitude dispersion."""
    n = points.sizes["space"]
    if "amplitude_dispersion" not in points:
        count = n if first_order is None or isinstance(first_order, float) else first_order
        logger.info("no amplitude_dispersion: the first %d points are first-order", count)
        return np.arange(min(n, int(count)))
    nad = np.asarray(points["amplitude_dispersion"].values, dtype=np.float64)
    nad = np.where(np.isfinite(nad), nad, np.inf)
    if isinstance(first_order, float):
        chosen = np.flatnonzero(nad <= first_order)
    else:
        count = DEFAULT_FIRST_ORDER if first_order is None else int(first_order)
        chosen = np.sort(np.argsort(nad, kind="stable")[:count])
    if len(chosen) < 3:
        raise ValueError(f"first_order: expected at least 3 first-order points, found "
                         f"{len(chosen)} (first_order={first_order})")
    return chosen


def _network_pass(points, *, method, height_range, velocity_range, min_coherence, alpha,
                  reference, solver):
    arcs = form_network(points, method=method)
    arcs = estimate_arcs(arcs, height_range=height_range, velocity_range=velocity_range,
                         solver=solver)
    return integrate_network(points, arcs, reference=reference, min_coherence=min_coherence,
                             alpha=alpha)


def run_ps_chain(
    ps_stm: xr.Dataset,
    *,
    first_order: int | float | None = None,
    network_method: Literal["delaunay", "redundant"] = "redundant",
    height_range: tuple[float, float] = DEFAULT_HEIGHT_RANGE,
    velocity_range: tuple[float, float] = DEFAULT_VELOCITY_RANGE,
    min_arc_coherence: float = DEFAULT_MIN_COHERENCE,
    alpha: float = 0.001,
    reference: int | None = None,
    reference_radius: float | None = DEFAULT_REFERENCE_RADIUS,
    atmosphere: Literal["auto", "kriging", "gaussian"] | None = "auto",
    temporal_window: float = DEFAULT_TEMPORAL_WINDOW,
    correlated_height: bool = True,
    reference_noise: bool = True,
    k: int = DEFAULT_K,
    min_coherence: float = 0.7,
    solver: str = "auto",
) -> xr.Dataset:
    """Run the PS chain from a point STM to the result STM.

    Parameters
    ----------
    ps_stm
        Point STM with wrapped single-mother ``phase`` (or ``complex`` SLC values, from which
        interferograms are formed), ``h2ph``, ``azimuth``/``range`` (or ``x``/``y``), ``time``
        and ``wavelength``; ``amplitude_dispersion`` chooses the first-order points.
    first_order
        An int: that many points of lowest amplitude dispersion form the first-order network;
        a float: those with amplitude dispersion at or below it; ``None``:
        :data:`DEFAULT_FIRST_ORDER` best.
    network_method
        ``"redundant"`` (default: many loops for arc testing) or ``"delaunay"``.
    height_range, velocity_range
        Periodogram search ranges of arc differences (m, m/yr).
    min_arc_coherence, alpha, reference
        Network integration: arc coherence threshold, w-test significance, reference point
        (index into ``ps_stm.space``; ``None`` chooses one near the centre).
    reference_radius
        Radius (m) of the reference area around the reference point: every result is relative
        to the plain mean over the first-order network points within it, which averages out
        the reference point's own noise (StaMPS' ``ref_radius``). ``None`` or 0: relative to
        the reference point alone. See
        :func:`~depsi.processing.integration.apply_reference_area`.
    atmosphere
        Method of :func:`~depsi.processing.atmosphere.estimate_atmosphere`; ``None`` skips it.
    temporal_window
        Low-pass width (years) separating unmodelled deformation from atmosphere.
    correlated_height
        After densification, move the atmosphere's projection on the baselines (a smooth
        field in the height errors) into the screen, predicted from all result points; see
        :func:`~depsi.processing.correlated_height.estimate_correlated_height`. Assumes DEM
        errors are uncorrelated with the atmosphere; spatially correlated DEM errors are
        recognised from the heights' variogram and left in the heights. Needs
        ``atmosphere``.
    reference_noise
        Estimate the reference point's own noise from its neighbours and remove it from every
        point (:func:`~depsi.processing.integration.remove_reference_noise`).
    k, min_coherence
        Densification: first-order points per candidate and the acceptance threshold.
    solver
        Where the periodograms run: ``"auto"``, ``"numpy"`` or ``"cupy"``.

    Returns
    -------
    xarray.Dataset
        Result STM ``(space, time)`` of the first-order points kept by the network and the
        accepted densified points, in the input's order: ``velocity`` (m/yr), ``height_error``
        (m), ``displacement`` (m, zero at the first epoch, atmosphere removed),
        ``temporal_coherence``, ``ambiguity``, ``aps`` (rad), ``unwrapped_phase``, ``order``
        (1 first-order, 2 densified), ``point_index`` (index into ``ps_stm.space``) and
        ``in_reference_area``; all relative to the mean over the reference area (the
        first-order points within ``attrs['reference_radius']`` m of the reference point
        ``attrs['reference']``, an index into the input; ``attrs['n_reference_area']`` points).

    Examples
    --------
    >>> from depsi.processing import ps_selection
    >>> from depsi.simulate import simulate_stack
    >>> stack, truth = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> result = run_ps_chain(ps_selection(stack), first_order=40)
    >>> result.attrs["n_first_order"], result.attrs["n_densified"] > 0
    (40, True)
    >>> coherent = result.velocity.where(result.temporal_coherence > 0.8)
    >>> sorted(result.order.to_series().unique().tolist())
    [1, 2]
    """
    points = ps_stm
    if "complex" in points and (("phase" not in points) or "interferogram" not in points.attrs):
        # SLC values (e.g. straight from ps_selection, whose ``phase`` is the SLC phase):
        # form single-mother interferograms first
        from depsi.processing.interferogram import single_mother_interferograms

        points = single_mother_interferograms(points)
    validate(points, "points", require=("phase", "h2ph"), require_wavelength=True)
    points = points.assign_coords(point_index=("space", np.arange(points.sizes["space"])))
    first_idx = _first_order_indices(points, first_order)
    ref_local = None
    if reference is not None:
        found = np.flatnonzero(first_idx == int(reference))
        if not found.size:
            raise ValueError(f"reference: point {reference} is not among the first-order "
                             f"points; choose one with low amplitude dispersion")
        ref_local = int(found[0])
    first = points.isel(space=first_idx).compute()
    options = dict(method=network_method, height_range=height_range,
                   velocity_range=velocity_range, min_coherence=min_arc_coherence, alpha=alpha,
                   solver=solver)
    result = _network_pass(first, reference=ref_local, **options)
    if atmosphere is not None:
        keep = np.flatnonzero(result["in_network"].values)
        network = result.isel(space=keep)
        # a new attrs dict: isel shares the parent's, which must keep the global reference
        network.attrs = {**result.attrs,
                         "reference": int(np.flatnonzero(keep == result.attrs["reference"])[0])}
        net = estimate_atmosphere(network, method=atmosphere, temporal_window=temporal_window)
        corrected = first.isel(space=keep)
        corrected["phase"] = wrap_phase(corrected["phase"] - net["aps"].values).astype(np.float32)
        ref_local = int(np.flatnonzero(keep == result.attrs["reference"])[0])
        second = _network_pass(corrected, reference=ref_local, **options)
        second["aps"] = net["aps"]
        second["aps_observed"] = net["aps_observed"]
        second.attrs.update({a: net.attrs[a] for a in net.attrs
                             if a.startswith("variogram_") or a == "aps_method"})
        result = second
    else:
        result["aps"] = xr.zeros_like(result["unwrapped_phase"])
    if reference_noise:
        result = remove_reference_noise(result)
    # before densification: densified points are tied to these values and reference phase
    result = apply_reference_area(result, reference_radius)
    first_kept = result.isel(space=np.flatnonzero(result["in_network"].values))
    reference_global = int(first_kept["point_index"].values[
        int(np.flatnonzero(first_kept["point_index"].values
                           == result["point_index"].values[result.attrs["reference"]])[0])])

    others = np.setdiff1d(np.arange(points.sizes["space"]), first_kept["point_index"].values)
    pieces = [_result_view(first_kept, order=1)]
    if others.size:
        dense = densify(points.isel(space=others), first_kept, k=k,
                        min_coherence=min_coherence, height_range=height_range,
                        velocity_range=velocity_range, solver=solver).compute()
        accepted = dense.isel(space=np.flatnonzero(dense["accepted"].values))
        pieces.append(_result_view(accepted, order=2))
        logger.info("densification: %d of %d candidates accepted", accepted.sizes["space"],
                    others.size)
    out = xr.concat(pieces, dim="space", coords="minimal", compat="override",
                    combine_attrs="drop")
    out = out.isel(space=np.argsort(out["point_index"].values, kind="stable"))
    area_global = first_kept["point_index"].values[first_kept["in_reference_area"].values]
    out["in_reference_area"] = ("space", np.isin(out["point_index"].values, area_global))
    h2ph = points["h2ph"].transpose("space", ...).isel(space=out["point_index"].values)
    out = out.assign(h2ph=(h2ph.dims, np.asarray(h2ph.values)))
    out.attrs = {"wavelength": float(points.attrs["wavelength"]),
                 "mother_time": str(points.attrs.get("mother_time", ""))}
    if atmosphere is not None:
        out = _fit_with_atmosphere(out, solver=solver)
        if correlated_height:
            out = estimate_correlated_height(out)
    out = out.drop_vars("h2ph")
    fitted = {k: v for k, v in out.attrs.items() if k.startswith("correlated_height_")}
    out.attrs = {k: v for k, v in ps_stm.attrs.items()} | fitted
    out.attrs.update({
        "wavelength": float(points.attrs["wavelength"]),
        "mother_time": str(points.attrs.get("mother_time", "")),
        "reference": reference_global,
        "reference_radius": float(result.attrs["reference_radius"]),
        "n_reference_area": int(result.attrs["n_reference_area"]),
        "n_first_order": int(len(first_idx)),
        "n_first_order_kept": int(first_kept.sizes["space"]),
        "n_densified": int((out["order"].values == 2).sum()),
        "n_rejected": int(points.sizes["space"] - out.sizes["space"]),
    })
    return validate(out, "points")


def _fit_with_atmosphere(out: xr.Dataset, *, solver: str) -> xr.Dataset:
    """Velocity and height error fitted to each point's unwrapped phase *with* its atmosphere.

    The estimated screen serves unwrapping and the displacement series, but its own error
    (the kriging error at each point, white in time) projects onto the time and perpendicular
    baselines: subtracting it before the fit adds about 0.9 m of height noise on a 1 rad,
    400 m screen. The phase with its atmosphere leaks only the true screen's projection, whose
    spatially correlated part :func:`estimate_correlated_height` then takes out. Offset,
    velocity and height error by batched least squares on the same ambiguities; displacement
    and temporal coherence follow from the new values.
    """
    m2ph = phase_per_metre(float(out.attrs["wavelength"]))
    full = (out["unwrapped_phase"] + out["aps"]).transpose("space", "time") / m2ph
    observed = out[["h2ph"]].assign(observed=full.astype(np.float64))
    fit = estimate_model(observed, terms=("offset", "velocity", "height_error"),
                         variable="observed", solver=solver).compute()
    velocity = fit["velocity"].values
    height = fit["height_error"].values
    ok = np.isfinite(velocity) & np.isfinite(height)
    velocity = np.where(ok, velocity, out["velocity"].values)
    height = np.where(ok, height, out["height_error"].values)
    years = years_since_mother(out)
    unwrapped = out["unwrapped_phase"].transpose("space", "time").values.astype(np.float64)
    h2ph = np.broadcast_to(out["h2ph"].transpose("space", ...).values.astype(np.float64)
                           .reshape(out.sizes["space"], -1), unwrapped.shape)
    residual = unwrapped - m2ph * (velocity[:, None] * years + h2ph * height[:, None])
    displacement = unwrapped / m2ph - h2ph * height[:, None]
    displacement -= displacement[:, :1]
    return out.assign(
        velocity=("space", velocity.astype(np.float32)),
        height_error=("space", height.astype(np.float32)),
        displacement=(("space", "time"), displacement.astype(np.float32)),
        temporal_coherence=("space", np.abs(np.mean(np.exp(1j * residual), axis=1))
                            .astype(np.float32)))


def _result_view(ds: xr.Dataset, *, order: int) -> xr.Dataset:
    """The result variables of one set of points, with their ``order`` (1 or 2)."""
    out = ds[list(RESULT_VARIABLES)]
    out = out.assign(order=("space", np.full(ds.sizes["space"], order, dtype=np.int8)))
    drop = [c for c in out.coords if c not in ("time", "azimuth", "range", "lat", "lon", "x", "y",
                                                 "point_index") and "space" in out[c].dims]
    return out.drop_vars(drop)
