"""GAMMA Remote Sensing stacks: parameter files (``.par``), coregistered SLC stacks in, and out.

:func:`parse_par` reads any GAMMA parameter file (ISP ``*_slc.par`` / ``*_mli.par``, DIFF&GEO
DEM ``.par``, ``*_base.par`` baseline models, ``*_bperp.par`` baseline tables) into numbers;
:func:`from_gamma` opens a coregistered stack (one big-endian SLC per date with its ``.par``)
lazily with its orbit geometry; :func:`write_gamma` writes a raster stack as such a folder.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from dask.base import tokenize

from depsi.conventions import SPEED_OF_LIGHT
from depsi.io.geometry import (
    WGS84_A,
    WGS84_F,
    GeometryMode,
    Orbit,
    RadarGrid,
    StackGeometry,
    attach_geometry,
    ecef_to_geodetic,
    enu_basis,
    geodetic_to_ecef,
    look_geometry,
    radar_to_geo,
    zero_doppler_time,
)
from depsi.io.metadata import (
    MAX_LINE_CHARS,
    WAVELENGTH_RTOL,
    MetadataError,
    _raise_problems,
    read_bounded_text,
)
from depsi.io.raster import (
    RASTER_DIMS,
    _BinaryStack,
    _check_exist,
    _chunks,
    _epochs,
    _file_dtype,
    _path_list,
    _raster,
)
from depsi.stm.schema import validate

logger = logging.getLogger(__name__)

#: GAMMA ``image_format`` of complex SLCs and the on-disk dtype each names (GAMMA binary data
#: are big-endian): FCOMPLEX = float32 I/Q pairs, SCOMPLEX = int16 I/Q pairs.
SLC_FORMATS = {"FCOMPLEX": (np.complex64, ">"), "SCOMPLEX": ("complex_int16", ">")}

#: Suffixes of GAMMA SLC data files: ``.slc`` as acquired, ``.rslc`` resampled to the mother.
SLC_SUFFIXES = (".slc", ".rslc")

#: Interval (s) of the state vectors :func:`write_gamma` samples from each orbit, as GAMMA's
#: Sentinel-1 import writes them.
STATE_VECTOR_INTERVAL = 10.0

#: Columns of the table of a ``*_bperp.par`` file (GAMMA ``base_perp``), in file order: line,
#: range sample, baseline components B_t, B_c, B_n (m, TCN frame), look angle (deg), parallel
#: and perpendicular baseline and baseline length (m).
BPERP_COLUMNS = ("line", "range", "B_t", "B_c", "B_n", "look_angle", "bpara", "bperp", "blen")

#: The ``sensor:`` line's last word, when it is one of these, is the polarisation.
POLARISATIONS = ("HH", "HV", "VH", "VV")

# ----------------------------------------------------------------------------------------------
# Parameter files
# ----------------------------------------------------------------------------------------------

#: Largest GAMMA parameter file read, in bytes: a real one is under 100 kB (a bperp table of a
#: few hundred rows); refused from its size, before it is read.
MAX_PAR_BYTES = 16 * 2**20

# \d+(?:\.\d*)? rather than \d+\.?\d*, whose overlapping digit runs backtrack quadratically
_NUMBER = re.compile(r"^[-+]?(\d+(?:\.\d*)?|\.\d+)([eE][-+]?\d+)?$")
_INTEGER = re.compile(r"^[-+]?\d+$")
_DATE_IN_NAME = re.compile(r"(?<!\d)((?:19|20)\d{6})(?!\d)")

#: Fields whose value is free text (kept whole, with any digits in it).
_TEXT = {"title", "sensor", "image_format", "image_geometry", "azimuth_deskew",
         "DEM_projection", "data_format", "ellipsoid_name", "datum_name", "datum_country_list",
         "projection_name"}
_INT = {"line_header_size", "range_samples", "azimuth_lines", "range_looks", "azimuth_looks",
        "number_of_state_vectors", "width", "nlines", "interferogram_lines"}
_FLOAT = {"start_time", "center_time", "end_time", "azimuth_line_time", "range_scale_factor",
          "azimuth_scale_factor", "center_latitude", "center_longitude", "heading",
          "range_pixel_spacing", "azimuth_pixel_spacing", "near_range_slc", "center_range_slc",
          "far_range_slc", "incidence_angle", "azimuth_angle", "radar_frequency",
          "adc_sampling_rate", "chirp_bandwidth", "prf", "azimuth_proc_bandwidth",
          "receiver_gain", "calibration_gain", "sar_to_earth_center",
          "earth_radius_below_sensor", "earth_semi_major_axis", "earth_semi_minor_axis",
          "time_of_first_state_vector", "state_vector_interval", "DEM_hgt_offset", "DEM_scale",
          "corner_lat", "corner_lon", "post_lat", "post_lon", "corner_north", "corner_east",
          "post_north", "post_east", "ellipsoid_ra", "ellipsoid_reciprocal_flattening",
          "unwrap_phase_constant", "slc_1_center_baseline_length"}
_VECTOR = {"first_slant_range_polynomial": (6,), "center_slant_range_polynomial": (6,),
           "last_slant_range_polynomial": (6,), "doppler_polynomial": (4,),
           "doppler_poly_dot": (4,), "doppler_poly_ddot": (4,), "date": (3, 6),
           "initial_baseline(TCN)": (3,), "initial_baseline_rate": (3,),
           "precision_baseline(TCN)": (3,), "precision_baseline_rate": (3,),
           "orbit_baseline_vector_tcn": (3,), "orbit_baseline_rate_tcn": (3,),
           "baseline_vector_tcn": (3,), "baseline_rate_tcn": (3,)}
_STATE_VECTOR = re.compile(r"^state_vector_(position|velocity)_(\d+)$")

#: Fields each kind of file must have.
_REQUIRED = {
    "slc": ("date", "start_time", "azimuth_line_time", "range_samples", "azimuth_lines",
            "image_format", "range_pixel_spacing", "near_range_slc", "radar_frequency",
            "number_of_state_vectors"),
    "mli": ("date", "start_time", "azimuth_line_time", "range_samples", "azimuth_lines",
            "image_format", "range_pixel_spacing", "near_range_slc", "radar_frequency"),
    "dem": ("DEM_projection", "data_format", "width", "nlines"),
    "base": ("initial_baseline(TCN)", "initial_baseline_rate"),
    "bperp": ("interferogram_lines", "range_samples", "baseline_vector_tcn"),
}
_REQUIRED["image"] = _REQUIRED["mli"]
_EQA_FIELDS = ("corner_lat", "corner_lon", "post_lat", "post_lon")


def _value(text: str) -> Any:
    """A field's value: its leading numbers (units after them dropped), else its text."""
    tokens = text.split()
    numbers = []
    for token in tokens:
        if not _NUMBER.match(token):
            break
        numbers.append(token)
    if not numbers:
        return text
    if all(_INTEGER.match(t) for t in numbers):
        values = [int(t) for t in numbers]
    else:
        values = [float(t) for t in numbers]
    return values[0] if len(values) == 1 else np.array(values)


class _Problems:
    """Problems found in one file, as ``(field, expected, found)``; all reported at once."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str]] = []

    def add(self, field: str, expected: str, found: str) -> None:
        self.items.append((field, expected, found))


def _check_field(key: str, value: Any, problems: _Problems) -> Any:
    """``value`` in the type ``key`` has in GAMMA files (unknown keys as parsed)."""
    if key in _TEXT:
        return value if isinstance(value, str) else " ".join(map(str, np.ravel(value)))
    shown = repr(value) if isinstance(value, str) else str(np.ravel(value).tolist()
                                                          if np.ndim(value) else value)
    if key in _INT:
        if isinstance(value, int):
            return value
        problems.add(key, "an integer", shown)
        return None
    if key in _FLOAT:
        if isinstance(value, (int, float)) and np.isfinite(value):
            return float(value)
        problems.add(key, "a number", shown)
        return None
    sizes = _VECTOR.get(key) or ((3,) if _STATE_VECTOR.match(key) else None)
    if sizes is not None:
        vector = np.atleast_1d(value) if not isinstance(value, str) else None
        if vector is None or vector.size not in sizes:
            count = " or ".join(map(str, sizes))
            problems.add(key, f"{count} numbers", shown)
            return None
        return vector if key == "date" else vector.astype(np.float64)
    return value


def _kind(fields: dict[str, Any], header: str) -> str:
    if "DEM/MAP" in header or "DEM_projection" in fields:
        return "dem"
    if "initial_baseline(TCN)" in fields or "initial_baseline_rate" in fields:
        return "base"
    image = "Image Parameter File" in header or any(
        k in fields for k in ("image_format", "range_samples", "azimuth_lines"))
    if not image:
        return "par"
    image_format = str(fields.get("image_format", "")).upper()
    if image_format in SLC_FORMATS:
        return "slc"
    if image_format == "FLOAT":
        return "mli"
    return "slc" if "slc" in header.lower() else "image"


def _check_isp(par: dict[str, Any], kind: str, problems: _Problems) -> None:
    """Values an image parameter file must have for its grid and orbit to make sense."""
    for key in ("range_samples", "azimuth_lines"):
        if isinstance(par.get(key), int) and par[key] <= 0:
            problems.add(key, "a positive integer", str(par[key]))
    for key in ("azimuth_line_time", "range_pixel_spacing", "near_range_slc", "radar_frequency"):
        if isinstance(par.get(key), float) and not par[key] > 0:
            problems.add(key, "a positive number", str(par[key]))
    day = par.get("date")
    if isinstance(day, np.ndarray):
        try:
            if (day[:3] != np.round(day[:3])).any():
                raise ValueError("not whole numbers")
            date(int(day[0]), int(day[1]), int(day[2]))
        except ValueError as err:
            problems.add("date", "a date 'YYYY MM DD'", f"{day.tolist()} ({err})")
    n = par.get("number_of_state_vectors")
    if isinstance(n, int):
        if n < 4:
            problems.add("number_of_state_vectors", "at least 4 state vectors", str(n))
        for key in ("time_of_first_state_vector", "state_vector_interval"):
            if key not in par:
                problems.add(key, "a number (there are state vectors)", "the field is missing")
        missing = [f"state_vector_{what}_{k}" for k in range(1, n + 1)
                   for what in ("position", "velocity") if f"state_vector_{what}_{k}" not in par]
        if missing:
            problems.add(missing[0], f"{n} position and {n} velocity vectors "
                         "(number_of_state_vectors)",
                         f"{len(missing)} missing: {', '.join(missing)}")
    if kind == "slc" and str(par.get("image_format", "FCOMPLEX")).upper() not in SLC_FORMATS:
        problems.add("image_format", f"one of {sorted(SLC_FORMATS)}", repr(par["image_format"]))


def _key_value(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of a ``key: value`` line, else None: str methods in one pass, the same
    as the regex ``^\\s*([^:\\s][^:]*?)\\s*:\\s*(.*?)\\s*$`` without its quadratic
    backtracking on long lines."""
    head, colon, value = line.partition(":")
    key = head.strip()
    return (key, value.strip()) if colon and key else None


#: Characters of a key on a bperp "key: value" line (the lookahead of its values' end).
_BPERP_KEY_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz /-"
_LETTER_AFTER_SPACE = re.compile(r"(?<=\s)[A-Za-z]")
_LETTER = re.compile(r"[A-Za-z]")
_NON_SPACE = re.compile(r"\S")


def _next_key(text: str, after: int, colon: int) -> tuple[int, int] | None:
    """Start and colon of the first key that begins after ``after``: a letter after a space,
    then only letters, spaces, '/' and '-' up to a colon."""
    while colon >= 0:
        segment_start = text.rfind(":", 0, colon) + 1
        segment = text[segment_start:colon]
        key_from = segment_start + len(segment.rstrip(_BPERP_KEY_CHARS))
        found = _LETTER_AFTER_SPACE.search(text, max(key_from, after + 1), colon)
        if found:
            return found.start(), colon
        colon = text.find(":", colon + 1)
    return None


def _bperp_pairs(text: str) -> list[tuple[str, str]]:
    """The ``key: value`` pairs of a bperp header line, several to a line, in linear time.

    The same as ``re.findall(r"([A-Za-z][^:]*?):\\s*(.*?)\\s*(?=\\s[A-Za-z][A-Za-z /-]*:|$)")``,
    whose lazy value and lookahead rescan the rest of the line at every space.
    """
    first = _LETTER.search(text)
    if first is None:
        return []
    start, colon = first.start(), text.find(":", first.start())
    pairs = []
    while colon >= 0:
        found = _NON_SPACE.search(text, colon + 1)
        value_start = found.start() if found else len(text)
        following = _next_key(text, value_start, text.find(":", value_start))
        end = following[0] if following else len(text)
        pairs.append((text[start:colon], text[value_start:end].rstrip()))
        if following is None:
            break
        start, colon = following
    return pairs


def _parse_key_values(lines: Sequence[str], problems: _Problems
                      ) -> tuple[dict[str, Any], str]:
    fields: dict[str, Any] = {}
    header: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        match = _key_value(line)
        if match is None:
            if fields:
                problems.add(f"line {number}", "a 'key: value' line", repr(line.strip()))
            else:
                header.append(line.strip())
            continue
        key, text = match
        if key in fields:
            problems.add(key, "one line per field", f"a second line {number}: {line.strip()!r}")
            continue
        if text == "":
            problems.add(key, "a value", "an empty value")
            continue
        fields[key] = text if key in _TEXT else _check_field(key, _value(text), problems)
    return fields, "\n".join(header)


def _bperp_key(key: str) -> str:
    key = re.sub(r"\((?:m|m/s|s)\)", "", key)
    key = re.sub(r"[^0-9A-Za-z]+", "_", key).strip("_").lower()
    return {"range_samples_line": "range_samples"}.get(key, key)


def _parse_bperp(lines: Sequence[str], problems: _Problems) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    header: list[str] = []
    rows: list[list[float]] = []
    in_table = False
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            in_table = in_table and not rows
            continue
        if text.startswith("***") and not in_table:
            header.append(text.strip("* "))
            continue
        if text.split()[:2] == ["line", "range"]:
            columns = text.replace("look angle", "look_angle").split()
            if tuple(columns) != BPERP_COLUMNS:
                problems.add(f"line {number}", f"the table columns {' '.join(BPERP_COLUMNS)}",
                             repr(text))
            in_table = True
            continue
        if in_table and set(text) == {"*"}:
            continue
        if in_table and ":" not in text:
            tokens = text.split()
            if len(tokens) != len(BPERP_COLUMNS) or not all(_NUMBER.match(t) for t in tokens):
                problems.add(f"line {number}", f"{len(BPERP_COLUMNS)} numbers (a table row)",
                             repr(text))
            else:
                rows.append([float(t) for t in tokens])
            continue
        in_table = False
        pairs = _bperp_pairs(text)
        if not pairs:
            problems.add(f"line {number}", "a 'key: value' line or a table row", repr(text))
        for raw_key, raw_value in pairs:
            key = _bperp_key(raw_key)
            fields[key] = _check_field(key, _value(raw_value), problems)
            if key == "azimuth_angle":
                side = re.search(r"\((right|left) looking\)", raw_value)
                if side:
                    fields["look_side"] = side.group(1)
    if not rows:
        problems.add("table", f"rows of {' '.join(BPERP_COLUMNS)}", "no table rows")
    table = np.array(rows, dtype=np.float64).reshape(-1, len(BPERP_COLUMNS))
    fields["table"] = {name: (table[:, k].astype(np.int64) if name in ("line", "range")
                              else table[:, k]) for k, name in enumerate(BPERP_COLUMNS)}
    fields["header"] = "\n".join(header)
    return fields


def parse_par(path: str | os.PathLike) -> dict[str, Any]:
    """Read a GAMMA parameter file into a dict of numbers, arrays and text, units stripped.

    Each ``key: value units`` line becomes ``par[key]``: one number (``int`` when written as an
    integer, else ``float``), a float array for several numbers (state vectors, polynomials,
    TCN baselines; ``date`` as integers ``[YYYY, MM, DD(, hh, mm, ss)]``), or the text for
    text fields (``title``, ``sensor``, ``image_format``, ...). The lines before the first
    field (GAMMA's title line) are ``par["header"]``; ``par["kind"]`` says what the file is:
    ``"slc"``, ``"mli"``, ``"image"`` (another ISP image), ``"dem"``, ``"base"``, ``"bperp"``
    or ``"par"`` (any other key-value file).

    A ``*_bperp.par`` (GAMMA ``base_perp`` output) gives its header lines with lower-case keys
    (``interferogram_lines``, ``range_samples``, ``baseline_vector_tcn``, ``azimuth_angle``,
    ``look_side``, ...) and its table as ``par["table"]``, a dict of arrays by
    :data:`BPERP_COLUMNS` (:func:`read_bperp` gives it as a DataFrame).

    Parameters
    ----------
    path
        The parameter file.

    Returns
    -------
    dict
        The fields, plus ``header`` and ``kind``.

    Raises
    ------
    FileNotFoundError
        No such file.
    MetadataError
        A malformed file: every bad field at once, each with what was expected and what was
        found (a non-number where a number belongs, a vector of the wrong length, a required
        field missing, e.g. because the file is truncated).

    Examples
    --------
    >>> from pathlib import Path
    >>> import depsi
    >>> folder = Path(depsi.__file__).parents[1] / "tests" / "data" / "gamma_s1_mexico"
    >>> par = parse_par(folder / "headers" / "r20180106_VV_slc.par")
    >>> par["kind"], par["range_samples"], par["radar_frequency"], par["date"].tolist()
    ('slc', 68116, 5405000500.0, [2018, 1, 6])
    >>> par["state_vector_position_1"]
    array([-1442639.9545, -6604806.9075,  2082951.402 ])
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GAMMA parameter file '{path}' does not exist")
    try:
        text = read_bounded_text(path, what="GAMMA parameter file", max_bytes=MAX_PAR_BYTES,
                                 max_line=MAX_LINE_CHARS, errors="strict")
    except UnicodeDecodeError as err:
        raise MetadataError(f"GAMMA parameter file '{path}': expected text, found bytes that "
                            f"are not UTF-8 ({err})", paths=[str(path)]) from None
    lines = text.splitlines()
    problems = _Problems()
    if "Calculate baseline components perpendicular and parallel" in text:
        par = _parse_bperp(lines, problems)
        par["kind"] = "bperp"
    else:
        par, header = _parse_key_values(lines, problems)
        par["header"] = header
        par["kind"] = _kind(par, header)
    kind = par["kind"]
    fields = [k for k in par if k not in ("header", "kind")]
    if not fields:
        problems.add("(file)", "GAMMA 'key: value' lines (an ISP image, DEM, baseline or "
                     "bperp parameter file)", "no fields" if text.strip() else "an empty file")
    else:
        required = list(_REQUIRED.get(kind, ()))
        if kind == "dem" and str(par.get("DEM_projection", "")).upper() == "EQA":
            required += _EQA_FIELDS
        for key in required:
            if key not in par:
                problems.add(key, f"a value (a required field of a GAMMA {kind} parameter "
                             "file)", "the field is missing")
        if kind in ("slc", "mli", "image"):
            _check_isp(par, kind, problems)
    if problems.items:
        _raise_problems(path, problems.items)
    return par


def read_bperp(path: str | os.PathLike) -> pd.DataFrame:
    """The table of a GAMMA ``*_bperp.par`` file (``base_perp`` output) as a DataFrame.

    Columns :data:`BPERP_COLUMNS`: ``line`` and ``range`` (pixel of the interferogram, int),
    ``B_t``, ``B_c``, ``B_n`` (baseline in the TCN frame, m), ``look_angle`` (deg), ``bpara``,
    ``bperp``, ``blen`` (m). The header fields (:func:`parse_par`) are in ``df.attrs``.

    Raises
    ------
    MetadataError
        A malformed file (a row of other than 9 numbers, no table, a missing header field).

    Examples
    --------
    >>> from pathlib import Path
    >>> import depsi
    >>> folder = Path(depsi.__file__).parents[1] / "tests" / "data" / "gamma_s1_mexico"
    >>> table = read_bperp(folder / "geometry" / "20180106-20180130_VV_8rlks_bperp.par")
    >>> table.shape, float(table["bperp"].iloc[0]), table.attrs["look_side"]
    ((430, 9), 32.9386, 'right')
    """
    par = parse_par(path)
    if par["kind"] != "bperp":
        raise MetadataError(f"GAMMA bperp file '{path}': expected a base_perp table (a "
                            f"'*** Calculate baseline components ...' header), found a "
                            f"{par['kind']} parameter file", paths=[str(path)])
    table = pd.DataFrame(par.pop("table"))
    table.attrs.update({k: v for k, v in par.items() if k != "kind"})
    return table


# ----------------------------------------------------------------------------------------------
# Geometry of one image: timing, wavelength, orbit
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GammaImage:
    """What one GAMMA image parameter file says of its image: grid timing and description.

    The first five fields are those of :class:`~depsi.io.geometry.RadarGrid`
    (:meth:`grid_fields`, :attr:`radar_grid`).
    """

    first_line_time: np.datetime64
    line_interval: float
    near_range: float
    range_spacing: float
    look_side: str
    date: np.datetime64
    wavelength: float
    shape: tuple[int, int]
    image_format: str
    heading: float | None
    incidence_angle: float | None
    center_lat: float | None
    center_lon: float | None
    sensor: str | None
    polarisation: str | None
    source: str

    def grid_fields(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~depsi.io.geometry.RadarGrid`."""
        return {"first_line_time": self.first_line_time, "line_interval": self.line_interval,
                "near_range": self.near_range, "range_spacing": self.range_spacing,
                "look_side": self.look_side}

    @property
    def radar_grid(self) -> RadarGrid:
        return RadarGrid(**self.grid_fields())


def _midnight(par: dict[str, Any]) -> np.datetime64:
    day = par["date"]
    return np.datetime64(f"{int(day[0]):04d}-{int(day[1]):02d}-{int(day[2]):02d}", "ns")


def _seconds_after(reference: np.datetime64, seconds: float) -> np.datetime64:
    return reference + np.timedelta64(int(round(float(seconds) * 1e9)), "ns")


def _look_side(par: dict[str, Any], source: str) -> str:
    angle = par.get("azimuth_angle", 90.0)
    if abs(angle - 90.0) < 1e-3:
        return "right"
    if abs(angle - 270.0) < 1e-3 or abs(angle + 90.0) < 1e-3:
        return "left"
    raise MetadataError(f"GAMMA parameter file '{source}': field 'azimuth_angle': expected 90 "
                        f"(right looking) or 270 (left looking) degrees, found {angle!r}",
                        paths=[source], problems=[("azimuth_angle", "90 or 270", str(angle))])


def _orbit(par: dict[str, Any], source: str) -> Orbit:
    n = par.get("number_of_state_vectors")
    if not isinstance(n, int):
        _raise_problems(source, [("number_of_state_vectors", "an integer (the orbit's state "
                                  "vectors are needed for the geometry)", "the field is missing")])
    time = par["time_of_first_state_vector"] + par["state_vector_interval"] * np.arange(n)
    position = np.stack([par[f"state_vector_position_{k}"] for k in range(1, n + 1)])
    velocity = np.stack([par[f"state_vector_velocity_{k}"] for k in range(1, n + 1)])
    return Orbit(reference=_midnight(par), time=time, position=position, velocity=velocity,
                 source=source)


def _sensor(par: dict[str, Any]) -> tuple[str | None, str | None]:
    line = par.get("sensor")
    if not line:
        return None, None
    words = line.split()
    if words[-1].upper() in POLARISATIONS:
        return " ".join(words[:-1]) or None, words[-1].upper()
    return line, None


def slc_geometry(par: dict[str, Any], source: str = "slc.par") -> tuple[GammaImage, Orbit]:
    """The radar-grid timing, description and orbit of one GAMMA image parameter file.

    ``date`` + ``start_time`` (seconds of the day, UTC) is the time of line 0,
    ``azimuth_line_time`` the line interval, ``near_range_slc`` the slant range of sample 0,
    ``range_pixel_spacing`` the range spacing, ``c / radar_frequency`` the wavelength and
    ``azimuth_angle`` the look side (90: right, 270: left). The state vectors
    (``time_of_first_state_vector`` + k ``state_vector_interval``, positions and velocities)
    become an :class:`~depsi.io.geometry.Orbit` whose reference is the date at 00:00 UTC.

    Parameters
    ----------
    par
        From :func:`parse_par` of a ``*_slc.par`` (or ``*_mli.par``, whose orbit is the same).
    source
        Where ``par`` was read, named in errors.

    Returns
    -------
    (GammaImage, Orbit)

    Raises
    ------
    MetadataError
        No state vectors, or an azimuth angle other than 90 / 270.

    Examples
    --------
    >>> from pathlib import Path
    >>> import depsi
    >>> folder = Path(depsi.__file__).parents[1] / "tests" / "data" / "gamma_s1_mexico"
    >>> image, orbit = slc_geometry(parse_par(folder / "headers" / "r20180106_VV_slc.par"))
    >>> str(image.first_line_time), image.look_side, round(image.wavelength, 6)
    ('2018-01-06T00:40:12.556599000', 'right', 0.055466)
    >>> str(orbit.reference), orbit.time.tolist()[:2]
    ('2018-01-06T00:00:00.000000000', [2399.144213, 2409.144213])
    """
    midnight = _midnight(par)
    sensor, polarisation = _sensor(par)

    def optional(key: str) -> float | None:
        value = par.get(key)
        return None if value is None else float(value)

    image = GammaImage(
        first_line_time=_seconds_after(midnight, par["start_time"]),
        line_interval=float(par["azimuth_line_time"]), near_range=float(par["near_range_slc"]),
        range_spacing=float(par["range_pixel_spacing"]), look_side=_look_side(par, source),
        date=midnight.astype("datetime64[D]"),
        wavelength=SPEED_OF_LIGHT / float(par["radar_frequency"]),
        shape=(int(par["azimuth_lines"]), int(par["range_samples"])),
        image_format=str(par["image_format"]).upper(), heading=optional("heading"),
        incidence_angle=optional("incidence_angle"), center_lat=optional("center_latitude"),
        center_lon=optional("center_longitude"), sensor=sensor, polarisation=polarisation,
        source=source)
    return image, _orbit(par, source)


# ----------------------------------------------------------------------------------------------
# Reading a stack
# ----------------------------------------------------------------------------------------------

def _par_of(data: Path) -> Path | None:
    """The parameter file beside an SLC: ``X.rslc.par``, or GAMMA-Python's ``X_rslc.par``."""
    for candidate in (data.with_name(data.name + ".par"),
                      data.with_name(f"{data.stem}_{data.suffix.lstrip('.')}.par")):
        if candidate.is_file():
            return candidate
    return None


def _slc_files(paths_or_folder: Any) -> list[Path]:
    if isinstance(paths_or_folder, (str, os.PathLike)) and Path(paths_or_folder).is_dir():
        folder = Path(paths_or_folder)
        files = sorted(p for p in folder.iterdir()
                       if p.is_file() and p.suffix.lower() in SLC_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"folder '{folder}': expected GAMMA SLC files (*.slc or "
                                    f"*.rslc, each with its .par), found none")
        return files
    paths = _path_list(paths_or_folder, "paths_or_folder")
    _check_exist(paths, "GAMMA SLC files")
    return paths


def _is_resampled(path: Path) -> bool:
    return path.suffix.lower() == ".rslc" or bool(re.match(r"^r\d{8}", path.name))


def _read_pars(files: Sequence[Path]) -> list[dict[str, Any]]:
    """Every SLC's parameter file, parsed; all missing and malformed files reported at once."""
    pars, missing, errors = [], [], []
    for path in files:
        par_path = _par_of(path)
        if par_path is None:
            missing.append(f"'{path}' (looked for '{path.name}.par' and "
                           f"'{path.stem}_{path.suffix.lstrip('.')}.par')")
            continue
        try:
            par = parse_par(par_path)
        except MetadataError as err:
            errors.append(err)
            continue
        par["_par_path"] = str(par_path)
        pars.append(par)
    if missing:
        raise FileNotFoundError(f"GAMMA SLC files: expected a .par beside each, found none for "
                                f"{len(missing)} of {len(files)}: " + "; ".join(missing))
    if errors:
        raise MetadataError("\n".join(str(e) for e in errors),
                            paths=[p for e in errors for p in e.paths],
                            problems=[p for e in errors for p in e.problems])
    not_slc = [f"'{p['_par_path']}' is a {p['kind']} parameter file" for p in pars
               if p["kind"] != "slc"]
    if not_slc:
        raise MetadataError("GAMMA SLC files: expected SLC parameter files (image_format "
                            f"FCOMPLEX or SCOMPLEX), found: {'; '.join(not_slc)}",
                            paths=[p["_par_path"] for p in pars])
    return pars


def _check_stack(files: Sequence[Path], images: Sequence[GammaImage]) -> None:
    """One size, format and wavelength for all; each file's size and name date right."""
    sources = [im.source for im in images]
    for what, values in (("dimensions (azimuth_lines, range_samples)", [im.shape for im in images]),
                         ("image_format", [im.image_format for im in images])):
        if len(set(values)) > 1:
            raise MetadataError(f"GAMMA stack: expected one {what} for all dates, found "
                                + "; ".join(f"{v} in '{s}'" for v, s in zip(values, sources)),
                                paths=sources)
    first = images[0].wavelength
    if any(abs(im.wavelength - first) > WAVELENGTH_RTOL * first for im in images):
        raise MetadataError("GAMMA stack: expected one radar wavelength for all dates, found "
                            + "; ".join(f"{im.wavelength:.7f} m in '{im.source}'"
                                        for im in images), paths=sources)
    for path, image in zip(files, images):
        named = _DATE_IN_NAME.search(path.name)
        if named and np.datetime64(pd.Timestamp(named.group(1)), "D") != image.date:
            raise MetadataError(f"GAMMA SLC '{path}': expected the date of its name "
                                f"{named.group(1)} in '{image.source}', found {image.date}",
                                paths=[image.source],
                                problems=[("date", named.group(1), str(image.date))])
    itemsize = _gamma_dtype(images[0]).itemsize
    rows, cols = images[0].shape
    expected = rows * cols * itemsize
    wrong = [(p, os.path.getsize(p)) for p in files if os.path.getsize(p) != expected]
    if wrong:
        details = "; ".join(f"'{p}' has {size} bytes" for p, size in wrong)
        raise ValueError(f"GAMMA SLC files: expected {expected} bytes each ({rows} lines x "
                         f"{cols} samples of {itemsize}-byte {images[0].image_format}, as the "
                         f".par files say), found {details}")


def _gamma_dtype(image: GammaImage) -> np.dtype:
    dtype, byteorder = SLC_FORMATS[image.image_format]
    return _file_dtype(dtype, byteorder)


def _choose_mother(mother: Any, files: Sequence[Path], time: np.ndarray) -> tuple[int, str]:
    """Index (in date order) of the mother, and why it was chosen."""
    days = time.astype("datetime64[D]")
    if mother is not None:
        try:
            wanted = np.datetime64(pd.Timestamp(str(mother)), "D")
        except ValueError:
            raise ValueError(f"mother: expected a date such as '20180307', found "
                             f"{mother!r}") from None
        hits = np.flatnonzero(days == wanted)
        if not hits.size:
            raise ValueError(f"mother: expected one of the stack's dates "
                             f"{[str(d) for d in days]}, found {mother!r}")
        return int(hits[0]), "given as mother="
    original = [i for i, p in enumerate(files) if not _is_resampled(p)]
    if len(original) == 1 and len(files) > 1:
        return original[0], f"the only SLC not resampled ({files[original[0]].name})"
    return len(files) // 2, "the middle date (no mother= given and no single SLC that is not " \
                            "resampled)"


def from_gamma(
    paths_or_folder: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    geometry: GeometryMode = "product",
    height: Any = None,
    mother: Any = None,
    chunks: Any = None,
) -> xr.Dataset:
    """Read a coregistered GAMMA SLC stack (one SLC per date) lazily, with its orbit geometry.

    Each SLC (``rYYYYMMDD*.slc``, ``YYYYMMDD.rslc``, ...) has its ISP parameter file beside it
    (``YYYYMMDD.rslc.par``, or ``..._rslc.par``). Data are GAMMA's big-endian FCOMPLEX
    (float32 I/Q) or SCOMPLEX (int16 I/Q), read by memory-mapped blocks: the task graph holds
    file names only. Before any pixel is read: every SLC has its ``.par``, every ``.par``
    parses, all have one size, format and wavelength, dates are unique and agree with any
    date in the file names, and every file has ``azimuth_lines * range_samples * itemsize``
    bytes.

    The geometry: GAMMA SLCs carry no h2ph, so it comes from the orbits (each date keeps its
    own state vectors in its ``.par``): the stack's radar grid is the mother's timing and
    ``h2ph`` is computed by :func:`~depsi.io.geometry.attach_geometry` (zero at the mother).
    The mother is ``mother=`` when given, else the one SLC that is not resampled (a ``.slc``
    whose name does not start with ``r`` + date, among ``.rslc`` / ``r...`` files), else the
    middle date (index ``n // 2`` in date order); the choice is logged.

    Parameters
    ----------
    paths_or_folder
        A folder (every ``*.slc`` / ``*.rslc`` in it) or the SLC files.
    geometry
        ``"product"`` or ``"orbits"``, as ``mode`` of
        :func:`~depsi.io.geometry.attach_geometry` (``"orbits"`` also geocodes every pixel:
        lazy ``lat`` / ``lon``).
    height
        A height (m above the ellipsoid) for the geometry, or heights on ``(azimuth, range)``
        (then the coordinate ``height``; the geometry's own height stays 0). Default 0.
    mother
        The mother's date (``"20180307"``, ``"2018-03-07"``).
    chunks
        Block shape as in :func:`depsi.io.binary.from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64, Dask) and ``h2ph`` (float32) on ``(azimuth, range, time)``,
        epochs sorted by date; attrs ``wavelength``, ``sensor``, ``polarisation``,
        ``pass_direction`` (``"ascending"`` when the mother's ``|heading| < 90``), those of
        :func:`~depsi.io.geometry.attach_geometry` (``sar_geometry``, ``mother_time``, ...).

    Raises
    ------
    FileNotFoundError
        Missing SLCs or parameter files (all named).
    MetadataError
        Malformed parameter files (each bad field), mixed sizes, formats or wavelengths, a date
        that disagrees with the file name.
    ValueError
        A data file of the wrong size (named, expected and found bytes), duplicate dates, an
        unknown ``mother``.

    Examples
    --------
    See :func:`write_gamma`, whose example writes a stack and reads it back.
    """
    files = _slc_files(paths_or_folder)
    pars = _read_pars(files)
    read = [slc_geometry(p, p["_par_path"]) for p in pars]
    images = [image for image, _ in read]
    _check_stack(files, images)
    if any(int(p.get("line_header_size", 0)) != 0 for p in pars):
        raise MetadataError("GAMMA stack: expected line_header_size 0, found "
                            + "; ".join(f"{p.get('line_header_size')} in '{p['_par_path']}'"
                                        for p in pars), paths=[p["_par_path"] for p in pars])
    epochs = _epochs(len(files), [str(f) for f in files],
                     dates=[np.datetime64(im.date, "ns") for im in images], metadata=None,
                     wavelength=images[0].wavelength)
    files = [files[i] for i in epochs.order]
    images = [images[i] for i in epochs.order]
    orbits = [read[i][1] for i in epochs.order]
    index, why = _choose_mother(mother, files, epochs.time)
    logger.info("GAMMA stack of %d dates: mother %s, %s", len(files), images[index].date, why)

    shape = images[0].shape
    block = _chunks(chunks, shape, len(files))
    stack = _BinaryStack(files, shape, _gamma_dtype(images[0]))
    data = da.from_array(stack, chunks=block, lock=False, fancy=False, asarray=False,
                         meta=np.empty((0, 0, 0), dtype=np.complex64),
                         name="from_gamma-" + tokenize(stack))
    head = images[index]
    attrs = {"wavelength": epochs.wavelength, "sensor": head.sensor,
             "polarisation": head.polarisation,
             "pass_direction": None if head.heading is None else
             ("ascending" if abs(head.heading) < 90 else "descending")}
    raster = _raster(data, epochs.time, attrs)

    scalar_height = height is None or np.ndim(height) == 0
    stack_geometry = StackGeometry(grid=head.radar_grid, orbits=tuple(orbits), mother=index,
                                   wavelength=epochs.wavelength,
                                   height=float(height) if scalar_height and height is not None
                                   else 0.0)
    out = attach_geometry(raster, stack_geometry, mode=geometry,
                          height=None if scalar_height else height)
    out.attrs["history"] = "read by depsi.io.gamma.from_gamma"
    validate(out.drop_vars([c for c in ("lat", "lon") if c in out.variables]), kind="raster")
    return out


# ----------------------------------------------------------------------------------------------
# Writing a stack
# ----------------------------------------------------------------------------------------------

def _number(value: float, spec: str) -> str:
    """``value`` in GAMMA's format ``spec``, with more digits where those would lose it."""
    text = format(value, spec)
    if isinstance(value, (int, np.integer)) or float(text) == value:
        return text
    kind = spec[-1]
    width, _, decimals = spec[:-1].partition(".")
    for more in range(int(decimals) + 1, 18):
        text = format(value, f"{width}.{more}{kind}")
        if float(text) == value:
            return text
    return repr(float(value))


def _line(key: str, values: Sequence[str], units: str = "", *, column: int = 36,
          step: int = 16, gap: str = "   ") -> str:
    """``key:``, the first value ending at ``column`` and the others right-aligned in ``step``
    characters each (GAMMA's layout), then the units."""
    first = f"{key}:"
    text = first + " " * max(1, column - len(first) - len(values[0])) + values[0]
    text += "".join(v.rjust(step) if len(v) < step else " " + v for v in values[1:])
    return text + (gap + units if units else "")


def _epoch_timing(geometry: StackGeometry, shape: tuple[int, int]
                  ) -> list[tuple[float, float]]:
    """Per epoch: the shift of line 0's time (s) and of near range (m) from the mother's.

    A resampled GAMMA SLC keeps its own acquisition's timing: the time its orbit sees the
    ground of the mother's line 0 and its range to it (at mid-range, the stack's height).
    """
    lat, lon = radar_to_geo(geometry, np.array([0.0]), np.array([shape[1] / 2.0]))
    target = geodetic_to_ecef(lat, lon, geometry.height)
    mother = geometry.mother_orbit
    t_m = zero_doppler_time(mother, target, guess=mother.seconds(geometry.grid.first_line_time))
    r_m = np.linalg.norm(target - mother.state(t_m)[0], axis=-1)
    out = []
    for orbit in geometry.orbits:
        t_k = zero_doppler_time(orbit, target)
        r_k = np.linalg.norm(target - orbit.state(t_k)[0], axis=-1)
        moment_m = mother.reference + np.timedelta64(int(round(float(t_m[0]) * 1e9)), "ns")
        moment_k = orbit.reference + np.timedelta64(int(round(float(t_k[0]) * 1e9)), "ns")
        # the shift within the day: acquisitions of one track come at the same time of day
        shift = ((moment_k - moment_k.astype("datetime64[D]"))
                 - (moment_m - moment_m.astype("datetime64[D]"))) / np.timedelta64(1, "ns")
        out.append((float(shift) * 1e-9, float(r_k[0] - r_m[0])))
    return out


def _state_vectors(orbit: Orbit, midnight: np.datetime64, what: str
                   ) -> tuple[float, float, np.ndarray, np.ndarray]:
    """First time (s of the day), interval and state vectors sampled from ``orbit``."""
    span = float(orbit.time[-1] - orbit.time[0])
    interval = STATE_VECTOR_INTERVAL if span >= 3 * STATE_VECTOR_INTERVAL else span / 3.0
    times = orbit.time[0] + interval * np.arange(int(np.floor(span / interval + 1e-9)) + 1)
    position, velocity, _ = orbit.state(times)
    offset = float((orbit.reference - midnight) / np.timedelta64(1, "ns")) * 1e-9
    first = float(times[0]) + offset
    if not -86400.0 < first < 2 * 86400.0:
        raise ValueError(f"{what}: expected an orbit around its date {midnight.astype('M8[D]')},"
                         f" found state vectors from {orbit.reference} + {orbit.time[0]:.3f} s")
    return first, interval, position, velocity


def _par_text(*, day: np.datetime64, start: float, shape: tuple[int, int], near_range: float,
              geometry: StackGeometry, orbit: Orbit, centre: dict[str, float], sensor: str,
              what: str) -> str:
    """An ISP SLC parameter file in the layout of GAMMA's own (``par_S1_SLC``): same keys,
    columns and units. The fields the reader uses keep every digit of their value."""
    grid = geometry.grid
    lines_, samples = shape
    dt, spacing = grid.line_interval, grid.range_spacing
    end = start + (lines_ - 1) * dt
    far = near_range + (samples - 1) * spacing
    first, interval, position, velocity = _state_vectors(orbit, np.datetime64(day, "ns"), what)
    y, m, d = str(np.datetime64(day, "D")).split("-")

    def exact(value: float, spec: str) -> list[str]:
        return [_number(float(value), spec)]

    def shown(value: float, spec: str) -> list[str]:
        return [format(float(value), spec)]

    zero_poly = ["0.00000", "0.00000"] + ["0.00000e+00"] * 4
    zero_doppler = ["0.00000e+00"] * 4
    out = ["Gamma Interferometric SAR Processor (ISP) - Image Parameter File", "",
           f"title:     {sensor} {y}{m}{d} (software: depsi.io.gamma.write_gamma)",
           f"sensor:    {sensor}",
           f"date:      {y} {m} {d}",
           _line("start_time", exact(start, ".6f"), "s"),
           _line("center_time", shown(0.5 * (start + end), ".6f"), "s"),
           _line("end_time", shown(end, ".6f"), "s"),
           _line("azimuth_line_time", exact(dt, ".7e"), "s"),
           _line("line_header_size", ["0"]),
           _line("range_samples", [str(samples)]),
           _line("azimuth_lines", [str(lines_)]),
           _line("range_looks", ["1"]),
           _line("azimuth_looks", ["1"]),
           _line("image_format", ["FCOMPLEX"]),
           _line("image_geometry", ["SLANT_RANGE"], column=39),
           _line("range_scale_factor", ["1.0000000e+00"], column=37),
           _line("azimuth_scale_factor", ["1.0000000e+00"], column=37),
           _line("center_latitude", shown(centre["lat"], ".7f"), "degrees"),
           _line("center_longitude", shown(centre["lon"], ".7f"), "degrees"),
           _line("heading", shown(centre["heading"], ".7f"), "degrees"),
           _line("range_pixel_spacing", exact(spacing, ".6f"), "m"),
           _line("azimuth_pixel_spacing", shown(centre["azimuth_spacing"], ".6f"), "m"),
           _line("near_range_slc", exact(near_range, ".4f"), "m", column=37, gap="  "),
           _line("center_range_slc", shown(0.5 * (near_range + far), ".4f"), "m", column=37,
                 gap="  "),
           _line("far_range_slc", shown(far, ".4f"), "m", column=37, gap="  ")]
    out += [_line(f"{which}_slant_range_polynomial", zero_poly, "s m 1 m^-1 m^-2 m^-3 ",
                  column=44, step=13, gap="  ") for which in ("first", "center", "last")]
    out += [_line("incidence_angle", shown(centre["incidence"], ".4f"), "degrees"),
            _line("azimuth_deskew", ["ON"], column=27),
            _line("azimuth_angle", ["90.0000" if grid.look_side == "right" else "270.0000"],
                  "degrees"),
            _line("radar_frequency", exact(SPEED_OF_LIGHT / geometry.wavelength, ".7e"), "Hz",
                  column=37, gap="  "),
            _line("adc_sampling_rate", shown(SPEED_OF_LIGHT / (2 * spacing), ".7e"), "Hz",
                  column=37, gap="  "),
            _line("chirp_bandwidth", ["0.0000000e+00"], "Hz", column=37, gap="  "),
            _line("prf", shown(1.0 / dt, ".7f"), "Hz", column=37, gap="  "),
            _line("azimuth_proc_bandwidth", ["0.00000"], "Hz", column=37, gap="  "),
            _line("doppler_polynomial", zero_doppler, "Hz     Hz/m     Hz/m^2     Hz/m^3",
                  step=13, gap="  "),
            _line("doppler_poly_dot", zero_doppler, "Hz/s   Hz/s/m   Hz/s/m^2   Hz/s/m^3",
                  step=13, gap="  "),
            _line("doppler_poly_ddot", zero_doppler,
                  "Hz/s^2 Hz/s^2/m Hz/s^2/m^2 Hz/s^2/m^3", step=13, gap="  "),
            _line("receiver_gain", ["0.0000"], "dB", column=37, gap="  "),
            _line("calibration_gain", ["0.0000"], "dB", column=37, gap="  "),
            _line("sar_to_earth_center", shown(centre["sar_radius"], ".4f"), "m", column=45),
            _line("earth_radius_below_sensor", shown(centre["earth_radius"], ".4f"), "m",
                  column=45),
            _line("earth_semi_major_axis", shown(WGS84_A, ".4f"), "m", column=45),
            _line("earth_semi_minor_axis", shown(WGS84_A * (1 - WGS84_F), ".4f"), "m",
                  column=45),
            _line("number_of_state_vectors", [str(len(position))], column=45),
            _line("time_of_first_state_vector", exact(first, ".6f"), "s", column=45),
            _line("state_vector_interval", exact(interval, ".6f"), "s", column=45)]
    for k, (p, v) in enumerate(zip(position, velocity), 1):
        out.append(_line(f"state_vector_position_{k}", [_number(float(x), ".4f") for x in p],
                         "m   m   m", column=39))
        out.append(_line(f"state_vector_velocity_{k}", [_number(float(x), ".5f") for x in v],
                         "m/s m/s m/s", column=39))
    return "\n".join(out) + "\n\n"


def _scene_centre(geometry: StackGeometry, shape: tuple[int, int]) -> dict[str, float]:
    """The scene-centre fields of an SLC parameter file, as GAMMA states them: the heading of
    the velocity in the local frame below the sensor at the centre time (which is what GAMMA's
    ``heading`` is, to 1e-7 degree on the real headers), the incidence at the centre pixel."""
    look = look_geometry(geometry, (shape[0] - 1) / 2.0, (shape[1] - 1) / 2.0)
    orbit = geometry.mother_orbit
    t = orbit.seconds(geometry.grid.first_line_time) \
        + 0.5 * (shape[0] - 1) * geometry.grid.line_interval
    position, velocity, _ = orbit.state(np.array([t]))
    lat, lon, _ = ecef_to_geodetic(position)
    east, north, _ = enu_basis(lat, lon)
    heading = np.rad2deg(np.arctan2(np.sum(velocity * east), np.sum(velocity * north)))
    radius = float(np.linalg.norm(position))
    earth = float(np.linalg.norm(geodetic_to_ecef(look["lat"], look["lon"], geometry.height)))
    return {"lat": float(look["lat"]), "lon": float(look["lon"]), "heading": float(heading),
            "incidence": float(look["incidence"]), "sar_radius": radius,
            "earth_radius": earth,
            "azimuth_spacing": float(np.linalg.norm(velocity)) * geometry.grid.line_interval
            * earth / radius}


def _check_writable(stack: xr.Dataset, geometry: StackGeometry) -> xr.DataArray:
    if "complex" not in stack.data_vars:
        raise ValueError(f"stack: expected a 'complex' variable, found "
                         f"{sorted(map(str, stack.data_vars))}")
    slc = stack["complex"]
    if set(slc.dims) != set(RASTER_DIMS):
        raise ValueError(f"stack['complex']: expected dims {RASTER_DIMS}, found {slc.dims}")
    time = stack["time"].values
    if time.dtype.kind != "M":
        raise ValueError(f"stack['time']: expected dates (datetime64), found {time.dtype}")
    days = time.astype("datetime64[D]")
    if len(np.unique(days)) != len(days):
        raise ValueError(f"stack['time']: expected one epoch per date, found "
                         f"{[str(d) for d in days]}")
    if len(geometry.orbits) != len(days):
        raise ValueError(f"geometry: expected one orbit per epoch ({len(days)}), found "
                         f"{len(geometry.orbits)}")
    stated = stack.attrs.get("wavelength")
    if stated is not None and abs(float(stated) - geometry.wavelength) \
            > WAVELENGTH_RTOL * geometry.wavelength:
        raise ValueError(f"stack.attrs['wavelength']: expected the geometry's "
                         f"{geometry.wavelength!r} m, found {stated!r} m")
    return slc.transpose(*RASTER_DIMS)


def _write_slcs(paths: Sequence[Path], data: Any, shape: tuple[int, int]) -> None:
    """One big-endian complex64 file per epoch, band of lines by band (one Dask block row at
    a time, so memory holds one band of every epoch)."""
    maps = [np.memmap(p, dtype=">c8", mode="w+", shape=shape) for p in paths]
    bounds = np.cumsum((0, *data.chunks[0])) if isinstance(data, da.Array) else (0, shape[0])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        band = np.asarray(data[lo:hi])
        for k, mapped in enumerate(maps):
            mapped[lo:hi] = band[:, :, k]
    for mapped in maps:
        mapped.flush()


def _replace_all(parts: dict[Path, Path]) -> None:
    for part, final in parts.items():
        os.replace(part, final)


def write_gamma(folder: str | os.PathLike, stack: xr.Dataset, geometry: StackGeometry
                ) -> dict[str, Any]:
    """Write a raster stack and its geometry as a GAMMA stack: ``rYYYYMMDD.rslc`` + ``.par``.

    Each epoch's SLC is big-endian FCOMPLEX (``>c8``), lines in azimuth order; its ISP
    parameter file has the keys, layout and units of GAMMA's own Sentinel-1 ``*_slc.par``,
    with the epoch's state vectors sampled from its orbit every
    :data:`STATE_VECTOR_INTERVAL` s over the orbit's span (``orbit.state``). Numbers are in
    GAMMA's formats, with more digits where those would not give the value back exactly (so
    the geometry reads back unchanged). The mother's file has the stack's grid timing; each
    other date the timing of its own acquisition of the same ground (the time its orbit sees
    line 0 and its range to it), as resampled GAMMA SLCs keep. Instrument fields GAMMA copies
    from the raw product and depsi does not know (chirp bandwidth, Doppler polynomials) are 0.

    Every file is written to ``*.part`` first and renamed when all are complete. All files
    are named ``r...`` (resampled), so give ``mother=`` (returned as ``"mother"``) to
    :func:`from_gamma` unless the mother is the middle date.

    Parameters
    ----------
    folder
        Created if needed; files of the same names are replaced.
    stack
        ``complex`` on ``(azimuth, range, time)``, ``time`` as dates; attrs ``wavelength``
        (checked against the geometry's), optional ``sensor`` and ``polarisation`` (for the
        ``sensor:`` line; default ``"depsi"``).
    geometry
        The stack's geometry, one orbit per epoch in time order.

    Returns
    -------
    dict
        ``folder``, ``slc`` and ``par`` (lists of paths in date order), ``mother`` (the mother's
        date, ``YYYYMMDD``).

    Raises
    ------
    ValueError
        No ``complex``, time not dates or repeated, one orbit per epoch missing, a wavelength
        other than the geometry's, an orbit far from its epoch's date.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> import numpy as np, xarray as xr, depsi
    >>> headers = Path(depsi.__file__).parents[1] / "tests/data/gamma_s1_mexico/headers"
    >>> read = [slc_geometry(parse_par(headers / f"r{d}_VV_slc.par"))
    ...         for d in ("20180106", "20180130", "20180307")]
    >>> image = read[1][0]
    >>> geometry = StackGeometry(image.radar_grid, [orbit for _, orbit in read], mother=1,
    ...                          wavelength=image.wavelength)
    >>> slc = np.arange(2 * 3 * 3, dtype="c8").reshape(2, 3, 3) * (1 + 1j)
    >>> stack = xr.Dataset({"complex": (("azimuth", "range", "time"), slc)},
    ...                    coords={"time": [np.datetime64(im.date, "ns") for im, _ in read]},
    ...                    attrs={"wavelength": image.wavelength})
    >>> written = write_gamma(tempfile.mkdtemp(), stack, geometry)
    >>> [p.name for p in written["slc"]], written["mother"]
    (['r20180106.rslc', 'r20180130.rslc', 'r20180307.rslc'], '20180130')
    >>> back = from_gamma(written["folder"], mother=written["mother"])
    >>> bool((back.complex.values == slc).all()), back.h2ph.shape
    (True, (2, 3, 3))
    """
    slc = _check_writable(stack, geometry)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shape = (slc.sizes["azimuth"], slc.sizes["range"])
    days = stack["time"].values.astype("datetime64[D]")
    names = [str(d).replace("-", "") for d in days]
    sensor = " ".join(str(s) for s in (stack.attrs.get("sensor") or "depsi",
                                       stack.attrs.get("polarisation")) if s)
    centre = _scene_centre(geometry, shape)
    timing = _epoch_timing(geometry, shape)
    # seconds of the mother's date (beyond 86400 for a scene that starts after midnight)
    mother_start = float((geometry.grid.first_line_time - days[geometry.mother].astype("M8[ns]"))
                         / np.timedelta64(1, "ns")) * 1e-9

    slc_paths = [folder / f"r{name}.rslc" for name in names]
    par_paths = [folder / f"r{name}.rslc.par" for name in names]
    parts = {p.with_name(p.name + ".part"): p for p in slc_paths + par_paths}
    try:
        _write_slcs([p.with_name(p.name + ".part") for p in slc_paths], slc.data, shape)
        for k, (path, orbit) in enumerate(zip(par_paths, geometry.orbits)):
            shift, range_shift = (0.0, 0.0) if k == geometry.mother else timing[k]
            text = _par_text(day=days[k], start=mother_start + shift, shape=shape,
                             near_range=geometry.grid.near_range + range_shift,
                             geometry=geometry, orbit=orbit, centre=centre, sensor=sensor,
                             what=f"geometry.orbits[{k}] ({days[k]})")
            path.with_name(path.name + ".part").write_text(text)
    except BaseException:
        for part in parts:
            part.unlink(missing_ok=True)
        raise
    _replace_all(parts)
    logger.info("wrote a GAMMA stack of %d dates to %s (mother %s)", len(names), folder,
                names[geometry.mother])
    return {"folder": folder, "slc": slc_paths, "par": par_paths,
            "mother": names[geometry.mother]}


__all__ = [
    "BPERP_COLUMNS",
    "SLC_FORMATS",
    "STATE_VECTOR_INTERVAL",
    "GammaImage",
    "from_gamma",
    "parse_par",
    "read_bperp",
    "slc_geometry",
    "write_gamma",
]
