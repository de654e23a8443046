"""Spatial integration of the arc estimates into point parameters, with arc testing.

``integrate_network`` turns per-arc differences (velocity, height error, unwrapped phase per
epoch) into per-point values relative to a reference point by sparse weighted least squares over
the network: one factorisation of ``A^T W A`` (SuperLU) serves every right-hand side (velocity,
height error and all epochs). Arcs failing a w-test are removed one by one, weakly connected
points and all but the largest connected component are dropped, and the result says what was
removed and why (DESIGN.md §1).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import xarray as xr
from pydantic import Field, model_validator
from scipy.linalg import cho_factor, cho_solve, lapack
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import splu
from scipy.stats import norm

from depsi.conventions import phase_per_metre, wrap_phase
from depsi.kernels.lstsq import lstsq_batched
from depsi.kernels.periodogram import result_coherence
from depsi.kernels.temporal import design_matrix
from depsi.processing.network import cell_keys, point_positions, worker_threads
from depsi.sections import Section
from depsi.stm.schema import h2ph_rows, validate, years_since_mother

logger = logging.getLogger(__name__)

#: Arcs with ensemble coherence below this are not used by default.
DEFAULT_MIN_COHERENCE = 0.6
#: Significance level of each w-test (two-sided); critical value about 3.29.
DEFAULT_ALPHA = 0.001
#: At most this many testing iterations (each removes the worst failing arc of every
#: independent part of the network, then solves again).
DEFAULT_MAX_ITERATIONS = 100

#: Networks of more points are tested tile by tile (tiles of about this many points), then
#: solved once as a whole: the factorisations stay small and the cost grows linearly. The
#: whole network's w-statistics, with the tiles' redundancy numbers, are then reported, not
#: iterated on: on a 10^6-point scene 5 more whole-network iterations (each a factorisation of
#: 148,000 points) removed 21 of 930,000 arcs, where alpha = 0.001 expects about 900 false
#: alarms among that many clean arcs.
TILE_POINTS = 8000
#: Arcs per block of the misclosure statistics, and probes per block of the redundancy
#: estimate: bound the temporaries of a network of millions of arcs.
ARC_BLOCK = 65536
#: Points per block of the point results (float64 temporaries of about 10 x 8 bytes per point
#: and epoch: 80 MB a block at 60 epochs)
POINT_BLOCK = 16384
PROBE_BLOCK = 16
#: Margin of each tile's sub-network, in median arc lengths: arcs near a tile's edge are
#: tested with loops on both sides.
TILE_MARGIN = 3.0

#: Radius (m) of the reference area: results are relative to the mean over the first-order
#: network points within it (about 250 points at 2000 first-order points per 100 km^2). The
#: datum error is spatially correlated over about a kilometre (atmosphere finer than the
#: screen estimate, projected on the baselines), so smaller areas average little of it out.
DEFAULT_REFERENCE_RADIUS = 2000.0


class IntegrationConfig(Section):
    """Spatial integration of the arcs over the network, arc testing and the reference."""

    min_coherence: float = Field(
        DEFAULT_MIN_COHERENCE, ge=0, le=1,
        description="Arcs with a lower ensemble coherence are not used.")
    alpha: float = Field(
        DEFAULT_ALPHA, gt=0, lt=1, description="Significance level of each arc's w-test "
                                               "(family-wise over its misclosures).")
    max_iterations: int = Field(
        DEFAULT_MAX_ITERATIONS, ge=0, description="Most testing iterations (each removes the "
                                                  "worst failing arcs and solves again).")
    reference: int | None = Field(
        None, ge=0, description="Reference point: its index along the space of the point STM "
                                "(a first-order point); null: the most coherent point near "
                                "the centre of the network.")
    reference_lonlat: tuple[float, float] | None = Field(
        None, description="Reference point by position, [lon, lat] in WGS84 degrees: the "
                          "first-order point nearest to it, which must lie within "
                          "reference_radius (m; 100 m when that is null or 0). Excludes "
                          "'reference'.")
    reference_radius: float | None = Field(
        DEFAULT_REFERENCE_RADIUS, ge=0,
        description="Results are relative to the mean over the network points within this "
                    "distance (m) of the reference point; null or 0: the point alone.")
    reference_noise: bool = Field(
        True, description="Estimate the reference point's own noise from its neighbours and "
                          "remove it from every point.")

    @model_validator(mode="after")
    def _one_reference(self) -> IntegrationConfig:
        if self.reference is not None and self.reference_lonlat is not None:
            raise ValueError("reference and reference_lonlat: expected at most one of them, "
                             f"found both ({self.reference} and {list(self.reference_lonlat)})")
        if self.reference_lonlat is not None:
            lon, lat = self.reference_lonlat
            if not (-180 <= lon <= 360 and -90 <= lat <= 90):
                raise ValueError(f"reference_lonlat: expected [lon, lat] in degrees, found "
                                 f"{list(self.reference_lonlat)}")
        return self
#: Up to this many unknowns the arcs' redundancy numbers come from the exact inverse of the
#: normal matrix (``n^2`` floats); above, from random probes.
EXACT_REDUNDANCY_POINTS = 1000
#: Random sign probes of the redundancy estimate for larger networks (relative error about
#: ``1 / sqrt(probes)`` of the leverage).
REDUNDANCY_PROBES = 64
#: Redundancy numbers are recomputed once this fraction of the arcs was removed since.
REDUNDANCY_REFRESH = 0.02
#: Arcs with a redundancy number below this cannot be tested (a bridge: no loop checks them).
MIN_REDUNDANCY = 0.02

#: Neighbours of the reference point whose residuals estimate its own noise.
REFERENCE_NEIGHBOURS = 30

#: Why a point left the network (variable ``removal_reason``; legend also in attrs).
POINT_REASONS = {0: "kept", 1: "fewer than 2 usable arcs", 2: "outside largest component"}
#: Why an arc left the network (variable ``arc_removal_reason`` of the returned arcs).
ARC_REASONS = {0: "kept", 1: "coherence below min_coherence", 2: "rejected by w-test",
               3: "touches a removed point"}

_TWO_PI = 2.0 * np.pi


def incidence_matrix(source: np.ndarray, target: np.ndarray, n_points: int) -> sp.csr_matrix:
    """Sparse ``(arc, point)`` matrix with -1 at the source and +1 at the target of each arc.

    Examples
    --------
    >>> incidence_matrix(np.array([0, 1]), np.array([1, 2]), 3).toarray().tolist()
    [[-1.0, 1.0, 0.0], [0.0, -1.0, 1.0]]
    """
    m = len(source)
    rows = np.repeat(np.arange(m), 2)
    cols = np.column_stack([source, target]).ravel()
    vals = np.tile(np.array([-1.0, 1.0]), m)
    return sp.csr_matrix((vals, (rows, cols)), shape=(m, n_points))


def phase_variance_from_coherence(coherence: np.ndarray) -> np.ndarray:
    """Phase variance (rad^2) implied by an ensemble coherence, ``-2 ln(coherence)``.

    For Gaussian phase noise of variance s^2, ``|E exp(j noise)| = exp(-s^2 / 2)``. Coherence is
    clipped to [0.05, 0.995] so weights stay finite.

    Examples
    --------
    >>> float(phase_variance_from_coherence(np.array(np.exp(-0.125)))).__round__(3)
    0.25
    """
    gamma = np.clip(np.asarray(coherence, dtype=np.float64), 0.05, 0.995)
    return -2.0 * np.log(gamma)


def _prune(source, target, arc_ok, n, reference):
    """Drop points with < 2 usable arcs (repeatedly), then all but the largest component.

    Returns updated ``arc_ok`` and per-point / per-arc reason codes (0 where still kept).
    """
    point_reason = np.zeros(n, dtype=np.int8)
    arc_ok = arc_ok.copy()
    while True:
        degree = (np.bincount(source[arc_ok], minlength=n)
                  + np.bincount(target[arc_ok], minlength=n))
        weak = (degree < 2) & (point_reason == 0)
        if not weak.any():
            break
        point_reason[weak] = 1
        arc_ok &= (point_reason[source] == 0) & (point_reason[target] == 0)
    alive = point_reason == 0
    if alive.any():
        graph = sp.coo_matrix((np.ones(arc_ok.sum()), (source[arc_ok], target[arc_ok])),
                              shape=(n, n))
        _, labels = connected_components(graph, directed=False)
        if reference is not None and alive[reference]:
            main = labels[reference]
        else:
            main = np.bincount(labels[alive]).argmax()
        outside = alive & (labels != main)
        point_reason[outside] = 2
        arc_ok &= (point_reason[source] == 0) & (point_reason[target] == 0)
    return arc_ok, point_reason


#: Right-hand-side columns cast to float64 together in :func:`_solve` (bounds that copy to
#: 64 bytes an arc).
RHS_COLUMNS = 8

#: Normal matrices up to this many unknowns go to QDLDL (:class:`_LDL`), larger ones to CHOLMOD
#: (:class:`_Cholesky`). At a w-test tile's 8,900 unknowns QDLDL factorises in 36 ms against
#: cholespy's 80 ms and releases the GIL (cholespy holds it), though its one-column solves take
#: 3.5x longer than CHOLMOD's: the tiles of the 10^6 scene's first-order network took 24.4 s
#: on 2 threads against 38.2 s. CHOLMOD (simplicial, as cholespy sets it, NESDIS ordering) is
#: the faster one for the whole network (148,000 unknowns).
LDL_MAX_UNKNOWNS = 50_000


def _solve(source, target, weights, rhs, kept, n, point_ok, reference, *, leverage=False):
    """Weighted LSQ over the arcs ``kept`` (indices into the arrays); returns ``(n, nrhs)``
    values (NaN off-network) and, with ``leverage``, each kept arc's ``w_a a^T N^-1 a`` (one
    minus its redundancy number). See :class:`_NetworkSolve`."""
    solved = _NetworkSolve(source, target, weights, rhs, kept, n, point_ok, reference)
    return solved.values(), (solved.leverage() if leverage else None)


#: A w-test iteration that removed at most this many arcs, with at most
#: :data:`WOODBURY_MAX_TOTAL` removed since the last factorisation and no point lost, updates
#: that solution (:meth:`_NetworkSolve.without`) instead of factorising again: a tile's
#: iterations after the first few remove a handful of arcs each.
WOODBURY_MAX_NEW = 48
#: See :data:`WOODBURY_MAX_NEW`: the update's dense ``(k, k)`` system and ``(unknowns, k)``
#: columns stay small.
WOODBURY_MAX_TOTAL = 256


class _NetworkSolve:
    """The weighted least-squares solution of the network over the arcs ``kept`` (indices into
    the arrays), factorised once, and that solution with some of those arcs removed.

    The reference column is removed (its value is fixed to 0); ``N = A^T W A`` is factorised
    once and all right-hand sides are solved together. ``A^T W`` takes the kept rows of
    ``rhs`` where they lie (no copy of the ``(arcs, nrhs)`` right-hand sides).

    :meth:`without` removes arcs by the Sherman-Morrison-Woodbury identity: with
    ``G = N^-1 A_R^T`` and ``S = W_R^-1 - A_R G``, the solution without the arcs ``R`` is
    ``u + G S^-1 A_R u``, ``u = x - G W_R y_R`` (one solve per removed arc through the same
    factorisation, a ``(k, k)`` Cholesky); it agrees with a new factorisation to about 1e-13.
    """

    def __init__(self, source, target, weights, rhs, kept, n, point_ok, reference):
        unknown = point_ok.copy()
        unknown[reference] = False
        n_unknown = int(unknown.sum())
        # the reference maps to an extra last column, dropped below
        col = np.full(n, n_unknown, dtype=np.int64)
        col[unknown] = np.arange(n_unknown)
        A = incidence_matrix(col[source[kept]], col[target[kept]], n_points=n_unknown + 1)
        A = A[:, :-1].tocsc()
        w = weights[kept]
        AtW = A.T.multiply(w[None, :]).tocsr()
        normal = (AtW @ A).tocsc()
        self.lu = _factorise(normal)
        # A^T W over every arc, zero columns for the others: the product reads only kept rows
        AtW_all = sp.csr_matrix((AtW.data, kept[AtW.indices], AtW.indptr),
                                shape=(n_unknown, len(source)))
        # A^T W y a few columns at a time: the sparse product would otherwise first copy the
        # whole float32 (arcs, nrhs) right-hand sides to float64
        normal_rhs = np.empty((n_unknown, rhs.shape[1]))
        for first in range(0, rhs.shape[1], RHS_COLUMNS):
            columns = slice(first, first + RHS_COLUMNS)
            normal_rhs[:, columns] = AtW_all @ rhs[:, columns].astype(np.float64)
        self._x0 = self.x = self.lu.solve(normal_rhs)
        self.source, self.target, self.weights, self.rhs = source, target, weights, rhs
        self.kept, self.point_ok, self.reference = kept, point_ok.copy(), reference
        self.unknown, self.col, self.A, self.w, self.normal = unknown, col, A, w, normal
        self.removed = np.zeros(0, dtype=np.int64)  # arcs of kept removed by without()
        self._G = np.zeros((n_unknown, 0))
        self._S = None  # the Cholesky factor of S, once arcs are removed

    def values(self) -> np.ndarray:
        """``(n, nrhs)``: NaN off the network, 0 at the reference."""
        values = np.full((len(self.point_ok), self.x.shape[1]), np.nan)
        values[self.unknown] = self.x
        values[self.reference] = 0.0
        return values

    def arcs(self) -> np.ndarray:
        """The arcs of the current solution (``kept`` less those removed), in order."""
        return self.kept[self._rows()]

    def _rows(self) -> np.ndarray:
        """Which of ``kept`` are current."""
        return ~np.isin(self.kept, self.removed)

    @property
    def n_arcs(self) -> int:
        """How many arcs the current solution has (``removed`` are distinct arcs of kept)."""
        return self.kept.size - self.removed.size

    def _ends(self, arcs):
        return self.col[self.source[arcs]], self.col[self.target[arcs]]

    def without(self, new: np.ndarray) -> bool:
        """Remove the arcs ``new`` (of the current ones) from the solution without a new
        factorisation; False (and nothing changed) where the update is too large or its
        ``S`` is not safely positive definite (the caller factorises afresh)."""
        if not 0 < new.size <= WOODBURY_MAX_NEW or (
                self.removed.size + new.size > WOODBURY_MAX_TOTAL):
            return False
        n_unknown = self.x.shape[0]
        source, target = self._ends(new)
        columns = np.zeros((n_unknown + 1, new.size))  # a_r^T, the reference row dropped
        j = np.arange(new.size)
        np.add.at(columns, (target, j), 1.0)
        np.add.at(columns, (source, j), -1.0)
        solved = np.asarray(self.lu.solve(columns[:n_unknown])).reshape(n_unknown, new.size)
        G = np.hstack([self._G, solved])
        removed = np.concatenate([self.removed, new])
        w_r = self.weights[removed]
        s_r, t_r = self._ends(removed)
        G_ext = np.vstack([G, np.zeros((1, G.shape[1]))])
        S = np.diag(1.0 / w_r) - (G_ext[t_r] - G_ext[s_r])
        S = 0.5 * (S + S.T)
        try:
            factor = cho_factor(S, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            return False
        if np.min(np.diag(factor[0])) ** 2 < 1e-10 * np.max(np.diag(S)):
            return False  # removing these arcs nearly disconnects the network
        u = self._x0 - G @ (w_r[:, None] * np.asarray(self.rhs[removed], dtype=np.float64))
        u_ext = np.vstack([u, np.zeros((1, u.shape[1]))])
        self.x = u + G @ cho_solve(factor, u_ext[t_r] - u_ext[s_r], check_finite=False)
        self.removed, self._G, self._S = removed, G, factor
        return True

    def leverage(self) -> np.ndarray:
        """``w_a a^T N^-1 a`` of each current arc (:meth:`arcs`), through this factorisation
        (and the update, where arcs were removed)."""
        n_unknown = self.x.shape[0]
        if not self.removed.size:
            return _leverage(self.A, self.w, self.lu, self.normal, n_unknown)
        rows = self._rows()
        A = self.A.tocsr()[rows].tocsc()
        w = self.w[rows]
        if n_unknown <= EXACT_REDUNDANCY_POINTS:
            return _leverage(A, w, None, (A.T.multiply(w[None, :]) @ A).tocsc(), n_unknown)
        return _leverage(A, w, _Updated(self.lu, self._G, self._S), None, n_unknown)


class _Updated:
    """``N^-1`` after a Woodbury update: ``N0^-1 b + G S^-1 G^T b``."""

    def __init__(self, lu, G, factor):
        self.lu, self.G, self.factor = lu, G, factor

    def solve(self, b: np.ndarray) -> np.ndarray:
        return self.lu.solve(b) + self.G @ cho_solve(self.factor, self.G.T @ b,
                                                      check_finite=False)


class _Cholesky:
    """A sparse symmetric positive definite matrix factorised once (CHOLMOD's Cholesky
    through cholespy, which asks for the simplicial one: its multi-right-hand-side solves are
    about 10x faster than SuperLU's on a 150,000-point network); ``solve(b)`` for ``b`` of
    shape ``(n,)`` or ``(n, k)``."""

    def __init__(self, matrix: sp.spmatrix):
        import cholespy

        csr = sp.csr_matrix(matrix)
        csr.sort_indices()
        self.n = csr.shape[0]
        self._solver = cholespy.CholeskySolverD(
            self.n, csr.indptr.astype(np.int32), csr.indices.astype(np.int32),
            csr.data.astype(np.float64), cholespy.MatrixType.CSR)

    def solve(self, b: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(b, dtype=np.float64)
        x = np.zeros_like(b)
        self._solver.solve(b, x)
        if b.ndim == 2 and b.shape[1] > 1:
            # cholespy 2.2 keeps the last solve's (n, k) workspace and does not free it when
            # the solver is destroyed: 3.2 MB lost per solver at 7,000 unknowns and 62
            # columns, 1.1 GB over the w-test's tiles at 10^6 points. A one-column solve
            # shrinks the workspace to (n, 1), whose loss is negligible
            self._solver.solve(np.zeros(self.n), np.zeros(self.n))
        return x


class _LDL:
    """A sparse symmetric positive definite matrix factorised by QDLDL (OSQP's LDL^T, its own
    AMD ordering). It releases the GIL while it factorises and solves, so the w-test's tiles
    factorise on every core at once; ``solve(b)`` for ``b`` of shape ``(n,)`` or ``(n, k)``,
    one right-hand side at a time (0.8 ms each at 8,900 unknowns)."""

    def __init__(self, matrix: sp.spmatrix):
        import qdldl

        self.n = matrix.shape[0]
        self._solver = qdldl.Solver(sp.triu(matrix, format="csc"))

    def solve(self, b: np.ndarray) -> np.ndarray:
        if b.ndim == 1:
            return self._solver.solve(np.ascontiguousarray(b, dtype=np.float64))
        columns = np.asfortranarray(b, dtype=np.float64)
        x = np.empty(b.shape, order="F")
        for j in range(b.shape[1]):  # the right-hand sides (epochs, probes): a few dozen
            x[:, j] = self._solver.solve(columns[:, j])
        return x


def _factorise(normal: sp.spmatrix):
    """The factorisation of the normal matrix: :class:`_LDL` up to
    :data:`LDL_MAX_UNKNOWNS` unknowns (a tile's), :class:`_Cholesky` above (the whole
    network), SuperLU (symmetric mode, MMD ordering) where neither package can be imported."""
    solvers = (_LDL, _Cholesky) if normal.shape[0] <= LDL_MAX_UNKNOWNS else (_Cholesky,)
    for solver in solvers:
        try:
            return solver(normal)
        except ImportError:
            continue
    return splu(normal, permc_spec="MMD_AT_PLUS_A",
                options={"SymmetricMode": True, "DiagPivotThresh": 0.0})


def _leverage(A, weights, lu, normal, n_unknown):
    """``w_a a^T N^-1 a`` per arc (the diagonal of the hat matrix)."""
    if n_unknown <= EXACT_REDUNDANCY_POINTS:
        factor, info = lapack.dpotrf(normal.toarray(), lower=1)
        inverse, info2 = lapack.dpotri(factor, lower=1)
        if info or info2:
            raise np.linalg.LinAlgError(f"normal matrix not positive definite (LAPACK {info}, "
                                        f"{info2})")
        inverse = np.tril(inverse) + np.tril(inverse, -1).T
        rows = A.tocsr()
        coo = rows.tocoo()
        # a^T Q a for rows with entries (c_i, v_i): sum_ij v_i v_j Q[c_i, c_j]
        order = np.argsort(coo.row, kind="stable")
        r, c, v = coo.row[order], coo.col[order], coo.data[order]
        starts = np.searchsorted(r, np.arange(A.shape[0]))
        counts = np.diff(np.append(starts, len(r)))
        quad = np.zeros(A.shape[0])
        one = counts >= 1
        quad[one] = v[starts[one]] ** 2 * inverse[c[starts[one]], c[starts[one]]]
        two = counts == 2
        s0, s1 = starts[two], starts[two] + 1
        quad[two] += (v[s1] ** 2 * inverse[c[s1], c[s1]]
                      + 2 * v[s0] * v[s1] * inverse[c[s0], c[s1]])
        return weights * quad
    root = np.sqrt(weights)
    rows = A.tocsr()
    total = np.zeros(A.shape[0])

    def probes(first, count, block):  # the same signs each time they are asked for
        rng = np.random.default_rng((first, block.start))
        rows = block.stop - block.start  # one random bit a sign: 5x faster than rng.choice
        bits = np.unpackbits(np.frombuffer(rng.bytes(-(-rows * count // 8)), np.uint8))
        return bits[:rows * count].reshape(rows, count) * 2.0 - 1.0

    # the probes in blocks of columns, and each over blocks of ARC_BLOCK arcs: the temporaries
    # are (ARC_BLOCK, PROBE_BLOCK) whatever the network's size
    blocks = [slice(start, min(start + ARC_BLOCK, A.shape[0]))
              for start in range(0, A.shape[0], ARC_BLOCK)]
    for first in range(0, REDUNDANCY_PROBES, PROBE_BLOCK):
        count = min(PROBE_BLOCK, REDUNDANCY_PROBES - first)
        projected = np.zeros((A.shape[1], count))
        for block in blocks:
            projected += rows[block].T @ (root[block, None] * probes(first, count, block))
        solved = lu.solve(np.ascontiguousarray(projected))
        for block in blocks:
            hat = root[block, None] * (rows[block] @ solved)
            total[block] += np.sum(hat * probes(first, count, block), axis=1)
    return np.clip(total / REDUNDANCY_PROBES, 0.0, 1.0)


def _independent_worst(candidates, w_stat, source, target, n):
    """Arcs to remove in one iteration: the worst failing arc, and every other failing arc,
    worst first, that shares no point with an arc already chosen.

    An arc's error enters the misclosures of the arcs at its two points; those arcs wait for
    the next iteration. Blocking one ring more (every arc of the points' neighbours) removed
    the same arcs on a 10^5-point scene (3,609 against 3,613 in its largest tile) in three
    times as many iterations: the failing arcs of a real network are mostly wrong themselves,
    not the neighbours of a wrong one."""
    order = candidates[np.argsort(-w_stat[candidates], kind="stable")]
    blocked = np.zeros(n, dtype=bool)
    chosen = []
    for arc in order:  # failing arcs only: few, not a loop over the network
        s, t = source[arc], target[arc]
        if blocked[s] or blocked[t]:
            continue
        chosen.append(arc)
        blocked[s] = blocked[t] = True
    return np.asarray(chosen, dtype=np.int64)


def _choose_reference(positions, point_ok, point_quality, fraction=0.05, minimum=10):
    """Best-quality point among those nearest the centre of the network."""
    idx = np.flatnonzero(point_ok)
    centre = 0.5 * (positions[idx].min(axis=0) + positions[idx].max(axis=0))
    dist = np.hypot(*(positions[idx] - centre).T)
    n_near = min(len(idx), max(minimum, int(fraction * len(idx))))
    near = idx[np.argsort(dist, kind="stable")[:n_near]]
    return int(near[np.argmax(point_quality[near])])


def _point_quality(source, target, arc_ok, coherence, n):
    weight = np.where(arc_ok, coherence, 0.0)
    count = np.bincount(source, arc_ok, n) + np.bincount(target, arc_ok, n)
    total = np.bincount(source, weight, n) + np.bincount(target, weight, n)
    return np.divide(total, count, out=np.zeros(n), where=count > 0)


def _largest_misclosure(rhs, values, source, target, sd) -> np.ndarray:
    """Per arc, the largest of its misclosures (velocity, height, each epoch's phase) divided
    by their standard deviations; computed over blocks of :data:`ARC_BLOCK` arcs, so no
    ``(arcs, epochs)`` temporary is made. In float32, the precision of the right-hand sides
    (an unwrapped phase of 1,000 rad to 6e-5 rad, where no arc's standard deviation is below
    0.1 rad); the per-arc divisions are float64."""
    sd_velocity, sd_height, sd_phase = (np.broadcast_to(v, source.shape) for v in sd)
    values = values.astype(np.float32)
    out = np.empty(len(source))
    for start in range(0, len(source), ARC_BLOCK):
        rows = slice(start, start + ARC_BLOCK)
        misclosure = values[target[rows]]
        misclosure -= values[source[rows]]
        np.subtract(rhs[rows], misclosure, out=misclosure)
        np.abs(misclosure, out=misclosure)
        out[rows] = np.maximum(np.maximum(misclosure[:, 0] / sd_velocity[rows],
                                          misclosure[:, 1] / sd_height[rows]),
                               misclosure[:, 2:].max(axis=1) / sd_phase[rows])
    return out


def _test_arcs(source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions,
               coherence, sd, critical, max_iterations, *, redundancy=None):
    """The w-test iterations on one network: solve, test every arc, remove the failing arcs
    :func:`_independent_worst` chooses, until none fails (or ``max_iterations``).
    ``arc_reason`` is updated in place (2: rejected). ``redundancy``: the arcs' redundancy
    numbers, given (e.g. by the tiles) instead of estimated. Returns ``(arc_ok, point_reason,
    values, ref, w_stat, redundancy, iterations, n_removed)``."""
    w_stat = np.zeros(len(source))
    n_tested_out = 0
    iterations = 0
    estimate = redundancy is None
    cached = None if estimate else (redundancy, int(arc_ok.sum()))
    solved = None  # the last factorised solution (possibly updated since)
    removed = np.zeros(0, dtype=np.int64)  # by the last iteration
    while True:
        arc_ok, point_reason = _prune(source, target, arc_ok, n, reference)
        point_ok = point_reason == 0
        if reference is not None and not point_ok[reference]:
            raise ValueError(f"reference: point {reference} was removed from the network "
                             f"({POINT_REASONS[int(point_reason[reference])]})")
        if point_ok.sum() < 2:
            raise ValueError("network: fewer than 2 points remain after removing weak arcs")
        quality = _point_quality(source, target, arc_ok, coherence, n)
        ref = (int(reference) if reference is not None
               else _choose_reference(positions, point_ok, quality))
        # redundancy numbers change little when a few arcs go: they are recomputed when more
        # than REDUNDANCY_REFRESH of the arcs went since, and always before testing stops
        fresh = estimate and (cached is None
                              or arc_ok.sum() < (1.0 - REDUNDANCY_REFRESH) * cached[1])
        # the arcs are those of the last solution less the ones just removed (no point or arc
        # pruned), or the same (a refresh of the redundancy numbers): no new factorisation
        same = (solved is not None and solved.reference == ref
                and np.array_equal(point_ok, solved.point_ok)
                and int(arc_ok.sum()) == solved.n_arcs - removed.size)
        if not (same and (not removed.size or (not fresh and solved.without(removed)))):
            solved = _NetworkSolve(source, target, weights, rhs, np.flatnonzero(arc_ok), n,
                                   point_ok, ref)
        values = solved.values()
        if fresh:
            cached = (np.zeros(len(source)), int(arc_ok.sum()))
            cached[0][arc_ok] = 1.0 - solved.leverage()
        redundancy = np.where(arc_ok, cached[0], 0.0)
        testable = arc_ok & (redundancy >= MIN_REDUNDANCY)
        if not testable.any():
            logger.warning("network has no redundancy (a tree): arcs cannot be tested")
            break
        normalised = _largest_misclosure(rhs, values, source, target, sd) / np.sqrt(
            np.where(testable, redundancy, 1.0))
        w_stat = np.where(testable, normalised, 0.0)
        failing = np.flatnonzero(w_stat > critical)
        removed = np.zeros(0, dtype=np.int64)
        if not failing.size:
            if fresh or not estimate:
                break
            cached = None
            continue
        if iterations >= max_iterations:
            if estimate:
                logger.warning("arc testing stopped after max_iterations=%d iterations (%d "
                               "arcs removed); %d arcs that still fail the w-test are kept",
                               max_iterations, n_tested_out, failing.size)
            break
        removed = _independent_worst(failing, w_stat, source, target, n)
        arc_ok[removed] = False
        arc_reason[removed] = 2
        n_tested_out += removed.size
        iterations += 1
    return arc_ok, point_reason, values, ref, w_stat, redundancy, iterations, n_tested_out


def _tile_waves(tiles: np.ndarray, cell: float, margin: float) -> list[np.ndarray]:
    """The tiles in waves whose members share no arc: the four parity classes of the tile
    indices when a tile's margin is less than half a tile (two tiles of one class are a whole
    tile apart, so their sub-networks with margins are disjoint), else one tile a wave.

    Examples
    --------
    >>> tiles = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0]])
    >>> [w.tolist() for w in _tile_waves(tiles, cell=100.0, margin=10.0)]
    [[[0, 0], [2, 0]], [[0, 1]], [[1, 0]], [[1, 1]]]
    >>> len(_tile_waves(tiles, cell=100.0, margin=60.0))
    5
    """
    if not 2 * margin < cell:
        return [tiles[i:i + 1] for i in range(len(tiles))]
    parity = tiles % 2
    waves = [tiles[(parity == p).all(axis=1)] for p in ((0, 0), (0, 1), (1, 0), (1, 1))]
    return [wave for wave in waves if len(wave)]


def _test_tile(tile, *, low, cell, margin, positions, source, target, arc_ok, weights, rhs,
               coherence, sd, critical, max_iterations, tile_of_arc):
    """One tile's w-test on its sub-network (its points and the margin around it). Returns
    ``(own arcs, their redundancy numbers, own arcs rejected)`` or None when the tile is too
    weak to test on its own; reads ``arc_ok`` and writes nothing shared."""
    n = len(positions)
    lo, hi = low + tile * cell - margin, low + (tile + 1) * cell + margin
    inside = np.all((positions >= lo) & (positions < hi), axis=1)
    members = np.flatnonzero(arc_ok & inside[source] & inside[target])
    if members.size < 3:
        return None
    points = np.unique(np.concatenate([source[members], target[members]]))
    local = np.full(n, -1, dtype=np.int64)
    local[points] = np.arange(points.size)
    reason = np.zeros(members.size, dtype=np.int8)
    try:
        *_, tile_redundancy, _, _ = _test_arcs(
            local[source[members]], local[target[members]],
            np.ones(members.size, dtype=bool), reason, weights[members], rhs[members],
            points.size, None, positions[points], coherence[members],
            tuple(np.broadcast_to(v, source.shape)[members] for v in sd), critical,
            max_iterations)
    except ValueError as err:  # a tile too weak to test on its own
        logger.debug("tile %s not tested: %s", tile.tolist(), err)
        return None
    own = np.all(tile_of_arc[members] == tile, axis=1)
    return members[own], tile_redundancy[own], members[(reason == 2) & own]


def _test_by_tiles(source, target, arc_ok, arc_reason, weights, rhs, n, positions, coherence,
                   sd, critical, max_iterations):
    """The w-test of a large network, tile by tile: each tile of about :data:`TILE_POINTS`
    points is tested on the sub-network of its points and a margin of
    :data:`TILE_MARGIN` median arc lengths around it, and decides on the arcs whose midpoint
    lies in it. Every factorisation is a tile's, so the cost grows linearly with the number of
    points. The tiles run in the waves of :func:`_tile_waves`, a wave's tiles on
    :func:`~depsi.processing.network.worker_threads` threads at once, each wave seeing the
    arcs the waves before it rejected; the result does not depend on the number of threads.
    (A tile's factorisation and solves are QDLDL's, :class:`_LDL`, which releases the GIL:
    they run on every core.)
    Returns the updated ``arc_ok``, the number of arcs the tiles rejected, and each arc's
    redundancy number in its own tile (0 where its tile could not be tested)."""
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    cell = float(np.sqrt(np.prod(np.ptp(positions, axis=0) + 1.0) * TILE_POINTS / n))
    low = positions.min(axis=0)
    midpoint = 0.5 * (positions[source] + positions[target])
    tile_of_arc = np.floor((midpoint - low) / cell).astype(np.int64)
    length = np.hypot(*(positions[target] - positions[source]).T)
    margin = TILE_MARGIN * float(np.median(length[arc_ok])) if arc_ok.any() else 0.0
    # the tiles holding arcs, in row order (by their keys: np.unique over rows took 1.6 s at
    # 1.43 M arcs, before any tile starts)
    used = tile_of_arc[arc_ok]
    tiles = used[np.unique(cell_keys(used), return_index=True)[1]]
    waves = _tile_waves(tiles, cell, margin)
    workers = worker_threads()
    rejected = 0
    redundancy = np.zeros(len(source))
    test = partial(_test_tile, low=low, cell=cell, margin=margin, positions=positions,
                   source=source, target=target, arc_ok=arc_ok, weights=weights, rhs=rhs,
                   coherence=coherence, sd=sd, critical=critical,
                   max_iterations=max_iterations, tile_of_arc=tile_of_arc)
    with ThreadPoolExecutor(max(1, min(workers, max(map(len, waves), default=1)))) as pool:
        for wave in waves:  # a few dozen tiles, each a network of about TILE_POINTS points
            # the wave's tiles share no arc: they read arc_ok while the others run, and their
            # decisions are applied when the whole wave is done
            for outcome in list(pool.map(test, wave)):
                if outcome is None:
                    continue
                own, own_redundancy, removed = outcome
                redundancy[own] = own_redundancy
                arc_ok[removed] = False
                arc_reason[removed] = 2
                rejected += removed.size
    logger.info("integration: %d arcs rejected by the w-test in %d tiles of %.0f m (%d waves, "
                "%d threads)", rejected, len(tiles), cell, len(waves), workers)
    return arc_ok, rejected, redundancy


class ArcObservations(NamedTuple):
    """What integration needs of the arcs, without their ``(arc, time)`` variables:
    endpoints, coherence, the right-hand sides (velocity, height error, every epoch's unwrapped
    phase; float32 ``(arcs, 2 + epochs)``) and the spread of each arc's h2ph over the epochs.
    Made by :func:`arc_observations`; :func:`integrate_network` takes it in place of the arcs,
    so a caller can let the arc STM go before the network is solved."""

    source: np.ndarray
    target: np.ndarray
    coherence: np.ndarray
    rhs: np.ndarray
    h2ph_spread: np.ndarray


def _check_arc_ends(source: np.ndarray, target: np.ndarray, n: int) -> None:
    if source.size and (max(source.max(), target.max()) >= n or min(source.min(),
                                                                    target.min()) < 0):
        raise ValueError(f"arcs: source/target expected in [0, {n}) (the points' space), found "
                         f"range [{min(source.min(), target.min())}, "
                         f"{max(source.max(), target.max())}]")


def empty_observations(source: np.ndarray, target: np.ndarray, n_epochs: int
                       ) -> ArcObservations:
    """:class:`ArcObservations` of the arcs ``source`` -> ``target``, their values to be filled
    by :func:`fill_observations` (allocated, not touched: memory is taken as rows are filled)."""
    n = len(source)
    return ArcObservations(np.asarray(source, dtype=np.int64), np.asarray(target, dtype=np.int64),
                           np.empty(n), np.empty((n, 2 + n_epochs), np.float32), np.empty(n))


def fill_observations(observations: ArcObservations, start: int, arcs: xr.Dataset) -> None:
    """Rows ``start:start + arcs.sizes['arc']`` of ``observations`` from estimated arcs in
    memory (``phase``, ``ambiguity``, ``velocity``, ``height_error``, ``temporal_coherence``,
    ``h2ph``), in blocks of :data:`ARC_BLOCK` arcs (no ``(arcs, epochs)`` temporaries)."""
    stop = start + arcs.sizes["arc"]
    rhs = observations.rhs
    observations.coherence[start:stop] = arcs["temporal_coherence"].values
    # velocity, height and every epoch's unwrapped phase: the right-hand sides, filled in
    # place (no second (arcs, epochs) copy). float32, the precision of the arcs' estimates and
    # wrapped phases they come from (an unwrapped phase of 100 rad is held to 8e-6 rad, far
    # below any arc's noise); the normal equations and solutions are float64
    rhs[start:stop, 0] = arcs["velocity"].values
    rhs[start:stop, 1] = arcs["height_error"].values
    arc_phase = arcs["phase"].transpose("arc", "time").values
    arc_ambiguity = arcs["ambiguity"].transpose("arc", "time").values
    arc_h2ph = np.asarray(arcs["h2ph"].transpose("arc", ...).values).reshape(stop - start, -1)
    for first in range(0, stop - start, ARC_BLOCK):
        block = slice(first, first + ARC_BLOCK)
        rows = slice(start + first, min(start + first + ARC_BLOCK, stop))
        np.multiply(arc_ambiguity[block], _TWO_PI, out=rhs[rows, 2:])
        rhs[rows, 2:] += arc_phase[block]
        h2ph = arc_h2ph[block].astype(np.float64)  # its spread over the epochs
        observations.h2ph_spread[rows] = np.sqrt(
            np.sum((h2ph - h2ph.mean(axis=1, keepdims=True)) ** 2, axis=1))


def arc_observations(points: xr.Dataset, arcs: xr.Dataset) -> ArcObservations:
    """The arcs' observations for :func:`integrate_network`, computed from the arcs of
    :func:`depsi.processing.arcs.estimate_arcs` (``phase``, ``ambiguity``, ``velocity``,
    ``height_error``, ``temporal_coherence``, ``h2ph``) on ``points``.

    Examples
    --------
    >>> from depsi.processing import (estimate_arcs, form_network, ps_selection,
    ...                               single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(40, 40), n_epochs=12, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> observations = arc_observations(points, estimate_arcs(form_network(points)))
    >>> observations.rhs.shape[1] == 2 + points.sizes["time"], observations.rhs.dtype
    (True, dtype('float32'))
    """
    validate(arcs, "arcs", require=("phase", "velocity", "height_error", "temporal_coherence",
                                    "ambiguity"))
    source = np.asarray(arcs["source"].values, dtype=np.int64)
    target = np.asarray(arcs["target"].values, dtype=np.int64)
    _check_arc_ends(source, target, points.sizes["space"])
    observations = empty_observations(source, target, points.sizes["time"])
    arcs = arcs[["phase", "velocity", "height_error", "temporal_coherence", "ambiguity",
                 "h2ph"]]
    # a lazy arc STM (a stored one: `depsi run` reads its arcs step's product) is read a few
    # of its chunks at a time, never whole (10 GB at 10^7 points)
    for start, stop in _read_batches(arcs["phase"].chunks, arcs.sizes["arc"]):
        fill_observations(observations, start, arcs.isel(arc=slice(start, stop)).compute())
    return observations


#: Arcs :func:`arc_observations` reads at a time from a lazy arc STM (whole chunks of it, at
#: least one): its memory follows this, not the number of arcs.
OBSERVATION_BATCH = 262_144


def _read_batches(chunks, n: int) -> list[tuple[int, int]]:
    """Row ranges of whole chunks along the first axis (``chunks`` of a Dask array, None for
    an in-memory one: one range), each at least one chunk and at most
    :data:`OBSERVATION_BATCH` rows where its chunks allow.

    Examples
    --------
    >>> _read_batches(((200_000, 200_000, 50_000), (60,)), 450_000)
    [(0, 200000), (200000, 450000)]
    >>> _read_batches(None, 10)
    [(0, 10)]
    """
    if chunks is None or n == 0:
        return [(0, n)]
    batches, start, stop = [], 0, 0
    for size in chunks[0]:
        if stop > start and stop - start + size > OBSERVATION_BATCH:
            batches.append((start, stop))
            start = stop
        stop += size
    batches.append((start, stop))
    return batches


def integrate_network(
    points: xr.Dataset,
    arcs: xr.Dataset | ArcObservations,
    *,
    reference: int | None = None,
    min_coherence: float = DEFAULT_MIN_COHERENCE,
    alpha: float = DEFAULT_ALPHA,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    reference_radius: float | None = None,
    return_arcs: bool = False,
) -> xr.Dataset | tuple[xr.Dataset, xr.Dataset]:
    """Integrate estimated arcs into point velocity, height error and unwrapped phase.

    Parameters
    ----------
    points
        The point STM the network was formed on (``phase``, ``h2ph``, ``time``, positions,
        ``wavelength``).
    arcs
        Output of :func:`depsi.processing.arcs.estimate_arcs`: ``source``, ``target``,
        ``phase``, ``velocity``, ``height_error``, ``temporal_coherence``, ``ambiguity``; or
        their :func:`arc_observations` (the same result, and the caller need not hold the arc
        STM while the network is solved; not with ``return_arcs``).
    reference
        Index into ``points.space`` of the reference point (all results relative to it).
        ``None``: the point with the best mean arc coherence among the 5% (at least 10) points
        nearest the centre of the network.
    min_coherence
        Arcs below this ensemble coherence are not used.
    alpha
        Significance level of the w-test of each arc (family-wise over the arc's velocity,
        height and per-epoch misclosures). While arcs fail, the worst failing arc of every
        independent part of the network (no point within one arc of another chosen arc's) is
        removed and the network solved again.
    max_iterations
        Bound on the number of testing iterations (each a new factorisation).
    reference_radius
        Radius (m) of the reference area: after the network solution (which fixes the single
        reference point), every result is re-referenced to the mean over the network points
        within this distance of the reference point (:func:`apply_reference_area`). ``None``
        (default): results stay relative to the reference point alone.
    return_arcs
        Also return the arcs with ``arc_kept``, ``arc_removal_reason`` and ``w_statistic``.

    Returns
    -------
    xarray.Dataset
        All input points, with ``velocity`` (m/yr), ``height_error`` (m), ``unwrapped_phase``
        (rad, atmosphere included), ``displacement`` (m, zero at the first epoch),
        ``ambiguity`` (int32), ``temporal_coherence``, all relative to the reference point;
        ``in_network`` (bool) and ``removal_reason`` (int8, legend in attrs). Off-network
        points carry NaN in the float results and 0 in ``ambiguity``: select
        ``in_network`` before use. ``reference_phase`` (time) is the reference point's wrapped
        phase. Attrs: ``reference``, counts of removed points and arcs by reason. With
        ``reference_radius``: relative to the reference area instead (``in_reference_area``,
        attrs ``reference_radius`` and ``n_reference_area``).

    Notes
    -----
    Arc weights are ``1 / s^2`` with ``s^2 = -2 ln(coherence)``. The w-statistic of an arc is
    the largest of its normalised misclosures in velocity, height error and each epoch's
    unwrapped phase, divided by ``sqrt`` of the arc's own redundancy number
    ``r_a = 1 - w_a a^T (A^T W A)^-1 a`` (exact up to :data:`EXACT_REDUNDANCY_POINTS`
    unknowns, estimated by random probes above); arcs with ``r_a`` below
    :data:`MIN_REDUNDANCY` are bridges no loop checks and are not tested. The critical value
    is Bonferroni-corrected over the ``T + 2`` misclosures (attrs ``w_critical``).

    Examples
    --------
    >>> from depsi.processing import (estimate_arcs, form_network, ps_selection,
    ...                               single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> result = integrate_network(points, estimate_arcs(form_network(points)))
    >>> result.velocity.dims, result.unwrapped_phase.dims
    (('space',), ('space', 'time'))
    >>> int(result.in_network.sum()) > 0.9 * points.sizes["space"]
    True
    >>> float(result.velocity[result.attrs["reference"]])  # results are relative to it
    0.0
    """
    validate(points, "points", require=("phase", "h2ph"), require_wavelength=True)
    n = points.sizes["space"]
    if reference is not None and not 0 <= int(reference) < n:
        raise ValueError(f"reference: expected an index into space in [0, {n}), "
                         f"found {reference}")
    if isinstance(arcs, ArcObservations):
        if return_arcs:
            raise ValueError("return_arcs: expected the arcs Dataset, found ArcObservations "
                             "(they keep no arc variables to return)")
        observations = arcs
        if observations.rhs.shape[1] != 2 + points.sizes["time"]:
            raise ValueError(f"arcs: ArcObservations of {observations.rhs.shape[1] - 2} epochs, "
                             f"expected the points' {points.sizes['time']}")
        _check_arc_ends(observations.source, observations.target, n)
    else:
        observations = arc_observations(points, arcs)
    source, target, coherence, rhs, h2ph_spread = observations
    velocity, height = rhs[:, 0], rhs[:, 1]

    finite = (np.isfinite(coherence) & np.isfinite(velocity) & np.isfinite(height)
              & np.isfinite(rhs[:, 2:]).all(axis=1))
    arc_reason = np.where(finite & (coherence >= min_coherence), 0, 1).astype(np.int8)
    arc_ok = arc_reason == 0
    if not arc_ok.any():
        raise ValueError(f"arcs: all {len(source)} arcs are below min_coherence={min_coherence} "
                         f"(or NaN); no network to integrate")

    years = years_since_mother(points)
    m2ph = abs(phase_per_metre(points.attrs["wavelength"]))
    var_phase = phase_variance_from_coherence(np.where(finite, coherence, 0.05))
    weights = 1.0 / var_phase
    sd_phase = np.sqrt(var_phase)
    sd_velocity = sd_phase / (m2ph * np.sqrt(np.sum((years - years.mean()) ** 2)))
    sd_height = sd_phase / (m2ph * np.maximum(h2ph_spread, 1e-12))
    # each arc is tested on its T + 2 normalised misclosures at once: alpha is the arc's
    # family-wise level (Bonferroni), so a clean arc fails with probability alpha, not T alpha
    critical = float(norm.ppf(1.0 - alpha / (2.0 * (points.sizes["time"] + 2))))
    positions = point_positions(points)

    sd = (sd_velocity, sd_height, sd_phase)
    tiled = n > TILE_POINTS
    if tiled:
        # the tiles decide on every arc; the whole network is solved once, and its
        # w-statistics (with the tiles' redundancy numbers) reported
        arc_ok, n_tested_out, redundancy = _test_by_tiles(
            source, target, arc_ok, arc_reason, weights, rhs, n, positions, coherence, sd,
            critical, max_iterations)
        arc_ok, point_reason, values, ref, w_stat, _, iterations, _ = _test_arcs(
            source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions,
            coherence, sd, critical, 0, redundancy=redundancy)
        logger.info("integration: the whole network solved once after the tiles; %d of its "
                    "%d arcs exceed the critical value there (%.2f) and are kept",
                    int((w_stat > critical).sum()), int(arc_ok.sum()), critical)
    else:
        arc_ok, point_reason, values, ref, w_stat, _, iterations, n_tested_out = _test_arcs(
            source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions,
            coherence, sd, critical, max_iterations)
    point_ok = point_reason == 0
    arc_reason[(arc_reason == 0) & ~arc_ok] = 3
    result = _point_results(points, values, point_ok, point_reason, ref, years)
    result.attrs.update({
        "reference": ref,
        "min_coherence": min_coherence,
        "alpha": alpha,
        "w_critical": critical,
        "n_points_kept": int(point_ok.sum()),
        "n_points_removed_weak": int((point_reason == 1).sum()),
        "n_points_removed_component": int((point_reason == 2).sum()),
        "n_arcs_kept": int(arc_ok.sum()),
        "n_arcs_removed_coherence": int((arc_reason == 1).sum()),
        "n_arcs_removed_wtest": int((arc_reason == 2).sum()),
        "n_test_iterations": int(iterations),
        "n_arcs_removed_with_point": int((arc_reason == 3).sum()),
        "removal_reason_legend": str(POINT_REASONS),
    })
    # name the reference as the input names it: point_index (the chain's index into its
    # input) when the points carry one, else the index into these points
    named = (f"point_index {int(points['point_index'].values[ref])}"
             if "point_index" in points.coords else f"{ref}")
    logger.info("integration: %d/%d points, %d/%d arcs kept (%d rejected by w-test in %d "
                "iterations), reference %s", point_ok.sum(), n, arc_ok.sum(), len(source),
                n_tested_out, iterations, named)
    outside = int((point_reason == 2).sum())
    if outside:
        logger.warning("integration: the network broke into pieces; %d of %d points (%.1f %%) "
                       "are not connected to the piece holding the reference (%d points) and "
                       "leave the network; the chain densifies them against it", outside, n,
                       100.0 * outside / n, int(point_ok.sum()))
    if reference_radius is not None:
        result = apply_reference_area(result, reference_radius)
    if not return_arcs:
        return result
    arcs_out = arcs.assign(
        arc_kept=("arc", arc_ok),
        arc_removal_reason=("arc", arc_reason),
        w_statistic=("arc", w_stat.astype(np.float32)),
    )
    arcs_out.attrs["arc_removal_reason_legend"] = str(ARC_REASONS)
    return result, arcs_out


def _point_results(points, values, point_ok, point_reason, ref, years,
                   reference_phase=None) -> xr.Dataset:
    """Point Dataset of the integrated values, with ambiguities, displacement, coherence.

    ``reference_phase`` (time,) is the datum the wrapped phases are taken relative to; by
    default the reference point's own phase. Computed over blocks of :data:`POINT_BLOCK`
    points into the result's float32/int32 arrays: the float64 temporaries (ten of the size of
    the series, 7 GB at 1.5 M points and 60 epochs) follow the block, not the points.
    """
    wavelength = float(points.attrs["wavelength"])
    m2ph = phase_per_metre(wavelength)
    n, n_epochs = points.sizes["space"], points.sizes["time"]
    velocity = values[:, 0]
    height = values[:, 1]
    phase_all = points["phase"].transpose("space", "time").values
    h2ph_all = points["h2ph"].transpose("space", ...)
    if reference_phase is None:
        reference_phase = np.asarray(phase_all[ref], dtype=np.float64)
    unwrapped_out = np.empty((n, n_epochs), np.float32)
    displacement_out = np.empty((n, n_epochs), np.float32)
    ambiguity_out = np.empty((n, n_epochs), np.int32)
    coherence_out = np.empty(n, np.float32)
    for start in range(0, n, POINT_BLOCK):
        rows = slice(start, min(start + POINT_BLOCK, n))
        unwrapped = values[rows, 2:]
        phase = np.asarray(phase_all[rows], dtype=np.float64)
        h2ph = h2ph_rows(h2ph_all, rows, n_epochs)
        relative = wrap_phase(phase - reference_phase)
        # off the network: ambiguity 0, masked by in_network (depsi.conventions.MISSING_AMBIGUITY
        # marks a missing epoch of an arc; a network point has a phase at every epoch)
        ambiguity_out[rows] = np.where(point_ok[rows, None],
                                       np.rint((np.nan_to_num(unwrapped) - relative) / _TWO_PI),
                                       0)
        # H_rel = H - H_ref; the unknown (h2ph - h2ph_ref) * H_ref term is second order
        model = m2ph * (velocity[rows, None] * years[None, :] + h2ph * height[rows, None])
        residual = unwrapped - model
        coherence_out[rows] = result_coherence(residual)
        displacement = unwrapped / m2ph - h2ph * height[rows, None]
        displacement_out[rows] = displacement - displacement[:, :1]
        unwrapped_out[rows] = unwrapped
    out = points.copy()
    out = out.assign(
        velocity=("space", velocity.astype(np.float32)),
        height_error=("space", height.astype(np.float32)),
        unwrapped_phase=(("space", "time"), unwrapped_out),
        displacement=(("space", "time"), displacement_out),
        ambiguity=(("space", "time"), ambiguity_out),
        temporal_coherence=("space", coherence_out),
        in_network=("space", point_ok),
        removal_reason=("space", point_reason),
        reference_phase=("time", np.asarray(reference_phase).astype(np.float32)),
    )
    return out


def refit_points(points: xr.Dataset, unwrapped: np.ndarray, reference: int) -> xr.Dataset:
    """Network points' results from their unwrapped phases: velocity and height error by
    least squares per point (with a constant phase), every point kept.

    The second pass of :func:`depsi.processing.chain.atmosphere_step` with
    ``atmosphere.second_pass: refit``: ``points`` hold the phases corrected for the screen and
    ``unwrapped`` the first pass's unwrapped phases less the same screen, so the ambiguities
    the network found are kept and only the estimates are freed of the atmosphere (no second
    periodogram or network solution).

    Parameters
    ----------
    points
        Point STM (``phase``, ``h2ph``, ``wavelength``) of the network's points.
    unwrapped : (space, time)
        Their unwrapped phases (rad); taken relative to point ``reference`` (its row is
        subtracted), as :func:`integrate_network` gives them.
    reference
        Index into ``points.space`` of the reference point.

    Returns
    -------
    xarray.Dataset
        As :func:`integrate_network`: ``velocity``, ``height_error``, ``unwrapped_phase``,
        ``displacement``, ``ambiguity``, ``temporal_coherence``, ``in_network`` (all true),
        ``removal_reason``, ``reference_phase``; attrs ``reference``.

    Examples
    --------
    >>> t = np.arange(30) * 24 / 365.25  # years, 24-day revisit
    >>> h2ph = (3e-4 * np.sin(7.0 * np.arange(30)))[None].repeat(3, axis=0)  # not collinear with t
    >>> m2ph = phase_per_metre(0.0555)
    >>> truth = m2ph * (np.array([[0.0], [0.004], [-0.002]]) * t
    ...                 + h2ph * np.array([[0.0], [5.0], [-3.0]]))
    >>> points = xr.Dataset(
    ...     {"phase": (("space", "time"), np.angle(np.exp(1j * truth))),
    ...      "h2ph": (("space", "time"), h2ph)},
    ...     coords={"time": np.datetime64("2020-01-01") + np.arange(30) * np.timedelta64(24, "D"),
    ...             "azimuth": ("space", [0, 1, 2]), "range": ("space", [0, 0, 0])},
    ...     attrs={"wavelength": 0.0555})
    >>> out = refit_points(points, truth, 0)
    >>> [round(float(v), 4) for v in out.velocity], [round(float(h), 2) for h in out.height_error]
    ([0.0, 0.004, -0.002], [0.0, 5.0, -3.0])
    """
    validate(points, "points", require=("phase", "h2ph"), require_wavelength=True)
    n, n_epochs = points.sizes["space"], points.sizes["time"]
    if unwrapped.shape != (n, n_epochs):
        raise ValueError(f"unwrapped: expected shape ({n}, {n_epochs}), found {unwrapped.shape}")
    if not 0 <= int(reference) < n:
        raise ValueError(f"reference: expected an index into space in [0, {n}), "
                         f"found {reference}")
    wavelength = float(points.attrs["wavelength"])
    years = years_since_mother(points)
    h2ph_all = points["h2ph"].transpose("space", ...)
    base = np.asarray(unwrapped[reference], dtype=np.float64)
    values = np.empty((n, 2 + n_epochs))
    for start in range(0, n, POINT_BLOCK):
        rows = slice(start, min(start + POINT_BLOCK, n))
        y = np.asarray(unwrapped[rows], dtype=np.float64) - base
        design, _ = design_matrix(years, terms=("offset", "velocity", "height_error"),
                                  h2ph=h2ph_rows(h2ph_all, rows, n_epochs),
                                  wavelength=wavelength)
        fit = lstsq_batched(design, y)
        values[rows, 0], values[rows, 1] = fit.x[:, 1], fit.x[:, 2]
        values[rows, 2:] = y
    values[reference, :2] = 0.0  # its own phases are zero: no round-off left
    out = _point_results(points, values, np.ones(n, bool), np.zeros(n, np.int8), int(reference),
                         years)
    out.attrs["reference"] = int(reference)
    return out


def remove_reference_noise(result: xr.Dataset, *, k: int = REFERENCE_NEIGHBOURS) -> xr.Dataset:
    """Take the results relative to the reference point's signal rather than its noisy phase.

    Every integrated value is relative to the reference point, so the reference's own phase
    noise (and its small-scale atmosphere) is a per-epoch term common to all points: it leaks
    into every velocity and height error as one offset (about 1.2 m of height and 0.4 mm/yr for
    0.4 rad of noise and 60 epochs). The reference's ``k`` nearest network neighbours see that
    term, with opposite sign, in their residual phases; their circular mean per epoch estimates
    it, and it is removed from every point: ``unwrapped_phase`` and ``reference_phase`` shift by
    it, velocity and height error by its least-squares velocity and height, and ambiguities,
    displacement and temporal coherence are recomputed.

    Parameters
    ----------
    result
        Output of :func:`integrate_network` (its ``attrs['reference']`` must index ``space``).
    k
        Neighbours averaged (default :data:`REFERENCE_NEIGHBOURS`); fewer when the network is
        smaller.

    Returns
    -------
    xarray.Dataset
        ``result`` with the updated values and ``reference_noise`` (rad, per epoch, the term
        removed); ``attrs['reference_noise_neighbours']`` says how many points estimated it.

    Examples
    --------
    >>> from depsi.processing import (estimate_arcs, form_network, ps_selection,
    ...                               single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> arcs = estimate_arcs(form_network(points))
    >>> result = remove_reference_noise(integrate_network(points, arcs))
    >>> result.reference_noise.dims, result.attrs["reference_noise_neighbours"] > 0
    (('time',), True)
    """
    ref = int(result.attrs["reference"])
    keep = np.asarray(result["in_network"].values, dtype=bool)
    n = result.sizes["space"]
    if not 0 <= ref < n or not keep[ref]:
        raise ValueError(f"result: attrs['reference']={ref} is not a network point of the "
                         f"{n} points")
    positions = point_positions(result)
    candidates = np.flatnonzero(keep & (np.arange(n) != ref))
    k = min(int(k), candidates.size)
    if k < 3:
        logger.warning("reference noise: only %d network neighbours, left in place", k)
        return result
    years = years_since_mother(result)
    wavelength = float(result.attrs["wavelength"])
    m2ph = phase_per_metre(wavelength)
    dist = np.hypot(*(positions[candidates] - positions[ref]).T)
    nbrs = candidates[np.argsort(dist, kind="stable")[:k]]
    unwrapped = result["unwrapped_phase"].transpose("space", "time").values.astype(np.float64)
    h2ph = np.broadcast_to(result["h2ph"].transpose("space", ...).values.astype(np.float64)
                           .reshape(n, -1), unwrapped.shape)
    velocity = result["velocity"].values.astype(np.float64)
    height = result["height_error"].values.astype(np.float64)
    residual = unwrapped[nbrs] - m2ph * (velocity[nbrs, None] * years
                                         + h2ph[nbrs] * height[nbrs, None])
    phasor = np.exp(1j * residual)
    phasor *= np.exp(-1j * np.angle(phasor.mean(axis=1, keepdims=True)))  # own constant out
    noise = -np.angle(phasor.mean(axis=0))  # the reference's term, sign of its own noise
    mother = int(np.argmin(np.abs(years)))
    noise -= noise[mother]
    design = np.column_stack([m2ph * years, m2ph * h2ph[ref], np.ones_like(years)])
    d_velocity, d_height, _ = np.linalg.lstsq(design, noise, rcond=None)[0]
    values = np.column_stack([velocity + d_velocity, height + d_height, unwrapped + noise])
    values[~keep] = np.nan
    phase = result["phase"].transpose("space", "time").values.astype(np.float64)
    reference_phase = phase[ref] - noise
    updated = _point_results(result, values, keep, result["removal_reason"].values, ref, years,
                             reference_phase=reference_phase)
    updated = updated.assign(reference_noise=("time", noise.astype(np.float32)))
    updated.attrs.update(result.attrs)
    updated.attrs["reference_noise_neighbours"] = int(k)
    logger.info("reference noise from %d neighbours: %.3f rad RMS, velocity %+.2e m/yr, height "
                "%+.2f m", k, np.sqrt(np.mean(noise**2)), d_velocity, d_height)
    return updated


def apply_reference_area(result: xr.Dataset, radius: float | None) -> xr.Dataset:
    """Re-reference every result to the mean over the network points near the reference.

    Relative to one point, that point's own noise (phase noise and atmosphere finer than the
    estimated screen) is an offset common to every point: about 2 m of height error on a
    scene of 0.4 rad noise and 120 epochs. Taking the datum as the plain mean over the
    *reference area*, the network points within ``radius`` of the reference point (StaMPS'
    ``ref_radius``), shrinks that offset by about the square root of their number. The mean
    velocity, height error and unwrapped phase (per epoch) of the area are subtracted from
    every network point; ``reference_phase`` moves by the same phase, so wrapped phases,
    ambiguities and densification against these points stay consistent; displacement and
    temporal coherence are recomputed.

    Parameters
    ----------
    result
        Output of :func:`integrate_network` (its ``attrs['reference']`` must index ``space``).
    radius
        Radius in metres (positions as :func:`~depsi.processing.network.point_positions`).
        ``None`` or 0: the area is the reference point alone (values unchanged).

    Returns
    -------
    xarray.Dataset
        ``result`` re-referenced, with ``in_reference_area`` (bool per point) and attrs
        ``reference_radius`` (m; 0.0 for the point alone) and ``n_reference_area``.
        ``attrs['reference']`` stays the central point.

    Examples
    --------
    >>> from depsi.processing import (estimate_arcs, form_network, ps_selection,
    ...                               single_mother_interferograms)
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> arcs = estimate_arcs(form_network(points))
    >>> result = apply_reference_area(integrate_network(points, arcs), 100.0)
    >>> int(result.in_reference_area.sum()) == result.attrs["n_reference_area"] > 1
    True
    >>> area = result.velocity.where(result.in_reference_area)
    >>> abs(float(area.mean())) < 1e-6  # the mean over the area is the datum
    True
    """
    ref = int(result.attrs["reference"])
    keep = np.asarray(result["in_network"].values, dtype=bool)
    n = result.sizes["space"]
    if not 0 <= ref < n or not keep[ref]:
        raise ValueError(f"result: attrs['reference']={ref} is not a network point of the "
                         f"{n} points")
    if radius is not None and not (np.isfinite(radius) and radius >= 0):
        raise ValueError(f"reference_radius: expected None or a distance >= 0 in metres, "
                         f"found {radius}")
    radius = 0.0 if radius is None else float(radius)
    positions = point_positions(result)
    dist = np.hypot(*(positions - positions[ref]).T)
    area = keep & (dist <= radius)
    area[ref] = True
    unwrapped = result["unwrapped_phase"].transpose("space", "time").values.astype(np.float64)
    velocity = result["velocity"].values.astype(np.float64)
    height = result["height_error"].values.astype(np.float64)
    d_velocity = velocity[area].mean()
    d_height = height[area].mean()
    d_phase = unwrapped[area].mean(axis=0)
    out = result
    if area.sum() > 1:
        values = np.column_stack([velocity - d_velocity, height - d_height,
                                  unwrapped - d_phase[None, :]])
        values[~keep] = np.nan
        reference_phase = result["reference_phase"].values.astype(np.float64) + d_phase
        out = _point_results(result, values, keep, result["removal_reason"].values, ref,
                             years_since_mother(result), reference_phase=reference_phase)
        out.attrs.update(result.attrs)
    out = out.assign(in_reference_area=("space", area))
    out.attrs.update({"reference_radius": radius, "n_reference_area": int(area.sum())})
    logger.info("reference area: %d network points within %.0f m of point %d; datum moved by "
                "%+.2e m/yr, %+.2f m", area.sum(), radius, ref, d_velocity, d_height)
    return out
