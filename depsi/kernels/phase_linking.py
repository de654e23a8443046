"""Distributed scatterers, batched: the SHP test, sample coherence matrices, phase linking (EVD and
EMI), the linked phase's temporal coherence and the Cramér-Rao bound of a phase history.

Pure array code on NumPy or CuPy (the namespace of the inputs, one code path): pixels are the
leading (batch) axis, time the last. The Hermitian eigenproblems and the real linear solves are
``xp.linalg.eigh`` and ``xp.linalg.solve`` on stacks of matrices, batched on both libraries.

Conventions: a pixel's complex samples ``z`` (time last) have covariance ``C = E[z z^H]``, so
``C_ij = E[z_i conj(z_j)]`` has the phase ``theta_i - theta_j`` of the phase history ``theta``.
A linked phase is referenced to one epoch (``reference``, where it is zero) and wrapped to
``(-pi, pi]``.
"""

from __future__ import annotations

import numpy as np

from depsi.kernels.backend import array_namespace

#: Phase-linking estimators: ``"emi"`` (eigendecomposition-based maximum-likelihood estimator of
#: interferometric phase, Ansari et al. 2018) and ``"evd"`` (the principal eigenvector of the
#: sample coherence matrix, Fornaro et al. 2015).
METHODS = ("emi", "evd")

#: EMI's weights ``|G|^-1`` are taken from ``(1 - beta) |G| + beta I`` with this ``beta``: the
#: sample magnitudes of a few looks make ``|G|`` ill-conditioned or indefinite (at 50 looks and
#: 60 epochs EMI's phase RMSE was 8x the Cramér-Rao bound unshrunk, 1.2x at 0.5), the
#: regularisation of the coherence magnitudes Zwieback (2022, IEEE GRSL 19, 4019305) proposes.
#: Measured flat from 0.4 to 0.7 on the exponential models of docs/steps/distributed.md, from
#: 30 to 120 epochs and 20 to 200 looks.
DEFAULT_WEIGHT_SHRINKAGE = 0.5

#: Where EMI's magnitudes ``|G|`` come from: ``"lag"``, each pair's sample magnitude replaced
#: by the mean over the pairs of epochs as many epochs apart (:func:`lag_averaged`), or
#: ``"sample"``, the sample magnitudes themselves (Ansari, De Zan and Bamler 2018). A pixel's
#: ``T (T - 1) / 2`` sample magnitudes from a few dozen looks are noisy weights; their means
#: over a lag are ``T - 1`` far steadier ones, at the cost of assuming that decorrelation
#: depends on the epochs' separation. Measured with the default shrinkage (RMSE / Cramér-Rao
#: bound, 600-1000 pixels each, docs/steps/distributed.md): on the exponential model at 30
#: epochs and 20 looks 1.29 -> 1.20, 50 looks 1.10 -> 1.05, 60 x 100 1.11 -> 1.06, 120 x 200
#: 1.10 -> 1.03; and also where that assumption fails, under a seasonal decorrelation (each
#: epoch's coherence 0.5-1.0 with the season; 30 x 20, 30 x 50, 60 x 100: 1.46 -> 1.39,
#: 1.31 -> 1.24, 1.21 -> 1.13) and irregular revisits (6-48 days; 1.28 -> 1.22, 1.15 -> 1.10,
#: 1.11 -> 1.06).
MAGNITUDES = ("lag", "sample")
DEFAULT_MAGNITUDES = "lag"

#: Nominal false-alarm rate of the SHP test: the share of truly homogeneous neighbours rejected.
DEFAULT_ALPHA = 0.05


def window_offsets(window: tuple[int, ...]) -> np.ndarray:
    """The ``(azimuth, range)`` offsets of a window's cells, row by row, as ``(n_cells, 2)`` int.

    Parameters
    ----------
    window
        ``(n_azimuth, n_range)``, both odd (the pixel sits at the centre).

    Examples
    --------
    >>> window_offsets((3, 1)).tolist()
    [[-1, 0], [0, 0], [1, 0]]
    """
    sizes = tuple(int(w) for w in window)
    if len(sizes) != 2 or min(sizes) < 1 or any(w % 2 == 0 for w in sizes):
        raise ValueError(f"window: expected two odd sizes (azimuth, range), found {window!r}")
    half_az, half_rg = sizes[0] // 2, sizes[1] // 2
    az, rg = np.meshgrid(np.arange(-half_az, half_az + 1), np.arange(-half_rg, half_rg + 1),
                         indexing="ij")
    return np.stack([az.ravel(), rg.ravel()], axis=1).astype(np.int64)


def glrt_threshold(alpha: float, n_samples: float) -> float:
    """The GLRT's bound on ``|log(m_p / m_q)|`` of two pixels' mean intensities at false-alarm
    rate ``alpha``, each mean over ``n_samples`` independent epochs.

    For circular Gaussian pixels the intensity is exponential, a mean of ``n`` of them is
    Gamma-distributed and the ratio of two such means is F(2n, 2n) under equal power. With equal
    sample sizes the GLRT statistic ``2n log((m_p + m_q)^2 / (4 m_p m_q))`` grows with
    ``|log(m_p / m_q)|`` only, and the log of an F(2n, 2n) variable is symmetric, so the GLRT is
    the equal-tailed F test and its threshold is exact: ``log F_{1 - alpha/2}(2n, 2n)``.

    Examples
    --------
    >>> round(glrt_threshold(0.05, 30), 3)
    0.511
    """
    from scipy.stats import f as f_distribution

    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a false-alarm rate in (0, 1), found {alpha!r}")
    if not n_samples >= 1:
        raise ValueError(f"n_samples: expected >= 1 independent epochs, found {n_samples!r}")
    dof = 2.0 * float(n_samples)
    return float(np.log(f_distribution.ppf(1.0 - alpha / 2.0, dof, dof)))


def shp_glrt(mean_intensity, window: tuple[int, int], *, threshold: float):
    """Statistically homogeneous pixels of every pixel of a padded block, by the GLRT on the
    Rayleigh scale (equal mean intensity), vectorised over pixels and window cells.

    Parameters
    ----------
    mean_intensity
        ``(n_azimuth + 2 h_az, n_range + 2 h_rg)`` mean intensity over time of a block with a
        halo of half a window on each side (``h = window // 2``); NaN where there is no pixel
        (outside the scene), which is never homogeneous.
    window
        ``(n_azimuth, n_range)`` of the search window, odd sizes.
    threshold
        Bound on ``|log(m_p / m_q)|`` for a neighbour to be homogeneous: exact for independent
        epochs from :func:`glrt_threshold` (``n_samples`` fewer than the epochs where speckle is
        correlated in time, see :func:`effective_samples`), or calibrated on the scene
        (:func:`depsi.processing.distributed_scatterers.shp_threshold`).

    Returns
    -------
    mask
        ``(n_azimuth, n_range, n_cells)`` bool, cell order of :func:`window_offsets`; the centre
        cell is True wherever the pixel itself has a finite, positive mean.

    Examples
    --------
    >>> m = np.ones((5, 5)); m[:, 3:] = 10.0
    >>> shp_glrt(m, (3, 3), threshold=glrt_threshold(0.05, 30)).sum(axis=-1).tolist()
    [[9, 6, 6], [9, 6, 6], [9, 6, 6]]
    """
    xp = array_namespace(mean_intensity)
    offsets = window_offsets(window)
    half_az, half_rg = int(window[0]) // 2, int(window[1]) // 2
    n_az = mean_intensity.shape[0] - 2 * half_az
    n_rg = mean_intensity.shape[1] - 2 * half_rg
    if mean_intensity.ndim != 2 or n_az < 1 or n_rg < 1:
        raise ValueError(f"mean_intensity: expected a 2-D block with a halo of {half_az, half_rg}"
                         f" pixels, found shape {tuple(mean_intensity.shape)}")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_mean = xp.log(xp.asarray(mean_intensity, dtype=xp.float64))
    log_mean = xp.where(xp.isfinite(log_mean), log_mean, xp.nan)
    rows = xp.arange(n_az)[:, None, None] + half_az + xp.asarray(offsets[:, 0])[None, None, :]
    cols = xp.arange(n_rg)[None, :, None] + half_rg + xp.asarray(offsets[:, 1])[None, None, :]
    centre = log_mean[half_az:half_az + n_az, half_rg:half_rg + n_rg, None]
    difference = xp.abs(log_mean[rows, cols] - centre)  # NaN compares False: no pixel, no SHP
    return difference <= threshold


def effective_samples(coherence) -> float:
    """Independent epochs a mean intensity is worth under a coherence matrix: ``T^2 / sum |g|^2``.

    Intensities of a circular Gaussian pixel at epochs i and j covary as ``|g_ij|^2``, so the
    variance of their mean is ``sum_ij |g_ij|^2 / T^2`` times that of one epoch: the mean is
    worth ``T^2 / ||G||_F^2`` independent epochs (``T`` when speckle is independent in time).

    Examples
    --------
    >>> effective_samples(np.eye(30))
    30.0
    >>> effective_samples(np.ones((30, 30)))
    1.0
    """
    xp = array_namespace(coherence)
    magnitude = xp.abs(xp.asarray(coherence))
    n_epochs = magnitude.shape[-1]
    return float(n_epochs**2 / float((magnitude**2).sum()))


def gather_neighbours(slc, rows, cols, window: tuple[int, int]):
    """The window's samples of chosen pixels of a padded block: ``(n_pixels, n_cells, T)``.

    Parameters
    ----------
    slc
        ``(n_azimuth + 2 h_az, n_range + 2 h_rg, T)`` complex block with its halo.
    rows, cols
        Integer positions of the pixels in the block without its halo.
    window
        As in :func:`shp_glrt`.
    """
    xp = array_namespace(slc)
    offsets = xp.asarray(window_offsets(window))
    rows = xp.asarray(rows)[:, None] + int(window[0]) // 2 + offsets[None, :, 0]
    cols = xp.asarray(cols)[:, None] + int(window[1]) // 2 + offsets[None, :, 1]
    return slc[rows, cols]


def sample_coherence(samples, weights=None, *, bias_correction: bool = False):
    """Sample coherence matrices of a batch of pixels from their looks.

    Parameters
    ----------
    samples
        ``(n_pixels, n_looks, T)`` complex: each pixel's homogeneous neighbours (looks).
    weights
        ``(n_pixels, n_looks)`` bool or 0/1: which looks count (the SHP mask); default all.
    bias_correction
        Correct the magnitudes for the bias of the sample coherence (Touzi et al. 1999, IEEE
        TGRS 37(1), 135-149: ``E|g_hat|^2 = 1/L`` at zero coherence with ``L`` looks) by the
        moment estimate ``|g|^2 = max((L |g_hat|^2 - 1) / (L - 1), 0)``, exact at zero and at
        full coherence; phases are kept.

    Returns
    -------
    coherence
        ``(n_pixels, T, T)`` Hermitian, unit diagonal: ``C_ij / sqrt(C_ii C_jj)`` with
        ``C = sum_k w_k z_k z_k^H``.
    looks
        ``(n_pixels,)`` number of looks used.

    Examples
    --------
    >>> z = np.exp(1j * np.array([0.0, 0.5, 1.0]))[None, None, :] * np.ones((1, 4, 1))
    >>> gamma, looks = sample_coherence(z)
    >>> np.angle(gamma[0, 1, 0]).round(3), int(looks[0])
    (np.float64(0.5), 4)
    """
    xp = array_namespace(samples, weights)
    samples = xp.asarray(samples)
    if samples.ndim != 3:
        raise ValueError(f"samples: expected (n_pixels, n_looks, T), found shape "
                         f"{tuple(samples.shape)}")
    if weights is None:
        weights = xp.ones(samples.shape[:2], dtype=samples.real.dtype)
    weights = xp.asarray(weights).astype(samples.real.dtype)
    weighted = samples * weights[..., None]
    covariance = xp.matmul(xp.swapaxes(weighted, 1, 2), xp.conj(samples))
    power = xp.real(xp.diagonal(covariance, axis1=1, axis2=2))
    scale = xp.sqrt(power)
    scale = xp.where(scale > 0, scale, xp.inf)  # no power, no coherence (and no 0/0)
    coherence = covariance / (scale[:, :, None] * scale[:, None, :])
    looks = weights.sum(axis=1)
    if bias_correction:
        magnitude = xp.abs(coherence)
        looks_ = xp.maximum(looks, 2.0)[:, None, None]
        corrected = xp.sqrt(xp.maximum((looks_ * magnitude**2 - 1.0) / (looks_ - 1.0), 0.0))
        eye = xp.eye(coherence.shape[-1], dtype=bool)
        factor = xp.where(eye, 1.0, corrected / xp.where(magnitude > 0, magnitude, 1.0))
        coherence = coherence * factor.astype(coherence.real.dtype)
    return coherence, looks


def short_lag_coherence(slc, weights, window: tuple[int, int]):
    """Mean magnitude of the SHP-averaged normalised interferograms of consecutive epochs, per
    pixel of a padded block: the superdiagonal of each pixel's sample coherence matrix,
    ``mean_t |g_t,t+1|``, in ``O(T n_cells)`` a pixel, without forming the matrix.

    The cheap coherence proxy of the phase-linking pre-screen
    (:func:`short_lag_noise_threshold`): it is computed window cell by window cell over the
    whole block (one accumulator of ``(n_azimuth, n_range, T)``, no gathered looks).

    Parameters
    ----------
    slc
        ``(n_azimuth + 2 h_az, n_range + 2 h_rg, T)`` complex block with its halo, epochs in time
        order.
    weights
        ``(n_azimuth, n_range, n_cells)`` bool or 0/1: each inner pixel's SHP, cell order of
        :func:`window_offsets`.
    window
        As in :func:`shp_glrt`.

    Returns
    -------
    coherence
        ``(n_azimuth, n_range)`` in [0, 1]; NaN where a pixel has no SHP.

    Examples
    --------
    >>> z = np.exp(1j * np.linspace(0, 2, 4)) * np.ones((3, 3, 1))
    >>> short_lag_coherence(z, np.ones((1, 1, 9), bool), (3, 3)).round(6).tolist()
    [[1.0]]
    """
    xp = array_namespace(slc, weights)
    half_az, half_rg = int(window[0]) // 2, int(window[1]) // 2
    n_az, n_rg = slc.shape[0] - 2 * half_az, slc.shape[1] - 2 * half_rg
    if weights.shape[:2] != (n_az, n_rg) or weights.shape[2] != int(window[0]) * int(window[1]):
        raise ValueError(f"weights: expected ({n_az}, {n_rg}, {int(window[0]) * int(window[1])})"
                         f" for a block of shape {tuple(slc.shape)}, found {tuple(weights.shape)}")
    product = slc[..., :-1] * xp.conj(slc[..., 1:])
    power = xp.real(slc * xp.conj(slc))
    cross = xp.zeros((n_az, n_rg, slc.shape[-1] - 1), dtype=product.dtype)
    total = xp.zeros((n_az, n_rg, slc.shape[-1]), dtype=power.dtype)
    weights = xp.asarray(weights).astype(power.dtype)
    for cell, (d_az, d_rg) in enumerate(window_offsets(window)):
        rows = slice(half_az + int(d_az), half_az + int(d_az) + n_az)
        cols = slice(half_rg + int(d_rg), half_rg + int(d_rg) + n_rg)
        weight = weights[:, :, cell, None]
        cross += weight * product[rows, cols]
        total += weight * power[rows, cols]
    scale = xp.sqrt(total[..., :-1] * total[..., 1:])
    magnitude = xp.abs(cross) / xp.where(scale > 0, scale, xp.inf)
    return xp.where(weights.sum(axis=-1) > 0, magnitude.mean(axis=-1), xp.nan)


def short_lag_noise_threshold(looks, n_epochs: int, sigmas: float):
    """The pre-screen's bound on :func:`short_lag_coherence`: its mean where there is no
    coherence at all, plus ``sigmas`` of its standard deviation, for ``looks`` SHP and
    ``n_epochs`` epochs.

    At zero coherence ``|g|^2`` of ``L`` looks is Beta(1, L - 1) (Touzi et al. 1999), so
    ``E|g| = Gamma(L) Gamma(3/2) / Gamma(L + 1/2)`` (about ``0.886 / sqrt(L)``) and
    ``var|g| = 1/L - E|g|^2``; the mean over the ``T - 1`` consecutive pairs, nearly independent
    at zero coherence, has ``1 / sqrt(T - 1)`` of that spread.

    Examples
    --------
    >>> round(float(short_lag_noise_threshold(20, 30, 3.0)), 3)
    0.256
    """
    from scipy.special import gammaln

    looks = np.maximum(np.asarray(looks, dtype=np.float64), 2.0)
    mean = np.exp(gammaln(looks) + gammaln(1.5) - gammaln(looks + 0.5))
    std = np.sqrt(np.maximum(1.0 / looks - mean**2, 0.0))
    return mean + float(sigmas) * std / np.sqrt(max(int(n_epochs) - 1, 1))


def shrink(coherence, shrinkage: float):
    """Coherence matrices shrunk toward the identity: ``(1 - beta) G + beta I``.

    The shrinkage target of Ledoit and Wolf (2004, J. Multivariate Anal. 88, 365-411) on the
    coherence scale: it keeps ``|G|`` invertible (which EMI needs) when the looks are few
    against the epochs, at the price of coherence magnitudes pulled toward zero by ``beta``.

    Examples
    --------
    >>> shrink(np.ones((1, 2, 2)), 0.1)[0].tolist()
    [[1.0, 0.9], [0.9, 1.0]]
    """
    if not 0 <= shrinkage < 1:
        raise ValueError(f"shrinkage: expected a fraction in [0, 1), found {shrinkage!r}")
    xp = array_namespace(coherence)
    eye = xp.eye(coherence.shape[-1], dtype=coherence.dtype)
    return (1.0 - shrinkage) * coherence + shrinkage * eye


def _referenced(vector, reference: int):
    """Phases of eigenvectors relative to the reference epoch, wrapped to (-pi, pi]."""
    xp = array_namespace(vector)
    phase = xp.angle(vector * xp.conj(vector[:, reference:reference + 1]))
    phase = xp.where(phase <= -np.pi, np.pi, phase)  # angle gives [-pi, pi]; keep (-pi, pi]
    return phase.astype(vector.real.dtype)


def lag_averaged(magnitude, start: int = 0):
    """Coherence magnitudes with each pair's value replaced by the mean over the pairs of
    epochs the same number of epochs apart (the matrix's diagonals), among the epochs from
    ``start`` on; rows and columns before ``start`` (a mini-stack's compressed SLCs, which are
    no epochs in time) keep their own values. :data:`MAGNITUDES` says why.

    Parameters
    ----------
    magnitude
        ``(n_pixels, T, T)`` real, symmetric.
    start
        First epoch of the averaged block.

    Examples
    --------
    >>> m = np.array([[[1.0, 0.8, 0.3], [0.8, 1.0, 0.6], [0.3, 0.6, 1.0]]])
    >>> lag_averaged(m)[0].tolist()
    [[1.0, 0.7, 0.3], [0.7, 1.0, 0.7], [0.3, 0.7, 1.0]]
    >>> lag_averaged(m, start=1)[0].tolist()  # the first row and column kept
    [[1.0, 0.8, 0.3], [0.8, 1.0, 0.6], [0.3, 0.6, 1.0]]
    """
    xp = array_namespace(magnitude)
    n_epochs = magnitude.shape[-1] - int(start)
    if n_epochs < 3:  # one pair a lag at most: nothing to average
        return magnitude
    block = magnitude[:, start:, start:]
    # one pass a lag (T of them, each over every pixel at once)
    means = xp.stack([xp.mean(xp.diagonal(block, offset=lag, axis1=1, axis2=2), axis=-1)
                      for lag in range(n_epochs)], axis=1)
    lag = np.abs(np.subtract.outer(np.arange(n_epochs), np.arange(n_epochs)))
    averaged = xp.reshape(xp.take(means, xp.asarray(lag.ravel()), axis=1), block.shape)
    if not start:
        return averaged
    out = magnitude.copy()  # NumPy and CuPy arrays alike
    out[:, start:, start:] = averaged
    return out


def link_phases(coherence, *, method: str = "emi", reference: int = 0,
                weight_shrinkage: float = DEFAULT_WEIGHT_SHRINKAGE,
                magnitudes: str = DEFAULT_MAGNITUDES, lag_start: int = 0):
    """Phase histories of a batch of pixels from their coherence matrices.

    Parameters
    ----------
    coherence
        ``(n_pixels, T, T)`` Hermitian coherence (or covariance) matrices.
    method
        ``"emi"``: the eigenvector of the smallest eigenvalue of ``|G|^-1 o G`` (Ansari, De Zan
        and Bamler 2018, IEEE TGRS 56(7), 4109-4125), the maximum-likelihood estimate to first
        order, using the coherence magnitudes as weights. ``"evd"``: the eigenvector of the
        largest eigenvalue of ``G`` (Fornaro, Verde, Reale and Pauciullo 2015, IEEE TGRS
        53(4), 2152-2164).
    reference
        Epoch whose linked phase is zero.
    weight_shrinkage
        EMI only: the magnitudes whose inverse weighs ``G`` are ``(1 - beta) |G| + beta I``
        (:data:`DEFAULT_WEIGHT_SHRINKAGE`); 0 with ``magnitudes="sample"`` is Ansari et al.'s
        EMI as published.
    magnitudes
        EMI only: ``|G|`` averaged over each lag (``"lag"``, :func:`lag_averaged`) or the
        sample magnitudes (``"sample"``); :data:`MAGNITUDES`.
    lag_start
        With ``"lag"``: the first epoch of the averaged block (a mini-stack's compressed SLCs
        come before it and keep their magnitudes).

    Returns
    -------
    phase
        ``(n_pixels, T)`` linked phase, wrapped, zero at ``reference``.
    eigenvalue
        ``(n_pixels,)``: EMI's smallest eigenvalue (1 when the magnitudes are consistent with
        the phases' coherence, larger when they are not), or EVD's largest divided by ``T`` (the
        share of the matrix's energy the phase history explains).

    Examples
    --------
    >>> theta = np.array([0.0, 0.4, -1.2, 2.0])
    >>> g = 0.6 + 0.4 * np.eye(4)
    >>> gamma = (g * np.exp(1j * (theta[:, None] - theta[None, :])))[None]
    >>> [np.allclose(link_phases(gamma, method=m)[0][0], theta) for m in ("emi", "evd")]
    [True, True]
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, found {method!r}")
    xp = array_namespace(coherence)
    coherence = xp.asarray(coherence)
    n_epochs = coherence.shape[-1]
    if coherence.ndim != 3 or coherence.shape[1] != n_epochs:
        raise ValueError(f"coherence: expected (n_pixels, T, T), found shape "
                         f"{tuple(coherence.shape)}")
    if not 0 <= reference < n_epochs:
        raise ValueError(f"reference: expected an epoch in [0, {n_epochs}), found {reference!r}")
    if method == "evd":
        values, vectors = xp.linalg.eigh(coherence)
        return _referenced(vectors[:, :, -1], reference), values[:, -1] / n_epochs
    if not 0 <= weight_shrinkage < 1:
        raise ValueError(f"weight_shrinkage: expected a fraction in [0, 1), found "
                         f"{weight_shrinkage!r}")
    if magnitudes not in MAGNITUDES:
        raise ValueError(f"magnitudes: expected one of {MAGNITUDES}, found {magnitudes!r}")
    eye = xp.broadcast_to(xp.eye(n_epochs, dtype=coherence.real.dtype), coherence.shape)
    magnitude = xp.abs(coherence)
    if magnitudes == "lag":
        magnitude = lag_averaged(magnitude, lag_start)
    magnitude = (1.0 - weight_shrinkage) * magnitude + weight_shrinkage * eye
    inverse = xp.linalg.solve(magnitude, eye)
    values, vectors = xp.linalg.eigh(inverse.astype(coherence.dtype) * coherence)
    return _referenced(vectors[:, :, 0], reference), values[:, 0]


def temporal_coherence(coherence, phase):
    """Temporal coherence of linked phases against the sample coherence phases, in [-1, 1]:
    ``2 / (T^2 - T) * Re sum_{i<j} exp(j arg G_ij) exp(-j (theta_i - theta_j))`` (Ferretti et
    al. 2011, IEEE TGRS 49(9), 3460-3470, eq. 26).

    Examples
    --------
    >>> theta = np.array([[0.0, 0.4, -1.2]])
    >>> gamma = 0.5 * np.exp(1j * (theta[:, :, None] - theta[:, None, :]))
    >>> temporal_coherence(gamma, theta).round(6).tolist()
    [1.0]
    """
    xp = array_namespace(coherence, phase)
    n_epochs = coherence.shape[-1]
    magnitude = xp.abs(coherence)
    unit = coherence / xp.where(magnitude > 0, magnitude, 1.0)
    rotor = xp.exp(1j * xp.asarray(phase)).astype(coherence.dtype)
    total = xp.real(xp.einsum("pi,pij,pj->p", xp.conj(rotor), unit, rotor))
    diagonal = xp.real(xp.trace(unit, axis1=1, axis2=2))
    return ((total - diagonal) / (n_epochs * (n_epochs - 1))).astype(phase.dtype)


def cramer_rao_bound(coherence, looks, *, reference: int = 0):
    """Cramér-Rao bound on the variance (rad^2) of each epoch's phase, one epoch fixed.

    The Fisher information of the phase history of ``L`` independent looks of a circular
    Gaussian pixel with coherence magnitudes ``|G|`` is ``2 L (|G|^-1 o |G| - I)`` (Guarnieri and
    Tebaldini 2008, IEEE TGRS 46(10), 3436-3443); it is singular (a common phase is not
    observable), so the ``reference`` epoch is fixed and the rest inverted.

    Parameters
    ----------
    coherence
        ``(T, T)`` or ``(n_pixels, T, T)``; only magnitudes are used.
    looks
        Number of independent looks ``L`` (scalar or per pixel).
    reference
        The fixed epoch: its bound is zero.

    Returns
    -------
    variance
        ``(T,)`` or ``(n_pixels, T)``.

    Examples
    --------
    >>> g = 0.5 + 0.5 * np.eye(2)  # two epochs at coherence 0.5
    >>> cramer_rao_bound(g, 10).round(4).tolist()  # (1 - g^2) / (2 L g^2)
    [0.0, 0.15]
    """
    xp = array_namespace(coherence)
    magnitude = xp.abs(xp.asarray(coherence)).astype(xp.float64)
    single = magnitude.ndim == 2
    magnitude = magnitude[None] if single else magnitude
    n_epochs = magnitude.shape[-1]
    eye = xp.broadcast_to(xp.eye(n_epochs), magnitude.shape)
    looks = xp.asarray(looks, dtype=xp.float64).reshape(-1, 1, 1)
    fisher = 2.0 * looks * (xp.linalg.solve(magnitude, eye) * magnitude - eye)
    keep = xp.asarray([k for k in range(n_epochs) if k != reference])
    reduced = fisher[:, keep][:, :, keep]
    inverse = xp.linalg.solve(reduced, xp.broadcast_to(xp.eye(n_epochs - 1), reduced.shape))
    variance = xp.zeros(magnitude.shape[:2])
    variance[:, keep] = xp.diagonal(inverse, axis1=1, axis2=2)
    return variance[0] if single else variance


def phase_linking_bytes_per_pixel(n_epochs: int, n_cells: int) -> int:
    """Peak bytes per pixel of one batch of the covariance and phase-linking kernels, complex64:
    its looks (``8 n_cells T``), weighted looks (same), the coherence matrix and about four
    ``T x T`` temporaries of the solve and the eigensolver (``8 T^2`` each).

    Examples
    --------
    >>> phase_linking_bytes_per_pixel(30, 121)
    94080
    """
    return 16 * n_cells * n_epochs + 5 * 8 * n_epochs * n_epochs


def compress(looks, phase):
    """A mini-stack's compressed SLC: its looks projected on its linked phase,
    ``sum_m z_lm exp(-j theta_m) / sqrt(M)`` (Ansari, De Zan and Bamler 2017), one complex
    value a look.

    Parameters
    ----------
    looks
        ``(n_pixels, n_looks, M)`` complex.
    phase
        ``(n_pixels, M)`` linked phase of those epochs, on the datum.

    Returns
    -------
    ``(n_pixels, n_looks)`` complex, of ``looks``' dtype.

    Examples
    --------
    >>> looks = np.exp(1j * np.array([0.3, 0.5]))[None, None, :] * np.ones((1, 2, 1))
    >>> np.round(compress(looks, np.array([[0.3, 0.5]])), 6).tolist()
    [[(1.414214+0j), (1.414214+0j)]]
    """
    xp = array_namespace(looks, phase)
    projector = xp.exp(-1j * xp.asarray(phase)).astype(looks.dtype) / np.sqrt(looks.shape[-1])
    return xp.einsum("plm,pm->pl", looks, projector)


def kept_compressed(compressed, max_compressed: int | None):
    """The compressed SLCs a mini-stack carries on: all of them (``max_compressed`` None), or
    the first (the datum's, referenced to the first epoch) and the latest
    ``max_compressed - 1``, so that a long stack's problems stay ``(max_compressed + M)^2``.

    Every compressed SLC carries the datum's phase (its mini-stack's looks projected on phases
    on that datum), so any subset keeps the datum; the most recent ones are the most coherent
    with new epochs, the first the best tie to the first epoch.

    Examples
    --------
    >>> c = np.arange(6).reshape(1, 1, 6)
    >>> kept_compressed(c, 3).ravel().tolist(), kept_compressed(c, 1).ravel().tolist()
    ([0, 4, 5], [0])
    """
    if max_compressed is None or compressed.shape[-1] <= max_compressed:
        return compressed
    xp = array_namespace(compressed)
    latest = int(max_compressed) - 1
    if latest == 0:
        return compressed[..., :1]
    return xp.concatenate([compressed[..., :1], compressed[..., -latest:]], axis=-1)


def link_ministack(looks, compressed=None, weights=None, *, method: str = "emi",
                   weight_shrinkage: float = DEFAULT_WEIGHT_SHRINKAGE,
                   magnitudes: str = DEFAULT_MAGNITUDES,
                   bias_correction: bool = False, return_coherence: bool = False,
                   max_compressed: int | None = None):
    """One step of the sequential estimator (Ansari, De Zan and Bamler 2017, IEEE TGRS 55(10),
    5637-5652): link a mini-stack of new epochs beside the compressed SLCs of the earlier ones,
    and compress it.

    The coherence matrix is formed over ``[compressed..., new epochs]`` (``K + M`` of them, not
    the whole history), linked, and referenced to the first compressed SLC: a compressed SLC is
    its mini-stack's looks projected on that mini-stack's linked phase, so it carries the phase
    of the datum the first mini-stack was referenced to, and every mini-stack's phases are
    on that one datum. Without earlier mini-stacks the reference is the first new epoch.

    Parameters
    ----------
    looks
        ``(n_pixels, n_looks, M)`` complex: the new epochs' looks (SHP samples).
    compressed
        ``(n_pixels, n_looks, K)`` complex compressed SLCs of the earlier mini-stacks, or None.
    weights
        ``(n_pixels, n_looks)`` SHP mask, as in :func:`sample_coherence`.
    method, weight_shrinkage, bias_correction
        As in :func:`link_phases` and :func:`sample_coherence`.
    magnitudes
        As in :func:`link_phases`; with ``"lag"`` the new epochs' magnitudes are averaged
        over their lags, the compressed SLCs' kept.
    return_coherence
        Also return the mini-stack's coherence matrices, its looks and the linking's
        eigenvalues (for a bound or a quality figure of the step).
    max_compressed
        Carry at most this many compressed SLCs on to the next mini-stack
        (:func:`kept_compressed`); None: every one.

    Returns
    -------
    phase
        ``(n_pixels, M)`` linked phase of the new epochs on the datum.
    compressed
        ``(n_pixels, n_looks, K + 1)``: the earlier compressed SLCs and this mini-stack's
        (at most ``max_compressed`` of them).
    coherence, looks, eigenvalue
        With ``return_coherence``: ``(n_pixels, K + M, K + M)`` over ``[compressed, new]``,
        ``(n_pixels,)`` looks and ``(n_pixels,)`` as :func:`link_phases` gives them.

    Examples
    --------
    >>> theta = np.array([0.0, 0.5, 1.0, 1.5])
    >>> looks = np.exp(1j * theta) * np.ones((1, 3, 1))
    >>> phase, compressed = link_ministack(looks[:, :, :2])
    >>> phase, compressed = link_ministack(looks[:, :, 2:], compressed)
    >>> phase.round(3).tolist(), compressed.shape
    ([[1.0, 1.5]], (1, 3, 2))
    """
    xp = array_namespace(looks, compressed)
    looks = xp.asarray(looks)
    n_old = 0 if compressed is None else compressed.shape[-1]
    stack = looks if compressed is None else xp.concatenate([compressed, looks], axis=-1)
    gamma, n_looks = sample_coherence(stack, weights, bias_correction=bias_correction)
    phase, eigenvalue = link_phases(gamma, method=method, reference=0,
                                    weight_shrinkage=weight_shrinkage, magnitudes=magnitudes,
                                    lag_start=n_old)
    new = phase[:, n_old:]
    summary = compress(looks, new)[:, :, None]
    compressed = summary if compressed is None else xp.concatenate([compressed, summary], axis=-1)
    compressed = kept_compressed(compressed, max_compressed)
    if return_coherence:
        return new, compressed, gamma, n_looks, eigenvalue
    return new, compressed


def temporal_coherence_tile(looks_a, looks_b, phase_a, phase_b, weights=None):
    """One tile of the temporal coherence of linked phases, summed: ``sum_ij Re exp(j arg
    C_ij) exp(-j (theta_i - theta_j))`` over epochs ``i`` of ``looks_a`` and ``j`` of
    ``looks_b``, ``C = sum_k w_k z_k z_k^H`` (only phases count, so no normalisation).

    :func:`temporal_coherence` of a ``T``-epoch history is the sum over all tiles of pairs of
    epoch groups, less the ``T`` diagonal terms, over ``T (T - 1)``: the mini-stack path forms
    it in ``(n_pixels, M, M)`` pieces instead of one ``(n_pixels, T, T)`` matrix.

    Parameters
    ----------
    looks_a, looks_b
        ``(n_pixels, n_looks, M_a)`` and ``(n_pixels, n_looks, M_b)`` complex.
    phase_a, phase_b
        ``(n_pixels, M_a)`` and ``(n_pixels, M_b)`` linked phases on one datum.
    weights
        ``(n_pixels, n_looks)`` SHP mask; default all looks.

    Examples
    --------
    >>> theta = np.array([[0.0, 0.4, -1.2]])
    >>> z = np.exp(1j * theta)[:, None, :] * np.ones((1, 5, 1))
    >>> float(temporal_coherence_tile(z, z, theta, theta)[0])  # 9 terms of 1
    9.0
    """
    xp = array_namespace(looks_a, looks_b)
    if weights is not None:
        looks_a = looks_a * xp.asarray(weights).astype(looks_a.real.dtype)[..., None]
    cross = xp.matmul(xp.swapaxes(looks_a, 1, 2), xp.conj(looks_b))
    magnitude = xp.abs(cross)
    unit = cross / xp.where(magnitude > 0, magnitude, 1.0)
    rotor_a = xp.exp(1j * xp.asarray(phase_a)).astype(unit.dtype)
    rotor_b = xp.exp(1j * xp.asarray(phase_b)).astype(unit.dtype)
    return xp.real(xp.einsum("pi,pij,pj->p", xp.conj(rotor_a), unit, rotor_b))


def sequential_phase_linking(ministacks, weights=None, *, method: str = "emi",
                             weight_shrinkage: float = DEFAULT_WEIGHT_SHRINKAGE,
                             magnitudes: str = DEFAULT_MAGNITUDES,
                             max_compressed: int | None = None):
    """Phase histories from mini-stacks of epochs given one after the other, in memory that
    grows with the number of mini-stacks, not of epochs (:func:`link_ministack`).

    Parameters
    ----------
    ministacks
        Iterable of ``(n_pixels, n_looks, M_k)`` complex looks, in time order; read one at a
        time (a generator reading a stack chunk by chunk keeps one mini-stack in memory).
    weights, method, weight_shrinkage, magnitudes, max_compressed
        As in :func:`link_ministack`; with ``max_compressed`` the memory does not grow with
        the mini-stacks either.

    Returns
    -------
    phase
        ``(n_pixels, sum M_k)``, zero at the first epoch, wrapped.
    compressed
        ``(n_pixels, n_looks, n_ministacks)`` (at most ``max_compressed``): what a later
        mini-stack needs to continue.

    Examples
    --------
    >>> theta = np.linspace(0, 3, 9)
    >>> looks = np.exp(1j * theta) * np.ones((2, 4, 1))
    >>> phase, _ = sequential_phase_linking(looks[..., k:k + 3] for k in range(0, 9, 3))
    >>> np.allclose(phase, theta)
    True
    """
    xp, compressed, pieces = None, None, []
    for looks in ministacks:
        xp = array_namespace(looks)
        phase, compressed = link_ministack(looks, compressed, weights, method=method,
                                           weight_shrinkage=weight_shrinkage,
                                           magnitudes=magnitudes,
                                           max_compressed=max_compressed)
        pieces.append(phase)
    if xp is None:
        raise ValueError("ministacks: expected at least one mini-stack, found none")
    return xp.concatenate(pieces, axis=-1), compressed
