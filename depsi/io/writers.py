"""Writing an SLC stack in the formats users bring: one dispatch over each format's writer, which
lives beside its reader (DORIS-5, GAMMA, ISCE2, BEAM-DIMAP, znap, GeoTIFF)."""

from __future__ import annotations

import os
from pathlib import Path

import xarray as xr

from depsi.geometry import StackGeometry
from depsi.io.dimap_writer import write_dimap
from depsi.io.doris_writer import write_doris_stack
from depsi.io.gamma_writer import write_gamma
from depsi.io.geotiff import write_geotiff_stack
from depsi.io.isce2_writer import write_isce2
from depsi.io.znap import write_znap

#: Stack formats :func:`write_slc_stack` writes (each read back by its reader in depsi.io).
STACK_FORMATS = ("doris", "gamma", "isce2", "dimap", "snap", "geotiff")


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
        Replace an existing stack (doris, dimap and snap refuse otherwise; the others
        overwrite).

    Returns
    -------
    Path
        What the format's reader (or ``input.path``) takes: ``folder``, or the ``.dim`` file.

    Raises
    ------
    ValueError
        An unknown ``format``.
    """
    if format not in STACK_FORMATS:
        raise ValueError(f"format: expected one of {STACK_FORMATS}, found {format!r}")
    folder = Path(folder)
    path = folder
    if format == "doris":
        write_doris_stack(folder, stack, geometry, overwrite=overwrite)
    elif format == "gamma":
        write_gamma(folder, stack.drop_vars("h2ph"), geometry)
    elif format == "isce2":
        write_isce2(folder, stack.drop_vars("h2ph"), geometry)
    elif format == "dimap":
        folder.mkdir(parents=True, exist_ok=True)
        path = write_dimap(folder / "stack.dim", stack, geometry, overwrite=overwrite)
    elif format == "snap":
        write_znap(folder, stack, geometry, overwrite=overwrite)
    else:
        write_geotiff_stack(folder, stack, geometry)
    return path


__all__ = ["STACK_FORMATS", "write_slc_stack"]
