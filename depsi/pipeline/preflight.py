"""Before any step runs: refuse a configuration whose work cannot fit the machine.

:func:`check_feasible` predicts the memory of the arcs' periodogram grid, of the selection's
blocks and of the point chunks from the configuration alone (and a Zarr store's metadata),
and refuses, naming the key, the predicted bytes and the limit, what would otherwise be
OOM-killed hours later; it also refuses absurd worker and thread counts, simulated scenes
larger than the disk, stores whose metadata claim far more pixels than their files hold, and
temporal models the epochs cannot determine (:func:`check_model`) and DS windows larger than
the scene (:func:`check_ds_window`).

Examples
--------
>>> from depsi.pipeline.config import PipelineConfig
>>> report = check_feasible(PipelineConfig())
>>> report["arcs"]["grid_nodes"] < MAX_GRID_NODES
True
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from depsi.errors import BadInputError, TooLargeError
from depsi.io.store import MAX_CLAIMED_TO_STORED, MIN_CLAIMED_BYTES_CHECKED

logger = logging.getLogger(__name__)

#: Most threads or worker processes per core: beyond this a pool only adds start-up time and
#: memory (each thread holds its own kernel batch), and 10**6 threads hang the machine.
MAX_THREADS_PER_CORE = 64

#: Most nodes of the arcs' coarse search grid (heights x velocities). The default grid has
#: about 10**3 to 10**4; each node costs 12 bytes per arc in a batch and 8 T flops per arc, so
#: 10**7 nodes are already hours for 10**5 arcs: more is a mistyped range or step.
MAX_GRID_NODES = 10**7

#: Shortest radar wavelength assumed when a grid step is left to the data (X band, m): the
#: default step scales with the wavelength, so this gives the most nodes.
ASSUMED_WAVELENGTH = 0.031
#: Longest time span assumed for the default velocity step (years): Sentinel-1 stacks reach
#: a decade.
ASSUMED_TIME_SPAN_YEARS = 10.0
#: Widest h2ph span assumed for the default height step (m/m): 1 km of perpendicular
#: baseline at 500 km of range.
ASSUMED_H2PH_SPAN = 2e-3
#: Epochs assumed when the stack's are not known before it is read.
ASSUMED_EPOCHS = 300

#: Bytes per pixel and epoch of a selection block: the complex64 SLC, its float32 amplitude and
#: the float64 statistics' temporaries.
SELECTION_BYTES_PER_PIXEL_EPOCH = 24
#: Bytes per pixel and epoch of a simulated stack on disk (complex64 SLC, float32 h2ph, and
#: the truth beside them).
SIMULATED_BYTES_PER_PIXEL_EPOCH = 12
#: Fraction of the memory limit the predicted peak may take (the rest: Python, Dask, the graph).
MEMORY_FRACTION = 0.8



class ResourceLimitError(TooLargeError, ValueError):
    """A configuration whose predicted work exceeds the machine; names key, bytes and limit."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _bytes(text: str) -> int:
    from dask.utils import parse_bytes

    return int(parse_bytes(text))


def memory_per_process(config: Any) -> tuple[int, str]:
    """Memory one worker process may use and where that figure comes from."""
    import psutil

    compute = config.compute
    if compute.scheduler == "slurm":
        return (_bytes(compute.slurm.memory) // compute.slurm.processes,
                "compute.slurm.memory / compute.slurm.processes")
    if compute.scheduler == "local" and compute.memory_limit not in (None, "auto"):
        return _bytes(compute.memory_limit), "compute.memory_limit"
    available = int(psutil.virtual_memory().available)
    if compute.scheduler in ("local", "processes"):
        workers = compute.workers or _cores()
        return available // workers, f"available memory / {workers} workers"
    return available, "available memory"


def tasks_per_process(config: Any) -> int:
    """Tasks that run at once in one worker process (threads share its memory)."""
    compute = config.compute
    if compute.scheduler == "synchronous" or compute.scheduler == "processes":
        return 1
    if compute.scheduler == "slurm":
        return max(1, compute.slurm.cores // compute.slurm.processes)
    if compute.scheduler == "local":
        workers = compute.workers or _cores()
        return compute.threads or max(1, _cores() // workers)
    return compute.threads or _cores()


def _check_counts(config: Any) -> None:
    compute, cap = config.compute, MAX_THREADS_PER_CORE * _cores()
    for key in ("threads", "workers"):
        value = getattr(compute, key)
        if value is not None and value > cap:
            raise ResourceLimitError(
                f"compute.{key}: expected at most {cap} ({MAX_THREADS_PER_CORE} per core, "
                f"{_cores()} cores), found {value}")


def _axis_nodes(low: float, high: float, step: float) -> int:
    if high == low or not math.isfinite(step):
        return 1
    return max(2, int(math.ceil((high - low) / step - 1e-9)) + 1)


def arcs_grid(arcs: Any) -> dict[str, int]:
    """Nodes of the arcs' coarse grid per axis; steps left to the data take the assumed spans
    (:data:`ASSUMED_WAVELENGTH` etc.), the most nodes a real stack gives."""
    from depsi.kernels.periodogram import default_step

    height_step = arcs.height_step or default_step(ASSUMED_H2PH_SPAN, ASSUMED_WAVELENGTH)
    velocity_step = arcs.velocity_step or default_step(ASSUMED_TIME_SPAN_YEARS,
                                                       ASSUMED_WAVELENGTH)
    (h_low, h_high), (v_low, v_high) = arcs.height_range, arcs.velocity_range
    return {"heights": _axis_nodes(h_low, h_high, height_step),
            "velocities": _axis_nodes(v_low, v_high, velocity_step)}


def periodogram_task_bytes(n_heights: int, n_velocities: int, n_epochs: int) -> int:
    """Peak bytes of one periodogram call at its smallest batch (one arc), as the kernel
    allocates them (:mod:`depsi.kernels.periodogram`, per-arc h2ph):

    - the shared phasor table ``E_shared`` (T, Ns): built as float64 phases, a complex128
      exponential and its complex64 copy, ``32 Ns T`` at its peak;
    - the node table (Ns, 2) float64 and its meshgrid, ``24 Ns``, and the heights, ``12 Nh``;
    - one arc's height phasors (Nh, T) complex64, ``8 Nh T``, and its grid sums (Nh, Ns)
      complex64 with their float32 moduli, ``12 Nh Ns``.
    """
    n_shared, T = n_velocities, n_epochs
    tables = 32 * n_shared * T + 24 * n_shared + 12 * n_heights
    per_arc = 8 * n_heights * T + 12 * n_heights * n_shared
    return tables + per_arc


def _grid_key(arcs: Any, grid: dict[str, int]) -> str:
    from depsi.processing.arcs import ArcsConfig

    default = arcs_grid(ArcsConfig())
    axis = max(("heights", "velocities"), key=lambda a: grid[a] / default[a])
    name = "height" if axis == "heights" else "velocity"
    return f"arcs.{name}_step" if getattr(arcs, f"{name}_step") else f"arcs.{name}_range"


def _check_arcs(config: Any, n_epochs: int, limit: int, source: str) -> dict[str, Any]:
    grid = arcs_grid(config.arcs)
    nodes = grid["heights"] * grid["velocities"]
    tasks = tasks_per_process(config)
    predicted = tasks * periodogram_task_bytes(grid["heights"], grid["velocities"], n_epochs)
    key = _grid_key(config.arcs, grid)
    shape = f"{grid['heights']} heights x {grid['velocities']} velocities"
    if predicted > MEMORY_FRACTION * limit:
        raise ResourceLimitError(
            f"{key}: the arcs' search grid ({shape} = {nodes} nodes, {n_epochs} epochs) needs "
            f"{predicted} bytes at one arc per batch and {tasks} tasks at once; expected at "
            f"most {int(MEMORY_FRACTION * limit)} bytes ({MEMORY_FRACTION:.0%} of {limit}, "
            f"{source})")
    if nodes > MAX_GRID_NODES:
        raise ResourceLimitError(
            f"{key}: expected a search grid of at most {MAX_GRID_NODES} nodes, found {shape} "
            f"= {nodes} nodes ({predicted} bytes per batch of one arc and {tasks} tasks)")
    return {"grid_nodes": nodes, **grid, "bytes": predicted}


def _store_arrays(path: Path) -> list[dict[str, Any]]:
    """Shape, itemsize and dimension names of each array of a Zarr v2 or v3 store (metadata
    only; the root and its direct children)."""
    arrays = []
    folders = [path] + sorted(p for p in path.iterdir() if p.is_dir())
    for folder in folders:
        v2, v3 = folder / ".zarray", folder / "zarr.json"
        try:
            if v3.is_file():
                meta = json.loads(v3.read_bytes()[:2**20])
                if meta.get("node_type") != "array":
                    continue
                dtype, dims = meta.get("data_type"), meta.get("dimension_names")
            elif v2.is_file():
                meta = json.loads(v2.read_bytes()[:2**20])
                dtype = meta.get("dtype")
                attrs = folder / ".zattrs"
                dims = (json.loads(attrs.read_bytes()[:2**20]).get("_ARRAY_DIMENSIONS")
                        if attrs.is_file() else None)
            else:
                continue
            shape = [int(n) for n in meta.get("shape", [])]
        except (ValueError, TypeError, AttributeError):
            continue  # malformed metadata: the reader names it
        try:
            itemsize = np.dtype(dtype).itemsize
        except TypeError:
            itemsize = 8
        arrays.append({"name": folder.name, "shape": shape, "itemsize": itemsize,
                       "dims": dims})
    return arrays


def claimed_vs_stored(path: str | os.PathLike) -> tuple[int, int]:
    """Bytes a Zarr store's metadata claim (every array, uncompressed) and bytes its files hold.

    Examples
    --------
    >>> import tempfile, zarr
    >>> store = Path(tempfile.mkdtemp()) / "s.zarr"
    >>> _ = zarr.create_array(store, shape=(10**6, 10**6), chunks=(1000, 1000), dtype="f4")
    >>> claimed, stored = claimed_vs_stored(store)
    >>> claimed, stored < 10**4
    (4000000000000, True)
    """
    path = Path(path)
    claimed = sum(math.prod(a["shape"]) * a["itemsize"] for a in _store_arrays(path))
    stored = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                stored += os.stat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return int(claimed), int(stored)


def _store_epochs(path: Path) -> int | None:
    for array in _store_arrays(path):
        if array["dims"] and "time" in array["dims"]:
            return array["shape"][list(array["dims"]).index("time")]
    return None


def _check_store(path: Path) -> dict[str, Any]:
    claimed, stored = claimed_vs_stored(path)
    if claimed > max(MAX_CLAIMED_TO_STORED * stored, MIN_CLAIMED_BYTES_CHECKED):
        raise ResourceLimitError(
            f"input.path '{path}': its metadata claim {claimed} bytes of arrays, its files hold "
            f"{stored} bytes; expected at most {MAX_CLAIMED_TO_STORED} times the stored bytes")
    return {"claimed_bytes": claimed, "stored_bytes": stored}


def _free_disk(folder: Path) -> int:
    folder = folder.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return int(shutil.disk_usage(folder).free)


def check_disk(config: Any, steps: Collection[str]) -> dict[str, Any]:
    """Refuse a run whose ``steps`` (those that will write their products) would not fit the
    free space of the workspace's file system.

    Only the stack step's product is predicted (a simulated stack, from the configuration
    alone): the later products are small beside it. A resume that skips the finished stack is
    therefore never refused for it.

    Returns
    -------
    dict
        ``disk_bytes`` (predicted) and ``free_disk_bytes``; empty when nothing is predicted.

    Raises
    ------
    ResourceLimitError
        Naming the key, the predicted bytes and the free bytes.
    """
    if "stack" not in steps or config.input.format != "simulated":
        return {}
    return _check_simulated(config)


def _check_simulated(config: Any) -> dict[str, Any]:
    sim = config.input.simulate
    rows, cols = sim.shape
    disk = rows * cols * sim.n_epochs * SIMULATED_BYTES_PER_PIXEL_EPOCH
    free = _free_disk(Path(config.output.workspace))
    if disk > free:
        raise ResourceLimitError(
            f"input.simulate.shape: a simulated stack of {rows} x {cols} pixels and "
            f"{sim.n_epochs} epochs needs {disk} bytes on disk; expected at most the {free} "
            f"bytes free under '{config.output.workspace}'")
    return {"disk_bytes": disk, "free_disk_bytes": free}


def _check_selection(config: Any, block: tuple[int, int], n_epochs: int, limit: int,
                     source: str, key: str) -> int:
    tasks = tasks_per_process(config)
    predicted = tasks * block[0] * block[1] * n_epochs * SELECTION_BYTES_PER_PIXEL_EPOCH
    if predicted > MEMORY_FRACTION * limit:
        raise ResourceLimitError(
            f"{key}: selection blocks of {block[0]} x {block[1]} pixels and {n_epochs} epochs, "
            f"{tasks} at once, need {predicted} bytes; expected at most "
            f"{int(MEMORY_FRACTION * limit)} bytes ({MEMORY_FRACTION:.0%} of {limit}, {source})")
    return predicted


#: Space chunks of the point products take at most this fraction of a worker's memory limit:
#: the chain's per-chunk temporaries (densification) are far larger than the chunk itself.
CHUNK_FRACTION_OF_WORKER_MEMORY = 1 / 256


def point_chunk_bytes(config: Any) -> int:
    """Target bytes per space chunk of ``ps.zarr`` and ``stm.zarr`` for the configured workers.

    :data:`~depsi.io.store.DEFAULT_CHUNK_BYTES`, or less when the workers have a memory limit
    (``local``: ``memory_limit``; ``slurm``: memory per job / processes), so that each task of the
    chain fits in a worker (:data:`CHUNK_FRACTION_OF_WORKER_MEMORY`).
    """
    from dask.utils import parse_bytes

    from depsi.io.store import DEFAULT_CHUNK_BYTES

    compute = config.compute
    limit = None
    if compute.scheduler == "local" and compute.memory_limit not in (None, "auto"):
        limit = parse_bytes(compute.memory_limit)
    elif compute.scheduler == "slurm":
        limit = parse_bytes(compute.slurm.memory) // compute.slurm.processes
    if limit is None:
        return DEFAULT_CHUNK_BYTES
    return int(max(2**18, min(DEFAULT_CHUNK_BYTES, limit * CHUNK_FRACTION_OF_WORKER_MEMORY)))

def check_feasible(config: Any, *, memory_bytes: int | None = None,
                   steps: Collection[str] | None = None) -> dict[str, Any]:
    """Predict the memory of the run's largest allocations and refuse what cannot fit.

    Parameters
    ----------
    config
        The validated :class:`~depsi.pipeline.config.PipelineConfig`.
    memory_bytes
        Memory of one worker process; default from ``compute`` (SLURM memory per process, a
        local ``memory_limit``) or the machine's available memory (psutil).
    steps
        The steps that will write their products, for the disk (:func:`check_disk`); default
        every step. A resume passes none and checks the disk once it knows which it redoes.

    Returns
    -------
    dict
        The predictions: ``arcs`` (grid nodes per axis, bytes), ``selection_bytes``,
        ``point_chunk_bytes``, ``memory_limit`` and, per input, ``store`` or ``simulated``.

    Raises
    ------
    ResourceLimitError
        Naming the key (``arcs.height_step``, ``compute.threads``, ...), the predicted bytes
        or count, and the limit.
    StackConfigError
        A temporal model the input's epochs cannot determine, when they are known before the
        stack is read (:func:`check_model`).
    """

    _check_counts(config)
    if memory_bytes is None:
        limit, source = memory_per_process(config)
    else:
        limit, source = int(memory_bytes), "memory_bytes"
    report: dict[str, Any] = {"memory_limit": limit, "memory_source": source}
    n_epochs, block, block_key = ASSUMED_EPOCHS, None, "input.path"
    if config.input.format == "simulated":
        sim = config.input.simulate
        n_epochs = sim.n_epochs
        disk = check_disk(config, ("stack",) if steps is None else steps)
        if disk:
            report["simulated"] = disk
        if sim.chunks is not None:
            # chunks larger than the scene are clipped to it by Zarr
            block = (min(sim.chunks[0], sim.shape[0]), min(sim.chunks[1], sim.shape[1]))
            block_key = "input.simulate.chunks"
    elif config.input.format == "zarr" and Path(config.input.path).is_dir():
        report["store"] = _check_store(Path(config.input.path))
        n_epochs = _store_epochs(Path(config.input.path)) or ASSUMED_EPOCHS
    report["arcs"] = _check_arcs(config, n_epochs, limit, source)
    if block is not None:
        report["selection_bytes"] = _check_selection(config, block, n_epochs, limit, source,
                                                     block_key)
    chunk = point_chunk_bytes(config)
    if chunk > MEMORY_FRACTION * limit:
        raise ResourceLimitError(
            f"compute: point chunks of {chunk} bytes; expected at most "
            f"{int(MEMORY_FRACTION * limit)} bytes ({source})")
    report["point_chunk_bytes"] = chunk
    report["model"] = check_model(config)
    shape = known_shape(config)
    if shape is not None:
        check_ds_window(config, shape)
    logger.info("preflight: arcs grid %d nodes (%d bytes), memory limit %d bytes (%s)",
                report["arcs"]["grid_nodes"], report["arcs"]["bytes"], limit, source)
    return report


# ---------------------------------------------------------------- can the stack support PS?
class StackSupportError(BadInputError, ValueError):
    """A stack that cannot support the PS method (too few epochs); names the epochs, the span
    and the minimum. A ``ValueError``: bad input (exit code 2), not a resource limit."""


#: Parameters of the arcs' model per arc (:mod:`depsi.processing.arcs`): the periodogram fits
#: a velocity and a height-error difference, and its modulus absorbs a constant phase offset.
ARC_MODEL_PARAMETERS = ("offset", "velocity", "height_error")

#: Fewest epochs refused outright: one more phase observation than the arcs' model has
#: parameters, so that the fit is over-determined and its ensemble coherence tests something
#: (with as many observations as parameters every arc fits perfectly, whatever its noise).
MIN_EPOCHS = len(ARC_MODEL_PARAMETERS) + 1

#: Epochs below which amplitude-dispersion selection is warned about. Ferretti, Prati & Rocca
#: (2001, "Permanent scatterers in SAR interferometry", IEEE TGRS 39(1), 8-20, sec. IV) use the
#: dispersion D_A = sigma_A / m_A as a proxy of the phase std only over a large number of
#: images; the PSI literature puts the floor at about 20 (Crosetto et al. 2016, "Persistent
#: Scatterer Interferometry: a review", ISPRS J. Photogramm. 115, 78-89).
NAD_GUIDANCE_EPOCHS = 20

#: Nominal phase noise of an arc or of a point against the reference (rad), for the predicted
#: precisions: a PS at the selection threshold D_A = 0.25 has a phase std of about D_A
#: (Ferretti et al. 2001), an arc of two such points sqrt(2) x 0.25 = 0.35 rad, and residual
#: atmosphere over an arc adds as much again: 0.5 rad, an ensemble coherence of
#: exp(-0.5**2 / 2) = 0.88, a good PS.
NOMINAL_PHASE_STD = 0.5

#: Predicted velocity std (m/yr) above which the stack is warned about: PSI stacks of a few
#: years reach 1-2 mm/yr (Crosetto et al. 2016); above 2 mm/yr typical subsidence rates of a
#: few mm/yr cannot be told from zero at two standard deviations.
MAX_VELOCITY_STD = 0.002

#: Predicted height-error std (m) above which the height cannot be resolved: a tenth of the
#: arcs' default search range (+-50 m); the height term then only adds noise to the velocity.
MAX_HEIGHT_STD = 10.0


def _regressor_residual(column: np.ndarray, others: list[np.ndarray]) -> np.ndarray:
    """``column`` minus its least-squares fit on ``others``: its part the others cannot take."""
    basis = np.column_stack(others)
    coefficients = np.linalg.lstsq(basis, column, rcond=None)[0]
    return column - basis @ coefficients


def _centre_h2ph(stack: Any) -> tuple[np.ndarray | None, str]:
    """h2ph per epoch at the scene centre (one chunk read, or none where the stack's check
    decoded that chunk already and handed it over to the selection:
    :func:`depsi.io.prefetch.handed_over_pixel`) and where it was taken."""
    from depsi.io.prefetch import handed_over_pixel

    if "h2ph" not in stack.data_vars:
        return None, "no h2ph"
    h2ph = stack["h2ph"]
    centre = {dim: stack.sizes[dim] // 2 for dim in ("azimuth", "range") if dim in h2ph.dims}
    handed = None
    if h2ph.dims == ("azimuth", "range", "time"):
        handed = handed_over_pixel(h2ph.data, centre["azimuth"], centre["range"])
    values = np.asarray(h2ph.isel(centre).values if handed is None else handed,
                        dtype=np.float64).reshape(-1)
    where = ", ".join(f"{dim} {index}" for dim, index in centre.items()) or "every pixel"
    return values, where


def predicted_precision(years: np.ndarray, h2ph: np.ndarray | None, wavelength: float, *,
                        phase_std: float = NOMINAL_PHASE_STD) -> dict[str, float]:
    """Least-squares std of velocity (m/yr) and height error (m) of one point or arc.

    The design is ``[1, t, h2ph]`` in phase, ``m2ph * (offset + v t + h2ph H)``, with equal
    noise ``phase_std`` on every epoch (the offset takes the mother's noise), so each std is
    ``phase_std / |m2ph| / |r|`` with ``r`` the part of that column the other columns cannot
    fit (Frisch-Waugh): for velocity ``r = t - mean t`` when h2ph is dropped. Without h2ph (or
    with one that does not vary) the height std is infinite and velocity is fitted on
    ``[1, t]``.

    Examples
    --------
    >>> t = np.arange(30) * 12 / 365.25
    >>> round(predicted_precision(t, None, 0.0555)["velocity_std"] * 1000, 2)  # mm/yr
    1.42
    """
    from depsi.conventions import phase_per_metre

    scale = phase_std / abs(phase_per_metre(wavelength))
    ones, t = np.ones_like(years), np.asarray(years, dtype=np.float64)
    height_norm = 0.0
    if h2ph is not None and np.ptp(h2ph) > 0:
        height_norm = float(np.linalg.norm(_regressor_residual(h2ph, [ones, t])))
    resolvable = height_norm > 0
    time_residual = _regressor_residual(
        t, [ones, h2ph] if resolvable and h2ph is not None else [ones])
    return {"velocity_std": scale / float(np.linalg.norm(time_residual)),
            "height_std": scale / height_norm if resolvable else math.inf}


def _refuse_short(n_epochs: int, span: str, config: Any) -> None:
    if n_epochs < MIN_EPOCHS:
        raise StackSupportError(
            f"input: {n_epochs} epochs{span} cannot support the PS method: expected at least "
            f"{MIN_EPOCHS} epochs, since the arcs' model has {len(ARC_MODEL_PARAMETERS)} "
            f"parameters per arc ({', '.join(ARC_MODEL_PARAMETERS)}) and needs more phase "
            f"observations than that to test a fit; amplitude-dispersion selection "
            f"(selection.method {config.selection.method!r}) needs about "
            f"{NAD_GUIDANCE_EPOCHS} (Ferretti et al. 2001)")


def check_stack_support(stack: Any, config: Any) -> dict[str, Any]:
    """Whether the stack's epochs can support the PS method: refuse too few, warn of weak ones.

    Called when the stack is opened, before selection. Refuses fewer than :data:`MIN_EPOCHS`
    epochs; warns (``logging``) below :data:`NAD_GUIDANCE_EPOCHS` epochs (amplitude dispersion
    an unreliable proxy of phase stability), when the predicted velocity std
    (:func:`predicted_precision`, :data:`NOMINAL_PHASE_STD`, the h2ph of the scene centre)
    exceeds :data:`MAX_VELOCITY_STD`, and when the height error cannot be resolved (its
    predicted std above :data:`MAX_HEIGHT_STD`, or h2ph not varying).

    Parameters
    ----------
    stack
        The opened SLC stack ``(azimuth, range, time)`` with ``h2ph`` and ``wavelength`` in
        attrs; one chunk of h2ph is read.
    config
        The :class:`~depsi.pipeline.config.PipelineConfig` (its selection method is named).

    Returns
    -------
    dict
        ``epochs``, ``span_days``, ``velocity_std`` (m/yr, None without a wavelength),
        ``height_std`` (m, None when not resolvable), ``drop_height`` (the height term should be
        dropped) and ``warnings`` (the messages logged).

    Raises
    ------
    StackSupportError
        Fewer than :data:`MIN_EPOCHS` epochs, naming them, the span and the minimum.

    Examples
    --------
    >>> from depsi.pipeline.config import PipelineConfig
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(20, 20), n_epochs=30, seed=1)
    >>> check_stack_support(stack, PipelineConfig())["warnings"]
    []
    """
    from depsi.conventions import years_since

    times = np.asarray(stack["time"].values)
    n_epochs = int(times.size)
    span_days = (float((times[-1] - times[0]) / np.timedelta64(1, "D"))
                 if n_epochs and times.dtype.kind == "M" else 0.0)
    dates = (f" ({np.datetime_as_string(times[0], 'D')} to "
             f"{np.datetime_as_string(times[-1], 'D')}, {span_days:.0f} days)"
             if n_epochs and times.dtype.kind == "M" else "")
    _refuse_short(n_epochs, dates, config)
    report: dict[str, Any] = {"epochs": n_epochs, "span_days": round(span_days, 1),
                              "velocity_std": None, "height_std": None, "drop_height": False,
                              "warnings": []}
    if n_epochs < NAD_GUIDANCE_EPOCHS:
        report["warnings"].append(
            f"input: {n_epochs} epochs{dates}: amplitude-dispersion selection (selection."
            f"method {config.selection.method!r}) is unreliable below about "
            f"{NAD_GUIDANCE_EPOCHS} epochs (Ferretti et al. 2001): the dispersion of "
            f"{n_epochs} amplitudes is a weak proxy of phase stability, expect candidates "
            "that are not stable")
    wavelength = stack.attrs.get("wavelength")
    if wavelength is not None and times.dtype.kind == "M":
        h2ph, where = _centre_h2ph(stack)
        precision = predicted_precision(years_since(times, times[0]), h2ph, float(wavelength))
        report["velocity_std"] = precision["velocity_std"]
        _warn_precision(report, precision, n_epochs, dates, where, h2ph,
                        no_baselines=bool(stack.attrs.get("no_baselines")))
    else:
        logger.info("stack support: no wavelength or dates, precision not predicted")
    for message in report["warnings"]:
        logger.warning("%s", message)
    return report


def _warn_precision(report: dict[str, Any], precision: dict[str, float], n_epochs: int,
                    dates: str, where: str, h2ph: np.ndarray | None, *,
                    no_baselines: bool = False) -> None:
    velocity_mm = precision["velocity_std"] * 1000
    if precision["velocity_std"] > MAX_VELOCITY_STD:
        report["warnings"].append(
            f"input: {n_epochs} epochs{dates}: predicted velocity std {velocity_mm:.1f} mm/yr "
            f"(phase noise {NOMINAL_PHASE_STD} rad; expected at most "
            f"{MAX_VELOCITY_STD * 1000:.1f} mm/yr): velocities smaller than about "
            f"{2 * velocity_mm:.0f} mm/yr (two std) cannot be resolved from zero; a longer "
            "time span or more epochs are needed")
    height_std = precision["height_std"]
    if math.isfinite(height_std) and height_std <= MAX_HEIGHT_STD:
        report["height_std"] = height_std
        return
    report["drop_height"] = True
    if no_baselines:  # the stack step has said so, and every step leaves the height out
        return
    if math.isfinite(height_std) and h2ph is not None:
        report["height_std"] = height_std
        spread = f"an h2ph spread of {np.ptp(h2ph):.2e} m/m at the scene centre ({where})"
        found = f"gives a predicted height-error std of {height_std:.1f} m (expected at most " \
                f"{MAX_HEIGHT_STD:.0f} m)"
    else:
        spread = (f"h2ph at the scene centre ({where})" if h2ph is not None else "no h2ph")
        found = "does not vary over the epochs"
    report["warnings"].append(
        f"input: {spread} {found}: height errors cannot be resolved and the height term "
        "should be dropped (not done automatically)")


# ------------------------------------------------------------- can the epochs fit the model?
class StackConfigError(BadInputError, ValueError):
    """A configuration the stack cannot support: a temporal model its epochs cannot determine
    (more unknowns than epochs, a step or breakpoint without epochs on both sides) or a DS
    window larger than its scene; names the key, the value and the epochs or the scene. A
    ``ValueError``: bad input (exit code 2)."""


def model_unknowns(model: Any) -> dict[str, int]:
    """Unknowns per point of ``model`` (a :class:`~depsi.processing.motion_models.ModelConfig`):
    the linear model's and each term's columns, in order.

    Examples
    --------
    >>> from depsi.processing.motion_models import ModelConfig
    >>> model_unknowns(ModelConfig(terms=["seasonal", "step"], step_dates=["2021-05-01"]))
    {'offset': 1, 'velocity': 1, 'height_error': 1, 'seasonal': 2, 'step': 1}
    """
    counts = {name: 1 for name in ARC_MODEL_PARAMETERS}
    columns = {"seasonal": 2, "semi_annual": 2, "thermal": 1,
               "step": len(model.step_dates), "breakpoint": len(model.breakpoint_dates)}
    counts.update({term: columns[term] for term in model.terms})
    return counts


def _day(text: str) -> np.datetime64:
    return np.datetime64(text, "D")


def _refuse_dates(key: str, dates: list[str], first: np.datetime64, last: np.datetime64,
                  *, inside_last: bool) -> None:
    """A date of ``key`` without epochs on both sides: a step needs one before its date and
    one on or after it; a breakpoint one before it and one after it."""
    for text in dates:
        day = _day(text)
        if day <= first:
            side = f"no epoch before it (the first epoch is {first})"
        elif day > last or (day == last and not inside_last):
            side = f"no epoch {'on or ' if inside_last else ''}after it (the last epoch is {last})"
        else:
            continue
        effect = ("changes the velocity at no epoch or at every epoch alike, which the "
                  "velocity itself takes" if key.endswith("breakpoint_dates") else
                  "is the same at every epoch, which the offset itself takes")
        where = ("after the first epoch and on or before the last" if inside_last
                 else "strictly between the first and the last epoch")
        raise StackConfigError(f"{key}: {text} has {side}; expected a date {where} "
                                f"({first} to {last}): there it {effect}")


def _refuse_twin_steps(dates: list[str], time: np.ndarray) -> None:
    """Two step dates with no epoch between them: their columns are the same."""
    split: dict[int, str] = {}
    for text in sorted(dates):
        index = int(np.searchsorted(time, _day(text)))
        if index in split:
            raise StackConfigError(
                f"model.step_dates: {split[index]} and {text} have no epoch between them; "
                f"expected at least one epoch between two steps (the epochs before are to "
                f"{time[index - 1]}, after from {time[index]}): their steps cannot be told "
                "apart")
        split[index] = text


def check_model_support(model: Any, time: np.ndarray) -> dict[str, Any]:
    """Whether the epochs ``time`` can determine the temporal model ``model``: refuse a model
    with as many unknowns per point as epochs or more (the fit of each point and its F tests
    need at least one epoch to spare), a step date with no epoch before it or none on or after
    it, two step dates with no epoch between them, and a breakpoint date at or outside the
    first or last epoch (its column is then the velocity's or zero).

    Parameters
    ----------
    model
        The :class:`~depsi.processing.motion_models.ModelConfig`.
    time
        The stack's epochs (datetime64), sorted.

    Returns
    -------
    dict
        ``unknowns`` (per point) and ``epochs``.

    Raises
    ------
    StackConfigError
        Naming the key (``model.terms``, ``model.step_dates``, ``model.breakpoint_dates``),
        its value and the epochs.

    Examples
    --------
    >>> from depsi.processing.motion_models import ModelConfig
    >>> time = np.datetime64("2021-01-01") + np.arange(6) * np.timedelta64(12, "D")
    >>> check_model_support(ModelConfig(terms=["seasonal"]), time)
    {'unknowns': 5, 'epochs': 6}
    >>> try:
    ...     check_model_support(ModelConfig(terms=["seasonal", "semi_annual"]), time)
    ... except StackConfigError as err:
    ...     print(str(err)[:60])
    model.terms: ['seasonal', 'semi_annual'] make 7 unknowns per
    """
    time = np.sort(np.asarray(time).astype("datetime64[D]"))
    n_epochs = int(time.size)
    counts = model_unknowns(model)
    unknowns = sum(counts.values())
    if n_epochs == 0:
        return {"unknowns": unknowns, "epochs": 0}
    first, last = time[0], time[-1]
    if unknowns >= n_epochs:
        keys = ["model.terms"] + [f"model.{term}_dates" for term in ("step", "breakpoint")
                                  if term in model.terms and counts[term] > 1]
        parts = ", ".join(f"{name} {count}" for name, count in counts.items())
        raise StackConfigError(
            f"{', '.join(keys)}: {list(model.terms)} make {unknowns} unknowns per point "
            f"({parts}) for {n_epochs} epochs ({first} to {last}); expected fewer unknowns "
            "than epochs: each point's fit and its tests need at least one epoch to spare")
    if "step" in model.terms:
        _refuse_dates("model.step_dates", model.step_dates, first, last, inside_last=True)
        _refuse_twin_steps(model.step_dates, time)
    if "breakpoint" in model.terms:
        _refuse_dates("model.breakpoint_dates", model.breakpoint_dates, first, last,
                      inside_last=False)
    return {"unknowns": unknowns, "epochs": n_epochs}


def known_epochs(config: Any) -> np.ndarray | None:
    """The input's epochs when they are known before the stack step: those of a simulated
    stack, or the ``time`` coordinate of a Zarr store; None otherwise."""
    if config.input.format == "simulated":
        from depsi.simulate.scene import DEFAULT_REVISIT_DAYS, DEFAULT_START

        sim = config.input.simulate
        step = np.timedelta64(round(DEFAULT_REVISIT_DAYS * 86400), "s")
        return (np.datetime64(DEFAULT_START, "ns") + np.arange(sim.n_epochs) * step
                ).astype("datetime64[ns]")
    if config.input.format == "zarr" and Path(config.input.path).is_dir():
        import xarray as xr

        try:
            with xr.open_zarr(config.input.path) as store:
                time = np.asarray(store["time"].values)
        except Exception:  # noqa: BLE001 - an unreadable store is the stack step's to name
            return None
        return time if time.dtype.kind == "M" else None
    return None


def check_model(config: Any, time: np.ndarray | None = None) -> dict[str, Any] | None:
    """:func:`check_model_support` of ``config.model`` at the epochs ``time`` (default
    :func:`known_epochs`), then its terms' regressors built there (the temperature file read,
    each column checked to vary); None when the epochs are not known yet."""
    from depsi.processing.motion_models import temporal_model

    if not config.model.terms:
        return None
    if time is None:
        time = known_epochs(config)
    if time is None:
        return None
    report = check_model_support(config.model, time)
    temporal_model(config.model, time)
    return report


# ------------------------------------------------------------ does the DS window fit the scene?
def _ds_may_be_selected(config: Any) -> bool:
    """Whether selection may add distributed scatterers: ``selection.ds.enabled`` true, or
    ``auto`` (which adds them to interferograms, and to any stack whose amplitudes turn out
    not to separate the pixels: known only once they are read, after the checks)."""
    return config.selection.ds.enabled in (True, "auto")


def check_ds_window(config: Any, shape: tuple[int, int]) -> None:
    """Refuse a DS search window (``selection.ds.window``) larger than the scene ``shape``
    (azimuth, range), when selection may add distributed scatterers (``selection.ds.enabled``
    true or ``auto``).

    Examples
    --------
    >>> from depsi.pipeline.config import parse_config
    >>> config = parse_config({"selection": {"ds": {"enabled": True, "window": [11, 51]}}})
    >>> try:
    ...     check_ds_window(config, (40, 40))
    ... except StackConfigError as err:
    ...     print(str(err).split(" (azimuth")[0])
    selection.ds.window: expected at most the scene's 40 x 40 pixels
    """
    window = tuple(int(n) for n in config.selection.ds.window)
    if not _ds_may_be_selected(config):
        return
    if window[0] > shape[0] or window[1] > shape[1]:
        auto = config.selection.ds.enabled == "auto"
        raise StackConfigError(
            f"selection.ds.window: expected at most the scene's {shape[0]} x {shape[1]} "
            f"pixels (azimuth x range), found {list(window)}"
            + (" (selection.ds.enabled: auto may add distributed scatterers once the "
               "amplitudes are read; set it to false to leave them out)" if auto else ""))


def known_shape(config: Any) -> tuple[int, int] | None:
    """The scene's (azimuth, range) when known before the stack step: a simulated stack's, or
    the ``azimuth`` and ``range`` sizes in a Zarr store's metadata; None otherwise."""
    if config.input.format == "simulated":
        return tuple(config.input.simulate.shape)
    if config.input.format == "zarr" and Path(config.input.path).is_dir():
        for array in _store_arrays(Path(config.input.path)):
            dims = list(array["dims"] or ())
            if "azimuth" in dims and "range" in dims:
                return (array["shape"][dims.index("azimuth")], array["shape"][dims.index("range")])
    return None
