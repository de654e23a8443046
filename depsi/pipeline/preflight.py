"""Before any step runs: refuse a configuration whose work cannot fit the machine.

:func:`check_feasible` predicts the memory of the arcs' periodogram grid, of the selection's
blocks and of the point chunks from the configuration alone (and a Zarr store's metadata),
and refuses, naming the key, the predicted bytes and the limit, what would otherwise be
OOM-killed hours later; it also refuses absurd worker and thread counts, simulated scenes
larger than the disk, and stores whose metadata claim far more pixels than their files hold.

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
from pathlib import Path
from typing import Any

import numpy as np

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

#: A Zarr store may claim this many times the bytes its files hold (compression of noisy SAR
#: phase is under 2x; an all-fill array is not stored at all, so the ratio is generous)...
MAX_CLAIMED_TO_STORED = 1000
#: ... once it claims more than this many bytes (small stores are not worth refusing).
MIN_CLAIMED_BYTES_CHECKED = 1 * 2**30


class ResourceLimitError(ValueError):
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
    return {"heights": _axis_nodes(*arcs.height_range, height_step),
            "velocities": _axis_nodes(*arcs.velocity_range, velocity_step)}


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


def _check_simulated(config: Any, limit: int, source: str) -> dict[str, Any]:
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

def check_feasible(config: Any, *, memory_bytes: int | None = None) -> dict[str, Any]:
    """Predict the memory of the run's largest allocations and refuse what cannot fit.

    Parameters
    ----------
    config
        The validated :class:`~depsi.pipeline.config.PipelineConfig`.
    memory_bytes
        Memory of one worker process; default from ``compute`` (SLURM memory per process, a
        local ``memory_limit``) or the machine's available memory (psutil).

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
        report["simulated"] = _check_simulated(config, limit, source)
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
    logger.info("preflight: arcs grid %d nodes (%d bytes), memory limit %d bytes (%s)",
                report["arcs"]["grid_nodes"], report["arcs"]["bytes"], limit, source)
    return report
