"""Writing an SLC stack in the formats users bring, through the writer of each format's entry in
:data:`~depsi.io.formats.READERS` (DORIS-5, GAMMA, ISCE2, BEAM-DIMAP, znap, GeoTIFF)."""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr

from depsi.geometry import StackGeometry
from depsi.io.formats import READERS, STACK_FORMATS


def write_slc_stack(folder: str | os.PathLike, stack: xr.Dataset, geometry: StackGeometry, *,
                    format: str, overwrite: bool = False) -> Path:
    """Write a raster stack and its geometry in one of :data:`STACK_FORMATS`.

    Parameters
    ----------
    folder
        Where the stack goes (created; a BEAM-DIMAP product is ``folder/stack.dim``).
    stack
        ``complex`` and ``h2ph`` on ``(azimuth, range, time)`` (GAMMA and ISCE2 stacks carry no
        h2ph: it is left out), with no coordinates beyond ``azimuth``, ``range``, ``time``.
    geometry
        The stack's :class:`~depsi.geometry.StackGeometry` (radar grid, orbits, mother).
    format
        ``doris`` (DORIS-5 stack folder, doris_stack layout), ``gamma`` (rslc + slc.par),
        ``isce2`` (topsStack merged/ layout), ``dimap`` (SNAP BEAM-DIMAP), ``snap`` (SNAP znap
        Zarr products, one ``YYYYMMDD-coreg.znap`` per date), ``geotiff`` (one complex GeoTIFF
        and one h2ph GeoTIFF per epoch).
    overwrite
        Replace the files of an existing stack; otherwise a folder that holds them already is
        refused (FileExistsError) before anything is written.

    Returns
    -------
    Path
        What the format's reader (or ``input.path``) takes: ``folder``, or the ``.dim`` file.

    Raises
    ------
    ValueError
        An unknown ``format``.
    """
    write = READERS[format].write if format in READERS else None
    if write is None:
        raise ValueError(f"format: expected one of {STACK_FORMATS}, found {format!r}")
    return write(Path(folder), stack, geometry, overwrite)


__all__ = ["STACK_FORMATS", "write_slc_stack"]
