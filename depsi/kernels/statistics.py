"""Per-pixel amplitude statistics over time: moments, median and MAD, running sums, NAD/NMAD.

Pure array code on NumPy or CuPy (the namespace of the input); time is the last axis. Missing
epochs (NaN or inf) are skipped and counted. A pixel without a usable value (all missing, or a
zero mean/median amplitude) gets NaN statistics without any division ever being attempted, so no
floating-point warning is raised or silenced.

The NAD is built from running sums (count, sum, sum of squares, accumulated in float64) so that
new epochs update it without the old ones: :func:`add_sums` then :func:`moments_from_sums`.
"""

from __future__ import annotations

import numpy as np

from depsi.kernels.backend import array_namespace

#: Scale that turns the MAD of normally distributed values into their standard deviation. It is
#: *not* applied to NMAD here (sarxarray and dolphin define NMAD = MAD / median too); it is kept
#: for callers who want the robust standard deviation ``MAD_TO_STD * MAD``.
MAD_TO_STD = 1.4826


def amplitude_of(slc):
    """Amplitude (float32) of a complex SLC array, or a real amplitude array as float32."""
    xp = array_namespace(slc)
    slc = xp.asarray(slc)
    if slc.dtype.kind == "c":
        return xp.abs(slc).astype(xp.float32, copy=False)
    return slc.astype(xp.float32, copy=False)


#: Pixels per sub-block of :func:`amplitude_sums` on the CPU: its float64 temporaries (a few
#: hundred kB) stay in cache and are reused instead of allocating block-sized arrays
#: (docs/benchmarks.md, "Array operations").
SUM_BLOCK_PIXELS = 2048


def _sums_whole(xp, values) -> tuple:
    """Running sums of a whole array at once (the CuPy path)."""
    amplitude = xp.abs(values) if values.dtype.kind == "c" else values
    amplitude = xp.asarray(amplitude, dtype=xp.float64, order="C").copy()
    valid = xp.isfinite(amplitude)
    count = valid.sum(axis=-1, dtype=xp.int32)
    amplitude[~valid] = 0.0
    total = amplitude.sum(axis=-1)
    xp.square(amplitude, out=amplitude)
    return count, total, amplitude.sum(axis=-1)


def _time_pieces(values) -> list:
    """``values`` as a list of arrays that together make the last axis."""
    if isinstance(values, (list, tuple)):
        if not values:
            raise ValueError("values: expected at least one array of epochs, found none")
        return list(values)
    return [values]


def _amplitude_rows(flats: list, start: int, k: int, buffer: np.ndarray):
    """Amplitudes of rows ``start:start + k`` with every epoch: the row block of the single
    piece (``|slc|`` into ``buffer``, real values as they are), or the pieces joined in
    ``buffer`` (a few hundred kB in cache, instead of joining whole blocks in memory)."""
    if len(flats) == 1:
        part = flats[0][start:start + k]
        return np.abs(part, out=buffer[:k]) if part.dtype.kind == "c" else part
    column = 0
    for flat in flats:
        part, width = flat[start:start + k], flat.shape[1]
        target = buffer[:k, column:column + width]
        if part.dtype.kind == "c":
            np.abs(part, out=target)
        else:
            target[...] = part
        column += width
    return buffer[:k]


def _sums_of_rows(amplitude, work, count, total, total_sq, rows: slice) -> None:
    """Float64 sums of ``amplitude`` rows (each along its contiguous epochs) into ``rows``.

    Squares are never negative, so a row's sum of squares is finite exactly when all its
    amplitudes are finite (float32 squares cannot overflow float64) or its sums overflow;
    only those rare rows are summed again with their non-finite epochs set to zero and
    counted, the same arithmetic as masking every row first, without a pass over all of them.
    """
    work[...] = amplitude
    np.sum(work, axis=-1, out=total[rows])
    np.square(work, out=work)
    np.sum(work, axis=-1, out=total_sq[rows])
    if np.isfinite(total_sq[rows]).all():
        return
    bad = np.flatnonzero(~np.isfinite(total_sq[rows]))
    again = np.asarray(amplitude[bad], dtype=np.float64)
    valid = np.isfinite(again)
    at = rows.start + bad
    count[at] = valid.sum(axis=-1, dtype=np.int32)
    again[~valid] = 0.0
    total[at] = again.sum(axis=-1)
    np.square(again, out=again)
    total_sq[at] = again.sum(axis=-1)


def amplitude_sums(values) -> tuple:
    """Running sums over the last axis: count of finite amplitudes, their sum and sum of squares.

    Amplitudes are taken in the input's precision (``|slc|`` of complex64 is float32), then
    summed in float64 along the contiguous time axis of each pixel, so a pixel's sums do not
    depend on the block it was computed in, nor on how its epochs were split into pieces;
    squares of float32 values are exact in float64.

    Parameters
    ----------
    values
        Complex SLC values or real amplitudes ``(..., time)``; NaN/inf epochs are skipped. Or a
        list of such arrays (same leading shape) that together make the time axis, as a block
        read one stored time chunk at a time: the sums are those of the joined array, bit for
        bit, without joining it.

    Returns
    -------
    count, total, total_sq
        int32, float64, float64 arrays of shape ``values.shape[:-1]``.

    Examples
    --------
    >>> count, total, total_sq = amplitude_sums(np.array([[1.0, 2.0, np.nan]]))
    >>> count.tolist(), total.tolist(), total_sq.tolist()
    ([2], [3.0], [5.0])
    >>> [s.tolist() for s in amplitude_sums([np.array([[1.0]]), np.array([[2.0, np.nan]])])]
    [[2], [3.0], [5.0]]
    """
    pieces = _time_pieces(values)
    xp = array_namespace(*pieces)
    pieces = [xp.asarray(piece) for piece in pieces]
    if xp is not np:
        joined = pieces[0] if len(pieces) == 1 else xp.concatenate(pieces, axis=-1)
        return _sums_whole(xp, joined)
    lead = pieces[0].shape[:-1]
    if any(piece.shape[:-1] != lead for piece in pieces):
        raise ValueError(f"values: expected pieces of one leading shape, found "
                         f"{[piece.shape for piece in pieces]}")
    flats = [piece.reshape(-1, piece.shape[-1]) for piece in pieces]
    n, n_time = flats[0].shape[0], sum(flat.shape[1] for flat in flats)
    count = np.full(n, n_time, dtype=np.int32)
    total, total_sq = np.empty(n), np.empty(n)
    rows = min(SUM_BLOCK_PIXELS, max(n, 1))
    amplitude_dtype = np.result_type(*(np.abs(np.zeros(0, p.dtype)).dtype for p in pieces))
    amplitude_buffer = np.empty((rows, n_time), amplitude_dtype)
    buffer = np.empty((rows, n_time), np.float64)
    for start in range(0, n, rows):
        k = min(rows, n - start)
        amplitude = _amplitude_rows(flats, start, k, amplitude_buffer)
        _sums_of_rows(amplitude, buffer[:k], count, total, total_sq, slice(start, start + k))
    return count.reshape(lead), total.reshape(lead), total_sq.reshape(lead)


#: Smallest float32 sums of amplitudes (and of their squares) the NAD screen trusts: far above
#: the subnormal range, where rounding is no longer relative. Smaller sums are left to the exact
#: computation.
_SCREEN_FLOOR = 1e-20

#: Relative margin on the threshold by which the screen's NAD must exceed it: covers the exact
#: computation's own float64 rounding and its float32 result (1e-7) many times over.
_SCREEN_MARGIN = 1e-6


def _float32_sums(pieces: list, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Float32 sums of the amplitudes and of their squares per pixel, in any order (einsum)."""
    flats = [piece.reshape(-1, piece.shape[-1]) for piece in pieces]
    n = flats[0].shape[0]
    total, total_sq = np.zeros(n, np.float32), np.zeros(n, np.float32)
    buffer = np.empty((min(rows, max(n, 1)), max(flat.shape[1] for flat in flats)), np.float32)
    for start in range(0, n, buffer.shape[0]):
        k = min(buffer.shape[0], n - start)
        for flat in flats:
            part = flat[start:start + k]
            amplitude = buffer[:k, :part.shape[1]]
            if part.dtype.kind == "c":
                np.abs(part, out=amplitude)
            else:
                amplitude[...] = part
            total[start:start + k] += np.einsum("ij->i", amplitude)
            total_sq[start:start + k] += np.einsum("ij,ij->i", amplitude, amplitude)
    return total, total_sq


def nad_screen(values, threshold: float, *, compiled: bool = True):
    """Pixels whose NAD may be below ``threshold`` or is undefined; every other pixel's NAD, as
    :func:`moments_from_sums` computes it from :func:`amplitude_sums`, is certainly not below.

    A float32 pass (less than half the cost of the exact sums) screens out the pixels that are
    clearly rejected, so that the exact float64 sums are only needed for the few others.
    Any order of summing ``n`` non-negative float32 terms (products included) errs by at most
    ``g = n u / (1 - n u)`` relatively (u = 2**-24), so ``n S2 / S1**2 = 1 + NAD**2`` is known
    to ``(1 - g)**2 / (1 + g) > 1 - 4 g``; a pixel is screened out only when even that lower
    bound puts its NAD above the threshold by :data:`_SCREEN_MARGIN`. Pixels with a missing
    epoch, a zero or tiny sum, or not in complex64/float32 are always candidates. Complex64
    values are summed by one compiled pass where Numba's kernels are ready
    (:mod:`depsi.kernels.statistics_numba`, its terms a few units of rounding from ``np.abs``'s
    and ``g`` widened by them); which pixels are screened out may then differ by a few at the
    bound, never which are selected, since the exact statistics decide every candidate.

    Parameters
    ----------
    values
        Complex SLC values or float32 amplitudes ``(..., time)``, or a list of time pieces as in
        :func:`amplitude_sums`.
    threshold
        The NAD threshold of the selection (a pixel is selected when its float32 NAD is below).
    compiled
        Whether complex64 values may be summed by the compiled pass (where Numba's kernels are
        ready); False: NumPy alone, Numba not imported (a Dask worker too small for it).

    Returns
    -------
    numpy.ndarray
        Boolean, shape ``values.shape[:-1]``: True where the exact statistics are needed.

    Examples
    --------
    >>> slc = np.array([[1, 1, 1, 1], [1, 9, 1, 9], [1, np.nan, 1, 1]], dtype="c8")
    >>> nad_screen(slc, 0.25).tolist()
    [True, False, True]
    """
    pieces = _time_pieces(values)
    xp = array_namespace(*pieces)
    lead = pieces[0].shape[:-1]
    n_time = sum(piece.shape[-1] for piece in pieces)
    u = float(np.finfo(np.float32).eps) / 2
    screened = (xp is np and n_time * u < 1e-3
                and all(piece.dtype in (np.complex64, np.float32) for piece in pieces))
    if not screened:
        return xp.ones(lead, dtype=bool)
    g = n_time * u / (1 - n_time * u)
    compiled = compiled and all(piece.dtype == np.complex64 for piece in pieces)
    if compiled:
        # imported here: a process that asks for NumPy never imports Numba
        from depsi.kernels import statistics_numba

        compiled = statistics_numba.ready()
    if compiled:
        # one compiled pass; its terms are np.abs's to TERM_ERROR units, so a sum is known
        # to (1 + TERM_ERROR u)(1 + g) - 1 relatively instead of g
        sums = statistics_numba.screen_sums(pieces)
        g += statistics_numba.TERM_ERROR * u * (1 + g)
    else:
        sums = _float32_sums(pieces, SUM_BLOCK_PIXELS)
    total, total_sq = (values.astype(np.float64) for values in sums)
    trusted = (np.isfinite(total) & np.isfinite(total_sq) & (total >= _SCREEN_FLOOR)
               & (total_sq >= _SCREEN_FLOOR))
    ratio = n_time * total_sq / np.where(trusted, total * total, 1.0)
    lowest_nad_squared = ratio * (1 - 4 * g) - 1
    limit = max(float(threshold), float(np.float32(threshold))) * (1 + _SCREEN_MARGIN)
    rejected = trusted & (lowest_nad_squared >= limit * limit)
    return ~rejected.reshape(lead)


def add_sums(sums, more) -> tuple:
    """Element-wise sum of two ``(count, total, total_sq)`` triples (old epochs + new epochs).

    Examples
    --------
    >>> a = amplitude_sums(np.array([[1.0, 2.0]]))
    >>> b = amplitude_sums(np.array([[3.0]]))
    >>> [s.tolist() for s in add_sums(a, b)]
    [[3], [6.0], [14.0]]
    """
    count, total, total_sq = sums
    more_count, more_total, more_total_sq = more
    return (count + more_count).astype(count.dtype), total + more_total, total_sq + more_total_sq


def moments_from_sums(count, total, total_sq) -> tuple:
    """Mean, population standard deviation (ddof=0) and NAD = std/mean from running sums.

    Pixels with no finite epoch or a zero mean get NaN (mean is NaN only without epochs); no
    division by zero is performed.

    Returns
    -------
    mean, std, nad
        float64 arrays.

    Examples
    --------
    >>> mean, std, nad = moments_from_sums(*amplitude_sums(np.array([[1.0, 3.0], [0.0, 0.0]])))
    >>> mean.tolist(), std.tolist(), nad.tolist()
    ([2.0, 0.0], [1.0, 0.0], [0.5, nan])
    """
    xp = array_namespace(total)
    has_epochs = count > 0
    n = xp.where(has_epochs, count, 1).astype(xp.float64)
    mean = xp.where(has_epochs, total / n, xp.nan)
    variance = xp.maximum(total_sq / n - (total / n) ** 2, 0.0)
    std = xp.where(has_epochs, xp.sqrt(variance), xp.nan)
    positive = mean > 0
    nad = xp.where(positive, std / xp.where(positive, mean, 1.0), xp.nan)
    return mean, std, nad


def _nanmedian_last(sorted_values, count):
    """Median of the first ``count`` values of each row of an ascending-sorted array."""
    xp = array_namespace(sorted_values)
    lower = xp.maximum((count - 1) // 2, 0)[..., None].astype(xp.int64)
    upper = xp.maximum(count // 2, 0)[..., None].astype(xp.int64)
    low = xp.take_along_axis(sorted_values, lower, axis=-1)[..., 0]
    high = xp.take_along_axis(sorted_values, upper, axis=-1)[..., 0]
    median = (low + high) * sorted_values.dtype.type(0.5)
    return xp.where(count > 0, median, xp.nan).astype(sorted_values.dtype, copy=False)


def median_and_mad(amplitude, count=None) -> tuple:
    """Median and median absolute deviation (MAD, unscaled) over the last axis, skipping NaN/inf.

    Computed in the input's float precision by sorting along time (NaN/inf sort last), so the
    values equal ``np.median`` of the finite epochs exactly.

    Parameters
    ----------
    amplitude
        Real array ``(..., time)``.
    count
        Number of finite epochs per pixel, if already known.

    Examples
    --------
    >>> median, mad = median_and_mad(np.array([[1.0, 2.0, 4.0, np.nan]], dtype="f4"))
    >>> median.tolist(), mad.tolist()
    ([2.0], [1.0])
    """
    xp = array_namespace(amplitude)
    amplitude = xp.asarray(amplitude)
    finite = xp.isfinite(amplitude)
    if count is None:
        count = finite.sum(axis=-1, dtype=xp.int32)
    values = amplitude if bool(finite.all()) else xp.where(finite, amplitude, xp.nan)
    median = _nanmedian_last(xp.sort(values, axis=-1), count)
    deviation = xp.abs(values - median[..., None])
    mad = _nanmedian_last(xp.sort(deviation, axis=-1), count)
    return median, mad


def statistics_block(slc, *, robust: bool = True) -> dict:
    """All amplitude statistics of a block from one read of its SLC values.

    Parameters
    ----------
    slc
        Complex SLC values (or real amplitudes) ``(..., time)``, or a list of such arrays that
        together make the time axis (see :func:`amplitude_sums`; joined for ``robust``).
    robust
        Also compute median, MAD and NMAD (a sort along time); without it only the moments.

    Returns
    -------
    dict
        ``amp_count`` (int32), ``amp_sum``, ``amp_sumsq`` (float64), ``amplitude_mean``,
        ``amplitude_std``, ``amplitude_dispersion`` (NAD) and, if ``robust``,
        ``amplitude_median``, ``amplitude_mad``, ``amplitude_dispersion_mad`` (NMAD = MAD /
        median), all float32 but the sums. NaN where a pixel has no usable amplitude.

    Examples
    --------
    >>> stats = statistics_block(np.array([[1 + 0j, 3 + 0j]], dtype="c8"))
    >>> float(stats["amplitude_dispersion"][0]), float(stats["amplitude_dispersion_mad"][0])
    (0.5, 0.5)
    """
    pieces = _time_pieces(slc)
    xp = array_namespace(*pieces)
    if robust:  # median and MAD sort each pixel's epochs: they need them joined
        amplitude = amplitude_of(pieces[0] if len(pieces) == 1
                                 else xp.concatenate(pieces, axis=-1))
    count, total, total_sq = amplitude_sums(amplitude if robust else pieces)
    mean, std, nad = moments_from_sums(count, total, total_sq)
    stats = {
        "amp_count": count,
        "amp_sum": total,
        "amp_sumsq": total_sq,
        "amplitude_mean": mean.astype(xp.float32),
        "amplitude_std": std.astype(xp.float32),
        "amplitude_dispersion": nad.astype(xp.float32),
    }
    if robust:
        median, mad = median_and_mad(amplitude, count)
        positive = median > 0
        nmad = xp.where(positive, mad / xp.where(positive, median, 1), xp.nan)
        stats |= {
            "amplitude_median": median,
            "amplitude_mad": mad,
            "amplitude_dispersion_mad": nmad.astype(xp.float32),
        }
    return stats


def phase_of(slc):
    """Phase (float32, radians) of complex values, wrapped to (-pi, pi].

    ``angle`` returns -pi for a negative real part with a negative-zero imaginary part; that
    value is moved to +pi so the interval is half-open as the conventions require.

    Examples
    --------
    >>> phase_of(np.array([-1 - 0j, 1j], dtype="c8")).tolist() == [np.float32(np.pi),
    ...                                                          np.float32(np.pi / 2)]
    True
    """
    xp = array_namespace(slc)
    phase = xp.angle(slc).astype(xp.float32, copy=False)
    minus_pi = xp.float32(-np.pi)
    return xp.where(phase <= minus_pi, phase + xp.float32(2 * np.pi), phase)
