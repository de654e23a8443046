"""Atmospheric phase screen (APS): temporal low-pass of the residual phase, spatial estimate.

``estimate_atmosphere`` takes an integrated first-order result, forms each point's residual
phase (unwrapped phase minus the velocity / height-error model), removes unmodelled deformation
with a temporal low-pass, and estimates the screen per epoch in space: ordinary kriging with a
fitted exponential variogram (one Cholesky factorisation shared by all epochs) for small sets,
Gaussian-weighted KD-tree neighbours for large ones. ``interpolate_aps`` carries the screen to
any point set, and ``second_network_pass`` integrates the first-order points again on their
phases corrected by it (docs/design.md, "Architecture").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Literal, overload

import numpy as np
import xarray as xr
from pydantic import Field
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import curve_fit
from scipy.spatial import cKDTree

from depsi.conventions import phase_per_metre
from depsi.processing.datum import POINT_BLOCK
from depsi.processing.integration import estimated_observations, integrate_network
from depsi.processing.network import network_edges, on_threads, point_positions
from depsi.processing.network_solver import _compiled_kernels
from depsi.sections import Section
from depsi.stm.runtime import pageable_copy, release_memory
from depsi.stm.schema import h2ph_rows, validate, years_since_mother

if TYPE_CHECKING:
    from depsi.processing.arcs import ArcsConfig
    from depsi.processing.integration import IntegrationConfig
    from depsi.processing.network import NetworkConfig

logger = logging.getLogger(__name__)

#: Default width (years, Gaussian sigma) of the temporal low-pass that keeps unmodelled
#: deformation out of the screen.
DEFAULT_TEMPORAL_WINDOW = 0.25
#: Default spatial interpolation of the screen: kriging on small networks, Gaussian above.
DEFAULT_METHOD: Final = "auto"
#: Default of the stratified part: estimated wherever the points carry a terrain height.
DEFAULT_STRATIFIED: Final = "auto"
#: Ways of the stratified part ``k_t * z`` (``stratified``).
STRATIFIED = ("auto", "on", "off")
#: Point variable (or coordinate) of the terrain height (m) the stratified part follows: the
#: DEM's height, which selection carries from the stack's ``height`` coordinate.
TERRAIN_HEIGHT = "height"


class AtmosphereConfig(Section):
    """The atmospheric phase screen and its leak into the height errors."""

    method: Literal["auto", "kriging", "gaussian", "none"] = Field(
        DEFAULT_METHOD, description="Spatial interpolation of the screen per epoch: kriging, "
                                    "gaussian, auto (kriging up to a few thousand points, else "
                                    "gaussian) or none (no atmospheric correction).")
    temporal_window: float = Field(
        DEFAULT_TEMPORAL_WINDOW, gt=0, description="Low-pass width (years) separating "
                                                   "unmodelled deformation from atmosphere.")
    second_pass: Literal["network", "refit"] = Field(
        "network", description="After the screen: network (the arcs estimated and integrated "
                               "again on phases corrected for the screen, which re-unwraps "
                               "them) or refit (each first-order point's velocity and height "
                               "fitted to its first-pass unwrapped phase less the screen: the "
                               "first pass's ambiguities kept, about 10x cheaper; as accurate "
                               "under a 1 rad screen, up to 7 % worse velocities under 1.5-2 "
                               "rad, docs/benchmarks.md).")
    correlated_height: bool = Field(
        True, description="Move the atmosphere's projection on the baselines (a smooth field "
                          "in the height errors) into the screen, predicted from all result "
                          "points (needs a method other than none).")
    stratified: Literal["auto", "on", "off"] = Field(
        DEFAULT_STRATIFIED,
        description="The screen's part proportional to terrain height (k_t times the height, "
                    "one rate per epoch fitted on the network points) taken out before the "
                    "turbulent part is interpolated and put back at every point from its own "
                    "height: auto (where the points carry a 'height', the DEM's height of "
                    "the stack's 'height' coordinate), on (refused without one) or off.")

#: ``method="auto"`` uses kriging up to this many points, Gaussian neighbours above.
KRIGING_MAX_POINTS = 3000
#: Neighbours of the Gaussian-weighted estimate.
GAUSSIAN_NEIGHBOURS = 16
#: Point pairs sampled for the empirical variogram.
VARIOGRAM_PAIRS = 20000
#: Nearest neighbours of each sampled point that join the variogram's short-distance pairs.
VARIOGRAM_NEIGHBOURS = 16
_VARIOGRAM_BINS = 20


def _exponential(h, nugget, sill, length):
    return nugget + sill * (1.0 - np.exp(-h / length))


def _variogram_pairs(positions: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Point pairs for the empirical variogram: random pairs (long distances) and each of a
    sample of points with its nearest neighbours (short distances)."""
    n = len(positions)
    rng = np.random.default_rng(seed)
    i = rng.integers(0, n, VARIOGRAM_PAIRS)
    j = rng.integers(0, n, VARIOGRAM_PAIRS)
    k = min(VARIOGRAM_NEIGHBOURS + 1, n)
    centres = rng.choice(n, min(n, VARIOGRAM_PAIRS // max(k - 1, 1)), replace=False)
    _, nbrs = cKDTree(positions).query(positions[centres], k=k)
    nbrs = nbrs.reshape(len(centres), k)[:, 1:]
    i = np.concatenate([i, np.repeat(centres, k - 1)])
    j = np.concatenate([j, nbrs.ravel()])
    keep = i != j
    return i[keep], j[keep]


def empirical_variogram(positions: np.ndarray, values: np.ndarray, *, seed: int = 0
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Binned semivariance of ``values`` ``(N, T)`` (all epochs pooled, each epoch's mean
    removed) on sampled point pairs: mean distance (m), semivariance and pairs of each
    non-empty bin, bins log-spaced from the point spacing to half the extent."""
    i, j = _variogram_pairs(positions, seed)
    dist = np.hypot(*(positions[i] - positions[j]).T)
    centred = values - np.nanmean(values, axis=0, keepdims=True)
    semi = 0.5 * np.nanmean((centred[i] - centred[j]) ** 2, axis=1)
    # log-spaced bins from the point spacing to half the extent: a structure of a few hundred
    # metres gets several bins on any scene size
    near = dist[dist > 0]
    low = max(float(np.quantile(near, 0.01)) if near.size else 1.0, 1e-6)
    high = max(0.5 * float(dist.max()), 2 * low)
    edges = np.concatenate([[0.0], np.geomspace(low, high, _VARIOGRAM_BINS)])
    which = np.digitize(dist, edges) - 1
    ok = (which >= 0) & (which < _VARIOGRAM_BINS) & np.isfinite(semi) & (dist > 0)
    counts = np.bincount(which[ok], minlength=_VARIOGRAM_BINS)
    sums = np.bincount(which[ok], semi[ok], minlength=_VARIOGRAM_BINS)
    dsums = np.bincount(which[ok], dist[ok], minlength=_VARIOGRAM_BINS)
    used = counts > 0
    return dsums[used] / counts[used], sums[used] / counts[used], counts[used]


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
    h, gamma, counts = empirical_variogram(positions, values, seed=seed)
    total = float(np.nanvar(values - np.nanmean(values, axis=0, keepdims=True)))
    try:
        (nugget, sill, length), _ = curve_fit(
            _exponential, h, gamma, p0=[0.1 * total, 0.9 * total, h.max() / 3],
            bounds=([0, 1e-12, 1e-3 * h.max() + 1e-9], [np.inf, np.inf, 10 * h.max() + 1]),
            sigma=1.0 / np.sqrt(counts), maxfev=5000)
    except (RuntimeError, ValueError):
        logger.warning("variogram fit failed; using a pure nugget over the sample variance")
        nugget, sill, length = 0.5 * total, 0.5 * total, h.max() / 3
    return {"nugget": float(nugget), "sill": float(sill), "range": float(length)}


class ScreenInterpolator:
    """An estimated screen, ready to be evaluated at any points: the kriging system is solved
    (or the KD-tree of the Gaussian method built) once, and every call (one per space chunk of
    densification) reuses it.

    Call it with an ``(N, 2)`` array of positions in metres (and, where the screen has a
    stratified part, the ``(N,)`` terrain heights in metres); it returns the ``(N, T)`` float32
    screen (rad).

    ``values`` are the turbulent part (the stratified part taken out); ``stratified_rate``
    ``(T,)`` (rad/m) and ``height_mean`` (m) give the stratified part
    ``stratified_rate * (height - height_mean)`` added at the targets.
    """

    def __init__(self, src_pos: np.ndarray, values: np.ndarray, variogram: dict, method: str,
                 *, stratified_rate: np.ndarray | None = None, height_mean: float = 0.0):
        self.method = method
        self.stratified_rate = (None if stratified_rate is None
                                else np.asarray(stratified_rate, dtype=np.float64))
        self.height_mean = float(height_mean)
        self.variogram = dict(variogram)
        self.src_pos = np.asarray(src_pos, dtype=np.float64)
        if method == "kriging":
            sill, length = variogram["sill"], variogram["range"]
            self.mean = values.mean(axis=0, keepdims=True)
            dist = np.hypot(*(self.src_pos[:, None, :] - self.src_pos[None, :, :])
                            .transpose(2, 0, 1))
            cov = sill * np.exp(-dist / length)
            cov[np.diag_indices_from(cov)] += max(variogram["nugget"], 1e-6 * sill)
            # (N, T): every epoch's weights from one factorisation
            self.weights = cho_solve(cho_factor(cov, lower=True), values - self.mean)
        else:
            # float32, the precision of the screen it returns: the gather of each target's
            # neighbours is half the size (and the weighted mean one batched float32 GEMV)
            self.values = np.asarray(values, dtype=np.float32)
            self.tree = cKDTree(self.src_pos)

    def __call__(self, dst_pos: np.ndarray, heights: np.ndarray | None = None) -> np.ndarray:
        dst_pos = np.asarray(dst_pos, dtype=np.float64)
        if self.method != "kriging":
            out = _gaussian(self.tree, self.values, dst_pos,
                            0.5 * self.variogram["range"]).astype(np.float32, copy=False)
        else:
            sill, length = self.variogram["sill"], self.variogram["range"]
            out = np.empty((len(dst_pos), self.weights.shape[1]), np.float32)
            step = max(1, int(2**24 // max(len(self.src_pos), 1)))
            for start in range(0, len(dst_pos), step):  # chunks of targets, bounded memory
                d = np.hypot(*(dst_pos[start:start + step, None, :] - self.src_pos[None])
                             .transpose(2, 0, 1))
                out[start:start + step] = (sill * np.exp(-d / length)) @ self.weights + self.mean
        return self.add_stratified(out, heights)

    def add_stratified(self, screen: np.ndarray, heights: np.ndarray | None) -> np.ndarray:
        """``screen`` (the turbulent part at some points, ``(N, T)``) plus the stratified part
        at their ``heights`` (m); ``screen`` itself where the screen has no stratified part."""
        if self.stratified_rate is None:
            return screen
        if heights is None:
            raise ValueError("heights: the screen has a stratified part (a rate per epoch times "
                             "the terrain height): expected the targets' terrain heights (m)")
        heights = np.asarray(heights, dtype=np.float64).reshape(-1)
        if len(heights) != len(screen):
            raise ValueError(f"heights: expected {len(screen)} terrain heights (m), found "
                             f"{len(heights)}")
        screen += stratified_part(heights, self.height_mean, self.stratified_rate
                                  ).astype(screen.dtype)
        return screen


def screen_interpolator(aps: xr.Dataset) -> ScreenInterpolator:
    """The screen of :func:`estimate_atmosphere` (``aps_observed``, variogram attrs) as a
    :class:`ScreenInterpolator`, its kriging system solved once."""
    if "aps_observed" not in aps:
        raise KeyError(f"aps: expected variable 'aps_observed' from estimate_atmosphere, found "
                       f"{sorted(map(str, aps.data_vars))}")
    observed = aps["aps_observed"].transpose("space", "time").values
    use = np.isfinite(observed).all(axis=1)
    variogram = {k: float(aps.attrs[f"variogram_{k}"]) for k in ("nugget", "sill", "range")}
    method = aps.attrs.get("aps_method", "kriging")
    rate, height_mean = None, 0.0
    if method == "kriging" or "stratified_rate" in aps:
        # float64 where it is computed with; the Gaussian's sources are float32 as stored
        # (no float64 copy of 0.7 GB at 1.5 M points for the same float32 values)
        observed = observed.astype(np.float64)
    if "stratified_rate" in aps:
        rate = aps["stratified_rate"].values.astype(np.float64)
        height_mean = float(aps.attrs["stratified_height_mean"])
        observed = observed - stratified_part(terrain_heights(aps, "on"), height_mean, rate)
    return ScreenInterpolator(point_positions(aps)[use], observed if use.all() else observed[use],
                              variogram, method, stratified_rate=rate, height_mean=height_mean)


@overload
def terrain_heights(points: xr.Dataset, stratified: Literal["on"]) -> np.ndarray: ...
@overload
def terrain_heights(points: xr.Dataset, stratified: str = ...) -> np.ndarray | None: ...
def terrain_heights(points: xr.Dataset, stratified: str = DEFAULT_STRATIFIED
                    ) -> np.ndarray | None:
    """The points' terrain heights (m, :data:`TERRAIN_HEIGHT`) for the stratified part, or
    None where ``stratified`` is ``"off"``, or ``"auto"`` and the points carry none.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> points = xr.Dataset(coords={"height": ("space", np.array([10.0, 250.0]))})
    >>> terrain_heights(points), terrain_heights(points, "off")
    (array([ 10., 250.]), None)
    >>> terrain_heights(xr.Dataset(), "on")
    Traceback (most recent call last):
    ...
    ValueError: atmosphere.stratified: 'on' needs the points' terrain height 'height' (m; ...
    """
    if stratified not in STRATIFIED:
        raise ValueError(f"stratified: expected one of {list(STRATIFIED)}, found {stratified!r}")
    if stratified == "off" or (stratified == "auto" and TERRAIN_HEIGHT not in points.variables):
        return None
    if TERRAIN_HEIGHT not in points.variables:
        raise ValueError(f"atmosphere.stratified: 'on' needs the points' terrain height "
                         f"{TERRAIN_HEIGHT!r} (m; the stack's {TERRAIN_HEIGHT!r} coordinate, a "
                         f"DEM in radar geometry, or input.dem), found none")
    heights = np.asarray(points[TERRAIN_HEIGHT].values, dtype=np.float64)
    if heights.shape != (points.sizes.get("space", -1),):
        raise ValueError(f"{TERRAIN_HEIGHT}: expected one terrain height per point, found shape "
                         f"{heights.shape}")
    return heights


def stratified_part(heights: np.ndarray, height_mean: float, rate: np.ndarray) -> np.ndarray:
    """The stratified screen ``rate_t * (height - height_mean)`` (rad, ``(N, T)``); zero at
    points without a height (NaN: outside the DEM), which keep the turbulent part alone.

    Examples
    --------
    >>> stratified_part(np.array([100.0, np.nan]), 50.0, np.array([0.0, 0.01]))
    array([[0. , 0.5],
           [0. , 0. ]])
    """
    offset = np.asarray(heights, np.float64) - height_mean
    offset = np.where(np.isfinite(offset), offset, 0.0)
    return offset[:, None] * np.asarray(rate, np.float64)[None, :]


def fit_stratified(heights: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, float]:
    """Rates ``k_t`` (rad/m, one per epoch) of the screen's linear dependence on terrain height,
    least squares over the points with an intercept per epoch, and the heights' mean.

    ``observed`` ``(N, T)``: the screen at ``N`` points with ``heights`` ``(N,)`` (m). An
    epoch's rate is ``cov(z, phi_t) / var(z)``: unbiased when the turbulent part does not
    depend on the terrain, though its spatial correlation leaves the rate's error larger than
    for white noise. Heights that do not vary (under a metre's spread) give zero rates;
    points without a height (NaN) are left out.

    Examples
    --------
    >>> import numpy as np
    >>> z = np.linspace(0.0, 500.0, 50)
    >>> rate, mean = fit_stratified(z, np.outer(z, [0.0, 0.004, -0.002]) + 1.0)
    >>> np.round(rate, 6).tolist(), round(mean, 6)
    ([0.0, 0.004, -0.002], 250.0)
    """
    heights = np.asarray(heights, dtype=np.float64)
    finite = np.isfinite(heights)
    if finite.sum() < 3:
        return np.zeros(observed.shape[1]), 0.0
    heights, observed = heights[finite], observed[finite]
    mean = float(heights.mean())
    centred = heights - mean
    spread = float(centred @ centred)
    if spread < len(heights):  # under a metre's rms: no height to regress on
        return np.zeros(observed.shape[1]), mean
    rate = centred @ (observed - observed.mean(axis=0, keepdims=True)) / spread
    return rate, mean


#: Targets per block of :func:`_gaussian`: bounds its ``(targets, k, epochs)`` gather of the
#: neighbours' values (60 MB at k = 16 and 60 epochs) whatever the number of targets (at 1.5 M
#: targets it was 11 GB in one piece).
GAUSSIAN_BLOCK = 8192


def _gaussian(tree, values, dst_pos, length_scale, k=GAUSSIAN_NEIGHBOURS) -> np.ndarray:
    """Gaussian-weighted mean of the ``k`` nearest sources (sigma ``length_scale``), in blocks
    of :data:`GAUSSIAN_BLOCK` targets."""
    k = min(k, tree.n)
    out = np.empty((len(dst_pos),) + values.shape[1:], dtype=values.dtype)

    def block(start: int) -> None:  # each block writes its own rows
        targets = dst_pos[start:start + GAUSSIAN_BLOCK]
        dist, idx = tree.query(targets, k=k)
        out[start:start + GAUSSIAN_BLOCK] = gaussian_mean(
            dist.reshape(len(targets), k), idx.reshape(len(targets), k), values, length_scale)

    on_threads(block, range(0, len(dst_pos), GAUSSIAN_BLOCK))
    return out


def gaussian_mean(dist: np.ndarray, idx: np.ndarray, values: np.ndarray,
                  length_scale: float) -> np.ndarray:
    """Gaussian-weighted mean (sigma ``length_scale``) of the rows ``values[idx]`` of each
    target's neighbours, at distances ``dist``: the screen of the ``"gaussian"`` method from
    neighbours found once (densification finds them per chunk before its tasks run).

    Where Numba runs, :func:`depsi.kernels.gather_numba.gaussian_mean` computes it with no
    ``(targets, k, epochs)`` gather, in float64 (within
    :func:`~depsi.kernels.gather_numba.gaussian_error` of this float32 GEMV)."""
    if _compiled_kernels("gather_numba"):
        from depsi.kernels import gather_numba

        return gather_numba.gaussian_mean(dist, idx, values, length_scale)
    w = np.exp(-0.5 * (dist / length_scale) ** 2) + 1e-12
    w /= w.sum(axis=1, keepdims=True)
    # (n, 1, k) @ (n, k, T), in the values' precision: a batched GEMV (einsum's mixed-type
    # contraction took twice as long)
    return np.matmul(w.astype(values.dtype)[:, None, :], values[idx])[:, 0]


def lowpass(residual: np.ndarray, years: np.ndarray, window: float) -> np.ndarray:
    """Gaussian-weighted temporal mean of each point's series (sigma ``window`` years)."""
    w = _lowpass_weights(years, window)
    return np.zeros_like(residual) if w is None else residual @ w


def _high_passed_residual(ds: xr.Dataset, years: np.ndarray, window: float,
                          regressors: Mapping[str, np.ndarray] | None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Every point's residual from its model (velocity, height error, the ``regressors``'
    terms), less its temporal low-pass (:func:`lowpass`) and its value at the mother epoch:
    float64 ``(space, time)``, with the points whose phases and model are finite. Made in
    blocks of :data:`~depsi.processing.datum.POINT_BLOCK` points, each on a thread: the float64
    phases, h2ph, model and residual follow the block, not the points (docs/benchmarks.md,
    "Per-point work in blocks")."""
    n, n_epochs = ds.sizes["space"], ds.sizes["time"]
    m2ph = phase_per_metre(ds.attrs["wavelength"])
    unwrapped_all = ds["unwrapped_phase"].transpose("space", "time").values
    h2ph_all = ds["h2ph"].transpose("space", ...)
    velocity, height = ds["velocity"].values, ds["height_error"].values
    coefficients = [(ds[name].values.astype(np.float64), np.asarray(values))
                    for name, values in (regressors or {}).items()]
    weights = _lowpass_weights(years, window)
    mother = int(np.argmin(np.abs(years)))
    observed = np.empty((n, n_epochs))
    finite = np.empty(n, dtype=bool)

    def block(start: int) -> None:  # each block writes its own rows
        rows = slice(start, min(start + POINT_BLOCK, n))
        unwrapped = unwrapped_all[rows].astype(np.float64)
        model = m2ph * (velocity[rows, None] * years[None, :]
                        + h2ph_rows(h2ph_all, rows, n_epochs) * height[rows, None])
        for coefficient, values in coefficients:
            model += m2ph * coefficient[rows, None] * values[None, :]
        finite[rows] = np.isfinite(unwrapped).all(axis=1) & np.isfinite(model).all(axis=1)
        residual = unwrapped - model
        high = residual - (residual @ weights if weights is not None else 0.0)
        high -= high[:, mother:mother + 1]  # single-mother screens vanish at the mother
        observed[rows] = high

    on_threads(block, range(0, n, POINT_BLOCK))
    return observed, finite


def _lowpass_weights(years: np.ndarray, window: float) -> np.ndarray | None:
    """The ``(T, T)`` weights of :func:`lowpass` (None: no low-pass)."""
    if window <= 0:
        return None
    w = np.exp(-0.5 * ((years[:, None] - years[None, :]) / window) ** 2)
    w /= w.sum(axis=0, keepdims=True)
    return w


def estimate_atmosphere(
    points_result: xr.Dataset,
    *,
    method: Literal["auto", "kriging", "gaussian"] = DEFAULT_METHOD,
    temporal_window: float = DEFAULT_TEMPORAL_WINDOW,
    regressors: Mapping[str, np.ndarray] | None = None,
    stratified: Literal["auto", "on", "off"] = DEFAULT_STRATIFIED,
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
        the variogram range) or ``"auto"`` (default, :data:`DEFAULT_METHOD`: kriging up to
        :data:`KRIGING_MAX_POINTS` points).
    temporal_window
        Sigma (years) of the temporal Gaussian low-pass of the residual phase; what it passes
        is treated as unmodelled deformation, the rest as atmosphere plus noise.
    regressors
        Further model terms, column name to ``(T,)`` values (metres per unit coefficient, e.g.
        :attr:`depsi.processing.motion_models.TemporalModel.regressors`): each point's
        coefficient is read from ``points_result[name]`` and its motion taken out of the
        residual with the velocity and height error's.
    stratified
        The screen's part proportional to terrain height (:func:`fit_stratified` on the
        network points' heights :data:`TERRAIN_HEIGHT`): ``"auto"`` (where the points carry
        heights), ``"on"`` (refused without) or ``"off"``. It is taken out before the variogram
        and the interpolation, and put back at every point from its own height, so a point on
        a ridge between valley points gets its ridge's screen.

    Returns
    -------
    xarray.Dataset
        ``points_result`` plus ``aps`` (rad, space x time; zero at the mother epoch, relative to
        the reference point like the phases) at every point, and ``aps_observed`` (the
        high-passed residual the screen was estimated from; NaN off the network). Attrs
        ``aps_method``, ``variogram_nugget``, ``variogram_sill``, ``variogram_range``, used by
        :func:`interpolate_aps`. With a stratified part: ``stratified_rate`` ``(time,)``
        (rad/m) and attr ``stratified_height_mean`` (m); ``aps`` includes the part.

    Notes
    -----
    The screen's projection on the perpendicular baselines stays in the height errors here
    (the fitted model absorbed it);
    :func:`depsi.processing.correlated_height.estimate_correlated_height` predicts it from the
    spatial structure of the heights.

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
    years = years_since_mother(ds)
    observed, finite = _high_passed_residual(ds, years, temporal_window, regressors)
    use &= finite
    if use.sum() < 3:
        raise ValueError(f"points_result: expected at least 3 network points with finite "
                         f"results for an atmosphere estimate, found {int(use.sum())}")
    if not use.all():
        observed = observed[use]
    positions = point_positions(ds)
    heights = terrain_heights(ds, stratified)
    turbulent = observed
    if heights is not None:
        rate, height_mean = fit_stratified(heights[use], observed)
        turbulent = observed - stratified_part(heights[use], height_mean, rate)
    variogram = fit_variogram(positions[use], turbulent)
    chosen = method if method != "auto" else (
        "kriging" if use.sum() <= KRIGING_MAX_POINTS else "gaussian")
    aps_observed = np.full((ds.sizes["space"], ds.sizes["time"]), np.nan, np.float32)
    aps_observed[use] = observed
    del turbulent, observed  # the interpolation reads aps_observed
    out = ds.assign(aps_observed=(("space", "time"), aps_observed))
    out.attrs.update({"aps_method": chosen, "temporal_window": temporal_window,
                      **{f"variogram_{k}": v for k, v in variogram.items()}})
    if heights is not None:
        out["stratified_rate"] = ("time", rate, {"units": "rad/m", "long_name":
                                                 "phase per metre of terrain height"})
        out.attrs["stratified_height_mean"] = height_mean
        logger.info("atmosphere: stratified part, rates %.2g rad/m rms over the epochs, on "
                    "heights of %.0f m rms (%d network points without a height)",
                    np.sqrt(np.mean(rate ** 2)), np.nanstd(heights[use]),
                    int((~np.isfinite(heights[use])).sum()))
    aps = interpolate_aps(out, ds)
    logger.info("atmosphere (%s): %d points, variogram %s", chosen, use.sum(), variogram)
    return out.assign(aps=aps)


def interpolate_aps(aps: xr.Dataset, to_points: xr.Dataset | np.ndarray,
                    heights: np.ndarray | None = None) -> xr.DataArray:
    """The atmospheric phase screen of :func:`estimate_atmosphere` at other points.

    Parameters
    ----------
    aps
        Output of :func:`estimate_atmosphere` (``aps_observed`` and the variogram attrs).
    to_points
        A point STM (positions from ``x``/``y`` or ``azimuth``/``range``, see
        :func:`depsi.processing.network.point_positions`) or an ``(N, 2)`` array of metres.
    heights
        The targets' terrain heights (m), where the screen has a stratified part; default those
        a point STM carries (:data:`TERRAIN_HEIGHT`).

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
    dst = (np.asarray(to_points, dtype=np.float64) if isinstance(to_points, np.ndarray)
           else point_positions(to_points))
    if heights is None and "stratified_rate" in aps and not isinstance(to_points, np.ndarray):
        heights = terrain_heights(to_points, "on")
    values = screen_interpolator(aps)(dst, heights)
    return xr.DataArray(values.astype(np.float32, copy=False), dims=("space", "time"),
                        coords={"time": aps["time"].values})


def second_network_pass(points: xr.Dataset, reference: int, *, network: NetworkConfig,
                        arcs: ArcsConfig, integration: IntegrationConfig,
                        extra_regressors: Mapping[str, tuple] | None = None,
                        devices=None) -> xr.Dataset:
    """The first-order ``points`` integrated again, their phases corrected by the screen: a new
    network among them (``network``, its ``second_pass_k`` neighbours where set), every arc
    estimated by the periodogram (``arcs``), batch by batch, and the network solved with arc
    testing (``integration``) on the point ``reference`` (an index into ``points``).

    ``extra_regressors``: the model's terms the arcs' periodogram searches
    (:meth:`~depsi.processing.motion_models.TemporalModel.search`), also the integration's
    regressors."""
    k = network.k if network.second_pass_k is None else network.second_pass_k
    source, target = network_edges(point_positions(points), method=network.method, k=k,
                                   n_sectors=network.n_sectors, max_length=network.max_length)
    # held through the whole network's factorisation: in a file's pages, which it lets go
    source, target = pageable_copy(source), pageable_copy(target)
    release_memory()
    # in memory once, not read again by every batch (no copy where it is)
    observations = estimated_observations(points.compute(), source, target,
                                          height_range=arcs.height_range,
                                          velocity_range=arcs.velocity_range,
                                          height_step=arcs.height_step,
                                          velocity_step=arcs.velocity_step, devices=devices,
                                          extra_regressors=extra_regressors)
    searched = {name: values for name, (values, *_) in (extra_regressors or {}).items()}
    result = integrate_network(points, observations, reference=reference,
                               min_coherence=integration.min_coherence, alpha=integration.alpha,
                               max_iterations=integration.max_iterations, regressors=searched)
    result.attrs["second_pass"] = "network"
    return result
