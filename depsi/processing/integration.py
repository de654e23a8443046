"""Spatial integration of the arc estimates into point parameters: the step's configuration,
the arcs' observations and the step itself.

``integrate_network`` turns per-arc differences (velocity, height error, unwrapped phase per
epoch) into per-point values relative to a reference point by sparse weighted least squares over
the network (:mod:`depsi.processing.network_solver`: one factorisation of ``A^T W A`` serves
every right-hand side). Arcs failing a w-test are removed, weakly connected points and all but
the largest connected component are dropped (:mod:`depsi.processing.arc_testing`), and the
result says what was removed and why (docs/design.md, "Architecture"); its datum is
:mod:`depsi.processing.datum`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple, cast, overload

import numpy as np
import xarray as xr
from pydantic import Field, model_validator
from scipy.stats import norm

from depsi.conventions import phase_per_metre
from depsi.kernels.backend import Device, cuda_devices
from depsi.kernels.design_matrices import design_matrix
from depsi.kernels.lstsq import lstsq_batched
from depsi.processing.arc_testing import ARC_REASONS, POINT_REASONS, _test_network
from depsi.processing.arcs import estimate_arcs, heights_resolvable
from depsi.processing.datum import (
    DEFAULT_REFERENCE_RADIUS,
    POINT_BLOCK,
    _point_results,
    apply_reference_area,
)
from depsi.processing.datum import (  # moved: re-exported until the lead's files switch
    remove_reference_noise as remove_reference_noise,
)
from depsi.processing.network import ARC_CHUNK, arcs_from_edges, on_threads, point_positions
from depsi.processing.network_solver import ARC_BLOCK, _compiled_kernels
from depsi.sections import Section
from depsi.stm.dask_tools import computed_in_place
from depsi.stm.runtime import SpilledArrays, page_out, pageable, pageable_copy
from depsi.stm.schema import h2ph_rows, validate, years_since_mother

logger = logging.getLogger(__name__)

#: Arcs with ensemble coherence below this are not used by default (densification's arcs have
#: their own, :data:`depsi.processing.densification.DEFAULT_MIN_COHERENCE`).
DEFAULT_MIN_ARC_COHERENCE = 0.6
#: Significance level of each w-test (two-sided); critical value about 3.29.
DEFAULT_ALPHA = 0.001
#: At most this many testing iterations (each removes the worst failing arc of every
#: independent part of the network, then solves again).
DEFAULT_MAX_ITERATIONS = 100


class IntegrationConfig(Section):
    """Spatial integration of the arcs over the network, arc testing and the reference."""

    min_coherence: float = Field(
        DEFAULT_MIN_ARC_COHERENCE, ge=0, le=1,
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


_TWO_PI = 2.0 * np.pi


class ArcObservations(NamedTuple):
    """What integration needs of the arcs, without their ``(arc, time)`` variables:
    endpoints, coherence, the right-hand sides (velocity, height error, every epoch's unwrapped
    phase; float32 ``(arcs, 2 + epochs)``, as an array or as :class:`ArcRightHandSides`) and
    the spread of each arc's h2ph over the epochs. Made by :func:`arc_observations`;
    :func:`integrate_network` takes it in place of the arcs, so a caller can let the arc STM go
    before the network is solved."""

    source: np.ndarray
    target: np.ndarray
    coherence: np.ndarray
    rhs: np.ndarray | ArcRightHandSides
    h2ph_spread: np.ndarray


#: Ambiguity dtypes :class:`ArcRightHandSides` stores, smallest first: int8 holds every arc's
#: cycles in the scenes we know (an arc spans tens of cycles at most); a larger value moves the
#: store to the next.
_AMBIGUITY_DTYPES = (np.int8, np.int16, np.int32)


class ArcRightHandSides:
    """The arcs' right-hand sides (velocity, height error and every epoch's unwrapped phase,
    float32 ``(arcs, 2 + epochs)``) held as what they are made of: each arc's velocity and
    height (float32), its ambiguities (int8 where they fit) and the points' wrapped phases
    the arcs' phases are differences of (shared, not copied). Rows are formed when read
    (``rhs[rows]``, ``rhs[rows, columns]``), the values :func:`fill_observations` wrote into an
    array before to the bit: ``float32(2 pi ambiguity) + wrap(phase[target] - phase[source])``,
    the arc phase of :func:`~depsi.processing.network.arcs_from_edges`.

    At 60 epochs an arc takes 68 bytes here against 248 as an array (docs/benchmarks.md, "The arcs'
    observations in the driver"). Where an arc's phase is not the difference of its points' phases
    (arcs made elsewhere), :meth:`fill` stores every row as an array from then on: the values are
    always the arcs' own.
    """

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, phase: np.ndarray, source: np.ndarray, target: np.ndarray):
        self.phase = phase  # (points, epochs) float32
        self.source, self.target = source, target
        n, n_epochs = len(source), phase.shape[1]
        self.shape = (n, 2 + n_epochs)
        # velocity and height, and the cycles: released (None) once the rows are an array
        self.motion: np.ndarray | None = pageable((n, 2), np.float32)
        self.ambiguity: np.ndarray | None = pageable((n, n_epochs), _AMBIGUITY_DTYPES[0])
        self.full: np.ndarray | None = None  # the rows as an array, once one is not formed
        #: which rows are finite (every value), as they were filled
        self.finite = np.zeros(n, dtype=bool)
        self._filled = 0  # rows filled so far, in order
        self._file: SpilledArrays | None = None  # where spill() moved the arcs' values

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes held in memory for the arcs (not the shared phases; 0 once
        moved to a file by :meth:`spill`)."""
        if self._file is not None:
            return 0
        # the rows as an array (full), or velocity and height and the cycles
        return sum(a.nbytes for a in (self.full, self.motion, self.ambiguity) if a is not None)

    @property
    def spilled(self) -> bool:
        """Whether the arcs' values are in a temporary file (:meth:`spill`)."""
        return self._file is not None

    def spill(self, directory: str | None = None) -> bool:
        """Move the arcs' own values (velocity and height and the cycles, or the rows as an
        array) to an unnamed temporary file in ``directory`` (default: the system's, e.g.
        ``$TMPDIR``; :class:`~depsi.stm.runtime.SpilledArrays`), which goes when this
        object does. Rows are read from it from then on, a block's span at a time, the same
        values to the bit; :meth:`fill` is then refused. The whole network's solve after its
        tiles reads every row twice, in order (the normal equations' right-hand sides, the
        misclosures): the driver need not hold them through the factorisation and the point
        results (docs/benchmarks.md, "The arcs' observations in the driver").
        Returns False (the values kept in memory, a warning logged) where the file cannot be
        written."""
        if self._file is not None:
            return True
        names = ("full",) if self.full is not None else ("motion", "ambiguity")
        try:
            self._file = SpilledArrays({name: getattr(self, name) for name in names},
                                       directory)
        except OSError as error:
            logger.warning("arcs: right-hand sides kept in memory (no temporary file for "
                           "them: %s)", error)
            return False
        for name in names:
            setattr(self, name, None)
        logger.debug("arcs: %d bytes of right-hand sides moved to a temporary file",
                     self._file.nbytes)
        return True

    def _formed_span(self, file: SpilledArrays, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` from the file, one read of their span: :meth:`_formed`'s."""
        low, high = int(index.min()), int(index.max()) + 1
        local = index - low
        if "full" in file:
            return file.rows("full", low, high)[local]
        return self._form_rows(self.source[low:high], self.target[low:high], local,
                               file.rows("motion", low, high), file.rows("ambiguity", low, high))

    def _form_rows(self, source, target, index, motion, ambiguity) -> np.ndarray:
        """As fill_observations made the array: 2 pi times the cycles (in float64) to
        float32, then the float32 arc phase added; in one compiled pass where it runs (12x
        faster, the same rows to the bit: 40 s of the driver a pass over 14 M arcs in
        NumPy)."""
        if self.phase.dtype == np.float32 and _compiled_kernels("arc_rhs_numba"):
            from depsi.kernels.arc_rhs_numba import form_rows
        else:
            from depsi.kernels.arc_rhs_numba import form_rows_reference as form_rows
        return form_rows(self.phase, source, target, index, motion, ambiguity)

    def _formed_spilled(self, file: SpilledArrays, index: np.ndarray) -> np.ndarray:
        if not index.size:
            return np.empty((0, self.shape[1]), np.float32)
        if int(index.max()) - int(index.min()) < max(4 * index.size, ARC_BLOCK):
            return self._formed_span(file, index)
        # scattered rows: in pieces of the sorted rows, each spanning at most ARC_BLOCK arcs
        order = np.argsort(index, kind="stable")
        ordered = index[order]
        out = np.empty((index.size, self.shape[1]), np.float32)
        first = 0
        while first < index.size:
            stop = int(np.searchsorted(ordered, ordered[first] + ARC_BLOCK))
            out[order[first:stop]] = self._formed_span(file, ordered[first:stop])
            first = stop
        return out

    def _formed(self, rows) -> np.ndarray:
        if self._file is not None:
            index = (np.arange(*rows.indices(len(self))) if isinstance(rows, slice)
                     else np.asarray(rows, dtype=np.int64))
            return self._formed_spilled(self._file, index)
        if self.full is not None:
            return self.full[rows]
        index = np.arange(*rows.indices(len(self))) if isinstance(rows, slice) else rows
        return self._form_rows(self.source, self.target, index, self.motion, self.ambiguity)

    def __getitem__(self, key) -> np.ndarray:
        rows, columns = key if isinstance(key, tuple) else (key, slice(None))
        if isinstance(rows, (int, np.integer)):
            return self._formed(slice(int(rows), int(rows) + 1))[0, columns]
        if isinstance(rows, slice):
            index = np.arange(*rows.indices(len(self)))
            if index.size <= ARC_BLOCK and rows.step in (None, 1):
                return self._formed(rows)[:, columns]
        else:
            index = np.asarray(rows)
            index = np.flatnonzero(index) if index.dtype == bool else index
        if index.size <= ARC_BLOCK:
            return self._formed(index)[:, columns]
        first = self._formed(index[:1])[:, columns]  # the columns' shape
        out = np.empty((index.size,) + first.shape[1:], np.float32)
        for start in range(0, index.size, ARC_BLOCK):
            out[start:start + ARC_BLOCK] = self._formed(index[start:start + ARC_BLOCK])[:, columns]
        return out

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def fill(self, start: int, velocity, height, ambiguity, arc_phase, *,
             check: bool = True) -> None:
        """Rows ``start:`` of the arcs (in order: the rows before are filled): their
        estimates, their ``(arcs, epochs)`` int32 ambiguities and their float32 phases.
        With ``check`` the rows the array held are made and the rows formed from the points
        checked against them (to the bit, NaN where they are NaN): where they differ (arcs
        not formed from these points' phases) every row is kept as an array from then on.
        Without, the caller vouches that the arcs' phases are
        :func:`~depsi.processing.network.arcs_from_edges`'s of these points (the arcs step,
        which formed them there)."""
        stop = start + len(velocity)
        if self._file is not None:
            raise ValueError("rows: the arcs' right-hand sides were moved to a file (spill); "
                             "fill every row before")
        if start != self._filled:
            raise ValueError(f"rows: expected the arcs in order, from row {self._filled}, "
                             f"found row {start}")
        self._filled = stop
        rows = slice(start, stop)
        # every value finite: the unwrapped phases are where the phases are (whole cycles)
        self.finite[rows] = (np.isfinite(velocity) & np.isfinite(height)
                             & np.isfinite(arc_phase).all(axis=1))
        expected = None
        if check or self.full is not None:
            expected = np.empty((stop - start, self.shape[1]), np.float32)
            expected[:, 0], expected[:, 1] = velocity, height
            np.multiply(ambiguity, _TWO_PI, out=expected[:, 2:])
            expected[:, 2:] += arc_phase
        if self.motion is not None and self.ambiguity is not None:  # not yet rows as an array
            self.motion[rows, 0], self.motion[rows, 1] = velocity, height
            # a missing epoch's phase is NaN, whatever its ambiguity: 0 is stored there
            cycles = np.where(np.isnan(arc_phase), 0, ambiguity)
            if cycles.size:
                info = np.iinfo(self.ambiguity.dtype)
                low, high = int(cycles.min()), int(cycles.max())
                if low < info.min or high > info.max:
                    wider = next(d for d in _AMBIGUITY_DTYPES
                                 if np.iinfo(d).min <= low and high <= np.iinfo(d).max)
                    self.ambiguity = self.ambiguity.astype(wider)
            self.ambiguity[rows] = cycles
            if expected is None or np.array_equal(self._formed(rows), expected,
                                                  equal_nan=True):
                return
            logger.debug("arcs %d-%d: their phases are not their points' differences; "
                         "right-hand sides kept as an array", start, stop)
            full = np.empty(self.shape, np.float32)
            for first in range(0, start, ARC_BLOCK):  # the rows formed so far, as they were
                full[first:min(first + ARC_BLOCK, start)] = self._formed(
                    slice(first, min(first + ARC_BLOCK, start)))
            self.full, self.motion, self.ambiguity = full, None, None
        cast(np.ndarray, self.full)[rows] = expected  # the rows as an array, from here on


def _check_arc_ends(source: np.ndarray, target: np.ndarray, n: int) -> None:
    if source.size and (max(source.max(), target.max()) >= n or min(source.min(),
                                                                    target.min()) < 0):
        raise ValueError(f"arcs: source/target expected in [0, {n}) (the points' space), found "
                         f"range [{min(source.min(), target.min())}, "
                         f"{max(source.max(), target.max())}]")


def empty_observations(source: np.ndarray, target: np.ndarray, n_epochs: int,
                       phase: np.ndarray | None = None) -> ArcObservations:
    """:class:`ArcObservations` of the arcs ``source`` -> ``target``, their values to be filled
    by :func:`fill_observations` (allocated, not touched: memory is taken as rows are filled).
    Given the points' wrapped ``phase`` ``(points, epochs)`` the arcs are differences of, the
    right-hand sides are :class:`ArcRightHandSides` (a quarter of the memory), else an
    array."""
    n = len(source)
    source = np.asarray(source, dtype=np.int64)
    target = np.asarray(target, dtype=np.int64)
    if phase is not None and phase.shape[1] != n_epochs:
        raise ValueError(f"phase: expected {n_epochs} epochs, found {phase.shape[1]}")
    rhs = (np.empty((n, 2 + n_epochs), np.float32) if phase is None
           else ArcRightHandSides(phase, source, target))
    # large (from about 4x10^6 arcs): in a file's pages, which the whole network's
    # factorisation lets go (depsi.stm.runtime.page_out)
    return ArcObservations(source, target, pageable(n, np.float64), rhs,
                           pageable(n, np.float64))


def fill_observations(observations: ArcObservations, start: int, arcs: xr.Dataset, *,
                      formed_here: bool = False) -> None:
    """Rows ``start:start + arcs.sizes['arc']`` of ``observations`` from estimated arcs in
    memory (``phase``, ``ambiguity``, ``velocity``, ``height_error``, ``temporal_coherence``,
    ``h2ph``), in blocks of :data:`ARC_BLOCK` arcs (no ``(arcs, epochs)`` temporaries).
    ``formed_here``: the arcs were formed by
    :func:`~depsi.processing.network.arcs_from_edges` from the points whose phases the
    observations hold (their rows need no check, :meth:`ArcRightHandSides.fill`)."""
    stop = start + arcs.sizes["arc"]
    rhs = observations.rhs
    observations.coherence[start:stop] = arcs["temporal_coherence"].values
    arc_h2ph = np.asarray(arcs["h2ph"].transpose("arc", ...).values).reshape(stop - start, -1)
    if isinstance(rhs, ArcRightHandSides):
        rhs.fill(start, arcs["velocity"].values, arcs["height_error"].values,
                 arcs["ambiguity"].transpose("arc", "time").values,
                 arcs["phase"].transpose("arc", "time").values, check=not formed_here)
        for first in range(0, stop - start, ARC_BLOCK):
            block = slice(first, first + ARC_BLOCK)
            rows = slice(start + first, min(start + first + ARC_BLOCK, stop))
            observations.h2ph_spread[rows] = _spread(arc_h2ph[block])
        return
    # velocity, height and every epoch's unwrapped phase: the right-hand sides, filled in
    # place (no second (arcs, epochs) copy). float32, the precision of the arcs' estimates and
    # wrapped phases they come from (an unwrapped phase of 100 rad is held to 8e-6 rad, far
    # below any arc's noise); the normal equations and solutions are float64
    rhs[start:stop, 0] = arcs["velocity"].values
    rhs[start:stop, 1] = arcs["height_error"].values
    arc_phase = arcs["phase"].transpose("arc", "time").values
    arc_ambiguity = arcs["ambiguity"].transpose("arc", "time").values
    for first in range(0, stop - start, ARC_BLOCK):
        block = slice(first, first + ARC_BLOCK)
        rows = slice(start + first, min(start + first + ARC_BLOCK, stop))
        np.multiply(arc_ambiguity[block], _TWO_PI, out=rhs[rows, 2:])
        rhs[rows, 2:] += arc_phase[block]
        observations.h2ph_spread[rows] = _spread(arc_h2ph[block])


def _spread(h2ph: np.ndarray) -> np.ndarray:
    """Each arc's h2ph spread over the epochs (root sum of squares about its mean)."""
    h2ph = h2ph.astype(np.float64)
    return np.sqrt(np.sum((h2ph - h2ph.mean(axis=1, keepdims=True)) ** 2, axis=1))


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
    observations = empty_observations(source, target, points.sizes["time"],
                                      points["phase"].transpose("space", "time").values)
    arcs = arcs[["phase", "velocity", "height_error", "temporal_coherence", "ambiguity",
                 "h2ph"]]
    # a lazy arc STM (a stored one: `depsi run` reads its arcs step's product) is read a few of its
    # chunks at a time, never whole (docs/benchmarks.md, "The arcs' observations in the driver")
    for start, stop in _read_batches(arcs["phase"].chunks, arcs.sizes["arc"]):
        fill_observations(observations, start, arcs.isel(arc=slice(start, stop)).compute())
    return observations


#: Arcs estimated at a time by :func:`estimated_observations`: the arc STM of one batch (about
#: 750 bytes per arc at 60 epochs) in several chunks, so every thread has work. A multiple of
#: ``ARC_CHUNK``, so the periodogram sees the chunks of the whole arc STM and the values are
#: those of the arc STM estimated whole bit for bit (a GEMM's rounding depends on its block's
#: shape).
ARC_BATCH = 4 * ARC_CHUNK


def estimated_observations(points: xr.Dataset, source: np.ndarray, target: np.ndarray, *,
                           height_range: tuple[float, float], velocity_range: tuple[float, float],
                           height_step: float | None, velocity_step: float | None,
                           devices=None, extra_regressors=None) -> ArcObservations:
    """The arcs ``source`` -> ``target`` of ``points`` (in memory) estimated by the periodogram
    (:func:`~depsi.processing.arcs.estimate_arcs`, its ranges and steps), as the observations
    of :func:`integrate_network`.

    The values of ``arc_observations(points, estimate_arcs(arcs_from_edges(points, source,
    target), ...))``, made :data:`ARC_BATCH` arcs at a time: each batch's arc STM (phase,
    h2ph, ambiguity) is formed, estimated on the active scheduler and turned into its rows of
    the observations, then let go, so the whole arc STM is never in memory.
    """
    source = np.asarray(source, dtype=np.int64)
    target = np.asarray(target, dtype=np.int64)
    positions = point_positions(points)
    height = heights_resolvable(points["h2ph"])  # decided once, for every batch
    # the right-hand sides as the points' phases and the arcs' cycles (a quarter of the array)
    observations = empty_observations(source, target, points.sizes["time"],
                                      points["phase"].transpose("space", "time").values)
    for start in range(0, len(source), ARC_BATCH):
        rows = slice(start, start + ARC_BATCH)
        arcs = arcs_from_edges(points, source[rows], target[rows], positions)
        estimated = estimate_arcs(arcs, height_range=height_range,
                                  velocity_range=velocity_range, height_step=height_step,
                                  velocity_step=velocity_step, devices=devices, height=height,
                                  extra_regressors=extra_regressors)
        new = [name for name in estimated.data_vars if name not in arcs.data_vars]
        # the arcs' phases are arcs_from_edges's of these points: rows need no check
        fill_observations(observations, start, arcs.assign(computed_in_place(estimated[new])),
                          formed_here=True)
        logger.info("arcs: %d of %d estimated", min(start + ARC_BATCH, len(source)),
                    len(source))
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


@overload
def integrate_network(
    points: xr.Dataset, arcs: xr.Dataset | ArcObservations, *, reference: int | None = ...,
    min_coherence: float = ..., alpha: float = ..., max_iterations: int = ...,
    reference_radius: float | None = ..., return_arcs: Literal[False] = ...,
    regressors: Mapping[str, np.ndarray] | None = ...,
    devices: Sequence[Device | str | int] | None = ...,
) -> xr.Dataset: ...


@overload
def integrate_network(
    points: xr.Dataset, arcs: xr.Dataset | ArcObservations, *, reference: int | None = ...,
    min_coherence: float = ..., alpha: float = ..., max_iterations: int = ...,
    reference_radius: float | None = ..., return_arcs: Literal[True],
    regressors: Mapping[str, np.ndarray] | None = ...,
    devices: Sequence[Device | str | int] | None = ...,
) -> tuple[xr.Dataset, xr.Dataset]: ...


@overload
def integrate_network(
    points: xr.Dataset, arcs: xr.Dataset | ArcObservations, *, reference: int | None = ...,
    min_coherence: float = ..., alpha: float = ..., max_iterations: int = ...,
    reference_radius: float | None = ..., return_arcs: bool = ...,
    regressors: Mapping[str, np.ndarray] | None = ...,
    devices: Sequence[Device | str | int] | None = ...,
) -> xr.Dataset | tuple[xr.Dataset, xr.Dataset]: ...


def integrate_network(
    points: xr.Dataset,
    arcs: xr.Dataset | ArcObservations,
    *,
    reference: int | None = None,
    min_coherence: float = DEFAULT_MIN_ARC_COHERENCE,
    alpha: float = DEFAULT_ALPHA,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    reference_radius: float | None = None,
    return_arcs: bool = False,
    regressors: Mapping[str, np.ndarray] | None = None,
    devices: Sequence[Device | str | int] | None = None,
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
        (default): results stay relative to the reference point alone. ``reference_radius``
        defaults to None on purpose, not to the section's
        :data:`~depsi.processing.datum.DEFAULT_REFERENCE_RADIUS`: the chain moves the datum
        itself, after the reference noise.
    return_arcs
        Also return the arcs with ``arc_kept``, ``arc_removal_reason`` and ``w_statistic``.
    regressors
        The further model terms the arcs' periodogram estimated beside velocity and height
        (name to ``(T,)`` values, :attr:`depsi.processing.motion_models.TemporalModel
        .regressors`): the w-test's velocity std includes their variance inflation.
    devices
        Where the network's factorisations solve (e.g. ``["cuda:0"]``); default
        :func:`depsi.kernels.backend.get_devices`. The CUDA ones among them take the whole
        network's solve (the first) and the w-test tiles' (spread over them); without a CUDA
        device everything runs on the host, the reference path. The same arcs are rejected
        either way, the values agree to floating-point precision
        (:mod:`depsi.processing.network_solver`).

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
    ``r_a = 1 - w_a a^T (A^T W A)^-1 a`` (exact up to
    :data:`~depsi.processing.network_solver.EXACT_REDUNDANCY_POINTS` unknowns, estimated by
    random probes above); arcs with ``r_a`` below
    :data:`~depsi.processing.arc_testing.MIN_REDUNDANCY` are bridges no loop checks and are
    not tested. The critical value is Bonferroni-corrected over the ``T + 2`` misclosures
    (attrs ``w_critical``).

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
    cuda = _solver_devices(devices)  # (checked before any work)
    source, target, coherence, rhs, h2ph_spread = _observations_of(points, arcs, return_arcs)
    finite, arc_reason, arc_ok = _usable_arcs(coherence, rhs, min_coherence)
    years = years_since_mother(points)
    weights, sd = _arc_weights(points, years, coherence, h2ph_spread, finite, regressors)
    critical = _critical_value(alpha, points.sizes["time"])
    positions = point_positions(points)
    arc_ok, point_reason, values, ref, w_stat, iterations, n_tested_out = _test_network(
        source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions, coherence,
        sd, critical, max_iterations, devices=cuda)
    point_ok = point_reason == 0
    arc_reason[(arc_reason == 0) & ~arc_ok] = 3
    # the arcs' weights and standard deviations (four floats an arc: 0.44 GB at 10^7 points)
    # are not read again: they go before the point results take their memory
    del weights, sd, finite
    if not return_arcs:
        w_stat = None
    # the arcs' arrays the caller holds (ends, coherence) are not read until the outcome's
    # counts: their pages leave while the point results take memory
    page_out()
    result = _point_results(points, values, point_ok, point_reason, ref, years)
    result.attrs.update(_outcome_attrs(ref, min_coherence, alpha, critical, point_reason, arc_ok,
                                       arc_reason, iterations))
    _log_outcome(points, ref, point_reason, arc_ok, n_tested_out, iterations,
                 arc_reason=arc_reason, min_coherence=min_coherence)
    if reference_radius is not None:
        result = apply_reference_area(result, reference_radius)
    if not return_arcs:
        return result
    # a Dataset: _observations_of refuses ArcObservations with return_arcs
    return result, _tested_arcs(cast(xr.Dataset, arcs), arc_ok, arc_reason, w_stat)


def _solver_devices(devices: Sequence[Device | str | int] | None) -> tuple[Device, ...]:
    """The devices the network's factorisations solve on: the CUDA ones of ``devices``
    (:func:`~depsi.kernels.backend.cuda_devices`); none, the host reference, where there
    are none (CPU devices only tell chunks apart, and the network is one problem)."""
    return tuple(cuda_devices(devices))


def _observations_of(points: xr.Dataset, arcs: xr.Dataset | ArcObservations,
                     return_arcs: bool) -> ArcObservations:
    """The arcs' observations: ``arcs`` themselves where they are :class:`ArcObservations`
    (checked against ``points``), else made by :func:`arc_observations`."""
    if not isinstance(arcs, ArcObservations):
        return arc_observations(points, arcs)
    if return_arcs:
        raise ValueError("return_arcs: expected the arcs Dataset, found ArcObservations "
                         "(they keep no arc variables to return)")
    if arcs.rhs.shape[1] != 2 + points.sizes["time"]:
        raise ValueError(f"arcs: ArcObservations of {arcs.rhs.shape[1] - 2} epochs, "
                         f"expected the points' {points.sizes['time']}")
    _check_arc_ends(arcs.source, arcs.target, points.sizes["space"])
    return arcs


def _usable_arcs(coherence, rhs, min_coherence):
    """``(finite, arc_reason, arc_ok)``: the arcs whose observations are all finite, reason 1
    (:data:`~depsi.processing.arc_testing.ARC_REASONS`) for the others and those below
    ``min_coherence``, and the arcs left to integrate."""
    finite = np.isfinite(coherence)
    if isinstance(rhs, ArcRightHandSides):
        finite &= rhs.finite  # found as the rows were filled (no row formed again)
    else:
        for start in range(0, len(coherence), ARC_BLOCK):  # no (arcs, epochs) temporary
            rows = slice(start, start + ARC_BLOCK)
            finite[rows] &= np.isfinite(rhs[rows]).all(axis=1)
    arc_reason = np.where(finite & (coherence >= min_coherence), 0, 1).astype(np.int8)
    arc_ok = arc_reason == 0
    if not arc_ok.any():
        raise ValueError(f"arcs: all {len(coherence)} arcs are below "
                         f"min_coherence={min_coherence} (or NaN); no network to integrate")
    return finite, arc_reason, arc_ok


def _arc_weights(points, years, coherence, h2ph_spread, finite, regressors=None):
    """Each arc's weight ``1 / s^2`` (:func:`phase_variance_from_coherence`) and the standard
    deviations ``(velocity, height, phase)`` its misclosures are divided by; with further model
    terms estimated beside the velocity (``regressors``), its std grows by their variance
    inflation (a step or breakpoint shares much of the velocity's signal)."""
    m2ph = abs(phase_per_metre(points.attrs["wavelength"]))
    var_phase = phase_variance_from_coherence(np.where(finite, coherence, 0.05))
    weights = 1.0 / var_phase
    sd_phase = np.sqrt(var_phase)
    sd_velocity = sd_phase / (m2ph * np.sqrt(np.sum((years - years.mean()) ** 2)))
    if regressors:
        design = np.column_stack([years, np.ones_like(years)]
                                 + [np.asarray(g, np.float64) for g in regressors.values()])
        inflation = np.linalg.pinv(design.T @ design)[0, 0] * np.sum((years - years.mean()) ** 2)
        sd_velocity = sd_velocity * np.sqrt(max(inflation, 1.0))
    sd_height = sd_phase / (m2ph * np.maximum(h2ph_spread, 1e-12))
    # held through the test and the whole network's solve: large, in a file's pages
    return (pageable_copy(weights),
            tuple(pageable_copy(sd) for sd in (sd_velocity, sd_height, sd_phase)))


def _critical_value(alpha: float, n_epochs: int) -> float:
    """The w-test's critical value of one misclosure.

    Each arc is tested on its T + 2 normalised misclosures at once: ``alpha`` is the arc's
    family-wise level (Bonferroni), so a clean arc fails with probability alpha, not T alpha.

    Examples
    --------
    >>> round(_critical_value(0.001, 18), 2)
    4.06
    """
    return float(norm.ppf(1.0 - alpha / (2.0 * (n_epochs + 2))))


def _outcome_attrs(ref, min_coherence, alpha, critical, point_reason, arc_ok, arc_reason,
                   iterations) -> dict:
    """The result's attrs: its reference, the test's settings and what was removed, by
    reason."""
    return {
        "reference": ref,
        "min_coherence": min_coherence,
        "alpha": alpha,
        "w_critical": critical,
        "n_points_kept": int((point_reason == 0).sum()),
        "n_points_removed_weak": int((point_reason == 1).sum()),
        "n_points_removed_component": int((point_reason == 2).sum()),
        "n_arcs_kept": int(arc_ok.sum()),
        "n_arcs_removed_coherence": int((arc_reason == 1).sum()),
        "n_arcs_removed_wtest": int((arc_reason == 2).sum()),
        "n_test_iterations": int(iterations),
        "n_arcs_removed_with_point": int((arc_reason == 3).sum()),
        "removal_reason_legend": str(POINT_REASONS),
    }


def _log_outcome(points, ref, point_reason, arc_ok, n_tested_out, iterations, *,
                 arc_reason=None, min_coherence=None) -> None:
    n = points.sizes["space"]
    point_ok = point_reason == 0
    # name the reference as the input names it: point_index (the chain's index into its
    # input) when the points carry one, else the index into these points
    named = (f"point_index {int(points['point_index'].values[ref])}"
             if "point_index" in points.coords else f"{ref}")
    logger.info("integration: %d/%d points, %d/%d arcs kept (%d rejected by w-test in %d "
                "iterations), reference %s", point_ok.sum(), n, arc_ok.sum(), len(arc_ok),
                n_tested_out, iterations, named)
    if arc_reason is not None:
        # why the others went: the arcs' own coherence, the w-test, or a point that left
        logger.info("integration: arcs rejected: %d below min_coherence %s (or without a "
                    "finite estimate), %d by the w-test, %d with a point that left the "
                    "network; points removed: %d with fewer than two arcs left, %d off the "
                    "reference's piece", int((arc_reason == 1).sum()), min_coherence,
                    int((arc_reason == 2).sum()), int((arc_reason == 3).sum()),
                    int((point_reason == 1).sum()), int((point_reason == 2).sum()))
    outside = int((point_reason == 2).sum())
    if outside:
        logger.warning("integration: the network broke into pieces; %d of %d points (%.1f %%) "
                       "are not connected to the piece holding the reference (%d points) and "
                       "leave the network; the chain densifies them against it", outside, n,
                       100.0 * outside / n, int(point_ok.sum()))


def _tested_arcs(arcs: xr.Dataset, arc_ok, arc_reason, w_stat) -> xr.Dataset:
    """The arcs with what the test decided: ``arc_kept``, ``arc_removal_reason`` (legend in
    attrs) and ``w_statistic``."""
    arcs_out = arcs.assign(
        arc_kept=("arc", arc_ok),
        arc_removal_reason=("arc", arc_reason),
        w_statistic=("arc", w_stat.astype(np.float32)),
    )
    arcs_out.attrs["arc_removal_reason_legend"] = str(ARC_REASONS)
    return arcs_out


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

    def block(start: int) -> None:  # each block writes its own rows
        rows = slice(start, min(start + POINT_BLOCK, n))
        y = np.asarray(unwrapped[rows], dtype=np.float64) - base
        design, _ = design_matrix(years, terms=("offset", "velocity", "height_error"),
                                  h2ph=h2ph_rows(h2ph_all, rows, n_epochs),
                                  wavelength=wavelength)
        fit = lstsq_batched(design, y)
        values[rows, 0], values[rows, 1] = fit.x[:, 1], fit.x[:, 2]
        values[rows, 2:] = y

    on_threads(block, range(0, n, POINT_BLOCK))
    values[reference, :2] = 0.0  # its own phases are zero: no round-off left
    out = _point_results(points, values, np.ones(n, bool), np.zeros(n, np.int8), int(reference),
                         years)
    out.attrs["reference"] = int(reference)
    return out
