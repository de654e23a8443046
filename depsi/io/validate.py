"""Checks that an SLC stack's values are physically possible, before the chain reads it whole.

The readers check files (sizes, chunks present, dates); :func:`validate_stack` checks values on
a bounded sample (a fixed grid of windows, all epochs), so that a wrong file that decodes as
numbers is refused with its name instead of running to nonsense.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import dask
import numpy as np
import xarray as xr

from depsi.errors import BadInputError
from depsi.geometry import GEOMETRY_ATTR, StackGeometry

logger = logging.getLogger(__name__)

#: Largest physically possible |h2ph| (dimensionless: phase = 4 pi / wavelength x h2ph x height).
#: h2ph = B_perp / (R sin(theta)): perpendicular baselines stay below 10 km (no SAR mission's
#: orbital tube comes near; Sentinel-1 keeps ~200 m) and R sin(theta) exceeds 2e5 m for every
#: spaceborne SAR (R >= 500 km at theta >= 25 deg), so 10e3 / 2e5 = 0.05. Real stacks hold
#: |h2ph| < 1e-3; a float64 file read as float32 gives values up to 1e19.
H2PH_MAX = 0.05

#: Windows sampled by :func:`validate_stack`, on the scene's diagonal, each in its own stored
#: chunk: the sample reads at most this many chunks of a variable, every epoch.
SAMPLE_GRID = 3
#: The sample reads at most one in this many of a variable's stored (azimuth, range) chunks
#: (one at least): on a stack of 16 chunks one, from 60 chunks on SAMPLE_GRID.
SAMPLE_CHUNK_SHARE = 20
#: The sample is at most SAMPLE_GRID**2 x SAMPLE_WINDOW**2 pixels per epoch (SAMPLE_GRID
#: square windows of side sqrt(SAMPLE_GRID) x SAMPLE_WINDOW), whatever the scene's size.
SAMPLE_WINDOW = 32

#: Shortest span of a stack's epochs: a deformation time series needs epochs on distinct days
#: (acquisitions of one day give velocities of metres per year from noise).
MIN_EPOCH_SPAN = np.timedelta64(1, "D")

BadEpochPolicy = Literal["fail", "drop"]


class InputValidationError(BadInputError, ValueError):
    """An input's values or files are impossible; the message names the input and the check."""


def check_epoch_span(time: np.ndarray, what: str) -> None:
    """Refuse two or more epochs spanning less than :data:`MIN_EPOCH_SPAN` (dates named).

    Integer epoch indices (no dates) and a single epoch pass.

    Examples
    --------
    >>> check_epoch_span(np.array(["2023-03-19", "2023-03-31"], "datetime64[ns]"), "dates")
    >>> check_epoch_span(np.array(["2023-03-19T10", "2023-03-19T11"], "datetime64[ns]"),
    ...                  "dates")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    depsi.io.validate.InputValidationError: dates: expected epochs spanning at least 1 day, ...
    """
    time = np.asarray(time)
    if time.dtype.kind != "M" or time.size < 2:
        return
    span = time.max() - time.min()
    if span < MIN_EPOCH_SPAN:
        shown = [str(t) for t in np.datetime_as_string(np.sort(time)[:6], unit="s")]
        shown += ["..."] if time.size > 6 else []
        hours = span / np.timedelta64(1, "s") / 3600
        raise InputValidationError(
            f"{what}: expected epochs spanning at least 1 day, found {time.size} epochs "
            f"within {hours:.3g} hours: {shown}")


def _axis_chunks(data, axis: int) -> tuple[int, ...]:
    """Stored chunk sizes along ``axis`` (a Dask array's blocks; one chunk for NumPy)."""
    chunks = getattr(data, "chunks", None)
    if chunks is None or not isinstance(chunks[axis], tuple):
        return (data.shape[axis],)
    return tuple(int(c) for c in chunks[axis])


def _window_in_chunk(chunks: tuple[int, ...], fraction: float, side: int
                     ) -> tuple[slice, int]:
    """A window of at most ``side`` pixels inside the chunk that holds ``fraction`` of the
    axis, centred on that point as far as the chunk allows, and that chunk's index."""
    edges = np.concatenate([[0], np.cumsum(chunks)])
    target = min(int(fraction * edges[-1]), int(edges[-1]) - 1)
    k = int(np.searchsorted(edges, target, side="right")) - 1
    low, high = int(edges[k]), int(edges[k + 1])
    side = min(side, high - low)
    start = min(high - side, max(low, target - side // 2))
    return slice(start, start + side), k


def sample_windows(data) -> list[tuple[slice, slice]]:
    """The ``(azimuth, range)`` windows :func:`validate_stack` reads: up to SAMPLE_GRID windows
    on the scene's diagonal (its centre first, then near its two corners), each inside one
    stored chunk and SAMPLE_GRID x SAMPLE_WINDOW**2 pixels at most.

    The windows touch at most SAMPLE_GRID chunks of each variable and at most one in
    SAMPLE_CHUNK_SHARE of its (azimuth, range) chunks (one at least), whatever the scene's size
    and chunking: a stack of a few chunks is not read in good part before the selection reads
    it whole. In-memory arrays get all SAMPLE_GRID windows.

    Examples
    --------
    >>> import dask.array as da
    >>> [a for a, r in sample_windows(da.zeros((2000, 2000, 4), chunks=(250, 250, 4)))]
    [slice(1000, 1055, None), slice(306, 361, None), slice(1639, 1694, None)]
    >>> [a for a, r in sample_windows(da.zeros((1000, 1000, 4), chunks=(250, 250, 4)))]
    [slice(500, 555, None)]
    """
    side = int(np.sqrt(SAMPLE_GRID) * SAMPLE_WINDOW)
    fractions = sorted(((k + 0.5) / SAMPLE_GRID for k in range(SAMPLE_GRID)),
                       key=lambda f: abs(f - 0.5))
    az_chunks, rg_chunks = _axis_chunks(data, 0), _axis_chunks(data, 1)
    budget = min(SAMPLE_GRID, max(1, len(az_chunks) * len(rg_chunks) // SAMPLE_CHUNK_SHARE))
    if not hasattr(data, "dask"):
        budget = SAMPLE_GRID
    windows: dict[tuple[int, int, int, int], tuple[slice, slice]] = {}
    touched: set[tuple[int, int]] = set()
    for f in fractions:
        a, ka = _window_in_chunk(az_chunks, f, side)
        r, kr = _window_in_chunk(rg_chunks, f, side)
        if (ka, kr) not in touched and len(touched) >= budget:
            continue
        touched.add((ka, kr))
        windows[(a.start, a.stop, r.start, r.stop)] = (a, r)  # small scenes: one window once
    return list(windows.values())


def _enclosing_block(data, window: tuple[slice, slice]) -> tuple[slice, slice]:
    """The ``(azimuth, range)`` slices of the Dask block that holds ``window`` (each window
    of :func:`sample_windows` lies in one)."""
    block = []
    for axis, part in enumerate(window):
        edges = np.concatenate([[0], np.cumsum(_axis_chunks(data, axis))])
        k = int(np.searchsorted(edges, part.start, side="right")) - 1
        block.append(slice(int(edges[k]), int(edges[k + 1])))
    return block[0], block[1]


def _span(block: tuple[slice, slice]) -> tuple[int, int, int, int]:
    return block[0].start, block[0].stop, block[1].start, block[1].stop


def _read_block(source: Any, block: tuple[slice, slice]) -> np.ndarray:
    return np.asarray(source[block])


def _read_whole_blocks(arrays: dict[str, Any]) -> dict[str, dict] | None:
    """The Dask blocks that hold each variable's sampled windows, read whole and handed over
    to the pass that will read the stack whole (:func:`depsi.io.prefetch.hand_over`), by
    variable and block; None (read the windows alone) unless every variable is read straight
    from its store (:func:`depsi.io.prefetch.stored_source`) and the blocks fit in what may be
    handed over (:data:`depsi.io.prefetch.HANDOVER_BYTES`).

    A window's stored chunks are decoded whole whichever part of them is read: reading the
    whole block costs about the same, and the selection then takes the block instead of
    decoding it a second time, so that the check costs the stack step (almost) no decoding of
    its own.
    """
    from depsi.io.prefetch import hand_over, handover_room, stored_source

    jobs: list[tuple[str, Any, Any, tuple[slice, slice]]] = []
    for name, data in arrays.items():
        source = stored_source(data)
        if source is None:
            return None
        spans = {_span(_enclosing_block(data, w)) for w in sample_windows(data)}
        jobs.extend((name, data, source, (slice(a0, a1), slice(r0, r1)))
                    for a0, a1, r0, r1 in sorted(spans))
    nbytes = sum((a.stop - a.start) * (r.stop - r.start) * int(np.prod(data.shape[2:]))
                 * data.dtype.itemsize for _, data, _, (a, r) in jobs)
    if not jobs or nbytes > handover_room():
        return None
    # on this process's threads (Dask's pool, whose threads and heaps the checks reuse)
    read = dask.delayed(_read_block, pure=False)
    values = dask.compute(*(read(source, block) for _, _, source, block in jobs),
                          scheduler="threads")
    blocks: dict[str, dict] = {name: {} for name in arrays}
    for (name, data, _, block), value in zip(jobs, values):
        hand_over(data, block, value)
        blocks[name][_span(block)] = value
    return blocks


def _samples(variables: dict[str, xr.DataArray]) -> dict[str, np.ndarray]:
    """``(pixels, time)`` values of each variable's sampled windows, all windows of all of them
    read at once, so that the stored chunks they touch are decoded at once on the threads
    (``complex`` and ``h2ph`` together: the stack step's time is the larger read, not their
    sum). Read straight from a store, the windows' whole blocks are read and kept for the
    selection's pass (:func:`_read_whole_blocks`)."""
    arrays = {name: variable.transpose("azimuth", "range", "time").data
              for name, variable in variables.items()}
    blocks = _read_whole_blocks(arrays)
    windows, owners = [], []
    for name, data in arrays.items():
        for a, r in sample_windows(data):
            if blocks is not None:
                block_a, block_r = _enclosing_block(data, (a, r))
                values = blocks[name][_span((block_a, block_r))]
                window = values[a.start - block_a.start:a.stop - block_a.start,
                                r.start - block_r.start:r.stop - block_r.start]
                windows.append(window.reshape(-1, data.shape[2]))
            else:
                windows.append(data[a, r, :].reshape(-1, data.shape[2]))
            owners.append(name)
    if any(hasattr(window, "dask") for window in windows):
        windows = list(dask.compute(*windows))
    return {name: np.concatenate([np.asarray(w) for w, owner in zip(windows, owners)
                                  if owner == name], axis=0)
            for name in variables}


def _days(stack: xr.Dataset, index: Sequence[int] | np.ndarray) -> list[str]:
    time = stack["time"].values
    return [str(np.datetime64(time[i], "D")) if time.dtype.kind == "M" else f"epoch {time[i]}"
            for i in index]


def _bad_epochs(stack: xr.Dataset, sample: np.ndarray | None) -> dict[int, str]:
    """{epoch index: what is wrong} from the sampled ``complex`` values (None: no
    ``complex``)."""
    if sample is None:
        return {}
    bad = {}
    finite = np.isfinite(sample.real) & np.isfinite(sample.imag)
    amplitude = np.abs(sample)
    for k in range(sample.shape[1]):
        n_bad = int((~finite[:, k]).sum())
        if n_bad:
            bad[k] = (f"finite complex values (phase), found {n_bad} of {sample.shape[0]} "
                      "sampled pixels NaN or infinite")
            continue
        if sample.shape[0] < 2:
            continue
        low, high = float(amplitude[:, k].min()), float(amplitude[:, k].max())
        if high == 0:
            bad[k] = f"an amplitude that varies, found all zero in {sample.shape[0]} sampled pixels"
        elif high == low:
            bad[k] = (f"an amplitude that varies, found the constant {high:g} in "
                      f"{sample.shape[0]} sampled pixels")
    return bad


def _h2ph_source(stack: xr.Dataset, source: str) -> str:
    attrs = stack["h2ph"].attrs
    origin = attrs.get("source") or attrs.get("long_name")
    return f"{source}: h2ph" + (f" ({origin})" if origin else "")


def _check_h2ph(stack: xr.Dataset, source: str, sample: np.ndarray | None) -> None:
    """|h2ph| within H2PH_MAX, and not zero at every epoch (a secondary's h2ph is never 0),
    from the sampled values (None: no ``h2ph``)."""
    if sample is None:
        return
    sample = sample.astype(np.float64)
    what = _h2ph_source(stack, source)
    with np.errstate(invalid="ignore"):
        over = np.abs(sample) > H2PH_MAX
    if over.any():
        epochs = np.flatnonzero(over.any(axis=0))
        raise InputValidationError(
            f"{what}: expected |h2ph| <= {H2PH_MAX} (B_perp <= 10 km over R sin(theta) >= "
            f"2e5 m), found values up to {float(np.nanmax(np.abs(sample))):.3g} in epochs "
            f"{_days(stack, epochs)} (a file of another dtype or byte order?)")
    if stack.sizes["time"] >= 2 and sample.size and (sample == 0).all():
        raise InputValidationError(
            f"{what}: expected a non-zero height-to-phase factor at the secondary epochs, found "
            f"zero at all {stack.sizes['time']} epochs in {sample.shape[0]} sampled pixels "
            "(no perpendicular baselines: heights and velocities cannot be separated)")


def _mother_index(stack: xr.Dataset) -> int | None:
    geometry = StackGeometry.from_attrs(stack.attrs) if GEOMETRY_ATTR in stack.attrs else None
    if geometry is not None:
        return geometry.mother
    time = stack["time"].values
    for key in ("mother_time", "coregistration_mother_time"):
        day = stack.attrs.get(key)
        if day and time.dtype.kind == "M":
            match = np.flatnonzero(time.astype("datetime64[D]") == np.datetime64(str(day)[:10]))
            if match.size:
                return int(match[0])
    return None


def _drop(stack: xr.Dataset, bad: dict[int, str], source: str) -> xr.Dataset:
    keep = [k for k in range(stack.sizes["time"]) if k not in bad]
    mother = _mother_index(stack)
    if mother in bad:
        raise InputValidationError(
            f"{source}: epoch {_days(stack, [mother])[0]} (the mother): expected {bad[mother]} "
            "(the mother epoch cannot be dropped)")
    if len(keep) < 2:
        raise InputValidationError(
            f"{source}: expected at least 2 usable epochs after dropping bad ones, found "
            f"{len(keep)} of {stack.sizes['time']} (bad: {_days(stack, sorted(bad))})")
    out = stack.isel(time=keep)
    out.attrs = dict(stack.attrs)  # never write into attrs shared with the parent
    geometry = StackGeometry.from_attrs(stack.attrs)
    if geometry is not None:
        out.attrs[GEOMETRY_ATTR] = geometry.select_epochs(keep).to_json()
    logger.warning("%s: dropped %d of %d epochs with unusable amplitude: %s", source, len(bad),
                   stack.sizes["time"], "; ".join(f"{d}: expected {bad[k]}" for d, k in
                                                  zip(_days(stack, sorted(bad)), sorted(bad))))
    return out


def validate_stack(stack: xr.Dataset, *, on_bad_epoch: BadEpochPolicy = "fail",
                   source: str = "stack") -> xr.Dataset:
    """Check a raster stack's values on a bounded sample; the stack, bad epochs dropped if asked.

    Reads the windows of :func:`sample_windows` (at most ``SAMPLE_GRID`` Dask blocks), every
    epoch, of ``complex`` and ``h2ph`` (never the whole stack); a stack read straight from its
    store has those blocks read whole and kept for the selection's pass, which then does not
    decode them again (:func:`depsi.io.prefetch.hand_over`, at most
    :data:`~depsi.io.prefetch.HANDOVER_BYTES`). It checks: the epochs span at
    least a day (:func:`check_epoch_span`); complex values are finite and each epoch's amplitude
    is neither all zero nor constant; ``|h2ph| <= H2PH_MAX``; h2ph is not zero at every epoch.

    Parameters
    ----------
    stack
        Raster stack ``(azimuth, range, time)`` with ``complex`` and optionally ``h2ph``.
    on_bad_epoch
        ``"fail"``: an epoch with non-finite or all-zero/constant samples raises. ``"drop"``:
        such epochs are dropped with a warning giving their dates and count (the mother epoch
        never: it raises). h2ph and date checks always raise.
    source
        How the stack is named in messages (its path).

    Returns
    -------
    xarray.Dataset
        ``stack`` itself, or a copy without the dropped epochs (``sar_geometry`` subset too).

    Raises
    ------
    InputValidationError
        The check that failed, the source, and the epochs' dates.

    Examples
    --------
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(20, 20), n_epochs=4)
    >>> validate_stack(stack).sizes["time"]
    4
    >>> flat = stack.assign(complex=stack.complex.where(stack.time != stack.time[0], 0))
    >>> validate_stack(flat, on_bad_epoch="drop").sizes["time"]
    3
    """
    if on_bad_epoch not in ("fail", "drop"):
        raise ValueError(f"on_bad_epoch: expected 'fail' or 'drop', found {on_bad_epoch!r}")
    check_epoch_span(stack["time"].values, f"{source}: time")
    samples = _samples({name: stack[name] for name in ("h2ph", "complex")
                        if name in stack.data_vars})
    _check_h2ph(stack, source, samples.get("h2ph"))
    bad = _bad_epochs(stack, samples.get("complex"))
    if not bad:
        return stack
    if on_bad_epoch == "fail":
        details = "; ".join(f"epoch {d}: expected {bad[k]}"
                            for d, k in zip(_days(stack, sorted(bad)), sorted(bad)))
        raise InputValidationError(
            f"{source}: {len(bad)} of {stack.sizes['time']} epochs unusable: {details} "
            "(input.on_bad_epoch: 'drop' drops them)")
    return _drop(stack, bad, source)


__all__ = [
    "H2PH_MAX",
    "MIN_EPOCH_SPAN",
    "SAMPLE_CHUNK_SHARE",
    "SAMPLE_GRID",
    "SAMPLE_WINDOW",
    "InputValidationError",
    "check_epoch_span",
    "sample_windows",
    "validate_stack",
]
