"""Ascending and descending line-of-sight results to vertical and east motion.

``decompose`` takes the result STMs of one ascending and one descending track, brings them
onto common points (nearest pairs, or the cells of a common grid) and solves per point the 2x2
system of the two line-of-sight (LOS) velocities for the east and vertical velocities, batched.
Two LOS directions cannot resolve north motion (both Sentinel-1 LOS vectors are nearly normal
to it), so the north velocity is taken as known.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np
import xarray as xr
from scipy.spatial import cKDTree

from depsi.conventions import years_since
from depsi.geometry import ecef_to_geodetic, enu_basis, geodetic_to_ecef
from depsi.stm.schema import STMValidationError

logger = logging.getLogger(__name__)

#: Smallest ``|det|`` of the 2x2 system ``[[e_a, u_a], [e_d, u_d]]`` (east and up components of
#: the two LOS unit vectors) that is solved. The standard deviations of the solution grow as
#: ``1 / |det|``: at 0.1 the noise is amplified about tenfold, where Sentinel-1 ascending and
#: descending give ``|det|`` of 0.8 to 1.0. Below it a point's result is NaN (and counted).
MIN_DETERMINANT = 0.1

#: How far the norm of a LOS vector may be from 1 (float32 storage, interpolated geometry).
LOS_NORM_TOLERANCE = 1e-3

#: The per-point variables every input must have, each along ``space`` only.
REQUIRED_VARIABLES = ("lat", "lon", "velocity", "los_east", "los_north", "los_up")

#: ``velocity`` units taken as metres per year (docs/design.md, "Conventions: signs and units"
#: writes ``m/yr``).
VELOCITY_UNITS = ("m/yr", "m/year", "m year-1", "m yr-1", "m a-1", "m/a")

METHODS = ("pairs", "grid")

_DESCRIPTIONS = {
    "ascending": "the ascending track's result STM",
    "descending": "the descending track's result STM",
}


# ------------------------------------------------------------------------------ validation
def _check_track(ds: xr.Dataset, name: str) -> None:
    """Raise before any work when ``ds`` lacks what a track needs; ``name`` says which track."""
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"{name}: expected an xarray.Dataset ({_DESCRIPTIONS[name]}), "
                        f"found {type(ds).__name__}")
    if "space" not in ds.dims:
        raise STMValidationError(f"{name}: expected a dimension 'space', found dims "
                                 f"{tuple(ds.dims)}")
    for var in REQUIRED_VARIABLES:
        if var not in ds.variables:
            raise STMValidationError(f"{name}: variable {var!r}: expected a per-point variable "
                                     f"or coordinate (space,), found no such variable among "
                                     f"{sorted(map(str, ds.variables))}")
    for var in REQUIRED_VARIABLES + tuple(v for v in ("velocity_std",) if v in ds.variables):
        if ds[var].dims != ("space",):
            raise STMValidationError(f"{name}: variable {var!r}: expected dims ('space',), "
                                     f"found {ds[var].dims}")
        if ds[var].dtype.kind not in "fiu":
            raise STMValidationError(f"{name}: variable {var!r}: expected real numbers, found "
                                     f"dtype {ds[var].dtype}")
    units = ds["velocity"].attrs.get("units")
    if units is not None and units not in VELOCITY_UNITS:
        raise STMValidationError(f"{name}: variable 'velocity': expected units 'm/yr', found "
                                 f"{units!r}")
    if "displacement" in ds.variables and set(ds["displacement"].dims) != {"space", "time"}:
        raise STMValidationError(f"{name}: variable 'displacement': expected dims ('space', "
                                 f"'time'), found {ds['displacement'].dims}")


def _check_los(los: np.ndarray, valid: np.ndarray, name: str) -> None:
    norm = np.linalg.norm(los[valid], axis=1)
    bad = np.abs(norm - 1.0) > LOS_NORM_TOLERANCE
    if bad.any():
        raise STMValidationError(f"{name}: variables 'los_east', 'los_north', 'los_up': expected "
                                 f"a unit vector per point (norm within {LOS_NORM_TOLERANCE} of "
                                 f"1), found {int(bad.sum())} point(s) with norms from "
                                 f"{norm[bad].min():.4g} to {norm[bad].max():.4g}")
    if (los[valid, 2] <= 0).any():
        raise STMValidationError(f"{name}: variable 'los_up': expected > 0 (the LOS vector "
                                 f"points from the ground up to the satellite), found "
                                 f"{int((los[valid, 2] <= 0).sum())} point(s) <= 0")


def _check_parameters(method: str, max_distance: float, resolution: float | None,
                      north: float) -> None:
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, found {method!r}")
    if method == "pairs":
        if not (np.isfinite(max_distance) and max_distance > 0):
            raise ValueError(f"max_distance: expected a positive distance in metres, found "
                             f"{max_distance!r}")
        if resolution is not None:
            raise ValueError(f"resolution: expected None for method 'pairs' (it pairs points "
                             f"within max_distance), found {resolution!r}")
    elif resolution is None or not (np.isfinite(resolution) and resolution > 0):
        raise ValueError(f"resolution: expected a positive cell size in metres for method "
                         f"'grid', found {resolution!r}")
    if not np.isfinite(north):
        raise ValueError(f"north: expected a finite north velocity in m/yr, found {north!r}")


# ------------------------------------------------------------------------------ per track
def _track_arrays(ds: xr.Dataset, name: str, with_std: bool) -> dict[str, np.ndarray]:
    """The per-point vectors of a track as float64 NumPy (loaded: a few numbers per point)."""
    values = {var: np.asarray(ds[var].values, dtype=np.float64) for var in REQUIRED_VARIABLES}
    los = np.stack([values["los_east"], values["los_north"], values["los_up"]], axis=1)
    std = np.asarray(ds["velocity_std"].values, np.float64) if with_std else None
    valid = (np.isfinite(values["lat"]) & np.isfinite(values["lon"])
             & np.isfinite(values["velocity"]) & np.isfinite(los).all(axis=1))
    if std is not None:
        valid &= np.isfinite(std)
    _check_los(los, valid, name)
    if (~valid).any():
        logger.info("decompose: %s: %d of %d point(s) without finite position, velocity or LOS "
                    "left out", name, int((~valid).sum()), valid.size)
    out = {"lat": values["lat"], "lon": values["lon"], "velocity": values["velocity"],
           "los": los, "valid": valid}
    if std is not None:
        out["std"] = std
    return out


def _determinant(los_a: np.ndarray, los_d: np.ndarray) -> np.ndarray:
    """``e_a u_d - e_d u_a``: the determinant of the east/up system, per point."""
    return los_a[..., 0] * los_d[..., 2] - los_d[..., 0] * los_a[..., 2]


def _check_not_parallel(asc: dict, desc: dict) -> None:
    """The same track passed twice has nearly parallel LOS vectors: refuse it outright."""
    mean_a = asc["los"][asc["valid"]].mean(axis=0)
    mean_d = desc["los"][desc["valid"]].mean(axis=0)
    det = float(_determinant(mean_a, mean_d))
    if not abs(det) >= MIN_DETERMINANT:
        raise ValueError(f"ascending, descending: expected two tracks of different look "
                         f"directions (|det| of the mean east/up LOS components >= "
                         f"{MIN_DETERMINANT}), found nearly parallel LOS vectors (|det| = "
                         f"{abs(det):.3g}; mean LOS {np.round(mean_a, 3).tolist()} and "
                         f"{np.round(mean_d, 3).tolist()}): is the same track passed twice?")


# ------------------------------------------------------------------------------ geometry
def _ecef(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    return geodetic_to_ecef(lat, lon, np.zeros_like(lat))


def _centre(*xyz: np.ndarray) -> tuple[float, float]:
    """Latitude and longitude of the two scenes' common centre (mean ECEF, on the ellipsoid)."""
    lat, lon, _ = ecef_to_geodetic(np.concatenate(xyz).mean(axis=0))
    return float(lat), float(lon)


# ------------------------------------------------------------------------------ solve
def _solve(los_a, los_d, v_a, v_d, std_a, std_d, north: float) -> dict[str, np.ndarray]:
    """Batched 2x2 solve ``[[e_a, u_a], [e_d, u_d]] [east, up] = [v_a - n_a N, v_d - n_d N]``.

    Ill-conditioned points (``|det| < MIN_DETERMINANT``) are solved with the identity in their
    place, so that one of them cannot fail the whole batch, and then set to NaN.
    """
    n = v_a.shape[0]
    matrix = np.empty((n, 2, 2))
    matrix[:, 0, 0], matrix[:, 0, 1] = los_a[:, 0], los_a[:, 2]
    matrix[:, 1, 0], matrix[:, 1, 1] = los_d[:, 0], los_d[:, 2]
    det = _determinant(los_a, los_d)
    ill = ~(np.abs(det) >= MIN_DETERMINANT)
    matrix[ill] = np.eye(2)
    rhs = np.stack([v_a - los_a[:, 1] * north, v_d - los_d[:, 1] * north], axis=1)
    east_up = np.linalg.solve(matrix, rhs[..., None])[..., 0]
    inverse = np.linalg.inv(matrix)
    east_up[ill] = np.nan
    inverse[ill] = np.nan
    out = {"east": east_up[:, 0], "vertical": east_up[:, 1], "determinant": det,
           "inverse": inverse, "ill": ill}
    if std_a is not None:
        # Cov = A^-1 diag(s_a^2, s_d^2) A^-T: the two tracks' errors are independent
        var = np.stack([std_a**2, std_d**2], axis=1)
        out["east_std"] = np.sqrt((inverse[:, 0, :] ** 2 * var).sum(axis=1))
        out["vertical_std"] = np.sqrt((inverse[:, 1, :] ** 2 * var).sum(axis=1))
        out["covariance"] = (inverse[:, 0, :] * inverse[:, 1, :] * var).sum(axis=1)
    return out


# ------------------------------------------------------------------------------ pairs
def _pairs(asc: dict, desc: dict, max_distance: float) -> dict[str, np.ndarray]:
    """Each valid ascending point and its nearest valid descending point within range."""
    index_a = np.flatnonzero(asc["valid"])
    index_d = np.flatnonzero(desc["valid"])
    xyz_a = _ecef(asc["lat"][index_a], asc["lon"][index_a])
    xyz_d = _ecef(desc["lat"][index_d], desc["lon"][index_d])
    # chord distances in ECEF: equal to the ground distance to well under a millimetre at 50 m
    distance, nearest = cKDTree(xyz_d).query(xyz_a, k=1, distance_upper_bound=max_distance)
    found = np.isfinite(distance)
    lat, lon, _ = ecef_to_geodetic(0.5 * (xyz_a[found] + xyz_d[nearest[found]]))
    return {"ascending": index_a[found], "descending": index_d[nearest[found]],
            "distance": distance[found], "lat": lat, "lon": lon}


def _decompose_displacement(ascending: xr.Dataset, descending: xr.Dataset, pairs: dict,
                            solution: dict, north: float) -> dict[str, xr.DataArray]:
    """Per-epoch east and vertical displacement of the pairs, lazily when the inputs are."""
    if not ("displacement" in ascending.variables and "displacement" in descending.variables):
        return {}
    time_a, time_d = ascending["time"].values, descending["time"].values
    if time_a.shape != time_d.shape or not (time_a == time_d).all():
        logger.info("decompose: displacement not decomposed: the tracks' epochs differ (%d and "
                    "%d epochs); only velocities are", time_a.size, time_d.size)
        return {}
    if north != 0.0 and time_a.dtype.kind != "M":
        logger.info("decompose: displacement not decomposed: a north velocity needs datetime64 "
                    "epochs to become a displacement")
        return {}
    north_t = xr.DataArray(
        north * years_since(time_a, time_a[0]) if north != 0.0 else np.zeros(time_a.size),
        dims="time")
    d_a = ascending["displacement"].isel(space=pairs["ascending"]).drop_vars(
        [c for c in ascending["displacement"].coords if c != "time"])
    d_d = descending["displacement"].isel(space=pairs["descending"]).drop_vars(
        [c for c in descending["displacement"].coords if c != "time"])
    n_a = xr.DataArray(solution["los_north_a"], dims="space")
    n_d = xr.DataArray(solution["los_north_d"], dims="space")
    rhs_a, rhs_d = d_a - n_a * north_t, d_d - n_d * north_t
    inverse = solution["inverse"]
    out = {}
    for row, name in ((0, "east_displacement"), (1, "vertical_displacement")):
        c_a = xr.DataArray(inverse[:, row, 0], dims="space")
        c_d = xr.DataArray(inverse[:, row, 1], dims="space")
        out[name] = (c_a * rhs_a + c_d * rhs_d).transpose("space", "time")
    return out


# ------------------------------------------------------------------------------ grid
def _local_east_north(xyz: np.ndarray, origin: np.ndarray, lat0: float, lon0: float):
    east, north, _ = enu_basis(lat0, lon0)
    offset = xyz - origin
    return offset @ east, offset @ north


def _grid(asc: dict, desc: dict, resolution: float, with_std: bool) -> dict[str, Any]:
    """Cell means of each track's velocity and LOS vector; cells both tracks cover."""
    index_a = np.flatnonzero(asc["valid"])
    index_d = np.flatnonzero(desc["valid"])
    xyz_a = _ecef(asc["lat"][index_a], asc["lon"][index_a])
    xyz_d = _ecef(desc["lat"][index_d], desc["lon"][index_d])
    lat0, lon0 = _centre(xyz_a, xyz_d)
    origin = geodetic_to_ecef(lat0, lon0, 0.0)
    x, y = _local_east_north(np.concatenate([xyz_a, xyz_d]), origin, lat0, lon0)
    column = np.floor(x / resolution).astype(np.int64)
    row = np.floor(y / resolution).astype(np.int64)
    # one integer key per cell; np.unique compacts them, so memory follows the points, not the
    # extent of the grid
    column0, row0 = column.min(), row.min()
    width = int(row.max() - row0) + 1
    cells, cell_of = np.unique((column - column0) * width + (row - row0), return_inverse=True)
    n_cells = cells.size
    cell_a, cell_d = cell_of[: index_a.size], cell_of[index_a.size:]

    def means(track: dict, index: np.ndarray, cell: np.ndarray) -> dict[str, np.ndarray]:
        count = np.bincount(cell, minlength=n_cells).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = {"count": count,
                   "velocity": np.bincount(cell, track["velocity"][index], n_cells) / count,
                   "los": np.stack([np.bincount(cell, track["los"][index, k], n_cells)
                                    for k in range(3)], axis=1) / count[:, None]}
            if with_std:  # the standard deviation of a mean of independent points
                out["std"] = np.sqrt(np.bincount(cell, track["std"][index] ** 2, n_cells)) / count
        return out

    mean_a, mean_d = means(asc, index_a, cell_a), means(desc, index_d, cell_d)
    both = (mean_a["count"] > 0) & (mean_d["count"] > 0)
    centre_x = (cells[both] // width + column0 + 0.5) * resolution
    centre_y = (cells[both] % width + row0 + 0.5) * resolution
    east, north, _ = enu_basis(lat0, lon0)
    lat, lon, _ = ecef_to_geodetic(origin + centre_x[:, None] * east + centre_y[:, None] * north)
    return {"x": centre_x, "y": centre_y, "lat": lat, "lon": lon, "centre": (lat0, lon0),
            "a": {k: v[both] for k, v in mean_a.items()},
            "d": {k: v[both] for k, v in mean_d.items()}}


# ------------------------------------------------------------------------------ output
def _dataset(lat, lon, solution: dict, with_std: bool) -> xr.Dataset:
    out = xr.Dataset(coords={
        "lat": ("space", lat, {"units": "degrees_north", "standard_name": "latitude"}),
        "lon": ("space", lon, {"units": "degrees_east", "standard_name": "longitude"}),
    })
    out["vertical"] = ("space", solution["vertical"],
                       {"units": "m/yr", "long_name": "vertical velocity (positive up)"})
    out["east"] = ("space", solution["east"],
                   {"units": "m/yr", "long_name": "east velocity (positive east)"})
    if with_std:
        out["vertical_std"] = ("space", solution["vertical_std"], {"units": "m/yr"})
        out["east_std"] = ("space", solution["east_std"], {"units": "m/yr"})
        out["east_vertical_covariance"] = ("space", solution["covariance"], {"units": "m2/yr2"})
    out["determinant"] = ("space", solution["determinant"],
                          {"units": "1", "long_name": "e_a u_d - e_d u_a of the 2x2 system"})
    return out


def decompose(
    ascending: xr.Dataset,
    descending: xr.Dataset,
    *,
    method: Literal["pairs", "grid"] = "pairs",
    max_distance: float = 50.0,
    resolution: float | None = None,
    north: float = 0.0,
) -> xr.Dataset:
    """Vertical and east velocities from an ascending and a descending track's LOS velocities.

    A LOS velocity is the projection of the ground velocity ``(v_east, v_north, v_up)`` on the
    LOS unit vector ``l`` from the ground to the satellite: ``v = l . (v_east, v_north, v_up)``,
    positive towards the satellite (LOS shortening, the ground moving up or towards the
    sensor). Per output point the two tracks give

        [[e_a, u_a], [e_d, u_d]] [v_east, v_up] = [v_a - n_a * north, v_d - n_d * north]

    with ``(e, n, u)`` the LOS components. Two LOS cannot resolve the north velocity (both lie
    nearly in the east-up plane; a third geometry or a model is needed), so it is taken as the
    known ``north``, default 0. Points whose ``|det|`` is below :data:`MIN_DETERMINANT` are NaN
    and counted (logged, and in ``attrs['ill_conditioned']``).

    Parameters
    ----------
    ascending, descending
        Result STMs of one track each, dim ``space`` (and optionally ``time``), with per point
        ``lat``, ``lon`` (WGS84 degrees), ``velocity`` (m/yr, LOS, positive towards the
        satellite), ``los_east``, ``los_north``, ``los_up`` (unit vector from the ground to the
        satellite) and optionally ``velocity_std`` (m/yr) and ``displacement``
        ``(space, time)`` (m, LOS). Points with a non-finite position, velocity, LOS (or std)
        are left out and counted. The per-point vectors are loaded into memory (a few numbers
        per point); ``displacement`` stays lazy.
    method
        ``"pairs"``: each ascending point with its nearest descending point within
        ``max_distance`` (a descending point may serve several ascending ones); the output
        point is the pair's midpoint. ``"grid"``: each track's velocity and LOS vector are
        averaged over the cells of a regular grid of ``resolution`` metres (local east/north
        tangent plane at the scenes' common centre) and every cell both tracks cover is
        decomposed. The mean LOS vector is not renormalised: the mean LOS velocity of a
        constant motion is exactly the mean vector times it.
    max_distance
        Largest distance in metres between the points of a pair (method ``"pairs"``).
    resolution
        Grid cell size in metres (method ``"grid"``, required there; None for ``"pairs"``).
    north
        The north velocity in m/yr assumed at every point.

    Returns
    -------
    xarray.Dataset
        Dim ``space``, coordinates ``lat``, ``lon`` (and for ``"grid"`` the cell centres ``x``,
        ``y`` in metres east/north of ``attrs['grid_origin_lat'/'_lon']``); ``vertical`` and
        ``east`` (m/yr); ``vertical_std``, ``east_std`` and ``east_vertical_covariance``
        (linear propagation of both tracks' ``velocity_std``, taken independent) when both
        have ``velocity_std``; ``determinant`` (1). For ``"pairs"``: ``distance`` (m) and
        ``source_ascending``, ``source_descending`` (positional indices into each input's
        ``space``); and ``east_displacement``, ``vertical_displacement`` ``(space, time)``
        (m, north motion ``north * t`` from the first epoch) when both inputs have
        ``displacement`` on the same epochs. For ``"grid"``: ``count_ascending``,
        ``count_descending`` (points per cell; displacement is not gridded). ``attrs`` name the
        method and its parameters.

    Raises
    ------
    STMValidationError
        (a ``ValueError``) naming the track and the variable that is missing or malformed.
    ValueError
        For a bad parameter, or nearly parallel LOS vectors (the same track passed twice).

    Examples
    --------
    >>> def track(los, velocity):
    ...     return xr.Dataset({"velocity": ("space", [velocity]),
    ...                        "los_east": ("space", [los[0]]), "los_north": ("space", [los[1]]),
    ...                        "los_up": ("space", [los[2]])},
    ...                       coords={"lat": ("space", [52.0]), "lon": ("space", [4.9])})
    >>> l_a, l_d = np.array([-0.6, -0.1, 0.7937]), np.array([0.6, -0.1, 0.7937])
    >>> motion = np.array([0.002, 0.0, -0.01])  # east, north, up in m/yr
    >>> out = decompose(track(l_a, l_a @ motion), track(l_d, l_d @ motion))
    >>> out.east.round(6).values.tolist(), out.vertical.round(6).values.tolist()
    ([0.002], [-0.01])
    """
    _check_track(ascending, "ascending")
    _check_track(descending, "descending")
    _check_parameters(method, max_distance, resolution, north)
    with_std = "velocity_std" in ascending.variables and "velocity_std" in descending.variables
    if not with_std and ("velocity_std" in ascending.variables
                         or "velocity_std" in descending.variables):
        logger.info("decompose: velocity_std in one track only: no standard deviations")
    asc = _track_arrays(ascending, "ascending", with_std)
    desc = _track_arrays(descending, "descending", with_std)
    for track, name in ((asc, "ascending"), (desc, "descending")):
        if not track["valid"].any():
            raise STMValidationError(f"{name}: expected at least one point with finite lat, "
                                     f"lon, velocity and LOS, found none of "
                                     f"{track['valid'].size}")
    _check_not_parallel(asc, desc)

    attrs: dict[str, Any] = {"decomposition_method": method, "north_velocity": float(north),
             "min_determinant": MIN_DETERMINANT}
    if method == "pairs":
        pairs = _pairs(asc, desc, max_distance)
        ia, id_ = pairs["ascending"], pairs["descending"]
        solution = _solve(asc["los"][ia], desc["los"][id_], asc["velocity"][ia],
                          desc["velocity"][id_], asc["std"][ia] if with_std else None,
                          desc["std"][id_] if with_std else None, north)
        out = _dataset(pairs["lat"], pairs["lon"], solution, with_std)
        out["distance"] = ("space", pairs["distance"],
                           {"units": "m", "long_name": "distance between the paired points"})
        out["source_ascending"] = ("space", ia, {"units": "1"})
        out["source_descending"] = ("space", id_, {"units": "1"})
        solution["los_north_a"] = asc["los"][ia, 1]
        solution["los_north_d"] = desc["los"][id_, 1]
        for name, value in _decompose_displacement(ascending, descending, pairs, solution,
                                                   north).items():
            out[name] = value.assign_attrs(units="m")
        attrs["max_distance"] = float(max_distance)
        n_valid = int(asc["valid"].sum())
        logger.info("decompose: %d of %d ascending point(s) paired within %g m", ia.size,
                    n_valid, max_distance)
    elif resolution is not None:  # method "grid", whose resolution is checked above
        grid = _grid(asc, desc, float(resolution), with_std)
        a, d = grid["a"], grid["d"]
        solution = _solve(a["los"], d["los"], a["velocity"], d["velocity"],
                          a.get("std"), d.get("std"), north)
        out = _dataset(grid["lat"], grid["lon"], solution, with_std)
        out = out.assign_coords(x=("space", grid["x"], {"units": "m"}),
                                y=("space", grid["y"], {"units": "m"}))
        out["count_ascending"] = ("space", a["count"].astype(np.int64), {"units": "1"})
        out["count_descending"] = ("space", d["count"].astype(np.int64), {"units": "1"})
        attrs.update(resolution=float(resolution), grid_origin_lat=grid["centre"][0],
                     grid_origin_lon=grid["centre"][1])
        logger.info("decompose: %d grid cell(s) of %g m covered by both tracks",
                    out.sizes["space"], resolution)
    n_ill = int(solution["ill"].sum())
    if n_ill:
        logger.warning("decompose: %d of %d point(s) ill-conditioned (|det| < %g): NaN", n_ill,
                       solution["ill"].size, MIN_DETERMINANT)
    attrs["ill_conditioned"] = n_ill
    parameters = (f"method={method!r}, max_distance={max_distance!r}, "
                  f"resolution={resolution!r}, north={north!r}")
    attrs["history"] = f"decompose({parameters})"
    out.attrs = attrs
    return out
