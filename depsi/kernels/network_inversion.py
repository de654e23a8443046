"""Interferogram-network inversion: unwrapped interferograms to a time series per pixel.

Interferogram ``i`` of pixel ``k`` observes ``series[k, second_i] - series[k, first_i]`` with
``(first_i, second_i) = pairs[i]``. The weighted least-squares solution with the reference epoch
fixed at zero is computed for all pixels at once:

* pixels with every interferogram valid and weights shared by all pixels share one normal
  matrix: one factorisation, then one matrix product for all of them;
* the others (missing interferograms, per-pixel weights) get their own normal matrix, built
  with gathers from the graph's incidence tables and solved in batches sized by free memory.

A pixel whose valid interferograms leave some epochs unconnected to the reference epoch is not
solvable there: those epochs are NaN, the pixel is flagged ``DISCONNECTED``, and the connected
component of every epoch is returned so callers can do what suits them; nothing raises.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from depsi.kernels.backend import array_namespace, batch_size, device_of, to_host
from depsi.kernels.flags import FLAG_DTYPE, Flag

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NetworkInversionResult:
    """Result of :func:`invert_network` for K pixels, I interferograms and T epochs.

    Attributes
    ----------
    series : (K, T) float64
        Time series, zero at the reference epoch; NaN at epochs not connected to it.
    residuals : (K, I) float64
        ``ifg - (series[second] - series[first])``; NaN for missing interferograms and those
        between epochs not connected to the reference.
    sigma2 : (K,) float64
        A-posteriori variance factor ``sum(w r^2) / dof``; NaN where ``dof <= 0``.
    n_obs : (K,) int
        Interferograms used (valid and connected to the reference epoch).
    dof : (K,) int
        ``n_obs - (number of epochs connected to the reference - 1)``.
    component : (K, T) int
        For each epoch, the smallest epoch index of its connected component in the graph of the
        pixel's valid interferograms (``component[k, t] == component[k, reference]``: solved).
    flag : (K,) int8
        :class:`~depsi.kernels.flags.Flag`: 0 ok; 4 ``DISCONNECTED``; 3 ``NO_REDUNDANCY``
        (connected, but no more interferograms than unknowns: series valid, ``sigma2`` NaN);
        1 ``RANK_DEFICIENT`` if the solver failed numerically (series NaN).
    """

    series: Any
    residuals: Any
    sigma2: Any
    n_obs: Any
    dof: Any
    component: Any
    flag: Any


@dataclass(frozen=True)
class _Graph:
    """Incidence tables of the epoch graph (host NumPy), padded to rectangles for gathers."""

    pairs: np.ndarray  # (I, 2)
    n_epochs: int
    incident: np.ndarray  # (T, max_degree) interferogram indices; padding I
    neighbour: np.ndarray  # (T, max_degree) epoch at the other end; padding: the epoch itself
    edge_pairs: np.ndarray  # (U, 2) distinct unordered epoch pairs
    edge_ifgs: np.ndarray  # (U, max_duplicates) interferograms of each pair; padding I
    design: np.ndarray  # (I, T) the +1/-1 design matrix


def _padded_groups(keys: np.ndarray, values: np.ndarray, n_keys: int, pad: int) -> np.ndarray:
    """Table (n_keys, max count) of ``values`` grouped by ``keys``, padded with ``pad``."""
    order = np.argsort(keys, kind="stable")
    counts = np.bincount(keys, minlength=n_keys)
    width = max(int(counts.max()) if counts.size else 0, 1)
    starts = np.cumsum(counts) - counts
    slot = np.arange(keys.size) - np.repeat(starts, counts)
    table = np.full((n_keys, width), pad, dtype=np.int64)
    table[keys[order], slot] = values[order]
    return table


def _graph(pairs: np.ndarray, n_epochs: int) -> _Graph:
    I, T = pairs.shape[0], n_epochs
    ends = np.concatenate([pairs[:, 0], pairs[:, 1]])
    ifgs = np.concatenate([np.arange(I), np.arange(I)])
    others = np.concatenate([pairs[:, 1], pairs[:, 0]])
    incident = _padded_groups(ends, ifgs, T, I)
    neighbour = _padded_groups(ends, others, T, -1)
    neighbour = np.where(neighbour < 0, np.arange(T)[:, None], neighbour)
    low, high = pairs.min(axis=1), pairs.max(axis=1)
    keys, edge_of = np.unique(low * T + high, return_inverse=True)
    edge_pairs = np.stack([keys // T, keys % T], axis=1)
    edge_ifgs = _padded_groups(edge_of.ravel(), np.arange(I), keys.size, I)
    design = np.zeros((I, T))
    design[np.arange(I), pairs[:, 1]] += 1.0
    design[np.arange(I), pairs[:, 0]] -= 1.0
    return _Graph(pairs, T, incident, neighbour, edge_pairs, edge_ifgs, design)


def connected_components(mask: Any, pairs: Any, n_epochs: int) -> Any:
    """Connected components of each pixel's epoch graph of valid interferograms.

    Label propagation with pointer jumping, vectorised over pixels (about log2 of the graph's
    diameter iterations, each a gather over the incidence table).

    Parameters
    ----------
    mask : (K, I) bool
        Which interferograms are valid per pixel.
    pairs : (I, 2)
        Epoch indices of each interferogram.
    n_epochs
        T.

    Returns
    -------
    (K, T) int
        The smallest epoch index of each epoch's component.

    Examples
    --------
    >>> pairs = np.array([[0, 1], [2, 3]])
    >>> connected_components(np.array([[True, True]]), pairs, 4).tolist()
    [[0, 0, 2, 2]]
    """
    xp = array_namespace(mask)
    graph = _graph(to_host(pairs).astype(np.int64), int(n_epochs))
    return _components(xp, xp.asarray(mask, dtype=bool), graph)


def _components(xp, mask, graph: _Graph):
    K, T = mask.shape[0], graph.n_epochs
    padded = xp.concatenate([mask, xp.zeros((K, 1), dtype=bool)], axis=1)
    usable = padded[:, xp.asarray(graph.incident)]  # (K, T, max_degree)
    neighbour = xp.asarray(graph.neighbour)
    labels = xp.broadcast_to(xp.arange(T), (K, T)).copy()
    for _ in range(T + 1):  # converges in ~log2(diameter) rounds; T + 1 bounds it
        reach = xp.where(usable, labels[:, neighbour], T).min(axis=2)
        new = xp.minimum(labels, reach)
        new = xp.take_along_axis(new, new, axis=1)  # pointer jumping
        if not bool((new != labels).any()):
            break
        labels = new
    return labels


def _normal_matrices(xp, w, graph: _Graph):
    """Per-pixel normal matrices (K, T, T) (weighted graph Laplacians) from weights (K, I)."""
    K, T = w.shape[0], graph.n_epochs
    padded = xp.concatenate([w, xp.zeros((K, 1), dtype=w.dtype)], axis=1)
    N = xp.zeros((K, T * T), dtype=w.dtype)
    N[:, xp.arange(T) * (T + 1)] = padded[:, xp.asarray(graph.incident)].sum(axis=2)
    off = -padded[:, xp.asarray(graph.edge_ifgs)].sum(axis=2)  # (K, U)
    a, b = xp.asarray(graph.edge_pairs[:, 0]), xp.asarray(graph.edge_pairs[:, 1])
    N[:, a * T + b] = off
    N[:, b * T + a] = off
    return N.reshape(K, T, T)


def _ground(xp, N, rhs, fixed):
    """Replace the rows/columns of fixed epochs by the identity (their value becomes zero)."""
    T = N.shape[-1]
    N = xp.where(fixed[..., :, None] | fixed[..., None, :], 0.0, N)
    N = N + fixed[..., None, :] * xp.eye(T)
    return N, xp.where(fixed, 0.0, rhs)


def _solve(xp, N, rhs):
    """SPD solve after Jacobi scaling; returns (x, ok). Never raises.

    ``N`` (K, T, T) with ``rhs`` (K, T), or one ``N`` (T, T) with many right-hand sides as rows
    of ``rhs`` (M, T).
    """
    d = xp.diagonal(N, axis1=-2, axis2=-1)
    s = 1.0 / xp.sqrt(xp.where(d > 0, d, 1.0))
    Ns = N * s[..., :, None] * s[..., None, :]
    b = (rhs * s)[..., None] if N.ndim == 3 else (rhs * s).T
    try:
        xs = xp.linalg.solve(Ns, b)
    except np.linalg.LinAlgError:  # an exactly singular matrix in the batch (NumPy only)
        xs = xp.linalg.pinv(Ns) @ b
    x = (xs[..., 0] if N.ndim == 3 else xs.T) * s
    ok = xp.isfinite(x).all(axis=-1)
    return xp.where(ok[..., None], x, xp.nan), ok


def invert_bytes_per_pixel(n_ifgs: int, n_epochs: int, max_degree: int) -> int:
    """Peak bytes per pixel of the per-pixel path of :func:`invert_network`.

    Normal matrix, its scaled copy and the solver's LU copy (``3 * 8 T^2``), the incidence
    gathers (``9 T * max_degree``) and per-interferogram arrays (``6 * 8 I``).

    Examples
    --------
    >>> invert_bytes_per_pixel(200, 60, 10)
    105240
    """
    T, I = n_epochs, n_ifgs
    return 24 * T * T + 9 * T * max_degree + 48 * I + 8 * 8 * T


def invert_network(
    ifg: Any,
    pairs: Any,
    n_epochs: int,
    *,
    weights: Any | None = None,
    reference: int = 0,
    max_batch: int | None = None,
) -> NetworkInversionResult:
    """Time series per pixel from unwrapped interferograms, by weighted least squares.

    Parameters
    ----------
    ifg : (K, I)
        Unwrapped interferograms (any unit: rad or m), ``series[second] - series[first]``;
        NaN marks a missing interferogram.
    pairs : (I, 2) int
        ``(first, second)`` epoch indices of each interferogram, in ``[0, n_epochs)``.
    n_epochs
        T, the number of epochs of the series.
    weights : (K, I) or (I,), optional
        Inverse variances; <= 0 or NaN drops the interferogram. Default ones.
    reference
        The epoch fixed at zero.
    max_batch
        Upper bound on pixels per batch of the per-pixel path; default from free memory.

    Returns
    -------
    NetworkInversionResult
        float64 arrays on the device of ``ifg``.

    Examples
    --------
    >>> pairs = np.array([[0, 1], [1, 2], [0, 2], [2, 3]])
    >>> truth = np.array([[0.0, 1.0, 3.0, 6.0]])
    >>> ifg = truth[:, pairs[:, 1]] - truth[:, pairs[:, 0]]
    >>> res = invert_network(ifg, pairs, 4)
    >>> np.round(res.series, 12).tolist(), res.flag.tolist()
    ([[0.0, 1.0, 3.0, 6.0]], [0])
    >>> ifg[0, 3] = np.nan  # epoch 3 loses its only interferogram
    >>> res = invert_network(ifg, pairs, 4)
    >>> float(res.series[0, 3]), int(res.flag[0]), res.component[0].tolist()
    (nan, 4, [0, 0, 0, 3])
    """
    xp = array_namespace(ifg, weights)
    ifg = xp.asarray(ifg, dtype=xp.float64)
    host_pairs = to_host(pairs)
    T = int(n_epochs)
    if ifg.ndim != 2:
        raise ValueError(f"ifg: expected shape (K, I), found {tuple(ifg.shape)}")
    K, I = ifg.shape
    if host_pairs.shape != (I, 2) or host_pairs.dtype.kind not in "iu":
        raise ValueError(f"pairs: expected integer shape (I={I}, 2), found "
                         f"{host_pairs.dtype} {host_pairs.shape}")
    host_pairs = host_pairs.astype(np.int64)
    if I and (host_pairs.min() < 0 or host_pairs.max() >= T):
        raise ValueError(f"pairs: expected epoch indices in [0, {T}), found "
                         f"[{host_pairs.min()}, {host_pairs.max()}]")
    same = host_pairs[:, 0] == host_pairs[:, 1]
    if same.any():
        raise ValueError("pairs: expected two different epochs per interferogram, found "
                         f"{int(same.sum())} with first == second")
    if not 0 <= int(reference) < T:
        raise ValueError(f"reference: expected an epoch index in [0, {T}), found {reference!r}")
    if weights is not None:
        weights = xp.asarray(weights, dtype=xp.float64)
        if tuple(weights.shape) not in ((K, I), (I,)):
            raise ValueError(f"weights: expected shape (K={K}, I={I}) or (I={I},), "
                             f"found {tuple(weights.shape)}")
    graph = _graph(host_pairs, T)

    mask = xp.isfinite(ifg)
    if weights is None:
        w = mask.astype(xp.float64)
    else:
        w = xp.where(mask & (weights > 0), weights, 0.0)
        mask = w > 0
    y0 = xp.where(mask, ifg, 0.0)

    series = xp.full((K, T), xp.nan)
    component = xp.empty((K, T), dtype=xp.int64)
    ok = xp.ones(K, dtype=bool)
    shared_weights = weights is None or weights.ndim == 1
    regular = mask.all(axis=1) if shared_weights else xp.zeros(K, dtype=bool)
    if bool(regular.any()):
        idx = xp.nonzero(regular)[0]
        w_shared = w[idx[:1]]  # the same for every regular pixel
        series[idx], component[idx], ok[idx] = _invert_shared(xp, y0[idx], w_shared, graph,
                                                               reference)
    irregular = xp.nonzero(~regular)[0]
    if irregular.size:
        degree = graph.incident.shape[1]
        size = batch_size(invert_bytes_per_pixel(I, T, degree), device_of(ifg),
                          max_items=int(irregular.size))
        if max_batch is not None:
            size = max(1, min(size, int(max_batch)))
        for start in range(0, int(irregular.size), size):
            idx = irregular[start:start + size]
            series[idx], component[idx], ok[idx] = _invert_per_pixel(
                xp, y0[idx], w[idx], mask[idx], graph, reference)

    design = xp.asarray(graph.design)
    fitted = series @ design.T if T else xp.zeros((K, I))
    residuals = xp.where(mask, ifg - fitted, xp.nan)  # NaN too where an epoch is unsolved
    used = xp.isfinite(residuals)
    n_obs = used.sum(axis=1)
    connected = (component == component[:, reference:reference + 1]).sum(axis=1)
    dof = n_obs - (connected - 1)
    r0 = xp.where(used, residuals, 0.0)
    sigma2 = xp.where(ok & (dof > 0), (w * r0 * r0).sum(axis=1) / xp.maximum(dof, 1), xp.nan)
    flag = xp.where(
        ~ok, int(Flag.RANK_DEFICIENT),
        xp.where(connected < T, int(Flag.DISCONNECTED),
                 xp.where(dof <= 0, int(Flag.NO_REDUNDANCY), int(Flag.OK))),
    ).astype(FLAG_DTYPE)
    return NetworkInversionResult(series, residuals, sigma2, n_obs, dof, component, flag)


def _invert_shared(xp, y0, w_shared, graph: _Graph, reference: int):
    """Pixels sharing one normal matrix: one solve, then one GEMM for all of them."""
    K = y0.shape[0]
    T = graph.n_epochs
    labels = _components(xp, w_shared > 0, graph)[0]
    fixed = (labels != labels[reference]) | (xp.arange(T) == reference)
    N, _ = _ground(xp, _normal_matrices(xp, w_shared, graph)[0], xp.zeros(T), fixed)
    rhs = xp.where(fixed[:, None], 0.0, xp.asarray(graph.design).T * w_shared)  # (T, I): A^T W
    G, good = _solve(xp, N, rhs.T)  # rows of G.T: the solution operator, one column per ifg
    series = y0 @ G
    series = xp.where(fixed & (xp.arange(T) != reference), xp.nan, series)
    ok = xp.full(K, bool(good.all()))
    series = xp.where(ok[:, None], series, xp.nan)
    return series, xp.broadcast_to(labels, (K, T)), ok


def _invert_per_pixel(xp, y0, w, mask, graph: _Graph, reference: int):
    """Pixels with their own normal matrix, solved as one batch."""
    T = graph.n_epochs
    labels = _components(xp, mask, graph)
    fixed = (labels != labels[:, reference:reference + 1]) | (xp.arange(T) == reference)
    N = _normal_matrices(xp, w, graph)
    rhs = (w * y0) @ xp.asarray(graph.design)
    N, rhs = _ground(xp, N, rhs, fixed)
    series, ok = _solve(xp, N, rhs)
    series = xp.where(fixed & (xp.arange(T) != reference), xp.nan, series)
    return series, labels, ok
