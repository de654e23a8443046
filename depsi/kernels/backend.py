"""Where kernels run: the array namespace (NumPy or CuPy), the devices, and batch sizes.

This is the one place that decides between NumPy and CuPy, which devices a computation uses, and how
many items fit in a batch in the memory free at run time (docs/design.md, "Layers" and "Hardware
mapping"). Kernels themselves never choose: they take the namespace of the arrays they are given
(:func:`array_namespace`), so one code path serves both.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
from threadpoolctl import threadpool_limits

logger = logging.getLogger(__name__)

#: Accepted values of ``solver`` wherever a kernel namespace is chosen.
SOLVERS = ("auto", "numpy", "cupy")

#: Fraction of the free memory a batch may take by default (kernels make temporaries that the
#: per-item byte counts only estimate, and other work shares the device).
DEFAULT_SAFETY = 0.5


@dataclass(frozen=True, order=True)
class Device:
    """One device a block of work can run on.

    Parameters
    ----------
    kind
        ``"cpu"`` (NumPy) or ``"cuda"`` (CuPy on the CUDA device ``index``).
    index
        Device number; for ``"cpu"`` it only tells several CPU "devices" apart, which exercises
        the multi-device path on a machine without a GPU.

    Examples
    --------
    >>> Device("cpu", 1)
    Device('cpu:1')
    >>> parse_device("cuda:0").kind
    'cuda'
    """

    kind: Literal["cpu", "cuda"] = "cpu"
    index: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "cuda"):
            raise ValueError(f"Device kind: expected 'cpu' or 'cuda', found {self.kind!r}")
        if int(self.index) < 0:
            raise ValueError(f"Device index: expected >= 0, found {self.index!r}")

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    def __repr__(self) -> str:
        return f"Device({str(self)!r})"


# --------------------------------------------------------------------------------------------
# CuPy availability


@functools.lru_cache(maxsize=1)
def _cupy_status() -> tuple[ModuleType | None, str]:
    """Import CuPy and check that a CUDA device answers; (module or None, reason)."""
    try:
        import cupy
    except Exception as err:  # ImportError, or a broken CUDA install raising at import
        return None, f"CuPy cannot be imported ({type(err).__name__}: {err})"
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:
        return None, f"CuPy finds no working CUDA runtime ({type(err).__name__}: {err})"
    if count < 1:
        return None, "CuPy is installed but no CUDA device is visible"
    try:
        cupy.zeros(1).sum().item()  # compiles and runs a kernel: the driver really works
    except Exception as err:
        return None, f"CuPy cannot run a kernel on the GPU ({type(err).__name__}: {err})"
    return cupy, f"CuPy {cupy.__version__} with {count} CUDA device(s)"


def cupy_available() -> bool:
    """Whether CuPy imports and can run a kernel on a CUDA device.

    Examples
    --------
    >>> isinstance(cupy_available(), bool)
    True
    """
    return _cupy_status()[0] is not None


def _require_cupy() -> ModuleType:
    cupy, reason = _cupy_status()
    if cupy is None:
        raise RuntimeError(f"solver 'cupy' was asked for but cannot be used: {reason}")
    return cupy


def get_namespace(solver: str = "auto") -> ModuleType:
    """The array module (``numpy`` or ``cupy``) for a solver choice.

    Parameters
    ----------
    solver
        ``"numpy"``, ``"cupy"`` or ``"auto"``. ``"cupy"`` where CuPy or a GPU does not work
        raises; only ``"auto"`` falls back to NumPy, and logs which it chose.

    Raises
    ------
    ValueError
        For an unknown solver name.
    RuntimeError
        For ``"cupy"`` when CuPy cannot be imported or no CUDA device works; says why.

    Examples
    --------
    >>> get_namespace("numpy").__name__
    'numpy'
    """
    if solver not in SOLVERS:
        raise ValueError(f"solver: expected one of {SOLVERS}, found {solver!r}")
    if solver == "numpy":
        return np
    if solver == "cupy":
        return _require_cupy()
    cupy, reason = _cupy_status()
    if cupy is not None:
        logger.info("solver 'auto': using CuPy (%s)", reason)
        return cupy
    logger.info("solver 'auto': using NumPy (%s)", reason)
    return np


def is_cupy_array(array: Any) -> bool:
    """Whether ``array`` is a CuPy array (checked without importing CuPy)."""
    return type(array).__module__.split(".")[0] == "cupy"


def array_namespace(*arrays: Any) -> ModuleType:
    """The namespace of the given arrays: ``cupy`` if any is a CuPy array, else ``numpy``.

    Kernels call this on their inputs, so the same code runs on host and device arrays.
    ``None`` entries are ignored.

    Examples
    --------
    >>> array_namespace(np.zeros(3), None).__name__
    'numpy'
    """
    if any(is_cupy_array(a) for a in arrays if a is not None):
        return _require_cupy()
    return np


# --------------------------------------------------------------------------------------------
# Devices

_configured: list[Device] | None = None


#: The device kinds of :func:`parse_device`'s strings, and their other names.
_DEVICE_KINDS: dict[str, Literal["cpu", "cuda"]] = {
    "cpu": "cpu", "cuda": "cuda", "gpu": "cuda", "cupy": "cuda", "numpy": "cpu"}


def parse_device(spec: Device | str | int) -> Device:
    """A :class:`Device` from ``"cpu"``, ``"cpu:1"``, ``"cuda"``, ``"cuda:0"``, ``"gpu:1"`` or an
    integer CUDA index.

    Examples
    --------
    >>> parse_device("cpu")
    Device('cpu:0')
    >>> parse_device(1)
    Device('cuda:1')
    """
    if isinstance(spec, Device):
        return spec
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return Device("cuda", int(spec))
    if not isinstance(spec, str):
        raise TypeError(f"device: expected a Device, a string like 'cuda:0' or an int, "
                        f"found {type(spec).__name__}")
    name, _, index = spec.strip().lower().partition(":")
    kind = _DEVICE_KINDS.get(name)
    if kind is None or (index and not index.isdigit()):
        raise ValueError(f"device: expected 'cpu[:N]' or 'cuda[:N]', found {spec!r}")
    return Device(kind, int(index) if index else 0)


def _check_cuda_devices(devices: Sequence[Device]) -> None:
    cuda = [d for d in devices if d.kind == "cuda"]
    if not cuda:
        return
    cupy = _require_cupy()
    count = int(cupy.cuda.runtime.getDeviceCount())
    missing = [str(d) for d in cuda if d.index >= count]
    if missing:
        raise RuntimeError(f"devices {missing} asked for, but only {count} CUDA device(s) exist")


def _default_devices() -> list[Device]:
    cupy, reason = _cupy_status()
    if cupy is not None:
        count = int(cupy.cuda.runtime.getDeviceCount())
        devices = [Device("cuda", i) for i in range(count)]
    else:
        devices = [Device("cpu", 0)]
    logger.info("devices: %s (%s)", [str(d) for d in devices], reason)
    return devices


def configure_devices(
    devices: Sequence[Device | str | int] | None = None, num_devices: int | None = None
) -> list[Device]:
    """Choose the devices later computations use, and return them.

    Parameters
    ----------
    devices
        Explicit devices, e.g. ``["cuda:0", "cuda:1"]`` or ``["cpu:0", "cpu:1"]`` (several CPU
        "devices" run the multi-device path on the CPU). Mixed CPU and CUDA lists are allowed.
    num_devices
        Use the first ``num_devices`` CUDA devices when CuPy works, else that many CPU devices.
        With neither argument: every CUDA device when CuPy works, else the CPU (logged).

    Raises
    ------
    RuntimeError
        When a CUDA device is asked for and CuPy or that device does not work.
    ValueError
        For both arguments at once, an empty list or ``num_devices < 1``.

    Examples
    --------
    >>> configure_devices(["cpu:0", "cpu:1"])
    [Device('cpu:0'), Device('cpu:1')]
    >>> _ = configure_devices()  # back to the default
    """
    global _configured
    if devices is not None and num_devices is not None:
        raise ValueError("configure_devices: give devices or num_devices, not both")
    if devices is not None:
        chosen = [parse_device(d) for d in devices]
        if not chosen:
            raise ValueError("devices: expected at least one device, found an empty list")
        _check_cuda_devices(chosen)
    elif num_devices is not None:
        if int(num_devices) < 1:
            raise ValueError(f"num_devices: expected >= 1, found {num_devices!r}")
        chosen = [Device("cuda" if cupy_available() else "cpu", i)
                  for i in range(int(num_devices))]
        _check_cuda_devices(chosen)
    else:
        chosen = _default_devices()
    logger.info("configure_devices: using %s", [str(d) for d in chosen])
    _configured = chosen
    return list(chosen)


def get_devices() -> list[Device]:
    """The devices chosen by :func:`configure_devices`, or the default choice if never called.

    Examples
    --------
    >>> all(isinstance(d, Device) for d in get_devices())
    True
    """
    global _configured
    if _configured is None:
        _configured = _default_devices()
    return list(_configured)


class single_threaded_blas(contextlib.ContextDecorator):  # noqa: N801 (used as a function)
    """BLAS at one thread inside the block (or the decorated function), as Dask's distributed
    workers run it (``OPENBLAS_NUM_THREADS=1``): depsi's work is parallel over chunks, one
    thread each, and a multi-threaded BLAS inside every task only oversubscribes the cores.

    Measured on 2 cores shared with another busy process: batched 120 x 120 solves in a worker
    thread took 27.5 s with OpenBLAS's 2 threads (they spin waiting for each other) against
    2.3 s with one, and the PS chain at 10^5 points 112 s against 37 s, results identical.

    The limit is process-wide and is set by the main thread (where scripts, notebooks and
    ``depsi run`` call the steps): OpenBLAS ignores a thread count set from another thread once
    the main thread has set one, so blocks entered from other threads (Dask's tasks, a user's
    threads) leave it as it is. Re-entrant: the outermost block restores the libraries' own
    thread counts. Used by the chain's steps and by :func:`depsi.cluster.scheduler`
    (``threads``; the ``processes`` pool's workers are limited for their whole life).

    Examples
    --------
    >>> from threadpoolctl import threadpool_info
    >>> with single_threaded_blas():
    ...     {info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}
    {1}
    """

    _depth = 0  # blocks the main thread is inside
    _limits: threadpool_limits | None = None

    def __enter__(self) -> single_threaded_blas:
        if threading.current_thread() is threading.main_thread():
            cls = type(self)
            if cls._depth == 0:
                cls._limits = threadpool_limits(limits=1, user_api="blas")
            cls._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is threading.main_thread():
            cls = type(self)
            cls._depth -= 1
            if cls._depth == 0 and cls._limits is not None:
                cls._limits.restore_original_limits()
                cls._limits = None


@contextlib.contextmanager
def use_device(device: Device) -> Iterator[ModuleType]:
    """Make ``device`` current for the block of code and yield its array namespace.

    Examples
    --------
    >>> with use_device(Device("cpu")) as xp:
    ...     xp.__name__
    'numpy'
    """
    if device.kind == "cpu":
        yield np
        return
    cupy = _require_cupy()
    with cupy.cuda.Device(device.index):
        yield cupy


def to_device(array: Any, device: Device | str | None = None) -> Any:
    """Copy ``array`` to ``device`` (no copy when it is already there).

    Examples
    --------
    >>> to_device([1.0, 2.0], "cpu").dtype
    dtype('float64')
    """
    device = parse_device(device) if device is not None else Device("cpu")
    if device.kind == "cpu":
        return to_host(array)
    cupy = _require_cupy()
    with cupy.cuda.Device(device.index):
        return cupy.asarray(array)


def to_host(array: Any) -> np.ndarray:
    """A NumPy array from a NumPy or CuPy array (or anything ``np.asarray`` takes).

    Examples
    --------
    >>> to_host(np.arange(2)).tolist()
    [0, 1]
    """
    if is_cupy_array(array):
        return array.get()
    return np.asarray(array)


# --------------------------------------------------------------------------------------------
# Memory and batch sizes


def _cgroup_free_bytes() -> int | None:
    """Memory left under a cgroup (container) limit, if one is set."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
         "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:
            return None
        return max(int(limit) - usage, 0)
    return None


#: Further caps on the host memory a batch may use, each a callable returning bytes or None
#: (no cap here); the layers above register theirs (:func:`register_host_memory_cap`).
_HOST_MEMORY_CAPS: list[Callable[[], int | None]] = []


def register_host_memory_cap(cap: Callable[[], int | None]) -> None:
    """Have :func:`available_host_memory` also take ``cap()`` into account (once, however often
    registered). This layer knows no scheduler: :mod:`depsi.stm.runtime` registers the room
    left under a Dask worker's memory limit, which a batch sized from the machine's free memory
    would overrun.

    Examples
    --------
    >>> register_host_memory_cap(lambda: None)  # never a cap: the machine's memory as before
    >>> available_host_memory() > 0
    True
    """
    if cap not in _HOST_MEMORY_CAPS:
        _HOST_MEMORY_CAPS.append(cap)


def available_host_memory() -> int:
    """Bytes of RAM available now (psutil, else ``/proc/meminfo``, else ``os.sysconf``), capped by
    a container memory limit when there is one and by the registered caps
    (:func:`register_host_memory_cap`: in a Dask worker, the room under its memory limit).

    Examples
    --------
    >>> available_host_memory() > 0
    True
    """
    import psutil  # a dependency of distributed, so always there

    available = int(psutil.virtual_memory().available)
    caps = [cap for cap in (_cgroup_free_bytes(), *(cap() for cap in _HOST_MEMORY_CAPS))
            if cap is not None]
    return min([available, *caps])


def free_memory(device: Device | str | None = None) -> int:
    """Bytes free on ``device`` now: GPU free memory (plus what CuPy's pool holds unused) or
    available host RAM.

    Examples
    --------
    >>> free_memory("cpu") > 0
    True
    """
    device = parse_device(device) if device is not None else Device("cpu")
    if device.kind == "cpu":
        return available_host_memory()
    cupy = _require_cupy()
    with cupy.cuda.Device(device.index):
        free, _total = cupy.cuda.runtime.memGetInfo()
        pool = cupy.get_default_memory_pool()
        return int(free) + int(pool.free_bytes())


@functools.lru_cache(maxsize=1)
def cpu_cache_bytes() -> int | None:
    """Size in bytes of the CPU's largest (last-level) cache, from sysfs; ``None`` if unknown.

    Examples
    --------
    >>> size = cpu_cache_bytes()
    >>> size is None or size > 0
    True
    """
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            text = (entry / "size").read_text().strip().upper()
        except OSError:
            continue
        factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * factor)
    return max(sizes) if sizes else None


def batch_size(
    bytes_per_item: float,
    device: Device | str | None = None,
    *,
    safety: float = DEFAULT_SAFETY,
    max_items: int | None = None,
    fit_cache: bool = False,
) -> int:
    """How many items of ``bytes_per_item`` fit in ``safety`` times the free memory of ``device``.

    Parameters
    ----------
    bytes_per_item
        Peak bytes one item needs, temporaries included (each kernel documents its figure).
    device
        Where the batch runs; default the CPU.
    safety
        Fraction of the free memory a batch may use.
    max_items
        Upper bound (e.g. the number of items there are).
    fit_cache
        On the CPU, also keep a batch within half the last-level cache (:func:`cpu_cache_bytes`), so
        that a kernel making several passes over a batch reads main memory once. Memory-bound
        kernels run 1.5x to 2x faster so; GPUs ignore this.

    Returns
    -------
    int
        At least 1.

    Examples
    --------
    >>> batch_size(1e3, "cpu", max_items=10)
    10
    """
    if not bytes_per_item > 0:
        raise ValueError(f"bytes_per_item: expected > 0, found {bytes_per_item!r}")
    if not 0 < safety <= 1:
        raise ValueError(f"safety: expected a fraction in (0, 1], found {safety!r}")
    device = parse_device(device) if device is not None else Device("cpu")
    budget = safety * free_memory(device)
    cache_bytes = cpu_cache_bytes() if fit_cache and device.kind == "cpu" else None
    if cache_bytes is not None:
        budget = min(budget, cache_bytes / 2)  # half: the cache also holds the outputs
    items = int(budget // bytes_per_item)
    if max_items is not None:
        items = min(items, int(max_items))
    return max(items, 1)


def device_of(array: Any) -> Device:
    """The device an array lives on.

    Examples
    --------
    >>> device_of(np.zeros(1))
    Device('cpu:0')
    """
    if is_cupy_array(array):
        return Device("cuda", int(array.device.id))
    return Device("cpu", 0)


def resolve_devices(devices: Sequence[Device | str | int] | None = None) -> list[Device]:
    """The devices a step spreads its space chunks over: ``devices`` when given (checked
    before any work), else those of :func:`configure_devices` (:func:`get_devices`).

    Examples
    --------
    >>> resolve_devices(["cpu:0", "cpu:1"])
    [Device('cpu:0'), Device('cpu:1')]
    """
    if devices is None:
        return get_devices()
    chosen = [parse_device(d) for d in devices]
    if not chosen:
        raise ValueError("devices: expected at least one device, found an empty list")
    _check_cuda_devices(chosen)
    return chosen


def cuda_devices(devices: Sequence[Device | str | int] | None = None) -> list[Device]:
    """The CUDA devices among :func:`resolve_devices`'s (checked before any work): where the
    steps that are one computation over the scene (the network's search and solve, the
    kriging) take their device path; none, the host's reference path.

    Examples
    --------
    >>> cuda_devices(["cpu:0", "cpu:1"])
    []
    """
    return [device for device in resolve_devices(devices) if device.kind == "cuda"]


def chunk_device(devices: Sequence[Device], chunk_index: int) -> Device:
    """The device of chunk ``chunk_index``: round-robin over ``devices``, the same assignment
    for every step (docs/design.md, "Hardware mapping").

    Examples
    --------
    >>> chunk_device([Device("cpu", 0), Device("cpu", 1)], 3)
    Device('cpu:1')
    """
    return devices[int(chunk_index) % len(devices)]


def chunk_starts(sizes: Sequence[int]) -> tuple[int, ...]:
    """Position of the first item of each chunk, from the chunk sizes (Dask's ``chunks``).

    Examples
    --------
    >>> chunk_starts((100, 150, 30))
    (0, 100, 250)
    """
    return tuple(int(start) for start in np.cumsum((0, *sizes))[:-1])


def chunk_index(chunk_starts: Sequence[int], first_position: int) -> int:
    """Index of the chunk that begins at or before ``first_position`` (chunk starts sorted).

    Examples
    --------
    >>> chunk_index([0, 100, 250], 100), chunk_index([0, 100, 250], 260)
    (1, 2)
    """
    return int(np.searchsorted(np.asarray(chunk_starts), first_position, side="right")) - 1

