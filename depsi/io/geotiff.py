"""Complex SLC rasters in any GDAL format (GeoTIFF, ENVI, ...) through rasterio: the reader
:func:`from_geotiff` (needs the optional ``geo`` extra), the lazy band reader it shares with the
h2ph and position rasters of a GeoTIFF stack (:func:`open_geotiff_stack`, the reader of
``input.format: geotiff``), and the GeoTIFF stack writer.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.base import tokenize

from depsi.io.raster import (
    _check_exist,
    _chunks,
    _epochs,
    _finish,
    _iq_to_complex64,
    _parse_dates,
    _path_list,
    _raster,
)

BandLayout = Literal["complex", "iq"]

#: Where the acquisition time of a raster is kept: GDAL's ``IMAGERY`` metadata domain, item
#: ``ACQUISITIONDATETIME`` (UTC, ``%Y-%m-%d %H:%M:%S``), as GDAL's imagery metadata readers
#: report it; depsi's writer records it, the reader checks it against the epoch's date.
ACQUISITION_DOMAIN = "IMAGERY"
ACQUISITION_ITEM = "ACQUISITIONDATETIME"

#: A date written YYYYMMDD in a file name, not part of a longer number.
NAME_DATE = re.compile(r"(?<!\d)((?:19|20)\d{6})(?!\d)")


def date_in_name(path: str | os.PathLike) -> np.datetime64 | None:
    """The one YYYYMMDD date in a file's name, or None (no date, several, or not a date).

    Examples
    --------
    >>> str(date_in_name("stack/slc_20230319.tif")), date_in_name("lat.tif")
    ('2023-03-19', None)
    """
    found = NAME_DATE.findall(Path(path).name)
    if len(found) != 1:
        return None
    try:
        return np.datetime64(f"{found[0][:4]}-{found[0][4:6]}-{found[0][6:]}", "D")
    except ValueError:
        return None


def check_dates_in_names(paths: Sequence[str | os.PathLike], dates: Sequence[Any] | np.ndarray, *,
                         field: str = "dates") -> None:
    """Refuse ``dates`` (one per file, in the files' order) that contradict a YYYYMMDD date in
    a file's name; files without a date in their name are not checked.

    Raises
    ------
    ValueError
        Naming the file, the date in its name and the date given for it.
    """
    for k, (path, date) in enumerate(zip(paths, dates)):
        named = date_in_name(path)
        given = np.datetime64(date).astype("datetime64[D]")
        if named is not None and named != given:
            raise ValueError(f"{field}[{k}]: expected the date in the name of '{path}', "
                             f"{named}, found {given}")


def _require_rasterio() -> Any:
    try:
        import rasterio
    except ImportError as err:
        raise ImportError("from_geotiff needs rasterio: install the 'geo' extra, "
                          "pip install 'depsi[geo]'") from err
    return rasterio


@contextmanager
def open_radar_raster(path: str | os.PathLike) -> Iterator[Any]:
    """A raster opened by rasterio, any GDAL error re-raised naming the file.

    Rasters in radar geometry (SLCs, interferograms, their lat/lon and h2ph) have no
    geotransform by nature, so rasterio's warning that says so is not passed on."""
    rasterio = _require_rasterio()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        try:
            with rasterio.open(path) as src:
                yield src
        except rasterio.errors.RasterioError as err:
            raise OSError(f"raster '{path}': expected a file GDAL can read, found an error: "
                          f"{err}") from err


def _write_band(path: str | os.PathLike, values: np.ndarray,
                acquisition: dict[str, str] | None = None) -> None:
    """One band in radar geometry (no geotransform) as a GeoTIFF, its acquisition tags in
    ACQUISITION_DOMAIN."""
    rasterio = _require_rasterio()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(path, "w", driver="GTiff", width=values.shape[1],
                           height=values.shape[0], count=1, dtype=values.dtype.name) as tif:
            tif.write(values[None])
            if acquisition:
                tif.update_tags(ns=ACQUISITION_DOMAIN, **acquisition)


@dataclass(frozen=True)
class RasterInfo:
    """What a raster's header says: size, bands, georeference and acquisition time."""

    path: str
    shape: tuple[int, int]
    count: int
    dtypes: tuple[str, ...]
    crs: Any
    transform: Any
    acquired: np.datetime64 | None


def _acquired(src: Any, path: str) -> np.datetime64 | None:
    text = src.tags(ns=ACQUISITION_DOMAIN).get(ACQUISITION_ITEM)
    if text is None:
        return None
    try:
        return np.datetime64(text.strip().replace(" ", "T"), "s")
    except ValueError:
        raise ValueError(f"raster '{path}': metadata {ACQUISITION_DOMAIN}/{ACQUISITION_ITEM}: "
                         f"expected a UTC time such as '2023-03-19 05:50:35', found "
                         f"{text!r}") from None


def _check_blocks_in_file(src: Any, path: str) -> None:
    """Refuse a raster whose last block (of each band) lies beyond the end of the file: a
    truncated file, found from its header instead of by a read failing mid-computation."""
    if src.driver != "GTiff":
        return
    size = os.path.getsize(path)
    for band in range(1, src.count + 1):
        rows, cols = src.block_shapes[band - 1]
        x, y = -(-src.width // cols) - 1, -(-src.height // rows) - 1
        offset = src.get_tag_item(f"BLOCK_OFFSET_{x}_{y}", "TIFF", bidx=band)
        length = src.get_tag_item(f"BLOCK_SIZE_{x}_{y}", "TIFF", bidx=band)
        if offset is None or length is None:
            continue
        end = int(offset) + int(length)
        if end > size:
            raise ValueError(f"raster '{path}': expected {end} bytes or more (band {band}'s "
                             f"last block ends there, says its header), found {size}: a "
                             "truncated file")


def raster_info(path: str | os.PathLike) -> RasterInfo:
    """The header of a raster, checked for a truncated file.

    Raises
    ------
    OSError
        GDAL cannot open the file (named).
    ValueError
        A GeoTIFF shorter than its header says, or an unreadable acquisition time (named).
    """
    with open_radar_raster(path) as src:
        _check_blocks_in_file(src, str(path))
        return RasterInfo(str(path), (src.height, src.width), src.count, tuple(src.dtypes),
                          src.crs, src.transform, _acquired(src, str(path)))


def check_acquisition_dates(infos: Sequence[RasterInfo], dates: Sequence[Any] | np.ndarray, *,
                            field: str = "dates") -> None:
    """Refuse ``dates`` (one per raster) that contradict the acquisition time a raster records
    (:data:`ACQUISITION_ITEM`); rasters without one are not checked.

    Raises
    ------
    ValueError
        Naming the file, the date it records and the date given for it.
    """
    for k, (info, date) in enumerate(zip(infos, dates)):
        given = np.datetime64(date).astype("datetime64[D]")
        if info.acquired is not None and info.acquired.astype("datetime64[D]") != given:
            raise ValueError(f"{field}[{k}]: expected the acquisition date '{info.path}' records "
                             f"({ACQUISITION_DOMAIN}/{ACQUISITION_ITEM} {info.acquired}), "
                             f"{info.acquired.astype('datetime64[D]')}, found {given}")


@dataclass(frozen=True)
class _RasterBand:
    """One band of a raster as a lazily read 2-D array; a failed read names the file."""

    path: str
    band: int
    shape: tuple[int, int]
    dtype: np.dtype
    ndim: int = 2

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        from rasterio.windows import Window

        rows, cols = (range(n)[k] for n, k in zip(self.shape, key))
        window = Window(cols.start, rows.start, len(cols), len(rows))
        with open_radar_raster(self.path) as src:
            try:
                return src.read(self.band, window=window)
            except Exception as err:  # noqa: BLE001 -- any failed read, named
                raise OSError(f"raster '{self.path}' band {self.band}: expected {len(rows)} x "
                              f"{len(cols)} readable samples from line {rows.start}, pixel "
                              f"{cols.start}, found an error: {err}") from err


def open_band(info: RasterInfo, band: int, chunks: tuple[Any, Any]) -> da.Array:
    """Band ``band`` (from 1) of a raster as a lazy Dask array; the graph holds the file name."""
    name = info.dtypes[band - 1]
    # GDAL's CInt16 has no numpy type: rasterio reads it as complex64
    dtype = np.dtype(np.complex64 if name == "complex_int16" else name)
    array = _RasterBand(info.path, band, info.shape, dtype)
    return da.from_array(array, chunks=chunks, lock=False, fancy=False, asarray=False,
                         meta=np.empty((0, 0), dtype=array.dtype),
                         name=f"raster-{tokenize(info.path, band, os.path.getmtime(info.path))}")


def from_geotiff(
    files: str | os.PathLike | Iterable[str | os.PathLike],
    *,
    dates: Iterable[Any] | None = None,
    band_layout: BandLayout = "complex",
    metadata: Any = None,
    wavelength: float | None = None,
    chunks: Any = None,
) -> xr.Dataset:
    """Read complex SLC rasters in any GDAL format (GeoTIFF, ENVI, ...) into one SLC stack.

    Needs the optional ``geo`` extra (``rasterio``). Before any pixel is read, each file's
    header is read (:func:`raster_info`: a GeoTIFF shorter than its header says is refused),
    and with one epoch per file its date is checked against a YYYYMMDD date in its name and
    the acquisition time it records (``IMAGERY/ACQUISITIONDATETIME``). Pixels are read lazily
    by blocks; a block that fails to read names its file.

    Parameters
    ----------
    files
        One or more rasters of the same size; their bands, file after file, are the epochs.
    dates
        One date per epoch (see :func:`~depsi.io.binary.from_binary`); or give ``metadata``.
    band_layout
        ``"complex"``: each band is one complex epoch (GDAL ``CFloat32``/``CInt16``/...).
        ``"iq"``: bands come in pairs, in-phase then quadrature, one pair per epoch.
    metadata, wavelength
        As in :func:`~depsi.io.binary.from_binary`.
    chunks
        Block shape as in :func:`~depsi.io.binary.from_binary`.

    Returns
    -------
    xarray.Dataset
        ``complex`` (complex64) on ``(azimuth, range, time)``; attrs ``wavelength`` when known,
        ``crs`` (WKT) and ``transform`` when the rasters are georeferenced.

    Raises
    ------
    ImportError
        Without rasterio.
    OSError
        A file GDAL cannot open or (at compute time) read, named.
    FileNotFoundError, ValueError
        Missing files, rasters of different sizes, real bands with ``band_layout="complex"``,
        an odd number of bands with ``"iq"``, a number of epochs different from the dates, a
        truncated GeoTIFF, a date other than the one in the file's name or metadata.

    Examples
    --------
    >>> import tempfile, pathlib, numpy as np
    >>> try:
    ...     import rasterio
    ... except ImportError:  # without the 'geo' extra
    ...     rasterio = None
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "slc.tif"
    >>> if rasterio is not None:
    ...     with rasterio.open(path, "w", driver="GTiff", width=5, height=3, count=1,
    ...                        dtype="complex64", transform=rasterio.Affine(1, 0, 0, 0, -1, 3)
    ...                        ) as tif:
    ...         tif.write(np.full((1, 3, 5), 1 + 2j, dtype="c8"))
    ...     ds = from_geotiff([path], dates=["2023-03-19"], wavelength=0.0555)
    ...     print(complex(ds.complex[0, 0, 0]))
    ... else:
    ...     print(1 + 2j)
    (1+2j)
    """
    if band_layout not in ("complex", "iq"):
        raise ValueError(f"band_layout: expected 'complex' or 'iq', found {band_layout!r}")
    paths = _path_list(files, "files")
    _check_exist(paths, "files")
    info = {path: raster_info(path) for path in paths}
    shapes = {p: i.shape for p, i in info.items()}
    shape = shapes[paths[0]]
    if any(s != shape for s in shapes.values()):
        raise ValueError(f"files: expected one raster size for all files, found "
                         f"{ {str(p): s for p, s in shapes.items()} }")
    for path, (count, dtypes) in ((p, (i.count, i.dtypes)) for p, i in info.items()):
        is_complex = [t.startswith("complex") for t in dtypes]
        if band_layout == "complex" and not all(is_complex):
            raise ValueError(f"band_layout='complex': expected complex bands, found "
                             f"{sorted(set(dtypes))} in '{path}' (for real I and Q bands use "
                             "band_layout='iq')")
        if band_layout == "iq" and (count % 2 or any(is_complex)):
            raise ValueError(f"band_layout='iq': expected an even number of real bands (I, Q "
                             f"per epoch), found {count} band(s) of {sorted(set(dtypes))} in "
                             f"'{path}'")
    per_file = [info[p].count // (2 if band_layout == "iq" else 1) for p in paths]
    n_epochs = sum(per_file)
    names = [f"{p} epoch {k}" for p, n in zip(paths, per_file) for k in range(n)]
    if dates is None and metadata is None:
        raise ValueError("dates: expected one date per epoch (or metadata=), found neither")
    epochs = _epochs(n_epochs, names, dates=dates, metadata=metadata, wavelength=wavelength)
    if dates is not None and all(n == 1 for n in per_file):
        given = _parse_dates(dates, n_epochs)
        check_dates_in_names(paths, given)
        check_acquisition_dates([info[p] for p in paths], given)
    block = _chunks(chunks, shape, n_epochs)

    planes = []
    for path in paths:
        bands = [open_band(info[path], b, block[:2]) for b in range(1, info[path].count + 1)]
        if band_layout == "complex":
            planes += [band.astype(np.complex64) for band in bands]
        else:
            planes += [da.map_blocks(_iq_to_complex64, bands[b], bands[b + 1],
                                     dtype=np.complex64)
                       for b in range(0, len(bands), 2)]
    cube = da.stack([planes[i] for i in epochs.order], axis=-1).rechunk(block)
    crs, transform = info[paths[0]].crs, info[paths[0]].transform
    attrs: dict[str, Any] = {"wavelength": epochs.wavelength}
    if crs is not None:
        attrs["crs"] = crs.to_wkt()
        attrs["transform"] = [float(v) for v in tuple(transform)[:6]]
    return _finish(_raster(cube, epochs.time, attrs), "depsi.io.geotiff.from_geotiff")


# ----------------------------------------------------------------------------------------------
# The pipeline's GeoTIFF stack: SLCs, h2ph and position rasters
# ----------------------------------------------------------------------------------------------

#: Valid WGS84 degrees of the position rasters, and the side of the decimated sample of each
#: that is checked against them (a whole raster is not read before the pixel work).
POSITION_LIMITS = {"lat": 90.0, "lon": 180.0}
POSITION_SAMPLE = 512


def _check_position_raster(path: Path, name: str) -> None:
    """Refuse a lat/lon raster whose values (on a decimated sample) are not WGS84 degrees."""
    with open_radar_raster(path) as src:
        sample = src.read(1, out_shape=(min(src.height, POSITION_SAMPLE),
                                        min(src.width, POSITION_SAMPLE)))
    sample = sample[np.isfinite(sample)]
    limit = POSITION_LIMITS[name]
    if sample.size and np.abs(sample).max() > limit:
        raise ValueError(f"input.path: '{path}': expected {name} in WGS84 degrees within "
                         f"-{limit:g}..{limit:g}, found {sample.min():g}..{sample.max():g}")


def open_geotiff_stack(source: Path, *, dates: Sequence[Any], wavelength: float,
                       h2ph_folder: str | os.PathLike | None = None) -> xr.Dataset:
    """A GeoTIFF stack (``input.format: geotiff``): the SLC rasters of ``source`` with
    ``dates`` and ``wavelength`` from the configuration, h2ph from the ``h2ph_*.tif`` rasters
    (beside the SLCs or in ``h2ph_folder``, ``input.h2ph``), positions from
    ``lat.tif``/``lon.tif`` beside the SLCs (WGS84 degrees per radar pixel, as ISCE2's or
    SNAP's geometry exports)."""
    tifs = sorted(p for p in source.iterdir() if p.suffix.lower() in (".tif", ".tiff"))
    h2ph_dir = Path(h2ph_folder) if h2ph_folder is not None else source
    h2ph_files = sorted(p for p in h2ph_dir.iterdir() if p.name.lower().startswith("h2ph")
                        and p.suffix.lower() in (".tif", ".tiff"))
    position_files = {name: source / f"{name}.tif" for name in ("lat", "lon")}
    slc_files = [p for p in tifs if p not in h2ph_files
                 and p not in position_files.values()]
    if not slc_files:
        raise FileNotFoundError(f"input.path: expected SLC GeoTIFFs (*.tif) in "
                                f"{str(source)!r}, found none")
    if len(h2ph_files) != len(dates):
        raise ValueError(f"input.h2ph: expected one h2ph_*.tif per epoch ({len(dates)} "
                         f"dates) in {str(h2ph_dir)!r}, found {len(h2ph_files)}: the chain "
                         "needs h2ph and GeoTIFF SLCs carry no orbits")
    if len(slc_files) == len(dates):
        check_dates_in_names(slc_files, dates, field="input.dates")
    # the h2ph rasters are taken in their names' order, which must be the dates' time order
    in_time_order = sorted(np.array(dates, dtype="datetime64[D]"))
    check_dates_in_names(h2ph_files, in_time_order, field="input.dates (in time order)")
    h2ph_info = [raster_info(path) for path in h2ph_files]
    check_acquisition_dates(h2ph_info, in_time_order, field="input.dates (in time order)")
    stack = from_geotiff(slc_files, dates=dates, wavelength=wavelength)
    block = stack["complex"].data.chunksize[:2]
    layers = []
    for info in h2ph_info:
        if info.shape != (stack.sizes["azimuth"], stack.sizes["range"]):
            raise ValueError(f"input.h2ph: '{info.path}': expected {stack.sizes['azimuth']} x "
                             f"{stack.sizes['range']} pixels like the SLCs, found "
                             f"{info.shape[0]} x {info.shape[1]}")
        layers.append(open_band(info, 1, block).astype(np.float32))
    order = np.argsort(np.array(dates, dtype="datetime64[D]"), kind="stable")
    h2ph = da.stack([layers[i] for i in order], axis=-1).rechunk(stack["complex"].chunks)
    stack = stack.assign(h2ph=(("azimuth", "range", "time"), h2ph))
    if all(p.is_file() for p in position_files.values()):
        for name, path in position_files.items():
            _check_position_raster(path, name)
            info = raster_info(path)
            if info.shape != (stack.sizes["azimuth"], stack.sizes["range"]):
                raise ValueError(f"input.path: '{path}': expected {stack.sizes['azimuth']} x "
                                 f"{stack.sizes['range']} pixels like the SLCs, found "
                                 f"{info.shape[0]} x {info.shape[1]}")
            stack = stack.assign_coords({name: (("azimuth", "range"),
                                                open_band(info, 1, block).astype(np.float64))})
    return stack


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def write_geotiff_stack(folder: Path, stack: xr.Dataset, geometry) -> dict[str, Any]:
    """One complex64 GeoTIFF per epoch (``slc_YYYYMMDD.tif``), one float32 h2ph GeoTIFF per
    epoch (``h2ph_YYYYMMDD.tif``), each recording its epoch's time as GDAL's
    ``IMAGERY/ACQUISITIONDATETIME``, and float64 ``lat.tif``/``lon.tif`` (geocoded from the
    geometry), as an SLC stack exported by GDAL-based tools."""

    from depsi.geometry import radar_to_geo

    folder.mkdir(parents=True, exist_ok=True)
    dates = [np.datetime_as_string(t, unit="D") for t in stack["time"].values]
    acquired = [np.datetime_as_string(t, unit="s").replace("T", " ")
                for t in stack["time"].values]
    n_az, n_rg = stack.sizes["azimuth"], stack.sizes["range"]
    values = dask.compute(stack["complex"].data, stack["h2ph"].data)
    files: dict[str, Any] = {"slc_files": [], "h2ph_files": []}
    for t, day in enumerate(dates):
        for kind, data, dtype in (("slc", values[0], "complex64"), ("h2ph", values[1], "float32")):
            path = folder / f"{kind}_{day.replace('-', '')}.tif"
            part = path.with_name(path.name + ".part")
            _write_band(part, np.ascontiguousarray(data[:, :, t], dtype=dtype),
                        {ACQUISITION_ITEM: acquired[t]})
            os.replace(part, path)
            files[f"{kind}_files"].append(path)
    azimuth, range_ = np.meshgrid(np.arange(n_az), np.arange(n_rg), indexing="ij")
    for name, values in zip(("lat", "lon"), radar_to_geo(geometry, azimuth, range_)):
        path = folder / f"{name}.tif"
        _write_band(path, np.asarray(values, np.float64))
        files[f"{name}_file"] = path
    return files | {"dates": dates}


__all__ = [
    "ACQUISITION_DOMAIN",
    "ACQUISITION_ITEM",
    "BandLayout",
    "RasterInfo",
    "check_acquisition_dates",
    "check_dates_in_names",
    "date_in_name",
    "from_geotiff",
    "open_geotiff_stack",
    "open_band",
    "raster_info",
    "write_geotiff_stack",
]
