"""The PS chain in memory: the chain's steps of :data:`~depsi.pipeline.steps.STEPS`, from a
point STM to velocities, heights and time series, each product let go after its last reader.

``depsi run`` (:func:`~depsi.pipeline.runner.run_pipeline`) runs the same steps from the same
table with a checkpoint after each, so both compute the same result.
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from depsi.kernels.backend import single_threaded_blas
from depsi.pipeline.chain_config import ChainConfig, chain_config
from depsi.pipeline.steps import BY_NAME, CHAIN_STEPS, StepContext, call_step, last_consumers
from depsi.pipeline.steps.selection import prepare_points
from depsi.pipeline.steps.shared import Devices
from depsi.stm.runtime import tune_memory

#: The product the chain starts from: the selection's points (what its first step reads).
CHAIN_INPUT = BY_NAME[CHAIN_STEPS[0]].inputs[0]


@single_threaded_blas()
def run_ps_chain(
    ps_stm: xr.Dataset,
    config: ChainConfig | dict | None = None,
    *,
    devices: Devices = None,
    **overrides: Any,
) -> xr.Dataset:
    """Run the PS chain from a point STM to the result STM: the chain's steps of
    :data:`~depsi.pipeline.steps.STEPS` in turn, in memory.

    Parameters
    ----------
    ps_stm
        Point STM with wrapped single-mother ``phase`` (or ``complex`` SLC values, from which
        interferograms are formed), ``h2ph``, ``azimuth``/``range`` (or ``x``/``y``), ``time``
        and ``wavelength``; ``amplitude_dispersion`` chooses the first-order points.
    config
        A :class:`~depsi.pipeline.chain_config.ChainConfig` (or a mapping of its sections);
        default: every default. The same object ``depsi run`` reads from the YAML file's
        sections.
    devices
        Devices the chunks of every step are spread over, round-robin (e.g.
        ``["cuda:0", "cuda:1"]``); default: those of
        :func:`depsi.kernels.backend.configure_devices`.
    **overrides
        A section by name with a mapping of its fields (``network={"k": 3}``). The flat
        keywords of :data:`~depsi.pipeline.chain_config.KEYWORDS` (``first_order=500``) are
        deprecated. See the sections' field descriptions (``depsi config --example``).

    Returns
    -------
    xarray.Dataset
        Result STM ``(space, time)`` of the first-order points kept by the network and the
        accepted densified points, in the input's order: ``velocity`` (m/yr), ``height_error``
        (m), ``displacement`` (m, zero at the first epoch, atmosphere removed),
        ``temporal_coherence``, ``ambiguity``, ``aps`` (rad), ``unwrapped_phase``, ``order``
        (1 first-order, 2 densified), ``point_index`` (index into ``ps_stm.space``) and
        ``in_reference_area``; all relative to the mean over the reference area (the
        first-order points within ``attrs['reference_radius']`` m of the reference point
        ``attrs['reference']``, an index into the input; ``attrs['n_reference_area']`` points).

    Examples
    --------
    >>> from depsi.processing import ps_selection
    >>> from depsi.simulate import simulate_stack
    >>> stack, truth = simulate_stack(shape=(60, 60), n_epochs=20, seed=0)
    >>> result = run_ps_chain(ps_selection(stack), network={"first_order": 40})
    >>> result.attrs["n_first_order"], result.attrs["n_densified"] > 0
    (40, True)
    >>> sorted(result.order.to_series().unique().tolist())
    [1, 2]
    """
    config = chain_config(config, **overrides)
    tune_memory()  # freed memory goes back to the system, no huge-page advice (docs/hpc.md)
    products: dict[str, Any] = {CHAIN_INPUT: prepare_points(ps_stm)}
    last = last_consumers(CHAIN_STEPS)
    context = StepContext(devices=devices)
    for step in CHAIN_STEPS:
        spec = BY_NAME[step]

        def take(name: str, step: str = step) -> Any:  # moved out after its last reader
            return products.pop(name) if last[name] == step else products[name]

        products[step] = call_step(spec.run_in_memory, step, take, config, context)
    return products.pop(CHAIN_STEPS[-1])
