"""The pipeline runner: the steps of ``depsi run`` with checkpoints, resume and a run summary.

Steps, in order (:data:`STEPS`), each with one product in the workspace folder
(``config.output.workspace``):

============= ============================================ =================================
step          does                                         product
============= ============================================ =================================
stack         opens the input stack, or simulates one      ``stack.zarr`` (simulated) or the
                                                           input
selection     PS candidates by amplitude dispersion        ``ps.zarr``
network       first-order points and their arcs            ``network.zarr``
arcs          periodogram of every arc                     ``arcs.zarr``
integration   network solution with arc testing            ``integration.zarr``
atmosphere    screen, second network pass, reference      ``atmosphere.zarr``
densification every other point against the network        ``densification.zarr``
model         velocity and height with the atmosphere      ``stm.zarr``
export        CSV, GeoPackage, GeoTIFF, plots              ``exports/``
============= ============================================ =================================

The chain's steps are the functions of :mod:`depsi.processing.chain`, called with the same
:class:`~depsi.processing.chain.ChainConfig` that :func:`~depsi.processing.chain.run_ps_chain`
takes (``config.chain()``), so ``depsi run`` and ``run_ps_chain`` compute the same result.

Every product is written atomically (a temporary sibling moved into place when complete), and
only then is a small manifest ``<step>.done.json`` written beside it: the hash of the config
sections the step depends on, the run ids of the products it read, a fingerprint of the product
on disk, timings and counts. ``resume=True`` skips a step only when its manifest exists, the
config hash and the inputs still match, and the product on disk still has the manifest's
fingerprint and opens; anything else (an interrupted step, a stale temporary sibling, a changed
config) is redone, never trusted.

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
>>> summary.steps["model"].counts["points"] > 0
True
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr
from tqdm.auto import tqdm

from depsi.io.lock import write_lock
from depsi.io.paths import temporary_sibling
from depsi.io.prefetch import bars_wanted
from depsi.io.store import move_into_place, recover_interrupted
from depsi.pipeline.config import PipelineConfig
from depsi.pipeline.preflight import check_feasible, check_stack_support, point_chunk_bytes
from depsi.processing.chain import STEP_SECTIONS as CHAIN_SECTIONS

logger = logging.getLogger(__name__)
#: The run summary goes to the workspace log file only (not to the console's handlers).
SUMMARY_LOGGER = logging.getLogger("depsi.run_summary")
SUMMARY_LOGGER.propagate = False

#: The steps of the pipeline, in order.
STEPS = ("stack", "selection", "network", "arcs", "integration", "atmosphere", "densification",
         "model", "export")

#: The chain's steps (functions of :mod:`depsi.processing.chain`).
CHAIN_STEPS = STEPS[2:-1]

#: Product of each step, relative to the workspace (the stack step of a real input reads the
#: input in place and writes no product).
PRODUCTS = {"stack": "stack.zarr", "selection": "ps.zarr", "network": "network.zarr",
            "arcs": "arcs.zarr", "integration": "integration.zarr",
            "atmosphere": "atmosphere.zarr", "densification": "densification.zarr",
            "model": "stm.zarr", "export": "exports"}

#: Config sections (dotted) each step depends on; a change in one of them redoes the step.
STEP_SECTIONS = {
    "stack": ("input",),
    "selection": ("selection",),
    **CHAIN_SECTIONS,
    "export": ("output.exports",),
}

#: The steps whose products each step reads.
UPSTREAM = {"stack": (), "selection": ("stack",), "network": ("selection",),
            "arcs": ("network",), "integration": ("network", "arcs"),
            "atmosphere": ("network", "integration"),
            "densification": ("selection", "atmosphere"),
            "model": ("selection", "atmosphere", "densification"), "export": ("model",)}

#: Name of the log file written in the workspace.
LOG_FILE = "depsi.log"
#: Name of the lock file that keeps two runs out of one workspace.
LOCK_FILE = "depsi.lock"

#: Version of the manifest layout; a manifest of another version is not trusted.
MANIFEST_VERSION = 1


class PipelineError(RuntimeError):
    """The pipeline cannot run as asked (missing earlier product, busy workspace, bad range)."""


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


# --------------------------------------------------------------------------- hashes, manifests
def section_hash(config: PipelineConfig, step: str) -> str:
    """SHA-256 of the config sections ``step`` depends on (:data:`STEP_SECTIONS`)."""
    data = config.model_dump(mode="json")
    picked = {}
    for dotted in STEP_SECTIONS[step]:
        value: Any = data
        for part in dotted.split("."):
            value = value[part]
        picked[dotted] = value
    text = json.dumps(picked, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def product_fingerprint(path: str | os.PathLike) -> str:
    """SHA-256 of a product's file listing (relative names and sizes) and its metadata files.

    Cheap even for large Zarr stores (no chunk is read); changes when any file is added,
    removed, resized, or when any JSON metadata changes.
    """
    path = Path(path)
    digest = hashlib.sha256()
    if path.is_file():
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}".encode())
        return digest.hexdigest()
    if not path.is_dir():
        raise FileNotFoundError(f"product {str(path)!r} does not exist")
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = Path(root, name)
            relative = full.relative_to(path).as_posix()
            digest.update(f"{relative}:{full.stat().st_size}\n".encode())
            if name.endswith((".json", ".zattrs", ".zarray", ".zgroup", ".zmetadata")):
                digest.update(full.read_bytes())
    return digest.hexdigest()


def manifest_path(workspace: str | os.PathLike, step: str) -> Path:
    """Where the manifest of ``step`` lives: ``<workspace>/<step>.done.json``."""
    return Path(workspace) / f"{step}.done.json"


#: Name of the record of the step that failed last, beside the manifests; removed when a later
#: run completes that step.
FAILED_FILE = "failed.json"


def failed_path(workspace: str | os.PathLike) -> Path:
    """Where the record of the last failed step lives: ``<workspace>/failed.json``."""
    return Path(workspace) / FAILED_FILE


def read_failure(workspace: str | os.PathLike) -> dict[str, Any] | None:
    """The record of the step that failed last (:func:`failed_path`), or None (none, or
    unreadable: it only explains, it decides nothing)."""
    try:
        record = json.loads(failed_path(workspace).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "step" in record else None


#: Keys every manifest has, with their types; the stack step's also has ``input_fingerprint``
#: (:func:`~depsi.pipeline.fingerprint.input_fingerprint`). One without them is damaged.
MANIFEST_KEYS = {"version": int, "step": str, "run_id": str, "config_hash": str,
                 "inputs": dict, "product": str, "fingerprint": str, "counts": dict,
                 "seconds": (int, float), "finished": (int, float)}


def load_manifest(workspace: str | os.PathLike,
                  step: str) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest of ``step`` and ``None``, or ``None`` and why it cannot be used.

    The reason starts with ``no manifest`` when there is none, ``manifest NAME is damaged``
    when it is unreadable, not a JSON object, of another version or missing an expected key
    (:data:`MANIFEST_KEYS`): its step is then redone, never trusted.
    """
    path = manifest_path(workspace, step)
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"no manifest {path.name}"
    except (OSError, ValueError) as err:
        return None, f"manifest {path.name} is damaged (unreadable: {err})"
    if not isinstance(manifest, dict):
        return None, (f"manifest {path.name} is damaged (expected a JSON object, found a "
                      f"{type(manifest).__name__})")
    if manifest.get("version") != MANIFEST_VERSION:
        return None, (f"manifest {path.name} is damaged (expected version {MANIFEST_VERSION}, "
                      f"found {manifest.get('version')!r})")
    expected = dict(MANIFEST_KEYS) | ({"input_fingerprint": dict} if step == "stack" else {})
    missing = [key for key in expected if key not in manifest]
    wrong = [key for key, kind in expected.items()
             if key in manifest and not isinstance(manifest[key], kind)]
    if missing or wrong:
        found = [f"missing {', '.join(missing)}"] if missing else []
        found += [f"wrong type of {', '.join(wrong)}"] if wrong else []
        return None, f"manifest {path.name} is damaged ({'; '.join(found)})"
    return manifest, None


def read_manifest(workspace: str | os.PathLike, step: str) -> dict[str, Any] | None:
    """The manifest of ``step``, or ``None`` when absent or damaged (never trusted then;
    :func:`load_manifest` says why)."""
    manifest, reason = load_manifest(workspace, step)
    if manifest is None and not reason.startswith("no manifest"):
        logger.warning("%s: step %s will be redone", reason, step)
    return manifest


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = temporary_sibling(path)
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------- the steps
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


def _input_product(config: PipelineConfig, workspace: Path) -> Path:
    if config.input.format == "simulated":
        return workspace / PRODUCTS["stack"]
    return Path(config.input.path)


def open_stack(config: PipelineConfig, *, path: str | os.PathLike | None = None) -> xr.Dataset:
    """Open the SLC stack of ``config.input`` lazily (``path``: a simulated stack's store),
    its values checked on sampled blocks (:func:`depsi.io.validate.validate_stack`: finite,
    amplitude neither zero nor constant in an epoch, h2ph physical; ``input.on_bad_epoch``).

    Every step that reads the stack opens it here, so epochs dropped by ``on_bad_epoch: drop``
    stay dropped in every step.
    """
    from depsi.io.validate import validate_stack

    stack = _open_stack_unchecked(config, path=path)
    source = str(path if config.input.format == "simulated" else config.input.path)
    return validate_stack(stack, on_bad_epoch=config.input.on_bad_epoch, source=source)


def _open_stack_unchecked(config: PipelineConfig, *,
                          path: str | os.PathLike | None = None) -> xr.Dataset:
    """Open the SLC stack of ``config.input`` lazily (``path``: a simulated stack's store).

    Parameters
    ----------
    config
        The pipeline configuration.
    path
        The store of a simulated stack (ignored for real input).

    Returns
    -------
    xarray.Dataset
        Raster stack ``(azimuth, range, time)`` with ``complex`` (and ``h2ph`` when known).
    """
    from depsi.io import from_snap, open_binary_folder, open_slc_zarr

    section = config.input
    fmt = section.format
    if fmt == "simulated":
        return open_slc_zarr(path)
    source = Path(section.path)
    if not source.exists():
        raise FileNotFoundError(f"input.path: stack {str(source)!r} does not exist")
    mode = section.geometry
    if fmt == "zarr":
        return open_slc_zarr(source)
    if fmt == "snap":
        return from_snap(sorted(source.glob("*.znap")) or source, geometry=mode)
    if fmt == "dimap":
        from depsi.io.dimap import from_dimap

        return from_dimap(sorted(source.glob("*.dim")) if source.is_dir() else source,
                          geometry=mode)
    if fmt == "doris":
        from depsi.io.doris import from_doris_stack

        return from_doris_stack(source, geometry=mode)
    if fmt == "gamma":
        from depsi.io.gamma import from_gamma

        return from_gamma(source, geometry=mode)
    if fmt == "isce2":
        from depsi.io.isce2 import from_isce2

        return from_isce2(source, geometry=mode)
    if fmt == "geotiff":
        return _open_geotiff(section, source)
    return open_binary_folder(source)


def _open_raster(rioxarray: Any, path: Path) -> xr.DataArray:
    import warnings

    from rasterio.errors import NotGeoreferencedWarning

    with warnings.catch_warnings():
        # rasters in radar geometry have no geotransform by nature
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        return rioxarray.open_rasterio(path, chunks={}, mask_and_scale=False)


def _open_geotiff(section: Any, source: Path) -> xr.Dataset:
    """A GeoTIFF stack: SLC rasters with dates and wavelength from the configuration, h2ph
    from the ``h2ph_*.tif`` rasters (beside the SLCs or in ``input.h2ph``), positions from
    ``lat.tif``/``lon.tif`` beside the SLCs (WGS84 degrees per radar pixel, as ISCE2's or
    SNAP's geometry exports)."""
    import rioxarray

    from depsi.io import from_geotiff

    tifs = sorted(p for p in source.iterdir() if p.suffix.lower() in (".tif", ".tiff"))
    h2ph_folder = Path(section.h2ph) if section.h2ph is not None else source
    h2ph_files = sorted(p for p in h2ph_folder.iterdir() if p.name.lower().startswith("h2ph")
                        and p.suffix.lower() in (".tif", ".tiff"))
    position_files = {name: source / f"{name}.tif" for name in ("lat", "lon")}
    slc_files = [p for p in tifs if p not in h2ph_files
                 and p not in position_files.values()]
    if not slc_files:
        raise FileNotFoundError(f"input.path: expected SLC GeoTIFFs (*.tif) in "
                                f"{str(source)!r}, found none")
    if len(h2ph_files) != len(section.dates):
        raise ValueError(f"input.h2ph: expected one h2ph_*.tif per epoch ({len(section.dates)} "
                         f"dates) in {str(h2ph_folder)!r}, found {len(h2ph_files)}: the chain "
                         "needs h2ph and GeoTIFF SLCs carry no orbits")
    stack = from_geotiff(slc_files, dates=section.dates, wavelength=section.wavelength)
    layers = []
    for path in h2ph_files:
        band = _open_raster(rioxarray, path)
        if band.shape[1:] != (stack.sizes["azimuth"], stack.sizes["range"]):
            raise ValueError(f"input.h2ph: '{path}': expected {stack.sizes['azimuth']} x "
                             f"{stack.sizes['range']} pixels like the SLCs, found "
                             f"{band.shape[1]} x {band.shape[2]}")
        layers.append(band.data[0].astype(np.float32))
    order = np.argsort(np.array(section.dates, dtype="datetime64[D]"), kind="stable")
    h2ph = da.stack([layers[i] for i in order], axis=-1).rechunk(stack["complex"].chunks)
    stack = stack.assign(h2ph=(("azimuth", "range", "time"), h2ph))
    if all(p.is_file() for p in position_files.values()):
        for name, path in position_files.items():
            band = _open_raster(rioxarray, path)
            if band.shape[1:] != (stack.sizes["azimuth"], stack.sizes["range"]):
                raise ValueError(f"input.path: '{path}': expected {stack.sizes['azimuth']} x "
                                 f"{stack.sizes['range']} pixels like the SLCs, found "
                                 f"{band.shape[1]} x {band.shape[2]}")
            stack = stack.assign_coords({name: (("azimuth", "range"),
                                                band.data[0].astype(np.float64))})
    return stack


def _step_stack(ctx: _Context) -> dict[str, Any]:
    config = ctx.config
    path = _input_product(config, ctx.workspace)
    if config.input.format == "simulated":
        from depsi.simulate import write_stack_zarr

        sim = config.input.simulate
        kwargs = dict(shape=tuple(sim.shape), n_epochs=sim.n_epochs, seed=sim.seed,
                      ps_fraction=sim.ps_fraction)
        if sim.chunks is not None:
            kwargs["chunks"] = tuple(sim.chunks)
        write_stack_zarr(path, overwrite=True, progress=ctx.progress, **kwargs)
    stack = open_stack(config, path=path)
    _check_stack_geometry(stack, config)
    support = check_stack_support(stack, config)  # before selection: refuse too few epochs
    ctx.products["stack"] = path
    return {"azimuth": int(stack.sizes["azimuth"]), "range": int(stack.sizes["range"]),
            "epochs": int(stack.sizes["time"]), **_support_counts(support)}


def _support_counts(support: dict[str, Any]) -> dict[str, Any]:
    """The predicted precisions of :func:`check_stack_support` as the stack step's counts."""
    velocity, height = support["velocity_std"], support["height_std"]
    return {"span_days": support["span_days"],
            "velocity_std_mm_yr": None if velocity is None else round(velocity * 1000, 2),
            "height_std_m": None if height is None else round(height, 1),
            "drop_height": support["drop_height"], "support_warnings": len(support["warnings"])}


#: Exports that place points on a map and so need their positions.
EXPORTS_WITH_POSITIONS = ("gpkg", "geotiff")


def _check_stack_geometry(stack: xr.Dataset, config: PipelineConfig) -> None:
    """Before any pixel is read: the chain needs h2ph, and the exports need positions (the
    product's lat/lon, or orbits to geocode the points from)."""
    where = f"input.path {str(config.input.path)!r} (format {config.input.format!r})"
    if "h2ph" not in stack.data_vars:
        raise ValueError(f"{where}: expected h2ph (from the product or computed from its "
                         "orbits), found neither: the arcs and the model need it")
    dem = config.input.dem
    if dem is not None and not Path(dem).is_file():
        raise FileNotFoundError(f"input.dem: DEM {str(dem)!r} does not exist")
    if dem is not None and "sar_geometry" not in stack.attrs:
        raise ValueError(f"{where}: input.dem needs the stack's orbits to geocode on it, found "
                         "no orbits in this stack")
    geocodable = "sar_geometry" in stack.attrs or {"lat", "lon"} <= set(stack.variables)
    placed = sorted(set(config.output.exports) & set(EXPORTS_WITH_POSITIONS))
    if placed and not geocodable:
        raise ValueError(f"{where}: expected lat/lon rasters or orbit state vectors to "
                         f"geocode the points, found neither: the exports {placed} need "
                         "positions")


def _step_selection(ctx: _Context) -> dict[str, Any]:
    from depsi.io import open_stm, save_stm
    from depsi.processing.selection import ps_selection

    section = ctx.config.selection
    stack = open_stack(ctx.config, path=ctx.products["stack"])
    ps = ps_selection(stack, method=section.method, threshold=section.threshold,
                      engine=section.engine, progress=ctx.progress)
    if ctx.config.input.dem is not None:
        from depsi.io.geometry import geocode_with_dem, open_dem

        ps = geocode_with_dem(ps, open_dem(ctx.config.input.dem))
    path = save_stm(ps, ctx.workspace / PRODUCTS["selection"], overwrite=True,
                    chunk_bytes=point_chunk_bytes(ctx.config))
    ctx.products["selection"] = path
    points = open_stm(path)
    return {"candidates": int(points.attrs.get("n_candidates", 0)),
            "selected": int(points.sizes["space"]), "epochs": int(points.sizes["time"])}


def _points(ctx: _Context) -> xr.Dataset:
    """The chain's input points from ``ps.zarr`` (interferograms formed lazily)."""
    from depsi.io import open_stm
    from depsi.processing.chain import prepare_points

    return prepare_points(open_stm(ctx.products["selection"]))


def _product(ctx: _Context, step: str) -> xr.Dataset:
    from depsi.io import open_stm

    return open_stm(ctx.products[step])


def _save(ctx: _Context, step: str, ds: xr.Dataset) -> xr.Dataset:
    """Write a chain step's product (space in the order the next steps index it)."""
    from depsi.io import open_stm, save_stm

    path = save_stm(ds, ctx.workspace / PRODUCTS[step], overwrite=True, reorder=False,
                    chunk_bytes=point_chunk_bytes(ctx.config))
    ctx.products[step] = path
    return open_stm(path)


def _step_network(ctx: _Context) -> dict[str, Any]:
    from depsi.processing.chain import network_step

    network = _save(ctx, "network", network_step(_points(ctx), ctx.config.chain()))
    return {"first_order": int(network.sizes["space"]), "arcs": int(network.sizes["edge"])}


def _step_arcs(ctx: _Context) -> dict[str, Any]:
    from depsi.processing.chain import arcs_step

    # lazy from the stored network: estimated and written chunk by chunk (10 GB at 10^7)
    arcs = arcs_step(_product(ctx, "network"), ctx.config.chain(), devices=ctx.devices,
                     compute=False)
    arcs = _save(ctx, "arcs", arcs)
    return {"arcs": int(arcs.sizes["arc"])}


def _step_integration(ctx: _Context) -> dict[str, Any]:
    from depsi.processing.chain import integration_step

    # the stored arcs, read a few chunks at a time into integration's observations
    first = integration_step(_product(ctx, "network"), _product(ctx, "arcs"),
                             ctx.config.chain())
    first = _save(ctx, "integration", first)
    return {"first_order": int(first.sizes["space"]),
            "kept": int(first["in_network"].values.sum())}


def _step_atmosphere(ctx: _Context) -> dict[str, Any]:
    from depsi.processing.chain import atmosphere_step

    first = atmosphere_step(_product(ctx, "network").compute(),
                            _product(ctx, "integration").compute(), ctx.config.chain(),
                            devices=ctx.devices)
    first = _save(ctx, "atmosphere", first)
    return {"kept": int(first["in_network"].values.sum())}


def _step_densification(ctx: _Context) -> dict[str, Any]:
    from depsi.processing.chain import densification_step

    # Fancy indexing of multi-chunk points would otherwise split chunks differently per
    # variable (by itemsize), leaving the chain's map_blocks inputs with unequal chunks.
    with dask.config.set({"array.slicing.split_large_chunks": False}):
        dense = densification_step(_points(ctx), _product(ctx, "atmosphere").compute(),
                                   ctx.config.chain(), devices=ctx.devices)
    dense = _save(ctx, "densification", dense)
    return {"accepted": int(dense.sizes["space"])}


def _step_model(ctx: _Context) -> dict[str, Any]:
    from depsi.io import open_stm, save_stm
    from depsi.processing.chain import model_step

    with dask.config.set({"array.slicing.split_large_chunks": False}):
        result = model_step(_points(ctx), _product(ctx, "atmosphere").compute(),
                            _product(ctx, "densification").compute(), ctx.config.chain(),
                            devices=ctx.devices)
    path = save_stm(result, ctx.workspace / PRODUCTS["model"], overwrite=True,
                    chunk_bytes=point_chunk_bytes(ctx.config))
    ctx.products["model"] = path
    result = open_stm(path)
    order = result["order"].values if "order" in result else None
    counts = {"points": int(result.sizes["space"])}
    if order is not None:
        counts |= {"first_order": int((order == 1).sum()), "densified": int((order == 2).sum())}
    if "reference" in result.attrs and "point_index" in result.variables:
        where = np.flatnonzero(result["point_index"].values == int(result.attrs["reference"]))
        if where.size:
            logger.info("chain: reference point is point_index %d (azimuth %d, range %d), as "
                        "attrs['reference'] of %s", int(result.attrs["reference"]),
                        int(result["azimuth"].values[where[0]]),
                        int(result["range"].values[where[0]]), path.name)
    return counts


def _step_export(ctx: _Context) -> dict[str, Any]:
    from depsi.io import open_stm
    from depsi.io.export import EXPORTERS

    result = open_stm(ctx.products["model"]).compute()
    folder = ctx.workspace / PRODUCTS["export"]
    files = []
    with write_lock(folder):
        recover_interrupted(folder)
        tmp = temporary_sibling(folder)
        tmp.mkdir(parents=True)
        try:
            for name in ctx.config.output.exports:
                for file_name, writer in EXPORTERS[name]:
                    writer(result, tmp / file_name)
                    files.append(file_name)
            move_into_place(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    ctx.products["export"] = folder
    return {"files": len(files)}


_STEP_FUNCTIONS = {"stack": _step_stack, "selection": _step_selection,
                   "network": _step_network, "arcs": _step_arcs,
                   "integration": _step_integration, "atmosphere": _step_atmosphere,
                   "densification": _step_densification, "model": _step_model,
                   "export": _step_export}


# ------------------------------------------------------------------------ validity and resume
def _product_opens(step: str, path: Path, config: PipelineConfig) -> bool:
    from depsi.io import open_stm

    try:
        if step == "stack":
            open_stack(config, path=path)
        elif step != "export":
            open_stm(path)
        elif not path.is_dir():
            return False
    except Exception as err:  # noqa: BLE001 - any failure to open means "do not trust"
        logger.info("product %s does not open (%s: %s)", path, type(err).__name__, err)
        return False
    return True


def _fingerprint_target(step: str, ctx: _Context) -> Path | None:
    """The path whose fingerprint is recorded (None: a real input read in place)."""
    if step == "stack":
        return _input_product(ctx.config, ctx.workspace)
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
        if not reason.startswith("no manifest"):
            logger.warning("%s: step %s will be redone", reason, step)
        return None, reason
    if check_config and manifest["config_hash"] != section_hash(ctx.config, step):
        return None, f"config sections {', '.join(STEP_SECTIONS[step])} changed"
    for upstream in UPSTREAM[step]:
        if upstream not in ctx.run_ids:
            return None, f"its input step {upstream} is not finished and valid"
        if manifest["inputs"].get(upstream) != ctx.run_ids[upstream]:
            return None, f"its input {PRODUCTS[upstream]} was rewritten since"
    if step == "stack":
        changes = input_changes(manifest["input_fingerprint"], _current_inputs(ctx),
                                limit=CHANGES_SHOWN)
        if changes:
            return None, f"input changed: {', '.join(changes)}"
    path = _fingerprint_target(step, ctx)
    try:
        fingerprint = product_fingerprint(path)
    except FileNotFoundError:
        return None, f"product {path} is missing"
    # a real input is judged by its input fingerprint above, which ignores junk and a
    # workspace inside it; its file listing is recorded as "fingerprint" all the same
    read_in_place = step == "stack" and ctx.config.input.format != "simulated"
    if fingerprint != manifest["fingerprint"] and not read_in_place:
        return None, f"product {path} differs from the one the manifest describes"
    if not _product_opens(step, path, ctx.config):
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
    """The input section the stack step ran with, from its manifest (None: not recorded)."""
    from depsi.pipeline.config import parse_config

    manifest, _ = load_manifest(workspace, "stack")
    section = (manifest or {}).get("input_fingerprint", {}).get("input")
    if not isinstance(section, dict):
        return None
    try:
        return parse_config({"input": section, "output": {"workspace": str(workspace)}})
    except ValueError as err:
        logger.warning("the input section recorded in %s does not validate: %s",
                       manifest_path(workspace, "stack"), err)
        return None


def is_workspace(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a workspace of :func:`run_pipeline` (a folder with manifests or its
    log, not itself a Zarr store)."""
    path = Path(path)
    if not path.is_dir() or any((path / name).exists() for name in
                                (".zgroup", ".zarray", ".zmetadata", "zarr.json")):
        return False
    return (path / LOG_FILE).is_file() or any(manifest_path(path, s).exists() for s in STEPS)


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
    for step in STEPS:
        manifest, reason = load_manifest(workspace, step)
        if manifest is None:
            damaged = not reason.startswith("no manifest")
            checks.append(StepCheck(step, "damaged" if damaged else "not run",
                                    reason if damaged else ""))
            continue
        if step == "stack" and config is None:
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


def _remove_stale_temporaries(workspace: Path) -> None:
    """Temporary siblings (``.<product>.writing-*``, ...) left by an interrupted run.

    Products are recovered under their writer's lock (a product set aside by a killed replace
    comes back, a killed append is finished or rolled back); other leftovers are removed.
    """
    for product in PRODUCTS.values():
        with write_lock(workspace / product):
            recover_interrupted(workspace / product)
    names = [f"{step}.done.json" for step in STEPS] + [FAILED_FILE]
    for name in names:
        for stale in glob.glob(str(workspace / f".{glob.escape(name)}.*")):
            logger.warning("removing %s, left by an interrupted run (never used as a product)",
                           stale)
            stale_path = Path(stale)
            if stale_path.is_dir():
                shutil.rmtree(stale_path, ignore_errors=True)
            else:
                stale_path.unlink(missing_ok=True)
    for stale in workspace.glob(".*.tmp-*"):  # write_stack_zarr's temporary stores
        logger.warning("removing %s, left by an interrupted run", stale)
        shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def _workspace_lock(workspace: Path) -> Iterator[None]:
    """Keep a second run out of a workspace while one runs (stale locks of dead runs go)."""
    lock = workspace / LOCK_FILE
    host = socket.gethostname()
    with write_lock(lock, timeout=30):  # two runs starting at once: one reads, then writes
        try:
            holder = json.loads(lock.read_text())
        except (OSError, ValueError):
            holder = None
        if holder and holder.get("host") == host and _pid_alive(int(holder.get("pid", -1))):
            raise PipelineError(
                f"workspace {str(workspace)!r} is in use by run pid {holder['pid']} (lock "
                f"{lock}); wait for it, or remove the lock if it is gone")
        if holder and holder.get("host") != host:
            logger.warning("workspace lock %s was left by a run on host %s; taking it over",
                           lock, holder.get("host"))
        _write_json_atomic(lock, {"pid": os.getpid(), "host": host, "started": time.time()})
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0 or pid == os.getpid():
        return pid == os.getpid()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _log_to_file(path: Path) -> Iterator[None]:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    package = logging.getLogger("depsi")
    old_level = package.level
    if package.getEffectiveLevel() > logging.INFO:
        package.setLevel(logging.INFO)
    package.addHandler(handler)
    SUMMARY_LOGGER.addHandler(handler)
    SUMMARY_LOGGER.setLevel(logging.INFO)
    try:
        yield
    finally:
        SUMMARY_LOGGER.removeHandler(handler)
        package.removeHandler(handler)
        package.setLevel(old_level)
        handler.close()


def _step_range(start: str | None, stop: str | None) -> list[str]:
    for name, value in (("start", start), ("stop", stop)):
        if value is not None and value not in STEPS:
            raise ValueError(f"{name}: expected one of {', '.join(STEPS)}, got {value!r}")
    first = STEPS.index(start) if start else 0
    last = STEPS.index(stop) if stop else len(STEPS) - 1
    if first > last:
        raise ValueError(f"start {start!r} comes after stop {stop!r}; steps run in the order "
                         f"{', '.join(STEPS)}")
    return list(STEPS[first:last + 1])


#: Seconds between the "still running" lines of a long step.
HEARTBEAT_SECONDS = 30.0


@contextmanager
def heartbeat(what: str, every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """Log ``<what>: still running (N s)`` every ``every`` seconds until the block ends, so a
    redirected log (no progress bars) shows that a long step is alive."""
    import threading

    done = threading.Event()
    began = time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            logger.info("%s: still running (%.0f s)", what, time.perf_counter() - began)

    thread = threading.Thread(target=beat, name="depsi-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _dask_progress(stack: ExitStack, running: Any, progress: bool) -> None:
    if progress and running.client is None:
        from dask.diagnostics import ProgressBar

        stack.enter_context(ProgressBar(minimum=2.0, out=sys.stderr))


def _reuse_earlier(ctx: _Context, step: str, record: StepRecord) -> None:
    manifest, reason = valid_manifest(ctx, step)
    target = _fingerprint_target(step, ctx)
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
        _write_json_atomic(failed_path(ctx.workspace), record)
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
            ctx.products[step] = _fingerprint_target(step, ctx)
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
        # what the stack step reads, taken before it reads: a change while it runs shows next
        # time
        inputs = {"input_fingerprint": _current_inputs(ctx)} if step == "stack" else {}
        logger.info("step %s: running", step)
        began = time.perf_counter()
        with heartbeat(f"step {step}"):
            counts = _STEP_FUNCTIONS[step](ctx)
        seconds = time.perf_counter() - began
        target = _fingerprint_target(step, ctx)
        run_id = uuid.uuid4().hex
        _write_json_atomic(manifest_path(ctx.workspace, step), {
            "version": MANIFEST_VERSION, "step": step, "run_id": run_id,
            "config_hash": section_hash(ctx.config, step),
            "inputs": {upstream: ctx.run_ids[upstream] for upstream in UPSTREAM[step]},
            "product": str(target), "fingerprint": product_fingerprint(target),
            "counts": counts, "seconds": round(seconds, 3), "finished": time.time(), **inputs,
        })
    _clear_failure(ctx, step)
    ctx.run_ids[step] = run_id
    record.status, record.seconds, record.counts = "ran", seconds, counts
    record.outputs = [str(target)]
    if step == "export":
        record.outputs = [str(p) for p in sorted(target.iterdir())
                          if not p.name.startswith(".")]  # not the writers' lock files
    logger.info("step %s: done in %.1f s (%s)", step, seconds,
                ", ".join(f"{k} {v}" for k, v in counts.items()))


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
    >>> run_pipeline(config, stop="selection", progress=False).steps["selection"].status
    'ran'
    >>> summary = run_pipeline(config, resume=True, stop="selection", progress=False)
    >>> summary.steps["selection"].status  # its product and manifest are still valid
    'skipped'
    """
    from depsi.cluster import scheduler

    check_feasible(config)  # before any step: refuse what cannot fit, naming the key
    steps = _step_range(start, stop)
    began = time.perf_counter()
    workspace = Path(config.output.workspace).absolute()
    workspace.mkdir(parents=True, exist_ok=True)
    summary = RunSummary(workspace=workspace, log_file=workspace / LOG_FILE,
                         steps={name: StepRecord(name) for name in STEPS})
    progress = bars_wanted(progress)
    ctx = _Context(config=config, workspace=workspace, progress=progress,
                   devices=config.compute.devices)
    with _log_to_file(workspace / LOG_FILE), _workspace_lock(workspace):
        logger.info("depsi run: steps %s in %s (resume=%s, run %s)", ", ".join(steps),
                    workspace, resume, ctx.run_id)
        _remove_stale_temporaries(workspace)
        for step in STEPS[:STEPS.index(steps[0])]:
            _reuse_earlier(ctx, step, summary.steps[step])
        with scheduler(config.compute) as running, ExitStack() as bars:
            summary.scheduler = running.description
            _dask_progress(bars, running, progress)
            plan = _resume_plan(ctx, steps) if resume else {}  # the products open as they will
            if resume:
                summary.resume_plan = _resume_message(plan, read_failure(workspace))
                logger.info("%s", summary.resume_plan)
            for step in tqdm(steps, desc="depsi run", unit="step", disable=not progress):
                _run_step(ctx, step, summary.steps[step], resume=resume,
                          planned=plan.get(step))
        summary.seconds = time.perf_counter() - began
        for line in summary.format().splitlines():  # to the run's log file only:
            SUMMARY_LOGGER.info("%s", line)             # the CLI prints it on stdout
    return summary
