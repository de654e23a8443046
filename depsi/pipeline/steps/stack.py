"""The stack step: the input stack simulated, or read in place; opened and checked before any
pixel is read (its geometry, its epochs against the model, the DS window against the scene)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xarray as xr

from depsi.pipeline.input_stack import _check_stack_geometry, open_stack
from depsi.pipeline.preflight import check_ds_window, check_model, check_stack_support
from depsi.pipeline.steps import ConfigView, Inputs, StepContext


def _support_counts(support: dict[str, Any]) -> dict[str, Any]:
    """The predicted precisions of :func:`check_stack_support` as the stack step's counts."""
    velocity, height = support["velocity_std"], support["height_std"]
    return {"span_days": support["span_days"],
            "velocity_std_mm_yr": None if velocity is None else round(velocity * 1000, 2),
            "height_std_m": None if height is None else round(height, 1),
            "drop_height": support["drop_height"], "support_warnings": len(support["warnings"])}


def run(inputs: Inputs, config: ConfigView, context: StepContext) -> xr.Dataset:
    """The input stack: simulated into ``context.target`` (``input.format: simulated``) or the
    input read in place; opened and checked (geometry, epochs) before any pixel is read.

    Returns the stack as opened and checked, which the following steps of the run take instead
    of opening and checking it again; its sizes and predicted precisions go to
    ``context.counts``."""
    product = context.written_product()
    path = product if config.input.format == "simulated" else Path(config.input.path)
    if config.input.format == "simulated":
        from depsi.simulate import write_stack_zarr

        sim = config.input.simulate
        kwargs = dict(shape=tuple(sim.shape), n_epochs=sim.n_epochs, seed=sim.seed,
                      ps_fraction=sim.ps_fraction, ds_regions=sim.ds_regions)
        if sim.chunks is not None:
            kwargs["chunks"] = tuple(sim.chunks)
        write_stack_zarr(path, overwrite=True, progress=context.progress, **kwargs)
    stack = open_stack(config, path=path)
    _check_stack_geometry(stack, config)
    support = check_stack_support(stack, config)  # before selection: refuse too few epochs
    # the model's terms at the stack's epochs (a temperature for each, dates within them)
    check_model(config, stack["time"].values)
    check_ds_window(config, (int(stack.sizes["azimuth"]), int(stack.sizes["range"])))
    context.counts.update({"azimuth": int(stack.sizes["azimuth"]),
                           "range": int(stack.sizes["range"]),
                           "epochs": int(stack.sizes["time"]), **_support_counts(support)})
    return stack


def open_product(path: str | os.PathLike, config: ConfigView) -> xr.Dataset:
    """The stack as every step reads it (:func:`~depsi.pipeline.input_stack.open_stack`)."""
    return open_stack(config, path=path)
