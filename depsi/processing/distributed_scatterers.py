"""Distributed scatterers on a raster stack: statistically homogeneous pixels (SHP) by a GLRT on
the mean intensity, then each DS pixel's coherence matrix over its SHP and its phase history by
phase linking (EMI or EVD), lazily, block by block with halos.

Both steps take a stack ``(azimuth, range, time)`` with ``complex`` (as
:func:`depsi.simulate.simulate_stack` and the readers give it) and stay lazy: each block is
padded with half a window of its neighbours (``dask.array.overlap``), its kernels of
:mod:`depsi.kernels.phase_linking` run on the padded block, and the halo is trimmed. The SHP
test needs only the mean intensity, so its halo is a 2-D raster; the coherence step carries the
halo of the stack itself (``window // 2`` pixels each side, every epoch).
"""

from __future__ import annotations

import logging
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from depsi.kernels.backend import (
    array_namespace,
    batch_size,
    parse_device,
    to_device,
    to_host,
    use_device,
)
from depsi.kernels.phase_linking import (
    DEFAULT_ALPHA,
    DEFAULT_MAGNITUDES,
    DEFAULT_WEIGHT_SHRINKAGE,
    MAGNITUDES,
    METHODS,
    compress,
    cramer_rao_bound,
    gather_neighbours,
    glrt_threshold,
    link_ministack,
    link_phases,
    phase_linking_bytes_per_pixel,
    sample_coherence,
    short_lag_coherence,
    short_lag_noise_threshold,
    shp_glrt,
    shrink,
    temporal_coherence,
    temporal_coherence_tile,
    window_offsets,
)

logger = logging.getLogger(__name__)

#: Bytes a batch of pixels' phase linking may take on the CPU: the batched eigensolver is no
#: faster on larger batches, and a batch sized by the free memory alone took 12 GB on a
#: 200 x 200 x 93 stack.
CPU_BATCH_BYTES = 256 * 2**20

#: SHP search window ``(azimuth, range)``: 121 cells, so up to 121 looks per DS pixel.
DEFAULT_WINDOW = (11, 11)

#: A pixel is a DS candidate with at least this many SHP (itself included): fewer looks than
#: this give coherence matrices too noisy to link (DS are meant for 20-200 looks).
DEFAULT_MIN_LOOKS = 20

#: Ways the SHP threshold is set (``calibration``): from the scene's neighbouring pixel pairs
#: (``"neighbours"``), or exactly for temporally independent epochs (``"epochs"``); a number
#: is taken as the independent epochs behind each mean intensity.
CALIBRATIONS = ("neighbours", "epochs")

#: Distance (pixels, along azimuth and along range) of the pixel pairs that calibrate the SHP
#: threshold: two, so that oversampled neighbours (whose speckle is correlated) are skipped.
CALIBRATION_LAG = 2

#: Quantile of the calibration pairs' ``|log(m_p / m_q)|`` at which the F(2n, 2n) model is fitted
#: (``n``: the independent epochs a mean intensity is worth). High, because correlated speckle
#: has a heavier tail than the model fitted at its median (which rejected up to 6 % at alpha 5 %),
#: and below 1 - 10 % so that up to a tenth of heterogeneous pairs (region edges) only make the
#: test more conservative. Measured on docs/steps/distributed.md's stacks: 5.0-5.3 % rejected at
#: alpha 5 %, 1.0-1.2 % at 1 %.
CALIBRATION_QUANTILE = 0.9

#: Bin edges of |log intensity ratio| for the calibration's exact, chunk-independent quantile.
_RATIO_BINS = np.linspace(0.0, 8.0, 40_001)


def _half(window: tuple[int, ...]) -> tuple[int, int]:
    window_offsets(window)  # validates the window
    return int(window[0]) // 2, int(window[1]) // 2


def mean_intensity(stack: xr.Dataset, variable: str = "complex") -> xr.DataArray:
    """Mean intensity ``|z|^2`` over time per pixel, lazily; NaN where no epoch is finite.

    Examples
    --------
    >>> stack, _ = simulate_stack(shape=(8, 8), n_epochs=4)
    >>> mean_intensity(stack).dims
    ('azimuth', 'range')
    """
    if variable not in stack or not {"azimuth", "range", "time"} <= set(stack[variable].dims):
        raise KeyError(f"stack[{variable!r}]: expected a complex variable with dims (azimuth, "
                       f"range, time), found {sorted(map(str, stack.data_vars))}")
    intensity = abs(stack[variable]) ** 2
    return intensity.mean("time", skipna=True).astype(np.float32).rename("mean_intensity")


def _fitted_epochs(counts: np.ndarray) -> np.float64:
    """The ``n`` of F(2n, 2n) whose ``|log|`` has the pairs' ``CALIBRATION_QUANTILE``."""
    from scipy.optimize import brentq
    from scipy.stats import f as f_distribution

    cumulative = np.cumsum(counts)
    if cumulative[-1] == 0:
        raise ValueError("select_shp: expected pixel pairs with a finite, positive mean "
                         "intensity to calibrate the SHP test, found none")
    index = int(np.searchsorted(cumulative, CALIBRATION_QUANTILE * cumulative[-1]))
    observed = _RATIO_BINS[min(index + 1, len(_RATIO_BINS) - 1)]
    level = 0.5 + CALIBRATION_QUANTILE / 2.0  # |log F| symmetric: its q-quantile is F's 1/2 + q/2

    def excess(n: float) -> float:
        return float(np.log(f_distribution.ppf(level, 2.0 * n, 2.0 * n))) - observed

    low, high = 0.05, 1e6
    if excess(high) >= 0:
        return np.float64(high)
    if excess(low) <= 0:
        return np.float64(low)
    return np.float64(brentq(excess, low, high, xtol=1e-3))


def _threshold_of(n_samples, alpha: float) -> np.float64:
    return np.float64(glrt_threshold(alpha, float(n_samples)))


def shp_threshold(mean: xr.DataArray, *, alpha: float = DEFAULT_ALPHA,
                  calibration: str | float = "neighbours",
                  n_epochs: int | None = None) -> tuple[da.Array, da.Array]:
    """The bound on ``|log(m_p / m_q)|`` under which two pixels are homogeneous, and the
    independent epochs ``n`` it assumes behind each mean intensity, as lazy scalars.

    The threshold is the GLRT's, ``log F_{1 - alpha/2}(2n, 2n)``
    (:func:`depsi.kernels.phase_linking.glrt_threshold`); what differs is ``n``.
    ``"epochs"``: ``n_epochs``, exact for speckle independent in time. But a coherent pixel
    keeps its speckle: 30 epochs of the default coherence model are worth about 9 independent
    ones (:func:`depsi.kernels.phase_linking.effective_samples`), and the textbook threshold
    then rejects a quarter of the homogeneous pixels instead of ``alpha``. ``"neighbours"``
    (default): ``n`` fitted so that F(2n, 2n) has the ``CALIBRATION_QUANTILE`` of the statistic
    over the scene's pixel pairs ``CALIBRATION_LAG`` apart (along azimuth and along range), most
    of which are homogeneous: the equivalent number of independent epochs estimated from the
    scene, whatever the temporal correlation. Heterogeneous pairs (region edges, PS) among them
    lower ``n``: the test gets more conservative (fewer false alarms, less power) as long as
    they are under a tenth of the pairs. A number: ``n`` itself.
    """
    if isinstance(calibration, str) and calibration not in CALIBRATIONS:
        raise ValueError(f"calibration: expected one of {CALIBRATIONS} or a number of "
                         f"independent epochs, found {calibration!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: expected a false-alarm rate in (0, 1), found {alpha!r}")
    if calibration == "epochs" or not isinstance(calibration, str):
        if calibration != "epochs":
            n = float(calibration)
        elif n_epochs is None:
            raise ValueError("shp_threshold: calibration 'epochs' needs n_epochs")
        else:
            n = float(n_epochs)
        return da.from_array(np.float64(glrt_threshold(alpha, n))), da.from_array(np.float64(n))
    log_mean = da.log(da.maximum(mean.data, 0).astype(np.float64))
    lag = CALIBRATION_LAG
    pairs = [da.abs(log_mean[lag:] - log_mean[:-lag]).ravel(),
             da.abs(log_mean[:, lag:] - log_mean[:, :-lag]).ravel()]
    ratios = da.concatenate(pairs)
    ratios = da.where(da.isfinite(ratios), ratios, -1.0)  # no pixel: outside every bin
    counts, _ = da.histogram(ratios, bins=_RATIO_BINS)
    n = counts.map_blocks(_fitted_epochs, dtype=np.float64, drop_axis=0, chunks=())
    return n.map_blocks(_threshold_of, alpha, dtype=np.float64), n


def _shp_block(mean, threshold, *, window):
    """SHP mask of a padded block (zeros in its halo, trimmed afterwards)."""
    half_az, half_rg = _half(window)
    n_cells = int(window[0]) * int(window[1])
    out = np.zeros((*mean.shape, n_cells), bool)
    if mean.shape[0] > 2 * half_az and mean.shape[1] > 2 * half_rg:
        inner = shp_glrt(mean, window, threshold=float(threshold))
        out[half_az:mean.shape[0] - half_az, half_rg:mean.shape[1] - half_rg] = inner
    return out


def _padded(array: da.Array, half: tuple[int, int], fill) -> da.Array:
    depth = {0: half[0], 1: half[1]} | {axis: 0 for axis in range(2, array.ndim)}
    boundary = {0: fill, 1: fill} | {axis: "none" for axis in range(2, array.ndim)}
    return da.overlap.overlap(array, depth=depth, boundary=boundary)


def _trimmed(array: da.Array, half: tuple[int, int]) -> da.Array:
    boundary = {0: "constant", 1: "constant"} | {axis: "none" for axis in range(2, array.ndim)}
    return da.overlap.trim_internal(array, {0: half[0], 1: half[1]}, boundary=boundary)


def select_shp(
    stack: xr.Dataset,
    *,
    window: tuple[int, int] = DEFAULT_WINDOW,
    alpha: float = DEFAULT_ALPHA,
    min_looks: int = DEFAULT_MIN_LOOKS,
    calibration: str | float = "neighbours",
    variable: str = "complex",
) -> xr.Dataset:
    """Statistically homogeneous pixels of every pixel in its window, and the DS candidates.

    The test is the generalised likelihood-ratio test (GLRT) of equal power of two circular
    Gaussian pixels, whose statistic is ``|log(m_p / m_q)|`` of their mean intensities (see
    :func:`depsi.kernels.phase_linking.glrt_threshold`). Chosen over Kolmogorov-Smirnov and
    Anderson-Darling because (1) under the circular Gaussian model of a DS the mean intensity
    is a sufficient statistic of the power, so the GLRT uses all the information the amplitudes
    hold about it, where KS and AD spend part of their samples on the shape of a distribution
    known to be Rayleigh; (2) its null distribution is known exactly (F) for any number of
    epochs, where KS's two-sample critical values are asymptotic and coarse at 30 epochs;
    (3) it needs one mean per pixel: the halo carries a 2-D raster, each pixel-neighbour pair
    costs one subtraction, with no sorting and no ``(pixels, cells, epochs)`` temporaries.
    What it gives up: it tests the power only, so two pixels of equal mean intensity but a
    different texture pass. The threshold is calibrated as :func:`shp_threshold` says.

    Parameters
    ----------
    stack
        Raster stack with ``variable`` (complex) of dims ``(azimuth, range, time)``.
    window
        ``(n_azimuth, n_range)`` of the search window, odd sizes.
    alpha
        The test's false-alarm rate: the share of truly homogeneous neighbours rejected.
    min_looks
        SHP (the pixel itself included) a DS candidate needs.
    calibration
        How the threshold is set: ``"neighbours"`` (default), ``"epochs"`` or a number of
        independent epochs (:func:`shp_threshold`).
    variable
        The complex variable.

    Returns
    -------
    xarray.Dataset
        Lazy: ``shp`` (bool, ``(azimuth, range, shp_cell)``: which cells of the window are
        homogeneous with the pixel, the pixel itself included, cells outside the scene False),
        ``shp_count`` (int16, looks per pixel), ``ds_candidate`` (bool, ``shp_count >=
        min_looks``), ``shp_threshold`` (the bound on ``|log(m_p / m_q)|``),
        ``shp_effective_epochs`` (the ``n`` of :func:`shp_threshold`); coordinates
        ``shp_azimuth_offset``, ``shp_range_offset`` on ``shp_cell``; the parameters in attrs.

    Examples
    --------
    >>> from depsi.simulate.ds import simulate_ds_stack
    >>> stack, truth = simulate_ds_stack(shape=(24, 24), n_epochs=10)
    >>> shp = select_shp(stack, window=(5, 5), min_looks=10)
    >>> shp["shp"].shape, int(shp["shp_count"].max()) <= 25
    ((24, 24, 25), True)
    """
    if int(min_looks) < 2:
        raise ValueError(f"min_looks: expected >= 2 looks, found {min_looks!r}")
    half = _half(window)
    mean = mean_intensity(stack, variable)
    threshold, n_samples = shp_threshold(mean, alpha=alpha, calibration=calibration,
                                         n_epochs=stack.sizes["time"])
    data = mean.data if isinstance(mean.data, da.Array) else da.from_array(mean.data)
    padded = _padded(data, half, np.nan)
    n_cells = int(window[0]) * int(window[1])
    mask = da.apply_gufunc(_shp_block, "(),()->(c)", padded, threshold, window=tuple(window),
                           output_dtypes=bool, output_sizes={"c": n_cells}, vectorize=False)
    mask = _trimmed(mask, half)
    count = mask.sum(axis=-1, dtype=np.int16)
    offsets = window_offsets(window)
    coords: dict[str, Any] = {name: stack[name] for name in ("azimuth", "range")
                              if name in stack.coords}
    coords |= {"shp_azimuth_offset": ("shp_cell", offsets[:, 0]),
               "shp_range_offset": ("shp_cell", offsets[:, 1])}
    return xr.Dataset(
        {"shp": (("azimuth", "range", "shp_cell"), mask),
         "shp_count": (("azimuth", "range"), count, {"units": "1",
                                                      "long_name": "SHP (looks) per pixel"}),
         "ds_candidate": (("azimuth", "range"), count >= int(min_looks)),
         "shp_threshold": ((), threshold, {"long_name": "bound on |log intensity ratio|"}),
         "shp_effective_epochs": ((), n_samples, {
             "long_name": "independent epochs behind a mean intensity, as the test assumes"})},
        coords=coords,
        attrs={"shp_test": "glrt", "window": list(window), "alpha": float(alpha),
               "min_looks": int(min_looks), "calibration": str(calibration)})


def _screened(slc, shp, *, window, min_looks, prescreen_sigmas):
    """The pre-screen of a padded block: which pixels are worth linking (enough SHP, and, with
    ``prescreen_sigmas``, a short-lag coherence above the noise's), and that coherence."""
    half_az, half_rg = _half(window)
    n_az, n_rg, n_epochs = slc.shape
    inner = (slice(half_az, n_az - half_az), slice(half_rg, n_rg - half_rg))
    looks = shp[inner].sum(axis=-1)
    keep = np.zeros((n_az, n_rg), bool)
    proxy = np.full((n_az, n_rg), np.nan, np.float32)
    keep[inner] = looks >= min_looks
    if prescreen_sigmas is not None and keep.any():
        proxy[inner] = np.where(keep[inner], short_lag_coherence(slc, shp[inner], window), np.nan)
        bound = short_lag_noise_threshold(looks, n_epochs, prescreen_sigmas)
        keep[inner] &= proxy[inner] > bound
    return keep, proxy


def _ministack_edges(n_epochs: int, ministack: int) -> list[tuple[int, int]]:
    """The epochs ``[start, stop)`` of each mini-stack: ``ministack`` each, the last the rest."""
    return [(k, min(k + ministack, n_epochs)) for k in range(0, n_epochs, ministack)]


def _link_sequential(slc, rows, cols, weights, *, window, ministack, max_compressed, method,
                     weight_shrinkage, magnitudes, bias_correction):
    """Sequential phase linking of a batch of pixels, mini-stack by mini-stack: the looks of
    one mini-stack (two for the temporal coherence's tiles) and ``(K + M)^2`` matrices at a
    time, never ``T`` epochs of looks or a ``T x T`` matrix. Returns the linked phase, its
    temporal coherence over every pair of epochs, the mean eigenvalue, the phase std, the SHP
    intensity and the compressed SLCs a later mini-stack continues from."""
    xp = array_namespace(slc)
    n_epochs = slc.shape[-1]
    edges = _ministack_edges(n_epochs, ministack)

    weights = xp.asarray(weights).astype(slc.real.dtype)

    def looks_of(start, stop):
        return gather_neighbours(slc[..., start:stop], rows, cols, window)

    compressed, pieces = None, []
    eigenvalues, variance, power, n_looks, diagonal = 0.0, 0.0, 0.0, None, 0
    for start, stop in edges:
        looks = looks_of(start, stop)
        n_old = 0 if compressed is None else compressed.shape[-1]
        new, compressed, gamma, n_looks, eigenvalue = link_ministack(
            looks, compressed, weights, method=method, weight_shrinkage=weight_shrinkage,
            magnitudes=magnitudes, bias_correction=bias_correction, return_coherence=True,
            max_compressed=max_compressed)
        pieces.append(new)
        eigenvalues = eigenvalues + eigenvalue / len(edges)
        # the bound of the mini-stack's problem (its first compressed SLC fixed): the quality
        # figure of its new epochs
        variance = variance + cramer_rao_bound(gamma, n_looks, reference=0)[:, n_old:].sum(-1)
        intensity = ((abs(looks) ** 2) * weights[..., None]).sum(axis=1)  # (pixels, M)
        power = power + intensity.sum(axis=-1)
        diagonal = diagonal + (intensity > 0).sum(axis=-1)  # the epochs with a phase
    phase = xp.concatenate(pieces, axis=-1)
    total = 0.0
    for a, (start_a, stop_a) in enumerate(edges):
        looks_a = looks_of(start_a, stop_a)
        for start_b, stop_b in edges[a:]:
            looks_b = looks_a if start_b == start_a else looks_of(start_b, stop_b)
            tile = temporal_coherence_tile(looks_a, looks_b, phase[:, start_a:stop_a],
                                           phase[:, start_b:stop_b], weights)
            total = total + (tile if start_b == start_a else 2.0 * tile)
    coherence = (total - diagonal) / (n_epochs * (n_epochs - 1))
    return (phase, coherence.astype(phase.dtype), eigenvalues, variance / (n_epochs - 1),
            power / (n_looks * n_epochs), compressed)


#: ``max_compressed="auto"``: the first compressed SLC and enough of the latest to summarise
#: about this many epochs. What a cap costs is the history it drops, not the count: at 120
#: epochs, three compressed SLCs cost 0.9 % of phase RMSE with mini-stacks of 15 and 8 % with
#: mini-stacks of 5 (400 pixels of 50 looks, docs/steps/distributed.md).
COMPRESSED_HISTORY = 45


def resolve_max_compressed(max_compressed, ministack: int | None) -> int | None:
    """``max_compressed`` as a count: ``"auto"`` is ``ceil(COMPRESSED_HISTORY / ministack)``,
    at least 2 (3 for mini-stacks of 15, 9 for 5); None without mini-stacks.

    Examples
    --------
    >>> [resolve_max_compressed("auto", m) for m in (5, 10, 15, 50)]
    [9, 5, 3, 2]
    >>> resolve_max_compressed(4, 15), resolve_max_compressed("auto", None)
    (4, None)
    """
    if max_compressed == "auto":
        return None if ministack is None else max(2, -(-COMPRESSED_HISTORY // int(ministack)))
    return max_compressed


def n_compressed(n_epochs: int, ministack: int, max_compressed: int | None) -> int:
    """How many compressed SLCs a stack of ``n_epochs`` leaves for its next mini-stack.

    Examples
    --------
    >>> n_compressed(120, 15, 3), n_compressed(120, 15, None), n_compressed(10, 15, 3)
    (3, 8, 1)
    """
    count = len(_ministack_edges(n_epochs, ministack))
    return count if max_compressed is None else min(count, int(max_compressed))


def _link_block(slc, shp, *, window, min_looks, method, reference, shrinkage, weight_shrinkage,
                magnitudes, bias_correction, device, prescreen_sigmas, ministack,
                max_compressed):
    """Phase linking of every DS candidate of a padded block that passes the pre-screen, all
    epochs at once or mini-stack by mini-stack; NumPy in, NumPy out. With ``ministack``, also
    the compressed SLCs ``(n_az, n_rg, n_cells, K)`` a later mini-stack continues from (zero
    off the linked pixels)."""
    half_az, half_rg = _half(window)
    n_az, n_rg, n_epochs = slc.shape
    n_cells = shp.shape[-1]
    phase = np.full(slc.shape, np.nan, np.float32)
    outputs = [np.full((n_az, n_rg), np.nan, np.float32) for _ in range(4)]
    keep, proxy = _screened(slc, shp, window=window, min_looks=min_looks,
                            prescreen_sigmas=prescreen_sigmas)
    outputs.append(proxy)
    if ministack is not None:
        outputs.append(np.zeros((n_az, n_rg, n_cells,
                                 n_compressed(n_epochs, ministack, max_compressed)),
                                np.result_type(slc.dtype, np.complex64)))
    rows, cols = np.nonzero(keep)
    if rows.size == 0:
        return (phase, *outputs)
    sequential = ministack is not None and ministack < n_epochs
    if sequential:  # two mini-stacks of looks, the compressed SLCs, a (K + M)^2 problem
        width = ministack + n_compressed(n_epochs, ministack, max_compressed)
        per_pixel = phase_linking_bytes_per_pixel(width, n_cells) + 16 * n_epochs
    else:
        per_pixel = phase_linking_bytes_per_pixel(n_epochs, n_cells)
    step = batch_size(per_pixel, device, max_items=rows.size)
    if device is None or parse_device(device).kind == "cpu":
        # on the CPU a larger batch is no faster (the eigensolver works pixel by pixel): the
        # memory stays bounded whatever is free
        step = max(1, min(step, CPU_BATCH_BYTES // per_pixel))
    with use_device(device):
        slc_device = to_device(np.ascontiguousarray(slc), device)
        for start in range(0, rows.size, step):
            r, c = rows[start:start + step], cols[start:start + step]
            if sequential:
                results = _link_sequential(
                    slc_device, r - half_az, c - half_rg, to_device(shp[r, c], device),
                    window=window, ministack=ministack, max_compressed=max_compressed,
                    method=method, weight_shrinkage=weight_shrinkage,
                    magnitudes=magnitudes, bias_correction=bias_correction)
                phase[r, c] = to_host(results[0])
                for index, value in zip((0, 1, 2, 3), results[1:5]):
                    value = to_host(value)
                    outputs[index][r, c] = np.sqrt(np.where(value > 0, value, np.nan)) \
                        if index == 2 else value
                outputs[5][r, c] = to_host(results[5])
                continue
            looks = gather_neighbours(slc_device, r - half_az, c - half_rg, window)
            weights = to_device(shp[r, c], device)
            gamma, n_looks = sample_coherence(looks, weights, bias_correction=bias_correction)
            power = (abs(looks) ** 2).mean(axis=-1)
            outputs[3][r, c] = to_host((power * weights).sum(axis=1) / n_looks)
            if shrinkage:
                gamma = shrink(gamma, shrinkage)
            linked, eigenvalue = link_phases(gamma, method=method, reference=reference,
                                             weight_shrinkage=weight_shrinkage,
                                             magnitudes=magnitudes)
            crb = cramer_rao_bound(gamma, n_looks, reference=reference)
            phase[r, c] = to_host(linked)
            outputs[0][r, c] = to_host(temporal_coherence(gamma, linked))
            outputs[1][r, c] = to_host(eigenvalue)
            variance = to_host(crb).mean(axis=-1) * n_epochs / (n_epochs - 1)
            # |G| not positive definite (few looks): no bound, no quality figure
            outputs[2][r, c] = np.sqrt(np.where(variance > 0, variance, np.nan))
            if ministack is not None:  # one mini-stack (ministack >= T): its compressed SLC
                outputs[5][r, c, :, 0] = to_host(compress(looks, linked))
    return (phase, *outputs)


def check_ministack(ministack, *, reference: int = 0, shrinkage: float = 0.0,
                    max_compressed: int | str | None = None) -> None:
    """A ValueError unless ``ministack`` is None or at least 2 epochs, with the sequential
    estimator's datum (``reference`` 0) and no ``shrinkage``, and ``max_compressed`` None,
    ``"auto"`` or at least 1."""
    if isinstance(max_compressed, str):
        if max_compressed != "auto":
            raise ValueError(f"max_compressed: expected at least 1 compressed SLC, 'auto' or "
                             f"None, found {max_compressed!r}")
    elif max_compressed is not None and (isinstance(max_compressed, bool)
                                       or int(max_compressed) != max_compressed
                                       or int(max_compressed) < 1):
        raise ValueError(f"max_compressed: expected at least 1 compressed SLC, 'auto' or "
                         f"None, found {max_compressed!r}")
    if ministack is None:
        return
    if isinstance(ministack, bool) or int(ministack) != ministack or int(ministack) < 2:
        raise ValueError(f"ministack: expected at least 2 epochs a mini-stack or None, found "
                         f"{ministack!r}")
    if reference != 0 or shrinkage:
        raise ValueError(f"ministack: expected reference 0 and no shrinkage (the sequential "
                         f"estimator's datum is the first epoch), found reference {reference!r},"
                         f" shrinkage {shrinkage!r}")


def phase_linking(
    stack: xr.Dataset,
    shp: xr.Dataset,
    *,
    method: str = "emi",
    reference: int = 0,
    shrinkage: float = 0.0,
    weight_shrinkage: float = DEFAULT_WEIGHT_SHRINKAGE,
    magnitudes: str = DEFAULT_MAGNITUDES,
    bias_correction: bool = False,
    prescreen_sigmas: float | None = None,
    ministack: int | None = None,
    max_compressed: int | str | None = None,
    device: str | None = None,
    variable: str = "complex",
) -> xr.Dataset:
    """Phase history of every DS candidate from its coherence matrix over its SHP.

    With ``ministack``, each batch of pixels is linked mini-stack by mini-stack
    (:func:`depsi.kernels.phase_linking.link_ministack`, the sequential estimator of Ansari,
    De Zan and Bamler 2017): ``ministack`` epochs beside the compressed SLCs of the earlier
    ones, so the looks held and the matrices solved are those of one mini-stack, not of every
    epoch. With ``max_compressed`` a mini-stack carries at most that many compressed SLCs
    (the first and the latest, :func:`depsi.kernels.phase_linking.kept_compressed`), so its
    matrices stop growing with the epochs. The temporal coherence is the full one (every pair
    of epochs, against the sample coherence phases), summed tile by tile; ``phase_std`` is
    each mini-stack's bound with its first compressed SLC fixed, and ``eigenvalue`` the mean
    over the mini-stacks.

    With ``prescreen_sigmas``, a candidate is linked only when its short-lag coherence (the mean
    magnitude of its SHP-averaged interferograms of consecutive epochs,
    :func:`depsi.kernels.phase_linking.short_lag_coherence`, ``O(T looks)``) is above what
    pixels with no coherence at all reach (their mean plus ``prescreen_sigmas`` standard
    deviations, :func:`depsi.kernels.phase_linking.short_lag_noise_threshold`): the
    ``O(T^2 looks + T^3)`` coherence matrix, eigenproblem and bound are spent on the pixels that
    can be DS. It assumes that coherence does not grow with the time between epochs (a pixel
    incoherent between consecutive epochs is incoherent over longer ones), so what it can lose
    is a DS incoherent over 12 days yet coherent over longer spans; see
    docs/steps/distributed.md for the measured relation to the temporal coherence.

    Parameters
    ----------
    stack
        Raster stack with ``variable`` (complex) of dims ``(azimuth, range, time)``.
    shp
        :func:`select_shp`'s result for the same stack (its ``shp`` mask, window and
        ``min_looks``).
    method
        ``"emi"`` or ``"evd"`` (:func:`depsi.kernels.phase_linking.link_phases`).
    reference
        Epoch (index) whose linked phase is zero.
    shrinkage
        Shrink each coherence matrix toward the identity by this fraction
        (:func:`depsi.kernels.phase_linking.shrink`, Ledoit and Wolf 2004) before linking.
    weight_shrinkage
        EMI's shrinkage of the magnitudes it inverts
        (:data:`depsi.kernels.phase_linking.DEFAULT_WEIGHT_SHRINKAGE`).
    magnitudes
        EMI's magnitudes: ``"lag"`` (default), the sample magnitudes averaged over each lag,
        or ``"sample"`` (:data:`depsi.kernels.phase_linking.MAGNITUDES`).
    bias_correction
        Correct the coherence magnitudes for the sample coherence's bias
        (:func:`depsi.kernels.phase_linking.sample_coherence`).
    prescreen_sigmas
        The pre-screen's margin over the noise, in standard deviations of the short-lag
        coherence at zero coherence; None (default): every candidate is linked.
    ministack
        Epochs a mini-stack; None (default): all epochs at once. Only with ``reference`` 0
        and no ``shrinkage``.
    max_compressed
        With ``ministack``: the compressed SLCs a mini-stack is linked beside, at most;
        ``"auto"``: :func:`resolve_max_compressed`; None (default): all of the earlier
        mini-stacks'.
    device
        Where the kernels run (``"cpu"``, ``"cuda:0"``, ...); default the CPU. Blocks move to
        the device and back once each.
    variable
        The complex variable.

    Returns
    -------
    xarray.Dataset
        Lazy, NaN off the DS candidates: ``phase`` (float32, rad, ``(azimuth, range, time)``,
        wrapped, zero at ``reference``), ``temporal_coherence`` (of the linked phase against
        the sample coherence phases, Ferretti et al. 2011), ``eigenvalue`` (EMI's smallest or
        EVD's largest over ``T``), ``phase_std`` (rad: the Cramér-Rao bound of the phase at the
        estimated coherence magnitudes and SHP count, root mean over the epochs other than the
        reference: the pixel's quality figure, optimistic where the magnitudes are biased
        high), ``shp_intensity`` (the mean intensity ``|z|^2`` of the SHP over every epoch:
        a DS point's power), ``short_lag_coherence`` (the pre-screen's proxy; NaN off the
        candidates and without a pre-screen), ``shp_count`` and ``ds_candidate`` from ``shp``.
        A candidate the pre-screen leaves out has NaN ``phase`` and ``temporal_coherence``.
        With ``ministack`` also ``compressed`` (``(azimuth, range, shp_cell, compressed_slc)``,
        complex, zero off the linked pixels): the compressed SLCs the next mini-stack of new
        epochs is linked beside (:func:`depsi.processing.scatterers.update_ds_selection`).

    Examples
    --------
    >>> from depsi.simulate.ds import simulate_ds_stack
    >>> stack, truth = simulate_ds_stack(shape=(24, 24), n_epochs=8)
    >>> shp = select_shp(stack, window=(5, 5), min_looks=10)
    >>> linked = phase_linking(stack, shp)
    >>> linked["phase"].dims, linked["phase"].dtype
    (('azimuth', 'range', 'time'), dtype('float32'))
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, found {method!r}")
    if magnitudes not in MAGNITUDES:
        raise ValueError(f"magnitudes: expected one of {MAGNITUDES}, found {magnitudes!r}")
    if prescreen_sigmas is not None and not float(prescreen_sigmas) >= 0:
        raise ValueError(f"prescreen_sigmas: expected >= 0 standard deviations or None, found "
                         f"{prescreen_sigmas!r}")
    check_ministack(ministack, reference=reference, shrinkage=shrinkage,
                    max_compressed=max_compressed)
    max_compressed = resolve_max_compressed(max_compressed, ministack)
    window = tuple(int(w) for w in shp.attrs["window"])
    half = _half(window)
    data = stack[variable].transpose("azimuth", "range", "time").data
    if not isinstance(data, da.Array):
        data = da.from_array(data, chunks=(64, 64, -1))
    data = data.rechunk({2: -1})
    mask = shp["shp"].data
    if not isinstance(mask, da.Array):
        mask = da.from_array(mask)
    mask = mask.rechunk((data.chunks[0], data.chunks[1], -1))
    padded_slc = _padded(data, half, 0)
    padded_mask = _padded(mask, half, False)
    signature = "(t),(c)->(t),(),(),(),(),()"
    meta: tuple[np.ndarray, ...] = ((np.empty((0, 0, 0), np.float32),)
                                    + (np.empty((0, 0), np.float32),) * 5)
    output_sizes = {}
    if ministack is not None:  # and the compressed SLCs of every linked pixel
        signature += ",(c,k)"
        meta += (np.empty((0, 0, 0, 0), np.complex64),)
        output_sizes = {"k": n_compressed(data.shape[2], int(ministack), max_compressed)}
    results = da.apply_gufunc(
        _link_block, signature, padded_slc, padded_mask, output_sizes=output_sizes,
        window=window, min_looks=int(shp.attrs["min_looks"]), method=method,
        reference=int(reference), shrinkage=float(shrinkage),
        weight_shrinkage=float(weight_shrinkage), magnitudes=str(magnitudes),
        bias_correction=bool(bias_correction), device=parse_device(device or "cpu"),
        prescreen_sigmas=None if prescreen_sigmas is None else float(prescreen_sigmas),
        ministack=None if ministack is None else int(ministack),
        max_compressed=None if max_compressed is None else int(max_compressed), vectorize=False,
        meta=meta)
    phase, coherence, eigenvalue, phase_std, intensity, proxy, *state = (_trimmed(r, half)
                                                                         for r in results)
    dims2 = ("azimuth", "range")
    coords = {name: stack[name] for name in ("azimuth", "range", "time") if name in stack.coords}
    return xr.Dataset(
        {"phase": (("azimuth", "range", "time"), phase, {"units": "rad"}),
         "temporal_coherence": (dims2, coherence, {"units": "1"}),
         "eigenvalue": (dims2, eigenvalue, {"units": "1"}),
         "phase_std": (dims2, phase_std, {"units": "rad"}),
         "shp_intensity": (dims2, intensity, {
             "units": "1", "long_name": "mean intensity of the SHP over the epochs"}),
         "short_lag_coherence": (dims2, proxy, {
             "units": "1", "long_name": "mean SHP coherence of consecutive epochs"}),
         "shp_count": shp["shp_count"], "ds_candidate": shp["ds_candidate"]}
        | ({} if not state else {"compressed": (
            ("azimuth", "range", "shp_cell", "compressed_slc"), state[0], {
                "long_name": "compressed SLCs a later mini-stack continues from: each look "
                             "projected on the pixel's linked phase of one mini-stack"})}),
        coords=coords,
        attrs={"phase_linking": method, "reference_time": str(stack["time"].values[reference]),
               "shrinkage": float(shrinkage), "weight_shrinkage": float(weight_shrinkage),
               "magnitudes": str(magnitudes),
               "bias_correction": int(bias_correction), "window": list(window)}
        | ({} if prescreen_sigmas is None else {"prescreen_sigmas": float(prescreen_sigmas)})
        | ({} if ministack is None else {"ministack": int(ministack)})
        | ({} if ministack is None or max_compressed is None
           else {"max_compressed": int(max_compressed)}))
