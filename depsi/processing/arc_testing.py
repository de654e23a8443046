"""Arc testing of the point network: the w-test iterations (solve, test every arc on its
misclosures and its own redundancy number, remove the worst failing arcs), the pruning of weakly
connected points and small components, and the test of a large network tile by tile.

The solutions come from :mod:`depsi.processing.network_solver`; the reference point each
iteration is chosen by :mod:`depsi.processing.datum`. Given CUDA devices (``devices``), the
solutions' factorisations solve there (a tile's dense, the whole network's sparse: the
network solver's module docstring says how); the tests, misclosures and decisions stay on the
host, so the same arcs are rejected.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from depsi.kernels.backend import Device, chunk_device
from depsi.processing.datum import _choose_reference, _point_quality
from depsi.processing.network import cell_keys, worker_threads
from depsi.processing.network_solver import ARC_BLOCK, _compiled_kernels, _NetworkSolve
from depsi.stm import runtime
from depsi.stm.runtime import release_memory, workers_client

logger = logging.getLogger(__name__)

#: Networks of more points are tested tile by tile (tiles of about this many points), then
#: solved once as a whole: the factorisations stay small and the cost grows linearly. The
#: whole network's w-statistics, with the tiles' redundancy numbers, are then reported, not
#: iterated on: more whole-network iterations remove fewer arcs than alpha's false alarms
#: (docs/benchmarks.md, "The network solver's choices").
TILE_POINTS = 8000
#: Margin of each tile's sub-network, in median arc lengths: arcs near a tile's edge are
#: tested with loops on both sides.
TILE_MARGIN = 3.0
#: Redundancy numbers are recomputed once this fraction of the arcs was removed since.
REDUNDANCY_REFRESH = 0.02
#: Arcs with a redundancy number below this cannot be tested (a bridge: no loop checks them).
MIN_REDUNDANCY = 0.02

#: Why a point left the network (variable ``removal_reason``; legend also in attrs).
POINT_REASONS = {0: "kept", 1: "fewer than 2 usable arcs", 2: "outside largest component"}
#: Why an arc left the network (variable ``arc_removal_reason`` of the returned arcs).
ARC_REASONS = {0: "kept", 1: "coherence below min_coherence", 2: "rejected by w-test",
               3: "touches a removed point"}


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


def _independent_worst(candidates, w_stat, source, target, n):
    """Arcs to remove in one iteration: the worst failing arc, and every other failing arc,
    worst first, that shares no point with an arc already chosen.

    An arc's error enters the misclosures of the arcs at its two points; those arcs wait for the
    next iteration. Blocking one ring more (every arc of the points' neighbours) removed the same
    arcs in three times as many iterations (docs/benchmarks.md, "The network solver's choices"): the
    failing arcs of a real network are mostly wrong themselves, not the neighbours of a wrong
    one."""
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


#: Arcs per block of :func:`_largest_misclosure`: its buffers (8 MiB at 62 columns) stay below
#: the allocator's :data:`~depsi.stm.runtime.MMAP_THRESHOLD`, so every call of every tile's
#: w-test reuses the same heap pages instead of faulting in ARC_BLOCK-sized temporaries anew
#: (docs/benchmarks.md, "The network solver's choices").
MISCLOSURE_BLOCK = 8192


def _largest_misclosure(rhs, values, source, target, sd) -> np.ndarray:
    """Per arc, the largest of its misclosures (velocity, height, each epoch's phase) divided
    by their standard deviations; computed over blocks of :data:`MISCLOSURE_BLOCK` arcs in
    buffers made once, so no ``(arcs, epochs)`` temporary is made. In float32, the precision of
    the right-hand sides (an unwrapped phase of 1,000 rad to 6e-5 rad, where no arc's standard
    deviation is below 0.1 rad); the per-arc divisions are float64. The points' values are cast
    a block's rows at a time (no float32 copy of them all: 0.37 GB at 10^7 points). Where
    Numba runs, :mod:`depsi.kernels.misclosure_numba` computes it, each arc's row read once
    (the same numbers to the bit)."""
    sd_velocity, sd_height, sd_phase = (np.broadcast_to(v, source.shape) for v in sd)
    out = np.empty(len(source))
    block = max(1, min(MISCLOSURE_BLOCK, len(source)))
    if _compiled_kernels("misclosure_numba"):
        from depsi.kernels import misclosure_numba

        # each arc's row read once, NumPy's operations in its order: the same numbers to the
        # bit (docs/benchmarks.md, "The integration tiles' solves")
        for start in range(0, len(source), block):
            rows = slice(start, start + block)
            misclosure_numba.largest_misclosure(values, source[rows], target[rows],
                                                rhs[rows], sd_velocity[rows],
                                                sd_height[rows], sd_phase[rows], out[rows])
        return out
    gathered = np.empty((block, values.shape[1]), values.dtype)
    misclosure = np.empty((block, values.shape[1]), np.float32)
    other = np.empty_like(misclosure)
    for start in range(0, len(source), block):
        rows = slice(start, start + block)
        m = min(block, len(source) - start)
        here, there = misclosure[:m], other[:m]
        np.take(values, target[rows], axis=0, out=gathered[:m])
        np.copyto(here, gathered[:m], casting="same_kind")
        np.take(values, source[rows], axis=0, out=gathered[:m])
        np.copyto(there, gathered[:m], casting="same_kind")
        np.subtract(here, there, out=here)
        np.subtract(rhs[rows], here, out=here)
        np.abs(here, out=here)
        out[rows] = np.maximum(np.maximum(here[:, 0] / sd_velocity[rows],
                                          here[:, 1] / sd_height[rows]),
                               here[:, 2:].max(axis=1) / sd_phase[rows])
    return out


def _test_arcs(source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions,
               coherence, sd, critical, max_iterations, *, redundancy=None, device=None):
    """The w-test iterations on one network: solve, test every arc, remove the failing arcs
    :func:`_independent_worst` chooses, until none fails (or ``max_iterations``).
    ``arc_reason`` is updated in place (2: rejected). ``redundancy``: the arcs' redundancy
    numbers, given (e.g. by the tiles) instead of estimated. ``device``: where the solutions'
    factorisations solve (None: the host reference; :class:`~depsi.processing.network_solver
    ._NetworkSolve`). Returns ``(arc_ok, point_reason, values, ref, w_stat, redundancy,
    iterations, n_removed)``."""
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
            # given the redundancy numbers and no iteration (the whole network after its
            # tiles) only the solution is asked of it: no factor held after the solve
            solved = _NetworkSolve(source, target, weights, rhs, np.flatnonzero(arc_ok), n,
                                   point_ok, ref,
                                   solution_only=not estimate and max_iterations == 0,
                                   device=device)
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


class _SubNetwork(NamedTuple):
    """One tile's sub-network (its points and the margin around it), in its own numbering:
    what :func:`_test_subnetwork` needs, and nothing of the whole network (a task's payload
    on a cluster)."""

    source: np.ndarray
    target: np.ndarray
    weights: np.ndarray
    rhs: np.ndarray
    positions: np.ndarray
    coherence: np.ndarray
    sd: tuple
    own: np.ndarray  # which of its arcs the tile decides on (midpoint in the tile)
    critical: float
    max_iterations: int


class _ArcsByTile(NamedTuple):
    """The arcs grouped by the tile of their midpoint, to find a tile's sub-network among the
    arcs of the tiles around it, not among all arcs (:func:`_arcs_by_tile`)."""

    order: np.ndarray  # arc indices, by tile key
    keys: np.ndarray  # their tile keys, sorted
    columns: int  # tile key = row * columns + column
    reach: int  # tiles a sub-network's margin reaches beyond its own, each way


def _arc_tiles(positions, source, target, arc_ok, low, cell):
    """``(tile_of_arc, margin)``: each arc's tile (row, column of its midpoint; int32) and
    :data:`TILE_MARGIN` median lengths of the usable arcs, made :data:`ARC_BLOCK` arcs at a
    time: no float64 ``(arcs, 2)`` midpoints or lengths of every arc beside them (0.6 GB of
    the driver at 10^7 points, 14 M arcs); the same numbers as over the whole arrays."""
    tile_of_arc = np.empty((len(source), 2), np.int32)
    usable = np.empty(int(np.count_nonzero(arc_ok)))
    filled = 0
    for start in range(0, len(source), ARC_BLOCK):
        rows = slice(start, start + ARC_BLOCK)
        ends = positions[source[rows]], positions[target[rows]]
        tile_of_arc[rows] = np.floor((0.5 * (ends[0] + ends[1]) - low) / cell)
        length = np.hypot(*(ends[1] - ends[0]).T)[arc_ok[rows]]
        usable[filled:filled + length.size] = length
        filled += length.size
    margin = TILE_MARGIN * float(np.median(usable)) if usable.size else 0.0
    return tile_of_arc, margin


def _arcs_by_tile(tile_of_arc: np.ndarray, cell: float, margin: float) -> _ArcsByTile:
    """Every arc with both ends in a tile's box (the tile and ``margin`` around it) has its
    midpoint in the box, so in a tile at most ``floor(margin / cell) + 1`` away (one more
    than the margin needs: no rounding of the midpoint can put it beyond)."""
    columns = int(tile_of_arc[:, 1].max()) + 1 if len(tile_of_arc) else 1
    keys = tile_of_arc[:, 0].astype(np.int64) * columns + tile_of_arc[:, 1]
    order = np.argsort(keys, kind="stable")
    # int32 where they fit (a few hundred tiles, fewer than 2^31 arcs): 0.1 GB less at 10^7
    small = np.int32 if max(len(keys), int(keys.max(initial=0)) + 1) < 2**31 else np.int64
    return _ArcsByTile(order.astype(small), keys[order].astype(small), columns,
                       int(margin // cell) + 1)


def _arcs_near(tile, by_tile: _ArcsByTile) -> np.ndarray:
    """The arcs whose midpoint lies within ``by_tile.reach`` tiles of ``tile``, ascending."""
    row, column = (int(v) for v in tile)
    first = max(column - by_tile.reach, 0)
    last = min(column + by_tile.reach, by_tile.columns - 1)
    rows = np.arange(max(row - by_tile.reach, 0), row + by_tile.reach + 1)
    starts = np.searchsorted(by_tile.keys, rows * by_tile.columns + first, side="left")
    stops = np.searchsorted(by_tile.keys, rows * by_tile.columns + last, side="right")
    # a few runs, each ascending: the stable sort (timsort) merges them
    return np.sort(np.concatenate([by_tile.order[a:b] for a, b in zip(starts, stops)]),
                   kind="stable")


def _tile_subnetwork(tile, *, low, cell, margin, positions, source, target, arc_ok, weights,
                     rhs, coherence, sd, critical, max_iterations, tile_of_arc, by_tile):
    """``(members, sub-network)`` of one tile: the arcs still kept with both ends in the tile
    and its margin (indices into the network's arcs, ascending) and their
    :class:`_SubNetwork`; None where fewer than 3 arcs are. Only the arcs of the tiles around
    it are looked at (``by_tile``, :func:`_arcs_by_tile`), not every arc: at 10^6 points
    cutting the 25 tiles costs about what the passes over every arc did (0.6-0.9 s), and it
    no longer grows with the number of tiles times the number of arcs."""
    lo, hi = low + tile * cell - margin, low + (tile + 1) * cell + margin
    inside = np.all((positions >= lo) & (positions < hi), axis=1)
    near = _arcs_near(tile, by_tile)
    members = near[arc_ok[near] & inside[source[near]] & inside[target[near]]]
    if members.size < 3:
        return None
    # the sub-network's points, sorted and unique (by a sort: np.unique's hash-based path is
    # slower on these integers with NumPy 2.4; docs/benchmarks.md, "Array operations")
    ends = np.sort(np.concatenate([source[members], target[members]]))
    points = ends[np.concatenate([[True], ends[1:] != ends[:-1]])]
    return members, _SubNetwork(
        np.searchsorted(points, source[members]), np.searchsorted(points, target[members]),
        weights[members], rhs[members],
        positions[points], coherence[members],
        tuple(np.broadcast_to(v, source.shape)[members] for v in sd),
        np.all(tile_of_arc[members] == tile, axis=1), critical, max_iterations)


def _test_subnetwork(sub: _SubNetwork, device: Device | None = None):
    """The w-test of one tile's sub-network: ``(redundancy numbers of its own arcs, which of
    its own arcs were rejected)``, or None when the tile is too weak to test on its own. A
    pure function of ``sub``: on a thread or on a worker it gives the same numbers.
    ``device``: where its factorisations solve (None: the host reference)."""
    n_arcs = len(sub.source)
    reason = np.zeros(n_arcs, dtype=np.int8)
    try:
        *_, tile_redundancy, _, _ = _test_arcs(
            sub.source, sub.target, np.ones(n_arcs, dtype=bool), reason, sub.weights,
            sub.rhs, len(sub.positions), None, sub.positions, sub.coherence, sub.sd,
            sub.critical, sub.max_iterations, device=device)
    except ValueError as err:  # a tile too weak to test on its own
        logger.debug("tile not tested: %s", err)
        return None
    return tile_redundancy[sub.own], (reason == 2)[sub.own]


def _test_tile(tile, *, devices: tuple[Device, ...] = (), **network):
    """One tile's w-test on its sub-network (:func:`_tile_subnetwork`). Returns
    ``(own arcs, their redundancy numbers, own arcs rejected)`` or None when the tile is too
    weak to test on its own; reads ``arc_ok`` and writes nothing shared. ``devices``: where
    the tiles' factorisations solve, the tiles spread over them (none: the host reference).
    A wave's tiles are two rows or columns apart (:func:`_tile_waves`): counted on that
    halved grid, neighbours in a wave alternate between devices."""
    selected = _tile_subnetwork(tile, **network)
    if selected is None:
        return None
    members, sub = selected
    device = (chunk_device(devices, int(tile[0]) // 2 + int(tile[1]) // 2) if devices
              else None)
    return _tile_outcome(members[sub.own], _test_subnetwork(sub, device))


def _tile_outcome(own, tested):
    """:func:`_test_subnetwork`'s answer in the network's arc numbers (``own``: the tile's
    own arcs)."""
    if tested is None:
        return None
    redundancy, rejected = tested
    return own, redundancy, own[rejected]


#: On a cluster, at most this many tiles a worker thread are on their way or running at once
#: (each a payload of its arcs' right-hand sides, about 20 MB at 60 epochs): the driver's
#: memory follows the cluster's size, not the wave's.
TILES_IN_FLIGHT = 2


def _tiles_on_workers(client, wave, test_kwargs):
    """A wave's tiles as tasks on ``client``'s workers (:func:`_test_subnetwork`), at most
    :data:`TILES_IN_FLIGHT` a worker thread submitted at a time; the outcomes in the wave's
    order, as :func:`_test_tile` gives them. The driver cuts each sub-network and receives
    only the tile's decisions.

    Each tile goes to the worker with the fewest tiles a thread at that moment: its payload is
    scattered there and its task asked to run there. (Scattered without a worker, the payloads
    gathered on one worker and its tasks followed them: half the cluster idle, the tiles twice
    as long at 10^6 points.) The workers are asked for at every tile (adaptive scaling adds
    and removes them); with none at the moment, the tile goes with its task to the scheduler,
    which holds it until a worker comes (adaptive scaling starts one for it)."""
    from distributed import wait

    load = {}  # tiles in flight, by worker
    outcomes = [None] * len(wave)
    running = {}  # future -> (index in the wave, the tile's own arcs, its worker or None)
    for index, tile in enumerate(wave):
        threads = {worker: max(1, count) for worker, count in client.nthreads().items()}
        selected = _tile_subnetwork(tile, **test_kwargs)
        if selected is not None:
            members, sub = selected
            key = f"depsi-tile-{tile[0]}-{tile[1]}"
            if threads:
                worker = min(threads, key=lambda w: load.get(w, 0) / threads[w])
                [payload] = client.scatter([sub], workers=[worker], hash=False)
                future = client.submit(_test_subnetwork, payload, workers=[worker],
                                       allow_other_workers=True, pure=False,
                                       key=f"{key}-{payload.key}")
                del payload  # the worker holds it now
            else:
                worker = None
                future = client.submit(_test_subnetwork, sub, pure=False)
            running[future] = (index, members[sub.own], worker)
            load[worker] = load.get(worker, 0) + 1
            del sub
            # the pages the cut read (the arcs' and points' pageable arrays) go again: the
            # driver holds one tile's share of them, not the network's
            runtime.page_out()
        limit = TILES_IN_FLIGHT * max(1, sum(threads.values()))
        while len(running) >= limit or (running and index == len(wave) - 1):
            done = wait(list(running), return_when="FIRST_COMPLETED").done
            for future in done:
                index_done, own, worker = running.pop(future)
                load[worker] -= 1
                outcomes[index_done] = _tile_outcome(own, future.result())
                future.release()
    return outcomes


def _tiles_by_dependency(pool, test, waves: list[np.ndarray], *, neighbours_only: bool):
    """``test(tile)`` of every tile of ``waves`` on ``pool``'s threads, each outcome yielded
    (to be applied) as its tile finishes; a tile starts once every tile it depends on was
    yielded and applied: those of earlier waves next to it (``neighbours_only``, the parity
    waves of :func:`_tile_waves`, whose margins reach only the adjacent tiles), else the tile
    before it. A tile then reads ``arc_ok`` as wave-by-wave testing has it (the tiles of
    earlier waves that could change its arcs have decided, none of later waves that could
    has started), so the outcomes are the waves' whatever the threads; only the order in
    which they come differs, and their arcs are disjoint.

    Examples
    --------
    >>> from concurrent.futures import ThreadPoolExecutor
    >>> waves = _tile_waves(np.array([[0, 0], [0, 1], [2, 0]]), cell=100.0, margin=10.0)
    >>> with ThreadPoolExecutor(2) as pool:
    ...     sorted(_tiles_by_dependency(pool, lambda t: t.tolist(), waves, neighbours_only=True))
    [[0, 0], [0, 1], [2, 0]]
    """
    from concurrent.futures import FIRST_COMPLETED, wait

    tiles = [tile for wave in waves for tile in wave]
    wave_of = [w for w, wave in enumerate(waves) for _ in wave]
    index_of = {tuple(int(v) for v in tile): i for i, tile in enumerate(tiles)}
    dependents: list[list[int]] = [[] for _ in tiles]
    waiting = [0] * len(tiles)
    for i, tile in enumerate(tiles):  # a loop over tiles (a few hundred at 10^7 points)
        if neighbours_only:
            row, column = int(tile[0]), int(tile[1])
            earlier = [index_of[(row + a, column + b)] for a in (-1, 0, 1) for b in (-1, 0, 1)
                       if (row + a, column + b) in index_of]
            earlier = [j for j in earlier if wave_of[j] < wave_of[i]]
        else:
            earlier = [i - 1] if i else []
        for j in earlier:
            dependents[j].append(i)
        waiting[i] = len(earlier)
    running = {pool.submit(test, tiles[i]): i for i in range(len(tiles)) if not waiting[i]}
    while running:
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in sorted(done, key=running.__getitem__):
            i = running.pop(future)
            yield future.result()
            for j in dependents[i]:
                waiting[j] -= 1
                if not waiting[j]:
                    running[pool.submit(test, tiles[j])] = j


def _test_by_tiles(source, target, arc_ok, arc_reason, weights, rhs, n, positions, coherence,
                   sd, critical, max_iterations, *, devices: tuple[Device, ...] = ()):
    """The w-test of a large network, tile by tile: each tile of about :data:`TILE_POINTS`
    points is tested on the sub-network of its points and a margin of
    :data:`TILE_MARGIN` median arc lengths around it, and decides on the arcs whose midpoint
    lies in it. Every factorisation is a tile's, so the cost grows linearly with the number of
    points. The tiles run in the waves of :func:`_tile_waves`, a wave's tiles on
    :func:`~depsi.processing.network.worker_threads` threads at once, each wave seeing the
    arcs the waves before it rejected; the result does not depend on the number of threads.
    (A tile's factorisation and solves are QDLDL's,
    :class:`~depsi.processing.network_solver._LDL`, which releases the GIL: they run on every
    core.) On a distributed scheduler (:func:`~depsi.stm.dask_tools.workers_client`) the
    wave's tiles are tasks on the workers instead (:func:`_tiles_on_workers`): the same
    numbers, and the driver holds no tile's factorisation or temporaries. Given ``devices``
    (CUDA ones), the tiles on this process's threads factorise and solve there
    (:func:`_test_tile`); a cluster's tasks run on their workers' host.
    Returns the updated ``arc_ok``, the number of arcs the tiles rejected, and each arc's
    redundancy number in its own tile (0 where its tile could not be tested)."""
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    # the arcs' and points' pageable arrays leave memory: the tiles read them back a tile's
    # arcs at a time (and let them go after each tile's cut on a cluster)
    runtime.page_out()
    cell = float(np.sqrt(np.prod(np.ptp(positions, axis=0) + 1.0) * TILE_POINTS / n))
    low = positions.min(axis=0)
    tile_of_arc, margin = _arc_tiles(positions, source, target, arc_ok, low, cell)
    # the tiles holding arcs, in row order (by their keys: np.unique over rows is slow at
    # millions of arcs, docs/benchmarks.md, "The network solver's choices")
    used = tile_of_arc[arc_ok]
    tiles = used[np.unique(cell_keys(used), return_index=True)[1]]
    waves = _tile_waves(tiles, cell, margin)
    client = workers_client()
    workers = worker_threads() if client is None else sum(client.nthreads().values())
    rejected = 0
    redundancy = runtime.pageable(len(source), np.float64, zeros=True)  # (a file's, large)
    network = {"low": low, "cell": cell, "margin": margin, "positions": positions,
               "source": source, "target": target, "arc_ok": arc_ok, "weights": weights,
               "rhs": rhs, "coherence": coherence, "sd": sd, "critical": critical,
               "max_iterations": max_iterations, "tile_of_arc": tile_of_arc,
               "by_tile": _arcs_by_tile(tile_of_arc, cell, margin)}

    def apply(outcome) -> None:
        nonlocal rejected
        if outcome is None:
            return
        own, own_redundancy, removed = outcome
        redundancy[own] = own_redundancy
        arc_ok[removed] = False
        arc_reason[removed] = 2
        rejected += removed.size

    if client is None:
        # on this process's threads, each tile as soon as the tiles of earlier waves next to
        # it are done (no barrier between waves; the same decisions as wave by wave)
        with ThreadPoolExecutor(max(1, workers)) as pool:
            test = partial(_test_tile, devices=devices, **network)
            for outcome in _tiles_by_dependency(pool, test, waves,
                                                neighbours_only=2 * margin < cell):
                apply(outcome)
    else:
        for wave in waves:  # a few dozen tiles, each a network of about TILE_POINTS points
            # the wave's tiles share no arc: they read arc_ok while the others run, and their
            # decisions are applied when the whole wave is done
            for outcome in _tiles_on_workers(client, wave, network):
                apply(outcome)
    logger.info("integration: %d arcs rejected by the w-test in %d tiles of %.0f m (%d waves, "
                "%d %s)", rejected, len(tiles), cell, len(waves), workers,
                "threads" if client is None else "worker threads, tiles as tasks")
    return arc_ok, rejected, redundancy


def _spill_right_hand_sides(rhs) -> None:
    """Right-hand sides that can (:meth:`~depsi.processing.integration.ArcRightHandSides
    .spill`) and hold at least :data:`~depsi.stm.runtime.SPILL_BYTES` go to a temporary
    file: the whole network's solve reads them twice in order, and the driver need not hold
    them beside the factor and the point results (0.98 GB at 10^7 points)."""
    spill = getattr(rhs, "spill", None)
    if spill is None or rhs.nbytes < runtime.SPILL_BYTES:
        return
    held = rhs.nbytes
    if spill():
        logger.info("integration: the arcs' right-hand sides (%.2f GB) read from a temporary "
                    "file for the whole network's solve", held / 2**30)


def _test_network(source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions,
                  coherence, sd, critical, max_iterations, *, devices: tuple[Device, ...] = ()):
    """The w-test of the whole network: :func:`_test_arcs` on it, or above :data:`TILE_POINTS`
    points the tiles' test (:func:`_test_by_tiles`) and then one solution of the whole network.
    ``arc_reason`` is updated in place. ``devices``: where the factorisations solve (the whole
    network on the first, the tiles spread over them; none: the host reference). Returns
    ``(arc_ok, point_reason, values, ref, w_stat, iterations, n_removed)``."""
    if n > TILE_POINTS:
        # the tiles decide on every arc; the whole network is solved once, and its
        # w-statistics (with the tiles' redundancy numbers) reported
        arc_ok, n_tested_out, redundancy = _test_by_tiles(
            source, target, arc_ok, arc_reason, weights, rhs, n, positions, coherence, sd,
            critical, max_iterations, devices=devices)
        # the tiles' temporaries (on threads: freed around live arrays, in each thread's
        # heap) back to the system before the whole network is factorised (docs/benchmarks.md,
        # "The network solver's choices")
        release_memory()
        _spill_right_hand_sides(rhs)
        arc_ok, point_reason, values, ref, w_stat, _, iterations, _ = _test_arcs(
            source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions,
            coherence, sd, critical, 0, redundancy=redundancy,
            device=devices[0] if devices else None)
        logger.info("integration: the whole network solved once after the tiles; %d of its "
                    "%d arcs exceed the critical value there (%.2f) and are kept",
                    int((w_stat > critical).sum()), int(arc_ok.sum()), critical)
    else:
        arc_ok, point_reason, values, ref, w_stat, _, iterations, n_tested_out = _test_arcs(
            source, target, arc_ok, arc_reason, weights, rhs, n, reference, positions,
            coherence, sd, critical, max_iterations, device=devices[0] if devices else None)
    return arc_ok, point_reason, values, ref, w_stat, iterations, n_tested_out
