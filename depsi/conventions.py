"""The conventions every module of depsi follows, defined once: phase wrapping, the phase-per-metre
factor ``m2ph``, time baselines, sentinels and physical constants (docs/design.md, "Conventions:
signs and units").

This is the lowest layer: it imports only NumPy and the standard library, and its array
functions use plain operators, so they work unchanged on NumPy, CuPy, Dask and xarray objects.
Every other module imports these names from here; a second copy (with, say, another time
origin) is a bug waiting, and ``tests/test_conventions.py`` looks for one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Speed of light in vacuum (m/s), exact by the definition of the metre.
SPEED_OF_LIGHT = 299_792_458.0

#: Days per year of time baselines (a Julian year).
DAYS_PER_YEAR = 365.25

#: ``ambiguity`` at an epoch that has no valid phase (NaN): int32 has no NaN, and 0 is a valid
#: ambiguity. Arc products say so in ``attrs["missing_ambiguity"]``. A whole point without a
#: solution (off the network, or a rejected densification candidate) is marked by its
#: ``in_network`` / ``accepted`` mask instead, with NaN floats and ambiguity 0 (docs/chain.md).
MISSING_AMBIGUITY = int(np.iinfo(np.int32).min)

#: English month abbreviations, as DORIS result files and SNAP product names write dates
#: (``2018-Mar-06``, ``19Mar2023``); month ``i`` is ``MONTH_ABBREVIATIONS[i - 1]``.
MONTH_ABBREVIATIONS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun",
                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

#: Month number (1..12) of each lower-case abbreviation, for parsing without the locale.
MONTH_NUMBERS = {name.lower(): number for number, name in enumerate(MONTH_ABBREVIATIONS, 1)}

_TWO_PI = 2.0 * np.pi


def wrap_phase(phase: Any) -> Any:
    """Wrap radians to ``(-pi, pi]``: ``pi`` stays ``pi``, ``-pi`` becomes ``pi``; NaN stays NaN.

    Plain operators only, so NumPy, CuPy, Dask and xarray inputs keep their type and dtype (and
    a Dask input stays lazy).

    Examples
    --------
    >>> wrap_phase(np.array([np.pi, -np.pi, 3 * np.pi / 2, np.nan])).round(4).tolist()
    [3.1416, 3.1416, -1.5708, nan]
    """
    # the nearest whole number of cycles off (half-way rounds to even), then the values the
    # rounding of that product left at -pi or below moved up a cycle, and those it left above
    # pi (by an ulp of a large input) moved down one: both moves are exact (Sterbenz), so the
    # result is in (-pi, pi] of the input's dtype, faster than the floating remainder
    # (docs/benchmarks.md, "Array operations"). Plain operators and ufuncs: float32 stays float32,
    # xarray stays xarray.
    wrapped = phase - np.rint(phase * (1.0 / _TWO_PI)) * _TWO_PI
    cycles = (wrapped <= -np.pi).astype(wrapped.dtype) - (wrapped > np.pi).astype(wrapped.dtype)
    return wrapped + cycles * _TWO_PI


def phase_per_metre(wavelength: float) -> float:
    """``m2ph = -4 pi / wavelength``: radians of interferometric phase per metre of
    line-of-sight displacement (the sign convention of the Delft method).

    Raises
    ------
    ValueError
        For a wavelength that is not a positive number of metres.

    Examples
    --------
    >>> round(phase_per_metre(0.0555), 2)
    -226.42
    """
    value = float(wavelength)
    if not value > 0:
        raise ValueError(f"wavelength: expected a positive length in metres, found "
                         f"{wavelength!r}")
    return -4.0 * np.pi / value


def years_since(times: Any, origin: Any) -> np.ndarray:
    """Time baselines of ``times`` from ``origin``, in years of :data:`DAYS_PER_YEAR` days.

    Parameters
    ----------
    times
        Acquisition dates: datetime64 values, or ISO date strings.
    origin
        The epoch of zero time (datetime64 or ISO string). The chain counts from the mother
        epoch (:func:`depsi.stm.schema.years_since_mother` reads it from a Dataset); say which
        one a function uses.

    Returns
    -------
    numpy.ndarray
        float64, the shape of ``times``.

    Raises
    ------
    ValueError
        When ``times`` are not dates (numbers would be read as nanoseconds since 1970).

    Examples
    --------
    >>> dates = np.array(["2020-01-01", "2021-01-01"], dtype="datetime64[D]")
    >>> years_since(dates, dates[0]).tolist()
    [0.0, 1.002053388090349]
    >>> years_since(dates, "2021-01-01").tolist()
    [-1.002053388090349, 0.0]
    """
    times = np.asarray(times)
    if times.dtype.kind in "US":
        times = times.astype("datetime64[ns]")
    if times.dtype.kind != "M":
        raise ValueError(f"times: expected datetime64 acquisition dates, found dtype "
                         f"{times.dtype}")
    days = (times - np.datetime64(origin)) / np.timedelta64(1, "D")
    return np.asarray(days, dtype=np.float64) / DAYS_PER_YEAR
