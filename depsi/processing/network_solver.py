"""The sparse weighted least-squares solver of the point network: the arcs' incidence matrix,
one factorisation of the normal matrix ``A^T W A`` for every right-hand side (QDLDL, CHOLMOD or
SuperLU), that solution with arcs removed by Woodbury updates, and the arcs' leverage (one
minus their redundancy numbers).

NumPy and SciPy on host arrays (and, outside small Dask workers,
:mod:`depsi.kernels.ldl_numba` for QDLDL's many right-hand sides and
:mod:`depsi.kernels.normal_rhs_numba` for ``A^T W y``); :mod:`depsi.processing.arc_testing`
tests the arcs with it. That host path is the reference, and the one taken whenever no device
is given.

Given a device (``device``, a CUDA one from the steps' ``devices``), the factorisation's
solves run on it, written once over the array namespace: :class:`_DeviceDense` for a tile's
normal matrix (up to :data:`DEVICE_DENSE_MAX_UNKNOWNS` unknowns: the sparse matrix scattered
into a dense one on the device, its Cholesky factor there, every right-hand side, probe and
Woodbury column through two triangular solves at once), :class:`_DeviceLDL` for the whole
network (QDLDL's ``L D L^T`` factorised on the host, as CuPy has no sparse Cholesky, and its
triangular factors moved once to the device, where all right-hand sides are solved together
by sparse triangular solves, cuSPARSE's SpSM through ``cupyx``). Both are exact
factorisations, not an iterative solver: the values and the arcs' leverage agree with the host
path to floating-point precision (the tests hold them to 1e-9), so the w-test decides the
same. A preconditioned conjugate gradient would need a tolerance per right-hand side, and a
graph Laplacian's condition number grows with the network; CHOLMOD's factor (the host's
choice for the whole network) cannot be read out of cholespy, QDLDL's can. Run with
``device=Device("cpu")`` this formulation runs on NumPy and SciPy (the tests' proof that it is
right); CuPy's own calls are the few small functions :func:`_sparse_on`,
:func:`_sparse_triangular_solve` and :func:`_dense_triangular_solve`. Not timed on a GPU (none
was at hand when it was written).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve, lapack
from scipy.sparse.linalg import splu

from depsi.kernels.backend import (
    DEFAULT_SAFETY,
    Device,
    available_host_memory,
    free_memory,
    to_host,
    use_device,
)
from depsi.stm.runtime import page_out, pageable, roomy_process

if TYPE_CHECKING:
    from depsi.kernels.ldl_numba import LDLFactors

#: Arcs per block of the redundancy probes, the misclosure statistics and the observations:
#: bounds the temporaries of a network of millions of arcs.
ARC_BLOCK = 65536
#: Probes per block of the redundancy estimate (temporaries of ``(ARC_BLOCK, PROBE_BLOCK)``).
PROBE_BLOCK = 16
#: Probe columns solved together through the factorisation (:func:`_leverage`): one pass over
#: the factor's entries for all of them, not one a :data:`PROBE_BLOCK` (an ``(unknowns, 64)``
#: float64 array, 5 MB at a tile's 10^4 unknowns; docs/benchmarks.md, "The integration
#: tiles' solves").
PROBE_SOLVE_COLUMNS = 64
#: Up to this many unknowns the arcs' redundancy numbers come from the exact inverse of the
#: normal matrix (``n^2`` floats); above, from random probes.
EXACT_REDUNDANCY_POINTS = 1000
#: Random sign probes of the redundancy estimate for larger networks (relative error about
#: ``1 / sqrt(probes)`` of the leverage).
REDUNDANCY_PROBES = 64

#: Right-hand-side columns cast to float64 together in :func:`_solve` (bounds that copy to
#: 64 bytes an arc).
RHS_COLUMNS = 8
#: Right-hand sides solved together through the whole network's CHOLMOD factor
#: (:meth:`_Cholesky.solve`): the same numbers to the bit as all at once, with a 16-column
#: workspace (docs/benchmarks.md, "The network solver's choices"). A multiple of four
#: (CHOLMOD's own block of columns).
SOLVE_COLUMNS = 16
#: Rows of the whole network's solution copied to and from a group's right-hand sides at a
#: time (:func:`_solved_in_place`; 31 MB at 62 columns): where the solution is
#: :func:`~depsi.stm.runtime.pageable`, only these rows of it are resident beside the factor.
SOLVE_ROWS = 65536

#: Normal matrices up to this many unknowns go to QDLDL (:class:`_LDL`), larger ones to CHOLMOD
#: (:class:`_Cholesky`): at a w-test tile's size QDLDL factorises faster and releases the GIL, so
#: the tiles factorise on every core; CHOLMOD (simplicial, as cholespy sets it, NESDIS ordering) is
#: the faster for the whole network (docs/benchmarks.md, "The network solver's choices").
LDL_MAX_UNKNOWNS = 50_000

#: Entries of a network's Cholesky factor per ``n log2(n)`` unknowns assumed when
#: :func:`_supernodal_fits` judges the supernodal factorisation's memory (2.8 measured at 10^6
#: points, with margin).
SUPERNODAL_FILL = 4.0

#: On a device, normal matrices up to this many unknowns (a w-test tile's: about
#: :data:`~depsi.processing.arc_testing.TILE_POINTS` and its margin) are factorised dense
#: (:class:`_DeviceDense`; 2 GiB a matrix at this size, and its factor beside it while it
#: factorises), larger ones (the whole network) sparse (:class:`_DeviceLDL`).
DEVICE_DENSE_MAX_UNKNOWNS = 16384
#: Right-hand sides solved together on a device in the whole network's solve
#: (:func:`_solved_in_place`): each group one pair of sparse triangular solves; 0.5 GB of
#: float64 on the device at 10^6 points.
DEVICE_SOLVE_COLUMNS = 64


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

def _solve(source, target, weights, rhs, kept, n, point_ok, reference, *, leverage=False,
           device=None):
    """Weighted LSQ over the arcs ``kept`` (indices into the arrays); returns ``(n, nrhs)``
    values (NaN off-network) and, with ``leverage``, each kept arc's ``w_a a^T N^-1 a`` (one
    minus its redundancy number). See :class:`_NetworkSolve`."""
    solved = _NetworkSolve(source, target, weights, rhs, kept, n, point_ok, reference,
                           device=device)
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

    ``device``: None (the host reference), or the device whose factorisation solves
    (:func:`_factorise`); the right-hand sides, the update and the leverage's probes are formed
    on the host either way.
    """

    def __init__(self, source, target, weights, rhs, kept, n, point_ok, reference, *,
                 solution_only=False, device=None):
        # solution_only: the solution alone is wanted (the whole network's one solve after
        # its tiles): the sparse matrices go before the factorisation and the factor after
        # the solve, so neither is held beside the other's peak (1.6 GB of factor at 10^7
        # points); then without() and leverage() cannot be asked
        unknown = point_ok.copy()
        unknown[reference] = False
        n_unknown = int(unknown.sum())
        # the reference maps to an extra last column, dropped below
        col = np.full(n, n_unknown, dtype=np.int64)
        col[unknown] = np.arange(n_unknown)
        w = weights[kept]
        compiled = rhs.ndim == 2 and _compiled_kernels("normal_rhs_numba")
        if compiled:
            # A^T W A from the arcs' ends, SciPy's product to the bit; the incidence matrix
            # only if the leverage asks for it (docs/benchmarks.md, "The integration tiles'
            # solves")
            from depsi.kernels import normal_rhs_numba

            A = AtW = None
            normal = normal_rhs_numba.normal_matrix(col[source[kept]], col[target[kept]], w,
                                                    n_unknown)
        else:
            A = _incidence(col, source, target, kept, n_unknown)
            AtW = A.T.multiply(w[None, :]).tocsr()
            normal = (AtW @ A).tocsc()
        self._values = None
        if solution_only:  # the sparse matrices go before the factorisation's own peak
            A = None
            if rhs.ndim == 2:
                # A^T W y before the factorisation, not beside the factor (the arcs' arrays
                # it reads and its (points, nrhs) sums: 1.1 GB at 10^7 points)
                self._values = _normal_rhs_in_place(unknown, source, target, weights, kept,
                                                    rhs, AtW, compiled)
                AtW = None
            # and every pageable array (the arcs' ends, weights and coherence, the points'
            # phases, the sums: 2 GB at 10^7 points) leaves the driver's resident memory
            page_out()
        self.lu = _factorise(normal, device=device)
        if solution_only:
            normal = None
        if self._values is not None:
            _solved_in_place(self.lu, self._values, unknown, point_ok, reference)
            self.lu = None
            self._x0 = self.x = None
        elif compiled:
            # each arc's float32 row read once, in the sparse product's order: its result to the
            # bit, without the float64 copies (docs/benchmarks.md, "The network solver's choices")
            from depsi.kernels import normal_rhs_numba

            normal_rhs = normal_rhs_numba.normal_rhs(col[source], col[target], weights,
                                                     kept, rhs, n_unknown)
        else:
            normal_rhs = np.empty((n_unknown, rhs.shape[1]))
            _sparse_normal_rhs(AtW, kept, rhs, len(source), normal_rhs, slice(None))
        if self._values is None:
            del AtW
            # the solution takes the right-hand sides' place (no second (unknowns, nrhs)
            # array)
            self._x0 = self.x = (self.lu.solve(normal_rhs, overwrite_b=True)
                                 if isinstance(self.lu, (_Supernodal, _Cholesky))
                                 else self.lu.solve(normal_rhs))
            if solution_only:
                self.lu = None
        self.source, self.target, self.weights, self.rhs = source, target, weights, rhs
        self.kept, self.point_ok, self.reference = kept, point_ok.copy(), reference
        self.unknown, self.col, self._A, self.w, self.normal = unknown, col, A, w, normal
        self._incidence_wanted = not solution_only
        self.removed = np.zeros(0, dtype=np.int64)  # arcs of kept removed by without()
        self._G = np.zeros((n_unknown, 0))
        self._S = None  # the Cholesky factor of S, once arcs are removed

    @property
    def A(self) -> sp.csc_matrix:
        """The kept arcs' incidence matrix, the reference's column dropped (made when first
        asked for)."""
        if self._A is None:
            if not self._incidence_wanted:
                raise ValueError("_NetworkSolve: the incidence matrix of a solution_only "
                                 "solve is not kept")
            self._A = _incidence(self.col, self.source, self.target, self.kept,
                                 self.x.shape[0])
        return self._A

    def values(self) -> np.ndarray:
        """``(n, nrhs)``: NaN off the network, 0 at the reference (with ``solution_only``,
        the one array the solve wrote into, not a copy)."""
        if self._values is not None:
            return self._values
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
        if self.lu is None or not 0 < new.size <= WOODBURY_MAX_NEW or (
                self.removed.size + new.size > WOODBURY_MAX_TOTAL):
            return False  # (no factor kept: solution_only)
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


def _incidence(col, source, target, kept, n_unknown) -> sp.csc_matrix:
    """The incidence matrix of the arcs ``kept`` over the unknowns ``col`` (the reference's
    column, ``n_unknown``, dropped)."""
    A = incidence_matrix(col[source[kept]], col[target[kept]], n_points=n_unknown + 1)
    return A[:, :-1].tocsc()


def _sparse_normal_rhs(AtW, kept, rhs, n_arcs, out, rows) -> None:
    """``out[rows] = A^T W y`` by SciPy's sparse product (where the compiled kernel is not):
    ``A^T W`` over every arc, zero columns for the others, so the product reads only kept
    rows; a few columns at a time, as the product would otherwise first copy the whole float32
    ``(arcs, nrhs)`` right-hand sides to float64."""
    AtW_all = sp.csr_matrix((AtW.data, kept[AtW.indices], AtW.indptr),
                            shape=(AtW.shape[0], n_arcs))
    for first in range(0, rhs.shape[1], RHS_COLUMNS):
        columns = slice(first, first + RHS_COLUMNS)
        out[rows, columns] = AtW_all @ rhs[:, columns].astype(np.float64)


def _normal_rhs_in_place(unknown, source, target, weights, kept, rhs, AtW, compiled):
    """``A^T W y`` ``(n, nrhs)`` in the points' rows (each unknown at its point's row, the
    reference's and the off-network points' sums dropped): the array
    :func:`_solved_in_place` solves in place, :func:`~depsi.stm.runtime.pageable` (0.74 GB
    at 10^7 points)."""
    n, n_rhs = len(unknown), rhs.shape[1]
    if compiled:
        from depsi.kernels import normal_rhs_numba

        # the kernel's columns are the points' rows (the dropped ones its extra row): each
        # row's sum is the unknowns' layout's, added in the same order
        ends = np.where(unknown, np.arange(n), n)
        return normal_rhs_numba.normal_rhs(source, target, weights, kept, rhs, n, column=ends,
                                           out=pageable((n + 1, n_rhs), np.float64, zeros=True))
    values = pageable((n, n_rhs), np.float64, zeros=True)
    _sparse_normal_rhs(AtW, kept, rhs, len(source), values, np.flatnonzero(unknown))
    return values


def _solved_in_place(lu, values, unknown, point_ok, reference) -> np.ndarray:
    """The whole network's solution as :meth:`_NetworkSolve.values` gives it, ``(n, nrhs)``, made in
    ``values`` (:func:`_normal_rhs_in_place`'s ``A^T W y``): solved through ``lu``
    :data:`SOLVE_COLUMNS` columns at a time, each group's solution written back over its right-hand
    sides. The same numbers to the bit as the unknowns' array and its copy, without the second
    ``(points, nrhs)`` float64 array beside the first. The values are copied to and from each
    group's right-hand sides :data:`SOLVE_ROWS` rows at a time, their pages let go after each (where
    ``values`` is pageable): beside the factor only those rows are resident (docs/benchmarks.md,
    "The network solver's choices" and "The driver's allocator, pages and temporary files")."""
    n_rhs = values.shape[1]
    rows = np.flatnonzero(unknown)
    width = DEVICE_SOLVE_COLUMNS if isinstance(lu, _DeviceLDL) else SOLVE_COLUMNS
    for first in range(0, n_rhs, width):
        group = slice(first, first + width)
        b = np.empty((rows.size, len(range(n_rhs)[group])))
        for block in range(0, rows.size, SOLVE_ROWS):
            b[block:block + SOLVE_ROWS] = values[rows[block:block + SOLVE_ROWS], group]
            page_out(values)
        if isinstance(lu, (_Supernodal, _Cholesky)):  # cholespy's workspace goes after the last
            b = lu.solve(b, overwrite_b=True, release=first + width >= n_rhs)
        else:
            b = lu.solve(b)
        for block in range(0, rows.size, SOLVE_ROWS):
            values[rows[block:block + SOLVE_ROWS], group] = b[block:block + SOLVE_ROWS]
            page_out(values)
        del b
    values[~point_ok] = np.nan
    values[reference] = 0.0
    return values


class _Updated:
    """``N^-1`` after a Woodbury update: ``N0^-1 b + G S^-1 G^T b``."""

    def __init__(self, lu, G, factor):
        self.lu, self.G, self.factor = lu, G, factor

    def solve(self, b: np.ndarray, *, columns: int | None = None) -> np.ndarray:
        """``N^-1 b``; with ``columns``, the update's products a group of that many columns
        at a time (BLAS's blocking then the same as for a ``b`` of that width, and so the
        numbers), the factorisation's solve of them all at once."""
        x = self.lu.solve(b)
        width = columns or max(1, b.shape[1] if b.ndim == 2 else 1)
        if b.ndim == 1 or width >= b.shape[1]:
            return x + self.G @ cho_solve(self.factor, self.G.T @ b, check_finite=False)
        for first in range(0, b.shape[1], width):
            group = slice(first, first + width)
            x[:, group] = x[:, group] + self.G @ cho_solve(
                self.factor, self.G.T @ np.ascontiguousarray(b[:, group]), check_finite=False)
        return x


class _Cholesky:
    """A sparse symmetric positive definite matrix factorised once (CHOLMOD's Cholesky through
    cholespy, which asks for the simplicial one: its multi-right-hand-side solves are much faster
    than SuperLU's on the whole network: docs/benchmarks.md, "The network solver's choices");
    ``solve(b)`` for ``b`` of shape ``(n,)`` or ``(n, k)``."""

    def __init__(self, matrix: sp.spmatrix):
        import cholespy

        csr = sp.csr_matrix(matrix)
        csr.sort_indices()
        self.n = csr.shape[0]
        self._solver = cholespy.CholeskySolverD(
            self.n, csr.indptr.astype(np.int32), csr.indices.astype(np.int32),
            csr.data.astype(np.float64), cholespy.MatrixType.CSR)

    def solve(self, b: np.ndarray, *, overwrite_b: bool = False,
              release: bool = True) -> np.ndarray:
        """``x`` with ``N x = b``; with ``overwrite_b`` (``b`` float64 ``(n, k)``) written into
        ``b`` itself, which is returned; ``release=False`` keeps the solver's workspace for a
        next call of the same width. Many columns go through the factor
        :data:`SOLVE_COLUMNS` at a time: CHOLMOD solves four columns at a time, each count
        (one to four) by its own loop and rounding, and a group of a multiple of four
        columns keeps every column in the block of four it had in one solve of them all, so
        the result is that solve's to the bit. The solver's workspace and the copies follow
        the group, not ``k`` (docs/benchmarks.md, "The network solver's choices")."""
        if b.ndim == 1:
            b_in = np.ascontiguousarray(b, dtype=np.float64)
            x = np.zeros_like(b_in)
            self._solver.solve(b_in, x)
        else:
            x = b if overwrite_b else np.empty(b.shape)
            for first in range(0, b.shape[1], SOLVE_COLUMNS):
                group = slice(first, first + SOLVE_COLUMNS)
                b_in = np.ascontiguousarray(b[:, group], dtype=np.float64)
                x_group = np.zeros_like(b_in)
                self._solver.solve(b_in, x_group)
                x[:, group] = x_group
        if release and b.ndim == 2 and b.shape[1] > 1:
            # cholespy 2.2 never frees the last solve's (n, k) workspace (docs/benchmarks.md,
            # "The network solver's choices"): a one-column solve shrinks it to (n, 1)
            self._solver.solve(np.zeros(self.n), np.zeros(self.n))
        return x


class _Supernodal:
    """A sparse symmetric positive definite matrix factorised by CHOLMOD's supernodal Cholesky
    (CVXOPT's binding), its factor read out once as a sparse lower-triangular matrix and every
    solve made by :class:`depsi.kernels.ldl_numba.CholeskyFactors` (all right-hand sides in
    one compiled pass over the factor's entries). The whole network's factorisation: at 10^6
    points (148,000 unknowns) 0.5 s against cholespy's simplicial 2.4 s, and a solve of 48
    right-hand sides 0.2 s against 0.45 s (docs/benchmarks.md, "The network solver's
    choices"). Raises ImportError where CVXOPT is not installed or the compiled sweeps do not
    run in this process (:func:`_factorise` then takes :class:`_Cholesky`)."""

    def __init__(self, matrix: sp.spmatrix):
        if not _compiled_kernels("ldl_numba"):
            raise ImportError("the compiled sweeps of depsi.kernels.ldl_numba do not run here")
        from cvxopt import cholmod, spmatrix
        from cvxopt import matrix as dense

        from depsi.kernels.ldl_numba import CholeskyFactors

        self.n = matrix.shape[0]
        lower = sp.tril(matrix, format="coo")
        system = spmatrix(lower.data.astype(np.float64), lower.row.astype(np.int64),
                          lower.col.astype(np.int64), (self.n, self.n))
        del lower
        options = dict(cholmod.options)
        cholmod.options["supernodal"] = 2  # CHOLMOD_SUPERNODAL (its default chooses by flops)
        try:
            factor = cholmod.symbolic(system, uplo="L")
            cholmod.numeric(system, factor)
        except ArithmeticError as err:
            raise np.linalg.LinAlgError(f"normal matrix not positive definite ({err})") from err
        finally:
            cholmod.options.clear()
            cholmod.options.update(options)
        del system
        # P A P^T = L L^T: the permutation is P applied to 0..n-1 (CHOLMOD's system 7)
        permutation = dense(np.arange(self.n, dtype=np.float64))
        cholmod.solve(factor, permutation, sys=7)
        lower_factor = cholmod.getfactor(factor)  # simplicial, each column's diagonal first
        del factor
        Lp, Li, Lx = (np.asarray(memoryview(part)).ravel() for part in lower_factor.CCS)
        self._factors = CholeskyFactors(Lp, Li, Lx,
                                        np.asarray(memoryview(permutation)).ravel())

    def solve(self, b: np.ndarray, *, overwrite_b: bool = False,
              release: bool = True) -> np.ndarray:
        """``x`` with ``N x = b``; with ``overwrite_b`` (``b`` float64 C-ordered ``(n, k)``)
        written into ``b`` itself, which is returned (``release``: as :meth:`_Cholesky.solve`
        takes it; nothing is held between solves here)."""
        if b.ndim == 1:
            return self._factors.solve(b[:, None])[:, 0]
        in_place = overwrite_b and b.dtype == np.float64 and b.flags.c_contiguous
        return self._factors.solve(b, out=b if in_place else None)


class _LDL:
    """A sparse symmetric positive definite matrix factorised by QDLDL (OSQP's LDL^T, its own
    AMD ordering). It releases the GIL while it factorises and solves, so the w-test's tiles
    factorise on every core at once; ``solve(b)`` for ``b`` of shape ``(n,)`` or ``(n, k)``:
    QDLDL's binding takes one right-hand side a call, so ``k > 1`` columns go through its
    factors together in :mod:`depsi.kernels.ldl_numba` (the same result) where Numba is."""

    def __init__(self, matrix: sp.spmatrix):
        import qdldl

        self.n = matrix.shape[0]
        self._solver = qdldl.Solver(sp.triu(matrix, format="csc"))
        # QDLDL's factors, for many right-hand sides at once
        self._factors: LDLFactors | None = None

    def solve(self, b: np.ndarray) -> np.ndarray:
        if b.ndim == 1:
            return self._solver.solve(np.ascontiguousarray(b, dtype=np.float64))
        if b.shape[1] > 1 and _compiled_kernels("ldl_numba"):
            from depsi.kernels import ldl_numba

            # every column in one compiled pass over the factors, QDLDL's result to the bit
            # (docs/benchmarks.md, "The integration tiles' solves")
            if self._factors is None:
                self._factors = ldl_numba.LDLFactors(self._solver)
            return self._factors.solve(b)
        columns = np.asfortranarray(b, dtype=np.float64)
        x = np.empty(b.shape, order="F")
        for j in range(b.shape[1]):  # the right-hand sides (epochs, probes): a few dozen
            x[:, j] = self._solver.solve(columns[:, j])
        return x


def _device_factorise(normal: sp.spmatrix, device: Device):
    """The factorisation whose solves run on ``device``: :class:`_DeviceDense` up to
    :data:`DEVICE_DENSE_MAX_UNKNOWNS` unknowns where the device has room for the dense matrix
    now (tiles factorise on several threads at once), else :class:`_DeviceLDL`."""
    n = normal.shape[0]
    if n <= DEVICE_DENSE_MAX_UNKNOWNS and 2 * 8 * n * n <= DEFAULT_SAFETY * free_memory(device):
        return _DeviceDense(normal, device)
    return _DeviceLDL(normal, device)


class _DeviceDense:
    """A tile's normal matrix factorised dense on ``device`` (Cholesky, ``N = L L^T``):
    ``solve(b)`` takes and gives host arrays of shape ``(n,)`` or ``(n, k)``, its ``k``
    columns (epochs, probes, Woodbury columns) through two triangular solves at once. On a GPU
    the dense factorisation of a tile (about 10^4 unknowns, a few times 10^11 flops) is one
    large cuSOLVER call, where the sparse one is a long chain of small dependent steps."""

    def __init__(self, matrix: sp.spmatrix, device: Device):
        self.n, self.device = matrix.shape[0], device
        entries = sp.csr_matrix(matrix)
        entries.sum_duplicates()  # each entry once: the scatter below assigns, not adds
        entries = entries.tocoo()
        with use_device(device) as xp:
            dense = xp.zeros((self.n, self.n))
            dense[xp.asarray(entries.row), xp.asarray(entries.col)] = xp.asarray(
                entries.data, dtype=xp.float64)
            self.factor = xp.linalg.cholesky(dense)
            del dense
            # CuPy's Cholesky returns NaN where NumPy's raises
            if not bool(xp.all(xp.diagonal(self.factor) > 0)):
                raise np.linalg.LinAlgError("normal matrix not positive definite")

    def solve(self, b: np.ndarray) -> np.ndarray:
        with use_device(self.device) as xp:
            x = xp.asarray(b, dtype=xp.float64)
            x = _dense_triangular_solve(xp, self.factor, x)
            return to_host(_dense_triangular_solve(xp, self.factor, x, transpose=True))


class _DeviceLDL:
    """The whole network's normal matrix factorised by QDLDL on the host,
    ``N = P (I + L) D (I + L)^T P^T``, its factors moved once to ``device``: ``solve(b)``
    (host arrays in and out, ``(n,)`` or ``(n, k)``) solves every column of ``b`` together, by
    the permutation, a sparse lower triangular solve, the scaling by ``1 / D`` and a sparse
    upper triangular solve (the sweeps of :mod:`depsi.kernels.ldl_numba`, as matrix
    operations)."""

    def __init__(self, matrix: sp.spmatrix, device: Device):
        import qdldl

        self.n, self.device = matrix.shape[0], device
        strictly_lower, d, permutation = qdldl.Solver(sp.triu(matrix, format="csc")).factors()
        lower = sp.csr_matrix(sp.identity(self.n, format="csc") + strictly_lower)
        lower.sort_indices()
        upper = sp.csr_matrix(lower.T)
        upper.sort_indices()
        with use_device(device) as xp:
            self.lower = _sparse_on(xp, lower)
            self.upper = _sparse_on(xp, upper)
            self.d_inverse = xp.asarray(1.0 / np.asarray(d, dtype=np.float64))
            self.permutation = xp.asarray(np.asarray(permutation, dtype=np.int64))

    def solve(self, b: np.ndarray) -> np.ndarray:
        with use_device(self.device) as xp:
            y = xp.asarray(b, dtype=xp.float64)[self.permutation]
            y = _sparse_triangular_solve(xp, self.lower, y, lower=True)
            y = y * (self.d_inverse[:, None] if y.ndim == 2 else self.d_inverse)
            y = _sparse_triangular_solve(xp, self.upper, y, lower=False)
            x = xp.empty_like(y)
            x[self.permutation] = y
            return to_host(x)


def _dense_triangular_solve(xp: ModuleType, factor: Any, b: Any, *,
                            transpose: bool = False) -> Any:
    """``L^-1 b`` (``L^-T b`` with ``transpose``) for the lower triangular ``factor``: SciPy's
    (LAPACK) on NumPy arrays, ``cupyx``'s (cuBLAS) on CuPy's."""
    if xp is np:
        from scipy.linalg import solve_triangular
    else:
        from cupyx.scipy.linalg import solve_triangular
    return solve_triangular(factor, b, trans=1 if transpose else 0, lower=True,
                            check_finite=False)


def _sparse_on(xp: ModuleType, matrix: sp.csr_matrix) -> Any:
    """``matrix`` (SciPy CSR) where ``xp``'s arrays live: itself on NumPy, a ``cupyx`` copy on
    the current CUDA device."""
    if xp is np:
        return matrix
    import cupyx.scipy.sparse

    copy = cupyx.scipy.sparse.csr_matrix(matrix)
    copy.sum_duplicates()  # marks it canonical (sorted, no duplicates), as cuSPARSE's SpSM needs
    return copy


def _sparse_triangular_solve(xp: ModuleType, matrix: Any, b: Any, *, lower: bool) -> Any:
    """``matrix^-1 b`` for a sparse triangular CSR ``matrix`` (:func:`_sparse_on`) and every
    column of ``b``: SciPy's on NumPy arrays, ``cupyx``'s (cuSPARSE) on CuPy's."""
    if xp is np:
        from scipy.sparse.linalg import spsolve_triangular
    else:
        from cupyx.scipy.sparse.linalg import spsolve_triangular
    return spsolve_triangular(matrix, b, lower=lower)


def _compiled_kernels(module: str) -> bool:
    """Whether the compiled kernel ``depsi.kernels.<module>`` runs here: Numba importable, and
    this process not a small Dask worker (a tile's task), where Numba's memory and a first
    compilation would not fit (:func:`~depsi.stm.runtime.roomy_process`); there the
    reference runs, the same result to the bit, and Numba is never imported. Elsewhere where
    it runs without compiling first (:func:`depsi.kernels.numba_support.ready`)."""
    if not roomy_process():
        return False
    import importlib

    return bool(importlib.import_module(f"depsi.kernels.{module}").ready())


def _factorise(normal: sp.spmatrix, device: Device | None = None):
    """The factorisation of the normal matrix: :class:`_LDL` up to
    :data:`LDL_MAX_UNKNOWNS` unknowns (a tile's), :class:`_Supernodal` above (the whole
    network; :class:`_Cholesky` where CVXOPT or the compiled sweeps are not at hand), SuperLU
    (symmetric mode, MMD ordering) where no package can be imported.
    Given a ``device``, the device's (:func:`_device_factorise`)."""
    if device is not None:
        return _device_factorise(normal, device)
    supernodal = (_Supernodal,) if _supernodal_fits(normal.shape[0]) else ()
    solvers = ((_LDL, *supernodal, _Cholesky) if normal.shape[0] <= LDL_MAX_UNKNOWNS
               else (*supernodal, _Cholesky))
    for solver in solvers:
        try:
            return solver(normal)
        except ImportError:
            continue
    return splu(normal, permc_spec="MMD_AT_PLUS_A",
                options={"SymmetricMode": True, "DiagPivotThresh": 0.0})


def _supernodal_fits(n_unknown: int) -> bool:
    """Whether :class:`_Supernodal`'s peak fits the memory available now: the supernodal factor
    and the simplicial copy read out of it are held at once, about twice cholespy's one factor.
    A 2-D network's factor holds about ``c n log2(n)`` entries of 16 bytes; ``c`` = 2.8 at 10^6
    points (148,000 unknowns, 7.1 M entries), taken as :data:`SUPERNODAL_FILL` with margin, and
    three such factors must fit (a small driver's SLURM or container limit then keeps
    cholespy's in-place factor)."""
    entries = SUPERNODAL_FILL * n_unknown * np.log2(max(n_unknown, 2))
    return 3 * 16 * entries <= available_host_memory()


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
        # int8 signs (8x less memory than float64; the products promote them exactly)
        return bits[:rows * count].reshape(rows, count).view(np.int8) * np.int8(2) - np.int8(1)

    # the probes in blocks of columns, and each over blocks of ARC_BLOCK arcs: the temporaries
    # are (ARC_BLOCK, PROBE_BLOCK) whatever the network's size; PROBE_SOLVE_COLUMNS of them
    # go through the factorisation in one solve (its columns are independent: each the
    # PROBE_BLOCK solve's to the bit, and so is every sum below, in the same order)
    blocks = [slice(start, min(start + ARC_BLOCK, A.shape[0]))
              for start in range(0, A.shape[0], ARC_BLOCK)]
    block_rows = [rows] if len(blocks) == 1 else [rows[block] for block in blocks]
    for together in range(0, REDUNDANCY_PROBES, PROBE_SOLVE_COLUMNS):
        groups = [(first, min(PROBE_BLOCK, REDUNDANCY_PROBES - first))
                  for first in range(together, min(together + PROBE_SOLVE_COLUMNS,
                                                   REDUNDANCY_PROBES), PROBE_BLOCK)]
        projected = np.zeros((A.shape[1], sum(count for _, count in groups)))
        signs = {}  # each block's probes, made once for both products (int8: 64 bytes an arc)
        for index, block in enumerate(blocks):
            for first, count in groups:
                columns = slice(first - together, first - together + count)
                signs[index, first] = probes(first, count, block)
                projected[:, columns] += block_rows[index].T @ (root[block, None]
                                                                * signs[index, first])
        solved = (lu.solve(projected, columns=PROBE_BLOCK) if isinstance(lu, _Updated)
                  else lu.solve(projected))
        for index, block in enumerate(blocks):
            for first, count in groups:
                columns = slice(first - together, first - together + count)
                hat = root[block, None] * (block_rows[index]
                                           @ np.ascontiguousarray(solved[:, columns]))
                total[block] += np.sum(hat * signs.pop((index, first)), axis=1)
    return np.clip(total / REDUNDANCY_PROBES, 0.0, 1.0)
