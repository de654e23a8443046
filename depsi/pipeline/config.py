"""The pipeline configuration: one pydantic model that is the single source of truth for the
YAML file, the CLI and the defaults of every step.

Every section forbids unknown keys, so a misspelt key fails before any work is done, naming the key
and the file. Units follow docs/design.md, "Conventions: signs and units" (SI: metres, years,
radians).

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

import datetime
import difflib
import logging
import math
import re
import textwrap
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from depsi.cluster import SCHEDULERS, AdaptiveConfig, ComputeConfig, SlurmConfig  # noqa: F401
from depsi.errors import BadInputError
from depsi.io.formats import READERS
from depsi.pipeline.chain_config import ChainConfig
from depsi.processing.arcs import ArcsConfig
from depsi.processing.atmosphere import AtmosphereConfig
from depsi.processing.densification import DensificationConfig
from depsi.processing.integration import IntegrationConfig
from depsi.processing.motion_models import ModelConfig
from depsi.processing.network import NetworkConfig
from depsi.processing.selection import SelectionConfig
from depsi.sections import Section as _Section
from depsi.sections import iso_dates

# the compute sections live with the schedulers, the base of every section below both;
# imported here so that depsi.pipeline.config.ComputeConfig etc. keep working
from depsi.simulate import scene

logger = logging.getLogger(__name__)

#: Stack formats the pipeline reads (:data:`~depsi.io.formats.READERS`); ``simulated`` builds a
#: stack with known truth instead. ``InputConfig.format`` spells them out for the type checker.
INPUT_FORMATS = (*READERS, "simulated")


class ConfigError(BadInputError, ValueError):
    """A configuration that cannot be used; the message names the key, the value and the file."""


#: Largest configuration file read, in bytes (a real one is a few kB).
MAX_CONFIG_BYTES = 1 * 2**20
#: Deepest nesting of mappings and lists in a configuration file (a real one has 4 levels).
MAX_CONFIG_DEPTH = 32
#: Longest value shown in an error message (a huge value is cut, not printed whole).
_MAX_SHOWN = 200



def _shown(value: Any) -> str:
    """``value`` as it reads in YAML (``true``, ``null``, ``.inf``, ``'text'``, ``[1, 2]``), cut
    to :data:`_MAX_SHOWN` characters (never built whole when huge)."""
    if isinstance(value, dict) and len(value) > _MAX_SHOWN:
        return f"a mapping of {len(value)} keys"
    if isinstance(value, (list, tuple)) and len(value) > _MAX_SHOWN:
        return f"a list of {len(value)} items"
    if isinstance(value, str) and len(value) > _MAX_SHOWN:
        return f"a string of {len(value)} characters"
    pieces: list[str] = []
    _shown_pieces(value, pieces, _MAX_SHOWN + 1)
    text = "".join(pieces)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


def _shown_pieces(value: Any, pieces: list[str], room: int) -> int:
    """Append the pieces of :func:`_shown` to ``pieces`` until ``room`` characters are used."""
    if room <= 0:
        return room
    if isinstance(value, (dict, list, tuple)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        pieces.append("{" if isinstance(value, dict) else "[")
        room -= 1
        for index, (key, item) in enumerate(items):
            if room <= 0:
                break
            if index:
                pieces.append(", ")
                room -= 2
            if isinstance(value, dict):
                room = _shown_pieces(key, pieces, room)
                pieces.append(": ")
                room -= 2
            room = _shown_pieces(item, pieces, room)
        pieces.append("}" if isinstance(value, dict) else "]")
        return room - 1
    text = _shown_scalar(value)[:room]
    pieces.append(text)
    return room - len(text)


def _shown_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-.inf" if value < 0 else ".inf")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()  # YAML reads an unquoted 2020-01-01 as a date
    if isinstance(value, (str, Path)):
        return repr(str(value)[:_MAX_SHOWN + 1])
    return repr(value)


# --------------------------------------------------------------------------------------- input
class SimulateConfig(_Section):
    """A simulated SLC stack with known truth (for demos, tests and benchmarks)."""

    shape: tuple[int, int] = Field(
        scene.DEFAULT_SHAPE, description="Scene size in pixels, [azimuth, range].")
    n_epochs: int = Field(scene.DEFAULT_N_EPOCHS, ge=3,
                          description="Number of acquisitions in the stack.")
    seed: int = Field(scene.DEFAULT_SEED,
                      description="Random seed; the same seed gives the same stack.")
    ps_fraction: float = Field(
        scene.DEFAULT_PS_FRACTION, gt=0, le=1,
        description="Fraction of pixels that are persistent scatterers.")
    ds_regions: int = Field(
        scene.DEFAULT_DS_REGIONS, ge=0,
        description="Square patches of distributed scatterers in the scene (coherent, with "
                    "the PS's deformation, height and atmosphere; see selection.ds); 0: none.")
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
                    "interferograms", "simulated"] | None = Field(
        None, description="Format of the stack: zarr, binary, doris, isce2, gamma, snap, "
                          "dimap, geotiff, interferograms (single-reference wrapped "
                          "interferograms and amplitudes, read as pseudo-SLCs) or simulated. "
                          "null: zarr for a path ending in .zarr, dimap for one ending in .dim, "
                          "simulated without a path.")
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
        None, gt=1e-3, lt=1.0, description="GeoTIFF and interferogram stacks: radar "
                                           "wavelength (m).")
    shape: list[int] | None = Field(
        None, min_length=2, max_length=2, description="Interferogram stacks of the raw layout: "
                                                      "[lines, pixels] of every file.")
    pixel_spacing: list[float] | None = Field(
        None, min_length=2, max_length=2, description="[azimuth, range] ground spacing of the "
        "pixels (m), for stacks without positions (no lat/lon, no orbits): the network, the "
        "atmosphere and densification measure distances with it. Required by format "
        "'interferograms'; null elsewhere: the product's, else Sentinel-1 IW's 14 x 4 m with "
        "a warning.")
    layout: Literal["auto", "raw", "isce2", "geotiff"] = Field(
        "auto", description="Interferogram stacks: 'raw' (igrams/A_B.int, amplitude/DATE.amp), "
                            "'isce2' (merged/interferograms/A_B/fine.int), 'geotiff' (A_B.tif) "
                            "or 'auto' (the one found).")
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

    @field_validator("dates", mode="before")
    @classmethod
    def _date_objects(cls, dates: Any) -> Any:
        return iso_dates(dates)

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
        given = [k for k in ("dates", "wavelength", "h2ph") if getattr(self, k) is not None
                 and not (k == "wavelength" and fmt == "interferograms")]
        if given and fmt != "geotiff":
            raise ValueError(f"{', '.join(given)}: only for format 'geotiff' (format {fmt!r} "
                             "reads them from its own metadata)")
        if fmt != "interferograms" and (self.shape is not None or self.layout != "auto"):
            raise ValueError(f"shape, layout: only for format 'interferograms', not {fmt!r}")
        if fmt == "interferograms" and self.wavelength is None:
            raise ValueError("format 'interferograms' needs wavelength: interferogram files "
                             "carry no radar wavelength")
        if fmt == "interferograms" and self.pixel_spacing is None:
            raise ValueError("format 'interferograms' needs pixel_spacing [azimuth, range] in "
                             "metres: interferogram files carry no positions, and distances "
                             "in pixels would be a guess")
        if self.pixel_spacing is not None and not all(0 < v < 10_000
                                                      for v in self.pixel_spacing):
            raise ValueError(f"pixel_spacing: expected two spacings in metres between 0 and "
                             f"10 km, found {self.pixel_spacing}")
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
    exports: list[Literal["csv", "gpkg", "geotiff", "plots", "egms", "qgis"]] = Field(
        ["csv", "plots"], description="Exports of the result: csv, gpkg (needs the geo extra), "
                                      "geotiff (velocity grid), plots, egms (CSV and GPKG "
                                      "with the EGMS point product's columns, mm), qgis (GPKG "
                                      "and CSV with MintPy's save_qgis fields, read by InSAR "
                                      "Explorer).")

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
    # the chain's sections as ChainConfig declares them (default factory, description): a
    # FieldInfo as the default is pydantic's way, which the type stubs do not model
    network: NetworkConfig = ChainConfig.model_fields["network"]  # type: ignore[assignment]
    arcs: ArcsConfig = ChainConfig.model_fields["arcs"]  # type: ignore[assignment]
    integration: IntegrationConfig = ChainConfig.model_fields["integration"]  # type: ignore[assignment]
    atmosphere: AtmosphereConfig = ChainConfig.model_fields["atmosphere"]  # type: ignore[assignment]
    densification: DensificationConfig = ChainConfig.model_fields["densification"]  # type: ignore[assignment]
    model: ModelConfig = ChainConfig.model_fields["model"]  # type: ignore[assignment]
    output: OutputConfig = Field(default_factory=OutputConfig, description="Outputs.")
    compute: ComputeConfig = Field(
        default_factory=ComputeConfig, description="Scheduler, workers and devices.")

    def chain(self) -> ChainConfig:
        """The sections of the PS chain, as :func:`~depsi.pipeline.chain.run_ps_chain` takes
        them (the same objects, not copies)."""
        return ChainConfig.model_construct(**{name: getattr(self, name)
                                              for name in ChainConfig.model_fields})


# ----------------------------------------------------------------------------- load and write
#: What a value of each plain type is called in a message: (one, many).
_KIND_WORDS: dict[Any, tuple[str, str]] = {
    bool: ("true or false", "true or false values"), int: ("a whole number", "whole numbers"),
    float: ("a number", "numbers"), str: ("a string", "strings"), Path: ("a path", "paths")}
_COUNT_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
#: Pydantic's bound errors: the context key of the bound and how a message says it.
_BOUND_WORDS = {"greater_than": ("gt", "greater than"), "greater_than_equal": ("ge", "at least"),
                "less_than": ("lt", "less than"), "less_than_equal": ("le", "at most"),
                "multiple_of": ("multiple_of", "a multiple of")}


def _problems(errors: Sequence[Any], data: dict[str, Any],
              model: type[BaseModel]) -> list[str]:
    """One line per problem, sorted by key path; union members failing at one key are one line."""
    lines: dict[str, tuple[Any, ...]] = {}
    bools = list(_bools_for_numbers(data, model))
    for error in errors:
        if any(tuple(error["loc"][:len(loc)]) == loc for loc in bools):
            continue  # a consequence of reading true as 1: the bool's own line says it
        loc, line = _describe_error(error, data=data, model=model)
        lines.setdefault(line, _sort_key(loc))
    for loc in bools:
        annotation, _ = _field_at(model, loc)[1:]
        found = _shown(_value_at(data, loc))
        line = f"{_key(loc)}: expected {_expected(annotation)}, found {found}"
        lines.setdefault(line, _sort_key(loc))
    return sorted(lines, key=lambda line: (lines[line], line))


def _describe_error(error: dict[str, Any], *, data: Any,
                    model: type[BaseModel]) -> tuple[tuple[Any, ...], str]:
    """The key path of one pydantic error and its line in the user's terms."""
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        section = ".".join(str(part) for part in loc[:-1])
        allowed = _allowed_keys(model, [str(part) for part in loc[:-1]])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        where = f"section {section!r}" if section else "the top level"
        return loc, f"unknown key {loc[-1]!r} in {where} (allowed: {', '.join(allowed)}){hint}"
    if kind == "missing":
        return loc, f"{_key(loc)}: required key is missing"
    if kind in ("value_error", "assertion_error"):
        message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if loc:  # a validator that names its own key: the key once
            message = message.removeprefix(f"{loc[-1]}: ")
        return loc, f"{_key(loc)}: {message}"
    clean, annotation, field = _field_at(model, loc)
    value = _value_at(data, clean) if clean != loc else error.get("input")
    pair = typing.get_origin(_plain(annotation)) is tuple
    expected = None if pair and kind in ("too_short", "too_long") else \
        _expected_bounded(kind, error.get("ctx") or {}, annotation, field)
    if expected is None:
        expected = _expected(annotation)
    if expected is None:  # a type no annotation names: pydantic's words, its jargon cut
        expected = re.sub(r"^Input should be |^Input is ", "", error["msg"])
        expected = re.sub(r" for <class '[^']*'>|, unable to [^,]*", "", expected)
    return clean, f"{_key(clean)}: expected {expected}, found {_shown(value)}"


def _expected_bounded(kind: str, ctx: dict[str, Any], annotation: Any,
                      field: Any) -> str | None:
    """``a number greater than 0 and at most 1`` for a bound or length error, else None."""
    base = _KIND_WORDS.get(_plain(annotation), ("a value", ""))[0]
    if kind in _BOUND_WORDS:
        bounds = [(name, getattr(rule, name)) for rule in getattr(field, "metadata", ())
                  for name, _ in _BOUND_WORDS.values() if getattr(rule, name, None) is not None]
        bounds = bounds or [(_BOUND_WORDS[kind][0], ctx.get(_BOUND_WORDS[kind][0]))]
        words = {name: word for name, word in _BOUND_WORDS.values()}
        return f"{base} " + " and ".join(f"{words[name]} {_shown(limit)}"
                                         for name, limit in bounds)
    if kind == "finite_number":
        phrase = _expected(annotation) or "a number"
        return re.sub(r"\b(whole )?number", r"finite \g<0>", phrase)
    if kind in ("string_too_short", "too_short") and "min_length" in ctx:
        unit = "characters" if kind.startswith("string") else "items"
        return f"{base if kind.startswith('string') else 'a list'} of at least " \
               f"{ctx['min_length']} {unit}"
    if kind in ("string_too_long", "too_long") and "max_length" in ctx:
        unit = "characters" if kind.startswith("string") else "items"
        return f"{base if kind.startswith('string') else 'a list'} of at most " \
               f"{ctx['max_length']} {unit}"
    if kind == "string_pattern_mismatch":
        return f"a string matching {ctx.get('pattern')!r}"
    return None


def _key(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _sort_key(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((0, part, "") if isinstance(part, int) else (1, 0, str(part)) for part in loc)


def _field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any, Any]:
    """The keys of ``loc`` that the configuration has, the annotation there and its field.

    A union member's tag ends the path (the union is described whole), and so does the item of
    a fixed-size list such as ``height_range`` (the pair is described whole).
    """
    annotation: Any = model
    field = None
    for depth, part in enumerate(loc):
        inner = _plain(annotation)
        origin, args = typing.get_origin(inner), typing.get_args(inner)
        if isinstance(inner, type) and issubclass(inner, BaseModel) and \
                part in inner.model_fields:
            field = inner.model_fields[part]
            annotation = field.annotation
        elif origin in (list, set, frozenset) and isinstance(part, int):
            field, annotation = None, args[0] if args else Any
        elif origin is dict and len(args) == 2 and not isinstance(part, int):
            field, annotation = None, args[1]
        else:
            return loc[:depth], annotation, field
    return loc, annotation, field


def _value_at(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _plain(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` and without ``| None``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if _is_union(annotation):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return _plain(args[0])
    return annotation


def _is_union(annotation: Any) -> bool:
    return isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union


def _expected(annotation: Any) -> str | None:
    """What a value of ``annotation`` is in the user's terms: ``a list of two numbers``,
    ``one of 'nad', 'nmad'``, ``a section of keys (method, threshold, engine)``; None when it
    has no name."""
    inner = _plain(annotation)
    if inner is not annotation and _is_union(annotation) and \
            type(None) in typing.get_args(annotation):
        phrase = _expected(inner)
        return f"{phrase} or null" if phrase else None
    if _is_union(inner):
        phrases = [_expected(arg) for arg in typing.get_args(inner)]
        known = [phrase for phrase in phrases if phrase is not None]
        return None if len(known) < len(phrases) else " or ".join(known)
    if typing.get_origin(inner) is Literal:
        values = [_shown(value) for value in typing.get_args(inner)]
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    if inner in _KIND_WORDS:
        return _KIND_WORDS[inner][0]
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        keys = list(inner.model_fields)
        return f"a section of keys ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})"
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis or origin in (list, set,
                                                                              frozenset):
        items = _plural(args[0]) if args else "items"
        return f"a list of {items}" if items else None
    if origin is tuple and args and all(arg == args[0] for arg in args):
        items = _plural(args[0])
        return f"a list of {_COUNT_WORDS.get(len(args), len(args))} {items}" if items else None
    if origin is tuple and args:
        parts = [_expected(arg) for arg in args]
        named = [part for part in parts if part is not None]
        return None if len(named) < len(parts) else \
            f"a list of {len(args)} items: {', '.join(named)}"
    if origin is dict and len(args) == 2:
        plural = _plural(args[1])
        return f"a mapping of keys to {plural}" if plural else None
    return None


def _plural(annotation: Any) -> str | None:
    """Many values of ``annotation``: ``numbers``, ``'csv', 'gpkg' or 'plots'``."""
    inner = _plain(annotation)
    if typing.get_origin(inner) is Literal:
        values = [_shown(value) for value in typing.get_args(inner)]
        return " or ".join([", ".join(values[:-1]), values[-1]] if len(values) > 1 else values)
    if _is_union(inner):
        words = [_plural(arg) for arg in typing.get_args(inner) if arg is not type(None)]
        known = [word for word in words if word is not None]
        return None if len(known) < len(words) else " or ".join(known)
    if inner in _KIND_WORDS:
        return _KIND_WORDS[inner][1]
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return "sections of keys"
    if typing.get_origin(inner) in (list, tuple, set, frozenset):
        return "lists"
    return None


def _takes_numbers(annotation: Any) -> bool:
    inner = _plain(annotation)
    members = typing.get_args(inner) if _is_union(inner) else (inner,)
    return bool not in members and any(member in (int, float) for member in members)


def _bools_for_numbers(value: Any, annotation: Any, loc: tuple[Any, ...] = ()):
    """The key paths where ``true``/``false`` stands for a number (pydantic would read 1 or 0).

    A pair such as ``height_range`` is named whole, as :func:`_field_at` names it.
    """
    inner = _plain(annotation)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if isinstance(value, bool):
        if _takes_numbers(inner):
            yield loc
    elif isinstance(value, dict) and isinstance(inner, type) and issubclass(inner, BaseModel):
        for key, item in value.items():
            field = inner.model_fields.get(key) if isinstance(key, str) else None
            if field is not None:
                yield from _bools_for_numbers(item, field.annotation, (*loc, key))
    elif isinstance(value, list) and origin in (list, set, frozenset) and args:
        for index, item in enumerate(value):
            yield from _bools_for_numbers(item, args[0], (*loc, index))
    elif isinstance(value, list) and origin is tuple and args:
        fixed = not (len(args) == 2 and args[1] is Ellipsis)
        if any(isinstance(item, bool) and _takes_numbers(
                args[index] if fixed and index < len(args) else args[0])
               for index, item in enumerate(value)):
            yield loc


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


#: YAML's words in its messages, and the user's.
_YAML_WORDS = (("'<stream end>'", "the end of the text"), ("end of stream", "end of the text"),
               ("<block end>", "the end of the indented block"), ("'?'", "a key"),
               ("'<block mapping start>'", "an indented mapping"),
               ("'<block sequence start>'", "an indented list"), ("'<scalar>'", "a value"),
               ("a flow sequence", "a [...] list"), ("a flow mapping", "a {...} mapping"),
               ("a block collection", "an indented list or mapping"),
               ("a block mapping", "an indented mapping"), ("a quoted scalar", "a quoted string"),
               ("a plain scalar", "a value"), ("a block scalar", "a | or > text"))
#: Characters of the offending line shown either side of the caret.
_YAML_LINE_SHOWN = 60


def _read_yaml(text: str, *, name: str) -> Any:
    """``text`` parsed by :class:`_Loader`; a syntax error is a :class:`ConfigError` naming
    ``name``, the line and column, with the offending line and a caret under the column."""
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as err:  # a control character, found before parsing starts
        line, column = _line_and_column(text, err.position)
        raise ConfigError(
            f"{name}, line {line + 1}, column {column + 1}: not valid YAML: expected printable "
            f"text, found the control character #x{err.character:04x}"
            + _caret_under(text, line, column)) from None
    loader.name = name  # the marks of every error carry it (not "<unicode string>")
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        raise ConfigError(_yaml_syntax_message(err, text, name)) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{name}: not valid YAML: {err}") from None
    finally:
        loader.dispose()


def _yaml_syntax_message(err: yaml.MarkedYAMLError, text: str, name: str) -> str:
    mark, context_mark = err.problem_mark, err.context_mark
    if mark is None:
        return f"{name}: not valid YAML: {_yaml_words(str(err))}"
    message = (f"{name}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: "
               f"{_yaml_words(err.problem or 'syntax error')}")
    if err.context and context_mark is not None and \
            (context_mark.line, context_mark.column) != (mark.line, mark.column):
        message += (f" ({_yaml_words(err.context)} at line {context_mark.line + 1}, column "
                    f"{context_mark.column + 1})")
    shown = mark
    lines = text.splitlines()
    if context_mark is not None and (mark.line >= len(lines) or not lines[mark.line].strip()):
        shown = context_mark  # at the end of the text: show where the unclosed thing opened
    return message + _caret_under(text, shown.line, shown.column)


def _yaml_words(text: str) -> str:
    for theirs, ours in _YAML_WORDS:
        text = text.replace(theirs, ours)
    return text


def _line_and_column(text: str, position: int) -> tuple[int, int]:
    line = text.count("\n", 0, position)
    return line, position - (text.rfind("\n", 0, position) + 1)


def _caret_under(text: str, line: int, column: int) -> str:
    """Two more lines: line ``line`` of ``text`` (cut around the column) and a caret under it."""
    lines = text.splitlines()
    if line >= len(lines) or not lines[line].strip():
        return ""
    start = max(0, column - _YAML_LINE_SHOWN)
    shown = lines[line][start:column + _YAML_LINE_SHOWN]
    before = "..." if start else ""
    after = "..." if column + _YAML_LINE_SHOWN < len(lines[line]) else ""
    shown = "".join(char if char.isprintable() or char == "\t" else "\ufffd" for char in shown)
    pad = "".join("\t" if char == "\t" else " " for char in before + shown[:column - start])
    return f"\n  {before}{shown}{after}\n  {pad}^"


def parse_config(data: dict[str, Any] | str | None, *,
                 source: str | None = None) -> PipelineConfig:
    """Validate a mapping (e.g. parsed YAML), or YAML text, into a :class:`PipelineConfig`.

    Parameters
    ----------
    data
        Nested mapping with the sections of :class:`PipelineConfig`, or the YAML text of one;
        ``None`` gives the defaults.
    source
        Name of where the mapping came from, used in error messages; by default ``<config>``
        (a mapping) or ``<config text>`` (YAML text).

    Returns
    -------
    PipelineConfig
        The validated configuration with every default filled in.

    Raises
    ------
    ConfigError
        One line per problem, sorted by key and counted on the first line when there are
        several, each naming the key (``compute.scheduler``), what was expected and the value
        found; for YAML text that does not parse, the line, column and a caret under it.

    Examples
    --------
    >>> parse_config({"selection": {"method": "nmad"}}).selection.method
    'nmad'
    >>> try:
    ...     parse_config({"arcs": {"height_range": 200}}, source="run.yaml")
    ... except ConfigError as err:
    ...     print(err)
    run.yaml: arcs.height_range: expected a list of two numbers, found 200
    """
    if isinstance(data, str):
        source = source or "<config text>"
        data = _read_yaml(data, name=source)
    source = source or "<config>"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections (input, selection, ..., "
                          f"compute), found {_shown(data)}")
    try:
        config = PipelineConfig.model_validate(data)
        errors = []
    except ValidationError as err:
        config, errors = None, err.errors()
    problems = _problems(errors, data, PipelineConfig)
    if len(problems) == 1:
        raise ConfigError(f"{source}: {problems[0]}")
    if problems:
        raise ConfigError(f"{source}: {len(problems)} problems in the configuration:\n  "
                          + "\n  ".join(problems))
    assert config is not None  # validation failed only with problems, each raised above
    return config


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
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: expected UTF-8 text, found {err.reason} at byte "
                          f"{err.start}") from None
    data = _read_yaml(text, name=str(path))
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
