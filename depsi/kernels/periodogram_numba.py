"""The periodogram's fused CPU kernel (Numba): grid search and refinement in one pass per item.

:func:`depsi.kernels.periodogram.periodogram` stays the reference and dispatches here for NumPy
inputs when Numba can be imported (DESIGN.md §4). The algorithm is the reference's, item by
item: the same grid, the same complex64 height phasors built by doubling, the same first-max
argmax, parabolic start, float32 Newton iterations with the same stopping rule, and the float64
Newton step and ``_moved_sums`` series at the end. The grid sums are accumulated in another
order than BLAS's complex GEMM (complex64 either way), so the best node can differ where two
nodes' coherences tie to ~1e-6; the float32 iterations accumulate their normal equations in
float64. The final float64 Newton step squares what is left of those differences. Figures:
``docs/benchmarks.md`` ("Fused periodogram").

Compiled on first use (see :data:`COMPILE_NOTE`), cached in :func:`cache_dir` when that is
writable, never next to the package; without a writable cache it compiles once per process.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from depsi.conventions import MISSING_AMBIGUITY, wrap_phase
from depsi.kernels.flags import FLAG_DTYPE, Flag

logger = logging.getLogger(__name__)

try:
    import numba
except ImportError:  # pragma: no cover - numba is a core dependency; kept for stripped installs
    numba = None

#: Whether the fused kernel can run in this process.
AVAILABLE = numba is not None

#: What the first call in a process costs: compiling the kernel takes several seconds (measured
#: figures in docs/benchmarks.md); a later process loads it from the cache in well under one.
COMPILE_NOTE = "compiled on first call; cached per user (cache_dir)"

_TWO_PI = 2.0 * np.pi
_COHERENCE_TIE = 1e-14
_GRID_PRECISION = 1e-5
_SERIES_REACH = 1e-2
_MISSING = np.int32(MISSING_AMBIGUITY)
_GRID_ONLY = int(Flag.GRID_ONLY)


def cache_dir() -> Path | None:
    """Where the compiled kernel is cached: ``NUMBA_CACHE_DIR`` if set, else
    ``$XDG_CACHE_HOME/depsi/numba`` (``~/.cache/depsi/numba``); None when that cannot be
    written (a read-only home), and then nothing is cached, nor written anywhere else."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        path = Path(configured)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(base) / "depsi" / "numba"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError:
        return None
    return path


def _jit(function):
    """``numba.njit(nogil=True)``, cached in :func:`cache_dir` only: numba's own locators would
    fall back to writing next to the package (or fail at import when nothing is writable)."""
    path = cache_dir()
    if path is None:
        logger.debug("periodogram_numba: no writable cache directory; compiling per process")
        return numba.njit(nogil=True)(function)
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(path)  # read once, when the dispatcher locates its cache
    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError:  # no locator accepted the directory after all
        return numba.njit(nogil=True)(function)
    finally:
        numba.config.CACHE_DIR = saved


def _wrap(x):
    """``wrap_phase`` of one float64 (the same operations: the result in ``(-pi, pi]``)."""
    w = x - np.rint(x * (1.0 / _TWO_PI)) * _TWO_PI
    if w <= -math.pi:
        w += _TWO_PI
    elif w > math.pi:
        w -= _TWO_PI
    return w


# fdlibm's kernels of sin and cos on |y| <= pi/4, and pi/2 in three parts (Cody-Waite): libm's
# scalar cos and sin cost about 25 ns a pair here, these few products a fraction of that
_S1, _S2, _S3 = -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04
_S4, _S5, _S6 = 2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10
_C1, _C2, _C3 = 4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05
_C4, _C5, _C6 = -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11
_PIO2_1, _PIO2_2, _PIO2_3 = 1.57079632673412561417e+00, 6.07710050650619224932e-11, \
    2.02226624871116645580e-21
_TWO_OVER_PI = 2.0 / math.pi


def _sincos(x, c, s):
    """Cosines and sines of ``x`` (float64, about 1e-16 absolute for ``|x|`` up to 1e5 rad)."""
    for t in range(x.shape[0]):
        k = np.rint(x[t] * _TWO_OVER_PI)
        y = ((x[t] - k * _PIO2_1) - k * _PIO2_2) - k * _PIO2_3
        z = y * y
        sy = y + y * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
        cy = 1.0 - 0.5 * z + z * z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (
            _C5 + z * _C6)))))
        q = np.int64(k) & 3
        sin_abs = cy if q & 1 else sy
        cos_abs = sy if q & 1 else cy
        s[t] = -sin_abs if q & 2 else sin_abs
        c[t] = -cos_abs if (q + 1) & 2 else cos_abs


def _evaluate(phase0, vmask, height, shared, theta, r, c, s):
    """Cosines and sines of the residual ``phase0 - model(theta)`` into ``c``, ``s``, zero at
    missing epochs; returns their sums."""
    T = phase0.shape[0]
    for t in range(T):
        model = theta[0] * height[t]
        for p in range(shared.shape[1]):
            model += theta[1 + p] * shared[t, p]
        r[t] = phase0[t] - model
    _sincos(r, c, s)
    C = 0.0
    S = 0.0
    for t in range(T):
        c[t] *= vmask[t]
        s[t] *= vmask[t]
        C += c[t]
        S += s[t]
    return C, S


def _solve(N, b, rcond, x, work):
    """``lstsq._solve_transposed`` for one (Q, Q) system: unit-diagonal scaling, guarded
    Cholesky, inverse, 1-norm condition; fills ``x`` (NaN if refused) and returns whether
    accepted. ``work`` (5, Q, Q) is scratch."""
    Q = N.shape[0]
    Ns, L, inv, inv_s, scale = work[0], work[1], work[2], work[3], work[4, 0]
    for i in range(Q):
        x[i] = np.nan
    for i in range(Q):
        if not math.isfinite(b[i]) or not N[i, i] > 0:
            return False
        for j in range(Q):
            if not math.isfinite(N[i, j]):
                return False
    for i in range(Q):
        scale[i] = 1.0 / math.sqrt(N[i, i])
    for i in range(Q):
        for j in range(Q):
            Ns[i, j] = N[i, j] * scale[i] * scale[j]
            L[i, j] = 0.0
    bad = False
    for j in range(Q):
        pivot = Ns[j, j]
        for m in range(j):
            pivot -= L[j, m] * L[j, m]
        if not pivot > rcond:
            bad = True
            pivot = 1.0
        d = math.sqrt(pivot)
        L[j, j] = d
        for i in range(j + 1, Q):
            below = Ns[i, j]
            for m in range(j):
                below -= L[i, m] * L[j, m]
            L[i, j] = below / d
    for j in range(Q):
        for col in range(Q):
            acc = 1.0 if col == j else 0.0
            for m in range(j):
                acc -= L[j, m] * inv[m, col]
            inv[j, col] = acc / L[j, j]
    norm_n = 0.0
    norm_inv = 0.0
    for j in range(Q):
        for i in range(Q):
            acc = 0.0
            for m in range(Q):
                acc += inv[m, i] * inv[m, j]
            inv_s[i, j] = acc
    for j in range(Q):
        col_n = 0.0
        col_inv = 0.0
        for i in range(Q):
            col_n += abs(Ns[i, j])
            col_inv += abs(inv_s[i, j])
        norm_n = max(norm_n, col_n)
        norm_inv = max(norm_inv, col_inv)
    if bad or not norm_n * norm_inv * rcond < 1.0:
        return False
    for i in range(Q):
        acc = 0.0
        for j in range(Q):
            acc += inv_s[i, j] * b[j] * scale[j]
        x[i] = scale[i] * acc
    return True


def _normal_equations(w, g, height, shared, N, b):
    """``N = sum_t w_t x_t x_t^T``, ``b = sum_t g_t x_t`` over the regressors and the constant
    ``x_t = [height_t, shared_t..., 1]``, skipping epochs of zero weight."""
    Q = N.shape[0]
    for i in range(Q):
        b[i] = 0.0
        for j in range(Q):
            N[i, j] = 0.0
    for t in range(w.shape[0]):
        if w[t] == 0.0:
            continue
        for i in range(Q):
            xi = height[t] if i == 0 else (1.0 if i == Q - 1 else shared[t, i - 1])
            b[i] += g[t] * xi
            wi = w[t] * xi
            for j in range(i + 1):
                xj = height[t] if j == 0 else (1.0 if j == Q - 1 else shared[t, j - 1])
                N[i, j] += wi * xj
    for i in range(Q):
        for j in range(i + 1, Q):
            N[i, j] = N[j, i]


def _newton(c, s, C, S, height, shared, rcond, w, g, N, b, x, work, step):
    """The reference's ``_newton_step``: the Newton step on ``sum_t cos(r_t)`` relative to the
    best constant phase ``arg(C + jS)``, epochs with ``|r| > pi/2`` left out, into ``step``
    (zero where the system is refused); returns whether it was accepted."""
    norm = math.sqrt(C * C + S * S)
    if not norm > 0:
        norm = 1.0
    cc = C / norm
    ss = S / norm
    for t in range(c.shape[0]):
        cos_r = c[t] * cc + s[t] * ss
        inside = cos_r > 0
        w[t] = cos_r if inside else 0.0
        g[t] = s[t] * cc - c[t] * ss if inside else 0.0
    _normal_equations(w, g, height, shared, N, b)
    ok = _solve(N, b, rcond, x, work)
    for p in range(step.shape[0]):
        step[p] = x[p] if ok else 0.0
    return ok


def _vertex(p0, pm, pp, index, n_nodes):
    """The reference's ``_vertex_offsets`` for one item, in float32 as it computes them."""
    if not (index > 0 and index < n_nodes - 1):
        return 0.0
    curvature = pm - np.float32(2) * p0 + pp
    if not curvature < 0:
        return 0.0
    offset = np.float32(0.5) * (pm - pp) / curvature
    return np.float64(min(max(offset, np.float32(-0.5)), np.float32(0.5)))


def _items(phase, h2ph, years_shared, heights, grid_shared, best_node, peaks, n_velocity, steps,
           m2ph, refine, rcond, tolerance, iterations, theta_out, offset_out, coherence_out,
           grid_out, ambiguity_out, residual_out, n_valid_out, flag_out, ok_out):
    """Every output of the reference's ``_periodogram_batch`` from its coarse stage's best
    node (flat, height-major) and grid powers there and at its neighbours, item by item, before
    the flags' NaNs (set by the caller). ``h2ph`` (K or 1, T); ``years_shared`` (T, P - 1) is
    ``m2ph * [t, g_e...]``. The Newton iterations run in float64 (the reference's in float32)."""
    K, T = phase.shape
    Nh = heights.shape[0]
    Ns = grid_shared.shape[0]
    P = years_shared.shape[1] + 1
    Q = P + 1
    v_stride = Ns // n_velocity
    phase0, height, vmask = np.empty(T), np.empty(T), np.empty(T)
    r, c, s, c2, s2, w, g = (np.empty(T), np.empty(T), np.empty(T), np.empty(T), np.empty(T),
                             np.empty(T), np.empty(T))
    N, b, x, work = np.empty((Q, Q)), np.empty(Q), np.empty(Q), np.empty((5, Q, Q))
    step, theta, grid, best, polished = (np.empty(P), np.empty(P), np.empty(P), np.empty(P),
                                         np.empty(P))
    for k in range(K):
        row = 0 if h2ph.shape[0] == 1 else k
        n = 0
        for t in range(T):
            ph = phase[k, t]
            hh = h2ph[row, t]
            ok = math.isfinite(ph) and math.isfinite(hh)
            n += 1 if ok else 0
            phase0[t] = ph if ok else 0.0
            height[t] = m2ph * hh if ok else 0.0
            vmask[t] = 1.0 if ok else 0.0
        n_valid_out[k] = n
        n1 = max(n, 1)
        flat = best_node[k]
        p0 = peaks[k, 0]
        grid[0] = heights[flat // Ns]
        for p in range(P - 1):
            grid[1 + p] = grid_shared[flat % Ns, p]
        grid_coh = np.float64(p0) / n1

        # identifiable on the valid epochs: the model's normal matrix with unit weights
        for t in range(T):
            g[t] = 0.0
        _normal_equations(vmask, g, height, years_shared, N, b)
        ok_out[k] = _solve(N, b, rcond, x, work)

        grid_only = not refine
        if refine:
            for p in range(P):
                theta[p] = grid[p]
            theta[0] += _vertex(p0, peaks[k, 1], peaks[k, 2], flat // Ns, Nh) * steps[0]
            theta[1] += _vertex(p0, peaks[k, 3], peaks[k, 4], (flat // v_stride) % n_velocity,
                                n_velocity) * steps[1]
            C, S = _evaluate(phase0, vmask, height, years_shared, theta, r, c, s)
            best[:] = theta
            best_coh = math.sqrt(C * C + S * S) / n1
            at_best = True  # c, s hold the cosines and sines at best
            started = False
            for it in range(iterations):
                accepted = _newton(c, s, C, S, height, years_shared, rcond, w, g, N, b, x, work,
                                   step)
                started = accepted if it == 0 else started
                for p in range(P):
                    theta[p] += step[p]
                C, S = _evaluate(phase0, vmask, height, years_shared, theta, r, c, s)
                coh = math.sqrt(C * C + S * S) / n1
                at_best = coh >= best_coh - _COHERENCE_TIE
                if at_best:
                    best[:] = theta
                    best_coh = coh
                moving = False
                for p in range(P):
                    moving |= abs(step[p]) > tolerance * steps[p]
                if not moving:
                    break
            # one more Newton step from the best iterate, as the reference's float64 step
            if not at_best:
                C, S = _evaluate(phase0, vmask, height, years_shared, best, r, c, s)
            _newton(c, s, C, S, height, years_shared, rcond, w, g, N, b, x, work, step)
            far = False
            for t in range(T):
                delta = step[0] * height[t]
                for p in range(P - 1):
                    delta += step[1 + p] * years_shared[t, p]
                r[t] = delta
                far |= abs(delta) > _SERIES_REACH
            for p in range(P):
                polished[p] = best[p] + step[p]
            if far:
                C2, S2 = _evaluate(phase0, vmask, height, years_shared, polished, r, c2, s2)
            else:
                # the reference's _moved_sums: cos(r - d) = c cos d + s sin d, as series
                C2 = 0.0
                S2 = 0.0
                for t in range(T):
                    d = r[t]
                    d2 = d * d
                    cos_d = 1.0 - d2 * (0.5 - d2 * (1.0 / 24 - d2 * (1.0 / 720)))
                    sin_d = d * (1.0 - d2 * (1.0 / 6 - d2 * (1.0 / 120)))
                    C2 += c[t] * cos_d + s[t] * sin_d
                    S2 += s[t] * cos_d - c[t] * sin_d
            if math.sqrt(C2 * C2 + S2 * S2) >= math.sqrt(C * C + S * S) - n1 * _COHERENCE_TIE:
                theta[:] = polished
                C, S = C2, S2
            else:
                theta[:] = best
            # the grid node where the refinement could not start or ended below the grid's
            # coherence (complex64 precision there)
            reached = math.sqrt(C * C + S * S) / n1 >= grid_coh - _GRID_PRECISION
            grid_only = not (started and reached)
        if grid_only:
            theta[:] = grid
            C, S = _evaluate(phase0, vmask, height, years_shared, theta, r, c, s)

        # the constant phase, residuals and ambiguities at the estimate
        coherence_out[k] = math.sqrt(C * C + S * S) / n1
        offset = math.atan2(S, C)
        offset_out[k] = offset
        grid_out[k] = grid_coh
        for t in range(T):
            model = theta[0] * height[t] + offset
            for p in range(P - 1):
                model += theta[1 + p] * years_shared[t, p]
            residual = _wrap(phase0[t] - model)
            if vmask[t] > 0:
                ambiguity_out[k, t] = np.int32(np.rint((model + residual - phase0[t]) / _TWO_PI))
                residual_out[k, t] = residual
            else:
                ambiguity_out[k, t] = _MISSING
                residual_out[k, t] = np.nan
        theta_out[k] = theta
        flag_out[k] = _GRID_ONLY if (refine and grid_only) else 0


if AVAILABLE:
    _wrap = numba.njit(inline="always")(_wrap)
    _sincos = numba.njit(_sincos)
    _evaluate = numba.njit(_evaluate)
    _solve = numba.njit(_solve)
    _normal_equations = numba.njit(_normal_equations)
    _newton = numba.njit(_newton)
    _vertex = numba.njit(_vertex)
    _items = _jit(_items)


def fused_batch(xp, phase, h2ph, t, extra_g, grid, tables, steps, m2ph, refine, rcond):
    """``periodogram._periodogram_batch`` for NumPy inputs: its coarse stage as it is (the same
    height phasors, complex GEMM and first-max argmax, so the same best node), then
    :func:`_items` for the rest; the same fields in the same order."""
    # the module, not the function depsi.kernels re-exports under its name
    reference = importlib.import_module("depsi.kernels.periodogram")

    K, T = phase.shape
    phase = np.ascontiguousarray(phase, dtype=np.float64)
    h2ph = np.ascontiguousarray(h2ph, dtype=np.float64)
    h2ph_full = np.broadcast_to(h2ph, (K, T))
    valid = np.isfinite(phase) & np.isfinite(h2ph_full)
    phase0 = np.where(valid, phase, 0.0)
    z = reference._unit_phasors(np, wrap_phase(phase0)) * valid
    E_shared, E_full = tables
    alpha = None
    if E_full is None:
        alpha = (-m2ph * np.where(valid, h2ph_full, 0.0)).astype(np.float32)
    Nh, Ns = grid.heights.shape[0], grid.shared.shape[0]
    block = reference.coarse_block_items(T, Nh, Nh * Ns)
    best, peaks = reference._coarse_search(
        np, z, alpha, grid.heights.astype(np.float32), E_shared, E_full,
        (Ns, Ns // grid.velocity_count), max(block, 1))
    del z, alpha, valid, phase0

    years_shared = np.ascontiguousarray(m2ph * np.stack([t] + list(extra_g), axis=1))
    P = years_shared.shape[1] + 1
    theta = np.empty((K, P))
    offset, coherence, grid_coh = np.empty(K), np.empty(K), np.empty(K)
    ambiguity = np.empty((K, T), dtype=np.int32)
    residual = np.empty((K, T))
    n_valid = np.empty(K, dtype=np.int64)
    flag = np.empty(K, dtype=FLAG_DTYPE)
    identifiable = np.empty(K, dtype=np.bool_)
    if K:
        _items(phase, h2ph.reshape(-1, T), years_shared, np.asarray(grid.heights, np.float64),
               np.ascontiguousarray(grid.shared, dtype=np.float64), best,
               np.ascontiguousarray(peaks), grid.velocity_count,
               np.ascontiguousarray(steps[:, 0], dtype=np.float64), m2ph, refine, rcond,
               reference.REFINE_TOLERANCE, reference.REFINE_ITERATIONS, theta, offset,
               coherence, grid_coh, ambiguity, residual, n_valid, flag, identifiable)

    too_few = n_valid < P + 1
    flag = np.where(too_few, int(Flag.TOO_FEW_OBSERVATIONS),
                    np.where(~identifiable, int(Flag.RANK_DEFICIENT), flag)).astype(FLAG_DTYPE)
    theta[too_few | ~identifiable] = np.nan
    empty = n_valid == 0
    for values in (coherence, grid_coh, offset):
        values[empty] = np.nan
    return (theta[:, 0], theta[:, 1], offset, coherence, grid_coh, ambiguity, residual, n_valid,
            flag, [theta[:, 2 + e] for e in range(P - 2)])
