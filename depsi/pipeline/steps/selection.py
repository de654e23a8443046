"""The selection step: the PS candidates of the stack by amplitude dispersion and, where
asked or where the amplitudes cannot tell, the distributed scatterers beside them; opened for
the chain as its input points."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import xarray as xr

from depsi.pipeline.steps import ConfigView, Inputs, StepContext
from depsi.stm.schema import validate

logger = logging.getLogger(__name__)


def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """The PS candidates of the stack (``selection``) and, with ``selection.ds.enabled``, the
    distributed scatterers beside them; geocoded on ``input.dem`` if given."""
    from depsi.processing.selection import ps_selection

    stack = inputs["stack"]
    section = config.selection
    ps = ps_selection(stack, method=section.method, threshold=section.threshold,
                      engine=section.engine, progress=context.progress)
    ds = section.ds
    enabled = ds.enabled is True
    interferograms = ps.attrs.get("input_kind") == "interferograms"
    blind = ps.attrs.get("selection_instead_of") or interferograms
    if blind and ds.enabled == "auto":
        # multilooked amplitudes or interferograms: the phase carries the measurement, and
        # most of the coherent pixels are distributed scatterers
        enabled = True
        logger.warning("selection: %s; distributed scatterers are added (selection.ds."
                       "enabled: false leaves them out)",
                       "the stack is interferograms" if interferograms
                       else "the amplitudes cannot separate the pixels")
    if enabled:
        from depsi.processing.scatterers import ds_selection, merge_scatterers

        ps = merge_scatterers(ps, ds_selection(
            stack, window=tuple(ds.window), alpha=ds.alpha, min_looks=ds.min_looks,
            method=ds.method, min_temporal_coherence=ds.min_temporal_coherence,
            prescreen_sigmas=ds.prescreen_sigmas, ministack=ds.ministack,
            max_compressed=ds.max_compressed))
    if config.input.dem is not None:
        from depsi.geometry import geocode_with_dem, open_dem

        ps = geocode_with_dem(ps, open_dem(config.input.dem))
    return ps


def counts(product: xr.Dataset) -> dict[str, Any]:
    """The candidates, the points selected among them (and the DS among those), the epochs."""
    counted = {"candidates": int(product.attrs.get("n_candidates", 0)),
               "selected": int(product.sizes["space"]), "epochs": int(product.sizes["time"])}
    if "n_ds" in product.attrs:  # distributed scatterers among the selected points
        counted["ds"] = int(product.attrs["n_ds"])
    return counted


def prepare_points(ps_stm: xr.Dataset) -> xr.Dataset:
    """The chain's input points: single-mother interferograms (formed from ``complex`` when
    the STM holds SLC values) with ``point_index`` (position along the input's space)."""
    points = ps_stm
    if "complex" in points and (("phase" not in points) or "interferogram" not in points.attrs):
        # SLC values (e.g. straight from ps_selection, whose ``phase`` is the SLC phase):
        # form single-mother interferograms first
        from depsi.processing.interferogram import single_mother_interferograms

        points = single_mother_interferograms(points)
    validate(points, "points", require=("phase", "h2ph"), require_wavelength=True)
    return points.assign_coords(point_index=("space", np.arange(points.sizes["space"])))


def open_product(path: str | os.PathLike, config: ConfigView) -> xr.Dataset:
    """The selection's points as the chain takes them (:func:`prepare_points`)."""
    from depsi.io import open_stm

    return prepare_points(open_stm(path))
