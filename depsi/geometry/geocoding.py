"""Points geocoded from their stack's orbits: the positions and line-of-sight geometry of a point
STM (:func:`geocode_points`), iterated against a DEM (:func:`geocode_with_dem`), and the
positions moved by the estimated height error (:func:`correct_positions`)."""

from __future__ import annotations

import logging
from typing import Any, cast

import numpy as np
import xarray as xr

from depsi.geometry.orbit import GeometryError, StackGeometry
from depsi.geometry.range_doppler import look_geometry, radar_to_geo

logger = logging.getLogger(__name__)

#: Points geocoded per batch (bounds the Newton iterations' temporaries to a few hundred MB).
GEOCODE_BATCH = 500_000

#: Per-point coordinates :func:`geocode_points` adds: name -> (units, long name).
POINT_GEOMETRY = {
    "incidence_angle": ("degree", "incidence angle of the line of sight at the point"),
    "heading": ("degree", "heading of the flight direction, clockwise from north"),
    "los_east": ("1", "east component of the unit vector from the point to the satellite"),
    "los_north": ("1", "north component of the unit vector from the point to the satellite"),
    "los_up": ("1", "up component of the unit vector from the point to the satellite"),
}


def _point_heights(points: xr.Dataset, geometry: StackGeometry) -> np.ndarray:
    if "height" in points.variables and points["height"].dims == ("space",):
        height = np.asarray(points["height"].values, np.float64)
        return np.where(np.isfinite(height), height, geometry.height)
    return np.full(points.sizes["space"], geometry.height)


def _batched(function, n: int, *arrays: np.ndarray) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, max(n, 1), GEOCODE_BATCH):  # batches of points, not single points
        window = slice(start, start + GEOCODE_BATCH)
        for key, value in function(*(a[window] for a in arrays)).items():
            parts.setdefault(key, []).append(value)
    return {k: np.concatenate(v) for k, v in parts.items()}


def geocode_points(points: xr.Dataset, *, force: bool = False) -> xr.Dataset:
    """A point STM with its positions and line-of-sight geometry from the stack's orbits.

    Needs the geometry in ``points.attrs`` (:func:`~depsi.io.raster_geometry.attach_geometry`
    puts it on a stack and selection carries it to the points). Each point is geocoded at its
    ``height`` coordinate when the points have one (a DEM or the product's height raster, NaN
    falling back), else at the geometry's scene height. ``lat``/``lon`` are added when absent
    (or replaced with ``force``); ``incidence_angle``, ``heading`` and
    ``los_east``/``los_north``/``los_up`` are always added, as coordinates on ``space``.

    Examples
    --------
    Without a geometry the points come back as they were:

    >>> import xarray as xr, numpy as np
    >>> pts = xr.Dataset(coords={"azimuth": ("space", [0]), "range": ("space", [0])})
    >>> geocode_points(pts) is pts
    True
    """
    geometry = StackGeometry.from_attrs(points.attrs)
    if geometry is None:
        return points
    n = points.sizes["space"]
    azimuth = np.asarray(points["azimuth"].values, np.float64)
    range_ = np.asarray(points["range"].values, np.float64)
    height = _point_heights(points, geometry)
    found = _batched(lambda a, r, h: look_geometry(geometry, a, r, h), n, azimuth, range_,
                     height)
    coords: dict[str, Any] = {}
    if force or "lat" not in points.variables or "lon" not in points.variables:
        coords["lat"] = ("space", found["lat"], {"units": "degrees_north",
                                                 "long_name": "latitude (WGS84), geocoded"})
        coords["lon"] = ("space", found["lon"], {"units": "degrees_east",
                                                 "long_name": "longitude (WGS84), geocoded"})
    source = {"incidence_angle": "incidence", "heading": "heading", "los_east": "los_east",
              "los_north": "los_north", "los_up": "los_up"}
    for name, (units, long_name) in POINT_GEOMETRY.items():
        coords[name] = ("space", found[source[name]].astype(np.float32),
                        {"units": units, "long_name": long_name})
    logger.info("geocoded %d points from the orbits (heights %s)", n,
                "per point" if "height" in points.variables else f"{geometry.height:g} m")
    return points.assign_coords(coords)


#: Geocode -> sample the DEM -> geocode again, until no height changes by more than
#: DEM_TOLERANCE (m): each pass shrinks the height error by the DEM's slope times
#: cot(incidence), at most DEM_ITERATIONS passes.
DEM_ITERATIONS = 12
DEM_TOLERANCE = 1e-3


def open_dem(path: str | Any) -> xr.DataArray:
    """A DEM raster in geographic coordinates (WGS84 lon/lat degrees, heights in m above the
    ellipsoid) as a DataArray on ``(lat, lon)``; needs rioxarray (the ``geo`` extra)."""
    import warnings

    import rasterio
    import rioxarray

    with warnings.catch_warnings():
        # a DEM without a geotransform is refused below, by name, instead of a warning
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(path) as src:
            crs, transform = src.crs, src.transform
    if crs is None:
        raise GeometryError(f"DEM '{path}': expected a coordinate reference system (WGS84 "
                            "lon/lat), found none")
    if transform.is_identity:
        raise GeometryError(f"DEM '{path}': expected a geotransform placing its pixels in "
                            "lon/lat, found none (the identity)")
    # one raster file opens as one DataArray (a list or Dataset only for subdatasets)
    raster = cast(xr.DataArray, rioxarray.open_rasterio(path, masked=True))
    dem = raster.squeeze("band", drop=True)
    if not crs.is_geographic:
        raise GeometryError(f"DEM '{path}': expected geographic coordinates (WGS84 lon/lat), "
                            f"found the projected CRS {crs.to_string()}")
    return dem.rename({"y": "lat", "x": "lon"}).astype(np.float64)


def dem_bounds(dem: xr.DataArray) -> tuple[float, float, float, float]:
    """South, north, west and east edges (degrees) of the DEM's pixel centres."""
    lat, lon = dem["lat"].values, dem["lon"].values
    return float(lat.min()), float(lat.max()), float(lon.min()), float(lon.max())


def check_dem_covers(dem: xr.DataArray, lat: Any, lon: Any, *, source: str = "DEM") -> None:
    """Refuse a DEM on which none of the positions ``lat``/``lon`` (degrees) lies.

    Raises
    ------
    GeometryError
        Naming the DEM, its extent and the positions' extent.
    """
    lat, lon = np.asarray(lat, np.float64), np.asarray(lon, np.float64)
    south, north, west, east = dem_bounds(dem)
    inside = (lat >= south) & (lat <= north) & (lon >= west) & (lon <= east)
    if lat.size and not inside.any():
        raise GeometryError(f"{source}: expected a DEM covering the scene, found one over "
                            f"lat {south:.4f}..{north:.4f}, lon {west:.4f}..{east:.4f} while "
                            f"the scene lies over lat {np.nanmin(lat):.4f}.."
                            f"{np.nanmax(lat):.4f}, lon {np.nanmin(lon):.4f}.."
                            f"{np.nanmax(lon):.4f}")


def geocode_with_dem(points: xr.Dataset, dem: xr.DataArray) -> xr.Dataset:
    """Points geocoded at the heights of a DEM: geocode, sample the DEM at the positions
    (bilinear), geocode again at those heights, until the heights settle
    (:data:`DEM_TOLERANCE`). The heights become the ``height`` coordinate; positions outside
    the DEM keep the scene's height.

    Raises
    ------
    GeometryError
        When the points carry no geometry (a DEM needs the orbits to be used).
    """
    if StackGeometry.from_attrs(points.attrs) is None:
        raise GeometryError("dem: expected points with their orbits (attrs 'sar_geometry') to "
                            "geocode on a DEM, found none")
    located = geocode_points(points, force=True)
    check_dem_covers(dem, located["lat"].values, located["lon"].values, source="dem")
    previous = np.full(located.sizes["space"], np.inf)
    for _ in range(DEM_ITERATIONS):
        height = np.asarray(dem.interp(lat=xr.DataArray(located["lat"].values, dims="space"),
                                       lon=xr.DataArray(located["lon"].values, dims="space")
                                       ).values, np.float64)
        located = geocode_points(located.assign_coords(height=(
            "space", height,
            {"units": "m", "long_name": "height above the WGS84 ellipsoid, from the DEM"})),
            force=True)
        settled = np.isnan(height) | (np.abs(height - previous) <= DEM_TOLERANCE)
        previous = height
        if settled.all():
            break
    outside = int(np.isnan(located["height"].values).sum())
    if outside:
        logger.warning("dem: %d of %d points lie outside the DEM: geocoded at the scene's "
                       "height", outside, located.sizes["space"])
    return located


def correct_positions(result: xr.Dataset) -> xr.Dataset:
    """Each point's position moved to where its estimated height error puts it.

    A point whose height is ``h + height_error`` lies, at the same pixel, displaced away from
    the sensor by about ``height_error / tan(incidence)`` (a higher point is imaged nearer the
    sensor than it lies): its position is re-geocoded at the
    corrected height and the shift is added to ``lat``/``lon`` (whatever their source). The
    positions before the correction stay as ``lat_uncorrected``/``lon_uncorrected``.
    Without a geometry in the attrs, or without ``height_error``, the result is returned as is.
    """
    geometry = StackGeometry.from_attrs(result.attrs)
    if geometry is None or "height_error" not in result or not {"lat", "lon"} <= set(
            result.variables) or "lat_uncorrected" in result.variables:
        return result
    n = result.sizes["space"]
    azimuth = np.asarray(result["azimuth"].values, np.float64)
    range_ = np.asarray(result["range"].values, np.float64)
    height = _point_heights(result, geometry)
    error = np.asarray(result["height_error"].values, np.float64)
    error = np.where(np.isfinite(error), error, 0.0)

    def shift(a, r, h, e):
        lat0, lon0 = radar_to_geo(geometry, a, r, h)
        lat1, lon1 = radar_to_geo(geometry, a, r, h + e)
        return {"lat": lat1 - lat0, "lon": lon1 - lon0}

    moved = _batched(shift, n, azimuth, range_, height, error)
    lat, lon = result["lat"], result["lon"]
    return result.assign_coords(
        lat=("space", np.asarray(lat.values, np.float64) + moved["lat"],
             {"units": "degrees_north", "long_name": "latitude (WGS84), corrected for the "
                                                     "estimated height error"}),
        lon=("space", np.asarray(lon.values, np.float64) + moved["lon"],
             {"units": "degrees_east", "long_name": "longitude (WGS84), corrected for the "
                                                    "estimated height error"}),
        lat_uncorrected=("space", np.asarray(lat.values), dict(lat.attrs)),
        lon_uncorrected=("space", np.asarray(lon.values), dict(lon.attrs)))
