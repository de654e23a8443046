"""Per-point passes over ``(points, epochs)`` series in one compiled loop each (Numba), with no
temporary of the series' size.

- :func:`gaussian_mean`: each target's Gaussian-weighted mean of its neighbours' rows, the
  screen of the atmosphere's ``"gaussian"`` method
  (:func:`depsi.processing.atmosphere.gaussian_mean`). NumPy gathers the neighbours' rows
  into a ``(targets, k, epochs)`` array and contracts it with a batched GEMV; here each
  neighbour's row is read once from the sources and added into the target's row. The weights
  and the sum are float64 (NumPy's GEMV runs in the values' precision, float32 for the
  screen), so the result differs from NumPy's by NumPy's own rounding: at most
  :func:`gaussian_error` ``* sum_j w_j |v_j|``.
- :func:`moved`: a float32 series plus ``scale * h2ph * field``
  (:func:`depsi.processing.correlated_height._moved_block`), NumPy's float64 operations in its
  order, so its result to the bit, without its three float64 ``(points, epochs)`` temporaries.
- :func:`displacement_std`: each point's displacement standard deviation per epoch
  (:func:`depsi.processing.model_fit._displacement_std_block`), likewise to the bit.
- :func:`leak_gain_sqrt`: the square root of each point's height-leak gain
  (:func:`depsi.processing.correlated_height.height_leak_gain`) from its baselines in one pass
  of float64 sums, without NumPy's float64 ``(points, epochs)`` copies; its sums run in another
  order than NumPy's pairwise ones, so within :func:`leak_gain_error` of NumPy's.
"""

from __future__ import annotations

import numpy as np

from depsi.kernels import numba_support
from depsi.kernels.numba_support import jit_cached, numba, sample_array

#: Whether the compiled kernels can run in this process.
AVAILABLE = numba is not None


def gaussian_error(k: int, u: float) -> float:
    """The bound on ``|gaussian_mean - NumPy's|`` relative to ``sum_j w_j |v_j|``, for ``k``
    neighbours and the values' unit roundoff ``u`` (2^-24 for float32, 2^-53 for float64).

    NumPy rounds each weight to the values' precision (``u``) and sums ``k`` products in it
    (``u`` for each product, ``(k - 1) u`` for the additions): ``(k + 1) u`` to first order;
    this kernel rounds its float64 sum once into the values' precision (at most ``u`` times
    ``|result| <= sum_j w_j |v_j|``), after at most ``2 k + 8`` float64 roundings of its
    weights, normalisation and sum."""
    return (k + 2) * u + (2 * k + 8) * 2.0 ** -53


def _gaussian_mean(dist, idx, values, length_scale, out):
    """``out[i]``: the mean of the rows ``values[idx[i]]`` weighted by
    ``exp(-(dist[i] / length_scale)^2 / 2) + 1e-12``, normalised per target (float64 weights
    and sums, rounded once into ``out``'s precision)."""
    n, k = idx.shape
    n_epochs = values.shape[1]
    weight = np.empty(k)
    total = np.empty(n_epochs)
    for i in range(n):
        norm = 0.0
        for j in range(k):
            w = np.exp(-0.5 * (dist[i, j] / length_scale) ** 2) + 1e-12
            weight[j] = w
            norm += w
        for t in range(n_epochs):
            total[t] = 0.0
        for j in range(k):
            w = weight[j] / norm
            row = idx[i, j]
            for t in range(n_epochs):
                total[t] += w * np.float64(values[row, t])
        for t in range(n_epochs):
            out[i, t] = total[t]


def _moved(series, h2ph, field, scale, out):
    """``out = float32(series + (scale * h2ph) * field[:, None])`` in float64, NumPy's order;
    ``h2ph`` ``(n, 1)`` (per point) or ``(n, T)``."""
    n, n_epochs = series.shape
    per_epoch = h2ph.shape[1] != 1
    for i in range(n):
        f = field[i]
        for t in range(n_epochs):
            h = np.float64(h2ph[i, t if per_epoch else 0])
            out[i, t] = np.float32(np.float64(series[i, t]) + (scale * h) * f)


def _displacement_std(h2ph, corrected_var, height_std, share, out):
    """``out[i, t] = float32(sqrt(var_i share_t + ((h2ph[i, t] - h2ph[i, 0]) s_i)^2))``,
    zero at the first epoch; ``share`` the epochs' shares plus the first's."""
    n, n_epochs = out.shape
    per_epoch = h2ph.shape[1] != 1
    for i in range(n):
        first = np.float64(h2ph[i, 0])
        out[i, 0] = 0.0
        for t in range(1, n_epochs):
            d = (np.float64(h2ph[i, t if per_epoch else 0]) - first) * height_std[i]
            out[i, t] = np.float32(np.sqrt(corrected_var[i] * share[t] + d * d))


def _leak_gain_sqrt(h2ph, t, tt, m2ph, out):
    """``out[i]``: ``sqrt(1 / (m2ph^2 u_i))`` with ``u_i = |h_i|^2 - (h_i . t)^2 / tt`` of
    the point's centred baselines ``h_i``; NaN where ``u_i <= 1e-12 |h2ph_i|^2`` (time and
    baselines indistinguishable) or a baseline is NaN; ``t`` the centred years."""
    n, n_epochs = h2ph.shape[0], t.shape[0]
    per_epoch = h2ph.shape[1] != 1
    for i in range(n):
        total = 0.0
        for e in range(n_epochs):
            total += np.float64(h2ph[i, e if per_epoch else 0])
        mean = total / n_epochs
        unexplained = 0.0
        along = 0.0
        scale = 0.0
        for e in range(n_epochs):
            value = np.float64(h2ph[i, e if per_epoch else 0])
            centred = value - mean
            unexplained += centred * centred
            along += centred * t[e]
            scale += value * value
        if tt > 0:
            unexplained -= along * along / tt
        if unexplained > 1e-12 * scale:
            gain = 1.0 / (m2ph * m2ph * unexplained)
            out[i] = np.sqrt(gain) if gain >= 0 else 0.0
        else:
            out[i] = np.nan


if AVAILABLE:
    # NumPy's division and square root (x / 0 is inf or NaN, sqrt(-x) NaN), no exceptions
    _gaussian_mean = jit_cached(error_model="numpy")(_gaussian_mean)
    _moved = jit_cached(error_model="numpy")(_moved)
    _displacement_std = jit_cached(error_model="numpy")(_displacement_std)
    _leak_gain_sqrt = jit_cached(error_model="numpy")(_leak_gain_sqrt)


def samples():
    """The kernels with arguments of the types their callers pass: the screen's float32
    values (float64 where a caller's are), float32 series, h2ph float32 or float64."""
    i8, f4, f8 = np.int64, np.float32, np.float64
    out = [(_gaussian_mean, (sample_array(f8, 2), sample_array(i8, 2), sample_array(dtype, 2),
                             1.0, sample_array(dtype, 2)))
           for dtype in (f4, f8)]
    for h2ph in (f4, f8):
        out.append((_moved, (sample_array(f4, 2), sample_array(h2ph, 2), sample_array(f8, 1),
                             1.0, sample_array(f4, 2))))
        out.append((_displacement_std, (sample_array(h2ph, 2), sample_array(f8, 1),
                                        sample_array(f8, 1), sample_array(f8, 1),
                                        sample_array(f4, 2))))
        out.append((_leak_gain_sqrt, (sample_array(h2ph, 2), sample_array(f8, 1), 1.0, 1.0,
                                      sample_array(f8, 1))))
    return out


def ready() -> bool:
    """Whether this module's kernels run compiled in this process
    (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


def _rows(h2ph: np.ndarray) -> np.ndarray:
    """``h2ph`` (per point, or per point and epoch) as a C-contiguous 2-D float32 or float64
    array, its own dtype where it is one of those."""
    h2ph = np.asarray(h2ph)
    dtype = h2ph.dtype if h2ph.dtype in (np.float32, np.float64) else np.float64
    return np.ascontiguousarray(h2ph.reshape(h2ph.shape[0], -1), dtype=dtype)


def gaussian_mean(dist: np.ndarray, idx: np.ndarray, values: np.ndarray,
                  length_scale: float) -> np.ndarray:
    """:func:`depsi.processing.atmosphere.gaussian_mean` compiled: for targets with
    neighbours ``idx`` ``(n, k)`` at distances ``dist`` ``(n, k)``, the Gaussian-weighted
    (sigma ``length_scale``) mean of their rows of ``values`` ``(sources, T)`` (float32 or
    float64, the result's dtype), within :func:`gaussian_error` of NumPy's.

    Examples
    --------
    >>> values = np.array([[0.0, 2.0], [4.0, 6.0]], dtype=np.float32)
    >>> gaussian_mean(np.array([[1.0, 1.0]]), np.array([[0, 1]]), values, 1.0).tolist()
    [[2.0, 4.0]]
    """
    values = np.asarray(values)
    dtype = values.dtype if values.dtype in (np.float32, np.float64) else np.float64
    values = np.ascontiguousarray(values, dtype=dtype)
    out = np.empty((idx.shape[0], values.shape[1]), dtype)
    _gaussian_mean(np.ascontiguousarray(dist, dtype=np.float64),
                   np.ascontiguousarray(idx, dtype=np.int64), values, float(length_scale), out)
    return out


def moved(series: np.ndarray, h2ph: np.ndarray, field: np.ndarray, scale: float,
          out: np.ndarray | None = None) -> np.ndarray:
    """``series + scale * h2ph * field[:, None]`` (float32 ``(n, T)``; ``h2ph`` ``(n,)`` or
    ``(n, T)``) in float64, rounded to float32, into ``out`` (C-contiguous; it may be
    ``series`` itself) when given: NumPy's result to the bit.

    Examples
    --------
    >>> series = np.zeros((1, 2), np.float32)
    >>> moved(series, np.array([[1.0, 2.0]]), np.array([0.5]), 2.0).tolist()
    [[1.0, 2.0]]
    """
    out = np.empty(series.shape, np.float32) if out is None else out
    _moved(np.ascontiguousarray(series, dtype=np.float32), _rows(h2ph),
           np.ascontiguousarray(field, dtype=np.float64), float(scale), out)
    return out


def displacement_std(h2ph: np.ndarray, corrected_var: np.ndarray, height_std: np.ndarray,
                     epoch_share: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Each point's displacement standard deviation per epoch, float32 ``(n, T)`` (zero at
    the first epoch): ``sqrt(corrected_var (share_t + share_0) + ((h2ph_t - h2ph_0)
    height_std)^2)``, NumPy's result to the bit, into ``out`` (C-contiguous) when given.

    Examples
    --------
    >>> displacement_std(np.array([[0.0, 1.0]]), np.array([1.0]), np.array([2.0]),
    ...                  np.array([0.5, 2.5])).tolist()
    [[0.0, 2.6457512378692627]]
    """
    epoch_share = np.asarray(epoch_share, dtype=np.float64)
    h2ph = _rows(h2ph)
    if out is None:
        out = np.empty((h2ph.shape[0], epoch_share.size), np.float32)
    _displacement_std(h2ph, np.ascontiguousarray(corrected_var, dtype=np.float64),
                      np.ascontiguousarray(height_std, dtype=np.float64),
                      epoch_share + epoch_share[0], out)
    return out


def leak_gain_error(n_epochs: int, conditioning: np.ndarray) -> np.ndarray:
    """The bound on ``|leak_gain_sqrt - NumPy's| / NumPy's``, for ``n_epochs`` baselines and
    each point's ``conditioning`` ``|h|^2 / u`` (its centred baselines' squared norm over the
    part of it that time leaves unexplained; 1 where time explains none of it).

    Each implementation's ``u`` is within ``(3 T + 5) 2^-53 |h|^2`` of the exact one: the sum
    of ``T`` squares within ``(T + 2)`` roundings of itself (the mean's error moves it only to
    second order, the centred baselines summing to zero), and ``(h . t)^2 / tt`` within
    ``2 (T + 2)`` roundings of ``|h| |t|`` squared over ``tt`` (Cauchy-Schwarz), that is of
    ``|h|^2``. Two such ``u`` differ by twice that, relative to ``u`` by ``conditioning``
    times it; the gain's square root halves the relative difference, and its own roundings
    (a division, a square root) add a few units."""
    return ((3 * n_epochs + 5) * np.asarray(conditioning, dtype=np.float64) + 4) * 2.0 ** -53


def leak_gain_sqrt(h2ph: np.ndarray, years: np.ndarray, m2ph: float) -> np.ndarray:
    """The square root of each point's height-leak gain
    (:func:`depsi.processing.correlated_height.height_leak_gain`; NaN where it has none),
    float64 ``(n,)``, from ``h2ph`` ``(n, T)`` (or ``(n,)``: constant baselines, no gain),
    within :func:`leak_gain_error` of NumPy's.

    Examples
    --------
    >>> years = np.linspace(-1, 1, 5)
    >>> h2ph = np.array([[1e-4, -2e-4, 0.0, 2e-4, -1e-4]])
    >>> gain = leak_gain_sqrt(h2ph, years, -226.0)
    >>> bool(np.isclose(gain[0] ** 2, 1 / (226.0 ** 2 * 1e-7)))
    True
    """
    t = np.asarray(years, dtype=np.float64) - np.mean(years)
    out = np.empty(np.shape(h2ph)[0])
    _leak_gain_sqrt(_rows(h2ph), np.ascontiguousarray(t), float(t @ t), float(m2ph), out)
    return out
