"""Exports of a result STM: a DePSI-like CSV table, GeoPackage points, GeoTIFF grids, plots.

Every writer takes a point STM ``(space, time)`` with the result variables of
:func:`depsi.pipeline.chain.run_ps_chain` (``velocity``, ``height_error``,
``temporal_coherence``, ``displacement``) and writes its file atomically: to a hidden temporary
sibling first, moved into place when complete, so an interrupted export never leaves a
half-written file under the final name; a full disk or exceeded quota raises ``OSError``
(``ENOSPC``, ``EDQUOT``) naming the file, whatever exception the driver behind the writer
(GDAL, SQLite) raised. Values stay in SI units (m, m/yr), except in the
tables for other viewers, which keep those viewers' names and units:

- ``egms`` (:func:`egms_table`): the columns of the EGMS (European Ground Motion Service)
  point product, displacement in mm and velocity in mm/yr, as described in "European Ground
  Motion Service (EGMS) - Product Description and Format Specification", Copernicus Land
  Monitoring Service, EEA, 2025
  (https://eea.github.io/CLMS_documents/develop/DOCS/products/EGMS_product_description_2023.html).
  Over Europe ``easting``/``northing`` are in ETRS89-LAEA (EPSG:3035) as in EGMS; ``height``
  is the result's terrain height as given. Always empty (NaN), for depsi estimates none of
  them: ``height_wgs84``, ``rmse``, ``acceleration``, ``acceleration_std``; empty where the
  result lacks its source: ``mp_type`` (``scatterer``), ``easting``/``northing`` (pyproj),
  ``height``, ``amplitude_dispersion``, the geometry columns, ``mean_velocity_std``,
  ``seasonality`` and its std (a model without the seasonal term).
- ``qgis`` (:func:`qgis_table`): the fields MintPy's ``save_qgis`` writes (``CODE``,
  ``HEIGHT``, ``H_STDEV``, ``VEL``, ``V_STDEV``, ``COHERENCE``, ``D{YYYYMMDD}`` in mm;
  https://github.com/insarlab/MintPy, ``src/mintpy/save_qgis.py``), which the QGIS plugin
  InSAR Explorer reads: a velocity field named ``velocity``, ``VEL`` or ``mean_velocity`` and
  one field per date named ``DYYYYMMDD``, ``YYYYMMDD`` or ``D_YYYYMMDD``
  (https://github.com/luhipi/insar-explorer, "Data Structure").

Examples
--------
>>> import tempfile
>>> import numpy as np, xarray as xr
>>> from depsi.io.export import to_csv, to_geotiff
>>> result = xr.Dataset(
...     {"velocity": ("space", [0.002, -0.001, 0.0]),
...      "height_error": ("space", [1.5, -0.5, 0.2]),
...      "temporal_coherence": ("space", [0.95, 0.90, 0.99]),
...      "displacement": (("space", "time"), [[0.0, 0.1e-3], [0.0, -0.2e-3], [0.0, 0.0]])},
...     coords={"time": np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]"),
...             "azimuth": ("space", [12, 40, 7]), "range": ("space", [305, 11, 90]),
...             "lat": ("space", [52.3700, 52.3710, 52.3720]),
...             "lon": ("space", [4.8900, 4.8910, 4.8920])})
>>> folder = tempfile.mkdtemp()
>>> to_csv(result, f"{folder}/points.csv").name
'points.csv'
>>> to_geotiff(result, f"{folder}/velocity.tif", resolution=0.0005).name
'velocity.tif'
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import re
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

import numpy as np
import pandas as pd
import xarray as xr

from depsi.errors import DISK_FULL_ERRNOS, DiskFullError
from depsi.io.cf import cf_attributes

logger = logging.getLogger(__name__)

#: Per-point columns of the CSV and GeoPackage exports, in order (displacement follows as
#: ``d_YYYYMMDD`` columns, in metres, then its standard deviation as ``std_d_YYYYMMDD``).
POINT_COLUMNS = ("pnt_id", "lat", "lon", "azimuth", "range", "velocity", "velocity_std",
                 "height_error", "height_error_std", "temporal_coherence", "height",
                 "lat_uncorrected", "lon_uncorrected", "incidence_angle", "heading", "los_east",
                 "los_north", "los_up", "scatterer", "shp_count", "linked_coherence",
                 "reference_distance")

_GEO_HINT = "install the optional 'geo' extra: pip install 'depsi[geo]'"


@contextmanager
def _atomic_path(path: str | os.PathLike):
    """Yield a temporary sibling of ``path`` (same suffix) and move it into place on success.

    The writer's lock of ``path`` is held throughout (one writer at a time), and temporary
    siblings of earlier, killed exports of the same file are removed under it.
    """
    from depsi.io.lock import write_lock
    from depsi.io.paths import temporary_sibling, temporary_siblings

    path = Path(path)
    with write_lock(path):
        for stale in temporary_siblings(path, keep_suffix=True):
            logger.warning("removing %s, left by an interrupted export of %s", stale, path)
            stale.unlink(missing_ok=True)
        tmp = temporary_sibling(path, keep_suffix=True)
        try:
            try:
                yield tmp
            except Exception as err:  # a driver's own type: a full disk is still exit 3
                disk_full = _disk_full_error(err, path)
                if disk_full is None:
                    raise
                raise disk_full from err
            os.replace(tmp, path)
        finally:
            # the file and what its driver kept beside it (SQLite's journal, GDAL's .aux.xml)
            for leftover in tmp.parent.glob(glob.escape(tmp.name) + "*"):
                leftover.unlink(missing_ok=True)


#: How the drivers behind the exports (GDAL through pyogrio and rasterio, SQLite under
#: GeoPackage) word a full disk or an exceeded quota inside their own exception types.
_DISK_FULL_TEXTS = ((errno.ENOSPC, re.compile(r"no space left on device|disk is full|"
                                              r"disk full", re.IGNORECASE)),
                    (errno.EDQUOT, re.compile(r"quota exceeded", re.IGNORECASE)))

#: Free bytes under which a file system counts as full when a driver's write fails: GDAL and
#: SQLite often report a full disk only as a failed write or a table they could not create.
FULL_DISK_BYTES = 1 << 20


def _free_bytes(folder: Path) -> int | None:
    """Bytes free to this user on the file system of ``folder`` (nothing when unknown)."""
    try:
        stats = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def _disk_full_error(err: BaseException, path: Path) -> DiskFullError | None:
    """The :class:`~depsi.errors.DiskFullError` (an ``OSError``) of a full disk at ``path`` when
    the writer's exception ``err`` came from one: an ``OSError`` of a full disk that names no
    file, or a driver's exception whose text (or that of an exception it was raised from) says
    so, or after which the file system of ``path`` has (almost) no space left; else nothing."""
    if isinstance(err, OSError) and err.errno is not None:
        if err.errno in DISK_FULL_ERRNOS and not err.filename:
            return DiskFullError(err.errno, err.strerror, str(path))
        return None  # the operating system's own error, which names its cause
    seen: set[int] = set()
    inner: BaseException | None = err
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        for code, text in _DISK_FULL_TEXTS:
            if text.search(str(inner)):
                return DiskFullError(code, os.strerror(code), str(path))
        inner = inner.__cause__ or inner.__context__
    free = _free_bytes(path.parent)
    if free is not None and free < FULL_DISK_BYTES:
        return DiskFullError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return None


def _require(result: xr.Dataset, names: Sequence[str], what: str) -> None:
    missing = [name for name in names if name not in result.variables]
    if missing:
        raise KeyError(f"{what}: the result STM lacks {missing}; expected the variables of "
                       f"run_ps_chain, found {sorted(map(str, result.variables))}")


def point_ids(result: xr.Dataset) -> np.ndarray:
    """DePSI-style point names ``L<azimuth>P<range>`` (e.g. ``L12P305``), one per point."""
    _require(result, ("azimuth", "range"), "point_ids")
    azimuth = np.asarray(result["azimuth"].values).astype(np.int64).astype(str)
    range_ = np.asarray(result["range"].values).astype(np.int64).astype(str)
    return np.char.add(np.char.add(np.char.add("L", azimuth), "P"), range_)


def _scatterer_names(result: xr.Dataset) -> np.ndarray:
    """The kind of each point by name (``ps``, ``ds``), as its flag's CF meanings say."""
    meanings = np.asarray(result["scatterer"].attrs["flag_meanings"].split(), dtype=object)
    values = list(np.asarray(result["scatterer"].attrs["flag_values"]).tolist())
    return meanings[np.searchsorted(values, np.asarray(result["scatterer"].values))]


def point_table(result: xr.Dataset) -> pd.DataFrame:
    """One row per point: :data:`POINT_COLUMNS` present in ``result``, the model each point
    kept (``model``) and its terms' coefficients and stds (``seasonal_sin``,
    ``seasonal_sin_std``, ...) where the chain had model terms, then ``d_YYYYMMDD`` and, where
    the result has ``displacement_std``, ``std_d_YYYYMMDD``.

    Where the selection found distributed scatterers, ``scatterer`` names each point's kind
    (``ps`` or ``ds``), with ``shp_count`` (its looks; 0 on a PS) and ``linked_coherence``
    (the temporal coherence of a DS's linked phase; empty on a PS).

    With the geometry from the orbits the table also carries each point's line of sight
    (``los_east``/``los_north``/``los_up``, unit vector to the satellite), its incidence angle
    and heading (degrees), for GNSS comparisons and ascending/descending decompositions.

    Parameters
    ----------
    result
        Result STM with ``velocity``, ``height_error``, ``temporal_coherence``,
        ``displacement`` (m) and ``azimuth``/``range`` (``lat``/``lon`` when known).

    Returns
    -------
    pandas.DataFrame
        The table; velocity (and its std) in m/yr, height error, displacement and their stds
        in m.
    """
    # a result without height (a stack without baselines) says so, and has no such column
    height = () if "height_term" in result.attrs else ("height_error",)
    _require(result, ("velocity", *height, "temporal_coherence", "displacement",
                      "azimuth", "range"), "point_table")
    result = result.compute() if any(v.chunks for v in result.variables.values()) else result
    columns = {"pnt_id": point_ids(result)}
    for name in POINT_COLUMNS[1:]:
        if name in result.variables:
            columns[name] = np.asarray(result[name].values)
    if "scatterer" in columns and "flag_meanings" in result["scatterer"].attrs:
        columns["scatterer"] = _scatterer_names(result)
    if "model_choice" in result.variables and "model_names" in result.attrs:
        # the model each point kept, by name, and its terms' coefficients with their stds
        names = np.asarray(list(result.attrs["model_names"]), dtype=object)
        columns["model"] = names[np.asarray(result["model_choice"].values, dtype=np.int64)]
    for name in result.attrs.get("model_columns", ()):
        for column in (name, f"{name}_std"):
            if column in result.variables:
                columns[column] = np.asarray(result[column].values)
    frame = pd.DataFrame(columns)
    dates = pd.DatetimeIndex(result["time"].values).strftime("%Y%m%d")
    displacement = pd.DataFrame(
        np.asarray(result["displacement"].transpose("space", "time").values),
        columns=[f"d_{date}" for date in dates])
    parts = [frame, displacement]
    if "displacement_std" in result.variables:
        parts.append(pd.DataFrame(
            np.asarray(result["displacement_std"].transpose("space", "time").values),
            columns=[f"std_d_{date}" for date in dates]))
    return pd.concat(parts, axis=1)


def to_csv(result: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write the result as a DePSI-like CSV table, one row per point.

    Parameters
    ----------
    result
        Result STM (see :func:`point_table`).
    path
        The CSV file; replaced atomically when it exists.

    Returns
    -------
    Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np, pandas as pd, xarray as xr
    >>> result = xr.Dataset(
    ...     {"velocity": ("space", [0.002, -0.001]), "height_error": ("space", [1.5, -0.5]),
    ...      "temporal_coherence": ("space", [0.95, 0.90]),
    ...      "displacement": (("space", "time"), [[0.0, 0.1e-3], [0.0, -0.2e-3]])},
    ...     coords={"time": np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]"),
    ...             "azimuth": ("space", [12, 40]), "range": ("space", [305, 11]),
    ...             "lat": ("space", [52.370, 52.371]), "lon": ("space", [4.890, 4.891])})
    >>> table = pd.read_csv(to_csv(result, tempfile.mkdtemp() + "/points.csv"))
    >>> table.columns[:3].tolist(), table.columns[-2:].tolist()
    (['pnt_id', 'lat', 'lon'], ['d_20200101', 'd_20200113'])
    >>> table.pnt_id.tolist()
    ['L12P305', 'L40P11']
    """
    table = point_table(result)
    with _atomic_path(path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.9g")
    logger.info("wrote %d points to %s", len(table), path)
    return Path(path)


def to_geopackage(result: xr.Dataset, path: str | os.PathLike, *,
                  layer: str = "points") -> Path:
    """Write the result as GeoPackage points in WGS84 (EPSG:4326), with the CSV's columns.

    Needs the optional ``geo`` extra (geopandas, pyogrio).

    Parameters
    ----------
    result
        Result STM with ``lat``/``lon`` (see :func:`point_table`).
    path
        The ``.gpkg`` file; replaced atomically when it exists.
    layer
        Name of the layer.

    Returns
    -------
    Path
        ``path``.

    Raises
    ------
    ImportError
        Without geopandas, naming the extra to install.
    """
    try:
        import geopandas as gpd
    except ImportError as err:
        raise ImportError(f"to_geopackage needs geopandas ({err}); {_GEO_HINT}") from None
    _require(result, ("lat", "lon"), "to_geopackage")
    table = point_table(result)
    frame = gpd.GeoDataFrame(table, geometry=gpd.points_from_xy(table["lon"], table["lat"]),
                             crs="EPSG:4326")
    with _atomic_path(path) as tmp:
        frame.to_file(tmp, layer=layer, driver="GPKG")
    logger.info("wrote %d points to %s", len(frame), path)
    return Path(path)


def _grid_axes(values: np.ndarray, resolution: float) -> tuple[np.ndarray, np.ndarray]:
    """Cell index of each value and the cell centres of a grid covering them."""
    start = np.floor(values.min() / resolution) * resolution
    index = np.floor((values - start) / resolution + 1e-9).astype(np.int64)
    centres = start + (np.arange(index.max() + 1) + 0.5) * resolution
    return index, centres


def grid_points(result: xr.Dataset, *, variable: str = "velocity",
                resolution: float | None = None,
                coordinates: Literal["lonlat", "radar"] = "lonlat") -> xr.DataArray:
    """Mean of ``variable`` per cell of a regular grid; NaN in cells without points.

    Parameters
    ----------
    result
        Point STM with ``variable`` on ``space``.
    variable
        The per-point variable gridded.
    resolution
        Cell size: degrees for ``lonlat``, pixels for ``radar``. ``None``: about one point per
        cell on average (square cells over the points' bounding box).
    coordinates
        ``lonlat``: cells in longitude/latitude (north up); ``radar``: azimuth/range pixels.

    Returns
    -------
    xarray.DataArray
        Dims ``(y, x)`` with cell-centre coordinates (``y`` descending for ``lonlat``) and the
        number of points per cell in ``attrs['max_points_per_cell']``.
    """
    xname, yname = ("lon", "lat") if coordinates == "lonlat" else ("range", "azimuth")
    _require(result, (variable, xname, yname), "grid_points")
    if result[variable].dims != ("space",):
        raise ValueError(f"variable {variable!r}: expected dims ('space',), found "
                         f"{result[variable].dims}")
    x = np.asarray(result[xname].values, dtype=np.float64)
    y = np.asarray(result[yname].values, dtype=np.float64)
    values = np.asarray(result[variable].values, dtype=np.float64)
    finite = np.isfinite(values) & np.isfinite(x) & np.isfinite(y)
    x, y, values = x[finite], y[finite], values[finite]
    if not values.size:
        raise ValueError(f"grid_points: no point has a finite {variable!r}")
    if resolution is None:
        area = max(np.ptp(x), 1e-12) * max(np.ptp(y), 1e-12)
        resolution = float(np.sqrt(area / values.size)) if values.size > 1 else 1.0
    if not resolution > 0:
        raise ValueError(f"resolution: expected a positive cell size, found {resolution!r}")
    ix, x_centres = _grid_axes(x, resolution)
    iy, y_centres = _grid_axes(y, resolution)
    flat = iy * x_centres.size + ix
    shape = (y_centres.size, x_centres.size)
    counts = np.bincount(flat, minlength=shape[0] * shape[1]).reshape(shape)
    sums = np.bincount(flat, weights=values, minlength=counts.size).reshape(shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        grid = np.where(counts > 0, sums / counts, np.nan).astype(np.float32)
    if coordinates == "lonlat":  # north up: first row is the northernmost
        grid, y_centres = grid[::-1], y_centres[::-1]
    out = xr.DataArray(grid, dims=("y", "x"), coords={"y": y_centres, "x": x_centres},
                       name=variable, attrs={**cf_attributes(variable),
                                             **result[variable].attrs,
                                             "resolution": float(resolution),
                                             "max_points_per_cell": int(counts.max())})
    return out


def to_geotiff(result: xr.Dataset, path: str | os.PathLike, *, variable: str = "velocity",
               resolution: float | None = None,
               coordinates: Literal["lonlat", "radar"] = "lonlat") -> Path:
    """Grid a per-point variable (mean per cell, NaN elsewhere) and write it as a GeoTIFF.

    Needs the optional ``geo`` extra (rioxarray, rasterio).

    Parameters
    ----------
    result
        Point STM with ``variable`` and ``lon``/``lat`` (or ``azimuth``/``range``).
    path
        The ``.tif`` file; replaced atomically when it exists.
    variable, resolution, coordinates
        See :func:`grid_points`. ``lonlat`` grids carry the CRS EPSG:4326; ``radar`` grids
        none.

    Returns
    -------
    Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np, rioxarray, xarray as xr
    >>> result = xr.Dataset(
    ...     {"velocity": ("space", [0.002, -0.001, 0.0])},
    ...     coords={"lat": ("space", [52.3700, 52.3710, 52.3720]),
    ...             "lon": ("space", [4.8900, 4.8910, 4.8920])})
    >>> path = to_geotiff(result, tempfile.mkdtemp() + "/v.tif", resolution=0.001)
    >>> grid = rioxarray.open_rasterio(path).squeeze()
    >>> str(grid.rio.crs), int(np.isfinite(grid).sum())  # one cell per point, NaN elsewhere
    ('EPSG:4326', 3)
    >>> round(float(np.nanmax(grid)), 6)
    0.002
    """
    try:
        import rioxarray  # noqa: F401  (registers the .rio accessor)
    except ImportError as err:
        raise ImportError(f"to_geotiff needs rioxarray ({err}); {_GEO_HINT}") from None
    grid = grid_points(result, variable=variable, resolution=resolution,
                       coordinates=coordinates)
    grid = grid.rio.set_spatial_dims(x_dim="x", y_dim="y").rio.write_nodata(np.nan)
    if coordinates == "lonlat":
        grid = grid.rio.write_crs("EPSG:4326")
    with _atomic_path(path) as tmp:
        grid.rio.to_raster(tmp, driver="GTiff")
    logger.info("wrote %s grid %s to %s", variable, grid.shape, path)
    return Path(path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig, path: str | os.PathLike, *, dpi: int = 90) -> Path:
    plt = _pyplot()
    with _atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    return Path(path)


#: Percentile of |value| that sets symmetric colour limits: a few extreme points do not wash
#: out the map, and the subsidence bowl does not saturate.
COLOUR_PERCENTILE = 98


def robust_limit(*values: np.ndarray, percentile: float = COLOUR_PERCENTILE) -> float:
    """Symmetric colour limit: the ``percentile`` of |value| over all ``values``, NaN ignored."""
    joined = np.abs(np.concatenate([np.ravel(v) for v in values]))
    limit = float(np.nanpercentile(joined, percentile)) if np.isfinite(joined).any() else 1.0
    return limit if limit > 0 else 1.0


def lon_lat_axes(ax, lat: np.ndarray) -> None:
    """Plain lon/lat axes (no basemap) with equal ground distance per unit on both axes."""
    mid = np.deg2rad(np.nanmean(lat)) if np.isfinite(lat).any() else 0.0
    ax.set_aspect(1.0 / max(np.cos(mid), 1e-6))
    ax.set(xlabel="longitude (°E)", ylabel="latitude (°N)")
    ax.ticklabel_format(useOffset=False, style="plain")
    ax.tick_params(axis="x", labelrotation=0)


#: Points drawn with their error bars in :func:`one_to_one` (a spread sample: thousands of bars
#: hide the points they belong to).
ERROR_BAR_POINTS = 200


def one_to_one(ax, true: np.ndarray, estimated: np.ndarray, unit: str, what: str,
               std: np.ndarray | None = None) -> None:
    """Estimated against true with the 1:1 line, equal axes and the RMSE in the title.

    With ``std`` (the estimates' standard deviations): +-1 sigma bars on a spread sample of
    :data:`ERROR_BAR_POINTS` points, and in the title the share of all points whose error is
    within 2 sigma (about 95 % when the standard deviations are calibrated)."""
    ok = np.isfinite(true) & np.isfinite(estimated)
    ax.plot(true[ok], estimated[ok], ".", ms=3, alpha=0.6, label="points")
    within = ""
    if std is not None:
        ok &= np.isfinite(std)
        shown = np.flatnonzero(ok)[::max(1, int(ok.sum()) // ERROR_BAR_POINTS)]
        ax.errorbar(true[shown], estimated[shown], yerr=std[shown], fmt="none", ecolor="C1",
                    elinewidth=0.6, alpha=0.7, label="+-1 sigma (sample)")
        if ok.any():
            share = float(np.mean(np.abs(estimated[ok] - true[ok]) <= 2 * std[ok]))
            within = f", {share:.0%} within 2 sigma"
    low = float(min(true[ok].min(), estimated[ok].min())) if ok.any() else -1.0
    high = float(max(true[ok].max(), estimated[ok].max())) if ok.any() else 1.0
    ax.plot([low, high], [low, high], "k-", lw=1, label="1:1")
    rmse = float(np.sqrt(np.mean((estimated[ok] - true[ok]) ** 2))) if ok.any() else np.nan
    ax.set(title=f"{what}: estimated vs true\n(RMSE {rmse:.2f} {unit}{within})",
           xlabel=f"true {what} ({unit})", ylabel=f"estimated {what} ({unit})",
           xlim=(low, high), ylim=(low, high))
    ax.set_aspect("equal")
    ax.legend(loc="upper left")


def plot_velocity_map(result: xr.Dataset, path: str | os.PathLike) -> Path:
    """Velocity of every point (mm/yr) on lon/lat (or range/azimuth), as an image file.

    Parameters
    ----------
    result
        Result STM with ``velocity``.
    path
        The image (``.png``, ``.pdf``, ...).

    Returns
    -------
    Path
        ``path``.
    """
    _require(result, ("velocity",), "plot_velocity_map")
    plt = _pyplot()
    lonlat = "lon" in result.variables and "lat" in result.variables
    x, y = (result["lon"], result["lat"]) if lonlat else (result["range"], result["azimuth"])
    velocity_mm = 1e3 * np.asarray(result["velocity"].values, dtype=np.float64)
    limit = robust_limit(velocity_mm) if velocity_mm.size else 1.0
    fig, ax = plt.subplots(figsize=(8, 7))
    scatter = ax.scatter(np.asarray(x.values), np.asarray(y.values), c=velocity_mm, s=6,
                         cmap="RdBu", vmin=-limit, vmax=limit)
    if "reference" in result.attrs and "point_index" in result.variables:
        ref = np.flatnonzero(result["point_index"].values == result.attrs["reference"])
        if ref.size:
            ax.plot(np.asarray(x.values)[ref], np.asarray(y.values)[ref], "k*", ms=14,
                    label="reference point")
            ax.legend(loc="lower right")
    ax.set_title(f"LOS velocity, {result.sizes['space']} points\n"
                 "line of sight: + towards the satellite, - away from it", fontsize=10)
    if lonlat:
        lon_lat_axes(ax, np.asarray(y.values, dtype=np.float64))
    else:
        ax.set(xlabel="range (pixels)", ylabel="azimuth (pixels)")
        ax.invert_yaxis()
    bar = fig.colorbar(scatter, ax=ax, extend="both", shrink=0.85)
    bar.set_label("LOS velocity (mm/yr), + towards satellite")
    fig.tight_layout()
    return _save_figure(fig, path)


def _default_points(result: xr.Dataset) -> list[int]:
    """Slowest, median and fastest point by velocity."""
    order = np.argsort(np.nan_to_num(result["velocity"].values, nan=0.0), kind="stable")
    return list(dict.fromkeys(int(order[i]) for i in (0, len(order) // 2, -1)))


def plot_time_series(result: xr.Dataset, path: str | os.PathLike, *,
                     points: Sequence[int] | None = None) -> Path:
    """Displacement time series (mm) of some points, as an image file.

    Parameters
    ----------
    result
        Result STM with ``displacement`` and ``velocity``.
    path
        The image (``.png``, ``.pdf``, ...).
    points
        Positions along ``space``; default the slowest, median and fastest point.

    Returns
    -------
    Path
        ``path``.
    """
    _require(result, ("displacement", "velocity"), "plot_time_series")
    n = result.sizes["space"]
    points = _default_points(result) if points is None else [int(p) for p in points]
    bad = [p for p in points if not -n <= p < n]
    if bad:
        raise IndexError(f"points: expected positions in [0, {n}), found {bad}")
    plt = _pyplot()
    names = point_ids(result) if {"azimuth", "range"} <= set(result.variables) else None
    fig, ax = plt.subplots(figsize=(9, 5))
    times = result["time"].values
    displacement = result["displacement"].transpose("space", "time")
    for p in points:
        label = f"{names[p]}" if names is not None else f"point {p}"
        velocity = 1e3 * float(result["velocity"].values[p])
        ax.plot(times, 1e3 * np.asarray(displacement[p].values), ".-",
                label=f"{label} ({velocity:.1f} mm/yr)")
    ax.set(title="LOS displacement time series (+ towards the satellite)",
           ylabel="LOS displacement (mm)")
    ax.axhline(0, color="0.6", lw=0.5)
    if np.issubdtype(np.asarray(times).dtype, np.datetime64):
        import matplotlib.dates as mdates

        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.legend()
    fig.tight_layout()
    return _save_figure(fig, path)


# ------------------------------------------------------------------- tables for viewers
#: Decimals kept of every value in millimetres (mm, mm/yr) in the viewers' tables: 0.01 mm,
#: the precision of MintPy's ``save_qgis`` fields.
MM_DECIMALS = 2

#: Per-point columns of the EGMS point product (Basic and Calibrated, Product Description and
#: Format Specification), in its order; one ``YYYYMMDD`` column per date follows (mm).
EGMS_COLUMNS = ("pid", "mp_type", "latitude", "longitude", "easting", "northing", "height",
                "height_wgs84", "line", "pixel", "rmse", "temporal_coherence",
                "amplitude_dispersion", "incidence_angle", "track_angle", "los_east",
                "los_north", "los_up", "mean_velocity", "mean_velocity_std", "acceleration",
                "acceleration_std", "seasonality", "seasonality_std")

#: EGMS's projected coordinates: ETRS89-LAEA over Europe (its area of use); elsewhere the
#: local UTM zone of the points.
EGMS_PROJECTED_CRS = "EPSG:3035"

#: Fields of MintPy's ``save_qgis`` (also read by InSAR Explorer), in order; one
#: ``DYYYYMMDD`` field per date follows (mm).
QGIS_FIELDS = ("CODE", "HEIGHT", "H_STDEV", "VEL", "V_STDEV", "COHERENCE")


def _values(result: xr.Dataset, name: str, scale: float = 1.0) -> np.ndarray | None:
    """``result[name]`` times ``scale`` as float64, or None where the result lacks it."""
    if name not in result.variables:
        return None
    return scale * np.asarray(result[name].values, dtype=np.float64)


def _mm(values: np.ndarray | None) -> np.ndarray | None:
    return None if values is None else np.round(values, MM_DECIMALS)


def _seasonal_amplitude(result: xr.Dataset) -> tuple[np.ndarray, np.ndarray] | None:
    """Amplitude (m) of the annual term ``sqrt(sin^2 + cos^2)`` and its std (first-order
    propagation of the two coefficients' stds, NaN without them), where the model has it."""
    if not {"seasonal_sin", "seasonal_cos"} <= set(result.attrs.get("model_columns", ())):
        return None
    sin, cos = _values(result, "seasonal_sin"), _values(result, "seasonal_cos")
    if sin is None or cos is None:
        return None
    amplitude = np.hypot(sin, cos)
    sin_std, cos_std = _values(result, "seasonal_sin_std"), _values(result, "seasonal_cos_std")
    if sin_std is None or cos_std is None:
        return amplitude, np.full_like(amplitude, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.hypot(sin * sin_std, cos * cos_std) / amplitude
    return amplitude, std


def _projected(lat: np.ndarray, lon: np.ndarray) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Easting and northing (m) in :data:`EGMS_PROJECTED_CRS` where every point lies in its
    area of use, else in the points' UTM zone, with the CRS used; None without pyproj."""
    try:
        from pyproj import CRS, Transformer
        from pyproj.aoi import AreaOfInterest
        from pyproj.database import query_utm_crs_info
    except ImportError:
        return None
    finite = np.isfinite(lat) & np.isfinite(lon)
    if not finite.any():
        return None
    west, east = float(lon[finite].min()), float(lon[finite].max())
    south, north = float(lat[finite].min()), float(lat[finite].max())
    target = CRS.from_user_input(EGMS_PROJECTED_CRS)
    area = target.area_of_use
    if area is None or not (area.west <= west and east <= area.east and area.south <= south
                            and north <= area.north):
        zones = query_utm_crs_info(datum_name="WGS 84", area_of_interest=AreaOfInterest(
            west_lon_degree=west, south_lat_degree=south, east_lon_degree=east,
            north_lat_degree=north))
        target = CRS.from_epsg(int(zones[0].code))
    easting, northing = Transformer.from_crs("EPSG:4326", target, always_xy=True).transform(
        lon, lat)
    name = f"EPSG:{target.to_epsg()}"
    return np.asarray(easting, dtype=np.float64), np.asarray(northing, dtype=np.float64), name


def _dates(result: xr.Dataset) -> pd.Index:
    return pd.DatetimeIndex(result["time"].values).strftime("%Y%m%d")


def _displacement_mm(result: xr.Dataset, prefix: str) -> pd.DataFrame:
    return pd.DataFrame(
        _mm(1e3 * np.asarray(result["displacement"].transpose("space", "time").values,
                             dtype=np.float64)),
        columns=[f"{prefix}{date}" for date in _dates(result)])


def _viewer_input(result: xr.Dataset, what: str) -> xr.Dataset:
    """The result, computed, once checked for the variables every viewer table needs."""
    _require(result, ("velocity", "temporal_coherence", "displacement", "azimuth", "range",
                      "lat", "lon"), what)
    return result.compute() if any(v.chunks for v in result.variables.values()) else result


def egms_table(result: xr.Dataset) -> pd.DataFrame:
    """One row per point with the columns and units of the EGMS point product.

    :data:`EGMS_COLUMNS`, then displacement per date as ``YYYYMMDD`` columns in mm (velocity
    in mm/yr, angles in degrees, heights and coordinates in m). Filled from the result:
    ``pid`` (the point's name, :func:`point_ids`), ``mp_type`` (``PS``/``DS``, where the result
    has ``scatterer``), ``latitude``/``longitude``, ``easting``/``northing`` (in
    :data:`EGMS_PROJECTED_CRS` over Europe, else the points' UTM zone; needs pyproj),
    ``height``, ``line``/``pixel`` (azimuth/range), ``temporal_coherence``,
    ``amplitude_dispersion``, ``incidence_angle``, ``track_angle`` (the heading),
    ``los_east``/``los_north``/``los_up``, ``mean_velocity`` and its std, ``seasonality`` and
    its std (amplitude of the annual term of the temporal model, mm). Columns the result has
    no estimate for are empty (NaN), and a log line names them: always ``height_wgs84``,
    ``rmse``, ``acceleration`` and ``acceleration_std``.

    Parameters
    ----------
    result
        Result STM with ``velocity``, ``temporal_coherence``, ``displacement`` (m),
        ``azimuth``/``range`` and ``lat``/``lon``.

    Returns
    -------
    pandas.DataFrame
        The table, millimetre values rounded to :data:`MM_DECIMALS` decimals.

    Raises
    ------
    KeyError
        Where the result lacks one of those variables (``lat``/``lon`` included), naming it.
    """
    result = _viewer_input(result, "egms_table")
    n = result.sizes["space"]
    # present: _viewer_input requires them
    lat, lon = cast(np.ndarray, _values(result, "lat")), cast(np.ndarray, _values(result, "lon"))
    seasonal = _seasonal_amplitude(result)
    projected = _projected(lat, lon)
    columns = {
        "pid": point_ids(result),
        "mp_type": (np.char.upper(_scatterer_names(result).astype(str))
                    if "scatterer" in result.variables
                    and "flag_meanings" in result["scatterer"].attrs else None),
        "latitude": lat, "longitude": lon,
        "easting": None if projected is None else projected[0],
        "northing": None if projected is None else projected[1],
        "height": _values(result, "height"),
        "line": np.asarray(result["azimuth"].values), "pixel": np.asarray(result["range"].values),
        "temporal_coherence": _values(result, "temporal_coherence"),
        "amplitude_dispersion": _values(result, "amplitude_dispersion"),
        "incidence_angle": _values(result, "incidence_angle"),
        "track_angle": _values(result, "heading"),
        "los_east": _values(result, "los_east"), "los_north": _values(result, "los_north"),
        "los_up": _values(result, "los_up"),
        "mean_velocity": _mm(_values(result, "velocity", 1e3)),
        "mean_velocity_std": _mm(_values(result, "velocity_std", 1e3)),
        "seasonality": None if seasonal is None else _mm(1e3 * seasonal[0]),
        "seasonality_std": None if seasonal is None else _mm(1e3 * seasonal[1]),
    }
    empty = [name for name in EGMS_COLUMNS if columns.get(name) is None]
    table = pd.DataFrame({name: (np.full(n, np.nan) if columns.get(name) is None
                                 else columns[name]) for name in EGMS_COLUMNS})
    if projected is not None:
        logger.info("egms: easting/northing in %s", projected[2])
    logger.info("egms: no estimate in this result for %s; left empty", empty)
    return pd.concat([table, _displacement_mm(result, "")], axis=1)


def qgis_table(result: xr.Dataset) -> pd.DataFrame:
    """One row per point with the fields of MintPy's ``save_qgis``, as InSAR Explorer reads.

    :data:`QGIS_FIELDS`, then displacement per date as ``DYYYYMMDD`` fields in mm: ``CODE``
    (the point's name, :func:`point_ids`), ``HEIGHT`` (m: the height error, plus the terrain
    ``height`` where the result has it), ``H_STDEV`` (m, the height error's std), ``VEL`` and
    ``V_STDEV`` (mm/yr), ``COHERENCE`` (temporal coherence). A result without a height term
    (a stack without baselines) leaves ``HEIGHT`` and ``H_STDEV`` empty (NaN).

    Parameters
    ----------
    result
        Result STM as for :func:`egms_table`.

    Returns
    -------
    pandas.DataFrame
        The table with ``lat``/``lon`` beside the fields (the points' positions), millimetre
        values rounded to :data:`MM_DECIMALS` decimals.
    """
    result = _viewer_input(result, "qgis_table")
    n = result.sizes["space"]
    nan = np.full(n, np.nan)
    height = _values(result, "height_error")
    if height is not None and "height" in result.variables:
        height = height + _values(result, "height")
    height_std = _values(result, "height_error_std") if height is not None else None
    velocity_std = _values(result, "velocity_std", 1e3)
    table = pd.DataFrame({
        "CODE": point_ids(result),
        "HEIGHT": nan if height is None else height,
        "H_STDEV": nan if height_std is None else height_std,
        "VEL": _mm(_values(result, "velocity", 1e3)),
        "V_STDEV": nan if velocity_std is None else _mm(velocity_std),
        "COHERENCE": _values(result, "temporal_coherence"),
        "lat": _values(result, "lat"), "lon": _values(result, "lon")})
    return pd.concat([table, _displacement_mm(result, "D")], axis=1)


def _write_table(table: pd.DataFrame, path: str | os.PathLike) -> Path:
    # 12 digits: projected coordinates of 7 integer digits keep their millimetres
    with _atomic_path(path) as tmp:
        table.to_csv(tmp, index=False, float_format="%.12g")
    logger.info("wrote %d points to %s", len(table), path)
    return Path(path)


def _write_points(table: pd.DataFrame, path: str | os.PathLike, *, lat: str, lon: str,
                  layer: str, what: str) -> Path:
    try:
        import geopandas as gpd
    except ImportError as err:
        raise ImportError(f"{what} needs geopandas ({err}); {_GEO_HINT}") from None
    frame = gpd.GeoDataFrame(table, geometry=gpd.points_from_xy(table[lon], table[lat]),
                             crs="EPSG:4326")
    with _atomic_path(path) as tmp:
        frame.to_file(tmp, layer=layer, driver="GPKG")
    logger.info("wrote %d points to %s", len(frame), path)
    return Path(path)


def to_egms_csv(result: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write :func:`egms_table` as a CSV file, as the EGMS point product is distributed."""
    return _write_table(egms_table(result), path)


def to_egms_geopackage(result: xr.Dataset, path: str | os.PathLike, *,
                       layer: str = "egms") -> Path:
    """Write :func:`egms_table` as GeoPackage points in WGS84 (EPSG:4326).

    Needs the optional ``geo`` extra (geopandas, pyogrio).
    """
    return _write_points(egms_table(result), path, lat="latitude", lon="longitude",
                         layer=layer, what="to_egms_geopackage")


def to_qgis_geopackage(result: xr.Dataset, path: str | os.PathLike, *,
                       layer: str = "points") -> Path:
    """Write :func:`qgis_table` as GeoPackage points in WGS84 (EPSG:4326), for QGIS and its
    InSAR Explorer plugin.

    Needs the optional ``geo`` extra (geopandas, pyogrio).

    Examples
    --------
    >>> import tempfile
    >>> import geopandas, numpy as np, xarray as xr
    >>> result = xr.Dataset(
    ...     {"velocity": ("space", [0.002, -0.001]), "height_error": ("space", [1.5, -0.5]),
    ...      "temporal_coherence": ("space", [0.95, 0.90]),
    ...      "displacement": (("space", "time"), [[0.0, 0.1e-3], [0.0, -0.2e-3]])},
    ...     coords={"time": np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]"),
    ...             "azimuth": ("space", [12, 40]), "range": ("space", [305, 11]),
    ...             "lat": ("space", [52.370, 52.371]), "lon": ("space", [4.890, 4.891])})
    >>> frame = geopandas.read_file(to_qgis_geopackage(result, tempfile.mkdtemp() + "/q.gpkg"))
    >>> frame.columns[:6].tolist(), frame["D20200113"].tolist(), frame.crs.to_epsg()
    (['CODE', 'HEIGHT', 'H_STDEV', 'VEL', 'V_STDEV', 'COHERENCE'], [0.1, -0.2], 4326)
    """
    return _write_points(qgis_table(result), path, lat="lat", lon="lon", layer=layer,
                         what="to_qgis_geopackage")


def to_qgis_csv(result: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write :func:`qgis_table` as a CSV file (``lat``/``lon`` columns place the points)."""
    return _write_table(qgis_table(result), path)


#: Writers of the ``output.exports`` names of the pipeline configuration, with file names.
EXPORTERS: dict[str, tuple[tuple[str, Callable[..., Path]], ...]] = {
    "csv": (("points.csv", to_csv),),
    "gpkg": (("points.gpkg", to_geopackage),),
    "geotiff": (("velocity.tif", to_geotiff),),
    "plots": (("velocity_map.png", plot_velocity_map), ("time_series.png", plot_time_series)),
    "egms": (("egms.csv", to_egms_csv), ("egms.gpkg", to_egms_geopackage)),
    "qgis": (("qgis.gpkg", to_qgis_geopackage), ("qgis.csv", to_qgis_csv)),
}
