"""The chain's temporal model beyond velocity and height error, and each point's choice of it.

A point's displacement is ``velocity * t`` plus any of these terms (``model.terms``), each a
regressor shared by every point (one value per epoch) times a per-point coefficient:

- ``seasonal``: annual ``sin`` and ``cos`` of the calendar year (``seasonal_sin``,
  ``seasonal_cos``, m); ``semi_annual``: the same at twice the frequency (``semi_annual_sin``,
  ``semi_annual_cos``, m). The phase counts from 1 January, so a cosine term peaks on it.
- ``thermal``: the temperature of each epoch (a CSV of dates and temperatures) less its mean
  over the epochs; the coefficient ``thermal`` is in m/K (thermal dilation of a structure).
- ``step``: ``0`` before and ``1`` from each date of ``step_dates`` (``step_YYYYMMDD``, m).
- ``breakpoint``: ``max(t - t_b, 0)`` years from each date of ``breakpoint_dates``
  (``breakpoint_YYYYMMDD``, m/yr): the change of velocity there.

The terms enter every step that models a point's phase (``model.arcs`` and
``model.densification`` say which the periodograms search, where an ambiguity depends on them),
and the final fit chooses, per point, the model its phase supports: every combination of the
terms is tested against the linear model (offset, velocity, height error) by an F test on the
a-posteriori variance, and the combination with the largest test ratio (its statistic over its
critical value, DePSI's multiple hypothesis testing) above 1 is kept; a point with none keeps
the linear model. :func:`fit_models` does that, batched over points.
"""

from __future__ import annotations

import csv
import itertools
import logging
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Final, Literal, cast

import dask
import dask.array as da
import numpy as np
import xarray as xr
from pydantic import Field, field_validator, model_validator
from scipy import stats

from depsi.conventions import DAYS_PER_YEAR, phase_per_metre
from depsi.kernels.periodogram import result_coherence
from depsi.sections import Section, iso_dates, ordered_pair
from depsi.stm.schema import h2ph_rows, years_since_mother

logger = logging.getLogger(__name__)

#: The terms a model may have besides offset, velocity and height error, in column order.
TERMS = ("seasonal", "semi_annual", "thermal", "step", "breakpoint")

Term = Literal["seasonal", "semi_annual", "thermal", "step", "breakpoint"]

#: Default search ranges of the periodograms, per coefficient: seasonal and semi-annual sine
#: and cosine (m; an arc's difference of two 10 mm amplitudes), thermal (m/K), steps (m: a
#: step of half a wavelength is a whole cycle after its date, invisible in wrapped phase, so a
#: search reaching it picks a cycle at random; within a quarter wavelength at C band) and
#: breakpoints (m/yr).
DEFAULT_SEASONAL_RANGE = (-0.02, 0.02)
DEFAULT_THERMAL_RANGE = (-0.001, 0.001)
DEFAULT_STEP_RANGE = (-0.012, 0.012)
DEFAULT_BREAKPOINT_RANGE = (-0.03, 0.03)

#: Grid step of a searched term, as the largest change of its modelled phase across the epochs
#: between adjacent nodes (rad): twice the periodogram's own ``GRID_PHASE_STEP`` for velocity
#: and height. The Newton refinement converges from within pi/2 of the peak's phase pattern;
#: measured on 2,000 arcs (60 epochs, 0.6 rad noise, seasonal differences up to 15 mm): no
#: wrong ambiguity at pi (as at pi/2), 8 % at 1.45 pi, in a fifth of pi/2's time with two
#: seasonal terms (docs/chain.md, "Motion models").
SEARCH_PHASE_STEP = np.pi

#: How each point's model is chosen: by the F tests (``"full"``: every term for every point).
DEFAULT_CHOICE: Final = "test"

#: False-alarm rate of each F test of the model choice.
DEFAULT_ALPHA = 0.005

#: The linear model's columns: what every model has.
LINEAR = ("velocity", "height_error", "offset")


class ModelConfig(Section):
    """The temporal model of every point beyond velocity and height error, per step."""

    terms: list[Term] = Field(
        [], description="Terms beyond offset, velocity and height error: seasonal, "
                        "semi_annual, thermal, step, breakpoint. Fitted by the first-order "
                        "points' refit, the atmosphere's residual and the final model.")
    arcs: list[Term] | None = Field(
        None, description="Terms the arcs' periodogram searches (a subset of terms); null: "
                          "all of terms. Each searched term multiplies the grid by its nodes.")
    densification: list[Term] | None = Field(
        None, description="Terms densification's periodogram searches (a subset of terms); "
                          "null: all of terms.")
    temperature: Path | None = Field(
        None, description="CSV file with columns date (YYYY-MM-DD) and temperature (K above "
                          "200, else degC), a row for every epoch: the thermal term's "
                          "regressor.")
    step_dates: list[str] = Field(
        [], description="Dates (YYYY-MM-DD) of the steps of the 'step' term.")
    breakpoint_dates: list[str] = Field(
        [], description="Dates (YYYY-MM-DD) where the 'breakpoint' term changes the velocity.")
    seasonal_range: tuple[float, float] = Field(
        DEFAULT_SEASONAL_RANGE, description="Range searched of each seasonal and semi-annual "
                                            "sine and cosine coefficient, [low, high] m.")
    thermal_range: tuple[float, float] = Field(
        DEFAULT_THERMAL_RANGE, description="Range searched of the thermal coefficient, "
                                           "[low, high] m/K.")
    step_range: tuple[float, float] = Field(
        DEFAULT_STEP_RANGE, description="Range searched of each step, [low, high] m (within a "
                                        "quarter wavelength: larger steps are cycles).")
    breakpoint_range: tuple[float, float] = Field(
        DEFAULT_BREAKPOINT_RANGE, description="Range searched of each change of velocity, "
                                              "[low, high] m/yr.")
    choice: Literal["test", "full"] = Field(
        DEFAULT_CHOICE, description="'test': each point keeps the model its phase supports (F "
                                    "tests against the linear model); 'full': every point "
                                    "keeps every term.")
    alpha: float = Field(
        DEFAULT_ALPHA, gt=0, lt=0.5, description="False-alarm rate of each test of the model "
                                                 "choice.")

    @field_validator("seasonal_range", "thermal_range", "step_range", "breakpoint_range")
    @classmethod
    def _ordered(cls, pair: tuple[float, float], info) -> tuple[float, float]:
        return ordered_pair(pair, info.field_name)

    @field_validator("step_dates", "breakpoint_dates", mode="before")
    @classmethod
    def _date_objects(cls, dates: Any) -> Any:
        return iso_dates(dates)

    @field_validator("step_dates", "breakpoint_dates")
    @classmethod
    def _dates(cls, dates: list[str]) -> list[str]:
        for text in dates:
            try:
                date.fromisoformat(text)
            except ValueError:
                raise ValueError(f"expected dates as YYYY-MM-DD, found {text!r}") from None
        if len(set(dates)) != len(dates):
            raise ValueError(f"expected each date once, found {dates}")
        return dates

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if len(set(self.terms)) != len(self.terms):
            raise ValueError(f"terms: expected each term once, found {self.terms}")
        for name in ("arcs", "densification"):
            extra = sorted(set(getattr(self, name) or ()) - set(self.terms))
            if extra:
                raise ValueError(f"{name}: expected terms among model.terms {self.terms}, "
                                 f"found {extra}")
        if "thermal" in self.terms and self.temperature is None:
            raise ValueError("terms: 'thermal' needs temperature, a CSV of date and "
                             "temperature per epoch")
        if "step" in self.terms and not self.step_dates:
            raise ValueError("terms: 'step' needs step_dates")
        if "breakpoint" in self.terms and not self.breakpoint_dates:
            raise ValueError("terms: 'breakpoint' needs breakpoint_dates")
        return self


@dataclass(frozen=True)
class TemporalModel:
    """The regressors of a model's terms at a stack's epochs.

    Attributes
    ----------
    groups
        Term name to its columns' names, in :data:`TERMS` order (``seasonal`` has two).
    regressors
        Column name to its ``(T,)`` float64 values (metres of displacement per unit of the
        coefficient).
    ranges
        Column name to the ``(low, high)`` range the periodograms search.
    """

    groups: dict[str, tuple[str, ...]]
    regressors: dict[str, np.ndarray]
    ranges: dict[str, tuple[float, float]]

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column's name, in order."""
        return tuple(name for names in self.groups.values() for name in names)

    def search(self, terms: list[str] | tuple[str, ...] | None, wavelength: float
               ) -> dict[str, tuple]:
        """The periodogram's ``extra_regressors`` of ``terms`` (all when None): column name to
        ``(values, (low, high), step)``, the step from :data:`SEARCH_PHASE_STEP`."""
        chosen = self.groups if terms is None else [t for t in self.groups if t in terms]
        scale = abs(phase_per_metre(wavelength))
        out = {}
        for term in chosen:
            for name in self.groups[term]:
                low, high = self.ranges[name]
                if term == "step" and max(-low, high) >= wavelength / 4:
                    # a step of half a wavelength is a whole cycle: no grid can tell it from 0
                    limit = 0.99 * wavelength / 4
                    logger.warning("model.step_range %s reaches a quarter wavelength (%.4f m), "
                                   "where a step is a cycle's ambiguity: searched within +-%.4f m",
                                   [low, high], wavelength / 4, limit)
                    low, high = max(low, -limit), min(high, limit)
                out[name] = (self.regressors[name], (low, high),
                             SEARCH_PHASE_STEP / (scale * float(np.ptp(self.regressors[name]))))
        return out

    def __bool__(self) -> bool:
        return bool(self.groups)


def _day_number(value) -> float:
    """Days since 1970-01-01 of a date or datetime64."""
    return float(np.datetime64(value, "ns").astype("datetime64[ns]").astype(np.int64)) / 86400e9


#: Temperatures above this are read as kelvin, those at or below it as degrees Celsius: the
#: coldest air ever measured is 184 K (-89 degC), the hottest 57 degC, so the two ranges of
#: real temperatures do not meet near 200. A file with both is refused.
KELVIN_ABOVE = 200.0

#: Rows named in a message about a file's rows.
_ROWS_SHOWN = 5


def _delimiter(header: str, path: Path) -> str:
    """``,`` or ``;`` (Excel's CSV where the decimal mark is a comma), from the header line."""
    commas, semicolons = "," in header, ";" in header
    if commas and semicolons:
        raise ValueError(f"model.temperature: expected columns separated by ',' or by ';', "
                         f"found both in the header {header.strip()!r} of {str(path)!r}")
    return ";" if semicolons else ","


def _number(text: str | None, delimiter: str) -> float:
    """A temperature as written; with ``;`` separators a decimal comma is read as a point."""
    text = (text or "").strip()
    if delimiter == ";" and "," in text and "." not in text:
        text = text.replace(",", ".")
    return float(text)


def _lines(lines: list[int]) -> str:
    shown = ", ".join(str(line) for line in lines[:_ROWS_SHOWN])
    return f"{shown}{', ...' if len(lines) > _ROWS_SHOWN else ''} ({len(lines)} rows)"


def _temperature_unit(table: dict[str, float], lines: dict[str, int], path: Path) -> str:
    """``"K"`` or ``"degC"`` by :data:`KELVIN_ABOVE`; a file with both is refused, naming rows
    of each."""
    kelvin = [lines[day] for day, value in table.items() if value > KELVIN_ABOVE]
    celsius = [lines[day] for day, value in table.items() if value <= KELVIN_ABOVE]
    if kelvin and celsius:
        raise ValueError(
            f"model.temperature: expected one unit in {str(path)!r}, found kelvin (above "
            f"{KELVIN_ABOVE:g}) on lines {_lines(kelvin)} and degrees Celsius (at most "
            f"{KELVIN_ABOVE:g}) on lines {_lines(celsius)}")
    return "K" if kelvin else "degC"


def read_temperature(path: str | Path, time: np.ndarray) -> np.ndarray:
    """The temperature of each epoch from a CSV of ``date,temperature`` rows.

    The file may start with a UTF-8 byte-order mark (Excel's "CSV UTF-8") and end its lines
    in CRLF; its columns are separated by ``,`` or, where the header has no comma, by ``;``
    (then a decimal comma is read as a point). Temperatures are kelvin above
    :data:`KELVIN_ABOVE`, degrees Celsius below; the unit read is logged, and a file with both
    is refused. The thermal term uses the temperatures less their mean, the same in either.

    Parameters
    ----------
    path
        CSV file with a header naming the columns ``date`` (YYYY-MM-DD; a time after it is
        ignored) and ``temperature``; other columns are ignored.
    time
        The epochs (datetime64).

    Returns
    -------
    numpy.ndarray
        float64 ``(T,)``, one temperature per epoch (the row of the epoch's date), in the
        file's unit.

    Raises
    ------
    ValueError
        For a file without those columns, a value that is not a finite number, a date twice,
        temperatures in both units (naming rows of each), or epochs without a row (naming the
        first few).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "t.csv").write_text("date,temperature\\n2021-01-01,3.5\\n2021-01-13,-1\\n")
    >>> read_temperature(folder / "t.csv", np.array(["2021-01-13"], "datetime64[ns]")).tolist()
    [-1.0]
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model.temperature: {str(path)!r} does not exist")
    table: dict[str, float] = {}
    lines: dict[str, int] = {}
    with open(path, newline="", encoding="utf-8-sig") as handle:
        delimiter = _delimiter(handle.readline(), path)
        handle.seek(0)  # the decoder starts anew: a byte-order mark is skipped again
        reader = csv.DictReader(handle, delimiter=delimiter)
        fields = [f.strip().lower() for f in (reader.fieldnames or [])]
        if "date" not in fields or "temperature" not in fields:
            raise ValueError(f"model.temperature: expected columns 'date' and 'temperature' in "
                             f"{str(path)!r}, found {reader.fieldnames}")
        reader.fieldnames = fields
        for line, row in enumerate(reader, start=2):
            day = (row["date"] or "").strip()[:10]
            try:
                date.fromisoformat(day)
                value = _number(row["temperature"], delimiter)
            except (TypeError, ValueError):
                raise ValueError(f"model.temperature: line {line} of {str(path)!r}: expected "
                                 f"a date YYYY-MM-DD and a number, found {row['date']!r}, "
                                 f"{row['temperature']!r}") from None
            if not np.isfinite(value):
                raise ValueError(f"model.temperature: line {line} of {str(path)!r}: expected a "
                                 f"finite temperature, found {value}")
            if day in table:
                raise ValueError(f"model.temperature: date {day} twice in {str(path)!r}")
            table[day], lines[day] = value, line
    unit = _temperature_unit(table, lines, path)
    logger.info("model.temperature: %d rows of %r read in %s (kelvin above %g)", len(table),
                str(path), "kelvin" if unit == "K" else "degrees Celsius", KELVIN_ABOVE)
    days = [str(np.datetime64(t, "D")) for t in np.asarray(time)]
    missing = [d for d in days if d not in table]
    if missing:
        raise ValueError(f"model.temperature: no temperature for {len(missing)} epoch(s) in "
                         f"{str(path)!r}, e.g. {', '.join(missing[:3])}")
    return np.array([table[d] for d in days], dtype=np.float64)


def temporal_model(config: ModelConfig | None, time: np.ndarray) -> TemporalModel:
    """The regressors of ``config``'s terms at the epochs ``time`` (datetime64).

    Examples
    --------
    >>> time = np.datetime64("2021-01-01", "ns") + np.arange(4) * np.timedelta64(91, "D")
    >>> model = temporal_model(ModelConfig(terms=["seasonal", "step"],
    ...                                    step_dates=["2021-05-01"]), time)
    >>> model.columns
    ('seasonal_sin', 'seasonal_cos', 'step_20210501')
    >>> model.regressors["step_20210501"].tolist(), float(model.regressors["seasonal_cos"][0])
    ([0.0, 0.0, 1.0, 1.0], 1.0)
    """
    groups: dict[str, tuple[str, ...]] = {}
    regressors: dict[str, np.ndarray] = {}
    ranges: dict[str, tuple[float, float]] = {}
    if config is None or not config.terms:
        return TemporalModel(groups, regressors, ranges)
    time = np.asarray(time).astype("datetime64[ns]")
    days = np.array([_day_number(t) for t in time])
    first_year = int(str(np.datetime64(time.min(), "Y")))
    calendar = (days - _day_number(np.datetime64(f"{first_year}-01-01"))) / DAYS_PER_YEAR
    for term in TERMS:
        if term not in config.terms:
            continue
        if term in ("seasonal", "semi_annual"):
            cycles = 1.0 if term == "seasonal" else 2.0
            columns = {f"{term}_sin": np.sin(2 * np.pi * cycles * calendar),
                       f"{term}_cos": np.cos(2 * np.pi * cycles * calendar)}
            span = config.seasonal_range
        elif term == "thermal":
            # a file wherever the terms hold "thermal" (the config's validator)
            temperature = read_temperature(cast(Path, config.temperature), time)
            columns = {"thermal": temperature - temperature.mean()}
            span = config.thermal_range
        elif term == "step":
            columns = {f"step_{d.replace('-', '')}": (days >= _day_number(d)).astype(np.float64)
                       for d in config.step_dates}
            span = config.step_range
        else:
            columns = {f"breakpoint_{d.replace('-', '')}":
                       np.maximum(days - _day_number(d), 0.0) / DAYS_PER_YEAR
                       for d in config.breakpoint_dates}
            span = config.breakpoint_range
        for name, values in columns.items():
            if np.ptp(values) == 0:
                raise ValueError(f"model: term {term!r} ({name}) does not vary over the epochs "
                                 f"{str(time[0])[:10]} to {str(time[-1])[:10]}")
        groups[term] = tuple(columns)
        regressors.update(columns)
        ranges.update({name: (span[0], span[1]) for name in columns})
    return TemporalModel(groups, regressors, ranges)


@dataclass(frozen=True)
class ModelFit:
    """What :func:`fit_models` gives per point.

    Attributes
    ----------
    coefficients
        Column name (``velocity``, ``height_error``, ``offset`` and the model's) to ``(N,)``
        float64 values of the chosen model; 0 for a term the point's model does not hold.
    choice
        ``(N,)`` int8: the index of each point's model in ``names``.
    names
        The candidate models' names: ``"linear"``, then ``"+"``-joined terms.
    masks
        ``(M, C)`` bool: which of the model's columns each candidate holds.
    statistics
        ``(N,)`` float64: the chosen model's test ratio (0 for the linear model).
    full
        Column name to ``(N,)`` float64 values of the model with every term (each term's
        estimate whether or not its test kept it).
    """

    coefficients: dict[str, np.ndarray]
    choice: np.ndarray
    names: tuple[str, ...]
    masks: np.ndarray
    statistics: np.ndarray
    full: dict[str, np.ndarray]


def candidates(model: TemporalModel, choice: str = DEFAULT_CHOICE
               ) -> tuple[tuple[str, ...], np.ndarray]:
    """The candidate models: their names and which of ``model.columns`` each holds.

    ``choice="test"``: the linear model and every combination of the terms; ``"full"``: the
    model with every term alone.

    Examples
    --------
    >>> time = np.datetime64("2021-01-01", "ns") + np.arange(9) * np.timedelta64(40, "D")
    >>> names, masks = candidates(temporal_model(ModelConfig(
    ...     terms=["seasonal", "step"], step_dates=["2021-06-01"]), time))
    >>> names
    ('linear', 'seasonal', 'step', 'seasonal+step')
    >>> masks.astype(int).tolist()[1]
    [1, 1, 0]
    """
    terms = list(model.groups)
    columns = model.columns
    if choice == "full":
        combos = [tuple(terms)]
    else:
        combos = [c for r in range(len(terms) + 1) for c in itertools.combinations(terms, r)]
    names = tuple("+".join(c) if c else "linear" for c in combos)
    masks = np.array([[any(col in model.groups[t] for t in c) for col in columns]
                      for c in combos], dtype=bool).reshape(len(combos), len(columns))
    return names, masks


def _solve(design: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-point least squares: coefficients ``(N, P)`` and residual sums of squares ``(N,)``
    of ``y (N, T)`` on ``design (N, T, P)`` (a zero column gets a zero coefficient)."""
    normal = np.einsum("ntp,ntq->npq", design, design)
    rhs = np.einsum("ntp,nt->np", design, y)
    x = np.einsum("npq,nq->np", np.linalg.pinv(normal, hermitian=True), rhs)
    r = y - np.einsum("ntp,np->nt", design, x)
    return x, np.einsum("nt,nt->n", r, r)


def fit_models(y: np.ndarray, h2ph: np.ndarray, years: np.ndarray, model: TemporalModel, *,
               choice: str = DEFAULT_CHOICE, alpha: float = DEFAULT_ALPHA) -> ModelFit:
    """Fit every candidate model to each point's displacement-like series and choose one.

    Parameters
    ----------
    y
        ``(N, T)`` observations in metres (e.g. the unwrapped phase over ``m2ph``), finite.
    h2ph
        ``(N, T)`` or ``(T,)`` height-to-phase factors (m of displacement per m of height).
    years
        ``(T,)`` time baselines (years).
    model
        The terms' regressors (:func:`temporal_model`).
    choice
        ``"test"`` (each point keeps the model with the largest F-test ratio above 1 against
        the linear model, else the linear one) or ``"full"`` (every term for every point).
    alpha
        False-alarm rate of each F test: a point whose series is the linear model plus white
        noise keeps a term with probability about ``alpha`` per candidate.

    Returns
    -------
    ModelFit

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> time = np.datetime64("2021-01-01", "ns") + np.arange(60) * np.timedelta64(12, "D")
    >>> years = np.arange(60) * 12 / 365.25
    >>> model = temporal_model(ModelConfig(terms=["seasonal"]), time)
    >>> h2ph = np.tile(rng.normal(0, 1e-3, 60), (2, 1))
    >>> y = 0.004 * years + rng.normal(0, 0.001, (2, 60))
    >>> y[1] += 0.008 * model.regressors["seasonal_sin"]
    >>> fit = fit_models(y, h2ph, years, model)
    >>> [fit.names[c] for c in fit.choice], round(float(fit.coefficients["seasonal_sin"][1]), 3)
    (['linear', 'seasonal'], 0.008)
    """
    y = np.asarray(y, dtype=np.float64)
    n, T = y.shape
    h2ph = np.broadcast_to(np.asarray(h2ph, dtype=np.float64).reshape(-1, T), (n, T))
    names, masks = candidates(model, choice)
    columns = model.columns
    base = [np.broadcast_to(years, (n, T)), h2ph, np.ones((n, T))]
    extra = [np.broadcast_to(model.regressors[c], (n, T)) for c in columns]
    n_models = len(names)
    solutions = np.empty((n_models, n, len(LINEAR) + len(columns)))
    rss = np.empty((n_models, n))
    for m, mask in enumerate(masks):
        design = np.stack(base + [g * float(keep) for g, keep in zip(extra, mask)], axis=2)
        solutions[m], rss[m] = _solve(design, y)
    ratio = np.zeros((n_models, n))
    linear = [m for m, mask in enumerate(masks) if not mask.any()]
    if linear and n_models > 1:
        null = rss[linear[0]]
        for m, mask in enumerate(masks):
            q = int(sum(mask))
            if q == 0:
                continue
            dof = T - len(LINEAR) - q
            if dof < 1:
                raise ValueError(f"model: {T} epochs cannot test {names[m]!r} ({q} terms "
                                 f"beyond the linear model's {len(LINEAR)})")
            statistic = ((null - rss[m]) / q) / np.maximum(rss[m] / dof, np.finfo(float).tiny)
            ratio[m] = statistic / stats.f.ppf(1.0 - alpha, q, dof)
        best = np.argmax(ratio, axis=0)
        chosen = np.where(ratio[best, np.arange(n)] > 1.0, best, linear[0])
    else:
        chosen = np.zeros(n, dtype=np.int64)
    picked = solutions[chosen, np.arange(n)]
    coefficients = {name: picked[:, i] for i, name in enumerate(LINEAR + columns)}
    full = {name: solutions[-1][:, i] for i, name in enumerate(LINEAR + columns)}
    return ModelFit(coefficients, chosen.astype(np.int8), names, masks,
                    ratio[chosen, np.arange(n)], full)


#: Points per block of :func:`refit_with_terms`: bounds its (points, epochs, columns) float64
#: designs whatever the number of points.
REFIT_BLOCK = 16384


def refit_with_terms(result: xr.Dataset, model: TemporalModel) -> xr.Dataset:
    """Integrated points with velocity, height error and every term of ``model`` fitted to
    their unwrapped phase (the full model, by least squares): what the atmosphere's residual
    and densification's local reference take the points' motion to be.

    Parameters
    ----------
    result
        Points with ``unwrapped_phase`` (rad), ``h2ph``, ``velocity``, ``height_error`` and
        ``attrs['wavelength']`` (e.g. :func:`~depsi.processing.integration.integrate_network`'s).
    model
        The terms (:func:`temporal_model`); without any, ``result`` is returned unchanged.

    Returns
    -------
    xarray.Dataset
        ``result`` with ``velocity`` and ``height_error`` refitted and one variable per column
        of ``model`` (float64 coefficients); points whose series is not finite keep their values
        and get NaN coefficients.
    """
    if not model:
        return result
    m2ph = phase_per_metre(float(result.attrs["wavelength"]))
    years = years_since_mother(result)
    n, T = result.sizes["space"], result.sizes["time"]
    unwrapped = result["unwrapped_phase"].transpose("space", "time").values
    h2ph_all = result["h2ph"].transpose("space", ...)
    velocity = result["velocity"].values.astype(np.float64)
    height = result["height_error"].values.astype(np.float64)
    columns = {name: np.full(n, np.nan) for name in model.columns}
    for start in range(0, n, REFIT_BLOCK):
        rows = np.arange(start, min(start + REFIT_BLOCK, n))
        y = unwrapped[rows].astype(np.float64) / m2ph
        ok = np.isfinite(y).all(axis=1)
        if not ok.any():
            continue
        fit = fit_models(y[ok], h2ph_rows(h2ph_all, rows[ok], T), years, model, choice="full")
        velocity[rows[ok]] = fit.coefficients["velocity"]
        height[rows[ok]] = fit.coefficients["height_error"]
        for name in model.columns:
            columns[name][rows[ok]] = fit.coefficients[name]
    out = result.assign({"velocity": ("space", velocity.astype(result["velocity"].dtype)),
                         "height_error": ("space", height.astype(result["height_error"].dtype)),
                         **{name: ("space", values, {"units": column_units(name)})
                            for name, values in columns.items()}})
    out.attrs = {**result.attrs, "model_terms": list(model.groups)}
    return out


#: The per-point figures of :func:`_terms_block` (besides each column's coefficient).
_TERMS_FIGURES = ("velocity", "height", "height64", "coherence", "chosen", "ratio", "ok")


def _terms_block(unwrapped, aps, h2ph, old, *, years, m2ph, common, model, choice, alpha
                 ) -> dict:
    """:func:`fit_terms_with_atmosphere` of one block of points: its per-point figures
    (``old``'s values where a series is not finite, ``ok`` false there)."""
    n, T = unwrapped.shape
    unwrapped = np.asarray(unwrapped).astype(np.float64)
    y = (unwrapped + np.asarray(aps) - common) / m2ph
    ok = np.isfinite(y).all(axis=1)
    out = {"velocity": old["velocity"].copy(), "height": old["height_error"].copy(),
           "coherence": old["temporal_coherence"].copy(), "chosen": np.zeros(n, np.int8),
           "ratio": np.zeros(n, np.float32), "ok": ok, "height64": np.full(n, np.nan),
           "columns": {name: np.zeros(n, np.float32) for name in model.columns}}
    if not ok.any():
        return out
    values = np.asarray(h2ph, dtype=np.float64)
    h2ph = np.broadcast_to(values.reshape(n, -1), (n, T))[ok]
    fit = fit_models(y[ok], h2ph, years, model, choice=choice, alpha=alpha)
    v, h = fit.coefficients["velocity"], fit.coefficients["height_error"]
    motion = v[:, None] * years[None, :] + h2ph * h[:, None]
    for name in model.columns:
        # every term's estimate of the full model (its test says whether it is kept);
        # the motion is the kept model's
        out["columns"][name][ok] = fit.full[name]
        motion = motion + fit.coefficients[name][:, None] * model.regressors[name][None, :]
    out["velocity"][ok], out["height"][ok], out["height64"][ok] = v, h, h
    out["coherence"][ok] = result_coherence(unwrapped[ok] - m2ph * motion)
    out["chosen"][ok], out["ratio"][ok] = fit.choice, fit.statistics
    return out


def _terms_chunk(unwrapped, aps, h2ph, old, options) -> dict:
    """:func:`_terms_block` of one space chunk (on its worker), in blocks of
    :data:`REFIT_BLOCK` points."""
    n = len(unwrapped)
    parts = [_terms_block(unwrapped[rows], aps[rows], h2ph[rows],
                          {name: values[rows] for name, values in old.items()}, **options)
             for rows in (slice(start, min(start + REFIT_BLOCK, n))
                          for start in range(0, n, REFIT_BLOCK))]
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return _terms_block(unwrapped, aps, h2ph, old, **options)
    out: dict[str, Any] = {name: np.concatenate([part[name] for part in parts])
                           for name in _TERMS_FIGURES}
    out["columns"] = {name: np.concatenate([part["columns"][name] for part in parts])
                      for name in parts[0]["columns"]}
    return out


def _terms_displacement(unwrapped, h2ph, height, ok, old, *, m2ph) -> np.ndarray:
    """A block's displacement (float32) from its kept model's height error, ``old`` where the
    series is not finite."""
    n, T = unwrapped.shape
    values = np.asarray(h2ph, dtype=np.float64)
    h2ph = np.broadcast_to(values.reshape(n, -1), (n, T))[ok]
    shifted = np.asarray(unwrapped)[ok].astype(np.float64) / m2ph - h2ph * height[ok, None]
    out = np.array(old, dtype=np.float32)
    out[ok] = shifted - shifted[:, :1]
    return out


def column_units(name: str) -> str:
    """The CF units of a term column's coefficient (``thermal`` m/K, ``breakpoint_*`` m/yr,
    the others m)."""
    if name == "thermal":
        return "m K-1"
    return "m year-1" if name.startswith("breakpoint_") else "m"


def fit_terms_with_atmosphere(out: xr.Dataset, model: TemporalModel, *,
                              choice: str = DEFAULT_CHOICE, alpha: float = DEFAULT_ALPHA
                              ) -> xr.Dataset:
    """The final model of every point with the terms of ``model``, each point's model chosen
    (:func:`fit_models`), fitted to its unwrapped phase *with* its atmosphere as
    :func:`depsi.processing.model_fit.fit_with_atmosphere` fits the linear one (and for the same
    reason: the screen's own error would otherwise leak into the estimates).

    Parameters
    ----------
    out
        The merged result: ``unwrapped_phase`` and ``aps`` (rad, ``(space, time)``), ``h2ph``,
        ``velocity``, ``height_error``, ``displacement``, ``attrs['wavelength']``; with
        ``in_reference_area``, the fit is to each series less the area's mean series (the
        result's datum).
    model
        The terms (:func:`temporal_model`).
    choice, alpha
        As :func:`fit_models`.

    Returns
    -------
    xarray.Dataset
        ``out`` with ``velocity``, ``height_error``, ``displacement`` (``unwrapped_phase /
        m2ph - h2ph H`` less its first epoch) and ``temporal_coherence`` (of the residual from
        the chosen model) anew, one float32 variable per column of ``model`` (the estimate of
        the model with every term, at every point: a term the point's tests did not keep is not
        significant at ``alpha``, and its estimate is reported with its std all the same; the
        velocity and height error are the kept model's), ``model_choice`` (int8, an index into
        ``attrs['model_names']``, CF ``flag_values``/``flag_meanings``) and ``model_test_ratio``
        (the chosen model's F statistic over its critical value; 0 for the linear model).
    """
    m2ph = phase_per_metre(float(out.attrs["wavelength"]))
    years = years_since_mother(out)
    n, T = out.sizes["space"], out.sizes["time"]
    unwrapped_all = out["unwrapped_phase"].transpose("space", "time").data
    aps_all = out["aps"].transpose("space", "time").data
    h2ph_all = out["h2ph"].transpose("space", ...).data
    old = {name: np.asarray(out[name].values).astype(np.float32)
           for name in ("velocity", "height_error", "temporal_coherence")}
    names, _ = candidates(model, choice)
    # the phase with its atmosphere is relative to the reference point, whose screen and noise
    # (about 1 rad) are in every series: taken relative to the reference area's mean series,
    # the datum of the result, each point's tests see its own errors only
    common = np.zeros(T)
    if "in_reference_area" in out:
        area = np.flatnonzero(out["in_reference_area"].values)
        if area.size:
            common = np.nanmean(
                np.asarray(out["unwrapped_phase"].transpose("space", "time").isel(space=area)
                           .values).astype(np.float64)
                + np.asarray(out["aps"].transpose("space", "time").isel(space=area).values),
                axis=0)
    options = {"years": years, "m2ph": m2ph, "common": common, "model": model,
               "choice": choice, "alpha": alpha}
    if isinstance(unwrapped_all, da.Array):
        # on the workers, chunk by chunk: the per-point figures come back, the series stay
        rows = unwrapped_all.chunks[0]
        aps_all = aps_all.rechunk((rows, -1))
        h2ph_all = h2ph_all.rechunk((rows,) + ((-1,) if h2ph_all.ndim == 2 else ()))
        bounds = np.cumsum((0,) + rows)
        parts = list(dask.compute(*[dask.delayed(_terms_chunk)(
            unwrapped_all.blocks[i], aps_all.blocks[i], h2ph_all.blocks[i],
            {name: values[bounds[i]:bounds[i + 1]] for name, values in old.items()}, options)
            for i in range(len(rows))]))
    else:
        parts = [_terms_block(unwrapped_all[rows], aps_all[rows], h2ph_all[rows],
                              {name: values[rows] for name, values in old.items()}, **options)
                 for rows in (slice(start, min(start + REFIT_BLOCK, n))
                              for start in range(0, n, REFIT_BLOCK))]
    figures = {name: (np.concatenate([part[name] for part in parts]) if parts
                      else np.zeros(0, np.float32))
               for name in _TERMS_FIGURES}
    columns = {name: (np.concatenate([part["columns"][name] for part in parts]) if parts
                      else np.zeros(0, np.float32)) for name in model.columns}
    velocity, height, coherence = figures["velocity"], figures["height"], figures["coherence"]
    chosen, ratio = figures["chosen"].astype(np.int8), figures["ratio"].astype(np.float32)
    old_displacement = out["displacement"].transpose("space", "time").data
    if isinstance(unwrapped_all, da.Array):
        rows = unwrapped_all.chunks[0]
        old_displacement = (old_displacement if isinstance(old_displacement, da.Array)
                            else da.from_array(np.asarray(old_displacement))).rechunk((rows, -1))
        displacement = da.blockwise(
            _terms_displacement, "st", unwrapped_all, "st", h2ph_all, "st"[:h2ph_all.ndim],
            da.from_array(figures["height64"], chunks=(rows,)), "s",
            da.from_array(figures["ok"], chunks=(rows,)), "s", old_displacement, "st",
            m2ph=m2ph, dtype=np.float32)
    else:
        displacement = np.asarray(old_displacement).astype(np.float32)
        for start in range(0, n, REFIT_BLOCK):
            rows = slice(start, min(start + REFIT_BLOCK, n))
            displacement[rows] = _terms_displacement(
                unwrapped_all[rows], h2ph_all[rows], figures["height64"][rows],
                figures["ok"][rows],
                displacement[rows], m2ph=m2ph)
    flags = {"flag_values": np.arange(len(names), dtype=np.int8),
             "flag_meanings": " ".join(name.replace("+", "_and_") for name in names),
             "long_name": "temporal model kept by the point's tests"}
    result = out.assign({
        "velocity": ("space", velocity), "height_error": ("space", height),
        "temporal_coherence": ("space", coherence),
        "displacement": (("space", "time"), displacement, dict(out["displacement"].attrs)),
        "model_choice": ("space", chosen, flags),
        "model_test_ratio": ("space", ratio, {"long_name": "F statistic of the kept model over "
                                                           "its critical value", "units": "1"}),
        **{name: ("space", values, {"units": column_units(name)})
           for name, values in columns.items()}})
    result.attrs = {**out.attrs, "model_terms": list(model.groups),
                    "model_columns": list(model.columns), "model_names": list(names),
                    "model_selection": choice, "model_alpha": float(alpha)}
    kept = np.bincount(chosen, minlength=len(names))
    logger.info("model: %s", ", ".join(f"{name} {count}" for name, count in zip(names, kept)))
    return result
