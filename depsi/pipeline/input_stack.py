"""The input stack of ``input``: opened lazily by its format's reader
(:data:`depsi.io.formats.READERS`), its values checked on sampled blocks, and its geometry
checked against what the run will need (h2ph, positions, a DEM over the scene)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

logger = logging.getLogger(__name__)


def open_stack(config: Any, *, path: str | os.PathLike | None = None) -> xr.Dataset:
    """Open the SLC stack of ``config.input`` lazily (``path``: a simulated stack's store),
    its values checked on sampled blocks (:func:`depsi.io.validate.validate_stack`: finite,
    amplitude neither zero nor constant in an epoch, h2ph physical; ``input.on_bad_epoch``).

    Every step that reads the stack opens it here, so epochs dropped by ``on_bad_epoch: drop``
    stay dropped in every step.
    """
    from depsi.io.validate import validate_stack

    stack = _open_stack_unchecked(config, path=path)
    source = str(path if config.input.format == "simulated" else config.input.path)
    stack = without_baselines(validate_stack(stack, on_bad_epoch=config.input.on_bad_epoch,
                                             source=source))
    if config.input.pixel_spacing is not None:
        stack.attrs["azimuth_spacing"], stack.attrs["range_spacing"] = map(
            float, config.input.pixel_spacing)
    return stack


#: ``attrs`` key of a stack that came without baselines (no h2ph, no orbits): the chain
#: estimates velocity only, and its results carry no height.
NO_BASELINES = "no_baselines"


def without_baselines(stack: xr.Dataset) -> xr.Dataset:
    """A stack without ``h2ph`` (no baselines in the product and no orbits to compute them
    from) given an h2ph of zeros and ``attrs["no_baselines"]``: every step then leaves the
    height term out (:func:`depsi.processing.arcs.heights_resolvable`), and the model step
    drops the height from the results. A stack with h2ph is returned as it is."""
    if "h2ph" in stack.data_vars:
        return stack
    complex_ = stack["complex"]
    zeros = (da.zeros(complex_.shape, dtype=np.float32, chunks=complex_.data.chunks)
             if isinstance(complex_.data, da.Array) else np.zeros(complex_.shape, np.float32))
    stack = stack.assign(h2ph=(complex_.dims, zeros, {
        "units": "1", "long_name": "height-to-phase factor (none: the stack has no baselines)"}))
    stack.attrs[NO_BASELINES] = 1
    return stack


def _open_stack_unchecked(config: Any, *,
                          path: str | os.PathLike | None = None) -> xr.Dataset:
    """Open the SLC stack of ``config.input`` lazily (``path``: a simulated stack's store).

    Parameters
    ----------
    config
        The pipeline configuration.
    path
        The store of a simulated stack (ignored for real input).

    Returns
    -------
    xarray.Dataset
        Raster stack ``(azimuth, range, time)`` with ``complex`` (and ``h2ph`` when known).
    """
    from depsi.io.formats import READERS
    from depsi.io.slc_zarr import open_slc_zarr

    section = config.input
    if section.format == "simulated":
        if path is None:
            raise ValueError("input.format 'simulated': expected the simulated stack's store")
        return open_slc_zarr(path)
    source = Path(section.path)
    if not source.exists():
        raise FileNotFoundError(f"input.path: stack {str(source)!r} does not exist")
    return READERS[section.format].read(source, section)


#: Exports that place points on a map and so need their positions.
EXPORTS_WITH_POSITIONS = ("gpkg", "geotiff", "egms", "qgis")


def _check_stack_geometry(stack: xr.Dataset, config: Any) -> None:
    """Before any pixel is read: the chain needs h2ph, and the exports need positions (the
    product's lat/lon, or orbits to geocode the points from)."""
    where = f"input.path {str(config.input.path)!r} (format {config.input.format!r})"
    positioned = ("sar_geometry" in stack.attrs or {"lat", "lon"} <= set(stack.variables)
                  or {"x", "y"} <= set(stack.variables) or "azimuth_spacing" in stack.attrs)
    if not positioned:
        from depsi.processing.network import DEFAULT_AZIMUTH_SPACING, DEFAULT_RANGE_SPACING

        logger.warning("%s: no positions and no pixel spacing: distances assume Sentinel-1 "
                       "IW's %g m x %g m pixels; set input.pixel_spacing [azimuth, range]",
                       where, DEFAULT_AZIMUTH_SPACING, DEFAULT_RANGE_SPACING)
    if stack.attrs.get(NO_BASELINES):
        logger.warning("%s: no h2ph in the product and no orbits to compute it from: the "
                       "height term leaves every step, velocity and displacement only",
                       where)
    if "sar_geometry" in stack.attrs:
        _check_scene_geometry(stack, where)
    dem = config.input.dem
    if dem is not None and not Path(dem).is_file():
        raise FileNotFoundError(f"input.dem: DEM {str(dem)!r} does not exist")
    if dem is not None and "sar_geometry" not in stack.attrs:
        raise ValueError(f"{where}: input.dem needs the stack's orbits to geocode on it, found "
                         "no orbits in this stack")
    if dem is not None:
        _check_dem(dem, stack)
    geocodable = "sar_geometry" in stack.attrs or {"lat", "lon"} <= set(stack.variables)
    placed = sorted(set(config.output.exports) & set(EXPORTS_WITH_POSITIONS))
    if placed and not geocodable:
        raise ValueError(f"{where}: expected lat/lon rasters or orbit state vectors to "
                         f"geocode the points, found neither: the exports {placed} need "
                         "positions")


def _check_scene_geometry(stack: xr.Dataset, where: str) -> None:
    """The orbits and radar grid image a possible scene, which the product's own lat/lon (where
    it has them) confirm at the scene's corners (:func:`depsi.geometry.check_scene_geometry`:
    four pixels of each read)."""
    from depsi.geometry import StackGeometry, check_scene_geometry

    geometry = StackGeometry.from_attrs(stack.attrs)
    if geometry is None:  # the caller checked that the stack has its geometry
        return
    last_az, last_rg = int(stack.sizes["azimuth"]) - 1, int(stack.sizes["range"]) - 1
    at = {"azimuth": [0, 0, last_az, last_az], "range": [0, last_rg, 0, last_rg]}
    # the pixels' coordinates on the radar grid (a crop's start where it was cut)
    azimuth, range_ = (np.asarray(stack[name].values, np.float64)[at[name]]
                       for name in ("azimuth", "range"))
    lat = lon = None
    if {"lat", "lon"} <= set(stack.variables) and {"azimuth", "range"} <= set(stack["lat"].dims):
        corners = {name: xr.DataArray(index, dims="corner") for name, index in at.items()}
        lat, lon = (np.asarray(stack[name].isel(corners).values, np.float64)
                    for name in ("lat", "lon"))
    check_scene_geometry(geometry, azimuth, range_, lat=lat, lon=lon, source=where)


def _check_dem(dem: str | os.PathLike, stack: xr.Dataset) -> None:
    """The DEM georeferenced and over the scene (its corners and centre geocoded on the
    orbits), before any pixel is read."""
    from depsi.geometry import StackGeometry, check_dem_covers, open_dem, radar_to_geo

    geometry = StackGeometry.from_attrs(stack.attrs)
    if geometry is None:
        raise ValueError(f"input.dem {str(dem)!r}: needs the stack's orbits to geocode on it, "
                         "found no orbits in this stack")
    azimuth = np.asarray(stack["azimuth"].values, np.float64)
    range_ = np.asarray(stack["range"].values, np.float64)
    corners_az = np.array([azimuth[0], azimuth[0], azimuth[-1], azimuth[-1],
                           azimuth[len(azimuth) // 2]])
    corners_rg = np.array([range_[0], range_[-1], range_[0], range_[-1],
                           range_[len(range_) // 2]])
    lat, lon = radar_to_geo(geometry, corners_az, corners_rg)
    check_dem_covers(open_dem(dem), lat, lon, source=f"input.dem {str(dem)!r}")
