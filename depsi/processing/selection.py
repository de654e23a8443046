"""Persistent Scatterer candidates from an SLC stack: amplitude statistics, selection, thinning.

:func:`amplitude_statistics` computes every per-pixel amplitude statistic in one pass over a
raster stack ``(azimuth, range, time)``; :func:`ps_selection` turns the pixels with a low
amplitude dispersion (NAD or NMAD) into a point STM ``(space, time)`` in Morton order, with a lazy
Dask engine or a streaming engine that reads and reduces each block once on worker threads,
the point values computed in the same pass;
:func:`update_selection` adds new epochs to a stored PS product from its running sums. The
first-order points of the network are chosen by
:func:`depsi.processing.network.first_order_indices`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, Final, Literal, cast

import dask
import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
from pydantic import Field

from depsi.geometry import POSITIONS_ATTR, geocode_points
from depsi.io.cf import with_cf_attributes
from depsi.io.prefetch import default_block_shape, drop_handed_over, iter_processed_blocks
from depsi.io.store import open_stm, space_chunk_size
from depsi.io.store_append import append_epochs, epoch_coords, epochs_to_append
from depsi.kernels.statistics import (
    add_sums,
    amplitude_of,
    amplitude_sums,
    moments_from_sums,
    nad_screen,
    statistics_block,
)
from depsi.processing.interferogram import with_amplitude_and_phase

# moved: re-exported until the lead's files switch (processing/__init__ imports it from here)
from depsi.processing.network import worker_threads
from depsi.processing.scatterers import DSConfig
from depsi.sections import Section
from depsi.stm.order import morton_order
from depsi.stm.runtime import fused_kernels
from depsi.stm.schema import STMValidationError, validate

logger = logging.getLogger(__name__)

#: Measures ``ps_selection`` accepts, and the statistic each selects on: amplitude dispersion
#: (NAD, NMAD), or the phase similarity of a pixel to its neighbours (``phase``).
METHODS = {"nad": "amplitude_dispersion", "nmad": "amplitude_dispersion_mad",
           "phase": "phase_similarity"}

#: Default threshold of ``method="phase"``: a pixel is a candidate when the phase similarity to
#: its most similar neighbour reaches this (a phase noise of about 0.5 rad at each of the two).
DEFAULT_PHASE_THRESHOLD = 0.75

#: With NAD or NMAD, a stack on which more than this share of the usable pixels pass the
#: threshold has amplitudes that cannot separate pixels (multilooked products, interferogram
#: stacks): the selection warns and selects on the phase similarity instead.
AMPLITUDE_BLIND_SHARE = 0.5
#: ... on a stack of at least this many usable pixels (a share of a handful says nothing).
AMPLITUDE_BLIND_MIN_PIXELS = 1000

#: Engines of ``ps_selection``: chosen per stack (``auto``), lazy Dask graph, or one streaming
#: pass with prefetching.
ENGINES = ("auto", "dask", "stream")

#: ``engine="auto"`` streams when every pixel's point series (the most the stream engine could
#: hold: ``complex``, ``amplitude``, ``phase`` and ``h2ph`` of every epoch) would take at most
#: this fraction of the memory available now; otherwise, or under a distributed client, it
#: builds the lazy Dask graph.
AUTO_STREAM_MEMORY_FRACTION = 0.5

#: Default dispersion measure, and threshold below which a pixel is a candidate: the usual NAD
#: choice of PS-InSAR (DePSI's ``ps_selection`` takes the same method by default).
DEFAULT_METHOD: Final = "nad"
DEFAULT_THRESHOLD = 0.25
#: Default engine of ``ps_selection``: chosen per stack by :func:`resolve_engine`.
DEFAULT_ENGINE: Final = "auto"


class SelectionConfig(Section):
    """Persistent scatterer candidate selection from amplitude statistics."""

    method: Literal["nad", "nmad", "phase"] = Field(
        DEFAULT_METHOD, description="Statistic: nad (amplitude std/mean), nmad (MAD/median) or "
                                    "phase (the phase similarity of a pixel to its most "
                                    "similar neighbour, PSPS). With nad or nmad, a stack on "
                                    "which more than half the pixels pass the threshold "
                                    "(multilooked amplitudes) is selected on the phase "
                                    "instead, with a warning.")
    threshold: float | None = Field(
        None, gt=0,
        description="nad, nmad: pixels whose statistic is below this value become candidates "
                    "(null: 0.25); phase: pixels whose similarity reaches it (null: 0.75).")
    engine: Literal["auto", "dask", "stream"] = Field(
        DEFAULT_ENGINE,
        description="auto: stream when every pixel's series would fit in half the available memory "
                    "and no distributed client is active, else dask; dask: one lazy graph over the "
                    "stack, the points' time series read again while saved (memory bounded "
                    "whatever the number of points); stream: one pass on all cores, blocks read "
                    "and reduced by worker threads, the points computed in memory (fastest when "
                    "they fit).")
    ds: DSConfig = Field(
        default_factory=DSConfig,
        description="Distributed scatterers beside the PS (off by default): they join the PS "
                    "as densified points, flagged by scatterer, with their SHP count.")


#: Running sums kept per point so that the NAD can be updated with new epochs.
SUM_VARIABLES = ("amp_count", "amp_sum", "amp_sumsq")

#: Outputs of :func:`amplitude_statistics`, in order, with their dtypes.
STATISTICS = {
    "amplitude_mean": np.float32,
    "amplitude_std": np.float32,
    "amplitude_median": np.float32,
    "amplitude_mad": np.float32,
    "amplitude_dispersion": np.float32,
    "amplitude_dispersion_mad": np.float32,
    "amp_count": np.int32,
    "amp_sum": np.float64,
    "amp_sumsq": np.float64,
}

_POINT_STATISTICS = {"amplitude_dispersion": np.float32, "amp_count": np.int32,
                     "amp_sum": np.float64, "amp_sumsq": np.float64}

#: What a point selected on its phase carries beside its NAD, with its attributes.
_PHASE_STATISTICS = {
    "phase_similarity": {"units": "1", "long_name": "phase similarity to the most similar of "
                                                    "the 8 neighbours"},
    "phase_std": {"units": "rad",
                  "long_name": "phase noise standard deviation from the phase similarity"},
}

_STATUS_REJECTED, _STATUS_SELECTED, _STATUS_UNUSABLE = 0, 1, 2


# --------------------------------------------------------------------------------------------
# argument checks


def _check_stack(stack: xr.Dataset) -> None:
    validate(stack, kind="raster", require=("complex",))
    for name in ("complex", "h2ph"):
        if name in stack.data_vars and set(stack[name].dims) != {"azimuth", "range", "time"}:
            raise STMValidationError(
                f"variable {name!r}: expected dims ('azimuth', 'range', 'time'), "
                f"found {stack[name].dims}")
    for name in ("azimuth", "range"):
        if stack[name].dtype.kind not in "iu":
            raise STMValidationError(f"coordinate {name!r}: expected integer pixel indices, "
                                     f"found dtype {stack[name].dtype}")


def _check_threshold(threshold: Any) -> float:
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold: expected a positive number, found {threshold!r}") from None
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"threshold: expected a positive finite number, found {threshold!r}")
    return value


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {list(choices)}, found {value!r}")
    return value


def _distributed_client() -> bool:
    """Whether a ``dask.distributed`` client is the default scheduler now (never without
    ``distributed`` imported: no client can exist then, and importing it costs more than the
    selection of a small stack)."""
    if "distributed" not in sys.modules:
        return False
    from distributed import default_client

    try:
        default_client()
    except ValueError:  # no client
        return False
    return True


def resolve_engine(stack: xr.Dataset, engine: str = DEFAULT_ENGINE) -> tuple[str, str]:
    """The engine ``ps_selection`` runs for ``engine`` on ``stack``, and why.

    ``"auto"`` picks ``"stream"`` (one pass, the points computed in memory; the fastest) unless
    a distributed client is active (its workers, not this process's threads, should read the
    stack) or the point series of *every* pixel would take more than
    :data:`AUTO_STREAM_MEMORY_FRACTION` of the memory available now, the stream engine's worst
    case whatever the threshold; then ``"dask"`` (lazy, memory bounded by its chunks).

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> stack = xr.Dataset({"complex": (("azimuth", "range", "time"), np.ones((4, 4, 3), "c8"))})
    >>> resolve_engine(stack)[0], resolve_engine(stack, "dask")[0]
    ('stream', 'dask')
    """
    from depsi.kernels.backend import available_host_memory

    engine = _check_choice("engine", engine, ENGINES)
    if engine != "auto":
        return engine, "chosen"
    if _distributed_client():
        return "dask", "a distributed client is active"
    per_epoch = 2 * np.dtype(stack["complex"].dtype).itemsize  # complex, amplitude and phase
    if "h2ph" in stack.data_vars:
        per_epoch += np.dtype(stack["h2ph"].dtype).itemsize
    worst = stack.sizes["azimuth"] * stack.sizes["range"] * stack.sizes["time"] * per_epoch
    budget = AUTO_STREAM_MEMORY_FRACTION * available_host_memory()
    if worst > budget:
        return "dask", (f"every pixel's series ({worst / 1e9:.1f} GB) would not fit in "
                        f"{AUTO_STREAM_MEMORY_FRACTION:.0%} of the available memory")
    return "stream", (f"every pixel's series ({worst / 1e9:.2f} GB) fits in "
                      f"{AUTO_STREAM_MEMORY_FRACTION:.0%} of the available memory")


def _as_epoch(value: Any, time: np.ndarray) -> Any:
    if value is None:
        return None
    if time.dtype.kind == "M":
        return np.datetime64(pd.Timestamp(value).to_datetime64(), "ns").astype(time.dtype)
    return value


def epoch_window(time: np.ndarray, time_window: Any = None) -> slice:
    """Positions (a slice) of the epochs of ``time`` inside ``time_window``, ends included.

    Parameters
    ----------
    time
        Sorted epochs (datetime64 or integer indices).
    time_window
        ``None`` (all epochs), ``(start, end)`` or ``slice(start, end)``; either end may be
        ``None``; dates as anything ``pandas.Timestamp`` reads.

    Examples
    --------
    >>> t = np.array(["2020-01-01", "2020-01-13", "2020-01-25"], "datetime64[ns]")
    >>> epoch_window(t, ("2020-01-10", None))
    slice(1, 3, None)
    """
    if time_window is None:
        return slice(0, time.size)
    if isinstance(time_window, slice):
        start, end = time_window.start, time_window.stop
    else:
        try:
            start, end = time_window
        except (TypeError, ValueError):
            raise ValueError(f"time_window: expected (start, end) or a slice, found "
                             f"{time_window!r}") from None
    start, end = _as_epoch(start, time), _as_epoch(end, time)
    first = 0 if start is None else int(np.searchsorted(time, start, side="left"))
    stop = time.size if end is None else int(np.searchsorted(time, end, side="right"))
    if stop <= first:
        raise ValueError(f"time_window: expected at least one epoch inside {time_window!r}, "
                         f"found none in the stack's epochs {time[0]} .. {time[-1]}")
    return slice(first, stop)


# --------------------------------------------------------------------------------------------
# amplitude statistics


def _statistics_gufunc(slc: np.ndarray) -> tuple[np.ndarray, ...]:
    stats = statistics_block(slc, robust=True)
    return tuple(stats[name] for name in STATISTICS)


def _lazy_raster(stack: xr.Dataset, names: Sequence[str]) -> xr.Dataset:
    """The ``names`` of ``stack`` as Dask arrays with ``time`` in one chunk."""
    sub = stack[list(names)]
    if sub["complex"].chunks is None:
        az, rg = default_block_shape(stack, variables=names)
        return sub.chunk({"azimuth": az, "range": rg, "time": -1})
    return sub.chunk({"time": -1})


def _reduce_time(func, slc: xr.DataArray, dtypes: list, **kwargs) -> list[xr.DataArray]:
    """Apply a per-block reduction over ``time`` with several outputs, one task per chunk.

    Calls Dask directly with an explicit ``meta`` per output: one read of each chunk feeds all
    outputs, and no dtype guess is made by casting complex test data to real (a warning).
    """
    slc = slc.transpose("azimuth", "range", "time")
    signature = "(t)->" + ",".join("()" for _ in dtypes)
    meta = tuple(np.empty((0, 0), dtype) for dtype in dtypes)
    outputs = da.apply_gufunc(func, signature, slc.data, meta=meta, **kwargs)
    coords = {name: coord.variable for name, coord in slc.coords.items()
              if "time" not in coord.dims}
    return [xr.DataArray(out, dims=("azimuth", "range"), coords=coords) for out in outputs]


def amplitude_statistics(stack: xr.Dataset, *, time_window: Any = None) -> xr.Dataset:
    """Per-pixel amplitude statistics over time, all from one read of each block.

    Parameters
    ----------
    stack
        Raster stack ``(azimuth, range, time)`` with ``complex`` SLC values. Missing epochs
        (NaN) are skipped.
    time_window
        Only the epochs in ``(start, end)`` (ends included); default all.

    Returns
    -------
    xarray.Dataset
        Lazy (Dask), dims ``(azimuth, range)``, the stack's ``(azimuth, range)`` coordinates:
        ``amplitude_mean``, ``amplitude_std`` (population, ddof=0), ``amplitude_median``,
        ``amplitude_mad`` (unscaled median absolute deviation), ``amplitude_dispersion``
        (NAD = std/mean), ``amplitude_dispersion_mad`` (NMAD = MAD/median, without the 1.4826
        factor, as in sarxarray/DePSI) and the running sums ``amp_count``, ``amp_sum``,
        ``amp_sumsq`` of the amplitudes. Pixels without usable amplitude (all NaN, zero mean
        or median) have NaN dispersion.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> slc = np.array([[[1, 3, 2]]], dtype="c8")
    >>> stack = xr.Dataset({"complex": (("azimuth", "range", "time"), slc)},
    ...                    coords={"azimuth": [0], "range": [0], "time": np.array(
    ...                        ["2020-01-01", "2020-01-13", "2020-01-25"], "datetime64[ns]")})
    >>> stats = amplitude_statistics(stack).compute()
    >>> float(stats.amplitude_median[0, 0]), float(stats.amplitude_mad[0, 0])
    (2.0, 1.0)
    """
    _check_stack(stack)
    if stack.attrs.get(POSITIONS_ATTR) == "orbits":
        # lat/lon rasters geocoded from the orbits: the selected points are geocoded instead
        # (geocode_points below), not every pixel of the scene
        stack = stack.drop_vars([c for c in ("lat", "lon") if c in stack.coords])
    window = epoch_window(stack["time"].values, time_window)
    slc = _lazy_raster(stack, ["complex"])["complex"].isel(time=window)
    outputs = _reduce_time(_statistics_gufunc, slc, list(STATISTICS.values()))
    stats = xr.Dataset(dict(zip(STATISTICS, outputs)))
    stats.attrs = _window_attrs(stack["time"].values[window]) | {
        "nmad_definition": "MAD / median (no 1.4826 factor)",
        "nad_definition": "std / mean, population std (ddof=0)",
    }
    return stats.transpose("azimuth", "range")


def _window_attrs(times: np.ndarray) -> dict:
    return {"statistics_start": str(times[0]), "statistics_end": str(times[-1]),
            "statistics_epochs": int(times.size)}


# --------------------------------------------------------------------------------------------
# PS selection: the per-block kernel shared by both engines


def _selection_block(slc: np.ndarray, *, method: str, threshold: float) -> tuple:
    """Dispersion, running sums and selection status of one block (time last)."""
    stats = statistics_block(slc, robust=method == "nmad")
    dispersion = stats[METHODS[method]]
    status = np.where(np.isnan(dispersion), _STATUS_UNUSABLE,
                      np.where(dispersion < threshold, _STATUS_SELECTED, _STATUS_REJECTED))
    return (dispersion, stats["amp_count"], stats["amp_sum"], stats["amp_sumsq"],
            status.astype(np.int8))


def _points_dataset(stack: xr.Dataset, azimuth_pos: np.ndarray, range_pos: np.ndarray,
                    timed: dict, statistics: dict, coords2d: dict) -> xr.Dataset:
    """Assemble the raw point STM (Morton order) from per-point arrays of either engine."""
    dims = ("space", "time")
    coords = {
        "time": stack["time"].values,
        **{name: stack[name].variable for name in epoch_coords(stack)},
        "azimuth": ("space", stack["azimuth"].values[azimuth_pos]),
        "range": ("space", stack["range"].values[range_pos]),
    } | {name: ("space", values) for name, values in coords2d.items()}
    data = {name: (dims, values) for name, values in timed.items()}
    data |= {name: ("space", values) for name, values in statistics.items()}
    return xr.Dataset(data, coords=coords, attrs=dict(stack.attrs))


def _morton(stack: xr.Dataset, azimuth_pos: np.ndarray, range_pos: np.ndarray) -> np.ndarray:
    return morton_order(stack["azimuth"].values[azimuth_pos], stack["range"].values[range_pos])


def _coords2d(stack: xr.Dataset) -> list[str]:
    return [str(n) for n, c in stack.coords.items()
            if set(c.dims) == {"azimuth", "range"}]


def _timed_variables(stack: xr.Dataset) -> list[str]:
    return ["complex"] + (["h2ph"] if "h2ph" in stack.data_vars else [])


def _window_pieces(pieces: list[np.ndarray], window: slice) -> list[np.ndarray]:
    """The parts of consecutive time pieces that fall inside ``window`` (views)."""
    out, start = [], 0
    for piece in pieces:
        stop = start + piece.shape[-1]
        first, last = max(window.start, start), min(window.stop, stop)
        if last > first:
            out.append(piece[..., first - start:last - start])
        start = stop
    return out


def _at_pixels(values: np.ndarray | list, ia: np.ndarray, ir: np.ndarray) -> np.ndarray:
    """``values[ia, ir]``; time pieces are joined for the selected pixels only."""
    if not isinstance(values, list):
        return values[ia, ir]
    if len(values) == 1:
        return values[0][ia, ir]
    return np.concatenate([piece[ia, ir] for piece in values], axis=-1)


def _pixels_to_decide(slc: np.ndarray | list, *, method: str,
                      threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions ``(ia, ir)`` of the pixels whose statistics are computed, and their epochs as
    rows ``(pixel, time)``: for NAD those :func:`nad_screen` leaves (the others are certainly
    rejected), for NMAD every pixel."""
    pieces = slc if isinstance(slc, list) else [slc]
    if method == "nad":
        # compiled where this process may load Numba (not a Dask worker too small for it)
        ia, ir = np.nonzero(nad_screen(pieces, threshold, compiled=fused_kernels() is not False))
        return ia, ir, _at_pixels(slc, ia, ir)
    ia, ir = (index.ravel() for index in np.indices(pieces[0].shape[:2]))
    joined = pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=-1)
    return ia, ir, joined.reshape(-1, joined.shape[-1])


def _block_points(slc: np.ndarray | list, *, method: str, threshold: float,
                  offset: tuple[int, int], extra: dict | None = None,
                  window: slice | None = None) -> tuple[dict, dict]:
    """The selected pixels of one block: positions, statistics (and ``extra`` values), counts.

    ``slc`` and the ``extra`` time series may be lists of time pieces (a block read one stored
    time chunk at a time); statistics are taken over the epochs in ``window``. Each decided
    pixel's statistics come from its own epochs alone, so they do not depend on which other
    pixels are decided with it.
    """
    if window is not None:
        slc = _window_pieces(slc, window) if isinstance(slc, list) else slc[..., window]
    ia, ir, rows = _pixels_to_decide(slc, method=method, threshold=threshold)
    *statistics, status = _selection_block(rows, method=method, threshold=threshold)
    selected = status == _STATUS_SELECTED
    ia, ir = ia[selected], ir[selected]
    points = {"azimuth": ia + offset[0], "range": ir + offset[1]}
    points |= {name: values[selected] for name, values in zip(_POINT_STATISTICS, statistics)}
    points |= {name: _at_pixels(values, ia, ir) for name, values in (extra or {}).items()}
    shape = (slc[0] if isinstance(slc, list) else slc).shape[:2]
    counts = {"n_candidates": int(np.prod(shape)), "n_selected": int(selected.sum()),
              "n_excluded": int((status == _STATUS_UNUSABLE).sum())}
    return points, counts


def _collect(results, keys: list[str]) -> tuple[dict[str, list], dict]:
    pieces: dict[str, list] = {key: [] for key in keys}
    counts = {"n_candidates": 0, "n_selected": 0, "n_excluded": 0}
    for points, block_counts in results:
        for key in keys:
            pieces[key].append(points[key])
        for key, value in block_counts.items():
            counts[key] += value
    return pieces, counts


def _select_dask(stack, *, method, threshold, window) -> tuple[xr.Dataset, dict]:
    """One Dask task per chunk finds its selected pixels and their statistics (one read of
    ``complex``); the time series are then indexed lazily out of the stack."""
    names = _timed_variables(stack)
    raster = _lazy_raster(stack, names)
    slc = raster["complex"].isel(time=window).transpose("azimuth", "range", "time").data
    az_edges = np.cumsum((0, *slc.chunks[0]))
    rg_edges = np.cumsum((0, *slc.chunks[1]))
    chunks = slc.to_delayed()
    select = dask.delayed(_block_points, pure=True)
    tasks = [select(chunks[i, j, 0], method=method, threshold=threshold,
                    offset=(int(az_edges[i]), int(rg_edges[j])))
             for i in range(chunks.shape[0]) for j in range(chunks.shape[1])]
    pieces, counts = _collect(dask.compute(*tasks), ["azimuth", "range", *_POINT_STATISTICS])
    joined = _gather_in_order(pieces, stack)
    azimuth_pos, range_pos = joined["azimuth"], joined["range"]

    at = {"azimuth": xr.DataArray(azimuth_pos, dims="space"),
          "range": xr.DataArray(range_pos, dims="space")}
    timed = {name: raster[name].isel(at).transpose("space", "time").data for name in names}
    statistics = {name: joined[name] for name in _POINT_STATISTICS}
    coords2d = {name: np.asarray(stack[name].isel(at).values) for name in _coords2d(stack)}
    return _points_dataset(stack, azimuth_pos, range_pos, timed, statistics, coords2d), counts


def _select_stream(stack, *, method, threshold, window, block_shape, prefetch, workers,
                   progress) -> tuple[xr.Dataset, dict]:
    """One pass: each block is read by one of ``workers`` threads, which at once computes its
    statistics and takes its selected pixels' values, so the decompression of some blocks
    overlaps the statistics of others; only the selected pixels wait for the caller."""
    names = _timed_variables(stack)
    coord_names = _coords2d(stack)

    def select(slices: tuple[slice, slice], block: dict) -> tuple[dict, dict]:
        az, rg = slices
        return _block_points(block["complex"], method=method, threshold=threshold,
                             offset=(az.start, rg.start), window=window,
                             extra={name: block[name] for name in names + coord_names})

    # time pieces: a stack stored in time chunks is never joined along time in memory; the
    # amplitude sums join each pixel's epochs in a small buffer, the selected pixels' values
    # are joined for them alone
    results = iter_processed_blocks(stack, select, block_shape, prefetch=prefetch,
                                    workers=workers, variables=names + coord_names,
                                    split_time=True, handed_over_first=True,
                                    progress=progress, desc="PS selection")
    pieces, counts = _collect((result for _, result in results),
                              ["azimuth", "range", *_POINT_STATISTICS, *names, *coord_names])
    joined = _gather_in_order(pieces, stack)
    points = _points_dataset(
        stack, joined["azimuth"], joined["range"],
        timed={name: joined[name] for name in names},
        statistics={name: joined[name] for name in _POINT_STATISTICS},
        coords2d={name: joined[name] for name in coord_names},
    )
    return points, counts


def _gather_in_order(pieces: dict[str, list], stack: xr.Dataset) -> dict[str, np.ndarray]:
    """Join the per-block pieces straight into Morton order: one scatter, no concatenation."""
    azimuth_pos, range_pos = np.concatenate(pieces["azimuth"]), np.concatenate(pieces["range"])
    order = _morton(stack, azimuth_pos, range_pos)
    destination = np.empty_like(order)
    destination[order] = np.arange(order.size)
    joined = {}
    for key, parts in pieces.items():
        out = np.empty((order.size, *parts[0].shape[1:]), parts[0].dtype)
        start = 0
        for part in parts:
            out[destination[start:start + len(part)]] = part
            start += len(part)
        parts.clear()  # free each variable's pieces as soon as it is joined
        joined[key] = out
    return joined


def _finish_points(points: xr.Dataset, *, method: str, threshold: float, window_attrs: dict,
                   counts: dict) -> xr.Dataset:
    """Add amplitude, phase and the ``selected`` flag; order variables; record the selection."""
    ordered = with_amplitude_and_phase(points["complex"])
    if "h2ph" in points:
        ordered["h2ph"] = points["h2ph"]
    ordered |= {name: points[name] for name in (*_POINT_STATISTICS, *_PHASE_STATISTICS)
                if name in points}
    ordered["selected"] = xr.DataArray(np.ones(points.sizes["space"], bool), dims="space")
    result = xr.Dataset(ordered, coords=points.coords)
    for name, attrs in _PHASE_STATISTICS.items():
        if name in result:
            result[name].attrs.update(attrs)
    history = str(points.attrs.get("history", ""))
    step = f"ps_selection(method={method!r}, threshold={threshold})"
    result.attrs = dict(points.attrs) | window_attrs | counts | {
        "selection_method": method,
        "selection_threshold": threshold,
        "selection_variable": METHODS[method],
        "history": f"{history}\n{step}".strip(),
    }
    result["amplitude_dispersion"].attrs["long_name"] = (
        "NMAD = MAD/median of amplitude" if method == "nmad" else "NAD = std/mean of amplitude")
    return result


def ps_selection(
    stack: xr.Dataset,
    *,
    method: str = DEFAULT_METHOD,
    threshold: float | None = None,
    time_window: Any = None,
    engine: str = DEFAULT_ENGINE,
    block_shape: tuple[int, int] | None = None,
    prefetch: int = 2,
    workers: int | None = None,
    progress: bool = False,
) -> xr.Dataset:
    """Select Persistent Scatterer candidates by amplitude dispersion (or by their phase's
    similarity to their neighbours); return a point STM.

    A pixel is selected when its dispersion over the epochs in ``time_window`` is below
    ``threshold`` (with ``method="phase"``: when its phase similarity reaches it). Pixels
    without usable amplitude (all epochs NaN, zero mean or median) are excluded, logged and
    counted in ``attrs["n_excluded"]``; no division warning is raised.

    Parameters
    ----------
    stack
        Raster stack ``(azimuth, range, time)`` with ``complex`` SLC values and optionally
        ``h2ph`` and ``(azimuth, range)`` coordinates such as ``lat``/``lon``.
    method
        ``"nad"`` (std/mean), ``"nmad"`` (MAD/median, no 1.4826 factor) or ``"phase"`` (the
        phase similarity to the most similar of the eight neighbours,
        :func:`phase_similarity_block`). With ``nad``/``nmad``, a stack of at least
        :data:`AMPLITUDE_BLIND_MIN_PIXELS` usable pixels of which more than
        :data:`AMPLITUDE_BLIND_SHARE` pass is selected on the phase instead, with a warning.
    threshold
        ``nad``/``nmad``: positive dispersion threshold, default :data:`DEFAULT_THRESHOLD`
        (0.25, the usual NAD choice); ``phase``: the phase similarity a candidate reaches,
        default :data:`DEFAULT_PHASE_THRESHOLD` (0.75).
    time_window
        ``(start, end)`` of the epochs the dispersion is computed over (ends included); the
        output keeps every epoch.
    engine
        ``"auto"`` (default): ``"stream"`` when the point series of every pixel would fit in
        half the available memory and no distributed client is active, else ``"dask"``
        (:func:`resolve_engine`; the choice is logged and kept in ``attrs["selection_engine"]``).
        ``"dask"``: one Dask task per chunk finds its selected pixels and their statistics
        (one read of ``complex``); the time series (``complex``, ``amplitude``, ``phase``,
        ``h2ph``) stay lazy, indexed out of the stack, until saved or computed (a second read).
        ``"stream"``: one pass, each block read once on one of ``workers`` threads, which also
        computes its statistics and takes the selected pixels' time series from it, so
        decompression overlaps the statistics on all cores; returns an in-memory Dataset with
        the point values computed. Both give identical values.
    block_shape
        ``(n_azimuth, n_range)`` of a stream block; default the stack's chunks.
    prefetch
        Finished blocks' points waiting for the stream engine's caller.
    workers
        Threads of the stream engine, each reading and processing one block at a time;
        default :func:`~depsi.processing.network.worker_threads` (Dask's ``num_workers``,
        else the available cores).
    progress
        tqdm progress bar over the blocks (stream engine).

    Returns
    -------
    xarray.Dataset
        Point STM ``(space, time)`` in Morton order of (azimuth, range): ``complex``,
        ``amplitude``, ``phase``, ``h2ph`` (when in the stack), coordinates ``azimuth``,
        ``range``, ``time`` and the stack's ``lat``/``lon``; per point ``amplitude_dispersion``
        (the value selected on), the running sums ``amp_count``, ``amp_sum``, ``amp_sumsq`` of
        the window's amplitudes and ``selected`` (True). Attributes: the stack's (``wavelength``,
        ...), ``selection_method``, ``selection_threshold``, ``n_selected``, ``n_excluded``,
        ``n_candidates``, ``statistics_start``/``end``/``epochs`` and ``history``.

    Examples
    --------
    >>> import numpy as np, xarray as xr
    >>> slc = np.ones((2, 2, 3), "c8"); slc[0, 0] = [1, 3, 5]; slc[1, 1] = np.nan
    >>> stack = xr.Dataset({"complex": (("azimuth", "range", "time"), slc)},
    ...                    coords={"azimuth": [0, 1], "range": [0, 1], "time": np.array(
    ...                        ["2020-01-01", "2020-01-13", "2020-01-25"], "datetime64[ns]")},
    ...                    attrs={"wavelength": 0.0555})
    >>> ps = ps_selection(stack, threshold=0.25)
    >>> ps.sizes["space"], ps.attrs["n_excluded"]
    (2, 1)
    """
    method = _check_choice("method", method, list(METHODS))
    engine = _check_choice("engine", engine, ENGINES)
    if threshold is None:
        threshold = DEFAULT_PHASE_THRESHOLD if method == "phase" else DEFAULT_THRESHOLD
    threshold = _check_threshold(threshold)
    if method == "phase" and threshold > 1:
        raise ValueError(f"threshold: a phase similarity is at most 1, found {threshold!r}")
    if int(prefetch) < 1:
        raise ValueError(f"prefetch: expected a queue size >= 1, found {prefetch!r}")
    workers = worker_threads() if workers is None else workers
    if int(workers) < 1:
        raise ValueError(f"workers: expected a number of threads >= 1, found {workers!r}")
    _check_stack(stack)
    if stack.attrs.get(POSITIONS_ATTR) == "orbits":
        # lat/lon rasters geocoded from the orbits: the selected points are geocoded instead
        # (geocode_points below), not every pixel of the scene
        stack = stack.drop_vars([c for c in ("lat", "lon") if c in stack.coords])
    window = epoch_window(stack["time"].values, time_window)
    instead_of = None
    if method == "phase":
        engine = "dask"
        points, counts = _select_phase(stack, threshold=threshold, window=window)
    else:
        engine, why = resolve_engine(stack, engine)
        logger.info("ps_selection: %s engine (%s)", engine, why)
        if engine == "dask":
            points, counts = _select_dask(stack, method=method, threshold=threshold,
                                          window=window)
        else:
            points, counts = _select_stream(stack, method=method, threshold=threshold,
                                            window=window, block_shape=block_shape,
                                            prefetch=prefetch, workers=int(workers),
                                            progress=progress)
        logger.info("ps_selection: %d of %d pixels with %s < %g; %d excluded without usable "
                    "amplitude (all NaN or zero)", counts["n_selected"],
                    counts["n_candidates"], method.upper(), threshold, counts["n_excluded"])
        if _amplitude_blind(counts):
            logger.warning(
                "ps_selection: %.0f %% of the pixels have %s < %g: the amplitudes cannot tell "
                "stable pixels from others here (multilooked or interferogram products); "
                "selecting on the phase similarity to the neighbours (method 'phase', "
                "threshold %g) instead",
                100 * counts["n_selected"] / (counts["n_candidates"] - counts["n_excluded"]),
                method.upper(), threshold, DEFAULT_PHASE_THRESHOLD)
            instead_of, method, threshold, engine = method, "phase", DEFAULT_PHASE_THRESHOLD, "dask"
            points, counts = _select_phase(stack, threshold=threshold, window=window)
    for name in _timed_variables(stack):  # a check's decoded blocks no pass took (dask engine)
        drop_handed_over(stack[name].data)
    result = _finish_points(points, method=method, threshold=threshold, counts=counts,
                            window_attrs=_window_attrs(stack["time"].values[window]))
    result.attrs["selection_engine"] = engine
    if instead_of is not None:
        result.attrs["selection_instead_of"] = instead_of
    # positions and line of sight from the orbits, where the stack carries its geometry
    result = geocode_points(result)
    if engine == "dask" and result.sizes["space"]:
        chunks: dict[Hashable, int] = {"space": space_chunk_size(result), "time": -1}
        result = result.assign({name: var.chunk({d: chunks[d] for d in var.dims})
                                for name, var in result.data_vars.items()})
    return with_cf_attributes(result)


def _amplitude_blind(counts: dict) -> bool:
    """Whether so many pixels passed an amplitude threshold that it says nothing
    (:data:`AMPLITUDE_BLIND_SHARE` of at least :data:`AMPLITUDE_BLIND_MIN_PIXELS`)."""
    usable = counts["n_candidates"] - counts["n_excluded"]
    return usable >= AMPLITUDE_BLIND_MIN_PIXELS and counts["n_selected"] > (
        AMPLITUDE_BLIND_SHARE * usable)


# --------------------------------------------------------------------------------------------
# phase similarity (PSPS)

#: The eight neighbours a pixel's phase is compared with.
_NEIGHBOURS = tuple((da_, dr) for da_ in (-1, 0, 1) for dr in (-1, 0, 1) if (da_, dr) != (0, 0))


def phase_similarity_block(slc: np.ndarray) -> np.ndarray:
    """Phase similarity of each pixel to its most similar neighbour, for a block with a halo
    of one pixel: ``max_q |mean_t exp(i (phi_p,t - phi_q,t))|`` over the eight neighbours ``q``
    (Wang and Chen 2022, IEEE TGRS 60, "Accurate persistent scatterer identification based on
    phase similarity of radar pixels"). Epochs without a value (NaN, zero) count as
    dissimilar. Returns float32 ``(n_azimuth - 2, n_range - 2)``.

    Examples
    --------
    >>> phase = np.zeros((3, 3, 4)); phase[0, 0] = [0, 1, 2, 3]
    >>> float(phase_similarity_block(np.exp(1j * phase)).round(3)[0, 0])
    1.0
    """
    values = np.nan_to_num(np.asarray(slc, np.complex64))
    modulus = np.abs(values)
    unit = np.divide(values, modulus, out=np.zeros_like(values), where=modulus > 0)
    n_az, n_rg, n_time = unit.shape
    centre = unit[1:n_az - 1, 1:n_rg - 1]
    best = np.zeros(centre.shape[:2], np.float32)
    for da_, dr in _NEIGHBOURS:  # eight shifted views: vectorised over the block's pixels
        neighbour = unit[1 + da_:n_az - 1 + da_, 1 + dr:n_rg - 1 + dr]
        similarity = np.abs(np.einsum("art,art->ar", centre, neighbour.conj())) / n_time
        np.maximum(best, similarity.astype(np.float32), out=best)
    return best


def _select_phase(stack: xr.Dataset, *, threshold: float, window: slice
                  ) -> tuple[xr.Dataset, dict]:
    """Candidates by phase similarity (:func:`phase_similarity_block`), one lazy pass with a
    halo of one pixel; the points' time series indexed out of the stack as the dask engine's.
    Each point carries its ``phase_similarity``, the ``phase_std`` it implies and its NAD."""
    names = _timed_variables(stack)
    raster = _lazy_raster(stack, names)
    slc = raster["complex"].isel(time=window).transpose("azimuth", "range", "time").data
    slc = slc.rechunk({2: -1})
    # each block with a halo of its neighbours' pixels (zeros beyond the scene: dissimilar)
    padded = da.overlap.overlap(slc, depth={0: 1, 1: 1, 2: 0}, boundary={0: 0, 1: 0, 2: "none"})
    similarity = padded.map_blocks(phase_similarity_block, dtype=np.float32, drop_axis=2,
                                   chunks=slc.chunks[:2])
    statistics = da.map_blocks(_nad_raster, slc, dtype=np.float32, drop_axis=2)
    similarity, nad = dask.compute(similarity, statistics)
    usable = np.isfinite(nad)
    selected = usable & (similarity >= threshold)
    azimuth_pos, range_pos = np.nonzero(selected)
    order = np.argsort(_morton(stack, azimuth_pos, range_pos), kind="stable")
    azimuth_pos, range_pos = azimuth_pos[order], range_pos[order]
    at = {"azimuth": xr.DataArray(azimuth_pos, dims="space"),
          "range": xr.DataArray(range_pos, dims="space")}
    timed = {name: raster[name].isel(at).transpose("space", "time").data for name in names}
    values = similarity[azimuth_pos, range_pos]
    point_statistics = {
        "phase_similarity": values.astype(np.float32),
        # the pair's similarity exp(-(s_p^2 + s_q^2) / 2) with s_p = s_q: the pixel's phase noise
        "phase_std": np.sqrt(-np.log(np.clip(values, 1e-6, 1.0))).astype(np.float32),
        "amplitude_dispersion": nad[azimuth_pos, range_pos]}
    coords2d = {name: np.asarray(stack[name].isel(at).values) for name in _coords2d(stack)}
    points = _points_dataset(stack, azimuth_pos, range_pos, timed, point_statistics, coords2d)
    counts = {"n_candidates": int(selected.size), "n_selected": int(selected.sum()),
              "n_excluded": int((~usable).sum())}
    logger.info("ps_selection: %d of %d pixels with a phase similarity >= %g to a neighbour; "
                "%d excluded without usable amplitude", counts["n_selected"],
                counts["n_candidates"], threshold, counts["n_excluded"])
    return points, counts


def _nad_raster(slc: np.ndarray) -> np.ndarray:
    """NAD of each pixel of a block (NaN without usable amplitude)."""
    return statistics_block(slc, robust=False)["amplitude_dispersion"]


# --------------------------------------------------------------------------------------------
# incremental epochs


def _new_point_values(old: xr.Dataset, new_epochs: xr.Dataset) -> xr.Dataset:
    """The new epochs at the stored points, as an in-memory point Dataset."""
    if "azimuth" in new_epochs.dims and "range" in new_epochs.dims:
        _check_stack(new_epochs)
        at = {"azimuth": xr.DataArray(old["azimuth"].values, dims="space"),
              "range": xr.DataArray(old["range"].values, dims="space")}
        try:
            points = new_epochs[_timed_variables(new_epochs)].sel(at)
        except KeyError as err:
            raise STMValidationError(
                f"new_epochs: expected every stored point's (azimuth, range) in the raster, "
                f"found missing pixel labels ({err})") from None
        return points.transpose("space", "time").drop_vars(
            [c for c in points.coords if set(points[c].dims) - {"space", "time"}]).compute()
    validate(new_epochs, kind="points", require=("complex",))
    return new_epochs.compute()


def _check_updatable(old: xr.Dataset, path: Path, method: str) -> None:
    if method != "nad":
        raise ValueError(
            f"method: only 'nad' can be updated incrementally, found {method!r}: NMAD needs the "
            "median of the full amplitude history of each point, which running sums cannot "
            "give; rerun ps_selection on the whole stack")
    stored = old.attrs.get("selection_method")
    if "scatterer" in old.data_vars:
        raise ValueError(
            f"store {str(path)!r}: expected PS alone, found distributed scatterers (a merged "
            "product): their linked phases need every epoch's SHP, so rerun the selection")
    if stored != "nad":
        raise ValueError(
            f"store {str(path)!r}: expected a PS product selected with NAD, found "
            f"selection_method={stored!r}; NMAD needs the full history, so rerun ps_selection")
    missing = [name for name in (*SUM_VARIABLES, "amplitude_dispersion") if name not in old]
    if missing:
        raise STMValidationError(f"store {str(path)!r}: expected running sums {missing} for "
                                 f"an update, found variables {sorted(map(str, old.data_vars))}")
    last = str(old["time"].values[-1])
    if str(old.attrs.get("statistics_end")) != last:
        raise ValueError(
            f"store {str(path)!r}: the running sums end at {old.attrs.get('statistics_end')}, "
            f"but the last stored epoch is {last} (a time window or an interrupted update); "
            "new epochs cannot be added without rereading the epochs in between")


def update_selection(
    ps_store: str | os.PathLike,
    new_epochs: xr.Dataset,
    *,
    threshold: float | None = None,
    method: str = DEFAULT_METHOD,
) -> xr.Dataset:
    """Add new epochs to a stored PS product and update its NAD without rereading old epochs.

    The stored running sums (``amp_count``, ``amp_sum``, ``amp_sumsq``) plus the new epochs'
    amplitudes give the NAD over all epochs; it equals a full recomputation to float32
    round-off. The points stay the same: a stored point whose NAD now reaches the threshold
    keeps its time series but gets ``selected = False``; a pixel that was not selected before
    cannot enter, since its earlier epochs are not in the product (rerun :func:`ps_selection`
    for that). The new epochs are appended with :func:`~depsi.io.store_append.append_epochs`.

    Parameters
    ----------
    ps_store
        A point STM store written by ``save_stm(ps_selection(..., method="nad"))``.
    new_epochs
        The new SLCs as a raster stack ``(azimuth, range, time)`` containing every stored
        pixel, or their values at the stored points as a point STM ``(space, time)`` in the
        store's order; with ``complex`` (and ``h2ph`` when the store has it), epochs after the
        last stored one.
    threshold
        New NAD threshold; default the stored ``selection_threshold``: ``threshold`` defaults
        to ``None``, not :data:`DEFAULT_THRESHOLD`, on purpose (a store keeps its own).
    method
        Only ``"nad"``; ``"nmad"`` raises ``ValueError`` (NMAD needs the full history).

    Returns
    -------
    xarray.Dataset
        The updated store, reopened lazily.

    Examples
    --------
    >>> import tempfile, numpy as np, xarray as xr
    >>> from depsi.io.store import save_stm
    >>> time = np.array(["2020-01-01", "2020-01-13", "2020-01-25"], "datetime64[ns]")
    >>> stack = xr.Dataset({"complex": (("azimuth", "range", "time"), np.ones((1, 2, 3), "c8"))},
    ...                    coords={"azimuth": [0], "range": [0, 1], "time": time},
    ...                    attrs={"wavelength": 0.0555})
    >>> path = save_stm(ps_selection(stack.isel(time=slice(0, 2))), tempfile.mkdtemp() + "/ps")
    >>> updated = update_selection(path, stack.isel(time=[2]))
    >>> updated.sizes["time"], updated.amp_count.values.tolist()
    (3, [3, 3])
    """
    path = Path(ps_store)
    old = open_stm(path, kind="points")
    _check_updatable(old, path, method)
    threshold = _check_threshold(old.attrs.get("selection_threshold") if threshold is None
                                 else threshold)
    new = _new_point_values(old, new_epochs)

    sums = tuple(old[name].values for name in SUM_VARIABLES)
    sums = add_sums(sums, amplitude_sums(amplitude_of(new["complex"].values)))
    nad = moments_from_sums(*sums)[2].astype(np.float32)
    selected = nad < threshold

    append_epochs(path, epochs_to_append(old, new))

    _write_point_state(path, old, new, threshold, {
        "amplitude_dispersion": nad, "amp_count": sums[0].astype(np.int32),
        "amp_sum": sums[1], "amp_sumsq": sums[2], "selected": selected})
    logger.info("update_selection: appended %d epoch(s) to %s; %d of %d points still below "
                "NAD %g", new.sizes["time"], path, int(selected.sum()), selected.size, threshold)
    return open_stm(path, kind="points")


def _write_point_state(path: Path, old: xr.Dataset, new: xr.Dataset, threshold: float,
                       space: dict[str, np.ndarray]) -> None:
    """Overwrite the per-point variables in place, then the attributes (last, as the marker)."""
    import zarr

    group = zarr.open_group(path, mode="r+")
    for name, values in space.items():
        if name in group:
            cast(zarr.Array, group[name])[...] = values  # variables are arrays, not groups
        else:  # a product from before the flag existed
            xr.Dataset({name: ("space", values)}).to_zarr(path, mode="a", consolidated=False)
    times = new["time"].values
    step = f"update_selection(+{times.size} epochs, threshold={threshold})"
    group.attrs.update({
        "selection_threshold": threshold, "n_selected": int(space["selected"].sum()),
        "statistics_end": str(times[-1]),
        "statistics_epochs": int(old.attrs.get("statistics_epochs", 0)) + int(times.size),
        "history": f"{old.attrs.get('history', '')}\n{step}".strip()})
    from depsi.io.store import consolidate_metadata

    consolidate_metadata(path)  # a flag array may be new: keep plain xr.open_zarr in step

