"""Read ISCE2 topsStack / stripmapStack folders: coregistered SLCs, geometry, orbits.

:func:`from_isce2` opens a stack's merged SLCs lazily with its ``geom_reference`` rasters and the
orbits and timing of its product XMLs; the writer (fixtures, ``depsi simulate``) is
:mod:`depsi.io.isce2_writer`.

Layout, as learnt from public sources (isce-framework/isce2 at b7702cf, insarlab/MintPy at
06a9862); every file name below is what these write or read:

- ``merged/SLC/YYYYMMDD/YYYYMMDD.slc.full`` (topsStack, ``.slc`` when merged without looks and
  in stripmapStack): raw complex64 (``CFLOAT``) lines, one file per date, with ``.xml`` (ISCE
  image header, ``isceobj/Image/Image.py`` ``renderHdr``: root ``imageFile``, properties
  ``width``, ``length``, ``number_bands``, ``data_type``, ``scheme``, ``byte_order``) and ``.vrt``
  (``renderVRT``: ``VRTRawRasterBand`` with image/pixel/line offsets per scheme).
  topsStack's ``mergeBursts.py`` writes the raw file only without virtual merging
  (``stackSentinel.py --virtual_merge False``, its default for the SLC workflow); with it the
  ``.vrt`` is a mosaic of burst files, which this reader does not follow.
- ``merged/geom_reference/{lat,lon,hgt}.rdr[.full]`` (``DOUBLE``) and ``los.rdr[.full]``
  (``FLOAT``, 2 bands, ``BIL``): ``zerodop/topozero/Topozero.py``. Band 1 of ``los`` is the
  incidence angle from the vertical at the target, band 2 the azimuth of the target-to-satellite
  vector, from north, anticlockwise (Topozero's own description; MintPy
  ``utils0.azimuth2heading_angle``).
- ``reference/IW*.xml``, ``secondarys/YYYYMMDD/IW*.xml``: TOPS swath products dumped by
  ``iscesys/Component/ProductManager.py`` through ``iscesys/Dumpers/XmlDumper.py``: root
  ``productmanager_name``, ``component[@name='instance']/component[@name='bursts']/
  component[@name='burstN']`` (``TraitSeq`` names, 1-based) with properties named as the
  public names of ``isceobj/Sensor/TOPS/BurstSLC.py`` lower-cased without spaces
  (``sensingstart``, ``sensingstop``, ``azimuthtimeinterval``, ``startingrange``,
  ``rangepixelsize``, ``numberofsamples``, ``numberoflines``, ``radarwavelength``), and
  ``component[@name='orbit']/component[@name='state_vectors']/component[@name='statevectorN']``
  with ``time``, ``position``, ``velocity`` (``isceobj/Orbit/Orbit.py``). The dumper sorts the
  keys of each component as strings (``statevector10`` before ``statevector2``); datetimes are
  Python's ``str(datetime)``, ``YYYY-MM-DD HH:MM:SS[.ffffff]``; lists are ``str(list)``.
  The path ``/productmanager_name/component[@name="instance"]/component[@name="bursts"]/
  component[@name="burst1"]/property[@name="burststartutc"]`` is how public MinSAR scripts
  read these files with xmllint.
- The merged grid (``topsStack/mergeBursts.py`` ``mergeBurstsVirtual``, ``VRTManager.py``):
  line 0 at the earliest ``sensingstart`` of the reference swaths, line interval the
  ``azimuthtimeinterval`` of that swath, sample 0 at the smallest ``startingrange``, spacing the
  ``rangepixelsize`` of that swath; ``length = round((last sensingstop - first sensingstart) /
  dt) + 1``, ``width = round((farthest far range - nearest range) / dr) + 1``.
- ``baselines/REF_SEC/REF_SEC.txt`` (topsStack ``computeBaseline.py``: per swath ``swath: IWn``,
  ``Bperp (average): ...``, ``Bpar (average): ...``) or ``baselines/REF_SEC.txt`` (stripmapStack
  ``Stack.py``: ``PERP_BASELINE_BOTTOM``/``PERP_BASELINE_TOP``), read as MintPy's
  ``isce_utils.read_tops_baseline``/``read_stripmap_baseline`` do; ``merged/baselines/DATE/DATE``
  is a coarse float32 Bperp grid (``baselineGrid.py``). ISCE's sign of Bperp is
  ``sign((target - P_ref) x (P_sec - P_ref) . V_ref)``: for a right-looking radar that is minus
  depsi's ``bperp`` (:func:`depsi.geometry.baselines`), for a left-looking one the same.

Where the sources are silent, the plain reading (each also said where it is used): the orbit of
a date is that of the first burst of its lowest-numbered swath (ISCE: "for now all bursts have
same state vectors"); topsStack is Sentinel-1, right-looking; stripmapStack keeps its metadata
in Python shelves of pickled ISCE objects (``referenceShelve/data.dat``), which need ISCE itself
to load and are not read.
"""

from __future__ import annotations

import logging
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize

from depsi.errors import BadInputError
from depsi.geometry import GeometryError, GeometryMode, Orbit, RadarGrid, StackGeometry
from depsi.io.bounded import MAX_XML_BYTES, parse_xml, read_bounded_text
from depsi.io.raster import RASTER_DIMS, _BinaryStack, _chunks, _epochs, _file_dtype, _raster
from depsi.io.raster_geometry import attach_geometry
from depsi.stm.schema import validate

logger = logging.getLogger(__name__)

#: ISCE image ``data_type`` names and their NumPy types (``isceobj/Image/Image.py`` TO_NUMPY).
ISCE_DTYPES = {"BYTE": "i1", "SHORT": "i2", "INT": "i4", "LONG": "i8", "FLOAT": "f4",
               "DOUBLE": "f8", "CFLOAT": "c8", "CDOUBLE": "c16"}
#: The same types as GDAL names them in ISCE's ``.vrt`` files (``Image.renderVRT``).
VRT_DTYPES = {"BYTE": "Byte", "SHORT": "Int16", "INT": "Int32", "FLOAT": "Float32",
              "DOUBLE": "Float64", "CFLOAT": "CFloat32", "CDOUBLE": "CFloat64"}

#: Largest ISCE2 baseline text file read, in bytes: a real one holds a few lines.
MAX_BASELINE_BYTES = 1 * 2**20

_DATE_DIR = re.compile(r"^\d{8}$")
_PAIR = re.compile(r"^(\d{8})_(\d{8})$")
_SWATH_XML = re.compile(r"^IW(\d)\.xml$")
_NUMBERED = re.compile(r"^(\D*)(\d+)$")


class ISCE2Error(BadInputError, ValueError):
    """An ISCE2 stack file is missing a field or disagrees with another; the message names it."""


# ----------------------------------------------------------------------------------------------
# ISCE image headers (.xml, .vrt) and raw rasters
# ----------------------------------------------------------------------------------------------

def _key(name: str) -> str:
    """ISCE's renormalised key: lower case without white space (``DictUtils.renormalizeKey``)."""
    return re.sub(r"\s+", "", name).lower()


@dataclass(frozen=True)
class ImageHeader:
    """Shape and layout of one raw ISCE raster, from its ``.xml`` (or ``.vrt``) header."""

    file: Path
    header: Path
    width: int
    length: int
    bands: int
    data_type: str
    scheme: str
    byteorder: Literal["<", ">"]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(ISCE_DTYPES[self.data_type]).newbyteorder(self.byteorder)

    @property
    def nbytes(self) -> int:
        return self.width * self.length * self.bands * self.dtype.itemsize

    def file_shape(self) -> tuple[int, int, int]:
        return {"BIP": (self.length, self.width, self.bands),
                "BIL": (self.length, self.bands, self.width),
                "BSQ": (self.bands, self.length, self.width)}[self.scheme]


def _xml_root(path: Path, what: str) -> ET.Element:
    try:
        return parse_xml(path, what=what, max_bytes=MAX_XML_BYTES)
    except ET.ParseError as err:
        raise ISCE2Error(f"{what} '{path}': expected well-formed XML, found a parse error: "
                         f"{err}") from None


def _properties(element: ET.Element) -> dict[str, str]:
    """The direct ``<property name=...><value>`` children of a component, by ISCE key."""
    out = {}
    for prop in element.findall("property"):
        name, value = prop.get("name"), prop.find("value")
        if name is not None and value is not None:
            out[_key(name)] = (value.text or "").strip()
    return out


def _components(element: ET.Element) -> dict[str, ET.Element]:
    return {_key(c.get("name", "")): c for c in element.findall("component")}


def _integer(props: Mapping[str, str | None], name: str, where: str, *,
             minimum: int = 1) -> int:
    text = props.get(name)
    try:
        if text is None:
            raise ValueError
        value = int(float(text))
        if value != float(text) or value < minimum:
            raise ValueError
    except (TypeError, ValueError):
        raise ISCE2Error(f"{where}: field {name!r}: expected an integer >= {minimum}, found "
                         f"{'no such field' if text is None else repr(text)}") from None
    return value


def _number(props: dict[str, str], name: str, where: str) -> float:
    text = props.get(name)
    try:
        if text is None:
            raise ValueError
        value = float(text)
        if not np.isfinite(value):
            raise ValueError
    except (TypeError, ValueError):
        raise ISCE2Error(f"{where}: field {name!r}: expected a number, found "
                         f"{'no such field' if text is None else repr(text)}") from None
    return value


def _choice(props: dict[str, str], name: str, where: str, choices: Sequence[str],
            default: str | None = None) -> str:
    text = props.get(name, default)
    if text is None or text.upper() not in choices:
        raise ISCE2Error(f"{where}: field {name!r}: expected one of {list(choices)}, found "
                         f"{'no such field' if text is None else repr(text)}")
    return text.upper()


def _header_from_xml(file: Path, xml: Path) -> ImageHeader:
    where = f"ISCE image header '{xml}'"
    root = _xml_root(xml, "ISCE image header")
    props = _properties(root)
    byteorder = props.get("byte_order", "l").lower()
    if byteorder not in ("l", "b"):
        raise ISCE2Error(f"{where}: field 'byte_order': expected 'l' or 'b', found "
                         f"{props.get('byte_order')!r}")
    return ImageHeader(file=file, header=xml, width=_integer(props, "width", where),
                       length=_integer(props, "length", where),
                       bands=_integer(props, "number_bands", where) if "number_bands" in props
                       else 1,
                       data_type=_choice(props, "data_type", where, list(ISCE_DTYPES)),
                       scheme=_choice(props, "scheme", where, ("BIP", "BIL", "BSQ"), "BIP"),
                       byteorder="<" if byteorder == "l" else ">")


def _header_from_vrt(file: Path, vrt: Path) -> ImageHeader:
    where = f"GDAL VRT '{vrt}'"
    root = _xml_root(vrt, "GDAL VRT")
    bands = root.findall("VRTRasterBand")
    if not bands or any(b.get("subClass") != "VRTRawRasterBand" for b in bands):
        raise ISCE2Error(f"{where}: expected VRTRawRasterBand bands over one raw file (ISCE's "
                         f"renderVRT), found {[b.get('subClass') for b in bands]}: a virtual "
                         "mosaic of burst files (stackSentinel.py --virtual_merge True) is not "
                         "read; merge with --virtual_merge False or gdal_translate the VRT")
    by_gdal = {v: k for k, v in VRT_DTYPES.items()}
    data_type = by_gdal.get(bands[0].get("dataType", ""))
    if data_type is None:
        raise ISCE2Error(f"{where}: field 'dataType': expected one of {sorted(by_gdal)}, found "
                         f"{bands[0].get('dataType')!r}")
    order = (bands[0].findtext("ByteOrder") or "LSB").strip().upper()
    props = {"width": root.get("rasterXSize"), "length": root.get("rasterYSize")}
    width, length = _integer(props, "width", where), _integer(props, "length", where)
    scheme = "BIP"
    if len(bands) > 1:
        offset = int(bands[1].findtext("ImageOffset") or 0)
        itemsize = np.dtype(ISCE_DTYPES[data_type]).itemsize
        scheme = {itemsize: "BIP", width * itemsize: "BIL",
                  width * length * itemsize: "BSQ"}.get(offset, "BIP")
    return ImageHeader(file=file, header=vrt, width=width, length=length, bands=len(bands),
                       data_type=data_type, scheme=scheme,
                       byteorder=">" if order == "MSB" else "<")


def read_image_header(file: str | os.PathLike) -> ImageHeader:
    """Width, length, bands, type and interleaving of a raw ISCE raster from ``file.xml``
    (else ``file.vrt``), checked against the file's size.

    Raises
    ------
    FileNotFoundError
        The raster or both headers are missing.
    ISCE2Error
        A header field is missing or wrong, or the file size disagrees with the header (the
        message names the file, the header, the fields and the expected and found bytes).

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np
    >>> from depsi.io.isce2_writer import write_image_header
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "hgt.rdr"
    >>> np.zeros((3, 4), "<f8").tofile(path)
    >>> write_image_header(path, width=4, length=3, data_type="DOUBLE")
    >>> header = read_image_header(path)
    >>> header.width, header.length, header.dtype.str
    (4, 3, '<f8')
    """
    file = Path(file)
    xml, vrt = Path(f"{file}.xml"), Path(f"{file}.vrt")
    if xml.is_file():
        header = _header_from_xml(file, xml)
    elif vrt.is_file():
        header = _header_from_vrt(file, vrt)
    else:
        raise FileNotFoundError(f"ISCE image '{file}': expected a header '{xml.name}' or "
                                f"'{vrt.name}' beside it, found neither")
    if not file.is_file():
        if vrt.is_file():
            _header_from_vrt(file, vrt)  # a virtual mosaic says so, with the way out
        raise FileNotFoundError(f"ISCE image '{file}': expected the raw file its header "
                                f"'{header.header}' describes, found no such file")
    size = file.stat().st_size
    if size != header.nbytes:
        lines = size / (header.width * header.bands * header.dtype.itemsize)
        hint = (f"; that is {lines:.0f} lines of this width" if lines == int(lines)
                else "; no whole number of lines of this width")
        raise ISCE2Error(f"ISCE image '{file}': expected {header.nbytes} bytes (fields 'length' "
                         f"{header.length} x 'width' {header.width} x 'number_bands' "
                         f"{header.bands} x {header.dtype.itemsize}-byte {header.data_type} in "
                         f"'{header.header}'), found {size} bytes{hint}")
    return header


class _RasterBand:
    """Array-like over one band of a raw ISCE raster; indexing memory-maps only the window.

    Dask holds one of these (a path and the header) and calls ``__getitem__`` once per block.
    """

    def __init__(self, header: ImageHeader, band: int = 0, dtype: Any = np.float64):
        self.header = header
        self.band = band
        self.shape = (header.length, header.width)
        self.dtype = np.dtype(dtype)
        self.ndim = 2

    def __dask_tokenize__(self) -> tuple:
        stat = os.stat(self.header.file)
        return ("depsi.io.isce2._RasterBand", str(self.header.file), stat.st_mtime_ns,
                stat.st_size, self.header, self.band, self.dtype.str)

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows, cols = key
        mapped = np.memmap(self.header.file, dtype=self.header.dtype, mode="r",
                           shape=self.header.file_shape())
        if self.header.scheme == "BIP":
            window = mapped[rows, cols, self.band]
        elif self.header.scheme == "BIL":
            window = mapped[rows, self.band, cols]
        else:
            window = mapped[self.band, rows, cols]
        return np.array(window, dtype=self.dtype)


def _lazy_band(header: ImageHeader, band: int, chunks: tuple[int, int]) -> da.Array:
    source = _RasterBand(header, band)
    return da.from_array(source, chunks=chunks, lock=False, fancy=False, asarray=False,
                         meta=np.empty((0, 0), dtype=np.float64),
                         name=f"isce2-{header.file.name}-{band}-" + tokenize(source))


# ----------------------------------------------------------------------------------------------
# ISCE product XML: bursts, timing, orbits
# ----------------------------------------------------------------------------------------------

def _parse_time(text: str | None, where: str, name: str) -> np.datetime64:
    try:
        if not text:
            raise ValueError("empty")
        return np.datetime64(text.strip().replace(" ", "T"), "ns")
    except ValueError:
        raise ISCE2Error(f"{where}: field {name!r}: expected a UTC time such as "
                         f"'2023-03-19 05:50:35.812250', found "
                         f"{'no such field' if text is None else repr(text)}") from None


def _parse_vector(text: str | None, where: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in (text or "").strip().strip("[]()").split(",")]
        if len(values) != 3:
            raise ValueError
    except ValueError:
        raise ISCE2Error(f"{where}: field {name!r}: expected a list of 3 numbers, found "
                         f"{'no such field' if text is None else repr(text)}") from None
    return values


def _numbered(components: dict[str, ET.Element], prefix: str) -> list[ET.Element]:
    """Components ``prefix1, prefix2, ...`` in numeric order (ISCE writes them string-sorted)."""
    found = []
    for name, element in components.items():
        match = _NUMBERED.match(name)
        if match and match.group(1) == prefix:
            found.append((int(match.group(2)), element))
    return [e for _, e in sorted(found, key=lambda item: item[0])]


@dataclass(frozen=True)
class SwathProduct:
    """What depsi uses of one ISCE TOPS swath product XML (``IW*.xml``)."""

    file: Path
    swath: int
    sensing_start: np.datetime64
    sensing_stop: np.datetime64
    line_interval: float
    starting_range: float
    range_spacing: float
    number_of_samples: int
    wavelength: float
    pass_direction: str | None
    state_time: np.ndarray  # datetime64[ns]
    position: np.ndarray
    velocity: np.ndarray

    @property
    def far_range(self) -> float:
        return self.starting_range + (self.number_of_samples - 1) * self.range_spacing


def read_swath_product(file: str | os.PathLike) -> SwathProduct:
    """Timing, wavelength and orbit of an ISCE TOPS swath product XML (``IW1.xml``, ...).

    The swath's timing spans its bursts (first ``sensingstart``, last ``sensingstop``); its
    range, spacing and wavelength are those of the first burst, and so is the orbit (ISCE gives
    every burst the same state vectors).

    Raises
    ------
    ISCE2Error
        A missing component (``instance``, ``bursts``, ``burst1``, ``orbit``) or field, named
        with the file.
    """
    file = Path(file)
    root = _xml_root(file, "ISCE product")
    instance = _components(root).get("instance", root)
    bursts_parent = _components(instance).get("bursts")
    bursts = _numbered(_components(bursts_parent), "burst") if bursts_parent is not None else []
    if not bursts:
        raise ISCE2Error(f"ISCE product '{file}': expected component 'instance/bursts/burst1' "
                         f"(a TOPS swath product), found components "
                         f"{sorted(_components(instance))}")
    first, last = _properties(bursts[0]), _properties(bursts[-1])
    where = f"ISCE product '{file}', burst 1"
    orbit = _components(bursts[0]).get("orbit")
    vectors_parent = None if orbit is None else _components(orbit).get("state_vectors")
    vectors = [] if vectors_parent is None else _numbered(_components(vectors_parent),
                                                          "statevector")
    times, positions, velocities = [], [], []
    for k, vector in enumerate(vectors):
        props = _properties(vector)
        here = f"ISCE product '{file}', burst 1, orbit state vector {k + 1}"
        times.append(_parse_time(props.get("time"), here, "time"))
        positions.append(_parse_vector(props.get("position"), here, "position"))
        velocities.append(_parse_vector(props.get("velocity"), here, "velocity"))
    order = np.argsort(np.array(times, dtype="datetime64[ns]"), kind="stable")
    swath = re.search(r"(\d)", first.get("swathnumber", "") or file.stem)
    return SwathProduct(
        file=file, swath=int(swath.group(1)) if swath else 1,
        sensing_start=_parse_time(first.get("sensingstart"), where, "sensingstart"),
        sensing_stop=_parse_time(last.get("sensingstop"), f"ISCE product '{file}', burst "
                                 f"{len(bursts)}", "sensingstop"),
        line_interval=_number(first, "azimuthtimeinterval", where),
        starting_range=_number(first, "startingrange", where),
        range_spacing=_number(first, "rangepixelsize", where),
        number_of_samples=_integer(first, "numberofsamples", where),
        wavelength=_number(first, "radarwavelength", where),
        pass_direction=first.get("passdirection"),
        state_time=np.array(times, dtype="datetime64[ns]")[order],
        position=np.array(positions, dtype=np.float64).reshape(-1, 3)[order],
        velocity=np.array(velocities, dtype=np.float64).reshape(-1, 3)[order])


def _swath_files(folder: Path) -> list[Path]:
    return sorted((p for p in folder.glob("IW*.xml") if _SWATH_XML.match(p.name)),
                  key=lambda p: p.name)


def _orbit(product: SwathProduct, day: np.datetime64) -> Orbit:
    """The product's state vectors as an :class:`Orbit` in seconds of ``day`` (00:00 UTC)."""
    if product.state_time.size == 0:
        raise ISCE2Error(f"ISCE product '{product.file}': expected orbit state vectors in "
                         "component 'burst1/orbit/state_vectors', found none")
    # numpy's stubs lack datetime64(datetime64, unit)
    reference = np.datetime64(day, "D").astype("datetime64[ns]")  # type: ignore[call-overload]
    seconds = (product.state_time - reference) / np.timedelta64(1, "ns") * 1e-9
    return Orbit(reference=reference, time=seconds, position=product.position,
                 velocity=product.velocity, source=str(product.file))


def _merged_grid(swaths: Sequence[SwathProduct]) -> tuple[RadarGrid, tuple[int, int]]:
    """The merged grid of topsStack's ``mergeBurstsVirtual`` and its (length, width)."""
    top = min(swaths, key=lambda s: s.sensing_start)
    left = min(swaths, key=lambda s: s.starting_range)
    stop = max(s.sensing_stop for s in swaths)
    far = max(s.far_range for s in swaths)
    length = int(np.round((stop - top.sensing_start) / np.timedelta64(1, "ns") * 1e-9
                          / top.line_interval)) + 1
    width = int(np.round((far - left.starting_range) / left.range_spacing)) + 1
    grid = RadarGrid(first_line_time=top.sensing_start, line_interval=top.line_interval,
                     near_range=left.starting_range, range_spacing=left.range_spacing,
                     look_side="right")
    return grid, (length, width)


# ----------------------------------------------------------------------------------------------
# Baselines
# ----------------------------------------------------------------------------------------------

def _read_baseline_text(path: Path) -> float:
    """Average Bperp (m, ISCE's sign) of a topsStack or stripmapStack baseline text file."""
    values = []
    for line in read_bounded_text(path, what="ISCE2 baseline file",
                                  max_bytes=MAX_BASELINE_BYTES).splitlines():
        name, _, value = line.partition(":") if ":" in line else line.partition(" ")
        if name.strip() in ("Bperp (average)", "PERP_BASELINE_TOP", "PERP_BASELINE_BOTTOM"):
            try:
                values.append(float(value))
            except ValueError:
                raise ISCE2Error(f"ISCE2 baseline file '{path}': field {name.strip()!r}: "
                                 f"expected a number, found {value.strip()!r}") from None
    if not values:
        raise ISCE2Error(f"ISCE2 baseline file '{path}': expected 'Bperp (average): ...' or "
                         "'PERP_BASELINE_TOP ...' lines, found none")
    return float(np.mean(values))


def _find_baselines(folder: Path) -> dict[tuple[str, str], Path]:
    """``(reference, secondary)`` date pairs and their text files in ``baselines/`` (where
    topsStack and stripmapStack write them) or ``merged/baselines/``."""
    found: dict[tuple[str, str], Path] = {}
    for base in (folder / "baselines", folder / "merged" / "baselines"):
        if not base.is_dir():
            continue
        for path in sorted(base.glob("*.txt")) + sorted(base.glob("*/*.txt")):
            match = _PAIR.match(path.stem)
            if match and path.stat().st_size > 0:
                found.setdefault((match.group(1), match.group(2)), path)
    return found


# ----------------------------------------------------------------------------------------------
# The reader
# ----------------------------------------------------------------------------------------------

def _slc_files(folder: Path) -> tuple[list[str], list[Path]]:
    slc_root = folder / "merged" / "SLC"
    if not slc_root.is_dir():
        raise FileNotFoundError(f"ISCE2 stack '{folder}': expected merged SLCs in "
                                f"'{slc_root}', found no such folder")
    dates, files = [], []
    for day in sorted(p for p in slc_root.iterdir() if p.is_dir() and _DATE_DIR.match(p.name)):
        candidates = [day / f"{day.name}.slc.full", day / f"{day.name}.slc"]
        present = [c for c in candidates
                   if any(Path(f"{c}{ext}").is_file() for ext in ("", ".xml", ".vrt"))]
        if not present:
            raise FileNotFoundError(f"ISCE2 stack '{folder}': expected '{candidates[0].name}' "
                                    f"or '{candidates[1].name}' in '{day}', found "
                                    f"{sorted(p.name for p in day.iterdir())}")
        dates.append(day.name)
        files.append(present[0])
    if not dates:
        raise FileNotFoundError(f"ISCE2 stack '{folder}': expected date folders YYYYMMDD in "
                                f"'{slc_root}', found none")
    return dates, files


def _geometry_file(geom: Path, name: str) -> Path | None:
    for suffix in (".rdr.full", ".rdr"):
        path = geom / f"{name}{suffix}"
        if any(Path(f"{path}{ext}").is_file() for ext in ("", ".xml", ".vrt")):
            return path
    return None


def _check_shape(header: ImageHeader, shape: tuple[int, int], reference: ImageHeader) -> None:
    if (header.length, header.width) != shape:
        raise ISCE2Error(f"ISCE image '{header.file}': fields 'length' x 'width': expected "
                         f"{shape[0]} x {shape[1]} as '{reference.header}', found "
                         f"{header.length} x {header.width} in '{header.header}'")


@dataclass(frozen=True)
class _Products:
    reference_date: str
    reference: list[SwathProduct]
    secondaries: dict[str, SwathProduct]


def _read_products(folder: Path, dates: Sequence[str]) -> _Products | None:
    """The reference's swath products and one product per secondary date, or None when the
    stack has no ``reference/IW*.xml``."""
    reference_files = _swath_files(folder / "reference")
    if not reference_files:
        secondary_files = sorted(p for p in (folder / "secondarys").glob("*/IW*.xml")
                                 if _SWATH_XML.match(p.name))
        if secondary_files:
            raise ISCE2Error(f"ISCE2 stack '{folder}': expected the reference product "
                             f"'{folder / 'reference' / 'IW*.xml'}' beside the secondaries' "
                             f"(as '{secondary_files[0]}'), found no such file")
        return None
    reference = [read_swath_product(p) for p in reference_files]
    # numpy's stubs lack datetime64(datetime64, unit)
    day = str(np.datetime64(min(s.sensing_start for s in reference), "D")).replace("-", "")  # type: ignore[call-overload]
    if day not in dates:
        raise ISCE2Error(f"ISCE2 stack '{folder}': expected the reference date of "
                         f"'{reference_files[0]}' ({day}) among the SLC dates {list(dates)}, "
                         "found it absent")
    secondaries = {}
    for date in dates:
        if date == day:
            continue
        files = _swath_files(folder / "secondarys" / date)
        if not files:
            raise FileNotFoundError(f"ISCE2 stack '{folder}': expected the orbit of secondary "
                                    f"{date} in '{folder / 'secondarys' / date / 'IW*.xml'}' "
                                    f"(as for the reference '{reference_files[0]}'), found no "
                                    "such file")
        secondaries[date] = read_swath_product(files[0])
    return _Products(reference_date=day, reference=reference, secondaries=secondaries)


def _los_coords(header: ImageHeader, chunks: tuple[int, int], look_side: str
                ) -> dict[str, da.Array]:
    """Incidence, heading and the ground-to-satellite unit vector (east, north, up) from ISCE's
    two-band ``los``: band 1 incidence ``theta`` from the vertical, band 2 azimuth ``alpha`` of
    the target-to-satellite vector from north, anticlockwise (degrees).

    ``los_east = -sin(theta) sin(alpha)``, ``los_north = sin(theta) cos(alpha)``,
    ``los_up = cos(theta)``; the flight heading, clockwise from north, is ``90 - alpha`` for a
    right-looking radar and ``-90 - alpha`` for a left-looking one, wrapped to [-180, 180).
    """
    if header.bands != 2:
        raise ISCE2Error(f"ISCE image '{header.file}': field 'number_bands': expected 2 "
                         f"(incidence, azimuth), found {header.bands} in '{header.header}'")
    incidence = _lazy_band(header, 0, chunks)
    azimuth = da.deg2rad(_lazy_band(header, 1, chunks))
    theta = da.deg2rad(incidence)
    heading = (90.0 if look_side == "right" else -90.0) - da.rad2deg(azimuth)
    return {"incidence": incidence, "heading": (heading + 180.0) % 360.0 - 180.0,
            "los_east": -da.sin(theta) * da.sin(azimuth),
            "los_north": da.sin(theta) * da.cos(azimuth), "los_up": da.cos(theta)}


def _scene_height(header: ImageHeader) -> float:
    """Median of a coarse sample of ``hgt`` (about 32 x 32 pixels): the geometry's height."""
    step_az = max(1, header.length // 32)
    step_rg = max(1, header.width // 32)
    sample = np.asarray(_RasterBand(header)[slice(None, None, step_az),
                                            slice(None, None, step_rg)])
    sample = sample[np.isfinite(sample)]
    return float(np.clip(np.median(sample), -8999.0, 8999.0)) if sample.size else 0.0


def from_isce2(
    folder: str | os.PathLike,
    *,
    geometry: GeometryMode = "product",
    height: Any = None,
    chunks: Any = None,
) -> xr.Dataset:
    """Read an ISCE2 topsStack (or stripmapStack) folder into a lazy raster stack with geometry.

    Parameters
    ----------
    folder
        The stack's root: the folder holding ``merged/`` (and, for topsStack, ``reference/``,
        ``secondarys/``, ``baselines/``).
    geometry
        ``"product"``: keep ``lat``/``lon`` of ``merged/geom_reference`` and compute ``h2ph``
        from the orbits; ``"orbits"``: also geocode ``lat``/``lon`` from the orbits, keeping
        the files' as ``lat_product``/``lon_product``
        (:func:`depsi.io.raster_geometry.attach_geometry`).
    height
        Heights (m above the ellipsoid) on ``(azimuth, range)`` or one number, instead of
        ``hgt.rdr[.full]``.
    chunks
        Block shape as in :func:`depsi.io.binary.from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64, Dask) and ``h2ph`` (float32) on ``(azimuth, range, time)``,
        epochs sorted by date; coordinates ``lat``, ``lon``, ``height`` and, from ``los``,
        ``incidence``, ``heading`` (deg) and ``los_east``/``los_north``/``los_up`` on
        ``(azimuth, range)``, all lazy; attrs ``wavelength``, ``sar_geometry`` and the others
        of :func:`~depsi.io.raster_geometry.attach_geometry` when the product XMLs hold orbits.
        Without orbits but with baseline files: ``bperp`` on ``time`` (depsi's sign: minus
        ISCE's for a right-looking radar) and, when ``reference/IW*.xml`` gives the slant range
        and ``los`` the incidence, ``h2ph = -bperp / (R sin(incidence))`` as
        :func:`~depsi.geometry.baselines` defines it, from one average Bperp per date.

    Raises
    ------
    FileNotFoundError
        No ``merged/SLC`` date folders, an SLC without header, a secondary without its
        ``secondarys/DATE/IW*.xml`` when the reference has one.
    ISCE2Error
        A header field missing or wrong, a file whose size disagrees with its header (file,
        fields, expected and found bytes), rasters of different shapes, a product XML without
        bursts or state vectors; all before any pixel is read.
    GeometryError
        Neither orbits nor baselines: ``h2ph`` cannot be had.

    Examples
    --------
    >>> import tempfile
    >>> from depsi.geometry import Orbit, RadarGrid, StackGeometry
    >>> from depsi.simulate import simulate_stack
    >>> stack, _ = simulate_stack(shape=(8, 10), n_epochs=2, seed=1)
    >>> t = np.arange(0.0, 60.0, 10.0)[:, None]  # a straight track along y at 7.5 km/s
    >>> orbits = [Orbit(day, t[:, 0], np.c_[7.07e6 + 0 * t, 7.5e3 * t, 100.0 * k + 0 * t],
    ...                 [[0.0, 7.5e3, 0.0]] * 6) for k, day in enumerate(stack.time.values)]
    >>> grid = RadarGrid(stack.time.values[0] + np.timedelta64(20, "s"), 1e-3, 8.0e5, 10.0)
    >>> geometry = StackGeometry(grid, orbits, mother=0, wavelength=0.0556)
    >>> from depsi.io.isce2_writer import write_isce2
    >>> folder = tempfile.mkdtemp()
    >>> _ = write_isce2(folder, stack, geometry)
    >>> ds = from_isce2(folder)
    >>> ds.complex.shape, ds.h2ph.shape, bool((ds.complex == stack.complex).all())
    ((8, 10, 2), (8, 10, 2), True)
    """
    folder = Path(folder)
    if geometry not in ("product", "orbits"):
        raise ValueError(f"geometry: expected 'product' or 'orbits', found {geometry!r}")
    dates, slc_paths = _slc_files(folder)
    headers = [read_image_header(p) for p in slc_paths]
    first = headers[0]
    shape = (first.length, first.width)
    for header in headers:
        _check_shape(header, shape, first)
        if header.bands != 1 or header.data_type not in ("CFLOAT", "CDOUBLE"):
            raise ISCE2Error(f"ISCE image '{header.file}': fields 'data_type'/'number_bands': "
                             f"expected one CFLOAT (or CDOUBLE) band, found {header.bands} "
                             f"band(s) of {header.data_type} in '{header.header}'")

    geom = folder / "merged" / "geom_reference"
    geometry_headers = {}
    for name in ("lat", "lon", "hgt", "los"):
        path = _geometry_file(geom, name)
        if path is None and name in ("lat", "lon") and geom.is_dir():
            raise FileNotFoundError(f"ISCE2 stack '{folder}': expected '{name}.rdr.full' (or "
                                    f"'{name}.rdr') in '{geom}' beside "
                                    f"{sorted(p.name for p in geom.iterdir())}, found none")
        if path is not None:
            geometry_headers[name] = read_image_header(path)
            _check_shape(geometry_headers[name], shape, first)

    products = _read_products(folder, dates)
    baseline_files = _find_baselines(folder)
    wavelength = None if products is None else products.reference[0].wavelength
    epochs = _epochs(len(dates), [str(p) for p in slc_paths], dates=dates, metadata=None,
                     wavelength=wavelength)
    ordered = [dates[i] for i in epochs.order]
    block = _chunks(chunks, shape, len(dates))

    grid = None
    if products is not None:
        grid, merged_shape = _merged_grid(products.reference)
        if merged_shape != shape:
            logger.warning("ISCE2 stack %s: the reference swaths span %d x %d merged pixels, "
                           "the SLCs %d x %d: the grid's timing may not be the SLCs'", folder,
                           *merged_shape, *shape)
    no_vectors = [] if products is None else [
        str(p.file) for p in [products.reference[0], *products.secondaries.values()]
        if not p.state_time.size]
    if (products is None or no_vectors) and not baseline_files:
        raise GeometryError(f"ISCE2 stack '{folder}': expected orbits in reference/*.xml or "
                            "baselines in merged/baselines, found neither"
                            + (f" (no state vectors in {no_vectors})" if no_vectors else ""))

    stack = _BinaryStack([slc_paths[i] for i in epochs.order], shape,
                         _file_dtype(np.complex64 if first.data_type == "CFLOAT"
                                     else np.complex128, first.byteorder))
    data = da.from_array(stack, chunks=block, lock=False, fancy=False, asarray=False,
                         meta=np.empty((0, 0, 0), dtype=np.complex64),
                         name="from_isce2-" + tokenize(stack))
    ds = _raster(data, epochs.time, {"wavelength": epochs.wavelength, "processor": "ISCE2",
                                     "reference_date": None if products is None
                                     else products.reference_date})
    lazy = []
    for name in ("lat", "lon"):
        if name in geometry_headers:
            ds = ds.assign_coords({name: (("azimuth", "range"),
                                          _lazy_band(geometry_headers[name], 0, block[:2]))})
            lazy.append(name)
    if "los" in geometry_headers:
        for name, values in _los_coords(geometry_headers["los"], block[:2], "right").items():
            ds = ds.assign_coords({name: (("azimuth", "range"), values)})
            lazy.append(name)
    ds.attrs["history"] = f"read by depsi.io.isce2.from_isce2 from '{folder}'"
    validate(ds.drop_vars(lazy), kind="raster")

    if height is None and "hgt" in geometry_headers:
        height = _lazy_band(geometry_headers["hgt"], 0, block[:2])
        scene_height = _scene_height(geometry_headers["hgt"])
    elif height is not None and np.ndim(height) == 0:
        scene_height, height = float(height), None
    else:
        scene_height = 0.0 if height is None else float(np.nanmedian(np.asarray(height)))

    with_orbits = products is not None and all(
        p.state_time.size for p in [products.reference[0], *products.secondaries.values()])
    if products is None or not with_orbits:
        return _without_orbits(ds, folder, ordered, baseline_files, height, grid, geometry)
    # both are set above whenever the reference products are read
    grid, wavelength = cast(RadarGrid, grid), cast(float, epochs.wavelength)
    orbits = tuple(_orbit(products.reference[0] if day == products.reference_date
                          else products.secondaries[day], np.datetime64(
                              f"{day[:4]}-{day[4:6]}-{day[6:]}")) for day in ordered)
    stack_geometry = StackGeometry(grid=grid, orbits=orbits,
                                   mother=ordered.index(products.reference_date),
                                   wavelength=wavelength, height=scene_height)
    return attach_geometry(ds, stack_geometry, mode=geometry, height=height)


def _without_orbits(ds: xr.Dataset, folder: Path, ordered: Sequence[str],
                    files: dict[tuple[str, str], Path], height: Any, grid: RadarGrid | None,
                    geometry: str) -> xr.Dataset:
    """The stack with ``bperp`` per date from the baseline files and, where the slant range
    (the grid) and the incidence (``los``) are known, ``h2ph = bperp / (R sin(incidence))``."""
    if geometry == "orbits":
        raise GeometryError(f"ISCE2 stack '{folder}': geometry='orbits' expected orbits in "
                            "reference/*.xml, found only baseline files")
    references = {ref for ref, _ in files}
    mother = next((d for d in ordered if d in references), None)
    missing = [d for d in ordered if d != mother and (mother, d) not in files]
    if mother is None or missing:
        raise GeometryError(f"ISCE2 stack '{folder}': expected one baseline file "
                            f"baselines/REF_SEC/REF_SEC.txt per secondary, found none for "
                            f"{missing or list(ordered)} among "
                            f"{sorted(str(p) for p in files.values())}")
    # ISCE orients Bperp by (target - P_ref) x (P_sec - P_ref) . V_ref: minus depsi's bperp for
    # a right-looking radar (topsStack is Sentinel-1)
    bperp = np.array([0.0 if d == mother else -_read_baseline_text(files[(mother, d)])
                      for d in ordered])
    out = ds.assign_coords(bperp=("time", bperp))
    out["bperp"].attrs.update(units="m", long_name="perpendicular baseline from ISCE2 files")
    out.attrs["mother_time"] = f"{mother[:4]}-{mother[4:6]}-{mother[6:]}"
    if height is not None:
        out = out.assign_coords(height=(("azimuth", "range"), height))
    if grid is None or "incidence" not in ds.coords:
        logger.warning("ISCE2 stack %s: no orbits; h2ph from the baselines needs the slant "
                       "range (reference/IW*.xml) and the incidence (los.rdr[.full]), found %s: "
                       "only 'bperp' per date is given", folder,
                       "neither" if grid is None and "incidence" not in ds.coords
                       else "no slant range" if grid is None else "no incidence")
        return out
    slant = grid.near_range + ds["range"].values.astype(np.float64) * grid.range_spacing
    # h2ph's sign as depsi.geometry.baselines gives it: -bperp / (R sin(incidence))
    factor = -1.0 / (slant[None, :] * np.sin(np.deg2rad(ds["incidence"].data)))
    h2ph = (factor[:, :, None] * bperp[None, None, :]).astype(np.float32)
    out["h2ph"] = (RASTER_DIMS, h2ph.rechunk(ds["complex"].data.chunks))
    out["h2ph"].attrs.update(units="1", long_name="height-to-phase factor from ISCE2 "
                             "average baselines")
    return out


__all__ = [
    "ISCE_DTYPES",
    "ISCE2Error",
    "ImageHeader",
    "SwathProduct",
    "VRT_DTYPES",
    "from_isce2",
    "read_image_header",
    "read_swath_product",
]
