"""The ``depsi`` command line: run the pipeline, write configs and SLURM batch scripts, simulate
stacks, inspect stores, run the demo.

Run ``depsi --help`` for the commands and ``depsi COMMAND --help`` for their options.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from depsi.pipeline.steps import STEP_NAMES

logger = logging.getLogger("depsi.cli")

DESCRIPTION = """\
depsi: Persistent Scatterer InSAR time series on space-time matrices (STM).

An STM is an xarray Dataset with dims (space, time), stored as chunked Zarr and
processed lazily with Dask. Commands:

  depsi run CONFIG.yaml      run the pipeline (stack, selection, the chain's steps, export);
                             --resume continues after the last complete product, --from/--to
  depsi steps                the steps of `depsi run`: what each reads, the config sections
                             whose change redoes it, its product
  depsi config --example     write a commented example configuration (every key, its default)
  depsi slurm-script CONFIG  write an sbatch script whose job runs `depsi run CONFIG --resume`
  depsi demo                 simulate a small stack, run the PS chain, write results and plots
  depsi warmup               compile the Numba kernels into their cache now (a first run
                             otherwise runs NumPy's while a background process compiles them)
  depsi simulate OUT.zarr    write a simulated SLC stack (with its truth) to Zarr or raw binary
  depsi info PATH            dims, variables, chunking, attributes and size on disk of a store;
                             of a workspace: each step's status, product, counts and the log;
                             --verify reads every chunk and checks it (none missing, checksums)
"""


def _size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"


def describe_store(path: Path) -> str:
    """A text summary of a Zarr store: dims, variables with dtype, units and chunks, attrs,
    size."""
    import xarray as xr

    from depsi.io.store import check_store_path, check_store_safe

    check_store_path(path)
    check_store_safe(path)
    consolidated = (path / ".zmetadata").exists() and not (path / "zarr.json").exists()
    ds = xr.open_zarr(path, consolidated=consolidated, chunks={})
    fmt = "v3" if (path / "zarr.json").exists() else "v2"
    lines = [f"{path}  (Zarr {fmt}, {_human_bytes(_size_on_disk(path))} on disk)",
             "dims: " + ", ".join(f"{k}={v}" for k, v in ds.sizes.items())]
    for title, variables in (("coordinates", ds.coords), ("variables", ds.data_vars)):
        lines.append(f"{title}:")
        for name, var in variables.items():
            chunks = var.chunks
            chunk_text = ("chunks " + "x".join(str(max(c)) for c in chunks)) if chunks else ""
            units = var.attrs.get("units") or var.encoding.get("units") or ""
            lines.append(f"  {name:<28} {str(var.dtype):<14} {units:<22} "
                         f"({', '.join(var.dims)})  {chunk_text}")
    if ds.attrs:
        lines.append("attributes:")
        lines.extend(_attribute_lines(ds.attrs))
    return "\n".join(lines)


def _attribute_lines(attrs: dict) -> list[str]:
    """``key: value`` per attribute; a value of several lines (``history``) indented below it."""
    lines = []
    for key, value in attrs.items():
        text = str(value).rstrip("\n")
        if "\n" in text:
            lines.append(f"  {key}:")
            lines.extend(f"    {line}" for line in text.splitlines())
        else:
            lines.append(f"  {key}: {text}")
    return lines


def _finished_at(seconds: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _step_lines(workspace: Path, step: str,
                failure: dict | None) -> tuple[list[str], dict | None]:
    """The lines of one step in :func:`describe_workspace`, and its manifest when finished."""
    from depsi.pipeline.runner import PRODUCTS, load_manifest

    pad = " " * 16
    manifest, reason = load_manifest(workspace, step)
    if manifest is None and failure is not None and failure.get("step") == step:
        return [f"  {step:<13} {'failed':<16} {PRODUCTS[step]:<20} {'-':>10}  "
                f"{str(failure.get('time', '')).replace('T', ' ')[:19]}",
                f"{pad}{failure.get('exception', 'error')}: {failure.get('message', '')}",
                f"{pad}run id {failure.get('run_id')}"], None
    if manifest is None:
        reason = cast(str, reason)  # load_manifest says why whenever it finds no manifest
        if reason.startswith("no manifest"):  # never run, or stopped before the end
            return [f"  {step:<13} {'missing':<16} {PRODUCTS[step]}"], None
        return [f"  {step:<13} {'damaged manifest':<16} {PRODUCTS[step]}", pad + reason], None
    product = Path(manifest["product"])
    inside = product.parent == workspace
    if not product.exists():
        status, size = "product missing", "-"
    else:  # a real input read in place is no part of the workspace's size
        status = "finished"
        size = _human_bytes(_size_on_disk(product)) if inside else "in place"
    name = product.name if inside else str(product)
    lines = [f"  {step:<13} {status:<16} {name:<20} {size:>10}  "
             f"{_finished_at(manifest['finished'])} ({manifest['seconds']:.1f} s)"]
    counts = ", ".join(f"{k} {v}" for k, v in manifest["counts"].items())
    if counts:
        lines.append(pad + counts)
    lines.append(f"{pad}run id {manifest['run_id']}, config hash {manifest['config_hash'][:16]}")
    return lines, manifest if status == "finished" else None


def describe_workspace(path: Path) -> str:
    """A text summary of a run's workspace, read from its manifests (nothing is opened).

    Per step: its status (``finished``; ``failed``: the step ``failed.json`` names; ``missing``:
    never run, or stopped before it finished; ``product missing``; ``damaged manifest``), its
    product and size, when it finished, the counts, run id and config hash it recorded. Then
    where the result (``stm.zarr``), the exports and the log are. Lock and temporary files are
    not listed.
    """
    from depsi.pipeline.runner import LOG_FILE, PRODUCTS, read_failure

    workspace = Path(path).absolute()
    failure = read_failure(workspace)
    body, finished = [], {}
    for step in STEP_NAMES:
        lines, manifest = _step_lines(workspace, step, failure)
        body += lines
        if manifest is not None:
            finished[step] = manifest
    size = sum(_size_on_disk(workspace / PRODUCTS[s]) for s in finished
               if Path(finished[s]["product"]).parent == workspace)
    last = max((m["finished"] for m in finished.values()), default=None)
    lines = [f"workspace {workspace}",
             f"{len(finished)} of {len(STEP_NAMES)} steps finished"
             + (f", the last at {_finished_at(last)}" if last is not None else "")
             + f"; {_human_bytes(size)} of products on disk",
             f"  {'step':<13} {'status':<16} {'product':<20} {'size':>10}  finished", *body]
    result = workspace / PRODUCTS["model"]
    lines.append(f"result: {result} (depsi info {result}: its variables)" if "model" in finished
                 else "result: none yet (step model has not finished)")
    if "export" in finished:
        exports = workspace / PRODUCTS["export"]
        files = sorted(p.name for p in exports.iterdir() if not p.name.startswith("."))
        lines.append(f"exports: {exports}: {', '.join(files) or 'no files'}")
    log = workspace / LOG_FILE
    lines.append(f"log: {log}" if log.is_file() else "log: none")
    return "\n".join(lines)


def _cmd_info(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if args.verify:
        from depsi.pipeline.runner import is_workspace, verify_workspace

        if is_workspace(path):  # each finished step as --resume would judge it
            checks = verify_workspace(path)
            for check in checks:
                state = {"damaged": "damaged manifest"}.get(check.state, check.state)
                sys.stdout.write(f"{check.step:<13} {state}"
                                 f"{': ' + check.reason if check.reason else ''}\n")
            bad = [c.step for c in checks if c.state in ("stale", "damaged")]
            sys.stdout.write(f"workspace {path}: " + (
                f"{len(bad)} step(s) stale or damaged ({', '.join(bad)}); depsi run --resume "
                "redoes them\n" if bad else "every finished step is valid\n"))
            return 2 if bad else 0  # as a --verify of a damaged store
        from depsi.io.store import verify_store

        counts = verify_store(path)  # raises on the first missing or damaged chunk
    else:
        from depsi.pipeline.runner import is_workspace

        if is_workspace(path):
            sys.stdout.write(describe_workspace(path) + "\n")
            return 0
    sys.stdout.write(describe_store(path) + "\n")
    if args.verify:
        sys.stdout.write(f"verified: {sum(counts.values())} chunks of {len(counts)} arrays "
                         "read, all present and matching their checksums\n")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from depsi import simulate

    kwargs = dict(shape=(args.azimuth, args.range), n_epochs=args.epochs, seed=args.seed,
                  ps_fraction=args.ps_fraction, ds_regions=args.ds_regions)
    if args.format == "zarr":
        out = simulate.write_stack_zarr(args.out, overwrite=args.overwrite, **kwargs)
    elif args.format == "binary":
        out = simulate.write_stack_binary(args.out, overwrite=args.overwrite, **kwargs)["folder"]
    else:
        out = simulate.write_stack(args.out, format=args.format, overwrite=args.overwrite,
                                   **kwargs)["path"]
    logger.info("simulated stack written to %s", out)
    sys.stdout.write(f"{out}\n")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from depsi.demo import run_demo

    out = run_demo(Path(args.out), shape=(args.size, args.size), n_epochs=args.epochs,
                   seed=args.seed, overwrite=args.overwrite)
    sys.stdout.write(f"demo outputs written to {out.resolve()}\n")
    return 0


def _cmd_warmup(args: argparse.Namespace) -> int:
    from depsi.kernels import warmup

    return warmup.main([])


def _bbox(text: str) -> tuple[float, float, float, float]:
    try:
        west, south, east, north = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected WEST,SOUTH,EAST,NORTH in degrees, found {text!r}") from None
    return west, south, east, north


def _cmd_view(args: argparse.Namespace) -> int:
    import webbrowser

    from depsi.viewer import DEFAULT_HTML_POINTS, DEFAULT_TILES, ViewData, ViewServer, write_html

    if not args.html and (args.max_points is not None or args.bbox is not None):
        raise ValueError("view: --max-points and --bbox choose the points of an --html file; "
                         "found them without --html")
    tiles = args.tiles or DEFAULT_TILES
    data = ViewData.open(args.path)
    if args.html:
        out = write_html(data, args.html, bbox=args.bbox, tiles=tiles,
                         max_points=DEFAULT_HTML_POINTS if args.max_points is None
                         else args.max_points)
        sys.stdout.write(f"{out}\n")
        return 0
    server = ViewServer(data, port=args.port, tiles=tiles)
    sys.stdout.write(f"depsi viewer of {data.source} ({data.n_points} points) at "
                     f"{server.url} (Ctrl-C stops it)\n")
    sys.stdout.flush()
    if not args.no_browser:
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        logger.info("viewer stopped")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from depsi.pipeline.runner import run_pipeline

    config = _load_checked(Path(args.config))
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: expected a positive number, found {args.threads}")
        config = config.model_copy(update={
            "compute": config.compute.model_copy(update={"threads": args.threads})})
    summary = run_pipeline(config, resume=args.resume, start=args.start, stop=args.stop,
                           progress=not args.no_progress)
    sys.stdout.write(summary.format() + "\n")
    return 0


def _load_checked(path: Path):
    """Load a configuration and check that its input exists, before any work."""
    from depsi.pipeline.config import load_config

    config = load_config(path)
    source = config.input.path  # None only for a simulated input
    if source is not None and not Path(source).exists():
        raise FileNotFoundError(f"input.path: stack {str(source)!r} (in {path}) does not exist")
    return config


def _cmd_steps(args: argparse.Namespace) -> int:
    from depsi.pipeline.steps import format_steps

    print(format_steps())
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from depsi.pipeline.config import example_config_yaml

    if not args.example:
        raise ValueError("depsi config: nothing to do; use --example [PATH]")
    text = example_config_yaml()
    if args.example == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.example)
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    out.write_text(text)
    sys.stdout.write(f"example configuration written to {out}\n")
    return 0


def slurm_batch_script(config_path: Path, *, config=None, job_name: str = "depsi",
                       log: str | None = None) -> str:
    """An sbatch script whose job runs ``depsi run CONFIG --resume`` as the Dask driver.

    The ``#SBATCH`` directives come from ``compute.slurm`` (partition, account, walltime,
    memory, cores). With ``compute.scheduler: slurm`` the driver submits the worker jobs itself,
    so the driver job needs one core and ``driver_memory``, but ``driver_walltime`` covering
    the whole run (both default to the worker settings); resubmitting
    the same script continues after the last complete product (``--resume``).

    Parameters
    ----------
    config_path
        The configuration file the job runs.
    config
        The loaded configuration (read from ``config_path`` when None).
    job_name
        The SLURM job name.
    log
        The job's output file; default ``<job_name>-%j.out`` in the submit folder.

    Returns
    -------
    str
        The script text.
    """
    import shlex

    from depsi.pipeline.config import load_config

    config = config or load_config(config_path)
    slurm = config.compute.slurm
    driver_is_light = config.compute.scheduler == "slurm"
    walltime = (slurm.driver_walltime or slurm.walltime) if driver_is_light else slurm.walltime
    _check_directive_values({"job_name": job_name, "log": log, "working folder": str(Path.cwd()),
                             "config path": str(Path(config_path).resolve())})
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}",
             f"#SBATCH --output={log or job_name + '-%j.out'}",
             f"#SBATCH --time={walltime}",
             f"#SBATCH --chdir={Path.cwd()}"]
    if slurm.queue:
        lines.append(f"#SBATCH --partition={slurm.queue}")
    if slurm.account:
        lines.append(f"#SBATCH --account={slurm.account}")
    cpus = job_cpus(config.compute)
    if driver_is_light:  # the workers are separate jobs; the driver holds the graph and results
        lines += ["#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={cpus}",
                  f"#SBATCH --mem={_sbatch_memory(slurm.driver_memory or slurm.memory)}"]
        what = (f"this job is the driver; it submits {slurm.jobs} worker job(s) of "
                f"{slurm.cores} cores, {slurm.memory}"
                + (f", {slurm.gpus_per_job} GPU(s)" if slurm.gpus_per_job else "")
                + f" and {slurm.walltime} each (compute.slurm)")
    else:  # the whole computation runs inside this job
        lines += ["#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={cpus}",
                  f"#SBATCH --mem={_sbatch_memory(slurm.memory)}"]
        if slurm.gpus_per_job:
            lines.append(f"#SBATCH --gres=gpu:{slurm.gpus_per_job}")
        what = f"the computation runs inside this job on {cpus} core(s)"
    threads = (f" --threads ${{SLURM_CPUS_PER_TASK:-{cpus}}}"
               if config.compute.scheduler == "threads" else "")
    lines += [f"#SBATCH {directive}" for directive in slurm.job_directives]
    lines += ["", "set -euo pipefail", *slurm.job_script_prologue,
              f"# scheduler {config.compute.scheduler}: {what}",
              "# resubmitting this script continues after the last complete product",
              f"{shlex.quote(sys.executable)} -m depsi.cli -v run "
              f"{shlex.quote(str(Path(config_path).resolve()))} --resume --no-progress{threads}",
              ""]
    return "\n".join(lines)


def job_cpus(compute) -> int:
    """Cores the batch job asks for: what the configured scheduler will use inside it.

    ``synchronous``: 1. ``threads``: ``compute.threads``, else ``compute.slurm.cores`` (the
    run is then told to use exactly the cores SLURM gives, ``--threads``). ``processes``/
    ``local``: workers x threads per worker where given, else ``compute.slurm.cores``.
    ``slurm``: 1, the driver only schedules; the worker jobs get ``compute.slurm``'s cores.

    Examples
    --------
    >>> from depsi.pipeline.config import ComputeConfig
    >>> job_cpus(ComputeConfig(scheduler="threads", threads=8))
    8
    >>> job_cpus(ComputeConfig(scheduler="local", workers=4, threads=2))
    8
    >>> job_cpus(ComputeConfig(scheduler="slurm"))
    1
    """
    scheduler = compute.scheduler
    if scheduler in ("synchronous", "slurm"):
        return 1
    if scheduler == "threads":
        return compute.threads or compute.slurm.cores
    if compute.workers:
        return compute.workers * (compute.threads or 1)
    return max(compute.slurm.cores, compute.threads or 1)


def _check_directive_values(values: dict[str, str | None]) -> None:
    """A value with a newline would become a line of its own in the batch script."""
    import re

    for name, value in values.items():
        if value is not None and re.search(r"[\x00-\x1f\x7f]", value):
            raise ValueError(f"{name}: expected one line of printable text for the batch "
                             f"script, found control character(s) in {value[:60]!r}")
        if name == "job_name" and value is not None and not re.fullmatch(r"[\w.+-]+", value):
            raise ValueError(f"job_name: expected letters, digits and . + - _, found {value!r}")


def _sbatch_memory(memory: str) -> str:
    """``4GB`` / ``16GiB`` / ``500MB`` as sbatch's ``--mem`` (megabytes, an integer)."""
    from dask.utils import parse_bytes

    return f"{max(1, parse_bytes(memory) // 2**20)}M"


def _cmd_slurm_script(args: argparse.Namespace) -> int:
    config_path = Path(args.config)
    config = _load_checked(config_path)
    text = slurm_batch_script(config_path, config=config, job_name=args.job_name)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        sys.stdout.write(f"batch script written to {args.output}; submit it with: sbatch "
                         f"{args.output}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from depsi.errors import exit_codes_help
    from depsi.io.formats import STACK_FORMATS

    parser = argparse.ArgumentParser(
        prog="depsi", description=DESCRIPTION, epilog=exit_codes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the pipeline of a YAML configuration")
    run.add_argument("config", help="the YAML configuration (depsi config --example)")
    run.add_argument("--resume", action="store_true",
                     help="skip steps whose finished products are still valid")
    run.add_argument("--from", dest="start", choices=STEP_NAMES, default=None,
                     help="first step to run (earlier products must be finished)")
    run.add_argument("--to", dest="stop", choices=STEP_NAMES, default=None,
                     help="last step to run")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument("--threads", type=int, default=None, metavar="N",
                     help="threads of the threads scheduler, over compute.threads (a batch "
                          "job passes the cores SLURM gave it)")
    run.set_defaults(func=_cmd_run)

    steps = sub.add_parser("steps", help="list the pipeline's steps: what each reads, the "
                                         "config sections that redo it, its product")
    steps.set_defaults(func=_cmd_steps)

    config = sub.add_parser("config", help="write a commented example configuration")
    config.add_argument("--example", nargs="?", const="-", default=None, metavar="PATH",
                        help="write the example to PATH (default: standard output)")
    config.add_argument("--overwrite", action=argparse.BooleanOptionalAction, default=False,
                        help="replace an existing PATH (default: refuse)")
    config.set_defaults(func=_cmd_config)

    script = sub.add_parser("slurm-script", help="write an sbatch script running the pipeline")
    script.add_argument("config", help="the YAML configuration the job runs")
    script.add_argument("-o", "--output", default=None,
                        help="the script file (default: standard output)")
    script.add_argument("--job-name", default="depsi", help="SLURM job name (default depsi)")
    script.set_defaults(func=_cmd_slurm_script)

    info = sub.add_parser("info", help="describe a Zarr store (STM or SLC stack), or a run's "
                                       "workspace: each step's status, product and counts")
    info.add_argument("path", help="path of the Zarr store or of the workspace")
    info.add_argument("--verify", action="store_true",
                      help="read every chunk and check it: none missing, every checksum right")
    info.set_defaults(func=_cmd_info)

    sim = sub.add_parser("simulate", help="write a simulated SLC stack with known truth")
    sim.add_argument("out", help="output Zarr store (or folder with --format binary)")
    sim.add_argument("--azimuth", type=int, default=400, help="azimuth lines (default 400)")
    sim.add_argument("--range", type=int, default=400, help="range pixels (default 400)")
    sim.add_argument("--epochs", type=int, default=30, help="number of epochs (default 30)")
    sim.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    sim.add_argument("--ps-fraction", type=float, default=0.02,
                     help="fraction of pixels that are persistent scatterers (default 0.02)")
    sim.add_argument("--ds-regions", type=int, default=0,
                     help="square patches of distributed scatterers (default 0: none)")
    # the simulator's own Zarr (with its truth) and binary stores, and every format with a writer
    sim.add_argument("--format", choices=("zarr", "binary", *STACK_FORMATS), default="zarr",
                     help="Zarr store with truth group, raw per-epoch files with DORIS-like "
                          "metadata, or a stack in a processor's format, its orbits and "
                          "timing consistent (default zarr)")
    sim.add_argument("--overwrite", action=argparse.BooleanOptionalAction, default=False,
                     help="replace an existing store (default: refuse)")
    sim.set_defaults(func=_cmd_simulate)

    demo = sub.add_parser("demo", help="simulate a small stack and run the PS chain on it")
    demo.add_argument("--out", default="depsi-demo", help="output folder (default depsi-demo)")
    demo.add_argument("--size", type=int, default=300, help="scene size in pixels (default 300)")
    demo.add_argument("--epochs", type=int, default=60,
                      help="number of epochs, 12 days apart (default 60: two years)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--overwrite", action=argparse.BooleanOptionalAction, default=True,
                      help="replace outputs of an earlier demo (default); --no-overwrite "
                           "refuses an existing --out folder")
    demo.set_defaults(func=_cmd_demo)

    warm = sub.add_parser("warmup", help="compile the Numba kernels into their cache "
                                         "(NUMBA_CACHE_DIR, else ~/.cache/depsi/numba)")
    warm.set_defaults(func=_cmd_warmup)

    view = sub.add_parser("view", help="explore a result in the web browser: a map of the "
                                       "points, a point's series on a click")
    view.add_argument("path", help="a depsi run (or demo) workspace folder, or a result Zarr "
                                   "store")
    view.add_argument("--port", type=int, default=0,
                      help="TCP port on 127.0.0.1 (default: a free one)")
    view.add_argument("--no-browser", action="store_true",
                      help="print the address only; do not open a browser")
    view.add_argument("--html", default=None, metavar="OUT.html",
                      help="write one self-contained HTML file (data embedded, no server) "
                           "instead of serving")
    view.add_argument("--max-points", type=int, default=None, metavar="N",
                      help="points in the --html file: a random sample when there are more "
                           "(default 20000)")
    view.add_argument("--bbox", type=_bbox, default=None, metavar="W,S,E,N",
                      help="only the points in this lon/lat box (degrees) in the --html file")
    view.add_argument("--tiles", default=None, metavar="URL",
                      help="basemap tiles, a URL template with {z}/{x}/{y} (default "
                           "OpenStreetMap's)")
    view.set_defaults(func=_cmd_view)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``depsi`` console script.

    Returns the exit code (:class:`depsi.errors.ExitCode`): a failure is logged as one ERROR
    line (:func:`depsi.errors.classify`), also into the workspace's ``depsi.log`` for ``depsi
    run``; only an unexpected error (a bug, code 1) keeps its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    if args.command in ("demo", "run", "warmup"):
        level = min(level, logging.INFO)
    logging.basicConfig(level=level, format=LOG_FORMAT)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        with _sigterm_as_interrupt():
            return args.func(args)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001 - every fault gets its line
        return _report_failure(err, args)


#: Format of the log lines, on the console and in the workspace's ``depsi.log``.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (scancel, a job's walltime) unwinds like Ctrl-C: writers drop their temporaries."""
    import signal
    import threading

    from depsi.errors import Terminated

    def terminate(signum, frame):
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _report_failure(err: BaseException, args: argparse.Namespace) -> int:
    """Log ``err`` as one ERROR line (``depsi run``: also in its workspace's log); the code."""
    from depsi.errors import ExitCode, classify

    workspace = _run_workspace(args)
    config = Path(args.config) if args.command == "run" else None
    code, message = classify(err, workspace=workspace, config=config)
    exc_info = err if code == ExitCode.INTERNAL_ERROR else None
    logger.error("%s", message, exc_info=exc_info)
    if workspace is not None:
        _append_to_run_log(workspace, message, exc_info)
    return int(code)


def _run_workspace(args: argparse.Namespace) -> Path | None:
    """The workspace of ``depsi run`` when its configuration loads (else None)."""
    if args.command != "run":
        return None
    from depsi.pipeline.config import load_config

    config_logger = logging.getLogger("depsi.pipeline.config")
    disabled, config_logger.disabled = config_logger.disabled, True  # it was logged already
    try:
        return Path(load_config(Path(args.config)).output.workspace).absolute()
    except Exception:  # noqa: BLE001 - a config that does not load has no workspace
        return None
    finally:
        config_logger.disabled = disabled


def _append_to_run_log(workspace: Path, message: str, exc_info: BaseException | None) -> None:
    """The failure line at the end of ``<workspace>/depsi.log``, where the run's lines are;
    skipped when the workspace is missing or cannot be written (the console has the line)."""
    from depsi.pipeline.runner import LOG_FILE

    if not workspace.is_dir():
        return
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, "%s", (message,),
                               (type(exc_info), exc_info, exc_info.__traceback__)
                               if exc_info is not None else None)
    try:
        with open(workspace / LOG_FILE, "a", encoding="utf-8") as log:
            log.write(logging.Formatter(LOG_FORMAT).format(record) + "\n")
    except OSError:
        pass  # a full or read-only workspace: the console has the line


if __name__ == "__main__":
    raise SystemExit(main())
