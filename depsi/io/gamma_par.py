"""GAMMA Remote Sensing parameter files: :func:`parse_par` reads any of them (ISP
``*_slc.par`` / ``*_mli.par``, DIFF&GEO DEM ``.par``, ``*_base.par`` baseline models,
``*_bperp.par`` baseline tables) into numbers, :func:`read_bperp` a baseline table into a
DataFrame. The stack reader is :mod:`depsi.io.gamma`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from depsi.io.bounded import MAX_LINE_CHARS, MetadataError, _raise_problems, read_bounded_text

#: GAMMA ``image_format`` of complex SLCs and the on-disk dtype each names (GAMMA binary data
#: are big-endian): FCOMPLEX = float32 I/Q pairs, SCOMPLEX = int16 I/Q pairs.
SLC_FORMATS = {"FCOMPLEX": (np.complex64, ">"), "SCOMPLEX": ("complex_int16", ">")}

#: Columns of the table of a ``*_bperp.par`` file (GAMMA ``base_perp``), in file order: line,
#: range sample, baseline components B_t, B_c, B_n (m, TCN frame), look angle (deg), parallel
#: and perpendicular baseline and baseline length (m).
BPERP_COLUMNS = ("line", "range", "B_t", "B_c", "B_n", "look_angle", "bpara", "bperp", "blen")

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
    values: list[int] | list[float]
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


__all__ = ["BPERP_COLUMNS", "SLC_FORMATS", "parse_par", "read_bperp"]
