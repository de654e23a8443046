"""SAR acquisition metadata: DORIS v4 / v5 ``.res`` result files, one per epoch or per stack.

``read_metadata`` turns one file into a flat dict in SI units (wavelength, acquisition time,
azimuth and range timing, image size and crop windows, scene centre, orbit state vectors, and,
for DORIS v5 stacks, the baseline geometry of the ``ifgs.res`` beside it).
``read_metadata_stack`` reads one file per epoch and checks that they belong to one stack.
A malformed file raises :class:`~depsi.io.bounded.MetadataError` naming the file, each bad
field, what was expected and what was found, before any data is read.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from depsi.conventions import MONTH_NUMBERS, SPEED_OF_LIGHT
from depsi.io.bounded import MetadataError, _raise_problems, read_bounded_text

logger = logging.getLogger(__name__)

#: Plausible radar wavelengths (m): from Ka band (8 mm) to P band (about 0.7 m), with margin.
WAVELENGTH_RANGE = (1e-3, 1.0)

#: Relative difference allowed between the stated wavelength and the one implied by the stated
#: radar frequency, and between the wavelengths of the epochs of one stack.
WAVELENGTH_RTOL = 1e-5

#: Acquisition years accepted: from Seasat (the first civil spaceborne SAR) on.
FIRST_SAR_YEAR, LAST_PLAUSIBLE_YEAR = 1978, 2100

#: The drivers ``read_metadata`` understands; ``"auto"`` tells them apart from the header.
DRIVERS = ("doris4", "doris5", "auto")

Driver = Literal["doris4", "doris5", "auto"]
#: A driver once told apart, as ``detect_driver`` returns it.
DorisVersion = Literal["doris4", "doris5"]


#: ``First_pixel_azimuth_time (UTC)`` layouts: DORIS v4 ``01-Mar-2018 17:19:09.165000``,
#: DORIS v5 ``2018-Mar-06 17:24:29.954980``.
_TIME_PATTERNS: dict[DorisVersion, re.Pattern[str]] = {
    "doris4": re.compile(r"^(?P<day>\d{1,2})-(?P<mon>[A-Za-z]{3})-(?P<year>\d{4})\s+"
                         r"(?P<h>\d{1,2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<f>\d+))?$"),
    "doris5": re.compile(r"^(?P<year>\d{4})-(?P<mon>[A-Za-z]{3})-(?P<day>\d{1,2})\s+"
                         r"(?P<h>\d{1,2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<f>\d+))?$"),
}
_TIME_LAYOUT = {"doris4": "DD-Mon-YYYY hh:mm:ss.ffffff", "doris5": "YYYY-Mon-DD hh:mm:ss.ffffff"}

#: Largest DORIS ``.res`` file read, in bytes: a real one is under 1 MB (a few hundred orbit
#: lines), so a larger one is not a result file; refused before it is read.
MAX_RES_BYTES = 16 * 2**20

_SECTION_START = re.compile(r"^\*_Start_(\w+)")
_SECTION_END = re.compile(r"^\*\s*End_(\w+)")
_ORBIT_LINE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s+(\S+)\s+(\S+)\s+(\S+)\s*$")

# \d+(?:\.\d*)? rather than \d+\.?\d*: the two digit runs of the latter overlap, and a long run
# of digits that fails at its end backtracks quadratically
_NUMBER = re.compile(r"^[-+]?(\d+(?:\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


# ----------------------------------------------------------------------------------------------
# Low-level parsing: sections and "Key: value" fields
# ----------------------------------------------------------------------------------------------

def _field(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of a ``Key: value`` line, else None, in one pass of str methods.

    The same as the regex ``^\\s*([^:\\t]*[^:\\s])\\s*:\\s*(.*?)\\s*$``, which backtracks
    quadratically on a long line without a colon (a 70 kB line took 74 s).
    """
    head, colon, value = line.partition(":")
    key = head.strip()
    if not colon or not key or "\t" in key:
        return None
    return key, value.strip()


def _split_sections(text: str) -> tuple[dict[str, dict[str, str]], dict[str, list[str]]]:
    """Fields per section (``readfiles``, ``crop``, ...) and raw lines per section.

    Lines outside any ``*_Start_x`` / ``* End_x`` pair go to section ``"header"``; the process
    control block is section ``"process_control"``.
    """
    fields: dict[str, dict[str, str]] = {"header": {}}
    lines: dict[str, list[str]] = {"header": []}
    current = "header"
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:  # blank lines: no section mark, no field
            lines[current].append(line)
            continue
        start = _SECTION_START.match(stripped)
        if start:
            current = start.group(1)
            fields.setdefault(current, {})
            lines.setdefault(current, [])
            continue
        if _SECTION_END.match(stripped):
            current = "header"
            continue
        if stripped == "Start_process_control":
            current = "process_control"
            fields.setdefault(current, {})
            lines.setdefault(current, [])
            continue
        if stripped == "End_process_control":
            current = "header"
            continue
        lines[current].append(line)
        field = _field(line)
        if field:
            # ifgs.res aligns units with runs of spaces ("Bperp          [m]"): one space
            key = " ".join(field[0].split())
            fields[current].setdefault(key, field[1])
    return fields, lines


def detect_driver(text: str) -> DorisVersion | None:
    """Tell DORIS v4 from v5 by the header (``Version: version 4...`` / ``DVersion`` ...).

    Falls back to the layout of ``First_pixel_azimuth_time (UTC)``; None if neither decides.

    Examples
    --------
    >>> detect_driver("DVersion:   Version (2015) (For TOPSAR)")
    'doris5'
    >>> detect_driver("Version:   version  4.13.1 (02-11-2021)")
    'doris4'
    """
    # [ \t]* and [ \t]+, not \s: \s* crosses line ends, and at every line start would rescan
    # all the blank lines after it (quadratic in a file of blank lines)
    if re.search(r"^[ \t]*Version:[ \t]*version[ \t]+4\.", text, re.MULTILINE):
        return "doris4"
    if re.search(r"^[ \t]*DVersion:|For TOPSAR", text, re.MULTILINE):
        return "doris5"
    match = re.search(r"^[ \t]*First_pixel_azimuth_time \(UTC\):([^\n]*)", text, re.MULTILINE)
    if match:
        for driver, pattern in _TIME_PATTERNS.items():
            if pattern.match(match.group(1).strip()):
                return driver
    return None


class _Collector:
    """Reads typed fields from one section and records every problem instead of stopping."""

    def __init__(self, fields: dict[str, dict[str, str]]) -> None:
        self.fields = fields
        self.problems: list[tuple[str, str, str]] = []

    def problem(self, field: str, expected: str, found: str) -> None:
        self.problems.append((field, expected, found))

    def raw(self, section: str, label: str, *, required: bool, expected: str) -> str | None:
        value = self.fields.get(section, {}).get(label)
        if value is None or value == "":
            if required:
                where = f"section '{section}'" if section in self.fields else \
                    f"section '{section}' (absent from the file)"
                self.problem(label, f"{expected}, in {where}",
                             "the field is missing" if value is None else "an empty value")
            return None
        return value

    def number(self, section: str, label: str, *, required: bool = False, scale: float = 1.0,
               unit: str = "", positive: bool = False,
               bounds: tuple[float, float] | None = None) -> float | None:
        expected = f"a number{' in ' + unit if unit else ''}"
        text = self.raw(section, label, required=required, expected=expected)
        if text is None:
            return None
        token = text.split("//")[0].strip()
        if not _NUMBER.match(token):
            self.problem(label, expected, repr(text))
            return None
        value = float(token) * scale
        if not math.isfinite(value) or (positive and value <= 0):
            self.problem(label, f"a positive finite number{' in ' + unit if unit else ''}",
                         repr(text))
            return None
        if bounds is not None and not (bounds[0] < value < bounds[1]):
            self.problem(label, f"a value between {bounds[0]:g} and {bounds[1]:g}"
                                f"{' ' + unit if unit else ''}", repr(text))
            return None
        return value

    def integer(self, section: str, label: str, *, required: bool = False,
                positive: bool = True) -> int | None:
        text = self.raw(section, label, required=required, expected="an integer")
        if text is None:
            return None
        token = text.split("//")[0].strip()
        if not re.fullmatch(r"[-+]?\d+", token):
            self.problem(label, "an integer", repr(text))
            return None
        value = int(token)
        if positive and value <= 0:
            self.problem(label, "a positive integer", repr(text))
            return None
        return value

    def text(self, section: str, label: str) -> str | None:
        value = self.raw(section, label, required=False, expected="text")
        return None if value in (None, "dummy") else value


def parse_azimuth_time(text: str, driver: DorisVersion) -> np.datetime64:
    """Parse a DORIS ``First_pixel_azimuth_time (UTC)`` value to ``datetime64[ns]``.

    Month names are read without the locale, so ``Mar`` works whatever the system language.

    Raises
    ------
    ValueError
        When ``text`` does not follow the driver's layout or is not a valid date.

    Examples
    --------
    >>> parse_azimuth_time("2018-Mar-06 17:24:29.954980", "doris5")
    np.datetime64('2018-03-06T17:24:29.954980000')
    >>> parse_azimuth_time("01-Mar-2018 17:19:09.165000", "doris4")
    np.datetime64('2018-03-01T17:19:09.165000000')
    """
    match = _TIME_PATTERNS[driver].match(text.strip())
    if not match:
        raise ValueError(f"expected layout {_TIME_LAYOUT[driver]!r}")
    month = MONTH_NUMBERS.get(match["mon"].lower())
    if month is None:
        raise ValueError(f"unknown month {match['mon']!r}")
    year = int(match["year"])
    if not FIRST_SAR_YEAR <= year <= LAST_PLAUSIBLE_YEAR:
        raise ValueError(f"year {year} outside {FIRST_SAR_YEAR}..{LAST_PLAUSIBLE_YEAR}")
    # datetime() rejects impossible dates (31 Feb, hour 25) with a clear message
    moment = datetime(year, month, int(match["day"]), int(match["h"]), int(match["m"]),
                      int(match["s"]))
    nanoseconds = int((match["f"] or "0")[:9].ljust(9, "0"))
    return np.datetime64(moment, "ns") + np.timedelta64(nanoseconds, "ns")


# ----------------------------------------------------------------------------------------------
# Sections of a DORIS result file
# ----------------------------------------------------------------------------------------------

def _readfiles(get: _Collector, driver: DorisVersion) -> dict[str, Any]:
    """The ``readfiles`` section: sensor, wavelength, timing, image size, scene location."""
    sec = "readfiles"
    out: dict[str, Any] = {
        "sensor": get.text(sec, "Sensor platform mission identifer"),
        "sar_processor": get.text(sec, "SAR_PROCESSOR"),
        "product_type": get.text(sec, "Product type specifier"),
        "data_file": get.text(sec, "Datafile"),
        "data_format": get.text(sec, "Dataformat"),
        "wavelength": get.number(sec, "Radar_wavelength (m)", required=True, unit="m",
                                 positive=True),
        "prf": get.number(sec, "Pulse_Repetition_Frequency (computed, Hz)", required=True,
                          unit="Hz", positive=True),
        "azimuth_bandwidth": get.number(sec, "Total_azimuth_band_width (Hz)", unit="Hz",
                                        positive=True),
        "range_time_first_pixel": get.number(sec, "Range_time_to_first_pixel (2way) (ms)",
                                             required=True, scale=1e-3, unit="ms",
                                             bounds=(0.0, 100.0e-3)),
        "range_sampling_rate": get.number(sec, "Range_sampling_rate (computed, MHz)",
                                          required=True, scale=1e6, unit="MHz", positive=True),
        "range_bandwidth": get.number(sec, "Total_range_band_width (MHz)", scale=1e6, unit="MHz",
                                      positive=True),
        "number_of_lines_original": get.integer(sec, "Number_of_lines_original", required=True),
        "number_of_pixels_original": get.integer(sec, "Number_of_pixels_original",
                                                 required=True),
        "scene_centre_latitude": get.number(sec, "Scene_centre_latitude", unit="degrees",
                                            bounds=(-90.0001, 90.0001)),
        "scene_centre_longitude": get.number(sec, "Scene_centre_longitude", unit="degrees",
                                             bounds=(-360.0001, 360.0001)),
    }
    time_text = get.raw(sec, "First_pixel_azimuth_time (UTC)", required=True,
                        expected=f"a UTC time as {_TIME_LAYOUT[driver]!r}")
    out["first_azimuth_time"] = None
    if time_text is not None:
        try:
            out["first_azimuth_time"] = parse_azimuth_time(time_text, driver)
        except ValueError as err:
            other: DorisVersion = "doris4" if driver == "doris5" else "doris5"
            detail = "" if str(err).startswith("expected layout") else f" ({err})"
            hint = (f" (this is the {other} layout: pass driver={other!r})"
                    if _TIME_PATTERNS[other].match(time_text.strip()) else "")
            get.problem("First_pixel_azimuth_time (UTC)",
                        f"a UTC time as {_TIME_LAYOUT[driver]!r} ({driver})",
                        f"{time_text!r}{detail}{hint}")
    if driver == "doris5":
        out.update({
            "radar_frequency": get.number(sec, "RADAR_FREQUENCY (HZ)", unit="Hz",
                                          positive=True),
            "azimuth_time_interval": get.number(sec, "Azimuth_time_interval (s)", unit="s",
                                                positive=True),
            "prf_raw": get.number(sec, "Pulse_Repetition_Frequency_raw_data(TOPSAR)",
                                  unit="Hz", positive=True),
            "heading": get.number(sec, "Scene_center_heading", unit="degrees",
                                  bounds=(-360.0001, 360.0001)),
            "range_pixel_spacing": get.number(sec, "rangePixelSpacing", unit="m",
                                              positive=True),
            "azimuth_pixel_spacing": get.number(sec, "azimuthPixelSpacing", unit="m",
                                                positive=True),
            "pass_direction": (get.text(sec, "PASS") or "").lower() or None,
            "swath": get.text(sec, "SWATH"),
            "image_mode": get.text(sec, "IMAGE_MODE"),
            "polarisation": get.text(sec, "polarisation"),
        })
        corners = [get.number(sec, f"Scene_{c}_corner_{q}")
                   for c in ("ul", "ur", "lr", "ll") for q in ("latitude", "longitude")]
        out["scene_corners"] = (np.array(corners, dtype=np.float64).reshape(4, 2)
                                if all(v is not None for v in corners) else None)
    else:
        scene = get.text(sec, "Scene identification") or ""
        direction = re.search(r"\b(ASCENDING|DESCENDING)\b", scene, re.IGNORECASE)
        out["pass_direction"] = direction.group(1).lower() if direction else None
    return out


def _window(get: _Collector, section: str, reference: str) -> dict[str, Any] | None:
    """A crop or resample window (1-based, inclusive, as DORIS writes it) and its output file."""
    if section not in get.fields:
        return None
    bounds = {key: get.integer(section, f"{label} (w.r.t. {reference})", required=True)
              for key, label in (("first_line", "First_line"), ("last_line", "Last_line"),
                                 ("first_pixel", "First_pixel"), ("last_pixel", "Last_pixel"))}
    window: dict[str, Any] = {
        "data_file": get.text(section, "Data_output_file"),
        "data_format": get.text(section, "Data_output_format"),
        **bounds,
    }
    known = {key: value for key, value in bounds.items() if value is not None}
    if len(known) < len(bounds):
        return window
    for axis in ("line", "pixel"):
        first, last = known[f"first_{axis}"], known[f"last_{axis}"]
        if last < first:
            get.problem(f"Last_{axis} (w.r.t. {reference})",
                        f"a {axis} at or after First_{axis} = {first} (section '{section}')",
                        str(last))
    window["number_of_lines"] = known["last_line"] - known["first_line"] + 1
    window["number_of_pixels"] = known["last_pixel"] - known["first_pixel"] + 1
    return window


def _orbit(get: _Collector, lines: dict[str, list[str]]) -> np.ndarray | None:
    """Orbit state vectors ``(n, 4)``: seconds of the day (UTC), X, Y, Z (m, Earth-fixed)."""
    section = next((s for s in ("precise_orbits", "leader_datapoints") if s in lines), None)
    if section is None:
        return None
    rows = []
    for line in lines[section]:
        match = _ORBIT_LINE.match(line)
        if match:
            try:
                rows.append([float(v) for v in match.groups()])
            except ValueError:
                get.problem(f"orbit state vector (section '{section}')",
                            "a line 't X Y Z' of numbers", repr(line.strip()))
    declared = get.integer(section, "NUMBER_OF_DATAPOINTS", positive=False)
    if declared is not None and declared != len(rows):
        get.problem(f"NUMBER_OF_DATAPOINTS (section '{section}')",
                    f"{declared} orbit state vectors as declared", f"{len(rows)} vector lines")
    if not rows:
        return None
    orbit = np.asarray(rows, dtype=np.float64)
    if orbit.shape[0] > 1 and not (np.diff(orbit[:, 0]) > 0).all():
        get.problem(f"orbit state vector times (section '{section}')",
                    "strictly increasing times", "times that repeat or go back")
    return orbit


def _check_process_control(get: _Collector) -> None:
    """A step marked done (``crop: 1``) must have its section: otherwise the file is cut short."""
    control = get.fields.get("process_control", {})
    for step in ("precise_orbits", "crop", "resample"):
        if control.get(step, "0").strip() == "1" and step not in get.fields:
            get.problem(f"section '{step}'",
                        f"the '*_Start_{step}' section, since process control says '{step}: 1'",
                        "no such section (the file may be truncated)")


def _interferogram(path: Path, driver: DorisVersion) -> dict[str, Any]:
    """Baseline geometry and interferogram size from the ``ifgs.res`` beside a DORIS v5 file.

    DORIS keeps one folder per date with ``slave.res`` and ``ifgs.res``; a flat folder of
    ``slave_YYYYMMDD.res`` files (as ``depsi.simulate.write_stack_binary`` writes) pairs each
    with ``ifgs_YYYYMMDD.res``.
    """
    if driver != "doris5" or path.name.startswith("ifgs"):
        return {}
    stem_date = path.stem.rsplit("_", 1)[-1]
    candidates = [path.with_name("ifgs.res")]
    if stem_date.isdigit():
        candidates.insert(0, path.with_name(f"ifgs_{stem_date}.res"))
    ifg_path = next((c for c in candidates if c.is_file()), None)
    if ifg_path is None:
        return {}
    fields, _ = _split_sections(read_bounded_text(ifg_path, what="DORIS result file",
                                                  max_bytes=MAX_RES_BYTES))
    get = _Collector(fields)
    sec = "coarse_orbits"
    out = {
        "perpendicular_baseline": get.number(sec, "Bperp [m]", unit="m"),
        "parallel_baseline": get.number(sec, "Bpar [m]", unit="m"),
        "look_angle": get.number(sec, "theta [deg]", unit="degrees", bounds=(0.0, 90.0)),
        "incidence_angle": get.number(sec, "inc_angle [deg]", unit="degrees",
                                      bounds=(0.0, 90.0)),
        "height_of_ambiguity": get.number(sec, "Height_amb [m]", unit="m"),
        "ifg_number_of_lines": get.integer("interfero", "Number of lines (multilooked)"),
        "ifg_number_of_pixels": get.integer("interfero", "Number of pixels (multilooked)"),
    }
    if get.problems:
        _raise_problems(ifg_path, get.problems)
    return {k: v for k, v in out.items() if v is not None}


def _check_wavelength(meta: dict[str, Any], get: _Collector) -> None:
    """Wavelength within radar bands and, where the frequency is stated, equal to c / f."""
    wavelength, frequency = meta.get("wavelength"), meta.get("radar_frequency")
    if wavelength is None:
        return
    implied = SPEED_OF_LIGHT / frequency if frequency else None
    implied_text = (f" (RADAR_FREQUENCY (HZ) {frequency:.6g} Hz implies {implied:.6f} m)"
                    if implied else "")
    if not WAVELENGTH_RANGE[0] < wavelength < WAVELENGTH_RANGE[1]:
        get.problem("Radar_wavelength (m)", f"a radar wavelength between "
                    f"{WAVELENGTH_RANGE[0]:g} and {WAVELENGTH_RANGE[1]:g} m",
                    f"{wavelength!r} m{implied_text}")
    elif implied is not None and abs(implied - wavelength) > WAVELENGTH_RTOL * implied:
        get.problem("Radar_wavelength (m)", f"{implied:.6f} m as implied by RADAR_FREQUENCY "
                    f"(HZ) {frequency:.6g} Hz", f"{wavelength!r} m")


def _check_crop(meta: dict[str, Any], get: _Collector) -> None:
    """The crop window lies inside the original image."""
    crop = meta.get("crop") or {}
    for axis in ("line", "pixel"):
        total, last = meta.get(f"number_of_{axis}s_original"), crop.get(f"last_{axis}")
        if total is not None and last is not None and last > total:
            get.problem(f"Last_{axis} (w.r.t. original_image)",
                        f"a {axis} within the {total} {axis}s of the original image "
                        "(section 'crop')", str(last))


def _derive(meta: dict[str, Any]) -> None:
    """Quantities every driver provides, computed where the file does not state them."""
    if meta.get("radar_frequency") is None and meta.get("wavelength"):
        meta["radar_frequency"] = SPEED_OF_LIGHT / meta["wavelength"]
    if meta.get("azimuth_time_interval") is None and meta.get("prf"):
        meta["azimuth_time_interval"] = 1.0 / meta["prf"]
    if meta.get("range_time_first_pixel") is not None:
        meta["slant_range_first_pixel"] = SPEED_OF_LIGHT * meta["range_time_first_pixel"] / 2
    if meta.get("range_sampling_rate"):
        meta["slant_range_spacing"] = SPEED_OF_LIGHT / (2 * meta["range_sampling_rate"])
    if meta.get("first_azimuth_time") is not None:
        meta["date"] = meta["first_azimuth_time"].astype("datetime64[D]").astype("datetime64[ns]")
    # the size of the image a stack holds: the resampled one, else the crop, else the original
    latest = next((w for w in (meta.get("resample"), meta.get("crop"))
                   if w and "number_of_lines" in w), None)
    for axis in ("lines", "pixels"):
        meta[f"number_of_{axis}"] = (latest[f"number_of_{axis}"] if latest
                                     else meta.get(f"number_of_{axis}_original"))


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

#: Keys of the dict returned by :func:`read_metadata`, with unit and meaning. Keys whose value
#: the file does not give are present with value None (except the optional baseline keys, which
#: appear only when an ``ifgs.res`` is found beside a DORIS v5 file).
METADATA_KEYS = {
    "path": ("", "the file read"),
    "driver": ("", "'doris4' or 'doris5'"),
    "sensor": ("", "platform, e.g. 'S1B', 'TDX-1'"),
    "sar_processor": ("", "SAR processor or satellite name as written"),
    "product_type": ("", "product type specifier"),
    "pass_direction": ("", "'ascending' or 'descending'"),
    "swath": ("", "DORIS v5: swath, e.g. 'IW3'"),
    "image_mode": ("", "DORIS v5: acquisition mode, e.g. 'IW'"),
    "polarisation": ("", "DORIS v5: polarisation, e.g. 'VV'"),
    "data_file": ("", "original data file name"),
    "data_format": ("", "original data format"),
    "wavelength": ("m", "radar wavelength"),
    "radar_frequency": ("Hz", "carrier frequency (c / wavelength where not stated)"),
    "first_azimuth_time": ("datetime64[ns]", "UTC azimuth time of the first line"),
    "date": ("datetime64[ns]", "acquisition date (first_azimuth_time at 00:00 UTC)"),
    "prf": ("Hz", "pulse repetition frequency (computed)"),
    "prf_raw": ("Hz", "DORIS v5: PRF of the raw TOPS data"),
    "azimuth_time_interval": ("s", "time between lines (1 / prf where not stated)"),
    "azimuth_bandwidth": ("Hz", "total azimuth bandwidth"),
    "range_time_first_pixel": ("s", "two-way range time to the first pixel"),
    "slant_range_first_pixel": ("m", "slant range to the first pixel, c * t / 2"),
    "range_sampling_rate": ("Hz", "range sampling rate"),
    "slant_range_spacing": ("m", "slant-range pixel spacing, c / (2 * range_sampling_rate)"),
    "range_bandwidth": ("Hz", "total range bandwidth"),
    "range_pixel_spacing": ("m", "DORIS v5: range pixel spacing as stated"),
    "azimuth_pixel_spacing": ("m", "DORIS v5: azimuth pixel spacing as stated"),
    "number_of_lines_original": ("", "lines of the original image"),
    "number_of_pixels_original": ("", "pixels per line of the original image"),
    "crop": ("dict", "crop window: first/last_line/pixel (1-based, inclusive, w.r.t. the "
                     "original image), number_of_lines/pixels, data_file, data_format; or None"),
    "resample": ("dict", "resampled window w.r.t. the original mother image, same keys; "
                         "or None"),
    "number_of_lines": ("", "lines of the latest product: resample, else crop, else original"),
    "number_of_pixels": ("", "pixels of the latest product: resample, else crop, else original"),
    "scene_centre_latitude": ("degrees", "scene centre latitude (WGS84)"),
    "scene_centre_longitude": ("degrees", "scene centre longitude (WGS84)"),
    "scene_corners": ("degrees", "DORIS v5: (4, 2) lat, lon of the ul, ur, lr, ll corners"),
    "heading": ("degrees", "DORIS v5: heading at the scene centre"),
    "orbit": ("s, m", "(n, 4) state vectors: seconds of the UTC day, X, Y, Z (Earth-fixed)"),
    "perpendicular_baseline": ("m", "ifgs.res: perpendicular baseline to the mother"),
    "parallel_baseline": ("m", "ifgs.res: parallel baseline"),
    "look_angle": ("degrees", "ifgs.res: look angle at the control point"),
    "incidence_angle": ("degrees", "ifgs.res: incidence angle at the control point"),
    "height_of_ambiguity": ("m", "ifgs.res: height of ambiguity"),
    "ifg_number_of_lines": ("", "ifgs.res: interferogram lines (multilooked)"),
    "ifg_number_of_pixels": ("", "ifgs.res: interferogram pixels (multilooked)"),
}


def read_metadata(path: str | os.PathLike, *, driver: Driver = "auto") -> dict[str, Any]:
    """Read one DORIS v4 or v5 ``.res`` result file into a dict in SI units.

    Parameters
    ----------
    path
        The result file (``slave.res``, ``master.res``, ``metadata.res``). For DORIS v5, an
        ``ifgs.res`` in the same folder adds the baseline geometry (``perpendicular_baseline``,
        ``incidence_angle``, ...), which h2ph needs.
    driver
        ``"doris4"`` (e.g. TerraSAR-X / TanDEM-X stacks), ``"doris5"`` (Sentinel-1 TOPS) or
        ``"auto"`` (tell them apart from the header).

    Returns
    -------
    dict
        The keys of :data:`METADATA_KEYS`: ``wavelength`` (m), ``first_azimuth_time`` and
        ``date`` (``datetime64[ns]``), ``prf`` and ``azimuth_time_interval``,
        ``range_time_first_pixel`` (s, two-way) and ``range_sampling_rate`` (Hz),
        ``number_of_lines[_original]``, ``crop`` / ``resample`` windows, scene centre,
        ``heading``, ``orbit`` (``(n, 4)`` array) and more.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    MetadataError
        When a required field is missing or any field is malformed (an unparseable time, a
        wavelength outside 1 mm .. 1 m or inconsistent with the radar frequency, a truncated
        file ...). The message names the file and lists every bad field with what was expected
        and what was found.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> res = pathlib.Path(tempfile.mkdtemp()) / "slave.res"
    >>> _ = res.write_text('''DVersion: Version (2015) (For TOPSAR)
    ... *_Start_readfiles:
    ... Radar_wavelength (m):                      0.055465760
    ... First_pixel_azimuth_time (UTC):            2018-Mar-06 17:24:29.954980
    ... Pulse_Repetition_Frequency (computed, Hz): 486.486310
    ... Range_time_to_first_pixel (2way) (ms):     6.013024343276740
    ... Range_sampling_rate (computed, MHz):       64.345238126
    ... Number_of_lines_original:                  6878
    ... Number_of_pixels_original:                 25133
    ... * End_readfiles:_NORMAL
    ... ''')
    >>> meta = read_metadata(res)
    >>> meta["wavelength"], str(meta["date"])[:10], round(meta["slant_range_first_pixel"])
    (0.05546576, '2018-03-06', 901330)
    """
    path = Path(path)
    if driver not in DRIVERS:
        raise ValueError(f"driver: expected one of {DRIVERS}, found {driver!r}")
    if not path.is_file():
        raise FileNotFoundError(f"metadata file '{path}' does not exist")
    text = read_bounded_text(path, what="metadata file", max_bytes=MAX_RES_BYTES)
    detected = detect_driver(text)
    if driver == "auto":
        if detected is None:
            raise MetadataError(
                f"metadata file '{path}': expected a DORIS v4 or v5 result file (a 'Version: "
                f"version 4.x' or 'DVersion' header, or a First_pixel_azimuth_time field), "
                f"found neither; pass driver='doris4' or 'doris5'", paths=[str(path)])
        driver = detected
    elif detected is not None and detected != driver:
        logger.warning("metadata file %s looks like %s but is read with driver=%r",
                       path, detected, driver)

    fields, lines = _split_sections(text)
    get = _Collector(fields)
    if "readfiles" not in fields:
        _raise_problems(path, [("section 'readfiles'", "a '*_Start_readfiles' section with "
                                "the acquisition parameters", "no such section")])
    meta: dict[str, Any] = {"path": str(path), "driver": driver}
    meta.update(_readfiles(get, driver))
    meta["crop"] = _window(get, "crop", "original_image")
    meta["resample"] = _window(get, "resample", "original_master")
    meta["orbit"] = _orbit(get, lines)
    _check_wavelength(meta, get)
    _check_crop(meta, get)
    _check_process_control(get)
    if get.problems:
        _raise_problems(path, get.problems)
    _derive(meta)
    meta.update(_interferogram(path, driver))
    return meta


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.shape == b.shape and bool(np.array_equal(a, b)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b) if type(a) is type(b) else False


def combine_metadata(epochs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine per-epoch metadata dicts (from :func:`read_metadata`) into one stack dict.

    Keeps the input order (epoch ``i`` is ``epochs[i]``). Checks that all epochs share one
    wavelength and that no two share a date.

    Returns
    -------
    dict
        ``files``, ``dates`` (``datetime64[ns]``, one per epoch, at 00:00 UTC),
        ``first_azimuth_times``, ``wavelength`` (m), ``epochs`` (the input dicts), ``varying``
        (keys whose value differs between epochs) and every other key: the common value when
        all epochs agree, else a per-epoch array (numbers) or list.

    Raises
    ------
    MetadataError
        Mixed wavelengths or duplicate dates, naming the files.

    Examples
    --------
    >>> import numpy as np
    >>> a = {"path": "a.res", "wavelength": 0.0555, "first_azimuth_time":
    ...      np.datetime64("2020-01-01T05:00", "ns"), "prf": 486.5}
    >>> b = dict(a, path="b.res", first_azimuth_time=np.datetime64("2020-01-13T05:00", "ns"))
    >>> stack = combine_metadata([a, b])
    >>> stack["dates"].astype("datetime64[D]").tolist(), stack["prf"], stack["varying"]
    ([datetime.date(2020, 1, 1), datetime.date(2020, 1, 13)], 486.5, ['first_azimuth_time', 'path'])
    """
    if not epochs:
        raise ValueError("metadata: expected at least one epoch, found none")
    files = [str(m.get("path", f"epoch {i}")) for i, m in enumerate(epochs)]
    for i, m in enumerate(epochs):
        for key in ("wavelength", "first_azimuth_time"):
            if m.get(key) is None:
                raise MetadataError(f"metadata of {files[i]!r}: expected {key!r}, found none",
                                    paths=[files[i]])
    wavelengths = np.array([float(m["wavelength"]) for m in epochs])
    reference = wavelengths[0]
    if np.any(np.abs(wavelengths - reference) > WAVELENGTH_RTOL * reference):
        groups: dict[float, list[str]] = {}
        for w, f in zip(wavelengths, files):
            groups.setdefault(float(w), []).append(f)
        listing = "; ".join(f"{w!r} m in {fs}" for w, fs in groups.items())
        raise MetadataError(f"wavelength: expected one radar wavelength for the whole stack, "
                            f"found {len(groups)}: {listing}", paths=files)
    times = np.array([np.datetime64(m["first_azimuth_time"], "ns") for m in epochs])
    dates = times.astype("datetime64[D]").astype("datetime64[ns]")
    unique, counts = np.unique(dates, return_counts=True)
    if (counts > 1).any():
        clashes = [f"{str(d)[:10]}: {[f for f, e in zip(files, dates) if e == d]}"
                   for d in unique[counts > 1]]
        raise MetadataError(f"dates: expected one epoch per date, found duplicate dates "
                            f"{'; '.join(clashes)}", paths=files)

    stack: dict[str, Any] = {"files": files, "dates": dates, "first_azimuth_times": times,
                             "wavelength": float(reference), "epochs": list(epochs)}
    varying = []
    keys = dict.fromkeys(k for m in epochs for k in m)
    for key in keys:
        if key in ("wavelength", "date"):
            continue
        values = [m.get(key) for m in epochs]
        if all(_same(values[0], v) for v in values[1:]):
            stack.setdefault(key, values[0])
            continue
        varying.append(key)
        numeric = all(isinstance(v, (int, float, np.number, np.datetime64)) and
                      not isinstance(v, bool) for v in values)
        stack[key] = np.array(values) if numeric else values
    stack["varying"] = sorted(varying)
    return stack


def read_metadata_stack(paths: Iterable[str | os.PathLike], *,
                        driver: Driver = "auto") -> dict[str, Any]:
    """Read one DORIS result file per epoch and combine them into one stack dict.

    Parameters
    ----------
    paths
        One ``.res`` file per epoch, in the order of the data files they describe (the order
        is kept: ``dates[i]`` belongs to ``paths[i]``).
    driver
        As in :func:`read_metadata`.

    Returns
    -------
    dict
        See :func:`combine_metadata`: ``files``, ``dates``, ``first_azimuth_times``,
        ``wavelength``, ``epochs``, ``varying`` and the common or per-epoch value of every
        key of :func:`read_metadata`.

    Raises
    ------
    MetadataError
        A malformed file, mixed wavelengths or duplicate dates, naming the files.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> body = '''DVersion: Version (2015) (For TOPSAR)
    ... *_Start_readfiles:
    ... Radar_wavelength (m):                      0.055465760
    ... First_pixel_azimuth_time (UTC):            {date} 17:24:29.954980
    ... Pulse_Repetition_Frequency (computed, Hz): 486.486310
    ... Range_time_to_first_pixel (2way) (ms):     6.013024343276740
    ... Range_sampling_rate (computed, MHz):       64.345238126
    ... Number_of_lines_original:                  6878
    ... Number_of_pixels_original:                 25133
    ... * End_readfiles:_NORMAL
    ... '''
    >>> for name, date in (("a.res", "2018-Mar-06"), ("b.res", "2018-Mar-18")):
    ...     _ = (folder / name).write_text(body.format(date=date))
    >>> stack = read_metadata_stack([folder / "a.res", folder / "b.res"])
    >>> [str(d)[:10] for d in stack["dates"]], stack["wavelength"]
    (['2018-03-06', '2018-03-18'], 0.05546576)
    """
    files = [Path(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    if not files:
        raise ValueError("paths: expected at least one metadata file, found none")
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"metadata files do not exist: {missing}")
    return combine_metadata([read_metadata(p, driver=driver) for p in files])


def resolve_metadata(metadata: Any, *, driver: Driver = "auto") -> dict[str, Any]:
    """Turn what a reader's ``metadata=`` argument may hold into a stack dict.

    Accepts a stack dict (from :func:`read_metadata_stack`), one per-file dict, a list of
    per-file dicts, one path or a list of paths to ``.res`` files.

    Examples
    --------
    >>> import numpy as np
    >>> one = {"path": "a.res", "wavelength": 0.031, "first_azimuth_time":
    ...        np.datetime64("2018-03-01T17:19:09", "ns")}
    >>> resolve_metadata(one)["files"]
    ['a.res']
    """
    if isinstance(metadata, dict):
        if "dates" in metadata and "wavelength" in metadata:
            return metadata
        return combine_metadata([metadata])
    if isinstance(metadata, (str, os.PathLike)):
        return read_metadata_stack([metadata], driver=driver)
    items = list(metadata)
    if items and all(isinstance(m, dict) for m in items):
        return combine_metadata(items)
    if items and all(isinstance(m, (str, os.PathLike)) for m in items):
        return read_metadata_stack(items, driver=driver)
    raise TypeError("metadata: expected a dict from read_metadata(_stack), a list of such "
                    f"dicts, or paths to .res files; found {type(metadata).__name__}")


__all__ = [
    "DRIVERS",
    "MAX_RES_BYTES",
    "METADATA_KEYS",
    "SPEED_OF_LIGHT",
    "combine_metadata",
    "detect_driver",
    "parse_azimuth_time",
    "read_metadata",
    "read_metadata_stack",
    "resolve_metadata",
]

