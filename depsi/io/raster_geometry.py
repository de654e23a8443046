"""The geometry of raster stacks: h2ph and lat/lon rasters from the orbits, laid lazily on a
reader's stack (:func:`attach_geometry`), and a stack checked against its geometry before a writer
writes it (:func:`check_stack_for_writing`). The orbit model and its maths are in
:mod:`depsi.geometry`."""

from __future__ import annotations

from typing import Any, cast

import dask.array as da
import numpy as np
import xarray as xr
from scipy.interpolate import RectBivariateSpline

from depsi.geometry import (
    GEOMETRY_ATTR,
    POSITIONS_ATTR,
    GeometryError,
    GeometryMode,
    StackGeometry,
    baselines,
    check_orbits_cover_epochs,
    geodetic_to_ecef,
    look_geometry,
    radar_to_geo,
)

#: Nodes per axis of the coarse grid on which h2ph is computed and then interpolated.
H2PH_GRID_NODES = 12


def _interpolate_nodes(az_nodes, rg_nodes, values, azimuth, range_):
    """Bicubic (fewer nodes: lower degree) interpolation of (az, rg, epoch) node values."""
    kx, ky = min(3, az_nodes.size - 1), min(3, rg_nodes.size - 1)
    out = np.empty((azimuth.size, range_.size, values.shape[-1]), dtype=np.float32)
    for k in range(values.shape[-1]):  # a loop over epochs, not over pixels
        if az_nodes.size == 1 or rg_nodes.size == 1:
            out[:, :, k] = values[0, 0, k]
            continue
        spline = RectBivariateSpline(az_nodes, rg_nodes, values[:, :, k], kx=kx, ky=ky)
        out[:, :, k] = spline(azimuth, range_)
    return out


def _h2ph_block(azimuth: np.ndarray, range_: np.ndarray, *, az_nodes, rg_nodes, values
                ) -> np.ndarray:
    return _interpolate_nodes(az_nodes, rg_nodes, values, azimuth[:, 0, 0], range_[0, :, 0])


def h2ph_raster(geometry: StackGeometry, azimuth: np.ndarray, range_: np.ndarray,
                chunks: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]) -> da.Array:
    """Lazy ``(azimuth, range, time)`` float32 h2ph from the orbits, on ``chunks``.

    Computed exactly on a coarse grid and interpolated bicubically to every pixel: h2ph varies
    smoothly over a scene (the interpolation error is below 1e-6 relative, see the tests).
    """
    azimuth = np.asarray(azimuth, np.float64)
    range_ = np.asarray(range_, np.float64)
    az_nodes = _node_axis_values(azimuth)
    rg_nodes = _node_axis_values(range_)
    values = baselines(geometry, az_nodes[:, None], rg_nodes[None, :])["h2ph"]
    az = da.from_array(azimuth[:, None, None], chunks=(chunks[0], 1, 1))
    rg = da.from_array(range_[None, :, None], chunks=(1, chunks[1], 1))
    n_time = len(geometry.orbits)
    return da.map_blocks(_h2ph_block, az, rg, dtype=np.float32,
                         chunks=(chunks[0], chunks[1], (n_time,)),
                         meta=np.empty((0, 0, 0), np.float32), az_nodes=az_nodes,
                         rg_nodes=rg_nodes, values=values).rechunk(chunks)


def _node_axis_values(coordinate: np.ndarray) -> np.ndarray:
    if coordinate.size == 0:
        return coordinate
    nodes = np.linspace(coordinate.min(), coordinate.max(),
                        max(1, min(H2PH_GRID_NODES, coordinate.size)))
    return np.unique(nodes)


def _latlon_block(azimuth: np.ndarray, range_: np.ndarray, height: np.ndarray | None, *,
                  geometry_json: str, which: int) -> np.ndarray:
    geometry = StackGeometry.from_json(geometry_json)
    return radar_to_geo(geometry, azimuth, range_, height)[which]


def latlon_raster(geometry: StackGeometry, azimuth: np.ndarray, range_: np.ndarray,
                  chunks: tuple[tuple[int, ...], tuple[int, ...]],
                  height: da.Array | None = None) -> tuple[da.Array, da.Array]:
    """Lazy ``(azimuth, range)`` lat and lon (float64) by exact geocoding of every pixel."""
    az = da.from_array(np.asarray(azimuth, np.float64)[:, None], chunks=(chunks[0], 1))
    rg = da.from_array(np.asarray(range_, np.float64)[None, :], chunks=(1, chunks[1]))
    text = geometry.to_json()
    out = []
    for which in (0, 1):
        if height is None:
            out.append(da.map_blocks(_latlon_block, az, rg, None, dtype=np.float64,
                                     chunks=chunks, geometry_json=text, which=which))
        else:
            out.append(da.map_blocks(_latlon_block, az, rg, height.rechunk(chunks),
                                     dtype=np.float64, chunks=chunks, geometry_json=text,
                                     which=which))
    return out[0], out[1]


def attach_geometry(stack: xr.Dataset, geometry: StackGeometry, *,
                    mode: GeometryMode = "product", height: Any = None) -> xr.Dataset:
    """A raster stack with its geometry: attrs, and h2ph / lat / lon from the orbits as needed.

    Parameters
    ----------
    stack
        A raster ``(azimuth, range, time)`` from a reader, with the epochs in the order of
        ``geometry.orbits``.
    geometry
        The stack's geometry.
    mode
        ``"product"``: keep the product's own ``h2ph`` and ``lat``/``lon`` where it has them,
        computing from the orbits only what it lacks (h2ph; lat/lon are then geocoded per point
        after selection, :func:`~depsi.geometry.geocode_points`). ``"orbits"``: compute h2ph
        and lat/lon from the orbits even where the product has them (the product's stay as
        ``h2ph_product``, ``lat_product``, ``lon_product``), so the two can be compared.
    height
        Heights (m) on ``(azimuth, range)`` (a DEM in radar geometry): becomes coordinate
        ``height`` (carried to the points by selection) and is used to geocode.

    Returns
    -------
    xarray.Dataset
        A new Dataset; attrs ``sar_geometry`` (JSON, :meth:`StackGeometry.from_attrs`),
        ``mother_time``, ``azimuth_spacing`` (ground, m), ``range_spacing`` (slant, m),
        ``ground_range_spacing`` (m), ``heading``,
        ``incidence_angle`` (deg, scene centre) and ``wavelength``.
    """
    if mode not in ("product", "orbits"):
        raise ValueError(f"geometry: expected 'product' or 'orbits', found {mode!r}")
    n_time = stack.sizes["time"]
    if len(geometry.orbits) != n_time:
        raise GeometryError(f"geometry: expected one orbit per epoch ({n_time}), found "
                            f"{len(geometry.orbits)}")
    check_orbits_cover_epochs(geometry, stack["time"].values, source="geometry")
    out = stack.copy()
    out.attrs = dict(stack.attrs)
    azimuth = np.asarray(stack["azimuth"].values, np.float64)
    range_ = np.asarray(stack["range"].values, np.float64)
    # the complex stack is (azimuth, range, time): three chunk tuples
    chunks = cast(tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]],
                  stack["complex"].chunks if stack["complex"].chunks else tuple(
                      (s,) for s in stack["complex"].shape))
    if height is not None:
        height = xr.DataArray(height, dims=("azimuth", "range")) if not isinstance(
            height, xr.DataArray) else height
        out = out.assign_coords(height=(("azimuth", "range"), height.data))
        out["height"].attrs.update(units="m", long_name="height above the WGS84 ellipsoid")
    if "h2ph" not in stack.data_vars or mode == "orbits":
        if "h2ph" in stack.data_vars:
            out = out.rename_vars(h2ph="h2ph_product")
        out["h2ph"] = (("azimuth", "range", "time"),
                       h2ph_raster(geometry, azimuth, range_, chunks))
        out["h2ph"].attrs.update(units="1", long_name="height-to-phase factor from the orbits")
    if mode == "orbits":
        for name in ("lat", "lon"):
            if name in out.coords:
                out = out.rename_vars({name: f"{name}_product"})
        h = None if height is None else height.data
        lat, lon = latlon_raster(geometry, azimuth, range_, chunks[:2], h)
        out = out.assign_coords(lat=(("azimuth", "range"), lat), lon=(("azimuth", "range"), lon))
        # selection geocodes its points itself rather than reading these rasters whole
        out.attrs[POSITIONS_ATTR] = "orbits"
    centre = look_geometry(geometry, azimuth[len(azimuth) // 2], range_[len(range_) // 2])
    # ground spacings: between the geocoded centre pixel and its next line and next sample
    a0, r0 = azimuth[len(azimuth) // 2], range_[len(range_) // 2]
    near_lat, near_lon = radar_to_geo(geometry, np.array([a0, a0 + 1, a0]),
                                      np.array([r0, r0, r0 + 1]))
    xyz = geodetic_to_ecef(near_lat, near_lon, geometry.height)
    out.attrs.update({
        GEOMETRY_ATTR: geometry.to_json(),
        "wavelength": float(out.attrs.get("wavelength", geometry.wavelength)),
        "mother_time": str(np.datetime64(stack["time"].values[geometry.mother], "D")),
        "range_spacing": geometry.grid.range_spacing,
        "azimuth_spacing": float(np.linalg.norm(xyz[1] - xyz[0])),
        "ground_range_spacing": float(np.linalg.norm(xyz[2] - xyz[0])),
        "heading": float(centre["heading"]), "incidence_angle": float(centre["incidence"]),
    })
    return out


def check_stack_for_writing(stack: xr.Dataset, geometry: StackGeometry, *, dates_in: str,
                            raster: str) -> xr.Dataset:
    """A raster stack and its geometry checked before a writer writes them (``dates_in``: what
    holds each epoch's date in the format, ``raster``: the format's name); returned in
    ``(azimuth, range, time)`` order."""
    dims = ("azimuth", "range", "time")
    if "complex" not in stack.data_vars:
        raise ValueError(f"stack: expected a 'complex' variable, found {list(stack.data_vars)}")
    if set(stack["complex"].dims) != set(dims):
        raise ValueError(f"stack['complex']: expected dimensions {dims}, found "
                         f"{stack['complex'].dims}")
    n_time = stack.sizes["time"]
    if len(geometry.orbits) != n_time:
        raise GeometryError(f"geometry: expected one orbit per epoch ({n_time}), found "
                            f"{len(geometry.orbits)}")
    time = stack["time"].values
    if not np.issubdtype(time.dtype, np.datetime64):
        raise ValueError(f"stack['time']: expected dates (datetime64), found {time.dtype}")
    days = time.astype("datetime64[D]")
    if len(np.unique(days)) != n_time:
        raise ValueError(f"stack['time']: expected one epoch per date ({dates_in} hold the "
                         f"date), found {[str(d) for d in days]}")
    for k, (day, orbit) in enumerate(zip(days, geometry.orbits)):
        middle = orbit.reference + np.timedelta64(
            int(round(0.5 * (orbit.time[0] + orbit.time[-1]) * 1e9)), "ns")
        if abs((middle - day.astype("datetime64[ns]")) / np.timedelta64(1, "h")) > 48:
            raise GeometryError(f"geometry.orbits[{k}]: expected state vectors around the "
                                f"epoch's date {day}, found them around {middle}")
    wavelength = stack.attrs.get("wavelength", geometry.wavelength)
    if abs(float(wavelength) - geometry.wavelength) > 1e-5 * geometry.wavelength:
        raise ValueError(f"stack.attrs['wavelength']: expected the geometry's "
                         f"{geometry.wavelength!r} m, found {wavelength!r} m")
    for dim in ("azimuth", "range"):
        values = np.asarray(stack[dim].values)
        if values.size > 1 and not (np.issubdtype(values.dtype, np.integer)
                                    and (np.diff(values) == 1).all()):
            raise ValueError(f"stack[{dim!r}]: expected consecutive pixel indices (a {raster} "
                             f"raster has no gaps), found {values[:5].tolist()}...")
    return stack.transpose(*dims, ...)


__all__ = ["H2PH_GRID_NODES", "attach_geometry", "check_stack_for_writing", "h2ph_raster",
           "latlon_raster"]
