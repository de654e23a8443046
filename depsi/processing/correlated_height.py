"""The atmosphere's projection on the perpendicular baselines, taken out of the height errors.

An atmospheric phase screen that is white in time still projects onto each point's
perpendicular baselines: a least-squares fit of ``[m2ph t, m2ph h2ph_t, 1]`` to a phase that
contains the screen ``a_t(x)`` moves ``leak(x) = g(x) . a(x)`` into the height error, with
``g`` the height row of the fit's pseudo-inverse. No per-point estimator can tell that leak
apart from a DEM error; only its spatial structure can. Its covariance follows from the screen's:
``cov(leak_i, leak_j) = c_aps(d_ij) g_i . g_j`` (about ``c_aps(d_ij) sqrt(s_i s_j)`` with
``s = g . g``), so it is a smooth field with the atmosphere's correlation length, while the
height errors of distinct buildings are (nearly) white.

:func:`estimate_correlated_height` computes the best linear unbiased prediction of that field
(local simple kriging over the ``k`` nearest points, batched) from the estimated height errors
of every result point, with

- the *signal* covariance derived from the atmosphere's variogram (not fitted to the
  heights, so true heights are not mistaken for it), whose correlation model (exponential,
  Gaussian or stable ``exp(-(d / r)^a)``) is the one that fits the residual phases' binned
  semivariance best by AIC, not assumed: smooth screens are Gaussian-like, turbulent ones
  stable with ``a`` below 2, and an exponential model on either moves too little, and
- the *observation* covariance fitted to the heights themselves: the signal, plus a nugget
  (white DEM errors and noise), plus an exponential term for DEM errors that are spatially
  correlated (blocks of buildings on one wrong DEM post).

When the heights are white, the prediction removes most of the leak; when DEM errors are
themselves correlated, the fitted extra term makes the prediction shrink towards zero instead
of moving real DEM errors into the screen. Each point's kriging variance is the variance of the
leak left in its height (``height_error_correlated_std``), which the height's standard
deviation carries (:func:`~depsi.processing.model_fit.point_uncertainty`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
from scipy.linalg import solve_triangular
from scipy.optimize import curve_fit
from scipy.spatial import cKDTree
from scipy.stats import f as f_distribution

from depsi.conventions import phase_per_metre
from depsi.kernels.backend import (
    Device,
    array_namespace,
    chunk_device,
    cuda_devices,
    resolve_devices,
    single_threaded_blas,
    to_device,
    to_host,
    use_device,
)
from depsi.kernels.neighbours import nearest_neighbours
from depsi.processing.network import cell_keys, on_threads, point_positions
from depsi.processing.network_solver import _compiled_kernels
from depsi.stm.runtime import MMAP_THRESHOLD, workers_client
from depsi.stm.schema import h2ph_rows, years_since_mother

logger = logging.getLogger(__name__)

#: Nearest points whose height errors predict the correlated part at each point: enough to
#: cover a disc of the atmosphere's correlation length, within these bounds. At 10^6 points
#: (465 m screen, 200 points in its disc) 128 against 192 changed the height RMSE by 0.03 %
#: (1.3282 m against 1.3278 m; 96: 1.3302 m) and took the kriging from 14 s to 8 s.
NEIGHBOURS = (48, 128)
#: Points sampled for the empirical variograms: every pair of them where the points are no
#: more, else as many centres, each with :data:`VARIOGRAM_PARTNERS` partners near it.
VARIOGRAM_POINTS = 3000
#: Partners of each sampled centre above :data:`VARIOGRAM_POINTS` points: the point nearest to
#: the centre moved by a random lag, so the pairs at short lags do not thin out as the scene
#: grows (docs/benchmarks.md, "The correlated height's samples and batches").
VARIOGRAM_PARTNERS = 16
#: Centres of the screen's variogram sample above :data:`VARIOGRAM_POINTS` points, each with
#: its own partners at log-spaced random lags (the rows read stay at VARIOGRAM_POINTS).
SCREEN_CENTRES = 200
#: Distance bins of that variogram, out to this many atmosphere correlation lengths.
VARIOGRAM_REACH = 3.0
#: Correlation models of the screen, ``exp(-(d / range)^shape)``: exponential (shape 1),
#: Gaussian (shape 2) and stable (shape fitted in :data:`STABLE_SHAPES`); the one of least AIC
#: on the residual phases' binned semivariance is used.
SCREEN_MODELS = {"exponential": 1.0, "gaussian": 2.0, "stable": None}
#: Bounds of the stable model's shape: 2 is the smoothest valid one.
STABLE_SHAPES = (0.3, 2.0)
#: Least scale of the signal's variance fitted to the heights' semivariance against the
#: screen's (:func:`fit_height_covariance`).
SIGNAL_SCALE_MIN = 1.0
#: Significance level of the extra (spatially correlated) term of the height covariance: kept
#: only where its F test against a constant remainder passes at this level.
EXTRA_TERM_ALPHA = 0.01
_BINS = 20
#: Targets per cell of the moving-neighbourhood kriging (one factorisation per cell).
TARGETS_PER_CELL = 32
#: Points per block of the per-point passes (leak gains, the moved phase): bounds their
#: (points, epochs) float64 temporaries whatever the number of points.
BLOCK = 65536
#: Elements of the batched ``(targets, k, k)`` kriging systems solved at once (memory bound): a
#: batch's largest temporaries, its ``(cells, k, k)`` float64 covariances and their factors, stay
#: below half the allocator's :data:`~depsi.stm.runtime.MMAP_THRESHOLD`, so the batches reuse the
#: same heap pages instead of being faulted in anew (docs/benchmarks.md, "The correlated height's
#: samples and batches").
_BATCH_ELEMENTS = MMAP_THRESHOLD // 16
#: Kriging batches submitted at once per worker thread of a cluster (the rest wait in the
#: driver as start indices).
_IN_FLIGHT_PER_THREAD = 3


def height_leak_gain(h2ph: np.ndarray, years: np.ndarray, m2ph: float) -> np.ndarray:
    """``s = g . g`` per point: the variance (m^2) that a unit-variance phase, white in time,
    leaks into a height error fitted with ``[m2ph t, m2ph h2ph_t, 1]``.

    Examples
    --------
    >>> years = np.linspace(-1, 1, 5)
    >>> h2ph = np.array([[1e-4, -2e-4, 0.0, 2e-4, -1e-4]])
    >>> float(height_leak_gain(h2ph, years, -226.0)[0]) > 0
    True
    """
    # the (height, height) element of the inverse normal matrix is one over the part of
    # m2ph h2ph that the other two columns (m2ph t, 1) leave unexplained (Schur complement):
    # one pass over the baselines, no (points, epochs, 3) design
    h2ph = np.asarray(h2ph, dtype=np.float64)
    t = np.asarray(years, dtype=np.float64) - np.mean(years)
    h = h2ph - h2ph.mean(axis=-1, keepdims=True)
    tt = float(t @ t)
    unexplained = np.einsum("nt,nt->n", h, h)
    if tt > 0:
        unexplained -= (h @ t) ** 2 / tt
    scale = np.einsum("nt,nt->n", h2ph, h2ph)
    with np.errstate(divide="ignore", invalid="ignore"):
        # baselines constant or proportional to time (to round-off): the height error is not
        # identified, and no finite gain describes its leak
        return np.where(unexplained > 1e-12 * scale, 1.0 / (m2ph ** 2 * unexplained), np.nan)


def _partners(tree: cKDTree, positions: np.ndarray, centres: np.ndarray, lags: np.ndarray,
              rng: np.random.Generator) -> np.ndarray:
    """``(C, P)`` indices of the points nearest to each of ``centres`` moved by ``lags``
    ``(C, P)`` (m) in random directions: pairs at chosen lags, whatever the scene's extent."""
    angle = rng.uniform(0.0, 2.0 * np.pi, lags.shape)
    moved = positions[centres][:, None, :] + lags[..., None] * np.stack(
        [np.cos(angle), np.sin(angle)], axis=-1)
    _, nearest = tree.query(moved.reshape(-1, 2))
    return nearest.reshape(lags.shape)


def _pairs_within(positions, max_distance, rng, tree: cKDTree | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Point pairs closer than ``max_distance``: every one up to :data:`VARIOGRAM_POINTS`
    points, else :data:`VARIOGRAM_POINTS` random centres each with
    :data:`VARIOGRAM_PARTNERS` partners at lags uniform over the disc of ``max_distance``
    (the lags' distribution of all pairs in a dense sample). ``tree``: one already built on
    ``positions``."""
    n = len(positions)
    tree = cKDTree(positions) if tree is None else tree
    if n <= VARIOGRAM_POINTS:
        pairs = tree.query_pairs(max_distance, output_type="ndarray")
        return pairs[:, 0], pairs[:, 1]
    centres = rng.choice(n, VARIOGRAM_POINTS, replace=False)
    lags = max_distance * np.sqrt(rng.uniform(size=(VARIOGRAM_POINTS, VARIOGRAM_PARTNERS)))
    j = _partners(tree, positions, centres, lags, rng).ravel()
    i = np.repeat(centres, VARIOGRAM_PARTNERS)
    keep = (i != j) & (np.hypot(*(positions[i] - positions[j]).T) < max_distance)
    return i[keep], j[keep]


def _semivariance(positions, values, max_distance, seed=0, tree=None):
    """Binned empirical semivariance of ``values`` over point pairs closer than
    ``max_distance`` (:func:`_pairs_within`)."""
    i, j = _pairs_within(positions, max_distance, np.random.default_rng(seed), tree)
    if len(i) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    dist = np.hypot(*(positions[i] - positions[j]).T)
    semi = 0.5 * (values[i] - values[j]) ** 2
    edges = np.linspace(0.0, max_distance, _BINS + 1)
    which = np.clip(np.digitize(dist, edges) - 1, 0, _BINS - 1)
    counts = np.bincount(which, minlength=_BINS)
    sums = np.bincount(which, semi, minlength=_BINS)
    used = counts > 0
    return 0.5 * (edges[:-1] + edges[1:])[used], sums[used] / counts[used], counts[used]


def correlation(distance, range_: float, shape: float = 1.0) -> np.ndarray:
    """The screen's correlation ``exp(-(distance / range_)^shape)`` (:data:`SCREEN_MODELS`).

    Examples
    --------
    >>> correlation(np.array([0.0, 400.0]), 400.0, 2.0).round(3).tolist()
    [1.0, 0.368]
    """
    return np.exp(-(np.asarray(distance, dtype=np.float64) / range_) ** shape)


def fit_screen_variogram(distance, semivariance, counts) -> dict:
    """``nugget + sill (1 - correlation(d, range, shape))`` fitted to a binned semivariance
    (weighted least squares, weights the pairs per bin), for each of :data:`SCREEN_MODELS`;
    the model of least AIC (``n log(WRSS / n) + 2 p``, ``n`` bins, ``p`` parameters) is
    returned as ``{"model", "nugget", "sill", "range", "shape"}``.

    Examples
    --------
    >>> d = np.linspace(50, 1500, 20)
    >>> fit = fit_screen_variogram(d, 0.1 + 1.0 - np.exp(-(d / 500) ** 2), np.full(20, 100))
    >>> fit["model"], round(fit["range"])
    ('gaussian', 500)
    """
    h = np.asarray(distance, dtype=np.float64)
    gamma = np.asarray(semivariance, dtype=np.float64)
    weights = np.asarray(counts, dtype=np.float64) / np.sum(counts)
    scale = max(float(gamma.max()), 1e-12)
    low, high = [0.0, 1e-12, 1e-3 * h.max() + 1e-9], [np.inf, np.inf, 10 * h.max() + 1]
    best, best_aic = None, np.inf
    for name, shape in SCREEN_MODELS.items():
        if shape is None:
            def free_shape(d, nugget, sill, range_, shape):
                return nugget + sill * (1.0 - correlation(d, range_, shape))
            model, start, bounds = free_shape, [0.1 * scale, 0.9 * scale, h.max() / 3, 1.0], (
                low + [STABLE_SHAPES[0]], high + [STABLE_SHAPES[1]])
        else:
            def fixed_shape(d, nugget, sill, range_, shape=shape):
                return nugget + sill * (1.0 - correlation(d, range_, shape))
            model, start, bounds = fixed_shape, [0.1 * scale, 0.9 * scale, h.max() / 3], (
                low, high)
        try:
            params, _ = curve_fit(model, h, gamma, p0=start, bounds=bounds,
                                  sigma=1.0 / np.sqrt(np.asarray(counts, np.float64)),
                                  maxfev=5000)
        except (RuntimeError, ValueError):
            continue
        misfit = max(float(np.sum(weights * (model(h, *params) - gamma) ** 2)), 1e-300)
        aic = len(h) * np.log(misfit / len(h)) + 2 * len(params)
        if aic < best_aic:
            best_aic = aic
            best = {"model": name, "nugget": float(params[0]), "sill": float(params[1]),
                    "range": float(params[2]),
                    "shape": float(params[3]) if shape is None else shape}
    if best is None:
        logger.warning("screen variogram fit failed; using a pure nugget over its variance")
        best = {"model": "exponential", "nugget": 0.5 * scale, "sill": 0.5 * scale,
                "range": float(h.max()) / 3, "shape": 1.0}
    return best


def fit_height_covariance(positions, normalised, signal: dict, *,
                          tree: cKDTree | None = None) -> dict:
    """Covariance of the normalised heights besides the atmosphere's projection.

    The empirical semivariance of ``normalised`` heights (``height / sqrt(s)``) is fitted with
    ``nugget + scale S(d)`` and with ``nugget + scale S(d) + extra_sill (1 - exp(-d /
    extra_range))``, ``S(d) = sill (1 - correlation(d, range, shape))`` the screen's
    semivariance (``signal``: ``sill``, ``range``, ``shape``, ``offset``): the nugget holds
    white DEM errors and noise, ``scale`` (at least :data:`SIGNAL_SCALE_MIN`) the leak of this
    scene's screens against the screen's fitted variance (the leak is one field, a weighted
    sum of the epochs' screens, whose variance over a scene of a few correlation lengths
    scatters by tens of percent), the exponential term spatially correlated DEM errors. The
    term is kept only when it fits significantly better than the signal and nugget alone (F
    test at :data:`EXTRA_TERM_ALPHA`), the signal's range free there to stretch up to
    :data:`VARIOGRAM_REACH` times the screen's: one scene's leak can reach further than the
    screen's ensemble range, and the bins' errors, correlated within one scene, make the test
    pass on that alone (a Gaussian 600 m screen's leak with structure at 1.1 km was kept as DEM
    errors, heights 1.48x the kriging floor). Otherwise the heights are taken as white besides
    the signal (``extra_sill`` 0), whose range the kriging keeps at the screen's. ``tree``:
    a k-d tree already built on ``positions``.
    """
    centred = normalised - normalised.mean()
    total = float(np.var(centred))
    reach = VARIOGRAM_REACH * signal["range"]
    white = {"nugget": max(total - (signal["sill"] - signal["offset"]), 1e-3 * total + 1e-12),
             "extra_sill": 0.0, "extra_range": signal["range"], "signal_scale": 1.0}
    h, gamma, counts = _semivariance(positions, centred, reach, tree=tree)
    if len(h) < 5:
        return white
    def stretched(d, nugget, scale, stretch):
        return nugget + scale * signal["sill"] * (
            1.0 - correlation(d, stretch * signal["range"], signal["shape"]))

    def reduced(d, nugget, scale):
        return stretched(d, nugget, scale, 1.0)

    def extra(d, extra_sill, extra_range):
        return extra_sill * (1.0 - np.exp(-d / extra_range))

    def full(d, nugget, scale, extra_sill, extra_range):
        return reduced(d, nugget, scale) + extra(d, extra_sill, extra_range)

    def tested(d, nugget, scale, stretch, extra_sill, extra_range):
        return stretched(d, nugget, scale, stretch) + extra(d, extra_sill, extra_range)

    sigma = 1.0 / np.sqrt(counts)
    try:
        simple, _ = curve_fit(reduced, h, gamma, p0=[max(gamma[0], 1e-6), 1.0],
                              bounds=([1e-9, SIGNAL_SCALE_MIN], [np.inf, np.inf]),
                              sigma=sigma, maxfev=5000)
        # the null of the extra term's test: the signal free to reach further than the
        # screen's range (up to the fitted lags), as one scene's leak can
        null, _ = curve_fit(stretched, h, gamma, p0=[*simple, 1.0],
                            bounds=([1e-9, SIGNAL_SCALE_MIN, 1.0],
                                    [np.inf, np.inf, VARIOGRAM_REACH]), sigma=sigma,
                            maxfev=5000)
        alternative, _ = curve_fit(
            tested, h, gamma, p0=[*null, 1e-6, signal["range"]],
            bounds=([1e-9, SIGNAL_SCALE_MIN, 1.0, 0.0, 0.05 * h[0] + 1e-9],
                    [np.inf, np.inf, VARIOGRAM_REACH, np.inf, h[-1]]), sigma=sigma,
            maxfev=5000)
        # the range is bounded by the largest lag fitted: beyond it only extra_sill /
        # extra_range is seen, and a free range flipped between no extra term and a spurious
        # one of several m^2 over tens of km on the same scene (a 0.6 m change of height RMSE)
        extended, _ = curve_fit(
            full, h, gamma, p0=[*simple, 1e-6, signal["range"]],
            bounds=([1e-9, SIGNAL_SCALE_MIN, 0.0, 0.05 * h[0] + 1e-9],
                    [np.inf, np.inf, np.inf, h[-1]]), sigma=sigma, maxfev=5000)
    except (RuntimeError, ValueError):
        logger.warning("height variogram fit failed; heights taken as spatially white")
        return white
    # the extra term is kept only where it fits the semivariances significantly better than
    # the signal and a nugget alone (F test of the two extra parameters, weights as in the
    # fit; the weights' scale cancels): on white heights the empirical semivariance's noise
    # otherwise buys a term whose range and sill jump between runs (nugget 1.45 + 0.20 over
    # 851 m, then 0.95 + 0.60 over 129 m, on the same 10^6 scene after a few dozen of 1.4 M
    # arcs changed; F = 0.13 there)
    weights = counts / counts.sum()
    misfit_null = np.sum(weights * (stretched(h, *null) - gamma) ** 2)
    misfit_alternative = np.sum(weights * (tested(h, *alternative) - gamma) ** 2)
    dof = len(h) - 5
    if misfit_alternative <= 0 or (misfit_null - misfit_alternative) / 2 / (
            misfit_alternative / dof) < f_distribution.isf(EXTRA_TERM_ALPHA, 2, dof):
        return {"nugget": float(simple[0]), "extra_sill": 0.0, "extra_range": signal["range"],
                "signal_scale": float(simple[1])}
    nugget, scale, extra_sill, extra_range = (float(x) for x in extended)
    return {"nugget": nugget, "extra_sill": extra_sill, "extra_range": extra_range,
            "signal_scale": scale}


def _distances(a: Any, b: Any) -> Any:
    """Distances between the points of ``a`` (B, m, 2) and ``b`` (B, n, 2): (B, m, n), on
    their device. Float32 NumPy arrays compiled where the kriging's kernels run
    (:func:`depsi.kernels.kriging_numba.distances`: the same to the bit, a tenth of the time of
    the broadcasts below, which stride over the coordinates and write three temporaries)."""
    xp = array_namespace(a, b)
    if xp is np and a.dtype == b.dtype == np.float32 and _compiled_kriging():
        from depsi.kernels import kriging_numba

        return kriging_numba.distances(a, b)
    dx = a[:, :, None, 0] - b[:, None, :, 0]
    dy = a[:, :, None, 1] - b[:, None, :, 1]
    dx *= dx
    dy *= dy
    dx += dy
    return xp.sqrt(dx, out=dx)


def _signal_covariance(distance: Any, signal: dict) -> Any:
    """``sill correlation(d) - offset`` in place on float32 ``distance``, as float64, on its
    device. On the host where the kriging's kernels run, the exponential in place and the
    float64 step in one compiled pass (:func:`depsi.kernels.kriging_numba.scaled_covariance`,
    the same to the bit)."""
    xp = array_namespace(distance)
    distance *= np.float32(1.0 / signal["range"])
    if signal["shape"] != 1.0:
        xp.power(distance, np.float32(signal["shape"]), out=distance)
    xp.negative(distance, out=distance)
    if xp is np and distance.dtype == np.float32 and _compiled_kriging():
        from depsi.kernels import kriging_numba

        return kriging_numba.scaled_covariance(np.exp(distance, out=distance),
                                               signal["sill"], signal["offset"])
    cov = xp.exp(distance).astype(np.float64)
    cov *= signal["sill"]
    cov -= signal["offset"]
    return cov


def _predict(src_pos, src_values, dst_pos, *, signal, noise, k, tree=None, placed=None):
    """Local simple kriging of the signal at ``dst_pos`` from its noisy samples: the
    prediction and its error variance (``C(0) - c^T K^-1 c``) at each target.

    ``signal``: the signal's covariance ``sill correlation(d, range, shape) - offset``.
    Targets are grouped in square cells of about :data:`TARGETS_PER_CELL` targets; the ``k``
    sources nearest each cell's centre form one kriging system, factorised once for all its
    targets (moving-neighbourhood kriging by cells), and the systems of many cells are solved
    in one batched call.

    ``placed`` (:func:`kriging_devices`): ``None``, the host's reference (the k-d tree's
    neighbours, :func:`_krige_batch` on this process's threads or a cluster's workers); else
    the devices the batches go to in turn (:func:`_krige_batch_on`), the cells' neighbours
    found by the grid search (:func:`~depsi.kernels.neighbours.nearest_neighbours`) on the
    first of them.
    """
    k = min(k, len(src_pos))
    tree = cKDTree(src_pos) if tree is None and placed is None else tree
    low = dst_pos.min(axis=0)
    extent = np.maximum(np.ptp(dst_pos, axis=0), 1.0)
    cell = np.sqrt(TARGETS_PER_CELL * extent[0] * extent[1] / max(len(dst_pos), 1))
    ij = np.floor((dst_pos - low) / cell).astype(np.int64)
    _, cell_of = np.unique(cell_keys(ij), return_inverse=True)
    order = np.argsort(cell_of, kind="stable")
    counts = np.bincount(cell_of)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    n_cells, width = len(counts), int(counts.max())
    # targets of each cell in a padded (cell, slot) table; -1 where a cell has fewer
    slot = np.arange(len(dst_pos)) - np.repeat(starts, counts)
    table = np.full((n_cells, width), -1, dtype=np.int64)
    table[cell_of[order], slot] = order
    centres = np.stack([np.bincount(cell_of, dst_pos[:, d]) / counts for d in (0, 1)], axis=1)
    # the cells by their number of targets, most first: a batch's systems are as wide as its
    # own fullest cell, not the scene's (1.8x the mean on a uniform scene, more on a city's)
    fullest = np.argsort(-counts, kind="stable")
    table, centres, counts = table[fullest], centres[fullest], counts[fullest]
    if placed is None:
        _, idx = tree.query(centres, k=k, workers=-1)  # the same neighbours on every core
    else:
        _, idx = nearest_neighbours(to_device(src_pos, placed[0]), to_device(centres, placed[0]),
                                    k)
        idx = to_host(idx)
    idx = idx.reshape(n_cells, k)
    out = np.empty(len(dst_pos))
    variance = np.empty(len(dst_pos))
    prior = signal["sill"] - signal["offset"]
    options = {"signal": signal, "noise": noise, "prior": prior}
    # batches of about _BATCH_ELEMENTS floats of systems each
    bounds = [0]
    while bounds[-1] < n_cells:
        size = _BATCH_ELEMENTS // (k * (k + 2 * int(counts[bounds[-1]])))
        bounds.append(min(bounds[-1] + max(1, size), n_cells))

    def inputs(batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One batch of cells' systems: positions relative to each cell's centre, in
        float32 (distances to 1e-3 m and covariances to 1e-7 relative, 4-6x faster than
        float64, whose exp has no SIMD loop), the sources' values, the targets."""
        start, stop = bounds[batch], bounds[batch + 1]
        centre = centres[start:stop, None, :]
        neighbours = idx[start:stop]
        targets = table[start:stop, :counts[start]]                      # (B, width)
        return ((src_pos[neighbours] - centre).astype(np.float32),      # (B, k, 2)
                src_values[neighbours],                                  # (B, k)
                (dst_pos[np.maximum(targets, 0)] - centre).astype(np.float32),  # (B, w, 2)
                targets)

    def write(targets: np.ndarray, predicted: tuple[np.ndarray, np.ndarray]) -> None:
        valid = targets >= 0  # batches write disjoint rows
        out[targets[valid]] = predicted[0][valid]
        variance[targets[valid]] = predicted[1][valid]

    batches = range(len(bounds) - 1)
    if placed is not None:
        def predict_on_device(batch: int) -> None:
            nb, values, tp, targets = inputs(batch)
            write(targets, _krige_batch_on(chunk_device(placed, batch), nb, values, tp,
                                           targets >= 0, **options))

        # each batch's systems formed and solved on its device; the threads overlap one
        # batch's transfers with another's work
        on_threads(predict_on_device, batches)
        return out, variance
    client = workers_client()
    if client is not None and len(batches) > 1:
        # on a cluster's workers, a task a batch (the driver cuts each batch's inputs, a few
        # MB, and writes the results; the arithmetic below, bit for bit where the workers take
        # the same path: small workers take SciPy's solves, within 1e-12 of the compiled ones)
        _predict_on_workers(client, batches, inputs, write, options)
        return out, variance

    def predict_cells(batch: int) -> None:
        nb, values, tp, targets = inputs(batch)
        write(targets, _krige_batch(nb, values, tp, targets >= 0, **options))

    # batches of cells (bounded memory) on this process's threads, BLAS at one thread each
    # (the chain's steps set it): NumPy releases the GIL in the solves and the large products
    on_threads(predict_cells, batches)
    return out, variance


def _gain_block(h2ph: np.ndarray, *, years: np.ndarray, m2ph: float) -> np.ndarray:
    """The square root of each point's height-leak gain (:func:`height_leak_gain`). Where
    Numba runs, :func:`depsi.kernels.gather_numba.leak_gain_sqrt` (one pass of float64 sums a
    point, no float64 ``(points, epochs)`` copies; within
    :func:`~depsi.kernels.gather_numba.leak_gain_error` of this)."""
    if _compiled_kernels("gather_numba"):
        from depsi.kernels import gather_numba

        return gather_numba.leak_gain_sqrt(h2ph, years, m2ph)
    h2ph = np.asarray(h2ph, dtype=np.float64)
    rows = np.broadcast_to(h2ph.reshape(h2ph.shape[0], -1), (h2ph.shape[0], years.size))
    return np.sqrt(np.maximum(height_leak_gain(rows, years, m2ph), 0.0))


def _moved_block(series: np.ndarray, h2ph: np.ndarray, field: np.ndarray, scale: float,
                 out: np.ndarray | None = None) -> np.ndarray:
    """A block of a series (float32) plus ``scale * h2ph * field``: the field's phase moved,
    into ``out`` (float32, the series' shape; it may be the series itself) when given.
    Where Numba runs, :func:`depsi.kernels.gather_numba.moved` (the same numbers to the bit,
    no float64 ``(points, epochs)`` temporaries, written straight into ``out``)."""
    if series.dtype == np.float32 and _compiled_kernels("gather_numba"):
        from depsi.kernels import gather_numba

        direct = out is not None and out.flags.c_contiguous
        result = gather_numba.moved(series, h2ph, field, scale, out if direct else None)
        if out is None or direct:
            return result
        out[...] = result
        return out
    h2ph = np.asarray(h2ph, dtype=np.float64)
    rows = np.broadcast_to(h2ph.reshape(h2ph.shape[0], -1), series.shape)
    result = (series + scale * rows * field[:, None]).astype(np.float32)
    if out is None:
        return result
    out[...] = result
    return out


def _moved_on_chunks(series: da.Array, h2ph: da.Array | np.ndarray, field: np.ndarray,
                     scale: float) -> da.Array:
    """:func:`_moved_block` of every space chunk of a Dask series."""
    rows = series.chunks[0]
    series = series.rechunk((rows, -1))
    h2ph = h2ph if isinstance(h2ph, da.Array) else da.from_array(np.asarray(h2ph))
    h2ph = h2ph.rechunk((rows,) + ((-1,) if h2ph.ndim == 2 else ()))
    return da.blockwise(_moved_block, "st", series, "st", h2ph, "st"[:h2ph.ndim],
                        da.from_array(field, chunks=(rows,)), "s", scale, None,
                        dtype=np.float32)


def _kriging_systems(nb, tp, *, signal, noise):
    """The kriging matrices ``K`` ``(B, k, k)`` (signal, extra term and nugget) and the
    sources' signal covariances with the targets ``c`` ``(B, k, width)`` of a batch of cells
    (:func:`_krige_batch`'s inputs), float64, on the inputs' device."""
    xp = array_namespace(nb, tp)
    k = nb.shape[1]
    nugget, extra_sill, extra_range = noise["nugget"], noise["extra_sill"], noise["extra_range"]
    d_nn = _distances(nb, nb)                                            # (B, k, k)
    if extra_sill > 0:
        cov = extra_sill * xp.exp(d_nn * np.float32(-1.0 / extra_range))
        cov += _signal_covariance(d_nn, signal)
    else:
        cov = _signal_covariance(d_nn, signal)
    del d_nn
    cov[:, xp.arange(k), xp.arange(k)] += nugget
    return cov, _signal_covariance(_distances(nb, tp), signal)          # (B, k, width)


def _krige_batch(nb, values, tp, valid, *, signal, noise, prior):
    """The kriging systems of a batch of ``B`` cells: ``nb`` ``(B, k, 2)`` float32 source
    positions and ``tp`` ``(B, width, 2)`` float32 target positions, each relative to its
    cell's centre, ``values`` ``(B, k)`` the sources' values, ``valid`` ``(B, width)`` the
    cells' filled target slots. Returns the predictions and their error variances
    ``(B, width)`` (unfilled slots: whatever the padding gave). The host's reference
    (:func:`_krige_batch_on` is the device's)."""
    cov, c_nt = _kriging_systems(nb, tp, signal=signal, noise=noise)
    # one factorisation per cell, K = L L^T, for the data and every target's covariances: the
    # prediction (L^-1 v) . (L^-1 c) and its error variance C(0) - |L^-1 c|^2, in float64 (a
    # Cholesky and one triangular solve cost what an LU solve for the data alone did)
    solved = _factored_sums(cov, values, c_nt)
    if solved is None:  # not positive definite to round-off: LU
        solved = _lu_solved(cov, c_nt, np.concatenate([values[..., None], c_nt], axis=2))
    predicted, explained = solved
    return predicted, np.where(valid, np.maximum(prior - explained, 0.0), 0.0)


def _factored_sums(cov, values, c_nt):
    """``(L^-1 v) . (L^-1 c)`` and ``|L^-1 c|^2`` ``(B, width)`` of a batch's systems
    (:func:`_krige_batch`), ``K = L L^T``; None where a cell's ``K`` is not positive definite
    to round-off. Compiled where it runs (:func:`_compiled_kriging`): each cell factorised by
    LAPACK and its substitution and sums in one pass, without the whitened array
    (:func:`depsi.kernels.kriging_numba.factored_sums`, 1.6x faster); else NumPy's batched
    Cholesky and SciPy's triangular solve a cell, the reference, which it agrees with to
    round-off. A float32 ``K`` (the extra term's, :func:`_kriging_systems`) keeps NumPy's
    float32 factor, the reference's, its substitution compiled."""
    compiled = _compiled_kriging()
    if compiled and cov.dtype == np.float64:
        from depsi.kernels import kriging_numba

        return kriging_numba.factored_sums(cov, values, c_nt)
    try:
        lower = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        return None
    if compiled:
        from depsi.kernels import kriging_numba

        return kriging_numba.whitened_sums(lower, values, c_nt)
    rhs = np.concatenate([values[..., None], c_nt], axis=2)
    whitened = np.stack([solve_triangular(lower[b], rhs[b], lower=True, check_finite=False)
                         for b in range(len(lower))])                  # (B, k, 1 + width)
    return (np.einsum("bk,bkw->bw", whitened[..., 0], whitened[..., 1:]),
            np.einsum("bkw,bkw->bw", whitened[..., 1:], whitened[..., 1:]))


def _compiled_kriging() -> bool:
    """Whether :mod:`depsi.kernels.kriging_numba` runs here (the network solver's rule for
    every compiled kernel: :func:`~depsi.processing.network_solver._compiled_kernels`)."""
    return _compiled_kernels("kriging_numba")


def _lu_solved(cov, c_nt, rhs):
    """Predictions ``c^T K^-1 v`` and explained variances ``c^T K^-1 c`` by one batched LU
    solve (``rhs``: ``v`` then ``c``), on the arrays' device."""
    xp = array_namespace(cov, c_nt, rhs)
    solved = xp.linalg.solve(cov, rhs)
    return (xp.einsum("bk,bkw->bw", solved[..., 0], c_nt),
            xp.einsum("bkw,bkw->bw", solved[..., 1:], c_nt))


def _solved_systems(cov, c_nt, values, valid, prior):
    """:func:`_krige_batch`'s predictions and error variances from its systems, on the arrays'
    device (NumPy or CuPy): the same Cholesky factor and whitening, the factor's systems solved
    in one batched call (no batched triangular solve is common to both); LU where the factor
    fails (NumPy raises, CuPy gives NaN)."""
    xp = array_namespace(cov, c_nt, values)
    rhs = xp.concatenate([values[..., None], c_nt], axis=2)
    try:
        lower = xp.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        lower = None
    if lower is not None and bool(xp.isfinite(lower).all()):
        whitened = xp.linalg.solve(lower, rhs)                          # (B, k, 1 + width)
        predicted = xp.einsum("bk,bkw->bw", whitened[..., 0], whitened[..., 1:])
        explained = xp.einsum("bkw,bkw->bw", whitened[..., 1:], whitened[..., 1:])
    else:
        predicted, explained = _lu_solved(cov, c_nt, rhs)
    return predicted, xp.where(valid, xp.maximum(prior - explained, 0.0), 0.0)


def _krige_batch_on(device: Device, nb, values, tp, valid, *, signal, noise, prior):
    """:func:`_krige_batch` on ``device``: the batch's inputs moved there once, the systems
    formed and solved there (:func:`_solved_systems`), the predictions and variances moved
    back. With a CPU device the same code runs on NumPy (within 1e-10 of the host's
    triangular solves)."""
    with use_device(device):
        nb, values, tp, valid = (to_device(a, device) for a in (nb, values, tp, valid))
        cov, c_nt = _kriging_systems(nb, tp, signal=signal, noise=noise)
        predicted, variance = _solved_systems(cov, c_nt, values, valid, prior)
        return to_host(predicted), to_host(variance)


def kriging_devices(devices: Any = None) -> list[Device] | None:
    """The devices the kriging's batches go to in turn: every device of ``devices``
    (:func:`~depsi.kernels.backend.resolve_devices`) where one is a CUDA device, so that a
    batch's result does not depend on where it lands; ``None`` where none is, for the host's
    reference path (:func:`_krige_batch`).

    Examples
    --------
    >>> kriging_devices(["cpu:0", "cpu:1"]) is None
    True
    """
    chosen = resolve_devices(devices)
    return chosen if cuda_devices(chosen) else None


def _krige_batch_task(nb, values, tp, valid, options):
    """:func:`_krige_batch` as a worker's task (one BLAS thread, as the driver's threads)."""
    with single_threaded_blas():
        return _krige_batch(nb, values, tp, valid, **options)


def _predict_on_workers(client, batches, inputs, write, options) -> None:
    """The kriging's batches of cells as tasks of ``client``'s workers: at most
    :data:`_IN_FLIGHT_PER_THREAD` batches a worker thread submitted at once (the driver holds
    their inputs, a few MB each, never the whole scene's systems); each result written as it
    comes back."""
    from distributed import as_completed

    threads = max(1, sum(client.nthreads().values()))
    pending = iter(batches)
    running = as_completed()
    targets_of = {}
    call = uuid.uuid4().hex

    def submit(start: int) -> None:
        *arrays, targets = inputs(start)
        future = client.submit(_krige_batch_task, *arrays, targets >= 0, options, pure=False,
                               key=f"depsi-kriging-{call}-{start}")
        targets_of[future.key] = targets
        running.add(future)

    for start in pending:
        submit(start)
        if running.count() >= _IN_FLIGHT_PER_THREAD * threads:
            break
    for future in running:
        write(targets_of.pop(future.key), future.result())
        future.release()
        start = next(pending, None)
        if start is not None:
            submit(start)


def _blocks(n: int) -> list[slice]:
    """Row blocks of :data:`BLOCK` points."""
    return [slice(start, min(start + BLOCK, n)) for start in range(0, n, BLOCK)]


def _screen_sample(positions: np.ndarray, used: np.ndarray, rng: np.random.Generator,
                   tree: cKDTree | None = None) -> np.ndarray:
    """The rows of ``used`` whose residual phases give the screen's variogram: all of them up
    to :data:`VARIOGRAM_POINTS`, else :data:`SCREEN_CENTRES` random ones, each with partners
    at lags log-uniform from the points' spacing to half the scene's extent (a uniform sample
    of a large scene holds no pairs at the screen's range)."""
    if used.size <= VARIOGRAM_POINTS:
        return used
    own = positions[used]
    extent = np.ptp(own, axis=0)
    spacing = np.sqrt(max(float(extent[0] * extent[1]), 1.0) / used.size)
    half = max(0.5 * float(np.hypot(*extent)), 2.0 * spacing)
    partners = VARIOGRAM_POINTS // SCREEN_CENTRES - 1
    centres = rng.choice(used.size, SCREEN_CENTRES, replace=False)
    lags = np.exp(rng.uniform(np.log(spacing), np.log(half), (SCREEN_CENTRES, partners)))
    found = _partners(cKDTree(own) if tree is None else tree, own, centres, lags, rng)
    return used[np.unique(np.concatenate([centres, found.ravel()]))]


def _screen_variogram(result, use, positions, years, m2ph, h2ph, tree=None) -> dict:
    """Variogram (:func:`fit_screen_variogram`) of the residual phases (atmosphere included)
    of the used points, each point's temporal mean removed and the slow part (unmodelled
    deformation) low-passed out, on at most :data:`VARIOGRAM_POINTS` points
    (:func:`_screen_sample`)."""
    from depsi.processing.atmosphere import (
        DEFAULT_TEMPORAL_WINDOW,
        empirical_variogram,
        lowpass,
    )

    chosen = _screen_sample(positions, np.flatnonzero(use), np.random.default_rng(1), tree)
    sample = result.isel(space=chosen)  # the sampled rows only, never every point's series
    full = sample["unwrapped_phase"].transpose("space", "time").values.astype(np.float64)
    if "aps" in result:
        full = full + sample["aps"].transpose("space", "time").values.astype(np.float64)
    velocity = result["velocity"].values.astype(np.float64)[chosen]
    height = result["height_error"].values.astype(np.float64)[chosen]
    residual = full - m2ph * (velocity[:, None] * years
                              + h2ph_rows(h2ph, chosen, years.size) * height[:, None])
    residual -= residual.mean(axis=1, keepdims=True)
    residual -= lowpass(residual, years, DEFAULT_TEMPORAL_WINDOW)
    fitted = fit_screen_variogram(*empirical_variogram(positions[chosen], residual))
    # the fit and the low-pass took their share of a screen white in time out of these
    # residuals (about 10 % at 60 epochs): the screen's own variance is larger by that share
    baselines = h2ph_rows(h2ph, chosen, years.size).mean(axis=0)
    design = np.column_stack([years, baselines, np.ones_like(years)])
    kept = (np.eye(years.size) - design @ np.linalg.pinv(design)) @ (
        np.eye(years.size) - lowpass(np.eye(years.size), years, DEFAULT_TEMPORAL_WINDOW))
    fitted["sill"] /= max(float(np.sum(kept ** 2)) / years.size, 0.1)
    return fitted


@single_threaded_blas()
def estimate_correlated_height(
    result: xr.Dataset,
    *,
    screen_variance: float | None = None,
    screen_range: float | None = None,
    k: int | None = None,
    overwrite: bool = False,
    devices: Sequence[Device | str | int] | None = None,
) -> xr.Dataset:
    """Move the atmosphere's projection on the baselines from the height errors to the screen.

    Parameters
    ----------
    result
        Point results: ``height_error`` (m), ``velocity`` (m/yr), ``h2ph``, ``time``,
        positions, ``wavelength``; ``unwrapped_phase`` and ``aps`` (rad) are updated when
        present. Points with a NaN height error are neither used nor changed.
    screen_variance, screen_range
        Variance (rad^2) and range (m) of the covariance ``variance correlation(d, range,
        shape)`` of the part of the screen that changes from epoch to epoch (what leaks into
        heights); given both, the model is exponential (shape 1). Default: fitted to the
        points' residual phases (``unwrapped_phase + aps`` less the fitted model, each
        point's temporal mean removed, which takes out the mother epoch's screen common to
        every interferogram), the correlation model chosen by AIC among
        :data:`SCREEN_MODELS` (:func:`fit_screen_variogram`). The signal's covariance is that
        of the screen about the scene's mean, ``variance (correlation(d) - mean
        correlation)`` with the mean over the scene's point pairs: a range longer than the
        scene is not identified by the fit, the variogram within the scene is.
    k
        Nearest points used for each prediction; default as many as the points' density puts
        within ``screen_range`` of a point, bounded by :data:`NEIGHBOURS`.
    overwrite
        Update ``unwrapped_phase`` and ``aps`` in their own arrays (in memory, float32,
        ``(space, time)``), so ``result`` changes too, instead of into new ones: for a caller
        that owns ``result`` (the chain's model step), it saves one copy of both series
        (0.5 GB at 10^6 points and 60 epochs). Other variables are never written in place.
    devices
        Where the kriging's batches of systems are formed and solved (e.g. ``["cuda:0"]``;
        default those of :func:`~depsi.kernels.backend.configure_devices`). With a CUDA device
        among them every batch runs the device formulation (:func:`kriging_devices`: the
        Cholesky factors' systems solved in one batched call, neighbours by the grid
        search), the batches in turn over the devices; with CPU devices only, the host's reference
        (a triangular solve a cell, compiled where Numba runs, and the k-d tree's neighbours).
        The two agree to round-off (1e-10 relative).

    Returns
    -------
    xarray.Dataset
        ``result`` with ``height_error`` less the predicted field, ``height_error_correlated``
        (m, the field moved; relative to its mean over ``in_reference_area`` when present),
        ``height_error_correlated_std`` (m, the kriging error's standard deviation at each
        point: the leak left in its height; 0 where nothing moved),
        ``aps`` plus and ``unwrapped_phase`` minus ``m2ph * h2ph * field``; displacement,
        ambiguities and temporal coherence are unchanged by construction. Attrs record the
        fitted screen model and height covariance (``correlated_height_*``).

    Examples
    --------
    >>> from depsi.processing.correlated_height import estimate_correlated_height
    >>> rng = np.random.default_rng(0)
    >>> n, T = 400, 20
    >>> ds = xr.Dataset(
    ...     {"height_error": ("space", rng.normal(0, 5, n)),
    ...      "h2ph": (("space", "time"), np.tile(rng.normal(0, 2e-4, T), (n, 1)))},
    ...     coords={"x": ("space", rng.uniform(0, 3000, n)),
    ...             "y": ("space", rng.uniform(0, 3000, n)),
    ...             "time": np.datetime64("2021-01-01") + 12 * np.arange(T).astype(
    ...                 "timedelta64[D]")},
    ...     attrs={"wavelength": 0.0555})
    >>> out = estimate_correlated_height(ds, screen_variance=1.0, screen_range=500.0)
    >>> bool(out.height_error_correlated.std() < 0.5 * ds.height_error.std())
    True
    """
    for name, value in (("screen_variance", screen_variance), ("screen_range", screen_range)):
        if value is not None and not (np.isfinite(value) and value > 0):
            raise ValueError(f"{name}: expected a positive finite number or None, found {value}")
    n = result.sizes["space"]
    height = result["height_error"].values.astype(np.float64)
    use = np.isfinite(height)
    if use.sum() < 10:
        logger.warning("correlated height: only %d points with a height error, left in place",
                       use.sum())
        return result
    years = years_since_mother(result)
    m2ph = phase_per_metre(float(result.attrs["wavelength"]))
    h2ph = result["h2ph"].transpose("space", ...)
    if isinstance(h2ph.data, da.Array):  # on the workers, chunk by chunk
        gain = da.blockwise(_gain_block, "s", h2ph.data, "st"[:h2ph.ndim], years=years,
                            m2ph=m2ph, dtype=np.float64, concatenate=True).compute()
    else:
        gain = np.empty(n)

        def gain_rows(rows: slice) -> None:
            gain[rows] = _gain_block(h2ph.data[rows], years=years, m2ph=m2ph)

        on_threads(gain_rows, _blocks(n))
    use &= np.isfinite(gain) & (gain > 0)
    positions = point_positions(result)
    # one k-d tree of the used points for the variograms' samples and the kriging's neighbours
    # (building one takes seconds at 10^7 points)
    tree = cKDTree(positions[use])
    # the screen's variance about the scene's mean: a range beyond the scene leaves sill and
    # range unidentified (only their ratio is seen), and the datum removes the scene's mean
    screen: dict[str, Any] = {"model": "exponential", "shape": 1.0}
    if screen_variance is None or screen_range is None:
        if "unwrapped_phase" not in result or "velocity" not in result:
            raise ValueError("result: expected 'unwrapped_phase' and 'velocity' to fit the "
                             "screen's variogram, or screen_variance and screen_range given; "
                             f"found {sorted(map(str, result.data_vars))}")
        screen = _screen_variogram(result, use, positions, years, m2ph, h2ph, tree)
    screen["sill"] = float(screen["sill"] if screen_variance is None else screen_variance)
    screen["range"] = float(screen["range"] if screen_range is None else screen_range)
    # the screen about the scene's mean (the datum removes the mean): its covariance less the
    # mean covariance over the scene's point pairs
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, n, (2, 20000))
    scene_distance = np.hypot(*(positions[pairs[0]] - positions[pairs[1]]).T)
    offset = screen["sill"] * float(np.mean(correlation(scene_distance, screen["range"],
                                                        screen["shape"])))
    signal = {"sill": screen["sill"], "range": screen["range"], "shape": screen["shape"],
              "offset": offset}
    normalised = height[use] / gain[use]
    mean = normalised.mean()
    noise = fit_height_covariance(positions[use], normalised, signal, tree=tree)
    signal["sill"] *= noise["signal_scale"]
    signal["offset"] *= noise["signal_scale"]
    signal_sill = signal["sill"] - signal["offset"]
    if k is None:
        extent = np.ptp(positions[use], axis=0)
        density = use.sum() / max(float(extent[0] * extent[1]), 1.0)
        k = int(np.clip(density * np.pi * screen["range"] ** 2, *NEIGHBOURS))
    predicted, variance = _predict(positions[use], normalised - mean, positions, tree=tree,
                                   signal=signal, noise=noise, k=k,
                                   placed=kriging_devices(devices))
    field = np.where(np.isfinite(gain), predicted * gain, 0.0)
    left = np.where(use, np.sqrt(variance) * gain, 0.0)
    if "in_reference_area" in result and result["in_reference_area"].values[use].any():
        area = result["in_reference_area"].values.astype(bool) & use
        field -= field[area].mean()
    else:
        field -= field[use].mean()
    field = np.where(use, field, 0.0)
    out = result.assign(
        height_error=("space", (height - field).astype(result["height_error"].dtype)),
        height_error_correlated=("space", field.astype(np.float32)),
        height_error_correlated_std=("space", left.astype(np.float32)))
    # the field's phase m2ph h2ph field moves from the unwrapped phase to the screen, block by
    # block into new float32 arrays: no (points, epochs) float64 temporary
    for name, sign in (("aps", 1.0), ("unwrapped_phase", -1.0)):
        if name not in result:
            continue
        series = result[name].transpose("space", "time")
        if isinstance(series.data, da.Array):  # a task per chunk, on the workers
            out[name] = (series.dims, _moved_on_chunks(series.data, h2ph.data, field,
                                                       sign * m2ph))
            continue
        own = series.data if overwrite else None  # the array itself when in memory
        moved = (own if isinstance(own, np.ndarray) and own.dtype == np.float32
                 and own.flags.writeable and series.dims == result[name].dims
                 else np.empty(series.shape, np.float32))

        def move(rows: slice, series=series, moved=moved, sign=sign) -> None:
            # each block read before it is written, in place or not; blocks are disjoint
            _moved_block(series.isel(space=rows).values, h2ph.data[rows], field[rows],
                         sign * m2ph, out=moved[rows])

        on_threads(move, _blocks(n))
        out[name] = (series.dims, moved)
    out.attrs.update({"correlated_height_nugget": noise["nugget"],
                      "correlated_height_signal_scale": noise["signal_scale"],
                      "correlated_height_extra_sill": noise["extra_sill"],
                      "correlated_height_extra_range": noise["extra_range"],
                      "correlated_height_screen_model": screen["model"],
                      "correlated_height_screen_variance": screen["sill"],
                      "correlated_height_screen_range": screen["range"],
                      "correlated_height_screen_shape": screen["shape"],
                      "correlated_height_signal_sill": signal_sill})
    logger.info("correlated height: %d points, field %.2f m RMS moved into the screen "
                "(%s screen, %.3g rad^2 over %.0f m, shape %.2f; height covariance besides "
                "the atmosphere: nugget %.3g, correlated %.3g over %.0f m)",
                use.sum(), np.sqrt(np.mean(field[use] ** 2)), screen["model"], screen["sill"],
                screen["range"], screen["shape"], noise["nugget"], noise["extra_sill"],
                noise["extra_range"])
    return out
