"""Complex SLC rasters in any GDAL format (GeoTIFF, ENVI, ...) through rioxarray: the reader
:func:`from_geotiff` (needs the optional ``geo`` extra).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
import xarray as xr

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


def check_dates_in_names(paths: Sequence[str | os.PathLike], dates: Sequence[Any], *,
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


def _require_rioxarray() -> Any:
    try:
        import rioxarray
    except ImportError as err:
        raise ImportError("from_geotiff needs rioxarray (and rasterio): install the 'geo' extra,"
                          " pip install 'depsi[geo]'") from err
    return rioxarray


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

    Needs the optional ``geo`` extra (``rioxarray``, ``rasterio``).

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
        Without rioxarray.
    FileNotFoundError, ValueError
        Missing files, rasters of different sizes, real bands with ``band_layout="complex"``,
        an odd number of bands with ``"iq"``, a number of epochs different from the dates.

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
    rioxarray = _require_rioxarray()
    import rasterio

    if band_layout not in ("complex", "iq"):
        raise ValueError(f"band_layout: expected 'complex' or 'iq', found {band_layout!r}")
    paths = _path_list(files, "files")
    _check_exist(paths, "files")
    info = {}
    with warnings.catch_warnings():
        # an SLC in radar geometry has no geotransform by nature
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        for path in paths:
            with rasterio.open(path) as src:
                info[path] = (src.height, src.width, src.count, src.dtypes, src.crs,
                              src.transform)
    shapes = {p: i[:2] for p, i in info.items()}
    shape = shapes[paths[0]]
    if any(s != shape for s in shapes.values()):
        raise ValueError(f"files: expected one raster size for all files, found "
                         f"{ {str(p): s for p, s in shapes.items()} }")
    for path, (_, _, count, dtypes, _, _) in info.items():
        is_complex = [t.startswith("complex") for t in dtypes]
        if band_layout == "complex" and not all(is_complex):
            raise ValueError(f"band_layout='complex': expected complex bands, found "
                             f"{sorted(set(dtypes))} in '{path}' (for real I and Q bands use "
                             "band_layout='iq')")
        if band_layout == "iq" and (count % 2 or any(is_complex)):
            raise ValueError(f"band_layout='iq': expected an even number of real bands (I, Q "
                             f"per epoch), found {count} band(s) of {sorted(set(dtypes))} in "
                             f"'{path}'")
    per_file = [info[p][2] // (2 if band_layout == "iq" else 1) for p in paths]
    n_epochs = sum(per_file)
    names = [f"{p} epoch {k}" for p, n in zip(paths, per_file) for k in range(n)]
    if dates is None and metadata is None:
        raise ValueError("dates: expected one date per epoch (or metadata=), found neither")
    epochs = _epochs(n_epochs, names, dates=dates, metadata=metadata, wavelength=wavelength)
    if dates is not None and all(n == 1 for n in per_file):
        check_dates_in_names(paths, _parse_dates(dates, n_epochs))
    block = _chunks(chunks, shape, n_epochs)

    planes = []
    for path in paths:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            bands = rioxarray.open_rasterio(path, chunks={"band": 1, "y": block[0],
                                                          "x": block[1]},
                                            lock=False, mask_and_scale=False).data
        if band_layout == "complex":
            planes += [bands[b].astype(np.complex64) for b in range(bands.shape[0])]
        else:
            planes += [da.map_blocks(_iq_to_complex64, bands[b], bands[b + 1],
                                     dtype=np.complex64)
                       for b in range(0, bands.shape[0], 2)]
    cube = da.stack([planes[i] for i in epochs.order], axis=-1).rechunk(block)
    _, _, _, _, crs, transform = info[paths[0]]
    attrs: dict[str, Any] = {"wavelength": epochs.wavelength}
    if crs is not None:
        attrs["crs"] = crs.to_wkt()
        attrs["transform"] = [float(v) for v in tuple(transform)[:6]]
    return _finish(_raster(cube, epochs.time, attrs), "depsi.io.geotiff.from_geotiff")


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def write_geotiff_stack(folder: Path, stack: xr.Dataset, geometry) -> dict[str, Any]:
    """One complex64 GeoTIFF per epoch (``slc_YYYYMMDD.tif``), one float32 h2ph GeoTIFF per
    epoch (``h2ph_YYYYMMDD.tif``) and float64 ``lat.tif``/``lon.tif`` (geocoded from the
    geometry), as an SLC stack exported by GDAL-based tools."""
    import rasterio

    from depsi.io.geometry import radar_to_geo

    folder.mkdir(parents=True, exist_ok=True)
    dates = [np.datetime_as_string(t, unit="D") for t in stack["time"].values]
    n_az, n_rg = stack.sizes["azimuth"], stack.sizes["range"]
    values = dask.compute(stack["complex"].data, stack["h2ph"].data)
    files: dict[str, list[Path]] = {"slc_files": [], "h2ph_files": []}
    for t, day in enumerate(dates):
        for kind, data, dtype in (("slc", values[0], "complex64"), ("h2ph", values[1], "float32")):
            path = folder / f"{kind}_{day.replace('-', '')}.tif"
            part = path.with_name(path.name + ".part")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
                with rasterio.open(part, "w", driver="GTiff", width=n_rg, height=n_az, count=1,
                                   dtype=dtype) as tif:
                    tif.write(np.ascontiguousarray(data[:, :, t], dtype=dtype)[None])
            os.replace(part, path)
            files[f"{kind}_files"].append(path)
    azimuth, range_ = np.meshgrid(np.arange(n_az), np.arange(n_rg), indexing="ij")
    for name, values in zip(("lat", "lon"), radar_to_geo(geometry, azimuth, range_)):
        path = folder / f"{name}.tif"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
            with rasterio.open(path, "w", driver="GTiff", width=n_rg, height=n_az, count=1,
                               dtype="float64") as tif:
                tif.write(values[None])
        files[f"{name}_file"] = path
    return files | {"dates": dates}


__all__ = [
    "BandLayout",
    "check_dates_in_names",
    "date_in_name",
    "from_geotiff",
    "write_geotiff_stack",
]
