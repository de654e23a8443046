"""The pipeline runner: the steps of ``depsi run`` with checkpoints, resume and a run summary.

The steps, their inputs, config sections and products are those of the one table
:data:`depsi.pipeline.steps.STEPS` (``depsi steps`` prints it); the chain's steps are the ones
:func:`~depsi.pipeline.chain.run_ps_chain` runs in memory, called here with the same config
sections, so ``depsi run`` and ``run_ps_chain`` compute the same result.

Every product is written atomically (a temporary sibling moved into place when complete), and
only then is a small manifest ``<step>.done.json`` written beside it
(:mod:`depsi.pipeline.manifest`): the hash of the config sections the step depends on, the run
ids of the products it read, a fingerprint of the product on disk, timings and counts.
``resume=True`` skips a step only when its manifest exists, the config hash and the inputs
still match, and the product on disk still has the manifest's fingerprint and opens; anything
else (an interrupted step, a stale temporary sibling, a changed config) is redone, never
trusted.

Examples
--------
A small simulated stack, from the SLC stack to the exports:

>>> import tempfile
>>> from depsi.pipeline import parse_config, run_pipeline
>>> config = parse_config({"input": {"simulate": {"shape": [60, 60], "n_epochs": 20}},
...                        "output": {"workspace": tempfile.mkdtemp()}})
>>> summary = run_pipeline(config, progress=False)
>>> sorted({record.status for record in summary.steps.values()})
['ran']
>>> (summary.workspace / "stm.zarr").is_dir()  # the result STM, beside the exports
True
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from depsi.io.prefetch import bars_wanted
from depsi.pipeline.config import PipelineConfig
from depsi.pipeline.manifest import (
    FAILED_FILE,
    MANIFEST_VERSION,
    failed_path,
    load_manifest,
    manifest_path,
    product_fingerprint,
    read_failure,
    section_hash,
    write_json_atomic,
)
from depsi.pipeline.preflight import check_disk, check_feasible, point_chunk_bytes
from depsi.pipeline.steps import BY_NAME, STEP_NAMES, STEPS, StepContext, call_step, counts
from depsi.pipeline.workspace import (
    LOG_FILE,
    SUMMARY_LOGGER,
    PipelineError,
    heartbeat,
    log_to_file,
    remove_stale_temporaries,
    workspace_lock,
)

logger = logging.getLogger(__name__)

#: Product of each step, relative to the workspace (the step that opens a real input reads it
#: in place and writes no product).
PRODUCTS = {name: BY_NAME[name].product for name in STEP_NAMES}

#: Config sections (dotted) each step depends on; a change in one of them redoes the step.
STEP_SECTIONS = {name: BY_NAME[name].sections for name in STEP_NAMES}

#: The steps whose products each step reads.
UPSTREAM = {name: BY_NAME[name].inputs for name in STEP_NAMES}

#: The step whose product is the user's input (its manifest records the input section).
_INPUT_STEP = next(step.name for step in STEPS if step.opens_input)


@dataclass
class StepRecord:
    """What happened to one step in a run.

    Attributes
    ----------
    name
        The step (one of :data:`STEPS`).
    status
        ``ran``, ``skipped`` (resumed from a valid manifest), ``reused`` (before ``start``:
        an earlier product read as is) or ``not run`` (after ``stop``).
    seconds
        Wall time of the step in this run (0 when not run).
    counts
        Sizes of the product (points, epochs, ...).
    outputs
        Paths the step wrote or reused.
    reason
        Why a resumed run redid the step (its manifest existed but was stale or damaged:
        ``input changed: slc_20230331.raw (content)``, ...); empty otherwise.
    """

    name: str
    status: str = "not run"
    seconds: float = 0.0
    counts: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class RunSummary:
    """The result of :func:`run_pipeline`: per-step records, scheduler and total time.

    Attributes
    ----------
    workspace
        The workspace folder.
    scheduler
        One-line description of the scheduler used.
    steps
        :class:`StepRecord` per step name, in order.
    seconds
        Total wall time, scheduler start and stop included.
    log_file
        The log file of the run.
    """

    workspace: Path
    scheduler: str = ""
    steps: dict[str, StepRecord] = field(default_factory=dict)
    seconds: float = 0.0
    log_file: Path | None = None
    #: What a resumed run redid and why (:func:`_resume_message`); empty without resume.
    resume_plan: str = ""

    def format(self) -> str:
        """The summary as a few lines of text (logged at the end of a run)."""
        lines = [f"depsi run finished in {self.seconds:.1f} s on {self.scheduler}",
                 f"workspace: {self.workspace}"]
        if self.resume_plan:
            lines.append(self.resume_plan)
        for record in self.steps.values():
            counts = ", ".join(f"{k} {v}" for k, v in record.counts.items())
            lines.append(f"  {record.name:<13} {record.status:<8} {record.seconds:7.1f} s"
                         f"{'  ' + counts if counts else ''}")
            if record.reason:
                lines.append(f"                redone: {record.reason}")
            lines.extend(f"                -> {output}" for output in record.outputs)
        if self.log_file is not None:
            lines.append(f"log: {self.log_file}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain JSON-able data."""
        return {"workspace": str(self.workspace), "scheduler": self.scheduler,
                "seconds": self.seconds, "log_file": str(self.log_file),
                "steps": {name: asdict(record) for name, record in self.steps.items()}}


@dataclass
class _Context:
    config: PipelineConfig
    workspace: Path
    progress: bool
    products: dict[str, Path] = field(default_factory=dict)
    run_ids: dict[str, str] = field(default_factory=dict)
    devices: list | None = None
    #: The stack step's inputs as found before it ran or was checked (computed once a run).
    input_fingerprint: dict[str, Any] | None = None
    #: Id of this run (in ``failed.json``).
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The products kept open for the run, by step (:attr:`Step.keep_open`: the stack, opened
    #: and checked once a run, its checks reading a sample of its chunks).
    opened: dict[str, Any] = field(default_factory=dict)


def _reads_input_in_place(config: PipelineConfig, step: str) -> bool:
    """Whether ``step``'s product is the user's input, read where it is (not simulated)."""
    return BY_NAME[step].opens_input and config.input.format != "simulated"


# ---------------------------------------------------------------------------------- the steps
def _opened(ctx: _Context, name: str, *, computed: bool = False) -> Any:
    """The product of step ``name`` as its readers take it (its :meth:`Step.open`: the stack
    opened and checked, the selection as the chain's points, others lazily from their stores;
    ``computed``: whole)."""
    if name in ctx.opened:
        return ctx.opened[name]
    spec = BY_NAME[name]
    product = spec.open(ctx.products[name], ctx.config)
    if spec.keep_open:
        ctx.opened[name] = product
    return product.compute() if computed else product


def _execute(ctx: _Context, step: str) -> dict[str, Any]:
    """Run ``step`` on the products of its inputs; its product written to the workspace (by
    the step itself, or stored here as a Zarr STM), and its counts."""
    from depsi.io import open_stm, save_stm

    spec = BY_NAME[step]
    target = _product_path(ctx, step)
    context = StepContext(devices=ctx.devices, progress=ctx.progress, target=target)

    def take(name: str) -> Any:
        return _opened(ctx, name, computed=name in spec.computed)

    product = call_step(spec.run, step, take, ctx.config, context)
    if not spec.stored:
        ctx.products[step] = target
        if spec.keep_open:
            ctx.opened[step] = product
        return dict(context.counts)
    # point STMs a user reads in Morton order (Step.reorder); the chain's products in the
    # order the next steps index them
    path = save_stm(product, target, overwrite=True, reorder=spec.reorder,
                    chunk_bytes=point_chunk_bytes(ctx.config))
    del product
    ctx.products[step] = path
    counted = counts(step, open_stm(path)) if spec.counts is not None else {}
    return counted | context.counts


# ------------------------------------------------------------------------ validity and resume
def _product_opens(ctx: _Context, step: str, path: Path) -> bool:
    """Whether the product at ``path`` opens: a Zarr store opens, a folder of files is a folder,
    and a product kept open for the run opens as its readers take it (and is kept from here,
    the one opening of the run)."""
    from depsi.io import open_stm

    spec = BY_NAME[step]
    try:
        if spec.writes_files:
            return path.is_dir()
        if not spec.keep_open:
            open_stm(path)
            return True
        ctx.opened[step] = spec.open(path, ctx.config)
    except Exception as err:  # noqa: BLE001 - any failure to open means "do not trust"
        logger.info("product %s does not open (%s: %s)", path, type(err).__name__, err)
        return False
    return True


def _product_path(ctx: _Context, step: str) -> Path:
    """Where the product of ``step`` is: in the workspace, or the input read in place (its
    fingerprint is recorded all the same)."""
    if _reads_input_in_place(ctx.config, step):
        assert ctx.config.input.path is not None  # the configuration requires it for input
        return Path(ctx.config.input.path)
    return ctx.workspace / PRODUCTS[step]


def _current_inputs(ctx: _Context) -> dict[str, Any]:
    from depsi.pipeline.fingerprint import input_fingerprint

    if ctx.input_fingerprint is None:
        ctx.input_fingerprint = input_fingerprint(ctx.config)
    return ctx.input_fingerprint


#: Changed input files named in a reason, at most.
CHANGES_SHOWN = 8


def valid_manifest(ctx: _Context, step: str, *,
                   check_config: bool = True) -> tuple[dict[str, Any] | None, str]:
    """The manifest of ``step`` when the finished product can be trusted, and why (not).

    Trusted: the manifest is complete (:func:`load_manifest`), the config sections the step
    depends on hash the same (unless ``check_config`` is False), the products it read have
    the run ids it recorded (so a redone step redoes every later one), the stack step's input
    files are unchanged (:func:`~depsi.pipeline.fingerprint.input_changes`), and the product
    has the recorded fingerprint and opens. A damaged manifest is logged as a warning.
    """
    from depsi.pipeline.fingerprint import input_changes

    manifest, reason = load_manifest(ctx.workspace, step)
    if manifest is None:
        assert reason is not None  # load_manifest says why when it gives no manifest
        if not reason.startswith("no manifest"):
            logger.warning("%s: step %s will be redone", reason, step)
        return None, reason
    if check_config and manifest["config_hash"] != section_hash(ctx.config, STEP_SECTIONS[step]):
        return None, f"config sections {', '.join(STEP_SECTIONS[step])} changed"
    for upstream in UPSTREAM[step]:
        if upstream not in ctx.run_ids:
            return None, f"its input step {upstream} is not finished and valid"
        if manifest["inputs"].get(upstream) != ctx.run_ids[upstream]:
            return None, f"its input {PRODUCTS[upstream]} was rewritten since"
    if BY_NAME[step].opens_input:
        changes = input_changes(manifest["input_fingerprint"], _current_inputs(ctx),
                                limit=CHANGES_SHOWN)
        if changes:
            return None, f"input changed: {', '.join(changes)}"
    path = _product_path(ctx, step)
    try:
        fingerprint = product_fingerprint(path)
    except FileNotFoundError:
        return None, f"product {path} is missing"
    # a real input is judged by its input fingerprint above, which ignores junk and a
    # workspace inside it; its file listing is recorded as "fingerprint" all the same
    read_in_place = _reads_input_in_place(ctx.config, step)
    if fingerprint != manifest["fingerprint"] and not read_in_place:
        return None, f"product {path} differs from the one the manifest describes"
    if not _product_opens(ctx, step, path):
        return None, f"product {path} does not open"
    return manifest, "complete"


@dataclass
class StepCheck:
    """The state of one step's finished product in a workspace (:func:`verify_workspace`).

    Attributes
    ----------
    step
        The step (one of :data:`STEPS`).
    state
        ``ok`` (``--resume`` would skip it), ``stale`` (its product, an earlier product or
        its input files changed: ``--resume`` redoes it), ``damaged`` (its manifest cannot be
        read) or ``not run`` (no manifest).
    reason
        Why it is stale or damaged.
    """

    step: str
    state: str
    reason: str = ""


def _recorded_config(workspace: Path) -> PipelineConfig | None:
    """The input section the step that opens the input ran with, from its manifest (None: not
    recorded)."""
    from depsi.pipeline.config import parse_config

    manifest, _ = load_manifest(workspace, _INPUT_STEP)
    section = (manifest or {}).get("input_fingerprint", {}).get("input")
    if not isinstance(section, dict):
        return None
    try:
        return parse_config({"input": section, "output": {"workspace": str(workspace)}})
    except ValueError as err:
        logger.warning("the input section recorded in %s does not validate: %s",
                       manifest_path(workspace, _INPUT_STEP), err)
        return None


def is_workspace(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a workspace of :func:`run_pipeline` (a folder with manifests or its
    log, not itself a Zarr store)."""
    path = Path(path)
    if not path.is_dir() or any((path / name).exists() for name in
                                (".zgroup", ".zarray", ".zmetadata", "zarr.json")):
        return False
    return (path / LOG_FILE).is_file() or any(manifest_path(path, s).exists() for s in STEP_NAMES)


def verify_workspace(workspace: str | os.PathLike) -> list[StepCheck]:
    """Check every finished step of a workspace as ``--resume`` would, without the config.

    Each manifest against its product, the run ids of the products it read, and the stack
    step's input fingerprint against the input files as they are now (the input section is
    the one recorded in the stack's manifest; config sections are not compared, there being
    no config to compare with).

    Parameters
    ----------
    workspace
        A workspace folder of :func:`run_pipeline`.

    Returns
    -------
    list of StepCheck
        One per step of :data:`STEPS`, in order.
    """
    workspace = Path(workspace).absolute()
    config = _recorded_config(workspace)
    ctx = _Context(config=config or PipelineConfig(), workspace=workspace, progress=False)
    checks = []
    for step in STEP_NAMES:
        manifest, reason = load_manifest(workspace, step)
        if manifest is None:
            assert reason is not None  # load_manifest says why when it gives no manifest
            damaged = not reason.startswith("no manifest")
            checks.append(StepCheck(step, "damaged" if damaged else "not run",
                                    reason if damaged else ""))
            continue
        if BY_NAME[step].opens_input and config is None:
            name = manifest_path(workspace, step).name
            checks.append(StepCheck(step, "damaged",
                                    f"manifest {name} records no valid input section"))
            continue
        manifest, reason = valid_manifest(ctx, step, check_config=False)
        if manifest is None:
            checks.append(StepCheck(step, "stale", reason))
            continue
        ctx.run_ids[step] = manifest["run_id"]
        checks.append(StepCheck(step, "ok"))
    return checks


def _step_range(start: str | None, stop: str | None) -> list[str]:
    for name, value in (("start", start), ("stop", stop)):
        if value is not None and value not in STEP_NAMES:
            raise ValueError(f"{name}: expected one of {', '.join(STEP_NAMES)}, got {value!r}")
    first = STEP_NAMES.index(start) if start else 0
    last = STEP_NAMES.index(stop) if stop else len(STEP_NAMES) - 1
    if first > last:
        raise ValueError(f"start {start!r} comes after stop {stop!r}; steps run in the order "
                         f"{', '.join(STEP_NAMES)}")
    return list(STEP_NAMES[first:last + 1])


def _dask_progress(stack: ExitStack, running: Any, progress: bool) -> None:
    if progress and running.client is None:
        from dask.diagnostics import ProgressBar

        stack.enter_context(ProgressBar(minimum=2.0, out=sys.stderr))


def _reuse_earlier(ctx: _Context, step: str, record: StepRecord) -> None:
    manifest, reason = valid_manifest(ctx, step)
    target = _product_path(ctx, step)
    if manifest is None:
        raise PipelineError(
            f"step {step!r} must have finished before this range of steps: its product "
            f"{target} is not usable ({reason}); run without --from, or --from {step}")
    ctx.run_ids[step] = manifest["run_id"]
    ctx.products[step] = target
    record.status, record.counts = "reused", dict(manifest.get("counts", {}))
    record.outputs = [str(target)]


@contextmanager
def _failure_recorded(ctx: _Context, step: str) -> Iterator[None]:
    """A step that raises leaves ``failed.json`` (:func:`failed_path`) naming it, the
    exception, its one-line explanation (:func:`depsi.errors.classify`), the time and run id."""
    try:
        yield
    except (Exception, KeyboardInterrupt) as err:
        _record_failure(ctx, step, err)
        raise


def _record_failure(ctx: _Context, step: str, err: BaseException) -> None:
    from depsi.errors import classify

    try:
        code, hint = classify(err, workspace=ctx.workspace)
    except Exception as inner:  # noqa: BLE001 - the record must not hide the failure itself
        code, hint = None, f"(not classified: {type(inner).__name__}: {inner})"
    record = {"step": step, "exception": type(err).__name__,
              "message": " ".join(str(err).split()) or type(err).__name__, "hint": hint,
              "exit_code": None if code is None else int(code), "run_id": ctx.run_id,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "timestamp": time.time()}
    try:
        write_json_atomic(failed_path(ctx.workspace), record)
    except OSError as inner:  # a full or read-only workspace: the error itself still goes up
        logger.warning("could not write %s: %s", failed_path(ctx.workspace), inner)


def _clear_failure(ctx: _Context, step: str) -> None:
    """``failed.json`` goes once the step it names has completed."""
    failure = read_failure(ctx.workspace)
    if failure is not None and failure.get("step") == step:
        failed_path(ctx.workspace).unlink(missing_ok=True)
        logger.info("step %s: completed; removed %s of run %s", step, FAILED_FILE,
                    failure.get("run_id"))


#: ``run_ids`` of a step that a resumed run will redo, while planning: its products get a new
#: run id, so every step reading them is redone too.
_TO_BE_REDONE = "to be redone"


def _resume_plan(ctx: _Context, steps: list[str]) -> dict[str, tuple[dict | None, str]]:
    """``valid_manifest`` of each step as the run will find it, before any step runs (a
    step redone gives every step reading it a new input)."""
    saved = dict(ctx.run_ids)
    plan = {}
    for step in steps:
        manifest, reason = valid_manifest(ctx, step)
        plan[step] = (manifest, reason)
        ctx.run_ids[step] = manifest["run_id"] if manifest is not None else _TO_BE_REDONE
    ctx.run_ids = saved
    return plan


def _resume_message(plan: dict[str, tuple[dict | None, str]],
                    failure: dict[str, Any] | None) -> str:
    """``resume: will redo selection (failed last time: ...), network, ...; skips stack``."""
    redo, skip = [], []
    for step, (manifest, reason) in plan.items():
        if manifest is not None:
            skip.append(step)
        elif failure is not None and failure.get("step") == step:
            text = f"{failure.get('exception')}: {failure.get('message', '')}"
            redo.append(f"{step} (failed last time: {text[:200]})")
        elif reason.startswith("no manifest") or reason.startswith("its input"):
            redo.append(step)
        else:
            redo.append(f"{step} ({reason})")
    text = f"resume: will redo {', '.join(redo)}" if redo else "resume: nothing to redo"
    return text + (f"; skips {', '.join(skip)} (finished and valid)" if skip else "")


def _run_step(ctx: _Context, step: str, record: StepRecord, *, resume: bool,
              planned: tuple[dict | None, str] | None = None) -> None:
    if resume:
        manifest, reason = planned if planned is not None else valid_manifest(ctx, step)
        if manifest is not None:
            ctx.run_ids[step] = manifest["run_id"]
            ctx.products[step] = _product_path(ctx, step)
            record.status, record.counts = "skipped", dict(manifest.get("counts", {}))
            record.outputs = [str(ctx.products[step])]
            logger.info("step %s: skipped, finished product %s (manifest %s)", step,
                        ctx.products[step], manifest_path(ctx.workspace, step).name)
            return
        logger.info("step %s: redone (%s)", step, reason)
        if not reason.startswith("no manifest"):  # a first run needs no explanation
            record.reason = reason
    # A manifest is only ever present for a complete product: drop it before rewriting.
    manifest_path(ctx.workspace, step).unlink(missing_ok=True)
    with _failure_recorded(ctx, step):
        # what the step that opens the input reads, taken before it reads: a change while it
        # runs shows next time
        inputs = ({"input_fingerprint": _current_inputs(ctx)} if BY_NAME[step].opens_input
                  else {})
        logger.info("step %s: running", step)
        began = time.perf_counter()
        with heartbeat(f"step {step}"):
            counted = _execute(ctx, step)
        seconds = time.perf_counter() - began
        target = _product_path(ctx, step)
        run_id = uuid.uuid4().hex
        write_json_atomic(manifest_path(ctx.workspace, step), {
            "version": MANIFEST_VERSION, "step": step, "run_id": run_id,
            "config_hash": section_hash(ctx.config, STEP_SECTIONS[step]),
            "inputs": {upstream: ctx.run_ids[upstream] for upstream in UPSTREAM[step]},
            "product": str(target), "fingerprint": product_fingerprint(target),
            "counts": counted, "seconds": round(seconds, 3), "finished": time.time(), **inputs,
        })
    _clear_failure(ctx, step)
    ctx.run_ids[step] = run_id
    record.status, record.seconds, record.counts = "ran", seconds, counted
    record.outputs = [str(target)]
    if BY_NAME[step].writes_files:
        record.outputs = [str(p) for p in sorted(target.iterdir())
                          if not p.name.startswith(".")]  # not the writers' lock files
    logger.info("step %s: done in %.1f s (%s)", step, seconds,
                ", ".join(f"{k} {v}" for k, v in counted.items()))


def run_pipeline(config: PipelineConfig, *, resume: bool = False, start: str | None = None,
                 stop: str | None = None, progress: bool = True) -> RunSummary:
    """Run the pipeline steps ``start``..``stop`` of ``config`` in its workspace.

    Parameters
    ----------
    config
        The validated configuration (:func:`~depsi.pipeline.config.load_config`).
    resume
        Skip every step whose finished product is still valid (manifest present, config
        sections and inputs unchanged, product unchanged on disk and opening).
    start, stop
        First and last step to run (:data:`STEPS`); earlier steps must have finished products
        (a :class:`PipelineError` names the missing one). Default: every step.
    progress
        Progress bars (tqdm over the steps and blocks; Dask's bar on local schedulers).

    Returns
    -------
    RunSummary
        Per step: status, time, counts and output paths; also logged and written to
        ``<workspace>/depsi.log``.

    Raises
    ------
    PipelineError
        An earlier product needed by ``start`` is missing or incomplete, or another run holds
        the workspace.
    ValueError
        An unknown step name, or ``start`` after ``stop``.

    Examples
    --------
    >>> import tempfile
    >>> from depsi.pipeline import parse_config
    >>> config = parse_config({"input": {"simulate": {"shape": [40, 40], "n_epochs": 10}},
    ...                        "output": {"workspace": tempfile.mkdtemp()}})
    >>> from depsi.pipeline.steps import STEP_NAMES
    >>> stop = STEP_NAMES[1]  # the input stack, then the PS selection
    >>> run_pipeline(config, stop=stop, progress=False).steps[stop].status
    'ran'
    >>> summary = run_pipeline(config, resume=True, stop=stop, progress=False)
    >>> summary.steps[stop].status  # its product and manifest are still valid
    'skipped'
    """
    from depsi.cluster import scheduler

    steps = _step_range(start, stop)
    # before any step: refuse what cannot fit, naming the key; a resume checks the disk for
    # the steps it will redo once it knows them
    check_feasible(config, steps=() if resume else steps)
    began = time.perf_counter()
    workspace = Path(config.output.workspace).absolute()
    workspace.mkdir(parents=True, exist_ok=True)
    summary = RunSummary(workspace=workspace, log_file=workspace / LOG_FILE,
                         steps={name: StepRecord(name) for name in STEP_NAMES})
    progress = bars_wanted(progress)
    ctx = _Context(config=config, workspace=workspace, progress=progress,
                   devices=config.compute.devices)
    with log_to_file(workspace / LOG_FILE), workspace_lock(workspace):
        logger.info("depsi run: steps %s in %s (resume=%s, run %s)", ", ".join(steps),
                    workspace, resume, ctx.run_id)
        remove_stale_temporaries(workspace, list(PRODUCTS.values()),
                                 [manifest_path(workspace, s).name for s in STEP_NAMES]
                                 + [FAILED_FILE])
        for step in STEP_NAMES[:STEP_NAMES.index(steps[0])]:
            _reuse_earlier(ctx, step, summary.steps[step])
        with scheduler(config.compute) as running, ExitStack() as bars:
            summary.scheduler = running.description
            _dask_progress(bars, running, progress)
            plan = _resume_plan(ctx, steps) if resume else {}  # the products open as they will
            if resume:
                summary.resume_plan = _resume_message(plan, read_failure(workspace))
                logger.info("%s", summary.resume_plan)
                check_disk(config, [step for step, (manifest, _) in plan.items()
                                    if manifest is None])
            for step in tqdm(steps, desc="depsi run", unit="step", disable=not progress):
                _run_step(ctx, step, summary.steps[step], resume=resume,
                          planned=plan.get(step))
        summary.seconds = time.perf_counter() - began
        for line in summary.format().splitlines():  # to the run's log file only:
            SUMMARY_LOGGER.info("%s", line)             # the CLI prints it on stdout
    return summary
