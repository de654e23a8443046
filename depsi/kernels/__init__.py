"""Batched numerical kernels on NumPy or CuPy: pure array code, no xarray or Dask (docs/design.md,
"Kernels").

Every kernel takes the array namespace of its inputs (:func:`backend.array_namespace`), so the
same call runs on host (NumPy) or device (CuPy) arrays and returns arrays on that device.
"""

from depsi.conventions import MISSING_AMBIGUITY, phase_per_metre, wrap_phase, years_since
from depsi.kernels.backend import (
    Device,
    array_namespace,
    batch_size,
    configure_devices,
    cupy_available,
    get_devices,
    get_namespace,
    to_device,
    to_host,
)
from depsi.kernels.design_matrices import design_matrix
from depsi.kernels.flags import Flag
from depsi.kernels.lstsq import LstsqResult, lstsq_batched, solve_normal_equations
from depsi.kernels.network_inversion import (
    NetworkInversionResult,
    connected_components,
    invert_network,
)
from depsi.kernels.periodogram import PeriodogramResult, ensemble_coherence, periodogram
from depsi.kernels.phase_linking import (
    cramer_rao_bound,
    link_phases,
    sample_coherence,
    sequential_phase_linking,
    shp_glrt,
)

__all__ = [
    "MISSING_AMBIGUITY",
    "Device",
    "Flag",
    "LstsqResult",
    "NetworkInversionResult",
    "PeriodogramResult",
    "array_namespace",
    "batch_size",
    "configure_devices",
    "connected_components",
    "cramer_rao_bound",
    "cupy_available",
    "design_matrix",
    "ensemble_coherence",
    "get_devices",
    "get_namespace",
    "invert_network",
    "link_phases",
    "lstsq_batched",
    "periodogram",
    "phase_per_metre",
    "sample_coherence",
    "sequential_phase_linking",
    "shp_glrt",
    "solve_normal_equations",
    "to_device",
    "to_host",
    "wrap_phase",
    "years_since",
]
