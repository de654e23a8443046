"""Single-mother interferograms of a point STM, and back to SLC values.

The mother epoch is multiplied by the complex conjugate of every epoch, ``slc_mother *
conj(slc)``, as every processor forms interferograms (Hanssen 2001, SNAP, ISCE2, GAMMA, DORIS).
With SLC phases ``-4 pi R / wavelength`` (the convention of all of them, docs/concepts.md) its
phase is ``-4 pi (R_mother - R) / wavelength = m2ph * displacement`` for a displacement towards
the satellite since the mother: depsi's phase model. Phases become differences to the mother
and ``h2ph`` becomes the interferogram's, ``-(h2ph - h2ph_mother)`` of a stack whose ``h2ph`` is
SNAP's per-SLC ``d(R - R_mother)/dh``, so that the phase of a height error is ``m2ph * h2ph *
height_error``; the mother column has exactly zero phase and exactly zero ``h2ph``. Downstream
steps must therefore never divide by ``h2ph``: the mother epoch is named in
``attrs["mother_time"]`` and carries no information (it is the reference).
"""

from __future__ import annotations

import logging
from typing import Any

import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr

from depsi.kernels.statistics import amplitude_of, phase_of
from depsi.stm.schema import STMValidationError, validate

logger = logging.getLogger(__name__)


def _epoch_text(value: Any) -> str:
    if np.asarray(value).dtype.kind == "M":
        return str(np.datetime_as_string(value, unit="s"))
    return str(value)


def mother_position(time: np.ndarray, mother: Any) -> int:
    """Position of ``mother`` (a date, or an integer epoch index) in ``time``.

    A date matches an epoch exactly, or else the one epoch on the same calendar day.

    Raises
    ------
    STMValidationError
        When the date is not an epoch or the index is out of range; the message names the date
        and the available epochs.

    Examples
    --------
    >>> t = np.array(["2020-01-01T17:24", "2020-01-13T17:24"], "datetime64[ns]")
    >>> mother_position(t, "2020-01-13"), mother_position(t, -1)
    (1, 1)
    """
    n = time.size
    available = f"{n} epochs from {_epoch_text(time[0])} to {_epoch_text(time[-1])}"
    if isinstance(mother, (int, np.integer)) and not isinstance(mother, bool) \
            and time.dtype.kind == "M":
        if not -n <= int(mother) < n:
            raise STMValidationError(f"mother: expected an epoch index in [{-n}, {n}), found "
                                     f"{int(mother)} ({available})")
        return int(mother) % n
    if time.dtype.kind != "M":
        hits = np.flatnonzero(time == mother)
    else:
        try:
            when = np.datetime64(pd.Timestamp(mother).to_datetime64(), "ns")
        except (TypeError, ValueError):
            raise STMValidationError(f"mother: expected a date or an epoch index, found "
                                     f"{mother!r}") from None
        hits = np.flatnonzero(time == when)
        if hits.size == 0:
            hits = np.flatnonzero(time.astype("datetime64[D]") == when.astype("datetime64[D]"))
    if hits.size != 1:
        raise STMValidationError(f"mother: expected a date among the epochs, found {mother!r}; "
                                 f"available: {available}")
    return int(hits[0])


def _default_mother(stm: xr.Dataset) -> Any:
    if "mother_time" in stm.attrs:
        return stm.attrs["mother_time"]
    position = stm.sizes["time"] // 2
    logger.info("single_mother_interferograms: no mother given and no 'mother_time' attribute; "
                "using the middle epoch %s", _epoch_text(stm["time"].values[position]))
    return position


def _elementwise(func, values: xr.DataArray, dtype) -> xr.DataArray:
    """``func`` applied lazily block by block (Dask) or directly (NumPy)."""
    if values.chunks is None:
        return values.copy(data=func(values.values))
    meta = np.empty((0,) * values.ndim, dtype)
    return values.copy(data=da.map_blocks(func, values.data, meta=meta))


def with_amplitude_and_phase(values: xr.DataArray) -> dict[str, xr.DataArray]:
    """``complex``, ``amplitude`` and wrapped ``phase`` (float32) of complex values, lazily."""
    return {"complex": values,
            "amplitude": _elementwise(amplitude_of, values, np.float32),
            "phase": _elementwise(phase_of, values, np.float32)}


def single_mother_interferograms(stm: xr.Dataset, *, mother: Any = None) -> xr.Dataset:
    """Interferograms of every epoch with one mother epoch: ``slc_mother * conj(slc)``.

    The interferogram keeps the amplitude product ``|slc| |slc_mother|`` (not normalised), so
    :func:`ifg_to_slc` can undo it and amplitudes remain usable as weights; divide ``complex``
    by ``amplitude`` for unit phasors.

    Parameters
    ----------
    stm
        Point STM ``(space, time)`` with ``complex`` SLC values and optionally ``h2ph``.
    mother
        The mother epoch: a date (anything ``pandas.Timestamp`` reads, matched exactly or by
        day) or an integer epoch index; default ``attrs["mother_time"]``, else the middle epoch.

    Returns
    -------
    xarray.Dataset
        Lazy when the input is: ``complex`` (interferogram), ``amplitude`` (its modulus),
        ``phase`` (wrapped to (-pi, pi], exactly 0 at the mother), ``h2ph`` (``h2ph_mother -
        h2ph_t``, the interferogram's, exactly 0 at the mother: never divide by it), the
        input's variables without ``time`` and its coordinates. ``attrs["mother_time"]``
        names the mother epoch.

    Raises
    ------
    STMValidationError
        A missing ``complex`` or a mother date not among the epochs (the message gives the
        available range).

    Examples
    --------
    >>> stm = xr.Dataset({"complex": (("space", "time"), np.array([[1j, 1 + 0j]], "c8"))},
    ...                  coords={"time": np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]")})
    >>> ifg = single_mother_interferograms(stm, mother="2020-01-13")
    >>> ifg.phase.values.astype(float).round(4).tolist(), ifg.attrs["mother_time"]
    ([[-1.5708, 0.0]], '2020-01-13T00:00:00')
    """
    validate(stm, kind="points", require=("complex",))
    if set(stm["complex"].dims) != {"space", "time"}:
        raise STMValidationError(f"variable 'complex': expected dims ('space', 'time'), found "
                                 f"{stm['complex'].dims}")
    time = stm["time"].values
    position = mother_position(time, _default_mother(stm) if mother is None else mother)
    is_mother = xr.DataArray(np.arange(time.size) == position, dims="time")

    slc = stm["complex"].transpose("space", "time")
    mother_slc = slc.isel(time=position, drop=True)
    power = (abs(mother_slc) ** 2).astype(slc.dtype)
    ifg = xr.where(is_mother, power, mother_slc * slc.conj()).astype(slc.dtype)
    ifg = ifg.transpose("space", "time")
    data = with_amplitude_and_phase(ifg)
    if "h2ph" in stm.data_vars:
        h2ph = stm["h2ph"].transpose("space", "time")
        relative = h2ph.isel(time=position, drop=True) - h2ph
        data["h2ph"] = xr.where(is_mother, h2ph.dtype.type(0), relative).astype(
            h2ph.dtype).transpose("space", "time")
    data |= {str(name): var for name, var in stm.data_vars.items() if "time" not in var.dims}

    mother_time = _epoch_text(time[position])
    history = f"{stm.attrs.get('history', '')}\nsingle_mother_interferograms(mother={mother_time})"
    attrs = dict(stm.attrs) | {"mother_time": mother_time, "history": history.strip(),
                               "interferogram": "slc_mother * conj(slc), amplitude product"}
    return xr.Dataset(data, coords=stm.coords, attrs=attrs)


def _mother_values(mother_slc: xr.DataArray | xr.Dataset, mother_time: str,
                   n_space: int) -> tuple[xr.DataArray, xr.DataArray | None]:
    """The mother's complex values (and h2ph when given) over ``space``."""
    if isinstance(mother_slc, xr.DataArray):
        values, h2ph = mother_slc, None
    elif isinstance(mother_slc, xr.Dataset):
        if "complex" not in mother_slc:
            raise STMValidationError(f"mother_slc: expected a 'complex' variable, found "
                                     f"{sorted(map(str, mother_slc.data_vars))}")
        values, h2ph = mother_slc["complex"], mother_slc.get("h2ph")
    else:
        raise TypeError(f"mother_slc: expected an xarray DataArray or Dataset, found "
                        f"{type(mother_slc).__name__}")
    if "time" in values.dims:
        position = mother_position(values["time"].values, mother_time)
        values = values.isel(time=position, drop=True)
        h2ph = None if h2ph is None else h2ph.isel(time=position, drop=True)
    if values.dims != ("space",) or values.sizes["space"] != n_space:
        raise STMValidationError(f"mother_slc: expected complex values over ('space',) with "
                                 f"{n_space} points, found dims {values.dims} and shape "
                                 f"{values.shape}")
    if values.dtype.kind != "c":
        raise STMValidationError(f"mother_slc: expected complex dtype, found {values.dtype}")
    return values, h2ph


def ifg_to_slc(ifg_stm: xr.Dataset, mother_slc: xr.DataArray | xr.Dataset) -> xr.Dataset:
    """SLC values back from single-mother interferograms: ``conj(ifg) * m / |m|**2``.

    Parameters
    ----------
    ifg_stm
        Output of :func:`single_mother_interferograms` (needs ``attrs["mother_time"]``).
    mother_slc
        The mother's complex values: a DataArray over ``space``, or a Dataset with ``complex``
        (and ``h2ph``) over ``space`` or ``(space, time)`` (the mother epoch is taken). Points
        with a zero or missing mother value come back NaN.

    Returns
    -------
    xarray.Dataset
        ``complex``, ``amplitude``, ``phase`` of the SLCs; ``h2ph`` made absolute again when
        the mother's ``h2ph`` is given, else left out (relative values would be mislabelled).

    Examples
    --------
    >>> t = np.array(["2020-01-01", "2020-01-13"], "datetime64[ns]")
    >>> stm = xr.Dataset({"complex": (("space", "time"), np.array([[1j, 2 + 0j]], "c8"))},
    ...                  coords={"time": t})
    >>> back = ifg_to_slc(single_mother_interferograms(stm, mother=1), stm)
    >>> back.complex.values.tolist()
    [[1j, (2+0j)]]
    """
    validate(ifg_stm, kind="points", require=("complex",))
    if "mother_time" not in ifg_stm.attrs:
        raise STMValidationError("attribute 'mother_time': expected on an interferogram STM, "
                                 "found none (make it with single_mother_interferograms)")
    time = ifg_stm["time"].values
    mother_time = str(ifg_stm.attrs["mother_time"])
    position = mother_position(time, mother_time)
    values, mother_h2ph = _mother_values(mother_slc, mother_time, ifg_stm.sizes["space"])
    values = values.astype(ifg_stm["complex"].dtype)

    power = abs(values) ** 2
    usable = power > 0
    scale = xr.where(usable, values / xr.where(usable, power, 1), np.nan).astype(values.dtype)
    is_mother = xr.DataArray(np.arange(time.size) == position, dims="time")
    ifg = ifg_stm["complex"].transpose("space", "time")
    slc = xr.where(is_mother, values, ifg.conj() * scale).astype(ifg.dtype).transpose(
        "space", "time")
    data = with_amplitude_and_phase(slc)
    if "h2ph" in ifg_stm.data_vars and mother_h2ph is not None:
        data["h2ph"] = (mother_h2ph - ifg_stm["h2ph"]).astype(ifg_stm["h2ph"].dtype).transpose(
            "space", "time")
    elif "h2ph" in ifg_stm.data_vars:
        logger.info("ifg_to_slc: h2ph of the mother not given; relative h2ph left out")
    data |= {str(name): var for name, var in ifg_stm.data_vars.items() if "time" not in var.dims}
    attrs = {k: v for k, v in ifg_stm.attrs.items() if k not in ("mother_time", "interferogram")}
    if isinstance(mother_slc, xr.Dataset) and "mother_time" in mother_slc.attrs:
        attrs["mother_time"] = mother_slc.attrs["mother_time"]
    attrs["history"] = f"{attrs.get('history', '')}\nifg_to_slc(mother={mother_time})".strip()
    return xr.Dataset(data, coords=ifg_stm.coords, attrs=attrs)
