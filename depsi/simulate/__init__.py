"""Simulated SLC stacks with a known truth, to test and benchmark depsi end to end.

The scene generator (:mod:`depsi.simulate.scene`: :func:`simulate_stack`,
:func:`simulated_geometry`), its stacks on disk in every format users bring
(:mod:`depsi.simulate.stacks`: :func:`write_stack`, :func:`write_stack_zarr`,
:func:`write_stack_binary`, through the writers of :mod:`depsi.io`) and a chain result scored
against its truth (:mod:`depsi.simulate.scoring`: :func:`accuracy`), stacks of distributed
scatterers with a known coherence model (:mod:`depsi.simulate.ds`: :func:`simulate_ds_stack`),
and result-shaped stores of any size without the chain (:mod:`depsi.simulate.results`:
:func:`result_like`).
``from depsi.simulate import ...`` reaches them all.
"""

from depsi.simulate.ds import exponential_coherence, simulate_ds_stack
from depsi.simulate.results import RESULT_MODELS, RESULT_SPAN_DEG, result_like
from depsi.simulate.scene import (
    ACQUISITION_SECOND_OF_DAY,
    APS_MODES,
    APS_SPECTRAL_EXPONENT,
    BOWL_SHARE,
    BPERP_STD,
    CHUNK_BYTES,
    DS_RMS_AMPLITUDE,
    GROUND_SPEED,
    HEADING_DEG,
    INCIDENCE_CENTRE_DEG,
    ORBIT_HALF_SPAN_SECONDS,
    PIXEL_SPACING,
    PS_AMPLITUDE_GAIN,
    PS_NAD_RANGE,
    RAYLEIGH_NAD,
    SCENE_CENTRE,
    SLANT_RANGE_CENTRE,
    TILE_SIZE,
    simulate_stack,
    simulated_geometry,
)
from depsi.simulate.scoring import accuracy
from depsi.simulate.stacks import STACK_FORMATS, write_stack, write_stack_binary, write_stack_zarr

__all__ = [
    "ACQUISITION_SECOND_OF_DAY",
    "APS_MODES",
    "APS_SPECTRAL_EXPONENT",
    "BOWL_SHARE",
    "BPERP_STD",
    "CHUNK_BYTES",
    "DS_RMS_AMPLITUDE",
    "GROUND_SPEED",
    "HEADING_DEG",
    "INCIDENCE_CENTRE_DEG",
    "ORBIT_HALF_SPAN_SECONDS",
    "PIXEL_SPACING",
    "PS_AMPLITUDE_GAIN",
    "PS_NAD_RANGE",
    "RAYLEIGH_NAD",
    "RESULT_MODELS",
    "RESULT_SPAN_DEG",
    "SCENE_CENTRE",
    "SLANT_RANGE_CENTRE",
    "STACK_FORMATS",
    "TILE_SIZE",
    "accuracy",
    "exponential_coherence",
    "result_like",
    "simulate_ds_stack",
    "simulate_stack",
    "simulated_geometry",
    "write_stack",
    "write_stack_binary",
    "write_stack_zarr",
]
