"""Schedulers for depsi's Dask graphs: one context manager, :func:`scheduler`, gives the
computation inside it synchronous, threaded, multi-process, LocalCluster or SLURMCluster
execution, and closes every pool, cluster, client and job on the way out (success, error or
Ctrl-C). The same graph gives the same numbers on each (docs/design.md, "Hardware mapping").

The ``compute`` section of the configuration (:class:`ComputeConfig`, with
:class:`SlurmConfig` and :class:`AdaptiveConfig`) is defined here, beside the schedulers it
describes; :mod:`depsi.pipeline.config` composes it into the whole configuration.

Examples
--------
>>> import dask.array as da
>>> from depsi.cluster import scheduler
>>> with scheduler({"scheduler": "synchronous"}) as running:
...     total = da.ones((100, 100), chunks=50).sum().compute()
>>> running.name, float(total)
('synchronous', 10000.0)
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import dask
from pydantic import Field, field_validator, model_validator

from depsi.errors import ResourceError
from depsi.kernels.backend import single_threaded_blas
from depsi.sections import Section, check_bytes
from depsi.stm.runtime import HUGEPAGE_VARIABLE, tune_memory

logger = logging.getLogger(__name__)

#: Seconds to wait, after closing a SLURMCluster, for its cancelled jobs to leave ``squeue``.
SLURM_DRAIN_TIMEOUT_S = 15.0

#: Schedulers :func:`scheduler` offers.
SCHEDULERS = ("synchronous", "threads", "processes", "local", "slurm")

#: Smallest ``compute.memory_limit`` of a local worker (bytes): a Dask worker process takes
#: about 150 MB with nothing loaded, so below this it is paused or killed at its first task.
MIN_MEMORY_LIMIT = 256 * 2**20

_WALLTIME = re.compile(r"^(\d+-)?\d{1,3}:\d{2}(:\d{2})?$|^\d+$")
_SLURM_NAME = re.compile(r"^[\w.,:+@=/-]+$")


# ------------------------------------------------------------------ the compute configuration
class AdaptiveConfig(Section):
    """Adaptive scaling: SLURM worker jobs are submitted and cancelled with the load."""

    minimum: int = Field(0, ge=0, description="Fewest worker jobs kept.")
    maximum: int = Field(4, ge=1, description="Most worker jobs at once.")

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveConfig:
        if self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum} is larger than maximum {self.maximum}")
        return self


class SlurmConfig(Section):
    """Worker jobs of a dask-jobqueue SLURMCluster (scheduler 'slurm')."""

    queue: str | None = Field(None, description="Partition (sbatch -p); null: the default.")
    account: str | None = Field(None, description="Account charged (sbatch -A); null: none.")
    cores: int = Field(1, ge=1, description="Cores per worker job.")
    processes: int = Field(1, ge=1, description="Dask worker processes per job (cores are "
                                                "split between them).")
    memory: str = Field("4GB", description="Memory per worker job, e.g. 4GB or 16GiB.")
    walltime: str = Field("01:00:00", description="Time limit per worker job, [D-]HH:MM:SS.")
    driver_memory: str | None = Field(
        None, description="Memory of the driver job that `depsi slurm-script` writes (it holds "
                          "the graph and gathered results, not the data); null: `memory`.")
    driver_walltime: str | None = Field(
        None, description="Time limit of that driver job: it must cover the whole run, while "
                          "worker jobs may be replaced; null: `walltime`.")
    job_directives: list[str] = Field(
        [], description="Extra #SBATCH lines, e.g. ['--constraint=amd', '--qos=short'].")
    job_script_prologue: list[str] = Field(
        [], description="Shell lines run before the worker starts, e.g. "
                        "['module load cuda', 'source venv/bin/activate'].")
    gpus_per_job: int = Field(0, ge=0, description="GPUs per worker job (--gres=gpu:N).")
    jobs: int = Field(1, ge=1, description="Fixed number of worker jobs (ignored with "
                                           "adaptive).")
    adaptive: AdaptiveConfig | None = Field(
        None, description="Adaptive scaling between minimum and maximum jobs; null: fixed "
                          "scaling with 'jobs'.")
    interface: str | None = Field(
        None, description="Network interface of scheduler and workers, e.g. ib0, or lo on a "
                          "one-node test cluster; null: the host's address.")
    local_directory: str | None = Field(
        None, description="Node-local scratch folder for worker spill files; null: $TMPDIR "
                          "or /tmp.")
    log_directory: str | None = Field(
        None, description="Folder for the worker jobs' SLURM output files; null: the folder "
                          "the run was started in.")

    @field_validator("queue", "account", "interface")
    @classmethod
    def _slurm_name(cls, name: str | None) -> str | None:
        if name is not None and not _SLURM_NAME.match(name):
            raise ValueError(f"expected a name of letters, digits and . , : + @ = / - _, "
                             f"found {name[:60]!r}")
        return name

    @field_validator("memory", "driver_memory")
    @classmethod
    def _memory(cls, memory: str | None) -> str | None:
        return None if memory is None else check_bytes(memory, allow_auto=False)

    @field_validator("walltime", "driver_walltime")
    @classmethod
    def _walltime(cls, walltime: str | None) -> str | None:
        if walltime is None:
            return None
        if not _WALLTIME.match(walltime):
            raise ValueError(f"expected [D-]HH:MM:SS such as '01:30:00', got {walltime!r}")
        return walltime

    @model_validator(mode="after")
    def _scaling(self) -> SlurmConfig:
        if self.cores % self.processes:
            raise ValueError(f"cores {self.cores} is not a multiple of processes "
                             f"{self.processes}")
        return self


class ComputeConfig(Section):
    """Where and how the computation runs (see docs/hpc.md)."""

    scheduler: Literal["synchronous", "threads", "processes", "local", "slurm"] = Field(
        "threads", description="synchronous (debugging), threads, processes, local (a "
                               "distributed LocalCluster) or slurm (a SLURMCluster).")
    workers: int | None = Field(
        None, ge=1, description="Worker processes for processes/local; null: one per core "
                                "(local: chosen by Dask).")
    threads: int | None = Field(
        None, ge=1, description="Threads for threads, or per worker for local; null: chosen "
                                "by Dask.")
    memory_limit: str | None = Field(
        "auto", description="Memory per local worker (e.g. 2GB); auto: the machine's memory "
                            "split between workers; null: no limit.")
    worker_timeout: float = Field(
        120.0, gt=0, description="Seconds to wait for local or SLURM workers to start before "
                                 "failing.")
    devices: list[int | str] | None = Field(
        None, description="Devices every step spreads its chunks over, round-robin: CUDA "
                          "indices or names, e.g. [0, 1] or ['cuda:0', 'cpu']; null: every "
                          "CUDA device found, else the CPU.")
    slurm: SlurmConfig = Field(
        default_factory=SlurmConfig, description="SLURM worker jobs (scheduler slurm only).")

    @field_validator("memory_limit")
    @classmethod
    def _memory_limit(cls, memory_limit: str | None) -> str | None:
        from dask.utils import parse_bytes

        check_bytes(memory_limit)
        if memory_limit not in (None, "auto"):
            size = int(parse_bytes(memory_limit))
            if size < MIN_MEMORY_LIMIT:
                raise ValueError(f"expected at least {MIN_MEMORY_LIMIT} bytes (256 MiB: a "
                                 f"worker process alone takes about 150 MB) or auto or null, "
                                 f"found {memory_limit!r} ({size} byte{'s' if size != 1 else ''})")
        return memory_limit


class SchedulerStartError(ResourceError, RuntimeError):
    """The chosen scheduler could not start (e.g. workers did not come up in time)."""

    heading = "the scheduler did not start"
    advice = "check compute.scheduler and the cluster (queue, compute.worker_timeout)"


@dataclass(frozen=True)
class RunningScheduler:
    """What :func:`scheduler` yields: the scheduler in use and, for clusters, its client.

    Attributes
    ----------
    name
        One of ``synchronous``, ``threads``, ``processes``, ``local``, ``slurm``.
    description
        One line for logs and run summaries (workers, threads, memory, dashboard).
    client
        The ``distributed.Client`` for ``local`` and ``slurm``; ``None`` otherwise.
    cluster
        The ``LocalCluster`` or ``SLURMCluster``; ``None`` otherwise.
    """

    name: str
    description: str
    client: Any = None
    cluster: Any = None


class _HasCompute(Protocol):
    """A whole configuration (:class:`depsi.pipeline.config.PipelineConfig`): its ``compute``."""

    compute: ComputeConfig


def _as_compute_config(config: ComputeConfig | _HasCompute | Mapping[str, Any] | None,
                       overrides: Mapping[str, Any]) -> ComputeConfig:
    compute = getattr(config, "compute", None)
    if isinstance(compute, ComputeConfig):
        config = compute  # a whole pipeline configuration: its compute section
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, ComputeConfig):
        data = config.model_dump(exclude_unset=True)
    elif isinstance(config, Mapping):
        data = dict(config)
    else:
        raise TypeError(f"config must be a ComputeConfig, PipelineConfig or mapping, "
                        f"got {type(config).__name__}")
    data.update(overrides)
    return ComputeConfig.model_validate(data)


@contextmanager
def scheduler(config: ComputeConfig | _HasCompute | Mapping[str, Any] | None = None, /,
              **overrides: Any) -> Iterator[RunningScheduler]:
    """Run the Dask computations inside the ``with`` block on the chosen scheduler.

    Parameters
    ----------
    config
        The ``compute`` section (:class:`ComputeConfig`), a whole
        :class:`~depsi.pipeline.config.PipelineConfig` (anything with a ``ComputeConfig`` as
        its ``compute``), or a mapping with the same keys; ``None`` uses the defaults
        (``threads``).
    **overrides
        Keys of ``ComputeConfig`` that replace those of ``config``, e.g. ``scheduler="local"``.

    Yields
    ------
    RunningScheduler
        The scheduler's name, a one-line description, and the client and cluster (``local``,
        ``slurm``).

    Raises
    ------
    SchedulerStartError
        When cluster workers do not start within ``worker_timeout`` seconds; the message says
        how many started and, for SLURM, the state of the jobs.

    Examples
    --------
    >>> import dask.array as da
    >>> with scheduler(scheduler="threads", threads=2) as running:
    ...     running.description
    'threads: 2 threads'
    """
    compute = _as_compute_config(config, overrides)
    # before a cluster's threads take heap arenas of their own: the driver's freed memory goes
    # back to the system (docs/hpc.md, "The driver: what stays in the client process")
    tune_memory()
    start = {"synchronous": _synchronous, "threads": _threads, "processes": _processes,
             "local": _local, "slurm": _slurm}[compute.scheduler]
    with ExitStack() as stack:
        running = start(compute, stack)
        tune_memory()  # the allocator's threshold for where the work runs (threads or workers)
        logger.info("scheduler %s", running.description)
        yield running
    logger.info("scheduler %s closed", running.name)


def _synchronous(compute: ComputeConfig, stack: ExitStack) -> RunningScheduler:
    stack.enter_context(dask.config.set(scheduler="synchronous"))
    return RunningScheduler("synchronous", "synchronous: one thread, no parallelism")


def _threads(compute: ComputeConfig, stack: ExitStack) -> RunningScheduler:
    threads = compute.threads or os.cpu_count() or 1
    stack.enter_context(dask.config.set(scheduler="threads", num_workers=threads))
    # one BLAS thread per task, as distributed's workers have (tasks are the parallelism)
    stack.enter_context(single_threaded_blas())
    return RunningScheduler("threads", f"threads: {threads} threads")


def _processes(compute: ComputeConfig, stack: ExitStack) -> RunningScheduler:
    workers = compute.workers or os.cpu_count() or 1
    # Same hash seed in every process, as dask's own process pool does, so tokens agree.
    os.environ.setdefault("PYTHONHASHSEED", "6640")
    context = multiprocessing.get_context(dask.config.get("multiprocessing.context", "spawn"))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context,
                               initializer=_single_threaded_blas_process)
    stack.callback(_shutdown_pool, pool)
    stack.enter_context(dask.config.set(scheduler="processes", pool=pool, num_workers=workers))
    return RunningScheduler("processes", f"processes: {workers} worker processes")


def _single_threaded_blas_process() -> None:
    """A pool process's BLAS at one thread for its whole life, as distributed's workers."""
    single_threaded_blas().__enter__()


def _shutdown_pool(pool: ProcessPoolExecutor) -> None:
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:  # a task still running (Ctrl-C) would keep its process alive
        process.terminate()
    for process in processes:
        process.join(timeout=10)


#: glibc's malloc settings of a LocalCluster's worker processes (bytes). distributed sets
#: ``MALLOC_TRIM_THRESHOLD_`` to 64 kB, which also fixes glibc's mmap threshold at its 128 kB
#: floor: every temporary above 128 kB is then mapped and unmapped, page by page (a tile of
#: integration's w-test cost 1.6-2.0 s of system CPU in a worker against 0.15 s on a driver
#: thread). At 4 MB each, temporaries of up to 4 MB are reused from the heap and at most 4 MB of
#: free heap top is kept; larger arrays are still mapped and given back whole.
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": 4 * 2**20, "MALLOC_MMAP_THRESHOLD_": 4 * 2**20}


#: The workers' memory fractions where managed data goes to disk (distributed's defaults: 0.6 and
#: 0.7): a task's own arrays come on top of the data a worker holds, and at 10^7 points the model
#: step's took 1 GB workers past 95 % (docs/benchmarks.md, "Dask graphs and the workers"). Pausing
#: (0.8) and terminating (0.95) stay distributed's.
WORKER_MEMORY = {"distributed.worker.memory.target": 0.4,
                 "distributed.worker.memory.spill": 0.5}


def worker_memory_environment() -> list[str]:
    """:data:`WORKER_MEMORY` as the shell exports a SLURM job's workers read (Dask's
    environment configuration).

    Examples
    --------
    >>> worker_memory_environment()[0]
    'export DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=0.4'
    """
    return [f"export DASK_{key.upper().replace('.', '__').replace('-', '_')}={value}"
            for key, value in WORKER_MEMORY.items()]


def _local(compute: ComputeConfig, stack: ExitStack) -> RunningScheduler:
    from distributed import Client, LocalCluster

    # for every worker process the nannies start, restarts included (the whole run); the
    # nannies hand their workers this configuration
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **WORKER_MALLOC,
               HUGEPAGE_VARIABLE: os.environ.get(HUGEPAGE_VARIABLE, "0")}
    stack.enter_context(dask.config.set({"distributed.nanny.pre-spawn-environ": environ,
                                         **WORKER_MEMORY}))
    memory_limit = 0 if compute.memory_limit is None else compute.memory_limit
    cluster = LocalCluster(n_workers=compute.workers, threads_per_worker=compute.threads,
                           memory_limit=memory_limit, processes=True,
                           dashboard_address=":0")
    stack.callback(_close_bounded, cluster, "LocalCluster")
    client = Client(cluster)
    stack.callback(_close_bounded, client, "client")
    n_workers = len(cluster.worker_spec)
    _wait_for_workers(client, n_workers=n_workers, timeout=compute.worker_timeout,
                      what="LocalCluster")
    threads = sum(client.nthreads().values())
    description = (f"local: {n_workers} workers, {threads} threads, memory limit "
                   f"{compute.memory_limit or 'none'} per worker, dashboard "
                   f"{client.dashboard_link}")
    return RunningScheduler("local", description, client=client, cluster=cluster)


#: Seconds a client or LocalCluster gets to close; one that lost all its workers can hang.
CLOSE_TIMEOUT_S = 20.0


def _close_bounded(closable: Any, what: str) -> None:
    """Close a client or cluster within CLOSE_TIMEOUT_S; a failure to close is logged, not raised,
    so it never hides the error that ended the computation."""
    try:
        closable.close(timeout=CLOSE_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - closing is best effort by design
        logger.warning("closing the %s failed: %s", what, err)


def slurm_cluster_kwargs(slurm: SlurmConfig) -> dict[str, Any]:
    """Keyword arguments of ``dask_jobqueue.SLURMCluster`` for a ``compute.slurm`` section.

    Parameters
    ----------
    slurm
        The SLURM section of the configuration.

    Returns
    -------
    dict
        ``cores``, ``processes``, ``memory``, ``walltime``, ``queue``, ``account``,
        ``job_extra_directives`` (with ``--gres=gpu:N`` for GPUs), ``job_script_prologue``,
        ``interface``, ``local_directory``, ``log_directory`` and ``scheduler_options``.

    Examples
    --------
    >>> kwargs = slurm_cluster_kwargs(SlurmConfig(gpus_per_job=2, job_directives=["--qos=s"]))
    >>> kwargs["job_extra_directives"]
    ['--qos=s', '--gres=gpu:2']
    """
    directives = list(slurm.job_directives)
    if slurm.gpus_per_job:
        directives.append(f"--gres=gpu:{slurm.gpus_per_job}")
    kwargs: dict[str, Any] = {
        "cores": slurm.cores, "processes": slurm.processes, "memory": slurm.memory,
        "walltime": slurm.walltime, "queue": slurm.queue, "account": slurm.account,
        "job_extra_directives": directives,
        # the workers' spill fractions first: a prologue of the user's can override them
        "job_script_prologue": worker_memory_environment() + list(slurm.job_script_prologue),
        "local_directory": slurm.local_directory or os.environ.get("TMPDIR", "/tmp"),
        "log_directory": slurm.log_directory,
        "scheduler_options": {"dashboard_address": ":0"},
        "name": "depsi-worker",
    }
    if slurm.interface is not None:
        kwargs["interface"] = slurm.interface
    return kwargs


def _slurm(compute: ComputeConfig, stack: ExitStack) -> RunningScheduler:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    slurm = compute.slurm
    if shutil.which("sbatch") is None:
        raise SchedulerStartError("scheduler 'slurm' needs the SLURM commands (sbatch, squeue, "
                                  "scancel) on PATH; sbatch was not found")
    cluster = SLURMCluster(**slurm_cluster_kwargs(slurm))
    job_ids: list[str] = []
    stack.callback(_wait_for_jobs_to_leave, job_ids)
    stack.callback(_close_slurm_cluster, cluster, job_ids)
    client = Client(cluster)
    stack.callback(client.close)
    if slurm.adaptive is not None:
        cluster.adapt(minimum_jobs=slurm.adaptive.minimum, maximum_jobs=slurm.adaptive.maximum)
        wanted_jobs = slurm.adaptive.minimum
        scaling = f"adaptive {slurm.adaptive.minimum}..{slurm.adaptive.maximum} jobs"
    else:
        cluster.scale(jobs=slurm.jobs)
        wanted_jobs = slurm.jobs
        scaling = f"{slurm.jobs} jobs"
    if wanted_jobs:
        try:
            _wait_for_workers(client, n_workers=wanted_jobs * slurm.processes,
                              timeout=compute.worker_timeout, what="SLURMCluster")
        except SchedulerStartError as err:
            raise SchedulerStartError(f"{err}; {_job_states(cluster)}") from None
    description = (f"slurm: {scaling} x {slurm.cores} cores, {slurm.memory}, walltime "
                   f"{slurm.walltime}, queue {slurm.queue or 'default'}"
                   f"{f', {slurm.gpus_per_job} GPUs' if slurm.gpus_per_job else ''}, "
                   f"scheduler {cluster.scheduler_address}, dashboard {client.dashboard_link}")
    return RunningScheduler("slurm", description, client=client, cluster=cluster)


def _wait_for_workers(client: Any, *, n_workers: int, timeout: float, what: str) -> None:
    start = time.monotonic()
    try:
        client.wait_for_workers(n_workers, timeout=timeout)
    except TimeoutError:
        started = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        raise SchedulerStartError(f"{what}: {started} of {n_workers} workers started within "
                                  f"{timeout:g} s (compute.worker_timeout)") from None
    logger.debug("%s: %d workers up in %.1f s", what, n_workers, time.monotonic() - start)


def _job_ids(cluster: Any) -> list[str]:
    return [str(job.job_id) for job in cluster.workers.values()
            if getattr(job, "job_id", None)]


def _job_states(cluster: Any) -> str:
    ids = _job_ids(cluster)
    if not ids:
        return f"no job was submitted: {_sbatch_test_only(cluster)}"
    try:
        out = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T %R"],
                             capture_output=True, text=True, timeout=10, check=False)
        states = out.stdout.strip().replace("\n", "; ") or "none in squeue"
    except (OSError, subprocess.TimeoutExpired) as err:
        states = f"squeue failed: {err}"
    return f"jobs {', '.join(ids)}: {states} (job script: cluster.job_script())"


def _close_slurm_cluster(cluster: Any, job_ids: list[str]) -> None:
    job_ids.extend(_job_ids(cluster))  # the cluster forgets its jobs when closed
    try:
        cluster.close()
    except (AssertionError, RuntimeError, OSError) as err:
        # A job that never started (e.g. refused by sbatch) makes SpecCluster.close trip over
        # it; the other jobs were cancelled already, and closing must not hide the first error.
        logger.warning("closing the SLURMCluster: %s: %s", type(err).__name__, err)


def _sbatch_test_only(cluster: Any) -> str:
    """Why sbatch refuses the worker job script, from ``sbatch --test-only``."""
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as script:
            script.write(cluster.job_script())
        out = subprocess.run(["sbatch", "--test-only", script.name], capture_output=True,
                             text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"sbatch --test-only failed: {err}"
    finally:
        os.unlink(script.name)
    if out.returncode == 0:
        return "sbatch --test-only accepts the job script (cluster.job_script())"
    return "sbatch refuses the job: " + " ".join(out.stderr.split())


def _wait_for_jobs_to_leave(job_ids: list[str]) -> None:
    """SLURMCluster.close cancels its jobs; wait a little so none outlives the context."""
    if not job_ids:
        return
    deadline = time.monotonic() + SLURM_DRAIN_TIMEOUT_S
    remaining = job_ids
    while time.monotonic() < deadline:
        try:
            out = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i"],
                                 capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return
        remaining = out.stdout.split()
        if not remaining:
            return
        time.sleep(0.5)
    logger.warning("SLURM jobs %s still in squeue %g s after cancelling them",
                   ", ".join(remaining), SLURM_DRAIN_TIMEOUT_S)
