"""The periodogram's fused CPU kernel (Numba): the grid search and the refinement of each item in
compiled passes, beside the array-namespace kernel that stays the reference (docs/design.md,
"Kernels").

:func:`depsi.kernels.periodogram.periodogram` runs it for NumPy inputs with a height term when
Numba can be imported (``fused``, :data:`~depsi.kernels.periodogram.USE_FUSED`). It computes
what the reference computes, item by item:

1. **Grid**: on a grid symmetric about zero (the default ranges) node ``Ns - 1 - n`` is node
   ``n`` negated and its phasors are the conjugates, so the real and imaginary parts of the
   height phasors (compiled, a float64 recurrence over the heights) times the cosines and sines
   of half the nodes, one real float32 GEMM (BLAS), give every node's sum with half the
   multiplications of the reference's complex GEMM; the moduli, the first-max argmax and the
   neighbours' powers are compiled. On any other grid, the reference's own coarse stage.
   Float32 sums either way: the best node can differ from the reference's only where two
   nodes' coherences tie to ~1e-6.
2. **Refinement and results**, one compiled pass an item: the same parabolic start, Newton
   iterations with the same stopping rule (in float64 here, float32 there, with fdlibm's sine
   and cosine kernels instead of libm's scalar calls), the last Newton step with the
   reference's ``_moved_sums`` series, the same GRID_ONLY rule, the same identifiability test
   (``lstsq._solve_transposed`` for one system), constant phase, residuals and ambiguities.

The compiled loops run over the epochs (or the nodes) innermost, with few arrays written a loop,
so that LLVM compiles them to SIMD: a loop over the terms inside one over the epochs, or one
writing many arrays that might overlap, stays scalar. Sums over the epochs in the refinement are
reassociated (:data:`_REDUCTION_MATH`); the grid stage keeps IEEE order, its best node and
powers independent of how its loops are compiled. The GEMM stays in BLAS: compiled loops
reached 3 GMAC/s against OpenBLAS's 7 on these shapes. No ``prange``: the chain runs the kernel
on Dask's threads (BLAS at one thread), and the compiled functions release the GIL. Figures and
agreement: ``docs/benchmarks.md`` ("Fused periodogram").

Cached in :func:`~depsi.kernels.numba_support.cache_dir` when that can be written, never beside
the package. Asked for (``fused=True``) it is compiled at its first call where no cache holds
it; by default only where the cache holds it (:func:`ready`), else the reference runs and the
cache is filled for the next run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from depsi.conventions import MISSING_AMBIGUITY, wrap_phase
from depsi.kernels import numba_support
from depsi.kernels.flags import FLAG_DTYPE, Flag
from depsi.kernels.numba_support import jit_cached, numba, sample_array

logger = logging.getLogger(__name__)

#: Whether the fused kernel can run in this process.
AVAILABLE = numba is not None

#: Whether a grid symmetric about zero takes the real GEMM of :func:`_mirrored_coarse` (half the
#: multiplications); False: the reference's complex GEMM, so that the grid node is the
#: reference's to the bit.
MIRRORED_GRID = True

_TWO_PI = 2.0 * np.pi

#: Bytes of height phasors and GEMM products per block of the mirrored grid search: a block
#: this size stays in a core's L2 between the phasors' build, the GEMM and the moduli. Blocks
#: of 8 MiB (the reference's) took 10 % longer (docs/benchmarks.md, "Fused periodogram").
GRID_BLOCK_BYTES = 1 << 20

#: LLVM's fast-math flags of the sums over the epochs in the refinement: reassociated (SIMD
#: partial sums) and fused multiply-adds. They move a sum by about 1e-16 of its size, which the
#: Newton iterations' stopping rule and the float64 step after them absorb; the grid search
#: keeps IEEE order.
_REDUCTION_MATH = {"reassoc", "contract"}


class Reference(NamedTuple):
    """What the fused kernel takes from the reference (depsi.kernels.periodogram), which hands
    it over at the dispatch: so neither module imports the other's, and the limits reach the
    compiled pass as arguments (a cached compilation would keep globals it once read)."""

    unit_phasors: Callable
    coarse_search: Callable
    coarse_block_items: Callable
    refine_tolerance: float
    refine_iterations: int
    coherence_tie: float
    grid_precision: float
    series_reach: float
_MISSING = np.int32(MISSING_AMBIGUITY)
_GRID_ONLY = int(Flag.GRID_ONLY)


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


def _sincos1(x):
    """``(cos x, sin x)`` for float64 ``x`` (about 1e-16 absolute for ``|x|`` up to 1e5 rad)."""
    k = np.rint(x * _TWO_OVER_PI)
    y = ((x - k * _PIO2_1) - k * _PIO2_2) - k * _PIO2_3
    z = y * y
    sy = y + y * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
    cy = 1.0 - 0.5 * z + z * z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * _C6)))))
    q = np.int64(k) & 3
    sin_abs = cy if q & 1 else sy
    cos_abs = sy if q & 1 else cy
    return (-cos_abs if (q + 1) & 2 else cos_abs), (-sin_abs if q & 2 else sin_abs)


def _sincos(x, c, s):
    """Cosines and sines of the float64 array ``x`` into ``c`` and ``s`` (:func:`_sincos1`)."""
    for t in range(x.shape[0]):
        c[t], s[t] = _sincos1(x[t])


def _model(design, theta, constant, out):
    """``out_t = constant + sum_p theta_p design_pt`` over the first ``len(theta)`` rows of
    ``design`` (the regressors, epochs along the rows), term after term as a scalar loop over
    the terms would add them: one loop over the epochs a term, which compiles to SIMD."""
    T = out.shape[0]
    for t in range(T):
        out[t] = theta[0] * design[0, t] + constant
    for p in range(1, theta.shape[0]):
        coefficient = theta[p]
        row = design[p]
        for t in range(T):
            out[t] += coefficient * row[t]


def _evaluate(phase0, vmask, design, theta, r, c, s):
    """Cosines and sines of the residual ``phase0 - model(theta)`` into ``c``, ``s``, zero at
    missing epochs; returns their sums."""
    _model(design, theta, 0.0, r)
    for t in range(r.shape[0]):
        r[t] = phase0[t] - r[t]
    _sincos(r, c, s)
    return _masked_sums(vmask, c, s)


def _masked_sums(vmask, c, s):
    """``c`` and ``s`` times ``vmask`` (zero at missing epochs), and their sums
    (:data:`_REDUCTION_MATH`)."""
    C = 0.0
    S = 0.0
    for t in range(vmask.shape[0]):
        c[t] *= vmask[t]
        s[t] *= vmask[t]
        C += c[t]
        S += s[t]
    return C, S


def _moved_sums(c, s, d):
    """The reference's ``_moved_sums``: the sums of ``cos(r - d)`` and ``sin(r - d)`` from
    ``c = cos r``, ``s = sin r`` by ``cos(r - d) = c cos d + s sin d``, ``cos d`` and ``sin d``
    as series (:data:`_REDUCTION_MATH`)."""
    C = 0.0
    S = 0.0
    for t in range(d.shape[0]):
        d1 = d[t]
        d2 = d1 * d1
        cos_d = 1.0 - d2 * (0.5 - d2 * (1.0 / 24 - d2 * (1.0 / 720)))
        sin_d = d1 * (1.0 - d2 * (1.0 / 6 - d2 * (1.0 / 120)))
        C += c[t] * cos_d + s[t] * sin_d
        S += s[t] * cos_d - c[t] * sin_d
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


def _normal_equations(w, g, design, N, b):
    """``N = sum_t w_t x_t x_t^T``, ``b = sum_t g_t x_t`` over the columns ``x_t`` of ``design``
    (Q, T): the regressors and the constant, ``[height_t, shared_t..., 1]``. ``g_t`` is zero
    wherever ``w_t`` is. One reduction over the epochs an entry, which compiles to SIMD with
    reassociated sums (:data:`_REDUCTION_MATH`)."""
    Q = N.shape[0]
    T = w.shape[0]
    for i in range(Q):
        xi = design[i]
        acc = 0.0
        for t in range(T):
            acc += g[t] * xi[t]
        b[i] = acc
        for j in range(i + 1):
            xj = design[j]
            acc = 0.0
            for t in range(T):
                acc += w[t] * xi[t] * xj[t]
            N[i, j] = acc
            N[j, i] = acc


def _newton(c, s, C, S, design, rcond, w, g, N, b, x, work, step):
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
    _normal_equations(w, g, design, N, b)
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


def _grid_phasors(phase, h2ph, m2ph, heights, start, X, work):
    """Height phasors ``exp(j (phase_t - m2ph h2ph_t H_h))`` (zero at missing epochs) of items
    ``start:start + len(X)``, real and imaginary parts apart: ``X`` (items, Nh, 2, T) float32.
    By a float64 recurrence over the evenly spaced heights from two cosines and sines an epoch
    (``work`` (7, T) float64 scratch). Each loop below runs over the epochs with few arrays
    written, so that it compiles to SIMD (too many arrays that may overlap and LLVM keeps the
    loop scalar)."""
    T = phase.shape[1]
    Nh = heights.shape[0]
    spacing = heights[1] - heights[0] if Nh > 1 else 0.0
    re, im, step_re, step_im = work[0], work[1], work[2], work[3]
    first, step, valid = work[4], work[5], work[6]
    for i in range(X.shape[0]):
        k = start + i
        row = 0 if h2ph.shape[0] == 1 else k
        for t in range(T):
            ph = phase[k, t]
            alpha = -m2ph * h2ph[row, t]
            ok = math.isfinite(ph) and math.isfinite(alpha)
            ph = ph if ok else 0.0
            alpha = alpha if ok else 0.0
            first[t] = _wrap(ph) + alpha * heights[0]
            step[t] = alpha * spacing
            valid[t] = 1.0 if ok else 0.0
        _sincos(first, re, im)
        _sincos(step, step_re, step_im)
        for t in range(T):
            re[t] *= valid[t]
            im[t] *= valid[t]
        for h in range(Nh):
            out_re = X[i, h, 0]
            out_im = X[i, h, 1]
            for t in range(T):
                out_re[t] = re[t]
                out_im[t] = im[t]
            for t in range(T):
                next_re = re[t] * step_re[t] - im[t] * step_im[t]
                im[t] = re[t] * step_im[t] + im[t] * step_re[t]
                re[t] = next_re


def _grid_best(R, Ns, v_stride, start, best, peaks, power):
    """The best node (flat, height-major, first of equal maxima) of each item in ``R`` and the
    powers ``|C|`` there and at its neighbours ``best -+ Ns`` and ``best -+ v_stride``
    (clipped), as the reference's ``_coarse_search``, into ``best`` and ``peaks`` at ``start``.

    ``R`` (items, Nh, 2, 2H) holds the products of the phasors' real and imaginary parts with
    the cosines and sines of the first H nodes; node ``Ns - 1 - n`` is node ``n`` mirrored
    (its phasors the conjugates). ``power`` (Nh * Ns) float32 is scratch. The powers are
    non-negative, so they order as their bit patterns do: the maxima are integer reductions,
    which compile to SIMD where float ones (NaN-aware) stay scalar."""
    Nh = R.shape[1]
    H = R.shape[3] // 2
    bits = power.view(np.int32)
    for i in range(R.shape[0]):
        top = np.int32(-1)
        top_row = 0
        for h in range(Nh):
            A = R[i, h, 0]
            B = R[i, h, 1]
            base = h * Ns
            for n in range(H):
                re = A[n] - B[H + n]
                im = A[H + n] + B[n]
                power[base + n] = re * re + im * im
            for m in range(Ns - H):  # node Ns - 1 - m: node m mirrored
                re = A[m] + B[H + m]
                im = B[m] - A[H + m]
                power[base + Ns - 1 - m] = re * re + im * im
            row_top = np.int32(0)
            for n in range(base, base + Ns):
                row_top = max(row_top, bits[n])
            if row_top > top:
                top = row_top
                top_row = h
        flat = top_row * Ns
        while bits[flat] != top:
            flat += 1
        k = start + i
        best[k] = flat
        for j, other in enumerate((flat, flat - Ns, flat + Ns, flat - v_stride, flat + v_stride)):
            other = min(max(other, 0), Nh * Ns - 1)
            peaks[k, j] = np.float32(math.sqrt(np.float64(power[other])))


def _residuals(phase0, vmask, model, ambiguity, residual):
    """The residual phase ``wrap(phase0 - model)`` and the ambiguities ``rint((model + residual
    - phase0) / 2 pi)`` of one item, :data:`MISSING_AMBIGUITY` and NaN at missing epochs."""
    for t in range(phase0.shape[0]):
        wrapped = _wrap(phase0[t] - model[t])
        cycles = np.int32(np.rint((model[t] + wrapped - phase0[t]) / _TWO_PI))
        valid = vmask[t] > 0
        ambiguity[t] = cycles if valid else _MISSING
        residual[t] = wrapped if valid else np.nan


def _items(phase, h2ph, years_shared, heights, grid_shared, best_node, peaks, n_velocity, steps,
           m2ph, refine, rcond, limits, iterations, theta_out, offset_out, coherence_out,
           grid_out, ambiguity_out, residual_out, n_valid_out, flag_out, ok_out):
    """Every output of the reference's ``_periodogram_batch`` from its coarse stage's best
    node (flat, height-major) and grid powers there and at its neighbours, item by item, before
    the flags' NaNs (set by the caller). ``h2ph`` (K or 1, T); ``years_shared`` (T, P - 1) is
    ``m2ph * [t, g_e...]``; ``limits`` the reference's refine tolerance, coherence tie, grid
    precision and series reach (arguments, not globals, which a cached compilation would keep
    after the reference changed them). The Newton iterations run in float64 (the reference's in
    float32)."""
    tolerance, tie, grid_precision, series_reach = limits
    K, T = phase.shape
    Nh = heights.shape[0]
    Ns = grid_shared.shape[0]
    P = years_shared.shape[1] + 1
    Q = P + 1
    v_stride = Ns // n_velocity
    phase0, vmask = np.empty(T), np.empty(T)
    r, c, s, c2, s2, w, g = (np.empty(T), np.empty(T), np.empty(T), np.empty(T), np.empty(T),
                             np.empty(T), np.empty(T))
    N, b, x, work = np.empty((Q, Q)), np.empty(Q), np.empty(Q), np.empty((5, Q, Q))
    design = np.ones((Q, T))  # [height_t, shared_t..., 1]; the height's row per item
    design[1:P] = years_shared.T
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
            design[0, t] = m2ph * hh if ok else 0.0
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
        _normal_equations(vmask, g, design, N, b)
        ok_out[k] = _solve(N, b, rcond, x, work)

        grid_only = not refine
        if refine:
            for p in range(P):
                theta[p] = grid[p]
            theta[0] += _vertex(p0, peaks[k, 1], peaks[k, 2], flat // Ns, Nh) * steps[0]
            theta[1] += _vertex(p0, peaks[k, 3], peaks[k, 4], (flat // v_stride) % n_velocity,
                                n_velocity) * steps[1]
            C, S = _evaluate(phase0, vmask, design, theta, r, c, s)
            best[:] = theta
            best_coh = math.sqrt(C * C + S * S) / n1
            at_best = True  # c, s hold the cosines and sines at best
            started = False
            for it in range(iterations):
                accepted = _newton(c, s, C, S, design, rcond, w, g, N, b, x, work, step)
                started = accepted if it == 0 else started
                for p in range(P):
                    theta[p] += step[p]
                C, S = _evaluate(phase0, vmask, design, theta, r, c, s)
                coh = math.sqrt(C * C + S * S) / n1
                at_best = coh >= best_coh - tie
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
                C, S = _evaluate(phase0, vmask, design, best, r, c, s)
            _newton(c, s, C, S, design, rcond, w, g, N, b, x, work, step)
            _model(design, step, 0.0, r)  # the step's change of the model phase
            far = False
            for t in range(T):
                far |= abs(r[t]) > series_reach
            for p in range(P):
                polished[p] = best[p] + step[p]
            if far:
                C2, S2 = _evaluate(phase0, vmask, design, polished, r, c2, s2)
            else:
                C2, S2 = _moved_sums(c, s, r)
            if math.sqrt(C2 * C2 + S2 * S2) / n1 >= math.sqrt(C * C + S * S) / n1 - tie:
                theta[:] = polished
                C, S = C2, S2
            else:
                theta[:] = best
            # the grid node where the refinement could not start or ended below the grid's
            # coherence (complex64 precision there)
            reached = math.sqrt(C * C + S * S) / n1 >= grid_coh - grid_precision
            grid_only = not (started and reached)
        if grid_only:
            theta[:] = grid
            C, S = _evaluate(phase0, vmask, design, theta, r, c, s)

        # the constant phase, residuals and ambiguities at the estimate
        coherence_out[k] = math.sqrt(C * C + S * S) / n1
        offset = math.atan2(S, C)
        offset_out[k] = offset
        grid_out[k] = grid_coh
        _model(design, theta, offset, r)
        _residuals(phase0, vmask, r, ambiguity_out[k], residual_out[k])
        theta_out[k] = theta
        flag_out[k] = _GRID_ONLY if (refine and grid_only) else 0


if AVAILABLE:
    _wrap = numba.njit(inline="always")(_wrap)
    _sincos1 = numba.njit(inline="always")(_sincos1)
    _sincos = numba.njit(_sincos)
    _grid_phasors = jit_cached(_grid_phasors)
    _grid_best = jit_cached(_grid_best)
    _model = numba.njit(_model)
    _evaluate = numba.njit(_evaluate)
    _moved_sums = numba.njit(fastmath=_REDUCTION_MATH)(_moved_sums)
    _residuals = numba.njit(_residuals)
    _masked_sums = numba.njit(fastmath=_REDUCTION_MATH)(_masked_sums)
    _solve = numba.njit(_solve)
    _normal_equations = numba.njit(fastmath=_REDUCTION_MATH)(_normal_equations)
    _newton = numba.njit(_newton)
    _vertex = numba.njit(_vertex)
    _items = jit_cached(_items)


def samples():
    """The three cached kernels with arguments of the types :func:`fused_batch` passes them."""
    f4, f8, i8 = np.float32, np.float64, np.int64
    a2, a1 = sample_array(f8, 2), sample_array(f8, 1)
    return [
        (_grid_phasors, (a2, a2, 1.0, a1, 0, sample_array(f4, 4), a2)),
        (_grid_best, (sample_array(f4, 4), 1, 1, 0, sample_array(i8, 1), sample_array(f4, 2),
                      sample_array(f4, 1))),
        (_items, (a2, a2, a2, a1, a2, sample_array(i8, 1), sample_array(f4, 2), 1, a1, 1.0,
                  True, 1.0, (1.0, 1.0, 1.0, 1.0), 1, a2, a1, a1, a1,
                  sample_array(np.int32, 2), a2, sample_array(i8, 1),
                  sample_array(FLAG_DTYPE, 1), sample_array(np.bool_, 1))),
    ]


def ready() -> bool:
    """Whether :func:`fused_batch` runs compiled in this process
    (:func:`numba_support.ready`)."""
    return AVAILABLE and numba_support.ready(__name__, samples)


def mirrored_half(shared) -> int | None:
    """``H`` when the grid's shared nodes (Ns, 1 + E) are symmetric about zero, node
    ``Ns - 1 - n`` the negative of node ``n`` (symmetric ranges, as the defaults): the first
    ``H = ceil(Ns / 2)`` nodes then give the others' phasors as conjugates. None otherwise.

    Examples
    --------
    >>> mirrored_half(np.array([[-1.0], [0.0], [1.0]])), mirrored_half(np.array([[0.0], [1.0]]))
    (2, None)
    """
    scale = float(np.abs(shared).max(initial=0.0))
    if not np.allclose(shared[::-1], -shared, rtol=0, atol=1e-12 * scale):
        return None
    return (shared.shape[0] + 1) // 2


def grid_block_items(n_epochs: int, n_heights: int, half: int) -> int:
    """Items per block of :func:`_mirrored_coarse`: their height phasors and GEMM products
    (``8 Nh (T + 2H)`` bytes an item) within :data:`GRID_BLOCK_BYTES`.

    Examples
    --------
    >>> grid_block_items(60, 15, 37)
    65
    """
    return max(1, GRID_BLOCK_BYTES // (8 * n_heights * (n_epochs + 2 * half)))


def _mirrored_coarse(phase, h2ph, t, extra_g, grid, m2ph, half):
    """Best node and the powers around it (the reference's ``_coarse_search``) on a grid with
    mirrored shared nodes: the phasors' real and imaginary parts times the cosines and sines of
    half the nodes, one real GEMM (float32) of half the multiplications of the complex one,
    in blocks of :func:`grid_block_items`."""
    K, T = phase.shape
    Nh, Ns = grid.heights.shape[0], grid.shared.shape[0]
    regressors = np.stack([t] + list(extra_g), axis=0)
    phasors = np.exp(-1j * m2ph * (grid.shared[:half] @ regressors)).T  # (T, H)
    table = np.ascontiguousarray(np.concatenate([phasors.real, phasors.imag], axis=1),
                                 dtype=np.float32)  # (T, 2H)
    block = max(1, min(K, grid_block_items(T, Nh, half)))
    X = np.empty((block, Nh, 2, T), dtype=np.float32)
    R = np.empty((block * Nh * 2, 2 * half), dtype=np.float32)
    work, power = np.empty((7, T)), np.empty(Nh * Ns, dtype=np.float32)
    best = np.empty(K, dtype=np.int64)
    peaks = np.empty((K, 5), dtype=np.float32)
    heights = np.asarray(grid.heights, dtype=np.float64)
    v_stride = Ns // grid.velocity_count
    for start in range(0, K, block):
        n = min(block, K - start)
        _grid_phasors(phase, h2ph, m2ph, heights, start, X[:n], work)
        np.matmul(X[:n].reshape(n * Nh * 2, T), table, out=R[:n * Nh * 2])
        _grid_best(R[:n * Nh * 2].reshape(n, Nh, 2, 2 * half), Ns, v_stride, start, best, peaks,
                   power)
    return best, peaks


def _reference_coarse(phase, h2ph, grid, tables, m2ph, reference: Reference):
    """The reference's coarse stage as it is: the same phasors, complex GEMM and argmax."""
    K, T = phase.shape
    h2ph_full = np.broadcast_to(h2ph, (K, T))
    valid = np.isfinite(phase) & np.isfinite(h2ph_full)
    z = reference.unit_phasors(np, wrap_phase(np.where(valid, phase, 0.0))) * valid
    E_shared, E_full = tables
    alpha = None
    if E_full is None:
        alpha = (-m2ph * np.where(valid, h2ph_full, 0.0)).astype(np.float32)
    Nh, Ns = grid.heights.shape[0], grid.shared.shape[0]
    block = reference.coarse_block_items(T, Nh, Nh * Ns)
    return reference.coarse_search(
        np, z, alpha, grid.heights.astype(np.float32), E_shared, E_full,
        (Ns, Ns // grid.velocity_count), max(block, 1))


def fused_batch(xp, phase, h2ph, t, extra_g, grid, tables, steps, m2ph, refine, rcond, *,
                reference: Reference):
    """``periodogram._periodogram_batch`` for NumPy inputs, the same fields in the same order.

    The coarse stage by :func:`_mirrored_coarse` where the grid is symmetric (the default
    ranges), else the reference's own; then :func:`_items` for the rest."""
    K, T = phase.shape
    phase = np.ascontiguousarray(phase, dtype=np.float64)
    h2ph = np.ascontiguousarray(h2ph, dtype=np.float64)
    half = mirrored_half(grid.shared) if MIRRORED_GRID else None
    if half is not None and K:
        best, peaks = _mirrored_coarse(phase, h2ph.reshape(-1, T), t, extra_g, grid, m2ph,
                                       half)
    else:
        best, peaks = _reference_coarse(phase, h2ph, grid, tables, m2ph, reference)

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
               (reference.refine_tolerance, reference.coherence_tie, reference.grid_precision,
                reference.series_reach), reference.refine_iterations, theta, offset,
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
