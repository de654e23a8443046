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

- the *signal* covariance derived from the atmosphere's fitted variogram (not fitted to the
  heights, so true heights are not mistaken for it), and
- the *observation* covariance fitted to the heights themselves: the signal, plus a nugget
  (white DEM errors and noise), plus an exponential term for DEM errors that are spatially
  correlated (blocks of buildings on one wrong DEM post).

When the heights are white, the prediction removes most of the leak; when DEM errors are
themselves correlated, the fitted extra term makes the prediction shrink towards zero instead
of moving real DEM errors into the screen.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xarray as xr
from scipy.optimize import curve_fit
from scipy.spatial import cKDTree
from scipy.stats import f as f_distribution

from depsi.conventions import phase_per_metre
from depsi.kernels.backend import single_threaded_blas
from depsi.processing.network import cell_keys, point_positions, worker_threads
from depsi.stm.schema import h2ph_rows, years_since_mother

logger = logging.getLogger(__name__)

#: Nearest points whose height errors predict the correlated part at each point: enough to
#: cover a disc of the atmosphere's correlation length, within these bounds.
NEIGHBOURS = (48, 192)
#: Points sampled for the empirical variogram of the height errors.
VARIOGRAM_POINTS = 3000
#: Distance bins of that variogram, out to this many atmosphere correlation lengths.
VARIOGRAM_REACH = 3.0
#: Significance level of the extra (spatially correlated) term of the height covariance: kept
#: only where its F test against a constant remainder passes at this level.
EXTRA_TERM_ALPHA = 0.01
_BINS = 20
#: Targets per cell of the moving-neighbourhood kriging (one factorisation per cell).
TARGETS_PER_CELL = 32
#: Points per block of the per-point passes (leak gains, the moved phase): bounds their
#: (points, epochs) float64 temporaries whatever the number of points.
BLOCK = 65536
#: Elements of the batched ``(targets, k, k)`` kriging systems solved at once (memory bound).
_BATCH_ELEMENTS = 4_000_000


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


def _semivariance(positions, values, max_distance, seed=0):
    """Binned empirical semivariance of ``values`` over point pairs closer than
    ``max_distance`` (a sample of at most :data:`VARIOGRAM_POINTS` points)."""
    rng = np.random.default_rng(seed)
    n = len(positions)
    sample = np.sort(rng.choice(n, min(n, VARIOGRAM_POINTS), replace=False))
    pos, val = positions[sample], values[sample]
    pairs = cKDTree(pos).query_pairs(max_distance, output_type="ndarray")
    if len(pairs) == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    dist = np.hypot(*(pos[pairs[:, 0]] - pos[pairs[:, 1]]).T)
    semi = 0.5 * (val[pairs[:, 0]] - val[pairs[:, 1]]) ** 2
    edges = np.linspace(0.0, max_distance, _BINS + 1)
    which = np.clip(np.digitize(dist, edges) - 1, 0, _BINS - 1)
    counts = np.bincount(which, minlength=_BINS)
    sums = np.bincount(which, semi, minlength=_BINS)
    used = counts > 0
    return 0.5 * (edges[:-1] + edges[1:])[used], sums[used] / counts[used], counts[used]


def fit_height_covariance(positions, normalised, signal_sill, signal_range) -> dict:
    """Covariance of the normalised heights besides the atmosphere's projection.

    The empirical semivariance of ``normalised`` heights (``height / sqrt(s)``) minus the
    signal's ``signal_sill (1 - exp(-d / signal_range))`` is fitted with
    ``nugget + extra_sill (1 - exp(-d / extra_range))``: the nugget holds white DEM errors and
    noise, the exponential term spatially correlated DEM errors. The term is kept only when it
    fits significantly better than a constant (F test at :data:`EXTRA_TERM_ALPHA`); otherwise
    the heights are taken as white besides the signal (``extra_sill`` 0).
    """
    centred = normalised - normalised.mean()
    total = float(np.var(centred))
    h, gamma, counts = _semivariance(positions, centred, VARIOGRAM_REACH * signal_range)
    white = {"nugget": max(total - signal_sill, 1e-3 * total + 1e-12), "extra_sill": 0.0,
             "extra_range": signal_range}
    if len(h) < 4:
        return white
    remainder = gamma - signal_sill * (1.0 - np.exp(-h / signal_range))

    def model(d, nugget, extra_sill, extra_range):
        return nugget + extra_sill * (1.0 - np.exp(-d / extra_range))

    try:
        # the range is bounded by the largest lag fitted: beyond it only extra_sill /
        # extra_range is seen, and a free range flipped between no extra term and a spurious
        # one of several m^2 over tens of km on the same scene (a 0.6 m change of height RMSE)
        (nugget, extra_sill, extra_range), _ = curve_fit(
            model, h, remainder, p0=[max(remainder[0], 1e-6), 1e-6, signal_range],
            bounds=([1e-9, 0.0, 0.05 * h[0] + 1e-9], [np.inf, np.inf, h[-1]]),
            sigma=1.0 / np.sqrt(counts), maxfev=5000)
    except (RuntimeError, ValueError):
        logger.warning("height variogram fit failed; heights taken as spatially white")
        return white
    # the extra term is kept only where it fits the semivariances significantly better than a
    # constant (F test of the two extra parameters, weights as in the fit; the weights' scale
    # cancels): on white heights the empirical semivariance's noise otherwise buys a term whose
    # range and sill jump between runs (nugget 1.45 + 0.20 over 851 m, then 0.95 + 0.60 over
    # 129 m, on the same 10^6 scene after a few dozen of 1.4 M arcs changed; F = 0.13 there)
    weights = counts / counts.sum()
    constant = np.sum(weights * remainder)
    flat = np.sum(weights * (remainder - constant) ** 2)
    fitted = np.sum(weights * (model(h, nugget, extra_sill, extra_range) - remainder) ** 2)
    dof = len(h) - 3
    if fitted <= 0 or (flat - fitted) / 2 / (fitted / dof) < f_distribution.isf(
            EXTRA_TERM_ALPHA, 2, dof):
        return white
    return {"nugget": float(nugget), "extra_sill": float(extra_sill),
            "extra_range": float(extra_range)}


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distances between the points of ``a`` (B, m, 2) and ``b`` (B, n, 2): (B, m, n)."""
    dx = a[:, :, None, 0] - b[:, None, :, 0]
    dy = a[:, :, None, 1] - b[:, None, :, 1]
    dx *= dx
    dy *= dy
    dx += dy
    return np.sqrt(dx, out=dx)


def _predict(src_pos, src_values, dst_pos, *, signal_sill, signal_range, noise, k):
    """Local simple kriging of the signal at ``dst_pos`` from its noisy samples.

    Targets are grouped in square cells of about :data:`TARGETS_PER_CELL` targets; the ``k``
    sources nearest each cell's centre form one kriging system, factorised once for all its
    targets (moving-neighbourhood kriging by cells), and the systems of many cells are solved
    in one batched call.
    """
    k = min(k, len(src_pos))
    tree = cKDTree(src_pos)
    nugget, extra_sill, extra_range = noise["nugget"], noise["extra_sill"], noise["extra_range"]
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
    _, idx = tree.query(centres, k=k)
    idx = idx.reshape(n_cells, k)
    out = np.empty(len(dst_pos))
    batch = max(1, _BATCH_ELEMENTS // (k * (k + width)))

    def predict_cells(start: int) -> None:  # one batch of cells; batches write disjoint rows
        stop = min(start + batch, n_cells)
        # positions relative to each cell's centre, in float32: distances to 1e-3 m and
        # covariances to 1e-7 relative, 4-6x faster than float64 (whose exp has no SIMD loop)
        centre = centres[start:stop, None, :]
        nb = (src_pos[idx[start:stop]] - centre).astype(np.float32)    # (B, k, 2)
        d_nn = _distances(nb, nb)                                        # (B, k, k)
        d_nn *= np.float32(-1.0 / signal_range)
        cov = np.exp(d_nn).astype(np.float64)
        cov *= signal_sill
        if extra_sill > 0:
            d_nn *= np.float32(signal_range / extra_range)
            cov += extra_sill * np.exp(d_nn)
        del d_nn
        cov[:, np.arange(k), np.arange(k)] += nugget
        targets = table[start:stop]                                      # (B, width)
        tp = (dst_pos[np.maximum(targets, 0)] - centre).astype(np.float32)  # (B, width, 2)
        # dual kriging: v^T C^-1 c_t = (C^-1 v)^T c_t, one right-hand side per cell instead of
        # one per target (C is symmetric); the solve in float64
        dual = np.linalg.solve(cov, src_values[idx[start:stop], None])[..., 0]  # (B, k)
        d_nt = _distances(nb, tp)
        d_nt *= np.float32(-1.0 / signal_range)
        values = signal_sill * np.einsum("bk,bkw->bw", dual.astype(np.float32), np.exp(d_nt),
                                         dtype=np.float64)
        valid = targets >= 0
        out[targets[valid]] = values[valid]

    # batches of cells (bounded memory) on this process's threads, BLAS at one thread each
    # (the chain's steps set it): NumPy releases the GIL in the solves and the large products
    with ThreadPoolExecutor(max_workers=worker_threads()) as pool:
        list(pool.map(predict_cells, range(0, n_cells, batch)))
    return out


def _blocks(n: int) -> list[slice]:
    """Row blocks of :data:`BLOCK` points."""
    return [slice(start, min(start + BLOCK, n)) for start in range(0, n, BLOCK)]


def _screen_variogram(result, use, positions, years, m2ph, h2ph) -> dict:
    """Exponential variogram of the residual phases (atmosphere included) of the used points,
    each point's temporal mean removed and the slow part (unmodelled deformation) low-passed
    out, on at most :data:`VARIOGRAM_POINTS` points."""
    from depsi.processing.atmosphere import DEFAULT_TEMPORAL_WINDOW, fit_variogram, lowpass

    chosen = np.flatnonzero(use)
    if chosen.size > VARIOGRAM_POINTS:
        chosen = np.sort(np.random.default_rng(1).choice(chosen, VARIOGRAM_POINTS,
                                                         replace=False))
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
    return fit_variogram(positions[chosen], residual)


@single_threaded_blas()
def estimate_correlated_height(
    result: xr.Dataset,
    *,
    screen_variance: float | None = None,
    screen_range: float | None = None,
    k: int | None = None,
    overwrite: bool = False,
) -> xr.Dataset:
    """Move the atmosphere's projection on the baselines from the height errors to the screen.

    Parameters
    ----------
    result
        Point results: ``height_error`` (m), ``velocity`` (m/yr), ``h2ph``, ``time``,
        positions, ``wavelength``; ``unwrapped_phase`` and ``aps`` (rad) are updated when
        present. Points with a NaN height error are neither used nor changed.
    screen_variance, screen_range
        Variance (rad^2) and range (m) of the exponential covariance of the part of the screen
        that changes from epoch to epoch (what leaks into heights). Default: fitted to the
        points' residual phases (``unwrapped_phase + aps`` less the fitted model, each
        point's temporal mean removed, which takes out the mother epoch's screen common to
        every interferogram), by
        :func:`~depsi.processing.atmosphere.fit_variogram`. The variance is then reduced to
        the screen's variance about the scene's mean (``1 - exp(-D / range)`` for the mean
        distance ``D`` between points): a range longer than the scene is not identified by
        the fit, their ratio is.
    k
        Nearest points used for each prediction; default as many as the points' density puts
        within ``screen_range`` of a point, bounded by :data:`NEIGHBOURS`.
    overwrite
        Update ``unwrapped_phase`` and ``aps`` in their own arrays (in memory, float32,
        ``(space, time)``), so ``result`` changes too, instead of into new ones: for a caller
        that owns ``result`` (the chain's model step), it saves one copy of both series
        (0.5 GB at 10^6 points and 60 epochs). Other variables are never written in place.

    Returns
    -------
    xarray.Dataset
        ``result`` with ``height_error`` less the predicted field, ``height_error_correlated``
        (m, the field moved; relative to its mean over ``in_reference_area`` when present),
        ``aps`` plus and ``unwrapped_phase`` minus ``m2ph * h2ph * field``; displacement,
        ambiguities and temporal coherence are unchanged by construction. Attrs record the
        fitted height covariance (``correlated_height_*``).

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
    gain = np.empty(n)
    for rows in _blocks(n):
        gain[rows] = np.sqrt(np.maximum(height_leak_gain(h2ph_rows(h2ph, rows, years.size),
                                                         years, m2ph), 0.0))
    use &= np.isfinite(gain) & (gain > 0)
    positions = point_positions(result)
    # the screen's variance about the scene's mean: a range beyond the scene leaves sill and
    # range unidentified (only their ratio is seen), and the datum removes the scene's mean
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, n, (2, 20000))
    scene_distance = float(np.mean(np.hypot(*(positions[pairs[0]] - positions[pairs[1]]).T)))
    if screen_variance is None or screen_range is None:
        if "unwrapped_phase" not in result or "velocity" not in result:
            raise ValueError("result: expected 'unwrapped_phase' and 'velocity' to fit the "
                             "screen's variogram, or screen_variance and screen_range given; "
                             f"found {sorted(result.data_vars)}")
        fitted = _screen_variogram(result, use, positions, years, m2ph, h2ph)
        screen_variance = fitted["sill"] if screen_variance is None else screen_variance
        screen_range = fitted["range"] if screen_range is None else screen_range
    screen_range = float(screen_range)
    signal_sill = float(screen_variance) * (1.0 - np.exp(-scene_distance / screen_range))
    normalised = height[use] / gain[use]
    mean = normalised.mean()
    noise = fit_height_covariance(positions[use], normalised, signal_sill, screen_range)
    if k is None:
        extent = np.ptp(positions[use], axis=0)
        density = use.sum() / max(float(extent[0] * extent[1]), 1.0)
        k = int(np.clip(density * np.pi * screen_range ** 2, *NEIGHBOURS))
    predicted = _predict(positions[use], normalised - mean, positions, signal_sill=signal_sill,
                         signal_range=screen_range, noise=noise, k=k)
    field = np.where(np.isfinite(gain), predicted * gain, 0.0)
    if "in_reference_area" in result and result["in_reference_area"].values[use].any():
        area = result["in_reference_area"].values.astype(bool) & use
        field -= field[area].mean()
    else:
        field -= field[use].mean()
    field = np.where(use, field, 0.0)
    out = result.assign(
        height_error=("space", (height - field).astype(result["height_error"].dtype)),
        height_error_correlated=("space", field.astype(np.float32)))
    # the field's phase m2ph h2ph field moves from the unwrapped phase to the screen, block by
    # block into new float32 arrays: no (points, epochs) float64 temporary
    for name, sign in (("aps", 1.0), ("unwrapped_phase", -1.0)):
        if name not in result:
            continue
        series = result[name].transpose("space", "time")
        own = series.data if overwrite else None  # the array itself when in memory
        moved = (own if isinstance(own, np.ndarray) and own.dtype == np.float32
                 and own.flags.writeable and series.dims == result[name].dims
                 else np.empty(series.shape, np.float32))
        for rows in _blocks(n):  # each block read before it is written, in place or not
            moved[rows] = series.isel(space=rows).values + sign * m2ph * h2ph_rows(
                h2ph, rows, years.size) * field[rows, None]
        out[name] = (series.dims, moved)
    out.attrs.update({"correlated_height_nugget": noise["nugget"],
                      "correlated_height_extra_sill": noise["extra_sill"],
                      "correlated_height_extra_range": noise["extra_range"],
                      "correlated_height_screen_variance": float(screen_variance),
                      "correlated_height_screen_range": screen_range,
                      "correlated_height_signal_sill": signal_sill})
    logger.info("correlated height: %d points, field %.2f m RMS moved into the screen (height "
                "covariance besides the atmosphere: nugget %.3g, correlated %.3g over %.0f m)",
                use.sum(), np.sqrt(np.mean(field[use] ** 2)), noise["nugget"],
                noise["extra_sill"], noise["extra_range"])
    return out
