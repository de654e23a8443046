"""The stack formats depsi reads, one entry each in :data:`READERS`: the reader that ``depsi run``
opens ``input.path`` with, the writer of the formats depsi also writes (``depsi simulate
--format``, :func:`~depsi.io.writers.write_slc_stack`), and what a format needs beside the path.

The pipeline's ``input.format`` takes these names and ``simulated``; the table of
``docs/steps/reading.md`` names the same (``tests/test_formats_registry.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xarray as xr

from depsi.geometry import StackGeometry
from depsi.io.binary import open_binary_folder
from depsi.io.dimap import from_dimap
from depsi.io.dimap_writer import write_dimap
from depsi.io.doris import from_doris_stack
from depsi.io.doris_writer import write_doris_stack
from depsi.io.gamma import from_gamma
from depsi.io.gamma_writer import write_gamma
from depsi.io.geotiff import open_geotiff_stack, write_geotiff_stack
from depsi.io.interferograms import from_interferograms
from depsi.io.isce2 import from_isce2
from depsi.io.isce2_writer import write_isce2
from depsi.io.slc_zarr import open_slc_zarr
from depsi.io.znap import from_snap
from depsi.io.znap_writer import write_znap

#: ``read(source, options)``: ``source`` is ``input.path`` (it exists), ``options`` the
#: ``input`` section (its ``geometry``, ``dates``, ``wavelength``, ``h2ph``, ``shape``,
#: ``layout``); returns the lazy raster stack.
Reader = Callable[[Path, Any], xr.Dataset]
#: ``write(folder, stack, geometry, overwrite)``: writes the stack and its geometry; returns
#: what the reader takes (``folder``, or a product file in it).
Writer = Callable[[Path, xr.Dataset, StackGeometry, bool], Path]


@dataclass(frozen=True)
class StackFormat:
    """One stack format: how it is read, how depsi writes it, and what it needs.

    Attributes
    ----------
    read
        The reader (:data:`Reader`).
    write
        The writer (:data:`Writer`); None where depsi writes no such stack (the simulator
        writes its Zarr and binary stacks itself, with their truth).
    needs
        Keys of the ``input`` section the format needs beside ``path``.
    takes_geometry
        Whether the reader takes ``input.geometry`` (``orbits``: h2ph and lat/lon computed
        from the product's orbit state vectors even where it has its own).
    """

    read: Reader
    write: Writer | None = None
    needs: tuple[str, ...] = ()
    takes_geometry: bool = False


def _read_zarr(source: Path, options: Any) -> xr.Dataset:
    return open_slc_zarr(source)


def _read_binary(source: Path, options: Any) -> xr.Dataset:
    return open_binary_folder(source)


def _refuse_existing(folder: Path, overwrite: bool, patterns: tuple[str, ...]) -> None:
    """For a writer that replaces its files by name: refuse a folder that already holds files
    of such a stack, unless ``overwrite`` (as the DORIS, DIMAP and znap writers do)."""
    if overwrite or not folder.is_dir():
        return
    found = sorted(str(path) for pattern in patterns for path in folder.glob(pattern))
    if found:
        raise FileExistsError(f"files of a stack already exist in '{folder}': {found[:3]}"
                              f"{' ...' if len(found) > 3 else ''}; pass overwrite=True "
                              f"(--overwrite) to replace them")


def _read_doris(source: Path, options: Any) -> xr.Dataset:
    return from_doris_stack(source, geometry=options.geometry)


def _write_doris(folder: Path, stack: xr.Dataset, geometry: StackGeometry,
                 overwrite: bool) -> Path:
    write_doris_stack(folder, stack, geometry, overwrite=overwrite)
    return folder


def _read_gamma(source: Path, options: Any) -> xr.Dataset:
    return from_gamma(source, geometry=options.geometry)


def _write_gamma(folder: Path, stack: xr.Dataset, geometry: StackGeometry,
                 overwrite: bool) -> Path:
    _refuse_existing(folder, overwrite, ("*.rslc", "*.rslc.par"))
    write_gamma(folder, stack.drop_vars("h2ph"), geometry)  # GAMMA stacks carry no h2ph
    return folder


def _read_isce2(source: Path, options: Any) -> xr.Dataset:
    return from_isce2(source, geometry=options.geometry)


def _write_isce2(folder: Path, stack: xr.Dataset, geometry: StackGeometry,
                 overwrite: bool) -> Path:
    _refuse_existing(folder, overwrite, ("merged", "reference"))
    write_isce2(folder, stack.drop_vars("h2ph"), geometry)  # ISCE2 stacks carry no h2ph
    return folder


def _read_dimap(source: Path, options: Any) -> xr.Dataset:
    return from_dimap(sorted(source.glob("*.dim")) if source.is_dir() else source,
                      geometry=options.geometry)


def _write_dimap(folder: Path, stack: xr.Dataset, geometry: StackGeometry,
                 overwrite: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_dimap(folder / "stack.dim", stack, geometry, overwrite=overwrite)


def _read_snap(source: Path, options: Any) -> xr.Dataset:
    return from_snap(sorted(source.glob("*.znap")) or source, geometry=options.geometry)


def _write_snap(folder: Path, stack: xr.Dataset, geometry: StackGeometry,
                overwrite: bool) -> Path:
    write_znap(folder, stack, geometry, overwrite=overwrite)
    return folder


def _read_geotiff(source: Path, options: Any) -> xr.Dataset:
    return open_geotiff_stack(source, dates=options.dates, wavelength=options.wavelength,
                              h2ph_folder=options.h2ph)


def _write_geotiff(folder: Path, stack: xr.Dataset, geometry: StackGeometry,
                   overwrite: bool) -> Path:
    _refuse_existing(folder, overwrite, ("slc_*.tif", "h2ph_*.tif", "lat.tif", "lon.tif"))
    write_geotiff_stack(folder, stack, geometry)
    return folder


def _read_interferograms(source: Path, options: Any) -> xr.Dataset:
    return from_interferograms(source, wavelength=options.wavelength, shape=options.shape,
                               layout=options.layout)


#: Every stack format by its ``input.format`` name.
READERS: dict[str, StackFormat] = {
    "zarr": StackFormat(_read_zarr),
    "binary": StackFormat(_read_binary),
    "doris": StackFormat(_read_doris, _write_doris, takes_geometry=True),
    "gamma": StackFormat(_read_gamma, _write_gamma, takes_geometry=True),
    "isce2": StackFormat(_read_isce2, _write_isce2, takes_geometry=True),
    "dimap": StackFormat(_read_dimap, _write_dimap, takes_geometry=True),
    "snap": StackFormat(_read_snap, _write_snap, takes_geometry=True),
    "geotiff": StackFormat(_read_geotiff, _write_geotiff, needs=("dates", "wavelength")),
    "interferograms": StackFormat(_read_interferograms,
                                  needs=("wavelength", "pixel_spacing")),
}

#: The formats depsi writes (those of :data:`READERS` with a writer).
STACK_FORMATS = tuple(name for name, entry in READERS.items() if entry.write is not None)

__all__ = ["READERS", "STACK_FORMATS", "Reader", "StackFormat", "Writer"]
