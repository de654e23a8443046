"""A result STM as the viewer reads it: per-point columns as float32 on Web Mercator metres, the
nearest point by a KD-tree, one point's series with its model line, and the mean series of a box.

Everything here is vectorised over points; the browser receives compact float32 columns and
asks for one point's series only when it is picked.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from scipy.spatial import ConvexHull, QhullError, cKDTree

from depsi.conventions import years_since
from depsi.errors import BadInputError
from depsi.io.store import open_stm

logger = logging.getLogger(__name__)

#: The result store of a ``depsi run`` (or ``depsi demo``) workspace (the model step's product).
RESULT_STORE = "stm.zarr"
#: Earth radius of the Web Mercator projection (EPSG:3857), m.
MERCATOR_RADIUS = 6378137.0
#: Web Mercator is defined up to this latitude (degrees): the square world of the map tiles.
MERCATOR_MAX_LAT = 85.05112878
#: Nearest points asked of the KD-tree per pick: the first that passes the filters is shown.
PICK_CANDIDATES = 32
#: Most points averaged for a box's mean series; a larger box is averaged over an even sample
#: of this many (the count stays exact): a box over a whole scene of 10^6 points answers in
#: about 2 s on 2 cores.
BOX_MEAN_MAX = 100_000
#: The column coloured first, when the result has it.
DEFAULT_COLUMN = "velocity"
#: Per-point quantities the point panel names, present or absent.
POINT_QUANTITIES = ("velocity", "velocity_std", "height_error", "height_error_std",
                    "temporal_coherence", "scatterer", "model_choice", "displacement_std")
#: Per-point variables that are flags or indices, never coloured as a measurement.
NOT_COLOURED = ("point_index", "order", "in_reference_area", "azimuth", "range")


class ViewInputError(BadInputError, ValueError):
    """The path or Dataset given to the viewer is not a result it can show."""


def result_store(path: str | os.PathLike) -> Path:
    """The result store of ``path``: a ``depsi run``/``depsi demo`` workspace folder (its
    ``stm.zarr``) or a result Zarr store itself."""
    path = Path(path)
    if not path.exists():
        raise ViewInputError(f"view: {str(path)!r} does not exist; expected a depsi workspace "
                             f"folder (with {RESULT_STORE}) or a result Zarr store")
    if (path / RESULT_STORE).is_dir():
        return path / RESULT_STORE
    if (path / "zarr.json").is_file() or (path / ".zmetadata").is_file():
        return path
    raise ViewInputError(f"view: {str(path)!r} is neither a workspace with {RESULT_STORE} nor a "
                         f"Zarr store; found {sorted(p.name for p in path.iterdir())[:10]}")


def mercator(lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Web Mercator (EPSG:3857) x, y in metres of WGS84 ``lon``, ``lat`` in degrees."""
    lat = np.clip(np.asarray(lat, dtype=np.float64), -MERCATOR_MAX_LAT, MERCATOR_MAX_LAT)
    x = MERCATOR_RADIUS * np.radians(np.asarray(lon, dtype=np.float64))
    y = MERCATOR_RADIUS * np.log(np.tan(np.pi / 4 + np.radians(lat) / 2))
    return x, y


def _flag_names(variable: xr.DataArray, names: list[str] | None = None) -> list[str] | None:
    """The names of a flag's values 0, 1, ... (CF ``flag_meanings``), or ``names`` if given."""
    if names is not None:
        return [str(n) for n in names]
    meanings = variable.attrs.get("flag_meanings")
    return None if meanings is None else str(meanings).split()


def _required(result: xr.Dataset, what: str) -> None:
    missing = [n for n in ("lon", "lat", "displacement", "time") if n not in result.variables]
    if missing:
        raise ViewInputError(
            f"view: {what} lacks {missing}; expected a result STM of depsi run with lon/lat "
            f"coordinates and displacement over time, found {sorted(map(str, result.variables))}")
    if "space" not in result.dims:
        raise ViewInputError(f"view: {what} has dims {dict(result.sizes)}; expected (space, time)")


@dataclass(frozen=True)
class Filters:
    """What the browser draws: points at or above a temporal coherence, of the kinds and models
    kept (None: all)."""

    min_coherence: float = 0.0
    kinds: tuple[int, ...] | None = None
    models: tuple[int, ...] | None = None

    @classmethod
    def from_query(cls, query: dict[str, list[str]]) -> Filters:
        def codes(key: str) -> tuple[int, ...] | None:
            if key not in query:
                return None
            text = query[key][0]
            return tuple(int(v) for v in text.split(",") if v != "")

        return cls(float(query.get("min_coherence", ["0"])[0]), codes("kinds"), codes("models"))


class ViewData:
    """The result as the viewer serves it.

    Parameters
    ----------
    result
        A result STM (``depsi run``'s ``stm.zarr``), lazy or in memory.
    source
        What it was read from, for the page's title.
    """

    def __init__(self, result: xr.Dataset, *, source: str = "result"):
        _required(result, source)
        if result.sizes["space"] == 0:
            raise ViewInputError(f"view: {source} has no points (space has length 0)")
        self.result = result.transpose("space", "time", ...)
        self.source = source
        self.n_points = int(result.sizes["space"])
        self.times = np.asarray(result["time"].values).astype("datetime64[ns]")
        lon = np.asarray(result["lon"].values, dtype=np.float64)
        lat = np.asarray(result["lat"].values, dtype=np.float64)
        x, y = mercator(lon, lat)
        finite = np.isfinite(x) & np.isfinite(y)
        self.origin = (float(np.mean(x[finite])), float(np.mean(y[finite]))) if finite.any() \
            else (0.0, 0.0)
        self.columns: dict[str, np.ndarray] = {
            "x": (x - self.origin[0]).astype("<f4"),
            "y": (y - self.origin[1]).astype("<f4")}
        self.units: dict[str, str] = {"x": "m", "y": "m"}
        for name, variable in result.data_vars.items():
            if variable.dims == ("space",) and name not in NOT_COLOURED \
                    and variable.dtype.kind in "fiub":
                self.columns[str(name)] = np.asarray(variable.values).astype("<f4")
                self.units[str(name)] = str(variable.attrs.get("units", ""))
        self.kind_names = (_flag_names(result["scatterer"]) if "scatterer" in result else None)
        self.model_names = (_flag_names(result["model_choice"],
                                        result.attrs.get("model_names"))
                            if "model_choice" in result else None)
        self._xy = np.column_stack([x - self.origin[0], y - self.origin[1]])
        self._xy[~finite] = np.inf  # never inside a box, never nearest
        self._located = np.flatnonzero(finite)  # the points of the KD-tree (finite positions)
        self._tree: cKDTree | None = None
        self._tree_lock = threading.Lock()
        self.years = years_since(self.times, self.times[0])
        # DePSI's point names (L<azimuth>P<range>), formed for a picked point only: the whole
        # array of strings costs seconds and hundreds of MB at 10^6 points
        self._lines_pixels = ((np.asarray(result["azimuth"].values),
                               np.asarray(result["range"].values))
                              if {"azimuth", "range"} <= set(result.variables) else None)

    @cached_property
    def regressors(self) -> dict[str, np.ndarray]:
        """The regressors of the result's model columns at its epochs (made when a point's
        model line is first asked for: the server starts without the processing layer)."""
        return _model_regressors(self.result, self.times)

    @classmethod
    def open(cls, path: str | os.PathLike) -> ViewData:
        """The result of a workspace folder or of a result store."""
        store = result_store(path)
        return cls(open_stm(store), source=str(store))

    # ----------------------------------------------------------------------- columns, meta
    def build_tree(self) -> cKDTree:
        """The KD-tree over the points' map positions (built once; a pick waits for it)."""
        with self._tree_lock:
            if self._tree is None:
                self._tree = cKDTree(self._xy[self._located])
            return self._tree

    @property
    def tree(self) -> cKDTree:
        return self.build_tree()

    def warm_up(self) -> None:
        """Build what the first pick needs (the KD-tree, the model's regressors) while the page
        draws its first picture."""
        self.build_tree()
        _ = self.regressors

    def column_bytes(self, name: str) -> bytes:
        if name not in self.columns:
            raise KeyError(f"view: no per-point column {name!r}; expected one of "
                           f"{sorted(self.columns)}")
        return self.columns[name].tobytes()

    def meta(self) -> dict:
        """What the page needs before its first draw: sizes, dates, columns and their colour
        ranges, filters, the reference (made once)."""
        return dict(self._meta)

    @cached_property
    def _meta(self) -> dict:
        colourable = [n for n in self.columns if n not in ("x", "y")]
        default = DEFAULT_COLUMN if DEFAULT_COLUMN in colourable else (colourable or ["x"])[0]
        return {
            "source": self.source, "n_points": self.n_points, "n_epochs": len(self.times),
            "dates": [str(t)[:10] for t in self.times], "origin": list(self.origin),
            "columns": [{"name": n, "units": self.units[n], **_colour_range(self.columns[n])}
                        for n in colourable],
            "default_column": default,
            "has_coherence": "temporal_coherence" in self.columns,
            "kinds": self.kind_names if "scatterer" in self.columns else None,
            "models": self.model_names if "model_choice" in self.columns else None,
            "reference": self._reference(),
        }

    def _reference(self) -> dict | None:
        """The reference point (its map position) and the outline of the reference area."""
        out = {}
        if "reference" in self.result.attrs and "point_index" in self.result.variables:
            where = np.flatnonzero(np.asarray(self.result["point_index"].values)
                                   == int(self.result.attrs["reference"]))
            if where.size:
                out["point"] = [float(v) for v in self._xy[where[0]]]
        if "in_reference_area" in self.result.variables:
            area = self._xy[np.asarray(self.result["in_reference_area"].values, dtype=bool)]
            area = area[np.isfinite(area).all(axis=1)]
            if len(area) >= 3:
                try:
                    out["area"] = area[ConvexHull(area).vertices].tolist()
                except QhullError:  # points on a line: no area to outline
                    pass
        return out or None

    # ------------------------------------------------------------------------------ queries
    def mask(self, filters: Filters) -> np.ndarray:
        """Which points pass ``filters`` (the same test the page draws with)."""
        keep = np.isfinite(self._xy[:, 0])
        if filters.min_coherence > 0 and "temporal_coherence" in self.columns:
            keep &= self.columns["temporal_coherence"] >= filters.min_coherence
        if filters.kinds is not None and "scatterer" in self.columns:
            keep &= np.isin(self.columns["scatterer"], filters.kinds)
        if filters.models is not None and "model_choice" in self.columns:
            keep &= np.isin(self.columns["model_choice"], filters.models)
        return keep

    def nearest(self, x: float, y: float, radius: float, filters: Filters) -> int | None:
        """The point nearest to the map position ``(x, y)`` (m from the origin) within
        ``radius`` m that passes ``filters``, or None."""
        k = min(PICK_CANDIDATES, self._located.size)
        if k == 0:
            return None
        distance, index = self.tree.query([x, y], k=k, distance_upper_bound=radius)
        distance, index = np.atleast_1d(distance), np.atleast_1d(index)
        index = self._located[index[np.isfinite(distance)]]
        index = index[self.mask(filters)[index]] if index.size else index
        if index.size:
            return int(index[0])
        if k < self._located.size:  # every near point filtered out: search those that pass
            keep = np.flatnonzero(self.mask(filters))
            if keep.size:
                d2 = ((self._xy[keep] - [x, y]) ** 2).sum(axis=1)
                best = int(np.argmin(d2))
                if d2[best] <= radius**2:
                    return int(keep[best])
        return None

    def point_id(self, index: int) -> str | None:
        """The point's DePSI name (``L<azimuth>P<range>``), or None without azimuth/range."""
        if self._lines_pixels is None:
            return None
        azimuth, range_ = self._lines_pixels
        return f"L{int(azimuth[index])}P{int(range_[index])}"

    def point(self, index: int) -> dict:
        """One point: its quantities (those absent named), its displacement series with stds
        and the model line, all in SI units."""
        if not 0 <= index < self.n_points:
            raise KeyError(f"view: point {index} out of range 0..{self.n_points - 1}")
        row = self.result.isel(space=index)
        names = [n for n in ("displacement", "displacement_std", "offset",
                             *self.regressors) if n in row.variables]
        row = row[names].compute()
        displacement = np.asarray(row["displacement"].values, dtype=np.float32)
        values: dict[str, Any] = {}
        for name in POINT_QUANTITIES:
            if name in self.columns:
                values[name] = _json_float(self.columns[name][index])
        if "scatterer" in values and self.kind_names:
            values["scatterer"] = _name_of(self.kind_names, values["scatterer"])
        if "model_choice" in values and self.model_names:
            values["model_choice"] = _name_of(self.model_names, values["model_choice"])
        offset = (np.asarray(row["offset"].values).reshape(1) if "offset" in row.variables
                  else None)
        line = self.model_lines(np.array([index]), displacement[None, :], offset)[0]
        std = (np.asarray(row["displacement_std"].values, dtype=np.float32)
               if "displacement_std" in row.variables else None)
        return {
            "index": index, "id": self.point_id(index),
            "lon": _json_float(self.result["lon"].values[index]),
            "lat": _json_float(self.result["lat"].values[index]),
            "values": values, "absent": [n for n in POINT_QUANTITIES
                                         if n not in values and n not in row.variables],
            "displacement": _json_list(displacement),
            "displacement_std": None if std is None else _json_list(std),
            "model_line": _json_list(line), "model_says": self.model_says(),
        }

    def model_lines(self, index: np.ndarray, displacement: np.ndarray,
                    offset: np.ndarray | None = None) -> np.ndarray:
        """The fitted model of the points ``index`` at their epochs, ``(len(index), T)``:
        velocity and the model's terms, plus the result's offset where it has one, else the
        offset that fits each series best (``displacement``, ``(len(index), T)``)."""
        velocity = self.columns.get("velocity", np.zeros(self.n_points, np.float32))[index]
        line = velocity[:, None].astype(np.float64) * self.years[None, :]
        for name, regressor in self.regressors.items():
            coefficient = np.nan_to_num(self.columns[name][index].astype(np.float64))
            line += coefficient[:, None] * regressor[None, :]
        if offset is None:
            residual = displacement - line
            finite = np.isfinite(residual)
            count = finite.sum(axis=1)
            offset = np.where(finite, residual, 0.0).sum(axis=1) / np.maximum(count, 1)
        line += np.asarray(offset, dtype=np.float64).reshape(-1, 1)
        return line.astype(np.float32)

    def model_says(self) -> str:
        """What the model line holds, in words."""
        terms = "".join(f" + {name}" for name in self.regressors)
        offset = ("the result's offset" if "offset" in self.result.variables
                  else "offset fitted to the series")
        return f"velocity{terms}, {offset}"

    def box(self, x0: float, y0: float, x1: float, y1: float, filters: Filters) -> dict:
        """The points in a map box that pass ``filters``: their count and mean series (over an
        even sample of :data:`BOX_MEAN_MAX` when more)."""
        x, y = self._xy[:, 0], self._xy[:, 1]
        inside = ((x >= min(x0, x1)) & (x <= max(x0, x1)) & (y >= min(y0, y1))
                  & (y <= max(y0, y1)) & self.mask(filters))
        index = np.flatnonzero(inside)
        count = int(index.size)
        if count > BOX_MEAN_MAX:
            index = index[np.linspace(0, count - 1, BOX_MEAN_MAX).astype(np.int64)]
        if count == 0:
            return {"count": 0, "averaged": 0, "mean": None, "std": None}
        series = np.asarray(self.result["displacement"].isel(space=index).values,
                            dtype=np.float64)
        with np.errstate(invalid="ignore"):
            mean = np.nanmean(series, axis=0) if np.isfinite(series).any() else series[0]
            spread = np.nanstd(series, axis=0) if np.isfinite(series).any() else series[0]
        return {"count": count, "averaged": int(index.size), "mean": _json_list(mean),
                "std": _json_list(spread)}

    # ---------------------------------------------------------------------- one-file export
    def sample(self, *, max_points: int, bbox: tuple[float, float, float, float] | None = None,
               seed: int = 0) -> np.ndarray:
        """Indices of at most ``max_points`` points (a seeded random sample, in store order),
        within ``bbox`` (west, south, east, north in degrees) when given."""
        keep = np.isfinite(self._xy[:, 0])
        if bbox is not None:
            west, south, east, north = bbox
            if not (west < east and south < north):
                raise ViewInputError(f"view: --bbox expected west < east and south < north "
                                     f"(degrees), found {list(bbox)}")
            lon = np.asarray(self.result["lon"].values)
            lat = np.asarray(self.result["lat"].values)
            keep &= (lon >= west) & (lon <= east) & (lat >= south) & (lat <= north)
        index = np.flatnonzero(keep)
        if index.size == 0 and bbox is None:
            raise ViewInputError("view: no point of the result has a position (lat/lon)")
        if index.size == 0:
            raise ViewInputError(f"view: no points in the bbox {list(bbox or ())}; the result "
                                 "spans "
                                 f"lon {np.nanmin(self.result['lon'].values):.5f}.."
                                 f"{np.nanmax(self.result['lon'].values):.5f}, lat "
                                 f"{np.nanmin(self.result['lat'].values):.5f}.."
                                 f"{np.nanmax(self.result['lat'].values):.5f}")
        if index.size > max_points:
            index = np.sort(np.random.default_rng(seed).choice(index, max_points, replace=False))
        return index


def _model_regressors(result: xr.Dataset, times: np.ndarray) -> dict[str, np.ndarray]:
    """The regressors of the result's model columns that its column names define (seasonal,
    semi-annual, steps and breakpoints by their dates); a thermal term needs its temperature
    file and is left out of the line."""
    columns = [c for c in result.attrs.get("model_columns", ()) if c in result.variables]
    if not columns:
        return {}
    from depsi.processing.motion_models import ModelConfig, temporal_model

    terms = [t for t in result.attrs.get("model_terms", ()) if t != "thermal"]
    step_dates = [_iso(c.removeprefix("step_")) for c in columns if c.startswith("step_")]
    breakpoint_dates = [_iso(c.removeprefix("breakpoint_")) for c in columns
                        if c.startswith("breakpoint_")]
    model = temporal_model(ModelConfig(terms=terms, step_dates=step_dates,
                                       breakpoint_dates=breakpoint_dates), times)
    return {name: values for name, values in model.regressors.items() if name in columns}


def _iso(yyyymmdd: str) -> str:
    return f"{yyyymmdd[:4]}-{yyyymmdd[4:6]}-{yyyymmdd[6:8]}"


#: Percentile of |value| that bounds the colour scale, so a few outliers do not wash it out.
COLOUR_PERCENTILE = 98


def _colour_range(values: np.ndarray) -> dict:
    """The colour range of a column: diverging and centred on zero where it has both signs,
    else sequential between its robust low and high."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"diverging": False, "low": 0.0, "high": 1.0}
    low, high = np.percentile(finite, [100 - COLOUR_PERCENTILE, COLOUR_PERCENTILE])
    if finite.min() < 0 < finite.max():
        limit = float(np.percentile(np.abs(finite), COLOUR_PERCENTILE)) or 1.0
        return {"diverging": True, "low": -limit, "high": limit}
    if high <= low:
        high = low + 1.0
    return {"diverging": False, "low": float(low), "high": float(high)}


def _name_of(names: list[str], code: float) -> str:
    code = int(code)
    return names[code] if 0 <= code < len(names) else str(code)


def _json_float(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def _json_list(values: np.ndarray) -> list[float | None]:
    """Floats for JSON (NaN as null); float32 values keep their exact value as a double."""
    values = np.asarray(values)
    out = values.astype(np.float64).tolist()
    return [v if np.isfinite(v) else None for v in out] if not np.isfinite(values).all() else out
