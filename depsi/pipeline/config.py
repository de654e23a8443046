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
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

# the compute sections live with the schedulers, the base of every section below both;
# imported here so that depsi.pipeline.config.ComputeConfig etc. keep working
from depsi.cluster import SCHEDULERS, AdaptiveConfig, ComputeConfig, SlurmConfig  # noqa: F401
from depsi.processing.arcs import ArcsConfig
from depsi.processing.atmosphere import AtmosphereConfig
from depsi.processing.chain import ChainConfig
from depsi.processing.densification import DensificationConfig
from depsi.processing.integration import IntegrationConfig
from depsi.processing.network import NetworkConfig
from depsi.processing.selection import SelectionConfig
from depsi.sections import Section as _Section

logger = logging.getLogger(__name__)

#: Stack formats the pipeline reads; ``simulated`` builds a stack with known truth instead.
INPUT_FORMATS = ("zarr", "binary", "doris", "isce2", "gamma", "snap", "dimap", "geotiff",
                 "simulated")
#: Products the export step can write.
EXPORTS = ("csv", "gpkg", "geotiff", "plots")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key, the value and the file."""


#: Largest configuration file read, in bytes (a real one is a few kB).
MAX_CONFIG_BYTES = 1 * 2**20
#: Deepest nesting of mappings and lists in a configuration file (a real one has 4 levels).
MAX_CONFIG_DEPTH = 32
#: Longest value shown in an error message (a huge value is cut, not printed whole).
_MAX_SHOWN = 200



def _shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`_MAX_SHOWN` characters (never built whole when huge)."""
    if isinstance(value, (dict, list, tuple, str)) and len(value) > _MAX_SHOWN:
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


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
        None, description="Stack to read: a Zarr store; the folder of a binary (depsi's flat "
                          "DORIS layout), DORIS-5 stack (doris_stack's date folders), ISCE2 "
                          "topsStack/stripmapStack, GAMMA, SNAP znap or GeoTIFF stack; or a "
                          "SNAP BEAM-DIMAP .dim file (or a folder of them). Leave null with "
                          "format 'simulated'.")
    format: Literal["zarr", "binary", "doris", "isce2", "gamma", "snap", "dimap", "geotiff",
                    "simulated"] | None = Field(
        None, description="Format of the stack: zarr, binary, doris, isce2, gamma, snap, "
                          "dimap, geotiff or simulated. null: zarr for a path ending in .zarr, "
                          "dimap for one ending in .dim, simulated without a path.")
    geometry: Literal["product", "orbits"] = Field(
        "product", description="Where h2ph and lat/lon come from: 'product' (the files' own, "
                               "computed from the orbits only where missing) or 'orbits' "
                               "(always computed from the orbit state vectors).")
    dem: Path | None = Field(
        None, description="A DEM raster in WGS84 lon/lat (heights above the ellipsoid, m) to "
                          "geocode the points on; null: the product's height raster, else the "
                          "scene's height.")
    dates: list[str] | None = Field(
        None, description="GeoTIFF stacks: one acquisition date per epoch (YYYY-MM-DD), in "
                          "the order of the files' names.")
    wavelength: float | None = Field(
        None, gt=1e-3, lt=1.0, description="GeoTIFF stacks: radar wavelength (m).")
    h2ph: Path | None = Field(
        None, description="GeoTIFF stacks: folder of the h2ph rasters, one h2ph_*.tif per "
                          "epoch in date order; null: the h2ph_*.tif beside the SLCs.")
    on_bad_epoch: Literal["fail", "drop"] = Field(
        "fail", description="An epoch whose sampled amplitude is all zero, constant or not "
                            "finite: 'fail' refuses the stack naming its date; 'drop' leaves "
                            "it out with a warning (never the mother epoch).")
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
            elif self.path.suffix == ".dim":
                fmt = "dimap"
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
        given = [k for k in ("dates", "wavelength", "h2ph") if getattr(self, k) is not None]
        if given and fmt != "geotiff":
            raise ValueError(f"{', '.join(given)}: only for format 'geotiff' (format {fmt!r} "
                             "reads them from its own metadata)")
        if fmt == "geotiff" and (self.dates is None or self.wavelength is None):
            missing = [k for k in ("dates", "wavelength") if getattr(self, k) is None]
            raise ValueError(f"format 'geotiff' needs {' and '.join(missing)}: GeoTIFF SLCs "
                             "carry no acquisition dates or radar wavelength")
        # object.__setattr__ avoids re-running this validator through validate_assignment.
        object.__setattr__(self, "format", fmt)
        object.__setattr__(self, "simulate", simulate)
        return self


# ---------------------------------------------------------------------------- processing steps
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


# ---------------------------------------------------------------------------------- the whole
class PipelineConfig(_Section):
    """The whole configuration of ``depsi run``: input, each step, output and compute."""

    input: InputConfig = Field(default_factory=InputConfig, description="The SLC stack.")
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig, description="PS candidate selection.")
    network: NetworkConfig = ChainConfig.model_fields["network"]
    arcs: ArcsConfig = ChainConfig.model_fields["arcs"]
    integration: IntegrationConfig = ChainConfig.model_fields["integration"]
    atmosphere: AtmosphereConfig = ChainConfig.model_fields["atmosphere"]
    densification: DensificationConfig = ChainConfig.model_fields["densification"]
    output: OutputConfig = Field(default_factory=OutputConfig, description="Outputs.")
    compute: ComputeConfig = Field(
        default_factory=ComputeConfig, description="Scheduler, workers and devices.")

    def chain(self) -> ChainConfig:
        """The sections of the PS chain, as :func:`~depsi.processing.chain.run_ps_chain` takes
        them (the same objects, not copies)."""
        return ChainConfig.model_construct(**{name: getattr(self, name)
                                              for name in ChainConfig.model_fields})


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
