"""The ``.stm`` accessor: thin, non-mutating operations on point space-time matrices.

Method names follow TU Delft's stmtools (``regulate_dims``, ``subset``, ``enrich_from_polygon``,
``get_order``, ``reorder``, ...) with the same meaning. Every method returns a new Dataset and
leaves the one it was called on untouched; lazy (Dask) data stays lazy, only indexed.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import sys
import uuid
from collections.abc import Hashable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
import pandas as pd
import shapely
import xarray as xr

from depsi.stm.order import morton_key
from depsi.stm.schema import STMValidationError

logger = logging.getLogger(__name__)

#: Data-variable kinds of stmtools' ``register_datatype`` (its ``DataVarTypes``).
DATATYPES = ("obsData", "auxData", "pntAttrib", "epochAttrib")

#: Metadata keys whose values list data variables (stmtools' ``STMMetaData``); checked to exist.
METADATA_VARIABLE_KEYS = ("obsDataKeys", "auxDataKeys", "pntAttribKeys", "epochAttribKeys")

#: Points per block when in-memory coordinates are tested against polygons.
BLOCK_POINTS = 2**18

#: Average number of points per grid cell of the polygon candidate search.
_POINTS_PER_CELL = 8
#: Upper bound on the grid cells along one axis of the candidate search.
_MAX_CELLS_PER_AXIS = 4096

_THRESHOLD = re.compile(
    r"^\s*(?P<op><=|>=|<|>)\s*(?P<value>[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s*$"
)
_COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
_POLYGON_TYPE_IDS = (3, 6)  # shapely type ids of Polygon and MultiPolygon


class STMKeyError(STMValidationError, KeyError):
    """A variable, coordinate, dimension or field named in a call is absent.

    Catchable as ``KeyError`` (like xarray's missing-variable error) and as ``ValueError``.
    """

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class UnknownMethodError(ValueError, NotImplementedError):
    """A ``method=`` that is not offered; catchable as ``ValueError`` and, as in stmtools,
    as ``NotImplementedError``."""


class UnsupportedPolygonsError(TypeError, NotImplementedError):
    """Polygons of a type that is not accepted; catchable as ``TypeError`` and, as in
    stmtools, as ``NotImplementedError``."""


def _present(ds: xr.Dataset) -> str:
    return f"variables {sorted(map(str, ds.variables))}"


def _require_variable(ds: xr.Dataset, name: Hashable, what: str = "variable",
                      context: str = "") -> xr.DataArray:
    if name not in ds.variables:
        raise STMKeyError(f"{what} {name!r}{context}: expected in the STM, found {_present(ds)}")
    return ds[name]


def _require_space_only(ds: xr.Dataset, name: Hashable, what: str = "variable") -> xr.DataArray:
    var = _require_variable(ds, name, what)
    if var.dims != ("space",):
        raise STMValidationError(
            f"{what} {name!r}: expected one value per point, dims ('space',), found dims {var.dims}"
        )
    return var


def _require_dim(ds: xr.Dataset, dim: str) -> int:
    if dim not in ds.dims:
        raise STMKeyError(
            f"dimension {dim!r}: expected in the STM (see .stm.regulate_dims), "
            f"found dims {tuple(ds.dims)}"
        )
    return ds.sizes[dim]


def _as_names(names: str | Iterable[str], what: str) -> list[str]:
    if isinstance(names, str):
        return [names]
    if not isinstance(names, Iterable):
        raise TypeError(f"{what}: expected a name or a list of names, found {type(names).__name__}")
    names = list(names)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{what}: expected names as strings, found {names!r}")
    return names


def _space_chunks(ds: xr.Dataset) -> tuple[int, ...] | None:
    """The space chunks of the first Dask-backed variable along ``space``; None when in memory."""
    for var in ds.variables.values():
        if "space" in var.dims and var.chunks is not None:
            return tuple(var.chunksizes["space"])
    return None


def _values(var: xr.DataArray) -> np.ndarray:
    """The values of a 1-D variable as NumPy (computing it when lazy)."""
    return np.asarray(var.values)


def _shares_memory_with_workers(arrays: list) -> bool:
    """Whether the current Dask scheduler runs tasks in this process (threads, synchronous)."""
    import dask.local
    import dask.threaded
    from dask.base import get_scheduler

    if get_scheduler(collections=arrays) is dask.local.get_sync:
        return True
    # the threaded scheduler runs on the configured pool where one is set: threads only if
    # it is not a pool of processes
    return (get_scheduler(collections=arrays) is dask.threaded.get
            and not isinstance(dask.config.get("pool", None), ProcessPoolExecutor))


def computed_in_place(ds: xr.Dataset, *, in_process: bool = False
                      ) -> dict[Hashable, tuple[tuple[Hashable, ...], np.ndarray]]:
    """Every data variable of ``ds`` computed straight into one NumPy array each.

    ``ds.compute()`` holds every chunk's result and then concatenates them, twice the memory of
    the result at the end; here each chunk is written into its place in a preallocated array as
    it is done (``dask.array.store``), all variables in one pass over the graph. Returns
    ``{name: (dims, values)}``, for ``Dataset.assign``.

    ``in_process=True`` computes on this process's threads whatever the current scheduler: for
    a graph whose inputs are this process's own arrays (views made by :func:`chunked_view`),
    which a distributed scheduler would otherwise copy whole into the graph it ships (6.8 GB
    for the chain's final fit at 10^7 points) for a few minutes of work.

    Examples
    --------
    >>> ds = xr.Dataset({"a": ("x", da.arange(6, chunks=2))})
    >>> computed_in_place(ds)["a"][1].tolist()
    [0, 1, 2, 3, 4, 5]
    """
    lazy = [name for name, var in ds.data_vars.items() if var.chunks is not None]
    if lazy and in_process:
        # the threaded scheduler takes the configured pool when there is one: a process pool
        # (depsi's "processes" scheduler sets one) would run the blocks elsewhere
        with dask.config.set(scheduler="threads", pool=None):
            return computed_in_place(ds)
    if lazy and not _shares_memory_with_workers([ds[name].data for name in lazy]):
        ds = ds.compute()  # workers in other processes (distributed, processes) cannot write here
        lazy = []
    out = {name: (var.dims, np.empty(var.shape, var.dtype) if name in lazy
                  else np.asarray(var.values)) for name, var in ds.data_vars.items()}
    if lazy:
        da.store([ds[name].data for name in lazy], [out[name][1] for name in lazy], lock=False)
    return out


def culled(ds: xr.Dataset) -> xr.Dataset:
    """``ds`` with each Dask variable's graph cut down to the tasks its own chunks need.

    A slice of a lazy result (a batch of its chunks) keeps the whole graph it was cut from; a
    distributed scheduler gets that whole graph pickled and sent before it culls it (dask
    2026.8): densification's batches at 10^7 points sent 2.4 GB each, every chunk's neighbour
    rows. Local schedulers cull without copying; the values are the same either way.
    """
    from dask.core import flatten
    from dask.optimization import cull

    out = ds.copy(deep=False)
    for name, var in ds.variables.items():
        data = var.data
        if not isinstance(data, da.Array):
            continue
        # the task-level cull (HighLevelGraph.cull keeps every layer of a concatenation)
        graph, _ = cull(dict(data.__dask_graph__()), list(flatten(data.__dask_keys__())))
        out[name].data = da.Array(graph, data.name, data.chunks, meta=data._meta)
    return out


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, Windows, musl)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> bool:
    """Hand the heap's free pages back to the operating system (glibc's ``malloc_trim(0)``);
    False where the C library cannot (nothing is done there).

    Once a large array (up to 32 MB) has been freed, glibc serves arrays below that size from
    its heap, and a heap freed around live allocations stays with the process: a chain's
    block-sized temporaries left gigabytes of resident memory between its steps at 10^7
    points. The chain calls this between steps.

    Examples
    --------
    >>> isinstance(release_memory(), bool)
    True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def chunked_view(values: np.ndarray, chunks: int, axis: int = 0) -> da.Array:
    """A Dask array of ``values`` chunked by ``chunks`` along ``axis`` whose blocks are *views*
    of it: ``da.from_array`` (and so ``Dataset.chunk``) copies NumPy input whole first, twice
    the memory of a large in-memory STM. ``values`` must not change while the graph lives.

    Examples
    --------
    >>> x = np.arange(10.0)
    >>> view = chunked_view(x, 4)
    >>> view.chunks, float(view.sum().compute())
    (((4, 4, 2),), 45.0)
    >>> all(np.shares_memory(block, x) for block in dict(view.dask).values())
    True
    """
    from dask.highlevelgraph import HighLevelGraph

    values = np.asarray(values)
    size = values.shape[axis]
    bounds = list(range(0, size, max(int(chunks), 1))) + [size]
    if size == 0:
        bounds = [0, 0]
    name = f"view-{uuid.uuid4().hex}"  # not a hash of the values: that reads them all
    graph = {}
    for i, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
        key = tuple(i if d == axis else 0 for d in range(values.ndim))
        index = tuple(slice(start, stop) if d == axis else slice(None)
                      for d in range(values.ndim))
        graph[(name,) + key] = values[index]
    block_chunks = tuple(tuple(np.diff(bounds).tolist()) if d == axis else (values.shape[d],)
                         for d in range(values.ndim))
    return da.Array(HighLevelGraph.from_collections(name, graph, dependencies=()), name,
                    block_chunks, meta=values[tuple(slice(0, 0) for _ in values.shape)])


def _check_new_names(ds: xr.Dataset, names: Iterable[str]) -> None:
    for name in names:
        if name in ds.variables:
            raise STMValidationError(
                f"variable {name!r}: expected a new name, found it already in the STM; "
                "drop or rename it first"
            )


# --------------------------------------------------------------------------------------------
# Polygons: reading, and the vectorised point-in-polygon test shared by enrich and subset
# --------------------------------------------------------------------------------------------


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


def _per_point(ds: xr.Dataset, xlabel: str, ylabel: str, func, dtype, name: str, **kwargs):
    """``func(x, y, **kwargs)`` per space block: a Dask array when ``ds`` is lazy, else NumPy."""
    x, y = ds[xlabel].data, ds[ylabel].data
    chunks = _space_chunks(ds)
    if chunks is None:
        if not isinstance(x, da.Array) and not isinstance(y, da.Array):
            out = np.empty(x.shape, dtype=dtype)
            for start in range(0, x.size, BLOCK_POINTS):
                block = slice(start, start + BLOCK_POINTS)
                out[block] = func(x[block], y[block], **kwargs)
            return out
        chunks = (x if isinstance(x, da.Array) else y).chunks[0]
    x = x.rechunk((chunks,)) if isinstance(x, da.Array) else da.from_array(x, chunks=(chunks,))
    y = y.rechunk((chunks,)) if isinstance(y, da.Array) else da.from_array(y, chunks=(chunks,))
    return da.map_blocks(func, x, y, dtype=dtype, name=name, **kwargs)


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


# --------------------------------------------------------------------------------------------
# The accessor
# --------------------------------------------------------------------------------------------


@xr.register_dataset_accessor("stm")
class SpaceTimeMatrix:
    """Operations on a point STM (dims ``space``, ``time``), reached as ``ds.stm``.

    Every method returns a new Dataset; the Dataset ``ds.stm`` was called on is never changed.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"amplitude": (("space", "time"), np.ones((3, 2), "f4"))})
    >>> ds.stm.num_points, ds.stm.num_epochs
    (3, 2)
    """

    def __init__(self, xarray_obj: xr.Dataset) -> None:
        self._obj = xarray_obj

    # ---- size --------------------------------------------------------------------------

    @property
    def num_points(self) -> int:
        """Number of points (size of ``space``)."""
        return _require_dim(self._obj, "space")

    @property
    def num_epochs(self) -> int:
        """Number of epochs (size of ``time``)."""
        return _require_dim(self._obj, "time")

    # ---- structure and metadata --------------------------------------------------------

    def regulate_dims(self, space_label: str | None = None,
                      time_label: str | None = None) -> xr.Dataset:
        """Make a Dataset with a missing ``space`` or ``time`` dimension into a (space, time) STM.

        For each of ``space`` and ``time`` that is not yet a dimension: when a label is given,
        that dimension is renamed (``time_label`` renames its coordinate to ``time`` too;
        ``space_label``'s coordinate, e.g. point ids, keeps its name); when no label is given, a
        dimension of size 1 is added. As in stmtools, data variables named ``pnt_*`` are point
        attributes and get no ``time`` dimension. Labels for a dimension already present are
        ignored.

        Parameters
        ----------
        space_label, time_label
            Existing dimension to become ``space`` / ``time``.

        Returns
        -------
        xarray.Dataset
            Dims ordered ``(space, time, ...)``.

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> ds = xr.Dataset({"height": ("points", np.arange(4.0))})
        >>> ds.stm.regulate_dims(space_label="points")["height"].sizes
        Frozen({'space': 4, 'time': 1})
        """
        ds = self._obj
        if space_label is None and time_label is None and not {"space", "time"} & set(ds.dims):
            raise STMKeyError(
                "dimensions: expected 'space' or 'time', or space_label/time_label naming the "
                f"dimension to rename, found dims {tuple(ds.dims)}"
            )
        for key, label in (("space", space_label), ("time", time_label)):
            if key in ds.dims:
                continue
            if label is None:
                ds = ds.expand_dims({key: 1})
                continue
            if not isinstance(label, str):
                raise TypeError(f"{key}_label: expected a dimension name, found {label!r}")
            if label not in ds.dims:
                raise STMKeyError(
                    f"{key}_label {label!r}: expected a dimension of the Dataset, "
                    f"found dims {tuple(ds.dims)}"
                )
            if key == "time" and label in ds.variables:
                ds = ds.rename({label: "time"})
            else:
                ds = ds.rename_dims({label: key})
        point_attributes = [v for v in ds.data_vars if str(v).startswith("pnt_")
                            and "time" in ds[v].dims and ds.sizes["time"] == 1]
        ds = ds.assign({v: ds[v].squeeze("time", drop=True) for v in point_attributes})
        return ds.transpose("space", "time", ...)

    def add_metadata(self, metadata: Mapping[str, Any]) -> xr.Dataset:
        """Return a new Dataset whose attributes are updated with ``metadata``.

        Examples
        --------
        >>> import xarray as xr
        >>> xr.Dataset().stm.add_metadata({"wavelength": 0.0555}).attrs
        {'wavelength': 0.0555}
        """
        if not isinstance(metadata, Mapping):
            raise TypeError(f"metadata: expected a dict, found {type(metadata).__name__}")
        return self._obj.assign_attrs(dict(metadata))

    def register_metadata(self, dict_meta: Mapping[str, Any]) -> xr.Dataset:
        """Register metadata as attributes, as stmtools does (its ``STMMetaData`` keys).

        Known keys are ``techniqueId``, ``datasetId``, ``crs``, ``globalAttrib``,
        ``datasetAttrib``, ``techniqueAttrib`` and the variable lists ``obsDataKeys``,
        ``auxDataKeys``, ``pntAttribKeys``, ``epochAttribKeys``; the variables these lists name
        must exist. Other keys are stored too.

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> ds = xr.Dataset({"displacement": (("space", "time"), np.zeros((2, 3)))})
        >>> ds.stm.register_metadata({"techniqueId": "PS", "obsDataKeys": ["displacement"]}).attrs
        {'techniqueId': 'PS', 'obsDataKeys': ['displacement']}
        """
        if not isinstance(dict_meta, Mapping):
            raise TypeError(f"dict_meta: expected a dict, found {type(dict_meta).__name__}")
        attrs = dict(dict_meta)
        for key in METADATA_VARIABLE_KEYS:
            if key in attrs:
                attrs[key] = _as_names(attrs[key], f"metadata {key!r}")
                for name in attrs[key]:
                    _require_variable(self._obj, name, context=f" (listed in metadata {key!r})")
        return self._obj.assign_attrs(attrs)

    def register_datatype(self, keys: str | Iterable[str], datatype: str) -> xr.Dataset:
        """Record in the attributes which variables are of kind ``datatype`` (as stmtools).

        Parameters
        ----------
        keys
            Variable name(s); each must exist.
        datatype
            One of ``"obsData"``, ``"auxData"``, ``"pntAttrib"``, ``"epochAttrib"``; the
            attribute of that name becomes the list of ``keys`` (replacing an earlier one).

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> ds = xr.Dataset({"height": ("space", np.zeros(2))})
        >>> ds.stm.register_datatype("height", "pntAttrib").attrs
        {'pntAttrib': ['height']}
        """
        if datatype not in DATATYPES:
            raise ValueError(f"datatype: expected one of {DATATYPES}, found {datatype!r}")
        names = _as_names(keys, "keys")
        for name in names:
            _require_variable(self._obj, name)
        return self._obj.assign_attrs({datatype: names})

    # ---- spatial order -----------------------------------------------------------------

    def get_order(self, xlabel: str = "azimuth", ylabel: str = "range", xscale: float = 1.0,
                  yscale: float = 1.0) -> xr.Dataset:
        """Add a space variable ``order``: the Morton key of (``xlabel``, ``ylabel``).

        The key interleaves the bits of x (even bits) and y (odd bits), the same keys as
        stmtools (pymorton's ``interleave(x, y)``; pymorton keeps only 16 bits per coordinate,
        depsi 32). Coordinates are multiplied by ``xscale``/``yscale`` and floored to integers
        first, as in stmtools: for float coordinates such as lat/lon the scale sets the
        resolution of the order. Scaled values must lie in [0, 2**32). Lazy coordinates give
        a lazy ``order``.

        Examples
        --------
        >>> import xarray as xr
        >>> ds = xr.Dataset(coords={"azimuth": ("space", [1, 0]), "range": ("space", [1, 0])})
        >>> ds.stm.get_order()["order"].values.tolist()
        [3, 0]
        >>> ds = xr.Dataset(coords={"azimuth": ("space", [1, 0]), "range": ("space", [0, 1])})
        >>> ds.stm.get_order()["order"].values.tolist()
        [1, 2]
        """
        ds = self._obj
        x = _require_space_only(ds, xlabel, "coordinate").data
        y = _require_space_only(ds, ylabel, "coordinate").data

        def key(xv, yv):
            # x takes the even bits, y the odd ones: pymorton's interleave(x, y), as stmtools
            return morton_key(_scaled(yv, yscale, ylabel), _scaled(xv, xscale, xlabel))

        if isinstance(x, da.Array) or isinstance(y, da.Array):
            x, y = da.asarray(x), da.asarray(y)
            order = da.map_blocks(key, x, y.rechunk(x.chunks), dtype=np.uint64)
        else:
            order = key(x, y)
        return ds.assign(order=("space", order))

    def reorder(self, xlabel: str = "azimuth", ylabel: str = "range", xscale: float = 1.0,
                yscale: float = 1.0) -> xr.Dataset:
        """Sort the points into Morton order of (``xlabel``, ``ylabel``); adds ``order``.

        The keys (one per point) are computed; the data stay lazy and are only indexed.
        Ties keep their current relative order.

        Examples
        --------
        >>> import xarray as xr
        >>> ds = xr.Dataset(coords={"azimuth": ("space", [1, 0]), "range": ("space", [1, 0])})
        >>> ds.stm.reorder()["azimuth"].values.tolist()
        [0, 1]
        """
        ordered = self.get_order(xlabel, ylabel, xscale, yscale)
        keys = _values(ordered["order"])
        return ordered.isel(space=np.argsort(keys, kind="stable"))

    # ---- subsets -----------------------------------------------------------------------

    def subset(
        self,
        method: Literal["threshold", "density", "polygon"],
        *,
        var: str | None = None,
        threshold: str | None = None,
        dx: float | None = None,
        dy: float | None = None,
        by: str | None = None,
        best: Literal["max", "min"] = "max",
        polygon: Any = None,
        xlabel: str = "lon",
        ylabel: str = "lat",
        crs: Any = None,
        include_boundary: bool = False,
    ) -> xr.Dataset:
        """Select points, keeping their order.

        Parameters
        ----------
        method
            ``"threshold"``: points where the space variable ``var`` satisfies ``threshold``, a
            comparison string such as ``">0.7"``, ``"<=0.3"`` (NaN never satisfies it).
            ``"density"``: at most one point per ``dx`` by ``dy`` cell of the
            (``xlabel``, ``ylabel``) coordinates, cells aligned to multiples of ``dx``/``dy``;
            the point with the ``best`` (``"max"``/``"min"``) value of the space variable
            ``by`` (NaN never wins), or the first point of the cell when ``by`` is None.
            ``"polygon"``: points inside ``polygon`` (shapely geometries, a GeoDataFrame or a
            vector file path; holes excluded, boundary excluded as in stmtools), see
            ``enrich_from_polygon``.
        crs
            CRS of (``xlabel``, ``ylabel``) for reprojecting polygons; see
            ``enrich_from_polygon``.
        include_boundary
            ``method="polygon"``: count a point on a polygon's edge or vertex as inside
            (default False, as stmtools); see ``enrich_from_polygon``.

        Returns
        -------
        xarray.Dataset
            The selected points; the variable or coordinates that decide are computed, the
            data stay lazy and are only indexed.

        Raises
        ------
        KeyError
            No ``space`` or no ``time`` dimension (as stmtools; see ``regulate_dims``).
        ValueError
            A missing or malformed argument of the method; an unknown ``method`` (also a
            ``NotImplementedError``, as in stmtools).

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> ds = xr.Dataset({"coherence": ("space", [0.9, 0.2, 0.8])}, coords={"time": [0, 1]})
        >>> ds.stm.subset(method="threshold", var="coherence", threshold=">0.7").sizes["space"]
        2
        """
        ds = self._obj
        _require_dim(ds, "space")
        _require_dim(ds, "time")  # as stmtools: a STM without time is regulated first
        if method == "threshold":
            keep = self._threshold_mask(var, threshold)
        elif method == "density":
            keep = self._density_index(dx, dy, by, best, xlabel, ylabel)
        elif method == "polygon":
            if polygon is None:
                raise ValueError("subset(method='polygon'): expected polygon=..., found none")
            inside = self._polygon_index(polygon, [], xlabel, ylabel, crs,
                                         include_boundary)[0]
            keep = np.flatnonzero(np.asarray(inside) >= 0)
        else:
            raise UnknownMethodError(
                f"method: expected 'threshold', 'density' or 'polygon', found {method!r}"
            )
        if keep.dtype == bool:
            keep = np.flatnonzero(keep)
        return ds.isel(space=keep)

    def _threshold_mask(self, var: str | None, threshold: str | None) -> np.ndarray:
        if var is None or threshold is None:
            raise ValueError(
                "subset(method='threshold'): expected var=... and threshold=..., found "
                f"var={var!r}, threshold={threshold!r}"
            )
        values = _values(_require_space_only(self._obj, var))
        match = _THRESHOLD.match(threshold) if isinstance(threshold, str) else None
        if match is None:
            raise ValueError(
                "threshold: expected a comparison such as '>0.7', '<0.3', '>=1e-3', "
                f"found {threshold!r}"
            )
        return _COMPARE[match["op"]](values, float(match["value"]))

    def _density_index(self, dx, dy, by, best, xlabel, ylabel) -> np.ndarray:
        for name, size in (("dx", dx), ("dy", dy)):
            if size is None or not np.isfinite(size) or size <= 0:
                raise ValueError(
                    f"subset(method='density'): expected {name} a positive cell size in the "
                    f"units of {xlabel!r}/{ylabel!r}, found {size!r}"
                )
        if best not in ("max", "min"):
            raise ValueError(f"best: expected 'max' or 'min', found {best!r}")
        ds = self._obj
        x = _values(_require_space_only(ds, xlabel, "coordinate")).astype(np.float64)
        y = _values(_require_space_only(ds, ylabel, "coordinate")).astype(np.float64)
        cell_x = np.floor(x / dx)
        cell_y = np.floor(y / dy)
        if by is None:
            rank = np.arange(x.size, dtype=np.float64)
        else:
            score = _values(_require_space_only(ds, by)).astype(np.float64)
            rank = -score if best == "max" else score  # NaN sorts last, so never wins
        order = np.lexsort((rank, cell_y, cell_x))
        cx, cy = cell_x[order], cell_y[order]
        first = np.ones(order.size, dtype=bool)
        first[1:] = (cx[1:] != cx[:-1]) | (cy[1:] != cy[:-1])
        first &= np.isfinite(cx) & np.isfinite(cy)  # points without coordinates are dropped
        return np.sort(order[first])

    # ---- enrichment --------------------------------------------------------------------

    def _polygon_index(self, polygons, fields, xlabel, ylabel, crs, include_boundary):
        ds = self._obj
        _require_space_only(ds, xlabel, "coordinate")
        _require_space_only(ds, ylabel, "coordinate")
        if crs is None:
            crs = ds.attrs.get("crs")
        if crs is None and (xlabel, ylabel) == ("lon", "lat"):
            crs = "EPSG:4326"
        loaded = _load_polygons(polygons, fields, _as_crs(crs))
        index = _per_point(
            ds, xlabel, ylabel, _polygon_index, np.int64,
            name=f"polygon-index-{_token(ds, xlabel, ylabel, loaded.token)}-{include_boundary:d}",
            polygons=loaded, include_boundary=include_boundary,
        )
        return index, loaded

    def enrich_from_polygon(
        self,
        polygons: Any,
        fields: str | Iterable[str],
        xlabel: str = "lon",
        ylabel: str = "lat",
        *,
        crs: Any = None,
        include_boundary: bool = False,
    ) -> xr.Dataset:
        """Add, for each point, ``fields`` of the polygon that contains it, as space variables.

        Parameters
        ----------
        polygons
            Shapely (Multi)Polygons (one, a list or an array; they carry no fields), a
            GeoDataFrame/GeoSeries, or the path of a vector file (GeoPackage, Shapefile, ...;
            read with geopandas). A file that cannot be read raises before any work.
        fields
            Column name(s) of the polygons to copy. Numeric and boolean fields become float64
            with NaN where no polygon contains the point; text fields become fixed-width
            unicode with ``""``; dates become datetime64 with NaT.
        xlabel, ylabel
            The points' x/y coordinates (default lon/lat).
        crs
            CRS of the points' coordinates. Default: ``attrs["crs"]`` if present, else
            EPSG:4326 for lon/lat. Polygons with a different CRS are reprojected to it.
        include_boundary
            False (default, as stmtools' ``contains``): a point on a polygon's edge or vertex
            is outside it. True (``covers``): inside, so that a point on the shared edge of
            two parcels that tile an area belongs to one of them (the first) instead of none.

        Returns
        -------
        xarray.Dataset
            With one new ``(space,)`` variable per field; lazy (one task per space chunk) when
            the STM is chunked, else computed at once.

        Notes
        -----
        A point on a polygon's edge is outside unless ``include_boundary``; a point in a hole
        is outside. A point inside several polygons takes the fields of the first of them
        (lowest row). Points are tested block by block: points are binned in a grid, each
        occupied cell is queried once in an STRtree of the polygons and candidates are tested
        with prepared polygons (``shapely.contains_xy``, or ``intersects_xy`` with
        ``include_boundary``); a block whose bounding box meets no polygon is skipped.

        Examples
        --------
        >>> import numpy as np, xarray as xr, shapely, geopandas as gpd
        >>> ds = xr.Dataset(coords={"lon": ("space", [0.5, 2.5]), "lat": ("space", [0.5, 0.5])})
        >>> parcels = gpd.GeoDataFrame({"name": ["a"]}, geometry=[shapely.box(0, 0, 1, 1)])
        >>> ds.stm.enrich_from_polygon(parcels, "name")["name"].values.tolist()
        ['a', '']
        """
        fields = _as_names(fields, "fields")
        ds = self._obj
        _check_new_names(ds, fields)
        index, loaded = self._polygon_index(polygons, fields, xlabel, ylabel, crs,
                                            include_boundary)
        new = {}
        for field in fields:
            values = _field_values(loaded.table[field])
            if isinstance(index, da.Array):
                data = index.map_blocks(_take_field, values, dtype=values.dtype)
            else:
                data = _take_field(index, values)
            new[field] = ("space", data)
        return ds.assign(new)

    def enrich_from_dataset(
        self,
        dataset: xr.Dataset | xr.DataArray,
        fields: str | Iterable[str],
        method: str = "nearest",
        *,
        xlabel: str | None = None,
        ylabel: str | None = None,
    ) -> xr.Dataset:
        """Sample ``fields`` of another dataset (a raster or a point set) at each point.

        Parameters
        ----------
        dataset
            A raster with 1-D dimension coordinates (``lon``/``lat`` or ``x``/``y``), or a point
            set with dim ``space`` and those coordinates along it. Fields with a ``time`` dim
            are taken at the dataset epoch nearest to each STM epoch and become (space, time).
        fields
            Variable name(s) of ``dataset`` to copy; they must not exist in the STM.
        method
            ``"nearest"``; for rasters also any ``xarray.Dataset.interp`` method
            (``"linear"``, ...).
        xlabel, ylabel
            Coordinate pair used in both; default the first of (lon, lat), (x, y) present
            in both.

        Returns
        -------
        xarray.Dataset
            With the sampled fields. The STM's x/y coordinates are computed (one value per
            point); lazy dataset values stay lazy.

        Notes
        -----
        Raster sampling is ``dataset.sel(..., method="nearest")`` with vectorised indexers.
        For a point set the nearest point is found with a KD-tree on (x, y) in coordinate
        units (for lon/lat that is in degrees, a fair approximation over small areas).

        Examples
        --------
        >>> import numpy as np, xarray as xr
        >>> ds = xr.Dataset(coords={"lon": ("space", [0.1, 2.9]), "lat": ("space", [0.1, 1.2])})
        >>> dem = xr.Dataset({"dem": (("lat", "lon"), np.arange(6.0).reshape(2, 3))},
        ...                  coords={"lat": [0.0, 1.0], "lon": [0.0, 1.0, 2.0]})
        >>> ds.stm.enrich_from_dataset(dem, "dem")["dem"].values.tolist()
        [0.0, 5.0]
        """
        ds = self._obj
        _require_dim(ds, "space")
        if isinstance(dataset, xr.DataArray):
            if dataset.name is None:
                raise ValueError("dataset: a DataArray needs a name (the field to copy)")
            dataset = dataset.to_dataset()
        fields = _as_names(fields, "fields")
        for field in fields:
            if field not in dataset.data_vars:
                raise STMKeyError(
                    f"field {field!r}: expected a variable of the dataset, "
                    f"found {sorted(map(str, dataset.data_vars))}"
                )
        _check_new_names(ds, fields)
        xlabel, ylabel = _common_xy(ds, dataset, xlabel, ylabel)
        x = _values(_require_space_only(ds, xlabel, "coordinate"))
        y = _values(_require_space_only(ds, ylabel, "coordinate"))
        source = dataset[fields]
        if "space" in dataset.dims:
            sampled = _sample_points(source, x, y, xlabel, ylabel, method)
        elif xlabel in dataset.dims and ylabel in dataset.dims:
            sampled = _sample_raster(source, x, y, xlabel, ylabel, method)
        else:
            raise STMValidationError(
                f"dataset: expected a raster with dims ({ylabel!r}, {xlabel!r}) or a point set "
                f"with dim 'space', found dims {tuple(dataset.dims)}"
            )
        if "time" in sampled.dims:
            sampled = _nearest_epochs(sampled, ds)
        chunks = _space_chunks(ds)
        new = {}
        for field in fields:
            variable = sampled[field].transpose("space", ...).variable
            if chunks is not None:
                variable = variable.chunk({"space": chunks})
            new[field] = variable
        return ds.assign(new)


# --------------------------------------------------------------------------------------------
# helpers of the accessor methods
# --------------------------------------------------------------------------------------------


def _scaled(values, scale: float, label: str) -> np.ndarray:
    values = np.asarray(values)
    if values.dtype.kind in "iu" and scale == 1.0:
        return values
    scaled = np.floor(values.astype(np.float64) * scale)
    if scaled.size and not np.isfinite(scaled).all():
        raise ValueError(f"coordinate {label!r}: expected finite values, found NaN/inf")
    return scaled.astype(np.int64)


def _as_crs(crs: Any):
    if crs is None:
        return None
    try:
        from pyproj import CRS
    except ImportError:  # pragma: no cover - pyproj is in the "geo" extra
        return crs
    return CRS.from_user_input(crs)


def _token(ds: xr.Dataset, xlabel: str, ylabel: str, extra: str) -> str:
    from dask.base import tokenize

    return tokenize(ds[xlabel].variable, ds[ylabel].variable, extra)


def _common_xy(ds: xr.Dataset, dataset: xr.Dataset, xlabel: str | None,
               ylabel: str | None) -> tuple[str, str]:
    if xlabel is not None and ylabel is not None:
        pairs = [(xlabel, ylabel)]
    elif xlabel is None and ylabel is None:
        pairs = [("lon", "lat"), ("x", "y")]
    else:
        raise ValueError(f"xlabel/ylabel: expected both or neither, found {xlabel!r}, {ylabel!r}")
    for pair in pairs:
        if all(label in ds.variables and label in dataset.variables for label in pair):
            return pair
    raise STMKeyError(
        f"coordinates: expected {' or '.join(map(str, pairs))} in both the STM and the dataset, "
        f"found STM {sorted(map(str, ds.coords))}, dataset {sorted(map(str, dataset.coords))}"
    )


def _sample_raster(source: xr.Dataset, x, y, xlabel, ylabel, method) -> xr.Dataset:
    at = {xlabel: xr.DataArray(x, dims="space"), ylabel: xr.DataArray(y, dims="space")}
    if method == "nearest":
        return source.sel(at, method="nearest")
    return source.interp(at, method=method)


def _sample_points(source: xr.Dataset, x, y, xlabel, ylabel, method) -> xr.Dataset:
    from scipy.spatial import cKDTree

    if method != "nearest":
        raise ValueError(f"method: a point set is sampled with 'nearest' only, found {method!r}")
    for label in (xlabel, ylabel):
        if source[label].dims != ("space",):
            raise STMValidationError(
                f"dataset coordinate {label!r}: expected dims ('space',), "
                f"found {source[label].dims}"
            )
    tree = cKDTree(np.column_stack([_values(source[xlabel]), _values(source[ylabel])]))
    _, nearest = tree.query(np.column_stack([x, y]))
    return source.drop_vars([xlabel, ylabel]).isel(space=nearest)


def _nearest_epochs(sampled: xr.Dataset, ds: xr.Dataset) -> xr.Dataset:
    _require_variable(ds, "time", "coordinate")
    if sampled["time"].dtype.kind != ds["time"].dtype.kind:
        raise STMValidationError(
            f"dataset coordinate 'time': expected the STM's kind of time ({ds['time'].dtype}), "
            f"found {sampled['time'].dtype}"
        )
    picked = sampled.sel(time=xr.DataArray(ds["time"].values, dims="time"), method="nearest")
    return picked.drop_vars("time")
