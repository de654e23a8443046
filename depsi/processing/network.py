"""The first-order network: arcs between points, with their double-difference phases.

``form_network`` connects the points of a point STM by Delaunay triangulation or by a redundant
k-nearest-neighbour scheme spread over angular sectors, and returns an arc STM ``(arc, time)``
(docs/design.md, "Architecture" and "Data model"). Everything is vectorised over points and arcs
(KD-tree, array sorts).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Literal

import dask
import dask.array as da
import numpy as np
import xarray as xr
from pydantic import Field
from scipy.spatial import Delaunay, QhullError, cKDTree

from depsi.conventions import wrap_phase
from depsi.kernels.backend import Device, cuda_devices, parse_device, to_device, to_host
from depsi.kernels.neighbours import nearest_neighbours, pairs_within
from depsi.sections import Section
from depsi.stm.schema import STMValidationError, validate

logger = logging.getLogger(__name__)

#: Ground pixel spacing (m) used to turn ``azimuth`` / ``range`` indices into metres when the
#: points carry no projected ``x`` / ``y`` and no ``azimuth_spacing`` / ``range_spacing`` attrs:
#: Sentinel-1 IW, about 14 m in azimuth and 4 m in ground range.
DEFAULT_AZIMUTH_SPACING = 14.0
DEFAULT_RANGE_SPACING = 4.0

#: Points per block of the neighbour query of :func:`redundant_edges`: bounds its
#: (points, neighbours) temporaries (about 5 KB a point at the default 65 neighbours).
EDGE_QUERY_BLOCK = 16384

#: Arcs per chunk of an arc STM.
ARC_CHUNK = 65536

#: Default first-order points on a scene with few cells, and the cell size (m) whose best
#: points are the first-order points on a larger one.
DEFAULT_FIRST_ORDER = 2000
DEFAULT_CELL_SIZE = 150.0

#: Default: distributed scatterers are densified, never first-order points.
DEFAULT_DS_FIRST_ORDER = False

#: Default network: the redundant scheme, whose many closed loops let integration test arcs.
DEFAULT_METHOD: Final = "redundant"
#: Default neighbours per direction sector, and sectors, of the redundant scheme.
DEFAULT_K = 2
DEFAULT_N_SECTORS = 8

_TWO_PI = 2.0 * np.pi


class NetworkConfig(Section):
    """The first-order network: which points carry it, and the arcs between them."""

    first_order: int = Field(
        DEFAULT_FIRST_ORDER, ge=3,
        description="First-order points: this many of lowest amplitude dispersion (all points "
                    "when the STM has no amplitude_dispersion).")
    max_dispersion: float | None = Field(
        None, gt=0, description="Only points with amplitude dispersion at or below this can "
                                "be first order; null: no limit.")
    cell_size: float | None = Field(
        DEFAULT_CELL_SIZE, gt=0,
        description="On a scene with more cells of cell_size x cell_size m holding points than "
                    "first_order, the first-order points are the best point of each such cell "
                    "instead, so arcs stay short against the atmosphere's correlation length "
                    "whatever the scene's size; null: always first_order points.")
    method: Literal["redundant", "delaunay"] = Field(
        DEFAULT_METHOD,
        description="redundant: each point tied to its k nearest neighbours in each of "
                    "n_sectors directions (many loops for arc testing); delaunay: the "
                    "triangulation.")
    k: int = Field(DEFAULT_K, ge=1, description="Neighbours per direction sector (redundant).")
    second_pass_k: int | None = Field(
        1, ge=1, description="Neighbours per direction sector (redundant) of the second pass, "
                             "on phases corrected for the atmosphere: its arcs are reliable "
                             "enough to be tested with fewer loops; null: k.")
    n_sectors: int = Field(DEFAULT_N_SECTORS, ge=1, description="Direction sectors (redundant).")
    max_length: float | None = Field(
        None, gt=0, description="Longest arc kept, metres; null keeps every arc.")
    ds_first_order: bool = Field(
        DEFAULT_DS_FIRST_ORDER,
        description="Distributed scatterers (selection.ds) may be first-order points, ranked "
                    "by their linked phase's standard deviation (linked_phase_std, rad) beside "
                    "the PS' amplitude dispersion (for a PS the two agree: sigma_phase ~ D_A); "
                    "for scenes with too few PS to carry the network. false: DS are densified "
                    "only.")


def point_positions(
    points: xr.Dataset,
    *,
    azimuth_spacing: float | None = None,
    range_spacing: float | None = None,
) -> np.ndarray:
    """Positions of the points in metres, shape ``(space, 2)``.

    Projected ``x`` / ``y`` coordinates are used when present. Otherwise ``azimuth`` and
    ``range`` pixel indices are scaled by the pixel spacing: the argument, else the
    ``azimuth_spacing`` / ``range_spacing`` attribute, else :data:`DEFAULT_AZIMUTH_SPACING` /
    :data:`DEFAULT_RANGE_SPACING`. Every spatial step of the chain (network, atmosphere,
    densification) uses this one convention.

    Examples
    --------
    >>> ds = xr.Dataset(coords={"azimuth": ("space", [0, 1]), "range": ("space", [0, 2])})
    >>> point_positions(ds, azimuth_spacing=10.0, range_spacing=5.0).tolist()
    [[0.0, 0.0], [10.0, 10.0]]
    """
    if "x" in points.coords and "y" in points.coords:
        return np.column_stack([np.asarray(points["x"].values, dtype=np.float64),
                                np.asarray(points["y"].values, dtype=np.float64)])
    for name in ("azimuth", "range"):
        if name not in points.coords and name not in points.data_vars:
            raise STMValidationError(
                f"coordinate {name!r}: expected pixel indices (or projected 'x'/'y') to place "
                f"the points, found coords {sorted(map(str, points.coords))}")
    az_sp = azimuth_spacing or float(points.attrs.get("azimuth_spacing", DEFAULT_AZIMUTH_SPACING))
    rg_sp = range_spacing or float(points.attrs.get("range_spacing", DEFAULT_RANGE_SPACING))
    return np.column_stack([np.asarray(points["azimuth"].values, dtype=np.float64) * az_sp,
                            np.asarray(points["range"].values, dtype=np.float64) * rg_sp])


def cell_keys(cells: np.ndarray) -> np.ndarray:
    """One int64 per row of integer cell indices ``cells`` (n, 2), ordered as the rows are
    lexicographically: ``np.unique`` on these is that of the rows, without the structured copy
    that ``np.unique(axis=0)`` sorts (seconds at 10^6 rows).

    Examples
    --------
    >>> cell_keys(np.array([[3, -1], [2, 5], [3, -1]])).tolist()
    [7, 6, 7]
    """
    cells = np.asarray(cells, dtype=np.int64)
    if not cells.size:
        return np.zeros(len(cells), dtype=np.int64)
    cells = cells - cells.min(axis=0)
    return cells[:, 0] * (int(cells[:, 1].max()) + 1) + cells[:, 1]


def _greedy_by_rank(rank: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Greedy maximal independent set by rank, in rounds of vectorised local-minimum picks.

    Every round selects each undecided point ranked better than all its undecided neighbours
    and suppresses their neighbours. This selects exactly the points the sequential greedy
    (best first, drop neighbours) would, with rounds only as many as the longest chain of
    decreasing rank between neighbours (few for real scenes).
    """
    state = np.zeros(rank.size, np.int8)  # 0 undecided, 1 selected, -1 suppressed
    i, j = pairs[:, 0], pairs[:, 1]
    while True:
        undecided = state == 0
        if not undecided.any():
            return state == 1
        live = undecided[i] & undecided[j]
        i, j = i[live], j[live]
        best_neighbour = np.full(rank.size, np.iinfo(np.int64).max)
        np.minimum.at(best_neighbour, i, rank[j])
        np.minimum.at(best_neighbour, j, rank[i])
        winners = undecided & (rank < best_neighbour)
        state[winners] = 1
        state[i[winners[j]]] = -1
        state[j[winners[i]]] = -1


def search_device(devices: Any = None) -> Device | None:
    """Where the network's neighbour searches run for a step given ``devices``: the first CUDA
    device among them (:func:`~depsi.kernels.backend.cuda_devices`; the network is one
    computation over the whole scene), else ``None``, the k-d tree on the host.

    Examples
    --------
    >>> search_device(["cpu:0", "cpu:1"]) is None
    True
    """
    cuda = cuda_devices(devices)
    return cuda[0] if cuda else None


def _pairs_within(xy: np.ndarray, distance: float, device: Device | str | None) -> np.ndarray:
    """Index pairs of ``xy`` at most ``distance`` apart: the k-d tree's on the host
    (``device`` None), else the grid search's on ``device`` (the same pairs)."""
    if device is None:
        return cKDTree(xy).query_pairs(r=distance, output_type="ndarray")
    return to_host(pairs_within(to_device(xy, parse_device(device)), distance))


def _nearest(positions: np.ndarray, queries: np.ndarray, k: int, bound: float,
             device: Device | str | None, tree: cKDTree | None = None, *, workers: int = -1
             ) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest ``positions`` of each of ``queries`` (``cKDTree.query``'s ``dist``,
    ``idx``): the k-d tree ``tree`` on the host (``device`` None; its query on ``workers``
    threads), else the grid search on ``device`` (the same neighbours; equal distances by
    index)."""
    if device is None:
        tree = cKDTree(positions) if tree is None else tree
        dist, idx = tree.query(queries, k=k, distance_upper_bound=bound, workers=workers)
        return dist.reshape(len(queries), k), idx.reshape(len(queries), k)
    device = parse_device(device)
    dist, idx = nearest_neighbours(to_device(positions, device), to_device(queries, device), k,
                                   upper_bound=bound)
    return to_host(dist), to_host(idx)


def _thinned(positions: np.ndarray, ranked: np.ndarray, min_distance: float,
             device: Device | str | None = None) -> np.ndarray:
    """``ranked`` (indices, best first) less each point closer than ``min_distance`` to a better
    one kept: the sequential greedy, from a neighbour list (a KD-tree's, or the grid search's
    on ``device``; N log N, no distance matrix) in vectorised passes."""
    xy = positions[ranked]
    pairs = _pairs_within(xy, min_distance, device)
    if pairs.size:
        distance = np.hypot(*(xy[pairs[:, 0]] - xy[pairs[:, 1]]).T)
        pairs = pairs[distance < min_distance]
    return ranked[_greedy_by_rank(np.arange(ranked.size), pairs.reshape(-1, 2))]


def first_order_indices(
    points: xr.Dataset,
    *,
    first_order: int = DEFAULT_FIRST_ORDER,
    max_dispersion: float | None = None,
    cell_size: float | None = DEFAULT_CELL_SIZE,
    min_distance: float | None = None,
    ds_first_order: bool = DEFAULT_DS_FIRST_ORDER,
    device: Device | str | None = None,
) -> np.ndarray:
    """Indices (into ``points.space``, ascending) of the first-order points, by amplitude
    dispersion (lowest first).

    Among the points at or below ``max_dispersion``: the best ``first_order`` points; or, when
    more than ``first_order`` cells of ``cell_size`` m hold such points (a scene larger than
    ``first_order x cell_size^2``), the best point of every cell, so that the density of the
    network, and the length of its arcs, do not depend on the scene's size. Points with a NaN
    dispersion are never chosen; without ``amplitude_dispersion`` the points rank in space
    order. :class:`NetworkConfig` holds the chain's values of these parameters.

    Parameters
    ----------
    points
        Point STM with ``amplitude_dispersion`` over ``space`` and positions
        (:func:`point_positions`).
    first_order
        Points chosen on a scene with at most this many cells (see ``cell_size``).
    max_dispersion
        Only points at or below this dispersion are candidates; ``None``: no limit.
    cell_size
        Cell size, m; ``None``: always the best ``first_order`` points.
    min_distance
        Candidates closer than this (m) to a better candidate are dropped first, best first
        (the greedy "take the best, drop its neighbours"); ``None``: no minimum. With
        ``cell_size=None`` and a large ``first_order``: every point at least this far apart.
    ds_first_order
        Distributed scatterers (points with no amplitude dispersion and a finite
        ``linked_phase_std``, :func:`~depsi.processing.scatterers.ds_selection`) rank by that
        standard deviation (rad) among the PS' dispersions: a PS's phase noise has the
        standard deviation ``D_A`` for small ``D_A`` (Ferretti, Prati and Rocca 2001, IEEE
        TGRS 39(1), eq. 13), so the two rank on one scale. ``False``: DS are never chosen.
    device
        Where ``min_distance``'s neighbour pairs are found: ``None`` (default) a k-d tree on
        the host; a device (``"cuda:0"``; ``"cpu"`` runs the same code on NumPy) the grid
        search of :mod:`depsi.kernels.neighbours` there, which finds the same pairs.

    Examples
    --------
    >>> ds = xr.Dataset({"amplitude_dispersion": ("space", [0.3, 0.1, 0.2, 0.4, 0.5])},
    ...                 coords={"azimuth": ("space", [0, 1, 2, 3, 5]), "range": ("space", [0] * 5)})
    >>> first_order_indices(ds, first_order=3).tolist()
    [0, 1, 2]
    >>> first_order_indices(ds, min_distance=20.0).tolist()  # 14 m apart in azimuth
    [1, 3, 4]
    """
    n = points.sizes["space"]
    if "amplitude_dispersion" in points:
        nad = np.asarray(points["amplitude_dispersion"].values, dtype=np.float64)
    else:
        logger.info("no amplitude_dispersion: first-order points are taken in space order")
        nad = np.zeros(n)
    if ds_first_order and "linked_phase_std" in points:
        phase_std = np.asarray(points["linked_phase_std"].values, dtype=np.float64)
        ds = ~np.isfinite(nad) & np.isfinite(phase_std)
        nad = np.where(ds, phase_std, nad)
        logger.info("first order: %d distributed scatterers ranked by their linked phase's "
                    "standard deviation among the PS", int(ds.sum()))
    if "phase_std" in points:
        # selected on the phase (multilooked stacks): their phase noise ranks them, on the
        # scale of a PS's amplitude dispersion (D_A ~ phase std, as for the DS above)
        phase_std = np.asarray(points["phase_std"].values, dtype=np.float64)
        nad = np.where(np.isfinite(phase_std), phase_std, nad)
        logger.info("first order: points ranked by the phase noise of their selection")
    eligible = np.isfinite(nad)
    if max_dispersion is not None:
        eligible &= nad <= max_dispersion
    candidates = np.flatnonzero(eligible)
    # stable sort: equal dispersions (or none given) keep the order of space
    ranked = candidates[np.argsort(nad[candidates], kind="stable")]
    if min_distance is not None:
        if not np.isfinite(min_distance) or min_distance <= 0:
            raise ValueError(f"min_distance: expected a positive distance in metres, found "
                             f"{min_distance!r}")
        ranked = _thinned(point_positions(points), ranked, min_distance, device)
    chosen = np.sort(ranked[:first_order])
    if cell_size is not None and len(ranked) > first_order:
        cells = np.floor(point_positions(points)[ranked] / cell_size).astype(np.int64)
        # the first of each cell in ranked order, the best
        _, first_in_cell = np.unique(cell_keys(cells), return_index=True)
        if len(first_in_cell) > first_order:
            chosen = np.sort(ranked[first_in_cell])
            logger.info("first order: the best point of each of %d cells of %.0f m "
                        "(more than first_order=%d)", len(chosen), cell_size, first_order)
    if len(chosen) < 3:
        raise ValueError(f"network: expected at least 3 first-order points, found "
                         f"{len(chosen)} (first_order={first_order}, "
                         f"max_dispersion={max_dispersion})")
    return chosen


def _unique_edges(source: np.ndarray, target: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Undirected, deduplicated edges with ``source < target`` and no self-loops."""
    lo = np.minimum(source, target).astype(np.int64)
    hi = np.maximum(source, target).astype(np.int64)
    keep = lo != hi
    key = np.sort(lo[keep] * n + hi[keep])  # a sort: NumPy's hashed unique is 8x slower here
    key = key[np.r_[True, key[1:] != key[:-1]]] if key.size else key
    return key // n, key % n


def delaunay_edges(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique edges of the Delaunay triangulation of ``positions`` ``(N, 2)``.

    Examples
    --------
    >>> s, t = delaunay_edges(np.array([[0., 0.], [1., 0.], [0., 1.], [1., 1.]]))
    >>> len(s)
    5
    """
    n = len(positions)
    try:
        tri = Delaunay(positions)
    except QhullError as err:
        raise ValueError(
            f"points: expected at least 3 points not all on one line for a Delaunay network, "
            f"found {n} point(s) ({err.__class__.__name__})") from err
    simplices = tri.simplices
    src = simplices[:, [0, 1, 2]].ravel()
    tgt = simplices[:, [1, 2, 0]].ravel()
    return _unique_edges(src, tgt, n)


def redundant_edges(
    positions: np.ndarray,
    *,
    k: int = DEFAULT_K,
    n_sectors: int = DEFAULT_N_SECTORS,
    max_length: float | None = None,
    device: Device | str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Edges to the ``k`` nearest neighbours in each of ``n_sectors`` angular sectors.

    One KD-tree query gives every point its nearest candidates; a stable sort of each point's
    candidates by sector ranks them within each sector, so no Python loop runs over points.
    ``device`` (``None``: the KD-tree on the host) runs the query as the grid search of
    :mod:`depsi.kernels.neighbours` on that device instead: the same candidates (equal
    distances ordered by index), so the same edges.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> s, t = redundant_edges(rng.uniform(0, 100, (50, 2)), k=1, n_sectors=4)
    >>> bool((s < t).all())
    True
    """
    n = len(positions)
    if n < 2:
        raise ValueError(f"points: expected at least 2 points for a network, found {n}")
    n_query = int(min(n, 1 + max(4 * k * n_sectors, 16)))
    tree = cKDTree(positions) if device is None else None
    bound = np.inf if max_length is None else float(max_length)
    starts = range(0, n, EDGE_QUERY_BLOCK)

    def block_edges(start: int) -> tuple[np.ndarray, np.ndarray]:
        """The chosen edges of the points ``start:start + EDGE_QUERY_BLOCK``."""
        block = np.arange(start, min(start + EDGE_QUERY_BLOCK, n))
        dist, idx = _nearest(positions, positions[block], n_query, bound, device, tree,
                             workers=1 if threaded else -1)
        dist, idx = dist[:, 1:], idx[:, 1:]  # drop the point itself
        valid = np.isfinite(dist) & (idx < n)
        nbrs = np.where(valid, idx, block[:, None])
        delta = positions[nbrs] - positions[block][:, None, :]
        angle = np.mod(np.arctan2(delta[..., 1], delta[..., 0]), _TWO_PI)
        sector = np.minimum((angle / (_TWO_PI / n_sectors)).astype(np.int8), n_sectors - 1)
        sector[~valid] = n_sectors  # after every sector
        # each point's candidates by sector, nearest first within one (a stable sort per row)
        order = np.argsort(sector, axis=1, kind="stable")
        by_sector = np.take_along_axis(sector, order, axis=1)
        first = np.empty_like(by_sector, dtype=bool)
        first[:, 0] = True
        np.not_equal(by_sector[:, 1:], by_sector[:, :-1], out=first[:, 1:])
        column = np.arange(by_sector.shape[1])
        start_of_run = np.maximum.accumulate(np.where(first, column, 0), axis=1)
        chosen = (column - start_of_run < k) & (by_sector < n_sectors)
        rows, slots = np.nonzero(chosen)
        return block[rows], nbrs[rows, order[rows, slots]]

    # blocks of points bound the (points, n_query) temporaries whatever the network's size;
    # on the host they run on this process's threads (the tree's query one thread each, the
    # blocks' NumPy work releasing the GIL), in order: the same edges as one after another
    threaded = device is None and len(starts) > 1
    edges = on_threads(block_edges, starts) if threaded else [block_edges(s) for s in starts]
    sources = [edge[0] for edge in edges]
    targets = [edge[1] for edge in edges]
    return _unique_edges(np.concatenate(sources), np.concatenate(targets), n)


def worker_threads() -> int:
    """Threads for the processing steps' own thread pools (selection's stream engine, forming
    arcs, integration's tiles): Dask's ``num_workers`` when configured (as
    :func:`depsi.cluster.scheduler` does), else the cores this process may run on."""
    configured = dask.config.get("num_workers", None)
    if configured:
        return int(configured)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def on_threads(work, items) -> list:
    """``work(item)`` for each of ``items`` on this process's threads
    (:func:`worker_threads`), the results in the items' order; in this thread when there is at
    most one. For blocks whose work releases the GIL (NumPy, BLAS at one thread as the chain's
    steps set it, SciPy's KD-tree queries) and writes only its own rows.

    Examples
    --------
    >>> on_threads(lambda start: start * 2, range(0, 30, 10))
    [0, 20, 40]
    """
    items = list(items)
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=worker_threads()) as pool:
        return list(pool.map(work, items))


def _arc_values(values, source, target, name):
    """The arcs' wrapped phase difference (``phase``) or mean (``h2ph``) of two points."""
    if name == "phase":
        return wrap_phase(values[target] - values[source])
    return 0.5 * (values[target] + values[source])


def arcs_from_edges(points: xr.Dataset, source: np.ndarray, target: np.ndarray,
                    positions: np.ndarray | None = None) -> xr.Dataset:
    """Arc STM for the given ``source`` → ``target`` index pairs into ``points.space``.

    ``phase`` = wrap(phase[target] - phase[source]); ``h2ph`` = the mean of the two points'
    h2ph, which is the factor that multiplies the height-error *difference* in the arc's phase
    (``m2ph * (d_t + h_t H_t - d_s - h_s H_s) ~ m2ph * (dd + mean(h) dH)``; the difference of
    h2ph is near zero for neighbouring points and would make heights unobservable);
    ``length`` in metres. Lazy when the points are.
    """
    if positions is None:
        positions = point_positions(points)
    source = np.asarray(source, dtype=np.int64)
    target = np.asarray(target, dtype=np.int64)
    data_vars: dict[str, tuple[Any, ...]] = {}
    for name in ("phase", "h2ph"):
        var = points[name]
        if "space" not in var.dims:
            raise STMValidationError(f"variable {name!r}: expected dims including 'space', "
                                     f"found {var.dims}")
        var = var.transpose("space", ...)
        arr = var.data
        if isinstance(arr, da.Array):
            arr = arr.rechunk({0: -1})
            diff = _arc_values(arr, source, target, name).rechunk({0: ARC_CHUNK}).astype(
                np.float32)
        else:
            # in memory: block by block into the result, no (arcs, epochs) temporaries; the
            # blocks on every core (the gathers and arithmetic release the GIL)
            arr = np.asarray(arr)
            diff = np.empty((len(source),) + arr.shape[1:], np.float32)

            def fill(start, arr=arr, diff=diff, name=name):
                rows = slice(start, start + ARC_CHUNK)
                diff[rows] = _arc_values(arr, source[rows], target[rows], name)

            on_threads(fill, range(0, len(source), ARC_CHUNK))
        data_vars[name] = (("arc",) + var.dims[1:], diff)
    length = np.hypot(*(positions[target] - positions[source]).T).astype(np.float32)
    data_vars["length"] = ("arc", length)
    coords = {"source": ("arc", source), "target": ("arc", target), "time": points["time"]}
    arcs = xr.Dataset(data_vars, coords=coords, attrs=dict(points.attrs))
    arcs.attrs["n_points"] = int(points.sizes["space"])
    return arcs


def network_edges(
    positions: np.ndarray,
    *,
    method: Literal["delaunay", "redundant"] = DEFAULT_METHOD,
    k: int = DEFAULT_K,
    n_sectors: int = DEFAULT_N_SECTORS,
    max_length: float | None = None,
    device: Device | str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Arcs (``source < target`` index pairs) among points at ``positions`` (m, ``(n, 2)``).

    See :func:`form_network` for ``method``, ``k``, ``n_sectors``, ``max_length`` and
    ``device``.

    Examples
    --------
    >>> corners = np.array([[0.0, 0], [10, 0], [0, 10], [10, 10]])
    >>> len(network_edges(corners, method="delaunay")[0])
    5
    >>> len(network_edges(corners)[0])  # redundant: every pair of the four
    6
    """
    n = len(positions)
    if method == "delaunay":
        if n < 3:
            raise ValueError(f"points: expected at least 3 points for a Delaunay network, "
                             f"found {n}")
        source, target = delaunay_edges(positions)
        if max_length is not None:
            length = np.hypot(*(positions[target] - positions[source]).T)
            keep = length <= max_length
            source, target = source[keep], target[keep]
    elif method == "redundant":
        if k < 1 or n_sectors < 1:
            raise ValueError(f"k, n_sectors: expected >= 1, found k={k}, n_sectors={n_sectors}")
        source, target = redundant_edges(positions, k=k, n_sectors=n_sectors,
                                         max_length=max_length, device=device)
    else:
        raise ValueError(f"method: expected 'delaunay' or 'redundant', found {method!r}")
    if len(source) == 0:
        raise ValueError(f"network: no arcs formed among {n} points (max_length={max_length})")
    logger.info("network (%s): %d arcs among %d points", method, len(source), n)
    return source, target


def form_network(
    points: xr.Dataset,
    *,
    method: Literal["delaunay", "redundant"] = DEFAULT_METHOD,
    k: int = DEFAULT_K,
    n_sectors: int = DEFAULT_N_SECTORS,
    max_length: float | None = None,
    azimuth_spacing: float | None = None,
    range_spacing: float | None = None,
    device: Device | str | None = None,
) -> xr.Dataset:
    """Connect the points by arcs and form their double-difference phases.

    Parameters
    ----------
    points
        Point STM ``(space, time)`` with wrapped single-mother interferometric ``phase``,
        ``h2ph``, and ``azimuth``/``range`` (or projected ``x``/``y``) coordinates.
    method
        ``"delaunay"``: the Delaunay triangulation (about 3 arcs per point).
        ``"redundant"`` (default, :data:`DEFAULT_METHOD`): each point tied to its ``k``
        nearest neighbours in each of ``n_sectors`` angular sectors (up to ``k * n_sectors``
        arcs per point, fewer after removing duplicates), which gives many closed loops for
        arc testing.
    k, n_sectors
        See ``method="redundant"``; defaults :data:`DEFAULT_K`, :data:`DEFAULT_N_SECTORS`.
    max_length
        Longest arc kept, metres (``None``: no limit). Long arcs carry more atmosphere.
    azimuth_spacing, range_spacing
        Pixel spacing in metres when the points have no ``x``/``y``; see
        :func:`point_positions`.
    device
        Where the redundant scheme's neighbour search runs: ``None`` (default) a KD-tree on
        the host; a device (``"cuda:0"``; ``"cpu"`` runs the same code on NumPy) the grid
        search of :mod:`depsi.kernels.neighbours`, which finds the same neighbours. The
        Delaunay triangulation always runs on the host (Qhull).

    Returns
    -------
    xarray.Dataset
        Arc STM ``(arc, time)``: coords ``source``, ``target`` (int64 indices into ``space``,
        ``source < target``), ``time``; variables ``phase`` (wrapped
        ``phase[target] - phase[source]``), ``h2ph`` (mean of the two points, the factor of the
        height-error difference), ``length`` (m). The attrs of
        ``points`` are kept.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> pts = xr.Dataset(
    ...     {"phase": (("space", "time"), rng.uniform(-3, 3, (20, 4)).astype("f4")),
    ...      "h2ph": (("space", "time"), np.zeros((20, 4), "f4"))},
    ...     coords={"azimuth": ("space", rng.integers(0, 100, 20)),
    ...             "range": ("space", rng.integers(0, 100, 20)),
    ...             "time": np.arange(4)}, attrs={"wavelength": 0.0555})
    >>> arcs = form_network(pts)
    >>> arcs.phase.dims
    ('arc', 'time')
    """
    validate(points, "points", require=("phase", "h2ph"))
    positions = point_positions(points, azimuth_spacing=azimuth_spacing,
                                range_spacing=range_spacing)
    source, target = network_edges(positions, method=method, k=k, n_sectors=n_sectors,
                                   max_length=max_length, device=device)
    arcs = arcs_from_edges(points, source, target, positions)
    arcs.attrs["network_method"] = method
    return validate(arcs, "arcs")
