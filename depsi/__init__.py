"""depsi: Persistent Scatterer InSAR time-series analysis on space-time matrices.

``import depsi`` registers the ``.stm`` accessor on xarray Datasets and exposes the store
functions, :func:`run_ps_chain`, :func:`view` (a result in the web browser) and
:class:`DepsiError` (the base of depsi's exceptions); the science lives in
:mod:`depsi.processing`, the steps and their executors in :mod:`depsi.pipeline`, the simulator
in :mod:`depsi.simulate`, the batched kernels in :mod:`depsi.kernels`.
"""

import logging

from depsi.errors import DepsiError
from depsi.io import append_epochs, from_csv, open_stm, save_stm
from depsi.kernels import configure_devices
from depsi.stm import STMValidationError, validate

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name: str):
    if name == "run_ps_chain":  # imported when first used: the pipeline layer is heavier
        from depsi.pipeline.chain import run_ps_chain

        return run_ps_chain
    if name == "view":  # the web explorer of a result: imported when first used
        from depsi.viewer import view

        return view
    raise AttributeError(f"module 'depsi' has no attribute {name!r}")


__all__ = [
    "DepsiError",
    "STMValidationError",
    "__version__",
    "append_epochs",
    "configure_devices",
    "from_csv",
    "open_stm",
    "run_ps_chain",
    "save_stm",
    "validate",
    "view",
]
