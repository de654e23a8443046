"""Periodogram (ensemble coherence) estimation of height error, velocity and more, per arc or point.

For each of K items (arcs or points) with wrapped phase ``phase_kt``, the estimate maximises the
ensemble coherence

    gamma_k(theta) = | mean_t exp(j (phase_kt - model_kt(theta))) |,
    model_kt = m2ph * (velocity * t + h2ph_kt * height_error + sum_e coef_e * g_et),

with ``m2ph = -4 pi / wavelength`` (docs/design.md, "Conventions: signs and units"). A constant
phase per item (the argument of the mean above, returned as ``offset``) is implied, since the
coherence ignores it.

The search has two stages, both vectorised over items:

1. **Coarse grid**: the model is separable, so the coherence over a grid of
   (height error) x (velocity, extra terms) is a complex matrix product. For shared ``h2ph``
   one GEMM ``exp(j phase) @ E`` with ``E`` the (T, n_grid) model phasors; for per-item ``h2ph``
   the height phasors ``(K, Nh, T)`` (built by repeated doubling, no per-node exponentials)
   times the shared (T, Ns) phasors of the other terms. complex64, in cache-sized blocks of
   items on the CPU (:data:`COARSE_BLOCK_BYTES`).
2. **Refinement**: from the vertex of parabolas through the best node and its neighbours
   (height and velocity axes), Newton iterations on ``sum_t cos(r_t)`` (the real part of the
   coherence at the best constant phase, r the residual phase), with the constant phase as an
   extra unknown; epochs with ``|r| > pi/2`` are left out of a step, items that have converged
   leave the working set. The iterations take float32 cosines and sines of the float64
   residual (NumPy's float64 ones are not vectorised), then one float64 Newton step from the
   best iterate converges quadratically to the float64 maximum. It lands far below the grid
   step; the best point visited is kept, and the grid node where the refinement could not
   start or ended below the grid's coherence (flag ``GRID_ONLY``).

Without baselines (``h2ph=None``) the height term is dropped: the velocity alone is searched on
a grid :data:`VELOCITY_ONLY_REFINE` times finer, with one GEMM and a parabolic vertex.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from depsi.conventions import MISSING_AMBIGUITY, phase_per_metre, wrap_phase
from depsi.kernels.backend import array_namespace, batch_size, device_of, to_host
from depsi.kernels.flags import FLAG_DTYPE, Flag
from depsi.kernels.lstsq import DEFAULT_RCOND, _solve_transposed

logger = logging.getLogger(__name__)

#: Largest change of the modelled phase across the epochs (after the constant phase, which the
#: coherence ignores) between two adjacent grid nodes, in radians: the default grid step of a
#: term with regressor g is ``GRID_PHASE_STEP / (|m2ph| * (max g - min g))``. The best node is
#: then within pi/4 of the peak's phase pattern, losing < 3 % of the coherence.
GRID_PHASE_STEP = np.pi / 2

#: Default search range of the height error (m), and of the velocity (m/yr): of an arc's
#: differences by default (depsi.processing.arcs.ArcsConfig reads the same constants).
DEFAULT_HEIGHT_RANGE = (-50.0, 50.0)
DEFAULT_VELOCITY_RANGE = (-0.05, 0.05)

#: Most Newton iterations of the refinement; each costs a few passes over the phase. From the
#: parabolic vertex they converge quadratically, typically in 2 to 4.
REFINE_ITERATIONS = 8

#: An item's float32 iterations stop once no estimate moved by more than this fraction of its
#: grid step; the float64 Newton step that follows squares that error. Measured on 50,000 arcs
#: of 60 epochs against iterations run to 1e-9: the same largest height error (4e-4 m, on a
#: flat peak) as 1e-6 gave, sub-micrometre at the 99th percentile, a quarter fewer
#: iterations.
REFINE_TOLERANCE = 1e-3

#: The velocity-only search (``h2ph=None``) runs on a grid this many times finer than the
#: default step, then takes the vertex of the parabola through the best node's neighbours: one
#: GEMM and no Newton iterations, as nothing but the velocity and the constant phase is fitted.
VELOCITY_ONLY_REFINE = 8

_TWO_PI = 2 * np.pi

#: Coherences closer than this are equal: at the peak the coherence is flat to round-off, and
#: the later (more converged) Newton iterate should win such ties.
_COHERENCE_TIE = 1e-14

#: Precision of the coarse-grid coherence (complex64 sums over the epochs).
_GRID_PRECISION = 1e-5

#: Whether :func:`periodogram` runs the fused compiled kernel for NumPy inputs by default
#: (:mod:`depsi.kernels.periodogram_numba`, when Numba can be imported); its ``fused`` argument
#: overrides it per call. False (or ``DEPSI_FUSED_KERNELS=0`` in the environment at import,
#: for whole runs such as ``bench_scale.py``): this module's array-namespace kernel, the
#: reference.
USE_FUSED = os.environ.get("DEPSI_FUSED_KERNELS", "1") != "0"

#: Bytes of height phasors and grid sums per block of the coarse search on the CPU: blocks this
#: size stay in a core's private cache between the phasors' build, the GEMM and the moduli
#: (docs/benchmarks.md, "Array operations").
COARSE_BLOCK_BYTES = 8 << 20


def ensemble_coherence(residual_phase: Any) -> Any:
    """``|mean_t exp(j r_t)|`` over the last axis, NaN epochs ignored (NaN if none is valid).

    Examples
    --------
    >>> float(ensemble_coherence(np.array([0.1, 0.1, np.nan])).round(6))
    1.0
    """
    xp = array_namespace(residual_phase)
    valid = xp.isfinite(residual_phase)
    r = xp.where(valid, residual_phase, 0.0)
    n = valid.sum(axis=-1)
    s = xp.abs((xp.cos(r) * valid).sum(axis=-1) + 1j * (xp.sin(r) * valid).sum(axis=-1))
    return xp.where(n > 0, s / xp.maximum(n, 1), xp.nan)


def mean_phasor(residual_phase: np.ndarray) -> np.ndarray:
    """``mean_t exp(j r_t)`` over the last axis of a float64 residual phase (NaN where a row
    holds NaN), from float32 cosines and sines of the residual less whole cycles, summed in
    float64 (absolute error about 1e-7): no complex temporary, 4x faster than NumPy's complex
    exponential, which :func:`ensemble_coherence` keeps where float64 is owed."""
    residual_phase = np.asarray(residual_phase, dtype=np.float64)
    reduced = residual_phase - np.rint(residual_phase * (1.0 / _TWO_PI)) * _TWO_PI
    reduced = reduced.astype(np.float32)
    return (np.cos(reduced).sum(axis=-1, dtype=np.float64)
            + 1j * np.sin(reduced).sum(axis=-1, dtype=np.float64)) / residual_phase.shape[-1]


def result_coherence(residual_phase: np.ndarray) -> np.ndarray:
    """``|mean_t exp(j r_t)|`` for the float32 ``temporal_coherence`` of results, by
    :func:`mean_phasor` (its absolute error, about 1e-7, is the result's own precision).

    Examples
    --------
    >>> float(result_coherence(np.array([0.1, 0.1 + 2 * np.pi, 0.1 - 40 * np.pi])).round(6))
    1.0
    """
    return np.abs(mean_phasor(residual_phase))


def grid_nodes(low: float, high: float, step: float) -> np.ndarray:
    """Nodes from ``low`` to ``high`` inclusive, evenly spaced by at most ``step``.

    ``n = ceil((high - low) / step) + 1`` nodes; one node at the middle when ``step`` is
    infinite or ``low == high``.

    Examples
    --------
    >>> grid_nodes(-1.0, 1.0, 0.5).tolist()
    [-1.0, -0.5, 0.0, 0.5, 1.0]
    >>> grid_nodes(-1.0, 1.0, np.inf).tolist()
    [0.0]
    """
    low, high, step = float(low), float(high), float(step)
    if not high >= low:
        raise ValueError(f"grid range: expected low <= high, found ({low}, {high})")
    if not step > 0:
        raise ValueError(f"grid step: expected > 0, found {step}")
    if high == low or not math.isfinite(step):
        return np.array([(low + high) / 2])
    n = int(math.ceil((high - low) / step - 1e-9)) + 1
    return np.linspace(low, high, max(n, 2))


def default_step(span: float, wavelength: float) -> float:
    """Grid step of a term whose regressor spans ``span`` (``max g - min g``): the modelled phase
    changes by at most :data:`GRID_PHASE_STEP` across the epochs between adjacent nodes.

    Examples
    --------
    >>> round(default_step(5.0, 0.0555) * 1000, 2)  # mm/yr for a 5-year span, C band
    1.39
    """
    span = float(span)
    if not span > 0:
        return math.inf
    return GRID_PHASE_STEP / (abs(phase_per_metre(wavelength)) * span)


@dataclass(frozen=True)
class PeriodogramResult:
    """Result of :func:`periodogram` for K items and T epochs; arrays on the input's device.

    Attributes
    ----------
    height_error : (K,) float64
        Height error (m); NaN where ``flag`` is 1 or 2.
    velocity : (K,) float64
        Velocity (m/yr); NaN where ``flag`` is 1 or 2.
    extra : dict of str to (K,) float64
        Coefficient of each extra regressor (m per unit of the regressor).
    offset : (K,) float64
        The constant phase (rad) ``arg sum_t exp(j (phase_t - model_t))`` at the estimate.
    coherence : (K,) float64
        Ensemble coherence ``|mean_t exp(j (phase_t - model_t))|`` at the estimate (0..1).
    grid_coherence : (K,) float64
        The largest coherence on the coarse grid (complex64 sums: ~1e-6 relative precision).
    ambiguity : (K, T) int32
        Integer cycles ``a_t`` with ``phase_t + 2 pi a_t = model_t + offset + residual_phase_t``:
        ``phase + 2 pi ambiguity`` is the unwrapped phase.
        :data:`~depsi.conventions.MISSING_AMBIGUITY` where the epoch is missing.
    residual_phase : (K, T) float64
        ``wrap(phase_t - model_t - offset)`` in ``(-pi, pi]``; NaN where the epoch is missing.
    n_valid : (K,) int
        Epochs used (finite phase and h2ph).
    flag : (K,) int8
        :class:`~depsi.kernels.flags.Flag`: 0 ok; 2 fewer valid epochs than unknowns + 1;
        1 the model is singular on the valid epochs (e.g. ``h2ph`` constant); 5 ``GRID_ONLY``:
        the refinement could not start (its first Newton system was singular, typically with
        too few epochs within pi/2 of the model) or ended below the grid's coherence; the grid
        node is returned.
    """

    height_error: Any
    velocity: Any
    offset: Any
    coherence: Any
    grid_coherence: Any
    ambiguity: Any
    residual_phase: Any
    n_valid: Any
    flag: Any
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Grid:
    """The search grid: height nodes, and the shared terms' (velocity, extras) node table."""

    heights: np.ndarray  # (Nh,)
    shared: np.ndarray  # (Ns, 1 + E): velocity and extra coefficients of each shared node
    names: list[str]  # extra regressor names, in column order of shared[:, 1:]
    velocity_count: int  # velocity is the slowest-varying axis of the shared nodes


def _parse_extra(extra_regressors, T: int, wavelength: float):
    """names, regressors (E, T), ranges [(lo, hi)], steps from the user mapping."""
    names, values, ranges, steps = [], [], [], []
    for name, spec in (extra_regressors or {}).items():
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
            raise ValueError(f"extra_regressors[{name!r}]: expected (values, (low, high)) or "
                             f"(values, (low, high), step), found {type(spec).__name__}")
        g = np.asarray(spec[0], dtype=np.float64)
        if g.shape != (T,) or not np.isfinite(g).all():
            raise ValueError(f"extra_regressors[{name!r}]: expected {T} finite values (one per "
                             f"epoch), found shape {g.shape}")
        lo, hi = (float(v) for v in spec[1])
        step = float(spec[2]) if len(spec) == 3 and spec[2] is not None else default_step(
            float(g.max() - g.min()), wavelength)
        names.append(str(name))
        values.append(g)
        ranges.append((lo, hi))
        steps.append(step)
    return names, values, ranges, steps


def _build_grid(heights, velocities, extra_nodes, names) -> _Grid:
    axes = [np.asarray(velocities)] + [np.asarray(n) for n in extra_nodes]
    mesh = np.meshgrid(*axes, indexing="ij")
    shared = np.stack([m.ravel() for m in mesh], axis=1)
    return _Grid(np.asarray(heights, dtype=np.float64), shared, names, len(axes[0]))


def _unit_phasors(xp, angle):
    """``exp(j angle)`` as complex64, from float32 cosines and sines written into its halves.

    The precision of complex64. NumPy's complex ``exp`` has no vectorised loop: this is about
    25 times faster on the CPU.
    """
    angle = angle.astype(xp.float32, copy=False)
    out = xp.empty(angle.shape, dtype=xp.complex64)
    halves = out.view(xp.float32).reshape(angle.shape + (2,))
    xp.cos(angle, out=halves[..., 0])
    xp.sin(angle, out=halves[..., 1])
    return out


def _height_phasors(xp, z, alpha, heights, out=None):
    """``z_kt * exp(j alpha_kt * H_h)`` for an evenly spaced ``heights`` grid: (K, Nh, T).

    Built by repeated doubling from the first node and the step (log2(Nh) multiplications of
    growing slabs instead of Nh * T complex exponentials per item), into ``out`` when given.
    """
    K, T = z.shape
    Nh = heights.shape[0]
    if out is None:
        out = xp.empty((K, Nh, T), dtype=xp.complex64)
    out[:, 0] = z * _unit_phasors(xp, alpha * heights[0])
    if Nh == 1:
        return out
    power = _unit_phasors(xp, alpha * (heights[1] - heights[0]))
    done = 1
    while done < Nh:
        m = min(done, Nh - done)
        xp.multiply(out[:, :m], power[:, None, :], out=out[:, done:done + m])
        done += m
        power = power * power
    return out


def _phasor_tables(xp, grid: _Grid, t, extra_g, m2ph, shared_h2ph):
    """Model phasors of the grid, built once per call on the host, stored complex64 on device.

    Returns ``(E_shared (T, Ns), E_full (T, Nh * Ns) or None)``; ``E_full`` (height included) only
    when ``h2ph`` is shared by all items.
    """
    regressors = np.stack([t] + list(extra_g), axis=0)  # (1 + E, T)
    shared_phase = -m2ph * (grid.shared @ regressors)  # (Ns, T): -m2ph (v t + sum_e c_e g_e)
    E_shared = xp.asarray(np.exp(1j * shared_phase).T.astype(np.complex64))
    if shared_h2ph is None:
        return E_shared, None
    height_phase = -m2ph * grid.heights[:, None] * shared_h2ph[None, :]  # (Nh, T)
    full = (height_phase[:, None, :] + shared_phase[None, :, :]).reshape(-1, t.shape[0])
    return E_shared, xp.asarray(np.exp(1j * full).T.astype(np.complex64))


def coarse_block_items(n_epochs: int, n_heights: int, n_nodes: int) -> int:
    """Items per block of the coarse search on the CPU: its height phasors, grid sums and their
    moduli (``8 Nh T + 12 N`` bytes an item, N grid nodes) within :data:`COARSE_BLOCK_BYTES`.

    Examples
    --------
    >>> coarse_block_items(60, 15, 435)
    675
    """
    per_item = 8 * n_heights * n_epochs + 12 * n_nodes
    return max(1, COARSE_BLOCK_BYTES // per_item)


def _neighbour_powers(xp, power, best, strides):
    """Columns ``[p(best), p(best - s), p(best + s) for s in strides]`` of ``power`` (K, N)
    (indices clipped to the grid: the vertex ignores neighbours off the axis)."""
    size = power.shape[1]
    index = [best] + [i for s in strides for i in (best - s, best + s)]
    index = xp.clip(xp.stack(index, axis=1), 0, size - 1)
    return xp.take_along_axis(power, index, axis=1)


def _coarse_search(xp, z, alpha, heights32, E_shared, E_full, strides, block):
    """Best grid node (height-major flat index) per item, and the grid power there and at its
    neighbours ``best -+ s`` for each stride (:func:`_neighbour_powers`).

    z (K, T) complex64, zero at missing epochs; alpha (K, T) = -m2ph * h2ph, used when the
    height phasors are per item (``E_full`` None). Items go through in blocks of ``block``
    (cache-sized on the CPU), so the height phasors and grid sums never leave the cache.
    """
    K, T = z.shape
    Nh = heights32.shape[0]
    best = xp.empty(K, dtype=xp.int64)
    peaks = xp.empty((K, 1 + 2 * len(strides)), dtype=xp.float32)
    buffer = None
    if E_full is None:
        buffer = xp.empty((min(block, K), Nh, T), dtype=xp.complex64)
    for start in range(0, K, block):
        stop = min(start + block, K)
        if E_full is not None:
            C = z[start:stop] @ E_full
        else:
            Zh = _height_phasors(xp, z[start:stop], alpha[start:stop], heights32,
                                 out=buffer[: stop - start])
            C = (Zh.reshape(-1, T) @ E_shared).reshape(stop - start, -1)
        power = xp.abs(C)
        best[start:stop] = power.argmax(axis=1)
        peaks[start:stop] = _neighbour_powers(xp, power, best[start:stop], strides)
    return best, peaks


def _vertex_offsets(xp, p0, pm, pp, index, n_nodes):
    """Offset (in grid steps, within +-1/2) of the vertex of the parabola through powers
    ``pm, p0, pp`` at nodes ``index - 1, index, index + 1`` of an axis of ``n_nodes``; 0 at the
    axis' ends or where the three are not concave."""
    inner = (index > 0) & (index < n_nodes - 1)
    curvature = pm - 2 * p0 + pp
    ok = inner & (curvature < 0)
    offset = 0.5 * (pm - pp) / xp.where(ok, curvature, -1.0)
    return xp.clip(xp.where(ok, offset, 0.0), -0.5, 0.5).astype(xp.float64)


def _parabolic_offsets(xp, power, best, n_nodes, stride):
    """Offset (in grid steps, within +-1/2) of the vertex of the parabola through the best node
    and its two neighbours along one grid axis (nodes ``stride`` apart in the flat index)."""
    p0, pm, pp = (_neighbour_powers(xp, power, best, [stride])[:, i] for i in range(3))
    return _vertex_offsets(xp, p0, pm, pp, (best // stride) % n_nodes, n_nodes)


@dataclass(frozen=True)
class _Model:
    """The model phase's regressors: the height's per item, the other terms' shared.

    ``height`` (K, T) is ``m2ph * h2ph``, zero at missing epochs; ``shared`` (T, P - 1) holds
    ``m2ph * t`` and ``m2ph * g_e``; ``with_constant`` (T, P) adds the constant phase's column of
    ones. The model phase of ``theta`` (P, K: height, velocity, extras) is
    ``theta_0 * height + theta_rest^T shared^T``, one GEMM instead of a (P, K, T) Jacobian.
    """

    height: Any
    shared: Any
    with_constant: Any

    def phase(self, theta):
        return theta[0][:, None] * self.height + theta[1:].T @ self.shared.T

    def subset(self, keep):
        return _Model(self.height[keep], self.shared, self.with_constant)

    def astype(self, dtype):
        return _Model(self.height.astype(dtype), self.shared.astype(dtype),
                      self.with_constant.astype(dtype))

    def normal_matrix(self, xp, w):
        """``sum_t w_kt x_p x_q`` over the regressors and the constant: (Q, Q, K) float64."""
        K, T = w.shape
        Q = self.with_constant.shape[1] + 1
        wh = w * self.height
        top = xp.concatenate([(wh * self.height).sum(axis=1)[:, None],
                              wh @ self.with_constant], axis=1)  # (K, Q)
        pairs = (self.with_constant[:, :, None] * self.with_constant[:, None, :]).reshape(T, -1)
        rest = (w @ pairs).reshape(K, Q - 1, Q - 1)
        N = xp.empty((Q, Q, K), dtype=xp.float64)
        N[0] = top.T
        N[1:, 0] = top[:, 1:].T
        N[1:, 1:] = rest.transpose(1, 2, 0)
        return N

    def right_side(self, xp, g):
        """``sum_t g_kt x_p`` over the regressors and the constant: (Q, K) float64."""
        return xp.concatenate([(g * self.height).sum(axis=1)[:, None],
                               g @ self.with_constant], axis=1).T.astype(xp.float64)


def _evaluate(xp, phase0, vmask, model: _Model, theta, dtype=np.float64):
    """cos and sin of the residual phase (without the constant), zero at missing epochs, in
    ``dtype``, and their sums over epochs (float64).

    With float32 the residual is wrapped in float64 first, so the cosines and sines carry
    float32's absolute error (~6e-8) whatever the cycles.
    """
    r = phase0 - model.phase(theta)
    if dtype != np.float64:
        # whole cycles off in float64 (the cosines and sines do not need wrap_phase's exact
        # (-pi, pi] bounds, which cost twice as much)
        r -= xp.rint(r * (1.0 / _TWO_PI)) * _TWO_PI
        r = r.astype(dtype)
    c = xp.cos(r)
    c *= vmask
    s = xp.sin(r)
    s *= vmask
    return c, s, c.sum(axis=1, dtype=xp.float64), s.sum(axis=1, dtype=xp.float64)


#: Largest model-phase change (rad) for which :func:`_moved_sums` uses its series: the first
#: terms left out, ``d^7 / 5040`` and ``d^8 / 40320``, are then below 2e-18.
_SERIES_REACH = 1e-2


def _moved_sums(xp, phase0, vmask, model: _Model, theta, c, s, delta):
    """The sums over epochs of ``cos`` and ``sin`` of the residual at ``theta``, from those
    ``c``, ``s`` (float64, masked) at a point whose model phase differs by ``delta`` (K, T):
    ``cos(r - d) = c cos d + s sin d`` with the cosine and sine of ``d`` as series, exact to
    float64 where ``|d| <=`` :data:`_SERIES_REACH` (a converged Newton step: about 1e-7 rad),
    and evaluated afresh elsewhere. NumPy's float64 cosines and sines take about 20 times as
    long as these few products."""
    d2 = delta * delta
    cos_d = 1.0 - d2 * (0.5 - d2 * (1.0 / 24 - d2 * (1.0 / 720)))
    sin_d = delta * (1.0 - d2 * (1.0 / 6 - d2 * (1.0 / 120)))
    C = (c * cos_d + s * sin_d).sum(axis=1)
    S = (s * cos_d - c * sin_d).sum(axis=1)
    far = xp.nonzero((xp.abs(delta) > _SERIES_REACH).any(axis=1))[0]
    if far.shape[0]:
        _, _, C[far], S[far] = _evaluate(xp, phase0[far], vmask[far], model.subset(far),
                                         theta[:, far])
    return C, S


def _newton_step(xp, model: _Model, c, s, C, S, rcond):
    """The Newton step on ``sum_t cos(r_t)`` from cosines ``c`` and sines ``s`` of the residual
    (sums ``C``, ``S``), relative to the best constant phase ``arg(C + jS)``; epochs with
    ``|r| > pi/2`` are left out. Returns the step of the model terms (P, K) and whether the
    system was accepted (zero step where not)."""
    norm = xp.sqrt(C * C + S * S)
    norm = xp.where(norm > 0, norm, 1.0)
    cc, ss = (C / norm).astype(c.dtype), (S / norm).astype(c.dtype)
    cos_r = c * cc[:, None] + s * ss[:, None]
    sin_r = s * cc[:, None] - c * ss[:, None]
    inside = cos_r > 0
    w = xp.where(inside, cos_r, 0.0)
    g = xp.where(inside, sin_r, 0.0)
    delta, _, ok = _solve_transposed(xp, model.normal_matrix(xp, w), model.right_side(xp, g),
                                     rcond)
    return xp.where(ok[None], delta[:-1], 0.0), ok


def _refine(xp, phase0, vmask, model: _Model, theta, n_valid, steps, rcond):
    """Newton iterations on sum_t cos(r_t) from ``theta``, then one in float64.

    The iterations take the cosines and sines in float32 (the float64 ones have no vectorised
    loop in NumPy: 20x slower); their error moves the fixed point by ~1e-8 rad of model phase,
    far below :data:`REFINE_TOLERANCE`. Items whose step fell below the tolerance leave the
    working set (it is compacted once half of it has converged), so a few slow items do not cost
    the whole batch more iterations. From the best theta visited, one more Newton step in float64
    converges quadratically to the float64 maximum; the better of the two is kept.

    Returns that theta, the sums ``C + jS`` of ``exp(j r_t)`` there (float64), and whether the
    Newton system at the start was accepted (it is not when too few epochs have
    ``|r| < pi/2``).
    """
    f4 = np.float32
    model32, vmask32 = model.astype(f4), vmask.astype(f4)
    c, s, C, S = _evaluate(xp, phase0, vmask32, model32, theta, f4)
    best = theta.copy()
    best_coh = xp.sqrt(C * C + S * S) / xp.maximum(n_valid, 1)
    started = None
    idx = xp.arange(theta.shape[1])  # the working set
    work_phase, work_mask, work_model = phase0, vmask32, model32
    moving = xp.ones(theta.shape[1], dtype=bool)
    for _ in range(REFINE_ITERATIONS):
        step, ok = _newton_step(xp, work_model, c, s, C, S, rcond)
        started = ok if started is None else started
        # an item that has converged stays where it is until the working set is compacted:
        # the iterations it takes do not depend on when the others of its batch converge
        step = xp.where(moving[None], step, 0.0)
        theta = theta + step
        c, s, C, S = _evaluate(xp, work_phase, work_mask, work_model, theta, f4)
        coh = xp.sqrt(C * C + S * S) / xp.maximum(n_valid[idx], 1)
        better = coh >= best_coh[idx] - _COHERENCE_TIE
        best[:, idx] = xp.where(better[None], theta, best[:, idx])
        best_coh[idx] = xp.where(better, coh, best_coh[idx])
        moving = (xp.abs(step) > REFINE_TOLERANCE * steps).any(axis=0)
        n_moving = int(moving.sum())
        if n_moving == 0:
            break
        if 2 * n_moving <= idx.shape[0]:
            keep = xp.nonzero(moving)[0]
            idx, theta, c, s, C, S = idx[keep], theta[:, keep], c[keep], s[keep], C[keep], S[keep]
            moving = moving[keep]
            work_phase, work_mask = work_phase[keep], work_mask[keep]
            work_model = work_model.subset(keep)

    # the float64 step from the best float32 iterate
    c, s, C, S = _evaluate(xp, phase0, vmask, model, best)
    step, _ = _newton_step(xp, model, c, s, C, S, rcond)
    polished = best + step
    C2, S2 = _moved_sums(xp, phase0, vmask, model, polished, c, s, model.phase(step))
    n = xp.maximum(n_valid, 1)
    better = xp.sqrt(C2 * C2 + S2 * S2) / n >= xp.sqrt(C * C + S * S) / n - _COHERENCE_TIE
    theta = xp.where(better[None], polished, best)
    return theta, xp.where(better, C2, C), xp.where(better, S2, S), started


def periodogram_bytes_per_item(n_epochs: int, n_heights: int, n_shared: int,
                               n_terms: int) -> int:
    """Peak bytes :func:`periodogram` needs per item, for sizing batches.

    Held through the batch: the phase and h2ph in float64, masks, the unit phasors and the
    regressors, at most ``(64 + 8 Q) T``; on top, the coarse stage (complex64: height phasors
    ``8 Nh T``, grid sums ``8 Nh Ns``, their moduli ``4 Nh Ns``; an upper bound, as it runs in
    blocks of :data:`COARSE_BLOCK_BYTES` on the CPU) or the refinement (about a dozen ``(T,)``
    temporaries, float32 in its iterations and float64 in its last step), ``Q = n_terms + 1``.

    Examples
    --------
    >>> periodogram_bytes_per_item(60, 50, 50, 2)
    59280
    """
    T, Q = n_epochs, n_terms + 1
    coarse = 8 * n_heights * T + 12 * n_heights * n_shared
    refine = 8 * T * (Q + 12) + 8 * Q * Q * 4
    return max(coarse, refine) + (64 + 8 * Q) * T


def velocity_search_bytes_per_item(n_epochs: int, n_nodes: int) -> int:
    """Peak bytes of the velocity-only search (``h2ph=None``) per item, for sizing batches.

    The grid sums and their moduli (complex64 and float32, ``12 N`` for ``N`` velocity nodes),
    the unit phasors (``8 T``) and about seven float64 ``(T,)`` temporaries.

    Examples
    --------
    >>> velocity_search_bytes_per_item(60, 600)
    11040
    """
    return 12 * n_nodes + 64 * n_epochs


def _velocity_search(xp, phase, t, *, wavelength, velocity_range, velocity_step, refine,
                     max_batch):
    """:func:`periodogram` without a height term: one GEMM over a fine velocity grid."""
    m2ph = phase_per_metre(wavelength)
    step = velocity_step or default_step(float(np.ptp(t)), wavelength) / VELOCITY_ONLY_REFINE
    nodes = grid_nodes(*velocity_range, step)
    spacing = nodes[1] - nodes[0] if nodes.size > 1 else 0.0
    table = xp.asarray(np.exp(-1j * m2ph * np.outer(t, nodes)).astype(np.complex64))  # (T, N)
    K, T = phase.shape
    logger.debug("periodogram (velocity only): %d items, %d epochs, %d velocity nodes",
                 K, T, nodes.size)
    size = batch_size(velocity_search_bytes_per_item(T, nodes.size), device_of(phase),
                      max_items=max(K, 1), fit_cache=True)
    if max_batch is not None:
        size = max(1, min(size, int(max_batch)))
    parts = [_velocity_batch(xp, phase[start:start + size], xp.asarray(t), nodes, spacing,
                             table, m2ph, refine)
             for start in range(0, max(K, 1), size)]
    return PeriodogramResult(*[xp.concatenate(f) for f in zip(*parts)])


def _velocity_batch(xp, phase, t, nodes, spacing, table, m2ph, refine):
    """One batch of :func:`_velocity_search`: the PeriodogramResult fields in order."""
    K = phase.shape[0]
    phase = phase.astype(xp.float64, copy=False)
    valid = xp.isfinite(phase)
    n_valid = valid.sum(axis=1)
    phase0 = xp.where(valid, phase, 0.0)
    z = xp.where(valid, xp.exp(1j * phase0), 0.0).astype(xp.complex64)
    power = xp.abs(z @ table)  # (K, N) float32
    best = power.argmax(axis=1)
    shift = (_parabolic_offsets(xp, power, best, nodes.size, 1) if refine
             else xp.zeros(K))
    velocity = xp.asarray(nodes)[best] + shift * spacing
    grid_coh = (xp.take_along_axis(power, best[:, None], axis=1)[:, 0].astype(xp.float64)
                / xp.maximum(n_valid, 1))

    # the constant phase, residuals and ambiguities at the estimate
    model = m2ph * velocity[:, None] * t[None, :]
    offset = xp.angle(xp.sum(z * xp.exp(-1j * model), axis=1))
    wrapped = wrap_phase(phase0 - model - offset[:, None])
    residual = xp.where(valid, wrapped, xp.nan)
    coherence = ensemble_coherence(residual)
    cycles = xp.rint((model + offset[:, None] + wrapped - phase0) / _TWO_PI)
    ambiguity = xp.where(valid, cycles, MISSING_AMBIGUITY).astype(xp.int32)

    too_few = n_valid < 2  # velocity and the constant phase
    flag = xp.where(too_few, int(Flag.TOO_FEW_OBSERVATIONS), int(Flag.OK)).astype(FLAG_DTYPE)
    velocity = xp.where(too_few, xp.nan, velocity)
    empty = n_valid == 0
    offset = xp.where(empty, xp.nan, offset)
    grid_coh = xp.where(empty, xp.nan, grid_coh)
    return (xp.zeros(K), velocity, offset, coherence, grid_coh, ambiguity, residual, n_valid,
            flag)


def periodogram(
    phase: Any,
    h2ph: Any,
    time_years: Any,
    *,
    wavelength: float,
    height_range: tuple[float, float] = DEFAULT_HEIGHT_RANGE,
    height_step: float | None = None,
    velocity_range: tuple[float, float] = DEFAULT_VELOCITY_RANGE,
    velocity_step: float | None = None,
    extra_regressors: Mapping[str, tuple] | None = None,
    refine: bool = True,
    rcond: float = DEFAULT_RCOND,
    max_batch: int | None = None,
    fused: bool | None = None,
) -> PeriodogramResult:
    """Height error, velocity (and extra terms) maximising the ensemble coherence of each item.

    Parameters
    ----------
    phase : (K, T)
        Wrapped phase (rad) of K arcs or points; NaN epochs are ignored.
    h2ph : (K, T) or (T,) or None
        Height-to-phase factors, per item or shared; NaN marks the epoch missing. ``None``: no
        height term, for a stack without baselines (see Notes).
    time_years : (T,)
        Time baselines (years) from the reference epoch.
    wavelength
        Radar wavelength (m); ``m2ph = -4 pi / wavelength``.
    height_range, velocity_range
        Search ranges (m, m/yr), inclusive; defaults :data:`DEFAULT_HEIGHT_RANGE`,
        :data:`DEFAULT_VELOCITY_RANGE`.
    height_step, velocity_step
        Grid steps; default from :func:`default_step` (the modelled phase changes by at most
        :data:`GRID_PHASE_STEP` across the epochs between adjacent nodes). The grid is
        :func:`grid_nodes` ``(low, high, step)``.
    extra_regressors
        More shared terms, name to ``(values (T,), (low, high))`` or
        ``(values, (low, high), step)``; values in metres of displacement per unit coefficient,
        e.g. ``{"seasonal_sin": (np.sin(2 * np.pi * t), (-0.01, 0.01))}``. Each multiplies the
        size of the grid by its number of nodes.
    refine
        Refine below the grid step (Newton iterations on the coherence). With ``False`` the best
        grid node is returned.
    rcond
        Reciprocal condition bound of the model on the valid epochs (flag ``RANK_DEFICIENT``).
    max_batch
        Upper bound on items per batch; by default sized from free memory at run time.
    fused
        Refine with the compiled kernel of :mod:`depsi.kernels.periodogram_numba` (NumPy inputs
        with a height term; the same coarse stage, so the same grid node, and a refinement
        equal to this module's to a tested tolerance). ``None``: :data:`USE_FUSED` for NumPy
        inputs when Numba can be imported; ``False``: this module's array-namespace kernel.

    Returns
    -------
    PeriodogramResult

    Notes
    -----
    With ``h2ph=None`` the height error is fixed at 0 (not estimated) and only the velocity is
    searched, on a grid :data:`VELOCITY_ONLY_REFINE` times finer than the default step (or
    ``velocity_step``), with one GEMM, then refined to the vertex of the parabola through the
    best node and its neighbours (``refine``); no Newton iterations. ``height_range``,
    ``height_step`` and ``rcond`` are not used, ``extra_regressors`` are refused. Items with fewer
    than 2 valid epochs get flag 2 and NaN velocity.

    Examples
    --------
    >>> t = np.linspace(0, 3, 40)
    >>> h2ph = 3e-4 * np.sin(7.0 * np.arange(40))  # baselines: not collinear with time
    >>> m2ph = -4 * np.pi / 0.0555
    >>> phase = np.angle(np.exp(1j * m2ph * (0.01 * t + h2ph * 12.0)))[None]
    >>> res = periodogram(phase, h2ph, t, wavelength=0.0555)
    >>> round(float(res.velocity[0]), 6), round(float(res.height_error[0]), 3)
    (0.01, 12.0)
    >>> float(res.coherence[0]) > 0.999999, int(res.flag[0])
    (True, 0)
    """
    xp = array_namespace(phase, h2ph)
    phase = xp.asarray(phase)
    if phase.ndim != 2:
        raise ValueError(f"phase: expected shape (K, T), found {tuple(phase.shape)}")
    K, T = phase.shape
    if T == 0:
        raise ValueError("phase: expected at least one epoch, found shape (K, 0)")
    t = to_host(time_years).astype(np.float64)
    if t.shape != (T,) or not np.isfinite(t).all():
        raise ValueError(f"time_years: expected {T} finite values, found shape {t.shape}")
    if h2ph is None:
        if extra_regressors:
            raise ValueError(f"extra_regressors: expected none without h2ph (a velocity-only "
                             f"search), found {sorted(extra_regressors)}")
        return _velocity_search(xp, phase, t, wavelength=wavelength,
                                velocity_range=velocity_range, velocity_step=velocity_step,
                                refine=refine, max_batch=max_batch)
    h2ph = xp.asarray(h2ph)
    if h2ph.shape not in ((T,), (K, T)):
        raise ValueError(f"h2ph: expected shape (T={T},) or (K={K}, T={T}), "
                         f"found {tuple(h2ph.shape)}")
    m2ph = phase_per_metre(wavelength)
    names, extra_g, extra_ranges, extra_steps = _parse_extra(extra_regressors, T, wavelength)

    # the widest h2ph span of any item sets the default height step (one grid for all items)
    finite = xp.isfinite(h2ph)
    spans = (xp.where(finite, h2ph, -np.inf).max(axis=-1)
             - xp.where(finite, h2ph, np.inf).min(axis=-1))
    spans = xp.atleast_1d(spans)
    spans = spans[xp.isfinite(spans)]
    h2ph_span = float(spans.max()) if spans.size else 0.0
    if height_step is None:
        height_step = default_step(h2ph_span, wavelength)
    if velocity_step is None:
        velocity_step = default_step(float(t.max() - t.min()), wavelength)
    heights = grid_nodes(*height_range, height_step)
    velocities = grid_nodes(*velocity_range, velocity_step)
    extra_nodes = [grid_nodes(lo, hi, st) for (lo, hi), st in zip(extra_ranges, extra_steps)]
    grid = _build_grid(heights, velocities, extra_nodes, names)
    n_terms = 2 + len(names)
    logger.debug("periodogram: %d items, %d epochs, grid %d heights x %d other nodes",
                 K, T, heights.size, grid.shared.shape[0])

    per_item = periodogram_bytes_per_item(T, heights.size, grid.shared.shape[0], n_terms)
    size = batch_size(per_item, device_of(phase), max_items=max(K, 1), fit_cache=True)
    if max_batch is not None:
        size = max(1, min(size, int(max_batch)))
    shared_h2ph = None
    if h2ph.ndim == 1 and bool(xp.isfinite(h2ph).all()):
        shared_h2ph = to_host(h2ph).astype(np.float64)
    E_shared, E_full = _phasor_tables(xp, grid, t, extra_g, m2ph, shared_h2ph)
    spacing = [np.ptp(nodes) / max(nodes.size - 1, 1) if nodes.size > 1 else 1.0
               for nodes in [heights, velocities] + extra_nodes]
    steps = xp.asarray(np.asarray(spacing, dtype=np.float64))[:, None]
    batch = _periodogram_batch
    if _fused_wanted(xp, fused):
        from depsi.kernels.periodogram_numba import Reference, fused_batch

        batch = functools.partial(fused_batch, reference=Reference(
            _unit_phasors, _coarse_search, coarse_block_items, REFINE_TOLERANCE,
            REFINE_ITERATIONS, _COHERENCE_TIE, _GRID_PRECISION, _SERIES_REACH))
    parts = []
    for start in range(0, max(K, 1), size):
        stop = min(start + size, K)
        parts.append(batch(
            xp, phase[start:stop], h2ph if h2ph.ndim == 1 else h2ph[start:stop], t, extra_g,
            grid, (E_shared, E_full), steps, m2ph, refine, rcond))
    fields = [xp.concatenate(f) for f in zip(*[p[:-1] for p in parts])]
    extra_values = [xp.concatenate(f) for f in zip(*[p[-1] for p in parts])] if names else []
    fields.append(dict(zip(names, extra_values)))  # extra, the last field
    return PeriodogramResult(*fields)


def _fused_wanted(xp, fused: bool | None) -> bool:
    """Whether :func:`periodogram` runs the compiled kernel (``fused``, else
    :data:`USE_FUSED`, for NumPy inputs when Numba can be imported; the steps pass
    :func:`depsi.stm.runtime.fused_kernels`, False in small Dask workers). Not asked for
    (None), only where it runs without compiling first
    (:func:`depsi.kernels.periodogram_numba.ready`)."""
    if xp is not np or fused is False or (fused is None and not USE_FUSED):
        return False
    from depsi.kernels import periodogram_numba

    if not periodogram_numba.AVAILABLE:
        if fused:
            raise ImportError("periodogram(fused=True): expected Numba, found it not importable")
        return False
    return bool(fused) or periodogram_numba.ready()


def _periodogram_batch(xp, phase, h2ph, t, extra_g, grid: _Grid, tables, steps, m2ph, refine,
                       rcond):
    """One batch of :func:`periodogram`: the PeriodogramResult fields, then the extra list."""
    K, T = phase.shape
    E = len(grid.names)
    f8 = xp.float64
    phase = phase.astype(f8, copy=False)
    h2ph_full = xp.broadcast_to(h2ph.astype(f8, copy=False), (K, T))
    valid = xp.isfinite(phase) & xp.isfinite(h2ph_full)
    n_valid = valid.sum(axis=1)
    phase0 = xp.where(valid, phase, 0.0)
    h2ph0 = xp.where(valid, h2ph_full, 0.0)

    # coarse stage
    # wrapped before the float32 phasors, so that their precision does not depend on the cycles
    z = _unit_phasors(xp, wrap_phase(phase0)) * valid
    E_shared, E_full = tables
    alpha = None if E_full is not None else (-m2ph * h2ph0).astype(xp.float32)
    Nh, Ns = grid.heights.shape[0], grid.shared.shape[0]
    v_stride = Ns // grid.velocity_count
    block = K if device_of(phase).kind != "cpu" else coarse_block_items(T, Nh, Nh * Ns)
    best, peaks = _coarse_search(xp, z, alpha, xp.asarray(grid.heights, dtype=xp.float32),
                                 E_shared, E_full, (Ns, v_stride), max(block, 1))
    theta_grid = xp.concatenate([
        xp.asarray(grid.heights)[best // Ns][None],
        xp.asarray(grid.shared)[best % Ns].T,
    ]).astype(f8)  # (2 + E, K): height, velocity, extras
    grid_coh = peaks[:, 0].astype(f8) / xp.maximum(n_valid, 1)

    # the model's regressors; identifiability on the valid epochs (e.g. a constant h2ph makes
    # the height indistinguishable from the constant phase)
    vmask = valid.astype(f8)
    shared = xp.asarray(m2ph * np.stack([t] + list(extra_g), axis=1))  # (T, P - 1)
    model = _Model(m2ph * h2ph0, shared, xp.concatenate([shared, xp.ones((T, 1))], axis=1))
    N0 = model.normal_matrix(xp, vmask)
    _, _, identifiable = _solve_transposed(xp, N0, xp.zeros(N0.shape[1:]), rcond)

    grid_only = xp.zeros(K, dtype=bool)
    if refine:
        # start from the vertex of parabolas through the best node's neighbours (height and
        # velocity axes): Newton then needs two or three iterations instead of five
        start_theta = theta_grid + xp.stack(
            [_vertex_offsets(xp, peaks[:, 0], peaks[:, 1], peaks[:, 2], best // Ns, Nh)
             * steps[0, 0],
             _vertex_offsets(xp, peaks[:, 0], peaks[:, 3], peaks[:, 4],
                             (best // v_stride) % grid.velocity_count, grid.velocity_count)
             * steps[1, 0]]
            + [xp.zeros(K)] * E)
        theta, C, S, started = _refine(xp, phase0, vmask, model, start_theta, n_valid, steps,
                                       rcond)
        # keep the grid node where the refinement could not start or fell below the grid's
        # coherence (complex64 precision there, hence the tolerance)
        reached = xp.sqrt(C * C + S * S) / xp.maximum(n_valid, 1) >= grid_coh - _GRID_PRECISION
        grid_only = ~(started & reached)
        if bool(grid_only.any()):
            back = xp.nonzero(grid_only)[0]
            _, _, C0, S0 = _evaluate(xp, phase0[back], vmask[back], model.subset(back),
                                     theta_grid[:, back])
            theta[:, back] = theta_grid[:, back]
            C[back], S[back] = C0, S0
    else:
        theta = theta_grid
        _, _, C, S = _evaluate(xp, phase0, vmask, model, theta_grid)

    # the constant phase, residuals and ambiguities at the estimate
    coherence = xp.sqrt(C * C + S * S) / xp.maximum(n_valid, 1)
    offset = xp.arctan2(S, C)
    model = model.phase(theta) + offset[:, None]
    residual = wrap_phase(phase0 - model)
    cycles = xp.rint((model + residual - phase0) / _TWO_PI)
    ambiguity = xp.where(valid, cycles, MISSING_AMBIGUITY).astype(xp.int32)
    residual = xp.where(valid, residual, xp.nan)

    too_few = n_valid < theta.shape[0] + 1
    flag = xp.where(
        too_few, int(Flag.TOO_FEW_OBSERVATIONS),
        xp.where(~identifiable, int(Flag.RANK_DEFICIENT),
                 xp.where(grid_only, int(Flag.GRID_ONLY), int(Flag.OK))),
    ).astype(FLAG_DTYPE)
    no_estimate = too_few | ~identifiable
    theta = xp.where(no_estimate[None], xp.nan, theta)
    empty = n_valid == 0
    coherence = xp.where(empty, xp.nan, coherence)
    grid_coh = xp.where(empty, xp.nan, grid_coh)
    offset = xp.where(empty, xp.nan, offset)
    return (theta[0], theta[1], offset, coherence, grid_coh, ambiguity, residual, n_valid, flag,
            [theta[2 + e] for e in range(E)])
