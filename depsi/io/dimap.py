"""SNAP BEAM-DIMAP products (``NAME.dim`` + ``NAME.data/``): read a coregistered stack lazily
with its orbits (the writer, for fixtures and ``depsi simulate``, is :mod:`depsi.io.dimap_writer`).

Layout, as SNAP's DIMAP writer (``DimapHeaderWriter``, ``DimapProductWriter``, ``EnviHeader`` of
senbox-org/snap-engine) makes it: ``NAME.dim`` is an XML ``Dimap_Document`` with
``Raster_Dimensions`` (``NCOLS``, ``NROWS``, ``NBANDS``), ``Data_Access`` (one ``Data_File`` per
band, ``DATA_FILE_PATH href="NAME.data/BAND.hdr"`` and ``BAND_INDEX``; one
``Tie_Point_Grid_File`` per grid under ``NAME.data/tie_point_grids/``), ``Tie_Point_Grids``
(``Tie_Point_Grid_Info``: ``TIE_POINT_GRID_NAME``, ``NCOLS``, ``NROWS``, ``OFFSET_X/Y``,
``STEP_X/Y``), ``Image_Interpretation`` (one ``Spectral_Band_Info`` per band: ``BAND_INDEX``,
``BAND_NAME``, ``DATA_TYPE``, ``PHYSICAL_UNIT``, ``SCALING_FACTOR/OFFSET``,
``NO_DATA_VALUE_USED``, ``NO_DATA_VALUE``, ``VIRTUAL_BAND``) and ``Dataset_Sources`` holding the
metadata tree as ``MDElem``/``MDATTR`` elements (``Abstracted_Metadata`` with
``Orbit_State_Vectors/orbit_vectorN``; ``Slave_Metadata`` with ``Master_bands`` and one element
per secondary with its ``Slave_bands`` and orbit). Each band is an ENVI pair ``BAND.img`` (raw,
one band, band-sequential, big-endian) and ``BAND.hdr`` (``samples``, ``lines``, ``bands``, ``header
offset``, ``data type`` 1/2/3/4/5/12, ``byte order`` 1 = big-endian, as Java writes it). UTC
values are ``ProductData.UTC`` text, ``19-MAR-2023 05:50:35.812250`` (English month, upper case,
microseconds). Tie-point grids are read as the znap reader reads SNAP's: rows at the line
indices, columns at pixel centres (:data:`depsi.io.znap.SNAP_TIE_POINT_CENTRE`, measured on the
real SNAP pair).

Where the public sources are silent, the plain reading is taken:

- a ``.hdr`` without ``byte order`` is big-endian (SNAP always writes 1 and reads every band
  file as big-endian, so another byte order is refused) and without ``header offset`` has
  none; the ``.dim``'s ``DATA_TYPE`` names the sample type, the ``.hdr``'s ``data type`` must
  agree with it;
- a secondary's orbit is the ``Slave_Metadata`` element whose ``Slave_bands`` lists its I band,
  else the one whose name ends in its date (``..._19Mar2023``), else the one whose
  ``first_line_time`` falls on its date;
- a date present in several products (pair products of snap2stamps repeat the mother) is read
  from the first product only when it is the mother; any other repeat is an error.
"""

from __future__ import annotations

import logging
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize

from depsi.conventions import MONTH_ABBREVIATIONS, MONTH_NUMBERS, SPEED_OF_LIGHT
from depsi.geometry import GeometryError, LookSide, Orbit, RadarGrid, StackGeometry
from depsi.io.bounded import MAX_XML_BYTES, MetadataError, parse_xml, read_bounded_text
from depsi.io.metadata import WAVELENGTH_RANGE
from depsi.io.raster import RASTER_DIMS, _chunks, _finish, _iq_to_complex64, _path_list, _raster
from depsi.io.raster_geometry import attach_geometry
from depsi.io.znap import _SNAP_BAND, SNAP_TIE_POINT_CENTRE, _snap_date, _tie_point_raster

logger = logging.getLogger(__name__)

#: Numpy sample type of each DIMAP ``DATA_TYPE`` (big-endian, as SNAP writes them).
DIMAP_DTYPES = {"int8": ">i1", "uint8": ">u1", "int16": ">i2", "uint16": ">u2",
                "int32": ">i4", "uint32": ">u4", "float32": ">f4", "float64": ">f8"}
#: ENVI ``data type`` codes SNAP writes for each DIMAP ``DATA_TYPE`` (``EnviHeader``).
ENVI_TYPE_CODES = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 12, "int32": 3,
                   "uint32": 3, "float32": 4, "float64": 5}

DimapGeometryMode = Literal["product", "orbits"]


# ----------------------------------------------------------------------------------------------
# Small readers: UTC text, MDElem trees, ENVI headers
# ----------------------------------------------------------------------------------------------

#: Largest ENVI ``.hdr`` read, in bytes: a real one is a few kB (band names, map info).
MAX_HDR_BYTES = 1 * 2**20
_NON_SPACE = re.compile(r"\S")

_UTC = re.compile(r"\s*(\d{1,2})-([A-Za-z]{3})-(\d{4})\s+(\d{1,2}):(\d{2}):(\d{2})"
                  r"(?:\.(\d{1,6}))?\s*")


def _parse_utc(text: str | None, what: str) -> np.datetime64:
    """``19-MAR-2023 05:50:35.812250`` (SNAP's ``ProductData.UTC``) -> ``datetime64[ns]``.

    Examples
    --------
    >>> _parse_utc("19-MAR-2023 05:50:35.81225", "t")
    np.datetime64('2023-03-19T05:50:35.812250000')
    """
    match = _UTC.fullmatch(text or "")
    month = MONTH_NUMBERS.get(match.group(2).lower()) if match else None
    if month is None or match is None:
        raise MetadataError(f"{what}: expected a UTC time such as '19-MAR-2023 05:50:35.812250', "
                            f"found {text!r}")
    day, _, year, hour, minute, second, fraction = match.groups()
    stamp = np.datetime64(f"{int(year):04d}-{month:02d}-{int(day):02d}T{int(hour):02d}:"
                          f"{minute}:{second}", "ns")
    return stamp + np.timedelta64(int((fraction or "0").ljust(6, "0")), "us")


def _md_child(element: ET.Element | None, name: str) -> ET.Element | None:
    if element is None:
        return None
    return next((e for e in element.findall("MDElem") if e.get("name") == name), None)


def _md_attrs(element: ET.Element | None) -> dict[str, str]:
    if element is None:
        return {}
    return {name: (a.text or "").strip() for a in element.findall("MDATTR")
            if (name := a.get("name")) is not None}


def _md_float(attrs: dict[str, str], name: str, what: str) -> float:
    try:
        return float(attrs[name])
    except (KeyError, ValueError):
        raise MetadataError(f"{what}: field {name!r}: expected a number, found "
                            f"{attrs.get(name, 'no such field')!r}") from None


def _read_envi_header(path: Path) -> dict[str, str]:
    """``key = value`` pairs of an ENVI ``.hdr`` (braced values may span lines), lower-cased."""
    try:
        text = read_bounded_text(path, what="ENVI header", max_bytes=MAX_HDR_BYTES)
    except FileNotFoundError:
        raise FileNotFoundError(f"ENVI header '{path}': expected a file, found none") from None
    if not text.lstrip().startswith("ENVI"):
        raise ValueError(f"ENVI header '{path}': expected a first line 'ENVI', found "
                         f"{text.splitlines()[0] if text else ''!r}")
    return _envi_fields(text)


def _envi_fields(text: str) -> dict[str, str]:
    """``key = value`` pairs of ENVI header text, in one pass of ``str.find``.

    The same as ``re.finditer(r"^\\s*([^=\\n]+?)\\s*=\\s*(\\{[^}]*\\}|[^\\n]*)", re.M)``, whose
    lazy key and unclosed-brace branch rescan the rest of the text at every line.
    """
    fields: dict[str, str] = {}
    size, position = len(text), 0
    no_brace_from = size + 1  # no '}' at or after this index
    while position < size:
        line_end = text.find("\n", position)
        line_end = size if line_end < 0 else line_end
        equals = text.find("=", position, line_end)
        if equals <= position:
            position = line_end + 1
            continue
        found = _NON_SPACE.search(text, equals + 1)
        start = found.start() if found else size
        end = -1
        if start < size and text[start] == "{" and start < no_brace_from:
            end = text.find("}", start)
            if end < 0:
                no_brace_from = start
            else:
                end += 1
        if end < 0:
            end = text.find("\n", start)
            end = size if end < 0 else end
        fields[text[position:equals].strip().lower()] = text[start:end].strip()
        following = text.find("\n", end)
        position = size if following < 0 else following + 1
    return fields


def _header_int(fields: dict[str, str], key: str, path: Path, default: int | None = None) -> int:
    value = fields.get(key)
    if value is None and default is not None:
        return default
    try:
        if value is None:
            raise TypeError
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"ENVI header '{path}': field {key!r}: expected an integer, found "
                         f"{value if value is not None else 'no such field'!r}") from None


# ----------------------------------------------------------------------------------------------
# Reading: the product's bands, checked, and lazy block reads
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _EnviBand:
    """One band file: what a block read needs (a few hundred bytes in the task graph)."""

    path: str
    dtype: str
    offset: int
    scale: float = 1.0
    add: float = 0.0

    def read(self, shape: tuple[int, int], rows: slice, cols: slice) -> np.ndarray:
        mapped = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset,
                           shape=shape)
        block = np.array(mapped[rows, cols])
        del mapped
        if self.scale != 1.0 or self.add != 0.0:
            block = block * self.scale + self.add
        return block


class _DimapStack:
    """Array-like ``(azimuth, range, time)`` over ENVI band files; indexing reads one window.

    ``kind="complex"``: one (I, Q) pair per epoch, returned as complex64. ``kind="real"``: one
    band per epoch (or ``None`` and a fill value), returned as float32.
    """

    def __init__(self, epochs: Sequence[tuple[_EnviBand | None, ...]], shape: tuple[int, int],
                 kind: str, fills: Sequence[float] = ()):
        self.epochs = tuple(tuple(e) for e in epochs)
        self.file_shape = shape
        self.kind = kind
        self.fills = tuple(fills) or (np.nan,) * len(self.epochs)
        self.dtype = np.dtype(np.complex64 if kind == "complex" else np.float32)
        self.shape = (*shape, len(self.epochs))
        self.ndim = 3

    def __dask_tokenize__(self) -> tuple:
        files = [b.path for e in self.epochs for b in e if b is not None]
        stats = [(os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in files]
        return ("depsi.io.dimap._DimapStack", self.kind, self.epochs, stats, self.file_shape,
                self.fills)

    def __getitem__(self, key: tuple[slice, slice, slice]) -> np.ndarray:
        rows, cols, epochs = key
        n_rows = len(range(self.file_shape[0])[rows])
        n_cols = len(range(self.file_shape[1])[cols])
        chosen = list(zip(self.epochs, self.fills))[epochs]
        out = np.empty((n_rows, n_cols, len(chosen)), dtype=self.dtype)
        for k, (bands, fill) in enumerate(chosen):
            if self.kind == "complex":
                # a complex epoch always holds its I and its Q band
                real, imag = (cast(_EnviBand, b).read(self.file_shape, rows, cols) for b in bands)
                out[:, :, k] = _iq_to_complex64(real, imag)
            elif bands[0] is None:
                out[:, :, k] = fill
            else:
                out[:, :, k] = bands[0].read(self.file_shape, rows, cols)
        return out


@dataclass(frozen=True)
class _Product:
    path: Path
    shape: tuple[int, int]
    bands: dict[str, _EnviBand]
    tie_points: dict[str, dict[str, Any]]
    abstracted: ET.Element | None
    secondaries: tuple[ET.Element, ...]
    master_bands: str


def _text(element: ET.Element, tag: str) -> str | None:
    found = element.find(tag)
    return None if found is None or found.text is None else found.text.strip()


def _int_field(element: ET.Element, tag: str, what: str) -> int:
    value = _text(element, tag)
    try:
        if value is None:
            raise TypeError
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: field {tag!r}: expected an integer, found "
                         f"{value if value is not None else 'no such field'!r}") from None


def _float_field(element: ET.Element, tag: str, what: str, default: float | None = None
                 ) -> float:
    value = _text(element, tag)
    if value is None and default is not None:
        return default
    try:
        if value is None:
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: field {tag!r}: expected a number, found "
                         f"{value if value is not None else 'no such field'!r}") from None


def _check_envi(hdr: Path, what: str, *, data_type: str, shape: tuple[int, int]) -> _EnviBand:
    """The band file beside ``hdr``, checked against the ``.dim`` before any pixel is read."""
    fields = _read_envi_header(hdr)
    where = f"{what} file '{hdr}'"
    for key, expected in (("samples", shape[1]), ("lines", shape[0]), ("bands", 1)):
        found = _header_int(fields, key, hdr)
        if found != expected:
            source = {"samples": "NCOLS", "lines": "NROWS", "bands": "one band per file"}[key]
            raise ValueError(f"{where}: field {key!r}: expected {expected} ({source} of the "
                             f".dim), found {found}")
    code = _header_int(fields, "data type", hdr)
    if code != ENVI_TYPE_CODES[data_type]:
        raise ValueError(f"{where}: field 'data type': expected {ENVI_TYPE_CODES[data_type]} "
                         f"(DATA_TYPE {data_type} of the .dim), found {code}")
    order = _header_int(fields, "byte order", hdr, default=1)
    if order != 1:
        # SNAP writes every band big-endian and reads it so: a .hdr that says otherwise
        # disagrees with the product, and following it would byte-swap the band in silence
        raise ValueError(f"{where}: field 'byte order': expected 1 (big-endian, as BEAM-DIMAP "
                         f"band files are written and read), found {order}")
    interleave = fields.get("interleave", "bsq").lower()
    if interleave not in ("bsq", "bil", "bip"):
        raise ValueError(f"{where}: field 'interleave': expected bsq, found {interleave!r}")
    offset = _header_int(fields, "header offset", hdr, default=0)
    dtype = np.dtype(DIMAP_DTYPES[data_type])
    image = hdr.with_suffix(".img")
    if not image.is_file():
        raise FileNotFoundError(f"{what}: expected the image file '{image}' beside '{hdr}', "
                                "found no such file")
    expected = offset + shape[0] * shape[1] * dtype.itemsize
    size = image.stat().st_size
    if size != expected:
        raise ValueError(f"{what} file '{image}': expected {expected} bytes ({shape[0]} lines x "
                         f"{shape[1]} samples of {dtype.itemsize}-byte {data_type}"
                         f"{f' after a {offset}-byte header' if offset else ''}), found {size}")
    return _EnviBand(str(image), dtype.str, offset)


def _inside_product(path: Path, href: str, field: str) -> Path:
    """The file ``href`` of the ``.dim`` at ``path`` names, refused when it (or the ``.img``
    beside a ``.hdr``), once links are resolved, lies outside the ``.dim``'s folder: a
    product's bands live in its own ``.data`` folder."""
    folder = path.parent.resolve()
    target = path.parent / href
    for file in (target, target.with_suffix(".img")) if target.suffix == ".hdr" else (target,):
        resolved = file.resolve()
        if not resolved.is_relative_to(folder):
            raise ValueError(f"DIMAP product '{path}': field {field!r}: expected a file inside "
                             f"the product's folder '{folder}', found {href!r} resolving to "
                             f"'{resolved}'")
    return target


def _band_table(root: ET.Element, path: Path, shape: tuple[int, int]) -> dict[str, _EnviBand]:
    """Every non-virtual band of the product, by name, with its file checked."""
    files = {}
    for entry in root.findall("Data_Access/Data_File"):
        file_path = entry.find("DATA_FILE_PATH")
        href = None if file_path is None else file_path.get("href")
        index = _text(entry, "BAND_INDEX")
        if href and index is not None:
            files[index] = _inside_product(path, href, "DATA_FILE_PATH href")
    bands = {}
    for info in root.findall("Image_Interpretation/Spectral_Band_Info"):
        name = _text(info, "BAND_NAME")
        what = f"DIMAP product '{path}': band {name!r}"
        if name is None or (_text(info, "VIRTUAL_BAND") or "").lower() == "true":
            continue
        index = _text(info, "BAND_INDEX")
        data_type = (_text(info, "DATA_TYPE") or "").lower()
        if data_type not in DIMAP_DTYPES:
            raise ValueError(f"{what}: field 'DATA_TYPE': expected one of "
                             f"{sorted(DIMAP_DTYPES)}, found {data_type!r}")
        if index not in files:
            raise ValueError(f"{what}: expected a Data_File with BAND_INDEX {index} in "
                             f"Data_Access, found none")
        for tag, expected in (("BAND_RASTER_HEIGHT", shape[0]), ("BAND_RASTER_WIDTH", shape[1])):
            found = _int_field(info, tag, what) if _text(info, tag) is not None else expected
            if found != expected:
                raise ValueError(f"{what}: field {tag!r}: expected {expected} (NROWS/NCOLS of "
                                 f"the .dim), found {found}")
        band = _check_envi(files[index], what, data_type=data_type, shape=shape)
        scale = _float_field(info, "SCALING_FACTOR", what, 1.0)
        add = _float_field(info, "SCALING_OFFSET", what, 0.0)
        bands[name] = _EnviBand(band.path, band.dtype, band.offset, scale, add)
    return bands


def _tie_point_table(root: ET.Element, path: Path) -> dict[str, dict[str, Any]]:
    """Tie-point grids by name: values, offset and subsampling as ``_tie_point_raster`` wants."""
    files = {}
    for entry in root.findall("Data_Access/Tie_Point_Grid_File"):
        file_path = entry.find("TIE_POINT_GRID_FILE_PATH")
        href = None if file_path is None else file_path.get("href")
        index = _text(entry, "TIE_POINT_GRID_INDEX")
        if href and index is not None:
            files[index] = _inside_product(path, href, "TIE_POINT_GRID_FILE_PATH href")
    grids = {}
    for info in root.findall("Tie_Point_Grids/Tie_Point_Grid_Info"):
        name = _text(info, "TIE_POINT_GRID_NAME")
        index = _text(info, "TIE_POINT_GRID_INDEX")
        if name not in ("latitude", "longitude"):
            continue
        what = f"DIMAP product '{path}': tie-point grid {name!r}"
        if index not in files:
            raise ValueError(f"{what}: expected a Tie_Point_Grid_File with TIE_POINT_GRID_INDEX "
                             f"{index} in Data_Access, found none")
        shape = (_int_field(info, "NROWS", what), _int_field(info, "NCOLS", what))
        data_type = (_text(info, "DATA_TYPE") or "float32").lower()
        if data_type not in DIMAP_DTYPES:
            raise ValueError(f"{what}: field 'DATA_TYPE': expected one of "
                             f"{sorted(DIMAP_DTYPES)}, found {data_type!r}")
        band = _check_envi(files[index], what, data_type=data_type, shape=shape)
        values = band.read(shape, slice(None), slice(None)).astype(np.float64)
        if min(shape) < 2 or not np.isfinite(values).all():
            raise ValueError(f"{what}: expected a finite grid of at least 2 x 2 points, found "
                             f"shape {shape} with {int((~np.isfinite(values)).sum())} "
                             "non-finite value(s)")
        grids[name] = {"grid": values,
                       "offset": (_float_field(info, "OFFSET_Y", what),
                                  _float_field(info, "OFFSET_X", what)),
                       "subsampling": (_float_field(info, "STEP_Y", what),
                                       _float_field(info, "STEP_X", what))}
    return grids


def _open_product(path: Path) -> _Product:
    """Parse and check one ``.dim`` and every band file it names; no pixel is read."""
    if not path.is_file():
        raise FileNotFoundError(f"DIMAP product '{path}': expected a .dim file, found none")
    try:
        root = parse_xml(path, what="DIMAP product", max_bytes=MAX_XML_BYTES)
    except ET.ParseError as err:
        raise ValueError(f"DIMAP product '{path}': expected a Dimap_Document XML file, found "
                         f"unreadable XML ({err})") from None
    if root.tag != "Dimap_Document":
        raise ValueError(f"DIMAP product '{path}': expected a Dimap_Document root element, "
                         f"found {root.tag!r}")
    what = f"DIMAP product '{path}': Raster_Dimensions"
    dims = root.find("Raster_Dimensions")
    if dims is None:
        raise ValueError(f"{what}: expected the element, found none")
    shape = (_int_field(dims, "NROWS", what), _int_field(dims, "NCOLS", what))
    if min(shape) < 1:
        raise ValueError(f"{what}: expected positive NROWS and NCOLS, found {shape}")
    metadata = next((e for e in root.findall("Dataset_Sources/MDElem")
                     if e.get("name") == "metadata"), None)
    abstracted = _md_child(metadata, "Abstracted_Metadata")
    if abstracted is None:
        abstracted = root.find(".//MDElem[@name='Abstracted_Metadata']")
    slave = _md_child(metadata, "Slave_Metadata")
    if slave is None:
        slave = root.find(".//MDElem[@name='Slave_Metadata']")
    return _Product(path=path, shape=shape, bands=_band_table(root, path, shape),
                    tie_points=_tie_point_table(root, path), abstracted=abstracted,
                    secondaries=tuple(slave.findall("MDElem")) if slave is not None else (),
                    master_bands=_md_attrs(slave).get("Master_bands", ""))


@dataclass(frozen=True)
class _Epoch:
    date: np.datetime64
    product: _Product
    i: str
    q: str
    h2ph: str | None
    role: str | None


def _product_epochs(product: _Product, polarisation: str) -> list[_Epoch]:
    by_date: dict[str, dict[str, str]] = {}
    roles: dict[str, str | None] = {}
    for name in product.bands:
        match = _SNAP_BAND.match(name)
        if not match or match["pol"] != polarisation:
            continue
        kinds = by_date.setdefault(match["date"], {})
        if match["kind"] in kinds:
            raise ValueError(f"DIMAP product '{product.path}': expected one {match['kind']!r} "
                             f"band per date, found {kinds[match['kind']]!r} and {name!r}")
        kinds[match["kind"]] = name
        if match["kind"] != "h2ph":
            roles[match["date"]] = match["role"]
    epochs = []
    for day, kinds in by_date.items():
        if "i" not in kinds and "q" not in kinds:
            logger.info("DIMAP product %s: band %s has no I/Q bands beside it; skipped",
                        product.path, kinds.get("h2ph"))
            continue
        for part, other in (("i", "q"), ("q", "i")):
            if part not in kinds:
                present = kinds[other]
                raise ValueError(f"DIMAP product '{product.path}': expected band "
                                 f"{part + present[1:]!r} beside {present!r}, found no such "
                                 "band")
        epochs.append(_Epoch(_snap_date(day, f"band {kinds['i']!r} of '{product.path}'"),
                             product, kinds["i"], kinds["q"], kinds.get("h2ph"), roles[day]))
    return epochs


def _mother_date(product: _Product, epochs: Sequence[_Epoch]) -> np.datetime64 | None:
    """The mother's date: Slave_Metadata/Master_bands, an 'mst' band, or first_line_time."""
    found = re.search(r"\d{2}[A-Za-z]{3}\d{4}", product.master_bands)
    if found:
        return _snap_date(found.group(0), f"'{product.path}': Slave_Metadata/Master_bands")
    mst = [e.date for e in epochs if e.role == "mst"]
    if mst:
        return mst[0]
    first_line = _md_attrs(product.abstracted).get("first_line_time")
    if first_line:
        moment = _parse_utc(first_line, f"'{product.path}': Abstracted_Metadata")
        return moment.astype("datetime64[D]").astype("datetime64[ns]")
    return None


def _wavelength(product: _Product) -> float:
    what = f"DIMAP product '{product.path}': Abstracted_Metadata"
    if product.abstracted is None:
        raise MetadataError(f"{what}: expected the element (for the radar frequency), found none",
                            paths=[str(product.path)])
    frequency = _md_float(_md_attrs(product.abstracted), "radar_frequency", what)
    wavelength = SPEED_OF_LIGHT / (frequency * 1e6)  # SNAP states MHz
    if not WAVELENGTH_RANGE[0] < wavelength < WAVELENGTH_RANGE[1]:
        raise MetadataError(f"{what}: field 'radar_frequency': expected a radar frequency in "
                            f"MHz, found {frequency!r} (a wavelength of {wavelength:g} m)",
                            paths=[str(product.path)])
    return wavelength


def _collect_epochs(products: Sequence[_Product], polarisation: str
                    ) -> tuple[list[_Epoch], np.datetime64 | None]:
    mothers = {}
    epochs: list[_Epoch] = []
    for product in products:
        found = _product_epochs(product, polarisation)
        mothers[product.path] = _mother_date(product, found)
        epochs += found
    known = {m for m in mothers.values() if m is not None}
    if len(known) > 1:
        raise ValueError("products: expected one coregistration mother for the stack, found "
                         + "; ".join(f"{str(m)[:10]} in '{p}'" for p, m in mothers.items()))
    mother = next(iter(known), None)
    if not epochs:
        found_pols = sorted({m["pol"] for p in products for n in p.bands
                             if (m := _SNAP_BAND.match(n))})
        raise ValueError(f"polarisation: expected I/Q bands of {polarisation!r} in "
                         f"{[str(p.path) for p in products]}, found polarisations {found_pols}")
    kept: dict[np.datetime64, _Epoch] = {}
    for epoch in epochs:
        other = kept.get(epoch.date)
        if other is None:
            kept[epoch.date] = epoch
        elif epoch.date != mother:
            raise ValueError(f"dates: expected one epoch per date, found {str(epoch.date)[:10]} "
                             f"in band {other.i!r} of '{other.product.path}' and band "
                             f"{epoch.i!r} of '{epoch.product.path}'")
    return sorted(kept.values(), key=lambda e: e.date), mother


# ----------------------------------------------------------------------------------------------
# Reading: the geometry (orbits, radar grid)
# ----------------------------------------------------------------------------------------------

def _orbit(element: ET.Element | None, what: str) -> Orbit:
    vectors = _md_child(element, "Orbit_State_Vectors")
    if vectors is None:
        raise GeometryError(f"{what}: expected Orbit_State_Vectors, found none")
    times, states = [], []
    for vector in vectors.findall("MDElem"):
        attrs = _md_attrs(vector)
        where = f"{what}/Orbit_State_Vectors/{vector.get('name')}"
        times.append(_parse_utc(attrs.get("time"), f"{where}: field 'time'"))
        states.append([_md_float(attrs, k, where)
                       for k in ("x_pos", "y_pos", "z_pos", "x_vel", "y_vel", "z_vel")])
    if not times:
        raise GeometryError(f"{what}: Orbit_State_Vectors: expected state vectors, found none")
    order = np.argsort(np.array(times), kind="stable")
    reference = times[order[0]]
    seconds = np.array([(times[i] - reference) / np.timedelta64(1, "ns") * 1e-9 for i in order])
    ordered = np.array([states[i] for i in order])
    return Orbit(reference=reference, time=seconds, position=ordered[:, :3],
                 velocity=ordered[:, 3:], source=what)


def _secondary_element(product: _Product, epoch: _Epoch) -> ET.Element:
    day = np.datetime_as_string(epoch.date, "D")
    tag = f"{day[8:10]}{MONTH_ABBREVIATIONS[int(day[5:7]) - 1]}{day[:4]}"
    for element in product.secondaries:
        if epoch.i in _md_attrs(element).get("Slave_bands", "").split():
            return element
    for element in product.secondaries:
        if (element.get("name") or "").endswith("_" + tag):
            return element
    for element in product.secondaries:
        first_line = _md_attrs(element).get("first_line_time")
        if first_line and str(_parse_utc(first_line, "first_line_time"))[:10] == day:
            return element
    raise GeometryError(f"DIMAP product '{product.path}': Slave_Metadata: expected an element "
                        f"for band {epoch.i!r} (its Slave_bands, a name ending in _{tag} or a "
                        f"first_line_time on {day}), found "
                        f"{[e.get('name') for e in product.secondaries]}")


#: SNAP's MJD2000 seconds (BurstBoundary FirstLineTime) count from this UTC instant.
_MJD2000 = np.datetime64("2000-01-01T00:00:00", "ns")


def _burst_line_time(abstracted: ET.Element | None, attrs: dict[str, str], what: str
                     ) -> np.datetime64:
    """Line 0's time from the burst holding the subset's first line, where the product records
    its bursts (``BurstBoundary``), else ``first_line_time``: SNAP's subset ``first_line_time``
    of a TOPS burst is 1.2 lines late on the real pair (as ``slc._snap_line_time`` reads it)."""
    stated = _parse_utc(attrs.get("first_line_time"), f"{what}: field 'first_line_time'")
    boundary = _md_child(abstracted, "BurstBoundary")
    if boundary is None:
        return stated
    try:
        offset = float(attrs.get("subset_offset_y") or 0)
        interval = float(attrs["line_time_interval"])
        for swath in boundary.findall("MDElem"):
            for burst in swath.findall("MDElem"):
                fields = _md_attrs(burst)
                first, last = float(fields["FirstLineDeburst"]), float(fields["LastLineDeburst"])
                if first <= offset <= last:
                    seconds = float(fields["FirstLineTime"]) + (offset - first) * interval
                    return _MJD2000 + np.timedelta64(int(round(seconds * 1e9)), "ns")
    except (KeyError, ValueError):
        return stated
    return stated


def _radar_grid(product: _Product) -> tuple[RadarGrid, float]:
    what = f"DIMAP product '{product.path}': Abstracted_Metadata"
    attrs = _md_attrs(product.abstracted)
    pointing = attrs.get("antenna_pointing", "right").lower()
    if pointing not in ("right", "left"):
        raise GeometryError(f"{what}: field 'antenna_pointing': expected 'right' or 'left', "
                            f"found {attrs.get('antenna_pointing')!r}")
    grid = RadarGrid(first_line_time=_burst_line_time(product.abstracted, attrs, what),
                     line_interval=_md_float(attrs, "line_time_interval", what),
                     near_range=_md_float(attrs, "slant_range_to_first_pixel", what),
                     range_spacing=_md_float(attrs, "range_spacing", what),
                     look_side=cast(LookSide, pointing))
    height = _md_float(attrs, "avg_scene_height", what) if "avg_scene_height" in attrs else 0.0
    return grid, height


def _stack_geometry(epochs: Sequence[_Epoch], mother: np.datetime64 | None,
                    wavelength: float) -> StackGeometry:
    index = [k for k, e in enumerate(epochs) if e.date == mother]
    if not index:
        raise GeometryError(f"geometry: expected the coregistration mother "
                            f"({str(mother)[:10] if mother is not None else 'unknown'}) among "
                            f"the epochs {[str(e.date)[:10] for e in epochs]}, found it absent "
                            "(read with geometry=None for the pixels alone)")
    first = epochs[index[0]].product
    grid, height = _radar_grid(first)
    for product in {e.product.path: e.product for e in epochs}.values():
        other, _ = _radar_grid(product)
        dt = abs((other.first_line_time - grid.first_line_time) / np.timedelta64(1, "ns"))
        if dt > 1e3 or abs(other.near_range - grid.near_range) > 1e-3:
            raise GeometryError(f"products: expected one radar grid for the stack, found "
                                f"first_line_time {other.first_line_time}, near range "
                                f"{other.near_range} m in '{product.path}' and "
                                f"{grid.first_line_time}, {grid.near_range} m in '{first.path}'")
    orbits = []
    for epoch in epochs:
        if epoch.date == mother:
            orbits.append(_orbit(epoch.product.abstracted,
                                 f"'{epoch.product.path}': Abstracted_Metadata"))
        else:
            element = _secondary_element(epoch.product, epoch)
            orbits.append(_orbit(element, f"'{epoch.product.path}': Slave_Metadata/"
                                          f"{element.get('name')}"))
    return StackGeometry(grid=grid, orbits=tuple(orbits), mother=index[0],
                         wavelength=wavelength, height=height)


# ----------------------------------------------------------------------------------------------
# from_dimap
# ----------------------------------------------------------------------------------------------

def from_dimap(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    polarisation: str = "VV",
    geometry: DimapGeometryMode | None = "product",
    chunks: Any = None,
) -> xr.Dataset:
    """Read coregistered SNAP BEAM-DIMAP products into one SLC stack with its geometry.

    Every ``i_<pol>_[mst|slvN_]<date>`` / ``q_...`` pair (also ``i_IW1_VV_mst_19Mar2023``-style
    names) becomes one epoch ``i + 1j * q`` (values as stored, scaled by the band's
    ``SCALING_FACTOR``/``SCALING_OFFSET``: SNAP's no-data value 0 stays 0), read lazily by
    memory-mapped blocks. A coregistered stack holds all dates in one product; pair products or
    one product per date are read together (the mother may repeat). ``h2ph_<pol>_...`` becomes
    ``h2ph`` (the mother gets zeros, a secondary without one NaN, with a warning); the
    ``latitude``/``longitude`` tie-point grids become ``lat``/``lon``, interpolated lazily as
    :func:`depsi.io.znap.from_snap` does. The geometry is the mother's radar grid and orbit from
    ``Abstracted_Metadata`` and each secondary's orbit from its ``Slave_Metadata`` element.

    Parameters
    ----------
    paths
        One or more ``.dim`` files of one coregistered stack.
    polarisation
        Which polarisation's bands to read.
    geometry
        ``"product"``: keep the product's h2ph and lat/lon, compute from the orbits what it
        lacks; ``"orbits"``: compute h2ph and lat/lon from the orbits (the product's stay as
        ``h2ph_product``, ``lat_product``, ``lon_product``); see
        :func:`depsi.io.raster_geometry.attach_geometry`. ``None``: the pixels alone, no geometry.
    chunks
        Block shape as in :func:`depsi.io.binary.from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64) and, when any band has it, ``h2ph`` (float32) on
        ``(azimuth, range, time)``, ``lat``/``lon`` when the product has tie-point grids; attrs
        ``wavelength``, ``polarisation``, ``coregistration_mother_time``,
        ``azimuth_offset``/``range_offset`` (``subset_offset_y/x``) and, with a geometry, those
        of :func:`~depsi.io.raster_geometry.attach_geometry` (``sar_geometry``, ...).

    Raises
    ------
    FileNotFoundError
        A missing ``.dim``, ``.hdr`` or ``.img`` (named).
    ValueError
        A ``.hdr`` whose ``samples``/``lines``/``data type`` disagree with the ``.dim`` or whose
        ``byte order`` is not big-endian, an
        ``.img`` of the wrong size, an I band without its Q band, no band of ``polarisation``,
        a date in two products, products of different mothers.
    MetadataError, GeometryError
        A missing or malformed radar frequency, timing or orbit field (named).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from depsi.geometry import Orbit, RadarGrid, StackGeometry
    >>> from depsi.io.dimap_writer import write_dimap
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(8, 10), n_epochs=2, seed=0, start="2023-03-19",
    ...                           mother_index=0)
    >>> t = np.arange(0.0, 60.0, 10.0)
    >>> def orbit(day, shift):
    ...     return Orbit(np.datetime64(day + "T05:50:00"), t,
    ...                  [[7.0e6 + shift, 7.6e3 * s, 0.0] for s in t], [[0.0, 7.6e3, 0.0]] * 6)
    >>> geometry = StackGeometry(RadarGrid("2023-03-19T05:50:30", 2e-3, 8.0e5, 2.3),
    ...                          (orbit("2023-03-19", 0.0), orbit("2023-03-31", 50.0)), 0,
    ...                          stack.attrs["wavelength"])
    >>> path = write_dimap(pathlib.Path(tempfile.mkdtemp()) / "stack.dim", stack, geometry)
    >>> ds = from_dimap(path)
    >>> dict(ds.sizes), str(ds.time.values[1])[:10], bool((ds.complex == stack.complex).all())
    ({'azimuth': 8, 'range': 10, 'time': 2}, '2023-03-31', True)
    """
    if not isinstance(polarisation, str) or not re.fullmatch(r"[HV]{2}", polarisation):
        raise ValueError(f"polarisation: expected one of 'VV', 'VH', 'HH', 'HV', "
                         f"found {polarisation!r}")
    if geometry not in ("product", "orbits", None):
        raise ValueError(f"geometry: expected 'product', 'orbits' or None, found {geometry!r}")
    products = [_open_product(p) for p in _path_list(paths, "paths")]
    shapes = {str(p.path): p.shape for p in products}
    shape = products[0].shape
    if any(s != shape for s in shapes.values()):
        raise ValueError(f"products: expected one raster size (NROWS, NCOLS) for all products, "
                         f"found {shapes}")
    wavelengths = {str(p.path): _wavelength(p) for p in products}
    wavelength = next(iter(wavelengths.values()))
    if any(abs(w - wavelength) > 1e-5 * wavelength for w in wavelengths.values()):
        raise MetadataError("wavelength: expected one radar wavelength for the stack, found "
                            + "; ".join(f"{w:.6f} m in '{p}'" for p, w in wavelengths.items()),
                            paths=list(wavelengths))
    epochs, mother = _collect_epochs(products, polarisation)
    stack_geometry = (None if geometry is None
                      else _stack_geometry(epochs, mother, wavelength))

    block = _chunks(chunks, shape, len(epochs))
    pixels = _DimapStack([(e.product.bands[e.i], e.product.bands[e.q]) for e in epochs], shape,
                         "complex")
    data = da.from_array(pixels, chunks=block, lock=False, fancy=False, asarray=False,
                         meta=np.empty((0, 0, 0), dtype=np.complex64),
                         name="from_dimap-" + tokenize(pixels))
    reference = _md_attrs(next((p.abstracted for p in products if p.abstracted is not None),
                               None))

    def offset(name: str) -> int | None:
        return int(float(reference[name])) if name in reference else None

    attrs = {"wavelength": wavelength, "polarisation": polarisation,
             "coregistration_mother_time": None if mother is None else str(mother)[:10],
             "azimuth_offset": offset("subset_offset_y"),
             "range_offset": offset("subset_offset_x")}
    out = _raster(data, np.array([e.date for e in epochs], dtype="datetime64[ns]"), attrs)
    if any(e.h2ph is not None for e in epochs):
        fills = []
        for e in epochs:
            if e.h2ph is None and e.date != mother:
                logger.warning("DIMAP product %s: no h2ph band for %s: h2ph is NaN for this "
                               "date", e.product.path, str(e.date)[:10])
            fills.append(0.0 if e.date == mother else np.nan)
        factors = _DimapStack([(e.product.bands[e.h2ph] if e.h2ph else None,) for e in epochs],
                              shape, "real", fills)
        out["h2ph"] = (RASTER_DIMS, da.from_array(
            factors, chunks=block, lock=False, fancy=False, asarray=False,
            meta=np.empty((0, 0, 0), dtype=np.float32),
            name="from_dimap-h2ph-" + tokenize(factors)))
    geo = next((p for p in products if {"latitude", "longitude"} <= set(p.tie_points)), None)
    if geo is not None:
        for name, coord in (("latitude", "lat"), ("longitude", "lon")):
            tie_points = geo.tie_points[name] | {"centre": SNAP_TIE_POINT_CENTRE}
            out = out.assign_coords({coord: (("azimuth", "range"),
                                             _tie_point_raster(tie_points, shape, block[:2]))})
    else:
        logger.warning("DIMAP products %s have no latitude/longitude tie-point grids: no lat/lon",
                       [str(p.path) for p in products])
    out = _finish(out, "depsi.io.dimap.from_dimap", lazy_coords=("lat", "lon"))
    if stack_geometry is None or geometry is None:
        return out
    return attach_geometry(out, stack_geometry, mode=geometry)


__all__ = ["DIMAP_DTYPES", "ENVI_TYPE_CODES", "from_dimap"]
