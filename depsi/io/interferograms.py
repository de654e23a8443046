"""Single-reference interferogram stacks in: wrapped interferograms and amplitudes, read as
pseudo-SLCs.

Many users hold interferograms rather than SLCs: a multilooked product, StaMPS's single-master
interferograms, ISCE2's ``merged/interferograms``. With one reference date ``r`` common to every
interferogram, the pseudo-SLC of date ``t`` is ``amplitude_t * exp(i angle(s_t conj(s_r)))``,
its phase zero on the reference date. The single-mother interferograms depsi forms from them
(``p_r conj(p_t)``) then have exactly the phase of ``s_r conj(s_t)``: the chain's sign
convention holds (docs/concepts.md).

A file's name says which way round its phase is: ``A_B`` holds ``s_A conj(s_B)``, as ISCE2,
SNAP, GAMMA and DORIS name their interferograms (reference first). A file ``r_t`` gives
``angle(s_t conj(s_r)) = -angle(file)``, a file ``t_r`` gives ``+angle(file)``; both occur in
one stack where the reference lies inside the time span.

Layouts (``layout="auto"`` finds the one present):

``raw``
    ``igrams/A_B.int`` (complex64, little-endian, row-major) and ``amplitude/DATE.amp``
    (float32), dates ``YYYYMMDD``; the shape is not in the files and must be given.
``isce2``
    ISCE2 topsStack ``merged/interferograms/A_B/fine.int`` with its ``fine.int.xml`` (width and
    length from the header); amplitudes from the interferograms' moduli.
``geotiff``
    ``A_B.tif`` (one complex band) in the folder, and ``DATE.amp.tif`` or ``amplitude/DATE.tif``
    where present; else the moduli.

Where no amplitude image is given, a date's amplitude is the square root of its
interferogram's modulus (the geometric mean of the two images' amplitudes), and the
reference's the median of those: amplitude dispersion then measures the pair products, so
selection on such a stack should rest on the phase (``docs/steps/selection.md``).

No baselines or positions are required: without ``h2ph`` the chain leaves the height term out
(``docs/chain.md``).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr

from depsi.errors import BadInputError
from depsi.io.geotiff import open_radar_raster
from depsi.io.raster import RASTER_DIMS, _check_wavelength, _chunks, _finish

logger = logging.getLogger(__name__)

#: Layouts :func:`from_interferograms` reads.
INTERFEROGRAM_LAYOUTS = ("raw", "isce2", "geotiff")

_PAIR = re.compile(r"(?<!\d)(\d{8})[_-](\d{8})(?!\d)")
_DATE = re.compile(r"(?<!\d)(\d{8})(?!\d)")


class InterferogramStackError(BadInputError, ValueError):
    """An interferogram stack whose files contradict each other or the configuration."""


@dataclass(frozen=True)
class _Pair:
    first: np.datetime64
    second: np.datetime64
    path: Path


def _date(text: str, path: Path) -> np.datetime64:
    try:
        value = np.datetime64(f"{text[:4]}-{text[4:6]}-{text[6:]}", "D")
    except ValueError:
        raise InterferogramStackError(f"{path}: the name holds {text!r}, which is not a date "
                                      "YYYYMMDD") from None
    if not np.datetime64("1978-01-01") <= value <= np.datetime64("2100-01-01"):
        raise InterferogramStackError(f"{path}: the date {text} in its name is outside "
                                      "1978..2100")
    return value


def _pairs(paths: list[Path], what: str) -> list[_Pair]:
    pairs = []
    for path in paths:
        name = path.parent.name if path.name.startswith("fine") else path.name
        found = _PAIR.findall(name)
        if len(found) != 1:
            raise InterferogramStackError(
                f"{path}: expected one pair of dates YYYYMMDD_YYYYMMDD in the name of each "
                f"{what}, found {len(found)}")
        first, second = (_date(d, path) for d in found[0])
        if first == second:
            raise InterferogramStackError(f"{path}: both dates of the pair are {first}")
        pairs.append(_Pair(first, second, path))
    if not pairs:
        raise InterferogramStackError(f"no {what} found")
    return pairs


def _reference(pairs: list[_Pair]) -> np.datetime64:
    """The date every interferogram shares (a single-reference stack), else a clear error."""
    common = set.intersection(*({p.first, p.second} for p in pairs))
    if len(pairs) == 1:
        # one pair: its earlier date is the reference, as processors name it first
        return pairs[0].first
    if len(common) != 1:
        counts: dict[np.datetime64, int] = {}
        for p in pairs:
            for d in (p.first, p.second):
                counts[d] = counts.get(d, 0) + 1
        best = max(counts, key=counts.__getitem__)
        outside = [p.path.name for p in pairs if best not in (p.first, p.second)]
        raise InterferogramStackError(
            f"expected single-reference interferograms (one date in every pair); the most "
            f"common date {best} is missing from {len(outside)} of {len(pairs)} files, e.g. "
            f"{outside[:3]}")
    reference = common.pop()
    seconds = [p.second if p.first == reference else p.first for p in pairs]
    duplicated = sorted({str(d) for d in seconds if seconds.count(d) > 1})
    if duplicated:
        raise InterferogramStackError(f"dates with more than one interferogram to the "
                                      f"reference {reference}: {duplicated}")
    return reference


def _find_layout(folder: Path) -> str:
    if (folder / "igrams").is_dir():
        return "raw"
    if (folder / "merged" / "interferograms").is_dir() or folder.name == "interferograms":
        return "isce2"
    if any(p.suffix.lower() in (".tif", ".tiff") for p in folder.iterdir()):
        return "geotiff"
    raise InterferogramStackError(
        f"{folder}: no interferogram layout found: expected igrams/ (raw), "
        f"merged/interferograms/ (ISCE2) or A_B.tif files (GeoTIFF)")


def _isce2_shape(file: Path) -> tuple[int, int]:
    from depsi.io.isce2 import _header_from_xml

    xml = file.with_name(file.name + ".xml")
    if not xml.is_file():
        raise InterferogramStackError(f"{file}: no ISCE header {xml.name} beside it")
    header = _header_from_xml(file, xml)
    if header.data_type != "CFLOAT" or header.bands != 1 or header.byteorder != "<":
        raise InterferogramStackError(f"{xml}: expected one little-endian CFLOAT band, found "
                                      f"{header.bands} {header.data_type} ({header.byteorder})")
    return header.length, header.width


class _PseudoSlcs:
    """Array-like ``(azimuth, range, time)`` of pseudo-SLCs; indexing reads only its window.

    ``sources[t]``: ``(path, sign)`` of date ``t``'s interferogram (None on the reference
    date) with ``sign`` +1 or -1 (the phase's direction), and ``amplitudes[t]`` its amplitude
    file or None (then the square root of the interferogram's modulus; the reference's, the
    median of the others').
    """

    def __init__(self, sources, amplitudes, shape, reader):
        self.sources = tuple(sources)
        self.amplitudes = tuple(amplitudes)
        self.file_shape = shape
        self.reader = reader
        self.shape = (*shape, len(self.sources))
        self.dtype = np.dtype(np.complex64)
        self.ndim = 3

    def __dask_tokenize__(self) -> tuple:
        files = [s[0] for s in self.sources if s is not None] + [
            a for a in self.amplitudes if a is not None]
        stats = [(str(p), os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in files]
        return ("depsi.io.interferograms._PseudoSlcs", stats, self.file_shape,
                [s[1] if s else 0 for s in self.sources], self.reader)

    def __getitem__(self, key: tuple[slice, slice, slice]) -> np.ndarray:
        azimuth, range_, epochs = key
        rows = range(self.file_shape[0])[azimuth]
        cols = range(self.file_shape[1])[range_]
        dates = range(len(self.sources))[epochs]
        out = np.empty((len(rows), len(cols), len(dates)), dtype=np.complex64)
        moduli, reference = [], None
        for k, t in enumerate(dates):
            source = self.sources[t]
            amplitude = (None if self.amplitudes[t] is None
                         else _read_window(self.amplitudes[t], self.file_shape, "<f4",
                                           azimuth, range_))
            if source is None:  # the reference date: phase zero
                reference = k
                out[:, :, k] = 1.0 if amplitude is None else amplitude
                continue
            path, sign = source
            ifg = _read_window(path, self.file_shape, "<c8", azimuth, range_)
            if amplitude is None:
                amplitude = np.sqrt(np.abs(ifg))
                moduli.append(amplitude)
            out[:, :, k] = amplitude * np.exp(1j * (sign * np.angle(ifg)))
        if reference is not None and self.amplitudes[dates[reference]] is None and moduli:
            out[:, :, reference] = np.median(np.stack(moduli), axis=0)
        return out


def _read_window(path: Path, shape: tuple[int, int], dtype: str, azimuth: slice,
                 range_: slice) -> np.ndarray:
    if path.suffix.lower() in (".tif", ".tiff"):
        from rasterio.windows import Window

        rows = range(shape[0])[azimuth]
        cols = range(shape[1])[range_]
        with open_radar_raster(path) as source:
            window = Window(cols.start, rows.start, len(cols), len(rows))
            return source.read(1, window=window).astype(np.dtype(dtype).newbyteorder("="))
    mapped = np.memmap(path, dtype=np.dtype(dtype), mode="r", shape=shape)
    try:
        return np.array(mapped[azimuth, range_], dtype=np.dtype(dtype).newbyteorder("="))
    finally:
        del mapped


def _raster_shape(path: Path) -> tuple[int, int]:
    with open_radar_raster(path) as source:
        if source.count != 1:
            raise InterferogramStackError(f"{path}: expected one band, found {source.count}")
        return source.height, source.width


def _one_shape(shapes: set[tuple[int, int]], where: Path) -> tuple[int, int]:
    """The one shape of a stack's interferograms, else a refusal listing them."""
    if len(shapes) != 1:
        raise InterferogramStackError(f"{where}: interferograms of different shapes "
                                      f"{sorted(shapes)}")
    return next(iter(shapes))


def _check_size(path: Path, shape: tuple[int, int], itemsize: int, what: str) -> None:
    expected = shape[0] * shape[1] * itemsize
    size = path.stat().st_size
    if size != expected:
        raise InterferogramStackError(
            f"{path}: {size} bytes, expected {expected} for a {what} of shape {shape} "
            f"({itemsize} bytes a pixel); check input.shape")


def from_interferograms(path: str | os.PathLike, *, wavelength: float,
                        shape: tuple[int, int] | None = None, layout: str = "auto",
                        chunks: Any = None) -> xr.Dataset:
    """Read a single-reference interferogram stack as a lazy raster stack of pseudo-SLCs.

    Parameters
    ----------
    path
        The stack's folder (see the module docstring for the layouts).
    wavelength
        Radar wavelength (m): interferogram files carry none.
    shape
        ``(lines, pixels)`` of the raw layout; the others read it from their headers (a shape
        given there must agree).
    layout
        One of :data:`INTERFEROGRAM_LAYOUTS`, or ``"auto"``.
    chunks
        Block shape (as the SLC readers'); default: time whole, about 32 MiB a block.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64, Dask) on ``(azimuth, range, time)``, ``time`` the dates,
        ``attrs``: ``wavelength``, ``mother_time`` (the reference date), ``input_kind`` =
        ``"interferograms"``, ``amplitude_source`` (``"images"`` or ``"interferogram
        moduli"``). No ``h2ph``.

    Raises
    ------
    InterferogramStackError
        Before any pixel is read: no files, names without a pair of dates, pairs without one
        common date, a date twice, files of the wrong size or shape, amplitude dates that are
        not the interferograms' dates.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> (folder / "igrams").mkdir(); (folder / "amplitude").mkdir()
    >>> np.full((2, 3), 1j, "<c8").tofile(folder / "igrams" / "20200101_20200113.int")
    >>> for d in ("20200101", "20200113"):
    ...     np.full((2, 3), 2.0, "<f4").tofile(folder / "amplitude" / f"{d}.amp")
    >>> stack = from_interferograms(folder, wavelength=0.0555, shape=(2, 3))
    >>> values = stack["complex"].values[0, 0]
    >>> phase = np.angle(values).astype(float).round(4).tolist()
    >>> stack.attrs["mother_time"], np.abs(values).tolist(), phase
    ('2020-01-01T00:00:00', [2.0, 2.0], [0.0, -1.5708])
    """
    folder = Path(path)
    if not folder.is_dir():
        raise InterferogramStackError(f"input.path: {str(folder)!r} is not a folder")
    wavelength = _check_wavelength(wavelength, "wavelength")
    if layout == "auto":
        layout = _find_layout(folder)
    if layout not in INTERFEROGRAM_LAYOUTS:
        raise InterferogramStackError(f"layout: expected one of {INTERFEROGRAM_LAYOUTS} or "
                                      f"'auto', found {layout!r}")
    amplitude_files: dict[np.datetime64, Path] = {}
    if layout == "raw":
        files = sorted((folder / "igrams").glob("*.int"))
        pairs = _pairs(files, "interferogram igrams/*.int")
        if shape is None:
            raise InterferogramStackError(
                f"{folder}: raw interferograms carry no shape: give input.shape "
                "[lines, pixels]")
        shape = (int(shape[0]), int(shape[1]))
        for pair in pairs:
            _check_size(pair.path, shape, 8, "complex64 interferogram")
        for amp in sorted((folder / "amplitude").glob("*.amp")):
            found = _DATE.findall(amp.name)
            if len(found) != 1:
                raise InterferogramStackError(f"{amp}: expected one date YYYYMMDD in the name")
            _check_size(amp, shape, 4, "float32 amplitude")
            amplitude_files[_date(found[0], amp)] = amp
    elif layout == "isce2":
        base = folder if folder.name == "interferograms" else folder / "merged" / "interferograms"
        files = sorted(base.glob("*/fine.int"))
        pairs = _pairs(files, "interferogram merged/interferograms/*/fine.int")
        found_shape = _one_shape({_isce2_shape(p) for p in files}, base)
        if shape is not None and tuple(shape) != found_shape:
            raise InterferogramStackError(f"input.shape {list(shape)} contradicts the "
                                          f"headers' {list(found_shape)}")
        shape = found_shape
        for pair in pairs:
            _check_size(pair.path, shape, 8, "complex64 interferogram")
    else:
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".tif", ".tiff")
                       and _PAIR.search(p.name))
        pairs = _pairs(files, "interferogram A_B.tif")
        shape = _one_shape({_raster_shape(p) for p in files}, folder)
        candidates = [*folder.glob("*.amp.tif"), *(folder / "amplitude").glob("*.tif")]
        for amp in candidates:
            found = _DATE.findall(amp.name)
            if len(found) == 1:
                found_shape = _raster_shape(amp)
                if found_shape != shape:
                    raise InterferogramStackError(f"{amp}: shape {found_shape}, the "
                                                  f"interferograms' {shape}")
                amplitude_files[_date(found[0], amp)] = amp

    reference = _reference(pairs)
    dates = sorted({reference, *(p.first for p in pairs), *(p.second for p in pairs)})
    by_date = {}
    for pair in pairs:
        other = pair.second if pair.first == reference else pair.first
        # A_B holds s_A conj(s_B): the pseudo-SLC's phase angle(s_t conj(s_r)) is +angle for
        # t_r, -angle for r_t
        by_date[other] = (pair.path, 1.0 if pair.second == reference else -1.0)
    if amplitude_files:
        missing = [str(d) for d in dates if d not in amplitude_files]
        extra = [str(d) for d in amplitude_files if d not in dates]
        if missing or extra:
            raise InterferogramStackError(
                f"{folder}: amplitude images and interferograms disagree on the dates: "
                f"{len(missing)} dates without an amplitude {missing[:5]}, {len(extra)} "
                f"amplitudes of no interferogram's date {extra[:5]}")
    sources = [by_date.get(d) for d in dates]
    amplitudes = [amplitude_files.get(d) for d in dates]
    array = _PseudoSlcs(sources, amplitudes, shape, layout)
    block = _chunks(chunks, shape, len(dates))
    data = da.from_array(array, chunks=block, asarray=False, fancy=False,
                         name=f"interferograms-{da.core.tokenize(array, block)}")
    time = np.array(dates, dtype="datetime64[ns]")
    logger.info("interferograms: %d dates %s..%s, reference %s, %s layout, amplitudes from %s",
                len(dates), dates[0], dates[-1], reference, layout,
                "images" if amplitude_files else "the interferograms' moduli")
    # numpy's stubs lack datetime64(datetime64, unit)
    mother_time = str(np.datetime_as_string(np.datetime64(reference, "s")))  # type: ignore[call-overload]
    ds = xr.Dataset({"complex": (RASTER_DIMS, data)},
                    coords={"azimuth": np.arange(shape[0], dtype=np.int64),
                            "range": np.arange(shape[1], dtype=np.int64), "time": time},
                    attrs={"wavelength": wavelength,
                           "mother_time": mother_time,
                           "input_kind": "interferograms",
                           "amplitude_source": ("images" if amplitude_files
                                                else "interferogram moduli")})
    return _finish(ds, "depsi.io.interferograms.from_interferograms")


__all__ = ["INTERFEROGRAM_LAYOUTS", "InterferogramStackError", "from_interferograms"]
