"""Read DePSI-style point exports in CSV (one row per point) into a point STM.

Columns ``pnt_*`` are per-point attributes; columns ``<prefix>_YYYYMMDD`` are per-epoch values,
grouped by prefix into (space, time) variables. ``from_csv`` carries stmtools' name and by
default returns what ``stmtools.from_csv`` returns; ``names="depsi"`` gives depsi's names
(docs/design.md, "Data model") in Morton order of (azimuth, range).
"""

from __future__ import annotations

import codecs
import io
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import xarray as xr

from depsi.stm.order import morton_order
from depsi.stm.schema import STMValidationError, validate

logger = logging.getLogger(__name__)

#: Per-epoch column prefixes and the variable each becomes; unknown prefixes keep their name.
PREFIX_NAMES = {
    "d": "displacement",
    "def": "displacement",
    "a": "amplitude",
    "amp": "amplitude",
    "h2ph": "h2ph",
}

#: Point columns renamed to depsi's coordinate names; other ``pnt_*`` columns lose the prefix.
POINT_NAMES = {
    "pnt_id": "point_id",
    "pnt_lat": "lat",
    "pnt_lon": "lon",
    "pnt_line": "azimuth",
    "pnt_pixel": "range",
}

#: Point columns that become coordinates (the rest become data variables).
COORDINATES = ("point_id", "lat", "lon", "azimuth", "range")

#: Point columns that must hold whole numbers (pixel indices).
INTEGER_COORDINATES = ("azimuth", "range")

#: dtype of every per-epoch variable. The exports carry 5 decimals (0.01 mm for displacement in
#: metres); float32 resolves 6e-8 m at 1 m, far below that, and halves memory at 10^7 x 300.
EPOCH_DTYPE = np.dtype(np.float32)

#: Rows parsed at a time, so that peak memory is the result plus one block of float64 text.
ROWS_PER_READ = 200_000

UNITS = {"displacement": "m", "lat": "degrees_north", "lon": "degrees_east", "h2ph": "1"}

_EPOCH_COLUMN = re.compile(r"^(?P<prefix>.+)_(?P<date>\d+)$")

#: The naming conventions of ``from_csv``: stmtools' (the default, as stmtools' own
#: ``from_csv``) or depsi's (docs/design.md, "Data model").
NAMES = ("stmtools", "depsi")

#: stmtools 0.1.4's defaults (``stmtools._io.from_csv``), the defaults of ``from_csv``.
STMTOOLS_SPACE_PATTERN = "^pnt_"
STMTOOLS_SPACETIME_PATTERN = {"^d_": "deformation", "^a_": "amplitude", "^h2ph_": "h2ph"}
STMTOOLS_COORDS_COLS = {"pnt_lat": "lat", "pnt_lon": "lon"}
#: stmtools' Dask read block (bytes); its result's space chunk is the rows of the first block,
#: rounded up to STMTOOLS_CHUNK_ROUNDING when the file has more than one block.
STMTOOLS_BLOCKSIZE = 200e6
STMTOOLS_CHUNK_ROUNDING = 5000


#: Longest line accepted (header or row). A DePSI export of 1000 epochs and 5 per-epoch
#: variables has rows of about 75 kB; a longer line is no point table (a binary file, a
#: file without line breaks) and is refused before pandas buffers it whole.
MAX_LINE_BYTES = 1 * 2**20

#: Largest CSV file accepted: 10^7 points x 300 epochs x 2 variables at 10 bytes a value is
#: 60 GB; a larger file would take longer to parse than to re-export as Zarr.
MAX_CSV_BYTES = 64 * 2**30

#: Longest header line read when looking for duplicate column names.
MAX_HEADER_BYTES = MAX_LINE_BYTES

#: Valid ranges (degrees) of the ``lat`` and ``lon`` columns; longitudes may be given
#: east-positive from 0 to 360 as well as from -180 to 180.
LAT_RANGE = (-90.0, 90.0)
LON_RANGE = (-180.0, 360.0)


class _CheckedFile(io.RawIOBase):
    """A CSV file read as UTF-8 and in lines of at most MAX_LINE_BYTES, checked as it is read.

    Invalid UTF-8 is refused with its byte offset (not read as latin-1: a silently mis-decoded
    point identifier would not match its source); a longer line is refused at once, without
    reading it whole. Each read returns at most MAX_LINE_BYTES, so a too-long line always
    crosses a read and is seen by the count of bytes since the last line break.
    """

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._offset = 0
        self._line = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._file.read(min(len(buffer), MAX_LINE_BYTES))
        self._check(data)
        buffer[:len(data)] = data
        return len(data)

    def _check(self, data: bytes) -> None:
        pending = len(self._decoder.getstate()[0])
        try:
            self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as err:
            at = self._offset - pending + err.start
            raise STMValidationError(
                f"CSV file {str(self.path)!r}: expected UTF-8 text, found the byte(s) "
                f"{err.object[err.start:err.end]!r} at byte offset {at} ({err.reason}); "
                "re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
        first, last = data.find(b"\n"), data.rfind(b"\n")
        if first == -1:
            self._line += len(data)
        else:
            longest = self._line + first
            self._line = len(data) - last - 1
            if longest > MAX_LINE_BYTES:
                self._too_long(self._offset + first)
        if self._line > MAX_LINE_BYTES:
            self._too_long(self._offset + len(data))
        self._offset += len(data)

    def _too_long(self, at: int) -> None:
        raise STMValidationError(
            f"CSV file {str(self.path)!r}: expected lines of at most {MAX_LINE_BYTES} bytes "
            f"(MAX_LINE_BYTES), found a longer one ending at or after byte offset {at}")

    def close(self) -> None:
        self._file.close()
        super().close()


def _open_checked(path: Path) -> io.BufferedReader:
    """The file for pandas, after checking that it is a regular file of a sane size."""
    if not path.exists():
        raise FileNotFoundError(f"CSV file {str(path)!r} does not exist")
    if not path.is_file():
        raise STMValidationError(f"CSV file {str(path)!r}: expected a regular file, found "
                                 "a directory or device")
    size = path.stat().st_size
    if size > MAX_CSV_BYTES:
        raise STMValidationError(f"CSV file {str(path)!r}: expected at most {MAX_CSV_BYTES} "
                                 f"bytes (MAX_CSV_BYTES), found {size}")
    return io.BufferedReader(_CheckedFile(path), buffer_size=2**16)


def _check_unique_header(path: Path, sep: str) -> None:
    """pandas renames a repeated column (``d_20160327.1``): refuse it before that happens."""
    import csv

    with _open_checked(path) as f:
        line = f.readline(MAX_HEADER_BYTES + 1).decode("utf-8", errors="replace")
    if len(sep) != 1:
        return  # a regular-expression separator: pandas' own parser decides
    names = next(csv.reader([line], delimiter=sep), [])
    seen, repeated = set(), []
    for name in names:
        if name in seen and name not in repeated:
            repeated.append(name)
        seen.add(name)
    if repeated:
        raise STMValidationError(
            f"CSV file {str(path)!r}: expected each column name once, found {repeated[:5]} "
            "more than once")


def _read_header(path: Path, sep: str) -> list[str]:
    try:
        _check_unique_header(path, sep)
        with _open_checked(path) as f:
            return list(pd.read_csv(f, sep=sep, nrows=0, encoding="utf-8").columns)
    except FileNotFoundError:
        raise FileNotFoundError(f"CSV file {str(path)!r} does not exist") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise STMValidationError(
            f"CSV file {str(path)!r}: expected a header row of column names, found: {err}"
        ) from err


def _pattern_prefix(column: str, patterns: Mapping[str, str] | None,
                    space: re.Pattern | None) -> tuple[str, str] | None:
    """(prefix or pattern, date digits) of a per-epoch column; None for a point column."""
    if patterns is None:
        if (space.match(column) if space is not None else column.startswith("pnt_")):
            return None
        match = _EPOCH_COLUMN.match(column)
        return None if match is None else (match["prefix"], match["date"])
    if space is not None and space.match(column):
        return None  # as stmtools: a point column even if a per-epoch pattern matches too
    for pattern in patterns:
        if re.match(pattern, column):
            return pattern, column.rsplit("_", 1)[-1]
    return None


def _check_patterns(columns: list[str], path: Path, space_pattern: str | None,
                    spacetime_pattern: Mapping[str, str] | None) -> None:
    """As stmtools: every pattern given must match at least one column."""
    for pattern in ([space_pattern] if space_pattern is not None else []) + list(
            spacetime_pattern or {}):
        if not any(re.match(pattern, c) for c in columns):
            raise STMValidationError(
                f"CSV file {str(path)!r}: expected pattern {pattern!r} to match a column, "
                f"found none among {columns[:8]}{' ...' if len(columns) > 8 else ''}")


def _epoch_columns(columns: list[str], path: Path, names: Mapping[str, str],
                   patterns: Mapping[str, str] | None = None,
                   space: re.Pattern | None = None):
    """Map each per-epoch column to (variable, date); check the dates and the prefixes."""
    epochs: dict[str, tuple[str, np.datetime64]] = {}
    prefix_of: dict[str, str] = {}
    for column in columns:
        found = _pattern_prefix(column, patterns, space)
        if found is None:
            continue
        prefix, digits = found
        try:
            if len(digits) != 8:
                raise ValueError("not 8 digits")
            date = np.datetime64(pd.to_datetime(digits, format="%Y%m%d"), "ns")
        except ValueError:
            raise STMValidationError(
                f"column {column!r} in {str(path)!r}: expected a date YYYYMMDD after "
                f"'{prefix}_', found {digits!r}"
            ) from None
        name = patterns[prefix] if patterns is not None else names.get(prefix, prefix)
        if prefix_of.setdefault(name, prefix) != prefix:
            raise STMValidationError(
                f"CSV file {str(path)!r}: expected one column prefix per variable, found "
                f"'{prefix_of[name]}_' and '{prefix}_' both mapping to {name!r}"
            )
        epochs[column] = (name, date)
    if not epochs:
        raise STMValidationError(
            f"CSV file {str(path)!r}: expected per-epoch columns named <prefix>_YYYYMMDD "
            f"(e.g. d_20160327), found none among {len(columns)} columns {columns[:8]}"
        )
    return epochs


def _point_name(column: str) -> str:
    if column in POINT_NAMES:
        return POINT_NAMES[column]
    return column[len("pnt_"):] if column.startswith("pnt_") else column


def _point_array(series: pd.Series, name: str, path: Path) -> np.ndarray:
    if name in (*INTEGER_COORDINATES, "lat", "lon") and not pd.api.types.is_numeric_dtype(series):
        bad = series[pd.to_numeric(series, errors="coerce").isna() & series.notna()]
        raise STMValidationError(
            f"column {series.name!r} in {str(path)!r}: expected numbers, found "
            f"{len(bad)} non-numeric value(s) such as "
            f"{str(bad.iloc[0])[:40] if len(bad) else ''!r}")
    if name == "point_id" or series.name == "pnt_id" or not (
            pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)):
        # fixed-width unicode of the longest value: nothing is truncated in Zarr or NetCDF
        return series.fillna("").astype(str).to_numpy(dtype=str)
    if name in INTEGER_COORDINATES:
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
        missing = ~np.isfinite(values)
        fractional = ~missing & (values != np.round(values))
        if missing.any() or fractional.any():
            raise STMValidationError(
                f"column {series.name!r} in {str(path)!r}: expected whole pixel indices, "
                f"found {int(missing.sum())} missing and {int(fractional.sum())} fractional "
                "value(s)"
            )
        return values.astype(np.int64)
    if name in ("lat", "lon"):
        return series.to_numpy(dtype=np.float64)
    return series.to_numpy()


def _epoch_block(frame: pd.DataFrame, epochs, variables, times, path: Path, dtype):
    """The per-epoch columns of one block of rows as {variable: (rows, time) ``dtype``}."""
    out = {}
    for name in variables:
        columns = [c for c, (n, _) in epochs.items() if n == name]
        where = np.searchsorted(times, [epochs[c][1] for c in columns])
        try:
            values = frame[columns].to_numpy(dtype=np.float64)
        except (ValueError, TypeError) as err:
            raise STMValidationError(
                f"columns of {name!r} in {str(path)!r}: expected numbers, found: {err}"
            ) from err
        block = np.full((len(frame), times.size), np.nan, dtype=dtype)
        block[:, where] = values.astype(dtype)
        out[name] = block
    return out


def _read_blocks(path: Path, sep: str, usecols: list[str], point_columns, epochs,
                 point_name=None, dtype=EPOCH_DTYPE):
    name_of = point_name or _point_name
    variables = list(dict.fromkeys(name for name, _ in epochs.values()))
    times = np.unique(np.array([date for _, date in epochs.values()], dtype="datetime64[ns]"))
    points: dict[str, list[np.ndarray]] = {name_of(c): [] for c in point_columns}
    series: dict[str, list[np.ndarray]] = {name: [] for name in variables}
    with _open_checked(path) as f:
        reader = pd.read_csv(f, sep=sep, usecols=usecols, chunksize=ROWS_PER_READ,
                             dtype={"pnt_id": str}, encoding="utf-8")
        for frame in reader:
            for column in point_columns:
                name = name_of(column)
                points[name].append(_point_array(frame[column], name, path))
            for name, block in _epoch_block(frame, epochs, variables, times, path,
                                            dtype).items():
                series[name].append(block)
    joined_points = {n: np.concatenate(v) for n, v in points.items()}
    for column in point_columns:
        _check_degrees(joined_points[name_of(column)], column, path)
    joined_series = {n: np.concatenate(v) for n, v in series.items()}
    return joined_points, joined_series, times


def _check_degrees(values: np.ndarray, column: str, path: Path) -> None:
    """Latitudes within LAT_RANGE, longitudes within LON_RANGE (missing values: the schema's)."""
    bounds = {"lat": LAT_RANGE, "lon": LON_RANGE}.get(_point_name(column))
    if bounds is None or values.dtype.kind not in "fiu":
        return
    with np.errstate(invalid="ignore"):
        outside = (values < bounds[0]) | (values > bounds[1])
    if outside.any():
        raise STMValidationError(
            f"column {column!r} in {str(path)!r}: expected degrees in [{bounds[0]:g}, "
            f"{bounds[1]:g}], found {int(outside.sum())} of {values.size} rows outside, "
            f"such as {float(values[outside][0])!r}")


def _chunk_bytes(blocksize: int | float | str) -> int:
    if isinstance(blocksize, str):
        from dask.utils import parse_bytes

        return parse_bytes(blocksize)
    if isinstance(blocksize, (int, np.integer)) and blocksize > 0:
        return int(blocksize)
    if isinstance(blocksize, (float, np.floating)) and blocksize >= 1 and float(
            blocksize).is_integer():  # stmtools' default is written 200e6
        return int(blocksize)
    raise ValueError(
        f"blocksize: expected bytes per space chunk (e.g. 64_000_000 or '64MB'), "
        f"found {blocksize!r}"
    )


def from_csv(
    path: str | os.PathLike,
    space_pattern: str | None = None,
    spacetime_pattern: Mapping[str, str] | None = None,
    coords_cols: Sequence[str] | Mapping[str, str] | None = None,
    output_chunksize: Mapping[str, int] | None = None,
    blocksize: int | str | None = None,
    *,
    names: Literal["stmtools", "depsi"] = "stmtools",
    prefixes: Mapping[str, str] | None = None,
    sep: str = ",",
) -> xr.Dataset:
    """Read a DePSI-style CSV export into a point STM (dims ``space``, ``time``).

    Called as stmtools' users call ``stmtools.from_csv`` (its positional order and defaults),
    it returns what stmtools 0.1.4 returns; ``names="depsi"`` reads by depsi's conventions.

    Parameters
    ----------
    path
        The CSV file: one row per point, an optional unnamed index column first.
    space_pattern, spacetime_pattern, coords_cols, output_chunksize, blocksize
        stmtools' arguments, with stmtools' meaning and, for ``names="stmtools"``, stmtools'
        defaults: ``space_pattern`` (default ``STMTOOLS_SPACE_PATTERN``, ``"^pnt_"``):
        regular expression of the point columns; columns matching no pattern are skipped with
        a warning. ``spacetime_pattern`` (default ``STMTOOLS_SPACETIME_PATTERN``: ``^d_`` ->
        ``deformation``, ``^a_`` -> ``amplitude``, ``^h2ph_`` -> ``h2ph``): {regular
        expression: variable name} of the per-epoch columns (the date is the text after the
        last ``_``). ``coords_cols`` (default ``STMTOOLS_COORDS_COLS``: ``pnt_lat`` -> ``lat``,
        ``pnt_lon`` -> ``lon``): the point columns that become coordinates, a list, or a dict
        that also renames them; the other point columns keep their CSV names (``pnt_id``,
        ``pnt_line``, ...). ``output_chunksize``: chunks of the result, e.g.
        ``{"space": 5000, "time": -1}``. ``blocksize`` (default ``STMTOOLS_BLOCKSIZE``, bytes):
        as stmtools' Dask read block, it sets the default space chunk (the rows of one block,
        rounded up to 5000 when the file has more blocks). A pattern that matches no column
        raises. For ``names="depsi"`` the three patterns are optional (None: depsi's
        prefixes, below) and ``blocksize`` is the target bytes of one space chunk (None:
        NumPy-backed result).
    names
        ``"stmtools"`` (default): stmtools' names, dtypes and file order, Dask-backed.
        ``"depsi"``: docs/design.md, "Data model" names (``displacement``, ``amplitude``, ``h2ph``,
        ``point_id``, ``lat``, ``lon``, ``azimuth``, ``range``; other ``pnt_*`` columns lose
        the prefix), float32 per-epoch values (``EPOCH_DTYPE``), Morton order of (azimuth,
        range), unique positions required.
    prefixes
        ``names="depsi"`` only: extra or overriding per-epoch prefixes -> variable names, on
        top of ``PREFIX_NAMES`` (``d``/``def`` -> ``displacement``, ``a``/``amp`` ->
        ``amplitude``, ``h2ph`` -> ``h2ph``); other prefixes keep their name.
    sep
        Column separator.

    Returns
    -------
    xarray.Dataset
        ``names="stmtools"``: as stmtools, coordinates ``space`` (0, 1, ... in file order),
        ``time`` (datetime64[ns]) and the ``coords_cols``; point columns with pandas' dtype,
        ``pnt_id`` as text; per-epoch values float64; chunked by ``output_chunksize``.
        ``names="depsi"``: coordinates ``time``, ``point_id`` (fixed-width unicode),
        ``lat``/``lon`` (float64), ``azimuth``/``range`` (int64); per-epoch variables float32,
        NaN where a variable lacks a date. ``attrs["source_file"]`` holds the file name.

    Raises
    ------
    STMValidationError
        No per-epoch column; a column whose digits are no valid date; two prefixes for one
        variable; non-integer pixel indices; non-numeric epoch values; a pattern that matches
        no column (a ``ValueError``, as in stmtools).
    ValueError
        An unknown ``names``; ``prefixes`` with ``names="stmtools"``.

    Notes
    -----
    Differences from stmtools' ``from_csv`` kept on purpose (docs/migration.md): ``pnt_id``
    keeps its whole text (stmtools 0.1.4 keeps one character with current pandas/dask); dates
    must be YYYYMMDD (stmtools falls back to epoch numbers 0, 1, ...).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "ps.csv"
    >>> _ = f.write_text("pnt_id,pnt_line,pnt_pixel,pnt_lat,pnt_lon,d_20160327,d_20160407\\n"
    ...                  "L1P1,1,1,52.1,4.9,0.0,0.001\\nL0P0,0,0,52.0,4.8,0.0,-0.002\\n")
    >>> ds = from_csv(f, spacetime_pattern={"^d_": "deformation"})
    >>> ds.pnt_id.values.tolist(), ds.deformation.dtype.name
    (['L1P1', 'L0P0'], 'float64')
    >>> ds = from_csv(f, names="depsi")
    >>> ds.point_id.values.tolist(), ds.displacement.dtype.name
    (['L0P0', 'L1P1'], 'float32')
    """
    if names not in NAMES:
        raise ValueError(f"names: expected one of {NAMES}, found {names!r}")
    path = Path(path)
    stmtools_names = names == "stmtools"
    if stmtools_names:
        if prefixes is not None:
            raise ValueError("prefixes: expected with names='depsi' only; with stmtools' names "
                             f"map columns by spacetime_pattern, found prefixes={prefixes!r}")
        space_pattern = STMTOOLS_SPACE_PATTERN if space_pattern is None else space_pattern
        spacetime_pattern = (dict(STMTOOLS_SPACETIME_PATTERN) if spacetime_pattern is None
                             else spacetime_pattern)
        coords_cols = dict(STMTOOLS_COORDS_COLS) if coords_cols is None else coords_cols
    columns = _read_header(path, sep)
    prefix_names = {**PREFIX_NAMES, **(prefixes or {})}
    index_column = columns[0] if columns and (columns[0] == "" or
                                              columns[0].startswith("Unnamed: 0")) else None
    columns = [c for c in columns if c != index_column]
    stmtools_style = coords_cols is not None or spacetime_pattern is not None
    _check_patterns(columns, path, space_pattern, spacetime_pattern)
    space = re.compile(space_pattern) if space_pattern is not None else None
    epochs = _epoch_columns(columns, path, prefix_names, spacetime_pattern, space)
    point_columns = [c for c in columns if c not in epochs]
    if space is not None:
        skipped = [c for c in point_columns if not space.match(c)]
        if skipped:
            logger.warning("%s: columns matching no pattern are skipped: %s", path, skipped)
        point_columns = [c for c in point_columns if space.match(c)]
    renames = _coordinate_names(coords_cols, point_columns, path)
    point_name: Callable[[str], str] = (
        (lambda c: renames.get(c, c)) if stmtools_style else _point_name)
    coordinates = set(renames.values()) if coords_cols is not None else set(COORDINATES)
    point_names = [point_name(c) for c in point_columns]
    clash = {n for n in point_names if point_names.count(n) > 1} | (
        set(point_names) & {n for n, _ in epochs.values()})
    if clash:
        raise STMValidationError(
            f"CSV file {str(path)!r}: expected distinct variable names, found {sorted(clash)} "
            "from more than one column"
        )
    unknown = [c for c in point_columns if not c.startswith("pnt_")]
    if unknown and space is None:
        logger.info("%s: columns without pnt_ prefix read as point attributes: %s", path, unknown)

    points, series, times = _read_blocks(
        path, sep, list(dict.fromkeys([*point_columns, *epochs])), point_columns, epochs,
        point_name, np.dtype(np.float64) if stmtools_names else EPOCH_DTYPE)
    if not stmtools_names:
        points, series = _morton_sorted(points, series, point_name, point_columns, path)

    coords = {"time": times}
    if stmtools_names:
        coords["space"] = np.arange(len(next(iter(series.values()))))
    coords |= {n: ("space", v) for n, v in points.items() if n in coordinates}
    data = {n: ("space", v) for n, v in points.items() if n not in coordinates}
    data |= {n: (("space", "time"), v) for n, v in series.items()}
    ds = xr.Dataset(data, coords=coords, attrs={"source_file": path.name})
    for name, units in UNITS.items():
        if name in ds.variables:
            ds[name].attrs["units"] = units
    validate(ds, kind="points", unique_positions=not stmtools_style)
    if stmtools_names and output_chunksize is None:
        output_chunksize = {"space": _stmtools_space_chunk(
            path, ds.sizes["space"], STMTOOLS_BLOCKSIZE if blocksize is None else blocksize),
            "time": -1}
    if output_chunksize is not None:
        ds = ds.chunk(dict(output_chunksize))
    elif blocksize is not None:
        from depsi.io.store import space_chunk_size

        ds = ds.chunk({"space": space_chunk_size(ds, _chunk_bytes(blocksize)), "time": -1})
    logger.info("read %d points x %d epochs from %s", ds.sizes["space"], ds.sizes["time"], path)
    return ds


def _morton_sorted(points, series, point_name, point_columns, path):
    """Points and series in Morton order of (azimuth, range), when both columns are there."""
    pixel = {"azimuth": point_name("pnt_line") if "pnt_line" in point_columns else "azimuth",
             "range": point_name("pnt_pixel") if "pnt_pixel" in point_columns else "range"}
    if pixel["azimuth"] not in points or pixel["range"] not in points:
        logger.warning("%s: no pnt_line/pnt_pixel columns; points kept in file order", path)
        return points, series
    order = morton_order(points[pixel["azimuth"]], points[pixel["range"]])
    return {n: v[order] for n, v in points.items()}, {n: v[order] for n, v in series.items()}


def _stmtools_space_chunk(path: Path, rows: int, blocksize: int | float | str) -> int:
    """stmtools' default space chunk: the rows of its first Dask read block of ``blocksize``
    bytes, rounded up to STMTOOLS_CHUNK_ROUNDING when the file has more than one block."""
    block = _chunk_bytes(blocksize)
    size = path.stat().st_size
    if size <= block or rows == 0:
        return max(rows, 1)
    per_block = math.ceil(rows * block / size)
    return math.ceil(per_block / STMTOOLS_CHUNK_ROUNDING) * STMTOOLS_CHUNK_ROUNDING


def _coordinate_names(coords_cols, point_columns: list[str], path: Path) -> dict[str, str]:
    """{column: coordinate name} from stmtools' ``coords_cols`` (a list or a renaming dict)."""
    if coords_cols is None:
        return {}
    if isinstance(coords_cols, Mapping):
        renames = dict(coords_cols)
    elif isinstance(coords_cols, str):
        renames = {coords_cols: coords_cols}
    else:
        renames = {c: c for c in coords_cols}
    missing = [c for c in renames if c not in point_columns]
    if missing:
        raise STMValidationError(
            f"coords_cols {missing}: expected point columns of {str(path)!r}, found "
            f"{point_columns[:8]}{' ...' if len(point_columns) > 8 else ''}")
    return renames
