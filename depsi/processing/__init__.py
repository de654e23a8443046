"""Scientific steps on STMs: each a lazy ``Dataset -> Dataset`` function calling kernels per
block."""

from depsi.processing.arcs import estimate_arcs
from depsi.processing.atmosphere import estimate_atmosphere, interpolate_aps
from depsi.processing.densification import densify
from depsi.processing.distributed_scatterers import phase_linking, select_shp
from depsi.processing.integration import integrate_network
from depsi.processing.interferogram import ifg_to_slc, single_mother_interferograms
from depsi.processing.model_fit import estimate_model
from depsi.processing.network import first_order_indices, form_network
from depsi.processing.scatterers import ds_selection, merge_scatterers
from depsi.processing.selection import (
    amplitude_statistics,
    ps_selection,
    update_selection,
)

__all__ = [
    "amplitude_statistics",
    "densify",
    "ds_selection",
    "estimate_arcs",
    "estimate_atmosphere",
    "estimate_model",
    "first_order_indices",
    "form_network",
    "ifg_to_slc",
    "integrate_network",
    "interpolate_aps",
    "merge_scatterers",
    "phase_linking",
    "ps_selection",
    "select_shp",
    "single_mother_interferograms",
    "update_selection",
]
