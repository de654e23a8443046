"""Exact nearest neighbours and pairs within a distance on a uniform grid of cells, written once
over the array namespace, so that the same code runs on NumPy and on a CUDA device (CuPy has no
k-d tree).

The points are sorted by the key ``row * columns + column`` of their cell, so the points of the
cells ``column_lo..column_hi`` of one row are one contiguous run of the sorted points: a
query's window of ``(2 r + 1)`` rows of cells is ``2 r + 1`` runs, found by a search in the
table of cell starts, and every candidate of every query is gathered in one flat array (no loop
over points). A query is settled when its ``k``-th candidate is nearer than the window's border
(no point outside can be nearer) or the window covers every cell; the others are searched
again with the window's half-width doubled, so a few passes settle even isolated points.

Results are those of :meth:`scipy.spatial.cKDTree.query` (``dist``, ``idx``; ``inf`` and
``n`` where fewer than ``k`` points are within ``upper_bound``), nearest first and equal
distances by ascending index (the k-d tree orders equal distances as its traversal meets them).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from depsi.kernels.backend import array_namespace

#: Points per cell of the grid of a k-nearest search, per neighbour asked for: at ``k / 2``
#: points a cell, the 3 x 3 window around a point holds about ``4.5 k`` points, which settles
#: nearly every query of a uniform scene in the first pass.
POINTS_PER_CELL_PER_NEIGHBOUR = 0.5
#: Candidates (query, point) gathered at once: bounds a pass's temporaries (about 40 bytes
#: each) whatever the number of queries.
CANDIDATES_PER_BLOCK = 1 << 22
#: Margin of the settling test, in cells: a point's cell from ``floor`` may be one rounding
#: off its position.
_MARGIN = 1e-9


@dataclass(frozen=True)
class _Grid:
    """Points sorted by cell: ``order`` (sorted position -> point), ``starts`` (cell key ->
    first sorted position, one past the last cell at the end), the cells' origin and size."""

    positions: Any
    order: Any
    starts: Any
    low: tuple[float, float]
    cell: float
    columns: int
    rows: int


def _cell_of(xp: ModuleType, positions: Any, grid_low: tuple[float, float], cell: float
             ) -> tuple[Any, Any]:
    """Column and row (int64, unclipped) of the cells holding ``positions`` (n, 2)."""
    column = xp.floor((positions[:, 0] - grid_low[0]) / cell).astype(xp.int64)
    row = xp.floor((positions[:, 1] - grid_low[1]) / cell).astype(xp.int64)
    return column, row


def _build_grid(positions: Any, points_per_cell: float, min_cell: float = 0.0) -> _Grid:
    """The grid of about ``points_per_cell`` points a cell over ``positions`` (n, 2), cells at
    least ``min_cell`` wide; at most about ``n / points_per_cell`` cells whatever the layout."""
    xp = array_namespace(positions)
    n = len(positions)
    low = positions.min(axis=0)
    extent = positions.max(axis=0) - low
    ex, ey = float(extent[0]), float(extent[1])
    per = max(float(points_per_cell), 1.0)
    # square cells of `per` points on the bounding box's area; points on a line (no area)
    # get cells of `per` points along it
    cell = max(np.sqrt(per * ex * ey / n), max(ex, ey) * per / n, float(min_cell), 1e-9)
    columns, rows = int(ex // cell) + 1, int(ey // cell) + 1
    grid_low = (float(low[0]), float(low[1]))
    column, row = _cell_of(xp, positions, grid_low, cell)
    key = xp.clip(row, 0, rows - 1) * columns + xp.clip(column, 0, columns - 1)
    order = xp.argsort(key, kind="stable")
    starts = xp.searchsorted(key[order], xp.arange(rows * columns + 1), side="left")
    return _Grid(positions, order, starts, grid_low, cell, columns, rows)


def _window(grid: _Grid, queries: Any, half: int) -> tuple[Any, Any, Any, Any]:
    """The first and last column and row (each (q,), within the grid) of the window of
    half-width ``half`` cells around each query's cell, that cell brought into the grid first
    (a query outside the points)."""
    xp = array_namespace(queries)
    column, row = _cell_of(xp, queries, grid.low, grid.cell)
    column = xp.clip(column, 0, grid.columns - 1)
    row = xp.clip(row, 0, grid.rows - 1)
    return (xp.clip(column - half, 0, grid.columns - 1), xp.clip(column + half, 0,
                                                                 grid.columns - 1),
            xp.clip(row - half, 0, grid.rows - 1), xp.clip(row + half, 0, grid.rows - 1))


def _window_candidates(grid: _Grid, queries: Any, half: int) -> tuple[Any, Any]:
    """Every (query, point) pair whose point lies in the window of :func:`_window`: the
    query's row in ``queries`` and the point's index, flat."""
    xp = array_namespace(queries)
    first, last, top, bottom = _window(grid, queries, half)
    span = min(2 * half + 1, grid.rows)
    rows = top[:, None] + xp.arange(span)[None, :]                            # (q, span)
    inside = rows <= bottom[:, None]
    base = xp.minimum(rows, grid.rows - 1) * grid.columns
    lo = grid.starts[base + first[:, None]]
    hi = grid.starts[base + last[:, None] + 1]
    lengths = xp.where(inside, hi - lo, 0).ravel()
    ends = xp.cumsum(lengths)
    total = int(ends[-1]) if lengths.size else 0
    flat = xp.arange(total)
    segment = xp.searchsorted(ends, flat, side="right")
    sorted_position = lo.ravel()[segment] + flat - (ends[segment] - lengths[segment])
    return segment // span, grid.order[sorted_position]


def _reach(grid: _Grid, queries: Any, half: int) -> Any:
    """How near each query a point outside its window can be at least: its distance to the
    nearest side of the window that has cells beyond it (``inf`` where the window holds every
    cell), less a margin for the cells' rounding."""
    xp = array_namespace(queries)
    first, last, top, bottom = _window(grid, queries, half)
    x, y = queries[:, 0] - grid.low[0], queries[:, 1] - grid.low[1]
    sides = [xp.where(first > 0, x - first * grid.cell, xp.inf),
             xp.where(last < grid.columns - 1, (last + 1) * grid.cell - x, xp.inf),
             xp.where(top > 0, y - top * grid.cell, xp.inf),
             xp.where(bottom < grid.rows - 1, (bottom + 1) * grid.cell - y, xp.inf)]
    reach = xp.minimum(xp.minimum(sides[0], sides[1]), xp.minimum(sides[2], sides[3]))
    return reach - _MARGIN * grid.cell


def _distances(points: Any, queries: Any, query: Any, point: Any) -> Any:
    """Euclidean distances of flat (query, point) pairs, summed as the k-d tree sums them."""
    dx = points[point, 0] - queries[query, 0]
    dy = points[point, 1] - queries[query, 1]
    return (dx * dx + dy * dy) ** 0.5


def _nearest_block(grid: _Grid, queries: Any, k: int, upper_bound: float, half: int
                   ) -> tuple[Any, Any, Any]:
    """The ``k`` nearest of ``queries`` within the window of half-width ``half`` cells:
    distances, indices (``inf``, ``n`` where fewer) and whether each query is settled."""
    xp = array_namespace(queries)
    n, count = len(grid.positions), len(queries)
    query, point = _window_candidates(grid, queries, half)
    distance = _distances(grid.positions, queries, query, point)
    near = distance < upper_bound
    query, point, distance = query[near], point[near], distance[near]
    by = xp.lexsort(xp.stack([point.astype(xp.float64), distance, query.astype(xp.float64)]))
    query, point, distance = query[by], point[by], distance[by]
    rank = xp.arange(query.size) - xp.searchsorted(query, xp.arange(count), side="left")[query]
    kept = rank < k
    dist = xp.full((count, k), xp.inf)
    idx = xp.full((count, k), n, dtype=xp.int64)
    dist[query[kept], rank[kept]] = distance[kept]
    idx[query[kept], rank[kept]] = point[kept]
    reach = _reach(grid, queries, half)  # no point outside the window is nearer
    settled = xp.isinf(reach) | (dist[:, -1] < reach) | (upper_bound <= reach)
    return dist, idx, settled


def nearest_neighbours(points: Any, queries: Any, k: int, *,
                       upper_bound: float = np.inf) -> tuple[Any, Any]:
    """The ``k`` nearest of ``points`` (n, 2) to each of ``queries`` (q, 2), on the arrays'
    device: ``(dist, idx)`` as :meth:`scipy.spatial.cKDTree.query` gives them (see the module's
    note on equal distances).

    Parameters
    ----------
    points, queries
        Positions (m), float64, NumPy or CuPy (both in one namespace).
    k
        Neighbours per query, at least 1; more than ``n`` leaves the extra slots empty.
    upper_bound
        Only points nearer than this; empty slots get distance ``inf`` and index ``n``.

    Examples
    --------
    >>> points = np.array([[0.0, 0.0], [1.0, 0.0], [5.0, 0.0]])
    >>> dist, idx = nearest_neighbours(points, np.array([[0.9, 0.0]]), 2)
    >>> idx.tolist(), dist.round(3).tolist()
    ([[1, 0]], [[0.1, 0.9]])
    """
    xp = array_namespace(points, queries)
    if k < 1:
        raise ValueError(f"k: expected at least 1 neighbour, found {k}")
    n, count = len(points), len(queries)
    dist = xp.full((count, k), xp.inf)
    idx = xp.full((count, k), n, dtype=xp.int64)
    if n == 0 or count == 0:
        return dist, idx
    per_cell = max(POINTS_PER_CELL_PER_NEIGHBOUR * min(k, n), 1.0)
    grid = _build_grid(points, per_cell)
    pending = xp.arange(count)
    half = 1
    while pending.size:
        # a query's candidates: at most every point, else about its window's cells' points
        window = 2 * half + 1
        per_query = min(float(n), window * window * per_cell) + window
        block = max(1, int(CANDIDATES_PER_BLOCK // per_query))
        still = []
        for start in range(0, int(pending.size), block):
            rows = pending[start:start + block]
            found, which, settled = _nearest_block(grid, queries[rows], k, upper_bound, half)
            done = rows[settled]
            dist[done], idx[done] = found[settled], which[settled]
            still.append(rows[~settled])
        pending = xp.concatenate(still)
        # a window 4x as large: isolated queries settle in a few passes, the last one with
        # the whole grid
        half = min(2 * half, max(grid.rows, grid.columns))
    return dist, idx


def pairs_within(points: Any, max_distance: float) -> Any:
    """Index pairs ``(i, j)``, ``i < j``, of ``points`` (n, 2) at most ``max_distance`` apart
    (as :meth:`scipy.spatial.cKDTree.query_pairs` with ``output_type="ndarray"``), sorted, on
    the arrays' device.

    Examples
    --------
    >>> pairs_within(np.array([[0.0, 0.0], [1.0, 0.0], [5.0, 0.0]]), 2.0).tolist()
    [[0, 1]]
    """
    xp = array_namespace(points)
    n = len(points)
    if n < 2:
        return xp.zeros((0, 2), dtype=xp.int64)
    # cells at least max_distance wide: the 3 x 3 window around a point holds its partners
    grid = _build_grid(points, 4.0, min_cell=float(max_distance))
    mean_per_cell = n / (grid.rows * grid.columns)
    block = max(1, int(CANDIDATES_PER_BLOCK // (9 * max(mean_per_cell, 1.0))))
    found = []
    for start in range(0, n, block):
        rows = xp.arange(start, min(start + block, n))
        query, point = _window_candidates(grid, points[rows], 1)
        query = rows[query]
        later = point > query
        query, point = query[later], point[later]
        near = _distances(points, points, query, point) <= max_distance
        found.append(xp.stack([query[near], point[near]], axis=1))
    pairs = xp.concatenate(found)
    return pairs[xp.lexsort(xp.stack([pairs[:, 1], pairs[:, 0]]))]
