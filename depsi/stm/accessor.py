"""The ``.stm`` accessor: thin, non-mutating operations on point space-time matrices.

Method names follow TU Delft's stmtools (``regulate_dims``, ``subset``, ``enrich_from_polygon``,
``get_order``, ``reorder``, ...) with the same meaning. Every method returns a new Dataset and
leaves the one it was called on untouched; lazy (Dask) data stays lazy, only indexed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Literal

import dask.array as da
import numpy as np
import xarray as xr

from depsi.errors import BadInputError
from depsi.stm.order import morton_key
from depsi.stm.polygons import (
    UnsupportedPolygonsError,  # noqa: F401  (raised by the polygon methods; importable here)
    _field_values,
    _load_polygons,
    _polygon_index,
    _take_field,
)
from depsi.stm.schema import STMKeyError, STMValidationError

logger = logging.getLogger(__name__)

#: Data-variable kinds of stmtools' ``register_datatype`` (its ``DataVarTypes``).
DATATYPES = ("obsData", "auxData", "pntAttrib", "epochAttrib")

#: Metadata keys whose values list data variables (stmtools' ``STMMetaData``); checked to exist.
METADATA_VARIABLE_KEYS = ("obsDataKeys", "auxDataKeys", "pntAttribKeys", "epochAttribKeys")

#: Points per block when in-memory coordinates are tested against polygons.
BLOCK_POINTS = 2**18

_THRESHOLD = re.compile(
    r"^\s*(?P<op><=|>=|<|>)\s*(?P<value>[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s*$"
)
_COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


class UnknownMethodError(BadInputError, ValueError, NotImplementedError):
    """A ``method=`` that is not offered; catchable as ``ValueError`` and, as in stmtools,
    as ``NotImplementedError``."""


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


def _check_new_names(ds: xr.Dataset, names: Iterable[str]) -> None:
    for name in names:
        if name in ds.variables:
            raise STMValidationError(
                f"variable {name!r}: expected a new name, found it already in the STM; "
                "drop or rename it first"
            )


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


# --------------------------------------------------------------------------------------------
# The accessor
# --------------------------------------------------------------------------------------------


@xr.register_dataset_accessor("stm")
class SpaceTimeMatrix:
    """Operations on a point STM (dims ``space``, ``time``), reached as ``ds.stm``.

    Every method returns a new Dataset; the Dataset ``ds.stm`` was called on is never changed.
    The methods' examples use ``np`` and ``xr`` as imported here.

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
        >>> import shapely, geopandas as gpd
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
                data = da.map_blocks(_take_field, index, values, dtype=values.dtype)
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
