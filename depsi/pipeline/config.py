"""The pipeline configuration: one pydantic model that is the single source of truth for the
YAML file, the CLI and the defaults of every step.

Every section forbids unknown keys, so a misspelt key fails before any work is done, naming the
key and the file. Units follow DESIGN.md §3 (SI: metres, years, radians).

Examples
--------
>>> from depsi.pipeline.config import PipelineConfig, example_config_yaml, parse_config
>>> config = PipelineConfig()
>>> config.compute.scheduler
'threads'
>>> parse_config({"compute": {"scheduler": "local", "workers": 2}}).compute.workers
2
>>> import yaml
>>> parse_config(yaml.safe_load(example_config_yaml())) == PipelineConfig()
True
"""

from __future__ import annotations

import difflib
import logging
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

logger = logging.getLogger(__name__)

#: Stack formats the pipeline reads; ``simulated`` builds a stack with known truth instead.
INPUT_FORMATS = ("zarr", "binary", "snap", "geotiff", "simulated")
#: Schedulers :func:`depsi.cluster.scheduler` offers.
SCHEDULERS = ("synchronous", "threads", "processes", "local", "slurm")
#: Products the export step can write.
EXPORTS = ("csv", "gpkg", "geotiff", "plots")

_WALLTIME = re.compile(r"^(\d+-)?\d{1,3}:\d{2}(:\d{2})?$|^\d+$")
_BYTES = re.compile(r"^\s*\d+(\.\d+)?\s*([kKmMgGtT]i?[bB]?|[bB])?\s*$")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key, the value and the file."""


#: Largest configuration file read, in bytes (a real one is a few kB).
MAX_CONFIG_BYTES = 1 * 2**20
#: Deepest nesting of mappings and lists in a configuration file (a real one has 4 levels).
MAX_CONFIG_DEPTH = 32
#: Longest value shown in an error message (a huge value is cut, not printed whole).
_MAX_SHOWN = 200

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SLURM_NAME = re.compile(r"^[\w.,:+@=/-]+$")


def _shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`_MAX_SHOWN` characters (never built whole when huge)."""
    if isinstance(value, (dict, list, tuple, str)) and len(value) > _MAX_SHOWN:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


class _Section(BaseModel):
    # finite numbers only: .inf or .nan is never a meaningful parameter of a step
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_of_text(cls, value: Any) -> Any:
        """Strings reach log lines and batch scripts: no newlines or control characters."""
        for text in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(text, (str, Path)) and _CONTROL.search(str(text)):
                raise ValueError(f"expected one line of printable text, found control "
                                 f"character(s) in {str(text)[:60]!r}")
        return value


def _check_bytes(value: str | None, *, allow_auto: bool = True) -> str | None:
    if value is None or (allow_auto and value == "auto") or _BYTES.match(value):
        return value
    raise ValueError(f"expected a size such as '4GB', '500MiB'{' or auto' if allow_auto else ''}, "
                     f"got {value!r}")


# --------------------------------------------------------------------------------------- input
class SimulateConfig(_Section):
    """A simulated SLC stack with known truth (for demos, tests and benchmarks)."""

    shape: tuple[int, int] = Field(
        (200, 200), description="Scene size in pixels, [azimuth, range].")
    n_epochs: int = Field(30, ge=3, description="Number of acquisitions in the stack.")
    seed: int = Field(0, description="Random seed; the same seed gives the same stack.")
    ps_fraction: float = Field(
        0.02, gt=0, le=1, description="Fraction of pixels that are persistent scatterers.")
    chunks: tuple[int, int] | None = Field(
        None, description="Zarr chunk size [azimuth, range] of the written stack (all epochs "
                          "in one chunk); null: about 64 MB chunks. Smaller chunks bound the "
                          "memory of each task.")

    @field_validator("chunks")
    @classmethod
    def _positive_chunks(cls, chunks: tuple[int, int] | None) -> tuple[int, int] | None:
        if chunks is not None and min(chunks) < 1:
            raise ValueError(f"both chunk sizes must be >= 1, got {list(chunks)}")
        return chunks

    @field_validator("shape")
    @classmethod
    def _positive_shape(cls, shape: tuple[int, int]) -> tuple[int, int]:
        if min(shape) < 1:
            raise ValueError(f"both sizes must be >= 1, got {list(shape)}")
        return shape


class InputConfig(_Section):
    """Where the SLC stack comes from."""

    path: Path | None = Field(
        None, description="Stack to read: a Zarr store, or the folder of a binary, SNAP or "
                          "GeoTIFF stack. Leave null with format 'simulated'.")
    format: Literal["zarr", "binary", "snap", "geotiff", "simulated"] | None = Field(
        None, description="Format of the stack: zarr, binary, snap, geotiff or simulated. "
                          "null: zarr for a path ending in .zarr, simulated without a path.")
    simulate: SimulateConfig | None = Field(
        None, description="Parameters of the simulated stack (format 'simulated' only; "
                          "defaults when left null).")

    @model_validator(mode="after")
    def _resolve_format(self) -> InputConfig:
        fmt = self.format
        if fmt is None:
            if self.path is None:
                fmt = "simulated"
            elif self.path.suffix == ".zarr":
                fmt = "zarr"
            else:
                raise ValueError(f"format is needed for path {str(self.path)!r}: "
                                 f"one of {', '.join(INPUT_FORMATS[:-1])}")
        if fmt == "simulated":
            if self.path is not None:
                raise ValueError(f"format 'simulated' takes no path, got {str(self.path)!r}")
            simulate = self.simulate or SimulateConfig()
        else:
            if self.path is None:
                raise ValueError(f"format {fmt!r} needs a path to the stack")
            if self.simulate is not None:
                raise ValueError(f"a simulate section is only allowed with format 'simulated', "
                                 f"not {fmt!r}")
            simulate = None
        # object.__setattr__ avoids re-running this validator through validate_assignment.
        object.__setattr__(self, "format", fmt)
        object.__setattr__(self, "simulate", simulate)
        return self


# ---------------------------------------------------------------------------- processing steps
class SelectionConfig(_Section):
    """Persistent scatterer candidate selection from amplitude statistics."""

    method: Literal["nad", "nmad"] = Field(
        "nad", description="Amplitude statistic: nad (std/mean) or nmad (MAD/median).")
    threshold: float = Field(
        0.25, gt=0, description="Pixels whose statistic is below this value become candidates.")
    engine: Literal["dask", "stream"] = Field(
        "dask", description="dask: one lazy graph over the stack, the points' time series read "
                            "again while saved (memory bounded whatever the number of points); "
                            "stream: one pass on all cores, blocks read and reduced by worker "
                            "threads, the points computed in memory (fastest when they fit).")


class NetworkConfig(_Section):
    """The first-order network of arcs between selected points."""

    method: Literal["delaunay", "redundant"] = Field(
        "delaunay", description="delaunay: triangulation; redundant: arcs to the k nearest "
                                "neighbours (more arcs, more robust).")
    k: int = Field(8, ge=1, description="Neighbours per point for the redundant network.")
    max_length: float | None = Field(
        None, gt=0, description="Longest arc kept, in metres; null keeps every arc.")


class ArcsConfig(_Section):
    """Search grid of the per-arc ensemble-coherence (periodogram) estimation."""

    height_range: float = Field(
        40.0, gt=0, description="Height errors searched, -range..+range, in metres.")
    height_step: float = Field(0.5, gt=0, description="Grid step of the height error, metres.")
    velocity_range: float = Field(
        0.05, gt=0, description="Velocities searched, -range..+range, in metres per year.")
    velocity_step: float = Field(
        0.0005, gt=0, description="Grid step of the velocity, metres per year.")
    min_coherence: float = Field(
        0.5, ge=0, le=1, description="Arcs with a lower ensemble coherence are dropped.")

    @model_validator(mode="after")
    def _steps_fit(self) -> ArcsConfig:
        for name in ("height", "velocity"):
            step, half = getattr(self, f"{name}_step"), getattr(self, f"{name}_range")
            if step > half:
                raise ValueError(f"{name}_step {step} is larger than {name}_range {half}")
        return self


class IntegrationConfig(_Section):
    """Spatial integration of the arc estimates over the network."""

    reference: int | Literal["auto"] = Field(
        "auto", description="Reference point: its index along space, or auto (the most "
                            "coherent point near the scene centre).")
    min_coherence: float = Field(
        0.75, ge=0, le=1, description="Points with a lower temporal coherence after "
                                      "integration are not used as first-order points.")


class AtmosphereConfig(_Section):
    """Atmospheric phase screen estimation."""

    method: Literal["none", "filter"] = Field(
        "filter", description="filter: temporal low-pass of the residual phase, then spatial "
                              "interpolation per epoch; none: no atmospheric correction.")
    window: float = Field(
        0.25, gt=0, description="Length of the temporal low-pass window, in years.")


class DensificationConfig(_Section):
    """Densification: every remaining candidate tied to first-order points."""

    k: int = Field(5, ge=1, description="First-order points each candidate is tied to.")
    max_distance: float = Field(
        1000.0, gt=0, description="Longest arc from a candidate to a first-order point, metres.")
    min_coherence: float = Field(
        0.7, ge=0, le=1, description="Candidates with a lower temporal coherence are dropped.")


class OutputConfig(_Section):
    """Where results go and in which forms."""

    workspace: Path = Field(
        Path("depsi-workspace"), description="Folder for the products of every step, the log "
                                             "and the exports; created when missing.")
    exports: list[Literal["csv", "gpkg", "geotiff", "plots"]] = Field(
        ["csv", "plots"], description="Exports of the result: csv, gpkg (needs the geo extra), "
                                      "geotiff (velocity grid), plots.")

    @field_validator("exports")
    @classmethod
    def _unique(cls, exports: list[str]) -> list[str]:
        return list(dict.fromkeys(exports))


# ------------------------------------------------------------------------------------- compute
class AdaptiveConfig(_Section):
    """Adaptive scaling: SLURM worker jobs are submitted and cancelled with the load."""

    minimum: int = Field(0, ge=0, description="Fewest worker jobs kept.")
    maximum: int = Field(4, ge=1, description="Most worker jobs at once.")

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveConfig:
        if self.minimum > self.maximum:
            raise ValueError(f"minimum {self.minimum} is larger than maximum {self.maximum}")
        return self


class SlurmConfig(_Section):
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
        return None if memory is None else _check_bytes(memory, allow_auto=False)

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


class ComputeConfig(_Section):
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
    solver: Literal["auto", "numpy", "cupy"] = Field(
        "auto", description="Array backend of the kernels: auto (cupy when a CUDA device "
                            "works, else numpy), numpy or cupy.")
    devices: list[int] | None = Field(
        None, description="CUDA devices to use, e.g. [0, 1]; null: every device found.")
    slurm: SlurmConfig = Field(
        default_factory=SlurmConfig, description="SLURM worker jobs (scheduler slurm only).")

    @field_validator("memory_limit")
    @classmethod
    def _memory_limit(cls, memory_limit: str | None) -> str | None:
        return _check_bytes(memory_limit)


# ---------------------------------------------------------------------------------- the whole
class PipelineConfig(_Section):
    """The whole configuration of ``depsi run``: input, each step, output and compute."""

    input: InputConfig = Field(default_factory=InputConfig, description="The SLC stack.")
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig, description="PS candidate selection.")
    network: NetworkConfig = Field(
        default_factory=NetworkConfig, description="First-order network of arcs.")
    arcs: ArcsConfig = Field(default_factory=ArcsConfig, description="Per-arc estimation.")
    integration: IntegrationConfig = Field(
        default_factory=IntegrationConfig, description="Spatial integration over the network.")
    atmosphere: AtmosphereConfig = Field(
        default_factory=AtmosphereConfig, description="Atmospheric phase screen.")
    densification: DensificationConfig = Field(
        default_factory=DensificationConfig, description="Densification of the PS set.")
    output: OutputConfig = Field(default_factory=OutputConfig, description="Outputs.")
    compute: ComputeConfig = Field(
        default_factory=ComputeConfig, description="Scheduler, workers and devices.")


# ----------------------------------------------------------------------------- load and write
def _describe_error(error: dict[str, Any], *, model: type[BaseModel]) -> str:
    loc = [str(part) for part in error["loc"]]
    key = ".".join(loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        section = ".".join(loc[:-1])
        allowed = _allowed_keys(model, loc[:-1])
        close = difflib.get_close_matches(loc[-1], allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        where = f"section {section!r}" if section else "the top level"
        return (f"unknown key {loc[-1]!r} in {where} (allowed: {', '.join(allowed)}){hint}")
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "missing":
        return f"{key}: required key is missing"
    value = error.get("input")
    if error["type"] == "value_error" or (isinstance(value, dict)
                                          and error["type"] != "model_type"):
        return f"{key}: {message}"
    return f"{key}: {message} (got {_shown(value)})"


def _allowed_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    for part in loc:
        field = model.model_fields.get(part)
        sub = _submodel(field.annotation) if field is not None else None
        if sub is None:
            return []
        model = sub
    return list(model.model_fields)


def _submodel(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


class _Loader(yaml.SafeLoader):
    """Safe YAML loader that reads 10:00:00 as a string, not as sexagesimal seconds (36000).

    It refuses anchors and aliases (a chain of aliases expands to gigabytes: "billion laughs")
    and nesting deeper than :data:`MAX_CONFIG_DEPTH` (the composer recurses per level).
    """

    def compose_node(self, parent, index):  # noqa: D102 - PyYAML's hook
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.composer.ComposerError(
                None, None, "expected plain values, found a YAML anchor or alias (&name / "
                "*name); write the value out", event.start_mark)
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_CONFIG_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"expected at most {MAX_CONFIG_DEPTH} levels of nesting, found "
                    "more", event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if not (tag == "tag:yaml.org,2002:int" and regexp.match("10:00:00"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)"
               r"|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"))


def parse_config(data: dict[str, Any] | None, *, source: str = "<config>") -> PipelineConfig:
    """Validate a mapping (e.g. parsed YAML) into a :class:`PipelineConfig`.

    Parameters
    ----------
    data
        Nested mapping with the sections of :class:`PipelineConfig`; ``None`` gives the defaults.
    source
        Name of where the mapping came from, used in error messages.

    Returns
    -------
    PipelineConfig
        The validated configuration with every default filled in.

    Raises
    ------
    ConfigError
        One line per problem, each naming the key (``compute.scheduler``), what was expected and
        the value found.

    Examples
    --------
    >>> parse_config({"selection": {"method": "nmad"}}).selection.method
    'nmad'
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (input, selection, ..., "
                          f"compute), got {type(data).__name__}")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        problems = [_describe_error(e, model=PipelineConfig) for e in err.errors()]
        raise ConfigError(f"{source}: invalid configuration:\n  " + "\n  ".join(problems)) \
            from None


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a YAML configuration file.

    Parameters
    ----------
    path
        The YAML file; :func:`example_config_yaml` shows every key with its default.

    Returns
    -------
    PipelineConfig
        The validated configuration.

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ConfigError
        When the file is not valid YAML or a key or value is wrong; the message names the file,
        the key and the value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"configuration file {str(path)!r} does not exist")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: expected a configuration of at most {MAX_CONFIG_BYTES} "
                          f"bytes, found {size} bytes")
    try:
        text = path.read_bytes()[:MAX_CONFIG_BYTES + 1].decode("utf-8")
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: expected UTF-8 text, found {err.reason} at byte "
                          f"{err.start}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    config = parse_config(data, source=str(path))
    logger.info("configuration read from %s", path)
    return config


def dump_config(config: PipelineConfig) -> str:
    """The configuration as YAML (every value, no comments) that :func:`parse_config` reads back.

    Parameters
    ----------
    config
        A validated configuration.

    Returns
    -------
    str
        YAML text, e.g. to keep beside the products of a run.
    """
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _yaml_value(value: Any) -> str:
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, str) and ":" in value:
        return repr(value)  # '01:00:00' stays a string for any YAML reader
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("...").strip()


def _comment(text: str, pad: str) -> list[str]:
    return [f"{pad}# {line}" for line in textwrap.wrap(text, width=96 - len(pad))]


def _example_lines(model: BaseModel, pad: str) -> list[str]:
    lines: list[str] = []
    for name, field in type(model).model_fields.items():
        lines.extend(_comment(field.description or "", pad))
        value = getattr(model, name)
        sub = _submodel(field.annotation)
        if isinstance(value, BaseModel):
            lines.append(f"{pad}{name}:")
            lines.extend(_example_lines(value, pad + "  "))
        elif value is None and sub is not None:
            # Show the shape of an optional section without switching it on.
            lines.append(f"{pad}{name}: null")
            lines.append(f"{pad}# {name}:")
            lines.extend(f"{pad}#   {k}: {_yaml_value(v)}"
                         for k, v in sub().model_dump().items())
        else:
            lines.append(f"{pad}{name}: {_yaml_value(value)}")
    return lines


def example_config_yaml() -> str:
    """A commented YAML file with every key at its default, for ``depsi config --example``.

    The comments are the field descriptions of :class:`PipelineConfig`; the text loads back into
    ``PipelineConfig()``.

    Returns
    -------
    str
        The YAML text.

    Examples
    --------
    >>> text = example_config_yaml()
    >>> "scheduler: threads" in text
    True
    """
    header = ["# depsi pipeline configuration: `depsi run config.yaml`.",
              "# Every key is optional; the values below are the defaults. Units: metres, years.",
              "# Unknown keys are errors. Scheduling on clusters: see docs/hpc.md.", ""]
    body: list[str] = []
    for name, field in PipelineConfig.model_fields.items():
        body.extend(_comment(field.description or "", ""))
        body.append(f"{name}:")
        body.extend(_example_lines(getattr(PipelineConfig(), name), "  "))
        body.append("")
    return "\n".join(header + body)
