"""The temporal model fitted per point: offset, velocity, height error, seasonal and extra terms,
and each point's uncertainty.

``estimate_model`` fits a linear displacement model to every point of a point STM by batched
weighted least squares (:func:`depsi.kernels.lstsq.lstsq_batched`), space chunk by space chunk,
lazily. Each chunk goes to one device (round-robin over the configured devices by block
index), is moved there once and back once (docs/design.md, "Hardware mapping").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from depsi.conventions import phase_per_metre, years_since
from depsi.io.cf import with_cf_attributes
from depsi.kernels.backend import (
    Device,
    array_namespace,
    resolve_devices,
    to_device,
    to_host,
    use_device,
)
from depsi.kernels.design_matrices import design_matrix
from depsi.kernels.flags import FLAG_DTYPE
from depsi.kernels.lstsq import lstsq_batched
from depsi.kernels.periodogram import ensemble_coherence, result_coherence
from depsi.processing.network_solver import _compiled_kernels
from depsi.stm.dask_tools import chunked_view, computed_in_place
from depsi.stm.schema import (
    PHASE_VARIABLES,
    STMValidationError,
    validate,
    years_since_mother,
)

logger = logging.getLogger(__name__)

#: Units of the estimated coefficients (extra regressors: metres per unit of the regressor).
UNITS = {"offset": "m", "velocity": "m/yr", "height_error": "m", "seasonal_sin": "m",
         "seasonal_cos": "m"}


def _term_names(terms: Sequence[str], extra: Mapping[str, Any]) -> list[str]:
    _, names = design_matrix(np.zeros(1), terms=terms, h2ph=np.zeros(1),
                             extra={k: np.zeros(1) for k in extra})
    return names


def _as_time_vector(values: Any, name: str, n_time: int) -> np.ndarray:
    if isinstance(values, xr.DataArray):
        if values.dims != ("time",):
            raise STMValidationError(f"extra regressor {name!r}: expected dims ('time',), "
                                     f"found {values.dims}")
        values = values.values
    vector = np.asarray(values, dtype=np.float64)
    if vector.shape != (n_time,) or not np.isfinite(vector).all():
        raise STMValidationError(f"extra regressor {name!r}: expected {n_time} finite values "
                                 f"(one per epoch), found shape {vector.shape}")
    return vector


def _space_time(stm: xr.Dataset, var: xr.DataArray, name: str, chunks) -> da.Array:
    """``var`` as a dask array (space, time) with the observation's space chunks, one time chunk."""
    if set(var.dims) == {"time"}:
        var = var.expand_dims(space=stm.sizes["space"])
    if set(var.dims) != {"space", "time"}:
        raise STMValidationError(f"variable {name!r}: expected dims ('space', 'time') or "
                                 f"('time',), found {var.dims}")
    data = var.transpose("space", "time").data
    if not isinstance(data, da.Array):
        data = da.from_array(np.asarray(data), chunks=(chunks, -1))
    return data.rechunk((chunks, -1))


def _fit_block(y, *others, names_in, time_years, terms, extra, devices, m2ph,
               block_info=None):
    """Fit one space chunk on its device; returns the packed host array (n, columns)."""
    index = block_info[None]["chunk-location"][0] if block_info else 0
    device = devices[index % len(devices)]
    blocks = dict(zip(names_in, others))
    with use_device(device):
        y_d = to_device(y, device)
        h2ph = to_device(blocks["h2ph"], device) if "h2ph" in blocks else None
        weights = to_device(blocks["weights"], device) if "weights" in blocks else None
        t = to_device(time_years, device)
        regressors = {k: to_device(v, device) for k, v in extra.items()}
        A, _ = design_matrix(t, terms=terms, h2ph=h2ph, extra=regressors)
        res = lstsq_batched(A, y_d, weights)
        xp = array_namespace(res.x)
        columns = [res.x, res.std, res.sigma2[:, None], res.flag[:, None].astype(xp.float64)]
        if m2ph is not None:
            columns.append(ensemble_coherence(m2ph * res.residuals)[:, None])
        columns.append(res.residuals)
        packed = xp.concatenate(columns, axis=1)
    return to_host(packed)


def estimate_model(
    stm: xr.Dataset,
    *,
    terms: Sequence[str] = ("offset", "velocity"),
    variable: str = "displacement",
    weights: str | xr.DataArray | None = None,
    extra: Mapping[str, Any] | None = None,
    devices: Sequence[Device | str | int] | None = None,
) -> xr.Dataset:
    """Fit a temporal displacement model to every point, lazily per space chunk.

    The model of each point is ``y_t = sum_p x_p a_p(t)`` with the columns of
    :func:`depsi.kernels.design_matrices.design_matrix` (metres per unit coefficient):
    ``offset`` (1), ``velocity`` (t, years of 365.25 days from the first epoch),
    ``height_error`` (``h2ph``: under ``phase = m2ph (d + h2ph H)`` a height error H shows in a
    phase-derived displacement as ``h2ph * H`` metres), ``seasonal`` (annual sine and cosine)
    and the ``extra`` regressors.

    Parameters
    ----------
    stm
        Point STM ``(space, time)`` with ``variable`` in metres (and ``h2ph`` for the
        ``height_error`` term); validated before any work.
    terms
        Model terms, in column order: any of ``"offset"``, ``"velocity"``, ``"height_error"``,
        ``"seasonal"``.
    variable
        The observations, in metres (default ``displacement``). Wrapped ``phase`` cannot be
        fitted by least squares: use :func:`depsi.kernels.periodogram.periodogram` for it.
    weights
        Inverse variances per observation: the name of a variable of ``stm`` or a DataArray,
        ``(space, time)`` or ``(time,)``. Default equal weights.
    extra
        User regressors, name to ``(time,)`` values (e.g. temperature); coefficients in metres
        per unit.
    devices
        Devices to spread chunks over, round-robin by chunk index (e.g. ``["cuda:0", "cuda:1"]``
        or ``["cpu:0", "cpu:1"]``); default :func:`depsi.kernels.backend.get_devices`.

    Returns
    -------
    xarray.Dataset
        Dask-backed, with the coordinates of ``stm``: per term ``<name>`` and ``<name>_std``
        (a-posteriori standard deviation) per point; ``sigma2`` (a-posteriori variance factor,
        m^2 for unit weights); ``flag`` (int8, :class:`depsi.kernels.flags.Flag`); ``residual``
        ``(space, time)`` (dtype of ``variable``, NaN where an observation is missing);
        ``temporal_coherence`` of the residuals in phase when ``stm.attrs['wavelength']`` is set.

    Raises
    ------
    STMValidationError
        For an STM that breaks the conventions, a missing variable, wrong dims or a wrapped
        phase variable; before any computation.

    Examples
    --------
    >>> time = np.array(["2020-01-01", "2020-07-01", "2021-01-01"], dtype="datetime64[ns]")
    >>> t = np.array([0.0, 0.498, 1.002])
    >>> d = np.array([0.001 + 0.01 * t, -0.002 * t]).astype("f4")
    >>> stm = xr.Dataset({"displacement": (("space", "time"), d)}, coords={"time": time})
    >>> est = estimate_model(stm, terms=("offset", "velocity"), devices=["cpu"])
    >>> est.velocity.round(4).values.tolist()
    [0.01, -0.002]
    """
    extra = dict(extra or {})
    require = [variable] + (["h2ph"] if "height_error" in terms else [])
    if isinstance(weights, str):
        require.append(weights)
    validate(stm, "points", require=tuple(require))
    if variable in PHASE_VARIABLES:
        raise STMValidationError(f"variable {variable!r}: expected metres of displacement; a "
                                 "wrapped phase cannot be fitted by least squares (use the "
                                 "periodogram)")
    obs = stm[variable]
    if obs.dtype.kind != "f":
        raise STMValidationError(f"variable {variable!r}: expected floating point, "
                                 f"found dtype {obs.dtype}")
    if set(obs.dims) != {"space", "time"}:
        raise STMValidationError(f"variable {variable!r}: expected dims ('space', 'time'), "
                                 f"found {obs.dims}")
    if stm["time"].dtype.kind != "M":
        raise STMValidationError("coordinate 'time': expected datetime64 for time baselines, "
                                 f"found dtype {stm['time'].dtype}")
    time = stm["time"].values
    time_years = years_since(time, time[0])  # the offset is the displacement at the first epoch
    regressors = {k: _as_time_vector(v, k, stm.sizes["time"]) for k, v in extra.items()}
    names = _term_names(terms, regressors)  # validates the term names
    chosen = resolve_devices(devices)

    y = obs.transpose("space", "time").data
    chunks = y.chunks[0] if isinstance(y, da.Array) else -1
    y = _space_time(stm, obs, variable, chunks)
    chunks = y.chunks[0]
    inputs, names_in = [], []
    if "height_error" in terms:
        inputs.append(_space_time(stm, stm["h2ph"], "h2ph", chunks))
        names_in.append("h2ph")
    if weights is not None:
        w = stm[weights] if isinstance(weights, str) else weights
        if not isinstance(w, xr.DataArray):
            raise TypeError(f"weights: expected a variable name or a DataArray, "
                            f"found {type(weights).__name__}")
        inputs.append(_space_time(stm, w, "weights", chunks))
        names_in.append("weights")
    wavelength = stm.attrs.get("wavelength")
    m2ph = phase_per_metre(float(wavelength)) if wavelength is not None else None

    P, T = len(names), stm.sizes["time"]
    width = 2 * P + 2 + (m2ph is not None) + T
    packed = da.map_blocks(
        _fit_block, y, *inputs,
        names_in=tuple(names_in), time_years=time_years, terms=tuple(terms), extra=regressors,
        devices=tuple(chosen), m2ph=m2ph,
        chunks=(chunks, (width,)), dtype=np.float64, meta=np.empty((0, 0), np.float64),
        token="depsi-estimate-model",
    )
    out = xr.Dataset(coords=obs.coords)
    for p, name in enumerate(names):
        attrs = {"units": UNITS[name]} if name in UNITS else {}
        out[name] = (("space",), packed[:, p], attrs)
        out[f"{name}_std"] = (("space",), packed[:, P + p], attrs)
    # dimensionless with inverse-variance weights; metres squared with unit weights
    out["sigma2"] = (("space",), packed[:, 2 * P], {"units": "1" if weights is not None
                                                    else "m2"})
    out["flag"] = (("space",), packed[:, 2 * P + 1].astype(FLAG_DTYPE))
    if m2ph is not None:
        out["temporal_coherence"] = (("space",), packed[:, 2 * P + 2])
    out["residual"] = (("space", "time"), packed[:, width - T:].astype(obs.dtype),
                       {"units": "m", "long_name": f"residual of the model fitted to {variable}"})
    out.attrs = {k: v for k, v in stm.attrs.items() if k in ("wavelength", "mother_time")}
    out.attrs["model_terms"] = list(names)
    out.attrs["history"] = (str(stm.attrs.get("history", "")) +
                            f"\nestimate_model(terms={list(names)}, variable={variable!r})").strip()
    logger.info("estimate_model: %d points x %d epochs, terms %s, %d chunk(s) on %s (lazy)",
                stm.sizes["space"], T, names, len(chunks), [str(d) for d in chosen])
    return with_cf_attributes(out)


#: Points per block of :func:`fit_with_atmosphere`: bounds its float64 temporaries (about 90
#: bytes per point and epoch) whatever the number of points.
FIT_BLOCK = 16384


def fit_with_atmosphere(out: xr.Dataset, *, devices) -> xr.Dataset:
    """Velocity and height error fitted to each point's unwrapped phase *with* its atmosphere;
    ``out`` (the merged result, owned by the caller) is updated in place, block by
    block, so no second copy of its series is made.

    The estimated screen serves unwrapping and the displacement series, but its own error
    (the kriging error at each point, white in time) projects onto the time and perpendicular
    baselines: subtracting it before the fit adds about 0.9 m of height noise on a 1 rad,
    400 m screen. The phase with its atmosphere leaks only the true screen's projection, whose
    spatially correlated part :func:`estimate_correlated_height` then takes out. Offset,
    velocity and height error by batched least squares on the same ambiguities; displacement
    and temporal coherence follow from the new values.
    """
    m2ph = phase_per_metre(float(out.attrs["wavelength"]))
    years = years_since_mother(out)
    n = out.sizes["space"]
    if isinstance(out["unwrapped_phase"].data, da.Array):
        return _fit_with_atmosphere_on_chunks(out, devices=devices, m2ph=m2ph, years=years)
    velocity = np.empty(n, np.float32)
    height = np.empty(n, np.float32)
    coherence = np.empty(n, np.float32)
    out["displacement"] = out["displacement"].transpose("space", "time").astype(np.float32,
                                                                                copy=False)
    displacement = out["displacement"].values  # written block by block, below
    unwrapped_all = out["unwrapped_phase"].transpose("space", "time").values
    aps_all = out["aps"].transpose("space", "time").values
    h2ph_all = out["h2ph"].transpose("space", ...)
    old_velocity, old_height, h2ph_values = (out["velocity"].values, out["height_error"].values,
                                             h2ph_all.values)
    if all(device.kind == "cpu" for device in resolve_devices(devices)):
        fitted = None  # each block fits its own rows (_direct_fit), below
    else:
        # one lazy fit over blocks of points (views of the result, the float64 observations
        # formed per block) on the devices: memory follows FIT_BLOCK
        observed = da.map_blocks(_metres_with_atmosphere,
                                 chunked_view(unwrapped_all, FIT_BLOCK),
                                 chunked_view(aps_all, FIT_BLOCK), m2ph=m2ph, dtype=np.float64)
        stm = xr.Dataset({"observed": (("space", "time"), observed),
                          "h2ph": (h2ph_all.dims, chunked_view(h2ph_values, FIT_BLOCK))},
                         coords=out.coords, attrs=out.attrs)
        fit = estimate_model(stm, terms=("offset", "velocity", "height_error"),
                             variable="observed", devices=devices)
        # on this process's threads under any scheduler: the blocks are views of the result
        # held here, which a cluster would get as a copy of the whole result inside the graph
        fitted = computed_in_place(fit[["velocity", "height_error"]], in_process=True)

    def block(rows: slice) -> None:  # each block writes its own rows
        unwrapped, h2ph = unwrapped_all[rows], h2ph_values[rows]
        if fitted is None:
            new_velocity, new_height = _direct_fit(unwrapped, aps_all[rows], h2ph,
                                                   years=years, m2ph=m2ph)
        else:
            new_velocity = fitted["velocity"][1][rows]
            new_height = fitted["height_error"][1][rows]
        v, h = _kept_fit(new_velocity, new_height, old_velocity[rows], old_height[rows])
        displacement[rows] = _displacement_block(unwrapped, h2ph, h, m2ph=m2ph)
        velocity[rows], height[rows] = v, h
        coherence[rows] = _coherence_block(unwrapped, h2ph, v, h, years=years, m2ph=m2ph)

    _on_threads(n, block)
    return out.assign(velocity=("space", velocity), height_error=("space", height),
                      temporal_coherence=("space", coherence))


#: :func:`_direct_fit` solves a point's normal equations directly where, scaled to a unit
#: diagonal, their determinant is above this (its reciprocal condition is then far above
#: :data:`~depsi.kernels.lstsq.DEFAULT_RCOND`); the other points, and those with a missing
#: observation, go through :func:`~depsi.kernels.lstsq.lstsq_batched`, which flags them.
_DIRECT_FIT_DET = 1e-6


def _direct_fit(unwrapped, aps, h2ph, *, years, m2ph) -> tuple[np.ndarray, np.ndarray]:
    """Velocity (m/yr) and height error (m) of a block's points, fitted by least squares to
    their phase with its atmosphere in metres, with an offset: what
    :func:`estimate_model` with terms offset, velocity and height error gives, by matrix
    products over the design's shared columns (:func:`_design_columns`) instead of a
    per-point design; NaN where that has none (rank deficient, too few observations)."""
    observed = _metres_with_atmosphere(unwrapped, aps, m2ph=m2ph)
    h2ph = _rows_float64(h2ph, len(years))
    shared, scale, own = _design_columns(h2ph, years, 1.0, (), None)
    normal = _normal_matrix(shared, scale, own)
    diagonal = np.sqrt(np.einsum("npp->np", normal))
    with np.errstate(invalid="ignore", divide="ignore"):
        scaled = normal / (diagonal[:, :, None] * diagonal[:, None, :])
    direct = (np.isfinite(observed).all(axis=1) & np.isfinite(scaled).all(axis=(1, 2)))
    direct[direct] = np.linalg.det(scaled[direct]) > _DIRECT_FIT_DET
    coefficients = np.full((len(observed), 3), np.nan)
    rows = np.flatnonzero(direct)
    if rows.size:
        inverse = np.linalg.inv(normal[rows])
        rhs = np.empty((rows.size, 3))
        rhs[:, [0, 2]] = observed[rows] @ shared
        rhs[:, 1] = np.einsum("nt,nt->n", own[rows], observed[rows])
        coefficients[rows] = np.einsum("npq,nq->np", inverse, rhs)
    others = np.flatnonzero(~direct)
    if others.size:  # missing observations or nearly collinear columns: the general solver
        design = np.stack([np.broadcast_to(years, (others.size, len(years))), h2ph[others],
                           np.ones((others.size, len(years)))], axis=2)
        coefficients[others] = lstsq_batched(design, observed[others]).x  # NaN where flagged
    return coefficients[:, 0], coefficients[:, 1]


def _direct_fit_chunk(unwrapped, aps, h2ph, *, years, m2ph) -> np.ndarray:
    """:func:`_direct_fit` of a space chunk (a worker's task), in blocks of
    :data:`FIT_BLOCK` points: ``(n, 2)`` velocity and height error."""
    out = np.empty((len(unwrapped), 2))
    for start in range(0, len(unwrapped), FIT_BLOCK):
        rows = slice(start, min(start + FIT_BLOCK, len(unwrapped)))
        out[rows, 0], out[rows, 1] = _direct_fit(unwrapped[rows], aps[rows], h2ph[rows],
                                                 years=years, m2ph=m2ph)
    return out


def _on_threads(n: int, work) -> list:
    """``work(rows)`` for each block of :data:`FIT_BLOCK` of ``n`` points, on this process's
    threads (NumPy releases the GIL in a block's arithmetic; BLAS at one thread, as the chain's
    steps set it); the results in block order, so sums over them do not depend on the threads.
    """
    from depsi.processing.network import on_threads

    return on_threads(work, [slice(start, min(start + FIT_BLOCK, n))
                             for start in range(0, n, FIT_BLOCK)])


def _kept_fit(velocity, height, old_velocity, old_height):
    """The fit's velocity and height error (float64), the old values where it has none."""
    ok = np.isfinite(velocity) & np.isfinite(height)
    return np.where(ok, velocity, old_velocity), np.where(ok, height, old_height)


def _displacement_block(unwrapped, h2ph, height, *, m2ph) -> np.ndarray:
    """``unwrapped_phase / m2ph - h2ph H`` less its first epoch (float32) of a block."""
    unwrapped = np.asarray(unwrapped).astype(np.float64)
    h2ph = _rows_float64(h2ph, unwrapped.shape[1])
    shifted = unwrapped / m2ph - h2ph * height[:, None]
    return (shifted - shifted[:, :1]).astype(np.float32)


def _coherence_block(unwrapped, h2ph, velocity, height, *, years, m2ph) -> np.ndarray:
    """The temporal coherence (float32) of a block's residual from its linear model."""
    unwrapped = np.asarray(unwrapped).astype(np.float64)
    h2ph = _rows_float64(h2ph, unwrapped.shape[1])
    residual = unwrapped - m2ph * (velocity[:, None] * years + h2ph * height[:, None])
    return result_coherence(residual).astype(np.float32)


def _fit_with_atmosphere_on_chunks(out: xr.Dataset, *, devices, m2ph, years) -> xr.Dataset:
    """:func:`fit_with_atmosphere` of a result whose series are Dask arrays (on a cluster's
    workers): every output a task per space chunk, nothing of the series in this process."""
    unwrapped = out["unwrapped_phase"].transpose("space", "time").data
    rows = unwrapped.chunks[0]
    unwrapped = unwrapped.rechunk((rows, -1))
    aps = out["aps"].transpose("space", "time").data.rechunk((rows, -1))
    h2ph = out["h2ph"].transpose("space", ...)
    h2ph_data = h2ph.data if isinstance(h2ph.data, da.Array) else da.from_array(h2ph.values)
    h2ph_data = h2ph_data.rechunk((rows,) + ((-1,) if h2ph_data.ndim == 2 else ()))
    index = "st"[:h2ph_data.ndim]
    if all(device.kind == "cpu" for device in resolve_devices(devices)):
        # each chunk's rows fitted by its task (_direct_fit, as the in-memory blocks are)
        fitted = da.blockwise(_direct_fit_chunk, "sp", unwrapped, "st", aps, "st", h2ph_data,
                              index, new_axes={"p": 2}, years=years, m2ph=m2ph,
                              dtype=np.float64, concatenate=True)
        fit_velocity, fit_height = fitted[:, 0], fitted[:, 1]
    else:
        observed = da.map_blocks(_metres_with_atmosphere, unwrapped, aps, m2ph=m2ph,
                                 dtype=np.float64)
        stm = xr.Dataset({"observed": (("space", "time"), observed),
                          "h2ph": (h2ph.dims, h2ph_data)}, coords=out.coords, attrs=out.attrs)
        fit = estimate_model(stm, terms=("offset", "velocity", "height_error"),
                             variable="observed", devices=devices)
        fit_velocity, fit_height = fit["velocity"].data, fit["height_error"].data

    def space_data(name):
        data = out[name].data
        return (data if isinstance(data, da.Array) else da.from_array(np.asarray(data))
                ).rechunk((rows,))

    old_v, old_h = space_data("velocity"), space_data("height_error")
    ok = da.isfinite(fit_velocity) & da.isfinite(fit_height)
    v = da.where(ok, fit_velocity, old_v)
    h = da.where(ok, fit_height, old_h)
    displacement = da.blockwise(_displacement_block, "st", unwrapped, "st", h2ph_data, index,
                                h, "s", m2ph=m2ph, dtype=np.float32)
    coherence = da.blockwise(_coherence_block, "s", unwrapped, "st", h2ph_data, index, v, "s",
                             h, "s", years=years, m2ph=m2ph, dtype=np.float32,
                             concatenate=True)
    return out.assign(velocity=("space", v.astype(np.float32)),
                      height_error=("space", h.astype(np.float32)),
                      temporal_coherence=("space", coherence),
                      displacement=(("space", "time"), displacement,
                                    dict(out["displacement"].attrs)))


def _metres_with_atmosphere(unwrapped: np.ndarray, aps: np.ndarray, *, m2ph: float
                            ) -> np.ndarray:
    """The unwrapped phase with its atmosphere, in metres (float64), of one block."""
    return (unwrapped.astype(np.float64) + aps) / m2ph



#: Normal quantile of two-sided 95 % intervals, ``estimate +- 1.96 std``.
Z95 = 1.959964


def _design_columns(h2ph: np.ndarray, years: np.ndarray, m2ph: float,
                    regressors: Sequence[np.ndarray], held: np.ndarray | None):
    """A block's design ``[m2ph t, m2ph h2ph_t, 1, m2ph g_e ...]`` without forming it per
    point: the columns every point shares (``(T, q)``: time, offset, each regressor) with each
    point's scale of them (``(n, q)``: 1, 1, ``held`` or 1), and the one column of its own
    (``m2ph h2ph``, ``(n, T)``). Normal equations and residuals then take matrix products
    (BLAS) over the block instead of a per-point einsum over ``(n, T, p)``."""
    shared = np.column_stack([m2ph * years, np.ones_like(years)]
                             + [m2ph * np.asarray(g, dtype=np.float64) for g in regressors])
    scale = np.ones((h2ph.shape[0], shared.shape[1]))
    if regressors and held is not None:
        scale[:, 2:] = held
    return shared, scale, m2ph * h2ph


def _shared_positions(q: int) -> np.ndarray:
    """Where the shared columns sit in the design's order (time, h2ph, offset, terms)."""
    return np.array([0] + list(range(2, q + 1)))


def _normal_matrix(shared: np.ndarray, scale: np.ndarray, own: np.ndarray) -> np.ndarray:
    """``A^T A`` per point ``(n, p, p)`` of the design :func:`_design_columns` describes."""
    n, q = scale.shape
    at = _shared_positions(q)
    normal = np.empty((n, q + 1, q + 1))
    normal[:, at[:, None], at[None, :]] = (scale[:, :, None] * scale[:, None, :]
                                           * (shared.T @ shared))
    cross = (own @ shared) * scale
    normal[:, 1, at] = cross
    normal[:, at, 1] = cross
    normal[:, 1, 1] = np.einsum("nt,nt->n", own, own)
    return normal


#: A normal matrix scaled to a unit diagonal is inverted directly (LU) where its determinant
#: is above this, by SVD (``pinv``) where it is not: nearly collinear columns (a constant
#: ``h2ph`` beside the offset).
_DIRECT_INVERSE_DET = 1e-10


def _normal_inverse(normal: np.ndarray) -> np.ndarray:
    """``pinv`` of each symmetric positive semi-definite ``(n, p, p)`` normal matrix, about 5x
    faster: a column of zeros (a term the point's model does not hold) is left out and gets
    zeros, as ``pinv`` gives it; the rest is inverted by LU on the matrix scaled to a unit
    diagonal, and by SVD where that is near singular (:data:`_DIRECT_INVERSE_DET`)."""
    diagonal = np.sqrt(np.maximum(np.einsum("npp->np", normal), 0.0))
    empty = diagonal == 0
    diagonal[empty] = 1.0
    outer = diagonal[:, :, None] * diagonal[:, None, :]
    scaled = normal / outer
    rows, cols = np.nonzero(empty)
    scaled[rows, cols, :] = 0.0
    scaled[rows, :, cols] = 0.0
    scaled[rows, cols, cols] = 1.0
    direct = np.linalg.det(scaled) > _DIRECT_INVERSE_DET
    inverse = np.empty_like(normal)
    inverse[direct] = np.linalg.inv(scaled[direct]) / outer[direct]
    inverse[~direct] = np.linalg.pinv(normal[~direct])
    inverse[rows, cols, :] = 0.0
    inverse[rows, :, cols] = 0.0
    return inverse


def _lsq_residual(inverse: np.ndarray, shared: np.ndarray, scale: np.ndarray, own: np.ndarray,
                  y: np.ndarray) -> np.ndarray:
    """``y`` less its per-point least-squares fit on the design :func:`_design_columns`
    describes (``inverse``: the pseudo-inverse of its normal matrix)."""
    n, q = scale.shape
    at = _shared_positions(q)
    rhs = np.empty((n, q + 1))
    rhs[:, at] = (y @ shared) * scale
    rhs[:, 1] = np.einsum("nt,nt->n", own, y)
    coefficients = np.einsum("npq,nq->np", inverse, rhs)
    return y - (coefficients[:, at] * scale) @ shared.T - coefficients[:, 1:2] * own


def _held_terms(out: xr.Dataset, model) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Each column of ``model``'s terms: its name, regressor ``(T,)`` and which points' chosen
    models hold it (``model_choice`` into ``attrs['model_names']``)."""
    if not model:
        return []
    if "model_choice" in out:
        names = list(out.attrs["model_names"])
        choice = out["model_choice"].values.astype(np.int64)
        holds = {term: np.array([term in name.split("+") for name in names])[choice]
                 for term in model.groups}
    else:
        holds = {term: np.ones(out.sizes["space"], dtype=bool) for term in model.groups}
    return [(column, model.regressors[column], holds[term])
            for term, columns in model.groups.items() for column in columns]


def point_uncertainty(out: xr.Dataset, model=None) -> xr.Dataset:
    """``out`` with each point's ``velocity_std`` (m/yr) and ``height_error_std`` (m), and
    ``displacement_std`` (m, ``(space, time)``), from the a-posteriori variance of its residual.

    Each point's design is that of :func:`fit_with_atmosphere`, ``A = [m2ph t, m2ph h2ph_t,
    1]`` (with ``model``, plus ``m2ph g_e`` of each term its chosen model holds, as
    :func:`~depsi.processing.motion_models.fit_terms_with_atmosphere` fits them; every term
    gets ``<name>_std`` the same way from the model with every term, whose estimates the
    result reports), and
    each estimate is relative to the mean over the reference area
    (``in_reference_area``), as the chain's datum is:

    - velocity and height error: ``sigma0^2 (A^T A)^-1`` with ``sigma0^2`` the residual
      variance of the phase *with* its atmosphere (``unwrapped_phase + aps``, what they are
      fitted to) less the area's mean series, which is common to every point (its projection
      is the mean of the estimates over the area, one offset of the whole result, not a
      point's error). The residual holds the point's noise, its atmosphere relative to the
      area's and the area's own mean noise, each taken as white in time.
    - where :func:`~depsi.processing.correlated_height.estimate_correlated_height` took the
      atmosphere's projection (``height_error_correlated``) out of the heights, what is left
      of it at each point is the kriging error ``height_error_correlated_std``: the height's
      variance is that squared plus the variance the point's corrected phase
      (``unwrapped_phase``: its noise and the screen's estimation error, white in space)
      alone gives.
    - displacement (``unwrapped_phase / m2ph - h2ph H``, less its first epoch): at epoch
      ``t``, ``s^2 (w_t + w_0) + (h2ph_t - h2ph_0)^2 std(H)^2`` with ``s^2`` the point's
      residual variance of the corrected phase (``unwrapped_phase``) about the same design and
      ``w_t`` the epoch's share of it pooled over every point (an epoch whose screen is poorly
      estimated is noisier for every point; the first epoch's error is in every epoch's
      displacement); zero at the first epoch. A ``(space, time)`` float32 variable (4 bytes a
      point and epoch, as ``displacement`` itself): a per-point scalar would hide how much
      worse some epochs are (twice the typical std on a strong screen).

    Not included: errors correlated in time (nonlinear motion, a screen estimate that took part
    of the motion's trend, wrong ambiguities) and the common datum offset above.

    Parameters
    ----------
    out
        The chain's merged result (the model step's): ``unwrapped_phase`` and ``aps`` (rad,
        ``(space, time)``), ``h2ph``, ``in_reference_area``, ``time`` and
        ``attrs['wavelength']``; ``height_error_correlated_std`` where the heights were
        corrected.
    model
        The chain's :class:`~depsi.processing.motion_models.TemporalModel` when it has terms
        (``out`` then holds ``model_choice``); None: the linear model.

    Returns
    -------
    xarray.Dataset
        ``out`` with ``velocity_std`` and ``height_error_std`` (float32, per point) and
        ``displacement_std`` (float32, ``(space, time)``).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> n, T = 50, 30
    >>> time = np.datetime64("2021-01-01", "ns") + np.arange(T) * np.timedelta64(12, "D")
    >>> def result(noise):
    ...     return xr.Dataset(
    ...         {"unwrapped_phase": (("space", "time"), noise * rng.standard_normal((n, T))),
    ...          "aps": (("space", "time"), np.zeros((n, T))),
    ...          "h2ph": (("space", "time"), np.tile(rng.normal(0, 2e-4, T), (n, 1))),
    ...          "in_reference_area": ("space", np.arange(n) < 10)},
    ...         coords={"time": time}, attrs={"wavelength": 0.0555})
    >>> low, high = point_uncertainty(result(0.3)), point_uncertainty(result(0.6))
    >>> ratio = float(high.velocity_std.median() / low.velocity_std.median())
    >>> 1.7 < ratio < 2.3, float(low.displacement_std[:, 0].max())
    (True, 0.0)
    """
    m2ph = phase_per_metre(float(out.attrs["wavelength"]))
    years = years_since_mother(out)
    n, n_epochs = out.sizes["space"], out.sizes["time"]
    unwrapped_all = out["unwrapped_phase"].transpose("space", "time").data
    aps_all = out["aps"].transpose("space", "time").data
    h2ph_all = out["h2ph"].transpose("space", ...).data
    terms = _held_terms(out, model)
    n_held = sum((held.astype(np.int64) for _, _, held in terms), np.zeros(n, np.int64))
    dof_all = np.maximum(n_epochs - 3 - n_held, 1).astype(np.float64)
    dof = float(np.mean(dof_all))
    area = np.flatnonzero(out["in_reference_area"].values)
    # the area's mean series is common to every point: its projection is the one datum offset
    # of the result (the mean of each estimate over the area), not a point's own error
    area_unwrapped = np.asarray(out["unwrapped_phase"].transpose("space", "time")
                                .isel(space=area).values)
    area_aps = np.asarray(out["aps"].transpose("space", "time").isel(space=area).values)
    common = (area_unwrapped.astype(np.float64) + area_aps).mean(axis=0)
    common_corrected = area_unwrapped.astype(np.float64).mean(axis=0)
    options = {"years": years, "m2ph": m2ph, "common": common,
               "common_corrected": common_corrected,
               "regressors": tuple(g for _, g, _ in terms)}
    held = np.stack([h for _, _, h in terms], axis=1) if terms else np.zeros((n, 0), bool)
    if isinstance(unwrapped_all, da.Array):
        # on the workers, chunk by chunk: only per-point figures come back (docs/hpc.md)
        parts = _uncertainty_on_chunks(unwrapped_all, aps_all, h2ph_all, dof_all, held,
                                       options)
    else:
        parts = _on_threads(n, lambda rows: _uncertainty_block(
            unwrapped_all[rows], aps_all[rows], h2ph_all[rows], dof_all[rows], held[rows],
            **options))
    figures = {name: np.concatenate([part[name] for part in parts]) if parts
               else np.empty((0, len(terms)) if name == "term_std" else 0)
               for name in _UNCERTAINTY_FIGURES}
    epoch_share = np.zeros(n_epochs)
    for part in parts:  # in block order: the same sum whatever the scheduler
        epoch_share += part["epoch_share"]
    velocity_std, height_std = figures["velocity_std"], figures["height_std"]
    height_noise_std, corrected_var = figures["height_noise_std"], figures["corrected_var"]
    term_std = {name: figures["term_std"][:, i] for i, (name, _, _) in enumerate(terms)}
    # residuals are short of the noise by the leverage, 3 / T on average: shares of mean 1
    epoch_share *= n_epochs / dof / max(int((corrected_var > 0).sum()), 1)
    corrected_var /= m2ph ** 2
    uncorrected_height_std = height_std
    if "height_error_correlated_std" in out:
        # the leak left after the correction is the kriging error at each point; the rest of
        # the height's error is the leak of what is white in space (the noise, and the
        # screen's estimation error), from the corrected phase
        left = out["height_error_correlated_std"].values.astype(np.float64)
        moved = np.isfinite(left) & (left > 0) & np.isfinite(height_std)
        height_std = np.where(moved, np.sqrt(height_noise_std ** 2 + left ** 2), height_std)
    if isinstance(h2ph_all, da.Array):
        rows = h2ph_all.chunks[0]
        index = "st"[:h2ph_all.ndim]
        displacement_std = da.blockwise(
            _displacement_std_block, "st", h2ph_all.rechunk({1: -1} if h2ph_all.ndim == 2
                                                            else {}), index,
            da.from_array(corrected_var, chunks=(rows,)), "s",
            da.from_array(uncorrected_height_std, chunks=(rows,)), "s",
            epoch_share=epoch_share, n_epochs=n_epochs, dtype=np.float32,
            new_axes={} if h2ph_all.ndim == 2 else {"t": n_epochs})
    else:
        displacement_std = np.empty((n, n_epochs), np.float32)

        def block(rows: slice) -> None:
            _displacement_std_block(h2ph_all[rows], corrected_var[rows],
                                    uncorrected_height_std[rows], epoch_share=epoch_share,
                                    n_epochs=n_epochs, out=displacement_std[rows])

        _on_threads(n, block)
    return out.assign({"velocity_std": ("space", velocity_std.astype(np.float32)),
                       "height_error_std": ("space", height_std.astype(np.float32)),
                       "displacement_std": (("space", "time"), displacement_std),
                       **{f"{name}_std": ("space", values.astype(np.float32),
                                          {"units": out[name].attrs.get("units", "m")})
                          for name, values in term_std.items()}})


#: The per-point figures of :func:`_uncertainty_block` (besides its ``epoch_share``).
_UNCERTAINTY_FIGURES = ("velocity_std", "height_std", "height_noise_std", "corrected_var",
                        "term_std")


def _rows_float64(h2ph: np.ndarray, n_epochs: int) -> np.ndarray:
    """A block of ``h2ph`` (per point, or per point and epoch) as float64 (rows, epochs), as
    :func:`depsi.stm.schema.h2ph_rows` gives it."""
    values = np.asarray(h2ph, dtype=np.float64)
    return np.broadcast_to(values.reshape(values.shape[0], -1), (values.shape[0], n_epochs))


def _uncertainty_block(unwrapped, aps, h2ph, dof_all, held, *, years, m2ph, common,
                       common_corrected, regressors) -> dict[str, np.ndarray]:
    """:func:`point_uncertainty`'s first pass over one block of points: their standard
    deviations, the corrected phase's residual variance, and the block's sum of each epoch's
    share of it (``epoch_share``)."""
    n_epochs = len(years)
    unwrapped = np.asarray(unwrapped).astype(np.float64)
    aps = np.asarray(aps)
    h2ph = _rows_float64(h2ph, n_epochs)
    # the chosen model's further terms: a column of zeros where a point's model has none
    shared, scale, own = _design_columns(h2ph, years, m2ph, regressors, held)
    inverse = _normal_inverse(_normal_matrix(shared, scale, own))
    observed = unwrapped + aps - common
    r = _lsq_residual(inverse, shared, scale, own, observed)
    sigma2 = np.einsum("nt,nt->n", r, r) / dof_all
    term_std = np.full((len(unwrapped), len(regressors)), np.nan)
    if regressors:  # every term's std, of the model with every term (as it is reported)
        every = np.ones_like(scale)
        full_inverse = _normal_inverse(_normal_matrix(shared, every, own))
        r_full = _lsq_residual(full_inverse, shared, every, own, observed)
        sigma2_full = np.einsum("nt,nt->n", r_full, r_full) / max(
            n_epochs - 3 - len(regressors), 1)
        for i in range(len(regressors)):
            term_std[:, i] = np.sqrt(sigma2_full * full_inverse[:, 3 + i, 3 + i])
    r = _lsq_residual(inverse, shared, scale, own, unwrapped - common_corrected)
    corrected_var = np.einsum("nt,nt->n", r, r) / dof_all
    usable = corrected_var > 0
    return {"velocity_std": np.sqrt(sigma2 * inverse[:, 0, 0]),
            "height_std": np.sqrt(sigma2 * inverse[:, 1, 1]),
            "height_noise_std": np.sqrt(corrected_var * inverse[:, 1, 1]),
            "corrected_var": corrected_var, "term_std": term_std,
            "epoch_share": (r[usable] ** 2 / corrected_var[usable, None]).sum(axis=0)}


def _uncertainty_on_chunks(unwrapped, aps, h2ph, dof_all, held, options) -> list[dict]:
    """:func:`_uncertainty_block` of every space chunk of the Dask series, each chunk in
    blocks of :data:`FIT_BLOCK` points on its worker; the per-point figures gathered here."""
    import dask

    rows = unwrapped.chunks[0]
    aps = aps.rechunk((rows, -1))
    h2ph = h2ph.rechunk((rows,) + ((-1,) if h2ph.ndim == 2 else ()))
    bounds = np.cumsum((0,) + rows)
    tasks = [dask.delayed(_uncertainty_chunk)(
        unwrapped.blocks[i], aps.blocks[i], h2ph.blocks[i], dof_all[bounds[i]:bounds[i + 1]],
        held[bounds[i]:bounds[i + 1]], options) for i in range(len(rows))]
    return list(dask.compute(*tasks))


def _uncertainty_chunk(unwrapped, aps, h2ph, dof_all, held, options) -> dict[str, np.ndarray]:
    parts = [_uncertainty_block(unwrapped[rows], aps[rows], h2ph[rows], dof_all[rows],
                                held[rows], **options)
             for rows in (slice(start, min(start + FIT_BLOCK, len(unwrapped)))
                          for start in range(0, len(unwrapped), FIT_BLOCK))]
    if not parts:
        return _uncertainty_block(unwrapped, aps, h2ph, dof_all, held, **options)
    out = {name: np.concatenate([part[name] for part in parts]) for name in _UNCERTAINTY_FIGURES}
    out["epoch_share"] = np.zeros(unwrapped.shape[1])
    for part in parts:
        out["epoch_share"] += part["epoch_share"]
    return out


def _displacement_std_block(h2ph, corrected_var, height_std, *, epoch_share, n_epochs,
                            out: np.ndarray | None = None) -> np.ndarray:
    """Each point's displacement std per epoch (float32; zero at the first epoch), into
    ``out`` when given. Where Numba runs, :func:`depsi.kernels.gather_numba.displacement_std`
    (the same numbers to the bit, no float64 ``(points, epochs)`` temporaries, written straight
    into ``out``)."""
    if _compiled_kernels("gather_numba"):
        from depsi.kernels import gather_numba

        direct = out is not None and out.flags.c_contiguous
        result = gather_numba.displacement_std(h2ph, corrected_var, height_std, epoch_share,
                                               out if direct else None)
        if out is None or direct:
            return result
        out[...] = result
        return out
    h2ph = _rows_float64(h2ph, n_epochs)
    variance = (corrected_var[:, None] * (epoch_share + epoch_share[0])
                + ((h2ph - h2ph[:, :1]) * height_std[:, None]) ** 2)
    result = np.sqrt(variance).astype(np.float32)
    result[:, 0] = 0.0
    if out is None:
        return result
    out[...] = result
    return out
