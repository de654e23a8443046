"""Batched weighted least squares: many small problems solved at once, on NumPy or CuPy.

Each problem ``k`` is ``min_x sum_d w_kd (A_kd . x - y_kd)^2`` with one design matrix shared by
all problems or one per problem. The normal equations of a whole batch are formed with a few
large array operations (one BLAS call for a shared design), scaled to unit diagonal, and
factorised by a Cholesky factorisation vectorised over the batch (a loop over the ``P``
unknowns, never over problems). Singular or ill-conditioned problems are detected per problem,
flagged and returned as NaN; they never raise and never leak NaN into the other problems.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from depsi.kernels.backend import array_namespace, batch_size, device_of
from depsi.kernels.flags import FLAG_DTYPE, Flag

logger = logging.getLogger(__name__)

#: Default bound on the reciprocal condition number (1-norm) of the normal matrix scaled to unit
#: diagonal; problems worse than this are flagged ``RANK_DEFICIENT``. With float64 normal
#: equations the estimates of an accepted problem keep at least ~6 significant digits.
DEFAULT_RCOND = 1e-10

#: Bytes per float64 value; every kernel in this module computes in float64.
_F8 = 8


@dataclass(frozen=True)
class LstsqResult:
    """Result of :func:`lstsq_batched` for ``K`` problems of ``D`` observations, ``P`` unknowns.

    All arrays are float64 (``flag``, ``n_obs``, ``dof``: integers) on the device of the input.

    Attributes
    ----------
    x : (K, P)
        Estimates; NaN where ``flag`` is ``RANK_DEFICIENT`` or ``TOO_FEW_OBSERVATIONS``.
    covariance : (K, P, P)
        A-priori covariance ``(A^T W A)^-1``: the covariance of ``x`` when the weights are the
        inverse variances of the observations. Multiply by ``sigma2`` for the a-posteriori one.
    std : (K, P)
        A-posteriori standard deviations ``sqrt(sigma2 * diag(covariance))``; NaN where
        ``sigma2`` is NaN.
    residuals : (K, D)
        ``y - A x``; NaN where the observation is missing (NaN, or weight <= 0) and for flagged
        problems without estimates.
    sigma2 : (K,)
        A-posteriori variance factor ``sum(w r^2) / dof``; NaN where ``dof <= 0``.
    n_obs : (K,)
        Number of observations used (finite, weight > 0).
    dof : (K,)
        Degrees of freedom ``n_obs - P`` (may be negative).
    flag : (K,) int8
        :class:`~depsi.kernels.flags.Flag`: 0 ok; 2 ``TOO_FEW_OBSERVATIONS`` (``n_obs < P``);
        else 1 ``RANK_DEFICIENT``; else 3 ``NO_REDUNDANCY`` (``n_obs == P``).
    """

    x: Any
    covariance: Any
    std: Any
    residuals: Any
    sigma2: Any
    n_obs: Any
    dof: Any
    flag: Any


# --------------------------------------------------------------------------------------------
# The batched SPD solver. Matrices are held "transposed" as (P, P, K): every matrix entry is a
# contiguous vector over the batch, so each step below is one fast elementwise operation over K
# problems (a loop over the P unknowns, never over problems).


def _cholesky_guarded(xp, Ns, tiny: float):
    """Lower Cholesky factors of unit-diagonal matrices ``Ns`` (P, P, K).

    A pivot not above ``tiny`` (or not finite) marks the problem bad and is replaced by 1 so the
    factor stays finite; the caller discards bad problems.
    """
    P = Ns.shape[0]
    L = xp.zeros_like(Ns)
    bad = xp.zeros(Ns.shape[2], dtype=bool)
    for j in range(P):
        row = L[j, :j]  # (j, K)
        pivot = Ns[j, j] - (row * row).sum(axis=0)
        ok = pivot > tiny
        bad |= ~ok
        diag = xp.sqrt(xp.where(ok, pivot, 1.0))
        L[j, j] = diag
        if j + 1 < P:
            below = Ns[j + 1:, j] - (L[j + 1:, :j] * row[None]).sum(axis=1)
            L[j + 1:, j] = below / diag
    return L, bad


def _lower_inverse(xp, L):
    """Inverse of lower-triangular factors ``L`` (P, P, K) by forward substitution."""
    P = L.shape[0]
    inv = xp.zeros_like(L)
    for j in range(P):
        # row j of L^-1 is (e_j - L[j, :j] @ inv[:j, :]) / L[j, j]
        acc = -(L[j, :j, None] * inv[:j]).sum(axis=0)
        acc[j] += 1.0
        inv[j] = acc / L[j, j]
    return inv


def _solve_transposed(xp, N, b, rcond: float):
    """:func:`solve_normal_equations` on the (P, P, K) / (P, K) layout."""
    P = N.shape[0]
    eye = xp.eye(P, dtype=N.dtype)[:, :, None]
    finite = xp.isfinite(N).all(axis=(0, 1)) & xp.isfinite(b).all(axis=0)
    diag = xp.stack([N[j, j] for j in range(P)])
    positive = (diag > 0).all(axis=0) & finite
    N = xp.where(positive, N, eye)
    b = xp.where(positive, b, 0.0)
    scale = 1.0 / xp.sqrt(xp.where(positive, diag, 1.0))
    Ns = N * scale[:, None] * scale[None, :]
    L, bad = _cholesky_guarded(xp, Ns, rcond)
    Linv = _lower_inverse(xp, L)
    inv_s = (Linv[:, :, None] * Linv[:, None, :]).sum(axis=0)
    cond = xp.abs(Ns).sum(axis=0).max(axis=0) * xp.abs(inv_s).sum(axis=0).max(axis=0)
    ok = positive & ~bad & (cond * rcond < 1.0)
    x = scale * (inv_s * (b * scale)[None]).sum(axis=1)
    inverse = inv_s * scale[:, None] * scale[None, :]
    return xp.where(ok, x, xp.nan), xp.where(ok, inverse, xp.nan), ok


def solve_normal_equations(N: Any, b: Any, *, rcond: float = DEFAULT_RCOND):
    """Solve batched symmetric positive definite systems ``N_k x_k = b_k`` without raising.

    The matrices are scaled to unit diagonal, factorised by a Cholesky factorisation vectorised
    over the batch, and a problem is rejected when a pivot is not above ``rcond`` or the 1-norm
    condition number of the scaled matrix exceeds ``1/rcond``. Rejected problems (and problems
    with non-finite entries or a non-positive diagonal) are replaced by the identity before the
    factorisation, so nothing non-finite reaches the others; their outputs are NaN.

    Parameters
    ----------
    N : (K, P, P)
        Symmetric normal matrices.
    b : (K, P)
        Right-hand sides.
    rcond
        Smallest accepted reciprocal condition number of the scaled matrix.

    Returns
    -------
    x : (K, P)
        Solutions, NaN where rejected.
    inverse : (K, P, P)
        ``N^-1``, NaN where rejected.
    ok : (K,) bool
        Whether the problem was accepted.

    Examples
    --------
    >>> import numpy as np
    >>> N = np.array([[[2.0, 0.0], [0.0, 4.0]], [[1.0, 1.0], [1.0, 1.0]]])
    >>> x, inv, ok = solve_normal_equations(N, np.array([[2.0, 4.0], [1.0, 1.0]]))
    >>> np.round(x[0], 12).tolist(), ok.tolist()
    ([1.0, 1.0], [True, False])
    """
    xp = array_namespace(N, b)
    Nt = xp.ascontiguousarray(xp.moveaxis(xp.asarray(N, dtype=xp.float64), 0, -1))
    bt = xp.ascontiguousarray(xp.asarray(b, dtype=xp.float64).T)
    x, inverse, ok = _solve_transposed(xp, Nt, bt, rcond)
    return x.T, xp.moveaxis(inverse, -1, 0), ok


# --------------------------------------------------------------------------------------------
# Least squares


def _validate_shapes(A, y, weights) -> tuple[int, int, int, bool]:
    if y.ndim != 2:
        raise ValueError(f"y: expected shape (K, D), found shape {tuple(y.shape)}")
    K, D = y.shape
    if A.ndim == 2:
        shared = True
        if A.shape[0] != D:
            raise ValueError(f"A: expected shape (D={D}, P) to match y, found {tuple(A.shape)}")
    elif A.ndim == 3:
        shared = False
        if A.shape[:2] != (K, D):
            raise ValueError(f"A: expected shape (K={K}, D={D}, P) to match y, "
                             f"found {tuple(A.shape)}")
    else:
        raise ValueError(f"A: expected shape (D, P) or (K, D, P), found {tuple(A.shape)}")
    if weights is not None and tuple(weights.shape) not in ((K, D), (D,)):
        raise ValueError(f"weights: expected shape (K={K}, D={D}) or (D={D},), "
                         f"found {tuple(weights.shape)}")
    return K, D, A.shape[-1], shared


def lstsq_bytes_per_problem(n_obs: int, n_unknowns: int, *, shared_design: bool) -> int:
    """Peak bytes :func:`lstsq_batched` needs per problem (inputs of the batch, temporaries,
    outputs), used to size batches from free memory.

    Examples
    --------
    >>> lstsq_bytes_per_problem(100, 3, shared_design=False)
    10320
    """
    D, P = n_obs, n_unknowns
    design = 0 if shared_design else 2 * D * P  # cast copy and weighted copy
    return _F8 * (design + 6 * D + 8 * P * P + 6 * P)


def _invalid_expected(xp):
    """Silence NumPy's invalid-value warning for one operation whose NaN results are detected
    and handled right after it (CuPy never warns)."""
    return np.errstate(invalid="ignore", over="ignore") if xp is np else contextlib.nullcontext()


def _normal_equations_shared(xp, A, w, y0):
    """(P, P, K) normal matrices and (P, K) right-hand sides for one shared design (D, P)."""
    D, P = A.shape
    outer = (A[:, :, None] * A[:, None, :]).reshape(D, P * P)
    N = (w @ outer).T.reshape(P, P, -1)  # one BLAS call for the whole batch
    b = ((w * y0) @ A).T
    return xp.ascontiguousarray(N), xp.ascontiguousarray(b)


def _normal_equations_stacked(xp, At, w, y0, unit_weights: bool):
    """(P, P, K) normal matrices and (P, K) right-hand sides for designs At (P, K, D)."""
    P, K, _ = At.shape
    Aw = At if unit_weights else At * w[None]
    N = xp.empty((P, P, K), dtype=At.dtype)
    for p in range(P):
        N[p, p:] = xp.einsum("kd,qkd->qk", Aw[p], At[p:])
        N[p:, p] = N[p, p:]
    b = xp.einsum("pkd,kd->pk", Aw, y0)
    return N, b


def _solve_batch(xp, A, y, weights, shared: bool, rcond: float):
    """One batch of :func:`lstsq_batched`; returns the tuple of LstsqResult fields."""
    K, D = y.shape
    P = A.shape[-1]
    f8 = xp.float64
    y = y.astype(f8, copy=False)
    mask = xp.isfinite(y)
    if weights is None:
        w = mask.astype(f8)
    else:
        w = xp.where(mask & (weights > 0), weights.astype(f8, copy=False), 0.0)  # NaN: False
        mask = w > 0
    unit_weights = weights is None and bool(mask.all())
    y0 = y if unit_weights else xp.where(mask, y, 0.0)
    if shared:
        A = A.astype(f8, copy=False)
        rows = xp.isfinite(A).all(axis=1)
        if not bool(rows.all()):
            A = xp.where(rows[:, None], A, 0.0)
            w, mask, y0 = w * rows, mask & rows, y0 * rows
            unit_weights = False
        if unit_weights:  # one normal matrix for the whole batch: x = y @ (A N^-1), one GEMM
            _, inverse, ok1 = _solve_transposed(xp, (A.T @ A)[:, :, None], xp.zeros((P, 1)),
                                                rcond)
            xt = (y @ (A @ inverse[:, :, 0])).T
            cov_t = xp.repeat(inverse, K, axis=2)
            ok = xp.repeat(ok1, K)
        else:
            N, b = _normal_equations_shared(xp, A, w, y0)
    else:
        # One pass copies the designs to (P, K, D), float64: every later step then works on
        # contiguous (K, D) slabs, much faster than K tiny (P, D) matrix products.
        At = xp.ascontiguousarray(xp.moveaxis(A, 2, 0), dtype=f8)
        with _invalid_expected(xp):  # non-finite rows give NaN here, handled just below
            N, b = _normal_equations_stacked(xp, At, w, y0, unit_weights)
        # A non-finite design row makes N non-finite (inf * 0 = NaN): redo those problems with
        # such rows treated as missing observations; only they pay for the extra pass.
        broken = ~(xp.isfinite(N).all(axis=(0, 1)) & xp.isfinite(b).all(axis=0))
        if bool(broken.any()):
            idx = xp.nonzero(broken)[0]
            At = At.copy()  # At may be the caller's array when A came in (P, K, D) order
            rows = xp.isfinite(At[:, idx]).all(axis=0)
            At[:, idx] = xp.where(rows[None], At[:, idx], 0.0)
            if unit_weights:
                w, y0, unit_weights = w.copy(), y0.copy(), False
            w[idx], mask[idx], y0[idx] = w[idx] * rows, mask[idx] & rows, y0[idx] * rows
            N_i, b_i = _normal_equations_stacked(xp, At[:, idx], w[idx], y0[idx], False)
            N[:, :, idx], b[:, idx] = N_i, b_i
    if unit_weights:
        n_obs = xp.full(K, D)
    else:  # a float sum counts exactly and runs several times faster than a boolean one
        n_obs = xp.einsum("kd->k", w if weights is None else mask.astype(f8)).astype(xp.int64)
    if not (shared and unit_weights):
        xt, cov_t, ok = _solve_transposed(xp, N, b, rcond)
    if shared:
        fitted = xt.T @ A.T
    else:
        fitted = xp.einsum("pkd,pk->kd", At, xt)
    r0 = y0 - fitted  # zero weight where missing: contributes nothing below
    wrss = xp.einsum("kd,kd->k", r0, r0 if unit_weights else w * r0)
    residuals = r0 if unit_weights else xp.where(mask, r0, xp.nan)
    dof = n_obs - P
    sigma2 = xp.where(ok & (dof > 0), wrss / xp.maximum(dof, 1), xp.nan)
    variances = xp.stack([cov_t[j, j] for j in range(P)], axis=1)
    std = xp.sqrt(sigma2[:, None] * variances)
    flag = xp.where(
        n_obs < P, int(Flag.TOO_FEW_OBSERVATIONS),
        xp.where(~ok, int(Flag.RANK_DEFICIENT),
                 xp.where(dof == 0, int(Flag.NO_REDUNDANCY), int(Flag.OK))),
    ).astype(FLAG_DTYPE)
    x, cov = xt.T, xp.moveaxis(cov_t, -1, 0)
    bad = flag == int(Flag.TOO_FEW_OBSERVATIONS)
    if bool(bad.any()):  # an exactly-solvable subset may pass the condition test; never report it
        x = xp.where(bad[:, None], xp.nan, x)
        cov = xp.where(bad[:, None, None], xp.nan, cov)
        std = xp.where(bad[:, None], xp.nan, std)
        residuals = xp.where(bad[:, None], xp.nan, residuals)
    return x, cov, std, residuals, sigma2, n_obs, dof, flag


def lstsq_batched(
    A: Any,
    y: Any,
    weights: Any | None = None,
    *,
    rcond: float = DEFAULT_RCOND,
    max_batch: int | None = None,
) -> LstsqResult:
    """Solve ``K`` weighted least-squares problems ``min ||W_k^(1/2) (A_k x_k - y_k)||`` at once.

    Parameters
    ----------
    A : (D, P) or (K, D, P)
        One design matrix shared by all problems, or one per problem. A row with a non-finite
        entry is treated as a missing observation.
    y : (K, D)
        Observations; NaN marks a missing observation (zero weight).
    weights : (K, D) or (D,), optional
        Observation weights (inverse variances); a weight <= 0 or NaN drops the observation.
        Default: all ones.
    rcond
        Problems whose normal matrix, scaled to unit diagonal, has a reciprocal condition number
        (1-norm) below ``rcond`` are flagged ``RANK_DEFICIENT``.
    max_batch
        Upper bound on problems per batch; by default the batch is sized from the memory free
        on the device at run time (:func:`depsi.kernels.backend.batch_size`).

    Returns
    -------
    LstsqResult
        ``x``, ``covariance`` (a-priori ``(A^T W A)^-1``), ``std`` (a-posteriori), ``residuals``,
        ``sigma2``, ``n_obs``, ``dof``, ``flag``; arrays on the device of ``y``, float64.

    Notes
    -----
    The computation is in float64 whatever the input dtype: normal equations square the
    condition number, and float32 would lose half of its digits there. Results agree with
    per-problem ``scipy.linalg.lstsq`` to about ``cond(A)^2 * 1e-16`` relative.

    Examples
    --------
    >>> import numpy as np
    >>> t = np.arange(5.0)
    >>> A = np.stack([np.ones(5), t], axis=1)  # offset and rate, shared by both problems
    >>> y = np.stack([1 + 2 * t, 3 - t])
    >>> y[1, 2] = np.nan  # a missing observation
    >>> res = lstsq_batched(A, y)
    >>> np.round(res.x, 6).tolist(), res.flag.tolist(), res.n_obs.tolist()
    ([[1.0, 2.0], [3.0, -1.0]], [0, 0], [5, 4])
    """
    xp = array_namespace(A, y, weights)
    A, y = xp.asarray(A), xp.asarray(y)
    weights = None if weights is None else xp.asarray(weights)
    K, D, P, shared = _validate_shapes(A, y, weights)
    if weights is not None and weights.ndim == 1:
        weights = xp.broadcast_to(weights, (K, D))
    per_problem = lstsq_bytes_per_problem(D, P, shared_design=shared)
    size = batch_size(per_problem, device_of(y), max_items=max(K, 1), fit_cache=True)
    if max_batch is not None:
        size = max(1, min(size, int(max_batch)))
    if K <= size:
        return LstsqResult(*_solve_batch(xp, A, y, weights, shared, rcond))
    out: list[Any] = []
    for start in range(0, K, size):
        stop = min(start + size, K)
        part = _solve_batch(xp, A if shared else A[start:stop], y[start:stop],
                            None if weights is None else weights[start:stop], shared, rcond)
        if not out:  # written batch by batch: no concatenation pass over the outputs
            out = [xp.empty((K,) + field.shape[1:], dtype=field.dtype) for field in part]
        for target, field in zip(out, part):
            target[start:stop] = field
    return LstsqResult(*out)
