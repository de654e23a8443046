"""Polygons for the ``.stm`` accessor: reading them (shapely, GeoDataFrame, vector file) and the
vectorised point-in-polygon test shared by ``enrich_from_polygon`` and ``subset(method="polygon")``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import shapely

from depsi.errors import BadInputError
from depsi.stm.schema import STMKeyError

logger = logging.getLogger(__name__)

#: Average number of points per grid cell of the polygon candidate search.
_POINTS_PER_CELL = 8
#: Upper bound on the grid cells along one axis of the candidate search.
_MAX_CELLS_PER_AXIS = 4096
_POLYGON_TYPE_IDS = (3, 6)  # shapely type ids of Polygon and MultiPolygon


class UnsupportedPolygonsError(BadInputError, TypeError, NotImplementedError):
    """Polygons of a type that is not accepted; catchable as ``TypeError`` and, as in
    stmtools, as ``NotImplementedError``."""


@dataclass(frozen=True)
class _Polygons:
    """Prepared polygons, their STRtree, and the attribute fields to copy (row i = polygon i)."""

    geometries: np.ndarray
    tree: shapely.STRtree
    typical_size: float
    table: pd.DataFrame
    token: str


def _import_geopandas():
    try:
        import geopandas
    except ImportError as err:  # pragma: no cover - geopandas is in the "geo" extra
        raise ImportError(
            "reading polygons from a file or GeoDataFrame needs geopandas: "
            "pip install 'depsi[geo]'"
        ) from err
    return geopandas


def _geopandas_if_loaded():
    """geopandas when already imported (a GeoDataFrame can exist only then), else None."""
    return sys.modules.get("geopandas")


def _read_vector_file(path: Path):
    gpd = _import_geopandas()
    if not path.exists():
        raise FileNotFoundError(f"polygon file {str(path)!r} does not exist")
    try:
        return gpd.read_file(path)
    except Exception as err:
        raise ValueError(
            f"polygon file {str(path)!r}: expected a vector file readable by GDAL/pyogrio "
            f"(GeoPackage, Shapefile, GeoJSON, ...), found an error: {err}"
        ) from err


def _polygons_frame(polygons: Any, fields: list[str],
                    points_crs: Any) -> tuple[np.ndarray, pd.DataFrame]:
    """Geometries (object array) and a table of ``fields`` from any accepted polygon input."""
    if isinstance(polygons, (str, os.PathLike)):
        polygons = _read_vector_file(Path(polygons))
    if isinstance(polygons, shapely.Geometry):
        polygons = [polygons]
    frame_type = type(polygons).__name__
    gpd = _geopandas_if_loaded()
    if gpd is not None and isinstance(polygons, (gpd.GeoDataFrame, gpd.GeoSeries)):
        if points_crs is not None and polygons.crs is not None and polygons.crs != points_crs:
            logger.info("reprojecting polygons from %s to %s", polygons.crs, points_crs)
            polygons = polygons.to_crs(points_crs)
        if isinstance(polygons, gpd.GeoSeries):
            polygons = polygons.to_frame("geometry").set_geometry("geometry")
        missing = [f for f in fields if f not in polygons.columns]
        if missing:
            available = [c for c in polygons.columns if c != polygons.geometry.name]
            raise STMKeyError(
                f"polygon field(s) {missing}: expected among the polygons' fields, "
                f"found fields {available}"
            )
        geometries = np.asarray(polygons.geometry.values, dtype=object)
        table = pd.DataFrame({f: polygons[f].to_numpy() for f in fields})
        return geometries, table
    try:
        geometries = np.asarray(list(polygons), dtype=object)
    except TypeError as err:
        raise UnsupportedPolygonsError(
            "polygons: expected shapely geometries, a GeoDataFrame or a vector file path, "
            f"found {frame_type}"
        ) from err
    if fields:
        raise ValueError(
            f"polygon field(s) {fields}: shapely geometries carry no fields; "
            "pass a GeoDataFrame or a vector file to enrich from"
        )
    return geometries, pd.DataFrame(index=pd.RangeIndex(geometries.size))


def _load_polygons(polygons: Any, fields: list[str], points_crs: Any = None) -> _Polygons:
    geometries, table = _polygons_frame(polygons, fields, points_crs)
    if geometries.ndim != 1:
        geometries = geometries.ravel()
    missing = shapely.is_missing(geometries)
    not_geometry = ~missing & ~shapely.is_geometry(geometries)
    if not_geometry.any():
        i = int(np.argmax(not_geometry))
        raise TypeError(
            f"polygons: expected shapely geometries, found {type(geometries[i]).__name__} "
            f"at position {i}"
        )
    type_ids = shapely.get_type_id(geometries)
    bad = ~missing & ~np.isin(type_ids, _POLYGON_TYPE_IDS) & ~shapely.is_empty(geometries)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(
            f"polygons: expected Polygon or MultiPolygon geometries, found "
            f"{geometries[i].geom_type} at position {i}"
        )
    shapely.prepare(geometries)  # a cache on the geometry objects; their shape is untouched
    bounds = shapely.bounds(geometries)
    sides = np.maximum(bounds[:, 2] - bounds[:, 0], bounds[:, 3] - bounds[:, 1])
    sides = sides[np.isfinite(sides) & (sides > 0)]
    typical = float(np.median(sides)) if sides.size else np.inf
    token = hashlib.sha1(b"".join(
        b"" if w is None else w for w in shapely.to_wkb(geometries))).hexdigest()
    return _Polygons(geometries, shapely.STRtree(geometries), typical, table, token)


def _cell_size(xs: np.ndarray, bbox: tuple[float, float, float, float], typical: float) -> float:
    """Grid cell side: about ``_POINTS_PER_CELL`` points per cell, no larger than a polygon."""
    width, height = bbox[2] - bbox[0], bbox[3] - bbox[1]
    cells = max(xs.size / _POINTS_PER_CELL, 1.0)
    side = np.sqrt(width * height / cells) if width * height > 0 else max(width, height) / cells
    side = min(side, typical)
    side = max(side, max(width, height) / _MAX_CELLS_PER_AXIS)
    return float(side) if side > 0 else 1.0


def _candidate_pairs(xs: np.ndarray, ys: np.ndarray, bbox, polygons: _Polygons):
    """(point, polygon) pairs whose bounding boxes may overlap, via a grid of cells.

    Points are binned into square cells; each occupied cell's box is queried in the STRtree
    once, and its polygons are paired with every point of the cell. This avoids building one
    shapely Point per point, which costs more than the whole test.
    """
    xmin, ymin, xmax, ymax = bbox
    side = _cell_size(xs, bbox, polygons.typical_size)
    nx = min(int((xmax - xmin) / side) + 1, _MAX_CELLS_PER_AXIS)
    ny = min(int((ymax - ymin) / side) + 1, _MAX_CELLS_PER_AXIS)
    dx = (xmax - xmin) / nx or 1.0
    dy = (ymax - ymin) / ny or 1.0
    ix = np.clip(((xs - xmin) / dx).astype(np.int64), 0, nx - 1)
    iy = np.clip(((ys - ymin) / dy).astype(np.int64), 0, ny - 1)
    cell = ix * ny + iy
    by_cell = np.argsort(cell, kind="stable")
    occupied, starts, counts = np.unique(cell[by_cell], return_index=True, return_counts=True)
    ox, oy = np.divmod(occupied, ny)
    pad = 1e-6 * max(dx, dy)  # so that rounding never puts a point outside its own cell box
    boxes = shapely.box(xmin + ox * dx - pad, ymin + oy * dy - pad,
                        xmin + (ox + 1) * dx + pad, ymin + (oy + 1) * dy + pad)
    box_index, polygon = polygons.tree.query(boxes)
    per_pair = counts[box_index]
    total = int(per_pair.sum())
    offset = np.repeat(starts[box_index] - (np.cumsum(per_pair) - per_pair), per_pair)
    point = by_cell[offset + np.arange(total)]
    return point, np.repeat(polygon, per_pair)


def _polygon_index(x: np.ndarray, y: np.ndarray, polygons: _Polygons,
                   include_boundary: bool = False) -> np.ndarray:
    """For each point, the position of the first polygon that contains it; -1 for none.

    A point in a polygon's interior is inside, a point in a hole outside; a point on the
    boundary (an edge or a vertex, also a hole's) is outside, as stmtools' ``contains``
    predicate has it, unless ``include_boundary``. Blocks whose bounding box overlaps no
    polygon return at once.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    result = np.full(x.shape, -1, dtype=np.int64)
    finite = np.isfinite(x) & np.isfinite(y)
    if not finite.any() or len(polygons.tree) == 0:
        return result
    where = np.flatnonzero(finite)
    xs, ys = x[where], y[where]
    bbox = (xs.min(), ys.min(), xs.max(), ys.max())
    if polygons.tree.query(shapely.box(*bbox)).size == 0:
        return result
    point, polygon = _candidate_pairs(xs, ys, bbox, polygons)
    test = shapely.intersects_xy if include_boundary else shapely.contains_xy
    inside = test(polygons.geometries[polygon], xs[point], ys[point])
    point, polygon = point[inside], polygon[inside]
    first = np.full(xs.shape, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, point, polygon)  # the first polygon wins where several overlap
    hit = first != np.iinfo(np.int64).max
    result[where[hit]] = first[hit]
    return result


def _field_values(column: pd.Series | np.ndarray) -> np.ndarray:
    """A polygon field as a NumPy array with one extra slot at the end for "no polygon"."""
    column = pd.Series(column)
    if pd.api.types.is_bool_dtype(column) or pd.api.types.is_numeric_dtype(column):
        values = column.to_numpy(dtype=np.float64, na_value=np.nan)
        fill: Any = np.nan
    elif pd.api.types.is_datetime64_any_dtype(column):
        values = column.to_numpy(dtype="datetime64[ns]", na_value=np.datetime64("NaT"))
        fill = np.datetime64("NaT", "ns")
    else:
        values = column.fillna("").astype(str).to_numpy(dtype=str)
        fill = ""
    return np.concatenate([values, np.array([fill], dtype=values.dtype)])


def _take_field(index: np.ndarray, values: np.ndarray) -> np.ndarray:
    return values[index]  # index -1 picks the trailing fill value
