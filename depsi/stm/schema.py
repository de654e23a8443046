"""Conventions of the space-time matrix (STM) and their validation.

Every STM in depsi follows docs/design.md, "Data model"; ``validate`` checks a Dataset against those
conventions and raises :class:`STMValidationError` naming what is wrong before any work starts.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from depsi.conventions import years_since
from depsi.errors import BadInputError
from depsi.stm.order import morton_key

#: The dimensions of each kind of STM, in storage order.
DIMS = {
    "points": ("space", "time"),
    "arcs": ("arc", "time"),
    "raster": ("azimuth", "range", "time"),
}

#: Expected dtype kind per conventional variable ("c" complex, "f" float, "i" integer).
VARIABLE_KINDS = {
    "complex": "c",
    "amplitude": "f",
    "phase": "f",
    "h2ph": "f",
    "velocity": "f",
    "height_error": "f",
    "displacement": "f",
    "temporal_coherence": "f",
    "ambiguity": "i",
}

#: Coordinates whose values must be finite when present.
FINITE_COORDS = ("azimuth", "range", "lat", "lon", "x", "y")

#: Variables that are phases and need ``wavelength`` to become metres.
PHASE_VARIABLES = ("complex", "phase")

_KIND_NAMES = {"c": "complex", "f": "floating point", "i": "integer", "u": "unsigned integer"}


class STMValidationError(BadInputError, ValueError):
    """An STM does not follow depsi's conventions; the message names variable, expected, found."""


class STMKeyError(STMValidationError, KeyError):
    """A variable, coordinate, dimension or field named in a call is absent.

    Catchable as ``KeyError`` (like xarray's missing-variable error) and as ``ValueError``.
    """

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


def _fail(what: str, expected: str, found: str) -> None:
    raise STMValidationError(f"{what}: expected {expected}, found {found}")


def _check_dims(ds: xr.Dataset, kind: str) -> None:
    for dim in DIMS[kind]:
        if dim not in ds.dims:
            _fail(f"dimension {dim!r}", f"dims {DIMS[kind]} for a {kind} STM",
                  f"dims {tuple(ds.dims)}")
    # no points or arcs is a valid outcome (an empty selection); no epochs or pixels never is
    for dim in DIMS[kind]:
        if ds.sizes[dim] == 0 and dim not in ("space", "arc"):
            _fail(f"dimension {dim!r}", "at least one element", "size 0")


def _check_time(ds: xr.Dataset) -> None:
    if "time" not in ds.coords:
        _fail("coordinate 'time'", "a time coordinate (datetime64 or integer epoch index)",
              "no 'time' coordinate")
    time = ds["time"].values
    if time.dtype.kind not in "Mi u":
        _fail("coordinate 'time'", "datetime64 (or integer epoch indices)", f"dtype {time.dtype}")
    if time.dtype.kind == "M" and np.isnat(time).any():
        _fail("coordinate 'time'", "valid dates", f"{int(np.isnat(time).sum())} NaT value(s)")
    unique, counts = np.unique(time, return_counts=True)
    if (counts > 1).any():
        _fail("coordinate 'time'", "unique epochs",
              f"duplicate epoch(s) {[str(t) for t in unique[counts > 1][:5]]}")
    if time.size > 1 and not (time[1:] > time[:-1]).all():
        first = int(np.argmax(~(time[1:] > time[:-1])))
        _fail("coordinate 'time'", "epochs sorted in increasing order",
              f"{time[first]} followed by {time[first + 1]} at position {first}")


def _check_variables(ds: xr.Dataset, kind: str, require: tuple[str, ...]) -> None:
    for name in require:
        if name not in ds.variables:
            _fail(f"variable {name!r}", f"present in the {kind} STM",
                  f"variables {sorted(map(str, ds.data_vars))}")
    for name, expected_kind in VARIABLE_KINDS.items():
        if name not in ds.data_vars:
            continue
        var = ds[name]
        found_kind = var.dtype.kind
        ok = found_kind == expected_kind or (expected_kind == "i" and found_kind == "u")
        if not ok:
            _fail(f"variable {name!r}", f"{_KIND_NAMES[expected_kind]} dtype",
                  f"dtype {var.dtype}")
        dims = DIMS[kind]
        lead = dims[:-1]
        if any(d not in var.dims for d in lead):
            _fail(f"variable {name!r}", f"dims including {lead}", f"dims {var.dims}")


def _check_coords(ds: xr.Dataset, kind: str, unique_positions: bool = False) -> None:
    for name in FINITE_COORDS:
        if name not in ds.coords:
            continue
        if ds[name].dtype.kind not in "iuf":
            _fail(f"coordinate {name!r}", "numbers (integer or floating point)",
                  f"dtype {ds[name].dtype}")
        if kind == "raster" and ds[name].chunks is not None:
            continue  # a lazy per-pixel grid is checked by its reader, not computed here
        # .data, not .values: a chunked coordinate is counted where its chunks are (NumPy's
        # ufunc and sum stay a Dask reduction), never gathered: on a cluster the whole
        # coordinate would be concatenated on one worker (at 10^7 points a 1 GB worker
        # holding the chain's result was restarted there)
        data = ds[name].data
        bad = int((~np.isfinite(data)).sum()) if data.dtype.kind == "f" else 0
        if bad:
            _fail(f"coordinate {name!r}", "finite values", f"{bad} NaN/inf value(s)")
    if unique_positions and kind == "points" and {"azimuth", "range"} <= set(ds.coords):
        _check_unique_positions(np.asarray(ds["azimuth"].values),
                                np.asarray(ds["range"].values))
    if kind == "arcs":
        for name in ("source", "target"):
            if name not in ds.coords and name not in ds.data_vars:
                _fail(f"coordinate {name!r}", "indices into 'space' for each arc",
                      "no such coordinate")
            if ds[name].dtype.kind not in "iu":
                _fail(f"coordinate {name!r}", "integer dtype", f"dtype {ds[name].dtype}")


def _check_unique_positions(azimuth: np.ndarray, range_: np.ndarray) -> None:
    """No two points at one (azimuth, range): O(n) when in Morton order, as stores are."""
    if azimuth.size < 2 or azimuth.dtype.kind not in "iu" or range_.dtype.kind not in "iu":
        return
    try:
        key = morton_key(azimuth, range_)
    except ValueError:  # indices outside [0, 2**32): sort the pairs instead
        order = np.lexsort((range_, azimuth))
        rows, cols = azimuth[order].astype(np.int64), range_[order].astype(np.int64)
        same = (rows[1:] == rows[:-1]) & (cols[1:] == cols[:-1])
    else:
        if not (key[1:] >= key[:-1]).all():
            key = np.sort(key)
        same = key[1:] == key[:-1]
    if same.any():
        _fail("coordinates ('azimuth', 'range')", "one point per pixel position",
              f"{int(same.sum())} duplicated position(s)")


def _check_wavelength(ds: xr.Dataset) -> None:
    if "wavelength" not in ds.attrs:
        _fail("attribute 'wavelength'", "the radar wavelength in metres",
              "no 'wavelength' attribute")
    try:
        wavelength = float(ds.attrs["wavelength"])
    except (TypeError, ValueError):
        _fail("attribute 'wavelength'", "a number in metres", repr(ds.attrs["wavelength"]))
    if not (1e-3 < wavelength < 1.0):
        _fail("attribute 'wavelength'", "a radar wavelength in metres (0.001 .. 1)",
              f"{wavelength!r}")


def validate(
    ds: xr.Dataset,
    kind: str = "points",
    *,
    require: tuple[str, ...] | list[str] = (),
    require_wavelength: bool | None = False,
    unique_positions: bool = False,
) -> xr.Dataset:
    """Check that ``ds`` follows the STM conventions of docs/design.md, "Data model".

    Parameters
    ----------
    ds
        The Dataset to check; it is returned unchanged.
    kind
        ``"points"`` (dims ``space, time``), ``"arcs"`` (``arc, time`` with ``source`` and
        ``target``) or ``"raster"`` (``azimuth, range, time``).
    require
        Variables that must be present.
    require_wavelength
        Require the ``wavelength`` attribute (needed for any phase-to-metre conversion). ``None``
        requires it only when a phase variable (``complex`` or ``phase``) is present. A
        ``wavelength`` that is present is always checked.
    unique_positions
        Refuse two points at the same (``azimuth``, ``range``) (points STMs); readers of
        point files and ``save_stm`` ask for it.

    Raises
    ------
    STMValidationError
        Naming the variable, what was expected and what was found.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> ds = xr.Dataset({"phase": (("space", "time"), np.zeros((2, 3), "f4"))},
    ...                 coords={"time": np.array(["2020-01-01", "2020-01-13", "2020-01-25"],
    ...                                          dtype="datetime64[ns]")},
    ...                 attrs={"wavelength": 0.0555})
    >>> validate(ds).sizes["space"]
    2
    """
    if not isinstance(ds, xr.Dataset):
        _fail("input", "an xarray.Dataset", type(ds).__name__)
    if kind not in DIMS:
        _fail("argument 'kind'", f"one of {sorted(DIMS)}", repr(kind))
    _check_dims(ds, kind)
    _check_time(ds)
    _check_variables(ds, kind, tuple(require))
    _check_coords(ds, kind, unique_positions)
    if require_wavelength is None:
        require_wavelength = any(v in ds.data_vars for v in PHASE_VARIABLES)
    if require_wavelength or "wavelength" in ds.attrs:
        _check_wavelength(ds)
    return ds


def years_since_mother(ds: xr.Dataset) -> np.ndarray:
    """Time baselines of ``ds`` in years of 365.25 days from its mother epoch.

    The origin is ``attrs["mother_time"]`` (single-mother products), else the first epoch: the
    one origin of the chain's time baselines (docs/design.md, "Data model"), through
    :func:`depsi.conventions.years_since`.

    Returns
    -------
    numpy.ndarray
        float64 ``(time,)``.

    Raises
    ------
    STMValidationError
        When ``time`` does not hold dates.

    Examples
    --------
    >>> ds = xr.Dataset(coords={"time": np.array(["2020-01-01", "2021-01-01"], "datetime64[ns]")},
    ...                 attrs={"mother_time": "2021-01-01"})
    >>> years_since_mother(ds).round(3).tolist()
    [-1.002, 0.0]
    """
    time = np.asarray(ds["time"].values)
    if time.dtype.kind != "M":
        raise STMValidationError(
            f"coordinate 'time': expected datetime64 acquisition dates to form time baselines, "
            f"found dtype {time.dtype} (values {time[:3].tolist()}...); assign the dates, e.g. "
            f"ds.assign_coords(time=np.datetime64('2016-03-27') + 11 * np.timedelta64(1, 'D') "
            f"* ds.time.values) for an 11-day Sentinel-1 stack")
    mother = ds.attrs.get("mother_time")
    return years_since(time, time[0] if mother is None else np.datetime64(str(mother)))


def h2ph_rows(h2ph: xr.DataArray, rows: slice | np.ndarray, n_epochs: int) -> np.ndarray:
    """``h2ph`` (space first; per point, or per point and epoch) of the points ``rows`` as
    float64 ``(rows, epochs)``: per-point values broadcast over the epochs, without a copy.

    Examples
    --------
    >>> h2ph = xr.DataArray(np.array([1e-4, 2e-4, 3e-4], np.float32), dims="space")
    >>> h2ph_rows(h2ph, slice(1, 3), 2).shape
    (2, 2)
    """
    values = np.asarray(h2ph.isel(space=rows).values, dtype=np.float64)
    return np.broadcast_to(values.reshape(values.shape[0], -1), (values.shape[0], n_epochs))
