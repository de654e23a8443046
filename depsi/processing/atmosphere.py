"""Atmospheric phase screen (APS): temporal low-pass of the residual phase, spatial estimate.

``estimate_atmosphere`` takes an integrated first-order result, forms each point's residual
phase (unwrapped phase minus the velocity / height-error model), removes unmodelled deformation
with a temporal low-pass, and estimates the screen per epoch in space: ordinary kriging with a
fitted exponential variogram (one Cholesky factorisation shared by all epochs) for small sets,
Gaussian-weighted KD-tree neighbours for large ones. ``interpolate_aps`` carries the screen to
any point set (DESIGN.md §1).
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import xarray as xr
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import curve_fit
from scipy.spatial import cKDTree

from depsi.processing.network import phase_to_metres, point_positions, time_in_years
from depsi.stm.schema import validate

logger = logging.getLogger(__name__)

#: Default width (years, Gaussian sigma) of the temporal low-pass that keeps unmodelled
#: deformation out of the screen.
DEFAULT_TEMPORAL_WINDOW = 0.25
#: ``method="auto"`` uses kriging up to this many points, Gaussian neighbours above.
KRIGING_MAX_POINTS = 3000
#: Neighbours of the Gaussian-weighted estimate.
GAUSSIAN_NEIGHBOURS = 16
#: Neighbours averaged for the spatially correlated part of the height error.
CORRELATED_HEIGHT_NEIGHBOURS = 512
#: Gaussian sigma of that average, as a fraction of the fitted variogram range. Smaller follows
#: more of the atmosphere's small-scale projection but averages fewer point height errors;
#: 0.15 (about 400 m for a 2.5 km range) was the best of 0.1, 0.15, 0.25, 0.5 on the simulated
#: accuracy scene (tests/test_chain_accuracy.py) and is checked there on a second seed.
CORRELATED_HEIGHT_SCALE = 0.15
#: Point pairs sampled for the empirical variogram.
VARIOGRAM_PAIRS = 20000
_VARIOGRAM_BINS = 15


def _exponential(h, nugget, sill, length):
    return nugget + sill * (1.0 - np.exp(-h / length))


def fit_variogram(positions: np.ndarray, values: np.ndarray, *, seed: int = 0) -> dict:
    """Fit an exponential variogram ``nugget + sill (1 - exp(-h / range))`` to ``values``
    ``(N, T)`` (all epochs pooled, each epoch's mean removed) on sampled point pairs.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> fit = fit_variogram(rng.uniform(0, 1000, (200, 2)), rng.normal(0, 1, (200, 5)))
    >>> sorted(fit)
    ['nugget', 'range', 'sill']
    """
    n = len(positions)
    rng = np.random.default_rng(seed)
    i = rng.integers(0, n, VARIOGRAM_PAIRS)
    j = rng.integers(0, n, VARIOGRAM_PAIRS)
    keep = i != j
    i, j = i[keep], j[keep]
    dist = np.hypot(*(positions[i] - positions[j]).T)
    centred = values - np.nanmean(values, axis=0, keepdims=True)
    semi = 0.5 * np.nanmean((centred[i] - centred[j]) ** 2, axis=1)
    edges = np.linspace(0, 0.5 * dist.max(), _VARIOGRAM_BINS + 1)
    which = np.digitize(dist, edges) - 1
    ok = (which >= 0) & (which < _VARIOGRAM_BINS) & np.isfinite(semi)
    counts = np.bincount(which[ok], minlength=_VARIOGRAM_BINS)
    sums = np.bincount(which[ok], semi[ok], minlength=_VARIOGRAM_BINS)
    used = counts > 0
    h = 0.5 * (edges[:-1] + edges[1:])[used]
    gamma = sums[used] / counts[used]
    total = float(np.nanvar(centred))
    try:
        (nugget, sill, length), _ = curve_fit(
            _exponential, h, gamma, p0=[0.1 * total, 0.9 * total, h.max() / 3],
            bounds=([0, 1e-12, 1e-3 * h.max() + 1e-9], [np.inf, np.inf, 10 * h.max() + 1]),
            sigma=1.0 / np.sqrt(counts[used]), maxfev=5000)
    except (RuntimeError, ValueError):
        logger.warning("variogram fit failed; using a pure nugget over the sample variance")
        nugget, sill, length = 0.5 * total, 0.5 * total, h.max() / 3
    return {"nugget": float(nugget), "sill": float(sill), "range": float(length)}


def _kriging(src_pos, values, dst_pos, variogram) -> np.ndarray:
    """Simple kriging of each epoch (its mean removed) of ``values (N, T)`` at ``dst_pos``."""
    sill, length, nugget = variogram["sill"], variogram["range"], variogram["nugget"]
    mean = values.mean(axis=0, keepdims=True)
    dist = np.hypot(*(src_pos[:, None, :] - src_pos[None, :, :]).transpose(2, 0, 1))
    cov = sill * np.exp(-dist / length)
    cov[np.diag_indices_from(cov)] += max(nugget, 1e-6 * sill)
    weights = cho_solve(cho_factor(cov, lower=True), values - mean)  # (N, T), all epochs
    out = np.empty((len(dst_pos), values.shape[1]))
    step = max(1, int(2**24 // max(len(src_pos), 1)))
    for start in range(0, len(dst_pos), step):  # chunks of targets, bounded memory
        d = np.hypot(*(dst_pos[start:start + step, None, :] - src_pos[None]).transpose(2, 0, 1))
        out[start:start + step] = (sill * np.exp(-d / length)) @ weights + mean
    return out


def _gaussian(src_pos, values, dst_pos, length_scale, k=GAUSSIAN_NEIGHBOURS) -> np.ndarray:
    """Gaussian-weighted mean of the ``k`` nearest sources (sigma ``length_scale``)."""
    k = min(k, len(src_pos))
    dist, idx = cKDTree(src_pos).query(dst_pos, k=k)
    dist, idx = dist.reshape(len(dst_pos), k), idx.reshape(len(dst_pos), k)
    w = np.exp(-0.5 * (dist / length_scale) ** 2) + 1e-12
    w /= w.sum(axis=1, keepdims=True)
    return np.einsum("nk,nkt->nt", w, values[idx])


def _lowpass(residual: np.ndarray, years: np.ndarray, window: float) -> np.ndarray:
    """Gaussian-weighted temporal mean of each point's series (sigma ``window`` years)."""
    if window <= 0:
        return np.zeros_like(residual)
    w = np.exp(-0.5 * ((years[:, None] - years[None, :]) / window) ** 2)
    w /= w.sum(axis=0, keepdims=True)
    return residual @ w


def estimate_atmosphere(
    points_result: xr.Dataset,
    *,
    method: Literal["auto", "kriging", "gaussian"] = "auto",
    temporal_window: float = DEFAULT_TEMPORAL_WINDOW,
    correlated_height: bool = True,
) -> xr.Dataset:
    """Estimate the atmospheric phase screen at the points of an integrated network.

    Parameters
    ----------
    points_result
        Output of :func:`depsi.processing.integration.integrate_network`: ``unwrapped_phase``,
        ``velocity``, ``height_error``, ``h2ph``; only ``in_network`` points (when present) are
        used as observations.
    method
        ``"kriging"`` (fitted exponential variogram, one factorisation for all epochs),
        ``"gaussian"`` (Gaussian-weighted :data:`GAUSSIAN_NEIGHBOURS` nearest points, sigma half
        the variogram range) or ``"auto"`` (kriging up to :data:`KRIGING_MAX_POINTS` points).
    temporal_window
        Sigma (years) of the temporal Gaussian low-pass of the residual phase; what it passes
        is treated as unmodelled deformation, the rest as atmosphere plus noise.
    correlated_height
        Also move the spatially correlated part of the height error into the screen (the
        "spatially correlated look-angle error" of StaMPS): an atmosphere that is white in time
        still projects onto the perpendicular baselines of each point, and that projection is a
        smooth field added to the height errors (about 2.8 m RMS for a 1 rad screen and 60
        epochs of 100 m baseline spread). Point height errors are assumed spatially
        uncorrelated at the scale of the screen, so the Gaussian-weighted mean of the
        :data:`CORRELATED_HEIGHT_NEIGHBOURS` nearest height errors (sigma
        :data:`CORRELATED_HEIGHT_SCALE` times the variogram range), relative to its value at
        the reference point, is taken as that projection:
        ``m2ph * h2ph * smooth(height_error)`` joins ``aps_observed``. ``False`` keeps all of
        the height error (for scenes where DEM errors are correlated over kilometres).

    Returns
    -------
    xarray.Dataset
        ``points_result`` plus ``aps`` (rad, space x time; zero at the mother epoch, relative to
        the reference point like the phases) at every point, and ``aps_observed`` (the
        high-passed residual the screen was estimated from, plus the correlated height term;
        NaN off the network), ``height_error_correlated`` (m, the smooth height field moved into
        the screen; zero when ``correlated_height`` is False). Attrs
        ``aps_method``, ``variogram_nugget``, ``variogram_sill``, ``variogram_range``, used by
        :func:`interpolate_aps`.

    Examples
    --------
    >>> from depsi.processing import (estimate_arcs, form_network, integrate_network,
    ...                               ps_selection, single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> result = integrate_network(points, estimate_arcs(form_network(points)))
    >>> with_aps = estimate_atmosphere(result)
    >>> with_aps.aps.dims, with_aps.attrs["aps_method"] in ("kriging", "gaussian")
    (('space', 'time'), True)
    >>> corrected = with_aps.unwrapped_phase - with_aps.aps
    """
    validate(points_result, "points",
             require=("unwrapped_phase", "velocity", "height_error", "h2ph"),
             require_wavelength=True)
    if method not in ("auto", "kriging", "gaussian"):
        raise ValueError(f"method: expected 'auto', 'kriging' or 'gaussian', found {method!r}")
    ds = points_result
    use = (np.asarray(ds["in_network"].values, dtype=bool) if "in_network" in ds
           else np.ones(ds.sizes["space"], dtype=bool))
    years = time_in_years(ds)
    m2ph = phase_to_metres(ds.attrs["wavelength"])
    unwrapped = ds["unwrapped_phase"].transpose("space", "time").values.astype(np.float64)
    h2ph = np.broadcast_to(ds["h2ph"].transpose("space", ...).values.astype(np.float64)
                           .reshape(ds.sizes["space"], -1), unwrapped.shape)
    model = m2ph * (ds["velocity"].values[:, None] * years[None, :]
                    + h2ph * ds["height_error"].values[:, None])
    use &= np.isfinite(unwrapped).all(axis=1) & np.isfinite(model).all(axis=1)
    if use.sum() < 3:
        raise ValueError(f"points_result: expected at least 3 network points with finite "
                         f"results for an atmosphere estimate, found {int(use.sum())}")
    residual = (unwrapped - model)[use]
    observed = residual - _lowpass(residual, years, temporal_window)
    mother = int(np.argmin(np.abs(years)))
    observed -= observed[:, mother:mother + 1]  # single-mother screens vanish at the mother
    positions = point_positions(ds)
    variogram = fit_variogram(positions[use], observed)
    correlated = np.zeros(ds.sizes["space"])
    if correlated_height:
        correlated = _correlated_height(ds, positions, use,
                                        CORRELATED_HEIGHT_SCALE * variogram["range"])
        observed = observed + m2ph * h2ph[use] * correlated[use, None]
    chosen = method if method != "auto" else (
        "kriging" if use.sum() <= KRIGING_MAX_POINTS else "gaussian")
    aps_observed = np.full(unwrapped.shape, np.nan)
    aps_observed[use] = observed
    out = ds.assign(aps_observed=(("space", "time"), aps_observed.astype(np.float32)),
                    height_error_correlated=("space", correlated.astype(np.float32)))
    out.attrs.update({"aps_method": chosen, "temporal_window": temporal_window,
                      **{f"variogram_{k}": v for k, v in variogram.items()}})
    aps = interpolate_aps(out, ds)
    logger.info("atmosphere (%s): %d points, variogram %s", chosen, use.sum(), variogram)
    return out.assign(aps=aps)


def _correlated_height(ds, positions, use, length_scale) -> np.ndarray:
    """Smooth field of the height errors at every point, zero at the reference point.

    The reference is ``attrs['reference']`` when it indexes a used point (the value there is
    subtracted, so the datum does not move), else the field's mean is removed.
    """
    height = ds["height_error"].values.astype(np.float64)[use]
    field = _gaussian(positions[use], height[:, None], positions, length_scale,
                      k=CORRELATED_HEIGHT_NEIGHBOURS)[:, 0]
    ref = ds.attrs.get("reference")
    if ref is not None and 0 <= int(ref) < len(use) and use[int(ref)]:
        return field - field[int(ref)]
    return field - field[use].mean()


def interpolate_aps(aps: xr.Dataset, to_points: xr.Dataset | np.ndarray) -> xr.DataArray:
    """The atmospheric phase screen of :func:`estimate_atmosphere` at other points.

    Parameters
    ----------
    aps
        Output of :func:`estimate_atmosphere` (``aps_observed`` and the variogram attrs).
    to_points
        A point STM (positions from ``x``/``y`` or ``azimuth``/``range``, see
        :func:`depsi.processing.network.point_positions`) or an ``(N, 2)`` array of metres.

    Returns
    -------
    xarray.DataArray
        ``(space, time)`` float32 screen (rad) at ``to_points``.

    Examples
    --------
    >>> import numpy as np
    >>> from depsi.processing import (estimate_arcs, estimate_atmosphere, form_network,
    ...                               integrate_network, ps_selection,
    ...                               single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> best = np.argsort(points.amplitude_dispersion.values)
    >>> first, candidates = points.isel(space=best[:40]), points.isel(space=best[40:])
    >>> with_aps = estimate_atmosphere(integrate_network(first, estimate_arcs(form_network(first))))
    >>> screen = interpolate_aps(with_aps, candidates)
    >>> screen.shape == (candidates.sizes["space"], 20), str(screen.dtype)
    (True, 'float32')
    """
    for name in ("aps_observed",):
        if name not in aps:
            raise KeyError(f"aps: expected variable {name!r} from estimate_atmosphere, found "
                           f"{sorted(aps.data_vars)}")
    observed = aps["aps_observed"].transpose("space", "time").values.astype(np.float64)
    use = np.isfinite(observed).all(axis=1)
    src = point_positions(aps)[use]
    dst = (np.asarray(to_points, dtype=np.float64) if isinstance(to_points, np.ndarray)
           else point_positions(to_points))
    variogram = {k: float(aps.attrs[f"variogram_{k}"]) for k in ("nugget", "sill", "range")}
    if aps.attrs.get("aps_method", "kriging") == "kriging":
        values = _kriging(src, observed[use], dst, variogram)
    else:
        values = _gaussian(src, observed[use], dst, 0.5 * variogram["range"])
    return xr.DataArray(values.astype(np.float32), dims=("space", "time"),
                        coords={"time": aps["time"].values})
