"""Arc estimation: height-error and velocity differences per arc by the periodogram.

``estimate_arcs`` runs the ensemble-coherence search of :mod:`depsi.kernels.periodogram` on every
arc of an arc STM, chunk by chunk and lazily (``xr.apply_ufunc`` over arc chunks), and adds
``height_error``, ``velocity``, ``temporal_coherence`` and ``ambiguity`` (docs/design.md,
"Architecture").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr
from pydantic import Field, field_validator

from depsi.conventions import MISSING_AMBIGUITY
from depsi.kernels.backend import (
    Device,
    chunk_device,
    chunk_index,
    chunk_starts,
    resolve_devices,
    to_device,
    to_host,
    use_device,
)
from depsi.kernels.periodogram import DEFAULT_HEIGHT_RANGE, DEFAULT_VELOCITY_RANGE, periodogram
from depsi.processing.network import ARC_CHUNK
from depsi.sections import Section, ordered_pair
from depsi.stm.dask_tools import chunked_view
from depsi.stm.runtime import fused_kernels
from depsi.stm.schema import validate, years_since_mother

logger = logging.getLogger(__name__)


class ArcsConfig(Section):
    """The ensemble-coherence (periodogram) search of every arc, and of densification's arcs."""

    height_range: tuple[float, float] = Field(
        DEFAULT_HEIGHT_RANGE, description="Height-error differences searched, [low, high] m.")
    velocity_range: tuple[float, float] = Field(
        DEFAULT_VELOCITY_RANGE, description="Velocity differences searched, [low, high] m/yr.")
    height_step: float | None = Field(
        None, gt=0, description="Grid step of the height error, m; null: the modelled phase "
                                "changes by at most pi/2 between grid nodes.")
    velocity_step: float | None = Field(
        None, gt=0, description="Grid step of the velocity, m/yr; null: as height_step.")

    @field_validator("height_range", "velocity_range")
    @classmethod
    def _ordered(cls, pair: tuple[float, float], info) -> tuple[float, float]:
        return ordered_pair(pair, info.field_name)


def _arc_block(phase, h2ph, position, *, years, wavelength, height_range, velocity_range,
               height_step, velocity_step, devices, chunk_starts, with_height=True,
               extra_regressors=None):
    """Periodogram of one block of arcs on its chunk's device; NumPy in, NumPy out (the extra
    terms' coefficients last, in the order of ``extra_regressors``)."""
    extra_regressors = extra_regressors or {}
    if phase.shape[0] == 0:
        empty = np.zeros(0)
        return ((empty, empty, empty, np.zeros(phase.shape, np.int32), np.zeros(0, np.int8))
                + (empty,) * len(extra_regressors))
    device = chunk_device(devices, chunk_index(chunk_starts, int(position[0])))
    with use_device(device):
        # without height, the kernel's velocity-only search (h2ph=None): height_error exactly 0
        result = periodogram(to_device(phase, device),
                             to_device(h2ph, device) if with_height else None, years,
                             wavelength=wavelength, height_range=height_range,
                             velocity_range=velocity_range, height_step=height_step,
                             velocity_step=velocity_step,
                             extra_regressors=extra_regressors or None, fused=fused_kernels())
    return ((to_host(result.height_error), to_host(result.velocity), to_host(result.coherence),
             to_host(result.ambiguity), to_host(result.flag))
            + tuple(to_host(result.extra[name]) for name in extra_regressors))


def heights_resolvable(h2ph: xr.DataArray) -> bool:
    """Whether ``h2ph`` (of arcs, or of the points they join) varies over the epochs, so that
    height-error differences can be estimated; warns when it does not (velocity only)."""
    resolvable = False
    if "time" in h2ph.dims:
        resolvable = bool((h2ph.max("time") - h2ph.min("time")).max().compute() > 0)
    if not resolvable:
        logger.warning("arcs: h2ph does not vary over the epochs; estimating velocity only "
                       "(height_error fixed at 0)")
    return resolvable


def estimate_arcs(
    arcs: xr.Dataset,
    *,
    height_range: tuple[float, float] = DEFAULT_HEIGHT_RANGE,
    velocity_range: tuple[float, float] = DEFAULT_VELOCITY_RANGE,
    height_step: float | None = None,
    velocity_step: float | None = None,
    devices: Sequence[Device | str | int] | None = None,
    height: bool | None = None,
    extra_regressors: Mapping[str, tuple] | None = None,
) -> xr.Dataset:
    """Estimate height-error and velocity differences of every arc with the periodogram.

    Parameters
    ----------
    arcs
        Arc STM ``(arc, time)`` with wrapped ``phase`` and ``h2ph`` (see
        :func:`depsi.processing.network.form_network`) and ``wavelength`` in attrs.
    height_range, velocity_range
        Search ranges (m, m/yr). Defaults :data:`DEFAULT_HEIGHT_RANGE`,
        :data:`DEFAULT_VELOCITY_RANGE`.
    height_step, velocity_step
        Grid steps; by default the kernel's (the modelled phase changes by at most pi/2 across
        the epochs between grid nodes), refined below the step afterwards.
    devices
        Devices the arc chunks are spread over, round-robin (e.g. ``["cuda:0", "cuda:1"]``);
        default: those of :func:`depsi.kernels.backend.configure_devices`.
    height
        Estimate the height-error difference. ``None`` (default): only when ``h2ph`` varies
        over the epochs (a stack without baselines, e.g. ``h2ph`` all zero, cannot resolve
        height, and the periodogram would flag every arc rank-deficient with NaN results).
        Without it the search is over velocity alone (the kernel's ``h2ph=None`` case, see
        :func:`depsi.kernels.periodogram.periodogram`), ``height_error`` is exactly 0 (fixed, not
        estimated) and ``attrs['height_estimated']`` is False. ``True`` with an ``h2ph`` that
        does not vary gives flagged NaN arcs (see :class:`depsi.kernels.flags.Flag`).
    extra_regressors
        Further terms searched on the grid, name to ``(values (T,), (low, high))`` as
        :func:`depsi.kernels.periodogram.periodogram` takes them (e.g. the seasonal terms of
        :meth:`depsi.processing.motion_models.TemporalModel.search`): an unmodelled seasonal
        or thermal signal of a few millimetres would otherwise cost whole cycles. Each adds a
        variable of that name (the arc's coefficient difference). Needs ``height``.

    Returns
    -------
    xarray.Dataset
        ``arcs`` plus ``height_error`` (m), ``velocity`` (m/yr), ``temporal_coherence``
        (ensemble coherence), ``flag`` (int8, :class:`depsi.kernels.flags.Flag`) per arc and
        ``ambiguity`` (int32, ``phase + 2 pi ambiguity`` is the unwrapped arc phase) per arc and
        epoch; lazy (Dask) over arc chunks. Time baselines are counted from the mother epoch.

    Examples
    --------
    >>> from depsi.processing import form_network, ps_selection, single_mother_interferograms
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> points = single_mother_interferograms(ps_selection(stack)).compute()
    >>> est = estimate_arcs(form_network(points))
    >>> est.velocity.dims, est.ambiguity.dims
    (('arc',), ('arc', 'time'))
    >>> bool(est.temporal_coherence.mean() > 0.5)
    True
    """
    validate(arcs, "arcs", require=("phase", "h2ph"), require_wavelength=True)
    years = years_since_mother(arcs)
    if height is None:
        height = heights_resolvable(arcs["h2ph"])
    extra = dict(extra_regressors or {})
    if extra and not height:
        raise ValueError(f"model terms {sorted(extra)}: the arcs' search of extra terms needs "
                         "h2ph that varies over the epochs (heights estimated)")
    arcs_in = arcs
    if arcs["phase"].chunks is None:
        # in memory: chunks that are views (Dataset.chunk would first copy every array)
        arcs_in = arcs.assign({
            name: (arcs[name].dims, chunked_view(arcs[name].values, ARC_CHUNK,
                                                 axis=arcs[name].dims.index("arc")))
            for name in ("phase", "h2ph") if name in arcs and "arc" in arcs[name].dims})
    phase = arcs_in["phase"].chunk({"time": -1})
    h2ph = arcs_in["h2ph"]
    if "arc" in h2ph.dims:
        h2ph = h2ph.chunk({"time": -1}) if "time" in h2ph.dims else h2ph
        h2ph_core = ["time"] if "time" in h2ph.dims else []
    else:
        h2ph_core = ["time"]
    if "arc" in h2ph.dims and "time" not in h2ph.dims:
        h2ph = h2ph.expand_dims(time=arcs["time"].values, axis=-1)
        h2ph_core = ["time"]
    chosen = resolve_devices(devices)
    position = xr.DataArray(np.arange(arcs.sizes["arc"]), dims="arc")
    if phase.chunks is not None:
        position = position.chunk({"arc": phase.chunks[0]})
    outputs = xr.apply_ufunc(
        _arc_block, phase, h2ph, position,
        input_core_dims=[["time"], h2ph_core, []],
        output_core_dims=[[], [], [], ["time"], []] + [[]] * len(extra),
        dask="parallelized",
        output_dtypes=[np.float64, np.float64, np.float64, np.int32, np.int8]
        + [np.float64] * len(extra),
        kwargs=dict(years=years, wavelength=float(arcs.attrs["wavelength"]),
                    height_range=tuple(height_range), velocity_range=tuple(velocity_range),
                    height_step=height_step, velocity_step=velocity_step,
                    devices=tuple(chosen), chunk_starts=chunk_starts(phase.data.chunks[0]),
                    with_height=bool(height), extra_regressors=extra),
    )
    height_error, velocity, coherence, ambiguity, flag = outputs[:5]
    out = arcs_in.assign(
        height_error=height_error.astype(np.float32),
        velocity=velocity.astype(np.float32),
        temporal_coherence=coherence.astype(np.float32),
        ambiguity=ambiguity.transpose("arc", "time"),
        flag=flag,
        **{name: value.astype(np.float32) for name, value in zip(extra, outputs[5:])},
    )
    out.attrs.update({"height_range": list(height_range), "velocity_range": list(velocity_range),
                      "missing_ambiguity": int(MISSING_AMBIGUITY),
                      "height_estimated": int(bool(height)), "extra_terms": list(extra)})
    logger.info("arc estimation: %d arcs (lazy)", arcs.sizes["arc"])
    return out
